import dataclasses

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.reporting.benchmark_report import grid_report
from finetune_bench.results.record import RunResult


def test_problems_of_measured_runs_reach_the_table_the_analysis_and_the_report():
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"]), TrainingArgs(), 1)
    results = [
        RunResult(r.condition_id, r.run_number, r.swept_axes, r.training_args, "ok", metrics={"tokens_per_second": 9.0})
        for r in planned
    ]
    results[1] = dataclasses.replace(results[1], problems=["results store: cannot write entry k (disk full)"])
    analysis = analyze_grid(planned, results, {})
    assert analysis.problems == ["arm=baseline#0: results store: cannot write entry k (disk full)"]
    assert list(analysis.table["problems"]) == ["", "results store: cannot write entry k (disk full)"]
    summary = grid_report(analysis).sections["Summary"]
    assert "Not everything was kept" in summary and "arm=baseline#0: results store" in summary


def test_a_clean_grid_has_no_problems():
    planned = plan_runs(ExperimentArgs(arm=["baseline"]), TrainingArgs(), 1)
    results = [RunResult(r.condition_id, r.run_number, r.swept_axes, r.training_args, "ok") for r in planned]
    analysis = analyze_grid(planned, results, {})
    assert analysis.problems == [] and "Not everything was kept" not in grid_report(analysis).sections["Summary"]
