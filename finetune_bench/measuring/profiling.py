"""Where a training step's time and memory go: a few extra steps under torch.profiler, after the timed ones.

`profile_steps` runs `steps` more optimizer steps (the caller's step function, the same one training uses) under
`torch.profiler` and, on a GPU, with the CUDA caching allocator's history recorded. It writes, in `out_dir`:

- `trace.json`: the Chrome trace (chrome://tracing, https://ui.perfetto.dev);
- `memory_snapshot.pickle` (GPU only): the allocator's snapshot, for https://pytorch.org/memory_viz;
- `profile.csv`: one row per GPU kernel (on a CPU: per operator, by its self time) with its category, its time
  and calls per step, and its share of the profiled time.

The timed steps are over before this starts: profiling never changes what they measured.
"""

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: the launcher reads the file names without it
    import torch

logger = logging.getLogger(__name__)

# A run's profile lives in PROFILE_DIR under its work directory.
PROFILE_DIR = "profile"
TRACE_FILE, SNAPSHOT_FILE, PROFILE_FILE = "trace.json", "memory_snapshot.pickle", "profile.csv"
PROFILE_COLUMNS = ("name", "category", "time_ms_per_step", "calls_per_step", "share")
MEMORY_HISTORY_ENTRIES = 100_000

# Where a kernel's (or operator's) time goes, by its name, first match wins (the categories are the kernels'
# names' meaning, not the module that launched them). Liger's kernels are named after
# what they do (`_rms_norm_forward_kernel`, `_swiglu_backward_kernel`, `liger_cross_entropy_kernel`); cuBLAS /
# CUTLASS GEMMs by their library's naming (`sm90_xmma_gemm`, `nvjet`, `cutlass`).
CATEGORIES = (
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|broadcast|c10d"),
    ("loss/logits", r"cross_?entropy|log_?softmax|nll_loss|logsumexp|element_mul_kernel|_fused_linear"),
    # (`lamb` only as a word: the `{lambda()#1}` in PyTorch's kernel template names is not an optimizer)
    ("optimizer", r"adam|sgd|adagrad|rmsprop|adafactor|multi_tensor_apply|foreach|optimizer|\blamb\b|lamb_"),
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot_product|softmax|rope|rotary"),
    ("norms", r"rms_?norm|layer_?norm|group_?norm|_norm_|batch_?norm|rsqrt"),
    ("activations", r"silu|gelu|swiglu|geglu|relu|sigmoid|tanh|_act_|glu"),
    ("matmul", r"gemm|matmul|\bmm\b|aten::mm|addmm|bmm|cutlass|xmma|nvjet|cublas|linear|wgmma|sm\d+_"),
    ("memory copies", r"memcpy|memset|copy_|\bcopy\b|\bcat\b|contiguous|aten::to\b|_to_copy|fill|zero_"),
    # PyTorch's generic elementwise and reduction kernels, named by functor, not by the layer that launched them
    # (an unfused RMSNorm's multiplies and means land here, not under norms).
    ("elementwise (unattributed)", r"elementwise|reduce_kernel|functor|unrolled|aten::(mul|add|div|sub|pow|mean|sum)"),
)
_COMPILED = tuple((name, re.compile(pattern, re.IGNORECASE)) for name, pattern in CATEGORIES)
OTHER = "other"
CATEGORY_NAMES = (*(name for name, _ in CATEGORIES), OTHER)


# Which of scaled_dot_product_attention's kernels a GPU kernel's name belongs to, first match wins: cuDNN's fused
# attention (`cudnn_generated_fort_native_sdpa_...`, whose names also say `flash`), PyTorch's FlashAttention
# (`pytorch_flash::flash_fwd_kernel`, `flash_bwd_...`) and its memory-efficient kernel (CUTLASS's
# `fmha_cutlassF_...` / `fmha_cutlassB_...`, `efficient_attention_...`). The math backend and eager attention launch
# no kernel of their own (matmuls and a softmax): a profile with none of these names records "none".
ATTENTION_KERNELS = (
    ("cudnn", r"cudnn.*(sdpa|attention|fmha)|fort_native_sdpa"),
    ("flash", r"flash_(fwd|bwd)|pytorch_flash"),
    ("efficient", r"fmha_cutlass|efficient_attention|mem_eff"),
)
_ATTENTION_COMPILED = tuple((name, re.compile(pattern, re.IGNORECASE)) for name, pattern in ATTENTION_KERNELS)
# The run detail naming the attention kernels its profile saw.
ATTENTION_KERNEL_DETAIL = "attention_kernel"


def attention_kernels_seen(kernel_names: list[str]) -> str:
    """The SDPA kernels among a profile's GPU kernels, by name ("flash", "cudnn", "efficient", joined by "+" when
    several ran), or "none" when no fused attention kernel ran (math, eager)."""
    seen = {_first_attention_match(name) for name in kernel_names}
    return "+".join(backend for backend, _ in ATTENTION_KERNELS if backend in seen) or "none"


def _first_attention_match(name: str) -> str | None:
    return next((backend for backend, pattern in _ATTENTION_COMPILED if pattern.search(name)), None)


def category_of(name: str) -> str:
    """The category of a kernel or operator, by its name; `other` when none matches."""
    return next((category for category, pattern in _COMPILED if pattern.search(name)), OTHER)


def profile_steps(step: Callable[[], object], steps: int, device: "torch.device", out_dir: Path) -> Path:
    """Run `step` `steps` times under the profiler; write the trace, the memory snapshot (GPU) and the
    per-kernel table in `out_dir`; return the table's path."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    out_dir.mkdir(parents=True, exist_ok=True)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
    try:
        with profile(activities=activities) as profiler:
            for _ in range(steps):
                step()
            if cuda:
                torch.cuda.synchronize(device)
        if cuda:
            torch.cuda.memory._dump_snapshot(str(out_dir / SNAPSHOT_FILE))
    finally:
        if cuda:
            torch.cuda.memory._record_memory_history(enabled=None)
    profiler.export_chrome_trace(str(out_dir / TRACE_FILE))
    rows = kernel_rows(profiler.key_averages(), steps, cuda)
    path = out_dir / PROFILE_FILE
    import pandas as pd

    pd.DataFrame(rows, columns=list(PROFILE_COLUMNS)).to_csv(path, index=False)
    return path


def profile_after_training(
    step: Callable[[], object], steps: int, device: "torch.device", out_dir: Path, alone: bool = True
) -> dict[str, str]:
    """`profile_steps`, whose failure (out of memory with the allocator's history recorded, say) is kept as the
    run's `profile_error` detail instead of ending the run: its timed steps are measured and stand. Not `alone`
    (one rank of a run on several GPUs, whose peers take the same steps) a failure ends the run."""
    try:
        path = profile_steps(step, steps, device, out_dir)
    except Exception as exc:
        if not alone:
            raise
        first_line = (str(exc).strip().splitlines() or [""])[0]
        logger.warning("the profile failed: %s: %s", type(exc).__name__, first_line)
        return {"profile_error": f"{type(exc).__name__}: {first_line}"}
    if device.type != "cuda":  # a CPU's operators are no GPU kernels: which attention kernel ran is a GPU's question
        return {}
    import pandas as pd

    return {ATTENTION_KERNEL_DETAIL: attention_kernels_seen(pd.read_csv(path)["name"].astype(str).tolist())}


def kernel_rows(averages: list, steps: int, cuda: bool) -> list[dict]:
    """One row per GPU kernel (or, without a GPU, per operator by its self time), largest first."""
    from torch.autograd import DeviceType

    if cuda:
        events = [(e.key, e.self_device_time_total, e.count) for e in averages if e.device_type == DeviceType.CUDA]
    else:
        events = [(e.key, e.self_cpu_time_total, e.count) for e in averages if e.device_type == DeviceType.CPU]
    total_us = sum(time_us for _, time_us, _ in events) or 1.0
    rows = [
        {
            "name": name,
            "category": category_of(name),
            "time_ms_per_step": time_us / 1e3 / steps,
            "calls_per_step": count / steps,
            "share": time_us / total_us,
        }
        for name, time_us, count in events
        if time_us > 0
    ]
    return sorted(rows, key=lambda row: -row["time_ms_per_step"])
