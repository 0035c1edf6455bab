"""Child-process entry point: train one condition and write `result.json` and `steps.csv`.

Run as `python -m finetune_bench.running.worker --condition C.json --dataset-dir D --model-dir M --out O`.
Every ending the child can catch is written as a result (ok, oom, error); endings it cannot catch
(a signal, a hang) are classified by the launcher.
"""

import argparse
import atexit
import dataclasses
import importlib
import json
import os
import re
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from finetune_bench.measuring.metrics import ENERGY_UNAVAILABLE
from finetune_bench.measuring.steady_state import ROW_LENGTHS
from finetune_bench.results.record import ERROR, NONFINITE, OK, OOM, says_out_of_memory
from finetune_bench.running import faults

RESULT_FILE = "result.json"
STEPS_FILE = "steps.csv"
ERROR_TAIL_LINES = 40
# The launcher's process id: the worker dies with it (a run never outlives what started it).
PARENT_PID_ENV = "FINETUNE_BENCH_PARENT_PID"
# One rank of a run on several GPUs: how long its collectives may wait before they raise. Its supervisor sets it
# longer than the condition's timeout, so that a rank that hangs ends the run as a timeout of its own (its
# supervisor's), not as its peers' collective errors.
COLLECTIVE_TIMEOUT_ENV = "FINETUNE_BENCH_COLLECTIVE_TIMEOUT_S"
# One of several runs in one launch (a memory-frontier search's probes): the launch store's namespace of this run's
# process group, whose keys would otherwise meet those of the runs before it.
PROCESS_GROUP_NAMESPACE_ENV = "FINETUNE_BENCH_PROCESS_GROUP_NAMESPACE"
# The launcher's monotonic clock (time.monotonic, one clock for every process of the machine) when it started this
# process: the run's `startup_s` ends at the worker's main.
LAUNCHED_AT_ENV = "FINETUNE_BENCH_LAUNCHED_AT"
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass
class ChildOutcome:
    """What the child writes for its launcher (`RESULT_FILE`): how the run ended and what it measured. The
    launcher takes every field but `LAUNCHER_ONLY` as the run result's field of the same name."""

    status: str
    reason: str = ""
    error_tail: str = ""
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    environment: dict[str, str] = dataclasses.field(default_factory=dict)
    details: dict[str, str] = dataclasses.field(default_factory=dict)
    liger_patches: dict[str, int] = dataclasses.field(default_factory=dict)
    loss_path: str = ""
    # The child's monotonic clock as it wrote this record: the launcher's `exit_s` runs from there to the child's
    # exit (0: not known).
    written_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "ChildOutcome":
        """The outcome written by `to_json`; a record with a key this class does not define, or without one it
        does, is refused (ValueError naming them): the worker and its launcher disagree."""
        record = json.loads(text)
        names = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(record) - set(names))
        missing = [name for name in names if name not in record]
        problems = [
            f"{what} keys: {', '.join(keys)}" for what, keys in (("unknown", unknown), ("missing", missing)) if keys
        ]
        if problems:
            raise ValueError(f"the child's {RESULT_FILE} does not match its launcher's record: {'; '.join(problems)}")
        return cls(**record)


# The fields of the outcome that are the launcher's to read, not the run result's.
LAUNCHER_ONLY = ("written_at",)


def startup_seconds(environ: dict[str, str], now: float) -> float | None:
    """The run's `startup_s`: from the launcher's start of this process (`LAUNCHED_AT_ENV`) to `now` (monotonic);
    None when the launcher left no stamp, or one this process cannot have come after (not the launcher's clock)."""
    try:
        launched = float(environ[LAUNCHED_AT_ENV])
    except (KeyError, ValueError):
        return None
    return now - launched if 0 <= now - launched < 86400 else None


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the launcher dies, however it dies (SIGKILL included); exit
    at once if it is already gone. A no-op elsewhere, and when not started by the launcher."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(parent):  # the launcher died before the request took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    main_at = time.monotonic()
    parser = argparse.ArgumentParser()
    parser.add_argument("--condition", type=Path, required=True)
    parser.add_argument("--dataset-dir", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    opts = parser.parse_args(argv)
    die_with_parent()
    faults.maybe_inject(0)

    import torch

    from finetune_bench.inputs.arms import parse_arm
    from finetune_bench.inputs.settings import TrainingArgs
    from finetune_bench.measuring.environment import environment
    from finetune_bench.measuring.steps import NonFiniteLoss, StepRecorder
    from finetune_bench.running.allocator import MemoryCapAboveGpu, alloc_conf, cap_memory, check_allocator
    from finetune_bench.running.backends.common import (
        AttentionNotRunnable,
        attention_details,
        pinned_attention,
        resolve_device,
        resolve_dtype,
        set_cudnn_any_length,
    )
    from finetune_bench.running.liger_patching import LigerNotApplied
    from finetune_bench.sources import software

    imports_s = time.monotonic() - main_at
    args = TrainingArgs(**json.loads(opts.condition.read_text()))
    device = resolve_device(args.device)
    distributed = args.world_size > 1  # one rank of a run on several GPUs (`running.ranks`)
    if distributed:
        from finetune_bench.running import distributed as ranks

        device = ranks.rank_device(device)
    dtype = resolve_dtype(args.dtype, device)
    arm = parse_arm(args.arm)
    if device.type == "cpu" and arm.liger:
        from finetune_bench.running.triton_cpu import install_interpreter_shims

        install_interpreter_shims()
    recorder = StepRecorder(device=device, warmup_steps=args.timing_warmup_steps, steps_file=opts.out / STEPS_FILE)
    startup_s = startup_seconds(os.environ, main_at)
    if startup_s is not None:
        recorder.phases["startup_s"] = startup_s
    recorder.phases["imports_s"] = imports_s
    outcome = ChildOutcome(
        status=OK,
        details={
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            **attention_details(args.attention),
            # the CUDA allocator's options this process started with ("" when none)
            "alloc_conf": alloc_conf(os.environ),
            # when the run was measured (UTC): a run reused from the results store says when it was measured
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
        environment=environment(device),
    )
    teardown_from: float | None = None
    try:
        check_allocator(args.allocator, os.environ)
        outcome.details["cudnn_any_length"] = set_cudnn_any_length(args.cudnn_any_length, os.environ)
        if args.gpu_memory_cap_gib and device.type == "cuda":  # a GPU of another size, emulated
            fraction = cap_memory(device, args.gpu_memory_cap_gib)
            outcome.environment["gpu_memory_cap_gib"] = f"{args.gpu_memory_cap_gib:g}"
            outcome.details["gpu_memory_fraction"] = f"{fraction:.4f}"
        if args.software_set:  # the releases the set names are the ones this process imports, else no run
            outcome.details["imported_versions"] = json.dumps(software.check_imported(args.software_set))
        faults.check_fake_memory(args.per_device_train_batch_size, args.max_seq_length, arm.liger)
        if distributed:
            ranks.start_process_group(
                device,
                float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, 1800)),
                os.environ.get(PROCESS_GROUP_NAMESPACE_ENV, ""),
            )
        with recorder.phase("imports_s"):
            backend = importlib.import_module(f"finetune_bench.running.backends.{args.backend}")
        with pinned_attention(args.attention, device, dtype):  # the backward passes and evaluations too
            extra = backend.train(args, opts.dataset_dir, opts.model_dir, device, dtype, recorder, opts.out)
        teardown_from = time.perf_counter()
        if distributed:
            ranks.end_process_group()
        outcome.liger_patches = extra.pop("liger_patches", {})
        outcome.loss_path = extra.pop("loss_path", "")
        outcome.details.update({k: str(v) for k, v in extra.items()})
    except torch.OutOfMemoryError as exc:
        outcome.status, outcome.reason = OOM, _out_of_memory(recorder, exc)
        outcome.error_tail = _tail(traceback.format_exc())
    except NonFiniteLoss as exc:
        outcome.status, outcome.reason = NONFINITE, f"non-finite loss: {exc}"
        outcome.error_tail = _tail(traceback.format_exc())
    except MemoryCapAboveGpu as exc:
        outcome.status, outcome.reason = ERROR, str(exc)
    except LigerNotApplied as exc:
        outcome.status, outcome.reason = ERROR, f"liger not applied: {exc}"
    except AttentionNotRunnable as exc:
        outcome.status, outcome.reason = ERROR, _first_line(exc)
        outcome.error_tail = _tail(traceback.format_exc())
    except Exception as exc:  # any other failure of this condition is its result, not a crash
        if says_out_of_memory(str(exc)):  # e.g. cuBLAS unable to allocate its handle: a RuntimeError
            outcome.status, outcome.reason = OOM, _out_of_memory(recorder, exc)
        else:
            outcome.status, outcome.reason = ERROR, f"{type(exc).__name__}: {_first_line(exc)}"
        outcome.error_tail = _tail(traceback.format_exc())
    if teardown_from is None:  # ended by an exception: the teardown starts with its handling
        teardown_from = time.perf_counter()
    recorder.end_training()
    outcome.metrics = recorder.summary(gpu_name=outcome.environment.get("gpu_name", ""))
    outcome.details["steps_completed"] = str(len(recorder.steps))
    if recorder.eval_error:  # the evaluations stopped; the run's training is measured all the same
        outcome.details["eval_error"] = recorder.eval_error
    if recorder.energy_unavailable:  # no energy figures: why (a CPU, a GPU without NVML's counter, an NVML error)
        outcome.details[ENERGY_UNAVAILABLE] = recorder.energy_unavailable
    # which FLOPs count model_flops_per_token / achieved_tflops / mfu used (training, LoRA or forward only)
    outcome.details["model_flops_formula"] = recorder.flops_formula
    if recorder.row_length_histogram:  # the rows its batches were drawn from: the fine-tune is projected from them
        outcome.details[ROW_LENGTHS] = recorder.row_length_histogram
    if recorder.outlier_descriptions:  # the slowest measured steps against their expected time, and their shapes
        outcome.details["outlier_steps"] = "; ".join(recorder.outlier_descriptions)
    recorder.write_steps(opts.out / STEPS_FILE)  # with the last step's loss, recorded after it ended
    outcome.metrics["teardown_s"] = time.perf_counter() - teardown_from
    outcome.written_at = time.monotonic()
    (opts.out / RESULT_FILE).write_text(outcome.to_json())
    if distributed and outcome.status != OK:
        # Tearing down a process group whose peers are still in a collective can block: the result is written,
        # and the supervisor stops the other ranks.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    return 0 if outcome.status == OK else 1


def end_process(code: int) -> NoReturn:
    """End this process with `code`, its result written, without the interpreter's finalization: tearing down the
    module graph of torch, transformers and the rest took 1.3-1.6 s of every run on a CPU (its `exit_s`), and the
    device's context is freed by the driver when the process ends either way. What of the finalization matters runs
    first: the exit handlers (logging's handlers flushed, file locks released, weakref finalizers, multiprocessing's
    children joined) and stdout and stderr flushed."""
    atexit._run_exitfuncs()  # what a normal exit runs before it tears the modules down
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# The reason of a run that ran out of memory (`_out_of_memory`): its step and memory phase.
OUT_OF_MEMORY_REASON = re.compile(r"out of memory at step (?P<step>\d+) \((?P<phase>[^)]*)\)")


def _out_of_memory(recorder: "StepRecorder", exc: BaseException) -> str:  # noqa: F821
    """Where the run ran out: the step, and the memory phase (forward, loss, backward, optimizer; the set-up before
    the first step's phases, e.g. building or sharding the model), then the error's first line."""
    phase = recorder.current_memory_phase or ("set-up" if not recorder.steps else "between phases")
    return f"out of memory at step {len(recorder.steps) + 1} ({phase}): {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-ERROR_TAIL_LINES:])


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    end_process(main())
