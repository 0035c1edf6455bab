"""The Throughput tab: tokens/s per condition; beside it the GPU energy per token where it was measured, and the
cost per million tokens where a price was given."""

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.analysis.tables import COST_COLUMN
from finetune_bench.reporting.benchmark_tabs.cells import has_values
from finetune_bench.reporting.benchmark_tabs.energy import cost_label
from finetune_bench.reporting.benchmark_tabs.figures import bar_panel
from finetune_bench.reporting.benchmark_tabs.summary import cpu_timings_note
from finetune_bench.reporting.html import figure_html


def throughput_tab(a: GridAnalysis) -> str:
    parts = [
        cpu_timings_note(a),
        "<p>Non-padding tokens per second over the measured steps (warm-up excluded). Bars: median over repeats; "
        "error bars: min–max. OOM / ERR / T/O / NaN / LOST mark conditions with no ok run.</p>",
        figure_html(bar_panel(a.table, "tokens_per_second", a.swept, "Throughput"), "throughput by batch size"),
    ]
    if has_values(a.table, "energy_per_token_j"):
        figure = bar_panel(a.table, "energy_per_token_j", a.swept, "Energy per token")
        parts.append(figure_html(figure, "GPU energy per token by batch size"))
    else:
        parts.append("<p>Energy per token: not measured (no GPU, or no NVML energy counter; see the Summary).</p>")
    if a.gpu_hour_price > 0 and has_values(a.table, COST_COLUMN):
        label = cost_label(a)
        figure = bar_panel(a.table, COST_COLUMN, a.swept, "Cost per million tokens", ylabel=label)
        parts.append(figure_html(figure, label))
    return "\n".join(parts)
