"""Pieces every backend shares: device and dtype resolution, model and tokenizer loading."""

from dataclasses import dataclass, field
from pathlib import Path

import torch

from finetune_bench import sources
from finetune_bench.liger import apply_liger
from finetune_bench.spec import TrainingArgs

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


def load_model(
    args: TrainingArgs, model_dir: Path, device: torch.device, dtype: torch.dtype, **liger_flags: bool
) -> LoadedModel:
    """Load (or randomly initialise, seeded) the model on `device`, and apply Liger if the arm asks."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    random_init = sources.is_random_init(model_dir)
    torch.manual_seed(args.seed)
    if random_init:
        config = AutoConfig.from_pretrained(model_dir)
        # Built directly on the device: initialising billions of parameters on a CPU takes minutes.
        with device:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map={"": device})
    loaded = LoadedModel(model=model, tokenizer=tokenizer, random_init=random_init)
    if args.use_liger:
        loaded.liger_patches = apply_liger(model, **liger_flags)
    return loaded


def run_details(loaded: LoadedModel, loss_path: str) -> dict:
    """What every backend reports about the model it trained (the worker files it in the result)."""
    model = loaded.model
    return {
        "loss_path": loss_path,
        "liger_patches": loaded.liger_patches,
        "random_init": loaded.random_init,
        "attn_implementation": str(getattr(model.config, "_attn_implementation", "")),
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
    }
