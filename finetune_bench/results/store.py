"""Finished runs, kept so that a re-run of the same grid does not measure them again.

A run's key is a hash of everything that decides its outcome: its full training settings, its run number,
the hardware it runs on (GPU model and driver), the versions of the software that changes the numbers
(`software_versions`) and this package's measuring code (any change to either measures afresh).
The store is a directory (local, or any fsspec URL such as `s3://bucket/prefix` on a cluster) with one
folder per key: the result record, the per-step table, and a manifest with both files' checksums, written
last. Every file is written under a temporary name and moved into place, so an entry is either complete
(its manifest lists files that match it) or ignored; an entry whose files do not match its manifest
(edited, cut short) is `CorruptEntry`, reported and measured again. Only outcomes of the settings
themselves are kept (`ok`, `oom`, `nonfinite`); an `error` or a `timeout` may be the machine's fault and
runs again.
"""

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import logging
import uuid
from pathlib import Path

import fsspec

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.secrets import redact
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.inputs.software_sets import parse as software_pins
from finetune_bench.measuring.gpu import driver_version, gpu_names
from finetune_bench.measuring.profiling import PROFILE_DIR, PROFILE_FILE
from finetune_bench.results.record import NONFINITE, OK, OOM, RankSummary, RunResult

logger = logging.getLogger(__name__)

REUSABLE_STATUSES = (OK, OOM, NONFINITE)
RESULT_NAME, STEPS_NAME, MANIFEST_NAME = "result.json", "steps.csv", "manifest.json"
# The packages whose versions change what a run measures; with them every CUDA runtime package.
NUMBER_CHANGING_PACKAGES = (
    "torch",
    "triton",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "liger-kernel",
    "datasets",
    "tokenizers",
    "bitsandbytes",
)


class StoreError(RuntimeError):
    """The results store could not be read or written; the message says which entry and why."""


class CorruptEntry(StoreError):
    """A store entry whose files do not match its manifest (edited or cut short): never reused."""


def hardware_fingerprint() -> str:
    """The GPUs this process may use, by name, and their driver (through NVML: no CUDA context is
    created), or `cpu`."""
    names = sorted(set(gpu_names()))
    return f"{','.join(names)} driver {driver_version()}" if names else "cpu"


@functools.cache
def software_versions() -> dict[str, str]:
    """The installed versions of `NUMBER_CHANGING_PACKAGES` and of every CUDA runtime package."""
    versions = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in NUMBER_CHANGING_PACKAGES or name.startswith(("nvidia-", "cuda-")):
            versions[name] = dist.version
    return dict(sorted(versions.items()))


# The parts of the package that decide what a run measures (its settings, data, model, training and
# measuring code, and the record it writes); the analysis and the report are not among them, so editing a
# figure never makes a stored run measure again.
MEASURING_CODE = ("inputs", "sources", "measuring", "running", "results", "architectures")


@functools.cache
def source_digest() -> str:
    """A hash of the package's measuring code and bundled files (`MEASURING_CODE`)."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    paths = (p for part in MEASURING_CODE for p in (package / part).rglob("*") if p.suffix in (".py", ".json"))
    for path in sorted(paths):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def run_identity(run: PlannedRun, hardware: str, sources: dict[str, str] | None = None) -> dict:
    """Everything that decides a run's outcome (what its key hashes, kept in its manifest); `sources`: the
    versions of the dataset and the model (a local source's content among them)."""
    return {
        "training_args": dataclasses.asdict(run.training_args),
        "sources": dict(sources or {}),
        "run_number": run.run_number,
        "hardware": hardware,
        # the installed releases, those of the run's software set in their place (a run imports them or fails)
        "software": {**software_versions(), **software_pins(run.training_args.software_set)},
        "source": source_digest(),
    }


def identity_key(identity: dict) -> str:
    """The store key of a run's identity (`run_identity`)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def run_key(run: PlannedRun, hardware: str, sources: dict[str, str] | None = None) -> str:
    """The store key of `run` on `hardware` with `sources`: a hash of `run_identity`."""
    return identity_key(run_identity(run, hardware, sources))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Writes of one entry before a save gives up on writers that keep mixing its files.
WRITE_ATTEMPTS = 3


def _check_identity(key: str, stored: dict, identity: dict) -> None:
    """The identity a manifest records is the run's (as it was written: redacted, through JSON), else
    `CorruptEntry` naming the parts that differ."""
    expected = json.loads(json.dumps(redact(identity), sort_keys=True))
    differs = sorted(part for part in set(stored) | set(expected) if stored.get(part) != expected.get(part))
    if differs:
        detail = [
            f"{part}.{name}"
            for part in differs
            if isinstance(stored.get(part), dict) and isinstance(expected.get(part), dict)
            for name in sorted(set(stored[part]) | set(expected[part]))
            if stored[part].get(name) != expected[part].get(name)
        ]
        raise CorruptEntry(
            f"entry {key}: its manifest records another run (differs in {', '.join(detail[:5] or differs)}): stored "
            "under a key that is not its own"
        )


class ResultStore:
    """Finished runs under one directory or fsspec URL, one folder per run key."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self._fs, self._root = fsspec.core.url_to_fs(self.url)

    def _path(self, key: str, name: str) -> str:
        return f"{self._root}/{key}/{name}"

    def load(self, key: str, local_dir: Path, identity: dict | None = None) -> RunResult | None:
        """The stored result of `key` (its steps copied into `local_dir`); None when the store has no complete
        entry for it. Raises `CorruptEntry` for an entry that does not match its manifest, or whose manifest records
        another run's identity than `identity` (an entry copied or written under another key: its checksums hold,
        its inputs or software are not this run's), `StoreError` when the store cannot be read."""
        try:
            if not self._fs.exists(self._path(key, MANIFEST_NAME)):
                return None
            manifest_bytes = self._fs.cat_file(self._path(key, MANIFEST_NAME))
            contents = {}
            try:
                manifest = json.loads(manifest_bytes)
                if identity is not None and manifest.get("identity"):
                    _check_identity(key, manifest["identity"], identity)
                for name, checksum in manifest["sha256"].items():
                    if name not in (RESULT_NAME, STEPS_NAME, PROFILE_FILE):
                        raise CorruptEntry(f"entry {key}: its manifest lists an unknown file {name!r}")
                    if not self._fs.exists(self._path(key, name)):
                        raise CorruptEntry(f"entry {key}: {name} is missing")
                    contents[name] = self._fs.cat_file(self._path(key, name))
                    if _sha256(contents[name]) != checksum:
                        raise CorruptEntry(f"entry {key}: {name} does not match its checksum (edited or cut short)")
                record = json.loads(contents[RESULT_NAME])
                record["training_args"] = TrainingArgs(**record["training_args"])
                record["ranks"] = [RankSummary(**rank) for rank in record.get("ranks", [])]
                result = RunResult(**record)
            except CorruptEntry:
                raise
            except (ValueError, KeyError, TypeError) as exc:  # unparsable JSON, a missing or unknown field
                raise CorruptEntry(f"entry {key}: unreadable ({type(exc).__name__}: {exc})") from None
        except CorruptEntry:
            raise
        except OSError as exc:
            raise StoreError(f"cannot read entry {key} of {self.url}: {type(exc).__name__}: {exc}") from None
        result.steps_file = result.profile_dir = ""
        if STEPS_NAME in contents:
            local_dir.mkdir(parents=True, exist_ok=True)
            steps = local_dir / STEPS_NAME
            steps.write_bytes(contents[STEPS_NAME])
            result.steps_file = str(steps)
        if PROFILE_FILE in contents:  # the per-kernel table; the trace and the memory snapshot are not kept
            profile = local_dir / PROFILE_DIR
            profile.mkdir(parents=True, exist_ok=True)
            (profile / PROFILE_FILE).write_bytes(contents[PROFILE_FILE])
            result.profile_dir = str(profile)
        return result

    def save(self, key: str, result: RunResult, identity: dict | None = None) -> bool:
        """Keep `result` if its outcome is the settings' own; True if kept. Raises `StoreError` when it cannot
        be written (the entry is then left without a manifest, so it is never reused)."""
        if result.status not in REUSABLE_STATUSES:
            return False
        # A setting equal to a secret's value (a token pasted where a name belongs) is never written in clear.
        record = redact(dataclasses.asdict(result))
        record["problems"] = []  # what went wrong around the measurement belongs to that attempt, not the run
        files = {RESULT_NAME: json.dumps(record).encode()}
        if result.steps_file and Path(result.steps_file).exists():
            files[STEPS_NAME] = Path(result.steps_file).read_bytes()
        if result.profile_dir and (Path(result.profile_dir) / PROFILE_FILE).exists():
            files[PROFILE_FILE] = (Path(result.profile_dir) / PROFILE_FILE).read_bytes()
        manifest = {"sha256": {name: _sha256(data) for name, data in files.items()}, "identity": redact(identity or {})}
        try:
            self._fs.makedirs(f"{self._root}/{key}", exist_ok=True)
            if self._fs.exists(self._path(key, MANIFEST_NAME)):  # replacing an entry: unlist it first
                self._fs.rm_file(self._path(key, MANIFEST_NAME))
            manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
            for _attempt in range(WRITE_ATTEMPTS):
                for name, data in [*files.items(), (MANIFEST_NAME, manifest_bytes)]:
                    self._write_atomically(self._path(key, name), data)
                if self._complete(key):
                    break
                # Another grid wrote this entry at the same time (on another machine: the device lock is per
                # machine), and its files and this one's got mixed: written again, whole, so that no entry is left
                # mixed (and one that was is never reused: its checksums fail).
                logger.warning("entry %s was written by another grid at the same time; writing it again", key)
            else:
                raise StoreError(
                    f"cannot write entry {key} to {self.url}: other writers kept mixing its files ({WRITE_ATTEMPTS} "
                    "tries)"
                )
        except OSError as exc:
            raise StoreError(f"cannot write entry {key} to {self.url}: {type(exc).__name__}: {exc}") from None
        return True

    def _complete(self, key: str) -> bool:
        """Whether the entry's files match its manifest (whoever wrote them: a concurrent writer's whole entry is as
        good as this one's, the same run measured)."""
        try:
            manifest = json.loads(self._fs.cat_file(self._path(key, MANIFEST_NAME)))
            return all(
                _sha256(self._fs.cat_file(self._path(key, name))) == checksum
                for name, checksum in manifest["sha256"].items()
            )
        except (OSError, ValueError, KeyError):
            return False

    def _write_atomically(self, path: str, data: bytes) -> None:
        """Write under a temporary name, then move into place: a reader never sees a partial file."""
        temporary = f"{path}.{uuid.uuid4().hex}.partial"
        try:
            self._fs.pipe_file(temporary, data)
            self._fs.mv(temporary, path)
        finally:
            if self._fs.exists(temporary):
                self._fs.rm_file(temporary)
