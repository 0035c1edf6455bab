"""What lies outside torch's caching allocator: at each NVML sample, the driver's figure for the process (or, where
the container hides the process, the GPU's used memory) less what the allocator reserved at that moment; the run
keeps the most."""

from types import SimpleNamespace

import pytest
import torch

from finetune_bench.measuring import gpu as gpu_module

GIB = 1024**3


class FakeNvml:
    """NVML as the sampler reads it: the process's and the device's used memory, changed between samples."""

    def __init__(self, process_listed: bool):
        self.process_listed = process_listed
        self.process = self.used = 0

    def nvmlDeviceGetComputeRunningProcesses(self, _handle):
        import os

        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.process)] if self.process_listed else []

    def nvmlDeviceGetMemoryInfo(self, _handle):
        return SimpleNamespace(used=self.used)


@pytest.mark.parametrize("process_listed", [True, False])
def test_outside_the_allocator_is_the_most_of_driver_less_reserved_at_one_moment(monkeypatch, process_listed):
    nvml = FakeNvml(process_listed)
    reserved = {"now": 0}
    monkeypatch.setattr(gpu_module, "_nvml", lambda: nvml)
    monkeypatch.setattr(gpu_module, "_device_handle", lambda _nvml, _device: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *_: reserved["now"])
    sampler = gpu_module.NvmlPeakSampler(torch.device("cuda"))
    # (the driver's figure, the allocator's reserve): outside 0.6, then 0.9 (the peak), then 0.7 GiB
    for driver, held in ((2.6, 2.0), (30.9, 30.0), (20.7, 20.0)):
        nvml.process = nvml.used = int(driver * GIB)
        reserved["now"] = int(held * GIB)
        sampler.sample()
    nvml.process = nvml.used = int(0.5 * GIB)  # stop() samples once more: torch freed everything, the context stays
    reserved["now"] = 0
    sampler._thread = SimpleNamespace(join=lambda: None)
    figures = sampler.stop()
    # not the peak of either (30.9 - 30.0 at the same moment), nor driver's peak less reserved's peak
    assert figures["outside_allocator_peak_bytes"] == pytest.approx(0.9 * GIB, rel=1e-6)
    key = "nvml_process_peak_bytes" if process_listed else "nvml_device_used_peak_bytes"
    assert figures[key] == pytest.approx(30.9 * GIB, rel=1e-6)
