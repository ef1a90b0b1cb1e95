"""The crash tests' forked interpreters (warm_python) start and end as fresh ones would:
argv, ``__main__``, directory, environment, streams and exit status are the script's own,
ckpt_nb is imported afresh, and an exit waits for threads and runs atexit callbacks."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import warm_python

SCRIPT = """
import atexit, os, sys, threading, time
import numpy
print(sys.argv, __name__, __file__, os.getcwd(), os.environ["ASKED"], sys.path[0])
print("ckpt_nb" in sys.modules, "torch" in sys.modules, "IPython" in sys.modules,
      numpy.random.random())
print("to stderr", file=sys.stderr)
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread ended"))).start()
"""


def test_a_script_runs_as_in_a_fresh_interpreter(tmp_path: Path) -> None:
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    env = {**os.environ, "ASKED": "yes"}
    runs = [warm_python.run([sys.executable, path, "a", 1], cwd=tmp_path, env=env)
            for _ in range(2)]
    for done in runs:
        assert done.returncode == 0 and done.stderr == "to stderr\n", done.stderr
        said = done.stdout.splitlines()
        assert said[0] == f"{[str(path), 'a', '1']} __main__ {path} {tmp_path} yes {tmp_path}"
        assert said[1].startswith("False True False ")
        assert said[2:] == ["thread ended", "atexit ran"]
    assert runs[0].stdout != runs[1].stdout  # (NumPy seeded afresh in each)


@pytest.mark.parametrize(("code", "status", "said"), [
    ("import sys; sys.exit(3)", 3, ""),
    ("import sys; sys.exit('no')", 1, "no\n"),
    ("raise ValueError('bad')", 1, "ValueError: bad\n"),
    ("import os; os.kill(os.getpid(), 9)", -signal.SIGKILL, ""),
    ("import os, signal; os.kill(os.getpid(), signal.SIGINT)", -signal.SIGINT,
     "KeyboardInterrupt\n"),
])
def test_its_exit_status_is_the_scripts(code: str, status: int, said: str) -> None:
    done = warm_python.run([sys.executable, "-c", code, "x"])
    assert done.returncode == status and done.stderr.endswith(said), done.stderr


def test_input_check_and_timeout_are_as_subprocess_runs() -> None:
    echo = "import sys; print(sys.stdin.read().upper(), sys.argv)"
    assert warm_python.run([sys.executable, "-c", echo], input="hi").stdout == "HI ['-c']\n"
    with pytest.raises(subprocess.CalledProcessError):
        warm_python.run([sys.executable, "-c", "raise SystemExit(2)"], check=True)
    with pytest.raises(subprocess.TimeoutExpired):
        warm_python.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)


def test_a_module_runs_as_python_m_runs_it(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("import sys\nprint(__name__, sys.argv, sys.path[0])\n"
                                     "sys.exit(4)")
    done = warm_python.run([sys.executable, "-m", "mod", "x"], cwd=tmp_path)
    assert done.returncode == 4, done.stderr
    assert done.stdout == f"__main__ {[str(tmp_path / 'mod.py'), 'x']} {tmp_path}\n"


def test_a_popen_streams_and_signals_as_subprocess_popen_does(tmp_path: Path) -> None:
    echo = "import sys\nprint('ready', flush=True)\nprint(sys.stdin.readline().upper())"
    with warm_python.Popen([sys.executable, "-c", echo], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        assert process.poll() is None
        assert process.communicate("hi\n", timeout=60) == ("HI\n\n", None)
    assert process.returncode == 0
    with (tmp_path / "err").open("w") as err:
        process = warm_python.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                    stdout=subprocess.DEVNULL, stderr=err)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=0.5)
        process.terminate()
        assert process.wait(timeout=60) == -signal.SIGTERM


def test_what_is_not_a_run_of_this_interpreter_is_refused() -> None:
    with pytest.raises(ValueError, match="not a script, -c or -m run"):
        warm_python.run([sys.executable, "-X", "importtime", "-c", "pass"])


def test_a_new_session_is_there_before_the_pid_comes_back() -> None:
    """jupyter_client signals a kernel's process group, asked of its pid at once."""
    process = warm_python.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                start_new_session=True)
    try:
        assert os.getsid(process.pid) == os.getpgid(process.pid) == process.pid
    finally:
        process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL


PROBE = ("import os, sys; print(sys.argv[1:2], sys.path[0], os.getcwd(), __name__, "
         "os.getsid(0) == os.getpid() == os.getpgid(0), 'IPython' in sys.modules)")


def _interrupted(manager: Any, client: Any) -> dict[str, Any]:
    """The reply to the cell running in ``client``'s kernel, interrupted as a user does it:
    once, and again if no reply came. Once on record (CI, under load) no reply came to one
    interrupt in 60 s, and the kernel left no word why; a second is said, not failed."""
    for interrupts in range(1, 4):
        manager.interrupt_kernel()
        try:
            reply = client.get_shell_msg(timeout=20)["content"]
        except queue.Empty:
            continue
        if interrupts > 1:
            warnings.warn(f"the forked kernel answered its interrupt number {interrupts}, "
                          f"alive: {manager.is_alive()}", stacklevel=2)
        return reply
    raise AssertionError(f"no reply to three interrupts; alive: {manager.is_alive()}")


def _kernel_says(manager: Any, code: str, timeout: float = 120) -> tuple[str, dict[str, Any]]:
    client = manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=timeout)
        said: list[str] = []
        reply = client.execute_interactive(
            code, timeout=timeout,
            output_hook=lambda msg: said.append(msg["content"].get("text", "")))
        return "".join(said), reply["content"]
    finally:
        client.stop_channels()


def test_a_kernel_is_forked_and_starts_as_a_fresh_ones_does(tmp_path: Path,
                                                             monkeypatch) -> None:
    """The same cell in a kernel started from a fresh interpreter and in a forked one says
    the same; the forked one is interrupted and killed as jupyter_client does it."""
    from jupyter_client.manager import KernelManager
    said = {}
    for way in ("fresh", "forked"):
        with monkeypatch.context() as patch:
            if way == "fresh":
                patch.setattr("jupyter_client.launcher.Popen", subprocess.Popen)
            manager = KernelManager(kernel_name="python3")
            manager.start_kernel(cwd=str(tmp_path))
        try:
            forked = isinstance(manager.provisioner.process, warm_python.Popen)
            assert forked == (way == "forked")
            said[way], reply = _kernel_says(manager, PROBE)
            assert reply["status"] == "ok", said[way]
            if forked:
                client = manager.blocking_client()
                client.start_channels()
                client.wait_for_ready(timeout=60)
                client.execute("import time\nprint('sleeping', flush=True)\n"
                               "for _ in range(1200): time.sleep(0.1)")
                while client.get_iopub_msg(timeout=60)["content"].get("text") != "sleeping\n":
                    pass  # (the cell's own output: it is in its sleeps)
                reply = _interrupted(manager, client)
                client.stop_channels()
                assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
                pid = manager.provisioner.pid
                manager.signal_kernel(signal.SIGKILL)  # (to its process group)
                assert manager.provisioner.process.wait(timeout=60) == -signal.SIGKILL
                assert not manager.is_alive()
                with pytest.raises(ProcessLookupError):
                    os.kill(pid, 0)
        finally:
            if manager.has_kernel:
                manager.shutdown_kernel(now=True)
    assert said["forked"] == said["fresh"]
    assert said["fresh"].startswith("['-f'] ")
    assert said["fresh"].endswith(f" {tmp_path} __main__ True True\n")
