"""A grid's predictions as a table, as text (the dry run's printout) and as an HTML page (its report)."""

import html

import pandas as pd

from finetune_bench.analysis.numbers import number_text
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT
from finetune_bench.prediction.gpus import GIB, caps_text, usable_bytes
from finetune_bench.prediction.grid import RUN_OVERHEAD_S, VERDICT_MEANINGS, GridEstimate
from finetune_bench.prediction.memory import PARTS
from finetune_bench.reporting.benchmark_tabs.measured import measured_html, settings_text, span_text
from finetune_bench.reporting.html import Report, compact_table_html

# What the plan's table shows before its toggle.
PLAN_KEY_COLUMNS = ("condition_id", "verdict", "predicted_peak_reserved_gib", "peak_at", "predicted_step_time_s",
                    "predicted_tokens_per_second", "verdict_reason", "not_predicted")  # fmt: skip


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
        row["verdict_reason"] = c.verdict_reason
        row["predicted_step_time_s"] = c.step_time_s
        row["predicted_tokens_per_second"] = c.tokens_per_second
        rows.append(row)
    return pd.DataFrame(rows)


def shared_reasons(estimate: GridEstimate) -> dict[str, str]:
    """Verdict → the reason every condition with it has, where they all have the same one (said once, in the
    conditions line, instead of on each condition's)."""
    reasons: dict[str, set[str]] = {}
    for c in estimate.conditions:
        reasons.setdefault(c.verdict, set()).add(c.verdict_reason)
    return {verdict: next(iter(r)) for verdict, r in reasons.items() if len(r) == 1 and "" not in r}


# What a plan of runs on a CPU says, once, in place of a figure per condition.
CPU_PLAN = (
    "device 'cpu': memory and GPU time are not predicted on a CPU (the memory model is a GPU's; a CPU run checks "
    "that the workflow works, its timings say nothing of a GPU)"
)


def on_cpu(estimate: GridEstimate) -> bool:
    """Whether every condition of the plan trains on a CPU (nothing of a GPU to predict)."""
    return bool(estimate.conditions) and all(c.training_args.device == "cpu" for c in estimate.conditions)


def plan_totals(estimate: GridEstimate) -> list[str]:
    """The plan's totals: the target GPU, the conditions by verdict and the runs, what is not launched, the GPU time
    (and its cost) and the estimate's notes; on a CPU, the conditions and runs and that nothing is predicted. The plan
    report's headline: a dry run's console ends with them."""
    e = estimate
    if on_cpu(e):
        return [f"conditions: {len(e.conditions)}; runs: {e.runs} ({e.n_runs} per condition)", CPU_PLAN]
    counts = pd.Series([c.verdict for c in e.conditions]).value_counts().to_dict()
    why = "".join(f"; {verdict}: {reason}" for verdict, reason in shared_reasons(e).items())
    lines = [
        f"target GPU: {e.target.describe()}"
        + (f", {usable_bytes(e.target.memory_bytes) / GIB:.1f} GiB usable by torch" if e.target.memory_bytes else "")
        + caps_text(c.training_args.gpu_memory_cap_gib for c in e.conditions),
        f"conditions: {len(e.conditions)} ({', '.join(f'{n} {v}' for v, n in counts.items())}); runs: {e.runs} "
        f"({e.n_runs} per condition){why}",
    ]
    if e.skipped_runs:
        lines.append(f"not launched (skip_predicted_oom): {e.skipped_runs} run(s) predicted out of memory")
    if e.gpu_hours is not None:
        cost = f", {e.cost:,.2f} at {e.hour_price:g} per GPU-hour" if e.cost is not None else ""
        lines.append(f"GPU time: {e.gpu_hours:.2f} GPU-hours{cost} ({RUN_OVERHEAD_S:.0f} s start-up per run included)")
    lines.extend(e.notes)
    return lines


def plan_text(estimate: GridEstimate, with_totals: bool = True) -> str:
    """The plan as planning prints it: a line per condition, then the totals (`plan_totals`; without them,
    `with_totals` False, where the plan report's headline says them). A verdict the figure alone does not explain
    (`unknown`, `oom at max length`) says why on its line, or once in the conditions line when every condition with
    that verdict has the same reason."""
    if on_cpu(estimate):  # nothing predicted: the conditions, and the totals' one line that says why
        ids = [c.condition_id for c in estimate.conditions]
        return "\n".join(ids + ([""] + plan_totals(estimate) if with_totals else [CPU_PLAN]))
    shared = shared_reasons(estimate)
    lines = []
    for c in estimate.conditions:
        why = f": {c.verdict_reason}" if c.verdict_reason and shared.get(c.verdict) != c.verdict_reason else ""
        if c.memory is None:
            memory = f"memory not predicted{why}"
        else:
            parts = ", ".join(
                f"{part.replace('_', ' ')} {value / GIB:.1f}"
                for part, value in c.memory.breakdown.items()
                if value >= 0.05 * GIB
            )
            memory = f"{gib_text(c.memory.peak_reserved_bytes)} GiB {c.verdict:<10}" + (f" ({parts})" if parts else "")
            memory = memory.rstrip() + why
        speed = f" | {c.step_time_s:.2f} s/step, {c.tokens_per_second:,.0f} tok/s" if c.step_time_s is not None else ""
        if speed and c.training_args.arm not in (BASELINE, BASELINE_REPEAT):
            # the speed is the model's FLOPs at an assumed MFU: an arm's kernels change neither
            speed += f" as the baseline's ({c.training_args.arm}'s own speed-up is not modelled: the runs measure it)"
        lines.append(f"{c.condition_id}: {memory}{speed}")
    used = [verdict for verdict in VERDICT_MEANINGS if any(c.verdict == verdict for c in estimate.conditions)]
    if used:
        lines.append("(" + "; ".join(f"{verdict}: {VERDICT_MEANINGS[verdict]}" for verdict in used) + ")")
    return "\n".join(lines + ([""] + plan_totals(estimate) if with_totals else []))


def gib_text(size_bytes: float) -> str:
    """A predicted size in GiB, right-aligned to 6 characters: one decimal, two significant digits below 1 GiB (a
    tiny model's 0.0022, not 0.0)."""
    return f"{number_text(size_bytes / GIB, min_decimals=1):>6}"


def what_would_be_measured(estimate: GridEstimate, inputs_file: str = "") -> dict[str, str]:
    """The plan's header, as the benchmark's "What was measured" reads: the GPU the plan predicts for, on several
    GPUs how many a run trains on and the parallelism, the model, the dataset, the settings every condition shares or
    sweeps, the steps and the inputs file (nothing ran: no date, no versions)."""
    settings = [c.training_args for c in estimate.conditions]
    target = estimate.target
    steps = settings_text(settings, "max_steps")
    runs = f", {estimate.n_runs} run{'' if estimate.n_runs == 1 else 's'} per condition" if estimate.n_runs > 0 else ""
    several = any(getattr(each, "world_size", 1) > 1 for each in settings)
    gpus = span_text(pd.Series([each.world_size for each in settings])) if several else ""
    nodes = settings_text(settings, "num_nodes") if any(each.num_nodes > 1 for each in settings) else ""
    return {
        "hardware": f"{target.describe()}, predicted (nothing ran)" if target.name or target.memory_bytes else "",
        "GPUs per run": gpus + (f" (nodes: {nodes})" if gpus and nodes else ""),
        "parallelism": settings_text(settings, "parallelism") if several else "",
        "model": settings_text(settings, "model_name"),
        "dataset": settings_text(settings, "dataset_name"),
        "backend": settings_text(settings, "backend"),
        "dtype": settings_text(settings, "dtype"),
        "sequence length": settings_text(settings, "max_seq_length"),
        "batch size per device": settings_text(settings, "per_device_train_batch_size"),
        "steps": f"{steps} per run{runs}" if steps else "",
        "inputs file": inputs_file,
    }


def plan_report(estimate: GridEstimate, inputs_file: str = "") -> Report:
    """The dry run's report: what would run, what fits, how long, what it costs; `inputs_file`: the file a local run
    was given (its header names it)."""
    table = plan_table(estimate)
    totals = plan_totals(estimate)
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in totals)
    note = (
        "<p>A dry run: nothing was downloaded or trained. Peak memory is predicted per GPU from the model's config "
        "and the settings (docs/prediction.md): "
        + "; ".join(f"<b>{html.escape(word)}</b>: {html.escape(meaning)}" for word, meaning in VERDICT_MEANINGS.items())
        + " (verdict_reason says why). Step time is model FLOPs at the MFU assumed for the GPU kind.</p>"
    )
    return Report(
        sections={
            "Plan": measured_html(what_would_be_measured(estimate, inputs_file), "What would be measured")
            + f"<ul>{summary}</ul>{note}"
            # the predicted peak's parts behind the toggle
            + compact_table_html(table.round(3), PLAN_KEY_COLUMNS, "the plan")
        },
        headline=totals,
    )
