"""Should I upgrade? A grid that sweeps `software_set` trains every arm under each set of package releases; here each
set is compared with the reference set, arm by arm and at each point of the other swept axes, as
`analysis.stats.paired_comparison` compares an arm with the baseline, and its loss as `analysis.parity` judges an
arm's against the baseline's.

The reference set is the installed packages ("") where the sweep has them, else the sweep's first set. A run of a set
and a run of the reference with the same arm, other settings and run number share the seed and the data order, so
they are compared as a pair: the set takes the arm's place in the paired comparison (the reference the baseline's)
and the arm is one more of the other axes. Per metric, the geometric mean of the ratios set / reference over the
pairs, its t interval and the paired t-test at alpha; for the loss, the step-by-step loss curves where the steps are
known (`parity.loss_parity`), else the final training losses, within the same tolerances."""

import json

import numpy as np
import pandas as pd

from finetune_bench.analysis.numbers import number_text
from finetune_bench.analysis.parity import DIFFERS, DIVERGED, LOSS_ATOL, LOSS_RTOL, MATCH, NO_OVERLAP, loss_parity
from finetune_bench.analysis.stats import METRICS, MIN_PAIRS_FOR_CI, paired_comparison
from finetune_bench.inputs.arms import BASELINE, BASELINE_REPEAT
from finetune_bench.inputs.software_sets import INSTALLED, parse
from finetune_bench.results.record import OK

SOFTWARE_SET = "software_set"
# How the installed packages' set ("") is written in a table or a sentence.
INSTALLED_LABEL = "installed packages"
# The peak allocated memory is compared as `paired_comparison` compares the peak reserved memory (one of its METRICS).
PEAK_ALLOCATED, PEAK_RESERVED = "peak_allocated_gib", "peak_reserved_gib"
# While a set stands in the arm's place, the run's arm is this axis.
_RUN_ARM = "_run_arm"
# The per-metric columns the paired comparison gives a set, after `<name>_`.
_STATISTICS = ("ratio", "ci_low", "ci_high", "p_value", "significant")
# What the loss of a set's runs was compared on.
LOSS_CURVES, FINAL_LOSS = "loss curves", "final loss"
# Per arm, what the grid says to run (`chosen_sets`): a set faster than the reference beyond the noise whose loss
# matches; the reference, for a faster set whose loss does not match, or where every set that differs is slower;
# the reference, where no set differs beyond the noise.
FASTER, LOSS_DOES_NOT_MATCH, SLOWER, NO_DIFFERENCE = "faster", "loss does not match", "slower", "no difference"


def set_label(software_set: str) -> str:
    """A set as a table shows it: its pins, or "installed packages" for ""."""
    return INSTALLED_LABEL if software_set == INSTALLED else str(software_set)


def _set_text(software_set: str) -> str:
    return f"the {INSTALLED_LABEL}" if software_set == INSTALLED else str(software_set)


def sweeps_software(swept: list[str]) -> bool:
    """Whether the grid swept the software set (it then has a Versions view)."""
    return SOFTWARE_SET in swept


def reference_set(table: pd.DataFrame) -> str:
    """The set the others are compared with: the installed packages ("") where the grid has them, else its first set
    (the results table keeps the sweep's order)."""
    sets = list(dict.fromkeys(table[SOFTWARE_SET].astype(str)))
    return INSTALLED if INSTALLED in sets else sets[0]


def _as_arms(frame: pd.DataFrame, reference: str) -> pd.DataFrame:
    """`frame` (runs or steps) with the set in the arm's place, the reference as the baseline, and the run's arm as
    the `_RUN_ARM` axis."""
    sets = frame[SOFTWARE_SET].astype(str)
    return frame.rename(columns={"arm": _RUN_ARM}).assign(arm=sets.where(sets != reference, BASELINE))


def _from_arms(frame: pd.DataFrame) -> pd.DataFrame:
    """A comparison of sets in the arms' place, back under their own names: `software_set` and `arm`."""
    return frame.rename(columns={"arm": SOFTWARE_SET}).rename(columns={_RUN_ARM: "arm"})


def versions_table(
    table: pd.DataFrame, swept: list[str], alpha: float = 0.05, steps: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per arm (the A/A repeat aside), point of the other swept axes and set but the reference: the
    `reference` set, the `pairs` of runs (same arm, other settings and run number), per metric (throughput,
    steady_throughput, peak_allocated, peak_reserved, energy_per_token: those the table has) the geometric mean
    ratio set / reference with `_ci_low`, `_ci_high`, `_p_value` and `_significant` at `alpha`
    (`stats.paired_comparison`); the loss: `final_loss_difference` (median over the pairs, set minus reference),
    `loss_compared` (on what: loss
    curves where `steps` has them, else the final loss), `loss_pairs` and `loss_matches` (pairs compared, and those
    within `parity.LOSS_ATOL` + `LOSS_RTOL` × |reference|), `loss_verdict` ("match", "diverged" (curves), "differs"
    (final loss), "no overlap", or "" where no loss was compared); `note` says what cannot be said. Empty unless the
    grid swept two or more sets."""
    if not sweeps_software(swept) or table.empty or table[SOFTWARE_SET].astype(str).nunique() < 2:
        return pd.DataFrame()
    reference = reference_set(table)
    runs = table[table["arm"] != BASELINE_REPEAT]
    others = [axis for axis in swept if axis not in ("arm", SOFTWARE_SET)]
    as_arms = ["arm", _RUN_ARM, *others]
    relabeled = _as_arms(runs, reference)
    paired = paired_comparison(relabeled, as_arms, alpha)
    if paired.empty:
        return pd.DataFrame()
    keys = [_RUN_ARM, *others, "arm"]
    prefixes = tuple(f"{name}_" for name in METRICS.values())
    paired = paired[[*keys, "pairs", *(column for column in paired if column.startswith(prefixes))]]
    if PEAK_ALLOCATED in relabeled:
        paired = paired.merge(_peak_allocated(relabeled, as_arms, alpha, keys), on=keys, how="left")
    loss = _loss(relabeled, _curves(steps, reference, as_arms, keys), keys)
    out = paired.merge(loss, on=keys, how="left") if not loss.empty else paired.assign(**dict.fromkeys(_LOSS_COLUMNS))
    out[["loss_compared", "loss_verdict"]] = out[["loss_compared", "loss_verdict"]].fillna("")
    out = _from_arms(out)
    out.insert(out.columns.get_loc(SOFTWARE_SET) + 1, "reference", reference)
    out["note"] = [_note(row, alpha) for row in out.to_dict("records")]
    order = {value: i for i, value in enumerate(dict.fromkeys(table[SOFTWARE_SET].astype(str)))}
    return out.sort_values(SOFTWARE_SET, key=lambda sets: sets.map(order), kind="stable").reset_index(drop=True)


def _peak_allocated(relabeled: pd.DataFrame, as_arms: list[str], alpha: float, keys: list[str]) -> pd.DataFrame:
    """The peak allocated memory's paired statistics (`peak_allocated_<statistic>`), computed as `paired_comparison`
    computes the peak reserved memory's: the allocated peak in the reserved peak's column, the other metrics left
    out."""
    allocated_only = relabeled.drop(columns=[c for c in METRICS if c in relabeled]).assign(
        **{PEAK_RESERVED: relabeled[PEAK_ALLOCATED]}
    )
    paired = paired_comparison(allocated_only, as_arms, alpha)
    reserved = METRICS[PEAK_RESERVED]
    columns = {f"{reserved}_{s}": f"peak_allocated_{s}" for s in _STATISTICS if f"{reserved}_{s}" in paired}
    return paired[[*keys, *columns]].rename(columns=columns)


def _loss(relabeled: pd.DataFrame, curves: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per set against the reference (the `keys`): the final loss's median difference over the paired runs, and the
    loss verdict: from the loss curves where they were compared (`curves`), else from the final loss. Empty where
    neither was compared."""
    finals = _final_losses(relabeled, keys)
    if curves.empty:
        return finals
    if finals.empty:
        return curves.assign(final_loss_difference=np.nan)
    return curves.merge(finals[[*keys, "final_loss_difference"]], on=keys, how="left")


_LOSS_COLUMNS = ["final_loss_difference", "loss_compared", "loss_pairs", "loss_matches", "loss_verdict"]


def _final_losses(relabeled: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per set against the reference: the median difference of the paired runs' final training losses, how many
    pairs, how many within the parity tolerances, and the verdict (all within: "match", else "differs")."""
    others = keys[:-1]
    if "final_loss" not in relabeled:
        return pd.DataFrame(columns=[*keys, *_LOSS_COLUMNS])
    ok = relabeled[(relabeled["status"] == OK) & relabeled["final_loss"].notna()]
    pairs = ok[ok["arm"] != BASELINE][[*keys, "run_number", "final_loss"]].merge(
        ok[ok["arm"] == BASELINE][[*others, "run_number", "final_loss"]],
        on=[*others, "run_number"],
        suffixes=("", "_reference"),
    )
    if pairs.empty:
        return pd.DataFrame(columns=[*keys, *_LOSS_COLUMNS])
    pairs = pairs.assign(
        difference=pairs["final_loss"] - pairs["final_loss_reference"],
        match=np.isclose(pairs["final_loss"], pairs["final_loss_reference"], rtol=LOSS_RTOL, atol=LOSS_ATOL),
    )
    by_set = pairs.groupby(keys, dropna=False, sort=False)
    out = by_set.agg(
        final_loss_difference=("difference", "median"), loss_pairs=("match", "size"), loss_matches=("match", "sum")
    ).reset_index()
    out["loss_compared"] = FINAL_LOSS
    out["loss_verdict"] = np.where(out["loss_matches"] == out["loss_pairs"], MATCH, DIFFERS)
    return out


def _curves(steps: pd.DataFrame | None, reference: str, as_arms: list[str], keys: list[str]) -> pd.DataFrame:
    """Per set against the reference: of the paired runs' loss curves (`parity.loss_parity`), how many had a common
    step (`loss_pairs`), how many match (`loss_matches`), and the verdict (any diverged: "diverged"; else any matched:
    "match"; else "no overlap"). Empty without steps."""
    if steps is None or steps.empty or "loss" not in steps or SOFTWARE_SET not in steps:
        return pd.DataFrame()
    parity = loss_parity(_as_arms(steps[steps["arm"] != BASELINE_REPEAT], reference), as_arms)
    if parity.empty:
        return pd.DataFrame()
    verdicts = parity["verdict"]
    per_pair = parity[keys].assign(
        compared=verdicts != NO_OVERLAP, matched=verdicts == MATCH, diverged=verdicts == DIVERGED
    )
    out = (
        per_pair.groupby(keys, dropna=False, sort=False)
        .agg(loss_pairs=("compared", "sum"), loss_matches=("matched", "sum"), diverged=("diverged", "any"))
        .reset_index()
    )
    out["loss_verdict"] = np.select([out["diverged"], out["loss_matches"] > 0], [DIVERGED, MATCH], default=NO_OVERLAP)
    return out.drop(columns="diverged").assign(loss_compared=LOSS_CURVES)


def _note(row: dict, alpha: float) -> str:
    """What a set's row cannot say: too few pairs for a test or an interval, a difference within the noise, a loss
    not compared or not matching."""
    pairs = row["pairs"]
    if pairs == 0:
        return "no ok run in both this set and the reference with the same arm, settings and run number"
    notes = []
    if pairs < 2:
        notes.append("one pair: no interval, no test (set n_runs ≥ 3)")
    elif pairs < MIN_PAIRS_FOR_CI:
        notes.append(f"{pairs} pairs: too few for a confidence interval (set n_runs ≥ {MIN_PAIRS_FOR_CI})")
    if row.get("throughput_significant") is False:
        notes.append(f"the throughput difference is not significant at alpha {alpha:g}")
    if row["loss_verdict"] == "":
        notes.append("no loss to compare")
    elif row["loss_verdict"] != MATCH:
        notes.append(f"loss: {row['loss_verdict']} ({int(row['loss_matches'])} of {int(row['loss_pairs'])} match)")
    return "; ".join(notes)


def imported_versions_table(table: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """Per set (in the sweep's order) and package it pins: the `pinned` release, the release its ok runs `imported`
    (their `imported_versions`; "not recorded" where a run kept none) and how many `runs` imported it; the installed
    set is one row: package "installed packages", pinned "none", imported "as installed". Empty unless the grid swept
    the set."""
    columns = [SOFTWARE_SET, "package", "pinned", "imported", "runs"]
    if not sweeps_software(swept) or table.empty:
        return pd.DataFrame(columns=columns)
    ok = table[table["status"] == OK]
    rows = []
    for software_set in dict.fromkeys(table[SOFTWARE_SET].astype(str)):
        runs = ok[ok[SOFTWARE_SET].astype(str) == software_set]
        if software_set == INSTALLED:
            rows.append((software_set, INSTALLED_LABEL, "none", "as installed", len(runs)))
            continue
        texts = runs["imported_versions"].fillna("") if "imported_versions" in runs else pd.Series("", runs.index)
        recorded = [json.loads(text) if text else {} for text in texts]
        for package, pinned in parse(software_set).items():
            imported = pd.Series([versions.get(package, "not recorded") for versions in recorded], dtype=object)
            for version, count in imported.value_counts(sort=False).items():
                rows.append((software_set, package, pinned, version, int(count)))
            if imported.empty:
                rows.append((software_set, package, pinned, "no ok run", 0))
    return pd.DataFrame(rows, columns=columns)


def chosen_sets(versions: pd.DataFrame) -> pd.DataFrame:
    """Per arm: the set to `run`, why (`outcome`) and the label of the row of `versions` that says so (`row`; None
    where none does). `faster`: the set with the largest throughput ratio among those faster than the reference beyond
    the noise (significant) whose loss matches, at the point of the other axes where it is; `loss does not match`: a
    set is faster beyond the noise but its loss does not match (or was not compared), keep the reference; `slower`:
    every set that differs beyond the noise is slower, keep the reference (the row: the least slow); `no difference`:
    none differs beyond the noise. Beside it, `compared`: the row's set, the `comparisons` of the arm (sets × points),
    and how many `points` the row's set was compared at, at how many it was `faster_at` and `slower_at` beyond the
    noise."""
    rows = []
    for arm, mine in versions.groupby("arm", sort=False):
        significant = mine[mine["throughput_significant"].fillna(False).astype(bool)]
        faster = significant[significant["throughput_ratio"] > 1]
        holds = faster[faster["loss_verdict"] == MATCH]
        reference = mine["reference"].iloc[0]
        choice = {"arm": arm, "outcome": NO_DIFFERENCE, "run": reference, "reference": reference, "row": None,
                  "compared": None, "comparisons": len(mine), "points": 0, "faster_at": 0, "slower_at": 0}  # fmt: skip
        for outcome, candidates in ((FASTER, holds), (LOSS_DOES_NOT_MATCH, faster), (SLOWER, significant)):
            if candidates.empty:
                continue
            label = candidates["throughput_ratio"].idxmax()
            compared = mine.loc[label, SOFTWARE_SET]
            same_set = mine[mine[SOFTWARE_SET] == compared]
            same_significant = same_set["throughput_significant"].fillna(False).astype(bool)
            choice.update(
                outcome=outcome,
                run=compared if outcome == FASTER else reference,
                row=label,
                compared=compared,
                points=len(same_set),
                faster_at=int((same_significant & (same_set["throughput_ratio"] > 1)).sum()),
                slower_at=int((same_significant & (same_set["throughput_ratio"] < 1)).sum()),
            )
            break
        rows.append(choice)
    return pd.DataFrame(rows)


def _ratio_text(row: pd.Series, name: str = "throughput") -> str:
    """A set's ratio to the reference with its interval: "×1.12 [1.08, 1.15]"."""
    low, high = row.get(f"{name}_ci_low"), row.get(f"{name}_ci_high")
    interval = f" [{number_text(low)}, {number_text(high)}]" if pd.notna(low) and pd.notna(high) else ""
    return f"×{number_text(row[f'{name}_ratio'])}{interval}"


def _point_text(row: pd.Series, others: list[str]) -> str:
    return f" at {', '.join(f'{axis}={row[axis]}' for axis in others)}" if others else ""


def _loss_text(row: pd.Series) -> str:
    """How the set's loss compared with the reference's: "3 of 3 loss curves match", "2 of 3 final losses match"."""
    compared = "loss curves" if row["loss_compared"] == LOSS_CURVES else "final losses"
    if row["loss_verdict"] == "":
        return "its loss was not compared"
    return f"{int(row['loss_matches'])} of {int(row['loss_pairs'])} {compared} match"


def versions_verdicts(versions: pd.DataFrame, swept: list[str], alpha: float = 0.05) -> list[str]:
    """The Summary's line per arm on the software sets (`chosen_sets`): the set to run, its throughput ratio to the
    reference with its interval and where, and whether loss parity holds; or that no set differs beyond the noise.
    Empty without a comparison of sets."""
    if versions.empty:
        return []
    others = [axis for axis in swept if axis not in ("arm", SOFTWARE_SET)]
    lines = []
    for choice in chosen_sets(versions).itertuples(index=False):
        head, reference = f"Software set for arm {choice.arm}", _set_text(choice.reference)
        if choice.outcome == NO_DIFFERENCE:
            lines.append(
                f"{head}: no set differs from {reference} in throughput beyond the noise (paired t-test at alpha "
                f"{alpha:g}, {choice.comparisons} comparison(s))."
            )
            continue
        row = versions.loc[choice.row]
        other, ratio, where = _set_text(choice.compared), _ratio_text(row), _point_text(row, others)
        if choice.outcome == FASTER:
            line = (
                f"{head}: run {other}: it is {ratio} the throughput of {reference}{where} "
                f"(p {row['throughput_p_value']:.2g}), loss parity holds ({_loss_text(row)})"
            )
        elif choice.outcome == LOSS_DOES_NOT_MATCH:
            line = (
                f"{head}: keep {reference}: {other} is {ratio} its throughput{where}, but loss parity does not hold "
                f"({_loss_text(row)}{': ' + row['loss_verdict'] if row['loss_verdict'] else ''})"
            )
        else:
            line = (
                f"{head}: keep {reference}: every set that differs beyond the noise is slower ({other} is {ratio} its "
                f"throughput{where})"
            )
        if choice.points > 1:
            line += (
                f"; {other} is faster beyond the noise at {choice.faster_at} of {choice.points} points, slower at "
                f"{choice.slower_at}"
            )
        lines.append(line + ".")
    return lines
