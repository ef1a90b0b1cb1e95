"""Scripts run in fresh interpreters forked from a warm one, for the tests' crash trials.

A script that imports torch and makes an optimizer spends ~3.5 s importing (torch, then
torch._dynamo, which an optimizer imports) and ~1 s tearing the modules down at exit,
where its own work takes a second. The crash tests run hundreds of them. ``run`` asks a
server process (one per test process) that has imported torch, torch._dynamo and NumPy,
and nothing else, to fork; the child takes the caller's argv, working directory,
environment and standard streams, installs a new ``__main__`` and runs the script there, so
it starts as a new interpreter would, ckpt_nb imported afresh. It is a real process: it can
be killed with SIGKILL or interrupted with SIGINT, and its exit status is what the caller
sees. After the script it waits for its threads and runs its atexit callbacks as an
interpreter's exit does, then leaves without tearing down modules; an uncaught
exception other than SystemExit goes to the interpreter's own handling (its traceback,
exit 1, or -SIGINT for KeyboardInterrupt).

What environment variables change at start-up (PYTHON*, thread counts, torch's own) a
forked child cannot take, so each set of them has a server of its own.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

PRELOADED = ("torch", "torch._dynamo", "torch.utils.data", "numpy")
# Read at start-up: each set of their values has its own server.
START_UP_VARIABLES = ("PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS", "TORCH", "LD_",
                      "CUDA", "NUMPY", "MALLOC")
SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)  # (by importing torch._dynamo, in the server too)


class _Server:
    """A warm interpreter, started on first use with the start-up environment it serves."""

    def __init__(self, environment: dict[str, str]) -> None:
        self.directory = tempfile.mkdtemp(prefix="warm-python-")
        self.address = os.path.join(self.directory, "socket")
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.address], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=environment, cwd=self.directory)
        assert self.process.stdout is not None
        if self.process.stdout.readline() != b"ready\n":
            raise RuntimeError("the warm interpreter did not start")
        atexit.register(self.close)

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=30)
        shutil.rmtree(self.directory, ignore_errors=True)


_servers: dict[tuple[tuple[str, str], ...], _Server] = {}
_servers_lock = threading.Lock()


def _server_for(environment: dict[str, str]) -> _Server:
    """The server whose children start as an interpreter with this environment would."""
    start_up = tuple(sorted((name, value) for name, value in environment.items()
                            if name.startswith(START_UP_VARIABLES) and name not in SET_BY_TORCH))
    with _servers_lock:
        if start_up not in _servers:
            _servers[start_up] = _Server(environment)
        return _servers[start_up]


def run(argv: list[Any], *, cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None, timeout: float | None = None,
        input: str | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, text=True, capture_output=True, ...)`` for ``python
    script.py ...`` or ``python -c code ...``, forked from a warm interpreter."""
    environment = dict(os.environ if env is None else env)
    words = [str(word) for word in argv]
    if not (len(words) >= 2 and words[0] == sys.executable and not words[1].startswith("-")
            or len(words) >= 3 and words[0] == sys.executable and words[1] == "-c"):
        raise ValueError(f"not a script or -c run of this interpreter: {words}")
    done = _forked(_server_for(environment).address, words[1:],
                   os.path.abspath(cwd or os.getcwd()), environment, timeout, input)
    if check:
        done.check_returncode()
    return done


def _forked(address: str, words: list[str], cwd: str, environment: dict[str, str],
            timeout: float | None, input: str | None) -> subprocess.CompletedProcess[str]:
    stdin_read, stdin_write = os.pipe()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(address)
        request = json.dumps({"words": words, "cwd": cwd, "env": environment}).encode()
        socket.send_fds(connection, [request + b"\n"], [stdin_read, out_write, err_write])
    finally:
        for end in (stdin_read, out_write, err_write):
            os.close(end)
    replies = connection.makefile("rb")
    pid = int(replies.readline())
    pieces: dict[int, list[bytes]] = {out_read: [], err_read: []}
    pending = (input or "").encode()
    selector = selectors.DefaultSelector()
    for end in pieces:
        selector.register(end, selectors.EVENT_READ)
    if pending:
        os.set_blocking(stdin_write, False)
        selector.register(stdin_write, selectors.EVENT_WRITE)
    else:
        os.close(stdin_write)
        stdin_write = -1
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while selector.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired([sys.executable, *words], timeout or 0)
            for key, _ in selector.select(left):
                if key.fd == stdin_write:
                    try:
                        pending = pending[os.write(stdin_write, pending):]
                    except BrokenPipeError:
                        pending = b""
                    if not pending:
                        selector.unregister(stdin_write)
                        os.close(stdin_write)
                        stdin_write = -1
                    continue
                piece = os.read(key.fd, 65536)
                if piece:
                    pieces[key.fd].append(piece)
                else:
                    selector.unregister(key.fd)
        status = int(replies.readline())
    finally:
        selector.close()
        for end in (out_read, err_read, stdin_write):
            if end != -1:
                os.close(end)
        replies.close()
        connection.close()
    return subprocess.CompletedProcess([sys.executable, *words],
                                       os.waitstatus_to_exitcode(status),
                                       _as_text(pieces[out_read]), _as_text(pieces[err_read]))


def _as_text(pieces: list[bytes]) -> str:
    """As ``text=True`` reads a stream: UTF-8, universal newlines."""
    return b"".join(pieces).decode().replace("\r\n", "\n").replace("\r", "\n")


# -- the server's side --------------------------------------------------------------------

def _serve(address: str) -> dict[str, Any]:
    """Fork a child per request until the test process closes our stdin; return in the
    child, with its request, and never in the server."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    waiting: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    while True:
        for key, _ in selector.select(0.02):
            if key.fileobj is not listener:  # the test process is gone
                for pid in waiting:
                    os.kill(pid, signal.SIGKILL)
                os._exit(0)
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, 1 << 24, 3)
            while not message.endswith(b"\n"):
                message += connection.recv(1 << 24)
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                selector.close()
                listener.close()
                connection.close()
                for fd, target in zip(fds, (0, 1, 2)):
                    os.dup2(fd, target)
                    os.close(fd)
                return request
            for fd in fds:
                os.close(fd)
            connection.sendall(b"%d\n" % pid)
            waiting[pid] = connection
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = waiting.pop(pid, None)
            if connection is not None:
                try:
                    connection.sendall(b"%d\n" % status)
                except OSError:
                    pass
                connection.close()


def _start_as_a_new_interpreter(request: dict[str, Any]) -> types.CodeType:
    """Take the request's place: its directory, environment, argv, ``__main__``."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    words = request["words"]
    if words[0] == "-c":
        source, filename, sys.argv = words[1], "<string>", ["-c", *words[2:]]
        sys.path[0] = ""
    else:
        filename = words[0]
        source = Path(filename).read_text()
        sys.argv = words
        sys.path[0] = os.path.dirname(os.path.realpath(filename))
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    if filename != "<string>":
        main.__file__ = filename
    sys.modules["__main__"] = main
    import numpy
    numpy.random.seed()  # (random reseeds itself in a forked child; NumPy does not)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return compile(source, filename, "exec")


def _leave(code: int) -> None:
    """An interpreter's exit, less the teardown of its modules."""
    threading._shutdown()  # type: ignore[attr-defined]  (as Py_Finalize: threads first)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or 120
    os._exit(code)


def _exit_code(exit: SystemExit) -> int:
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.path.pop(0)  # (this file's directory: a child's script has its own)
    sys.path.insert(0, "")
    for name in PRELOADED:
        __import__(name)
    _request = _serve(sys.argv[1])
    _code = _start_as_a_new_interpreter(_request)
    try:
        exec(_code, sys.modules["__main__"].__dict__)
    except SystemExit as _exit:
        _leave(_exit_code(_exit))
    _leave(0)
