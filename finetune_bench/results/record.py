"""The result record of one run: plain data saying what ran, where, what came out and how it ended."""

import re
from dataclasses import dataclass, field

from finetune_bench.inputs.settings import TrainingArgs

# How a run ended (`RunResult.status`), the single source of these names.
OK = "ok"
OOM = "oom"  # out of GPU (or host) memory
ERROR = "error"  # an exception, a non-zero exit or a signal; or a condition refused before it was launched
TIMEOUT = "timeout"  # killed after `condition_timeout_s`
NONFINITE = "nonfinite"  # the loss became NaN or infinite (the run stops there; its steps so far are kept)
# Not launched: the memory model predicts a sure out-of-memory on the target GPU (`skip_predicted_oom`).
PREDICTED_OOM = "predicted_oom"
STATUSES = (OK, OOM, ERROR, TIMEOUT, NONFINITE, PREDICTED_OOM)
# What an out-of-memory says when it does not come as torch.OutOfMemoryError: cuBLAS failing to allocate its
# workspace or handle, the CUDA driver's "out of memory", a child's log after it died.
_OUT_OF_MEMORY_MESSAGE = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE)


def says_out_of_memory(text: str) -> bool:
    """Whether an error message or a log tail reports an out-of-memory."""
    return bool(_OUT_OF_MEMORY_MESSAGE.search(text))


# A run the orchestrator lost (the task itself failed, so no record came back).
LOST = "lost"


# A rank killed because another rank of its condition failed first (a rank's own status, never a run's).
STOPPED = "stopped"


@dataclass
class RankSummary:
    """One rank of a run on several GPUs: where it ran, how it ended and what it measured."""

    rank: int
    node_rank: int
    local_rank: int
    host: str
    status: str
    reason: str = ""
    tokens_per_second: float | None = None
    peak_allocated_bytes: float | None = None
    peak_reserved_bytes: float | None = None
    # The driver's view of the rank's GPU memory at its peak (NVML: `nvml_process_peak_bytes`, or where the
    # container hides processes `nvml_device_used_peak_bytes`).
    nvml_peak_bytes: float | None = None


@dataclass
class RunResult:
    """One run's record: which condition and repeat, its full settings, how it ended and why, what it
    measured, where it ran, what Liger replaced and which loss ran."""

    condition_id: str
    run_number: int
    swept_axes: list[str]
    training_args: TrainingArgs
    status: str
    reason: str = ""
    error_tail: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    liger_patches: dict[str, int] = field(default_factory=dict)
    loss_path: str = ""
    wall_time_s: float = 0.0
    # Local path of the per-step CSV ("" when the run recorded no step).
    steps_file: str = ""
    # Local directory of the run's profile (`training_args.profile`: profile.csv, and trace.json and
    # memory_snapshot.pickle where they were kept); "" when it has none.
    profile_dir: str = ""
    # True when the result was taken from the results store instead of being measured again.
    reused: bool = False
    # What went wrong around the run without changing what it measured (the results store could not keep it,
    # W&B could not log it): the run stays in the results, and the grid ends with a failing status naming each.
    problems: list[str] = field(default_factory=list)
    # The memory model's peak reserved memory for this run's condition on its GPU (None: not predicted).
    predicted_peak_reserved_bytes: float | None = None
    # Its allocated bytes at each moment the memory model counts (`prediction.memory.MOMENT_PHASES`).
    predicted_moment_allocated_bytes: dict[str, float] = field(default_factory=dict)
    # Each rank of a run on several GPUs (`training_args.world_size` > 1), by rank; empty on one GPU.
    ranks: list[RankSummary] = field(default_factory=list)
