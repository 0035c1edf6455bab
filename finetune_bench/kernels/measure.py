"""How one point is measured, as Liger's benchmark scripts measure it (benchmark/scripts/utils.py):

- speed: `triton.testing.do_bench` (warm-up, then repetitions for `rep_ms`, the gradients of the inputs reset
  between calls), its 50th, 20th and 80th percentiles in milliseconds. `backward` times the backward of one
  forward's output (kept with retain_graph), `full` a forward and its backward;
- memory: the peak of torch's allocated memory during a call, in MB (2**20 bytes), over 10 calls (the same
  percentiles): whatever is alive then counts (inputs, weights, gradients, the retained graph).

On a CPU (no CUDA timer, no allocator statistics) the times are perf_counter over a few calls and there is no
memory figure: a check that the kernels run, not a measurement.
"""

import time
from collections.abc import Callable

import numpy as np
import torch

from finetune_bench.kernels.catalog import KernelCase
from finetune_bench.kernels.settings import CPU_CALLS

QUANTILES = (0.5, 0.2, 0.8)
MEMORY_CALLS = 10


def mode_function(case: KernelCase, mode: str) -> Callable[[], object]:
    """The call that `mode` times: the forward, the backward of one forward's output, or both."""
    if mode == "forward":
        return case.forward
    output = case.forward()
    grad = torch.randn_like(output)
    if mode == "backward":
        return lambda: output.backward(grad, retain_graph=True)
    return lambda: case.forward().backward(grad)


def speed_ms(case: KernelCase, mode: str, device: torch.device, warmup_ms: int, rep_ms: int) -> list[float]:
    """The 50th, 20th and 80th percentiles of the call's time, in milliseconds."""
    call = mode_function(case, mode)
    if device.type == "cuda":
        import triton.testing

        return list(
            triton.testing.do_bench(
                call, warmup=warmup_ms, rep=rep_ms, grad_to_none=case.inputs, quantiles=list(QUANTILES)
            )
        )
    call()
    times = []
    for _ in range(CPU_CALLS):
        for tensor in case.inputs:
            tensor.grad = None
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return [float(np.quantile(times, q)) for q in QUANTILES]


def memory_mb(case: KernelCase, mode: str, device: torch.device) -> list[float] | None:
    """The 50th, 20th and 80th percentiles of the peak allocated memory during the call, in MB; None on a CPU."""
    if device.type != "cuda":
        return None
    call = mode_function(case, mode)
    peaks = []
    for _ in range(MEMORY_CALLS):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        call()
        torch.cuda.synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device) / 2**20)
    return [float(np.quantile(peaks, q)) for q in QUANTILES]
