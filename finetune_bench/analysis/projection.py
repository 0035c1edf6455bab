"""The user's whole fine-tune, projected from a short benchmark: how many steps and batch shapes it will meet, and
what it will cost with and without each arm.

A short benchmark on padded data meets a new batch shape at most of its steps, a real fine-tune at a few of its
thousands; so the all-steps throughput of a short run depends on how many steps it ran, not on the user's training.
What does not depend on it:

- **the rows the loader batches**: every training row's length after tokenization, truncation and packing, recorded
  by the run as a histogram (`measuring.steady_state.ROW_LENGTHS`: the same rows whatever the arm);
- **the step-time line**: the expected time of a step of P padded tokens (and, over steps of many lengths, of
  attention's work, the rows × their length squared: `fit_across_lengths`), from the steps at a shape already met:
  the timed steps that met no new shape and the new-shape probes' second steps (`running.backends.shape_probes`,
  spread over the lengths the fine-tune meets, so that the line holds where every timed step met a new length),
  moved to the mean of them all, the slow ones included (a total is a sum: a pause at a known shape is time the
  fine-tune pays, at the rate the benchmark met it); and the mean time a new-shape step took beyond it.

The fine-tune's batches, its steps and the lengths new at each are drawn as the trainer draws them
(`prediction.fine_tune.schedule`). Then, per run:

    projected time = the benchmark's warm-up steps as measured
                   + intercept × the steps after them + slope × their padded tokens (rank 0's, as the line's are)
                   (+ quadratic × their rows × padded length squared, where the line has that term)
                   + each of their new-shape steps at its length's cost: the run's probe of that length
                     (`running.backends.shape_probes`), else the mean of its probes and timed new-shape steps

and its throughput, the fine-tune's non-padding tokens over that time, is compared between arms as every other
throughput is (`analysis.stats`: the geometric mean of paired ratios, its t interval). Packed rows or full
sequences are one shape: the projection is then the timed steps' mean step time, slow steps included, with the
warm-up added. Evaluation, checkpointing and start-up are not projected.

Timed steps and probes during which the kernel caches grew (`measuring.jit_cache`: the first run on a machine
compiling kernels, CUDA's or Triton's, up to 1.5-3 s a step, once for the machine and not again) price no length and do
not move the line: the machine's one-time compilations are no part of what each step or new length costs. They are
the only steps left out: a step slower than `OUTLIER_FACTOR` × its expected time for any other reason (a garbage
collection, a kernel loaded again for a new argument) is projected as measured, unlike the steady-state
throughput, which no single slow step moves by design (`measuring.steady_state`).

No torch: numpy and the step table's plain numbers.
"""

import dataclasses
import json
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from finetune_bench.analysis.batch_shapes import REMEDY
from finetune_bench.analysis.numbers import number_text, setting_text
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT
from finetune_bench.measuring.jit_cache import COMPILING_BYTES
from finetune_bench.measuring.steady_state import (
    MIN_STEADY_STEPS,
    OUTLIER_FACTOR,
    ROW_LENGTHS,
    SHAPE_PROBES,
    SHAPE_PROBES_JIT,
    SHAPE_PROBES_REPEAT,
    StepTimeModel,
    TimedStep,
    fit_step_time,
)
from finetune_bench.prediction.fine_tune import FineTune, NotProjected, Schedule, batching_of, row_lengths, schedule
from finetune_bench.results.record import OK

# Where new shapes make more than this share of a projected time and fewer than `SURE_NEW_SHAPE_SAMPLES` timed steps
# priced them, the verdict says the figure rests on them.
UNSURE_NEW_SHAPE_SHARE = 0.05
# From this many probes that compiled nothing, the probes alone price new lengths (`step_costs`).
SURE_PROBES = 8
# Steps of at least this many distinct sizes fit attention's term beside the line (`fit_across_lengths`).
MIN_SIZES_FOR_QUADRATIC = 6
SURE_NEW_SHAPE_SAMPLES = 10
# The per-run figures the projection adds to the results table.
PROJECTED_TIME = "projected_fine_tune_s"
PROJECTED_THROUGHPUT = "projected_tokens_per_second"
NEW_SHAPE_PRICE = "new_shape_price_s"
# The backends whose batches are the rows' as recorded, padded per micro-batch (TRL builds its own rows; a
# forward-only run trains nothing).
PROJECTED_BACKENDS = ("plain_loop", "hf_trainer", "trl_sft")


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
    # How many new-shape steps and probes were left out of the prices because the kernel caches grew in them.
    compiling_samples: int = 0

    def length_cost(self, length: int) -> float:
        """What a step meeting `length` first costs beyond the line: its probe's, else the mean new-shape cost."""
        return self.probed.get(length, self.new_shape_step_s or 0.0)


def shape_squared(batch_shape: str) -> float:
    """A step's rows × their padded length squared, summed over its micro-batches ("4x512+4x480"; "" or a shape that
    is not rows x length: 0): what attention's work grows with, beyond the padded tokens."""
    total = 0.0
    for part in str(batch_shape or "").split("+"):
        rows, _, length = part.partition("x")
        if rows.isdigit() and length.isdigit():
            total += int(rows) * int(length) ** 2
    return total


def fit_across_lengths(samples: list[tuple[float, float, float]]) -> StepTimeModel | None:
    """The expected step time from steps whose shape was known, (seconds, padded tokens, rows × length²) each: the
    Theil–Sen line of `fit_step_time`, or, where they span `MIN_SIZES_FOR_QUADRATIC` lengths and know their shapes,
    intercept + slope × padded tokens + quadratic × rows × length² by non-negative least squares (scipy's `nnls`)
    over the samples within `OUTLIER_FACTOR` of the line (attention grows with the square of the length: over a
    range of lengths from a hundred to a few thousand a line alone bends away at its ends). None: too few samples."""
    line = fit_step_time([TimedStep(0, seconds, 0, int(padded), "", False) for seconds, padded, _ in samples])
    if line is None or len({padded for _, padded, _ in samples}) < MIN_SIZES_FOR_QUADRATIC:
        return line
    kept = [(t, p, q) for t, p, q in samples if q > 0 and t <= OUTLIER_FACTOR * line.expected(p)]
    if len({p for _, p, _ in kept}) < MIN_SIZES_FOR_QUADRATIC:
        return line
    from scipy.optimize import nnls

    design = np.array([[1.0, p, q] for _, p, q in kept])
    seconds = np.array([t for t, _, _ in kept])
    scale = design.max(axis=0)  # the columns differ by ten orders of magnitude
    (intercept, slope, quadratic), _ = nnls(design / scale, seconds)
    intercept, slope, quadratic = intercept / scale[0], slope / scale[1], quadratic / scale[2]
    if quadratic <= 0 or slope <= 0:
        return line
    return StepTimeModel(float(intercept), float(slope), "quadratic", float(quadratic))


def step_costs(
    steps: pd.DataFrame,
    probes: dict[int, float] | None = None,
    rows_per_probe: int = 1,
    compiling_probes: Collection[int] = (),
    repeats: dict[int, float] | None = None,
) -> StepCosts:
    """A run's step costs from its rows of the step table (`step`, `step_time_s`, `padded_tokens`, `new_shape`,
    `is_warmup`, `jit_cache_bytes`, `batch_shape`, ...) and its probes: the first step at each length (`probes`) and
    the second (`repeats`), seconds each, of `rows_per_probe` rows (the batch times the micro-batches of a step);
    `compiling_probes`: the lengths whose probe grew the kernel caches by `COMPILING_BYTES` or more. The step-time
    line is fitted over the timed steps that met no new shape and the probes' second steps (`fit_across_lengths`),
    the probes that compiled left out, then moved to the mean of those steps, slow ones included, the steps that grew
    the JIT cache by that much left out; the mean new-shape cost is over the probes' first steps (and the timed
    new-shape steps where fewer than `SURE_PROBES` probes compiled nothing), those that grew the JIT cache by that
    much left out (all kept where every one did; the same for the warm-up's new-shape steps where they price it).
    Raises NotProjected when no step-time line can be fitted."""
    warmup = steps["is_warmup"].astype(bool)
    jit = steps["jit_cache_bytes"] if "jit_cache_bytes" in steps else pd.Series(0, index=steps.index)
    compiling = set(steps.loc[pd.to_numeric(jit, errors="coerce").fillna(0) >= COMPILING_BYTES, "step"].astype(int))
    shapes = steps["batch_shape"] if "batch_shape" in steps else pd.Series("", index=steps.index)
    squared = {int(step): shape_squared(shape) for step, shape in zip(steps["step"], shapes, strict=True)}
    timed = [
        TimedStep(int(r.step), float(r.step_time_s), int(r.non_padding_tokens), int(r.padded_tokens), "", r.new_shape)
        for r in steps[~warmup].astype({"new_shape": bool}).itertuples()
    ]
    known = [s for s in timed if not s.new_shape and s.padded_tokens > 0]
    repeated = [
        (seconds, length * rows_per_probe, rows_per_probe * length**2)
        for length, seconds in (repeats or {}).items()
        if length not in compiling_probes
    ]
    steady = [(s.seconds, s.padded_tokens, squared[s.step]) for s in known] + repeated
    line = fit_across_lengths(steady)
    if line is None:
        raise NotProjected(
            f"fewer than {MIN_STEADY_STEPS} steps at a batch shape already met (timed steps, or the new-shape probes' "
            "second steps): no step-time line (run more steps, set new_shape_probes, or make shapes repeat)"
        )
    # A total is a sum: the line (robust, it sits below a right tail of slower steps) moved to the mean of every
    # step at a known shape, the slow ones too: a pause at a shape already met (a garbage collection, a kernel
    # compiled again for a new argument) is time the fine-tune pays, at the rate the benchmark met it. Left out: the
    # steps that grew the JIT cache, the machine's one-time compilations (the line stands where every one did).
    paid = [(s.seconds, s.padded_tokens, squared[s.step]) for s in known if s.step not in compiling] + repeated
    if paid:
        shift = sum(t - line.expected(p, q) for t, p, q in paid) / len(paid)
        line = dataclasses.replace(line, intercept=line.intercept + shift)

    def beyond(seconds: float, padded: float, square: float) -> float:
        return max(seconds - line.expected(padded, square), 0.0)

    probed = {
        length: beyond(seconds, length * rows_per_probe, rows_per_probe * length**2)
        for length, seconds in (probes or {}).items()
    }
    # (whether the JIT cache grew in it, what it cost beyond the line) of each probe; of each timed new-shape step
    # too where fewer than `SURE_PROBES` probes compiled nothing: a new length costs more in a run's first steps than
    # later (on an H200, baseline: a timed new-length step of a run's first 20 0.13-0.16 s beyond the line, a probe
    # made after them 0.07-0.12 s, a new-length step of a 300-step fine-tune 0.10 s on average, falling from 0.12 over
    # its first 50 steps to 0.08 over its last 100; not the allocator, which made 0.2 cudaMalloc calls a step there:
    # docs/measurements.md)
    samples = [(length in compiling_probes, cost) for length, cost in probed.items()]
    if sum(not compiled for compiled, _ in samples) < SURE_PROBES:
        samples += [
            (s.step in compiling, beyond(s.seconds, s.padded_tokens, squared[s.step])) for s in timed if s.new_shape
        ]
    excess, left_out = _compiling_left_out(samples)
    if left_out:
        probed = {length: cost for length, cost in probed.items() if length not in compiling_probes}
    if not excess:  # the warm-up's new shapes after its first step (which pays for everything met first)
        rows = steps[warmup & steps["new_shape"].astype(bool) & (steps["step"] > steps["step"].min())]
        warmup_samples = [
            (r.step in compiling, beyond(r.step_time_s, r.padded_tokens, squared[int(r.step)]))
            for r in rows.itertuples()
        ]
        excess, _ = _compiling_left_out(warmup_samples)
    mean = sum(excess) / len(excess) if excess else None
    return StepCosts(line, mean, float(steps.loc[warmup, "step_time_s"].sum()), len(excess), probed, left_out)


def _compiling_left_out(samples: list[tuple[bool, float]]) -> tuple[list[float], int]:
    """Of (whether the JIT cache grew in it, its cost) samples: the costs of those that compiled nothing, and how
    many were left out; all of them (none left out) where every one compiled."""
    kept = [cost for compiled, cost in samples if not compiled]
    if not kept:
        return [cost for _, cost in samples], 0
    return kept, len(samples) - len(kept)


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
    line = (
        costs.line.intercept * plan.projected_steps
        + costs.line.slope * plan.padded_tokens
        + costs.line.quadratic * plan.padded_squared
    )
    return costs.warmup_s + line + new_shapes


# The per-run columns `projection_table` makes (beside condition_id and run_number).
PROJECTION_COLUMNS = [
    "fine_tune_steps",
    "fine_tune_batch_shapes",
    "fine_tune_new_shape_steps",
    # the share of the projected time that the new shapes' cost makes, and how many timed steps priced it
    "new_shape_share",
    "new_shape_samples",
    # what a step meeting a new length costs beyond the line (the mean over the run's new-shape steps and probes)
    NEW_SHAPE_PRICE,
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
            probes, repeats = (
                {int(k): float(v) for k, v in json.loads(result.details.get(key) or "{}").items()}
                for key in (SHAPE_PROBES, SHAPE_PROBES_REPEAT)
            )
            grown = json.loads(result.details.get(SHAPE_PROBES_JIT) or "{}").items()
            compiling = {int(length) for length, size in grown if size >= COMPILING_BYTES}
            costs = step_costs(
                mine, probes, args.per_device_train_batch_size * args.gradient_accumulation_steps, compiling, repeats
            )
            seconds = projected_seconds(costs, plan)
            row.update(
                new_shape_share=new_shapes_seconds(costs, plan) / seconds,
                new_shape_samples=costs.new_shape_samples,
                **{NEW_SHAPE_PRICE: costs.new_shape_step_s},
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
        where = ", ".join(setting_text(axis, row[axis]) for axis in others)
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
            f"lengths differ in price (cuDNN's attention plans; docs/report.md#your-fine-tune), "
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
