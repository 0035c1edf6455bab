"""The memory-frontier report: per arm and dimension the frontier, its peak memory against the GPU's
capacity, every probe, the liger / baseline ratios, and (optionally) throughput measured at the frontier.

The page is assembled here from the frontier's tables (`frontier.tables`), the probes figure
(`frontier.probes_figure`), a claim's section (`frontier.claims.claim_html`) and what the fake memory model
simulated (`frontier.simulated`). Builds on `finetune_bench.reporting` (same page layout, figure embedding and
tables; its full benchmark report is reused for the throughput section).
"""

import html
import itertools
import re
from typing import Any

import pandas as pd

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.frontier.claims import claim_html
from finetune_bench.frontier.probes_figure import probes_figure
from finetune_bench.frontier.search import FOUND, NOTHING_FITS, PROBE_FAILED, REACHED_CAP, FrontierResult
from finetune_bench.frontier.settings import BATCH_SIZE, SEQ_LENGTH, FrontierSearch
from finetune_bench.frontier.simulated import SIMULATED, fake_memory_capacity, oom_lines
from finetune_bench.frontier.tables import (
    MEMORY_COLUMNS,
    borderline_note,
    fixed_setting,
    for_display,
    frontier_ratios,
    frontier_table,
    gpu_memory_gib,
    probes_table,
)
from finetune_bench.inputs.arms import BASELINE
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
    cards_html,
    compact_table_html,
    figure_html,
    wrapping_table_html,
)
from finetune_bench.results.record import OK, OOM
from finetune_bench.running.faults import FAKE_MEMORY_ENV

DIMENSION_LABELS = {BATCH_SIZE: "batch size", SEQ_LENGTH: "sequence length"}
# How a size along each dimension is named in a sentence ("batch 2", "length 64").
SIZE_NAMES = {BATCH_SIZE: "batch", SEQ_LENGTH: "length"}


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


# The columns the Frontiers and Probes tables show, in this order, the verdict first (how the search or probe ended,
# what it found) and why last, where it has room to wrap; every column is behind the table's toggle (and in the CSVs).
# The memory columns are shown where some row has a value (a CPU run's probes measure host memory only).
FRONTIER_COLUMNS = ["arm", "dimension", "status", "frontier", "first_oom", "at", "predicted_frontier",
                    *MEMORY_COLUMNS.values(), "peak_reserved_share_of_gpu", "cap_headroom_gib", "borderline",
                    "reason"]  # fmt: skip
PROBE_COLUMNS = ["arm", "dimension", "value", "status", "phase", "attempt", "at", "wall_time_s",
                 *MEMORY_COLUMNS.values(), "reason"]  # fmt: skip
_SHOWN_IF_MEASURED = {*MEMORY_COLUMNS.values(), "peak_reserved_share_of_gpu", "cap_headroom_gib", "borderline"}


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


def _range_text(search: FrontierSearch) -> str:
    step = f" in steps of {search.granularity}" if search.granularity > 1 else ""
    return f"{DIMENSION_LABELS[search.dimension]} {search.start} to {search.cap}{step} at {fixed_setting(search)}"


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
        summary.append(breakable_cells(wrapping_table_html(for_display(ratios))))
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
    frontiers_html = compact_table_html(for_display(frontiers), _shown(frontiers, FRONTIER_COLUMNS), "the frontiers")
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
