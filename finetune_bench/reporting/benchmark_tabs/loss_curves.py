"""The Loss curves tab: every run's loss per step with the loss-parity table, then the held-out loss (its curves,
every run's loss before and after training, each arm's run against its baseline run)."""

import html

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.reporting.benchmark_tabs.figures import loss_curves_figure
from finetune_bench.reporting.html import figure_html, table_html


def loss_curves_tab(a: GridAnalysis) -> str:
    curves = loss_curves_figure(a.steps, a.swept)
    content = figure_html(curves, "loss curves") if curves is not None else "<p>No run recorded a loss.</p>"
    if not a.parity.empty:
        content += (
            "<h3>Loss parity</h3><p>Each arm's run against the baseline run with the same other settings and run "
            "number (same seed, same data order), step by step.</p>" + table_html(a.parity)
        )
    return content + held_out_html(a)


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
            "last step.</p>" + table_html(a.held_out.round(4))
        )
    return "".join(parts)
