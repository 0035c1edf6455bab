"""An inputs file is read as a whole before the CLI converts it input by input: the memory-frontier and kernel
workflows name every problem of every section at once too (the benchmark's are in bad_inputs/), and a file whose
inputs all read is left to planning."""

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, workflow: str, inputs: dict):
    from flytekit.clis.sdk_in_container.pyflyte import main

    path = tmp_path / "inputs.yaml"
    path.write_text(yaml.safe_dump(inputs))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        patch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "cache"))
        result = CliRunner().invoke(main, ["run", *workflow.split(), "--inputs-file", str(path)])
    text = re.sub(r"[\s│╭╮╰╯─]+", " ", result.output + str(result.exception or ""))
    assert result.exit_code != 0, text
    assert "Traceback" not in result.output
    assert not (tmp_path / "cache").exists(), "nothing is downloaded for refused inputs"
    return text


def test_a_frontier_file_has_every_problem_named_at_once(tmp_path):
    text = run(
        tmp_path,
        "workflows/frontier.py memory_frontier",
        {
            "training_args": {"use_liger": True},
            "arms": [{"arm": "liger"}, {"kind": "x"}],
            "probes": {"max_steps": 0},
            "batch_size_search": {"start": 0},
            "n_runs": 0,
            "concurrency": "4",
            "dry_runn": True,
        },
    )
    assert "problems in the inputs" in text
    for problem in (
        "training_args.use_liger is not a setting (did you mean 'arm'?",
        "arms[1].kind is not a setting",
        "probes.max_steps must be at least 1, got 0",
        "batch_size_search.start must be at least 1, got 0",
        "n_runs must be a positive integer, got 0",
        "concurrency must be int, got '4'",
        "dry_runn is not an input of memory_frontier (did you mean 'dry_run'?)",
    ):
        assert problem in text, (problem, text[-2500:])
    assert "hint: these are the Union tutorial's keys" in text
    assert text.count("concurrency") == 1, "an input that cannot be read is named once"


def test_a_kernel_benchmark_file_has_every_problem_named_at_once(tmp_path):
    text = run(
        tmp_path,
        "workflows/kernels.py kernel_benchmark",
        {"sweep": {"kernels": ["rms_nrom"], "tokens": [], "device": "tpu"}, "kernel": "rope"},
    )
    for problem in (
        "sweep.kernels: 'rms_nrom' is not a kernel here (did you mean 'rms_norm'?)",
        "sweep.tokens must be a non-empty list of positive integers, got []",
        "sweep.device must be one of ['auto', 'cuda', 'cpu'], got 'tpu'",
        "kernel is not an input of kernel_benchmark",
    ):
        assert problem in text, (problem, text[-2500:])
    assert "hint:" not in text


def test_a_file_whose_inputs_all_read_is_left_to_planning(tmp_path):
    # Settings that read, in a grid that cannot run (criterion trl without trl_sft) and n_runs 0: planning names both
    # together, as it did before the file was read as a whole.
    text = run(
        tmp_path,
        "workflows/benchmark.py benchmarking_experiment",
        {"experiment_args": {"backend": ["hf_trainer"], "criterion": ["trl"]}, "n_runs": 0},
    )
    assert "Invalid value for '--inputs-file'" not in text
    assert "n_runs must be a positive integer, got 0" in text
    assert "criterion 'trl' does not run with backend 'hf_trainer'" in text


def test_a_file_with_anchors_and_merge_keys_plans(tmp_path, monkeypatch):
    """YAML 1.1's merge key: `<<: *anchor` brings in the anchored mapping's keys, and a key beside it overrides the
    merged value (not a key given twice). The frontier's dry run plans the merged sections."""
    from flytekit.clis.sdk_in_container.pyflyte import main

    inputs = tmp_path / "merged.yaml"
    inputs.write_text(
        """\
training_args: {model_name: "random:llama-3.2-1b", device: cuda, backend: plain_loop, synthetic_num_examples: 64,
                synthetic_min_words: 1100, synthetic_max_words: 1200}
arms:
  - &liger {arm: liger}
  - {<<: *liger, arm: baseline}
batch_size_search: &search
  enabled: true
  start: 2
  cap: 8
seq_length_search:
  <<: *search
  batch_size: 1
  start: 256
  cap: 1024
  granularity: 128
"""
    )
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FINETUNE_BENCH_EXPORT_DIR", str(tmp_path / "export"))
    args = ["run", "workflows/frontier.py", "memory_frontier", "--inputs-file", str(inputs), "--dry_run"]
    result = CliRunner().invoke(main, [*args, "--gpu_kind", "H100"])
    assert result.exit_code == 0, result.output
    plan = (tmp_path / "export" / "frontier_plan.csv").read_text().splitlines()
    assert plan[0].startswith("arm,dimension,start,cap,")
    for arm in ("liger", "baseline"):  # the baseline's arm overrides the one merged from the liger arm
        assert any(line.startswith(f"{arm},per_device_train_batch_size,2,8,") for line in plan), plan
        # start and cap override the merged batch search's; enabled comes from it
        assert any(line.startswith(f"{arm},max_seq_length,256,1024,") for line in plan), plan
