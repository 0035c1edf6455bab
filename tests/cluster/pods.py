"""A workflow run as a cluster runs it, on this machine: what `tests/cluster/register.py` wrote (the serialized
entities, the fast-registration bundle, each image's build context and the execution's inputs) is executed node by
node, each task in a fresh pod-like directory through the container command flytekit serialized for it
(`pyflyte-fast-execute` ... `pyflyte-execute` / `pyflyte-map-execute`), with only what its image copies to /root,
another HOME and working directory, and the template's environment. Data passes between pods as Flyte's does: each
pod reads an `inputs.pb` and writes `outputs.pb` (or a dynamic node's `futures.pb`, or `error.pb`), offloaded data
goes to a shared "bucket" directory.

What it stands in for is propeller's part: binding resolution (promises, attribute paths into dataclasses), branch
nodes, sub-workflows, dynamic nodes' specs and array nodes (one pod per item, the index in the environment, the
outputs gathered into lists, a failed item None where `min_success_ratio` allows).
"""

import hashlib
import importlib.metadata
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
from flyteidl.admin import task_pb2 as admin_task_pb2
from flyteidl.admin import workflow_pb2 as admin_workflow_pb2
from flyteidl.core import dynamic_job_pb2, errors_pb2, literals_pb2, tasks_pb2
from google.protobuf import json_format
from packaging.utils import canonicalize_name

START = "start-node"
# The task type of a multi-node PyTorch Elastic task: a PyTorchJob the Kubeflow training operator runs.
PYTORCH_JOB = "pytorch"
# The project as a distribution: its image installs it from /root.
PROJECT_DISTRIBUTION = "finetune-bench"
# The modules a pod's Python must not find: the project's checkout (installed in editable mode here; a real image
# has the package installed from /root), and, for the analysis image, the training stack it leaves out.
SITECUSTOMIZE = """
import importlib.abc, os, sys
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("__editable__")]
blocked = set(os.environ.get("POD_BLOCKED_MODULES", "").split())
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (not in this pod's image)", name=name)
if blocked:
    sys.meta_path.insert(0, Blocked())
"""


class PodFailed(AssertionError):
    """A pod wrote an error document or exited non-zero."""


@dataclass
class Pod:
    """One task execution: where it ran and what it wrote."""

    task: str
    directory: Path
    image: str
    args: list[str]
    env: dict[str, str]
    returncode: int
    log: str
    outputs: literals_pb2.LiteralMap | None = None
    futures: dynamic_job_pb2.DynamicJobSpec | None = None
    error: str | None = None
    # The most resident memory the pod's process, or any process it waited for (its training child, a fork
    # server), held at once: what its memory request must cover.
    peak_rss_bytes: int = 0


@dataclass
class Cluster:
    """What registration wrote (`registered`: register.py's output folder), executed under `workdir`."""

    registered: Path
    workdir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    # The cluster's secrets (key -> value), handed to a pod whose template requests them, as Flyte does.
    secrets: dict[str, str] = field(default_factory=dict)
    pods: list[Pod] = field(default_factory=list)
    timeout_s: int = 900
    # Flyte's cache: a cached task's outputs by its name, cache version and inputs, kept across this cluster's
    # executions; the tasks each execution found there, in order.
    cache_hits: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tasks = {
            path.stem: _parse(admin_task_pb2.TaskSpec, path).template
            for path in (self.registered / "entities" / "tasks").glob("*.pb")
        }
        self.workflows = {
            path.stem: _parse(admin_workflow_pb2.WorkflowSpec, path)
            for path in (self.registered / "entities" / "workflows").glob("*.pb")
        }
        self.info = json.loads((self.registered / "registered.json").read_text())
        # each image as union's builder would make it: its /root, its ENV, and the modules this machine has that its
        # package list does not install (a pod cannot import them)
        built = {image["image"]: Path(image["context"]) for image in self.info["images"].values()}
        self.images = {name: context / "root" for name, context in built.items()}
        specs = {name: json.loads((context / "spec.json").read_text()) for name, context in built.items()}
        self.image_env = {name: spec.get("env", {}) for name, spec in specs.items()}
        self.blocked = {name: _not_installed(specs[name]["python_packages"], self.images[name]) for name in built}
        self.bucket = self.workdir / "bucket"
        self.bucket.mkdir(parents=True, exist_ok=True)
        self.site = self.workdir / "site"
        self.site.mkdir(exist_ok=True)
        (self.site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self._count = itertools.count()

    # --- the workflow ------------------------------------------------------------------------------------------

    def execute(self, inputs: literals_pb2.LiteralMap | None = None) -> literals_pb2.LiteralMap:
        """The registered workflow on the registered inputs (or `inputs`); its outputs."""
        if inputs is None:
            inputs = _parse(literals_pb2.LiteralMap, self.registered / "inputs.pb")
        spec = self.workflows[self.info["workflow"]]
        return self._workflow(spec.template, {sub.id.name: sub for sub in spec.sub_workflows}, inputs)

    def _workflow(self, template, subworkflows: dict, inputs: literals_pb2.LiteralMap) -> literals_pb2.LiteralMap:
        done = {START: dict(inputs.literals)}
        self._nodes(list(template.nodes), subworkflows, done)
        return literals_pb2.LiteralMap(literals={b.var: self._resolve(b.binding, done) for b in template.outputs})

    def _nodes(self, nodes: list, subworkflows: dict, done: dict) -> None:
        pending = [n for n in nodes if n.id not in (START, "end-node")]
        while pending:
            ready = [n for n in pending if all(dep in done for dep in _dependencies(n))]
            if not ready:
                raise AssertionError(f"nodes waiting on nothing that can run: {[n.id for n in pending]}")
            for node in ready:
                done[node.id] = self._node(node, subworkflows, done)
                pending.remove(node)

    def _node(self, node, subworkflows: dict, done: dict) -> dict:
        inputs = literals_pb2.LiteralMap(literals={b.var: self._resolve(b.binding, done) for b in node.inputs})
        target = node.WhichOneof("target")
        if target == "task_node":
            return self._task(self.tasks[node.task_node.reference_id.name], inputs, node, subworkflows)
        if target == "workflow_node":
            name = node.workflow_node.sub_workflow_ref.name
            template = subworkflows[name] if name in subworkflows else self.workflows[name].template
            return dict(self._workflow(template, subworkflows, inputs).literals)
        if target == "branch_node":
            return self._node(_chosen(node.branch_node.if_else, done), subworkflows, done)
        if target == "array_node":
            return self._array(node, inputs, subworkflows)
        raise NotImplementedError(f"node {node.id}: {target}")

    def _task(self, template, inputs, node, subworkflows: dict) -> dict:
        cached = self.workdir / "cache" / _cache_key(template, inputs) if template.metadata.discoverable else None
        if cached is not None and cached.exists():  # as propeller does: the outputs, no pod
            self.cache_hits.append(template.id.name)
            return dict(_parse(literals_pb2.LiteralMap, cached).literals)
        pod = self.run_pod(template, inputs)
        if cached is not None and pod.outputs is not None:
            cached.parent.mkdir(exist_ok=True)
            cached.write_bytes(pod.outputs.SerializeToString())
        if pod.futures is None:
            return dict(pod.outputs.literals)
        # a dynamic node: its spec's nodes run as a workflow's, their tasks and sub-workflows known to them alone
        futures = pod.futures
        tasks = {t.id.name: t for t in futures.tasks}
        self.tasks.update(tasks)
        subs = {**subworkflows, **{w.id.name: w for w in futures.subworkflows}}
        done = {START: {}}
        self._nodes(list(futures.nodes), subs, done)
        return {b.var: self._resolve(b.binding, done) for b in futures.outputs}

    def _array(self, node, inputs: literals_pb2.LiteralMap, subworkflows: dict) -> dict:
        array = node.array_node
        template = self.tasks[array.node.task_node.reference_id.name]
        bound = set(array.bound_inputs)
        mapped = [name for name, lit in inputs.literals.items() if name not in bound and lit.HasField("collection")]
        size = len(inputs.literals[mapped[0]].collection.literals)
        outputs, failures = [], 0
        for index in range(size):
            # every item's pod gets the whole lists and its index (flytekit picks its element)
            item = inputs
            try:
                run = self.run_job if template.type == PYTORCH_JOB else self.run_pod
                outputs.append(dict(run(template, item, index=index).outputs.literals))
            except PodFailed:
                failures += 1
                outputs.append(None)
        if size and (size - failures) / size < array.min_success_ratio:
            raise PodFailed(f"{failures} of {size} items of {template.id.name} failed")
        none = literals_pb2.Literal(scalar=literals_pb2.Scalar(none_type=literals_pb2.Void()))
        return {
            name: literals_pb2.Literal(
                collection=literals_pb2.LiteralCollection(literals=[o[name] if o else none for o in outputs])
            )
            for name in _output_names(template)
        }

    # --- a PyTorchJob ------------------------------------------------------------------------------------------

    def run_job(self, template, inputs: literals_pb2.LiteralMap, index: int | None = None) -> Pod:
        """A multi-node PyTorch Elastic task as the Kubeflow training operator runs it: one worker pod per replica, side
        by side, each with the variables the operator gives an elastic PyTorchJob's workers (`PET_NNODES`,
        `PET_NPROC_PER_NODE`, `PET_RDZV_ENDPOINT`: the first worker's service, here a port of this machine, and
        `PET_RDZV_BACKEND`), meeting at the rendezvous; the job's outputs are the one worker's that wrote them
        (global rank 0's; PyTorch Elastic's other workers write none)."""
        job = json_format.MessageToDict(template.custom)
        replicas = int(job["workerReplicas"]["replicas"])
        elastic = job.get("elasticConfig", {})
        with socket.socket() as probe:  # a free port for the rendezvous
            probe.bind(("localhost", 0))
            port = probe.getsockname()[1]
        env = {
            "PET_NNODES": str(replicas),
            "PET_NPROC_PER_NODE": str(elastic.get("nprocPerNode", 1)),
            "PET_RDZV_ENDPOINT": f"localhost:{port}",
            "PET_RDZV_BACKEND": elastic.get("rdzvBackend", "c10d"),
        }
        with ThreadPoolExecutor(replicas) as pool:
            running = [
                pool.submit(self.run_pod, template, inputs, index, {**env, "HOSTNAME": f"job-worker-{replica}"}, True)
                for replica in range(replicas)
            ]
            workers = [future.result() for future in running]
        wrote = [pod for pod in workers if pod.outputs is not None]
        if len(wrote) != 1:
            raise PodFailed(f"{template.id.name}: {len(wrote)} of {replicas} workers wrote outputs, one should")
        return wrote[0]

    # --- one pod -----------------------------------------------------------------------------------------------

    def run_pod(
        self,
        template,
        inputs: literals_pb2.LiteralMap,
        index: int | None = None,
        extra_env: dict[str, str] | None = None,
        outputs_optional: bool = False,
    ) -> Pod:
        """`template`'s container command in a fresh pod directory (`extra_env`: what the pod's controller adds, a
        PyTorchJob's worker variables); raises PodFailed on an error document, or when it wrote no outputs unless
        `outputs_optional` (a worker of a PyTorchJob but rank 0's)."""
        number = next(self._count)
        directory = self.workdir / "pods" / f"{number:03d}-{template.id.name.rsplit('.', 1)[-1][:60]}"
        root, home, io = directory / "root", directory / "home", directory / "io"
        image = template.container.image
        shutil.copytree(self.images[image], root)
        for folder in (home, io, directory / "tmp"):
            folder.mkdir(parents=True, exist_ok=True)
        (io / "inputs.pb").write_bytes(inputs.SerializeToString())
        substitutions = {
            "{{.input}}": str(io / "inputs.pb"),
            "{{.outputPrefix}}": str(io / "out"),
            "{{.rawOutputDataPrefix}}": str(self.bucket / f"raw-{number:03d}"),
            "{{.checkpointOutputPrefix}}": str(io / "checkpoint"),
            "{{.prevCheckpointPrefix}}": '""',
        }
        args = [substitutions.get(arg, arg) for arg in template.container.args]
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(home),
            "TMPDIR": str(directory / "tmp"),
            "PYTHONPATH": str(self.site),
            "FLYTECTL_CONFIG": "",
            "FLYTE_INTERNAL_EXECUTION_ID": "emulated",
            "FLYTE_INTERNAL_EXECUTION_PROJECT": "p",
            "FLYTE_INTERNAL_EXECUTION_DOMAIN": "d",
            "FLYTE_INTERNAL_TASK_NAME": template.id.name,
            "FLYTE_ATTEMPT_NUMBER": "0",
            "HOSTNAME": f"pod-{number:03d}",  # the pod's name, as Kubernetes sets it
            "POD_BLOCKED_MODULES": " ".join(self.blocked[image]),
            **self.image_env[image],
            **{e.key: e.value for e in template.container.env},
            **self.extra_env,
            **(extra_env or {}),
        }
        for secret in template.security_context.secrets:
            if secret.key in self.secrets:
                env[f"_FSEC_{secret.key.upper()}"] = self.secrets[secret.key]
        if index is not None:
            env.update(BATCH_JOB_ARRAY_INDEX_VAR_NAME="FLYTE_K8S_ARRAY_INDEX", FLYTE_K8S_ARRAY_INDEX=str(index))
        with open(directory / "log.txt", "w+") as log:
            returncode, peak = _run_measured(args, root, env, log, self.timeout_s)
            log.seek(0)
            text = log.read()
        pod = Pod(template.id.name, directory, image, args, env, returncode, text, peak_rss_bytes=peak)
        self.pods.append(pod)
        out = io / "out"
        if (out / "error.pb").exists():
            pod.error = _parse(errors_pb2.ErrorDocument, out / "error.pb").error.message
        elif (out / "futures.pb").exists():
            pod.futures = _parse(dynamic_job_pb2.DynamicJobSpec, out / "futures.pb")
        elif (out / "outputs.pb").exists():
            pod.outputs = _parse(literals_pb2.LiteralMap, out / "outputs.pb")
        elif not outputs_optional:
            pod.error = f"no outputs (exit {returncode})"
        if pod.error is not None or returncode != 0:
            raise PodFailed(f"{template.id.name} in {directory}: {pod.error}\n{text[-3000:]}")
        return pod

    # --- bindings ----------------------------------------------------------------------------------------------

    def _resolve(self, binding, done: dict) -> literals_pb2.Literal:
        kind = binding.WhichOneof("value")
        if kind == "scalar":
            return literals_pb2.Literal(scalar=binding.scalar)
        if kind == "collection":
            items = [self._resolve(b, done) for b in binding.collection.bindings]
            return literals_pb2.Literal(collection=literals_pb2.LiteralCollection(literals=items))
        if kind == "map":
            entries = {k: self._resolve(b, done) for k, b in binding.map.bindings.items()}
            return literals_pb2.Literal(map=literals_pb2.LiteralMap(literals=entries))
        if kind == "promise":
            literal = done[binding.promise.node_id or START][binding.promise.var]
            return _attribute(literal, list(binding.promise.attr_path))
        raise NotImplementedError(f"binding {kind}")


def _cache_key(template, inputs: literals_pb2.LiteralMap) -> str:
    """A cached task's key, as Flyte's: the task, its cache version and its inputs."""
    digest = hashlib.sha256(f"{template.id.name}\0{template.metadata.discovery_version}\0".encode())
    digest.update(inputs.SerializeToString(deterministic=True))
    return digest.hexdigest()


def _run_measured(args: list[str], cwd: Path, env: dict[str, str], log, timeout_s: float) -> tuple[int, int]:
    """Run a pod's command; its exit status and its peak resident memory in bytes (the kernel's account of the
    process and every descendant it waited for, `wait4`), killed after `timeout_s`."""
    process = subprocess.Popen(args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    timer = threading.Timer(timeout_s, process.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        timer.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss * 1024  # kilobytes on Linux


def _not_installed(packages: list[str], root: Path) -> list[str]:
    """The top-level modules this machine can import that an image with `packages` (its builder's package list) and
    `root` (its /root) does not have: each of an installed distribution the list does not name, unless /root holds it
    (the project's own packages) or the image's Python brings it (pip, setuptools)."""
    listed = {canonicalize_name(re.split(r"[=<>!~ ;\[]", package, maxsplit=1)[0]) for package in packages}
    listed |= {"pip", "setuptools", "wheel", canonicalize_name(PROJECT_DISTRIBUTION)}
    return sorted(
        module
        for module, distributions in importlib.metadata.packages_distributions().items()
        if not {canonicalize_name(d) for d in distributions} & listed
        and not (root / module).exists()
        and not (root / f"{module}.py").exists()
    )


def _parse(message_type, path: Path):
    message = message_type()
    message.ParseFromString(Path(path).read_bytes())
    return message


def _output_names(template: tasks_pb2.TaskTemplate) -> list[str]:
    return list(template.interface.outputs.variables)


def _dependencies(node) -> set[str]:
    deps = set(node.upstream_node_ids)
    for binding in node.inputs:
        deps |= _binding_nodes(binding.binding)
    return {d or START for d in deps}


def _binding_nodes(binding) -> set[str]:
    kind = binding.WhichOneof("value")
    if kind == "promise":
        return {binding.promise.node_id}
    if kind == "collection":
        return set().union(*(_binding_nodes(b) for b in binding.collection.bindings))
    if kind == "map":
        return set().union(*(_binding_nodes(b) for b in binding.map.bindings.values()))
    return set()


def _attribute(literal: literals_pb2.Literal, path: list) -> literals_pb2.Literal:
    """A promise's attribute path resolved as propeller does: into a msgpack dataclass, the value re-encoded."""
    if not path:
        return literal
    if not (literal.HasField("scalar") and literal.scalar.HasField("binary")):
        raise NotImplementedError(f"attribute path {path} into {literal}")
    value = msgpack.loads(literal.scalar.binary.value)
    for step in path:
        value = value[step.string_value] if step.WhichOneof("value") == "string_value" else value[step.int_value]
    binary = literals_pb2.Binary(value=msgpack.dumps(value), tag="msgpack")
    return literals_pb2.Literal(scalar=literals_pb2.Scalar(binary=binary))


def _chosen(if_else, done: dict):
    """The node of the first case whose condition holds, else the else node."""
    for case in [if_else.case, *if_else.other]:
        if _holds(case.condition, done):
            return case.then_node
    if if_else.HasField("else_node"):
        return if_else.else_node
    raise PodFailed(f"no branch taken: {if_else.error.message}")


def _holds(condition, done: dict) -> bool:
    comparison = condition.comparison
    left, right = (_operand(o, done) for o in (comparison.left_value, comparison.right_value))
    if comparison.operator == 0:  # EQ
        return left == right
    if comparison.operator == 1:  # NEQ
        return left != right
    raise NotImplementedError(f"comparison operator {comparison.operator}")


def _operand(operand, done: dict):
    if operand.HasField("primitive"):
        primitive = operand.primitive
        return getattr(primitive, primitive.WhichOneof("value"))
    node, _, var = operand.var.partition(".")
    literal = done[node or START][var]
    if literal.scalar.HasField("primitive"):
        primitive = literal.scalar.primitive
        return getattr(primitive, primitive.WhichOneof("value"))
    return msgpack.loads(literal.scalar.binary.value)
