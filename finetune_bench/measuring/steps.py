"""What one training run measures: per-step time, tokens, memory and loss, and their summary.

The recorder is framework-neutral: a backend calls `begin_training`, `add_batch` for every
micro-batch it feeds the model, and `end_step` after every optimizer step; `record_loss` when a
loss is known; `record_eval` after a held-out evaluation, run inside `outside_steps` so that its time and
memory are kept out of the steps'. Step times are taken with the device synchronized at step boundaries, so a step's
time is the wall time from the end of the previous step to the end of this one (data loading,
forward, backward, optimizer and logging included). A step's GPU energy is NVML's energy counter read at the same
boundaries (`measuring.gpu.EnergyCounter`); where the counter is unknown the recorder says why
(`energy_unavailable`) and no energy figure is made.
"""

import gc
import logging
import math
import resource
import statistics
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from finetune_bench.measuring.gc_timer import GcTimer
from finetune_bench.measuring.gpu import EnergyCounter, NvmlPeakSampler, open_energy_counter
from finetune_bench.measuring.jit_cache import JitCacheGrowth, jit_cache_text, kernel_cache_dirs
from finetune_bench.measuring.memory_phases import MemoryPhasePeaks
from finetune_bench.measuring.metrics import IN_WALL, MEASURED_TIME, METRICS, STEADY_TIME, throughput
from finetune_bench.measuring.quality import perplexity
from finetune_bench.measuring.steady_state import TimedStep, length_histogram, steady_state
from finetune_bench.measuring.step_table import StepRecord, write_step_table
from finetune_bench.measuring.triton_compiles import TritonCompileCounter, compilations_text

logger = logging.getLogger(__name__)


class NonFiniteLoss(RuntimeError):
    """Training produced a NaN or infinite loss."""


@dataclass
class StepRecorder:
    device: torch.device
    warmup_steps: int
    # Where the per-step table is kept as steps finish (rewritten atomically after every step), so that a run
    # killed part-way (timeout, SIGKILL, a crash) still has the steps it finished; None: kept in memory only.
    steps_file: Path | None = None
    steps: list[StepRecord] = field(default_factory=list)
    memory_before_training: dict[str, int] = field(default_factory=dict)
    _last_end: float | None = None
    _tokens: int = 0
    _padded: int = 0
    # The micro-batch shapes of the step under way, and every shape the run has fed so far.
    _step_shapes: list[str] = field(default_factory=list)
    _shapes_seen: set[str] = field(default_factory=set)
    # The lengths of the rows the run's batches are drawn from, as a histogram (`steady_state.length_histogram`; set by
    # a backend that batches the rows itself, "" otherwise): the user's whole fine-tune is projected from it.
    row_length_histogram: str = ""
    # The slowest measured steps as `steady_state` describes them (set by `summary`).
    outlier_descriptions: list[str] = field(default_factory=list)
    _nvml: NvmlPeakSampler | None = None
    _nvml_summary: dict[str, float] = field(default_factory=dict)
    # Model FLOPs of a token in a sequence of length S: _flops_fixed + _flops_per_seq_len * S.
    _flops_fixed: float | None = None
    _flops_per_seq_len: float = 0.0
    _flops: float = 0.0
    flops_formula: str = ""
    _gc: GcTimer = field(default_factory=GcTimer)
    _triton: TritonCompileCounter = field(default_factory=TritonCompileCounter)
    _counting_compiles: bool = False
    _jit_cache: JitCacheGrowth = field(default_factory=JitCacheGrowth)
    _gc_at_last_end: float = 0.0
    _allocator_at_last_end: tuple[int, int] = (0, 0)
    # Held-out evaluations: the loss before the first step, and the total time and tokens they took.
    initial_eval_loss: float | None = None
    eval_time_s: float = 0.0
    eval_tokens: int = 0
    # Why the held-out evaluations stopped early ("" when they did not).
    eval_error: str = ""
    # The next step follows work outside the steps that emptied the allocator's cache: it is not a steady step.
    _recovering: bool = False
    # The process's peak host memory when training ended (before anything after it, a profile, could add to it).
    _peak_rss_bytes: float | None = None
    # The GPU's energy counter and its reading at the last step boundary; why the run has no energy figure ("" when
    # it has one).
    _energy: EnergyCounter | None = None
    _energy_at_last_end: float | None = None
    energy_unavailable: str = ""
    # The GPU memory peaks by memory phase (`MEMORY_PHASES`) and by step.
    _memory: MemoryPhasePeaks | None = None
    # The phases of the run's timeline measured here (`measuring.metrics.TIMELINE`), in seconds; and when the last
    # of them ended (`setup_s` runs from there to the first step).
    phases: dict[str, float] = field(default_factory=dict)
    _phase_ended: float | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the block's wall time in the timeline's phase `name` (added to what it already has), however the
        block ends. Two cost perf_counter calls: nothing is synchronized."""
        metric = METRICS.get(name)
        if metric is None or metric.phase != IN_WALL:
            raise ValueError(f"{name!r} is not a phase of the child's timeline (measuring.metrics.TIMELINE)")
        start = time.perf_counter()
        try:
            yield
        finally:
            self._phase_ended = time.perf_counter()
            self.phases[name] = self.phases.get(name, 0.0) + self._phase_ended - start

    def __post_init__(self) -> None:
        self._memory = MemoryPhasePeaks(self.device)

    @property
    def memory_phase_peaks(self) -> dict[str, dict[str, int]]:
        """Per memory phase, the peak allocated and reserved bytes over the run."""
        return self._memory.peaks

    def enter_memory_phase(self, name: str) -> None:
        """From now on the allocator's peaks count in memory phase `name` (until `leave_memory_phase`); phases nest."""
        self._memory.enter(name)

    def leave_memory_phase(self) -> None:
        """End the innermost memory phase (nothing when none is under way)."""
        self._memory.leave()

    @property
    def current_memory_phase(self) -> str:
        """The memory phase under way, or the one a failure left ("" outside every phase: the model's set-up)."""
        return self._memory.current

    def memory_phase(self, name: str) -> AbstractContextManager[None]:
        """The block's GPU memory peaks count in memory phase `name` (`MEMORY_PHASES`), however it ends."""
        return self._memory.within(name)

    @property
    def shapes_fed(self) -> set[str]:
        """Every micro-batch shape the run has fed ("8x512")."""
        return set(self._shapes_seen)

    def record_row_lengths(self, lengths: list[int]) -> None:
        """Keep the lengths of the rows this run's batches are drawn from (after tokenization, truncation, packing)."""
        self.row_length_histogram = length_histogram(lengths)

    def attach_model(self, model: torch.nn.Module, training: bool = True) -> None:
        """Enable model-FLOPs accounting (see `finetune_bench.measuring.flops`) for `model`: a training step's count
        (frozen weights, e.g. under LoRA, get no weight-gradient FLOPs: attach after freezing), or a
        forward pass's (`training=False`). `flops_formula` says which count was used."""
        from finetune_bench.measuring.flops import flops_formula, model_flops_per_token

        self._flops_fixed = model_flops_per_token(model, 0, training)
        self._flops_per_seq_len = model_flops_per_token(model, 1, training) - self._flops_fixed
        self.flops_formula = flops_formula(model, training)

    @property
    def _cuda(self) -> bool:
        return self.device.type == "cuda"

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.device)

    def _allocator_counts(self) -> tuple[int, int]:
        """cudaMalloc calls and free-the-cache-and-retry events so far."""
        stats = torch.cuda.memory_stats(self.device)
        return int(stats.get("num_device_alloc", 0)), int(stats.get("num_alloc_retries", 0))

    def begin_training(self) -> None:
        """Record the memory held before the first step (weights, optimizer state if built) and start the clock."""
        self._sync()
        if self._cuda:
            self.memory_before_training = {
                "allocated_bytes": torch.cuda.memory_allocated(self.device),
                "reserved_bytes": torch.cuda.memory_reserved(self.device),
            }
            torch.cuda.reset_peak_memory_stats(self.device)
            try:
                self._nvml = NvmlPeakSampler(self.device)
                self._nvml.start()
            except Exception as exc:  # no NVML (driver, library) means no driver-side figure, said in the log
                logger.warning("NVML unavailable, no driver-side memory figure: %s", exc)
                self._nvml = None
            self._allocator_at_last_end = self._allocator_counts()
        self._energy, self.energy_unavailable = open_energy_counter(self.device)
        # Everything alive now (torch's, transformers' and the model's Python objects, about a million) goes to the
        # collector's permanent generation: a full collection inside the steps then walks only what the steps
        # create. Without it, one full collection that fell inside a timed step cost 0.3-0.4 s on an H100 machine
        # (a 0.25 s step), in some runs of an arm and not others. The collector still runs; gc_time_s counts it.
        gc.collect()
        gc.freeze()
        self._gc.install()
        self._gc_at_last_end = self._gc.total_s
        self._counting_compiles = self._triton.install()
        if self._cuda:
            self._jit_cache.start(kernel_cache_dirs())
        self._energy_at_last_end = self._read_energy()
        self._last_end = time.perf_counter()
        if self._phase_ended is not None and "setup_s" not in self.phases:
            # the evaluations so far are the one before the first step, counted in eval_time_s
            self.phases["setup_s"] = max(self._last_end - self._phase_ended - self.eval_time_s, 0.0)

    def _read_energy(self) -> float | None:
        """The energy counter now (joules); None without one. A failed read ends the counting, saying why."""
        if self._energy is None:
            return None
        try:
            return self._energy.read_j()
        except Exception as exc:  # an NVML error mid-run: no energy figure for the run, and the record says why
            self.energy_unavailable = f"NVML's energy counter failed at step {len(self.steps) + 1}: {exc!r}"
            logger.warning("%s", self.energy_unavailable)
            self._energy = None
            return None

    def _step_energy(self) -> float | None:
        """The energy since the last step boundary (joules), the counter's reading kept as the next boundary's."""
        reading = self._read_energy()
        last, self._energy_at_last_end = self._energy_at_last_end, reading
        if reading is None or last is None:
            return None
        if reading < last:  # the driver reloaded (its counter restarts): this run's energy is not known
            self.energy_unavailable = f"NVML's energy counter went back at step {len(self.steps) + 1}"
            logger.warning("%s", self.energy_unavailable)
            self._energy = self._energy_at_last_end = None
            return None
        return reading - last

    def add_batch(self, attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> None:
        """Count one micro-batch's tokens: non-padding (attention mask) and padded (tensor size)."""
        self._padded += input_ids.numel()
        self._step_shapes.append("x".join(str(n) for n in input_ids.shape))
        # Called before the micro-batch's forward is queued: the device is idle, so the sync is free.
        tokens = int(attention_mask.sum()) if attention_mask is not None else input_ids.numel()
        self._tokens += tokens
        if self._flops_fixed is not None:
            # Attention work grows with the (padded) length of the sequence each token sits in.
            self._flops += tokens * (self._flops_fixed + self._flops_per_seq_len * input_ids.shape[-1])

    def end_step(self) -> None:
        self._sync()
        now = time.perf_counter()
        peak_alloc = peak_reserved = mallocs = retries = None
        if self._cuda:
            # the step's peak: the largest of its phases' and of what ran outside them
            peak_alloc, peak_reserved = self._memory.take_step_peaks()
            counts = self._allocator_counts()
            mallocs, retries = (
                now_n - last_n for now_n, last_n in zip(counts, self._allocator_at_last_end, strict=True)
            )
            self._allocator_at_last_end = counts
        gc_time = self._gc.total_s - self._gc_at_last_end
        self._gc_at_last_end = self._gc.total_s
        energy = self._step_energy()
        compiles, compile_s, kernels = self._triton.take()
        jit_bytes = self._jit_cache.take()
        new_shape, compiles, compile_s, jit_bytes = self._across_ranks(
            self._fed_new_shape(), compiles, compile_s, jit_bytes
        )
        if not self._counting_compiles:
            compiles = compile_s = None
        index = len(self.steps)
        self.steps.append(
            StepRecord(
                step=index + 1,
                step_time_s=now - self._last_end,
                non_padding_tokens=self._tokens,
                padded_tokens=self._padded,
                batch_shape="+".join(self._step_shapes),
                new_shape=new_shape,
                peak_allocated_bytes=peak_alloc,
                peak_reserved_bytes=peak_reserved,
                is_warmup=index < self.warmup_steps or self._recovering,
                model_flops=self._flops if self._flops_fixed is not None else None,
                gc_time_s=gc_time,
                cuda_mallocs=mallocs,
                cuda_malloc_retries=retries,
                triton_compiles=compiles,
                triton_compile_s=compile_s,
                triton_kernels_compiled=kernels,
                jit_cache_bytes=jit_bytes,
                energy_j=energy,
            )
        )
        self._tokens = self._padded = 0
        self._step_shapes = []
        self._flops = 0.0
        self._recovering = False
        if self.steps_file is not None:
            self.write_steps(self.steps_file)
        bookkept = self.steps_file is not None or self._distributed or jit_bytes is not None
        if bookkept:
            # The next step's energy and clock start after the bookkeeping: writing the table, reading the JIT
            # cache and the ranks' word on new shapes are not training.
            self._energy_at_last_end = self._read_energy()
        self._last_end = time.perf_counter() if bookkept else now

    @property
    def _distributed(self) -> bool:
        return torch.distributed.is_available() and torch.distributed.is_initialized()

    def _fed_new_shape(self) -> bool:
        """Whether the step just ended fed a micro-batch shape this rank had not fed before."""
        new = any(shape not in self._shapes_seen for shape in self._step_shapes)
        self._shapes_seen.update(self._step_shapes)
        return new

    def _across_ranks(
        self, new_shape: bool, compiles: int, compile_s: float, jit_bytes: int | None
    ) -> tuple[bool, int, float, int | None]:
        """On several GPUs: whether any rank fed a new shape, and the most Triton compilations, compile seconds and
        JIT cache growth of any rank (one collective after the step's end, outside its time: what slows one rank's
        step slows every rank's, since they wait for it). On one, the figures as they are."""
        if not self._distributed:
            return new_shape, compiles, compile_s, jit_bytes
        figures = torch.tensor(
            [float(new_shape), float(compiles), compile_s, -1.0 if jit_bytes is None else float(jit_bytes)],
            dtype=torch.float64,
            device=self.device,
        )
        torch.distributed.all_reduce(figures, op=torch.distributed.ReduceOp.MAX)
        new, most, longest, grown = figures.tolist()
        return bool(new), int(most), longest, None if grown < 0 else int(grown)

    @contextmanager
    def outside_steps(self) -> Iterator[None]:
        """Run work between steps (a held-out evaluation) without it counting in any step: the driver-side sampler
        pauses, and afterwards the allocator's cache is emptied (what the work reserved is not left counted in
        the next steps' reserved peaks) and the next step's clock, peaks, allocator counts and garbage-collection
        time start after it. That next step re-reserves its memory (cudaMalloc calls): it is excluded from the
        headline figures, as a warm-up step is."""
        self._sync()
        if self._nvml is not None:
            self._nvml.pause()
        try:
            yield
        finally:
            self._sync()
            if self._cuda:
                self._memory.take_step_peaks()  # the work's peaks count in its own memory phase, not in a step's
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(self.device)
                self._allocator_at_last_end = self._allocator_counts()
                self._recovering = True
            self._triton.take()  # what the work compiled is not the next step's
            self._jit_cache.take()
            if self._nvml is not None:
                self._nvml.resume()
            self._gc_at_last_end = self._gc.total_s
            self._energy_at_last_end = self._read_energy()
            self._last_end = time.perf_counter()

    def record_eval(self, step: int, loss: float, tokens: int, seconds: float) -> None:
        """Keep the held-out loss evaluated after step `step` (0: before the first step), over `tokens` tokens in
        `seconds`. A NaN or infinite held-out loss ends the run, as a training loss does."""
        self.eval_time_s += seconds
        self.eval_tokens += tokens
        if step == 0:
            self.initial_eval_loss = loss
        elif 1 <= step <= len(self.steps):
            self.steps[step - 1].eval_loss = loss
            if self.steps_file is not None:
                self.write_steps(self.steps_file)
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"the held-out loss is {loss} after step {step}")

    def end_training(self) -> None:
        """Stop background sampling and take the host-memory peak (whatever way training ended; a second call
        changes nothing): what runs after it, a profile, is not counted."""
        self._gc.remove()
        counted_to_the_end = self._triton.remove()  # None: removed before, by a first call
        if counted_to_the_end is not None:  # False: a library replaced the hooks since, the figures are not whole
            self._counting_compiles = self._counting_compiles and counted_to_the_end
        gc.unfreeze()
        if self._nvml is not None:
            self._nvml_summary = self._nvml.stop()
            self._nvml = None
        if self._peak_rss_bytes is None:  # ru_maxrss is in KiB on Linux
            self._peak_rss_bytes = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        self._memory.close()

    def record_loss(self, step: int, loss: float) -> None:
        """Keep step `step`'s loss; a NaN or infinite loss ends the run (NonFiniteLoss): what follows is noise."""
        if 1 <= step <= len(self.steps):
            self.steps[step - 1].loss = loss
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"the loss is {loss} at step {step}")

    def write_steps(self, path: Path) -> None:
        """Write the per-step table of the steps finished so far to `path` (`step_table.write_step_table`)."""
        write_step_table(path, self.steps)

    def summary(self, gpu_name: str = "") -> dict[str, float]:
        """Headline metrics over the measured (non-warm-up) steps; warm-up reported apart."""
        measured = [s for s in self.steps if not s.is_warmup]
        warmup = [s for s in self.steps if s.is_warmup]
        out: dict[str, float] = {"steps_measured": float(len(measured)), "steps_warmup": float(len(warmup))}
        if warmup:
            out["warmup_time_s"] = sum(s.step_time_s for s in warmup)
        if measured:
            # the totals the rates come from: a run on several GPUs adds its ranks' up (`running.ranks`)
            totals = {
                MEASURED_TIME: sum(s.step_time_s for s in measured),
                "measured_tokens": float(sum(s.non_padding_tokens for s in measured)),
                "measured_padded_tokens": float(sum(s.padded_tokens for s in measured)),
            }
            if all(s.energy_j is not None for s in measured):  # else `energy_unavailable` says why
                totals["measured_energy_j"] = sum(s.energy_j for s in measured)
            if self._flops_fixed is not None:
                totals["measured_model_flops"] = sum(s.model_flops for s in measured)
                out["model_flops_per_token"] = totals["measured_model_flops"] / totals["measured_tokens"]
            steady, self.outlier_descriptions = steady_state(
                [
                    TimedStep(
                        s.step,
                        s.step_time_s,
                        s.non_padding_tokens,
                        s.padded_tokens,
                        s.batch_shape,
                        s.new_shape,
                        compiled="; ".join(
                            text
                            for text in (
                                compilations_text(s.triton_compiles, s.triton_compile_s, s.triton_kernels_compiled),
                                jit_cache_text(s.jit_cache_bytes),
                            )
                            if text
                        ),
                    )
                    for s in measured
                ]
            )
            if self._counting_compiles:
                out["triton_compiles"] = float(sum(s.triton_compiles for s in measured))
                out["triton_compile_s"] = sum(s.triton_compile_s for s in measured)
            if STEADY_TIME in steady:
                totals[STEADY_TIME] = steady.pop(STEADY_TIME)
            times = [s.step_time_s for s in measured]
            out.update(steady)
            out.update(
                totals,
                timed_steps_s=totals[MEASURED_TIME],
                **throughput(totals, totals[MEASURED_TIME]),
                step_time_median_s=statistics.median(times),
                step_time_min_s=min(times),
                step_time_max_s=max(times),
                tokens_per_second_median_step=statistics.median(s.non_padding_tokens / s.step_time_s for s in measured),
            )
        if self.steps:
            out["distinct_batch_shapes"] = float(len(self._shapes_seen))
        if self.steps and self._cuda:
            out["peak_allocated_bytes"] = float(max(s.peak_allocated_bytes for s in self.steps))
            out["peak_reserved_bytes"] = float(max(s.peak_reserved_bytes for s in self.steps))
        for phase, peaks in self.memory_phase_peaks.items():
            out[f"peak_allocated_{phase}_bytes"] = float(peaks["allocated"])
            out[f"peak_reserved_{phase}_bytes"] = float(peaks["reserved"])
        for name, value in self.memory_before_training.items():
            out[f"before_training_{name}"] = float(value)
        out.update(self._nvml_summary)
        if "achieved_tflops" in out:
            from finetune_bench.measuring.flops import mfu

            utilization = mfu(out["achieved_tflops"], gpu_name)
            if utilization is not None:
                out["mfu"] = utilization
        losses = [s.loss for s in self.steps if s.loss is not None]
        if losses:
            out["final_loss"] = losses[-1]
        if self.initial_eval_loss is not None:
            out["initial_eval_loss"] = self.initial_eval_loss
        evaluated = [s.eval_loss for s in self.steps if s.eval_loss is not None]
        if evaluated:
            out["final_eval_loss"] = evaluated[-1]
            out["final_eval_perplexity"] = perplexity(evaluated[-1])
        if self.eval_tokens:
            out["eval_time_s"] = self.eval_time_s
            out["eval_tokens"] = float(self.eval_tokens)
        out.update(self.phases)
        # ru_maxrss is in KiB on Linux; taken when training ended if it has
        rss = self._peak_rss_bytes
        out["process_peak_rss_bytes"] = (
            rss if rss is not None else float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        )
        return out
