"""The memory-frontier inputs, declared: the arms compared, the batch-size and sequence-length searches, how probes
run, the throughput runs, and where each setting acts (its scope, `inputs.rules`); and `FrontierSearch`, one search
of an arm along a dimension. Validating them and expanding them into searches: `frontier.planning`."""

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from finetune_bench.inputs.errors import Problems, SpecError
from finetune_bench.inputs.plan import MEASURED_RUNS
from finetune_bench.inputs.rules import (
    acts_everywhere,
    acts_only,
    check_fields,
    is_integer,
    requirement,
    setting,
)
from finetune_bench.inputs.sections import StrictFromJson
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, check_setting

# The searched dimensions, named after the TrainingArgs field a probe sets.
BATCH_SIZE = "per_device_train_batch_size"
SEQ_LENGTH = "max_seq_length"
DIMENSIONS = (BATCH_SIZE, SEQ_LENGTH)
# The inputs section that sets each dimension's search (in messages).
SEARCH_SECTIONS = {BATCH_SIZE: "batch_size_search", SEQ_LENGTH: "seq_length_search"}


def at_least(default: int, minimum: int) -> Any:
    """An integer setting of at least `minimum`."""
    return setting(
        default,
        requirement(is_integer, "must be an integer"),
        requirement(lambda v: v >= minimum, f"must be at least {minimum}"),
    )


def flag(default: bool) -> Any:
    return setting(default, requirement(lambda v: isinstance(v, bool), "must be true or false"))


# The shortest probe timeout taken: a probe's child starts, imports, builds the model and trains two steps (a CPU's
# tiny model takes about 10 s, an 8B model on a GPU a minute); below this every probe would end as a timeout.
MIN_PROBE_TIMEOUT_S = 30

# Where a search's own settings act: the search is the context of its scopes (`rules.acts_only`).
WHEN_ENABLED = "with the search enabled (enabled: true)"


def when_enabled(declared: Any) -> Any:
    """A search's setting that acts only when the search runs."""
    return acts_only(declared, lambda search: search.enabled, WHEN_ENABLED)


@dataclass
class FrontierArm(StrictFromJson):
    """One arm of the comparison: the TrainingArgs settings that distinguish it (each field is named after
    the TrainingArgs field it sets; a new kind of arm is a new field here)."""

    SECTION = "arms[]"
    # How a list of arms is written (in messages).
    LIST_EXAMPLE = "{arm: liger}, {arm: baseline}"
    # What is switched on (TrainingArgs.arm: baseline, liger, liger:<kernel>, compile, ...).
    arm: str = acts_everywhere("baseline")

    @classmethod
    def check_value(cls, key: str, name: str, value: Any) -> None:
        """Its values are read as the training settings they set (an arm name that means nothing is refused)."""
        check_setting(key, name, value)


# The arms when an inputs file names none: Liger against the baseline.
DEFAULT_ARMS = ("liger", "baseline")


def frontier_arms(arms: list[FrontierArm] | None) -> list[FrontierArm]:
    """`arms`, or DEFAULT_ARMS when none are given (None; an empty list is an empty list, refused when planned)."""
    return [FrontierArm(arm=name) for name in DEFAULT_ARMS] if arms is None else arms


def arm_overrides(arm: FrontierArm) -> dict:
    """The TrainingArgs settings the arm sets."""
    return dataclasses.asdict(arm)


def arm_name(arm: FrontierArm) -> str:
    """The arm's name (`liger`, `baseline`, ...), followed by its other settings, if any."""
    others = {k: v for k, v in arm_overrides(arm).items() if k != "arm"}
    return ",".join([arm.arm] + [f"{k}={v}" for k, v in others.items()])


@dataclass
class BatchSizeSearch(StrictFromJson):
    """The largest per_device_train_batch_size that trains at training_args.max_seq_length."""

    SECTION = "batch_size_search"

    def check(self, skip: Collection[str] = ()) -> None:
        search_enabled(self)

    # Search this dimension at all; the first batch size probed, and the largest one tried.
    enabled: bool = acts_everywhere(flag(True))
    start: int = when_enabled(at_least(1, minimum=1))
    cap: int = when_enabled(at_least(256, minimum=1))


@dataclass
class SeqLengthSearch(StrictFromJson):
    """The largest max_seq_length, a multiple of `granularity`, that trains at batch size `batch_size`."""

    SECTION = "seq_length_search"

    def check(self, skip: Collection[str] = ()) -> None:
        search_enabled(self)

    # Search this dimension at all.
    enabled: bool = acts_everywhere(flag(True))
    # The per-device batch size every probe of this search trains with.
    batch_size: int = when_enabled(at_least(1, minimum=1))
    # The first sequence length probed and the longest tried (both multiples of granularity).
    start: int = when_enabled(at_least(1024, minimum=1))
    cap: int = when_enabled(at_least(32768, minimum=1))
    # The frontier is found to this many tokens (bisection stops when the bracket is this narrow).
    granularity: int = when_enabled(at_least(256, minimum=1))


@dataclass
class ProbeSettings(StrictFromJson):
    """How every probe runs: a few steps (the first optimizer step creates the optimizer state, so a probe
    needs two to see the steady-state peak), retries of a probe that fails for another reason than memory,
    and re-probes of the frontier."""

    SECTION = "probes"

    def check(self, skip: Collection[str] = ()) -> None:
        problems = Problems()
        with problems.check():
            check_fields(self, self.SECTION)
        with problems.check():
            if not {"max_steps", "timing_warmup_steps"} & set(skip):
                check_probe_steps(self)
        problems.raise_if_any()

    # Optimizer steps per probe, and how many of them are warm-up (left out of the probe's timing).
    max_steps: int = acts_everywhere(at_least(2, minimum=1))
    timing_warmup_steps: int = acts_everywhere(at_least(1, minimum=0))
    # Tries after the first for a probe that fails for another reason than memory (error, timeout).
    retries: int = acts_everywhere(at_least(1, minimum=0))
    # Re-probes of the frontier; one that runs out of memory moves the frontier below it.
    confirmations: int = acts_everywhere(at_least(1, minimum=0))
    # Seconds after which a probe is killed and counts as a timeout.
    timeout_s: int = acts_everywhere(at_least(1800, minimum=MIN_PROBE_TIMEOUT_S))
    # Start at the memory model's predicted frontier and aim each next probe where the measured memory reaches the
    # GPU's limit (docs/frontier.md); false, or where there is no prediction: doubling from the start value.
    guided: bool = acts_everywhere(flag(True))


def check_probe_steps(probes: ProbeSettings) -> None:
    """Some probe step is measured (whenever both counts are integers, whatever else is wrong)."""
    if is_integer(probes.timing_warmup_steps) and is_integer(probes.max_steps):
        if probes.timing_warmup_steps >= probes.max_steps:
            raise SpecError(
                f"probes.timing_warmup_steps ({probes.timing_warmup_steps}) must be below probes.max_steps "
                f"({probes.max_steps}): no step would be measured"
            )


def search_enabled(search: BatchSizeSearch | SeqLengthSearch) -> bool:
    """Whether `search` runs; the settings of one that runs are checked, those of one that does not are not."""
    check_fields(search, search.SECTION, names=["enabled"])
    if search.enabled:
        check_fields(search, search.SECTION)
    return search.enabled


@dataclass
class FrontierSearch:
    """One search: an arm, a dimension, and the settings every probe trains with (`dimension` set per probe)."""

    arm: FrontierArm
    dimension: str
    training_args: TrainingArgs
    start: int
    cap: int
    granularity: int
    retries: int
    confirmations: int
    timeout_s: int
    # Let the memory model guide the search (`ProbeSettings.guided`).
    guided: bool = True


@dataclass
class ThroughputRuns:
    """The frontier's throughput runs: whether to measure them (at each arm's batch frontier and at the largest batch
    every arm fits) and how many repeats each; they come only from a batch-size search."""

    # (false where no batch-size search runs is harmless: it turns off what would not run)
    measure_throughput: bool = acts_only(
        True,
        lambda work: work.batch_search or not work.throughput_asked,
        "with a batch-size search (batch_size_search.enabled: true)",
    )
    n_runs: int = acts_only(1, lambda work: work.measured_runs, MEASURED_RUNS)


@dataclass(frozen=True)
class FrontierWork:
    """What the frontier runs, for the scopes of its workflow settings (`RunSettings`, `ThroughputRuns`) and of the
    training settings its probes set themselves (`ProbedTraining`): whether a batch-size search runs, and whether
    throughput runs are measured (and so analysed and stored) beside the probes, which are neither; on a GPU, as the
    probes train."""

    batch_search: bool
    measured_runs: bool
    throughput_asked: bool = True
    trains: bool = True
    on_gpu: bool = True


def training_default(name: str) -> Any:
    """The default of the TrainingArgs field `name`."""
    return next(f.default for f in dataclasses.fields(TrainingArgs) if f.name == name)


# Where a probe's own training settings still act in the frontier (`ProbedTraining`; the context: `FrontierWork`).
IN_THROUGHPUT_RUNS = (
    "in the throughput runs at the batch frontiers (measure_throughput: true, with a batch-size search); every probe "
    "trains probes.max_steps steps, probes.timing_warmup_steps of them warm-up"
)
WITH_BATCH_SEARCH = (
    "with a batch-size search (batch_size_search.enabled: true), which probes at it; the sequence-length search "
    "probes its own lengths, seq_length_search.start to seq_length_search.cap"
)


@dataclass
class ProbedTraining:
    """Each probe trains training_args with the probes' steps and its search's own size: these training_args settings
    act only where something else the frontier runs trains at them, and are refused at planning where nothing does
    (their scopes' context: `FrontierWork`). per_device_train_batch_size acts nowhere: the batch-size search probes
    its own sizes and its throughput runs train at the frontiers it finds, the sequence-length search trains at its
    own batch_size (a value equal to that one passes)."""

    # Each probe's steps and warm-up steps are the probes section's: these act only on the throughput runs.
    max_steps: int = acts_only(training_default("max_steps"), lambda work: work.measured_runs, IN_THROUGHPUT_RUNS)
    timing_warmup_steps: int = acts_only(
        training_default("timing_warmup_steps"), lambda work: work.measured_runs, IN_THROUGHPUT_RUNS
    )
    # The sequence length the batch-size search probes at and its throughput runs train at.
    max_seq_length: int = acts_only(
        training_default("max_seq_length"), lambda work: work.batch_search, WITH_BATCH_SEARCH
    )


def no_axes() -> ExperimentArgs:
    """An experiment that sweeps nothing: the training settings as given."""
    return ExperimentArgs(arm=[], per_device_train_batch_size=[])
