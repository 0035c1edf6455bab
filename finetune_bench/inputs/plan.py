"""Expand swept axes × repeats into the list of runs to execute."""

import dataclasses
import itertools
import re
from dataclasses import dataclass, field

from finetune_bench.inputs.arms import BASELINE
from finetune_bench.inputs.condition_checks import validate_condition
from finetune_bench.inputs.errors import ConditionRefused, Problems, SpecError
from finetune_bench.inputs.rules import acting_nowhere, acts_everywhere, acts_only
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, swept_axes
from finetune_bench.inputs.validation import (
    MAX_RUNS,
    check_grid_size,
    check_settings_act,
    condition_count,
    validate,
)


def run_name(condition_id: str, run_number: int) -> str:
    """A run's name wherever one run is told from another (logs, W&B, test switches, problems):
    `<condition_id>#<run_number>`."""
    return f"{condition_id}#{run_number}"


@dataclass
class PlannedRun:
    """One training run: a condition (a point of the sweep grid) and its repeat number."""

    condition_id: str
    run_number: int
    training_args: TrainingArgs
    # The axes that vary in this experiment, so the analysis knows which columns to group by.
    swept_axes: list[str]
    # Why this run cannot run at all (e.g. a liger arm on a model type Liger cannot patch): it ends as an
    # `error` result with this reason, without being launched, and the other conditions still run.
    refused: str = ""
    # The memory model's peak reserved memory for this condition (None: not predicted).
    predicted_peak_reserved_bytes: float | None = None
    # The memory model's allocated bytes at each moment it counts (`prediction.memory.MOMENT_PHASES`), checked
    # against the run's memory phases.
    predicted_moment_allocated_bytes: dict[str, float] = field(default_factory=dict)
    # Why this run is not launched although it could run: with `skip_predicted_oom`, the memory model's sure
    # out-of-memory on the target GPU. It ends as a `predicted_oom` result with this reason.
    predicted_oom: str = ""

    @property
    def name(self) -> str:
        return run_name(self.condition_id, self.run_number)


# Where the settings that act on measured runs act, and those that act on a training run.
MEASURED_RUNS = (
    "where runs are measured (a benchmark grid; a frontier's throughput runs, with measure_throughput and a "
    "batch-size search)"
)
TRAINS = "where a condition trains (a backend other than forward_only)"
PREDICTS = "where the plan predicts for a GPU: training on device cuda or auto (on a CPU nothing is predicted)"
COMPARES = (
    "where a test is run at it: an arm's runs against the baseline's (experiment_args.arm with baseline and another "
    "arm), or a software set's against the reference set's (two or more in experiment_args.software_set)"
)


@dataclass(frozen=True)
class Workload:
    """What a workflow's own settings (`RunSettings`, `PredictionTarget`) act on, for their scopes: whether it
    measures runs (a benchmark's grid, a frontier's throughput runs; a frontier's probes are neither stored nor
    analysed), whether any of them trains (not forward-only), whether any runs on a GPU or a dry run predicts for
    one, and whether the analysis tests one group of runs against another (`analysis.stats.paired_comparison`)."""

    measured_runs: bool
    trains: bool
    on_gpu: bool
    predicts: bool = True
    compares: bool = False

    @classmethod
    def of(cls, conditions: list[TrainingArgs], gpu_here: bool, target_gpu: bool = False) -> "Workload":
        """The workload of measured runs with `conditions` (empty: none), where `gpu_here` says whether device auto
        finds a GPU (a cluster's pods: true) and `target_gpu` whether a dry run predicts for one."""
        on_gpu = target_gpu or any(t.device == "cuda" or (t.device == "auto" and gpu_here) for t in conditions)
        predicts = any(t.device != "cpu" for t in conditions)
        arms = {t.arm for t in conditions}
        compares = (BASELINE in arms and len(arms) > 1) or len({t.software_set for t in conditions}) > 1
        trains = any(t.backend != "forward_only" for t in conditions)
        return cls(bool(conditions), trains, on_gpu, predicts, compares)


@dataclass
class RunSettings:
    """How the planned runs are executed and analysed: the workflow's settings that every task after planning
    reads (`validate_run_settings` checks them)."""

    # At most this many runs train at once; the grid fails when fewer than this share of its runs end.
    concurrency: int = acts_everywhere(4)
    min_success_ratio: float = acts_only(0.1, lambda w: w.measured_runs, MEASURED_RUNS)
    condition_timeout_s: int = acts_only(3600, lambda w: w.measured_runs, MEASURED_RUNS)
    # Where finished runs are kept and found again (empty: the default store), and whether to measure them again.
    results_store: str = acts_only("", lambda w: w.measured_runs, MEASURED_RUNS)
    force_fresh: bool = acts_only(False, lambda w: w.measured_runs, MEASURED_RUNS)
    # The significance level of each arm's test against the baseline (and of each software set's against the
    # reference set).
    alpha: float = acts_only(0.05, lambda w: w.measured_runs and w.compares, COMPARES)
    # The GPU the train tasks ask for on a cluster (empty: the one they were registered with); the plan's target.
    accelerator: str = acts_everywhere("")


@dataclass
class PredictionTarget:
    """What the memory model predicts for: a GPU kind (empty: the accelerator's), its memory, its price per hour,
    and whether a sure out-of-memory is recorded without launching it; and the whole fine-tune the measured runs are
    projected to."""

    gpu_kind: str = acts_only("", lambda w: w.predicts, PREDICTS)
    gpu_memory_gib: float = acts_only(0.0, lambda w: w.predicts, PREDICTS)
    gpu_hour_price: float = acts_only(
        0.0,
        lambda w: w.on_gpu,
        "where a run trains on a GPU (training_args.device cuda, or auto where a GPU is), or a dry run predicts for "
        "one (gpu_kind or gpu_memory_gib): a CPU's time is not priced at a GPU's rate",
    )
    skip_predicted_oom: bool = acts_only(False, lambda w: w.predicts, PREDICTS)
    # The fine-tune the user plans, projected from the measured runs (`analysis.projection`): `fine_tune_steps`
    # optimizer steps, or (0) `fine_tune_epochs` passes over the training data.
    fine_tune_epochs: float = acts_only(1.0, lambda w: w.trains, TRAINS)
    fine_tune_steps: int = acts_only(0, lambda w: w.trains, TRAINS)


def check_workflow_settings_act(settings: list[object], workload: Workload) -> None:
    """Refuse every workflow setting (a field of `RunSettings` or `PredictionTarget`, named as the workflow's input)
    that is set but acts in nothing `workload` runs; every problem at once."""
    found = [
        problem
        for section in settings
        for problem in acting_nowhere(
            type(section), [section], [workload], lambda name: name, "nothing this workflow runs qualifies"
        )
    ]
    if found:
        raise SpecError(*found)


@dataclass
class BenchmarkPlan:
    """What planning hands on: every run (each with its prediction), how they are executed, and what the
    predictions were made for."""

    runs: list[PlannedRun]
    execution: RunSettings
    prediction: PredictionTarget


# How a condition's problem names it (see `validate_condition`): " (condition a=1,b=2)".
_CONDITION = re.compile(r" \(condition [^)]*\)")


def _with_conditions(problem: str, where: list[re.Match | None]) -> str:
    """A problem said once for all the conditions that share it: where the condition was named, that
    condition, or how many share it and the first of them."""
    first = where[0]
    if first is None:
        return problem
    named = first.group(0)
    if len(where) > 1:
        named = f" (in {len(where)} conditions, e.g. {named.removeprefix(' (').removesuffix(')')})"
    return problem[: first.start()] + named + problem[first.start() :]


def condition_id(axis_values: dict[str, object]) -> str:
    """A stable, readable id such as `arm=liger,per_device_train_batch_size=8`; an empty value as the inputs write it,
    `software_set=''` (the installed packages)."""
    return ",".join(f"{name}={value if value != '' else repr('')}" for name, value in axis_values.items()) or "baseline"


def without_padding_when_packed(grid: list[dict[str, object]]) -> list[dict[str, object]]:
    """The grid's points with a swept padding multiple at 0 where the point packs (packed rows have no padding), each
    point once: `packing` × `pad_to_multiple_of` runs packing once, not once per multiple."""
    points = []
    for point in grid:
        if point.get("packing") and point.get("pad_to_multiple_of"):
            point = {**point, "pad_to_multiple_of": 0}
        if point not in points:
            points.append(point)
    return points


def plan_runs(experiment_args: ExperimentArgs, training_args: TrainingArgs, n_runs: int) -> list[PlannedRun]:
    """Validate the inputs and list every run.

    Repeats are interleaved (all conditions once, then all again, ...) so that drift over time
    (thermals, a noisy neighbour) spreads over every condition instead of biasing one.
    """
    problems = Problems()
    with problems.check():
        validate(experiment_args, training_args, 1)  # the settings alone: n_runs is checked below
    settings_valid = not problems.found
    with problems.check():
        check_grid_size(experiment_args, n_runs)
    if not settings_valid or condition_count(experiment_args) > MAX_RUNS:
        problems.raise_if_any()  # a grid of invalid settings, or too large a grid, is not expanded
    axes = swept_axes(experiment_args)
    grid = without_padding_when_packed(
        [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    )
    refusals, unrunnable = {}, {}
    for index, point in enumerate(grid):
        try:
            validate_condition(dataclasses.replace(training_args, **point), point)
        except ConditionRefused as refusal:
            refusals[index] = str(refusal)
        except SpecError as error:  # every kind of condition that cannot run is named, not only the first
            for problem in error.problems:
                unrunnable.setdefault(_CONDITION.sub("", problem), []).append(_CONDITION.search(problem))
    problems.found.extend(_with_conditions(problem, where) for problem, where in unrunnable.items())
    with problems.check():
        check_settings_act([dataclasses.replace(training_args, **point) for point in grid], axes)
    problems.raise_if_any()
    return [
        PlannedRun(
            condition_id=condition_id(point),
            run_number=run_number,
            training_args=dataclasses.replace(training_args, **point),
            swept_axes=list(axes),
            refused=refusals.get(index, ""),
        )
        for run_number in range(n_runs)
        for index, point in enumerate(grid)
    ]


def not_launched(planned: list[PlannedRun]) -> list[str]:
    """Why runs of `planned` are not launched (refused, or skipped as a sure out-of-memory): each reason once, in the
    order first met, with how many runs it stops and the first of their conditions."""
    runs_by_reason: dict[str, list[PlannedRun]] = {}
    for run in planned:
        if run.refused or run.predicted_oom:
            runs_by_reason.setdefault(run.refused or run.predicted_oom, []).append(run)
    lines = []
    for reason, runs in runs_by_reason.items():
        conditions = list(dict.fromkeys(run.condition_id for run in runs))
        named = ", ".join(conditions[:3]) + (f" and {len(conditions) - 3} more" if len(conditions) > 3 else "")
        lines.append(f"{reason} [{len(runs)} run(s): {named}]")
    return lines


def nothing_to_launch(planned: list[PlannedRun]) -> str:
    """The message for a grid none of whose runs can be launched (an input error: nothing would be measured), each
    reason once; empty when a run can be launched, or there is none."""
    if not planned or any(not (run.refused or run.predicted_oom) for run in planned):
        return ""
    reasons = not_launched(planned)
    return f"no run of the grid can be launched ({len(planned)} run(s), none trained); fix the inputs:\n" + "\n".join(
        f"- {reason}" for reason in reasons
    )
