"""Pieces every backend shares: device and dtype resolution, the attention kernel, model and tokenizer loading."""

import contextlib
import re
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from finetune_bench.inputs.arms import Arm, parse_arm, uncompiled_layers_problem
from finetune_bench.inputs.catalog import ATTENTIONS, BACKENDS, BITSANDBYTES_OPTIMIZERS
from finetune_bench.inputs.loss_paths import LossPath
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.profiling import PROFILE_DIR, profile_after_training
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.running.float8 import apply_float8, check_float8_runs_here
from finetune_bench.running.liger_patching import apply_liger, keep_liger_out_of_compiled_graphs, unwrap_peft
from finetune_bench.running.switchback import apply_switchback
from finetune_bench.sources.models import is_random_init, load_model_config

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# torch's non-reentrant checkpointing, stated rather than left to transformers' default (non-reentrant in the
# releases this project runs, reentrant in older ones): what is measured does not change with the release.
CHECKPOINTING_KWARGS = {"use_reentrant": False}


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Checkpoint every decoder layer of a transformers model with `CHECKPOINTING_KWARGS`, through
    `activation_checkpointing_enable` where transformers has it (its `gradient_checkpointing_enable` is then a
    deprecated alias that warns)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=dict(CHECKPOINTING_KWARGS))
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(CHECKPOINTING_KWARGS))


def resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("training_args.device is 'cuda' but no CUDA device is visible")
    return torch.device(requested)


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    """The dtype a run computes in (what it records as its `dtype`); `weight_dtype` says what its weights are."""
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[requested]


def trains_mixed_float16(args: TrainingArgs, dtype: torch.dtype) -> bool:
    """Whether the run trains in float16 mixed precision: `dtype: float16` with a backend that trains. Its forward
    and backward passes run under `torch.autocast(dtype=torch.float16)`, its trainable weights are float32 (the
    master weights the optimizer updates: a float16 weight cannot take updates smaller than its rounding step, and
    AdamW's states overflow float16), and its loss is scaled by a dynamic `torch.amp.GradScaler` (unscaled before
    gradient clipping; a step whose gradients hold an inf or NaN is skipped and the scale shrinks). The plain loop does
    this itself (`mixed_precision.LossScaling`), the Trainers through accelerate (`fp16=True`). bfloat16 needs none of
    it: its range is float32's, and the model is trained in it as it is."""
    return dtype == torch.float16 and BACKENDS[args.backend].trains


def weight_dtype(args: TrainingArgs, dtype: torch.dtype) -> torch.dtype:
    """The dtype the model is loaded in, for a run computing in `dtype`: float32 for a full fine-tune in float16
    mixed precision (`trains_mixed_float16`: the float32 master weights, cast to float16 by autocast per forward).
    With LoRA the frozen base stays float16, as peft and the Trainer's fp16 expect: it is never updated, so it needs no
    master copy, and peft keeps the adapters (what trains) in float32. Otherwise `dtype` itself (`forward_only`
    runs float16 weights: nothing is updated)."""
    if trains_mixed_float16(args, dtype) and args.lora_rank == 0:
        return torch.float32
    return dtype


class AttentionNotRunnable(RuntimeError):
    """The attention kernel a run is pinned to (`TrainingArgs.attention`) cannot run on this device, in this dtype
    or for these inputs."""


# What PyTorch raises when no enabled SDPA backend takes a call (CUDA: "No available kernel. Aborting execution.";
# CPU: "No viable backend for scaled_dot_product_attention was found."); its warnings before it say why.
_NO_SDPA_KERNEL = re.compile(r"No available kernel|No viable backend for scaled_dot_product_attention")


def check_attention_runs_here(attention_name: str, device: torch.device, dtype: torch.dtype) -> None:
    """Raise AttentionNotRunnable when the pinned kernel cannot run on `device` in `dtype`, before anything is
    loaded: planning refuses what the settings alone rule out, but `device: auto` and the GPU's compute capability
    are known only here, on the machine that trains."""
    attention = ATTENTIONS[attention_name]
    kernel = f"attention {attention.name!r} (PyTorch's {attention.sdpa_backend} kernel)"
    if attention.cuda_only and device.type != "cuda":
        raise AttentionNotRunnable(f"{kernel} runs on CUDA GPUs only, and this run's device is {device}")
    if device.type != "cuda":
        return
    dtype_name = str(dtype).removeprefix("torch.")
    if attention.cuda_dtypes and dtype_name not in attention.cuda_dtypes:
        raise AttentionNotRunnable(
            f"{kernel} takes {list(attention.cuda_dtypes)} on a GPU, and this run's dtype is {dtype_name}"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < attention.min_compute_capability:
        needed = ".".join(map(str, attention.min_compute_capability))
        raise AttentionNotRunnable(
            f"{kernel} needs a GPU of compute capability {needed} or newer; {torch.cuda.get_device_name(device)} "
            f"has {capability[0]}.{capability[1]}"
        )


@contextlib.contextmanager
def pinned_attention(attention_name: str, device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Run the block with scaled_dot_product_attention pinned to the attention's one kernel (nothing changes for
    `sdpa` and `eager`). The pin is PyTorch's global SDPA switch, so every call in this thread honours it: the
    forward passes and the backward passes autograd runs from them (its kernels are the forward's own), in the
    Trainers' steps, the evaluations and the profiled steps alike. A call no enabled kernel takes raises
    AttentionNotRunnable naming the attention, never falls back to another kernel."""
    attention = ATTENTIONS[attention_name]
    if not attention.sdpa_backend:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    check_attention_runs_here(attention_name, device, dtype)
    try:
        with sdpa_kernel(getattr(SDPBackend, attention.sdpa_backend)):
            yield
    except RuntimeError as exc:
        if isinstance(exc, torch.OutOfMemoryError) or not _NO_SDPA_KERNEL.search(str(exc)):
            raise
        raise AttentionNotRunnable(
            f"attention {attention.name!r}: PyTorch's {attention.sdpa_backend} kernel cannot run a call of this "
            f"run on {device} in {str(dtype).removeprefix('torch.')} (PyTorch's warnings in the run's log say why: "
            "e.g. an attention mask, which padded batches need, grouped-query attention (fewer key/value heads than "
            f"query heads), or a head size it does not take): {exc}"
        ) from exc


# PyTorch's switch for cuDNN attention plans that serve any length (read once per process, at its first cuDNN
# attention call): the `cudnn_any_length` setting's.
ANY_LENGTH_ENV = "TORCH_CUDNN_SDPA_AVOID_RECOMPILE"


def set_cudnn_any_length(on: bool, environ: MutableMapping[str, str]) -> str:
    """Set PyTorch's any-length switch in `environ` (the run's process's own, before its first step) as the setting
    says: `1`, or removed where the launching environment exported it (a run's attention is what its settings say).
    PyTorch reads it at the process's first cuDNN attention call; a child forked from the fork server (which never
    runs attention) reads it fresh. Returns what the run records."""
    if on:
        environ[ANY_LENGTH_ENV] = "1"
        return f"on ({ANY_LENGTH_ENV}=1)"
    inherited = environ.pop(ANY_LENGTH_ENV, None)
    return "off" if inherited is None else f"off ({ANY_LENGTH_ENV}={inherited!r} removed)"


def attention_details(attention_name: str) -> dict[str, str]:
    """What a run records of its attention: the setting and the SDPA kernel it ran on."""
    attention = ATTENTIONS[attention_name]
    if attention.attn_implementation != "sdpa":
        kernel = f"none ({attention.attn_implementation} attention)"
    else:
        kernel = attention.sdpa_backend or "chosen by PyTorch per call"
    return {"attention": attention.name, "sdpa_kernel": kernel}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    random_init: bool
    liger_patches: dict[str, int] = field(default_factory=dict)
    switchback_layers: int = 0
    float8_layers: int = 0
    # FSDP2 all-gathers the float8 layers' weights in float8 (several GPUs, FSDP2)
    float8_all_gather: bool = False


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
    """Load (or randomly initialise, seeded) the model on `device`, and apply Liger if the arm asks. `dtype` is the
    dtype the run computes in; the weights are loaded in `weight_dtype` (float32 master weights for float16 mixed
    precision)."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_optimizer_device(args, device)  # every backend loads through here: fail before the load
    arm = parse_arm(args.arm)
    if arm.float8:
        check_float8_runs_here(device)
    # planning refuses it with the release it knows of; a software set's import could still differ
    uncompiled = uncompiled_layers_problem(
        arm,
        args.gradient_checkpointing,
        args.sharded_by_fsdp,
        transformers.__version__,
        source="imported",
    )
    if uncompiled:
        raise RuntimeError(uncompiled)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    random_init = is_random_init(model_dir)
    torch.manual_seed(args.seed)
    attn_implementation = ATTENTIONS[args.attention].attn_implementation
    config = load_model_config(model_dir, args.model_config_overrides)  # the run's model_config_overrides applied
    dtype = weight_dtype(args, dtype)
    if random_init:
        # Built directly on the device: initialising billions of parameters on a CPU takes minutes.
        with device:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, config=config, dtype=dtype, device_map={"": device}, attn_implementation=attn_implementation
        )
    loaded_implementation = getattr(model.config, "_attn_implementation", None)
    if loaded_implementation != attn_implementation:  # a pinned SDPA kernel would never be called
        raise AttentionNotRunnable(
            f"attention {args.attention!r} asks transformers for {attn_implementation!r} attention, and the model "
            f"loaded with {loaded_implementation!r}"
        )
    loaded = LoadedModel(model=model, tokenizer=tokenizer, random_init=random_init)
    apply_arm(loaded, arm, sharded=args.sharded_by_fsdp, **liger_flags)
    return loaded


def apply_arm(loaded: LoadedModel, arm: Arm, sharded: bool = False, **liger_flags: bool) -> None:
    """Switch on what the arm names, in place: SwitchBack layers, then Liger's kernels (the arm's choice, then the
    backend's `liger_flags`), then float8 linear layers (Liger's SwiGLU still calls the MLP's linear layers, which
    float8 then runs; `sharded`: FSDP2 is to all-gather their weights in float8), then torch.compile (lazy: it
    compiles what the model has become by its first forward, LoRA adapters or gradient checkpointing included;
    Liger's kernels run eagerly between its graphs)."""
    model = loaded.model
    if arm.switchback:
        loaded.switchback_layers = apply_switchback(model)
    if arm.liger:
        flags = {**arm.liger_flags(model.config.model_type), **liger_flags}
        loaded.liger_patches = apply_liger(model, **flags)
    if arm.float8:
        loaded.float8_layers = apply_float8(model, fsdp_float8_all_gather=sharded)
        loaded.float8_all_gather = sharded
    if arm.compile:
        if arm.liger:  # traced by dynamo, Liger's kernels gave wrong losses (see keep_liger_out_of_compiled_graphs)
            keep_liger_out_of_compiled_graphs()
        model.compile()


# The graph-break reasons a compiled run's details tell (the commonest first).
COMPILE_REASONS_TOLD = 3


def compile_details() -> dict:
    """What torch.compile made of the run so far, from dynamo's counters (the run's child is a process of its own):
    how many graphs it compiled, and its graph breaks with the commonest reasons' first lines (what dynamo could
    not trace runs eagerly between its graphs)."""
    try:  # dynamo's counters are torch's private API: a change there costs these details, not the measured run
        from torch._dynamo.utils import counters

        breaks = counters["graph_break"]
        reasons = "; ".join(
            f"{(str(reason).strip().splitlines() or [''])[0][:160]} (×{n})"
            for reason, n in breaks.most_common(COMPILE_REASONS_TOLD)
        )
        return {
            "compile_graphs": int(counters["stats"]["unique_graphs"]),
            "compile_graph_breaks": int(sum(breaks.values())),
            "compile_graph_break_reasons": reasons,
        }
    except Exception as exc:  # said in the run's details
        return {"compile_details_error": f"dynamo's counters could not be read: {exc!r}"}


def run_details(loaded: LoadedModel, loss_path: LossPath) -> dict:
    """What every backend reports about the model it trained (the worker files it in the result)."""
    model = loaded.model
    # compiled before a LoRA wrapper was put around it: look inside peft's wrapper
    compiled = bool(getattr(unwrap_peft(model), "_compiled_call_impl", None))
    return {
        "loss_path": loss_path.name,
        "liger_patches": loaded.liger_patches,
        "switchback_layers": loaded.switchback_layers,
        "float8_layers": loaded.float8_layers,
        "float8_all_gather": loaded.float8_all_gather,
        "compiled": compiled,
        **(compile_details() if compiled else {}),
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
    with recorder.phase("profile_s"):
        return profile_after_training(
            step, args.profile_steps, device, work_dir / PROFILE_DIR, alone=args.world_size == 1
        )
