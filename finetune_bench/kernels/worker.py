"""Child-process entry point: one kernel's whole sweep, every point a row of `rows.jsonl` written as it ends.

    python -m finetune_bench.kernels.worker --settings S.json --kernel rms_norm --out DIR

A point that runs out of memory is a row with status `oom` (the sweep goes on); any other failure of a point is
a row with status `error` and the exception. Rows are flushed one by one: a crash or a timeout keeps every row
written before it.
"""

import argparse
import dataclasses
import gc
import json
import sys
import time
from pathlib import Path

from finetune_bench.kernels.settings import KERNELS, METRICS, KernelBenchmarkSettings, model_shapes, providers
from finetune_bench.results.record import ERROR, OK, OOM, says_out_of_memory
from finetune_bench.running.worker import die_with_parent

ROWS_FILE = "rows.jsonl"
X_LABELS = {"T": "sequence length", "BT": "total tokens"}


def point_rows(settings: KernelBenchmarkSettings, kernel: str, provider: str, tokens: int, context: dict) -> list[dict]:
    """The rows of every mode and metric of one point (no figures yet)."""
    x_name = KERNELS[kernel]
    return [
        {
            "kernel_name": kernel,
            "kernel_provider": provider,
            "kernel_operation_mode": mode,
            "metric_name": metric,
            "metric_unit": unit,
            "x_name": x_name,
            "x_label": X_LABELS[x_name],
            "x_value": tokens,
            "y_value_50": None,
            "y_value_20": None,
            "y_value_80": None,
            **context,
            "status": OK,
            "reason": "",
        }
        for mode in settings.modes
        for metric, unit in METRICS.items()
    ]


def run_kernel(settings: KernelBenchmarkSettings, kernel: str, out: Path) -> None:
    import liger_kernel
    import torch

    from finetune_bench.kernels.catalog import build_case
    from finetune_bench.kernels.measure import memory_mb, speed_ms
    from finetune_bench.measuring.environment import environment
    from finetune_bench.running.backends.common import resolve_device

    device = resolve_device(settings.device)
    if device.type == "cpu":
        from finetune_bench.running.triton_cpu import install_interpreter_shims

        install_interpreter_shims()
    dtype = getattr(torch, settings.dtype)
    shapes = model_shapes(settings.model)
    env = environment(device)
    context = {
        "extra_benchmark_config_str": json.dumps(
            {"model": settings.model, **shapes, "dtype": f"torch.{settings.dtype}"}
        ),
        "gpu_name": env.get("gpu_name", "") or "cpu",
        "liger_version": getattr(liger_kernel, "__version__", "") or env.get("liger-kernel", ""),
        "device": str(device),
        # the lockfile the software was installed from (`measuring.environment.lock_digest`)
        "lock_sha256": env.get("lock_sha256", ""),
    }
    with open(out / ROWS_FILE, "a") as rows_file:
        for provider in providers(kernel, settings.compile_reference):
            for tokens in settings.tokens:
                # when the point was measured (UTC, as a benchmark run's `measured_at`)
                measured_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                rows = point_rows(settings, kernel, provider, tokens, {**context, "measured_at": measured_at})
                try:
                    case = build_case(kernel, provider, shapes, tokens, dtype, device)
                    for row in rows:
                        mode = row["kernel_operation_mode"]
                        if row["metric_name"] == "speed":
                            figures = speed_ms(case, mode, device, settings.warmup_ms, settings.rep_ms)
                        else:
                            figures = memory_mb(case, mode, device)
                        if figures is None:
                            row["reason"] = "no memory figure on a CPU"
                        else:
                            row.update(y_value_50=figures[0], y_value_20=figures[1], y_value_80=figures[2])
                except torch.OutOfMemoryError as exc:
                    _mark_unfinished(rows, OOM, f"out of memory: {_first_line(exc)}")
                except Exception as exc:  # a point's failure is its row; the sweep goes on
                    if says_out_of_memory(str(exc)):  # cuBLAS unable to allocate: a RuntimeError
                        _mark_unfinished(rows, OOM, f"out of memory: {_first_line(exc)}")
                    else:
                        _mark_unfinished(rows, ERROR, f"{type(exc).__name__}: {_first_line(exc)}")
                finally:
                    case = None
                    gc.collect()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                for row in rows:
                    rows_file.write(json.dumps(row) + "\n")
                rows_file.flush()


def _mark_unfinished(rows: list[dict], status: str, reason: str) -> None:
    """Rows without figures get `status` (the ones measured before the failure keep theirs)."""
    for row in rows:
        if row["y_value_50"] is None and not row["reason"]:
            row.update(status=status, reason=reason)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--settings", type=Path, required=True)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--out", type=Path, required=True)
    opts = parser.parse_args(argv)
    die_with_parent()
    settings = KernelBenchmarkSettings(**json.loads(opts.settings.read_text()))
    run_kernel(settings, opts.kernel, opts.out)
    return 0


def settings_json(settings: KernelBenchmarkSettings) -> str:
    return json.dumps(dataclasses.asdict(settings))


if __name__ == "__main__":
    sys.exit(main())
