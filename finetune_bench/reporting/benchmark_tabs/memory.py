"""The Memory tab: peak allocated and reserved memory per condition against the GPU's capacity, which phase of a
step sets the peak, and the memory model's prediction against what was measured."""

import html

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.reporting.benchmark_tabs.cells import percent_text
from finetune_bench.reporting.benchmark_tabs.figures import bar_panel
from finetune_bench.reporting.html import figure_html, table_html
from finetune_bench.results.record import PREDICTED_OOM


def memory_tab(a: GridAnalysis) -> str:
    table, swept = a.table, a.swept
    parts = []
    if table["peak_reserved_gib"].notna().any():
        for metric, label in (("peak_allocated_gib", "peak allocated"), ("peak_reserved_gib", "peak reserved")):
            fig = bar_panel(table, metric, swept, f"{label.capitalize()} memory", a.capacity_gib)
            parts.append(figure_html(fig, f"{label} memory by batch size"))
        note = "PyTorch's allocator peaks (allocated: tensors; reserved: what the allocator holds from the GPU)."
    else:
        fig = bar_panel(table, "process_peak_rss_gib", swept, "Peak memory (host)")
        parts.append(figure_html(fig, "peak memory by batch size"))
        note = "No GPU: the process's peak resident memory on the host."
    capacity = " The dashed line is the GPU's capacity;" if a.capacity_gib else ""
    intro = f"<p>{note}{capacity} OOM marks a condition that ran out.</p>"
    return intro + "\n".join(parts) + phase_peaks_html(a) + prediction_html(a)


def phase_peaks_html(a: GridAnalysis) -> str:
    """Which phase sets each condition's peak allocated memory ("" where no run recorded the phases: a CPU)."""
    if a.phase_peaks.empty:
        return ""
    return (
        "<h3>Which phase sets the peak</h3><p>Per condition, the peak memory held by tensors during each phase of a "
        "step (median over ok runs, GiB; on several GPUs the largest rank's): the forward pass (with the loss where "
        "the model computes it in its forward, as its own loss and Liger's fused one do), the loss where it is "
        "computed apart, the backward pass, the optimizer step, and the held-out evaluations. The phase that sets the "
        "peak is the one an arm must make leaner to lower it: a saving in another phase does not show in the peak."
        "</p>" + "".join(f"<p><b>{html.escape(line)}</b></p>" for line in a.hidden_savings) + table_html(a.phase_peaks)
    )


def prediction_html(a: GridAnalysis) -> str:
    """The memory model's prediction against the measured peak of every ok run, and what it skipped."""
    parts = []
    skipped = a.table[a.table["status"] == PREDICTED_OOM]
    if not skipped.empty:
        parts.append(
            f"<p>{len(skipped)} run(s) were not launched: the memory model predicts they run out of memory "
            "(<code>skip_predicted_oom</code>). Their reasons are under Conditions.</p>"
        )
    errors = a.memory_prediction
    if errors.empty:
        return "<h3>Predicted memory</h3>" + "".join(parts) if parts else ""
    worst = errors["error"].abs().max()
    parts.append(
        f"<p>The memory model (predicted before the runs, from the model's config and the settings) against the "
        f"measured peak reserved memory: median error {percent_text(errors['error'].abs().median())}, "
        f"largest {percent_text(worst)}, over {len(errors)} ok run(s). Positive: predicted above measured.</p>"
    )
    shown = errors.rename(
        columns={"predicted_peak_reserved_gib": "predicted GiB", "peak_reserved_gib": "measured GiB"}
    ).assign(error=lambda t: t["error"].map(lambda e: percent_text(e, sign="+")))
    parts.append(table_html(shown.round(2)))
    parts.append(_phase_prediction_html(a.phase_prediction))
    return "<h3>Predicted memory</h3>" + "".join(parts)


def _phase_prediction_html(phases: pd.DataFrame) -> str:
    """Each moment the memory model counts against the measured peak of the phases it is, and whether the model put
    the peak where the run had it."""
    if phases.empty:
        return ""
    by_moment = phases.groupby("moment")["error"].median()
    medians = ", ".join(
        f"{moment.replace('_', ' ')} {percent_text(error, sign='+')}" for moment, error in by_moment.items()
    )
    text = (
        "<p>By phase, allocated memory (no allocator overhead): the memory model counts two moments of a step, the "
        "backward pass's start (checked against the largest of the forward pass, the loss and the backward pass) and "
        f"the optimizer step (against its own phase). Median error: {html.escape(medians)}.</p>"
    )
    misplaced = _peak_moment_mismatches(phases)
    if misplaced:
        text += f"<p><b>{html.escape(misplaced)}</b></p>"
    shown = phases.rename(
        columns={"predicted_allocated_gib": "predicted GiB", "measured_allocated_gib": "measured GiB"}
    ).assign(error=lambda t: t["error"].map(lambda e: percent_text(e, sign="+")))
    return text + table_html(shown.round(2))


def _peak_moment_mismatches(phases: pd.DataFrame) -> str:
    """A sentence naming the runs whose peak the model puts at another moment than the one measured ("" if none)."""
    wrong = []
    for (condition, run), rows in phases.groupby(["condition_id", "run_number"], sort=False):
        if len(rows) < 2:
            continue
        predicted = rows.loc[rows["predicted_allocated_gib"].idxmax(), "moment"]
        measured = rows.loc[rows["measured_allocated_gib"].idxmax(), "moment"]
        if predicted != measured:
            wrong.append(f"{condition} run {run} (predicted at the {predicted.replace('_', ' ')}, measured at the "
                         f"{measured.replace('_', ' ')})")  # fmt: skip
    if not wrong:
        return ""
    return f"The memory model puts the peak at another moment than measured for {len(wrong)} run(s): " + "; ".join(
        wrong
    )
