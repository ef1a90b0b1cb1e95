"""A closed explorer leaves no widget of its own open: ipywidgets' registry of open
widgets kept them, and through their callbacks every closed explorer, for the session; and
its actions refuse by its own close."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ipywidgets.widgets.widget import _instances  # (Widget.widgets, deprecated)

import ckpt_nb
from ckpt_nb._explorer import Explorer

from conftest import DigitsRun


def test_closed_explorers_leave_no_widgets_open_and_are_freed(tmp_path: Path,
                                                               digits: DigitsRun) -> None:
    path = tmp_path / "store"
    with ckpt_nb.CheckpointManager(path, metric="loss") as mgr:
        for epoch in range(3):
            loss = sum(digits.train_step() for _ in range(3)) / 3
            mgr.save(digits.model, digits.optimizer, epoch, metrics={"loss": loss})
    gc.collect()
    open_before = set(_instances)
    closed = []
    for _ in range(3):
        # (not explore(): in an IPython cell, it holds the cell's explorers till it reruns)
        ui = Explorer(path, poll_seconds=0)
        ui.select("latest")
        for tab in range(len(ui.tabs.children)):
            ui.tabs.selected_index = tab
        ui.close()
        ui._follower.join(20)  # (its thread holds it till it sees the stop)
        closed.append(weakref.ref(ui))
        del ui
    gc.collect()
    left_open = [type(widget).__name__ for key, widget in _instances.items()
                 if key not in open_before]
    assert left_open == []
    assert [ref for ref in closed if ref() is not None] == []


@pytest.mark.parametrize("action", [
    lambda ui: ui.refresh(), lambda ui: ui.select("latest"), lambda ui: ui.sort("step"),
    lambda ui: ui.pin("latest"), lambda ui: ui.unpin("latest"), lambda ui: ui.delete("latest"),
    lambda ui: ui.rollback("latest"), lambda ui: ui.export("latest", "a.pt"),
    lambda ui: ui.figure("metrics")])
def test_a_closed_explorer_refuses_its_actions_by_its_own_close(
        tmp_path: Path, digits: DigitsRun, action: Callable[[Explorer], Any]) -> None:
    """After ui.close(), a Pin blamed CheckpointManager.close(), which the user never
    called; select() returned [] and said the table "follows the store again once it can
    be read", which a closed explorer never does; shown again, it printed every widget."""
    path = tmp_path / "store"
    with ckpt_nb.CheckpointManager(path, metric="loss") as mgr:
        cid = mgr.save(digits.model, digits.optimizer, 0, metrics={"loss": digits.train_step()})
    ui = Explorer(path, namespace={"model": digits.model}, poll_seconds=0)
    ui.close()
    with pytest.raises(ckpt_nb.CkptError) as refused:
        action(ui)
    assert str(refused.value) == "this explorer was closed (ui.close()): open a new one with " \
        "ckpt_nb.explore(...)"
    assert repr(ui) == f"<ckpt_nb explorer of {ui.url}, closed: open a new one with " \
        "ckpt_nb.explore(...)>"
    with ckpt_nb.CheckpointManager(path) as mgr:  # (nothing was done)
        assert mgr.list()["id"].tolist() == [cid] and not mgr.list()["pinned"].any()


@pytest.mark.parametrize("button", ["rollback_button", "delete_button"])
def test_a_closed_explorers_question_buttons_say_it_was_closed(
        tmp_path: Path, digits: DigitsRun, button: str) -> None:
    """Roll back and Delete ask first; their question's reads went to the closed catalog,
    whose refusal blamed CheckpointManager.close(), never called."""
    path = tmp_path / "store"
    with ckpt_nb.CheckpointManager(path, metric="loss") as mgr:
        cid = mgr.save(digits.model, digits.optimizer, 0, metrics={"loss": digits.train_step()})
    ui = Explorer(path, namespace={"model": digits.model}, poll_seconds=0)
    ui.select(cid)
    ui.close()
    getattr(ui, button).click()
    assert "this explorer was closed (ui.close())" in ui.status.value, ui.status.value
    assert "CheckpointManager.close()" not in ui.status.value
    assert ui.confirm_box.layout.display != "flex"
