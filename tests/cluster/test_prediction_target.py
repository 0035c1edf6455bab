"""The GPU a plan predicts for when the inputs name none: on a cluster (a pod, or `union run --remote` checking an
inputs file), the accelerator the train tasks are registered with; locally the local GPU or none."""

from types import SimpleNamespace

import click
import pytest

from finetune_bench.inputs.errors import SpecError
from finetune_bench.prediction.grid import ACCELERATOR_ENV
from tasks import plan, registration


@pytest.fixture
def registered_without_an_accelerator(monkeypatch):
    """The settings of a registration without FINETUNE_BENCH_TRAIN_ACCELERATOR: the train tasks ask for an A100."""
    monkeypatch.delenv(ACCELERATOR_ENV, raising=False)
    monkeypatch.setattr(plan, "REGISTERED_ACCELERATOR", "nvidia-tesla-a100")


def test_the_registered_accelerator_is_the_train_task_s():
    assert plan.REGISTERED_ACCELERATOR is registration.REGISTERED_ACCELERATOR
    from tasks.train import train_condition

    assert train_condition.accelerator.to_flyte_idl().device == (registration.REGISTERED_ACCELERATOR or "")


def test_in_a_pod_an_empty_gpu_kind_is_the_registered_accelerator(registered_without_an_accelerator, monkeypatch):
    monkeypatch.setattr(plan, "on_cluster", lambda: True)
    assert plan.predicted_accelerator("") == "nvidia-tesla-a100"
    assert plan.predicted_accelerator("H100") == "H100"  # the inputs' accelerator comes first
    plan.check_prediction_settings("", 0.0, 0.0, skip_predicted_oom=True)  # the A100's memory to compare with
    monkeypatch.setattr(plan, "REGISTERED_ACCELERATOR", "")  # registered for any GPU: none to predict for
    with pytest.raises(SpecError, match="skip_predicted_oom needs the GPU's memory"):
        plan.check_prediction_settings("", 0.0, 0.0, skip_predicted_oom=True)


def test_union_run_remote_checks_an_inputs_file_for_the_registered_accelerator(registered_without_an_accelerator):
    remote = click.Context(click.Command("benchmarking_experiment"), obj=SimpleNamespace(is_remote=True))
    with remote:
        assert plan.for_a_cluster() and plan.predicted_accelerator("") == "nvidia-tesla-a100"
        plan.check_prediction_settings("", 0.0, 0.0, skip_predicted_oom=True)
    local = click.Context(click.Command("benchmarking_experiment"), obj=SimpleNamespace(is_remote=False))
    with local:
        assert not plan.for_a_cluster()


def test_locally_an_empty_gpu_kind_names_no_gpu(registered_without_an_accelerator):
    assert plan.predicted_accelerator("") == ""
    with pytest.raises(SpecError, match="skip_predicted_oom needs the GPU's memory"):
        plan.check_prediction_settings("", 0.0, 0.0, skip_predicted_oom=True)
