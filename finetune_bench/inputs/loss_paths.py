"""The loss paths: how a run computes its loss from the last hidden states, one table for the runs and the memory
model. Each path has the name a run records in `RunResult.loss_path`, which the memory model's prediction of the
condition records too (so predicted and measured join on it), and what the memory model needs to know about it.
Standard library only: the analysis layer reads it without torch.
"""

from collections.abc import Collection
from dataclasses import dataclass

# What computes the loss: a cross entropy on the whole batch's logits (torch's, or Liger's, which writes the
# logits' gradient into its input in the forward pass), the logits a chunk of tokens at a time, never whole
# (Liger's fused linear cross entropy, TRL's chunked LM head), or Apple's Cut Cross-Entropy, whose kernels keep
# each tile of logits in on-chip memory and write only a float32 log-sum-exp per token to the GPU's memory.
TORCH, LIGER, LIGER_FUSED, TRL_CHUNKED, CUT_CROSS_ENTROPY = "torch", "liger", "liger_fused", "trl_chunked", "cce"
# The criterion (and arm component, `finetune_bench.inputs.arms`) that computes the loss with Cut Cross-Entropy
# (`cut_cross_entropy.linear_cross_entropy`, PyPI package cut-cross-entropy), and the module it needs.
CCE_CRITERION = "cce"
CCE_MODULE = "cut_cross_entropy"
CCE_INSTALL_HINT = "pip install cut-cross-entropy"


@dataclass(frozen=True)
class LossPath:
    """One way of computing the loss, and when a run takes it: with `criterion`, and for `criterion: model` (the
    model's own forward computes the loss) when Liger replaced that loss with its kernel `liger_kernel`."""

    name: str  # what a run records in `loss_path`, and the prediction of its condition
    criterion: str
    kernel: str  # TORCH, LIGER, LIGER_FUSED, TRL_CHUNKED or CUT_CROSS_ENTROPY
    float32_logits: bool = False  # the whole logits are upcast to float32 before the loss
    liger_kernel: str | None = None

    @property
    def materializes_logits(self) -> bool:
        """The logits of the whole batch exist at once."""
        return self.kernel in (TORCH, LIGER)


# In the order a path is looked for: a criterion's first path whose Liger kernel (if any) replaced the loss.
# `criterion: model` comes first, its first path Liger's fused forward (chosen over its cross entropy when both are
# on); the criteria are listed in `TrainingArgs.criterion`'s order.
LOSS_PATHS = (
    LossPath("liger_fused_linear_cross_entropy", "model", LIGER_FUSED, liger_kernel="fused_linear_cross_entropy"),
    # transformers upcasts the logits to float32 before calling the cross entropy Liger swapped in
    LossPath("liger_cross_entropy", "model", LIGER, float32_logits=True, liger_kernel="cross_entropy"),
    LossPath("hf_cross_entropy", "model", TORCH, float32_logits=True),
    LossPath("trl_chunked_lm_head", "trl", TRL_CHUNKED),
    LossPath("torch_cross_entropy", "torch_cross_entropy", TORCH, float32_logits=True),
    LossPath("liger_cross_entropy", "liger_cross_entropy", LIGER),  # on the logits as the model returns them
    LossPath("liger_fused_linear_cross_entropy", "liger_fused_linear_cross_entropy", LIGER_FUSED),
    # from the last hidden states and the LM head's weight, the logits never in the GPU's memory
    LossPath(CCE_CRITERION, CCE_CRITERION, CUT_CROSS_ENTROPY),
)


def select_loss_path(criterion: str, liger_loss_kernels: Collection[str] = ()) -> LossPath:
    """The path a run of `criterion` takes; for `criterion: model`, given which of Liger's loss kernels replaced
    the model's loss (`liger_loss_kernels`: none, `cross_entropy`, `fused_linear_cross_entropy`)."""
    for path in LOSS_PATHS:
        if path.criterion == criterion and (path.liger_kernel is None or path.liger_kernel in liger_loss_kernels):
            return path
    raise ValueError(f"no loss path for criterion {criterion!r}")
