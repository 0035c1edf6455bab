"""What each batch length a fine-tune will meet costs the first time: after the timed steps, one step at each of the
likeliest padded lengths the run has not fed, timed.

On padded data a fine-tune meets each distinct batch length once as a new shape, and a new shape's price depends on
the length: on an H200 most lengths cost a liger step 0.1-0.2 s beyond its steady time (cuDNN's attention building
its execution plan for the length; docs/measurements.md). A short benchmark meets one or two of them, so it cannot
price the few dozen a fine-tune meets; these probes can (`analysis.projection` prices each length probed at its own
cost, the others at the probes' mean). A probe during which the CUDA JIT cache grew (`measuring.jit_cache`: the first
run on a machine compiling kernels, once for the machine, not for the length) is kept apart: `SHAPE_PROBES_JIT`.

The lengths are the padded lengths one epoch of the run's rows makes (`analysis.projection.length_frequencies`), most
often met first, less those any rank has fed. Each probe is one optimizer step over a batch whose longest row sets that
length (the other rows no longer), on every rank at once; its time is taken with the device synchronized before and
after, outside every timed figure (the recorder's training has ended). The probes train like any step: they come
after what is measured.
"""

import json
import time
from collections.abc import Callable

import numpy as np
import torch

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.jit_cache import JitCacheGrowth, jit_cache_dir
from finetune_bench.measuring.steady_state import SHAPE_PROBES, SHAPE_PROBES_JIT
from finetune_bench.prediction.fine_tune import FineTune, batching_of, length_frequencies


def ranked_lengths(lengths: np.ndarray, args: TrainingArgs) -> list[int]:
    """The padded lengths one epoch of the rows' batches meets (over the projection's draws), most often met first,
    then longest first."""
    frequencies = length_frequencies(lengths, batching_of(args), FineTune(epochs=1), seed=args.seed)
    return sorted(frequencies, key=lambda length: (-frequencies[length], -length))


def probe_batch(lengths: np.ndarray, length: int, args: TrainingArgs, rng: np.random.Generator) -> list[int]:
    """Row indices of a batch of `per_device_train_batch_size` rows padded to `length`: one row whose padded length
    is `length`, the others drawn from the rows no longer than it."""
    multiple = args.pad_to_multiple_of or 1
    padded = -(-lengths // multiple) * multiple
    longest = rng.choice(np.flatnonzero(padded == length))
    shorter = np.flatnonzero(lengths <= lengths[longest])
    wanted = args.per_device_train_batch_size - 1
    others = rng.choice(shorter, size=wanted, replace=len(shorter) < wanted)
    return [int(longest), *(int(i) for i in others)]


def _fed_by_any_rank(candidates: list[int], fed: set[int], device: torch.device) -> set[int]:
    """Of `candidates`, those this rank or (on several GPUs) another has fed."""
    mine = torch.tensor([float(length in fed) for length in candidates], dtype=torch.float64, device=device)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(mine, op=torch.distributed.ReduceOp.MAX)
    return {length for length, seen in zip(candidates, mine.tolist(), strict=True) if seen}


def probe_new_shapes(
    args: TrainingArgs,
    data: "datasets.Dataset",  # noqa: F821
    row_lengths: list[int],
    fed_shapes: set[str],
    collate_rows: Callable[[list[dict]], dict[str, torch.Tensor]],
    step: Callable[[dict[str, torch.Tensor]], object],
    device: torch.device,
) -> dict[str, str]:
    """The run's details the probes add (`time_new_shapes`): `SHAPE_PROBES`, JSON {length: seconds}, and
    `SHAPE_PROBES_JIT`, JSON {length: bytes} of the probes that grew the CUDA JIT cache (none: no key). Nothing on a
    CPU (its timings say nothing of a GPU's) or without probes to make."""
    if args.new_shape_probes == 0 or device.type == "cpu":
        return {}
    seconds, compiled = time_new_shapes(args, data, row_lengths, fed_shapes, collate_rows, step, device)
    details = {SHAPE_PROBES: json.dumps(seconds, separators=(",", ":"))} if seconds else {}
    if compiled:
        details[SHAPE_PROBES_JIT] = json.dumps(compiled, separators=(",", ":"))
    return details


def time_new_shapes(
    args: TrainingArgs,
    data: "datasets.Dataset",  # noqa: F821
    row_lengths: list[int],
    fed_shapes: set[str],
    collate_rows: Callable[[list[dict]], dict[str, torch.Tensor]],
    step: Callable[[dict[str, torch.Tensor]], object],
    device: torch.device,
) -> tuple[dict[str, float], dict[str, int]]:
    """One step (`step` trains one optimizer step over the batch it is given) at each of the first
    `new_shape_probes` lengths of `ranked_lengths` that no rank has fed (`fed_shapes`: this rank's, "8x512") and that
    are no longer than the longest it has fed (a longer one could run out of memory where the run did not), timed:
    {length: seconds}; and {length: bytes} of those during which the CUDA JIT cache grew (on a GPU)."""
    lengths = np.asarray(row_lengths, dtype=np.int64)
    batch = args.per_device_train_batch_size
    fed = {int(shape.split("x")[1]) for shape in fed_shapes if shape.startswith(f"{batch}x")}
    candidates = [length for length in ranked_lengths(lengths, args) if length <= max(fed, default=0)]
    fed = _fed_by_any_rank(candidates, fed, device)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    rng = np.random.default_rng([args.seed, rank])
    seconds: dict[str, float] = {}
    grown: list[int] = []
    jit_cache = JitCacheGrowth()
    jit_cache.start(jit_cache_dir() if device.type == "cuda" else None)
    for length in [length for length in candidates if length not in fed][: args.new_shape_probes]:
        rows = collate_rows([data[i] for i in probe_batch(lengths, length, args, rng)])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step(rows)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds[str(length)] = time.perf_counter() - start
        grown.append(jit_cache.take() or 0)
    grown = _most_of_any_rank(grown, device)
    return seconds, {length: size for length, size in zip(seconds, grown, strict=True) if size}


def _most_of_any_rank(values: list[int], device: torch.device) -> list[int]:
    """Each of `values` (one per probe, the same probes on every rank) as the most any rank had: a rank that
    compiled slowed every rank's probe, and on several machines each reads its own JIT cache."""
    if not values or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return values
    most = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    return [int(value) for value in most.tolist()]
