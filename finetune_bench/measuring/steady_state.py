"""Timing that one slow step cannot swing: a run's steady-state throughput and the price it paid for new batch shapes.

On padded data every batch is as long as its longest example, so a run meets many batch shapes. The first step that
feeds a shape can be slow (a kernel specialised or compiled for it, the allocator growing its cache, a library
choosing an algorithm for it), and one such step among ten timed ones moves a mean-based throughput by tens of per
cent. The steps whose every micro-batch shape the run had already fed (on several GPUs: no rank fed a new one) are
the *steady* steps; they say how long a step of a given size takes once its shapes are known.

The expected time of a step of P padded tokens comes from the steady steps alone, robustly: a Theil–Sen line
(scipy's `theilslopes`: the median of pairwise slopes, the median residual) of step time against P where the steady
steps span at least `MIN_SIZES_FOR_LINE` sizes, else the median steady time per padded token times P. Then

- the steady-state throughput is every measured step's non-padding tokens over the sum of their expected times:
  the run's own mix of batch sizes at the steady rate (on full, unpadded sequences: tokens over the median step);
- the new-shape cost is what the measured steps that met a new shape took beyond their expected time;
- an outlier is a measured step that took more than `OUTLIER_FACTOR` times its expected time, new shape or not.

No torch: the summary of a run (`measuring.steps`) and the tests call it on plain numbers.
"""

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median

# A measured step slower than this many times its expected time is an outlier.
OUTLIER_FACTOR = 1.5
# Fewer steady steps than this give no expected time: the run's steady state is not known.
MIN_STEADY_STEPS = 3
# The steady steps must span this many distinct padded sizes for a line; fewer: time proportional to size.
MIN_SIZES_FOR_LINE = 3
# At most this many outlier steps are described in a run's details.
OUTLIERS_DESCRIBED = 5
# The key of a run's details holding the histogram of its training rows' lengths (`length_histogram`): what the
# projection of the user's whole fine-tune draws its batches from (`analysis.projection`).
ROW_LENGTHS = "row_lengths"
# The key of a run's details holding its new-shape probes (JSON {length: seconds}; `running.backends.shape_probes`).
SHAPE_PROBES = "shape_probes"
# The key of a run's details holding the second step of each probe (JSON {length: seconds}): a step whose shape is
# known, a point of the step-time line over the range of lengths probed.
SHAPE_PROBES_REPEAT = "shape_probes_repeat"
# The key of a run's details naming the probes during which the kernel caches grew (JSON {length: bytes};
# `measuring.jit_cache`): one-time compilations of the machine, not the length's price.
SHAPE_PROBES_JIT = "shape_probes_jit_bytes"


def length_histogram(lengths: Iterable[int]) -> str:
    """The rows' lengths as a compact JSON histogram ({"length": rows}, by length), for a run's details."""
    counts = Counter(int(n) for n in lengths)
    return json.dumps({str(n): counts[n] for n in sorted(counts)}, separators=(",", ":"))


@dataclass(frozen=True)
class TimedStep:
    """What the steady-state analysis needs of one measured step."""

    step: int
    seconds: float
    tokens: int
    padded_tokens: int
    shape: str
    new_shape: bool
    # What the step compiled, in words ("": nothing known), told with it when it is an outlier.
    compiled: str = ""


@dataclass(frozen=True)
class StepTimeModel:
    """Expected seconds of a step of `padded_tokens`: intercept + slope × padded_tokens (+ quadratic × the step's
    rows × their padded length squared, where the projection fits attention's growth with the length)."""

    intercept: float
    slope: float
    # "line" (Theil–Sen over the steady steps), "proportional" (median seconds per padded token) or "quadratic"
    # (`analysis.projection`: least squares with attention's term, over steps of many lengths)
    kind: str
    quadratic: float = 0.0

    def expected(self, padded_tokens: float, squared: float = 0.0) -> float:
        return self.intercept + self.slope * padded_tokens + self.quadratic * squared


def fit_step_time(steady: Sequence[TimedStep]) -> StepTimeModel | None:
    """The expected step time from the steady steps (None: fewer than `MIN_STEADY_STEPS`). A Theil–Sen line where
    they span `MIN_SIZES_FOR_LINE` sizes and the line is physical (a positive slope, an intercept that is not
    negative: a step's fixed cost, such as the optimizer's); the median seconds per padded token otherwise."""
    if len(steady) < MIN_STEADY_STEPS:
        return None
    sizes = [s.padded_tokens for s in steady]
    if len(set(sizes)) >= MIN_SIZES_FOR_LINE:
        from scipy.stats import theilslopes

        slope, intercept, _, _ = theilslopes([s.seconds for s in steady], sizes, method="joint")
        if slope > 0 and intercept >= 0:
            return StepTimeModel(float(intercept), float(slope), "line")
    return StepTimeModel(0.0, median(s.seconds / s.padded_tokens for s in steady), "proportional")


def steady_state(steps: Sequence[TimedStep]) -> tuple[dict[str, float], list[str]]:
    """The run's steady-state figures over its measured `steps` (warm-up excluded by the caller), and a description
    of its outlier steps (the slowest `OUTLIERS_DESCRIBED`). Figures:

    - `steady_steps`, `new_shape_steps`: measured steps that met no new shape, and that met one;
    - `steady_time_s`: the measured steps' expected times summed (the time base of `steady_tokens_per_second`);
      absent when the steady state is not known (fewer than `MIN_STEADY_STEPS` steady steps);
    - `new_shape_cost_s`: what the new-shape steps took beyond their expected times (0 when none);
    - `outlier_steps`, `slowest_step_ratio`: steps over `OUTLIER_FACTOR` × expected, and the largest ratio."""
    steady = [s for s in steps if not s.new_shape and s.padded_tokens > 0]
    out: dict[str, float] = {
        "steady_steps": float(len(steady)),
        "new_shape_steps": float(sum(s.new_shape for s in steps)),
    }
    model = fit_step_time(steady)
    if model is None or not steps:
        return out, []
    expected = {s.step: model.expected(s.padded_tokens) for s in steps}
    out["steady_time_s"] = sum(expected.values())
    out["new_shape_cost_s"] = sum(max(s.seconds - expected[s.step], 0.0) for s in steps if s.new_shape)
    ratios = {s.step: s.seconds / expected[s.step] for s in steps if expected[s.step] > 0}
    outliers = sorted((s for s in steps if ratios.get(s.step, 0.0) > OUTLIER_FACTOR), key=lambda s: -ratios[s.step])
    out["outlier_steps"] = float(len(outliers))
    if ratios:
        out["slowest_step_ratio"] = max(ratios.values())
    described = [
        f"step {s.step} ({s.shape}{', new shape' if s.new_shape else ''}): {s.seconds:.3g} s, "
        f"expected {expected[s.step]:.3g} s (×{ratios[s.step]:.1f}){f' [{s.compiled}]' if s.compiled else ''}"
        for s in outliers[:OUTLIERS_DESCRIBED]
    ]
    return out, described
