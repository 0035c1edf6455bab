"""How much the CUDA driver's JIT cache grew in a step: kernels compiled for this GPU for the first time on this
machine, what explains the 1.5-3 s new-shape steps of a first run.

Kernels shipped as PTX (cuDNN's runtime-compiled attention kernels among them) are compiled by the driver when first
loaded, and the result is kept in the JIT cache on disk (`CUDA_CACHE_PATH`, else `~/.nv/ComputeCache`), so every
later process on the machine loads them in milliseconds. On an H200 at Llama-3.2-1B on padded data, the first liger
run on a machine paid 3-7 s more warm-up and three or four steps of 1.4-3.1 s at new lengths, about 0.85 MB of
kernels each; with the same data order, the later runs on the machine none; a later run given an empty cache paid them
again (docs/measurements.md).
No counter of the driver's compilations is exposed, so the cache's size on disk stands for it: read after each
step, outside its time. It is the machine's cache: another process on the machine (the other ranks of a run, a
concurrent run) adds to it too. Nothing is counted without a cache (`CUDA_CACHE_DISABLE=1`), and a full cache
that evicts as it adds can hide a compilation.
"""

import os
from dataclasses import dataclass
from pathlib import Path

# A step or probe during which the cache grew by at least this much compiled kernels (one of a first run's
# compilations was about 0.85 MB; a cache the pods share can grow by a few bytes of another's bookkeeping).
COMPILING_BYTES = 64 * 1024


def jit_cache_dir(environ: dict[str, str] | None = None) -> Path | None:
    """The driver's JIT cache directory as the driver chooses it; None where caching is off."""
    env = os.environ if environ is None else environ
    if env.get("CUDA_CACHE_DISABLE", "0").strip() not in ("", "0"):
        return None
    return Path(env.get("CUDA_CACHE_PATH") or Path.home() / ".nv" / "ComputeCache")


def tree_bytes(root: Path) -> int:
    """The bytes of the files under `root` (0 where there is none yet; a file removed or unreadable while counted
    counts 0: the reading must never stop a run)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


@dataclass
class JitCacheGrowth:
    """The JIT cache's growth since the last `take`, in bytes (`start` first)."""

    root: Path | None = None
    _last: int = 0

    def start(self, root: Path | None) -> bool:
        """Count from now on the cache at `root` (`jit_cache_dir()`); False where there is none to count."""
        self.root = root
        if root is not None:
            self._last = tree_bytes(root)
        return root is not None

    def take(self) -> int | None:
        """The bytes added since the last take (None: nothing counted); a cache that shrank (eviction) added 0."""
        if self.root is None:
            return None
        now = tree_bytes(self.root)
        grown, self._last = max(now - self._last, 0), now
        return grown


def jit_cache_text(grown: int | None) -> str:
    """A step's JIT cache growth in words ("" for none): "the CUDA JIT cache grew 1.2 MB"."""
    if not grown:
        return ""
    return f"the CUDA JIT cache grew {grown / 1e6:.1f} MB (kernels compiled for this GPU the first time here)"
