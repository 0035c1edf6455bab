"""Checks of the inputs as a whole, before the grid is expanded or anything downloaded: the axes and the training
settings together (a value an axis replaces, a setting that acts in no condition of the grid), the grid's size,
counted without expanding it, and the workflow's own run settings. A single setting's type and range are checked
where it is declared (`finetune_bench.inputs.settings`); one condition's settings that cannot run together, in
`finetune_bench.inputs.condition_checks`."""

import dataclasses
import math
from collections.abc import Collection, Sequence

from finetune_bench.inputs.errors import Problems, SpecError
from finetune_bench.inputs.locations import check_writable_location  # noqa: F401 (where the workflows find it)
from finetune_bench.inputs.rules import acting_nowhere
from finetune_bench.inputs.settings import (
    ExperimentArgs,
    TrainingArgs,
    axis_names,
    smoke_experiment,
    swept_axes,
    validate_experiment_args,
    validate_training_args,
)

# More runs than this in one grid is a mistake in the inputs (days of GPU time), refused before it is expanded.
MAX_RUNS = 10_000


def validate(experiment_args: ExperimentArgs, training_args: TrainingArgs, n_runs: int) -> None:
    """Reject inputs that cannot run, naming each key at fault, every problem in one SpecError. Called
    before anything is downloaded or trained; the grid's size is checked arithmetically, never expanded."""
    training_fields = {f.name for f in dataclasses.fields(TrainingArgs)}
    for name in axis_names():
        if name not in training_fields:
            raise SpecError(f"experiment_args.{name} has no matching training_args field")
    problems = Problems()
    with problems.check():
        validate_experiment_args(experiment_args)
    with problems.check():
        validate_training_args(training_args)
    with problems.check():
        check_grid_size(experiment_args, n_runs)
    with problems.check():
        check_not_replaced_by_axes(experiment_args, training_args)
    problems.raise_if_any()


def check_not_replaced_by_axes(experiment_args: ExperimentArgs, training_args: TrainingArgs) -> None:
    """Refuse a training_args value (not its default) for an axis the grid sweeps: every condition takes the axis'
    values instead, so the value would change nothing (the workflow's default grid sweeps `arm` and the batch size
    when a file gives no experiment_args)."""
    swept = swept_axes(experiment_args)
    default = smoke_experiment() == experiment_args
    problems = Problems()
    for name, values in swept.items():
        declared = next(f for f in dataclasses.fields(TrainingArgs) if f.name == name)
        unset = declared.default if declared.default is not dataclasses.MISSING else declared.default_factory()
        value = getattr(training_args, name)
        if value == unset:
            continue
        grid = " (the workflow's default grid, used when the file gives no experiment_args)" if default else ""
        problems.found.append(
            f"training_args.{name} ({value!r}) is replaced in every condition by experiment_args.{name} "
            f"{values!r}{grid}, so it would change nothing: sweep it there (experiment_args: {{{name}: [{value!r}]}}) "
            f"or leave it out of training_args"
        )
    problems.raise_if_any()


def check_settings_act(conditions: Sequence[TrainingArgs], swept: Collection[str] = ()) -> None:
    """Refuse every setting that a condition sets (not its default) but that acts in none of the grid's `conditions`:
    where a setting acts is declared beside its field (`rules.acts_only`); such a setting would change nothing of
    what is measured. A setting that acts in some conditions (the one-GPU point of a GPU-count sweep) is kept. `swept`:
    the axes, named as experiment_args' in the message."""
    found = acting_nowhere(
        TrainingArgs,
        conditions,
        conditions,
        lambda name: f"{'experiment_args' if name in swept else 'training_args'}.{name}",
    )
    if found:
        raise SpecError(*found)


def condition_count(experiment_args: ExperimentArgs) -> int:
    """How many conditions the swept axes make (the product of their lengths), without listing them."""
    axes = [getattr(experiment_args, name) for name in axis_names()]
    return math.prod(len(values) for values in axes if isinstance(values, list) and values)


def check_grid_size(experiment_args: ExperimentArgs, n_runs: int) -> None:
    """`n_runs` a positive integer, and at most `MAX_RUNS` runs in the grid, counted without expanding it."""
    if not isinstance(n_runs, int) or isinstance(n_runs, bool) or n_runs <= 0:
        raise SpecError(f"n_runs must be a positive integer, got {n_runs!r}")
    conditions = condition_count(experiment_args)
    if conditions * n_runs > MAX_RUNS:
        raise SpecError(
            f"the grid is {conditions:,} condition(s) × n_runs {n_runs:,} = {conditions * n_runs:,} runs; at most "
            f"{MAX_RUNS:,} run in one grid: sweep fewer values or split the grid"
        )


# The shortest condition timeout taken: a run's start (process, imports, model) alone takes seconds.
MIN_CONDITION_TIMEOUT_S = 30


def validate_run_settings(
    concurrency: int, min_success_ratio: float, condition_timeout_s: int, alpha: float = 0.05
) -> None:
    """The workflow's own settings, every problem in one SpecError."""
    problems = []
    if isinstance(alpha, bool) or not 0 < alpha < 1:
        problems.append(f"alpha (the significance level) must be in (0, 1), got {alpha!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        problems.append(f"concurrency must be a positive integer, got {concurrency!r}")
    if isinstance(min_success_ratio, bool) or not 0 < min_success_ratio <= 1:
        problems.append(f"min_success_ratio must be in (0, 1], got {min_success_ratio!r}")
    if isinstance(condition_timeout_s, bool) or not isinstance(condition_timeout_s, int) or condition_timeout_s <= 0:
        problems.append(f"condition_timeout_s must be a positive number of seconds, got {condition_timeout_s!r}")
    elif condition_timeout_s < MIN_CONDITION_TIMEOUT_S:
        problems.append(
            f"condition_timeout_s {condition_timeout_s} is in seconds: every run would be killed before its start is "
            f"over; write at least {MIN_CONDITION_TIMEOUT_S} (3600 is an hour)"
        )
    if problems:
        raise SpecError(*problems)
