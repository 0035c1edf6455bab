"""Two grids on one machine never measure at the same time: a run holds the machine's device lock while
it trains, and a second one waits (and says how long)."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from finetune_bench.running.device_lock import device_lock, lock_path
from finetune_bench.running.faults import FAULT_ENV

PROJECT_ROOT = Path(__file__).resolve().parents[2]

LAUNCHER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from finetune_bench.inputs.plan import PlannedRun
    from finetune_bench.inputs.settings import TrainingArgs
    from finetune_bench.running.launch import run_in_child

    work = Path(sys.argv[1])
    result = run_in_child(PlannedRun("hang", 0, TrainingArgs(), []), work, work, work / "run", timeout_s=3)
    print(json.dumps({"status": result.status, "end": time.time(), "details": result.details}))
    """
)


def test_two_runs_on_one_machine_take_turns(tmp_path):
    env = dict(os.environ, **{FAULT_ENV: "hang@0"}, PYTHONPATH=str(PROJECT_ROOT))
    started = time.time()
    launchers = [
        subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(tmp_path / name)], env=env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE
        )
        for name in ("first", "second")
    ]
    ends = [json.loads(launcher.communicate(timeout=120)[0].splitlines()[-1]) for launcher in launchers]
    assert [end["status"] for end in ends] == ["timeout", "timeout"]
    # each child ran its 3 s alone: the later one ended at least 3 s after the earlier one
    first, second = sorted(ends, key=lambda end: end["end"])
    assert second["end"] - first["end"] >= 2.9, (first, second)
    assert second["end"] - started >= 6
    assert int(second["details"]["waited_for_device_s"]) >= 2
    assert "waited_for_device_s" not in first["details"]


def test_the_lock_is_reentrant_and_named_after_the_hardware():
    with device_lock("NVIDIA H100 80GB HBM3 driver 580.1") as waited:
        with device_lock("NVIDIA H100 80GB HBM3 driver 580.1") as again:
            assert waited < 1 and again == 0.0
    assert lock_path("NVIDIA H100 80GB HBM3 driver 580.1").name == "NVIDIA_H100_80GB_HBM3_driver_580.1.lock"


GRID = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from finetune_bench.inputs.plan import PlannedRun
    from finetune_bench.inputs.settings import TrainingArgs
    from finetune_bench.results.store import ResultStore
    from finetune_bench.running.launch import run_or_reuse

    model, data, store, work = (Path(p) for p in sys.argv[1:5])
    args = TrainingArgs(backend="plain_loop", max_steps=2)
    result = run_or_reuse(PlannedRun("shared", 0, args, []), ResultStore(str(store)), data, model, work, 300)
    print(json.dumps({"status": result.status, "reused": result.reused, "details": result.details}))
    """
)


def test_two_grids_on_one_store_measure_a_run_once(tiny_model_dir, tiny_dataset_dir, tmp_path):
    """Started together, the second grid waits for the first's run, then reuses it: the run is measured once,
    never twice side by side."""
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    env.pop(FAULT_ENV, None)
    store = tmp_path / "store"
    grids = [
        subprocess.Popen(
            [sys.executable, "-c", GRID, str(tiny_model_dir), str(tiny_dataset_dir), str(store), str(tmp_path / name)],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
        )
        for name in ("first", "second")
    ]
    ends = [json.loads(grid.communicate(timeout=600)[0].splitlines()[-1]) for grid in grids]
    assert [end["status"] for end in ends] == ["ok", "ok"]
    assert sorted(end["reused"] for end in ends) == [False, True]
    assert len(list(store.glob("*/manifest.json"))) == 1
