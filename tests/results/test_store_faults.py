"""Faults around the results store, with nothing lost: a grid interrupted by SIGINT resumes from the store, a full
disk shows in the run's problems and the execution's status, an entry stored under a key that is not its own is
refused and measured again (and said so), and two grids writing one entry at the same time leave it whole."""

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.results.record import RunResult
from finetune_bench.results.store import (
    MANIFEST_NAME,
    RESULT_NAME,
    CorruptEntry,
    ResultStore,
    hardware_fingerprint,
    run_identity,
    run_key,
)
from finetune_bench.running import launch

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def planned(run_number: int = 0, **settings) -> PlannedRun:
    return PlannedRun("arm=baseline", run_number, TrainingArgs(**settings), ["arm"])


@pytest.fixture
def measured(monkeypatch):
    """run_in_child replaced by a fake that counts the measurements (each measures a different figure)."""
    calls = []

    def fake_run_in_child(run, dataset_dir, model_dir, work_dir, timeout_s):
        calls.append(run.run_number)
        return RunResult(
            condition_id=run.condition_id,
            run_number=run.run_number,
            swept_axes=run.swept_axes,
            training_args=run.training_args,
            status="ok",
            metrics={"tokens_per_second": 100.0 * len(calls)},
        )

    monkeypatch.setattr(launch, "run_in_child", fake_run_in_child)
    return calls


def reuse(run: PlannedRun, store: ResultStore, tmp_path: Path) -> RunResult:
    return launch.run_or_reuse(run, store, tmp_path, tmp_path, tmp_path / "work", timeout_s=10)


def test_a_full_disk_leaves_the_run_measured_and_fails_the_execution(measured, tmp_path, monkeypatch):
    from tasks.analysis import NothingKept, require_nothing_lost

    store = ResultStore(str(tmp_path / "store"))

    def disk_full(path, data, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(store._fs, "pipe_file", disk_full)
    run = planned()
    result = reuse(run, store, tmp_path)
    assert (result.status, result.metrics["tokens_per_second"]) == ("ok", 100.0)  # the measurement is kept
    assert len(result.problems) == 1 and "No space left on device" in result.problems[0]
    assert "this run is not kept, a re-run of the grid measures it again" in result.problems[0]
    problems = analyze_grid([run], [result], {}).problems
    assert problems == [f"arm=baseline#0: {result.problems[0]}"]  # in the report's and the tables' problems
    with pytest.raises(NothingKept, match="1 problem\\(s\\) kept measured results from being stored"):
        require_nothing_lost(problems=problems)  # the execution's exit status
    monkeypatch.undo()
    assert store.load(run_key(run, hardware_fingerprint()), tmp_path / "reuse") is None  # nothing half-written


def test_an_entry_under_a_key_that_is_not_its_own_is_refused_and_measured_again(measured, tmp_path, caplog):
    """Checksums hold for a whole entry copied (or synced) under another run's key: its manifest's identity
    tells, and it is never used for the run whose key it sits under."""
    store = ResultStore(str(tmp_path / "store"))
    four_steps, eight_steps = planned(max_steps=4), planned(max_steps=8)
    reuse(four_steps, store, tmp_path)
    entries = tmp_path / "store"
    source, target = (entries / run_key(run, hardware_fingerprint()) for run in (four_steps, eight_steps))
    target.mkdir()
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    with pytest.raises(CorruptEntry, match="its manifest records another run \\(differs in training_args.max_steps\\)"):
        store.load(target.name, tmp_path / "load", run_identity(eight_steps, hardware_fingerprint()))
    again = reuse(eight_steps, store, tmp_path)
    assert (again.reused, measured) == (False, [0, 0])  # measured, not taken from the four-step run
    assert "replaced a corrupt stored entry" in again.details["results_store"]
    assert "differs in training_args.max_steps" in caplog.text
    assert json.loads((target / RESULT_NAME).read_text())["training_args"]["max_steps"] == 8  # healed


def test_two_grids_writing_one_entry_at_the_same_time_leave_it_whole(tmp_path, monkeypatch):
    """Two machines (the device lock is per machine) store the same run at once: the first's result is written,
    then the second writes its whole entry, then the first goes on. Files of both would make an entry no run
    measured; the first writer reads its entry back, finds it mixed and writes it again, whole."""
    run = planned()
    key = run_key(run, hardware_fingerprint())
    identity = run_identity(run, hardware_fingerprint())
    first, second = ResultStore(str(tmp_path / "store")), ResultStore(str(tmp_path / "store"))

    def result(figure: float) -> RunResult:
        return RunResult("arm=baseline", 0, ["arm"], run.training_args, "ok", metrics={"tokens_per_second": figure})

    real_write, writes = first._write_atomically, []

    def interleaved(path: str, data: bytes) -> None:
        real_write(path, data)
        writes.append(path)
        if len(writes) == 1:  # the first writer's result.json is in place: the other grid writes its entry now
            assert second.save(key, result(2.0), identity=identity)

    monkeypatch.setattr(first, "_write_atomically", interleaved)
    assert first.save(key, result(1.0), identity=identity)
    assert [Path(p).name for p in writes] == [RESULT_NAME, MANIFEST_NAME, RESULT_NAME, MANIFEST_NAME]
    stored = first.load(key, tmp_path / "load", identity)  # complete: its files match its manifest
    assert stored.metrics == {"tokens_per_second": 1.0}
    assert not list((tmp_path / "store" / key).glob("*.partial"))


def test_two_grids_on_one_store_keep_every_entry(measured, tmp_path):
    """Runs of two grids (one of them shared) stored side by side: every run comes back, each its own."""
    store = ResultStore(str(tmp_path / "store"))
    grid_a = [planned(n) for n in (0, 1, 2)]
    grid_b = [planned(n) for n in (2, 3)]
    for first, second in zip(grid_a, [*grid_b, None], strict=True):
        reuse(first, store, tmp_path)
        if second is not None:
            reuse(second, store, tmp_path)
    assert measured == [0, 2, 1, 3]  # grid b's run 2 was stored before grid a reached it: reused, not measured
    for run in {r.run_number: r for r in grid_a + grid_b}.values():
        back = store.load(
            run_key(run, hardware_fingerprint()), tmp_path / "load", run_identity(run, hardware_fingerprint())
        )
        assert back.run_number == run.run_number
    assert len(list((tmp_path / "store").glob(f"*/{MANIFEST_NAME}"))) == 4


GRID = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    from finetune_bench.inputs.plan import PlannedRun
    from finetune_bench.inputs.settings import TrainingArgs
    from finetune_bench.results.record import RunResult
    from finetune_bench.results.store import ResultStore
    from finetune_bench.running import launch

    store, log, interrupt_at = ResultStore(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

    def fake_run_in_child(run, dataset_dir, model_dir, work_dir, timeout_s):
        if run.run_number == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while this run trains
        with log.open("a") as handle:
            handle.write(f"{run.run_number}\\n")
        return RunResult(run.condition_id, run.run_number, [], run.training_args, "ok",
                         metrics={"tokens_per_second": 100.0 + run.run_number})

    launch.run_in_child = fake_run_in_child
    results = [launch.run_or_reuse(PlannedRun("c", n, TrainingArgs(), []), store, Path("."), Path("."),
                                   Path(sys.argv[4]) / str(n), 10) for n in range(3)]
    print(json.dumps([[r.run_number, r.reused, r.metrics["tokens_per_second"]] for r in results]))
    """
)


def test_a_grid_interrupted_by_sigint_resumes_from_the_store(tmp_path):
    """Ctrl-C while run 1 trains: run 0 is stored, run 1 was never finished, so nothing of it is stored. The
    re-run takes run 0 from the store (its manifest records this run's settings, software and measuring code)
    and measures runs 1 and 2."""
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), FINETUNE_BENCH_CACHE_DIR=str(tmp_path / "cache"))
    store, log = tmp_path / "store", tmp_path / "measured.log"

    def grid(interrupt_at: int) -> subprocess.CompletedProcess:
        command = [sys.executable, "-c", GRID, str(store), str(log), str(interrupt_at), str(tmp_path / "work")]
        return subprocess.run(command, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)

    interrupted = grid(interrupt_at=1)
    assert interrupted.returncode != 0 and "KeyboardInterrupt" in interrupted.stderr
    assert log.read_text().split() == ["0"]
    assert len(list(store.glob(f"*/{MANIFEST_NAME}"))) == 1

    resumed = grid(interrupt_at=-1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout.splitlines()[-1]) == [[0, True, 100.0], [1, False, 101.0], [2, False, 102.0]]
    assert log.read_text().split() == ["0", "1", "2"]  # run 0 measured once, in the interrupted grid
    (entry,) = [
        m.parent
        for m in store.glob(f"*/{MANIFEST_NAME}")
        if json.loads((m.parent / RESULT_NAME).read_text())["run_number"] == 0
    ]
    recorded = json.loads((entry / MANIFEST_NAME).read_text())["identity"]
    expected = run_identity(PlannedRun("c", 0, TrainingArgs(), []), hardware_fingerprint())
    assert recorded == json.loads(json.dumps(expected))  # the same settings, software and measuring code
