"""The Runs tab: where each condition's wall time went, then every run with every metric."""

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.reporting.benchmark_tabs.timeline import timeline_html
from finetune_bench.reporting.html import table_html


def runs_tab(a: GridAnalysis) -> str:
    # Whether a run was reused from the results store is bookkeeping: a resumed grid reports like an uninterrupted one.
    runs = table_html(a.table[[c for c in a.table.columns if c != "error_tail"]])
    return timeline_html(a) + "<h3>Every run</h3>" + runs
