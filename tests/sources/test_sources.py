import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from finetune_bench.inputs.catalog import architecture_config, architectures
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.sources.cache import COMPLETE_MARKER
from finetune_bench.sources.datasets import DatasetSource, load_prompt_completion, prepare_dataset
from finetune_bench.sources.models import is_random_init, prepare_model
from finetune_bench.sources.synthetic import generate_alpaca_records

REQUIRED = {"llama-3.2-1b", "llama-3-8b", "phi-3-mini", "qwen2.5-7b", "mistral-7b", "gemma-2-2b", "tiny-llama"}


def test_bundled_architectures_cover_the_seeds():
    assert REQUIRED <= set(architectures())


@pytest.mark.parametrize("name", architectures())
def test_every_bundled_config_is_a_valid_transformers_config(name):
    config_dict = architecture_config(name)
    params = {k: v for k, v in config_dict.items() if k not in ("model_type", "_name_or_path")}
    config = AutoConfig.for_model(config_dict["model_type"], **params)
    assert config.vocab_size == config_dict["vocab_size"]
    # GPT-2 names it n_layer; transformers maps num_hidden_layers onto it
    assert config.num_hidden_layers == config_dict.get("num_hidden_layers", config_dict.get("n_layer"))


def test_llama_3_2_1b_has_its_published_size():
    config_dict = architecture_config("llama-3.2-1b")
    params = {k: v for k, v in config_dict.items() if k not in ("model_type", "_name_or_path")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **params))
    # 1.24 B parameters with tied embeddings (Meta's model card)
    assert 1.20e9 < sum(p.numel() for p in model.parameters()) < 1.27e9


def test_unknown_architecture_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown architecture 'llama-9'"):
        prepare_model("random:llama-9")


def test_random_model_is_offline_and_loads(tiny_model_dir):
    assert is_random_init(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert len(tokenizer) <= config.vocab_size
    assert config.eos_token_id == tokenizer.eos_token_id and config.pad_token_id == tokenizer.pad_token_id
    ids = tokenizer("Explain the idea step by step.")["input_ids"]
    assert 0 < len(ids) < 40
    assert not list(tiny_model_dir.glob("*.safetensors")), "random models store no weights"


def test_prepared_sources_are_reused_not_rebuilt(tiny_model_dir):
    marker = tiny_model_dir / COMPLETE_MARKER
    before = marker.stat().st_mtime_ns
    assert prepare_model("random:tiny-llama") == tiny_model_dir
    assert marker.stat().st_mtime_ns == before


def test_synthetic_dataset_is_deterministic_and_controls_length():
    a = generate_alpaca_records(20, 30, 40, seed=1)
    assert a == generate_alpaca_records(20, 30, 40, seed=1)
    assert all(30 <= len(r["output"].split()) <= 40 for r in a)
    assert set(a[0]) == {"instruction", "input", "output"}


def test_alpaca_maps_to_prompt_completion(tiny_dataset_dir):
    ds = load_prompt_completion(tiny_dataset_dir)
    assert set(ds.column_names) == {"prompt", "completion"}
    assert len(ds) == 64
    assert ds[0]["prompt"].startswith("### Instruction:\n") and ds[0]["prompt"].endswith("### Response:\n")


def test_local_jsonl_dataset(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) for i in range(5)))
    ds = load_prompt_completion(
        prepare_dataset(DatasetSource.of(TrainingArgs(dataset_name=str(path))), root=tmp_path / "out")
    )
    assert ds["completion"] == [f"a{i}" for i in range(5)]


def test_dataset_with_unknown_columns_names_them(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"query": "q", "response": "a"}))
    with pytest.raises(ValueError, match=r"\['query', 'response'\]"):
        load_prompt_completion(
            prepare_dataset(DatasetSource.of(TrainingArgs(dataset_name=str(path))), root=tmp_path / "out")
        )


def test_local_model_directory_is_used_in_place(tiny_model_dir, tmp_path):
    assert prepare_model(str(tiny_model_dir)) == tiny_model_dir.resolve()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without a config.json"):
        prepare_model(str(tmp_path / "empty"))


def test_the_offline_tokenizer_of_each_bundled_random_architecture_has_the_tokens_planning_counts():
    """Planning checks a `vocab_size` override against `offline_tokenizer_tokens` without training the tokenizer."""
    from finetune_bench.inputs.catalog import OFFLINE_TOKENIZER_VOCAB, architecture_config, offline_tokenizer_tokens
    from finetune_bench.sources.synthetic import train_offline_tokenizer

    paths = (Path(__file__).resolve().parents[2] / "finetune_bench" / "architectures").glob("*.json")
    vocab_sizes = {architecture_config(path.stem)["vocab_size"] for path in paths}
    for requested in sorted({min(size, OFFLINE_TOKENIZER_VOCAB) for size in vocab_sizes}):
        assert len(train_offline_tokenizer(requested)) == offline_tokenizer_tokens(requested), requested
