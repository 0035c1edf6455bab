"""Run one planned run in a fresh child process, with a timeout, and always return a result.

A fresh process per run is what keeps conditions independent: Liger's patches are module-global,
and the CUDA allocator and context carry state from one run to the next. A condition's own
failure (out of memory, a crash, a hang) is its result; this module never raises for it.
"""

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from finetune_bench.inputs.arms import parse_arm
from finetune_bench.inputs.errors import SpecError
from finetune_bench.inputs.plan import PlannedRun
from finetune_bench.inputs.secrets import redact
from finetune_bench.measuring.profiling import PROFILE_DIR, PROFILE_FILE
from finetune_bench.results.record import ERROR, OK, OOM, PREDICTED_OOM, STOPPED, TIMEOUT, RunResult, says_out_of_memory
from finetune_bench.results.store import (
    CorruptEntry,
    ResultStore,
    StoreError,
    hardware_fingerprint,
    identity_key,
    run_identity,
)
from finetune_bench.running import forkserver
from finetune_bench.running.allocator import set_allocator
from finetune_bench.running.device_lock import device_lock
from finetune_bench.running.faults import LAUNCHER_PID_ENV, RUN_ENV, made_under_a_test_switch, switches_on
from finetune_bench.running.triton_cpu import INTERPRETER_ENV
from finetune_bench.running.worker import (
    COLLECTIVE_TIMEOUT_ENV,
    ERROR_TAIL_LINES,
    LAUNCHED_AT_ENV,
    LAUNCHER_ONLY,
    PARENT_PID_ENV,
    PROCESS_GROUP_NAMESPACE_ENV,
    RESULT_FILE,
    STEPS_FILE,
    ChildOutcome,
)
from finetune_bench.sources import software

logger = logging.getLogger(__name__)

LOG_FILE = "child.log"
# flytekit hands a task its secrets as environment variables with this prefix.
SECRET_ENV_PREFIX = "_FSEC_"
# Credentials the training child never needs (W&B logs from the task process, after the child ended).
CHILD_WITHHELD_ENV = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_KILL_GRACE_S = 10
# How much longer than the condition's timeout a rank's collectives wait before they raise.
_COLLECTIVE_MARGIN_S = 300


def _needs_triton_interpreter(run: PlannedRun) -> bool:
    if not parse_arm(run.training_args.arm).liger:
        return False
    if run.training_args.device == "cpu":
        return True
    if run.training_args.device == "auto":
        import torch

        return not torch.cuda.is_available()
    return False


def isolated_env() -> dict[str, str]:
    """A child's environment: ours without Flyte's secrets and the credentials no child needs, the package
    importable, and the child told to die with this process."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(SECRET_ENV_PREFIX) and key not in CHILD_WITHHELD_ENV
    }
    env[PARENT_PID_ENV] = env[LAUNCHER_PID_ENV] = str(os.getpid())
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def child_env(run: PlannedRun, rank: int | None = None, quiet: bool = False) -> dict[str, str]:
    """The training child's environment (`isolated_env`: a rank's keeps the launch's RANK, WORLD_SIZE, MASTER_ADDR,
    ...), with the CUDA allocator the run's settings name (`running.allocator`), the Triton interpreter on a CPU and
    which run (and rank) it is, for the test-only faults. `quiet`: no warning of a replaced allocator option (the
    children's launcher says it)."""
    env = isolated_env()
    env[RUN_ENV] = run.name + (f"@rank{rank}" if rank is not None else "")
    replaced = set_allocator(env, run.training_args.allocator)
    if replaced and not quiet:
        logger.warning(
            "%s: the environment's allocator option %s is replaced by the run's allocator %r",
            env[RUN_ENV],
            replaced,
            run.training_args.allocator,
        )
    if _needs_triton_interpreter(run):
        env.update(INTERPRETER_ENV)
    # the software set's releases first on the child's search path (and its fork server's: one server per set)
    software.apply(env, run.training_args.software_set)
    return env


def reuse_line(result: RunResult, key: str) -> str:
    """What the console says of a run taken from the results store instead of measured: how it ended, when and where
    it was measured, its entry, and how to measure it again."""
    measured = result.details.get("measured_at") or "at an unrecorded time"
    gpu = result.environment.get("gpu_name") or result.details.get("device") or "an unrecorded device"
    return (
        f"reused the stored result {key} ({result.status}), measured {measured} on {gpu} (force_fresh: true measures "
        "it again)"
    )


def ending_line(run: PlannedRun, result: RunResult, store: str) -> str:
    """One line of how `run` ended (`result`), for the log of the task that ran it: its status (and why, when not ok),
    its throughput and peak memory where it measured them, and where its result is kept (`store`, with any credential
    in its URL left out) or why it is not. No setting of the run and no secret is in it."""
    said = [result.status]
    if result.status != OK and result.reason:
        reason = result.reason.strip().splitlines()[0]
        said[0] += f" ({reason[:200]}{'...' if len(reason) > 200 else ''})"
    if result.metrics.get("tokens_per_second"):
        said.append(f"{result.metrics['tokens_per_second']:,.0f} tokens/s")
    if result.wall_time_s and not result.reused:
        said.append(f"{result.wall_time_s:,.1f} s")
    for metric, what in (("peak_reserved_bytes", "reserved"), ("peak_allocated_bytes", "allocated")):
        if result.metrics.get(metric):
            said.append(f"peak {what} {result.metrics[metric] / 2**30:.2f} GiB")
            break
    where = _without_credentials(store)
    not_kept = [p for p in result.problems if p.startswith(STORE_PROBLEM)]
    if result.reused:
        said.append(f"taken from the results store {where}")
    elif not_kept:
        said.append(not_kept[0])
    elif run.refused or run.predicted_oom:
        said.append("not launched, not stored")
    elif "test_switches" in result.details:
        said.append("not stored (a test switch acted on it)")
    else:
        said.append(f"stored in {where}")
    return redact(f"{result.condition_id} run {result.run_number}: {', '.join(said)}")


def _without_credentials(url: str) -> str:
    """`url` without the user and password a URL may carry (`s3://key:secret@bucket/...`)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, path = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}{slash}{path}"


def not_launched(run: PlannedRun) -> RunResult:
    """The result of a run that is not launched: refused at planning or before launch (`error`, the refusal as
    its reason), or predicted out of memory with `skip_predicted_oom` (`predicted_oom`)."""
    return RunResult(
        condition_id=run.condition_id,
        run_number=run.run_number,
        swept_axes=list(run.swept_axes),
        training_args=run.training_args,
        status=ERROR if run.refused else PREDICTED_OOM,
        reason=run.refused or run.predicted_oom,
        predicted_peak_reserved_bytes=run.predicted_peak_reserved_bytes,
        predicted_moment_allocated_bytes=dict(run.predicted_moment_allocated_bytes),
    )


def run_in_child(run: PlannedRun, dataset_dir: Path, model_dir: Path, work_dir: Path, timeout_s: float) -> RunResult:
    """Train `run` in a child process under `work_dir`, holding the machine's device lock; classify how it ended
    (ok/oom/error/timeout). A run refused at planning ends as an error with the refusal as its reason, and
    launches nothing."""
    if run.refused:
        return not_launched(run)
    with device_lock(hardware_fingerprint()) as waited_s:
        result = run_child(run, dataset_dir, model_dir, work_dir, timeout_s)
    if waited_s >= 1:
        result.details["waited_for_device_s"] = f"{waited_s:.0f}"
    result.predicted_peak_reserved_bytes = run.predicted_peak_reserved_bytes
    result.predicted_moment_allocated_bytes = dict(run.predicted_moment_allocated_bytes)
    return result


def run_child(
    run: PlannedRun,
    dataset_dir: Path,
    model_dir: Path,
    work_dir: Path,
    timeout_s: float,
    rank: int | None = None,
    stop_when: Callable[[], str] | None = None,
    poll_s: float = 1.0,
    process_group_namespace: str = "",
) -> RunResult:
    """Train `run` (or, with `rank`, that rank of it: `running.ranks`) in a child process under `work_dir` and
    classify how it ended. `stop_when()`, asked every `poll_s` seconds while the child runs, says why to kill it
    now ("" to go on): such a child ends `stopped`. `process_group_namespace`: a rank's process group under that
    namespace of the launch's store (one of several runs of one launch)."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    condition_file = work_dir / "condition.json"
    condition_file.write_text(json.dumps(dataclasses.asdict(run.training_args), indent=2))
    worker_args = ["--condition", str(condition_file), "--dataset-dir", str(dataset_dir)]
    worker_args += ["--model-dir", str(model_dir), "--out", str(work_dir)]
    try:
        env = child_env(run, rank)
    except SpecError as exc:  # its software set cannot be installed here (a machine that reaches no index)
        result = not_launched(dataclasses.replace(run, refused=str(exc)))
        result.details["child_started"] = "not started"
        return result
    if rank is not None:  # a hung peer: the supervisors' timeouts end the run before any collective gives up
        env[COLLECTIVE_TIMEOUT_ENV] = f"{timeout_s + _COLLECTIVE_MARGIN_S:.0f}"
        if process_group_namespace:
            env[PROCESS_GROUP_NAMESPACE_ENV] = process_group_namespace
    # The child forks from a fork server (`running.forkserver`): one GPU's from this process's, a rank's from the
    # one its launch was offered (a rank's supervisor lives for one run: a server of its own would pay the imports
    # for its one child).
    ending = run_isolated(
        [sys.executable, "-m", forkserver.WORKER_MODULE, *worker_args], work_dir, env, timeout_s, stop_when, poll_s,
        forkable=forkserver.enabled() and (rank is None or forkserver.NODE_SERVER_ENV in env),
    )  # fmt: skip
    result = _classify(run, work_dir, ending, timeout_s)
    result.wall_time_s = ending.wall_time_s
    result.details["child_started"] = "forked from the fork server" if ending.forked else "fresh interpreter"
    return result


@dataclasses.dataclass
class ChildEnding:
    returncode: int
    timed_out: bool
    wall_time_s: float
    # Why the child was killed before it ended ("" when it was not): `stop_when`'s answer.
    stopped: str = ""
    # The monotonic clock when the child had ended (its `exit_s` ends there).
    ended_at: float = 0.0
    # How the child started: forked from the fork server, or a fresh interpreter.
    forked: bool = False


def run_isolated(
    command: list[str],
    work_dir: Path,
    env: dict[str, str],
    timeout_s: float,
    stop_when: Callable[[], str] | None = None,
    poll_s: float = 1.0,
    forkable: bool = False,
) -> ChildEnding:
    """Run `command` in a child process of its own session (its output in `work_dir`/LOG_FILE) until it exits,
    `timeout_s` passes or `stop_when()` gives a reason (asked every `poll_s` seconds); nothing it started
    outlives it. `forkable`: `command` runs the training worker, which the fork server can fork (a fresh
    interpreter when it cannot)."""
    started = time.monotonic()
    env = {**env, LAUNCHED_AT_ENV: repr(started)}  # the child's `startup_s` starts here
    deadline = started + timeout_s
    timed_out = False
    stopped = ""
    with open(work_dir / LOG_FILE, "wb") as log:
        # A session of its own, so that a timeout kills the child's whole process group (its own children
        # included). The child also dies with this process (it asks the kernel to, see `worker`), and every
        # way this process can end (an exception, Ctrl-C, SIGTERM) kills the group first.
        child = forkserver.start_child(command[3:], work_dir / LOG_FILE, env) if forkable else None
        if child is None:
            child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            with _sigterm_raises():
                while True:
                    wait_s = deadline - time.monotonic()
                    if stop_when is not None:
                        wait_s = min(wait_s, poll_s)
                    try:
                        returncode = child.wait(timeout=max(wait_s, 0))
                        break
                    except subprocess.TimeoutExpired:
                        timed_out = time.monotonic() >= deadline
                        stopped = "" if timed_out or stop_when is None else stop_when()
                        if timed_out or stopped:
                            returncode = _kill_group(child)
                            break
        finally:
            if child.returncode is None:
                _kill_group(child)
            _kill_leftovers(child.pid)
    ended = time.monotonic()
    forked = isinstance(child, forkserver.ForkedChild)
    return ChildEnding(returncode, timed_out, ended - started, stopped, ended, forked)


class ParentTerminated(SystemExit):
    """This process got SIGTERM while a child ran (the child was killed first)."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into an exception while a child runs, so that the cleanup runs (Python's default is to
    die on the spot). Only the main thread can install signal handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, _frame: object) -> None:
        raise ParentTerminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _kill_group(child: "subprocess.Popen | forkserver.ForkedChild") -> int:
    """SIGTERM to the child's process group, SIGKILL after a grace period; the child's exit status. The child leads
    its group before its pid is known here (`start_new_session`; the fork server reports the pid after the child's
    `setsid`), so a group that is gone is a child that has ended."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            break
        try:
            return child.wait(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            continue
    return child.wait()


def _kill_leftovers(group: int) -> None:
    """Kill what the child left in its process group (a data-loader or compile worker): nothing the run
    started outlives it."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:  # the group is empty: nothing left
        pass


def _log_tail(work_dir: Path) -> str:
    lines = (work_dir / LOG_FILE).read_text(errors="replace").rstrip().splitlines()
    return "\n".join(lines[-ERROR_TAIL_LINES:])


def _classify(run: PlannedRun, work_dir: Path, ending: ChildEnding, timeout_s: float) -> RunResult:
    returncode, timed_out = ending.returncode, ending.timed_out
    steps_file = work_dir / STEPS_FILE
    profile = work_dir / PROFILE_DIR
    result = RunResult(
        condition_id=run.condition_id,
        run_number=run.run_number,
        swept_axes=list(run.swept_axes),
        training_args=run.training_args,
        status=ERROR,
        steps_file=str(steps_file) if steps_file.exists() else "",
        profile_dir=str(profile) if (profile / PROFILE_FILE).exists() else "",
    )
    record_file = work_dir / RESULT_FILE
    if ending.stopped:  # killed because another rank of the run failed: what it measured is not a result
        result.status = STOPPED
        result.reason = f"stopped: {ending.stopped}"
        return result
    if record_file.exists() and not timed_out:
        outcome = ChildOutcome.from_json(record_file.read_text())
        fields = dataclasses.asdict(outcome)
        written_at = fields["written_at"]
        result = dataclasses.replace(result, **{k: v for k, v in fields.items() if k not in LAUNCHER_ONLY})
        if written_at and ending.ended_at >= written_at:  # the child's exit, after its record was written
            result.metrics["exit_s"] = ending.ended_at - written_at
        if result.status != OK and not result.error_tail:
            result.error_tail = _log_tail(work_dir)
        return result
    tail = _log_tail(work_dir)
    result.error_tail = tail
    if result.steps_file:  # the steps the child finished before it died, streamed as they ended
        with open(result.steps_file, encoding="utf-8") as steps:
            result.details["steps_completed"] = str(max(sum(1 for _ in steps) - 1, 0))
    if timed_out:
        result.status = TIMEOUT
        result.reason = (
            f"no result within the {timeout_s:g} s timeout (condition_timeout_s, or probes.timeout_s for a frontier's "
            "probe); the child was killed"
        )
    elif says_out_of_memory(tail):
        result.status = OOM
        result.reason = f"out of memory (the child exited with status {returncode} before writing a result)"
    elif returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (the host may have killed it for memory)" if name == "SIGKILL" else ""
        result.reason = f"the child was killed by {name}{hint}"
    else:
        result.reason = f"the child exited with status {returncode} without writing a result"
    return result


def run_or_reuse(
    run: PlannedRun,
    store: ResultStore,
    dataset_dir: Path,
    model_dir: Path,
    work_dir: Path,
    timeout_s: float,
    force_fresh: bool = False,
    sources: dict[str, str] | None = None,
) -> RunResult:
    """The stored result of `run` (same settings, sources, run number, hardware, software and measuring code) unless
    `force_fresh`; else train it in a child process (`run_in_child`) and store the result as soon as it ends.
    `sources`: the versions of the dataset and the model (`finetune_bench.sources.versions`), part of the key. Under a
    test-only switch that acts on the run (`running.faults.switches_on`) the store is neither read nor written, and a
    stored result a switch made is never reused.

    The store never costs a measurement: an entry that does not match its checksums is reported and measured
    again (and replaced); a store that cannot be read or written leaves the run measured, with the failure
    in its `problems` (the grid then ends with a failing status)."""
    if run.refused or run.predicted_oom:  # nothing measured: nothing stored
        return not_launched(run)
    switches = switches_on(run.name)
    if switches:  # a test-only switch makes no measurement: the store is neither read nor written
        result = run_in_child(run, dataset_dir, model_dir, work_dir, timeout_s)
        result.details["test_switches"] = ", ".join(switches)
        return result
    hardware = hardware_fingerprint()
    identity = run_identity(run, hardware, sources or {})
    key = identity_key(identity)
    name = f"{run.condition_id} run {run.run_number}"
    # Held from the lookup to the save: a grid started beside this one on the same machine waits, then reuses
    # this run instead of measuring it at the same time on the same device.
    with device_lock(hardware) as waited_s:
        looked_up = time.perf_counter()
        result, problems, notes = (
            (None, [], {}) if force_fresh else stored_result(store, key, Path(work_dir), name, run, identity)
        )
        store_s = time.perf_counter() - looked_up
        if result is not None:  # as it was stored (its own lookup's `store_s`): a resumed grid reports the same
            logger.warning("%s: %s", name, reuse_line(result, key))
            result.reused = True
        else:
            result = run_in_child(run, dataset_dir, model_dir, work_dir, timeout_s)
            result.details.update(notes)
            if not force_fresh:
                result.metrics["store_s"] = store_s
            problems.extend(save_result(store, key, result, identity, name))
            result.problems.extend(problems)
    if waited_s >= 1:
        result.details["waited_for_device_s"] = f"{waited_s:.0f}"
    return result


# How the problem of a run the results store could not keep begins.
STORE_PROBLEM = "results store:"


def save_result(store: ResultStore, key: str, result: RunResult, identity: dict, name: str) -> list[str]:
    """Keep `result` in the store as `key`; the problem (one line) when it could not be kept."""
    try:
        store.save(key, result, identity=identity)
    except StoreError as exc:
        logger.error("%s: %s", name, exc)
        return [f"{STORE_PROBLEM} {exc}; this run is not kept, a re-run of the grid measures it again"]
    return []


def stored_result(
    store: ResultStore, key: str, work_dir: Path, name: str, run: PlannedRun, identity: dict | None = None
) -> tuple[RunResult | None, list[str], dict]:
    """The stored result of `key` for `run` (None when there is none to reuse), the problems reading it, and notes
    for the run that replaces a corrupt entry. The key holds the settings, not the names: a run stored by a grid
    that named or swept its condition otherwise comes back under this grid's condition id and axes. `identity`: the
    run's (`run_identity`), which the entry's manifest must record."""
    try:
        stored = store.load(key, work_dir, identity)
        if stored is not None and made_under_a_test_switch(stored.reason, stored.error_tail):
            logger.warning("%s: stored entry %s was made under a test-only switch; measuring it again", name, key)
            return None, [], {"results_store": f"not reused: entry {key} was made under a test-only switch"}
        if stored is not None:
            stored.condition_id, stored.swept_axes = run.condition_id, list(run.swept_axes)
        return stored, [], {}
    except CorruptEntry as exc:
        logger.warning("%s: results store %s; measuring it again", name, exc)
        return None, [], {"results_store": f"replaced a corrupt stored entry ({exc})"}
    except StoreError as exc:
        logger.error("%s: %s; measuring it again", name, exc)
        return None, [f"results store: {exc}; the run was measured again"], {}
