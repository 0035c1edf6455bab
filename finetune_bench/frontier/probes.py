"""Real probes: a short training run in a fresh child process, the same path as a benchmark run (on several GPUs,
one run over every rank of the launch: `frontier.ranks`)."""

import itertools
from pathlib import Path

from finetune_bench.frontier.search import ProbeFunction, ProbeOutcome
from finetune_bench.frontier.settings import BATCH_SIZE, SEQ_LENGTH
from finetune_bench.inputs.plan import PlannedRun, condition_id
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.results.record import RunResult
from finetune_bench.running.launch import run_in_child
from finetune_bench.running.ranks import FAILED_RANK
from finetune_bench.running.worker import OUT_OF_MEMORY_REASON


def probe_run(training_args: TrainingArgs, number: int) -> PlannedRun:
    """The planned run of a search's probe number `number`."""
    point = {"arm": training_args.arm, BATCH_SIZE: training_args.per_device_train_batch_size}
    point[SEQ_LENGTH] = training_args.max_seq_length
    return PlannedRun(condition_id=condition_id(point), run_number=number, training_args=training_args, swept_axes=[])


def probe_outcome(result: RunResult) -> ProbeOutcome:
    """A child run's record (one GPU's, or the merged record of a run's ranks) as a probe outcome."""
    failed = result.details.get(FAILED_RANK)
    failed_rank = int(failed) if failed is not None else None
    summary = next((r for r in result.ranks if r.rank == failed_rank), None)
    phase = OUT_OF_MEMORY_REASON.search(result.reason)
    return ProbeOutcome(
        status=result.status,
        reason=result.reason,
        wall_time_s=result.wall_time_s,
        peak_reserved_bytes=result.metrics.get("peak_reserved_bytes"),
        peak_allocated_bytes=result.metrics.get("peak_allocated_bytes"),
        nvml_process_peak_bytes=result.metrics.get("nvml_process_peak_bytes"),
        outside_allocator_peak_bytes=result.metrics.get("outside_allocator_peak_bytes"),
        process_peak_rss_bytes=result.metrics.get("process_peak_rss_bytes"),
        error_tail=result.error_tail,
        environment=dict(result.environment),
        measured_at=result.details.get("measured_at", ""),
        failed_rank=failed_rank,
        failed_phase=phase.group("phase") if phase else "",
        failed_rank_peak_reserved_bytes=summary.peak_reserved_bytes if summary is not None else None,
    )


def child_probe(dataset_dir: Path, model_dir: Path, work_dir: Path, timeout_s: float) -> ProbeFunction:
    """A probe that trains in a fresh child process (`launch.run_in_child`), each under its own directory."""
    counter = itertools.count()

    def probe(training_args: TrainingArgs) -> ProbeOutcome:
        number = next(counter)
        run = probe_run(training_args, number)
        result = run_in_child(run, dataset_dir, model_dir, Path(work_dir) / f"probe-{number:03d}", timeout_s)
        return probe_outcome(result)

    return probe
