"""Dataset formats (one formatter per supported dataset, detection by hub id or columns), synthetic
length distributions, and packing (the plain loop's data path, and both packing backends end to end).

Every dataset row here is hand-written in that dataset's real schema; nothing touches the hub."""

import dataclasses
import json
import statistics

import datasets
import pandas as pd
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from finetune_bench.inputs.catalog import HUB_DATASETS, SYNTHETIC_LENGTH_DISTRIBUTIONS, default_config, split_names
from finetune_bench.inputs.condition_checks import validate_condition
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.settings import TrainingArgs, validate_training_args
from finetune_bench.running.backends.data import (
    IGNORE_INDEX,
    PackingNotIsolated,
    check_packing_isolates_examples,
    collate_packed,
    pack,
    tokenize_prompt_completion,
)
from finetune_bench.running.backends.plain_loop import model_inputs
from finetune_bench.sources.datasets import SOURCE_FILE, DatasetSource, load_prompt_completion, prepare_dataset
from finetune_bench.sources.formats import FORMATS, detect_format, oasst_pairs
from finetune_bench.sources.synthetic import generate_alpaca_records


def write_jsonl(path, rows: list[dict]):
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def local_source(path) -> DatasetSource:
    """The dataset of a local file, with the other settings' defaults."""
    return DatasetSource.of(TrainingArgs(dataset_name=str(path)))


def prepared(tmp_path, rows: list[dict]):
    """Rows written as a local JSONL file, run through the same path as any dataset."""
    data_dir = prepare_dataset(local_source(write_jsonl(tmp_path / "data.jsonl", rows)), root=tmp_path / "prepared")
    return data_dir, load_prompt_completion(data_dir)


def recorded_format(data_dir) -> str:
    return json.loads((data_dir / SOURCE_FILE).read_text())["format"]


# ---------------------------------------------------------------------------------------------
# One formatter per dataset, on rows in its real schema

ALPACA_ROWS = [  # tatsu-lab/alpaca also has `text`, the whole prompt and response in one string
    {
        "instruction": "Give three tips for staying healthy.",
        "input": "",
        "output": "1. Eat a balanced diet.",
        "text": "Below is an instruction... ### Response: 1. Eat a balanced diet.",
    },
    {
        "instruction": "Translate the sentence.",
        "input": "Bonjour",
        "output": "Hello",
        "text": "Below is an instruction... ### Response: Hello",
    },
]


def test_alpaca_rows_become_prompt_and_response_not_text(tmp_path):
    data_dir, ds = prepared(tmp_path, ALPACA_ROWS)
    assert recorded_format(data_dir) == "alpaca"  # its `text` column does not make it a text dataset
    assert ds.column_names == ["prompt", "completion"]
    assert ds[0] == {
        "prompt": "### Instruction:\nGive three tips for staying healthy.\n\n### Response:\n",
        "completion": "1. Eat a balanced diet.",
    }
    assert ds[1]["prompt"] == "### Instruction:\nTranslate the sentence.\n\n### Input:\nBonjour\n\n### Response:\n"


def commonsense_row(answer_key: str) -> dict:
    return {
        "id": "075e483d21c29a511267ef62bedc0461",
        "question": "The sanctions against the school were a punishing blow, and they seemed to what the efforts?",
        "question_concept": "punishing",
        "choices": {
            "label": ["A", "B", "C", "D", "E"],
            "text": ["ignore", "enforce", "authoritarian", "yell at", "avoid"],
        },
        "answerKey": answer_key,
    }


def test_commonsense_qa_lists_lettered_choices_and_answers_letter_and_text(tmp_path):
    data_dir, ds = prepared(tmp_path, [commonsense_row("A"), commonsense_row("")])
    assert recorded_format(data_dir) == "commonsense_qa"
    assert len(ds) == 1  # the unanswered row (as in its test split) is dropped
    assert ds[0]["prompt"] == (
        "### Question:\nThe sanctions against the school were a punishing blow, and they seemed to what the efforts?"
        "\n\n### Choices:\nA. ignore\nB. enforce\nC. authoritarian\nD. yell at\nE. avoid\n\n### Answer:\n"
    )
    assert ds[0]["completion"] == "A. ignore"


def test_commonsense_qa_without_any_answer_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no usable row out of 1"):
        prepared(tmp_path, [commonsense_row("")])


GSM8K_ANSWER = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
GSM8K_QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)


@pytest.mark.parametrize(
    "row",
    [
        {"question": GSM8K_QUESTION, "answer": GSM8K_ANSWER},  # openai/gsm8k
        {"question": GSM8K_QUESTION, "answer": GSM8K_ANSWER, "cleaning_status": "consensus"},  # gsm8k-platinum
    ],
    ids=["gsm8k", "gsm8k-platinum"],
)
def test_gsm8k_completion_is_the_whole_worked_answer(row, tmp_path):
    data_dir, ds = prepared(tmp_path, [row])
    assert recorded_format(data_dir) == "gsm8k"
    assert ds[0] == {"prompt": f"### Question:\n{GSM8K_QUESTION}\n\n### Answer:\n", "completion": GSM8K_ANSWER}


def oasst_message(message_id, parent_id, role, text, rank=None, lang="en", deleted=False) -> dict:
    return {
        "message_id": message_id,
        "parent_id": parent_id,
        "user_id": "u-" + message_id,
        "created_date": "2023-02-05T14:23:50.983374+00:00",
        "text": text,
        "role": role,
        "lang": lang,
        "review_count": 3,
        "review_result": True,
        "deleted": deleted,
        "rank": rank,
        "synthetic": False,
        "model_name": None,
        "message_tree_id": "tree-1",
        "tree_state": "ready_for_export",
    }


OASST_ROWS = [
    oasst_message("p1", None, "prompter", "What is a monad?"),
    oasst_message("a1", "p1", "assistant", "A second-best answer.", rank=1),
    oasst_message("a2", "p1", "assistant", "A monad is a design pattern.", rank=0),
    oasst_message("a3", "p1", "assistant", "A deleted answer.", rank=None, deleted=True),
    oasst_message("p2", "a2", "prompter", "Show an example."),
    oasst_message("a4", "p2", "assistant", "Maybe in Haskell."),  # the only reply: unranked
    oasst_message("p3", "a1", "prompter", "Eine Frage?", lang="de"),
    oasst_message("a5", "p3", "assistant", "Eine Antwort.", lang="de"),
    oasst_message("p4", None, "prompter", "A prompt nobody answered."),
    oasst_message("x1", "gone", "prompter", "Below a message the export left out."),
    oasst_message("x2", "x1", "assistant", "A reply in a broken thread."),
]


def test_oasst_pairs_each_prompt_with_its_best_ranked_reply_and_its_thread(tmp_path):
    data_dir, ds = prepared(tmp_path, OASST_ROWS)
    assert recorded_format(data_dir) == "oasst"  # oasst rows have `text` too: not a text dataset
    pairs = {row["completion"]: row["prompt"] for row in ds}
    assert set(pairs) == {"A monad is a design pattern.", "Maybe in Haskell.", "Eine Antwort."}
    assert pairs["A monad is a design pattern."] == "### User:\nWhat is a monad?\n\n### Assistant:\n"
    assert pairs["Maybe in Haskell."] == (
        "### User:\nWhat is a monad?\n\n### Assistant:\nA monad is a design pattern.\n\n"
        "### User:\nShow an example.\n\n### Assistant:\n"
    )


def test_oasst_language_filter_keeps_replies_in_those_languages():
    pairs = oasst_pairs(OASST_ROWS, languages=["de"])
    assert [p["completion"] for p in pairs] == ["Eine Antwort."]


def test_oasst_prefers_any_ranked_reply_over_an_unranked_one():
    rows = [
        oasst_message("p", None, "prompter", "Q"),
        oasst_message("unranked", "p", "assistant", "first in the data, unranked"),
        oasst_message("ranked", "p", "assistant", "ranked 2", rank=2),
    ]
    assert [p["completion"] for p in oasst_pairs(rows)] == ["ranked 2"]


# ---------------------------------------------------------------------------------------------
# Detection and the registry


@pytest.mark.parametrize(
    "columns, expected",
    [
        ({"prompt", "completion", "id"}, "prompt_completion"),
        ({"instruction", "input", "output", "text"}, "alpaca"),
        ({"id", "question", "question_concept", "choices", "answerKey"}, "commonsense_qa"),
        ({"question", "answer"}, "gsm8k"),
        ({"question", "answer", "cleaning_status"}, "gsm8k"),
        (set(oasst_message("m", None, "prompter", "t")), "oasst"),
        ({"text", "meta"}, "text"),
    ],
)
def test_format_is_detected_by_columns(columns, expected):
    assert detect_format(columns).name == expected


@pytest.mark.parametrize(
    "hub_id, expected",
    [
        ("tatsu-lab/alpaca", "alpaca"),
        ("tau/commonsense_qa", "commonsense_qa"),
        ("openai/gsm8k", "gsm8k"),
        ("madrylab/gsm8k-platinum", "gsm8k"),
        ("OpenAssistant/oasst1", "oasst"),
        ("openassistant/OASST1", "oasst"),  # hub ids are case-insensitive
    ],
)
def test_format_of_a_known_hub_id_comes_from_the_registry(hub_id, expected):
    fmt = FORMATS[HUB_DATASETS[next(k for k in HUB_DATASETS if k.lower() == hub_id.lower())].format]
    assert detect_format(fmt.columns | {"extra"}, hub_id).name == expected


def test_every_known_hub_dataset_names_a_format_that_exists():
    assert {entry.format for entry in HUB_DATASETS.values()} <= set(FORMATS)


def test_known_hub_id_with_other_columns_says_what_is_missing():
    with pytest.raises(ValueError, match=r"'openai/gsm8k' should have the gsm8k columns but lacks \['answer'\]"):
        detect_format({"question", "solution"}, "openai/gsm8k")


def test_unknown_columns_are_an_error_listing_the_known_formats(tmp_path):
    with pytest.raises(ValueError) as error:
        prepared(tmp_path, [{"query": "q", "response": "r"}])
    message = str(error.value)
    assert "['query', 'response']" in message
    for name in FORMATS:
        assert name in message


def test_registry_defaults_configs_and_splits():
    assert default_config("openai/gsm8k") == "main"
    assert default_config("openai/gsm8k", "socratic") == "socratic"
    assert default_config("madrylab/gsm8k-platinum") == "main"
    assert default_config("tatsu-lab/alpaca") is None
    assert default_config("someone/unknown") is None
    assert HUB_DATASETS["madrylab/gsm8k-platinum"].splits == ("test",)
    assert split_names("train[:10%]+validation") == ["train", "validation"]


def test_hub_download_passes_the_default_config_and_records_the_format(tmp_path, monkeypatch):
    calls = []

    def fake_load_dataset(name, config=None, split=None, token=None):
        calls.append((name, config, split, token))
        return datasets.Dataset.from_list([{"question": GSM8K_QUESTION, "answer": GSM8K_ANSWER}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    gsm8k_test = DatasetSource.of(TrainingArgs(dataset_name="openai/gsm8k", dataset_split="test"))
    data_dir = prepare_dataset(gsm8k_test, hf_token="tok", root=tmp_path)
    assert calls == [("openai/gsm8k", "main", "test", "tok")]
    assert recorded_format(data_dir) == "gsm8k"
    assert load_prompt_completion(data_dir)[0]["completion"] == GSM8K_ANSWER
    other = prepare_dataset(dataclasses.replace(gsm8k_test, dataset_config="socratic"), root=tmp_path)
    assert calls[-1][1] == "socratic" and other != data_dir


def test_directory_prepared_before_formats_were_recorded_is_detected_by_columns(tmp_path):
    data_dir, _ = prepared(tmp_path, ALPACA_ROWS)
    (data_dir / SOURCE_FILE).unlink()
    assert load_prompt_completion(data_dir)[1]["completion"] == "Hello"


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(dataset_name="madrylab/gsm8k-platinum"), "dataset_split"),  # its only split is test
        (dict(dataset_name="tau/commonsense_qa", dataset_split="test"), "dataset_split"),  # no answers there
        (dict(dataset_name="openai/gsm8k", dataset_config="mian"), "dataset_config"),
        (dict(dataset_name="tatsu-lab/alpaca", dataset_config="main"), "dataset_config"),
        (dict(synthetic_length_distribution="gaussian"), "synthetic_length_distribution"),
    ],
)
def test_bad_dataset_settings_are_refused_naming_the_key(overrides, key):
    with pytest.raises(SpecError, match=f"training_args.{key}"):
        validate_training_args(dataclasses.replace(TrainingArgs(), **overrides))


def test_the_five_datasets_validate_with_the_values_users_write():
    for name, config, split in [
        ("tatsu-lab/alpaca", "", "train"),
        ("tau/commonsense_qa", "", "train"),
        ("openai/gsm8k", "main", "train"),
        ("madrylab/gsm8k-platinum", "", "test"),
        ("OpenAssistant/oasst1", "", "train"),
    ]:
        validate_training_args(TrainingArgs(dataset_name=name, dataset_config=config, dataset_split=split))


# ---------------------------------------------------------------------------------------------
# Synthetic length distributions


def response_lengths(distribution: str, n: int = 2000, low: int = 10, high: int = 90) -> list[int]:
    records = generate_alpaca_records(n, low, high, seed=3, length_distribution=distribution)
    return [len(r["output"].split()) for r in records]


@pytest.mark.parametrize("distribution", SYNTHETIC_LENGTH_DISTRIBUTIONS)
def test_every_length_distribution_stays_inside_the_range(distribution):
    lengths = response_lengths(distribution)
    assert 10 <= min(lengths) and max(lengths) <= 90


def test_fixed_lengths_are_all_the_maximum():
    assert set(response_lengths("fixed")) == {90}


def test_uniform_spreads_over_the_whole_range_and_matches_the_earlier_generator():
    lengths = response_lengths("uniform")
    assert min(lengths) == 10 and max(lengths) == 90
    assert statistics.mean(lengths) == pytest.approx(50, abs=2)
    # the default draws exactly what the generator drew before distributions existed
    assert generate_alpaca_records(5, 30, 40, seed=1) == generate_alpaca_records(
        5, 30, 40, seed=1, length_distribution="uniform"
    )


def test_normal_is_centred_on_the_midpoint_and_narrower_than_uniform():
    lengths = response_lengths("normal")
    assert statistics.mean(lengths) == pytest.approx(50, abs=1.5)
    assert statistics.median(lengths) == pytest.approx(50, abs=2)
    assert statistics.stdev(lengths) < 0.6 * statistics.stdev(response_lengths("uniform"))


def test_lognormal_is_skewed_with_a_long_tail():
    lengths = response_lengths("lognormal")
    assert statistics.mean(lengths) > statistics.median(lengths) + 3
    assert statistics.median(lengths) == pytest.approx(10 + 0.25 * 80, abs=3)
    assert 0.02 < sum(n == 90 for n in lengths) / len(lengths) < 0.1  # the tail cut at the maximum


def test_each_distribution_is_its_own_cached_dataset(tmp_path):
    dirs = {
        d: prepare_dataset(
            DatasetSource.of(TrainingArgs(synthetic_num_examples=8, synthetic_length_distribution=d)), root=tmp_path
        )
        for d in SYNTHETIC_LENGTH_DISTRIBUTIONS
    }
    assert len(set(dirs.values())) == len(SYNTHETIC_LENGTH_DISTRIBUTIONS)
    assert all("lengths" in json.loads((d / SOURCE_FILE).read_text()) for d in dirs.values())


# ---------------------------------------------------------------------------------------------
# Packing in the plain loop's data path


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def encoded(tokenizer):
    """Short examples of varied lengths (about 5 to 25 tokens): several share each packed row."""
    words = "the model learns to answer short questions with a few plain words".split()
    pairs = [
        {"prompt": f"Question {i}: say it.", "completion": " ".join(words[: 1 + i % len(words)])} for i in range(60)
    ]
    return tokenize_prompt_completion(datasets.Dataset.from_list(pairs), tokenizer, max_length=48)


def test_packed_rows_are_full_and_lose_no_token_but_the_tail(encoded):
    max_length = 64
    packed = pack(encoded, max_length)
    all_ids = [t for ids in encoded["input_ids"] for t in ids]
    assert len(packed) == len(all_ids) // max_length > 3
    assert all(len(row["input_ids"]) == len(row["labels"]) == len(row["position_ids"]) == max_length for row in packed)
    assert [t for row in packed["input_ids"] for t in row] == all_ids[: len(packed) * max_length]


def test_packed_labels_keep_the_prompt_masking_and_mask_each_example_start(encoded):
    packed = pack(encoded, 64)
    expected = []
    for labels in encoded["labels"]:
        expected += [IGNORE_INDEX] + labels[1:]  # the first label: never predicted from its own example
    got = [t for row in packed["labels"] for t in row]
    assert got == expected[: len(got)]
    assert any(t == IGNORE_INDEX for t in got) and any(t != IGNORE_INDEX for t in got)


def test_packed_positions_restart_at_every_example_and_every_row(encoded):
    packed = pack(encoded, 64)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    flat = [p for row in packed["position_ids"] for p in row]
    example_starts = {sum(lengths[:i]) for i in range(len(lengths))}
    for index, position in enumerate(flat):
        if index in example_starts or index % 64 == 0:
            assert position == 0, index
        else:
            assert position == flat[index - 1] + 1, index


def test_packed_batches_carry_no_attention_mask(encoded):
    batch = collate_packed(list(pack(encoded, 64).select(range(2))))
    assert set(batch) == {"input_ids", "labels", "position_ids"}
    assert batch["input_ids"].shape == (2, 64)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    torch.manual_seed(0)  # random-init models store no weights: built from their config
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir))
    model.config.use_cache = False
    return model.eval()


def test_an_example_in_a_packed_row_sees_only_itself(encoded, tiny_model):
    packed = pack(encoded, 64)
    row = packed[1]
    starts = [i for i, p in enumerate(row["position_ids"]) if p == 0]
    begin, end = starts[1], starts[2]  # the row's second example, whole
    with torch.no_grad():
        in_row = tiny_model(**model_inputs(collate_packed([row]))).logits[0, begin:end]
        alone = tiny_model(input_ids=torch.tensor([row["input_ids"][begin:end]])).logits[0]
    torch.testing.assert_close(in_row, alone, atol=1e-5, rtol=1e-4)


def test_packing_check_passes_on_the_model_and_fails_when_masks_ignore_positions(tiny_model, monkeypatch):
    check_packing_isolates_examples(tiny_model)
    assert not tiny_model.training  # the probe leaves the mode as it found it
    import transformers.masking_utils

    # a model whose masks ignore position_ids: every token of the row sees the examples before it
    monkeypatch.setattr(transformers.masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    with pytest.raises(PackingNotIsolated, match="packed examples attend to each other"):
        check_packing_isolates_examples(tiny_model)


def test_packing_is_refused_on_a_backend_that_does_not_pack():
    with pytest.raises(SpecError, match="packing does not run with backend 'hf_trainer'"):
        validate_condition(TrainingArgs(backend="hf_trainer", packing=True), {})


# ---------------------------------------------------------------------------------------------
# Packing end to end (baseline arm: Liger is slow on a CPU)


@pytest.fixture(scope="module")
def short_examples(tmp_path_factory, tokenizer):
    """A local prompt/completion file of short examples, and the token count of the longest one."""
    rows = [{"prompt": f"Question {i}:", "completion": "a short answer " * (1 + i % 4)} for i in range(64)]
    path = write_jsonl(tmp_path_factory.mktemp("short") / "short.jsonl", rows)
    longest = max(len(tokenizer(r["prompt"] + r["completion"])["input_ids"]) + 1 for r in rows)  # + EOS
    return prepare_dataset(local_source(path)), longest


def train_in_process(args: TrainingArgs, dataset_dir, model_dir, out) -> tuple[dict, pd.DataFrame]:
    """One condition through the worker's entry point (what `run_in_child` runs in a child process), in
    this process: it saves the child's start-up, and a baseline arm patches nothing that could leak."""
    from finetune_bench.running import worker

    out.mkdir()
    (out / "condition.json").write_text(json.dumps(dataclasses.asdict(args)))
    argv = ["--condition", str(out / "condition.json"), "--dataset-dir", str(dataset_dir)]
    worker.main([*argv, "--model-dir", str(model_dir), "--out", str(out)])
    return json.loads((out / worker.RESULT_FILE).read_text()), pd.read_csv(out / worker.STEPS_FILE)


@pytest.mark.parametrize("backend", ["plain_loop", "trl_sft"])
def test_packed_training_runs_with_full_rows_and_no_padding(backend, tiny_model_dir, short_examples, tmp_path):
    dataset_dir, longest = short_examples
    assert 2 * longest < 64  # unpacked, a batch of 2 would hold fewer tokens than one packed row
    args = TrainingArgs(backend=backend, packing=True, per_device_train_batch_size=2, max_seq_length=64, max_steps=2)
    result, steps = train_in_process(args, dataset_dir, tiny_model_dir, tmp_path / "run")
    assert result["status"] == "ok", result.get("error_tail")
    assert len(steps) == 2 and steps["loss"].notna().all()
    assert (steps["non_padding_tokens"] == steps["padded_tokens"]).all()  # packed: no padding at all
    if backend == "plain_loop":
        assert (steps["padded_tokens"] == 2 * 64).all()  # rows of exactly max_seq_length
    else:
        # TRL's best-fit rows hold whole examples, up to 64 tokens each, flattened into one row per batch
        assert (steps["padded_tokens"] > 2 * longest).all() and (steps["padded_tokens"] <= 2 * 64).all()


@pytest.fixture(scope="module")
def prompts_that_fill_the_window(tmp_path_factory, tokenizer):
    """Prompt/completion examples, most of whose prompts are longer than 32 tokens (nothing of their completion
    survives truncation to 32), and the count of those that leave room for a completion token."""
    rows = [
        {"prompt": "Summarize this. " + "word " * (4 if i % 4 == 0 else 40), "completion": "a short answer " * 3}
        for i in range(64)
    ]
    path = write_jsonl(tmp_path_factory.mktemp("long_prompts") / "long_prompts.jsonl", rows)
    usable = sum(len(tokenizer(r["prompt"])["input_ids"]) < 32 for r in rows)
    return prepare_dataset(local_source(path)), usable


def test_trl_packing_leaves_out_examples_whose_prompt_fills_the_window(
    prompts_that_fill_the_window, tiny_model_dir, tmp_path
):
    # Packed rows made only of such prompts have no labelled token: the step's loss was 0/0, NaN at step 1.
    dataset_dir, usable = prompts_that_fill_the_window
    assert 0 < usable < 64
    args = TrainingArgs(backend="trl_sft", packing=True, per_device_train_batch_size=2, max_seq_length=32, max_steps=3)
    result, steps = train_in_process(args, dataset_dir, tiny_model_dir, tmp_path / "run")
    assert result["status"] == "ok", (result.get("reason"), result.get("error_tail"))
    assert len(steps) == 3 and steps["loss"].notna().all()


def test_conversational_prompts_are_left_to_trl_and_counted_whole(tokenizer):
    from datasets import Dataset

    from finetune_bench.running.backends.data import usable_examples, with_room_for_a_completion

    chats = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": "word " * 50}],
                "completion": [{"role": "assistant", "content": "ok"}],
            }
            for _ in range(4)
        ]
    )
    assert len(with_room_for_a_completion(chats, tokenizer, 8)) == 4  # TRL renders them with the chat template
    assert usable_examples(chats, tokenizer, [8]) == {8: 4}
    text = Dataset.from_list([{"prompt": "word " * n, "completion": "ok"} for n in (1, 50)])
    assert len(with_room_for_a_completion(text, tokenizer, 8)) == 1 == usable_examples(text, tokenizer, [8])[8]
