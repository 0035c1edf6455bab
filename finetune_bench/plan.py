"""Expand swept axes × repeats into the list of runs to execute."""

import dataclasses
import itertools
from dataclasses import dataclass

from finetune_bench.spec import ExperimentArgs, TrainingArgs, swept_axes, validate, validate_condition


@dataclass
class PlannedRun:
    """One training run: a condition (a point of the sweep grid) and its repeat number."""

    condition_id: str
    run_number: int
    training_args: TrainingArgs
    # The axes that vary in this experiment, so the analysis knows which columns to group by.
    swept_axes: list[str]


def condition_id(axis_values: dict[str, object]) -> str:
    """A stable, readable id such as `use_liger=True,per_device_train_batch_size=8`."""
    return ",".join(f"{name}={value}" for name, value in axis_values.items()) or "baseline"


def plan_runs(experiment_args: ExperimentArgs, training_args: TrainingArgs, n_runs: int) -> list[PlannedRun]:
    """Validate the inputs and list every run.

    Repeats are interleaved (all conditions once, then all again, ...) so that drift over time
    (thermals, a noisy neighbour) spreads over every condition instead of biasing one.
    """
    validate(experiment_args, training_args, n_runs)
    axes = swept_axes(experiment_args)
    grid = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    for point in grid:
        validate_condition(dataclasses.replace(training_args, **point), point)
    return [
        PlannedRun(
            condition_id=condition_id(point),
            run_number=run_number,
            training_args=dataclasses.replace(training_args, **point),
            swept_axes=list(axes),
        )
        for run_number in range(n_runs)
        for point in grid
    ]
