"""LoRA on the hf_trainer backend, the forward_only backend, and the sweep axes added with them.

Runs go through the real child-process launcher on the random-init tiny Llama (CPU, fp32); Liger arms
run in the Triton interpreter, so they use the smallest shapes (batch 1 × 32 tokens, 2 steps).
"""

import dataclasses
import importlib.util

import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import PlannedRun, plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.prediction.memory import predict_memory
from finetune_bench.prediction.shapes import model_config, model_shape
from finetune_bench.running.backends.lora import apply_lora
from finetune_bench.running.launch import run_in_child
from finetune_bench.running.liger_patching import apply_liger, loss_path

# Liger patches module-wide: undo it after each test, so later tests build vanilla models.
pytestmark = pytest.mark.usefixtures("undo_liger_patches")

# tiny-llama (finetune_bench/architectures/tiny-llama.json): 2 layers, hidden 64, 4 heads × head_dim 16,
# 2 KV heads, MLP 128, vocab 1024, untied LM head.
LAYERS, HIDDEN, KV_WIDTH, MLP, VOCAB = 2, 64, 32, 128, 1024
MATMUL_PARAMETERS = LAYERS * (HIDDEN * HIDDEN * 2 + HIDDEN * KV_WIDTH * 2 + 3 * HIDDEN * MLP) + HIDDEN * VOCAB
LORA_RANK = 4
# rank r on a Linear (in → out) adds A (r × in) and B (out × r): q, o 64→64; k, v 64→32; gate, up 64→128; down 128→64
LORA_PARAMETERS = LAYERS * LORA_RANK * (2 * (64 + 64) + 2 * (64 + 32) + 3 * (64 + 128))
SEQ = 32  # TrainingArgs' default max_seq_length; every generated example is longer, so no padding


def planned(**overrides) -> PlannedRun:
    args = dataclasses.replace(TrainingArgs(), **overrides)
    return PlannedRun(condition_id="test", run_number=0, training_args=args, swept_axes=[])


def sweep(**axes) -> ExperimentArgs:
    """The baseline arm alone and the batch size not swept (its default sweeps two), plus `axes`."""
    return ExperimentArgs(**{"arm": ["baseline"], "per_device_train_batch_size": [], **axes})


def run(tmp_path, tiny_dataset_dir, tiny_model_dir, name: str, **overrides):
    result = run_in_child(planned(**overrides), tiny_dataset_dir, tiny_model_dir, tmp_path / name, timeout_s=300)
    assert result.status == "ok", f"{result.reason}\n{result.error_tail}"
    return result


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, tiny_dataset_dir, tiny_model_dir):
    """LoRA on hf_trainer, baseline and liger arms, 2 steps each (one Triton-interpreted run in the module)."""
    tmp_path = tmp_path_factory.mktemp("lora")
    common = {"backend": "hf_trainer", "lora_rank": LORA_RANK, "max_steps": 2}
    return {
        arm: run(tmp_path, tiny_dataset_dir, tiny_model_dir, arm, arm=arm, **common) for arm in ("baseline", "liger")
    }


def test_lora_trains_only_the_adapters(lora_runs):
    result = lora_runs["baseline"]
    trainable, total = int(result.details["trainable_parameters"]), int(result.details["num_parameters"])
    assert trainable == LORA_PARAMETERS
    assert trainable < total
    # peft starts every B matrix at zero: all 7 adapted projections × 2 layers moved away from it
    assert result.details["lora_adapters_trained"] == f"{7 * LAYERS}/{7 * LAYERS}"
    steps = pd.read_csv(result.steps_file)
    assert steps["loss"].notna().all() and (steps["loss"] > 0).all()
    assert result.loss_path == "hf_cross_entropy"


def test_lora_model_flops_give_frozen_weights_no_weight_gradient(lora_runs):
    result = lora_runs["baseline"]
    frozen = MATMUL_PARAMETERS  # the base model's projections and the LM head, all frozen
    expected = 6 * LORA_PARAMETERS + 4 * frozen + 12 * LAYERS * HIDDEN * SEQ
    assert result.metrics["model_flops_per_token"] == pytest.approx(expected)
    assert "N_frozen" in result.details["model_flops_formula"]


def test_lora_keeps_liger_patched_under_the_peft_wrapper(lora_runs):
    liger, baseline = lora_runs["liger"], lora_runs["baseline"]
    assert liger.loss_path == "liger_fused_linear_cross_entropy"
    assert {"LigerRMSNorm", "LigerSwiGLUMLP", "fused_linear_cross_entropy_forward"} <= set(liger.liger_patches)
    assert liger.details["lora_adapters_trained"] == baseline.details["lora_adapters_trained"]
    # the same adapters on the same batches: Liger's kernels (interpreted, fp32) give the same loss
    assert liger.metrics["final_loss"] == pytest.approx(baseline.metrics["final_loss"], rel=1e-4)


def test_loss_path_looks_through_the_peft_wrapper():
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64
    )
    model = LlamaForCausalLM(config)
    # only the instance's forward (no module-global kernel patches leak into this test process)
    apply_liger(model, rope=False, rms_norm=False, swiglu=False, cross_entropy=False, fused_linear_cross_entropy=True)
    wrapped = apply_lora(model, TrainingArgs(backend="hf_trainer", lora_rank=2))
    assert type(wrapped).__module__.startswith("peft")
    assert loss_path(wrapped, "model").name == "liger_fused_linear_cross_entropy"


def test_an_adapter_on_the_lm_head_is_refused_under_liger_fused_loss():
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64
    )
    model = LlamaForCausalLM(config)
    apply_liger(model, rope=False, rms_norm=False, swiglu=False, cross_entropy=False, fused_linear_cross_entropy=True)
    with pytest.raises(RuntimeError, match="LM head"):
        apply_lora(model, TrainingArgs(backend="hf_trainer", lora_rank=2, lora_target_modules="q_proj,lm_head"))


def test_lora_with_gradient_accumulation_and_checkpointing(tmp_path, tiny_dataset_dir, tiny_model_dir):
    """Two micro-batches per step, activations recomputed: the adapters still get their gradients."""
    result = run(
        tmp_path, tiny_dataset_dir, tiny_model_dir, "ga-gc", backend="hf_trainer", lora_rank=LORA_RANK,
        gradient_accumulation_steps=2, gradient_checkpointing=True, max_steps=2,
    )  # fmt: skip
    steps = pd.read_csv(result.steps_file)
    assert (steps["padded_tokens"] == 2 * SEQ).all()  # both micro-batches counted in each step
    assert steps["loss"].notna().all()
    assert result.details["lora_adapters_trained"] == f"{7 * LAYERS}/{7 * LAYERS}"


@pytest.fixture(scope="module")
def forward_runs(tmp_path_factory, tiny_dataset_dir, tiny_model_dir):
    tmp_path = tmp_path_factory.mktemp("forward")
    return {
        arm: run(tmp_path, tiny_dataset_dir, tiny_model_dir, arm, backend="forward_only", arm=arm, max_steps=2)
        for arm in ("baseline", "liger")
    }


def test_forward_only_measures_steps_without_changing_weights(forward_runs):
    for arm, result in forward_runs.items():
        steps = pd.read_csv(result.steps_file)
        assert list(steps["step"]) == [1, 2], arm
        assert (steps["padded_tokens"] == SEQ).all() and steps["loss"].notna().all(), arm
        assert result.details["weights_unchanged"] == "True", arm
        assert result.details["trainable_parameters"] == "0", arm
        assert result.metrics["tokens_per_second"] > 0, arm


def test_forward_only_counts_forward_flops(forward_runs):
    result = forward_runs["baseline"]
    assert result.metrics["model_flops_per_token"] == pytest.approx(2 * MATMUL_PARAMETERS + 4 * LAYERS * HIDDEN * SEQ)
    assert result.details["model_flops_formula"].startswith("forward only")


def test_forward_only_liger_arm_takes_the_fused_loss_and_agrees(forward_runs):
    liger, baseline = forward_runs["liger"], forward_runs["baseline"]
    assert baseline.loss_path == "hf_cross_entropy"
    assert liger.loss_path == "liger_fused_linear_cross_entropy"
    assert "LigerRMSNorm" in liger.liger_patches
    # no update in between: every step's loss is the same model on the same batch in both arms
    liger_losses = pd.read_csv(liger.steps_file)["loss"]
    baseline_losses = pd.read_csv(baseline.steps_file)["loss"]
    assert liger_losses.tolist() == pytest.approx(baseline_losses.tolist(), rel=1e-5)


@pytest.mark.parametrize("runs", ["lora_runs", "forward_runs"])
def test_each_run_records_the_loss_path_its_prediction_names(runs, request):
    """Predicted and measured join on the loss path: the memory model's name for it is the one the run records."""
    shape = model_shape(model_config(TrainingArgs().model_name))
    for arm, result in request.getfixturevalue(runs).items():
        on_a_gpu = dataclasses.replace(result.training_args, device="cuda")  # a CPU run has no memory to predict
        assert predict_memory(on_a_gpu, shape).loss_path == result.loss_path, arm


@pytest.mark.parametrize(
    "axis, values",
    [
        ("gradient_accumulation_steps", [1, 4]),
        ("gradient_checkpointing", [True, False]),
        ("optim", ["adamw_torch", "sgd"]),
        ("dtype", ["bfloat16", "float32"]),
        ("lora_rank", [0, 16]),
        ("learning_rate", [1e-5, 5e-5]),
    ],
)
def test_each_new_axis_expands_in_the_plan(axis, values):
    experiment = sweep(**{axis: values})
    runs = plan_runs(experiment, TrainingArgs(backend="hf_trainer"), n_runs=1)
    assert [getattr(r.training_args, axis) for r in runs] == values
    assert [r.condition_id for r in runs] == [f"arm=baseline,{axis}={v}" for v in values]
    assert runs[0].swept_axes == ["arm", axis]


def test_float_and_bool_axes_pass_the_strict_from_json():
    experiment = ExperimentArgs.from_json(
        '{"learning_rate": [1e-05, 5e-05, 1], "gradient_checkpointing": [true, false]}'
    )
    assert experiment.learning_rate == [1e-5, 5e-5, 1]
    assert experiment.gradient_checkpointing == [True, False]


@pytest.mark.parametrize(
    "training, message",
    [
        (TrainingArgs(backend="plain_loop", lora_rank=8), "lora_rank 8 does not run with backend 'plain_loop'"),
        (TrainingArgs(backend="forward_only", lora_rank=8), "lora_rank 8 does not run with backend 'forward_only'"),
        (TrainingArgs(backend="hf_trainer", lora_rank=-1), r"training_args\.lora_rank must not be negative"),
        (TrainingArgs(backend="hf_trainer", lora_alpha=0), r"training_args\.lora_alpha must be positive"),
        (TrainingArgs(backend="hf_trainer", lora_dropout=-0.1), r"training_args\.lora_dropout must be in \[0, 1\)"),
        (TrainingArgs(optim="adam"), r"training_args\.optim must be one of"),
    ],
)
def test_lora_and_optimizer_settings_are_checked(training, message):
    with pytest.raises(SpecError, match=message):
        plan_runs(sweep(), training, 1)


def test_adamw_8bit_needs_bitsandbytes_and_a_cuda_device(monkeypatch):
    experiment = sweep(optim=["adamw_8bit"])
    real_find_spec = importlib.util.find_spec
    installed = {"bitsandbytes": False}

    def find_spec(name, *args):  # whatever this machine has: bitsandbytes missing, then present
        if name == "bitsandbytes":
            return object() if installed["bitsandbytes"] else None
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(
        SpecError, match=r"optim 'adamw_8bit' \(condition arm=baseline,optim=adamw_8bit\) needs bitsandbytes"
    ):
        plan_runs(experiment, TrainingArgs(), 1)
    # forward_only builds no optimizer: bitsandbytes is not asked for, and the setting, which would change nothing,
    # is refused as such
    with pytest.raises(SpecError, match=r"experiment_args.optim 'adamw_8bit' acts only where the backend trains"):
        plan_runs(experiment, TrainingArgs(backend="forward_only"), 1)

    installed["bitsandbytes"] = True
    with pytest.raises(SpecError, match="needs a CUDA device"):
        plan_runs(experiment, TrainingArgs(device="cpu"), 1)
    assert plan_runs(experiment, TrainingArgs(device="cuda"), 1)


def test_adamw_8bit_on_a_device_resolved_to_cpu_fails_before_loading(tmp_path):
    """`device: auto` passes planning; the run learns it is on a CPU only when it starts."""
    from finetune_bench.running.backends.common import load_model

    args = TrainingArgs(backend="plain_loop", optim="adamw_8bit")
    with pytest.raises(RuntimeError, match="optim 'adamw_8bit' needs a CUDA device"):
        load_model(args, tmp_path / "no-model", torch.device("cpu"), torch.float32)


def test_every_accepted_optimizer_but_8bit_is_built_by_the_plain_loop(tmp_path):
    """What planning accepts, the plain loop can build (adamw_8bit needs bitsandbytes and a GPU)."""
    from finetune_bench.inputs.catalog import BITSANDBYTES_OPTIMIZERS, OPTIMIZERS
    from finetune_bench.running.backends.plain_loop import build_optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    # Weighted: a layer norm's plain sum of squares is constant, so its gradient would be rounding noise.
    weights = torch.arange(1.0, 5.0)
    for optim in OPTIMIZERS:
        if optim in BITSANDBYTES_OPTIMIZERS:
            continue
        optimizer = build_optimizer(TrainingArgs(optim=optim), model, tmp_path)
        before = model[0].weight.detach().clone()
        (model(torch.randn(2, 4)) * weights).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        assert not torch.equal(before, model[0].weight), optim
