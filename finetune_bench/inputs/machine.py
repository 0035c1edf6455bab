"""What a local machine cannot train, checked before launch from its GPUs alone (no torch: planning imports it in
images without one): too few GPUs, a GPU asked of a machine without one, a memory cap above the GPU, a condition on
several nodes."""

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.catalog import GIB
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs, swept_axes


def machine_problems(conditions: list[TrainingArgs], gpu_names: list[str], gpu_memory_bytes: float | None) -> list[str]:
    """What could only fail on a machine with `gpu_names` (and that much memory on its first GPU): a condition on more
    GPUs than it has, one that asks for a GPU where there is none (float8, the CUDA allocator's options, a memory cap
    with device 'auto' train on the CPU there), or a memory cap above its GPU's memory; each problem once, in order."""
    names, memory = gpu_names, gpu_memory_bytes
    here = f"this machine has {len(names)} GPU(s)" + (f" ({names[0]})" if names else "")
    problems: dict[str, None] = {}  # in order, each once
    for t in conditions:
        if t.device == "cpu":
            continue
        if not names and t.device == "cuda":
            problems["training_args.device 'cuda': no NVIDIA GPU is visible on this machine; set device 'cpu'"] = None
        if not names and t.device == "auto" and parse_arm(t.arm).float8:
            problems[
                f"arm {t.arm!r}: float8 training needs a CUDA GPU and no NVIDIA GPU is visible on this "
                "machine (device 'auto' trains on the CPU here, where its matmuls are refused); leave float8 out here"
            ] = None
        if not names and t.device == "auto" and t.allocator != "default":
            problems[
                f"training_args.allocator {t.allocator!r}: it configures PyTorch's CUDA caching allocator, and no "
                "NVIDIA GPU is visible on this machine (device 'auto' trains on the CPU here); use allocator 'default'"
            ] = None
        if not names and t.gpu_memory_cap_gib:
            problems[
                f"training_args.gpu_memory_cap_gib {t.gpu_memory_cap_gib:g}: no NVIDIA GPU is visible on this machine, "
                "so the run trains on the CPU, where a cap caps nothing; leave it 0"
            ] = None
        if names and t.num_gpus > len(names):
            problems[
                f"training_args.num_gpus {t.num_gpus}: {here}, and a run on {t.num_gpus} would wait for GPUs that "
                f"never come; set num_gpus to at most {len(names)}, or run it on a cluster (union run --remote)"
            ] = None
        if memory and t.gpu_memory_cap_gib * GIB > memory:
            problems[memory_cap_above(t.gpu_memory_cap_gib, memory, names[0] if names else "this machine's GPU")] = None
    return list(problems)


def check_gpus_here(conditions: list[TrainingArgs], gpu_names: list[str], gpu_memory_bytes: float | None) -> None:
    """A run on this machine, whose GPUs are `gpu_names` (`gpu_memory_bytes` on its first): what could only fail on
    them is refused (`machine_problems`), every problem at once."""
    problems = machine_problems(conditions, gpu_names, gpu_memory_bytes)
    if problems:
        raise SpecError(*problems)


# How far a target GPU's memory may lie from this machine's before a local run's plan predicts for another card: a
# card's memory as nvidia-smi reports it differs from what the driver gives a process by a few hundred MiB.
SAME_GPU_GIB = 2.0


def check_target_is_this_gpu(
    gpu_memory_gib: float, conditions: list[TrainingArgs], gpu_names: list[str], gpu_memory_bytes: float | None
) -> None:
    """A local run (not a dry run) trains on this machine's GPU: a `gpu_memory_gib` (the GPU a plan predicts for) of
    another size, with no `gpu_memory_cap_gib` to make the runs train as on it, would set the plan's verdicts against a
    card the runs never meet. Most likely the cap was meant: refused, naming both."""
    if not gpu_memory_gib or not gpu_names or not gpu_memory_bytes:
        return
    here = gpu_memory_bytes / GIB
    uncapped = [t for t in conditions if t.device != "cpu" and not t.gpu_memory_cap_gib]
    if uncapped and abs(gpu_memory_gib - here) > SAME_GPU_GIB:
        raise SpecError(
            f"gpu_memory_gib {gpu_memory_gib:g} predicts for a {gpu_memory_gib:g} GiB GPU, and the runs train "
            f"uncapped on this {gpu_names[0]} ({here:.1f} GiB): to train as on that card set "
            f"training_args.gpu_memory_cap_gib: {gpu_memory_gib:g}; to predict for it without training, set dry_run: "
            "true"
        )


def check_nodes_here(experiment_args: ExperimentArgs, training_args: TrainingArgs) -> None:
    """A run on this one machine (a local run, `pyflyte run` without `--remote`): a condition on several nodes would
    wait for nodes that never come, each key that asks for them named."""
    swept = experiment_args.num_nodes if isinstance(experiment_args.num_nodes, list) else []
    given = (
        [("training_args.num_nodes", training_args.num_nodes)] if "num_nodes" not in swept_axes(experiment_args) else []
    )
    given += [("experiment_args.num_nodes", value) for value in swept]
    several = [(key, n) for key, n in given if isinstance(n, int) and not isinstance(n, bool) and n > 1]
    if several:
        raise SpecError(
            *(
                f"{key} {n}: this is a local run (pyflyte run without --remote), which has this one machine, and a "
                f"condition on {n} nodes would wait for nodes that never come; run it on a cluster (union run "
                "--remote), set num_nodes 1 (num_gpus GPUs of this machine), or plan it with dry_run: true"
                for key, n in several
            )
        )


def memory_cap_above(cap_gib: float, memory_bytes: float, gpu: str) -> str:
    """The problem of a `gpu_memory_cap_gib` above the GPU's memory."""
    return (
        f"training_args.gpu_memory_cap_gib {cap_gib:g} is above the memory of {gpu} ({memory_bytes / GIB:.1f} "
        "GiB): a cap emulates a smaller GPU; set it to at most that, or 0 for the whole GPU"
    )


def check_cap_fits_target(conditions: list[TrainingArgs], target: "Target") -> None:  # noqa: F821
    """A `gpu_memory_cap_gib` above the memory of the GPU the plan targets (its kind, or the accelerator's)."""
    if not target.memory_bytes:
        return
    for cap in dict.fromkeys(t.gpu_memory_cap_gib for t in conditions):
        if cap * GIB > target.memory_bytes:
            raise SpecError(memory_cap_above(cap, target.memory_bytes, target.name or "the target GPU"))
