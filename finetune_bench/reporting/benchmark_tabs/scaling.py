"""The Scaling tab (runs on several GPUs): throughput against GPUs with the ideal line, each condition's scaling
efficiency, and every rank."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from finetune_bench.analysis.grid import GridAnalysis  # noqa: E402
from finetune_bench.reporting.benchmark_tabs.figures import with_arm  # noqa: E402
from finetune_bench.reporting.html import figure_html, table_html  # noqa: E402


def scaling_figure(scaling: pd.DataFrame, swept: list[str]) -> plt.Figure | None:
    """Tokens/s against the number of GPUs per arm (one line per other setting), with each line's ideal: its
    one-GPU throughput times the GPUs."""
    data = with_arm(scaling).dropna(subset=["tokens_per_second"])
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


def scaling_tab(a: GridAnalysis) -> str | None:
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
    figure = scaling_figure(scaling, swept)
    if figure is not None:
        parts.append(figure_html(figure, "tokens per second against GPUs"))
    parts.append(table_html(scaling))
    if not ranks.empty:
        parts.append("<h3>Every rank</h3>" + table_html(ranks))
    return "\n".join(parts)
