"""The memory-frontier inputs and their searches: the arms compared, the batch-size and sequence-length
searches, how probes run; validated and expanded into one `FrontierSearch` per arm and dimension."""

import dataclasses
import itertools
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

from finetune_bench.inputs.catalog import SYNTHETIC_PREFIX
from finetune_bench.inputs.condition_checks import validate_condition
from finetune_bench.inputs.errors import NOT_RUN, ConditionRefused, Problems, SpecError
from finetune_bench.inputs.plan import MEASURED_RUNS, RunSettings
from finetune_bench.inputs.rules import (
    acting_nowhere,
    acts_everywhere,
    acts_only,
    check_fields,
    check_list,
    is_integer,
    requirement,
    setting,
)
from finetune_bench.inputs.sections import StrictFromJson
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, check_setting
from finetune_bench.inputs.validation import check_settings_act, validate

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
        _enabled(self)

    # Search this dimension at all; the first batch size probed, and the largest one tried.
    enabled: bool = acts_everywhere(flag(True))
    start: int = when_enabled(at_least(1, minimum=1))
    cap: int = when_enabled(at_least(256, minimum=1))


@dataclass
class SeqLengthSearch(StrictFromJson):
    """The largest max_seq_length, a multiple of `granularity`, that trains at batch size `batch_size`."""

    SECTION = "seq_length_search"

    def check(self, skip: Collection[str] = ()) -> None:
        _enabled(self)

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
                _check_probe_steps(self)
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


def _check_probe_steps(probes: ProbeSettings) -> None:
    """Some probe step is measured (whenever both counts are integers, whatever else is wrong)."""
    if is_integer(probes.timing_warmup_steps) and is_integer(probes.max_steps):
        if probes.timing_warmup_steps >= probes.max_steps:
            raise SpecError(
                f"probes.timing_warmup_steps ({probes.timing_warmup_steps}) must be below probes.max_steps "
                f"({probes.max_steps}): no step would be measured"
            )


def _enabled(search: BatchSizeSearch | SeqLengthSearch) -> bool:
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


def _training_default(name: str) -> Any:
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
    max_steps: int = acts_only(_training_default("max_steps"), lambda work: work.measured_runs, IN_THROUGHPUT_RUNS)
    timing_warmup_steps: int = acts_only(
        _training_default("timing_warmup_steps"), lambda work: work.measured_runs, IN_THROUGHPUT_RUNS
    )
    # The sequence length the batch-size search probes at and its throughput runs train at.
    max_seq_length: int = acts_only(
        _training_default("max_seq_length"), lambda work: work.batch_search, WITH_BATCH_SEARCH
    )


def check_training_acts(
    training_args: TrainingArgs, batch_size_search: "BatchSizeSearch | None" = None, measure_throughput: bool = True
) -> None:
    """Refuse a training_args setting that the probes replace with their own (`ProbedTraining`) where nothing else the
    frontier runs trains at it: max_steps and timing_warmup_steps without throughput runs, max_seq_length without a
    batch-size search; every problem at once."""
    search = batch_size_search if batch_size_search is not None else BatchSizeSearch()
    batch_search = search.enabled is True
    work = FrontierWork(batch_search, measured_runs=measure_throughput is True and batch_search)
    given = ProbedTraining(**{f.name: getattr(training_args, f.name) for f in dataclasses.fields(ProbedTraining)})
    found = acting_nowhere(
        ProbedTraining, [given], [work], lambda name: f"training_args.{name}", "nothing this frontier runs trains at it"
    )
    if found:
        raise SpecError(*found)


def check_throughput_settings(
    measure_throughput: bool = True,
    n_runs: int = 1,
    force_fresh: bool = False,
    results_store: str = "",
    condition_timeout_s: int = 3600,
    min_success_ratio: float = 0.1,
    batch_size_search: "BatchSizeSearch | None" = None,
) -> None:
    """Refuse the frontier's workflow settings that act in nothing it runs (their scopes: `RunSettings`,
    `ThroughputRuns`): the repeats, timeout, store and success ratio of throughput runs where none are measured
    (`measure_throughput` false, or no batch-size search: probes always run afresh, once each, and are never
    stored), and `measure_throughput` without a batch-size search; every problem at once."""
    search = batch_size_search if batch_size_search is not None else BatchSizeSearch()
    batch_search = search.enabled is True
    asked = measure_throughput is True
    work = FrontierWork(batch_search, measured_runs=asked and batch_search, throughput_asked=asked)
    execution = RunSettings(
        min_success_ratio=min_success_ratio,
        condition_timeout_s=condition_timeout_s,
        results_store=results_store,
        force_fresh=force_fresh,
    )
    found = [
        problem
        for section in (ThroughputRuns(measure_throughput, n_runs), execution)
        for problem in acting_nowhere(
            type(section), [section], [work], lambda name: name, "this frontier measures no throughput run"
        )
    ]
    if found:
        raise SpecError(*found)


def check_sections_act(*sections: "BatchSizeSearch | SeqLengthSearch") -> None:
    """Refuse a search's setting given where the search does not run (`when_enabled`), naming it as its section's."""
    found = [
        problem
        for section in sections
        for problem in acting_nowhere(
            type(section), [section], [section], lambda name, s=section: f"{s.SECTION}.{name}", "the search is disabled"
        )
    ]
    if found:
        raise SpecError(*found)


def plan_searches(
    training_args: TrainingArgs,
    arms: list[FrontierArm],
    batch_size_search: BatchSizeSearch,
    seq_length_search: SeqLengthSearch,
    probes: ProbeSettings,
    n_runs: int = 1,
    measure_throughput: bool = True,
) -> list[FrontierSearch]:
    """Validate every input (naming the key at fault; every problem at once) and list the searches: per arm, per
    enabled dimension. `measure_throughput`: whether throughput runs follow the batch-size search (the only runs
    that train at training_args' own steps, `check_training_acts`)."""
    problems = Problems()
    # The training settings as given (they are what the throughput runs train with) ...
    with problems.check():
        validate(no_axes(), training_args, n_runs)
    with problems.check():
        _check_arms(arms)
    with problems.check():
        check_fields(probes, probes.SECTION)
    with problems.check():
        _check_probe_steps(probes)
    ranges: list[_Range] = []
    with problems.check():
        check_sections_act(batch_size_search, seq_length_search)
    with problems.check():
        if _enabled(batch_size_search):
            b = batch_size_search
            ranges.append(_Range(BATCH_SIZE, b.SECTION, b.start, b.cap, 1, {}))
    with problems.check():
        if _enabled(seq_length_search):
            q = seq_length_search
            ranges.append(_Range(SEQ_LENGTH, q.SECTION, q.start, q.cap, q.granularity, {BATCH_SIZE: q.batch_size}))
    if not ranges and not problems.found:
        problems.found.append(
            "batch_size_search.enabled and seq_length_search.enabled are both false: nothing to search"
        )
    for r in ranges:
        with problems.check():
            _check_range(r)
    with problems.check():
        _check_not_replaced(training_args, ranges)
    with problems.check():
        check_training_acts(training_args, batch_size_search, measure_throughput)
    problems.raise_if_any()
    _check_data_fits(training_args, ranges)

    searches = []
    unrunnable = Problems()  # the first problem of each search, every search's at once
    for (index, arm), r in itertools.product(enumerate(arms), ranges):
        probe_args = dataclasses.replace(
            training_args,
            **arm_overrides(arm),
            **r.fixed,
            max_steps=probes.max_steps,
            timing_warmup_steps=probes.timing_warmup_steps,
        )
        # The probe settings at both ends of the range must be runnable settings.
        with unrunnable.check():
            for value in (r.start, r.cap):
                args = dataclasses.replace(probe_args, **{r.dimension: value})
                validate(no_axes(), args, 1)
                _check_probe_runs(args, {**arm_overrides(arm), r.dimension: value}, index)
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
                guided=probes.guided,
            )
        )
    with unrunnable.check():  # every probe's settings together, as a benchmark grid's conditions
        check_settings_act([s.training_args for s in searches])
    unrunnable.raise_if_any()
    return searches


def _check_probe_runs(args: TrainingArgs, swept: dict, index: int) -> None:
    """`validate_condition` of one probe's settings; a condition the benchmark would refuse alone (a liger arm on a
    model type Liger cannot patch) refuses the inputs here, naming the arm: its searches could only end as errors."""
    try:
        validate_condition(args, swept)
    except ConditionRefused as refused:
        raise SpecError(
            *(
                f"arms[{index}]: {problem.removesuffix(NOT_RUN).rstrip(' .')}; the memory frontier cannot search this "
                "arm (its every probe would end as an error): leave it out of arms"
                for problem in refused.problems
            )
        ) from None


def _check_not_replaced(training_args: TrainingArgs, ranges: list["_Range"]) -> None:
    """training_args.per_device_train_batch_size is a slip when it is not the default: nothing the frontier runs
    trains at it. The batch-size search probes its own sizes (and its throughput runs train at the frontiers it
    finds), the sequence-length search trains at its own `batch_size`; a value equal to that one says what that
    search trains at, and passes."""
    given = training_args.per_device_train_batch_size
    if given == _training_default(BATCH_SIZE):
        return
    by_dimension = {r.dimension: r for r in ranges}
    seq, batch = by_dimension.get(SEQ_LENGTH), by_dimension.get(BATCH_SIZE)
    if seq is not None and given == seq.fixed[BATCH_SIZE]:
        return
    if batch is not None:
        also = f"; the {SEQ_LENGTH} search trains at {seq.key}.batch_size ({seq.fixed[BATCH_SIZE]})" if seq else ""
        raise SpecError(
            f"training_args.{BATCH_SIZE} {given}: the batch-size search probes its own sizes, from {batch.key}.start "
            f"({batch.start}) to {batch.key}.cap ({batch.cap}), and the throughput runs train at the frontiers it "
            f"finds{also}, never at this value; to start the search there, set {batch.key}.start: {given}, or leave "
            f"{BATCH_SIZE} out of training_args"
        )
    if seq is not None:
        raise SpecError(
            f"training_args.{BATCH_SIZE} {given}: the {SEQ_LENGTH} search trains at its own {seq.key}.batch_size "
            f"({seq.fixed[BATCH_SIZE]}), not at this value; set {seq.key}.batch_size: {given}, or leave {BATCH_SIZE} "
            "out of training_args"
        )


def _check_range(r: "_Range") -> None:
    """A search's start and cap (each valid): in order, on its granularity."""
    if r.cap < r.start:
        raise SpecError(f"{r.key}.cap ({r.cap}) must not be below {r.key}.start ({r.start})")
    if r.start % r.granularity or r.cap % r.granularity:
        raise SpecError(
            f"{r.key}.start ({r.start}) and {r.key}.cap ({r.cap}) must be multiples of "
            f"{r.key}.granularity ({r.granularity})"
        )


class _Range(NamedTuple):
    """A dimension's search range, and the input key it came from (for messages)."""

    dimension: str
    key: str
    start: int
    cap: int
    granularity: int
    # Settings every probe of this dimension fixes (the sequence-length search's batch size).
    fixed: dict


def no_axes() -> ExperimentArgs:
    """An experiment that sweeps nothing: the training settings as given."""
    return ExperimentArgs(arm=[], per_device_train_batch_size=[])


def _check_arms(arms: list[FrontierArm]) -> None:
    """A list of at least one arm, each setting of every arm valid (every problem at once), no arm twice."""
    if not isinstance(arms, list):
        check_list("arms", arms, FrontierArm, "arms", FrontierArm.LIST_EXAMPLE, wrap="{{arm: {}}}")
    if not arms:
        raise SpecError("arms must list at least one arm, e.g. [{arm: liger}, {arm: baseline}]")
    problems = Problems()
    for index, arm in enumerate(arms):
        for name, value in arm_overrides(arm).items():
            with problems.check():
                check_setting(f"arms[{index}].{name}", name, value)
    problems.raise_if_any()
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
    ranks = training_args.world_size
    if BATCH_SIZE in largest and training_args.synthetic_num_examples < largest[BATCH_SIZE] * ranks:
        on_ranks = f" × {ranks} GPUs (each rank its own batch)" if ranks > 1 else ""
        raise SpecError(
            f"training_args.synthetic_num_examples ({training_args.synthetic_num_examples}) is below "
            f"batch_size_search.cap ({largest[BATCH_SIZE]}){on_ranks}: a step cannot take more examples than the "
            "dataset has"
        )
    longest = max(largest.get(SEQ_LENGTH, 0), training_args.max_seq_length if BATCH_SIZE in largest else 0)
    if training_args.synthetic_min_words < longest:
        raise SpecError(
            f"training_args.synthetic_min_words ({training_args.synthetic_min_words}) is below the longest "
            f"sequence probed ({longest} tokens): shorter examples would not fill the sequence"
        )
