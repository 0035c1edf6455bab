"""Planning the runs, and training one run in a child process."""

import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click
from flytekit import current_context, task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from finetune_bench.inputs.errors import Problems, SpecError
from finetune_bench.inputs.plan import PlannedRun, plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.inputs.validation import check_writable_location, validate_run_settings
from finetune_bench.prediction.gpus import accelerator_name
from finetune_bench.prediction.grid import (
    check_plan_settings,
    check_skip_has_target,
    estimate_grid,
    target_gpu,
    with_predictions,
)
from finetune_bench.reporting.plan_report import plan_text
from finetune_bench.results.record import RunResult
from finetune_bench.results.store import ResultStore
from finetune_bench.running.launch import run_or_reuse
from finetune_bench.sources.cache import default_results_store
from finetune_bench.sources.versions import SourceVersions
from images import analysis_image, training_image
from tasks.analysis import EXPORT_DIR_ENV
from tasks.execution import cluster_notes
from tasks.records import TrainOutput
from tasks.settings import (
    ANALYSIS_RESOURCES,
    REGISTRATION_ENV,
    TRAIN_ACCELERATOR,
    TRAIN_RESOURCES,
    WANDB_SECRETS,
)
from tasks.wandb_runs import add_wandb_link_to_map_tasks, log_to_wandb, require_wandb_key, with_wandb_link

logger = logging.getLogger(__name__)
T = TypeVar("T")


# The training image: validation reads Liger's table of the model types it can patch. The registration settings:
# the target GPU defaults to the train task's accelerator. The W&B secret: a missing one stops the execution here.
@task(
    container_image=training_image,
    requests=ANALYSIS_RESOURCES,
    environment=REGISTRATION_ENV,
    secret_requests=WANDB_SECRETS,
)
def plan_benchmark(
    experiment_args: ExperimentArgs,
    training_args: TrainingArgs,
    n_runs: int,
    concurrency: int,
    min_success_ratio: float,
    condition_timeout_s: int,
    alpha: float,
    results_store: str = "",
    gpu_kind: str = "",
    gpu_memory_gib: float = 0.0,
    gpu_hour_price: float = 0.0,
    skip_predicted_oom: bool = False,
    accelerator: str = "",
    dry_run: bool = False,
) -> list[PlannedRun]:
    """Validate the inputs (before anything is downloaded or trained) and list every run, each with its predicted
    peak memory (with `skip_predicted_oom`, a sure OOM on the target GPU is marked not to be launched). Every
    problem is reported at once, one line each (`pyflyte run` prints them without a traceback). The plan (the
    dry run's printout) goes to the task's log, with what a cluster execution will not keep
    (`tasks.execution.cluster_notes`)."""
    planned = checked(
        lambda: plan_runs(experiment_args, training_args, n_runs),
        lambda: validate_run_settings(concurrency, min_success_ratio, condition_timeout_s, alpha),
        lambda: check_output_locations(results_store),
        lambda: check_prediction_settings(gpu_kind, gpu_memory_gib, gpu_hour_price, skip_predicted_oom, accelerator),
        lambda: None if dry_run else require_wandb_key(),  # a dry run logs nothing
    )
    target = target_gpu(gpu_kind, gpu_memory_gib, accelerator)
    estimate = estimate_grid(planned, target, gpu_hour_price, skip_predicted_oom)
    notes = "".join(f"\nnote: {note}" for note in ([] if dry_run else cluster_notes(results_store)))
    print(f"the plan:\n{plan_text(estimate)}{notes}", flush=True)
    return with_predictions(planned, estimate, skip_predicted_oom)


def check_prediction_settings(
    gpu_kind: str, gpu_memory_gib: float, gpu_hour_price: float, skip_predicted_oom: bool, accelerator: str = ""
) -> None:
    """The target GPU, accelerator and price inputs; a GPU's memory to compare with when sure OOMs are to be
    skipped."""
    problems = Problems()
    with problems.check():
        check_plan_settings(gpu_kind, gpu_memory_gib, gpu_hour_price)
    with problems.check():
        if accelerator:
            accelerator_name(accelerator)
    problems.raise_if_any()
    check_skip_has_target(skip_predicted_oom, target_gpu(gpu_kind, gpu_memory_gib, accelerator))


class InvalidInputs(click.ClickException):
    """Inputs that cannot run. A click error: the CLI prints its message (every problem, one per line) and
    exits non-zero, without a framework traceback."""


def checked(plan: Callable[[], T], *checks: Callable[[], None]) -> T:
    """`plan()` after `checks`, every SpecError of all of them raised together as InvalidInputs."""
    problems = Problems()
    for check in checks:
        with problems.check():
            check()
    planned = None
    with problems.check():
        planned = plan()
    try:
        problems.raise_if_any()
    except SpecError as error:
        raise InvalidInputs(str(error)) from None
    return planned


def check_output_locations(results_store: str) -> None:
    """The results store, and the export directory a local run copies its outputs to, can take files."""
    problems = Problems()
    with problems.check():
        check_writable_location(results_store or str(default_results_store()), "results_store")
    export = os.environ.get(EXPORT_DIR_ENV)
    if export:
        with problems.check():
            check_writable_location(export, EXPORT_DIR_ENV)
    problems.raise_if_any()


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
    result = run_or_reuse(
        planned_run,
        ResultStore(results_store or str(default_results_store())),
        dataset_dir=Path(dataset_dir.download()),
        model_dir=Path(model_dir.download()),
        work_dir=work_dir,
        timeout_s=condition_timeout_s,
        force_fresh=force_fresh,
        sources=source_versions(sources),
    )
    return logged_output(result)


add_wandb_link_to_map_tasks(train_condition)


def source_versions(sources: SourceVersions | None) -> dict[str, str]:
    """The dataset's and the model's versions, part of a stored run's key."""
    return {"dataset": sources.dataset, "model": sources.model} if sources else {}


def logged_output(result: RunResult) -> TrainOutput:
    """The train task's output of a run, once the run is logged to W&B: the record, its steps and its profile."""
    log_to_wandb(result)
    return TrainOutput(
        result=result,
        steps=FlyteFile(result.steps_file) if result.steps_file else None,
        profile=FlyteDirectory(result.profile_dir) if result.profile_dir else None,
    )


def runs_by_layout(planned: list[PlannedRun]) -> dict[tuple[int, int], list[PlannedRun]]:
    """The planned runs grouped by (num_nodes, num_gpus), layouts in the order they first appear, runs in plan
    order."""
    groups: dict[tuple[int, int], list[PlannedRun]] = {}
    for run in planned:
        groups.setdefault((run.training_args.num_nodes, run.training_args.num_gpus), []).append(run)
    return groups


@task(container_image=analysis_image, requests=ANALYSIS_RESOURCES, environment=REGISTRATION_ENV)
def concatenate_outputs(groups: list[list[TrainOutput | None]]) -> list[TrainOutput | None]:
    """The train outputs of every layout's map task as one list (the analysis pairs them with the plan by
    condition and run number)."""
    return [output for group in groups for output in group]
