"""Where the training settings act: the conditions in which each `TrainingArgs` field changes what a run does, and
how a message says them.

A field of `finetune_bench.inputs.settings.TrainingArgs` that does not act everywhere names one of these beside its
default (`rules.acts_only(default, holds, where)`). A setting set where it acts in no condition of the grid would
change nothing of what is measured, so planning refuses it with the `where` sentence
(`inputs.validation.check_settings_act`), `make migrate` leaves it out, and the settings reference says it. Each
predicate reads one condition's TrainingArgs; none reads the GPU, which planning may not have.
"""

from typing import Any

from finetune_bench.inputs import catalog
from finetune_bench.inputs.catalog import BACKENDS


def generated_data(t: Any) -> bool:
    return t.dataset_name.startswith(catalog.SYNTHETIC_PREFIX)


def real_dataset(t: Any) -> bool:
    return not generated_data(t)


def trains(t: Any) -> bool:
    return BACKENDS[t.backend].trains if t.backend in BACKENDS else True


def warms_up(t: Any) -> bool:
    return trains(t) and t.lr_scheduler_type != "constant"


def lora(t: Any) -> bool:
    return t.lora_rank > 0


def evaluates(t: Any) -> bool:
    return t.eval_examples > 0


def profiles(t: Any) -> bool:
    return t.profile


def probes_padded_shapes(t: Any) -> bool:
    return t.backend == "plain_loop" and not t.packing and t.device != "cpu"


def unmasked_cudnn_attention(t: Any) -> bool:
    """Whether cuDNN's attention may meet this condition's batches without an attention mask: SDPA left to choose
    (cuDNN first on recent GPUs) or pinned to cuDNN, on a GPU, one unpacked row a batch (transformers passes no mask
    where no row is padded, only the causal hint)."""
    return (
        t.device != "cpu" and t.attention in ("sdpa", "cudnn") and not t.packing and t.per_device_train_batch_size == 1
    )


def off_the_cpu(t: Any) -> bool:
    return t.device != "cpu"


def several_gpus(t: Any) -> bool:
    return t.num_gpus * t.num_nodes > 1


def ddp(t: Any) -> bool:
    return several_gpus(t) and t.parallelism == "ddp"


WITH_GENERATED_DATA = "with generated data (a dataset_name of synthetic:...)"
WITH_A_REAL_DATASET = "with a hub or local dataset (generated data has no splits)"
WHERE_IT_TRAINS = "where the backend trains (forward_only builds no optimizer and runs no backward)"
WHERE_IT_WARMS_UP = (
    "with a schedule that warms up (lr_scheduler_type other than 'constant', whose rate never changes) and a "
    "backend that trains"
)
WITH_LORA = "with LoRA (lora_rank above 0)"
WITH_HELD_OUT_EXAMPLES = "with held-out examples (eval_examples above 0)"
WITH_PROFILING = "with profiling on (profile: true)"
PADDED_PLAIN_LOOP_ON_A_GPU = "with the plain loop on padded batches on a GPU (backend plain_loop, packing false)"
WITHOUT_AN_ATTENTION_MASK = (
    "where cuDNN's attention meets batches without an attention mask on a GPU (attention 'sdpa' or 'cudnn', packing "
    "false, per_device_train_batch_size 1): PyTorch builds cuDNN's any-length plans only for a call without a mask, "
    "and a padded batch of several rows carries one (packed rows a block-diagonal one)"
)
ON_A_GPU = "on a GPU (device cuda, or auto where there is one: a CPU run uses no CUDA allocator)"
ON_SEVERAL_GPUS = "on several GPUs (num_gpus × num_nodes above 1)"
WITH_DDP = "with parallelism 'ddp' on several GPUs (num_gpus × num_nodes above 1)"
