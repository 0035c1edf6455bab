"""Run an inputs file's grid without Flyte, writing results as each run ends (for time-boxed GPU sessions).

    python scripts/gpu_grid.py inputs/llama1b_measure.yaml OUT_DIR [--set experiment_args.backend=[plain_loop]]
        [--set training_args.max_steps=16] [--deadline-s 540]

Each run goes through the same child-process launcher as the workflow's train task. Runs that
would start after the deadline are listed as not started. OUT_DIR gets results.csv, steps.csv and
report.html (rewritten after every run).
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.reporting.benchmark_report import build_report
from finetune_bench.running.launch import run_in_child
from finetune_bench.sources.datasets import prepare_dataset
from finetune_bench.sources.models import prepare_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("inputs", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--set", action="append", default=[], help="section.key=JSON value")
    parser.add_argument("--deadline-s", type=float, default=float("inf"))
    opts = parser.parse_args()
    started = time.monotonic()

    inputs = yaml.safe_load(opts.inputs.read_text())
    for assignment in opts.set:
        key, _, value = assignment.partition("=")
        section, _, name = key.rpartition(".")
        (inputs.setdefault(section, {}) if section else inputs)[name] = json.loads(value)
    experiment = ExperimentArgs(**inputs.get("experiment_args", {}))
    training = TrainingArgs(**inputs.get("training_args", {}))
    planned = plan_runs(experiment, training, inputs.get("n_runs", 1))
    dataset_dir = prepare_dataset(
        training.dataset_name,
        training.dataset_split,
        training.synthetic_num_examples,
        training.synthetic_min_words,
        training.synthetic_max_words,
        config=training.dataset_config,
        synthetic_length_distribution=training.synthetic_length_distribution,
    )
    model_dir = prepare_model(training.model_name)

    opts.out.mkdir(parents=True, exist_ok=True)
    work_root = Path(tempfile.mkdtemp(prefix="gpu-grid-"))
    results, steps_files, durations = [], {}, []
    for index, run in enumerate(planned):
        elapsed = time.monotonic() - started
        expected = max(durations) if durations else 0.0
        if elapsed + expected > opts.deadline_s:
            print(f"not started (deadline): {run.condition_id} run {run.run_number}", flush=True)
            results.append(None)
            continue
        result = run_in_child(run, dataset_dir, model_dir, work_root / f"run-{index:03d}", timeout_s=1800)
        durations.append(result.wall_time_s)
        results.append(result)
        steps_files[(run.condition_id, run.run_number)] = result.steps_file
        m = result.metrics
        print(
            f"{run.condition_id} run {run.run_number}: {result.status} {result.reason} "
            f"tok/s={m.get('tokens_per_second', float('nan')):.0f} "
            f"peak_reserved={m.get('peak_reserved_bytes', float('nan')) / 2**30:.1f}GiB "
            f"mfu={m.get('mfu', float('nan')):.3f} wall={result.wall_time_s:.0f}s",
            flush=True,
        )
        analysis = analyze_grid(planned, results + [None] * (len(planned) - len(results)), steps_files)
        analysis.table.to_csv(opts.out / "results.csv", index=False)
        analysis.steps.to_csv(opts.out / "steps.csv", index=False)
        a = analysis
        report = build_report(a.table, a.swept, a.environment, a.steps, a.parity)
        (opts.out / "report.html").write_text(report.to_html())


if __name__ == "__main__":
    main()
