"""The Stacks view: stacks ranked by speed against the baseline, the speed-memory Pareto front, and the tab."""

import dataclasses

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.reporting.benchmark_report import grid_report
from finetune_bench.results.record import RunResult

GIB = 1024**3
# (throughput, peak reserved GiB) of each arm: liger is fast and lean, compile faster but fatter, cce as fast as the
# baseline and leaner, and compile+cce slower and fatter than compile (beaten on both).
SHAPES = {
    "baseline": (100.0, 60.0),
    "liger": (135.0, 27.0),
    "compile": (140.0, 42.0),
    "cce": (100.0, 36.0),
    "compile+cce": (120.0, 45.0),
    "baseline_repeat": (100.0, 60.0),
}


def _grid(arms: list[str], shapes: dict[str, tuple[float, float]] = SHAPES, steady: dict | None = None):
    """The grid's analysis; `steady`: (arm, run number) -> the run's all-steps throughput where its steady state is
    the shape's speed (a run whose timed steps paid for something once)."""
    experiment = ExperimentArgs(arm=arms, per_device_train_batch_size=[8])
    planned = plan_runs(experiment, TrainingArgs(backend="plain_loop"), n_runs=3)
    results = []
    for run in planned:
        speed, memory = shapes[run.training_args.arm]
        metrics = {"tokens_per_second": speed + run.run_number, "peak_reserved_bytes": memory * GIB}
        if steady is not None:
            metrics["steady_tokens_per_second"] = metrics["tokens_per_second"]
            metrics["tokens_per_second"] = steady.get((run.training_args.arm, run.run_number), speed + run.run_number)
        results.append(
            RunResult(run.condition_id, run.run_number, run.swept_axes, run.training_args, "ok", metrics=metrics)
        )
    return analyze_grid(planned, results, {})


def test_stacks_are_ranked_by_speed_and_those_beaten_on_speed_and_memory_are_off_the_front():
    analysis = _grid(list(SHAPES))
    stacks = analysis.stacks.set_index("arm")
    assert list(analysis.stacks["arm"]) == ["compile", "liger", "compile+cce", "cce"]  # the A/A repeat is no stack
    assert list(analysis.stacks["rank"]) == [1, 2, 3, 4]
    assert stacks.loc["liger", "throughput_ratio"] > 1.3 and stacks.loc["liger", "peak_reserved_ratio"] == 0.45
    assert stacks["pareto"].to_dict() == {"compile": True, "liger": True, "compile+cce": False, "cce": False}
    # cce: as fast as the baseline within a token per second (ratio just above 1) and leaner; but liger is both
    assert stacks.loc["cce", "throughput_ratio"] < stacks.loc["liger", "throughput_ratio"]
    assert (stacks["pairs"] == 3).all() and stacks["throughput_ci_low"].notna().all()
    tab = grid_report(analysis).sections["Stacks"]
    # named: the leanest stack on the front that beats it
    assert stacks["beaten_by"].to_dict() == {"compile": "", "liger": "", "compile+cce": "liger", "cce": "liger"}
    assert "no: liger is as fast or faster and leaner" in tab and "data:image/png;base64," in tab
    assert list(grid_report(analysis).sections)[:2] == ["Summary", "Stacks"]


def test_a_stack_slower_and_fatter_than_the_baseline_is_beaten_by_the_baseline():
    shapes = {**SHAPES, "cce": (90.0, 70.0)}
    analysis = _grid(["baseline", "liger", "cce"], shapes)
    assert analysis.stacks.set_index("arm")["pareto"].to_dict() == {"liger": True, "cce": False}


def test_a_slower_stack_saving_less_than_the_tie_margin_is_off_the_front_and_out_of_the_budgets():
    # at Llama-3-8B's width: liger-without-loss+cce 0.06 GiB leaner than liger (0.1 % of the baseline's 43.6 GiB)
    # but 20 % slower: not a stack to name for a memory budget
    shapes = {"baseline": (100.0, 43.6), "liger": (110.0, 29.10), "liger-without-loss+cce": (80.0, 29.04)}
    analysis = _grid(list(shapes), shapes)
    stacks = analysis.stacks.set_index("arm")
    assert stacks["pareto"].to_dict() == {"liger": True, "liger-without-loss+cce": False}
    assert stacks.loc["liger-without-loss+cce", "beaten_by"] == "liger"
    assert list(analysis.stack_budgets["train_with"]) == ["liger"]
    tab = grid_report(analysis).sections["Stacks"]
    assert "no: liger is faster and needs at most 1% of the baseline's memory more" in tab
    # beyond the margin (2 GiB leaner, 4.6 % of the baseline's) it is on the front and a budget's answer
    shapes["liger-without-loss+cce"] = (80.0, 27.1)
    analysis = _grid(list(shapes), shapes)
    assert analysis.stacks.set_index("arm")["pareto"].to_dict() == {"liger": True, "liger-without-loss+cce": True}
    assert list(analysis.stack_budgets["train_with"]) == ["liger-without-loss+cce", "liger"]


def test_the_front_is_built_from_the_fastest_down_so_a_stack_off_it_is_beaten_by_one_on_it():
    # each 0.9 % of the baseline's memory leaner than the next faster one: B is within the margin of C, A is not
    # (1.8 % leaner than C), so A stays on the front and B is beaten by C
    shapes = {"baseline": (100.0, 100.0), "C": (120.0, 61.8), "B": (110.0, 60.9), "A": (100.5, 60.0)}
    shapes = {"baseline": shapes["baseline"], "liger": shapes["C"], "compile": shapes["B"], "cce": shapes["A"]}
    analysis = _grid(list(shapes), shapes)
    stacks = analysis.stacks.set_index("arm")
    assert stacks["beaten_by"].to_dict() == {"liger": "", "compile": "liger", "cce": ""}
    assert list(analysis.stack_budgets["train_with"]) == ["cce", "liger"]


def test_a_stack_not_compared_with_the_baseline_says_so():
    analysis = _grid(["baseline", "liger", "cce"])
    stacks = analysis.stacks.assign(throughput_ratio=[1.35, float("nan")], pareto=[True, False], beaten_by=["", "–"])
    tab = grid_report(dataclasses.replace(analysis, stacks=stacks)).sections["Stacks"]
    assert "not compared: no ok run paired with the baseline's" in tab


def test_one_stack_has_no_stacks_view():
    analysis = _grid(["baseline", "liger", "baseline_repeat"])
    assert analysis.stacks.empty and "Stacks" not in grid_report(analysis).sections


def test_the_best_stack_for_each_memory_budget_is_the_fastest_that_fits_it():
    analysis = _grid(list(SHAPES))
    budgets = analysis.stack_budgets
    # from 27 GiB liger (the leanest on the front), from 42 GiB compile (faster); the baseline (60 GiB, slower) and
    # the stacks off the front are never the answer
    assert budgets["train_with"].tolist() == ["liger", "compile"]
    assert budgets["at_least_gib"].tolist() == [27.0, 42.0]
    tab = grid_report(analysis).sections["Stacks"]
    assert "Which stack for your memory budget" in tab and "memory budget from (GiB)" in tab


def test_a_stack_whose_loss_diverged_is_never_recommended_for_a_budget():
    analysis = _grid(list(SHAPES))
    stacks = analysis.stacks.assign(loss_match=["3 of 3", "2 of 3", "3 of 3", "3 of 3"])  # liger diverged once
    from finetune_bench.analysis.stacks import best_stack_per_budget

    budgets = best_stack_per_budget(stacks, analysis.summary, analysis.swept)
    # without liger, cce (as fast as the baseline, 36 GiB) is the leanest stack left: the answer up to compile's 42
    assert budgets["train_with"].tolist() == ["cce", "compile"]


def test_each_component_s_share_comes_from_the_ablations_in_the_grid():
    shapes = {"baseline": (100.0, 60.0), "compile": (120.0, 48.0), "cce": (102.0, 36.0), "compile+cce": (130.0, 30.0)}
    analysis = _grid(list(shapes), shapes)
    parts = analysis.stack_components.set_index("component")
    assert analysis.stack_components["stack"].unique().tolist() == ["compile+cce"]
    assert parts.loc["cce", "without"] == "compile" and parts.loc["compile", "without"] == "cce"
    ratio = analysis.stacks.set_index("arm")["throughput_ratio"]
    assert parts.loc["cce", "throughput_factor"] == ratio["compile+cce"] / ratio["compile"]
    assert parts.loc["compile", "peak_reserved_factor"] == 30.0 / 36.0
    assert "What each component adds" in grid_report(analysis).sections["Stacks"]
    # a stack whose ablations the grid lacks has no shares
    assert _grid(["baseline", "liger", "compile+cce"]).stack_components.empty


def test_the_leaderboard_shows_the_steady_state_ratio_beside_the_all_steps_one_that_ranks():
    # two of cce's three runs compiled its kernels in timed steps: over all steps it reads far below its steady state
    shapes = {"baseline": (100.0, 60.0), "liger": (130.0, 27.0), "cce": (103.0, 36.0)}
    analysis = _grid(list(shapes), shapes, steady={("cce", 0): 50.0, ("cce", 1): 52.0})
    stacks = analysis.stacks.set_index("arm")
    assert stacks.loc["cce", "throughput_ratio"] < 1 < stacks.loc["cce", "steady_throughput_ratio"]
    assert stacks.loc["liger", "steady_throughput_ratio"] == stacks.loc["liger", "throughput_ratio"]
    tab = grid_report(analysis).sections["Stacks"]
    assert "steady throughput ×" in tab and "the same at the steady state" in tab
    # runs without a steady state: no such column
    assert "steady throughput ×" not in grid_report(_grid(list(shapes), shapes)).sections["Stacks"]


def test_a_component_s_share_is_also_read_from_the_steady_state():
    # cce's runs paid for slow steps: over all steps liger-without-loss seems to add far more than it does steadily
    shapes = {"baseline": (100.0, 60.0), "cce": (103.0, 36.0), "liger-without-loss+cce": (127.0, 29.0)}
    analysis = _grid(list(shapes), shapes, steady={("cce", run): 60.0 for run in range(3)})
    part = analysis.stack_components.set_index("component").loc["liger-without-loss"]
    assert part["throughput_factor"] > 2 and 1.2 < part["steady_throughput_factor"] < 1.3
    assert "steady throughput ×" in grid_report(analysis).sections["Stacks"].split("What each component adds")[1]
    assert "steady_throughput_factor" in _grid(list(shapes), shapes).stack_components  # the column, empty


def test_a_grid_whose_baseline_has_no_ok_run_compares_no_stack_and_says_so():
    experiment = ExperimentArgs(arm=["baseline", "liger", "cce"], per_device_train_batch_size=[8])
    planned = plan_runs(experiment, TrainingArgs(backend="plain_loop"), n_runs=2)
    results = [
        RunResult(
            run.condition_id,
            run.run_number,
            run.swept_axes,
            run.training_args,
            "oom" if run.training_args.arm == "baseline" else "ok",
            metrics={} if run.training_args.arm == "baseline" else {"tokens_per_second": 100.0},
        )
        for run in planned
    ]
    analysis = analyze_grid(planned, results, {})
    assert sorted(analysis.stacks["arm"]) == ["cce", "liger"] and analysis.stacks["throughput_ratio"].isna().all()
    assert analysis.stack_budgets.empty
    tab = grid_report(analysis).sections["Stacks"]
    assert tab.count("not compared: no ok run paired with the baseline's") == 2
    assert "throughput ×" not in tab  # no pair measured a ratio: no ratio column
