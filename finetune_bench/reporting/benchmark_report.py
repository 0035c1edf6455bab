"""Figures (seaborn) and the self-contained HTML report; the Deck shows the same sections as tabs.

Summary (the answer: how much faster, how much leaner, how sure, what fits, is it still correct, what to
run), then the evidence: throughput, memory, speedup and MFU, loss curves, step times, every condition
with its status and error, and every run.
"""

import html
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter  # noqa: E402

from finetune_bench.analysis.grid import GridAnalysis  # noqa: E402
from finetune_bench.analysis.stacks import MEMORY_TIE  # noqa: E402
from finetune_bench.analysis.stats import CONFIDENCE_LEVEL, MIN_PAIRS_FOR_CI  # noqa: E402
from finetune_bench.analysis.tables import COST_COLUMN, METRIC_BY_COLUMN, profile_categories, ran_on_cpu  # noqa: E402
from finetune_bench.analysis.timeline import IN_WALL_COLUMNS, OTHER_COLUMN  # noqa: E402
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT  # noqa: E402
from finetune_bench.measuring.environment import RECORDED_PACKAGES
from finetune_bench.reporting.html import Report, arm_order, arm_palette, figure_html, short_number, table_html  # noqa: E402
from finetune_bench.results.record import ERROR, LOST, NONFINITE, OK, OOM, PREDICTED_OOM, TIMEOUT

BATCH = "per_device_train_batch_size"
SEQ = "max_seq_length"
FAILED_STATUSES_MARK = {
    PREDICTED_OOM: "P-OOM",
    OOM: "OOM",
    ERROR: "ERR",
    TIMEOUT: "T/O",
    NONFINITE: "NaN",
    LOST: "LOST",
}

CPU_WARNING = (
    "These runs happened on a CPU. Their timings say nothing about Liger's speed: on a CPU the "
    "liger arm runs its Triton kernels in the Triton interpreter, about 100x slower than eager "
    "PyTorch. Use a CPU run only to check that the workflow works; measure on a GPU."
)

ENVIRONMENT_KEYS = (
    "gpu_name",
    "gpu_count",
    "gpu_memory_gib",
    "driver",
    "cuda",
    "cpu",
    "hostname",
    *RECORDED_PACKAGES,
    "python",
    "lock_sha256",
)


def _with_arm(table: pd.DataFrame) -> pd.DataFrame:
    return table if "arm" in table else table.assign(arm="(one arm)")


def _x_axis(swept: list[str]) -> str:
    if BATCH in swept:
        return BATCH
    others = [axis for axis in swept if axis != "arm"]
    return others[0] if others else "condition_id"


def _panels(data: pd.DataFrame, facets: list[str]) -> pd.Series:
    """A label per row naming its values of the facet axes (one panel per label)."""
    if not facets:
        return pd.Series("", index=data.index)
    labels = data[facets].apply(lambda column: column.name + "=" + column.astype(str))
    return labels.agg(", ".join, axis=1)


def axis_label(column: str) -> str:
    """A results column as a figure's axis: what the metric measures and its unit (`measuring.metrics`)."""
    metric = METRIC_BY_COLUMN[column]
    return f"{metric.description} ({metric.column_unit})"


def _bar_panel(
    table: pd.DataFrame,
    metric: str,
    swept: list[str],
    title: str,
    capacity_gib: float | None = None,
    ylabel: str | None = None,
) -> plt.Figure:
    """Median of `metric` (a results column) over ok runs per condition (bars, min–max over repeats as error
    bars), one panel per value of the axes other than the arm and x; failed conditions marked, never dropped; a
    dashed line at the GPU's capacity when given. The y axis names the metric (`axis_label`) unless `ylabel`
    does (a column the analysis adds)."""
    ylabel = ylabel or axis_label(metric)
    x = _x_axis(swept)
    facets = [axis for axis in swept if axis not in ("arm", x)]
    data = _with_arm(table).copy()
    data["panel"] = _panels(data, facets)
    panels = list(dict.fromkeys(data["panel"]))
    order = sorted(data[x].unique())
    palette = arm_palette(data["arm"])
    hue_order = list(palette)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6, 5.5 * len(panels)), 4.2), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels, strict=True):
        subset = data[data["panel"] == panel]
        ok = subset[(subset["status"] == OK) & subset[metric].notna()]
        if not ok.empty:
            sns.barplot(
                data=ok, x=x, y=metric, hue="arm", order=order, hue_order=hue_order, palette=palette,
                estimator="median", errorbar=("pi", 100), capsize=0.1, dodge=True, ax=ax,
            )  # fmt: skip
        _mark_failures(ax, subset, x, order, hue_order)
        if capacity_gib:
            ax.axhline(capacity_gib, color="#C00000", linestyle="--", linewidth=1)
            ax.text(0.01, capacity_gib, f" GPU capacity {capacity_gib:.0f} GiB", color="#C00000", va="bottom",
                    fontsize=8, transform=ax.get_yaxis_transform())  # fmt: skip
        ax.set_xlim(-0.5, len(order) - 0.5)
        ax.set_xticks(range(len(order)), [str(v) for v in order])
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.set_title(panel)
        ax.set_ylim(bottom=0)
        for container in ax.containers:
            if hasattr(container, "datavalues"):
                ax.bar_label(container, fmt=short_number, fontsize=8, padding=2)
        ax.get_legend() and ax.get_legend().remove()
    handles = [plt.Rectangle((0, 0), 1, 1, color=palette[arm]) for arm in hue_order]
    fig.legend(handles, hue_order, title="arm", loc="upper left", bbox_to_anchor=(1.0, 0.9))
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _mark_failures(ax: plt.Axes, subset: pd.DataFrame, x: str, order: list, hue_order: list[str]) -> None:
    """Write OOM / ERR / T/O / NaN / LOST where a condition has no ok run, at its bar's position."""
    width = 0.8 / max(len(hue_order), 1)
    for (x_value, arm), cell in subset.groupby([x, "arm"]):
        if (cell["status"] == OK).any():
            continue
        worst = cell["status"].mode().iloc[0]
        position = order.index(x_value) - 0.4 + width * (hue_order.index(arm) + 0.5)
        ax.text(
            position, 0.02, FAILED_STATUSES_MARK.get(worst, worst.upper()), transform=ax.get_xaxis_transform(),
            ha="center", va="bottom", rotation=90, color="#C00000", fontweight="bold",
        )  # fmt: skip


def _speedup_figure(comparison: pd.DataFrame, summary: pd.DataFrame, swept: list[str]) -> plt.Figure | None:
    """Per arm, a heatmap of its median throughput over the baseline's across batch size × sequence length
    (the axes that are swept), with cells where only one side fits written out."""
    if comparison.empty or BATCH not in swept or comparison["throughput_ratio"].isna().all():
        return None
    rows = SEQ if SEQ in swept else None
    facets = [axis for axis in swept if axis not in ("arm", BATCH, SEQ)]
    fits = summary.assign(fits=summary["ok_runs"] > 0)
    base_fits = fits[fits["arm"] == BASELINE].set_index([a for a in swept if a != "arm"])["fits"]
    panels = comparison.assign(panel=_panels(comparison, facets))
    groups = list(panels.groupby(["arm", "panel"], sort=False))
    fig, axes = plt.subplots(1, len(groups), figsize=(max(5, 4.8 * len(groups)), 3.6), squeeze=False)
    for ax, ((arm, panel), group) in zip(axes[0], groups, strict=True):
        index = group[rows] if rows else pd.Series([""] * len(group), index=group.index, name="")
        ratio = group.assign(_row=index.to_numpy()).pivot_table(
            index="_row", columns=BATCH, values="throughput_ratio", aggfunc="first", dropna=False
        )
        labels = ratio.map(lambda v: f"×{v:.2f}" if pd.notna(v) else "")
        arm_fits = fits[fits["arm"] == arm].set_index([a for a in swept if a != "arm"])["fits"]
        for key, arm_ok in arm_fits.items():
            key = key if isinstance(key, tuple) else (key,)
            point = dict(zip([a for a in swept if a != "arm"], key, strict=True))
            if any(point.get(f) != group[f].iloc[0] for f in facets):
                continue
            row, column = (point[rows] if rows else ""), point[BATCH]
            base_ok = bool(base_fits.get(key if len(key) > 1 else key[0], False))
            if arm_ok and not base_ok:
                labels.loc[row, column] = "only\nthis arm\nfits"
            elif base_ok and not arm_ok:
                labels.loc[row, column] = "arm\nfails"
        sns.heatmap(
            ratio.astype(float), annot=labels.reindex_like(ratio).fillna(""), fmt="", cmap="vlag_r", center=1.0,
            cbar_kws={"label": "throughput ratio (arm / baseline)"}, linewidths=0.5, ax=ax,
        )  # fmt: skip
        ax.set_xlabel(BATCH)
        ax.set_ylabel(rows or "")
        ax.set_title(f"{arm} vs baseline" + (f"\n{panel}" if panel else ""))
    fig.tight_layout()
    return fig


def _loss_curves_figure(
    steps: pd.DataFrame,
    swept: list[str],
    max_panels: int = 12,
    column: str = "loss",
    title: str = "Training loss per step (one line per run)",
) -> plt.Figure | None:
    """`column` (the training loss, or the held-out loss) per step, one panel per condition of the other axes,
    every run of every arm overlaid."""
    if steps is None or steps.empty or column not in steps or steps[column].isna().all():
        return None
    facets = [axis for axis in swept if axis != "arm"]
    data = _with_arm(steps[steps[column].notna()]).copy()
    data["panel"] = _panels(data, facets)
    panels = list(dict.fromkeys(data["panel"]))[:max_panels]
    data = data[data["panel"].isin(panels)]
    palette = arm_palette(data["arm"])
    columns = min(len(panels), 3)
    # Dashed baseline under solid arms: curves that match exactly stay visible.
    dashes = {arm: (4, 2) if arm in (BASELINE, BASELINE_REPEAT) else "" for arm in palette}
    grid = sns.relplot(
        data=data, x="step", y=column, hue="arm", hue_order=list(palette), palette=palette, units="run_number",
        style="arm", style_order=list(palette), dashes=dashes, estimator=None, kind="line", col="panel",
        col_wrap=columns if len(panels) > 1 else None, height=3.2, aspect=1.4, alpha=0.8, facet_kws={"sharey": False},
    )  # fmt: skip
    grid.set_titles("{col_name}")
    grid.figure.suptitle(title, y=1.02)
    return grid.figure


def _step_time_figure(steps: pd.DataFrame, swept: list[str]) -> plt.Figure | None:
    """Every step's duration per condition: the measured steps as a box, warm-up steps as red crosses."""
    if steps is None or steps.empty or "step_time_s" not in steps:
        return None
    data = _with_arm(steps).copy()
    data["condition"] = data["condition_id"]
    # Arms in report order, then the other axes by value (batch 4 before 16), not alphabetically.
    rank = {arm: i for i, arm in enumerate(arm_order(data["arm"]))}
    keys = [axis for axis in swept if axis != "arm" and axis in data]
    ordered = data.assign(_arm=data["arm"].map(rank)).sort_values(["_arm", *keys])
    order = list(dict.fromkeys(ordered["condition"]))
    warmup = data["is_warmup"].astype(str).str.lower().isin(["true", "1"])
    palette = arm_palette(data["arm"])
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.38 * len(order) + 1)))
    measured = data[~warmup]
    if not measured.empty:
        sns.boxplot(
            data=measured, y="condition", x="step_time_s", hue="arm", order=order, hue_order=list(palette),
            palette=palette, orient="h", fliersize=2, ax=ax, legend=True, dodge=False,
        )  # fmt: skip
    if warmup.any():
        ax.scatter(data.loc[warmup, "step_time_s"], data.loc[warmup, "condition"].map(order.index), marker="x",
                   color="#C00000", label="warm-up step", zorder=3)  # fmt: skip
    if "new_shape" in data:
        new = ~warmup & data["new_shape"].astype(str).str.lower().isin(["true", "1"])
        if new.any():
            ax.scatter(data.loc[new, "step_time_s"], data.loc[new, "condition"].map(order.index), marker="^",
                       facecolors="none", edgecolors="#333333", label="new batch shape", zorder=4)  # fmt: skip
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("step time (s, log scale)")
    ax.set_ylabel("")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("Step times per condition (warm-up steps excluded from the boxes)")
    fig.tight_layout()
    return fig


def _ratio_text(ratio: float, low: float, high: float) -> str:
    if pd.isna(ratio):
        return "–"
    interval = f" [{low:.2f}, {high:.2f}]" if pd.notna(low) and pd.notna(high) else ""
    return f"×{ratio:.2f}{interval}"


def _how_sure_table(paired: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """The paired statistics as a reader wants them: ratio [CI], p, significant, noise floor, note."""
    others = [axis for axis in swept if axis != "arm"]
    out = paired[["arm", *others, "pairs"]].copy()
    compared = (
        ("throughput", "throughput"),
        ("steady_throughput", "steady-state throughput"),
        ("peak_reserved", "peak reserved memory"),
        ("energy_per_token", "energy per token"),
    )
    for name, label in compared:
        if f"{name}_ratio" not in paired or paired[f"{name}_ratio"].isna().all():  # energy: not measured here
            continue
        out[f"{label} ×"] = [
            _ratio_text(r, lo, hi)
            for r, lo, hi in zip(
                paired[f"{name}_ratio"], paired[f"{name}_ci_low"], paired[f"{name}_ci_high"], strict=True
            )  # fmt: skip
        ]
        out[f"{label} p"] = paired[f"{name}_p_value"]
        if f"{name}_noise_floor" in paired:
            out[f"{label} noise floor"] = paired[f"{name}_noise_floor"].map(
                lambda v: f"±{v:.1%}" if pd.notna(v) else "–"
            )
    out["throughput significant"] = paired.get("throughput_significant")
    out["note"] = paired.get("note", "")
    return out


def _known(table: pd.DataFrame, column: str) -> bool:
    """Whether any row of `table` has a value in `column`."""
    return column in table and bool(table[column].notna().any())


def _cost_label(a: GridAnalysis) -> str:
    return f"cost per million tokens at {a.gpu_hour_price:g} per GPU-hour"


def _energy_and_cost_html(a: GridAnalysis) -> str:
    """Per condition, next to its throughput: the GPU energy per token and, with a price, the cost of a million
    tokens; why the energy is unknown where it is."""
    summary = a.summary
    has_energy = _known(summary, "energy_per_token_j")
    has_cost = a.gpu_hour_price > 0 and _known(summary, COST_COLUMN)
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


def _prediction_html(a: GridAnalysis) -> str:
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
        f"measured peak reserved memory: median error {errors['error'].abs().median():.1%}, largest "
        f"{worst:.1%}, over {len(errors)} ok run(s). Positive: predicted above measured.</p>"
    )
    shown = errors.rename(
        columns={"predicted_peak_reserved_gib": "predicted GiB", "peak_reserved_gib": "measured GiB"}
    ).assign(error=lambda t: t["error"].map(lambda e: f"{e:+.1%}"))
    parts.append(table_html(shown.round(2)))
    return "<h3>Predicted memory</h3>" + "".join(parts)


def _held_out_html(a: GridAnalysis) -> str:
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
    curves = _loss_curves_figure(steps, swept, column="eval_loss", title="Held-out loss (one line per run)")
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


TOP_KERNELS = 10


def _scaling_figure(scaling: pd.DataFrame, swept: list[str]) -> plt.Figure | None:
    """Tokens/s against the number of GPUs per arm (one line per other setting), with each line's ideal: its
    one-GPU throughput times the GPUs."""
    data = _with_arm(scaling).dropna(subset=["tokens_per_second"])
    if data.empty:
        return None
    # every other swept setting, the layout's parallelism and node count included, is a line of its own
    others = [a for a in swept if a not in ("arm", "num_gpus")]
    data = data.assign(setting=data[others].astype(str).agg(", ".join, axis=1) if others else "")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sns.lineplot(
        data=data,
        x="world_size",
        y="tokens_per_second",
        hue="arm",
        style="setting" if others else None,
        markers=True,
        ax=ax,
    )
    ideal = data.dropna(subset=["ideal_tokens_per_second"])
    for _, line in ideal.groupby(["arm", "setting"], sort=False):
        reference = line.iloc[0]["one_gpu_tokens_per_second"]
        gpus = sorted({1, *line["world_size"]})
        ax.plot(gpus, [reference * n for n in gpus], linestyle=":", color="grey", linewidth=1)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("non-padding tokens/s (all GPUs)")
    ax.set_xticks(sorted(data["world_size"].unique()))
    ax.set_title("Scaling (dotted: ideal, one GPU's tokens/s × GPUs)")
    fig.tight_layout()
    return fig


def _scaling_tab(a: GridAnalysis) -> str | None:
    """Runs on several GPUs: throughput against GPUs with the ideal line, each condition's scaling efficiency,
    and every rank's memory (no tab when every run had one GPU)."""
    if a.scaling.empty:
        return None
    scaling, ranks, swept = a.scaling, a.ranks, a.swept
    parts = [
        "<p>Runs on several GPUs: tokens/s of all GPUs together (their tokens over the slowest rank's measured "
        "time), per GPU, and the scaling efficiency, tokens/s over the GPUs × the same settings' tokens/s on one "
        "GPU (empty when the grid has no such one-GPU condition). Memory on several GPUs is the largest rank's, "
        "the spread its difference to the smallest.</p>"
    ]
    figure = _scaling_figure(scaling, swept)
    if figure is not None:
        parts.append(figure_html(figure, "tokens per second against GPUs"))
    parts.append(table_html(scaling))
    if not ranks.empty:
        parts.append("<h3>Every rank</h3>" + table_html(ranks))
    return "\n".join(parts)


def _profile_html(profile: pd.DataFrame, swept: list[str]) -> str:
    """Where the profiled steps' time went, per arm: time per category (and each arm's difference from the
    baseline), then the kernels that took the most."""
    categories = profile_categories(profile, swept)
    facets = [axis for axis in swept if axis != "arm" and axis in categories]
    data = _with_arm(categories).copy()
    data["panel"] = _panels(data, facets)
    parts = [
        "<p>After the timed steps, each profiled run took <code>profile_steps</code> more steps under "
        "torch.profiler (the timed steps are not affected). Time per step by category of GPU kernel (on a CPU, "
        "of operator, by self time), median over the condition's profiled runs. The categories come from the "
        "kernels' names: PyTorch's generic elementwise and reduction kernels (an unfused RMSNorm's multiplies and "
        "means, for instance) are <i>elementwise (unattributed)</i>. Each run's Chrome trace and CUDA memory "
        "snapshot are in the outputs, under <code>profiles/</code>.</p>"
    ]
    palette = arm_palette(data["arm"])
    grid = sns.catplot(
        data=data, x="time_ms_per_step", y="category", hue="arm", hue_order=list(palette), palette=palette,
        col="panel", col_wrap=min(data["panel"].nunique(), 2) if data["panel"].nunique() > 1 else None,
        kind="bar", height=3.6, aspect=1.5, orient="h", sharex=False,
    )  # fmt: skip
    grid.set_titles("{col_name}")
    grid.set_axis_labels("ms per step", "")
    grid.figure.suptitle("Profiled time per step by category", y=1.02)
    parts.append(figure_html(grid.figure, "profiled time by category"))
    for panel, rows in data.groupby("panel", sort=False):
        wide = rows.pivot_table(index="category", columns="arm", values="time_ms_per_step", aggfunc="sum")
        if BASELINE in wide:
            for arm in [a for a in wide.columns if a != BASELINE]:
                wide[f"{arm} − baseline"] = wide[arm] - wide[BASELINE]
        wide.loc["total"] = wide.sum()
        title = f"<h4>{html.escape(str(panel))}</h4>" if panel else ""
        parts.append(title + table_html(wide.round(3).reset_index()))
    keys = [axis for axis in swept if axis in profile] or ["condition_id"]
    top = (
        profile.groupby([*keys, "name", "category"], dropna=False)["time_ms_per_step"]
        .median()
        .reset_index()
        .sort_values("time_ms_per_step", ascending=False)
        .groupby(keys, dropna=False)
        .head(TOP_KERNELS)
    )
    parts.append(f"<h3>Top kernels</h3><p>The {TOP_KERNELS} that took the most time per step, per condition.</p>")
    parts.append(table_html(top.round(4)))
    return "".join(parts)


def _summary_tab(a: GridAnalysis, experiment_name: str, notes: list[str]) -> str:
    """The answer first: what was not kept, the runs' statuses, one verdict per arm, how sure, what fits, what
    to run, whether the loss still matches, and the environment."""
    table = a.table
    overview = []
    if ran_on_cpu(table):
        overview.append(f'<div class="warning"><b>CPU run.</b> {html.escape(CPU_WARNING)}</div>')
    if a.problems:
        items = "".join(f"<li>{html.escape(problem)}</li>" for problem in a.problems)
        overview.append(
            '<div class="warning"><b>Not everything was kept.</b> These runs were measured and are in this '
            f"report, but what follows went wrong around them (the workflow ends with a failing status):<ul>{items}"
            "</ul></div>"
        )
    if a.reuse_note:
        overview.append(f'<div class="warning"><b>Reused runs.</b> {html.escape(a.reuse_note)}</div>')
    for note in notes:
        overview.append(f'<div class="warning"><b>Note.</b> {html.escape(note)}</div>')
    counts = table["status"].value_counts()
    overview.append(
        "<p>"
        + html.escape(f"{len(table)} runs of {table['condition_id'].nunique()} conditions: ")
        + html.escape(", ".join(f"{n} {status}" for status, n in counts.items()))
        + "</p>"
    )
    if a.not_launched:
        items = "".join(f"<li>{html.escape(reason)}</li>" for reason in a.not_launched)
        overview.append(f"<p>Not launched (every other run was):</p><ul>{items}</ul>")
    if experiment_name:
        overview.append(f"<p>Experiment: {html.escape(experiment_name)}</p>")
    overview.extend(f'<p class="verdict">{html.escape(line)}</p>' for line in a.verdicts)
    overview.extend(f'<div class="warning"><b>Batch shapes.</b> {html.escape(line)}</div>' for line in a.shape_notes)
    overview.extend(
        f'<p class="verdict">{html.escape(line)} (Memory: which phase sets the peak)</p>' for line in a.hidden_savings
    )
    if not a.skewed_runs.empty:
        overview.append(
            f'<div class="warning"><b>Slow steps.</b> {len(a.skewed_runs)} run(s) whose throughput over all timed '
            "steps differs from their steady state by more than the noise floor: see Step times.</div>"
        )
    if not a.paired.empty:
        overview.append(
            f"<h3>How much faster, how much leaner, how sure</h3><p>Per arm against the baseline: the median "
            f"ratio of runs paired by run number (× &gt; 1: faster, or more memory), its {CONFIDENCE_LEVEL:.0%} "
            f"bootstrap interval in brackets (from {MIN_PAIRS_FOR_CI} pairs), and a paired t-test on the "
            f"logarithms at alpha {a.alpha:g}. A <code>baseline_repeat</code> arm (A/A) gives the noise floor: "
            "a difference inside it is not distinguishable from run-to-run noise.</p>"
        )
        overview.append(table_html(_how_sure_table(a.paired, a.swept)))
    overview.append(_energy_and_cost_html(a))
    if not a.fitting.empty:
        overview.append(
            "<h3>What fits</h3><p>The largest batch size with an ok run, and the smallest that ran out of memory, "
            "per arm.</p>" + table_html(a.fitting)
        )
    if not a.recommended.empty:
        overview.append(
            "<h3>Recommendation</h3><p>Per arm, the fastest configuration whose runs all finished (none ran out "
            "of memory), and the GPU memory it leaves free (capacity minus peak reserved).</p>"
            + table_html(a.recommended)
        )
    overview.extend(f"<p><b>{html.escape(line)}</b></p>" for line in (a.parity_verdict, a.held_out_verdict) if line)
    env_items = {k: a.environment[k] for k in ENVIRONMENT_KEYS if k in a.environment}
    if a.capacity_gib:
        env_items["gpu_memory_gib"] = f"{a.capacity_gib:.1f}"
    if env_items:
        overview.append("<h3>Environment</h3>" + table_html(pd.DataFrame([env_items])))
    return "\n".join(overview)


def _throughput_tab(a: GridAnalysis) -> str:
    """Throughput per condition; beside it the GPU energy per token where it was measured, and the cost per million
    tokens where a price was given."""
    parts = [
        "<p>Non-padding tokens per second over the measured steps (warm-up excluded). Bars: median over repeats; "
        "error bars: min–max. OOM / ERR / T/O / NaN / LOST mark conditions with no ok run.</p>",
        figure_html(_bar_panel(a.table, "tokens_per_second", a.swept, "Throughput"), "throughput by batch size"),
    ]
    if _known(a.table, "energy_per_token_j"):
        figure = _bar_panel(a.table, "energy_per_token_j", a.swept, "Energy per token")
        parts.append(figure_html(figure, "GPU energy per token by batch size"))
    else:
        parts.append("<p>Energy per token: not measured (no GPU, or no NVML energy counter; see the Summary).</p>")
    if a.gpu_hour_price > 0 and _known(a.table, COST_COLUMN):
        label = _cost_label(a)
        figure = _bar_panel(a.table, COST_COLUMN, a.swept, "Cost per million tokens", ylabel=label)
        parts.append(figure_html(figure, label))
    return "\n".join(parts)


def _memory_tab(a: GridAnalysis) -> str:
    table, swept = a.table, a.swept
    parts = []
    if table["peak_reserved_gib"].notna().any():
        for metric, label in (("peak_allocated_gib", "peak allocated"), ("peak_reserved_gib", "peak reserved")):
            fig = _bar_panel(table, metric, swept, f"{label.capitalize()} memory", a.capacity_gib)
            parts.append(figure_html(fig, f"{label} memory by batch size"))
        note = "PyTorch's allocator peaks (allocated: tensors; reserved: what the allocator holds from the GPU)."
    else:
        fig = _bar_panel(table, "process_peak_rss_gib", swept, "Peak memory (host)")
        parts.append(figure_html(fig, "peak memory by batch size"))
        note = "No GPU: the process's peak resident memory on the host."
    intro = f"<p>{note} The dashed line is the GPU's capacity; OOM marks a condition that ran out.</p>"
    return intro + "\n".join(parts) + _phase_peaks_html(a) + _prediction_html(a)


def _phase_peaks_html(a: GridAnalysis) -> str:
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


def _speedup_tab(a: GridAnalysis) -> str:
    parts = []
    speedup = _speedup_figure(a.comparison, a.summary, a.swept)
    if speedup is not None:
        parts.append(figure_html(speedup, "throughput ratio heatmap"))
    elif not a.comparison.empty:
        parts.append(
            "<p>No batch-size grid with ok runs in both an arm and the baseline: the ratios as a table.</p>"
            + table_html(a.comparison)
        )
    else:
        parts.append("<p>Only one arm ran: nothing to compare.</p>")
    if a.table["mfu"].notna().any():
        parts.append(figure_html(_bar_panel(a.table, "mfu", a.swept, "MFU"), "MFU per condition"))
        parts.append("<p>MFU: model FLOPs per token × tokens/s over the GPU's dense bf16 peak.</p>")
    else:
        parts.append("<p>MFU: not known for this device (no GPU, or a GPU without a known peak).</p>")
    return "\n".join(parts)


def _loss_curves_tab(a: GridAnalysis) -> str:
    curves = _loss_curves_figure(a.steps, a.swept)
    content = figure_html(curves, "loss curves") if curves is not None else "<p>No run recorded a loss.</p>"
    if not a.parity.empty:
        content += (
            "<h3>Loss parity</h3><p>Each arm's run against the baseline run with the same other settings and run "
            "number (same seed, same data order), step by step.</p>" + table_html(a.parity)
        )
    return content + _held_out_html(a)


def _step_times_tab(a: GridAnalysis) -> str:
    times = _step_time_figure(a.steps, a.swept)
    if times is None:
        return "<p>No run recorded a step.</p>"
    parts = [
        figure_html(times, "step time distribution"),
        "<p>A timed step that fed a batch shape its run had not fed before (on several GPUs: any rank) can be slow "
        "once: kernels and libraries specialise for the shape. The <b>steady-state throughput</b> counts every timed "
        "step's tokens at the time the steps that met no new shape take for their size (a robust line of step time "
        "against padded tokens), so no single slow step moves it; the <b>new-shape cost</b> is what the new-shape "
        "steps took beyond that (columns <code>steady_tokens_per_second</code>, <code>new_shape_steps</code>, "
        "<code>new_shape_cost_s</code>, <code>outlier_steps</code> in the Runs table).</p>",
    ]
    if not a.skewed_runs.empty:
        parts.append(
            "<h3>Runs moved by slow steps</h3><p>Runs whose throughput over all timed steps differs from their steady "
            "state by more than the A/A noise floor (3 % without an A/A arm); <code>timing_skew</code> is steady over "
            "all-steps throughput, less 1.</p>" + table_html(a.skewed_runs)
        )
    return "\n".join(parts)


def _profile_tab(a: GridAnalysis) -> str | None:
    """The profiled steps, and the runs whose profile failed (no tab when no run was profiled)."""
    table = a.table
    failed = table[table.get("profile_error", pd.Series("", index=table.index)).fillna("").astype(str) != ""]
    if a.profile.empty and failed.empty:
        return None
    content = ""
    if not failed.empty:
        items = "".join(
            f"<li>{html.escape(row.condition_id)} (run {row.run_number}): {html.escape(row.profile_error)}</li>"
            for row in failed.itertuples(index=False)
        )
        content += (
            '<div class="warning"><b>Profiles that failed.</b> These runs were measured (their figures stand); '
            f"the profile after their timed steps did not complete:<ul>{items}</ul></div>"
        )
    if not a.profile.empty:
        content += _profile_html(a.profile, a.swept)
    return content


def _conditions_tab(a: GridAnalysis) -> str:
    """Every condition's summary, then every run that did not end ok, with its reason and error."""
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


def _timeline_figure(timeline: pd.DataFrame, swept: list[str]) -> plt.Figure:
    """One stacked bar per condition: its median wall time split into the phases of the timeline and the remainder
    no phase covers (a phase no run measured has no segment)."""
    keys = [axis for axis in swept if axis in timeline] or ["condition_id"]
    labels = [
        ", ".join(str(row[k]) for k in keys) + _reused_label(row.get("reused_runs", 0), row["runs"])
        for _, row in timeline.iterrows()
    ]
    segments = [*IN_WALL_COLUMNS, OTHER_COLUMN]
    colors = dict(zip(segments, sns.color_palette("tab20", len(segments)), strict=True))
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(labels) + 1.8))
    left = pd.Series(0.0, index=timeline.index)
    for column in segments:
        values = timeline[column].fillna(0.0).clip(lower=0.0)
        if (values > 0).any():
            ax.barh(labels, values, left=left, color=colors[column], label=column.removesuffix("_s"))
            left = left + values
    ax.invert_yaxis()
    ax.set_xlabel("seconds (median over the condition's ok runs)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=5, fontsize=8, frameon=False)
    ax.set_title("Where a run's wall time went")
    fig.tight_layout()
    return fig


def _reused_label(reused: float, runs: float) -> str:
    """ " (reused)" for a condition whose every run came from the results store, " (k of n reused)" for some."""
    if not reused or pd.isna(reused):
        return ""
    return " (reused)" if reused == runs else f" ({int(reused)} of {int(runs)} reused)"


def _timeline_html(a: GridAnalysis) -> str:
    """Per condition, where its runs' wall time went (`GridAnalysis.timeline`); nothing when no run has a timeline."""
    if a.timeline.empty:
        return ""
    return (
        "<h3>Where the wall time went</h3><p>Each condition's median over its ok runs of every phase of a run, from "
        "the launcher starting its child process to the child's exit (<code>wall_time_s</code>): start-up, imports, "
        "the model built, the data prepared, the set-up before the first step, the warm-up and the timed steps, "
        "the evaluations, the profile, writing the result and the exit. A phase no run measured is left empty "
        "(–), not 0; <code>other_s</code> is the wall time no measured phase covers, and "
        "<code>outside_steps_s</code> the wall time outside the warm-up and the timed steps. "
        "<code>store_s</code> is the launcher's results-store lookup before the run, outside the wall time. A run "
        'reused from the results store (<code>reused_runs</code>; "reused" beside the condition) shows the '
        "timeline of the execution that measured it, not this one's.</p>"
        + figure_html(_timeline_figure(a.timeline, a.swept), "where the wall time went, per condition")
        + table_html(a.timeline)
    )


def _runs_tab(a: GridAnalysis) -> str:
    # Whether a run was reused from the results store is bookkeeping: a resumed grid reports like an uninterrupted one.
    runs = table_html(a.table[[c for c in a.table.columns if c != "error_tail"]])
    return _timeline_html(a) + "<h3>Every run</h3>" + runs


def _front_text(row: tuple) -> str:
    """The leaderboard's Pareto cell: "yes", or which stack beats this one, and how."""
    if row.pareto:
        return "yes"
    if pd.isna(row.throughput_ratio):
        return "not compared: no ok run paired with the baseline's"
    if row.beaten_by == "–":
        return "no: its memory was not measured"
    if row.beaten_by_peak_reserved_ratio < row.peak_reserved_ratio:
        return f"no: {row.beaten_by} is as fast or faster and leaner"
    return f"no: {row.beaten_by} is faster and needs at most {MEMORY_TIE:.0%} of the baseline's memory more"


def _stacks_figure(stacks: pd.DataFrame, swept: list[str]) -> plt.Figure:
    """Speed against memory, both as ratios to the baseline (at 1, 1), one panel per point of the other axes:
    stacks on the Pareto front filled, the others hollow."""
    facets = [axis for axis in swept if axis != "arm"]
    data = stacks.assign(panel=_panels(stacks, facets))
    panels = list(dict.fromkeys(data["panel"]))
    palette = arm_palette(data["arm"])
    fig, axes = plt.subplots(1, len(panels), figsize=(max(5.5, 5 * len(panels)), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        rows = data[(data["panel"] == panel) & data["throughput_ratio"].notna() & data["peak_reserved_ratio"].notna()]
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.scatter([1.0], [1.0], marker="s", color="black")
        ax.annotate(BASELINE, (1.0, 1.0), textcoords="offset points", xytext=(5, -10), fontsize=8)
        for row in rows.itertuples(index=False):
            color = palette[row.arm]
            ax.scatter([row.peak_reserved_ratio], [row.throughput_ratio], s=60, edgecolors=color,
                       facecolors=color if row.pareto else "none", linewidths=1.5)  # fmt: skip
            ax.annotate(row.arm, (row.peak_reserved_ratio, row.throughput_ratio), textcoords="offset points",
                        xytext=(5, 4), fontsize=8)  # fmt: skip
        ax.set_xlabel("peak reserved memory × baseline (lower: leaner)")
        ax.set_ylabel("throughput × baseline (higher: faster)")
        ax.set_title(panel)
    fig.suptitle("Stacks: speed against memory (filled: on the Pareto front)")
    fig.tight_layout()
    return fig


def _stacks_tab(a: GridAnalysis) -> str | None:
    """Two or more stacks against the baseline: the leaderboard at each point of the other axes, and speed against
    memory with the stacks no other one beats on both (no tab with fewer stacks)."""
    if a.stacks.empty:
        return None
    stacks, others = a.stacks, [axis for axis in a.swept if axis != "arm"]
    shown = stacks[["rank", "arm", *others, "pairs"]].copy()
    missing = pd.Series(float("nan"), index=stacks.index)
    for name, label in (
        ("throughput", "throughput"),
        ("peak_reserved", "peak reserved"),
        ("energy_per_token", "energy per token"),
    ):
        if f"{name}_ratio" in stacks:
            bounds = (stacks.get(f"{name}_ci_low", missing), stacks.get(f"{name}_ci_high", missing))
            shown[f"{label} ×"] = [
                _ratio_text(*values) for values in zip(stacks[f"{name}_ratio"], *bounds, strict=True)
            ]
    shown["loss matched"] = stacks["loss_match"]
    shown["Pareto front"] = [_front_text(row) for row in stacks.itertuples(index=False)]
    parts = [
        "<p>Each stack (arm) against the baseline at the same other settings, ranked by throughput: the median ratio "
        f"of runs paired by run number with its {CONFIDENCE_LEVEL:.0%} interval (from {MIN_PAIRS_FOR_CI} pairs), the "
        "ratios of peak reserved memory and energy per token, and how many of its runs' losses matched the "
        "baseline's. A stack off the Pareto front is beaten on both speed and memory by another one here, or by the "
        "baseline: it is never the one to train with on this model, batch and sequence length. Memories within "
        f"{MEMORY_TIE:.0%} of the baseline's count as the same: a stack that saves less than that over a faster one "
        "is off the front.</p>",
        table_html(shown),
    ]
    if "peak_reserved_ratio" in stacks and stacks["peak_reserved_ratio"].notna().any():
        parts.append(figure_html(_stacks_figure(stacks, a.swept), "stacks: speed against memory"))
    if not a.stack_budgets.empty:
        budgets = a.stack_budgets[[*others, "at_least_gib", "train_with", "throughput_ratio"]].rename(
            columns={
                "at_least_gib": "memory budget from (GiB)",
                "train_with": "train with",
                "throughput_ratio": "throughput ×",
            }  # fmt: skip
        )
        parts += [
            "<h3>Which stack for your memory budget</h3>"
            "<p>From each budget of GPU memory up (the stack's median peak reserved memory here), the fastest stack "
            "that fits it, among the baseline and the stacks on the front whose losses did not diverge from the "
            "baseline's; "
            "below the first budget none of them fits.</p>",
            table_html(budgets),
        ]
    if not a.stack_components.empty:
        components = a.stack_components[
            [*others, "stack", "component", "without", "throughput_factor", "peak_reserved_factor"]
        ].rename(
            columns={
                "without": "compared with",
                "throughput_factor": "throughput ×",
                "peak_reserved_factor": "peak reserved ×",
            }  # fmt: skip
        )
        parts += [
            "<h3>What each component adds</h3>"
            "<p>For a stack of several components and an arm of the grid that lacks one of them, that component's "
            "share: the stack's ratio to the baseline divided by the other arm's (above 1 in throughput: it makes the "
            "stack faster; below 1 in peak reserved memory: leaner). Only the ablations the grid measured.</p>",
            table_html(components),
        ]
    return "\n".join(parts)


# The tabs after the Summary, in order; a renderer that returns None leaves its tab out.
TABS: tuple[tuple[str, Callable[[GridAnalysis], str | None]], ...] = (
    ("Stacks", _stacks_tab),
    ("Throughput", _throughput_tab),
    ("Memory", _memory_tab),
    ("Speedup", _speedup_tab),
    ("Loss curves", _loss_curves_tab),
    ("Step times", _step_times_tab),
    ("Scaling", _scaling_tab),
    ("Profile", _profile_tab),
    ("Conditions", _conditions_tab),
    ("Runs", _runs_tab),
)


def grid_report(analysis: GridAnalysis, experiment_name: str = "", notes: list[str] | None = None) -> Report:
    """The report of a grid's analysis (`analysis.grid`): it renders, it computes nothing. `notes`: what the
    execution does not keep (on a cluster: no persistent results store, no W&B), shown after the problems."""
    sections = {"Summary": _summary_tab(analysis, experiment_name, notes or [])}
    for name, render in TABS:
        content = render(analysis)
        if content is not None:
            sections[name] = content
    return Report(sections=sections)
