"""The train tasks of runs on several GPUs: one flytekitplugins-kfpytorch `Elastic` task per layout (nodes × GPUs
per node), each rank running `finetune_bench.running.ranks`.

Imported only where the training image runs (the benchmark's dynamic node, the tasks' own pods): defining an
Elastic task needs torch, which the analysis image leaves out.
"""

import contextlib
import dataclasses
import itertools
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flytekit import PythonFunctionTask, current_context, task
from flytekit.core.task import TaskPlugins
from flytekit.extend import IgnoreOutputs
from flytekit.types.directory import FlyteDirectory
from flytekitplugins.kfpytorch import Elastic
from flytekitplugins.kfpytorch.task import PytorchElasticFunctionTask

from finetune_bench.inputs.catalog import GPUS_PER_NODE, NODE_COUNTS
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.results.store import ResultStore
from finetune_bench.running.launch import ParentTerminated
from finetune_bench.running.ranks import node_fork_server, run_on_ranks
from finetune_bench.sources import software
from finetune_bench.sources.cache import default_results_store
from finetune_bench.sources.versions import SourceVersions
from images import training_image
from tasks.records import TrainOutput
from tasks.registration import REGISTRATION_ENV, TRAIN_ACCELERATOR, WANDB_SECRETS, train_resources
from tasks.train import logged_output, source_versions, train_condition
from tasks.wandb_flyte import add_wandb_link_to_map_tasks, with_wandb_link


@dataclasses.dataclass
class RanksElastic(Elastic):
    """The `Elastic` settings of a train task whose launch offers its ranks a fork server (`RanksElasticTask`)."""


class RanksElasticTask(PytorchElasticFunctionTask):
    """flytekitplugins-kfpytorch's Elastic task, whose process (the pod's, or `pyflyte run`'s locally) offers the
    ranks it launches a fork server for their training children (`running.ranks.node_fork_server`): its imports
    overlap the ranks' start, and locally, where one process launches run after run, they are paid once."""

    def execute(self, **kwargs: Any) -> Any:
        if self.task_config.nproc_per_node > 1:
            # one thread per rank unless set, as torchrun and the plugin do: set before the server imports under it
            os.environ.setdefault("OMP_NUM_THREADS", "1")
        run, timeout_s = launched_run(kwargs)
        # the ranks wait for each other (the nodes' rendezvous) no longer than the run may take, 15 minutes at most
        join_s = min(RENDEZVOUS_JOIN_TIMEOUT_S, int(timeout_s))
        self.task_config.rdzv_configs = {**self.task_config.rdzv_configs, "join_timeout": join_s}
        with _signals_end_the_process(), node_fork_server(run):
            return super().execute(**kwargs)


def launched_run(inputs: dict[str, Any]) -> tuple[PlannedRun, float]:
    """What a launch's ranks train, for the fork server offered to them, and how long one run may take: a train task's
    run and its condition timeout, or a memory-frontier search's probes (`search`: its first probe's settings, which
    its other probes share but for the searched size) and a probe's timeout."""
    if "planned_run" in inputs:
        return inputs["planned_run"], inputs["condition_timeout_s"]
    from finetune_bench.frontier.probes import probe_run

    search = inputs["search"]
    return probe_run(search.training_args, 0), search.timeout_s


# PyTorch Elastic's default wait for every node of a launch (the plugin's `rdzv_configs`), an upper bound
RENDEZVOUS_JOIN_TIMEOUT_S = 900


# The signals PyTorch Elastic's agent turns into an exception while it launches (TORCHELASTIC_SIGNALS_TO_HANDLE).
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def _signals_end_the_process() -> Iterator[None]:
    """A signal that stops a launch (Ctrl-C, SIGTERM) ends this process, as it does a one-GPU run's launcher.

    PyTorch Elastic's agent turns the signal into an exception and the plugin turns that into "no outputs", right
    for a pod that is going away but, in `pyflyte run`, one lost run after which the grid went on with the next
    (its ranks still training after the user stopped it). So the signal is raised again here, as KeyboardInterrupt
    or `ParentTerminated`, which no task catches. The agent's handlers are also taken down after the launch
    (PyTorch leaves them installed): a signal between launches acts as it would without them."""
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS} if main else {}
    try:
        yield
    except IgnoreOutputs as exc:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        if isinstance(exc.__context__, SignalException):
            sig = exc.__context__.sigval
            raise (KeyboardInterrupt() if sig == signal.SIGINT else ParentTerminated(128 + sig)) from exc.__context__
        raise
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


TaskPlugins.register_pythontask_plugin(RanksElastic, RanksElasticTask)


def train_ranks_of_condition(
    planned_run: PlannedRun,
    dataset_dir: FlyteDirectory,
    model_dir: FlyteDirectory,
    condition_timeout_s: int,
    results_store: str,
    force_fresh: bool,
    sources: SourceVersions | None = None,
) -> TrainOutput | None:
    """One rank of a run on several GPUs (`finetune_bench.running.ranks`): the run's output on global rank 0,
    None on the others (PyTorch Elastic returns rank 0's alone)."""
    work_dir = Path(tempfile.mkdtemp(prefix="run-", dir=current_context().working_directory))
    store = results_store or str(default_results_store())
    planned_run = software.with_release_checked(planned_run)  # on the set's own image: what planning left to it
    result = run_on_ranks(
        planned_run,
        ResultStore(store),
        fetch_sources=lambda: (Path(dataset_dir.download()), Path(model_dir.download())),
        work_dir=work_dir,
        timeout_s=condition_timeout_s,
        force_fresh=force_fresh,
        sources=source_versions(sources),
    )
    return logged_output(result, planned_run, store) if result is not None else None


def elastic_task_name(num_nodes: int, num_gpus: int) -> str:
    return f"train_condition_{num_nodes}x{num_gpus}gpu"


def _elastic_train_task(num_nodes: int, num_gpus: int) -> PythonFunctionTask:
    """The train task of one layout: an `Elastic` task of `num_nodes` × `num_gpus` ranks (one node: a pod with
    `num_gpus` GPUs; several: a PyTorchJob), each rank running `train_ranks_of_condition`."""

    def train(
        planned_run: PlannedRun,
        dataset_dir: FlyteDirectory,
        model_dir: FlyteDirectory,
        condition_timeout_s: int,
        results_store: str,
        force_fresh: bool,
        sources: SourceVersions | None = None,
    ) -> TrainOutput | None:
        return train_ranks_of_condition(
            planned_run, dataset_dir, model_dir, condition_timeout_s, results_store, force_fresh, sources
        )

    # flytekit finds a task in its container by module and name: each layout's is a module-level name of its own,
    # and it accepts a function made here as such when it wraps a module-level one under its own name.
    train.__name__ = train.__qualname__ = elastic_task_name(num_nodes, num_gpus)
    train.__wrapped__ = train_ranks_of_condition
    train.__doc__ = f"One run on {num_nodes} node(s) × {num_gpus} GPU(s): {train_ranks_of_condition.__doc__}"
    elastic = task(
        task_config=RanksElastic(
            nnodes=num_nodes,
            nproc_per_node=num_gpus,
            # /dev/shm through the task's own setting (the plugin's pod template is deprecated)
            increase_shared_mem=False,
            # the agent checks its ranks every second (its default of 5 s adds up to 5 s to every run)
            monitor_interval=1,
        ),
        container_image=training_image,
        requests=train_resources(num_gpus),
        accelerator=TRAIN_ACCELERATOR,
        secret_requests=WANDB_SECRETS,
        environment=REGISTRATION_ENV,
        shared_memory=True,
    )(with_wandb_link(train))
    add_wandb_link_to_map_tasks(elastic)
    return elastic


# One task per layout but one GPU on one node (`train_condition`), each a module-level name.
ELASTIC_TRAIN_TASKS: dict[tuple[int, int], PythonFunctionTask] = {}
for _nodes, _gpus in itertools.product(NODE_COUNTS, GPUS_PER_NODE):
    if (_nodes, _gpus) != (1, 1):
        ELASTIC_TRAIN_TASKS[_nodes, _gpus] = globals()[elastic_task_name(_nodes, _gpus)] = _elastic_train_task(
            _nodes, _gpus
        )


def train_task(num_nodes: int, num_gpus: int) -> PythonFunctionTask:
    """The train task of a layout."""
    return train_condition if (num_nodes, num_gpus) == (1, 1) else ELASTIC_TRAIN_TASKS[num_nodes, num_gpus]
