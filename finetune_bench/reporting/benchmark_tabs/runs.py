"""The Runs tab: where each condition's wall time went, then every run: its key figures, every metric behind a
toggle (the results table has them all)."""

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.reporting.benchmark_tabs.timeline import timeline_html
from finetune_bench.reporting.html import compact_table_html

# What a run's row shows before the toggle, after the swept axes and the run's number.
KEY_RUN_COLUMNS = (
    "status",
    "tokens_per_second",
    "steady_tokens_per_second",
    "step_time_median_s",
    "peak_allocated_gib",
    "peak_reserved_gib",
    "mfu",
    "final_loss",
    "loss_parity",
    "steps_completed",
    "wall_time_s",
    "reused",
)


def runs_tab(a: GridAnalysis) -> str:
    # Whether a run was reused from the results store is bookkeeping: a resumed grid reports like an uninterrupted one.
    runs = a.table[[c for c in a.table.columns if c != "error_tail"]]
    keys = a.swept or ["condition_id"]
    first = [*keys, "run_number", *(c for c in KEY_RUN_COLUMNS if c in runs and runs[c].notna().any())]
    return timeline_html(a) + "<h3>Every run</h3>" + compact_table_html(runs, first, "every run")
