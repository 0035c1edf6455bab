"""`min_success_ratio`: runs that ended error, timeout or nonfinite (or returned nothing) count against it, an
out-of-memory run is a result; below it the execution fails after the report and every result are written, naming
each failed run."""

import pytest

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.results.record import RunResult
from tasks.analysis import NothingKept, require_nothing_lost, success_ratio_problems


def grid(*statuses: str | None) -> tuple[list[PlannedRun], list[RunResult | None]]:
    planned, results = [], []
    for index, status in enumerate(statuses):
        run = PlannedRun(f"arm=a{index}", 0, TrainingArgs(), ["arm"])
        planned.append(run)
        reason = f"{status} of run {index}\nsecond line" if status else ""
        results.append(
            None if status is None else RunResult(run.condition_id, 0, ["arm"], run.training_args, status, reason)
        )
    return planned, results


def test_out_of_memory_runs_are_results_and_failures_count_against_the_ratio():
    assert success_ratio_problems(*grid("ok", "oom", "predicted_oom", "error"), 0.75) == []
    (problem,) = success_ratio_problems(*grid("ok", "oom", "error", "timeout", "nonfinite", None), 0.5)
    assert problem.startswith("min_success_ratio 0.5: 2 of 6 runs succeeded (33%); 4 ended error, timeout or nonfinite")
    for line in (
        "- arm=a2 run 0: error: error of run 2",
        "- arm=a3 run 0: timeout: timeout of run 3",
        "- arm=a4 run 0: nonfinite: nonfinite of run 4",
        "- arm=a5 run 0: no result",
    ):
        assert line in problem
    assert "second line" not in problem and "arm=a1" not in problem
    (problem,) = success_ratio_problems(*grid("error"), 0.5, "runs/20261126-120000/report.html")
    assert "the report and every result were written: runs/20261126-120000/report.html)" in problem


def test_below_the_ratio_the_execution_fails_naming_the_failures_beside_lost_results():
    ratio = success_ratio_problems(*grid("error", "error"), 0.1)
    with pytest.raises(NothingKept) as error:
        require_nothing_lost(problems=ratio)
    assert str(error.value.message).startswith("min_success_ratio 0.1: 0 of 2 runs succeeded")
    with pytest.raises(NothingKept) as error:
        require_nothing_lost(problems=["store: run x was not saved", *ratio])
    message = error.value.message
    assert message.startswith("1 problem(s) kept measured results from being stored, logged or exported")
    assert "- store: run x was not saved\nmin_success_ratio 0.1" in message
    require_nothing_lost(problems=[])
