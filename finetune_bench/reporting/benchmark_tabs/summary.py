"""The Summary tab: what was measured, then the answer: what was not kept, the runs' statuses, one verdict per
arm (and, where the grid swept the software set, the set to run per arm), how sure, what fits, what to run, whether
the loss still matches, and the environment."""

import html

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.analysis.remedies import shown
from finetune_bench.analysis.tables import ran_on_cpu
from finetune_bench.reporting.benchmark_tabs.energy import energy_and_cost_html
from finetune_bench.reporting.benchmark_tabs.environment import environment_html
from finetune_bench.reporting.benchmark_tabs.headline_card import headline_card_html
from finetune_bench.reporting.benchmark_tabs.how_sure import how_sure_html
from finetune_bench.reporting.benchmark_tabs.measured import what_was_measured_html
from finetune_bench.reporting.html import table_html

CPU_WARNING = (
    "These runs happened on a CPU. Their timings say nothing about Liger's speed: on a CPU the "
    "liger arm runs its Triton kernels in the Triton interpreter, about 100x slower than eager "
    "PyTorch. Use a CPU run only to check that the workflow works; measure on a GPU."
)


def cpu_timings_note(a: GridAnalysis) -> str:
    """The line a tab of timing figures opens with when the runs trained on a CPU ("" otherwise)."""
    if not ran_on_cpu(a.table):
        return ""
    return (
        '<div class="warning"><b>CPU run.</b> These figures time a CPU, Liger\'s kernels in the Triton interpreter: '
        "they say nothing about Liger's speed.</div>"
    )


def headline(a: GridAnalysis) -> list[str]:
    """The Summary's first line as plain text, for a console: how the runs ended, how many were reused (on a CPU,
    that its timings say nothing about speed), then each arm's verdict on the user's whole fine-tune, each arm's
    verdict on what was measured and, where the grid swept software sets, the set to run per arm."""
    table = a.table
    counts = ", ".join(f"{n} {status}" for status, n in table["status"].value_counts().items())
    first = f"{len(table)} runs of {table['condition_id'].nunique()} conditions: {counts}"
    reused = int(table["reused"].fillna(False).astype(bool).sum()) if "reused" in table else 0
    if reused:
        first += f", {reused} of them reused from the results store"
    if ran_on_cpu(table):
        first += " (on a CPU: the timings say nothing about Liger's speed)"
    cold = [a.cold_note] if a.cold_note else []
    return [first, *a.remedy_lines, *a.fine_tune_verdicts, *cold, *a.verdicts, *a.version_verdicts]


# The Recommendation's columns of GPU memory: a CPU run has none.
GPU_MEMORY_COLUMNS = ("peak_reserved_gib", "headroom_gib", "headroom_share")


def remedies_html(a: GridAnalysis) -> str:
    """Every configuration ranked by the projected time of the whole fine-tune ("" where none is ranked)."""
    if a.remedies.empty:
        return ""
    lines = "".join(f"<p><b>{html.escape(line)}</b></p>" for line in a.remedy_lines)
    return (
        "<h3>Which change buys most</h3>"
        + lines
        + "<p>Every configuration the grid swept, fastest first: the projected time of your whole fine-tune "
        f"({html.escape(a.fine_tune.describe())}) on your data, the median of its runs in the answer, beside how much "
        "faster than as configured (the baseline at each axis's first listed value), its runs' range and what a step "
        "at a new length cost it (docs/report.md#which-change-buys-most).</p>" + table_html(shown(a.remedies))
    )


def recommendation_html(a: GridAnalysis) -> str:
    """Per arm, the fastest configuration whose runs all finished, and (on a GPU) the memory it leaves free; then
    every configuration ranked by the fine-tune's projected time, where the grid swept more than the arm."""
    if ran_on_cpu(a.table):
        return (
            "<h3>Recommendation</h3><p>Per arm, the fastest configuration whose runs all finished (none ran out of "
            "memory). These runs trained on a CPU: there is no GPU memory to leave free, and the timings say nothing "
            "about a GPU's.</p>" + table_html(a.recommended.drop(columns=list(GPU_MEMORY_COLUMNS), errors="ignore"))
        )
    return (
        "<h3>Recommendation</h3><p>Per arm, the fastest configuration whose runs all finished (none ran out "
        "of memory), and the GPU memory it leaves free (capacity minus peak reserved)"
        + (
            f": ranked by the projected throughput of your whole fine-tune ({html.escape(a.fine_tune.describe())})"
            if "projected_tokens_per_second" in a.recommended
            else ""
        )
        + ".</p>"
        + table_html(a.recommended)
        + remedies_html(a)
    )


def summary_tab(a: GridAnalysis, experiment_name: str, notes: list[str]) -> str:
    """The answer at a glance (`headline_card_html`), what was measured, then the answer in words: what was not kept,
    the runs' statuses, one verdict per arm, how sure, what fits, what to run, whether the loss still matches, and the
    environment."""
    table = a.table
    overview = [card] if (card := headline_card_html(a)) else []
    if header := what_was_measured_html(a):
        overview.append(header)
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
    if a.cold_note:
        overview.append(f'<div class="warning"><b>Cold runs.</b> {html.escape(a.cold_note)}</div>')
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
    overview.extend(f'<p class="verdict"><b>{html.escape(line)}</b></p>' for line in a.remedy_lines)
    overview.extend(f'<p class="verdict"><b>{html.escape(line)}</b></p>' for line in a.fine_tune_verdicts)
    overview.extend(f'<p class="verdict">{html.escape(line)}</p>' for line in a.verdicts)
    overview.extend(f'<p class="verdict">{html.escape(line)} (see Versions)</p>' for line in a.version_verdicts)
    overview.extend(f'<div class="warning"><b>Batch shapes.</b> {html.escape(line)}</div>' for line in a.shape_notes)
    overview.extend(
        f'<p class="verdict">{html.escape(line)} (Memory: which phase sets the peak)</p>' for line in a.hidden_savings
    )
    if not a.skewed_runs.empty:
        overview.append(
            f'<div class="warning"><b>Slow steps.</b> {len(a.skewed_runs)} run(s) whose throughput over all timed '
            "steps differs from their steady state by more than the noise floor: see Step times."
            + (f" {html.escape(a.skewed_compile_note)}." if a.skewed_compile_note else "")
            + "</div>"
        )
    if not a.paired.empty:
        overview.append(how_sure_html(a))
    overview.append(energy_and_cost_html(a))
    if not a.fitting.empty:
        overview.append(
            "<h3>What fits</h3><p>The largest batch size with an ok run, and the smallest that ran out of memory, "
            "per arm.</p>" + table_html(a.fitting)
        )
    if not a.recommended.empty:
        overview.append(recommendation_html(a))
    overview.extend(f"<p><b>{html.escape(line)}</b></p>" for line in (a.parity_verdict, a.held_out_verdict) if line)
    environment = environment_html(a)
    if environment:
        overview.append(environment)
    return "\n".join(overview)
