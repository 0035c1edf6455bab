"""Model FLOPs per training token, GPU peak BF16 throughput, and model FLOPs utilization (MFU).

The count follows the MFU convention of PaLM (Chowdhery et al., 2022, appendix B): the FLOPs a
training step *needs*, independent of how the implementation computes it,

    training FLOPs per token = 6 * N + 12 * L * H * S

where N is the number of parameters that take part in a matrix multiply per token (every linear
projection, including the LM head; not the embedding lookup, biases or norms), L the number of
layers, H the attention width (query heads * head_dim) and S the sequence length. The 6 is 2 FLOPs
per multiply-add in the forward pass plus twice that in the backward pass (gradients with respect
to both the activations and the weights); the second term is the attention score and value
matmuls, which have no parameters (see `attention_flops_per_token`).

These are *model* FLOPs, not hardware FLOPs:

- Gradient (activation) checkpointing recomputes the forward pass during the backward pass, so the
  GPU executes about 8 * N FLOPs per token instead of 6 * N. MFU still counts 6 * N: it measures
  useful work per second, so it does not reward recomputation (a run that checkpoints reports a
  lower MFU for the same hardware throughput, which is the point: it is doing redundant work).
- Elementwise work (norms, activations, softmax, the loss) and optimizer updates are not counted.
- Tokens are whatever the caller counts: the figure is per *non-padding* token only if the caller
  multiplies it by a count of non-padding tokens. Padding tokens cost real FLOPs but are not
  useful work, so counting them would overstate MFU.

Two other cases have their own count (`model_flops_per_token`):

- LoRA (frozen base weights, trainable adapters): a frozen weight still takes part in the forward
  pass (2 FLOPs per weight) and in the backward pass's gradient with respect to its input (2 more,
  needed to reach the adapters below it), but it gets no weight gradient (the 2 it would cost are not
  spent). So

      LoRA training FLOPs per token = 6 * N_trainable + 4 * N_frozen + 12 * L * H * S

  where N_trainable is the adapters' matmul weights (each LoRA A and B is a Linear: 2 * r * (in + out)
  FLOPs per token forward) and N_frozen every other matmul weight (the base projections and the LM
  head). A weight counts as trainable when `requires_grad` is set, so a full fine-tune is 6 * N as
  above. The 4 * N_frozen assumes every layer has an adapter, as peft's "all-linear" does: the input
  gradient then has to flow down to the first layer. With adapters on the upper layers only, the
  layers below them need no backward at all, and this count overstates the work by up to 2 * N_frozen
  of those layers.
- Forward only (no backward, no optimizer; `training=False`): 2 * N + 4 * L * H * S (the forward
  third of each term).

`PEAK_BF16_DENSE_TFLOPS` holds the vendor's dense (no 2:4 structured sparsity) BF16 tensor-core
peak of each GPU, and `peak_bf16_tflops` maps a `torch.cuda.get_device_name()` string to it. An
unrecognized GPU gets no peak (None), never a guess, so MFU is None rather than wrong.
"""

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a model is read, so that the GPU tables need no torch
    import torch

# Vendor's dense BF16 tensor-core peak, TFLOP/s. NVIDIA datasheets print the sparse figure (marked
# "with sparsity") next to or instead of the dense one; the dense figure is half of it.
PEAK_BF16_DENSE_TFLOPS: dict[str, float] = {
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper (GH100), table 1: 989.4 dense / 1978.9 sparse.
    "H100 SXM": 989.4,
    # Same whitepaper, table 1: H100 PCIe 756 dense / 1513 sparse.
    "H100 PCIe": 756.0,
    # NVIDIA H100 datasheet (H100 NVL column, per GPU, 94 GB): 1,671 TFLOPS with sparsity -> 835.5 dense.
    "H100 NVL": 835.5,
    # NVIDIA H200 datasheet (H200 SXM column): 1,979 TFLOPS with sparsity; same GH100 tensor cores and
    # clocks as H100 SXM, so the whitepaper's 989.4 dense figure.
    "H200": 989.4,
    # NVIDIA H200 datasheet (H200 NVL column): 1,671 TFLOPS with sparsity -> 835.5 dense.
    "H200 NVL": 835.5,
    # NVIDIA A100 datasheet: BF16 Tensor Core 312 / 624 with sparsity, for the 40 GB and 80 GB, SXM and PCIe.
    "A100": 312.0,
    # NVIDIA A10 datasheet: BF16 Tensor Core 125 / 250 with sparsity.
    "A10": 125.0,
    # A10G (AWS G5 only): NVIDIA publishes no A10G datasheet, and the A10 datasheet's 125 does not carry
    # over: the A10G has less tensor throughput than the A10 (its BF16 tensor rate with FP32 accumulate
    # is half of the A10's per SM, as on GeForce GA102 parts). 70 is the figure of third-party spec
    # tables (e.g. Baseten, "NVIDIA A10 vs A10G for ML model inference"), and public BF16 matmul
    # benchmarks on A10G reach ~69.5 TFLOP/s, which is consistent with it. An assumption, not a datasheet
    # number: revisit if NVIDIA or AWS publish one.
    "A10G": 70.0,
    # NVIDIA L4 datasheet: BF16 Tensor Core 242 TFLOPS with sparsity -> 121 dense.
    "L4": 121.0,
    # NVIDIA L40 datasheet: BF16 Tensor Core 181.05 / 362.1 with sparsity.
    "L40": 181.05,
    # NVIDIA L40S datasheet: BF16 Tensor Core 362.05 / 733 with sparsity.
    "L40S": 362.05,
}

# (pattern, table key), first match wins. Patterns are matched case-insensitively against the whole
# device name with word boundaries, so "L40S" does not match "L4" or "L40", "A100" does not match
# "A10" or "A10G", and "GH200" does not match "H200". The specific H100/H200 variants come before
# the generic name: torch reports the SXM part as e.g. "NVIDIA H100 80GB HBM3".
_NAME_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), key)
    for pattern, key in (
        (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
        (r"\bH100\b.*\bNVL\b", "H100 NVL"),
        (r"\bH100\b", "H100 SXM"),
        (r"\bH200\b.*\bNVL\b", "H200 NVL"),
        (r"\bH200\b", "H200"),
        (r"\bA100\b", "A100"),
        (r"\bA10G\b", "A10G"),
        (r"\bA10\b", "A10"),
        (r"\bL40S\b", "L40S"),
        (r"\bL40\b", "L40"),
        (r"\bL4\b", "L4"),
    )
)


def _matmul_weight_numel(module: "torch.nn.Module") -> int:
    """Weight elements of a Linear or transformers Conv1D module, 0 for any other module."""
    import torch

    if isinstance(module, torch.nn.Linear):
        return module.weight.numel()
    # transformers' Conv1D (GPT-2 family) is a Linear with its weight stored transposed, (in, out).
    # Matched by class name so this module does not import transformers.
    if type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers"):
        return module.weight.numel()
    return 0


def matmul_parameters(model: "torch.nn.Module") -> int:
    """Parameters that take part in a matrix multiply per token: the N of the 6 * N term.

    The sum of the weight sizes of every `torch.nn.Linear` module, and of every transformers
    `Conv1D` (the GPT-2 family's transposed Linear). Each module counts once, as a module, not as
    a unique tensor: an LM head whose weight is tied to the input embedding is still counted,
    since the head is a (hidden x vocab) matmul per token even though it shares its storage. The
    embedding lookup is not a matmul (it indexes rows) and is not counted; neither are biases,
    which are additions, nor norm weights, which are elementwise.

    Reads only shapes, so the model may live on the `meta` device. Linear layers replaced by other
    module types (fused or quantized kernels) are not recognized. A peft LoRA layer is a wrapper module
    holding the original Linear (`base_layer`) and the adapters' two Linears (`lora_A`, `lora_B`), so all
    three count, each once.
    """
    return sum(_matmul_weight_numel(module) for module in model.modules())


def trainable_and_frozen_matmul_parameters(model: "torch.nn.Module") -> tuple[int, int]:
    """`matmul_parameters(model)` split by whether the module's weight is trained (`requires_grad`)."""
    trainable = frozen = 0
    for module in model.modules():
        numel = _matmul_weight_numel(module)
        if numel and module.weight.requires_grad:
            trainable += numel
        else:
            frozen += numel
    return trainable, frozen


def attention_flops_per_token(num_layers: int, hidden_size: int, seq_len: float, training: bool = True) -> float:
    """Training FLOPs per token of the attention score and value matmuls: 12 * L * H * S (forward
    only, `training=False`: 4 * L * H * S).

    Per layer and per token, the forward pass computes one row of Q K^T (S dot products of length
    H: 2 * S * H FLOPs) and one row of softmax(Q K^T) V (another 2 * S * H); the backward pass costs
    twice the forward, so 3 * 4 * S * H = 12 * S * H per layer. The backward's gradients are with
    respect to Q, K and V, which LoRA training needs too (they lead to the adapters), so LoRA keeps 12.

    `hidden_size` is the attention width, `num_attention_heads * head_dim`, which is not always the
    model's hidden size (Gemma 7B, for one: 16 heads * 256 = 4096, hidden_size 3072). Grouped-query
    attention does not change this term: every query head still takes dot products with S keys of
    length head_dim; sharing key/value heads only shrinks the K and V projections, which the 6 * N
    term already counts from their actual shapes.

    Causal masking is ignored, by convention (PaLM appendix B): a causal kernel can skip about half
    of these FLOPs, but MFU counts them all. `seq_len` is a float so that a mean length can be
    passed; with sequences of different lengths s_i the exact figure per token uses the
    token-weighted mean sum(s_i**2) / sum(s_i), since each token attends over its own sequence.
    """
    return (12.0 if training else 4.0) * num_layers * hidden_size * seq_len


def model_flops_per_token(model: "torch.nn.Module", seq_len: float, training: bool = True) -> float:
    """Model FLOPs per token: 6 * N_trainable + 4 * N_frozen + 12 * L * H * S when training (6 * N +
    12 * L * H * S in a full fine-tune, where nothing is frozen), 2 * N + 4 * L * H * S forward only.

    N is `matmul_parameters(model)`, split by `requires_grad` (so call this after freezing, e.g. after
    wrapping the model for LoRA). L is `num_hidden_layers` and H is `num_attention_heads * head_dim`,
    read from `model.config` (its text config where the model has one, e.g. a vision-language model);
    head_dim is `config.head_dim` when set, else `hidden_size // num_attention_heads`. S is the sequence
    length the attention term is computed for (see `attention_flops_per_token`). See the module
    docstring for what this counts and what it does not (recomputation, padding, LoRA's lower layers).
    """
    config = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    attention = attention_flops_per_token(config.num_hidden_layers, num_heads * head_dim, seq_len, training)
    trainable, frozen = trainable_and_frozen_matmul_parameters(model)
    if not training:
        return 2.0 * (trainable + frozen) + attention
    return 6.0 * trainable + 4.0 * frozen + attention


def training_flops_per_token(model: "torch.nn.Module", seq_len: float) -> float:
    """Model FLOPs per trained token (`model_flops_per_token` with `training=True`)."""
    return model_flops_per_token(model, seq_len, training=True)


def flops_formula(model: "torch.nn.Module", training: bool = True) -> str:
    """The count `model_flops_per_token` uses for `model`, in words, for the run's record."""
    if not training:
        return "forward only: 2*N + 4*L*H*S"
    _, frozen = trainable_and_frozen_matmul_parameters(model)
    if frozen:
        return "training, frozen weights (LoRA): 6*N_trainable + 4*N_frozen + 12*L*H*S"
    return "training: 6*N + 12*L*H*S"


def peak_bf16_tflops(gpu_name: str) -> float | None:
    """Dense BF16 tensor-core peak (TFLOP/s) of the GPU named `gpu_name`, or None when unknown.

    `gpu_name` is what `torch.cuda.get_device_name()` returns, e.g. "NVIDIA H100 80GB HBM3"
    (H100 SXM), "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-40GB", "NVIDIA L40S". A GPU that is not in
    `PEAK_BF16_DENSE_TFLOPS` (a consumer card, a newer part, "cpu") returns None rather than a
    neighbouring part's number.
    """
    for pattern, key in _NAME_PATTERNS:
        if pattern.search(gpu_name):
            return PEAK_BF16_DENSE_TFLOPS[key]
    return None


def mfu(achieved_tflops: float, gpu_name: str) -> float | None:
    """Model FLOPs utilization: achieved model TFLOP/s over the GPU's dense BF16 peak.

    `achieved_tflops` is model FLOPs (see `model_flops_per_token`: training, LoRA or forward-only
    counts) per second per GPU, in TFLOP/s. Returns a fraction (0.4 for 40 %), or None when the
    GPU's peak is unknown.
    """
    peak = peak_bf16_tflops(gpu_name)
    if peak is None:
        return None
    return achieved_tflops / peak
