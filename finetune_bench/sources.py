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

logger = logging.getLogger(__name__)

RANDOM_PREFIX = "random:"
SYNTHETIC_PREFIX = "synthetic:"
SYNTHETIC_FORMATS = ("alpaca",)
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


def generate_alpaca_records(num_examples: int, min_words: int, max_words: int, seed: int = 0) -> list[dict]:
    """Alpaca-format records (instruction, input, output) with response lengths uniform in words."""
    rng = random.Random(seed)
    words = _vocabulary(rng)
    records = []
    for _ in range(num_examples):
        records.append(
            {
                "instruction": rng.choice(_TASKS),
                "input": _sentence(rng, words, rng.randint(0, 24)) if rng.random() < 0.6 else "",
                "output": _sentence(rng, words, rng.randint(min_words, max_words)),
            }
        )
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
) -> Path:
    """Make `dataset_name` available as a `datasets.save_to_disk` directory and return it.

    - `synthetic:alpaca`: generated alpaca-format records (offline).
    - a local path: a `save_to_disk` directory, or a json/jsonl/csv/parquet file.
    - anything else: a hub id, fetched with `datasets.load_dataset`.
    """
    import datasets

    root = root or cache_root() / "datasets"
    if dataset_name.startswith(SYNTHETIC_PREFIX):
        fmt = dataset_name.removeprefix(SYNTHETIC_PREFIX)
        if fmt not in SYNTHETIC_FORMATS:
            raise ValueError(f"unknown synthetic dataset {dataset_name!r}; known: {list(SYNTHETIC_FORMATS)}")
        params = {"n": synthetic_num_examples, "min": synthetic_min_words, "max": synthetic_max_words}

        def generate(d: Path) -> None:
            records = generate_alpaca_records(synthetic_num_examples, synthetic_min_words, synthetic_max_words)
            datasets.Dataset.from_list(records).save_to_disk(str(d / "data"))

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
            loaded.save_to_disk(str(d / "data"))

        return _build_into(root / _slug(str(local.resolve()), {"split": split}), load_local)

    def fetch(d: Path) -> None:
        datasets.load_dataset(dataset_name, split=split, token=hf_token).save_to_disk(str(d / "data"))

    return _build_into(root / _slug(dataset_name, {"split": split}), fetch)


ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n{input_block}### Response:\n"


def load_prompt_completion(dataset_dir: Path):
    """Load a prepared dataset and map it to TRL's prompt/completion (or plain text) format."""
    import datasets

    ds = datasets.load_from_disk(str(Path(dataset_dir) / "data"))
    columns = set(ds.column_names)
    if {"prompt", "completion"} <= columns or "text" in columns:
        return ds
    if {"instruction", "output"} <= columns:

        def to_prompt_completion(row: dict) -> dict:
            input_block = f"### Input:\n{row['input']}\n\n" if row.get("input") else ""
            prompt = ALPACA_PROMPT.format(instruction=row["instruction"], input_block=input_block)
            return {"prompt": prompt, "completion": row["output"]}

        return ds.map(to_prompt_completion, remove_columns=ds.column_names)
    raise ValueError(
        f"dataset at {dataset_dir} has columns {sorted(columns)}; expected alpaca (instruction, input, output), "
        "prompt/completion, or text"
    )
