"""What one training run measures: per-step time, tokens, memory and loss, and their summary.

The recorder is framework-neutral: a backend calls `begin_training`, `add_batch` for every
micro-batch it feeds the model, and `end_step` after every optimizer step; `record_loss` when a
loss is known. Step times are taken with the device synchronized at step boundaries, so a step's
time is the wall time from the end of the previous step to the end of this one (data loading,
forward, backward, optimizer and logging included).
"""

import platform
import resource
import statistics
import time
from dataclasses import dataclass, field

import torch

STEP_COLUMNS = (
    "step",
    "step_time_s",
    "non_padding_tokens",
    "padded_tokens",
    "loss",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "is_warmup",
)


@dataclass
class StepRecord:
    step: int
    step_time_s: float
    non_padding_tokens: int
    padded_tokens: int
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    is_warmup: bool
    loss: float | None = None


@dataclass
class StepRecorder:
    device: torch.device
    warmup_steps: int
    steps: list[StepRecord] = field(default_factory=list)
    memory_before_training: dict[str, int] = field(default_factory=dict)
    _last_end: float | None = None
    _tokens: int = 0
    _padded: int = 0

    @property
    def _cuda(self) -> bool:
        return self.device.type == "cuda"

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.device)

    def begin_training(self) -> None:
        """Record the memory held before the first step (weights, optimizer state if built) and start the clock."""
        self._sync()
        if self._cuda:
            self.memory_before_training = {
                "allocated_bytes": torch.cuda.memory_allocated(self.device),
                "reserved_bytes": torch.cuda.memory_reserved(self.device),
            }
            torch.cuda.reset_peak_memory_stats(self.device)
        self._last_end = time.perf_counter()

    def add_batch(self, attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> None:
        """Count one micro-batch's tokens: non-padding (attention mask) and padded (tensor size)."""
        self._padded += input_ids.numel()
        # Called before the micro-batch's forward is queued: the device is idle, so the sync is free.
        self._tokens += int(attention_mask.sum()) if attention_mask is not None else input_ids.numel()

    def end_step(self) -> None:
        self._sync()
        now = time.perf_counter()
        peak_alloc = torch.cuda.max_memory_allocated(self.device) if self._cuda else None
        peak_reserved = torch.cuda.max_memory_reserved(self.device) if self._cuda else None
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        index = len(self.steps)
        self.steps.append(
            StepRecord(
                step=index + 1,
                step_time_s=now - self._last_end,
                non_padding_tokens=self._tokens,
                padded_tokens=self._padded,
                peak_allocated_bytes=peak_alloc,
                peak_reserved_bytes=peak_reserved,
                is_warmup=index < self.warmup_steps,
            )
        )
        self._tokens = self._padded = 0
        self._last_end = now

    def record_loss(self, step: int, loss: float) -> None:
        if 1 <= step <= len(self.steps):
            self.steps[step - 1].loss = loss

    def step_rows(self) -> list[dict]:
        return [{name: getattr(s, name) for name in STEP_COLUMNS} for s in self.steps]

    def summary(self) -> dict[str, float]:
        """Headline metrics over the measured (non-warm-up) steps; warm-up reported apart."""
        measured = [s for s in self.steps if not s.is_warmup]
        warmup = [s for s in self.steps if s.is_warmup]
        out: dict[str, float] = {"steps_measured": float(len(measured)), "steps_warmup": float(len(warmup))}
        if warmup:
            out["warmup_time_s"] = sum(s.step_time_s for s in warmup)
        if measured:
            total_time = sum(s.step_time_s for s in measured)
            tokens = sum(s.non_padding_tokens for s in measured)
            padded = sum(s.padded_tokens for s in measured)
            times = [s.step_time_s for s in measured]
            out.update(
                tokens_per_second=tokens / total_time,
                padded_tokens_per_second=padded / total_time,
                padding_fraction=1 - tokens / padded if padded else 0.0,
                step_time_median_s=statistics.median(times),
                step_time_min_s=min(times),
                step_time_max_s=max(times),
            )
        if self.steps and self._cuda:
            out["peak_allocated_bytes"] = float(max(s.peak_allocated_bytes for s in self.steps))
            out["peak_reserved_bytes"] = float(max(s.peak_reserved_bytes for s in self.steps))
        for name, value in self.memory_before_training.items():
            out[f"before_training_{name}"] = float(value)
        losses = [s.loss for s in self.steps if s.loss is not None]
        if losses:
            out["final_loss"] = losses[-1]
        # ru_maxrss is in KiB on Linux.
        out["process_peak_rss_bytes"] = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return out


def environment(device: torch.device) -> dict[str, str]:
    """Where and with what a run happened."""
    import importlib.metadata as md

    env = {"hostname": platform.node(), "python": platform.python_version(), "device_type": device.type}
    for package in ("torch", "triton", "transformers", "trl", "liger-kernel", "datasets", "accelerate"):
        try:
            env[package] = md.version(package)
        except md.PackageNotFoundError:
            env[package] = "not installed"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu_name=props.name,
            gpu_count=str(torch.cuda.device_count()),
            gpu_memory_bytes=str(props.total_memory),
            cuda=str(torch.version.cuda),
        )
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env
