"""A whole grid's analysis in one step: what the report, the exported tables and every caller (the Flyte
analysis task, the frontier's throughput report, the GPU scripts) are built from."""

from dataclasses import dataclass, field

import pandas as pd

from finetune_bench.analysis.parity import held_out_parity, loss_parity, with_loss_parity
from finetune_bench.analysis.scaling import scaling_table
from finetune_bench.analysis.stats import paired_comparison
from finetune_bench.analysis.tables import profile_table, ranks_table, results_table, steps_table
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.results.record import OK, RunResult


@dataclass
class GridAnalysis:
    """The results table (one row per run, each with its loss-parity verdict), the per-step table, the
    loss-parity table, the swept axes, the environment of the first run that ended ok, and every problem that
    left a measured run unstored or unlogged (`<condition_id>#<run_number>: <problem>`)."""

    table: pd.DataFrame
    steps: pd.DataFrame
    parity: pd.DataFrame
    swept: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # Every profiled run's per-kernel rows (`training_args.profile`); empty when no run was profiled.
    profile: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Runs on several GPUs: each condition's scaling against one GPU, and every rank of every run (empty when
    # every run had one GPU).
    scaling: pd.DataFrame = field(default_factory=pd.DataFrame)
    ranks: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Each arm against the baseline over runs paired by run number: ratios, intervals and the test at `alpha`
    # (`analysis.stats.paired_comparison`): the numbers the report's Summary states, exported as `comparison`.
    paired: pd.DataFrame = field(default_factory=pd.DataFrame)
    alpha: float = 0.05
    # The held-out loss of each arm against the baseline's, pair by pair (`analysis.parity.held_out_parity`).
    held_out: pd.DataFrame = field(default_factory=pd.DataFrame)


def analyze_grid(
    planned: list[PlannedRun],
    results: list[RunResult | None],
    steps_files: dict[tuple[str, int], str],
    profile_dirs: dict[tuple[str, int], str] | None = None,
    alpha: float = 0.05,
) -> GridAnalysis:
    """Analyze the runs of a grid: `results[i]` is the record of `planned[i]` (None when it was lost),
    `steps_files` the local per-step file of each (condition_id, run_number) that has one, `profile_dirs`
    the local profile directory of each profiled run, and `alpha` the significance level of each arm's test."""
    swept = planned[0].swept_axes if planned else []
    steps = steps_table(results, steps_files)
    parity = loss_parity(steps, swept)
    table = with_loss_parity(results_table(planned, results), parity) if planned else pd.DataFrame()
    environment = next((r.environment for r in results if r is not None and r.status == OK), {})
    problems = [f"{r.condition_id}#{r.run_number}: {p}" for r in results if r is not None for p in r.problems]
    return GridAnalysis(
        table=table,
        steps=steps,
        parity=parity,
        swept=swept,
        environment=dict(environment),
        problems=problems,
        profile=profile_table(results, profile_dirs or {}),
        scaling=scaling_table(table, swept),
        ranks=ranks_table(results),
        paired=paired_comparison(table, swept, alpha) if planned else pd.DataFrame(),
        alpha=alpha,
        held_out=held_out_parity(table, swept) if planned else pd.DataFrame(),
    )
