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
