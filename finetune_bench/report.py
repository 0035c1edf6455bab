"""Figures (seaborn) and the self-contained HTML report; the Deck shows the same sections."""

import base64
import html
import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from finetune_bench.analyze import condition_summary, liger_vs_baseline, ran_on_cpu  # noqa: E402
from finetune_bench.parity import DIVERGED, loss_parity, parity_summary  # noqa: E402
from finetune_bench.stats import CONFIDENCE_LEVEL, MIN_PAIRS_FOR_CI, paired_comparison  # noqa: E402

ARM_COLUMN = "arm"
ARM_PALETTE = {"baseline": "#4C72B0", "liger": "#DD8452"}
FAILED_STATUSES_MARK = {"oom": "OOM", "error": "ERR", "timeout": "T/O", "nonfinite": "NaN", "lost": "LOST"}

CPU_WARNING = (
    "These runs happened on a CPU. Their timings say nothing about Liger's speed: on a CPU the "
    "liger arm runs its Triton kernels in the Triton interpreter, about 100x slower than eager "
    "PyTorch. Use a CPU run only to check that the workflow works; measure on a GPU."
)


@dataclass
class Report:
    """The report's sections, as HTML fragments, in display order."""

    sections: dict[str, str]

    def to_html(self, title: str = "Fine-tuning benchmark") -> str:
        body = "\n".join(
            f"<section><h2>{html.escape(name)}</h2>{content}</section>" for name, content in self.sections.items()
        )
        return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th {{ background: #f2f2f2; }}
.warning {{ background: #fff3cd; border: 1px solid #e0b000; padding: 0.8em; margin: 1em 0; }}
pre {{ background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.8em; }}
img {{ max-width: 100%; }}
</style></head>
<body><h1>{html.escape(title)}</h1>
{body}
</body></html>"""


def _arm(table: pd.DataFrame) -> pd.Series:
    return table["use_liger"].map({True: "liger", False: "baseline"})


def _figure_html(fig: plt.Figure, alt: str) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    encoded = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}"/>'


def _x_axis(swept: list[str]) -> str:
    if "per_device_train_batch_size" in swept:
        return "per_device_train_batch_size"
    others = [axis for axis in swept if axis != "use_liger"]
    return others[0] if others else "condition_id"


def _bar_panel(table: pd.DataFrame, metric: str, ylabel: str, swept: list[str], title: str) -> plt.Figure:
    """Median of `metric` over ok runs per condition (bars, min–max over repeats as error bars),
    one panel per value of the axes other than liger and x; failed conditions marked, never dropped."""
    x = _x_axis(swept)
    facets = [axis for axis in swept if axis not in ("use_liger", x)]
    data = table.assign(**{ARM_COLUMN: _arm(table)})
    data["panel"] = ""
    if facets:
        labels = data[facets].apply(lambda column: column.name + "=" + column.astype(str))
        data["panel"] = labels.agg(", ".join, axis=1)
    panels = list(dict.fromkeys(data["panel"]))
    order = sorted(data[x].unique())
    hue_order = [arm for arm in ARM_PALETTE if arm in set(data[ARM_COLUMN])]
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6, 5.5 * len(panels)), 4.2), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels, strict=True):
        subset = data[data["panel"] == panel]
        ok = subset[(subset["status"] == "ok") & subset[metric].notna()]
        if not ok.empty:
            sns.barplot(
                data=ok, x=x, y=metric, hue=ARM_COLUMN, order=order, hue_order=hue_order, palette=ARM_PALETTE,
                estimator="median", errorbar=("pi", 100), capsize=0.1, ax=ax,
            )  # fmt: skip
        _mark_failures(ax, subset, x, order, hue_order)
        ax.set_xlim(-0.5, len(order) - 0.5)
        ax.set_xticks(range(len(order)), [str(v) for v in order])
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.set_title(panel)
        ax.set_ylim(bottom=0)
        for container in ax.containers:
            if hasattr(container, "datavalues"):
                ax.bar_label(container, fmt=_short_number, fontsize=8, padding=2)
        ax.get_legend() and ax.get_legend().remove()
    handles = [plt.Rectangle((0, 0), 1, 1, color=ARM_PALETTE[arm]) for arm in hue_order]
    fig.legend(handles, hue_order, title="arm", loc="upper left", bbox_to_anchor=(1.0, 0.9))
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _short_number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _mark_failures(ax: plt.Axes, subset: pd.DataFrame, x: str, order: list, hue_order: list[str]) -> None:
    """Write OOM / ERR / T/O / LOST where a condition has no ok run, at its bar's position."""
    width = 0.8 / max(len(hue_order), 1)
    for (x_value, arm), cell in subset.groupby([x, ARM_COLUMN]):
        if (cell["status"] == "ok").any():
            continue
        worst = cell["status"].mode().iloc[0]
        position = order.index(x_value) - 0.4 + width * (hue_order.index(arm) + 0.5)
        ax.text(
            position, 0.02, FAILED_STATUSES_MARK.get(worst, worst.upper()), transform=ax.get_xaxis_transform(),
            ha="center", va="bottom", rotation=90, color="#C00000", fontweight="bold",
        )  # fmt: skip


def _table_html(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, float_format=_table_number, na_rep="–", border=0, escape=True)


def _table_number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def build_report(
    table: pd.DataFrame,
    swept: list[str],
    environment: dict[str, str],
    steps: pd.DataFrame | None = None,
    experiment_name: str = "",
    alpha: float = 0.05,
) -> Report:
    """The report from the results table (one row per run) and, for loss parity, the per-step table."""
    summary = condition_summary(table, swept)
    parity = loss_parity(steps, swept) if steps is not None else pd.DataFrame()
    comparison = liger_vs_baseline(summary, swept)
    paired = paired_comparison(table, swept, alpha)
    on_cpu = ran_on_cpu(table)
    sections: dict[str, str] = {}

    overview = []
    if on_cpu:
        overview.append(f'<div class="warning"><b>CPU run.</b> {html.escape(CPU_WARNING)}</div>')
    counts = table["status"].value_counts()
    overview.append(
        "<p>"
        + html.escape(f"{len(table)} runs of {table['condition_id'].nunique()} conditions: ")
        + html.escape(", ".join(f"{n} {status}" for status, n in counts.items()))
        + "</p>"
    )
    if experiment_name:
        overview.append(f"<p>Experiment: {html.escape(experiment_name)}</p>")
    env_items = {k: v for k, v in environment.items() if k in _ENVIRONMENT_KEYS}
    if env_items:
        overview.append(_table_html(pd.DataFrame([env_items])))
    if not comparison.empty:
        overview.append(
            "<h3>Liger against the baseline</h3><p>Median over ok runs; ratio &gt; 1 means liger is faster "
            "(throughput) or uses more memory (peak reserved).</p>"
        )
        overview.append(f"<p><b>{html.escape(_verdict(comparison))}</b></p>")
        overview.append(_table_html(comparison))
        overview.append(
            f"<h3>How sure</h3><p>Liger / baseline ratios of runs paired by run number: median, "
            f"{CONFIDENCE_LEVEL:.0%} bootstrap interval (from {MIN_PAIRS_FOR_CI} pairs), and a paired t-test "
            f"on the logarithms at alpha {alpha:g} (<code>significant</code>: the ratio differs from 1).</p>"
        )
        overview.append(_table_html(paired))
    if "use_liger" in swept and steps is not None:
        overview.append(f"<p><b>{html.escape(parity_summary(parity))}</b></p>")
        diverged = parity[parity["verdict"] == DIVERGED] if not parity.empty else parity
        if not diverged.empty:
            overview.append(_table_html(diverged))
    sections["Summary"] = "\n".join(overview)

    memory_metric, memory_label = "peak_reserved_gib", "peak reserved memory (GiB)"
    if table.get(memory_metric, pd.Series(dtype=float)).isna().all():
        memory_metric, memory_label = "process_peak_rss_gib", "process peak RSS (GiB, host memory)"
    figures = [
        _figure_html(
            _bar_panel(table, "tokens_per_second", "non-padding tokens/s (warm-up excluded)", swept, "Throughput"),
            "throughput by batch size",
        ),
        _figure_html(_bar_panel(table, memory_metric, memory_label, swept, "Peak memory"), "peak memory by batch size"),
    ]
    if not table["peak_allocated_gib"].isna().all():
        figures.append(
            _figure_html(
                _bar_panel(table, "peak_allocated_gib", "peak allocated memory (GiB)", swept, "Peak allocated memory"),
                "peak allocated memory by batch size",
            )
        )
    note = (
        "<p>Bars: median over repeats; error bars: min–max. "
        "OOM / ERR / T/O / NaN / LOST mark conditions with no ok run.</p>"
    )
    sections["Figures"] = note + "\n".join(figures)

    sections["Conditions"] = _table_html(summary)
    if not parity.empty:
        sections["Loss parity"] = (
            "<p>Each liger run against the baseline run with the same other settings and run number "
            "(same seed, same data order), step by step.</p>" + _table_html(parity)
        )
    # Whether a run was reused from the results store is bookkeeping: a resumed grid reports like an uninterrupted one.
    run_columns = [c for c in table.columns if c not in ("error_tail", "reused")]
    sections["Runs"] = _table_html(table[run_columns])
    failures = table[table["status"] != "ok"]
    if failures.empty:
        sections["Failures"] = "<p>No run failed.</p>"
    else:
        parts = []
        for row in failures.itertuples(index=False):
            parts.append(
                f"<h3>{html.escape(row.condition_id)} (run {row.run_number}): {html.escape(row.status)}</h3>"
                f"<p>{html.escape(str(row.reason))}</p>"
                f"<pre>{html.escape(str(getattr(row, 'error_tail', '') or ''))}</pre>"
            )
        sections["Failures"] = "\n".join(parts)
    return Report(sections=sections)


def _verdict(comparison: pd.DataFrame) -> str:
    """One line: the range of liger/baseline ratios over the conditions where both arms ran."""
    both = comparison.dropna(subset=["throughput_ratio"])
    missing = len(comparison) - len(both)
    if both.empty:
        return "No condition has ok runs in both arms: no comparison possible."
    speed, memory = both["throughput_ratio"], both["peak_reserved_ratio"].dropna()
    line = f"Liger vs baseline over {len(both)} condition(s): throughput ×{speed.min():.2f}–{speed.max():.2f}"
    if not memory.empty:
        line += f", peak reserved memory ×{memory.min():.2f}–{memory.max():.2f}"
    if missing:
        line += f"; {missing} condition(s) lack an ok run in one arm (see Failures)"
    return line + "."


_ENVIRONMENT_KEYS = (
    "gpu_name",
    "gpu_count",
    "cpu",
    "hostname",
    "torch",
    "triton",
    "transformers",
    "trl",
    "liger-kernel",
    "cuda",
)
