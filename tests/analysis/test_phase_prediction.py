"""The memory model's moments checked against the memory phases a run records."""

import pandas as pd
import pytest

from finetune_bench.analysis.tables import phase_prediction_errors
from finetune_bench.reporting.benchmark_tabs.memory import _peak_moment_mismatches


def run_row(condition: str, backward_start: float, optimizer_step: float, **measured: float) -> dict:
    return {
        "condition_id": condition,
        "run_number": 0,
        "status": "ok",
        "predicted_backward_start_allocated_gib": backward_start,
        "predicted_optimizer_step_allocated_gib": optimizer_step,
        **{f"peak_allocated_{phase}_gib": value for phase, value in measured.items()},
    }


def test_each_moment_meets_the_largest_of_its_phases_and_a_misplaced_peak_is_named():
    table = pd.DataFrame(
        [
            # predicted at the backward pass's start, measured there (the backward phase is the largest before it)
            run_row("a", 30.0, 20.0, forward=25.0, loss=27.0, backward=28.0, optimizer=21.0),
            # predicted at the backward pass's start, measured at the optimizer step
            run_row("b", 40.0, 37.0, forward=28.0, backward=34.0, optimizer=37.5),
            {"condition_id": "c", "run_number": 0, "status": "oom"},  # no measured peak: no row
        ]
    )
    errors = phase_prediction_errors(table)
    a = errors[errors["condition_id"] == "a"].set_index("moment")
    assert a.loc["backward_start", "measured_allocated_gib"] == 28.0
    assert a.loc["backward_start", "error"] == pytest.approx(30 / 28 - 1)
    assert a.loc["optimizer_step", "measured_allocated_gib"] == 21.0
    assert set(errors["condition_id"]) == {"a", "b"}
    sentence = _peak_moment_mismatches(errors)
    assert "for 1 run(s): b run 0 (predicted at the backward start, measured at the optimizer step)" in sentence


def test_runs_without_a_prediction_or_phases_give_no_rows():
    table = pd.DataFrame([{"condition_id": "a", "run_number": 0, "status": "ok", "peak_allocated_gib": 3.0}])
    assert phase_prediction_errors(table).empty
    assert _peak_moment_mismatches(phase_prediction_errors(table)) == ""
