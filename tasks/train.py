"""Training one run in a child process, and the train outputs of every GPU layout gathered."""

import logging
import tempfile
from pathlib import Path

from flytekit import current_context, task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.results.record import RunResult
from finetune_bench.results.store import ResultStore
from finetune_bench.running.launch import ending_line, run_or_reuse
from finetune_bench.sources import software
from finetune_bench.sources.cache import default_results_store
from finetune_bench.sources.versions import SourceVersions
from images import analysis_image, training_image
from tasks.execution import on_cluster
from tasks.records import TrainOutput
from tasks.registration import (
    ANALYSIS_RESOURCES,
    REGISTRATION_ENV,
    TRAIN_ACCELERATOR,
    TRAIN_RESOURCES,
    WANDB_SECRETS,
)
from tasks.wandb_flyte import add_wandb_link_to_map_tasks, log_to_wandb, with_wandb_link

logger = logging.getLogger(__name__)


@task(
    container_image=training_image,
    requests=TRAIN_RESOURCES,
    accelerator=TRAIN_ACCELERATOR,
    secret_requests=WANDB_SECRETS,
    environment=REGISTRATION_ENV,
)
@with_wandb_link
def train_condition(
    planned_run: PlannedRun,
    dataset_dir: FlyteDirectory,
    model_dir: FlyteDirectory,
    condition_timeout_s: int,
    results_store: str,
    force_fresh: bool,
    sources: SourceVersions | None = None,
) -> TrainOutput:
    """Train one run in a fresh child process; its failure (OOM, crash, timeout) is its result.

    A run already in `results_store` (same settings, run number, hardware and code) is not trained
    again unless `force_fresh`; a finished run is stored as soon as it ends.
    """
    # Unique per run: locally, every item of a map task shares one working directory.
    work_dir = Path(tempfile.mkdtemp(prefix="run-", dir=current_context().working_directory))
    store = results_store or str(default_results_store())
    planned_run = software.with_release_checked(planned_run)  # on the set's own image: what planning left to it
    result = run_or_reuse(
        planned_run,
        ResultStore(store),
        dataset_dir=Path(dataset_dir.download()),
        model_dir=Path(model_dir.download()),
        work_dir=work_dir,
        timeout_s=condition_timeout_s,
        force_fresh=force_fresh,
        sources=source_versions(sources),
    )
    return logged_output(result, planned_run, store)


add_wandb_link_to_map_tasks(train_condition)


def source_versions(sources: SourceVersions | None) -> dict[str, str]:
    """The dataset's and the model's versions, part of a stored run's key."""
    return {"dataset": sources.dataset, "model": sources.model} if sources else {}


def logged_output(result: RunResult, run: PlannedRun, store: str) -> TrainOutput:
    """The train task's output of a run, once the run is logged to W&B: the record, its steps and its profile. The
    task's log (a cluster pod's, or a local run's console as the run ends) has one line of how the run ended and
    where it is kept (`ending_line`); a run reused from the store has said so already (`launch.reuse_line`), except in
    a pod's log, which has nothing else of it."""
    log_to_wandb(result)
    if on_cluster() or not result.reused:
        print(ending_line(run, result, store), flush=True)
    return TrainOutput(
        result=result,
        steps=FlyteFile(result.steps_file) if result.steps_file else None,
        profile=FlyteDirectory(result.profile_dir) if result.profile_dir else None,
    )


def runs_by_layout_and_set(planned: list[PlannedRun]) -> dict[tuple[int, int, str], list[PlannedRun]]:
    """The planned runs grouped by (num_nodes, num_gpus, software_set), groups in the order they first appear, runs
    in plan order."""
    groups: dict[tuple[int, int, str], list[PlannedRun]] = {}
    for run in planned:
        t = run.training_args
        groups.setdefault((t.num_nodes, t.num_gpus, t.software_set), []).append(run)
    return groups


@task(container_image=analysis_image, requests=ANALYSIS_RESOURCES, environment=REGISTRATION_ENV)
def concatenate_outputs(groups: list[list[TrainOutput | None]]) -> list[TrainOutput | None]:
    """The train outputs of every layout's map task as one list (the analysis pairs them with the plan by
    condition and run number)."""
    return [output for group in groups for output in group]
