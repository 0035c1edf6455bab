"""W&B: one offline run per condition, grouped by execution, finished even when a run or its logging fails,
never carrying a secret; the registered task requests the W&B secret and links every map item."""

import json
import logging
import math
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import wandb
from flytekit import Secret
from flytekit.core.context_manager import ExecutionState, FlyteContextManager
from flytekit.types.directory import FlyteDirectory
from google.protobuf.message import DecodeError
from wandb.proto import wandb_internal_pb2

from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.secrets import REDACTED
from finetune_bench.inputs.settings import TrainingArgs
from finetune_bench.integrations import wandb_logging as tracking
from finetune_bench.results.record import RunResult
from finetune_bench.running.faults import FAULT_ENV

PROJECT_ROOT = Path(__file__).resolve().parents[2]
WANDB_KEY = "wandbFAKEkey0123456789abcdef0123456789abcd"
HF_TOKEN = "hf_FAKEtokenVALUE0123456789abcdef"


# --- reading back what W&B writes offline: run-<id>.wandb, a LevelDB-style log of protobuf records ---


def _records(path: Path):
    data = path.read_bytes()
    if len(data) < 7:
        raise ValueError(f"{path}: no header yet")
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    block, header = 32768, 7
    pos, pending = 7, b""
    while pos + header <= len(data):
        left = block - pos % block
        if left < header:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        if kind == 0:  # zero padding up to the end of the block
            pos += left
            continue
        chunk = data[pos + header : pos + header + length]
        pos += header + length
        if kind == 1:  # FULL
            yield chunk
        elif kind == 2:  # FIRST
            pending = chunk
        elif kind == 3:  # MIDDLE
            pending += chunk
        else:  # LAST
            yield pending + chunk
            pending = b""


def _items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def read_run(run_dir: Path) -> dict:
    """An offline run's name, group, tags, config, history, summary and exit code (None: never finished)."""
    (wandb_file,) = run_dir.glob("run-*.wandb")
    run = {"history": [], "summary": {}, "exit_code": None}
    for raw in _records(wandb_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.update(
                id=r.run_id,
                name=r.display_name,
                group=r.run_group,
                job_type=r.job_type,
                tags=list(r.tags),
                notes=r.notes,
                config={k: v for k, v in _items(r.config.update).items() if k != "_wandb"},
            )
        elif kind == "history":
            run["history"].append(_items(record.history.item))
        elif kind == "summary":
            run["summary"].update(_items(record.summary.update))
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
    return run


def offline_runs(wandb_dir: Path, timeout_s: float = 30) -> dict[str, dict]:
    """Every offline run under WANDB_DIR, by name, once each has its exit record: W&B's service writes the
    file asynchronously, and `finish()` may return before the last records (even the first) are on disk."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            runs = [read_run(d) for d in sorted((wandb_dir / "wandb").glob("offline-run-*"))]
            complete = all("name" in run and run["exit_code"] is not None for run in runs)
        except (DecodeError, ValueError):  # the file not there yet, or a record half-written
            runs, complete = [], False
        if complete or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert complete, f"W&B runs under {wandb_dir} still incomplete after {timeout_s} s"
    by_name = {run["name"]: run for run in runs}
    assert len(by_name) == len(runs), [run["name"] for run in runs]
    return by_name


@pytest.fixture
def wandb_dir(tmp_path, monkeypatch):
    """W&B offline into a fresh directory; no key, no entity from the developer's environment."""
    for name in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_MODE", "WANDB_DISABLED", FAULT_ENV):
        monkeypatch.delenv(name, raising=False)
    directory = tmp_path / "wandb-dir"
    monkeypatch.setenv("WANDB_DIR", str(directory))
    yield directory
    assert wandb.run is None


def planned(condition_id: str, run_number: int = 0, refused: str = "", **overrides) -> PlannedRun:
    args = TrainingArgs(backend="plain_loop", arm="baseline", max_steps=2, **overrides)
    return PlannedRun(condition_id, run_number, args, swept_axes=sorted(overrides), refused=refused)


def run_grid(runs: list[PlannedRun], model_dir: Path, dataset_dir: Path, store: Path):
    """The workflow's fan-out (a map task over the train task, as `run_benchmark` builds it), run locally:
    items one after another in this process. (Not through `run_benchmark` itself: executing that @dynamic
    in-process leaves flytekit state behind that breaks later serialization tests.)"""
    from functools import partial

    from flytekit import map_task

    from tasks.train import train_condition

    train = partial(
        train_condition,
        dataset_dir=FlyteDirectory(str(dataset_dir)),
        model_dir=FlyteDirectory(str(model_dir)),
        condition_timeout_s=300,
        results_store=str(store),
        force_fresh=True,
        sources=None,
    )
    return map_task(train, concurrency=1, min_success_ratio=1.0)(planned_run=runs)


# --- the task ---


def test_a_failed_condition_never_leaks_into_the_next_one(
    wandb_dir, monkeypatch, tiny_model_dir, tiny_dataset_dir, tmp_path
):
    """Two map items in one process: the first runs out of memory at start-up, the second trains two steps.
    Each is its own finished run, with its own config, status and steps, in the same group."""
    monkeypatch.setenv(FAULT_ENV, "oom@0:*per_device_train_batch_size=1#0")
    runs = [
        planned("per_device_train_batch_size=1", per_device_train_batch_size=1),
        planned("per_device_train_batch_size=2", per_device_train_batch_size=2),
    ]
    outputs = run_grid(runs, tiny_model_dir, tiny_dataset_dir, tmp_path / "store")
    assert [o.result.status for o in outputs] == ["oom", "ok"]
    assert wandb.run is None

    logged = offline_runs(wandb_dir)
    assert set(logged) == {"per_device_train_batch_size=1#0", "per_device_train_batch_size=2#0"}
    oom, ok = logged["per_device_train_batch_size=1#0"], logged["per_device_train_batch_size=2#0"]
    assert oom["id"] != ok["id"] and oom["exit_code"] == ok["exit_code"] == 0
    assert oom["group"] == ok["group"] and oom["group"].startswith("local-")
    assert (oom["job_type"], oom["tags"], ok["tags"]) == ("baseline", ["baseline", "oom"], ["baseline", "ok"])

    assert oom["config"]["per_device_train_batch_size"] == 1 and ok["config"]["per_device_train_batch_size"] == 2
    assert oom["config"]["swept"] == {"per_device_train_batch_size": 1}
    assert (oom["config"]["condition_id"], oom["config"]["run_number"]) == ("per_device_train_batch_size=1", 0)
    assert ok["config"]["max_steps"] == 2 and ok["config"]["backend"] == "plain_loop"

    assert oom["summary"]["status"] == "oom" and "out of memory" in oom["summary"]["reason"]
    assert "OutOfMemoryError" in oom["summary"]["error_tail"]
    assert oom["history"] == [] and "tokens_per_second" not in oom["summary"]

    result = outputs[1].result
    assert ok["summary"]["status"] == "ok" and "error_tail" not in ok["summary"]
    assert ok["summary"]["tokens_per_second"] == pytest.approx(result.metrics["tokens_per_second"])
    assert ok["summary"]["final_loss"] == pytest.approx(result.metrics["final_loss"])
    assert [row["_step"] for row in ok["history"]] == [1, 2]
    assert [row["step/is_warmup"] for row in ok["history"]] == [True, False]
    assert all(row["step/tokens_per_second"] > 0 and math.isfinite(row["step/loss"]) for row in ok["history"])
    # Nothing of the first run in the second's file.
    assert "per_device_train_batch_size=1" not in json.dumps(ok)


def test_runs_of_one_execution_share_a_group_and_the_next_execution_gets_another(
    wandb_dir, tiny_model_dir, tiny_dataset_dir, tmp_path
):
    refused = "refused for this test"
    run_grid([planned("a", refused=refused), planned("b", refused=refused)], tiny_model_dir, tiny_dataset_dir, tmp_path)
    run_grid([planned("c", refused=refused)], tiny_model_dir, tiny_dataset_dir, tmp_path)
    logged = offline_runs(wandb_dir)
    assert logged["a#0"]["group"] == logged["b#0"]["group"] != logged["c#0"]["group"]
    assert logged["c#0"]["summary"]["status"] == "error" and logged["c#0"]["summary"]["reason"] == refused


def test_a_failure_to_log_keeps_the_result_and_fails_the_grid(wandb_dir, monkeypatch, tmp_path, caplog):
    from tasks.train import train_condition

    def broken(steps_file):
        raise RuntimeError("the steps table is unreadable")

    monkeypatch.setattr(tracking, "step_metrics", broken)
    with caplog.at_level(logging.WARNING):
        output = train_condition(
            planned_run=planned("broken", refused="refused for this test"),
            dataset_dir=FlyteDirectory(str(tmp_path)),
            model_dir=FlyteDirectory(str(tmp_path)),
            condition_timeout_s=60,
            results_store=str(tmp_path / "store"),
            force_fresh=True,
        )
    assert output.result.status == "error" and output.result.reason == "refused for this test"
    assert wandb.run is None
    assert "W&B logging failed for broken#0" in caplog.text and "the steps table is unreadable" in caplog.text
    # and the grid will end with a failing status naming it (see require_nothing_lost)
    assert output.result.problems == ["W&B: the run was not logged (RuntimeError: the steps table is unreadable)"]
    (run,) = offline_runs(wandb_dir).values()
    assert run["exit_code"] not in (None, 0)  # finished, marked failed


def test_a_reused_run_is_logged_and_marked(wandb_dir, tiny_model_dir, tiny_dataset_dir, tmp_path):
    from finetune_bench.results.store import ResultStore, hardware_fingerprint, run_key
    from tasks.train import train_condition

    run = planned("stored")
    stored = RunResult("stored", 0, [], run.training_args, status="oom", reason="out of memory at step 2")
    ResultStore(str(tmp_path / "store")).save(run_key(run, hardware_fingerprint()), stored)
    output = train_condition(
        planned_run=run,
        dataset_dir=FlyteDirectory(str(tiny_dataset_dir)),
        model_dir=FlyteDirectory(str(tiny_model_dir)),
        condition_timeout_s=60,
        results_store=str(tmp_path / "store"),
        force_fresh=False,
    )
    assert output.result.reused
    logged = offline_runs(wandb_dir)["stored#0"]
    assert logged["summary"]["reused"] is True and logged["summary"]["status"] == "oom"
    assert logged["tags"] == ["baseline", "oom", "reused"]


def test_secrets_reach_no_wandb_file_log_or_output(wandb_dir, monkeypatch, tmp_path, caplog, capfd):
    """A key and a token in the environment (offline forced, as a key would mean online), and a result
    that carries both (as a crash log might): neither appears in any file W&B writes, nor in the output."""
    from tasks.train import train_condition

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    monkeypatch.setenv("_FSEC_HF_TOKEN", HF_TOKEN)
    caplog.set_level(logging.DEBUG)
    train_condition(
        planned_run=planned("via-the-task", refused=f"refused; env had {HF_TOKEN}"),
        dataset_dir=FlyteDirectory(str(tmp_path)),
        model_dir=FlyteDirectory(str(tmp_path)),
        condition_timeout_s=60,
        results_store=str(tmp_path / "store"),
        force_fresh=True,
    )
    leaky = RunResult(
        "leaky",
        0,
        [],
        TrainingArgs(model_name=f"org/model-{HF_TOKEN}"),
        status="error",
        reason=f"crashed with WANDB_API_KEY={WANDB_KEY}",
        error_tail=f"Traceback ...\nHF_TOKEN={HF_TOKEN}\n",
        environment={"hf_token": HF_TOKEN, "python": "3.11"},
        details={"note": WANDB_KEY},
    )
    tracking.log_condition(leaky, None, group=f"group-{WANDB_KEY}", run_id="leaky", mode="offline", dir=wandb_dir)

    logged = offline_runs(wandb_dir)
    assert set(logged) == {"via-the-task#0", "leaky#0"}
    assert REDACTED in logged["leaky#0"]["summary"]["reason"]
    assert "hf_token" not in logged["leaky#0"]["config"]["environment"]
    # Also W&B's own service logs, kept under ~/.cache/wandb.
    files = [f for d in (wandb_dir, Path.home() / ".cache" / "wandb") for f in d.rglob("*") if f.is_file()]
    assert any(f.suffix == ".wandb" for f in files)
    captured = capfd.readouterr()
    texts = [f.read_bytes().decode("utf-8", errors="replace") for f in files]
    texts += [caplog.text, captured.out, captured.err]
    for secret in (WANDB_KEY, HF_TOKEN):
        assert not any(secret in text for text in texts)


# --- the pieces ---


@pytest.mark.parametrize(
    "env, key, local, expected",
    [
        ({}, None, True, "offline"),
        ({}, None, False, "disabled"),
        ({}, "k" * 40, True, "online"),
        ({}, "k" * 40, False, "online"),
        ({"WANDB_MODE": "offline"}, "k" * 40, True, "offline"),
        ({"WANDB_MODE": "disabled"}, "k" * 40, False, "disabled"),
        ({"WANDB_MODE": "dryrun"}, None, True, "offline"),
        ({"WANDB_DISABLED": "true"}, None, True, "disabled"),
    ],
)
def test_mode(env, key, local, expected, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracking.resolve_mode(key, local) == expected


def test_steps_become_per_step_metrics(tmp_path):
    steps = tmp_path / "steps.csv"
    steps.write_text(
        "step,step_time_s,non_padding_tokens,padded_tokens,model_flops,loss,eval_loss,peak_allocated_bytes,"
        "peak_reserved_bytes,gc_time_s,cuda_mallocs,cuda_malloc_retries,triton_compiles,triton_compile_s,"
        "triton_kernels_compiled,jit_cache_bytes,is_warmup\n"
        "1,2.0,100,128,1e9,5.5,,1073741824,2147483648,0.0,3,0,2,0.66,liger_cross_entropy_kernel×2,4300000,True\n"
        "2,0.5,100,128,1e9,nan,2.0,,,0.0,,,0,0.0,,,False\n",
        encoding="utf-8",
    )
    (s1, m1), (s2, m2) = tracking.step_metrics(steps)
    assert (s1, s2) == (1, 2)
    assert m1["step/tokens_per_second"] == 50 and m1["step/padded_tokens_per_second"] == 64
    assert (m1["step/peak_allocated_gib"], m1["step/peak_reserved_gib"], m1["step/is_warmup"]) == (1, 2, True)
    assert m2["step/tokens_per_second"] == 200 and m2["step/is_warmup"] is False
    assert (m1["step/triton_compiles"], m1["step/triton_compile_s"], m2["step/triton_compiles"]) == (2, 0.66, 0)
    assert m1["step/jit_cache_bytes"] == 4300000 and "step/jit_cache_bytes" not in m2
    assert math.isnan(m2["step/loss"]) and "step/peak_reserved_gib" not in m2 and "step/cuda_mallocs" not in m2
    assert "eval/loss" not in m1 and m2["eval/loss"] == 2.0 and m2["eval/perplexity"] == pytest.approx(math.exp(2.0))
    assert tracking.step_metrics(None) == [] and tracking.step_metrics(tmp_path / "missing.csv") == []


def test_a_run_left_open_is_neither_reused_nor_left_open(wandb_dir, tmp_path):
    """What the plugin's own decorator does after a failed item: a run stays open. Ours never logs into it
    and finishes whatever is still open when the task returns or raises."""
    from tasks.wandb_flyte import condition_wandb_run_class

    def failing_task():
        wandb.init(mode="offline", dir=wandb_dir, name="left-open", project="p", settings=wandb.Settings(quiet=True))
        raise RuntimeError("the task failed")

    decorated = condition_wandb_run_class()(failing_task, project="p", entity="e", secret=Secret(key="k"))
    with pytest.raises(RuntimeError, match="the task failed"):
        decorated()
    assert wandb.run is None

    leaked = wandb.init(mode="offline", dir=wandb_dir, name="leaked", project="p", settings=wandb.Settings(quiet=True))
    try:
        result = RunResult("next", 0, [], TrainingArgs(), status="ok", metrics={"final_loss": 1.5})
        tracking.log_condition(result, None, group="g", run_id="next-run", mode="offline", dir=wandb_dir)
    finally:
        leaked.finish()
    logged = offline_runs(wandb_dir)
    assert logged["left-open"]["exit_code"] not in (None, 0)
    assert logged["next#0"]["summary"]["final_loss"] == 1.5 and logged["next#0"]["exit_code"] == 0
    assert "final_loss" not in logged["leaked"]["summary"] and logged["leaked"]["config"] == {}


def test_remote_rules_run_id_group_and_the_secret_for_this_call_only(monkeypatch):
    """In a pod: the run id is HOSTNAME (what the UI link points at), the group the execution name, and
    the API key, fetched by the decorator, exists for the task call only."""
    from tasks import wandb_flyte as train

    monkeypatch.setenv("HOSTNAME", "f3a1b2c-n1-0-n0-0-4")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    seen = {}

    def task_body():
        seen.update(
            run_id=train.wandb_run_id(),
            group=train.experiment_group(),
            credentials=tracking.current_credentials(),
            mode=tracking.resolve_mode(tracking.current_credentials()[0], local=False),
        )

    decorated = train.condition_wandb_run_class()(
        task_body, project="p", entity="e", secret=lambda: WANDB_KEY, api_host="https://api.example.com"
    )
    ctx = FlyteContextManager.current_context()
    remote = ctx.with_execution_state(ctx.new_execution_state().with_params(mode=ExecutionState.Mode.TASK_EXECUTION))
    with FlyteContextManager.with_context(remote):
        decorated()
    execution_name = ctx.user_space_params.execution_id.name
    assert seen == {
        "run_id": "f3a1b2c-n1-0-n0-0-4",
        "group": execution_name,
        "credentials": (WANDB_KEY, "https://api.example.com"),
        "mode": "online",
    }
    assert tracking.current_credentials() == (None, None)
    assert WANDB_KEY not in os.environ.values()


def test_without_an_entity_the_task_has_no_secret_no_link_and_no_decorator():
    if os.environ.get("WANDB_ENTITY"):
        pytest.skip("WANDB_ENTITY is set in this environment")
    from tasks.train import train_condition

    assert train_condition.security_context is None or not train_condition.security_context.secrets
    assert "WANDB_ENTITY" not in train_condition.environment
    assert type(train_condition.task_function).__name__ == "function"


_REGISTERED = textwrap.dedent(
    """
    import json, wandb
    from flytekit.configuration import ImageConfig, SerializationSettings
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.tools.translator import get_serializable
    from flytekit.types.directory import FlyteDirectory
    from finetune_bench.inputs.plan import PlannedRun, RunSettings
    from finetune_bench.inputs.settings import TrainingArgs
    from tasks.train import train_condition
    from tasks.train_ranks import ELASTIC_TRAIN_TASKS
    from tasks.wandb_flyte import wandb_link_config
    from workflows.benchmark import run_benchmark

    planned = [PlannedRun("a", 0, TrainingArgs(), [], refused="refused for this test")]
    settings = SerializationSettings(image_config=ImageConfig.auto_default_image())
    ctx = FlyteContextManager.current_context().with_serialization_settings(settings)
    execution = RunSettings(concurrency=2, min_success_ratio=0.5, condition_timeout_s=60, results_store="s3://b/r")
    inputs = dict(dataset_dir=FlyteDirectory("s3://b/d"), model_dir=FlyteDirectory("s3://b/m"), execution=execution)
    with FlyteContextManager.with_context(ctx) as ctx:
        spec = run_benchmark.compile_into_workflow(ctx, run_benchmark._task_function, planned=planned, **inputs)
    task = get_serializable({}, settings, train_condition).template
    elastic = get_serializable({}, settings, ELASTIC_TRAIN_TASKS[2, 4]).template
    (mapped,) = spec.tasks
    # And the decorated task still runs locally, offline, leaving no run open.
    output = train_condition(planned_run=planned[0], dataset_dir=FlyteDirectory("."), model_dir=FlyteDirectory("."),
                             condition_timeout_s=60, results_store=execution.results_store.replace("s3://b", "."),
                             force_fresh=True)
    print(json.dumps(dict(
        decorator=type(train_condition.task_function).__name__,
        plugin_config=train_condition.task_function.get_extra_config(),
        link_config=wandb_link_config(),
        task_config=task.config, map_config=mapped.config,
        task_secrets=[s.key for s in task.security_context.secrets],
        elastic_name=elastic.id.name, elastic_config=elastic.config,
        elastic_secrets=[s.key for s in elastic.security_context.secrets], elastic_env=elastic.container.env,
        map_secrets=[s.key for s in mapped.security_context.secrets],
        task_env=task.container.env, map_env=mapped.container.env,
        status=output.result.status, open_run=wandb.run is not None,
    )))
    """
)


def test_with_an_entity_every_map_item_requests_the_secret_and_links_to_its_run(tmp_path):
    """Registered (and compiled by the @dynamic at run time) with WANDB_ENTITY set: the task and the map
    task over it carry the plugin's link config, request the secret and pass the settings on to the pod;
    the API key itself is in no template."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "FINETUNE_BENCH_WANDB"))}
    env.update(
        WANDB_ENTITY="my-team",
        WANDB_PROJECT="liger-bench",
        WANDB_API_KEY=WANDB_KEY,
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path / "wandb-dir"),
        PYTHONPATH=str(PROJECT_ROOT),
    )
    completed = subprocess.run(
        [sys.executable, "-c", _REGISTERED],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    seen = json.loads(completed.stdout.strip().splitlines()[-1])
    link = {
        "project": "liger-bench",
        "entity": "my-team",
        "host": "https://wandb.ai",
        "link_type": "wandb-execution-id",
    }
    assert seen["decorator"] == "condition_wandb_run"
    assert seen["plugin_config"] == seen["link_config"] == link
    assert seen["task_config"] == seen["map_config"] == link
    assert seen["task_secrets"] == seen["map_secrets"] == ["wandb_api_key"]
    assert seen["task_env"] == seen["map_env"] == {"WANDB_ENTITY": "my-team", "WANDB_PROJECT": "liger-bench"}
    # the train tasks of runs on several GPUs (a PyTorchJob here) likewise, under their module-level names
    assert seen["elastic_name"] == "tasks.train_ranks.train_condition_2x4gpu"
    assert seen["elastic_secrets"] == ["wandb_api_key"] and seen["elastic_env"] == seen["task_env"]
    assert seen["elastic_config"] == link
    assert (seen["status"], seen["open_run"]) == ("error", False)
    assert WANDB_KEY not in completed.stdout + completed.stderr
    (run,) = offline_runs(tmp_path / "wandb-dir").values()
    assert run["name"] == "a#0" and run["exit_code"] == 0


def _a_result() -> RunResult:
    run = planned("unreachable")
    return RunResult(run.condition_id, 0, [], run.training_args, "ok", metrics={"tokens_per_second": 1.0})


def test_an_unreachable_server_is_found_in_seconds_and_the_run_logged_offline(wandb_dir, monkeypatch):
    import time

    from tasks import wandb_flyte as task_wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    tracking.unreachable.cache_clear()
    result = _a_result()
    started = time.monotonic()
    logged = task_wandb.log_to_wandb(result)
    assert time.monotonic() - started < 30  # not W&B's own 90 s wait
    assert logged is not None and logged.mode == "offline"
    assert result.details["wandb"].startswith("logged offline: 127.0.0.1:9 unreachable")
    assert result.problems == []  # nothing lost: `wandb sync` uploads it later
    assert WANDB_KEY not in json.dumps(result.details)


def test_an_unreachable_server_on_a_cluster_leaves_the_run_unlogged_and_says_so(wandb_dir, monkeypatch):
    from tasks import wandb_flyte as task_wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setattr(task_wandb, "on_cluster", lambda: True)
    tracking.unreachable.cache_clear()
    result = _a_result()
    assert task_wandb.log_to_wandb(result) is None
    (problem,) = result.problems
    assert problem.startswith("W&B: the run was not logged (127.0.0.1:9 unreachable")
