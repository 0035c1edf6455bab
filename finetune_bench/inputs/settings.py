"""The experiment's inputs: what one condition trains with, and which of its settings are swept.

`TrainingArgs` is one condition's complete configuration. `ExperimentArgs` lists, per swept setting,
the values to try; every field of `ExperimentArgs` is named after the `TrainingArgs` field it
overrides, so adding an axis is adding one list-valued field here and nothing else. Where each setting acts is
declared beside it, from `finetune_bench.inputs.training_scopes`; how a section is read, in
`finetune_bench.inputs.sections`.
"""

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from finetune_bench.inputs import catalog, software_sets
from finetune_bench.inputs.arms import ArmError, parse_arm
from finetune_bench.inputs.catalog import (
    ALLOCATORS,
    ATTENTIONS,
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
from finetune_bench.inputs.errors import Problems, SpecError
from finetune_bench.inputs.hints import AXIS_EXAMPLES, not_a_setting
from finetune_bench.inputs.model_checks import check_scheduler
from finetune_bench.inputs.model_overrides import (
    check_config_overrides_syntax,
    check_model_config_overrides,
    check_overrides_sweep,
)
from finetune_bench.inputs.rules import (
    acts_everywhere,
    acts_only,
    check_field,
    check_fields,
    check_list,
    choice,
    fraction,
    non_negative,
    positive,
    requirement,
    setting,
)
from finetune_bench.inputs.sections import StrictFromJson
from finetune_bench.inputs.training_scopes import (
    ON_A_GPU,
    ON_SEVERAL_GPUS,
    PADDED_PLAIN_LOOP_ON_A_GPU,
    WHERE_IT_TRAINS,
    WHERE_IT_WARMS_UP,
    WITH_A_REAL_DATASET,
    WITH_DDP,
    WITH_GENERATED_DATA,
    WITH_HELD_OUT_EXAMPLES,
    WITH_LORA,
    WITH_PROFILING,
    WITHOUT_AN_ATTENTION_MASK,
    ddp,
    evaluates,
    generated_data,
    lora,
    off_the_cpu,
    probes_padded_shapes,
    profiles,
    real_dataset,
    several_gpus,
    trains,
    unmasked_cudnn_attention,
    warms_up,
)
from finetune_bench.inputs.tutorial import flow

# The largest DDP bucket taken: a bucket of gradients larger than 16 GiB is a unit slip (bytes written for MiB).
MAX_DDP_BUCKET_MB = 16384
_ZERO_TURNS_IT_OFF = " (0 turns it off)"
# New-shape probes: each is a training step; a few hundred price every length a padded dataset makes.
MAX_NEW_SHAPE_PROBES = 512
# Profiled steps: a trace of a few steps shows every kernel; hundreds would make traces of gigabytes.
MAX_PROFILE_STEPS = 100


def _known_arm(key: str, value: str) -> None:
    try:
        parse_arm(value)
    except ArmError as exc:
        raise SpecError(f"{key}: {exc}") from None


_seed_range = requirement(lambda v: 0 <= v < 2**32, "must be in [0, 2**32) (what numpy and torch seed with)")
_module_names = requirement(
    lambda v: all(part.strip() for part in v.split(",")), "must be 'all-linear' or comma-separated module names"
)


@dataclass
class TrainingArgs(StrictFromJson):
    """One condition's settings. Defaults are the offline CPU smoke test."""

    SECTION = "training_args"

    def check(self, skip: Collection[str] = ()) -> None:
        validate_training_args(self, skip)

    @classmethod
    def check_value(cls, key: str, name: str, value: Any) -> None:
        check_setting(key, name, value)

    @classmethod
    def unknown_key(cls, section: str, key: object, elsewhere: Mapping[str, type]) -> str:
        return not_a_setting(section, key, cls, elsewhere, from_tutorials=True)

    # What to train and on what. A model is a hub id, a local directory, or `random:<architecture>`
    # (a random-init model built from a bundled config, see `finetune_bench.inputs.catalog.architectures`).
    # A dataset is a hub id, a local path, or `synthetic:alpaca` (generated offline). Its rows become
    # prompt/completion pairs by format (`finetune_bench.sources.formats`): the hub ids it knows by name
    # (tatsu-lab/alpaca, tau/commonsense_qa, openai/gsm8k, madrylab/gsm8k-platinum,
    # OpenAssistant/oasst1), anything else by its columns.
    model_name: str = acts_everywhere("random:tiny-llama")
    dataset_name: str = acts_everywhere("synthetic:alpaca")
    # A `datasets` split expression ("train", "test", "train[:1000]").
    dataset_split: str = acts_only("train", real_dataset, WITH_A_REAL_DATASET)
    # The hub dataset's config (`datasets.load_dataset(name, config)`); empty: the default of a dataset
    # `finetune_bench.inputs.catalog.HUB_DATASETS` knows ("main" for the gsm8k ones), no config for any other.
    dataset_config: str = acts_only("", real_dataset, WITH_A_REAL_DATASET)
    # Generated data only: how many examples, and the response length range in words.
    synthetic_num_examples: int = acts_only(positive(256), generated_data, WITH_GENERATED_DATA)
    synthetic_min_words: int = acts_only(positive(8), generated_data, WITH_GENERATED_DATA)
    synthetic_max_words: int = acts_only(positive(48), generated_data, WITH_GENERATED_DATA)
    # How response lengths spread over [synthetic_min_words, synthetic_max_words]: `uniform` (every
    # length equally likely), `fixed` (every response synthetic_max_words long), `normal` (bell curve
    # around the midpoint, the range being ±3 standard deviations), `lognormal` (chat-like: mostly
    # short, median a quarter of the way up the range, a long tail; about 1 in 20 cut at the maximum).
    synthetic_length_distribution: str = acts_only(
        choice("uniform", SYNTHETIC_LENGTH_DISTRIBUTIONS), generated_data, WITH_GENERATED_DATA
    )
    # Hugging Face config keys set to other values before the model is built, as comma-separated key=value pairs
    # ("num_hidden_layers=8,intermediate_size=14336"; a value is an integer, a float, true / false or a string).
    # Applied to the prepared model's config (the bundled one of `random:<architecture>`, a hub model's downloaded
    # one), so the download is unchanged; the memory model and the FLOPs count use the overridden shape. On a
    # pretrained model only keys that keep its weights' shapes (fewer layers, RoPE settings, ...); any key of the
    # config on a random-init one: Llama-3-8B's layers, 8 of them, measure its per-layer speed on one GPU. Empty:
    # none. See `finetune_bench.inputs.model_overrides`.
    model_config_overrides: str = acts_everywhere(setting("", check_config_overrides_syntax))

    # trl_sft: TRL's SFTTrainer (the blog's setup); hf_trainer: transformers' Trainer; plain_loop: a
    # bare PyTorch loop (no Trainer); forward_only: the plain loop's batches and loss without backward or
    # optimizer (inference time and memory; `optim` and the learning-rate settings are unused).
    backend: str = acts_everywhere(choice("trl_sft", BACKENDS))
    # What is switched on: `baseline`, `liger` (Liger's defaults), `liger:<kernel>` (one kernel alone),
    # `compile`, `switchback`, `cce` (Cut Cross-Entropy computes the loss; plain_loop and forward_only only),
    # combinations joined by `+` (`compile+liger`, `liger:rope+cce`), or `baseline_repeat` (trains as `baseline`;
    # an A/A comparison for the noise floor). See `finetune_bench.inputs.arms`.
    arm: str = acts_everywhere(setting("baseline", _known_arm))
    # The loss. `model`: the model's forward computes it from the labels (transformers' cross entropy
    # on the full logits; Liger's fused linear cross entropy, no logits materialized, in a liger arm).
    # `trl`: TRL's own chunked LM-head loss (trl_sft only; what TRL 1.16 does by default, whatever
    # Liger does). `torch_cross_entropy`, `liger_cross_entropy`, `liger_fused_linear_cross_entropy`, `cce`:
    # computed by the plain loop from the logits (or, fused, from the last hidden states and the LM
    # head's weight; `cce` is Apple's Cut Cross-Entropy, `pip install cut-cross-entropy`, the logits never in
    # the GPU's memory). With any criterion but `model`, a liger arm swaps the layer kernels only.
    criterion: str = acts_everywhere(choice("model", CRITERIA))
    # Sequences per optimizer step on each device, and micro-batches accumulated into one optimizer step.
    per_device_train_batch_size: int = acts_everywhere(positive(1))
    gradient_accumulation_steps: int = acts_everywhere(positive(1))
    # The most tokens of an example: longer ones are truncated to it; a batch is padded to its longest example
    # (with `packing`, every row is this long).
    max_seq_length: int = acts_everywhere(positive(32))
    # Pack several examples into each sequence of max_seq_length tokens instead of padding each one
    # (trl_sft: TRL's best-fit-decreasing packing, the batch flattened without padding; plain_loop:
    # examples concatenated and cut into rows of exactly max_seq_length). Either way position_ids restart
    # at every example and no attention mask is passed, so transformers keeps examples from attending to
    # each other; a run checks that on its model before training and fails if they would.
    packing: bool = acts_everywhere(False)
    # Pad each batch to a multiple of this many tokens instead of to its longest example only (0: no rounding;
    # it must divide max_seq_length, so no batch grows past it; both arms pad alike). max_seq_length itself
    # gives every batch one shape: kernels that autotune per matrix shape (SwitchBack's) then tune once, in
    # the warm-up steps, instead of whenever a batch's length is new. Evaluation batches are padded the same
    # way. Not with packing (packed rows have no padding).
    pad_to_multiple_of: int = acts_everywhere(non_negative(0, _ZERO_TURNS_IT_OFF))
    # Optimizer steps per run (every run trains exactly this many).
    max_steps: int = acts_everywhere(positive(4))
    # Steps excluded from the headline throughput (compilation, allocator warm-up, autotuning).
    timing_warmup_steps: int = acts_everywhere(non_negative(1))
    # Held-out evaluation (0 examples: none). `eval_examples` examples are set aside from the dataset and never
    # trained on (the same ones in every run: a fixed selection), and evaluated before the first step, after
    # every `eval_steps` optimizer steps (0: only after the last) and after the last step,
    # `per_device_eval_batch_size` sequences at a time. Eval loss: the mean cross entropy per completion token,
    # through the model's own forward (its logits), the same computation in every arm and backend; perplexity:
    # its exp. Evaluation is kept out of the step times and memory peaks.
    eval_examples: int = acts_everywhere(non_negative(0, _ZERO_TURNS_IT_OFF))
    eval_steps: int = acts_only(non_negative(0, _ZERO_TURNS_IT_OFF), evaluates, WITH_HELD_OUT_EXAMPLES)
    per_device_eval_batch_size: int = acts_only(positive(4), evaluates, WITH_HELD_OUT_EXAMPLES)
    # After the timed steps (and the last evaluation), `profile_steps` more steps under torch.profiler: the report
    # compares arms by time per category of GPU kernel and lists the top kernels; each run keeps its Chrome trace
    # and, on a GPU, a CUDA memory snapshot (for PyTorch's memory visualizer). The timed steps are not changed.
    profile: bool = acts_everywhere(False)
    profile_steps: int = acts_only(
        setting(
            3,
            requirement(lambda v: v > 0, "must be positive"),
            requirement(
                lambda v: v <= MAX_PROFILE_STEPS, f"must be at most {MAX_PROFILE_STEPS} (every step is traced)"
            ),
        ),
        profiles,
        WITH_PROFILING,
    )
    # After the timed steps, two steps at each of up to `new_shape_probes` padded lengths a fine-tune on these rows
    # meets that the run has not fed, spread over their range, each timed: the first says what a length costs the
    # first time (about a step's time more: cuDNN's attention plan for it), the second what a step at a known shape
    # takes; the projection of your whole fine-tune prices its new shapes with the first and fits its step-time line
    # with the second, even where every timed step met a new length (docs/report.md#your-fine-tune). Outside every
    # timed figure; on a CPU none are made.
    new_shape_probes: int = acts_only(
        setting(
            32,
            requirement(lambda v: v >= 0, "must be 0 or more" + _ZERO_TURNS_IT_OFF),
            requirement(lambda v: v <= MAX_NEW_SHAPE_PROBES, f"must be at most {MAX_NEW_SHAPE_PROBES}"),
        ),
        probes_padded_shapes,
        PADDED_PLAIN_LOOP_ON_A_GPU,
    )

    # The optimizer by transformers' name (`adamw_torch`, `adamw_torch_fused`, `sgd`, `adafactor`, `adagrad`,
    # `rmsprop`, `adamw_8bit`: bitsandbytes on a CUDA GPU), its learning rate, transformers' scheduler name,
    # the share of max_steps spent warming the learning rate up, and the weight decay.
    optim: str = acts_only(choice("adamw_torch", OPTIMIZERS), trains, WHERE_IT_TRAINS)
    learning_rate: float = acts_only(positive(2e-5), trains, WHERE_IT_TRAINS)
    lr_scheduler_type: str = acts_only(setting("cosine", check_scheduler), trains, WHERE_IT_TRAINS)
    warmup_ratio: float = acts_only(fraction(0.0), warms_up, WHERE_IT_WARMS_UP)
    weight_decay: float = acts_only(non_negative(0.0), trains, WHERE_IT_TRAINS)
    # A learning rate above 1 is refused as a slip of units (`2` for 2e-5) unless this is true: one that is meant.
    allow_learning_rate_above_1: bool = acts_everywhere(False)
    # Gradient-norm clipping (transformers' default, 1.0); 0 turns it off. Every backend applies it.
    max_grad_norm: float = acts_only(non_negative(1.0), trains, WHERE_IT_TRAINS)
    # Seeds the model's random init, the data order and dropout; every run of a grid uses it, so repeats of a
    # condition train on the same batches and differ only by the machine's run-to-run noise.
    seed: int = acts_everywhere(setting(42, _seed_range))
    # `auto`: bfloat16 on a GPU, float32 on a CPU (Liger's kernels give NaN in bf16 under the Triton
    # CPU interpreter). `float16` trains in mixed precision, as transformers' Trainer does with `fp16`: float32 master
    # weights (LoRA: a float16 frozen base, float32 adapters), forward and backward passes under float16 autocast, the
    # loss scaled by a dynamic GradScaler (a step with inf or NaN gradients skipped, recorded in the run's
    # `loss_scale_skipped_steps`); not with parallelism `fsdp`. `forward_only` runs float16 weights.
    dtype: str = acts_everywhere(choice("auto", DTYPES))
    # Recompute each decoder layer's activations in the backward pass instead of keeping them (less memory,
    # about a third more compute).
    gradient_checkpointing: bool = acts_only(False, trains, WHERE_IT_TRAINS)
    # How attention runs. `sdpa`: transformers' SDPA attention, PyTorch choosing the kernel per call (FlashAttention,
    # memory-efficient, cuDNN or math). `eager`: transformers' eager attention (the scores materialized, as a plain
    # PyTorch implementation would). `flash`, `efficient`, `cudnn`, `math`: SDPA pinned to that one kernel for the
    # whole run (training, evaluation and profiling) through `torch.nn.attention.sdpa_kernel`; a run where it
    # cannot run ends as an error naming why, never silently on another kernel. `efficient` and `cudnn` need a
    # CUDA GPU; `flash` on a GPU needs compute capability 8.0 or newer and float16 or bfloat16 (on a CPU it is
    # PyTorch's CPU flash kernel). See `finetune_bench.inputs.catalog.ATTENTIONS`.
    attention: str = acts_everywhere(choice("sdpa", ATTENTIONS))
    # cuDNN's attention plans for any length (PyTorch's TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1, set in the run's process
    # before its first step; false removes one the launching environment exported): instead of building a plan,
    # on the host, for each sequence length it meets (about a step's time on a 1B model, paid at every new length of
    # variable-length data), cuDNN reuses one per power-of-two length. PyTorch takes this path only for a call
    # without an attention mask, so it acts on unpacked batches of one row (transformers then passes the causal hint
    # alone); a padded batch of several rows carries a mask, and there `pad_to_multiple_of`, `packing` or attention
    # `efficient` remove the price instead (docs/measurements.md). Experimental in PyTorch.
    cudnn_any_length: bool = acts_only(False, unmasked_cudnn_attention, WITHOUT_AN_ATTENTION_MASK)
    # PyTorch's CUDA caching allocator: `default`, or `expandable_segments` (`expandable_segments:True` in the
    # training process's PYTORCH_CUDA_ALLOC_CONF: segments grow in place, which leaves less memory cut into blocks
    # no later tensor fits). Other options of a PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) already set where
    # the run starts are kept; its `expandable_segments` option is this setting's.
    allocator: str = acts_only(choice("default", ALLOCATORS), off_the_cpu, ON_A_GPU)
    # A GPU of another size, emulated: each training process (each rank) runs as if its GPU had this many GiB, as
    # `nvidia-smi` reports a card's memory (an 80 GB H100: 79.6; 40 GB A100: 40.0), through
    # `torch.cuda.set_per_process_memory_fraction`: torch may reserve that less the CUDA context
    # (`prediction.gpus.usable_bytes`), as on such a card, and a probe or run beyond it runs out of memory. What is
    # outside torch's allocator (NCCL's buffers) is not capped. 0: the whole GPU. GPU runs only.
    gpu_memory_cap_gib: float = acts_only(non_negative(0.0, " (0: the whole GPU)"), off_the_cpu, ON_A_GPU)
    # LoRA through peft (hf_trainer only): rank 0 trains every weight (a full fine-tune); a positive rank
    # freezes the model and trains rank-`lora_rank` adapters on `lora_target_modules` (peft's
    # "all-linear": every linear layer but the LM head; or a comma-separated list of module names such as
    # "q_proj,v_proj"), scaled by lora_alpha / lora_rank, with dropout `lora_dropout` on their input.
    lora_rank: int = acts_everywhere(non_negative(0, " (0 is a full fine-tune)"))
    lora_alpha: int = acts_only(positive(16), lora, WITH_LORA)
    lora_dropout: float = acts_only(fraction(0.05), lora, WITH_LORA)
    lora_target_modules: str = acts_only(setting("all-linear", _module_names), lora, WITH_LORA)
    # `auto`: the GPU when there is one, else the CPU; or `cuda` / `cpu`.
    device: str = acts_everywhere(choice("auto", DEVICES))
    # Several GPUs: `num_gpus` per node (1, 2, 4 or 8) on `num_nodes` nodes (1, 2, 4 or 8), each GPU a rank of
    # a PyTorch Elastic launch, sharing the training as `parallelism` says: `ddp` (a replica per GPU, gradients
    # all-reduced) or `fsdp` (FSDP2, parameters, gradients and optimizer state sharded; the plain loop shards
    # each decoder layer with `fully_shard`, the Trainer backends through accelerate's FSDP2). Needed once there
    # is more than one GPU, and without effect on one: a one-GPU condition trains without a process group, as
    # before, whatever `parallelism` says. `per_device_train_batch_size` stays per GPU: a step trains
    # per_device_train_batch_size × gradient_accumulation_steps × num_gpus × num_nodes sequences. On a CPU
    # (`device: cpu`) the ranks are processes talking over gloo.
    num_gpus: int = acts_everywhere(choice(1, GPUS_PER_NODE))
    num_nodes: int = acts_everywhere(choice(1, NODE_COUNTS))
    parallelism: str = acts_only(choice("none", PARALLELISMS), several_gpus, ON_SEVERAL_GPUS)
    # How DDP overlaps the gradients' all-reduce with the backward (parallelism `ddp`; no effect otherwise): it
    # reduces the gradients bucket by bucket as the backward produces them, `ddp_bucket_cap_mb` MiB a bucket
    # (PyTorch's default 25: larger buckets, fewer and larger all-reduces, a longer one left after the backward);
    # `ddp_gradient_as_bucket_view` keeps each gradient inside its bucket (no copy into the bucket and back, one
    # gradient-sized buffer less; the plain loop only).
    ddp_bucket_cap_mb: int = acts_only(
        setting(
            25,
            requirement(lambda v: v > 0, "must be positive"),
            requirement(
                lambda v: v <= MAX_DDP_BUCKET_MB,
                f"must be at most {MAX_DDP_BUCKET_MB:,} MiB: it is in MiB, and one this large is likely bytes "
                "(25 MiB is 26,214,400 bytes)",
            ),
        ),
        ddp,
        WITH_DDP,
    )
    ddp_gradient_as_bucket_view: bool = acts_only(False, ddp, WITH_DDP)
    # The package releases the run trains with: "" (the installed packages) or pins joined by commas,
    # "liger-kernel==0.8.2" or "liger-kernel==0.8.2,transformers==5.17.0" (Python packages the project installs:
    # liger-kernel, transformers, trl, peft, accelerate, torchao, cut-cross-entropy, datasets, tokenizers,
    # safetensors, huggingface-hub; torch and triton stay the image's). Swept, it compares releases side by side.
    # Locally each set is installed once by uv into a directory of its own that its runs import first; on a cluster
    # each set has an image. See `finetune_bench.sources.software` and docs/releases.md.
    software_set: str = acts_everywhere(setting("", software_sets.check_syntax))

    @property
    def world_size(self) -> int:
        """How many ranks (GPUs) train this condition."""
        return self.num_gpus * self.num_nodes

    @property
    def sharded_by_fsdp(self) -> bool:
        """Whether FSDP2 shards this condition's model over its ranks (several GPUs, parallelism 'fsdp'; the one-GPU
        point of a GPU-count sweep trains unshared)."""
        return self.world_size > 1 and self.parallelism == "fsdp"

    @property
    def examples_per_step(self) -> int:
        """Examples one step takes from the dataset over every rank (each accumulation step's batch on each GPU):
        the fewest a dataset must hold for a batch to be what this condition says."""
        return self.per_device_train_batch_size * self.world_size

    @property
    def global_batch_size(self) -> int:
        """Sequences one optimizer step trains, over every rank."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.world_size


_TRAINING_FIELDS = {f.name: f for f in dataclasses.fields(TrainingArgs)}


def validate_training_args(training_args: TrainingArgs, skip: Collection[str] = ()) -> None:
    """Every field's type and rules, then (when those hold) the fields that constrain each other and the
    model and data sources; every problem in one SpecError. `skip`: fields whose values were refused already
    (`StrictFromJson.from_mapping`), neither checked again nor read by a check across fields."""
    names = [name for name in _TRAINING_FIELDS if name not in skip]
    check_fields(training_args, TrainingArgs.SECTION, names, typed=True)  # the checks below compare valid fields
    t = training_args
    problems = Problems()

    def reads(*fields: str) -> bool:
        return not set(fields) & set(skip)

    with problems.check():
        if reads("synthetic_min_words", "synthetic_max_words") and t.synthetic_min_words > t.synthetic_max_words:
            raise SpecError(
                "training_args.synthetic_min_words must not exceed synthetic_max_words "
                f"({t.synthetic_min_words} > {t.synthetic_max_words})"
            )
    with problems.check():
        if reads("timing_warmup_steps", "max_steps") and t.timing_warmup_steps >= t.max_steps:
            raise SpecError(
                f"training_args.timing_warmup_steps ({t.timing_warmup_steps}) must be below "
                f"max_steps ({t.max_steps}): no step would be measured"
            )
    with problems.check():
        if reads("model_name"):
            catalog.check_model_name(t.model_name)
            if reads("model_config_overrides"):  # read against the model's config
                check_model_config_overrides(t.model_name, t.model_config_overrides)
    with problems.check():
        if reads("dataset_name", "dataset_config", "dataset_split"):
            catalog.check_dataset(t.dataset_name, t.dataset_config, t.dataset_split)
    problems.raise_if_any()


@dataclass
class ExperimentArgs(StrictFromJson):
    """The swept settings: each field lists values of the `TrainingArgs` field of the same name.

    An empty or omitted list means "not swept": the value in `TrainingArgs` is used. (The workflows'
    embedded default, the CPU smoke grid, is `smoke_experiment()`.)
    """

    SECTION = "experiment_args"

    def check(self, skip: Collection[str] = ()) -> None:
        validate_experiment_args(self)  # a refused axis is left empty: not swept

    @classmethod
    def check_value(cls, key: str, name: str, value: Any) -> None:
        """An axis: a flat list, each of whose values is checked as the training setting (every value refused is
        named, not the first)."""
        check_axis_list(key, name, value)
        problems = Problems()
        for element in value:
            with problems.check():
                check_setting(key, name, element)
        problems.raise_if_any()

    @classmethod
    def unknown_key(cls, section: str, key: object, elsewhere: Mapping[str, type]) -> str:
        """A training setting that is not an axis is said to be one that cannot be swept."""
        return not_a_setting(section, key, cls, elsewhere, unsweepable=set(_TRAINING_FIELDS), from_tutorials=True)

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
    ddp_bucket_cap_mb: list[int] = field(default_factory=list)
    ddp_gradient_as_bucket_view: list[bool] = field(default_factory=list)
    # Each a whole set of overrides ("num_hidden_layers=8", "num_hidden_layers=16"); "" is the model as it is.
    model_config_overrides: list[str] = field(default_factory=list)
    attention: list[str] = field(default_factory=list)
    # The remedies for padded data, swept like any setting: the report ranks every configuration by the projected
    # time of your whole fine-tune. A point with packing true and a padding multiple runs as packing alone
    # (pad_to_multiple_of 0: packed rows have no padding), once.
    packing: list[bool] = field(default_factory=list)
    pad_to_multiple_of: list[int] = field(default_factory=list)
    cudnn_any_length: list[bool] = field(default_factory=list)
    allocator: list[str] = field(default_factory=list)
    # Each a set of package pins ("liger-kernel==0.8.2"); "" is the installed packages.
    software_set: list[str] = field(default_factory=list)


def smoke_experiment() -> "ExperimentArgs":
    """The benchmark workflow's embedded default grid (inputs/smoke.yaml): liger against the baseline at
    batch 1 and 2."""
    return ExperimentArgs(arm=["liger", "baseline"], per_device_train_batch_size=[1, 2])


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
            check_axis_list(f"experiment_args.{name}", name, values)
            if len(set(map(repr, values))) != len(values):
                raise SpecError(f"experiment_args.{name} repeats a value: {values!r}")
            if name == "model_config_overrides":
                check_overrides_sweep(f"experiment_args.{name}", values)
            if name == "software_set":
                software_sets.check_sweep(f"experiment_args.{name}", values)
        for value in values if isinstance(values, list) else []:
            if value is not None and not isinstance(value, list | dict):  # named by `check_axis_list`
                with problems.check():
                    check_setting(f"experiment_args.{name}", name, value)
    problems.raise_if_any()


def check_axis_list(key: str, name: str, values: Any) -> None:
    """An axis's values a flat list (`rules.check_list`): null (every value commented out), a bare value, an on/off
    mapping and a nested list each named with what to write instead."""
    example = AXIS_EXAMPLES.get(name) or flow(_TRAINING_FIELDS[name].default)
    check_list(key, values, None, "values", example, left_out="to use training_args' value (not swept)")


def check_setting(key: str, name: str, value: Any) -> None:
    """Check one value of the TrainingArgs setting `name` (type, range, choices); `key` is how the
    inputs spell where it came from."""
    check_field(_TRAINING_FIELDS[name], key, value, typed=True)
