"""Peak GPU memory of one training step, per GPU, with its breakdown: derived from the model's shape and the
condition's settings, tensor by tensor, never from a table of measured runs.

What a step holds at its peak is the larger of two moments:

- the start of the backward pass: weights, optimizer states (built by the first step), the gradients kept
  between micro-batches (only with gradient accumulation: a step's first backward finds none, the
  Trainers and the plain loop set them to None), every activation the forward pass saved for the backward
  pass, and the loss's transient tensors (materialized logits, or Liger's and TRL's chunks);
- the optimizer step: weights, gradients, optimizer states and the step's temporaries (AdamW's foreach
  implementation allocates one square root of the second moments, the size of the trainable weights).

Saved activations are counted per token of one decoder layer from what each operation of transformers'
implementation keeps for its backward pass (the counts below, `a` the activation dtype's bytes):

- RMSNorm (transformers): its float32 upcast of the input (4·h) and the normalized input before the
  weight (a·h). Liger's RMSNorm: the input (a·h) and one float32 rstd (4).
- A linear layer whose weight trains keeps its input (a·in); a frozen one (LoRA's base layers) keeps
  nothing, since no weight gradient is needed. Inputs shared by several layers (q/k/v, gate/up) count once.
- Attention (scaled_dot_product_attention's flash and memory-efficient kernels): q, k, v after RoPE, its
  output (which is also o_proj's input) and a float32 log-sum-exp per head; never the S×S matrix. Grouped
  key/value heads are kept at their own width when no attention mask is needed (every sequence full and
  unpacked); otherwise transformers repeats them to the query width first. Phi-3's v is a view of the
  fused qkv output, which therefore stays alive whole. RoPE keeps only cos and sin (per position).
- SwiGLU MLP (transformers): gate output, SiLU output and up output (3·a·i), and the product (a·i, when
  down_proj trains). Liger's SwiGLU: gate and up only (2·a·i), and the product.
- LoRA (peft, on the Trainer): per adapted layer, dropout's mask (1 byte per input feature when
  lora_dropout > 0) and lora_A's input (a·in under the Trainer's autocast; the adapters are float32),
  and lora_A's output (a·rank).
- Gradient checkpointing: each layer keeps only its input (a·h); one layer's activations are rebuilt at
  a time during the backward pass.

The loss: transformers' cross entropy upcasts the logits to float32 and its backward holds the saved
log-probabilities, their gradient and the logits' gradient at once (12 bytes per vocabulary entry and
token); Liger's cross entropy writes the gradient into its float32 input in the forward pass (a + 4);
Liger's fused linear cross entropy never materializes the logits: chunks of about h/V of the tokens, plus
the input's gradient (a·h per token) and the LM head's weight gradient, both computed in the forward
pass; TRL's chunked loss keeps the hidden states and, in its backward pass, float32 gradients of the
hidden states and of the LM head. Cut Cross-Entropy (`cce`) keeps no logits in the GPU's memory at all: its kernels
hold each tile of logits in on-chip memory. It saves the hidden states for its backward pass (a·h per token),
a float32 log-sum-exp per token and, for its gradient filtering, a float32 mean logit per vocabulary entry; its
backward pass allocates the hidden states' gradient (a·h per token) and the LM head's weight gradient (in the
activation dtype) at once, with an int32 vocabulary ordering.

float16 is trained in mixed precision (`running.backends.common.trains_mixed_float16`). With LoRA the model is the
16-bit one counted above: the frozen base float16, the adapters float32, under the Trainer's float16 autocast (as
bfloat16 LoRA is under its bfloat16 autocast), the loss scaler's state a few scalars. A full fine-tune is not
predicted (NoPrediction): its weights, gradients and AdamW states are float32 (16 bytes a parameter before the
activations), autograd keeps for the backward pass the float16 copy autocast casts of every linear layer's weight (2
bytes a parameter more, until that layer's backward), and the activations are no longer one dtype: the embeddings,
the residual stream and the norms on it stay float32 (the norms' weights are float32, so are their outputs), each
matmul saves the float16 copy autocast makes of its input, and transients such as RoPE's q and k come out float32
(its tables are the residual stream's dtype). tests/prediction/test_memory_float16.py shows what autograd keeps on a
CPU. Counting that tensor by tensor, and checking it against a GPU's peaks, is still to do; a prediction that
counted the run as a 16-bit model would be wrong by gigabytes.

On several GPUs with DDP (the plain loop's `DistributedDataParallel`), each GPU holds what one GPU's training holds
and DDP's gradient buckets: flat buffers the size of the trainable parameters' gradients, allocated when the model is
wrapped and kept for the whole run, into which the backward pass's gradients are copied and all-reduced. With
`ddp_gradient_as_bucket_view` the gradients are views into the buckets (no second copy): the buckets are present at
the backward pass's start, and the optimizer step holds the gradients once (under gradient accumulation the
micro-batches before the last accumulate into separate gradients, counted beside the buckets). With DDP's default
the gradients are separate tensors, and the buckets are counted at both moments. The Trainers' DDP (accelerate's) is
not modelled (NoPrediction).

With FSDP2 (the plain loop's `fully_shard`) each GPU keeps 1/world_size of the weights, gradients and optimizer
states and gathers the rest when it needs it; `fsdp_memory` says which runs are counted and what a rank holds at each
point of the backward pass, the largest of which is the backward pass's moment.

The caching allocator reserves more than the tensors it holds (rounding, and freed blocks it keeps for reuse):
`ALLOCATOR_OVERHEAD`, a share of the allocated peak that depends on where the peak is. It is the one part
set from measurements rather than counted: H100 runs of Llama-3.2-1B and Phi-3-mini (docs/prediction.md)
reserved 1-5 % above their allocated peak when it was the backward pass's start, and 12-17 % when it was the
optimizer step, whose per-parameter temporaries arrive after the backward pass has left the pool cut into
activation-sized blocks that they do not fit. Under FSDP2 the backward pass's share is `FSDP2_ALLOCATOR_OVERHEAD`'s
12.5 %: what decides whether a size fits is the reserve the allocator cannot give back once it reaches its limit
(there it frees its cached blocks and retries). At the edges of Llama-3-8B's sequence frontiers on two and four GPUs
under a 79.6 GiB cap (docs/prediction.md) it separates 6 of the 8 sizes that trained or ran out; the other two lie
within 0.2 % of it on either side (the baseline at 4,096 tokens on four GPUs ran out at 12.65 %, liger at 13,312 on
two trained at 12.46 %): the predicted frontier is right to one step of 1,024 tokens. Below
the limit FSDP2 runs reserve far more than that, since nothing makes the allocator give its cache back: Llama-3-8B's
uncapped runs on two and four GPUs (docs/measurements.md, docs/multi-gpu.md) reserved 29-88 % above their allocated
peak, the ranks of one run up to 22.8 GiB apart (the baseline at 4 × 4,096: 41.7 GiB allocated, 55.8-78.6
reserved); so a predicted reserved peak under FSDP2 is what a GPU must hold, not what an uncapped run reports. FSDP2
allocates its all-gather buffers and its reduce-scatters' outputs on streams of their own, whose freed blocks the
allocator keeps for those streams: a likely part of that reserve, not counted. The CUDA
context and the driver's reserve are outside what torch reserves; `gpus.usable_bytes` subtracts them from the GPU's
memory.
"""

import math
from dataclasses import dataclass, field

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.catalog import BACKENDS
from finetune_bench.inputs.loss_paths import (
    CUT_CROSS_ENTROPY,
    LIGER,
    LIGER_FUSED,
    TRL_CHUNKED,
    LossPath,
    select_loss_path,
)
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.prediction.fsdp_memory import fsdp2_backward_points, fsdp2_modelled
from finetune_bench.prediction.shapes import ModelShape, NoPrediction

# The caching allocator's reserve above the peak of live tensors (its rounding of large blocks to 2 MiB, and the
# freed blocks it holds for reuse), as a share of the allocated peak, by where the peak is (see the docstring).
# Liger's fused linear cross entropy: chunks of next_power_of_2(ceil(tokens / ceil(V / h))) tokens.
# TRL's chunked loss: tiles of this many tokens (trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE).
TRL_TOKEN_CHUNK = 4096
# bitsandbytes' 8-bit AdamW: two 8-bit states, and a float32 absmax per block of 256 values for each.
ADAMW_8BIT_STATE_BYTES = 2 + 2 * 4 / 256

# Attentions that materialize the scores (transformers' eager attention, PyTorch's math SDPA kernel); the model
# counts a fused kernel's saved output and log-sum-exp (FlashAttention, memory-efficient, cuDNN) only.
MATERIALIZED_SCORES_ATTENTIONS = ("eager", "math")
# The allocator reserve's note when the run's allocator is not the one `ALLOCATOR_OVERHEAD` was measured with.
EXPANDABLE_SEGMENTS_NOTE = (
    "allocator expandable_segments: not modelled; the reserve above the allocated peak is the default allocator's "
    "measured share (expandable segments are meant to leave less of it, which has not been measured here)"
)

# The breakdown's parts, in the order a report lists them.
PARTS = (
    "weights",
    "gradients",
    "gradient_buckets",
    "fsdp_unsharded",
    "optimizer_states",
    "activations",
    "logits_and_loss",
    "batch_and_other",
    "optimizer_step_temporaries",
    "allocator_overhead",
)
# Where a peak happens.
BACKWARD_START, OPTIMIZER_STEP, FORWARD = "backward_start", "optimizer_step", "forward"
# The memory phases a run records (`measuring.metrics.MEMORY_PHASES`) whose peak each moment is: the backward pass's
# start is the largest moment before the optimizer step (the forward pass, the loss and the backward pass, whose
# checkpointed layers are rebuilt one at a time); the optimizer step's is its own phase.
MOMENT_PHASES = {
    BACKWARD_START: ("forward", "loss", "backward"),
    OPTIMIZER_STEP: ("optimizer",),
    FORWARD: ("forward", "loss"),
}
ALLOCATOR_OVERHEAD = {BACKWARD_START: 0.05, OPTIMIZER_STEP: 0.15, FORWARD: 0.05}
# Under FSDP2, the reserve the allocator cannot give back when it reaches its limit, at the backward pass (see the
# docstring): measured at the edges of Llama-3-8B's sequence frontiers on two and four GPUs under a 79.6 GiB cap.
FSDP2_ALLOCATOR_OVERHEAD = {**ALLOCATOR_OVERHEAD, BACKWARD_START: 0.125}

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# Why a float16 full fine-tune is not predicted (see the module's docstring).
FLOAT16_FULL_FINE_TUNE = (
    "float16 mixed precision (a full fine-tune) is not modelled: float32 master weights, gradients and optimizer "
    "states, the float16 weight copies autocast casts and autograd keeps for the backward pass, and a float32 "
    "residual stream beside float16 matmul inputs and outputs; what each operation keeps in which dtype has not "
    "been counted or measured"
)


@dataclass
class MemoryPrediction:
    """A predicted peak, per GPU: reserved (what torch.cuda.max_memory_reserved reports) and allocated, the
    moment it happens, the parts it is made of (bytes; they add up to the reserved peak), and the loss path
    predicted (named as the run records it in `loss_path`)."""

    peak_reserved_bytes: float
    peak_allocated_bytes: float
    phase: str
    loss_path: str
    breakdown: dict[str, float] = field(default_factory=dict)
    # What the prediction assumed that a user may want to know (padding, the loss path, ...).
    assumptions: list[str] = field(default_factory=list)
    # The allocated bytes of each moment counted (BACKWARD_START and OPTIMIZER_STEP, or FORWARD alone), the peak
    # being the largest: what a run's memory phases are checked against (`MOMENT_PHASES`). Under FSDP2,
    # BACKWARD_START is the backward pass's largest point (its start, a decoder layer's backward or its end).
    moments: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """What one step trains, resolved from the settings: sizes, precision, which kernels, which loss path."""

    tokens: int  # per micro-batch: batch × sequence length
    activation_bytes: int  # a
    weight_bytes: int  # the model's parameter dtype
    lora_rank: int
    lora_targets: tuple
    lora_dropout: bool
    kernels: frozenset
    loss_path: LossPath
    checkpointing: bool
    accumulation: bool
    optim: str
    weight_decay: bool
    repeated_kv: bool
    trains: bool  # False: forward passes only (no backward, no optimizer)
    ddp: bool = False  # DDP over several GPUs (the plain loop's): gradient buckets
    gradients_in_buckets: bool = False  # ddp_gradient_as_bucket_view: the gradients are views into the buckets
    fsdp_ranks: int = 1  # FSDP2 (the plain loop's) over this many ranks: every shard 1/fsdp_ranks; 1: no FSDP2


def active_kernels(args: TrainingArgs, model_type: str) -> frozenset:
    """The Liger kernels a condition switches on (none outside a liger arm)."""
    return frozenset(parse_arm(args.arm).liger_kernel_names(model_type))


def resolve_step(args: TrainingArgs, shape: ModelShape, sequences_full: bool) -> Step:
    """The step a condition trains; NoPrediction for what the model does not cover."""
    arm = parse_arm(args.arm)
    if arm.float8:
        raise NoPrediction("float8 training's casts, scales and float8 copies of the weights are not modelled")
    if arm.compile:
        raise NoPrediction("torch.compile fuses operations and changes what is saved: not modelled")
    if arm.switchback:
        raise NoPrediction("SwitchBack's int8 layers are not modelled")
    if args.device == "cpu":
        raise NoPrediction("a CPU run: no GPU memory to predict")
    if args.attention in MATERIALIZED_SCORES_ATTENTIONS:
        raise NoPrediction(
            f"attention {args.attention!r} keeps each layer's sequence × sequence attention scores: not modelled"
        )
    if args.dtype == "float16" and BACKENDS[args.backend].trains and args.lora_rank == 0:
        raise NoPrediction(FLOAT16_FULL_FINE_TUNE)
    ddp = args.world_size > 1 and args.parallelism == "ddp"
    if args.sharded_by_fsdp:
        fsdp2_modelled(args)
    if ddp and args.backend != "plain_loop":
        raise NoPrediction(
            f"a run on {args.world_size} GPUs with backend {args.backend!r}: the Trainer's DDP (accelerate's "
            "buckets) is not modelled; the plain loop's is"
        )
    dtype = "bfloat16" if args.dtype == "auto" else args.dtype
    kernels = active_kernels(args, shape.model_type)
    lora = args.lora_rank > 0
    return Step(
        tokens=args.per_device_train_batch_size * args.max_seq_length,
        activation_bytes=DTYPE_BYTES[dtype],
        weight_bytes=DTYPE_BYTES[dtype],
        lora_rank=args.lora_rank,
        lora_targets=shape.lora_targets(args.lora_target_modules) if lora else (),
        lora_dropout=args.lora_dropout > 0,
        kernels=kernels,
        # as the backends take it: a criterion other than `model` (or the arm's `cce`) is the loss, and Liger swaps
        # the layer kernels only
        loss_path=select_loss_path(arm.loss_criterion(args.criterion), kernels),
        checkpointing=args.gradient_checkpointing,
        accumulation=args.gradient_accumulation_steps > 1,
        optim=args.optim,
        weight_decay=args.weight_decay > 0,
        # Every sequence full and unpacked: no attention mask, grouped key/value heads stay grouped.
        repeated_kv=shape.num_kv_heads != shape.num_heads and (args.packing or not sequences_full),
        trains=BACKENDS[args.backend].trains,
        ddp=ddp,
        gradients_in_buckets=ddp and args.ddp_gradient_as_bucket_view,
        fsdp_ranks=args.world_size if args.sharded_by_fsdp else 1,
    )


def norm_bytes(shape: ModelShape, step: Step) -> float:
    """What one RMSNorm keeps per token (its output is counted by the layers that read it)."""
    if "rms_norm" in step.kernels:
        return step.activation_bytes * shape.hidden_size + 4
    return 4 * shape.hidden_size + step.activation_bytes * shape.hidden_size + 4


def layer_activation_bytes(shape: ModelShape, step: Step) -> float:
    """Bytes one decoder layer saves for the backward pass, per token."""
    a, h, i = step.activation_bytes, shape.hidden_size, shape.intermediate_size
    full = step.lora_rank == 0  # every weight trains
    saved = 2 * norm_bytes(shape, step)
    # Inputs of trained linear layers, each distinct tensor once.
    if full:
        saved += a * h  # the attention block's normalized input (q/k/v or qkv_proj)
        saved += a * h  # the MLP block's normalized input (gate/up or gate_up_proj)
        saved += a * i  # the gated product, down_proj's input
        # o_proj's input is the attention output, counted below.
    # Attention.
    kv = shape.q_width if step.repeated_kv else shape.kv_width
    if shape.fused_qkv:
        saved += a * (shape.q_width + 2 * shape.kv_width)  # the qkv output, kept whole by v (a view of it)
        saved += a * (shape.q_width + kv)  # q and k after RoPE
        if step.repeated_kv:
            saved += a * kv  # v repeated to the query width
    else:
        saved += a * (shape.q_width + 2 * kv)  # q, k after RoPE, and v
    saved += a * shape.q_width + 4 * shape.num_heads  # the attention output, and its log-sum-exp
    # The gated MLP.
    saved += (2 if "swiglu" in step.kernels else 3) * a * i
    # LoRA adapters.
    for linear in step.lora_targets:
        saved += (1 if step.lora_dropout else 0) * linear.in_features  # dropout's mask
        saved += a * linear.in_features + a * step.lora_rank  # lora_A's input and output
    return saved


def loss_bytes(shape: ModelShape, step: Step, head_trains: bool) -> tuple[float, float]:
    """(kept from the forward pass until the backward pass, the largest transient) of the loss, per step."""
    a, h, v, t = step.activation_bytes, shape.hidden_size, shape.vocab_size, step.tokens
    path = step.loss_path
    if path.kernel == LIGER_FUSED:
        chunk = min(2 ** math.ceil(math.log2(max(1, math.ceil(t / math.ceil(v / h))))), t)
        head_grad = v * h * step.weight_bytes if head_trains and step.trains else 0
        grad_input = a * h * t if step.trains else 0
        return grad_input + head_grad + 4 * t, a * chunk * v
    if path.kernel == CUT_CROSS_ENTROPY:
        if not step.trains:  # the log-sum-exp and the target logit, float32 per token
            return 0, 8 * t
        head_grad = a * v * h if head_trains else 0
        # kept: the hidden states, the log-sum-exp, the mean logits; transient: both gradients, the vocabulary order
        return a * h * t + 4 * t + 4 * v, a * h * t + head_grad + 4 * v
    if path.kernel == TRL_CHUNKED:
        head_grad = 4 * v * h if head_trains else 0
        return a * h * t + 8 * t, 4 * h * t + head_grad + a * min(t, TRL_TOKEN_CHUNK) * min(v, TRL_TOKEN_CHUNK)
    logits = a + (4 if path.float32_logits and a != 4 else 0)  # per entry: the logits, and their float32 copy
    if not step.trains:
        return 0, (logits + 4) * v * t  # and the float32 log-probabilities
    if path.kernel == LIGER:  # the gradient written into its input
        return 0, logits * v * t
    # transformers' cross entropy: the backward holds log-probabilities, their gradient and the logits' one.
    return 0, max(logits + 4, 12) * v * t


def optimizer_bytes(step: Step, trainable: int, param_bytes: int) -> tuple[float, float]:
    """(states, temporaries of the step) for `trainable` parameters of `param_bytes` each."""
    if not step.trains:
        return 0, 0
    states = {
        "adamw_torch": 2 * param_bytes,
        "adamw_torch_fused": 2 * param_bytes,
        "adamw_8bit": ADAMW_8BIT_STATE_BYTES,
        "adagrad": param_bytes,
        "rmsprop": param_bytes,
        "sgd": 0,
        "adafactor": 0,  # factored second moments: a row and a column per matrix
    }[step.optim]
    temporaries = {
        "adamw_torch": param_bytes,  # foreach: the square root of every second moment at once
        "adagrad": param_bytes,
        "rmsprop": param_bytes,
        "sgd": param_bytes if step.weight_decay else 0,
    }.get(step.optim, 0)
    return states * trainable, temporaries * trainable


def predict_memory(args: TrainingArgs, shape: ModelShape, sequences_full: bool = True) -> MemoryPrediction:
    """The peak memory of a steady-state training step of `args` (the optimizer states built), per GPU.

    `sequences_full`: every sequence is max_seq_length tokens of real text (no padding, no attention mask).
    Otherwise the prediction is for a batch padded to max_seq_length, an upper bound for shorter data.
    """
    step = resolve_step(args, shape, sequences_full)
    lora = step.lora_rank > 0
    weights = shape.parameters * step.weight_bytes
    if lora:
        adapters = shape.lora_parameters(step.lora_rank, args.lora_target_modules)
        weights += adapters * 4  # peft keeps the adapters in float32
        trainable, param_bytes = adapters, 4
    else:
        trainable, param_bytes = shape.parameters, step.weight_bytes
    gradients = trainable * param_bytes if step.trains else 0
    buckets = gradients if step.ddp else 0  # DDP's: one gradient's worth, for the whole run
    states, temporaries = optimizer_bytes(step, trainable, param_bytes)

    t, a, h = step.tokens, step.activation_bytes, shape.hidden_size
    batch = 3 * 8 * t  # input_ids, labels, attention mask (int64)
    head_trains = not lora
    loss_kept, loss_peak = loss_bytes(shape, step, head_trains)
    final_norm = norm_bytes(shape, step) * t
    head_input = a * h * t if head_trains and step.loss_path.materializes_logits else 0
    other = batch + final_norm + head_input
    assumptions = [f"loss: {step.loss_path.name}"]
    if not sequences_full:
        assumptions.append("batches padded to max_seq_length (an upper bound for shorter data)")
    if lora:
        assumptions.append(f"LoRA: {trainable:,} adapter parameters (float32)")
    if args.allocator == "expandable_segments":
        assumptions.append(EXPANDABLE_SEGMENTS_NOTE)
    if step.ddp:
        kept = "the gradients as views into them" if step.gradients_in_buckets else "the gradients copied beside them"
        assumptions.append(f"DDP on {args.world_size} GPUs: per GPU, with gradient buckets ({kept})")

    if not step.trains:
        # No graph is kept: one layer's transients at a time, the largest being the MLP's.
        layer_peak = (4 * shape.intermediate_size + 4 * h) * a * t
        allocated = weights + batch + max(layer_peak, loss_peak)
        breakdown = {
            "weights": weights,
            "activations": layer_peak,
            "logits_and_loss": loss_peak,
            "batch_and_other": batch,
        }
        if layer_peak >= loss_peak:
            breakdown["logits_and_loss"] = 0
        else:
            breakdown["activations"] = 0
        return _finish(step, allocated, FORWARD, breakdown, assumptions, {FORWARD: allocated})

    per_layer = layer_activation_bytes(shape, step)
    if step.fsdp_ranks > 1:
        ranks = step.fsdp_ranks
        sharded = {"weights": weights / ranks, "optimizer_states": states / ranks}
        points = fsdp2_backward_points(shape, step, per_layer, loss_kept, loss_peak, other, batch)
        where = max(points, key=lambda point: sum(points[point].values()))
        backward = {**sharded, **points[where]}
        step_parts = {**sharded, "gradients": gradients / ranks, "optimizer_step_temporaries": temporaries / ranks}
        moments = {BACKWARD_START: sum(backward.values()), OPTIMIZER_STEP: sum(step_parts.values())}
        assumptions.append(
            f"FSDP2 on {ranks} GPUs: each holds 1/{ranks} of the weights, gradients and optimizer states; the "
            f"backward pass peaks at {where}"
        )
        if args.num_nodes > 1:
            assumptions.append(f"FSDP2 over {args.num_nodes} nodes: counted as on one node (not measured)")
        phase = max(moments, key=lambda moment: moments[moment] * (1 + FSDP2_ALLOCATOR_OVERHEAD[moment]))
        parts = backward if phase == BACKWARD_START else step_parts
        return _finish(step, moments[phase], phase, parts, assumptions, moments)
    if step.checkpointing:
        kept = shape.num_layers * a * h * t  # each layer's input
        recompute = per_layer * t  # one layer rebuilt at a time
        activations = kept + max(recompute - loss_peak, 0)
        loss_at_peak = loss_kept + (loss_peak if loss_peak >= recompute else 0)
    else:
        activations = shape.num_layers * per_layer * t
        loss_at_peak = loss_kept + loss_peak
    # Between micro-batches the gradients stay; DDP's buckets stay all run. Under gradient accumulation they are
    # separate even with bucket views: the step's zero_grad(set_to_none=True) ends the views, and the micro-batches
    # under no_sync accumulate into fresh gradients (the syncing one makes them views again).
    resident_gradients = gradients if step.accumulation else 0
    backward_start = weights + states + resident_gradients + buckets + activations + loss_at_peak + other
    step_buckets = 0 if step.gradients_in_buckets else buckets  # as views, the gradients are the buckets
    optimizer_step = weights + gradients + step_buckets + states + temporaries
    moments = {BACKWARD_START: backward_start, OPTIMIZER_STEP: optimizer_step}
    # the moment whose reserve is larger sets the peak: each adds its own allocator overhead, so the larger allocated
    # moment need not be (a larger batch must never be predicted to reserve less)
    reserved = {moment: moments[moment] * (1 + ALLOCATOR_OVERHEAD[moment]) for moment in moments}
    if reserved[BACKWARD_START] >= reserved[OPTIMIZER_STEP]:
        breakdown = {
            "weights": weights,
            "gradients": resident_gradients,
            "gradient_buckets": buckets,
            "optimizer_states": states,
            "activations": activations,
            "logits_and_loss": loss_at_peak,
            "batch_and_other": other,
        }
        return _finish(step, backward_start, BACKWARD_START, breakdown, assumptions, moments)
    breakdown = {
        "weights": weights,
        "gradients": gradients,
        "gradient_buckets": step_buckets,
        "optimizer_states": states,
        "optimizer_step_temporaries": temporaries,
    }
    return _finish(step, optimizer_step, OPTIMIZER_STEP, breakdown, assumptions, moments)


def _finish(
    step: Step,
    allocated: float,
    phase: str,
    parts: dict[str, float],
    assumptions: list[str],
    moments: dict[str, float],
) -> MemoryPrediction:
    overhead = (FSDP2_ALLOCATOR_OVERHEAD if step.fsdp_ranks > 1 else ALLOCATOR_OVERHEAD)[phase] * allocated
    breakdown = {part: float(parts.get(part, 0.0)) for part in PARTS}
    breakdown["allocator_overhead"] = overhead
    return MemoryPrediction(
        peak_reserved_bytes=allocated + overhead,
        peak_allocated_bytes=float(allocated),
        phase=phase,
        loss_path=step.loss_path.name,
        breakdown=breakdown,
        assumptions=assumptions,
        moments={moment: float(value) for moment, value in moments.items()},
    )
