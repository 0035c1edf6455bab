"""Where a frontier's out-of-memory results came from the fake memory model (`running.faults.check_fake_memory`)
rather than the device: its capacity, read from the probes' errors, and the words every part of the report that
shows such a result adds, so that a simulated frontier is never read as a measured one."""

import re

import pandas as pd

from finetune_bench.results.record import OOM

# What the fake memory model (`running.faults.check_fake_memory`) writes into an out-of-memory probe's error.
FAKE_MEMORY = re.compile(r"fake memory model(?:: \d+ > (\d+) token units)?")
SIMULATED = "simulated by the fake memory model, not measured"


def fake_memory_capacity(probes: pd.DataFrame) -> str | None:
    """Where the fake memory model ran probes out of memory (`running.faults.check_fake_memory`): its capacity in
    token units ("" where no probe's error says it); None where no probe ran out of the fake memory."""
    found = None
    for column in ("reason", "error_tail"):
        for text in probes.get(column, pd.Series(dtype=str)).dropna().astype(str):
            for capacity in (m.group(1) for m in FAKE_MEMORY.finditer(text)):
                found = capacity or found or ""
    return found


def oom_lines(probes: pd.DataFrame) -> list[str]:
    """One line per probe that ran out of memory, as a search expects some to (where its error's tail was kept: the
    probes table and the Probes tab); one the fake memory model ran out of memory is "simulated"."""
    if probes.empty:
        return []
    ooms = probes[probes["status"] == OOM]
    kind = "simulated" if fake_memory_capacity(ooms) is not None else "expected"
    return [
        f"{kind} out of memory: {row.arm}, {row.dimension} {row.value}"
        + (f" ({row.reason})" if isinstance(row.reason, str) and row.reason else "")
        for row in ooms.itertuples()
    ]
