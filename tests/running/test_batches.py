"""A run never trains a batch smaller than it is labelled with, and says why when the data cannot fill one."""

import pytest
import torch

from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.running.backends.data import NotOneBatch, require_one_batch
from finetune_bench.running.backends.trainer_common import training_arguments


def test_a_dataset_smaller_than_a_batch_is_an_error_naming_both():
    require_one_batch(4, 4, 32)
    with pytest.raises(NotOneBatch, match="the dataset has 3 usable examples, fewer than one batch of 4$"):
        require_one_batch(3, 4, 32)


def test_no_usable_example_points_at_max_seq_length():
    with pytest.raises(NotOneBatch, match="every example's prompt fills max_seq_length 16"):
        require_one_batch(0, 1, 16)


def test_the_trainers_drop_a_partial_last_batch(tmp_path):
    arguments = training_arguments(TrainingArgs(), torch.device("cpu"), torch.float32, tmp_path)
    assert arguments["dataloader_drop_last"] is True


def test_collate_pads_to_the_longest_row_or_up_to_a_multiple():
    from finetune_bench.running.backends.data import IGNORE_INDEX, collate

    rows = [{"input_ids": [5, 6, 7], "labels": [IGNORE_INDEX, 6, 7]}, {"input_ids": [1] * 5, "labels": [1] * 5}]
    longest = collate(rows, pad_token_id=0)
    rounded = collate(rows, pad_token_id=0, pad_to_multiple_of=4)
    assert longest["input_ids"].shape == (2, 5)
    assert rounded["input_ids"].shape == (2, 8)
    # The padding is masked out and carries no label; the real tokens are the same either way.
    assert rounded["attention_mask"].sum(dim=1).tolist() == [3, 5]
    assert (rounded["labels"][:, 5:] == IGNORE_INDEX).all() and (rounded["input_ids"][:, 5:] == 0).all()
    assert torch.equal(rounded["input_ids"][:, :5], longest["input_ids"])
    assert collate(rows, pad_token_id=0, pad_to_multiple_of=5)["input_ids"].shape == (2, 5)  # already a multiple


@pytest.mark.parametrize("backend", ["plain_loop", "hf_trainer", "trl_sft"])
def test_pad_to_multiple_of_gives_every_batch_one_shape(backend, tmp_path, tiny_dataset_dir, tiny_model_dir):
    """Generated examples are shorter than 512 tokens and of different lengths: padded to the multiple (512),
    every training batch has 2 × 512 positions, and the tokens counted are the real ones only."""
    import dataclasses

    import pandas as pd

    from finetune_bench.inputs.plan import PlannedRun
    from finetune_bench.running.launch import run_in_child

    args = dataclasses.replace(
        TrainingArgs(), backend=backend, max_seq_length=512, pad_to_multiple_of=512, per_device_train_batch_size=2,
        max_steps=2, eval_examples=2,
    )  # fmt: skip
    run = PlannedRun(condition_id="pad", run_number=0, training_args=args, swept_axes=[])
    result = run_in_child(run, tiny_dataset_dir, tiny_model_dir, tmp_path / backend, timeout_s=300)
    assert result.status == "ok", f"{result.reason}\n{result.error_tail}"
    steps = pd.read_csv(result.steps_file)
    assert (steps["non_padding_tokens"] < 512).all()  # so each batch's longest row is shorter than 512 ...
    assert (steps["padded_tokens"] == 2 * 512).all()  # ... and only the rounding makes it 2 × 512
    assert result.metrics["final_eval_loss"] > 0  # the held-out batches, padded the same way, evaluated


def test_the_plain_loops_loader_process_gives_the_batches_this_process_would(recwarn):
    """On a GPU the plain loop reads and pads its next batches in a loader process, during the step before: the same
    batches, in the same (seeded) order, as when this process reads them at each step's start (a CPU's runs)."""
    import datasets

    from finetune_bench.running.backends.data import collate
    from finetune_bench.running.backends.plain_loop import training_batches

    rows = [{"input_ids": list(range(i, i + 3 + i % 4)), "labels": list(range(i, i + 3 + i % 4))} for i in range(10)]
    data = datasets.Dataset.from_list(rows)
    args = TrainingArgs(per_device_train_batch_size=3)

    def first(pin_memory: bool, count: int = 7) -> list[dict]:  # two epochs and more: the reshuffles too
        batches = training_batches(data, args, lambda batch: collate(batch, pad_token_id=0), pin_memory)
        return [next(batches) for _ in range(count)]

    # pin_memory on a CPU: the loader process, without the pinning (PyTorch warns and leaves the tensors as they are)
    for prefetched, here in zip(first(True), first(False), strict=True):
        assert prefetched.keys() == here.keys()
        assert all(torch.equal(prefetched[key], here[key]) for key in here)
