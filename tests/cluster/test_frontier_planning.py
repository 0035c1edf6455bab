"""The memory frontier's planning and report on a cluster, decided without one: the W&B key checked as the
benchmark's planning checks it, and what an empty results_store means for the throughput runs said in the plan's log
and in the report."""

import pytest

from finetune_bench.frontier.settings import BatchSizeSearch, ProbeSettings, SeqLengthSearch
from finetune_bench.inputs.plan import PlannedRun, RunSettings
from finetune_bench.inputs.settings import TrainingArgs
from tasks import execution, frontier
from tasks.plan import InvalidInputs
from tests.cluster.registering_shell import printed_by_a_registering_shell
from tests.cluster.test_execution import wandb_asked_for_on_a_cluster  # noqa: F401 (a fixture)

SMALL = dict(
    training_args=TrainingArgs(backend="plain_loop", max_seq_length=32, synthetic_min_words=40, synthetic_max_words=50),
    arms=None,
    batch_size_search=BatchSizeSearch(start=1, cap=2),
    seq_length_search=SeqLengthSearch(enabled=False),
    probes=ProbeSettings(max_steps=2, timing_warmup_steps=1, retries=1, confirmations=1, timeout_s=60),
    n_runs=1,
    concurrency=1,
    # the defaults: with throughput runs off (most tests here), a value set would act nowhere and be refused
    min_success_ratio=0.1,
    condition_timeout_s=3600,
)


@pytest.fixture
def on_a_cluster(monkeypatch):
    monkeypatch.setattr(execution, "on_cluster", lambda: True)
    monkeypatch.setattr(execution, "WANDB_ENTITY", "team")


def test_throughput_runs_to_log_without_a_readable_w_and_b_key_stop_the_frontier_at_planning(
    wandb_asked_for_on_a_cluster,  # noqa: F811
):
    with pytest.raises(InvalidInputs, match="WANDB_ENTITY is 'team' but the task could not read the secret"):
        frontier.plan_frontier.task_function(**SMALL)
    # nothing to log: a dry run, or no throughput runs (the probes log nothing)
    frontier.plan_frontier.task_function(**SMALL, dry_run=True)
    frontier.plan_frontier.task_function(**SMALL, measure_throughput=False)


def _registered_secrets(**env) -> dict[str, list[str]]:
    """The secrets the two planning tasks request, registered by a shell with `env`."""
    code = (
        "import json; from tasks.plan import plan_benchmark; from tasks.frontier import plan_frontier; "
        "print(json.dumps({t.name: [s.key for s in t.security_context.secrets] if t.security_context else [] "
        "for t in (plan_benchmark, plan_frontier)}))"
    )
    return printed_by_a_registering_shell(code, **env)


def test_the_frontier_s_planning_requests_the_w_and_b_secret_as_the_benchmark_s_does():
    requested = _registered_secrets(WANDB_ENTITY="team")
    assert requested == {
        "tasks.plan.plan_benchmark": ["wandb_api_key"],
        "tasks.frontier.plan_frontier": ["wandb_api_key"],
    }


def test_the_frontier_s_plan_says_an_empty_results_store_leaves_the_throughput_runs_on_the_pods(on_a_cluster, capsys):
    frontier.plan_frontier.task_function(**SMALL, results_store="")
    log = capsys.readouterr().out
    assert "the plan:\nliger: per_device_train_batch_size from 1 up to 2\nbaseline:" in log
    assert f"note: the throughput runs: {execution.NO_RESULTS_STORE}" in log
    frontier.plan_frontier.task_function(**SMALL, results_store="s3://bucket/results")
    frontier.plan_frontier.task_function(**SMALL, measure_throughput=False)
    assert "note:" not in capsys.readouterr().out


def _report(monkeypatch, **kwargs) -> str:
    """report_frontier's HTML report of one search lost and one throughput run lost."""
    shown = {}

    def publish(report, file_name, tables, records, title=None):
        shown["html"] = report.to_html(title=title)
        return None, None, []

    monkeypatch.setattr(frontier, "publish", publish)
    searches = frontier.plan_frontier.task_function(**{**SMALL, "measure_throughput": False}).searches
    planned = [PlannedRun("c1", 1, TrainingArgs(backend="plain_loop"), [])]
    frontier.report_frontier.task_function(
        searches=searches, results=[None] * len(searches), planned=planned, outputs=[None], **kwargs
    )
    return shown["html"]


def test_the_frontier_s_report_says_an_empty_results_store_left_the_throughput_runs_on_the_pods(
    on_a_cluster, monkeypatch
):
    empty = RunSettings(1, 0.5, 60, "")
    assert "the throughput runs: results_store is empty" in _report(monkeypatch, execution=empty)
    bucket = RunSettings(1, 0.5, 60, "s3://bucket/results")
    assert "results_store is empty" not in _report(monkeypatch, execution=bucket)
