"""A run's GPU memory peaks by phase (`metrics.MEMORY_PHASES`: forward, loss, backward, optimizer, evaluation), and
by step: the caching allocator's peak statistics read and reset at each phase boundary, folded into the phase that
was under way and into the step's. The allocator keeps its statistics on the host as it allocates: nothing is
synchronized."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from finetune_bench.measuring.metrics import MEMORY_PHASES


@dataclass
class MemoryPhasePeaks:
    device: torch.device
    # Per memory phase, the peak allocated and reserved bytes over the run.
    peaks: dict[str, dict[str, int]] = field(default_factory=dict)
    # The phases under way, innermost last (phases nest: a loss inside the forward's phase counts in the loss's).
    _open: list[str] = field(default_factory=list)
    # Training ended (`close`): what runs after it (a profile) counts in no memory phase.
    _closed: bool = False
    # The peaks folded in since the step began (`take_step_peaks`), from the phases it went through and outside them.
    _step: tuple[int, int] = (0, 0)
    # The innermost phase an exception left (`within`), else "": where a run that failed was.
    _failed_in: str = ""

    def fold(self) -> None:
        """Fold the allocator's peaks since the last reset into the step's and into the phase under way's, and reset
        them (nothing off a GPU, or once closed)."""
        if self.device.type != "cuda" or self._closed:
            return
        allocated = torch.cuda.max_memory_allocated(self.device)
        reserved = torch.cuda.max_memory_reserved(self.device)
        self._step = (max(self._step[0], allocated), max(self._step[1], reserved))
        if self._open:
            peaks = self.peaks.setdefault(self._open[-1], {"allocated": 0, "reserved": 0})
            peaks["allocated"] = max(peaks["allocated"], allocated)
            peaks["reserved"] = max(peaks["reserved"], reserved)
        torch.cuda.reset_peak_memory_stats(self.device)

    def take_step_peaks(self) -> tuple[int, int]:
        """The step's peak allocated and reserved bytes (folded now), the next step's counted from zero."""
        self.fold()
        step, self._step = self._step, (0, 0)
        return step

    def enter(self, name: str) -> None:
        """From now on the allocator's peaks count in memory phase `name` (until `leave`); what came before counts in
        the phase it was in."""
        if name not in MEMORY_PHASES:
            raise ValueError(f"{name!r} is not a memory phase ({', '.join(MEMORY_PHASES)})")
        self.fold()
        self._open.append(name)

    def leave(self) -> None:
        """End the innermost memory phase (nothing when none is under way)."""
        self.fold()
        if self._open:
            self._open.pop()

    @contextmanager
    def within(self, name: str) -> Iterator[None]:
        """The block's peaks count in memory phase `name`, however it ends."""
        self.enter(name)
        try:
            yield
        except BaseException:
            self._failed_in = self._failed_in or name  # the innermost phase sees the exception first
            raise
        finally:
            self.leave()

    @property
    def current(self) -> str:
        """The phase under way, or the one an exception left (a failure's phase); "" when there is neither."""
        return self._open[-1] if self._open else self._failed_in

    def close(self) -> None:
        self._closed = True
