"""Switching Liger on for a model instance, and verifying what was actually replaced."""

import inspect
import sys
from collections import Counter

import torch

from finetune_bench.inputs.arms import supported_model_types
from finetune_bench.inputs.loss_paths import LossPath, select_loss_path


class LigerNotApplied(RuntimeError):
    """A liger arm on which nothing was patched: reporting it as a baseline would be a lie."""


def apply_liger(model: torch.nn.Module, **kernel_flags: bool) -> dict[str, int]:
    """Apply Liger's kernels to `model` in place and return what was replaced.

    `kernel_flags` go to Liger's `apply_liger_kernel_to_<model_type>` (e.g. rope, rms_norm, swiglu,
    cross_entropy, fused_linear_cross_entropy). Raises `LigerNotApplied` if the model type is not
    in Liger's table or if no module ended up patched.
    """
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    model_type = getattr(model.config, "model_type", None)
    if model_type not in supported_model_types():
        raise LigerNotApplied(f"Liger has no kernels for model type {model_type!r}")
    _apply_liger_kernel_to_instance(model=model, **kernel_flags)
    report = patch_report(model)
    if not report:
        raise LigerNotApplied(f"Liger was applied to model type {model_type!r} but no module was replaced")
    return report


def patch_report(model: torch.nn.Module) -> dict[str, int]:
    """Count the modules whose forward is Liger's, by Liger class; `rope` counts the patched function."""
    counts: Counter[str] = Counter()
    replaced = liger_loss_kernels(model)
    if "fused_linear_cross_entropy" in replaced:
        counts["fused_linear_cross_entropy_forward"] += 1
    model = unwrap_peft(model)  # the patched modules and modeling module are the wrapped model's
    for module in model.modules():
        owner = getattr(module.forward, "__qualname__", "").split(".")[0]
        if owner.startswith("Liger"):
            counts[owner] += 1
    if "cross_entropy" in replaced:
        counts["cross_entropy"] += 1
    modeling = sys.modules.get(type(model).__module__)
    rope = getattr(modeling, "apply_rotary_pos_emb", None)
    if rope is not None and "liger" in (inspect.getmodule(rope).__name__ if inspect.getmodule(rope) else ""):
        counts["rope"] += 1
    return dict(counts)


def unwrap_peft(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a peft wrapper (PeftModel → LoraModel → the model); any other
    model as it is. Matched by the method peft's wrapper has, so this module does not import peft."""
    get_base_model = getattr(type(model), "get_base_model", None)
    return model.get_base_model() if callable(get_base_model) else model


def _from_liger(function: object) -> bool:
    return (getattr(function, "__module__", "") or "").startswith("liger_kernel")


def liger_loss_kernels(model: torch.nn.Module) -> set[str]:
    """Liger's loss kernels in place for a causal LM's own loss: `fused_linear_cross_entropy` when Liger replaced
    the model's forward (no logits materialized), `cross_entropy` when `cross_entropy=True` replaced torch's cross
    entropy function itself (what transformers' loss calls).

    A peft model (LoRA) is looked through: its own forward is peft's, which calls the wrapped
    transformers model's forward, the one Liger patched."""
    import torch.nn.functional as F

    replaceable = {"fused_linear_cross_entropy": unwrap_peft(model).forward, "cross_entropy": F.cross_entropy}
    return {kernel for kernel, function in replaceable.items() if _from_liger(function)}


def loss_path(model: torch.nn.Module, criterion: str) -> LossPath:
    """The loss path a run of `criterion` takes on `model` (with `criterion: model`, the one the model's own
    forward takes, by what Liger replaced of it)."""
    return select_loss_path(criterion, liger_loss_kernels(model))


def keep_liger_out_of_compiled_graphs() -> list[str]:
    """Make `torch.compile` run Liger's kernels eagerly, between its graphs, instead of tracing them; return the
    Liger autograd Functions this applies to. Call after Liger was applied (its modules imported) and before
    the first compiled call; process-wide, as Liger's own patches are.

    Why: on torch 2.11 / liger-kernel 0.8.5 (an H100), a model whose Liger kernels dynamo traced trained with
    wrong losses at some steps (1,035 where the eager loss was 12.2) or failed with an illegal memory access: the
    fused linear cross entropy breaks dynamo's graph at a `.item()` and its chunk loop of in-place Triton kernels
    is compiled in fragments. With the kernels kept out, the losses matched the eager ones.

    How: dynamo traces a call to an autograd Function's `apply` whatever `apply` is, so every global of Liger's
    modules bound to one of its Functions is replaced by a plain class whose `apply` is the original one under
    `torch.compiler.disable` (every other attribute Liger reads from the class is copied)."""
    functions = {
        value
        for name, module in list(sys.modules.items())
        if name.startswith("liger_kernel") and module is not None
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, torch.autograd.Function)
        and value.__module__.startswith("liger_kernel")
    }
    eager = {}
    for function in functions:
        # Everything Liger reads through the name (flags such as `supports_*`, helpers its chunked losses call)
        # stays reachable; `apply` runs the original Function outside dynamo's graphs.
        namespace = {
            attr: getattr(function, attr)
            for attr in dir(function)
            if not attr.startswith("__") and not attr.startswith("_abc")
        }
        namespace.update(apply=staticmethod(torch.compiler.disable(function.apply)), compiled_eagerly=function)
        eager[function] = type(f"{function.__name__}Eager", (), namespace)
    for name, module in list(sys.modules.items()):
        if name.startswith("liger_kernel") and module is not None:
            for attribute, value in list(vars(module).items()):
                if inspect.isclass(value) and value in eager:
                    setattr(module, attribute, eager[value])
    return sorted(function.__name__ for function in functions)
