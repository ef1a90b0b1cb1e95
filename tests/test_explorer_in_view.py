"""In a store of many checkpoints the newest, the selection and the kernel's mark are
scrolled into the table's and the DAG's boxes. The views are their own ES modules in
Chromium, fed what an explorer of a real store syncs (as ``test_explorer_views``'s);
without /usr/bin/chromium they are skipped, except in CI."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ckpt_nb
from ckpt_nb import _explorer

from test_browser import chromium, shared_browser, shared_page  # noqa: F401 (fixtures)

# A view's module rendered in a box as the explorer lays it out (the DAG's box is the
# widget's layout: at most DAG_HEIGHT, scrolling), with a model whose set() changes what
# get() reads and calls the view's change handlers, as anywidget's does.
RENDER = """async ([esm, state, boxStyle]) => {
  const url = URL.createObjectURL(new Blob([esm], {type: "text/javascript"}));
  const view = (await import(url)).default;
  const handlers = {};
  const model = {get: (name) => state[name],
                 set: (name, value) => { state[name] = value;
                                         (handlers[name] || []).forEach((h) => h()); },
                 save_changes: () => {},
                 on: (event, h) => { const name = event.replace("change:", "");
                                     (handlers[name] = handlers[name] || []).push(h); }};
  const el = document.createElement("div");
  el.setAttribute("style", boxStyle);
  document.body.appendChild(el);
  view.render({model, el});
  window.viewModel = model;
}"""

# Whether the element is wholly inside its view's box (below the table's sticky header).
IN_VIEW = """(selector) => {
  const node = document.querySelector(selector);
  const box = node.closest(".ckpt-nb-table, .ckpt-nb-dag").getBoundingClientRect();
  const head = document.querySelector(".ckpt-nb-table thead");
  const under = node.closest(".ckpt-nb-table") && head ? head.offsetHeight : 0;
  const at = node.getBoundingClientRect();
  return at.top >= box.top + under - 1 && at.bottom <= box.bottom + 1;
}"""


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The table's and the DAG's state for a store of 80 checkpoints (tens of rows past
    either box's fold), and their ids in save order: made once, read by each test (which
    sends copies to its page)."""
    model = torch.nn.Linear(2, 2)
    path = tmp_path_factory.mktemp("in-view")
    with ckpt_nb.CheckpointManager(path / "s", metric="loss") as mgr:
        ids = [mgr.save(model, step=step, metrics={"loss": 1 / (step + 1)})
               for step in range(80)]
    ui = ckpt_nb.explore(path / "s", namespace={}, poll_seconds=0)
    try:
        table = {name: getattr(ui.table, name)
                 for name in ("columns", "rows", "selected", "sort_by", "ascending")}
        dag = {"nodes": ui.dag.nodes, "selected": [], "current": None, "current_deleted": None}
    finally:
        ui.close()
    return {"ids": ids, "table": table, "dag": dag}


def settled(page: Any) -> None:
    """Wait two frames: a view scrolls at the next one after it draws."""
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => "
                  "requestAnimationFrame(done)))")


def test_the_table_opens_at_the_newest_and_scrolls_to_a_selection(page: Any,
                                                                   many: dict[str, Any]) -> None:
    """Sorted by created, oldest first, the newest rows were below the 360 px box; a
    checkpoint selected elsewhere (the DAG, ui.select) stayed out of view."""
    ids = many["ids"]
    page.evaluate(RENDER, [_explorer._TABLE_ESM, many["table"], "width: 900px"])
    settled(page)
    assert page.evaluate(IN_VIEW, f'tr[data-id="{ids[-1]}"]')
    assert not page.evaluate(IN_VIEW, f'tr[data-id="{ids[0]}"]')
    for picked in (ids[3], ids[40]):
        page.evaluate(f"() => window.viewModel.set('selected', ['{picked}'])")
        settled(page)
        assert page.evaluate(IN_VIEW, f'tr[data-id="{picked}"]'), picked


def test_the_dag_opens_at_the_kernels_mark_and_scrolls_to_a_selection(
        page: Any, many: dict[str, Any]) -> None:
    """The DAG starts at the root: in its 480 px box the kernel's mark and the newest
    checkpoints were out of view until scrolled."""
    ids = many["ids"]
    box = f"width: 900px; max-height: {_explorer.DAG_HEIGHT}; overflow: auto"
    page.evaluate(RENDER, [_explorer._DAG_ESM, {**many["dag"], "current": ids[60]}, box])
    settled(page)
    assert page.evaluate(IN_VIEW, f'g[data-id="{ids[60]}"]')
    assert not page.evaluate(IN_VIEW, f'g[data-id="{ids[0]}"]')
    page.evaluate(f"() => window.viewModel.set('selected', ['{ids[2]}'])")
    settled(page)
    assert page.evaluate(IN_VIEW, f'g[data-id="{ids[2]}"]')
    page.evaluate("() => document.body.replaceChildren()")  # (no mark: the newest)
    page.evaluate(RENDER, [_explorer._DAG_ESM, many["dag"], box])
    settled(page)
    assert page.evaluate(IN_VIEW, f'g[data-id="{ids[-1]}"]')


def test_a_row_ctrl_clicked_in_the_table_stays_in_view(page: Any,
                                                       many: dict[str, Any]) -> None:
    """A row selected near the top, the table scrolled down and a row there ctrl-clicked:
    the box jumped back to the first selected row, and the row just clicked left the view."""
    ids = many["ids"]
    page.evaluate(RENDER, [_explorer._TABLE_ESM, many["table"], "width: 900px"])
    settled(page)
    box = page.locator(".ckpt-nb-table")
    box.evaluate("(el) => el.scrollTop = 0")
    page.click(f'tr[data-id="{ids[3]}"]')
    settled(page)
    box.evaluate("(el) => el.scrollTop = el.scrollHeight")
    settled(page)
    page.click(f'tr[data-id="{ids[75]}"]', modifiers=["Control"])
    settled(page)
    assert page.evaluate("() => window.viewModel.get('selected')") == [ids[3], ids[75]]
    assert page.evaluate(IN_VIEW, f'tr[data-id="{ids[75]}"]')
    page.evaluate(f"() => window.viewModel.set('selected', ['{ids[3]}', '{ids[75]}', "
                  f"'{ids[10]}'])")  # (made elsewhere, as ui.select: scrolled to)
    settled(page)
    assert page.evaluate(IN_VIEW, f'tr[data-id="{ids[3]}"]')


def test_the_table_at_its_end_follows_the_rows_saves_add(page: Any,
                                                         many: dict[str, Any]) -> None:
    """A run watched live: the table opened at its newest row, and the rows each save
    added went below the box's fold, out of view. Scrolled up, it stays where it is."""
    ids, table = many["ids"], dict(many["table"])
    rows = table["rows"]
    page.evaluate(RENDER, [_explorer._TABLE_ESM, {**table, "rows": rows[:60]}, "width: 900px"])
    settled(page)
    assert page.evaluate(IN_VIEW, f'tr[data-id="{ids[59]}"]')
    for end in (65, 80):  # (two saves' redraws)
        page.evaluate("(rows) => window.viewModel.set('rows', rows)", rows[:end])
        settled(page)
        assert page.evaluate(IN_VIEW, f'tr[data-id="{ids[end - 1]}"]'), end
    page.evaluate("() => { document.querySelector('.ckpt-nb-table').scrollTop = 0; }")
    page.evaluate("(rows) => window.viewModel.set('rows', rows)", rows[:79])
    settled(page)
    assert page.evaluate(IN_VIEW, f'tr[data-id="{ids[0]}"]')  # (left where it was scrolled)
