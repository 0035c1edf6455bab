"""The memory frontier: the largest batch size, and the largest sequence length, that each arm can train.

For every arm (today liger on / off) and every searched dimension, a search probes short training runs.

Guided by the memory model (`finetune_bench.prediction`), when a `Guide` is given: the first probe is at the
predicted frontier; each next one is where the measured peak memory of the largest size that fit, extended by
the memory per size unit (the model's, then the one measured between two fits), reaches the GPU's limit; after
a probe that ran out of memory, bisection. The model only chooses where to probe: the frontier is still a size
that trained and the next size up that ran out of memory, both probed.

Without a guide: doubling from a start value until the first out-of-memory (or the cap), then bisection between
the last size that fit and the first that did not.

Either way the frontier is then re-probed (a confirmation that runs out of memory moves the frontier below it).
A probe that fails for another reason (error, timeout) is retried; one that keeps failing stops the search,
which then reports the best fit found so far as a lower bound. The search takes the probe as a callable, so it
runs against a fake in tests; in the workflow a probe is a real training run in a fresh child process
(`child_probe`).

No Flyte here: `tasks/frontier.py` and `workflows/frontier.py` wrap this package.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from finetune_bench.frontier.settings import FrontierSearch, arm_name
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.results.record import OK, OOM  # the probe outcomes that decide; others (error, ...) are retried

# How a search ended.
FOUND = "found"  # the frontier fits (confirmed); the next size up ran out of memory
REACHED_CAP = "reached_cap"  # every size up to the cap fits: the frontier is at least the cap
NOTHING_FITS = "nothing_fits"  # even the start value runs out of memory
PROBE_FAILED = "probe_failed"  # a probe kept failing (not OOM): the frontier reported is a lower bound
SEARCH_STATUSES = (FOUND, REACHED_CAP, NOTHING_FITS, PROBE_FAILED)

# Why a probe ran.
DOUBLING, BISECTION, CONFIRMATION = "doubling", "bisection", "confirmation"
PREDICTED, INTERPOLATION = "predicted", "interpolation"
# How far a guide's prediction may be off (the memory model's ±10 %): the first guided probe stays this far
# below the predicted frontier, so that it most likely fits and measures the memory the next ones aim with.
GUIDE_MARGIN = 0.10
# A fit whose peak reserve came this close to what torch may reserve filled it: near its limit the caching allocator
# frees its cached blocks and retries before an allocation fails, so such a reserve says how much the allocator held,
# not how much the size needs (FSDP2 runs reserve up to 88 % above their allocated peak uncapped, docs/prediction.md).
SATURATED = 0.97


@dataclass
class ProbeOutcome:
    """What a probe callable returns: how the run ended and what it measured."""

    status: str
    reason: str = ""
    wall_time_s: float = 0.0
    peak_reserved_bytes: float | None = None
    peak_allocated_bytes: float | None = None
    nvml_process_peak_bytes: float | None = None
    # GPU memory outside torch's allocator at its most (`measuring.gpu.NvmlPeakSampler`)
    outside_allocator_peak_bytes: float | None = None
    process_peak_rss_bytes: float | None = None
    error_tail: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    # When the probe ran (UTC, as a benchmark run's `measured_at`; "" where it did not say).
    measured_at: str = ""
    # A probe on several GPUs that failed: the rank whose failure ended it (None: every rank ended ok, or one GPU),
    # the memory phase it ran out in (forward, loss, backward, optimizer, set-up), and that rank's peak reserved
    # memory when it stopped.
    failed_rank: int | None = None
    failed_phase: str = ""
    failed_rank_peak_reserved_bytes: float | None = None


# The ProbeOutcome fields a Probe record keeps.
_MEASURED = (
    "status",
    "reason",
    "wall_time_s",
    "peak_reserved_bytes",
    "peak_allocated_bytes",
    "nvml_process_peak_bytes",
    "outside_allocator_peak_bytes",
    "process_peak_rss_bytes",
    "error_tail",
    "measured_at",
    "failed_rank",
    "failed_phase",
    "failed_rank_peak_reserved_bytes",
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
    outside_allocator_peak_bytes: float | None = None
    process_peak_rss_bytes: float | None = None
    error_tail: str = ""
    measured_at: str = ""
    failed_rank: int | None = None
    failed_phase: str = ""
    failed_rank_peak_reserved_bytes: float | None = None


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
    # Device time the probes cost (GPU seconds, or a CPU's where they ran on one): the sum of their wall times, times
    # the GPUs each probe held (every rank of a probe on several GPUs).
    device_seconds: float
    # Where the probes ran (`gpu_memory_bytes` is the GPU's capacity), from the first probe that said.
    environment: dict[str, str] = field(default_factory=dict)
    # The memory model's frontier the guided search started from (None: an unguided, doubling search).
    predicted_frontier: int | None = None


# The start of the problem `failed_searches` gives (the workflow fails with it, after its report is written).
SEARCHES_FAILED = "every search failed"


def failed_searches(searches: list[FrontierSearch], results: list["FrontierResult | None"]) -> list[str]:
    """One problem when no search of the frontier measured anything: every one lost, or ended `probe_failed` with
    nothing seen to fit (a probe kept failing for a reason other than memory), each search's reason named; none when
    any search found a frontier, reached its cap, or saw its start run out of memory (`nothing_fits` is an answer)."""
    if not searches:
        return []
    reasons = []
    for search, result in zip(searches, [*results, *[None] * (len(searches) - len(results))], strict=False):
        name = f"{arm_name(search.arm)} ({search.dimension})"
        if result is None:
            reasons.append(f"{name}: no result (the search's task failed)")
        elif result.status == PROBE_FAILED and result.frontier is None:
            reasons.append(
                f"{name}: {result.reason.strip().splitlines()[0] if result.reason.strip() else 'probe failed'}"
            )
        else:
            return []
    return [
        f"{SEARCHES_FAILED}: no search measured a size that fits or runs out of memory (frontiers.csv and the report "
        "were written):\n" + "\n".join(f"  - {reason}" for reason in reasons)
    ]


def frontier_probe(result: FrontierResult) -> Probe | None:
    """The last ok probe at the frontier (its peak memory is the frontier's)."""
    at_frontier = [p for p in result.probes if p.value == result.frontier and p.status == OK]
    return at_frontier[-1] if at_frontier else None


def search_line(result: FrontierResult) -> str:
    """One line of how a search ended, for the log of the task that ran it: its arm and dimension, its status and
    reason, the frontier (and the smallest size that ran out of memory), the probes and device time it took, and the
    peak memory at the frontier. The result goes to the workflow's report (no store keeps a search)."""
    search = result.search
    said = [f"{result.status} ({result.reason})" if result.reason else result.status]
    said.append(f"frontier {result.frontier if result.frontier is not None else 'none'}")
    if result.first_oom is not None:
        said.append(f"first out of memory at {result.first_oom}")
    said.append(f"{result.probes_used} probe(s), {result.device_seconds:,.0f} device-seconds")
    at_frontier = frontier_probe(result)
    if at_frontier is not None and at_frontier.peak_reserved_bytes:
        said.append(f"peak reserved {at_frontier.peak_reserved_bytes / 2**30:.2f} GiB at the frontier")
    return f"search {arm_name(search.arm)} {search.dimension}: {', '.join(said)}; returned to the report"


ProbeFunction = Callable[[TrainingArgs], ProbeOutcome]


@dataclass(frozen=True)
class Guide:
    """What guides a search: the predicted peak reserved memory at a size of the searched dimension, and what
    torch can reserve on the GPU the probes run on (both in bytes). Reserved, not allocated: a probe runs out of
    memory when the allocator cannot grow its reserve, and near the limit that reserve holds 5-13 % more than
    the live tensors (H100 probes of Phi-3-mini at their frontier: 69.3 and 73.5 GiB allocated, 78.3 and 77.7
    GiB reserved of 78.4)."""

    predict: Callable[[int], float]
    limit_bytes: float
    # The predicted peak allocated memory at a size (None: not known). Where a fit's reserve filled what torch may
    # reserve (`SATURATED`), the allocated peak against this says how far off the model is.
    predict_allocated: Callable[[int], float] | None = None
    # How far the model may be off (the first probe stays this far below its frontier): `GUIDE_MARGIN`, or less for
    # a model checked closer.
    margin: float = GUIDE_MARGIN
    # Every fit is measured by its allocated peak against `predict_allocated` (never by its reserve): for runs whose
    # reserve below the limit says nothing of what they need (FSDP2's, `frontier.guide`).
    by_allocated: bool = False


def largest_predicted_fit(search: FrontierSearch, guide: Guide, scale: float = 1.0) -> int:
    """The largest size of the search's grid whose predicted peak, times `scale`, stays within the guide's limit
    (the start value when none does): the predicted frontier."""
    low, high = 0, (search.cap - search.start) // search.granularity
    if guide.predict(search.start) * scale > guide.limit_bytes:
        return search.start
    while low < high:  # the prediction grows with the size: bisect the grid
        middle = (low + high + 1) // 2
        if guide.predict(search.start + middle * search.granularity) * scale <= guide.limit_bytes:
            low = middle
        else:
            high = middle - 1
    return search.start + low * search.granularity


class _ProbeKeptFailing(Exception):
    def __init__(self, value: int, probes: list[Probe]):
        self.value, self.probes = value, probes


def search_frontier(search: FrontierSearch, probe: ProbeFunction, guide: Guide | None = None) -> FrontierResult:
    """Run one search to its end; never raises for a probe's failure (it is part of the result). With a `guide`,
    the search starts at the predicted frontier (see the module docstring)."""
    return _Search(search, probe, guide).run()


class _Search:
    def __init__(self, search: FrontierSearch, probe: ProbeFunction, guide: Guide | None = None):
        self.search, self.probe_function, self.guide = search, probe, guide
        # The measured peak reserved and allocated memory of each size that fit.
        self.reserved: dict[int, float] = {}
        self.allocated: dict[int, float] = {}
        self.predicted_frontier: int | None = None
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
                if outcome.peak_reserved_bytes is not None:
                    self.reserved[value] = float(outcome.peak_reserved_bytes)
                if outcome.peak_allocated_bytes is not None:
                    self.allocated[value] = float(outcome.peak_allocated_bytes)
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
        fit, oom = self._guided() if self.guide is not None else self._doubling()
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

    def _doubling(self) -> tuple[int | None, int | None]:
        """(largest fit, first OOM) of doubling from the start value."""
        s, fit, value = self.search, None, self.search.start
        while True:
            if self.probe(value, DOUBLING) == OOM:
                return fit, value
            fit = value
            if value >= s.cap:
                return fit, None
            value = min(2 * value, s.cap)

    def _guided(self) -> tuple[int | None, int | None]:
        """(largest fit, smallest OOM) of the guided search: a bracket one granule wide, the cap reached, or the
        start value out of memory."""
        s, g = self.search, self.search.granularity
        fit: int | None = None
        oom: int | None = None
        # First just below the predicted frontier, by the model's error band: a probe that fits measures memory.
        value, phase, overshoots = self._largest_predicted_fit(scale=1 + self.guide.margin), PREDICTED, 0
        self.predicted_frontier = self._largest_predicted_fit()
        while True:
            if self.probe(value, phase) == OK:
                fit, overshoots = max(fit or value, value), 0
            else:
                oom, overshoots = min(oom or value, value), overshoots + (phase != PREDICTED)
            if fit == s.cap or (oom is not None and oom <= s.start):
                return fit, oom
            if fit is not None and oom is not None and oom - fit <= g:
                return fit, oom
            lower = fit + g if fit is not None else s.start
            upper = oom - g if oom is not None else s.cap
            if overshoots >= 2 and fit is not None:
                # the estimates keep overshooting: halve the bracket instead of trusting them again
                value, phase = fit + (oom - fit) // (2 * g) * g, BISECTION
            else:
                value, phase = self._interpolated(fit, oom), INTERPOLATION
            value = min(max(value, lower), upper)

    def _nearest_on_grid(self, value: float) -> int:
        """The size of the search's grid (start + k·granularity, within [start, cap]) nearest to `value`: an
        estimate a little off either way then costs one probe, not one each side."""
        s = self.search
        steps = round((value - s.start) / s.granularity)
        return min(max(s.start + steps * s.granularity, s.start), s.cap)

    def _predicted_crossing(self, scale: float) -> float:
        """Where the prediction times `scale` reaches the limit, between grid sizes (linear between them)."""
        g, guide = self.search.granularity, self.guide
        below = self._largest_predicted_fit(scale)
        low, high = guide.predict(below) * scale, guide.predict(below + g) * scale
        if high <= low:
            return below
        return below + g * (guide.limit_bytes - low) / (high - low)

    def _largest_predicted_fit(self, scale: float = 1.0) -> int:
        return largest_predicted_fit(self.search, self.guide, scale)

    def _interpolated(self, fit: int | None, oom: int | None) -> int:
        """Where the memory reaches the limit. Two measured fits: the line through them. One: the model scaled to
        match it (its errors are mostly a common factor). None, only an OOM: the model scaled by at least how far
        it fell short there, and the error band more. Nothing measured (no GPU figures): bisection, or doubling.
        A fit whose reserve filled what torch may reserve (`SATURATED`), or any fit of a guide that goes `by_allocated`,
        is measured by its allocated peak instead, against the model's: the model scaled by that ratio."""
        guide, g = self.guide, self.search.granularity
        if guide.by_allocated:
            measured = sorted(v for v in self.allocated if v in self.fits)
            if measured:
                largest = measured[-1]
                scale = self.allocated[largest] / guide.predict_allocated(largest)
                return self._nearest_on_grid(self._predicted_crossing(scale))
        measured = sorted(v for v in self.reserved if v in self.fits)
        if measured and self._saturated(measured[-1]):
            largest = measured[-1]
            return self._nearest_on_grid(
                self._predicted_crossing(self.allocated[largest] / guide.predict_allocated(largest))
            )
        if len(measured) >= 2 and self.reserved[measured[-1]] > self.reserved[measured[-2]]:
            a, b = measured[-2], measured[-1]
            slope = (self.reserved[b] - self.reserved[a]) / (b - a)
            return self._nearest_on_grid(b + (guide.limit_bytes - self.reserved[b]) / slope)
        if measured:
            largest = measured[-1]
            return self._nearest_on_grid(self._predicted_crossing(self.reserved[largest] / guide.predict(largest)))
        if oom is not None and fit is None:
            shortfall = max(1.0, guide.limit_bytes / guide.predict(oom))
            return self._largest_predicted_fit(scale=shortfall * (1 + self.guide.margin))
        if oom is None:
            return min(2 * fit, self.search.cap)
        return fit + (oom - fit) // (2 * g) * g

    def _saturated(self, value: int) -> bool:
        """Whether the fit at `value` reserved what torch may reserve, with an allocated peak and a model of it to go
        by instead."""
        return (
            self.reserved[value] >= SATURATED * self.guide.limit_bytes
            and value in self.allocated
            and self.guide.predict_allocated is not None
        )

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
            device_seconds=sum(p.wall_time_s for p in self.probes) * self.search.training_args.world_size,
            environment=self.environment,
            predicted_frontier=self.predicted_frontier,
        )
