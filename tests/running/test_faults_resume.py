"""Faults are data (each ending is a result, the grid completes), an interrupted grid resumes without
re-running what finished, and secrets never reach an output."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running import faults
from finetune_bench.running.faults import FAULT_ENV, RUN_ENV
from finetune_bench.running.launch import child_env, run_in_child

PROJECT_ROOT = Path(__file__).resolve().parents[2]
HF_TOKEN = "hf_SECRETtokenVALUE0123456789"
WANDB_KEY = "wandbSECRETkey0123456789abcdef0123456789"


def planned(condition_id="test", run_number=0, **overrides) -> PlannedRun:
    return PlannedRun(condition_id, run_number, TrainingArgs(**overrides), swept_axes=[])


@pytest.mark.parametrize(
    "spec, run, expected",
    [
        ("oom@2", "a=1#0", ("oom", 2)),
        ("oom@2:a=1#*", "a=1#3", ("oom", 2)),
        ("oom@2:a=1#*", "a=2#0", None),
        ("oom@2:a=2#*; nan@1:*#1", "a=1#1", ("nan", 1)),
        ("oom@2:a=2#*; nan@1:*#1", "a=2#1", ("oom", 2)),
        ("", "a=1#0", None),
    ],
)
def test_faults_target_runs_by_pattern(spec, run, expected, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, spec)
    monkeypatch.setenv(RUN_ENV, run)
    assert faults.planned_fault() == expected


def test_an_unknown_fault_kind_is_refused(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "meltdown@1")
    with pytest.raises(ValueError, match="kind must be one of"):
        faults.planned_fault()


def test_the_child_gets_its_run_id_and_no_flyte_secret(monkeypatch):
    monkeypatch.setenv("_FSEC_HF_TOKEN", HF_TOKEN)
    env = child_env(planned("arm=liger", 3))
    assert env[RUN_ENV] == "arm=liger#3"
    assert HF_TOKEN not in env.values()


@pytest.mark.parametrize("backend", ["plain_loop", "trl_sft"])
def test_a_nan_loss_ends_the_run_as_nonfinite_keeping_its_steps(
    backend, monkeypatch, tiny_model_dir, tiny_dataset_dir, tmp_path
):
    monkeypatch.setenv(FAULT_ENV, "nan@2")
    run = planned(backend=backend, max_steps=5)
    result = run_in_child(run, tiny_dataset_dir, tiny_model_dir, tmp_path / "run", timeout_s=300)
    assert result.status == "nonfinite", (result.reason, result.error_tail)
    assert result.reason == "non-finite loss: the loss is nan at step 3"
    steps = pd.read_csv(result.steps_file)
    assert list(steps["step"]) == [1, 2, 3]
    assert steps["loss"].iloc[:2].notna().all() and steps["loss"].isna().iloc[2]


def test_train_task_reuses_a_stored_run_unless_fresh(monkeypatch, tiny_model_dir, tiny_dataset_dir, tmp_path):
    from flytekit.types.directory import FlyteDirectory

    from tasks.train import train_condition

    inputs = dict(
        planned_run=planned(max_steps=2),
        dataset_dir=FlyteDirectory(str(tiny_dataset_dir)),
        model_dir=FlyteDirectory(str(tiny_model_dir)),
        condition_timeout_s=300,
        results_store=str(tmp_path / "store"),
    )
    first = train_condition(**inputs, force_fresh=False).result
    assert (first.status, first.reused) == ("ok", False)
    # From here on, any run that is launched fails at once: only a reused result can be ok. (Not through the fault
    # switch: a run a test-only switch acts on never reads or writes the store.)
    from finetune_bench.running import launch

    with monkeypatch.context() as failing:
        failing.setattr(launch, "run_in_child", lambda run, *args, **kwargs: launch.not_launched(
            dataclasses.replace(run, refused="every launch fails in this test")
        ))  # fmt: skip
        again = train_condition(**inputs, force_fresh=False).result
        assert (again.status, again.reused) == ("ok", True)
        assert again.metrics == first.metrics
        fresh = train_condition(**inputs, force_fresh=True).result
        assert (fresh.status, fresh.reused) == ("error", False)
    # An error is not stored: the stored ok run is still what a re-run gets.
    assert train_condition(**inputs, force_fresh=False).result.reused


def _four_runs() -> str:
    """The smoke grid (inputs/smoke.yaml) on the baseline alone (Liger on a CPU runs in the Triton interpreter, ten
    times slower), with 2 runs of each batch size: 4 runs."""
    inputs = yaml.safe_load((PROJECT_ROOT / "inputs" / "smoke.yaml").read_text())
    inputs["experiment_args"].pop("arm")
    inputs["training_args"]["arm"] = "baseline"
    inputs["n_runs"] = 2
    return yaml.safe_dump(inputs)


def _pyflyte_run(export: Path, store: Path, fault: str = "") -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        FINETUNE_BENCH_EXPORT_DIR=str(export),
        FINETUNE_BENCH_HF_TOKEN_SECRET="hf_token",
        _FSEC_HF_TOKEN=HF_TOKEN,
        WANDB_API_KEY=WANDB_KEY,
        # W&B itself off (its files are checked for secrets in tests/integrations/test_wandb_logging.py): the key stays
        # in the environment, which no log, table or stored result may show
        WANDB_MODE="disabled",
        FLYTE_SDK_LOGGING_LEVEL="20",
    )
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    inputs = store.parent / "four_runs.yaml"
    inputs.write_text(_four_runs())
    pyflyte = Path(sys.executable).parent / "pyflyte"
    return subprocess.run(
        [str(pyflyte), "run", "workflows/benchmark.py", "benchmarking_experiment", "--inputs-file", str(inputs)]
        + ["--results_store", str(store)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_an_interrupted_grid_with_faults_resumes_without_rerunning_finished_runs(tmp_path):
    """Two runs of batch 1 and 2 each: batch 2's first run runs out of memory at step 2 and batch 1's second run's
    loss turns NaN (injected faults), and the whole workflow is killed when batch 2's second run starts. What the
    faults made is no measurement: only batch 1's first run, which no fault touched, is kept. The re-run, without
    faults, reuses it and trains the other three."""
    store, export = tmp_path / "store", tmp_path / "export"
    interrupted = _pyflyte_run(
        tmp_path / "unused",
        store,
        fault="oom@2:per_device_train_batch_size=2#0;"
        "nan@1:per_device_train_batch_size=1#1;"
        "interrupt@0:per_device_train_batch_size=2#1",
    )
    assert interrupted.returncode != 0
    assert len(list(store.glob("*/result.json"))) == 1, interrupted.stdout[-2000:] + interrupted.stderr[-2000:]

    resumed = _pyflyte_run(export, store)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    results = pd.read_csv(export / "results.csv").set_index(["per_device_train_batch_size", "run_number"])
    assert set(results["status"]) == {"ok"}
    assert results["reused"].to_dict() == {(1, 0): True, (1, 1): False, (2, 0): False, (2, 1): False}
    steps = pd.read_csv(export / "steps.csv")
    assert set(steps.groupby(["condition_id", "run_number"]).size()) == {4}
    report = (export / "report.html").read_text()
    # a resumed grid reports every run, and says which were measured by the interrupted execution
    assert "1 of 4 runs reused from the results store, measured " in report
    assert (resumed.stdout + resumed.stderr).count("reused the stored result") == 1

    # Secrets given to the workflow appear in no log, report, table, stored result or sandbox file.
    outputs = [interrupted.stdout, interrupted.stderr, resumed.stdout, resumed.stderr]
    files = [*export.rglob("*"), *store.rglob("*"), *Path(os.environ["TMPDIR"]).glob("flyte*/**/*")]
    outputs += [f.read_text(errors="replace") for f in files if f.is_file() and f.stat().st_size < 50_000_000]
    for secret in (HF_TOKEN, WANDB_KEY):
        assert not any(secret in text for text in outputs)
