"""A grid none of whose runs can be launched (every one refused before launch) fails the execution, each reason said
once; a grid where only some are refused runs the others and its report's summary says which were not launched."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from finetune_bench.inputs.plan import not_launched, nothing_to_launch, plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs

PROJECT_ROOT = Path(__file__).resolve().parents[2]
NO_EXAMPLE_FITS = "not launched: the dataset has 0 usable examples"


def test_a_grid_where_no_example_fits_fails_with_the_reason_once(tmp_path):
    export = tmp_path / "export"
    env = dict(os.environ, FINETUNE_BENCH_EXPORT_DIR=str(export), WANDB_MODE="disabled")
    pyflyte = Path(sys.executable).parent / "pyflyte"
    done = subprocess.run(
        [str(pyflyte), "run", "workflows/benchmark.py", "benchmarking_experiment"]
        + ["--training_args", '{"max_seq_length": 1, "synthetic_num_examples": 16}'],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = re.sub(r"[\s│╭╮╰╯─]+", " ", done.stdout + done.stderr)  # the CLI wraps long lines in a box
    assert done.returncode != 0, output[-3000:]
    assert "no run of the grid can be launched (4 run(s), none trained); fix the inputs:" in output, output[-3000:]
    assert output.count(NO_EXAMPLE_FITS) == 1, "the reason is said once for the four runs it stops"
    assert "every example's prompt fills max_seq_length 1" in output and "[4 run(s): arm=liger," in output
    assert "Traceback" not in output
    assert not (export / "report.html").exists(), "no report of nothing"


def test_a_grid_with_some_runs_refused_runs_the_others_and_says_so():
    from finetune_bench.analysis.grid import analyze_grid
    from finetune_bench.reporting.benchmark_report import grid_report
    from finetune_bench.running.launch import not_launched as refused_result

    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"], max_seq_length=[1, 32]), TrainingArgs(), 2)
    reason = f"{NO_EXAMPLE_FITS}, fewer than one batch of 1 (checked on the downloaded data before any run)"
    planned = [dataclasses.replace(r, refused=reason) if r.training_args.max_seq_length == 1 else r for r in planned]
    assert nothing_to_launch(planned) == ""
    assert not_launched(planned) == [f"{reason} [4 run(s): arm=liger,max_seq_length=1, arm=baseline,max_seq_length=1]"]

    results = [refused_result(run) if run.refused else None for run in planned]
    analysis = analyze_grid(planned, results, {})
    assert analysis.not_launched == not_launched(planned)
    summary = grid_report(analysis).sections["Summary"]
    assert "Not launched (every other run was)" in summary and "4 run(s): arm=liger,max_seq_length=1" in summary

    everything_refused = [dataclasses.replace(run, refused=reason) for run in planned]
    message = nothing_to_launch(everything_refused)
    assert message.startswith("no run of the grid can be launched (8 run(s), none trained)")
    assert message.count(NO_EXAMPLE_FITS) == 1 and "and 1 more]" in message
