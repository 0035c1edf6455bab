"""Where each arm's peak memory comes from: the peak allocated memory of each phase of a step (forward, loss,
backward, optimizer step) and of the held-out evaluations, as every run recorded them (`measuring.steps`), the phase
that sets the peak, and the arms whose saving in one phase another phase hides (at Llama-3-8B with AdamW the
optimizer step can set both arms' peak, so a leaner loss lowers nothing)."""

import pandas as pd

from finetune_bench.inputs.arms import BASELINE
from finetune_bench.measuring.metrics import MEMORY_PHASES
from finetune_bench.results.record import OK

# A saving in a phase is hidden when it exceeds the saving in the peak by more than this many GiB, or this share of
# the baseline's peak, whichever is larger.
HIDDEN_GIB = 0.5
HIDDEN_SHARE = 0.05
# The phases' columns in the results table (peak allocated memory, GiB).
PHASE_COLUMNS = {phase: f"peak_allocated_{phase}_gib" for phase in MEMORY_PHASES}
# How a sentence names each phase.
PHASE_NAMES = {
    "forward": "forward pass",
    "loss": "loss",
    "backward": "backward pass",
    "optimizer": "optimizer step",
    "evaluation": "held-out evaluation",
}


def phase_peaks(table: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """Per condition (the swept axes): the median over ok runs of each phase's peak allocated memory (GiB, only the
    phases some run recorded), the peak allocated memory, and `peak_set_by`: the phase whose peak is the largest."""
    present = {
        phase: column for phase, column in PHASE_COLUMNS.items() if column in table and table[column].notna().any()
    }
    if table.empty or not present or not swept:
        return pd.DataFrame()
    ok = table[table["status"] == OK]
    if ok.empty:
        return pd.DataFrame()
    out = ok.groupby(swept, dropna=False, sort=False)[[*present.values(), "peak_allocated_gib"]].median().reset_index()
    out = out.rename(columns={column: phase for phase, column in present.items()})
    phases = list(present)
    out["peak_set_by"] = out[phases].idxmax(axis=1, skipna=True)
    return out


def hidden_savings(peaks: pd.DataFrame, swept: list[str]) -> list[str]:
    """One sentence per arm and point of the other axes whose peak is set by a phase in which it saves nothing
    against the baseline (within the margin), while it saves more than the margin beyond its peak saving in another
    phase: that saving does not lower its peak (at Llama-3-8B with AdamW, the optimizer step's)."""
    if peaks.empty or "arm" not in swept:
        return []
    others = [axis for axis in swept if axis != "arm"]
    phases = [phase for phase in MEMORY_PHASES if phase in peaks]
    base = peaks[peaks["arm"] == BASELINE]
    lines = []
    for row in peaks[peaks["arm"] != BASELINE].to_dict("records"):
        match = base
        for axis in others:
            match = match[match[axis] == row[axis]]
        if match.empty or pd.isna(row["peak_set_by"]):
            continue
        baseline = match.iloc[0]
        setter = row["peak_set_by"]
        margin = max(HIDDEN_GIB, HIDDEN_SHARE * baseline["peak_allocated_gib"])
        if pd.isna(baseline[setter]) or baseline[setter] - row[setter] > margin:
            continue  # the arm is leaner in the phase that sets its peak: its saving shows
        peak_saving = baseline["peak_allocated_gib"] - row["peak_allocated_gib"]
        savings = {
            phase: baseline[phase] - row[phase]
            for phase in phases
            if phase != setter and pd.notna(row[phase]) and pd.notna(baseline[phase])
        }
        if not savings:
            continue
        phase, saving = max(savings.items(), key=lambda item: item[1])
        if saving - peak_saving <= margin:
            continue
        where = ", ".join(f"{axis} {row[axis]}" for axis in others)
        arm, base_setter = row["arm"], PHASE_NAMES[baseline["peak_set_by"]]
        lines.append(
            f"{'At ' + where + ': t' if where else 'T'}he {PHASE_NAMES[setter]} sets {arm}'s peak allocated memory "
            f"({row['peak_allocated_gib']:.1f} GiB), and {arm} saves nothing there (the baseline's "
            f"{PHASE_NAMES[setter]}: {baseline[setter]:.1f} GiB): its saving in the {PHASE_NAMES[phase]} "
            f"({baseline[phase]:.1f} → {row[phase]:.1f} GiB) lowers the peak by {peak_saving:.1f} GiB only (the "
            f"baseline's peak: {baseline['peak_allocated_gib']:.1f} GiB, set by its {base_setter})."
        )
    return lines
