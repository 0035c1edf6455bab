import dataclasses

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.analysis.parity import held_out_parity
from finetune_bench.analysis.stats import paired_comparison
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


def _multi_gpu_grid(one_gpu_tps: dict[str, float], two_gpu_tps: dict[str, float]):
    """liger and baseline on 1 and 2 GPUs (DDP), one run each, with the given tokens/s per arm."""
    from finetune_bench.results.record import RankSummary

    planned = plan_runs(
        ExperimentArgs(arm=["liger", "baseline"], num_gpus=[1, 2]),
        TrainingArgs(parallelism="ddp", backend="plain_loop", per_device_train_batch_size=2),
        1,
    )
    results = []
    for run in planned:
        arm, gpus = run.training_args.arm, run.training_args.num_gpus
        tps = (one_gpu_tps if gpus == 1 else two_gpu_tps)[arm]
        metrics = {"tokens_per_second": tps, "peak_reserved_bytes": 10 * 2**30}
        ranks = []
        if gpus == 2:
            metrics.update(tokens_per_second_per_gpu=tps / 2, peak_reserved_bytes_spread=2**30)
            ranks = [
                RankSummary(r, 0, r, "h", "ok", tokens_per_second=tps / 2, peak_reserved_bytes=10 * 2**30)
                for r in (0, 1)
            ]
        results.append(
            RunResult(
                run.condition_id, run.run_number, run.swept_axes, run.training_args, "ok", metrics=metrics, ranks=ranks
            )
        )
    return planned, results


def test_scaling_sets_each_multi_gpu_condition_against_the_same_settings_on_one_gpu():
    planned, results = _multi_gpu_grid({"liger": 100.0, "baseline": 80.0}, {"liger": 190.0, "baseline": 120.0})
    analysis = analyze_grid(planned, results, {})
    table = analysis.table.set_index("condition_id")
    assert table.loc["arm=liger,num_gpus=2", "world_size"] == 2
    assert table.loc["arm=liger,num_gpus=2", "global_batch_size"] == 4
    assert table.loc["arm=liger,num_gpus=1", "tokens_per_second_per_gpu"] == 100.0  # one GPU: its own tokens/s
    scaling = analysis.scaling.set_index(["arm", "num_gpus"])
    assert scaling.loc[("liger", 2), "scaling_efficiency"] == 190.0 / (2 * 100.0)
    assert scaling.loc[("baseline", 2), "scaling_efficiency"] == 120.0 / (2 * 80.0)  # each arm against its own
    assert scaling.loc[("liger", 1), "scaling_efficiency"] == 1.0
    assert scaling.loc[("liger", 2), "peak_reserved_spread_gib"] == 1.0
    assert list(analysis.ranks["rank"]) == [0, 1, 0, 1]
    report = grid_report(analysis).sections
    assert "Scaling" in report and "scaling_efficiency" in report["Scaling"]
    assert "on 1–2 GPUs" in report["Summary"]


def test_one_gpu_grids_have_no_scaling_view_and_say_one_gpu():
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"]), TrainingArgs(), 1)
    results = [
        RunResult(r.condition_id, r.run_number, r.swept_axes, r.training_args, "ok", metrics={"tokens_per_second": 9.0})
        for r in planned
    ]
    analysis = analyze_grid(planned, results, {})
    assert analysis.scaling.empty and analysis.ranks.empty
    report = grid_report(analysis).sections
    assert "Scaling" not in report and "over 1 condition(s) on 1 GPU." in report["Summary"]


def run_identity(run):
    return run.condition_id, run.run_number, run.swept_axes, run.training_args


def test_a_cpu_grid_says_it_ran_on_the_cpu_not_on_one_gpu():
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"]), TrainingArgs(), 1)
    results = [
        RunResult(*run_identity(r), "ok", metrics={"tokens_per_second": 9.0}, details={"device": "cpu"})
        for r in planned
    ]
    (verdict,) = analyze_grid(planned, results, {}).verdicts
    assert verdict.startswith("liger vs baseline: throughput ×1.00") and "over 1 condition(s) on the CPU." in verdict


def test_a_multi_gpu_condition_without_its_one_gpu_twin_has_no_efficiency():
    planned, results = _multi_gpu_grid({"liger": 100.0, "baseline": 80.0}, {"liger": 190.0, "baseline": 120.0})
    keep = [i for i, r in enumerate(planned) if r.training_args.num_gpus == 2]
    analysis = analyze_grid([planned[i] for i in keep], [results[i] for i in keep], {})
    assert analysis.scaling["scaling_efficiency"].isna().all()
    assert list(analysis.scaling["tokens_per_second"]) == [190.0, 120.0]


def test_the_paired_comparison_and_held_out_parity_are_computed_once_for_the_report_and_the_export():
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"]), TrainingArgs(), 3)
    speed = {"liger": 12.0, "baseline": 10.0}
    results = [
        RunResult(
            r.condition_id,
            r.run_number,
            r.swept_axes,
            r.training_args,
            "ok",
            metrics={"tokens_per_second": speed[r.training_args.arm] + r.run_number, "peak_reserved_gib": 1.0},
        )
        for r in planned
    ]
    analysis = analyze_grid(planned, results, {}, alpha=0.01)
    assert analysis.alpha == 0.01
    assert analysis.paired.equals(paired_comparison(analysis.table, analysis.swept, 0.01))
    assert analysis.held_out.equals(held_out_parity(analysis.table, analysis.swept))
    (row,) = analysis.paired.to_dict("records")
    assert row["arm"] == "liger" and row["pairs"] == 3
    assert "alpha 0.01" in grid_report(analysis).sections["Summary"]


def test_a_switchback_arm_outside_float16_says_it_pays_for_casts_and_in_float16_does_not():
    def summary(dtype: str) -> tuple[dict[str, str], str]:
        training = TrainingArgs(device="cuda", dtype=dtype)  # float16: mixed precision, planned as any dtype
        planned = plan_runs(ExperimentArgs(arm=["switchback", "liger", "baseline"]), training, 1)
        tps = {"arm=switchback": 80.0, "arm=liger": 120.0, "arm=baseline": 100.0}
        results = [
            RunResult(*run_identity(r), "ok", metrics={"tokens_per_second": tps[r.condition_id]},
                      details={"device": "cuda:0", "dtype": dtype})
            for r in planned
        ]  # fmt: skip
        analysis = analyze_grid(planned, results, {})
        return {line.split(" ")[0]: line for line in analysis.verdicts}, grid_report(analysis).sections["Summary"]

    verdicts, rendered = summary("bfloat16")
    switchback, liger = verdicts["switchback"], verdicts["liger"]
    assert switchback.startswith("switchback vs baseline: throughput ×0.80")
    assert switchback.endswith(
        " SwitchBack in bfloat16 pays for casts: its int8 kernels are built for float16 and write float16, so each "
        "SwitchBack layer's output is cast to bfloat16 and its gradients through float16 and back; the throughput "
        "above includes those casts (docs/measurements.md, the SwitchBack study)."
    )
    assert "SwitchBack in bfloat16 pays for casts" in rendered  # stated by the analysis, rendered as it is
    assert "casts" not in liger, "the note is the SwitchBack arm's alone"
    verdicts, _ = summary("float16")
    assert "casts" not in verdicts["switchback"], "in float16 SwitchBack runs as it is built to"
