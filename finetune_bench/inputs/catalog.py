"""The names an inputs file may use, each list in one place: backends, criteria, optimizers, dtypes,
model and dataset sources (bundled architectures, generated data, the hub datasets known by name).

Also the checks that a model or dataset name can be found, run before anything is downloaded.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

from finetune_bench.inputs.errors import SpecError, closest
from finetune_bench.inputs.loss_paths import LOSS_PATHS

# How the loss is computed (see `TrainingArgs.criterion`), one name per criterion of the loss paths; the first is
# the default.
CRITERIA = tuple(dict.fromkeys(path.criterion for path in LOSS_PATHS))
# What the plain loop computes: every criterion but TRL's chunked loss (TRL's SFTTrainer's own).
PLAIN_LOOP_CRITERIA = tuple(criterion for criterion in CRITERIA if criterion != "trl")


@dataclass(frozen=True)
class Backend:
    """A training backend (`TrainingArgs.backend`, a module of `finetune_bench.running.backends`) and what it can
    do: the criteria it runs, whether it implements `packing`, whether it trains LoRA adapters (`lora_rank` > 0),
    whether it tokenizes the examples itself (`running.backends.data.tokenize_prompt_completion`; TRL's
    SFTTrainer tokenizes on its own), whether it trains (builds an optimizer and steps it; on several GPUs
    only one that trains runs) or measures forward passes only, and whether an arm component that replaces the loss
    (`cce`) can run in it: the plain loop computes the loss itself, the Trainers through their `compute_loss`
    (`running.backends.trainer_common.cut_cross_entropy_trainer`) on one GPU; on several, the Trainers' DDP and FSDP
    wrappers own the forward, which Cut Cross-Entropy's call of the decoder alone would bypass."""

    name: str
    criteria: tuple[str, ...]
    packing: bool = False
    lora: bool = False
    own_tokenization: bool = True
    trains: bool = True
    computes_loss_itself: bool = False
    # the loss computed by the backend on one GPU only (the Trainers: see above)
    own_loss_one_gpu_only: bool = False


# Each backend's record, by name (the names `TrainingArgs.backend` accepts).
BACKENDS = {
    backend.name: backend
    for backend in (
        Backend(
            "trl_sft",
            ("model", "trl"),
            packing=True,
            own_tokenization=False,
            computes_loss_itself=True,
            own_loss_one_gpu_only=True,
        ),
        Backend("hf_trainer", ("model",), lora=True, computes_loss_itself=True, own_loss_one_gpu_only=True),
        Backend("plain_loop", PLAIN_LOOP_CRITERIA, packing=True, computes_loss_itself=True),
        Backend("forward_only", PLAIN_LOOP_CRITERIA, trains=False, computes_loss_itself=True),
    )
}


# transformers' `optim` names that every optimizer-building backend can build: the Trainer backends through
# TrainingArguments, the plain loop through `Trainer.get_optimizer_cls_and_kwargs` (each was built and
# stepped there on a CPU; `adamw_8bit` only with bitsandbytes, on a CUDA device).
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "sgd", "adafactor", "adagrad", "rmsprop", "adamw_8bit")
# Optimizers whose states live in bitsandbytes' 8-bit CUDA kernels.
BITSANDBYTES_OPTIMIZERS = ("adamw_8bit",)
DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICES = ("auto", "cuda", "cpu")
# How a condition on several GPUs shares the training (`TrainingArgs.parallelism`): `none` (one GPU), `ddp`
# (data parallel: a full replica per GPU, gradients all-reduced), `fsdp` (PyTorch FSDP2: parameters, gradients and
# optimizer state sharded over the GPUs).
PARALLELISMS = ("none", "ddp", "fsdp")
# The GPUs per node and the nodes a condition may ask for: each (nodes, GPUs per node) layout but one GPU on one
# node is a PyTorch Elastic task of its own (`tasks.train`), so the list is finite.
GPUS_PER_NODE = (1, 2, 4, 8)
NODE_COUNTS = (1, 2, 4, 8)
# How generated response lengths spread over their range (see `TrainingArgs.synthetic_length_distribution`).
SYNTHETIC_LENGTH_DISTRIBUTIONS = ("uniform", "fixed", "normal", "lognormal")


@dataclass(frozen=True)
class Attention:
    """How a model's attention runs (`TrainingArgs.attention`): transformers' attention implementation, the one
    backend of `torch.nn.functional.scaled_dot_product_attention` it is pinned to (a `torch.nn.attention.SDPBackend`
    member; "" lets PyTorch choose per call), and what that backend needs. On a CPU PyTorch has a math and a flash
    kernel; the memory-efficient and cuDNN kernels exist for CUDA only. On a GPU, FlashAttention takes float16 or
    bfloat16 on compute capability 8.0 or newer."""

    name: str
    attn_implementation: str
    sdpa_backend: str = ""
    cuda_only: bool = False
    # On a CUDA GPU: the dtypes the kernel takes (empty: any) and the oldest compute capability it runs on.
    cuda_dtypes: tuple[str, ...] = ()
    min_compute_capability: tuple[int, int] = (0, 0)


# Each attention by name (the names `TrainingArgs.attention` accepts); the first is the default.
ATTENTIONS = {
    attention.name: attention
    for attention in (
        Attention("sdpa", "sdpa"),
        Attention("eager", "eager"),
        Attention(
            "flash", "sdpa", "FLASH_ATTENTION", cuda_dtypes=("float16", "bfloat16"), min_compute_capability=(8, 0)
        ),
        Attention("efficient", "sdpa", "EFFICIENT_ATTENTION", cuda_only=True),
        Attention("cudnn", "sdpa", "CUDNN_ATTENTION", cuda_only=True),
        Attention("math", "sdpa", "MATH"),
    )
}
# PyTorch's CUDA caching allocator (`TrainingArgs.allocator`): `default`, or `expandable_segments` (segments that
# grow in place instead of new fixed-size blocks, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`).
ALLOCATORS = ("default", "expandable_segments")

# Model names: `random:<architecture>` builds a random-init model from a bundled config (no download).
RANDOM_PREFIX = "random:"
ARCHITECTURES_DIR = Path(__file__).resolve().parent.parent / "architectures"
# Local dataset files `datasets` can load, by suffix (a directory is a `save_to_disk` one).
LOCAL_DATASET_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")
# Dataset names: `synthetic:<format>` is generated offline.
SYNTHETIC_PREFIX = "synthetic:"
SYNTHETIC_FORMATS = ("alpaca",)


def architectures() -> list[str]:
    """Names accepted after `random:`, one per bundled config file (the single source of that list)."""
    return sorted(p.stem for p in ARCHITECTURES_DIR.glob("*.json"))


def architecture_config(name: str) -> dict:
    """The bundled config of an architecture, as a dict."""
    path = ARCHITECTURES_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(architectures())}")
    return json.loads(path.read_text())


@dataclass(frozen=True)
class HubDataset:
    """A hub dataset known by name: its format (a name in `finetune_bench.sources.formats.FORMATS`), its
    configs (the default first; () when it has none to name) and the splits that can be trained on."""

    format: str
    configs: tuple[str, ...]
    splits: tuple[str, ...]


HUB_DATASETS = {
    "tatsu-lab/alpaca": HubDataset("alpaca", (), ("train",)),
    # its test split's answerKey is empty (the answers are hidden)
    "tau/commonsense_qa": HubDataset("commonsense_qa", (), ("train", "validation")),
    "openai/gsm8k": HubDataset("gsm8k", ("main", "socratic"), ("train", "test")),
    # the revised GSM8K test set: one config, one split
    "madrylab/gsm8k-platinum": HubDataset("gsm8k", ("main",), ("test",)),
    "OpenAssistant/oasst1": HubDataset("oasst", (), ("train", "validation")),
}


def known_dataset(dataset_name: str) -> HubDataset | None:
    """The registry entry of a hub id (hub ids are case-insensitive), or None."""
    by_lower = {name.lower(): entry for name, entry in HUB_DATASETS.items()}
    return by_lower.get(dataset_name.lower())


def default_config(dataset_name: str, config: str = "") -> str | None:
    """The config to load: the one asked for, else the registry's default for a known id, else none."""
    if config:
        return config
    known = known_dataset(dataset_name)
    return known.configs[0] if known and known.configs else None


def split_names(split: str) -> list[str]:
    """The split names in a `datasets` split expression: "train[:10%]+validation" -> [train, validation]."""
    return [part.split("[", 1)[0].strip() for part in split.split("+")]


# A local path is read where the tasks run: with `union run --remote`, in the cluster's pods, not on the machine that
# started the execution.
WHERE_PATHS_ARE_READ = (
    "a local path is read where the workflow's tasks run; on a cluster that is a pod, which does not see the files "
    "of the machine the execution was started from: name a hub id there, or a path mounted in every pod"
)


def looks_like_path(name: str) -> bool:
    """A model or dataset name meant as a local path (not a hub id)."""
    return name.startswith(("/", "./", "../", "~"))


def check_model_name(model_name: str) -> None:
    """A bundled architecture that exists, or a local path that exists (a hub id is checked when fetched)."""
    if model_name.startswith(RANDOM_PREFIX):
        arch, known = model_name.removeprefix(RANDOM_PREFIX), architectures()
        if arch not in known:
            raise SpecError(
                f"training_args.model_name: no bundled architecture {arch!r}{closest(arch, known)}; known: {known}"
            )
    elif looks_like_path(model_name):
        path = Path(model_name).expanduser()
        if not path.exists():
            raise SpecError(
                f"training_args.model_name: the local path {model_name!r} does not exist ({WHERE_PATHS_ARE_READ})"
            )
        if not (path.is_dir() and (path / "config.json").is_file()):
            raise SpecError(
                f"training_args.model_name: {model_name!r} is not a model directory (a directory with a config.json)"
            )
        if not os.access(path / "config.json", os.R_OK):
            raise SpecError(f"training_args.model_name: {model_name!r} cannot be read")


def check_dataset(dataset_name: str, config: str, split: str) -> None:
    """A generated format that exists, a local path that exists, or, for a hub dataset known by name, a
    config and split it has (so that a wrong one fails here, not after a download)."""
    if dataset_name.startswith(SYNTHETIC_PREFIX):
        fmt = dataset_name.removeprefix(SYNTHETIC_PREFIX)
        if fmt not in SYNTHETIC_FORMATS:
            raise SpecError(
                f"training_args.dataset_name: no synthetic format {fmt!r}; known: "
                f"{[SYNTHETIC_PREFIX + f for f in SYNTHETIC_FORMATS]}"
            )
        return
    if looks_like_path(dataset_name):
        path = Path(dataset_name).expanduser()
        if not path.exists():
            raise SpecError(
                f"training_args.dataset_name: the local path {dataset_name!r} does not exist ({WHERE_PATHS_ARE_READ})"
            )
        if path.is_file() and path.suffix not in LOCAL_DATASET_SUFFIXES:
            raise SpecError(
                f"training_args.dataset_name: {dataset_name!r} is neither a `datasets.save_to_disk` directory nor a "
                f"file of {list(LOCAL_DATASET_SUFFIXES)}"
            )
        if not os.access(path, os.R_OK):
            raise SpecError(f"training_args.dataset_name: {dataset_name!r} cannot be read")
        return
    known = known_dataset(dataset_name)
    if known is None:
        return
    if config and config not in known.configs:
        has = f"configs {list(known.configs)}" if known.configs else "no configs (leave dataset_config empty)"
        raise SpecError(f"training_args.dataset_config: {dataset_name} has {has}, got {config!r}")
    for name in split_names(split):
        if name not in known.splits:
            raise SpecError(
                f"training_args.dataset_split: {dataset_name} has no split {name!r} to train on; "
                f"use one of {list(known.splits)}"
            )


def model_type(model_name: str) -> str | None:
    """The model type of a bundled architecture or a local model directory; None for a hub id (known once
    downloaded: a liger arm on a type Liger cannot patch then ends as an error result)."""
    if model_name.startswith(RANDOM_PREFIX):
        return architecture_config(model_name.removeprefix(RANDOM_PREFIX)).get("model_type")
    config = Path(model_name).expanduser() / "config.json"
    if looks_like_path(model_name) and config.exists():
        return json.loads(config.read_text()).get("model_type")
    return None
