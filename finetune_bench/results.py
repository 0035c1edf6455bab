"""The result record of one run: plain data saying what ran, where, what came out and how it ended."""

from dataclasses import dataclass, field

from finetune_bench.spec import TrainingArgs

# nonfinite: the loss became NaN or infinite (the run stops there; its steps so far are kept).
STATUSES = ("ok", "oom", "error", "timeout", "nonfinite")
# A run the orchestrator lost (the task itself failed, so no record came back).
LOST = "lost"


@dataclass
class ConditionResult:
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
    # True when the result was taken from the results store instead of being measured again.
    reused: bool = False
