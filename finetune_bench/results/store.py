"""Finished runs, kept so that a re-run of the same grid does not measure them again.

A run's key is a hash of everything that decides its outcome: its full training settings, its run
number, the hardware it runs on and this package's measuring code (any change to it measures afresh;
see `MEASURING_CODE`).
The store is a directory (local, or any fsspec URL such as `s3://bucket/prefix` on a cluster) with
one folder per key holding the result record and the per-step table. Only outcomes of the settings
themselves are kept (`ok`, `oom`, `nonfinite`); an `error` or a `timeout` may be the machine's
fault and runs again.
"""

import dataclasses
import functools
import hashlib
import json
import logging
from pathlib import Path

import fsspec

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.gpu import gpu_names
from finetune_bench.results.record import NONFINITE, OK, OOM, RunResult

logger = logging.getLogger(__name__)

REUSABLE_STATUSES = (OK, OOM, NONFINITE)
RESULT_NAME, STEPS_NAME = "result.json", "steps.csv"


def hardware_fingerprint() -> str:
    """The GPUs this process may use, by name (through NVML: no CUDA context is created), or `cpu`."""
    return ",".join(sorted(set(gpu_names()))) or "cpu"


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


def run_key(run: PlannedRun, hardware: str) -> str:
    identity = {
        "training_args": dataclasses.asdict(run.training_args),
        "run_number": run.run_number,
        "hardware": hardware,
        "source": source_digest(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


class ResultStore:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self._fs, self._root = fsspec.core.url_to_fs(self.url)

    def _path(self, key: str, name: str) -> str:
        return f"{self._root}/{key}/{name}"

    def load(self, key: str, local_dir: Path) -> RunResult | None:
        """The stored result of `key` (its steps copied into `local_dir`), or None."""
        if not self._fs.exists(self._path(key, RESULT_NAME)):
            return None
        record = json.loads(self._fs.cat_file(self._path(key, RESULT_NAME)))
        record["training_args"] = TrainingArgs(**record["training_args"])
        result = RunResult(**record)
        result.steps_file = ""
        if self._fs.exists(self._path(key, STEPS_NAME)):
            local_dir.mkdir(parents=True, exist_ok=True)
            steps = local_dir / STEPS_NAME
            self._fs.get_file(self._path(key, STEPS_NAME), str(steps))
            result.steps_file = str(steps)
        return result

    def save(self, key: str, result: RunResult) -> bool:
        """Keep `result` if its outcome is the settings' own; True if kept."""
        if result.status not in REUSABLE_STATUSES:
            return False
        self._fs.makedirs(f"{self._root}/{key}", exist_ok=True)
        if result.steps_file and Path(result.steps_file).exists():
            self._fs.put_file(result.steps_file, self._path(key, STEPS_NAME))
        # The record last: a key with a record is complete.
        self._fs.pipe_file(self._path(key, RESULT_NAME), json.dumps(dataclasses.asdict(result)).encode())
        return True
