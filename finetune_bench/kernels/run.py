"""One kernel's sweep in a child process of its own (the launcher the training runs use: a session of its own,
a timeout, nothing left behind), and its rows as a table: one row per provider × tokens × mode × metric,
whatever happened. Points the child never reached (it crashed or timed out) get rows saying so."""

import json
import sys
from pathlib import Path

import pandas as pd

from finetune_bench.kernels.settings import KernelBenchmarkSettings, providers, software_sets
from finetune_bench.kernels.worker import ROWS_FILE, point_rows, settings_json
from finetune_bench.results.record import ERROR, TIMEOUT
from finetune_bench.results.store import hardware_fingerprint
from finetune_bench.running.device_lock import device_lock
from finetune_bench.running.launch import LOG_FILE, isolated_env, run_isolated
from finetune_bench.running.triton_cpu import INTERPRETER_ENV
from finetune_bench.sources import software

TAIL_LINES = 20


def needs_interpreter(device: str) -> bool:
    """Whether Liger's kernels will run on a CPU (in the Triton interpreter)."""
    if device == "cpu":
        return True
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return False


def run_kernel_in_child(settings: KernelBenchmarkSettings, kernel: str, work_dir: Path) -> pd.DataFrame:
    """Every point of `kernel`'s sweep under each software set of `settings`, each set's in a child process of its
    own under `work_dir` (its rows' `software_set` names it)."""
    tables = []
    for index, text in enumerate(software_sets(settings)):
        rows = _run_one_set(settings, kernel, Path(work_dir) / f"set-{index}", text)
        tables.append(rows.assign(software_set=text))
    return pd.concat(tables, ignore_index=True)


def _run_one_set(settings: KernelBenchmarkSettings, kernel: str, work_dir: Path, software_set: str) -> pd.DataFrame:
    """Every point of `kernel`'s sweep, measured in a child process under `work_dir` that imports the releases of
    `software_set`."""
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / ROWS_FILE).unlink(missing_ok=True)
    settings_file = work_dir / "settings.json"
    settings_file.write_text(settings_json(settings))
    env = isolated_env()
    if needs_interpreter(settings.device):
        env.update(INTERPRETER_ENV)
    software.apply(env, software_set)
    command = [sys.executable, "-m", "finetune_bench.kernels.worker", "--settings", str(settings_file)]
    command += ["--kernel", kernel, "--out", str(work_dir)]
    with device_lock(hardware_fingerprint()):
        ending = run_isolated(command, work_dir, env, settings.timeout_s)
    rows_file = work_dir / ROWS_FILE
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    done = {(row["kernel_provider"], row["x_value"]) for row in rows}
    if ending.timed_out:
        status, reason = (
            TIMEOUT,
            f"the sweep did not finish within timeout_s {settings.timeout_s}; the child was killed",
        )
    else:
        tail = (work_dir / LOG_FILE).read_text(errors="replace").strip().splitlines()[-TAIL_LINES:]
        last = tail[-1] if tail else ""
        status, reason = ERROR, f"the child exited with status {ending.returncode} before this point: {last}"
    context = (
        {key: rows[0][key] for key in ("extra_benchmark_config_str", "gpu_name", "liger_version", "device")}
        if rows
        else {}
    )
    for provider in providers(kernel, settings.compile_reference):
        for tokens in settings.tokens:
            if (provider, tokens) not in done:
                for row in point_rows(settings, kernel, provider, tokens, context):
                    rows.append({**row, "status": status, "reason": reason})
    return pd.DataFrame(rows)
