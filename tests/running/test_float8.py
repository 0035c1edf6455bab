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


@pytest.mark.parametrize(("capability", "refused"), [((8, 0), True), ((8, 6), True), ((8, 9), False), ((9, 0), False)])
def test_a_gpu_below_compute_capability_8_9_is_refused_naming_its_capability(monkeypatch, capability, refused):
    # no such GPU here: the capability torch reports is a stand-in (an A100 is 8.0, an A10 8.6, an L4 8.9, H100 9.0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Stand-in")
    if not refused:
        check_float8_runs_here(torch.device("cuda"))
        return
    needed = rf"compute capability 8\.9 or newer .*NVIDIA Stand-in has {capability[0]}\.{capability[1]}"
    with pytest.raises(Float8NotRunnable, match=needed):
        check_float8_runs_here(torch.device("cuda"))
