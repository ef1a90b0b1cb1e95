"""A closed explorer leaves no widget of its own open: ipywidgets' registry of open
widgets kept them, and through their callbacks every closed explorer, for the session."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

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
