"""The Loss curves tab: every run's loss per step with the loss-parity table, then the held-out loss (its curves,
every run's loss before and after training, each arm's run against its baseline run)."""

import html

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.reporting.benchmark_tabs.figures import loss_curves_figure
from finetune_bench.reporting.html import compact_table_html, figure_html, table_html

# The loss-parity table's first columns: the verdict, then which pair and how far apart (the runs' condition ids are
# behind the toggle).
KEY_PARITY = ("verdict", "arm", "run_number", "steps_compared", "max_abs_diff", "max_rel_diff", "first_divergent_step")


def loss_curves_tab(a: GridAnalysis) -> str:
    curves = loss_curves_figure(a.steps, a.swept)
    content = figure_html(curves, "loss curves") if curves is not None else "<p>No run recorded a loss.</p>"
    if not a.parity.empty:
        content += (
            "<h3>Loss parity</h3><p>Each arm's run against the baseline run with the same other settings and run "
            "number (same seed, same data order), step by step.</p>"
            + compact_table_html(a.parity, _parity_columns(a), "the loss parity")
        )
    return content + held_out_html(a)


def _parity_columns(a: GridAnalysis) -> list[str]:
    """The verdict first, then the pair (its arm, the other swept axes, the run) and how far its curves got."""
    others = [axis for axis in a.swept if axis != "arm"]
    return [*KEY_PARITY[:2], *others, *KEY_PARITY[2:]]


def held_out_html(a: GridAnalysis) -> str:
    """The held-out evaluation: its curves, every run's loss before and after training, and each arm's run
    against its baseline run."""
    table, steps, swept = a.table, a.steps, a.swept
    errors = table[table.get("eval_error", pd.Series("", index=table.index)).fillna("").astype(str) != ""]
    warning = ""
    if not errors.empty:
        items = "".join(
            f"<li>{html.escape(row.condition_id)} (run {row.run_number}): {html.escape(row.eval_error)}</li>"
            for row in errors.itertuples(index=False)
        )
        warning = f'<div class="warning"><b>Evaluations that stopped early.</b><ul>{items}</ul></div>'
    if "final_eval_loss" not in table or table["final_eval_loss"].isna().all():
        return f"<h3>Held-out loss</h3>{warning}" if warning else ""
    parts = [
        warning,
        "<h3>Held-out loss</h3><p>Mean cross entropy per completion token of the held-out examples (never trained "
        "on, the same ones in every run), through the model's own logits: the same computation in every arm. "
        "Perplexity is its exp.</p>",
    ]
    curves = loss_curves_figure(steps, swept, column="eval_loss", title="Held-out loss (one line per run)")
    if curves is not None and steps["eval_loss"].notna().groupby(steps["condition_id"]).sum().max() > 1:
        parts.append(figure_html(curves, "held-out loss curves"))
    keys = [*swept, "run_number"] if swept else ["condition_id", "run_number"]
    columns = [*keys, "status", "initial_eval_loss", "final_eval_loss", "final_eval_perplexity", "eval_time_s"]
    parts.append(table_html(table[table["final_eval_loss"].notna()][columns].round(4)))
    if not a.held_out.empty:
        parts.append(
            "<p>Each arm's run against the baseline run with the same other settings and run number, after the "
            "last step.</p>" + table_html(_verdict_first(a.held_out).round(4))
        )
    return "".join(parts)


def _verdict_first(table: pd.DataFrame) -> pd.DataFrame:
    return table[["verdict", *(c for c in table.columns if c != "verdict")]] if "verdict" in table else table
