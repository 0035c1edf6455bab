"""Cold runs: a run during whose warm-up or timed steps the kernel caches (the CUDA driver's JIT cache, Triton's)
grew by kernels compiled for its machine (`measuring.jit_cache`), the first run on a fresh machine or pod. It pays
seconds of one-time compilation (on an H200 at Llama-3.2-1B: 3-7 s more warm-up, new-length steps of 1.5-3 s;
Liger's first run about 2 s of Triton's compilations and slower steps; docs/measurements.md) that a second run on
the machine, and every later step of the fine-tune, does not.

A cold run stays in the results table and the runs list, marked `cold`. Where its condition has a run that is not
cold, it is left out of the answer (`counted` false): the medians, the intervals, the tests and the projection's
verdicts; where every ok run of the condition is cold (a fresh pod each run), they all stand, and the report says so.
"""

import pandas as pd

from finetune_bench.inputs.plan import run_name
from finetune_bench.measuring.jit_cache import COMPILING_BYTES
from finetune_bench.results.record import OK

# The results table's columns: whether a run compiled kernels for its machine, and whether it is in the answer.
COLD = "cold"
COUNTED = "counted"
RUN_KEYS = ["condition_id", "run_number"]


def cold_runs(steps: pd.DataFrame | None) -> set[tuple[str, int]]:
    """(condition_id, run_number) of each run with a warm-up or timed step that grew the JIT cache by
    `COMPILING_BYTES` or more (the steps table has every rank's most)."""
    if steps is None or steps.empty or "jit_cache_bytes" not in steps:
        return set()
    grown = pd.to_numeric(steps["jit_cache_bytes"], errors="coerce").fillna(0) >= COMPILING_BYTES
    return {(str(c), int(r)) for c, r in steps.loc[grown, RUN_KEYS].drop_duplicates().itertuples(index=False)}


def with_cold_runs(table: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """`table` (one row per run) with `COLD` and `COUNTED`: an ok cold run is not counted where an ok run of its
    condition is not cold; every other run is."""
    cold = cold_runs(steps)
    out = table.copy()
    out[COLD] = [(str(c), int(r)) in cold for c, r in zip(out["condition_id"], out["run_number"], strict=True)]
    ok = out["status"] == OK
    warm_ok = out[ok & ~out[COLD]].groupby("condition_id").size()
    has_warm = out["condition_id"].map(warm_ok).fillna(0) > 0
    out[COUNTED] = ~(ok & out[COLD] & has_warm)
    return out


def counted(table: pd.DataFrame) -> pd.DataFrame:
    """The runs of `table` in the answer (all where it has no `COUNTED` column)."""
    return table[table[COUNTED].astype(bool)] if COUNTED in table else table


def cold_note(table: pd.DataFrame) -> str:
    """What the cold runs did to the answer, in a sentence ("" when no run was cold)."""
    if COLD not in table or not table[COLD].any():
        return ""
    cold = table[table[COLD].astype(bool)]
    left_out = cold[~cold[COUNTED].astype(bool)]
    kept = cold[cold[COUNTED].astype(bool)]
    names = lambda runs: ", ".join(map(run_name, runs["condition_id"], runs["run_number"]))  # noqa: E731
    parts = []
    if len(left_out):
        parts.append(
            f"{len(left_out)} cold run(s) left out of the medians, intervals and tests (their condition has warm "
            f"runs): {names(left_out)}"
        )
    if len(kept):
        parts.append(
            f"{len(kept)} cold run(s) kept, every run of their condition being cold: {names(kept)} (a fresh machine "
            "each run: share the kernel caches between pods with CUDA_CACHE_PATH and TRITON_CACHE_DIR on a volume)"
        )
    return (
        "Cold runs (the kernel caches grew in their warm-up or timed steps: kernels compiled for the machine once, "
        "not paid again by later runs or steps): " + "; ".join(parts) + "."
    )
