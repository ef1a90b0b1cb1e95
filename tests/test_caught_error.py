"""An error that code in a ``%%ckpt_auto`` cell catches: ``%run`` of a file holding the
training loop shows the error and goes on (IPython's ``safe_execfile``), so the cell ran
on to its end, which was saved as the run's end: fixed and run again, the cell did not
resume, it trained its loops over on the part-trained model, without a word. An error that
IPython showed in the cell, through the frame of a tracked loop that did not run to its
end, now leaves the run unfinished, as the error would have had it reached the cell.
A ``break`` (early stopping) still ends the run, and so does an ``except`` in the cell's
own code (its code's choice). In a real in-process IPython shell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from test_caught_stop import SETUP  # (the same model, optimizer and data)
from test_magics import run  # (the shell's helper)

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)


LOOP = """
for epoch in ckpt_nb.epochs(3):
    for i, (x, t) in ckpt_nb.batches(data):
        if (epoch, i) == (1, 2) and os.environ.get("CKPT_NB_TEST_FAIL"):
            raise RuntimeError("a bug at epoch 1")
        opt.zero_grad(); ((model(x) - t) ** 2).mean().backward(); opt.step()
    if epoch == STOP:
        break
"""


def weights(shell: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in shell.user_ns["model"].parameters()]


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "progress"])
def test_an_error_run_catches_leaves_the_run_unfinished_and_it_resumes_exactly(
        shell: Any, tmp_path: Path, capsys: Any, monkeypatch: Any, wrapped: bool) -> None:
    """``wrapped``: epochs() in a progress bar of the notebook's own (a generator, as
    tqdm's and rich's track() are), whose frame the loop's error does not unwind through."""
    (tmp_path / "loop.py").write_text(LOOP if not wrapped else (
        "def progress(it):\n    yield from it\n"
        + LOOP.replace("in ckpt_nb.epochs(3)", "in progress(ckpt_nb.epochs(3))")))
    body = f"%run -i {tmp_path / 'loop.py'}\n"
    run(shell, SETUP)
    assert run(shell, f"%%ckpt_auto --dir {tmp_path / 'ref'} --every-steps 2\n{body}").success
    reference = weights(shell)

    run(shell, SETUP)  # (the bug: no variable, which a resume would put back as saved)
    monkeypatch.setenv("CKPT_NB_TEST_FAIL", "1")
    cell = f"%%ckpt_auto --dir {tmp_path / 'run'} --every-steps 2\n{body}"
    capsys.readouterr()
    assert run(shell, cell).success  # (%run showed the error, and the cell went on)
    out = capsys.readouterr().out
    assert "a bug at epoch 1" in out
    assert "ckpt_nb: saved " in out and \
        " at step 7, the last consistent point before the RuntimeError\n" in out
    assert "ckpt_nb: the cell's loop stopped at step 7 on the RuntimeError shown above, " \
           "which was caught in the cell (by %run, which shows an error and goes on), and " \
           "the cell ran on: not the run's end; run the cell again to go on from " \
           "checkpoint " in out
    monkeypatch.delenv("CKPT_NB_TEST_FAIL")  # (fixed)
    assert run(shell, cell).success
    assert "ckpt_nb: resumed from " in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(weights(shell), reference))


@pytest.mark.parametrize("how", ["break", "except", "shown-then-break"])
def test_a_loop_left_by_the_cells_own_choice_still_ends_the_run(
        shell: Any, tmp_path: Path, capsys: Any, monkeypatch: Any,
        how: str) -> None:
    """A ``break`` (early stopping) in the %run file, then an error %run shows from
    another file (not through the loop); or an ``except Exception`` of the cell's own
    around its loop; or an error the loop's own code caught and showed
    (``get_ipython().showtraceback()``) before a ``break``: the run ended, as the code
    chose, and a rerun does not resume it."""
    (tmp_path / "loop.py").write_text(LOOP)
    (tmp_path / "other.py").write_text("raise ValueError('an evaluation bug')\n")
    if how == "break":
        run(shell, SETUP + "STOP = 1")
        body = f"%run -i {tmp_path / 'loop.py'}\n%run -i {tmp_path / 'other.py'}\n"
    elif how == "shown-then-break":
        (tmp_path / "loop.py").write_text(LOOP.replace(
            "    if epoch == STOP:", "    try:\n        1 / 0\n    except ZeroDivisionError:\n"
            "        get_ipython().showtraceback()\n    if epoch == STOP:"))
        run(shell, SETUP + "STOP = 1")
        body = f"%run -i {tmp_path / 'loop.py'}\n"
    else:
        run(shell, SETUP)
        monkeypatch.setenv("CKPT_NB_TEST_FAIL", "1")
        body = "try:\n" + "".join(f"    {line}\n" for line in LOOP.strip().splitlines()) \
            + "except Exception:\n    pass\n"
    cell = f"%%ckpt_auto --dir {tmp_path / 'run'} --every-steps 2\n{body}"
    capsys.readouterr()
    assert run(shell, cell).success
    out = capsys.readouterr().out
    assert "not the run's end" not in out
    assert run(shell, cell).success
    assert "resumed from" not in capsys.readouterr().out
