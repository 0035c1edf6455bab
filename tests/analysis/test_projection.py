"""The projection of the user's whole fine-tune: its schedule of batches, the step costs read from a run's steps, the
arithmetic that joins them, and the verdict it leads the Summary with."""

import csv
import json

import numpy as np
import pandas as pd
import pytest

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.analysis.projection import StepCosts, duration_text, projected_seconds, step_costs
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.measuring.jit_cache import COMPILING_BYTES
from finetune_bench.measuring.steady_state import (
    ROW_LENGTHS,
    StepTimeModel,
    TimedStep,
    length_histogram,
    steady_state,
)
from finetune_bench.measuring.step_table import STEP_COLUMNS
from finetune_bench.prediction.fine_tune import (
    Batching,
    FineTune,
    NotProjected,
    Schedule,
    fine_tune_steps,
    length_frequencies,
    row_lengths,
    schedule,
)
from finetune_bench.reporting.benchmark_tabs.summary import headline
from finetune_bench.results.record import RunResult


def test_the_rows_lengths_survive_their_histogram():
    lengths = [5, 3, 5, 9, 3, 5]
    text = length_histogram(lengths)
    assert json.loads(text) == {"3": 2, "5": 3, "9": 1}
    assert sorted(row_lengths(text).tolist()) == sorted(lengths)


def test_one_shape_gives_the_steady_state_with_the_warm_up_as_measured():
    lengths = np.full(64, 128)  # packed rows, or full sequences: every batch one shape
    plan = schedule(lengths, Batching(batch_size=4, warmup_steps=2), FineTune(epochs=2))
    assert plan.steps == 32 and plan.projected_steps == 30
    assert plan.batch_shapes == 1 and plan.new_shape_steps == 0
    assert plan.padded_tokens == 30 * 4 * 128 and plan.tokens == 32 * 4 * 128
    costs = StepCosts(StepTimeModel(0.0, 1e-4, "proportional"), None, warmup_s=3.0)
    assert projected_seconds(costs, plan) == pytest.approx(3.0 + 30 * 4 * 128 * 1e-4)


def test_padded_batches_are_as_long_as_their_longest_row_rounded_up():
    # rows of 10 and 14 tokens: every batch rounds up to 16, one shape
    rounded = schedule(np.array([10] * 4 + [14] * 4), Batching(batch_size=4, pad_to_multiple_of=16), FineTune(steps=20))
    assert rounded.batch_shapes == 1 and rounded.padded_tokens == 20 * 4 * 16
    # rows of 10 and 20, not rounded: a batch is 10 long only when all four rows are
    padded = schedule(np.array([10] * 4 + [20] * 4), Batching(batch_size=4), FineTune(steps=20))
    assert 20 * 4 * 10 < padded.padded_tokens <= 20 * 4 * 20 and 1 <= padded.batch_shapes <= 2
    assert padded.tokens == pytest.approx(20 * 60)  # 60 tokens a batch, whichever rows it holds


def test_new_shape_steps_count_each_length_once_after_the_warm_up():
    lengths = np.arange(1, 65)  # 64 distinct lengths, batches of 1: every length a shape of its own
    plan = schedule(lengths, Batching(batch_size=1, warmup_steps=4), FineTune(epochs=3))
    assert plan.steps == 192 and plan.batch_shapes == 64
    assert plan.new_shape_steps == 64 - 4  # the first epoch meets all 64, four of them in the warm-up
    # all three epochs' lengths but the four warm-up steps' (each of 1 to 64 tokens)
    assert 3 * lengths.sum() - 4 * 64 <= plan.padded_tokens <= 3 * lengths.sum() - 4


def test_several_ranks_split_each_epoch_and_rank_zero_gives_the_padded_tokens():
    lengths = np.full(40, 50)
    plan = schedule(lengths, Batching(batch_size=5, accumulation=2, world_size=2), FineTune(epochs=1))
    assert fine_tune_steps(40, Batching(batch_size=5, accumulation=2, world_size=2), FineTune()) == 2
    assert plan.steps == 2
    assert plan.padded_tokens == 2 * 2 * 5 * 50  # rank 0's: 2 steps × 2 micro-batches × 5 rows × 50
    assert plan.tokens == 2 * 2 * 2 * 5 * 50  # every rank's


def test_padding_free_batches_are_one_row_of_their_rows_summed():
    lengths = np.array([3, 5, 7, 9] * 4)
    plan = schedule(lengths, Batching(batch_size=4, padding_free=True), FineTune(steps=4))
    assert plan.padded_tokens == plan.tokens == 4 * 24


def test_rows_that_fill_no_step_are_not_projected():
    with pytest.raises(NotProjected, match="fill no step"):
        schedule(np.full(3, 10), Batching(batch_size=4), FineTune())


def _steps(rows: list[tuple[int, float, int, bool, bool]]) -> pd.DataFrame:
    """A step table from (step, seconds, padded tokens, new shape, warm-up) rows."""
    return pd.DataFrame(
        [
            {"step": s, "step_time_s": t, "non_padding_tokens": p, "padded_tokens": p, "new_shape": n, "is_warmup": w}
            for s, t, p, n, w in rows
        ]
    )


def test_step_costs_read_the_line_the_new_shape_cost_and_the_warm_up():
    line = lambda p: 0.1 + 1e-5 * p  # noqa: E731
    rows = [(1, 5.0, 1000, True, True)]
    rows += [(i, line(p), p, False, False) for i, p in enumerate([1000, 2000, 3000, 1000, 2000, 3000], start=2)]
    rows += [(8, line(1500) + 0.4, 1500, True, False), (9, line(2500) + 0.2, 2500, True, False)]
    costs = step_costs(_steps(rows))
    assert costs.line.kind == "line"
    assert costs.line.intercept == pytest.approx(0.1) and costs.line.slope == pytest.approx(1e-5)
    assert costs.new_shape_step_s == pytest.approx(0.3) and costs.warmup_s == 5.0
    plan_args = dict(steps=101, projected_steps=100, padded_tokens=200_000.0, tokens=0.0, batch_shapes=5.0)
    plan = Schedule(new_shape_steps=4.0, **plan_args)
    assert projected_seconds(costs, plan) == pytest.approx(5.0 + 0.1 * 100 + 1e-5 * 200_000 + 4 * 0.3)


def test_steps_and_probes_that_grew_the_jit_cache_price_no_length():
    line = lambda p: 0.1 + 1e-5 * p  # noqa: E731
    rows = [(i, line(p), p, False, False) for i, p in enumerate([1000, 2000, 3000, 1000, 2000, 3000], start=1)]
    rows += [(7, line(1500) + 0.2, 1500, True, False), (8, line(2500) + 2.0, 2500, True, False)]
    table = _steps(rows).assign(jit_cache_bytes=[0] * 7 + [900_000])  # step 8 compiled kernels: a first run's
    probes = {1200: line(1200) + 0.1, 1300: line(1300) + 1.7}
    costs = step_costs(table, probes, compiling_probes={1300})
    assert costs.new_shape_step_s == pytest.approx((0.2 + 0.1) / 2) and costs.new_shape_samples == 2
    assert costs.probed == pytest.approx({1200: 0.1}) and costs.compiling_samples == 2  # 1300 priced at the mean
    # every sample compiled: nothing warm to price with, so they stand (and none is said left out)
    every = step_costs(table.assign(jit_cache_bytes=[0] * 6 + [900_000] * 2), probes, compiling_probes={1200, 1300})
    assert every.new_shape_samples == 4 and every.compiling_samples == 0
    assert every.new_shape_step_s == pytest.approx((0.2 + 2.0 + 0.1 + 1.7) / 4)
    # a step table from before the column: every step counts
    assert step_costs(_steps(rows)).new_shape_step_s == pytest.approx(1.1)
    # growth below a compilation's size (another process's bookkeeping in a shared cache) leaves a step in
    small = step_costs(table.assign(jit_cache_bytes=[0] * 7 + [4_000]))
    assert small.new_shape_step_s == pytest.approx(1.1) and small.compiling_samples == 0


def test_the_warm_up_prices_new_shapes_with_its_steps_that_compiled_nothing():
    line = lambda p: 0.1 + 1e-5 * p  # noqa: E731
    rows = [(1, 5.0, 1000, True, True), (2, line(1500) + 2.4, 1500, True, True)]
    rows += [(3, line(2500) + 0.1, 2500, True, True)]
    rows += [(i, line(p), p, False, False) for i, p in enumerate([1000, 2000, 3000, 1000, 2000, 3000], start=4)]
    table = _steps(rows).assign(jit_cache_bytes=[900_000, 900_000] + [0] * 7)  # no timed step met a new shape
    assert step_costs(table).new_shape_step_s == pytest.approx(0.1)  # step 2 compiled: step 3 prices them
    assert step_costs(_steps(rows)).new_shape_step_s == pytest.approx((2.4 + 0.1) / 2)


def _the_benchmark_again(steps: pd.DataFrame) -> Schedule:
    """A fine-tune of exactly the benchmark's timed steps, every one at a shape already met."""
    timed = steps[~steps["is_warmup"]]
    return Schedule(
        steps=len(steps), projected_steps=len(timed), padded_tokens=float(timed["padded_tokens"].sum()),
        new_shape_steps=0.0, tokens=0.0, batch_shapes=1,
    )  # fmt: skip


def test_a_slow_step_at_a_known_shape_is_time_the_fine_tune_pays():
    # one shape (a flat line): six timed steps of 0.2 s and one of 1.0 s, five times its expected time
    seconds = [0.2, 0.2, 0.2, 1.0, 0.2, 0.2]
    rows = [(1, 3.0, 256, True, True)] + [(i, t, 256, False, False) for i, t in enumerate(seconds, start=2)]
    table = _steps(rows)
    timed = [TimedStep(i, t, 256, 256, "4x64", False) for i, t in enumerate(seconds, start=2)]
    figures, slow = steady_state(timed)
    assert figures["outlier_steps"] == 1 and len(slow) == 1  # an outlier, as the steady state reads it
    assert figures["steady_time_s"] == pytest.approx(6 * 0.2)  # which its steady state leaves out by design
    costs = step_costs(table)
    assert costs.line.expected(256) == pytest.approx(sum(seconds) / 6)  # the line moved to every step's mean
    # the projection of the same steps is what they took, the slow one included, with the warm-up as measured
    assert projected_seconds(costs, _the_benchmark_again(table)) == pytest.approx(3.0 + sum(seconds))
    # three timed steps, one of them slow: the fine-tune pays it at the rate the benchmark met it
    few = _steps([(1, 2.0, 256, True, True), (2, 0.3, 256, False, False), (3, 0.3, 256, False, False)]
                 + [(4, 1.02, 256, False, False)])  # fmt: skip
    assert projected_seconds(step_costs(few), _the_benchmark_again(few)) == pytest.approx(2.0 + 0.3 + 0.3 + 1.02)
    # steps of several sizes: a line, not flat, and still a sum of what the steps took
    line = lambda p: 0.1 + 1e-5 * p  # noqa: E731
    sizes = [1000, 2000, 3000, 1000, 2000, 3000, 2000]
    varied = [(i, line(p) + (0.9 if i == 5 else 0.0), p, False, False) for i, p in enumerate(sizes, start=2)]
    varied = _steps([(1, 3.0, 1000, True, True), *varied])
    assert step_costs(varied).line.kind == "line"
    total = 3.0 + sum(line(p) for p in sizes) + 0.9
    assert projected_seconds(step_costs(varied), _the_benchmark_again(varied)) == pytest.approx(total)


def test_a_slow_step_that_grew_the_jit_cache_is_left_out_of_the_line():
    seconds = [0.2, 0.2, 0.2, 2.5, 0.2, 0.2]
    rows = [(1, 3.0, 256, True, True)] + [(i, t, 256, False, False) for i, t in enumerate(seconds, start=2)]
    grew = [0, 0, 0, 0, COMPILING_BYTES * 13, 0, 0]  # step 5: kernels compiled for the machine, once
    table = _steps(rows).assign(jit_cache_bytes=grew)
    costs = step_costs(table)
    assert costs.line.expected(256) == pytest.approx(0.2)  # the step that compiled moves nothing
    assert projected_seconds(costs, _the_benchmark_again(table)) == pytest.approx(3.0 + 6 * 0.2)
    # the same step with no compilation in it is paid
    assert step_costs(_steps(rows)).line.expected(256) == pytest.approx(sum(seconds) / 6)
    # growth below a compilation's size (another process's bookkeeping in a shared cache) leaves it in
    small = step_costs(_steps(rows).assign(jit_cache_bytes=[0, 0, 0, 0, 4_000, 0, 0]))
    assert small.line.expected(256) == pytest.approx(sum(seconds) / 6)


def test_a_run_whose_timed_steps_met_no_new_shape_cannot_price_new_shapes():
    rows = [(i, 0.2, 1000, False, False) for i in range(1, 6)]
    costs = step_costs(_steps(rows))
    assert costs.new_shape_step_s is None
    plan = Schedule(steps=50, projected_steps=50, padded_tokens=5e4, new_shape_steps=3.0, tokens=0.0, batch_shapes=4)
    with pytest.raises(NotProjected, match="no step of this run but its first met one"):
        projected_seconds(costs, plan)
    with pytest.raises(NotProjected, match="no step-time line"):
        step_costs(_steps([(1, 0.2, 1000, False, False), (2, 0.3, 1000, True, False)]))


def test_durations_read_at_a_glance():
    assert duration_text(42) == "42 s" and duration_text(750) == "12.5 min" and duration_text(3 * 3600) == "3.0 h"


def _write_steps(path, seconds_at):
    """A steps.csv of 2 warm-up and 10 timed steps over batches of 4 rows of 32, 48 or 64 tokens (new shapes at
    their first appearance), the first step 1 s slower: each step's time from `seconds_at(padded tokens, new)`."""
    shapes = [64, 64, 32, 48, 64, 32, 48, 64, 64, 32, 48, 64]
    seen, rows = set(), []
    for step, length in enumerate(shapes, start=1):
        padded = 4 * length
        new = length not in seen
        seen.add(length)
        row = dict.fromkeys(STEP_COLUMNS, "")
        row.update(
            step=step,
            step_time_s=seconds_at(padded, new) + (1.0 if step == 1 else 0.0),
            non_padding_tokens=padded,
            padded_tokens=padded,
            batch_shape=f"4x{length}",
            new_shape=new,
            is_warmup=step <= 2,
        )
        rows.append(row)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(STEP_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)


def test_the_summary_and_the_console_lead_with_the_projected_fine_tune(tmp_path):
    args = TrainingArgs(backend="plain_loop", per_device_train_batch_size=4, timing_warmup_steps=2, max_steps=12)
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"]), args, 3)
    histogram = length_histogram([64] * 30 + [32] * 10 + [48] * 24)  # 64 rows: 16 steps an epoch
    per_token = {"liger": 1e-4, "baseline": 2e-4}
    results, files = [], {}
    for run in planned:
        arm = run.training_args.arm
        path = tmp_path / f"{arm}{run.run_number}.csv"
        _write_steps(path, lambda padded, new, arm=arm: 0.05 + per_token[arm] * padded + (0.5 if new else 0.0))
        files[(run.condition_id, run.run_number)] = str(path)
        results.append(
            RunResult(
                run.condition_id,
                run.run_number,
                run.swept_axes,
                run.training_args,
                "ok",
                metrics={"tokens_per_second": 100.0, "steps_measured": 10.0},
                details={ROW_LENGTHS: histogram},
            )
        )
    analysis = analyze_grid(planned, results, files, fine_tune=FineTune(epochs=10))
    table = analysis.table.set_index(["condition_id", "run_number"])
    assert (table["fine_tune_steps"] == 160).all() and (table["projection_note"] == "").all()
    # the same schedule for every run; each arm's line (0.05 s + its time a padded token) and 0.5 s a new shape
    plan = schedule(row_lengths(histogram), Batching(batch_size=4, warmup_steps=2), FineTune(epochs=10), seed=args.seed)
    assert table["fine_tune_new_shape_steps"].iloc[0] == plan.new_shape_steps
    projected = {}
    for arm, k in per_token.items():
        warmup = (0.05 + k * 256 + 0.5 + 1.0) + (0.05 + k * 256)  # steps 1 (new, 1 s slower) and 2, both 4x64
        expected = warmup + 0.05 * plan.projected_steps + k * plan.padded_tokens + 0.5 * plan.new_shape_steps
        mine = table.xs(f"arm={arm}", level=0)["projected_fine_tune_s"]
        assert mine.to_numpy() == pytest.approx([expected] * 3, rel=1e-6)
        projected[arm] = expected
    liger, baseline = projected["liger"], projected["baseline"]
    ratio = baseline / liger
    lines = headline(analysis)
    assert lines[1].startswith("liger: your fine-tune (10 epochs: 160 steps")
    assert f"throughput ×{ratio:.2f}" in lines[1] and "(projected)" in lines[1] and "(as measured)" in lines[1]
    assert analysis.recommended["arm"].iloc[0] == "liger" and "projected_fine_tune_s" in analysis.recommended


def test_a_run_without_row_lengths_says_why_it_is_not_projected(tmp_path):
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"]), TrainingArgs(backend="plain_loop"), 1)
    results = [
        RunResult(r.condition_id, r.run_number, r.swept_axes, r.training_args, "ok", metrics={"tokens_per_second": 9.0})
        for r in planned
    ]
    analysis = analyze_grid(planned, results, {})
    assert analysis.table["projection_note"].str.contains("recorded no row lengths").all()
    assert any("is not projected: the run recorded no row lengths" in line for line in headline(analysis))


def test_each_new_length_is_priced_at_its_probe_and_the_others_at_the_mean():
    from finetune_bench.analysis.projection import new_shapes_seconds

    costs = StepCosts(StepTimeModel(0.0, 1e-4, "line"), 0.3, 0.0, 3, probed={960: 0.1, 896: 1.5})
    plan = Schedule(
        steps=10, projected_steps=10, padded_tokens=0.0, new_shape_steps=3.5, tokens=0.0, batch_shapes=4,
        new_lengths={(960,): 1.0, (896,): 2.0, (832, 896): 0.5},
    )  # fmt: skip
    # 832 unprobed: the mean; two ranks meeting 832 and 896 in one step wait for the dearer
    assert new_shapes_seconds(costs, plan) == pytest.approx(1.0 * 0.1 + 2.0 * 1.5 + 0.5 * 1.5)


def test_the_schedule_names_the_lengths_new_in_each_step():
    lengths = np.arange(1, 65)
    plan = schedule(lengths, Batching(batch_size=1, warmup_steps=4), FineTune(epochs=1))
    assert sum(plan.new_lengths.values()) == pytest.approx(plan.new_shape_steps)
    assert all(len(met) == 1 for met in plan.new_lengths)  # one rank, one micro-batch a step: one length each
    frequencies = length_frequencies(lengths, Batching(batch_size=1), FineTune(epochs=2))
    assert frequencies == {length: 2.0 for length in range(1, 65)}  # every row twice, each its own length


def test_the_probes_step_twice_at_lengths_spread_over_those_the_run_has_not_fed_as_a_fine_tune_meets_them():
    import datasets
    import torch

    from finetune_bench.running.backends.data import collate
    from finetune_bench.running.backends.plain_loop import batches_of
    from finetune_bench.running.backends.shape_probes import time_new_shapes

    row_lengths = [4] * 10 + [6] * 10 + [8] * 10 + [10] * 2 + [12] * 2
    data = datasets.Dataset.from_dict(
        {"input_ids": [[1] * n for n in row_lengths], "labels": [[1] * n for n in row_lengths]}
    )
    args = TrainingArgs(backend="plain_loop", per_device_train_batch_size=2, new_shape_probes=2)
    fed_lengths = []

    def step(rows):
        fed_lengths.append(tuple(rows["input_ids"].shape))

    def batches(index_lists):
        return batches_of(data, index_lists, lambda rows: collate(rows, 0), pin_memory=False)

    probes = time_new_shapes(args, row_lengths, {"2x10", "2x6"}, batches, step, torch.device("cpu"))
    assert probes.compiled == {}  # a CPU has no JIT cache to read
    # 4 and 8 are the lengths neither fed (6, 10) nor past the longest fed (12)
    assert list(probes.first) == list(probes.repeat) == ["4", "8"]
    # each length's first step, then each one's second, no step right after one at its own length
    timed = [shape[1] for shape in fed_lengths]
    assert sorted(timed[:2]) == sorted(timed[2:]) == [4, 8]
    assert all(a != b for a, b in zip(timed, timed[1:], strict=False))
    assert all(value >= 0 for value in [*probes.first.values(), *probes.repeat.values()])


def test_probe_lengths_spread_over_the_lengths_a_fine_tune_meets():
    from finetune_bench.running.backends.shape_probes import spread_lengths

    lengths = np.arange(100, 2100)  # 2,000 rows, every length once; batches of 4 meet mostly long lengths
    args = TrainingArgs(backend="plain_loop", per_device_train_batch_size=4)
    allowed = range(100, 2100)
    chosen = spread_lengths(lengths, args, allowed, 8)
    assert len(chosen) == 8 and chosen == sorted(chosen)
    # from the short end of what batches meet to the long end, not the eight likeliest (all near the longest)
    frequencies = length_frequencies(lengths, Batching(batch_size=4), FineTune(epochs=1))
    met = sorted(frequencies)
    assert chosen[0] < np.quantile(met, 0.5) and chosen[-1] > 1900
    few = spread_lengths(lengths, args, [1500, 2000, 5000], 8)  # fewer allowed than asked for: those met, all
    assert few == [1500, 2000]
