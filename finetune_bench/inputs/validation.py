"""Checks across settings: the inputs as a whole, one condition of the grid (settings that cannot run
together), and the workflow's own run settings. A single setting's type and range are checked where it is
declared (`finetune_bench.inputs.settings`)."""

import dataclasses
import math
from collections.abc import Collection, Sequence
from typing import Any

from finetune_bench.inputs import software_sets
from finetune_bench.inputs.arms import (
    FLOAT8_INSTALL_HINT,
    FLOAT8_MIN_CAPABILITY,
    FLOAT8_MODULE,
    LOSS_KERNELS,
    Arm,
    default_kernels,
    kernel_switches,
    parse_arm,
    supported_model_types,
    uncompiled_layers_problem,
)
from finetune_bench.inputs.catalog import (
    ATTENTIONS,
    BACKENDS,
    BITSANDBYTES_OPTIMIZERS,
    CUDA_CONTEXT_BYTES,
    GIB,
    GPUS_PER_NODE,
    PARALLELISMS,
    SYNTHETIC_PREFIX,
    model_type,
)
from finetune_bench.inputs.errors import ConditionRefused, Problems, SpecError
from finetune_bench.inputs.locations import check_writable_location  # noqa: F401 (where the workflows find it)
from finetune_bench.inputs.loss_paths import CCE_CRITERION, CCE_INSTALL_HINT, CCE_MODULE
from finetune_bench.inputs.model_checks import lora_target_problem, position_table_problem
from finetune_bench.inputs.model_overrides import check_model_config_overrides, config_at_planning
from finetune_bench.inputs.rules import acting_nowhere
from finetune_bench.inputs.settings import (
    ExperimentArgs,
    TrainingArgs,
    axis_names,
    smoke_experiment,
    swept_axes,
    validate_experiment_args,
    validate_training_args,
)

# More runs than this in one grid is a mistake in the inputs (days of GPU time), refused before it is expanded.
MAX_RUNS = 10_000
# What the benchmark does with a condition refused alone (`ConditionRefused`), said in its message.
NOT_RUN = "This condition is not run; the others are."


def validate(experiment_args: ExperimentArgs, training_args: TrainingArgs, n_runs: int) -> None:
    """Reject inputs that cannot run, naming each key at fault, every problem in one SpecError. Called
    before anything is downloaded or trained; the grid's size is checked arithmetically, never expanded."""
    training_fields = {f.name for f in dataclasses.fields(TrainingArgs)}
    for name in axis_names():
        if name not in training_fields:
            raise SpecError(f"experiment_args.{name} has no matching training_args field")
    problems = Problems()
    with problems.check():
        validate_experiment_args(experiment_args)
    with problems.check():
        validate_training_args(training_args)
    with problems.check():
        check_grid_size(experiment_args, n_runs)
    with problems.check():
        check_not_replaced_by_axes(experiment_args, training_args)
    problems.raise_if_any()


def check_not_replaced_by_axes(experiment_args: ExperimentArgs, training_args: TrainingArgs) -> None:
    """Refuse a training_args value (not its default) for an axis the grid sweeps: every condition takes the axis'
    values instead, so the value would change nothing (the workflow's default grid sweeps `arm` and the batch size
    when a file gives no experiment_args)."""
    swept = swept_axes(experiment_args)
    default = smoke_experiment() == experiment_args
    problems = Problems()
    for name, values in swept.items():
        declared = next(f for f in dataclasses.fields(TrainingArgs) if f.name == name)
        unset = declared.default if declared.default is not dataclasses.MISSING else declared.default_factory()
        value = getattr(training_args, name)
        if value == unset:
            continue
        grid = " (the workflow's default grid, used when the file gives no experiment_args)" if default else ""
        problems.found.append(
            f"training_args.{name} ({value!r}) is replaced in every condition by experiment_args.{name} "
            f"{values!r}{grid}, so it would change nothing: sweep it there (experiment_args: {{{name}: [{value!r}]}}) "
            f"or leave it out of training_args"
        )
    problems.raise_if_any()


def check_settings_act(conditions: Sequence[TrainingArgs], swept: Collection[str] = ()) -> None:
    """Refuse every setting that a condition sets (not its default) but that acts in none of the grid's `conditions`:
    where a setting acts is declared beside its field (`rules.acts_only`); such a setting would change nothing of
    what is measured. A setting that acts in some conditions (the one-GPU point of a GPU-count sweep) is kept. `swept`:
    the axes, named as experiment_args' in the message."""
    found = acting_nowhere(
        TrainingArgs,
        conditions,
        conditions,
        lambda name: f"{'experiment_args' if name in swept else 'training_args'}.{name}",
    )
    if found:
        raise SpecError(*found)


def condition_count(experiment_args: ExperimentArgs) -> int:
    """How many conditions the swept axes make (the product of their lengths), without listing them."""
    axes = [getattr(experiment_args, name) for name in axis_names()]
    return math.prod(len(values) for values in axes if isinstance(values, list) and values)


def check_grid_size(experiment_args: ExperimentArgs, n_runs: int) -> None:
    """`n_runs` a positive integer, and at most `MAX_RUNS` runs in the grid, counted without expanding it."""
    if not isinstance(n_runs, int) or isinstance(n_runs, bool) or n_runs <= 0:
        raise SpecError(f"n_runs must be a positive integer, got {n_runs!r}")
    conditions = condition_count(experiment_args)
    if conditions * n_runs > MAX_RUNS:
        raise SpecError(
            f"the grid is {conditions:,} condition(s) × n_runs {n_runs:,} = {conditions * n_runs:,} runs; at most "
            f"{MAX_RUNS:,} run in one grid: sweep fewer values or split the grid"
        )


# The shortest condition timeout taken: a run's start (process, imports, model) alone takes seconds.
MIN_CONDITION_TIMEOUT_S = 30


def validate_run_settings(
    concurrency: int, min_success_ratio: float, condition_timeout_s: int, alpha: float = 0.05
) -> None:
    """The workflow's own settings, every problem in one SpecError."""
    problems = []
    if isinstance(alpha, bool) or not 0 < alpha < 1:
        problems.append(f"alpha (the significance level) must be in (0, 1), got {alpha!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        problems.append(f"concurrency must be a positive integer, got {concurrency!r}")
    if isinstance(min_success_ratio, bool) or not 0 < min_success_ratio <= 1:
        problems.append(f"min_success_ratio must be in (0, 1], got {min_success_ratio!r}")
    if isinstance(condition_timeout_s, bool) or not isinstance(condition_timeout_s, int) or condition_timeout_s <= 0:
        problems.append(f"condition_timeout_s must be a positive number of seconds, got {condition_timeout_s!r}")
    elif condition_timeout_s < MIN_CONDITION_TIMEOUT_S:
        problems.append(
            f"condition_timeout_s {condition_timeout_s} is in seconds: every run would be killed before its start is "
            f"over; write at least {MIN_CONDITION_TIMEOUT_S} (3600 is an hour)"
        )
    if problems:
        raise SpecError(*problems)


def _check_padding(training_args: TrainingArgs, where: str) -> None:
    """A padding multiple divides max_seq_length (no batch grows past it) and comes without packing."""
    multiple, max_seq_length = training_args.pad_to_multiple_of, training_args.max_seq_length
    if not multiple:
        return
    if training_args.packing:
        raise SpecError(
            f"training_args.pad_to_multiple_of ({multiple}) with packing{where}: packed batches have no padding "
            "to round; set pad_to_multiple_of 0 or packing false"
        )
    if max_seq_length % multiple:
        raise SpecError(
            f"training_args.pad_to_multiple_of ({multiple}) does not divide max_seq_length ({max_seq_length}){where}: "
            f"a batch would be padded past max_seq_length; use a divisor of it, e.g. {max_seq_length}"
        )


def _check_float16_training(training_args: TrainingArgs, where: str) -> None:
    """float16 trains in mixed precision (float32 master weights, autocast, a dynamic loss scale:
    `running.backends.common.trains_mixed_float16`) on one GPU, a CPU, or several GPUs with DDP; not sharded with
    FSDP, which nothing here has run: under the plain loop's FSDP2 each layer's float16 weights, which autocast
    casts from the gathered float32 ones and saves for the backward pass, would stay whole on every GPU outside
    FSDP's resharding, and accelerate's FSDP2 is set up without `fp16` (`trainer_common.distributed_arguments`).
    Forward passes alone (`forward_only`) run float16 weights."""
    t = training_args
    if t.dtype == "float16" and BACKENDS[t.backend].trains and t.sharded_by_fsdp:
        raise SpecError(
            f"training_args.dtype 'float16' with parallelism 'fsdp'{where}: float16 trains in mixed precision "
            "(float32 master weights, autocast, loss scaling), which is not run sharded here: FSDP2 would keep "
            "autocast's float16 copy of every layer's weights whole on every GPU until the backward pass, and the "
            "Trainers' FSDP is set up without fp16; use parallelism 'ddp', or dtype 'bfloat16' with 'fsdp'"
        )


def _check_lora(training_args: TrainingArgs, where: str) -> None:
    """LoRA only where a backend applies it."""
    backend = training_args.backend
    if training_args.lora_rank > 0 and not BACKENDS[backend].lora:
        lora_backends = [name for name, candidate in BACKENDS.items() if candidate.lora]
        raise SpecError(
            f"lora_rank {training_args.lora_rank} does not run with backend {backend!r}{where}: LoRA is "
            f"applied by backend {lora_backends} only; use lora_rank 0 (a full fine-tune) with {backend!r}"
        )


def _check_optimizer(training_args: TrainingArgs, where: str) -> None:
    """An 8-bit optimizer only where it can be built and run."""
    backend, optim = training_args.backend, training_args.optim
    if optim in BITSANDBYTES_OPTIMIZERS and BACKENDS[backend].trains:  # one that does not builds no optimizer
        import importlib.util

        # Looked up, not imported: importing bitsandbytes probes CUDA, slow and noisy on a planning host.
        if importlib.util.find_spec("bitsandbytes") is None:
            raise SpecError(
                f"optim {optim!r}{where} needs bitsandbytes, which is not installed here: install it "
                "(it also needs a CUDA GPU) or use optim 'adamw_torch'"
            )
        if training_args.device == "cpu":
            raise SpecError(
                f"optim {optim!r}{where} needs a CUDA device (bitsandbytes' 8-bit optimizer kernels), "
                "and training_args.device is 'cpu'"
            )


def validate_condition(training_args: TrainingArgs, swept: dict[str, Any]) -> None:
    """Reject a combination of settings that cannot run together, naming every problem of the condition at once
    (a refusal of the condition alone, `ConditionRefused`, only when nothing else is wrong); `swept` names the
    condition's swept values, so the message says which point of the grid is at fault."""
    t = training_args
    where = " (condition " + ",".join(f"{k}={v}" for k, v in swept.items()) + ")" if swept else ""
    arm = parse_arm(t.arm)
    checks = [
        lambda: _check_backend(t, where),
        lambda: _check_learning_rate(t, where),
        lambda: _check_padding(t, where),
        lambda: _check_float16_training(t, where),
        lambda: _check_lora(t, where),
        lambda: _check_optimizer(t, where),
        lambda: _check_evaluation(t, where),
        lambda: _check_parallelism(t, where, swept),
        lambda: _check_attention_and_allocator(t, where),
        lambda: _check_memory_cap(t, where),
        # an unswept value is checked with the rest of training_args
        lambda: (
            "model_config_overrides" in swept
            and check_model_config_overrides(t.model_name, t.model_config_overrides, where)
        ),
        lambda: _check_model_shape(t, where),
        lambda: _check_generated_data(t, where),
        lambda: _check_liger(t, arm, where),
        lambda: _check_cut_cross_entropy(t, arm, where),
        lambda: _check_float8(t, arm, where),
        lambda: _check_compiled_layers(t, arm, where),
    ]
    problems, refusals = Problems(), []
    for check in checks:
        try:
            with problems.check():
                check()
        except ConditionRefused as refusal:
            refusals.append(refusal)
    problems.raise_if_any()
    if refusals:
        raise refusals[0]


def _check_backend(t: TrainingArgs, where: str) -> None:
    """A criterion and packing the backend runs."""
    record = BACKENDS[t.backend]
    problems = []
    if t.criterion not in record.criteria:
        problems.append(
            f"criterion {t.criterion!r} does not run with backend {t.backend!r}{where}: "
            f"backend {t.backend!r} takes criterion {list(record.criteria)}"
        )
    if t.packing and not record.packing:
        packing_backends = [name for name, candidate in BACKENDS.items() if candidate.packing]
        problems.append(
            f"packing does not run with backend {t.backend!r}{where}: backends {packing_backends} pack; "
            f"use packing false with {t.backend!r}"
        )
    if problems:
        raise SpecError(*problems)


def _check_learning_rate(t: TrainingArgs, where: str) -> None:
    if t.learning_rate > 1 and BACKENDS[t.backend].trains and not t.allow_learning_rate_above_1:
        raise SpecError(
            f"training_args.learning_rate {t.learning_rate!r} is above 1{where}: learning rates are "
            "fractions (2.0e-5, 6.0e-4), and one above 1 is almost always a slip of units; write it as a fraction, or "
            "set training_args.allow_learning_rate_above_1: true if it is meant"
        )


def _check_evaluation(t: TrainingArgs, where: str) -> None:
    """Held-out evaluation that evaluates something, of a run that trains."""
    if t.eval_steps and not t.eval_examples:
        raise SpecError(
            f"training_args.eval_steps ({t.eval_steps}) with eval_examples 0{where}: nothing is held out, "
            "so nothing would be evaluated; set eval_examples (the examples to hold out) or eval_steps 0"
        )
    if t.eval_examples and t.eval_steps > t.max_steps:
        raise SpecError(
            f"training_args.eval_steps ({t.eval_steps}) is larger than max_steps ({t.max_steps}){where}: no evaluation "
            "falls between the first step and the last, which are evaluated anyway; set eval_steps at most "
            f"{t.max_steps}, or 0 (only after the last step)"
        )
    if t.eval_examples and not BACKENDS[t.backend].trains:
        raise SpecError(
            f"training_args.eval_examples ({t.eval_examples}) with backend {t.backend!r}{where}: "
            "it trains nothing, so there is nothing to evaluate; set eval_examples 0"
        )


def _check_generated_data(t: TrainingArgs, where: str) -> None:
    """Generated data that leaves examples to train on, at least one batch of them."""
    if not t.dataset_name.startswith(SYNTHETIC_PREFIX):
        return
    training_examples = t.synthetic_num_examples - t.eval_examples
    if t.eval_examples >= t.synthetic_num_examples:
        raise SpecError(
            f"training_args.eval_examples ({t.eval_examples}) holds out every one of the "
            f"synthetic_num_examples ({t.synthetic_num_examples}){where}: none would be left to train on"
        )
    if not t.packing and training_examples < t.examples_per_step:
        held_out = f" once eval_examples ({t.eval_examples}) are held out" if t.eval_examples else ""
        ranks = f" on each of {t.world_size} GPUs" if t.world_size > 1 else ""
        raise SpecError(
            f"training_args.synthetic_num_examples ({t.synthetic_num_examples}) is below one batch of "
            f"per_device_train_batch_size {t.per_device_train_batch_size}{ranks}{held_out}{where}: a "
            "batch cannot hold more examples than the dataset has"
        )


def _check_liger(t: TrainingArgs, arm: Arm, where: str) -> None:
    """Liger's kernels where the model type has them and they run; SwitchBack on a GPU."""
    if arm.switchback and t.device == "cpu":
        raise SpecError(f"arm {arm.name!r}{where}: SwitchBack layers need a CUDA GPU, and device is 'cpu'")
    if not arm.liger:
        return
    if set(arm.liger_kernels) & set(LOSS_KERNELS) and t.criterion != "model":
        raise SpecError(
            f"arm {arm.name!r} with criterion {t.criterion!r}{where}: the loss is computed outside the "
            "model, so this Liger loss kernel would never run; use criterion 'model'"
        )
    kind = model_type(t.model_name)
    if kind is not None and kind not in supported_model_types():
        raise ConditionRefused(
            f"arm {arm.name!r}: Liger has no kernels for model type {kind!r} (training_args.model_name "
            f"{t.model_name!r}){where}; Liger patches {supported_model_types()}. {NOT_RUN}"
        )
    missing = [k for k in arm.liger_kernels if kind is not None and k not in kernel_switches(kind)]
    if missing:
        raise ConditionRefused(
            f"arm {arm.name!r}: Liger has no {' / '.join(map(repr, missing))} kernel for model type "
            f"{kind!r}{where}; it has {list(kernel_switches(kind))}"
        )


def _check_model_shape(training_args: TrainingArgs, where: str) -> None:
    """What the model's config (known at planning for a `random:` model or a local directory) rules out of this
    condition: sequences longer than an absolute position table, LoRA targets that name no module."""
    t = training_args
    config = config_at_planning(t.model_name, t.model_config_overrides)
    if config is None:
        return
    problems = [position_table_problem(t.model_name, config, t.max_seq_length, where)]
    if t.lora_rank > 0:
        problems.append(lora_target_problem(t.model_name, config, t.lora_target_modules, where))
    problems = [p for p in problems if p]
    if problems:
        raise SpecError(*problems)


def _check_float8(training_args: TrainingArgs, arm: Arm, where: str) -> None:
    """torchao's float8 training where it can run: a full fine-tune (LoRA's adapters train beside frozen weights
    float8 does not convert), no other replacement of the linear layers (SwitchBack), a CUDA device, and torchao
    installed (looked up where planning runs: the training image); on several GPUs the plain loop, which shares the
    converted model itself. The GPU's compute capability (8.9 or newer) is known only on the machine that trains
    (`running.float8.check_float8_runs_here`)."""
    t = training_args
    if not arm.float8:
        return
    if t.lora_rank > 0:
        raise SpecError(
            f"arm {arm.name!r} with lora_rank {t.lora_rank}{where}: float8 training converts the full linear layers "
            "it trains, and LoRA trains adapters beside frozen weights; use lora_rank 0 (a full fine-tune)"
        )
    if arm.switchback:
        raise SpecError(
            f"arm {arm.name!r}{where}: SwitchBack and float8 both replace the linear layers' matmuls; compare them "
            "as two arms"
        )
    if t.world_size > 1 and t.backend != "plain_loop":
        raise SpecError(
            f"arm {arm.name!r} with {t.world_size} GPUs and backend {t.backend!r}{where}: float8 training on several "
            "GPUs runs with backend 'plain_loop', which shares the converted model itself (under FSDP2 its weights "
            "are all-gathered in float8); the Trainer backends share it through accelerate, which the project does "
            "not set up for float8. Set backend 'plain_loop', or num_gpus 1"
        )
    if t.device == "cpu":
        raise SpecError(
            f"arm {arm.name!r}{where}: float8 training needs a CUDA GPU of compute capability "
            f"{'.'.join(map(str, FLOAT8_MIN_CAPABILITY))} or newer, and device is 'cpu'"
        )
    import importlib.util

    if importlib.util.find_spec(FLOAT8_MODULE) is None:
        raise SpecError(
            f"arm {arm.name!r}{where} needs the package torchao, which is not installed here: {FLOAT8_INSTALL_HINT}"
        )


def _check_cut_cross_entropy(training_args: TrainingArgs, arm: Arm, where: str) -> None:
    """Cut Cross-Entropy (the arm component or the criterion `cce`) where it can compute the loss: a backend that
    computes the loss itself, no second loss beside it (another criterion, Liger's loss kernels), a dtype its
    backward kernel takes, and the package installed (looked up where planning runs: the training image)."""
    t = training_args
    if not (arm.cce or t.criterion == CCE_CRITERION):
        return
    record = BACKENDS[t.backend]
    if arm.cce and not record.computes_loss_itself:
        own_loss = [name for name, candidate in BACKENDS.items() if candidate.computes_loss_itself]
        raise SpecError(
            f"arm {arm.name!r} does not run with backend {t.backend!r}{where}: Cut Cross-Entropy computes the loss "
            f"outside the model's forward, and {t.backend!r} takes the loss the model's forward returns; use backend "
            f"{own_loss[0]!r} (backends {own_loss} compute the loss themselves)"
        )
    if arm.cce and record.own_loss_one_gpu_only and t.world_size > 1:
        raise SpecError(
            f"arm {arm.name!r} with backend {t.backend!r} on {t.world_size} GPUs{where}: the Trainer's DDP/FSDP "
            "wrapper owns the forward, and Cut Cross-Entropy calls the decoder alone; use backend 'plain_loop' on "
            "several GPUs"
        )
    if arm.cce and t.criterion not in ("model", CCE_CRITERION):
        raise SpecError(
            f"arm {arm.name!r} with criterion {t.criterion!r}{where}: the arm's Cut Cross-Entropy computes the loss, "
            f"and so would criterion {t.criterion!r}; use criterion 'model' (the arm then replaces the model's loss)"
        )
    if arm.cce and arm.liger and not arm.liger_kernels and not arm.liger_without_loss:
        kind = model_type(t.model_name)
        switched_on = sorted(set(default_kernels(kind)) & set(LOSS_KERNELS)) if kind is not None else []
        if kind is None or switched_on:
            which = (
                f"for model type {kind!r} switch on {switched_on}"
                if kind is not None
                else f"switch on a loss kernel for nearly every model type, and the type of {t.model_name!r} is known "
                "only once it is downloaded"
            )
            raise SpecError(
                f"arm {arm.name!r}{where}: Liger's defaults {which}, which would compute the loss as Cut "
                "Cross-Entropy does; for Liger's layer kernels with CCE's loss use arm 'liger-without-loss+cce' "
                "(or 'liger' with criterion 'cce'), or chosen layer kernels with the arm (e.g. 'liger:rope+cce')"
            )
    if t.dtype == "float32" and t.device != "cpu" and record.trains:
        raise SpecError(
            f"dtype 'float32' with Cut Cross-Entropy{where}: its backward kernel takes float16 or bfloat16 hidden "
            "states on a GPU; use dtype 'bfloat16' (or 'auto', bfloat16 on a GPU)"
        )
    import importlib.util

    # Looked up, not imported: importing it loads torch and Triton, seconds on a machine that only plans.
    if importlib.util.find_spec(CCE_MODULE) is None:
        raise SpecError(
            f"Cut Cross-Entropy (arm {arm.name!r}, criterion {t.criterion!r}){where} needs the package "
            f"cut-cross-entropy, which is not installed here: {CCE_INSTALL_HINT}"
        )


def _surely_padded(t: TrainingArgs) -> bool:
    """Whether batches of `t` will hold padding, as far as planning can know: several rows a batch, not packed, of
    generated examples that need not fill max_seq_length (a word is at least one token: examples of at least
    max_seq_length words always do). Another dataset's lengths are known once it is tokenized."""
    generated = t.dataset_name.startswith(SYNTHETIC_PREFIX)
    padded = not t.packing and t.per_device_train_batch_size > 1
    return generated and padded and t.synthetic_min_words < t.max_seq_length


def _check_attention_and_allocator(training_args: TrainingArgs, where: str) -> None:
    """What the settings alone rule out of an attention kernel (a CUDA-only kernel on device 'cpu'; on a GPU a
    dtype, or the packing mask, the kernel does not take) and of the CUDA allocator on a CPU. What only the GPU
    decides (its compute capability, a padding mask in a batch) ends the run as an error naming it."""
    t = training_args
    attention = ATTENTIONS[t.attention]
    on_cpu = t.device == "cpu"
    if attention.cuda_only and on_cpu:
        on_a_cpu = [name for name, candidate in ATTENTIONS.items() if not candidate.cuda_only]
        raise SpecError(
            f"training_args.attention {t.attention!r} with device 'cpu'{where}: PyTorch's {attention.sdpa_backend} "
            f"kernel runs on CUDA GPUs only; on a CPU use attention {on_a_cpu}"
        )
    if attention.cuda_dtypes and t.dtype not in ("auto", *attention.cuda_dtypes) and not on_cpu:
        raise SpecError(
            f"training_args.attention {t.attention!r} with dtype {t.dtype!r}{where}: on a GPU PyTorch's "
            f"{attention.sdpa_backend} kernel takes dtype {list(attention.cuda_dtypes)} only; use dtype 'bfloat16' "
            "(or 'auto'), or attention 'efficient' or 'math'"
        )
    if attention.name == "flash" and t.packing and not on_cpu:
        raise SpecError(
            f"training_args.attention 'flash' with packing{where}: packed rows reach SDPA with a block-diagonal "
            "attention mask, and PyTorch's FLASH_ATTENTION kernel takes no mask on a GPU; use packing false, or "
            "attention 'sdpa' or 'efficient'"
        )
    if attention.name == "flash" and not on_cpu and _surely_padded(t):
        raise SpecError(
            f"training_args.attention 'flash' with padded batches of {t.per_device_train_batch_size} rows of "
            f"generated examples of {t.synthetic_min_words}-{t.synthetic_max_words} words{where}: a row shorter than "
            f"its batch's longest ({t.max_seq_length} tokens at most) is masked, and PyTorch's FLASH_ATTENTION "
            "kernel takes no mask on a GPU (the run would fail at its first step); use packing true (no padding), "
            "per_device_train_batch_size 1, or attention 'sdpa' or 'efficient'"
        )
    if t.allocator != "default" and on_cpu:
        raise SpecError(
            f"training_args.allocator {t.allocator!r} with device 'cpu'{where}: it configures PyTorch's CUDA caching "
            "allocator, which a CPU run does not use; use allocator 'default'"
        )


def _check_memory_cap(training_args: TrainingArgs, where: str) -> None:
    """An emulated GPU size (`gpu_memory_cap_gib`) caps torch's CUDA allocator: nothing on a CPU, and a cap that
    leaves torch nothing once the CUDA context is counted could only run out of memory. Whether it is above the GPU
    is checked where the GPU is known (`prediction.grid.check_memory_cap`, and the run itself)."""
    t = training_args
    if not t.gpu_memory_cap_gib:
        return
    if t.device == "cpu":
        raise SpecError(
            f"training_args.gpu_memory_cap_gib {t.gpu_memory_cap_gib:g} with device 'cpu'{where}: it caps PyTorch's "
            "CUDA allocator, which a CPU run does not use; leave gpu_memory_cap_gib 0, or train on a GPU"
        )
    if t.gpu_memory_cap_gib * GIB <= CUDA_CONTEXT_BYTES:
        raise SpecError(
            f"training_args.gpu_memory_cap_gib {t.gpu_memory_cap_gib:g}{where}: a GPU of this size leaves torch "
            f"nothing once the CUDA context ({CUDA_CONTEXT_BYTES / GIB:g} GiB) is counted; it is the card's whole "
            "memory in GiB, as nvidia-smi reports it (an 80 GB H100: 79.6)"
        )


def _check_compiled_layers(training_args: TrainingArgs, arm: Arm, where: str) -> None:
    """A compiled arm compiles its decoder layers: refused where FSDP2 with gradient checkpointing and the run's
    transformers (the software set's pin, else the installed release) would leave them uncompiled."""
    import importlib.metadata

    t = training_args
    try:
        pinned = software_sets.parse(t.software_set).get("transformers")
    except SpecError:  # a misspelt set is named by the settings' own check
        return
    version = pinned or importlib.metadata.version("transformers")
    source = "the software set's pin" if pinned else "installed"
    problem = uncompiled_layers_problem(arm, t.gradient_checkpointing, t.sharded_by_fsdp, version, where, source)
    if problem:
        raise ConditionRefused(problem)


# The settings that tune DDP alone (`running.distributed.share_model`).
DDP_TUNING = ("ddp_bucket_cap_mb", "ddp_gradient_as_bucket_view")


def _check_parallelism(training_args: TrainingArgs, where: str, swept: dict[str, Any]) -> None:
    """A run on several GPUs says how it shares the training, and trains (its backend builds an optimizer); a
    parallelism on one GPU only where the GPU count is swept (the one-GPU point of a scaling grid)."""
    t = training_args
    if t.world_size == 1:
        if t.parallelism != "none" and not {"num_gpus", "num_nodes"} & swept.keys():
            raise SpecError(
                f"training_args.parallelism {t.parallelism!r} with num_gpus 1 × num_nodes 1{where}: a run on one GPU "
                f"trains without a process group, so {t.parallelism} would change nothing; set num_gpus to "
                f"{[n for n in GPUS_PER_NODE if n > 1]} (or sweep it) or parallelism 'none'"
            )
        return
    layout = f"num_gpus {t.num_gpus} × num_nodes {t.num_nodes} ({t.world_size} GPUs)"
    tuned = [name for name in DDP_TUNING if getattr(t, name) != TrainingArgs.__dataclass_fields__[name].default]
    if tuned and t.parallelism != "ddp":
        raise SpecError(
            f"training_args.{' and '.join(tuned)} with parallelism {t.parallelism!r}{where}: they tune DDP's "
            "gradient all-reduce and change nothing else; set parallelism 'ddp' or leave them at their defaults"
        )
    if t.ddp_gradient_as_bucket_view and t.backend != "plain_loop":
        raise SpecError(
            f"training_args.ddp_gradient_as_bucket_view with backend {t.backend!r}{where}: the Trainer backends wrap "
            "the model in DDP through accelerate, which takes the bucket size alone (ddp_bucket_cap_mb); use backend "
            "'plain_loop' or leave it false"
        )
    if t.parallelism == "none":
        raise SpecError(
            f"training_args.parallelism 'none' with {layout}{where}: several GPUs share a run through "
            f"parallelism {[p for p in PARALLELISMS if p != 'none']}"
        )
    if not BACKENDS[t.backend].trains:
        raise SpecError(
            f"backend {t.backend!r} with {layout}{where}: it measures one GPU's forward pass; set num_gpus 1 and "
            "num_nodes 1"
        )
