"""The experiment's inputs: what one condition trains with, and which of its settings are swept.

`TrainingArgs` is one condition's complete configuration. `ExperimentArgs` lists, per swept setting,
the values to try; every field of `ExperimentArgs` is named after the `TrainingArgs` field it
overrides, so adding an axis is adding one list-valued field here and nothing else.
"""

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from finetune_bench.inputs import catalog
from finetune_bench.inputs.arms import ArmError, parse_arm
from finetune_bench.inputs.catalog import (
    BACKENDS,
    CRITERIA,
    DEVICES,
    DTYPES,
    GPUS_PER_NODE,
    NODE_COUNTS,
    OPTIMIZERS,
    PARALLELISMS,
    SYNTHETIC_LENGTH_DISTRIBUTIONS,
)
from finetune_bench.inputs.errors import Problems, SpecError, closest


class StrictFromJson:
    """`from_json` that rejects unknown keys and values of the wrong type, naming them.

    flytekit's CLI (`pyflyte run` / `union run` with `--inputs-file` or a JSON argument) builds a
    dataclass input with `from_json` when the class has one; without it, unknown nested keys are
    dropped silently and "4096" or 4096.7 become 4096.
    """

    SECTION = ""

    @classmethod
    def from_json(cls, text: str, **_):
        data = json.loads(text)
        try:
            check_section(cls, cls.SECTION, data)
            value = cls(**data)
            value.check()
        except SpecError as exc:
            import click  # only the CLI calls this: it prints a click error, one line a problem, no traceback

            raise click.BadParameter(str(exc)) from None
        return value

    def check(self) -> None:
        """The checks that need only this section."""


@dataclass
class TrainingArgs(StrictFromJson):
    """One condition's settings. Defaults are the offline CPU smoke test."""

    SECTION = "training_args"

    def check(self) -> None:
        validate_training_args(self)

    # What to train and on what. A model is a hub id, a local directory, or `random:<architecture>`
    # (a random-init model built from a bundled config, see `finetune_bench.inputs.catalog.architectures`).
    # A dataset is a hub id, a local path, or `synthetic:alpaca` (generated offline). Its rows become
    # prompt/completion pairs by format (`finetune_bench.sources.formats`): the hub ids it knows by name
    # (tatsu-lab/alpaca, tau/commonsense_qa, openai/gsm8k, madrylab/gsm8k-platinum,
    # OpenAssistant/oasst1), anything else by its columns.
    model_name: str = "random:tiny-llama"
    dataset_name: str = "synthetic:alpaca"
    # A `datasets` split expression ("train", "test", "train[:1000]").
    dataset_split: str = "train"
    # The hub dataset's config (`datasets.load_dataset(name, config)`); empty: the default of a dataset
    # `finetune_bench.inputs.catalog.HUB_DATASETS` knows ("main" for the gsm8k ones), no config for any other.
    dataset_config: str = ""
    # Generated data only: how many examples, and the response length range in words.
    synthetic_num_examples: int = 256
    synthetic_min_words: int = 8
    synthetic_max_words: int = 48
    # How response lengths spread over [synthetic_min_words, synthetic_max_words]: `uniform` (every
    # length equally likely), `fixed` (every response synthetic_max_words long), `normal` (bell curve
    # around the midpoint, the range being ±3 standard deviations), `lognormal` (chat-like: mostly
    # short, median a quarter of the way up the range, a long tail; about 1 in 20 cut at the maximum).
    synthetic_length_distribution: str = "uniform"

    # trl_sft: TRL's SFTTrainer (the blog's setup); hf_trainer: transformers' Trainer; plain_loop: a
    # bare PyTorch loop (no Trainer); forward_only: the plain loop's batches and loss without backward or
    # optimizer (inference time and memory; `optim` and the learning-rate settings are unused).
    backend: str = "trl_sft"
    # What is switched on: `baseline`, `liger` (Liger's defaults), `liger:<kernel>` (one kernel alone),
    # `compile`, `switchback`, combinations joined by `+` (`compile+liger`), or `baseline_repeat` (trains
    # as `baseline`; an A/A comparison for the noise floor). See `finetune_bench.inputs.arms`.
    arm: str = "baseline"
    # The loss. `model`: the model's forward computes it from the labels (transformers' cross entropy
    # on the full logits; Liger's fused linear cross entropy, no logits materialized, in a liger arm).
    # `trl`: TRL's own chunked LM-head loss (trl_sft only; what TRL 1.16 does by default, whatever
    # Liger does). `torch_cross_entropy`, `liger_cross_entropy`, `liger_fused_linear_cross_entropy`:
    # computed by the plain loop from the logits (or, fused, from the last hidden states and the LM
    # head's weight). With any criterion but `model`, a liger arm swaps the layer kernels only.
    criterion: str = "model"
    # Sequences per optimizer step on each device, and micro-batches accumulated into one optimizer step.
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    # The most tokens of an example: longer ones are truncated to it; a batch is padded to its longest example
    # (with `packing`, every row is this long).
    max_seq_length: int = 32
    # Pack several examples into each sequence of max_seq_length tokens instead of padding each one
    # (trl_sft: TRL's best-fit-decreasing packing, the batch flattened without padding; plain_loop:
    # examples concatenated and cut into rows of exactly max_seq_length). Either way position_ids restart
    # at every example and no attention mask is passed, so transformers keeps examples from attending to
    # each other; a run checks that on its model before training and fails if they would.
    packing: bool = False
    # Pad each batch to a multiple of this many tokens instead of to its longest example only (0: no rounding;
    # it must divide max_seq_length, so no batch grows past it; both arms pad alike). max_seq_length itself
    # gives every batch one shape: kernels that autotune per matrix shape (SwitchBack's) then tune once, in
    # the warm-up steps, instead of whenever a batch's length is new. Evaluation batches are padded the same
    # way. Not with packing (packed rows have no padding).
    pad_to_multiple_of: int = 0
    # Optimizer steps per run (every run trains exactly this many).
    max_steps: int = 4
    # Steps excluded from the headline throughput (compilation, allocator warm-up, autotuning).
    timing_warmup_steps: int = 1
    # Held-out evaluation (0 examples: none). `eval_examples` examples are set aside from the dataset and never
    # trained on (the same ones in every run: a fixed selection), and evaluated before the first step, after
    # every `eval_steps` optimizer steps (0: only after the last) and after the last step,
    # `per_device_eval_batch_size` sequences at a time. Eval loss: the mean cross entropy per completion token,
    # through the model's own forward (its logits), the same computation in every arm and backend; perplexity:
    # its exp. Evaluation is kept out of the step times and memory peaks.
    eval_examples: int = 0
    eval_steps: int = 0
    per_device_eval_batch_size: int = 4
    # After the timed steps (and the last evaluation), `profile_steps` more steps under torch.profiler: the report
    # compares arms by time per category of GPU kernel and lists the top kernels; each run keeps its Chrome trace
    # and, on a GPU, a CUDA memory snapshot (for PyTorch's memory visualizer). The timed steps are not changed.
    profile: bool = False
    profile_steps: int = 3

    # The optimizer by transformers' name (`adamw_torch`, `adamw_torch_fused`, `sgd`, `adafactor`, `adagrad`,
    # `rmsprop`, `adamw_8bit`: bitsandbytes on a CUDA GPU), its learning rate, transformers' scheduler name,
    # the share of max_steps spent warming the learning rate up, and the weight decay.
    optim: str = "adamw_torch"
    learning_rate: float = 2e-5
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    # Gradient-norm clipping (transformers' default, 1.0); 0 turns it off. Every backend applies it.
    max_grad_norm: float = 1.0
    # Seeds the model's random init, the data order and dropout; every run of a grid uses it, so repeats of a
    # condition train on the same batches and differ only by the machine's run-to-run noise.
    seed: int = 42
    # `auto`: bfloat16 on a GPU, float32 on a CPU (Liger's kernels give NaN in bf16 under the Triton
    # CPU interpreter).
    dtype: str = "auto"
    # Recompute each decoder layer's activations in the backward pass instead of keeping them (less memory,
    # about a third more compute).
    gradient_checkpointing: bool = False
    # LoRA through peft (hf_trainer only): rank 0 trains every weight (a full fine-tune); a positive rank
    # freezes the model and trains rank-`lora_rank` adapters on `lora_target_modules` (peft's
    # "all-linear": every linear layer but the LM head; or a comma-separated list of module names such as
    # "q_proj,v_proj"), scaled by lora_alpha / lora_rank, with dropout `lora_dropout` on their input.
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    lora_target_modules: str = "all-linear"
    # `auto`: the GPU when there is one, else the CPU; or `cuda` / `cpu`.
    device: str = "auto"
    # Several GPUs: `num_gpus` per node (1, 2, 4 or 8) on `num_nodes` nodes (1, 2, 4 or 8), each GPU a rank of
    # a PyTorch Elastic launch, sharing the training as `parallelism` says: `ddp` (a replica per GPU, gradients
    # all-reduced) or `fsdp` (FSDP2, parameters, gradients and optimizer state sharded; the plain loop shards
    # each decoder layer with `fully_shard`, the Trainer backends through accelerate's FSDP2). Needed once there
    # is more than one GPU, and without effect on one: a one-GPU condition trains without a process group, as
    # before, whatever `parallelism` says. `per_device_train_batch_size` stays per GPU: a step trains
    # per_device_train_batch_size × gradient_accumulation_steps × num_gpus × num_nodes sequences. On a CPU
    # (`device: cpu`) the ranks are processes talking over gloo.
    num_gpus: int = 1
    num_nodes: int = 1
    parallelism: str = "none"

    @property
    def world_size(self) -> int:
        """How many ranks (GPUs) train this condition."""
        return self.num_gpus * self.num_nodes

    @property
    def examples_per_step(self) -> int:
        """Examples one step takes from the dataset over every rank (each accumulation step's batch on each GPU):
        the fewest a dataset must hold for a batch to be what this condition says."""
        return self.per_device_train_batch_size * self.world_size

    @property
    def global_batch_size(self) -> int:
        """Sequences one optimizer step trains, over every rank."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.world_size


@dataclass
class ExperimentArgs(StrictFromJson):
    """The swept settings: each field lists values of the `TrainingArgs` field of the same name.

    An empty or omitted list means "not swept": the value in `TrainingArgs` is used. (The workflows'
    embedded default, the CPU smoke grid, is `smoke_experiment()`.)
    """

    SECTION = "experiment_args"

    def check(self) -> None:
        validate_experiment_args(self)

    arm: list[str] = field(default_factory=list)
    per_device_train_batch_size: list[int] = field(default_factory=list)
    max_seq_length: list[int] = field(default_factory=list)
    backend: list[str] = field(default_factory=list)
    criterion: list[str] = field(default_factory=list)
    gradient_accumulation_steps: list[int] = field(default_factory=list)
    gradient_checkpointing: list[bool] = field(default_factory=list)
    optim: list[str] = field(default_factory=list)
    dtype: list[str] = field(default_factory=list)
    lora_rank: list[int] = field(default_factory=list)
    # In YAML inputs write 2.0e-5, not 2e-5: YAML 1.1 (PyYAML) reads a mantissa without a dot as a string.
    learning_rate: list[float] = field(default_factory=list)
    num_gpus: list[int] = field(default_factory=list)
    num_nodes: list[int] = field(default_factory=list)
    parallelism: list[str] = field(default_factory=list)


def smoke_experiment() -> "ExperimentArgs":
    """The benchmark workflow's embedded default grid (inputs/smoke.yaml): liger against the baseline at
    batch 1 and 2."""
    return ExperimentArgs(arm=["liger", "baseline"], per_device_train_batch_size=[1, 2])


# Keys users bring from Liger's and TRL's own switches, and from earlier versions of these inputs.
_LIGER_SWITCH_HINT = "liger on/off is the arm axis: arm: [liger, baseline]"
_RENAMED = {"use_liger": _LIGER_SWITCH_HINT, "use_liger_kernel": _LIGER_SWITCH_HINT, "liger": _LIGER_SWITCH_HINT}
# Names other tools give settings that spelling alone would match to another one (`batch_size` is nearer
# `per_device_eval_batch_size` than the training batch it means).
_ALIASES = {"batch_size": "per_device_train_batch_size", "train_batch_size": "per_device_train_batch_size"}


def check_section(cls: type, section: str, data: Any) -> None:
    """Reject unknown keys and wrongly typed values of one inputs section (a dataclass given as a mapping),
    every one of them in one SpecError.

    `training_args` and `experiment_args` values are checked as settings (type and range); any other
    section's fields by their annotation (bool, int, float, str).
    """
    if not isinstance(data, dict):
        raise SpecError(f"{section} must be a mapping of settings, got {data!r}")
    annotations = {f.name: f.type for f in dataclasses.fields(cls)}
    problems = Problems()
    for key, value in data.items():
        with problems.check():
            if key not in annotations:
                hint = _RENAMED.get(str(key)) if "arm" in annotations else None
                alias = _ALIASES.get(str(key))
                if hint:
                    suggestion = f" (did you mean 'arm'? {hint})"
                elif alias in annotations:
                    suggestion = f" (did you mean {alias!r}?)"
                else:
                    suggestion = closest(str(key), list(annotations))
                raise SpecError(f"{section}.{key} is not a setting{suggestion}")
            if cls is ExperimentArgs:
                if not isinstance(value, list):
                    raise SpecError(f"{section}.{key} must be a list of values, got {value!r}")
                for element in value:
                    _check_value(f"{section}.{key}", key, element)
            elif cls is TrainingArgs:
                _check_value(f"{section}.{key}", key, value)
            else:
                _check_type(f"{section}.{key}", annotations[key], value)
    problems.raise_if_any()


def _check_type(key: str, annotation: Any, value: Any) -> None:
    name = getattr(annotation, "__name__", str(annotation))
    python_type = {"str": str, "int": int, "float": (int, float), "bool": bool}.get(name)
    if python_type is None:
        return  # a nested type: its own dataclass checks it
    if (isinstance(value, bool) and name != "bool") or not isinstance(value, python_type):
        raise SpecError(f"{key} must be {name}, got {value!r}")


def axis_names() -> list[str]:
    """Every sweepable axis, in declaration order (the single source of that list)."""
    return [f.name for f in dataclasses.fields(ExperimentArgs)]


def swept_axes(experiment_args: ExperimentArgs) -> dict[str, list[Any]]:
    """The axes that have values, with their values, in declaration order."""
    return {name: list(getattr(experiment_args, name)) for name in axis_names() if getattr(experiment_args, name)}


def validate_experiment_args(experiment_args: ExperimentArgs) -> None:
    """Every axis a list of valid, distinct values; every problem in one SpecError."""
    problems = Problems()
    for name in axis_names():
        values = getattr(experiment_args, name)
        with problems.check():
            if not isinstance(values, list):
                raise SpecError(f"experiment_args.{name} must be a list of values, got {values!r}")
            if len(set(map(repr, values))) != len(values):
                raise SpecError(f"experiment_args.{name} repeats a value: {values!r}")
        for value in values if isinstance(values, list) else []:
            with problems.check():
                _check_value(f"experiment_args.{name}", name, value)
    problems.raise_if_any()


def validate_training_args(training_args: TrainingArgs) -> None:
    """Every field's type and range, then (when those hold) the fields that constrain each other and the
    model and data sources; every problem in one SpecError."""
    problems = Problems()
    for f in dataclasses.fields(TrainingArgs):
        with problems.check():
            _check_value(f"training_args.{f.name}", f.name, getattr(training_args, f.name))
    problems.raise_if_any()  # the checks below compare fields: only once each field is valid
    t = training_args
    with problems.check():
        if t.synthetic_min_words > t.synthetic_max_words:
            raise SpecError(
                "training_args.synthetic_min_words must not exceed synthetic_max_words "
                f"({t.synthetic_min_words} > {t.synthetic_max_words})"
            )
    with problems.check():
        if t.timing_warmup_steps >= t.max_steps:
            raise SpecError(
                f"training_args.timing_warmup_steps ({t.timing_warmup_steps}) must be below "
                f"max_steps ({t.max_steps}): no step would be measured"
            )
    with problems.check():
        catalog.check_model_name(t.model_name)
    with problems.check():
        catalog.check_dataset(t.dataset_name, t.dataset_config, t.dataset_split)
    problems.raise_if_any()


# Integers travel through Flyte's literals as int64.
_INT64_MAX = 2**63 - 1
_POSITIVE_INTS = {
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_length",
    "max_steps",
    "synthetic_num_examples",
    "synthetic_min_words",
    "synthetic_max_words",
    "per_device_eval_batch_size",
    "profile_steps",
}
_CHOICES = {
    "backend": BACKENDS,
    "criterion": CRITERIA,
    "dtype": DTYPES,
    "device": DEVICES,
    "optim": OPTIMIZERS,
    "synthetic_length_distribution": SYNTHETIC_LENGTH_DISTRIBUTIONS,
    "parallelism": PARALLELISMS,
    "num_gpus": GPUS_PER_NODE,
    "num_nodes": NODE_COUNTS,
}


def _looks_like_float(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _check_value(key: str, name: str, value: Any) -> None:
    expected = {f.name: f.type.__name__ for f in dataclasses.fields(TrainingArgs)}[name]
    python_type = {"str": str, "int": int, "float": (int, float), "bool": bool}[expected]
    if isinstance(value, bool) and expected != "bool":
        raise SpecError(f"{key} must be {expected}, got {value!r}")
    if not isinstance(value, python_type):
        hint = ""
        if expected == "float" and isinstance(value, str) and _looks_like_float(value):
            # PyYAML (YAML 1.1) reads 2e-5 as a string: the float needs a dot in the mantissa.
            hint = f" (in YAML write {float(value)!r} or a mantissa with a dot, e.g. 2.0e-5)"
        raise SpecError(f"{key} must be {expected}, got {value!r}{hint}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{key} must be a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _INT64_MAX:
        raise SpecError(f"{key} is too large (at most {_INT64_MAX:,}), got {value!r}")
    if name in _POSITIVE_INTS and value <= 0:
        raise SpecError(f"{key} must be positive, got {value!r}")
    if name in ("eval_examples", "eval_steps", "pad_to_multiple_of") and value < 0:
        raise SpecError(f"{key} must not be negative (0 turns it off), got {value!r}")
    if name == "timing_warmup_steps" and value < 0:
        raise SpecError(f"{key} must not be negative, got {value!r}")
    if name in _CHOICES and value not in _CHOICES[name]:
        raise SpecError(f"{key} must be one of {list(_CHOICES[name])}, got {value!r}")
    if name == "arm":
        try:
            parse_arm(value)
        except ArmError as exc:
            raise SpecError(f"{key}: {exc}") from None
    if name in ("weight_decay", "max_grad_norm") and value < 0:
        raise SpecError(f"{key} must not be negative, got {value!r}")
    if name == "warmup_ratio" and not 0 <= value < 1:
        raise SpecError(f"{key} must be in [0, 1), got {value!r}")
    if name == "seed" and not 0 <= value < 2**32:
        raise SpecError(f"{key} must be in [0, 2**32) (what numpy and torch seed with), got {value!r}")
    if name == "learning_rate" and value <= 0:
        raise SpecError(f"{key} must be positive, got {value!r}")
    if name == "lora_rank" and value < 0:
        raise SpecError(f"{key} must not be negative (0 is a full fine-tune), got {value!r}")
    if name == "lora_alpha" and value <= 0:
        raise SpecError(f"{key} must be positive, got {value!r}")
    if name == "lora_dropout" and not 0 <= value < 1:
        raise SpecError(f"{key} must be in [0, 1), got {value!r}")
    if name == "lora_target_modules" and not all(part.strip() for part in value.split(",")):
        raise SpecError(f"{key} must be 'all-linear' or comma-separated module names, got {value!r}")


def check_setting(key: str, name: str, value: Any) -> None:
    """Check one value of the TrainingArgs setting `name` (type, range, choices); `key` is how the
    inputs spell where it came from."""
    _check_value(key, name, value)
