"""float16 mixed precision in the plain loop (`dtype: float16`, `common.trains_mixed_float16`): float32 master
weights, the forward pass and the loss under `torch.autocast(float16)`, the loss scaled by a dynamic
`torch.amp.GradScaler`, the gradients unscaled before they are clipped, a step whose gradients hold an inf or NaN
skipped (its learning-rate step too, as the Trainer skips it); and what a run records of it. The Trainers do the same
through accelerate (`fp16=True`). How the loop's losses take float16: `plain_loop`.
"""

import contextlib
from collections.abc import Iterator

import torch

from finetune_bench.inputs.settings import TrainingArgs


class LossScaling:
    """float16 mixed precision in the plain loop, or nothing (`enabled` False: any other run, every call a plain
    one). On: `autocast()` runs the block under `torch.autocast(float16)` (float32 master weights cast per op),
    `backward` scales the loss by a dynamic `torch.amp.GradScaler` before its backward pass, and `step` unscales the
    gradients, clips them (`max_grad_norm`), and steps the optimizer unless a gradient holds an inf or NaN (the
    scaler then skips the step and halves its scale, as transformers' Trainer does with `fp16=True`).

    On several GPUs (DDP) each rank unscales gradients that the all-reduce already made the same on every rank, so
    every rank skips the same steps. FSDP is refused for float16 at planning (`inputs.condition_checks`)."""

    def __init__(self, device: torch.device, enabled: bool, optimizer: torch.optim.Optimizer) -> None:
        self.enabled = enabled
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type, enabled=enabled)
        self.steps_taken = 0  # optimizer steps that ran (a skipped one does not call the optimizer)
        self.skipped_steps = 0
        optimizer.register_step_post_hook(self._count_step)

    def _count_step(self, *_: object) -> None:
        self.steps_taken += 1

    def autocast(self) -> contextlib.AbstractContextManager:
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=torch.float16)

    def backward(self, loss: torch.Tensor) -> None:
        # scaled in float32: a float16 loss times the initial scale (65,536) would overflow float16
        self.scaler.scale(loss.float()).backward()

    def step(self, optimizer: torch.optim.Optimizer, parameters: Iterator[torch.nn.Parameter], max_norm: float) -> bool:
        """Unscale, clip and step; whether the optimizer stepped (False: a step skipped for inf/NaN gradients)."""
        if max_norm > 0:
            self.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        taken = self.steps_taken
        self.scaler.step(optimizer)
        self.scaler.update()
        stepped = self.steps_taken > taken
        self.skipped_steps += not stepped
        return stepped

    def details(self, model: torch.nn.Module) -> dict[str, object]:
        """What the run records of its mixed precision (nothing when off): the scale after the last step, how many
        steps the scaler skipped for inf/NaN gradients (their learning-rate steps skipped too), and the dtypes of
        `model`'s weights."""
        if not self.enabled:
            return {}
        return {
            "loss_scale": self.scaler.get_scale(),
            "loss_scale_skipped_steps": self.skipped_steps,
            **weight_dtypes(model),
        }


def weight_dtypes(model: torch.nn.Module) -> dict[str, str]:
    """The dtypes of `model`'s weights that train (float32 master weights in float16 mixed precision) and of its
    frozen ones (LoRA's float16 base; "" when every weight trains), each a comma-separated list."""
    parameters = list(model.parameters())

    def dtypes(trains: bool) -> str:
        return ",".join(sorted({str(p.dtype).removeprefix("torch.") for p in parameters if p.requires_grad == trains}))

    return {"trainable_dtype": dtypes(True), "frozen_dtype": dtypes(False)}


def check_float16_parallelism(args: TrainingArgs, mixed_float16: bool) -> None:
    """float16 mixed precision is not sharded with FSDP (planning refuses it; `inputs.condition_checks` says why): never
    run it as something else."""
    if mixed_float16 and args.sharded_by_fsdp:
        raise ValueError(
            "dtype 'float16' with parallelism 'fsdp': float16 mixed precision is not run sharded (see "
            "finetune_bench.inputs.condition_checks); use parallelism 'ddp' or dtype 'bfloat16'"
        )
