"""The results store keeps a run whole or not at all: atomic files, checksums in a manifest written last,
corrupt entries detected, failures raised as StoreError, and keys that change with the software."""

import dataclasses
import json

import pytest

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.results import store as store_module
from finetune_bench.results.record import RunResult
from finetune_bench.results.store import (
    MANIFEST_NAME,
    RESULT_NAME,
    STEPS_NAME,
    CorruptEntry,
    ResultStore,
    StoreError,
    run_key,
)


def a_run(**overrides) -> PlannedRun:
    args = dataclasses.replace(TrainingArgs(), **overrides)
    return PlannedRun(condition_id="arm=liger", run_number=0, training_args=args, swept_axes=["arm"])


def a_result(tmp_path, status: str = "ok") -> RunResult:
    steps = tmp_path / "measured" / "steps.csv"
    steps.parent.mkdir(parents=True, exist_ok=True)
    steps.write_text("step,loss\n1,2.5\n2,2.4\n")
    run = a_run()
    return RunResult(
        condition_id=run.condition_id,
        run_number=0,
        swept_axes=run.swept_axes,
        training_args=run.training_args,
        status=status,
        metrics={"tokens_per_second": 1234.5},
        steps_file=str(steps),
    )


@pytest.fixture
def stored(tmp_path):
    store = ResultStore(str(tmp_path / "store"))
    assert store.save("k1", a_result(tmp_path), identity={"what": "test"})
    return store, tmp_path / "store" / "k1"


def test_a_saved_run_comes_back_whole(stored, tmp_path):
    store, entry = stored
    loaded = store.load("k1", tmp_path / "reuse")
    assert loaded.metrics == {"tokens_per_second": 1234.5} and loaded.status == "ok"
    assert open(loaded.steps_file).read() == "step,loss\n1,2.5\n2,2.4\n"
    manifest = json.loads((entry / MANIFEST_NAME).read_text())
    assert set(manifest["sha256"]) == {RESULT_NAME, STEPS_NAME} and manifest["identity"] == {"what": "test"}
    assert not list(entry.glob("*.partial")), "no temporary file is left behind"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda e: (e / RESULT_NAME).write_text((e / RESULT_NAME).read_text()[:40]), "result.json does not match"),
        (lambda e: (e / RESULT_NAME).write_text(""), "result.json does not match"),
        (lambda e: (e / STEPS_NAME).write_text("step,loss\n1,9.9\n"), "steps.csv does not match"),
        (lambda e: (e / STEPS_NAME).unlink(), "steps.csv is missing"),
        (lambda e: (e / MANIFEST_NAME).write_text("{not json"), "unreadable"),
    ],
    ids=["truncated", "emptied", "edited steps", "missing steps", "corrupt manifest"],
)
def test_an_entry_edited_or_cut_short_is_corrupt_never_reused(stored, tmp_path, damage, message):
    store, entry = stored
    damage(entry)
    with pytest.raises(CorruptEntry, match=message):
        store.load("k1", tmp_path / "reuse")


def test_an_entry_without_its_manifest_is_incomplete_and_ignored(stored, tmp_path):
    store, entry = stored
    (entry / MANIFEST_NAME).unlink()  # as a save cut short before its last write leaves it
    assert store.load("k1", tmp_path / "reuse") is None


def test_a_store_that_cannot_be_written_raises_and_leaves_no_reusable_entry(tmp_path, monkeypatch):
    store = ResultStore(str(tmp_path / "store"))
    writes = []

    def disk_full(path, data, **kwargs):
        writes.append(path)
        if len(writes) == 2:  # the steps table: the record went in, then the disk filled
            raise OSError(28, "No space left on device")
        return real(path, data, **kwargs)

    real = store._fs.pipe_file
    monkeypatch.setattr(store._fs, "pipe_file", disk_full)
    with pytest.raises(StoreError, match="cannot write entry k1 .*No space left on device"):
        store.save("k1", a_result(tmp_path))
    monkeypatch.undo()
    assert store.load("k1", tmp_path / "reuse") is None


def test_a_store_path_that_is_a_file_is_a_store_error(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(StoreError, match="cannot write entry"):
        ResultStore(str(blocker)).save("k1", a_result(tmp_path))


def test_only_the_settings_own_outcomes_are_kept(tmp_path):
    store = ResultStore(str(tmp_path / "store"))
    assert not store.save("k1", a_result(tmp_path, status="timeout"))
    assert not store.save("k2", a_result(tmp_path, status="error"))
    assert store.load("k1", tmp_path) is None


def test_problems_of_the_attempt_are_not_stored(tmp_path):
    store = ResultStore(str(tmp_path / "store"))
    result = a_result(tmp_path)
    result.problems = ["W&B: the run was not logged (offline)"]
    store.save("k1", result)
    assert store.load("k1", tmp_path / "reuse").problems == []


def test_the_key_changes_with_settings_sources_hardware_software_and_run_number(monkeypatch):
    base = run_key(a_run(), "NVIDIA H100 80GB HBM3 driver 580.1")
    assert run_key(a_run(), "NVIDIA H100 80GB HBM3 driver 580.1") == base
    assert run_key(a_run(learning_rate=1e-4), "NVIDIA H100 80GB HBM3 driver 580.1") != base
    assert run_key(a_run(), "NVIDIA H100 80GB HBM3 driver 590.2") != base
    assert run_key(dataclasses.replace(a_run(), run_number=1), "NVIDIA H100 80GB HBM3 driver 580.1") != base
    edited = {"dataset": "mine.jsonl-2f1c", "model": "my-model-9a0b"}
    assert run_key(a_run(), "NVIDIA H100 80GB HBM3 driver 580.1", edited) != base
    versions = dict(store_module.software_versions())
    monkeypatch.setattr(store_module, "software_versions", lambda: {**versions, "liger-kernel": "0.0.1"})
    assert run_key(a_run(), "NVIDIA H100 80GB HBM3 driver 580.1") != base


def test_the_software_in_the_key_names_the_packages_that_change_numbers():
    versions = store_module.software_versions()
    assert {"torch", "triton", "transformers", "trl", "peft", "liger-kernel"} <= set(versions)


def test_a_setting_equal_to_a_secret_is_never_stored_in_clear(tmp_path, monkeypatch):
    secret = "hf_PASTEDtokenVALUE0123456789"
    monkeypatch.setenv("HF_TOKEN", secret)
    result = a_result(tmp_path)
    result.training_args = dataclasses.replace(result.training_args, dataset_name=f"someone/{secret}")
    result.reason = f"could not load someone/{secret}"
    store = ResultStore(str(tmp_path / "store"))
    store.save("k1", result, identity={"training_args": dataclasses.asdict(result.training_args)})
    for path in (tmp_path / "store" / "k1").iterdir():
        assert secret not in path.read_text(), path.name
    assert store.load("k1", tmp_path / "reuse").reason == "could not load someone/[redacted]"
