"""What a grid's model and dataset are, as versions: stable names of their content for the results store's key,
and keys for Flyte's download cache.

A cache key is what is downloaded (the source, its parameters and, for a local source, its content); the download
tasks add the version of the code that prepares it (`cache.preparation_digest`) as their cache version. On a cluster
that is all it is: a cached download's output lives in the execution's blob store, whichever pod asks. In a local
run a cached output is the prepared copy's path on this machine, so there the key also changes when that copy is
gone (a deleted cache directory): a cached download never points at nothing or at stale data."""

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path

from finetune_bench.inputs.catalog import RANDOM_PREFIX
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.sources.cache import COMPLETE_MARKER
from finetune_bench.sources.datasets import DatasetSource, dataset_destination
from finetune_bench.sources.models import model_destination


@dataclass
class SourceVersions:
    """`dataset` / `model`: what the sources hold (a prepared copy's name: its source, parameters and, for a
    local source, content; for a local model used in place, a fingerprint of its files). `*_cache_key`: the
    same in a cluster run; in a local run plus a one-off nonce when the prepared copy is missing, so that Flyte's
    local cache runs the download again instead of returning a path that no longer exists."""

    dataset: str = ""
    model: str = ""
    dataset_cache_key: str = ""
    model_cache_key: str = ""


def files_fingerprint(directory: Path) -> str:
    """A hash of every file's name, size and modification time below `directory` (cheap for model weights
    of many GB; any edit changes it)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(directory)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _cache_key(version: str, prepared: Path, local: bool) -> str:
    if not local or (prepared / COMPLETE_MARKER).exists():
        return version
    return f"{version}#missing-{uuid.uuid4().hex[:8]}"


def source_versions(training_args: TrainingArgs, local: bool = True) -> SourceVersions:
    """The versions of `training_args`' dataset and model (reads local sources, downloads nothing); `local`: for
    a local run's cache (see the module's docstring)."""
    t = training_args
    dataset = dataset_destination(DatasetSource.of(t))
    model = model_destination(t.model_name)
    # a local directory is used in place (not prepared into the cache): its files are what it holds
    local_model = not t.model_name.startswith(RANDOM_PREFIX) and Path(t.model_name).expanduser().is_dir()
    model_version = f"{model.name}-{files_fingerprint(model)}" if local_model else model.name
    return SourceVersions(
        dataset=dataset.name,
        model=model_version,
        dataset_cache_key=_cache_key(dataset.name, dataset, local),
        model_cache_key=model_version if local_model else _cache_key(model_version, model, local),
    )
