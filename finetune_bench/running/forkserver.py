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

Processes: the launcher starts the server (`python -m finetune_bench.running.forkserver FD`, FD a listening Unix
socket), which imports, answers one `ready` line and serves one connection per run: it forks a keeper for the
connection, the keeper forks the run's child and reports its pid, then its exit status as `subprocess.Popen` has it
(negative: the signal that ended it). The child starts a session of its own, as a child of `subprocess.Popen(...,
start_new_session=True)` did (a timeout kills its whole process group), and dies with its keeper, the keeper with
the server, the server as soon as the launcher's pipe to it closes (however the launcher ended).
`FINETUNE_BENCH_FORK_SERVER=0` turns the server off: a fresh interpreter per run.
"""

import atexit
import contextlib
import importlib
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
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from finetune_bench.running import faults
from finetune_bench.running.worker import COLLECTIVE_TIMEOUT_ENV, LAUNCHED_AT_ENV, PARENT_PID_ENV, die_with_parent

logger = logging.getLogger(__name__)

ENABLED_ENV = "FINETUNE_BENCH_FORK_SERVER"
WORKER_MODULE = "finetune_bench.running.worker"
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
# Read while a run runs (never at import): a child's value may differ from its server's.
RUNTIME_ENV = frozenset(
    {
        faults.RUN_ENV,
        faults.FAULT_ENV,
        faults.FAKE_MEMORY_ENV,
        faults.LAUNCHER_PID_ENV,
        LAUNCHED_AT_ENV,
        COLLECTIVE_TIMEOUT_ENV,
        PARENT_PID_ENV,
    }
)
# Servers kept with no run in flight (each holds the imported modules' memory, about a gigabyte).
MAX_IDLE_SERVERS = 2
_READY_TIMEOUT_S = 900
_CLOSE_GRACE_S = 5
# torch.cuda.is_available() by NVML, which leaves the CUDA driver uninitialized (a fork after cuInit is unusable).
_NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether runs start from a fork server here: on Linux, unless `FINETUNE_BENCH_FORK_SERVER=0`."""
    return sys.platform.startswith("linux") and environ.get(ENABLED_ENV, "1") != "0"


# ---------------------------------------------------------------------------------------------------------------
# The launcher's side.


class ForkedChild:
    """A run's child forked by a server, with what `running.launch` uses of a `subprocess.Popen`: `pid`,
    `wait(timeout)` (raising `subprocess.TimeoutExpired`) and `returncode`."""

    def __init__(self, connection: socket.socket, args: list[str], server: "_Server") -> None:
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


def server_key(env: Mapping[str, str]) -> tuple:
    """What a server's environment must share with a child's: all but `RUNTIME_ENV`."""
    return tuple(sorted((name, value) for name, value in env.items() if name not in RUNTIME_ENV))


def start_child(module_args: list[str], log_path: Path, env: Mapping[str, str]) -> ForkedChild | None:
    """Fork `python -m finetune_bench.running.worker <module_args>` with `env`, its output appended to `log_path`,
    from the server for `env` (started now if there is none); None when no server can: the caller starts a fresh
    interpreter."""
    key = server_key(env)
    with _LOCK:
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
                _REFUSED[key] = str(exc)
                logger.warning("%s; each run starts a fresh interpreter instead", exc)
                return None
            _SERVERS[key] = server
            _close_idle_servers(keep=server)
        server.in_flight += 1
    request = {"argv": module_args, "env": dict(env), "cwd": os.getcwd(), "log": str(log_path)}
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(server.address)
        connection.sendall(json.dumps(request).encode() + b"\n")
        return ForkedChild(connection, [sys.executable, "-m", WORKER_MODULE, *module_args], server)
    except (OSError, ForkServerError, ValueError) as exc:
        connection.close()
        server.release()
        logger.warning("the fork server could not start a child (%s); this run starts a fresh interpreter", exc)
        return None


def _start_server(env: dict[str, str]) -> _Server:
    address = f"\0finetune-bench-forkserver-{os.getpid()}-{secrets.token_hex(8)}".encode()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
        listener.listen(64)
        process = subprocess.Popen(
            [sys.executable, "-m", "finetune_bench.running.forkserver", str(listener.fileno())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            pass_fds=[listener.fileno()],
            start_new_session=True,  # a Ctrl-C at the terminal is the launcher's to handle
        )
    finally:
        listener.close()  # the server's copy listens
    server = _Server(process, address)
    ready, _, _ = select.select([process.stdout], [], [], _READY_TIMEOUT_S)
    line = process.stdout.readline().decode() if ready else ""
    try:
        answer = json.loads(line)
    except ValueError:
        server.close()
        raise ForkServerError(
            f"the fork server did not start (exit status {process.poll()}, answer {line.strip()[:200]!r})"
        ) from None
    if answer.get("unsafe"):
        server.close()
        raise ForkServerError(f"the fork server cannot fork safely: {answer['unsafe']}")
    server.not_imported, server.preload_s = answer.get("not_imported", {}), answer.get("preload_s", 0.0)
    logger.info("fork server pid %d ready in %.1f s%s", process.pid, server.preload_s,
                f"; not imported: {server.not_imported}" if server.not_imported else "")  # fmt: skip
    return server


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


# ---------------------------------------------------------------------------------------------------------------
# The server's side.


def fork_hazards() -> str:
    """Why forking this process would not give a child a fresh start ("" when it would): CUDA initialized (a CUDA
    context cannot cross a fork), or a Python thread besides this one (a fork copies only the forking thread, and
    the locks the others held stay held). Native threads that libraries start and make safe across a fork with
    their own fork handlers (PyTorch's thread pools, Arrow's jemalloc) are the same as in any process a
    DataLoader forks its workers from."""
    hazards = []
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        hazards.append("CUDA was initialized by the imports")
    others = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
    if others:
        hazards.append(f"the imports left Python threads running ({', '.join(others)})")
    return "; ".join(hazards)


def serve(listener_fd: int) -> None:
    started = time.monotonic()
    # The ready line goes to the launcher's pipe alone: what the imports print goes to stderr.
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    nvml_check = os.environ.get(_NVML_CHECK_ENV)
    os.environ[_NVML_CHECK_ENV] = "1"
    fresh_rng = None
    not_imported: dict[str, str] = {}
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # reported in the ready line; the child imports it and fails as it would have
            not_imported[name] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
        if name == "torch" and "torch" in sys.modules:
            fresh_rng = sys.modules["torch"].random.get_rng_state()
    if nvml_check is None:
        del os.environ[_NVML_CHECK_ENV]
    else:
        os.environ[_NVML_CHECK_ENV] = nvml_check
    unsafe = fork_hazards()
    answer = {"preload_s": time.monotonic() - started, "not_imported": not_imported, "unsafe": unsafe}
    sys.stdout.flush()
    os.write(answer_fd, (json.dumps(answer) + "\n").encode())
    os.close(answer_fd)
    if unsafe:
        return
    listener = socket.socket(fileno=listener_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the keepers are reaped by the kernel
    server_pid = os.getpid()
    while True:
        readable, _, _ = select.select([listener, sys.stdin.fileno()], [], [])
        if sys.stdin.fileno() in readable and not os.read(sys.stdin.fileno(), 4096):
            return  # the launcher closed its end, or ended: so does the server, and its keepers die with it
        if listener in readable:
            connection, _ = listener.accept()
            if os.fork() == 0:
                _keep(connection, listener, server_pid, fresh_rng)  # never returns
            connection.close()


def _keep(connection: socket.socket, listener: socket.socket, server_pid: int, fresh_rng: object) -> None:
    """The keeper of one connection: fork the run's child, report its pid and then its exit status."""
    code = 1
    try:
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _die_with(server_pid)
        reader = connection.makefile("rb")
        request = json.loads(reader.readline())
        reader.close()
        session_r, session_w = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(session_r)
            _run_child(request, connection, fresh_rng, session_w)  # never returns
        os.close(session_w)
        # The pid goes out once the child leads its own process group: a launcher that kills the group at once (a
        # timeout that ran out while the server started) then reaches it.
        os.read(session_r, 1)
        os.close(session_r)
        connection.sendall(f"pid {child}\n".encode())
        _, status = os.waitpid(child, 0)
        connection.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _run_child(request: dict, connection: socket.socket, fresh_rng: object, session_ready: int) -> None:
    """The run's child: its own session (said on `session_ready`), output, directory and environment, then the
    worker's main."""
    code = 1
    try:
        keeper = os.getppid()
        connection.close()
        os.setsid()
        os.write(session_ready, b"1")
        os.close(session_ready)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[PARENT_PID_ENV] = str(keeper)  # the worker dies with its keeper (which dies with the server)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if fresh_rng is not None:
            sys.modules["torch"].random.set_rng_state(fresh_rng)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        from finetune_bench.running import worker

        sys.argv = [worker.__file__, *request["argv"]]
        try:
            code = worker.main(request["argv"])
        except SystemExit as exc:  # argparse's refusal, say
            code = exc.code if isinstance(exc.code, int) else 1
        worker.end_process(code)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _die_with(parent: int) -> None:
    """SIGKILL this process when `parent` ends (at once if it already has)."""
    os.environ[PARENT_PID_ENV] = str(parent)
    die_with_parent()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
