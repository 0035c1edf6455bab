"""The memory frontier: the largest batch size, and the largest sequence length, that each arm can train.

For every arm (today liger on / off) and every searched dimension, a search probes short training runs:
doubling from a start value until the first out-of-memory (or the cap), then bisection between the last
size that fit and the first that did not, then a re-probe of the frontier (a confirmation that runs out
of memory moves the frontier below it). A probe that fails for another reason (error, timeout) is
retried; one that keeps failing stops the search, which then reports the best fit found so far as a
lower bound. The search takes the probe as a callable, so it runs against a fake in tests; in the
workflow a probe is a real training run in a fresh child process (`child_probe`).

No Flyte here: `tasks/frontier.py` and `workflows/frontier.py` wrap this package.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from finetune_bench.frontier.settings import FrontierSearch
from finetune_bench.inputs.settings import TrainingArgs

# How a search ended.
FOUND = "found"  # the frontier fits (confirmed); the next size up ran out of memory
REACHED_CAP = "reached_cap"  # every size up to the cap fits: the frontier is at least the cap
NOTHING_FITS = "nothing_fits"  # even the start value runs out of memory
PROBE_FAILED = "probe_failed"  # a probe kept failing (not OOM): the frontier reported is a lower bound
SEARCH_STATUSES = (FOUND, REACHED_CAP, NOTHING_FITS, PROBE_FAILED)

# Why a probe ran.
DOUBLING, BISECTION, CONFIRMATION = "doubling", "bisection", "confirmation"

# Probe outcomes that decide something; any other ("error", "timeout") is retried.
OK, OOM = "ok", "oom"


@dataclass
class ProbeOutcome:
    """What a probe callable returns: how the run ended and what it measured."""

    status: str
    reason: str = ""
    wall_time_s: float = 0.0
    peak_reserved_bytes: float | None = None
    peak_allocated_bytes: float | None = None
    nvml_process_peak_bytes: float | None = None
    process_peak_rss_bytes: float | None = None
    error_tail: str = ""
    environment: dict[str, str] = field(default_factory=dict)


# The ProbeOutcome fields a Probe record keeps.
_MEASURED = (
    "status",
    "reason",
    "wall_time_s",
    "peak_reserved_bytes",
    "peak_allocated_bytes",
    "nvml_process_peak_bytes",
    "process_peak_rss_bytes",
    "error_tail",
)


@dataclass
class Probe:
    """One probe as the search ran it: the size, why it ran, which try it was, and its outcome."""

    value: int
    phase: str
    attempt: int
    status: str
    reason: str = ""
    wall_time_s: float = 0.0
    peak_reserved_bytes: float | None = None
    peak_allocated_bytes: float | None = None
    nvml_process_peak_bytes: float | None = None
    process_peak_rss_bytes: float | None = None
    error_tail: str = ""


@dataclass
class FrontierResult:
    """How a search ended. `frontier` is the largest size seen to fit (None when none did); with status
    `probe_failed` it is a lower bound, with `reached_cap` the cap (the true frontier may be larger)."""

    search: FrontierSearch
    status: str
    reason: str
    frontier: int | None
    # The smallest size seen to run out of memory (None: none did).
    first_oom: int | None
    probes: list[Probe]
    probes_used: int
    # GPU time the probes cost: the sum of their wall times.
    gpu_seconds: float
    # Where the probes ran (`gpu_memory_bytes` is the GPU's capacity), from the first probe that said.
    environment: dict[str, str] = field(default_factory=dict)


def frontier_probe(result: FrontierResult) -> Probe | None:
    """The last ok probe at the frontier (its peak memory is the frontier's)."""
    at_frontier = [p for p in result.probes if p.value == result.frontier and p.status == OK]
    return at_frontier[-1] if at_frontier else None


ProbeFunction = Callable[[TrainingArgs], ProbeOutcome]


class _ProbeKeptFailing(Exception):
    def __init__(self, value: int, probes: list[Probe]):
        self.value, self.probes = value, probes


def search_frontier(search: FrontierSearch, probe: ProbeFunction) -> FrontierResult:
    """Run one search to its end; never raises for a probe's failure (it is part of the result)."""
    return _Search(search, probe).run()


class _Search:
    def __init__(self, search: FrontierSearch, probe: ProbeFunction):
        self.search, self.probe_function = search, probe
        self.probes: list[Probe] = []
        self.fits: set[int] = set()
        self.ooms: set[int] = set()
        self.environment: dict[str, str] = {}

    def probe(self, value: int, phase: str) -> str:
        """`ok` or `oom`, retrying other outcomes; raises _ProbeKeptFailing when every try failed."""
        args = dataclasses.replace(self.search.training_args, **{self.search.dimension: value})
        failed = []
        for attempt in range(1, self.search.retries + 2):
            outcome = self.probe_function(args)
            record = Probe(value=value, phase=phase, attempt=attempt, **{k: getattr(outcome, k) for k in _MEASURED})
            self.probes.append(record)
            if outcome.environment and not self.environment:
                self.environment = dict(outcome.environment)
            if outcome.status == OK:
                self.fits.add(value)
                return OK
            if outcome.status == OOM:
                self.ooms.add(value)
                self.fits.discard(value)
                return OOM
            failed.append(record)
        raise _ProbeKeptFailing(value, failed)

    def largest_fit_below(self, value: int) -> int | None:
        return max((fit for fit in self.fits if fit < value), default=None)

    def run(self) -> FrontierResult:
        try:
            return self._search()
        except _ProbeKeptFailing as failure:
            return self._stopped(failure)

    def _search(self) -> FrontierResult:
        s = self.search
        fit: int | None = None
        oom: int | None = None
        value = s.start
        while True:  # doubling
            if self.probe(value, DOUBLING) == OOM:
                oom = value
                break
            fit = value
            if value >= s.cap:
                break
            value = min(2 * value, s.cap)
        while True:
            while fit is not None and oom is not None and oom - fit > s.granularity:  # bisection
                middle = fit + (oom - fit) // (2 * s.granularity) * s.granularity
                if self.probe(middle, BISECTION) == OK:
                    fit = middle
                else:
                    oom = middle
            if fit is None:
                return self._result(NOTHING_FITS, None, self._nothing_fits_reason())
            if all(self.probe(fit, CONFIRMATION) == OK for _ in range(s.confirmations)):
                break
            # A re-probe of the frontier ran out of memory: it does not fit; search below it.
            oom, fit = fit, self.largest_fit_below(fit)
        confirmed = f" (re-probed {s.confirmations} time(s))" if s.confirmations else ""
        if fit == s.cap:
            reason = f"every size up to the cap fits: {self._name(fit)} trains{confirmed}; the frontier may lie higher"
            return self._result(REACHED_CAP, fit, reason)
        return self._result(FOUND, fit, f"{self._name(fit)} trains{confirmed}; {self._name(oom)} runs out of memory")

    def _nothing_fits_reason(self) -> str:
        start = self._name(self.search.start)
        if self.search.start in self.ooms and any(p.value == self.search.start and p.status == OK for p in self.probes):
            return f"nothing fits: {start} trained once but ran out of memory when re-probed"
        return f"nothing fits: already the start value, {start}, runs out of memory"

    def _stopped(self, failure: _ProbeKeptFailing) -> FrontierResult:
        fit = max(self.fits, default=None)
        last = failure.probes[-1]
        tries = len(failure.probes)
        reason = (
            f"stopped: the probe at {self._name(failure.value)} failed {tries} time(s) "
            f"(last: {last.status}: {last.reason or 'no reason given'}); "
        )
        reason += f"the frontier is at least {fit} (a lower bound)" if fit is not None else "no size was seen to fit"
        return self._result(PROBE_FAILED, fit, reason)

    def _name(self, value: int | None) -> str:
        return f"{self.search.dimension}={value}"

    def _result(self, status: str, frontier: int | None, reason: str) -> FrontierResult:
        return FrontierResult(
            search=self.search,
            status=status,
            reason=reason,
            frontier=frontier,
            first_oom=min(self.ooms, default=None),
            probes=self.probes,
            probes_used=len(self.probes),
            gpu_seconds=sum(p.wall_time_s for p in self.probes),
            environment=self.environment,
        )
