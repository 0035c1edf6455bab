"""A plan's verdicts agree with the definitions its page gives (borderline: within 10 % of the usable memory), and
a condition without a verdict says why; the page opens with what the plan would measure."""

import re
from pathlib import Path

import yaml

from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, smoke_experiment
from finetune_bench.prediction import grid
from finetune_bench.prediction.gpus import usable_bytes
from finetune_bench.reporting.plan_report import plan_report, plan_table, plan_text
from tests.reporting.test_wide_tables import needs_chromium, table_widths

ROOT = Path(__file__).resolve().parents[2]


def _estimate(inputs_file: str, gpu_kind: str) -> grid.GridEstimate:
    inputs = yaml.safe_load((ROOT / "inputs" / inputs_file).read_text())
    experiment, training = ExperimentArgs(**inputs["experiment_args"]), TrainingArgs(**inputs["training_args"])
    planned = plan_runs(experiment, training, inputs.get("n_runs", 1))
    return grid.estimate_grid(planned, grid.target_gpu(gpu_kind), 0.0, False)


def test_borderline_is_within_the_margin_and_a_far_oom_at_full_length_is_named_as_such():
    estimate = _estimate("llama1b_random.yaml", "H100")
    usable = usable_bytes(estimate.target.memory_bytes)
    for c in estimate.conditions:
        share = c.memory.peak_reserved_bytes / usable
        if c.verdict == grid.BORDERLINE:
            assert share * (1 + grid.MARGIN) > 1 and share * (1 - grid.MARGIN) <= 1, c
    (far,) = [c for c in estimate.conditions if c.condition_id == "arm=baseline,per_device_train_batch_size=16"]
    assert far.memory.peak_reserved_bytes > 1.4 * usable  # 116 GiB against 78.4 GiB usable
    assert far.verdict == grid.OOM_AT_MAX_LENGTH and "2048 tokens" in far.verdict_reason
    text = plan_text(estimate)
    assert "borderline" not in text and "1 oom at max length); runs: 18 (3 per condition); oom at max length: " in text
    assert f"oom at max length: {grid.VERDICT_MEANINGS[grid.OOM_AT_MAX_LENGTH]}" in text
    assert "<b>oom at max length</b>" in plan_report(estimate).sections["Plan"]


def test_the_plan_says_an_arm_s_speed_is_not_modelled_instead_of_giving_it_as_its_own():
    lines = plan_text(_estimate("llama1b_random.yaml", "H100")).splitlines()
    liger = [line for line in lines if line.startswith("arm=liger,per_device_train_batch_size=4:")][0]
    baseline = [line for line in lines if line.startswith("arm=baseline,per_device_train_batch_size=4:")][0]
    speed = baseline.split(" | ")[1]
    assert (
        liger.split(" | ")[1]
        == f"{speed} as the baseline's (liger's own speed-up is not modelled: the runs measure it)"
    )
    assert "not modelled" not in baseline


def test_a_condition_without_a_verdict_says_why():
    planned = plan_runs(smoke_experiment(), TrainingArgs(), 1)
    estimate = grid.estimate_grid(planned, grid.target_gpu(""), 0.0, False)
    table = plan_table(estimate)
    assert (table["verdict"] == grid.UNKNOWN).all()
    assert (table["verdict_reason"] == grid.NO_TARGET_MEMORY).all()
    text = plan_text(estimate)
    assert "()" not in text and " 0.0 GiB" not in text  # a tiny model's peak keeps its digits
    assert f"conditions: 4 (4 unknown); runs: 4 (1 per condition); unknown: {grid.NO_TARGET_MEMORY}" in text
    # the plan's words, explained on the console where they are used: here "unknown" alone
    assert f"\n(unknown: {grid.VERDICT_MEANINGS[grid.UNKNOWN]})\n" in text and "borderline:" not in text


def test_the_plan_opens_with_what_would_be_measured_and_invents_nothing():
    page = plan_report(_estimate("llama1b_random.yaml", "H100"), "inputs/llama1b_random.yaml").sections["Plan"]
    assert page.startswith('<div class="measured"><details><summary><b>What would be measured</b>: ')
    header = _header(page)
    assert header.pop("hardware").endswith(", predicted (nothing ran)") and "H100" in page
    assert header == {
        "model": "random:llama-3.2-1b",
        "dataset": "synthetic:alpaca",
        "backend": "trl_sft",
        "dtype": "bfloat16",
        "sequence length": "2048",
        "batch size per device": "4, 8, 16",
        "steps": "20 per run, 3 runs per condition",
        "inputs file": "inputs/llama1b_random.yaml",
    }  # nothing ran: no date, no versions; one GPU a run: no GPU count, no parallelism


def _header(page: str) -> dict[str, str]:
    return dict(re.findall(r"<li>(.*?): (.*?)</li>", page.split("</ul>", 1)[0]))


def test_a_multi_gpu_plan_names_the_gpus_a_run_trains_on_and_the_parallelism():
    header = _header(plan_report(_estimate("ddp_llama1b_scaling.yaml", "H100")).sections["Plan"])
    assert (header["GPUs per run"], header["parallelism"]) == ("1 to 2", "ddp")
    header = _header(plan_report(_estimate("fsdp_llama3_8b.yaml", "H100")).sections["Plan"])
    assert (header["GPUs per run"], header["parallelism"]) == ("8", "fsdp")


def test_a_plan_without_a_gpu_names_no_hardware():
    estimate = grid.estimate_grid(plan_runs(smoke_experiment(), TrainingArgs(), 1), grid.target_gpu(""), 0.0, False)
    page = plan_report(estimate).sections["Plan"]
    assert "What would be measured" in page and "<li>hardware:" not in page


@needs_chromium
def test_at_1400_px_the_plan_s_table_does_not_scroll_sideways(tmp_path):
    report = plan_report(_estimate("llama1b_random.yaml", "H100"))
    assert "the plan: all " in report.sections["Plan"]  # the predicted peak's parts behind the toggle
    widths = table_widths(report.to_html(), tmp_path)
    assert len(widths) == 1 and widths[0]["scroll"] <= widths[0]["client"], widths


def test_a_plan_of_cpu_runs_says_once_that_nothing_is_predicted():
    planned = plan_runs(smoke_experiment(), TrainingArgs(device="cpu"), 1)
    estimate = grid.estimate_grid(planned, grid.target_gpu(""), 0.0, False)
    text = plan_text(estimate)
    assert text.count("not predicted on a CPU") == 1 and "GiB" not in text and "GPU-hours" not in text
    assert text.splitlines()[0] == planned[0].condition_id
