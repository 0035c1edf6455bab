"""The fork server's own process (`running.forkserver` is the launcher's side): it imports what every run's child
imports, checks that forking stays safe (`fork_hazards`), answers its launcher one ready line, then forks a keeper
per connection, which forks the run's child and reports its pid and exit status.

    python -m finetune_bench.running.forkserver_process FD      (FD: the listening Unix socket it inherits)
"""

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
import warnings

from finetune_bench.running.forkserver import NVML_CHECK_ENV, PRELOAD
from finetune_bench.running.worker import PARENT_PID_ENV, die_with_parent


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
    # Python 3.12 warns at every fork of a process with more than one thread, native ones included; this one forks
    # only once `fork_hazards` found no Python thread but its own (the native ones are fork-safe, see there).
    warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning)
    # The ready line goes to the launcher's pipe alone: what the imports print goes to stderr.
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    nvml_check = os.environ.get(NVML_CHECK_ENV)
    os.environ[NVML_CHECK_ENV] = "1"
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
        del os.environ[NVML_CHECK_ENV]
    else:
        os.environ[NVML_CHECK_ENV] = nvml_check
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
        ended = os.pidfd_open(child)
        while True:  # until the child ends, or its launcher does (its end of the connection closes): the child then
            readable, _, _ = select.select([connection, ended], [], [])
            if ended in readable:
                break
            if not connection.recv(1):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child, signal.SIGKILL)
                break
        _, status = os.waitpid(child, 0)
        with contextlib.suppress(OSError):  # a launcher that is gone hears nothing
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
