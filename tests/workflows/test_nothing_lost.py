"""A grid whose measured runs cannot be stored ends with a failing status that names the problem, after its
report and tables were written (the measurements are in them), with a provenance record beside them."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

PROJECT_ROOT = Path(__file__).resolve().parents[2]
BASELINE_ONLY = json.dumps({"arm": ["baseline"], "per_device_train_batch_size": [1]})


def test_a_store_that_cannot_keep_runs_fails_the_execution_after_the_outputs(tmp_path):
    from finetune_bench.inputs.plan import plan_runs
    from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
    from finetune_bench.results.store import hardware_fingerprint, run_key
    from finetune_bench.sources.versions import source_versions

    # A store that passes the checks before the run (a directory that takes files), whose entry for the one
    # run cannot be written: a file stands where the entry's folder goes.
    store = tmp_path / "store"
    store.mkdir()
    (run,) = plan_runs(ExperimentArgs(**json.loads(BASELINE_ONLY)), TrainingArgs(), 1)
    versions = source_versions(run.training_args)
    sources = {"dataset": versions.dataset, "model": versions.model}
    (store / run_key(run, hardware_fingerprint(), sources)).write_text("")
    export = tmp_path / "export"
    # W&B off (tests/integrations/test_wandb_logging.py is where its logging is checked): no W&B service to start
    env = dict(os.environ, FINETUNE_BENCH_EXPORT_DIR=str(export), WANDB_MODE="disabled")
    pyflyte = Path(sys.executable).parent / "pyflyte"
    done = subprocess.run(
        [
            str(pyflyte),
            "run",
            "workflows/benchmark.py",
            "benchmarking_experiment",
            "--experiment_args",
            BASELINE_ONLY,
            "--results_store",
            str(store),
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = re.sub(r"[\s│╭╮╰╯─]+", " ", done.stdout + done.stderr)  # the CLI wraps long lines in a box
    assert done.returncode != 0, output[-3000:]
    assert "1 problem(s) kept measured results from being stored" in output, output[-3000:]
    assert "results store: cannot write entry" in output
    assert "Traceback" not in output

    results = pd.read_csv(export / "results.csv")
    assert list(results["status"]) == ["ok"] and results["tokens_per_second"].gt(0).all()
    assert results["problems"].str.contains("this run is not kept").all()
    assert "Not everything was kept" in (export / "report.html").read_text()
    record = json.loads((export / "environment.json").read_text())
    assert record["environment"]["lock_sha256"] and record["environment"]["torch"]
    assert record["conditions"]["arm=baseline,per_device_train_batch_size=1"]["per_device_train_batch_size"] == 1
