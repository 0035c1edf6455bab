"""A download's cache version is the code that prepares it: a change to how a dataset or a model is prepared gives the
download tasks another cache key, so a run never trains on a copy that older code prepared."""

import shutil
from pathlib import Path

import finetune_bench.sources as sources
from finetune_bench.sources.cache import (
    DATASET_PREPARATION,
    MODEL_PREPARATION,
    NOT_PREPARATION,
    dataset_catalog,
    preparation_digest,
)

PACKAGE = Path(sources.__file__).resolve().parent
_KINDS = {"dataset": DATASET_PREPARATION, "model": MODEL_PREPARATION}


def test_every_module_of_the_sources_is_said_to_prepare_or_not():
    modules = {path.name for path in PACKAGE.glob("*.py")}
    named = set(DATASET_PREPARATION) | set(MODEL_PREPARATION) | set(NOT_PREPARATION)
    assert modules == named
    assert not set(NOT_PREPARATION) & (set(DATASET_PREPARATION) | set(MODEL_PREPARATION))


def test_a_change_to_the_preparing_code_changes_the_version_and_nothing_else_does(tmp_path):
    copy = tmp_path / "sources"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = {kind: preparation_digest(modules, package=copy) for kind, modules in _KINDS.items()}
    assert before == {kind: preparation_digest(modules) for kind, modules in _KINDS.items()}  # the copy is the code
    assert preparation_digest(MODEL_PREPARATION, {"vocab": 1}) != preparation_digest(MODEL_PREPARATION, {"vocab": 2})
    for module in sorted(set(DATASET_PREPARATION) | set(MODEL_PREPARATION) | set(NOT_PREPARATION)):
        original = (copy / module).read_bytes()
        (copy / module).write_bytes(original + b"\n# changed\n")
        after = {kind: preparation_digest(modules, package=copy) for kind, modules in _KINDS.items()}
        (copy / module).write_bytes(original)
        for kind, modules in _KINDS.items():
            assert (after[kind] != before[kind]) == (module in modules), (module, kind)


def test_the_download_tasks_are_cached_under_their_code_s_version():
    from finetune_bench.inputs.catalog import OFFLINE_TOKENIZER_VOCAB
    from tasks.data import download_dataset, download_model
    from tasks.registration import DOWNLOAD_CACHE_VERSION

    assert download_dataset.metadata.cache_version == (
        f"{DOWNLOAD_CACHE_VERSION}-{preparation_digest(DATASET_PREPARATION, dataset_catalog())}"
    )
    assert download_model.metadata.cache_version == (
        f"{DOWNLOAD_CACHE_VERSION}-{preparation_digest(MODEL_PREPARATION, {'vocab': OFFLINE_TOKENIZER_VOCAB})}"
    )
    assert download_dataset.metadata.cache and download_model.metadata.cache


def test_a_prepared_copy_is_reused_by_the_same_code_and_prepared_again_by_other_code(tmp_path):
    from finetune_bench.sources.cache import build_into

    built = []

    def build(directory):
        built.append(directory)
        (directory / "data.txt").write_text(str(len(built)))

    dest = tmp_path / "prepared"
    build_into(dest, build, version="code-a")
    build_into(dest, build, version="code-a")  # the same code: reused
    assert len(built) == 1
    build_into(dest, build, version="code-b")  # the preparing code changed: prepared again, in place
    assert len(built) == 2 and (dest / "data.txt").read_text() == "2"


def test_a_change_to_a_dataset_s_format_in_the_catalog_changes_the_dataset_version(monkeypatch):
    """The catalog's declarations shape a prepared hub dataset (which format its rows are read as, its default config):
    a change to one prepares the dataset anew, a change elsewhere in the catalog leaves the version as it is."""
    from finetune_bench.inputs import catalog
    from finetune_bench.sources.cache import dataset_preparation_version, model_preparation_version

    before, model = dataset_preparation_version(), model_preparation_version()
    changed = {**catalog.HUB_DATASETS, "tatsu-lab/alpaca": catalog.HubDataset("oasst", (), ("train",))}
    monkeypatch.setattr(catalog, "HUB_DATASETS", changed)
    assert dataset_preparation_version() != before
    assert model_preparation_version() == model
    monkeypatch.undo()
    monkeypatch.setattr(catalog, "SYNTHETIC_FORMATS", (*catalog.SYNTHETIC_FORMATS, "another"))
    assert dataset_preparation_version() != before
    monkeypatch.undo()
    monkeypatch.setattr(catalog, "MAX_NAME_CHARS", catalog.MAX_NAME_CHARS + 1)  # shapes no prepared dataset
    assert dataset_preparation_version() == before
