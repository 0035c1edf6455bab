"""The Summary's first lines: one sentence per arm, from the comparison, the fitting batches and the parity, with
what the arm's numbers include that is not the arm's own (a SwitchBack arm's casts outside float16)."""

import pandas as pd

from finetune_bench.analysis.numbers import number_text, span_text
from finetune_bench.analysis.parity import DIVERGED
from finetune_bench.inputs.arms import BASELINE, ArmError, parse_arm
from finetune_bench.results.record import OK

# The dtype SwitchBack's Triton kernels take and write (`finetune_bench.running.switchback`): in any other, each
# SwitchBack layer's output is cast from it to the model's dtype, forward and backward.
SWITCHBACK_DTYPE = "float16"


def interval_text(rows: pd.DataFrame) -> str:
    """ " [low, high]": the throughput ratio's interval where the comparison is one condition that has one ("" else)."""
    if len(rows) != 1 or "throughput_ci_low" not in rows or pd.isna(rows["throughput_ci_low"].iloc[0]):
        return ""
    return f" [{number_text(rows['throughput_ci_low'].iloc[0])}, {number_text(rows['throughput_ci_high'].iloc[0])}]"


def gpu_count_text(world_sizes: pd.Series) -> str:
    """How many GPUs the runs had: "1 GPU", "8 GPUs", "1–2 GPUs"."""
    low, high = int(world_sizes.min()), int(world_sizes.max())
    count = f"{low}" if low == high else f"{low}–{high}"
    return f"{count} GPU" + ("" if high == 1 else "s")


def verdicts(
    comparison: pd.DataFrame, fitting: pd.DataFrame, parity: pd.DataFrame, table: pd.DataFrame | None = None
) -> list[str]:
    """One line per arm: its throughput and memory ratios over the conditions where both it and the
    baseline ran (the geometric mean of paired ratios, with the throughput's interval where there is one condition),
    on how many GPUs (from `table`), the largest batch each fits, and whether its loss matched the baseline's."""
    lines = []
    for arm, rows in comparison.groupby("arm", sort=False):
        both = rows.dropna(subset=["throughput_ratio"])
        if both.empty:
            lines.append(f"{arm}: no condition has ok runs in both this arm and the baseline; nothing to compare.")
            continue
        speed, memory = both["throughput_ratio"], both["peak_reserved_ratio"].dropna()
        line = f"{arm} vs baseline: throughput {span_text(speed)}{interval_text(both)}"
        if not memory.empty:
            line += f", peak reserved memory {span_text(memory)}"
        line += f" over {len(both)} condition(s)"
        if table is not None and "world_size" in table and "arm" in table:
            mine = table[(table["arm"] == arm) & (table["status"] == OK)]
            if not mine.empty and "device" in mine and (mine["device"] == "cpu").all():
                line += " on the CPU"
            elif not mine.empty:
                sizes = mine["world_size"]
                line += f" on {gpu_count_text(sizes)}" + (" (memory: the largest rank's)" if sizes.max() > 1 else "")
        if not fitting.empty:
            mine = fitting[fitting["arm"] == arm]["largest_ok_batch"].max()
            base = fitting[fitting["arm"] == BASELINE]["largest_ok_batch"].max()
            if pd.notna(mine) and pd.notna(base):
                line += f"; largest batch that fit {mine:g} vs {base:g}"
        if not parity.empty and arm in set(parity["arm"]):
            verdict = parity[parity["arm"] == arm]["verdict"]
            line += f"; loss {int((verdict == 'match').sum())} of {len(verdict)} pairs match"
            if (verdict == DIVERGED).any():
                line += " (DIVERGED: see Loss parity)"
        missing = len(rows) - len(both)
        if missing:
            line += f"; {missing} condition(s) lack an ok run on one side (see Conditions)"
        lines.append(line + "." + switchback_cast_note(str(arm), table))
    return lines


def switchback_cast_note(arm: str, table: pd.DataFrame | None) -> str:
    """For an arm with SwitchBack whose ok runs trained in another dtype than its kernels' float16: that its
    throughput includes the casts (" SwitchBack in bfloat16 pays for casts: ..."); "" otherwise."""
    try:
        switchback = parse_arm(arm).switchback
    except ArmError:
        return ""
    if not switchback or table is None or "dtype" not in table or "arm" not in table:
        return ""
    mine = table[(table["arm"] == arm) & (table["status"] == OK)]["dtype"].astype(str)
    dtypes = sorted({dtype for dtype in mine if dtype and dtype != SWITCHBACK_DTYPE})
    if not dtypes:
        return ""
    named = " and ".join(dtypes)
    return (
        f" SwitchBack in {named} pays for casts: its int8 kernels are built for {SWITCHBACK_DTYPE} and write "
        f"{SWITCHBACK_DTYPE}, so each SwitchBack layer's output is cast to {named} and its gradients through "
        f"{SWITCHBACK_DTYPE} and back; the throughput above includes those casts (docs/measurements.md, the SwitchBack "
        "study)."
    )
