"""A condition whose max_seq_length leaves fewer than one batch of examples with a token to learn from is refused
on the downloaded data, before any run is launched; the count is the one the backends' tokenization keeps."""

import pytest

from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from finetune_bench.running.backends.data import tokenize_prompt_completion, usable_examples
from finetune_bench.running.preflight import refuse_unfillable
from finetune_bench.sources.datasets import DatasetSource, load_prompt_completion, prepare_dataset
from finetune_bench.sources.models import prepare_model


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETUNE_BENCH_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        t = TrainingArgs()
        return prepare_dataset(DatasetSource.of(t)), prepare_model(t.model_name)


def test_the_count_is_what_the_backends_keep(sources):
    from transformers import AutoTokenizer

    dataset_dir, model_dir = sources
    dataset, tokenizer = load_prompt_completion(dataset_dir), AutoTokenizer.from_pretrained(model_dir)
    counts = usable_examples(dataset, tokenizer, [8, 16, 24, 32])
    for length, count in counts.items():
        assert count == len(tokenize_prompt_completion(dataset, tokenizer, length))
    assert counts[8] == 0 < counts[32]
    assert list(counts.values()) == sorted(counts.values()), "a longer window never keeps fewer examples"


def test_runs_that_cannot_fill_a_batch_are_refused_before_launch(sources):
    dataset_dir, model_dir = sources
    training = TrainingArgs(backend="plain_loop")
    planned = plan_runs(ExperimentArgs(max_seq_length=[8, 32], arm=["baseline"]), training, 2)
    checked = refuse_unfillable(planned, dataset_dir, model_dir)
    refused = {(r.condition_id, r.run_number): r.refused for r in checked if r.refused}
    assert set(refused) == {("arm=baseline,max_seq_length=8", 0), ("arm=baseline,max_seq_length=8", 1)}
    assert all("every example's prompt fills max_seq_length 8" in reason for reason in refused.values())
    # TRL tokenizes on its own, but trains the same examples (trl_sft keeps those with room for a completion)
    trl = plan_runs(ExperimentArgs(max_seq_length=[8, 32]), TrainingArgs(backend="trl_sft"), 1)
    refused = [r.condition_id for r in refuse_unfillable(trl, dataset_dir, model_dir) if r.refused]
    assert refused == ["max_seq_length=8"]


def test_trl_and_packed_runs_are_counted_as_the_backends_train_them(sources):
    from transformers import AutoTokenizer

    dataset_dir, model_dir = sources
    dataset, tokenizer = load_prompt_completion(dataset_dir), AutoTokenizer.from_pretrained(model_dir)
    counts = usable_examples(dataset, tokenizer, list(range(8, 64, 2)))
    length, usable = next((n, c) for n, c in counts.items() if 0 < c < TrainingArgs().synthetic_num_examples)
    # a batch one larger than the usable examples: trl_sft is refused (it trains only those), as the plain loop is
    for backend in ("trl_sft", "plain_loop"):
        training = TrainingArgs(backend=backend, max_seq_length=length, per_device_train_batch_size=usable + 1)
        (run,) = refuse_unfillable(plan_runs(ExperimentArgs(arm=["baseline"]), training, 1), dataset_dir, model_dir)
        assert f"the dataset has {usable} usable examples, fewer than one batch of {usable + 1}" in run.refused
    # packed, one usable example is enough (a row holds several); none is refused before launch
    for length, expected_refused in ((8, True), (32, False)):
        training = TrainingArgs(backend="trl_sft", packing=True, max_seq_length=length)
        (run,) = refuse_unfillable(plan_runs(ExperimentArgs(arm=["baseline"]), training, 1), dataset_dir, model_dir)
        assert bool(run.refused) is expected_refused, run.refused


def test_on_two_ranks_the_data_must_fill_the_batch_of_both(sources):
    """The batch is per GPU: data that fills one GPU's batch but not two is refused for two GPUs, as the
    validation and the backends count it (`TrainingArgs.examples_per_step`)."""
    from transformers import AutoTokenizer

    dataset_dir, model_dir = sources
    dataset, tokenizer = load_prompt_completion(dataset_dir), AutoTokenizer.from_pretrained(model_dir)
    counts = usable_examples(dataset, tokenizer, list(range(8, 64, 2)))
    total = TrainingArgs().synthetic_num_examples
    length, usable = next((n, c) for n, c in counts.items() if 0 < c < total // 2)
    training = TrainingArgs(backend="plain_loop", parallelism="ddp", max_seq_length=length)
    planned = plan_runs(ExperimentArgs(per_device_train_batch_size=[usable], num_gpus=[1, 2]), training, 1)
    assert not any(run.refused for run in planned)  # the generated dataset holds both batches
    refused = {r.training_args.num_gpus: r.refused for r in refuse_unfillable(planned, dataset_dir, model_dir)}
    assert refused[1] == ""
    assert f"the dataset has {usable} usable examples, fewer than one batch of {2 * usable}" in refused[2]


def test_the_plain_loop_packs_too_few_rows_for_a_batch_is_refused_before_launch(sources):
    """The plain loop cuts packed rows of max_seq_length from the examples' tokens: a dataset whose tokens fill
    fewer rows than one batch would only fail in the run; TRL packs whole examples (one is enough)."""
    from transformers import AutoTokenizer

    from finetune_bench.running.backends.data import pack, packed_rows

    dataset_dir, model_dir = sources
    dataset, tokenizer = load_prompt_completion(dataset_dir), AutoTokenizer.from_pretrained(model_dir)
    length = 64
    rows = packed_rows(dataset, tokenizer, [length])[length]
    assert rows == len(pack(tokenize_prompt_completion(dataset, tokenizer, length), length))
    for batch, refused in ((rows, False), (rows + 1, True)):
        training = TrainingArgs(
            backend="plain_loop", packing=True, max_seq_length=length, per_device_train_batch_size=batch
        )
        (run,) = refuse_unfillable(plan_runs(ExperimentArgs(arm=["baseline"]), training, 1), dataset_dir, model_dir)
        assert bool(run.refused) is refused, run.refused
        if refused:
            assert f"make {rows} rows, fewer than one batch of {rows + 1}" in run.refused
