"""The Versions view: each software set against the reference set, arm by arm, over runs paired by run number; the
set the Summary names; the releases each set imported; and the tab, only where the grid swept the set."""

import dataclasses
import itertools
import json
from html import escape

import pandas as pd
import pytest

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.analysis.versions import (
    FASTER,
    LOSS_CURVES,
    LOSS_DOES_NOT_MATCH,
    NO_DIFFERENCE,
    SLOWER,
    chosen_sets,
    imported_versions_table,
    reference_set,
    versions_table,
    versions_verdicts,
)
from finetune_bench.inputs.plan import PlannedRun, condition_id, plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, axis_names
from finetune_bench.reporting.benchmark_report import grid_report
from finetune_bench.results.record import RunResult

GIB = 1024**3
OLD, NEW = "liger-kernel==0.8.2", "liger-kernel==0.8.5"
N_RUNS = 4
# Per run number, a drift every set shares (runs with the same number ran close in time): paired by run number the
# ratios are the set's factor times a small jitter; unpaired, they would spread by ±15 %.
DRIFT = [1.0, 1.15, 0.85, 1.1]
# Per run number, a jitter of the compared set alone (median 1, mean logarithm about 0).
JITTER = [1.01, 0.99, 1.005, 0.995]


def _planned(sets, arms, batches) -> list[PlannedRun]:
    """The runs `plan_runs` lists for `arms` × `batches` × `sets` (repeats interleaved), without preparing the sets
    (planning would install each with uv)."""
    axes = {"arm": list(arms), "per_device_train_batch_size": list(batches), "software_set": list(sets)}
    points = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    training_args = TrainingArgs(backend="plain_loop")
    return [
        PlannedRun(condition_id(point), n, dataclasses.replace(training_args, **point), list(axes))
        for n in range(N_RUNS)
        for point in points
    ]


def _grid(sets, speed, memory=None, final_loss=None, arms=("liger", "baseline"), imported=True, batches=(8,)):
    """A grid of `arms` × `batches` × `sets` with N_RUNS repeats. `speed[(arm, set)]` or `speed[(arm, set, batch)]`:
    the throughput factor of that arm under that set (1 where absent); every set but the reference (the installed
    packages, else the first) runs with JITTER. `memory[set]`: its peak memory factor; `final_loss[set]`: its runs'
    final loss (2.0 where absent)."""
    planned = _planned(sets, arms, batches)
    steady = "" if "" in sets else sets[0]
    results = []
    for run in planned:
        arm, software_set, n = run.training_args.arm, run.training_args.software_set, run.run_number
        factor = speed.get((arm, software_set, run.training_args.per_device_train_batch_size))
        factor = factor if factor is not None else speed.get((arm, software_set), 1.0)
        jitter = 1.0 if software_set == steady else JITTER[n]
        memory_factor = (memory or {}).get(software_set, 1.0)
        metrics = {
            "tokens_per_second": 1000.0 * (1.3 if arm == "liger" else 1.0) * factor * DRIFT[n] * jitter,
            "peak_reserved_bytes": 20 * GIB * memory_factor,
            "peak_allocated_bytes": 16 * GIB * memory_factor,
            "energy_per_token_j": 0.5 / factor,
            "final_loss": (final_loss or {}).get(software_set, 2.0) + 0.001 * n,
        }
        pins = dict(pin.split("==") for pin in software_set.split(",") if pin)
        details = {"imported_versions": json.dumps(pins) if pins and imported else ""}
        args = (run.condition_id, run.run_number, run.swept_axes, run.training_args, "ok")
        results.append(RunResult(*args, metrics=metrics, details=details))
    return analyze_grid(planned, results, {})


def _row(versions: pd.DataFrame, arm: str, software_set: str) -> pd.Series:
    rows = versions[(versions["arm"] == arm) & (versions["software_set"] == software_set)]
    assert len(rows) == 1
    return rows.iloc[0]


def test_a_faster_set_is_measured_against_the_installed_packages_over_runs_paired_by_run_number():
    # the installed packages are the reference though the sweep names them second
    analysis = _grid([OLD, "", NEW], speed={("liger", NEW): 1.10}, memory={NEW: 0.9})
    versions = versions_table(analysis.table, analysis.swept, analysis.alpha)
    assert reference_set(analysis.table) == ""
    assert set(versions["reference"]) == {""}
    assert sorted(zip(versions["arm"], versions["software_set"], strict=True)) == sorted(
        [("liger", OLD), ("liger", NEW), ("baseline", OLD), ("baseline", NEW)]
    )
    assert (versions["pairs"] == N_RUNS).all()
    faster = _row(versions, "liger", NEW)
    assert faster["throughput_ratio"] == pytest.approx(1.10, rel=1e-3)
    # paired by run number the interval is the jitter's (±1 %); the ±15 % drift would widen it far beyond
    assert 1.08 < faster["throughput_ci_low"] < 1.10 < faster["throughput_ci_high"] < 1.12
    assert faster["throughput_significant"]
    assert faster["peak_reserved_ratio"] == pytest.approx(0.9) and faster["peak_allocated_ratio"] == pytest.approx(0.9)
    assert faster["energy_per_token_ratio"] == pytest.approx(1 / 1.10)
    assert faster["loss_verdict"] == "match" and faster["loss_matches"] == N_RUNS
    assert faster["final_loss_difference"] == pytest.approx(0.0)
    same = _row(versions, "liger", OLD)
    assert same["throughput_ratio"] == pytest.approx(1.0, abs=1e-3) and not same["throughput_significant"]
    assert "not significant" in same["note"]
    assert [row["outcome"] for _, row in chosen_sets(versions).iterrows()] == [FASTER, NO_DIFFERENCE]


def test_the_summary_names_the_faster_set_whose_loss_matches_and_says_when_no_set_differs():
    analysis = _grid([OLD, "", NEW], speed={("liger", NEW): 1.10})
    lines = versions_verdicts(versions_table(analysis.table, analysis.swept), analysis.swept)
    faster = _row(versions_table(analysis.table, analysis.swept), "liger", NEW)
    interval = f"[{faster['throughput_ci_low']:.2f}, {faster['throughput_ci_high']:.2f}]"
    assert lines[0].startswith(
        f"Software set for arm liger: run {NEW}: it is ×1.10 {interval} the throughput of the installed packages at "
        "per_device_train_batch_size=8 (p "
    )
    assert lines[0].endswith("loss parity holds (4 of 4 final losses match).")
    assert lines[1] == (
        "Software set for arm baseline: no set differs from the installed packages in throughput beyond the noise "
        "(paired t-test at alpha 0.05, 2 comparison(s))."
    )
    summary = grid_report(analysis).sections["Summary"]
    assert escape(lines[0]) in summary and escape(lines[1]) in summary
    # computed once with the grid's analysis (exported as `versions`), and said on the console too
    assert analysis.version_verdicts == lines
    assert len(analysis.versions) == 4  # two sets against the installed packages, two arms
    assert grid_report(analysis).headline[-2:] == lines


def test_without_the_installed_packages_the_first_set_is_the_reference_and_a_faster_set_whose_loss_differs_is_not_run():
    analysis = _grid([NEW, OLD], speed={("liger", OLD): 1.10}, final_loss={OLD: 2.5})
    versions = versions_table(analysis.table, analysis.swept)
    assert set(versions["reference"]) == {NEW} and set(versions["software_set"]) == {OLD}
    changed = _row(versions, "liger", OLD)
    assert changed["throughput_significant"] and changed["loss_verdict"] == "differs"
    assert changed["final_loss_difference"] == pytest.approx(0.5) and changed["loss_matches"] == 0
    choice = chosen_sets(versions).set_index("arm").loc["liger"]
    assert choice["outcome"] == LOSS_DOES_NOT_MATCH and choice["run"] == NEW
    line = versions_verdicts(versions, analysis.swept)[0]
    assert line.startswith(f"Software set for arm liger: keep {NEW}: {OLD} is ×1.10 [")
    assert line.endswith("but loss parity does not hold (0 of 4 final losses match: differs).")


def test_where_every_set_that_differs_is_slower_the_reference_is_kept():
    analysis = _grid(["", NEW], speed={("liger", NEW): 0.8, ("baseline", NEW): 0.9})
    versions = versions_table(analysis.table, analysis.swept)
    assert _row(versions, "baseline", NEW)["throughput_ratio"] == pytest.approx(0.9, rel=1e-3)
    assert list(chosen_sets(versions)["outcome"]) == [SLOWER, SLOWER]
    line = versions_verdicts(versions, analysis.swept)[0]
    assert line.startswith(
        f"Software set for arm liger: keep the installed packages: every set that differs beyond the noise is slower "
        f"({NEW} is ×0.80 ["
    )


def test_each_point_of_the_other_axes_is_compared_and_the_summary_says_where_the_set_is_faster():
    analysis = _grid(["", NEW], speed={("liger", NEW, 8): 1.10, ("liger", NEW, 16): 0.95}, batches=(8, 16))
    versions = versions_table(analysis.table, analysis.swept)
    liger = versions[versions["arm"] == "liger"].set_index("per_device_train_batch_size")
    assert liger["throughput_ratio"].round(3).to_dict() == {8: 1.10, 16: 0.95}
    assert liger["throughput_significant"].tolist() == [True, True]
    choice = chosen_sets(versions).set_index("arm").loc["liger"]
    assert choice["outcome"] == FASTER and (choice["points"], choice["faster_at"], choice["slower_at"]) == (2, 1, 1)
    line = versions_verdicts(versions, analysis.swept)[0]
    assert "the throughput of the installed packages at per_device_train_batch_size=8 (p " in line
    assert line.endswith(f"; {NEW} is faster beyond the noise at 1 of 2 points, slower at 1.")


def test_loss_curves_judge_the_loss_where_the_steps_are_known():
    analysis = _grid(["", NEW], speed={("liger", NEW): 1.10})
    runs = analysis.table[["condition_id", "run_number", *axis_names()]]
    steps = runs.merge(pd.DataFrame({"step": range(1, 11)}), how="cross")
    # under the new set, liger's curve leaves the reference's from step 6 on
    drifts = (steps["software_set"] == NEW) & (steps["arm"] == "liger") & (steps["step"] > 5)
    steps["loss"] = 3.0 - 0.1 * steps["step"] + drifts * 0.5
    versions = versions_table(analysis.table, analysis.swept, steps=steps)
    diverged, kept = _row(versions, "liger", NEW), _row(versions, "baseline", NEW)
    assert diverged["loss_compared"] == LOSS_CURVES and diverged["loss_verdict"] == "diverged"
    assert diverged["loss_pairs"] == N_RUNS and diverged["loss_matches"] == 0
    assert kept["loss_verdict"] == "match" and kept["loss_matches"] == N_RUNS
    # the final loss's difference still comes from the results table
    assert diverged["final_loss_difference"] == pytest.approx(0.0)
    assert chosen_sets(versions).set_index("arm").loc["liger", "outcome"] == LOSS_DOES_NOT_MATCH
    assert "(0 of 4 loss curves match: diverged)" in versions_verdicts(versions, analysis.swept)[0]


def test_each_set_lists_the_releases_its_runs_imported():
    analysis = _grid(["", OLD, f"{NEW},transformers==5.17.0"], speed={})
    imported = imported_versions_table(analysis.table, analysis.swept)
    assert imported.values.tolist() == [
        ["", "installed packages", "none", "as installed", 8],
        [OLD, "liger-kernel", "0.8.2", "0.8.2", 8],
        [f"{NEW},transformers==5.17.0", "liger-kernel", "0.8.5", "0.8.5", 8],
        [f"{NEW},transformers==5.17.0", "transformers", "5.17.0", "5.17.0", 8],
    ]
    unrecorded = _grid(["", OLD], speed={}, imported=False)
    assert imported_versions_table(unrecorded.table, unrecorded.swept)["imported"].tolist() == [
        "as installed",
        "not recorded",
    ]


def test_the_report_renders_a_versions_tab_when_the_set_is_swept():
    analysis = _grid(["", NEW], speed={("liger", NEW): 1.10})
    report = grid_report(analysis)
    assert list(report.sections)[:2] == ["Summary", "Versions"]
    tab = report.sections["Versions"]
    assert "<b>installed packages</b>" in tab and "<h4>installed packages</h4>" in tab
    assert f"<h4>{NEW}</h4>" in tab and "What each set imported" in tab
    for column in ("throughput ×", "peak allocated memory ×", "peak reserved memory ×", "energy per token ×"):
        assert f"<th>{column}</th>" in tab
    assert "match (4 of 4 final loss)" in tab
    assert escape(versions_verdicts(versions_table(analysis.table, analysis.swept), analysis.swept)[0]) in tab
    assert "Versions" in report.to_html()


def test_no_versions_tab_or_summary_line_when_the_set_is_not_swept():
    experiment = ExperimentArgs(arm=["liger", "baseline"], per_device_train_batch_size=[8])
    planned = plan_runs(experiment, TrainingArgs(backend="plain_loop"), n_runs=3)
    metrics = {"tokens_per_second": 100.0, "final_loss": 2.0}
    results = [
        RunResult(r.condition_id, r.run_number, r.swept_axes, r.training_args, "ok", metrics=metrics) for r in planned
    ]
    analysis = analyze_grid(planned, results, {})
    assert versions_table(analysis.table, analysis.swept).empty
    assert imported_versions_table(analysis.table, analysis.swept).empty
    report = grid_report(analysis)
    assert "Versions" not in report.sections and "Software set" not in report.sections["Summary"]
    assert analysis.versions.empty and analysis.version_verdicts == []
