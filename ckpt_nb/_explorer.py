"""``ckpt_nb.explore(store)``: an ipywidgets app to browse, compare, diff and roll
back checkpoints.

Standard ipywidgets make the frame (tabs, dropdowns, buttons, a progress bar);
two small anywidget views do what ipywidgets cannot: a sortable table with row
selection and a clickable DAG. Plots are the figures of ``_plots`` rendered to
PNG. Every action is a method (``select``, ``rollback``, ``pin``, ...) that the
buttons call, so scripts and tests drive it without a browser. The app follows
the store live: saves of this process's sessions arrive through
``_session.subscribe``, other writers are seen by polling the catalog's files.
"""

from __future__ import annotations

import contextlib
import html
import math
import numbers
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as w
import traitlets

from . import _plots, _session
from ._run_records import written_keep_best
from ._errors import (DELETED_BY, CheckpointInUseError, CheckpointNotFoundError, CkptError,
                      FileFormatError, MetricNotFoundError, StateMismatchError, StoreError,
                      Told, telling)
from ._discovery import NotState
from ._format import FORMAT_KEY
from ._manager import CheckpointManager
from ._store import FsspecStore, store_exists
from ._units import human_size

# Both views' scrolling of their own box (not the page) to a row or node out of its view: in
# a store of hundreds the selection (a click in the other view, ui.select()), the newest
# checkpoint and the kernel's mark were below the box's fold. ``reveal(find)`` asks for the
# element ``find()`` gives once the box is laid out (a view drawn in a hidden tab has no size
# yet: it is tried again as the box gets one); ``under`` is what covers the box's top (the
# table's sticky header).
_REVEAL_JS = """
function revealer(el, under) {
  let wanted = null;
  const attempt = () => {
    const node = wanted && wanted(), box = el.getBoundingClientRect();
    if (!node || box.height === 0) return;
    wanted = null;
    const at = node.getBoundingClientRect();
    if (at.top < box.top + under() || at.bottom > box.bottom) {
      el.scrollTop += at.top - box.top - (box.height - at.height) / 2;
    }
  };
  new ResizeObserver(attempt).observe(el);
  return (find) => { wanted = find; requestAnimationFrame(attempt); };
}
"""

_TABLE_ESM = _REVEAL_JS + """
function render({ model, el }) {
  el.classList.add("ckpt-nb-table");
  const reveal = revealer(el, () => el.querySelector("thead")?.offsetHeight ?? 0);
  let shownSelection = null;  // (the selection last scrolled to; null: none drawn yet)
  const draw = () => {
    const columns = model.get("columns"), rows = model.get("rows");
    const selected = new Set(model.get("selected"));
    const sortBy = model.get("sort_by"), ascending = model.get("ascending");
    // (scrolled to its end, as it opens, the box stays there as saves add rows: a run
    // watched live added its rows below the fold)
    const atEnd = shownSelection !== null &&
      el.scrollHeight - el.scrollTop - el.clientHeight < 4;
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const c of columns) {
      const th = document.createElement("th");
      const name = c.length > 24 ? c.slice(0, 11) + "…" + c.slice(-12) : c;
      th.textContent = name + (c === sortBy ? (ascending ? " ▲" : " ▼") : "");
      th.title = "sort by " + c;
      th.onclick = () => {
        model.set("ascending", c === sortBy ? !ascending : true);
        model.set("sort_by", c);
        model.save_changes();
      };
      head.appendChild(th);
    }
    const body = table.createTBody();
    for (const r of rows) {
      const tr = body.insertRow();
      tr.className = "ckpt-nb-row" + (selected.has(r.id) ? " ckpt-nb-selected" : "");
      tr.dataset.id = r.id;
      tr.dataset.created = r.cells.created;
      for (const c of columns) {
        const td = tr.insertCell(), value = r.cells[c];
        td.textContent = value === null || value === undefined ? "—" : String(value);
        if (r.titles && r.titles[c]) td.title = r.titles[c];
        if (r.best.includes(c)) td.classList.add("ckpt-nb-best");
      }
      tr.onclick = (event) => {
        let next;
        if (event.ctrlKey || event.metaKey || event.shiftKey) {
          next = selected.has(r.id) ? [...selected].filter((x) => x !== r.id)
                                    : [...selected, r.id];
        } else {
          next = [r.id];
        }
        // (a selection made here, the row clicked in view: scrolled to, the box jumped to
        // the first selected row, far from a row ctrl-clicked below it)
        shownSelection = JSON.stringify(next);
        model.set("selected", next);
        model.save_changes();
      };
    }
    el.replaceChildren(table);
    const selection = JSON.stringify(model.get("selected"));
    if (selection !== shownSelection) {  // (at first: the selection, else the newest row)
      const first = shownSelection === null;
      shownSelection = selection;
      reveal(() => el.querySelector(".ckpt-nb-selected") ||
                   (first ? newest(el.querySelector("tbody")) : null));
    } else if (atEnd) {
      el.scrollTop = el.scrollHeight;
    }
  };
  const newest = (body) => {  // (the last of the latest created: ties in catalog order)
    let found = null;
    for (const tr of body ? body.rows : []) {
      const created = tr.dataset.created;
      if (!found || created > found.dataset.created ||
          (created === found.dataset.created && model.get("ascending"))) found = tr;
    }
    return found;
  };
  const style = document.createElement("style");
  style.textContent = `
    .ckpt-nb-table { max-height: 360px; overflow: auto; font-size: 12px; }
    .ckpt-nb-table table { border-collapse: collapse; width: 100%; }
    .ckpt-nb-table th { position: sticky; top: 0; background: var(--jp-layout-color2, #eee);
                        cursor: pointer; text-align: left; padding: 3px 6px;
                        white-space: nowrap; }
    .ckpt-nb-table td { padding: 2px 6px; white-space: nowrap;
                        border-bottom: 1px solid var(--jp-border-color2, #ddd);
                        font-family: var(--jp-code-font-family, monospace); }
    .ckpt-nb-table th:first-child { left: 0; z-index: 2; }
    .ckpt-nb-table td:first-child {
      position: sticky; left: 0; z-index: 1;
      background-color: var(--jp-layout-color0, var(--vscode-editor-background, white)); }
    .ckpt-nb-row { cursor: pointer; }
    .ckpt-nb-row:hover { background: rgba(31, 119, 180, 0.08); }
    .ckpt-nb-selected { background: rgba(31, 119, 180, 0.22) !important; }
    .ckpt-nb-row:hover td:first-child {
      background-image: linear-gradient(rgba(31, 119, 180, 0.08), rgba(31, 119, 180, 0.08)); }
    .ckpt-nb-selected td:first-child {
      background-image: linear-gradient(rgba(31, 119, 180, 0.22), rgba(31, 119, 180, 0.22))
                        !important; }
    .ckpt-nb-best { font-weight: bold; color: #a66f00; }`;
  el.parentElement ? el.parentElement.appendChild(style) : document.head.appendChild(style);
  for (const name of ["rows", "columns", "selected", "sort_by", "ascending"]) {
    model.on("change:" + name, draw);
  }
  draw();
}
export default { render };
"""

_DAG_ESM = _REVEAL_JS + """
function render({ model, el }) {
  el.classList.add("ckpt-nb-dag");
  const reveal = revealer(el, () => 0);
  let shown = null;  // (the selection and mark last scrolled to; null: none drawn yet)
  const style = document.createElement("style");
  style.textContent = `
    .ckpt-nb-dag text { fill: var(--jp-ui-font-color1, var(--vscode-editor-foreground,
                                                            currentColor)); }
    .ckpt-nb-dag .ckpt-nb-ring { fill: none; stroke-width: 1.5;
                                 stroke: var(--jp-ui-font-color1,
                                             var(--vscode-editor-foreground, currentColor)); }
    .ckpt-nb-dag .ckpt-nb-hollow { fill: var(--jp-layout-color0,
                                             var(--vscode-editor-background, white)); }
    .ckpt-nb-dag text.ckpt-nb-kernel { fill: crimson; }`;
  el.parentElement ? el.parentElement.appendChild(style) : document.head.appendChild(style);
  const NS = "http://www.w3.org/2000/svg";
  const colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const draw = () => {
    const nodes = model.get("nodes"), selected = new Set(model.get("selected"));
    const current = model.get("current"), deleted = model.get("current_deleted");
    const lanes = Math.max(1, ...nodes.map((n) => n.lane + 1));
    const dx = 26, dy = 22, left = 60, top = 16;
    const labelOf = (n) => `${n.pinned ? "★ " : ""}${n.id}  ${n.branch}` +
                           (n.step === null ? "" : `  step ${n.step}`) + `  ${n.strategy}`;
    const widest = Math.max(0, ...nodes.map((n) => labelOf(n).length));
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", left + lanes * dx + 12 + widest * 7);
    svg.setAttribute("height", top + nodes.length * dy + 10);
    const at = {};
    for (const n of nodes) at[n.id] = [left + n.lane * dx, top + n.row * dy];
    // Forks from one parent share the row gap below it: the farthest lane's edge is drawn
    // first, so that each nearer one lies over its start, in its own colour (the last drawn
    // covered the others' starts: branch-1 seemed to fork off branch-3).
    const reach = (n) => Math.abs(at[n.id][0] - at[n.parent][0]);
    const edges = nodes.filter((n) => n.parent && at[n.parent]);
    edges.sort((p, q) => reach(q) - reach(p));
    for (const n of edges) {
      const [x1, y1] = at[n.parent], [x2, y2] = at[n.id];
      // A fork leaves its parent's lane within the row gap below the parent, as git log
      // --graph draws it, then runs down its own lane: down the parent's lane to half way it
      // passed behind the nodes saved there after the parent, as if it left the last of them.
      // It crosses the lanes between at mid-gap, clear of their nodes.
      const down = Math.sign(y2 - y1), side = Math.sign(x2 - x1);
      const ym = y1 + down * dy / 2, r = Math.min(dy / 2, Math.abs(x2 - x1) / 2);
      const path = document.createElementNS(NS, "path");
      path.setAttribute("d", x1 === x2 ? `M${x1},${y1} L${x2},${y2}` :
        `M${x1},${y1} Q${x1},${ym} ${x1 + side * r},${ym} L${x2 - side * r},${ym} ` +
        `Q${x2},${ym} ${x2},${ym + down * r} L${x2},${y2}`);
      path.setAttribute("stroke", colors[n.lane % colors.length]);
      path.setAttribute("fill", "none");
      path.setAttribute("stroke-width", "2");
      svg.appendChild(path);
    }
    for (const n of nodes) {
      const [x, y] = at[n.id], color = colors[n.lane % colors.length];
      const g = document.createElementNS(NS, "g");
      g.setAttribute("class", "ckpt-nb-node" + (selected.has(n.id) ? " ckpt-nb-selected" : ""));
      g.dataset.id = n.id;
      g.style.cursor = "pointer";
      const shape = document.createElementNS(NS, n.strategy === "differential" ? "rect" : "circle");
      if (n.strategy === "differential") {
        shape.setAttribute("x", x - 6); shape.setAttribute("y", y - 6);
        shape.setAttribute("width", 12); shape.setAttribute("height", 12);
        shape.setAttribute("transform", `rotate(45 ${x} ${y})`);
      } else {
        shape.setAttribute("cx", x); shape.setAttribute("cy", y); shape.setAttribute("r", 6);
      }
      if (n.strategy === "full") shape.setAttribute("fill", color);
      else shape.setAttribute("class", "ckpt-nb-hollow");  // (the page's background)
      shape.setAttribute("stroke", n.best ? "gold" : color);
      shape.setAttribute("stroke-width", n.best ? 3.5 : 2);
      g.appendChild(shape);
      if (selected.has(n.id)) {
        const ring = document.createElementNS(NS, "circle");
        ring.setAttribute("cx", x); ring.setAttribute("cy", y); ring.setAttribute("r", 10);
        ring.setAttribute("class", "ckpt-nb-ring");
        g.appendChild(ring);
      }
      const label = document.createElementNS(NS, "text");
      label.setAttribute("x", left + lanes * dx + 4); label.setAttribute("y", y + 4);
      label.setAttribute("font-size", "11"); label.setAttribute("font-family", "monospace");
      label.textContent = labelOf(n);
      g.appendChild(label);
      if (n.id === current) {
        const mark = document.createElementNS(NS, "text");
        mark.setAttribute("x", 2); mark.setAttribute("y", y + 4);
        mark.setAttribute("font-size", "11"); mark.setAttribute("class", "ckpt-nb-kernel");
        mark.textContent = deleted ? "kernel ⇢" : "kernel →";
        if (deleted) {
          const tip = document.createElementNS(NS, "title");
          tip.textContent = `the kernel's state came from ${deleted}, deleted since: ` +
                            "this is its nearest kept ancestor";
          mark.appendChild(tip);
        }
        g.appendChild(mark);
      }
      g.onclick = () => { model.set("selected", [n.id]); model.save_changes(); };
      svg.appendChild(g);
    }
    el.replaceChildren(svg);
    // At first the selection, else the kernel's mark, else the newest (the lowest row);
    // then the selection or the mark as either moves.
    const node = (id) => id ? el.querySelector(`g[data-id="${CSS.escape(id)}"]`) : null;
    const now = [model.get("selected")[0] ?? null, current];
    if (shown === null) {
      const newest = nodes.reduce((a, n) => (a === null || n.row > a.row ? n : a), null);
      reveal(() => node(now[0]) || node(now[1]) || node(newest && newest.id));
    } else if (now[0] !== shown[0] || now[1] !== shown[1]) {
      const moved = now[0] !== shown[0] ? now[0] : now[1];
      reveal(() => node(moved));
    }
    shown = now;
  };
  for (const name of ["nodes", "selected", "current", "current_deleted"]) {
    model.on("change:" + name, draw);
  }
  draw();
}
export default { render };
"""

# The table's own columns; the metric columns go before the last, the note, as in ckpt-nb
# ls: after it they began past the right edge of a ~950 px output. The id column stays at
# the left edge as the table scrolls sideways (its cells opaque, in the notebook's background
# colour: JupyterLab's --jp-layout-color0).
TABLE_COLUMNS = ("id", "branch", "step", "epoch", "created", "strategy", "stored", "logical",
                 "pinned", "note")
# A longer note is cut in its cell (its whole text is the cell's tooltip), so that it
# widens the table no more than this.
NOTE_CHARS = 32
# The DAG tab's most height: a store of hundreds scrolls inside it, the buttons below
# stay in view.
DAG_HEIGHT = "480px"
# The values the Diff tab lists (a notebook's hundred variables would push its tensors
# out of view); the rest are counted.
DIFF_VALUE_ROWS = 40
# The Metrics dropdown's width in pixels: the least, and what each character of its longest
# name adds beyond its 110 px of label and arrow (at 280 px a long name was cut), within
# the output's width.
METRIC_WIDTH = (280, 8)
NO_CHECKPOINTS = "<i>no checkpoints yet: they show here as they are saved</i>"
# The side-by-side compare's note where the selected checkpoints logged no metric.
NOTHING_TO_COMPARE = ("nothing to compare: the selected checkpoints logged no metrics (their "
                      "metric columns show —; a save between epochs' ends logs none): select "
                      "ones that logged some")
# An explorer opened with wait=True (``%ckpt_ui`` in a cell above the first %%ckpt_auto
# cell) on a store not made yet: its notes, and what its actions say till the store is there.
NO_STORE_YET = ("no checkpoints yet: there is no store at {where} yet; its checkpoints show "
                "here once the first %%ckpt_auto cell (or a CheckpointManager) saves to it")
NOTHING_YET = ("no checkpoint store at {where} yet: nothing to show or act on till the first "
               "%%ckpt_auto cell (or a CheckpointManager) saves to it; this explorer shows "
               "its checkpoints then")
# While saves keep coming (a training run in this kernel saving every few steps), the
# follower redraws once a gap at most: a redraw reads every row and draws the visible tab
# (tens of milliseconds, a few hundred on Metrics), and the run waited for it at each save.
# The gap is REDRAW_GAP_PER_COST times the last redraw's time (the run keeps nine tenths of
# the kernel), within REDRAW_SECONDS (the least, the most); the saves of a gap show at its
# end. A click redraws at once.
REDRAW_SECONDS = (1.0, 2.0)
# After how long a cell running in this kernel is said under the buttons: the kernel acts
# on a click (a button, a tab, a row) only once the cell ends, so clicks did nothing.
BUSY_SECONDS = 2.0
BUSY = ("this kernel is running a cell: what you click here is done when the cell ends "
        "(new checkpoints still show as they are saved); interrupt the kernel to act now")
REDRAW_GAP_PER_COST = 10
# The status line's colour for what ckpt_nb said or warned during an action (a success's
# green, a failure's red, are the action's own).
NOTE_COLOR = "#b26a00"
# What an explorer's actions say once it is closed (its catalog closed, the store no longer
# followed).
CLOSED = "this explorer was closed (ui.close()): open a new one with ckpt_nb.explore(...)"
# After a read of the store that failed, in the status line: the rows are not current.
STALE = "the table shows what was last read; it follows the store again once it can be read"
# The explorer's own rules, for a narrow output (a side panel, a split view): tab titles
# are not cut, the HTML texts wrap, the diff's table scrolls sideways in its own box (its
# width pushed the metric deltas above it out of view).
EXPLORER_CSS = """
.ckpt-nb-explorer .jupyter-widgets.jupyter-widget-tab > .lm-TabBar .lm-TabBar-tab,
.ckpt-nb-explorer .jupyter-widgets.widget-tab > .p-TabBar .p-TabBar-tab {
  flex-basis: min(var(--jp-widgets-horizontal-tab-width, 144px), 25%);
  min-width: max-content; }
.ckpt-nb-explorer .lm-TabBar-content, .ckpt-nb-explorer .p-TabBar-content { flex-wrap: wrap; }
.ckpt-nb-explorer .widget-html-content { min-width: 0; white-space: normal;
                                         overflow-wrap: anywhere; }
.ckpt-nb-explorer .ckpt-nb-scroll { overflow-x: auto; max-width: 100%; }
.ckpt-nb-explorer .ckpt-nb-diff td, .ckpt-nb-explorer .ckpt-nb-diff th {
  white-space: nowrap; }
"""


class CheckpointTable(anywidget.AnyWidget):
    """Rows of checkpoints; click a header to sort, a row to select (ctrl/shift: more).
    A row is ``{"id", "cells": {column: value}, "best": [column, ...], "titles": {column:
    tooltip}}``: metric values stay apart from the row's own fields, whatever the metrics
    are called."""

    _esm = _TABLE_ESM
    columns = traitlets.List(traitlets.Unicode()).tag(sync=True)
    rows = traitlets.List(traitlets.Dict()).tag(sync=True)
    selected = traitlets.List(traitlets.Unicode()).tag(sync=True)
    sort_by = traitlets.Unicode("created").tag(sync=True)
    ascending = traitlets.Bool(True).tag(sync=True)


class DagView(anywidget.AnyWidget):
    """The checkpoint graph as SVG; clicking a node selects it."""

    _esm = _DAG_ESM
    nodes = traitlets.List(traitlets.Dict()).tag(sync=True)
    selected = traitlets.List(traitlets.Unicode()).tag(sync=True)
    current = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    # The checkpoint the kernel's state came from where it was deleted since: the kernel
    # is then marked (⇢) at ``current``, its nearest kept ancestor.
    current_deleted = traitlets.Unicode(None, allow_none=True).tag(sync=True)


def _cell(value: Any) -> Any:
    """A JSON-able table cell: NaN and NA become None, ±inf the text "inf"/"-inf", as
    ``ckpt-nb ls`` shows it (JSON has no such numbers, and jupyter_client warns on them);
    floats are rounded."""
    if value is None or _plots._missing(value):
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else f"{value}"
    return value


def _diff_label(record: dict[str, Any]) -> str:
    """A checkpoint as the Diff tab's from/to name it: id, step and branch."""
    step = record["step"]
    shown = "" if step is None or _plots._missing(step) else f"step {int(step)}  "
    return f"{record['id']}  {shown}{record['branch']}"


def _not_restored(missing: list[str], namespace: dict[str, Any], kinds: dict[str, str]) -> str:
    """The part of a rollback's message that names what a partial one left alone, and why:
    the kernel has no such name, or has it as something else now (``kinds``: the class
    each object was saved as; a name without one was saved as a variable)."""
    if not missing:
        return ""
    absent = [name for name in missing if name not in namespace]
    reasons = [f"{', '.join(absent)} (the kernel tracks no object of "
               f"{'that name' if len(absent) == 1 else 'those names'})"] if absent else []
    for name in missing:
        if name not in namespace:
            continue
        now, saved = type(namespace[name]).__name__, kinds.get(name)
        if saved is None:
            why = f"now of type {now}: a saved variable is not put back over code or a " \
                "tracked object"
        elif saved == now:
            why = f"of type {now}, which the kernel does not track"
        else:
            why = f"now of type {now}, no longer the {saved} it was saved as"
        reasons.append(f"{name} ({why})")
    return f"; not restored: {'; '.join(reasons)}"


def _failure(exc: Exception) -> str:
    """An exception as the status line says it: ckpt_nb's, the OS's and a bad value's by
    their message (they name the problem), any other with its type."""
    expected = isinstance(exc, (CkptError, OSError, ValueError))
    return f"⚠ {exc}" if expected else f"⚠ failed: {type(exc).__name__}: {exc}"


def _notes(told: Told, *, own: str | None = None) -> list[str]:
    """What ckpt_nb said and warned during an action, for the status line below the
    action's own message: each warning marked ⚠. A line said that starts with ``own`` is
    the action's own message in the session's words (a rollback's), left out; a warning
    that starts so is said without it."""
    return [line for line in told.said if own is None or not line.startswith(own)] + \
        [f"⚠ {text.removeprefix(f'{own}: ') if own else text}" for text in told.warned]


def _rollback_said(told: Told, cid: str) -> str:
    """The session's line for a rollback to ``cid`` ("" where none)."""
    return next((line for line in told.said if line.startswith(f"rolled back to {cid}")), "")


def _unread(told: Told, cid: str) -> str:
    """The variables a rollback to ``cid`` left out as they do not read back, as the
    session's line names them ("" where none): the explorer's line names those the plan
    restores, read before the values were."""
    return _rollback_said(told, cid).partition(_session.LEFT_UNREAD)[2] \
        .partition(_session.NEXT_SAVE)[0]


def _after_branch(told: Told, cid: str) -> str:
    """How the session's line for a rollback to ``cid`` ends: where the next save goes (a
    branch from it, or on along its branch from a tip) and the tracked objects it left as
    they are, not in the checkpoint, for the explorer's line to end with too."""
    said = _rollback_said(told, cid)
    return said[said.index(_session.NEXT_SAVE):] if _session.NEXT_SAVE in said \
        else _session.BRANCH_NEXT


# What an argument naming checkpoints takes, as its usage errors say it.
CHECKPOINT_NAME = "a checkpoint id, an id prefix or an alias ('latest', 'best', '-2') as a str"


def _checked_name(value: Any, argument: str, *, takes: str = CHECKPOINT_NAME) -> str:
    """``value`` given for ``argument`` (a checkpoint's name) where it is a non-empty str;
    else a TypeError or ValueError naming the argument and what it takes (``manager.resolve``
    took 1 as the prefix "1", and None as "None", and said no such checkpoint)."""
    if not isinstance(value, str):
        raise TypeError(f"{argument} takes {takes}, not {type(value).__name__} {value!r}")
    if not value.strip():
        raise ValueError(f"{argument} takes {takes}, not the empty name {value!r}")
    return value


def _checked_names(ids: Any) -> list[str]:
    """``select``'s ``ids``: one name (a str) or an iterable of them, each checked."""
    takes = f"{CHECKPOINT_NAME}, or a list of them"
    if isinstance(ids, str):
        return [_checked_name(ids, "ids", takes=takes)]
    if isinstance(ids, (bytes, bytearray)) or not isinstance(ids, Iterable):
        raise TypeError(f"ids takes {takes}, not {type(ids).__name__} {ids!r}")
    return [_checked_name(i, "ids", takes=takes) for i in ids]


def _check_arguments(store: Any, namespace: Any, poll_seconds: Any) -> None:
    """Refuse ``explore()``'s arguments of a type or value it cannot take, by name (a
    poll_seconds of "1" crashed the follower thread after the app opened)."""
    if not isinstance(store, (str, os.PathLike, CheckpointManager)):
        raise TypeError(f"store takes a directory, a URL or a CheckpointManager, not "
                        f"{type(store).__name__} {store!r}")
    if namespace is not None and not isinstance(namespace, dict):
        raise TypeError(f"namespace takes a dict (globals()) or None (the IPython kernel's), "
                        f"not {type(namespace).__name__}")
    poll = "poll_seconds takes a number of seconds, 0 or more (0: only this process's saves)"
    if not isinstance(poll_seconds, numbers.Real) or isinstance(poll_seconds, bool):
        raise TypeError(f"{poll}, not {type(poll_seconds).__name__} {poll_seconds!r}")
    if not 0 <= poll_seconds < math.inf:
        raise ValueError(f"{poll}, not {poll_seconds!r}")


def _metric_labels(metrics: Iterable[str]) -> dict[str, str]:
    """Each metric's column label: its name, prefixed "metric:" where it would clash with
    a column of the table's own (a metric called "stored" must not replace the size)."""
    labels: dict[str, str] = {}
    used = set(TABLE_COLUMNS)
    for name in metrics:
        label = name
        while label in used:
            label = f"metric:{label}"
        labels[name] = label
        used.add(label)
    return labels


class Explorer(w.VBox, NotState):
    """The explorer app for one store. Build it with ``ckpt_nb.explore(store)``. ckpt_nb's
    own, never state: a save does not name a variable that holds it (``ui = %ckpt_ui``)
    as left out."""

    def __init__(self, store: str | os.PathLike[str] | CheckpointManager, *,
                 namespace: dict[str, Any] | None = None, poll_seconds: float = 1.0,
                 wait: bool = False) -> None:
        self._built = False  # (its widgets made: one refused as it opened has none to close)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._closed = False
        self._unsubscribe: Any = lambda: None
        self._unhook: Callable[[], None] = lambda: None
        self._busy_timer: threading.Timer | None = None
        self._owns_manager = False
        _check_arguments(store, namespace, poll_seconds)
        if not isinstance(wait, bool):
            raise TypeError(f"wait takes True (follow a store not made yet till it is) or "
                            f"False, not {type(wait).__name__} {wait!r}")
        poll_seconds = float(poll_seconds)  # (a NumPy float32 is no timeout for a wait)
        # The store's folder or URL, as given; its manager is None while a store explored
        # with wait=True is not there yet (opened by ``_open_when_there``).
        self._location = None if isinstance(store, CheckpointManager) else os.fspath(store)
        self._manager: CheckpointManager | None = None
        # Waiting (``%ckpt_ui`` before any session, ``_follow_first_session``): the store
        # of the first session this process starts, if that is not the one waited for.
        self._follows_session = False
        if isinstance(store, CheckpointManager):
            self._manager = store
        elif not wait or store_exists(self._location):
            with _plots.opened(store):  # a clear error for a missing store (a typo)
                pass
            self._manager = CheckpointManager(self._location)
            self._owns_manager = True
        self.url = self._manager.store.url if self._manager is not None else \
            _session.store_url(self._location)
        self.namespace = namespace
        self._lock = threading.RLock()
        self.table_frame: Any = None
        self.selected: list[str] = []
        self._pending_action: tuple[str, str] | None = None
        # Why the last selection asked for was not made, the store unreadable (a click queued
        # meanwhile, a Pin, must not act on the selection before it), till the store reads.
        self._unmade_selection: str | None = None
        # The selection's checkpoints a refresh found deleted (by retention, another
        # explorer) till the next selection: a button then says why none is selected.
        self._gone_selection: list[str] = []
        self._transient = False  # the status line shows a failed draw or refresh
        # While the status line tells of a rollback: its target and the ids there were then
        # (a save since makes "the next save starts a branch from it", or "the next save
        # goes on along its branch, NAME" for a branch's tip, old news).
        self._rolled_back: tuple[str, frozenset[str]] | None = None
        self._counted_since: set[str] = set()  # (of them, those counted as saved since)
        # Each checkpoint's run record (None: it has none), as read for the --keep-best it
        # gives (``_keep_best``): a refresh reads only the new checkpoints' manifests.
        self._run_records: dict[str, Any] = {}

        self.title = w.HTML()
        self.status = w.HTML(layout=w.Layout(min_height="1.6em"))
        self.status.add_class("ckpt-nb-status")
        self.progress = w.IntProgress(min=0, max=1, layout=w.Layout(display="none", width="40%"))
        self.table = CheckpointTable(columns=list(TABLE_COLUMNS))
        self.table.observe(self._on_sort, names=["sort_by", "ascending"])
        self.table.observe(self._on_view_select, names="selected")
        self.dag = DagView(layout=w.Layout(max_height=DAG_HEIGHT, overflow="auto"))
        self.dag.observe(self._on_view_select, names="selected")
        self.table_note = w.HTML(NO_CHECKPOINTS)
        self.dag_note = w.HTML(NO_CHECKPOINTS)
        self.kernel_note = w.HTML(layout=w.Layout(display="none"))
        self.metric = w.Dropdown(description="metric",
                                 layout=w.Layout(width=f"{METRIC_WIDTH[0]}px", max_width="100%"))
        # Whether the metric shown is one the user picked (kept while the store has it),
        # not the explorer's first pick (ranked again at each refresh: a loss logged later
        # comes first).
        self._metric_picked = False
        self.metric.observe(self._on_metric_choice, names="value")
        # Each image hidden till drawn: a tab opened while this kernel runs a cell is
        # drawn once the cell ends, and till then showed a broken-image icon.
        self.metrics_plot = w.Image(format="png", layout=w.Layout(display="none"))
        self.compare_plot = w.Image(format="png", layout=w.Layout(display="none"))
        # (said where the selection logged no metric: a blank figure with a line in it)
        self.compare_note = w.HTML(f"<i>{html.escape(NOTHING_TO_COMPARE)}</i>",
                                   layout=w.Layout(display="none"))
        self.compare_box = w.VBox([w.HTML("<b>Selected checkpoints side by side</b>"),
                                   self.compare_plot, self.compare_note],
                                  layout=w.Layout(display="none"))
        self.compare_hint = w.HTML("<i>ctrl- or shift-click two or more rows to compare their "
                                   "metrics side by side</i>")
        self.diff_a = w.Dropdown(description="from",
                                 layout=w.Layout(width="340px", max_width="100%"))
        self.diff_b = w.Dropdown(description="to", layout=w.Layout(width="340px", max_width="100%"))
        # While the explorer itself sets from/to or the metric (a refresh, a selection),
        # their observers hold off: it draws once after (each of its four changes drew the
        # diff again).
        self._choosing_values = False
        # The last diff drawn: its pair, its table and its bars (a refresh while the Diff
        # tab is open, after each save of a training run, would compute it again).
        self._drawn_diff: tuple[str, str, Any, bytes] | None = None
        # The checkpoint from and to were both last said to be, and the status line that
        # said so: said once (a refresh drawing it again must not say it over another
        # action's message), and gone once another pair is drawn.
        self._said_same: tuple[str, str] | None = None
        self.diff_a.observe(self._on_diff_choice, names="value")
        self.diff_b.observe(self._on_diff_choice, names="value")
        self.diff_plot = w.Image(format="png", layout=w.Layout(display="none"))
        self.diff_table = w.HTML()
        self.tabs = w.Tab(children=[
            w.VBox([self.table, self.table_note]),
            w.VBox([self.metric, self.metrics_plot, self.compare_hint, self.compare_box]),
            w.VBox([self.dag, self.kernel_note, self.dag_note]),
            w.VBox([w.HBox([self.diff_a, self.diff_b], layout=w.Layout(flex_flow="row wrap")),
                    self.diff_plot, self.diff_table]),
        ])
        for i, name in enumerate(("Checkpoints", "Metrics", "DAG", "Diff")):
            self.tabs.set_title(i, name)
        self.tabs.observe(lambda _: self._draw_visible(), names="selected_index")

        def button(label: str, handler: Any, style: str = "", tip: str = "") -> w.Button:
            b = w.Button(description=label, button_style=style, tooltip=tip,
                         layout=w.Layout(width="auto"))
            b.on_click(lambda _: self._guard(handler, None if label == "Confirm" else label))
            return b

        self.rollback_button = button("Roll back", self._ask_rollback, "warning",
                                      "restore the kernel's tracked objects to the selection")
        self.pin_button = button("Pin", lambda: self.pin(self._one()), "",
                                 "keep it whatever retention says")
        self.unpin_button = button("Unpin", lambda: self.unpin(self._one()))
        self.delete_button = button("Delete", self._ask_delete, "danger")
        self.export_path = w.Text(placeholder="model.pt or model.safetensors",
                                  layout=w.Layout(width="220px"))
        self.export_button = button("Export", lambda: self.export(self._one(),
                                                                  self.export_path.value))
        self.confirm_button = button("Confirm", self._confirm, "danger")
        self.cancel_button = button("Cancel", self._drop_pending)
        self.confirm_box = w.HBox([self.confirm_button, self.cancel_button],
                                  layout=w.Layout(display="none"))
        actions = w.HBox([self.rollback_button, self.pin_button, self.unpin_button,
                          self.delete_button, self.export_path, self.export_button],
                         layout=w.Layout(flex_flow="row wrap"))
        self.busy_note = w.HTML(f'<span style="color:{NOTE_COLOR}">{BUSY}</span>',
                                layout=w.Layout(display="none"))
        self.busy_note.add_class("ckpt-nb-busy")
        self.css = w.HTML(f"<style>{EXPLORER_CSS}</style>", layout=w.Layout(display="none"))
        # (the style last: a front end that shows the widget as text starts at the title)
        super().__init__([self.title, self.tabs, actions, self.confirm_box, self.progress,
                          self.busy_note, self.status, self.css])
        self._built = True
        self.add_class("ckpt-nb-explorer")

        if self._manager is not None:
            self._show(self._read())  # (a store that fails to open fails here, raised)
        else:
            self._show_not_yet()
        self._unsubscribe = _session.subscribe(self._on_session_event)
        self._unhook = self._hook_cells()
        self._signature = self._catalog_signature() if self._manager is not None else None
        self._follower = threading.Thread(target=self._follow, args=(poll_seconds,),
                                          daemon=True, name="ckpt_nb-explorer")
        self._follower.start()

    @property
    def manager(self) -> CheckpointManager:
        """The store's ``CheckpointManager``. Explored with ``wait=True`` before the store
        was made, there is none till it is: a ``CheckpointNotFoundError`` says so."""
        if self._manager is None:
            raise CheckpointNotFoundError(NOTHING_YET.format(where=self._location))
        return self._manager

    def _open_when_there(self) -> bool:
        """Whether the store is open: one explored with ``wait=True`` before it was made
        is opened here once it is there (a look for its catalog, or on an object store its
        format stamp)."""
        if self._manager is not None:
            return True
        with self._lock:
            if self._manager is None and not self._closed:
                location = self._location
                if self._follows_session:  # (a %%ckpt_auto --dir elsewhere: that store)
                    location = _session.last_directory() or location
                if not store_exists(location):
                    return False
                manager = CheckpointManager(location)
                self._manager, self._owns_manager = manager, True
                self._location = location
                self.url = manager.store.url
                if self._closed:  # (closed meanwhile: close() found no manager to close)
                    with contextlib.suppress(Exception):
                        manager.close()
        return self._manager is not None

    def _follow_first_session(self) -> None:
        """Waiting for the default store (``%ckpt_ui`` in a kernel that ran no session):
        show instead the store of the first session this process starts, wherever its
        --dir puts it, as ``%ckpt_ui`` opens the last session's store once there is one."""
        self._follows_session = True
        note = ("no checkpoints yet: no %%ckpt_auto cell has run in this kernel, and there is "
                f"no store at {self._location}, the default one, yet; the first %%ckpt_auto "
                "cell's checkpoints show here as it saves them")
        with self._lock:
            if self._manager is None:
                self.table_note.value = self.dag_note.value = f"<i>{html.escape(note)}</i>"
        self._wake.set()  # (a session started meanwhile: looked at now)

    def _show_not_yet(self) -> None:
        """What an explorer waiting for its store shows: its notes say so, the title names
        the store."""
        where = self._location
        note = f"<i>{html.escape(NO_STORE_YET.format(where=where))}</i>"
        self.table_note.value = self.dag_note.value = note
        self.dag.layout.display = "none"
        self.title.value = f"<b>ckpt_nb</b> · {html.escape(_shown_path(where))} · no store yet"

    # -- data -----------------------------------------------------------------------
    def refresh(self) -> bool:
        """Re-read the catalog and redraw what is visible; safe from any thread. A store
        that cannot be read (removed, its server down) is said in the status line, never
        raised (the follower's refreshes have no caller to raise to): the rows shown stay,
        and the next refresh that reads the store clears the message. Returns whether
        this one read it. A closed explorer's refuses (a StoreError), as its actions do."""
        self._check_open()
        with self._lock:
            try:
                if not self._open_when_there():
                    return False  # (not there yet: the notes say so)
                self._check_store()
                frame = self._read()
                if not len(frame):
                    self._check_store(read_empty=True)
            except Exception as exc:  # noqa: BLE001 - whatever failed, said alike
                self._say_stale(exc)
                return False
            self._show(frame)
            return True

    def _read(self) -> Any:
        """The store's table (``CheckpointManager.list()``), its ``best`` column the
        ``_keep_best`` best by the manager's ranking."""
        frame = self.manager.list()
        keep_best = self._keep_best()
        if keep_best == (self.manager.keep_best or 1):  # (as list() marked them)
            return frame
        ids = set(frame["id"])
        rows = [r for r in self.manager.catalog.checkpoints() if r.id in ids]
        return frame.assign(best=frame["id"].isin(self.manager._best(rows, keep_best)))

    def _keep_best(self) -> int:
        """How many checkpoints are marked best (the DAG's gold, the bold of the metric
        "best" ranks by): the manager's ``keep_best``, else the ``--keep-best`` of the
        store's newest run record where that run ranks as the manager does (as
        ``%ckpt_list`` marks them), read again at each refresh: a run saving since, in
        this process or another, changes it; else 1."""
        manager = self.manager
        if manager.keep_best is not None:
            return manager.keep_best
        return written_keep_best(manager, self._run_records) or 1

    def _show(self, frame: Any) -> None:
        """Show a table the store's catalog gave: rows, choices, DAG and title (the caller
        holds the lock, or no other thread runs yet)."""
        self.table_frame = frame
        self._unmade_selection = None  # (the views show what the buttons act on again)
        kept = [i for i in self.selected if i in set(frame["id"])]
        if kept != self.selected:  # (deleted since: said if a button then finds none)
            self._gone_selection = [i for i in self.selected if i not in kept]
        self.selected = kept
        if self._pending_action and self._pending_action[1] not in self.selected:
            self._drop_pending(gone=self._pending_action[1] not in set(frame["id"]))
        ids = list(frame["id"])
        metrics = _plots.metric_columns(frame)
        labels = _metric_labels(metrics)
        choices = [(_diff_label(r), r["id"]) for r in frame.to_dict("records")]
        with self._choosing():
            # New options reset a Dropdown to the first: the metric the user picked stays
            # where the store still has it (a save logging a new metric replaced it by the
            # first); else the ranked one shows.
            chosen = self.metric.value
            self._metric_picked = self._metric_picked and chosen in metrics
            self.metric.options = [(labels[m], m) for m in metrics]  # (named as in the table)
            self.metric.value = chosen if self._metric_picked else \
                _plots.ranked_metric(metrics, self.manager.metric)
            for dropdown in (self.diff_a, self.diff_b):
                value = dropdown.value
                dropdown.options = choices
                dropdown.value = value if value in ids else None
        least, per_character = METRIC_WIDTH
        longest = max(map(len, labels.values()), default=0)
        self.metric.layout.width = f"{max(least, 110 + per_character * longest)}px"
        *fields, note = TABLE_COLUMNS
        self.table.columns = [*fields, *labels.values(), note]
        self._fill_table()
        self.dag.nodes = [vars(n) for n in _plots.dag_layout(frame, self.manager.metric,
                                                             self.manager.mode)]
        self.dag.current, self.dag.current_deleted = self._kernel_mark(set(ids))
        gone, heir = self.dag.current_deleted, self.dag.current
        self.kernel_note.layout.display = None if gone else "none"
        self.kernel_note.value = "" if not gone else html.escape(
            f"kernel ⇢: the kernel's state came from {gone}, deleted since; " +
            (f"{heir} is its nearest kept ancestor" if heir else "no ancestor of it is kept"))
        self._sync_selection()
        for note in (self.table_note, self.dag_note):
            note.value = NO_CHECKPOINTS  # (an explorer that waited for the store: no longer)
            note.layout.display = "none" if len(frame) else None
        self.dag.layout.display = None if len(frame) else "none"  # (an empty box)
        stored = int(frame["stored_bytes"].sum()) if len(frame) else 0
        logical = int(frame["logical_bytes"].sum()) if len(frame) else 0
        self.title.value = (f"<b>ckpt_nb</b> · {self._display_name()} · {len(frame)} "
                            f"checkpoint{'' if len(frame) == 1 else 's'} · "
                            f"{human_size(stored)} stored for {human_size(logical)} of state")
        self._clear_transient()
        self._say_saved_since_rollback(frame)
        self._draw_visible()

    def _say_saved_since_rollback(self, frame: Any) -> None:
        """Replace the rollback's message once checkpoints were saved since: its "the
        next save starts a branch from it" (or, rolled back to a branch's tip, "the next
        save goes on along its branch, NAME") is then what happened, not what will. Only
        checkpoints that descend from the one rolled back to count: not another process's
        saves of other runs."""
        if self._rolled_back is None:
            return
        cid, then = self._rolled_back
        rows = frame.to_dict("records")
        parents = {r["id"]: r["parent"] for r in rows}
        # (those counted before count their children on: the checkpoint rolled back to
        # may have been deleted since, its children given its parent)
        roots = {cid} | self._counted_since

        def descends(checkpoint_id: str) -> bool:
            seen = set()
            while checkpoint_id in parents and checkpoint_id not in seen:
                seen.add(checkpoint_id)
                checkpoint_id = parents[checkpoint_id]
                if checkpoint_id in roots:
                    return True
            return False

        new = [r for r in rows if r["id"] not in then and
               (r["id"] in self._counted_since or descends(r["id"]))]
        self._counted_since = {r["id"] for r in new}
        if new:
            self._say(f"rolled back to {cid}; {len(new)} checkpoint"
                      f"{'' if len(new) == 1 else 's'} saved since, the newest "
                      f"{new[-1]['id']} on {new[-1]['branch']}")
            self._rolled_back = cid, then  # (_say let it go: later saves count on)

    def _kernel_mark(self, ids: set[str]) -> tuple[str | None, str | None]:
        """Where the DAG marks the kernel (``_plots.kernel_mark``, as the static figure)."""
        return _plots.kernel_mark(self.manager, self.current, ids)

    @property
    def current(self) -> str | None:
        """The checkpoint the kernel's tracked state came from, if this process knows."""
        return _session.kernel_position(self.url)

    def _fill_table(self) -> None:
        frame = self.table_frame
        labels = _metric_labels(_plots.metric_columns(frame))
        # The metric "best" ranks by is bold where the table's best column marks (the K
        # best where runs keep K); each other metric's best value, by its own direction.
        ranked = self.manager.metric if self.manager.metric in labels else None
        best: dict[str, list[str]] = {}
        for m, cid in _plots.best_by_metric(frame, self.manager.metric,
                                            self.manager.mode).items():
            if m != ranked:
                best.setdefault(cid, []).append(labels[m])
        if ranked is not None:
            for cid in frame.loc[frame["best"].astype(bool), "id"]:
                best.setdefault(cid, []).append(labels[ranked])
        rows, orders = [], []
        for record in frame.to_dict("records"):
            note = " ⏎ ".join(record["note"].splitlines())
            # "created" in local time, as ``ckpt-nb ls`` shows it (the catalog's is UTC)
            created = datetime.fromtimestamp(record["created"].timestamp())
            cells = {"id": record["id"], "branch": record["branch"],
                     "step": _cell(record["step"]), "epoch": _cell(record["epoch"]),
                     "created": created.strftime("%Y-%m-%d %H:%M:%S"),
                     "strategy": record["strategy"], "stored": human_size(record["stored_bytes"]),
                     "logical": human_size(record["logical_bytes"]),
                     "pinned": "★" if record["pinned"] else "",
                     "note": note if len(note) <= NOTE_CHARS else note[:NOTE_CHARS - 1] + "…"}
            cells.update({label: _cell(record[m]) for m, label in labels.items()})
            titles = {"note": record["note"]} if cells["note"] != record["note"] else {}
            rows.append({"id": record["id"], "cells": cells,
                         "best": sorted(best.get(record["id"], ())), "titles": titles})
            # What a column sorts by, where its cell is only for show: the real time (saves
            # in one second), the bytes, a metric's value (±inf sort; NaN goes last).
            orders.append({**cells, "created": record["created"], "note": record["note"],
                           "stored": int(record["stored_bytes"]),
                           "logical": int(record["logical_bytes"]),
                           **{label: None if _plots._missing(record[m]) else float(record[m])
                              for m, label in labels.items()}})
        key = self.table.sort_by if self.table.sort_by in self.table.columns else "created"
        present = [i for i, order in enumerate(orders) if order[key] is not None]
        absent = [i for i, order in enumerate(orders) if order[key] is None]  # always last
        # Ties keep the catalog's order, reversed with the rest when descending.
        present.sort(key=lambda i: (orders[i][key], i), reverse=not self.table.ascending)
        self.table.rows = [rows[i] for i in present + absent]

    def _on_sort(self, _: Any) -> None:
        with self._lock:
            if self.table_frame is not None:
                self._fill_table()

    def sort(self, column: str, ascending: bool = True) -> list[str]:
        """Sort the table by a column; returns the ids in their new order."""
        self._check_open()
        if not isinstance(column, str):
            raise TypeError(f"column takes a column's name (a str), not "
                            f"{type(column).__name__} {column!r}")
        if type(ascending).__name__ not in ("bool", "bool_") and not (
                isinstance(ascending, numbers.Integral) and ascending in (0, 1)):
            raise TypeError(f"ascending takes True or False, not {ascending!r}")
        ascending = bool(ascending)
        if self.table_frame is None:
            self._check_store()  # (no store yet: said so; made since: opened and read)
        if column not in self.table.columns:
            raise MetricNotFoundError(f"cannot sort by {column!r}: no such column; give one "
                                      f"of {', '.join(self.table.columns)}")
        self.table.ascending = ascending
        self.table.sort_by = column
        self._fill_table()
        return [r["id"] for r in self.table.rows]

    # -- selection --------------------------------------------------------------------
    def select(self, ids: str | Iterable[str]) -> list[str]:
        """Select checkpoints by id, prefix or alias ("latest", "best", "-2"), one (a
        string) or several; each once, however many names it was given by. A new selection
        withdraws a question awaiting Confirm. A store that cannot be read (its server down)
        is said in the status line, and the selection stays."""
        self._check_open()
        with self._lock:
            names = _checked_names(ids)
            self._check_store()
            try:
                selected = list(dict.fromkeys(self._resolve(i) for i in names))
            except StoreError as exc:
                self._unmade_selection = f"{', '.join(names)} could not be selected: {exc}"
                self._drop_pending()  # (a new selection, though unmade, withdraws it too)
                self._say_stale(exc)
                return self.selected
            self._unmade_selection = None
            if not set(selected) <= set(self.table_frame["id"]):
                self.refresh()  # (saved elsewhere since the last poll: rows for them first)
            if selected != self.selected:
                self._drop_pending()
            self.selected = selected
            self._gone_selection = []
            self._sync_selection()
            self._draw_visible()
            return self.selected

    def _on_view_select(self, change: Any) -> None:
        asked = list(change["new"])
        if asked != self.selected:
            self._guard(lambda: self.select(asked))
            if self.selected != asked:
                # Not made (a checkpoint deleted meanwhile, the store unreadable): the views
                # show again what the buttons act on.
                self.table.selected = list(self.selected)
                self.dag.selected = list(self.selected)

    def _sync_selection(self) -> None:
        self.table.selected = list(self.selected)
        self.dag.selected = list(self.selected)
        ids = list(self.table_frame["id"])
        with self._choosing():  # (the caller draws)
            if len(self.selected) >= 2:  # from the older to the newer, whichever came first
                self.diff_a.value, self.diff_b.value = sorted(self.selected[:2], key=ids.index)
            elif len(self.selected) == 1 and self.diff_b.options:
                parent = self._parent(self.selected[0])
                self.diff_a.value = parent if parent in ids else None
                self.diff_b.value = self.selected[0]

    @contextlib.contextmanager
    def _choosing(self) -> Iterator[None]:
        """Set from/to and the metric without a draw at each change (the caller draws once
        after)."""
        held, self._choosing_values = self._choosing_values, True
        try:
            yield
        finally:
            self._choosing_values = held

    def _on_diff_choice(self, _: Any) -> None:
        """A from or to the user picked: draw that diff."""
        if not self._choosing_values:
            self._draw(self._draw_diff)

    def _on_metric_choice(self, _: Any) -> None:
        """A metric the user picked: draw it. Its whole name is the dropdown's tooltip
        (an output narrower than the name cuts it)."""
        self.metric.tooltip = self.metric.label
        if not self._choosing_values:
            self._metric_picked = True
            self._draw(self._draw_metrics)

    def _parent(self, cid: str) -> str | None:
        rows = self.table_frame[self.table_frame["id"] == cid]
        parent = rows["parent"].iloc[0] if len(rows) else None
        return parent if isinstance(parent, str) else None

    def _deleted_parent(self, cid: str) -> str | None:
        """The parent a checkpoint was saved from where that was deleted since (retention
        took it: the catalog then gives the checkpoint none); None for a first save."""
        with contextlib.suppress(CkptError, OSError):  # (only for a message)
            parent = self.manager._manifest(cid).get("parent")
            if isinstance(parent, str) and self.manager.catalog.get(parent) is None:
                return parent
        return None

    def _resolve(self, which: str) -> str:
        """``manager.resolve``, but a checkpoint this view shows that the store no longer
        has is named as deleted (not as a typo to look up in list())."""
        try:
            return self.manager.resolve(which)
        except CheckpointNotFoundError:
            if self.table_frame is None or which not in set(self.table_frame["id"]):
                raise
            raise CheckpointNotFoundError(
                f"checkpoint {which} was deleted {DELETED_BY} since the table was read: "
                "select another checkpoint") from None

    def _check_store(self, *, read_empty: bool = False) -> None:
        """Refuse to read or act on a store removed while open: a local one's catalog lock
        file failed with "[Errno 2]"; an object store's manager reads one as empty
        (``read_empty``: then a look for its format stamp tells). The rows shown were the
        last ones read. One explored with ``wait=True`` whose store is not there yet refuses
        till it is (``NOTHING_YET``), and once it is there, opens and reads it first."""
        if self._manager is None and self._open_when_there():
            self.refresh()
        store = self.manager.store  # (not there yet: NOTHING_YET, raised by ``manager``)
        root = getattr(store, "root", None)
        if isinstance(root, Path):
            gone = not store_exists(root)
        else:
            gone = read_empty and isinstance(store, FsspecStore) and not store.has(FORMAT_KEY)
        if gone:
            raise CheckpointNotFoundError(
                f"the store at {root if isinstance(root, Path) else self.url} no longer "
                "exists (moved or deleted): nothing can be shown or done; put it back, or "
                "explore() another")

    def _one(self) -> str:
        """The checkpoint a button acts on: the one selected (none, or several, is a usage
        error: no checkpoint is missing). Where the last selection asked for could not be
        made, the store unreadable, the store is read first: while it still cannot be, that
        is the reason given, and nothing is acted on; once it can, the selection the views
        show again is acted on."""
        if self._manager is None:
            self._check_store()  # (no store yet: said so; made since: opened and read)
        if self._unmade_selection is not None and not self.refresh():
            raise StoreError(f"{self._unmade_selection}; nothing done: press it again once "
                             "the store can be read (it then acts on the selection shown)")
        if not self.selected and self._gone_selection:
            gone = ", ".join(self._gone_selection)
            raise CheckpointNotFoundError(
                f"{gone}, selected, was deleted {DELETED_BY} since: select another checkpoint "
                "(click a row in Checkpoints or a node in DAG)")
        if len(self.selected) != 1:
            several = f": {len(self.selected)} are selected" if self.selected else ""
            raise ValueError(f"select one checkpoint first{several} (click a row in "
                             "Checkpoints or a node in DAG, without ctrl or shift)")
        return self.selected[0]

    # -- drawing -------------------------------------------------------------------------
    def _draw_visible(self) -> None:
        if self._manager is None:  # (no store yet: nothing to draw, the notes say why)
            return
        index = self.tabs.selected_index
        if index == 1:
            self._draw(self._draw_metrics)
        elif index == 3:
            self._draw(self._draw_diff)

    def _draw(self, draw: Callable[[], None]) -> None:
        """Draw a tab; a failure shows in the status line. Drawing runs in observers, where
        an exception would escape to whatever changed the trait (a tab click, a select)."""
        try:
            self._check_store()
            draw()
        except Exception as exc:  # noqa: BLE001 - any failure to draw is reported alike
            self._say(f"⚠ cannot draw this tab: {exc}", error=True, transient=True)
        else:
            self._clear_transient()
        finally:  # (an image never drawn, its first draw failed, shows as a broken one)
            for image in (self.metrics_plot, self.compare_plot, self.diff_plot):
                if not image.value:
                    image.layout.display = "none"

    def _compared_metrics(self) -> list[str] | None:
        """The metrics the side-by-side compare draws: those one or more of the selected
        checkpoints logged (a panel of "n/a" alone told nothing); None where they logged
        none (``compare_note`` then says so)."""
        frame = self.table_frame
        drawn = frame[frame["id"].isin(self.selected[:_plots.COMPARE_MOST])]
        return [m for m in _plots.metric_columns(frame)
                if not all(map(_plots._missing, drawn[m]))] or None

    def _draw_metrics(self) -> None:
        if self.table_frame is None or self.tabs.selected_index != 1:
            return
        frame = self.table_frame
        _show_png(self.metrics_plot, _plots.to_png(_plots.plot_metrics(
            self.manager, self.metric.value, selected=self.selected, table=frame)))
        comparing = len(self.selected) >= 2  # the side-by-side bars need two or more
        self.compare_box.layout.display = "flex" if comparing else "none"
        self.compare_hint.layout.display = "none" if comparing else "flex"
        if comparing:
            metrics = self._compared_metrics()
            self.compare_note.layout.display = "none" if metrics else None
            if metrics:
                _show_png(self.compare_plot, _plots.to_png(_plots.plot_compare(
                    self.manager, self.selected, metrics, table=frame)))
            else:
                self.compare_plot.layout.display = "none"

    def _draw_diff(self) -> None:
        if self.table_frame is None or self.tabs.selected_index != 3:
            return
        a, b = self.diff_a.value, self.diff_b.value
        if not a or not b:  # (text alone: an empty image shows as a broken one)
            self.diff_plot.layout.display = "none"
            self._unsay_same()
            if not len(self.table_frame):
                why = "no checkpoints yet: nothing to diff"
            elif len(self.selected) == 1 and not self._parent(self.selected[0]):
                cid = self.selected[0]
                lost = self._deleted_parent(cid)
                why = html.escape(
                    (f"{cid}'s parent {lost} was deleted" if lost else f"{cid} has no parent")
                    + ": nothing to diff it against. Ctrl-click a second row to diff two")
            else:
                why = "choose from and to above, or select two checkpoints (ctrl-click rows)"
            self.diff_table.value = f"<i>{why}</i>"
            return
        if a == b:  # (drawn, every tensor "identical" on a ±0.04 axis, with no word why)
            self.diff_plot.layout.display = "none"
            same = f"from and to are the same checkpoint, {a}: nothing differs; choose " \
                "another from or to"
            self.diff_table.value = f"<i>{html.escape(same)}</i>"
            if self._said_same is None or self._said_same[0] != a:
                self._say(same)
                self._said_same = a, self.status.value
            return
        self._unsay_same()
        self._render_diff(a, b)

    def _unsay_same(self) -> None:
        """Clear the status line's "the same checkpoint" where it still says so: from and
        to are no longer the same."""
        if self._said_same is not None and self.status.value == self._said_same[1]:
            self.status.value = ""
        self._said_same = None

    def _render_diff(self, a: str, b: str) -> None:
        if self._drawn_diff is None or self._drawn_diff[:2] != (a, b):
            # (a pair that fails to draw, one deleted included, must not leave the last
            # pair's bars and table under from/to that name another)
            self.diff_plot.layout.display = "none"
            self.diff_table.value = ""
            a, b = self._resolve(a), self._resolve(b)
            diff = self.manager.diff(a, b)  # (checkpoints never change: a pair's diff stays)
            try:
                values: Any = self.manager.diff_values(a, b)
            except (CheckpointNotFoundError, StoreError):
                raise  # (said in the status line, and no diff kept drawn without values)
            except CkptError as exc:  # (a value unreadable here must not hide the tensors')
                values = f"not compared: {exc}"
            png = _plots.to_png(_plots.plot_diff(self.manager, a, b, table=diff))
            self._drawn_diff = (a, b, (diff, values), png)
        (diff, values), png = self._drawn_diff[2:]
        _show_png(self.diff_plot, png)
        frame = self.table_frame.set_index("id")
        deltas, in_deltas = [], set()
        for m in _plots.metric_columns(self.table_frame):
            va, vb = frame.loc[a, m], frame.loc[b, m]
            if not (_plots._missing(va) or _plots._missing(vb)):
                deltas.append(f"{html.escape(m)}: {va:.4g} → {vb:.4g} ({vb - va:+.4g})")
                in_deltas.add(f"metrics/{m}")
        same = diff[diff["same_chunks"]]["tensor"].tolist()
        shown = diff.assign(  # (missing, as for a removed tensor: —, as in the table)
            l2=diff["l2"].map(lambda v: "—" if _plots._missing(v) else f"{v:.4g}"),
            rel_change=diff["rel_change"].map(lambda v: "—" if _plots._missing(v) else f"{v:.3g}"))
        self.diff_table.value = (
            f"<p><b>metrics</b>: {'; '.join(deltas) or 'none logged on both'}</p>"
            + self._values_html(values if isinstance(values, str) else
                                values[~values["path"].isin(in_deltas)])
            + f"<p><b>byte-identical (shared chunks)</b>: {len(same)} of {len(diff)} tensors</p>"
            + "<div class='ckpt-nb-scroll'>"
            + shown.to_html(index=False, classes="ckpt-nb-diff", border=0, justify="left")
            + "</div>")  # (headers over their cells, left: to_html put them right)

    @staticmethod
    def _values_html(values: Any) -> str:
        """The Diff tab's values section: ``diff_values``' rows (the first
        ``DIFF_VALUE_ROWS``, the rest counted), each value cut to a line (a history of
        thousands shows as its first items and its length); or, as a str, why the values
        were not compared."""
        from ._diff_values import diff_value_texts

        if isinstance(values, str):
            return f"<p><b>values</b>: {html.escape(values)}</p>"
        if not len(values):
            return "<p><b>values</b>: none differ (lr, step, extra...)</p>"
        rows = "".join(
            f"<tr><td>{html.escape(r['path'])}</td><td>{r['status']}</td>"
            + "".join(f"<td>{html.escape(text)}</td>" for text in diff_value_texts(r, missing="—"))
            + "</tr>" for _, r in values.head(DIFF_VALUE_ROWS).iterrows())
        more = len(values) - DIFF_VALUE_ROWS
        return (f"<p><b>values</b>: {len(values)} differ</p><div class='ckpt-nb-scroll'>"
                "<table class='ckpt-nb-diff'><thead><tr><th>value</th><th>status</th>"
                f"<th>from</th><th>to</th></tr></thead><tbody>{rows}</tbody></table></div>"
                + (f"<p><i>and {more} more: mgr.diff_values(a, b) lists them all</i></p>"
                   if more > 0 else ""))

    def figure(self, kind: str) -> Any:
        """The Figure behind a tab: "metrics", "compare", "dag" or "diff"."""
        self._check_open()
        frame = self.table_frame
        if kind == "metrics":
            return _plots.plot_metrics(self.manager, self.metric.value, selected=self.selected,
                                       table=frame)
        if kind == "compare":
            return _plots.plot_compare(self.manager, self.selected, self._compared_metrics(),
                                       table=frame)
        if kind == "dag":
            return _plots.plot_dag(self.manager, current=self.current, selected=self.selected,
                                   metric=self.manager.metric, mode=self.manager.mode,
                                   table=frame)
        if kind == "diff":
            if self.diff_a.value is None or self.diff_b.value is None:
                raise ValueError("choose two checkpoints to diff: from and to in the Diff "
                                 "tab, or select two (ui.select([a, b]))")
            return _plots.plot_diff(self.manager, self.diff_a.value, self.diff_b.value)
        raise ValueError(f"no figure {kind!r}: kind takes 'metrics', 'compare', 'dag' or "
                         "'diff'")

    # -- actions ---------------------------------------------------------------------------
    def _guard(self, action: Any, name: str | None = None) -> Any:
        """Run an action; a failure shows in the status line, never as a traceback (a button's
        exception would go to the browser's console: the click seemed to do nothing),
        after the button's ``name``, so that it reads as that action's (a store that fails
        to answer then says the Unpin failed, not only that a listing did)."""
        try:
            return action()
        except Exception as exc:  # noqa: BLE001 - KeyboardInterrupt and SystemExit go on
            text = _failure(exc)
            detail = text.removeprefix("⚠ ").removeprefix("failed: ")
            self._say(f"⚠ {name} failed: {detail}" if name else text, error=True)
            return None

    def _say_stale(self, exc: Exception) -> None:
        """Say that reading the store failed, and that the rows shown are older."""
        self._say(f"{_failure(exc)}\n{STALE}", error=True, transient=True)

    def _say(self, text: str, *, error: bool = False, transient: bool = False,
             notes: Iterable[str] = ()) -> None:
        """Show a message; a ``transient`` error (a draw or refresh that failed) goes at the
        next one that succeeds. ``notes`` (``_notes``: what ckpt_nb said and warned on the
        way) follow it in amber."""
        color = "#b00020" if error else "#1b5e20"
        self._rolled_back = None  # (a message that replaces the rollback's)
        said = [f"<span style='color:{hue}'>{'<br>'.join(map(html.escape, t.splitlines()))}"
                "</span>" for t, hue in [(text, color), *((n, NOTE_COLOR) for n in notes)]
                if t]
        self.status.value = "<br>".join(said)
        self._transient = error and transient

    def _clear_transient(self) -> None:
        if self._transient:
            self.status.value = ""
            self._transient = False

    def _ask(self, action: str, cid: str, question: str, notes: Iterable[str] = ()) -> None:
        self._pending_action = (action, cid)
        self.confirm_button.description = "Confirm"
        self.confirm_box.layout.display = "flex"
        self._say(question, notes=notes)

    def _drop_pending(self, *, gone: bool = False) -> None:
        """Withdraw the question awaiting Confirm, if any: any other action, or a new
        selection, replaces it, so a later Confirm cannot act on what is no longer shown.
        ``gone``: its checkpoint was deleted by something else (retention, another
        manager), which the status line says (not that the user cancelled it)."""
        pending, self._pending_action = self._pending_action, None
        self.confirm_box.layout.display = "none"
        if pending is None:
            return
        action, cid = pending
        if not gone:
            self._say(f"cancelled: the {action} of {cid}")
        elif action == "delete":
            self._say(f"{cid} was deleted {DELETED_BY} while its Delete awaited Confirm: "
                      "nothing left to delete")
        else:
            self._say(f"⚠ the rollback to {cid} is withdrawn: {cid} was deleted {DELETED_BY} "
                      "while it awaited Confirm: select another checkpoint to roll back to",
                      error=True)

    def _ask_rollback(self) -> None:
        self._check_open()  # (else the catalog's own refusal blamed CheckpointManager.close())
        with telling() as told:
            self._check_store()
            cid = self._resolve(self._one())
            restored, left_alone, orphaned = self._restorable(cid, self._namespace())
        next_save = _session.next_save_words(self.manager, cid).removeprefix("; ")
        self._ask("rollback", cid, f"Roll the kernel's tracked objects and variables back to "
                                   f"{cid}? It restores {', '.join(restored)}{left_alone}. "
                                   f"{next_save[0].upper()}{next_save[1:]}.",
                  [*_notes(told), *(f"⚠ {notice}" for notice in orphaned)])

    def _ask_delete(self) -> None:
        self._check_open()  # (else the catalog's own refusal blamed CheckpointManager.close())
        with telling() as told:
            self._check_store()
            cid = self._refuse_pinned(self._resolve(self._one()))
        self._ask("delete", cid, f"Delete checkpoint {cid}? Other checkpoints keep what they "
                                 "share with it.", _notes(told))

    def _confirm(self) -> None:
        """Do what the question awaiting Confirm asked. With none it does nothing, the
        status line as it was: the second click of a double-click arrives before the box
        is hidden (its "nothing awaits confirmation" replaced the first click's result)."""
        pending, self._pending_action = self._pending_action, None
        self.confirm_box.layout.display = "none"
        if pending is None:
            return
        action, cid = pending
        name = "Roll back" if action == "rollback" else "Delete"
        if self.selected != [cid]:  # (the views and the buttons act on the selection)
            raise ValueError(f"{cid} is no longer selected: nothing done; select it and "
                             f"press {name} again")
        self._guard(lambda: self.rollback(cid) if action == "rollback" else self.delete(cid),
                    f"{name} of {cid}")

    def rollback(self, which: str) -> str:
        """The same operation as ``%ckpt_rollback which``, on this store. Refused where the
        kernel holds nothing the checkpoint can restore (its objects are put back by the
        names they were saved under)."""
        self._check_open()
        _checked_name(which, "which")
        self._drop_pending()
        with telling() as told:
            self._check_store()
            namespace = self._namespace()
            cid = self._resolve(which)
            restored, left_alone, _ = self._restorable(cid, namespace)
            self._progress(0, 1)
            try:
                _session.rollback(cid, directory=self._directory(), namespace=namespace)
            finally:
                self._progress(1, 1)
            self.refresh()
        unread = _unread(told, cid)  # (each "name (why)", joined by ", ")
        restored = [n for n in restored if not unread.startswith(f"{n} (")
                    and f", {n} (" not in unread]
        self._say(f"rolled back to {cid}: restored {', '.join(restored)}{left_alone}"
                  f"{f'; {_session.LEFT_UNREAD}{unread}' if unread else ''}"
                  f"{_after_branch(told, cid)}",
                  notes=_notes(told, own=f"rolled back to {cid}"))
        self._rolled_back = cid, frozenset(self.table_frame["id"])
        self._counted_since = set()
        return cid

    def _namespace(self) -> dict[str, Any]:
        """Where Roll back restores to: the one given, else the IPython kernel's."""
        if self.namespace is not None:
            return self.namespace
        with contextlib.suppress(ImportError):
            from IPython import get_ipython

            shell = get_ipython()
            if shell is not None:
                return shell.user_ns
        raise StateMismatchError("no kernel namespace to roll back: outside IPython, pass "
                                 "explore(store, namespace=globals())")

    def _restorable(self, cid: str,
                    namespace: dict[str, Any]) -> tuple[list[str], str, list[str]]:
        """What a rollback to ``cid`` would restore, the part of a message that names
        what it would not (``_not_restored``), and what it would warn of (an optimizer that
        steps a model made anew), asked before the question (the rollback itself refuses
        one that restores nothing)."""
        plan = _session.rollback_plan(cid, directory=self._directory(), namespace=namespace)
        if not plan.restored:
            raise StateMismatchError(plan.refusal())
        types = self.manager._manifest(cid)["state"].get("types") if plan.not_restored \
            else None
        kinds = {_session._live_name(key): kind.rsplit(".", 1)[-1]
                 for key, kind in (types if isinstance(types, dict) else {}).items()
                 if isinstance(kind, str) and "." in kind}  # (not "imported": class unknown)
        return plan.restored, _not_restored(plan.not_restored, namespace, kinds), plan.orphaned

    def _display_name(self) -> str:
        """The store as its user would write it: a path relative to here, else the URL."""
        directory = self._directory()
        if directory == self.url:
            return html.escape(self.url)
        with contextlib.suppress(ValueError):
            relative = os.path.relpath(directory)
            if not relative.startswith(".."):
                return html.escape(relative)
        return html.escape(directory)

    def _directory(self) -> str:
        root = getattr(self.manager.store, "root", None)
        return str(root) if isinstance(root, Path) else self.url

    @contextlib.contextmanager
    def _saying_lock_waits(self) -> Iterator[None]:
        """While an action waits for the store's lock that another process holds (a long
        save or gc), say so in the status line, cleared once it is taken: the widget
        looked frozen."""
        def tell(waiting: str | None) -> None:
            if waiting is not None:
                self._say(f"{waiting}…")
            else:
                self.status.value = ""

        self.manager._on_lock_wait = tell
        try:
            yield
        finally:
            self.manager._on_lock_wait = None

    def pin(self, which: str) -> str:
        """Pin a checkpoint ("latest", "best", "-N", an id or a prefix), as the Pin button
        does: retention keeps it until it is unpinned. Returns its id; the table shows it
        pinned."""
        self._check_open()
        _checked_name(which, "which")
        self._drop_pending()
        with telling() as told:
            self._check_store()
            with self._saying_lock_waits():
                cid = self.manager.pin(self._resolve(which))
            self.refresh()
        self._say(f"pinned {cid}: retention will keep it", notes=_notes(told))
        return cid

    def unpin(self, which: str) -> str:
        """Unpin a checkpoint, as the Unpin button does: retention may delete it again.
        One that was not pinned is said so and left as it is. Returns its id."""
        self._check_open()
        _checked_name(which, "which")
        self._drop_pending()
        with telling() as told:
            self._check_store()
            cid = self._resolve(which)
            row = self.manager.catalog.get(cid)
            if row is not None and not row.pinned:
                self._say(f"{cid} was not pinned: nothing to unpin", notes=_notes(told))
                return cid
            with self._saying_lock_waits():
                self.manager.unpin(cid)
            self.refresh()
        self._say(f"unpinned {cid}", notes=_notes(told))
        return cid

    def delete(self, which: str) -> str:
        """Delete a checkpoint at once (the Delete button asks to confirm first; this call
        does not). A pinned one is refused (``CheckpointInUseError``): unpin it first.
        Where the kernel's state came from it, the status line names the ancestor the DAG
        marks instead. Returns its id."""
        self._check_open()
        _checked_name(which, "which")
        self._drop_pending()
        with telling() as told:
            self._check_store()
            cid = self._refuse_pinned(self._resolve(which))
            with self._saying_lock_waits():
                self.manager.delete(cid)
            self.selected = [i for i in self.selected if i != cid]
            self.refresh()
        said = f"deleted {cid}"
        if self.dag.current_deleted == cid:  # (the kernel's state came from it)
            heir = self.dag.current
            said += "; the kernel's state came from it: " + (
                f"the DAG marks the kernel (⇢) at {heir}, its nearest kept ancestor" if heir
                else "no ancestor of it is kept")
        self._say(said, notes=_notes(told))
        return cid

    def _refuse_pinned(self, cid: str) -> str:
        """Refuse to delete a pinned checkpoint before asking (the manager's refusal
        names ``force=True``, which no button passes)."""
        row = self.manager.catalog.get(cid)
        if row is not None and row.pinned:
            raise CheckpointInUseError(f"{cid} is pinned: unpin it first (Unpin), then Delete")
        return cid

    def export(self, which: str, path: str | os.PathLike[str], *,
               only: str | None = None) -> Path:
        """Write a checkpoint as .pt or .safetensors, like ``CheckpointManager.export``
        (``only="model"``: that object's state alone, for ``model.load_state_dict``);
        "~" in ``path`` is the home directory, as in a shell."""
        self._check_open()
        _checked_name(which, "which")
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path takes a file path ending in .pt or .safetensors, not "
                            f"{type(path).__name__} {path!r}")
        self._drop_pending()
        with telling() as told:
            self._check_store()
            if not path:
                raise FileFormatError("type a file name ending in .pt or .safetensors first")
            from ._interop import check_export_path, write_file

            target = os.path.expanduser(path)
            check_export_path(target)  # a wrong suffix fails before any decoding
            cid = self._resolve(which)
            self._progress(0, 1)
            try:  # CheckpointManager.export, with the decode's progress shown
                written = write_file(self.manager._read_for_export(cid, progress=self._progress),
                                     target, only=only)
            finally:
                self._progress(1, 1)
        self._say(f"exported {cid} to {os.path.abspath(written)}", notes=_notes(told))
        return written

    def _progress(self, done: int, total: int) -> None:
        self.progress.max = max(total, 1)
        self.progress.value = done
        self.progress.layout.display = "none" if done >= total else "flex"

    # -- live ----------------------------------------------------------------------------------
    def _on_session_event(self, event: str, checkpoint_id: str, url: str) -> None:
        # Called on the session's writer thread: only wake the follower, so a burst of
        # saves costs one redraw and the writer never waits for a plot.
        if url == _session.store_url(self.url) or (
                self._manager is None and self._follows_session):  # (sessions' keys)
            self._wake.set()

    def _catalog_signature(self) -> tuple[Any, ...]:
        """What another process's save, delete, pin or note changes: a local store's
        catalog files; an object store's objects, each as its listing gives it (on S3 its
        size, ETag and time: a label rewritten, a pin undone, shows). An object store's
        costs one LIST of its root (a request per 1000 objects: packs, manifests and
        labels together); a store of another kind, a listing of manifests and labels and
        a read of each label."""
        store = self.manager.store
        root = getattr(store, "root", None)
        if isinstance(root, Path):
            stats = []
            for name in ("catalog.sqlite", "catalog.sqlite-wal"):
                with contextlib.suppress(OSError):
                    st = (root / name).stat()
                    stats.append((name, st.st_mtime_ns, st.st_size))
            return tuple(stats)
        if isinstance(store, FsspecStore):
            try:
                found = store.fs.find(store.root, detail=True)
            except Exception as exc:  # noqa: BLE001 - any backend's own (botocore's too)
                raise StoreError(f"listing {self.url} failed: {exc}") from exc
            return tuple(sorted((name, repr(sorted(entry.items())))
                                for name, entry in found.items()))
        labels = sorted(store.list("labels"))  # (a MemoryStore: in this process, no cost)
        return tuple(sorted(store.list("manifests"))) + \
            tuple((key, store.get(key)) for key in labels)

    def _follow(self, seconds: float) -> None:
        """Refresh after this process's saves (woken) or when what other processes change
        moved (checked every ``seconds``; 0 = only this process's events), once the last
        refresh's gap is over (``REDRAW_SECONDS``): what comes meanwhile is shown by one
        refresh at its end. A store that cannot be read, here or for a click, is said in
        the status line, and tried again each round: the first read that works refreshes,
        and clears the message and the click's refusal of the buttons."""
        behind = False  # (the last round failed)
        due = 0.0  # (time.monotonic() from which the next refresh may start)
        while not self._stop.is_set():
            woken = self._wake.wait(seconds if seconds > 0 else None)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if self._manager is None:  # (explored with wait=True: is the store there?)
                    if not self._open_when_there():
                        continue
                    woken = True
                retry = behind or self._unmade_selection is not None  # (a click's read failed)
                if not (woken or retry) and self._catalog_signature() == self._signature:
                    continue
                if due > time.monotonic():
                    if self._stop.wait(due - time.monotonic()):
                        return
                    self._wake.clear()  # (the saves of the gap: this refresh reads them)
                self._signature = self._catalog_signature()
                started = time.monotonic()
                behind = not self.refresh()
                spent = time.monotonic() - started
                least, most = REDRAW_SECONDS
                due = started + min(max(least, spent * REDRAW_GAP_PER_COST), most)
            except Exception as exc:  # noqa: BLE001 - the follower goes on: said, next round
                with self._lock:
                    self._say_stale(exc)
                behind = True

    def _hook_cells(self) -> Callable[[], None]:
        """Say when a cell has run in this kernel for ``BUSY_SECONDS`` (``busy_note``),
        till it ends; returns what undoes the hooks (nothing to undo outside IPython)."""
        with contextlib.suppress(ImportError):
            from IPython import get_ipython

            shell = get_ipython()
            if shell is not None and hasattr(shell, "events"):
                shell.events.register("pre_run_cell", self._cell_started)
                shell.events.register("post_run_cell", self._cell_ended)

                def unhook() -> None:
                    for event, hook in (("pre_run_cell", self._cell_started),
                                        ("post_run_cell", self._cell_ended)):
                        with contextlib.suppress(ValueError):
                            shell.events.unregister(event, hook)
                return unhook
        return lambda: None

    def _cell_started(self, *_: Any) -> None:
        self._cell_ended()
        if not self._closed:
            self._busy_timer = threading.Timer(BUSY_SECONDS, self._say_busy)
            self._busy_timer.daemon = True
            self._busy_timer.start()

    def _say_busy(self) -> None:
        if not self._closed:
            self.busy_note.layout.display = None

    def _cell_ended(self, *_: Any) -> None:
        timer, self._busy_timer = self._busy_timer, None
        if timer is not None:
            timer.cancel()
        if self.busy_note.layout.display != "none":
            self.busy_note.layout.display = "none"

    def _check_open(self) -> None:
        """Refuse an action of a closed explorer: its catalog is closed, and the
        catalog's own refusal blamed CheckpointManager.close() (a refresh said it would
        follow the store again once it could)."""
        if self._closed:
            raise StoreError(CLOSED)

    def __repr__(self) -> str:
        """A closed explorer's is one line (shown again, it printed every widget's
        state: ipywidgets shows a closed widget as its text)."""
        if self._closed:
            return f"<ckpt_nb explorer of {self.url}, closed: open a new one with " \
                "ckpt_nb.explore(...)>"
        return super().__repr__()

    def close(self) -> None:
        """Stop following the store and close the widgets: each of them, since
        ipywidgets' ``close`` closes the one box alone, and the registry of open widgets
        kept the rest, and through their callbacks every closed explorer, for the rest of
        the session. Its actions then refuse (a StoreError: open a new one)."""
        self._closed = True
        if not getattr(self, "_built", False):  # (refused as it opened: a wrong argument, a
            return  # store not there; closed by its __del__, it printed an AttributeError)
        self._stop.set()
        self._wake.set()
        self._unsubscribe()
        self._unhook()
        self._cell_ended()
        if self._owns_manager and self._manager is not None:
            with contextlib.suppress(Exception):
                self._manager.close()
        for widget in _widgets_within(self):
            widget.close()
        super().close()


def _show_png(image: w.Image, png: bytes) -> None:
    """Show a plot's PNG at most as wide as its own pixels (``max_width``; narrower where
    the output is): a box's flex stretched it to the output's width, a 672 px plot blurred
    to 2220 px in a wide window, pushing what is below it out of sight."""
    image.value = png
    width = int.from_bytes(png[16:20], "big")  # (the IHDR chunk's width, first in a PNG)
    image.layout.max_width = f"{width}px"
    image.layout.display = None


def _shown_path(location: str) -> str:
    """A store as its user would write it: a path relative to here, else as given."""
    if "://" in location:
        return location
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(os.path.expanduser(location))
        if not relative.startswith(".."):
            return relative
    return location


def _widgets_within(root: w.Widget) -> list[w.Widget]:
    """The widgets under ``root``: those its traits refer to (children, a tab's pages,
    layouts, styles), those held in its attributes (a pane not shown now), and theirs."""
    found: dict[int, w.Widget] = {}
    stack: list[Any] = [getattr(root, name, None) for name in root.keys]
    stack.extend(vars(root).values())
    while stack:
        value = stack.pop()
        if isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, w.Widget) and value is not root and id(value) not in found:
            found[id(value)] = value
            stack.extend(getattr(value, name, None) for name in value.keys)
    return list(found.values())


# The explorers each notebook cell opened, with the run (IPython's ExecutionResult) that
# opened them: a cell run again replaces its output, and the explorers of its earlier runs,
# out of sight, went on polling the store with their catalogs open until the kernel stopped.
_opened_by_cell: dict[str, tuple[Any, list[Explorer]]] = {}


def _running_cell() -> tuple[str, Any] | None:
    """The id of the notebook cell running now (JupyterLab and Notebook 7 send one with
    each run) and the run; None outside such a cell."""
    with contextlib.suppress(ImportError):
        from IPython import get_ipython

        run = getattr(getattr(get_ipython(), "displayhook", None), "exec_result", None)
        cell_id = getattr(getattr(run, "info", None), "cell_id", None)
        if isinstance(cell_id, str) and cell_id:
            return cell_id, run
    return None


def explore(store: str | os.PathLike[str] | CheckpointManager, *,
            namespace: dict[str, Any] | None = None, poll_seconds: float = 1.0,
            wait: bool = False) -> Explorer:
    """The explorer for a store: a directory, URL or CheckpointManager. ``namespace``
    is what Roll back restores into (default: the IPython kernel's); ``poll_seconds``
    is how often the catalog is checked for other writers (0: only this process's saves).
    A store that is not there is refused (a typo), unless ``wait=True``: the explorer then
    opens saying there are no checkpoints yet, and shows the store once it is made (the
    first ``%%ckpt_auto`` cell's save, or a CheckpointManager's).
    Run again in the same notebook cell, it closes the explorers the cell's earlier runs
    opened (those of this run stay)."""
    running = _running_cell()
    if running is None:
        return Explorer(store, namespace=namespace, poll_seconds=poll_seconds, wait=wait)
    cell, run = running
    opened_in, explorers = _opened_by_cell.pop(cell, (run, []))
    if opened_in is not run:
        for earlier in explorers:
            earlier.close()
        explorers = []
    _opened_by_cell[cell] = (run, explorers)
    ui = Explorer(store, namespace=namespace, poll_seconds=poll_seconds, wait=wait)
    explorers.append(ui)
    return ui
