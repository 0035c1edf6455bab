"""What runs in the slow steps that meet a new batch shape: the benchmark's own model, Liger patching, dtype and padded
batches, every step timed (GPU synchronized at its end) and the whole loop under torch.profiler (CPU and CUDA).

On padded data (inputs/padded_llama1b_shapes.yaml) a batch is as long as its longest example, so a run meets many
shapes; most new-shape steps cost about what a repeated one does, a few cost ×10 and more with no Triton compilation
counted in them. This script builds exactly the plain loop's batches for an inputs file's `training_args` (the same
dataset preparation, tokenization, collation and seeded loader order, `plain_loop.training_batches`), the same model
(`plain_loop.load_for_criterion`: the arm's Liger patching, the attention implementation, the dtype) and the same
step (`plain_loop`'s loss function, `LossScaling`, optimizer and scheduler, gradient clipping), with the attention
pinned as the worker pins it. It prints, per step: its time, its batch shape and whether the run met it first there,
the CUDA caching allocator's cudaMalloc calls and reserved-memory growth, Triton's compilations and the garbage
collector's time. For each step slower than `--slow-factor` × the median steady step (a shape met before, past the
warm-up) it prints the step's top operations by self CPU time and by self CUDA time (events attributed to the step by
their start inside its `step N` record_function range) and how much host time went to each suspect (SDPA/cuDNN
attention, cuBLAS matmuls, host synchronizations, the allocator, Liger/Triton), beside the same for one new-shape
step that was not slow and one steady step. The last line is one JSON object with every step's row, the profiled
tables and the suspects; `--out DIR` writes the text (report.txt) and the JSON (new_shape_profile.json) there, and
with `--trace` the Chrome trace.

On a GPU machine (the image's torch/transformers; the wheelhouse in .whl/ brings liger-kernel and datasets), from the
repository root, 105 steps (the 100 timed steps of docs/measurements.md, the same batches in the same order):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:$PWD \
        FINETUNE_BENCH_CACHE_DIR=/tmp/finetune_bench_cache python3 scripts/new_shape_profile.py \
        --steps 105 --out /tmp/new_shape_profile

(`--arm baseline` for the other arm, `--attention efficient` to pin memory-efficient attention, `--no-profile` for
clean timings, `--python` to name the Python functions too, with `--profile-steps A-B` to keep that cheap.) On a CPU,
a smoke check: `python scripts/new_shape_profile.py --model random:tiny-llama --steps 6 --device cpu` (the CUDA
columns empty; the baseline arm unless `--arm liger` asks for Liger's kernels in the Triton interpreter: minutes a step
at 8 × 1,024 tokens, and NaN losses in bfloat16 there, so `--dtype float32` and short batches via `--set`).
"""

import argparse
import bisect
import contextlib
import dataclasses
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:  # run as `python scripts/new_shape_profile.py` without the project installed
    sys.path.insert(0, str(PROJECT_ROOT))

DEFAULT_INPUTS = PROJECT_ROOT / "inputs" / "padded_llama1b_shapes.yaml"
REPORT_FILE, JSON_FILE, TRACE_FILE = "report.txt", "new_shape_profile.json", "trace.json"
STEP_MARKER = re.compile(r"^step (\d+)$")
END_SYNC, NEXT_BATCH = "synchronize (end of step)", "next batch"
TOP_ROWS = 12
# The `step N` range's own self time: the main thread outside any recorded operator, in Python or waiting (for the
# autograd engine's device thread, where a GPU's backward pass runs, or for the data loader)
OUTSIDE_OPERATORS = "main thread outside recorded ops (Python; waits on autograd's backward thread)"
NAME_WIDTH = 72

# The suspects for a slow new-shape step, by the names of the profiled events whose self CPU time they take (first
# match wins; the end-of-step synchronization, which every step waits in, is left out).
SUSPECTS = (
    ("attention (SDPA; cuDNN builds a plan per new shape)", r"scaled_dot_product|cudnn|flash|efficient_attention"),
    ("host synchronization (.item(), stream/event syncs)", r"_local_scalar_dense|aten::item|Synchronize|cudaMemcpy\b"),
    ("caching allocator (cudaMalloc/cudaFree)", r"cudaMalloc|cudaFree|cuMemCreate|cuMemMap"),
    ("Liger / Triton (launches, autotune)", r"[Ll]iger|triton|cuLaunchKernel|cuModuleLoad"),
    ("matmuls (cuBLAS/cuBLASLt heuristics)", r"^aten::(mm|addmm|bmm|matmul|linear|_addmm_activation)$|cublas"),
    ("optimizer step", r"[Oo]ptimizer|adam|_foreach"),
)
_SUSPECTS = tuple((name, re.compile(pattern)) for name, pattern in SUSPECTS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("inputs", nargs="?", type=Path, default=DEFAULT_INPUTS, help="a benchmark inputs file")
    parser.add_argument(
        "--arm",
        help="the arm (default: the file's first experiment_args arm, else its training_args'; baseline on a CPU)",
    )
    parser.add_argument("--attention", help="training_args.attention (sdpa, efficient, flash, cudnn, math, eager)")
    parser.add_argument("--steps", type=int, help="training_args.max_steps")
    parser.add_argument("--model", help="training_args.model_name (e.g. random:tiny-llama)")
    parser.add_argument("--device", help="training_args.device (cuda, cpu, auto)")
    parser.add_argument("--dtype", help="training_args.dtype")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any other training_args setting (YAML value)"
    )
    parser.add_argument("--slow-factor", type=float, default=3.0, help="slow: above this × the median steady step")
    parser.add_argument("--no-profile", action="store_true", help="no profiler: clean timings")
    parser.add_argument("--profile-steps", default="", metavar="A-B", help="profile only steps A to B (default: all)")
    parser.add_argument("--python", action="store_true", help="record Python function calls too (with_stack; costly)")
    parser.add_argument("--trace", action="store_true", help="write the Chrome trace to --out (large)")
    parser.add_argument("--top", type=int, default=TOP_ROWS, help="rows per table")
    parser.add_argument("--out", type=Path, help="write report.txt and new_shape_profile.json here")
    return parser.parse_args(argv)


def training_settings(opts: argparse.Namespace) -> dict[str, Any]:
    """The inputs file's `training_args` with the command line's overrides, as keyword arguments of TrainingArgs."""
    cfg = yaml.safe_load(opts.inputs.read_text())
    settings = dict(cfg.get("training_args") or {})
    arms = (cfg.get("experiment_args") or {}).get("arm") or []
    arm = opts.arm or (arms[0] if arms else None)
    if opts.arm is None and (opts.device or settings.get("device")) == "cpu":
        # on a CPU Liger's kernels run in the Triton interpreter, minutes a step at 8 × 1,024: `--arm liger` asks
        arm = "baseline"
    overrides = {
        "arm": arm,
        "attention": opts.attention,
        "max_steps": opts.steps,
        "model_name": opts.model,
        "device": opts.device,
        "dtype": opts.dtype,
    }
    settings.update({k: v for k, v in overrides.items() if v is not None})
    for item in opts.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        settings[key.strip()] = yaml.safe_load(value)
    steps = settings.get("max_steps")
    if steps is not None and settings.get("timing_warmup_steps", 1) >= steps:  # at least one step past the warm-up
        settings["timing_warmup_steps"] = max(steps - 1, 0)
    return settings


def profile_window(spec: str, steps: int) -> tuple[int, int]:
    """The first and last step to profile, from "A-B" ("" : every step)."""
    if not spec:
        return 1, steps
    first, _, last = spec.partition("-")
    window = int(first), min(int(last or first), steps)
    if not 1 <= window[0] <= window[1]:
        raise SystemExit(f"--profile-steps {spec!r}: not a range of steps within 1-{steps}")
    return window


@dataclasses.dataclass
class StepRow:
    """One timed step."""

    step: int
    seconds: float
    shape: str
    new_shape: bool
    warmup: bool
    tokens: int
    padded_tokens: int
    mallocs: int | None = None
    frees: int | None = None
    alloc_retries: int | None = None
    reserved_growth_mib: float | None = None
    reserved_mib: float | None = None
    triton_compiles: int | None = None
    triton_compile_s: float | None = None
    triton_kernels: str = ""
    gc_s: float = 0.0
    profiled: bool = False
    expected_s: float | None = None
    ratio: float | None = None
    slow: bool = False


class AllocatorCounts:
    """The CUDA caching allocator's cumulative counters (nothing off a GPU): cudaMalloc and cudaFree calls, retries
    (a free of the cache and a second try), and the reserved bytes."""

    def __init__(self, device: Any) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def read(self) -> tuple[int, int, int, int] | None:
        if not self.cuda:
            return None
        import torch

        stats = torch.cuda.memory_stats(self.device)
        return (
            int(stats.get("num_device_alloc", 0)),
            int(stats.get("num_device_free", 0)),
            int(stats.get("num_alloc_retries", 0)),
            int(torch.cuda.memory_reserved(self.device)),
        )


def build_training(args: Any, device: Any, dtype: Any, work_dir: Path) -> tuple[Any, Iterator[dict], Any]:
    """The plain loop's model (its loss path, Liger patching and dtype), batches and optimizer step, as
    `plain_loop.train` builds them (no evaluation, no recorder): (the model, the batch iterator, the step function
    that trains one optimizer step over the batches it is given and returns the loss tensor)."""
    from functools import partial

    from transformers import get_scheduler

    from finetune_bench.running.backends import plain_loop
    from finetune_bench.running.backends.common import enable_activation_checkpointing, trains_mixed_float16
    from finetune_bench.running.backends.data import (
        check_packing_isolates_examples,
        collate,
        collate_packed,
        pack,
        require_one_batch,
        tokenize_prompt_completion,
    )
    from finetune_bench.running.distributed import TrainingModule
    from finetune_bench.sources.datasets import DatasetSource, load_training_and_held_out, prepare_dataset
    from finetune_bench.sources.models import prepare_model

    dataset_dir = prepare_dataset(DatasetSource.of(args))
    model_dir = prepare_model(args.model_name)
    mixed_float16 = trains_mixed_float16(args, dtype)
    plain_loop.check_float16_parallelism(args, mixed_float16)
    loaded, path = plain_loop.load_for_criterion(args, model_dir, device, dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    if args.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.config.use_cache = False
    model.train()
    trained = TrainingModule(model, plain_loop.loss_function(path.criterion, mixed_float16))

    training, _ = load_training_and_held_out(dataset_dir, args.eval_examples)  # the held-out examples never train
    data = tokenize_prompt_completion(training, tokenizer, args.max_seq_length)
    if args.packing:
        check_packing_isolates_examples(model)
        data, collate_rows = pack(data, args.max_seq_length), collate_packed
    else:
        collate_rows = partial(collate, pad_token_id=tokenizer.pad_token_id, pad_to_multiple_of=args.pad_to_multiple_of)
    require_one_batch(len(data), args.examples_per_step, args.max_seq_length)
    batches = plain_loop.training_batches(data, args, collate_rows, pin_memory=device.type == "cuda")

    optimizer = plain_loop.build_optimizer(args, model, work_dir)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=int(args.warmup_ratio * args.max_steps),
        num_training_steps=args.max_steps,
    )
    scaling = plain_loop.LossScaling(device, mixed_float16, optimizer)

    def optimizer_step(micro_batches: list[dict]) -> Any:
        import torch

        step_loss = torch.zeros((), device=device)
        for batch in micro_batches:
            with scaling.autocast():
                loss = trained(batch) / args.gradient_accumulation_steps
            scaling.backward(loss)
            step_loss += loss.detach()
        if scaling.step(optimizer, model.parameters(), args.max_grad_norm):
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return step_loss

    details = {
        "loss_path": path.name,
        "liger_patches": dict(loaded.liger_patches),
        "attn_implementation": getattr(model.config, "_attn_implementation", ""),
        "examples": len(data),
    }
    return details, batches, optimizer_step


def run_steps(
    args: Any, device: Any, batches: Iterator[dict], optimizer_step: Any, profiler: Any, window: tuple[int, int]
) -> list[StepRow]:
    """Train `args.max_steps` steps, each timed from the previous step's end to its own (the device synchronized),
    as the benchmark's recorder times them; `profiler` (None: none) records steps `window[0]` to `window[1]`."""
    import torch
    from torch.profiler import record_function

    from finetune_bench.measuring.gc_timer import GcTimer
    from finetune_bench.measuring.triton_compiles import TritonCompileCounter

    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    allocator = AllocatorCounts(device)
    compiles = TritonCompileCounter()
    counting_compiles = compiles.install()
    gc_timer = GcTimer()
    gc_timer.install()
    rows: list[StepRow] = []
    seen: set[str] = set()
    sync()
    last_counts = allocator.read()
    last_gc = 0.0
    last_end = time.perf_counter()
    try:
        for step in range(1, args.max_steps + 1):
            if profiler is not None and step == window[0]:
                profiler.start()
                last_end = time.perf_counter()  # the profiler's start is no step's
            with record_function(f"step {step}"):
                with record_function(NEXT_BATCH):
                    micro = []
                    for _ in range(args.gradient_accumulation_steps):
                        micro.append({k: v.to(device, non_blocking=True) for k, v in next(batches).items()})
                shapes = ["x".join(str(n) for n in b["input_ids"].shape) for b in micro]
                # the recorder counts each micro-batch's tokens before its forward (a sync while the device is idle)
                tokens = sum(
                    int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel() for b in micro
                )
                loss = optimizer_step(micro)
                with record_function(END_SYNC):
                    sync()
            now = time.perf_counter()
            counts = allocator.read()
            compiled, compile_s, kernels = compiles.take()
            new_shape = any(shape not in seen for shape in shapes)
            seen.update(shapes)
            row = StepRow(
                step=step,
                seconds=now - last_end,
                shape="+".join(shapes),
                new_shape=new_shape,
                warmup=step <= args.timing_warmup_steps,
                tokens=tokens,
                padded_tokens=sum(b["input_ids"].numel() for b in micro),
                triton_compiles=compiled if counting_compiles else None,
                triton_compile_s=round(compile_s, 4) if counting_compiles else None,
                triton_kernels=kernels,
                gc_s=round(gc_timer.total_s - last_gc, 4),
                profiled=profiler is not None and window[0] <= step <= window[1],
            )
            if counts is not None and last_counts is not None:
                row.mallocs, row.frees, row.alloc_retries = (counts[i] - last_counts[i] for i in range(3))
                row.reserved_growth_mib = round((counts[3] - last_counts[3]) / 2**20, 1)
                row.reserved_mib = round(counts[3] / 2**20, 1)
            rows.append(row)
            if not torch.isfinite(loss):
                print(f"step {step}: non-finite loss {float(loss)}", flush=True)
            if profiler is not None and step == window[1]:
                profiler.stop()
            last_counts, last_gc = counts, gc_timer.total_s
            last_end = time.perf_counter()  # the bookkeeping above is no step's time
    finally:
        compiles.remove()
        gc_timer.remove()
    return rows


def mark_slow(rows: list[StepRow], slow_factor: float) -> dict[str, Any]:
    """Flag the steps slower than `slow_factor` × the median steady step (a shape met before, past the warm-up; the
    repeated warm-up steps if none), and each step's time against the benchmark's expected time for its size
    (`measuring.steady_state.fit_step_time` over the steady steps). The figures used."""
    from finetune_bench.measuring.steady_state import TimedStep, fit_step_time

    steady = [r for r in rows if not r.new_shape and not r.warmup] or [r for r in rows if not r.new_shape]
    median = statistics.median(r.seconds for r in steady) if steady else None
    timed = [TimedStep(r.step, r.seconds, r.tokens, r.padded_tokens, r.shape, r.new_shape) for r in steady]
    model = fit_step_time(timed)
    for row in rows:
        row.seconds = round(row.seconds, 4)
        if model is not None:
            row.expected_s = round(model.expected(row.padded_tokens), 4)
            row.ratio = round(row.seconds / row.expected_s, 2) if row.expected_s > 0 else None
        row.slow = median is not None and row.seconds > slow_factor * median
    return {
        "steady_steps": len(steady),
        "steady_median_s": round(median, 4) if median is not None else None,
        "slow_threshold_s": round(slow_factor * median, 4) if median is not None else None,
        "expected_time_model": dataclasses.asdict(model) if model is not None else None,
    }


def contrast_steps(rows: list[StepRow]) -> dict[int, str]:
    """The profiled steps to tabulate: every slow one, one new-shape step that was not slow (the median such) and
    one steady step (the median one), past the warm-up where there are such steps. Step → why."""
    profiled = [r for r in rows if r.profiled]
    chosen = {r.step: "slow" for r in profiled if r.slow}

    def median_of(kept: list[StepRow]) -> StepRow | None:
        past_warmup = [r for r in kept if not r.warmup] or kept
        if not past_warmup:
            return None
        ordered = sorted(past_warmup, key=lambda r: r.seconds)
        return ordered[(len(ordered) - 1) // 2]

    typical_new = median_of([r for r in profiled if r.new_shape and not r.slow])
    steady = median_of([r for r in profiled if not r.new_shape and not r.slow])
    for row, why in ((typical_new, "new shape, not slow"), (steady, "steady")):
        if row is not None:
            chosen.setdefault(row.step, why)
    return dict(sorted(chosen.items()))


# Profiler bookkeeping that is no operation of the step's (torch's own key_averages leaves the same out).
HIDDEN_EVENTS = frozenset(
    {
        "[memory]",
        "[OutOfMemory]",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    }
)


@dataclasses.dataclass
class Event:
    """One profiled event, read from the profiler's raw (kineto) results: nanoseconds on the host's clock."""

    name: str
    start: int
    end: int
    device: bool  # a GPU kernel, copy or set
    thread: int
    correlation: int
    linked: int  # a kernel's or a runtime call's: the correlation of the operator that launched it (0: none)
    child_ns: int = 0
    self_cuda_ns: int = 0
    under_end_sync: bool = False


def read_events(profiler: Any, steps: set[int]) -> tuple[dict[int, list[Event]], int]:
    """The raw events of each of `steps` (those starting inside its `step N` range on the host's clock: a kernel
    runs inside its step's range, whose end waits for it), and how many events the profile holds. Read from the
    profiler's kineto results directly: torch's own `events()` builds a Python object per event at ~0.1 ms each,
    minutes for a profile of a hundred 1B-model steps."""
    from torch.autograd import DeviceType

    raw = profiler.profiler.kineto_results.events()
    windows = []
    for event in raw:
        match = STEP_MARKER.match(event.name())
        if match and event.device_type() == DeviceType.CPU and int(match.group(1)) in steps:
            windows.append((event.start_ns(), event.end_ns(), int(match.group(1))))
    windows.sort()
    begins = [w[0] for w in windows]
    found: dict[int, list[Event]] = {step: [] for _, _, step in windows}
    for event in raw:
        start = event.start_ns()
        index = bisect.bisect_right(begins, start) - 1
        if index < 0 or start > windows[index][1]:
            continue
        name = event.name()
        hidden = getattr(event, "is_hidden_event", lambda: False)()
        if name in HIDDEN_EVENTS or hidden or event.is_async() or event.start_thread_id() != event.end_thread_id():
            continue
        found[windows[index][2]].append(
            Event(
                name=name,
                start=start,
                end=event.end_ns(),
                device=event.device_type() != DeviceType.CPU,
                thread=event.start_thread_id(),
                correlation=event.correlation_id(),
                linked=event.linked_correlation_id(),
            )
        )
    return found, len(raw)


def nest(events: list[Event]) -> None:
    """Each host event's time in its children (per thread, by nesting in time; a runtime call, such as
    cudaLaunchKernel, on its operator's thread, as torch nests them), whether it runs inside the end-of-step
    synchronization, and each operator's self CUDA time: the kernels it launched itself."""
    operators = {e.correlation: e for e in events if not e.device and e.linked == 0}
    by_thread: dict[int, list[Event]] = {}
    for event in events:
        if event.device:
            launcher = operators.get(event.linked)
            if launcher is not None:
                launcher.self_cuda_ns += event.end - event.start
            continue
        launcher = operators.get(event.linked) if event.linked else None
        by_thread.setdefault(launcher.thread if launcher else event.thread, []).append(event)
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e.start, -e.end))
        stack: list[Event] = []
        for event in thread_events:
            while stack and stack[-1].end <= event.start:
                stack.pop()
            if stack and event.end <= stack[-1].end:
                parent = stack[-1]
                parent.child_ns += event.end - event.start
                event.under_end_sync = parent.name == END_SYNC or parent.under_end_sync
            stack.append(event)


def step_tables(found: dict[int, list[Event]], steps: dict[int, str], top: int) -> dict[int, dict[str, Any]]:
    """Each of `steps`' events aggregated by name (calls, self CPU and self CUDA milliseconds; a kernel's self CUDA
    time is its own, an operator's the kernels it launched itself, as torch's key_averages counts them): the top
    `top` rows by each, the GPU's busy time (kernels, copies, sets), the end-of-step synchronization's wait, the
    attention kernel that ran, and each suspect's self CPU milliseconds."""
    from finetune_bench.measuring.profiling import attention_kernels_seen

    tables: dict[int, dict[str, Any]] = {}
    for step, why in steps.items():
        events = found.get(step)
        if not events:
            continue
        nest(events)
        by_name: dict[str, dict[str, Any]] = {}
        window_ns = gpu_ns = end_sync_ns = 0
        kernel_names = []
        suspects = {name: 0.0 for name, _ in SUSPECTS}
        for event in events:
            duration = event.end - event.start
            marker = STEP_MARKER.match(event.name)
            if event.device:
                if marker or event.name in (END_SYNC, NEXT_BATCH):  # the annotations' GPU-side copies
                    continue
                gpu_ns += duration
                kernel_names.append(event.name)
                self_cpu, self_cuda = 0, duration
            else:
                self_cpu, self_cuda = duration - event.child_ns, event.self_cuda_ns
                if marker:
                    window_ns = duration
                elif event.name == END_SYNC:
                    end_sync_ns = duration
                elif not event.under_end_sync:
                    suspect = next((name for name, pattern in _SUSPECTS if pattern.search(event.name)), None)
                    if suspect is not None:
                        suspects[suspect] += self_cpu
            name = f"{event.name}: {OUTSIDE_OPERATORS}" if marker else event.name
            row = by_name.setdefault(
                name, {"calls": 0, "self_cpu_ms": 0.0, "self_cuda_ms": 0.0, "device": "cuda" if event.device else "cpu"}
            )
            row["calls"] += 1
            row["self_cpu_ms"] += self_cpu / 1e6
            row["self_cuda_ms"] += self_cuda / 1e6

        tables[step] = {
            "why": why,
            "window_ms": round(window_ns / 1e6, 3),
            "gpu_busy_ms": round(gpu_ns / 1e6, 3),
            "end_sync_wait_ms": round(end_sync_ns / 1e6, 3),
            "attention_kernel": attention_kernels_seen(kernel_names) if kernel_names else "",
            "suspects_self_cpu_ms": {name: round(ns / 1e6, 3) for name, ns in suspects.items()},
            "top_self_cpu": top_rows(by_name, "self_cpu_ms", top),
            "top_self_cuda": top_rows(by_name, "self_cuda_ms", top),
        }
    return tables


def top_rows(by_name: dict[str, dict[str, Any]], key: str, top: int) -> list[dict[str, Any]]:
    """The `top` rows with the most `key` (none at 0), their figures rounded."""
    ranked = sorted(by_name.items(), key=lambda item: -item[1][key])[:top]
    return [
        {"name": name, **{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}}
        for name, row in ranked
        if row[key] > 0
    ]


def format_table(rows: list[dict[str, Any]], title: str) -> list[str]:
    lines = [f"  {title}", f"    {'name':<{NAME_WIDTH}} {'calls':>6} {'self CPU ms':>12} {'self CUDA ms':>13}"]
    for row in rows:
        name = row["name"] if len(row["name"]) <= NAME_WIDTH else row["name"][: NAME_WIDTH - 1] + "…"
        lines.append(
            f"    {name:<{NAME_WIDTH}} {row['calls']:>6} {row['self_cpu_ms']:>12.3f} {row['self_cuda_ms']:>13.3f}"
        )
    if not rows:
        lines.append("    (none)")
    return lines


def format_rows(rows: list[StepRow]) -> list[str]:
    head = (
        f"{'step':>4} {'seconds':>8} {'×expected':>9} {'shape':>10} {'new':>4} {'slow':>4} {'mallocs':>7} "
        f"{'reserved +MiB':>13} {'triton':>6} {'gc s':>6}  kernels compiled"
    )
    lines = [head]

    def show(value: object) -> str:
        return "-" if value is None else str(value)

    for r in rows:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        lines.append(
            f"{r.step:>4} {r.seconds:>8.4f} {ratio:>9} {r.shape:>10} {'new' if r.new_shape else '':>4} "
            f"{'SLOW' if r.slow else '':>4} {show(r.mallocs):>7} {show(r.reserved_growth_mib):>13} "
            f"{show(r.triton_compiles):>6} {r.gc_s:>6.3f}  {r.triton_kernels}{'  (warm-up)' if r.warmup else ''}"
        )
    return lines


def format_profiles(tables: dict[int, dict[str, Any]], rows: list[StepRow], cuda: bool) -> list[str]:
    by_step = {r.step: r for r in rows}
    lines = []
    for step, table in tables.items():
        row = by_step[step]
        lines.append("")
        lines.append(
            f"step {step} ({table['why']}): {row.seconds:.4f} s, shape {row.shape}{', new' if row.new_shape else ''}, "
            f"cudaMallocs {show_none(row.mallocs)}, reserved +{show_none(row.reserved_growth_mib)} MiB, Triton "
            f"compiles {show_none(row.triton_compiles)}, gc {row.gc_s:.3f} s"
        )
        lines.append(
            f"  profiled {table['window_ms']:.1f} ms; GPU busy {table['gpu_busy_ms']:.1f} ms; the end-of-step sync "
            f"waited {table['end_sync_wait_ms']:.1f} ms"
            + (f"; attention kernel: {table['attention_kernel']}" if table["attention_kernel"] else "")
        )
        lines.append("  self CPU ms by suspect:")
        lines += [f"    {ms:>10.1f}  {name}" for name, ms in table["suspects_self_cpu_ms"].items()]
        lines += format_table(table["top_self_cpu"], "top by self CPU time")
        if cuda:
            lines += format_table(table["top_self_cuda"], "top by self CUDA time")
    return lines


def show_none(value: object) -> str:
    return "-" if value is None else str(value)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    opts = parse_args(argv)
    settings = training_settings(opts)
    device_name = settings.get("device", "auto")
    if device_name == "cpu" or (device_name == "auto" and not _cuda_visible()):
        # Liger's kernels run in the Triton interpreter on a CPU, which must be chosen before triton is imported
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import torch
    from torch.profiler import ProfilerActivity, profile

    from finetune_bench.inputs.arms import parse_arm
    from finetune_bench.inputs.settings import TrainingArgs
    from finetune_bench.running.backends.common import pinned_attention, resolve_device, resolve_dtype

    args = TrainingArgs(**settings)
    if args.world_size > 1:
        raise SystemExit(f"{args.world_size} GPUs: this script profiles a run on one GPU (set num_gpus: 1)")
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    cuda = device.type == "cuda"
    if device.type == "cpu" and parse_arm(args.arm).liger:
        from finetune_bench.running.triton_cpu import install_interpreter_shims

        install_interpreter_shims()
    if args.eval_examples:
        print(f"note: eval_examples {args.eval_examples}: the benchmark also evaluates; not here", flush=True)
    window = profile_window(opts.profile_steps, args.max_steps)
    text: list[str] = []

    def say(line: str = "") -> None:
        text.append(line)
        print(line, flush=True)

    with tempfile.TemporaryDirectory(prefix="new-shape-profile-") as work_dir:
        with pinned_attention(args.attention, device, dtype):
            details, batches, optimizer_step = build_training(args, device, dtype, Path(work_dir))
            say(
                f"{args.model_name}, arm {args.arm}, attention {args.attention} ({details['attn_implementation']}), "
                f"loss {details['loss_path']}, {str(dtype).removeprefix('torch.')} on {device}"
                f"{' (' + torch.cuda.get_device_name(device) + ')' if cuda else ''}, batch "
                f"{args.per_device_train_batch_size} × ≤{args.max_seq_length}, {details['examples']} examples, "
                f"{args.max_steps} steps ({args.timing_warmup_steps} warm-up); Liger patches {details['liger_patches']}"
            )
            profiler = None
            if not opts.no_profile:
                activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
                profiler = profile(activities=activities, with_stack=opts.python)
            rows = run_steps(args, device, batches, optimizer_step, profiler, window)
    figures = mark_slow(rows, opts.slow_factor)
    say("")
    for line in format_rows(rows):
        say(line)
    say("")
    say(
        f"steady steps {figures['steady_steps']}, median {show_none(figures['steady_median_s'])} s; slow above "
        f"{show_none(figures['slow_threshold_s'])} s (×{opts.slow_factor:g}): steps "
        f"{[r.step for r in rows if r.slow] or 'none'}; new-shape steps {[r.step for r in rows if r.new_shape]}"
    )

    tables: dict[int, dict[str, Any]] = {}
    if profiler is not None:
        chosen = contrast_steps(rows)
        started = time.perf_counter()
        found, total = read_events(profiler, set(chosen))
        tables = step_tables(found, chosen, opts.top)
        say(f"profile: {total} events, read in {time.perf_counter() - started:.1f} s; tabulated steps {chosen}")
        for line in format_profiles(tables, rows, cuda):
            say(line)
        if opts.trace and opts.out is not None:
            opts.out.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(opts.out / TRACE_FILE))

    result = {
        "model": args.model_name,
        "arm": args.arm,
        "attention": args.attention,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if cuda else "",
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        **details,
        "profiled": profiler is not None,
        "slow_factor": opts.slow_factor,
        **figures,
        "steps": [dataclasses.asdict(r) for r in rows],
        "profiles": {str(step): table for step, table in tables.items()},
    }
    line = json.dumps(result)
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / REPORT_FILE).write_text("\n".join(text) + "\n")
        (opts.out / JSON_FILE).write_text(json.dumps(result, indent=1) + "\n")
    print(line, flush=True)
    return result


def _cuda_visible() -> bool:
    with contextlib.suppress(Exception):
        import torch

        return torch.cuda.is_available()
    return False


if __name__ == "__main__":
    main()
