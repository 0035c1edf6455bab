"""The memory-frontier report: per arm and dimension the frontier, its peak memory against the GPU's
capacity, every probe, the liger / baseline ratios, and (optionally) throughput measured at the frontier.

Builds on `finetune_bench.reporting` (same page layout, figure embedding and tables; its full benchmark
report is reused for the throughput section).
"""

import html
import itertools
import re
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.analysis.tables import GIB, hardware_label
from finetune_bench.frontier.claims import CLAIMS, claim_tables
from finetune_bench.frontier.search import (
    FOUND,
    NOTHING_FITS,
    PROBE_FAILED,
    REACHED_CAP,
    FrontierResult,
    Probe,
    frontier_probe,
)
from finetune_bench.frontier.settings import (
    BATCH_SIZE,
    DIMENSIONS,
    SEQ_LENGTH,
    FrontierArm,
    FrontierSearch,
    arm_name,
    arm_overrides,
)
from finetune_bench.inputs.arms import BASELINE
from finetune_bench.prediction.gpus import usable_bytes
from finetune_bench.reporting.benchmark_report import CPU_WARNING, ENVIRONMENT_KEYS, grid_report
from finetune_bench.reporting.benchmark_tabs.environment import KEY_ENVIRONMENT
from finetune_bench.reporting.benchmark_tabs.measured import (
    device_text,
    measured_at_text,
    measured_html,
    settings_text,
    versions_text,
)
from finetune_bench.reporting.html import (
    Report,
    arm_palette,
    cards_html,
    compact_table_html,
    figure_html,
    wrapping_table_html,
)
from finetune_bench.results.record import ERROR, LOST, OK, OOM, TIMEOUT
from finetune_bench.running.faults import FAKE_MEMORY_ENV

DIMENSION_LABELS = {BATCH_SIZE: "batch size", SEQ_LENGTH: "sequence length"}
# How a size along each dimension is named in a sentence ("batch 2", "length 64").
SIZE_NAMES = {BATCH_SIZE: "batch", SEQ_LENGTH: "length"}
# What the fake memory model (`running.faults.check_fake_memory`) writes into an out-of-memory probe's error.
FAKE_MEMORY = re.compile(r"fake memory model(?:: \d+ > (\d+) token units)?")
SIMULATED = "simulated by the fake memory model, not measured"
_PROBE_MARKERS = {OK: "o", OOM: "X", ERROR: "s", TIMEOUT: "v"}
_MEMORY_COLUMNS = {
    "peak_reserved_bytes": "peak_reserved_gib",
    "peak_allocated_bytes": "peak_allocated_gib",
    "nvml_process_peak_bytes": "nvml_process_peak_gib",
    "outside_allocator_peak_bytes": "outside_allocator_gib",
    "process_peak_rss_bytes": "process_peak_rss_gib",
}


def _fixed_setting(search: FrontierSearch) -> str:
    """What the search holds fixed, e.g. `max_seq_length=2048`."""
    other = SEQ_LENGTH if search.dimension == BATCH_SIZE else BATCH_SIZE
    return f"{other}={getattr(search.training_args, other)}"


def _gib(value: float | str | None) -> float | None:
    return float(value) / GIB if value not in (None, "") else None


def gpu_memory_gib(environment: dict[str, str]) -> float | None:
    """The memory of the GPU the probes ran on, in GiB: the one they emulated where `gpu_memory_cap_gib` capped it."""
    if environment.get("gpu_memory_cap_gib"):
        return float(environment["gpu_memory_cap_gib"])
    return _gib(environment.get("gpu_memory_bytes"))


def search_hardware(result: FrontierResult) -> str:
    """What a search's probes trained on (`analysis.tables.hardware_label`), from its environment record."""
    env = result.environment
    return hardware_label(env.get("device_type", ""), env.get("gpu_name", ""), env.get("gpu_memory_cap_gib", ""))


def frontier_table(searches: list[FrontierSearch], results: list[FrontierResult | None]) -> pd.DataFrame:
    """One row per search, in plan order; a search whose task was lost keeps its row (status `lost`)."""
    by_key = {(arm_name(r.search.arm), r.search.dimension): r for r in results if r is not None}
    rows = []
    for search in searches:
        result = by_key.get((arm_name(search.arm), search.dimension))
        row = {"arm": arm_name(search.arm), **arm_overrides(search.arm), "dimension": search.dimension}
        row.update(at=_fixed_setting(search), start=search.start, cap=search.cap, granularity=search.granularity)
        # what the probes trained on, as the results table says it ("cpu", "gpu: <name>"; "" where unknown)
        row["hardware"] = search_hardware(result) if result is not None else ""
        if result is None:
            row.update(status=LOST, reason="the search task failed; no result came back")
            rows.append(row)
            continue
        row.update(
            status=result.status,
            frontier=result.frontier,
            predicted_frontier=result.predicted_frontier,
            first_oom=result.first_oom,
            probes_used=result.probes_used,
            device_seconds=result.device_seconds,
        )
        at_frontier = frontier_probe(result)
        if at_frontier is not None:
            row.update({column: _gib(getattr(at_frontier, key)) for key, column in _MEMORY_COLUMNS.items()})
        row["gpu_memory_gib"] = gpu_memory_gib(result.environment)
        row["cap_headroom_gib"] = cap_headroom_gib(result.environment, at_frontier)
        row["reason"] = result.reason
        rows.append(row)
    table = pd.DataFrame(rows)
    integers = ("frontier", "predicted_frontier", "first_oom", "probes_used")
    for column in (*integers, "device_seconds", "gpu_memory_gib", *_MEMORY_COLUMNS.values()):
        if column not in table:
            table[column] = None
    for column in integers:
        table[column] = table[column].astype("Int64")
    for column in ("device_seconds", "gpu_memory_gib", "cap_headroom_gib", *_MEMORY_COLUMNS.values()):
        if column not in table:
            table[column] = None
        table[column] = table[column].astype(float)
    table["peak_reserved_share_of_gpu"] = table["peak_reserved_gib"] / table["gpu_memory_gib"]
    # measured only under a cap, with the memory outside the allocator known
    known = table["cap_headroom_gib"].notna() & table["outside_allocator_gib"].notna()
    borderline = table["cap_headroom_gib"] < table["outside_allocator_gib"]
    table["borderline"] = pd.Series(
        [bool(b) if k else None for b, k in zip(borderline, known, strict=True)], dtype=object
    )
    return table


def cap_headroom_gib(environment: dict[str, str], at_frontier: Probe | None) -> float | None:
    """Under a memory cap (`gpu_memory_cap_gib`, a smaller card emulated): what torch's cap left above the frontier's
    last fit (the cap less its peak reserve), in GiB; None without a cap or a fit. A frontier whose headroom is less
    than the memory its run held outside the allocator (`outside_allocator_gib`) is borderline: the cap allows for
    `catalog.CUDA_CONTEXT_BYTES` outside torch, and the run needed more, so on a real card of that size the fit may
    run out of memory."""
    cap = environment.get("gpu_memory_cap_gib")
    if not cap or at_frontier is None or at_frontier.peak_reserved_bytes is None:
        return None
    return (usable_bytes(float(cap) * GIB) - at_frontier.peak_reserved_bytes) / GIB


def borderline_note(row: Any) -> str:
    """Why a frontier is borderline ("" where it is not): its headroom under the cap and the memory outside the
    allocator it lies within."""
    flag = getattr(row, "borderline", None)
    if not (pd.notna(flag) and bool(flag)):
        return ""
    return (
        f"borderline: its last fit came within {row.cap_headroom_gib:.2f} GiB of the cap, and the run held "
        f"{row.outside_allocator_gib:.2f} GiB outside torch's allocator: on a real {row.gpu_memory_gib:g} GiB card "
        "it may run out of memory"
    )


def probes_table(results: list[FrontierResult | None]) -> pd.DataFrame:
    """Every probe of every search, in the order it ran."""
    rows = []
    for result in results:
        if result is None:
            continue
        for number, probe in enumerate(result.probes, start=1):
            row = {"arm": arm_name(result.search.arm), **arm_overrides(result.search.arm)}
            row.update(dimension=result.search.dimension, at=_fixed_setting(result.search))
            row.update(hardware=search_hardware(result), probe=number)
            row.update(value=probe.value, phase=probe.phase, attempt=probe.attempt, status=probe.status)
            row["wall_time_s"] = probe.wall_time_s
            row.update({column: _gib(getattr(probe, key)) for key, column in _MEMORY_COLUMNS.items()})
            row.update(measured_at=probe.measured_at, reason=probe.reason, error_tail=probe.error_tail)
            rows.append(row)
    columns = ["arm", "dimension", "at", "hardware", "probe", "value", "phase", "attempt", "status", "wall_time_s"]
    table = pd.DataFrame(rows, columns=None if rows else columns)
    for column in _MEMORY_COLUMNS.values():
        table[column] = table[column].astype(float) if column in table else float("nan")
    return table


def frontier_ratios(frontiers: pd.DataFrame) -> pd.DataFrame:
    """Per dimension (and setting held fixed) and per arm other than the baseline: its frontier over the
    baseline's."""
    if BASELINE not in set(frontiers["arm"]) or frontiers["arm"].nunique() < 2:
        return pd.DataFrame()
    keys = ["dimension", "at", *_other_arm_fields(frontiers)]
    base = frontiers[frontiers["arm"] == BASELINE][[*keys, "frontier", "status"]]
    others = frontiers[frontiers["arm"] != BASELINE][["arm", *keys, "frontier", "status"]]
    out = others.merge(base, on=keys, suffixes=("", "_baseline")).rename(
        columns={"frontier": "arm_frontier", "status": "arm_status", "frontier_baseline": "baseline_frontier",
                 "status_baseline": "baseline_status"}
    )  # fmt: skip
    out["ratio"] = out["arm_frontier"].astype("Float64") / out["baseline_frontier"].astype("Float64")
    out["note"] = [
        _ratio_note(arm, *statuses)
        for arm, statuses in zip(out["arm"], zip(out["arm_status"], out["baseline_status"], strict=True), strict=True)
    ]
    return out[["dimension", "at", *keys[2:], "arm", "arm_frontier", "arm_status", "baseline_frontier",
                "baseline_status", "ratio", "note"]]  # fmt: skip


def _other_arm_fields(frontiers: pd.DataFrame) -> list[str]:
    return [name for name in arm_overrides(FrontierArm()) if name != "arm" and name in frontiers]


def _ratio_note(arm_name: str, arm_status: str, baseline_status: str) -> str:
    notes = []
    for arm, status in ((arm_name, arm_status), (BASELINE, baseline_status)):
        if status == REACHED_CAP:
            notes.append(f"{arm} reached the cap (its frontier is a lower bound)")
        elif status == PROBE_FAILED:
            notes.append(f"{arm}'s search stopped on a failing probe (its frontier is a lower bound)")
        elif status == NOTHING_FITS:
            notes.append(f"nothing fits for {arm}")
        elif status != FOUND:
            notes.append(f"{arm}: {status}")
    return "; ".join(notes)


def frontier_text(row: Any) -> str:
    """A frontier as a reader should take it: exact (and the size that runs out of memory), a lower bound, or none."""
    size = SIZE_NAMES.get(row.dimension, "size")
    borderline = f"; {borderline_note(row)}" if borderline_note(row) else ""
    if row.status == FOUND:
        return f"{row.frontier} ({size} {row.first_oom} runs out of memory{borderline})"
    if row.status == REACHED_CAP:
        return f"≥ {row.frontier} (reached the cap{borderline})"
    if row.status == PROBE_FAILED:
        return f"≥ {row.frontier} (search stopped: a probe kept failing)" if pd.notna(row.frontier) else "unknown"
    if row.status == NOTHING_FITS:
        return f"none (the start value, {size} {row.start}, runs out of memory)"
    return row.status


def frontier_cards(frontiers: pd.DataFrame, simulated: bool = False) -> str:
    """The answer at a glance: a card per arm, its largest batch or sequence per dimension (≥ where the search stopped
    short of the frontier) and, beside a baseline, the ratio of the two; "" without a frontier."""
    if frontiers.empty:
        return ""
    ratios = frontier_ratios(frontiers)
    cards = []
    for arm, group in frontiers.groupby("arm", sort=False):
        figures = []
        for row in group.itertuples():
            value = "none" if pd.isna(row.frontier) else f"{int(row.frontier):,}"
            lower = row.status in (REACHED_CAP, PROBE_FAILED) and pd.notna(row.frontier)
            figures.append((("≥ " if lower else "") + value, f"largest {DIMENSION_LABELS[row.dimension]} at {row.at}"))
            if ratios.empty:
                continue
            mine = ratios[(ratios["arm"] == arm) & (ratios["dimension"] == row.dimension) & (ratios["at"] == row.at)]
            if not mine.empty and pd.notna(mine["ratio"].iloc[0]):
                figures.append((f"×{mine['ratio'].iloc[0]:.2f}", "the baseline's"))
        cards.append((str(arm), figures))
    note = (
        "The frontier: the largest size that trained; ≥: a lower bound (the search reached its cap or a probe kept "
        "failing)."
    )
    return cards_html(cards, note + (f" Out of memory {SIMULATED}." if simulated else ""))


def headlines(frontiers: pd.DataFrame, simulated: bool = False) -> list[str]:
    """Per dimension: every arm's frontier, and where liger trains what the baseline cannot; `simulated`: the
    out-of-memory results came from the fake memory model, and each line says so."""
    lines = []
    for (dimension, at), group in frontiers.groupby(["dimension", "at"], sort=False):
        label = DIMENSION_LABELS[dimension]
        parts = ", ".join(f"{row.arm} {frontier_text(row)}" for row in group.itertuples())
        lines.append(f"Largest {label} at {at}: {parts}" + (f" (out of memory {SIMULATED})." if simulated else "."))
        treated = group[(group["arm"] != BASELINE) & group["frontier"].notna()]
        baseline = group[(group["arm"] == BASELINE) & group["first_oom"].notna()]
        for lig, base in itertools.product(treated.itertuples(), baseline.itertuples()):
            if lig.frontier >= base.first_oom:
                line = f"With {lig.arm}, {label} {lig.frontier} trains where the baseline runs out of memory"
                line += f" (from {SIZE_NAMES[dimension]} {base.first_oom})"
                if pd.notna(base.frontier):
                    at_least = "at least " if lig.status in (REACHED_CAP, PROBE_FAILED) else ""
                    line += f": {at_least}×{lig.frontier / base.frontier:.2f} the baseline's frontier"
                lines.append(line + (f" ({SIMULATED})." if simulated else "."))
    return lines


def fake_memory_capacity(probes: pd.DataFrame) -> str | None:
    """Where the fake memory model ran probes out of memory (`running.faults.check_fake_memory`): its capacity in
    token units ("" where no probe's error says it); None where no probe ran out of the fake memory."""
    found = None
    for column in ("reason", "error_tail"):
        for text in probes.get(column, pd.Series(dtype=str)).dropna().astype(str):
            for capacity in (m.group(1) for m in FAKE_MEMORY.finditer(text)):
                found = capacity or found or ""
    return found


def oom_lines(probes: pd.DataFrame) -> list[str]:
    """One line per probe that ran out of memory, as a search expects some to (where its error's tail was kept: the
    probes table and the Probes tab); one the fake memory model ran out of memory is "simulated"."""
    if probes.empty:
        return []
    ooms = probes[probes["status"] == OOM]
    kind = "simulated" if fake_memory_capacity(ooms) is not None else "expected"
    return [
        f"{kind} out of memory: {row.arm}, {row.dimension} {row.value}"
        + (f" ({row.reason})" if isinstance(row.reason, str) and row.reason else "")
        for row in ooms.itertuples()
    ]


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


# The columns the Frontiers and Probes tables show, in this order, the verdict first (how the search or probe ended,
# what it found) and why last, where it has room to wrap; every column is behind the table's toggle (and in the CSVs).
# The memory columns are shown where some row has a value (a CPU run's probes measure host memory only).
FRONTIER_COLUMNS = ["arm", "dimension", "status", "frontier", "first_oom", "at", "predicted_frontier",
                    *_MEMORY_COLUMNS.values(), "peak_reserved_share_of_gpu", "cap_headroom_gib", "borderline",
                    "reason"]  # fmt: skip
PROBE_COLUMNS = ["arm", "dimension", "value", "status", "phase", "attempt", "at", "wall_time_s",
                 *_MEMORY_COLUMNS.values(), "reason"]  # fmt: skip
_SHOWN_IF_MEASURED = {*_MEMORY_COLUMNS.values(), "peak_reserved_share_of_gpu", "cap_headroom_gib", "borderline"}


def _shown(table: pd.DataFrame, columns: list[str]) -> list[str]:
    """`columns` as a page 1,400 px wide shows them: those the table has, less memory figures no row measured (a
    sixteen-column table of unbreakable names and numbers does not fit; the rest is behind the toggle)."""
    return [
        column
        for column in columns
        if column in table and (column not in _SHOWN_IF_MEASURED or table[column].notna().any())
    ]


# A word this long in a table cell may break after an underscore, =, :, / or comma: `per_device_train_batch_size=1`,
# or the PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True of an out-of-memory reason, would keep its column (and the
# table) wider than the page.
LONG_WORD = 20


def breakable_cells(fragment: str) -> str:
    """`fragment`'s tables with a place to break (<wbr>) after each underscore, =, :, / or comma of a word of
    LONG_WORD characters or more in a cell; the text is unchanged (copied or searched, it reads the same)."""
    long_word = re.compile(r"\S{" + str(LONG_WORD) + ",}")

    def breakable(word: re.Match) -> str:
        return re.sub(r"([_=:/,])(?=.)", r"\1<wbr>", word.group(0))

    def cell(match: re.Match) -> str:
        return "<td>" + long_word.sub(breakable, match.group(1)) + "</td>"

    return re.sub(r"<td>([^<]*)</td>", cell, fragment)


def _for_display(table: pd.DataFrame) -> pd.DataFrame:
    """Nullable numeric columns (Int64, Float64) as floats, so that a missing value shows as the report's dash."""
    nullable = [
        c
        for c in table.columns
        if isinstance(table[c].dtype, pd.api.extensions.ExtensionDtype) and pd.api.types.is_numeric_dtype(table[c])
    ]
    return table.astype(dict.fromkeys(nullable, float))


def _range_text(search: FrontierSearch) -> str:
    step = f" in steps of {search.granularity}" if search.granularity > 1 else ""
    return f"{DIMENSION_LABELS[search.dimension]} {search.start} to {search.cap}{step} at {_fixed_setting(search)}"


def _ranks_a_probe(searches: list[FrontierSearch], environment: dict[str, str]) -> str:
    """ ", 4 GPUs a probe" where the probes train on several GPUs (", 2 ranks a probe" on a CPU); "" on one."""
    ranks = max((s.training_args.world_size for s in searches), default=1)
    unit = "ranks" if environment.get("device_type") == "cpu" else "GPUs"
    return f", {ranks} {unit} a probe" if ranks > 1 else ""


def what_was_measured(
    searches: list[FrontierSearch],
    environment: dict[str, str],
    gpu_memory_gib: float | None,
    fake: str | None,
    runs: pd.DataFrame | None = None,
) -> dict[str, str]:
    """The report's header: the hardware, whether its memory was simulated (`fake`: the fake memory model's
    capacity, None where it was off), the model, dataset and settings the probes trained with, what was searched,
    the steps of a probe, when the probes and throughput runs (`runs`, with their `measured_at`) ran, the versions
    and the code, and the inputs file, those the searches and their environment record carry."""
    settings = [search.training_args for search in searches]
    steps = settings_text(settings, "max_steps")
    return {
        "hardware": device_text(environment, gpu_memory_gib) + _ranks_a_probe(searches, environment),
        "memory": "" if fake is None else (
            f"simulated: the fake memory model ({FAKE_MEMORY_ENV}{'=' + fake if fake else ''}) runs a probe out of "
            "memory, not the device"
        ),
        "model": settings_text(settings, "model_name"),
        "dataset": settings_text(settings, "dataset_name"),
        "backend": settings_text(settings, "backend"),
        "dtype": settings_text(settings, "dtype"),
        "searched": "; ".join(dict.fromkeys(_range_text(search) for search in searches)),
        "steps": f"{steps} per probe" if steps else "",
        "measured": measured_at_text(runs) if runs is not None else "",
        "versions": versions_text(environment),
        "inputs file": environment.get("inputs_file", ""),
    }  # fmt: skip


def claim_html(name: str, searches: list[FrontierSearch], frontiers: pd.DataFrame, simulated: bool) -> str:
    """The claim named `name` beside what the searches measured, and its setup beside theirs."""
    claim = CLAIMS[name]
    claimed, setups = claim_tables(name, searches, frontiers)
    note = f" ({SIMULATED}: this checks the report, not the claim)" if simulated else ""
    return (
        f"<h3>The claim and the measurement</h3><p>{html.escape(claim.source)}: “{html.escape(claim.statement)}” "
        f"Along {html.escape(claim.dimension)}: what it says of each arm, and what the searches measured"
        f"{html.escape(note)}. agrees: the size claimed to train trains here, and the size claimed to run out of "
        "memory is at or above the first size that ran out here.</p>"
        + wrapping_table_html(_for_display(claimed))
        + "<p>The setups: the claim's as its source states it, this frontier's from its settings.</p>"
        + wrapping_table_html(setups)
    )


def build_frontier_report(
    searches: list[FrontierSearch],
    results: list[FrontierResult | None],
    throughput: GridAnalysis | None = None,
    inputs_file: str = "",
    claim: str = "",
) -> Report:
    """The report: frontiers and ratios, every probe, and throughput at the frontiers when it was measured;
    `inputs_file`: the file a local run was given (its header names it); `claim`: a published claim
    (`frontier.claims.CLAIMS`) set beside what was measured."""
    frontiers = frontier_table(searches, results)
    probes = probes_table(results)
    environment = dict(next((r.environment for r in results if r is not None and r.environment), {}))
    if inputs_file:
        environment["inputs_file"] = inputs_file
    gpu_memory = gpu_memory_gib(environment)
    cpu = environment.get("device_type") == "cpu"
    fake = fake_memory_capacity(probes)
    simulated = fake is not None
    seconds = "CPU seconds" if cpu else "GPU seconds"
    sections: dict[str, str] = {}

    tables = [probes, throughput.table if throughput is not None else pd.DataFrame()]
    times = [table["measured_at"] for table in tables if "measured_at" in table and not table.empty]
    runs = pd.DataFrame({"measured_at": pd.concat(times, ignore_index=True) if times else pd.Series(dtype=str)})
    header = what_was_measured(searches, environment, gpu_memory, fake, runs)
    summary = [card] if (card := frontier_cards(frontiers, simulated)) else []
    summary.append(measured_html(header))
    if cpu:
        summary.append(f'<div class="warning"><b>CPU run.</b> {html.escape(CPU_WARNING)}</div>')
    if simulated:
        summary.append(
            '<div class="warning"><b>Simulated out of memory.</b> Every out-of-memory result here comes from the fake '
            f"memory model ({FAKE_MEMORY_ENV}{'=' + fake if fake else ''}: a probe whose batch size × sequence length, "
            "doubled for a baseline arm, exceeds that many token units fails at its first step), not from the "
            "device's memory. The frontiers and ratios show that the searches and the report work; they say nothing "
            "about how much memory Liger saves.</div>"
        )
    summary.append("".join(f"<p><b>{html.escape(line)}</b></p>" for line in headlines(frontiers, simulated)))
    ratios = frontier_ratios(frontiers)
    if not ratios.empty:
        if simulated:
            ratios["note"] = [f"{note}; {SIMULATED}" if note else SIMULATED for note in ratios["note"]]
        summary.append("<h3>Liger against the baseline</h3><p>ratio: liger's frontier / the baseline's.</p>")
        summary.append(breakable_cells(wrapping_table_html(_for_display(ratios))))
    if claim:
        summary.append(claim_html(claim, searches, frontiers, simulated))
    summary.append(
        "<h3>Frontiers</h3><p>Per arm and dimension: the largest size that trains, the smallest seen to run out "
        f"of memory{' (simulated)' if simulated else ''}, the peak memory of the probe at the frontier (GiB) against "
        f"the GPU's capacity, and what the search cost (behind the toggle: probes_used, and device_seconds: the "
        f"{seconds} its probes took, the sum of their wall times). predicted_frontier: where the memory model put it; "
        "a guided search starts there (its probes are marked predicted / interpolation), an empty one is a doubling "
        "search.</p>"
    )
    frontiers_html = compact_table_html(_for_display(frontiers), _shown(frontiers, FRONTIER_COLUMNS), "the frontiers")
    summary.append(breakable_cells(frontiers_html))
    summary.append(
        "<p>"
        + html.escape(
            f"{int(frontiers['probes_used'].sum())} probes, {frontiers['device_seconds'].astype(float).sum():,.0f} "
            f"{seconds} in all."
        )
        + "</p>"
    )
    env_items = {k: v for k, v in environment.items() if k in ENVIRONMENT_KEYS}
    if gpu_memory:
        env_items["gpu_memory_gib"] = f"{gpu_memory:.1f}"
    if env_items:
        summary.append(compact_table_html(pd.DataFrame([env_items]), KEY_ENVIRONMENT, "the environment"))
    sections["Frontier"] = "\n".join(summary)

    if probes.empty:
        sections["Probes"] = "<p>No probe ran.</p>"
    else:
        parts = [
            figure_html(probes_figure(probes, gpu_memory, cpu, simulated), "probes: size against peak memory"),
            "<p>One point per probe (retries and re-probes included). A probe that ran out of memory"
            + (f" ({SIMULATED})" if simulated else "")
            + ", failed or measured no peak is drawn on the GPU's capacity line, whatever it measured before it "
            "stopped; where the capacity is unknown"
            + (" (a CPU run, whose figure is host memory)" if cpu else "")
            + ", on the dotted out-of-memory line at the top of the panel.</p>",
            # what ran where and when is the header's; the CSV keeps it per probe
            breakable_cells(
                compact_table_html(
                    probes.drop(columns=["error_tail", "hardware", "measured_at"]),
                    _shown(probes, PROBE_COLUMNS),
                    "the probes",
                )
            ),
        ]
        for row in probes[~probes["status"].isin([OK, OOM])].itertuples():
            parts.append(
                f"<h3>{html.escape(f'{row.arm}, {row.dimension}={row.value} (try {row.attempt}): {row.status}')}</h3>"
                f"<p>{html.escape(str(row.reason))}</p><pre>{html.escape(str(row.error_tail or ''))}</pre>"
            )
        sections["Probes"] = "\n".join(parts)

    if throughput is None or throughput.table.empty:
        sections["Throughput"] = "<p>Throughput was not measured at the frontier (measure_throughput is off).</p>"
    else:
        benchmark = grid_report(throughput).sections
        intro = (
            "<p>Full-length runs (the training settings' max_steps, repeated n_runs times) of every arm at its own "
            "batch frontier and at the largest batch every arm fits.</p>"
        )
        sections["Throughput"] = intro + "\n".join(
            f"<h3>{html.escape(name)}</h3>{benchmark[name]}"
            for name in ("Summary", "Throughput", "Memory", "Conditions")
            if name in benchmark
        )
    return Report(sections=sections, headline=headlines(frontiers, simulated) + oom_lines(probes))
