"""The GPU as its driver sees it, through NVML (no CUDA context is created): the GPUs present, the driver
version, the memory a process really holds (sampled while it trains) and the energy the GPU has used."""

import os
import threading
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the sampler takes a torch device; listing GPUs needs no torch
    import torch


def _nvml():
    """pynvml, initialized (it raises when there is no NVIDIA driver)."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def gpu_names() -> list[str]:
    """The name of every GPU this process may use; empty without an NVIDIA driver (a CPU machine)."""
    try:
        nvml = _nvml()
        return [
            str(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(nvml.nvmlDeviceGetCount())
        ]
    except Exception:  # no NVIDIA driver: no GPU to name
        return []


def gpu_memory_bytes() -> int | None:
    """The first visible GPU's total memory as NVML reports it (no CUDA context is created); None without one."""
    try:
        nvml = _nvml()
        return int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0)).total)
    except Exception:  # no driver or no GPU: nothing to guide a search with, said by the caller
        return None


def driver_version() -> str:
    """The NVIDIA driver's version; `unknown (<why>)` when NVML cannot say."""
    try:
        return str(_nvml().nvmlSystemGetDriverVersion())
    except Exception as exc:  # the record says why the driver version is missing
        return f"unknown ({type(exc).__name__})"


def _device_handle(nvml: ModuleType, device: "torch.device") -> object:
    """NVML's handle of the GPU that torch calls `device` (matched by UUID: NVML's indices ignore
    CUDA_VISIBLE_DEVICES)."""
    import torch

    uuid = torch.cuda.get_device_properties(device).uuid
    return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")


class EnergyCounter:
    """The GPU's total energy since its driver loaded, from NVML's counter (`nvmlDeviceGetTotalEnergyConsumption`,
    millijoules; Volta and later). Reading it is cheap (no device synchronization): the step recorder reads it at
    every step boundary. Constructing it reads it once, so a GPU or driver without the counter raises there."""

    def __init__(self, nvml: ModuleType, handle: object):
        """`nvml`: pynvml, initialized; `handle`: the GPU's NVML handle."""
        self._nvml = nvml
        self._handle = handle
        self.read_j()

    @classmethod
    def for_device(cls, device: "torch.device") -> "EnergyCounter":
        nvml = _nvml()
        return cls(nvml, _device_handle(nvml, device))

    def read_j(self) -> float:
        """The counter now, in joules (raises NVML's error when the driver cannot say)."""
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0


def open_energy_counter(device: "torch.device") -> tuple[EnergyCounter | None, str]:
    """The energy counter of `device`, or None and why there is none (a CPU, no NVML, a GPU without the counter)."""
    if device.type != "cuda":
        return None, f"no GPU energy counter: the run trained on {device.type}"
    try:
        return EnergyCounter.for_device(device), ""
    except Exception as exc:  # no driver, no NVML, or a GPU older than Volta: the reason goes in the run's record
        return None, f"NVML's energy counter is unavailable: {type(exc).__name__}: {exc}"


class NvmlPeakSampler:
    """The GPU memory the driver sees, sampled in a background thread (what torch's allocator
    does not count: the CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers, fragmentation).

    Reports this process's peak when NVML lists it (`nvml_process_peak_bytes`); inside a container
    whose PID namespace hides it, the device's peak used memory over the run instead
    (`nvml_device_used_peak_bytes`, which includes any other process on the GPU). With either, what lay outside
    torch's caching allocator at its most (`outside_allocator_peak_bytes`): at each sample the driver's figure less
    what the allocator had reserved at that moment. A memory cap (`running.allocator.cap_memory`) leaves torch the
    card's memory less a fixed allowance for this; the figure says how much the run really needed beside torch's.
    """

    def __init__(self, device: "torch.device", interval_s: float = 0.05):
        self._nvml = _nvml()
        self._handle = _device_handle(self._nvml, device)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._device = device
        self.process_peak: int | None = None
        self.device_peak = 0
        self.outside_peak: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        import torch

        reserved = torch.cuda.memory_reserved(self._device)
        pid = os.getpid()
        process = None
        for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                process = int(proc.usedGpuMemory)
                self.process_peak = max(self.process_peak or 0, process)
        used = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        self.device_peak = max(self.device_peak, used)
        outside = (process if process is not None else used) - reserved
        self.outside_peak = max(self.outside_peak if self.outside_peak is not None else outside, outside)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if not self._paused.is_set():
                self.sample()

    def pause(self) -> None:
        """Stop sampling until `resume` (work that is not the run's to count: a held-out evaluation)."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.sample()
        outside = {"outside_allocator_peak_bytes": float(max(self.outside_peak, 0))}
        if self.process_peak is not None:
            return {"nvml_process_peak_bytes": float(self.process_peak), **outside}
        return {"nvml_device_used_peak_bytes": float(self.device_peak), **outside}
