"""The explorer's two anywidget views (the DAG and the table) as Chromium draws them: the
views' own ES modules rendered in a page, from the data an explorer of a real store syncs,
their geometry and styles read back from the page. Without /usr/bin/chromium these tests
are skipped, except in CI (as ``test_browser``'s)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


import ckpt_nb
from ckpt_nb import _explorer

from test_explorer import fanned_store, forked_store
from test_browser import artifacts_dir, chromium, shared_browser, shared_page  # noqa: F401 (fixtures)

# What a view's module gets from anywidget, made from the traits' values: a model whose
# get() reads them and whose set() keeps what the view sets (a click's selection).
RENDER = """async ([esm, state, width]) => {
  const url = URL.createObjectURL(new Blob([esm], {type: "text/javascript"}));
  const view = (await import(url)).default;
  const model = {get: (name) => state[name], set: (name, value) => { state[name] = value; },
                 save_changes: () => {}, on: () => {}};
  const box = document.createElement("div");
  box.style.width = width;
  const el = document.createElement("div");
  box.appendChild(el);
  document.body.appendChild(box);
  view.render({model, el});
}"""


def test_a_fork_leaves_its_parent_not_a_later_checkpoint(page: Any, tmp_path: Path) -> None:
    """A fork's edge ran down the parent's lane half the way to its child, behind the nodes
    saved there after the parent (edges are drawn under nodes): the branch seemed to leave
    the last of them. No edge passes within a node's reach of any node but its two ends."""
    ids = forked_store(tmp_path / "s")
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        nodes = ui.dag.nodes
    finally:
        ui.close()
    assert len({n["lane"] for n in nodes}) == 4
    page.evaluate(RENDER, [_explorer._DAG_ESM, {"nodes": nodes, "selected": [], "current": None,
                                                 "current_deleted": None}, "900px"])
    centres = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
        ".ckpt-nb-node")].map((g) => {
          const s = g.querySelector("circle, rect"), b = s.getBBox();
          return [g.dataset.id, [b.x + b.width / 2, b.y + b.height / 2]]; }))""")
    edges = page.evaluate("""() => [...document.querySelectorAll(".ckpt-nb-dag path")].map(
        (p) => { const n = Math.ceil(p.getTotalLength() * 2);
                 return [...Array(n + 1).keys()].map((k) => {
                   const q = p.getPointAtLength(p.getTotalLength() * k / n);
                   return [q.x, q.y]; }); })""")
    page.locator(".ckpt-nb-dag svg").screenshot(path=artifacts_dir() / "explorer-dag-forks.png")
    assert set(centres) == set(ids) and len(edges) == len(ids) - 1
    # The most a node reaches from its centre (a differential one's diamond: half its
    # diagonal), and half the edge's stroke.
    reach = 6 * math.sqrt(2) + 1
    for points in edges:
        ends = [i for i, c in centres.items() if math.dist(c, points[0]) < 0.5
                or math.dist(c, points[-1]) < 0.5]
        assert len(ends) == 2
        for cid, centre in centres.items():
            if cid not in ends:
                nearest = min(math.dist(centre, q) for q in points)
                assert nearest > reach, f"the edge {ends} passes {nearest:.1f} px from {cid}"


def test_the_nearest_fork_lies_over_the_farther_ones(page: Any, tmp_path: Path) -> None:
    """Forks from one parent run along the same row gap; the last drawn, to the farthest
    lane, covered the others' starts: branch-1 seemed to fork off branch-3."""
    ids = fanned_store(tmp_path / "s")
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        nodes = {n["id"]: n for n in ui.dag.nodes}
    finally:
        ui.close()
    assert [nodes[i]["lane"] for i in ids] == [0, 0, 1, 2, 3]
    page.evaluate(RENDER, [_explorer._DAG_ESM, {"nodes": list(nodes.values()), "selected": [],
                                                 "current": None, "current_deleted": None},
                           "900px"])
    # Half a lane right of the parent, in the row gap below it: the edge on top there.
    stroke = page.evaluate("""() => {
        const parent = document.querySelector(".ckpt-nb-node").querySelector("circle, rect");
        const box = parent.getBoundingClientRect();
        const x = box.left + box.width / 2 + 13, y = box.top + box.height / 2 + 11;
        return document.elementFromPoint(x, y).getAttribute("stroke"); }""")
    page.locator(".ckpt-nb-dag svg").screenshot(path=artifacts_dir() / "explorer-dag-fan.png")
    assert stroke == "#ff7f0e"  # (lane 1's colour)


def test_the_ids_stay_in_view_as_the_table_scrolls_sideways(page: Any, tmp_path: Path) -> None:
    """In a ~950 px output the metric columns began off the right edge (after the note),
    and scrolling to them took the id column out of view."""
    import torch

    model = torch.nn.Linear(2, 2)
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        for step in range(3):
            mgr.save(model, step=step, note="a fairly long note about this checkpoint",
                     metrics={"train_loss": 1.0 / (step + 1), "val_acc": 0.5 + step / 10,
                              "val_loss": 2.0 / (step + 1), "validation/perplexity": 30.0})
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        state = {name: getattr(ui.table, name)
                 for name in ("columns", "rows", "selected", "sort_by", "ascending")}
        state["selected"] = [state["rows"][1]["id"]]
    finally:
        ui.close()
    page.evaluate(RENDER, [_explorer._TABLE_ESM, state, "930px"])
    table = page.locator(".ckpt-nb-table")
    shown = page.evaluate("""() => {
        const el = document.querySelector(".ckpt-nb-table");
        const right = el.getBoundingClientRect().right;
        return [...el.querySelectorAll("th")].filter(
          (th) => th.getBoundingClientRect().right <= right).map((th) => th.textContent); }""")
    assert {"train_loss", "val_acc"} <= set(shown)  # (in view before any scrolling)
    table.evaluate("el => { el.scrollLeft = el.scrollWidth; }")
    table.screenshot(path=artifacts_dir() / "explorer-table-scrolled.png")
    cells = page.evaluate("""() => {
        const el = document.querySelector(".ckpt-nb-table"), box = el.getBoundingClientRect();
        return [...el.querySelectorAll("tr")].map((tr) => {
          const cell = tr.cells[0], r = cell.getBoundingClientRect();
          const seen = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
          return [cell.textContent, Math.round(r.left - box.left), seen === cell,
                  getComputedStyle(cell).backgroundColor]; }); }""")
    assert page.evaluate("() => document.querySelector('.ckpt-nb-table').scrollLeft") > 0
    assert [c[0] for c in cells] == ["id"] + [r["id"] for r in state["rows"]]
    assert all(left == 0 and on_top for _, left, on_top, _ in cells)  # nothing shows through
    assert {c[3] for c in cells[1:]} == {"rgb(255, 255, 255)"}
    # JupyterLab Dark: the notebook's background is --jp-layout-color0; color1, lighter,
    # made the id column a lighter stripe down it.
    page.evaluate("""() => { document.body.style.setProperty('--jp-layout-color0', '#111111');
                             document.body.style.setProperty('--jp-layout-color1', '#212121');
                           }""")
    backgrounds = page.evaluate("""() => [...document.querySelectorAll(
        ".ckpt-nb-table td:first-child")].map((td) => getComputedStyle(td).backgroundColor)""")
    assert set(backgrounds) == {"rgb(17, 17, 17)"}


def test_hollow_nodes_and_the_id_column_take_the_notebooks_background(
        page: Any, tmp_path: Path) -> None:
    """In JupyterLab Dark the notebook's background is --jp-layout-color0 (#111); the id
    column and the hollow (incremental, differential) nodes took color1 (#212121): a
    lighter stripe down the table, grey dots in the DAG."""
    import torch

    model = torch.nn.Linear(2, 2)
    with ckpt_nb.CheckpointManager(tmp_path / "s", strategy="incremental") as mgr:
        for step in range(3):
            mgr.save(model, step=step)
    ui = ckpt_nb.explore(tmp_path / "s", poll_seconds=0)
    try:
        table = {name: getattr(ui.table, name)
                 for name in ("columns", "rows", "selected", "sort_by", "ascending")}
        dag = {"nodes": ui.dag.nodes, "selected": [], "current": None, "current_deleted": None}
    finally:
        ui.close()
    page.evaluate(RENDER, [_explorer._TABLE_ESM, table, "900px"])
    page.evaluate(RENDER, [_explorer._DAG_ESM, dag, "900px"])
    page.evaluate("""() => { document.body.style.setProperty('--jp-layout-color0', '#111111');
                             document.body.style.setProperty('--jp-layout-color1', '#212121');
                           }""")
    colours = page.evaluate("""() => [
        ...[...document.querySelectorAll(".ckpt-nb-table td:first-child")].map(
            (td) => getComputedStyle(td).backgroundColor),
        ...[...document.querySelectorAll(".ckpt-nb-hollow")].map(
            (shape) => getComputedStyle(shape).fill)]""")
    assert len(colours) >= 3 + 2 and set(colours) == {"rgb(17, 17, 17)"}
