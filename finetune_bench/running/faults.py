"""Test-only fault injection into a training child process.

Set `FINETUNE_BENCH_FAULT=<kind>@<step>[:<pattern>]` in the environment: at `<step>` (0 = at
start-up, before any heavy import; k = right after optimizer step k) the child fails the way `<kind>`
says. `<pattern>` (shell-style, matched against `<condition_id>#<run_number>`, e.g.
`*per_device_train_batch_size=2*#1`) limits the fault to the runs it matches; several faults are
separated by `;` (the first that matches a run applies to it).

- `oom`: raises torch.OutOfMemoryError (what a CUDA out-of-memory looks like to the trainer)
- `cublas_oom`: raises the RuntimeError torch raises when cuBLAS cannot allocate its handle (an out-of-memory
  that is not a torch.OutOfMemoryError)
- `error`: raises RuntimeError
- `exit`: exits with status 3 without writing a result
- `segfault`: kills itself with SIGSEGV
- `sigkill`: kills itself with SIGKILL (as the host's OOM killer would)
- `hang`: sleeps forever (the launcher's timeout must end it)
- `nan`: fills the model's weights with NaN, so the next step's loss is NaN (the recorder must stop it)
- `interrupt`: kills the process that launched the run, then exits (a grid interrupted part-way)

A second switch, `FINETUNE_BENCH_FAKE_MEMORY_TOKENS=<N>`, is a fake memory model for tests of the
memory-frontier search: a run whose `per_device_train_batch_size × max_seq_length` (doubled for a
baseline arm, which holds the logits) exceeds N runs out of memory at its first step.

Never set in production. A run made while either is set is never kept in the results store, and a stored result
that one made (an injected fault or the fake memory model named in its reason or error) is never reused
(`switches_on`, `made_under_a_test_switch`).
"""

import fnmatch
import os
import re
import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FAULT_ENV = "FINETUNE_BENCH_FAULT"
# Set by the launcher in each child: which run it is (`<condition_id>#<run_number>`).
RUN_ENV = "FINETUNE_BENCH_RUN"
# Set by the launcher in each child: the launching process's id (the `interrupt` fault's target; a child forked by the
# fork server has its keeper as parent, `running.forkserver`).
LAUNCHER_PID_ENV = "FINETUNE_BENCH_LAUNCHER_PID"
FAULT_KINDS = ("oom", "cublas_oom", "error", "exit", "segfault", "sigkill", "hang", "nan", "interrupt")
FAKE_MEMORY_ENV = "FINETUNE_BENCH_FAKE_MEMORY_TOKENS"
# What a result made under one says (`maybe_inject`'s and `check_fake_memory`'s messages).
_SWITCH_MARKS = re.compile(r"injected at step|injected error|fake memory model")


def switches_on(run: str, ranks: int = 0) -> list[str]:
    """The test-only switches that act on the run `<condition_id>#<run_number>` (on any of its `ranks` ranks, a run on
    several GPUs): the fake memory model whenever it is set, a fault whose pattern matches the run. What a switch acts
    on is no measurement: never stored. A fault planned for other runs leaves this one a measurement (a grid
    interrupted on its last run resumes from the others)."""
    on = [FAKE_MEMORY_ENV] if os.environ.get(FAKE_MEMORY_ENV) else []
    ids = [run, *(f"{run}@rank{rank}" for rank in range(ranks))]
    if any(planned_fault(run_id) is not None for run_id in ids):
        on.append(FAULT_ENV)
    return on


def made_under_a_test_switch(reason: str, error_tail: str) -> bool:
    """Whether a result's reason or error says a test-only switch made it (a stored one is then never reused)."""
    return bool(_SWITCH_MARKS.search(reason or "") or _SWITCH_MARKS.search(error_tail or ""))


def fake_memory_cost(batch_size: int, seq_length: int, liger: bool) -> int:
    """What a run costs in the fake memory model."""
    return batch_size * seq_length * (1 if liger else 2)


def check_fake_memory(batch_size: int, seq_length: int, liger: bool) -> None:
    """Raise an out-of-memory error if the fake memory model is on and the run does not fit."""
    capacity = os.environ.get(FAKE_MEMORY_ENV)
    if capacity is None:
        return
    cost = fake_memory_cost(batch_size, seq_length, liger)
    if cost > int(capacity):
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory (fake memory model: {cost} > {capacity} token units)")


def planned_fault(run: str | None = None) -> tuple[str, int] | None:
    """The fault planned for the run `run` (`<condition_id>#<run_number>[@rank<r>]`; None: this process's run), if any:
    (kind, step)."""
    run = os.environ.get(RUN_ENV, "") if run is None else run
    for spec in filter(None, (part.strip() for part in os.environ.get(FAULT_ENV, "").split(";"))):
        kind, _, rest = spec.partition("@")
        step, _, pattern = rest.partition(":")
        if kind not in FAULT_KINDS:
            raise ValueError(f"{FAULT_ENV}={spec!r}: kind must be one of {FAULT_KINDS}")
        if not pattern or fnmatch.fnmatchcase(run, pattern):
            return kind, int(step or 0)
    return None


def maybe_inject(step: int, model: "torch.nn.Module | None" = None) -> None:
    """Fail here if the planned fault is due at `step` (`model`: the model being trained, for `nan`)."""
    fault = planned_fault()
    if fault is None or fault[1] != step:
        return
    kind = fault[0]
    if kind == "nan":
        import torch

        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(float("nan"))
        return
    if kind == "oom":
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (injected at step {step})")
    if kind == "cublas_oom":
        raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    if kind == "error":
        raise RuntimeError(f"injected error at step {step}")
    if kind == "exit":
        os._exit(3)
    if kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "interrupt":
        os.kill(int(os.environ.get(LAUNCHER_PID_ENV) or os.getppid()), signal.SIGKILL)
        os._exit(4)
    if kind == "hang":
        while True:
            time.sleep(3600)
