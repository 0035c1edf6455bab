"""The memory frontier's inputs validated and expanded: every problem with the arms, the searches, the probes and
the training settings named at once (each key at fault, before any probe runs), then one `FrontierSearch` per arm and
enabled dimension. What each section holds and where each setting acts: `frontier.settings`."""

import dataclasses
import itertools
from typing import NamedTuple

from finetune_bench.frontier.settings import (
    BATCH_SIZE,
    SEQ_LENGTH,
    BatchSizeSearch,
    FrontierArm,
    FrontierSearch,
    FrontierWork,
    ProbedTraining,
    ProbeSettings,
    SeqLengthSearch,
    ThroughputRuns,
    arm_name,
    arm_overrides,
    check_probe_steps,
    no_axes,
    search_enabled,
    training_default,
)
from finetune_bench.inputs.catalog import SYNTHETIC_PREFIX
from finetune_bench.inputs.condition_checks import validate_condition
from finetune_bench.inputs.errors import NOT_RUN, ConditionRefused, Problems, SpecError
from finetune_bench.inputs.plan import RunSettings
from finetune_bench.inputs.rules import acting_nowhere, check_fields, check_list
from finetune_bench.inputs.settings import TrainingArgs, check_setting
from finetune_bench.inputs.validation import check_settings_act, validate


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
        check_probe_steps(probes)
    ranges: list[_Range] = []
    with problems.check():
        check_sections_act(batch_size_search, seq_length_search)
    with problems.check():
        if search_enabled(batch_size_search):
            b = batch_size_search
            ranges.append(_Range(BATCH_SIZE, b.SECTION, b.start, b.cap, 1, {}))
    with problems.check():
        if search_enabled(seq_length_search):
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
    if given == training_default(BATCH_SIZE):
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
