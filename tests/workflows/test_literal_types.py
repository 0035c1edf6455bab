"""Each dataclass's literal type is computed once per process (tasks.literal_types), and what is serialized is the
same as without that cache: every task and workflow of the three workflow files, byte for byte."""

import json
import os
import subprocess
import sys

from images.images import PROJECT_ROOT

SERIALIZE_ALL = """
import hashlib, json, sys
from flytekit.core.type_engine import DataclassTransformer
computed = []
compute = DataclassTransformer.get_literal_type
def counted(self, t):
    computed.append(t)
    return compute(self, t)
# flytekit's own, counted; "uncached": marked as cached, so that importing the tasks leaves it as it is
counted.cached_per_class = sys.argv[1] == "uncached"
DataclassTransformer.get_literal_type = counted
import workflows.benchmark, workflows.frontier, workflows.kernels, tasks.frontier_ranks, tasks.train_ranks
from flytekit.configuration import ImageConfig, SerializationSettings
from flytekit.core.base_task import PythonTask
from flytekit.core.workflow import WorkflowBase
from flytekit.tools.translator import get_serializable
settings = SerializationSettings(image_config=ImageConfig.auto_default_image())
serialized = {}
for name in sorted(m for m in sys.modules if m.startswith(("tasks.", "workflows."))):
    for value in vars(sys.modules[name]).values():
        if isinstance(value, (PythonTask, WorkflowBase)) and value.name not in serialized:
            idl = get_serializable({}, settings, value).to_flyte_idl()
            templates = [idl.template, *idl.sub_workflows] if hasattr(idl, "sub_workflows") else []
            for node in (node for template in templates for node in template.nodes):  # a set's order, which varies
                upstream = sorted(node.upstream_node_ids)
                del node.upstream_node_ids[:]
                node.upstream_node_ids.extend(upstream)
            serialized[value.name] = hashlib.sha256(idl.SerializeToString(deterministic=True)).hexdigest()
print(json.dumps({"serialized": serialized, "computed": len(computed)}))
"""


def _serialized(mode: str) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", SERIALIZE_ALL, mode],
        cwd=PROJECT_ROOT,
        # the same order of sets in both (the JSON schemas' lists of enum values follow one)
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_every_task_serializes_as_without_the_cache_which_computes_each_dataclass_once():
    cached, uncached = _serialized("cached"), _serialized("uncached")
    expected = {"tasks.train.train_condition", "tasks.frontier_ranks.search_memory_frontier_2x4gpu"}
    assert expected <= set(cached["serialized"])
    assert cached["serialized"] == uncached["serialized"]
    # the cache computes each class once: far fewer than flytekit alone, which computes one per use
    assert cached["computed"] < uncached["computed"] / 3, (cached["computed"], uncached["computed"])
