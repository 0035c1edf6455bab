"""Names and places checked at planning: hub ids by the hub's own shape, local paths and URLs by what the sources
read, no name ever a path component of unbounded length, and output places (the cache, the results store, the
export directory) that cannot take files, whatever the reason (a file in the way, a read-only or full disk)."""

import errno
import json
import tempfile

import pytest

from finetune_bench.inputs.catalog import check_dataset, check_model_name
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.sources.cache import SLUG_PREFIX_CHARS, slug
from finetune_bench.sources.datasets import DatasetSource, dataset_destination, prepare_dataset
from finetune_bench.sources.models import model_destination
from tasks.plan import check_output_locations


@pytest.mark.parametrize(
    "name", ["meta-llama/Llama-3.2-1B", "gpt2", "TinyLlama/TinyLlama-1.1B-intermediate-step-240k-503b", "a" * 96]
)
def test_hub_ids_of_the_hub_s_shape_pass(name):
    check_model_name(name)
    check_dataset(name, "", "train")


@pytest.mark.parametrize(
    "name, message",
    [
        ("a" * 97, "is not a hub id"),
        ("org/" + "b" * 97, "is not a hub id"),
        ("a/b/c", "is not a hub id"),
        ("meta--llama/x", "is not a hub id"),
        ("x.git", "is not a hub id"),
        ("hf://meta-llama/Llama-3.2-1B", "is a hf:// URL, which is not read here"),
        ("", "is empty"),
    ],
)
def test_names_that_are_no_hub_id_are_refused_naming_the_key(name, message):
    for check, key in ((check_model_name, "training_args.model_name"), (lambda n: check_dataset(n, "", "train"), "")):
        with pytest.raises(SpecError, match=message) as caught:
            check(name)
        assert str(caught.value).startswith(key or "training_args.dataset_name")
        assert len(str(caught.value)) < 400, "a long name is cut in the message"


def test_a_relative_path_that_exists_is_a_local_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "2026" / "data").mkdir(parents=True)
    (tmp_path / "runs" / "2026" / "data" / "train.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    check_dataset("runs/2026/data/train.jsonl", "", "train")  # three parts: no hub id, but a file here


def test_a_name_never_becomes_a_path_component_of_unbounded_length(tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path))
    long = "x" * 5000
    name = slug(long, {})
    assert len(name) == SLUG_PREFIX_CHARS + 13 and name.startswith("x" * SLUG_PREFIX_CHARS)
    assert slug(long + "y", {}) != name, "the digest covers the whole name"
    assert model_destination(long).name == name  # (planning refuses it; the path is bounded even so)
    # a name that fits keeps its directory (tests/sources/test_versions.py pins the names users' caches hold)
    assert slug("meta-llama/Llama-3.2-1B", {}) == "meta-llama_Llama-3.2-1B-" + slug("meta-llama/Llama-3.2-1B", {})[-12:]


def test_a_file_url_dataset_is_its_local_path(tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(4)))
    check_dataset(f"file://{data}", "", "train")
    by_url = DatasetSource.of(TrainingArgs(dataset_name=f"file://{data}"))
    by_path = DatasetSource.of(TrainingArgs(dataset_name=str(data)))
    assert dataset_destination(by_url) == dataset_destination(by_path)  # one copy, one store key
    prepared = prepare_dataset(by_url)
    assert json.loads((prepared / "source.json").read_text())["dataset_name"] == str(data)


def _failing_temporary_file(code: int):
    def temporary_file(*args, **kwargs):
        raise OSError(code, __import__("os").strerror(code))

    return temporary_file


@pytest.mark.parametrize(
    "code, shown", [(errno.EROFS, "Read-only file system"), (errno.ENOSPC, "No space left on device")]
)
@pytest.mark.parametrize("variable", ["FINETUNE_BENCH_CACHE_DIR", "FINETUNE_BENCH_EXPORT_DIR"])
def test_an_output_place_on_a_read_only_or_full_disk_is_refused_at_planning(
    variable, code, shown, tmp_path, monkeypatch
):
    """Root may write anywhere and no disk here is full: the filesystem's answer is simulated where planning asks
    it (a file created in the directory)."""
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(variable, str(tmp_path / variable.lower()))
    monkeypatch.setattr(tempfile, "TemporaryFile", _failing_temporary_file(code))
    with pytest.raises(SpecError) as caught:
        check_output_locations("")
    assert f"{variable}: cannot write in '{tmp_path / variable.lower()}' ({shown})" in caught.value.problems


def test_every_output_place_is_named_once_with_its_problem(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(blocker))
    monkeypatch.setenv("FINETUNE_BENCH_EXPORT_DIR", str(blocker / "export"))
    with pytest.raises(SpecError) as caught:
        check_output_locations("")
    assert caught.value.problems == [
        f"FINETUNE_BENCH_CACHE_DIR: {str(blocker)!r} is not a directory (got {str(blocker)!r})",
        f"FINETUNE_BENCH_EXPORT_DIR: {str(blocker)!r} is not a directory (got {str(blocker / 'export')!r})",
    ]  # the default results store, inside the cache directory, is not named a second time
