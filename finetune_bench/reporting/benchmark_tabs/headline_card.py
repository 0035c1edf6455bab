"""The benchmark report's first screen: per arm against the baseline, in large type, how much faster, how much
leaner, whether the loss matched and how sure, and what the user's whole fine-tune takes where it is projected. Every
figure is the one the Summary's tables state: the geometric mean of paired ratios (`analysis.stats`), its interval."""

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.analysis.numbers import span_text
from finetune_bench.analysis.parity import DIVERGED, MATCH
from finetune_bench.analysis.tables import ran_on_cpu
from finetune_bench.analysis.verdicts import interval_text
from finetune_bench.inputs.arms import BASELINE_REPEAT
from finetune_bench.reporting.html import cards_html


def _significance(paired: pd.DataFrame, alpha: float, name: str = "throughput") -> str:
    """Whether the differences in `name` (the paired statistics' metric: `throughput`, `projected_throughput`) of an
    arm's rows are significant at `alpha`, in a word or two."""
    flags = paired.get(f"{name}_significant", pd.Series(dtype=object)).dropna().astype(bool)
    if flags.empty:
        return "not tested (set n_runs ≥ 2)"
    if flags.all():
        return f"yes (p < {alpha:g})"
    return "no" if not flags.any() else f"in {int(flags.sum())} of {len(flags)} conditions"


def _parity(parity: pd.DataFrame, arm: str) -> str:
    """How many of the arm's loss curves matched the baseline's ("–" where none was compared)."""
    if parity.empty or "arm" not in parity or arm not in set(parity["arm"]):
        return "–"
    verdict = parity[parity["arm"] == arm]["verdict"]
    text = f"{int((verdict == MATCH).sum())} of {len(verdict)} match"
    return text + (" (diverged)" if (verdict == DIVERGED).any() else "")


def headline_card_html(a: GridAnalysis) -> str:
    """One card per arm (the A/A repeat aside): throughput and peak reserved memory against the baseline, the loss
    parity, the significance of the speed difference and, where projected, the whole fine-tune's throughput ratio;
    "" where no arm was compared."""
    if a.comparison.empty or "throughput_ratio" not in a.comparison:
        return ""
    cards = []
    for arm, rows in a.comparison.groupby("arm", sort=False):
        both = rows.dropna(subset=["throughput_ratio"])
        if arm == BASELINE_REPEAT or both.empty:
            continue
        points = f" over {len(both)} conditions" if len(both) > 1 else ""
        mine = a.paired[a.paired["arm"] == arm] if not a.paired.empty else pd.DataFrame()
        figures = []
        # the first figure's significance is the one the card states: the projection's where it leads
        leading = "throughput"
        if "projected_throughput_ratio" in mine and mine["projected_throughput_ratio"].notna().any():
            projected = mine.dropna(subset=["projected_throughput_ratio"])
            bounds = projected[["projected_throughput_ci_low", "projected_throughput_ci_high"]]
            interval = interval_text(bounds.rename(columns=lambda c: c.removeprefix("projected_")))
            # the conditions it covers: those projected, not every condition the arm ran in
            over = f" over {len(projected)} of {len(both)} conditions" if len(projected) < len(both) else points
            label = f"your fine-tune ({a.fine_tune.describe()}), projected{over}"
            figures.append((span_text(projected["projected_throughput_ratio"]) + interval, label))
            leading = "projected_throughput"
        timed = "throughput over the timed steps" if figures else "throughput"
        figures.append((span_text(both["throughput_ratio"]) + interval_text(both), f"{timed}{points}"))
        memory = both["peak_reserved_ratio"].dropna() if "peak_reserved_ratio" in both else pd.Series(dtype=float)
        if not memory.empty:
            figures.append((span_text(memory), "peak reserved memory"))
        elif ran_on_cpu(a.table):
            figures.append(("–", "peak memory: none on a CPU"))
        figures.append((_parity(a.parity, arm), "loss curves"))
        what = "your fine-tune's speed difference" if leading == "projected_throughput" else "speed difference"
        figures.append((_significance(mine, a.alpha, leading), f"{what} significant"))
        cards.append((f"{arm} vs baseline", figures))
    cpu = " (a CPU run: its timings say nothing about a GPU)" if ran_on_cpu(a.table) else ""
    return cards_html(
        cards,
        "Ratios are arm over baseline (× above 1: faster, or more memory): the geometric mean of the ratios of runs "
        "paired by run number, "
        f"its 95 % interval in brackets where there are 3 pairs or more (How sure, below).{cpu}",
    )
