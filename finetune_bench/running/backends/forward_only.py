"""Forward passes only: the plain loop's batches and loss under `torch.inference_mode`, no backward, no
optimizer (the custom-loop notebook's inference comparison: time and peak memory without training).

Data, batches and criteria (the arm's `cce` component included) are the plain loop's (same examples, same
shuffle, `gradient_accumulation_steps` micro-batches per step, so a step sees the tokens a plain-loop step trains
on). The model is in eval mode
(no dropout). With `criterion: model` the model's forward computes the loss: in a liger arm Liger's fused
linear cross entropy (no logits materialized), which Liger's forward uses only in training mode unless it
is asked to (`skip_logits=True`): it is asked, so the liger arm measures the loss path it trains with.
`optim`, the learning-rate settings, `max_grad_norm` and `gradient_checkpointing` have no effect here.

Model FLOPs are the forward pass's (`flops.model_flops_per_token(training=False)`: 2 * N + 4 * L * H * S).
"""

from pathlib import Path

import torch

from finetune_bench.inputs.loss_paths import LIGER_FUSED, LossPath
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.running import faults
from finetune_bench.running.backends.common import profile_after_timed_steps, run_details
from finetune_bench.running.backends.data import collate, require_one_batch, tokenize_prompt_completion
from finetune_bench.running.backends.plain_loop import (
    LossFunction,
    load_for_criterion,
    loss_details,
    loss_function,
    training_batches,
)
from finetune_bench.sources.datasets import load_prompt_completion


def forward_loss(criterion: str, path: LossPath) -> LossFunction:
    """The plain loop's `criterion`; for `model` with Liger's fused forward, that forward with its fused
    loss switched on outside training mode."""
    if criterion == "model" and path.kernel == LIGER_FUSED:
        return lambda model, batch: model(**batch, skip_logits=True).loss
    return loss_function(criterion)


def parameter_checksum(model: torch.nn.Module) -> float:
    """A float64 sum of every weight (accumulated without a float64 copy): changes if any weight does."""
    with torch.no_grad():
        return float(sum(p.sum(dtype=torch.float64) for p in model.parameters()))


def train(
    args: TrainingArgs,
    dataset_dir: Path,
    model_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
    recorder: StepRecorder,
    work_dir: Path,
) -> dict:
    with recorder.phase("model_init_s"):
        loaded, path = load_for_criterion(args, model_dir, device, dtype)
        compute_loss = forward_loss(path.criterion, path)
        model, tokenizer = loaded.model, loaded.tokenizer
        recorder.attach_model(model, training=False)
        model.config.use_cache = False  # one forward per batch: a KV cache would only cost memory
        model.eval()

    with recorder.phase("data_s"):
        data = tokenize_prompt_completion(load_prompt_completion(dataset_dir), tokenizer, args.max_seq_length)
        require_one_batch(len(data), args.examples_per_step, args.max_seq_length)
        # The plain loop's batches: the same ones in the same order for the same seed.
        batches = training_batches(
            data,
            args,
            lambda rows: collate(rows, tokenizer.pad_token_id, args.pad_to_multiple_of),
            pin_memory=device.type == "cuda",
        )

    def forward_step(record: bool) -> torch.Tensor:
        """The forward passes of one step's micro-batches; their mean loss. `record`: a timed step."""
        with torch.inference_mode():
            step_loss = torch.zeros((), device=device)
            for _ in range(args.gradient_accumulation_steps):
                batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
                if record:
                    recorder.add_batch(batch["attention_mask"], batch["input_ids"])
                with recorder.memory_phase("forward"):
                    step_loss += compute_loss(model, batch) / args.gradient_accumulation_steps
        return step_loss

    checksum_before = parameter_checksum(model)  # outside the timed steps
    recorder.begin_training()
    for step in range(1, args.max_steps + 1):
        step_loss = forward_step(record=True)
        recorder.end_step()
        recorder.record_loss(step, float(step_loss))  # after end_step's sync: costs no extra wait
        faults.maybe_inject(step, model)
    profiled = profile_after_timed_steps(
        args, recorder, lambda: forward_step(record=False), device, work_dir
    )  # a failure: a detail

    details = {**run_details(loaded, path), **loss_details(path, device), **profiled}
    details["trainable_parameters"] = 0  # the weights require grad, but nothing here trains them
    # no optimizer: a changed weight would mean something trained (or a fault wrote into it)
    details["weights_unchanged"] = parameter_checksum(model) == checksum_before
    return details
