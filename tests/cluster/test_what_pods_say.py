"""What a cluster execution says at planning and as each run ends: a results store on each pod's own disk, a W&B server
the pods cannot reach (probed without a network here), and one line per run or search in its pod's log."""

import urllib.error
from types import SimpleNamespace

import pytest

from finetune_bench.frontier.search import FOUND, FrontierResult, Probe, search_line
from finetune_bench.frontier.settings import FrontierArm, FrontierSearch
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.integrations import wandb_logging as tracking
from finetune_bench.results.record import RunResult
from finetune_bench.running.launch import ending_line
from tasks import execution, plan, wandb_flyte

# --- a results store on each pod's disk ---------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["/work/main/runs/.results", "./results", "~/results", "file:///data/results"])
def test_a_local_results_store_on_a_cluster_is_said_to_stay_on_each_pod(store, monkeypatch):
    assert execution.cluster_notes(store) == []  # locally it is this machine's directory
    monkeypatch.setattr(execution, "on_cluster", lambda: True)
    monkeypatch.setattr(execution, "WANDB_ENTITY", "team")
    (note,) = execution.cluster_notes(store)
    assert note.startswith(f"results_store {store!r} is a local path: on a cluster each train pod writes it on its own")
    assert "s3://" in note


def test_an_object_store_on_a_cluster_is_not_remarked_on(monkeypatch):
    monkeypatch.setattr(execution, "on_cluster", lambda: True)
    monkeypatch.setattr(execution, "WANDB_ENTITY", "team")
    assert execution.cluster_notes("s3://bucket/results") == execution.cluster_notes("gs://b/r") == []


# --- W&B answers --------------------------------------------------------------------------------------------------


@pytest.fixture
def wandb_on_a_cluster(monkeypatch):
    monkeypatch.setattr(wandb_flyte, "on_cluster", lambda: True)
    monkeypatch.setattr(wandb_flyte, "WANDB_ENTITY", "team")
    monkeypatch.setattr(wandb_flyte, "WANDB_API_URL", "https://wandb.corp.example.com")
    monkeypatch.delenv("WANDB_MODE", raising=False)


def test_a_w_and_b_server_that_does_not_answer_stops_the_plan_naming_it(wandb_on_a_cluster):
    asked = []

    def probe(url):
        asked.append(url)
        return "gaierror: Name or service not known"

    with pytest.raises(SpecError) as refused:
        wandb_flyte.require_wandb_answers(probe)
    assert asked == ["https://wandb.corp.example.com"]
    (problem,) = refused.value.problems
    assert "wandb.corp.example.com" in problem and "Name or service not known" in problem
    assert "WANDB_MODE=disabled" in problem and "WANDB_BASE_URL" in problem
    wandb_flyte.require_wandb_answers(lambda url: None)  # it answers: nothing to say


def test_w_and_b_off_or_a_local_run_asks_no_server(wandb_on_a_cluster, monkeypatch):
    def probe(url):
        raise AssertionError("the W&B server was asked")

    monkeypatch.setenv("WANDB_MODE", "disabled")
    wandb_flyte.require_wandb_answers(probe)
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setattr(wandb_flyte, "WANDB_ENTITY", None)
    wandb_flyte.require_wandb_answers(probe)
    monkeypatch.setattr(wandb_flyte, "WANDB_ENTITY", "team")
    monkeypatch.setattr(wandb_flyte, "on_cluster", lambda: False)
    wandb_flyte.require_wandb_answers(probe)


def test_planning_says_a_missing_key_and_a_silent_server_at_once(wandb_on_a_cluster, monkeypatch):
    class NoSecrets:
        def get(self, key, group=None):
            raise ValueError(key)

    monkeypatch.setattr(wandb_flyte, "current_context", lambda: SimpleNamespace(secrets=NoSecrets()))
    monkeypatch.setattr(tracking, "no_answer", lambda url: "ConnectionRefusedError: refused")
    with pytest.raises(SpecError) as refused:
        plan.check_wandb_key(dry_run=False)
    assert len(refused.value.problems) == 2
    assert "could not read the secret" in refused.value.problems[0]
    assert "wandb.corp.example.com" in refused.value.problems[1]
    plan.check_wandb_key(dry_run=True)  # a dry run logs nothing


def test_the_probe_counts_any_http_answer_and_sends_no_key():
    requests = []

    def answers(status):
        def open_url(request, timeout):
            requests.append((request, timeout))
            if status != 200:
                raise urllib.error.HTTPError(request.full_url, status, "no", {}, None)
            return open("/dev/null", "rb")

        return open_url

    assert tracking.no_answer("https://api.wandb.ai", open_url=answers(200)) is None
    assert tracking.no_answer("api.wandb.ai", open_url=answers(401)) is None  # refused without a key: an answer
    request, timeout = requests[-1]
    assert request.full_url == "https://api.wandb.ai" and timeout <= 10
    assert not request.headers and not request.unredirected_hdrs  # no key, no authorization

    def silent(request, timeout):
        raise urllib.error.URLError(TimeoutError("timed out"))

    assert tracking.no_answer("https://api.wandb.ai", open_url=silent) == "TimeoutError: timed out"


# --- one line per run, per search ---------------------------------------------------------------------------------


def _result(**fields) -> RunResult:
    values = dict(condition_id="arm=liger", run_number=1, swept_axes=["arm"], training_args=TrainingArgs(), status="ok")
    return RunResult(**{**values, **fields})


def test_a_run_s_ending_says_its_status_speed_memory_and_where_it_is_kept(monkeypatch):
    run = PlannedRun("arm=liger", 1, TrainingArgs(), ["arm"])
    measured = _result(metrics={"tokens_per_second": 12345.6, "peak_reserved_bytes": 3 * 2**30}, wall_time_s=42.25)
    assert ending_line(run, measured, "s3://bucket/results") == (
        "arm=liger run 1: ok, 12,346 tokens/s, 42.2 s, peak reserved 3.00 GiB, stored in s3://bucket/results"
    )
    reused = _result(reused=True)
    assert ending_line(run, reused, "s3://b/r").endswith("ok, taken from the results store s3://b/r")
    lost = _result(status="oom", reason="CUDA out of memory\nTried to allocate", problems=["results store: denied"])
    assert ending_line(run, lost, "s3://b/r") == "arm=liger run 1: oom (CUDA out of memory), results store: denied"
    refused = PlannedRun("arm=liger", 1, TrainingArgs(), ["arm"], refused="no kernels")
    assert ending_line(refused, _result(status="error", reason="no kernels"), "s3://b/r").endswith(
        "error (no kernels), not launched, not stored"
    )


def test_a_run_s_ending_holds_no_credential(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wandbKEYinTHEpod0123456789")
    run = PlannedRun("c", 0, TrainingArgs(), [])
    line = ending_line(run, _result(reason="x", status="error"), "s3://AKIAKEY:s3cretVALUE@bucket/results")
    assert "s3cretVALUE" not in line and "AKIAKEY" not in line and "s3://bucket/results" in line
    leaked = _result(status="error", reason="failed with wandbKEYinTHEpod0123456789")
    assert "wandbKEYinTHEpod0123456789" not in ending_line(run, leaked, "s3://b")


def test_a_search_s_ending_says_its_frontier_probes_and_memory():
    search = FrontierSearch(FrontierArm(arm="liger"), "batch_size", TrainingArgs(), 1, 64, 1, 1, 1, 60)
    probes = [Probe(16, "double", 1, "ok", peak_reserved_bytes=7.5 * 2**30), Probe(32, "double", 1, "oom")]
    result = FrontierResult(search, FOUND, "32 ran out of memory", 16, 32, probes, 2, 90.0)
    assert search_line(result) == (
        "search liger batch_size: found (32 ran out of memory), frontier 16, first out of memory at 32, 2 probe(s), "
        "90 device-seconds, peak reserved 7.50 GiB at the frontier; returned to the report"
    )
