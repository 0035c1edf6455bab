"""ImageSpec definitions.

Environment variables (read when the workflow is registered or run remotely; the registry is also handed to every
pod through `tasks.registration.REGISTRATION_ENV`, as it is part of the images' ids):
- FINETUNE_BENCH_IMAGE_BUILDER: ImageSpec builder; "union" on Union (the default), "default" for
  flytekit's local Docker builder.
- FINETUNE_BENCH_IMAGE_REGISTRY: registry to push to (not needed with the union builder).

What an image holds: the lockfile's pins, and the project's files (`source_copy_mode` ALL: every file git does not
ignore, less what `.dockerignore` leaves out) copied to /root and installed there. The files are found from this
module's own place, so the working directory is never part of the definition, and the image's tag is a digest of
their contents (no cache file or path in it).

A pod imports this module too (each task's module imports it), from /root: it reads the same lockfile and
pyproject.toml there, which the image holds, and so defines the same specs. A dynamic node finds its sub-tasks'
images by the spec's `id` among the images registration built, so the id must not depend on the machine: it is
computed before `source_root` (the checkout's path here, /root in a pod) is set.
"""

import hashlib
import os
import re
import tomllib
from pathlib import Path

from flytekit import ImageSpec
from flytekit.constants import CopyFileDetection

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOCK_FILE = PROJECT_ROOT / "requirements.lock"
PYPROJECT = PROJECT_ROOT / "pyproject.toml"
BUILDER_ENV = "FINETUNE_BENCH_IMAGE_BUILDER"
REGISTRY_ENV = "FINETUNE_BENCH_IMAGE_REGISTRY"
BUILDER = os.environ.get(BUILDER_ENV, "union")
REGISTRY = os.environ.get(REGISTRY_ENV) or None
PYTHON_VERSION = "3.11"
# Read by the environment record of every run (`finetune_bench.measuring.environment.lock_digest`).
LOCK_DIGEST_ENV = "FINETUNE_BENCH_LOCK_SHA256"
# The optional extras of pyproject.toml the training image installs beside the lock: the switchback arm's
# bitsandbytes (CUDA only, so not in the lock that CPU machines install).
TRAINING_EXTRAS = ("switchback",)


def locked_packages() -> list[str]:
    """Every `name==version` pin of the lockfile (`make lock` writes it from pyproject.toml), the same pins
    `make` and CI install from."""
    pins = re.findall(r"^([A-Za-z0-9_.\-]+==[^\s;#]+)", LOCK_FILE.read_text(), flags=re.M)
    if not pins:
        raise RuntimeError(f"{LOCK_FILE} pins no package: run `make lock`")
    return pins


def extra_packages(extras: tuple[str, ...]) -> list[str]:
    """The pinned requirements of pyproject.toml's optional `extras`."""
    optional = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    return [requirement for extra in extras for requirement in optional[extra]]


def _name(pin: str) -> str:
    return re.split(r"[=<>!~ ;\[]", pin, maxsplit=1)[0].lower().replace("_", "-")


LOCK_DIGEST = hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()


def _project_image(name: str, packages: list[str], env: dict[str, str], apt_packages: list[str] | None = None):
    spec = ImageSpec(
        name=name,
        builder=BUILDER,
        registry=REGISTRY,
        python_version=PYTHON_VERSION,
        apt_packages=apt_packages,
        packages=packages,
        source_copy_mode=CopyFileDetection.ALL,
        commands=["uv pip install --no-deps /root"],
        env={**env, LOCK_DIGEST_ENV: LOCK_DIGEST},
    )
    # The id first, while the spec holds nothing of this machine; then where its files are (see the docstring).
    spec.id  # noqa: B018
    spec.source_root = str(PROJECT_ROOT)
    return spec


# torch from PyPI ships its CUDA runtime as nvidia-* wheels; Triton compiles a small launcher
# with the system C compiler at run time, hence build-essential.
TRAINING_NAME = "finetune-bench-train"
TRAINING_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_ENABLE_HF_TRANSFER": "0"}
TRAINING_APT = ["build-essential", "git"]
training_image = _project_image(
    TRAINING_NAME,
    packages=[*locked_packages(), *extra_packages(TRAINING_EXTRAS)],
    env=TRAINING_ENV,
    apt_packages=TRAINING_APT,
)


def software_set_image(pins: dict[str, str]) -> ImageSpec:
    """The training image of a software set (`finetune_bench.inputs.software_sets`): the training image's packages
    with the set's pins in place of the lockfile's versions of those packages. Its name says the set, its tag is a
    digest of what it holds: the same set, the same image."""
    packages = [pin for pin in training_image.packages if _name(pin) not in pins]
    packages += [f"{name}=={version}" for name, version in pins.items()]
    said = re.sub(r"[^a-z0-9.]+", "-", ",".join(f"{n}-{v}" for n, v in pins.items()).lower()).strip("-")
    return _project_image(f"{TRAINING_NAME}-{said}"[:120], packages, TRAINING_ENV, TRAINING_APT)


# The analysis task needs no GPU stack (it never imports torch, a tested property): the same pins minus the
# training stack and what needs torch keeps it light.
TRAINING_ONLY = (
    "torch",
    "triton",
    "trl",
    "liger-kernel",
    "cut-cross-entropy",
    "torchao",
    "accelerate",
    "peft",
    "bitsandbytes",
)
analysis_image = _project_image(
    "finetune-bench-analysis",
    packages=[pin for pin in locked_packages() if _name(pin) not in TRAINING_ONLY],
    env={},
)
