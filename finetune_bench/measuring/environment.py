"""Where and with what a run happened: host, Python, the versions of the packages that change the numbers and of
this project (with its git commit where it runs from a checkout), the GPU and its driver, and the lockfile the
software was installed from."""

import hashlib
import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from finetune_bench.measuring.gpu import driver_version

if TYPE_CHECKING:
    import torch

# The lockfile every install is made from (`make lock` refreshes it), at the root of a checkout.
LOCK_FILE = Path(__file__).resolve().parents[2] / "requirements.lock"
# Set in the images (built from the same lockfile) to its hash, for an installed copy that has no checkout.
LOCK_DIGEST_ENV = "FINETUNE_BENCH_LOCK_SHA256"


def lock_digest() -> str:
    """The sha256 of the lockfile this software was installed from: the checkout's, else the image's
    (`LOCK_DIGEST_ENV`); `none` when neither is known."""
    if LOCK_FILE.is_file():
        return hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()
    return os.environ.get(LOCK_DIGEST_ENV) or "none"


# This project's distribution, whose version every run records.
PROJECT = "finetune-bench"


def code_commit() -> str:
    """The git commit of the checkout this code runs from ("<12 hex digits>", "+ local changes" where tracked files
    differ from it); "" where it does not run from a git checkout (an image holds the files, not the repository)."""
    root = LOCK_FILE.parent
    if not (root / ".git").exists():
        return ""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{head[:12]}{' + local changes' if changes else ''}" if head else ""


# The packages whose versions change the numbers, recorded with every run (and shown by the report).
RECORDED_PACKAGES = (
    "torch",
    "triton",
    "transformers",
    "trl",
    "peft",
    "liger-kernel",
    "cut-cross-entropy",
    "torchao",
    "bitsandbytes",  # SwitchBack's layers
    "datasets",
    "accelerate",
)


def environment(device: "torch.device") -> dict[str, str]:
    """Where and with what a run happened."""
    import importlib.metadata as md

    import torch

    env = {
        "hostname": platform.node(),
        "python": platform.python_version(),
        "device_type": device.type,
        "lock_sha256": lock_digest(),
    }
    for package in (*RECORDED_PACKAGES, PROJECT):
        try:
            env[package] = md.version(package)
        except md.PackageNotFoundError:
            env[package] = "not installed"
    if commit := code_commit():
        env["code_commit"] = commit
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu_name=props.name,
            gpu_count=str(torch.cuda.device_count()),
            gpu_memory_bytes=str(props.total_memory),
            cuda=str(torch.version.cuda),
        )
        env["driver"] = driver_version()
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env
