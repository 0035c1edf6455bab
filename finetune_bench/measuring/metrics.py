"""The run-level metrics, one row each: the name in a run's record (`RunResult.metrics`), its column in the results
table (results.csv) and that column's scale, its unit, what it measures, on which runs it exists, and how a run on
several GPUs makes its figure of its ranks' (`running.ranks`). No torch: the analysis side reads it too.

The step recorder (`measuring.steps`) produces the one-GPU figures, and `throughput` is the one formula of the rates
and the padding fraction, for one rank's totals as for the sums over the ranks.
"""

from dataclasses import dataclass

GIB = 1024**3

# How a run on several GPUs makes a metric of its ranks'.
RANK0 = "rank0"  # rank 0's figure stands: the ranks step together (step times, losses, per-token counts)
SUM = "sum"  # a rate: the ranks' totals (`rate_of`) summed, over the slowest rank's measured time
# the largest rank's (a memory peak: with its spread over the ranks, `<name>_spread`, where the table has that row);
# rank 0's when a rank filed none
MAX = "max"
DERIVED = "derived"  # computed from the merged figures (the padding fraction, MFU, per GPU, the spreads)
RANK_ONLY = "rank_only"  # one rank's own view: a run on several GPUs has no such figure (its totals stay per rank)
TOTAL = "total"  # not a rate: the ranks' totals (`total_of`) summed (energy: every GPU's)
PER_TOKEN = "per_token"  # the ranks' totals (`total_of`) summed, over their non-padding tokens summed
MERGES = (RANK0, SUM, MAX, DERIVED, RANK_ONLY, TOTAL, PER_TOKEN)

# On which runs a metric exists (beyond what it measures: a loss needs a logged loss, an evaluation's figures an
# evaluation, a rate a measured step).
ANY_DEVICE = "any device"
CUDA = "a CUDA device"  # the allocator's and the driver's memory figures; MFU (also needs the GPU's peak known)
SEVERAL_GPUS = "several GPUs"  # made by the rank merge only
# A GPU whose driver keeps NVML's total-energy counter (Volta and later); where it is unknown, the run's details
# say why (`ENERGY_UNAVAILABLE`).
ENERGY_COUNTER = "a GPU with NVML's energy counter"
# A run whose timed steps include enough that met no new batch shape (`steady_state.MIN_STEADY_STEPS`).
STEADY_STATE = "a run with a steady state (3 timed steps or more that met no new batch shape)"
# A run whose Triton has JIT hooks to count its compilations (`measuring.triton_compiles`; Triton 3.4 or later).
TRITON_HOOKS = "a run with Triton's JIT hooks (Triton 3.4 or later)"
SHAPE_PROBING = "the plain loop on padded batches on a GPU (`new_shape_probes`)"
SCOPES = (ANY_DEVICE, CUDA, SEVERAL_GPUS, ENERGY_COUNTER, STEADY_STATE, TRITON_HOOKS, SHAPE_PROBING)

# The measured time every rate is over (a run on several GPUs: the slowest rank's).
MEASURED_TIME = "measured_time_s"
# The non-padding tokens every per-token figure is over.
MEASURED_TOKENS = "measured_tokens"
# The phases of a run whose GPU memory peaks are kept apart (`measuring.steps.StepRecorder.memory_phase`), in the
# order a step goes through them, each with what it covers.
MEMORY_PHASES = {
    "forward": "forward pass (with the loss where the model computes it in its forward: its own, Liger's fused)",
    "loss": "loss computed apart from the forward (from the logits, or from the last hidden states)",
    "backward": "backward pass",
    "optimizer": "optimizer step (the step, the learning rate's, zeroing the gradients; the plain loop's clipping)",
    "evaluation": "held-out evaluations",
}
# The measured steps' time at the run's steady rate (`measuring.steady_state`): the steady-state throughput's time.
STEADY_TIME = "steady_time_s"
# The key of a run's details (`RunResult.details`) saying why it has no energy figures.
ENERGY_UNAVAILABLE = "energy_unavailable"
JOULES_PER_KWH = 3.6e6

# A run's timeline: where its wall time went, one phase a row (`Metric.phase`). The phases in the child's wall time
# (`RunResult.wall_time_s`, from the launcher starting the child to the child's exit) never overlap, so their sum is
# at most the wall time; what no phase covers is the analysis' explicit remainder (`analysis.timeline`). The
# launcher's own phases come before or after that wall time.
IN_WALL = "in the child's wall time"
LAUNCHER = "the launcher's, outside the child's wall time"
PHASE_KINDS = ("", IN_WALL, LAUNCHER)


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    ranks: str
    description: str
    # The results table's column ("": the metric's own name; None: kept in the run's record only), holding the
    # record's value divided by `scale`.
    column: str | None = ""
    scale: float = 1.0
    scope: str = ANY_DEVICE
    # A rate: the total it is the rate of, per `over` (a time: `MEASURED_TIME` unless said) and per `per` of its unit.
    rate_of: str = ""
    per: float = 1.0
    over: str = MEASURED_TIME
    # A `TOTAL` or `PER_TOKEN` figure: the total it is made of (per `per` of its unit, or per `MEASURED_TOKENS`).
    total_of: str = ""
    # A phase of the run's timeline (`IN_WALL` or `LAUNCHER`; "": not a phase), in seconds.
    phase: str = ""

    def __post_init__(self) -> None:
        if self.ranks not in MERGES or self.scope not in SCOPES:
            raise ValueError(f"metric {self.name}: merge {self.ranks!r} or scope {self.scope!r} is not one of theirs")
        if self.phase not in PHASE_KINDS or (self.phase and self.unit != "s"):
            raise ValueError(f"metric {self.name}: a phase is {IN_WALL!r} or {LAUNCHER!r}, in seconds")
        if bool(self.total_of) != (self.ranks in (TOTAL, PER_TOKEN)):
            raise ValueError(f"metric {self.name}: a {TOTAL} or {PER_TOKEN} figure names its total, and only it")
        if self.column == "":
            object.__setattr__(self, "column", self.name)

    @property
    def column_unit(self) -> str:
        """The unit of the results table's column."""
        return "GiB" if self.scale == GIB else self.unit


def _bytes(name: str, ranks: str, description: str, column: str, scope: str = CUDA) -> Metric:
    """A memory figure: bytes in the record, GiB in the results table."""
    return Metric(name, "bytes", ranks, description, column, GIB, scope)


def _phase(name: str, description: str, ranks: str = MAX, kind: str = IN_WALL, scope: str = ANY_DEVICE) -> Metric:
    """A phase of the run's timeline, in the order it happens. On several GPUs the slowest rank's (`MAX`): the
    ranks wait for each other, so the slowest one's phase is what the run spent."""
    return Metric(name, "s", ranks, description, scope=scope, phase=kind)


_TIMELINE = (
    _phase(
        "store_s",
        "the launcher's results-store lookup before the run (its save after is not counted: the record is saved as "
        "it is)",
        kind=LAUNCHER,
    ),
    _phase(
        "startup_s",
        "from the launcher starting the child to the worker's main: process start, the interpreter and the worker "
        "module's imports",
    ),
    _phase("imports_s", "the worker's imports: torch, the package's modules and the backend's module"),
    _phase(
        "model_init_s",
        "tokenizer and model loaded (or built, seeded) on the device, the arm applied (SwitchBack, Liger, float8, "
        "the compile wrapper) and LoRA's adapters",
    ),
    _phase(
        "data_s",
        "the dataset loaded, tokenized, packed and batched, the held-out examples tokenized (the Trainer backends: "
        "the Trainer's construction, which tokenizes, included)",
    ),
    _phase(
        "setup_s",
        "from the data ready to the first step, the held-out evaluation before it excluded: the optimizer and "
        "scheduler built (the Trainer backends: the Trainer's own preparation)",
    ),
    _phase("timed_steps_s", "wall time of the measured steps (the slowest rank's)"),
    _phase(
        "shape_probes_s",
        "the new-shape probes after the timed steps (`new_shape_probes`): one step at each length probed",
        scope=SHAPE_PROBING,
    ),
    _phase("profile_s", "the profiled steps after the timed ones (`profile`)"),
    _phase(
        "teardown_s",
        "from the end of training to the result written: the summary, steps.csv and result.json",
    ),
    _phase(
        "exit_s",
        "from the result written to the child's exit (interpreter and device shutdown), seen by the launcher",
    ),
)
_TABLE = (
    Metric("steps_measured", "steps", RANK0, "optimizer steps timed (warm-up and recovering steps excluded)"),
    Metric("steps_warmup", "steps", RANK0, "optimizer steps left out of the timing", None),
    _phase("warmup_time_s", "wall time of the warm-up steps", RANK0),
    Metric(MEASURED_TIME, "s", RANK_ONLY, "wall time of the measured steps", None),
    Metric("measured_tokens", "tokens", RANK_ONLY, "non-padding tokens of the measured steps", None),
    Metric("measured_padded_tokens", "tokens", RANK_ONLY, "tokens of the measured steps, padding included", None),
    Metric("measured_model_flops", "FLOPs", RANK_ONLY, "model FLOPs of the measured steps", None),
    Metric(
        "measured_energy_j",
        "J",
        RANK_ONLY,
        "GPU energy of the measured steps (NVML's total-energy counter)",
        None,
        scope=ENERGY_COUNTER,
    ),
    Metric("tokens_per_second", "tokens/s", SUM, "non-padding tokens per second", rate_of="measured_tokens"),
    Metric(
        "padded_tokens_per_second",
        "tokens/s",
        SUM,
        "tokens per second, padding included",
        rate_of="measured_padded_tokens",
    ),
    Metric("padding_fraction", "fraction", DERIVED, "share of the measured tokens that are padding"),
    Metric(
        STEADY_TIME,
        "s",
        RANK_ONLY,
        "the measured steps' expected times summed: each step's time at the rate of the steps that met no new batch "
        "shape (`measuring.steady_state`)",
        None,
        scope=STEADY_STATE,
    ),
    Metric(
        "steady_tokens_per_second",
        "tokens/s",
        SUM,
        "non-padding tokens per second at the steady state: the measured steps' tokens over their expected times "
        "(from the steps that met no new batch shape), which no single slow step moves",
        rate_of="measured_tokens",
        over=STEADY_TIME,
        scope=STEADY_STATE,
    ),
    Metric(
        "timing_skew",
        "fraction",
        DERIVED,
        "steady-state over all-steps throughput, less 1: how much new batch shapes and slow steps lowered the "
        "all-steps figure",
        scope=STEADY_STATE,
    ),
    Metric("steady_steps", "steps", RANK0, "measured steps whose batch shapes every rank had already met"),
    Metric("new_shape_steps", "steps", RANK0, "measured steps in which some rank met a batch shape for the first time"),
    Metric(
        "new_shape_cost_s",
        "s",
        RANK0,
        "what the measured steps that met a new batch shape took beyond their expected time",
        scope=STEADY_STATE,
    ),
    Metric("distinct_batch_shapes", "shapes", MAX, "batch shapes the run fed, warm-up included (the largest rank's)"),
    Metric(
        "outlier_steps",
        "steps",
        RANK0,
        "measured steps slower than 1.5 × their expected time (`steady_state.OUTLIER_FACTOR`), described in "
        "the run's details",
        scope=STEADY_STATE,
    ),
    Metric(
        "slowest_step_ratio",
        "×",
        RANK0,
        "the slowest measured step's time over its expected time",
        scope=STEADY_STATE,
    ),
    Metric(
        "triton_compiles",
        "kernels",
        RANK0,
        "Triton kernels compiled in the measured steps (a new specialisation of a kernel's arguments; each step "
        "counts the rank that compiled most), named in the outlier steps' description and in steps.csv",
        scope=TRITON_HOOKS,
    ),
    Metric(
        "triton_compile_s",
        "s",
        RANK0,
        "time spent compiling Triton kernels in the measured steps, an autotuner's benchmarking not included (each "
        "step: the rank that spent most)",
        scope=TRITON_HOOKS,
    ),
    Metric("step_time_median_s", "s", RANK0, "median measured step time"),
    Metric("step_time_min_s", "s", RANK0, "shortest measured step"),
    Metric("step_time_max_s", "s", RANK0, "longest measured step"),
    Metric("tokens_per_second_median_step", "tokens/s", RANK_ONLY, "non-padding tokens per second of the median step"),
    Metric("tokens_per_second_per_gpu", "tokens/s", DERIVED, "the run's throughput per GPU", scope=SEVERAL_GPUS),
    Metric("model_flops_per_token", "FLOPs", RANK0, "model FLOPs of a measured token (see `model_flops_formula`)"),
    Metric("achieved_tflops", "TFLOP/s", SUM, "model FLOPs per second", rate_of="measured_model_flops", per=1e12),
    Metric("mfu", "fraction", DERIVED, "model FLOPs utilization: achieved over the GPU's peak", scope=CUDA),
    Metric(
        "energy_per_token_j",
        "J/token",
        PER_TOKEN,
        "GPU energy per non-padding token of the measured steps, every GPU's",
        scope=ENERGY_COUNTER,
        total_of="measured_energy_j",
    ),
    Metric(
        "energy_kwh",
        "kWh",
        TOTAL,
        "GPU energy of the measured steps, every GPU's",
        scope=ENERGY_COUNTER,
        total_of="measured_energy_j",
        per=JOULES_PER_KWH,
    ),
    _bytes("peak_allocated_bytes", MAX, "peak memory held by tensors (the allocator)", "peak_allocated_gib"),
    _bytes("peak_reserved_bytes", MAX, "peak memory reserved by the caching allocator", "peak_reserved_gib"),
    *(
        _bytes(
            f"peak_{kind}_{phase}_bytes",
            MAX,
            f"peak memory {what} during the {described} (the largest rank's)",
            f"peak_{kind}_{phase}_gib",
        )
        for phase, described in MEMORY_PHASES.items()
        for kind, what in (("allocated", "held by tensors"), ("reserved", "reserved by the caching allocator"))
    ),
    _bytes(
        "peak_allocated_bytes_spread",
        DERIVED,
        "largest less smallest rank's peak allocated",
        "peak_allocated_spread_gib",
        SEVERAL_GPUS,
    ),
    _bytes(
        "peak_reserved_bytes_spread",
        DERIVED,
        "largest less smallest rank's peak reserved",
        "peak_reserved_spread_gib",
        SEVERAL_GPUS,
    ),
    _bytes(
        "nvml_rank_peak_bytes",
        MAX,
        "the largest rank's GPU memory peak as the driver sees it",
        "nvml_rank_peak_gib",
        SEVERAL_GPUS,
    ),
    _bytes(
        "nvml_rank_peak_bytes_spread",
        DERIVED,
        "largest less smallest rank's driver-side peak",
        "nvml_rank_peak_spread_gib",
        SEVERAL_GPUS,
    ),
    _bytes(
        "before_training_allocated_bytes",
        RANK0,
        "memory held by tensors before the first step",
        "before_training_allocated_gib",
    ),
    _bytes(
        "before_training_reserved_bytes", RANK0, "memory reserved before the first step", "before_training_reserved_gib"
    ),
    _bytes(
        "process_peak_rss_bytes",
        RANK_ONLY,
        "the training process's peak host memory",
        "process_peak_rss_gib",
        ANY_DEVICE,
    ),
    _bytes(
        "nvml_process_peak_bytes",
        RANK_ONLY,
        "the process's GPU memory peak as the driver sees it",
        "nvml_process_peak_gib",
    ),
    _bytes(
        "nvml_device_used_peak_bytes",
        RANK_ONLY,
        "the GPU's used memory peak (where processes are hidden)",
        "nvml_device_used_peak_gib",
    ),
    _bytes(
        "outside_allocator_peak_bytes",
        MAX,
        "GPU memory outside torch's allocator at its most: the driver's figure less the allocator's reserve at the"
        " same moment (CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers)",
        "outside_allocator_peak_gib",
    ),
    _bytes(
        "outside_allocator_peak_bytes_spread",
        DERIVED,
        "largest less smallest rank's memory outside the allocator",
        "outside_allocator_peak_spread_gib",
        SEVERAL_GPUS,
    ),
    Metric("final_loss", "nats", RANK0, "training loss of the last logged step"),
    Metric("initial_eval_loss", "nats", RANK0, "held-out loss before the first step"),
    Metric("final_eval_loss", "nats", RANK0, "held-out loss after the last evaluation"),
    Metric("final_eval_perplexity", "perplexity", RANK0, "exp of the final held-out loss"),
    _phase("eval_time_s", "wall time of the held-out evaluations (outside the steps)", RANK0),
    Metric("eval_tokens", "tokens", RANK0, "tokens the held-out evaluations took", None),
    Metric("world_size", "GPUs", DERIVED, "GPUs the run trained on", None, scope=SEVERAL_GPUS),
    *_TIMELINE,
)
METRICS: dict[str, Metric] = {metric.name: metric for metric in _TABLE}
# The timeline's phases in the order a run goes through them: the launcher's store lookup, the child's phases, the
# launcher's results-store lookup first.
TIMELINE: tuple[Metric, ...] = tuple(
    METRICS[name]
    for name in (
        "store_s",
        "startup_s",
        "imports_s",
        "model_init_s",
        "data_s",
        "setup_s",
        "warmup_time_s",
        "timed_steps_s",
        "eval_time_s",
        "shape_probes_s",
        "profile_s",
        "teardown_s",
        "exit_s",
    )
)
# The times a rate is over; a run on several GPUs takes each as its slowest rank's.
TIME_BASES = tuple(dict.fromkeys(metric.over for metric in _TABLE))
# What each rank files for the rank merge: the times and the totals of the rates and of the other figures.
TOTALS = tuple(
    dict.fromkeys(
        (*TIME_BASES, *(metric.rate_of or metric.total_of for metric in _TABLE if metric.rate_of or metric.total_of))
    )
)


def throughput(totals: dict[str, float], time_s: float) -> dict[str, float]:
    """The rates over `time_s` (or over their own time base among the totals: `Metric.over`) of the totals present,
    the `TOTAL` and `PER_TOKEN` figures of the totals present (per token: over `MEASURED_TOKENS`, when there is one),
    the padding fraction when both token counts are, and the timing skew when both throughputs are."""
    times = {**totals, MEASURED_TIME: time_s}
    out = {
        m.name: totals[m.rate_of] / times[m.over] / m.per
        for m in _TABLE
        if m.rate_of and m.rate_of in totals and times.get(m.over)
    }
    for m in _TABLE:
        if m.ranks == TOTAL and m.total_of in totals:
            out[m.name] = totals[m.total_of] / m.per
        elif m.ranks == PER_TOKEN and m.total_of in totals and totals.get(MEASURED_TOKENS):
            out[m.name] = totals[m.total_of] / totals[MEASURED_TOKENS]
    if "measured_tokens" in totals and "measured_padded_tokens" in totals:
        padded = totals["measured_padded_tokens"]
        out["padding_fraction"] = 1 - totals["measured_tokens"] / padded if padded else 0.0
    if out.get("tokens_per_second") and "steady_tokens_per_second" in out:
        out["timing_skew"] = out["steady_tokens_per_second"] / out["tokens_per_second"] - 1
    return out
