"""The Stacks tab (two or more stacks against the baseline): the leaderboard at each point of the other axes,
speed against memory with the Pareto front, the stack for each memory budget and what each component adds."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from finetune_bench.analysis.grid import GridAnalysis  # noqa: E402
from finetune_bench.analysis.stacks import MEMORY_TIE, RATIOS  # noqa: E402
from finetune_bench.analysis.stats import CONFIDENCE_LEVEL, MIN_PAIRS_FOR_CI  # noqa: E402
from finetune_bench.inputs.arms import BASELINE  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.cells import pairs_text, ratio_text  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.figures import panels  # noqa: E402
from finetune_bench.reporting.html import arm_palette, figure_html, table_html  # noqa: E402


def front_text(row: tuple) -> str:
    """The leaderboard's Pareto cell: "yes", or which stack beats this one, and how."""
    if row.pareto:
        return "yes"
    if pd.isna(row.throughput_ratio):
        return "not compared: no ok run paired with the baseline's"
    if row.beaten_by == "–":
        return "no: its memory was not measured"
    if row.beaten_by_peak_reserved_ratio < row.peak_reserved_ratio:
        return f"no: {row.beaten_by} is as fast or faster and leaner"
    return f"no: {row.beaten_by} is faster and needs at most {MEMORY_TIE:.0%} of the baseline's memory more"


def stacks_figure(stacks: pd.DataFrame, swept: list[str]) -> plt.Figure:
    """Speed against memory, both as ratios to the baseline (at 1, 1), one panel per point of the other axes:
    stacks on the Pareto front filled, the others hollow."""
    facets = [axis for axis in swept if axis != "arm"]
    data = stacks.assign(panel=panels(stacks, facets))
    panel_labels = list(dict.fromkeys(data["panel"]))
    palette = arm_palette(data["arm"])
    fig, axes = plt.subplots(1, len(panel_labels), figsize=(max(5.5, 5 * len(panel_labels)), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panel_labels, strict=True):
        rows = data[(data["panel"] == panel) & data["throughput_ratio"].notna() & data["peak_reserved_ratio"].notna()]
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.scatter([1.0], [1.0], marker="s", color="black")
        ax.annotate(BASELINE, (1.0, 1.0), textcoords="offset points", xytext=(5, -10), fontsize=8)
        for row in rows.itertuples(index=False):
            color = palette[row.arm]
            ax.scatter([row.peak_reserved_ratio], [row.throughput_ratio], s=60, edgecolors=color,
                       facecolors=color if row.pareto else "none", linewidths=1.5)  # fmt: skip
            ax.annotate(row.arm, (row.peak_reserved_ratio, row.throughput_ratio), textcoords="offset points",
                        xytext=(5, 4), fontsize=8)  # fmt: skip
        ax.set_xlabel("peak reserved memory × baseline (lower: leaner)")
        ax.set_ylabel("throughput × baseline (higher: faster)")
        ax.set_title(panel)
    fig.suptitle("Stacks: speed against memory (filled: on the Pareto front)")
    fig.tight_layout()
    return fig


def stacks_tab(a: GridAnalysis) -> str | None:
    """Two or more stacks against the baseline: the leaderboard at each point of the other axes, and speed against
    memory with the stacks no other one beats on both (no tab with fewer stacks)."""
    if a.stacks.empty:
        return None
    stacks, others = a.stacks, [axis for axis in a.swept if axis != "arm"]
    shown = stacks[["rank", "arm", *others, "pairs"]].copy()
    missing = pd.Series(float("nan"), index=stacks.index)
    for name in RATIOS:
        if f"{name}_ratio" in stacks and stacks[f"{name}_ratio"].notna().any():  # a ratio no pair measured: no column
            bounds = (stacks.get(f"{name}_ci_low", missing), stacks.get(f"{name}_ci_high", missing))
            ratios = zip(stacks[f"{name}_ratio"], *bounds, strict=True)
            shown[f"{name.replace('_', ' ')} ×"] = [ratio_text(*values) for values in ratios]
    shown["loss matched"] = stacks["loss_match"]
    shown["Pareto front"] = [front_text(row) for row in stacks.itertuples(index=False)]
    parts = [
        "<p>Each stack (arm) against the baseline at the same other settings, ranked by throughput: the geometric "
        "mean ratio "
        f"of runs paired by run number with its {CONFIDENCE_LEVEL:.0%} interval (over {pairs_text(stacks['pairs'])}; "
        f"computed from {MIN_PAIRS_FOR_CI} pairs on), the same at the steady state where the runs measured one (every "
        "timed step's tokens at the time that the steps which met no new batch shape take, fitted robustly, so that "
        "no single slow step moves it; where the two differ, the all-steps ratio holds what a run's slow steps cost "
        "it: new batch shapes, kernels compiled in timed steps), the ratios of peak reserved memory and energy per "
        "token, and how many of its runs' losses matched the baseline's. A stack off the Pareto front is beaten on "
        "both speed and memory by another one here, or by the baseline: it is never the one to train with on this "
        f"model, batch and sequence length. Memories within {MEMORY_TIE:.0%} of the baseline's count as the same: a "
        "stack that saves less than that over a faster one is off the front.</p>",
        table_html(shown),
    ]
    if "peak_reserved_ratio" in stacks and stacks["peak_reserved_ratio"].notna().any():
        parts.append(figure_html(stacks_figure(stacks, a.swept), "stacks: speed against memory"))
    if not a.stack_budgets.empty:
        budgets = a.stack_budgets[[*others, "at_least_gib", "train_with", "throughput_ratio"]].rename(
            columns={
                "at_least_gib": "memory budget from (GiB)",
                "train_with": "train with",
                "throughput_ratio": "throughput ×",
            }  # fmt: skip
        )
        parts += [
            "<h3>Which stack for your memory budget</h3>"
            "<p>From each budget of GPU memory up (the stack's median peak reserved memory here), the fastest stack "
            "that fits it, among the baseline and the stacks on the front whose losses did not diverge from the "
            "baseline's; "
            "below the first budget none of them fits.</p>",
            table_html(budgets),
        ]
    if not a.stack_components.empty:
        factors = ["throughput_factor", "steady_throughput_factor", "peak_reserved_factor"]
        factors = [f for f in factors if f in a.stack_components and a.stack_components[f].notna().any()]
        components = a.stack_components[[*others, "stack", "component", "without", *factors]].rename(
            columns={
                "without": "compared with",
                "throughput_factor": "throughput ×",
                "steady_throughput_factor": "steady throughput ×",
                "peak_reserved_factor": "peak reserved ×",
            }  # fmt: skip
        )
        parts += [
            "<h3>What each component adds</h3>"
            "<p>For a stack of several components and an arm of the grid that lacks one of them, that component's "
            "share: the stack's ratio to the baseline divided by the other arm's (above 1 in throughput: it makes the "
            "stack faster; below 1 in peak reserved memory: leaner), in throughput also from the steady-state ratios "
            "where the runs measured them (an arm whose runs paid for slow steps moves the all-steps factor). Only the "
            "ablations the grid measured.</p>",
            table_html(components),
        ]
    return "\n".join(parts)
