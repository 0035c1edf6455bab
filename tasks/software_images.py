"""Each software set's training image on a cluster (`images.images.software_set_image`): the training image with
the set's pins in place of the lockfile's versions.

Registering a workflow builds the image of every task defined in the registering process, and hands a dynamic node
each of those images by id, for the sub-tasks it compiles at run time (flytekit's serialization of a dynamic task).
So when a workflow module is imported with an `--inputs-file` (`union run --remote ... --inputs-file F`), every
software set F names gets a train task here, defined with the set's image: registration builds each set's image, and
the benchmark's dynamic node runs each set's runs on it (`registered_image`). A pod of a set's image imports the
set's releases as installed, and the benchmark's planning, told which sets have an image (`imaged_sets`), installs
nothing of them: what such a set's liger-kernel has is checked in its own pods. A set whose image this execution's
registration did not build (a workflow registered without the inputs file that names it) is installed by uv, at
planning and in the training image's pods (`finetune_bench.sources.software`)."""

import json
import logging
import os

import yaml
from flytekit import FlyteContextManager, task
from flytekit.core.python_function_task import PythonFunctionTask

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.software_sets import parse
from images.images import software_set_image
from tasks.execution import on_cluster
from tasks.registration import REGISTRATION_ENV, TRAIN_ACCELERATOR, TRAIN_RESOURCES, WANDB_SECRETS

logger = logging.getLogger(__name__)


def sets_named_in(inputs_file: str) -> list[str]:
    """The software sets an inputs file names (`experiment_args.software_set`, `training_args.software_set`), each
    pinning something, in order; none when the file cannot be read (planning says why)."""
    try:
        with open(inputs_file) as handle:
            inputs = yaml.safe_load(handle)
        experiment = inputs.get("experiment_args") or {}
        training = inputs.get("training_args") or {}
        named = [*(experiment.get("software_set") or []), training.get("software_set", "")]
        return [text for text in dict.fromkeys(named) if isinstance(text, str) and parse(text)]
    except (OSError, yaml.YAMLError, AttributeError, TypeError, SpecError):
        return []


def define_set_train_tasks(inputs_file: str, train: PythonFunctionTask) -> list[PythonFunctionTask]:
    """A train task per software set `inputs_file` names, `train`'s function on the set's image (what makes
    registration build that image and hand it to the dynamic node)."""
    return [
        task(
            container_image=software_set_image(parse(text)),
            requests=TRAIN_RESOURCES,
            accelerator=TRAIN_ACCELERATOR,
            secret_requests=WANDB_SECRETS,
            environment=REGISTRATION_ENV,
        )(train.task_function)
        for text in sets_named_in(inputs_file)
    ]


# The sets whose images this registration builds (a JSON list), in the environment of the benchmark's planning task:
# planning installs nothing of them (`finetune_bench.sources.software.checked_runs`' `imaged`).
IMAGED_SETS_ENV = "FINETUNE_BENCH_IMAGED_SOFTWARE_SETS"


def imaged_sets_env(inputs_file: str) -> dict[str, str]:
    """The planning task's `IMAGED_SETS_ENV`: registering with `inputs_file`, the sets it names (each gets an image:
    `define_set_train_tasks`); in a pod, the registered value; else nothing."""
    sets = sets_named_in(inputs_file) if inputs_file else []
    if sets:
        return {IMAGED_SETS_ENV: json.dumps(sets)}
    return {IMAGED_SETS_ENV: os.environ[IMAGED_SETS_ENV]} if os.environ.get(IMAGED_SETS_ENV) else {}


def imaged_sets() -> list[str]:
    """The sets whose runs train on an image registration built for them, as this task was registered with; none
    in a local run (the sets are installed here)."""
    if not on_cluster():
        return []
    try:
        sets = json.loads(os.environ.get(IMAGED_SETS_ENV) or "[]")
    except json.JSONDecodeError:
        return []
    return [text for text in sets if isinstance(text, str)]


def registered_image(software_set: str) -> str:
    """The full name of the set's image as this execution's registration built it ("" for the installed set, in a
    local run, or where registration built none: the runs then use the training image)."""
    context = FlyteContextManager.current_context()
    if not parse(software_set) or context.execution_state is None or context.execution_state.is_local_execution():
        return ""
    settings = context.serialization_settings
    if settings is None or settings.image_config is None:
        return ""
    image = settings.image_config.find_image(software_set_image(parse(software_set)).id)
    if image is None:
        logger.warning(
            "software set %r: this execution's registration built no image for it (register with the inputs file "
            "that names it); its runs install its releases with uv in the training image's pods",
            software_set,
        )
        return ""
    return image.full
