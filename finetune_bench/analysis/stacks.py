"""Which stack to train with: every arm against the baseline at each point of the other axes, ranked by speed,
with its memory, energy and loss parity, and whether any other stack (or the baseline) is both faster and leaner."""

import pandas as pd

from finetune_bench.analysis.parity import MATCH
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT, ArmError, parse_arm
from finetune_bench.results.record import OK

# The paired comparison's columns the leaderboard shows, each with its interval where it has one (the steady state's
# beside the throughput over all timed steps, which ranks: a stack whose run compiled kernels or met new batch shapes
# in timed steps reads lower over all steps than at its steady state).
RATIOS = ("throughput", "steady_throughput", "peak_reserved", "energy_per_token")
# Peak reserved memories closer than this share of the baseline's count as the same on the front: a stack that
# saves less than that over a faster one is not worth its speed (a memory budget is not that exact).
MEMORY_TIE = 0.01


def stack_arms(paired: pd.DataFrame) -> list[str]:
    """The arms compared with the baseline, the A/A repeat (the noise floor, not a stack) left out."""
    if paired.empty or "arm" not in paired:
        return []
    return [arm for arm in dict.fromkeys(paired["arm"]) if arm != BASELINE_REPEAT]


def stacks_table(paired: pd.DataFrame, table: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """Per point of the axes other than the arm: each stack's throughput (over all timed steps, and at its steady
    state where the runs measured one), peak reserved memory and energy per token as ratios to the baseline over
    paired runs (with their intervals where there are enough pairs), how many of its runs' losses matched the
    baseline's, its rank by throughput (over all timed steps), `pareto`: no other stack at that point, the baseline
    included, is at least as fast and as lean (memories within `MEMORY_TIE` of the baseline's count as the same) and
    better in one, and `beaten_by`: the fastest one that is ("" on the front). Empty unless two or more stacks were
    compared."""
    arms = stack_arms(paired)
    if len(arms) < 2:
        return pd.DataFrame()
    others = [axis for axis in swept if axis != "arm"]
    keep = ["arm", *others, "pairs"]
    for name in RATIOS:
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
        beaten = _beaten_by(group)
        group["beaten_by"] = [name for name, _ in beaten]
        group["beaten_by_peak_reserved_ratio"] = [memory for _, memory in beaten]
        group["pareto"] = group["beaten_by"] == ""
        ranked.append(group)
    return pd.concat(ranked, ignore_index=True)


def _loss_matches(table: pd.DataFrame, arm: str, point: dict) -> str:
    """How many of the arm's ok runs at `point` (the other axes' values) with a parity verdict had a loss that
    matched their baseline run's: "k of n" ("–": no verdict)."""
    runs = table[(table["arm"] == arm) & (table["status"] == OK)]
    for axis, value in point.items():
        runs = runs[runs[axis] == value]
    if "loss_parity" not in runs:
        return "–"
    judged = runs[runs["loss_parity"].notna() & (runs["loss_parity"].astype(str) != "")]
    if judged.empty:  # no loss curves to compare: no verdict, not a mismatch
        return "–"
    return f"{int((judged['loss_parity'] == MATCH).sum())} of {len(judged)}"


def _beaten_by(group: pd.DataFrame) -> list[tuple[str, float]]:
    """For each stack: ("", NaN) when it is on the speed-memory front, else the stack on the front (or the baseline,
    at 1 and 1) that beats it, at least as fast and at most `MEMORY_TIE` of the baseline's memory more, with that
    stack's memory ratio; ("–", NaN) for a stack without both ratios (not compared). The front is built from the
    fastest down: a stack joins it when it is leaner, by more than `MEMORY_TIE`, than every faster one on it (so a
    stack off it is always beaten by one on it)."""
    memory = group["peak_reserved_ratio"] if "peak_reserved_ratio" in group else pd.Series(float("nan"), group.index)
    return _front([(BASELINE, 1.0, 1.0), *zip(group["arm"], group["throughput_ratio"], memory, strict=True)])[1:]


def _front(points: list[tuple[str, float, float]]) -> list[tuple[str, float]]:
    """`_beaten_by` of (name, throughput ratio, memory ratio) points, in their order."""
    comparable = [i for i, (_, speed, memory) in enumerate(points) if pd.notna(speed) and pd.notna(memory)]
    comparable.sort(key=lambda i: (-points[i][1], points[i][2]))  # fastest first; at equal speed, leanest first
    beaten_by = [("–", float("nan"))] * len(points)
    front: list[int] = []
    for i in comparable:
        beaters = [k for k in front if points[k][2] <= points[i][2] + MEMORY_TIE]
        if beaters:
            beater = min(beaters, key=lambda k: points[k][2])  # the leanest that beats it
            beaten_by[i] = (points[beater][0], points[beater][2])
        else:
            front.append(i)
            beaten_by[i] = ("", float("nan"))
    return beaten_by


def _points(frame: pd.DataFrame, others: list[str]) -> list[tuple[dict, pd.DataFrame]]:
    """The frame's rows grouped by the other axes' values: (the point, its rows)."""
    if not others:
        return [({}, frame)]
    return [
        (dict(zip(others, key if isinstance(key, tuple) else (key,), strict=True)), group)
        for key, group in frame.groupby(others, dropna=False, sort=False)
    ]


def best_stack_per_budget(stacks: pd.DataFrame, summary: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """Per point of the other axes: which stack to train with for each memory budget. The candidates are the
    baseline and the stacks on the speed-memory front of the stacks none of whose runs' losses diverged from the
    baseline's (no verdict, without loss curves, is no divergence); sorted by
    their median peak reserved memory (GiB), each is the fastest that fits a budget of at least its memory, up to
    the next one's. Columns: the other axes, `at_least_gib` (the budget from which it is the answer),
    `train_with`, `throughput_ratio`, `peak_reserved_gib`. Empty without stacks or measured memory."""
    if stacks.empty or "peak_reserved_gib" not in summary:
        return pd.DataFrame()
    others = [axis for axis in swept if axis != "arm"]
    rows = []
    for point, group in _points(stacks, others):
        memory = summary
        for axis, value in point.items():
            memory = memory[memory[axis] == value]
        reserved = dict(zip(memory["arm"], memory["peak_reserved_gib"], strict=True))
        # the front among the stacks whose losses did not diverge: a diverged stack beats none of them
        eligible = [row for row in group.itertuples(index=False) if not _some_diverged(row.loss_match)]
        on_front = _front(
            [(BASELINE, 1.0, 1.0)]
            + [(row.arm, row.throughput_ratio, getattr(row, "peak_reserved_ratio", float("nan"))) for row in eligible]
        )
        candidates = [(BASELINE, 1.0, reserved.get(BASELINE))] + [
            (row.arm, row.throughput_ratio, reserved.get(row.arm))
            for row, (beaten_by, _) in zip(eligible, on_front[1:], strict=True)
            if beaten_by == ""
        ]
        candidates = [c for c in candidates if c[2] is not None and pd.notna(c[2]) and pd.notna(c[1])]
        fastest_so_far = float("-inf")
        for arm, speed, gib in sorted(candidates, key=lambda c: (c[2], -c[1])):
            if speed > fastest_so_far:  # a larger budget is worth naming only for a faster stack
                rows.append({**point, "at_least_gib": gib, "train_with": arm, "throughput_ratio": speed,
                             "peak_reserved_gib": gib})  # fmt: skip
                fastest_so_far = speed
    return pd.DataFrame(rows)


def _some_diverged(loss_match: str) -> bool:
    """A leaderboard's "k of n" with k < n: some runs' losses did not match the baseline's."""
    matched, _, runs = str(loss_match).partition(" of ")
    return matched.isdigit() and runs.isdigit() and int(matched) < int(runs)


def _parts(arm: str) -> frozenset[str] | None:
    """An arm's components as written (`liger-without-loss`, `liger:rope`, `cce`, ...); the baseline has none; None
    for a name that is not an arm."""
    if arm in (BASELINE, BASELINE_REPEAT):
        return frozenset()
    try:
        parse_arm(arm)
    except ArmError:
        return None
    return frozenset(arm.split("+"))


def component_contributions(stacks: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """What each component of a combined stack adds, from the ablations the grid has: for a stack `a+b` and the
    arm `a` beside it (or the baseline, for a one-component stack left out), `b` contributes the stack's ratio to the
    baseline divided by `a`'s, in throughput and in peak reserved memory. Columns: the other axes, `stack`,
    `component`, `without` (the arm it is compared with), `throughput_factor`, `steady_throughput_factor` (from the
    steady-state ratios: NaN where the runs measured none), `peak_reserved_factor`. Only
    stacks of two or more components, and only where the arm without the component was measured."""
    if stacks.empty:
        return pd.DataFrame()
    others = [axis for axis in swept if axis != "arm"]
    rows = []
    for point, group in _points(stacks, others):
        by_parts = {_parts(row.arm): row for row in group.itertuples(index=False) if _parts(row.arm) is not None}
        for parts, row in by_parts.items():
            if len(parts) < 2:
                continue
            for component in sorted(parts):
                without = by_parts.get(parts - {component})
                if without is None:
                    continue
                rows.append(
                    {
                        **point,
                        "stack": row.arm,
                        "component": component,
                        "without": without.arm,
                        "throughput_factor": row.throughput_ratio / without.throughput_ratio,
                        "steady_throughput_factor": _ratio(row, without, "steady_throughput_ratio"),
                        "peak_reserved_factor": _ratio(row, without, "peak_reserved_ratio"),
                    }
                )
    return pd.DataFrame(rows)


def _ratio(row: tuple, without: tuple, column: str) -> float:
    numerator, denominator = getattr(row, column, float("nan")), getattr(without, column, float("nan"))
    return numerator / denominator if pd.notna(numerator) and pd.notna(denominator) and denominator else float("nan")
