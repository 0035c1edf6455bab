"""The workflows' dynamic nodes: flytekit's `@dynamic`, minus the registering machine, with the resources its pod
needs (`tasks.registration.DYNAMIC_NODE_RESOURCES`).

A dynamic node's pod compiles its sub-tasks with the serialization settings it was registered with, which flytekit
hands it in its container's environment (`_F_SS_C`). Those settings include `source_root`, the registering
checkout's absolute path: a pod has no use for it (the images name their own files, see `images.images`) and a
registered template should not carry where a user keeps their code. The task type below leaves it out.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from flytekit import dynamic
from flytekit.configuration import SERIALIZED_CONTEXT_ENV_VAR, SerializationSettings
from flytekit.core.python_function_task import PythonFunctionTask
from flytekit.core.task import TaskPlugins
from flytekit.models.task import Container

from tasks.registration import DYNAMIC_NODE_RESOURCES


@dataclasses.dataclass(frozen=True)
class WithoutMachineSettings:
    """The task config that selects `DynamicWithoutMachineSettings` (flytekit picks a task's class by its config's
    type)."""


class DynamicWithoutMachineSettings(PythonFunctionTask[WithoutMachineSettings]):
    def get_container(self, settings: SerializationSettings) -> Container:
        return super().get_container(without_machine(settings))


def without_machine(settings: SerializationSettings) -> SerializationSettings:
    """`settings` with the ones they hand the pod stripped of the registering machine's paths."""
    if not settings.env or SERIALIZED_CONTEXT_ENV_VAR not in settings.env:
        return settings
    handed = SerializationSettings.from_transport(settings.env[SERIALIZED_CONTEXT_ENV_VAR])
    handed = dataclasses.replace(handed, source_root=None)
    return dataclasses.replace(settings, env={**settings.env, SERIALIZED_CONTEXT_ENV_VAR: handed.serialized_context})


TaskPlugins.register_pythontask_plugin(WithoutMachineSettings, DynamicWithoutMachineSettings)


def dynamic_node(**kwargs: Any) -> Callable[[Callable], PythonFunctionTask]:
    """`@dynamic(**kwargs)` whose pod is handed no path of the registering machine and asks for what it needs
    (`tasks.registration.DYNAMIC_NODE_RESOURCES`, unless `requests` are given)."""
    return dynamic(task_config=WithoutMachineSettings(), **{"requests": DYNAMIC_NODE_RESOURCES, **kwargs})
