"""What an arm's components need of the condition they run in: Liger's kernels, a model type it patches (its loss
kernels, the model's own loss); SwitchBack and float8, a CUDA GPU; Cut Cross-Entropy, a backend that computes the loss
itself and a dtype its kernel takes; a compiled arm, decoder layers that compile. Each check refuses the condition
(or, where the rest of the grid can still run, refuses it alone: `ConditionRefused`) before anything is downloaded,
instead of a run that would crash or silently measure something else. A package an arm needs (torchao,
cut-cross-entropy) is looked up where planning runs, which is the training image."""

from finetune_bench.inputs import software_sets
from finetune_bench.inputs.arms import (
    FLOAT8_INSTALL_HINT,
    FLOAT8_MIN_CAPABILITY,
    FLOAT8_MODULE,
    LOSS_KERNELS,
    Arm,
    default_kernels,
    kernel_switches,
    supported_model_types,
    uncompiled_layers_problem,
)
from finetune_bench.inputs.catalog import BACKENDS, model_type
from finetune_bench.inputs.errors import NOT_RUN, ConditionRefused, SpecError
from finetune_bench.inputs.loss_paths import CCE_CRITERION, CCE_INSTALL_HINT, CCE_MODULE
from finetune_bench.inputs.settings import TrainingArgs


def check_liger(t: TrainingArgs, arm: Arm, where: str) -> None:
    """Liger's kernels where the model type has them and they run; SwitchBack on a GPU."""
    if arm.switchback and t.device == "cpu":
        raise SpecError(f"arm {arm.name!r}{where}: SwitchBack layers need a CUDA GPU, and device is 'cpu'")
    if not arm.liger:
        return
    if set(arm.liger_kernels) & set(LOSS_KERNELS) and t.criterion != "model":
        raise SpecError(
            f"arm {arm.name!r} with criterion {t.criterion!r}{where}: the loss is computed outside the "
            "model, so this Liger loss kernel would never run; use criterion 'model'"
        )
    kind = model_type(t.model_name)
    if kind is not None and kind not in supported_model_types():
        raise ConditionRefused(
            f"arm {arm.name!r}: Liger has no kernels for model type {kind!r} (training_args.model_name "
            f"{t.model_name!r}){where}; Liger patches {supported_model_types()}. {NOT_RUN}"
        )
    missing = [k for k in arm.liger_kernels if kind is not None and k not in kernel_switches(kind)]
    if missing:
        raise ConditionRefused(
            f"arm {arm.name!r}: Liger has no {' / '.join(map(repr, missing))} kernel for model type "
            f"{kind!r}{where}; it has {list(kernel_switches(kind))}"
        )


def check_cut_cross_entropy(training_args: TrainingArgs, arm: Arm, where: str) -> None:
    """Cut Cross-Entropy (the arm component or the criterion `cce`) where it can compute the loss: a backend that
    computes the loss itself, no second loss beside it (another criterion, Liger's loss kernels), a dtype its
    backward kernel takes, and the package installed (looked up where planning runs: the training image)."""
    t = training_args
    if not (arm.cce or t.criterion == CCE_CRITERION):
        return
    record = BACKENDS[t.backend]
    if arm.cce and not record.computes_loss_itself:
        own_loss = [name for name, candidate in BACKENDS.items() if candidate.computes_loss_itself]
        raise SpecError(
            f"arm {arm.name!r} does not run with backend {t.backend!r}{where}: Cut Cross-Entropy computes the loss "
            f"outside the model's forward, and {t.backend!r} takes the loss the model's forward returns; use backend "
            f"{own_loss[0]!r} (backends {own_loss} compute the loss themselves)"
        )
    if arm.cce and record.own_loss_one_gpu_only and t.world_size > 1:
        raise SpecError(
            f"arm {arm.name!r} with backend {t.backend!r} on {t.world_size} GPUs{where}: the Trainer's DDP/FSDP "
            "wrapper owns the forward, and Cut Cross-Entropy calls the decoder alone; use backend 'plain_loop' on "
            "several GPUs"
        )
    if arm.cce and t.criterion not in ("model", CCE_CRITERION):
        raise SpecError(
            f"arm {arm.name!r} with criterion {t.criterion!r}{where}: the arm's Cut Cross-Entropy computes the loss, "
            f"and so would criterion {t.criterion!r}; use criterion 'model' (the arm then replaces the model's loss)"
        )
    if arm.cce and arm.liger and not arm.liger_kernels and not arm.liger_without_loss:
        kind = model_type(t.model_name)
        switched_on = sorted(set(default_kernels(kind)) & set(LOSS_KERNELS)) if kind is not None else []
        if kind is None or switched_on:
            which = (
                f"for model type {kind!r} switch on {switched_on}"
                if kind is not None
                else f"switch on a loss kernel for nearly every model type, and the type of {t.model_name!r} is known "
                "only once it is downloaded"
            )
            raise SpecError(
                f"arm {arm.name!r}{where}: Liger's defaults {which}, which would compute the loss as Cut "
                "Cross-Entropy does; for Liger's layer kernels with CCE's loss use arm 'liger-without-loss+cce' "
                "(or 'liger' with criterion 'cce'), or chosen layer kernels with the arm (e.g. 'liger:rope+cce')"
            )
    if t.dtype == "float32" and t.device != "cpu" and record.trains:
        raise SpecError(
            f"dtype 'float32' with Cut Cross-Entropy{where}: its backward kernel takes float16 or bfloat16 hidden "
            "states on a GPU; use dtype 'bfloat16' (or 'auto', bfloat16 on a GPU)"
        )
    import importlib.util

    # Looked up, not imported: importing it loads torch and Triton, seconds on a machine that only plans.
    if importlib.util.find_spec(CCE_MODULE) is None:
        raise SpecError(
            f"Cut Cross-Entropy (arm {arm.name!r}, criterion {t.criterion!r}){where} needs the package "
            f"cut-cross-entropy, which is not installed here: {CCE_INSTALL_HINT}"
        )


def check_float8(training_args: TrainingArgs, arm: Arm, where: str) -> None:
    """torchao's float8 training where it can run: a full fine-tune (LoRA's adapters train beside frozen weights
    float8 does not convert), no other replacement of the linear layers (SwitchBack), a CUDA device, and torchao
    installed (looked up where planning runs: the training image); on several GPUs the plain loop, which shares the
    converted model itself. The GPU's compute capability (8.9 or newer) is known only on the machine that trains
    (`running.float8.check_float8_runs_here`)."""
    t = training_args
    if not arm.float8:
        return
    if t.lora_rank > 0:
        raise SpecError(
            f"arm {arm.name!r} with lora_rank {t.lora_rank}{where}: float8 training converts the full linear layers "
            "it trains, and LoRA trains adapters beside frozen weights; use lora_rank 0 (a full fine-tune)"
        )
    if arm.switchback:
        raise SpecError(
            f"arm {arm.name!r}{where}: SwitchBack and float8 both replace the linear layers' matmuls; compare them "
            "as two arms"
        )
    if t.world_size > 1 and t.backend != "plain_loop":
        raise SpecError(
            f"arm {arm.name!r} with {t.world_size} GPUs and backend {t.backend!r}{where}: float8 training on several "
            "GPUs runs with backend 'plain_loop', which shares the converted model itself (under FSDP2 its weights "
            "are all-gathered in float8); the Trainer backends share it through accelerate, which the project does "
            "not set up for float8. Set backend 'plain_loop', or num_gpus 1"
        )
    if t.device == "cpu":
        raise SpecError(
            f"arm {arm.name!r}{where}: float8 training needs a CUDA GPU of compute capability "
            f"{'.'.join(map(str, FLOAT8_MIN_CAPABILITY))} or newer, and device is 'cpu'"
        )
    import importlib.util

    if importlib.util.find_spec(FLOAT8_MODULE) is None:
        raise SpecError(
            f"arm {arm.name!r}{where} needs the package torchao, which is not installed here: {FLOAT8_INSTALL_HINT}"
        )


def check_compiled_layers(training_args: TrainingArgs, arm: Arm, where: str) -> None:
    """A compiled arm compiles its decoder layers: refused where FSDP2 with gradient checkpointing and the run's
    transformers (the software set's pin, else the installed release) would leave them uncompiled."""
    import importlib.metadata

    t = training_args
    try:
        pinned = software_sets.parse(t.software_set).get("transformers")
    except SpecError:  # a misspelt set is named by the settings' own check
        return
    version = pinned or importlib.metadata.version("transformers")
    source = "the software set's pin" if pinned else "installed"
    problem = uncompiled_layers_problem(arm, t.gradient_checkpointing, t.sharded_by_fsdp, version, where, source)
    if problem:
        raise ConditionRefused(problem)
