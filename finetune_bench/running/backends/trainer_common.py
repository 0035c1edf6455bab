"""What the Trainer-based backends share: the measuring callback and trainer mixin, and the
TrainingArguments fields that come straight from `TrainingArgs`.

`dtype: float16` trains in mixed precision (`common.trains_mixed_float16`) through the Trainer's own `fp16=True`:
the model's weights are float32 (LoRA: the frozen base float16, the adapters float32; `common.weight_dtype`), and
accelerate runs the forward pass under `torch.autocast(float16)`, scales the loss with a dynamic GradScaler, unscales
the gradients before clipping them, and skips a step whose gradients hold an inf or NaN (with its learning-rate
step). On a CPU accelerate turns `fp16` off without a word (it keeps autocast and the scaler for GPUs), which would
train float32 and record float16: `recording_trainer` turns them on there (CPU autocast takes float16, and
`torch.amp.GradScaler("cpu")` scales). The run records the scale after its last step and the steps skipped
(`mixed_precision_details`).
"""

import contextlib
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.running import faults
from finetune_bench.running.backends.common import CHECKPOINTING_KWARGS
from finetune_bench.running.backends.evaluation import HeldOutEvaluator
from finetune_bench.running.backends.mixed_precision import weight_dtypes

if TYPE_CHECKING:
    import transformers


def training_arguments(args: TrainingArgs, device: torch.device, dtype: torch.dtype, work_dir: Path) -> dict:
    """Keyword arguments common to transformers' TrainingArguments and TRL's SFTConfig."""
    arguments = dict(
        output_dir=str(work_dir / "trainer"),
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type=args.lr_scheduler_type,
        warmup_steps=args.warmup_ratio,  # a float below 1 is a ratio of max_steps
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        optim=args.optim,
        seed=args.seed,
        data_seed=args.seed,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu=device.type == "cpu",
        # Every batch full (as the plain loop's): a step never trains fewer sequences than its batch size says.
        dataloader_drop_last=True,
        logging_steps=1,
        # transformers replaces a NaN/inf loss in its logs by the window's mean by default: we want to see it
        logging_nan_inf_filter=False,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    arguments.update(checkpointing_arguments(args.gradient_checkpointing))
    arguments.update(distributed_arguments(args))
    return arguments


def checkpointing_arguments(enabled: bool) -> dict:
    """Gradient checkpointing as the Trainer's arguments name it (`activation_checkpointing` from transformers 5.23,
    where `gradient_checkpointing` is a deprecated alias that warns), non-reentrant as the plain loop's."""
    from dataclasses import fields

    from transformers import TrainingArguments

    prefix = "activation" if "activation_checkpointing" in {f.name for f in fields(TrainingArguments)} else "gradient"
    checkpointing = {f"{prefix}_checkpointing": enabled}
    if enabled:
        checkpointing[f"{prefix}_checkpointing_kwargs"] = dict(CHECKPOINTING_KWARGS)
    return checkpointing


def distributed_arguments(args: TrainingArgs) -> dict:
    """How the Trainer shares a run on several GPUs (it joins the process group the worker started): DDP, or
    accelerate's FSDP2 wrapping each decoder layer (transformers' `_no_split_modules`) with parameters kept in
    the model's dtype, as the plain loop's `fully_shard` does and as one GPU trains. (With bf16 or fp16 set,
    accelerate's FSDP2 would cast every trainable parameter to float32 and train under a mixed-precision policy:
    twice the memory of the other layouts. The model is already in its dtype, so neither is set.) That leaves
    float16 with FSDP without its autocast and loss scaling, so it is refused (at planning,
    `inputs.condition_checks`, and here); float16 with DDP keeps the Trainer's `fp16`."""
    if args.world_size == 1:
        return {}
    if args.parallelism == "ddp":
        return {"ddp_find_unused_parameters": False, "ddp_bucket_cap_mb": args.ddp_bucket_cap_mb}
    if args.dtype == "float16":
        raise ValueError(
            "dtype 'float16' with parallelism 'fsdp': float16 mixed precision is not run sharded (see "
            "finetune_bench.inputs.condition_checks); use parallelism 'ddp' or dtype 'bfloat16'"
        )
    return {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": True}, "bf16": False, "fp16": False}


def recording_callback(recorder: StepRecorder, evaluator: HeldOutEvaluator) -> "transformers.TrainerCallback":
    """A TrainerCallback that times steps, injects test faults, records the logged loss and runs the held-out
    evaluations (`evaluator`; before the first step and after the steps it is due). It counts the optimizer steps
    the loss scaler skipped (`skipped_steps`: float16 mixed precision; always 0 otherwise)."""
    from transformers import TrainerCallback

    class RecordingCallback(TrainerCallback):
        skipped_steps = 0

        def on_train_begin(self, *_, model: torch.nn.Module | None = None, **__) -> None:
            evaluator.maybe_evaluate(model, 0)
            recorder.begin_training()

        def on_pre_optimizer_step(self, *_, **__) -> None:
            # the optimizer's memory phase: its step, the learning rate's and zeroing the gradients (the Trainer
            # clips the gradients just before, outside any phase)
            recorder.enter_memory_phase("optimizer")

        def on_step_end(
            self,
            _args: "transformers.TrainingArguments",
            state: "transformers.TrainerState",
            _control: "transformers.TrainerControl",
            model: torch.nn.Module | None = None,
            optimizer: torch.optim.Optimizer | None = None,
            **__,
        ) -> None:
            recorder.leave_memory_phase()
            recorder.end_step()
            # accelerate's optimizer knows whether its scaler skipped the step (read without a sync: the scaler's step
            # already waited for its inf check)
            self.skipped_steps += bool(getattr(optimizer, "step_was_skipped", False))
            faults.maybe_inject(state.global_step, model)
            evaluator.maybe_evaluate(model, state.global_step)

        def on_log(
            self,
            _args: "transformers.TrainingArguments",
            state: "transformers.TrainerState",
            _control: "transformers.TrainerControl",
            logs: dict[str, float] | None = None,
            **__,
        ) -> None:
            if logs and "loss" in logs:
                recorder.record_loss(state.global_step, float(logs["loss"]))

    return RecordingCallback()


def recording_trainer(trainer_class: type, recorder: StepRecorder) -> type:
    """`trainer_class` with every micro-batch's tokens counted before it is trained on, its forward (with the loss:
    `compute_loss`) and backward in memory phases of their own, and with `fp16` run as on a GPU where the device is
    a CPU (autocast and the loss scaler accelerate leaves off there: the module's docstring)."""

    class RecordingTrainer(trainer_class):
        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            accelerator = self.accelerator
            if self.args.fp16 and accelerator.device.type == "cpu" and accelerator.scaler is None:
                # accelerate's own fp16 path, with the CPU's autocast and scaler: its `prepare` wraps the model's
                # forward in autocast, `backward` scales the loss, `clip_grad_norm_` unscales, its optimizer's step
                # skips on inf/NaN
                accelerator.native_amp = True
                accelerator.scaler = torch.amp.GradScaler("cpu")

        def training_step(
            self, model: torch.nn.Module, inputs: dict[str, torch.Tensor | Any], *rest, **kwargs
        ) -> torch.Tensor:
            recorder.add_batch(inputs.get("attention_mask"), inputs["input_ids"])
            # the backward's memory phase, in which `compute_loss` (the forward and the loss) is a phase of its own
            with recorder.memory_phase("backward"):
                return super().training_step(model, inputs, *rest, **kwargs)

        def compute_loss(self, *args, **kwargs) -> Any:
            with recorder.memory_phase("forward"):
                return super().compute_loss(*args, **kwargs)

    return RecordingTrainer


def cut_cross_entropy_trainer(trainer_class: type) -> type:
    """`trainer_class` computing the loss with Cut Cross-Entropy (the arm's `cce` component) from the decoder's last
    hidden states, the logits never computed. Normalized as transformers' own causal-LM loss is: with
    `num_items_in_batch` (the labelled tokens of the whole optimizer step, which the Trainer counts for gradient
    accumulation) the sum over the micro-batch divided by it, else the micro-batch's mean; then scaled as
    `Trainer.compute_loss` scales a loss that was normalized that way."""
    from finetune_bench.running.backends.plain_loop import cut_cross_entropy_loss

    class CutCrossEntropyTrainer(trainer_class):
        def compute_loss(
            self,
            model: torch.nn.Module,
            inputs: dict[str, torch.Tensor | Any],
            return_outputs: bool = False,
            num_items_in_batch: torch.Tensor | int | None = None,
        ) -> torch.Tensor:
            if return_outputs:  # the Trainer's own evaluation, which no backend runs (HeldOutEvaluator does)
                raise NotImplementedError("Cut Cross-Entropy computes a loss and no model outputs")
            # The decoder is called directly, not through the model's forward that accelerate wrapped in autocast:
            # float16 mixed precision (float32 weights) needs the autocast here. (bfloat16 runs are left as they
            # were: a bfloat16 model computes in bfloat16 without it.)
            with self.accelerator.autocast() if self.args.fp16 else contextlib.nullcontext():
                if num_items_in_batch is None:
                    return cut_cross_entropy_loss(model, inputs)
                loss = cut_cross_entropy_loss(model, inputs, reduction="sum") / num_items_in_batch
            if self.args.average_tokens_across_devices and self.model_accepts_loss_kwargs:
                loss = loss * self.accelerator.num_processes
            return loss

    return CutCrossEntropyTrainer


def mixed_precision_details(trainer: "transformers.Trainer", callback: "transformers.TrainerCallback") -> dict:
    """What a float16 mixed-precision run records (nothing for another run), as the plain loop records it
    (`mixed_precision.LossScaling.details`): the scale after the last training step, how many training steps the
    scaler skipped for inf/NaN gradients (`callback`: the run's `recording_callback`, which counted them), and the
    dtypes of the weights that trained and of the frozen ones."""
    if not trainer.args.fp16:
        return {}
    return {
        "loss_scale": trainer.accelerator.scaler.get_scale(),
        "loss_scale_skipped_steps": callback.skipped_steps,
        **weight_dtypes(trainer.model),
    }


def check_loss_scaling(trainer: "transformers.Trainer") -> None:
    """Before training: a Trainer asked for `fp16` has accelerate's autocast and loss scaler (without them it would
    train float32 weights in float32 and the run record float16)."""
    accelerator = trainer.accelerator
    if trainer.args.fp16 and (accelerator.scaler is None or not accelerator.native_amp):
        raise RuntimeError(
            f"dtype 'float16': accelerate set up no float16 autocast and loss scaler on {accelerator.device} "
            f"(mixed_precision {accelerator.mixed_precision!r}, distributed type {accelerator.distributed_type})"
        )


def trainer_step_function(trainer: "transformers.Trainer") -> Callable[[], None]:
    """One more optimizer step taken as the Trainer's loop takes one (its micro-batches through `training_step`,
    gradient clipping, optimizer and scheduler steps), outside that loop: for the profiled steps after training,
    which no callback sees and the recorder does not time."""
    batches = None  # built at the first step: inside the profile, whose failure is the run's detail, not its end
    model = trainer.model_wrapped

    def step() -> None:
        nonlocal batches
        if batches is None:
            batches = itertools.chain.from_iterable(itertools.repeat(trainer.get_train_dataloader()))
        for _ in range(trainer.args.gradient_accumulation_steps):
            trainer.training_step(model, next(batches))
        if trainer.args.max_grad_norm > 0:
            trainer.accelerator.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad()

    return step
