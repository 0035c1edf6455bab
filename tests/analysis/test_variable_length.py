"""Data where every step meets a new length: the projection from the probes' second steps, attention's term over a
range of lengths, cold runs kept out of the answer, the remedies ranked, and what planning refuses."""

import csv
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from finetune_bench.analysis.cold_runs import COLD, COUNTED, with_cold_runs
from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.analysis.projection import (
    fit_across_lengths,
    projected_seconds,
    shape_squared,
    step_costs,
)
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.measuring.jit_cache import COMPILING_BYTES
from finetune_bench.measuring.steady_state import ROW_LENGTHS, length_histogram
from finetune_bench.measuring.step_table import STEP_COLUMNS
from finetune_bench.prediction.fine_tune import Batching, FineTune, NotProjected, schedule
from finetune_bench.reporting.benchmark_tabs.summary import headline
from finetune_bench.results.record import RunResult

ROOT = Path(__file__).resolve().parents[2]


def true_seconds(rows: int, length: int) -> float:
    """A step's time on a made-up GPU: a fixed cost, the padded tokens and attention's square."""
    return 0.05 + 2e-5 * rows * length + 4e-9 * rows * length**2


def _timed_all_new(lengths: list[int], rows: int = 4, new_cost: float = 0.12) -> pd.DataFrame:
    """A step table whose every step met a new length (the first two warm-up)."""
    return pd.DataFrame(
        [
            {
                "step": step,
                "step_time_s": true_seconds(rows, length) + new_cost,
                "non_padding_tokens": rows * length - 7,
                "padded_tokens": rows * length,
                "batch_shape": f"{rows}x{length}",
                "new_shape": True,
                "is_warmup": step <= 2,
                "jit_cache_bytes": 0,
            }
            for step, length in enumerate(lengths, start=1)
        ]
    )


def test_a_run_whose_every_timed_step_met_a_new_length_is_projected_from_its_probes():
    steps = _timed_all_new([2048, 1900, 1500, 1730, 1210, 1640, 1985, 1820, 1330, 1777])
    with pytest.raises(NotProjected, match="new_shape_probes"):
        step_costs(steps)  # no step at a known shape: no line
    probed = [300, 600, 900, 1200, 1500, 1800, 2000]
    first = {length: true_seconds(4, length) + 0.12 for length in probed}
    repeat = {length: true_seconds(4, length) for length in probed}
    costs = step_costs(steps, first, rows_per_probe=4, repeats=repeat)
    assert costs.line.kind == "quadratic"
    for length in (250, 1000, 2048):  # the line holds over the whole range, beyond the probed lengths too
        assert costs.line.expected(4 * length, 4 * length**2) == pytest.approx(true_seconds(4, length), rel=1e-3)
    assert costs.new_shape_step_s == pytest.approx(0.12, rel=1e-3)  # timed new-shape steps and probes alike
    lengths = np.random.default_rng(0).integers(200, 2048, size=1200)
    plan = schedule(lengths, Batching(batch_size=4, warmup_steps=2), FineTune(epochs=1))
    assert plan.new_shape_steps > 0.6 * plan.projected_steps  # the class of data this is about
    # the truth: every projected step at its own length (a + b·P + c·rows·L², summed), each new one 0.12 s dearer
    truth = 0.05 * plan.projected_steps + 2e-5 * plan.padded_tokens + 4e-9 * plan.padded_squared
    assert plan.padded_squared > 0
    expected = costs.warmup_s + truth + 0.12 * plan.new_shape_steps
    assert projected_seconds(costs, plan) == pytest.approx(expected, rel=0.005)
    # a line of padded tokens alone would miss it: attention's square is most of the long steps' extra time
    line_only = dataclasses.replace(costs, line=dataclasses.replace(costs.line, quadratic=0.0))
    assert projected_seconds(line_only, plan) < 0.95 * expected


def test_a_line_of_padded_tokens_alone_stands_where_lengths_are_few():
    samples = [(true_seconds(4, length), 4 * length, 4 * length**2) for length in (512, 1024, 2048)]
    line = fit_across_lengths(samples * 2)
    assert line.kind == "line" and line.quadratic == 0.0
    assert shape_squared("4x512+4x480") == 4 * 512**2 + 4 * 480**2 and shape_squared("") == 0.0


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(STEP_COLUMNS))
        writer.writeheader()
        for row in rows:
            writer.writerow({**dict.fromkeys(STEP_COLUMNS, ""), **row})


def _steps_csv(path: Path, seconds: float, jit_at: int | None) -> None:
    """A steps.csv of 1 warm-up and 5 timed steps of 4x64 at `seconds` each; the JIT cache grew at step `jit_at`."""
    _write(
        path,
        [
            dict(
                step=step,
                step_time_s=seconds * (3 if step == jit_at else 1),
                non_padding_tokens=256,
                padded_tokens=256,
                batch_shape="4x64",
                new_shape=step == 1,
                is_warmup=step == 1,
                jit_cache_bytes=COMPILING_BYTES * 13 if step == jit_at else 0,
            )
            for step in range(1, 7)
        ],
    )


def _grid(tmp_path: Path, cold: dict[tuple[str, int], int], n_runs: int = 3):
    args = TrainingArgs(backend="plain_loop", per_device_train_batch_size=4, timing_warmup_steps=1, max_steps=6)
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"]), args, n_runs)
    speed = {"liger": 0.1, "baseline": 0.12}
    results, files = [], {}
    for run in planned:
        arm, key = run.training_args.arm, (run.training_args.arm, run.run_number)
        path = tmp_path / f"{arm}{run.run_number}.csv"
        _steps_csv(path, speed[arm], cold.get(key))
        files[(run.condition_id, run.run_number)] = str(path)
        tokens_per_second = 256 / speed[arm] / (2.0 if key in cold else 1.0)
        results.append(
            RunResult(
                run.condition_id, run.run_number, run.swept_axes, run.training_args, "ok",
                metrics={"tokens_per_second": tokens_per_second, "steps_measured": 5.0},
                details={ROW_LENGTHS: length_histogram([64] * 64)},
            )
        )  # fmt: skip
    return analyze_grid(planned, results, files, fine_tune=FineTune(epochs=1))


def test_a_cold_run_is_marked_and_left_out_where_its_condition_has_warm_runs(tmp_path):
    # liger's first run compiled kernels for the machine in a timed step (warm-up steps count the same)
    analysis = _grid(tmp_path, {("liger", 0): 3})
    table = analysis.table.set_index(["condition_id", "run_number"])
    assert table.loc[("arm=liger", 0), COLD] and not table.loc[("arm=liger", 0), COUNTED]
    assert table[COUNTED].sum() == 5 and table[COLD].sum() == 1  # kept in the table, marked
    paired = analysis.paired.set_index("arm").loc["liger"]
    assert paired["pairs"] == 2  # the cold run's pair is not in the interval or the test
    assert paired["throughput_ratio"] == pytest.approx(0.12 / 0.1)  # the cold run would have halved one pair
    assert "1 cold run(s) left out" in analysis.cold_note and "arm=liger#0" in analysis.cold_note
    assert any(line.startswith("Cold runs") for line in headline(analysis))


def test_cold_runs_stand_where_every_run_of_their_condition_is_cold(tmp_path):
    analysis = _grid(tmp_path, {("liger", 0): 1, ("liger", 1): 1, ("liger", 2): 1})  # a fresh pod each run
    assert analysis.table[COUNTED].all() and analysis.table[COLD].sum() == 3
    assert "3 cold run(s) kept" in analysis.cold_note and "CUDA_CACHE_PATH" in analysis.cold_note


def test_runs_without_jit_figures_are_warm():
    table = pd.DataFrame({"condition_id": ["a", "a"], "run_number": [0, 1], "status": ["ok", "ok"]})
    marked = with_cold_runs(table, pd.DataFrame({"condition_id": ["a"], "run_number": [0], "step": [1]}))
    assert not marked[COLD].any() and marked[COUNTED].all()


def _remedy_grid(tmp_path: Path, second_run_as_configured: float = 1.0):
    """arm × packing × pad_to_multiple_of on rows of 3 lengths; each configuration's steps at its own speed (the
    configuration as configured's second run `second_run_as_configured` times as slow as its first)."""
    args = TrainingArgs(
        backend="plain_loop", per_device_train_batch_size=4, timing_warmup_steps=1, max_steps=6, max_seq_length=128
    )
    axes = ExperimentArgs(arm=["baseline", "liger"], packing=[False, True], pad_to_multiple_of=[0, 64])
    planned = plan_runs(axes, args, 2)
    results, files = [], {}
    for run in planned:
        t = run.training_args
        seconds = (
            (0.2 if not t.packing else 0.08) * (0.9 if t.arm == "liger" else 1.0) * (0.7 if t.pad_to_multiple_of else 1)
        )
        if t.arm == "baseline" and not t.packing and not t.pad_to_multiple_of and run.run_number == 1:
            seconds *= second_run_as_configured
        path = tmp_path / f"{run.condition_id}-{run.run_number}.csv".replace("=", "_").replace(",", "_")
        _steps_csv(path, seconds, None)
        files[(run.condition_id, run.run_number)] = str(path)
        lengths = [128] * 64 if t.packing else [64] * 100 + [40] * 56
        results.append(
            RunResult(
                run.condition_id, run.run_number, run.swept_axes, t, "ok",
                metrics={"tokens_per_second": 256 / seconds, "steps_measured": 5.0},
                details={ROW_LENGTHS: length_histogram(lengths)},
            )
        )  # fmt: skip
    return planned, analyze_grid(planned, results, files, fine_tune=FineTune(epochs=1))


def test_the_remedies_are_ranked_by_the_fine_tunes_time_and_the_console_says_which_buys_most(tmp_path):
    planned, analysis = _remedy_grid(tmp_path)
    # packing with a padding multiple runs once, as packing: 2 arms × 3 batchings
    assert len({run.condition_id for run in planned}) == 6
    assert not any(run.training_args.packing and run.training_args.pad_to_multiple_of for run in planned)
    ranking = analysis.remedies
    assert ranking["configuration"].iloc[0] == "liger, packing true"  # fastest: both changes
    assert list(ranking["fine_tune_s"]) == sorted(ranking["fine_tune_s"])
    base = ranking.set_index("configuration").loc["as configured"]
    assert base["speedup"] == 1.0
    lines = headline(analysis)
    assert lines[1].startswith("Which change buys most, your fine-tune (1 epoch): as configured")
    assert "fastest: liger, packing true" in lines[1] and "each change alone:" in lines[1]
    alone = lines[1].split("each change alone: ")[1]
    assert alone.index("packing true") < alone.index("pad_to_multiple_of 64") < alone.index("liger ")
    assert lines[2].startswith("Packing: packing puts several examples in one row")


def test_the_console_says_where_a_configuration_s_runs_disagree(tmp_path):
    _, analysis = _remedy_grid(tmp_path, second_run_as_configured=1.2)
    lines = headline(analysis)
    disagree = [line for line in lines if line.startswith("Runs disagree")]
    assert len(disagree) == 1, lines
    assert "(their projections more than 5% apart): as configured" in disagree[0]
    assert "over 2 runs. Each figure is the runs' median" in disagree[0]
    assert "packing" not in disagree[0]  # the runs of every other configuration agree


def test_flash_attention_with_padded_generated_batches_is_refused_at_planning():
    args = TrainingArgs(
        backend="plain_loop", device="cuda", dtype="bfloat16", per_device_train_batch_size=4, max_seq_length=2048,
        synthetic_min_words=200, synthetic_max_words=1800, dataset_name="synthetic:alpaca", attention="flash",
    )  # fmt: skip
    with pytest.raises(SpecError, match="attention 'flash' with padded batches of 4 rows"):
        plan_runs(ExperimentArgs(), args, 1)
    # rows that always fill the window have no padding: flash takes them
    full = TrainingArgs(**{**args.__dict__, "synthetic_min_words": 2100, "synthetic_max_words": 2600})
    assert plan_runs(ExperimentArgs(), full, 1)


def test_the_projection_check_fails_when_it_compares_nothing(tmp_path):
    for part in ("short", "long"):
        (tmp_path / part).mkdir()
    pd.DataFrame({"condition_id": ["arm=liger"], "status": ["ok"], "projected_fine_tune_s": [float("nan")]}).to_csv(
        tmp_path / "short" / "results.csv", index=False
    )
    pd.DataFrame({"condition_id": ["arm=liger"], "run_number": [0], "step_time_s": [1.0]}).to_csv(
        tmp_path / "long" / "steps.csv", index=False
    )
    check = [
        sys.executable,
        str(ROOT / "scripts" / "projection_check.py"),
        str(tmp_path / "short"),
        str(tmp_path / "long"),
    ]
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 1 and "nothing compared" in done.stdout
    pd.DataFrame(
        {"condition_id": ["arm=liger,packing=True"] * 2, "arm": ["liger"] * 2, "packing": [True] * 2,
         "status": ["ok"] * 2, "counted": [True, False], "projected_fine_tune_s": [1.02, 9.0]}
    ).to_csv(tmp_path / "short" / "results.csv", index=False)  # fmt: skip
    # the long run trained that configuration alone: another condition id, the same settings
    pd.DataFrame({"condition_id": ["arm=liger"], "arm": ["liger"], "packing": [True], "run_number": [0],
                  "step_time_s": [1.0]}).to_csv(tmp_path / "long" / "steps.csv", index=False)  # fmt: skip
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 0 and "| arm=liger | 1.0 | 1.0 | +2.0% |" in done.stdout  # the cold 9.0 left out
