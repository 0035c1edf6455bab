"""The smoke workflow end to end (the embedded default), the download cache, and serialization."""

import html
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, smoke_experiment
from tests.workflows import browser

PROJECT_ROOT = Path(__file__).resolve().parents[2]


# The smoke inputs (the embedded default) with 2 steps per run instead of 4: the liger runs spend seconds per step
# in the Triton interpreter. (The embedded default itself runs, with no inputs given, in
# tests/running/test_faults_resume.py; `make demo` runs inputs/smoke.yaml.)
SMOKE_STEPS = 2


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """Run the smoke inputs the way a user does, through `pyflyte run --inputs-file`, as `make demo` runs it: the
    finished process (its console) and the export directory."""
    export = tmp_path_factory.mktemp("export")
    inputs = yaml.safe_load((PROJECT_ROOT / "inputs" / "smoke.yaml").read_text())
    inputs["training_args"]["max_steps"] = SMOKE_STEPS
    inputs_file = tmp_path_factory.mktemp("inputs") / "smoke.yaml"
    inputs_file.write_text(yaml.safe_dump(inputs))
    # W&B off (tests/integrations/test_wandb_logging.py is where its logging is checked): no W&B service to start
    env = dict(
        os.environ,
        FINETUNE_BENCH_EXPORT_DIR=str(export),
        FLYTECTL_CONFIG=str(PROJECT_ROOT / "flyte-local.yaml"),
        WANDB_MODE="disabled",
    )
    pyflyte = Path(sys.executable).parent / "pyflyte"
    completed = subprocess.run(
        [str(pyflyte), "run", "workflows/benchmark.py", "benchmarking_experiment", "--inputs-file", str(inputs_file)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed, export


@pytest.fixture(scope="module")
def smoke_outputs(smoke_run):
    _, export = smoke_run
    results = pd.read_csv(export / "results.csv")
    steps = pd.read_csv(export / "steps.csv")
    return results, steps, export / "report.html", export


# A training run's progress on the console (a dataset written, a progress bar): not what the limit below counts.
PROGRESS = re.compile(r"\d+%\||\bit/s\b|examples/s|^Saving the dataset|^Map\b|^Generating\b")
# The most lines the demo's console may have: the plan (with its words explained), a line per run as it ends (4), then
# how it ended (each arm on the user's whole fine-tune at each of the grid's two batch sizes, then on what was
# measured) and where.
MAX_CONSOLE_LINES = 21


def test_the_demo_console_says_what_a_user_needs_in_few_lines(smoke_run):
    completed, export = smoke_run
    console = (completed.stdout + completed.stderr).replace("\r", "\n")
    lines = [line for line in console.splitlines() if line.strip()]
    assert not [line for line in lines if PROGRESS.search(line)], "progress bars on a quiet console"
    assert len(lines) <= MAX_CONSOLE_LINES, "\n".join(lines)
    for noise in ("Warning", "Traceback", "DefaultNamedTupleOutput", "rows x", "Empty DataFrame", "/tmp/flyte"):
        assert noise not in console, noise
    ended = [line for line in lines if re.match(r"arm=\S+ run 0: ok, [\d,.]+ tokens/s, [\d,.]+ s, stored in ", line)]
    assert len(ended) == 4, "one line per run as it ends"
    assert lines[-6].startswith("4 runs of 4 conditions: 4 ok") and "(on a CPU: the timings say nothing" in lines[-6]
    for line, batch in zip(lines[-5:-3], (1, 2), strict=True):  # the projection leads, the measured ratio beside it
        assert line.startswith("liger: your fine-tune (1 epoch") and f"at per_device_train_batch_size {batch}" in line
        # projected with the measured ratios beside it, or why not (these runs time 2 steps: no step-time line)
        assert ("(projected); steady state ×" in line and "(as measured)" in line) or "is not projected: " in line
    assert lines[-3].startswith("liger vs baseline: throughput ×")
    assert lines[-2:] == [f"report: {export.resolve() / 'report.html'}", f"results: {export.resolve() / 'results.csv'}"]
    assert set(pd.read_csv(export / "results.csv")["hardware"]) == {"cpu"}
    # the report and environment.json name the inputs file the run was given
    inputs_file = completed.args[completed.args.index("--inputs-file") + 1]
    assert f"<li>inputs file: {html.escape(inputs_file)}</li>" in (export / "report.html").read_text()
    assert json.loads((export / "environment.json").read_text())["environment"]["inputs_file"] == inputs_file


def test_smoke_yaml_is_the_embedded_default():
    inputs = yaml.safe_load((PROJECT_ROOT / "inputs" / "smoke.yaml").read_text())
    assert ExperimentArgs(**inputs["experiment_args"]) == smoke_experiment()
    assert TrainingArgs(**inputs["training_args"]) == TrainingArgs()
    assert inputs["n_runs"] == 1


def test_smoke_workflow_runs_both_arms(smoke_outputs):
    results, _, _, _ = smoke_outputs
    experiment = smoke_experiment()
    assert len(results) == len(experiment.arm) * len(experiment.per_device_train_batch_size)
    assert results["condition_id"].is_unique
    assert set(results["status"]) == {"ok"}, results[["condition_id", "reason", "error_tail"]].to_string()
    assert set(results["arm"]) == {"liger", "baseline"}
    assert set(results["per_device_train_batch_size"]) == set(experiment.per_device_train_batch_size)
    assert (results["tokens_per_second"] > 0).all()
    assert (results["device"] == "cpu").all()
    liger = results[results["arm"] == "liger"]
    assert liger["liger_patches"].str.contains("LigerRMSNorm").all()
    assert results.loc[results["arm"] == "baseline", "liger_patches"].isna().all()


def test_smoke_arms_agree_on_the_loss(smoke_outputs):
    results, _, _, _ = smoke_outputs
    pairs = results.pivot(index="per_device_train_batch_size", columns="arm", values="final_loss")
    pd.testing.assert_series_equal(pairs["liger"], pairs["baseline"], check_names=False, rtol=1e-4)


def test_smoke_steps_belong_to_their_run(smoke_outputs):
    _, steps, _, _ = smoke_outputs
    args = TrainingArgs()
    per_run = steps.groupby("condition_id")
    assert per_run.ngroups == 4
    for _, frame in per_run:
        assert len(frame) == SMOKE_STEPS
        batch = frame["per_device_train_batch_size"].iloc[0]
        assert (frame["padded_tokens"] == batch * args.max_seq_length).all()


def test_smoke_report(smoke_outputs):
    _, _, report, _ = smoke_outputs
    text = report.read_text()
    # throughput, memory (host RSS on a CPU), speedup heatmap, loss curves, step times, where the wall time went;
    # no MFU on a CPU
    assert text.count("data:image/png;base64,") == 6
    assert "Where the wall time went" in text
    assert "These runs happened on a CPU" in text
    assert "liger vs baseline: throughput ×" in text and "over 2 condition(s)" in text


def test_smoke_outputs_as_parquet_and_csv(smoke_outputs):
    results, steps, _, export = smoke_outputs
    for name, frame in (("results", results), ("steps", steps)):
        parquet = pd.read_parquet(export / f"{name}.parquet")
        assert list(parquet.columns) == list(frame.columns) and len(parquet) == len(frame)
    assert parquet["loss"].tolist() == pytest.approx(steps["loss"].tolist())
    # the numbers the report's Summary states: liger against the baseline at each batch size, one row each
    comparison = pd.read_csv(export / "comparison.csv")
    assert set(comparison["arm"]) == {"liger"} and len(comparison) == results["per_device_train_batch_size"].nunique()


# Figures the smoke report must show, each rendered by a real browser.
SMOKE_FIGURES = {
    "throughput by batch size",
    "peak memory by batch size",
    "throughput ratio heatmap",
    "loss curves",
    "step time distribution",
}


@pytest.mark.skipif(
    browser.CHROMIUM is None and not os.environ.get("CI"), reason="needs Debian's chromium (apt-get install chromium)"
)
def test_the_report_renders_in_a_real_browser(smoke_outputs, tmp_path):
    """Headless Chromium opens the smoke run's HTML report and its Flyte Deck: every figure decodes to a
    non-blank image of a sensible size, no script error, and a screenshot shows the page."""
    _, _, report, _ = smoke_outputs
    shots = Path(os.environ.get("FINETUNE_BENCH_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page = browser.inspect_page(report, tmp_path)
    assert page["errors"] == []
    # what was measured, on the first screen as a reader sees it (laid out, not hidden)
    header = page["header"]
    assert header is not None and 0 <= header["top"] < 900 and header["height"] > 0, header
    # folded to one line (the hardware, the model), the list one click away
    assert header["text"].startswith("What was measured: CPU"), header["text"]
    images = page["images"]
    assert len(images) == report.read_text().count("<img ")
    assert SMOKE_FIGURES <= {image["alt"] for image in images}
    for image in images:
        assert image["complete"] and "error" not in image, image
        assert image["natural_width"] >= 400 and image["natural_height"] >= 200, image
        assert image["shown_width"] > 0, image  # laid out on the page, not collapsed
        assert image["distinct_colours"] >= 20 and image["ink_fraction"] > 0.01, image  # not blank
    screenshot = browser.screenshot(report, shots / "report.png")
    from PIL import Image

    with Image.open(screenshot) as picture:
        assert picture.size[0] == 1400
        colours = picture.convert("RGB").resize((140, 900)).getcolors(maxcolors=1 << 16)
        assert colours is not None and len(colours) > 50  # text, tables and figures, not a blank page

    # The Deck the Flyte UI shows: flytekit's page with one tab per section, written into the run's sandbox.
    decks = [p for p in Path(tempfile.gettempdir()).rglob("deck.html") if "Step times" in p.read_text()]
    assert decks, "the analysis task wrote no Deck"
    deck = max(decks, key=lambda p: p.stat().st_mtime)
    for name in ("Summary", "Throughput", "Memory", "Speedup", "Loss curves", "Step times", "Conditions"):
        assert f">{name}<" in deck.read_text()
    page = browser.inspect_page(deck, tmp_path)
    assert page["errors"] == []
    assert SMOKE_FIGURES <= {image["alt"] for image in page["images"]}
    for image in page["images"]:  # tabs other than the first are hidden: decoded, not laid out
        assert image["complete"] and image["natural_width"] >= 400 and image["distinct_colours"] >= 20, image
    browser.screenshot(deck, shots / "deck.png", height=2000)


def test_cached_download_survives_the_sandbox(tmp_path):
    from tasks import data

    calls = []
    real = data.prepare_model

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    with mock.patch.object(data, "prepare_model", counting):
        first = data.download_model(model_name="random:tiny-mistral")
        second = data.download_model(model_name="random:tiny-mistral")
    assert len(calls) == 1, "the second call should be served by the local cache"
    assert Path(first.path) == Path(second.path)
    # What the first run left in its sandbox is gone; the cached path must still hold the model. (The sandboxes are
    # this process's flytekit's, made at its import: moved out of the way and back, not deleted, so that the tests
    # after this one in this process still have them.)
    sandboxes = list(Path(os.environ["TMPDIR"]).glob("flyte*"))
    assert sandboxes
    away = tmp_path / "sandboxes-gone"
    away.mkdir()
    try:
        for sandbox in sandboxes:
            sandbox.rename(away / sandbox.name)
        assert (Path(second.path) / "config.json").is_file()
    finally:
        for sandbox in sandboxes:
            (away / sandbox.name).rename(sandbox)


def test_package_serializes_every_workflow_without_docker_and_without_a_local_path(tmp_path, monkeypatch):
    """Every workflow registers (no Docker), and what is registered holds no local path: not the export or cache
    directory, not the flytectl config, not the project's checkout; a pod finds its own (the results store and the
    cache default inside the pod)."""
    import tarfile

    from flytekit.clis.sdk_in_container import pyflyte

    local = {
        "FINETUNE_BENCH_EXPORT_DIR": str(tmp_path / "my-export-dir"),
        "FINETUNE_BENCH_CACHE_DIR": str(tmp_path / "my-cache-dir"),
        "FLYTECTL_CONFIG": str(PROJECT_ROOT / "flyte-local.yaml"),
    }
    for name, value in local.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(PROJECT_ROOT)
    out = tmp_path / "package.tgz"
    with mock.patch("flytekit.image_spec.image_spec.ImageBuildEngine.build"):
        result = CliRunner().invoke(
            pyflyte.main,
            ["--pkgs", "workflows", "package", "--image", "ghcr.io/example/finetune-bench:test", "-f", "-o", str(out)],
        )
    assert result.exit_code == 0, result.output
    assert "workflows.benchmark.benchmarking_experiment" in result.output
    assert "tasks.train.train_condition" in result.output
    assert "workflows.kernels.kernel_benchmark" in result.output and "tasks.kernels.benchmark_kernel" in result.output
    with tarfile.open(out) as archive:
        registered = b"".join(archive.extractfile(m).read() for m in archive.getmembers() if m.isfile())
    assert b"tasks.train.train_condition" in registered  # the archive holds the tasks' specs
    for forbidden in (*local.values(), str(PROJECT_ROOT), str(tmp_path)):
        assert forbidden.encode() not in registered, forbidden


def test_dynamic_body_compiles_to_a_map_over_every_run():
    from finetune_bench.inputs.plan import plan_runs
    from tests.workflows.compiled import compile_benchmark_dynamic

    spec = compile_benchmark_dynamic(
        plan_runs(smoke_experiment(), TrainingArgs(), 2), concurrency=3, min_success_ratio=0.25
    )
    (node,) = spec.nodes
    array = node.array_node.to_flyte_idl()
    assert array.parallelism == 3
    assert array.min_success_ratio == pytest.approx(0.25)
    bound = {"dataset_dir", "model_dir", "condition_timeout_s", "results_store", "force_fresh", "sources"}
    assert set(array.bound_inputs) == bound
    assert [t.id.name for t in spec.tasks][0].startswith("tasks.train.map_train_condition")
