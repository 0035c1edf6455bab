"""Planning: the inputs checked (every problem at once, before anything is downloaded or trained), every run
listed with its prediction in a `BenchmarkPlan`, and the dry run's report of that plan."""

import os
from collections.abc import Callable
from typing import TypeVar

import click
import pandas as pd
from flytekit import task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from finetune_bench.inputs import machine
from finetune_bench.inputs.arms import component_notes
from finetune_bench.inputs.errors import Problems, SpecError
from finetune_bench.inputs.machine import check_cap_fits_target
from finetune_bench.inputs.plan import (
    BenchmarkPlan,
    PredictionTarget,
    RunSettings,
    Workload,
    check_workflow_settings_act,
    plan_runs,
)
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.inputs.validation import check_writable_location, validate_run_settings
from finetune_bench.prediction import gpus
from finetune_bench.prediction.fine_tune import check_fine_tune, check_fine_tune_fills
from finetune_bench.prediction.gpus import accelerator_name
from finetune_bench.prediction.grid import (
    GridEstimate,
    check_plan_settings,
    check_skip_has_target,
    estimate_grid,
    target_gpu,
    with_predictions,
)
from finetune_bench.reporting.plan_report import plan_report, plan_table, plan_text
from finetune_bench.sources import software
from finetune_bench.sources.cache import cache_root, cache_root_key, default_results_store
from images import training_image
from tasks.analysis import EXPORT_DIR_ENV, publish
from tasks.execution import cluster_notes, on_cluster
from tasks.inputs_yaml import inputs_file_argument
from tasks.registration import ANALYSIS_RESOURCES, REGISTERED_ACCELERATOR, REGISTRATION_ENV, WANDB_SECRETS
from tasks.software_images import imaged_sets, imaged_sets_env
from tasks.wandb_flyte import require_wandb_answers, require_wandb_key

T = TypeVar("T")


# How a workflow's planning task (the benchmark's, the frontier's) is registered. The training image: validation
# reads Liger's table of the model types it can patch. The registration settings: the target GPU defaults to the train
# task's accelerator. The W&B secret: a missing one stops the execution here (`check_wandb_key`).
PLANNING_TASK = dict(
    container_image=training_image,
    requests=ANALYSIS_RESOURCES,
    environment=REGISTRATION_ENV,
    secret_requests=WANDB_SECRETS,
)


def check_wandb_key(dry_run: bool) -> None:
    """At planning, on a cluster, with WANDB_ENTITY registered: the W&B secret can be read and the W&B server answers,
    so that a missing key or an unreachable server stops the execution before any GPU time
    (`tasks.wandb_flyte.require_wandb_key`, `require_wandb_answers`), both said at once. A dry run logs nothing."""
    if dry_run:
        return
    problems = Problems()
    with problems.check():
        require_wandb_key()
    with problems.check():
        require_wandb_answers()
    problems.raise_if_any()


# The benchmark's planning is told too which software sets registration builds an image for: it installs nothing of
# them (`tasks.software_images`).
@task(**{**PLANNING_TASK, "environment": {**REGISTRATION_ENV, **imaged_sets_env(inputs_file_argument())}})
def plan_benchmark(
    experiment_args: ExperimentArgs,
    training_args: TrainingArgs,
    n_runs: int,
    concurrency: int,
    min_success_ratio: float,
    condition_timeout_s: int,
    alpha: float,
    results_store: str = "",
    force_fresh: bool = False,
    gpu_kind: str = "",
    gpu_memory_gib: float = 0.0,
    gpu_hour_price: float = 0.0,
    skip_predicted_oom: bool = False,
    accelerator: str = "",
    dry_run: bool = False,
    fine_tune_epochs: float = 1.0,
    fine_tune_steps: int = 0,
) -> BenchmarkPlan:
    """Validate the workflow's inputs (before anything is downloaded or trained) and plan every run, each with its
    predicted peak memory (with `skip_predicted_oom`, a sure OOM on the target GPU is marked not to be launched).
    Every problem is reported at once, one line each (`pyflyte run` prints them without a traceback). The plan goes to
    the task's log, with what a cluster execution will not keep (`tasks.execution.cluster_notes`); a dry run's is its
    conditions, its totals being the plan report's headline (`report_plan`), which a local run's console ends with.
    The tasks after this one read the plan, not the loose inputs."""
    execution = RunSettings(
        concurrency, min_success_ratio, condition_timeout_s, results_store, force_fresh, alpha, accelerator
    )
    prediction = PredictionTarget(
        gpu_kind, gpu_memory_gib, gpu_hour_price, skip_predicted_oom, fine_tune_epochs, fine_tune_steps
    )
    runs = checked(
        lambda: software.checked_runs(
            plan_runs(experiment_args, training_args, n_runs), bool(experiment_args.software_set), imaged_sets()
        ),
        lambda: validate_run_settings(concurrency, min_success_ratio, condition_timeout_s, alpha),
        lambda: check_output_locations(results_store),
        lambda: check_prediction_settings(gpu_kind, gpu_memory_gib, gpu_hour_price, skip_predicted_oom, accelerator),
        lambda: check_fine_tune(fine_tune_epochs, fine_tune_steps),
        lambda: check_wandb_key(dry_run),
        lambda: None if dry_run else check_nodes_here(experiment_args, training_args),  # a dry run waits for none
    )
    conditions = [run.training_args for run in runs if not run.refused]
    target = target_gpu(gpu_kind, gpu_memory_gib, predicted_accelerator(accelerator))
    workload = Workload.of(conditions, gpu_here(), target_gpu=dry_run and bool(target.name or target.memory_bytes))
    checked(
        lambda: None,
        lambda: None if dry_run else check_gpus_here(conditions),
        lambda: None if dry_run else check_target_here(gpu_memory_gib, conditions),
        lambda: check_cap_fits_target([run.training_args for run in runs], target),
        lambda: check_workflow_settings_act([execution, prediction], workload),
        lambda: check_fine_tune_fills(conditions, fine_tune_epochs, fine_tune_steps),
    )
    plan = BenchmarkPlan(runs, execution, prediction)
    estimate = estimate_plan(plan)
    arms = [run.training_args.arm for run in runs if not run.refused]
    notes = "".join(
        f"\nnote: {note}" for note in [*component_notes(arms), *([] if dry_run else cluster_notes(results_store))]
    )
    # A dry run ends with the plan report, whose headline (the totals) the console prints last
    # (`workflows.console`): here its conditions only, so that no line is printed twice.
    print(f"the plan:\n{plan_text(estimate, with_totals=not dry_run)}{notes}", flush=True)
    plan.runs = with_predictions(runs, estimate, skip_predicted_oom)
    return plan


def check_gpus_here(conditions: list[TrainingArgs]) -> None:
    """A local run (`pyflyte run` without `--remote`) trains on this machine's GPUs: what could only fail on them is
    refused (`finetune_bench.inputs.machine.check_gpus_here`). On a cluster the pods ask for theirs
    (`tasks.execution.on_cluster`); a dry run trains nothing."""
    if for_a_cluster():
        return
    from finetune_bench.measuring.gpu import gpu_memory_bytes, gpu_names

    machine.check_gpus_here(conditions, gpu_names(), gpu_memory_bytes())


def check_target_here(gpu_memory_gib: float, conditions: list[TrainingArgs]) -> None:
    """A local run's plan predicts for this machine's GPU (`finetune_bench.inputs.machine.check_target_is_this_gpu`);
    on a cluster the pods' GPU is the accelerator's."""
    if for_a_cluster():
        return
    from finetune_bench.measuring.gpu import gpu_memory_bytes, gpu_names

    machine.check_target_is_this_gpu(gpu_memory_gib, conditions, gpu_names(), gpu_memory_bytes())


def gpu_here() -> bool:
    """Whether `device: auto` trains on a GPU: on a cluster the train tasks' pods have one; locally, where this
    machine has one."""
    if for_a_cluster():
        return True
    from finetune_bench.measuring.gpu import gpu_names

    return bool(gpu_names())


def check_nodes_here(experiment_args: ExperimentArgs, training_args: TrainingArgs) -> None:
    """A local run (`pyflyte run` without `--remote`) has this one machine: a condition on several nodes is refused
    (`finetune_bench.inputs.machine.check_nodes_here`). On a cluster (this task in a pod, `tasks.execution.on_cluster`)
    they are asked for."""
    if not on_cluster():
        machine.check_nodes_here(experiment_args, training_args)


def estimate_plan(plan: BenchmarkPlan) -> GridEstimate:
    """The memory model's estimate of every planned condition on the plan's target GPU (its kind, else the
    accelerator's: `predicted_accelerator`)."""
    p, accelerator = plan.prediction, plan.execution.accelerator
    target = target_gpu(p.gpu_kind, p.gpu_memory_gib, predicted_accelerator(accelerator))
    return estimate_grid(plan.runs, target, p.gpu_hour_price, p.skip_predicted_oom)


def for_a_cluster() -> bool:
    """Whether the runs planned here train on a cluster: in a cluster's pod (`tasks.execution.on_cluster`), and in
    `union run --remote` (or `pyflyte run --remote`) checking an inputs file before sending it."""
    if on_cluster():
        return True
    context = click.get_current_context(silent=True)
    return bool(getattr(context.obj if context is not None else None, "is_remote", False))


def predicted_accelerator(accelerator: str) -> str:
    """The accelerator a plan predicts for when its `gpu_kind` is empty: the inputs' `accelerator`, else on a cluster
    (`for_a_cluster`) the one the train tasks are registered with (`tasks.registration.REGISTERED_ACCELERATOR`, an A100
    unless FINETUNE_BENCH_TRAIN_ACCELERATOR names another; none for any GPU or a GPU the memory model does not
    know). Locally none: the target is then FINETUNE_BENCH_TRAIN_ACCELERATOR where it is set, else no GPU is named
    (a run measures the machine's own)."""
    if accelerator or not for_a_cluster() or not REGISTERED_ACCELERATOR:
        return accelerator
    try:
        gpus.gpu_kind(REGISTERED_ACCELERATOR)
    except SpecError:
        return ""
    return REGISTERED_ACCELERATOR


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
    check_skip_has_target(skip_predicted_oom, target_gpu(gpu_kind, gpu_memory_gib, predicted_accelerator(accelerator)))


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
    """The cache directory (downloads, the device lock, the default results store), the results store, and the
    export directory a local run copies its outputs to, can take files."""
    problems = Problems()
    with problems.check():
        check_writable_location(str(cache_root()), cache_root_key())
    if results_store or not problems.found:  # the default store is in the cache directory: named once
        with problems.check():
            check_writable_location(results_store or str(default_results_store()), "results_store")
    with problems.check():
        check_export_location()
    problems.raise_if_any()


def check_export_location() -> None:
    """The export directory (`FINETUNE_BENCH_EXPORT_DIR`), when one is set, can take files."""
    export = os.environ.get(EXPORT_DIR_ENV)
    if export:
        check_writable_location(export, EXPORT_DIR_ENV)


# The training image: the memory model reads Liger's table (which kernels an arm patches) from the installed
# liger-kernel, which the analysis image leaves out.
@task(container_image=training_image, requests=ANALYSIS_RESOURCES, enable_deck=True, environment=REGISTRATION_ENV)
def report_plan(plan: BenchmarkPlan) -> tuple[pd.DataFrame, pd.DataFrame, FlyteFile, FlyteDirectory]:
    """The plan as the workflow's outputs: the plan table (one row per condition) in place of the results, no
    steps, the plan report (plan.html, also the Deck) and a directory with plan.html and plan.csv / .parquet."""
    estimate = estimate_plan(plan)  # plan_benchmark printed it
    table = plan_table(estimate)
    report_file, files, problems = publish(
        plan_report(estimate, inputs_file_argument()), "plan.html", {"plan": table}, {}, title="Plan"
    )
    if problems:  # the plan was asked to be exported and was not: the run says so in its exit status
        raise click.ClickException("; ".join(problems))
    return table, pd.DataFrame(), report_file, files
