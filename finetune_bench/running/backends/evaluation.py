"""Held-out evaluation: the loss of the model being trained on examples it never trains on.

Every backend evaluates the same way, whatever computes its training loss: the model's own forward gives the
logits (no labels passed, so no arm's loss kernel is involved), and the loss is the mean cross entropy, in
float32, per completion token of the held-out examples (tokenized as the plain loop tokenizes: prompt +
completion + EOS, truncated to max_seq_length, the prompt not scored). Before the first step, every
`eval_steps` steps and after the last; inside `StepRecorder.outside_steps`, so no step's time or memory peak
includes it. A compiled model is evaluated through its eager forward (its held-out shapes would only add
compilations).
"""

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.measuring.steps import StepRecorder
from finetune_bench.running.backends.data import IGNORE_INDEX, collate, tokenize_prompt_completion
from finetune_bench.running.liger_patching import unwrap_peft

if TYPE_CHECKING:
    import datasets
    import transformers

logger = logging.getLogger(__name__)


class HeldOutEvaluator:
    """Evaluates a model on the held-out examples when a step calls for it, and files the loss with the recorder."""

    def __init__(
        self,
        args: TrainingArgs,
        held_out: "datasets.Dataset | None",
        tokenizer: "transformers.PreTrainedTokenizerBase",
        device: torch.device,
        recorder: StepRecorder,
    ) -> None:
        self.every = args.eval_steps
        self.last_step = args.max_steps
        # On several GPUs a rank cannot stop evaluating alone: its peers would wait for it in their collectives.
        self.alone = args.world_size == 1
        self.recorder = recorder
        self.device = device
        self.loader = None
        if held_out is not None:
            encoded = tokenize_prompt_completion(held_out, tokenizer, args.max_seq_length)
            if len(encoded) == 0:
                raise ValueError(
                    f"none of the {len(held_out)} held-out examples has a completion token within max_seq_length "
                    f"{args.max_seq_length}: there is nothing to evaluate"
                )
            self.loader = torch.utils.data.DataLoader(
                encoded,
                batch_size=args.per_device_eval_batch_size,
                shuffle=False,
                collate_fn=partial(
                    collate, pad_token_id=tokenizer.pad_token_id, pad_to_multiple_of=args.pad_to_multiple_of
                ),
            )

    @property
    def enabled(self) -> bool:
        return self.loader is not None

    def due(self, step: int) -> bool:
        """Whether to evaluate after optimizer step `step` (0: before the first)."""
        if not self.enabled:
            return False
        return step in (0, self.last_step) or (self.every > 0 and step % self.every == 0)

    def maybe_evaluate(self, model: torch.nn.Module, step: int) -> None:
        """Evaluate after step `step` (0: before training) if it is due, outside the step's measurements. An
        evaluation that runs out of memory ends the evaluations, not the run (its training is measured all the
        same): the recorder keeps why (`eval_error`). On several GPUs it ends the run: one rank cannot stop evaluating
        while its peers go on."""
        if not self.due(step):
            return
        with self.recorder.outside_steps():
            start = time.perf_counter()
            try:
                with self.recorder.memory_phase("evaluation"):
                    loss, tokens = held_out_loss(model, self.loader, self.device)
            except torch.OutOfMemoryError as exc:
                if not self.alone:  # the run ends as out of memory (in the evaluation), every rank stopped
                    raise
                first_line = (str(exc).strip().splitlines() or [""])[0]
                self.recorder.eval_error = (
                    f"out of memory in the held-out evaluation after step {step}, none after it (a smaller "
                    f"per_device_eval_batch_size needs less): {first_line}"
                )
                logger.warning("%s", self.recorder.eval_error)
                self.loader = None  # outside_steps empties the cache once the failed evaluation's frames are gone
                return
            seconds = time.perf_counter() - start
        self.recorder.record_eval(step, loss, tokens, seconds)


def eager_forward(model: torch.nn.Module) -> Callable[..., Any]:
    """What computes the logits: the transformers model inside a peft wrapper (its LoRA layers included), through
    its eager forward if it was compiled in place."""
    inner = unwrap_peft(model)
    return inner.forward if getattr(inner, "_compiled_call_impl", None) is not None else inner


@torch.no_grad()
def held_out_loss(
    model: torch.nn.Module, loader: Iterable[dict[str, torch.Tensor]], device: torch.device
) -> tuple[float, int]:
    """(mean cross entropy per scored token, scored tokens) of `model` over `loader`'s batches; the model is
    left in the mode it was in."""
    forward = eager_forward(model)
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    scored = 0
    try:
        for batch in loader:
            input_ids = batch["input_ids"].to(device)
            logits = forward(
                input_ids=input_ids, attention_mask=batch["attention_mask"].to(device), use_cache=False
            ).logits
            targets = batch["labels"][:, 1:].to(device)  # position i predicts token i + 1
            for row_logits, row_targets in zip(logits[:, :-1], targets, strict=True):
                scored_positions = row_targets != IGNORE_INDEX
                # One sequence at a time, scored tokens only: the float32 copy stays one sequence's size. (Not
                # torch's cross_entropy: Liger's `cross_entropy` switch replaces it process-wide.)
                log_probs = row_logits[scored_positions].float().log_softmax(dim=-1)
                picked = log_probs.gather(-1, row_targets[scored_positions].unsqueeze(-1))
                total -= picked.sum(dtype=torch.float64)
                scored += int(scored_positions.sum())
    finally:
        model.train(was_training)
    if scored == 0:
        raise ValueError("no held-out token is scored: every held-out example's completion starts at its first token")
    return float(total) / scored, scored
