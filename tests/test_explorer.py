"""The explorer and its plots, on a real store of digits-trained checkpoints."""

from __future__ import annotations

import contextlib
import copy
import html
import json
import re
import math
import shutil
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import safetensors.torch
from IPython.core.interactiveshell import InteractiveShell
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import ckpt_nb
from ckpt_nb import _explorer, _interop, _plots, _session
from ckpt_nb.cli import _cell as _cli_cell
from ckpt_nb._units import human_size
from ckpt_nb.cli import _time
from ckpt_nb._plots import dag_layout
from ckpt_nb._store import FsspecStore

from conftest import DigitsRun, Holder, same
import warm_python  # (fresh interpreters forked from a warm one)


def poll(condition: Callable[[], bool], seconds: float = 20) -> None:
    """Wait until ``condition()`` holds or ``seconds`` pass (the caller asserts after)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture(scope="module")
def made_store(tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[Path, list[str], list[str], dict[str, Any]]:
    """``store``'s checkpoints, made once for the module (the tests change their copies),
    and the state the run left its digits model, optimizer, scheduler and torch's RNG in."""
    np.random.seed(0)
    digits = DigitsRun()  # (as the digits fixture makes it)
    path, main, branch = make_store(tmp_path_factory.mktemp("explorer") / "store", digits)
    left = {"model": digits.model.state_dict(), "optimizer": digits.optimizer.state_dict(),
            "scheduler": digits.scheduler.state_dict(), "rng": torch.get_rng_state()}
    return path, main, branch, copy.deepcopy(left)


@pytest.fixture
def store(tmp_path: Path, digits: DigitsRun, made_store) -> tuple[Path, list[str], list[str]]:
    """Four checkpoints on main, then a rollback to the second and two on a branch: a copy
    of the module's, the test's digits run left as making them left the run."""
    made, main, branch, left = made_store
    path = tmp_path / "store"
    shutil.copytree(made, path)
    digits.model.load_state_dict(left["model"])
    digits.optimizer.load_state_dict(copy.deepcopy(left["optimizer"]))
    digits.scheduler.load_state_dict(left["scheduler"])
    torch.set_rng_state(left["rng"])
    return path, list(main), list(branch)


def make_store(path: Path, digits: DigitsRun) -> tuple[Path, list[str], list[str]]:
    """Four checkpoints on main, then a rollback to the second and two on a branch."""
    mgr = ckpt_nb.CheckpointManager(path, strategy="incremental", metric="loss")
    main = []
    for epoch in range(4):
        loss = sum(digits.train_step() for _ in range(5)) / 5
        main.append(mgr.save(digits.model, digits.optimizer, epoch, step=5 * (epoch + 1),
                             metrics={"loss": loss, "acc": digits.accuracy()}))
    mgr.restore(main[1], model=digits.model, optimizer=digits.optimizer)
    branch = []
    for epoch in range(2, 4):
        loss = sum(digits.train_step() for _ in range(5)) / 5
        branch.append(mgr.save(digits.model, digits.optimizer, epoch, step=5 * (epoch + 1),
                               metrics={"loss": loss, "acc": digits.accuracy()}))
    mgr.close()
    return path, main, branch


def test_dag_layout_gives_a_lane_per_branch(store) -> None:
    path, main, branch = store
    nodes = dag_layout(ckpt_nb.CheckpointManager(path).list())
    assert [n.row for n in nodes] == list(range(6))
    lanes = {n.id: n.lane for n in nodes}
    assert {lanes[i] for i in main} == {0} and {lanes[i] for i in branch} == {1}
    parents = {n.id: n.parent for n in nodes}
    assert parents[branch[0]] == main[1] and parents[main[0]] is None


def forked_store(path: Path) -> list[str]:
    """Four checkpoints on main; branch-1 from the second (after the other two), branch-2
    from the first, main on from the fourth, then branch-3 from the fourth: forks that cross
    lanes, one of them just above another lane's node. Returns the ids in save order."""
    model = torch.nn.Linear(2, 2)
    with ckpt_nb.CheckpointManager(path) as mgr:
        ids = [mgr.save(model, step=s) for s in range(4)]
        for parent, steps in ((ids[1], (10, 11)), (ids[0], (20,)), (ids[3], (30,)),
                              (ids[3], (40,))):
            mgr.restore(parent, model=model)
            ids += [mgr.save(model, step=s) for s in steps]
    return ids


def test_the_static_dag_draws_forks_clear_of_other_nodes_and_the_labels(
        tmp_path: Path) -> None:
    """plot_dag drew a fork as a straight diagonal from its parent: across the labels of
    the parent's lane and past the nodes between; the ★ of a pinned one covered its id."""
    ids = forked_store(tmp_path / "s")
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        mgr.pin(ids[1])
    fig = ckpt_nb.plot_dag(tmp_path / "s")
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    nodes = {n.id: ax.transData.transform((n.lane, n.row))
             for n in dag_layout(ckpt_nb.CheckpointManager(tmp_path / "s").list())}
    labels = [t.get_window_extent(renderer) for t in ax.texts]
    reach = math.sqrt(70 / math.pi) * fig.dpi / 72 + 1.6  # (a node's radius, the stroke)
    lines = ax.get_lines()
    assert len(lines) == len(ids) - 1
    for line in lines:
        corners = ax.transData.transform(np.column_stack(line.get_data()))
        points = np.concatenate([np.linspace(a, b, 50) for a, b in zip(corners, corners[1:])])
        ends = [i for i, c in nodes.items() if min(np.hypot(*(points[[0, -1]] - c).T)) < 0.5]
        assert len(ends) == 2
        for cid, centre in nodes.items():
            if cid not in ends:
                assert np.hypot(*(points - centre).T).min() > reach, (ends, cid)
        for box in labels:
            assert not any(box.contains(x, y) for x, y in points), (ends, box)
    assert [t.get_text() for t in ax.texts if "★" in t.get_text()] == [f"★ {ids[1]}  step 1"]


def fanned_store(path: Path) -> list[str]:
    """A checkpoint on main, main's next, then three forks from the first (branch-1, -2,
    -3, on lanes 1, 2, 3, each saved after the last), whose edges share the row gap below
    it. Returns the ids in save order."""
    model = torch.nn.Linear(2, 2)
    with ckpt_nb.CheckpointManager(path) as mgr:
        ids = [mgr.save(model, step=0), mgr.save(model, step=1)]
        for step in (10, 20, 30):
            mgr.restore(ids[0], model=model)
            ids.append(mgr.save(model, step=step))
    return ids


def test_the_static_dag_draws_the_nearest_fork_over_the_farther_ones(tmp_path: Path) -> None:
    """Forks from one parent run along the same row gap; the last drawn, to the farthest
    lane, covered the others' starts: branch-1 seemed to fork off branch-3."""
    from matplotlib.colors import to_rgb

    ids = fanned_store(tmp_path / "s")
    nodes = {n.id: n for n in dag_layout(ckpt_nb.CheckpointManager(tmp_path / "s").list())}
    assert [nodes[i].lane for i in ids] == [0, 0, 1, 2, 3]
    fig = ckpt_nb.plot_dag(tmp_path / "s")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3] / 255
    parent = nodes[ids[0]]
    x, y = fig.axes[0].transData.transform((parent.lane + 0.5, parent.row + 0.5))
    seen = pixels[int(round(pixels.shape[0] - y)), int(round(x))]
    colours = {lane: np.array(to_rgb(_plots._lane_color(lane))) for lane in (1, 2, 3)}
    assert min(colours, key=lambda lane: np.abs(colours[lane] - seen).sum()) == 1
    assert np.abs(colours[1] - seen).max() < 0.15


def test_plots_are_figures_with_what_they_show(store) -> None:
    path, main, branch = store
    fig = ckpt_nb.plot_metrics(path, "loss", selected=[main[2]])
    assert isinstance(fig, Figure)
    assert fig._repr_png_().startswith(b"\x89PNG")  # shows itself in a notebook, no pyplot
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 2  # one line per branch
    assert sorted(len(line.get_xdata()) for line in ax.get_lines()) == [3, 4]  # from its fork
    assert len(ax.collections) == 1 and len(ax.collections[0].get_offsets()) == 1
    assert ax.get_ylabel() == "loss"

    dag = ckpt_nb.plot_dag(path, current=branch[-1], selected=[main[0]])
    edges = [line for line in dag.axes[0].get_lines()]
    assert len(edges) == 5  # every checkpoint but the root has a parent edge
    texts = [t.get_text() for t in dag.axes[0].texts]
    assert "kernel" in texts and any(t.startswith(main[0]) for t in texts)
    marks = {}
    for collection in dag.axes[0].collections:
        marks.setdefault(collection.get_gid(), []).extend(map(tuple, collection.get_offsets()))
    assert len(marks["node:incremental"]) + len(marks.get("node:full", [])) == 6
    assert marks["selected"] == [(0.0, 0.0)]  # main[0]: lane 0, row 0
    table = ckpt_nb.CheckpointManager(path).list()
    best = ckpt_nb.CheckpointManager(path).resolve("best")  # (of two equal losses, the newer)
    assert table.loc[table["id"] == best, "loss"].item() == table["loss"].min()
    lowest = next(n for n in dag_layout(table) if n.id == best)
    assert marks["best"] == [(lowest.lane, lowest.row)] and "pinned" not in marks

    diff = ckpt_nb.plot_diff(path, main[0], main[1])
    bars = diff.axes[0].patches
    table = ckpt_nb.CheckpointManager(path).diff(main[0], main[1])
    assert len(bars) == len(table) > 4  # the weights and the optimizer's state
    widths = {t: b.get_width() for t, b in zip(table["tensor"], bars)}
    changed = table[table["status"] == "changed"]["tensor"]
    # (an RNG state's has no norm: no bar, its row written "changed")
    assert all(widths[t] > 0 for t in changed if not t.startswith("rng/"))
    assert any(t.startswith("rng/") for t in changed)
    assert "changed" in [t.get_text() for t in diff.axes[0].texts]
    assert widths["objects/model/0.weight"] > 0

    compare = ckpt_nb.plot_compare(path, [main[0], main[3]])
    assert [len(ax.patches) for ax in compare.axes] == [2, 2]  # a panel per metric

    with pytest.raises(ckpt_nb.CheckpointNotFoundError, match="no checkpoint store"):
        ckpt_nb.plot_metrics(path.parent / "missing")


def test_explorer_table_sorting_selection_and_diff(store) -> None:
    path, main, branch = store
    ui = ckpt_nb.explore(path, poll_seconds=0)
    try:
        assert len(ui.table.rows) == 6 and "loss" in ui.table.columns
        lowest = min(ui.table.rows, key=lambda r: r["cells"]["loss"])
        # (bold: of equal losses, main[3]'s and branch[1]'s, the newer, as "best" takes it)
        best = ckpt_nb.CheckpointManager(path).resolve("best")
        assert [r["id"] for r in ui.table.rows if "loss" in r["best"]] == [best]
        assert [r["cells"]["loss"] for r in ui.table.rows if r["id"] == best] == \
            [lowest["cells"]["loss"]]
        by_loss = ui.sort("loss", ascending=True)
        losses = [r["cells"]["loss"] for r in ui.table.rows]
        assert losses == sorted(losses) and by_loss[0] == lowest["id"]
        ui.table.sort_by, ui.table.ascending = "step", False  # as a header click does
        steps = [r["cells"]["step"] for r in ui.table.rows]
        assert steps == sorted(steps, reverse=True)
        ui.table.selected = [branch[0]]  # as a row click does
        assert ui.selected == [branch[0]] and ui.dag.selected == [branch[0]]
        assert (ui.diff_a.value, ui.diff_b.value) == (main[1], branch[0])  # its parent
        ui.select([main[0], main[3]])
        ui.tabs.selected_index = 3
        assert ui.diff_plot.value.tobytes().startswith(b"\x89PNG")
        assert "shared chunks" in ui.diff_table.value and "rel_change" in ui.diff_table.value
        ui.tabs.selected_index = 1
        assert ui.metrics_plot.value.tobytes().startswith(b"\x89PNG")
        assert ui.compare_plot.value.tobytes().startswith(b"\x89PNG")
        ui.dag.selected = [main[2]]  # as a node click does
        assert ui.table.selected == [main[2]]
    finally:
        ui.close()


def test_explorer_actions(store, tmp_path: Path) -> None:
    path, main, branch = store
    ui = ckpt_nb.explore(path, poll_seconds=0)
    try:
        ui.select([main[0]])
        ui.pin_button.click()
        assert ckpt_nb.CheckpointManager(path).list().set_index("id").loc[main[0], "pinned"]
        ui.delete_button.click()  # refused at once, not after a Confirm
        assert ui.confirm_box.layout.display == "none"
        assert f"{main[0]} is pinned: unpin it first" in ui.status.value
        assert "force" not in ui.status.value and main[0] in set(ui.table_frame["id"])
        with pytest.raises(ckpt_nb.CheckpointInUseError, match="unpin it first"):
            ui.delete(main[0])
        ui.unpin_button.click()
        ui.delete_button.click()
        assert ui.confirm_box.layout.display == "flex"
        ui.confirm_button.click()
        assert main[0] not in set(ckpt_nb.CheckpointManager(path).list()["id"])
        ckpt_nb.CheckpointManager(path).restore(main[1], model=DigitsRun().model)  # intact
        ui.select([branch[-1]])
        ui.export_path.value = str(tmp_path / "out.pt")
        ui.export_button.click()
        state = torch.load(tmp_path / "out.pt", weights_only=True)
        assert state and "exported" in ui.status.value
        ui.export_path.value = str(tmp_path / "out.zip")
        ui.export_button.click()
        assert ".pt" in ui.status.value and "⚠" in ui.status.value
        ui.select([])
        ui.rollback_button.click()
        assert "select one checkpoint" in ui.status.value
    finally:
        ui.close()


def test_rollback_button_restores_the_kernel(tmp_path: Path, monkeypatch) -> None:
    with trained_kernel(tmp_path / "k", monkeypatch) as (sh, cell):
        result = sh.run_cell(f"ui = %ckpt_ui {tmp_path / 'k'}")
        assert result.success, result.error_in_exec
        ui = sh.user_ns["ui"]
        first = ui.table_frame["id"].iloc[0]
        assert ui.current == ui.table_frame["id"].iloc[-1] == ui.dag.current
        saved = ckpt_nb.CheckpointManager(tmp_path / "k").load(first).state["model"]["weight"]
        assert not torch.equal(sh.user_ns["model"].weight, saved)
        ui.select([first])
        ui.rollback_button.click()
        assert not torch.equal(sh.user_ns["model"].weight, saved)  # asks first
        ui.confirm_button.click()
        assert torch.equal(sh.user_ns["model"].weight, saved)
        assert f"rolled back to {first}" in ui.status.value and ui.dag.current == first
        ui.close()
        live = ckpt_nb.explore(tmp_path / "k", poll_seconds=0)  # only the session's events
        try:
            assert sh.run_cell(cell).success  # reruns from the rollback: a new branch
            saved_ids = set(ckpt_nb.CheckpointManager(tmp_path / "k").list()["id"])
            assert len(saved_ids) > 3
            last = ckpt_nb.CheckpointManager(tmp_path / "k").list()["id"].iloc[-1]

            def caught_up() -> bool:  # the last save's event may land after its row is read
                return {r["id"] for r in live.table.rows} == saved_ids and live.dag.current == last

            poll(caught_up)
            assert {r["id"] for r in live.table.rows} == saved_ids
            assert {r["cells"]["branch"] for r in live.table.rows} == {"main", "branch-1"}
            assert live.dag.current == last != first
        finally:
            live.close()
        assert not sh.run_cell("%ckpt_ui /nonexistent/store").success


def test_explorer_follows_new_saves(store, digits: DigitsRun) -> None:
    path, main, branch = store
    ui = ckpt_nb.explore(path, poll_seconds=0.2)
    try:
        mgr = ckpt_nb.CheckpointManager(path)  # another writer: seen by polling
        new = mgr.save(digits.model, digits.optimizer, 9, metrics={"loss": 0.1})

        def caught_up() -> bool:  # a refresh fills the table, then lays out the DAG
            return new in {r["id"] for r in ui.table.rows} and \
                any(n["id"] == new for n in ui.dag.nodes)

        poll(caught_up)
        assert new in {r["id"] for r in ui.table.rows}
        assert any(n["id"] == new for n in ui.dag.nodes)
    finally:
        ui.close()


def test_explorer_on_a_memory_store_follows_new_saves_and_deletes_only_its_pick(
        digits: DigitsRun) -> None:
    """Its manager keeps a catalog of its own: it saw nothing saved after it opened, and
    its delete collected the newer checkpoints it did not know."""
    url = f"memory://ckpt-nb-ui-{uuid.uuid4().hex}"
    mgr = ckpt_nb.CheckpointManager(url)
    first = mgr.save(digits.model, step=1)
    ui = ckpt_nb.explore(url, poll_seconds=0.2)
    try:
        digits.train_step()
        new = [mgr.save(digits.model, step=s) for s in (2, 3)]
        poll(lambda: {r["id"] for r in ui.table.rows} == {first, *new})
        assert {r["id"] for r in ui.table.rows} == {first, *new}
        ui.select([first])
        ui.delete_button.click()
        ui.confirm_button.click()
        assert mgr.list()["id"].tolist() == new and mgr.verify().ok
    finally:
        ui.close()


def test_another_action_or_selection_withdraws_a_pending_confirm(store, digits: DigitsRun
                                                                  ) -> None:
    """A Confirm left showing must never act later on a checkpoint no longer selected."""
    path, main, branch = store
    namespace = {"model": digits.model, "optimizer": digits.optimizer}
    ui = ckpt_nb.explore(path, namespace=namespace, poll_seconds=0)
    try:
        ui.select([main[0]])
        ui.delete_button.click()
        ui.table.selected = [main[2]]  # as a row click does
        assert ui.confirm_box.layout.display == "none" and "cancelled" in ui.status.value
        ui.pin_button.click()
        assert f"pinned {main[2]}" in ui.status.value
        said = ui.status.value
        ui.confirm_button.click()  # (hidden: a late click of a double-click does nothing)
        assert main[0] in set(ckpt_nb.CheckpointManager(path).list()["id"])
        assert main[2] in set(ckpt_nb.CheckpointManager(path).list()["id"])
        assert ui.status.value == said

        ui.select([main[1]])
        ui.rollback_button.click()
        ui.unpin_button.click()  # any other action: the question goes with it
        assert ui.confirm_box.layout.display == "none"
        said = ui.status.value
        ui.confirm_button.click()
        assert ui.dag.current is None and ui.status.value == said

        ui.delete_button.click()
        ui.selected = [main[3]]  # (set behind the views' back): Confirm checks it still
        ui.confirm_button.click()
        assert "no longer selected" in ui.status.value
        assert main[1] in set(ckpt_nb.CheckpointManager(path).list()["id"])

        ui.select([main[3]])
        ui.delete_button.click()
        ckpt_nb.CheckpointManager(path).delete(main[3])  # another manager's delete
        ui.refresh()  # as the follower does when it sees the catalog change
        assert ui.selected == [] and ui.confirm_box.layout.display == "none"
        assert f"{main[3]} was deleted (by retention or by hand, in this process or another) " \
            "while its Delete awaited Confirm" in ui.status.value  # (it said "cancelled")
        assert "cancelled" not in ui.status.value and "⚠" not in ui.status.value

        ui.select([branch[1]])
        ui.rollback_button.click()
        ckpt_nb.CheckpointManager(path).delete(branch[1])
        ui.refresh()
        assert ui.selected == [] and ui.confirm_box.layout.display == "none"
        assert f"⚠ the rollback to {branch[1]} is withdrawn: {branch[1]} was deleted (by " \
            "retention or by hand, in this process or another) while it awaited Confirm: " \
            "select another checkpoint to roll back to" in ui.status.value
    finally:
        ui.close()


@pytest.fixture
def fresh_session(monkeypatch) -> None:
    """No ckpt_nb session has run in this process: a rollback makes a temporary one."""
    monkeypatch.setattr(_session, "_positions", {})
    monkeypatch.setattr(_session, "_position_events", {})
    monkeypatch.setattr(_session, "_last", None)
    monkeypatch.setattr(_session, "_sessions", [])


def test_rollback_says_what_it_restored_and_refuses_to_restore_nothing(
        store, digits: DigitsRun, fresh_session) -> None:
    """The store's objects are "model" and "optimizer": a kernel naming them otherwise
    gets nothing back, and must hear so (and the kernel marker must stay put)."""
    path, main, branch = store
    before = digits.weights()
    namespace = {"net": digits.model, "sgd": digits.optimizer}
    ui = ckpt_nb.explore(path, namespace=namespace, poll_seconds=0)
    try:
        ui.select([main[0]])
        ui.rollback_button.click()  # refused at once: there is nothing to confirm
        status = ui.status.value
        assert "nothing to roll back" in status and "model, optimizer" in status, status
        assert "net, sgd" in status and "⚠" in status
        assert ui.confirm_box.layout.display == "none"
        with pytest.raises(ckpt_nb.CkptError, match="nothing to roll back"):
            ui.rollback(main[0])
        assert same(digits.weights(), before) and ui.dag.current is None
        assert _session.kernel_position(path) is None

        namespace["model"] = namespace.pop("net")
        ui.rollback_button.click()
        assert "It restores model; not restored: optimizer (the kernel tracks no object of " \
            "that name)" in ui.status.value
        ui.confirm_button.click()
        status = ui.status.value
        assert f"rolled back to {main[0]}: restored model;" in status, status
        assert "not restored" in status and "optimizer" in status
        saved = ckpt_nb.CheckpointManager(path).load(main[0]).state["model"]
        assert same(digits.weights(), list(saved.values())) and ui.dag.current == main[0]
    finally:
        ui.close()


def test_rollback_names_what_a_name_the_kernel_rebound_is_now(tmp_path: Path,
                                                              fresh_session) -> None:
    """With ``opt`` a string now, the question said "the kernel tracks no object of that
    name: opt", though the kernel has an ``opt``."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    namespace = {"model": model, "opt": opt, "note": "a"}
    with ckpt_nb.auto(tmp_path / "s", namespace=namespace, name="x",
                      track=["model", "opt", "note"]):
        for _ in ckpt_nb.epochs(1):
            opt.zero_grad()
            model(torch.ones(1, 4)).sum().backward()
            opt.step()
    namespace.update(opt="not an optimizer anymore", note=torch.nn.Linear)
    ui = ckpt_nb.explore(tmp_path / "s", namespace=namespace, poll_seconds=0)
    try:
        ui.select("latest")
        ui.rollback_button.click()
        question = html.unescape(ui.status.value)
        assert "It restores model; not restored: opt (now of type str, no longer the AdamW " \
            "it was saved as); note (now of type type: a saved variable is not put back " \
            "over code or a tracked object). The next save" in question, question
        assert "tracks no object" not in question
        ui.confirm_button.click()
        assert "not restored: opt (now of type str, no longer the AdamW it was saved as)" \
            in html.unescape(ui.status.value)
        assert namespace["opt"] == "not an optimizer anymore"
    finally:
        ui.close()


def test_compare_leaves_out_a_metric_none_of_the_selection_logged(tmp_path: Path) -> None:
    """A metric none of the selected checkpoints has got a panel of "n/a" marks."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    early = [mgr.save(model, step=s, metrics={"loss": 1.0 / s}) for s in (1, 2)]
    late = mgr.save(model, step=3, metrics={"loss": 0.3, "acc": 0.9, "f1": math.inf})
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        ui.tabs.selected_index = 1
        ui.select(early)
        assert [ax.get_title() for ax in ui.figure("compare").axes] == ["loss"]
        assert ui.compare_box.layout.display == "flex" and "⚠" not in ui.status.value
        ui.select([early[0], late])  # (an infinite value is logged: its panel stays)
        assert [ax.get_title() for ax in ui.figure("compare").axes] == ["acc", "f1", "loss"]
    finally:
        ui.close()


def test_a_burst_of_saves_redraws_once_a_gap_and_shows_the_last(tmp_path: Path,
                                                                fresh_session) -> None:
    """Each save of a run in this kernel redrew the open explorer (every row, the DAG, the
    visible plot) while the run waited: saving every few steps, it ran at half speed."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt_nb.CheckpointManager(tmp_path / "s").save(model, step=0)
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)  # (this kernel's saves)
    redraws: list[float] = []
    ui.table.observe(lambda _: redraws.append(time.monotonic()), names="rows")
    try:
        started = time.monotonic()
        with ckpt_nb.auto(tmp_path / "s", every_steps=1, namespace={"model": model, "opt": opt},
                          name="burst", track=["model", "opt"]):
            for _ in ckpt_nb.epochs(1):
                for _ in ckpt_nb.batches(range(40)):
                    opt.zero_grad()
                    model(torch.ones(1, 4)).sum().backward()
                    opt.step()
                    time.sleep(0.05)
        elapsed = time.monotonic() - started
        saved = len(ckpt_nb.CheckpointManager(tmp_path / "s").list())
        assert saved > 40
        least, most = _explorer.REDRAW_SECONDS
        poll(lambda: len(ui.table.rows) == saved, most + 3)
        assert len(ui.table.rows) == saved  # the last save shows once the gap is over
        assert len(redraws) <= elapsed / least + 2, (redraws, elapsed)
    finally:
        ui.close()


def test_a_double_clicked_confirm_acts_once_and_its_message_stays(
        store, digits: DigitsRun, fresh_session) -> None:
    """The second click of a double-click on Confirm arrives before the box is hidden: it
    said "⚠ nothing awaits confirmation" over the rollback's or delete's own message."""
    path, main, branch = store
    namespace = {"model": digits.model, "optimizer": digits.optimizer}
    ui = ckpt_nb.explore(path, namespace=namespace, poll_seconds=0)
    try:
        ui.select([main[0]])
        ui.rollback_button.click()
        ui.confirm_button.click()
        ui.confirm_button.click()
        assert f"rolled back to {main[0]}: restored model, optimizer" in ui.status.value
        assert "⚠" not in ui.status.value and ui.dag.current == main[0]
        ui.select([main[2]])
        ui.delete_button.click()
        ui.confirm_button.click()
        ui.confirm_button.click()
        assert f"deleted {main[2]}" in ui.status.value and "⚠" not in ui.status.value
        left = ckpt_nb.CheckpointManager(path).list()["id"].tolist()
        assert left == [i for i in main + branch if i != main[2]]
    finally:
        ui.close()


def test_store_derived_names_are_escaped_in_the_diff(tmp_path: Path) -> None:
    """The Diff tab is an HTML widget: a metric's name must show as text, not run."""
    evil = "<img src=x onerror=alert(1)>"
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    first = mgr.save(model, metrics={evil: 1.0})
    with torch.no_grad():
        model.weight.add_(1)
    second = mgr.save(model, metrics={evil: 2.0})
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        ui.select([first, second])
        ui.tabs.selected_index = 3
        assert "<img" not in ui.diff_table.value
        assert "&lt;img src=x onerror=alert(1)&gt;: 1 → 2" in ui.diff_table.value
    finally:
        ui.close()


def test_a_checkpoint_selected_twice_is_selected_once(store, monkeypatch) -> None:
    """Two names for one checkpoint broke the side-by-side plot, and the Metrics tab's
    observer raised on every later visit."""
    path, main, branch = store
    ui = ckpt_nb.explore(path, poll_seconds=0)
    try:
        assert ui.select(["latest", branch[-1]]) == [branch[-1]]
        ui.table.selected = [main[0], main[0], main[1]]  # as a view could send it
        assert ui.selected == ui.table.selected == [main[0], main[1]]
        ui.tabs.selected_index = 1
        assert ui.compare_plot.value.tobytes().startswith(b"\x89PNG")
        assert "⚠" not in ui.status.value
        compare = ckpt_nb.plot_compare(path, [main[0], main[0]])
        assert [len(ax.patches) for ax in compare.axes] == [1, 1]  # one checkpoint, 2 metrics

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("the plot broke")

        monkeypatch.setattr(_plots, "plot_metrics", broken)
        ui.tabs.selected_index = 0
        ui.tabs.selected_index = 1  # the observer reports it; nothing escapes
        assert "the plot broke" in ui.status.value and "⚠" in ui.status.value
    finally:
        ui.close()


def test_a_failed_view_selection_highlights_the_selection_again(store) -> None:
    """The buttons act on ``ui.selected``: the views must not show another checkpoint."""
    path, main, branch = store
    ui = ckpt_nb.explore(path, poll_seconds=0)
    try:
        ui.select([main[0]])
        ckpt_nb.CheckpointManager(path).delete(main[2])  # another manager; not seen yet
        ui.table.selected = [main[2]]  # as a row click does
        assert "⚠" in ui.status.value and ui.selected == [main[0]]
        assert ui.table.selected == ui.dag.selected == [main[0]]
        ui.dag.selected = [main[2]]  # as a node click does
        assert ui.table.selected == ui.dag.selected == [main[0]]
    finally:
        ui.close()


def test_created_sorts_by_the_real_time(tmp_path: Path) -> None:
    """Saves within one second show the same "created" text; descending still reverses."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    ids = [mgr.save(model, step=s) for s in range(4)]  # (milliseconds apart)
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        assert ui.sort("created") == ids
        assert ui.sort("created", ascending=False) == ids[::-1]
    finally:
        ui.close()


def test_metrics_named_like_the_tables_own_fields(tmp_path: Path) -> None:
    """A metric's value never replaces a row's own field: not the size, not the sort
    keys, not the list of best metrics the table's JS reads."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    names = ("stored", "_stored", "_logical", "_best", "cells", "best")
    ids = [mgr.save(model, metrics=dict.fromkeys(names, float(v)), step=v) for v in (3, 1, 2)]
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        columns = ui.table.columns
        assert len(columns) == len(set(columns)) and "metric:stored" in columns
        for row in ui.table.rows:
            assert row["cells"]["stored"].endswith("B") and isinstance(row["best"], list)
            assert all(isinstance(m, str) and m in columns for m in row["best"])
        values = {r["id"]: r["cells"]["metric:stored"] for r in ui.table.rows}
        assert values == dict(zip(ids, (3.0, 1.0, 2.0)))
        assert ui.sort("_stored") == [ids[1], ids[2], ids[0]]  # the metric, not the bytes
        assert ui.sort("metric:stored", ascending=False) == [ids[0], ids[2], ids[1]]
    finally:
        ui.close()


def test_non_finite_metrics_and_an_export_to_home(tmp_path: Path, monkeypatch) -> None:
    """NaN and inf are no bar (no 0.0, no infinite one), no JSON, no empty plot; inf reads
    "inf" in the table, as in ``ckpt-nb ls``; "~" is home."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    ids = [mgr.save(model, metrics={"loss": loss, "acc": math.nan}, step=s)
           for s, loss in enumerate((0.5, math.inf, math.nan))]
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        json.dumps(ui.table.rows, allow_nan=False)  # what jupyter_client sends, warning-free
        assert [r["cells"]["loss"] for r in ui.table.rows] == [0.5, "inf", None]
        assert _explorer._cell(-math.inf) == "-inf" == _cli_cell(-math.inf)
        ui.select(ids)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compare = ui.figure("compare")
            _plots.to_png(compare)
            assert sum(len(ax.patches) for ax in compare.axes) == 1  # only the finite 0.5
            texts = sorted(t.get_text() for ax in compare.axes for t in ax.texts)
            assert texts == ["inf", "n/a"]  # (no panel for acc: NaN in all three)
            assert [ax.get_title() for ax in compare.axes] == ["loss"]
            empty = ckpt_nb.plot_metrics(tmp_path / "s", "acc")
            _plots.to_png(empty)
            assert "no data" in empty.axes[0].texts[0].get_text()

        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        (tmp_path / "home").mkdir()
        monkeypatch.chdir(tmp_path)
        ui.select([ids[0]])
        ui.export_path.value = "~/e.pt"
        ui.export_button.click()
        assert (tmp_path / "home" / "e.pt").is_file() and not (tmp_path / "~").exists()
        assert str(tmp_path / "home" / "e.pt") in ui.status.value
        # One object alone, as mgr.export(only=) and `ckpt-nb export --only` write it (the
        # explorer's export had no only=: a model for inference could not be had from it)
        alone = ui.export(ids[0], tmp_path / "model.safetensors", only="model")
        fresh = torch.nn.Linear(2, 2)
        fresh.load_state_dict(safetensors.torch.load_file(alone))
        assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                     model.state_dict().values()))
        with pytest.raises(ckpt_nb.FileFormatError, match="cannot export 'opt' alone"):
            ui.export(ids[0], tmp_path / "opt.pt", only="opt")
    finally:
        ui.close()


def test_a_legend_of_many_branches_names_the_newest_and_counts_the_rest(
        tmp_path: Path) -> None:
    mgr = ckpt_nb.CheckpointManager(tmp_path / "many", metric="loss")
    model = torch.nn.Linear(2, 2)
    root = mgr.save(model, metrics={"loss": 1.0}, step=0)
    branches = []
    for k in range(12):  # roll back to the root each time: a new branch per save
        mgr.restore(root, model=model)
        cid = mgr.save(model, metrics={"loss": 1.0 / (k + 2)}, step=1)
        branches.append(mgr.list().set_index("id").loc[cid, "branch"])
    count = mgr.list()["branch"].nunique()
    assert count == 12  # (the first save after the root continues its branch)
    fig = ckpt_nb.plot_metrics(mgr, "loss")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert len(fig.axes[0].get_lines()) == count + 1  # every branch still drawn, + the count
    assert labels[-1] == f"+{count - _plots.LEGEND_BRANCHES} older branches"
    assert set(labels[:-1]) == set(branches[-_plots.LEGEND_BRANCHES:])
    assert _plots.to_png(fig)[:4] == b"\x89PNG"


def test_odd_metric_and_tensor_names_draw_and_list(tmp_path: Path) -> None:
    """A "$" read as matplotlib math failed every plot of a selection; a metric named
    "metric:step" beside one named "step" made two columns of one name, and explore()
    failed; a diverged run's -inf loss was drawn "best"."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "odd")
    model = torch.nn.Linear(2, 2)
    ids = [mgr.save(model, metrics={"cost_$_per_$_1k": float(i), "step": 1.0,
                                    "metric:step": 2.0 + i,
                                    "loss": -math.inf if i == 1 else 0.5})
           for i in range(3)]
    table = mgr.list()
    assert table.columns.is_unique and table["metric:step"].tolist() == [2.0, 3.0, 4.0]
    assert table["metric:metric:step"].tolist() == [1.0] * 3
    assert _plots.best_by_metric(table)["loss"] != ids[1]
    for figure in (ckpt_nb.plot_compare(mgr, ids), ckpt_nb.plot_metrics(mgr, "cost_$_per_$_1k")):
        assert _plots.to_png(figure)[:4] == b"\x89PNG"
    a = mgr.save(s=Holder({"$x$": torch.tensor([1j, 1j])}))
    b = mgr.save(s=Holder({"$x$": torch.tensor([1.0, 1.0])}))
    row = mgr.diff(a, b).iloc[0]
    assert row["dtype"] == "complex64->float32" and row["rel_change"] == pytest.approx(2 ** 0.5)
    assert _plots.to_png(ckpt_nb.plot_diff(mgr, a, b))[:4] == b"\x89PNG"
    ui = ckpt_nb.explore(tmp_path / "odd", poll_seconds=0)
    ui.tabs.selected_index = 1
    ui.select(ids[:2])
    assert "⚠" not in ui.status.value


def test_a_store_given_with_a_tilde_and_a_save_the_explorer_has_not_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    mgr = ckpt_nb.CheckpointManager("~/runs")
    first = mgr.save(torch.nn.Linear(2, 2), step=1)
    ui = ckpt_nb.explore("~/runs", poll_seconds=0)
    assert isinstance(ckpt_nb.plot_dag("~/runs"), Figure)
    newest = mgr.save(torch.nn.Linear(2, 2), step=2)  # (another writer, before a poll)
    assert ui.select(["latest", first]) == [newest, first]
    assert ui.table.selected == [newest, first]
    with pytest.raises(ValueError, match="choose two checkpoints"):
        ui.diff_a.value = None
        ui.figure("diff")


def test_a_metric_the_store_has_not_logged_is_refused_by_name(store) -> None:
    """A misspelt metric plotted another one (labelled so), or raised pandas' KeyError."""
    path, main, branch = store
    for plot in (lambda: ckpt_nb.plot_metrics(path, "los"),
                 lambda: ckpt_nb.plot_compare(path, [main[0], main[1]], metrics=["los"])):
        with pytest.raises(ckpt_nb.MetricNotFoundError,
                           match="no metric 'los' in this store: its metrics are 'acc', 'loss'"):
            plot()
    with pytest.raises(KeyError):  # (what a caller without ckpt_nb's names catches)
        ckpt_nb.plot_metrics(path, "los")
    assert isinstance(ckpt_nb.MetricNotFoundError("x"), ckpt_nb.CkptError)


def test_checkpoints_without_a_step_are_drawn_by_epoch_not_at_made_up_steps(
        tmp_path: Path) -> None:
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    for epoch in range(5, 10):
        mgr.save(model, epoch=epoch, metrics={"loss": 1 / epoch})
    mgr.save(model, epoch=10, step=5000, metrics={"loss": 0.05})
    ax = ckpt_nb.plot_metrics(mgr, "loss").axes[0]
    assert ax.get_xlabel() == "epoch"
    assert list(ax.get_lines()[0].get_xdata()) == [5, 6, 7, 8, 9, 10]
    mgr.save(model, step=6000, metrics={"loss": 0.04})  # no epoch: left out, and counted
    ax = ckpt_nb.plot_metrics(mgr, "loss").axes[0]
    assert ax.get_xlabel() == "epoch (1 checkpoint without one not shown)"
    assert list(ax.get_lines()[0].get_xdata()) == [5, 6, 7, 8, 9, 10]
    other = ckpt_nb.CheckpointManager(tmp_path / "t")
    other.save(model, metrics={"loss": 1.0})
    other.save(model, metrics={"loss": 0.5})
    ax = ckpt_nb.plot_metrics(other, "loss").axes[0]
    assert ax.get_xlabel() == "checkpoint, in save order (none has a step or epoch)"


def test_compare_gives_each_metric_its_scale_and_each_checkpoint_a_colour(
        tmp_path: Path) -> None:
    """30 checkpoints drew a blank figure (the legend outgrew it), colours repeated past
    10, and a perplexity of 300 flattened a loss of 0.3 on one shared axis."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    long = "validation/cross_entropy_loss_on_the_held_out_set_of_imagenet_val"
    ids = [mgr.save(model, step=i, metrics={"loss": 0.5 / (i + 1), "perplexity": 300.0 / (i + 1),
                                            long: 1.0}) for i in range(30)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ("constrained_layout not applied" among them)
        fig = ckpt_nb.plot_compare(mgr, ids)
        _plots.to_png(fig)
    assert len(fig.axes) == 3 and all(ax.get_legend() is None for ax in fig.axes)
    loss = next(ax for ax in fig.axes if ax.get_title() == "loss")
    assert loss.get_ylim()[1] < 1  # its own scale, not the perplexity's
    assert [t.get_text() for t in loss.get_xticklabels()] == ids
    colors = {tuple(bar.get_facecolor()) for bar in loss.patches}
    assert len(colors) == 30
    assert all(len(line) <= 28 for ax in fig.axes for line in ax.get_title().split("\n"))


def test_compare_bars_are_no_branch_colours_and_long_names_break_between_words(
        tmp_path: Path) -> None:
    """The compare bars took matplotlib's blue and orange, main's and branch-1's in the
    line plot above; "n/a" was written in light colours, unreadable on white; a long
    metric's axis label broke mid-word; the Metrics dropdown cut a long name at 280 px."""
    from matplotlib.colors import rgb_to_hsv, to_rgb

    long = "validation/cross_entropy_loss_top1"
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    ids = [mgr.save(model, step=i, metrics={long: 0.5 / (i + 1), "acc": 0.1 * i})
           for i in range(3)]
    ids.append(mgr.save(model, step=3, metrics={"acc": 0.9}))
    fig = ckpt_nb.plot_compare(mgr, ids)
    _plots.to_png(fig)
    bars = [bar for ax in fig.axes for bar in ax.patches]
    # (a slate grey; the hues of the line plot, matplotlib's cycle: 0.45 and more, but C7's grey)
    assert max(rgb_to_hsv(to_rgb(bar.get_facecolor()))[1] for bar in bars) < 0.4
    panel = next(ax for ax in fig.axes if ax.get_title() == "acc")
    assert [bool(bar.get_hatch()) for bar in panel.patches] == [False, True, False, True]
    (mark,) = [t for ax in fig.axes for t in ax.texts]
    assert mark.get_text() == "n/a" and max(to_rgb(mark.get_color())) < 0.3  # dark text
    assert ckpt_nb.plot_metrics(mgr, long).axes[0].get_ylabel() == \
        "validation/cross_entropy_\nloss_top1"
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        ui.metric.value = long
        assert ui.metric.tooltip == long and ui.metric.layout.max_width == "100%"
        assert int(ui.metric.layout.width.removesuffix("px")) >= 110 + 8 * len(long)
    finally:
        ui.close()


def test_a_long_metric_name_breaks_not_inside_a_number(tmp_path: Path) -> None:
    """"train loss (smoothed, ema 0.99) over the last epoch" broke after the "." of 0.99:
    "ema 0." over "99) over..."; a "." between letters is still a place to break."""
    names = ["train loss (smoothed, ema 0.99) over the last epoch",
             "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t"]
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        mgr.save(torch.nn.Linear(2, 2), step=0, metrics={name: 1.0 for name in names})
        labels = [ckpt_nb.plot_metrics(mgr, name).axes[0].get_ylabel() for name in names]
    assert labels == ["train loss (smoothed, ema \n0.99) over the last epoch",
                      "a.b.c.d.e.f.g.h.i.j.k.l.m.n.\no.p.q.r.s.t"]


def test_an_action_failing_unexpectedly_says_so(store, monkeypatch) -> None:
    """Export's TypeError (of a damaged checkpoint) escaped the button: the click did
    nothing to see."""
    path, main, branch = store

    def damaged(*args: object, **kwargs: object) -> None:
        raise TypeError("unsupported operand type(s)")

    monkeypatch.setattr(_interop, "write_file", damaged)
    ui = ckpt_nb.explore(path, poll_seconds=0)
    try:
        ui.select([main[0]])
        ui.export_path.value = "out.pt"
        ui.export_button.click()
        assert "⚠ Export failed: TypeError: unsupported operand type(s)" in ui.status.value

        def interrupted() -> None:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            ui._guard(interrupted)
    finally:
        ui.close()


def test_a_store_removed_while_open_is_named_gone(store, tmp_path: Path) -> None:
    path, main, branch = store
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    ui = ckpt_nb.explore(copy, poll_seconds=0)
    try:
        ui.select([main[0]])
        shutil.rmtree(copy)
        ui.refresh()
        gone = f"the store at {copy} no longer exists"
        assert gone in ui.status.value
        for button in (ui.pin_button, ui.delete_button, ui.rollback_button):
            ui.status.value = ""
            button.click()
            assert gone in ui.status.value and "Errno" not in ui.status.value
        ui.tabs.selected_index = 3
        assert gone in ui.status.value
        assert not copy.exists()
    finally:
        ui.close()


def test_a_stale_error_goes_and_a_deleted_checkpoint_is_named_deleted(tmp_path: Path) -> None:
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    x, y, z = (mgr.save(model, step=s) for s in (1, 2, 3))
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        ui.select([z])
        ui.tabs.selected_index = 3  # diff y -> z
        ckpt_nb.CheckpointManager(tmp_path / "s").delete(y)  # another process
        ui.table.selected = [y]  # a click on its row, before the table is read again
        assert f"checkpoint {y} was deleted" in ui.status.value
        ui.diff_b.value = x  # a redraw
        assert f"checkpoint {y} was deleted" in ui.status.value
        assert "list()" not in ui.status.value
        ui.refresh()
        assert ui.status.value == "" and y not in set(ui.table_frame["id"])
    finally:
        ui.close()


def test_the_diff_tab_goes_from_older_to_newer_and_says_when_there_is_nothing(
        tmp_path: Path) -> None:
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    a = mgr.save(model, step=7)
    b = mgr.save(model, step=8)
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        ui.tabs.selected_index = 3
        ui.select([a])  # the root: nothing to diff, and no broken image
        assert ui.diff_plot.layout.display == "none"
        assert f"{a} has no parent" in ui.diff_table.value
        ui.select([b, a])  # clicked newest first
        assert (ui.diff_a.value, ui.diff_b.value) == (a, b)
        assert ui.diff_plot.layout.display is None
        assert ui.diff_a.label == f"{a}  step 7  main"
    finally:
        ui.close()


def test_an_empty_store_says_so_and_one_checkpoint_is_singular(tmp_path: Path) -> None:
    ckpt_nb.CheckpointManager(tmp_path / "s").close()
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        assert "no checkpoints yet" in ui.table_note.value
        assert ui.table_note.layout.display is None and ui.dag_note.layout.display is None
        assert ui.dag.layout.display == "none"
        ui.tabs.selected_index = 3
        assert "no checkpoints yet" in ui.diff_table.value
        assert ui.diff_plot.layout.display == "none"
        ckpt_nb.CheckpointManager(tmp_path / "s").save(torch.nn.Linear(2, 2))
        ui.refresh()
        assert ui.table_note.layout.display == ui.dag_note.layout.display == "none"
        assert ui.dag.layout.display is None
        assert " 1 checkpoint · " in ui.title.value
    finally:
        ui.close()


def test_created_shows_local_time_as_the_cli_does(tmp_path: Path, monkeypatch) -> None:
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    mgr.save(torch.nn.Linear(2, 2))
    created = mgr.list()["created"].iloc[0].timestamp()
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # (UTC+9: the two cannot agree by chance)
    time.tzset()
    try:
        ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
        assert ui.table.rows[0]["cells"]["created"] == _time(created)
        ui.close()
    finally:
        monkeypatch.undo()
        time.tzset()


def test_the_metric_chosen_stays_when_a_save_logs_a_new_one(tmp_path: Path) -> None:
    """New options reset the Metrics dropdown to the first: a save that logged a new
    metric ("aux") replaced the user's val_acc by it. One the store no longer has gives
    way to the ranked one."""
    model = torch.nn.Linear(2, 2)
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        mgr.save(model, metrics={"val_loss": 0.5, "val_acc": 0.8}, step=1)
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        ui.tabs.selected_index = 1
        ui.metric.value = "val_acc"
        with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
            aux = mgr.save(model, metrics={"val_loss": 0.4, "val_acc": 0.9, "aux": 1.0},
                           step=2)
        assert ui.refresh() is True
        assert [name for _, name in ui.metric.options] == ["aux", "val_acc", "val_loss"]
        assert ui.metric.value == "val_acc"
        assert ui.figure("metrics").axes[0].get_ylabel() == "val_acc"
        ui.metric.value = "aux"
        ui.delete(aux)  # (the only checkpoint that logged aux)
        assert [name for _, name in ui.metric.options] == ["val_acc", "val_loss"]
        assert ui.metric.value == "val_loss"
    finally:
        ui.close()


def test_the_explorers_own_first_metric_gives_way_to_a_loss_logged_later(
        tmp_path: Path) -> None:
    """The first save logged only val_acc, the next val_loss too: the dropdown stayed on
    val_acc, the explorer's own pick kept as if the user had chosen it (it starts at the
    loss-like one). A metric the user picks stays."""
    model = torch.nn.Linear(2, 2)
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    mgr.save(model, metrics={"val_acc": 0.5}, step=1)
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        ui.tabs.selected_index = 1
        assert ui.metric.value == "val_acc"
        mgr.save(model, metrics={"val_acc": 0.6, "val_loss": 1.0}, step=2)
        assert ui.refresh() is True and ui.metric.value == "val_loss"
        assert ui.figure("metrics").axes[0].get_ylabel() == "val_loss"
        ui.metric.value = "val_acc"  # (the user's pick)
        mgr.save(model, metrics={"val_acc": 0.7, "val_loss": 0.9, "aux_loss": 2.0}, step=3)
        assert ui.refresh() is True and ui.metric.value == "val_acc"
    finally:
        ui.close()
        mgr.close()


def test_long_notes_are_cut_and_metric_names_agree(tmp_path: Path) -> None:
    """A 300-character note pushed the metrics out of view; the dropdown named a metric
    otherwise than the table and chose "acc" (alphabetical) over the loss."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    mgr.save(torch.nn.Linear(2, 4), metrics={"acc": 0.5, "val_loss": 1.0, "stored": 2.0},
             note="x" * 300)
    mgr.save(torch.nn.Sequential(torch.nn.Linear(2, 4)), metrics={"val_loss": 0.5},
             note="short")
    ids = mgr.list()["id"].tolist()
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        first, second = ui.table.rows
        assert len(first["cells"]["note"]) == _explorer.NOTE_CHARS
        assert first["titles"] == {"note": "x" * 300} and second["titles"] == {}
        assert ui.dag.layout.max_height == _explorer.DAG_HEIGHT
        assert ui.dag.layout.overflow == "auto"
        labels = [label for label, _ in ui.metric.options]
        assert labels == ui.table.columns[len(_explorer.TABLE_COLUMNS) - 1:-1]
        assert ui.table.columns[-1] == "note"  # (last, as in ckpt-nb ls)
        assert "metric:stored" in labels and ui.metric.value == "val_loss"
        ui.select([ids[1]])
        ui.tabs.selected_index = 3  # a tensor removed: no l2, no rel_change
        assert "removed" in ui.diff_table.value
        assert "nan" not in ui.diff_table.value and "—" in ui.diff_table.value
    finally:
        ui.close()


def test_ckpt_ui_takes_dir_as_ckpt_rollback_does(store) -> None:
    """"%ckpt_ui --dir X" looked for a store at "--dir X"."""
    path, main, branch = store
    sh = InteractiveShell.instance()
    sh.run_cell("%load_ext ckpt_nb")
    try:
        for line in (f"--dir {path}", f"--dir={path}", f'--dir "{path}"', str(path)):
            result = sh.run_cell(f"ui = %ckpt_ui {line}")
            assert result.success, (line, result.error_in_exec)
            assert len(sh.user_ns["ui"].table.rows) == 6
            sh.user_ns["ui"].close()
        assert not sh.run_cell("%ckpt_ui --dir").success
    finally:
        sh.run_cell("%unload_ext ckpt_nb")


def test_a_cell_run_again_closes_the_explorers_of_its_earlier_runs(store) -> None:
    """Each re-run left an explorer polling the store, its catalog open."""
    path, main, branch = store
    sh = InteractiveShell.instance()
    opened = f"ckpt_nb.explore({str(path)!r}, poll_seconds=0.2)"
    try:
        sh.run_cell(f"import ckpt_nb\na = {opened}\nb = {opened}", cell_id="cell-1")
        first = [sh.user_ns["a"], sh.user_ns["b"]]
        sh.run_cell(f"other = {opened}", cell_id="cell-2")
        assert not any(ui._stop.is_set() for ui in first)  # both of one run stay
        sh.run_cell(f"a = {opened}", cell_id="cell-1")
        for ui in first:
            ui._follower.join(5)
            assert not ui._follower.is_alive()
        assert not sh.user_ns["a"]._stop.is_set() and not sh.user_ns["other"]._stop.is_set()
    finally:
        for name in ("a", "b", "other"):
            sh.user_ns[name].close()


def test_another_managers_pins_and_notes_show_within_the_poll() -> None:
    """A store without a catalog file of its own (memory://, an object store) was watched
    by its manifests alone: a pin or note from elsewhere waited for the next save."""
    url = f"memory://ckpt-nb-ui-{uuid.uuid4().hex}"
    a, b = (ckpt_nb.CheckpointManager(url).save(torch.nn.Linear(2, 2), step=s) for s in (1, 2))
    ui = ckpt_nb.explore(url, poll_seconds=0.2)
    try:
        def shown() -> list[list[Any]]:
            return ui.table_frame[["pinned", "note"]].values.tolist()

        elsewhere = ckpt_nb.CheckpointManager(url)
        elsewhere.pin(a)
        elsewhere.annotate(b, "n1")
        poll(lambda: shown() == [[True, ""], [False, "n1"]])
        assert shown() == [[True, ""], [False, "n1"]]
        elsewhere.unpin(a)  # (the same labels rewritten: their keys stay, their sizes too)
        elsewhere.annotate(b, "n2")
        poll(lambda: shown() == [[False, ""], [False, "n2"]])
        assert shown() == [[False, ""], [False, "n2"]]
    finally:
        ui.close()


class Relay:
    """A TCP relay to a server on loopback that goes down (connections refused) and comes
    back on the same port: a store's server lost and found again, for real. The port stays
    the relay's while it is down: a socket bound to it that never listens (a connection is
    refused) holds it, shared only by a socket of this user's with SO_REUSEPORT set, the
    relay's listener. Let go, another test process could take it (a server's bind, or a
    connection's own end): the explorer's requests would reach that server instead of
    being refused, or up() would fail."""

    def __init__(self, target: str) -> None:
        self.target = int(target.rsplit(":", 1)[1])
        self.holder = socket.socket()
        self.holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self.holder.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.holder.getsockname()[1]}"
        self.open: list[socket.socket] = []
        self.up()

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # (down)
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.open += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)

    def down(self) -> None:
        for sock in (self.listener, *self.open):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.open.clear()

    def up(self) -> None:
        self.listener = socket.socket()
        for option in (socket.SO_REUSEADDR, socket.SO_REUSEPORT):  # (REUSEADDR: binds
            self.listener.setsockopt(socket.SOL_SOCKET, option, 1)  # over TIME_WAITs)
        self.listener.bind(self.holder.getsockname())
        self.listener.listen()
        threading.Thread(target=self._serve, args=(self.listener,), daemon=True).start()

    def close(self) -> None:
        self.down()
        self.holder.close()


@pytest.fixture
def s3_url(bucket: str) -> str:
    """A store's URL in a new bucket of the module's S3 server on loopback (conftest's)."""
    return f"s3://{bucket}/exp"


@contextlib.contextmanager
def explorer_behind_relay(endpoint: str, s3_url: str, poll_seconds: float
                          ) -> Iterator[tuple[Any, Relay, str, str]]:
    """An explorer of an S3 store of two checkpoints (a, b), read through a relay the
    test takes down and brings back up (one try a request)."""
    model = torch.nn.Linear(2, 2)
    a, b = (ckpt_nb.CheckpointManager(s3_url).save(model, step=s) for s in (1, 2))
    relay = Relay(endpoint)
    mgr = ckpt_nb.CheckpointManager(FsspecStore(s3_url, endpoint_url=relay.url,
                                                config_kwargs={"retries": {"max_attempts": 1}}))
    ui = ckpt_nb.explore(mgr, poll_seconds=poll_seconds)
    try:
        yield ui, relay, a, b
    finally:
        ui.close()
        mgr.close()
        relay.close()


def test_a_server_down_shows_in_the_status_line_and_goes_when_it_is_back(
        endpoint: str, s3_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The follower swallowed the failure (the status line kept "pinned ..." in green);
    refresh() and select() raised the StoreError; a pin from another machine waited for
    a refresh by hand."""
    with explorer_behind_relay(endpoint, s3_url, 0.2) as (ui, relay, a, b):
        ui.select([a])
        ui.pin_button.click()
        assert f"pinned {a}" in ui.status.value
        relay.down()
        poll(lambda: "⚠" in ui.status.value, 60)
        assert "⚠" in ui.status.value and "pinned" not in ui.status.value
        assert s3_url in ui.status.value and _explorer.STALE in ui.status.value
        assert ui.refresh() is False and ui.select([b]) == [a]
        assert "⚠" in ui.status.value and ui.table_frame["id"].tolist() == [a, b]
        monkeypatch.setenv("HOME", str(tmp_path / "home-2"))  # another machine
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # (its catalog: rebuilt)
            ckpt_nb.CheckpointManager(s3_url).annotate(b, "from machine 2")
        relay.up()
        poll(lambda: ui.status.value == "", 60)
        assert ui.status.value == ""
        assert ui.table_frame[["pinned", "note"]].values.tolist() == \
            [[True, ""], [False, "from machine 2"]]
        assert ui.refresh() is True and ui.select([b]) == [b]


def test_a_click_the_store_could_not_select_is_the_reason_a_button_gives(
        endpoint: str, s3_url: str) -> None:
    """With the S3 server down a row's click selected nothing, and the Pin clicked after it
    said "select one checkpoint first" (the read error was not the reason given); with a
    checkpoint selected before, the view showed the row clicked while Pin acted on the
    other one."""
    with explorer_behind_relay(endpoint, s3_url, 0) as (ui, relay, a, b):
        relay.down()
        ui.table.selected = [b]  # (a row's click)
        assert ui.selected == [] and ui.table.selected == [] and ui.dag.selected == []
        ui.pin_button.click()
        said = html.unescape(ui.status.value)
        assert f"⚠ Pin failed: {b} could not be selected: " in said and s3_url in said
        assert "press it again once the store can be read" in said
        assert "select one checkpoint first" not in said
        relay.up()
        assert ui.refresh() is True
        ui.table.selected = [a]
        relay.down()
        ui.dag.selected = [b]  # (a node's click)
        assert ui.selected == ui.table.selected == ui.dag.selected == [a]
        ui.pin_button.click()  # (not a's pin: b was clicked)
        assert f"⚠ Pin failed: {b} could not be selected: " in html.unescape(ui.status.value)
        relay.up()
        assert ui.refresh() is True  # (the views show what Pin acts on again)
        ui.pin_button.click()
        assert f"pinned {a}" in ui.status.value
        assert ui.table_frame.set_index("id")["pinned"].to_dict() == {a: True, b: False}


@pytest.mark.parametrize("poll_seconds", [0.2, 0])  # (read by the poll; else the button)
def test_the_buttons_act_again_once_the_store_reads_after_a_click_it_could_not_select(
        endpoint: str, s3_url: str, poll_seconds: float) -> None:
    """After a click the store could not be read for, the buttons kept refusing, and the
    status line kept saying the store could not be read, though the polls read it fine:
    only a click on another row undid it (the one shown selected changed nothing)."""
    with explorer_behind_relay(endpoint, s3_url, poll_seconds) as (ui, relay, a, b):
        ui.table.selected = [a]
        relay.down()
        ui.table.selected = [b]  # (undone: a stays selected)
        assert _explorer.STALE in html.unescape(ui.status.value)
        relay.up()
        if poll_seconds:
            poll(lambda: ui.status.value == "", 60)
            assert ui.status.value == ""
        ui.dag.selected = [a]  # (the node shown selected: no change)
        ui.pin_button.click()
        assert f"pinned {a}" in ui.status.value
        assert ui.table_frame.set_index("id")["pinned"].to_dict() == {a: True, b: False}


def test_a_click_the_store_could_not_select_withdraws_the_question_awaiting_confirm(
        endpoint: str, s3_url: str) -> None:
    """Delete asked about a; a click on b failed, the store unreadable; with the store
    back, Confirm deleted a, which the user had moved away from."""
    with explorer_behind_relay(endpoint, s3_url, 0) as (ui, relay, a, b):
        ui.table.selected = [a]
        ui.delete_button.click()
        assert f"Delete checkpoint {a}?" in ui.status.value
        assert ui.confirm_box.layout.display == "flex"
        relay.down()
        ui.table.selected = [b]
        assert ui.confirm_box.layout.display == "none"
        relay.up()
        ui.confirm_button.click()
        assert f"deleted {a}" not in ui.status.value
        assert ui.refresh() is True and ui.table_frame["id"].tolist() == [a, b]


def test_an_object_store_deleted_while_open_is_named_gone(s3_url: str) -> None:
    """Its manager read the empty prefix as a store of no checkpoints: the table emptied,
    the status line said nothing."""
    import s3fs

    a = ckpt_nb.CheckpointManager(s3_url).save(torch.nn.Linear(2, 2), step=1)
    ui = ckpt_nb.explore(s3_url, poll_seconds=0.2)
    try:
        s3fs.S3FileSystem().rm(s3_url, recursive=True)
        gone = f"the store at {s3_url} no longer exists"
        poll(lambda: gone in ui.status.value)
        assert gone in ui.status.value and ui.table_frame["id"].tolist() == [a]
    finally:
        ui.close()


def test_a_failed_action_says_which_action_failed(tmp_path: Path) -> None:
    """A store that could not be reached said only "listing manifests ... failed": not
    that the click's Unpin (or the confirmed Delete) was not done."""
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(torch.nn.Linear(2, 2))
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        ui.select([cid])
        ui.delete_button.click()
        shutil.rmtree(tmp_path / "s")
        ui.confirm_button.click()
        assert f"⚠ Delete of {cid} failed: " in ui.status.value
        ui.pin_button.click()
        assert "⚠ Pin failed: " in ui.status.value
    finally:
        ui.close()


def test_the_dag_takes_the_themes_colours() -> None:
    """In JupyterLab Dark the DAG's labels and the selection ring were black on dark grey
    (text with no fill, a ring stroked "black") and incremental nodes were white discs."""
    esm = _explorer._DAG_ESM
    assert '"black"' not in esm and '"white"' not in esm
    rules = dict(re.findall(r"(\.ckpt-nb-dag [^{]+?) \{([^}]*)\}", esm))
    font = "var(--jp-ui-font-color1, var(--vscode-editor-foreground, currentColor))"
    assert " ".join(rules[".ckpt-nb-dag text"].split()) == f"fill: {font};"
    assert f"stroke: {font}" in " ".join(rules[".ckpt-nb-dag .ckpt-nb-ring"].split())
    assert " ".join(rules[".ckpt-nb-dag .ckpt-nb-hollow"].split()) == \
        "fill: var(--jp-layout-color0, var(--vscode-editor-background, white));"
    assert 'setAttribute("class", "ckpt-nb-ring")' in esm
    assert 'setAttribute("class", "ckpt-nb-hollow")' in esm
    assert "1px solid var(--jp-border-color2, #ddd)" in _explorer._TABLE_ESM


def test_a_narrow_explorer_wraps_its_rows_and_texts(store) -> None:
    """In a ~380 px output the Diff tab's "to" was off the right edge, the metric deltas
    cut off (the diff's wide table set their width) and the tab titles cut to "Check"."""
    path, main, branch = store
    ui = ckpt_nb.explore(path, poll_seconds=0)
    try:
        assert ui.children[-1] is ui.css and f"<style>{_explorer.EXPLORER_CSS}</style>" == \
            ui.css.value and ui.css.layout.display == "none"
        css = " ".join(_explorer.EXPLORER_CSS.split())
        assert "-tab > .lm-TabBar .lm-TabBar-tab, " in css and " min-width: max-content; }" in css
        assert ".widget-html-content { min-width: 0; white-space: normal;" in css
        row = ui.diff_a.layout, ui.diff_b.layout
        assert ui.diff_table.value == "" and [r.max_width for r in row] == ["100%", "100%"]
        assert ui.tabs.children[3].children[0].layout.flex_flow == "row wrap"
        ui.tabs.selected_index = 3
        ui.select([main[0], main[1]])
        assert "<div class='ckpt-nb-scroll'><table" in ui.diff_table.value
    finally:
        ui.close()


def test_sizes_read_as_the_cli_says(store) -> None:
    """The explorer said 9.9 KB where ``ckpt-nb ls`` said 9.7 KiB."""
    path, main, branch = store
    table = ckpt_nb.CheckpointManager(path).list().set_index("id")
    ui = ckpt_nb.explore(path, poll_seconds=0)
    try:
        for row in ui.table.rows:
            assert row["cells"]["stored"] == human_size(int(table.loc[row["id"], "stored_bytes"]))
            assert row["cells"]["logical"] == human_size(int(table.loc[row["id"], "logical_bytes"]))
        assert "KiB" in ui.table.rows[0]["cells"]["logical"]
        assert f"{human_size(int(table['stored_bytes'].sum()))} stored" in ui.title.value
    finally:
        ui.close()


def test_a_slightly_changed_tensor_is_labelled_with_its_change(tmp_path: Path) -> None:
    """A tensor changed by 0.15 % (an RNG state) had neither a visible bar nor a label."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(8, 8)
    a = mgr.save(model)
    with torch.no_grad():
        model.weight.mul_(2.0)
        model.bias.mul_(1.0015)
    b = mgr.save(model)
    diff = mgr.diff(a, b).set_index("tensor")
    fig = ckpt_nb.plot_diff(tmp_path / "s", a, b)
    labels = {t.get_text(): t.xy[1] for t in fig.axes[0].texts}
    rows = {name: row for row, name in enumerate(diff.index)}
    small = f"{diff.loc['objects/model/bias', 'rel_change']:.2g}"
    assert small == "0.0015" and labels[small] == rows["objects/model/bias"]
    assert set(labels) == {small, "identical"}  # (the weight's bar shows: no label; the RNG)
    mgr.close()


@contextlib.contextmanager
def trained_kernel(path: Path, monkeypatch) -> Iterator[tuple[InteractiveShell, str]]:
    """A kernel that trained a model under ``%%ckpt_auto`` into ``path``: the shell and
    the training cell."""
    monkeypatch.setattr(_session, "_positions", {})
    monkeypatch.setattr(_session, "_position_events", {})
    monkeypatch.setattr(_session, "_left_values", {})
    monkeypatch.setattr(_session, "_last", None)
    sh = InteractiveShell.instance()
    sh.run_cell("%load_ext ckpt_nb")
    try:
        sh.run_cell("import torch, ckpt_nb\ntorch.manual_seed(0)\n"
                    "model = torch.nn.Linear(4, 2)\nopt = torch.optim.SGD(model.parameters(), 0.1)")
        cell = (f"%%ckpt_auto --dir {path} --every-steps 1\n"
                "for _ in ckpt_nb.epochs(3):\n    opt.zero_grad(); model(torch.ones(1, 4)).sum()"
                ".backward(); opt.step()")
        assert sh.run_cell(cell).success
        yield sh, cell
    finally:
        sh.run_cell("%unload_ext ckpt_nb")


def test_the_rollback_message_goes_once_checkpoints_are_saved_since(
        tmp_path: Path, monkeypatch) -> None:
    """After Roll back and a re-run the status line still said "the next save starts a
    branch from it" with the branch's saves in the table."""
    with trained_kernel(tmp_path / "k", monkeypatch) as (sh, cell):
        ui = ckpt_nb.explore(tmp_path / "k", poll_seconds=0)  # (this process's saves)
        try:
            first = ui.table_frame["id"].iloc[0]
            ui.select([first])
            ui.rollback_button.click()
            assert ". The next save starts a branch from it." in ui.status.value
            ui.confirm_button.click()
            assert "the next save starts a branch from it" in ui.status.value
            assert sh.run_cell(cell).success
            table = ckpt_nb.CheckpointManager(tmp_path / "k").list()
            new = table[table["branch"] == "branch-1"]
            said = (f"rolled back to {first}; {len(new)} checkpoints saved since, the newest "
                    f"{new['id'].iloc[-1]} on branch-1")
            poll(lambda: said in ui.status.value)
            assert said in ui.status.value and "next save" not in ui.status.value
            ui.pin(first)  # any other message replaces it, and is not replaced in turn
            ui.refresh()
            assert f"pinned {first}" in ui.status.value
        finally:
            ui.close()


def test_deleting_the_kernels_checkpoint_marks_the_kernel_at_its_heir(
        tmp_path: Path, monkeypatch) -> None:
    """After the explorer's Delete of the checkpoint marked "kernel →" the DAG marked the
    kernel nowhere."""
    with trained_kernel(tmp_path / "k", monkeypatch):
        ui = ckpt_nb.explore(tmp_path / "k", poll_seconds=0)
        try:
            *_, heir, current = ui.table_frame["id"]
            assert ui.dag.current == current and ui.dag.current_deleted is None
            assert ui.kernel_note.layout.display == "none"
            ui.select([current])
            ui.delete_button.click()
            ui.confirm_button.click()
            assert (ui.dag.current, ui.dag.current_deleted) == (heir, current)
            assert f"the kernel's state came from it: the DAG marks the kernel (⇢) at {heir}" \
                in html.unescape(ui.status.value)
            assert ui.kernel_note.layout.display is None
            assert f"came from {current}, deleted since; {heir} is its nearest kept" in \
                ui.kernel_note.value
            ui.refresh()  # (and stays marked)
            assert (ui.dag.current, ui.dag.current_deleted) == (heir, current)
        finally:
            ui.close()


def stepped_saves(mgr: ckpt_nb.CheckpointManager, model: torch.nn.Linear, n: int) -> list[str]:
    """``n`` saves, the weight one higher and the loss ``float(step)`` at each."""
    ids = []
    for step in range(n):
        with torch.no_grad():
            model.weight.add_(1.0)
        ids.append(mgr.save(model, step=step, metrics={"loss": float(step)}))
    return ids


def test_the_diff_tab_computes_each_diff_once(tmp_path: Path) -> None:
    """A refresh or a selection with the Diff tab open diffs once, and a refresh that
    leaves from/to as they were not again (each change of from/to drew it again: a
    refresh after a save diffed five times, on the follower thread while training ran)."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(4, 4)
    ids = stepped_saves(mgr, model, 4)
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    diffed: list[tuple[str, str]] = []
    real_diff = ui.manager.diff

    def counted_diff(a: str, b: str) -> Any:
        diffed.append((a, b))
        return real_diff(a, b)

    ui.manager.diff = counted_diff
    try:
        ui.tabs.selected_index = 3
        ui.select([ids[1]])  # one row: against its parent
        assert diffed == [(ids[0], ids[1])]
        ui.select([ids[3], ids[1]])  # two rows, the newer first
        assert diffed[1:] == [(ids[1], ids[3])]
        mgr.save(model, step=4)
        assert ui.refresh()
        assert diffed[2:] == []  # (the same pair: drawn as it was)
        assert "loss: 1 → 3" in ui.diff_table.value
        ui.diff_b.value = ids[2]  # the user picks another "to"
        assert diffed[2:] == [(ids[1], ids[2])]
        assert "loss: 1 → 2" in ui.diff_table.value
    finally:
        ui.close()
        mgr.close()


def test_a_diff_that_fails_leaves_no_other_pairs_table(tmp_path: Path) -> None:
    """A pair whose diff fails (a damaged pack) shows no diff: the last pair's bars and
    table under from/to that name the new pair read as its."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s", strategy="full")
    model = torch.nn.Linear(64, 64)
    ids = stepped_saves(mgr, model, 2)
    packs = tmp_path / "s" / "packs"
    before = set(packs.glob("*.pack"))
    with torch.no_grad():  # (the third of stepped_saves, here: the pack it writes is named
        model.weight.add_(1.0)  # by what it adds, not by an mtime that two saves may share)
    ids.append(mgr.save(model, step=2, metrics={"loss": 2.0}))
    mgr.close()
    newest, = set(packs.glob("*.pack")) - before
    data = bytearray(newest.read_bytes())
    data[len(data) // 3] ^= 0xFF  # the third checkpoint's chunks no longer match
    newest.write_bytes(bytes(data))
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.tabs.selected_index = 3
        ui.select([ids[0], ids[1]])
        assert "loss: 0 → 1" in ui.diff_table.value
        ui.diff_b.value = ids[2]
        assert "cannot draw this tab" in ui.status.value
        assert ui.diff_table.value == "" and ui.diff_plot.layout.display == "none"
    finally:
        ui.close()


def test_a_single_id_given_as_a_string_is_one_id(tmp_path: Path) -> None:
    """``select("07")``, ``plot_compare(store, "latest")``: one id, not its characters
    (each a prefix of some id, they selected other checkpoints)."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    ids = [mgr.save(torch.nn.Linear(2, 2), step=i, metrics={"loss": 1 / (i + 1)})
           for i in range(2)]
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        assert ui.select(ids[0]) == [ids[0]]
        assert ui.select("latest") == [ids[1]]
        # four characters, each a prefix of an id (or a prefix of one)
        four = ids[1][0] + ids[0][0] + ids[1][0] + ids[0][0]
        prefixed = [i for i in ids if i.startswith(four)]
        if prefixed:
            assert ui.select(four) == prefixed
        else:
            with pytest.raises(ckpt_nb.CheckpointNotFoundError):
                ui.select(four)
        with pytest.raises(ckpt_nb.CheckpointNotFoundError, match="too short"):
            ui.select(ids[0][:2])  # (a prefix names an id from 4 characters on)
    finally:
        ui.close()
    fig = ckpt_nb.plot_compare(tmp_path / "s", "latest")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [ids[1]]
    ringed = ckpt_nb.plot_metrics(tmp_path / "s", "loss", selected=ids[0]).axes[0]
    assert [c.get_label() for c in ringed.collections] == ["selected"]
    dag = ckpt_nb.plot_dag(tmp_path / "s", selected=ids[0]).axes[0]
    assert [len(c.get_offsets()) for c in dag.collections if c.get_gid() == "selected"] == [1]


def test_plot_metrics_and_plot_dag_take_aliases_and_refuse_unknown_ids(tmp_path: Path) -> None:
    """``selected=["latest"]``, a prefix, ``current="-1"`` ring and mark what they name,
    as plot_compare and plot_diff take them; a typo is refused by name, not drawn as
    nothing selected."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s", metric="loss")
    ids = [mgr.save(torch.nn.Linear(2, 2), step=i, metrics={"loss": 1 / (i + 1)})
           for i in range(3)]
    mgr.close()
    path = tmp_path / "s"
    for selected in (["latest"], [ids[-1][:6]], ["-0"]):
        ax = ckpt_nb.plot_metrics(path, "loss", selected=selected).axes[0]
        rings = [c for c in ax.collections if c.get_label() == "selected"]
        assert [tuple(p) for p in rings[0].get_offsets()] == [(2.0, 1 / 3)]
        ax = ckpt_nb.plot_dag(path, selected=selected, current="-1").axes[0]
        rings = [c for c in ax.collections if c.get_gid() == "selected"]
        assert [tuple(p) for p in rings[0].get_offsets()] == [(0.0, 2.0)]
        assert any(t.get_text() == "kernel" and t.xy == (0, 1) for t in ax.texts)
    with pytest.raises(ckpt_nb.CheckpointNotFoundError, match="zzzz"):
        ckpt_nb.plot_metrics(path, "loss", selected=["zzzz"])
    with pytest.raises(ckpt_nb.CheckpointNotFoundError, match="zzzz"):
        ckpt_nb.plot_dag(path, selected=["zzzz"])
    with pytest.raises(ckpt_nb.CheckpointNotFoundError, match="bogus"):
        ckpt_nb.plot_dag(path, current="bogus")


def test_a_change_from_zero_is_written_inf(tmp_path: Path) -> None:
    """A tensor that was all zeros changes infinitely: its bar (cut at the longest) says
    so, not a plain bar read as the largest finite change."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(8, 4)
    torch.nn.init.zeros_(model.bias)
    a = mgr.save(model)
    with torch.no_grad():
        model.weight.mul_(1.5)
        model.bias.add_(100.0)
    b = mgr.save(model)
    diff = mgr.diff(a, b)
    mgr.close()
    assert math.isinf(diff.set_index("tensor").loc["objects/model/bias", "rel_change"])
    ax = ckpt_nb.plot_diff(tmp_path / "s", a, b).axes[0]
    row = list(diff["tensor"]).index("objects/model/bias")
    assert [(t.get_text(), t.xy[1]) for t in ax.texts if "inf" in t.get_text()] == \
        [("inf (from zero)", row)]


def test_the_diff_tab_says_a_parent_was_deleted_not_that_there_is_none(tmp_path: Path) -> None:
    """The oldest checkpoint retention kept had a parent: the Diff tab names it deleted."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s", max_to_keep=2)
    ids = [mgr.save(torch.nn.Linear(3, 2), step=i) for i in range(3)]
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.tabs.selected_index = 3
        ui.select([ids[1]])
        assert f"{ids[1]}'s parent {ids[0]} was deleted: nothing to diff it against" in \
            html.unescape(ui.diff_table.value)
    finally:
        ui.close()


def test_a_diff_of_many_tensors_draws_the_most_changed_and_counts_the_rest(
        tmp_path: Path) -> None:
    """Two hundred names on one axis overlap: the most changed are drawn, the rest counted."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(100)])
    a = mgr.save(model)
    with torch.no_grad():
        for k, param in enumerate(model.parameters()):
            param.add_(0.001 * k)
    b = mgr.save(model)
    diff = mgr.diff(a, b)
    mgr.close()
    ax = ckpt_nb.plot_diff(tmp_path / "s", a, b).axes[0]
    drawn = [t.get_text() for t in ax.get_yticklabels()]
    assert len(drawn) == len(ax.patches) == _plots.DIFF_BARS
    change = diff.set_index("tensor")["rel_change"]
    assert change[drawn].min() >= change.drop(drawn).max()
    assert drawn == [t for t in diff["tensor"] if t in drawn]  # (in the diff's order)
    assert f"the {_plots.DIFF_BARS} most changed of {len(diff)} tensors" in ax.get_xlabel()


def test_a_dag_of_many_branches_and_a_compare_of_many_stay_in_bounds(tmp_path: Path) -> None:
    """plot_dag of many branches was as wide as they were many (150: 16,051 px); plot_compare
    of 300 checkpoints 6,660 px and 4 s: the DAG's width is capped (its lanes unnamed past
    what fits), the compare draws the first checkpoints and says how many it left out."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    root = mgr.save(model, metrics={"loss": 1.0}, step=0)
    for k in range(_plots.DAG_LANES_NAMED + 4):  # a new branch per save after the first
        mgr.restore(root, model=model)
        mgr.save(model, metrics={"loss": 1.0 / (k + 2)}, step=1)
    lanes = mgr.list()["branch"].nunique()
    assert lanes > _plots.DAG_LANES_NAMED
    fig = ckpt_nb.plot_dag(mgr)
    assert fig.get_size_inches()[0] == _plots.DAG_WIDTH
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [""] * lanes
    assert ax.get_title() == f"{lanes} branches, too many to name here (list() gives each " \
        "checkpoint's)"
    ids = list(mgr.list()["id"])
    for _ in range(_plots.COMPARE_MOST + 3 - len(ids)):
        ids.append(mgr.save(model, metrics={"loss": 0.1}))
    fig = ckpt_nb.plot_compare(mgr, ids)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ids[:_plots.COMPARE_MOST]
    assert fig.get_suptitle() == f"the first {_plots.COMPARE_MOST} checkpoints asked for: " \
        "the other 3 are not drawn"
    mgr.close()


def test_plot_metrics_shortens_a_long_name_and_counts_infinite_points(tmp_path: Path) -> None:
    """A long metric name was cut off as the y label; a ±inf value left out said nothing."""
    name = "validation/" + "very_long_metric_name_" * 4 + "loss"
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    for step, value in enumerate([1.0, math.inf, 0.5, -math.inf, 0.25]):
        mgr.save(torch.nn.Linear(2, 2), step=step, metrics={name: value})
    ax = ckpt_nb.plot_metrics(mgr, name).axes[0]
    mgr.close()
    assert ax.get_ylabel() == _plots._short(name)
    assert max(map(len, ax.get_ylabel().splitlines())) <= 28
    assert ax.get_xlabel() == "step\n2 points at ±inf not shown"
    assert sum(len(line.get_xdata()) for line in ax.get_lines()) == 3


def test_a_checkpoint_this_kernels_retention_deleted_is_not_blamed_on_another(
        tmp_path: Path) -> None:
    """An auto(keep=3) run in the explorer's own kernel deleted the checkpoint shown: the
    explorer said it was deleted "by another process or notebook"."""
    model = torch.nn.Linear(2, 2)
    with ckpt_nb.CheckpointManager(tmp_path) as mgr:
        oldest = mgr.save(model, step=0)
    ui = ckpt_nb.explore(tmp_path, namespace={"model": model}, poll_seconds=0)
    try:
        with ckpt_nb.CheckpointManager(tmp_path, max_to_keep=1) as kept:
            kept.save(model, step=1)
        with pytest.raises(ckpt_nb.CheckpointNotFoundError) as said:
            ui.select(oldest)
        assert str(said.value) == (f"checkpoint {oldest} was deleted (by retention or by hand, "
                                   "in this process or another) since the table was read: "
                                   "select another checkpoint")
    finally:
        ui.close()


def test_roll_back_names_a_checkpoint_deleted_underneath_as_pin_does(tmp_path: Path) -> None:
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    x, y = (mgr.save(model, step=s) for s in (1, 2))
    ui = ckpt_nb.explore(tmp_path / "s", namespace={"model": model}, poll_seconds=0)
    try:
        ui.select([y])
        mgr.delete(y)  # another notebook's manager, before the table is read again
        deleted = f"checkpoint {y} was deleted (by retention or by hand, in this process or " \
            "another) since the table was read"
        for button in (ui.pin_button, ui.rollback_button):
            ui.status.value = ""
            button.click()
            assert deleted in html.unescape(ui.status.value), button.description
    finally:
        ui.close()
        mgr.close()


def test_unpin_of_a_checkpoint_not_pinned_says_so(tmp_path: Path) -> None:
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    cid = mgr.save(torch.nn.Linear(2, 2))
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        assert ui.unpin(cid) == cid
        assert f"{cid} was not pinned: nothing to unpin" in ui.status.value
        ui.pin(cid)
        ui.unpin(cid)
        assert f"unpinned {cid}" in ui.status.value
        assert not ui.table_frame.set_index("id").loc[cid, "pinned"]
    finally:
        ui.close()


def test_the_explorers_refusals_are_also_the_matching_built_in(tmp_path: Path) -> None:
    """Every refusal is a CkptError and the built-in a caller would catch without knowing
    ckpt_nb (the README's promise; these were bare CkptErrors); a figure of no such kind,
    nothing to act on selected, or no pair to diff is a bad argument, a ValueError, as the
    manager's strategy= is (they were CheckpointNotFoundErrors: no checkpoint was missing)."""
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    cid = mgr.save(torch.nn.Linear(2, 2))
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        with pytest.raises(ckpt_nb.MetricNotFoundError, match="cannot sort by 'loss'"):
            ui.sort("loss")
        with pytest.raises(ValueError, match="select one checkpoint") as said:
            ui._one()  # (what Pin, Unpin and Export act on)
        assert not isinstance(said.value, ckpt_nb.CheckpointNotFoundError)
        with pytest.raises(ValueError, match="choose two checkpoints") as said:
            ui.figure("diff")
        assert not isinstance(said.value, ckpt_nb.CheckpointNotFoundError)
        with pytest.raises(ValueError, match="no figure 'bogus'"):
            ui.figure("bogus")
        with pytest.raises(ckpt_nb.FileFormatError, match="type a file name"):
            ui.export(cid, "")
        ui.select([cid])
        ui._ask_delete()
        ui.selected = []  # (a selection changed without withdrawing the question)
        with pytest.raises(ValueError, match="no longer selected") as said:
            ui._confirm()
        assert not isinstance(said.value, ckpt_nb.CheckpointNotFoundError)
    finally:
        ui.close()


def test_a_wrong_argument_is_a_type_or_value_error_naming_it(tmp_path: Path) -> None:
    """rollback(1) acted on whichever checkpoint's id starts with "1" (or said "no
    checkpoint '1'"), rollback(None) said "no checkpoint 'None'", select(5) and
    export(id, 5) raised Python's own TypeError naming no argument, sort(column,
    "no") traitlets' TraitError, explore(d, poll_seconds="1") crashed its follower thread:
    each is now a TypeError or ValueError that names the argument and what it takes, and
    changes nothing."""
    model = torch.nn.Linear(2, 2)
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        ids = [mgr.save(model, metrics={"loss": v}) for v in (0.3, 0.2, 0.1)]
    ui = ckpt_nb.explore(tmp_path / "s", namespace={"model": model}, poll_seconds=0)
    try:
        for action in (ui.rollback, ui.pin, ui.unpin, ui.delete,
                       lambda which: ui.export(which, str(tmp_path / "m.pt"))):
            for wrong, kind in ((1, TypeError), (None, TypeError), ([ids[0]], TypeError),
                                ("", ValueError)):
                with pytest.raises(kind, match=r"which takes a checkpoint id.*'latest'") as said:
                    action(wrong)
                assert not isinstance(said.value, ckpt_nb.CheckpointNotFoundError)
        for wrong, kind in ((5, TypeError), (None, TypeError), (b"ab", TypeError),
                            ([ids[0], 1], TypeError), ([""], ValueError)):
            with pytest.raises(kind, match=r"ids takes a checkpoint id.*or a list of them"):
                ui.select(wrong)
        with pytest.raises(TypeError, match=r"path takes a file path .*\.pt or \.safetensors"):
            ui.export(ids[0], 5)
        with pytest.raises(TypeError, match=r"column takes a column's name \(a str\)"):
            ui.sort(3)
        with pytest.raises(TypeError, match="ascending takes True or False, not 'no'"):
            ui.sort("loss", "no")
        with pytest.raises(ValueError, match=r"no figure 3: kind takes 'metrics'"):
            ui.figure(3)
        ui.select([ids[0], ids[1]])
        with pytest.raises(ValueError, match="select one checkpoint first: 2 are selected"):
            ui._one()
        frame = ui.table_frame
        assert list(frame["id"]) == ids and not frame["pinned"].any()
        assert not (tmp_path / "m.pt").exists() and ui.table.ascending
    finally:
        ui.close()
    store = "store takes a directory, a URL or a CheckpointManager"
    for call, kind, words in (
            (lambda: ckpt_nb.explore(3), TypeError, f"{store}, not int 3"),
            (lambda: ckpt_nb.explore(None), TypeError, f"{store}, not NoneType None"),
            (lambda: ckpt_nb.explore(tmp_path / "s", namespace=[]), TypeError,
             r"namespace takes a dict \(globals\(\)\) or None"),
            (lambda: ckpt_nb.explore(tmp_path / "s", poll_seconds="1"), TypeError,
             "poll_seconds takes a number of seconds"),
            (lambda: ckpt_nb.explore(tmp_path / "s", poll_seconds=-1), ValueError,
             "poll_seconds takes a number of seconds"),
            (lambda: ckpt_nb.explore(tmp_path / "s", poll_seconds=math.nan), ValueError,
             "poll_seconds takes a number of seconds")):
        with pytest.raises(kind, match=words):
            call()


def test_the_diff_tab_lists_an_lr_change_and_extra_values(tmp_path: Path) -> None:
    """Two saves differing only in the optimizer's lr and in extra: the Diff tab said
    "byte-identical: 2 of 2 tensors", nothing about lr or extra. A long history is one
    short row, a value's text is escaped, and past DIFF_VALUE_ROWS the rest are counted."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    many = _explorer.DIFF_VALUE_ROWS + 5
    a = mgr.save(model, optimizer, 0, rng=False, metrics={"loss": 1.0}, extra={
        "lr_note": "lr 0.1", "batch": 32, "history": list(range(5000)), "tag": "<b>x</b>",
        **{f"k{i}": i for i in range(many)}})
    optimizer.param_groups[0]["lr"] = 0.001
    extra = {"lr_note": "lr 0.001", "batch": 64, "history": list(range(5001)),
             "tag": "<b>y</b>", **{f"k{i}": -i - 1 for i in range(many)}}
    b = mgr.save(model, optimizer, 0, rng=False, metrics={"loss": 0.5}, extra=extra)
    c = mgr.save(model, optimizer, 0, rng=False, metrics={"loss": 0.5}, extra=extra)
    mgr.close()
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.tabs.selected_index = 3
        ui.select([a, b])
        shown = ui.diff_table.value
        rows = [tuple(html.unescape(cell) for cell in row) for row in re.findall(
            r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td></tr>", shown)]
        assert rows[:5] == [
            ("objects/optimizer/param_groups/0/lr", "changed", "0.1", "0.001"),
            ("extra/lr_note", "changed", "'lr 0.1'", "'lr 0.001'"),
            ("extra/batch", "changed", "32", "64"),
            ("extra/history", "changed", "[0, 1, 2, 3, 4, 5, ...] (5000 items)",
             "[0, 1, 2, 3, 4, 5, ...] (5001 items)"),
            ("extra/tag", "changed", "'<b>x</b>'", "'<b>y</b>'")]
        assert len(rows) == _explorer.DIFF_VALUE_ROWS and "<b>x" not in shown
        assert f"<b>values</b>: {many + 5} differ" in shown
        assert "<i>and 10 more: mgr.diff_values(a, b) lists them all</i>" in shown
        assert "loss: 1 → 0.5" in shown and "metrics/loss" not in shown  # (said once)
        assert "byte-identical (shared chunks)</b>: 2 of 2 tensors" in shown
        ui.select([b, c])
        assert "<b>values</b>: none differ" in ui.diff_table.value
    finally:
        ui.close()


def test_numbers_of_any_kind_are_taken_where_the_explorer_takes_numbers(tmp_path: Path
                                                                       ) -> None:
    """A NumPy poll_seconds was refused once types were checked (np.float32 then made
    the follower's wait fail), as was sort's ascending given as 0 or 1."""
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        for v in (0.3, 0.1):
            mgr.save(torch.nn.Linear(2, 2), metrics={"loss": v})
    for seconds in (np.int64(1), np.float32(0.05)):
        ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=seconds)
        try:
            time.sleep(0.2)  # (the follower waits with it)
            assert ui._follower.is_alive()
        finally:
            ui.close()
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        for ascending in (0, 1, np.bool_(True), np.int64(0)):
            ui.sort("loss", ascending)
            assert ui.table.ascending is bool(ascending)
    finally:
        ui.close()


def test_saves_since_a_rollback_count_only_those_that_go_on_from_it(tmp_path: Path) -> None:
    """Another process's save of an unrelated root was counted as this kernel's: "rolled
    back to X; 1 checkpoint saved since, the newest Y on branch-1"."""
    import sys
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    mine = ckpt_nb.CheckpointManager(tmp_path).save(model, opt, 0)
    ui = ckpt_nb.explore(tmp_path, namespace={"model": model, "opt": opt}, poll_seconds=0)
    try:
        ui.rollback(mine)
        rolled_back = ui.status.value
        assert "the next save goes on along its branch, main" in rolled_back  # (a tip)
        warm_python.run([sys.executable, "-c", "import sys, torch, ckpt_nb\n"
                         "m = torch.nn.Linear(4, 4)\nckpt_nb.CheckpointManager(sys.argv[1])"
                         ".save(m, torch.optim.SGD(m.parameters(), 0.1), 5)", str(tmp_path)],
                        check=True)
        ui.refresh()
        assert len(ui.table_frame) == 2 and ui.status.value == rolled_back
        mgr = ckpt_nb.CheckpointManager(tmp_path)
        mgr.head = mine
        child = mgr.save(model, opt, 1)  # (as the kernel's next save, from the rollback)
        ui.refresh()
        assert f"rolled back to {mine}; 1 checkpoint saved since, the newest {child}" \
            in ui.status.value
    finally:
        ui.close()


@pytest.mark.parametrize("action", ["pin", "delete"])
def test_an_action_waiting_for_the_stores_lock_says_so_in_the_status_line(
        tmp_path: Path, action: str) -> None:
    """Pin and Delete waited without a word in the widget (a line on stderr alone) while
    another process held the store's lock: the explorer looked frozen."""
    import subprocess
    import sys
    model = torch.nn.Linear(4, 4)
    with ckpt_nb.CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(model, torch.optim.SGD(model.parameters(), 0.1), 0)
    ui = ckpt_nb.explore(tmp_path, poll_seconds=0)
    holder = warm_python.Popen(
        [sys.executable, "-c", "import sys, ckpt_nb\nwith ckpt_nb.CheckpointManager(sys.argv[1])"
         "._exclusive():\n    print('held', flush=True)\n    sys.stdin.readline()",
         str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        acting = threading.Thread(target=getattr(ui, action), args=(cid,))
        acting.start()
        poll(lambda: "waiting for" in ui.status.value)
        assert f"process {holder.pid} is saving to it" in ui.status.value
        assert acting.is_alive()
        assert holder.stdin is not None
        holder.stdin.close()
        acting.join(timeout=60)
        assert not acting.is_alive() and "waiting" not in ui.status.value
        assert ui.status.value.count(f"{'pinned' if action == 'pin' else 'deleted'} {cid}")
    finally:
        holder.kill()
        holder.wait(timeout=60)
        ui.close()


def test_saves_since_a_rollback_count_on_once_its_checkpoint_is_deleted(tmp_path: Path
                                                                        ) -> None:
    """Once the checkpoint rolled back to was deleted (its children given its parent), no
    later save counted: the status line kept "2 checkpoints saved since, the newest X"
    with X no longer the newest (review)."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    first = ckpt_nb.CheckpointManager(tmp_path).save(model, opt, 0)
    ui = ckpt_nb.explore(tmp_path, namespace={"model": model, "opt": opt}, poll_seconds=0)
    try:
        mgr = ckpt_nb.CheckpointManager(tmp_path)
        target = mgr.save(model, opt, 1)
        ui.refresh()
        ui.rollback(target)
        mgr.head = target
        mgr.save(model, opt, 2)
        second = mgr.save(model, opt, 3)
        ui.refresh()
        assert f"2 checkpoints saved since, the newest {second}" in ui.status.value
        mgr.delete(target)
        third = mgr.save(model, opt, 4)
        ui.refresh()
        assert f"3 checkpoints saved since, the newest {third}" in ui.status.value, \
            ui.status.value
        assert first in set(ui.table_frame["id"])
    finally:
        ui.close()


def test_a_lock_wait_teller_that_fails_stops_no_action(tmp_path: Path) -> None:
    """A teller of lock waits (the explorer's status line) that raised made the pin it
    told of fail, though the lock then came free (review)."""
    import subprocess
    import sys
    model = torch.nn.Linear(4, 4)
    mgr = ckpt_nb.CheckpointManager(tmp_path)
    cid = mgr.save(model, torch.optim.SGD(model.parameters(), 0.1), 0)
    told_of: list[str | None] = []

    def told(message: str | None) -> None:
        told_of.append(message)
        raise RuntimeError("the teller failed")

    mgr._on_lock_wait = told
    # (held until the teller was told: a holder that let go after a second was gone
    # before the pin had waited a second, and no teller was told at all)
    holder = warm_python.Popen(
        [sys.executable, "-c", "import sys, ckpt_nb\nwith ckpt_nb.CheckpointManager("
         "sys.argv[1])._exclusive():\n    print('held', flush=True)\n    sys.stdin.readline()",
         str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        pinning = threading.Thread(target=mgr.pin, args=(cid,))
        pinning.start()
        poll(lambda: bool(told_of), 60)
        assert told_of and told_of[0] is not None and "waiting for" in told_of[0], told_of
        assert holder.stdin is not None
        holder.stdin.close()
        pinning.join(timeout=60)
        assert not pinning.is_alive()
        assert mgr.catalog.get(cid).pinned
    finally:
        holder.kill()
        holder.wait(timeout=60)
        mgr.close()
