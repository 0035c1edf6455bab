"""The benchmark report's bar charts (Throughput, Energy per token, Memory, MFU: `figures.bar_panel`): one encoding a
variable. Where the x axis already names the arm (only the arm is swept: x is the condition), each bar stands
centred and full width on its tick, not off-centre at half width beside an empty slot; where several arms share an x,
they stand side by side. Bars a thousandfold apart (a CPU run) are drawn on a log axis, each with its value above it."""

import matplotlib.pyplot as plt
import pytest

from finetune_bench.reporting.benchmark_tabs.figures import bar_panel, spans_orders_of_magnitude
from tests.reporting.test_report_figures import _grid
from tests.reporting.test_wide_tables import _analysis


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _bars(ax: plt.Axes) -> list[tuple[float, float, float]]:
    """Each drawn bar's x centre, width and height, left to right."""
    bars = [patch for container in ax.containers for patch in container.patches if patch.get_width() > 0]
    return sorted((bar.get_x() + bar.get_width() / 2, bar.get_width(), bar.get_height()) for bar in bars)


def _labels(ax: plt.Axes) -> dict[str, float]:
    """The values written above the bars, by their x."""
    return {text.get_text(): text.xy[0] for text in ax.texts if hasattr(text, "xy")}


def test_a_bar_per_arm_stands_centred_and_full_width_on_its_tick_and_a_thousandfold_gap_is_drawn_on_a_log_axis():
    # a CPU run: Liger's kernels in the Triton interpreter, a thousand times slower than the baseline
    analysis = _grid({"liger": 1.2, "baseline": 1000.0}, n_runs=3)
    assert analysis.swept == ["arm"]
    fig = bar_panel(analysis.table, "tokens_per_second", analysis.swept, "Throughput")
    (ax,) = fig.axes
    bars = _bars(ax)
    assert [round(centre, 6) for centre, _, _ in bars] == list(ax.get_xticks()) == [0, 1]
    assert {round(width, 6) for _, width, _ in bars} == {0.8}  # full width, every bar alike
    assert [label.get_text() for label in ax.get_xticklabels()] == ["arm=baseline", "arm=liger"]
    assert ax.get_yscale() == "log" and ax.get_ylabel().endswith("(log scale)")
    assert ax.get_ylim()[0] < min(height for _, _, height in bars)  # the small bar keeps a visible height
    assert _labels(ax) == {"1,010": 0.0, "1.21": 1.0}  # each bar's median above it
    assert fig.legends == []  # the ticks name the arms: no legend repeating them


def test_bars_of_the_same_order_of_magnitude_stay_on_a_linear_axis_from_zero():
    analysis = _grid({"liger": 12.0, "baseline": 10.0}, n_runs=2)
    (ax,) = bar_panel(analysis.table, "tokens_per_second", analysis.swept, "Throughput").axes
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    assert [round(centre, 6) for centre, _, _ in _bars(ax)] == [0, 1]
    assert not spans_orders_of_magnitude([10.0, 12.0]) and spans_orders_of_magnitude([1.2, 1000.0])
    assert not spans_orders_of_magnitude([0.0, 1000.0])  # a zero has no place on a log axis


def test_arms_that_share_an_x_stand_side_by_side_and_a_failed_one_is_marked_in_its_own_slot():
    analysis = _analysis()  # liger and baseline at batch sizes 4 and 8
    table = analysis.table.copy()
    failed = (table["arm"] == "liger") & (table["per_device_train_batch_size"] == 8)
    table.loc[failed, "status"] = "oom"
    fig = bar_panel(table, "tokens_per_second", analysis.swept, "Throughput")
    (ax,) = fig.axes
    bars = _bars(ax)
    # baseline in the left half of each tick, liger in the right; liger at batch 8 ran out of memory
    assert [round(centre, 6) for centre, _, _ in bars] == [-0.2, 0.2, 0.8]
    assert {round(width, 6) for _, width, _ in bars} == {0.4}
    (oom,) = [text for text in ax.texts if text.get_text() == "OOM"]
    assert round(oom.get_position()[0], 6) == 1.2
    assert sorted(round(x, 6) for x in _labels(ax).values()) == [-0.2, 0.2, 0.8]
    assert ax.get_yscale() == "linear"
    (legend,) = fig.legends
    assert [text.get_text() for text in legend.get_texts()] == ["baseline", "liger"]


def test_a_failed_condition_of_an_arm_swept_alone_is_marked_on_its_tick():
    analysis = _grid({"liger": 12.0, "baseline": 10.0}, n_runs=2)
    table = analysis.table.assign(status=analysis.table["status"].where(analysis.table["arm"] == "baseline", "oom"))
    (ax,) = bar_panel(table, "tokens_per_second", analysis.swept, "Throughput").axes
    assert [round(centre, 6) for centre, _, _ in _bars(ax)] == [0]
    (oom,) = [text for text in ax.texts if text.get_text() == "OOM"]
    assert oom.get_position()[0] == 1
