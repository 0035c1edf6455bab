"""Each dataclass's literal type is computed once per process (tasks.literal_types): every dataclass a task or
workflow of the three workflow files takes or returns gets the literal type flytekit computes, as a copy of its own
that a change made by flytekit leaves the next one untouched."""

import dataclasses
import sys
import typing

from flytekit.core.base_task import PythonTask
from flytekit.core.type_engine import DataclassTransformer, TypeEngine
from flytekit.core.workflow import WorkflowBase

import tasks.frontier_ranks  # noqa: F401 (its tasks, one per layout)
import tasks.train_ranks  # noqa: F401
import workflows.benchmark  # noqa: F401
import workflows.frontier  # noqa: F401
import workflows.kernels  # noqa: F401


def _dataclasses_of_every_interface() -> set[type]:
    found = set()
    for name in [m for m in sys.modules if m.startswith(("tasks.", "workflows."))]:
        for value in vars(sys.modules[name]).values():
            if isinstance(value, PythonTask | WorkflowBase):
                interface = value.python_interface
                for python_type in [*interface.inputs.values(), *interface.outputs.values()]:
                    found.update(t for t in (python_type, *typing.get_args(python_type)) if dataclasses.is_dataclass(t))
    return found


def test_every_dataclass_gets_flytekit_s_own_literal_type_as_a_fresh_copy():
    cached = DataclassTransformer.get_literal_type
    assert cached.cached_per_class, "importing the tasks installs the cache"
    transformer = TypeEngine.get_transformer(workflows.benchmark.TrainingArgs)
    classes = _dataclasses_of_every_interface()
    assert {"TrainingArgs", "PlannedRun", "FrontierSearch", "RunSettings"} <= {c.__name__ for c in classes}
    for cls in classes:
        first = cached(transformer, cls)
        assert first.to_flyte_idl() == cached.uncached(transformer, cls).to_flyte_idl(), cls
        # flytekit tags the variants of an Optional in place: the next use still gets the untagged type
        first._structure = None
        assert cached(transformer, cls).structure is not None, cls
