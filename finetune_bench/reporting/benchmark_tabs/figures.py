"""What the tabs' figures share: the grid's axes (batch size on x, one panel per value of the other axes), bars of
a metric per condition with failed conditions marked, the loss curves (training and held-out), and a title that
stands above its panels however many lines it has."""

import textwrap
from itertools import combinations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

from finetune_bench.analysis.tables import METRIC_BY_COLUMN  # noqa: E402
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT  # noqa: E402
from finetune_bench.reporting.html import arm_palette, short_number  # noqa: E402
from finetune_bench.results.record import ERROR, LOST, NONFINITE, OK, OOM, PREDICTED_OOM, TIMEOUT  # noqa: E402

BATCH = "per_device_train_batch_size"
SEQ = "max_seq_length"
FAILED_STATUSES_MARK = {
    PREDICTED_OOM: "P-OOM",
    OOM: "OOM",
    ERROR: "ERR",
    TIMEOUT: "T/O",
    NONFINITE: "NaN",
    LOST: "LOST",
}


def with_arm(table: pd.DataFrame) -> pd.DataFrame:
    return table if "arm" in table else table.assign(arm="(one arm)")


def x_axis(swept: list[str]) -> str:
    if BATCH in swept:
        return BATCH
    others = [axis for axis in swept if axis != "arm"]
    return others[0] if others else "condition_id"


def panels(data: pd.DataFrame, facets: list[str]) -> pd.Series:
    """A label per row naming its values of the facet axes (one panel per label)."""
    if not facets:
        return pd.Series("", index=data.index)
    labels = data[facets].apply(lambda column: column.name + "=" + column.astype(str))
    return labels.agg(", ".join, axis=1)


def axis_label(column: str) -> str:
    """A results column as a figure's axis: what the metric measures and its unit (`measuring.metrics`)."""
    metric = METRIC_BY_COLUMN[column]
    return f"{metric.description} ({metric.column_unit})"


# Bars whose largest value is this many times the smallest are drawn on a log axis: on a linear one, a CPU run's arms a
# thousandfold apart leave the small bars flat on zero.
BAR_LOG_SPAN = 100.0


def spans_orders_of_magnitude(values: pd.Series, span: float = BAR_LOG_SPAN) -> bool:
    """Whether `values` are all positive and their largest is `span` times their smallest or more (a log axis shows
    them all; a linear one flattens the small ones)."""
    values = pd.Series(values, dtype=float).dropna()
    return bool(not values.empty and (values > 0).all() and values.max() / values.min() >= span)


def bar_panel(
    table: pd.DataFrame,
    metric: str,
    swept: list[str],
    title: str,
    capacity_gib: float | None = None,
    ylabel: str | None = None,
) -> plt.Figure:
    """Median of `metric` (a results column) over ok runs per condition (bars, min–max over repeats as error
    bars, each bar's median written above its error bar), one panel per value of the axes other than the arm and x;
    failed conditions marked, never dropped; a dashed line at the GPU's capacity when given. The y axis names the
    metric (`axis_label`) unless `ylabel` does (a column the analysis adds), and is logarithmic where the bars span
    orders of magnitude (`spans_orders_of_magnitude`: a CPU run's arms a thousandfold apart). Where x already tells
    the arms apart (only the arm is swept: x is the condition), each bar stands centred and full width on its tick,
    coloured by its arm, with no legend; otherwise the arms' bars stand side by side at each x, the legend naming
    their colours."""
    ylabel = ylabel or axis_label(metric)
    x = x_axis(swept)
    facets = [axis for axis in swept if axis not in ("arm", x)]
    data = with_arm(table).copy()
    data["panel"] = panels(data, facets)
    panel_labels = list(dict.fromkeys(data["panel"]))
    order = sorted(data[x].unique())
    palette = arm_palette(data["arm"])
    hue_order = list(palette)
    # Side by side only where an x value has several arms: else a bar would sit off its tick beside empty slots.
    dodge = bool((data.groupby(["panel", x])["arm"].nunique() > 1).any())
    slots = hue_order if dodge else []
    ok_rows = data[(data["status"] == OK) & data[metric].notna()]
    log = spans_orders_of_magnitude(ok_rows.groupby(["panel", x, "arm"])[metric].median())
    fig, axes = plt.subplots(
        1, len(panel_labels), figsize=(max(6, 5.5 * len(panel_labels)), 4.2), squeeze=False, sharey=True
    )
    for ax, panel in zip(axes[0], panel_labels, strict=True):
        subset = data[data["panel"] == panel]
        ok = ok_rows[ok_rows["panel"] == panel]
        if not ok.empty:
            sns.barplot(
                data=ok, x=x, y=metric, hue="arm", order=order, hue_order=hue_order, palette=palette,
                estimator="median", errorbar=("pi", 100), capsize=0.1, dodge=dodge, ax=ax, legend=False,
            )  # fmt: skip
        mark_failures(ax, subset, x, order, slots)
        if capacity_gib:
            ax.axhline(capacity_gib, color="#C00000", linestyle="--", linewidth=1)
            ax.text(0.01, capacity_gib, f" GPU capacity {capacity_gib:.0f} GiB", color="#C00000", va="bottom",
                    fontsize=8, transform=ax.get_yaxis_transform())  # fmt: skip
        ax.set_xlim(-0.5, len(order) - 0.5)
        ax.set_xticks(range(len(order)), [str(v) for v in order])
        ax.set_xlabel(x)
        ax.set_ylabel(textwrap.fill(ylabel, 50) + ("\n(log scale)" if log else ""))  # no longer than the panel
        ax.set_title(panel)
        if log:  # from below the smallest run (the smallest bar keeps a visible height), room above for the labels
            ax.set_yscale("log")
            ax.set_ylim(ok_rows[metric].min() / 3, ax.get_ylim()[1] * 2)
        else:  # from zero, room above for the labels
            ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        label_bars(ax, ok, x, metric, order, slots)
    if dodge:
        handles = [plt.Rectangle((0, 0), 1, 1, color=palette[arm]) for arm in hue_order]
        fig.legend(handles, hue_order, title="arm", loc="upper left", bbox_to_anchor=(1.0, 0.9))
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def bar_position(order: list, x_value: object, slots: list[str], arm: str) -> float:
    """Where the bar of `arm` at `x_value` stands: its arm's slot among `slots` where the arms stand side by side
    (seaborn's dodge: 0.8 wide in all), the tick itself where `slots` is empty (one bar an x)."""
    position = float(order.index(x_value))
    if slots:
        position += -0.4 + 0.8 / len(slots) * (slots.index(arm) + 0.5)
    return position


def label_bars(ax: plt.Axes, ok: pd.DataFrame, x: str, metric: str, order: list, slots: list[str]) -> None:
    """Each bar's median (`short_number`) above the top of its error bar, where it crosses neither the bar nor the
    error bar's cap."""
    for (x_value, arm), values in ok.groupby([x, "arm"])[metric]:
        ax.annotate(
            short_number(values.median()), (bar_position(order, x_value, slots, arm), values.max()),
            xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8,
        )  # fmt: skip


def mark_failures(ax: plt.Axes, subset: pd.DataFrame, x: str, order: list, slots: list[str]) -> None:
    """Write OOM / ERR / T/O / NaN / LOST where a condition has no ok run, where its bar would stand
    (`bar_position`)."""
    for (x_value, arm), cell in subset.groupby([x, "arm"]):
        if (cell["status"] == OK).any():
            continue
        worst = cell["status"].mode().iloc[0]
        ax.text(
            bar_position(order, x_value, slots, arm), 0.02, FAILED_STATUSES_MARK.get(worst, worst.upper()),
            transform=ax.get_xaxis_transform(), ha="center", va="bottom", rotation=90, color="#C00000",
            fontweight="bold",
        )  # fmt: skip


# Where a log axis' labelled ticks stand, densest first: at 1, 2 and 5 times each power of ten, at 1 and 3 (each
# power of ten, however many: `numticks` high enough that `LogLocator` keeps them all), at the powers of ten
# (`LogLocator` skipping some where they crowd the axis), at three powers of ten at most.
EVERY_DECADE = 1000
LOG_TICKS = (
    {"subs": (1.0, 2.0, 5.0), "numticks": EVERY_DECADE},
    {"subs": (1.0, 3.0), "numticks": EVERY_DECADE},
    {"subs": (1.0,)},
    {"subs": (1.0,), "numticks": 3},
)


def readable_log_axis(axis: matplotlib.axis.Axis) -> None:
    """A log axis (a step time's seconds) labelled in plain numbers ("0.02", "5") as densely as its length allows:
    the first of `LOG_TICKS` that labels two ticks or more, no label over another (`tick_labels_overlap`). Call it
    once the figure is laid out (after `tight_layout`): the axis' length is known then."""
    axis.set_major_formatter(FormatStrFormatter("%g"))
    axis.set_minor_locator(LogLocator(subs="auto"))
    axis.set_minor_formatter(NullFormatter())
    for ticks in LOG_TICKS:
        axis.set_major_locator(LogLocator(**ticks))
        if len(tick_labels(axis)) >= 2 and not tick_labels_overlap(axis):
            return


def tick_labels(axis: matplotlib.axis.Axis) -> list[tuple[str, matplotlib.transforms.Bbox]]:
    """The tick labels `axis` prints (major and minor, within its limits) once its figure is drawn: each label's text
    and its box on the canvas."""
    figure = axis.get_figure(root=True)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    low, high = sorted(axis.get_view_interval())
    along = 0 if axis.axis_name == "x" else 1
    return [
        (label.get_text(), label.get_window_extent(renderer))
        for label in [*axis.get_majorticklabels(), *axis.get_minorticklabels()]
        if label.get_visible() and label.get_text() and low <= label.get_position()[along] <= high
    ]


def tick_labels_overlap(axis: matplotlib.axis.Axis) -> list[tuple[str, str]]:
    """The pairs of `axis`' tick labels (`tick_labels`) that print over one another: ("0.01", "0.02") where they run
    together as "0.010.02"."""
    return [(a, b) for (a, box_a), (b, box_b) in combinations(tick_labels(axis), 2) if box_a.overlaps(box_b)]


def title_above_panels(fig: plt.Figure, title: str) -> None:
    """`title` as the figure's title, its lowest line just above the highest of its panels (their titles and tick
    labels included), however many lines it has: a fixed `y` leaves a two-line title over the panels' titles in a
    short figure. The figure is laid out first; saved with a tight bounding box, the page shows the title whole."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    top = max((ax.get_tightbbox(renderer).y1 for ax in fig.axes if ax.get_visible()), default=fig.bbox.y1)
    pad = 6 * fig.dpi / 72  # points
    fig.suptitle(title, y=(top + pad) / fig.bbox.height, va="bottom")


def loss_curves_figure(
    steps: pd.DataFrame,
    swept: list[str],
    max_panels: int = 12,
    column: str = "loss",
    title: str = "Training loss per step (one line per run)",
) -> plt.Figure | None:
    """`column` (the training loss, or the held-out loss) per step, one panel per condition of the other axes,
    every run of every arm overlaid; the steps' ticks are whole numbers."""
    if steps is None or steps.empty or column not in steps or steps[column].isna().all():
        return None
    facets = [axis for axis in swept if axis != "arm"]
    data = with_arm(steps[steps[column].notna()]).copy()
    data["panel"] = panels(data, facets)
    panel_labels = list(dict.fromkeys(data["panel"]))[:max_panels]
    data = data[data["panel"].isin(panel_labels)]
    palette = arm_palette(data["arm"])
    columns = min(len(panel_labels), 3)
    # Dashed baseline under solid arms: curves that match exactly stay visible.
    dashes = {arm: (4, 2) if arm in (BASELINE, BASELINE_REPEAT) else "" for arm in palette}
    grid = sns.relplot(
        data=data, x="step", y=column, hue="arm", hue_order=list(palette), palette=palette, units="run_number",
        style="arm", style_order=list(palette), dashes=dashes, estimator=None, kind="line", col="panel",
        col_wrap=columns if len(panel_labels) > 1 else None, height=3.2, aspect=1.4, alpha=0.8,
        facet_kws={"sharey": False},
    )  # fmt: skip
    grid.set_titles("{col_name}")
    for ax in grid.axes.flat:  # a step is a whole number: no tick at step 2.5 (else matplotlib's own ticks)
        ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))
    grid.figure.suptitle(title, y=1.02)
    return grid.figure
