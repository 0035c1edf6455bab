"""The results table says what each run trained on: a CPU run's num_gpus and world_size count processes, and its
`hardware` column says cpu; the steps and the comparison (steps.csv, comparison.csv) carry the same column."""

import pandas as pd

from finetune_bench.analysis.stats import paired_comparison
from finetune_bench.analysis.tables import results_table, steps_table
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.results.record import RunResult


def test_the_results_table_labels_a_cpu_run_and_names_a_gpu():
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline", "compile"]), TrainingArgs(backend="plain_loop"), 1)
    cpu, gpu, lost = (
        next(run for run in planned if run.training_args.arm == arm) for arm in ("liger", "baseline", "compile")
    )
    on_cpu = {"details": {"device": "cpu"}}
    on_gpu = {"details": {"device": "cuda:0"}, "environment": {"gpu_name": "NVIDIA H100 80GB HBM3"}}
    results = [
        RunResult(run.condition_id, run.run_number, run.swept_axes, run.training_args, "ok", **where)
        for run, where in ((cpu, on_cpu), (gpu, on_gpu))
    ]
    table = results_table(planned, results).set_index("condition_id")
    assert table.loc[cpu.condition_id, "hardware"] == "cpu" and table.loc[cpu.condition_id, "num_gpus"] == 1
    assert table.loc[gpu.condition_id, "hardware"] == "gpu: NVIDIA H100 80GB HBM3"
    assert table.loc[lost.condition_id, "hardware"] == ""  # lost: nothing said where it ran


def test_the_steps_and_the_comparison_say_what_their_runs_trained_on(tmp_path):
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"]), TrainingArgs(backend="plain_loop"), 2)
    on_gpu = {"details": {"device": "cuda:0"}, "environment": {"gpu_name": "NVIDIA H100 80GB HBM3"}}
    results, files = [], {}
    for run in planned:
        metrics = {"tokens_per_second": 100.0 if run.training_args.arm == "baseline" else 130.0}
        results.append(
            RunResult(run.condition_id, run.run_number, run.swept_axes, run.training_args, "ok", metrics, **on_gpu)
        )
        path = tmp_path / f"{run.condition_id}-{run.run_number}.csv"
        pd.DataFrame({"step": [1, 2], "loss": [2.0, 1.9]}).to_csv(path, index=False)
        files[(run.condition_id, run.run_number)] = str(path)
    steps = steps_table(results, files)
    assert len(steps) == 8 and set(steps["hardware"]) == {"gpu: NVIDIA H100 80GB HBM3"}
    comparison = paired_comparison(results_table(planned, results), ["arm"])
    assert comparison.set_index("arm").loc["liger", "hardware"] == "gpu: NVIDIA H100 80GB HBM3"
