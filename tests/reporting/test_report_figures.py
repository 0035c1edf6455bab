"""The report writes every figure with the digits that carry it (a ratio of 0.0012 is "×0.0012", not "×0.00"),
"–" where nothing was computed (never "None" or "nan"), and the real number of pairs behind a ratio."""

import re

import matplotlib.pyplot as plt
import pandas as pd

from finetune_bench.analysis import numbers
from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.analysis.verdicts import verdicts
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.kernels.report import _ratio_figure, spans_orders_of_magnitude, summary
from finetune_bench.reporting.benchmark_report import grid_report
from finetune_bench.reporting.benchmark_tabs import cells
from finetune_bench.reporting.benchmark_tabs.cells import number_text, pairs_text, percent_text, ratio_text
from finetune_bench.reporting.benchmark_tabs.summary import headline
from finetune_bench.reporting.html import table_html
from finetune_bench.results.record import RunResult

GIB = 1024**3


def _grid(speeds: dict[str, float], n_runs: int, arms: list[str] | None = None, lost: int | None = None):
    """One condition per arm, `n_runs` runs each, at `speeds[arm]` tokens/s (1 % more per run number, so every pair
    has the same ratio); run `lost` of the last arm never came back."""
    planned = plan_runs(ExperimentArgs(arm=arms or list(speeds)), TrainingArgs(backend="plain_loop"), n_runs=n_runs)
    results = []
    for i, run in enumerate(planned):
        if lost is not None and i == len(planned) - n_runs + lost:
            results.append(None)
            continue
        speed = speeds[run.training_args.arm] * (1 + 0.01 * run.run_number)
        metrics = {"tokens_per_second": speed, "peak_reserved_bytes": 10.0 * GIB}
        results.append(RunResult(run.condition_id, run.run_number, run.swept_axes, run.training_args, "ok",
                                 metrics=metrics))  # fmt: skip
    return analyze_grid(planned, results, {})


def _cells(section: str) -> list[str]:
    return re.findall(r"<td>(.*?)</td>", section)


def test_ratios_keep_two_significant_digits_and_at_least_two_decimals():
    assert ratio_text(1.2, 1.1, 1.3) == "×1.20 [1.10, 1.30]"
    assert ratio_text(0.0012, 0.001, 0.0015) == "×0.0012 [0.0010, 0.0015]"
    assert ratio_text(0.081, float("nan"), float("nan")) == "×0.081"
    assert ratio_text(float("nan"), 1.0, 1.0) == "–"
    assert number_text(12.345) == "12.35" and number_text(0.0) == "0.00" and number_text(None) == "–"
    assert percent_text(0.031) == "3.1%" and percent_text(0.0004) == "0.040%" and percent_text(float("nan")) == "–"
    assert percent_text(0.0004, sign="+") == "+0.040%" and percent_text(-0.12, sign="+") == "-12.0%"
    assert pairs_text([3, 3]) == "3 pairs" and pairs_text([1]) == "1 pair" and pairs_text([0, 2, 5]) == "0 to 5 pairs"


def test_a_ratio_of_a_thousandth_is_written_as_one_in_the_summary():
    # an arm a thousand times slower than the baseline (Liger's kernels in the Triton interpreter on a CPU)
    summary = grid_report(_grid({"liger": 1.2, "baseline": 1000.0}, n_runs=3)).sections["Summary"]
    # the How-sure table's first view, then the same row behind its toggle
    throughputs = [cell for cell in _cells(summary) if cell.startswith("×0.0")]
    assert throughputs == ["×0.0012 [0.0012, 0.0012]"] * 2
    assert "×0.00<" not in summary and "×0.00 " not in summary


def test_the_summary_says_over_how_many_pairs_and_writes_a_dash_where_nothing_was_computed():
    summary = grid_report(_grid({"liger": 12.0, "baseline": 10.0}, n_runs=4)).sections["Summary"]
    assert "over 4 pairs" in summary and "from 3 pairs)" not in summary
    one = grid_report(_grid({"liger": 12.0, "baseline": 10.0}, n_runs=1)).sections["Summary"]
    assert "over 1 pair;" in one and "from 3 pairs)" not in one
    cells = _cells(one)
    assert "None" not in cells and "nan" not in cells and "NaN" not in cells
    assert cells.count("–") >= 3  # no interval, no p-value, no significance with one pair


def test_the_stacks_leaderboard_says_over_how_many_pairs():
    analysis = _grid({"baseline": 100.0, "liger": 130.0, "compile": 140.0}, n_runs=4)
    tab = grid_report(analysis).sections["Stacks"]
    assert "(over 4 pairs; computed from 3 pairs on)" in tab


def test_a_lost_run_s_missing_reason_and_error_are_dashes_not_nan():
    analysis = _grid({"liger": 12.0, "baseline": 10.0}, n_runs=2, lost=1)
    analysis.table["reason"] = analysis.table["reason"].where(analysis.table["status"] == "ok", float("nan"))
    conditions = grid_report(analysis).sections["Conditions"]
    assert "lost</h3>" in conditions
    assert "nan" not in conditions and "None" not in conditions
    assert "<p>–</p>" in conditions and "<pre>" not in conditions  # no error tail: no empty box


def test_a_table_cell_without_a_value_is_a_dash_whatever_the_column_holds():
    frame = pd.DataFrame({"significant": [True, None], "note": ["x", float("nan")], "text": ["nan", "None"]})
    assert _cells(table_html(frame)) == ["yes", "x", "–", "–", "–", "–"]


def test_the_summary_verdict_and_the_kernel_summary_write_ratios_with_the_report_s_digits():
    # one formatter for every figure: the tabs' cells re-export the analysis' own
    assert cells.number_text is numbers.number_text
    comparison = pd.DataFrame(
        {"arm": ["liger", "liger"], "throughput_ratio": [0.0012, 0.12], "peak_reserved_ratio": [0.5, 0.61]}
    )
    (line,) = verdicts(comparison, pd.DataFrame(), pd.DataFrame())
    assert line.startswith("liger vs baseline: throughput ×0.0012–0.12, peak reserved memory ×0.50–0.61")
    compared = _kernel_points([0.001, 0.003, 0.8, 1.2])
    (row,) = summary(compared).to_dict("records")
    assert row["speedup (full pass)"] == "×0.0010–0.0030" and row["memory ratio (full pass)"] == "×0.80–1.20"


def _kernel_points(ratios: list[float]) -> pd.DataFrame:
    """rms_norm's full pass at two sizes: the first two of `ratios` its speedups, the last two its memory ratios."""
    return pd.DataFrame(
        {
            "kernel_name": ["rms_norm"] * 4,
            "kernel_operation_mode": ["full"] * 4,
            "x_value": [16, 32, 16, 32],
            "speedup": [ratios[0], ratios[1], None, None],
            "memory_ratio": [None, None, ratios[2], ratios[3]],
        }
    )


def test_kernel_ratios_that_span_orders_of_magnitude_are_drawn_on_a_log_axis():
    assert spans_orders_of_magnitude(pd.Series([0.001, 0.003])) and not spans_orders_of_magnitude(pd.Series([0.8, 1.2]))
    compared = _kernel_points([0.001, 0.003, 0.8, 1.2])
    speed = _ratio_figure(compared, "speedup", "speedup")
    memory = _ratio_figure(compared, "memory_ratio", "memory ratio")
    assert [ax.get_yscale() for ax in speed.axes] == ["log"] and [ax.get_yscale() for ax in memory.axes] == ["linear"]
    plt.close("all")


def test_the_console_headline_says_how_runs_ended_and_how_many_were_reused():
    analysis = _grid({"liger": 12.0, "baseline": 10.0}, n_runs=2)
    assert headline(analysis)[0] == "4 runs of 2 conditions: 4 ok"
    analysis.table["reused"] = [True, True, False, False]
    first, projection, verdict = headline(analysis)
    assert first == "4 runs of 2 conditions: 4 ok, 2 of them reused from the results store"
    assert projection.startswith("liger: your fine-tune (1 epoch) is not projected: the run recorded no row lengths")
    assert verdict.startswith("liger vs baseline: throughput ×1.20")
