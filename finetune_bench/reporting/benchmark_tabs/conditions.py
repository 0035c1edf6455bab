"""The Conditions tab: every condition's summary, then every run that did not end ok, with its reason and error."""

import html

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.reporting.html import table_html
from finetune_bench.results.record import OK


def conditions_tab(a: GridAnalysis) -> str:
    parts = [table_html(a.summary)]
    failures = a.table[a.table["status"] != OK]
    if failures.empty:
        parts.append("<p>No run failed.</p>")
    for row in failures.itertuples(index=False):
        parts.append(
            f"<h3>{html.escape(row.condition_id)} (run {row.run_number}): {html.escape(row.status)}</h3>"
            f"<p>{html.escape(str(row.reason))}</p>"
            f"<pre>{html.escape(str(getattr(row, 'error_tail', '') or ''))}</pre>"
        )
    return "\n".join(parts)
