"""Each dataclass's Flyte literal type computed once per process.

flytekit computes a dataclass's literal type (its JSON schema, built by mashumaro, and each field's type) anew for
every task and workflow that takes or returns it. These tasks pass a few large dataclasses (`TrainingArgs`, in
`PlannedRun`, `FrontierSearch`, ...) through dozens of tasks, one per GPU layout: without a cache, building the same
schemas again took most of the CPU time of importing the workflows, which every `pyflyte run`, registration and pod
pays before it does anything. The literal type depends on the class alone: the first one computed serves every later
use, each as a copy of its own (flytekit changes some it is given), the same as flytekit computes
(tests/workflows/test_literal_types.py).
"""

import functools
from typing import Any

from flytekit.core.type_engine import DataclassTransformer
from flytekit.models.types import LiteralType


def cache_dataclass_literal_types() -> None:
    """Install the cache on flytekit's dataclass transformer (once: a second call changes nothing)."""
    compute = DataclassTransformer.get_literal_type
    if getattr(compute, "cached_per_class", False):
        return
    known: dict[Any, LiteralType] = {}

    @functools.wraps(compute)
    def get_literal_type(self: DataclassTransformer, t: Any) -> LiteralType:
        try:
            computed = known.get(t)
        except TypeError:  # an unhashable annotation: computed as flytekit does
            return compute(self, t)
        if computed is None:
            computed = known[t] = compute(self, t)
        # a copy: flytekit changes some it is given (it tags each variant of an Optional with its transformer's name)
        return LiteralType.from_flyte_idl(computed.to_flyte_idl())

    get_literal_type.cached_per_class = True
    get_literal_type.uncached = compute
    DataclassTransformer.get_literal_type = get_literal_type
