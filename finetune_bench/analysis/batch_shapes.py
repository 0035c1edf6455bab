"""Where the all-steps throughput and the steady state disagree: an arm whose advantage depends on new batch shapes,
and the runs whose mean was moved by a few slow steps (`measuring.steady_state` measures both figures per run).

An arm's advantage *depends on shapes* when its steady-state ratio against the baseline and its all-steps ratio
differ by more than the A/A noise floor at that point (`SHAPE_MARGIN` where the grid has no A/A arm) and some run of
the comparison (the arm's or the baseline's, at that point) met a new batch shape; where none did, a few slow steps
moved the mean, which the skewed runs show. A run is *skewed* when its steady-state throughput and its all-steps
throughput differ by more than the same margin.
"""

import pandas as pd

from finetune_bench.analysis.numbers import number_text, setting_text
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT
from finetune_bench.results.record import OK

# Where the grid has no A/A arm: a disagreement of more than this fraction is worth a word.
SHAPE_MARGIN = 0.03
# How a user makes batch shapes repeat, said wherever an arm's figure depends on them.
REMEDY = (
    "`pad_to_multiple_of: 64` makes padded batches repeat a few lengths; `packing: true` fills every row to "
    "max_seq_length (one shape)"
)
# A run that compiled Triton kernels for this long in its timed steps is said to have (a kernel loaded from Triton's
# disk cache takes milliseconds: no word).
NOTABLE_COMPILE_S = 0.05
# Said where the runs trained on a GPU with attention SDPA may run on cuDNN (`sdpa`, or `cudnn` itself): what was
# measured there.
CUDNN_NOTE = (
    "on H100s and H200s with torch 2.11, SDPA's cuDNN attention was measured to pay for each new length (building its "
    "plan; 1.5-3 s at a few lengths in a machine's first run, compiling kernels once: `jit_cache_bytes`), and "
    "`attention: efficient` almost nothing per length at a lower steady throughput; at one unpacked row a batch "
    "(no attention mask), `cudnn_any_length: true` has cuDNN reuse one plan per power-of-two length "
    "(docs/measurements.md; the Step times tab)"
)
# The attention settings under which SDPA may pick cuDNN's kernel.
CUDNN_ATTENTIONS = ("sdpa", "cudnn")


def _margin(row: dict) -> float:
    floor = row.get("throughput_noise_floor")
    return max(float(floor), SHAPE_MARGIN) if floor is not None and pd.notna(floor) else SHAPE_MARGIN


def _at(row: dict, others: list[str]) -> str:
    return ", ".join(setting_text(axis, row[axis]) for axis in others)


def _runs_at(table: pd.DataFrame, arm: str, row: dict, others: list[str]) -> pd.DataFrame:
    """The ok runs of `arm` at the point of the other axes that `row` is at."""
    runs = table[(table["arm"] == arm) & (table["status"] == OK)]
    for axis in others:
        runs = runs[runs[axis] == row[axis]]
    return runs


def _may_run_cudnn(runs: pd.DataFrame) -> bool:
    """Whether some of `runs` trained on a GPU with an attention setting under which SDPA may run cuDNN's kernel."""
    on_gpu = runs.get("device", pd.Series("", index=runs.index)).astype(str).str.startswith("cuda")
    attention = runs.get("attention", pd.Series("sdpa", index=runs.index)).astype(str).isin(CUDNN_ATTENTIONS)
    return bool((on_gpu & attention).any())


def _cost_text(arm: str, runs: pd.DataFrame) -> str:
    """The new-shape steps a run of `arm` met (the median over `runs`) and what they took beyond their expected
    time, where that is known."""
    text = f"{arm} {runs['new_shape_steps'].median():g} new-shape step(s) a run"
    cost = runs["new_shape_cost_s"].median() if "new_shape_cost_s" in runs else float("nan")
    return text + (f", {number_text(cost)} s beyond their expected time" if pd.notna(cost) else "")


def shape_dependence(paired: pd.DataFrame, table: pd.DataFrame, swept: list[str]) -> list[str]:
    """One sentence per arm and point of the other axes whose steady-state ratio and all-steps ratio differ by more
    than the margin and where some run of the arm or the baseline met a new batch shape: both ratios (with the
    digits that carry them), the new shapes each side's runs met and what they cost, and how to make shapes repeat
    (with what was measured of cuDNN's attention where the runs may have run it)."""
    if paired.empty or "steady_throughput_ratio" not in paired or "new_shape_steps" not in table:
        return []
    others = [axis for axis in swept if axis != "arm"]
    lines = []
    for row in paired.to_dict("records"):
        steady, overall = row.get("steady_throughput_ratio"), row.get("throughput_ratio")
        if row["arm"] == BASELINE_REPEAT or pd.isna(steady) or pd.isna(overall) or overall <= 0:
            continue
        if abs(steady / overall - 1) <= _margin(row):
            continue
        sides = {arm: _runs_at(table, arm, row, others) for arm in (row["arm"], BASELINE)}
        if not any((runs["new_shape_steps"] > 0).any() for runs in sides.values()):
            continue  # no new shape: a few slow steps moved the mean (the skewed runs)
        costs = [_cost_text(arm, runs) for arm, runs in sides.items() if not runs.empty]
        where = _at(row, others)
        cudnn = f"; {CUDNN_NOTE}" if any(_may_run_cudnn(runs) for runs in sides.values()) else ""
        lines.append(
            f"{row['arm']}'s advantage depends on batch shapes{' at ' + where if where else ''}: "
            f"×{number_text(steady)} at the steady state, ×{number_text(overall)} over all timed steps"
            + (f" ({'; '.join(costs)})" if costs else "")
            + f". A run on padded data pays for each new batch shape once; {REMEDY}{cudnn}."
        )
    return lines


def skewed_runs(table: pd.DataFrame, paired: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """The ok runs whose steady-state and all-steps throughput differ by more than the margin at their point:
    how much, their new-shape steps and cost, the Triton kernels they compiled in timed steps, their outlier steps and
    the slowest ones described."""
    columns = ["condition_id", "run_number", *swept, "timing_skew", "new_shape_steps", "new_shape_cost_s",
               "triton_compiles", "triton_compile_s", "outlier_steps", "slow_steps"]  # fmt: skip
    if table.empty or "timing_skew" not in table or table["timing_skew"].isna().all():
        return pd.DataFrame(columns=columns)
    others = [axis for axis in swept if axis != "arm"]
    runs = table[(table["status"] == OK) & table["timing_skew"].notna()].copy()
    runs["_margin"] = SHAPE_MARGIN
    if not paired.empty and "throughput_noise_floor" in paired:
        floors = paired[paired["arm"] == BASELINE_REPEAT][[*others, "throughput_noise_floor"]]
        if not floors.empty:
            runs = (
                runs.merge(floors, on=others, how="left")
                if others
                else runs.assign(throughput_noise_floor=floors["throughput_noise_floor"].iloc[0])
            )
            runs["_margin"] = runs["throughput_noise_floor"].fillna(SHAPE_MARGIN).clip(lower=SHAPE_MARGIN)
    skewed = runs[runs["timing_skew"].abs() > runs["_margin"]]
    return skewed[[c for c in columns if c in skewed]].reset_index(drop=True)


def compile_note(skewed: pd.DataFrame) -> str:
    """How many of the skewed runs spent at least `NOTABLE_COMPILE_S` compiling Triton kernels in their timed steps,
    and how long in all ("" where none did or nothing was counted): a kernel compiled again for a new
    specialisation of its arguments, which a real run pays once per specialisation."""
    if skewed.empty or "triton_compile_s" not in skewed:
        return ""
    compiled = skewed[skewed["triton_compile_s"].fillna(0) >= NOTABLE_COMPILE_S]
    if compiled.empty:
        return ""
    arms = ", ".join(sorted(compiled["arm"].astype(str).unique())) if "arm" in compiled else ""
    seconds = number_text(compiled["triton_compile_s"].sum())
    which = f"; {arms}" if arms else ""
    return (
        f"{len(compiled)} of them compiled Triton kernels in timed steps ({seconds} s of compilation{which}): "
        "Triton compiles a kernel again for each new specialisation of its arguments, a new shape or an integer that "
        "changes class (whether it divides by 16, as the batch's count of labelled tokens in Liger's and Cut "
        "Cross-Entropy's losses can), once per run; the steady state leaves those steps out, and steps.csv's "
        "triton_kernels_compiled names the kernels"
    )
