"""The probes figure: every probe's size against its peak memory, per searched dimension, beside the GPU's capacity,
so that a reader sees how close each arm came to it and where the searches ran out of memory."""

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from finetune_bench.frontier.settings import DIMENSIONS
from finetune_bench.frontier.simulated import SIMULATED
from finetune_bench.reporting.html import arm_palette
from finetune_bench.results.record import ERROR, OK, OOM, TIMEOUT

_PROBE_MARKERS = {OK: "o", OOM: "X", ERROR: "s", TIMEOUT: "v"}


def probes_figure(
    probes: pd.DataFrame, gpu_memory_gib: float | None, cpu: bool = False, simulated: bool = False
) -> Figure:
    """Probe size against its peak memory, one panel per dimension, one colour per arm, marker by outcome.
    A probe that did not end ok (out of memory, failed) or measured no peak is drawn on the capacity line, whatever
    it measured before it stopped; where the capacity is unknown (a CPU run), on a dotted out-of-memory line at the
    top of the panel. `cpu`, `simulated`: the title says the probes ran on a CPU, and that the fake memory model ran
    them out of memory."""
    memory, label = "peak_reserved_gib", "peak reserved memory (GiB)"
    if probes[memory].isna().all():
        memory, label = "process_peak_rss_gib", "process peak RSS (GiB, host memory)"
        gpu_memory_gib = None
    ok = probes["status"] == OK
    known = probes.loc[ok, memory].max()
    ceiling = gpu_memory_gib if gpu_memory_gib else (known * 1.1 if pd.notna(known) else 1.0)
    data = probes.assign(plotted_memory_gib=probes[memory].where(ok).fillna(ceiling))
    dimensions = [d for d in DIMENSIONS if d in set(data["dimension"])]
    statuses = [s for s in _PROBE_MARKERS if s in set(data["status"])]
    palette = arm_palette(data["arm"])
    grid = sns.relplot(
        data=data, x="value", y="plotted_memory_gib", hue="arm", style="status", col="dimension",
        col_order=dimensions, style_order=statuses, markers=_PROBE_MARKERS, palette=palette,
        kind="scatter", s=90, alpha=0.8, height=4.2, aspect=1.2, facet_kws={"sharex": False},
    )  # fmt: skip
    for ax, dimension in zip(grid.axes.flat, dimensions, strict=True):
        at = data.loc[data["dimension"] == dimension, "at"].iloc[0]
        ax.set_title(f"{dimension}\n(at {at})")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        ax.set_xlabel(dimension)
        ax.set_ylabel(label)
        ax.set_ylim(0, max(data["plotted_memory_gib"].max(), gpu_memory_gib or 0) * 1.08)
        if gpu_memory_gib:
            ax.axhline(gpu_memory_gib, color="#C00000", linestyle="--", linewidth=1)
            ax.text(ax.get_xlim()[0], gpu_memory_gib, " GPU capacity", va="bottom", color="#C00000", fontsize=8)
        elif not ok.all():
            ax.axhline(ceiling, color="#C00000", linestyle=":", linewidth=1)
            oom = " out of memory (simulated)" if simulated else " out of memory or failed"
            ax.text(ax.get_xlim()[0], ceiling, oom, va="bottom", color="#C00000", fontsize=8)
    notes = [note for note, on in (("a CPU run", cpu), (f"out of memory {SIMULATED}", simulated)) if on]
    title = "Probes: size against peak memory" + (f"\n({'; '.join(notes)})" if notes else "")
    grid.figure.suptitle(title, y=1.15 if notes else 1.1)
    return grid.figure
