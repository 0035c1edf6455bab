"""The persistent cache that downloads and generated sources are written to.

Never a temporary directory: a cached download task's output path must still exist on the next run.
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

COMPLETE_MARKER = ".complete"
CACHE_DIR_ENV = "FINETUNE_BENCH_CACHE_DIR"


def cache_root() -> Path:
    """Persistent root for downloads and generated sources (`FINETUNE_BENCH_CACHE_DIR` overrides)."""
    root = os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "finetune_bench"
    return Path(root)


def cache_root_key() -> str:
    """How a message names the cache directory: its variable, or where the default comes from."""
    return CACHE_DIR_ENV if os.environ.get(CACHE_DIR_ENV) else f"the cache directory (default; set {CACHE_DIR_ENV})"


def default_results_store() -> Path:
    """Where finished runs are kept when the inputs name no `results_store`."""
    return cache_root() / "results"


# The most characters of a slug's readable part: with the digest and `build_into`'s temporary prefix and suffix the
# directory name stays far below the 255 bytes a filesystem takes for one name, whatever the source is called.
SLUG_PREFIX_CHARS = 160


def slug(name: str, params: dict) -> str:
    """A readable directory name for a source, unique to its name and parameters: the name (made safe for a path,
    cut to `SLUG_PREFIX_CHARS`; the digest covers all of it) and a digest of the name and parameters. A name that
    fits keeps the directory it always had."""
    digest = hashlib.sha256(json.dumps([name, params], sort_keys=True).encode()).hexdigest()[:12]
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:SLUG_PREFIX_CHARS]
    return f"{readable}-{digest}"


# The modules of this package whose code shapes what a prepared dataset or model holds (`preparation_digest`); the
# others shape neither (`versions.py` names what is prepared, `__init__.py` says what the stage owns). A module added
# here belongs in one of the lists: tests/sources/test_preparation.py checks that each is named.
DATASET_PREPARATION = ("cache.py", "datasets.py", "formats.py", "synthetic.py")
MODEL_PREPARATION = ("cache.py", "models.py", "synthetic.py")
NOT_PREPARATION = ("__init__.py", "versions.py", "software.py")


def preparation_digest(modules: tuple[str, ...], extra: object = None, package: Path | None = None) -> str:
    """A hash of the source of `modules` (files of this package, or of `package`) and of `extra` (values from
    elsewhere that shape the prepared output): a prepared copy's code version, which changes when that code does."""
    package = package or Path(__file__).resolve().parent
    digest = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
    for name in sorted(set(modules)):
        digest.update(f"\0{name}\0".encode())
        digest.update((package / name).read_bytes())
    return digest.hexdigest()[:16]


def dataset_preparation_version() -> str:
    """The version of the code that prepares a dataset (`DATASET_PREPARATION`, and the catalog's entries that shape a
    prepared one: `dataset_catalog`)."""
    return preparation_digest(DATASET_PREPARATION, dataset_catalog())


def dataset_catalog() -> dict:
    """What `finetune_bench.inputs.catalog` declares that shapes a prepared dataset: each known hub dataset's format,
    configs (the default first) and splits, the generated formats and their length distributions. A change to one
    (a hub id given another format, say) prepares the datasets anew."""
    from finetune_bench.inputs.catalog import HUB_DATASETS, SYNTHETIC_FORMATS, SYNTHETIC_LENGTH_DISTRIBUTIONS

    return {
        "hub_datasets": {name: dataclasses.asdict(entry) for name, entry in sorted(HUB_DATASETS.items())},
        "synthetic_formats": list(SYNTHETIC_FORMATS),
        "length_distributions": list(SYNTHETIC_LENGTH_DISTRIBUTIONS),
    }


def model_preparation_version() -> str:
    """The version of the code that prepares a model (`MODEL_PREPARATION`, and the offline tokenizer's size)."""
    from finetune_bench.inputs.catalog import OFFLINE_TOKENIZER_VOCAB

    return preparation_digest(MODEL_PREPARATION, {"vocab": OFFLINE_TOKENIZER_VOCAB})


def build_into(dest: Path, build: Callable[[Path], None], version: str = "") -> Path:
    """Run `build(tmpdir)` and move the result to `dest` atomically; reuse a complete `dest` built by the same
    `version` of the preparing code (`preparation_digest`; kept in the completion marker), build it anew otherwise."""
    marker = dest / COMPLETE_MARKER
    if marker.exists() and marker.read_text() == version:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        build(tmp)
        (tmp / COMPLETE_MARKER).write_text(version)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest
