"""Test-only fault injection into a training child process.

Set `FINETUNE_BENCH_FAULT=<kind>@<step>` in the child's environment: at `<step>` (0 = at start-up,
before any heavy import; k = right after optimizer step k) the child fails the way `<kind>` says:

- `oom`: raises torch.OutOfMemoryError (what a CUDA out-of-memory looks like to the trainer)
- `error`: raises RuntimeError
- `exit`: exits with status 3 without writing a result
- `segfault`: kills itself with SIGSEGV
- `sigkill`: kills itself with SIGKILL (as the host's OOM killer would)
- `hang`: sleeps forever (the launcher's timeout must end it)

Never set in production; nothing else reads it.
"""

import os
import signal
import time

FAULT_ENV = "FINETUNE_BENCH_FAULT"
FAULT_KINDS = ("oom", "error", "exit", "segfault", "sigkill", "hang")


def planned_fault() -> tuple[str, int] | None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    kind, _, step = spec.partition("@")
    if kind not in FAULT_KINDS:
        raise ValueError(f"{FAULT_ENV}={spec!r}: kind must be one of {FAULT_KINDS}")
    return kind, int(step or 0)


def maybe_inject(step: int) -> None:
    """Fail here if the planned fault is due at `step`."""
    fault = planned_fault()
    if fault is None or fault[1] != step:
        return
    kind = fault[0]
    if kind == "oom":
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (injected at step {step})")
    if kind == "error":
        raise RuntimeError(f"injected error at step {step}")
    if kind == "exit":
        os._exit(3)
    if kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        while True:
            time.sleep(3600)
