"""The Conditions tab: every condition's summary, then every run that did not end ok, with its reason and error."""

import html

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.reporting.benchmark_tabs.cells import text_or_missing
from finetune_bench.reporting.html import wrapping_table_html
from finetune_bench.results.record import OK


def conditions_tab(a: GridAnalysis) -> str:
    parts = [wrapping_table_html(a.summary)]
    failures = a.table[a.table["status"] != OK]
    if failures.empty:
        parts.append("<p>No run failed.</p>")
    for row in failures.itertuples(index=False):
        error_tail = text_or_missing(getattr(row, "error_tail", None))
        parts.append(
            f"<h3>{html.escape(row.condition_id)} (run {row.run_number}): {html.escape(row.status)}</h3>"
            f"<p>{html.escape(text_or_missing(row.reason))}</p>"
            + (f"<pre>{html.escape(error_tail)}</pre>" if error_tail not in ("", "–") else "")
        )
    return "\n".join(parts)
