"""A grid's predictions before anything runs: per condition the peak memory and whether it fits the target GPU,
the step time and tokens/s, and for the grid the GPU-hours and their cost.

Step time is model FLOPs (`measuring.flops`' count: 6·N_trainable + 4·N_frozen + 12·L·H·S per token, with the
forward pass recomputed under gradient checkpointing) over the GPU's dense BF16 peak times the MFU assumed for
its kind (`gpus`). A run's GPU time adds `RUN_OVERHEAD_S` for starting its process and building the model.
"""

import dataclasses
import os
from dataclasses import dataclass, field
from math import inf

from finetune_bench.inputs.catalog import BACKENDS, SYNTHETIC_PREFIX
from finetune_bench.inputs.errors import Problems, SpecError
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.flops import attention_flops_per_token
from finetune_bench.prediction.gpus import (
    DEFAULT_ACCELERATOR,
    GIB,
    describe_gpu,
    emulated_memory_bytes,
    gpu_kind,
    usable_bytes,
)
from finetune_bench.prediction.memory import MemoryPrediction, predict_memory
from finetune_bench.prediction.shapes import ModelShape, NoPrediction, model_config, model_shape

# Seconds a run spends before its first step: process start, imports, building or loading the model (15-25 s per
# frontier probe of a 1B model on an H200, docs/frontier.md).
RUN_OVERHEAD_S = 30.0
# A prediction is trusted to this share either way: it is a sure OOM only when even 10 % less would not fit, and
# surely fits only when 10 % more would.
MARGIN = 0.10
# Verdicts. `borderline`: within MARGIN of the usable memory either way. `oom at max length`: a sure OOM at
# max_seq_length that data of shorter examples (padded to each batch's longest) may escape, so not a sure one.
FITS, BORDERLINE, OOM, UNKNOWN = "fits", "borderline", "oom", "unknown"
OOM_AT_MAX_LENGTH = "oom at max length"
# What each verdict means, in the plan's words (the console explains those its plan uses, the plan report all).
VERDICT_MEANINGS = {
    FITS: "fits even if the prediction is 10 % short",
    BORDERLINE: "within 10 % of the GPU's usable memory either way: it may or may not fit",
    OOM: "runs out of memory even if the prediction is 10 % over",
    OOM_AT_MAX_LENGTH: (
        "a sure OOM with every sequence max_seq_length tokens long, which data of shorter examples (batches padded to "
        "their longest) may escape"
    ),
    UNKNOWN: "no figure, or no GPU memory to compare it with (its line says which, or the conditions line for all)",
}
# Why a condition's verdict is unknown although its memory was predicted.
NO_TARGET_MEMORY = "no GPU memory to compare with: name gpu_kind (or gpu_memory_gib) to predict for a GPU"
ACCELERATOR_ENV = "FINETUNE_BENCH_TRAIN_ACCELERATOR"


@dataclass(frozen=True)
class Target:
    """The GPU a plan is for: its name, memory and peak (None where unknown), and the MFU assumed."""

    name: str
    memory_bytes: float | None
    peak_tflops: float | None
    assumed_mfu: float | None

    def describe(self) -> str:
        memory = f"{self.memory_bytes / GIB:.1f} GiB" if self.memory_bytes else "memory unknown"
        speed = f", {self.peak_tflops:g} TFLOP/s bf16 at MFU {self.assumed_mfu:g}" if self.peak_tflops else ""
        return f"{self.name or 'unnamed GPU'} ({memory}{speed})"


# More memory than any one GPU has (the largest today hold under 300 GiB): a typo, such as bytes given as GiB.
MAX_GPU_MEMORY_GIB = 1024


def check_plan_settings(gpu_kind_name: str, gpu_memory_gib: float, gpu_hour_price: float) -> None:
    """The prediction inputs' types and ranges, every problem at once."""
    problems = Problems()
    with problems.check():
        if gpu_kind_name:
            gpu_kind(gpu_kind_name)
    if isinstance(gpu_memory_gib, bool) or not isinstance(gpu_memory_gib, int | float) or not gpu_memory_gib >= 0:
        problems.found.append(f"gpu_memory_gib must be a number of GiB, 0 for the GPU kind's, got {gpu_memory_gib!r}")
    elif gpu_memory_gib > MAX_GPU_MEMORY_GIB:
        problems.found.append(
            f"gpu_memory_gib must be at most {MAX_GPU_MEMORY_GIB:,} GiB (one GPU's memory), got {gpu_memory_gib!r}"
        )
    if isinstance(gpu_hour_price, bool) or not isinstance(gpu_hour_price, int | float) or not 0 <= gpu_hour_price < inf:
        problems.found.append(f"gpu_hour_price must be a price per GPU-hour, 0 for none, got {gpu_hour_price!r}")
    problems.raise_if_any()


def train_accelerator() -> str:
    """The accelerator the train tasks are registered with: FINETUNE_BENCH_TRAIN_ACCELERATOR, else the default
    (an A100); set empty, none (any GPU the cluster gives)."""
    return os.environ.get(ACCELERATOR_ENV, DEFAULT_ACCELERATOR)


def target_gpu(gpu_kind_name: str = "", gpu_memory_gib: float = 0.0, accelerator: str = "") -> Target:
    """The GPU named by `gpu_kind`, else by the inputs' `accelerator`, else by FINETUNE_BENCH_TRAIN_ACCELERATOR when
    it is set (not its cluster default: a local run's GPU is whatever the machine has); `gpu_memory_gib` overrides
    its memory (or gives it when no kind is named)."""
    check_plan_settings(gpu_kind_name, gpu_memory_gib, 0.0)
    name, key = next(
        (pair for pair in ((gpu_kind_name, "gpu_kind"), (accelerator, "accelerator")) if pair[0]),
        (os.environ.get(ACCELERATOR_ENV, ""), ACCELERATOR_ENV),
    )
    kind = gpu_kind(name, key=key) if name else None
    memory = gpu_memory_gib * GIB if gpu_memory_gib else (kind.memory_bytes if kind else None)
    return Target(
        name=kind.name if kind else ("" if not gpu_memory_gib else f"{gpu_memory_gib:g} GiB GPU"),
        memory_bytes=memory,
        peak_tflops=kind.peak_tflops if kind else None,
        assumed_mfu=kind.assumed_mfu if kind else None,
    )


@dataclass
class ConditionPrediction:
    """What is predicted for one condition (every run of it is alike)."""

    condition_id: str
    training_args: TrainingArgs
    memory: MemoryPrediction | None
    # Why there is no memory figure (the model does not cover the condition), else "".
    unpredicted: str
    verdict: str
    step_time_s: float | None
    tokens_per_second: float | None
    flops_per_token: float | None = None
    # Why the verdict is `unknown` or `oom at max length` (the figure alone does not say), else "".
    verdict_reason: str = ""

    def oom_reason(self, target: Target) -> str:
        """The reason a run skipped as a sure OOM ends with."""
        m = self.memory
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in m.breakdown.items() if v >= 0.05 * GIB)
        return (
            f"predicted out of memory: {m.peak_reserved_bytes / GIB:.1f} GiB reserved at the "
            f"{m.phase.replace('_', ' ')} ({parts} GiB) against "
            f"{usable_bytes(emulated_memory_bytes(self.training_args, target.memory_bytes)) / GIB:.1f} GiB "
            f"usable on {describe_gpu(target.name or 'the GPU', self.training_args)}; "
            "not launched (skip_predicted_oom)"
        )


@dataclass
class GridEstimate:
    """The grid's predictions and totals."""

    target: Target
    conditions: list[ConditionPrediction]
    runs: int
    n_runs: int
    gpu_hours: float | None
    cost: float | None
    hour_price: float
    skipped_runs: int = 0
    notes: list[str] = field(default_factory=list)


def sequences_full(args: TrainingArgs) -> bool:
    """Every sequence is max_seq_length tokens of text and unpacked: generated words (at least one token each)
    that outnumber the tokens. Real data is padded to a batch's longest sequence: predicted at full length."""
    generated = args.dataset_name.startswith(SYNTHETIC_PREFIX)
    return generated and not args.packing and args.synthetic_min_words >= args.max_seq_length


def flops_per_token(args: TrainingArgs, shape: ModelShape) -> float:
    """Model FLOPs per token of a step of `args`, as `measuring.flops.model_flops_per_token` counts them."""
    trains = BACKENDS[args.backend].trains
    attention = attention_flops_per_token(shape.num_layers, shape.q_width, args.max_seq_length, training=trains)
    if not trains:
        return 2.0 * shape.matmul_parameters + attention
    adapters = shape.lora_parameters(args.lora_rank, args.lora_target_modules)
    if adapters:
        return 6.0 * adapters + 4.0 * shape.matmul_parameters + attention
    return 6.0 * shape.matmul_parameters + attention


def predict_condition(
    condition_id: str, args: TrainingArgs, target: Target, shape: ModelShape | None, unpredicted: str = ""
) -> ConditionPrediction:
    memory, step_time, tokens_per_second, flops = None, None, None, None
    if shape is not None:
        try:
            memory = predict_memory(args, shape, sequences_full(args))
        except NoPrediction as reason:
            unpredicted = str(reason)
    if shape is not None and args.device != "cpu":
        flops = flops_per_token(args, shape)
    verdict, verdict_reason = UNKNOWN, unpredicted
    memory_bytes = emulated_memory_bytes(args, target.memory_bytes)  # a capped run's GPU is the one it emulates
    if memory is not None and not memory_bytes:
        verdict_reason = NO_TARGET_MEMORY
    elif memory is not None:
        usable, peak = usable_bytes(memory_bytes), memory.peak_reserved_bytes
        verdict = FITS if peak * (1 + MARGIN) <= usable else OOM if peak * (1 - MARGIN) > usable else BORDERLINE
        if verdict == OOM and not sequences_full(args):
            # predicted at full length, an upper bound for real data: never a sure OOM
            verdict = OOM_AT_MAX_LENGTH
            verdict_reason = (
                f"out of memory if every sequence is {args.max_seq_length} tokens; a batch is padded to its longest "
                "example, so shorter examples may fit (not a sure OOM: never skipped)"
            )
    if flops is not None and target.peak_tflops:
        tokens = args.per_device_train_batch_size * args.max_seq_length * args.gradient_accumulation_steps
        hardware = flops
        if args.gradient_checkpointing and BACKENDS[args.backend].trains:
            hardware = flops * 4 / 3  # the forward pass runs twice: 8·N instead of 6·N
        step_time = tokens * hardware / (target.peak_tflops * 1e12 * target.assumed_mfu)
        tokens_per_second = tokens / step_time
    return ConditionPrediction(
        condition_id=condition_id,
        training_args=args,
        memory=memory,
        unpredicted=unpredicted,
        verdict=verdict,
        step_time_s=step_time,
        tokens_per_second=tokens_per_second,
        flops_per_token=flops,
        verdict_reason=verdict_reason,
    )


def shape_of(args: TrainingArgs, model_dir: str | None = None) -> tuple[ModelShape | None, str]:
    """The model's shape, or None and why not."""
    try:
        return model_shape(model_config(args.model_name, model_dir, args.model_config_overrides)), ""
    except NoPrediction as reason:
        return None, str(reason)


def estimate_grid(
    planned: list[PlannedRun], target: Target, hour_price: float = 0.0, skip_predicted_oom: bool = False
) -> GridEstimate:
    """Predict every condition of `planned` once, and the grid's GPU time and cost."""
    conditions: dict[str, ConditionPrediction] = {}
    shapes: dict[tuple[str, str], tuple[ModelShape | None, str]] = {}  # by model and config overrides
    for run in planned:
        if run.condition_id in conditions:
            continue
        model = (run.training_args.model_name, run.training_args.model_config_overrides)
        if model not in shapes:
            shapes[model] = shape_of(run.training_args)
        shape, why = shapes[model]
        conditions[run.condition_id] = predict_condition(run.condition_id, run.training_args, target, shape, why)
    seconds, known, skipped = 0.0, True, 0
    for run in planned:
        prediction = conditions[run.condition_id]
        if run.refused:
            continue
        if prediction.verdict == OOM:
            skipped += skip_predicted_oom
            seconds += 0 if skip_predicted_oom else RUN_OVERHEAD_S
        elif prediction.step_time_s is None:
            known = False
        else:  # GPU time: every GPU of the run for as long as it runs
            gpus = run.training_args.world_size
            seconds += (RUN_OVERHEAD_S + prediction.step_time_s * run.training_args.max_steps) * gpus
    hours = seconds / 3600 if known else None
    notes = []
    if not known:
        notes.append("GPU time: some conditions have no predicted step time (no GPU kind, or a model not modelled)")
    return GridEstimate(
        target=target,
        conditions=list(conditions.values()),
        runs=len(planned),
        n_runs=max((r.run_number for r in planned), default=-1) + 1,
        gpu_hours=hours,
        cost=hours * hour_price if hours is not None and hour_price else None,
        hour_price=hour_price,
        skipped_runs=skipped,
        notes=notes,
    )


def with_predictions(planned: list[PlannedRun], estimate: GridEstimate, skip_predicted_oom: bool) -> list[PlannedRun]:
    """The planned runs carrying their condition's predicted peak; with `skip_predicted_oom`, a sure OOM is
    marked so that it ends as a `predicted_oom` result without being launched."""
    by_id = {c.condition_id: c for c in estimate.conditions}
    updated = []
    for run in planned:
        prediction = by_id[run.condition_id]
        changes: dict = {}
        if prediction.memory is not None:
            changes["predicted_peak_reserved_bytes"] = prediction.memory.peak_reserved_bytes
            changes["predicted_moment_allocated_bytes"] = dict(prediction.memory.moments)
        if skip_predicted_oom and prediction.verdict == OOM and not run.refused:
            changes["predicted_oom"] = prediction.oom_reason(estimate.target)
        updated.append(dataclasses.replace(run, **changes))
    return updated


def check_skip_has_target(skip_predicted_oom: bool, target: Target) -> None:
    if skip_predicted_oom and not target.memory_bytes:
        raise SpecError(
            "skip_predicted_oom needs the GPU's memory: set gpu_kind (e.g. H100) or gpu_memory_gib, "
            f"or {ACCELERATOR_ENV} for the train task"
        )
