"""A grid's predictions as a table, as text (the dry run's printout) and as an HTML page (its report)."""

import html

import pandas as pd

from finetune_bench.prediction.gpus import GIB, usable_bytes
from finetune_bench.prediction.grid import RUN_OVERHEAD_S, GridEstimate
from finetune_bench.prediction.memory import PARTS
from finetune_bench.reporting.html import Report, table_html


def plan_table(estimate: GridEstimate) -> pd.DataFrame:
    """One row per condition: the predicted peak (GiB) and its parts, the verdict, step time and tokens/s."""
    rows = []
    for c in estimate.conditions:
        row: dict = {"condition_id": c.condition_id, "verdict": c.verdict}
        if c.memory is not None:
            row["predicted_peak_reserved_gib"] = c.memory.peak_reserved_bytes / GIB
            row["peak_at"] = c.memory.phase
            row.update({f"{part}_gib": c.memory.breakdown[part] / GIB for part in PARTS})
        else:
            row["predicted_peak_reserved_gib"] = float("nan")
            row["not_predicted"] = c.unpredicted
        row["predicted_step_time_s"] = c.step_time_s
        row["predicted_tokens_per_second"] = c.tokens_per_second
        rows.append(row)
    return pd.DataFrame(rows)


def _totals(estimate: GridEstimate) -> list[str]:
    e = estimate
    counts = pd.Series([c.verdict for c in e.conditions]).value_counts().to_dict()
    lines = [
        f"target GPU: {e.target.describe()}"
        + (f", {usable_bytes(e.target.memory_bytes) / GIB:.1f} GiB usable by torch" if e.target.memory_bytes else ""),
        f"conditions: {len(e.conditions)} ({', '.join(f'{n} {v}' for v, n in counts.items())}); runs: {e.runs} "
        f"({e.n_runs} per condition)",
    ]
    if e.skipped_runs:
        lines.append(f"not launched (skip_predicted_oom): {e.skipped_runs} run(s) predicted out of memory")
    if e.gpu_hours is not None:
        cost = f", {e.cost:,.2f} at {e.hour_price:g} per GPU-hour" if e.cost is not None else ""
        lines.append(f"GPU time: {e.gpu_hours:.2f} GPU-hours{cost} ({RUN_OVERHEAD_S:.0f} s start-up per run included)")
    lines.extend(e.notes)
    return lines


def plan_text(estimate: GridEstimate) -> str:
    """The dry run's printout: a line per condition, then the totals."""
    lines = []
    for c in estimate.conditions:
        if c.memory is None:
            memory = f"memory not predicted: {c.unpredicted}"
        else:
            parts = ", ".join(
                f"{part.replace('_', ' ')} {value / GIB:.1f}"
                for part, value in c.memory.breakdown.items()
                if value >= 0.05 * GIB
            )
            memory = f"{c.memory.peak_reserved_bytes / GIB:6.1f} GiB {c.verdict:<10} ({parts})"
        speed = f" | {c.step_time_s:.2f} s/step, {c.tokens_per_second:,.0f} tok/s" if c.step_time_s is not None else ""
        lines.append(f"{c.condition_id}: {memory}{speed}")
    return "\n".join(lines + [""] + _totals(estimate))


def plan_report(estimate: GridEstimate) -> Report:
    """The dry run's report: what would run, what fits, how long, what it costs."""
    table = plan_table(estimate)
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in _totals(estimate))
    note = (
        "<p>A dry run: nothing was downloaded or trained. Peak memory is predicted per GPU from the model's config "
        "and the settings (docs/prediction.md); <b>fits</b> and <b>oom</b> hold even if the prediction is 10 % off, "
        "<b>borderline</b> is within 10 % of the GPU's usable memory. Step time is model FLOPs at the MFU assumed "
        "for the GPU kind.</p>"
    )
    return Report(
        sections={"Plan": f"<ul>{summary}</ul>{note}" + table_html(table.round(3))}, headline=_totals(estimate)[1:2]
    )
