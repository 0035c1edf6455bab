"""A run's timeline: where its wall time went, measured in the child and by the launcher, one metric row per phase,
in the results table and in the report."""

import dataclasses

import pandas as pd
import pytest
import torch

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.analysis.tables import results_table
from finetune_bench.analysis.timeline import IN_WALL_COLUMNS, OTHER_COLUMN, OUTSIDE_STEPS_COLUMN, PHASE_COLUMNS
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.metrics import IN_WALL, LAUNCHER, MAX, METRICS, TIMELINE
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.reporting.benchmark_report import grid_report
from finetune_bench.results.store import ResultStore
from finetune_bench.running.launch import run_or_reuse
from finetune_bench.running.worker import LAUNCHED_AT_ENV, startup_seconds

CHILD_PHASES = ("startup_s", "imports_s", "model_init_s", "data_s", "setup_s", "warmup_time_s", "timed_steps_s")


def test_every_phase_is_a_row_of_the_metrics_table_in_seconds_with_a_column_and_a_merge():
    assert {metric.name for metric in METRICS.values() if metric.phase} == {metric.name for metric in TIMELINE}
    assert TIMELINE[0].name == "store_s" and TIMELINE[0].phase == LAUNCHER
    for metric in TIMELINE:
        assert metric.unit == "s" and metric.column == metric.name and metric.description, metric.name
        # a phase of several ranks is the slowest rank's (the steps' and evaluations' stay rank 0's: they step together)
        assert metric.ranks == MAX or metric.name in ("warmup_time_s", "eval_time_s"), metric.name
    assert [m.name for m in TIMELINE if m.phase == IN_WALL] == IN_WALL_COLUMNS


def test_a_recorder_phase_adds_up_and_refuses_a_name_that_is_not_one():
    recorder = StepRecorder(device=torch.device("cpu"), warmup_steps=0)
    for _ in range(2):
        with recorder.phase("data_s"):
            pass
    assert recorder.phases["data_s"] >= 0
    with pytest.raises(ValueError, match="not a phase"):
        with recorder.phase("tokens_per_second"):
            pass
    with pytest.raises(ValueError, match="not a phase"):  # the launcher's, not the child's
        with recorder.phase("store_s"):
            pass


def test_the_startup_stamp_is_read_only_when_it_is_the_launcher_s_and_before_now():
    assert startup_seconds({LAUNCHED_AT_ENV: "100.0"}, 102.5) == 2.5
    assert startup_seconds({}, 102.5) is None
    assert startup_seconds({LAUNCHED_AT_ENV: "soon"}, 102.5) is None
    assert startup_seconds({LAUNCHED_AT_ENV: "200.0"}, 102.5) is None  # not this machine's clock


def test_a_tiny_cpu_run_s_timeline_is_measured_positive_and_within_its_wall_time(
    tiny_model_dir, tiny_dataset_dir, tmp_path
):
    args = dataclasses.replace(TrainingArgs(), max_steps=3, backend="plain_loop", eval_examples=4, device="cpu")
    run = PlannedRun(condition_id="tiny", run_number=0, training_args=args, swept_axes=[])
    store = ResultStore(str(tmp_path / "store"))
    result = run_or_reuse(run, store, tiny_dataset_dir, tiny_model_dir, tmp_path / "run", timeout_s=300)
    assert result.status == "ok", result.error_tail
    measured = {m.name: result.metrics.get(m.name) for m in TIMELINE}
    # every phase but the profile (none asked for) measured, each positive
    # not measured here: the profile (none asked), the shape probes (the plain loop's, on a GPU)
    assert [name for name, value in measured.items() if value is None] == ["shape_probes_s", "profile_s"]
    assert all(value > 0 for value in measured.values() if value is not None), measured
    in_wall = sum(result.metrics[name] for name in IN_WALL_COLUMNS if name in result.metrics)
    assert in_wall <= result.wall_time_s
    # the phases cover the run: what none of them covers is a small part of it (seen: about 20 ms of 6 s)
    assert result.wall_time_s - in_wall < 0.25 * result.wall_time_s
    assert result.metrics["timed_steps_s"] == result.metrics["measured_time_s"]

    row = results_table([run], [result]).iloc[0]
    assert all(row[column] == result.metrics[column] for column in PHASE_COLUMNS if column in result.metrics)
    assert pd.isna(row["profile_s"])  # not measured: empty, not 0

    analysis = analyze_grid([run], [result], {})
    table = analysis.table.iloc[0]
    assert table[OTHER_COLUMN] == pytest.approx(result.wall_time_s - in_wall)
    steps = result.metrics["warmup_time_s"] + result.metrics["timed_steps_s"]
    assert table[OUTSIDE_STEPS_COLUMN] == pytest.approx(result.wall_time_s - steps)
    timeline = analysis.timeline.iloc[0]
    assert timeline["runs"] == 1 and timeline["model_init_s"] == result.metrics["model_init_s"]
    assert pd.isna(timeline["profile_s"])

    report = grid_report(analysis).to_html()
    assert "Where the wall time went" in report
    for column in [*PHASE_COLUMNS, OTHER_COLUMN, OUTSIDE_STEPS_COLUMN]:
        assert f"<th>{column}</th>" in report, column
