"""Models: a bundled architecture built at random (no download), a local directory, or a hub id."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from finetune_bench.inputs.catalog import OFFLINE_TOKENIZER_VOCAB, RANDOM_PREFIX, architecture_config, exists_locally
from finetune_bench.inputs.model_overrides import apply_config_overrides, parse_config_overrides
from finetune_bench.sources.cache import build_into, cache_root, model_preparation_version, slug
from finetune_bench.sources.synthetic import train_offline_tokenizer

if TYPE_CHECKING:  # transformers is imported where a config is read
    from transformers import PretrainedConfig

RANDOM_INIT_MARKER = "random_init.json"


def prepare_model(model_name: str, hf_token: str | None = None, root: Path | None = None) -> Path:
    """Make `model_name` available as a local directory and return it.

    - `random:<architecture>`: a config and an offline tokenizer; weights are initialised at
      random (seeded) when a run loads it, so nothing large is written.
    - an existing local directory: used in place.
    - anything else: a hub id, fetched with `huggingface_hub.snapshot_download`.
    """
    destination, build = _model_plan(model_name, hf_token, root)
    if build is None:  # a local directory, used in place
        if not (destination / "config.json").is_file():
            raise ValueError(f"model_name {model_name!r} is a local path without a config.json")
        return destination
    # A random model's config and tokenizer are written by this package's code: a copy written by other code is
    # written again. A hub model is its snapshot, fetched as it is: never fetched again for a change of code here.
    random = model_name.startswith(RANDOM_PREFIX)
    version = model_preparation_version() if random else ""
    return build_into(destination, build, version=version)


def model_destination(model_name: str) -> Path:
    """Where `prepare_model` keeps (or finds) `model_name`, without preparing it."""
    return _model_plan(model_name, None, None)[0]


def _model_plan(model_name: str, hf_token: str | None, root: Path | None) -> tuple[Path, Callable[[Path], None] | None]:
    """Where the model is kept, and the function that prepares it there (None: a local directory)."""
    root = root or cache_root() / "models"
    if model_name.startswith(RANDOM_PREFIX):
        arch = model_name.removeprefix(RANDOM_PREFIX)
        config_dict = architecture_config(arch)
        return root / slug(model_name, config_dict), lambda d: _write_random_model(d, arch, config_dict)
    if exists_locally(model_name):  # (a name too long for a path is none)
        return Path(model_name).expanduser().resolve(), None

    def fetch(d: Path) -> None:
        from huggingface_hub import snapshot_download

        snapshot_download(
            repo_id=model_name,
            local_dir=d,
            token=hf_token,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.py", "*.tiktoken"],
        )

    return root / slug(model_name, {}), fetch


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
    """Whether `model_dir` holds a random-init model built from a bundled architecture."""
    return (Path(model_dir) / RANDOM_INIT_MARKER).is_file()


def model_config_dict(model_dir: Path, overrides: str = "") -> dict:
    """The config.json of the prepared `model_dir` as a dict, with `overrides` (`TrainingArgs.model_config_overrides`)
    applied: what the model of a run is built from. The directory itself is never changed."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return apply_config_overrides(config, parse_config_overrides(overrides))


def load_model_config(model_dir: Path, overrides: str = "") -> "PretrainedConfig":
    """The transformers config a run builds its model from: `model_dir`'s, with `overrides` applied (the config
    class is the model type's, so its validation and derived values follow the overridden keys)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    if not parse_config_overrides(overrides):
        return config
    return type(config).from_dict(model_config_dict(model_dir, overrides))
