"""What a cluster execution says it does not keep, and W&B asked for without a key, decided without a cluster."""

from types import SimpleNamespace

import pytest

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.results.record import RunResult
from tasks import execution, wandb_flyte
from tests.cluster.registering_shell import printed_by_a_registering_shell


def test_locally_nothing_is_said_on_a_cluster_the_missing_store_and_w_and_b_are(monkeypatch):
    assert execution.cluster_notes("") == []
    monkeypatch.setattr(execution, "on_cluster", lambda: True)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(execution, "WANDB_ENTITY", None)
    assert execution.cluster_notes("") == [execution.NO_RESULTS_STORE, execution.NO_WANDB]
    assert execution.cluster_notes("s3://bucket/results") == [execution.NO_WANDB]
    monkeypatch.setattr(execution, "WANDB_ENTITY", "team")
    assert execution.cluster_notes("s3://bucket/results") == []


class _NoSecrets:
    def get(self, key, group=None):
        raise ValueError(f"Unable to find secret for key {key}")


@pytest.fixture
def wandb_asked_for_on_a_cluster(monkeypatch):
    monkeypatch.setattr(wandb_flyte, "on_cluster", lambda: True)
    monkeypatch.setattr(wandb_flyte, "WANDB_ENTITY", "team")
    monkeypatch.setattr(wandb_flyte, "current_context", lambda: SimpleNamespace(secrets=_NoSecrets()))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_w_and_b_asked_for_without_a_readable_key_stops_the_plan(wandb_asked_for_on_a_cluster):
    with pytest.raises(SpecError, match="could not read the secret 'wandb_api_key'"):
        wandb_flyte.require_wandb_key()


def test_w_and_b_turned_off_needs_no_key(wandb_asked_for_on_a_cluster, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    wandb_flyte.require_wandb_key()


def test_a_run_that_cannot_be_logged_for_want_of_a_key_says_so(wandb_asked_for_on_a_cluster):
    result = RunResult(condition_id="c", run_number=1, swept_axes=[], training_args=TrainingArgs(), status="ok")
    assert wandb_flyte.log_to_wandb(result) is None
    (problem,) = result.problems
    assert problem.startswith("W&B: the run was not logged (WANDB_ENTITY is 'team' but the task could not read")


def _registered_settings(**env) -> dict:
    """tasks.registration as a registering shell with `env` defines it."""
    code = (
        "import json; from tasks import registration as s; "
        "print(json.dumps({'env': s.REGISTRATION_ENV, 'secrets': [x.key for x in s.WANDB_SECRETS]}))"
    )
    return printed_by_a_registering_shell(code, **env)


def test_an_empty_setting_reaches_the_pods_only_where_empty_means_something():
    found = _registered_settings(FINETUNE_BENCH_TRAIN_ACCELERATOR="", WANDB_BASE_URL="", FINETUNE_BENCH_TRAIN_CPU="")
    assert found["env"] == {"FINETUNE_BENCH_TRAIN_ACCELERATOR": ""}  # any GPU; the others keep their defaults


def test_w_and_b_turned_off_requests_no_secret():
    assert _registered_settings(WANDB_ENTITY="team")["secrets"] == ["wandb_api_key"]
    turned_off = _registered_settings(WANDB_ENTITY="team", WANDB_MODE="disabled")
    assert turned_off["secrets"] == [] and turned_off["env"]["WANDB_MODE"] == "disabled"
