"""A whole grid's analysis in one step: everything the report states, the exported tables and every caller (the
Flyte analysis task, the frontier's throughput report) read, computed once, as data. The report only renders
it (`reporting.benchmark_report.grid_report`)."""

from dataclasses import dataclass, field

import pandas as pd

from finetune_bench.analysis.batch_shapes import compile_note, shape_dependence, skewed_runs
from finetune_bench.analysis.cold_runs import cold_note, counted, with_cold_runs
from finetune_bench.analysis.memory_phases import hidden_savings, phase_peaks
from finetune_bench.analysis.parity import (
    held_out_parity,
    held_out_summary,
    loss_parity,
    parity_summary,
    with_loss_parity,
)
from finetune_bench.analysis.projection import projection_table, projection_verdicts
from finetune_bench.analysis.recommendation import largest_fitting_batch, recommendations
from finetune_bench.analysis.remedies import ranking, remedy_lines
from finetune_bench.analysis.scaling import scaling_table
from finetune_bench.analysis.stacks import best_stack_per_budget, component_contributions, stacks_table
from finetune_bench.analysis.stats import paired_comparison, with_paired_ratios
from finetune_bench.analysis.tables import (
    arms_vs_baseline,
    condition_summary,
    phase_prediction_errors,
    prediction_errors,
    profile_table,
    ranks_table,
    results_table,
    reuse_note,
    steps_table,
    with_cost,
)
from finetune_bench.analysis.timeline import condition_timeline, with_timeline_remainder
from finetune_bench.analysis.verdicts import verdicts
from finetune_bench.analysis.versions import sweeps_software, versions_table, versions_verdicts
from finetune_bench.inputs.plan import PlannedRun, not_launched, run_name
from finetune_bench.measuring.metrics import GIB
from finetune_bench.prediction.fine_tune import FineTune
from finetune_bench.results.record import OK, RunResult


@dataclass
class GridAnalysis:
    """What a grid measured and what follows from it. The measured tables: one row per run (each with its
    loss-parity verdict), every step, every profiled kernel, every rank. What follows: per condition, each arm
    against the baseline (medians, and the paired statistics the Summary states), what fits, what to run, the
    loss and held-out parity, and the memory model's error."""

    # One row per run (with its cost per million tokens at `gpu_hour_price`); the swept axes; the environment of the
    # first run that ended ok.
    table: pd.DataFrame
    swept: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    # Every step of every run (None: the runs' steps are not known, and the report has no parity verdict).
    steps: pd.DataFrame | None = None
    # Each arm's run against its baseline run, step by step (`analysis.parity.loss_parity`).
    parity: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Every problem that left a measured run unstored or unlogged (`<condition_id>#<run_number>: <problem>`).
    problems: list[str] = field(default_factory=list)
    # Every profiled run's per-kernel rows (`training_args.profile`); empty when no run was profiled.
    profile: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Runs on several GPUs: each condition's scaling against one GPU, and every rank of every run (empty when
    # every run had one GPU).
    scaling: pd.DataFrame = field(default_factory=pd.DataFrame)
    ranks: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Per condition: runs, statuses, medians over ok runs (`analysis.tables.condition_summary`).
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Each arm against the baseline at each point of the other axes (`arms_vs_baseline`), its ratios the paired
    # statistics' (`stats.with_paired_ratios`: the geometric mean of paired ratios, as the How sure table states them).
    comparison: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Each arm against the baseline over runs paired by run number: ratios, intervals and the test at `alpha`
    # (`analysis.stats.paired_comparison`): the numbers the report's Summary states, exported as `comparison`.
    paired: pd.DataFrame = field(default_factory=pd.DataFrame)
    alpha: float = 0.05
    # Per arm, the largest batch with an ok run and the smallest that ran out of memory.
    fitting: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Per arm, the fastest configuration whose runs all finished, and the GPU memory it leaves free.
    recommended: pd.DataFrame = field(default_factory=pd.DataFrame)
    # The held-out loss of each arm against the baseline's, pair by pair (`analysis.parity.held_out_parity`).
    held_out: pd.DataFrame = field(default_factory=pd.DataFrame)
    # The memory model's prediction against each ok run's measured peak reserved memory.
    memory_prediction: pd.DataFrame = field(default_factory=pd.DataFrame)
    # The memory model's moments against the phases they are, run by run (`tables.phase_prediction_errors`).
    phase_prediction: pd.DataFrame = field(default_factory=pd.DataFrame)
    # The GPU's memory in GiB (None: no GPU recorded).
    capacity_gib: float | None = None
    # The Summary's sentences: one per arm, then the loss parity's and the held-out parity's ("" when none).
    verdicts: list[str] = field(default_factory=list)
    # The fine-tune the user plans, and the Summary's first sentences: one per arm on that fine-tune, projected
    # (`analysis.projection`).
    fine_tune: FineTune = field(default_factory=FineTune)
    fine_tune_verdicts: list[str] = field(default_factory=list)
    parity_verdict: str = ""
    held_out_verdict: str = ""
    # The price of one GPU-hour the costs are at (0: no price, no cost).
    gpu_hour_price: float = 0.0
    # Two or more stacks against the baseline: each ranked by speed with its memory, energy, loss parity and whether
    # it is on the speed-memory Pareto front (`analysis.stacks.stacks_table`); empty otherwise.
    stacks: pd.DataFrame = field(default_factory=pd.DataFrame)
    # From the stacks: which to train with from each memory budget up (`analysis.stacks.best_stack_per_budget`),
    # and what each component of a combined stack adds where the grid has the stack without it
    # (`analysis.stacks.component_contributions`).
    stack_budgets: pd.DataFrame = field(default_factory=pd.DataFrame)
    stack_components: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Per condition, where its runs' wall time went: the median of each phase of the timeline, of what no phase
    # covers and of the time outside the steps (`analysis.timeline.condition_timeline`).
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Why runs were not launched (refused, or skipped as a sure OOM), each reason once with its runs
    # (`inputs.plan.not_launched`); the others ran.
    not_launched: list[str] = field(default_factory=list)
    # Each arm whose steady-state ratio and all-steps ratio disagree (its advantage depends on new batch shapes), a
    # sentence each; the runs whose steady-state and all-steps throughput disagree, and how many of them compiled
    # Triton kernels in timed steps ("" when none did) (`analysis.batch_shapes`).
    shape_notes: list[str] = field(default_factory=list)
    skewed_runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    skewed_compile_note: str = ""
    # Per condition, each memory phase's peak allocated memory and the phase that sets the peak; and the arms whose
    # saving in one phase the phase that sets the peak hides, a sentence each (`analysis.memory_phases`).
    phase_peaks: pd.DataFrame = field(default_factory=pd.DataFrame)
    hidden_savings: list[str] = field(default_factory=list)
    # How many runs were reused from the results store, measured when and on what ("" when every run was measured
    # by this execution).
    reuse_note: str = ""
    # A grid that sweeps `software_set`: each set against the reference set per arm and point of the other axes
    # (`analysis.versions.versions_table`), and per arm the set to run, a sentence each; empty otherwise.
    versions: pd.DataFrame = field(default_factory=pd.DataFrame)
    version_verdicts: list[str] = field(default_factory=list)
    # The cold runs (`analysis.cold_runs`: kernels compiled for the machine in their warm-up or timed steps), marked
    # in `table`, and what was done with them, in a sentence ("" when none was cold).
    cold_note: str = ""
    # Every configuration ranked by the projected time of the whole fine-tune, and the lines that say which change
    # buys most (`analysis.remedies`); empty where fewer than two configurations were projected.
    remedies: pd.DataFrame = field(default_factory=pd.DataFrame)
    remedy_lines: list[str] = field(default_factory=list)


def analyze_table(
    table: pd.DataFrame,
    swept: list[str],
    environment: dict[str, str] | None = None,
    steps: pd.DataFrame | None = None,
    parity: pd.DataFrame | None = None,
    alpha: float = 0.05,
    problems: list[str] | None = None,
    profile: pd.DataFrame | None = None,
    ranks: pd.DataFrame | None = None,
    gpu_hour_price: float = 0.0,
    fine_tune: FineTune | None = None,
) -> GridAnalysis:
    """Everything that follows from a results table (one row per run, with the projection's columns where
    `analysis.projection.projection_table` made them) and what was measured beside it: the steps (None: unknown),
    the loss parity (none: no verdict), the profile and the ranks; each run's cost per million tokens at
    `gpu_hour_price` (0: none); the user's whole fine-tune as `fine_tune` plans it."""
    fine_tune = fine_tune or FineTune()
    environment = dict(environment or {})
    table = with_cold_runs(with_timeline_remainder(with_cost(table, gpu_hour_price)), steps)
    # the runs in the answer: a cold run is left out where its condition has warm ones (it stays in `table`)
    answer = counted(table)
    parity = parity if parity is not None else pd.DataFrame()
    summary = condition_summary(answer, swept)
    paired = paired_comparison(answer, swept, alpha)
    comparison = with_paired_ratios(arms_vs_baseline(summary, swept), paired, swept)
    fitting = largest_fitting_batch(table, swept)
    capacity = float(environment["gpu_memory_bytes"]) / GIB if environment.get("gpu_memory_bytes") else None
    if environment.get("gpu_memory_cap_gib"):  # the GPU the runs emulated (`gpu_memory_cap_gib`)
        capacity = float(environment["gpu_memory_cap_gib"])
    held_out = held_out_parity(answer, swept)
    stacks = stacks_table(paired, answer, swept)
    peaks = phase_peaks(table, swept)
    versions = versions_table(answer, swept, alpha, steps) if sweeps_software(swept) else pd.DataFrame()
    skewed = skewed_runs(table, paired, swept)
    remedies = ranking(answer, swept, fine_tune)
    return GridAnalysis(
        table=table,
        swept=swept,
        environment=environment,
        steps=steps,
        parity=parity,
        problems=list(problems or []),
        profile=profile if profile is not None else pd.DataFrame(),
        scaling=scaling_table(table, swept),
        ranks=ranks if ranks is not None else pd.DataFrame(),
        summary=summary,
        comparison=comparison,
        paired=paired,
        alpha=alpha,
        fitting=fitting,
        recommended=recommendations(summary, swept, capacity),
        held_out=held_out,
        memory_prediction=prediction_errors(table),
        phase_prediction=phase_prediction_errors(table),
        capacity_gib=capacity,
        verdicts=verdicts(comparison, fitting, parity, answer) if not comparison.empty else [],
        fine_tune=fine_tune,
        fine_tune_verdicts=projection_verdicts(answer, paired, swept, fine_tune, gpu_hour_price),
        parity_verdict=parity_summary(parity) if "arm" in swept and steps is not None else "",
        held_out_verdict=held_out_summary(held_out) if not held_out.empty else "",
        gpu_hour_price=gpu_hour_price,
        stacks=stacks,
        stack_budgets=best_stack_per_budget(stacks, summary, swept),
        stack_components=component_contributions(stacks, swept),
        timeline=condition_timeline(table, swept),
        shape_notes=shape_dependence(paired, table, swept),
        skewed_runs=skewed,
        skewed_compile_note=compile_note(skewed),
        phase_peaks=peaks,
        hidden_savings=hidden_savings(peaks, swept),
        reuse_note=reuse_note(table),
        versions=versions,
        version_verdicts=versions_verdicts(versions, swept, alpha) if not versions.empty else [],
        cold_note=cold_note(table),
        remedies=remedies,
        remedy_lines=remedy_lines(remedies, fine_tune),
    )


def analyze_grid(
    planned: list[PlannedRun],
    results: list[RunResult | None],
    steps_files: dict[tuple[str, int], str],
    profile_dirs: dict[tuple[str, int], str] | None = None,
    alpha: float = 0.05,
    gpu_hour_price: float = 0.0,
    fine_tune: FineTune | None = None,
) -> GridAnalysis:
    """Analyze the runs of a grid: `results[i]` is the record of `planned[i]` (None when it was lost),
    `steps_files` the local per-step file of each (condition_id, run_number) that has one, `profile_dirs`
    the local profile directory of each profiled run, `alpha` the significance level of each arm's test,
    `gpu_hour_price` the price of one GPU-hour (0: no cost is computed) and `fine_tune` the user's whole fine-tune,
    projected from each run's steps and rows (default: one epoch)."""
    fine_tune = fine_tune or FineTune()
    swept = planned[0].swept_axes if planned else []
    steps = steps_table(results, steps_files)
    parity = loss_parity(steps, swept)
    table = with_loss_parity(results_table(planned, results), parity) if planned else pd.DataFrame()
    if not table.empty:
        projected = projection_table(results, steps, fine_tune)
        table = table.merge(projected, on=["condition_id", "run_number"], how="left")
    environment = next((r.environment for r in results if r is not None and r.status == OK), {})
    if table.empty:
        return GridAnalysis(table=table, swept=swept, environment=dict(environment), steps=steps, parity=parity)
    analysis = analyze_table(
        table,
        swept,
        environment,
        steps,
        parity,
        alpha,
        problems=[f"{run_name(r.condition_id, r.run_number)}: {p}" for r in results if r for p in r.problems],
        profile=profile_table(results, profile_dirs or {}),
        ranks=ranks_table(results),
        gpu_hour_price=gpu_hour_price,
        fine_tune=fine_tune,
    )
    analysis.not_launched = not_launched(planned)
    return analysis
