"""No process outlives the run that started it: however the launching process ends (Ctrl-C, SIGTERM, SIGKILL),
the training child and its process group go with it; and the steps a killed child finished are kept."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from finetune_bench.running.faults import FAULT_ENV
from finetune_bench.running.forkserver import ENABLED_ENV
from finetune_bench.running.launch import LOG_FILE

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found


def wait_for(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def processes_holding(path: Path) -> list[int]:
    """The processes with `path` open: a run's child holds its log (stdout and stderr), whether it was forked from
    the fork server (whose command line it shares) or started as a fresh interpreter."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd) == str(path) for fd in (proc / "fd").iterdir()):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def parent_of(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rpartition(")")[2].split()[1])


LAUNCHER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from finetune_bench.inputs.plan import PlannedRun
    from finetune_bench.inputs.settings import TrainingArgs
    from finetune_bench.running.launch import run_in_child

    work = Path(sys.argv[1])
    run = PlannedRun("hang", 0, TrainingArgs(), [])
    run_in_child(run, work, work, work / "run", timeout_s=600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("fork_server", ["1", "0"], ids=["forked", "fresh-interpreter"])
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_the_child_dies_with_the_process_that_launched_it(how, fork_server, tmp_path):
    env = dict(os.environ, **{FAULT_ENV: "hang@0", ENABLED_ENV: fork_server}, PYTHONPATH=str(PROJECT_ROOT))
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], env=env, cwd=PROJECT_ROOT)
    log = tmp_path / "run" / LOG_FILE

    def children() -> list[int]:
        return [pid for pid in processes_holding(log) if pid != launcher.pid]

    servers: list[int] = []
    try:
        assert wait_for(children), "the training child never started"
        servers = [pid for pid in processes_mentioning("running.forkserver") if parent_of(pid) == launcher.pid]
        assert len(servers) == (1 if fork_server == "1" else 0)
        time.sleep(0.5)  # the child is past its start-up (where it asks to die with its parent)
        launcher.send_signal(how)
        launcher.wait(timeout=60)
        assert wait_for(lambda: not children(), timeout_s=30), f"the training child outlived its launcher ({how.name})"
        assert wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in servers), timeout_s=30), (
            f"the fork server outlived its launcher ({how.name})"
        )
    finally:
        for pid in children() + servers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()


def test_a_child_killed_part_way_keeps_the_steps_it_finished(tiny_model_dir, tiny_dataset_dir, tmp_path, monkeypatch):
    import dataclasses

    from finetune_bench.inputs.plan import PlannedRun
    from finetune_bench.inputs.settings import TrainingArgs
    from finetune_bench.running.launch import run_in_child

    monkeypatch.setenv(FAULT_ENV, "sigkill@2")
    args = dataclasses.replace(TrainingArgs(), backend="plain_loop", max_steps=4)
    result = run_in_child(PlannedRun("killed", 0, args, []), tiny_dataset_dir, tiny_model_dir, tmp_path / "r", 300)
    assert result.status == "error" and "SIGKILL" in result.reason
    steps = pd.read_csv(result.steps_file)
    assert list(steps["step"]) == [1, 2]
    assert steps["step_time_s"].gt(0).all()
    assert result.details["steps_completed"] == "2"
