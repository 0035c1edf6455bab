"""Run Liger's Triton kernels on a CPU through the Triton interpreter (tests and smoke runs only).

Timings taken this way say nothing about Liger's speed: the interpreter executes each kernel as
NumPy code, about 100x slower than the eager PyTorch it replaces.

Two faults of the interpreter need mending before Liger's RMSNorm and SwiGLU kernels run:
- a Python float kernel argument (e.g. `eps`) arrives as a bare float instead of an fp32 scalar
  tensor, so `eps.to(tl.float32)` fails;
- libdevice `rsqrt` / `tanh`, which Liger's ops modules bind at import, are empty stubs under the
  interpreter, while `tl.math.rsqrt` and `tl.sigmoid` work.
"""

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import triton.language as tl

INTERPRETER_ENV = {"TRITON_INTERPRET": "1"}
_LIGER_OPS_WITH_LIBDEVICE = (
    "rms_norm",
    "layer_norm",
    "fused_add_rms_norm",
    "group_norm",
    "cross_entropy",
    "geglu",
    "dyt",
)


def install_interpreter_shims() -> None:
    """Patch the interpreter and Liger's ops modules. Requires TRITON_INTERPRET=1 set before import."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("TRITON_INTERPRET=1 must be set before triton is imported to run Liger on a CPU")
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    if not getattr(interpreter, "_finetune_bench_shimmed", False):
        original_cvt = interpreter._implicit_cvt

        def implicit_cvt(arg: Any) -> Any:
            if isinstance(arg, float):
                handle = interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32)
                return tl.tensor(handle, tl.float32)
            return original_cvt(arg)

        interpreter._implicit_cvt = implicit_cvt
        interpreter._finetune_bench_shimmed = True

    # Looked up at call time: the interpreter swaps tl.math's builtins for its own while a kernel runs.
    def rsqrt(x: "tl.tensor") -> "tl.tensor":
        return tl.math.rsqrt(x)

    def tanh(x: "tl.tensor") -> "tl.tensor":
        return 2 * tl.sigmoid(2 * x) - 1

    for name in _LIGER_OPS_WITH_LIBDEVICE:
        try:
            module = importlib.import_module(f"liger_kernel.ops.{name}")
        except ModuleNotFoundError:
            continue  # an older or newer liger without this op: nothing to mend
        if hasattr(module, "rsqrt"):
            module.rsqrt = rsqrt
        if hasattr(module, "tanh"):
            module.tanh = tanh
