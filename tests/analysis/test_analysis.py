"""Result records → tables → report, on hand-made records (no training)."""

import dataclasses
from html import escape

import pandas as pd
import pytest

from finetune_bench.analysis.grid import analyze_table
from finetune_bench.analysis.parity import held_out_parity
from finetune_bench.analysis.recommendation import largest_fitting_batch, recommendations
from finetune_bench.analysis.tables import arms_vs_baseline, condition_summary, results_table, steps_table
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.reporting.benchmark_report import CPU_WARNING, grid_report
from finetune_bench.results.record import RunResult

GIB = 1024**3
EXPERIMENT = ExperimentArgs(arm=["liger", "baseline"], per_device_train_batch_size=[8, 16])
SWEPT = ["arm", "per_device_train_batch_size"]


def fake_result(run, status="ok", device="cuda:0"):
    args = run.training_args
    metrics = {}
    if status == "ok":
        speed = 1000.0 * args.per_device_train_batch_size * (1.2 if (args.arm == "liger") else 1.0) + run.run_number
        memory = args.per_device_train_batch_size * (0.8 if (args.arm == "liger") else 1.0) * GIB
        metrics = {"tokens_per_second": speed, "peak_reserved_bytes": memory, "peak_allocated_bytes": 0.9 * memory}
    return RunResult(
        condition_id=run.condition_id,
        run_number=run.run_number,
        swept_axes=run.swept_axes,
        training_args=args,
        status=status,
        reason="" if status == "ok" else "out of memory at step 1: CUDA out of memory",
        error_tail="" if status == "ok" else "torch.OutOfMemoryError: CUDA out of memory",
        metrics=metrics,
        details={"device": device, "steps_completed": "5"},
    )


@pytest.fixture()
def grid():
    planned = plan_runs(EXPERIMENT, TrainingArgs(), n_runs=2)
    results = []
    for run in planned:
        args = run.training_args
        if not (args.arm == "liger") and args.per_device_train_batch_size == 16:
            results.append(fake_result(run, "oom"))
        elif (args.arm == "liger") and args.per_device_train_batch_size == 8 and run.run_number == 1:
            results.append(None)  # the task itself was lost
        else:
            results.append(fake_result(run))
    return planned, results


def test_every_planned_run_has_a_row_even_when_lost(grid):
    planned, results = grid
    table = results_table(planned, results)
    assert len(table) == len(planned) == 8
    assert sorted(table["status"]) == sorted(["ok"] * 5 + ["oom"] * 2 + ["lost"])
    assert {"arm", "per_device_train_batch_size", "run_number", "status", "tokens_per_second"} <= set(table)
    oom = table[table["status"] == "oom"]
    assert oom["tokens_per_second"].isna().all() and (oom["per_device_train_batch_size"] == 16).all()
    assert table.loc[table["status"] == "ok", "peak_reserved_gib"].max() == pytest.approx(16 * 0.8)


def test_a_float16_run_s_loss_scaling_and_weight_dtypes_are_columns_of_the_results(grid):
    planned, results = grid
    mixed = {"loss_scale": "32768.0", "loss_scale_skipped_steps": "2", "trainable_dtype": "float32", "frozen_dtype": ""}
    results[0] = dataclasses.replace(results[0], details={**results[0].details, **mixed})
    table = results_table(planned, results)
    assert table.loc[0, "loss_scale"] == 32768.0 and table.loc[0, "loss_scale_skipped_steps"] == 2
    assert table.loc[0, "trainable_dtype"] == "float32" and table.loc[0, "frozen_dtype"] == ""
    others = table.iloc[1:]  # no float16: nothing to say
    assert others["loss_scale"].isna().all() and others["loss_scale_skipped_steps"].isna().all()
    assert (others["trainable_dtype"].fillna("") == "").all()  # a lost run has no row values at all


def test_comparison_uses_medians_and_keeps_failed_conditions(grid):
    table = results_table(*grid)
    comparison = arms_vs_baseline(condition_summary(table, SWEPT), SWEPT).set_index("per_device_train_batch_size")
    assert comparison.loc[8, "throughput_ratio"] == pytest.approx(9600 / 8000.5)  # liger run 1 lost: one run left
    assert comparison.loc[8, "peak_reserved_ratio"] == pytest.approx(0.8)
    assert pd.isna(comparison.loc[16, "throughput_ratio"])
    assert comparison.loc[16, "baseline_runs"] == "oom×2"
    assert (comparison["arm"] == "liger").all()
    summary = condition_summary(table, SWEPT).set_index(SWEPT)
    assert summary.loc[("baseline", 8), "tokens_per_second_spread"] == pytest.approx(1 / 8000.5)
    assert summary.loc[("liger", 8), "tokens_per_second_spread"] == 0  # one ok run left
    assert pd.isna(summary.loc[("baseline", 16), "tokens_per_second_spread"])  # no ok run


def test_report_has_every_tab_marks_failures_and_says_where_it_ran(grid):
    table = results_table(*grid)
    environment = {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_memory_bytes": str(80 * GIB), "torch": "2.11"}
    report = grid_report(analyze_table(table, SWEPT, environment))
    assert list(report.sections) == [
        "Summary", "Throughput", "Memory", "Speedup", "Loss curves", "Step times", "Conditions", "Runs",
    ]  # fmt: skip
    html = report.to_html()
    assert "NVIDIA H100 80GB HBM3" in html
    assert escape(CPU_WARNING) not in html
    summary = report.sections["Summary"]
    assert "liger vs baseline: throughput ×1.20" in summary
    assert "largest batch that fit 16 vs 8" in summary
    assert "1 condition(s) lack an ok run on one side" in summary
    assert report.sections["Memory"].count("data:image/png;base64,") == 2  # allocated and reserved
    assert report.sections["Speedup"].count("data:image/png;base64,") == 1  # the heatmap
    assert "torch.OutOfMemoryError" in report.sections["Conditions"]
    assert report.sections["Conditions"].count("<h3>") == 3  # 2 OOM runs and the lost one


def test_what_fits_and_the_recommendation(grid):
    table = results_table(*grid)
    fitting = largest_fitting_batch(table, SWEPT).set_index("arm")
    assert fitting.loc["liger", "largest_ok_batch"] == 16 and pd.isna(fitting.loc["liger", "smallest_oom_batch"])
    assert fitting.loc["baseline", "largest_ok_batch"] == 8 and fitting.loc["baseline", "smallest_oom_batch"] == 16
    summary = condition_summary(table, SWEPT)
    recommended = recommendations(summary, SWEPT, capacity_gib=80.0).set_index("arm")
    # liger batch 8 lost a run: only conditions whose runs all finished are recommended
    assert recommended.loc["liger", "configuration"] == "per_device_train_batch_size=16"
    assert recommended.loc["liger", "headroom_gib"] == pytest.approx(80 - 16 * 0.8)
    assert recommended.loc["baseline", "configuration"] == "per_device_train_batch_size=8"
    assert recommended.loc["baseline", "headroom_share"] == "90%"
    assert recommendations(summary, SWEPT, capacity_gib=None)["headroom_share"].str.startswith("unknown").all()


def test_a_repeated_baseline_shows_the_noise_floor_in_the_summary():
    experiment = ExperimentArgs(arm=["liger", "baseline", "baseline_repeat"], per_device_train_batch_size=[8])
    planned = plan_runs(experiment, TrainingArgs(), n_runs=3)
    table = results_table(planned, [fake_result(run) for run in planned])
    summary = grid_report(analyze_table(table, SWEPT, {})).sections["Summary"]
    assert "baseline_repeat vs baseline: throughput ×1.00" in summary
    assert "noise floor" in summary and "A/A" in summary


def test_cpu_runs_carry_the_warning():
    planned = plan_runs(EXPERIMENT, TrainingArgs(), n_runs=1)
    table = results_table(planned, [fake_result(run, device="cpu") for run in planned])
    assert escape(CPU_WARNING) in grid_report(analyze_table(table, SWEPT, {})).to_html()


def test_steps_table_tags_each_step_with_its_run(tmp_path):
    planned = plan_runs(EXPERIMENT, TrainingArgs(), n_runs=1)[:2]
    results, files = [], {}
    for i, run in enumerate(planned):
        path = tmp_path / f"{i}.csv"
        pd.DataFrame({"step": [1, 2], "loss": [1.0 + i, 0.5 + i]}).to_csv(path, index=False)
        results.append(fake_result(run))
        files[(run.condition_id, run.run_number)] = str(path)
    steps = steps_table(results + [None], files)
    assert len(steps) == 4
    assert steps.groupby("condition_id")["loss"].first().to_dict() == {
        planned[0].condition_id: 1.0,
        planned[1].condition_id: 2.0,
    }
    assert set(steps["per_device_train_batch_size"]) == {8, 16}


def test_extra_swept_axis_gets_its_own_panel():
    experiment = dataclasses.replace(EXPERIMENT, max_seq_length=[128, 256])
    planned = plan_runs(experiment, TrainingArgs(), n_runs=1)
    table = results_table(planned, [fake_result(run) for run in planned])
    report = grid_report(analyze_table(table, [*SWEPT, "max_seq_length"], {}))
    comparison = arms_vs_baseline(condition_summary(table, [*SWEPT, "max_seq_length"]), [*SWEPT, "max_seq_length"])
    assert len(comparison) == 4
    assert "over 4 condition(s)" in report.sections["Summary"]
    assert report.sections["Throughput"].count("data:image/png;base64,") == 1


def test_held_out_losses_pair_each_arm_run_with_its_baseline_and_reach_the_report(grid):
    planned, results = grid
    evaluated = []
    for result in results:
        if result is not None and result.status == "ok":
            liger = result.training_args.arm == "liger"
            # liger run 0 at batch 8 is off by 0.2 (outside the tolerance); the others agree to 1e-3
            off = (
                0.2 if liger and result.run_number == 0 and result.training_args.per_device_train_batch_size == 8 else 0
            )
            final = 2.0 + 0.001 * liger + off + 0.01 * result.run_number
            result = dataclasses.replace(
                result, metrics={**result.metrics, "initial_eval_loss": 6.9, "final_eval_loss": final}
            )
        evaluated.append(result)
    table = results_table(planned, evaluated)
    held_out = held_out_parity(table, SWEPT)
    # batch 8: runs 0 and 1 of the baseline, liger run 1 lost → one pair; batch 16: the baseline ran out of memory
    assert held_out[["per_device_train_batch_size", "run_number", "arm"]].values.tolist() == [[8, 0, "liger"]]
    assert held_out["difference"].iloc[0] == pytest.approx(0.201)
    assert held_out["verdict"].iloc[0] == "differs"
    report = grid_report(analyze_table(table, SWEPT, {}))
    assert "Held-out loss: 0 of 1 arm/baseline pair match" in report.sections["Summary"]
    assert "+0.2010" in report.sections["Summary"]
    assert "<h3>Held-out loss</h3>" in report.sections["Loss curves"]
    assert "final_eval_loss" in report.sections["Loss curves"]


def test_no_held_out_section_without_an_evaluation(grid):
    report = grid_report(analyze_table(results_table(*grid), SWEPT, {}))
    assert "Held-out" not in report.to_html()
