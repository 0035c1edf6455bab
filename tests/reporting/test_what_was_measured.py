"""The Summary opens with what was measured: hardware, settings, steps, when and with what, from the results table
and the environment record, and nothing they do not carry."""

import re

import pandas as pd

from finetune_bench.analysis.grid import analyze_grid
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.reporting.benchmark_report import grid_report
from finetune_bench.results.record import RunResult

GIB = 1024**3
H100 = {
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "gpu_count": "8",
    "gpu_memory_bytes": str(80 * GIB),
    "torch": "2.11.0",
    "liger-kernel": "0.8.5",
    "transformers": "5.23.0",
    "lock_sha256": "12ab43339895acd68ee9ca0f24045b651d0ea26c",
    "finetune-bench": "0.1.0",
    "code_commit": "4d43f2a1b2c3",
}
CPU = {"cpu": "x86_64", "torch": "2.13.0+cpu", "lock_sha256": "12ab43339895acd68ee9ca0f24045b651d0ea26c"}


def _report(environment: dict[str, str], device: str, experiment: ExperimentArgs, details: bool = True):
    parallelism = "ddp" if experiment.num_gpus else "none"  # several GPUs share a run through a process group
    # the batch size where the grid does not sweep it (a swept axis' value in training_args is refused)
    batch = {} if experiment.per_device_train_batch_size else {"per_device_train_batch_size": 4}
    training = TrainingArgs(backend="plain_loop", parallelism=parallelism, max_seq_length=1024, **batch)
    planned = plan_runs(experiment, training, n_runs=2)
    results = []
    for i, run in enumerate(planned):
        extra = {
            "device": device,
            "dtype": "bfloat16",
            "steps_completed": "10",
            "measured_at": f"2026-11-26 14:{i:02d} UTC",
            "num_parameters": "4700992",
        }
        results.append(
            RunResult(run.condition_id, run.run_number, run.swept_axes, run.training_args, "ok",
                      metrics={"tokens_per_second": 100.0 + i, **({"steps_measured": 8.0} if details else {})},
                      environment=environment if details else {}, details=extra if details else {})
        )  # fmt: skip
    return grid_report(analyze_grid(planned, results, {}))


def _header(summary: str) -> dict[str, str]:
    (header,) = re.findall(
        r'<div class="measured"><details><summary><b>What was measured</b>: [^<]*</summary>'
        r"<ul>(.*?)</ul></details></div>",
        summary,
    )
    return dict(re.findall(r"<li>(.*?): (.*?)</li>", header))


def test_a_gpu_grid_opens_with_its_hardware_settings_steps_dates_and_versions():
    summary = _report(H100, "cuda:0", ExperimentArgs(arm=["liger", "baseline"])).sections["Summary"]
    # the answer at a glance first, then what was measured
    assert summary.startswith('<div class="cards"><div class="card"><div class="card-title">liger vs baseline</div>')
    assert summary.index('<div class="measured"><details><summary><b>What was measured</b>') < summary.index("runs of")
    # folded to one line: the hardware and the model, the rest one click away
    assert (
        "<b>What was measured</b>: NVIDIA H100 80GB HBM3 (80 GiB), 1 GPU per run; random:tiny-llama (the details)"
        in summary
    )
    assert _header(summary) == {
        "hardware": "NVIDIA H100 80GB HBM3 (80 GiB), 1 GPU per run",
        "model": "random:tiny-llama",
        "model shape": "2 layers, hidden 64, vocabulary 1,024, 4.7M parameters",
        "dataset": "synthetic:alpaca",
        "backend": "plain_loop",
        "dtype": "bfloat16",
        "sequence length": "1024",
        "batch size per device": "4",
        "steps": "10 per run, 8 of them timed",
        "measured": "2026-11-26 14:00 UTC to 2026-11-26 14:03 UTC",
        "versions": "liger-kernel 0.8.5, torch 2.11.0, transformers 5.23.0, lockfile sha256 12ab43339895",
        "code": "finetune-bench 0.1.0, commit 4d43f2a1b2c3",
    }  # no inputs file: the workflow is handed its values, not the file's name


def test_the_swept_values_and_the_gpus_per_run_are_all_named():
    experiment = ExperimentArgs(arm=["liger", "baseline"], num_gpus=[1, 2], per_device_train_batch_size=[4, 8])
    header = _header(_report(H100, "cuda:0", experiment).sections["Summary"])
    assert header["hardware"] == "NVIDIA H100 80GB HBM3 (80 GiB), 1 to 2 GPUs per run"
    assert header["batch size per device"] == "4, 8"


def test_a_cpu_grid_says_cpu_and_never_gpu():
    report = _report(CPU, "cpu", ExperimentArgs(arm=["liger", "baseline"]))
    header = _header(report.sections["Summary"])
    assert header["hardware"] == "CPU (x86_64)"
    assert not any("GPU" in text for text in header.values())
    assert "GPU's capacity" not in report.sections["Memory"]  # no capacity line is drawn on a CPU run
    # what to run: no GPU memory left free on a CPU (the frontier's throughput section shows the same Summary)
    recommendation = report.sections["Summary"].split("<h3>Recommendation</h3>", 1)[1].split("<h3>", 1)[0]
    assert "GPU memory it leaves free" not in recommendation and "headroom" not in recommendation
    assert "trained on a CPU: there is no GPU memory to leave free" in recommendation
    for tab in ("Throughput", "Speedup"):  # a tab of timing figures says it timed a CPU
        assert report.sections[tab].startswith('<div class="warning"><b>CPU run.</b>'), tab


def test_a_gpu_grid_s_timing_figures_carry_no_cpu_note():
    report = _report(H100, "cuda:0", ExperimentArgs(arm=["liger", "baseline"]))
    assert not any("CPU run." in report.sections[tab] for tab in ("Throughput", "Speedup"))
    assert "the GPU memory it leaves free" in report.sections["Summary"]


def test_what_no_run_recorded_is_left_out_not_guessed():
    header = _header(_report({}, "", ExperimentArgs(arm=["liger", "baseline"]), details=False).sections["Summary"])
    # the plan's settings, and the shape the bundled architecture's config gives (no parameter count: no run said)
    assert set(header) == {"model", "model shape", "dataset", "backend", "sequence length", "batch size per device"}
    assert header["model shape"] == "2 layers, hidden 64, vocabulary 1,024"


def test_the_model_shape_follows_the_runs_config_overrides_and_a_model_unknown_here_has_none():
    experiment = ExperimentArgs(arm=["liger", "baseline"], model_config_overrides=["", "num_hidden_layers=4"])
    header = _header(_report(H100, "cuda:0", experiment).sections["Summary"])
    assert header["model shape"] == (
        "2 layers, hidden 64, vocabulary 1,024, 4.7M parameters; 4 layers, hidden 64, vocabulary 1,024, 4.7M parameters"
    )
    from finetune_bench.reporting.benchmark_tabs.measured import model_shape_text

    runs = pd.DataFrame({"model_name": ["someone/unknown-model"], "num_parameters": [1.2358e9]})
    assert model_shape_text(runs) == "1.24B parameters"  # no config known here: the runs' count alone
    assert model_shape_text(runs.drop(columns="num_parameters")) == ""
