"""The user's whole fine-tune, projected from a short benchmark: how many steps and batch shapes it will meet, and
what it will cost with and without each arm.

A short benchmark on padded data meets a new batch shape at most of its steps, a real fine-tune at a few of its
thousands; so the all-steps throughput of a short run depends on how many steps it ran, not on the user's training.
What does not depend on it:

- **the rows the loader batches**: every training row's length after tokenization, truncation and packing, recorded
  by the run as a histogram (`measuring.steady_state.ROW_LENGTHS`: the same rows whatever the arm);
- **the step-time line**: the expected time of a step of P padded tokens (`measuring.steady_state.fit_step_time`,
  from the timed steps that met no new shape, moved to their mean: a total is a sum), and the mean time a timed
  new-shape step took beyond it.

The fine-tune's batches are drawn as the plain loop draws them: each epoch a new permutation of the rows, split over
the ranks as a `DistributedSampler` splits it (every W-th row), batches of `per_device_train_batch_size` consecutive
rows (the last partial one dropped), `gradient_accumulation_steps` micro-batches a step, each micro-batch padded to its
longest row (rounded up to `pad_to_multiple_of`). The permutations are `DRAWS` seeded draws, their counts averaged:
the order the run will train in is one such draw. A step is a new-shape step when some rank feeds a micro-batch
length it has not fed before. Then, per run:

    projected time = the benchmark's warm-up steps as measured
                   + intercept × the steps after them + slope × their padded tokens (rank 0's, as the line's are)
                   + their new-shape steps × the mean new-shape cost

and its throughput, the fine-tune's non-padding tokens over that time, is compared between arms as every other
throughput is (`analysis.stats`: the median of paired ratios, its interval). Packed rows or full sequences are one
shape: the projection is then the steady state, with the warm-up added. Evaluation, checkpointing and start-up are
not projected.

No torch: numpy and the step table's plain numbers.
"""

import json
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from finetune_bench.analysis.batch_shapes import REMEDY
from finetune_bench.analysis.numbers import number_text
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT
from finetune_bench.inputs.errors import Problems
from finetune_bench.measuring.steady_state import (
    MIN_STEADY_STEPS,
    OUTLIER_FACTOR,
    ROW_LENGTHS,
    StepTimeModel,
    TimedStep,
    fit_step_time,
)
from finetune_bench.results.record import OK

# Seeded draws of the fine-tune's data order whose counts are averaged.
DRAWS = 8
# Where new shapes make more than this share of a projected time and fewer than `SURE_NEW_SHAPE_SAMPLES` timed steps
# priced them, the verdict says the figure rests on them.
UNSURE_NEW_SHAPE_SHARE = 0.05
SURE_NEW_SHAPE_SAMPLES = 10
# The key of a run's details holding its new-shape probes (JSON {length: seconds}; `running.backends.shape_probes`).
SHAPE_PROBES = "shape_probes"
# The per-run figures the projection adds to the results table.
PROJECTED_TIME = "projected_fine_tune_s"
PROJECTED_THROUGHPUT = "projected_tokens_per_second"
# The backends whose batches are the rows' as recorded, padded per micro-batch (TRL builds its own rows; a
# forward-only run trains nothing).
PROJECTED_BACKENDS = ("plain_loop", "hf_trainer", "trl_sft")


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
        raise NotProjected(
            f"{len(lengths)} training rows fill no step of {batching.batch_size} rows × {batching.accumulation} "
            f"micro-batches on {batching.world_size} rank(s)"
        )
    accumulation, warmup = batching.accumulation, min(batching.warmup_steps, steps)
    micro_batches = steps * accumulation
    epochs = -(-micro_batches // micro_per_epoch)
    padded = new = tokens = shapes = 0.0
    new_lengths: Counter = Counter()
    for draw in range(DRAWS):
        rng = np.random.default_rng([seed, draw])
        longest, rows_tokens = _micro_batch_lengths(lengths, batching, epochs, rng)[:, :, :micro_batches]
        rows = 1 if batching.padding_free else batching.batch_size
        step_padded = longest[0].reshape(steps, accumulation).sum(axis=1) * rows
        padded += float(step_padded[warmup:].sum())
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
    )


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


@dataclass(frozen=True)
class StepCosts:
    """What a run's timed steps say a step costs: the step-time line, and the mean time a new-shape step took beyond
    it (where no timed step met a new shape, the warm-up's new-shape steps after its first; None: none did); with the
    warm-up steps' measured time."""

    line: StepTimeModel
    new_shape_step_s: float | None
    warmup_s: float
    # How many new-shape steps the new-shape cost is the mean of.
    new_shape_samples: int = 0
    # The probes' lengths and what a step at each took beyond the line the first time (`running.backends.shape_probes`).
    probed: dict[int, float] = field(default_factory=dict)

    def length_cost(self, length: int) -> float:
        """What a step meeting `length` first costs beyond the line: its probe's, else the mean new-shape cost."""
        return self.probed.get(length, self.new_shape_step_s or 0.0)


def step_costs(steps: pd.DataFrame, probes: dict[int, float] | None = None, rows_per_probe: int = 1) -> StepCosts:
    """A run's step costs from its rows of the step table (`step`, `step_time_s`, `padded_tokens`, `new_shape`,
    `is_warmup`, ...) and its probes (seconds of a step at each length, `rows_per_probe` rows of it: the batch times
    the micro-batches of a step). The mean new-shape cost is over the timed new-shape steps and the probes. Raises
    NotProjected when its steady state is not known."""
    warmup = steps["is_warmup"].astype(bool)
    timed = [
        TimedStep(int(r.step), float(r.step_time_s), int(r.non_padding_tokens), int(r.padded_tokens), "", r.new_shape)
        for r in steps[~warmup].astype({"new_shape": bool}).itertuples()
    ]
    steady = [s for s in timed if not s.new_shape and s.padded_tokens > 0]
    line = fit_step_time(steady)
    if line is None:
        raise NotProjected(
            f"fewer than {MIN_STEADY_STEPS} timed steps met no new batch shape: no step-time line (run more steps, or "
            "make shapes repeat)"
        )
    # A total is a sum: the line moved to the steady steps' mean (the median-based fit sits below a right tail of
    # slightly slower steps), the outliers left out (a rare pause is no part of every step).
    residuals = [s.seconds - line.expected(s.padded_tokens) for s in steady]
    usual = [
        r
        for s, r in zip(steady, residuals, strict=True)
        if s.seconds <= OUTLIER_FACTOR * line.expected(s.padded_tokens)
    ]
    if usual:
        line = StepTimeModel(line.intercept + sum(usual) / len(usual), line.slope, line.kind)
    probed = {
        length: max(seconds - line.expected(length * rows_per_probe), 0.0) for length, seconds in (probes or {}).items()
    }
    excess = [max(s.seconds - line.expected(s.padded_tokens), 0.0) for s in timed if s.new_shape]
    excess += probed.values()
    if not excess:  # the warm-up's new shapes after its first step (which pays for everything met first)
        rows = steps[warmup & steps["new_shape"].astype(bool) & (steps["step"] > steps["step"].min())]
        excess = [max(r.step_time_s - line.expected(r.padded_tokens), 0.0) for r in rows.itertuples()]
    mean = sum(excess) / len(excess) if excess else None
    return StepCosts(line, mean, float(steps.loc[warmup, "step_time_s"].sum()), len(excess), probed)


def new_shapes_seconds(costs: StepCosts, plan: Schedule) -> float:
    """What the fine-tune's new-shape steps after the warm-up cost beyond the line (0 without a cost): each at its
    lengths' cost (`StepCosts.length_cost`; several ranks meeting a length each: the dearest, as they wait for it)."""
    if not plan.new_lengths:
        return plan.new_shape_steps * (costs.new_shape_step_s or 0.0)
    return sum(count * max(costs.length_cost(length) for length in met) for met, count in plan.new_lengths.items())


def projected_seconds(costs: StepCosts, plan: Schedule) -> float:
    """The fine-tune's training time on `costs`: the warm-up as measured, the steps after it on the line, and their
    new-shape steps at the mean new-shape cost. Raises NotProjected when the fine-tune meets new shapes after the
    warm-up and no step of the run but its first met one (their cost is not known)."""
    new_shapes = 0.0
    if plan.new_shape_steps >= 0.5:
        if costs.new_shape_step_s is None:
            raise NotProjected(
                f"the fine-tune meets about {plan.new_shape_steps:.0f} new batch shapes, and no step of this run but "
                "its first met one: their cost is not known (run more steps)"
            )
        new_shapes = new_shapes_seconds(costs, plan)
    line = costs.line.intercept * plan.projected_steps + costs.line.slope * plan.padded_tokens
    return costs.warmup_s + line + new_shapes


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


# The per-run columns `projection_table` makes (beside condition_id and run_number).
PROJECTION_COLUMNS = [
    "fine_tune_steps",
    "fine_tune_batch_shapes",
    "fine_tune_new_shape_steps",
    # the share of the projected time that the new shapes' cost makes, and how many timed steps priced it
    "new_shape_share",
    "new_shape_samples",
    PROJECTED_TIME,
    PROJECTED_THROUGHPUT,
    "projection_note",
]


def projection_table(results: list, steps: pd.DataFrame, fine_tune: FineTune) -> pd.DataFrame:
    """Per ok run of `results` (RunResult records; None: lost): the fine-tune's steps and batch shapes, its
    projected training time and throughput, or (`projection_note`) why it is not projected."""
    rows, schedules = [], {}
    for result in results:
        if result is None or result.status != OK:
            continue
        row = {"condition_id": result.condition_id, "run_number": result.run_number}
        args = result.training_args
        try:
            if args.backend not in PROJECTED_BACKENDS:
                raise NotProjected(f"the {args.backend} backend trains nothing to project")
            histogram = result.details.get(ROW_LENGTHS, "")
            if not histogram:
                raise NotProjected(
                    "the run recorded no row lengths (measured by an earlier release: force_fresh: true measures it "
                    "again)"
                )
            batching = batching_of(args)
            key = (histogram, batching)
            if key not in schedules:
                schedules[key] = schedule(row_lengths(histogram), batching, fine_tune, seed=args.seed)
            plan = schedules[key]
            mine = steps[(steps["condition_id"] == result.condition_id) & (steps["run_number"] == result.run_number)]
            if mine.empty:
                raise NotProjected("the run's steps are not known")
            probes = {int(k): float(v) for k, v in json.loads(result.details.get(SHAPE_PROBES) or "{}").items()}
            costs = step_costs(mine, probes, args.per_device_train_batch_size * args.gradient_accumulation_steps)
            seconds = projected_seconds(costs, plan)
            row.update(
                new_shape_share=new_shapes_seconds(costs, plan) / seconds,
                new_shape_samples=costs.new_shape_samples,
                fine_tune_steps=plan.steps,
                fine_tune_batch_shapes=plan.batch_shapes,
                fine_tune_new_shape_steps=plan.new_shape_steps,
                **{PROJECTED_TIME: seconds, PROJECTED_THROUGHPUT: plan.tokens / seconds},
                projection_note="",
            )
        except NotProjected as reason:
            row["projection_note"] = str(reason)
        rows.append(row)
    return pd.DataFrame(rows, columns=["condition_id", "run_number", *PROJECTION_COLUMNS])


def duration_text(seconds: float) -> str:
    """A duration as a reader takes it in: "42 s", "12.5 min", "3.2 h"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _ratio_text(row: dict, name: str) -> str:
    ratio = row.get(f"{name}_ratio")
    if ratio is None or pd.isna(ratio):
        return "–"
    low, high = row.get(f"{name}_ci_low"), row.get(f"{name}_ci_high")
    interval = f" [{number_text(low)}, {number_text(high)}]" if low is not None and pd.notna(low) else ""
    return f"×{number_text(ratio)}{interval}"


def projection_verdicts(
    table: pd.DataFrame, paired: pd.DataFrame, swept: list[str], fine_tune: FineTune, gpu_hour_price: float = 0.0
) -> list[str]:
    """One sentence per arm (and point of the other axes) on the user's whole fine-tune: its steps and batch shapes,
    each side's projected training time (and cost at `gpu_hour_price`), the ratio of projected throughputs with its
    interval over paired runs; beside it the steady-state ratio and the all-steps ratio as measured. Where the runs
    cannot be projected, why."""
    if paired.empty or "arm" not in swept or PROJECTED_TIME not in table:
        return []
    others = [axis for axis in swept if axis != "arm"]
    ok = table[table["status"] == OK]
    lines = []
    for row in paired.to_dict("records"):
        if row["arm"] == BASELINE_REPEAT or not row.get("pairs"):
            continue
        at = ok
        for axis in others:
            at = at[at[axis] == row[axis]]
        sides = {arm: at[at["arm"] == arm] for arm in (BASELINE, row["arm"])}
        where = ", ".join(f"{axis} {row[axis]}" for axis in others)
        where = f" at {where}" if where else ""
        seconds = {arm: runs[PROJECTED_TIME].median() for arm, runs in sides.items()}
        if any(pd.isna(value) for value in seconds.values()):
            notes = [note for runs in sides.values() for note in runs["projection_note"].fillna("") if note]
            why = notes[0] if notes else "no run of one side has a projection"
            lines.append(f"{row['arm']}: your fine-tune ({fine_tune.describe()}){where} is not projected: {why}.")
            continue
        runs = pd.concat(sides.values())
        steps, shapes = runs["fine_tune_steps"].median(), runs["fine_tune_batch_shapes"].median()
        times = []
        for arm, value in seconds.items():
            text = f"{arm} {duration_text(value)}"
            if gpu_hour_price > 0:
                gpus = sides[arm]["world_size"].median() if "world_size" in sides[arm] else 1
                text += f" ({gpu_hour_price * gpus * value / 3600:,.2f} at {gpu_hour_price:g} per GPU-hour)"
            times.append(text)
        timed = at["steps_measured"].median() if "steps_measured" in at else float("nan")
        timed_text = f"all {timed:.0f} timed steps" if pd.notna(timed) else "all timed steps"
        share, samples = runs["new_shape_share"].max(), runs["new_shape_samples"].min()
        caveat = (
            f" New shapes make {share:.0%} of a projected time, priced from {samples:.0f} step(s) that met one: "
            f"a few lengths can cost far more than the rest (cuDNN's attention plans; docs/report.md#your-fine-tune), "
            f"so run more steps for a surer figure, or make shapes repeat ({REMEDY})."
            if share > UNSURE_NEW_SHAPE_SHARE and samples < SURE_NEW_SHAPE_SAMPLES
            else ""
        )
        lines.append(
            f"{row['arm']}: your fine-tune ({'' if fine_tune.steps else fine_tune.describe() + ': '}{steps:,.0f} "
            f"steps, {shapes:.0f} batch shape{'' if round(shapes) == 1 else 's'}){where}: {', '.join(times)}: "
            "throughput "
            f"{_ratio_text(row, 'projected_throughput')} (projected); steady state "
            f"{_ratio_text(row, 'steady_throughput')}, {timed_text} {_ratio_text(row, 'throughput')} (as measured)."
            + caveat
        )
    return lines
