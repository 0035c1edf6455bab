"""Which stack to train with: every arm against the baseline at each point of the other axes, ranked by speed,
with its memory, energy and loss parity, and whether any other stack (or the baseline) is both faster and leaner."""

import pandas as pd

from finetune_bench.analysis.parity import MATCH
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT
from finetune_bench.results.record import OK

# The paired comparison's columns the leaderboard shows, each with its interval where it has one.
_RATIOS = ("throughput", "peak_reserved", "energy_per_token")


def stack_arms(paired: pd.DataFrame) -> list[str]:
    """The arms compared with the baseline, the A/A repeat (the noise floor, not a stack) left out."""
    if paired.empty or "arm" not in paired:
        return []
    return [arm for arm in dict.fromkeys(paired["arm"]) if arm != BASELINE_REPEAT]


def stacks_table(paired: pd.DataFrame, table: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """Per point of the axes other than the arm: each stack's throughput, peak reserved memory and energy per token
    as ratios to the baseline over paired runs (with their intervals where there are enough pairs), how many of
    its runs' losses matched the baseline's, its rank by throughput, and `pareto`: no other stack at that point,
    the baseline included, is at least as fast and as lean and better in one. Empty unless two or more stacks were
    compared."""
    arms = stack_arms(paired)
    if len(arms) < 2:
        return pd.DataFrame()
    others = [axis for axis in swept if axis != "arm"]
    keep = ["arm", *others, "pairs"]
    for name in _RATIOS:
        keep += [c for c in (f"{name}_ratio", f"{name}_ci_low", f"{name}_ci_high") if c in paired]
    stacks = paired[paired["arm"].isin(arms)][keep].copy()
    stacks["loss_match"] = [
        _loss_matches(table, row["arm"], {axis: row[axis] for axis in others}) for _, row in stacks.iterrows()
    ]
    groups = stacks.groupby(others, dropna=False, sort=False) if others else [((), stacks)]
    ranked = []
    for _, group in groups:
        group = group.sort_values("throughput_ratio", ascending=False, na_position="last").copy()
        group.insert(0, "rank", range(1, len(group) + 1))
        group["pareto"] = _on_front(group)
        ranked.append(group)
    return pd.concat(ranked, ignore_index=True)


def _loss_matches(table: pd.DataFrame, arm: str, point: dict) -> str:
    """How many of the arm's ok runs at `point` (the other axes' values) had a loss that matched their baseline
    run's: "k of n"."""
    runs = table[(table["arm"] == arm) & (table["status"] == OK)]
    for axis, value in point.items():
        runs = runs[runs[axis] == value]
    if "loss_parity" not in runs or runs.empty:
        return "–"
    return f"{int((runs['loss_parity'] == MATCH).sum())} of {len(runs)}"


def _on_front(group: pd.DataFrame) -> list[bool]:
    """For each stack: whether no other one (the baseline, at 1 and 1, included) dominates it in throughput (higher
    is better) and peak reserved memory (lower is better). A stack without both ratios is not on the front."""
    memory = group["peak_reserved_ratio"] if "peak_reserved_ratio" in group else pd.Series(float("nan"), group.index)
    points = [(BASELINE, 1.0, 1.0), *zip(group["arm"], group["throughput_ratio"], memory, strict=True)]
    front = []
    for arm, speed, memory in points[1:]:
        if pd.isna(speed) or pd.isna(memory):
            front.append(False)
            continue
        dominated = any(
            other != arm and pd.notna(s) and pd.notna(m) and s >= speed and m <= memory and (s > speed or m < memory)
            for other, s, m in points
        )
        front.append(not dominated)
    return front
