"""One condition of the grid: the settings that cannot run together (a criterion or packing the backend does not
run, LoRA where no backend applies it, float16 sharded by FSDP, an attention kernel the device or dtype rules out, a
model whose shape rules out the sequence length, ...), and what its arm needs (`inputs.arm_checks`). Every problem of
a condition is named at once, before anything is downloaded; a condition that could run but not here (a liger arm on a
model type Liger cannot patch) is refused alone (`ConditionRefused`) and the rest of the grid still runs. A setting
that acts in no condition is refused across the grid (`inputs.validation.check_settings_act`), not here."""

from typing import Any

from finetune_bench.inputs.arm_checks import check_compiled_layers, check_cut_cross_entropy, check_float8, check_liger
from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.catalog import (
    ATTENTIONS,
    BACKENDS,
    BITSANDBYTES_OPTIMIZERS,
    CUDA_CONTEXT_BYTES,
    GIB,
    PARALLELISMS,
    SYNTHETIC_PREFIX,
)
from finetune_bench.inputs.errors import ConditionRefused, Problems, SpecError
from finetune_bench.inputs.model_checks import lora_target_problem, position_table_problem
from finetune_bench.inputs.model_overrides import check_model_config_overrides, config_at_planning
from finetune_bench.inputs.settings import TrainingArgs


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
        lambda: check_liger(t, arm, where),
        lambda: check_cut_cross_entropy(t, arm, where),
        lambda: check_float8(t, arm, where),
        lambda: check_compiled_layers(t, arm, where),
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


def _check_evaluation(t: TrainingArgs, where: str) -> None:
    """Held-out evaluation that evaluates between the first step and the last, of a run that trains (eval_steps
    without held-out examples acts nowhere: its scope, `check_settings_act`)."""
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


# The settings that tune DDP alone (`running.distributed.share_model`).
DDP_TUNING = ("ddp_bucket_cap_mb", "ddp_gradient_as_bucket_view")


def _check_parallelism(training_args: TrainingArgs, where: str, swept: dict[str, Any]) -> None:
    """A run on several GPUs says how it shares the training, and trains (its backend builds an optimizer). A
    parallelism on one GPU, and DDP's tuning where no condition runs DDP on several GPUs, act nowhere: their scopes
    refuse them (`check_settings_act`). What a scope cannot say is refused here: DDP's tuning on a point of a
    parallelism sweep that shares the GPUs otherwise, the bucket view with a Trainer backend."""
    t = training_args
    if t.world_size == 1:
        return
    layout = f"num_gpus {t.num_gpus} × num_nodes {t.num_nodes} ({t.world_size} GPUs)"
    tuned = [name for name in DDP_TUNING if getattr(t, name) != TrainingArgs.__dataclass_fields__[name].default]
    if tuned and t.parallelism != "ddp" and "parallelism" in swept:
        raise SpecError(
            f"training_args.{' and '.join(tuned)} with parallelism {t.parallelism!r}{where}: they tune DDP's "
            "gradient all-reduce and change nothing else; set parallelism 'ddp' or leave them at their defaults"
        )
    if t.ddp_gradient_as_bucket_view and t.parallelism == "ddp" and t.backend != "plain_loop":
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


def _check_attention_and_allocator(training_args: TrainingArgs, where: str) -> None:
    """What the settings alone rule out of an attention kernel (a CUDA-only kernel on device 'cpu'; on a GPU a
    dtype, or the packing mask, the kernel does not take). What only the GPU decides (its compute capability, a
    padding mask in a batch) ends the run as an error naming it. The CUDA allocator on a CPU acts nowhere: its scope
    (`check_settings_act`)."""
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


def _surely_padded(t: TrainingArgs) -> bool:
    """Whether batches of `t` will hold padding, as far as planning can know: several rows a batch, not packed, of
    generated examples that need not fill max_seq_length (a word is at least one token: examples of at least
    max_seq_length words always do). Another dataset's lengths are known once it is tokenized."""
    generated = t.dataset_name.startswith(SYNTHETIC_PREFIX)
    padded = not t.packing and t.per_device_train_batch_size > 1
    return generated and padded and t.synthetic_min_words < t.max_seq_length


def _check_memory_cap(training_args: TrainingArgs, where: str) -> None:
    """An emulated GPU size (`gpu_memory_cap_gib`) caps torch's CUDA allocator: a cap that leaves torch nothing once
    the CUDA context is counted could only run out of memory. Whether it is above the GPU is checked where the GPU is
    known (`prediction.grid.check_memory_cap`, and the run itself); on a CPU it acts nowhere (its scope,
    `check_settings_act`)."""
    t = training_args
    if t.gpu_memory_cap_gib and t.gpu_memory_cap_gib * GIB <= CUDA_CONTEXT_BYTES:
        raise SpecError(
            f"training_args.gpu_memory_cap_gib {t.gpu_memory_cap_gib:g}{where}: a GPU of this size leaves torch "
            f"nothing once the CUDA context ({CUDA_CONTEXT_BYTES / GIB:g} GiB) is counted; it is the card's whole "
            "memory in GiB, as nvidia-smi reports it (an 80 GB H100: 79.6)"
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
