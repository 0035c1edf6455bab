"""Weights & Biases: one run per condition, logged from the task process after the child has finished.

The training child never touches W&B: `log_condition` opens a fresh run (never reusing one left open),
logs the condition's settings as config, its per-step table as history and how it ended as summary,
and always finishes the run, even when logging fails half-way. Failed runs (oom, error, timeout,
nonfinite) and reused ones are logged too.

Mode (`resolve_mode`): `WANDB_MODE` (online / offline / disabled) wins; otherwise online when an API
key is available (`WANDB_API_KEY`, or the Flyte secret handed over by the task's decorator), offline
on a local run without one, disabled on a remote run without one (an offline run dies with its pod).

Secrets: config keys that look like credentials are dropped, and the value of every credential in the
environment (`WANDB_API_KEY`, `HF_TOKEN`, Flyte's `_FSEC_*` secrets, ...) and the API key in use are
redacted from every string logged. W&B's own metadata (command line, git remote, machine info,
console output) is not collected.

No Flyte import here: `tasks/wandb_flyte.py` decides the group and the run id.
"""

import contextlib
import contextvars
import csv
import dataclasses
import functools
import logging
import math
import os
import socket
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_bench.inputs.plan import run_name
from finetune_bench.inputs.secrets import SECRET_NAME, redact, secret_values
from finetune_bench.measuring.quality import perplexity
from finetune_bench.results.record import OK, RunResult

logger = logging.getLogger(__name__)

DEFAULT_PROJECT = "finetune-bench"
MODES = ("online", "offline", "disabled")
# Older spellings W&B still accepts in WANDB_MODE.
_MODE_ALIASES = {"dryrun": "offline", "run": "online"}
ERROR_TAIL_CHARS = 4000
_GIB = 1024**3
# W&B's limits on these fields.
_TAG_CHARS = 64
_GROUP_CHARS = 128

# The API key (and W&B server) handed over by the task's decorator for the duration of one task call,
# so that nothing process-global (os.environ, ~/.netrc, wandb.login) carries it to the next map item.
_CREDENTIALS: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "wandb_credentials", default=(None, None)
)


@contextlib.contextmanager
def use_credentials(api_key: str | None, base_url: str | None = None) -> Iterator[None]:
    """Make `api_key` (and the W&B server `base_url`) the credentials of `log_condition` calls inside."""
    token = _CREDENTIALS.set((api_key or None, base_url or None))
    try:
        yield
    finally:
        _CREDENTIALS.reset(token)


def current_credentials() -> tuple[str | None, str | None]:
    """(api_key, base_url) set by `use_credentials`, else (`WANDB_API_KEY`, None)."""
    api_key, base_url = _CREDENTIALS.get()
    return api_key or os.environ.get("WANDB_API_KEY") or None, base_url


def resolve_mode(api_key: str | None, local: bool) -> str:
    """online / offline / disabled: `WANDB_MODE` if set; online with a key; offline locally; else disabled."""
    requested = os.environ.get("WANDB_MODE", "").strip().lower()
    requested = _MODE_ALIASES.get(requested, requested)
    if requested in MODES:
        return requested
    if requested:
        logger.warning("WANDB_MODE=%r is not one of %s; ignored", requested, MODES)
    if os.environ.get("WANDB_DISABLED", "").strip().lower() in ("1", "true", "yes"):
        return "disabled"
    if api_key:
        return "online"
    return "offline" if local else "disabled"


# How long a W&B server gets to accept a connection before a run is not logged online (W&B itself waits about
# 90 s per run, every run, when there is no network).
REACHABLE_TIMEOUT_S = 3.0


@functools.cache
def unreachable(base_url: str) -> str | None:
    """Why the W&B server at `base_url` cannot be reached (no route, no DNS, refused, too slow), or None when a
    TCP connection opens. Asked once per server and process."""
    parsed = urllib.parse.urlparse(base_url if "://" in base_url else f"https://{base_url}")
    port = parsed.port or (80 if parsed.scheme == "http" else 443)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=REACHABLE_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{parsed.hostname}:{port} unreachable ({type(exc).__name__}: {exc})"


# How long planning waits for the W&B server to answer one HTTP request (`no_answer`).
ANSWER_TIMEOUT_S = 5.0


def no_answer(base_url: str, timeout_s: float = ANSWER_TIMEOUT_S, open_url: Any = None) -> str | None:
    """Why the W&B server at `base_url` gives no HTTP answer within `timeout_s` (no DNS, no route, refused, a TLS
    failure such as an intercepting proxy's certificate, too slow), or None when it answers anything (any HTTP
    status: the request carries no key, so a refusal of it is an answer). The environment's proxy settings apply, as
    they do to W&B's own requests. `open_url`: `urllib.request.urlopen`'s stand-in (tests)."""
    import urllib.error
    import urllib.request

    url = base_url if "://" in base_url else f"https://{base_url}"
    open_url = open_url or urllib.request.urlopen
    try:
        with open_url(urllib.request.Request(url, method="GET"), timeout=timeout_s):
            return None
    except urllib.error.HTTPError:  # an HTTP status: the server answered
        return None
    except (OSError, ValueError) as exc:  # URLError, a timeout, an SSL error; a URL urllib cannot open
        why = getattr(exc, "reason", None) or exc
        return f"{type(why).__name__}: {why}" if str(why) else type(why).__name__


def drop_secret_keys(config: dict[str, Any], path: str = "") -> dict[str, Any]:
    """`config` without the entries whose name looks like a credential (warned about, never logged)."""
    kept = {}
    for key, value in config.items():
        if SECRET_NAME.search(str(key)):
            logger.warning("W&B config: %s%s looks like a credential; not logged", path, key)
            continue
        kept[key] = drop_secret_keys(value, f"{path}{key}.") if isinstance(value, dict) else value
    return kept


def run_config(result: RunResult) -> dict[str, Any]:
    """The condition's settings: every training argument, which run it is, the swept values, the machine."""
    args = dataclasses.asdict(result.training_args)
    config = {
        **args,
        "condition_id": result.condition_id,
        "run_number": result.run_number,
        "swept_axes": list(result.swept_axes),
        "swept": {axis: args.get(axis) for axis in result.swept_axes},
        "environment": dict(result.environment),
    }
    return drop_secret_keys(config)


def run_summary(result: RunResult) -> dict[str, Any]:
    """How the run ended: status, reason, headline metrics (memory also in GiB), details."""
    summary: dict[str, Any] = {
        "status": result.status,
        "reason": result.reason,
        "reused": result.reused,
        "wall_time_s": result.wall_time_s,
        "loss_path": result.loss_path,
    }
    for name, value in result.metrics.items():
        summary[name] = value
        if name.endswith("_bytes") and _finite(value):
            summary[name.removesuffix("_bytes") + "_gib"] = value / _GIB
    if result.details:
        summary["details"] = dict(result.details)
    if result.liger_patches:
        summary["liger_patches"] = dict(result.liger_patches)
    if result.status != OK and result.error_tail:
        summary["error_tail"] = result.error_tail[-ERROR_TAIL_CHARS:]
    return summary


# The per-step table's figures logged as they are (`step/<name>`), what explains a slow step among them.
STEP_FIGURES = ("loss", "step_time_s", "gc_time_s", "cuda_mallocs", "cuda_malloc_retries", "triton_compiles",
                "triton_compile_s", "jit_cache_bytes")  # fmt: skip


def step_metrics(steps_file: str | os.PathLike | None) -> list[tuple[int, dict[str, Any]]]:
    """(step, metrics) for each row of the per-step CSV; empty cells (no CUDA figures on a CPU) left out."""
    if not steps_file or not Path(steps_file).is_file():
        return []
    rows = []
    with open(steps_file, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            value = {k: _number(v) for k, v in row.items()}
            metrics: dict[str, Any] = {"step/is_warmup": str(row.get("is_warmup", "")).strip().lower() == "true"}
            for name in STEP_FIGURES:
                if value.get(name) is not None:
                    metrics[f"step/{name}"] = value[name]
            if _finite(value.get("eval_loss")):  # evaluated on the held-out examples after this step
                metrics["eval/loss"] = value["eval_loss"]
                metrics["eval/perplexity"] = perplexity(value["eval_loss"])
            for name in ("peak_allocated_bytes", "peak_reserved_bytes"):
                if _finite(value.get(name)):
                    metrics[f"step/{name.removesuffix('_bytes')}_gib"] = value[name] / _GIB
            step_time = value.get("step_time_s")
            if _finite(step_time) and step_time > 0:
                for tokens in ("non_padding_tokens", "padded_tokens"):
                    if _finite(value.get(tokens)):
                        name = "tokens_per_second" if tokens == "non_padding_tokens" else "padded_tokens_per_second"
                        metrics[f"step/{name}"] = value[tokens] / step_time
            rows.append((int(value["step"]), metrics))
    return rows


@dataclass
class LoggedRun:
    id: str
    name: str
    mode: str
    # Where the run's local files are (offline: what `wandb sync` uploads), and its page when online.
    dir: str
    url: str | None


def log_condition(
    result: RunResult,
    steps_file: str | os.PathLike | None,
    *,
    group: str,
    run_id: str | None,
    project: str = DEFAULT_PROJECT,
    entity: str | None = None,
    mode: str = "offline",
    dir: str | os.PathLike | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    notes: str | None = None,
) -> LoggedRun | None:
    """Log one condition's result as a W&B run named `<condition_id>#<run_number>` in `group`.

    A new run every call (never the one a failed call may have left open), always finished on the way
    out. Raises what W&B raises: the caller decides (the train task warns and keeps its result).
    Returns None when `mode` is disabled.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if mode == "disabled":
        return None
    import wandb

    secrets = secret_values((api_key, os.environ.get("WANDB_API_KEY")))
    name = run_name(result.condition_id, result.run_number)
    arm = result.training_args.arm
    tags = [arm, result.status] + (["reused"] if result.reused else [])
    settings = dict(
        # Nothing W&B collects by itself: the run is logged after the fact, from another process.
        console="off",
        x_disable_stats=True,
        x_disable_meta=True,
        x_disable_machine_info=True,
        x_save_requirements=False,
        disable_git=True,
        disable_code=True,
        save_code=False,
        disable_job_creation=True,
        quiet=True,
    )
    if mode == "offline":  # kept on this machine: nothing to follow online, so W&B says nothing per run
        settings["silent"] = True
    if mode == "online":
        if api_key:
            settings["api_key"] = api_key
        if base_url:
            settings["base_url"] = base_url
    # Settings a newer W&B no longer has are left out rather than failing every run's logging.
    settings = {k: v for k, v in settings.items() if k in wandb.Settings.model_fields}
    if dir is not None:
        Path(dir).mkdir(parents=True, exist_ok=True)
    with wandb.init(
        project=project,
        entity=entity,
        id=run_id,
        name=redact(name, secrets),
        group=redact(group, secrets)[:_GROUP_CHARS],
        job_type=redact(arm, secrets)[:_TAG_CHARS],
        notes=redact(notes, secrets),
        tags=[redact(t, secrets)[:_TAG_CHARS] for t in tags],
        config=redact(run_config(result), secrets),
        mode=mode,
        dir=str(dir) if dir is not None else None,
        reinit="create_new",
        settings=wandb.Settings(**settings),
    ) as run:
        for step, metrics in step_metrics(steps_file):
            run.log(metrics, step=step)
        run.summary.update(redact(run_summary(result), secrets))
        url = run.url if mode == "online" else None
        logged = LoggedRun(id=run.id, name=run.name, mode=mode, dir=str(Path(run.dir).parent), url=url)
    return logged


def finish_open_runs(exit_code: int = 1) -> None:
    """Finish every W&B run this process still has open (none, unless something went wrong)."""
    wandb = sys.modules.get("wandb")
    if wandb is None:
        return
    for _ in range(100):
        if wandb.run is None:
            return
        logger.warning("W&B run %s was still open at the end of the task; finishing it", wandb.run.name)
        wandb.run.finish(exit_code=exit_code)


def _number(text: str | None) -> float | None:
    if text is None or text.strip() == "" or text.strip().lower() in ("true", "false"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
