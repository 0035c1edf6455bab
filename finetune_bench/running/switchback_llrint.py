"""`llrint` for bitsandbytes' SwitchBack kernels on Triton 3 (see `finetune_bench.running.switchback`).

A module of its own: `@triton.jit` reads its function's source from a file, and importing it imports Triton.
"""

import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def llrint(x):  # noqa: ANN001, ANN201 (a Triton function: its argument and result are Triton tensors)
    """Round to the nearest integer, ties to even, as a 64-bit integer: libdevice's llrint of `x` in float32."""
    return libdevice.llrint(x.to(tl.float32))
