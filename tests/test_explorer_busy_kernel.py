"""While a cell runs in the explorer's kernel (a %%ckpt_auto cell below it), the kernel
acts on the explorer's clicks (a button, a tab, a row) only once the cell ends: Roll back
did nothing for the whole run, then asked its question a minute later. The explorer says
so under its buttons while a cell has run for a while, and no longer once it ends. A real
IPython shell running real cells."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

import ckpt_nb
from ckpt_nb import _explorer

from conftest import DigitsRun


# (waits, as a long cell does, till the note shows or 30 s pass: no timing assumed)
WAIT_FOR_NOTE = """
import time
deadline = time.monotonic() + 30
while ui.busy_note.layout.display == "none" and time.monotonic() < deadline:
    time.sleep(0.01)
seen = ui.busy_note.layout.display
"""


def test_a_long_cell_is_said_under_the_buttons_till_it_ends(
        shell: InteractiveShell, tmp_path: Path, digits: DigitsRun,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_explorer, "BUSY_SECONDS", 0.1)
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        mgr.save(digits.model, digits.optimizer, 0, metrics={"loss": digits.train_step()})
    shell.user_ns["store"] = tmp_path / "s"
    assert shell.run_cell("import ckpt_nb\nui = ckpt_nb.explore(store, poll_seconds=0)").success
    ui = shell.user_ns["ui"]
    try:
        assert ui.busy_note.layout.display == "none"
        assert shell.run_cell(WAIT_FOR_NOTE).success  # (a cell that runs till it shows)
        assert shell.user_ns["seen"] is None  # (shown, while the cell ran)
        assert "running a cell" in ui.busy_note.value
        assert ui.busy_note.layout.display == "none"  # (gone once it ended)
        assert shell.run_cell("seen = ui.busy_note.layout.display").success
        assert shell.user_ns["seen"] == "none"  # (a short cell: never said)
    finally:
        ui.close()
    hooks = shell.events.callbacks["pre_run_cell"] + shell.events.callbacks["post_run_cell"]
    assert not any(getattr(hook, "__self__", None) is ui for hook in hooks)  # (unhooked)
