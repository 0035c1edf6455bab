"""The frontier's tables: one row per search (its frontier, the peak memory of its last fit against the GPU's, the
headroom a memory cap left above it and whether that makes the frontier borderline), every probe in the order it ran,
and each arm's frontier over the baseline's. The report shows them (`for_display`) and the frontier task exports
them as CSVs.
"""

from typing import Any

import pandas as pd

from finetune_bench.analysis.tables import GIB, hardware_label
from finetune_bench.frontier.search import (
    FOUND,
    NOTHING_FITS,
    PROBE_FAILED,
    REACHED_CAP,
    FrontierResult,
    Probe,
    frontier_probe,
)
from finetune_bench.frontier.settings import (
    BATCH_SIZE,
    SEQ_LENGTH,
    FrontierArm,
    FrontierSearch,
    arm_name,
    arm_overrides,
)
from finetune_bench.inputs.arms import BASELINE
from finetune_bench.prediction.gpus import usable_bytes
from finetune_bench.results.record import LOST

# The memory figures of a probe, and the table columns (GiB) they become.
MEMORY_COLUMNS = {
    "peak_reserved_bytes": "peak_reserved_gib",
    "peak_allocated_bytes": "peak_allocated_gib",
    "nvml_process_peak_bytes": "nvml_process_peak_gib",
    "outside_allocator_peak_bytes": "outside_allocator_gib",
    "process_peak_rss_bytes": "process_peak_rss_gib",
}


def fixed_setting(search: FrontierSearch) -> str:
    """What the search holds fixed, e.g. `max_seq_length=2048`."""
    other = SEQ_LENGTH if search.dimension == BATCH_SIZE else BATCH_SIZE
    return f"{other}={getattr(search.training_args, other)}"


def _gib(value: float | str | None) -> float | None:
    return float(value) / GIB if value not in (None, "") else None


def gpu_memory_gib(environment: dict[str, str]) -> float | None:
    """The memory of the GPU the probes ran on, in GiB: the one they emulated where `gpu_memory_cap_gib` capped it."""
    if environment.get("gpu_memory_cap_gib"):
        return float(environment["gpu_memory_cap_gib"])
    return _gib(environment.get("gpu_memory_bytes"))


def search_hardware(result: FrontierResult) -> str:
    """What a search's probes trained on (`analysis.tables.hardware_label`), from its environment record."""
    env = result.environment
    return hardware_label(env.get("device_type", ""), env.get("gpu_name", ""), env.get("gpu_memory_cap_gib", ""))


def frontier_table(searches: list[FrontierSearch], results: list[FrontierResult | None]) -> pd.DataFrame:
    """One row per search, in plan order; a search whose task was lost keeps its row (status `lost`)."""
    by_key = {(arm_name(r.search.arm), r.search.dimension): r for r in results if r is not None}
    rows = []
    for search in searches:
        result = by_key.get((arm_name(search.arm), search.dimension))
        row = {"arm": arm_name(search.arm), **arm_overrides(search.arm), "dimension": search.dimension}
        row.update(at=fixed_setting(search), start=search.start, cap=search.cap, granularity=search.granularity)
        # what the probes trained on, as the results table says it ("cpu", "gpu: <name>"; "" where unknown)
        row["hardware"] = search_hardware(result) if result is not None else ""
        if result is None:
            row.update(status=LOST, reason="the search task failed; no result came back")
            rows.append(row)
            continue
        row.update(
            status=result.status,
            frontier=result.frontier,
            predicted_frontier=result.predicted_frontier,
            first_oom=result.first_oom,
            probes_used=result.probes_used,
            device_seconds=result.device_seconds,
        )
        at_frontier = frontier_probe(result)
        if at_frontier is not None:
            row.update({column: _gib(getattr(at_frontier, key)) for key, column in MEMORY_COLUMNS.items()})
        row["gpu_memory_gib"] = gpu_memory_gib(result.environment)
        row["cap_headroom_gib"] = cap_headroom_gib(result.environment, at_frontier)
        row["reason"] = result.reason
        rows.append(row)
    table = pd.DataFrame(rows)
    integers = ("frontier", "predicted_frontier", "first_oom", "probes_used")
    for column in (*integers, "device_seconds", "gpu_memory_gib", *MEMORY_COLUMNS.values()):
        if column not in table:
            table[column] = None
    for column in integers:
        table[column] = table[column].astype("Int64")
    for column in ("device_seconds", "gpu_memory_gib", "cap_headroom_gib", *MEMORY_COLUMNS.values()):
        if column not in table:
            table[column] = None
        table[column] = table[column].astype(float)
    table["peak_reserved_share_of_gpu"] = table["peak_reserved_gib"] / table["gpu_memory_gib"]
    # measured only under a cap, with the memory outside the allocator known
    known = table["cap_headroom_gib"].notna() & table["outside_allocator_gib"].notna()
    borderline = table["cap_headroom_gib"] < table["outside_allocator_gib"]
    table["borderline"] = pd.Series(
        [bool(b) if k else None for b, k in zip(borderline, known, strict=True)], dtype=object
    )
    return table


def cap_headroom_gib(environment: dict[str, str], at_frontier: Probe | None) -> float | None:
    """Under a memory cap (`gpu_memory_cap_gib`, a smaller card emulated): what torch's cap left above the frontier's
    last fit (the cap less its peak reserve), in GiB; None without a cap or a fit. A frontier whose headroom is less
    than the memory its run held outside the allocator (`outside_allocator_gib`) is borderline: the cap allows for
    `catalog.CUDA_CONTEXT_BYTES` outside torch, and the run needed more, so on a real card of that size the fit may
    run out of memory."""
    cap = environment.get("gpu_memory_cap_gib")
    if not cap or at_frontier is None or at_frontier.peak_reserved_bytes is None:
        return None
    return (usable_bytes(float(cap) * GIB) - at_frontier.peak_reserved_bytes) / GIB


def is_borderline(flag: object) -> bool:
    """Whether a frontier's `borderline` cell is set (not False, None or NaN: unknown without a cap)."""
    return bool(pd.notna(flag) and flag)


def borderline_note(row: Any) -> str:
    """Why a frontier is borderline ("" where it is not): its headroom under the cap and the memory outside the
    allocator it lies within."""
    if not is_borderline(getattr(row, "borderline", None)):
        return ""
    return (
        f"borderline: its last fit came within {row.cap_headroom_gib:.2f} GiB of the cap, and the run held "
        f"{row.outside_allocator_gib:.2f} GiB outside torch's allocator: on a real {row.gpu_memory_gib:g} GiB card "
        "it may run out of memory"
    )


def probes_table(results: list[FrontierResult | None]) -> pd.DataFrame:
    """Every probe of every search, in the order it ran."""
    rows = []
    for result in results:
        if result is None:
            continue
        for number, probe in enumerate(result.probes, start=1):
            row = {"arm": arm_name(result.search.arm), **arm_overrides(result.search.arm)}
            row.update(dimension=result.search.dimension, at=fixed_setting(result.search))
            row.update(hardware=search_hardware(result), probe=number)
            row.update(value=probe.value, phase=probe.phase, attempt=probe.attempt, status=probe.status)
            row["wall_time_s"] = probe.wall_time_s
            row.update({column: _gib(getattr(probe, key)) for key, column in MEMORY_COLUMNS.items()})
            row.update(measured_at=probe.measured_at, reason=probe.reason, error_tail=probe.error_tail)
            rows.append(row)
    columns = ["arm", "dimension", "at", "hardware", "probe", "value", "phase", "attempt", "status", "wall_time_s"]
    table = pd.DataFrame(rows, columns=None if rows else columns)
    for column in MEMORY_COLUMNS.values():
        table[column] = table[column].astype(float) if column in table else float("nan")
    return table


def frontier_ratios(frontiers: pd.DataFrame) -> pd.DataFrame:
    """Per dimension (and setting held fixed) and per arm other than the baseline: its frontier over the
    baseline's."""
    if BASELINE not in set(frontiers["arm"]) or frontiers["arm"].nunique() < 2:
        return pd.DataFrame()
    keys = ["dimension", "at", *_other_arm_fields(frontiers)]
    base = frontiers[frontiers["arm"] == BASELINE][[*keys, "frontier", "status"]]
    others = frontiers[frontiers["arm"] != BASELINE][["arm", *keys, "frontier", "status"]]
    out = others.merge(base, on=keys, suffixes=("", "_baseline")).rename(
        columns={"frontier": "arm_frontier", "status": "arm_status", "frontier_baseline": "baseline_frontier",
                 "status_baseline": "baseline_status"}
    )  # fmt: skip
    out["ratio"] = out["arm_frontier"].astype("Float64") / out["baseline_frontier"].astype("Float64")
    out["note"] = [
        _ratio_note(arm, *statuses)
        for arm, statuses in zip(out["arm"], zip(out["arm_status"], out["baseline_status"], strict=True), strict=True)
    ]
    return out[["dimension", "at", *keys[2:], "arm", "arm_frontier", "arm_status", "baseline_frontier",
                "baseline_status", "ratio", "note"]]  # fmt: skip


def _other_arm_fields(frontiers: pd.DataFrame) -> list[str]:
    return [name for name in arm_overrides(FrontierArm()) if name != "arm" and name in frontiers]


def _ratio_note(arm_name: str, arm_status: str, baseline_status: str) -> str:
    notes = []
    for arm, status in ((arm_name, arm_status), (BASELINE, baseline_status)):
        if status == REACHED_CAP:
            notes.append(f"{arm} reached the cap (its frontier is a lower bound)")
        elif status == PROBE_FAILED:
            notes.append(f"{arm}'s search stopped on a failing probe (its frontier is a lower bound)")
        elif status == NOTHING_FITS:
            notes.append(f"nothing fits for {arm}")
        elif status != FOUND:
            notes.append(f"{arm}: {status}")
    return "; ".join(notes)


def for_display(table: pd.DataFrame) -> pd.DataFrame:
    """Nullable numeric columns (Int64, Float64) as floats, so that a missing value shows as the report's dash."""
    nullable = [
        c
        for c in table.columns
        if isinstance(table[c].dtype, pd.api.extensions.ExtensionDtype) and pd.api.types.is_numeric_dtype(table[c])
    ]
    return table.astype(dict.fromkeys(nullable, float))
