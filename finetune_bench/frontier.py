"""The memory frontier: the largest batch size, and the largest sequence length, that each arm can train.

For every arm (today liger on / off) and every searched dimension, a search probes short training runs:
doubling from a start value until the first out-of-memory (or the cap), then bisection between the last
size that fit and the first that did not, then a re-probe of the frontier (a confirmation that runs out
of memory moves the frontier below it). A probe that fails for another reason (error, timeout) is
retried; one that keeps failing stops the search, which then reports the best fit found so far as a
lower bound. The search takes the probe as a callable, so it runs against a fake in tests; in the
workflow a probe is a real training run in a fresh child process (`child_probe`).

No Flyte here: `tasks/frontier.py` and `workflows/frontier.py` wrap this module.
"""

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from finetune_bench.plan import PlannedRun, condition_id
from finetune_bench.results import ConditionResult
from finetune_bench.sources import SYNTHETIC_PREFIX
from finetune_bench.spec import (
    ExperimentArgs,
    SpecError,
    StrictFromJson,
    TrainingArgs,
    check_setting,
    validate,
    validate_condition,
)

# The searched dimensions, named after the TrainingArgs field a probe sets.
BATCH_SIZE = "per_device_train_batch_size"
SEQ_LENGTH = "max_seq_length"
DIMENSIONS = (BATCH_SIZE, SEQ_LENGTH)

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
class Arm(StrictFromJson):
    """One arm of the comparison: the TrainingArgs settings that distinguish it (each field is named after
    the TrainingArgs field it sets; a new kind of arm is a new field here)."""

    SECTION = "arms[]"

    # What is switched on (TrainingArgs.arm: baseline, liger, liger:<kernel>, compile, ...).
    arm: str = "baseline"


def arm_overrides(arm: Arm) -> dict:
    return dataclasses.asdict(arm)


def arm_name(arm: Arm) -> str:
    """The arm's name (`liger`, `baseline`, ...), followed by its other settings, if any."""
    others = {k: v for k, v in arm_overrides(arm).items() if k != "arm"}
    return ",".join([arm.arm] + [f"{k}={v}" for k, v in others.items()])


@dataclass
class BatchSizeSearch(StrictFromJson):
    """The largest per_device_train_batch_size that trains at training_args.max_seq_length."""

    SECTION = "batch_size_search"

    enabled: bool = True
    start: int = 1
    cap: int = 256


@dataclass
class SeqLengthSearch(StrictFromJson):
    """The largest max_seq_length, a multiple of `granularity`, that trains at batch size `batch_size`."""

    SECTION = "seq_length_search"

    enabled: bool = True
    batch_size: int = 1
    start: int = 1024
    cap: int = 32768
    granularity: int = 256


@dataclass
class ProbeSettings(StrictFromJson):
    """How every probe runs: a few steps (the first optimizer step creates the optimizer state, so a probe
    needs two to see the steady-state peak), retries of a probe that fails for another reason than memory,
    and re-probes of the frontier."""

    SECTION = "probes"

    max_steps: int = 2
    timing_warmup_steps: int = 1
    retries: int = 1
    confirmations: int = 1
    timeout_s: int = 1800


@dataclass
class FrontierSearch:
    """One search: an arm, a dimension, and the settings every probe trains with (`dimension` set per probe)."""

    arm: Arm
    dimension: str
    training_args: TrainingArgs
    start: int
    cap: int
    granularity: int
    retries: int
    confirmations: int
    timeout_s: int


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


# ---------------------------------------------------------------------------------------------------------
# Planning and validation


def plan_searches(
    training_args: TrainingArgs,
    arms: list[Arm],
    batch_size_search: BatchSizeSearch,
    seq_length_search: SeqLengthSearch,
    probes: ProbeSettings,
    n_runs: int = 1,
) -> list[FrontierSearch]:
    """Validate every input (naming the key at fault) and list the searches: per arm, per enabled dimension."""
    # The training settings as given (they are what the throughput runs train with) ...
    validate(_no_axes(), training_args, n_runs)
    _check_arms(arms)
    _check_int("probes.max_steps", probes.max_steps, minimum=1)
    _check_int("probes.timing_warmup_steps", probes.timing_warmup_steps, minimum=0)
    if probes.timing_warmup_steps >= probes.max_steps:
        raise SpecError(
            f"probes.timing_warmup_steps ({probes.timing_warmup_steps}) must be below probes.max_steps "
            f"({probes.max_steps}): no step would be measured"
        )
    _check_int("probes.retries", probes.retries, minimum=0)
    _check_int("probes.confirmations", probes.confirmations, minimum=0)
    _check_int("probes.timeout_s", probes.timeout_s, minimum=1)
    ranges: list[_Range] = []
    if _check_bool("batch_size_search.enabled", batch_size_search.enabled):
        b = batch_size_search
        ranges.append(_Range(BATCH_SIZE, "batch_size_search", b.start, b.cap, 1, {}))
    if _check_bool("seq_length_search.enabled", seq_length_search.enabled):
        q = seq_length_search
        _check_int("seq_length_search.batch_size", q.batch_size, minimum=1)
        _check_int("seq_length_search.granularity", q.granularity, minimum=1)
        ranges.append(
            _Range(SEQ_LENGTH, "seq_length_search", q.start, q.cap, q.granularity, {BATCH_SIZE: q.batch_size})
        )
    if not ranges:
        raise SpecError("batch_size_search.enabled and seq_length_search.enabled are both false: nothing to search")
    for r in ranges:
        _check_int(f"{r.key}.start", r.start, minimum=1)
        _check_int(f"{r.key}.cap", r.cap, minimum=1)
        if r.cap < r.start:
            raise SpecError(f"{r.key}.cap ({r.cap}) must not be below {r.key}.start ({r.start})")
        if r.start % r.granularity or r.cap % r.granularity:
            raise SpecError(
                f"{r.key}.start ({r.start}) and {r.key}.cap ({r.cap}) must be multiples of "
                f"{r.key}.granularity ({r.granularity})"
            )
    _check_data_fits(training_args, ranges)

    searches = []
    for arm, r in itertools.product(arms, ranges):
        probe_args = dataclasses.replace(
            training_args,
            **arm_overrides(arm),
            **r.fixed,
            max_steps=probes.max_steps,
            timing_warmup_steps=probes.timing_warmup_steps,
        )
        # The probe settings at both ends of the range must be runnable settings.
        for value in (r.start, r.cap):
            args = dataclasses.replace(probe_args, **{r.dimension: value})
            validate(_no_axes(), args, 1)
            validate_condition(args, {**arm_overrides(arm), r.dimension: value})
        searches.append(
            FrontierSearch(
                arm=arm,
                dimension=r.dimension,
                training_args=probe_args,
                start=r.start,
                cap=r.cap,
                granularity=r.granularity,
                retries=probes.retries,
                confirmations=probes.confirmations,
                timeout_s=probes.timeout_s,
            )
        )
    return searches


class _Range(NamedTuple):
    """A dimension's search range, and the input key it came from (for messages)."""

    dimension: str
    key: str
    start: int
    cap: int
    granularity: int
    # Settings every probe of this dimension fixes (the sequence-length search's batch size).
    fixed: dict


def _no_axes() -> ExperimentArgs:
    return ExperimentArgs(arm=[], per_device_train_batch_size=[])


def _check_int(key: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(f"{key} must be an integer, got {value!r}")
    if value < minimum:
        raise SpecError(f"{key} must be at least {minimum}, got {value!r}")


def _check_bool(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{key} must be true or false, got {value!r}")
    return value


def _check_arms(arms: list[Arm]) -> None:
    if not arms:
        raise SpecError("arms must list at least one arm, e.g. [{arm: liger}, {arm: baseline}]")
    for index, arm in enumerate(arms):
        for name, value in arm_overrides(arm).items():
            check_setting(f"arms[{index}].{name}", name, value)
    names = [arm_name(arm) for arm in arms]
    if len(set(names)) != len(names):
        raise SpecError(f"arms repeats an arm: {names}")


def _check_data_fits(training_args: TrainingArgs, ranges: list["_Range"]) -> None:
    """Generated data must fill the largest probe: a batch larger than the dataset would hold fewer examples
    than its size, and a sequence longer than the text would be shorter than its length (every generated
    word is at least one token)."""
    if not training_args.dataset_name.startswith(SYNTHETIC_PREFIX):
        return
    largest = {r.dimension: r.cap for r in ranges}
    if BATCH_SIZE in largest and training_args.synthetic_num_examples < largest[BATCH_SIZE]:
        raise SpecError(
            f"training_args.synthetic_num_examples ({training_args.synthetic_num_examples}) is below "
            f"batch_size_search.cap ({largest[BATCH_SIZE]}): a batch cannot hold more examples than the dataset has"
        )
    longest = max(largest.get(SEQ_LENGTH, 0), training_args.max_seq_length if BATCH_SIZE in largest else 0)
    if training_args.synthetic_min_words < longest:
        raise SpecError(
            f"training_args.synthetic_min_words ({training_args.synthetic_min_words}) is below the longest "
            f"sequence probed ({longest} tokens): shorter examples would not fill the sequence"
        )


# ---------------------------------------------------------------------------------------------------------
# The search

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


# ---------------------------------------------------------------------------------------------------------
# Real probes: a short training run in a fresh child process, the same path as a benchmark condition


def probe_outcome(result: ConditionResult) -> ProbeOutcome:
    """A child run's record as a probe outcome."""
    return ProbeOutcome(
        status=result.status,
        reason=result.reason,
        wall_time_s=result.wall_time_s,
        peak_reserved_bytes=result.metrics.get("peak_reserved_bytes"),
        peak_allocated_bytes=result.metrics.get("peak_allocated_bytes"),
        nvml_process_peak_bytes=result.metrics.get("nvml_process_peak_bytes"),
        process_peak_rss_bytes=result.metrics.get("process_peak_rss_bytes"),
        error_tail=result.error_tail,
        environment=dict(result.environment),
    )


def child_probe(dataset_dir: Path, model_dir: Path, work_dir: Path, timeout_s: float) -> ProbeFunction:
    """A probe that trains in a fresh child process (`launch.run_in_child`), each under its own directory."""
    from finetune_bench.launch import run_in_child

    counter = itertools.count()

    def probe(training_args: TrainingArgs) -> ProbeOutcome:
        number = next(counter)
        point = {"arm": training_args.arm, BATCH_SIZE: training_args.per_device_train_batch_size}
        point[SEQ_LENGTH] = training_args.max_seq_length
        run = PlannedRun(
            condition_id=condition_id(point), run_number=number, training_args=training_args, swept_axes=[]
        )
        result = run_in_child(run, dataset_dir, model_dir, Path(work_dir) / f"probe-{number:03d}", timeout_s)
        return probe_outcome(result)

    return probe


# ---------------------------------------------------------------------------------------------------------
# Throughput at the frontier

THROUGHPUT_AXES = [*dataclasses.asdict(Arm()), BATCH_SIZE]


def largest_common_batch(results: list[FrontierResult | None], arms: list[Arm]) -> int | None:
    """The largest batch size every arm fits (None unless every arm's batch search found a frontier)."""
    frontiers = {arm_name(r.search.arm): r.frontier for r in _batch_results(results)}
    if any(frontiers.get(arm_name(arm)) is None for arm in arms):
        return None
    return min(frontiers.values())


def plan_throughput_runs(
    results: list[FrontierResult | None], training_args: TrainingArgs, arms: list[Arm], n_runs: int
) -> list[PlannedRun]:
    """Runs of `training_args` (its max_steps, not the probes') for every arm at its own batch frontier and
    at the largest batch every arm fits, `n_runs` times each, interleaved. Arms without a frontier get none."""
    common = largest_common_batch(results, arms)
    points = []
    for result in _batch_results(results):
        if result.frontier is None:
            continue
        for batch in dict.fromkeys(b for b in (result.frontier, common) if b is not None):
            points.append({**arm_overrides(result.search.arm), BATCH_SIZE: batch})
    runs = []
    for run_number, point in itertools.product(range(n_runs), points):
        args = dataclasses.replace(training_args, **point)
        validate(_no_axes(), args, n_runs)
        runs.append(PlannedRun(condition_id(point), run_number, args, list(THROUGHPUT_AXES)))
    return runs


def _batch_results(results: list[FrontierResult | None]) -> list[FrontierResult]:
    return [r for r in results if r is not None and r.search.dimension == BATCH_SIZE]
