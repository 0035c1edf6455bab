"""transformers' Trainer on the same tokenized examples as the plain loop.

Both arms take the loss from the model's own forward, so the liger arm uses Liger's fused linear
cross entropy (with Liger's defaults) and the baseline transformers' cross entropy on the logits,
exactly as in the plain loop: the difference between the two backends is the Trainer itself.

With `lora_rank` > 0 the model is wrapped for LoRA (see `finetune_bench.running.backends.lora`) after Liger
patched it, and the Trainer trains the adapters only.

With the arm's `cce` component the Trainer computes the loss with Cut Cross-Entropy from the last hidden states
(`trainer_common.cut_cross_entropy_trainer`), Liger's loss kernels off.

`dtype: float16` trains in mixed precision through the Trainer's `fp16` (`trainer_common`): float32 weights, or with
LoRA a float16 base and float32 adapters.
"""

from functools import partial
from pathlib import Path

import torch

# At import, not in `train`: the worker counts them in the run's `imports_s`, not in its other phases.
from transformers import Trainer, TrainingArguments

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.running.backends.common import load_model, profile_after_timed_steps, run_details
from finetune_bench.running.backends.data import (
    collate,
    require_one_batch,
    tokenize_prompt_completion,
    training_row_lengths,
)
from finetune_bench.running.backends.evaluation import HeldOutEvaluator
from finetune_bench.running.backends.lora import adapters_trained, apply_lora
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
        if arm.cce:  # Cut Cross-Entropy computes the loss: Liger's loss kernels stay off
            loaded = load_model(args, model_dir, device, dtype, fused_linear_cross_entropy=False, cross_entropy=False)
        else:
            loaded = load_model(args, model_dir, device, dtype)
        loaded.model.config.use_cache = False
        if args.lora_rank > 0:  # after load_model: Liger patches the base model, peft wraps the patched model
            loaded.model = apply_lora(loaded.model, args)
        # after freezing: frozen weights get no weight-gradient FLOPs (flops.model_flops_per_token)
        recorder.attach_model(loaded.model)
        # Read before the Trainer runs: with bf16 on a GPU, accelerate wraps the model's forward for autocast,
        # which hides Liger's fused forward from `loss_path` (seen on an H200: a liger arm reported as hf).
        path = loss_path(loaded.model, criterion)
    with recorder.phase("data_s"):
        training, held_out = load_training_and_held_out(dataset_dir, args.eval_examples)
        evaluator = HeldOutEvaluator(args, held_out, loaded.tokenizer, device, recorder)
        data = tokenize_prompt_completion(training, loaded.tokenizer, args.max_seq_length)
        require_one_batch(len(data), args.examples_per_step, args.max_seq_length)
        recorder.record_row_lengths(training_row_lengths(data))
        trainer_class = cut_cross_entropy_trainer(Trainer) if arm.cce else Trainer
        callback = recording_callback(recorder, evaluator)
        trainer = recording_trainer(trainer_class, recorder)(
            model=loaded.model,
            args=TrainingArguments(**training_arguments(args, device, dtype, work_dir)),
            train_dataset=data,
            data_collator=partial(
                collate, pad_token_id=loaded.tokenizer.pad_token_id, pad_to_multiple_of=args.pad_to_multiple_of
            ),
            callbacks=[callback],
        )
        check_loss_scaling(trainer)
    trainer.train()
    scaled = mixed_precision_details(trainer, callback)  # of the training steps, before any profiled one
    profiled = profile_after_timed_steps(
        args, recorder, trainer_step_function(trainer), device, work_dir
    )  # a failure: a detail
    details = {**run_details(loaded, path), **loss_details(path, device), **scaled, **profiled}
    if args.lora_rank > 0:
        details["lora_adapters_trained"] = adapters_trained(loaded.model)
    return details
