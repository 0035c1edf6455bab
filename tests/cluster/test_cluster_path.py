"""`union run --remote` as far as a CPU machine can prove it: each workflow registered by union's own CLI as a user
runs it (default fast registration, from another working directory, the image build replaced by flytekit's writing
of the build context), then every serialized task run through flytekit's pod entrypoints in a fresh pod-like
directory that holds only what its image copies to /root (the analysis image's pods without the training stack).
What it does not prove: the image build on Union, the Kubeflow operator, NCCL across pods, GPU drivers."""

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import msgpack
import pytest
from flyteidl.core import literals_pb2
from flytekit.configuration import SERIALIZED_CONTEXT_ENV_VAR, SerializationSettings

from images.images import PROJECT_ROOT, TRAINING_ONLY
from tests.cluster.pods import Cluster, PodFailed

REGISTER = Path(__file__).with_name("register.py")
# Values no template may carry: a key in the registering shell's environment.
WANDB_KEY = "wandbKEYfromTHEshell0123456789abcdef"
HF_TOKEN = "hf_TOKENfromTHEshell0123456789abcdef"
BENCHMARK_INPUTS = """
experiment_args:
  arm: [liger, baseline]
training_args:
  model_name: "random:tiny-llama"
  dataset_name: "synthetic:alpaca"
  synthetic_num_examples: 16
  max_seq_length: 32
  max_steps: 2
  timing_warmup_steps: 1
"""
# The benchmark as the emulated cluster executes it skips the runs predicted to run out of memory, naming no GPU: the
# prediction is for the accelerator the train tasks are registered with (an A100), from the CLI's check to the plan.
# Its runs are kept in a results store (a directory standing for a bucket, `{store}`), where its second execution
# finds them.
EXECUTED_BENCHMARK_INPUTS = BENCHMARK_INPUTS + "skip_predicted_oom: true\nresults_store: '{store}'\n"
FRONTIER_INPUTS = """
training_args:
  model_name: "random:tiny-llama"
  dataset_name: "synthetic:alpaca"
  synthetic_num_examples: 16
  synthetic_min_words: 40
  synthetic_max_words: 50
  backend: "plain_loop"
  max_seq_length: 32
arms:
  - arm: baseline
batch_size_search: {enabled: true, start: 1, cap: 1}
seq_length_search: {enabled: false}
probes: {max_steps: 2, timing_warmup_steps: 1, retries: 1, confirmations: 1, timeout_s: 300}
"""
KERNEL_INPUTS = """
sweep:
  kernels: [rms_norm]
  model: "tiny-llama"
  tokens: [16]
  device: "cpu"
"""
# Runs on several ranks, on gloo: one node of 2 ranks (an Elastic task in one pod) and 2 nodes of 2 ranks each (a
# PyTorchJob: two worker pods meeting at the rendezvous).
RANKS_INPUTS = BENCHMARK_INPUTS.replace("  arm: [liger, baseline]", "  num_nodes: [1, 2]") + (
    '  backend: "plain_loop"\n  device: "cpu"\n  num_gpus: 2\n  parallelism: "ddp"\n'
)
# A memory frontier on 2 nodes of 2 ranks each (a PyTorchJob: rank 0's pod searches, every rank trains each probe).
FRONTIER_RANKS_INPUTS = FRONTIER_INPUTS.replace("synthetic_num_examples: 16", "synthetic_num_examples: 64").replace(
    '  backend: "plain_loop"\n',
    '  backend: "plain_loop"\n  device: "cpu"\n  num_gpus: 2\n  num_nodes: 2\n  parallelism: "ddp"\n',
)
# A software set of an older liger-kernel release (the h100 registration sweeps it).
OLDER_LIGER = "liger-kernel==0.8.2"
# name: (workflow file, workflow, inputs, registration environment, working directory: elsewhere or the project)
REGISTRATIONS = {
    "benchmark": ("benchmark", "benchmarking_experiment", EXECUTED_BENCHMARK_INPUTS, {}, "elsewhere"),
    "any_gpu": ("benchmark", "benchmarking_experiment", BENCHMARK_INPUTS, {"FINETUNE_BENCH_TRAIN_ACCELERATOR": ""}, ""),
    # with a sweep of software sets: registration builds the set's image beside the training image
    "h100": (
        "benchmark",
        "benchmarking_experiment",
        BENCHMARK_INPUTS.replace("experiment_args:\n", f"experiment_args:\n  software_set: ['', '{OLDER_LIGER}']\n"),
        {"FINETUNE_BENCH_TRAIN_ACCELERATOR": "nvidia-h100"},
        "",
    ),
    "wandb": ("benchmark", "benchmarking_experiment", BENCHMARK_INPUTS, {"WANDB_ENTITY": "team"}, "elsewhere"),
    "frontier": ("frontier", "memory_frontier", FRONTIER_INPUTS, {}, "elsewhere"),
    "frontier_defaults": ("frontier", "memory_frontier", None, {}, "elsewhere"),
    "kernels": ("kernels", "kernel_benchmark", KERNEL_INPUTS, {}, "elsewhere"),
    "ranks": ("benchmark", "benchmarking_experiment", RANKS_INPUTS, {}, "elsewhere"),
    "frontier_ranks": ("frontier", "memory_frontier", FRONTIER_RANKS_INPUTS, {}, "elsewhere"),
}


# The registrations executed whole, side by side.
EXECUTED = ("benchmark", "frontier", "kernels", "ranks", "frontier_ranks")
# The executions that serve slow tests alone, each with its test: executed (and registered) only when that test is
# selected, so `make test` executes the benchmark and the kernel benchmark alone. The frontier's (11 pods, about a
# minute and a half of both cores), the frontier's on several nodes, and the benchmark's on 2 ranks of one node and 2
# nodes of 2 ranks (3 pods of 2 training ranks each, about three minutes of both cores; the ranks' training itself is
# in `make test` through the same Elastic tasks, tests/running/test_ranks.py).
FRONTIER_TEST = "test_every_frontier_task_runs_in_its_pod"
FRONTIER_RANKS_TEST = "test_a_frontier_on_two_nodes_searches_in_rank_0_s_pod_and_trains_every_probe_on_all_ranks"
RANKS_TEST = "test_an_elastic_pod_and_a_pytorchjob_s_worker_pods_train_their_ranks_on_gloo"
SLOW_EXECUTIONS = {"frontier": FRONTIER_TEST, "frontier_ranks": FRONTIER_RANKS_TEST, "ranks": RANKS_TEST}


def _registration_env(home: Path, overrides: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FINETUNE_BENCH_", "WANDB_", "FLYTE"))}
    env.update(HOME=str(home), WANDB_API_KEY=WANDB_KEY, HF_TOKEN=HF_TOKEN, FINETUNE_BENCH_HF_TOKEN_SECRET="hf_token")
    return {**env, **overrides}


# `make test` registers the benchmark and the kernel benchmark alone, and executes them. Every other registration
# serves slow tests (each union CLI process is about 13 s of CPU, each execution minutes): registered when a selected
# test uses it, by a `registration` parameter or as listed here. In the default run
# test_no_template_carries_a_local_path_or_a_secret checks the two registrations' templates (the registration code,
# tasks/registration.py, is the same for every workflow); every workflow's, the frontier's included, is checked for
# local paths by tests/workflows/test_workflow.py::
# test_package_serializes_every_workflow_without_docker_and_without_a_local_path.
DEFAULT_REGISTRATIONS = ("benchmark", "kernels")
SLOW_TESTS_REGISTRATIONS = {
    **{test: (name,) for name, test in SLOW_EXECUTIONS.items()},
    "test_images_do_not_depend_on_the_working_directory_or_cache_files": ("any_gpu",),
    "test_w_and_b_asked_for_without_its_secret_stops_the_execution_at_planning": ("wandb",),
    "test_each_software_set_s_runs_go_to_the_image_registration_built_for_it": ("h100",),
}


def _registrations_needed(session: pytest.Session) -> list[str]:
    """DEFAULT_REGISTRATIONS and those the selected tests of this module use."""
    used = set(DEFAULT_REGISTRATIONS)
    for item in session.items:
        if item.module is None or item.module.__name__ != __name__:
            continue
        used.update(SLOW_TESTS_REGISTRATIONS.get(item.originalname, ()))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "registration" in callspec.params:
            used.add(callspec.params["registration"])
    return [name for name in REGISTRATIONS if name in used]


@pytest.fixture(scope="module")
def registered(tmp_path_factory, request) -> dict[str, Path]:
    """Every registration of REGISTRATIONS the selected tests use, side by side (each a fresh process running union's
    CLI)."""
    base = tmp_path_factory.mktemp("registered")
    store = tmp_path_factory.mktemp("store")  # the inputs' results store, a value a template may carry like a bucket
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    running = {}
    names = _registrations_needed(request.session)
    for name in names:
        module, workflow, inputs, overrides, cwd = REGISTRATIONS[name]
        args = ["--config", str(PROJECT_ROOT / "flyte-local.yaml"), "run", "--remote"]
        args += [str(PROJECT_ROOT / "workflows" / f"{module}.py"), workflow]
        if inputs is not None:  # else the workflow's embedded defaults
            (base / f"{name}.yaml").write_text(inputs.replace("{store}", str(store)))
            args += ["--inputs-file", str(base / f"{name}.yaml")]
        log = open(base / f"{name}.log", "w")  # noqa: SIM115 (closed below)
        home = base / f"home-{name}"
        home.mkdir()
        process = subprocess.Popen(
            [sys.executable, str(REGISTER), str(base / name), "--", *args],
            cwd=elsewhere if cwd == "elsewhere" else PROJECT_ROOT,
            env=_registration_env(home, overrides),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        running[name] = (process, log)
    for name, (process, log) in running.items():
        assert process.wait(timeout=600) == 0, (base / f"{name}.log").read_text()[-3000:]
        log.close()
    return {name: base / name for name in names}


def _cluster(registered: Path, tmp_path: Path) -> Cluster:
    return Cluster(registered, tmp_path / "cluster", secrets={"hf_token": "hf_inTHEcluster"})


def _python(literal: literals_pb2.Literal):
    scalar = literal.scalar
    if scalar.HasField("union"):  # an Optional output: its value
        scalar = scalar.union.value.scalar
    if scalar.HasField("primitive"):
        return getattr(scalar.primitive, scalar.primitive.WhichOneof("value"))
    return msgpack.loads(scalar.binary.value)


def _pod(cluster: Cluster, suffix: str):
    (pod,) = [p for p in cluster.pods if p.task.endswith(suffix)]
    return pod


def _read(path: Path, message):
    parsed = message()
    parsed.ParseFromString(path.read_bytes())
    return parsed


# --- the benchmark ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def executions(registered, tmp_path_factory, request) -> dict[str, tuple[Cluster, Future]]:
    """The registrations of EXECUTED executed side by side (each pod is a process; the threads only wait for them):
    name -> (its cluster, its outputs or its failure). Those of SLOW_EXECUTIONS only when their (slow) test is among
    the selected ones."""
    selected = {item.name for item in request.session.items}
    names = [name for name in EXECUTED if name not in SLOW_EXECUTIONS or SLOW_EXECUTIONS[name] in selected]
    clusters = {name: _cluster(registered[name], tmp_path_factory.mktemp(name)) for name in names}
    with ThreadPoolExecutor(len(clusters)) as pool:
        running = {name: (cluster, pool.submit(cluster.execute)) for name, cluster in clusters.items()}
        wait([future for _, future in running.values()])
    return running


@pytest.fixture(scope="module")
def benchmark_run(executions) -> tuple[Cluster, literals_pb2.LiteralMap]:
    cluster, outputs = executions["benchmark"]
    return cluster, outputs.result()


def test_every_benchmark_task_runs_in_its_pod_and_the_grid_trains_and_reports(benchmark_run):
    cluster, outputs = benchmark_run
    ran = [pod.task.rsplit(".", 1)[-1] for pod in cluster.pods]
    assert ran[:6] == [
        "plan_benchmark",
        "identify_sources",
        "download_dataset",
        "download_model",
        "check_training_data",
        "run_benchmark",
    ]
    assert sum(task.startswith("map_train_condition") for task in ran) == 2  # the two runs, one pod each
    assert ran[-2:] == ["analyze_results", "require_nothing_lost"]
    assert all(pod.outputs is not None or pod.futures is not None for pod in cluster.pods)
    # the map items trained: each result says ok
    items = [pod for pod in cluster.pods if "map_train_condition" in pod.task]
    statuses = [_python(pod.outputs.literals["o0"])["result"]["status"] for pod in items]
    assert statuses == ["ok", "ok"], statuses
    # the report was rendered by the analysis pod, without torch, and says what a cluster run does not keep
    analysis = _pod(cluster, "analyze_results")
    assert analysis.image.split(":")[0].endswith("finetune-bench-analysis")
    # each pod imports what its image's package list installs: the analysis image leaves the training stack out
    blocked = set(analysis.env["POD_BLOCKED_MODULES"].split())
    assert {name.replace("-", "_") for name in TRAINING_ONLY} - {"bitsandbytes"} <= blocked
    assert not set(_pod(cluster, "run_benchmark").env["POD_BLOCKED_MODULES"].split()) & {"torch", "liger_kernel", "uv"}
    # and runs with its image's ENV (the lockfile's digest, the image's own id)
    assert len(analysis.env["FINETUNE_BENCH_LOCK_SHA256"]) == 64 and analysis.env["_F_IMG_ID"] == analysis.image
    assert len({pod.env["HOSTNAME"] for pod in cluster.pods}) == len(cluster.pods)  # each pod its own host
    report = Path(outputs.literals["o2"].scalar.blob.uri).read_text()
    assert "2 runs of 2 conditions: 2 ok" in report
    assert "results_store is empty" not in report  # kept in the store the inputs name
    plan = _pod(cluster, "plan_benchmark").log
    assert "the plan:" in plan and "note: results_store is empty" not in plan
    assert "target GPU: A100 (40.0 GiB" in plan  # registered without an accelerator: the train tasks' A100


def test_two_identify_sources_pods_give_the_same_cache_keys(benchmark_run, tmp_path):
    cluster, _ = benchmark_run
    first = _pod(cluster, "identify_sources")
    again = cluster.run_pod(
        cluster.tasks[first.task], _read(first.directory / "io" / "inputs.pb", literals_pb2.LiteralMap)
    )
    assert again.directory != first.directory
    keys = [_python(pod.outputs.literals["o0"]) for pod in (first, again)]
    assert keys[0] == keys[1] and "#missing" not in json.dumps(keys[0])


def _dynamic_inputs(cluster: Cluster, **changes) -> literals_pb2.LiteralMap:
    """The benchmark's dynamic node's inputs, with `changes` made to its run settings (`execution`)."""
    inputs = _read(_pod(cluster, "run_benchmark").directory / "io" / "inputs.pb", literals_pb2.LiteralMap)
    binary = inputs.literals["execution"].scalar.binary
    binary.value = msgpack.dumps({**msgpack.loads(binary.value), **changes})
    return inputs


def _futures_of(registration: Path, inputs: literals_pb2.LiteralMap, tmp_path: Path):
    cluster = _cluster(registration, tmp_path)
    template = cluster.tasks["workflows.benchmark.run_benchmark"]
    return cluster, template, cluster.run_pod(template, inputs).futures


def _train_accelerators(futures) -> set[str]:
    """The GPU each array node's train task asks for: the node's override, else the task's own."""
    tasks = {t.id.name: t for t in futures.tasks}
    devices = set()
    for node in futures.nodes:
        if node.HasField("array_node"):
            sub = node.array_node.node.task_node
            override = sub.overrides.extended_resources.gpu_accelerator.device
            devices.add(override or tasks[sub.reference_id.name].extended_resources.gpu_accelerator.device)
    return devices


@pytest.mark.parametrize(
    ("registration", "accelerator", "expected"),
    [
        ("benchmark", "", "nvidia-tesla-a100"),
        # slow (a registration of its own each)
        pytest.param("any_gpu", "", "", marks=pytest.mark.slow),
        pytest.param("h100", "", "nvidia-h100", marks=pytest.mark.slow),
        # slow (a pod of its own): an inputs file's accelerator overriding the registered one is checked on the
        # compiled dynamic node by tests/workflows/test_multi_gpu_serialization.py::
        # test_an_inputs_file_s_accelerator_overrides_every_layout_s_train_tasks
        pytest.param("benchmark", "L4", "nvidia-l4", marks=pytest.mark.slow),
    ],
    ids=["unset", "empty-any-gpu", "registered-h100", "inputs-override"],
)
def test_the_dynamic_node_maps_registered_images_accelerator_and_settings(
    registered, benchmark_run, tmp_path, registration, accelerator, expected
):
    if (registration, accelerator) == ("benchmark", ""):  # what the benchmark's own dynamic node did
        pod = _pod(benchmark_run[0], "run_benchmark")
        template, futures = benchmark_run[0].tasks[pod.task], pod.futures
    else:
        inputs = _dynamic_inputs(benchmark_run[0], accelerator=accelerator)
        _, template, futures = _futures_of(registered[registration], inputs, tmp_path)
    info = json.loads((registered[registration] / "registered.json").read_text())
    images = {image["image"] for image in info["images"].values()}
    assert futures.tasks and {t.container.image for t in futures.tasks} <= images
    registered_env = {e.key: e.value for e in template.container.env if e.key != SERIALIZED_CONTEXT_ENV_VAR}
    for task in futures.tasks:
        assert {e.key: e.value for e in task.container.env} == registered_env, task.id.name
    assert _train_accelerators(futures) == {expected}
    if registration == "any_gpu":
        assert registered_env["FINETUNE_BENCH_TRAIN_ACCELERATOR"] == ""


def test_the_registered_dynamic_nodes_request_their_resources(registered):
    from flyteidl.admin import task_pb2
    from flyteidl.core import tasks_pb2

    from tasks.registration import DYNAMIC_NODE_RESOURCES

    for registration, name in (
        ("benchmark", "workflows.benchmark.run_benchmark"),
        ("kernels", "workflows.kernels.run_kernels"),
    ):
        template = _read(registered[registration] / "entities" / "tasks" / f"{name}.pb", task_pb2.TaskSpec).template
        requests = {r.name: r.value for r in template.container.resources.requests}
        expected = {
            tasks_pb2.Resources.CPU: DYNAMIC_NODE_RESOURCES.cpu,
            tasks_pb2.Resources.MEMORY: DYNAMIC_NODE_RESOURCES.mem,
        }
        assert requests == expected, name


@pytest.mark.slow
def test_images_do_not_depend_on_the_working_directory_or_cache_files(registered):
    infos = [json.loads((registered[name] / "registered.json").read_text()) for name in ("benchmark", "any_gpu")]
    names = [{k: (v["id"], v["image"]) for k, v in info["images"].items()} for info in infos]
    assert names[0] == names[1]  # registered from another directory and from the project root
    context = Path(infos[0]["images"]["finetune-bench-train"]["context"])
    root = context / "root"  # what union's builder copies into the image
    copied = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert {"requirements.lock", "pyproject.toml", "tasks/train_ranks.py", "finetune_bench/running/worker.py"} <= copied
    assert not [p for p in copied if "__pycache__" in p or p.startswith(("tests/", "docs/", ".venv/"))]
    built = json.loads((context / "spec.json").read_text())
    assert "bitsandbytes==0.49.2" in built["python_packages"]  # the switchback arm
    assert built["commands"] == ["uv pip install --no-deps /root"]


def _everything_registered(registration: Path) -> list[bytes]:
    blobs = [path.read_bytes() for path in (registration / "entities").rglob("*.pb")]
    for path in (registration / "entities").rglob("*.pb"):
        text = path.read_bytes().decode("latin-1")
        if SERIALIZED_CONTEXT_ENV_VAR in text:
            from flyteidl.admin import task_pb2

            template = _read(path, task_pb2.TaskSpec).template
            env = {e.key: e.value for e in template.container.env}
            blobs.append(SerializationSettings.from_transport(env[SERIALIZED_CONTEXT_ENV_VAR]).to_json().encode())
    return blobs


def test_no_template_carries_a_local_path_or_a_secret(registered, benchmark_run):
    cluster, _ = benchmark_run
    futures = [pod.directory / "io" / "out" / "futures.pb" for pod in cluster.pods if pod.futures is not None]
    blobs = [path.read_bytes() for path in futures]
    for registration in registered.values():
        blobs += _everything_registered(registration)
    # the bundles' locations stand for bucket URLs here: the one path a template carries
    for registration in registered.values():
        blobs = [b.replace(str(registration / "blobs").encode(), b"s3://bucket") for b in blobs]
    base = next(iter(registered.values())).parent
    for forbidden in (str(PROJECT_ROOT), str(base), WANDB_KEY, HF_TOKEN):
        assert not [b for b in blobs if forbidden.encode() in b], f"{forbidden!r} in a registered template"
    assert len(blobs) > 10 and any(SERIALIZED_CONTEXT_ENV_VAR.encode() in b for b in blobs)


@pytest.mark.parametrize(
    ("registration", "tasks", "report"),
    [
        ("benchmark", ["plan_benchmark", "report_plan"], "o2"),
        # slow: the frontier's dry run is checked through `pyflyte run` by tests/workflows/test_dry_run.py::
        # test_a_frontier_dry_run_predicts_each_search, and a dry run's pods by the benchmark's case above
        pytest.param("frontier_defaults", ["plan_frontier", "report_frontier_plan"], "report", marks=pytest.mark.slow),
    ],
)
def test_a_dry_run_plans_a_liger_arm_on_the_cluster(registered, tmp_path, registration, tasks, report):
    cluster = _cluster(registered[registration], tmp_path)
    inputs = _read(registered[registration] / "inputs.pb", literals_pb2.LiteralMap)
    inputs.literals["dry_run"].CopyFrom(
        literals_pb2.Literal(scalar=literals_pb2.Scalar(primitive=literals_pb2.Primitive(boolean=True)))
    )
    outputs = cluster.execute(inputs)
    assert [pod.task.rsplit(".", 1)[-1] for pod in cluster.pods] == tasks
    assert "liger" in Path(outputs.literals[report].scalar.blob.uri).read_text()


@pytest.mark.slow
def test_w_and_b_asked_for_without_its_secret_stops_the_execution_at_planning(registered, tmp_path):
    cluster = _cluster(registered["wandb"], tmp_path)  # the cluster has no wandb_api_key secret
    with pytest.raises(PodFailed) as failed:
        cluster.execute()
    assert [pod.task.rsplit(".", 1)[-1] for pod in cluster.pods] == ["plan_benchmark"]
    assert "WANDB_ENTITY is 'team' but the task could not read the secret 'wandb_api_key'" in str(failed.value)
    requested = [s.key for s in cluster.tasks["tasks.plan.plan_benchmark"].security_context.secrets]
    assert "wandb_api_key" in requested


# --- the memory frontier and the kernel benchmark -----------------------------------------------------------------


# Slow (the frontier's execution, only run for this test): the frontier workflow end to end is checked through
# `pyflyte run` by tests/frontier/test_frontier.py::
# test_workflow_finds_the_baseline_frontiers_and_measures_throughput_there, what its pods import by
# tests/images/test_image_build.py, and the pods' own machinery (fast registration, dynamic and array nodes, the
# analysis image) by the benchmark's and the kernel benchmark's executions here.
@pytest.mark.slow
def test_every_frontier_task_runs_in_its_pod(executions):
    cluster, outputs = executions["frontier"]
    outputs = outputs.result()
    ran = {pod.task.rsplit(".", 1)[-1] for pod in cluster.pods}
    assert {"plan_frontier", "run_searches", "plan_frontier_throughput", "run_benchmark", "report_frontier"} <= ran
    assert any(task.startswith("map_search_memory_frontier") for task in ran)
    assert len(outputs.literals) == 4


@pytest.mark.slow
def test_a_frontier_on_two_nodes_searches_in_rank_0_s_pod_and_trains_every_probe_on_all_ranks(executions):
    """The search task of 2 nodes × 2 ranks is a PyTorchJob: two worker pods meet at the rendezvous, rank 0's pod runs
    the search and returns its result, every probe trains on the 4 ranks of both pods."""
    cluster, outputs = executions["frontier_ranks"]
    outputs = outputs.result()
    searching = [pod for pod in cluster.pods if "search_memory_frontier_2x2gpu" in pod.task]
    assert len(searching) == 2 and [pod.env.get("PET_NNODES") for pod in searching] == ["2", "2"]
    (rank0,) = [pod for pod in searching if pod.outputs is not None]
    result = _python(rank0.outputs.literals["o0"])
    assert result["status"] == "reached_cap" and result["frontier"] == 1, result["reason"]
    assert [probe["status"] for probe in result["probes"]] == ["ok", "ok"]  # the probe and its confirmation
    assert result["device_seconds"] == pytest.approx(4 * sum(probe["wall_time_s"] for probe in result["probes"]))
    assert len(outputs.literals) == 4


def test_every_kernel_benchmark_task_runs_in_its_pod(executions):
    cluster, outputs = executions["kernels"]
    outputs.result()
    ran = [pod.task.rsplit(".", 1)[-1] for pod in cluster.pods]
    assert ran[0] == "plan_kernels" and ran[1] == "run_kernels" and ran[-1] == "report_kernels"
    (item,) = [pod for pod in cluster.pods if "map_benchmark_kernel" in pod.task]
    rows = Path(item.outputs.literals["o0"].scalar.blob.uri).read_text()
    assert "rms_norm" in rows and ",ok," in rows


@pytest.mark.slow
def test_each_software_set_s_runs_go_to_the_image_registration_built_for_it(registered, benchmark_run, tmp_path):
    """Registered with an inputs file that sweeps a software set, the set has an image of its own (the training
    image's packages, the set's pin in place of the lockfile's), and the dynamic node maps the set's runs onto it and
    the installed set's onto the training image."""
    from finetune_bench.inputs.software_sets import parse
    from images.images import software_set_image

    info = json.loads((registered["h100"] / "registered.json").read_text())
    spec = software_set_image(parse(OLDER_LIGER))
    image = info["images"][spec.name]
    assert image["id"] == spec.id
    packages = json.loads((Path(image["context"]) / "spec.json").read_text())["python_packages"]
    assert "liger-kernel==0.8.2" in packages and not [p for p in packages if p.startswith("liger-kernel==0.8.5")]
    # the dynamic node's runs: half of them the older set's
    inputs = _dynamic_inputs(benchmark_run[0])
    planned = inputs.literals["planned"].collection.literals
    for literal in planned[: len(planned) // 2]:
        run = msgpack.loads(literal.scalar.binary.value)
        run["training_args"]["software_set"] = OLDER_LIGER
        literal.scalar.binary.value = msgpack.dumps(run)
    _, template, futures = _futures_of(registered["h100"], inputs, tmp_path)
    mapped = [node.array_node.node.task_node for node in futures.nodes if node.HasField("array_node")]
    overrides = [task_node.overrides.container_image for task_node in mapped]
    assert sorted(overrides) == sorted(["", image["image"]])  # the installed set's: the train task's own image


_QUANTITY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def _bytes(quantity: str) -> float:
    """A Kubernetes memory quantity ("1Gi", "500M", "1024") in bytes."""
    for unit, factor in _QUANTITY_UNITS.items():
        if quantity.endswith(unit):
            return float(quantity.removesuffix(unit)) * factor
    return float(quantity)


def test_every_pod_peaks_within_the_memory_its_task_requests(benchmark_run):
    """Each pod's peak resident memory (the pod's process and every process it waited for: a training child, the fork
    server) against its template's memory request: a pod past it is killed on a cluster whose limits are the
    requests."""
    from flyteidl.core import tasks_pb2

    cluster, _ = benchmark_run
    measured = []
    for pod in cluster.pods:
        template = cluster.tasks[pod.task]
        requests = {r.name: r.value for r in template.container.resources.requests}
        measured.append((pod.task, pod.peak_rss_bytes / 2**20, requests.get(tasks_pb2.Resources.MEMORY, "")))
    said = "\n".join(f"{task}: peak {peak:.0f} MiB, requests {ask or 'nothing'}" for task, peak, ask in measured)
    assert all(request for _, _, request in measured), said
    assert all(0 < peak * 2**20 <= _bytes(request) for _, peak, request in measured), said
    print(said)


@pytest.fixture(scope="module")
def second_benchmark_run(benchmark_run) -> tuple[list, literals_pb2.LiteralMap]:
    """The benchmark executed again on the same cluster (its cache, its bucket): the pods of the second execution and
    its outputs."""
    cluster, _ = benchmark_run
    first = len(cluster.pods)
    outputs = cluster.execute()
    return cluster.pods[first:], outputs


@pytest.mark.slow
def test_a_second_execution_hits_the_download_cache_and_reuses_the_stored_runs(benchmark_run, second_benchmark_run):
    cluster, _ = benchmark_run
    pods, outputs = second_benchmark_run
    ran = [pod.task.rsplit(".", 1)[-1] for pod in pods]
    # the same sources: the same cache keys, so the downloads come from the cache, no pod of theirs runs
    assert cluster.cache_hits == ["tasks.data.download_dataset", "tasks.data.download_model"]
    assert "identify_sources" in ran and not [task for task in ran if task.startswith("download_")]
    # the same runs, sources and software: each train pod finds its run in the store and measures nothing
    items = [pod for pod in pods if "map_train_condition" in pod.task]
    results = [_python(pod.outputs.literals["o0"])["result"] for pod in items]
    assert [(r["status"], r["reused"]) for r in results] == [("ok", True), ("ok", True)]
    report = Path(outputs.literals["o2"].scalar.blob.uri).read_text()
    assert "2 of 2 runs reused from the results store" in report and "by an earlier execution" in report


@pytest.mark.slow
def test_an_elastic_pod_and_a_pytorchjob_s_worker_pods_train_their_ranks_on_gloo(executions):
    """A run on one node of 2 ranks trains in one pod (PyTorch Elastic launching both ranks there); a run on 2 nodes
    is a PyTorchJob: two worker pods, with the operator's variables, whose 4 ranks meet at the rendezvous, and whose
    result rank 0's pod writes."""
    cluster, outputs = executions["ranks"]
    outputs.result()
    one_node = [pod for pod in cluster.pods if "train_condition_1x2gpu" in pod.task]
    two_nodes = [pod for pod in cluster.pods if "train_condition_2x2gpu" in pod.task]
    assert len(one_node) == 1 and len(two_nodes) == 2
    assert [pod.env.get("PET_NNODES") for pod in two_nodes] == ["2", "2"]
    assert len({pod.env["PET_RDZV_ENDPOINT"] for pod in two_nodes}) == 1
    (job_result,) = [pod for pod in two_nodes if pod.outputs is not None]
    for pod, world_size in ((one_node[0], 2), (job_result, 4)):
        result = _python(pod.outputs.literals["o0"])["result"]
        assert result["status"] == "ok", result["reason"]
        assert result["metrics"]["world_size"] == world_size
        assert sorted(rank["rank"] for rank in result["ranks"]) == list(range(world_size))
    # the job's ranks came from both worker pods (nodes 0 and 1)
    assert {rank["node_rank"] for rank in _python(job_result.outputs.literals["o0"])["result"]["ranks"]} == {0, 1}
