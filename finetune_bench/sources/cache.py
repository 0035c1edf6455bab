"""The persistent cache that downloads and generated sources are written to.

Never a temporary directory: a cached download task's output path must still exist on the next run.
"""

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

COMPLETE_MARKER = ".complete"


def cache_root() -> Path:
    """Persistent root for downloads and generated sources (`FINETUNE_BENCH_CACHE_DIR` overrides)."""
    root = os.environ.get("FINETUNE_BENCH_CACHE_DIR") or Path.home() / ".cache" / "finetune_bench"
    return Path(root)


def default_results_store() -> Path:
    """Where finished runs are kept when the inputs name no `results_store`."""
    return cache_root() / "results"


def slug(name: str, params: dict) -> str:
    """A readable directory name for a source, unique to its name and parameters."""
    digest = hashlib.sha256(json.dumps([name, params], sort_keys=True).encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name).strip('_')}-{digest}"


def build_into(dest: Path, build: Callable[[Path], None]) -> Path:
    """Run `build(tmpdir)` and move the result to `dest` atomically; reuse a complete `dest`."""
    if (dest / COMPLETE_MARKER).exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        build(tmp)
        (tmp / COMPLETE_MARKER).write_text("")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest
