"""Where each condition's wall time went (`GridAnalysis.timeline`): a stacked bar per condition and its table, at
the top of the Runs tab."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from finetune_bench.analysis.grid import GridAnalysis  # noqa: E402
from finetune_bench.analysis.timeline import IN_WALL_COLUMNS, OTHER_COLUMN  # noqa: E402
from finetune_bench.reporting.html import figure_html, wrapping_table_html  # noqa: E402


def timeline_figure(timeline: pd.DataFrame, swept: list[str]) -> plt.Figure:
    """One stacked bar per condition: its median wall time split into the phases of the timeline and the remainder
    no phase covers (a phase no run measured has no segment); the legend under the figure, clear of the axis'
    label."""
    keys = [axis for axis in swept if axis in timeline] or ["condition_id"]
    labels = [
        ", ".join(str(row[k]) for k in keys) + reused_label(row.get("reused_runs", 0), row["runs"])
        for _, row in timeline.iterrows()
    ]
    segments = [*IN_WALL_COLUMNS, OTHER_COLUMN]
    colors = dict(zip(segments, sns.color_palette("tab20", len(segments)), strict=True))
    # constrained layout makes room for the legend under the axis, below its label, however short the axes are
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(labels) + 1.8), layout="constrained")
    left = pd.Series(0.0, index=timeline.index)
    for column in segments:
        values = timeline[column].fillna(0.0).clip(lower=0.0)
        if (values > 0).any():
            ax.barh(labels, values, left=left, color=colors[column], label=column.removesuffix("_s"))
            left = left + values
    ax.invert_yaxis()
    ax.set_xlabel("seconds (median over the condition's ok runs)")
    fig.legend(loc="outside lower center", ncol=5, fontsize=8, frameon=False)
    ax.set_title("Where a run's wall time went")
    return fig


def reused_label(reused: float, runs: float) -> str:
    """ " (reused)" for a condition whose every run came from the results store, " (k of n reused)" for some."""
    if not reused or pd.isna(reused):
        return ""
    return " (reused)" if reused == runs else f" ({int(reused)} of {int(runs)} reused)"


def timeline_html(a: GridAnalysis) -> str:
    """Per condition, where its runs' wall time went; nothing when no run has a timeline."""
    if a.timeline.empty:
        return ""
    return (
        "<h3>Where the wall time went</h3><p>Each condition's median over its ok runs of every phase of a run, from "
        "the launcher starting its child process to the child's exit (<code>wall_time_s</code>): start-up, imports, "
        "the model built, the data prepared, the set-up before the first step, the warm-up and the timed steps, "
        "the evaluations, the profile, writing the result and the exit. A phase no run measured is left empty "
        "(–), not 0; <code>other_s</code> is the wall time no measured phase covers, and "
        "<code>outside_steps_s</code> the wall time outside the warm-up and the timed steps. "
        "<code>store_s</code> is the launcher's results-store lookup before the run, outside the wall time. A run "
        'reused from the results store (<code>reused_runs</code>; "reused" beside the condition) shows the '
        "timeline of the execution that measured it, not this one's.</p>"
        + figure_html(timeline_figure(a.timeline, a.swept), "where the wall time went, per condition")
        + wrapping_table_html(a.timeline)
    )
