"""Timing that one slow step cannot swing: the steady-state throughput and the price of new batch shapes
(`measuring.steady_state`), as the step recorder records them, as several ranks agree on them, and as the report
states them."""

import os
import random
import socket
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from finetune_bench.analysis.batch_shapes import compile_note, shape_dependence, skewed_runs
from finetune_bench.measuring.steady_state import OUTLIER_FACTOR, TimedStep, fit_step_time, steady_state
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.results.record import RankSummary
from finetune_bench.running.backends.shape_probes import _most_of_any_rank
from finetune_bench.running.ranks import RankReport, combined_metrics
from tests.measuring.test_triton_compiles import compile_a_kernel


def _padded_run(steps: int, seed: int, new_shape_penalty_s: float, warmup: int = 5, batch: int = 8):
    """The timed steps of a run on padded data after `warmup` steps: a batch is as long as its longest example, so
    its padded length is the window (2048) in 40 % of the batches and one of 15 shorter lengths otherwise (as
    generated prompts of varied length give); its time 20 ms + 18 µs per padded token with 2 % noise, plus
    `new_shape_penalty_s` the first time a length comes (warm-up steps feed lengths too); non-padding tokens 80-90 %
    of the padded ones (the spread a batch of 8 generated examples has; a wider one adds its own sampling noise to
    any 10-step figure, which no timing method removes)."""
    rng = random.Random(seed)
    shorter = list(range(1100, 2048, 64))[:15]
    seen, out = set(), []
    for step in range(1, warmup + steps + 1):
        length = 2048 if rng.random() < 0.4 else rng.choice(shorter)
        padded = batch * length
        seconds = (0.02 + 18e-6 * padded) * rng.uniform(0.98, 1.02)
        new = length not in seen
        seen.add(length)
        if new:
            seconds += new_shape_penalty_s
        tokens = int(padded * rng.uniform(0.80, 0.90))
        if step > warmup:
            out.append(TimedStep(step, seconds, tokens, padded, f"{batch}x{length}", new))
    return out


def _steady_tps(steps: list[TimedStep]) -> float:
    figures, _ = steady_state(steps)
    return sum(s.tokens for s in steps) / figures["steady_time_s"]


def _all_steps_tps(steps: list[TimedStep]) -> float:
    return sum(s.tokens for s in steps) / sum(s.seconds for s in steps)


def test_one_slow_step_moves_the_mean_but_not_the_steady_state():
    steps = [TimedStep(i, 0.30, 16_000, 16_384, "8x2048", False) for i in range(1, 11)]
    slow = [*steps[:4], TimedStep(5, 2.43, 16_000, 16_384, "8x2048", False), *steps[5:]]
    assert _all_steps_tps(slow) < 0.65 * _all_steps_tps(steps)  # the mean: moved by a third
    assert _steady_tps(slow) == pytest.approx(_steady_tps(steps))  # the steady state: unmoved
    figures, described = steady_state(slow)
    assert figures["outlier_steps"] == 1 and figures["slowest_step_ratio"] == pytest.approx(2.43 / 0.30)
    assert described == ["step 5 (8x2048): 2.43 s, expected 0.3 s (×8.1)"]


def _true_steady_tps(steps: list[TimedStep]) -> float:
    """The run's tokens over the time its steps take by the law `_padded_run` draws from, without noise or
    new-shape penalty: what the steady state should say."""
    return sum(s.tokens for s in steps) / sum(0.02 + 18e-6 * s.padded_tokens for s in steps)


def test_a_short_padded_run_s_steady_state_is_within_3_percent_of_the_truth_where_its_mean_is_not():
    """On step times of a known law, where new lengths cost 0.15 s each: 10 timed steps (a fair share of them meet
    a new length) and 100, over many draws. The short run's mean-based figure is far off; its steady state is within
    3 % of the run's true steady throughput, as the long run's is."""
    new_shapes = []
    for seed in range(30):
        short, long = _padded_run(10, seed, 0.15), _padded_run(100, 1000 + seed, 0.15)
        new_shapes.append(sum(s.new_shape for s in short))
        assert _steady_tps(short) == pytest.approx(_true_steady_tps(short), rel=0.03), seed
        assert _steady_tps(long) == pytest.approx(_true_steady_tps(long), rel=0.02), seed
        if new_shapes[-1] >= 3:  # the mean-based figure of such a short run is far off: the trap avoided
            assert _all_steps_tps(short) < 0.9 * _true_steady_tps(short), seed
    assert sum(new_shapes) / len(new_shapes) >= 2.5  # the short runs do meet new shapes


def test_the_new_shape_cost_is_what_new_shapes_took_beyond_their_expected_time():
    run = _padded_run(60, 3, 0.25)
    figures, _ = steady_state(run)
    new = sum(s.new_shape for s in run)
    assert figures["new_shape_steps"] == new and figures["steady_steps"] == len(run) - new
    assert figures["new_shape_cost_s"] == pytest.approx(0.25 * new, rel=0.15)
    # a run that pays nothing for new shapes has (next to) no cost
    free, _ = steady_state(_padded_run(60, 3, 0.0))
    assert free["new_shape_cost_s"] < 0.02 * new


def test_the_step_time_law_is_a_robust_line_where_sizes_vary_and_proportional_where_they_do_not():
    varied = [s for s in _padded_run(40, 5, 0.0) if not s.new_shape]
    line = fit_step_time(varied)
    assert line.kind == "line" and line.slope == pytest.approx(18e-6, rel=0.1)
    assert line.intercept == pytest.approx(0.02, abs=0.01)
    same = [TimedStep(i, 0.5, 100, 1000, "1x1000", False) for i in range(4)]
    assert fit_step_time(same).kind == "proportional" and fit_step_time(same).expected(1000) == pytest.approx(0.5)
    assert fit_step_time(same[:2]) is None  # too few steady steps: no steady state


def test_too_few_steady_steps_give_no_steady_state_rather_than_a_guess():
    run = [TimedStep(i, 0.3 + i, 100, 1000 + i, f"1x{1000 + i}", True) for i in range(1, 6)]
    figures, described = steady_state(run)
    assert "steady_time_s" not in figures and figures["new_shape_steps"] == 5 and described == []


def test_the_recorder_records_each_step_s_shapes_and_whether_one_was_new(tmp_path):
    recorder = StepRecorder(torch.device("cpu"), warmup_steps=1, steps_file=tmp_path / "steps.csv")
    recorder.begin_training()
    lengths = [16, 16, 24, 16, 24, 32, 16, 16]
    for length in lengths:
        recorder.add_batch(torch.ones(2, length), torch.zeros(2, length, dtype=torch.long))
        recorder.end_step()
    recorder.end_training()
    steps = pd.read_csv(tmp_path / "steps.csv")
    assert list(steps["batch_shape"]) == [f"2x{n}" for n in lengths]
    assert list(steps["new_shape"]) == [True, False, True, False, False, True, False, False]
    summary = recorder.summary()
    assert summary["distinct_batch_shapes"] == 3
    assert summary["new_shape_steps"] == 2 and summary["steady_steps"] == 5  # step 1 is warm-up
    assert summary["steady_tokens_per_second"] > 0 and "timing_skew" in summary


def test_micro_batches_of_one_step_are_joined_and_any_new_one_makes_the_step_new():
    recorder = StepRecorder(torch.device("cpu"), warmup_steps=0)
    recorder.begin_training()
    for lengths in ([8, 8], [8, 12], [12, 8]):
        for n in lengths:
            recorder.add_batch(None, torch.zeros(1, n, dtype=torch.long))
        recorder.end_step()
    recorder.end_training()
    assert [(s.batch_shape, s.new_shape) for s in recorder.steps] == [
        ("1x8+1x8", True),
        ("1x8+1x12", True),
        ("1x12+1x8", False),
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        recorder = StepRecorder(torch.device("cpu"), warmup_steps=0)
        recorder.begin_training()
        jit_cache = Path(tempfile.mkdtemp()) if rank == 1 else None
        recorder._jit_cache.start(
            [jit_cache] if jit_cache else []
        )  # rank 1 reads a JIT cache (as on a GPU), rank 0 none
        # rank 0 feeds one length throughout; rank 1 meets a new one at step 3, compiles a Triton kernel at step 2
        # (its JIT's hooks called as Triton calls them) and its JIT cache grows at step 4
        for step, length in enumerate([8, 8, 8, 8] if rank == 0 else [8, 8, 16, 16], start=1):
            recorder.add_batch(None, torch.zeros(1, length, dtype=torch.long))
            if rank == 1 and step == 2:
                compile_a_kernel("cross_entropy_kernel")
            if rank == 1 and step == 4:
                (jit_cache / "kernel").write_bytes(b"x" * 300)
            recorder.end_step()
        recorder.end_training()
        figures = [
            (s.new_shape, s.triton_compiles, s.triton_kernels_compiled, s.jit_cache_bytes) for s in recorder.steps
        ]
        # three probes' JIT cache growth as each rank read it: each probe takes the most of any rank
        probes = _most_of_any_rank([0, 300, 0] if rank == 1 else [5, 0, 0], torch.device("cpu"))
        queue.put((rank, (figures, probes)))
    finally:
        dist.destroy_process_group()


def test_a_new_shape_on_any_rank_makes_the_step_new_on_every_rank():
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    processes = [context.Process(target=_rank, args=(rank, port, queue)) for rank in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [process.exitcode for process in processes] == [0, 0]
    reports = dict(queue.get(timeout=5) for _ in processes)
    steps = {rank: figures for rank, (figures, _) in reports.items()}
    assert reports[0][1] == reports[1][1] == [5, 300, 0]
    assert [new for new, *_ in steps[0]] == [new for new, *_ in steps[1]] == [True, False, True, False]
    # the compilation slowed both ranks' step 2: both count it; the kernel's name is the rank's that compiled it
    assert [n for _, n, _, _ in steps[0]] == [n for _, n, _, _ in steps[1]] == [0, 1, 0, 0]
    assert [k for _, _, k, _ in steps[0]] == ["", "", "", ""]
    assert [k for _, _, k, _ in steps[1]] == ["", "cross_entropy_kernel", "", ""]
    # the JIT cache's growth is the most any rank saw: a rank without a cache takes the other's
    assert [j for *_, j in steps[0]] == [j for *_, j in steps[1]] == [0, 0, 0, 300]


def test_several_ranks_steady_rate_is_their_tokens_over_the_slowest_rank_s_steady_time():
    reports = [
        RankReport(RankSummary(rank, 0, rank, "h", "ok"), totals)
        for rank, totals in enumerate(
            [
                {"measured_time_s": 5.0, "steady_time_s": 3.0, "measured_tokens": 3000.0},
                {"measured_time_s": 5.0, "steady_time_s": 4.0, "measured_tokens": 3000.0},
            ]
        )
    ]
    metrics = combined_metrics(reports, gpu_name="")
    assert metrics["steady_tokens_per_second"] == pytest.approx(6000.0 / 4.0)  # not over 3 + 4 s
    assert metrics["tokens_per_second"] == pytest.approx(6000.0 / 5.0)
    assert metrics["timing_skew"] == pytest.approx(5.0 / 4.0 - 1)


def _table(
    liger_steady: float, liger_all: float, new_shape_steps: float = 4.0, device: str = "cpu"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = []
    for arm, steady, overall in (("baseline", 1000.0, 1000.0), ("liger", liger_steady, liger_all)):
        for run in range(3):
            rows.append(
                dict(
                    condition_id=f"{arm}-b8",
                    run_number=run,
                    arm=arm,
                    per_device_train_batch_size=8,
                    status="ok",
                    tokens_per_second=overall,
                    steady_tokens_per_second=steady,
                    timing_skew=steady / overall - 1,
                    new_shape_steps=new_shape_steps,
                    new_shape_cost_s=1.2 if new_shape_steps else 0.0,
                    device=device,
                    attention="sdpa",
                    outlier_steps=1.0,
                    slow_steps="step 3",
                )  # fmt: skip
            )
    table = pd.DataFrame(rows)
    paired = pd.DataFrame(
        [
            dict(
                arm="liger",
                per_device_train_batch_size=8,
                throughput_ratio=liger_all / 1000,
                steady_throughput_ratio=liger_steady / 1000,
            )
        ]  # fmt: skip
    )
    return table, paired


def test_the_summary_says_when_an_arm_s_advantage_depends_on_batch_shapes():
    swept = ["arm", "per_device_train_batch_size"]
    table, paired = _table(liger_steady=1300.0, liger_all=1106.0)
    (line,) = shape_dependence(paired, table, swept)
    assert line.startswith("liger's advantage depends on batch shapes at per_device_train_batch_size 8: ×1.30")
    assert "×1.11 over all timed steps" in line and "pad_to_multiple_of" in line and "packing: true" in line
    assert "liger 4 new-shape step(s) a run, 1.20 s" in line
    assert "cuDNN" not in line and "H100" not in line  # CPU runs: nothing said of a GPU's attention kernel
    skewed = skewed_runs(table, paired, swept)
    assert list(skewed["arm"]) == ["liger"] * 3  # the baseline's runs agree with their steady state
    # within the margin: nothing said
    table, paired = _table(liger_steady=1310.0, liger_all=1300.0)
    assert shape_dependence(paired, table, swept) == [] and skewed_runs(table, paired, swept).empty


def test_a_small_ratio_keeps_its_digits_and_gpu_runs_hear_what_was_measured_of_cudnn():
    swept = ["arm", "per_device_train_batch_size"]
    table, paired = _table(liger_steady=62.0, liger_all=48.0, device="cuda:0")
    (line,) = shape_dependence(paired, table, swept)
    assert "×0.062 at the steady state, ×0.048 over all timed steps" in line  # never ×0.06 or ×0.05
    assert "SDPA's cuDNN attention was measured to pay for each new length" in line


def test_without_a_new_batch_shape_nothing_is_said_of_shapes():
    # the ratios disagree, but no run met a new shape: a few slow steps moved the mean (the skewed runs say so)
    swept = ["arm", "per_device_train_batch_size"]
    table, paired = _table(liger_steady=1300.0, liger_all=1106.0, new_shape_steps=0.0, device="cuda:0")
    assert shape_dependence(paired, table, swept) == []
    assert list(skewed_runs(table, paired, swept)["arm"]) == ["liger"] * 3
    assert compile_note(skewed_runs(table, paired, swept)) == ""  # nothing counted: nothing said of compilations
    # the slow steps compiled Triton kernels: the Summary says how many runs, how long, which arms, and why
    table["triton_compiles"] = table["arm"].map({"liger": 1.0, "baseline": 0.0})
    table["triton_compile_s"] = table["arm"].map({"liger": 0.33, "baseline": 0.0})
    note = compile_note(skewed_runs(table, paired, swept))
    assert note.startswith("3 of them compiled Triton kernels in timed steps (0.99 s of compilation; liger)")
    assert "count of labelled tokens" in note and "triton_kernels_compiled" in note
    table["triton_compile_s"] = table["arm"].map({"liger": 0.004, "baseline": 0.0})  # loaded from Triton's cache
    assert compile_note(skewed_runs(table, paired, swept)) == ""


def test_outlier_factor_is_what_the_metric_s_description_says():
    from finetune_bench.measuring.metrics import METRICS

    assert f"{OUTLIER_FACTOR:g} × their expected time" in METRICS["outlier_steps"].description
