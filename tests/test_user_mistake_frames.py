"""A user's mistake in a notebook (a metric that is no number, a value that does not save)
shows the user's cell and a message that says what to do, not the frames of ckpt_nb that
checked it. Driven through a real, in-process IPython shell, as a kernel shows it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from ckpt_nb import CaptureError

def shown(sh: InteractiveShell, code: str, capsys: pytest.CaptureFixture[str]
          ) -> tuple[list[str], str]:
    """The ckpt_nb frames the cell's traceback shows, and all it printed."""
    capsys.readouterr()
    result = sh.run_cell(code, store_history=False)
    assert isinstance(result.error_in_exec, CaptureError), result.error_in_exec
    out = re.sub(r"\x1b\[[0-9;]*m", "", "".join(capsys.readouterr()))  # (colours)
    return re.findall(r"ckpt_nb/(\w+)\.py:\d+, in ([\w.<>]+)", out), out


def test_a_metric_that_is_no_number_shows_the_log_call_alone(shell, capsys) -> None:
    """It showed log(), its comprehension, _metric_value and as_metric."""
    frames, out = shown(shell, "import ckpt_nb\nckpt_nb.log(val_loss=None)", capsys)
    assert frames == [("_session", "log")], out
    assert "metric 'val_loss' must be a number, not NoneType" in out


# The manager's own frames (its save, its capture) stay: the walk of the values is hidden.
SAVE_FRAMES = [("_manager", "CheckpointManager.save"), ("_manager", "CheckpointManager.capture"),
               ("_capture", "flatten")]


def test_a_lambda_in_extra_says_what_to_do_without_the_pickle_chain(
        shell, tmp_path: Path, capsys) -> None:
    """11 frames of the capture's walk, and pickle's PicklingError chained to the error
    that says all it says."""
    frames, out = shown(shell, f"import ckpt_nb, torch\nm = ckpt_nb.CheckpointManager("
                               f"{str(tmp_path / 's')!r})\n"
                               "m.save(torch.nn.Linear(2, 2), extra={'f': lambda x: x})", capsys)
    assert frames == SAVE_FRAMES, out
    assert "direct cause" not in out and "PicklingError" not in out, out
    assert "extra/f (function) cannot be saved" in out
    assert "leave it out of the save, or save the data it holds" in out


def test_a_model_on_the_meta_device_says_how_to_give_it_memory(
        shell, tmp_path: Path, capsys) -> None:
    """15 frames, and a message that gave no way on (a restore's does)."""
    frames, out = shown(shell, f"import ckpt_nb, torch\nm = ckpt_nb.CheckpointManager("
                               f"{str(tmp_path / 's')!r})\n"
                               "m.save(torch.nn.Linear(2, 2, device='meta'))", capsys)
    assert frames == SAVE_FRAMES, out
    assert "objects/model/weight is on the meta device and holds no data to save: give it " \
        "memory first (a module's .to_empty(device='cpu'), then load or initialise its " \
        "weights), or leave it out of the save" in out, out
