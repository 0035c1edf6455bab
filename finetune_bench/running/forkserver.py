"""A fork server: each run's child forked from a process that has already imported what every run imports.

A run's child was a fresh interpreter that imported torch, transformers, Liger (which imports torch._dynamo and
peft), TRL, datasets and the backends before it built its model: 16-20 s of a 31 s Llama-3.2-1B run on an H100
(`imports_s` in the run's timeline), paid by every run of a grid and every probe of a memory frontier. The server
imports them once per launching process; each run's child is forked from it and finds them imported. The first run
of a launching process waits for those imports (its `startup_s`); the others start in a fraction of a second.

What stays fresh in every child is what made a fresh interpreter per run worth having (`running.launch`): the server
never builds a model, applies a Liger patch or touches the GPU, so Liger's module-level patches, the CUDA context and
its caching allocator begin anew in each child. The server checks this after its imports (CUDA not initialized, no
Python thread but its own: `fork_hazards`) and says when it is not so: the launcher then starts a fresh interpreter
per run, as before, with a warning. A child also starts with torch's random generator as a fresh
interpreter has it and NumPy's reseeded from the system, as a fresh interpreter's would be.

The environment: a child runs with its own run's environment, but what is read while the modules are imported (for
example TRITON_INTERPRET, which decides how Liger's Triton kernels are defined, or PYTORCH_CUDA_ALLOC_CONF) must be
the server's own. A child's environment may differ from its server's only in `RUNTIME_ENV`, variables this project
reads while a run runs; a run whose environment differs in anything else gets a server of its own (`start_child`).

Processes: the launcher starts the server (`python -m finetune_bench.running.forkserver_process FD`, FD a listening
socket), which imports, answers one `ready` line and serves one connection per run: it forks a keeper for the
connection, the keeper forks the run's child and reports its pid, then its exit status as `subprocess.Popen` has it
(negative: the signal that ended it). The child starts a session of its own, as a child of `subprocess.Popen(...,
start_new_session=True)` did (a timeout kills its whole process group), and dies with its keeper, the keeper with
the server, the server as soon as the launcher's pipe to it closes (however the launcher ended).
The keeper also watches its connection: a launcher gone before its child (killed with SIGKILL, say) takes the
child's process group with it.

Ranks: a run on several GPUs is one PyTorch Elastic launch per run, whose rank processes (`running.ranks`) each
supervise one training child. The process that launches them (the Elastic task's own process, which runs one
launch after another locally) offers them a server of its own (`offered_to_ranks`), started as the launch begins,
so that its imports overlap the ranks' start and are paid once per grid rather than once per rank and run. The
ranks find it through `NODE_SERVER_ENV` (its address and the environment it imported under); a rank's child runs
with that environment and the rank's own `RUNTIME_ENV` and `LAUNCH_ENV` (what PyTorch Elastic sets per rank).
`FINETUNE_BENCH_FORK_SERVER=0` turns the server off: a fresh interpreter per run.
"""

import atexit
import contextlib
import json
import logging
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from finetune_bench.running import faults
from finetune_bench.running.worker import (
    COLLECTIVE_TIMEOUT_ENV,
    LAUNCHED_AT_ENV,
    PARENT_PID_ENV,
    PROCESS_GROUP_NAMESPACE_ENV,
)

logger = logging.getLogger(__name__)

ENABLED_ENV = "FINETUNE_BENCH_FORK_SERVER"
WORKER_MODULE = "finetune_bench.running.worker"
SERVER_MODULE = "finetune_bench.running.forkserver_process"
# What every run's child imports, as far as it can be imported without initializing CUDA: transformers.modeling_utils
# (and so every model class, peft, Liger's model patches, TRL and the backends) imports torchao when it is installed,
# and torchao's import asks PyTorch for the GPU's properties (`torch.utils._triton.has_triton`), which initializes
# CUDA; the child imports those itself. A module that cannot be imported here (scikit-learn, an optional import of
# transformers') is left to the child, which fails as it would have.
PRELOAD = (
    "torch",
    "numpy",
    "torch._dynamo",  # Liger's import of torch._dynamo was 7 of a run's 17 s of imports on an H100
    "triton",
    "triton.language",
    "transformers",
    "transformers.configuration_utils",
    "transformers.tokenization_utils_base",
    "datasets",
    "pyarrow",
    "pandas",
    "scipy.stats",
    "sklearn.metrics",
    "safetensors",
    "tokenizers",
    "accelerate",
    "wandb",
    WORKER_MODULE,
)
# The server a rank's child forks from (`offered_to_ranks`): its address and the environment it imported under, as
# JSON.
NODE_SERVER_ENV = "FINETUNE_BENCH_NODE_FORK_SERVER"
# Read while a run runs (never at import): a child's value may differ from its server's.
RUNTIME_ENV = frozenset(
    {
        faults.RUN_ENV,
        faults.FAULT_ENV,
        faults.FAKE_MEMORY_ENV,
        faults.LAUNCHER_PID_ENV,
        LAUNCHED_AT_ENV,
        COLLECTIVE_TIMEOUT_ENV,
        PROCESS_GROUP_NAMESPACE_ENV,
        PARENT_PID_ENV,
        NODE_SERVER_ENV,
    }
)
# Set by PyTorch Elastic for each rank (torch.distributed.elastic's LocalElasticAgent), read when the rank's process
# group starts, never at import: a rank's child and its node's server may differ in them.
LAUNCH_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    }
)
LAUNCH_ENV_PREFIX = "TORCHELASTIC_"
# Servers kept with no run in flight (each holds the imported modules' memory, about a gigabyte).
MAX_IDLE_SERVERS = 2
_READY_TIMEOUT_S = 900
_CLOSE_GRACE_S = 5
# torch.cuda.is_available() by NVML, which leaves the CUDA driver uninitialized (a fork after cuInit is unusable).
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether runs start from a fork server here: on Linux, unless `FINETUNE_BENCH_FORK_SERVER=0`."""
    return sys.platform.startswith("linux") and environ.get(ENABLED_ENV, "1") != "0"


# ---------------------------------------------------------------------------------------------------------------
# The launcher's side.


class ForkedChild:
    """A run's child forked by a server, with what `running.launch` uses of a `subprocess.Popen`: `pid`,
    `wait(timeout)` (raising `subprocess.TimeoutExpired`) and `returncode`."""

    def __init__(self, connection: socket.socket, args: list[str], server: "_Server | None") -> None:
        self.args = args
        self.returncode: int | None = None
        self._connection = connection
        self._buffer = b""
        self._server = server
        words = self._line(None).split()
        if len(words) != 2 or words[0] != "pid":
            raise ForkServerError(f"the fork server answered {' '.join(words)!r} where a pid was due")
        self.pid = int(words[1])

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            words = line.split()
            if len(words) == 2 and words[0] == "exit":
                self.returncode = int(words[1])
            else:  # the keeper is gone (the server with it): the child died with it, by SIGKILL
                logger.error("the fork server's keeper of child %d ended without its exit status", self.pid)
                self.returncode = -signal.SIGKILL
            self._connection.close()
            if self._server is not None:  # one of this process's (a node's server is its launcher's)
                self._server.release()
        return self.returncode

    def _line(self, timeout: float | None) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._connection.settimeout(remaining)
            try:
                data = self._connection.recv(4096)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            if not data:
                return ""
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()


class ForkServerError(RuntimeError):
    """The fork server could not start or serve a child (the launcher then starts a fresh interpreter)."""


@dataclass
class _Server:
    process: subprocess.Popen
    address: bytes
    in_flight: int = 0
    last_used: float = field(default_factory=time.monotonic)
    # What the server could not import (the child imports it, and fails as a fresh interpreter would).
    not_imported: dict[str, str] = field(default_factory=dict)
    preload_s: float = 0.0
    # Its ready line read (`await_ready`): until then a connection waits in the listener's queue.
    ready: bool = False

    def await_ready(self) -> None:
        """Read the server's ready line (once its imports are done); ForkServerError when it did not start or
        cannot fork safely (the server is closed then)."""
        if self.ready:
            return
        stdout = self.process.stdout
        ready, _, _ = select.select([stdout], [], [], _READY_TIMEOUT_S)
        line = stdout.readline().decode() if ready else ""
        try:
            answer = json.loads(line)
        except ValueError:
            self.close()
            raise ForkServerError(
                f"the fork server did not start (exit status {self.process.poll()}, answer {line.strip()[:200]!r})"
            ) from None
        if answer.get("unsafe"):
            self.close()
            raise ForkServerError(f"the fork server cannot fork safely: {answer['unsafe']}")
        self.not_imported, self.preload_s, self.ready = (
            answer.get("not_imported", {}),
            answer.get("preload_s", 0.0),
            True,
        )
        logger.info("fork server pid %d ready in %.1f s%s", self.process.pid, self.preload_s,
                    f"; not imported: {self.not_imported}" if self.not_imported else "")  # fmt: skip

    def release(self) -> None:
        with _LOCK:
            self.in_flight -= 1
            self.last_used = time.monotonic()

    def close(self) -> None:
        """End the server: its stdin closes, it exits, and its keepers and their children die with it."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=_CLOSE_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


_LOCK = threading.Lock()
_SERVERS: dict[tuple, _Server] = {}
# Environments whose server could not serve (the reason, warned once): a fresh interpreter per run for them.
_REFUSED: dict[tuple, str] = {}


def _imported_under(name: str) -> bool:
    """Whether the variable `name` may be read while the server imports (not `RUNTIME_ENV` nor `LAUNCH_ENV`)."""
    return name not in RUNTIME_ENV and name not in LAUNCH_ENV and not name.startswith(LAUNCH_ENV_PREFIX)


def server_key(env: Mapping[str, str]) -> tuple:
    """What a server's environment must share with a child's: all but `RUNTIME_ENV` and `LAUNCH_ENV`."""
    return tuple(sorted((name, value) for name, value in env.items() if _imported_under(name)))


def start_child(module_args: list[str], log_path: Path, env: Mapping[str, str]) -> ForkedChild | None:
    """Fork `python -m finetune_bench.running.worker <module_args>` with `env`, its output appended to `log_path`,
    from the server for `env` (started now if there is none); None when no server can: the caller starts a fresh
    interpreter."""
    if NODE_SERVER_ENV in env:
        return _start_at_node_server(env[NODE_SERVER_ENV], module_args, log_path, env)
    key = server_key(env)
    with _LOCK:
        server = _acquire(key, env)
        if server is None:
            return None
        try:
            server.await_ready()
        except ForkServerError as exc:
            _refuse(key, exc)
            return None
    child = _request_child(server.address, module_args, log_path, env, server)
    if child is None:
        server.release()
    return child


def _request_child(
    address: bytes, module_args: list[str], log_path: Path, env: Mapping[str, str], server: _Server | None
) -> ForkedChild | None:
    """Ask the server at `address` for the run's child; None (said) when it cannot start one."""
    request = {"argv": module_args, "env": dict(env), "cwd": os.getcwd(), "log": str(log_path)}
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(address)
        connection.sendall(json.dumps(request).encode() + b"\n")
        return ForkedChild(connection, [sys.executable, "-m", WORKER_MODULE, *module_args], server)
    except (OSError, ForkServerError, ValueError) as exc:
        connection.close()
        logger.warning("the fork server could not start a child (%s); this run starts a fresh interpreter", exc)
        return None


def _start_at_node_server(
    offered: str, module_args: list[str], log_path: Path, env: Mapping[str, str]
) -> ForkedChild | None:
    """A rank's child forked by the server its launcher offered (`offered_to_ranks`). The child's environment is the
    one the server imported under, with this rank's own `RUNTIME_ENV` and `LAUNCH_ENV` variables: what this rank's
    process has besides (set by what it imported, or by the launch's machinery) is not passed on, as it is not read
    where a fresh interpreter would read it."""
    node = json.loads(offered)
    return _request_child(bytes.fromhex(node["address"]), module_args, log_path, rank_child_env(node["env"], env), None)


def rank_child_env(imported_under: Mapping[str, str], rank_env: Mapping[str, str]) -> dict[str, str]:
    """A rank's child's environment: the one its node's server imported under, with the rank's own `RUNTIME_ENV`
    and `LAUNCH_ENV` variables from `rank_env` (all but the server's address)."""
    own = {name: value for name, value in rank_env.items() if not _imported_under(name) and name != NODE_SERVER_ENV}
    return {**imported_under, **own}


def _acquire(key: tuple, env: Mapping[str, str]) -> _Server | None:
    """The server for `key` (one that exited replaced; started now, without waiting for its imports, if there is
    none), counted in flight; None when servers for `key` were refused (`_refuse`). Called under `_LOCK`."""
    if key in _REFUSED:
        return None
    server = _SERVERS.get(key)
    if server is not None and server.process.poll() is not None:
        logger.warning("the fork server (pid %d) had exited with %s; starting another", server.process.pid,
                       server.process.returncode)  # fmt: skip
        del _SERVERS[key]
        server = None
    if server is None:
        try:
            server = _start_server({name: value for name, value in env.items() if name not in RUNTIME_ENV})
        except ForkServerError as exc:
            _refuse(key, exc)
            return None
        _SERVERS[key] = server
        _close_idle_servers(keep=server)
    server.in_flight += 1
    return server


def _refuse(key: tuple, exc: ForkServerError) -> None:
    """No server for `key` from now on (said once): its runs start fresh interpreters. Called under `_LOCK`."""
    _SERVERS.pop(key, None)
    _REFUSED[key] = str(exc)
    logger.warning("%s; each run starts a fresh interpreter instead", exc)


@contextlib.contextmanager
def offered_to_ranks(env: Mapping[str, str]) -> Iterator[None]:
    """Offer the ranks this process launches in this block a server for children of environment `env` (the server
    for it, started now if there is none, without waiting for its imports): `NODE_SERVER_ENV` in this process's
    environment, which the ranks inherit. The server stays for later launches, as any of this process's."""
    key = server_key(env)
    with _LOCK:
        server = _acquire(key, env)
    if server is None:
        yield
        return
    imported_under = {name: value for name, value in env.items() if _imported_under(name)}
    os.environ[NODE_SERVER_ENV] = json.dumps({"address": server.address.hex(), "env": imported_under})
    try:
        yield
    finally:
        os.environ.pop(NODE_SERVER_ENV, None)
        server.release()
        with _LOCK:
            try:
                server.await_ready()  # what it could not import, or why it could not serve, is said once here
            except ForkServerError as exc:
                _refuse(key, exc)


def _start_server(env: dict[str, str]) -> _Server:
    """Start a server importing under `env` (ForkServerError: it cannot be started); its ready line is read later
    (`_Server.await_ready`)."""
    address = f"\0finetune-bench-forkserver-{os.getpid()}-{secrets.token_hex(8)}".encode()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
        listener.listen(64)
        process = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, str(listener.fileno())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            pass_fds=[listener.fileno()],
            start_new_session=True,  # a Ctrl-C at the terminal is the launcher's to handle
        )
    finally:
        listener.close()  # the server's copy listens
    return _Server(process, address)


def _close_idle_servers(keep: _Server) -> None:
    """Close the least recently used idle servers beyond `MAX_IDLE_SERVERS` (a server with a run in flight stays)."""
    idle = sorted(
        ((key, server) for key, server in _SERVERS.items() if server.in_flight == 0 and server is not keep),
        key=lambda item: item[1].last_used,
    )
    for key, server in idle[: max(len(idle) + 1 - MAX_IDLE_SERVERS, 0)]:
        del _SERVERS[key]
        server.close()


@atexit.register
def close_servers() -> None:
    """End every server of this process (at its exit; tests call it to start afresh)."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
        _REFUSED.clear()
    for server in servers:
        server.close()
