"""The cluster path of runs on several GPUs, as far as it can be checked without a cluster: each layout's train task
serializes to what Flyte's PyTorch plugin runs (one node: an ordinary pod with its GPUs; several: a PyTorchJob with
the right replicas and processes per node), and the benchmark's dynamic node maps each layout's runs over its
own task."""

import re
from collections import OrderedDict

import pytest
from flytekit.tools.translator import get_serializable

from finetune_bench.inputs.catalog import GPUS_PER_NODE, NODE_COUNTS
from finetune_bench.inputs.plan import plan_runs
from finetune_bench.inputs.settings import ExperimentArgs, TrainingArgs
from tasks.train import train_condition
from tasks.train_ranks import ELASTIC_TRAIN_TASKS, elastic_task_name
from tests.workflows.compiled import SETTINGS, compile_benchmark_dynamic


def _template(task):
    return get_serializable(OrderedDict(), SETTINGS, task).template


def test_every_layout_but_one_gpu_has_a_module_level_elastic_task():
    import tasks.train_ranks

    layouts = {(n, g) for n in NODE_COUNTS for g in GPUS_PER_NODE} - {(1, 1)}
    assert set(ELASTIC_TRAIN_TASKS) == layouts
    for (nodes, gpus), elastic in ELASTIC_TRAIN_TASKS.items():
        # how the container finds it: by module and name
        assert elastic.name == f"tasks.train_ranks.{elastic_task_name(nodes, gpus)}"
        assert getattr(tasks.train_ranks, elastic_task_name(nodes, gpus)) is elastic


def test_a_one_node_layout_is_an_ordinary_pod_with_its_gpus():
    template = _template(ELASTIC_TRAIN_TASKS[1, 4])
    assert template.type == "python-task"
    requests = {r.name: r.value for r in template.container.resources.requests}
    from flytekit.models.task import Resources

    assert requests[Resources.ResourceName.GPU] == "4"
    # one GPU's CPUs and memory times four (tasks.registration.train_resources)
    one_gpu = {r.name: r.value for r in _template(train_condition).container.resources.requests}
    assert int(requests[Resources.ResourceName.CPU]) == 4 * int(one_gpu[Resources.ResourceName.CPU])
    assert template.metadata.pod_template_name is None or template.metadata.pod_template_name == ""
    assert template.k8s_pod is None or not template.k8s_pod  # /dev/shm through shared_memory, not a pod template
    assert template.shared_memory if hasattr(template, "shared_memory") else True


@pytest.mark.parametrize(("nodes", "gpus"), [(2, 4), (4, 8), (2, 1)])
def test_a_multi_node_layout_is_a_pytorchjob(nodes, gpus):
    template = _template(ELASTIC_TRAIN_TASKS[nodes, gpus])
    assert template.type == "pytorch"
    custom = template.custom
    assert custom["workerReplicas"]["replicas"] == nodes
    elastic = custom["elasticConfig"]
    assert elastic["nprocPerNode"] == gpus
    assert (elastic["minReplicas"], elastic["maxReplicas"]) == (nodes, nodes)
    assert elastic["rdzvBackend"] == "c10d"
    requests = {r.name: r.value for r in template.container.resources.requests}
    from flytekit.models.task import Resources

    assert requests[Resources.ResourceName.GPU] == str(gpus)
    assert "runPolicy" not in custom  # no restarts, no deadline: a failure is the run's result


def _compile_dynamic(experiment: ExperimentArgs, accelerator: str = ""):
    planned = plan_runs(experiment, TrainingArgs(parallelism="ddp", backend="plain_loop"), 1)
    return compile_benchmark_dynamic(planned, accelerator=accelerator)


def test_the_dynamic_node_maps_each_layout_over_its_own_task_one_after_the_other():
    spec = _compile_dynamic(ExperimentArgs(arm=["liger", "baseline"], num_gpus=[1, 2], num_nodes=[1, 2]))
    arrays = [node for node in spec.nodes if node.array_node is not None]
    # a map task is named after the task it maps: <module>.map_<task>_<hash>-arraynode
    pattern = r"tasks\.train(?:_ranks)?\.map_(\w+?)_[0-9a-f]{32}-arraynode"
    names = {t.id.name: re.fullmatch(pattern, t.id.name) for t in spec.tasks}
    mapped = [names[node.array_node.node.task_node.reference_id.name].group(1) for node in arrays]
    assert mapped == ["train_condition", "train_condition_2x1gpu", "train_condition_1x2gpu", "train_condition_2x2gpu"]
    types = {t.id.name: t.type for t in spec.tasks}
    assert [types[node.array_node.node.task_node.reference_id.name] for node in arrays] == [
        "python-task",
        "pytorch",
        "python-task",
        "pytorch",
    ]
    for node in arrays:
        idl = node.array_node.to_flyte_idl()
        assert idl.parallelism == 2 and idl.min_success_ratio == pytest.approx(0.5)
        assert node.array_node.node.task_node.overrides.extended_resources is None  # none named: the tasks' own
    # each layout waits for the one before it (the grid's concurrency holds over all of them)
    for before, after in zip(arrays, arrays[1:], strict=False):
        assert before.id in after.upstream_node_ids
    (concatenate,) = [n for n in spec.nodes if n.task_node is not None]
    assert concatenate.task_node.reference_id.name == "tasks.train.concatenate_outputs"
    # the tasks' own accelerator: the default A100, and /dev/shm for the ranks' data loaders
    accelerators = {t.id.name: t.extended_resources.gpu_accelerator.device for t in spec.tasks if t.extended_resources}
    assert set(accelerators.values()) == {"nvidia-tesla-a100"}
    multi = [t for t in spec.tasks if "gpu_" in t.id.name]
    assert multi and all(t.extended_resources.shared_memory.mount_path == "/dev/shm" for t in multi)


def test_an_inputs_file_s_accelerator_overrides_every_layout_s_train_tasks():
    spec = _compile_dynamic(ExperimentArgs(num_gpus=[1, 2]), accelerator="H100")
    arrays = [node for node in spec.nodes if node.array_node is not None]
    assert len(arrays) == 2
    devices = [n.array_node.node.task_node.overrides.extended_resources.gpu_accelerator.device for n in arrays]
    assert devices == ["nvidia-h100", "nvidia-h100"]
