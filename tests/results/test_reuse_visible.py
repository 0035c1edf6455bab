"""A run taken from the results store is said to be one: on the console (when and where it was measured, how to
measure it again), in the Summary, in the Runs table and in the timeline."""

import pandas as pd

from finetune_bench.analysis.tables import reuse_note
from finetune_bench.analysis.timeline import condition_timeline
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.results.record import RunResult
from finetune_bench.running.launch import reuse_line


def _table(reused: list[bool]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "condition_id": [f"c{i}" for i in range(len(reused))],
            "arm": ["liger", "baseline"] * (len(reused) // 2),
            "run_number": 0,
            "status": "ok",
            "reused": reused,
            "measured_at": ["2026-11-20 09:15 UTC", "2026-11-21 10:00 UTC", "", ""][: len(reused)],
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "wall_time_s": 20.0,
        }
    )


def test_the_summary_says_how_many_runs_were_reused_when_and_on_what():
    note = reuse_note(_table([True, True, False, False]))
    assert note.startswith("2 of 4 runs reused from the results store, measured between 2026-11-20 09:15 UTC and ")
    assert "on NVIDIA H100 80GB HBM3" in note and "force_fresh: true measures them again" in note
    assert reuse_note(_table([False, False, False, False])) == ""  # every run measured now: nothing said


def test_the_console_line_says_when_and_where_the_reused_run_was_measured():
    result = RunResult(
        condition_id="c", run_number=0, swept_axes=[], training_args=TrainingArgs(), status="ok",
        details={"measured_at": "2026-11-20 09:15 UTC", "device": "cuda:0"},
        environment={"gpu_name": "NVIDIA H100 80GB HBM3"},
    )  # fmt: skip
    assert reuse_line(result, "abc123") == (
        "reused the stored result abc123 (ok), measured 2026-11-20 09:15 UTC on NVIDIA H100 80GB HBM3 "
        "(force_fresh: true measures it again)"
    )
    result.details, result.environment = {}, {}  # a record stored before runs said when they were measured
    assert "measured at an unrecorded time on an unrecorded device" in reuse_line(result, "abc123")


def test_the_timeline_counts_each_condition_s_reused_runs():
    table = _table([True, False])
    timeline = condition_timeline(table, ["arm"])
    assert dict(zip(timeline["arm"], timeline["reused_runs"], strict=True)) == {"liger": 1, "baseline": 0}
