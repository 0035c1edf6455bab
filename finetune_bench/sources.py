"""Where models and datasets come from: the hub, a local path, or an offline generator.

Everything here writes into a persistent directory (never a temporary one), so that a cached
download task's output path still exists on the next run.
"""

import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

from finetune_bench import formats
from finetune_bench.spec import SYNTHETIC_LENGTH_DISTRIBUTIONS

logger = logging.getLogger(__name__)

RANDOM_PREFIX = "random:"
SYNTHETIC_PREFIX = "synthetic:"
SYNTHETIC_FORMATS = ("alpaca",)
# What a prepared dataset directory records about its source (its format above all).
SOURCE_FILE = "source.json"
ARCHITECTURES_DIR = Path(__file__).parent / "architectures"
RANDOM_INIT_MARKER = "random_init.json"
COMPLETE_MARKER = ".complete"
# Kept small: the embedding and LM head keep the architecture's full vocab size, so the model's
# cost is unchanged; the tokenizer only needs to cover the generated text.
OFFLINE_TOKENIZER_VOCAB = 8192


def cache_root() -> Path:
    """Persistent root for downloads and generated sources (`FINETUNE_BENCH_CACHE_DIR` overrides)."""
    root = os.environ.get("FINETUNE_BENCH_CACHE_DIR") or Path.home() / ".cache" / "finetune_bench"
    return Path(root)


def default_results_store() -> Path:
    """Where finished runs are kept when the inputs name no `results_store`."""
    return cache_root() / "results"


def architectures() -> list[str]:
    """Names accepted after `random:`, one per bundled config file (the single source of that list)."""
    return sorted(p.stem for p in ARCHITECTURES_DIR.glob("*.json"))


def architecture_config(name: str) -> dict:
    """The bundled config of an architecture, as a dict."""
    path = ARCHITECTURES_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(architectures())}")
    return json.loads(path.read_text())


def _slug(name: str, params: dict) -> str:
    digest = hashlib.sha256(json.dumps([name, params], sort_keys=True).encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name).strip('_')}-{digest}"


def _build_into(dest: Path, build) -> Path:
    """Run `build(tmpdir)` and move the result to `dest` atomically; reuse a complete `dest`."""
    if (dest / COMPLETE_MARKER).exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        build(tmp)
        (tmp / COMPLETE_MARKER).write_text("")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest


# ---------------------------------------------------------------------------------------------
# Text generation (for offline datasets and offline tokenizers)

_SYLLABLES = [c + v for c in "bdklmnrstv" for v in "aeiou"]
_TASKS = [
    "Summarize the following text.",
    "Translate the passage into plain language.",
    "Write a short story about the topic.",
    "Explain the idea step by step.",
    "List the main points of the note.",
    "Answer the question with reasons.",
    "Rewrite the paragraph more formally.",
    "Give three examples related to the subject.",
]


def _vocabulary(rng: random.Random, size: int = 3000) -> list[str]:
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(size)]


def _sentence(rng: random.Random, words: list[str], n_words: int) -> str:
    return " ".join(rng.choice(words) for _ in range(n_words)).capitalize() + "."


# The lognormal response length: its median sits this far up the [min, max] range, and its spread
# (sigma of the log) puts about one response in twenty beyond max (cut to max): chat-like lengths,
# mostly short with a long tail.
LOGNORMAL_MEDIAN_FRACTION = 0.25
LOGNORMAL_SIGMA = 0.85


def response_length(rng: random.Random, distribution: str, min_words: int, max_words: int) -> int:
    """One response length in words, drawn from `distribution` (see `SYNTHETIC_LENGTH_DISTRIBUTIONS`)
    and kept inside [min_words, max_words]."""
    if distribution == "uniform":
        return rng.randint(min_words, max_words)
    if distribution == "fixed":
        return max_words
    span = max_words - min_words
    if distribution == "normal":
        # mean at the midpoint; the range is ±3 standard deviations, so about 0.3% are clipped
        drawn = rng.gauss(min_words + span / 2, span / 6)
    elif distribution == "lognormal":
        drawn = min_words + span * LOGNORMAL_MEDIAN_FRACTION * rng.lognormvariate(0.0, LOGNORMAL_SIGMA)
    else:
        raise ValueError(f"unknown length distribution {distribution!r}; known: {list(SYNTHETIC_LENGTH_DISTRIBUTIONS)}")
    return min(max_words, max(min_words, round(drawn)))


def generate_alpaca_records(
    num_examples: int, min_words: int, max_words: int, seed: int = 0, length_distribution: str = "uniform"
) -> list[dict]:
    """Alpaca-format records (instruction, input, output) with response lengths in words drawn from
    `length_distribution` within [min_words, max_words]."""
    rng = random.Random(seed)
    words = _vocabulary(rng)
    records = []
    for _ in range(num_examples):
        instruction = rng.choice(_TASKS)
        context = _sentence(rng, words, rng.randint(0, 24)) if rng.random() < 0.6 else ""
        n_words = response_length(rng, length_distribution, min_words, max_words)
        records.append({"instruction": instruction, "input": context, "output": _sentence(rng, words, n_words)})
    return records


def train_offline_tokenizer(vocab_size: int, seed: int = 0):
    """A byte-level BPE tokenizer trained on generated text: no network, about a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|begin|>", "<|end|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        r["instruction"] + " " + r["input"] + " " + r["output"] for r in generate_alpaca_records(2000, 8, 64, seed)
    ]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<|pad|>", bos_token="<|begin|>", eos_token="<|end|>"
    )


# ---------------------------------------------------------------------------------------------
# Models


def prepare_model(model_name: str, hf_token: str | None = None, root: Path | None = None) -> Path:
    """Make `model_name` available as a local directory and return it.

    - `random:<architecture>`: a config and an offline tokenizer; weights are initialised at
      random (seeded) when a run loads it, so nothing large is written.
    - an existing local directory: used in place.
    - anything else: a hub id, fetched with `huggingface_hub.snapshot_download`.
    """
    root = root or cache_root() / "models"
    if model_name.startswith(RANDOM_PREFIX):
        arch = model_name.removeprefix(RANDOM_PREFIX)
        config_dict = architecture_config(arch)
        return _build_into(root / _slug(model_name, config_dict), lambda d: _write_random_model(d, arch, config_dict))
    local = Path(model_name).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ValueError(f"model_name {model_name!r} is a local path without a config.json")
        return local.resolve()
    from huggingface_hub import snapshot_download

    def fetch(d: Path) -> None:
        snapshot_download(
            repo_id=model_name,
            local_dir=d,
            token=hf_token,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.py", "*.tiktoken"],
        )

    return _build_into(root / _slug(model_name, {}), fetch)


def _write_random_model(dest: Path, arch: str, config_dict: dict) -> None:
    from transformers import AutoConfig

    tokenizer = train_offline_tokenizer(min(OFFLINE_TOKENIZER_VOCAB, config_dict["vocab_size"]))
    params = {k: v for k, v in config_dict.items() if k not in ("model_type", "_name_or_path")}
    config = AutoConfig.for_model(config_dict["model_type"], **params)
    # The model's ids for special tokens must be the tokenizer's.
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    (dest / RANDOM_INIT_MARKER).write_text(
        json.dumps({"architecture": arch, "stands_for": config_dict["_name_or_path"]})
    )


def is_random_init(model_dir: Path) -> bool:
    return (Path(model_dir) / RANDOM_INIT_MARKER).is_file()


# ---------------------------------------------------------------------------------------------
# Datasets


def prepare_dataset(
    dataset_name: str,
    split: str = "train",
    synthetic_num_examples: int = 256,
    synthetic_min_words: int = 8,
    synthetic_max_words: int = 48,
    hf_token: str | None = None,
    root: Path | None = None,
    config: str = "",
    synthetic_length_distribution: str = "uniform",
) -> Path:
    """Make `dataset_name` available as a `datasets.save_to_disk` directory and return it.

    - `synthetic:alpaca`: generated alpaca-format records (offline), response lengths drawn from
      `synthetic_length_distribution`.
    - a local path: a `save_to_disk` directory, or a json/jsonl/csv/parquet file.
    - anything else: a hub id, fetched with `datasets.load_dataset(dataset_name, config, split=split)`;
      `config` empty means the registry's default for a dataset it knows (gsm8k: "main"), else none.

    The directory records the dataset's format (`SOURCE_FILE`), found by hub id or by columns: a
    dataset in no known format fails here, before any training.
    """
    import datasets

    root = root or cache_root() / "datasets"
    if dataset_name.startswith(SYNTHETIC_PREFIX):
        fmt = dataset_name.removeprefix(SYNTHETIC_PREFIX)
        if fmt not in SYNTHETIC_FORMATS:
            raise ValueError(f"unknown synthetic dataset {dataset_name!r}; known: {list(SYNTHETIC_FORMATS)}")
        if synthetic_length_distribution not in SYNTHETIC_LENGTH_DISTRIBUTIONS:
            raise ValueError(
                f"unknown synthetic_length_distribution {synthetic_length_distribution!r}; "
                f"known: {list(SYNTHETIC_LENGTH_DISTRIBUTIONS)}"
            )
        params = {
            "n": synthetic_num_examples,
            "min": synthetic_min_words,
            "max": synthetic_max_words,
            "lengths": synthetic_length_distribution,
        }

        def generate(d: Path) -> None:
            records = generate_alpaca_records(
                synthetic_num_examples,
                synthetic_min_words,
                synthetic_max_words,
                length_distribution=synthetic_length_distribution,
            )
            _save(datasets.Dataset.from_list(records), d, dataset_name, {"split": "generated", **params})

        return _build_into(root / _slug(dataset_name, params), generate)

    local = Path(dataset_name).expanduser()
    if local.exists():

        def load_local(d: Path) -> None:
            if local.is_dir():
                loaded = datasets.load_from_disk(str(local))
                if isinstance(loaded, datasets.DatasetDict):
                    loaded = loaded[split]
            else:
                builder = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}.get(local.suffix)
                if builder is None:
                    raise ValueError(f"dataset_name {dataset_name!r}: unsupported file type {local.suffix!r}")
                loaded = datasets.load_dataset(builder, data_files=str(local), split="train")
            _save(loaded, d, str(local.resolve()), {"split": split})

        return _build_into(root / _slug(str(local.resolve()), {"split": split}), load_local)

    hub_config = formats.default_config(dataset_name, config)
    # Without a config the slug is the one earlier versions wrote: their downloads stay valid.
    params = {"split": split, "config": hub_config} if hub_config else {"split": split}

    def fetch(d: Path) -> None:
        loaded = datasets.load_dataset(dataset_name, hub_config, split=split, token=hf_token)
        _save(loaded, d, dataset_name, params)

    return _build_into(root / _slug(dataset_name, params), fetch)


def _save(dataset, dest: Path, dataset_name: str, params: dict) -> None:
    """Save the rows and the source's description, its format included (an unknown format fails here)."""
    fmt = formats.detect_format(dataset.column_names, dataset_name)
    dataset.save_to_disk(str(dest / "data"))
    (dest / SOURCE_FILE).write_text(json.dumps({"dataset_name": dataset_name, "format": fmt.name, **params}, indent=2))


def dataset_format(dataset_dir: Path, columns) -> formats.DatasetFormat:
    """The format recorded when the dataset was prepared; found from the columns for a directory
    prepared before formats were recorded."""
    source = Path(dataset_dir) / SOURCE_FILE
    if source.is_file():
        return formats.FORMATS[json.loads(source.read_text())["format"]]
    return formats.detect_format(columns)


def load_prompt_completion(dataset_dir: Path):
    """Load a prepared dataset in TRL's prompt/completion (or plain text) format, converted by its
    format's formatter (`finetune_bench.formats`)."""
    import datasets

    ds = datasets.load_from_disk(str(Path(dataset_dir) / "data"))
    try:
        fmt = dataset_format(dataset_dir, ds.column_names)
        return formats.to_prompt_completion(ds, fmt)
    except ValueError as exc:
        raise ValueError(f"dataset at {dataset_dir}: {exc}") from None
