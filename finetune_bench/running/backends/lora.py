"""LoRA through peft: freeze the loaded model and train low-rank adapters (`TrainingArgs.lora_rank` > 0).

Applied after `load_model`, so Liger's kernels patch the base model first: peft's wrapper calls the
wrapped model (its patched forward and its Liger modules) and only replaces the targeted Linear layers by
LoRA layers that hold the original Linear. Liger's SwiGLU MLP calls its `gate_proj` / `up_proj` /
`down_proj` submodules, so adapters on them run; Liger's fused linear cross entropy reads the LM head's
weight directly, so an adapter on the LM head would be skipped (refused below).

With `dtype: float16` the frozen base stays float16 (`common.weight_dtype`: nothing updates it, so it needs no
float32 master copy) and peft keeps the adapters in float32, what the Trainer's fp16 mixed precision expects: its
autocast runs the base's matmuls in float16 and its loss scaler unscales the adapters' float32 gradients (a float16
gradient it would refuse: "Attempting to unscale FP16 gradients").
"""

import torch

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running.liger_patching import liger_loss_kernels

ALL_LINEAR = "all-linear"  # peft's name for every Linear layer but the output layer


def target_modules(spec: str) -> str | list[str]:
    """peft's `target_modules` from `TrainingArgs.lora_target_modules`: "all-linear" as it is, else a list."""
    if spec == ALL_LINEAR:
        return spec
    return [name.strip() for name in spec.split(",")]


def apply_lora(model: torch.nn.Module, args: TrainingArgs) -> torch.nn.Module:
    """The peft model with rank-`args.lora_rank` adapters on `args.lora_target_modules`; every other
    weight frozen. Adapter weights follow peft's defaults (A random, B zero: training starts at the base
    model's loss; adapters of a 16-bit model are kept in float32)."""
    from peft import LoraConfig, TaskType, get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=target_modules(args.lora_target_modules),
    )
    fused_loss = "fused_linear_cross_entropy" in liger_loss_kernels(model)
    peft_model = get_peft_model(model, config)
    if fused_loss and isinstance(peft_model.get_base_model().get_output_embeddings(), BaseTunerLayer):
        raise RuntimeError(
            f"lora_target_modules {args.lora_target_modules!r} puts an adapter on the LM head, which Liger's "
            "fused linear cross entropy would skip (it multiplies by the LM head's weight directly)"
        )
    return peft_model


def adapters_trained(model: torch.nn.Module) -> str:
    """`trained/total` LoRA B matrices that are no longer zero: peft starts every B at zero, so one that is
    still zero after training got no update (e.g. no gradient reached it)."""
    b_weights = [p for name, p in model.named_parameters() if "lora_B" in name]
    trained = sum(bool(torch.count_nonzero(p)) for p in b_weights)
    return f"{trained}/{len(b_weights)}"
