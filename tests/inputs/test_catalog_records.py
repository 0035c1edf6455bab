"""The backend records and the loss paths: every name they give exists where it is used."""

import importlib

import pytest

from finetune_bench.inputs.arms import LOSS_KERNELS
from finetune_bench.inputs.catalog import BACKENDS, CRITERIA
from finetune_bench.inputs.loss_paths import LIGER_FUSED, LOSS_PATHS, TORCH, select_loss_path


@pytest.mark.parametrize("name", list(BACKENDS))
def test_every_backend_is_a_module_that_trains_a_run(name):
    record = BACKENDS[name]
    assert record.name == name
    module = importlib.import_module(f"finetune_bench.running.backends.{name}")
    assert callable(module.train)
    assert record.criteria and set(record.criteria) <= set(CRITERIA)
    for criterion in record.criteria:
        assert select_loss_path(criterion).criterion == criterion


def test_the_criteria_are_the_loss_paths_criteria_model_first():
    assert CRITERIA[0] == "model"
    assert set(CRITERIA) == {path.criterion for path in LOSS_PATHS}
    with pytest.raises(ValueError, match="no loss path for criterion 'mse'"):
        select_loss_path("mse")


def test_the_model_s_loss_path_follows_the_liger_loss_kernels_in_place():
    assert {path.liger_kernel for path in LOSS_PATHS} - {None} == set(LOSS_KERNELS)
    assert select_loss_path("model").name == "hf_cross_entropy"
    assert select_loss_path("model", {"cross_entropy"}).name == "liger_cross_entropy"
    both = select_loss_path("model", set(LOSS_KERNELS))  # Liger's fused forward computes the loss
    assert (both.name, both.kernel, both.materializes_logits) == (
        "liger_fused_linear_cross_entropy",
        LIGER_FUSED,
        False,
    )
    # any other criterion is the loss, whatever Liger replaced in the model
    outside = select_loss_path("torch_cross_entropy", set(LOSS_KERNELS))
    assert (outside.name, outside.kernel, outside.float32_logits) == ("torch_cross_entropy", TORCH, True)
