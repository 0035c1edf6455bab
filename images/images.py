"""ImageSpec definitions.

Environment variables (read when the workflow is registered or run remotely):
- FINETUNE_BENCH_IMAGE_BUILDER: ImageSpec builder; "union" on Union (the default), "default" for
  flytekit's local Docker builder.
- FINETUNE_BENCH_IMAGE_REGISTRY: registry to push to (not needed with the union builder).
"""

import hashlib
import os
import re
from pathlib import Path

from flytekit import ImageSpec

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOCK_FILE = PROJECT_ROOT / "requirements.lock"
BUILDER = os.environ.get("FINETUNE_BENCH_IMAGE_BUILDER", "union")
REGISTRY = os.environ.get("FINETUNE_BENCH_IMAGE_REGISTRY")
PYTHON_VERSION = "3.11"
# Read by the environment record of every run (`finetune_bench.measuring.environment.lock_digest`).
LOCK_DIGEST_ENV = "FINETUNE_BENCH_LOCK_SHA256"


def locked_packages() -> list[str]:
    """Every `name==version` pin of the lockfile (`make lock` writes it from pyproject.toml), the same pins
    `make` and CI install from."""
    pins = re.findall(r"^([A-Za-z0-9_.\-]+==[^\s;#]+)", LOCK_FILE.read_text(), flags=re.M)
    if not pins:
        raise RuntimeError(f"{LOCK_FILE} pins no package: run `make lock`")
    return pins


def _name(pin: str) -> str:
    return re.split(r"[=<>!~ ;\[]", pin, maxsplit=1)[0].lower().replace("_", "-")


LOCK_DIGEST = hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()


# torch from PyPI ships its CUDA runtime as nvidia-* wheels; Triton compiles a small launcher
# with the system C compiler at run time, hence build-essential.
training_image = ImageSpec(
    name="finetune-bench-train",
    builder=BUILDER,
    registry=REGISTRY,
    python_version=PYTHON_VERSION,
    apt_packages=["build-essential", "git"],
    packages=locked_packages(),
    source_root=str(PROJECT_ROOT),
    copy=["pyproject.toml", "README.md", "finetune_bench"],
    commands=["uv pip install --no-deps /root"],
    env={"TOKENIZERS_PARALLELISM": "false", "HF_HUB_ENABLE_HF_TRANSFER": "0", LOCK_DIGEST_ENV: LOCK_DIGEST},
)

# The analysis task needs no GPU stack (it never imports torch, a tested property): the same pins minus the
# training stack and what needs torch keeps it light.
TRAINING_ONLY = ("torch", "triton", "trl", "liger-kernel", "accelerate", "peft", "bitsandbytes")
analysis_image = ImageSpec(
    name="finetune-bench-analysis",
    builder=BUILDER,
    registry=REGISTRY,
    python_version=PYTHON_VERSION,
    packages=[pin for pin in locked_packages() if _name(pin) not in TRAINING_ONLY],
    source_root=str(PROJECT_ROOT),
    copy=["pyproject.toml", "README.md", "finetune_bench"],
    commands=["uv pip install --no-deps /root"],
    env={LOCK_DIGEST_ENV: LOCK_DIGEST},
)
