"""What the Trainer-based backends share: the measuring callback and trainer mixin, and the
TrainingArguments fields that come straight from `TrainingArgs`."""

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.running import faults
from finetune_bench.running.backends.evaluation import HeldOutEvaluator

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
        gradient_checkpointing=args.gradient_checkpointing,
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
    arguments.update(distributed_arguments(args))
    return arguments


def distributed_arguments(args: TrainingArgs) -> dict:
    """How the Trainer shares a run on several GPUs (it joins the process group the worker started): DDP, or
    accelerate's FSDP2 wrapping each decoder layer (transformers' `_no_split_modules`) with parameters kept in
    the model's dtype, as the plain loop's `fully_shard` does and as one GPU trains. (With bf16 or fp16 set,
    accelerate's FSDP2 would cast every trainable parameter to float32 and train under a mixed-precision policy:
    twice the memory of the other layouts. The model is already in its dtype, so neither is set.)"""
    if args.world_size == 1:
        return {}
    if args.parallelism == "ddp":
        return {"ddp_find_unused_parameters": False}
    return {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": True}, "bf16": False, "fp16": False}


def recording_callback(recorder: StepRecorder, evaluator: HeldOutEvaluator) -> "transformers.TrainerCallback":
    """A TrainerCallback that times steps, injects test faults, records the logged loss and runs the held-out
    evaluations (`evaluator`; before the first step and after the steps it is due)."""
    from transformers import TrainerCallback

    class RecordingCallback(TrainerCallback):
        def on_train_begin(self, *_, model: torch.nn.Module | None = None, **__) -> None:
            evaluator.maybe_evaluate(model, 0)
            recorder.begin_training()

        def on_step_end(
            self,
            _args: "transformers.TrainingArguments",
            state: "transformers.TrainerState",
            _control: "transformers.TrainerControl",
            model: torch.nn.Module | None = None,
            **__,
        ) -> None:
            recorder.end_step()
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
    """`trainer_class` with every micro-batch's tokens counted before it is trained on."""

    class RecordingTrainer(trainer_class):
        def training_step(
            self, model: torch.nn.Module, inputs: dict[str, torch.Tensor | Any], *rest, **kwargs
        ) -> torch.Tensor:
            recorder.add_batch(inputs.get("attention_mask"), inputs["input_ids"])
            return super().training_step(model, inputs, *rest, **kwargs)

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
            if num_items_in_batch is None:
                return cut_cross_entropy_loss(model, inputs)
            loss = cut_cross_entropy_loss(model, inputs, reduction="sum") / num_items_in_batch
            if self.args.average_tokens_across_devices and self.model_accepts_loss_kwargs:
                loss = loss * self.accelerator.num_processes
            return loss

    return CutCrossEntropyTrainer


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
