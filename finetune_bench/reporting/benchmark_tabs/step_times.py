"""The Step times tab: every step's duration per condition, the steady-state throughput explained, and the runs
that slow steps moved."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from finetune_bench.analysis.cold_runs import counted  # noqa: E402
from finetune_bench.analysis.grid import GridAnalysis  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.figures import readable_log_axis, with_arm  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.summary import cpu_timings_note  # noqa: E402
from finetune_bench.reporting.html import arm_order, arm_palette, compact_table_html, figure_html  # noqa: E402

# What the slow new-shape steps are, where it is known, and what makes them go away.
NEW_SHAPE_CAUSE = (
    "<p><b>What a new shape costs.</b> With SDPA attention on a GPU, PyTorch runs cuDNN's attention "
    "kernel where it can (the profile's <code>attention_kernel</code>: <code>cudnn</code>), and cuDNN builds an "
    "execution plan for each new sequence length, on the host, in the forward and the backward pass: on an H200 a "
    "Llama-3.2-1B step 0.1-0.2 s more per length (profiled: the host time is in <code>aten::_cudnn_attention_forward"
    "</code> and <code>_backward</code>: docs/measurements.md). "
    "The <code>shape_probes</code> after the timed steps step twice at each of up to <code>new_shape_probes</code> of "
    "the lengths a fine-tune meets, spread over their range: the first step prices the new length, the second is a "
    "step at a known shape, so the Summary's projection has its step-time line even where every timed step met a new "
    "length. A plan build is not counted per step (only a profiler "
    "sees it): the steps it can fall in are those marked <code>new_shape</code>. <b>The first run on a machine</b> "
    "pays more, once: seconds of warm-up, and 1.5-3 s a step at the first few lengths of some kinds, while the CUDA "
    "driver compiles kernels for the GPU and keeps them in its JIT cache on disk (<code>CUDA_CACHE_PATH</code>, else "
    "<code>~/.nv/ComputeCache</code>), and Triton compiles Liger's kernels into its own "
    "(<code>TRITON_CACHE_DIR</code>, else <code>~/.triton/cache</code>); no later run sharing those caches pays them "
    "again. The per-step column "
    "<code>jit_cache_bytes</code> counts them (the caches' growth in the step, named in an outlier step's "
    "description), and the projection prices no length with such a step or probe. <b>Remedies that work:</b> for the "
    "plans, <code>pad_to_multiple_of: 64</code> leaves a few lengths (about 5 % of the steady throughput spent on "
    "padding), <code>packing: true</code> one, <code>attention: efficient</code> pays almost nothing per length but is "
    "12-15 % slower at the steady state; at one unpacked row a batch (no attention mask), "
    "<code>cudnn_any_length: true</code> has cuDNN reuse one plan per power-of-two length; for the one-time "
    "compilations, caches the pods share "
    "(<code>CUDA_CACHE_PATH</code> and <code>TRITON_CACHE_DIR</code> on a volume), or <code>n_runs</code> of 3 or "
    "more, whose medians leave a cold first "
    "run out (docs/measurements.md).</p>"
)


def step_time_figure(steps: pd.DataFrame, swept: list[str]) -> plt.Figure | None:
    """Every step's duration per condition: the measured steps as a box, warm-up steps as red crosses."""
    if steps is None or steps.empty or "step_time_s" not in steps:
        return None
    data = with_arm(steps).copy()
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
    ax.set_xlabel("step time (s, log scale)")
    ax.set_ylabel("")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("Step times per condition (warm-up steps excluded from the boxes)")
    fig.tight_layout()
    readable_log_axis(ax.xaxis)
    return fig


def new_length_prices(a: GridAnalysis) -> pd.DataFrame:
    """Per condition whose runs were projected: the median price of a step at a new length (beyond the step-time
    line), how many such steps the fine-tune meets, and the share of its projected time they make."""
    columns = ["new_shape_price_s", "fine_tune_new_shape_steps", "new_shape_share"]
    if any(column not in a.table for column in columns):
        return pd.DataFrame()
    runs = counted(a.table)
    runs = runs[runs["projected_fine_tune_s"].notna()] if "projected_fine_tune_s" in runs else runs.iloc[0:0]
    if runs.empty:
        return pd.DataFrame()
    return runs.groupby("condition_id", sort=False)[columns].median().reset_index()


def step_times_tab(a: GridAnalysis) -> str:
    times = step_time_figure(a.steps, a.swept)
    if times is None:
        return "<p>No run recorded a step.</p>"
    parts = [
        cpu_timings_note(a),
        figure_html(times, "step time distribution"),
        "<p>A timed step that fed a batch shape its run had not fed before (on several GPUs: any rank) can be slow "
        "once: kernels and libraries specialise for the shape. The <b>steady-state throughput</b> counts every timed "
        "step's tokens at the time the steps that met no new shape take for their size (a robust line of step time "
        "against padded tokens), so no single slow step moves it; the <b>new-shape cost</b> is what the new-shape "
        "steps took beyond that (columns <code>steady_tokens_per_second</code>, <code>new_shape_steps</code>, "
        "<code>new_shape_cost_s</code>, <code>outlier_steps</code> in the Runs table).</p>",
        NEW_SHAPE_CAUSE,
    ]
    prices = new_length_prices(a)
    if not prices.empty:
        best = ""
        if not a.remedies.empty:
            top = a.remedies.iloc[0]
            best = (
                f" Measured here, the fastest configuration is <b>{top['configuration']}</b> "
                f"(×{top['speedup']:.2f} the fine-tune as configured; Summary: which change buys most)."
            )
        parts.append(
            "<h3>What a new length costs, per configuration</h3><p>The median over each condition's runs in the "
            "answer: "
            "what a step at a length its run had never met took beyond the step-time line (<code>new_shape_price_s"
            "</code>), how many such steps your fine-tune meets, and the share of its projected time they make. "
            "Packing leaves one shape, <code>pad_to_multiple_of</code> a few, <code>attention: efficient</code> builds "
            "no plan per length, and <code>cudnn_any_length</code> (one row a batch) one plan per power of two."
            + best
            + "</p>"
            + compact_table_html(prices, list(prices.columns), "these conditions")
        )
    if not a.skewed_runs.empty:
        parts.append(
            "<h3>Runs moved by slow steps</h3><p>Runs whose throughput over all timed steps differs from their steady "
            "state by more than the A/A noise floor (3 % without an A/A arm); <code>timing_skew</code> is steady over "
            "all-steps throughput, less 1.</p>"
            # the condition's id repeats its axes: behind the toggle
            + compact_table_html(a.skewed_runs, [c for c in a.skewed_runs if c != "condition_id"], "these runs")
        )
    return "\n".join(parts)
