"""Plots of a checkpoint store, as matplotlib Figures.

Each function takes a store (a directory, a URL or a CheckpointManager) and
returns a ``matplotlib.figure.Figure`` built without pyplot, so nothing leaks
into a notebook's global figure state; the explorer's widgets render these same
figures. ``dag_layout`` is the pure part of the DAG drawing, shared with the
explorer's clickable view.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import matplotlib
from matplotlib.figure import Figure as _MatplotlibFigure

from . import _session
from ._errors import CheckpointNotFoundError, MetricNotFoundError
from ._manager import CheckpointManager
from ._metric_names import metric_mode_from_name
from ._not_state import NotState
from ._store import store_exists, why_no_store
from ._units import natural_order

StoreLike = str | os.PathLike[str] | CheckpointManager
P = ParamSpec("P")
R = TypeVar("R")

COLUMNS = ("id", "parent", "branch", "created", "step", "epoch", "batch_idx", "strategy",
           "stored_bytes", "logical_bytes", "pinned", "best", "head", "note")
LANE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf")
# Past this many branches a legend of them all would cover the lines: the newest
# are named, and one entry counts the rest.
LEGEND_BRANCHES = 8
# (Each of these is said by its number in its function's docstring: change both.)
# Past this many tensors plot_diff's names would overlap (its height is capped): the most
# changed are drawn, and the axis label counts the others.
DIFF_BARS = 45
# plot_dag's widest figure (inches; its height is capped at 14): past the branches that
# fit at their width, the lanes narrow and go unnamed (their names would overlap).
DAG_WIDTH = 16.0
DAG_LANES_NAMED = 12
# plot_compare's most checkpoints: more would make a figure thousands of pixels wide (300
# took 4 s to draw); the first this many are drawn, and its title counts the others.
COMPARE_MOST = 40
# A changed tensor whose bar is shorter than this part of the longest gets its value
# written beside it.
SMALLEST_BAR = 0.01
# plot_compare's bars, one shade of slate grey per checkpoint between these, every other
# one hatched; its marks where there is no bar ("n/a", "inf") in dark text.
BAR_DARK, BAR_LIGHT = "#3b4a5a", "#b4bfcc"
TEXT_DARK = "0.15"
STRATEGY_MARKERS = {"full": ("o", True), "incremental": ("o", False),
                    "differential": ("D", False)}


def _literal_text(plot: Callable[P, R]) -> Callable[P, R]:
    """Draw names as they are: matplotlib reads "$...$" in a text as math (a metric
    "cost_$_per_$_1k" failed to draw, "$x$" came out in italics)."""
    @functools.wraps(plot)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> R:
        with matplotlib.rc_context({"text.parse_math": False}):
            return plot(*args, **kwargs)

    return drawn


class Figure(_MatplotlibFigure, NotState):
    """A matplotlib Figure that shows itself in a notebook, with or without pyplot's
    inline backend (a Figure made without pyplot has no display of its own)."""

    def _repr_png_(self) -> bytes:
        return to_png(self)


@contextlib.contextmanager
def opened(store: StoreLike) -> Iterator[CheckpointManager]:
    """The store's manager: the one given, or one opened (and closed) for the call."""
    if isinstance(store, CheckpointManager):
        yield store
        return
    text = os.fspath(store)
    if not store_exists(text):
        raise CheckpointNotFoundError(f"no checkpoint store at {text}" + (
            why_no_store(text) or ": give the directory a CheckpointManager or %ckpt_auto "
            "--dir wrote to"))
    manager = CheckpointManager(text)
    try:
        yield manager
    finally:
        manager.close()


def id_list(ids: str | Iterable[str]) -> list[str]:
    """Checkpoint ids as a list: a single id (or alias, or prefix) given as a string is one
    id, not its characters (each of which may be a prefix of an id)."""
    return [ids] if isinstance(ids, str) else list(ids)


def metric_columns(table: Any) -> list[str]:
    """The metric columns of ``CheckpointManager.list()``: those after the fixed ones."""
    return [c for c in table.columns if c not in COLUMNS]


def _check_metrics(asked: Iterable[str], names: Sequence[str]) -> None:
    """Refuse metrics the store has not logged, naming those it has (in natural order, as
    ``resolve`` and the CLI do, whatever the order of a table given)."""
    unknown = [m for m in asked if m not in names]
    if unknown:
        known = ", ".join(map(repr, sorted(names, key=natural_order)))
        logged = f"its metrics are {known}" if names else \
            "it has no metrics logged yet (ckpt_nb.log or save(metrics=...))"
        raise MetricNotFoundError(f"no metric {', '.join(map(repr, unknown))} in this store: "
                                  f"{logged}")


@dataclass(frozen=True)
class DagNode(NotState):
    """A checkpoint placed on the graph: ``lane`` is its branch's column, ``row`` its
    place in commit order (0 = oldest)."""

    id: str
    parent: str | None
    branch: str
    lane: int
    row: int
    strategy: str
    pinned: bool
    best: bool
    step: int | None


def metric_mode(name: str, metric: str | None = None, mode: str = "min") -> str | None:
    """Whether lower ("min") or higher ("max") is better for a metric: the manager's
    ``mode`` for its own ``metric`` (given, or the store's recorded one), else what the
    name says (a loss: min, an accuracy: max), else None: a guess (bleu taken for a
    loss) would mark the worst checkpoint as the best."""
    if name == metric:
        return mode
    return metric_mode_from_name(name)


def best_by_metric(table: Any, metric: str | None = None, mode: str = "min") -> dict[str, str]:
    """The best checkpoint's id for each metric column of ``CheckpointManager.list()``
    (oldest first) whose better direction is known (``metric_mode``); the others have
    none. Of equal values the newest, as ``restore("best")`` takes it."""
    best = {}
    for name in metric_columns(table):
        better = metric_mode(name, metric, mode)
        values = table[name].astype("float64")[::-1]  # (newest first: idxmin takes the first)
        values = values.where(values.abs() < math.inf)  # (±inf, a diverged run, is no best)
        if better is not None and values.notna().any():
            at = values.idxmax() if better == "max" else values.idxmin()
            best[name] = str(table.loc[at, "id"])
    return best


def ranked_metric(names: Sequence[str], metric: str | None = None) -> str | None:
    """The metric "best" ranks by, and the one shown first: the manager's ``metric``, else
    the first loss-like one, else the first (which marks no best where its name does not
    say which way is better: ``best_by_metric``)."""
    if metric in names:
        return metric
    return next((n for n in names if "loss" in n.lower()), names[0] if names else None)


def dag_layout(table: Any, metric: str | None = None, mode: str = "min") -> list[DagNode]:
    """Place checkpoints like ``git log --graph``: a lane per branch (in the order
    branches began), a row per checkpoint (oldest first). ``best`` is the catalog's
    (a manager opened with ``metric=``), else the best by ``metric`` or the first
    loss-like metric column."""
    best_ids = set(table.loc[table["best"].astype(bool), "id"]) if len(table) else set()
    if not best_ids:
        ranked = ranked_metric(metric_columns(table), metric)
        chosen = best_by_metric(table, metric, mode).get(ranked) if ranked else None
        best_ids = {chosen} if chosen else set()
    lanes: dict[str, int] = {}
    nodes = []
    for row, record in enumerate(table.to_dict("records")):
        lane = lanes.setdefault(record["branch"], len(lanes))
        parent = record["parent"]
        step = record["step"]
        nodes.append(DagNode(
            id=record["id"], parent=parent if isinstance(parent, str) else None,
            branch=record["branch"], lane=lane, row=row, strategy=record["strategy"],
            pinned=bool(record["pinned"]), best=record["id"] in best_ids,
            step=None if step is None or _missing(step) else int(step)))
    return nodes


def kernel_mark(manager: CheckpointManager, current: str | None,
                ids: AbstractSet[str]) -> tuple[str | None, str | None]:
    """Where a DAG marks the kernel, and the checkpoint its state came from where that
    was deleted since (the mark goes then to its nearest kept ancestor, which the
    kernel's next save descends from; None where none is kept). ``ids``: those drawn."""
    if current is None or current in ids or not manager.catalog.was_deleted(current):
        return current, None
    return manager.catalog.heir_of(current), current


def _missing(value: Any) -> bool:
    try:
        return bool(value != value)  # NaN and pandas.NA
    except TypeError:
        return True


def _finite(values: Any) -> Any:
    """Which values of a Series or DataFrame are finite numbers (not NaN, NA or ±inf)."""
    import numpy as np

    return np.isfinite(values.astype("float64"))


def _lane_color(lane: int) -> str:
    return LANE_COLORS[lane % len(LANE_COLORS)]


def _empty(fig: Figure, message: str) -> Figure:
    """``fig`` saying ``message`` in its middle, in lines that fit its width (one line, a
    long metric's name in it ran off both edges)."""
    ax = fig.add_subplot()
    width = max(20, int(fig.get_figwidth() * 72 / 7))  # (characters of ~7 pt at 10 pt)
    message = "\n".join(_short(line, width, most=4 * width) for line in message.split("\n"))
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_axis_off()
    return fig


def _x_axis(table: Any, plotted: Any) -> tuple[Any, str]:
    """Each checkpoint's x and the axis label. Step where every ``plotted`` checkpoint has
    one, else epoch where every one has that, else whichever more have (the others are
    left out, and the label counts them); save order where none has either. A missing
    step is never drawn at a made-up one."""
    import pandas as pd

    have = {c: int(table.loc[plotted, c].notna().sum()) for c in ("step", "epoch")}
    for column in ("step", "epoch"):
        if have[column] == len(plotted):
            return table[column].astype("float64"), column
    if not any(have.values()):
        return pd.Series(range(len(table)), index=table.index, dtype="float64"), \
            "checkpoint, in save order (none has a step or epoch)"
    column = max(("step", "epoch"), key=lambda c: have[c])  # (step on a tie)
    left_out = len(plotted) - have[column]
    return table[column].astype("float64"), \
        f"{column} ({left_out} checkpoint{'s' * (left_out > 1)} without one not shown)"


@_literal_text
def plot_metrics(store: StoreLike, metric: str | None = None, *,
                 selected: str | Iterable[str] = (), table: Any = None) -> Figure:
    """A metric against step (or epoch, where the checkpoints have no step): one line
    per branch, a marker per checkpoint, the ``selected`` checkpoints ringed. A metric
    the store has not logged is refused, not replaced by another; so is a checkpoint
    (``selected`` takes ids, prefixes and aliases, as ``CheckpointManager.resolve``)."""
    asked = metric
    if table is None:
        with opened(store) as manager:
            table = manager.list()
            metric = metric or manager.metric
            selected = [manager.resolve(i) for i in id_list(selected)]
    import pandas as pd

    names = metric_columns(table)
    if asked is not None:
        _check_metrics([asked], names)
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    if not names:
        return _empty(fig, "no metrics logged yet (ckpt_nb.log or save(metrics=...))")
    metric = ranked_metric(names, metric)
    if not _finite(table[metric]).any():  # (NaN or ±inf: nothing to draw a line through)
        return _empty(fig, f"no data: no checkpoint logged {metric} as a finite number")
    ax = fig.add_subplot()
    lanes = {n.branch: n.lane for n in dag_layout(table)}
    drawn = table[_finite(table[metric])]
    x_of, x_label = _x_axis(table, drawn.index)
    position = {cid: i for i, cid in enumerate(table["id"])}
    newest = list(dict.fromkeys(reversed(drawn["branch"].tolist())))[:LEGEND_BRANCHES]
    for branch, part in table.groupby("branch", sort=False):
        fork = part["parent"].iloc[0]  # a branch's line starts at the checkpoint it left
        if isinstance(fork, str) and fork in position:
            part = pd.concat([table.iloc[[position[fork]]], part])
        values = part[metric].astype("float64")
        keep = _finite(values) & x_of[part.index].notna().to_numpy()
        if keep.any():
            ax.plot(x_of[part.index][keep], values[keep], marker="o", markersize=4,
                    color=_lane_color(lanes[branch]),
                    label=branch if branch in newest else "_nolegend_")
    unnamed = drawn["branch"].nunique() - len(newest)
    if unnamed > 0:
        ax.plot([], [], color="none", label=f"+{unnamed} older branches")
    chosen = drawn[drawn["id"].isin(id_list(selected)) & x_of[drawn.index].notna()]
    if len(chosen):
        ax.scatter(x_of[chosen.index], chosen[metric].astype("float64"), s=140,
                   facecolors="none", edgecolors="black", linewidths=1.8, zorder=5,
                   label="selected")
    infinite = int((table[metric].astype("float64").abs() == math.inf).sum())
    if infinite:  # (a diverged run's: no point to draw, but not nothing logged either)
        x_label += f"\n{infinite} point{'s' * (infinite > 1)} at ±inf not shown"
    ax.set_xlabel(x_label)
    ax.set_ylabel(_short(metric))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return fig


@_literal_text
def plot_dag(store: StoreLike, *, current: str | None = None,
             selected: str | Iterable[str] = (),
             metric: str | None = None, mode: str = "min", table: Any = None) -> Figure:
    """The checkpoint graph, as the explorer's DAG draws it: branches as lanes, parent edges
    (a fork leaves its parent's lane just below the parent), strategy as marker (full ●,
    incremental ○, differential ◇), each checkpoint's label in a column right of the lanes
    (pinned ★ before its id), best ringed in gold, the
    kernel's position (``current``, by default this process's) arrowed, or marked
    ``kernel ⇢`` on its nearest kept ancestor where that checkpoint was deleted since, as
    the explorer marks it. ``metric`` and ``mode`` say what "best" ranks by (default:
    the store's loss-like metric). ``current`` and ``selected`` take ids, prefixes and
    aliases, as ``CheckpointManager.resolve``; one it does not know is refused. Past 12
    branches the lanes narrow to fit a figure 16 inches wide and go unnamed (their names
    would overlap)."""
    if table is None:
        with opened(store) as manager:
            table = manager.list()
            metric, mode = metric or manager.metric, manager.mode
            if current is None:
                current = _session.kernel_position(manager)
            elif not manager.catalog.was_deleted(current):  # (deleted: marked at its heir)
                current = manager.resolve(current)
            selected = [manager.resolve(i) for i in id_list(selected)]
    gone = None
    if current is not None and current not in set(table["id"]):
        with opened(store) as manager:  # (its catalog knows what was deleted, and the heir)
            current, gone = kernel_mark(manager, current, set(table["id"]))
    nodes = dag_layout(table, metric, mode)
    lanes = max((n.lane for n in nodes), default=0) + 1
    fig = Figure(figsize=(min(DAG_WIDTH, 2.2 + 1.1 * lanes),
                          min(14.0, 1.0 + 0.32 * max(len(nodes), 3))), layout="constrained")
    if not nodes:
        return _empty(fig, "no checkpoints yet")
    ax = fig.add_subplot()
    where = {n.id: n for n in nodes}
    # The farthest lane's fork first: forks from one parent share the row gap below it, and
    # each nearer one lies over its start (the last drawn covered the others').
    edges = [(where[node.parent], node) for node in nodes if node.parent in where]
    for parent, node in sorted(edges, key=lambda edge: -abs(edge[1].lane - edge[0].lane)):
        ax.plot(*_edge(parent, node), color=_lane_color(node.lane), linewidth=1.6, zorder=1)
    chosen = set(id_list(selected))
    labels = len(nodes) <= 80
    groups: dict[tuple[str, int], list[DagNode]] = {}
    for node in nodes:  # one scatter per strategy and lane: hundreds of nodes stay fast
        groups.setdefault((node.strategy, node.lane), []).append(node)
    for (strategy, lane), members in groups.items():
        marker, filled = STRATEGY_MARKERS.get(strategy, ("s", True))
        color = _lane_color(lane)
        ax.scatter([n.lane for n in members], [n.row for n in members], s=70, marker=marker,
                   zorder=3, linewidths=1.6, facecolors=color if filled else "white",
                   edgecolors=color, gid=f"node:{strategy}")
    rings = (("best", [n for n in nodes if n.best], 200, "o", "gold", 2.2),
             ("selected", [n for n in nodes if n.id in chosen], 260, "s", "black", 1.4))
    for gid, members, size, marker, color, width in rings:
        if members:
            ax.scatter([n.lane for n in members], [n.row for n in members], s=size,
                       marker=marker, facecolors="none", edgecolors=color, linewidths=width,
                       zorder=2, gid=gid)
    pinned = [n for n in nodes if n.pinned]
    if labels:  # in a column right of the lanes, as the explorer's (no edge crosses them)
        for node in nodes:
            step = "" if node.step is None else f"  step {node.step}"
            ax.annotate(f"{'★ ' * node.pinned}{node.id}{step}", (lanes - 1, node.row),
                        xytext=(10, -3), textcoords="offset points", fontsize=7,
                        family="monospace")
    elif pinned:  # (no label to carry it)
        ax.scatter([n.lane + 0.18 for n in pinned], [n.row + 0.25 for n in pinned], s=60,
                   marker="*", color="goldenrod", zorder=4, gid="pinned")
    if current in where:
        node = where[current]
        if gone is None:
            ax.annotate("kernel", (node.lane, node.row), xytext=(-42, 0),
                        textcoords="offset points", fontsize=8, color="crimson", va="center",
                        arrowprops={"arrowstyle": "->", "color": "crimson"})
        else:
            ax.annotate("kernel ⇢", (node.lane, node.row), xytext=(-9, 0),
                        textcoords="offset points", fontsize=8, color="crimson", ha="right",
                        va="center")
    if gone is not None:  # (what the explorer's tooltip and note say)
        ax.set_xlabel(f"kernel ⇢: the kernel's state came from {gone},\ndeleted since; " +
                      (f"{current} is its nearest\nkept ancestor" if current in where else
                       "no ancestor\nof it is kept"), fontsize=7, color="crimson", loc="left")
    ax.set_xlim(-0.8, lanes - 0.2 + (1.6 if labels else 0.4))
    ax.set_ylim(len(nodes) - 0.4, -0.6)  # newest at the bottom, like a log read downwards
    if lanes <= DAG_LANES_NAMED:
        ax.set_xticks(range(lanes), [_branch_of_lane(nodes, i) for i in range(lanes)],
                      fontsize=8)
    else:
        ax.set_xticks(range(lanes), [])
        ax.set_title(f"{lanes} branches, too many to name here (list() gives each "
                     "checkpoint's)", fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks([])
    for side in ("right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    return fig


def _edge(parent: DagNode, node: DagNode) -> tuple[list[float], list[float]]:
    """A parent edge's line (lanes, rows), as the explorer's DAG draws it: a fork leaves
    its parent's lane in the row gap below the parent, as ``git log --graph`` draws it,
    crossing the lanes between at mid-gap, and runs down its own lane to the child (a
    straight diagonal crossed the labels and nodes on its way), its corners rounded."""
    (x1, y1), (x2, y2) = (parent.lane, parent.row), (node.lane, node.row)
    if x1 == x2:
        return [x1, x2], [y1, y2]
    down, side = math.copysign(1, y2 - y1), math.copysign(1, x2 - x1)
    ym, rx, ry = y1 + down / 2, 0.15 * side, 0.3 * down  # (corners: a lane is the wider)
    xs, ys = [float(x1)], [float(y1)]
    for start, bend, end in (((x1, ym - ry), (x1, ym), (x1 + rx, ym)),
                             ((x2 - rx, ym), (x2, ym), (x2, ym + ry))):
        for k in range(9):  # a quadratic Bézier corner
            t = k / 8
            xs.append((1 - t) ** 2 * start[0] + 2 * (1 - t) * t * bend[0] + t ** 2 * end[0])
            ys.append((1 - t) ** 2 * start[1] + 2 * (1 - t) * t * bend[1] + t ** 2 * end[1])
    return xs + [float(x2)], ys + [float(y2)]


def _branch_of_lane(nodes: Sequence[DagNode], lane: int) -> str:
    return next(n.branch for n in nodes if n.lane == lane)


@_literal_text
def plot_diff(store: StoreLike, a: str, b: str, *, table: Any = None) -> Figure:
    """Per-tensor relative change ``|b - a| / |a|`` as bars; byte-identical tensors
    (shared chunks) are marked. A change from all zeros (infinite) is the longest bar,
    written "inf (from zero)". Past 45 tensors the 45 most changed are drawn (the axis
    label counts the others)."""
    if table is None:
        with opened(store) as manager:
            table = manager.diff(a, b)
    total = len(table)
    if total > DIFF_BARS:  # (in the diff's order; an added or removed tensor ranks first)
        rel = table["rel_change"].astype("float64")
        rank = rel.fillna(math.inf).where(table["status"] != "identical", -1.0)
        # (changed with no norm, a generator's state: last of the changes)
        rank = rank.where((table["status"] != "changed") | rel.notna(), 0.0)
        table = table.loc[sorted(rank.nlargest(DIFF_BARS, keep="first").index)]
        table = table.reset_index(drop=True)
    fig = Figure(figsize=(7, min(12.0, 1.2 + 0.24 * max(len(table), 3))), layout="constrained")
    if not len(table):
        return _empty(fig, "no tensors")
    ax = fig.add_subplot()
    rel = table["rel_change"].astype("float64")
    finite = rel.where(rel.apply(math.isfinite), other=float("nan"))
    top = float(finite.max()) if finite.notna().any() else 1.0
    values = rel.fillna(0.0).clip(upper=top * 1.05 if top > 0 else 1.0)
    identical = table["status"] == "identical"
    colors = ["#9e9e9e" if same else "#1f77b4" for same in identical]
    rows = range(len(table))
    ax.barh(rows, values, color=colors)
    ax.set_yticks(rows, [str(t) for t in table["tensor"]], fontsize=7, family="monospace")
    ax.invert_yaxis()
    # A change too small for its bar to show (an RNG state's few bytes) is written out:
    # no bar and no word read as a row missing.
    visible = (top if top > 0 else 1.0) * SMALLEST_BAR
    for row, (status, value, change, l2) in enumerate(zip(table["status"], values, rel,
                                                           table["l2"])):
        if status == "changed" and math.isinf(change):  # (its bar is cut at the longest)
            ax.annotate("inf (from zero)" if math.isfinite(l2) else "inf", (value, row),
                        xytext=(-4, 0), textcoords="offset points", ha="right", va="center",
                        fontsize=7, color="white")
            continue
        if status == "changed" and value >= visible:
            continue
        text = status if status != "changed" else \
            f"{change:.2g}" if math.isfinite(change) else "changed"
        ax.annotate(text, (value, row), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=7, color="0.35")
    left_out = total - len(table)
    ax.set_xlabel(f"relative L2 change, {a} → {b}" + (
        f"\nthe {len(table)} most changed of {total} tensors (the other {left_out}: "
        "CheckpointManager.diff)" if left_out else ""))
    ax.grid(axis="x", alpha=0.3)
    return fig


def _bar_colors(count: int) -> list[Any]:
    """A shade of one slate grey per checkpoint, dark to light: the hues of matplotlib's
    cycle read as the branches of the line plot above (C0 is main's blue, C1 branch-1's
    orange), and a light one of its colormap left white text unreadable."""
    from matplotlib.colors import LinearSegmentedColormap

    ramp = LinearSegmentedColormap.from_list("slate", [BAR_DARK, BAR_LIGHT])
    return [ramp(k / max(count - 1, 1)) for k in range(count)]


def _short(name: str, width: int = 28, most: int = 56) -> str:
    """A long metric name as a title of lines ``width`` wide at most, broken after a "/",
    "_", ".", "-" or space where it has one (not mid-word, nor mid-number: the "." of
    "0.99" is no break), its middle elided past ``most``."""
    if len(name) > most:
        name = f"{name[:most // 2 - 1]}…{name[-(most // 2):]}"
    lines = [""]
    for word in re.findall(r"(?:[^/_.\- ]|(?<=\d)\.(?=\d))*[/_.\- ]*", name):
        if lines[-1] and len(lines[-1]) + len(word) > width:
            lines.append("")
        lines[-1] += word
        while len(lines[-1]) > width:  # (a word longer than a line is cut)
            lines[-1:] = [lines[-1][:width], lines[-1][width:]]
    return "\n".join(line for line in lines if line)


@_literal_text
def plot_compare(store: StoreLike, ids: str | Iterable[str],
                 metrics: Sequence[str] | None = None, *, table: Any = None) -> Figure:
    """The metrics of 2+ checkpoints side by side: a panel per metric, each with its own
    y scale (a loss of 0.3 beside a perplexity of 300 would be a flat line), a bar per
    checkpoint named under it (no legend to outgrow the figure), in shades of one grey (no
    hue of plot_metrics' branches). A value missing or
    infinite has no bar (a 0.0 bar would read as a real 0) but a mark: "n/a", "inf". Of
    more than 40 checkpoints the first 40 are drawn (the title counts the rest)."""
    ids = id_list(ids)
    if table is None:
        with opened(store) as manager:
            table = manager.list()
            ids = [manager.resolve(i) for i in ids]
    ids = list(dict.fromkeys(ids))  # (a checkpoint chosen twice is one bar)
    left_out = len(ids) - COMPARE_MOST
    ids = ids[:COMPARE_MOST]
    if metrics:
        _check_metrics(metrics, metric_columns(table))
    names = list(dict.fromkeys(metrics)) if metrics else metric_columns(table)
    chosen = table.set_index("id").reindex(ids)[names].astype("float64")
    if not names or not ids:
        return _empty(Figure(figsize=(7, 3.4), layout="constrained"),
                      "select checkpoints that logged metrics to compare them")
    if not _finite(chosen).to_numpy().any():
        return _empty(Figure(figsize=(7, 3.4), layout="constrained"),
                      "no data: the selected checkpoints logged none of these metrics")
    panel = max(2.4, 0.6 + 0.22 * len(ids))  # (inches: room for each bar's id below it)
    columns = max(1, min(len(names), int(12 // panel)))
    rows = math.ceil(len(names) / columns)
    fig = Figure(figsize=(max(5.0, columns * panel), rows * 2.8),
                 layout="constrained")
    if left_out > 0:
        fig.suptitle(f"the first {COMPARE_MOST} checkpoints asked for: the other {left_out} "
                     "are not drawn", fontsize=9)
    colors = _bar_colors(len(ids))
    for k, name in enumerate(names):
        ax = fig.add_subplot(rows, columns, k + 1)
        values = chosen[name].tolist()
        bars = [(x, v, c) for x, (v, c) in enumerate(zip(values, colors)) if math.isfinite(v)]
        drawn = ax.bar([x for x, _, _ in bars], [v for _, v, _ in bars], width=0.8,
                       color=[c for _, _, c in bars], edgecolor=BAR_DARK, linewidth=0.6)
        for bar, (x, _, _) in zip(drawn, bars):  # (neighbours apart, in grey print too)
            bar.set_hatch("///" if x % 2 else "")
        for x, value in enumerate(values):  # no bar: a mark instead
            if not math.isfinite(value):
                ax.text(x, 0, "n/a" if math.isnan(value) else f"{value}", rotation=90,
                        ha="center", va="bottom", fontsize=8, color=TEXT_DARK)
        ax.set_xlim(-0.6, len(ids) - 0.4)  # (the marks too, not only bars)
        ax.set_xticks(range(len(ids)), ids, rotation=90, fontsize=7, family="monospace")
        ax.set_title(_short(name), fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    return fig


def to_png(fig: _MatplotlibFigure, dpi: int = 96) -> bytes:
    """The figure as PNG bytes, for an ``ipywidgets.Image``."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()
