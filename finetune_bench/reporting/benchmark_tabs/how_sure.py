"""The Summary's "How much faster, how much leaner, how sure": each arm against the baseline over paired runs."""

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.analysis.stats import CONFIDENCE_LEVEL, MIN_PAIRS_FOR_CI
from finetune_bench.reporting.benchmark_tabs.cells import MISSING, pairs_text, percent_text, ratio_text
from finetune_bench.reporting.html import compact_table_html

# Each compared metric: its column prefix in the paired statistics and its name in the table.
COMPARED = (
    ("projected_throughput", "your fine-tune's throughput (projected)"),
    ("throughput", "throughput"),
    ("steady_throughput", "steady-state throughput"),
    ("peak_reserved", "peak reserved memory"),
    ("energy_per_token", "energy per token"),
)


def how_sure_table(paired: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """The paired statistics as a reader wants them: ratio [CI], p, significant, noise floor, note."""
    others = [axis for axis in swept if axis != "arm"]
    out = paired[["arm", *others, "pairs"]].copy()
    for name, label in COMPARED:
        if f"{name}_ratio" not in paired or paired[f"{name}_ratio"].isna().all():  # energy: not measured here
            continue
        out[f"{label} ×"] = [
            ratio_text(r, lo, hi)
            for r, lo, hi in zip(
                paired[f"{name}_ratio"], paired[f"{name}_ci_low"], paired[f"{name}_ci_high"], strict=True
            )  # fmt: skip
        ]
        out[f"{label} p"] = paired[f"{name}_p_value"]
        if f"{name}_noise_floor" in paired:
            out[f"{label} noise floor"] = paired[f"{name}_noise_floor"].map(
                lambda v: f"±{percent_text(v)}" if pd.notna(v) else MISSING
            )
    if "projected_throughput_ratio" in paired and paired["projected_throughput_ratio"].notna().any():
        out["your fine-tune significant"] = paired.get("projected_throughput_significant")
    out["throughput significant"] = paired.get("throughput_significant")
    out["note"] = paired.get("note", "")
    return out


def how_sure_columns(table: pd.DataFrame) -> list[str]:
    """The columns a page shows first (`how_sure_table`'s, in its order): the arm, its point and pairs, every
    metric's ratio with its interval, the throughput's p-value and noise floor (the verdict's), whether the
    differences are significant, and the note. The other metrics' p-values and noise floors are behind the toggle:
    all of them side by side do not fit a page 1,400 px wide."""
    behind = {f"{label} {part}" for name, label in COMPARED if name != "throughput" for part in ("p", "noise floor")}
    return [column for column in table.columns if column not in behind]


def how_sure_html(a: GridAnalysis) -> str:
    """The section (where runs were paired): how the ratios, intervals and tests were computed, then the table."""
    table = how_sure_table(a.paired, a.swept)
    return (
        "<h3>How much faster, how much leaner, how sure</h3><p>Per arm against the baseline: the geometric mean of "
        f"the ratios of runs paired by run number (× &gt; 1: faster, or more memory), over "
        f"{pairs_text(a.paired['pairs'])}; its {CONFIDENCE_LEVEL:.0%} confidence interval in brackets (a t interval "
        f"on the log ratios, from {MIN_PAIRS_FOR_CI} pairs on: wide at 3 pairs, as it must be to hold the true ratio "
        f"95 % of the time), and the paired t-test on the logarithms at alpha {a.alpha:g} (the interval excludes 1 "
        "where the test at 0.05 says significant). A <code>baseline_repeat</code> arm (A/A) gives the "
        "noise floor: a difference inside it is not distinguishable from run-to-run noise.</p>\n"
        + compact_table_html(table, how_sure_columns(table), "how sure")
    )
