"""How sure: liger against the baseline, paired by run number, with scipy's bootstrap and a paired test.

Runs with the same run number of a liger and a baseline condition (same other settings) share the seed
and the data order and ran close in time (repeats are interleaved), so they are compared as pairs. Per
pair, the ratio liger / baseline of a metric; per condition, the median ratio, its 95 % bootstrap
confidence interval (scipy.stats.bootstrap, percentile method, resampling the pairs), and a paired
t-test on the logarithms (scipy.stats.ttest_rel: is the ratio 1?) judged at the user's alpha.
"""

import inspect
import warnings

import numpy as np
import pandas as pd
from scipy import stats

# Below this many pairs a bootstrap interval says nothing: it is not computed.
MIN_PAIRS_FOR_CI = 3
CONFIDENCE_LEVEL = 0.95
METRICS = {"tokens_per_second": "throughput", "peak_reserved_gib": "peak_reserved"}
# A fixed seed, so a report is reproducible (scipy ≥ 1.15 calls it `rng`, older releases `random_state`).
_SEED = {"rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state": 0}


def paired_comparison(table: pd.DataFrame, swept: list[str], alpha: float = 0.05) -> pd.DataFrame:
    """One row per point of the other swept axes: `pairs`, and per metric (throughput, peak_reserved) the
    median ratio, `_ci_low` / `_ci_high`, `_p_value` and `_significant`; `note` says what cannot be said."""
    if "use_liger" not in swept:
        return pd.DataFrame()
    others = [axis for axis in swept if axis != "use_liger"]
    ok = table[table["status"] == "ok"]
    is_liger = ok["use_liger"].astype(bool)
    columns = [*others, "run_number", *METRICS]
    pairs = ok.loc[is_liger, columns].merge(
        ok.loc[~is_liger, columns], on=[*others, "run_number"], suffixes=("_liger", "_baseline")
    )
    rows = []
    groups = pairs.groupby(others, dropna=False) if others else [((), pairs)]
    for key, group in groups:
        row = dict(zip(others, key if isinstance(key, tuple) else (key,), strict=True))
        row["pairs"] = len(group)
        for metric, name in METRICS.items():
            row.update(_compare(group[f"{metric}_liger"], group[f"{metric}_baseline"], name, alpha))
        row["note"] = _note(len(group), row, alpha)
        rows.append(row)
    return pd.DataFrame(rows)


def _compare(liger: pd.Series, baseline: pd.Series, name: str, alpha: float) -> dict:
    valid = liger.notna() & baseline.notna() & (baseline > 0) & (liger > 0)
    ratios = (liger[valid] / baseline[valid]).to_numpy(dtype=float)
    out = {f"{name}_ratio": float(np.median(ratios)) if len(ratios) else np.nan}
    low = high = p_value = np.nan
    if len(ratios) >= MIN_PAIRS_FOR_CI:
        with warnings.catch_warnings():  # identical ratios: a degenerate interval, reported as NaN
            warnings.simplefilter("ignore")
            interval = stats.bootstrap(
                (ratios,), np.median, confidence_level=CONFIDENCE_LEVEL, method="percentile", **_SEED
            ).confidence_interval
        low, high = float(interval.low), float(interval.high)
    if len(ratios) >= 2 and np.ptp(np.log(ratios)) > 0:
        p_value = float(stats.ttest_rel(np.log(liger[valid]), np.log(baseline[valid])).pvalue)
    out.update(
        {
            f"{name}_ci_low": low,
            f"{name}_ci_high": high,
            f"{name}_p_value": p_value,
            f"{name}_significant": bool(p_value < alpha) if not np.isnan(p_value) else None,
        }
    )
    return out


def _note(n_pairs: int, row: dict, alpha: float) -> str:
    if n_pairs == 0:
        return "no ok run in both arms with the same run number: nothing to compare"
    if n_pairs < 2:
        return "one pair: no interval, no test (set n_runs ≥ 3)"
    notes = []
    if n_pairs < MIN_PAIRS_FOR_CI:
        notes.append(f"{n_pairs} pairs: too few for a confidence interval (set n_runs ≥ {MIN_PAIRS_FOR_CI})")
    if row["throughput_significant"] is False:
        notes.append(f"the throughput difference is not significant at alpha {alpha:g}")
    return "; ".join(notes)
