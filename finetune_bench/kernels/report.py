"""The kernel benchmark's tables and report: each Liger kernel against its reference, by mode and size.

- `comparison`: per kernel × mode × metric × x, the median of each provider side by side, Liger's speedup
  (reference ms over Liger ms: > 1 is faster) and memory ratio (Liger MB over reference MB: < 1 is leaner);
- `summary`: per kernel, the full pass at every size: the speedup and memory ratio ranges and who wins;
- the report: the summary, figures of both ratios against size, the raw figures, and every point that failed.
"""

import html
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from finetune_bench.analysis.numbers import MISSING, span_text  # noqa: E402
from finetune_bench.kernels.settings import (  # noqa: E402
    CPU_CALLS,
    LIGER,
    REFERENCE_PROVIDERS,
    TORCH_COMPILE,
    KernelBenchmarkSettings,
)
from finetune_bench.reporting.benchmark_tabs.figures import spans_orders_of_magnitude as spans  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.figures import title_above_panels  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.measured import (  # noqa: E402
    measured_at_text,
    measured_html,
    values_text,
)
from finetune_bench.reporting.html import (  # noqa: E402
    Report,
    cards_html,
    compact_table_html,
    figure_html,
    table_html,
)
from finetune_bench.results.record import OK

# Within this much of 1, a ratio is a tie: Liger's own published points move by more than that between runs.
TIE = 0.05
CPU_WARNING = (
    "These points ran on a CPU, Liger's kernels in the Triton interpreter: the times say nothing about speed and "
    "there is no memory figure. Run on a GPU to measure."
)


# Provider names Liger's data has used for the same roles: its older scripts called every reference
# `huggingface`, its current ones `torch` for some kernels; fused_add_rms_norm's Liger kernel has its own name.
REFERENCE_NAMES = {"torch", "huggingface"}
LIGER_NAMES = {"fused_add_rms_norm": "liger_fused_add_rms_norm"}


def _role(kernel: str, provider: str) -> str:
    """`liger`, `reference`, `torch_compile`, or the provider's own name (a provider with no role here)."""
    if provider in (LIGER, LIGER_NAMES.get(kernel)):
        return LIGER
    if provider == TORCH_COMPILE:
        return TORCH_COMPILE
    if provider == REFERENCE_PROVIDERS.get(kernel) or provider in REFERENCE_NAMES:
        return "reference"
    return provider


def comparison(rows: pd.DataFrame) -> pd.DataFrame:
    """Per kernel, mode, metric and x: each provider's median (`liger`, `reference`, `torch_compile` when run),
    `speedup` (speed rows: reference over Liger) and `memory_ratio` (memory rows: Liger over reference)."""
    ok = rows[(rows["status"] == OK) & rows["y_value_50"].notna()].copy()
    if ok.empty:
        return pd.DataFrame()
    ok["role"] = [
        _role(kernel, provider) for kernel, provider in zip(ok["kernel_name"], ok["kernel_provider"], strict=True)
    ]
    keys = ["kernel_name", "kernel_operation_mode", "metric_name", "metric_unit", "x_name", "x_value"]
    if "software_set" in ok:  # each set's kernels against the reference it ran beside
        ok["software_set"] = ok["software_set"].fillna("")  # the installed set, read back from a CSV
        keys.insert(1, "software_set")
    wide = ok.pivot_table(index=keys, columns="role", values="y_value_50", aggfunc="first").reset_index()
    wide.columns.name = None
    for role in (LIGER, "reference"):
        if role not in wide:
            wide[role] = float("nan")
    speed = wide["metric_name"] == "speed"
    wide["speedup"] = (wide["reference"] / wide[LIGER]).where(speed)
    wide["memory_ratio"] = (wide[LIGER] / wide["reference"]).where(~speed)
    return wide


def _verdict(speedup: pd.Series, memory: pd.Series) -> str:
    parts = []
    if speedup.notna().any():
        low, high = speedup.min(), speedup.max()
        parts.append("faster" if low > 1 + TIE else "slower" if high < 1 - TIE else "about as fast")
    if memory.notna().any():
        low, high = memory.min(), memory.max()
        parts.append("leaner" if high < 1 - TIE else "heavier" if low > 1 + TIE else "about as lean")
    return ", ".join(parts) if parts else "not measured"


def kernel_cards(compared: pd.DataFrame) -> str:
    """The answer at a glance: a card per kernel, Liger's full pass against the reference over every size (its speedup
    and memory ratio, their ranges) and the verdict; "" without a comparison."""
    table = summary(compared)
    cards = [
        (row["kernel"], [(row["speedup (full pass)"], "speedup"), (row["memory ratio (full pass)"], "memory ratio"),
                         (row["Liger is"], "Liger is")])
        for row in table.to_dict("records")
    ]  # fmt: skip
    return cards_html(
        cards,
        "Liger's full pass (forward and backward) against the reference, over every size: speedup the reference's "
        "time over Liger's (× above 1: faster), memory ratio Liger's peak over the reference's (below 1: leaner).",
    )


def _span(values: pd.Series) -> str:
    values = values.dropna()
    return MISSING if values.empty else span_text(values)


def summary(compared: pd.DataFrame) -> pd.DataFrame:
    """Per kernel, over the full pass at every size: Liger's speedup and memory ratio ranges and the verdict
    (faster / slower / about as fast; leaner / heavier / about as lean, a tie within ±5 %)."""
    if compared.empty:
        return pd.DataFrame()
    full = compared[compared["kernel_operation_mode"] == "full"]
    rows = []
    for kernel, group in full.groupby("kernel_name", sort=False):
        speedup, memory = group["speedup"].dropna(), group["memory_ratio"].dropna()
        rows.append(
            {
                "kernel": kernel,
                "sizes": ", ".join(str(int(x)) for x in sorted(group["x_value"].unique())),
                "speedup (full pass)": _span(speedup),
                "memory ratio (full pass)": _span(memory),
                "Liger is": _verdict(speedup, memory),
            }
        )
    return pd.DataFrame(rows)


MATCH_KEYS = ["kernel_name", "kernel_operation_mode", "metric_name", "x_name", "x_value"]


def nothing_measured(rows: pd.DataFrame) -> str:
    """What failed, when no kernel was measured (no row ended ok): each kernel's first reason; "" otherwise."""
    if (rows.get("status", pd.Series(dtype=str)) == OK).any():
        return ""
    if rows.empty:
        return "no kernel was measured: the sweep produced no row"
    reasons = rows.drop_duplicates("kernel_name") if "kernel_name" in rows else rows.head(1)
    said = "; ".join(
        f"{row.get('kernel_name', '?')}: {row.get('reason', '') or 'no reason given'}" for _, row in reasons.iterrows()
    )
    return f"no kernel was measured, every one failed ({said})"


def releases(rows: pd.DataFrame) -> pd.DataFrame:
    """Each software set's Liger kernel against the first set's (the sweep's reference), per kernel, mode, metric
    and x: both medians, the liger-kernel release each imported, and `speedup` (the reference set's time over this
    set's: > 1 is faster) or `memory_ratio` (this set's peak over the reference set's: < 1 is leaner). Empty when
    one set ran."""
    if "software_set" not in rows or rows["software_set"].fillna("").nunique() < 2:
        return pd.DataFrame()
    rows = rows.assign(software_set=rows["software_set"].fillna(""))  # the installed set, read back from a CSV
    ok = rows[(rows["status"] == OK) & rows["y_value_50"].notna()]
    liger = [_role(k, p) == LIGER for k, p in zip(ok["kernel_name"], ok["kernel_provider"], strict=True)]
    ok = ok[pd.Series(liger, index=ok.index, dtype=bool)]  # a mask even when empty (an empty list selects columns)
    if ok.empty:  # no set measured its Liger kernel (every child failed): nothing to compare
        return pd.DataFrame()
    order = list(dict.fromkeys(rows["software_set"]))
    reference = order[0]
    keys = ["kernel_name", "kernel_operation_mode", "metric_name", "metric_unit", "x_name", "x_value"]
    base = ok[ok["software_set"] == reference][[*keys, "y_value_50", "liger_version"]]
    base = base.rename(columns={"y_value_50": "reference_set", "liger_version": "reference_liger_version"})
    others = ok[ok["software_set"] != reference][[*keys, "software_set", "liger_version", "y_value_50"]]
    paired = others.merge(base, on=keys, how="inner").rename(columns={"y_value_50": "this_set"})
    speed = paired["metric_name"] == "speed"
    paired["speedup"] = (paired["reference_set"] / paired["this_set"]).where(speed)
    paired["memory_ratio"] = (paired["this_set"] / paired["reference_set"]).where(~speed)
    paired.insert(0, "reference", reference or "installed packages")
    paired["software_set"] = paired["software_set"].replace("", "installed packages")
    return paired


def releases_summary(paired: pd.DataFrame) -> pd.DataFrame:
    """Per set and kernel, over the full pass at every size: the ranges of its speedup and memory ratio against the
    reference set and the verdict (a tie within ±5 %)."""
    if paired.empty:
        return pd.DataFrame()
    full = paired[paired["kernel_operation_mode"] == "full"]
    rows = []
    for (software_set, kernel), group in full.groupby(["software_set", "kernel_name"], sort=False):
        speedup, memory = group["speedup"].dropna(), group["memory_ratio"].dropna()
        rows.append(
            {
                "software set": software_set,
                "against": group["reference"].iloc[0],
                "kernel": kernel,
                "liger-kernel": f"{group['liger_version'].iloc[0]} vs {group['reference_liger_version'].iloc[0]}",
                "speedup (full pass)": _span(speedup),
                "memory ratio (full pass)": _span(memory),
                "the set's kernel is": _verdict(speedup, memory),
            }
        )
    return pd.DataFrame(rows)


def _version_order(versions: pd.Series) -> pd.Series:
    """A sort key for liger-kernel versions (an unreadable one sorts first)."""
    from packaging.version import InvalidVersion, Version

    def key(text: object) -> Version:
        try:
            return Version(str(text))
        except InvalidVersion:
            return Version("0")

    return versions.map(key)


def against_published(rows: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Each measured point beside the published row with the same kernel, mode, metric and x value, and each
    provider's figure beside the same provider's: ours, theirs, and Liger's speedup (or memory ratio) in both.
    Published rows on the same GPU are preferred where there are any; `published_gpu` says which was used."""
    if "status" not in published:  # Liger's own data: every row is a measurement
        published = published.assign(status=OK)
    # Model-config sweeps name a model as x: only numeric sizes compare with the points here.
    published = published.assign(x_value=pd.to_numeric(published["x_value"], errors="coerce"))
    published = published[published["x_value"].notna()]
    # Where several liger-kernel versions measured the same point, the newest.
    published = published.sort_values("liger_version", key=_version_order, ascending=False).drop_duplicates(
        ["kernel_name", "kernel_provider", "kernel_operation_mode", "metric_name", "x_name", "x_value", "gpu_name"]
    )
    measured_on = set(rows.get("gpu_name", pd.Series(dtype=str)).dropna().astype(str))
    same_gpu = published["gpu_name"].astype(str).isin(measured_on)
    if same_gpu.any():  # the same GPU's rows only: a figure is not comparable across GPUs
        published = published[same_gpu]
    ours, theirs = comparison(rows), comparison(published)
    if ours.empty or theirs.empty:
        return pd.DataFrame()
    about = published.groupby(MATCH_KEYS)[["gpu_name", "liger_version"]].first().reset_index()
    about = about.rename(columns={"gpu_name": "published_gpu", "liger_version": "published_liger_version"})
    columns = [*MATCH_KEYS, LIGER, "reference", "speedup", "memory_ratio"]
    merged = ours[columns].merge(theirs[columns], on=MATCH_KEYS, suffixes=("", "_published"))
    merged = merged.merge(about, on=MATCH_KEYS, how="left")
    merged["liger_ours_over_published"] = merged[LIGER] / merged[f"{LIGER}_published"]
    return merged.reset_index(drop=True)


# A panel whose largest ratio is this many times its smallest is drawn on a log axis (on a linear one, the small
# ratios of a CPU run's interpreted kernels, ×0.001, lie flat on zero beside ×1).
LOG_AXIS_SPAN = 10.0


def spans_orders_of_magnitude(ratios: pd.Series) -> bool:
    """Whether positive `ratios` span LOG_AXIS_SPAN or more (1 is always on the axis: the tie line)."""
    return spans(pd.concat([ratios.dropna(), pd.Series([1.0])]), LOG_AXIS_SPAN)


# The shapes a point's `extra_benchmark_config_str` records, as the header names them.
SHAPE_NAMES = {
    "hidden_size": "hidden",
    "intermediate_size": "MLP",
    "vocab_size": "vocabulary",
    "num_attention_heads": "heads",
    "num_key_value_heads": "KV heads",
    "head_dim": "head size",
}


def ran_on_cpu(rows: pd.DataFrame) -> bool:
    return bool(rows.get("device", pd.Series(dtype=str)).astype(str).str.startswith("cpu").any())


def _config(rows: pd.DataFrame) -> dict:
    """The first readable `extra_benchmark_config_str` of the rows: the model, its shapes and the dtype ({} where
    none is)."""
    for text in rows.get("extra_benchmark_config_str", pd.Series(dtype=str)).dropna().astype(str):
        try:
            config = json.loads(text)
        except ValueError:
            continue
        if isinstance(config, dict):
            return config
    return {}


def what_was_measured(
    rows: pd.DataFrame, sweep: KernelBenchmarkSettings | None = None, model: str = "", inputs_file: str = ""
) -> dict[str, str]:
    """The report's header: the hardware, the model (`model` where the rows do not name it) and its shapes, the
    dtype, the sizes and passes, how a point was timed (with the `sweep`'s settings), when the points were measured,
    liger-kernel's version and the lockfile's hash, those the rows (and the sweep) carry, and the inputs file a
    local run was given."""
    config = _config(rows)
    if ran_on_cpu(rows):
        hardware = "CPU (Liger's kernels in the Triton interpreter)"
    else:
        hardware = values_text(rows.get("gpu_name", pd.Series(dtype=str)))
    shapes = ", ".join(f"{name} {config[key]:,}" for key, name in SHAPE_NAMES.items() if config.get(key))
    model = str(config.get("model") or model or (sweep.model if sweep else ""))
    sizes = values_text(pd.to_numeric(rows.get("x_value", pd.Series(dtype=float)), errors="coerce"))
    timing = ""
    if sweep is not None:
        # 10 calls: `kernels.measure.MEMORY_CALLS` (that module imports torch, which the report's image has not got)
        memory = "no memory figure on a CPU" if ran_on_cpu(rows) else "the peak allocated over 10 calls"
        speed = (
            f"the wall time of {CPU_CALLS} calls per point (a CPU has no triton.testing.do_bench)"
            if ran_on_cpu(rows)
            else f"triton.testing.do_bench, {sweep.warmup_ms} ms warm-up and {sweep.rep_ms} ms of calls per point"
        )
        timing = f"speed: {speed}; memory: {memory}"
    versions = values_text(rows.get("liger_version", pd.Series(dtype=str)))
    locks = rows.get("lock_sha256", pd.Series(dtype=str)).dropna().astype(str)
    locks = ", ".join(dict.fromkeys(lock[:12] for lock in locks if lock and lock != "none"))
    versions = ", ".join(
        part
        for part in (f"liger-kernel {versions}" if versions else "", f"lockfile sha256 {locks}" if locks else "")
        if part
    )
    return {
        "hardware": hardware,
        "model": f"{model} ({shapes})" if model and shapes else model,
        "dtype": str(config.get("dtype") or (sweep.dtype if sweep else "")).removeprefix("torch."),
        "tokens": sizes,
        "passes": values_text(rows.get("kernel_operation_mode", pd.Series(dtype=str))),
        "timing": timing,
        "measured": measured_at_text(rows),
        "versions": versions,
        "inputs file": inputs_file,
    }


def _ratio_figure(compared: pd.DataFrame, column: str, label: str, cpu: bool = False) -> plt.Figure | None:
    data = compared[compared[column].notna()]
    if data.empty:
        return None
    grid = sns.relplot(
        data=data, x="x_value", y=column, hue="kernel_operation_mode", col="kernel_name", col_wrap=4,
        kind="line", marker="o", height=2.8, aspect=1.2, facet_kws={"sharey": False, "sharex": False},
    )  # fmt: skip
    for kernel, ax in grid.axes_dict.items():
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        if spans_orders_of_magnitude(data.loc[data["kernel_name"] == kernel, column]):
            ax.set_yscale("log")
    grid.set_titles("{col_name}")
    grid.set_axis_labels("tokens (T or BT)", label)
    cpu_note = "\n(a CPU run: Liger's kernels in the Triton interpreter, the times say nothing about speed)"
    cpu_note = cpu_note if cpu else ""
    title_above_panels(grid.figure, f"Liger's {label} against the reference, by size{cpu_note}")
    return grid.figure


def build_kernel_report(
    rows: pd.DataFrame,
    model: str = "",
    not_benchmarked: list[str] | None = None,
    published: pd.DataFrame | None = None,
    sweep: KernelBenchmarkSettings | None = None,
    inputs_file: str = "",
) -> Report:
    """The report of a kernel benchmark's rows; `not_benchmarked`: what Liger ships that has no case here;
    `published`: rows in Liger's benchmark-data format to set beside these; `sweep`: the settings they were
    measured with (the header says how a point was timed); `inputs_file`: the file a local run was given."""
    compared = comparison(rows)
    sections: dict[str, str] = {}
    cpu = ran_on_cpu(rows)
    overview = [card] if (card := kernel_cards(compared)) else []
    overview.append(measured_html(what_was_measured(rows, sweep, model, inputs_file)))
    if cpu:
        overview.append(f'<div class="warning"><b>CPU run.</b> {html.escape(CPU_WARNING)}</div>')
    counts = rows["status"].value_counts()
    gpu = ", ".join(sorted(set(rows.get("gpu_name", pd.Series(dtype=str)).dropna().astype(str)) - {""}))
    measured = (
        f"{rows['kernel_name'].nunique()} kernels, {len(rows)} measurements at {model or 'the'} shapes"
        f"{' on ' + gpu if gpu else ''}: " + ", ".join(f"{n} {status}" for status, n in counts.items())
    )
    overview.append(f"<p>{html.escape(measured)}</p>")
    table = summary(compared)
    if not table.empty:
        overview.append(
            "<p>Per kernel, Liger's full pass (forward and backward) against the reference at every size: speedup "
            "is the reference's time over Liger's (&gt; 1: Liger is faster), memory ratio Liger's peak over the "
            "reference's (&lt; 1: Liger needs less). Within ±5 % is a tie.</p>" + table_html(table)
        )
    paired = releases(rows)
    if not paired.empty:
        overview.append(
            "<p>Per software set, its Liger kernel's full pass against the same kernel of the first set (the "
            "reference): speedup is the reference set's time over this set's (&gt; 1: this set's release is "
            "faster), memory ratio this set's peak over the reference set's. Within ±5 % is a tie.</p>"
            + table_html(releases_summary(paired))
        )
        sections["Releases"] = (
            "<p>Every point of each set's Liger kernel beside the reference set's (medians; the release each "
            "imported in <code>liger_version</code>).</p>" + table_html(paired.round(4))
        )
    if not_benchmarked:
        overview.append(
            "<p>Liger also ships these kernels, not benchmarked here (no reference case): "
            + html.escape(", ".join(not_benchmarked))
            + ".</p>"
        )
    sections["Summary"] = "\n".join(overview)
    for column, label, name in (("speedup", "speedup", "Speed"), ("memory_ratio", "memory ratio", "Memory")):
        fig = _ratio_figure(compared, column, label, cpu) if not compared.empty else None
        sections[name] = figure_html(fig, f"{label} by size") if fig is not None else "<p>Nothing measured.</p>"
    if not compared.empty:
        sections["Figures"] = (
            "<p>Medians (do_bench's 50th percentile; memory: the peak allocated during the call, MB).</p>"
            + table_html(compared.round(4))
        )
    if published is not None:
        matched = against_published(rows, published)
        sections["Against Liger's data"] = (
            "<p>Each point beside the published row with the same kernel, mode, metric and x value (on the same "
            "GPU where the published data has it; <code>published_gpu</code> says which): Liger's time or memory "
            "here and there, and Liger's speedup or memory ratio against the reference in both. The shapes the "
            "published row was measured at are in its <code>extra_benchmark_config_str</code>: compare points "
            "whose shapes agree.</p>" + table_html(matched.round(4))
            if not matched.empty
            else "<p>No published row has the kernel, mode, metric and x value of a point measured here.</p>"
        )
    failures = rows[rows["status"] != OK]
    sections["Failures"] = (
        table_html(
            failures[
                [
                    "kernel_name",
                    "kernel_provider",
                    "kernel_operation_mode",
                    "metric_name",
                    "x_value",
                    "status",
                    "reason",
                ]
            ]
        )
        if not failures.empty
        else "<p>No point failed.</p>"
    )
    # A point, its figures and how it ended first; its shapes, GPU and version (the header's) behind the toggle.
    key = ["kernel_name", "kernel_provider", "kernel_operation_mode", "metric_name", "metric_unit", "x_value",
           "y_value_50", "y_value_20", "y_value_80", "status", "reason"]  # fmt: skip
    sections["Rows"] = compact_table_html(rows, key, "every row")
    return Report(sections=sections, headline=[measured])
