"""The memory model's FSDP2 terms (the plain loop's FSDP2): which FSDP2 runs it counts, and what one rank holds at
each point of the backward pass where its memory can peak, part by part. `memory.predict_memory` adds the shards of
the weights, gradients and optimizer states, takes the largest moment and adds the allocator's reserve under FSDP2
(`memory.FSDP2_ALLOCATOR_OVERHEAD`).

With FSDP2 (the plain loop's: `fully_shard` on each decoder layer, then on the module of the model and its loss,
parameters in the model's dtype; what follows is read from torch's `distributed/fsdp/_fully_shard`), each GPU keeps
1/world_size of the weights, of the optimizer states and of the gradients (a layer's reduce-scatter writes its shard
of them into one buffer, which the sharded gradients are views of, kept until the optimizer's zero_grad), and gathers
the rest when it needs it:

- the root module's own parameters (the embedding, the final norm, the LM head): gathered whole when the forward pass
  starts and, since the root is not resharded after its forward, kept gathered until its post-backward at the end
  of the backward pass. Its gradients stay unsharded until then: the LM head's from the loss's backward on (from
  the forward pass with Liger's fused loss), the embedding's last; their reduce-scatter copies them into its input
  before freeing them;
- a decoder layer: gathered for its forward (an all-gather buffer copied out into the parameters) and freed after
  it; gathered again when the gradient reaches it, its recomputed forward (gradient checkpointing) using the same
  parameters, while the next layer of the backward pass is prefetched (its all-gather buffer) and the previous
  layer's reduce-scatter input (a copy of its unsharded gradients) is kept until this layer's reduce-scatter.

The backward pass's moment is then the largest of three points: its start (the loss's backward, as one GPU counts
it, the root gathered and the last layer prefetched by the root's pre-backward hook); each decoder layer's backward
(the inputs of the layers not yet done, or their saved activations without checkpointing, the layer rebuilt and its
backward's own transient (`layer_backward_bytes`), three layers' worth of gathered parameters, prefetched parameters
and reduce-scatter input, the root gathered with the LM head's gradient, and the shards of the gradients reduced so
far); and its end (the root's parameters and gradients whole, every shard of the gradients). With transformers' loss
(its float32 logits) the start is the largest; with Liger's fused loss a decoder layer's backward: near the end of
the backward pass where the shards of the reduced gradients grow faster than the layers' kept inputs shrink (short
sequences), near its start otherwise. The forward pass (a layer gathered and the all-gather buffer kept for the next
one's) holds less than the start of the backward pass. The optimizer step holds one GPU's step over world_size: the
shards and the step's temporaries. Shards are counted as 1/world_size of each parameter, without the padding of its
first dimension to a multiple of world_size. Several nodes are counted as one (one flat group of ranks; not
measured). Not modelled (NoPrediction): the Trainers' FSDP2 (accelerate's `fully_shard`: which modules it shards,
whether the root stays gathered; LoRA runs on the Trainer only, so LoRA under FSDP2 too) and gradient accumulation
(the unsharded gradients each layer accumulates between micro-batches).
"""

from typing import TYPE_CHECKING

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.prediction.shapes import ModelShape, NoPrediction

if TYPE_CHECKING:  # memory imports this module; a Step is only read here
    from finetune_bench.prediction.memory import Step


def fsdp2_modelled(args: TrainingArgs) -> None:
    """NoPrediction for the FSDP2 runs whose terms the model does not count: the plain loop's FSDP2 is counted (every
    rank's share the same on one node or several: one flat group of `world_size` ranks), without gradient
    accumulation."""
    if args.backend != "plain_loop":
        # LoRA runs on the Trainer only (hf_trainer), so this also leaves out LoRA under FSDP2.
        raise NoPrediction(
            f"a run on {args.world_size} GPUs with FSDP2 through backend {args.backend!r}: accelerate's fully_shard "
            "(which modules it shards, whether the root module's parameters stay gathered from the forward pass to "
            "the end of the backward pass) is not modelled; the plain loop's FSDP2 is"
        )
    if args.gradient_accumulation_steps > 1:
        raise NoPrediction(
            f"a run on {args.world_size} GPUs with FSDP2 and gradient accumulation: the unsharded gradients every "
            "layer accumulates between micro-batches (reduce-scattered only by the last) are not modelled"
        )


def layer_backward_bytes(shape: ModelShape, step: "Step") -> float:
    """What one decoder layer's backward pass allocates at its largest, per token, beside what the layer saved: the
    gradient reaching the layer (a·h, the residual stream's) and, in the MLP's backward (the largest: attention's
    gradients come once the MLP's saved tensors are freed), down_proj's input gradient (a·i) and, with
    transformers' SwiGLU, the gradients of its two factors while that one is alive, less the product freed (a·i
    more; Liger's SwiGLU writes them into the gate and up outputs it saved). Counted under FSDP2, where a layer's
    backward is the peak; one GPU's count leaves it out (its checkpointed runs were measured up to 4.8 % above)."""
    a, h, i = step.activation_bytes, shape.hidden_size, shape.intermediate_size
    return a * h + (1 if "swiglu" in step.kernels else 2) * a * i


def fsdp2_backward_points(
    shape: ModelShape, step: "Step", per_layer: float, loss_kept: float, loss_peak: float, other: float, batch: float
) -> dict[str, dict[str, float]]:
    """What one rank holds under FSDP2 at each point of the backward pass where its memory can peak, by part (the
    shards of the weights and optimizer states, the same at every point, left out): the loss's backward, each
    decoder layer's backward (from the last layer to the first) and the end (the root module's reduce-scatter).
    Per token `per_layer` bytes of one layer's saved activations; the loss's kept and transient bytes, the other
    tensors at the loss (`other`) and the batch alone (`batch`), as one GPU's step counts them."""
    ranks, t, a, h = step.fsdp_ranks, step.tokens, step.activation_bytes, shape.hidden_size
    layers = shape.num_layers
    layer = shape.layer_parameters * step.weight_bytes  # one decoder layer gathered, or its unsharded gradients
    root = (shape.parameters - layers * shape.layer_parameters) * step.weight_bytes  # embedding, final norm, LM head
    head_gradient = shape.vocab_size * h * step.weight_bytes  # the LM head's (or the tied embedding's), unsharded
    layer_input = a * h * t if step.checkpointing else per_layer * t  # what a layer keeps until its backward

    points = {
        "its start (the loss's backward)": {
            "activations": layers * layer_input,
            "logits_and_loss": loss_kept + loss_peak,
            # the root gathered since the forward pass; the last layer prefetched by the root's pre-backward hook
            "fsdp_unsharded": root + layer,
            "batch_and_other": other,
        }
    }
    recompute = per_layer * t if step.checkpointing else 0  # a layer rebuilt for its backward
    backward = layer_backward_bytes(shape, step) * t
    for done in range(layers):
        left = layers - done  # the layers whose backward has not finished, this one among them
        points[f"decoder layer {left - 1}'s backward"] = {
            "gradients": done * layer / ranks,  # the layers reduced so far, as shards
            "activations": left * layer_input + recompute + backward,
            # the root and its LM head's gradient; this layer gathered, the next one prefetched (not for the first
            # layer), the previous layer's reduce-scatter input (not for the last)
            "fsdp_unsharded": root + head_gradient + layer * (1 + (left > 1) + (done > 0)),
            "batch_and_other": batch,
        }
    points["its end (the root module's reduce-scatter)"] = {
        "gradients": layers * layer / ranks,
        # the root's parameters and unsharded gradients (the embedding's last), the first layer's reduce-scatter input
        "fsdp_unsharded": 2 * root + layer,
        "batch_and_other": batch,
    }
    return points
