"""The GPUs a plan can target: memory, dense BF16 peak, the MFU a step time is predicted with, and the names
Flyte's accelerator setting uses for them.

Memory is the total that `nvidia-smi` reports; torch can reserve all of it but the CUDA context, which
`usable_bytes` subtracts (with the driver's reserve). The MFU figures are assumptions for a full fine-tune of a
1-8B model in bf16 with
transformers' layers, near what this project measured on H100 and H200 (0.34-0.57, docs/measurements.md);
a prediction says which it used, and the report sets measured against predicted.
"""

from dataclasses import dataclass

from finetune_bench.inputs.catalog import CUDA_CONTEXT_BYTES, GIB  # noqa: F401 (used here and named from here)
from finetune_bench.inputs.errors import SpecError, closest
from finetune_bench.measuring.flops import PEAK_BF16_DENSE_TFLOPS


@dataclass(frozen=True)
class GpuKind:
    name: str
    memory_mib: int
    peak_key: str  # its row in measuring.flops.PEAK_BF16_DENSE_TFLOPS
    assumed_mfu: float
    # flytekit's accelerator names (FINETUNE_BENCH_TRAIN_ACCELERATOR) that give this GPU.
    accelerators: tuple[str, ...] = ()

    @property
    def memory_bytes(self) -> float:
        return self.memory_mib * 2**20

    @property
    def peak_tflops(self) -> float:
        return PEAK_BF16_DENSE_TFLOPS[self.peak_key]


GPU_KINDS = (
    GpuKind("H100", 81559, "H100 SXM", 0.40, ("nvidia-h100", "nvidia-h100-mega-80gb")),
    GpuKind("H200", 143771, "H200", 0.40, ("nvidia-h200",)),
    GpuKind("A100-80GB", 81920, "A100", 0.45, ("nvidia-a100-80gb",)),
    GpuKind("A100", 40960, "A100", 0.45, ("nvidia-tesla-a100",)),
    GpuKind("L40S", 46068, "L40S", 0.35, ("nvidia-l40s",)),
    GpuKind("L4", 23034, "L4", 0.35, ("nvidia-l4", "nvidia-l4-vws")),
    GpuKind("A10G", 23028, "A10G", 0.35, ("nvidia-a10g",)),
)


def gpu_kind(name: str, key: str = "gpu_kind") -> GpuKind:
    """The GPU kind named `name` (its name or an accelerator name, case-insensitive)."""
    for kind in GPU_KINDS:
        if name.lower() in (kind.name.lower(), *kind.accelerators):
            return kind
    names = [k.name for k in GPU_KINDS]
    raise SpecError(f"{key}: no GPU kind {name!r}{closest(name, names)}; known: {names}")


# The GPU the train tasks ask for on a cluster when neither FINETUNE_BENCH_TRAIN_ACCELERATOR (at registration) nor an
# inputs file's `accelerator` names one: an A100, as in the Union benchmark this project reproduces.
DEFAULT_ACCELERATOR = "nvidia-tesla-a100"


def accelerator_name(name: str, key: str = "accelerator") -> str:
    """Flyte's accelerator name for `name`, a GPU kind (H100, ...) or an accelerator name (nvidia-h100, ...)."""
    kind = gpu_kind(name, key=key)
    return name.lower() if name.lower() in kind.accelerators else kind.accelerators[0]


def usable_bytes(memory_bytes: float) -> float:
    """What torch can reserve on a GPU of `memory_bytes`."""
    return memory_bytes - CUDA_CONTEXT_BYTES


def emulated_memory_bytes(args: "TrainingArgs", memory_bytes: float | None) -> float | None:  # noqa: F821
    """A GPU's memory as a run of `args` sees it: its `gpu_memory_cap_gib` where one is set (a GPU of that size,
    emulated), else `memory_bytes`."""
    return args.gpu_memory_cap_gib * GIB if args.gpu_memory_cap_gib else memory_bytes


def capped_gpu(gpu: str, cap_gib: float | str | None) -> str:
    """How a report names a GPU that a run's `gpu_memory_cap_gib` made a smaller one: "NVIDIA H200 capped to 79.6
    GiB"; `gpu` alone without a cap (0, "" or None)."""
    return f"{gpu} capped to {float(cap_gib):g} GiB" if cap_gib and float(cap_gib) else gpu


def describe_gpu(gpu: str, args: "TrainingArgs") -> str:  # noqa: F821
    """`capped_gpu` of a run's settings."""
    return capped_gpu(gpu, args.gpu_memory_cap_gib)


def caps_text(caps: "Iterable[float]") -> str:  # noqa: F821
    """What a plan's target line adds for the runs' `gpu_memory_cap_gib` ("" when none is capped): each predicted
    against the GPU it emulates."""
    capped = sorted({float(cap) for cap in caps if cap})
    if not capped:
        return ""
    return f"; capped to {' / '.join(f'{cap:g}' for cap in capped)} GiB (gpu_memory_cap_gib), predicted against that"
