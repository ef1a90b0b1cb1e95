"""``ckpt-nb``: look into, check and tidy a checkpoint store from the shell.

Every subcommand takes the store directory first; checkpoint ids accept what
``CheckpointManager.resolve`` does ("latest", "best", "-N", an id prefix).
"best" needs ``--metric`` (and ``--mode max`` where higher is better).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ._catalog import store_exists
from ._errors import CkptError
from ._manager import CheckpointManager

ProgressFn = Callable[[int, int], None]
_NUMERIC = frozenset({"step", "epoch", "batch_idx", "stored", "logical", "rel_change"})


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` by default); return the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    directory = Path(args.directory)
    if not store_exists(directory):
        print(f"ckpt-nb: no checkpoint store at {directory}", file=sys.stderr)
        return 2
    named = [getattr(args, k, None) for k in ("id", "a", "b")] + getattr(args, "ids", [])
    if "best" in named and args.metric is None:
        print("ckpt-nb: 'best' needs --metric NAME (and --mode max if higher is better)",
              file=sys.stderr)
        return 1
    try:
        with CheckpointManager(directory, metric=args.metric, mode=args.mode) as mgr:
            return args.run(mgr, args)
    except (CkptError, ValueError) as exc:
        print(f"ckpt-nb: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into e.g. head, which has stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _parser() -> argparse.ArgumentParser:
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("directory", metavar="DIR", help="the checkpoint store")
    store.add_argument("--metric", help="the metric that ranks checkpoints (for 'best')")
    store.add_argument("--mode", choices=("min", "max"), default="min",
                       help="whether a lower or higher --metric is better (default: min)")
    parser = argparse.ArgumentParser(
        prog="ckpt-nb", description="Look into, check and tidy a checkpoint store.",
        epilog="IDs: 'latest', 'best' (with --metric), '-N' (N back from latest) or an id prefix.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[CheckpointManager, argparse.Namespace], int],
                help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[store], help=help, description=help)
        sub.set_defaults(run=run)
        return sub

    command("ls", _ls, "list the checkpoints").add_argument(
        "--branch", help="only this branch's checkpoints")
    command("show", _show, "one checkpoint's fields and tensors").add_argument("id", metavar="ID")
    diff = command("diff", _diff, "per-tensor change from checkpoint A to B")
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")
    command("verify", _verify, "re-read checkpoints and check their checksums").add_argument(
        "ids", metavar="ID", nargs="*", help="the checkpoints to check (default: all)")
    command("gc", _gc, "reclaim space no checkpoint needs")
    export = command("export", _export, "write a checkpoint as a .pt or .safetensors file")
    export.add_argument("id", metavar="ID")
    export.add_argument("out", metavar="OUT", help="a path ending .pt or .safetensors")
    command("pin", _pin, "protect a checkpoint from retention").add_argument("id", metavar="ID")
    command("unpin", _unpin, "release a pinned checkpoint").add_argument("id", metavar="ID")
    rm = command("rm", _rm, "delete a checkpoint")
    rm.add_argument("id", metavar="ID")
    rm.add_argument("--force", action="store_true", help="delete it even if pinned")
    return parser


# -- subcommands ------------------------------------------------------------------
def _ls(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    frame = mgr.list(branch=args.branch)
    if frame.empty:
        print("no checkpoints" + (f" on branch {args.branch!r}" if args.branch else ""))
        return 0
    fixed = {"id", "parent", "branch", "created", "step", "epoch", "batch_idx", "strategy",
             "stored_bytes", "logical_bytes", "pinned", "best", "head", "note"}
    metrics = [c for c in frame.columns if c not in fixed]
    with_note = bool(frame["note"].astype(bool).any())
    headers = ["id", "parent", "branch", "created", "step", "epoch", "batch_idx", "strategy",
               "stored", "logical", "marks", *metrics, *(["note"] if with_note else [])]
    rows = [[_cell(r["id"]), _cell(r["parent"]), _cell(r["branch"]),
             _time(r["created"].timestamp()), _cell(r["step"]), _cell(r["epoch"]),
             _cell(r["batch_idx"]), _cell(r["strategy"]), _size(r["stored_bytes"]),
             _size(r["logical_bytes"]),
             ",".join(m for m in ("pinned", "best") if r[m]) or "-",
             *(_cell(r[m]) for m in metrics), *([_cell(r["note"])] if with_note else [])]
            for _, r in frame.iterrows()]
    print(_table(headers, rows, right=_NUMERIC | set(metrics)))
    return 0


def _show(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    info = mgr.info(args.id)
    fields = {
        "id": info["id"], "parent": info["parent"], "children": ", ".join(info["children"]),
        "branch": info["branch"], "created": _time(info["created_at"]),
        "step": info["step"], "epoch": info["epoch"], "batch_idx": info["batch_idx"],
        "strategy": info["strategy"] + (f" (chain {info['chain']}, full base "
                                        f"{info['full_base']})" if info["chain"] else ""),
        "stored": _size(info["stored_bytes"]), "logical": _size(info["logical_bytes"]),
        "pinned": "yes" if info["pinned"] else "no",
        "metrics": ", ".join(f"{k}={_cell(v)}" for k, v in sorted(info["metrics"].items())),
        "objects": ", ".join(f"{k} ({v})" for k, v in info["objects"].items()),
        "pickles": "yes" if info["pickles"] else "no", "note": info["note"],
    }
    width = max(map(len, fields))
    for key, value in fields.items():
        print(f"{key + ':':<{width + 1}} {_cell(value)}")
    print()
    rows = [[t["name"], t["dtype"], _shape(t["shape"])] for t in info["tensors"]]
    print(_table(["tensor", "dtype", "shape"], rows) if rows else "no tensors")
    return 0


def _diff(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    frame = mgr.diff(args.a, args.b)
    rows = [[r["tensor"], r["status"], _shape(r["shape"]), _percent(r["rel_change"])]
            for _, r in frame.iterrows()]
    print(_table(["tensor", "status", "shape", "rel_change"], rows, right=_NUMERIC))
    counts = frame["status"].value_counts()
    shown = [s for s in ("identical", "changed", "reshaped", "added", "removed")
             if s in ("identical", "changed") or counts.get(s, 0)]
    print(f"\n{len(frame)} tensors: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in shown))
    return 0


def _verify(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    with _progress("verify") as progress:
        report = mgr.verify(args.ids or None, progress=progress)
    if report.ok:
        print(f"ok: {len(report.checked)} checkpoints verified")
        return 0
    for cid, problems in report.bad.items():
        print(f"bad: {cid}")
        for problem in problems:
            print(f"  {problem}")
    print(f"{len(report.bad)} of {len(report.checked)} checkpoints fail verification")
    return 1


def _gc(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    report = mgr.gc()
    print(f"freed {_size(report.bytes_freed)}: {report.chunks_dropped} chunks dropped, "
          f"{report.packs_deleted} packs deleted, {report.packs_compacted} packs compacted, "
          f"{report.manifests_deleted} manifests deleted, "
          f"{report.temporaries_deleted} temporaries deleted")
    return 0


def _export(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    path = mgr.export(args.id, args.out)
    print(f"{path} ({_size(path.stat().st_size)})")
    return 0


def _pin(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    print(f"pinned {mgr.pin(args.id)}")
    return 0


def _unpin(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    print(f"unpinned {mgr.unpin(args.id)}")
    return 0


def _rm(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    cid = mgr.resolve(args.id)
    mgr.delete(cid, force=args.force)
    print(f"deleted {cid}")
    return 0


# -- formatting ---------------------------------------------------------------------
def _table(headers: Sequence[str], rows: Sequence[Sequence[str]],
           right: frozenset[str] | set[str] = frozenset()) -> str:
    """Rows of strings in aligned columns; columns named in ``right`` align right."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if h in right else c.ljust(w)
                         for h, c, w in zip(headers, cells, widths)).rstrip()

    return "\n".join([line(headers), *map(line, rows)])


def _missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN is unequal to itself
    except (TypeError, ValueError):  # pandas.NA refuses bool()
        return True


def _cell(value: Any) -> str:
    """A table cell: "-" for missing, 4 significant digits for floats."""
    if isinstance(value, str):
        return value or "-"
    if _missing(value):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _size(n: int) -> str:
    """Bytes, human-readable (KiB, MiB, ...)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while power < len(units) - 1 and n >= 1024 ** (power + 1):
        power += 1
    return f"{n} B" if power == 0 else f"{n / 1024 ** power:.1f} {units[power]}"


def _time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _shape(shape: Any) -> str:
    if isinstance(shape, tuple):
        return "x".join(map(str, shape)) or "scalar"
    return _cell(shape)


def _percent(fraction: float) -> str:
    if _missing(fraction):
        return "-"
    return "inf" if math.isinf(fraction) else f"{100 * fraction:.4g}%"


@contextlib.contextmanager
def _progress(desc: str) -> Iterator[ProgressFn | None]:
    """A ``progress(done, total)`` callback drawing a tqdm bar, or None without a TTY/tqdm."""
    if not sys.stderr.isatty():
        yield None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield None
        return
    with tqdm(desc=desc, unit="ckpt", file=sys.stderr, leave=False) as bar:
        def update(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        yield update
