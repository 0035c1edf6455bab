"""Run by tests/kernels/test_kernels.py in a process of its own (Liger on a CPU needs the Triton interpreter set
before Triton is imported): each named kernel's Liger case against its reference case at tiny-llama's shapes,
float32. Prints a JSON object: kernel → the largest differences of the outputs and of the inputs' gradients.

    python kernel_parity.py KERNEL [KERNEL ...]
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

from finetune_bench.running.triton_cpu import install_interpreter_shims  # noqa: E402

install_interpreter_shims()

import torch  # noqa: E402

from finetune_bench.kernels.catalog import build_case  # noqa: E402
from finetune_bench.kernels.settings import LIGER, REFERENCE_PROVIDERS, model_shapes  # noqa: E402

shapes = model_shapes("tiny-llama")
found = {}
for kernel in sys.argv[1:]:
    outputs = {}
    for provider in (LIGER, REFERENCE_PROVIDERS[kernel]):
        case = build_case(kernel, provider, shapes, 8, torch.float32, torch.device("cpu"))
        output = case.forward()
        output.backward(torch.ones_like(output))
        # rope's case takes q's output only: k's gradient is zero (Liger computes it, as zeros) or absent (torch)
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in case.inputs]
        outputs[provider] = (output.detach(), grads)
    (liger_out, liger_grads), (ref_out, ref_grads) = outputs.values()
    found[kernel] = {
        "output": float((liger_out - ref_out).abs().max()),
        "grad": max(float((a - b).abs().max()) for a, b in zip(liger_grads, ref_grads, strict=True)),
        "output_scale": float(ref_out.abs().max()),
    }
print(json.dumps(found))
