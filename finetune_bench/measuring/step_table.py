"""The per-step table (steps.csv): one row per optimizer step, its columns in order, written whole after every step
so that a run killed part-way still leaves the steps it finished, and never a partial row."""

import csv
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass(kw_only=True)
class StepRecord:
    """One optimizer step: a row of the per-step table (steps.csv), its columns in this order."""

    step: int
    step_time_s: float
    non_padding_tokens: int
    padded_tokens: int
    # The shapes of the step's micro-batches ("8x512"; several joined by "+"), and whether the step fed one the run
    # had not fed before (on several GPUs: whether any rank did). See `measuring.steady_state`.
    batch_shape: str = ""
    new_shape: bool = False
    model_flops: float | None = None
    loss: float | None = None
    # The held-out loss evaluated after this step (None: not evaluated after it).
    eval_loss: float | None = None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    # What explains a slow step: time in Python's garbage collector, and how often the CUDA caching
    # allocator had to call cudaMalloc, or free its cache and retry (both synchronize the device).
    gc_time_s: float = 0.0
    cuda_mallocs: int | None = None
    cuda_malloc_retries: int | None = None
    # Triton kernels compiled in the step (a new specialisation of a kernel's arguments, `measuring.triton_compiles`):
    # how many and in how many seconds (on several GPUs the largest of any rank, since the ranks wait for each
    # other), and which (this rank's); None where nothing is counted (`measuring.triton_compiles`).
    triton_compiles: int | None = None
    triton_compile_s: float | None = None
    triton_kernels_compiled: str = ""
    # The bytes the kernel caches (the CUDA driver's JIT cache and Triton's) grew by in the step: kernels compiled for
    # this GPU the first time on this machine (`measuring.jit_cache`; on several GPUs the most any rank saw); None
    # where nothing is counted (no GPU, no cache).
    jit_cache_bytes: int | None = None
    # The GPU's energy over the step, in joules (NVML's counter; None: not known, see `energy_unavailable`).
    energy_j: float | None = None
    is_warmup: bool


STEP_COLUMNS = tuple(column.name for column in fields(StepRecord))


def write_step_table(path: Path, steps: list[StepRecord]) -> None:
    """Write `steps` as the per-step table (CSV, `STEP_COLUMNS`) to `path` atomically: a reader sees the old table
    or the new one, never a partial row."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(STEP_COLUMNS))
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in asdict(step).items()} for step in steps)
    os.replace(partial, path)
