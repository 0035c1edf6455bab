"""Liger/baseline loss parity on hand-made step tables (no training)."""

import numpy as np
import pandas as pd
import pytest

from finetune_bench.analysis.parity import LOSS_ATOL, LOSS_RTOL, loss_parity, parity_summary, with_loss_parity

SWEPT = ["arm", "per_device_train_batch_size"]
N_STEPS = 10


def curve(batch_size: int, run_number: int) -> np.ndarray:
    """A loss curve around 2.0, different per batch size and run (so a mis-pairing shows up)."""
    steps = np.arange(1, N_STEPS + 1)
    return 2.0 + 0.3 * np.exp(-steps / 4) + 0.01 * batch_size + 0.05 * run_number


def run_frame(liger: bool, run_number: int, losses, **axes) -> pd.DataFrame:
    values = {"arm": "liger" if liger else "baseline", **axes}
    condition_id = ",".join(f"{name}={value}" for name, value in values.items())
    n = len(losses)
    frame = pd.DataFrame(
        {
            "condition_id": condition_id,
            "run_number": run_number,
            "step": np.arange(1, n + 1),
            "step_time_s": 0.1,
            "non_padding_tokens": 100,
            "padded_tokens": 128,
            "loss": np.asarray(losses, dtype=float),
            "peak_allocated_bytes": 1e9,
            "peak_reserved_bytes": 2e9,
            "is_warmup": np.arange(n) == 0,
        }
    )
    for name, value in {"arm": values["arm"], "per_device_train_batch_size": 1, "max_seq_length": 32}.items():
        frame[name] = values.get(name, value)
    return frame


def grid(perturb=None, batch_sizes=(8, 16), runs=(0, 1)) -> pd.DataFrame:
    """2 batch sizes × liger/baseline × 2 runs; `perturb(batch_size, run_number, losses)` edits liger's curve."""
    frames = []
    for run_number in runs:
        for batch_size in batch_sizes:
            base = curve(batch_size, run_number)
            liger = base.copy()
            if perturb is not None:
                perturb(batch_size, run_number, liger)
            frames.append(run_frame(True, run_number, liger, per_device_train_batch_size=batch_size))
            frames.append(run_frame(False, run_number, base, per_device_train_batch_size=batch_size))
    return pd.concat(frames, ignore_index=True)


def test_identical_curves_all_match():
    parity = loss_parity(grid(), SWEPT)
    assert list(parity.columns) == [
        "per_device_train_batch_size",
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
    assert len(parity) == 4
    assert (parity["verdict"] == "match").all()
    assert (parity["steps_compared"] == N_STEPS).all()
    assert (parity["max_abs_diff"] == 0).all() and (parity["max_rel_diff"] == 0).all()
    assert parity["first_divergent_step"].isna().all()
    for row in parity.itertuples():
        assert row.arm_condition_id == f"arm=liger,per_device_train_batch_size={row.per_device_train_batch_size}"
        assert (
            row.baseline_condition_id == f"arm=baseline,per_device_train_batch_size={row.per_device_train_batch_size}"
        )
    assert sorted(zip(parity["per_device_train_batch_size"], parity["run_number"], strict=True)) == [
        (8, 0),
        (8, 1),
        (16, 0),
        (16, 1),
    ]


def test_small_perturbation_is_within_tolerance():
    def perturb(batch_size, run_number, losses):
        losses += 0.02  # far below atol + rtol * 2.0 = 0.11

    parity = loss_parity(grid(perturb), SWEPT)
    assert (parity["verdict"] == "match").all()
    assert parity["max_abs_diff"].to_numpy() == pytest.approx(0.02)
    assert (parity["max_rel_diff"] > 0.005).all() and (parity["max_rel_diff"] < 0.01).all()
    assert parity["first_divergent_step"].isna().all()


def test_large_perturbation_diverges_at_its_step_in_the_right_pair():
    def perturb(batch_size, run_number, losses):
        if batch_size == 16 and run_number == 1:
            losses[6] += 0.5  # step 7
            losses[8] -= 0.5  # step 9: later, so step 7 stays the first

    parity = loss_parity(grid(perturb), SWEPT)
    diverged = parity[parity["verdict"] == "diverged"]
    assert len(diverged) == 1
    row = diverged.iloc[0]
    assert (row["per_device_train_batch_size"], row["run_number"]) == (16, 1)
    assert row["arm_condition_id"] == "arm=liger,per_device_train_batch_size=16"
    assert row["first_divergent_step"] == 7
    assert row["max_abs_diff"] == pytest.approx(0.5)
    assert row["steps_compared"] == N_STEPS
    assert (parity.drop(diverged.index)["verdict"] == "match").all()


def test_results_table_gets_each_runs_pair_verdict():
    def perturb(batch_size, run_number, losses):
        if batch_size == 16 and run_number == 1:
            losses[6] += 0.5

    steps = grid(perturb, batch_sizes=(8, 16))
    runs = steps[["condition_id", "run_number"]].drop_duplicates().reset_index(drop=True)
    unpaired = pd.DataFrame({"condition_id": ["arm=liger,per_device_train_batch_size=32"], "run_number": [0]})
    table = with_loss_parity(pd.concat([runs, unpaired], ignore_index=True), loss_parity(steps, SWEPT))
    verdict = table.set_index(["condition_id", "run_number"])["loss_parity"]
    assert verdict[("arm=liger,per_device_train_batch_size=16", 1)] == "diverged"
    assert verdict[("arm=baseline,per_device_train_batch_size=16", 1)] == "diverged"
    assert verdict[("arm=liger,per_device_train_batch_size=16", 0)] == "match"
    assert verdict[("arm=baseline,per_device_train_batch_size=8", 1)] == "match"
    assert verdict[("arm=liger,per_device_train_batch_size=32", 0)] == ""
    assert len(table) == len(runs) + 1


def test_divergence_uses_the_isclose_rule_relative_to_the_baseline():
    base = np.array([2.0, 2.0, 2.0])
    limit = LOSS_ATOL + LOSS_RTOL * 2.0
    liger = base + np.array([0.9 * limit, -0.9 * limit, 1.1 * limit])
    steps = pd.concat([run_frame(True, 0, liger), run_frame(False, 0, base)], ignore_index=True)
    parity = loss_parity(steps, ["arm"])
    assert list(parity.columns)[:3] == ["run_number", "arm", "arm_condition_id"]
    assert parity["first_divergent_step"].tolist() == [3]
    assert parity["max_rel_diff"].iloc[0] == pytest.approx(1.1 * limit / 2.0)


def test_pairing_uses_run_number_and_other_axes():
    steps = grid()
    # A liger run 2 without a baseline run 2, and a liger batch size 32 without a baseline at 32.
    orphans = [
        run_frame(True, 2, curve(8, 2), per_device_train_batch_size=8),
        run_frame(True, 0, curve(32, 0), per_device_train_batch_size=32),
    ]
    parity = loss_parity(pd.concat([steps, *orphans], ignore_index=True), SWEPT)
    assert len(parity) == 4
    assert 2 not in set(parity["run_number"]) and 32 not in set(parity["per_device_train_batch_size"])
    # Each liger curve is only equal to the baseline of its own batch size and run, so all match.
    assert (parity["verdict"] == "match").all()


def test_nan_losses_are_ignored_and_no_common_step_is_no_overlap():
    base8 = curve(8, 0)
    liger8 = base8.copy()
    liger8[[0, 3]] = np.nan
    base8[5] = np.nan
    liger8[7] += 5.0
    base8[7] = np.nan  # the only big difference is on a step the baseline has no loss for
    liger16 = curve(16, 0)
    liger16[::2] = np.nan
    base16 = curve(16, 0)
    base16[1::2] = np.nan  # the two curves never have a loss on the same step
    steps = pd.concat(
        [
            run_frame(True, 0, liger8, per_device_train_batch_size=8),
            run_frame(False, 0, base8, per_device_train_batch_size=8),
            run_frame(True, 0, liger16, per_device_train_batch_size=16),
            run_frame(False, 0, base16, per_device_train_batch_size=16),
        ],
        ignore_index=True,
    )
    parity = loss_parity(steps, SWEPT).set_index("per_device_train_batch_size")
    assert parity.loc[8, "verdict"] == "match"
    assert parity.loc[8, "steps_compared"] == N_STEPS - 4
    assert parity.loc[8, "max_abs_diff"] == 0
    assert parity.loc[16, "verdict"] == "no overlap"
    assert parity.loc[16, "steps_compared"] == 0
    assert np.isnan(parity.loc[16, "max_abs_diff"]) and pd.isna(parity.loc[16, "first_divergent_step"])


def test_extra_swept_axis_is_part_of_the_pairing_key():
    swept = ["arm", "per_device_train_batch_size", "max_seq_length"]
    frames = []
    for seq_len in (128, 256):
        base = curve(8, 0) + seq_len / 1000  # curves differ per sequence length
        liger = base.copy()
        if seq_len == 256:
            liger[2] += 1.0  # step 3
        frames.append(run_frame(True, 0, liger, per_device_train_batch_size=8, max_seq_length=seq_len))
        frames.append(run_frame(False, 0, base, per_device_train_batch_size=8, max_seq_length=seq_len))
    parity = loss_parity(pd.concat(frames, ignore_index=True), swept)
    assert list(parity.columns)[:3] == ["per_device_train_batch_size", "max_seq_length", "run_number"]
    assert len(parity) == 2
    by_len = parity.set_index("max_seq_length")
    assert by_len.loc[128, "verdict"] == "match"
    assert by_len.loc[256, "verdict"] == "diverged" and by_len.loc[256, "first_divergent_step"] == 3
    assert by_len.loc[256, "baseline_condition_id"].endswith("max_seq_length=256")


def test_every_arm_is_paired_with_the_baseline():
    steps = grid()
    compiled = steps[steps["arm"] == "liger"].assign(arm="compile")
    compiled["condition_id"] = compiled["condition_id"].str.replace("arm=liger", "arm=compile")
    parity = loss_parity(pd.concat([steps, compiled], ignore_index=True), SWEPT)
    assert len(parity) == 8 and sorted(set(parity["arm"])) == ["compile", "liger"]
    assert (parity["verdict"] == "match").all()


@pytest.mark.parametrize(
    ("steps", "swept"),
    [
        (grid(), ["per_device_train_batch_size"]),
        (pd.DataFrame(columns=["condition_id", "run_number", "step"]), SWEPT),
        (grid().query("arm == 'liger'"), SWEPT),  # no baseline at all
    ],
    ids=["arm-not-swept", "no-steps", "no-baseline"],
)
def test_nothing_to_compare_gives_an_empty_frame(steps, swept):
    parity = loss_parity(steps, swept)
    assert parity.empty
    others = [axis for axis in swept if axis != "arm"]
    assert list(parity.columns) == [
        *others,
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
    assert parity_summary(parity) == "Loss parity: no arm/baseline pair to compare."


def test_summary_when_all_match():
    assert parity_summary(loss_parity(grid(), SWEPT)) == (
        "Loss parity: 4 arm/baseline pairs match within atol 0.01, rtol 0.05."
    )


def test_summary_names_the_first_divergence():
    def perturb(batch_size, run_number, losses):
        if (batch_size, run_number) == (16, 0):
            losses[8 - 1] += 1.0  # step 8
        if (batch_size, run_number) == (8, 1):
            losses[5 - 1] += 1.0  # step 5: the earliest divergence

    summary = parity_summary(loss_parity(grid(perturb), SWEPT))
    assert (
        summary
        == "Loss parity: 2 of 4 pairs diverged (first at step 5: arm liger, per_device_train_batch_size=8, run 1)."
    )


def test_summary_mentions_pairs_without_overlap():
    steps = grid()
    no_loss = (steps["per_device_train_batch_size"] == 16) & (steps["run_number"] == 1) & (steps["arm"] == "liger")
    steps.loc[no_loss, "loss"] = np.nan
    summary = parity_summary(loss_parity(steps, SWEPT))
    assert summary == (
        "Loss parity: 3 arm/baseline pairs match within atol 0.01, rtol 0.05; 1 of 4 had no common step with a loss."
    )
