"""Memory-frontier tasks: plan the searches, run one search (its probes in child processes), plan the
throughput runs at the frontiers, and build the report."""

import html
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import click
import pandas as pd
from flytekit import current_context, task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.frontier.claims import check_claim, check_claim_on_a_gpu
from finetune_bench.frontier.guide import search_guide
from finetune_bench.frontier.planning import check_throughput_settings, plan_searches
from finetune_bench.frontier.predicted import (
    check_first_probes,
    check_frontier_prediction,
    check_prediction_acts,
    frontier_plan_report,
    plan_lines,
    predicted_frontiers,
    probe_target,
)
from finetune_bench.frontier.probes import child_probe
from finetune_bench.frontier.report import build_frontier_report, frontier_table, probes_table, what_was_measured
from finetune_bench.frontier.search import FrontierResult, failed_searches, search_frontier, search_line
from finetune_bench.frontier.settings import (
    BatchSizeSearch,
    FrontierArm,
    FrontierSearch,
    ProbeSettings,
    SeqLengthSearch,
    arm_name,
    frontier_arms,
    no_axes,
)
from finetune_bench.frontier.throughput import plan_throughput_runs
from finetune_bench.inputs.machine import check_cap_fits_target
from finetune_bench.inputs.plan import BenchmarkPlan, PlannedRun, PredictionTarget, RunSettings
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.inputs.validation import validate_run_settings
from finetune_bench.prediction.grid import target_gpu
from finetune_bench.running.faults import FAKE_MEMORY_ENV
from finetune_bench.sources import software
from images import analysis_image, training_image
from tasks.analysis import provenance, publish, unpack
from tasks.execution import cluster_notes, on_cluster
from tasks.inputs_yaml import inputs_file_argument
from tasks.plan import (
    PLANNING_TASK,
    check_gpus_here,
    check_nodes_here,
    check_output_locations,
    check_wandb_key,
    checked,
    for_a_cluster,
    gpu_here,
    predicted_accelerator,
)
from tasks.records import TrainOutput
from tasks.registration import ANALYSIS_RESOURCES, REGISTRATION_ENV, TRAIN_ACCELERATOR, TRAIN_RESOURCES

logger = logging.getLogger(__name__)


@dataclass
class FrontierPlan:
    """What the frontier's planning hands on: the searches, and how the throughput runs at the frontiers are
    executed."""

    searches: list[FrontierSearch]
    execution: RunSettings


# Registered as the benchmark's planning is: the training image, the registration settings, the W&B secret.
@task(**PLANNING_TASK)
def plan_frontier(
    training_args: TrainingArgs,
    arms: list[FrontierArm] | None,
    batch_size_search: BatchSizeSearch,
    seq_length_search: SeqLengthSearch,
    probes: ProbeSettings,
    n_runs: int,
    concurrency: int,
    min_success_ratio: float,
    condition_timeout_s: int,
    results_store: str = "",
    force_fresh: bool = False,
    gpu_kind: str = "",
    gpu_memory_gib: float = 0.0,
    measure_throughput: bool = True,
    dry_run: bool = False,
    claim: str = "",
) -> FrontierPlan:
    """Validate the inputs (before anything is downloaded or probed) and list the searches, with the settings of
    the throughput runs; every problem is reported at once. With throughput runs to log to W&B (`measure_throughput`
    and not `dry_run`, the workflow's inputs), a W&B key that cannot be read stops the execution here, as the
    benchmark's planning does. The plan goes to the task's log, with what a cluster execution will not keep of the
    throughput runs (`throughput_notes`)."""
    searches = checked(
        lambda: plan_searches(
            training_args,
            frontier_arms(arms),
            batch_size_search,
            seq_length_search,
            probes,
            n_runs,
            measure_throughput,
        ),
        lambda: validate_run_settings(concurrency, min_success_ratio, condition_timeout_s),
        lambda: check_frontier_prediction(gpu_kind, gpu_memory_gib),
        lambda: check_output_locations(results_store),
        lambda: check_wandb_key(dry_run or not measure_throughput),  # the probes log nothing
        lambda: check_throughput_settings(
            measure_throughput,
            n_runs,
            force_fresh,
            results_store,
            condition_timeout_s,
            min_success_ratio,
            batch_size_search,
        ),
    )
    checked(  # what needs the searches: the GPUs they run on, and their first probes against the memory model
        lambda: None,
        lambda: None if dry_run else check_gpus_here([training_args]),
        lambda: None if dry_run else check_nodes_here(no_axes(), training_args),
        lambda: check_cap_fits_target([training_args], target_gpu(gpu_kind, gpu_memory_gib, predicted_accelerator(""))),
        lambda: check_first_probes(
            searches,
            probe_target(gpu_kind, gpu_memory_gib, predicted_accelerator(""), not dry_run and not for_a_cluster()),
        ),
        lambda: check_claim(claim, searches),
        lambda: check_claim_on_a_gpu(
            claim, training_args.device, dry_run or gpu_here(), simulated=bool(os.environ.get(FAKE_MEMORY_ENV))
        ),
        lambda: check_prediction_acts(gpu_kind, gpu_memory_gib, training_args, gpu_here()),
        lambda: software.check_all([training_args.software_set], "training_args.software_set"),
    )
    execution = RunSettings(concurrency, min_success_ratio, condition_timeout_s, results_store, force_fresh)
    notes = [] if dry_run or not measure_throughput else throughput_notes(results_store)
    if not dry_run:  # a dry run's plan is printed with each search's prediction (`report_frontier_plan`)
        lines = [f"{arm_name(s.arm)}: {s.dimension} from {s.start} up to {s.cap}" for s in searches]
        print("the plan:\n" + "\n".join([*lines, *(f"note: {note}" for note in notes)]), flush=True)
    return FrontierPlan(searches, execution)


def throughput_notes(results_store: str) -> list[str]:
    """What a cluster execution will not keep of the throughput runs at the frontiers, in the benchmark's words
    (`tasks.execution.cluster_notes`: an empty `results_store` leaves them on their train pods' disks); none
    locally. The searches keep nothing anyway: their probes always run afresh."""
    return [f"the throughput runs: {note}" for note in cluster_notes(results_store)]


@task(
    container_image=training_image,
    requests=TRAIN_RESOURCES,
    accelerator=TRAIN_ACCELERATOR,
    environment=REGISTRATION_ENV,
)
def search_memory_frontier(
    search: FrontierSearch, dataset_dir: FlyteDirectory, model_dir: FlyteDirectory
) -> FrontierResult:
    """One arm's search along one dimension; every probe trains in a fresh child process on this task's GPU (a
    search on several GPUs: `tasks.frontier_ranks`)."""
    work_dir = search_work_dir()
    model_path = Path(model_dir.download())
    probe = child_probe(Path(dataset_dir.download()), model_path, work_dir, search.timeout_s)
    result = search_frontier(search, probe, search_guide(search, model_path))
    log_search_end(result)
    return result


def log_search_end(result: FrontierResult) -> None:
    """The search's ending in one line (`search_line`): in a cluster's pod on the task's log, locally at info level
    (a local run's console has its own ending)."""
    if on_cluster():
        print(search_line(result), flush=True)
    else:
        logger.info("%s", search_line(result))


def search_work_dir() -> Path:
    """A directory of one search's probes (unique per search: locally, every item of a map task shares one working
    directory)."""
    return Path(tempfile.mkdtemp(prefix="frontier-", dir=current_context().working_directory))


@task(container_image=analysis_image, requests=ANALYSIS_RESOURCES, environment=REGISTRATION_ENV)
def plan_frontier_throughput(
    results: list[FrontierResult | None],
    training_args: TrainingArgs,
    arms: list[FrontierArm] | None,
    n_runs: int,
    measure_throughput: bool,
    execution: RunSettings,
) -> BenchmarkPlan:
    """The throughput runs at the batch frontiers (none when measure_throughput is off), run by the benchmark's
    train tasks with `execution`."""
    runs = plan_throughput_runs(results, training_args, frontier_arms(arms), n_runs) if measure_throughput else []
    return BenchmarkPlan(runs, execution, PredictionTarget())


class FrontierOutputs(NamedTuple):
    frontiers: pd.DataFrame
    probes: pd.DataFrame
    throughput: pd.DataFrame
    report: FlyteFile


class FrontierReport(NamedTuple):
    frontiers: pd.DataFrame
    probes: pd.DataFrame
    throughput: pd.DataFrame
    report: FlyteFile
    # What left a measured throughput run unstored, unlogged or unexported (see `require_nothing_lost`).
    problems: list[str]


# The training image: the memory model reads Liger's table from the installed liger-kernel (see tasks.plan).
@task(container_image=training_image, requests=ANALYSIS_RESOURCES, enable_deck=True, environment=REGISTRATION_ENV)
def report_frontier_plan(searches: list[FrontierSearch], gpu_kind: str, gpu_memory_gib: float) -> FrontierOutputs:
    """The dry run's outputs: the predicted frontier of every search (in place of the frontier table), no probes,
    no throughput runs, and the plan report (frontier_plan.html, also the Deck). An empty `gpu_kind`: on a cluster,
    the GPU the train tasks are registered with (`tasks.plan.predicted_accelerator`). The task's log: a line per
    search; the totals are the report's headline, which a local run's console ends with."""
    target = target_gpu(gpu_kind, gpu_memory_gib, predicted_accelerator(""))
    table = predicted_frontiers(searches, target)
    print("the plan:\n" + "\n".join(plan_lines(table)), flush=True)
    # The header the frontier's report opens with, for what the searches would probe: nothing ran, so no versions.
    header = what_was_measured(searches, {"inputs_file": inputs_file_argument()}, None, None)
    header["hardware"] = f"{target.describe()}, predicted (nothing ran)"
    report = frontier_plan_report(table, target, header)
    report_file, _, problems = publish(
        report, "frontier_plan.html", {"frontier_plan": table}, {}, title="Frontier plan"
    )
    if problems:  # the plan was asked to be exported and was not: the run says so in its exit status
        raise click.ClickException("; ".join(problems))
    return FrontierOutputs(table, pd.DataFrame(), pd.DataFrame(), report_file)


@task(container_image=analysis_image, requests=ANALYSIS_RESOURCES, enable_deck=True, environment=REGISTRATION_ENV)
def report_frontier(
    searches: list[FrontierSearch],
    results: list[FrontierResult | None],
    planned: list[PlannedRun],
    outputs: list[TrainOutput | None],
    execution: RunSettings | None = None,
    claim: str = "",
) -> FrontierReport:
    """Frontier table (one row per search), probe table, throughput table, the HTML report (also the Deck),
    and the problems that left a measured throughput run unstored, unlogged or unexported. With the throughput
    runs' `execution`, the report opens with what a cluster execution did not keep of them (`throughput_notes`)."""
    throughput = analyze_grid(planned, *unpack(outputs))
    report = build_frontier_report(searches, results, throughput, inputs_file_argument(), claim)
    notes = throughput_notes(execution.results_store) if planned and execution is not None else []
    if notes:
        warnings = "".join(f'<div class="warning"><b>Note.</b> {html.escape(note)}</div>' for note in notes)
        report.sections["Frontier"] = warnings + report.sections["Frontier"]
    frontiers, probes = frontier_table(searches, results), probes_table(results)
    tables = {"frontiers": frontiers, "probes": probes, "throughput": throughput.table}
    environment = next((r.environment for r in results if r is not None and r.environment), {})
    environment = dict(environment or throughput.environment)
    if inputs_file_argument():  # a local run: environment.json names the inputs file it was given
        environment["inputs_file"] = inputs_file_argument()
    records = {"environment": {**provenance(throughput, planned), "environment": environment}}
    report_file, _, export_problems = publish(report, "frontier_report.html", tables, records, title="Memory frontier")
    failed = failed_searches(searches, results)  # the workflow then fails, each search's reason named
    return FrontierReport(
        frontiers, probes, throughput.table, report_file, throughput.problems + export_problems + failed
    )
