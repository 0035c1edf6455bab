"""Cut Cross-Entropy as a criterion (`cce`) and as an arm component (`cce`): what the arm grammar and planning
accept and refuse, and what the memory model counts for it."""

import dataclasses
import importlib.util

import pytest

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.catalog import BACKENDS, CRITERIA, PLAIN_LOOP_CRITERIA
from finetune_bench.inputs.condition_checks import validate_condition
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.loss_paths import select_loss_path
from finetune_bench.inputs.settings import TrainingArgs, check_setting
from finetune_bench.prediction.memory import predict_memory
from finetune_bench.prediction.shapes import model_config, model_shape


def condition(**overrides) -> TrainingArgs:
    return dataclasses.replace(TrainingArgs(backend="plain_loop"), **overrides)


def refusal(**overrides) -> str:
    with pytest.raises(SpecError) as refused:
        validate_condition(condition(**overrides), {})
    return str(refused.value)


def test_cce_is_a_criterion_of_the_plain_loop_and_forward_only_and_of_no_trainer():
    assert "cce" in CRITERIA and "cce" in PLAIN_LOOP_CRITERIA
    assert [name for name, backend in BACKENDS.items() if "cce" in backend.criteria] == ["plain_loop", "forward_only"]
    path = select_loss_path("cce", {"fused_linear_cross_entropy"})  # Liger's kernels do not change it
    assert (path.name, path.criterion, path.materializes_logits) == ("cce", "cce", False)


def test_the_cce_arm_computes_the_loss_with_cce_in_place_of_the_model_s_loss():
    arm = parse_arm("compile+cce")
    assert arm.cce and arm.compile and not arm.is_baseline
    assert arm.loss_criterion("model") == "cce"
    assert parse_arm("liger").loss_criterion("torch_cross_entropy") == "torch_cross_entropy"


@pytest.mark.parametrize("arm", ["cce", "liger:rope+cce", "compile+cce", "cce+switchback"])
def test_arms_with_cce_that_plan(arm):
    validate_condition(condition(arm=arm, device="cuda"), {})
    validate_condition(condition(arm=arm, backend="forward_only", device="cuda"), {})


@pytest.mark.parametrize("kernel", ["fused_linear_cross_entropy", "cross_entropy"])
def test_a_liger_loss_kernel_beside_cce_is_not_an_arm(kernel):
    with pytest.raises(SpecError, match=rf"training_args\.arm: arm 'liger:{kernel}\+cce': .*both compute the loss"):
        check_setting("training_args.arm", "arm", f"liger:{kernel}+cce")


def test_liger_s_defaults_beside_cce_are_refused_for_a_model_whose_defaults_compute_the_loss():
    message = refusal(arm="liger+cce", model_name="random:tiny-llama")
    assert "model type 'llama' switch on ['fused_linear_cross_entropy']" in message
    assert "'liger-without-loss+cce'" in message and "'liger:rope+cce'" in message
    # a hub id's type is known only once downloaded
    assert "known only once it is downloaded" in refusal(arm="liger+cce", model_name="someone/some-model")
    # what the refusal offers instead plans
    validate_condition(condition(arm="liger", criterion="cce", device="cuda"), {})
    validate_condition(condition(arm="liger-without-loss+cce", model_name="random:tiny-llama", device="cuda"), {})


@pytest.mark.parametrize("backend", ["trl_sft", "hf_trainer"])
def test_the_cce_arm_runs_in_a_trainer_on_one_gpu_and_is_refused_on_several(backend):
    validate_condition(condition(arm="cce", backend=backend, device="cuda"), {})
    validate_condition(condition(arm="liger-without-loss+cce", backend=backend, device="cuda"), {})
    message = refusal(arm="cce", backend=backend, num_gpus=2, parallelism="ddp", device="cuda")
    assert f"arm 'cce' with backend {backend!r} on 2 GPUs" in message
    assert "use backend 'plain_loop' on several GPUs" in message


def test_the_cce_criterion_is_refused_by_a_trainer_backend():
    assert "criterion 'cce' does not run with backend 'trl_sft'" in refusal(criterion="cce", backend="trl_sft")


def test_the_cce_arm_with_another_loss_criterion_is_refused():
    message = refusal(arm="cce", criterion="torch_cross_entropy")
    assert "so would criterion 'torch_cross_entropy'; use criterion 'model'" in message
    validate_condition(condition(arm="cce", criterion="cce", device="cuda"), {})


def test_float32_training_on_a_gpu_is_refused_and_on_a_cpu_runs():
    assert "backward kernel takes float16 or bfloat16" in refusal(criterion="cce", dtype="float32", device="cuda")
    assert "backward kernel takes float16 or bfloat16" in refusal(arm="cce", dtype="float32")  # device auto
    validate_condition(condition(arm="cce", dtype="float32", device="cpu"), {})
    validate_condition(condition(arm="cce", dtype="float32", backend="forward_only"), {})  # no backward


def test_cce_not_installed_is_refused_at_planning_with_the_install_hint(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "cut_cross_entropy" else real_find_spec(name, *a)
    )
    for overrides in ({"arm": "cce"}, {"criterion": "cce"}):
        message = refusal(**overrides, device="cuda")
        assert "needs the package cut-cross-entropy" in message and "pip install cut-cross-entropy" in message
    validate_condition(condition(arm="baseline", device="cuda"), {})  # nothing else asks for it


def test_the_memory_model_counts_no_logits_for_cce():
    shape = model_shape(model_config("random:llama-3.2-1b"))
    common = {"device": "cuda", "per_device_train_batch_size": 8, "max_seq_length": 2048}
    predicted = {
        criterion: predict_memory(condition(criterion=criterion, **common), shape)
        for criterion in ("torch_cross_entropy", "liger_fused_linear_cross_entropy", "cce")
    }
    assert predict_memory(condition(arm="cce", **common), shape).loss_path == "cce"
    cce = predicted["cce"]
    assert cce.loss_path == "cce"
    tokens, a, h, v = 8 * 2048, 2, shape.hidden_size, shape.vocab_size
    # kept: hidden states, log-sum-exp, mean logits; transient: both gradients and the vocabulary order
    assert cce.breakdown["logits_and_loss"] == a * h * tokens + 4 * tokens + 4 * v + a * h * tokens + a * v * h + 4 * v
    assert cce.breakdown["logits_and_loss"] < 2 * a * tokens * h + 2 * a * v * h + 16 * (tokens + v)
    assert cce.peak_reserved_bytes < predicted["liger_fused_linear_cross_entropy"].peak_reserved_bytes
    assert cce.peak_reserved_bytes < predicted["torch_cross_entropy"].peak_reserved_bytes
    forward = predict_memory(condition(criterion="cce", backend="forward_only", **common), shape)
    assert forward.breakdown["logits_and_loss"] in (0, 8 * tokens)  # no logits, whatever the peak is
