"""SwitchBack on a CUDA GPU: bitsandbytes 0.49.2's kernels through `finetune_bench.running.switchback` against the
published algorithm computed here in float64 (16-bit layers, and float32 master weights under float16 autocast), and
the switchback arm trained end to end (bfloat16, and float16 mixed precision).

Needs a CUDA GPU and the `switchback` extra; `pytest -m gpu tests/running/test_switchback_gpu.py`.
"""

import dataclasses
import os

import pytest
import torch

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("bitsandbytes")


def quantize(x: torch.Tensor, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax int8 quantization (row-wise along `dim`, or of the whole tensor), rounding ties to even."""
    x = x.double()
    scale = x.abs().amax(dim=dim, keepdim=True) if dim is not None else x.abs().max()
    return torch.round(127 * x / scale), scale


def switchback_reference(x, w, g):
    """SwitchBack's forward output, input gradient and weight gradient, in float64."""
    qx, sx = quantize(x, dim=1)
    qw, sw = quantize(w, dim=None)
    out = (qx @ qw.T) * sx * sw / 127**2
    qg, sg = quantize(g, dim=1)
    grad_x = (qg @ qw) * sg * sw / 127**2
    grad_w = g.double().T @ x.double()
    return out, grad_x, grad_w


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_switchback_layer_computes_the_published_algorithm(dtype, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a warm cache could hide a kernel that no longer compiles
    from finetune_bench.running.switchback import install_llrint, switchback_linear_class

    install_llrint()
    torch.manual_seed(0)
    tokens, d_in, d_out = 256, 512, 384
    layer = switchback_linear_class()(d_in, d_out, bias=False, device="cuda", dtype=dtype)
    x = torch.randn(tokens, d_in, device="cuda", dtype=dtype, requires_grad=True)
    g = torch.randn(tokens, d_out, device="cuda", dtype=dtype)
    out = layer(x)
    out.backward(g)
    assert out.dtype == dtype and x.grad.dtype == dtype and layer.weight.grad.dtype == dtype

    ref_out, ref_grad_x, ref_grad_w = switchback_reference(x.detach(), layer.weight.detach(), g)
    exact_out = x.detach().double() @ layer.weight.detach().double().T

    def relative(a, b):
        return float((a.detach().double() - b).abs().max() / b.abs().max())

    # The int8 products are exact; what is left is 16-bit rounding of the scales and of the result.
    assert relative(out, ref_out) < 1e-2
    assert relative(x.grad, ref_grad_x) < 1e-2
    assert relative(layer.weight.grad, ref_grad_w) < 1e-2  # 16-bit, not quantized
    # ... and it is an int8 matmul: it departs from the 16-bit product by the quantization error
    assert 1e-3 < relative(out, exact_out) < 5e-2


def test_a_float32_master_weight_trains_through_switchback_under_float16_autocast(monkeypatch, tmp_path):
    """float16 mixed precision: the layer's weights float32, its input float32 (the residual stream under autocast);
    the kernels get float16 operands (cast as autocast casts an nn.Linear's), the output stays float16, and the
    gradients reach the float32 weight and input through the casts."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    from finetune_bench.running.switchback import install_llrint, switchback_linear_class

    install_llrint()
    torch.manual_seed(0)
    tokens, d_in, d_out = 256, 512, 384
    layer = switchback_linear_class()(d_in, d_out, bias=True, device="cuda", dtype=torch.float32)
    x = torch.randn(tokens, d_in, device="cuda", requires_grad=True)
    g = torch.randn(tokens, d_out, device="cuda", dtype=torch.float16)
    with torch.autocast("cuda", dtype=torch.float16):
        out = layer(x)
    assert out.dtype == torch.float16
    out.backward(g)
    assert layer.weight.dtype == layer.weight.grad.dtype == torch.float32
    assert x.grad.dtype == layer.bias.grad.dtype == torch.float32

    # the published algorithm on the float16 operands the kernels saw
    x16, w16 = x.detach().half(), layer.weight.detach().half()
    ref_out, ref_grad_x, ref_grad_w = switchback_reference(x16, w16, g)
    ref_out = ref_out + layer.bias.detach().half().double()

    def relative(a, b):
        return float((a.detach().double() - b).abs().max() / b.abs().max())

    assert relative(out, ref_out) < 1e-2
    assert relative(x.grad, ref_grad_x) < 1e-2
    assert relative(layer.weight.grad, ref_grad_w) < 1e-2
    assert relative(layer.bias.grad, g.double().sum(dim=0)) < 1e-2
    assert 1e-3 < relative(out, x16.double() @ w16.double().T + layer.bias.detach().double()) < 5e-2  # int8


@pytest.mark.parametrize(
    ("dtype", "backend"), [("bfloat16", "plain_loop"), ("float16", "plain_loop"), ("float16", "hf_trainer")]
)
def test_the_switchback_arm_trains_as_the_baseline_does(dtype, backend, tmp_path, tiny_dataset_dir, tiny_model_dir):
    """Through the child-process launcher, a bfloat16 model or float16 mixed precision (float32 master weights).
    SwitchBack's first steps autotune its kernels for every new matrix shape (seen taking minutes on an H100 with an
    empty Triton cache)."""
    from finetune_bench.running.launch import run_in_child

    results = {}
    for arm in ("switchback", "baseline"):
        args = dataclasses.replace(
            TrainingArgs(),
            arm=arm,
            backend=backend,
            device="cuda",
            dtype=dtype,
            max_steps=10,  # float16's loss scaler skips a few first steps while it finds its scale
            max_seq_length=64,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            eval_examples=4,
        )
        planned = PlannedRun(condition_id=arm, run_number=0, training_args=args, swept_axes=[])
        results[arm] = run_in_child(planned, tiny_dataset_dir, tiny_model_dir, tmp_path / arm, timeout_s=600)
        assert results[arm].status == "ok", f"{results[arm].reason}\n{results[arm].error_tail}"
    switchback, baseline = (results[arm].metrics for arm in ("switchback", "baseline"))
    assert results["switchback"].details["switchback_layers"] == "14"  # 2 decoder layers × q, k, v, o, gate, up, down
    assert results["baseline"].details["switchback_layers"] == "0"
    if dtype == "float16":
        for result in results.values():
            assert result.details["trainable_dtype"] == "float32"
            assert int(result.details["loss_scale_skipped_steps"]) < 6
    # Same seed, same data: the int8 matmuls move the loss a little, not a lot; and training moved it
    assert switchback["final_loss"] == pytest.approx(baseline["final_loss"], abs=0.05)
    assert switchback["final_eval_loss"] == pytest.approx(baseline["final_eval_loss"], abs=0.05)
    assert switchback["final_eval_loss"] < switchback["initial_eval_loss"] - 0.05
    assert os.path.getsize(results["switchback"].steps_file) > 0
