"""What the tasks are registered with, read from their serialized templates (as `union run --remote` registers them,
without its CLI: tests/cluster/test_cluster_path.py checks the same on the templates its CLI wrote)."""

from collections import OrderedDict

import pytest
from flytekit.models.task import Resources as ResourceModel
from flytekit.tools.translator import get_serializable

from tasks.registration import DYNAMIC_NODE_RESOURCES
from tests.workflows.compiled import SETTINGS

_NAMES = {ResourceModel.ResourceName.CPU: "cpu", ResourceModel.ResourceName.MEMORY: "memory"}


def _resources(entries) -> dict[str, str]:
    return {_NAMES.get(entry.name, str(entry.name)): entry.value for entry in entries}


def _dynamic_nodes():
    from workflows.benchmark import run_benchmark
    from workflows.frontier import run_searches
    from workflows.kernels import run_kernels

    return [run_benchmark, run_searches, run_kernels]


@pytest.mark.parametrize("index", range(3), ids=["run_benchmark", "run_searches", "run_kernels"])
def test_every_dynamic_node_requests_the_memory_its_pod_needs(index):
    template = get_serializable(OrderedDict(), SETTINGS, _dynamic_nodes()[index]).template
    requests = _resources(template.container.resources.requests)
    assert requests == {"cpu": DYNAMIC_NODE_RESOURCES.cpu, "memory": DYNAMIC_NODE_RESOURCES.mem}
    # no limits, as for every task of the project (Flyte gives them the requests' size)
    assert not template.container.resources.limits
    # the pods peak at up to 670 MB: a request in the platform's default range (a few hundred MB) would not do
    assert DYNAMIC_NODE_RESOURCES.mem.endswith("Gi") and int(DYNAMIC_NODE_RESOURCES.mem[:-2]) >= 1
