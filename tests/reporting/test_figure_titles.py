"""A figure's title stands above its panels' titles, however many lines it has: the kernel report's Speed and Memory
figures (one panel per kernel) with the CPU run's second title line, one row of panels or several, and any figure that
`figures.title_above_panels` titles."""

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from finetune_bench.kernels.report import _ratio_figure, comparison
from finetune_bench.reporting.benchmark_tabs.figures import title_above_panels
from tests.kernels.test_kernels import _gpu_rows


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _overlaps(fig: plt.Figure) -> list[str]:
    """The panels whose title (or tick labels, axis labels) the figure's title overlaps, as laid out."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    return [
        ax.get_title() or f"panel {i}"
        for i, ax in enumerate(fig.axes)
        if title.overlaps(ax.title.get_window_extent(renderer)) or title.overlaps(ax.get_tightbbox(renderer))
    ]


def _many_kernels(n: int) -> pd.DataFrame:
    """The GPU rows' two kernels copied under `n` names: two rows of panels at four a row."""
    rows = _gpu_rows()
    return pd.concat([rows.assign(kernel_name=rows["kernel_name"] + f"_{i}") for i in range(n // 2)])


@pytest.mark.parametrize(
    ("column", "label", "kernels", "cpu"),
    [
        ("speedup", "speedup", 2, True),  # the Speed tab of a CPU run: a two-line title over one row of panels
        ("speedup", "speedup", 8, True),
        ("speedup", "speedup", 2, False),
        ("memory_ratio", "memory ratio", 2, True),
    ],
    ids=["speed-cpu-one-row", "speed-cpu-two-rows", "speed-gpu", "memory-cpu"],
)
def test_the_kernel_figures_title_stands_clear_of_every_panel(column, label, kernels, cpu):
    fig = _ratio_figure(comparison(_many_kernels(kernels)), column, label, cpu)
    assert len(fig.axes) == kernels
    assert fig._suptitle.get_text().count("\n") == (1 if cpu else 0)
    assert _overlaps(fig) == []
    # it still heads the figure: its bottom just above the panels' tops, not floating far off
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    bottom = fig._suptitle.get_window_extent(renderer).y0
    top = max(ax.get_tightbbox(renderer).y1 for ax in fig.axes)
    assert 0 < bottom - top < 20


def test_a_three_line_title_stands_above_the_panels_of_a_short_figure():
    fig, axes = plt.subplots(1, 3, figsize=(9, 2))
    for i, ax in enumerate(axes):
        ax.set_title(f"panel {i}\nwith a second line")
    fig.tight_layout()
    title_above_panels(fig, "A title\nof three\nlines")
    assert _overlaps(fig) == []
