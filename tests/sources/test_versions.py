"""Sources are keyed on what they hold: an edited local dataset is read again, a deleted cache directory is
prepared again (Flyte's download cache never serves a path that is gone), and the versions that the
results store's keys include change with a local source's content."""

import json
import shutil
from pathlib import Path

import pytest

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.sources.datasets import (
    DatasetSource,
    content_digest,
    dataset_destination,
    load_prompt_completion,
    prepare_dataset,
)
from finetune_bench.sources.versions import source_versions


def alpaca_rows(n: int) -> str:
    return "".join(json.dumps({"instruction": f"Say {i}.", "input": "", "output": f"{i}"}) + "\n" for i in range(n))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(directory))
    return directory


def test_an_edited_local_dataset_is_read_again(cache_dir, tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text(alpaca_rows(2))
    args = TrainingArgs(dataset_name=str(data))
    first = source_versions(args)
    assert len(load_prompt_completion(prepare_dataset(DatasetSource.of(args)))) == 2
    data.write_text(alpaca_rows(3))
    second = source_versions(args)
    assert second.dataset != first.dataset and second.dataset_cache_key != first.dataset_cache_key
    assert len(load_prompt_completion(prepare_dataset(DatasetSource.of(args)))) == 3


def test_a_missing_prepared_copy_gets_a_fresh_cache_key_and_a_present_one_a_stable_one(cache_dir):
    args = TrainingArgs(synthetic_num_examples=8)
    missing = [source_versions(args).dataset_cache_key for _ in range(2)]
    assert missing[0] != missing[1] and missing[0].startswith(source_versions(args).dataset + "#missing-")
    prepare_dataset(DatasetSource.of(args))
    assert source_versions(args).dataset_cache_key == source_versions(args).dataset


def test_a_local_model_edited_in_place_has_a_new_version(tmp_path, tiny_model_dir):
    model = tmp_path / "my-model"
    shutil.copytree(tiny_model_dir, model)
    before = source_versions(TrainingArgs(model_name=str(model))).model
    (model / "config.json").write_text((model / "config.json").read_text().replace("}", ', "edited": 1}', 1))
    after = source_versions(TrainingArgs(model_name=str(model)))
    assert after.model != before and after.model_cache_key == after.model


def test_flytes_download_cache_serves_no_deleted_directory(cache_dir):
    """The download task is cached by Flyte; its version input makes the cache miss once the prepared copy
    is gone (the same key would return the deleted path)."""
    from tasks import data

    args = TrainingArgs(model_name="random:tiny-mistral")
    first = data.identify_sources(training_args=args)
    model_dir = data.download_model(model_name=args.model_name, version=first.model_cache_key)
    assert (Path(model_dir.path) / "config.json").is_file()
    shutil.rmtree(cache_dir)
    again = data.identify_sources(training_args=args)
    assert again.model_cache_key != first.model_cache_key
    model_dir = data.download_model(model_name=args.model_name, version=again.model_cache_key)
    assert (Path(model_dir.path) / "config.json").is_file()


def test_a_model_that_cannot_be_fetched_is_one_clear_error(cache_dir, monkeypatch):
    import click

    from tasks import data

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(click.ClickException) as error:
        data.download_model(model_name="no-such-org/no-such-model", version="v")
    message = error.value.format_message()
    assert message.startswith("the model 'no-such-org/no-such-model' could not be prepared: ")
    assert "\n" not in message


def test_on_a_cluster_a_cache_key_is_what_is_downloaded_whatever_the_pod_holds(tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path / "fresh-pod"))
    args = TrainingArgs(dataset_name="tatsu-lab/alpaca", model_name="meta-llama/Llama-3.2-1B")
    keys = [source_versions(args, local=False) for _ in range(2)]
    assert keys[0] == keys[1]
    assert (keys[0].dataset_cache_key, keys[0].model_cache_key) == (keys[0].dataset, keys[0].model)
    assert "#missing" in source_versions(args, local=True).dataset_cache_key  # locally, the missing copy shows


@pytest.mark.parametrize(
    ("settings", "directory"),
    [
        ({}, "synthetic_alpaca-c6b95be89238"),
        (
            {"synthetic_num_examples": 8, "synthetic_min_words": 64, "synthetic_max_words": 80}
            | {"synthetic_length_distribution": "normal"},
            "synthetic_alpaca-5ab7bed0a528",
        ),
        ({"dataset_name": "openai/gsm8k", "dataset_split": "test"}, "openai_gsm8k-0297704013ea"),
        (
            {"dataset_name": "openai/gsm8k", "dataset_split": "test", "dataset_config": "socratic"},
            "openai_gsm8k-f5475a54a5f0",
        ),
        ({"dataset_name": "tatsu-lab/alpaca"}, "tatsu-lab_alpaca-78e0672d0421"),
    ],
)
def test_a_prepared_dataset_keeps_its_cache_directory_name(cache_dir, settings, directory):
    """The names that copies already in a user's cache were written under: a source must still find its copy."""
    assert dataset_destination(DatasetSource.of(TrainingArgs(**settings))) == cache_dir / "datasets" / directory


def test_a_local_dataset_is_keyed_on_its_bytes(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"instruction": "a", "output": "b"}\n')
    assert content_digest(data) == content_digest(tmp_path) == "fcc2a5a9707eed8e"
