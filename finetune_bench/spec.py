"""The experiment's inputs: what one condition trains with, and which of its settings are swept.

`TrainingArgs` is one condition's complete configuration. `ExperimentArgs` lists, per swept setting,
the values to try; every field of `ExperimentArgs` is named after the `TrainingArgs` field it
overrides, so adding an axis is adding one list-valued field here and nothing else.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("trl_sft", "hf_trainer", "plain_loop")
# How the loss is computed (see `TrainingArgs.criterion`); the first is the default.
CRITERIA = ("model", "trl", "torch_cross_entropy", "liger_cross_entropy", "liger_fused_linear_cross_entropy")
# The criteria a backend can run.
BACKEND_CRITERIA = {
    "trl_sft": ("model", "trl"),
    "hf_trainer": ("model",),
    "plain_loop": ("model", "torch_cross_entropy", "liger_cross_entropy", "liger_fused_linear_cross_entropy"),
}
DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICES = ("auto", "cuda", "cpu")


@dataclass
class TrainingArgs:
    """One condition's settings. Defaults are the offline CPU smoke test."""

    # What to train and on what. A model is a hub id, a local directory, or `random:<architecture>`
    # (a random-init model built from a bundled config, see `finetune_bench.sources.architectures`).
    # A dataset is a hub id, a local path, or `synthetic:alpaca` (generated offline).
    model_name: str = "random:tiny-llama"
    dataset_name: str = "synthetic:alpaca"
    dataset_split: str = "train"
    # Generated data only: how many examples, and the response length range in words.
    synthetic_num_examples: int = 256
    synthetic_min_words: int = 8
    synthetic_max_words: int = 48

    # trl_sft: TRL's SFTTrainer (the blog's setup); hf_trainer: transformers' Trainer; plain_loop: a
    # bare PyTorch loop (no Trainer).
    backend: str = "trl_sft"
    use_liger: bool = False
    # The loss. `model`: the model's forward computes it from the labels (transformers' cross entropy
    # on the full logits; Liger's fused linear cross entropy, no logits materialized, in a liger arm).
    # `trl`: TRL's own chunked LM-head loss (trl_sft only; what TRL 1.16 does by default, whatever
    # Liger does). `torch_cross_entropy`, `liger_cross_entropy`, `liger_fused_linear_cross_entropy`:
    # computed by the plain loop from the logits (or, fused, from the last hidden states and the LM
    # head's weight). With any criterion but `model`, a liger arm swaps the layer kernels only.
    criterion: str = "model"
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    max_seq_length: int = 32
    max_steps: int = 4
    # Steps excluded from the headline throughput (compilation, allocator warm-up, autotuning).
    timing_warmup_steps: int = 1

    optim: str = "adamw_torch"
    learning_rate: float = 2e-5
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    # Gradient-norm clipping (transformers' default, 1.0); 0 turns it off. Every backend applies it.
    max_grad_norm: float = 1.0
    seed: int = 42
    # `auto`: bfloat16 on a GPU, float32 on a CPU (Liger's kernels give NaN in bf16 under the Triton
    # CPU interpreter).
    dtype: str = "auto"
    gradient_checkpointing: bool = False
    device: str = "auto"


@dataclass
class ExperimentArgs:
    """The swept settings: each field lists values of the `TrainingArgs` field of the same name.

    An empty list means "not swept": the value in `TrainingArgs` is used.
    """

    use_liger: list[bool] = field(default_factory=lambda: [True, False])
    per_device_train_batch_size: list[int] = field(default_factory=lambda: [1, 2])
    max_seq_length: list[int] = field(default_factory=list)
    backend: list[str] = field(default_factory=list)
    criterion: list[str] = field(default_factory=list)


class SpecError(ValueError):
    """An input that cannot be run; the message names the offending key and value."""


def axis_names() -> list[str]:
    """Every sweepable axis, in declaration order (the single source of that list)."""
    return [f.name for f in dataclasses.fields(ExperimentArgs)]


def swept_axes(experiment_args: ExperimentArgs) -> dict[str, list[Any]]:
    """The axes that have values, with their values, in declaration order."""
    return {name: list(getattr(experiment_args, name)) for name in axis_names() if getattr(experiment_args, name)}


def validate(experiment_args: ExperimentArgs, training_args: TrainingArgs, n_runs: int) -> None:
    """Reject inputs that cannot run, naming the key. Called before any training starts."""
    training_fields = {f.name: f for f in dataclasses.fields(TrainingArgs)}
    for name in axis_names():
        if name not in training_fields:
            raise SpecError(f"experiment_args.{name} has no matching training_args field")
        values = getattr(experiment_args, name)
        if not isinstance(values, list):
            raise SpecError(f"experiment_args.{name} must be a list of values, got {values!r}")
        if len(set(map(repr, values))) != len(values):
            raise SpecError(f"experiment_args.{name} repeats a value: {values!r}")
        for value in values:
            _check_value(f"experiment_args.{name}", name, value)
    for name in training_fields:
        _check_value(f"training_args.{name}", name, getattr(training_args, name))
    if not isinstance(n_runs, int) or isinstance(n_runs, bool) or n_runs <= 0:
        raise SpecError(f"n_runs must be a positive integer, got {n_runs!r}")
    if training_args.synthetic_min_words > training_args.synthetic_max_words:
        raise SpecError(
            "training_args.synthetic_min_words must not exceed synthetic_max_words "
            f"({training_args.synthetic_min_words} > {training_args.synthetic_max_words})"
        )
    if training_args.max_grad_norm < 0:
        raise SpecError(f"training_args.max_grad_norm must not be negative, got {training_args.max_grad_norm!r}")
    if not 0 <= training_args.warmup_ratio < 1:
        raise SpecError(f"training_args.warmup_ratio must be in [0, 1), got {training_args.warmup_ratio!r}")
    if training_args.timing_warmup_steps >= training_args.max_steps:
        raise SpecError(
            f"training_args.timing_warmup_steps ({training_args.timing_warmup_steps}) must be below "
            f"max_steps ({training_args.max_steps}): no step would be measured"
        )


_POSITIVE_INTS = {
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_length",
    "max_steps",
    "synthetic_num_examples",
    "synthetic_min_words",
    "synthetic_max_words",
}
_CHOICES = {"backend": BACKENDS, "criterion": CRITERIA, "dtype": DTYPES, "device": DEVICES}


def _check_value(key: str, name: str, value: Any) -> None:
    expected = {f.name: f.type.__name__ for f in dataclasses.fields(TrainingArgs)}[name]
    python_type = {"str": str, "int": int, "float": (int, float), "bool": bool}[expected]
    if isinstance(value, bool) and expected != "bool":
        raise SpecError(f"{key} must be {expected}, got {value!r}")
    if not isinstance(value, python_type):
        raise SpecError(f"{key} must be {expected}, got {value!r}")
    if name in _POSITIVE_INTS and value <= 0:
        raise SpecError(f"{key} must be positive, got {value!r}")
    if name == "timing_warmup_steps" and value < 0:
        raise SpecError(f"{key} must not be negative, got {value!r}")
    if name in _CHOICES and value not in _CHOICES[name]:
        raise SpecError(f"{key} must be one of {list(_CHOICES[name])}, got {value!r}")
    if name == "learning_rate" and value <= 0:
        raise SpecError(f"{key} must be positive, got {value!r}")


def validate_condition(training_args: TrainingArgs, swept: dict[str, Any]) -> None:
    """Reject a combination of settings that cannot run together; `swept` names the condition's swept
    values, so the message says which point of the grid is at fault."""
    backend, criterion = training_args.backend, training_args.criterion
    if criterion not in BACKEND_CRITERIA[backend]:
        where = " (condition " + ",".join(f"{k}={v}" for k, v in swept.items()) + ")" if swept else ""
        raise SpecError(
            f"criterion {criterion!r} does not run with backend {backend!r}{where}: "
            f"backend {backend!r} takes criterion {list(BACKEND_CRITERIA[backend])}"
        )
