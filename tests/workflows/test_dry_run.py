"""`dry_run` plans and predicts without downloading or training anything; `skip_predicted_oom` records a sure
OOM without launching it."""

from pathlib import Path

from click.testing import CliRunner

from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.prediction import grid
from finetune_bench.results.record import PREDICTED_OOM
from finetune_bench.results.store import ResultStore
from finetune_bench.running.launch import run_or_reuse

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path, monkeypatch):
    from flytekit.clis.sdk_in_container.pyflyte import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FINETUNE_BENCH_EXPORT_DIR", str(tmp_path / "export"))
    args = ["run", "workflows/benchmark.py", "benchmarking_experiment", "--inputs-file", "inputs/llama1b_measure.yaml"]
    result = CliRunner().invoke(main, [*args, "--dry_run", "--gpu_kind", "H100", "--gpu_hour_price", "4"])
    assert result.exit_code == 0, result.output
    cache = tmp_path / "cache"
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*")), "a dry run downloads nothing"
    plan = (tmp_path / "export" / "plan.csv").read_text()
    assert "arm=baseline,per_device_train_batch_size=32,backend=trl_sft" in plan
    html = (tmp_path / "export" / "plan.html").read_text()
    assert "conditions: 16" in html and "GPU-hours" in html and "at 4 per GPU-hour" in html


def test_a_predicted_oom_is_recorded_without_launching(tmp_path, monkeypatch):
    training = TrainingArgs(model_name="random:llama-3.2-1b", device="cuda", max_seq_length=2048,
                            synthetic_min_words=2100, synthetic_max_words=2200, synthetic_num_examples=64)  # fmt: skip
    planned = plan_runs(ExperimentArgs(arm=["baseline"], per_device_train_batch_size=[32]), training, 1)
    estimate = grid.estimate_grid(planned, grid.target_gpu("H100"), skip_predicted_oom=True)
    (run,) = grid.with_predictions(planned, estimate, skip_predicted_oom=True)

    def launch(*_, **__):
        raise AssertionError("a predicted OOM must not be launched")

    monkeypatch.setattr("finetune_bench.running.launch.run_in_child", launch)
    store = ResultStore(str(tmp_path / "store"))
    result = run_or_reuse(run, store, tmp_path, tmp_path, tmp_path / "work", timeout_s=10)
    assert result.status == PREDICTED_OOM
    assert "predicted out of memory" in result.reason and "H100" in result.reason
    assert result.predicted_peak_reserved_bytes == run.predicted_peak_reserved_bytes
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir()), "a prediction is not stored"


def test_a_frontier_dry_run_predicts_each_search(tmp_path, monkeypatch):
    from flytekit.clis.sdk_in_container.pyflyte import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FINETUNE_BENCH_EXPORT_DIR", str(tmp_path / "export"))
    args = ["run", "workflows/frontier.py", "memory_frontier", "--inputs-file", "inputs/frontier_llama1b_4096.yaml"]
    result = CliRunner().invoke(main, [*args, "--dry_run", "--gpu_kind", "H200"])
    assert result.exit_code == 0, result.output
    cache = tmp_path / "cache"
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*")), "a dry run downloads nothing"
    import pandas as pd

    plan = pd.read_csv(tmp_path / "export" / "frontier_plan.csv").set_index(["arm", "dimension"])
    liger = plan.loc[("liger", "per_device_train_batch_size"), "predicted_frontier"]
    baseline = plan.loc[("baseline", "per_device_train_batch_size"), "predicted_frontier"]
    assert liger > 2 * baseline > 0
    assert plan.loc[("liger", "max_seq_length"), "verdict"].startswith("the cap fits")


def test_a_refused_run_is_an_error_neither_launched_nor_stored(tmp_path, monkeypatch):
    import dataclasses

    (run,) = plan_runs(ExperimentArgs(arm=["baseline"]), TrainingArgs(), 1)
    run = dataclasses.replace(run, refused="not launched: the dataset has 0 usable examples")

    def launch(*_, **__):
        raise AssertionError("a refused run must not be launched")

    monkeypatch.setattr("finetune_bench.running.launch.subprocess.Popen", launch)
    result = run_or_reuse(run, ResultStore(str(tmp_path / "store")), tmp_path, tmp_path, tmp_path / "work", 10)
    assert (result.status, result.reason) == ("error", run.refused)
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir()), "a refusal is not stored"
