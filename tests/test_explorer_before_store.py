"""The explorer opened before its store is made (``%ckpt_ui`` in a cell above the first
%%ckpt_auto cell, to watch the run fill it) was refused as a typo ("no store to
explore"). The default store, and ``explore(DIR, wait=True)``, are now followed till they
are made; a DIR given that is not there is still refused. A real IPython shell running a
real %%ckpt_auto cell training on digits."""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

import ckpt_nb
from ckpt_nb import CheckpointNotFoundError

from conftest import DigitsRun

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)


def poll(condition, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_ckpt_ui_above_the_first_training_cell_shows_its_saves(
        shell: InteractiveShell, digits: DigitsRun, capsys) -> None:
    assert shell.run_cell("import ckpt_nb\nui = %ckpt_ui", store_history=False).success
    ui = shell.user_ns["ui"]
    try:
        assert "not made yet" in capsys.readouterr().out
        store = Path("checkpoints") / "session"  # (the default store, not there)
        assert not store.exists()
        assert f"there is no store at {store}, the default one, yet" in ui.table_note.value
        assert "first %%ckpt_auto cell" in ui.table_note.value
        for button in (ui.rollback_button, ui.pin_button, ui.delete_button, ui.export_button):
            button.click()  # (refused by name, not a crash)
            assert f"{button.description} failed: no checkpoint store at" in ui.status.value
            assert "yet" in ui.status.value
        with pytest.raises(CheckpointNotFoundError, match="no checkpoint store at .* yet"):
            ui.select("latest")
        shell.user_ns.update(model=digits.model, opt=digits.optimizer, run=digits)
        assert shell.run_cell("%%ckpt_auto\nfor epoch in ckpt_nb.epochs(2):\n"
                              "    ckpt_nb.log(loss=run.train_step())",
                              store_history=False).success
        saved = list(ckpt_nb.CheckpointManager(store).list()["id"])
        assert saved
        poll(lambda: [r["id"] for r in ui.table.rows] == saved
             and ui.table_note.layout.display == "none")
        assert [r["id"] for r in ui.table.rows] == saved  # (followed: the store's saves)
        assert ui.table_note.layout.display == "none" and "no store yet" not in ui.title.value
        ui.select(saved[-1])
        ui.pin_button.click()
        assert f"pinned {saved[-1]}" in ui.status.value
    finally:
        ui.close()
    assert not shell.run_cell("%ckpt_ui runs/typo", store_history=False).success  # (refused)


def test_ckpt_ui_waiting_shows_the_store_the_first_cell_s_dir_names(
        shell: InteractiveShell, digits: DigitsRun) -> None:
    """%ckpt_ui opens the last session's store once there is one: opened before it, it
    shows the first %%ckpt_auto cell's --dir, not the default store it waited for."""
    assert shell.run_cell("import ckpt_nb\nui = %ckpt_ui", store_history=False).success
    ui = shell.user_ns["ui"]
    try:
        shell.user_ns.update(model=digits.model, opt=digits.optimizer, run=digits)
        assert shell.run_cell("%%ckpt_auto --dir runs/x\nfor epoch in ckpt_nb.epochs(1):\n"
                              "    ckpt_nb.log(loss=run.train_step())",
                              store_history=False).success
        saved = list(ckpt_nb.CheckpointManager("runs/x").list()["id"])
        poll(lambda: [r["id"] for r in ui.table.rows] == saved)
        assert [r["id"] for r in ui.table.rows] == saved and saved
        assert "runs/x" in ui.title.value and not Path("checkpoints").exists()
    finally:
        ui.close()


def test_explore_waits_only_when_asked(tmp_path: Path, digits: DigitsRun) -> None:
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint store at"):
        ckpt_nb.explore(tmp_path / "typo", namespace={}, poll_seconds=0)
    assert not (tmp_path / "typo").exists()
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0, wait=True)
    try:
        assert not (tmp_path / "s").exists()  # (waiting makes no store)
        assert not ui.refresh()
        with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:  # (no poll, no event: read
            cid = mgr.save(digits.model, digits.optimizer, 0)  # at the next action)
        assert ui.select("latest") == [cid]
        assert list(ui.table_frame["id"]) == [cid]
    finally:
        ui.close()
    with pytest.raises(TypeError, match="wait takes True"):
        ckpt_nb.explore(tmp_path / "s", wait="yes")


def test_an_explorer_refused_as_it_opened_leaves_no_error_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo's refusal (or a wrong argument's) was followed, once the half-made explorer
    was collected, by "Exception ignored in: Widget.__del__ ... AttributeError: 'Explorer'
    object has no attribute 'busy_note'" in a later cell's output."""
    unraised: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook",
                        lambda u: unraised.append(f"{u.exc_type.__name__}: {u.exc_value}"))
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint store at"):
        ckpt_nb.explore(tmp_path / "typo", namespace={}, poll_seconds=0)
    with pytest.raises(TypeError, match="poll_seconds takes"):
        ckpt_nb.explore(tmp_path / "typo", poll_seconds="1")
    gc.collect()
    assert unraised == []
