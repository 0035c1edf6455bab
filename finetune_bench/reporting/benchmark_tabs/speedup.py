"""The Speedup tab: per arm, its throughput over the baseline's across batch size × sequence length, and MFU."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from finetune_bench.analysis.grid import GridAnalysis  # noqa: E402
from finetune_bench.inputs.arms import BASELINE  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.cells import number_text  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.figures import BATCH, SEQ, bar_panel, panels  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.summary import cpu_timings_note  # noqa: E402
from finetune_bench.reporting.html import compact_table_html, figure_html  # noqa: E402

# The ratios table's first columns, after the condition's other axes: the arm, its runs and the baseline's, and each
# ratio (the throughput's with its interval and test); the medians behind them are behind the toggle.
KEY_COMPARISON = (
    "arm", "arm_runs", "baseline_runs", "throughput_ratio", "throughput_ci_low", "throughput_ci_high",
    "throughput_significant", "peak_reserved_ratio", "energy_per_token_ratio",
)  # fmt: skip


def speedup_figure(comparison: pd.DataFrame, summary: pd.DataFrame, swept: list[str]) -> plt.Figure | None:
    """Per arm, a heatmap of its median throughput over the baseline's across batch size × sequence length
    (the axes that are swept), with cells where only one side fits written out."""
    if comparison.empty or BATCH not in swept or comparison["throughput_ratio"].isna().all():
        return None
    rows = SEQ if SEQ in swept else None
    facets = [axis for axis in swept if axis not in ("arm", BATCH, SEQ)]
    fits = summary.assign(fits=summary["ok_runs"] > 0)
    base_fits = fits[fits["arm"] == BASELINE].set_index([a for a in swept if a != "arm"])["fits"]
    panelled = comparison.assign(panel=panels(comparison, facets))
    groups = list(panelled.groupby(["arm", "panel"], sort=False))
    fig, axes = plt.subplots(1, len(groups), figsize=(max(5, 4.8 * len(groups)), 3.6), squeeze=False)
    for ax, ((arm, panel), group) in zip(axes[0], groups, strict=True):
        index = group[rows] if rows else pd.Series([""] * len(group), index=group.index, name="")
        ratio = group.assign(_row=index.to_numpy()).pivot_table(
            index="_row", columns=BATCH, values="throughput_ratio", aggfunc="first", dropna=False
        )
        labels = ratio.map(lambda v: f"×{number_text(v)}" if pd.notna(v) else "")
        arm_fits = fits[fits["arm"] == arm].set_index([a for a in swept if a != "arm"])["fits"]
        for key, arm_ok in arm_fits.items():
            key = key if isinstance(key, tuple) else (key,)
            point = dict(zip([a for a in swept if a != "arm"], key, strict=True))
            if any(point.get(f) != group[f].iloc[0] for f in facets):
                continue
            row, column = (point[rows] if rows else ""), point[BATCH]
            base_ok = bool(base_fits.get(key if len(key) > 1 else key[0], False))
            if arm_ok and not base_ok:
                labels.loc[row, column] = "only\nthis arm\nfits"
            elif base_ok and not arm_ok:
                labels.loc[row, column] = "arm\nfails"
        sns.heatmap(
            ratio.astype(float), annot=labels.reindex_like(ratio).fillna(""), fmt="", cmap="vlag_r", center=1.0,
            cbar_kws={"label": "throughput ratio (arm / baseline)"}, linewidths=0.5, ax=ax,
        )  # fmt: skip
        ax.set_xlabel(BATCH)
        ax.set_ylabel(rows or "")
        ax.set_title(f"{arm} vs baseline" + (f"\n{panel}" if panel else ""))
    fig.tight_layout()
    return fig


def comparison_columns(swept: list[str]) -> list[str]:
    """The ratios table's first view: the condition's axes but the arm, then `KEY_COMPARISON`."""
    return [*(axis for axis in swept if axis != "arm"), *KEY_COMPARISON]


def speedup_tab(a: GridAnalysis) -> str:
    parts = [cpu_timings_note(a)]
    speedup = speedup_figure(a.comparison, a.summary, a.swept)
    if speedup is not None:
        parts.append(figure_html(speedup, "throughput ratio heatmap"))
    elif not a.comparison.empty:
        parts.append(
            "<p>No batch-size grid with ok runs in both an arm and the baseline: the ratios as a table.</p>"
            + compact_table_html(a.comparison, comparison_columns(a.swept), "the ratios")
        )
    else:
        parts.append("<p>Only one arm ran: nothing to compare.</p>")
    if a.table["mfu"].notna().any():
        parts.append(figure_html(bar_panel(a.table, "mfu", a.swept, "MFU"), "MFU per condition"))
        parts.append("<p>MFU: model FLOPs per token × tokens/s over the GPU's dense bf16 peak.</p>")
    else:
        parts.append("<p>MFU: not known for this device (no GPU, or a GPU without a known peak).</p>")
    return "\n".join(parts)
