"""What a fine-tune on a run's rows will meet: how many steps, how many padded tokens, which batch lengths and at
which steps they are new, drawn as the trainer draws its batches.

Each run records the lengths of the rows its batches are drawn from (`measuring.steady_state.ROW_LENGTHS`: after
tokenization, truncation and packing; the same rows whatever the arm). The fine-tune's batches are drawn as the plain
loop draws them: each epoch a new permutation of the rows, split over the ranks as a `DistributedSampler` splits it
(every W-th row), batches of `per_device_train_batch_size` consecutive rows (the last partial one dropped),
`gradient_accumulation_steps` micro-batches a step, each micro-batch padded to its longest row (rounded up to
`pad_to_multiple_of`; TRL's packing: one padding-free row of the batch's rows summed). The permutations are `DRAWS`
seeded draws, their counts averaged: the order the run will train in is one such draw. A step is a new-shape step
when some rank feeds a micro-batch length it has not fed before.

No torch: numpy and plain numbers (`analysis.projection` prices the schedule; `running.backends.shape_probes` times
the lengths it names).
"""

import json
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from finetune_bench.inputs.catalog import SYNTHETIC_PREFIX
from finetune_bench.inputs.errors import Problems, SpecError

# Seeded draws of the fine-tune's data order whose counts are averaged.
DRAWS = 8
# The most rows one draw of a fine-tune's data order may hold (its micro-batches × rows × ranks): the projection's
# own work and memory grow with it (about 2 s and 0.5 GB per draw at this bound on one core), so a larger fine-tune
# is refused at planning where its rows are known, and not projected where they are known only after the download.
MAX_DRAWN_ROWS = 20_000_000


def row_lengths(histogram: str) -> np.ndarray:
    """The rows' lengths from `length_histogram`'s text (in order of length: a draw permutes them)."""
    counts = json.loads(histogram)
    return np.repeat(np.array([int(n) for n in counts], dtype=np.int64), [int(c) for c in counts.values()])


@dataclass(frozen=True)
class FineTune:
    """The fine-tune the user plans: `steps` optimizer steps, or (0) `epochs` passes over the training rows."""

    epochs: float = 1.0
    steps: int = 0

    def describe(self) -> str:
        return f"{self.steps:,} steps" if self.steps else f"{self.epochs:g} epoch{'' if self.epochs == 1 else 's'}"


@dataclass(frozen=True)
class Batching:
    """How a condition batches its rows (its training_args)."""

    batch_size: int
    accumulation: int = 1
    world_size: int = 1
    pad_to_multiple_of: int = 0
    # The benchmark's warm-up steps: measured as they are, their shapes met before the projected steps.
    warmup_steps: int = 0
    # Each micro-batch flattened into one row of its rows' lengths summed (TRL's packing: padding-free batches).
    padding_free: bool = False


@dataclass(frozen=True)
class Schedule:
    """What the fine-tune will meet (counts averaged over `DRAWS` draws of its data order)."""

    steps: int
    # The steps after the benchmark's warm-up, their padded tokens (rank 0's) and how many met a new shape.
    projected_steps: int
    padded_tokens: float
    new_shape_steps: float
    # Every step's non-padding tokens, all ranks; the distinct micro-batch lengths any rank fed.
    tokens: float
    batch_shapes: float
    # The new-shape steps after the warm-up by the lengths new in them (several: ranks that met one each), and how
    # many there are of each (averaged over the draws).
    new_lengths: dict[tuple[int, ...], float] = field(default_factory=dict)
    # The steps after the warm-up: rank 0's rows × their padded length squared, summed (attention's work grows with it).
    padded_squared: float = 0.0


# More epochs or steps than any fine-tune trains: a slip (a token count written for steps).
MAX_FINE_TUNE_EPOCHS = 1000
MAX_FINE_TUNE_STEPS = 100_000_000


def check_fine_tune(fine_tune_epochs: float, fine_tune_steps: int) -> None:
    """The fine-tune inputs' types and ranges, every problem at once (SpecError)."""
    problems = Problems()
    epochs, steps = fine_tune_epochs, fine_tune_steps
    if isinstance(epochs, bool) or not isinstance(epochs, int | float) or not 0 < epochs <= MAX_FINE_TUNE_EPOCHS:
        problems.found.append(
            f"fine_tune_epochs must be a number of passes over the training data above 0 and at most "
            f"{MAX_FINE_TUNE_EPOCHS:,} (1: one epoch; 0.5: half of one), got {epochs!r}"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_FINE_TUNE_STEPS:
        problems.found.append(
            f"fine_tune_steps must be a whole number of optimizer steps from 0 (the epochs decide) to "
            f"{MAX_FINE_TUNE_STEPS:,}, got {steps!r}"
        )
    if not problems.found and steps and epochs != FineTune().epochs:
        problems.found.append(
            f"fine_tune_epochs {epochs:g} with fine_tune_steps {steps:,}: the steps decide the fine-tune, so the "
            "epochs would change nothing; leave one of them out"
        )
    problems.raise_if_any()


class NotProjected(ValueError):
    """A fine-tune this run's figures cannot project; the message says why."""


def _micro_batch_lengths(lengths: np.ndarray, batching: Batching, epochs: int, rng: np.random.Generator) -> np.ndarray:
    """Per rank (rows) and micro-batch in training order (columns): the padded length (padding-free: the one row's)
    and the non-padding tokens, over `epochs` epochs; shape (2, world_size, micro-batches)."""
    world, batch = batching.world_size, batching.batch_size
    per_rank = len(lengths) // world  # DistributedSampler with drop_last
    batches = per_rank // batch  # the loader's drop_last
    padded, tokens = [], []
    for _ in range(epochs):
        order = lengths[rng.permutation(len(lengths))][: per_rank * world]
        ranks = order.reshape(per_rank, world).T[:, : batches * batch].reshape(world, batches, batch)
        tokens.append(ranks.sum(axis=2))
        padded.append(tokens[-1] if batching.padding_free else ranks.max(axis=2))
    longest = np.concatenate(padded, axis=1)
    if batching.pad_to_multiple_of:
        multiple = batching.pad_to_multiple_of
        longest = -(-longest // multiple) * multiple
    return np.stack([longest, np.concatenate(tokens, axis=1)])


def fine_tune_steps(rows: int, batching: Batching, fine_tune: FineTune) -> int:
    """The fine-tune's optimizer steps: `fine_tune.steps`, or its epochs of micro-batches over the accumulation."""
    if fine_tune.steps:
        return fine_tune.steps
    micro_batches = (rows // batching.world_size) // batching.batch_size
    return int(fine_tune.epochs * micro_batches) // batching.accumulation


def schedule(lengths: np.ndarray, batching: Batching, fine_tune: FineTune, seed: int = 0) -> Schedule:
    """The fine-tune's steps, its padded tokens after the warm-up and its new-shape steps, averaged over `DRAWS`
    seeded draws of the data order. Raises NotProjected when the rows fill no step."""
    steps = fine_tune_steps(len(lengths), batching, fine_tune)
    micro_per_epoch = (len(lengths) // batching.world_size) // batching.batch_size
    if steps < 1 or micro_per_epoch < 1:
        if fine_tune.steps or fewest_epochs(len(lengths), batching) is None:
            raise NotProjected(
                f"{len(lengths)} training rows fill no step of {batching.batch_size} rows × {batching.accumulation} "
                f"micro-batches on {batching.world_size} rank(s)"
            )
        raise NotProjected(fills_no_step(fine_tune.epochs, len(lengths), batching))  # the epochs are too few
    accumulation, warmup = batching.accumulation, min(batching.warmup_steps, steps)
    micro_batches = steps * accumulation
    epochs = -(-micro_batches // micro_per_epoch)
    drawn = epochs * len(lengths)
    if drawn > MAX_DRAWN_ROWS:
        raise NotProjected(
            f"{too_large(steps, drawn)}; the run's own figures stand (set fine_tune_steps or fine_tune_epochs lower)"
        )
    padded = squared = new = tokens = shapes = 0.0
    new_lengths: Counter = Counter()
    for draw in range(DRAWS):
        rng = np.random.default_rng([seed, draw])
        longest, rows_tokens = _micro_batch_lengths(lengths, batching, epochs, rng)[:, :, :micro_batches]
        rows = 1 if batching.padding_free else batching.batch_size
        step_padded = longest[0].reshape(steps, accumulation).sum(axis=1) * rows
        padded += float(step_padded[warmup:].sum())
        step_squared = (longest[0].astype(np.float64) ** 2).reshape(steps, accumulation).sum(axis=1) * rows
        squared += float(step_squared[warmup:].sum())
        tokens += float(rows_tokens.sum())
        new_at: dict[int, set[int]] = {}  # step → the lengths some rank meets first there
        for rank_lengths in longest:  # the micro-batch where each length first appears on the rank
            seen, first = np.unique(rank_lengths, return_index=True)
            for length, step in zip(seen.tolist(), (first // accumulation).tolist(), strict=True):
                new_at.setdefault(step, set()).add(length)
        for step, met in new_at.items():
            if step >= warmup:
                new += 1
                new_lengths[tuple(sorted(met))] += 1
        shapes += len(np.unique(longest))
    return Schedule(
        steps=steps,
        projected_steps=steps - warmup,
        padded_tokens=padded / DRAWS,
        new_shape_steps=new / DRAWS,
        tokens=tokens / DRAWS,
        batch_shapes=shapes / DRAWS,
        new_lengths={lengths: count / DRAWS for lengths, count in new_lengths.items()},
        padded_squared=squared / DRAWS,
    )


def too_large(steps: int, drawn: int) -> str:
    """Why a fine-tune of `steps` optimizer steps drawing `drawn` rows is not projected."""
    return (
        f"a fine-tune of {steps:,} steps draws {drawn:,} rows, more than the {MAX_DRAWN_ROWS:,} the projection "
        "draws at most"
    )


def fewest_epochs(rows: int, batching: Batching) -> float | None:
    """The fewest `fine_tune_epochs` that fill one optimizer step with `rows` rows, rounded up to three significant
    digits; None where one epoch fills none (the rows, not the epochs, are too few)."""
    micro_batches = (rows // batching.world_size) // batching.batch_size
    if micro_batches < batching.accumulation:
        return None
    fewest = batching.accumulation / micro_batches
    digits = 2 - math.floor(math.log10(fewest))
    rounded = math.ceil(fewest * 10**digits - 1e-9) / 10**digits
    while int(rounded * micro_batches) < batching.accumulation:  # a float's last digit
        rounded = round(rounded + 10.0**-digits, digits)
    return rounded


def fills_no_step(epochs: float, rows: int, batching: Batching, packed: bool = False) -> str:
    """Why `epochs` passes over `rows` rows, one of which fills a step (`fewest_epochs`), fill no optimizer step, and
    what to set instead; `packed`: `rows` are examples that packing joins into at most as many rows."""
    micro_batches = (rows // batching.world_size) // batching.batch_size
    at_most = "at most " if packed else ""
    examples = " (packed: at most one row an example)" if packed else ""
    size = f"{batching.batch_size} row{'s' if batching.batch_size != 1 else ''}"
    return (
        f"fine_tune_epochs {epochs:g} fills no optimizer step: an epoch of {at_most}{rows:,} training rows{examples} "
        f"is {at_most}{micro_batches:,} micro-batches ({size} each on {batching.world_size} rank(s), "
        f"{batching.accumulation} a step), so nothing would be projected; set fine_tune_epochs to at least "
        f"{fewest_epochs(rows, batching):g}, or fine_tune_steps to the optimizer steps you plan"
    )


def check_fine_tune_fills(conditions: list["TrainingArgs"], epochs: float, steps: int) -> None:  # noqa: F821
    """Refuse, before anything trains, a fine-tune (`epochs` passes, or `steps` optimizer steps) whose size planning
    can compute (generated data, whose rows are known) that fills no optimizer step, or that would make the
    projection itself slow (`MAX_DRAWN_ROWS`); one problem per kind, naming the fine-tune once. Packed rows are known
    only once the data is tokenized, but each packed row holds at least one example's tokens (truncated to
    max_seq_length, as `running.backends.data.pack` and TRL's packing truncate them), so there are at most as many
    as examples: a packed fine-tune that fills no step even with that many is refused too, a slow one is left to the
    projection's own bound. The fine-tune left at its default (one epoch) is not refused for filling no step: a small
    grid is then measured and said not to project."""
    fine_tune = FineTune(epochs=epochs, steps=steps)
    asked = fine_tune != FineTune()
    empty = large = ""
    for args in conditions:
        if not args.dataset_name.startswith(SYNTHETIC_PREFIX):
            continue
        batching = batching_of(args)
        rows = max(args.synthetic_num_examples - args.eval_examples, 0)
        per_step = batching.batch_size * batching.accumulation * batching.world_size
        filled = (
            fine_tune_steps(rows, batching, fine_tune) if (rows // batching.world_size) // batching.batch_size else 0
        )
        if filled < 1 and asked and not empty:
            if steps or fewest_epochs(rows, batching) is None:  # the rows fill no step, whatever the epochs
                what = f"fine_tune_steps {steps:,}" if steps else f"fine_tune_epochs {epochs:g}"
                packed = " (packed: at most as many rows)" if args.packing else ""
                empty = (
                    f"{what}: {rows:,} training rows (training_args.synthetic_num_examples less eval_examples){packed} "
                    f"fill no optimizer step of {per_step:,} rows (batch × gradient_accumulation_steps × GPUs), so "
                    "nothing would be projected; generate more rows"
                )
            else:  # the rows fill a step: the epochs are too few
                empty = fills_no_step(epochs, rows, batching, packed=args.packing)
        elif filled >= 1 and filled * per_step > MAX_DRAWN_ROWS and not large and not args.packing:
            large = f"{too_large(filled, filled * per_step)}: set fine_tune_steps or fine_tune_epochs lower"
    problems = [problem for problem in (empty, large) if problem]
    if problems:
        raise SpecError(*problems)


def length_frequencies(lengths: np.ndarray, batching: Batching, fine_tune: FineTune, seed: int = 0) -> dict[int, float]:
    """How many micro-batches of each padded length the fine-tune feeds (any rank), averaged over `DRAWS` draws."""
    steps = fine_tune_steps(len(lengths), batching, fine_tune)
    micro_per_epoch = (len(lengths) // batching.world_size) // batching.batch_size
    if steps < 1 or micro_per_epoch < 1:
        return {}
    micro_batches = steps * batching.accumulation
    epochs = -(-micro_batches // micro_per_epoch)
    counts: Counter = Counter()
    for draw in range(DRAWS):
        longest = _micro_batch_lengths(lengths, batching, epochs, np.random.default_rng([seed, draw]))[0]
        counts.update(longest[:, :micro_batches].ravel().tolist())
    return {int(length): count / DRAWS for length, count in counts.items()}


def batching_of(args: "TrainingArgs") -> Batching:  # noqa: F821
    """How a run of `args` batches its rows."""
    return Batching(
        batch_size=args.per_device_train_batch_size,
        accumulation=args.gradient_accumulation_steps,
        world_size=args.world_size,
        pad_to_multiple_of=0 if args.packing else args.pad_to_multiple_of,
        warmup_steps=args.timing_warmup_steps,
        padding_free=args.packing and args.backend == "trl_sft",
    )
