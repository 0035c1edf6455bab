import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from finetune_bench.inputs.arms import supported_model_types
from finetune_bench.running.liger_patching import LigerNotApplied, apply_liger, patch_report

# Liger patches module-wide: undo it after each test, so later tests build vanilla models.
pytestmark = pytest.mark.usefixtures("undo_liger_patches")


def test_supported_types_come_from_liger():
    assert {"llama", "phi3", "qwen2", "mistral", "gemma2"} <= set(supported_model_types())


def test_unpatchable_model_type_is_refused():
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    with pytest.raises(LigerNotApplied, match="'gpt2'"):
        apply_liger(model)


def test_patch_report_counts_what_liger_replaced():
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=64
    )
    model = LlamaForCausalLM(config)
    assert patch_report(model) == {}
    report = apply_liger(model, fused_linear_cross_entropy=False, cross_entropy=False)
    assert report["LigerRMSNorm"] == 2 * 2 + 1  # two per layer and the final norm
    assert report["LigerSwiGLUMLP"] == 2
    assert isinstance(model.model.norm.weight, torch.nn.Parameter)
