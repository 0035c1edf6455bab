"""SwitchBack linear layers (Wortsman et al., 2023, "Stable and low-precision training for large-scale
vision-language models"), through bitsandbytes 0.49.2's Triton kernels, on today's Triton.

The algorithm, as bitsandbytes implements it (`SwitchBackLinear`, global weight quantization): the forward
X·Wᵀ is an int8 matmul of X quantized row-wise and W quantized tensor-wise (each scaled by its absolute maximum
to ±127 and rounded to the nearest integer, ties to even), dequantized to 16 bits; the input gradient G·W
likewise (G row-wise, W tensor-wise); the weight gradient Gᵀ·X stays a 16-bit matmul ("switching back").

Two things stand between those kernels and Triton 3.x; both are bridged here, not rewritten:
- Their quantize kernels round with `tl.libdevice.llrint`, which Triton 3 removed. `install_llrint` puts a
  `tl.libdevice.llrint` back (`finetune_bench.running.switchback_llrint`): the llrint of Triton's current
  libdevice, its argument cast to float32 (today's llrint takes float32 or float64 only).
- Their matmul kernels write float16 whatever the input's dtype, so a bfloat16 model fails at its first layer
  that follows one (a dtype mismatch). `SwitchBackLinear` here casts the output back to the input's dtype (the
  gradient flows back through the cast).

float16 training is mixed precision (`backends.common.trains_mixed_float16`): float32 master weights, the forward
pass under `torch.autocast(float16)`. Autocast casts an nn.Linear's operands to float16, but it does not see into
SwitchBack's autograd Function: a float32 input would be quantized from float32 and saved in float32 for the weight
gradient, and the output cast back to float32. So under autocast `SwitchBackLinear` casts its input, weight and bias
to autocast's dtype itself, as autocast would (`autocast_operands`), and returns the kernels' float16 output as it is:
the kernels see exactly what they see in a float16 model. The casts are differentiable, so the 16-bit weight
gradient (Gᵀ·X, a plain matmul inside the Function) reaches the float32 master weight through the weight's cast,
and the input gradient the float32 input through the input's. A bfloat16 model (under the Trainers' bfloat16
autocast or under none) and a float16 one outside autocast (forward passes only) get their operands as they are and
the output in the input's dtype, as before.

Where the numerics differ from the kernels' own on their Triton: Triton 3 no longer promotes `127.0 * half` to
float32, so the scaled value is rounded to the input's dtype before llrint sees it; with bfloat16 inputs a value
can land up to about 0.75 of a quantization step off instead of 0.5. And the kernels keep float16 scales and
outputs: a bfloat16 model's activations and gradients pass through float16 (overflow above 65504; a gradient
below about 6e-8 becomes zero), and the casts cost throughput (the report's Summary says so for such an arm).
float16 mixed precision avoids all three (its loss scale keeps small gradients in float16's range); with bfloat16
compare the loss within a tolerance, as the report does.
"""

import types

import torch


class SwitchBackUnavailable(RuntimeError):
    """The switchback arm cannot run here (no bitsandbytes 0.49.2, no CUDA GPU)."""


def install_llrint() -> bool:
    """Give `triton.language` the `libdevice.llrint` that bitsandbytes' SwitchBack kernels call, if this Triton
    lacks it; True if it was installed. Before the first SwitchBack forward: Triton reads the kernels' globals
    when it compiles them (and its cache key does not cover this, so a cached kernel may hide a missing one)."""
    import triton.language as tl

    if hasattr(tl, "libdevice"):
        return False  # a Triton that still has it (before 3.0): the kernels run as written
    from finetune_bench.running.switchback_llrint import llrint

    libdevice = types.ModuleType("triton.language.libdevice")
    libdevice.llrint = llrint
    tl.libdevice = libdevice
    return True


def autocast_operands(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.dtype]:
    """(x, weight, bias, the output's dtype) for a linear layer whose matmul autocast does not see: under autocast on
    `x`'s device, all three cast to autocast's dtype, as autocast casts an nn.Linear's operands (differentiable casts:
    a float32 master weight gets its gradient through its cast), and the output in that dtype; otherwise all three
    as they are, and the output in `x`'s dtype."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        return x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype), dtype
    return x, weight, bias, x.dtype


class AutocastLinearFunction(torch.nn.Linear):
    """A linear layer that computes through the autograd Function in `_fn` (`_fn.apply(x, weight, bias)`, as
    bitsandbytes' SwitchBackLinear does in training and in evaluation alike, its weights not pre-quantized), its
    operands and output as `autocast_operands` says."""

    _fn: type[torch.autograd.Function]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, weight, bias, out_dtype = autocast_operands(x, self.weight, self.bias)
        return self._fn.apply(x, weight, bias).to(out_dtype)


def switchback_linear_class() -> type[torch.nn.Linear]:
    """bitsandbytes' SwitchBackLinear with its output in its input's dtype, or under autocast in autocast's dtype
    from inputs cast to it (`AutocastLinearFunction`)."""
    try:
        from bitsandbytes.nn import SwitchBackLinear as BitsandbytesSwitchBackLinear
    except ImportError as exc:
        raise SwitchBackUnavailable(
            "the switchback arm needs bitsandbytes 0.49.2 (the last release with SwitchBack): "
            "pip install 'finetune-bench[switchback]'"
        ) from exc

    class SwitchBackLinear(AutocastLinearFunction, BitsandbytesSwitchBackLinear):
        pass

    return SwitchBackLinear


def apply_switchback(model: torch.nn.Module) -> int:
    """Replace every nn.Linear of the decoder layers (not the LM head or embeddings) by a SwitchBack linear
    layer with the same weights; return how many were replaced."""
    layer_class = switchback_linear_class()
    if not next(model.parameters()).is_cuda:
        raise SwitchBackUnavailable("the switchback arm needs a CUDA GPU: SwitchBack's kernels are Triton GPU kernels")
    install_llrint()
    layers = model.get_decoder().layers
    replaced = 0
    for parent in layers.modules():
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                switchback = layer_class(
                    child.in_features, child.out_features, bias=child.bias is not None,
                    device=child.weight.device, dtype=child.weight.dtype,
                )  # fmt: skip
                switchback.load_state_dict(child.state_dict())
                setattr(parent, name, switchback)
                replaced += 1
    if not replaced:
        raise RuntimeError("the switchback arm found no nn.Linear layer in the decoder to replace")
    return replaced
