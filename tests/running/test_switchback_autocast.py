"""The SwitchBack layer under float16 autocast, on a CPU: `finetune_bench.running.switchback`'s casting around an
autograd Function that autocast does not see. bitsandbytes' own Function needs a CUDA GPU
(tests/running/test_switchback_gpu.py runs it); here a stand-in with its contract (float16 operands in, float16 out,
the weight gradient a plain matmul in the gradient's dtype) takes its place."""

import pytest
import torch

from finetune_bench.running.switchback import AutocastLinearFunction, autocast_operands


class Float16Only(torch.autograd.Function):
    """bitsandbytes' `_switchback_global` contract without its int8 kernels: X·Wᵀ written in float16 whatever the
    operands' dtype; the input gradient G·W and the weight gradient Gᵀ·X in G's dtype (a plain matmul, as
    bitsandbytes computes it: `torch.matmul(G.t(), X.to(G.dtype))`). It records the operands' dtypes it saw."""

    seen: list[tuple[torch.dtype, torch.dtype]] = []

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        Float16Only.seen.append((x.dtype, weight.dtype))
        ctx.save_for_backward(x, weight)
        out = x.float() @ weight.float().t()
        if bias is not None:
            out = out + bias.float()
        return out.half()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        grad_x = (g.float() @ weight.float()).to(grad.dtype).view(*grad.shape[:-1], -1)
        grad_w = torch.matmul(g.t(), x.reshape(-1, x.shape[-1]).to(g.dtype))
        return grad_x, grad_w, g.sum(dim=0) if ctx.needs_input_grad[2] else None


class StandIn(AutocastLinearFunction):
    _fn = Float16Only


def test_under_autocast_the_operands_are_cast_and_the_output_is_autocast_s_dtype():
    x, weight, bias = torch.randn(4, 8), torch.randn(3, 8), torch.randn(3)
    with torch.autocast("cpu", dtype=torch.float16):
        cast_x, cast_weight, cast_bias, out_dtype = autocast_operands(x, weight, bias)
    assert (cast_x.dtype, cast_weight.dtype, cast_bias.dtype, out_dtype) == (torch.float16,) * 4
    assert autocast_operands(x, weight, None)[2] is None
    # outside autocast nothing is cast, and the output follows the input (a bfloat16 model's layer)
    x16, w16 = x.bfloat16(), weight.bfloat16()
    same_x, same_w, no_bias, out_dtype = autocast_operands(x16, w16, None)
    assert same_x is x16 and same_w is w16 and no_bias is None and out_dtype == torch.bfloat16


def test_a_float32_master_weight_trains_through_the_float16_function_under_autocast():
    torch.manual_seed(0)
    layer = StandIn(16, 8, bias=True)  # float32 master weights
    x = torch.randn(2, 5, 16, requires_grad=True)  # the residual stream's float32 under autocast
    Float16Only.seen.clear()
    with torch.autocast("cpu", dtype=torch.float16):
        out = layer(x)
    assert Float16Only.seen == [(torch.float16, torch.float16)]  # the kernels' own dtype, not float32
    assert out.dtype == torch.float16  # as autocast's nn.Linear returns it: no cast back to float32
    grad = torch.randn_like(out)
    out.backward(grad)
    # the gradients reach the float32 master weight, bias and input through the casts, in float32
    assert layer.weight.grad.dtype == layer.bias.grad.dtype == x.grad.dtype == torch.float32
    x16, w16, g = x.detach().half().float(), layer.weight.detach().half().float(), grad.float().reshape(-1, 8)
    torch.testing.assert_close(layer.weight.grad, g.t() @ x16.reshape(-1, 16), rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(layer.bias.grad, g.sum(dim=0), rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(x.grad, (g @ w16).view(2, 5, 16), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_outside_autocast_a_16_bit_layer_runs_as_before(dtype):
    """A bfloat16 model (no autocast in the plain loop) gets the float16 output cast back to bfloat16; a float16
    one (forward passes) gets it as it is."""
    layer = StandIn(16, 8, bias=False, dtype=dtype)
    x = torch.randn(3, 16, dtype=dtype, requires_grad=True)
    Float16Only.seen.clear()
    out = layer(x)
    assert Float16Only.seen == [(dtype, dtype)] and out.dtype == dtype
    out.sum().backward()
    assert layer.weight.grad.dtype == x.grad.dtype == dtype
