"""How sure: each arm against the baseline, paired by run number, with a t interval and a paired test on the logs.

Runs with the same run number of an arm and of the baseline (same other settings) share the seed and the data order
and ran close in time (repeats are interleaved), so they are compared as pairs. Per pair, the ratio arm / baseline of
a metric; per arm and point of the other axes, **the geometric mean of the paired ratios** (the exponential of the
mean log ratio: one definition of "how much faster", the same in the card, the verdicts, the tables and the
exports), its 95 % confidence interval (a t interval on the log ratios: mean ± t(0.975, pairs − 1) × their standard
error, exponentiated) and a paired t-test on the logarithms (scipy.stats.ttest_rel: is the ratio 1?) judged at the
user's alpha. The interval and the test are the same computation, so the interval excludes 1 exactly where the test
at alpha 0.05 says significant.

The interval means what it says: at 3, 5 and 10 pairs of log-normal ratios it covers the true ratio about 95 % of the
time (tests/analysis/test_interval_coverage.py). The percentile bootstrap of the median, a common choice, does
not: at 3 pairs its ends are the smallest and largest ratio, which hold the median about 75 % of the time. At 3 pairs
the t interval is wide, and honestly so: t(0.975, 2) is 4.3. Below 3 pairs no interval is shown.

When the inputs list the `baseline_repeat` arm, it is compared with the baseline like any other arm:
an A/A comparison of two identical arms. The largest departure from 1 it shows (the far end of its
confidence interval, or of its pair ratios when there are too few pairs for one) is the noise floor at
that point; an arm whose ratio lies within it is flagged: its difference is not distinguishable
from run-to-run noise, whatever the test says.
"""

import numpy as np
import pandas as pd
from scipy import stats

from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT
from finetune_bench.results.record import OK

# Below this many pairs no interval is shown (at 2 pairs a t interval spans t(0.975, 1) = 12.7 standard errors).
MIN_PAIRS_FOR_CI = 3
CONFIDENCE_LEVEL = 0.95
# Repeats of one condition whose throughputs differ by more than this factor (a busy machine, a throttled GPU) make
# the condition noisy: flagged, and its test not counted as significant.
NOISY_SPREAD = 2.0
# The results columns compared, each with the name of its figures (energy per token: where the GPU counted it).
METRICS = {
    "tokens_per_second": "throughput",
    "steady_tokens_per_second": "steady_throughput",
    # the user's whole fine-tune, projected from the run's steps and rows (`analysis.projection`)
    "projected_tokens_per_second": "projected_throughput",
    "peak_reserved_gib": "peak_reserved",
    "energy_per_token_j": "energy_per_token",
}


def paired_comparison(table: pd.DataFrame, swept: list[str], alpha: float = 0.05) -> pd.DataFrame:
    """One row per arm (but the baseline) and point of the other swept axes: the `hardware` its paired runs trained
    on (where the table has it), `pairs`, and per metric of `METRICS` that the table has (throughput,
    steady_throughput, peak_reserved, energy_per_token) the ratio (the geometric mean of the paired ratios),
    `_ci_low` / `_ci_high`, `_p_value`,
    `_significant` and, when the inputs ask for an A/A comparison, `_noise_floor`; `note` says what cannot be said.
    An arm with no pair has every metric's columns, empty."""
    if "arm" not in swept:
        return pd.DataFrame()
    others = [axis for axis in swept if axis != "arm"]
    ok = table[table["status"] == OK]
    compared = {column: name for column, name in METRICS.items() if column in table}
    hardware = ["hardware"] if "hardware" in table else []
    columns = [*others, "run_number", *hardware, *compared]
    is_baseline = ok["arm"] == BASELINE
    pairs = ok.loc[~is_baseline, ["arm", *columns]].merge(
        ok.loc[is_baseline, columns], on=[*others, "run_number"], suffixes=("_arm", "_baseline")
    )
    rows = []
    for key, group in pairs.groupby(["arm", *others], dropna=False, sort=False):
        row = dict(zip(["arm", *others], key, strict=True))
        if hardware:  # what both sides' runs trained on, as the results table says it
            row["hardware"] = _labels(pd.concat([group["hardware_arm"], group["hardware_baseline"]]))
        row["pairs"] = len(group)
        for metric, name in compared.items():
            row.update(_compare(group[f"{metric}_arm"], group[f"{metric}_baseline"], name, alpha))
        rows.append(row)
    # Arms with no pair at all still get a row, saying so, with every metric's columns (empty).
    unpaired = pd.Series(dtype=float)
    for key, group in ok.loc[~is_baseline].groupby(["arm", *others], dropna=False, sort=False):
        if not any(all(r[k] == v for k, v in zip(["arm", *others], key, strict=True)) for r in rows):
            labels = {"hardware": _labels(group["hardware"])} if hardware else {}
            row = {**dict(zip(["arm", *others], key, strict=True)), **labels, "pairs": 0}
            for name in compared.values():
                row.update(_compare(unpaired, unpaired, name, alpha))
            rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out = _with_noise_floor(out, others, list(compared.values()))
    out["throughput_spread"] = [_repeat_spread(ok, row, others) for row in out.to_dict("records")]
    noisy = out["throughput_spread"] > NOISY_SPREAD
    if "throughput_significant" in out:  # a noisy condition's test says nothing: it is not counted significant
        out["throughput_significant"] = out["throughput_significant"].astype(object).where(~noisy, None)
    out["note"] = [_note(row, alpha) for row in out.to_dict("records")]
    return out


def _repeat_spread(ok: pd.DataFrame, row: dict, others: list[str]) -> float:
    """The largest over the smallest throughput of one condition's repeats, the worse of the arm's and the
    baseline's at the row's point (1.0: alike, or one run)."""
    at = ok
    for axis in others:
        at = at[at[axis] == row[axis]]
    spreads = []
    for arm in (row["arm"], BASELINE):
        speeds = at.loc[at["arm"] == arm, "tokens_per_second"].dropna() if "tokens_per_second" in at else []
        speeds = [value for value in speeds if value > 0]
        spreads.append(max(speeds) / min(speeds) if speeds else 1.0)
    return float(max(spreads))


def _labels(values: pd.Series) -> str:
    """The distinct non-empty labels of `values`, in order, joined ("cpu", "gpu: NVIDIA H100 80GB HBM3")."""
    return ", ".join(value for value in values.dropna().astype(str).unique() if value)


def ratio_interval(ratios: np.ndarray, confidence: float = CONFIDENCE_LEVEL) -> tuple[float, float, float]:
    """The geometric mean of `ratios` and its `confidence` t interval on their logarithms: (ratio, low, high); the
    interval NaN below `MIN_PAIRS_FOR_CI` ratios, the ratio itself where they are all equal (a deterministic figure,
    such as a peak memory that every pair repeats)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    if not len(logs):
        return np.nan, np.nan, np.nan
    mean = float(np.mean(logs))
    if len(logs) < MIN_PAIRS_FOR_CI:
        return float(np.exp(mean)), np.nan, np.nan
    if np.ptp(logs) == 0:
        return float(np.exp(mean)), float(np.exp(mean)), float(np.exp(mean))
    low, high = stats.t.interval(confidence, len(logs) - 1, loc=mean, scale=stats.sem(logs))
    return float(np.exp(mean)), float(np.exp(low)), float(np.exp(high))


def _compare(arm: pd.Series, baseline: pd.Series, name: str, alpha: float) -> dict:
    valid = arm.notna() & baseline.notna() & (baseline > 0) & (arm > 0)
    ratios = (arm[valid] / baseline[valid]).to_numpy(dtype=float)
    ratio, low, high = ratio_interval(ratios)
    out = {f"{name}_ratio": ratio}
    p_value = np.nan
    if len(ratios) >= 2 and np.ptp(np.log(ratios)) > 0:
        p_value = float(stats.ttest_rel(np.log(arm[valid]), np.log(baseline[valid])).pvalue)
    out.update(
        {
            f"{name}_ci_low": low,
            f"{name}_ci_high": high,
            f"{name}_p_value": p_value,
            f"{name}_significant": bool(p_value < alpha) if not np.isnan(p_value) else None,
            # kept for the A/A noise floor
            f"_{name}_max_departure": float(np.max(np.abs(ratios - 1))) if len(ratios) else np.nan,
        }
    )
    return out


def _with_noise_floor(out: pd.DataFrame, others: list[str], names: list[str]) -> pd.DataFrame:
    """Add `<metric>_noise_floor` (a fraction: 0.02 means ±2 %) from the A/A rows, to every row of the
    same point of the other axes; drop the helper columns."""
    helpers = [f"_{name}_max_departure" for name in names]
    aa = out[out["arm"] == BASELINE_REPEAT]
    if not aa.empty:
        floors = pd.DataFrame({k: aa[k] for k in others}) if others else pd.DataFrame(index=aa.index)
        for name in names:
            interval_departure = np.fmax((aa[f"{name}_ci_low"] - 1).abs(), (aa[f"{name}_ci_high"] - 1).abs())
            floors[f"{name}_noise_floor"] = interval_departure.fillna(aa[f"_{name}_max_departure"])
        out = out.merge(floors, on=others, how="left") if others else out.assign(**floors.iloc[0].to_dict())
    return out.drop(columns=[c for c in helpers if c in out])


def _note(row: dict, alpha: float) -> str:
    n_pairs = row["pairs"]
    if n_pairs == 0:
        return "no ok run in both this arm and the baseline with the same run number: nothing to compare"
    if n_pairs < 2:
        return "one pair: no interval, no test (set n_runs ≥ 3)"
    notes = []
    if n_pairs < MIN_PAIRS_FOR_CI:
        notes.append(f"{n_pairs} pairs: too few for a confidence interval (set n_runs ≥ {MIN_PAIRS_FOR_CI})")
    spread = row.get("throughput_spread")
    if spread is not None and pd.notna(spread) and spread > NOISY_SPREAD:
        notes.append(
            f"noisy: one repeat ran ×{spread:.1f} faster than another (a busy machine?); not counted as significant"
        )
    if row["arm"] == BASELINE_REPEAT:
        notes.append("A/A: two identical arms; their spread is the noise floor")
    elif row.get("throughput_significant") is False:
        notes.append(f"the throughput difference is not significant at alpha {alpha:g}")
    floor = row.get("throughput_noise_floor")
    ratio = row.get("throughput_ratio")
    if row["arm"] != BASELINE_REPEAT and floor is not None and pd.notna(floor) and pd.notna(ratio):
        if abs(ratio - 1) <= floor:
            notes.append(f"the throughput difference lies inside the A/A noise floor (±{floor:.1%})")
    return "; ".join(notes)


# The comparison's ratios that the paired statistics give (comparison column → paired metric name).
PAIRED_RATIOS = {
    "throughput_ratio": "throughput",
    "peak_reserved_ratio": "peak_reserved",
    "energy_per_token_ratio": "energy_per_token",
}


def with_paired_ratios(comparison: pd.DataFrame, paired: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """`comparison` (`tables.arms_vs_baseline`, one row per arm and point) with its ratios the paired statistics'
    (the geometric mean of the ratios of runs paired by run number), and the throughput's interval and significance
    beside them: one number per question, the one the How sure table states (NaN where no run of the arm has a baseline
    run to pair with)."""
    if comparison.empty or paired.empty:
        return comparison
    keys = ["arm", *[axis for axis in swept if axis != "arm"]]
    stated = {f"{name}_ratio": column for column, name in PAIRED_RATIOS.items()}
    extra = ["throughput_ci_low", "throughput_ci_high", "throughput_significant"]
    columns = [c for c in [*stated, *extra] if c in paired]
    merged = comparison.drop(columns=[c for c in PAIRED_RATIOS if c in comparison]).merge(
        paired[[*keys, *columns]].rename(columns=stated), on=keys, how="left"
    )
    return merged[[*comparison.columns, *[c for c in extra if c in merged]]]
