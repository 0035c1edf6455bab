"""The `float8` arm component: torchao's float8 training (`torchao.float8.convert_to_float8_training`).

Each eligible linear layer of the decoder becomes torchao's `Float8Linear`: its three matmuls (forward, the input's
and the weight's gradients) run in float8 with dynamic, tensor-wise scales, its weight kept (and updated by the
optimizer) in the model's dtype. The LM head stays in that dtype, as torchao's recipes leave it (its matmul is the
loss's input, where float8's rounding shows most), and so does any layer whose dimensions float8's matmul does not
take (a multiple of 16 each). Float8 matmuls need a GPU of compute capability 8.9 or newer; torchao's float8 is
meant to run under torch.compile, which fuses its casts and scales into the neighbouring kernels.
"""

import torch

from finetune_bench.inputs.arms import FLOAT8_MIN_CAPABILITY


class Float8NotRunnable(RuntimeError):
    """The float8 component cannot run here (the device, the GPU's compute capability, or a model with no layer
    float8's matmul takes)."""


def check_float8_runs_here(device: torch.device) -> None:
    """Raise Float8NotRunnable on a device without float8 matmuls, before anything is loaded: planning refuses
    device 'cpu', but `device: auto` and the GPU's compute capability are known only on the machine that trains."""
    if device.type != "cuda":
        raise Float8NotRunnable(f"float8 training needs a CUDA GPU, and this run's device is {device}")
    capability = torch.cuda.get_device_capability(device)
    if capability < FLOAT8_MIN_CAPABILITY:
        needed = ".".join(map(str, FLOAT8_MIN_CAPABILITY))
        raise Float8NotRunnable(
            f"float8 training needs a GPU of compute capability {needed} or newer (float8 matmuls: an H100, an L4, "
            f"...); {torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}"
        )


def float8_eligible(module: torch.nn.Module, lm_head: torch.nn.Module | None) -> bool:
    """A linear layer float8 training converts: not the LM head, both dimensions multiples of 16."""
    return (
        type(module) is torch.nn.Linear
        and module is not lm_head
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def apply_float8(model: torch.nn.Module, fsdp_float8_all_gather: bool = False) -> int:
    """Convert the model's eligible linear layers to float8 training, in place; how many were converted.
    `fsdp_float8_all_gather`: the model is to be sharded with FSDP2, which then all-gathers the converted
    layers' weights in float8 (half the bytes of bf16), cast from each rank's shard with one scale per weight
    (`precompute_float8_scales` after each optimizer step computes them all at once), as torchao's FSDP2 recipe does."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    lm_head = model.get_output_embeddings()
    convert_to_float8_training(
        model,
        config=Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_float8_all_gather),
        module_filter_fn=lambda module, _fqn: float8_eligible(module, lm_head),
    )
    converted = sum(isinstance(module, Float8Linear) for module in model.modules())
    if converted == 0:
        raise Float8NotRunnable(
            "float8 training converted no linear layer: none but the LM head has both dimensions multiples of 16"
        )
    return converted


def precompute_float8_scales(module: torch.nn.Module) -> None:
    """After an optimizer step of a model sharded with FSDP2's float8 all-gather: every converted weight's scale for
    the next all-gather, from one all-reduce of their maxima instead of one per layer (torchao's
    `precompute_float8_dynamic_scale_for_fsdp`)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(module)
