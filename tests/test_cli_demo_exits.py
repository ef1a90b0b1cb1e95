"""``python -m ckpt_nb.demo`` ends as ``ckpt-nb`` does: a reader that leaves, a Ctrl-C
and a missing scikit-learn each end it with a line, or none, not a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from test_cli import module_env
import warm_python  # (fresh interpreters forked from a warm one)

# The demo as `python -m ckpt_nb.demo DIR` runs it, on a machine without scikit-learn
# (None in sys.modules: its import fails).
WITHOUT_SKLEARN = """
import runpy, sys
sys.modules["sklearn"] = None
sys.argv[0] = "ckpt_nb.demo"
runpy.run_module("ckpt_nb.demo", run_name="__main__")
"""


# The demo as `python -m ckpt_nb.demo DIR` runs it, its torch on one thread: on two cores
# shared with the suite's other worker, two threads made each of its hundred steps wait
# for one (seconds, where a reader that leaves lets it run to its end).
ONE_THREAD = """
import runpy, sys, torch
torch.set_num_threads(1)
sys.argv[0] = "ckpt_nb.demo"
runpy.run_module("ckpt_nb.demo", run_name="__main__")
"""


def demo(tmp_path: Path) -> warm_python.Popen:
    return warm_python.Popen([sys.executable, "-c", ONE_THREAD, str(tmp_path / "demo")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=module_env())


def test_the_demo_piped_to_a_reader_that_leaves_ends_quietly(tmp_path: Path) -> None:
    """``| head -1``: a BrokenPipeError traceback, exit 1."""
    process = demo(tmp_path)
    assert process.stdout is not None and process.stderr is not None
    try:
        assert process.stdout.readline().startswith("epoch 0: ")
        process.stdout.close()
        err = process.stderr.read()
        assert (process.wait(timeout=120), err) == (0, "")
    finally:
        process.kill()
        process.wait(timeout=60)


def test_the_demo_interrupted_says_so_in_a_line(tmp_path: Path) -> None:
    """Ctrl-C while it trains: a KeyboardInterrupt traceback."""
    process = demo(tmp_path)
    assert process.stdout is not None
    try:
        assert process.stdout.readline().startswith("epoch 0: ")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait(timeout=60)
    assert (process.returncode, err) == (130, "python -m ckpt_nb.demo: interrupted\n")


def test_the_demo_without_scikit_learn_says_what_to_install(tmp_path: Path) -> None:
    """A ModuleNotFoundError traceback, from the demo's line importing sklearn."""
    done = warm_python.run([sys.executable, "-c", WITHOUT_SKLEARN, str(tmp_path / "demo")],
                           env=module_env(), timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("python -m ckpt_nb.demo: the demo trains on scikit-learn's "
                                  "digits, and scikit-learn could not be imported (")
    assert done.stderr.endswith("): pip install scikit-learn\n")
    assert done.stderr.count("\n") == 1


def test_the_demo_runs_under_python_OO() -> None:
    """``python -OO`` strips docstrings: the demo's help, made from its docstring, ended
    in an AttributeError traceback before the demo began."""
    done = subprocess.run([sys.executable, "-OO", "-m", "ckpt_nb.demo", "--help"],
                          capture_output=True, text=True, env=module_env(), timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("usage: python -m ckpt_nb.demo [-h] [DIR]\n")
