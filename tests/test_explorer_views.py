"""The explorer's two anywidget views (the DAG and the table) as Chromium draws them: the
views' own ES modules rendered in a page, from the data an explorer of a real store syncs,
their geometry and styles read back from the page. Without /usr/bin/chromium these tests
are skipped, except in CI (as ``test_browser``'s)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ckpt_nb
from ckpt_nb import _explorer

from test_explorer import forked_store
from test_browser import CHROMIUM_ARGS, artifacts_dir, chromium  # noqa: F401 (a fixture)

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


@pytest.fixture
def page(chromium: Path) -> Iterator[Any]:  # noqa: F811 (the fixture imported above)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 950, "height": 900})
        finally:
            browser.close()


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
