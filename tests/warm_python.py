"""Fresh interpreters forked from a warm one, for the tests' scripts and commands.

A script that imports torch and makes an optimizer spends ~3.5 s importing (torch, then
torch._dynamo, which an optimizer imports) and ~1 s tearing the modules down at exit,
where its own work takes a second; ``python -m ckpt_nb`` imports torch too. The tests
start hundreds of them. ``Popen`` and ``run`` ask a server process (one per test process)
that has imported torch, torch._dynamo and NumPy, and nothing else, to fork; the child
takes the caller's argv (a script, ``-c`` code or ``-m`` module), working directory,
environment and standard streams, and runs as ``__main__``, so it starts as a new
interpreter would, ckpt_nb imported afresh. It is a real process: it can be killed with
SIGKILL or interrupted with SIGINT, and its exit status is what the caller sees. After its
code it waits for its threads and runs its atexit callbacks as an interpreter's exit does,
then leaves without tearing down modules; an uncaught exception other than SystemExit
goes to the interpreter's own handling (its traceback, exit 1, or -SIGINT for
KeyboardInterrupt). What cannot be told apart from a fresh interpreter is torch already
imported: a test of what happens before torch loads starts a real one.

``fork_kernels`` has jupyter_client start its ipykernels the same way, from a server that
has imported ipykernel as well; a kernel started by a Jupyter server in another process (the
browser test's) is a fresh interpreter still.

What environment variables change at start-up (PYTHON*, thread counts, torch's own) a
forked child cannot take, so each set of them has a server of its own.
"""
from __future__ import annotations

import atexit
import io
import json
import os
import runpy
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
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

PRELOADED = ("torch", "torch._dynamo", "torch.utils.data", "numpy")
# A kernel's server also holds what ipykernel imports before its first cell; scripts get a
# server without them, so that nothing they check finds IPython already imported.
KERNEL_PRELOADED = (*PRELOADED, "ipykernel.kernelapp")
# Read at start-up: each set of their values has its own server.
START_UP_VARIABLES = ("PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS", "TORCH", "LD_",
                      "CUDA", "NUMPY", "MALLOC")
SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)  # (by importing torch._dynamo, in the server too)


class _Server:
    """A warm interpreter, started on first use with the start-up environment it serves."""

    def __init__(self, environment: dict[str, str], preloaded: tuple[str, ...]) -> None:
        self.directory = tempfile.mkdtemp(prefix="warm-python-")
        self.address = os.path.join(self.directory, "socket")
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.address, *preloaded], stdin=subprocess.PIPE,
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
        assert self.process.stdout is not None
        self.process.stdout.close()
        shutil.rmtree(self.directory, ignore_errors=True)


_servers: dict[tuple[object, ...], _Server] = {}
_servers_lock = threading.Lock()


def _server_for(environment: dict[str, str], preloaded: tuple[str, ...]) -> _Server:
    """The server whose children start as an interpreter with this environment would."""
    start_up = tuple(sorted((name, value) for name, value in environment.items()
                            if name.startswith(START_UP_VARIABLES) and name not in SET_BY_TORCH))
    with _servers_lock:
        if (start_up, preloaded) not in _servers:
            _servers[start_up, preloaded] = _Server(environment, preloaded)
        return _servers[start_up, preloaded]


def _words(argv: list[Any]) -> list[str]:
    words = [str(word) for word in argv]
    if not (len(words) >= 2 and words[0] == sys.executable and not words[1].startswith("-")
            or len(words) >= 3 and words[0] == sys.executable and words[1] in ("-c", "-m")):
        raise ValueError(f"not a script, -c or -m run of this interpreter: {words}")
    return words


class Popen:
    """``subprocess.Popen`` for ``python script.py ...``, ``python -c code ...`` or
    ``python -m module ...``, forked from a warm interpreter: each of stdin, stdout and
    stderr is PIPE, DEVNULL, a file descriptor or file object, or None (this process's).
    ``start_new_session``: the child is a session's leader (its process group's too) before
    its pid comes back, as ``subprocess.Popen``'s is."""

    def __init__(self, argv: list[Any], *, cwd: str | os.PathLike[str] | None = None,
                 env: dict[str, str] | None = None, stdin: Any = None, stdout: Any = None,
                 stderr: Any = None, text: bool = False, start_new_session: bool = False,
                 preloaded: tuple[str, ...] = PRELOADED) -> None:
        self.args = _words(argv)
        environment = dict(os.environ if env is None else env)
        self.returncode: int | None = None
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        given: list[int] = []
        theirs: list[int] = []  # (ends opened here for the child: closed once it has them)
        for number, (asked, reading) in enumerate([(stdin, False), (stdout, True),
                                                   (stderr, True)]):
            if asked == subprocess.PIPE:
                read_end, write_end = os.pipe()
                ours, child = (read_end, write_end) if reading else (write_end, read_end)
                mode = ("r" if reading else "w") + ("" if text else "b")
                stream = os.fdopen(ours, mode, buffering=-1 if text else 0,
                                   **({"encoding": "utf-8"} if text else {}))
                setattr(self, ("stdin", "stdout", "stderr")[number], stream)
                theirs.append(child)
            elif asked == subprocess.DEVNULL:
                child = os.open(os.devnull, os.O_RDWR)
                theirs.append(child)
            elif asked is None:
                child = number
            else:
                child = asked if isinstance(asked, int) else asked.fileno()
            given.append(child)
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._connection.connect(_server_for(environment, preloaded).address)
            request = json.dumps({"words": self.args[1:], "env": environment,
                                  "cwd": os.path.abspath(cwd or os.getcwd()),
                                  "new_session": start_new_session}).encode()
            socket.send_fds(self._connection, [request + b"\n"], given)
        finally:
            for end in theirs:
                os.close(end)
        self._received = b""
        line = self._line(timeout=None)
        assert line is not None
        self.pid = int(line)

    def poll(self) -> int | None:
        return self._status(block=False)

    def wait(self, timeout: float | None = None) -> int:
        status = self._status(block=True, timeout=timeout)
        if status is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return status

    def _status(self, block: bool, timeout: float | None = None) -> int | None:
        """The exit status, once the server has sent it (waiting ``timeout`` if ``block``)."""
        if self.returncode is None:
            line = self._line(timeout if block else 0)
            if line is None:
                return None
            self.returncode = os.waitstatus_to_exitcode(int(line))
            self._connection.close()
        return self.returncode

    def _line(self, timeout: float | None) -> bytes | None:
        """The server's next line, or None if none came within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._received:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            self._connection.settimeout(left)
            try:
                piece = self._connection.recv(4096)
            except (BlockingIOError, TimeoutError):
                return None
            if not piece:
                raise RuntimeError(f"the warm interpreter's server went away: {self.args}")
            self._received += piece
        line, self._received = self._received.split(b"\n", 1)
        return line

    def communicate(self, input: Any = None, timeout: float | None = None
                    ) -> tuple[Any, Any]:
        """Write ``input``, read stdout and stderr to their ends, then wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = b""
        if self.stdin is not None:
            pending = input.encode() if isinstance(input, str) else (input or b"")
            self.stdin.flush()
            stdin_fd = self.stdin.fileno()
            os.set_blocking(stdin_fd, False)
        read: dict[int, list[bytes]] = {stream.fileno(): [] for stream in (self.stdout,
                                                                            self.stderr)
                                        if stream is not None}
        selector = selectors.DefaultSelector()
        for fd in read:
            selector.register(fd, selectors.EVENT_READ)
        if self.stdin is not None:
            if pending:
                selector.register(stdin_fd, selectors.EVENT_WRITE)
            else:
                self.stdin.close()
        try:
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                for key, _ in selector.select(left):
                    if key.fd in read:
                        piece = os.read(key.fd, 65536)
                        if piece:
                            read[key.fd].append(piece)
                        else:
                            selector.unregister(key.fd)
                        continue
                    try:
                        pending = pending[os.write(key.fd, pending):]
                    except BrokenPipeError:
                        pending = b""
                    if not pending:
                        selector.unregister(key.fd)
                        assert self.stdin is not None
                        self.stdin.close()
        finally:
            selector.close()
        said = []
        for stream in (self.stdout, self.stderr):
            if stream is None:
                said.append(None)
                continue
            data = b"".join(read[stream.fileno()])
            stream.close()
            said.append(_as_text(data) if isinstance(stream, io.TextIOBase) else data)
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0))
        return said[0], said[1]

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def __enter__(self) -> Popen:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr, self.stdin):
            if stream is not None and not stream.closed:
                stream.close()
        self.wait()


def run(argv: list[Any], *, cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None, timeout: float | None = None,
        input: str | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, text=True, capture_output=True, ...)``, forked from a warm
    interpreter (see Popen)."""
    with Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
               stderr=subprocess.PIPE, text=True) as process:
        try:
            out, err = process.communicate(input, timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def kernel_popen(cmd: list[str], **options: Any) -> Any:
    """What jupyter_client's launcher starts a kernel with: an ipykernel of this interpreter
    is forked from a warm one that has imported ipykernel too (``KERNEL_PRELOADED``); any
    other command, or options ``Popen`` here does not take, start as they would."""
    if (cmd[:3] == [sys.executable, "-m", "ipykernel_launcher"]
            and set(options) <= {"stdin", "stdout", "stderr", "cwd", "env",
                                 "start_new_session"}):
        return Popen(cmd, preloaded=KERNEL_PRELOADED, **options)
    return subprocess.Popen(cmd, **options)


def fork_kernels() -> None:
    """Have every kernel jupyter_client starts in this process come from ``kernel_popen``."""
    import jupyter_client.launcher
    jupyter_client.launcher.Popen = kernel_popen  # type: ignore[assignment,misc]


def _as_text(data: bytes) -> str:
    """As ``text=True`` reads a stream: UTF-8, universal newlines."""
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


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
            started, starting = os.pipe()
            pid = os.fork()
            if pid == 0:
                if request["new_session"]:
                    os.setsid()
                os.close(started)
                os.close(starting)  # (the pid goes out once the session is there)
                selector.close()
                listener.close()
                connection.close()
                for fd, target in zip(fds, (0, 1, 2)):
                    os.dup2(fd, target)
                    os.close(fd)
                return request
            os.close(starting)
            os.read(started, 1)
            os.close(started)
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


def _start_as_a_new_interpreter(request: dict[str, Any]) -> Callable[[], object]:
    """Take the request's place (its directory, environment, argv, standard streams);
    return what runs its script, module or code as ``__main__``."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.stdout.reconfigure(line_buffering=os.isatty(1))  # (as a new interpreter sets it)
    import numpy
    numpy.random.seed()  # (random reseeds itself in a forked child; NumPy does not)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    words = request["words"]
    if words[0] == "-m":
        sys.argv = ["-m", *words[2:]]
        sys.path[0] = os.getcwd()
        return lambda: runpy._run_module_as_main(words[1])  # type: ignore[attr-defined]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    if words[0] == "-c":
        source, filename, sys.argv = words[1], "<string>", ["-c", *words[2:]]
        sys.path[0] = ""
    else:
        filename = main.__file__ = words[0]
        source = Path(filename).read_text()
        sys.argv = words
        sys.path[0] = os.path.dirname(os.path.realpath(filename))
    sys.modules["__main__"] = main
    code = compile(source, filename, "exec")
    return lambda: exec(code, main.__dict__)


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
    for name in sys.argv[2:]:
        __import__(name)
    _run_it = _start_as_a_new_interpreter(_serve(sys.argv[1]))
    try:
        _run_it()
    except SystemExit as _exit:
        _leave(_exit_code(_exit))
    _leave(0)
