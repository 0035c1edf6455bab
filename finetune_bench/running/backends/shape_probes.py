"""What each batch length a fine-tune will meet costs, the first time and once known: after the timed steps, two
steps at each of up to `new_shape_probes` padded lengths the run has not fed, each timed.

On padded data a fine-tune meets each distinct batch length once as a new shape, and a new shape's price depends on
the length: on an H200 most lengths cost a step 0.1-0.2 s beyond its steady time (cuDNN's attention building its
execution plan for the length; docs/measurements.md). A short benchmark meets a few of them, so it cannot price the
hundreds a fine-tune on variable-length data meets; nor, when every timed step met a new length (a small batch of
rows whose lengths spread widely), does it time a single step at a length it already knew. The probes give both:

- the first step at a length prices the new length (`SHAPE_PROBES`: `analysis.projection` prices each length probed
  at its own cost, the others at the probes' mean);
- the second step at the same length is a step whose shape is known (`SHAPE_PROBES_REPEAT`): a point of the
  step-time line, whatever the timed steps met.

The lengths are spread over the padded lengths one epoch of the run's rows makes, weighted by how often a batch meets
each (`spread_lengths`: the quantiles of that distribution), so that the line holds over the whole range of lengths
the fine-tune trains at, not only near the window; less those any rank has fed, and none longer than the longest any
rank fed (a longer one could run out of memory where the run did not). A probe during which the kernel caches grew
(`measuring.jit_cache`: the first run on a machine compiling kernels, once for the machine, not for the length) is
kept apart: `SHAPE_PROBES_JIT`.

Each probe is one optimizer step over a batch whose longest row sets that length (the other rows no longer), on every
rank at once; its time is taken with the device synchronized before and after, outside every timed figure (the
recorder's training has ended). The probes train like any step: they come after what is measured. They are made as
a fine-tune meets its lengths, not as a bench would: every length's first step in a shuffled order, then every
length's second step in another, so that no step follows a step at its own length (measured on an H200 at one row a
batch, a step right after one at its length ran up to 0.014 s faster than the fine-tune's steps at known lengths, a
tenth of such a step); and each step's batch comes from a loader process that reads and pads it while the GPU runs
the step before (`batches_of`), as the timed steps' batches do, its wait inside the step's time as theirs is.
"""

import json
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.jit_cache import JitCacheGrowth, kernel_cache_dirs
from finetune_bench.measuring.steady_state import SHAPE_PROBES, SHAPE_PROBES_JIT, SHAPE_PROBES_REPEAT
from finetune_bench.prediction.fine_tune import FineTune, batching_of, length_frequencies


def spread_lengths(lengths: np.ndarray, args: TrainingArgs, allowed: Collection[int], count: int) -> list[int]:
    """Up to `count` of the `allowed` padded lengths, spread over the distribution of the lengths one epoch of the
    rows' batches meets (over the projection's draws, weighted by how often each is met): the allowed length nearest
    each of `count` evenly spaced quantiles, then (where several quantiles fell on one length) the most often met of
    the rest, in order of length."""
    frequencies = length_frequencies(lengths, batching_of(args), FineTune(epochs=1), seed=args.seed)
    candidates = sorted(length for length in frequencies if length in set(allowed))
    if len(candidates) <= count:
        return candidates
    weights = np.array([frequencies[length] for length in candidates], dtype=float)
    cumulative = (np.cumsum(weights) - weights / 2) / weights.sum()
    chosen = {candidates[int(np.abs(cumulative - (i + 0.5) / count).argmin())] for i in range(count)}
    rest = sorted(set(candidates) - chosen, key=lambda length: (-frequencies[length], -length))
    return sorted([*chosen, *rest[: count - len(chosen)]])


def probe_batch(lengths: np.ndarray, length: int, args: TrainingArgs, rng: np.random.Generator) -> list[int]:
    """Row indices of a batch of `per_device_train_batch_size` rows padded to `length`: one row whose padded length
    is `length`, the others drawn from the rows no longer than it."""
    longest = rng.choice(np.flatnonzero(_padded(lengths, args) == length))
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
    row_lengths: list[int],
    fed_shapes: set[str],
    batches_of: Callable[[list[list[int]]], Iterator[dict[str, torch.Tensor]]],
    step: Callable[[dict[str, torch.Tensor]], object],
    device: torch.device,
) -> dict[str, str]:
    """The run's details the probes add (`time_new_shapes`): `SHAPE_PROBES` and `SHAPE_PROBES_REPEAT`, JSON
    {length: seconds} of the first and the second step at each length, and `SHAPE_PROBES_JIT`, JSON {length: bytes}
    of the lengths whose steps grew the kernel caches (none: no key). Nothing on a CPU (its timings say nothing of a
    GPU's) or without probes to make."""
    if args.new_shape_probes == 0 or device.type == "cpu":
        return {}
    probes = time_new_shapes(args, row_lengths, fed_shapes, batches_of, step, device)
    details = {}
    measured = {SHAPE_PROBES: probes.first, SHAPE_PROBES_REPEAT: probes.repeat, SHAPE_PROBES_JIT: probes.compiled}
    for key, values in measured.items():
        if values:
            details[key] = json.dumps(values, separators=(",", ":"))
    return details


@dataclass
class ProbeTimes:
    """What the probes measured: {length: seconds} of the first step at each length (the new length's price) and of
    the second (a step whose shape is known), and {length: bytes} of the lengths whose first or second step grew the
    kernel caches (on a GPU)."""

    first: dict[str, float] = field(default_factory=dict)
    repeat: dict[str, float] = field(default_factory=dict)
    compiled: dict[str, int] = field(default_factory=dict)


def time_new_shapes(
    args: TrainingArgs,
    row_lengths: list[int],
    fed_shapes: set[str],
    batches_of: Callable[[list[list[int]]], Iterator[dict[str, torch.Tensor]]],
    step: Callable[[dict[str, torch.Tensor]], object],
    device: torch.device,
) -> ProbeTimes:
    """Two steps (`step` trains one optimizer step over the batch it is given) at each of up to `new_shape_probes`
    lengths (`spread_lengths`) that no rank has fed (`fed_shapes`: this rank's, "8x512") and that are no longer than
    the longest any rank has fed, each timed: every length's first step in a shuffled order, then every length's
    second in another (seeded, the same on every rank), each batch read by `batches_of` (the batches of these rows'
    indices, in order, as the training steps get theirs)."""
    lengths = np.asarray(row_lengths, dtype=np.int64)
    batch = args.per_device_train_batch_size
    fed = {int(shape.split("x")[1]) for shape in fed_shapes if shape.startswith(f"{batch}x")}
    longest = _longest_of_any_rank(max(fed, default=0), device)
    candidates = sorted({int(length) for length in np.unique(_padded(lengths, args)) if length <= longest})
    fed = _fed_by_any_rank(candidates, fed, device)
    unfed = [length for length in candidates if length not in fed]
    chosen = spread_lengths(lengths, args, unfed, args.new_shape_probes)
    probes = ProbeTimes()
    if not chosen:
        return probes
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    rng = np.random.default_rng([args.seed, rank])
    rows = {length: probe_batch(lengths, length, args, rng) for length in chosen}
    order = np.random.default_rng(args.seed)  # the lengths' order: every rank's the same (they step together)
    first, second = [int(length) for length in order.permutation(chosen)], [int(n) for n in order.permutation(chosen)]
    if len(second) > 1 and second[0] == first[-1]:  # no step right after one at its own length
        second = second[1:] + second[:1]
    passes = [(probes.first, first), (probes.repeat, second)]
    sequence = [(times, length) for times, pass_lengths in passes for length in pass_lengths]
    # the first batch once more ahead of them, untimed: the loader process is started and reading ahead
    batches = batches_of([rows[sequence[0][1]], *(rows[length] for _, length in sequence)])
    next(batches)
    grown = dict.fromkeys(chosen, 0)
    jit_cache = JitCacheGrowth()
    jit_cache.start(kernel_cache_dirs() if device.type == "cuda" else ())
    for times, length in sequence:
        times[str(length)] = _timed(lambda: step(next(batches)), device)
        grown[length] = max(grown[length], jit_cache.take() or 0)
    most = _most_of_any_rank([grown[length] for length in chosen], device)
    probes.compiled = {str(length): size for length, size in zip(chosen, most, strict=True) if size}
    probes.first = {str(length): probes.first[str(length)] for length in chosen}  # in order of length
    probes.repeat = {str(length): probes.repeat[str(length)] for length in chosen}
    return probes


def _padded(lengths: np.ndarray, args: TrainingArgs) -> np.ndarray:
    """Each row's length rounded up to `pad_to_multiple_of`: the batch lengths a row can set."""
    multiple = args.pad_to_multiple_of or 1
    return -(-lengths // multiple) * multiple


def _timed(work: Callable[[], object], device: torch.device) -> float:
    """The seconds `work()` takes, the device synchronized before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    work()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _longest_of_any_rank(longest: int, device: torch.device) -> int:
    """The longest length any rank fed (every rank probes the same lengths; each fed its own batches)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return longest
    most = torch.tensor([float(longest)], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    return int(most.item())


def _most_of_any_rank(values: list[int], device: torch.device) -> list[int]:
    """Each of `values` (one per probe, the same probes on every rank) as the most any rank had: a rank that
    compiled slowed every rank's probe, and on several machines each reads its own JIT cache."""
    if not values or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return values
    most = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    return [int(value) for value in most.tolist()]
