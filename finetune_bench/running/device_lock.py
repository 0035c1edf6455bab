"""One measurement at a time on a machine's accelerator: a run holds the machine's device lock while it trains.

Two grids started on one machine (two `pyflyte run`, or a run and a frontier search) would otherwise train
side by side on one GPU, and both would store contended timings as results. The lock is an exclusive
`flock` on a file in the cache directory, named after the hardware; the kernel releases it when its holder
dies, however it dies. Reentrant within a process (a run that holds it may start a child run).
"""

import contextlib
import fcntl
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from finetune_bench.sources.cache import cache_root

logger = logging.getLogger(__name__)

_held = threading.local()


def lock_path(hardware: str) -> Path:
    """The lock file of the machine's `hardware` (its GPUs by name and driver, or `cpu`)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", hardware).strip("_") or "device"
    return cache_root() / "locks" / f"{name}.lock"


@contextlib.contextmanager
def device_lock(hardware: str) -> Iterator[float]:
    """Hold the machine's device lock for the block; yields the seconds spent waiting for it."""
    if getattr(_held, "depth", 0):
        _held.depth += 1
        try:
            yield 0.0
        finally:
            _held.depth -= 1
        return
    path = lock_path(hardware)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    started = time.monotonic()
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning("another run is measuring on this machine (%s): waiting for it to finish", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        waited = time.monotonic() - started
        _held.depth = 1
        try:
            yield waited
        finally:
            _held.depth = 0
    finally:
        os.close(handle)  # releases the lock
