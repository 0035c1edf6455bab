"""What the user can afford and should run: per arm, the largest batch that fit (and the smallest that did
not), and the fastest configuration whose runs all finished, with the GPU memory it leaves free."""

import pandas as pd

from finetune_bench.results.record import OK, OOM


def largest_fitting_batch(table: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """Per arm and point of the other axes (batch size aside): the largest batch size with an ok run and
    the smallest one that ran out of memory. Empty when the batch size is not swept."""
    batch = "per_device_train_batch_size"
    if batch not in swept:
        return pd.DataFrame()
    keys = [axis for axis in swept if axis != batch] or ["_all"]
    keyed = table.assign(_all="all")
    ok = keyed[keyed["status"] == OK].groupby(keys, dropna=False)[batch].max().rename("largest_ok_batch")
    oom = keyed[keyed["status"] == OOM].groupby(keys, dropna=False)[batch].min().rename("smallest_oom_batch")
    tried = keyed.groupby(keys, dropna=False)[batch].max().rename("largest_tried_batch")
    out = pd.concat([ok, oom, tried], axis=1).reset_index()
    for column in ("largest_ok_batch", "smallest_oom_batch"):
        out[column] = out[column].astype("Int64")
    return out.drop(columns="_all", errors="ignore")


# What the Recommendation ranks by, where every clean condition has it: the user's whole fine-tune, projected
# (`analysis.projection`); else the throughput over the timed steps.
PROJECTED = "projected_tokens_per_second"


def recommendations(summary: pd.DataFrame, swept: list[str], capacity_gib: float | None) -> pd.DataFrame:
    """Per arm: the fastest condition among those whose runs all ended ok (by the median projected throughput of the
    user's whole fine-tune where every such condition has one, else the median tokens/s of the timed steps), its
    peak reserved memory and the headroom left on the GPU (capacity − peak reserved, in GiB and as a share)."""
    if summary.empty or "tokens_per_second" not in summary:
        return pd.DataFrame()
    clean = summary[(summary["ok_runs"] == summary["runs"]) & summary["tokens_per_second"].notna()]
    if clean.empty:
        return pd.DataFrame()
    speed = PROJECTED if PROJECTED in clean and clean[PROJECTED].notna().all() else "tokens_per_second"
    group = "arm" if "arm" in swept else None
    fastest = clean.groupby(group)[speed].idxmax() if group else [clean[speed].idxmax()]
    best = clean.loc[fastest]
    settings = [axis for axis in swept if axis != "arm"]
    out = pd.DataFrame({"arm": best["arm"]} if group else {}, index=best.index)
    out["configuration"] = (
        # an empty value as the inputs write it ('': the installed packages, the model as it is)
        best[settings].apply(lambda row: ", ".join(f"{k}={v if v != '' else repr('')}" for k, v in row.items()), axis=1)
        if settings
        else "as given"
    )
    if speed == PROJECTED:
        out["projected_fine_tune_s"] = best["projected_fine_tune_s"]
        out[PROJECTED] = best[PROJECTED]
    out["tokens_per_second"] = best["tokens_per_second"]
    out["peak_reserved_gib"] = best["peak_reserved_gib"]
    if capacity_gib:
        out["headroom_gib"] = capacity_gib - best["peak_reserved_gib"]
        out["headroom_share"] = (out["headroom_gib"] / capacity_gib).map(lambda v: f"{v:.0%}" if pd.notna(v) else "–")
    else:
        out["headroom_gib"] = float("nan")
        out["headroom_share"] = "unknown (no GPU capacity recorded)"
    return out.sort_values(speed, ascending=False).reset_index(drop=True)
