"""Pieces every backend shares: device and dtype resolution, model and tokenizer loading."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from finetune_bench.inputs.arms import Arm, parse_arm
from finetune_bench.inputs.catalog import BACKENDS, BITSANDBYTES_OPTIMIZERS
from finetune_bench.inputs.loss_paths import LossPath
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.profiling import PROFILE_DIR, profile_after_training
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.running.liger_patching import apply_liger, keep_liger_out_of_compiled_graphs, unwrap_peft
from finetune_bench.running.switchback import apply_switchback
from finetune_bench.sources.models import is_random_init

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("training_args.device is 'cuda' but no CUDA device is visible")
    return torch.device(requested)


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[requested]


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    random_init: bool
    liger_patches: dict[str, int] = field(default_factory=dict)
    switchback_layers: int = 0


def check_optimizer_device(args: TrainingArgs, device: torch.device) -> None:
    """An 8-bit bitsandbytes optimizer on a device it has no kernels for: planning refuses it for
    device 'cpu', but `auto` resolves only here, on the machine that trains."""
    if args.optim in BITSANDBYTES_OPTIMIZERS and BACKENDS[args.backend].trains and device.type != "cuda":
        raise RuntimeError(
            f"optim {args.optim!r} needs a CUDA device (bitsandbytes), and this run's device is {device}"
        )


def load_model(
    args: TrainingArgs, model_dir: Path, device: torch.device, dtype: torch.dtype, **liger_flags: bool
) -> LoadedModel:
    """Load (or randomly initialise, seeded) the model on `device`, and apply Liger if the arm asks."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    check_optimizer_device(args, device)  # every backend loads through here: fail before the load

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    random_init = is_random_init(model_dir)
    torch.manual_seed(args.seed)
    if random_init:
        config = AutoConfig.from_pretrained(model_dir)
        # Built directly on the device: initialising billions of parameters on a CPU takes minutes.
        with device:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map={"": device})
    loaded = LoadedModel(model=model, tokenizer=tokenizer, random_init=random_init)
    apply_arm(loaded, parse_arm(args.arm), **liger_flags)
    return loaded


def apply_arm(loaded: LoadedModel, arm: Arm, **liger_flags: bool) -> None:
    """Switch on what the arm names, in place: SwitchBack layers, then Liger's kernels (the arm's
    choice, then the backend's `liger_flags`), then torch.compile (lazy: it compiles what the model
    has become by its first forward, LoRA adapters or gradient checkpointing included; Liger's kernels run
    eagerly between its graphs)."""
    model = loaded.model
    if arm.switchback:
        loaded.switchback_layers = apply_switchback(model)
    if arm.liger:
        flags = {**arm.liger_flags(model.config.model_type), **liger_flags}
        loaded.liger_patches = apply_liger(model, **flags)
    if arm.compile:
        if arm.liger:  # traced by dynamo, Liger's kernels gave wrong losses (see keep_liger_out_of_compiled_graphs)
            keep_liger_out_of_compiled_graphs()
        model.compile()


def run_details(loaded: LoadedModel, loss_path: LossPath) -> dict:
    """What every backend reports about the model it trained (the worker files it in the result)."""
    model = loaded.model
    return {
        "loss_path": loss_path.name,
        "liger_patches": loaded.liger_patches,
        "switchback_layers": loaded.switchback_layers,
        # compiled before a LoRA wrapper was put around it: look inside peft's wrapper
        "compiled": bool(getattr(unwrap_peft(model), "_compiled_call_impl", None)),
        "random_init": loaded.random_init,
        "attn_implementation": str(getattr(model.config, "_attn_implementation", "")),
        # LoRA adapters included; `trainable_parameters` is what the optimizer updates (all of them in a
        # full fine-tune, the adapters alone with LoRA)
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "trainable_parameters": int(sum(p.numel() for p in model.parameters() if p.requires_grad)),
    }


def profile_after_timed_steps(
    args: TrainingArgs, recorder: StepRecorder, step: Callable[[], object], device: torch.device, work_dir: Path
) -> dict[str, str]:
    """With `profile`, `profile_steps` more calls of `step` under the profiler, after the timed steps; the run's
    details it adds (`profile_error` when it failed: the run and its measurements stand; on several GPUs the failure
    ends the run). Sampling stops first:
    the driver-side and host-memory peaks are the training's, not the profiler's."""
    if not args.profile:
        return {}
    recorder.end_training()
    return profile_after_training(step, args.profile_steps, device, work_dir / PROFILE_DIR, alone=args.world_size == 1)
