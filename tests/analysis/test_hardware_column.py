"""The results table says what each run trained on: a CPU run's num_gpus and world_size count processes, and its
`hardware` column says cpu."""

from finetune_bench.analysis.tables import results_table
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
