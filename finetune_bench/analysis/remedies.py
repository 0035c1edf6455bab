"""Which change buys most: every configuration the grid swept (arm × packing × padding multiple × attention × any
other axis), ranked by the projected time of the user's whole fine-tune on their data (`analysis.projection`).

The configuration as configured is the baseline arm at the first listed value of every other swept axis (list the
configuration you train with first). Each configuration's time is the median projected time of its runs in the answer
(`analysis.cold_runs`: a cold run is left out where its condition has warm ones), for the same data: a fine-tune set
in epochs trains the same rows whatever the batching; one set in steps (`fine_tune_steps`) trains as many steps, which
on packed rows hold more tokens, so there each time is scaled to the configuration as configured's tokens (its
throughput × the same tokens). Beside each: how much faster than as configured, the runs' range, and what a step
meeting a new length cost it (the remedies remove that price). A change alone is one axis moved from the configuration
as configured; the fastest configuration may combine several.
"""

import pandas as pd

from finetune_bench.analysis.numbers import setting_text
from finetune_bench.analysis.projection import (
    NEW_SHAPE_PRICE,
    PROJECTED_THROUGHPUT,
    PROJECTED_TIME,
    duration_text,
)
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT
from finetune_bench.prediction.fine_tune import FineTune
from finetune_bench.results.record import OK

# What packing changes in what the model sees, said beside every packed configuration.
PACKING_CAVEAT = (
    "packing puts several examples in one row: position ids restart at each example and no example attends to "
    "another, but a batch holds other examples than padded batches would, and the rows are cut at max_seq_length "
    "(an example may be split across two rows)"
)
# Where a configuration's runs projected its fine-tune further apart than this share of their median, the console and
# the Summary say so beside the ranking: the answer is only as sure as its runs agree. On padded data with SDPA's cuDNN
# kernel the price of a new length (its attention plan, built on the host) varied from 0.08 to 0.15 s between runs of
# one configuration on an H200, which moved a 300-step projection by ±9 % (docs/measurements.md).
RUNS_DISAGREE = 0.05
# The columns of the ranking, in order.
RANKING_COLUMNS = [
    "rank",
    "configuration",
    "fine_tune_s",
    "speedup",
    "runs",
    "fine_tune_s_range",
    NEW_SHAPE_PRICE,
    "condition_id",
]


def _label(point: dict, reference: dict) -> str:
    """A configuration in words: what differs from the one as configured ("as configured" when nothing does)."""
    moved = [
        str(value) if axis == "arm" else setting_text(axis, value)
        for axis, value in point.items()
        if reference[axis] != value
    ]
    return ", ".join(moved) or "as configured"


def ranking(table: pd.DataFrame, swept: list[str], fine_tune: FineTune) -> pd.DataFrame:
    """One row per configuration whose runs were projected, fastest first (`RANKING_COLUMNS`): its label (what it
    changes from the configuration as configured), its projected fine-tune time for the same data (the median of its
    runs'), its speed-up over the configuration as configured, its runs, their range, and the price of a new length.
    Empty where the grid sweeps nothing but the arm (each arm's verdict says it), fewer than two configurations were
    projected, or the configuration as configured was not."""
    if PROJECTED_TIME not in table or not [axis for axis in swept if axis != "arm"]:
        return pd.DataFrame(columns=RANKING_COLUMNS)
    runs = table[(table["status"] == OK) & table[PROJECTED_TIME].notna()]
    if "arm" in swept:
        runs = runs[runs["arm"] != BASELINE_REPEAT]
    first = table.sort_values("run_number", kind="stable").iloc[0]  # the grid's first point: every first value
    reference = {axis: first[axis] for axis in swept} | ({"arm": BASELINE} if "arm" in swept else {})
    if NEW_SHAPE_PRICE not in runs:
        runs = runs.assign(**{NEW_SHAPE_PRICE: float("nan")})
    per_point = runs.groupby(swept, dropna=False, sort=False).agg(
        condition_id=("condition_id", "first"),
        seconds=(PROJECTED_TIME, "median"),
        throughput=(PROJECTED_THROUGHPUT, "median"),
        low=(PROJECTED_TIME, "min"),
        high=(PROJECTED_TIME, "max"),
        runs=(PROJECTED_TIME, "size"),
        price=(NEW_SHAPE_PRICE, "median"),
    )
    points = [dict(zip(swept, key if isinstance(key, tuple) else (key,), strict=True)) for key in per_point.index]
    matches = [i for i, point in enumerate(points) if point == reference]
    if not matches or len(points) < 2:
        return pd.DataFrame(columns=RANKING_COLUMNS)
    base = per_point.iloc[matches[0]]
    out = []
    for point, row in zip(points, per_point.itertuples(index=False), strict=True):
        # a fine-tune of as many steps trains more tokens on packed rows: the same data as the reference's instead
        scale = 1.0
        if fine_tune.steps:
            scale = (base["throughput"] * base["seconds"]) / (row.throughput * row.seconds)
        seconds = row.seconds * scale
        out.append(
            {
                "configuration": _label(point, reference),
                "fine_tune_s": seconds,
                "speedup": base["seconds"] / seconds,
                "runs": row.runs,
                "fine_tune_s_range": f"{row.low * scale:.1f}-{row.high * scale:.1f}",
                NEW_SHAPE_PRICE: row.price,
                "condition_id": row.condition_id,
                "_low": row.low * scale,
                "_high": row.high * scale,
                "_moved": sum(reference[axis] != value for axis, value in point.items()),
                "_packed": bool(point.get("packing", False)),
            }
        )
    frame = pd.DataFrame(out).sort_values("fine_tune_s", kind="stable").reset_index(drop=True)
    frame.insert(0, "rank", range(1, len(frame) + 1))
    return frame


def remedy_lines(frame: pd.DataFrame, fine_tune: FineTune) -> list[str]:
    """The console's and the Summary's first lines: the fine-tune as configured, the fastest configuration, and each
    change alone ranked by what it buys (where packing is among them, what it changes in what the model sees)."""
    if frame.empty:
        return []
    base = frame[frame["configuration"] == "as configured"].iloc[0]
    best = frame.iloc[0]
    what = f"your fine-tune ({fine_tune.describe()}{', the same data in each' if fine_tune.steps else ''})"
    first = f"Which change buys most, {what}: as configured {duration_text(base['fine_tune_s'])}"
    if best["configuration"] != "as configured":
        first += f"; fastest: {best['configuration']} {duration_text(best['fine_tune_s'])} (×{best['speedup']:.2f})"
    alone = frame[frame["_moved"] == 1]
    if not alone.empty:
        first += "; each change alone: " + "; ".join(
            f"{row.configuration} {duration_text(row.fine_tune_s)} (×{row.speedup:.2f})" for row in alone.itertuples()
        )
    lines = [first + "."]
    apart = frame[(frame["_high"] - frame["_low"]) > RUNS_DISAGREE * frame["fine_tune_s"]]
    if not apart.empty:
        lines.append(
            f"Runs disagree (their projections more than {RUNS_DISAGREE:.0%} apart): "
            + "; ".join(
                f"{row['configuration']} {duration_text(row['_low'])} to {duration_text(row['_high'])} over "
                f"{row['runs']} runs"
                for _, row in apart.iterrows()
            )
            + ". Each figure is the runs' median; more runs narrow it."
        )
    if frame["_packed"].any():
        lines.append(f"Packing: {PACKING_CAVEAT}.")
    return lines


def shown(frame: pd.DataFrame) -> pd.DataFrame:
    """The ranking as the report shows it (its helper columns dropped)."""
    return frame.drop(columns=[c for c in frame if c.startswith("_")])
