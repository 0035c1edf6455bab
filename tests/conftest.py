"""Keep every test's side effects (Flyte sandboxes and local cache, model/data cache) in one temp tree."""

import os
import tempfile
from pathlib import Path

# Before anything imports flytekit: its local cache lives under ~/.flyte, its sandboxes under TMPDIR.
_ROOT = Path(tempfile.mkdtemp(prefix="finetune-bench-tests-"))
for name in ("home", "tmp", "cache"):
    (_ROOT / name).mkdir()
os.environ["HOME"] = str(_ROOT / "home")
os.environ["TMPDIR"] = str(_ROOT / "tmp")
os.environ["FINETUNE_BENCH_CACHE_DIR"] = str(_ROOT / "cache")
os.environ.setdefault("FINETUNE_BENCH_IMAGE_BUILDER", "default")
# pyflyte refuses to run, even locally, without a config once `union` is installed (read at import).
os.environ.setdefault("FLYTECTL_CONFIG", str(Path(__file__).resolve().parent.parent / "flyte-local.yaml"))
os.environ.pop("FINETUNE_BENCH_FAULT", None)
# No W&B server here: tests that plant a fake key must not make every run wait for W&B to time out.
os.environ["WANDB_MODE"] = "offline"
tempfile.tempdir = None

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def test_root() -> Path:
    return _ROOT


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from finetune_bench import sources

    return sources.prepare_model("random:tiny-llama")


@pytest.fixture(scope="session")
def tiny_dataset_dir() -> Path:
    from finetune_bench import sources

    return sources.prepare_dataset("synthetic:alpaca", synthetic_num_examples=64)
