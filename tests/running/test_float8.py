"""The float8 component's wiring on a CPU: which layers torchao converts (the decoder's linear layers, never the LM
head), and the refusals a machine without float8 matmuls gives before anything is loaded. Its matmuls are a GPU's:
the float8 figures are measured on one (docs/measurements.md)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from finetune_bench.running.float8 import Float8NotRunnable, apply_float8, check_float8_runs_here, float8_eligible


def tiny_llama(hidden: int = 32) -> LlamaForCausalLM:
    config = LlamaConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=2, vocab_size=96
    )
    return LlamaForCausalLM(config)


def test_float8_converts_every_decoder_linear_layer_and_leaves_the_lm_head():
    from torchao.float8.float8_linear import Float8Linear

    model = tiny_llama()
    linear_layers = [name for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    converted = apply_float8(model)
    assert converted == len(linear_layers) - 1 == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert type(model.lm_head) is torch.nn.Linear
    assert all(
        isinstance(layer, Float8Linear)
        for layer in model.model.layers[0].self_attn.children()
        if isinstance(layer, torch.nn.Linear)
    )


def test_layers_float8_s_matmul_does_not_take_stay_as_they_are():
    assert not float8_eligible(torch.nn.Linear(24, 32), None)  # 24 is not a multiple of 16
    head = torch.nn.Linear(32, 96)
    assert float8_eligible(head, None) and not float8_eligible(head, head)
    with pytest.raises(Float8NotRunnable, match="converted no linear layer"):
        apply_float8(tiny_llama(hidden=24))


def test_a_cpu_run_of_float8_is_refused_before_loading():
    with pytest.raises(Float8NotRunnable, match="needs a CUDA GPU, and this run's device is cpu"):
        check_float8_runs_here(torch.device("cpu"))
