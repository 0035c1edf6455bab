"""Peak memory by phase: the step recorder keeps each phase's peak apart (forward, loss, backward, optimizer step,
evaluation) while the step's peak stays the largest of them; the analysis names the phase that sets each arm's peak
and says when it hides an arm's saving elsewhere. The allocator is stood in on the CPU by one that counts bytes as
CUDA's caching allocator counts them (on the host, as tensors are allocated)."""

import pandas as pd
import pytest
import torch

from finetune_bench.analysis.memory_phases import hidden_savings, phase_peaks
from finetune_bench.measuring import steps as steps_module
from finetune_bench.measuring.metrics import MEMORY_PHASES, METRICS
from finetune_bench.measuring.steps import StepRecorder


class FakeAllocator:
    """Bytes held and their peak since the last reset, with the reserved memory never below the held."""

    def __init__(self) -> None:
        self.held = self.peak = self.reserved = self.reserved_peak = 0

    def alloc(self, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)
        self.reserved = max(self.reserved, self.held)
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def free(self, n: int) -> None:
        self.held -= n

    def reset(self, *_: object) -> None:
        self.peak, self.reserved_peak = self.held, self.reserved


@pytest.fixture
def allocator(monkeypatch) -> FakeAllocator:
    fake = FakeAllocator()
    cuda = steps_module.torch.cuda
    monkeypatch.setattr(cuda, "synchronize", lambda *_: None)
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda *_: fake.peak)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda *_: fake.reserved_peak)
    monkeypatch.setattr(cuda, "memory_allocated", lambda *_: fake.held)
    monkeypatch.setattr(cuda, "memory_reserved", lambda *_: fake.reserved)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", fake.reset)
    monkeypatch.setattr(cuda, "memory_stats", lambda *_: {})
    monkeypatch.setattr(steps_module, "NvmlPeakSampler", None)  # no driver here: the recorder goes on without it
    monkeypatch.setattr(steps_module, "open_energy_counter", lambda _device: (None, "no GPU here"))
    return fake


def _step(recorder: StepRecorder, fake: FakeAllocator, activations: int, logits: int, optimizer: int) -> None:
    recorder.add_batch(None, torch.zeros(1, 8, dtype=torch.long))
    with recorder.memory_phase("forward"):
        fake.alloc(activations)
        with recorder.memory_phase("loss"):  # computed apart from the forward, inside it
            fake.alloc(logits)
            fake.free(logits)
    with recorder.memory_phase("backward"):
        fake.alloc(activations // 2)  # gradients, while the activations go
        fake.free(activations + activations // 2)
    with recorder.memory_phase("optimizer"):
        fake.alloc(optimizer)
        fake.free(optimizer)
    fake.alloc(3)  # outside any phase (the data for the next step): in the step's peak only
    fake.free(3)
    recorder.end_step()


def test_each_phase_keeps_its_own_peak_and_the_step_keeps_the_largest(allocator):
    allocator.alloc(100)  # the weights
    recorder = StepRecorder(torch.device("cuda"), warmup_steps=0)
    recorder.begin_training()
    _step(recorder, allocator, activations=40, logits=30, optimizer=60)
    _step(recorder, allocator, activations=50, logits=10, optimizer=20)
    with recorder.outside_steps(), recorder.memory_phase("evaluation"):
        allocator.alloc(25)
        allocator.free(25)
    recorder.end_training()
    peaks = {phase: recorder.memory_phase_peaks[phase]["allocated"] for phase in MEMORY_PHASES}
    assert peaks == {"forward": 150, "loss": 170, "backward": 175, "optimizer": 160, "evaluation": 125}
    assert [s.peak_allocated_bytes for s in recorder.steps] == [170, 175]  # the phases' largest, each step
    summary = recorder.summary()
    assert summary["peak_allocated_optimizer_bytes"] == 160 and summary["peak_allocated_bytes"] == 175
    assert summary["peak_reserved_loss_bytes"] == 170
    assert all(f"peak_{kind}_{phase}_bytes" in METRICS for phase in MEMORY_PHASES for kind in ("allocated", "reserved"))


def test_after_training_ends_nothing_counts_in_a_phase(allocator):
    recorder = StepRecorder(torch.device("cuda"), warmup_steps=0)
    recorder.begin_training()
    _step(recorder, allocator, activations=10, logits=5, optimizer=10)
    recorder.end_training()
    with recorder.memory_phase("forward"):  # a profiled step after the timed ones
        allocator.alloc(1000)
    assert recorder.memory_phase_peaks["forward"]["allocated"] == 10


def test_an_unknown_phase_is_refused():
    recorder = StepRecorder(torch.device("cpu"), warmup_steps=0)
    with pytest.raises(ValueError, match="'logits' is not a memory phase"):
        recorder.enter_memory_phase("logits")


def _table(liger_forward: float, liger_optimizer: float) -> pd.DataFrame:
    """Llama-3-8B under FSDP as measured there: AdamW's step sets the baseline's peak."""
    rows = []
    for arm, forward, backward, optimizer in (
        ("baseline", 30.0, 33.0, 37.5),
        ("liger", liger_forward, 26.0, liger_optimizer),
    ):
        rows.append(
            dict(
                arm=arm,
                max_seq_length=2048,
                status="ok",
                run_number=0,
                peak_allocated_forward_gib=forward,
                peak_allocated_backward_gib=backward,
                peak_allocated_optimizer_gib=optimizer,
                peak_allocated_gib=max(forward, backward, optimizer),
            )  # fmt: skip
        )
    return pd.DataFrame(rows)


def test_the_phase_that_sets_the_peak_is_named_and_a_hidden_saving_said():
    swept = ["arm", "max_seq_length"]
    peaks = phase_peaks(_table(liger_forward=20.0, liger_optimizer=37.5), swept)
    assert list(peaks["peak_set_by"]) == ["optimizer", "optimizer"]
    assert "loss" not in peaks  # no run recorded it: no column
    (line,) = hidden_savings(peaks, swept)
    assert line == (
        "At max_seq_length 2048: the optimizer step sets liger's peak allocated memory (37.5 GiB), and liger saves "
        "nothing there (the baseline's optimizer step: 37.5 GiB): its saving in the forward pass (30.0 → 20.0 GiB) "
        "lowers the peak by 0.0 GiB only (the baseline's peak: 37.5 GiB, set by its optimizer step)."
    )


def test_a_saving_hidden_by_a_phase_that_sets_the_arm_s_peak_alone_is_said():
    """As measured at Llama-3-8B under FSDP on two GPUs: the baseline's peak is its backward pass (the logits'
    gradients), Liger's the optimizer step, which is the same in both arms."""
    swept = ["arm", "max_seq_length"]
    table = pd.DataFrame(
        [
            dict(arm="baseline", max_seq_length=2048, status="ok", peak_allocated_forward_gib=36.90,
                 peak_allocated_backward_gib=38.86, peak_allocated_optimizer_gib=37.46, peak_allocated_gib=38.86),
            dict(arm="liger", max_seq_length=2048, status="ok", peak_allocated_forward_gib=28.09,
                 peak_allocated_backward_gib=34.27, peak_allocated_optimizer_gib=37.46, peak_allocated_gib=37.46),
        ]
    )  # fmt: skip
    peaks = phase_peaks(table, swept)
    assert list(peaks["peak_set_by"]) == ["backward", "optimizer"]
    (line,) = hidden_savings(peaks, swept)
    assert "the optimizer step sets liger's peak allocated memory (37.5 GiB)" in line
    assert "its saving in the forward pass (36.9 → 28.1 GiB) lowers the peak by 1.4 GiB only" in line
    assert "set by its backward pass" in line


def test_a_saving_that_lowers_the_peak_is_not_called_hidden():
    swept = ["arm", "max_seq_length"]
    # liger is leaner in the phase that sets its peak (its optimizer step, 18 against 37.5 GiB): its saving shows
    assert hidden_savings(phase_peaks(_table(liger_forward=20.0, liger_optimizer=18.0), swept), swept) == []
    # the same phase sets both, and no other phase saves more than the margin
    table = _table(liger_forward=20.0, liger_optimizer=37.5)
    table.loc[table["arm"] == "baseline", ["peak_allocated_forward_gib", "peak_allocated_backward_gib"]] = [20.4, 26.2]
    assert hidden_savings(phase_peaks(table, swept), swept) == []
