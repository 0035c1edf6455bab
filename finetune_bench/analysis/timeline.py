"""Where each run's wall time went: the phases of its timeline (`measuring.metrics.TIMELINE`, one results column
each), the remainder no phase covers, and each condition's medians.

A phase a run did not measure stays empty (NaN), never 0; the remainder (`OTHER_COLUMN`) is the run's wall time less
the phases it measured, so a phase that went unmeasured shows up there rather than disappearing.
"""

import pandas as pd

from finetune_bench.measuring.metrics import IN_WALL, TIMELINE
from finetune_bench.results.record import OK

# The timeline's columns in the order a run goes through them (the launcher's results-store time first).
PHASE_COLUMNS = [metric.column for metric in TIMELINE]
# The phases inside the child's wall time (`wall_time_s`): they never overlap, so they sum to at most it.
IN_WALL_COLUMNS = [metric.column for metric in TIMELINE if metric.phase == IN_WALL]
# The wall time no measured phase covers (what lies between phases, and every phase the run did not measure).
OTHER_COLUMN = "other_s"
# The wall time outside the warm-up and the timed steps: what the run cost beyond training.
OUTSIDE_STEPS_COLUMN = "outside_steps_s"
WALL_COLUMN = "wall_time_s"
STEP_PHASES = ("warmup_time_s", "timed_steps_s")


def with_timeline_remainder(table: pd.DataFrame) -> pd.DataFrame:
    """`table` (one row per run) with `OTHER_COLUMN`: each run's wall time less the in-wall phases it measured (the
    whole wall time for a run that measured none, a timeout's); and `OUTSIDE_STEPS_COLUMN`: its wall time less its
    warm-up and timed steps (where it measured both). NaN for a run without a wall time (lost, not launched)."""
    out = table.copy()
    for column in [*PHASE_COLUMNS, WALL_COLUMN]:
        if column not in out:
            out[column] = float("nan")
    wall = out[WALL_COLUMN].where(out[WALL_COLUMN] > 0)
    out[OTHER_COLUMN] = wall - out[IN_WALL_COLUMNS].sum(axis=1, min_count=1).fillna(0.0)
    out[OUTSIDE_STEPS_COLUMN] = wall - out[list(STEP_PHASES)].sum(axis=1, min_count=len(STEP_PHASES))
    return out


def condition_timeline(table: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """Per condition (the swept axes): its ok runs' median wall time, of each phase (NaN where no run measured it),
    of the remainder and of the time outside the steps; runs it is over. Empty when no run ended ok with a wall
    time (runs reused from the results store included: their timeline is the stored run's)."""
    keys = [axis for axis in swept if axis in table] or ["condition_id"]
    timed = with_timeline_remainder(table) if OTHER_COLUMN not in table else table
    ok = timed[(timed["status"] == OK) & (timed[WALL_COLUMN] > 0)]
    if ok.empty:
        return pd.DataFrame()
    columns = [WALL_COLUMN, *PHASE_COLUMNS, OTHER_COLUMN, OUTSIDE_STEPS_COLUMN]
    medians = ok.groupby(keys, dropna=False)[columns].median()
    runs = ok.groupby(keys, dropna=False)["run_number"].size().rename("runs")
    # runs taken from the results store: their timeline is the stored run's, not this execution's
    flags = ok["reused"].fillna(False).astype(bool) if "reused" in ok else pd.Series(False, index=ok.index)
    reused = flags.groupby([ok[k] for k in keys], dropna=False).sum().rename("reused_runs")
    return medians.join(runs).join(reused).reset_index()[[*keys, "runs", "reused_runs", *columns]]
