"""Real probes: a short training run in a fresh child process, the same path as a benchmark run."""

import itertools
from pathlib import Path

from finetune_bench.frontier.search import ProbeFunction, ProbeOutcome
from finetune_bench.frontier.settings import BATCH_SIZE, SEQ_LENGTH
from finetune_bench.inputs.plan import PlannedRun, condition_id
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.results.record import RunResult
from finetune_bench.running.launch import run_in_child


def probe_outcome(result: RunResult) -> ProbeOutcome:
    """A child run's record as a probe outcome."""
    return ProbeOutcome(
        status=result.status,
        reason=result.reason,
        wall_time_s=result.wall_time_s,
        peak_reserved_bytes=result.metrics.get("peak_reserved_bytes"),
        peak_allocated_bytes=result.metrics.get("peak_allocated_bytes"),
        nvml_process_peak_bytes=result.metrics.get("nvml_process_peak_bytes"),
        process_peak_rss_bytes=result.metrics.get("process_peak_rss_bytes"),
        error_tail=result.error_tail,
        environment=dict(result.environment),
        measured_at=result.details.get("measured_at", ""),
    )


def child_probe(dataset_dir: Path, model_dir: Path, work_dir: Path, timeout_s: float) -> ProbeFunction:
    """A probe that trains in a fresh child process (`launch.run_in_child`), each under its own directory."""
    counter = itertools.count()

    def probe(training_args: TrainingArgs) -> ProbeOutcome:
        number = next(counter)
        point = {"arm": training_args.arm, BATCH_SIZE: training_args.per_device_train_batch_size}
        point[SEQ_LENGTH] = training_args.max_seq_length
        run = PlannedRun(
            condition_id=condition_id(point), run_number=number, training_args=training_args, swept_axes=[]
        )
        result = run_in_child(run, dataset_dir, model_dir, Path(work_dir) / f"probe-{number:03d}", timeout_s)
        return probe_outcome(result)

    return probe
