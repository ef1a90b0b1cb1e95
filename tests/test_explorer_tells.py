"""What ckpt_nb warns or says while an explorer's button acts shows in its status line, in
amber under the action's own message: a button's handler has no cell output, so in a
browser a warning went nowhere (not the page, not the server's log) and the status line
said all was well. The Python warning is still given, for a script. Real stores, real
sessions, real training on digits."""

from __future__ import annotations

import html
import re
import warnings
from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import _explorer, _session

from conftest import DigitsRun, same


@pytest.fixture
def fresh_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ckpt_nb session is open in this process: a rollback makes a temporary one."""
    monkeypatch.setattr(_session, "_positions", {})
    monkeypatch.setattr(_session, "_position_events", {})
    monkeypatch.setattr(_session, "_last", None)
    monkeypatch.setattr(_session, "_sessions", [])


def notes(ui: ckpt_nb.Explorer) -> list[str]:
    """The status line's lines below the action's own message (what ckpt_nb said or
    warned), as text; each in amber."""
    colors, lines = zip(*re.findall("<span style='color:([^']*)'>(.*?)</span>",
                                    ui.status.value))
    assert not colors[1:] or set(colors[1:]) == {_explorer.NOTE_COLOR}
    return [html.unescape(line) for line in lines[1:]]


class Point:
    """A user class: stored as a pickle."""

    def __init__(self, x: int) -> None:
        self.x = x


def test_a_rollback_by_button_says_an_optimizer_left_on_an_old_model(
        tmp_path: Path, digits: DigitsRun, fresh_session: None) -> None:
    """The model's cell run again, the optimizer's not: the question and the result say
    that opt steps the old model's parameters, as %ckpt_rollback warns."""
    namespace = {"model": digits.model, "opt": digits.optimizer}
    with ckpt_nb.auto(tmp_path / "s", namespace=namespace, name="train", every_steps=3):
        for _ in ckpt_nb.epochs(2):
            for _ in range(3):
                digits.train_step()
    namespace["model"] = DigitsRun(seed=1).model  # (the model made anew, not the opt)
    ui = ckpt_nb.explore(tmp_path / "s", namespace=namespace, poll_seconds=0)
    stale = "opt drives parameters no tracked module holds: if the training uses it, " \
        "re-create it after `model` (run its cell again)"
    try:
        cid = ui.select("latest")[0]
        ui.rollback_button.click()
        assert "It restores model, opt" in html.unescape(ui.status.value)
        assert [n.startswith(f"⚠ {stale}") for n in notes(ui)] == [True], ui.status.value
        with pytest.warns(RuntimeWarning, match=re.escape(f"rolled back to {cid}: {stale}")):
            ui.confirm_button.click()  # (still warned, for a script's ui.rollback())
        assert f"rolled back to {cid}: restored model, opt" in ui.status.value
        assert [n.startswith(f"⚠ {stale}") for n in notes(ui)] == [True], ui.status.value
        saved = ckpt_nb.CheckpointManager(tmp_path / "s").load(cid).state["model"]
        assert same([t.detach() for t in namespace["model"].state_dict().values()],
                    list(saved.values()))
    finally:
        ui.close()


def test_a_rollback_by_button_names_the_variables_left_out_as_unreadable(
        tmp_path: Path, fresh_session: None) -> None:
    """%ckpt_rollback's line names a variable that does not read back, left out; the
    explorer's line did not."""
    model = torch.nn.Linear(4, 4)
    namespace = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1), "lr": 0.1}
    with ckpt_nb.auto(tmp_path / "s", namespace=namespace, name="cell", every_steps=1):
        for _ in ckpt_nb.epochs(1):
            for _, x in ckpt_nb.batches([torch.ones(1, 4)] * 2):
                namespace["opt"].zero_grad()
                model(x).sum().backward()
                namespace["opt"].step()
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        record = mgr.load("latest").extra["ckpt_nb_run"]
        record["variables"].update(df={"__frame__": "frame"}, lr=0.25)  # (a malformed frame)
        cid = mgr.save(model=model, opt=namespace["opt"], extra={"ckpt_nb_run": record})
    ui = ckpt_nb.explore(tmp_path / "s", namespace=namespace, poll_seconds=0)
    try:
        ui.select(cid)
        ui.rollback_button.click()
        ui.confirm_button.click()
        assert f"rolled back to {cid}: restored model, opt, lr; left out (they do not read " \
            "back): df (KeyError: 'data'); the next save goes on along its branch, " \
            "branch-1" \
            in html.unescape(ui.status.value), ui.status.value
        assert notes(ui) == [], ui.status.value
        assert namespace["lr"] == 0.25 and "df" not in namespace
    finally:
        ui.close()


def test_a_rollback_by_button_names_the_optimizer_the_checkpoint_does_not_hold(
        tmp_path: Path, digits: DigitsRun, fresh_session: None) -> None:
    """%ckpt_rollback's line names a tracked object made after the checkpoint, left as it
    is (a fine-tune's optimizer, with its momentum); the explorer's own line, which
    replaces the session's, did not."""
    namespace = {"model": digits.model, "opt": digits.optimizer}
    with ckpt_nb.auto(tmp_path / "s", namespace=namespace, name="train", every_steps=3):
        for _ in ckpt_nb.epochs(1):
            for _ in range(3):
                digits.train_step()
    opt2 = namespace["opt2"] = torch.optim.SGD(digits.model.parameters(), lr=0.1,
                                               momentum=0.9)
    digits.model(digits.x).sum().backward()
    opt2.step()
    ui = ckpt_nb.explore(tmp_path / "s", namespace=namespace, poll_seconds=0)
    try:
        cid = ui.select("latest")[0]
        ui.rollback_button.click()
        assert "It restores model, opt. The next save goes on along its branch, main." \
            in html.unescape(ui.status.value), ui.status.value  # (the question, a tip's)
        ui.confirm_button.click()
        assert f"rolled back to {cid}: restored model, opt; the next save goes on along its " \
            f"branch, main; not in {cid}, left as it is: opt2 (SGD); run the cell that makes it " \
            "again to start it afresh" in html.unescape(ui.status.value), ui.status.value
        assert notes(ui) == [], ui.status.value
        assert len(opt2.state) == 4  # (its momentum, as it was)
    finally:
        ui.close()


def test_an_export_by_button_says_what_it_left_out(tmp_path: Path) -> None:
    """A pickled value is left out of the file: said under "exported", and warned."""
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(torch.nn.Linear(2, 2), extra={"point": Point(3), "keep": [1, 2]})
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.select(cid)
        ui.export_path.value = str(tmp_path / "out" / "b.pt")
        left_out = "left out of b.pt: extra/point (pickled, not loaded: export to " \
            ".safetensors with trust_pickle=True)"
        with pytest.warns(UserWarning, match=re.escape(left_out)):
            ui.export_button.click()
        assert f"exported {cid} to {tmp_path / 'out' / 'b.pt'}" in ui.status.value
        assert notes(ui) == [f"⚠ {left_out}"], ui.status.value
        with warnings.catch_warnings():  # (a clean one says nothing more)
            warnings.simplefilter("error")
            ui.pin(cid)
        assert f"pinned {cid}" in ui.status.value and notes(ui) == []
    finally:
        ui.close()
