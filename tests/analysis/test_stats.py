"""Paired arm / baseline statistics: bootstrap interval of the median ratio, a paired test, the A/A noise floor."""

import numpy as np
import pandas as pd
import pytest

from finetune_bench.analysis.stats import paired_comparison, ratio_interval

SWEPT = ["arm", "per_device_train_batch_size"]


def table(
    liger_tps, baseline_tps, batch=8, liger_mem=10.0, baseline_mem=20.0, statuses=None, arm="liger"
) -> pd.DataFrame:
    rows = []
    for run, (liger, base) in enumerate(zip(liger_tps, baseline_tps, strict=True)):
        for name, tps, mem in ((arm, liger, liger_mem), ("baseline", base, baseline_mem)):
            rows.append(
                dict(
                    arm=name,
                    per_device_train_batch_size=batch,
                    run_number=run,
                    status="ok",
                    tokens_per_second=tps,
                    peak_reserved_gib=mem,
                )
            )
    frame = pd.DataFrame(rows)
    if statuses:
        for (arm_name, run), status in statuses.items():
            frame.loc[(frame.arm == arm_name) & (frame.run_number == run), "status"] = status
    return frame


def test_a_consistent_speedup_gets_a_tight_interval_and_is_significant():
    rng = np.random.default_rng(1)
    base = 1000 + rng.normal(0, 5, 6)
    liger = base * 1.2 + rng.normal(0, 5, 6)
    (row,) = paired_comparison(table(liger, base), SWEPT, alpha=0.05).to_dict("records")
    assert row["pairs"] == 6
    assert row["throughput_ratio"] == pytest.approx(np.exp(np.log(liger / base).mean()))  # the geometric mean
    assert 1.15 < row["throughput_ci_low"] <= row["throughput_ratio"] <= row["throughput_ci_high"] < 1.25
    assert row["throughput_p_value"] < 1e-6 and row["throughput_significant"] is True
    assert row["peak_reserved_ratio"] == pytest.approx(0.5)
    assert row["note"] == ""


def test_noise_alone_is_not_significant():
    base = np.array([1000.0, 1010.0, 990.0, 1005.0])
    liger = np.array([1004.0, 998.0, 1001.0, 1003.0])
    (row,) = paired_comparison(table(liger, base), SWEPT, alpha=0.05).to_dict("records")
    assert row["throughput_significant"] is False
    assert row["throughput_ci_low"] < 1 < row["throughput_ci_high"]
    assert "not significant at alpha 0.05" in row["note"]


def test_two_pairs_get_a_test_but_no_interval():
    (row,) = paired_comparison(table([1200, 1230], [1000, 1010]), SWEPT).to_dict("records")
    assert row["pairs"] == 2
    assert np.isnan(row["throughput_ci_low"]) and np.isnan(row["throughput_ci_high"])
    assert not np.isnan(row["throughput_p_value"])
    assert "too few for a confidence interval" in row["note"]


def test_pairs_need_both_runs_ok_with_the_same_run_number():
    frame = table([1200, 1210, 1190], [1000, 1000, 1000], statuses={("baseline", 1): "oom"})
    (row,) = paired_comparison(frame, SWEPT).to_dict("records")
    assert row["pairs"] == 2
    assert row["throughput_ratio"] == pytest.approx(np.sqrt(1.2 * 1.19))


def test_one_row_per_point_of_the_other_axes():
    frame = pd.concat([table([1200] * 3, [1000] * 3, batch=4), table([1100] * 3, [1000] * 3, batch=8)])
    out = paired_comparison(frame, SWEPT).set_index("per_device_train_batch_size")
    assert out.loc[4, "throughput_ratio"] == pytest.approx(1.2)
    assert out.loc[8, "throughput_ratio"] == pytest.approx(1.1)
    # identical ratios: no spread, so no test
    assert np.isnan(out.loc[4, "throughput_p_value"]) and out.loc[4, "throughput_significant"] is None


def test_nothing_to_compare_without_the_arm_axis():
    assert paired_comparison(table([1], [1]), ["per_device_train_batch_size"]).empty


def aa_and_liger(aa_tps, liger_tps, base_tps) -> pd.DataFrame:
    """The baseline, its A/A repeat and liger, at one point."""
    frame = pd.concat([table(liger_tps, base_tps), table(aa_tps, base_tps, arm="baseline_repeat", liger_mem=20.0)])
    return frame.drop_duplicates(["arm", "run_number"])


def test_the_a_a_comparison_sets_the_noise_floor_and_flags_a_difference_inside_it():
    base = np.array([1000.0, 1030.0, 970.0, 1010.0])
    aa = np.array([1040.0, 990.0, 1000.0, 975.0])  # identical arms, up to ±4 % apart
    liger = base * 1.02 + np.array([1.0, -1.0, 0.5, -0.5])  # a consistent 2 %: significant, inside the floor
    out = paired_comparison(aa_and_liger(aa, liger, base), SWEPT).set_index("arm")
    floor = out.loc["baseline_repeat", "throughput_noise_floor"]
    departures = np.abs(aa / base - 1)
    # the far end of the A/A interval: every departure it cannot rule out, beyond those the pairs happened to show
    ratio, low, high = ratio_interval(aa / base)
    assert floor == pytest.approx(max(1 - low, high - 1)) and floor >= departures.max()
    assert out.loc["liger", "throughput_noise_floor"] == floor
    assert bool(out.loc["liger", "throughput_significant"]) is True
    assert "inside the A/A noise floor" in out.loc["liger", "note"]
    assert "A/A" in out.loc["baseline_repeat", "note"]


def test_a_difference_beyond_the_noise_floor_is_not_flagged():
    base = np.array([1000.0, 1002.0, 998.0, 1001.0])
    aa = np.array([1001.0, 1000.0, 999.0, 1002.0])
    out = paired_comparison(aa_and_liger(aa, base * 1.2, base), SWEPT).set_index("arm")
    assert out.loc["liger", "throughput_noise_floor"] < 0.01
    assert "noise floor" not in out.loc["liger", "note"]


def test_no_noise_floor_without_a_repeated_baseline():
    out = paired_comparison(table([1200] * 3, [1000] * 3), SWEPT)
    assert "throughput_noise_floor" not in out


def test_a_condition_whose_repeats_differ_by_more_than_twice_is_noisy_and_not_counted_significant():
    base = np.array([1000.0, 1010.0, 990.0])
    liger = np.array([1200.0, 1212.0, 50.0])  # one repeat on a busy machine: ×24 slower
    (row,) = paired_comparison(table(liger, base), SWEPT).to_dict("records")
    assert row["throughput_spread"] == pytest.approx(1212 / 50)
    assert row["throughput_significant"] is None and "noisy: one repeat ran ×24.2 faster" in row["note"]
    (calm,) = paired_comparison(table(base * 1.2, base), SWEPT).to_dict("records")
    assert calm["throughput_spread"] < 1.1 and "noisy" not in calm["note"]
