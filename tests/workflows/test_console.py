"""What `pyflyte run` prints around this project's workflows: no click warnings about flags declared twice, and a
local run ending with its summary and where its files are, not a dump of its outputs (unless verbose)."""

import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from finetune_bench.frontier.simulated import oom_lines
from tasks.analysis import SUMMARY_FILE

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("module", "workflow", "flags"),
    [
        ("workflows/benchmark.py", "benchmarking_experiment", ["force_fresh", "dry_run", "skip_predicted_oom"]),
        ("workflows/frontier.py", "memory_frontier", ["measure_throughput", "force_fresh", "dry_run"]),
    ],
)
def test_flag_inputs_are_declared_once(module, workflow, flags, monkeypatch):
    from flytekit.clis.sdk_in_container.pyflyte import main

    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CliRunner().invoke(main, ["run", module, workflow, "--help"])
    assert result.exit_code == 0, result.output
    repeated = [str(w.message) for w in caught if "used more than once" in str(w.message)]
    assert not repeated, repeated
    for flag in flags:
        assert f"--{flag}" in result.output


def _dry_run(
    tmp_path,
    monkeypatch,
    verbose: str = "",
    workflow: tuple[str, str] = ("workflows/benchmark.py", "benchmarking_experiment"),
    inputs: str = "inputs/llama1b_random.yaml",
) -> str:
    from flytekit.clis.sdk_in_container.pyflyte import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FINETUNE_BENCH_EXPORT_DIR", str(tmp_path / "export"))
    monkeypatch.setenv("FINETUNE_BENCH_VERBOSE", verbose)
    args = ["run", *workflow, "--inputs-file", inputs, "--dry_run", "--gpu_kind", "H100"]
    monkeypatch.setattr(sys, "argv", ["pyflyte", *args])  # the command line a user's pyflyte has
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_local_run_ends_with_its_summary_not_its_outputs(tmp_path, monkeypatch):
    output = _dry_run(tmp_path, monkeypatch)
    assert "DefaultNamedTupleOutput" not in output and "Empty DataFrame" not in output
    export = tmp_path / "export"
    lines = output.splitlines()
    # the plan's conditions, then its totals (the plan report's headline) and where its files are, each line once
    conditions = [line for line in lines if line.startswith("conditions: ")]
    assert len(conditions) == 1, output
    assert conditions[0].startswith("conditions: 6 (5 fits, 1 oom at max length); runs: 18 (3 per condition)")
    assert len([line for line in lines if line.startswith("target GPU: ")]) == 1, output
    assert len([line for line in lines if line.startswith("arm=baseline,per_device_train_batch_size=16: ")]) == 1
    assert lines.index(conditions[0]) > max(i for i, line in enumerate(lines) if line.startswith("arm="))
    assert lines[-3].startswith("GPU time: ") and lines[-2:] == [
        f"report: {(export / 'plan.html').resolve()}",
        f"results: {(export / 'plan.csv').resolve()}",
    ]
    summary = (export / SUMMARY_FILE).read_text().splitlines()
    assert summary[1] == conditions[0] and summary[-2:] == ["report: plan.html", "results: plan.csv"]
    assert "<li>inputs file: inputs/llama1b_random.yaml</li>" in (export / "plan.html").read_text()


def test_a_frontier_dry_run_prints_a_short_plan_and_ends_with_its_totals(tmp_path, monkeypatch):
    workflow = ("workflows/frontier.py", "memory_frontier")
    output = _dry_run(tmp_path, monkeypatch, workflow=workflow, inputs="inputs/frontier_smoke.yaml")
    lines = output.splitlines()
    plan = lines[lines.index("the plan:") + 1 :]
    # a line per search with its prediction (a tiny model's peak keeps its digits), then the totals, once each
    assert plan[:4] == [
        "liger, per_device_train_batch_size 1 to 4: predicted frontier 4, peak 0.0022 GiB; the cap fits: the "
        "frontier may lie higher",
        "liger, max_seq_length 32 to 64: predicted frontier 64, peak 0.0022 GiB; the cap fits: the frontier may "
        "lie higher",
        "baseline, per_device_train_batch_size 1 to 4: predicted frontier 4, peak 0.0034 GiB; the cap fits: the "
        "frontier may lie higher",
        "baseline, max_seq_length 32 to 64: predicted frontier 64, peak 0.0023 GiB; the cap fits: the frontier may "
        "lie higher",
    ], output
    assert plan[4].startswith("target GPU: H100") and plan[4].endswith(", 78.4 GiB usable by torch")
    assert plan[5] == "searches: 4 (4 the cap fits)" and plan[6].startswith("GPU time: about 240 GPU-seconds (8 probes")
    export = tmp_path / "export"
    assert plan[7:] == [
        f"report: {(export / 'frontier_plan.html').resolve()}",
        f"results: {(export / 'frontier_plan.csv').resolve()}",
    ]
    assert (export / SUMMARY_FILE).read_text().splitlines()[:3] == plan[4:7]  # the report's headline
    page = (export / "frontier_plan.html").read_text()
    assert "<td>0.0022</td>" in page and "<td>78.4</td>" in page  # never rounded to 0
    assert "<li>dataset: synthetic:alpaca</li>" in page and "<li>inputs file: inputs/frontier_smoke.yaml</li>" in page


def test_verbose_prints_the_outputs_as_flytekit_does(tmp_path, monkeypatch):
    output = _dry_run(tmp_path, monkeypatch, verbose="1")
    assert "DefaultNamedTupleOutput(" in output and "report: " not in output


def test_each_expected_oom_of_a_frontier_is_one_line():
    probes = pd.DataFrame(
        {
            "arm": ["liger", "liger", "baseline"],
            "dimension": ["per_device_train_batch_size"] * 3,
            "value": [2, 4, 2],
            "status": ["ok", "oom", "oom"],
            "reason": [None, "out of memory at step 1", None],
            "error_tail": ["", "Traceback (most recent call last):\n  ...", "Traceback ..."],
        }
    )
    assert oom_lines(probes) == [
        "expected out of memory: liger, per_device_train_batch_size 4 (out of memory at step 1)",
        "expected out of memory: baseline, per_device_train_batch_size 2",
    ]
