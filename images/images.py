"""ImageSpec definitions.

Environment variables (read when the workflow is registered or run remotely):
- FINETUNE_BENCH_IMAGE_BUILDER: ImageSpec builder; "union" on Union (the default), "default" for
  flytekit's local Docker builder.
- FINETUNE_BENCH_IMAGE_REGISTRY: registry to push to (not needed with the union builder).
"""

import os
import tomllib
from pathlib import Path

from flytekit import ImageSpec

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BUILDER = os.environ.get("FINETUNE_BENCH_IMAGE_BUILDER", "union")
REGISTRY = os.environ.get("FINETUNE_BENCH_IMAGE_REGISTRY")
PYTHON_VERSION = "3.11"


def project_dependencies() -> list[str]:
    """The package's runtime dependencies, read from pyproject.toml (their single source)."""
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


# torch from PyPI ships its CUDA runtime as nvidia-* wheels; Triton compiles a small launcher
# with the system C compiler at run time, hence build-essential.
training_image = ImageSpec(
    name="finetune-bench-train",
    builder=BUILDER,
    registry=REGISTRY,
    python_version=PYTHON_VERSION,
    apt_packages=["build-essential", "git"],
    packages=project_dependencies(),
    source_root=str(PROJECT_ROOT),
    copy=["pyproject.toml", "README.md", "finetune_bench"],
    commands=["uv pip install --no-deps /root"],
    env={"TOKENIZERS_PARALLELISM": "false", "HF_HUB_ENABLE_HF_TRANSFER": "0"},
)

# The analysis task needs no GPU stack beyond what imports the result records: the same
# dependencies minus the training-only ones keeps it light.
_TRAINING_ONLY = ("torch", "triton", "trl", "liger-kernel", "accelerate", "flytekitplugins-wandb")
analysis_image = ImageSpec(
    name="finetune-bench-analysis",
    builder=BUILDER,
    registry=REGISTRY,
    python_version=PYTHON_VERSION,
    packages=[dep for dep in project_dependencies() if not dep.startswith(_TRAINING_ONLY)],
    source_root=str(PROJECT_ROOT),
    copy=["pyproject.toml", "README.md", "finetune_bench"],
    commands=["uv pip install --no-deps /root"],
)
