"""Energy per token and cost per million tokens: the cost formula, the results and comparison tables, and the
report's Summary and Throughput tab (with the figures, and without them, saying why)."""

import math
from html import escape

import pandas as pd
import pytest

from finetune_bench.analysis.grid import analyze_table
from finetune_bench.analysis.tables import COST_COLUMN, cost_per_million_tokens, results_table, with_cost
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.measuring.metrics import ENERGY_UNAVAILABLE
from finetune_bench.reporting.benchmark_report import grid_report
from finetune_bench.results.record import RunResult

SWEPT = ["arm"]
NO_COUNTER = "NVML's energy counter is unavailable: NVMLError_NotSupported: Not Supported"


def test_the_cost_is_the_price_times_the_gpus_times_the_hours_a_million_tokens_take():
    # 1000 tokens/s: a million tokens take 1000 s; on 2 GPUs at 4 per GPU-hour: 4 × 2 × 1000 / 3600
    assert cost_per_million_tokens(1000.0, 2, 4.0) == pytest.approx(8000 / 3600)
    table = pd.DataFrame({"tokens_per_second": [1000.0, 0.0, float("nan")], "world_size": [2, 1, 1]})
    costs = with_cost(table, 4.0)[COST_COLUMN]
    assert costs[0] == pytest.approx(8000 / 3600) and math.isnan(costs[1]) and math.isnan(costs[2])
    assert with_cost(table, 0.0)[COST_COLUMN].isna().all()  # no price, no cost (never 0)


def _grid(energy: bool) -> tuple:
    """Three repeats of the baseline and liger; liger 25 % faster and 20 % less energy per token."""
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"]), TrainingArgs(), n_runs=3)
    results = []
    for run in planned:
        liger = run.training_args.arm == "liger"
        tokens_per_second = (1250.0 if liger else 1000.0) + run.run_number
        metrics = {"tokens_per_second": tokens_per_second, "peak_reserved_bytes": 2.0**30}
        details = {"device": "cuda:0", "steps_completed": "5"}
        if energy:
            metrics["energy_per_token_j"] = (0.4 if liger else 0.5) * (1 + 0.01 * run.run_number)
            metrics["energy_kwh"] = 0.01
        else:
            details[ENERGY_UNAVAILABLE] = NO_COUNTER
        results.append(
            RunResult(run.condition_id, run.run_number, run.swept_axes, run.training_args, "ok", metrics=metrics,
                      details=details)
        )  # fmt: skip
    return planned, results


def test_the_tables_carry_energy_and_cost_and_the_report_shows_them():
    analysis = analyze_table(results_table(*_grid(energy=True)), SWEPT, {}, gpu_hour_price=3.0)
    liger = analysis.table[analysis.table["arm"] == "liger"]
    assert liger[COST_COLUMN].tolist() == pytest.approx([3.0 * 1e6 / tps / 3600 for tps in liger.tokens_per_second])
    (row,) = analysis.paired.to_dict("records")
    assert row["energy_per_token_ratio"] == pytest.approx(0.8)
    (compared,) = analysis.comparison.to_dict("records")
    assert compared["energy_per_token_ratio"] == pytest.approx(0.8)
    assert compared[f"baseline_{COST_COLUMN}"] == pytest.approx(3.0 * 1e6 / 1001.0 / 3600)
    summary = analysis.summary.set_index("arm")
    assert summary.loc["baseline", "energy_per_token_j"] == pytest.approx(0.505)
    report = grid_report(analysis)
    assert "energy per token ×" in report.sections["Summary"]
    assert "×0.80" in report.sections["Summary"]
    assert "Energy and cost" in report.sections["Summary"]
    assert "at 3 per GPU-hour" in report.sections["Summary"]
    assert "timed steps only" in report.sections["Summary"]
    throughput = report.sections["Throughput"]
    assert escape("GPU energy per token by batch size") in throughput
    assert escape("cost per million tokens at 3 per GPU-hour") in throughput


def test_without_energy_or_price_the_report_says_why_and_shows_no_zero():
    analysis = analyze_table(results_table(*_grid(energy=False)), SWEPT, {})
    assert analysis.table["energy_per_token_j"].isna().all()
    assert (analysis.table["energy_unavailable"] == NO_COUNTER).all()
    assert analysis.table[COST_COLUMN].isna().all()
    report = grid_report(analysis)
    assert escape(NO_COUNTER) in report.sections["Summary"]
    assert "energy per token ×" not in report.sections["Summary"]
    assert "per GPU-hour" not in report.sections["Summary"]
    assert "Energy per token: not measured" in report.sections["Throughput"]
