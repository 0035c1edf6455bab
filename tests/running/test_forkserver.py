"""Runs forked from the fork server (finetune_bench.running.forkserver) are as isolated as fresh interpreters: what
one run patches never reaches the next, a forked run measures what a fresh one measures, an environment the imports
read gets a server of its own, and a server that cannot fork safely leaves each run a fresh interpreter."""

import dataclasses
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running import forkserver, forkserver_process
from finetune_bench.running.faults import FAULT_ENV, RUN_ENV
from finetune_bench.running.launch import child_env, run_in_child
from finetune_bench.running.triton_cpu import INTERPRETER_ENV

FORKED = "forked from the fork server"


def planned(condition_id: str, **overrides) -> PlannedRun:
    args = dataclasses.replace(TrainingArgs(), backend="plain_loop", max_steps=2, **overrides)
    return PlannedRun(condition_id=condition_id, run_number=0, training_args=args, swept_axes=[])


@pytest.fixture
def fresh_servers():
    forkserver.close_servers()
    yield forkserver._SERVERS
    forkserver.close_servers()


def test_a_liger_patch_never_reaches_the_next_run_forked_from_the_same_server(
    fresh_servers, tiny_model_dir, tiny_dataset_dir, tmp_path, monkeypatch
):
    # Triton's interpreter in the launcher's environment too, so the baseline's child has the liger run's server
    monkeypatch.setenv(*next(iter(INTERPRETER_ENV.items())))
    liger = run_in_child(planned("liger", arm="liger"), tiny_dataset_dir, tiny_model_dir, tmp_path / "l", 300)
    baseline = run_in_child(planned("baseline"), tiny_dataset_dir, tiny_model_dir, tmp_path / "b", 300)
    assert liger.status == baseline.status == "ok", (liger.error_tail, baseline.error_tail)
    assert liger.details["child_started"] == baseline.details["child_started"] == FORKED
    assert len(fresh_servers) == 1  # both from one server
    assert "LigerRMSNorm" in liger.liger_patches and liger.loss_path == "liger_fused_linear_cross_entropy"
    # the baseline's model is transformers' own: no kernel of the liger run's, no fused loss
    assert not baseline.liger_patches and baseline.loss_path == "hf_cross_entropy"


def test_an_environment_the_imports_read_gets_a_server_of_its_own():
    base = {"PATH": "/usr/bin", RUN_ENV: "a#0", FAULT_ENV: ""}
    assert forkserver.server_key(base) == forkserver.server_key({**base, RUN_ENV: "b#1", FAULT_ENV: "hang@0"})
    assert forkserver.server_key(base) != forkserver.server_key({**base, **INTERPRETER_ENV})
    assert forkserver.server_key(base) != forkserver.server_key({**base, "PYTORCH_CUDA_ALLOC_CONF": "x"})


def test_a_python_thread_makes_forking_unsafe():
    assert "sampler" not in forkserver_process.fork_hazards()  # (this test process may run others: tqdm's monitor)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="sampler")
    thread.start()
    try:
        assert re.search(r"the imports left Python threads running \(.*sampler", forkserver_process.fork_hazards())
    finally:
        stop.set()
        thread.join()


def test_a_server_that_cannot_serve_leaves_each_run_a_fresh_interpreter(
    fresh_servers, tiny_model_dir, tiny_dataset_dir, tmp_path, monkeypatch, caplog
):
    def refuse(env):
        raise forkserver.ForkServerError("the fork server cannot fork safely: CUDA was initialized by the imports")

    monkeypatch.setattr(forkserver, "_start_server", refuse)
    result = run_in_child(planned("fresh"), tiny_dataset_dir, tiny_model_dir, tmp_path / "r", 300)
    assert result.status == "ok", result.error_tail
    assert result.details["child_started"] == "fresh interpreter"
    assert "CUDA was initialized by the imports; each run starts a fresh interpreter instead" in caplog.text


def test_a_timeout_that_runs_out_while_the_server_starts_still_ends_the_child(fresh_servers, tmp_path, monkeypatch):
    """The server's imports count in the first run's time: a timeout shorter than them kills the child as soon as it
    is forked, which it reaches (the pid comes back once the child leads its own process group)."""
    monkeypatch.setenv(FAULT_ENV, "hang@0")
    result = run_in_child(planned("hang"), tmp_path, tmp_path, tmp_path / "run", timeout_s=0.01)
    assert result.details["child_started"] == FORKED
    assert result.status == "timeout"


@pytest.fixture(scope="module")
def _no_server_before_the_shared_ones():
    forkserver.close_servers()


@pytest.fixture
def shared_servers(_no_server_before_the_shared_ones):
    """The servers the tests below share (the tests above close theirs): each test's runs fork from the server the
    first of them started (a server's imports are seconds of both cores), as a grid's runs do. Their environments
    differ only in what a run reads while it runs (`RUNTIME_ENV`), so it stays the one server; it stays for the
    runs of later tests in this process, as any run's server does."""
    return forkserver._SERVERS


def test_a_forked_run_measures_what_a_fresh_interpreter_measures(
    shared_servers, tiny_model_dir, tiny_dataset_dir, tmp_path, monkeypatch
):
    forked = run_in_child(planned("forked"), tiny_dataset_dir, tiny_model_dir, tmp_path / "f", 300)
    monkeypatch.setenv(forkserver.ENABLED_ENV, "0")
    fresh = run_in_child(planned("fresh"), tiny_dataset_dir, tiny_model_dir, tmp_path / "s", 300)
    assert forked.status == fresh.status == "ok", (forked.error_tail, fresh.error_tail)
    assert (forked.details["child_started"], fresh.details["child_started"]) == (FORKED, "fresh interpreter")
    for name in ("final_loss", "model_flops_per_token", "measured_tokens"):
        assert forked.metrics[name] == pytest.approx(fresh.metrics[name], rel=1e-6), name
    # a forked child found the heavy modules imported: its imports are a small part of a fresh one's
    assert forked.metrics["imports_s"] < fresh.metrics["imports_s"]


def test_endings_of_a_forked_child_are_classified_as_a_fresh_ones(shared_servers, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "segfault@0")
    result = run_in_child(planned("crash"), tmp_path, tmp_path, tmp_path / "run", timeout_s=120)
    assert result.details["child_started"] == FORKED
    assert result.status == "error" and "killed by SIGSEGV" in result.reason
    monkeypatch.setenv(FAULT_ENV, "hang@0")
    result = run_in_child(planned("hang"), tmp_path, tmp_path, tmp_path / "hang", timeout_s=3)
    assert result.details["child_started"] == FORKED
    assert result.status == "timeout"


def test_a_forked_child_dies_with_its_launcher_s_connection(
    shared_servers, tiny_model_dir, tiny_dataset_dir, tmp_path, monkeypatch
):
    """A launcher gone without a word (a rank's supervisor killed by SIGKILL closes its connection): the keeper
    kills the child it would otherwise leave running."""
    monkeypatch.setenv(FAULT_ENV, "hang@0")
    run = planned("orphan")
    condition = tmp_path / "condition.json"
    condition.write_text(json.dumps(dataclasses.asdict(run.training_args)))
    args = ["--condition", str(condition), "--dataset-dir", str(tiny_dataset_dir), "--model-dir", str(tiny_model_dir)]
    child = forkserver.start_child([*args, "--out", str(tmp_path)], tmp_path / "log.txt", child_env(run))
    assert child is not None
    time.sleep(2)
    assert Path(f"/proc/{child.pid}").exists(), (tmp_path / "log.txt").read_text()  # hanging, as it would for good
    child._connection.close()
    deadline = time.monotonic() + 20
    while Path(f"/proc/{child.pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{child.pid}").exists()


def test_ranks_fork_from_the_server_their_launcher_offered_with_its_environment_and_their_own_launch_variables(
    shared_servers, tmp_path
):
    env = child_env(planned("ranks"))
    with forkserver.offered_to_ranks(env):
        offered = os.environ[forkserver.NODE_SERVER_ENV]
        assert len(shared_servers) == 1
    assert forkserver.NODE_SERVER_ENV not in os.environ  # offered to one launch's ranks only; the server stays
    assert len(shared_servers) == 1
    # the rank's process: the launch's variables, its run's, and one its own imports set (not passed on)
    rank_env = {**env, forkserver.NODE_SERVER_ENV: offered, "RANK": "1", "MASTER_PORT": "29500", "LIBRARY_SET": "1"}
    rank_env.update({FAULT_ENV: "oom@2", RUN_ENV: "ranks#0@rank1"})
    seen = forkserver.rank_child_env(json.loads(offered)["env"], rank_env)
    assert {name: seen[name] for name in ("RANK", "MASTER_PORT", FAULT_ENV, RUN_ENV)} == {
        "RANK": "1", "MASTER_PORT": "29500", FAULT_ENV: "oom@2", RUN_ENV: "ranks#0@rank1"
    }  # fmt: skip
    assert seen["PYTHONPATH"] == env["PYTHONPATH"] and "LIBRARY_SET" not in seen
    assert forkserver.NODE_SERVER_ENV not in seen
    child = forkserver.start_child(["--help"], tmp_path / "log.txt", rank_env)  # the worker's usage, then its exit
    assert child is not None and child.wait(timeout=60) == 0, (tmp_path / "log.txt").read_text()
