"""Datasets: generated offline, a local file or directory, or a hub id; saved with their format recorded,
and loaded back as prompt/completion pairs."""

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from finetune_bench.inputs.catalog import (
    SYNTHETIC_FORMATS,
    SYNTHETIC_LENGTH_DISTRIBUTIONS,
    SYNTHETIC_PREFIX,
    default_config,
    exists_locally,
    local_path,
)
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.sources import formats
from finetune_bench.sources.cache import build_into, cache_root, dataset_preparation_version, slug
from finetune_bench.sources.synthetic import generate_alpaca_records

if TYPE_CHECKING:
    import datasets

# What a prepared dataset directory records about its source (its format above all).
SOURCE_FILE = "source.json"


@dataclass(frozen=True)
class DatasetSource:
    """A dataset as the training settings name it (`dataset_name`: a hub id, a local path or `synthetic:<format>`),
    with what its preparation depends on: the split and config of a hub or local dataset, the size and response
    lengths of a generated one. Each field is the `TrainingArgs` setting of the same name."""

    dataset_name: str
    dataset_split: str
    dataset_config: str
    synthetic_num_examples: int
    synthetic_min_words: int
    synthetic_max_words: int
    synthetic_length_distribution: str

    @classmethod
    def of(cls, training_args: TrainingArgs) -> "DatasetSource":
        """The dataset of `training_args`."""
        return cls(**{field.name: getattr(training_args, field.name) for field in fields(cls)})


def prepare_dataset(source: DatasetSource, hf_token: str | None = None, root: Path | None = None) -> Path:
    """Make `source` available as a `datasets.save_to_disk` directory and return it.

    - `synthetic:alpaca`: generated alpaca-format records (offline), response lengths drawn from
      `synthetic_length_distribution`.
    - a local path: a `save_to_disk` directory, or a json/jsonl/csv/parquet file, keyed on its content (an
      edited file is read again).
    - anything else: a hub id, fetched with `datasets.load_dataset(dataset_name, dataset_config, split=dataset_split)`;
      `dataset_config` empty means the registry's default for a dataset it knows (gsm8k: "main"), else none.

    The directory records the dataset's format (`SOURCE_FILE`), found by hub id or by columns: a
    dataset in no known format fails here, before any training.
    """
    destination, build = _dataset_plan(source, hf_token, root)
    # a copy prepared by other code (a change to how data is formatted or generated) is prepared again
    return build_into(destination, build, version=dataset_preparation_version())


def dataset_destination(source: DatasetSource) -> Path:
    """Where `prepare_dataset` keeps `source` (its name says what it holds: the source, its parameters and a local
    source's content), without preparing it."""
    return _dataset_plan(source, None, None)[0]


def _dataset_plan(
    source: DatasetSource, hf_token: str | None, root: Path | None
) -> tuple[Path, Callable[[Path], None]]:
    """Where `source` is prepared, and the function that prepares it there (see `prepare_dataset`)."""
    dataset_name, split = source.dataset_name, source.dataset_split
    root = root or cache_root() / "datasets"
    if dataset_name.startswith(SYNTHETIC_PREFIX):
        fmt = dataset_name.removeprefix(SYNTHETIC_PREFIX)
        if fmt not in SYNTHETIC_FORMATS:
            raise ValueError(f"unknown synthetic dataset {dataset_name!r}; known: {list(SYNTHETIC_FORMATS)}")
        if source.synthetic_length_distribution not in SYNTHETIC_LENGTH_DISTRIBUTIONS:
            raise ValueError(
                f"unknown synthetic_length_distribution {source.synthetic_length_distribution!r}; "
                f"known: {list(SYNTHETIC_LENGTH_DISTRIBUTIONS)}"
            )
        params = {
            "n": source.synthetic_num_examples,
            "min": source.synthetic_min_words,
            "max": source.synthetic_max_words,
            "lengths": source.synthetic_length_distribution,
        }

        def generate(d: Path) -> None:
            import datasets

            records = generate_alpaca_records(
                source.synthetic_num_examples,
                source.synthetic_min_words,
                source.synthetic_max_words,
                length_distribution=source.synthetic_length_distribution,
            )
            _save(datasets.Dataset.from_list(records), d, dataset_name, {"split": "generated", **params})

        return root / slug(dataset_name, params), generate

    local = local_path(dataset_name)  # a file:// URL is its path
    if exists_locally(dataset_name):

        def load_local(d: Path) -> None:
            import datasets

            if local.is_dir():
                loaded = datasets.load_from_disk(str(local))
                if isinstance(loaded, datasets.DatasetDict):
                    loaded = loaded[split]
            else:
                builder = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}.get(local.suffix)
                # (the suffixes of `LOCAL_DATASET_SUFFIXES`, checked before anything runs)
                if builder is None:
                    raise ValueError(f"dataset_name {dataset_name!r}: unsupported file type {local.suffix!r}")
                loaded = datasets.load_dataset(builder, data_files=str(local), split="train")
            _save(loaded, d, str(local.resolve()), {"split": split})

        # Keyed on the content: an edited file or directory is read again, an unchanged one is not.
        params = {"split": split, "content": content_digest(local)}
        return root / slug(str(local.resolve()), params), load_local

    hub_config = default_config(dataset_name, source.dataset_config)
    # Without a config the slug is the one earlier versions wrote: their downloads stay valid.
    params = {"split": split, "config": hub_config} if hub_config else {"split": split}

    def fetch(d: Path) -> None:
        import datasets

        loaded = datasets.load_dataset(dataset_name, hub_config, split=split, token=hf_token)
        _save(loaded, d, dataset_name, params)

    return root / slug(dataset_name, params), fetch


def content_digest(path: Path) -> str:
    """A hash of the names and bytes of `path` (a file, or every file below a directory)."""
    path = Path(path).expanduser()
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path) if file != path else file.name).encode())
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def _save(dataset: "datasets.Dataset", dest: Path, dataset_name: str, params: dict) -> None:
    """Save the rows and the source's description, its format included (an unknown format fails here)."""
    fmt = formats.detect_format(dataset.column_names, dataset_name)
    dataset.save_to_disk(str(dest / "data"))
    (dest / SOURCE_FILE).write_text(json.dumps({"dataset_name": dataset_name, "format": fmt.name, **params}, indent=2))


def dataset_format(dataset_dir: Path, columns: Iterable[str]) -> formats.DatasetFormat:
    """The format recorded when the dataset was prepared; found from the columns for a directory
    prepared before formats were recorded."""
    source = Path(dataset_dir) / SOURCE_FILE
    if source.is_file():
        return formats.FORMATS[json.loads(source.read_text())["format"]]
    return formats.detect_format(columns)


def load_prompt_completion(dataset_dir: Path) -> "datasets.Dataset":
    """Load a prepared dataset in TRL's prompt/completion (or plain text) format, converted by its
    format's formatter (`finetune_bench.sources.formats`)."""
    import datasets

    ds = datasets.load_from_disk(str(Path(dataset_dir) / "data"))
    try:
        fmt = dataset_format(dataset_dir, ds.column_names)
        return formats.to_prompt_completion(ds, fmt)
    except ValueError as exc:
        raise ValueError(f"dataset at {dataset_dir}: {exc}") from None


# The held-out selection is seeded apart from the runs' `seed`: every run of a grid (every arm, every repeat,
# whatever its seed) is evaluated on the same examples.
HELD_OUT_SEED = 0


def split_held_out(
    dataset: "datasets.Dataset", eval_examples: int
) -> tuple["datasets.Dataset", "datasets.Dataset | None"]:
    """(the examples to train on, the `eval_examples` held out from them); no held-out part for 0. The held-out
    examples are a fixed random selection (`HELD_OUT_SEED`) and are never trained on; the training examples
    keep their order."""
    if eval_examples == 0:
        return dataset, None
    if eval_examples >= len(dataset):
        raise ValueError(
            f"eval_examples ({eval_examples}) would hold out every example: the dataset has {len(dataset)}"
        )
    indexed = dataset.add_column("_row", list(range(len(dataset))))
    split = indexed.train_test_split(test_size=eval_examples, shuffle=True, seed=HELD_OUT_SEED)
    held_out_rows = set(split["test"]["_row"])
    training = dataset.select([row for row in range(len(dataset)) if row not in held_out_rows])
    return training, split["test"].remove_columns("_row")


def load_training_and_held_out(
    dataset_dir: Path, eval_examples: int
) -> tuple["datasets.Dataset", "datasets.Dataset | None"]:
    """The prepared dataset as prompt/completion pairs, split into the training examples and the held-out
    ones (`split_held_out`)."""
    return split_held_out(load_prompt_completion(dataset_dir), eval_examples)
