"""How much the machine's kernel caches on disk grew in a step: kernels compiled for this GPU for the first time on
this machine, what explains a first run's slow steps.

Two caches keep what a first run compiles, so that every later process on the machine loads it in milliseconds:

- the CUDA driver's JIT cache (`CUDA_CACHE_PATH`, else `~/.nv/ComputeCache`): kernels shipped as PTX (cuDNN's
  runtime-compiled attention kernels among them), compiled by the driver when first loaded. On an H200 at
  Llama-3.2-1B on padded data, the first liger run on a machine paid 3-7 s more warm-up and three or four steps of
  1.4-3.1 s at new lengths, about 0.85 MB of kernels each; with the same data order, the later runs on the machine
  none; a later run given an empty cache paid them again (docs/measurements.md);
- Triton's cache (`TRITON_CACHE_DIR`, else `~/.triton/cache`): Liger's kernels, compiled for each new
  specialisation of their arguments. On an H200 the first liger run on a machine spent 1.95 s compiling 7 kernels in
  its first step and 0.17-0.31 s a kernel in three timed steps; a later run loaded the same kernels from the cache in
  0.41 s and 1-3 ms (`measuring.triton_compiles` counts both a compilation and a load; only a compilation writes).

No counter of the driver's compilations is exposed, so the caches' size on disk stands for them: read after each
step, outside its time. They are the machine's caches: another process on the machine (the other ranks of a run, a
concurrent run) adds to them too. A cache that is off (`CUDA_CACHE_DISABLE=1`) is not counted, and a full cache that
evicts as it adds can hide a compilation.
"""

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# A step or probe during which the caches grew by at least this much compiled kernels (one of a first run's CUDA
# compilations was about 0.85 MB, one Triton kernel's files are tens to hundreds of kB; a cache the pods share can grow
# by a few bytes of another's bookkeeping).
COMPILING_BYTES = 16 * 1024


def jit_cache_dir(environ: dict[str, str] | None = None) -> Path | None:
    """The driver's JIT cache directory as the driver chooses it; None where caching is off."""
    env = os.environ if environ is None else environ
    if env.get("CUDA_CACHE_DISABLE", "0").strip() not in ("", "0"):
        return None
    return Path(env.get("CUDA_CACHE_PATH") or Path.home() / ".nv" / "ComputeCache")


def triton_cache_dir() -> Path | None:
    """Triton's cache directory as Triton chooses it (`TRITON_CACHE_DIR`, `TRITON_HOME`); None without Triton."""
    try:
        import triton
    except ImportError:
        return None
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return Path(knobs.cache.dir)
    home = os.environ.get("TRITON_HOME") or str(Path.home())  # a Triton before its knobs chose it thus
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path(home) / ".triton" / "cache")


def kernel_cache_dirs() -> list[Path]:
    """The caches a first run's compilations are written to: the CUDA driver's and Triton's, where there are."""
    return [root for root in (jit_cache_dir(), triton_cache_dir()) if root is not None]


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
    """The caches' growth since the last `take`, in bytes (`start` first)."""

    roots: tuple[Path, ...] = ()
    _last: tuple[int, ...] = ()

    def start(self, roots: Iterable[Path]) -> bool:
        """Count from now on the caches at `roots` (`kernel_cache_dirs()`); False where there is none to count."""
        self.roots = tuple(roots)
        self._last = tuple(tree_bytes(root) for root in self.roots)
        return bool(self.roots)

    def take(self) -> int | None:
        """The bytes added since the last take (None: nothing counted); a cache that shrank (eviction) added 0."""
        if not self.roots:
            return None
        now = tuple(tree_bytes(root) for root in self.roots)
        grown = sum(max(after - before, 0) for before, after in zip(self._last, now, strict=True))
        self._last = now
        return grown


def jit_cache_text(grown: int | None) -> str:
    """A step's growth of the kernel caches in words ("" for none): "the kernel caches grew 1.2 MB ..."."""
    if not grown:
        return ""
    return f"the kernel caches grew {grown / 1e6:.1f} MB (kernels compiled for this GPU the first time here)"
