"""The benchmark report: one page whose sections are also the Deck's tabs, each rendered by its module under
`reporting.benchmark_tabs`. Summary (the answer: how much faster, how much leaner, how sure, what fits, is it still
correct, what to run), then the evidence: stacks, software versions, throughput, memory, speedup and MFU, loss
curves, step times, scaling, the profile, every condition with its status and error, and every run."""

from collections.abc import Callable

from finetune_bench.analysis.grid import GridAnalysis
from finetune_bench.reporting.benchmark_tabs.conditions import conditions_tab
from finetune_bench.reporting.benchmark_tabs.environment import ENVIRONMENT_KEYS
from finetune_bench.reporting.benchmark_tabs.loss_curves import loss_curves_tab
from finetune_bench.reporting.benchmark_tabs.memory import memory_tab
from finetune_bench.reporting.benchmark_tabs.profile import profile_tab
from finetune_bench.reporting.benchmark_tabs.runs import runs_tab
from finetune_bench.reporting.benchmark_tabs.scaling import scaling_tab
from finetune_bench.reporting.benchmark_tabs.speedup import speedup_tab
from finetune_bench.reporting.benchmark_tabs.stacks import stacks_tab
from finetune_bench.reporting.benchmark_tabs.step_times import step_times_tab
from finetune_bench.reporting.benchmark_tabs.summary import CPU_WARNING, headline, summary_tab
from finetune_bench.reporting.benchmark_tabs.throughput import throughput_tab
from finetune_bench.reporting.benchmark_tabs.versions import versions_tab
from finetune_bench.reporting.html import Report

# What the frontier's report takes from here, besides the page itself.
__all__ = ["CPU_WARNING", "ENVIRONMENT_KEYS", "TABS", "grid_report"]

# The tabs after the Summary, in order; a renderer that returns None leaves its tab out.
TABS: tuple[tuple[str, Callable[[GridAnalysis], str | None]], ...] = (
    ("Stacks", stacks_tab),
    ("Versions", versions_tab),
    ("Throughput", throughput_tab),
    ("Memory", memory_tab),
    ("Speedup", speedup_tab),
    ("Loss curves", loss_curves_tab),
    ("Step times", step_times_tab),
    ("Scaling", scaling_tab),
    ("Profile", profile_tab),
    ("Conditions", conditions_tab),
    ("Runs", runs_tab),
)


def grid_report(analysis: GridAnalysis, experiment_name: str = "", notes: list[str] | None = None) -> Report:
    """The report of a grid's analysis (`analysis.grid`): it renders, it computes nothing. `notes`: what the
    execution does not keep (on a cluster: no persistent results store, no W&B), shown after the problems."""
    sections = {"Summary": summary_tab(analysis, experiment_name, notes or [])}
    for name, render in TABS:
        content = render(analysis)
        if content is not None:
            sections[name] = content
    return Report(sections=sections, headline=headline(analysis))
