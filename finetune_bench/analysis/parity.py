"""Does an arm change what the model learns? Step-by-step loss curves of each arm's runs against the baseline's.

A run of an arm and a baseline run with the same values of every other swept axis and the same `run_number`
share the seed and the data order by construction, so their losses should agree step for step up to
kernel-level numerical noise. This module pairs them and reports, per pair, how far the curves drift apart.
"""

import numpy as np
import pandas as pd

from finetune_bench.inputs.arms import BASELINE
from finetune_bench.results.record import OK

# Tolerances for "the same loss", with the `numpy.isclose` rule |liger - baseline| <= atol + rtol * |baseline|.
# Liger's own bf16 convergence tests (test/convergence/bf16 in linkedin/Liger-Kernel) compare the per-step
# losses of a mini model with and without its kernels using `assert_close`-style atol/rtol; their values
# vary by model and release (most entries use atol 1e-3 / rtol 1e-2, the vision-language models rtol 5e-2,
# the LFM2 test atol = rtol = 5e-2). These are at the loose end of that range: a benchmark run trains longer
# than the 32 steps of those tests, and bf16 noise compounds over steps.
LOSS_ATOL = 1e-2
LOSS_RTOL = 5e-2

_PAIR_COLUMNS = [
    "run_number",
    "arm",
    "arm_condition_id",
    "baseline_condition_id",
    "steps_compared",
    "max_abs_diff",
    "max_rel_diff",
    "first_divergent_step",
    "verdict",
]
MATCH, DIVERGED, NO_OVERLAP = "match", "diverged", "no overlap"
DIFFERS = "differs"  # a held-out loss outside the tolerance of the baseline's


def loss_parity(steps: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """One row per (arm run, baseline run) pair with the same other axes and `run_number`, for every arm but
    the baseline.

    Compares the two loss curves on the steps both have with a non-NaN loss. Columns: the other swept axes
    (under their names), then `run_number`, `arm`, `arm_condition_id`, `baseline_condition_id`, `steps_compared`,
    `max_abs_diff`, `max_rel_diff` (relative to |baseline|), `first_divergent_step` (nullable int: the first
    step outside LOSS_ATOL + LOSS_RTOL * |baseline|) and `verdict` ("match", "diverged" or "no overlap").
    A run without a baseline partner (or the reverse) gets no row. Empty (with those columns) when
    `arm` is not swept or there are no steps.
    """
    others = [axis for axis in swept if axis != "arm"]
    columns = [*others, *_PAIR_COLUMNS]
    if "arm" not in swept or steps.empty:
        return _empty(columns)

    keys = [*others, "run_number"]
    runs = steps[["condition_id", *keys, "arm"]].drop_duplicates(["condition_id", "run_number"])
    is_baseline = runs["arm"] == BASELINE
    treated = runs[~is_baseline].rename(columns={"condition_id": "arm_condition_id"})
    base = runs[is_baseline].drop(columns="arm").rename(columns={"condition_id": "baseline_condition_id"})
    pairs = treated.merge(base, on=keys, how="inner").reset_index(drop=True)
    if pairs.empty:
        return _empty(columns)
    pairs["_pair"] = np.arange(len(pairs))

    losses = steps.loc[steps["loss"].notna(), ["condition_id", "run_number", "step", "loss"]]
    arm_losses = losses.rename(columns={"condition_id": "arm_condition_id", "loss": "arm_loss"})
    base_losses = losses.rename(columns={"condition_id": "baseline_condition_id", "loss": "baseline_loss"})
    compared = (
        pairs[["_pair", "run_number", "arm_condition_id", "baseline_condition_id"]]
        .merge(arm_losses, on=["arm_condition_id", "run_number"])
        .merge(base_losses, on=["baseline_condition_id", "run_number", "step"])
    )

    arm_loss = compared["arm_loss"].to_numpy(dtype=float)
    base_loss = compared["baseline_loss"].to_numpy(dtype=float)
    abs_diff = np.abs(arm_loss - base_loss)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_diff = np.where(abs_diff == 0, 0.0, abs_diff / np.abs(base_loss))
    divergent = ~np.isclose(arm_loss, base_loss, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    per_step = pd.DataFrame(
        {
            "_pair": compared["_pair"].to_numpy(),
            "abs_diff": abs_diff,
            "rel_diff": rel_diff,
            "divergent_step": compared["step"].where(divergent).to_numpy(dtype=float),
        }
    )
    stats = per_step.groupby("_pair").agg(
        steps_compared=("abs_diff", "size"),
        max_abs_diff=("abs_diff", "max"),
        max_rel_diff=("rel_diff", "max"),
        first_divergent_step=("divergent_step", "min"),
    )

    out = pairs.merge(stats, left_on="_pair", right_index=True, how="left")
    out["steps_compared"] = out["steps_compared"].fillna(0).astype(int)
    out["first_divergent_step"] = out["first_divergent_step"].astype("Int64")
    out["verdict"] = np.select(
        [out["steps_compared"] == 0, out["first_divergent_step"].notna().to_numpy(dtype=bool)],
        [NO_OVERLAP, DIVERGED],
        default=MATCH,
    )
    return out.sort_values(["_pair"])[columns].reset_index(drop=True)


def held_out_parity(table: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """One row per (arm run, baseline run) pair, as `loss_parity` pairs them, where both ended ok with a held-out
    loss: the other swept axes, `run_number`, `arm`, `eval_loss` and `baseline_eval_loss` (after the last step),
    `difference` (arm minus baseline), `perplexity_ratio` (arm over baseline) and `verdict` ("match" within
    LOSS_ATOL + LOSS_RTOL * |baseline|, else "differs"). Empty when `arm` is not swept or no run evaluated."""
    others = [axis for axis in swept if axis != "arm"]
    columns = [
        *others,
        "run_number",
        "arm",
        "eval_loss",
        "baseline_eval_loss",
        "difference",
        "perplexity_ratio",
        "verdict",
    ]
    if "arm" not in swept or "final_eval_loss" not in table or table["final_eval_loss"].isna().all():
        return pd.DataFrame(columns=columns)
    evaluated = table[(table["status"] == OK) & table["final_eval_loss"].notna()]
    if "eval_error" in evaluated:  # evaluations that stopped early have no loss after the last step
        evaluated = evaluated[evaluated["eval_error"].fillna("") == ""]
    keys = [*others, "run_number"]
    base = evaluated[evaluated["arm"] == BASELINE][[*keys, "final_eval_loss"]]
    treated = evaluated[evaluated["arm"] != BASELINE][[*keys, "arm", "final_eval_loss"]]
    pairs = treated.merge(base, on=keys, suffixes=("", "_baseline"))
    if pairs.empty:
        return pd.DataFrame(columns=columns)
    arm_loss, base_loss = pairs["final_eval_loss"], pairs["final_eval_loss_baseline"]
    out = pairs[keys].assign(
        arm=pairs["arm"],
        eval_loss=arm_loss,
        baseline_eval_loss=base_loss,
        difference=arm_loss - base_loss,
        perplexity_ratio=np.exp(arm_loss - base_loss),
        verdict=np.where(np.isclose(arm_loss, base_loss, rtol=LOSS_RTOL, atol=LOSS_ATOL), MATCH, DIFFERS),
    )
    return out[columns].reset_index(drop=True)


def held_out_summary(held_out: pd.DataFrame) -> str:
    """One plain-text line for a report: how many pairs' held-out losses match."""
    if held_out.empty:
        return ""
    n_match = int((held_out["verdict"] == MATCH).sum())
    worst = held_out.loc[held_out["difference"].abs().idxmax()]
    return (
        f"Held-out loss: {n_match} of {len(held_out)} arm/baseline {_plural(len(held_out), 'pair')} match within atol "
        f"{LOSS_ATOL:g}, rtol {LOSS_RTOL:g} after the last step; the largest difference is {worst['difference']:+.4f} "
        f"(arm {worst['arm']}, run {worst['run_number']}: {worst['eval_loss']:.4f} against "
        f"{worst['baseline_eval_loss']:.4f})."
    )


def with_loss_parity(table: pd.DataFrame, parity: pd.DataFrame) -> pd.DataFrame:
    """`table` (one row per run) with a `loss_parity` column: the verdict of the pair each run belongs to
    (an arm's run and its baseline get the same one), empty for a run in no pair."""
    verdicts = pd.concat(
        [
            parity[[f"{arm}_condition_id", "run_number", "verdict"]].rename(
                columns={f"{arm}_condition_id": "condition_id", "verdict": "loss_parity"}
            )
            for arm in ("arm", "baseline")
        ]
    )
    # A baseline paired with several arms' runs keeps the worst verdict.
    verdicts = verdicts.sort_values("loss_parity", key=lambda v: v != DIVERGED).drop_duplicates(
        ["condition_id", "run_number"]
    )
    out = table.drop(columns="loss_parity", errors="ignore").merge(
        verdicts, on=["condition_id", "run_number"], how="left"
    )
    out["loss_parity"] = out["loss_parity"].fillna("")
    return out


def parity_summary(parity: pd.DataFrame) -> str:
    """One plain-text line for a report: how many pairs match, or the first divergence."""
    if parity.empty:
        return "Loss parity: no arm/baseline pair to compare."
    total = len(parity)
    verdicts = parity["verdict"]
    n_match, n_diverged, n_none = (int((verdicts == v).sum()) for v in (MATCH, DIVERGED, NO_OVERLAP))
    if n_diverged:
        diverged = parity[verdicts == DIVERGED]
        first = diverged.loc[diverged["first_divergent_step"].astype(float).idxmin()]
        others = [c for c in parity.columns if c not in _PAIR_COLUMNS]
        where = ", ".join(
            [f"arm {first['arm']}", *(f"{axis}={first[axis]}" for axis in others), f"run {first['run_number']}"]
        )
        head = (
            f"{n_diverged} of {total} {_plural(total, 'pair')} diverged "
            f"(first at step {first['first_divergent_step']}: {where})"
        )
    elif n_match:
        verb = "matches" if n_match == 1 else "match"
        head = f"{n_match} arm/baseline {_plural(n_match, 'pair')} {verb} within atol {LOSS_ATOL:g}, rtol {LOSS_RTOL:g}"
    else:
        return f"Loss parity: none of {total} arm/baseline {_plural(total, 'pair')} has a common step with a loss."
    tail = f"; {n_none} of {total} had no common step with a loss" if n_none else ""
    return f"Loss parity: {head}{tail}."


def _plural(n: int, word: str) -> str:
    return word if n == 1 else f"{word}s"


_EMPTY_DTYPES = {
    "run_number": "int64",
    "steps_compared": "int64",
    "max_abs_diff": "float64",
    "max_rel_diff": "float64",
    "first_divergent_step": "Int64",
}


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(dtype=_EMPTY_DTYPES.get(column, object)) for column in columns})
