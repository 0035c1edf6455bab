"""Child-process entry point: train one condition and write `result.json` and `steps.csv`.

Run as `python -m finetune_bench.running.worker --condition C.json --dataset-dir D --model-dir M --out O`.
Every ending the child can catch is written as a result (ok, oom, error); endings it cannot catch
(a signal, a hang) are classified by the launcher.
"""

import argparse
import importlib
import json
import os
import sys
import traceback
from pathlib import Path

from finetune_bench.running import faults

RESULT_FILE = "result.json"
STEPS_FILE = "steps.csv"
ERROR_TAIL_LINES = 40


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--condition", type=Path, required=True)
    parser.add_argument("--dataset-dir", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    opts = parser.parse_args(argv)
    faults.maybe_inject(0)

    import pandas as pd
    import torch

    from finetune_bench.inputs.arms import parse_arm
    from finetune_bench.inputs.settings import TrainingArgs
    from finetune_bench.measuring.environment import environment
    from finetune_bench.measuring.steps import STEP_COLUMNS, NonFiniteLoss, StepRecorder
    from finetune_bench.running.backends.common import resolve_device, resolve_dtype
    from finetune_bench.running.liger_patching import LigerNotApplied

    args = TrainingArgs(**json.loads(opts.condition.read_text()))
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    arm = parse_arm(args.arm)
    if device.type == "cpu" and arm.liger:
        from finetune_bench.running.triton_cpu import install_interpreter_shims

        install_interpreter_shims()
    recorder = StepRecorder(device=device, warmup_steps=args.timing_warmup_steps)
    result: dict = {
        "details": {"device": str(device), "dtype": str(dtype).removeprefix("torch.")},
        "environment": environment(device),
    }
    try:
        faults.check_fake_memory(args.per_device_train_batch_size, args.max_seq_length, arm.liger)
        backend = importlib.import_module(f"finetune_bench.running.backends.{args.backend}")
        extra = backend.train(args, opts.dataset_dir, opts.model_dir, device, dtype, recorder, opts.out)
        result["status"] = "ok"
        result["liger_patches"] = extra.pop("liger_patches", {})
        result["loss_path"] = extra.pop("loss_path", "")
        result["details"].update({k: str(v) for k, v in extra.items()})
    except torch.OutOfMemoryError as exc:
        result.update(status="oom", reason=f"out of memory at step {len(recorder.steps) + 1}: {_first_line(exc)}")
        result["error_tail"] = _tail(traceback.format_exc())
    except NonFiniteLoss as exc:
        result.update(status="nonfinite", reason=f"non-finite loss: {exc}")
        result["error_tail"] = _tail(traceback.format_exc())
    except LigerNotApplied as exc:
        result.update(status="error", reason=f"liger not applied: {exc}")
    except Exception as exc:  # any other failure of this condition is its result, not a crash
        result.update(status="error", reason=f"{type(exc).__name__}: {_first_line(exc)}")
        result["error_tail"] = _tail(traceback.format_exc())
    recorder.end_training()
    result["metrics"] = recorder.summary(gpu_name=result["environment"].get("gpu_name", ""))
    result["details"]["steps_completed"] = str(len(recorder.steps))
    # which FLOPs count model_flops_per_token / achieved_tflops / mfu used (training, LoRA or forward only)
    result["details"]["model_flops_formula"] = recorder.flops_formula
    pd.DataFrame(recorder.step_rows(), columns=list(STEP_COLUMNS)).to_csv(opts.out / STEPS_FILE, index=False)
    (opts.out / RESULT_FILE).write_text(json.dumps(result, indent=2))
    return 0 if result["status"] == "ok" else 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-ERROR_TAIL_LINES:])


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
