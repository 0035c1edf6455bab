"""A run on several GPUs: its energy is every rank's summed, per token over every rank's tokens; a rank without
an energy figure leaves the run without one, and the record says which rank."""

import pytest

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.metrics import ENERGY_UNAVAILABLE
from finetune_bench.results.record import RankSummary, RunResult
from finetune_bench.running.ranks import RankReport, combined_metrics, merge_ranks


def _report(rank: int, **totals: float) -> RankReport:
    return RankReport(RankSummary(rank, 0, rank, "h", "ok"), totals)


def _rank0() -> RunResult:
    return RunResult(condition_id="c", run_number=0, swept_axes=[], training_args=TrainingArgs(), status="ok")


def test_the_ranks_energies_are_summed_over_their_tokens_summed():
    reports = [
        _report(0, measured_time_s=2.0, measured_tokens=1000.0, measured_energy_j=300.0),
        _report(1, measured_time_s=4.0, measured_tokens=3000.0, measured_energy_j=500.0),
    ]
    metrics = combined_metrics(reports, gpu_name="")
    assert metrics["energy_per_token_j"] == pytest.approx(800.0 / 4000.0)  # not the mean of 0.3 and 0.1667
    assert metrics["energy_kwh"] == pytest.approx(800.0 / 3.6e6)  # not over time: the slowest rank's 4 s is moot
    assert "measured_energy_j" not in metrics


def test_a_rank_without_energy_leaves_the_run_without_one_and_is_named():
    reports = [
        _report(0, measured_time_s=2.0, measured_tokens=1000.0, measured_energy_j=300.0),
        _report(1, measured_time_s=2.0, measured_tokens=1000.0),
    ]
    merged = merge_ranks(_rank0(), reports, failed=None)
    assert "energy_per_token_j" not in merged.metrics and "energy_kwh" not in merged.metrics
    assert merged.metrics["tokens_per_second"] == pytest.approx(1000.0)
    assert merged.details[ENERGY_UNAVAILABLE] == "rank 1 measured no GPU energy (see that rank's log)"


def test_rank_0_s_own_reason_stands():
    rank0 = _rank0()
    rank0.details[ENERGY_UNAVAILABLE] = "no GPU energy counter: the run trained on cpu"
    reports = [_report(rank, measured_time_s=1.0, measured_tokens=10.0) for rank in range(2)]
    merged = merge_ranks(rank0, reports, failed=None)
    assert merged.details[ENERGY_UNAVAILABLE] == "no GPU energy counter: the run trained on cpu"
