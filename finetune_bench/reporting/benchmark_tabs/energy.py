"""The Summary's energy and cost: per condition, beside its throughput, the GPU energy per token and the cost of a
million tokens; why the energy is unknown where it is."""

import html

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.analysis.tables import COST_COLUMN
from finetune_bench.reporting.benchmark_tabs.cells import has_values
from finetune_bench.reporting.html import table_html
from finetune_bench.results.record import OK


def cost_label(a: GridAnalysis) -> str:
    return f"cost per million tokens at {a.gpu_hour_price:g} per GPU-hour"


def energy_and_cost_html(a: GridAnalysis) -> str:
    """Per condition, next to its throughput: the GPU energy per token and, with a price, the cost of a million
    tokens; why the energy is unknown where it is ("" when there is nothing to say)."""
    summary = a.summary
    has_energy = has_values(summary, "energy_per_token_j")
    has_cost = a.gpu_hour_price > 0 and has_values(summary, COST_COLUMN)
    parts = ["<h3>Energy and cost</h3>"]
    if has_energy:
        parts.append(
            "<p>GPU energy per non-padding token over the measured steps (NVML's energy counter, every GPU of the "
            "run; warm-up and evaluations excluded), median over ok runs.</p>"
        )
    reasons = a.table.get("energy_unavailable", pd.Series(dtype=str)).fillna("").astype(str)
    reasons = sorted(set(reasons[(reasons != "") & (a.table["status"] == OK)]))
    if reasons:
        items = "".join(f"<li>{html.escape(reason)}</li>" for reason in reasons)
        parts.append(f"<p>No energy figure for some runs (the value is left empty, not zero):</p><ul>{items}</ul>")
    if has_cost:
        parts.append(
            f"<p>Cost of a million non-padding tokens at {a.gpu_hour_price:g} per GPU-hour: the price × the run's "
            "GPUs × the time a million tokens take at its measured throughput. It counts the GPUs' time of the "
            "timed steps only (no start-up, warm-up, evaluation or idle time).</p>"
        )
    if not (has_energy or has_cost or reasons):
        return ""
    columns = [column for column, shown in (("energy_per_token_j", has_energy), (COST_COLUMN, has_cost)) if shown]
    if columns:
        keys = [column for column in (a.swept or ["condition_id"]) if column in summary]
        parts.append(table_html(summary[[*keys, "tokens_per_second", *columns]]))
    return "".join(parts)
