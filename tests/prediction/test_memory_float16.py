"""The memory model and float16 mixed precision: a full fine-tune is not predicted, and why (what autograd saves
under float16 autocast from float32 weights is not the 16-bit model the model counts); LoRA (a float16 base) and
forward passes are predicted as the 16-bit runs they are."""

import dataclasses

import pytest
import torch

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.prediction import memory
from finetune_bench.prediction.shapes import NoPrediction, model_config, model_shape

LLAMA_1B = "random:llama-3.2-1b"


def args(**overrides) -> TrainingArgs:
    base = TrainingArgs(model_name=LLAMA_1B, device="cuda", max_seq_length=2048, per_device_train_batch_size=4)
    return dataclasses.replace(base, **overrides)


@pytest.mark.parametrize("backend", ["plain_loop", "hf_trainer", "trl_sft"])
def test_a_float16_full_fine_tune_is_not_predicted_and_says_why(backend):
    shape = model_shape(model_config(LLAMA_1B))
    with pytest.raises(NoPrediction, match="float16 mixed precision .* is not modelled: float32 master weights"):
        memory.predict_memory(args(backend=backend, dtype="float16"), shape)


def test_float16_lora_and_forward_passes_are_predicted_as_their_bfloat16_twins():
    shape = model_shape(model_config(LLAMA_1B))
    for settings in ({"backend": "hf_trainer", "lora_rank": 16}, {"backend": "forward_only"}):
        float16 = memory.predict_memory(args(dtype="float16", **settings), shape)
        bfloat16 = memory.predict_memory(args(dtype="bfloat16", **settings), shape)
        assert float16.peak_reserved_bytes == bfloat16.peak_reserved_bytes > 0
        assert float16.breakdown == bfloat16.breakdown
    lora = memory.predict_memory(args(dtype="float16", backend="hf_trainer", lora_rank=16), shape)
    assert lora.breakdown["weights"] > 2 * shape.parameters  # the float16 base and the float32 adapters


def _saved_under_float16_autocast(tokens: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """One tiny-llama decoder layer of float32 weights run under CPU float16 autocast, its input float32 (the
    residual stream is, under autocast from float32 weights): the layer and the floating-point tensors autograd keeps
    for its backward pass (one per storage; the layer's input and RoPE's tables belong to the caller)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(**model_config("random:tiny-llama"))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    layer = model.model.layers[0]
    hidden = torch.randn(1, tokens, config.hidden_size, requires_grad=True)
    position_ids = torch.arange(tokens)[None]
    cos_sin = model.model.rotary_emb(hidden, position_ids)
    callers = {t.untyped_storage().data_ptr() for t in (hidden, *cos_sin)}
    saved: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype.is_floating_point and t.untyped_storage().data_ptr() not in callers:
            saved[t.untyped_storage().data_ptr()] = t  # kept alive here: no storage is freed and reused meanwhile
        return t

    with torch.autocast("cpu", dtype=torch.float16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = layer(hidden, attention_mask=None, position_ids=position_ids, position_embeddings=cos_sin)
    assert output.dtype == torch.float32  # the residual stream: float32 input + float16 o_proj/down_proj outputs
    return layer, list(saved.values())


def test_float16_autocast_keeps_float16_weight_copies_and_float32_activations():
    """Why the full fine-tune is not predicted as a 16-bit model: under float16 autocast from float32 weights,
    autograd keeps a float16 copy of every linear weight for the backward pass (2 bytes a parameter the 16-bit count
    has no place for, beside float32 weights, gradients and AdamW states), and float32 activations (the residual
    stream and the norms on it) beside float16 ones."""
    tokens = 48
    layer, saved = _saved_under_float16_autocast(tokens)
    linear_weights = [m.weight for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    weight_shapes = {tuple(w.shape) for w in linear_weights} | {tuple(w.shape[::-1]) for w in linear_weights}
    copies = [t for t in saved if t.dtype == torch.float16 and tuple(t.shape) in weight_shapes]
    assert sum(t.untyped_storage().nbytes() for t in copies) == 2 * sum(w.numel() for w in linear_weights)
    activations = {t.dtype for t in saved if tokens in t.shape}
    assert activations == {torch.float16, torch.float32}
    hidden = layer.self_attn.q_proj.in_features
    assert any(t.dtype == torch.float32 and tuple(t.shape) == (1, tokens, hidden) for t in saved)
