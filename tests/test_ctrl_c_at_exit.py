"""A Ctrl-C as ``ckpt-nb`` or the demo ends, or while the demo loads torch, is no
traceback: Python's exit joins the threads left running before it runs atexit's
functions (an "Exception ignored in <module 'threading'>" traceback, where the Ctrl-C
came after the output, during the join), and the demo imported torch as its module
loaded, before its catch (a 20-line traceback from torch's import, exit -2)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_cli import module_env

# ckpt-nb as its script runs it, with a helper thread still finishing as it exits (a
# store's pool; here 3 s, so that the Ctrl-C lands in the join)
WITH_A_THREAD = """
import sys, threading, time
from ckpt_nb.cli import main
threading.Thread(target=time.sleep, args=(3,)).start()
sys.argv = ["ckpt-nb", "--version"]
sys.exit(main())
"""


def as_a_shell_starts_it(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *argv], env=module_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_a_ctrl_c_while_the_command_joins_its_threads_at_exit_is_ignored() -> None:
    process = as_a_shell_starts_it(["-c", WITH_A_THREAD])
    assert process.stdout is not None
    try:
        assert process.stdout.readline().strip()  # (the version: the work is done)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait(timeout=60)
    assert (process.returncode, err) == (0, "")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_a_ctrl_c_while_the_demo_loads_torch_is_one_line(tmp_path: Path) -> None:
    process = as_a_shell_starts_it(["-m", "ckpt_nb.demo", str(tmp_path / "demo")])
    try:
        maps = Path(f"/proc/{process.pid}/maps")
        deadline = time.monotonic() + 60
        while "libtorch" not in maps.read_text() and time.monotonic() < deadline:
            time.sleep(0.005)  # (until torch's library is loaded: its import is under way)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait(timeout=60)
    assert (process.returncode, out, err) == (130, "", "python -m ckpt_nb.demo: interrupted\n")
