"""A run and the results store: nothing measured is lost to the store, and nothing reused is wrong."""

import dataclasses

import pytest

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.results.record import RunResult
from finetune_bench.results.store import MANIFEST_NAME, RESULT_NAME, ResultStore, hardware_fingerprint, run_key
from finetune_bench.running import launch


@pytest.fixture
def measured(monkeypatch):
    """run_in_child replaced by a fake that counts the measurements."""
    calls = []

    def fake_run_in_child(run, dataset_dir, model_dir, work_dir, timeout_s):
        calls.append(run.condition_id)
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


RUN = PlannedRun("arm=baseline", 0, dataclasses.replace(TrainingArgs()), ["arm"])


def reuse(store: ResultStore, tmp_path, **kwargs) -> RunResult:
    return launch.run_or_reuse(RUN, store, tmp_path, tmp_path, tmp_path / "work", timeout_s=10, **kwargs)


def test_a_stored_run_is_reused_and_force_fresh_measures_again(measured, tmp_path):
    store = ResultStore(str(tmp_path / "store"))
    first = reuse(store, tmp_path)
    second = reuse(store, tmp_path)
    assert (first.reused, second.reused) == (False, True)
    assert second.metrics == first.metrics and len(measured) == 1
    assert reuse(store, tmp_path, force_fresh=True).metrics["tokens_per_second"] == 200.0


def test_a_corrupt_entry_is_reported_measured_again_and_replaced(measured, tmp_path, caplog):
    store = ResultStore(str(tmp_path / "store"))
    reuse(store, tmp_path)
    entry = tmp_path / "store" / run_key(RUN, hardware_fingerprint())
    (entry / RESULT_NAME).write_text((entry / RESULT_NAME).read_text().replace("100.0", "999.0"))
    again = reuse(store, tmp_path)
    assert not again.reused and len(measured) == 2
    assert "replaced a corrupt stored entry" in again.details["results_store"]
    assert "does not match its checksum" in caplog.text
    assert again.problems == []  # healed: the new measurement is stored
    assert reuse(store, tmp_path).metrics == again.metrics


def test_a_store_that_cannot_keep_the_run_leaves_it_measured_with_the_problem(measured, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = reuse(ResultStore(str(blocker)), tmp_path)
    assert result.status == "ok" and result.metrics["tokens_per_second"] == 100.0
    assert len(result.problems) == 1
    assert result.problems[0].startswith("results store: cannot write entry")
    assert "a re-run of the grid measures it again" in result.problems[0]


def test_a_store_that_cannot_be_read_measures_and_says_so(measured, tmp_path, monkeypatch):
    store = ResultStore(str(tmp_path / "store"))
    reuse(store, tmp_path)

    def unreadable(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(store._fs, "cat_file", unreadable)
    result = reuse(store, tmp_path)
    assert not result.reused and len(measured) == 2
    assert any("cannot read entry" in p and "Permission denied" in p for p in result.problems)
    assert (tmp_path / "store" / run_key(RUN, hardware_fingerprint()) / MANIFEST_NAME).exists()


def test_a_run_a_test_only_switch_acts_on_is_never_stored(measured, tmp_path, monkeypatch):
    """The fake memory model, or a fault planned for this run: measured, never stored, said in its details; a fault
    planned for another run leaves this one a measurement, stored and reused."""
    from finetune_bench.running.faults import FAKE_MEMORY_ENV, FAULT_ENV

    store = ResultStore(str(tmp_path / "store"))
    monkeypatch.setenv(FAKE_MEMORY_ENV, "64")
    faked = reuse(store, tmp_path)
    assert faked.details["test_switches"] == FAKE_MEMORY_ENV and not list((tmp_path / "store").glob("*/*"))
    monkeypatch.delenv(FAKE_MEMORY_ENV)
    monkeypatch.setenv(FAULT_ENV, f"oom@1:{RUN.condition_id}#{RUN.run_number}")
    assert reuse(store, tmp_path).details["test_switches"] == FAULT_ENV
    assert not list((tmp_path / "store").glob("*/*")) and len(measured) == 2
    monkeypatch.setenv(FAULT_ENV, "oom@1:arm=liger#0")  # another run's
    assert "test_switches" not in reuse(store, tmp_path).details
    assert reuse(store, tmp_path).reused and len(measured) == 3


def test_a_stored_result_a_test_switch_made_is_never_reused(measured, tmp_path, caplog):
    """An entry kept by a store from before: its reason names an injected fault, so it is measured again."""
    store = ResultStore(str(tmp_path / "store"))
    key = run_key(RUN, hardware_fingerprint())
    injected = RunResult(
        RUN.condition_id, RUN.run_number, RUN.swept_axes, RUN.training_args, status="oom",
        reason="out of memory at step 2: CUDA out of memory. Tried to allocate 2.00 GiB (injected at step 1)",
    )  # fmt: skip
    store.save(key, injected)
    again = reuse(store, tmp_path)
    assert not again.reused and again.status == "ok" and len(measured) == 1
    assert "made under a test-only switch" in again.details["results_store"] and "test-only switch" in caplog.text


def test_the_console_line_of_a_reused_run_says_how_it_ended(measured, tmp_path, caplog):
    store = ResultStore(str(tmp_path / "store"))
    reuse(store, tmp_path)
    with caplog.at_level("WARNING"):
        reuse(store, tmp_path)
    assert f"reused the stored result {run_key(RUN, hardware_fingerprint())} (ok), measured" in caplog.text
