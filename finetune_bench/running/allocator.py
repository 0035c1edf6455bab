"""The CUDA caching allocator's configuration a training child starts with (`TrainingArgs.allocator`).

PyTorch reads it from the environment once, when the allocator starts, so the launcher writes it into the child's
environment (`running.launch.child_env`, which every run starts through, one GPU or a rank of several) and the
child checks that it got what its settings say before CUDA starts. Options other than `expandable_segments` that
the launching environment sets are kept; `expandable_segments` is the run's setting, whatever that environment
said.
"""

from collections.abc import Mapping, MutableMapping

# Where PyTorch reads the allocator's options: the first of these that is set (PYTORCH_ALLOC_CONF is the newer
# name, PYTORCH_CUDA_ALLOC_CONF the one every PyTorch version reads).
ALLOC_CONF_ENVS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
DEFAULT_ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments"
# The option that turns it on, in PyTorch's spelling (its parser takes True or False).
EXPANDABLE_SEGMENTS_ON = f"{EXPANDABLE_SEGMENTS}:True"


class AllocatorMismatch(RuntimeError):
    """The child's environment does not configure the allocator its settings ask for."""


def alloc_conf(environ: Mapping[str, str]) -> str:
    """The allocator options PyTorch reads from `environ` ("" when none is set)."""
    return next((environ[name] for name in ALLOC_CONF_ENVS if name in environ), "")


def _options(conf: str) -> list[str]:
    return [option.strip() for option in conf.split(",") if option.strip()]


def _option_name(option: str) -> str:
    return option.split(":", 1)[0].strip()


def merged_alloc_conf(allocator: str, inherited: str) -> str:
    """`inherited`'s options without its `expandable_segments` one, and `expandable_segments:True` when
    `allocator` is `expandable_segments`."""
    kept = [option for option in _options(inherited) if _option_name(option) != EXPANDABLE_SEGMENTS]
    if allocator == EXPANDABLE_SEGMENTS:
        kept.append(EXPANDABLE_SEGMENTS_ON)
    return ",".join(kept)


def set_allocator(env: MutableMapping[str, str], allocator: str) -> str:
    """Write `allocator` into a child's environment `env` (in place): the merged options under every name of
    `ALLOC_CONF_ENVS` that `env` sets (PYTORCH_CUDA_ALLOC_CONF when it sets none), every name removed when no
    option is left. Returns what the environment said of `expandable_segments` before, when the run's setting
    replaced it ("" otherwise), for the launcher to log."""
    inherited = alloc_conf(env)
    replaced = [
        option
        for option in _options(inherited)
        if _option_name(option) == EXPANDABLE_SEGMENTS
        and (allocator != EXPANDABLE_SEGMENTS or option.replace(" ", "") != EXPANDABLE_SEGMENTS_ON)
    ]
    merged = merged_alloc_conf(allocator, inherited)
    names = [name for name in ALLOC_CONF_ENVS if name in env] or [DEFAULT_ALLOC_CONF_ENV]
    for name in ALLOC_CONF_ENVS:
        env.pop(name, None)
    if merged:
        env.update(dict.fromkeys(names, merged))
    return ",".join(replaced)


def allocator_in(environ: Mapping[str, str]) -> str:
    """The `TrainingArgs.allocator` value that `environ` configures."""
    on = any(option.replace(" ", "") == EXPANDABLE_SEGMENTS_ON for option in _options(alloc_conf(environ)))
    return EXPANDABLE_SEGMENTS if on else "default"


def check_allocator(allocator: str, environ: Mapping[str, str]) -> None:
    """Raise AllocatorMismatch unless `environ` configures `allocator` (and its names agree): a child started
    other than through the launcher's environment would otherwise measure an allocator its record does not name."""
    values = {name: environ[name] for name in ALLOC_CONF_ENVS if name in environ}
    if len(set(values.values())) > 1:
        raise AllocatorMismatch(f"the allocator's options disagree between {values}: PyTorch reads only the first")
    got = allocator_in(environ)
    if got != allocator:
        shown = ", ".join(f"{name}={value!r}" for name, value in values.items()) or "no allocator options"
        raise AllocatorMismatch(
            f"training_args.allocator is {allocator!r}, and this process started with {shown} (allocator {got!r})"
        )


class MemoryCapAboveGpu(RuntimeError):
    """`gpu_memory_cap_gib` emulates a GPU larger than the one the run has."""


def cap_memory(device: "torch.device", cap_gib: float) -> float:  # noqa: F821
    """Let torch's caching allocator on `device` reserve what a GPU of `cap_gib` GiB leaves it (the card's memory
    less the CUDA context, `prediction.gpus.usable_bytes`), as `TrainingArgs.gpu_memory_cap_gib` says: beyond it an
    allocation runs out of memory as on such a card. Returns the fraction of the device given to torch. Call before
    the first allocation on `device`. Raises MemoryCapAboveGpu when the device has less than that."""
    import torch

    from finetune_bench.prediction.gpus import GIB, usable_bytes

    total = torch.cuda.get_device_properties(device).total_memory
    allowed = usable_bytes(cap_gib * GIB)
    if allowed > total:
        raise MemoryCapAboveGpu(
            f"training_args.gpu_memory_cap_gib {cap_gib:g} emulates a GPU larger than this one "
            f"({torch.cuda.get_device_name(device)}, {total / GIB:.1f} GiB that torch can use): set it to at most "
            "this GPU's memory, or 0 for the whole GPU"
        )
    fraction = allowed / total
    # torch takes an index or a device with one: one process on one GPU has a bare "cuda" (its current device)
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction
