"""The memory model counts what transformers and peft build: parameters and LoRA adapters against real models,
saved activations against what autograd keeps on a CPU, and its verdicts and skips."""

import dataclasses

import pytest
import torch

from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.prediction import grid, memory
from finetune_bench.prediction.gpus import GIB, gpu_kind
from finetune_bench.prediction.shapes import NoPrediction, model_config, model_shape

TINY = ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-phi3"]


def _model(architecture: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**model_config(f"random:{architecture}"))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


@pytest.mark.parametrize("architecture", TINY)
def test_parameter_counts_match_the_built_model(architecture):
    model = _model(architecture)
    shape = model_shape(model_config(f"random:{architecture}"))
    assert shape.parameters == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "architecture,targets", [("tiny-llama", "all-linear"), ("tiny-phi3", "all-linear"), ("tiny-llama", "q_proj,v_proj")]
)
def test_lora_adapter_counts_match_peft(architecture, targets):
    from peft import LoraConfig, get_peft_model

    names = "all-linear" if targets == "all-linear" else targets.split(",")
    model = get_peft_model(
        _model(architecture), LoraConfig(r=4, lora_alpha=8, target_modules=names, task_type="CAUSAL_LM")
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert model_shape(model_config(f"random:{architecture}")).lora_parameters(4, targets) == trainable


def _saved_bytes_per_layer(architecture: str, arm: str, tokens: int) -> float:
    """Bytes autograd keeps for the backward pass per decoder layer and token (distinct storages), measured by
    running one layer of the model on a CPU in float32."""
    from finetune_bench.running.liger_patching import apply_liger

    model = _model(architecture)
    if arm == "liger":
        apply_liger(model)
    layer = model.model.layers[0]
    hidden = torch.randn(1, tokens, model.config.hidden_size, requires_grad=True)
    position_ids = torch.arange(tokens)[None]
    cos_sin = model.model.rotary_emb(hidden, position_ids)
    storages = {}

    def pack(t):
        if t.requires_grad or t.dtype.is_floating_point:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(hidden, attention_mask=None, position_ids=position_ids, position_embeddings=cos_sin)
    # the layer's input and cos/sin belong to the caller: what the layer itself keeps
    storages.pop(hidden.untyped_storage().data_ptr(), None)
    for t in cos_sin:
        storages.pop(t.untyped_storage().data_ptr(), None)
    return sum(storages.values()) / tokens


@pytest.mark.parametrize("architecture", ["tiny-llama", "tiny-phi3"])
def test_saved_activations_per_layer_match_autograd(architecture, undo_liger_patches):
    """The model's per-layer count against what autograd saves, transformers' layers (float32, CPU: sdpa's math
    path on a CPU keeps more than the CUDA kernels do, so attention is compared without its internals)."""
    shape = model_shape(model_config(f"random:{architecture}"))
    args = TrainingArgs(model_name=f"random:{architecture}", dtype="float32", device="cuda", max_seq_length=64)
    step = memory.resolve_step(args, shape, sequences_full=True)
    predicted = memory.layer_activation_bytes(shape, step)
    measured = _saved_bytes_per_layer(architecture, "baseline", 64)
    # On a CPU, sdpa's math path also keeps the S×S attention probabilities (two float32 copies per head); the
    # CUDA kernels the model counts do not. Everything else must match.
    math_path = 2 * 4 * shape.num_heads * 64
    assert measured == pytest.approx(predicted + math_path, rel=0.12)


def test_liger_kernels_save_less_and_the_fused_loss_materializes_no_logits():
    shape = model_shape(model_config("random:llama-3.2-1b"))
    base = TrainingArgs(model_name="random:llama-3.2-1b", dtype="bfloat16", device="cuda", max_seq_length=2048)
    baseline = memory.predict_memory(dataclasses.replace(base, per_device_train_batch_size=8), shape)
    liger = memory.predict_memory(dataclasses.replace(base, per_device_train_batch_size=8, arm="liger"), shape)
    assert liger.breakdown["activations"] < 0.75 * baseline.breakdown["activations"]
    # transformers' loss: 12 bytes per vocabulary entry and token at the backward's start
    assert baseline.breakdown["logits_and_loss"] == pytest.approx(12 * shape.vocab_size * 8 * 2048)
    assert liger.breakdown["logits_and_loss"] < 0.05 * baseline.breakdown["logits_and_loss"]
    assert sum(liger.breakdown.values()) == pytest.approx(liger.peak_reserved_bytes)


@pytest.mark.parametrize(
    "backend, criterion, arm, recorded",
    [
        ("trl_sft", "model", "baseline", "hf_cross_entropy"),
        ("hf_trainer", "model", "liger", "liger_fused_linear_cross_entropy"),
        ("trl_sft", "trl", "liger", "trl_chunked_lm_head"),
        ("plain_loop", "model", "liger:cross_entropy", "liger_cross_entropy"),
        ("plain_loop", "torch_cross_entropy", "liger", "torch_cross_entropy"),
        ("forward_only", "liger_fused_linear_cross_entropy", "baseline", "liger_fused_linear_cross_entropy"),
    ],
)
def test_the_prediction_names_its_loss_path_as_a_run_records_it(backend, criterion, arm, recorded):
    shape = model_shape(model_config("random:llama-3.2-1b"))
    args = TrainingArgs(model_name="random:llama-3.2-1b", backend=backend, criterion=criterion, arm=arm, device="cuda")
    prediction = memory.predict_memory(args, shape)
    assert prediction.loss_path == recorded
    assert f"loss: {recorded}" in prediction.assumptions


def test_the_model_s_liger_cross_entropy_takes_float32_logits_the_plain_loop_s_the_logits_as_they_are():
    shape = model_shape(model_config("random:llama-3.2-1b"))
    args = TrainingArgs(
        model_name="random:llama-3.2-1b", backend="plain_loop", dtype="bfloat16", device="cuda",
        max_seq_length=2048, per_device_train_batch_size=8,
    )  # fmt: skip
    in_model = memory.predict_memory(dataclasses.replace(args, arm="liger:cross_entropy"), shape)
    criterion = memory.predict_memory(dataclasses.replace(args, criterion="liger_cross_entropy"), shape)
    assert in_model.loss_path == criterion.loss_path == "liger_cross_entropy"
    assert in_model.phase == criterion.phase == memory.BACKWARD_START
    # bf16 logits: their float32 copy (2 + 4 bytes per entry) against the logits alone (2)
    assert in_model.breakdown["logits_and_loss"] == pytest.approx(6 * shape.vocab_size * 8 * 2048)
    assert criterion.breakdown["logits_and_loss"] == pytest.approx(2 * shape.vocab_size * 8 * 2048)


def test_small_batches_peak_at_the_optimizer_step_with_adamw_states():
    shape = model_shape(model_config("random:phi-3-mini"))
    args = TrainingArgs(model_name="random:phi-3-mini", dtype="bfloat16", device="cuda", max_seq_length=512)
    p = memory.predict_memory(dataclasses.replace(args, per_device_train_batch_size=1), shape)
    assert p.phase == memory.OPTIMIZER_STEP
    params = shape.parameters * 2
    assert p.breakdown["weights"] == params and p.breakdown["gradients"] == params
    assert p.breakdown["optimizer_states"] == 2 * params  # AdamW's two moments, bf16
    sgd = memory.predict_memory(dataclasses.replace(args, per_device_train_batch_size=1, optim="sgd"), shape)
    assert sgd.breakdown["optimizer_states"] == 0


def test_each_counted_moment_is_kept_and_the_peak_is_the_largest_of_them():
    from finetune_bench.measuring.metrics import MEMORY_PHASES

    shape = model_shape(model_config("random:phi-3-mini"))
    args = TrainingArgs(model_name="random:phi-3-mini", dtype="bfloat16", device="cuda", max_seq_length=512)
    for batch in (1, 16):  # the optimizer step's peak, then the backward pass's start
        p = memory.predict_memory(dataclasses.replace(args, per_device_train_batch_size=batch), shape)
        assert set(p.moments) == {memory.BACKWARD_START, memory.OPTIMIZER_STEP}
        assert max(p.moments, key=p.moments.get) == p.phase
        assert p.moments[p.phase] == p.peak_allocated_bytes
    # the moments are checked against phases a run records
    assert {phase for phases in memory.MOMENT_PHASES.values() for phase in phases} <= set(MEMORY_PHASES)


@pytest.mark.parametrize("as_views", [True, False])
def test_ddp_adds_its_gradient_buckets_where_they_are_held(as_views):
    """DDP's buckets (one gradient's worth, kept all run) at the backward pass's start; at the optimizer step they
    are the gradients (as views) or lie beside them (DDP's default copy)."""
    shape = model_shape(model_config("random:llama-3.2-1b"))
    one = TrainingArgs(
        model_name="random:llama-3.2-1b", backend="plain_loop", dtype="bfloat16", device="cuda", max_seq_length=2048
    )
    several = dataclasses.replace(one, num_gpus=4, parallelism="ddp", ddp_gradient_as_bucket_view=as_views)
    single, ddp = memory.predict_memory(one, shape), memory.predict_memory(several, shape)
    gradients = shape.parameters * 2
    start, step = memory.BACKWARD_START, memory.OPTIMIZER_STEP
    assert ddp.moments[start] == single.moments[start] + gradients
    assert ddp.moments[step] == single.moments[step] + (0 if as_views else gradients)
    assert ddp.breakdown["gradient_buckets"] == gradients and ddp.phase == start
    assert sum(ddp.breakdown.values()) == pytest.approx(ddp.peak_reserved_bytes)
    assert any(a.startswith("DDP on 4 GPUs") for a in ddp.assumptions)
    # under accumulation the micro-batches' gradients (fresh tensors under no_sync) lie beside the buckets
    accumulated = memory.predict_memory(dataclasses.replace(several, gradient_accumulation_steps=2), shape)
    assert accumulated.moments[start] == ddp.moments[start] + gradients


def test_the_trainers_ddp_and_fsdp2_are_not_predicted_and_say_why():
    shape = model_shape(model_config("random:llama-3.2-1b"))
    args = TrainingArgs(model_name="random:llama-3.2-1b", dtype="bfloat16", device="cuda", num_gpus=2)
    with pytest.raises(NoPrediction, match="FSDP2 through backend 'trl_sft': accelerate's fully_shard"):
        memory.predict_memory(dataclasses.replace(args, backend="trl_sft", parallelism="fsdp"), shape)
    with pytest.raises(NoPrediction, match="backend 'trl_sft': the Trainer's DDP"):
        memory.predict_memory(dataclasses.replace(args, backend="trl_sft", parallelism="ddp"), shape)


def test_checkpointing_keeps_one_input_per_layer():
    shape = model_shape(model_config("random:llama-3.2-1b"))
    args = TrainingArgs(model_name="random:llama-3.2-1b", dtype="bfloat16", device="cuda", max_seq_length=2048)
    full = memory.predict_memory(dataclasses.replace(args, per_device_train_batch_size=16), shape)
    ckpt = memory.predict_memory(
        dataclasses.replace(args, per_device_train_batch_size=16, gradient_checkpointing=True), shape
    )
    assert ckpt.breakdown["activations"] < 0.2 * full.breakdown["activations"]


def test_what_is_not_modelled_says_why():
    with pytest.raises(NoPrediction, match="gpt2"):
        model_shape(model_config("random:tiny-gpt2"))
    shape = model_shape(model_config("random:tiny-llama"))
    with pytest.raises(NoPrediction, match="compile"):
        memory.predict_memory(TrainingArgs(arm="compile", device="cuda"), shape)
    with pytest.raises(NoPrediction, match="not known here"):
        model_config("someone/unknown-model")
    # a hub id a bundled architecture was copied from is known offline
    assert model_config("microsoft/Phi-3-mini-4k-instruct")["model_type"] == "phi3"


def test_verdicts_and_skipped_runs():
    training = TrainingArgs(
        model_name="random:llama-3.2-1b", dtype="bfloat16", device="cuda", max_seq_length=2048,
        synthetic_num_examples=64, synthetic_min_words=2100, synthetic_max_words=2200,
    )  # fmt: skip
    planned = plan_runs(ExperimentArgs(arm=["liger", "baseline"], per_device_train_batch_size=[4, 32]), training, 2)
    target = grid.target_gpu("H100")
    estimate = grid.estimate_grid(planned, target, hour_price=2.0, skip_predicted_oom=True)
    verdicts = {c.condition_id: c.verdict for c in estimate.conditions}
    assert verdicts["arm=liger,per_device_train_batch_size=4"] == grid.FITS
    assert verdicts["arm=baseline,per_device_train_batch_size=32"] == grid.OOM
    runs = grid.with_predictions(planned, estimate, skip_predicted_oom=True)
    skipped = [r for r in runs if r.predicted_oom]
    assert {r.condition_id for r in skipped} == {c for c, v in verdicts.items() if v == grid.OOM}
    assert estimate.skipped_runs == len(skipped) and "predicted out of memory" in skipped[0].predicted_oom
    assert all(r.predicted_peak_reserved_bytes > 10 * GIB for r in runs)
    assert estimate.gpu_hours > 0 and estimate.cost == pytest.approx(2.0 * estimate.gpu_hours)


def test_target_gpu_inputs_are_checked():
    assert gpu_kind("nvidia-h100").name == "H100"
    with pytest.raises(Exception, match="no GPU kind 'H300'"):
        grid.target_gpu("H300")
    assert grid.target_gpu("", 40).memory_bytes == 40 * GIB
    with pytest.raises(Exception, match="skip_predicted_oom needs the GPU's memory"):
        grid.check_skip_has_target(True, grid.target_gpu("", 0))
