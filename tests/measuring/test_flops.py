from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from finetune_bench.inputs.catalog import architecture_config
from finetune_bench.measuring.flops import (
    PEAK_BF16_DENSE_TFLOPS,
    attention_flops_per_token,
    matmul_parameters,
    mfu,
    peak_bf16_tflops,
    training_flops_per_token,
)

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 176, 3, 8, 2, 16, 1000


def small_llama(tie_word_embeddings: bool, head_dim: int = HEAD_DIM) -> LlamaForCausalLM:
    config = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=head_dim,
        vocab_size=VOCAB,
        tie_word_embeddings=tie_word_embeddings,
    )
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def hand_count(head_dim: int = HEAD_DIM) -> int:
    q = HIDDEN * HEADS * head_dim
    kv = 2 * HIDDEN * KV_HEADS * head_dim  # GQA: k and v have KV_HEADS heads
    o = HEADS * head_dim * HIDDEN
    mlp = 3 * HIDDEN * INTERMEDIATE  # gate, up, down
    lm_head = HIDDEN * VOCAB
    return LAYERS * (q + kv + o + mlp) + lm_head


@pytest.mark.parametrize("tied", [False, True])
def test_matmul_parameters_matches_a_hand_count(tied):
    model = small_llama(tie_word_embeddings=tied)
    assert model.model.embed_tokens.weight.is_meta
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    # The tied LM head is still a matmul per token; the embedding lookup never is.
    assert matmul_parameters(model) == hand_count()


def test_tying_changes_the_parameter_count_but_not_the_matmul_count():
    untied, tied = small_llama(tie_word_embeddings=False), small_llama(tie_word_embeddings=True)
    unique = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert unique(untied) - unique(tied) == HIDDEN * VOCAB
    assert matmul_parameters(untied) == matmul_parameters(tied)


def test_attention_width_is_heads_times_head_dim_not_hidden_size():
    # 8 heads * 32 = 256 != hidden_size 64 (as in Gemma): both the q/o projections and the attention term use 256.
    model = small_llama(tie_word_embeddings=False, head_dim=32)
    assert matmul_parameters(model) == hand_count(head_dim=32)
    expected = 6 * hand_count(head_dim=32) + 12 * LAYERS * HEADS * 32 * 512
    assert training_flops_per_token(model, 512) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("seq_len", [1, 512, 2048.5])
def test_training_flops_per_token_is_6n_plus_attention(seq_len):
    model = small_llama(tie_word_embeddings=True)
    expected = 6 * hand_count() + 12 * LAYERS * (HEADS * HEAD_DIM) * seq_len
    assert training_flops_per_token(model, seq_len) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("unset", ["none", "missing"])
def test_head_dim_defaults_to_hidden_over_heads(unset):
    model = small_llama(tie_word_embeddings=False, head_dim=HIDDEN // HEADS)
    config = SimpleNamespace(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS)
    if unset == "none":
        config.head_dim = None
    model.config = config  # a config without get_text_config, and without a usable head_dim
    expected = 6 * hand_count(head_dim=HIDDEN // HEADS) + 12 * LAYERS * HIDDEN * 100
    assert training_flops_per_token(model, 100) == pytest.approx(expected, rel=1e-12)


def test_attention_flops_per_token_formula():
    assert attention_flops_per_token(16, 2048, 1024) == 12 * 16 * 2048 * 1024


def test_gpt2_conv1d_layers_count_as_matmuls():
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=64)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    h = 32
    # c_attn (h -> 3h), attn c_proj (h -> h), c_fc (h -> 4h), mlp c_proj (4h -> h), plus the tied LM head.
    assert matmul_parameters(model) == 2 * (3 * h * h + h * h + 4 * h * h + 4 * h * h) + h * 100


def llama_3_2_1b():
    d = architecture_config("llama-3.2-1b")
    config = AutoConfig.for_model(
        d["model_type"], **{k: v for k, v in d.items() if k not in ("model_type", "_name_or_path")}
    )
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_llama_3_2_1b_matmul_parameters():
    model = llama_3_2_1b()
    h, kv, ffn, layers, vocab = 2048, 8 * 64, 8192, 16, 128256
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * ffn  # q, o; k, v (GQA, 8 kv heads); gate, up, down
    lm_head = h * vocab  # 262.7M, tied to the embedding but still a matmul
    assert lm_head == 262_668_288
    assert matmul_parameters(model) == layers * per_layer + lm_head == 1_235_746_816
    assert matmul_parameters(model) == pytest.approx(1.236e9, rel=0.01)
    # The stored parameters are the matmul weights plus the embedding (same tensor as the head, so once)
    # and the norms: the embedding lookup adds nothing to N.
    norms = h * (2 * layers + 1)
    assert sum(p.numel() for p in model.parameters()) == matmul_parameters(model) + norms
    expected = 6 * 1_235_746_816 + 12 * layers * (32 * 64) * 2048
    assert training_flops_per_token(model, 2048) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("nvidia l40s", "L40S"),
    ],
)
def test_peak_bf16_tflops_known_names(name, key):
    assert peak_bf16_tflops(name) == PEAK_BF16_DENSE_TFLOPS[key]


def test_peak_table_values():
    assert PEAK_BF16_DENSE_TFLOPS["H100 SXM"] == 989.4
    assert PEAK_BF16_DENSE_TFLOPS["H100 PCIe"] == 756.0
    assert PEAK_BF16_DENSE_TFLOPS["A100"] == 312.0
    assert PEAK_BF16_DENSE_TFLOPS["L4"] == 121.0
    assert PEAK_BF16_DENSE_TFLOPS["L40S"] == 362.05
    # Look-alike names resolve to different parts.
    assert peak_bf16_tflops("NVIDIA L40S") != peak_bf16_tflops("NVIDIA L4")
    assert peak_bf16_tflops("NVIDIA A100-SXM4-80GB") != peak_bf16_tflops("NVIDIA A10G")


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA GeForce RTX 4090",
        "cpu",
        "",
        "NVIDIA GH200 480GB",
        "NVIDIA B200",
        "Tesla T4",
        "NVIDIA H800",
        "AMD MI300X",
    ],
)
def test_peak_bf16_tflops_unknown_names_are_none(name):
    assert peak_bf16_tflops(name) is None


def test_mfu():
    assert mfu(494.7, "NVIDIA H100 80GB HBM3") == pytest.approx(0.5)
    assert mfu(156.0, "NVIDIA A100-SXM4-40GB") == pytest.approx(0.5)
    assert mfu(100.0, "NVIDIA GeForce RTX 4090") is None
    assert mfu(100.0, "cpu") is None


def lora_hand_count(rank: int) -> int:
    """LoRA adapters on every projection of every layer (peft's "all-linear": not the LM head): A (r × in)
    and B (out × r) per Linear."""
    q = o = rank * (HIDDEN + HEADS * HEAD_DIM)
    k = v = rank * (HIDDEN + KV_HEADS * HEAD_DIM)
    mlp = 3 * rank * (HIDDEN + INTERMEDIATE)
    return LAYERS * (q + k + v + o + mlp)


def test_lora_flops_give_frozen_weights_forward_and_input_gradient_only():
    from peft import LoraConfig, get_peft_model

    from finetune_bench.measuring.flops import (
        flops_formula,
        model_flops_per_token,
        trainable_and_frozen_matmul_parameters,
    )

    model = get_peft_model(small_llama(tie_word_embeddings=False), LoraConfig(r=8, target_modules="all-linear"))
    assert trainable_and_frozen_matmul_parameters(model) == (lora_hand_count(8), hand_count())
    # 6 per trained weight (forward, input gradient, weight gradient), 4 per frozen one (no weight gradient)
    expected = 6 * lora_hand_count(8) + 4 * hand_count() + 12 * LAYERS * HEADS * HEAD_DIM * 512
    assert model_flops_per_token(model, 512) == pytest.approx(expected, rel=1e-12)
    assert training_flops_per_token(model, 512) == model_flops_per_token(model, 512)
    assert "N_frozen" in flops_formula(model)


def test_forward_only_flops_are_a_third_of_a_full_training_step():
    from finetune_bench.measuring.flops import flops_formula, model_flops_per_token

    model = small_llama(tie_word_embeddings=False)
    expected = 2 * hand_count() + 4 * LAYERS * HEADS * HEAD_DIM * 512
    assert model_flops_per_token(model, 512, training=False) == pytest.approx(expected, rel=1e-12)
    assert model_flops_per_token(model, 512, training=False) == pytest.approx(training_flops_per_token(model, 512) / 3)
    assert attention_flops_per_token(16, 2048, 1024, training=False) == 4 * 16 * 2048 * 1024
    assert flops_formula(model, training=False).startswith("forward only")
    assert flops_formula(model) == "training: 6*N + 12*L*H*S"  # nothing frozen: a full fine-tune
