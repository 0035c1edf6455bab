"""Time in Python's garbage collector: what explains a slow step when a full collection falls inside it."""

import gc
import time


class GcTimer:
    """Total time spent in Python's garbage collector while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._start: float | None = None

    def __call__(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.total_s += time.perf_counter() - self._start
            self._start = None

    def install(self) -> None:
        gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
