"""Weights & Biases for the train task: one run per condition (logged by
`finetune_bench.integrations.wandb_logging`), grouped by workflow execution, linked from the Flyte UI through
flytekitplugins-wandb."""

import functools
import logging
import os
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

from flytekit import Secret, current_context
from flytekit.configuration import SerializationSettings
from flytekit.core.base_task import PythonTask
from flytekit.core.context_manager import FlyteContextManager

from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import run_name
from finetune_bench.inputs.secrets import redact, secret_values
from finetune_bench.integrations import wandb_logging as tracking
from finetune_bench.results.record import RunResult
from finetune_bench.sources.cache import cache_root
from tasks.execution import on_cluster
from tasks.registration import (
    WANDB_API_URL,
    WANDB_APP_URL,
    WANDB_ENTITY,
    WANDB_PROJECT,
    WANDB_SECRET_KEY,
    wandb_disabled,
)

logger = logging.getLogger(__name__)

# flytekitplugins-wandb's link type whose run id is the pod's name (HOSTNAME), one per map item and retry.
WANDB_LINK_TYPE = "wandb-execution-id"
# Local experiment groups, by the working directory that every item of one local map task shares.
_LOCAL_GROUPS: dict[str, str] = {}


def experiment_group() -> str:
    """The W&B group: the same for every condition of one workflow execution, different for the next.

    Remote: the Flyte execution name. Local: flytekit's execution id is the constant `local`, but the items
    of one local map task share one sandbox directory, new for each execution: a group is made per sandbox.
    """
    params = current_context()
    if on_cluster():
        return params.execution_id.name
    sandbox = str(params.working_directory)
    if sandbox not in _LOCAL_GROUPS:
        _LOCAL_GROUPS[sandbox] = f"local-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    return _LOCAL_GROUPS[sandbox]


def wandb_run_id() -> str:
    """The W&B run id. Remote: the pod's HOSTNAME, which the Flyte UI's link (WANDB_LINK_TYPE) points at."""
    if on_cluster():
        return os.environ.get("HOSTNAME") or f"{current_context().execution_id.name}-{uuid.uuid4().hex[:8]}"
    return f"local-{uuid.uuid4().hex[:12]}"


def wandb_link_config() -> dict[str, str]:
    """What flytekitplugins-wandb's `wandb_init.get_extra_config` puts in the task template for the link."""
    return {"project": WANDB_PROJECT, "entity": WANDB_ENTITY, "host": WANDB_APP_URL, "link_type": WANDB_LINK_TYPE}


@functools.cache
def condition_wandb_run_class() -> type:
    """flytekitplugins-wandb's `wandb_init` with its link, not its run handling.

    The plugin's `execute` opens one run around the whole task and finishes it outside any `finally`, so
    a failed local map item leaks its run into the next item. Here `execute` only fetches the API key
    (remote: the Flyte secret; local: none, `WANDB_API_KEY` is used if set) and hands it to
    `finetune_bench.integrations.wandb_logging` for this call alone (no `wandb.login`: nothing written to ~/.netrc,
    nothing left for the next item); the task body opens and finishes the condition's run itself, and whatever
    run is still open when the task returns or raises is finished.
    Imported lazily: the analysis image, whose pods import the module that defines the train task
    (`tasks.train`, for `concatenate_outputs`), lacks the plugin.
    """
    from flytekitplugins.wandb import wandb_init

    class condition_wandb_run(wandb_init):
        def execute(self, *args, **kwargs) -> Any:
            api_key, base_url = None, None
            if on_cluster():
                base_url = self.api_host
                try:
                    if isinstance(self.secret, Secret):
                        params = FlyteContextManager.current_context().user_space_params
                        api_key = params.secrets.get(key=self.secret.key, group=self.secret.group)
                    else:
                        api_key = self.secret()
                except Exception as error:  # no secret: the run is still trained and returned
                    logger.warning("W&B: no API key (%s); this run is not logged to W&B", type(error).__name__)
            try:
                with tracking.use_credentials(api_key, base_url):
                    return self.task_function(*args, **kwargs)
            finally:
                tracking.finish_open_runs()

    return condition_wandb_run


def missing_key_reason() -> str:
    return (
        f"WANDB_ENTITY is {WANDB_ENTITY!r} but the task could not read the secret {WANDB_SECRET_KEY!r}: create it "
        f"(`union create secret {WANDB_SECRET_KEY}`) or register without WANDB_ENTITY"
    )


def require_wandb_key() -> None:
    """On a cluster, with WANDB_ENTITY registered: the W&B secret can be read (checked when planning, so that a
    missing key stops the execution before any GPU time instead of leaving every run unlogged)."""
    if not (WANDB_ENTITY and on_cluster()) or wandb_disabled():
        return
    try:
        key = current_context().secrets.get(key=WANDB_SECRET_KEY)
    except Exception:  # whatever flytekit raises for a missing secret
        key = None
    if not key:
        raise SpecError(missing_key_reason())


def require_wandb_answers(probe: Callable[[str], str | None] | None = None) -> None:
    """On a cluster, with WANDB_ENTITY registered and W&B not turned off: the W&B server answers this pod (checked
    when planning, so that a grid does not train and then fail at its end for want of W&B). `probe(url)` says why a
    server does not answer (default: one HTTP request without the key, `tracking.no_answer`)."""
    if not (WANDB_ENTITY and on_cluster()) or wandb_disabled():
        return
    why = (probe or tracking.no_answer)(WANDB_API_URL)
    if why:
        host = urllib.parse.urlparse(WANDB_API_URL if "://" in WANDB_API_URL else f"https://{WANDB_API_URL}").hostname
        raise SpecError(
            f"W&B is on (WANDB_ENTITY {WANDB_ENTITY!r}) but its server {host} ({WANDB_API_URL}) does not answer from "
            f"this cluster's pods ({why}), so every run would train and then fail to be logged: let the pods reach "
            "it, set WANDB_BASE_URL to a W&B server they reach, or turn W&B off (register with WANDB_MODE=disabled, "
            "or without WANDB_ENTITY)"
        )


def with_wandb_link(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate with `condition_wandb_run` when WANDB_ENTITY is set (the link needs an entity)."""
    if not WANDB_ENTITY:
        return function
    try:
        decorator = condition_wandb_run_class()
    except ImportError:
        return function
    return decorator(
        function,
        project=WANDB_PROJECT,
        entity=WANDB_ENTITY,
        secret=Secret(key=WANDB_SECRET_KEY),
        host=WANDB_APP_URL,
        api_host=WANDB_API_URL,
    )


def log_to_wandb(result: RunResult) -> tracking.LoggedRun | None:
    """Log one run to W&B. A failure there never loses the measured result: it is added to the run's
    `problems` (the grid then ends with a failing status naming it)."""
    api_key, base_url = tracking.current_credentials()
    mode = tracking.resolve_mode(api_key, local=not on_cluster())
    if mode == "disabled" and on_cluster() and WANDB_ENTITY and not api_key and os.environ.get("WANDB_MODE") is None:
        # asked for (an entity registered) and impossible: said, and the execution ends failing
        result.problems.append(f"W&B: the run was not logged ({missing_key_reason()})")
        return None
    if mode == "disabled":
        logger.info("W&B is off for %s", run_name(result.condition_id, result.run_number))
        return None
    if mode == "online":
        # W&B waits about 90 s per run for a server it cannot reach: ask once, quickly, instead.
        why = tracking.unreachable(base_url or os.environ.get("WANDB_BASE_URL") or WANDB_API_URL)
        if why and on_cluster():  # an offline run would die with the pod: the run is not logged
            logger.warning("W&B: %s; %s is not logged", why, run_name(result.condition_id, result.run_number))
            result.problems.append(f"W&B: the run was not logged ({why})")
            return None
        if why:  # locally, logged offline: nothing is lost, `wandb sync` uploads it later
            logger.warning("W&B: %s; logging %s offline", why, run_name(result.condition_id, result.run_number))
            result.details["wandb"] = f"logged offline: {why}"
            mode = "offline"
    execution_url = os.environ.get("FLYTE_EXECUTION_URL")
    try:
        logged = tracking.log_condition(
            result,
            result.steps_file,
            group=experiment_group(),
            run_id=wandb_run_id(),
            project=os.environ.get("WANDB_PROJECT") or WANDB_PROJECT,
            entity=os.environ.get("WANDB_ENTITY") or WANDB_ENTITY,
            mode=mode,
            dir=os.environ.get("WANDB_DIR") or cache_root(),
            api_key=api_key,
            base_url=base_url,
            notes=f"[Flyte execution]({execution_url})" if execution_url else None,
        )
    except Exception as error:
        message = redact(f"{type(error).__name__}: {error}", secret_values((api_key,)))
        run = run_name(result.condition_id, result.run_number)
        logger.warning("W&B logging failed for %s (the run's result is kept): %s", run, message)
        result.problems.append(f"W&B: the run was not logged ({message})")
        return None
    finally:
        tracking.finish_open_runs()
    if logged is not None:
        where = logged.url or f"{logged.dir} (upload it with `wandb sync {logged.dir}`)"
        logger.info("W&B run %s (%s, %s): %s", logged.name, logged.id, logged.mode, where)
    return logged


def add_wandb_link_to_map_tasks(train_task: PythonTask) -> None:
    """flytekit puts a decorator's link config into the template of the task itself but not into that of a
    map task over it (ArrayNodeMapTask has no `task_function`); the map task does take the task's
    `get_config`, so the link config is added there too. Added without the plugin's import, which the modules
    that define the train tasks do not need at import time."""
    if not WANDB_ENTITY:
        return
    task_config = train_task.get_config

    def task_config_with_wandb_link(settings: SerializationSettings) -> dict[str, str]:
        return {**(task_config(settings) or {}), **wandb_link_config()}

    train_task.get_config = task_config_with_wandb_link
