"""Each kernel's cases: Liger's implementation and its reference, built on the same inputs, as Liger's own
benchmark scripts (benchmark/scripts/benchmark_<kernel>.py in linkedin/Liger-Kernel) build them:

| kernel | Liger | reference (provider) | input |
|---|---|---|---|
| rms_norm | LigerRMSNorm | transformers' LlamaRMSNorm (`huggingface`), float32 weight | (T, H) |
| layer_norm | LigerLayerNorm | torch.nn.LayerNorm (`torch`) | (T, H) |
| rope | liger_rotary_pos_emb | transformers' apply_rotary_pos_emb (`huggingface`); q's output | q, k (1, h, T, d) |
| swiglu | LigerSwiGLUMLP | transformers' LlamaMLP, silu (`huggingface`) | (1, T, H) |
| geglu | LigerGEGLUMLP | transformers' LlamaMLP, gelu tanh (`huggingface`) | (1, T, H) |
| cross_entropy | LigerCrossEntropyLoss | torch.nn.CrossEntropyLoss (`torch`) | float32 logits (BT, V) |
| fused_linear_cross_entropy | LigerFusedLinearCrossEntropyLoss | LM head + CrossEntropyLoss (`torch`) | (BT, H) |
| fused_add_rms_norm | LigerFusedAddRMSNorm | residual add, then LlamaRMSNorm (`torch`) | (T, H) twice |
| dyt | LigerDyT | gamma * tanh(alpha * x) + beta (`torch`) | (T, H) |
| relu_squared | LigerReLUSquared | relu(x) ** 2 (`torch`) | (T, I) |
| kl_div | LigerKLDIVLoss | torch.nn.KLDivLoss, batchmean (`torch`) | float32 log-probs (BT, V) |

`torch_compile` is torch.compile of the reference. A case is its inputs that take gradients and a function that
runs the forward and returns the output (the loss, for the losses).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from finetune_bench.kernels.settings import LIGER, TORCH_COMPILE

EPS = 1e-6


@dataclass
class KernelCase:
    forward: Callable[[], torch.Tensor]
    inputs: list[torch.Tensor]


def build_case(
    kernel: str, provider: str, shapes: dict[str, int], tokens: int, dtype: torch.dtype, device: torch.device
) -> KernelCase:
    """`kernel`'s case for `provider` at `tokens`, its inputs drawn from a fixed seed (every provider gets the
    same ones)."""
    torch.manual_seed(0)
    liger = provider == LIGER
    build = _BUILDERS[kernel]
    case = build(liger, shapes, tokens, dtype, device)
    if provider == TORCH_COMPILE:
        # A graph for this size alone: no dynamic-shape graph carried over from the previous size, no silent fall
        # back to eager after too many recompilations.
        torch._dynamo.reset()
        case.forward = torch.compile(case.forward, dynamic=False)
    return case


def _llama_config(shapes: dict[str, int], hidden_act: str = "silu"):  # noqa: ANN202 (a transformers config)
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=shapes["hidden_size"],
        intermediate_size=shapes["intermediate_size"],
        num_attention_heads=shapes["num_attention_heads"],
        num_key_value_heads=shapes["num_key_value_heads"],
        head_dim=shapes["head_dim"],
        hidden_act=hidden_act,
        rope_theta=shapes["rope_theta"],
    )


def _rms_norm(liger: bool, shapes: dict, tokens: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    hidden = shapes["hidden_size"]
    x = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    if liger:
        from liger_kernel.transformers import LigerRMSNorm

        layer = LigerRMSNorm(hidden_size=hidden, eps=EPS).to(device)
    else:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        layer = LlamaRMSNorm(hidden, eps=EPS).to(device)
    return KernelCase(lambda: layer(x), [x])


def _layer_norm(liger: bool, shapes: dict, tokens: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    hidden = shapes["hidden_size"]
    x = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    if liger:
        from liger_kernel.transformers import LigerLayerNorm

        layer = LigerLayerNorm(hidden_size=hidden, eps=EPS)
    else:
        layer = torch.nn.LayerNorm(hidden, eps=EPS)
    layer = layer.to(device).to(dtype)
    return KernelCase(lambda: layer(x), [x])


def _rope(liger: bool, shapes: dict, tokens: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    heads, kv_heads, head_dim = shapes["num_attention_heads"], shapes["num_key_value_heads"], shapes["head_dim"]
    q = torch.randn(1, tokens, heads, head_dim, device=device, dtype=dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(1, tokens, kv_heads, head_dim, device=device, dtype=dtype).transpose(1, 2).requires_grad_()
    positions = torch.arange(tokens, device=device).unsqueeze(0)
    cos, sin = LlamaRotaryEmbedding(config=_llama_config(shapes)).to(device)(k, positions)
    if liger:
        from liger_kernel.transformers import liger_rotary_pos_emb

        return KernelCase(lambda: liger_rotary_pos_emb(q, k, cos, sin, positions)[0], [q, k])
    return KernelCase(lambda: apply_rotary_pos_emb(q, k, cos, sin)[0], [q, k])


def _mlp(activation: str) -> Callable[..., KernelCase]:
    def build(liger: bool, shapes: dict, tokens: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
        config = _llama_config(shapes, hidden_act=activation)
        x = torch.randn(1, tokens, shapes["hidden_size"], device=device, dtype=dtype, requires_grad=True)
        if liger:
            from liger_kernel.transformers import LigerGEGLUMLP, LigerSwiGLUMLP

            layer = (LigerSwiGLUMLP if activation == "silu" else LigerGEGLUMLP)(config=config)
        else:
            from transformers.models.llama.modeling_llama import LlamaMLP

            layer = LlamaMLP(config=config)
        layer = layer.to(device).to(dtype)
        return KernelCase(lambda: layer(x), [x])

    return build


def _cross_entropy(liger: bool, shapes: dict, tokens: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    vocab = shapes["vocab_size"]
    logits = torch.randn(tokens, vocab, device=device, requires_grad=True)  # float32, as transformers' loss sees them
    target = torch.randint(vocab, (tokens,), device=device)
    if liger:
        from liger_kernel.transformers import LigerCrossEntropyLoss

        loss = LigerCrossEntropyLoss()
    else:
        loss = torch.nn.CrossEntropyLoss()
    return KernelCase(lambda: loss(logits, target), [logits])


def _fused_linear_cross_entropy(
    liger: bool, shapes: dict, tokens: int, dtype: torch.dtype, device: torch.device
) -> KernelCase:
    hidden, vocab = shapes["hidden_size"], shapes["vocab_size"]
    x = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    target = torch.randint(vocab, (tokens,), device=device)
    lm_head = torch.nn.Linear(hidden, vocab, bias=False, device=device, dtype=dtype)
    if liger:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        loss = LigerFusedLinearCrossEntropyLoss()
        return KernelCase(lambda: loss(lm_head.weight, x, target), [x])
    loss = torch.nn.CrossEntropyLoss()
    return KernelCase(lambda: loss(lm_head(x), target), [x])


def _fused_add_rms_norm(liger: bool, shapes: dict, tokens: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    hidden = shapes["hidden_size"]
    x = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    residual = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    if liger:
        from liger_kernel.transformers import LigerFusedAddRMSNorm

        layer = LigerFusedAddRMSNorm(hidden_size=hidden, eps=EPS).to(device)
        return KernelCase(lambda: layer(x, residual)[0], [x, residual])
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(hidden, eps=EPS).to(device)
    return KernelCase(lambda: norm(x + residual), [x, residual])


def _dyt(liger: bool, shapes: dict, tokens: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    hidden = shapes["hidden_size"]
    x = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    from liger_kernel.transformers import LigerDyT

    layer = LigerDyT(hidden).to(device).to(dtype)  # its parameters serve the reference too: the same values
    if liger:
        return KernelCase(lambda: layer(x), [x])
    return KernelCase(lambda: layer.gamma * torch.tanh(layer.alpha * x) + layer.beta, [x])


def _relu_squared(liger: bool, shapes: dict, tokens: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    x = torch.randn(tokens, shapes["intermediate_size"], device=device, dtype=dtype, requires_grad=True)
    if liger:
        from liger_kernel.transformers import LigerReLUSquared

        layer = LigerReLUSquared()
        return KernelCase(lambda: layer(x), [x])
    return KernelCase(lambda: torch.relu(x).square(), [x])


def _kl_div(liger: bool, shapes: dict, tokens: int, dtype: torch.dtype, device: torch.device) -> KernelCase:
    vocab = shapes["vocab_size"]
    log_probs = torch.randn(tokens, vocab, device=device).log_softmax(dim=-1).detach().requires_grad_()
    target = torch.randn(tokens, vocab, device=device).softmax(dim=-1)
    if liger:
        from liger_kernel.transformers import LigerKLDIVLoss

        loss = LigerKLDIVLoss(reduction="batchmean")
    else:
        loss = torch.nn.KLDivLoss(reduction="batchmean")
    return KernelCase(lambda: loss(log_probs, target), [log_probs])


_BUILDERS = {
    "rms_norm": _rms_norm,
    "layer_norm": _layer_norm,
    "rope": _rope,
    "swiglu": _mlp("silu"),
    "geglu": _mlp("gelu_pytorch_tanh"),
    "cross_entropy": _cross_entropy,
    "fused_linear_cross_entropy": _fused_linear_cross_entropy,
    "fused_add_rms_norm": _fused_add_rms_norm,
    "dyt": _dyt,
    "relu_squared": _relu_squared,
    "kl_div": _kl_div,
}
