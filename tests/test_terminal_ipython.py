"""The magics in the terminal IPython (``ipython``, ``ipython -c``, ``ipython
script.ipy``), which shows no widget and is no kernel: started as a user starts it, a
fresh ``python -m IPython`` forked from a warm interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import warm_python  # (fresh interpreters forked from a warm one)
from test_cli import module_env

# A store of one checkpoint, then the explorer asked for in the terminal.
UI_IN_A_TERMINAL = """
import ckpt_nb, torch
model = torch.nn.Linear(2, 1)
with ckpt_nb.auto("runs", namespace=globals()):
    pass
%load_ext ckpt_nb
%ckpt_ui runs
"""


def ipython(code: str, cwd: Path) -> str:
    done = warm_python.run([sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor",
                            "-c", code], cwd=cwd, env=module_env(), timeout=120)
    return done.stdout + done.stderr


def test_ckpt_ui_in_the_terminal_says_it_cannot_show_and_what_shows_the_store(
        tmp_path: Path) -> None:
    """It printed the widget's repr (``Explorer(children=(HTML(...``), an explorer that
    went on polling the store each second, unseen."""
    out = ipython(UI_IN_A_TERMINAL, tmp_path)
    assert "Explorer(" not in out
    assert "%ckpt_ui: the explorer is a widget, which the terminal IPython cannot show: " \
           "%ckpt_list runs shows the store here" in out
    assert "Traceback" not in out
