"""GPU energy: its rows in the metrics table, NVML's counter read through a fake NVML, and the step recorder's
arithmetic (the measured steps' energy only; missing, with the reason, where it is unknown)."""

import pytest
import torch

from finetune_bench.measuring import gpu, steps
from finetune_bench.measuring.gpu import EnergyCounter, open_energy_counter
from finetune_bench.measuring.metrics import (
    ENERGY_COUNTER,
    JOULES_PER_KWH,
    METRICS,
    PER_TOKEN,
    TOTAL,
    Metric,
    throughput,
)
from finetune_bench.measuring.steps import StepRecorder


class FakeNvml:
    """pynvml's energy counter: millijoules since the driver loaded, one reading per call (an exception raises)."""

    class NVMLError(Exception):
        pass

    def __init__(self, readings_mj: list):
        self.readings_mj = list(readings_mj)
        self.handles: list = []

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:  # noqa: N802 (pynvml's name)
        self.handles.append(handle)
        reading = self.readings_mj.pop(0)
        if isinstance(reading, Exception):
            raise reading
        return reading


class FakeCounter:
    """An energy counter in joules, read at each step boundary."""

    def __init__(self, readings_j: list):
        self.readings_j = list(readings_j)

    def read_j(self) -> float:
        reading = self.readings_j.pop(0)
        if isinstance(reading, Exception):
            raise reading
        return reading


def test_the_energy_rows_name_their_total_unit_and_merge():
    per_token, kwh = METRICS["energy_per_token_j"], METRICS["energy_kwh"]
    assert (per_token.ranks, per_token.unit, per_token.column) == (PER_TOKEN, "J/token", "energy_per_token_j")
    assert (kwh.ranks, kwh.unit, kwh.column, kwh.per) == (TOTAL, "kWh", "energy_kwh", JOULES_PER_KWH)
    assert per_token.total_of == kwh.total_of == "measured_energy_j"
    assert METRICS["measured_energy_j"].column is None  # the total stays in the record
    assert {per_token.scope, kwh.scope} == {ENERGY_COUNTER}


def test_a_total_figure_must_name_its_total_and_only_it():
    with pytest.raises(ValueError, match="names its total"):
        Metric("energy_x", "J", TOTAL, "energy with no total")
    with pytest.raises(ValueError, match="names its total"):
        Metric("rate_x", "J", "rank0", "a rank-0 figure with a total", total_of="measured_energy_j")


def test_energy_per_token_and_kwh_come_from_the_totals():
    figures = throughput({"measured_tokens": 4000.0, "measured_energy_j": 7.2e6}, 10.0)
    assert figures["energy_per_token_j"] == pytest.approx(1800.0)
    assert figures["energy_kwh"] == pytest.approx(2.0)
    assert "energy_per_token_j" not in throughput({"measured_tokens": 0.0, "measured_energy_j": 5.0}, 1.0)
    assert "energy_kwh" not in throughput({"measured_tokens": 10.0}, 1.0)


def test_the_counter_reads_nvml_s_millijoules_as_joules():
    nvml = FakeNvml([5_000_000, 5_002_500])
    counter = EnergyCounter(nvml, handle="gpu-handle")  # reads once to find whether the GPU has the counter
    assert counter.read_j() == pytest.approx(5002.5)
    assert nvml.handles == ["gpu-handle", "gpu-handle"]


def test_no_counter_on_a_cpu_or_where_nvml_has_none_and_the_reason_says_which(monkeypatch):
    counter, reason = open_energy_counter(torch.device("cpu"))
    assert counter is None and reason == "no GPU energy counter: the run trained on cpu"
    nvml = FakeNvml([FakeNvml.NVMLError("Not Supported")])
    monkeypatch.setattr(gpu, "_nvml", lambda: nvml)
    monkeypatch.setattr(gpu, "_device_handle", lambda _nvml, _device: "pre-Volta GPU")
    counter, reason = open_energy_counter(torch.device("cuda", 0))
    assert counter is None
    assert reason == "NVML's energy counter is unavailable: NVMLError: Not Supported"


def _batch(tokens: int, padded: int) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.zeros(1, padded, dtype=torch.long)
    mask[0, :tokens] = 1
    return mask, torch.zeros(1, padded, dtype=torch.long)


def _recorder(monkeypatch, readings_j: list, warmup_steps: int = 1) -> StepRecorder:
    counter = FakeCounter(readings_j)
    monkeypatch.setattr(steps, "open_energy_counter", lambda device: (counter, ""))
    recorder = StepRecorder(device=torch.device("cpu"), warmup_steps=warmup_steps)
    recorder.begin_training()
    return recorder


def test_the_recorder_counts_the_measured_steps_energy_only(monkeypatch):
    # start 1000 J; warm-up step +10; step 2 +20; an evaluation (1030 → 1100, not counted); step 3 +30; step 4 +40
    recorder = _recorder(monkeypatch, [1000.0, 1010.0, 1030.0, 1100.0, 1130.0, 1170.0])
    for step, tokens in enumerate((7, 6, 5, 4), start=1):
        recorder.add_batch(*_batch(tokens, 8))
        recorder.end_step()
        if step == 2:
            with recorder.outside_steps():
                pass
    recorder.end_training()
    assert [s.energy_j for s in recorder.steps] == [10.0, 20.0, 30.0, 40.0]
    summary = recorder.summary()
    assert summary["measured_energy_j"] == 90.0  # the warm-up step's 10 J and the evaluation's 70 J left out
    assert summary["energy_per_token_j"] == pytest.approx(90.0 / (6 + 5 + 4))
    assert summary["energy_kwh"] == pytest.approx(90.0 / 3.6e6)
    assert recorder.energy_unavailable == ""


def test_a_failed_read_leaves_the_energy_missing_with_the_step_it_failed_at(monkeypatch):
    recorder = _recorder(monkeypatch, [0.0, 10.0, 20.0, RuntimeError("NVML_ERROR_GPU_IS_LOST")], warmup_steps=0)
    for _ in range(3):
        recorder.add_batch(*_batch(4, 4))
        recorder.end_step()
    assert [s.energy_j for s in recorder.steps] == [10.0, 10.0, None]
    summary = recorder.summary()
    assert "measured_energy_j" not in summary and "energy_per_token_j" not in summary
    assert summary["tokens_per_second"] > 0  # the rest of the run is measured all the same
    assert recorder.energy_unavailable.startswith("NVML's energy counter failed at step 3: RuntimeError(")


def test_a_counter_that_goes_back_gives_no_energy(monkeypatch):
    recorder = _recorder(monkeypatch, [500.0, 510.0, 3.0], warmup_steps=0)
    for _ in range(2):
        recorder.add_batch(*_batch(4, 4))
        recorder.end_step()
    assert "energy_kwh" not in recorder.summary()
    assert recorder.energy_unavailable == "NVML's energy counter went back at step 2"


def test_a_run_on_the_cpu_has_no_energy_and_says_why():
    recorder = StepRecorder(device=torch.device("cpu"), warmup_steps=0)
    recorder.begin_training()
    recorder.add_batch(*_batch(4, 4))
    recorder.end_step()
    recorder.end_training()
    summary = recorder.summary()
    assert recorder.steps[0].energy_j is None
    assert not {"measured_energy_j", "energy_per_token_j", "energy_kwh"} & set(summary)
    assert recorder.energy_unavailable == "no GPU energy counter: the run trained on cpu"
