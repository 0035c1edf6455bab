"""The smoke workflow end to end (the embedded default), the download cache, and serialization."""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from finetune_bench.spec import ExperimentArgs, TrainingArgs

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def smoke_outputs(tmp_path_factory):
    """Run the workflow's embedded default the way a user does, through `pyflyte run`."""
    export = tmp_path_factory.mktemp("export")
    env = dict(
        os.environ, FINETUNE_BENCH_EXPORT_DIR=str(export), FLYTECTL_CONFIG=str(PROJECT_ROOT / "flyte-local.yaml")
    )
    pyflyte = Path(sys.executable).parent / "pyflyte"
    completed = subprocess.run(
        [str(pyflyte), "run", "workflows/benchmark.py", "benchmarking_experiment"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    results = pd.read_csv(export / "results.csv")
    steps = pd.read_csv(export / "steps.csv")
    return results, steps, export / "report.html", export


def test_smoke_yaml_is_the_embedded_default():
    inputs = yaml.safe_load((PROJECT_ROOT / "inputs" / "smoke.yaml").read_text())
    assert ExperimentArgs(**inputs["experiment_args"]) == ExperimentArgs()
    assert TrainingArgs(**inputs["training_args"]) == TrainingArgs()
    assert inputs["n_runs"] == 1


def test_smoke_workflow_runs_both_arms(smoke_outputs):
    results, _, _, _ = smoke_outputs
    experiment = ExperimentArgs()
    assert len(results) == len(experiment.use_liger) * len(experiment.per_device_train_batch_size)
    assert results["condition_id"].is_unique
    assert set(results["status"]) == {"ok"}, results[["condition_id", "reason", "error_tail"]].to_string()
    assert set(results["use_liger"]) == {True, False}
    assert set(results["per_device_train_batch_size"]) == set(experiment.per_device_train_batch_size)
    assert (results["tokens_per_second"] > 0).all()
    assert (results["device"] == "cpu").all()
    liger = results[results["use_liger"]]
    assert liger["liger_patches"].str.contains("LigerRMSNorm").all()
    assert results.loc[~results["use_liger"], "liger_patches"].isna().all()


def test_smoke_arms_agree_on_the_loss(smoke_outputs):
    results, _, _, _ = smoke_outputs
    pairs = results.pivot(index="per_device_train_batch_size", columns="use_liger", values="final_loss")
    pd.testing.assert_series_equal(pairs[True], pairs[False], check_names=False, rtol=1e-4)


def test_smoke_steps_belong_to_their_run(smoke_outputs):
    _, steps, _, _ = smoke_outputs
    args = TrainingArgs()
    per_run = steps.groupby("condition_id")
    assert per_run.ngroups == 4
    for _, frame in per_run:
        assert len(frame) == args.max_steps
        batch = frame["per_device_train_batch_size"].iloc[0]
        assert (frame["padded_tokens"] == batch * args.max_seq_length).all()


def test_smoke_report(smoke_outputs):
    _, _, report, _ = smoke_outputs
    text = report.read_text()
    assert text.count("data:image/png;base64,") >= 2
    assert "These runs happened on a CPU" in text
    assert "Liger vs baseline over 2 condition(s)" in text


def test_cached_download_survives_the_sandbox(tmp_path):
    from tasks import data

    calls = []
    real = data.sources.prepare_model

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    with mock.patch.object(data.sources, "prepare_model", counting):
        first = data.download_model(model_name="random:tiny-mistral")
        second = data.download_model(model_name="random:tiny-mistral")
    assert len(calls) == 1, "the second call should be served by the local cache"
    assert Path(first.path) == Path(second.path)
    # What the first run left in its sandbox is gone; the cached path must still hold the model.
    for sandbox in Path(os.environ["TMPDIR"]).glob("flyte*"):
        shutil.rmtree(sandbox, ignore_errors=True)
    assert (Path(second.path) / "config.json").is_file()


def test_package_serializes_every_workflow_without_docker(tmp_path, monkeypatch):
    from flytekit.clis.sdk_in_container import pyflyte

    monkeypatch.chdir(PROJECT_ROOT)
    monkeypatch.setenv("FLYTECTL_CONFIG", str(PROJECT_ROOT / "flyte-local.yaml"))
    out = tmp_path / "package.tgz"
    with mock.patch("flytekit.image_spec.image_spec.ImageBuildEngine.build"):
        result = CliRunner().invoke(
            pyflyte.main,
            ["--pkgs", "workflows", "package", "--image", "ghcr.io/example/finetune-bench:test", "-f", "-o", str(out)],
        )
    assert result.exit_code == 0, result.output
    assert "workflows.benchmark.benchmarking_experiment" in result.output
    assert "tasks.train.train_condition" in result.output
    assert out.stat().st_size > 0


def test_dynamic_body_compiles_to_a_map_over_every_run():
    from flytekit.configuration import ImageConfig, SerializationSettings
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.types.directory import FlyteDirectory

    from finetune_bench.plan import plan_runs
    from workflows.benchmark import run_benchmark

    planned = plan_runs(ExperimentArgs(), TrainingArgs(), 2)
    settings = SerializationSettings(image_config=ImageConfig.auto_default_image())
    ctx = FlyteContextManager.current_context().with_serialization_settings(settings)
    with FlyteContextManager.with_context(ctx) as ctx:
        spec = run_benchmark.compile_into_workflow(
            ctx,
            run_benchmark._task_function,
            planned=planned,
            dataset_dir=FlyteDirectory("s3://bucket/dataset"),
            model_dir=FlyteDirectory("s3://bucket/model"),
            concurrency=3,
            min_success_ratio=0.25,
            condition_timeout_s=60,
            results_store="s3://bucket/results",
            force_fresh=False,
        )
    (node,) = spec.nodes
    array = node.array_node.to_flyte_idl()
    assert array.parallelism == 3
    assert array.min_success_ratio == pytest.approx(0.25)
    bound = {"dataset_dir", "model_dir", "condition_timeout_s", "results_store", "force_fresh"}
    assert set(array.bound_inputs) == bound
    assert [t.id.name for t in spec.tasks][0].startswith("tasks.train.map_train_condition")
