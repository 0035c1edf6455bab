"""The search tasks of memory frontiers on several GPUs: one flytekitplugins-kfpytorch `Elastic` task per layout
(nodes × GPUs per node), as the benchmark's train tasks (`tasks.train_ranks`), each rank running
`finetune_bench.frontier.ranks.search_on_ranks`: rank 0 searches, every rank trains its part of each probe.

Imported only where the training image runs (the frontier's dynamic node, the tasks' own pods): defining an Elastic
task needs torch.
"""

import functools
import itertools
from pathlib import Path

from flytekit import PythonFunctionTask, task
from flytekit.types.directory import FlyteDirectory

from finetune_bench.frontier.guide import search_guide
from finetune_bench.frontier.ranks import search_on_ranks
from finetune_bench.frontier.search import FrontierResult
from finetune_bench.frontier.settings import FrontierSearch
from finetune_bench.inputs.catalog import GPUS_PER_NODE, NODE_COUNTS
from images import training_image
from tasks.frontier import log_search_end, search_memory_frontier, search_work_dir
from tasks.registration import REGISTRATION_ENV, TRAIN_ACCELERATOR, train_resources
from tasks.train_ranks import RanksElastic


def search_ranks_of_frontier(
    search: FrontierSearch, dataset_dir: FlyteDirectory, model_dir: FlyteDirectory
) -> FrontierResult | None:
    """One rank of a search on several GPUs: the search's result on global rank 0, None on the others (PyTorch
    Elastic returns rank 0's alone)."""
    result = search_on_ranks(
        search,
        fetch_sources=lambda: (Path(dataset_dir.download()), Path(model_dir.download())),
        work_dir=search_work_dir(),
        guide=functools.partial(search_guide, search),
    )
    if result is not None:
        log_search_end(result)
    return result


def elastic_search_task_name(num_nodes: int, num_gpus: int) -> str:
    return f"search_memory_frontier_{num_nodes}x{num_gpus}gpu"


def _elastic_search_task(num_nodes: int, num_gpus: int) -> PythonFunctionTask:
    """The search task of one layout: an `Elastic` task of `num_nodes` × `num_gpus` ranks."""

    def search(search: FrontierSearch, dataset_dir: FlyteDirectory, model_dir: FlyteDirectory) -> FrontierResult | None:
        return search_ranks_of_frontier(search, dataset_dir, model_dir)

    # a module-level name of its own per layout (flytekit finds a task in its container by module and name)
    search.__name__ = search.__qualname__ = elastic_search_task_name(num_nodes, num_gpus)
    search.__wrapped__ = search_ranks_of_frontier
    search.__doc__ = f"One search on {num_nodes} node(s) × {num_gpus} GPU(s): {search_ranks_of_frontier.__doc__}"
    return task(
        task_config=RanksElastic(
            nnodes=num_nodes, nproc_per_node=num_gpus, increase_shared_mem=False, monitor_interval=1
        ),
        container_image=training_image,
        requests=train_resources(num_gpus),
        accelerator=TRAIN_ACCELERATOR,
        environment=REGISTRATION_ENV,
        shared_memory=True,
    )(search)


# One task per layout but one GPU on one node (`tasks.frontier.search_memory_frontier`), each a module-level name.
ELASTIC_SEARCH_TASKS: dict[tuple[int, int], PythonFunctionTask] = {}
for _nodes, _gpus in itertools.product(NODE_COUNTS, GPUS_PER_NODE):
    if (_nodes, _gpus) != (1, 1):
        ELASTIC_SEARCH_TASKS[_nodes, _gpus] = globals()[elastic_search_task_name(_nodes, _gpus)] = _elastic_search_task(
            _nodes, _gpus
        )


def search_task(num_nodes: int, num_gpus: int) -> PythonFunctionTask:
    """The search task of a layout."""
    return search_memory_frontier if (num_nodes, num_gpus) == (1, 1) else ELASTIC_SEARCH_TASKS[num_nodes, num_gpus]
