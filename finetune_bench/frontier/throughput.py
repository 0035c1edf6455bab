"""Throughput at the frontier: full-length runs of every arm at its own batch frontier and at the largest
batch every arm fits."""

import dataclasses
import itertools

from finetune_bench.frontier.search import FrontierResult
from finetune_bench.frontier.settings import BATCH_SIZE, FrontierArm, arm_name, arm_overrides, no_axes
from finetune_bench.inputs.plan import PlannedRun, condition_id
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.inputs.validation import validate

THROUGHPUT_AXES = [*dataclasses.asdict(FrontierArm()), BATCH_SIZE]


def largest_common_batch(results: list[FrontierResult | None], arms: list[FrontierArm]) -> int | None:
    """The largest batch size every arm fits (None unless every arm's batch search found a frontier)."""
    frontiers = {arm_name(r.search.arm): r.frontier for r in _batch_results(results)}
    if any(frontiers.get(arm_name(arm)) is None for arm in arms):
        return None
    return min(frontiers.values())


def plan_throughput_runs(
    results: list[FrontierResult | None], training_args: TrainingArgs, arms: list[FrontierArm], n_runs: int
) -> list[PlannedRun]:
    """Runs of `training_args` (its max_steps, not the probes') for every arm at its own batch frontier and
    at the largest batch every arm fits, `n_runs` times each, interleaved. Arms without a frontier get none."""
    common = largest_common_batch(results, arms)
    points = []
    for result in _batch_results(results):
        if result.frontier is None:
            continue
        for batch in dict.fromkeys(b for b in (result.frontier, common) if b is not None):
            points.append({**arm_overrides(result.search.arm), BATCH_SIZE: batch})
    runs = []
    for run_number, point in itertools.product(range(n_runs), points):
        args = dataclasses.replace(training_args, **point)
        validate(no_axes(), args, n_runs)
        runs.append(PlannedRun(condition_id(point), run_number, args, list(THROUGHPUT_AXES)))
    return runs


def _batch_results(results: list[FrontierResult | None]) -> list[FrontierResult]:
    return [r for r in results if r is not None and r.search.dimension == BATCH_SIZE]
