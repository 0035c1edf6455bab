"""TRL's SFTTrainer on prompt/completion data (completion-only loss): the blog's setup.

TRL 1.16 computes the loss with its own chunked LM-head log-probabilities, whatever Liger does.
`criterion: model` (the default) takes the loss from the model's own forward instead, as
transformers' Trainer and TRL before 1.0 did: the baseline is transformers' cross entropy on the
full logits and the liger arm Liger's fused linear cross entropy, as in the blog. `criterion: trl`
keeps TRL's loss for both arms; its liger arm then replaces the layer kernels (RoPE, RMSNorm,
SwiGLU/GeGLU) only. The arm's `cce` component computes the loss with Cut Cross-Entropy from the last hidden
states instead (`trainer_common.cut_cross_entropy_trainer`), Liger's loss kernels off.

`dtype: float16` trains in mixed precision through the Trainer's `fp16` (`trainer_common`): float32 weights.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

# At import, not in `train`: the worker counts them in the run's `imports_s`, not in its other phases.
from transformers import Trainer
from trl import SFTConfig, SFTTrainer

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.running.backends.common import LoadedModel, load_model, profile_after_timed_steps, run_details
from finetune_bench.running.backends.data import (
    check_packing_isolates_examples,
    require_one_batch,
    training_row_lengths,
    with_room_for_a_completion,
)
from finetune_bench.running.backends.evaluation import HeldOutEvaluator
from finetune_bench.running.backends.plain_loop import loss_details
from finetune_bench.running.backends.trainer_common import (
    check_loss_scaling,
    cut_cross_entropy_trainer,
    mixed_precision_details,
    recording_callback,
    recording_trainer,
    trainer_step_function,
    training_arguments,
)
from finetune_bench.running.liger_patching import loss_path
from finetune_bench.sources.datasets import load_training_and_held_out

if TYPE_CHECKING:
    import transformers


def train(
    args: TrainingArgs,
    dataset_dir: Path,
    model_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
    recorder: StepRecorder,
    work_dir: Path,
) -> dict:
    arm = parse_arm(args.arm)
    criterion = arm.loss_criterion(args.criterion)
    with recorder.phase("model_init_s"):
        loaded, trainer_class = _load(args, model_dir, device, dtype, criterion)
        # Read before SFTTrainer wraps the forward with its fused LM head (which it only uses when
        # asked to, with `fused_lm_head=True`; transformers' compute_loss never asks).
        path = loss_path(loaded.model, criterion)
        recorder.attach_model(loaded.model)
    with recorder.phase("data_s"):  # SFTTrainer tokenizes (and packs) the dataset as it is built
        trainer, callback = _trainer(args, dataset_dir, device, dtype, recorder, work_dir, loaded, trainer_class)
        check_loss_scaling(trainer)
    trainer.train()
    scaled = mixed_precision_details(trainer, callback)  # of the training steps, before any profiled one
    profiled = profile_after_timed_steps(
        args, recorder, trainer_step_function(trainer), device, work_dir
    )  # a failure: a detail
    return {**run_details(loaded, path), **loss_details(path, device), **scaled, **profiled}


def _load(
    args: TrainingArgs, model_dir: Path, device: torch.device, dtype: torch.dtype, criterion: str
) -> tuple[LoadedModel, type]:
    """The model (Liger's loss kernels off where another loss is computed) and the SFTTrainer class that computes
    the run's loss."""
    arm = parse_arm(args.arm)
    if criterion == "trl":
        loaded = load_model(args, model_dir, device, dtype, fused_linear_cross_entropy=False, cross_entropy=False)
        trainer_class = SFTTrainer
    elif arm.cce:  # Cut Cross-Entropy computes the loss: Liger's loss kernels stay off
        loaded = load_model(args, model_dir, device, dtype, fused_linear_cross_entropy=False, cross_entropy=False)
        trainer_class = cut_cross_entropy_trainer(SFTTrainer)
    else:
        loaded = load_model(args, model_dir, device, dtype)

        class ModelLossSFTTrainer(SFTTrainer):
            def compute_loss(
                self,
                model: torch.nn.Module,
                inputs: dict[str, torch.Tensor | Any],
                return_outputs: bool = False,
                num_items_in_batch: torch.Tensor | int | None = None,
            ) -> torch.Tensor | tuple[torch.Tensor, Any]:
                inputs["use_cache"] = False
                return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

        trainer_class = ModelLossSFTTrainer
    return loaded, trainer_class


def _trainer(
    args: TrainingArgs,
    dataset_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
    recorder: StepRecorder,
    work_dir: Path,
    loaded: LoadedModel,
    trainer_class: type,
) -> tuple[SFTTrainer, "transformers.TrainerCallback"]:
    """The SFTTrainer of the run on its data, recording every step and running the held-out evaluations, and its
    recording callback."""
    dataset, held_out = load_training_and_held_out(dataset_dir, args.eval_examples)
    # as the other backends train: only examples with a completion token left at max_length (the others, packed
    # together, would make rows with no labelled token)
    dataset = with_room_for_a_completion(dataset, loaded.tokenizer, args.max_seq_length)
    evaluator = HeldOutEvaluator(args, held_out, loaded.tokenizer, device, recorder)
    # packed, several examples share a row (TRL counts the rows): one example is the least that trains
    require_one_batch(len(dataset), 1 if args.packing else args.examples_per_step, args.max_seq_length)
    if args.packing:
        check_packing_isolates_examples(loaded.model)
    config = SFTConfig(
        **training_arguments(args, device, dtype, work_dir),
        max_length=args.max_seq_length,
        packing=args.packing,
        # Best-fit decreasing (TRL's default, named so a TRL default change cannot alter the benchmark):
        # whole examples truncated to max_length, packed into rows of at most max_length; TRL then
        # flattens each batch into one padding-free row with position_ids restarting per example
        # (`padding_free` is implied) and no attention mask. "wrapped" would cut examples and let them
        # attend across boundaries.
        packing_strategy="bfd",
        # Named, not TRL's "auto" (which pads to 128 on Neuron): None pads each batch to its longest example.
        pad_to_multiple_of=args.pad_to_multiple_of or None,
        dataset_num_proc=None,
    )
    callback = recording_callback(recorder, evaluator)
    trainer = recording_trainer(trainer_class, recorder)(
        model=loaded.model,
        args=config,
        train_dataset=dataset,
        processing_class=loaded.tokenizer,
        callbacks=[callback],
    )
    # the rows as TRL made them (tokenized, truncated, packed): what its batches are drawn from
    recorder.record_row_lengths(training_row_lengths(trainer.train_dataset))
    return trainer, callback
