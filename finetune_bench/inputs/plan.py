"""Expand swept axes × repeats into the list of runs to execute."""

import dataclasses
import itertools
from dataclasses import dataclass

from finetune_bench.inputs.errors import ConditionRefused
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, swept_axes
from finetune_bench.inputs.validation import validate, validate_condition


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


def condition_id(axis_values: dict[str, object]) -> str:
    """A stable, readable id such as `arm=liger,per_device_train_batch_size=8`."""
    return ",".join(f"{name}={value}" for name, value in axis_values.items()) or "baseline"


def plan_runs(experiment_args: ExperimentArgs, training_args: TrainingArgs, n_runs: int) -> list[PlannedRun]:
    """Validate the inputs and list every run.

    Repeats are interleaved (all conditions once, then all again, ...) so that drift over time
    (thermals, a noisy neighbour) spreads over every condition instead of biasing one.
    """
    validate(experiment_args, training_args, n_runs)
    axes = swept_axes(experiment_args)
    grid = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    refusals = {}
    for index, point in enumerate(grid):
        try:
            validate_condition(dataclasses.replace(training_args, **point), point)
        except ConditionRefused as refusal:
            refusals[index] = str(refusal)
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
