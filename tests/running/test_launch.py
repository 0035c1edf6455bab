"""The child-process launcher classifies every ending, under injected faults (finetune_bench.running.faults)."""

import dataclasses
import json
import typing

import pandas as pd
import pytest

from finetune_bench.analysis.tables import results_table
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.metrics import ANY_DEVICE, METRICS, STEADY_STATE
from finetune_bench.measuring.step_table import STEP_COLUMNS
from finetune_bench.results.record import RunResult
from finetune_bench.running.faults import FAULT_ENV
from finetune_bench.running.launch import run_in_child
from finetune_bench.running.worker import LAUNCHER_ONLY, ChildOutcome


def planned(**overrides) -> PlannedRun:
    args = dataclasses.replace(TrainingArgs(), **overrides)
    return PlannedRun(condition_id="test", run_number=0, training_args=args, swept_axes=[])


@pytest.mark.parametrize(
    "fault, status, reason",
    [
        ("oom@0", "oom", "out of memory"),
        ("error@0", "error", "exited with status 1"),
        ("exit@0", "error", "exited with status 3"),
        ("segfault@0", "error", "killed by SIGSEGV"),
        ("sigkill@0", "error", "killed by SIGKILL (the host may have killed it for memory)"),
    ],
)
def test_endings_without_a_result_are_classified(fault, status, reason, monkeypatch, tmp_path):
    monkeypatch.setenv(FAULT_ENV, fault)
    result = run_in_child(planned(), tmp_path, tmp_path, tmp_path / "run", timeout_s=120)
    assert (result.status, result.condition_id) == (status, "test")
    assert reason in result.reason
    assert result.steps_file == ""


def test_the_child_s_record_reads_back_and_refuses_a_key_its_launcher_does_not_know_or_lacks():
    # resolved hints: a field's `type` may be a string or, once flytekit has read the class, the type itself
    result_types, outcome_types = typing.get_type_hints(RunResult), typing.get_type_hints(ChildOutcome)
    assert set(LAUNCHER_ONLY) <= set(outcome_types) and not set(LAUNCHER_ONLY) & set(result_types)
    passed_on = {name: kind for name, kind in outcome_types.items() if name not in LAUNCHER_ONLY}
    assert passed_on and all(result_types[name] == kind for name, kind in passed_on.items())
    outcome = ChildOutcome(status="ok", metrics={"tokens_per_second": 1.5}, details={"device": "cpu"})
    assert ChildOutcome.from_json(outcome.to_json()) == outcome
    record = dataclasses.asdict(outcome)
    with pytest.raises(ValueError, match="unknown keys: energy_per_token_j$"):
        ChildOutcome.from_json(json.dumps({**record, "energy_per_token_j": 0.1}))
    del record["loss_path"], record["environment"]
    with pytest.raises(ValueError, match="missing keys: environment, loss_path$"):
        ChildOutcome.from_json(json.dumps(record))


def test_a_hang_ends_as_timeout(monkeypatch, tmp_path):
    monkeypatch.setenv(FAULT_ENV, "hang@0")
    result = run_in_child(planned(), tmp_path, tmp_path, tmp_path / "run", timeout_s=2)
    assert result.status == "timeout"
    assert "2 s timeout" in result.reason
    assert result.wall_time_s < 30


def test_ok_run_reports_metrics_and_steps(tiny_model_dir, tiny_dataset_dir, tmp_path):
    run = planned(max_steps=5, criterion="trl", eval_examples=4)
    result = run_in_child(run, tiny_dataset_dir, tiny_model_dir, tmp_path / "run", timeout_s=300)
    assert result.status == "ok", result.error_tail
    # every metric of the table that any device measures, in the record and in its results column
    assert set(result.metrics) <= set(METRICS)
    row = results_table([run], [result]).iloc[0]
    # (a profile's time needs a profile, the results store's time the store: `run_or_reuse`, test_timeline.py)
    # every step feeds one shape: the run has a steady state
    measured_here = (ANY_DEVICE, STEADY_STATE)
    for metric in (m for m in METRICS.values() if m.scope in measured_here and m.name not in ("profile_s", "store_s")):
        assert metric.name in result.metrics, metric.name
        if metric.column is not None:
            assert row[metric.column] == pytest.approx(result.metrics[metric.name] / metric.scale), metric.column
    steps = pd.read_csv(result.steps_file)
    assert tuple(steps.columns) == STEP_COLUMNS
    assert list(steps["step"]) == [1, 2, 3, 4, 5]
    assert list(steps["is_warmup"]) == [True, False, False, False, False]
    assert (steps["padded_tokens"] == 32).all()  # batch 1 × max_seq_length 32
    assert steps["loss"].notna().all()
    assert result.metrics["steps_measured"] == 4
    assert result.metrics["tokens_per_second"] > 0
    assert result.details["device"] == "cpu" and result.details["dtype"] == "float32"
    assert result.loss_path == "trl_chunked_lm_head"
    assert result.environment["torch"]
    # tiny-llama: N = 2 layers × (q 64·64 + k,v 64·32 + o 64·64 + mlp 3·64·128) + lm_head 64·1024 = 139,264;
    # model FLOPs per token = 6N + 12 · layers · hidden · seq = 835,584 + 12·2·64·32
    assert result.metrics["model_flops_per_token"] == pytest.approx(6 * 139_264 + 12 * 2 * 64 * 32)
    assert "mfu" not in result.metrics  # no peak for a CPU


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory, tiny_model_dir, tiny_dataset_dir):
    """A run by its settings, launched once for the module: tests that need the same run share it (a liger run
    spends seconds per step in the Triton interpreter)."""
    runs: dict[str, RunResult] = {}

    def run(**overrides) -> RunResult:
        planned_run = planned(**overrides)
        key = repr(planned_run.training_args)
        if key not in runs:
            work_dir = tmp_path_factory.mktemp("shared-run")
            runs[key] = run_in_child(planned_run, tiny_dataset_dir, tiny_model_dir, work_dir, timeout_s=300)
        return runs[key]

    return run


@pytest.mark.parametrize("backend", ["plain_loop", "hf_trainer", "trl_sft"])
def test_model_loss_arms_take_their_loss_paths_and_agree(backend, shared_run):
    # batch 1 (the smoke workflow compares the arms at batch 2 on trl_sft, tests/workflows/test_workflow.py)
    results = {}
    for arm in ("liger", "baseline"):
        results[arm] = shared_run(backend=backend, arm=arm, max_steps=2)
        assert results[arm].status == "ok", results[arm].error_tail
        # every example is longer than 32 tokens: a full row, no padding
        assert (pd.read_csv(results[arm].steps_file)["padded_tokens"] == 32).all()
    assert results["liger"].loss_path == "liger_fused_linear_cross_entropy"
    assert results["baseline"].loss_path == "hf_cross_entropy"
    assert "LigerRMSNorm" in results["liger"].liger_patches and not results["baseline"].liger_patches
    # fp32 on a CPU: Liger's kernels (interpreted) match eager PyTorch closely
    assert results["liger"].metrics["final_loss"] == pytest.approx(results["baseline"].metrics["final_loss"], rel=1e-4)


def test_plain_loop_criteria_agree_and_keep_the_layer_kernels(shared_run):
    """The custom-loop notebook's three criteria, in a liger arm: the same loss to fp32 precision (the `model`
    criterion's run is the liger arm's of test_model_loss_arms_take_their_loss_paths_and_agree[plain_loop])."""
    results = {}
    for criterion in ("torch_cross_entropy", "liger_cross_entropy", "liger_fused_linear_cross_entropy", "model"):
        run = shared_run(backend="plain_loop", arm="liger", criterion=criterion, max_steps=2)
        assert run.status == "ok", run.error_tail
        results[criterion] = run
    for criterion in ("torch_cross_entropy", "liger_cross_entropy", "liger_fused_linear_cross_entropy"):
        assert results[criterion].loss_path == criterion
        # the criterion is the only loss kernel: Liger's arm kept its layer kernels, not its fused forward
        assert "LigerRMSNorm" in results[criterion].liger_patches
        assert "fused_linear_cross_entropy_forward" not in results[criterion].liger_patches
        assert results[criterion].metrics["final_loss"] == pytest.approx(
            results["model"].metrics["final_loss"], rel=1e-4
        )
    assert results["model"].loss_path == "liger_fused_linear_cross_entropy"


def test_oom_mid_training_keeps_the_steps_done(monkeypatch, tiny_model_dir, tiny_dataset_dir, tmp_path):
    monkeypatch.setenv(FAULT_ENV, "oom@2")
    result = run_in_child(planned(max_steps=4), tiny_dataset_dir, tiny_model_dir, tmp_path / "run", timeout_s=300)
    assert result.status == "oom"
    assert result.reason.startswith("out of memory at step 3")
    assert "OutOfMemoryError" in result.error_tail
    assert len(pd.read_csv(result.steps_file)) == 2


def test_cublas_unable_to_allocate_is_an_oom_not_an_error(monkeypatch, tiny_model_dir, tiny_dataset_dir, tmp_path):
    """Seen on an H100 at batch 64 × 512: the out-of-memory came as a RuntimeError from cublasCreate."""
    monkeypatch.setenv(FAULT_ENV, "cublas_oom@1")
    result = run_in_child(planned(max_steps=3), tiny_dataset_dir, tiny_model_dir, tmp_path / "run", timeout_s=300)
    assert result.status == "oom"
    assert result.reason.startswith("out of memory at step 2 (between phases): CUDA error: CUBLAS_STATUS_ALLOC_FAILED")
    assert len(pd.read_csv(result.steps_file)) == 1


def test_a_failing_condition_is_an_error_result(tiny_dataset_dir, tmp_path):
    result = run_in_child(planned(), tiny_dataset_dir, tmp_path / "no-model", tmp_path / "run", timeout_s=300)
    assert result.status == "error"
    assert result.reason  # the exception's first line
    assert "Traceback" in result.error_tail


def test_a_refused_run_ends_as_an_error_without_launching(tmp_path):
    run = dataclasses.replace(planned(), refused="arm 'liger': Liger has no kernels for model type 'gpt2'")
    result = run_in_child(run, tmp_path / "no-data", tmp_path / "no-model", tmp_path / "work", timeout_s=1)
    assert result.status == "error" and result.reason == run.refused
    assert not (tmp_path / "work").exists()


def test_a_baseline_on_a_model_type_liger_cannot_patch_runs(tiny_dataset_dir, tmp_path):
    from finetune_bench.sources.models import prepare_model

    model_dir = prepare_model("random:tiny-gpt2")
    result = run_in_child(
        planned(model_name="random:tiny-gpt2", backend="plain_loop", max_steps=2), tiny_dataset_dir, model_dir,
        tmp_path, timeout_s=300,
    )  # fmt: skip
    assert result.status == "ok", result.error_tail
    assert result.loss_path == "hf_cross_entropy" and not result.liger_patches


def test_one_liger_kernel_alone_is_what_gets_patched(tiny_model_dir, tiny_dataset_dir, tmp_path):
    """`liger:cross_entropy` swaps torch's cross entropy function and nothing else (it replaces no module)."""
    args = {"backend": "plain_loop", "arm": "liger:cross_entropy", "max_steps": 2}
    result = run_in_child(planned(**args), tiny_dataset_dir, tiny_model_dir, tmp_path, timeout_s=300)
    assert result.status == "ok", result.error_tail
    assert result.liger_patches == {"cross_entropy": 1}
    assert result.loss_path == "liger_cross_entropy"


@pytest.mark.slow
def test_the_compile_arm_compiles_and_learns_the_same(tiny_model_dir, tiny_dataset_dir, tmp_path):
    """torch.compile (inductor on a CPU: about a minute) gives the eager baseline's loss."""
    results = {}
    for arm in ("compile", "baseline"):
        args = {"backend": "plain_loop", "arm": arm, "max_steps": 2}
        results[arm] = run_in_child(planned(**args), tiny_dataset_dir, tiny_model_dir, tmp_path / arm, timeout_s=600)
        assert results[arm].status == "ok", results[arm].error_tail
    assert results["compile"].details["compiled"] == "True" and results["baseline"].details["compiled"] == "False"
    # what dynamo made of it: its graphs and graph breaks; nothing said of an eager run
    compiled = results["compile"].details
    assert int(compiled["compile_graphs"]) >= 1 and int(compiled["compile_graph_breaks"]) >= 0
    assert "compile_graphs" not in results["baseline"].details
    assert results["compile"].metrics["final_loss"] == pytest.approx(
        results["baseline"].metrics["final_loss"], rel=1e-4
    )


def test_the_switchback_arm_refuses_a_cpu_clearly(tiny_model_dir, tiny_dataset_dir, tmp_path):
    result = run_in_child(
        planned(backend="plain_loop", arm="switchback", max_steps=2), tiny_dataset_dir, tiny_model_dir, tmp_path,
        timeout_s=300,
    )  # fmt: skip
    assert result.status == "error"
    assert "switchback arm needs" in result.reason + result.error_tail  # bitsandbytes missing, or no CUDA GPU
