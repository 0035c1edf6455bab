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

GIB = 2**30
# What torch cannot reserve of nvidia-smi's total: the driver's own reserve and the CUDA context (on an H100, torch
# sees 79.18 of 79.65 GiB and the context takes 0.73 GiB of it; an H200's frontier probes reserved up to 138.8 GiB).
# `prediction.gpus.usable_bytes` subtracts it; a GPU emulated smaller than it (`gpu_memory_cap_gib`) is refused.
CUDA_CONTEXT_BYTES = 1.25 * GIB


@dataclass(frozen=True)
class Backend:
    """A training backend (`TrainingArgs.backend`, a module of `finetune_bench.running.backends`) and what it can
    do: the criteria it runs, whether it implements `packing`, whether it trains LoRA adapters (`lora_rank` > 0),
    whether it trains (builds an optimizer and steps it; on several GPUs
    only one that trains runs) or measures forward passes only, and whether an arm component that replaces the loss
    (`cce`) can run in it: the plain loop computes the loss itself, the Trainers through their `compute_loss`
    (`running.backends.trainer_common.cut_cross_entropy_trainer`) on one GPU; on several, the Trainers' DDP and FSDP
    wrappers own the forward, which Cut Cross-Entropy's call of the decoder alone would bypass."""

    name: str
    criteria: tuple[str, ...]
    packing: bool = False
    lora: bool = False
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
# A `random:` model's tokenizer (`sources.models`) is trained offline on generated text, asking for the
# architecture's vocabulary up to OFFLINE_TOKENIZER_VOCAB tokens; that text yields at most OFFLINE_TOKENIZER_TOKENS
# (checked against the trained tokenizer in tests/sources). The embedding and LM head keep the architecture's full
# vocabulary, so the model's cost is unchanged; the tokenizer only needs to cover the generated text.
OFFLINE_TOKENIZER_VOCAB = 8192
OFFLINE_TOKENIZER_TOKENS = 5691


def offline_tokenizer_tokens(vocab_size: int) -> int:
    """How many tokens the offline tokenizer of a `random:` model whose architecture has `vocab_size` ends with."""
    return min(vocab_size, OFFLINE_TOKENIZER_VOCAB, OFFLINE_TOKENIZER_TOKENS)


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
    """A model or dataset name meant as a local path (not a hub id); a dataset's `file://` URL is one too."""
    return name.startswith(("/", "./", "../", "~", FILE_URL))


# A dataset may be named by a `file://` URL: it is the local path after the prefix. No other URL names a model or a
# dataset (they are fetched from the hub, or read from a path mounted where the tasks run).
FILE_URL = "file://"
# The most characters a local path may have (Linux's PATH_MAX is 4096 bytes, each name in it at most 255); a name
# of a hub id is bounded by the hub itself (`huggingface_hub.utils.validate_repo_id`: 96 a part).
MAX_PATH_CHARS = 4096
MAX_PATH_PART_BYTES = 255
# The most characters of a hub dataset's config or split expression (the hub's names are far shorter).
MAX_NAME_CHARS = 256
# What else than a hub id an inputs file may name a model or a dataset by, for messages.
OTHER_MODEL_NAMES = "a local directory ('/…', './…', '~/…') or 'random:<architecture>'"
OTHER_DATASET_NAMES = "a local path ('/…', './…', '~/…' or a file:// URL) or 'synthetic:<format>'"


def local_path(name: str) -> Path:
    """The local path a model or dataset name stands for (a `file://` URL's path), `~` expanded."""
    return Path(name.removeprefix(FILE_URL)).expanduser()


def check_path_length(key: str, name: str) -> None:
    """A path the filesystem can take: at most `MAX_PATH_CHARS` characters, each part at most
    `MAX_PATH_PART_BYTES` bytes (a longer one fails every file operation with `File name too long`)."""
    path = name.removeprefix(FILE_URL)
    if len(path) > MAX_PATH_CHARS:
        raise SpecError(f"{key}: the path is {len(path):,} characters long, at most {MAX_PATH_CHARS:,}: {_short(name)}")
    long_parts = [part for part in path.split("/") if len(part.encode()) > MAX_PATH_PART_BYTES]
    if long_parts:
        raise SpecError(
            f"{key}: the path has a part of {len(long_parts[0].encode()):,} bytes, at most {MAX_PATH_PART_BYTES} "
            f"(a file or directory name no filesystem takes): {_short(name)}"
        )


def _short(name: str, keep: int = 60) -> str:
    """`name` quoted, cut to its first `keep` characters with the count of the rest."""
    return repr(name) if len(name) <= keep else f"{name[:keep]!r}… ({len(name):,} characters)"


def exists_locally(name: str) -> bool:
    """Whether `name` is an existing local path (False for one the filesystem cannot even look up)."""
    try:
        return local_path(name).exists()
    except (OSError, ValueError):  # too long, a NUL byte
        return False


def check_hub_id(key: str, name: str, others: str) -> None:
    """A hub repo id as Hugging Face documents it (`huggingface_hub.utils.validate_repo_id`: 'name' or
    'namespace/name', letters, digits, '-', '_', '.', at most 96 characters a part); `others` says what else the key
    may name. A relative path that exists here (`data/train.jsonl`) is a local one, as the sources read it."""
    if "://" in name:
        scheme = name.split("://", 1)[0]
        raise SpecError(
            f"{key}: {_short(name)} is a {scheme}:// URL, which is not read here; name a hub id ('namespace/name'), "
            f"{others}"
        )
    if not name.strip():
        raise SpecError(f"{key} is empty; name a hub id ('namespace/name'), {others}")
    if exists_locally(name):
        return
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise SpecError(
            f"{key}: {_short(name)} is not a hub id (Hugging Face's shape: 'namespace/name', letters, digits, '-', "
            f"'_', '.', at most 96 characters a part, no '--' or '..'), nor {others}"
        ) from None


def check_model_name(model_name: str) -> None:
    """A bundled architecture that exists, a local path that exists, or a hub id of the hub's shape (whether the
    hub has it is known when it is fetched)."""
    key = "training_args.model_name"
    if model_name.startswith(RANDOM_PREFIX):
        arch, known = model_name.removeprefix(RANDOM_PREFIX), architectures()
        if arch not in known:
            raise SpecError(f"{key}: no bundled architecture {_short(arch)}{closest(arch, known)}; known: {known}")
    elif looks_like_path(model_name) and not model_name.startswith(FILE_URL):
        check_path_length(key, model_name)
        path = Path(model_name).expanduser()
        if not path.exists():
            raise SpecError(f"{key}: the local path {model_name!r} does not exist ({WHERE_PATHS_ARE_READ})")
        if not (path.is_dir() and (path / "config.json").is_file()):
            raise SpecError(f"{key}: {model_name!r} is not a model directory (a directory with a config.json)")
        if not os.access(path / "config.json", os.R_OK):
            raise SpecError(f"{key}: {model_name!r} cannot be read")
    else:
        check_hub_id(key, model_name, OTHER_MODEL_NAMES)


def check_dataset(dataset_name: str, config: str, split: str) -> None:
    """A generated format that exists, a local path that exists, or, for a hub dataset known by name, a
    config and split it has (so that a wrong one fails here, not after a download)."""
    key = "training_args.dataset_name"
    if dataset_name.startswith(SYNTHETIC_PREFIX):
        fmt = dataset_name.removeprefix(SYNTHETIC_PREFIX)
        if fmt not in SYNTHETIC_FORMATS:
            raise SpecError(
                f"training_args.dataset_name: no synthetic format {fmt!r}; known: "
                f"{[SYNTHETIC_PREFIX + f for f in SYNTHETIC_FORMATS]}"
            )
        return
    if looks_like_path(dataset_name):
        check_path_length(key, dataset_name)
        path = local_path(dataset_name)
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
    check_hub_id(key, dataset_name, OTHER_DATASET_NAMES)
    for name, value in (("dataset_config", config), ("dataset_split", split)):
        if len(value) > MAX_NAME_CHARS:
            raise SpecError(f"training_args.{name}: at most {MAX_NAME_CHARS} characters, got {_short(value)}")
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
