"""The benchmark report's figures print no text over other text: no label over a legend (the wall time's legend stands
under its axis' label however few conditions there are), a step-time axis labelled in plain numbers with no label
over another however many decades it spans and however narrow it is, and a loss curve's steps ticked at whole
numbers."""

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.text import Text
from matplotlib.ticker import FormatStrFormatter, LogLocator

from finetune_bench.analysis.timeline import IN_WALL_COLUMNS, OTHER_COLUMN
from finetune_bench.reporting.benchmark_tabs.figures import (
    bar_panel,
    loss_curves_figure,
    readable_log_axis,
    tick_labels,
    tick_labels_overlap,
)
from finetune_bench.reporting.benchmark_tabs.step_times import step_time_figure
from finetune_bench.reporting.benchmark_tabs.timeline import timeline_figure
from tests.reporting.test_wide_tables import _analysis


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def texts_over_legends(fig: plt.Figure) -> list[str]:
    """Every text of `fig` (its titles, each axis' label and the tick labels it prints, the texts drawn on a panel)
    that overlaps a legend, as drawn."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    texts = [*fig.texts, *([fig._suptitle] if fig._suptitle else [])]
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        texts += [label for axis in (ax.xaxis, ax.yaxis) for label in _printed(axis)]
    found = []
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for text in texts:
            if isinstance(text, Text) and text.get_visible() and text.get_text():
                if text.get_window_extent(renderer).overlaps(box):
                    found.append(text.get_text())
    return found


def _printed(axis) -> list[Text]:
    """The tick labels `axis` prints: those of its ticks within its limits (the others are not drawn)."""
    low, high = sorted(axis.get_view_interval())
    along = 0 if axis.axis_name == "x" else 1
    labels = [*axis.get_majorticklabels(), *axis.get_minorticklabels()]
    return [label for label in labels if low <= label.get_position()[along] <= high]


def _timeline(conditions: int) -> pd.DataFrame:
    """A timeline of `conditions` conditions (one arm each) with every phase measured."""
    phases = {column: 1.0 + i for i, column in enumerate(IN_WALL_COLUMNS)}
    return pd.DataFrame(
        [{"arm": f"arm{i}", "runs": 1, "reused_runs": 0, **phases, OTHER_COLUMN: 0.5} for i in range(conditions)]
    )


@pytest.mark.parametrize("conditions", [1, 2, 4, 12])
def test_the_wall_time_legend_stands_under_the_axis_label_however_few_conditions(conditions):
    fig = timeline_figure(_timeline(conditions), ["arm"])
    assert texts_over_legends(fig) == []
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    (ax,) = fig.axes
    assert legend.get_window_extent(renderer).y1 <= ax.xaxis.label.get_window_extent(renderer).y0


def test_a_legend_just_under_a_short_axis_is_found_over_its_label():
    # the wall time's legend as it stood: anchored a quarter of the axes' height under them, which for one condition
    # is less than the axis' label takes
    fig, ax = plt.subplots(figsize=(9, 2.3))
    ax.barh(["baseline"], [3.0], label="startup")
    ax.set_xlabel("seconds (median over the condition's ok runs)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=5, frameon=False)
    fig.tight_layout()
    assert texts_over_legends(fig) == ["seconds (median over the condition's ok runs)"]


def test_the_other_figures_with_a_legend_print_nothing_over_it():
    a = _analysis()  # two arms side by side at each batch size: a legend beside the bars
    fig = bar_panel(a.table, "tokens_per_second", a.swept, "Throughput")
    assert fig.legends and texts_over_legends(fig) == []
    assert texts_over_legends(loss_curves_figure(a.steps, a.swept)) == []
    fig = step_time_figure(_steps(40, 0.01, 10), ["arm"])
    assert fig.axes[0].get_legend() is not None and texts_over_legends(fig) == []


@pytest.mark.parametrize("steps", [3, 4, 7, 20])
def test_the_loss_curves_tick_their_steps_at_whole_numbers(steps):
    a = _analysis()
    curves = pd.concat([a.steps.assign(step=s) for s in range(steps)])
    fig = loss_curves_figure(curves, a.swept)
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = [float(label.get_position()[0]) for label in _printed(ax.xaxis)]
        assert len(ticks) >= 2 and all(tick.is_integer() for tick in ticks), ticks


def _steps(id_length: int, fastest: float, slowest: float) -> pd.DataFrame:
    """Two conditions' steps: 3 warm-up steps up to `slowest` s, then 17 timed steps about `fastest` s (the other
    arm's 1.6 times longer); condition ids `id_length` characters long (the longer, the narrower the axis)."""
    rows = []
    for arm, base in (("baseline", fastest), ("liger", fastest * 1.6)):
        condition = f"arm={arm},per_device_train_batch_size=4,max_seq_length=4096,packing=False,attention=sdpa"
        for step in range(20):
            warmup = step < 3
            seconds = slowest * (step + 1) / 3 if warmup else base * (1 + 0.1 * (step % 3))
            rows.append({
                "condition_id": condition[:id_length], "arm": arm, "step": step, "is_warmup": warmup,
                "new_shape": False, "step_time_s": seconds,
            })  # fmt: skip
    return pd.DataFrame(rows)


# The axis' span (fastest and slowest step, in seconds) and how narrow it is (the condition ids take the rest): a GPU
# run's tenth of a second to a warm-up's few seconds, a CPU run's milliseconds to a compilation's minutes.
SPANS = [
    (id_length, fastest, slowest)
    for id_length in (12, 30, 45, 60)
    for fastest, slowest in ((0.3, 0.5), (0.15, 5.0), (0.01, 10.0), (0.002, 10.0), (0.002, 100.0), (0.0005, 1000.0))
]


@pytest.mark.parametrize(("id_length", "fastest", "slowest"), SPANS)
def test_a_step_time_axis_prints_plain_numbers_none_over_another(id_length, fastest, slowest):
    fig = step_time_figure(_steps(id_length, fastest, slowest), ["arm"])
    axis = fig.axes[0].xaxis
    readable_log_axis(axis)
    labels = [text for text, _ in tick_labels(axis)]
    assert len(labels) >= 2 and tick_labels_overlap(axis) == []
    assert all("e" not in label for label in labels)  # "0.002", never "2e-03"


def test_ticks_at_1_2_and_5_crowd_a_narrow_axis_of_four_decades():
    # what a step-time axis printed at 1, 2 and 5 times each power of ten, whatever its length: "0.010.02"
    fig = step_time_figure(_steps(30, 0.002, 10.0), ["arm"])
    axis = fig.axes[0].xaxis
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FormatStrFormatter("%g"))
    assert tick_labels_overlap(axis)  # here ("0.005", "0.01")
    readable_log_axis(axis)  # the same axis: at 1 and 3, or at the powers of ten
    assert tick_labels_overlap(axis) == [] and "0.01" in [text for text, _ in tick_labels(axis)]


def test_the_step_time_figure_s_axis_prints_no_label_over_another():
    fig = step_time_figure(_steps(30, 0.002, 10.0), ["arm"])
    assert tick_labels_overlap(fig.axes[0].xaxis) == []
