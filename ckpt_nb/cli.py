"""``ckpt-nb``: look into, check and tidy a checkpoint store from the shell.

Every subcommand takes the store first: a directory, or a URL as ``CheckpointManager``
takes it (``file:///runs/x``, ``memory://...``, ``s3://...``); checkpoint ids accept what
``CheckpointManager.resolve`` does ("latest", "best", "-N", an id prefix).
"best" ranks by ``--metric`` (in the direction its name says, a loss lower, an accuracy
higher, or as ``--mode min|max`` says), by default by the
metric and mode the store's saves recorded (``CheckpointManager(metric=...)``, ``--on``);
``--mode`` alone ranks by the recorded metric in that mode.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import re
import shlex
import shutil
import signal
import sqlite3
import sys
import unicodedata
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from . import __version__
from ._errors import (CheckpointNotFoundError, CkptError, CorruptCheckpointError,
                      MetricNotFoundError, StoreError, metrics_logged, too_far_back)
from ._metric_names import metric_mode_from_name
from ._units import human_size, natural_order, options_meant

if TYPE_CHECKING:  # loaded by the commands that need them: they bring torch (a second)
    from ._catalog import CheckpointRow
    from ._manager import CheckpointManager
    from ._store import Store

ProgressFn = Callable[[int, int], None]
_NUMERIC = frozenset({"step", "epoch", "batch_idx", "stored", "logical", "l2", "rel_change"})
_LS_METRICS = 8  # metric columns ls shows without --all-metrics (25 made rows of 900 characters)
_NOTE_CHARS = 32  # a note's width in ls on a terminal, as in the explorer (whole in show)
_NOTE_FEWEST = 8  # the fewest columns a note is cut to on a narrow terminal, else left out


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` by default); return the exit code.
    Run as the program (no ``argv``), it ignores a Ctrl-C in the process's exit."""
    return _run_as_command("ckpt-nb", lambda: _main(sys.argv[1:] if argv is None else argv),
                          as_program=argv is None)


def _run_as_command(prog: str, work: Callable[[], int], *, as_program: bool) -> int:
    """``work()``'s exit code, where its reader may stop reading (``| head -1``; --help's
    output too) and a Ctrl-C is one line, exit 130 (outside the work's own catch: in
    parsing, or the last flush); ``as_program``: a Ctrl-C in the process's exit is
    ignored."""
    try:
        with _reader_may_leave():
            return work()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    finally:
        # (now, the work and its output done: Python's exit joins its threads before it
        # runs atexit's functions, and a Ctrl-C there was an "Exception ignored in
        # <module 'threading'>" traceback)
        if as_program:
            _ignore_interrupts()


def _ignore_interrupts() -> None:
    """Ignore Ctrl-C from here on: run as the program ends, after its work and output.
    Python's exit then sets SIGINT back to its default action and unloads torch (a
    while), and a Ctrl-C meanwhile killed the process, exit -2 for a command that had
    done its work; a signal ignored is left ignored."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:  # (one came first: this call took it, and set nothing)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _main(argv: list[str]) -> int:
    """``main``'s work, run where its reader may stop reading."""
    try:
        args = _parse(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    location: str = args.directory  # a path or a URL (file://, memory://, s3://, ...)
    store: Store | None = None

    def own(message: object) -> str:
        """The message on one line, naming the store as the user did (its URL is
        percent-encoded: file:///sp%20ace), and options as this command line spells
        them; what a store holds may be anything. A command to paste (`ckpt-nb verify
        URL`) names it as typed, quoted for the shell."""
        text = _cli_wording(str(message))
        if store is not None:
            text = _COMMAND.sub(lambda cmd: cmd[0].replace(store.url, shlex.quote(location)),
                                text)
            text = text.replace(store.url, location)
        return _printable(text)

    def say(message: object) -> None:
        print(f"ckpt-nb: {own(message)}", file=sys.stderr)

    named = [getattr(args, k, None) for k in ("id", "a", "b")] + getattr(args, "ids", [])
    with _warnings_as_lines(own):
        try:
            from ._store import open_store, store_exists, why_no_store

            try:
                exists = store_exists(location)  # (asks an object store: inside the try)
            except ValueError as exc:  # a malformed URL: a usage error, as a missing store
                say(exc)
                return 2
            if not exists:
                say(f"no checkpoint store at {location}{why_no_store(location)}")
                return 2
            store = open_store(location)
            mode = args.mode or (None if args.metric is None
                                 else metric_mode_from_name(args.metric))
            with _command_line_manager(store, own, metric=args.metric,
                                       mode=mode or "min") as mgr:
                if args.metric is not None and mode is None:
                    mode = _direction_of_unnamed(mgr, args.metric)
                    if mode is None:  # (min taken for an accuracy made the worst best)
                        say(f"--metric {args.metric}: its name does not say whether a lower "
                            "or a higher value is better; give --mode min or --mode max")
                        return 2
                    mgr.mode = mode
                if args.metric is None and args.mode is not None and mgr.metric is not None:
                    mgr.mode = args.mode  # (--mode alone: the recorded metric's, turned)
                if "best" in named and mgr.metric is None:  # (none given, and none recorded)
                    say("'best' needs --metric NAME (and --mode where its name does not say "
                        "whether higher is better): "
                        "no save to this store recorded a metric to rank by")
                    return 1
                if args.mode is not None and mgr.metric is None:
                    say(f"warning: --mode {args.mode} ranks nothing: no save to this store "
                        "recorded a metric to rank by; give --metric NAME with it")
                try:
                    return args.run(mgr, args)
                except CheckpointNotFoundError as exc:
                    ambiguous = _ambiguous(mgr, [n for n in named if n])
                    if ambiguous is None:
                        raise
                    raise CheckpointNotFoundError(ambiguous) from exc
        except (CkptError, ValueError, ImportError) as exc:  # ImportError: s3:// sans s3fs
            say(_advised(exc, location))
        except OSError as exc:
            say(f"{args.command} failed: {_os_reason(exc)}")
        except sqlite3.Error as exc:
            say(f"cannot use the catalog of {location}: {exc}")
        except KeyboardInterrupt:  # (a store's writes are atomic: nothing is half done)
            say(f"{args.command} interrupted")
            return 130
    return 1


def _command_line_manager(store: Store, own: Callable[[object], str],
                          **options: Any) -> CheckpointManager:
    """The command's manager: it says a wait for another process's lock as the CLI's
    other lines are (``ckpt-nb: ``, the store as the user named it), above a progress bar
    on stderr, not onto it."""
    from ._manager import CheckpointManager

    class CommandLineManager(CheckpointManager):
        def _say_lock_wait(self, waiting: str) -> None:
            _line_above_bars(f"ckpt-nb: {own(waiting)}")

    return CommandLineManager(store, **options)


def _direction_of_unnamed(mgr: CheckpointManager, metric: str) -> str | None:
    """The mode of a ``--metric`` whose name says no direction: the one the store's saves
    recorded for it; "min" where no checkpoint logs it (nothing ranks by it, and the
    command says so, naming those logged); else None, for ``--mode`` to say."""
    recorded = mgr._recorded_mode_of(metric)
    if recorded is not None:
        return recorded
    if not any(metric in row.metrics for row in mgr.catalog.checkpoints()):
        return "min"
    return None


def _line_above_bars(line: str) -> None:
    """Write ``line`` to stderr; a progress bar drawn there (``_progress``) is cleared
    first and drawn again under it."""
    try:
        from tqdm import tqdm
    except ImportError:
        print(line, file=sys.stderr, flush=True)
        return
    tqdm.write(line, file=sys.stderr)


# The API's words for what a shell user does otherwise: a class to define in the process,
# a list() to call, a keyword to pass, a safe global to register (the CLI's .pt export
# takes none); what the CLI has no option for (a manager's catalog=, an FsspecStore's
# keys) is left out.
_CLI_WORDS = {
    "trust_pickle=True": "--trust-pickle",
    "force=True": "--force",
    "(metric=, --metric)": "(--metric NAME)",
    "(only='ckpt_nb', or --only ckpt_nb)": "(--only ckpt_nb)",
    ", or give the manager catalog=PATH": "",
    ", or FsspecStore(url, key=..., secret=...)": "",
    "import or define the class first (one defined in a notebook is in that notebook's "
    "kernel only)": "make its module importable (PYTHONPATH=FOLDER ckpt-nb ..., where "
    "FOLDER holds it; a class defined in a notebook cannot be found outside it)",
    "list() (ckpt-nb ls)": "`ckpt-nb ls`",
}
_SAFE_GLOBALS_ADVICE = re.compile(
    r", or pass (?:its class, [^,]+,|it) to torch\.serialization\.add_safe_globals")
_API_CALL = re.compile(r"\b(gc|verify)\(\)")  # "run gc() again": `ckpt-nb gc`
_COMMAND = re.compile(r"`ckpt-nb [^`]*`")  # a command a message gives to paste


def _cli_wording(text: str) -> str:
    """An error or warning of the Python API in the command line's words."""
    for api, cli in _CLI_WORDS.items():
        text = text.replace(api, cli)
    text = _API_CALL.sub(r"`ckpt-nb \1`", text)
    return _SAFE_GLOBALS_ADVICE.sub("", text)


def _advised(exc: Exception, location: str) -> str:
    """The error, with what to do where it is a checkpoint's damage and says nothing
    (``checkpoint ID: chunk ... fails its checksum``): commands to paste, on the store
    at ``location`` (as the user typed it; without it, each was a usage error)."""
    text = str(exc)
    damaged = re.match(r"checkpoint ([0-9a-f]{6,32}): ", text)
    if not isinstance(exc, CorruptCheckpointError) or damaged is None or "ckpt-nb " in text:
        return text
    store = shlex.quote(location)
    return (f"{text} (`ckpt-nb verify {store}` names every damaged checkpoint; `ckpt-nb rm "
            f"{store} {damaged.group(1)}` deletes this one, or give another id)")


def _refuse_misspelt_options(parser: argparse.ArgumentParser, options: list[str]) -> None:
    """A usage error naming the option meant, for one of the command's own misspelt
    (``ls --allmetrics``, ``--metrics val_loss``, ``export --trust_pickle``, ``rm -force``,
    as the magics read them): argparse said "unrecognized arguments" alone. An ID such as
    -2 is no option."""
    known = [string for string in parser._option_string_actions if string.startswith("--")]
    for option in options:
        name = option.partition("=")[0]
        if not name.startswith("-") or name in ("-", "--") or re.fullmatch(r"-\d+", name) \
                or name in parser._option_string_actions or any(
                string.startswith(name) for string in known):  # (argparse takes a prefix)
            continue
        close = options_meant(name, known)
        if close:
            parser.error(f"unrecognized arguments: {option}: did you mean "
                         f"{' or '.join(close)}?")


def _parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line. The first word picks the subcommand, whose own parser
    then lets options come between IDs (``verify DIR --metric loss best``): parsed
    through the top parser, a ``nargs="*"`` positional would end at the first option."""
    parser, commands = _parser()
    argv = _command_first(argv, commands)
    if argv and argv[0] in commands:
        options = argv[1:argv.index("--")] if "--" in argv else argv[1:]
        if argv[0] == "gc" and any(o.partition("=")[0] in _RANKING_OPTIONS
                                   for o in options):  # (not "unrecognized: --metric=x")
            commands["gc"].error("gc takes no --metric/--mode (they rank best; gc ranks "
                                 "nothing)")
        named = [o.partition("=")[0] for o in options if o.partition("=")[0] in ("--metric",
                                                                                 "--on")]
        if len(named) > 1:  # (argparse keeps the last, silently)
            commands[argv[0]].error(f"{' and '.join(named)} each name the metric: give one")
        _refuse_misspelt_options(commands[argv[0]], options)
        return _metric_with_mode(commands[argv[0]],
                                 commands[argv[0]].parse_intermixed_args(argv[1:]),
                                 named[0] if named else "--metric")
    return parser.parse_args(argv)  # --help, no command or an unknown one: argparse says so


_RANKING_OPTIONS = ("--metric", "--on", "--mode")


def _metric_with_mode(parser: argparse.ArgumentParser, args: argparse.Namespace,
                      typed: str = "--metric") -> argparse.Namespace:
    """``--metric val_loss:min`` (or ``--on``, the notebook's word) read as ``--metric
    val_loss --mode min``: it was taken for a metric named "val_loss:min", which no
    checkpoint logs. ``typed``: the option the user gave it with, which an error names."""
    metric = getattr(args, "metric", None)
    name, _, mode = (metric or "").rpartition(":")
    mode = mode.lower()
    if name and mode in ("min", "max"):
        if args.mode not in (None, mode):
            parser.error(f"{metric} says {mode}, and --mode {args.mode}: give one")
        args.metric, args.mode = name, mode
    elif name and mode.isalpha() and mode.startswith(("min", "max")):  # (a word: minimum;
        # not a metric whose own name has a colon, grad:max_norm, which it found before)
        parser.error(f"{typed} {metric}: the mode after the ':' is min or max, not "
                     f"{metric.rpartition(':')[2]!r}: {typed} {name}:{mode[:3]}")
    return args


def _command_first(argv: list[str], commands: Sequence[str]) -> list[str]:
    """``--metric loss show DIR best`` read as ``show --metric loss DIR best``: the store's
    options belong to each command, and before one argparse called 'loss' a bad command."""
    at, moved = 0, []
    while at < len(argv) and argv[at] not in commands:
        name, glued, _ = argv[at].partition("=")
        if name not in _RANKING_OPTIONS or not glued and at + 1 == len(argv):
            return argv
        # (moved as one word: gc, which takes neither, then refuses "--metric=loss",
        # where it took 'loss' for its DIR and refused "--metric DIR")
        moved.append(argv[at] if glued else f"{name}={argv[at + 1]}")
        at += 1 if glued else 2
    return [argv[at], *moved, *argv[at + 1:]] if at < len(argv) else argv


def _ambiguous(mgr: CheckpointManager, named: list[str]) -> str | None:
    """Where an id prefix matches several checkpoints, an error that says how many (the
    store's names five, and not that there are more), naming them in sorted order, as a
    user types on from the prefix (in creation order, each line began anywhere); None
    where none does (a prefix too short to name one is refused as such)."""
    from ._manager import SHORTEST_PREFIX

    ids = list(mgr.list()["id"])
    for which in named:
        if len(which) < SHORTEST_PREFIX:
            continue
        prefix = which.lower()  # (ids are lowercase hex; resolve takes "F0" as "f0")
        matches = sorted(cid for cid in ids if cid.startswith(prefix))
        if len(matches) > 1 and prefix not in matches:
            more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
            return (f"{which!r} is ambiguous: {len(matches)} checkpoints start with it "
                    f"({', '.join(matches[:5])}{more}): give more of the id")
    return None


class _Stdout:
    """Standard output that its reader may leave (``ckpt-nb ls DIR | head -1``): from
    the broken pipe on, output goes to /dev/null, and the command ends quietly with its
    own exit code, as Unix tools do. (It ended with 1, or with 0 or 1 by a race where the
    pipe broke at the interpreter's last flush.)"""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        with self._dropped_if_gone():
            self._stream.write(text)
        return len(text)

    def flush(self) -> None:
        with self._dropped_if_gone():
            self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @contextlib.contextmanager
    def _dropped_if_gone(self) -> Iterator[None]:
        try:
            yield
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())  # (what is left buffered goes there too)
            os.close(devnull)


@contextlib.contextmanager
def _reader_may_leave() -> Iterator[None]:
    """Print through ``_Stdout``, flushed before the end (a last flush at exit would meet
    a broken pipe with no one to catch it). A closed standard output (``>&-``: Python's
    is None) is /dev/null; a character it cannot encode (a CJK note to a Latin-1 one) is
    written escaped, ``\\u4e2d``, where it failed the whole command."""
    with contextlib.ExitStack() as stack:
        stream = sys.stdout if sys.stdout is not None else \
            stack.enter_context(open(os.devnull, "w"))
        if isinstance(stream, io.TextIOWrapper) and \
                stream.errors in ("strict", "surrogateescape"):
            stack.callback(stream.reconfigure, errors=stream.errors)
            stream.reconfigure(errors="backslashreplace")
        out = _Stdout(stream)
        with contextlib.redirect_stdout(out):  # type: ignore[type-var]
            try:
                yield
            finally:
                out.flush()


@contextlib.contextmanager
def _warnings_as_lines(own: Callable[[object], str]) -> Iterator[None]:
    """Show warnings as ``ckpt-nb: warning: ...`` lines, not as Python's ``cli.py:45:
    RuntimeWarning: ...`` and a source line. Only the format changes, so a caller that
    records warnings (``pytest.warns``) still gets them."""
    saved = warnings.formatwarning

    def line(message: Warning | str, *_: object) -> str:
        return f"ckpt-nb: warning: {own(message)}\n"

    warnings.formatwarning = line
    try:
        yield
    finally:
        warnings.formatwarning = saved


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top parser and each subcommand's."""
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("directory", metavar="DIR", help="the checkpoint store")
    ranked = argparse.ArgumentParser(add_help=False, parents=[store])  # (all but gc's)
    _ranking_options(ranked)
    parser = argparse.ArgumentParser(
        prog="ckpt-nb", description="Look into, check and tidy a checkpoint store.",
        epilog="IDs: 'latest', 'best' (by --metric, or the store's recorded metric), '-N' "
               "(N back from latest) or an id prefix. In show, diff and export, 'latest' is "
               "the newest checkpoint that verifies, as a restore takes it, and '-N' counts "
               "back from that one.")
    parser.add_argument("--version", action="version", version=f"ckpt-nb {__version__}")
    # (only shown here: _command_first hands them to the command, after it or before it)
    _ranking_options(parser.add_argument_group(
        "ranking options", "given before the command, or after it: every command but gc "
        "takes them"))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[CheckpointManager, argparse.Namespace], int],
                help: str, ranks: bool = True) -> argparse.ArgumentParser:
        """A subcommand; one that ``ranks`` nothing takes no --metric nor --mode."""
        sub = commands.add_parser(name, parents=[ranked if ranks else store], help=help,
                                  description=help)
        sub.set_defaults(command=name, run=run, metric=None, mode=None)
        return sub

    ls = command("ls", _ls, "list the checkpoints")
    ls.epilog = ("marks: 'pinned'; 'best', the checkpoint 'best' names; 'best#2' to "
                 "'best#K', the others among the K best that a %%ckpt_auto --keep-best K "
                 "run keeps (the store's newest run, where it ranks by the same metric and "
                 "mode), as %ckpt_list and the explorer mark them. On a terminal, ls fits "
                 "its width (COLUMNS where set): it leaves out the least important columns "
                 "first (logical, strategy, parent, batch_idx, then stored and the metrics "
                 "but the one 'best' ranks by, with branch before them where every row has "
                 "the same), shortens created and the note, and says so under the table; "
                 "piped, it prints every column whole")
    ls.add_argument("--branch", help="only this branch's checkpoints (a branch the store "
                    "does not have is an error)")
    ls.add_argument("--all-metrics", action="store_true",
                    help=f"a column for every metric (by default the first {_LS_METRICS}), "
                    "kept on a narrow terminal too")
    which = ("'latest', 'best' (by --metric, or the store's recorded metric), '-N' or an id "
             "prefix")
    command("show", _show, "one checkpoint's fields and tensors").add_argument(
        "id", metavar="ID", help=f"the checkpoint: {which}")
    diff = command("diff", _diff, "per-tensor change from checkpoint A to B, and the other "
                   "values that differ (lr, step, extra)")
    diff.add_argument("a", metavar="A", help=f"the checkpoint to compare from: {which}")
    diff.add_argument("b", metavar="B", help=f"the checkpoint to compare to: {which}")
    command("verify", _verify, "re-read checkpoints and check their checksums").add_argument(
        "ids", metavar="ID", nargs="*", default=[],  # (a default, or argparse calls ID required)
        help="the checkpoints to check (default: all)")
    command("gc", _gc, "reclaim space no checkpoint needs", ranks=False)
    export = command("export", _export, "write a checkpoint as a .pt or .safetensors file")
    export.add_argument("id", metavar="ID", help=f"the checkpoint: {which}")
    export.add_argument("out", metavar="OUT",
                        help="the file to write, ending .pt (or .pth, .bin, .ckpt: "
                             "torch.load's) or .safetensors; if it exists it is replaced "
                             "atomically (a link at OUT is replaced, not followed; a "
                             "read-only file is refused)")
    export.add_argument("--only", metavar="NAME",
                        help="write this object's state alone (e.g. model), under its own "
                             "keys, as its load_state_dict takes them")
    export.add_argument("--trust-pickle", action="store_true",
                        help="unpickle values stored as pickles (objects of your own "
                             "classes; their modules must be importable: PYTHONPATH), "
                             "only for a store you trust: a .safetensors OUT keeps them, "
                             "a .pt leaves them out, as torch.load(weights_only=True) "
                             "refuses them")
    command("pin", _pin, "protect a checkpoint from retention").add_argument(
        "id", metavar="ID", help=f"the checkpoint to pin: {which}")
    command("unpin", _unpin, "release a pinned checkpoint").add_argument(
        "id", metavar="ID", help=f"the checkpoint to unpin: {which}")
    rm = command("rm", _rm, "delete checkpoints")
    rm.add_argument("ids", nargs="+", metavar="ID",
                    help=f"a checkpoint to delete: {which}; several are deleted in one pass, "
                    "none where one is pinned or unknown")
    rm.add_argument("--force", action="store_true", help="delete them even if pinned")
    return parser, commands.choices


def _ranking_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--metric and --mode, which every command but gc takes: the top parser's --help
    shows them too, as they may come before the command (``--metric loss ls DIR``)."""
    parser.add_argument("--metric", "--on", metavar="METRIC",
                        help="the metric that ranks checkpoints (for 'best'; default: the one "
                        "the store's saves were ranked by, where recorded); NAME:min or "
                        "NAME:max gives its mode too, as a notebook's --on does")
    parser.add_argument("--mode", choices=("min", "max"), default=None,
                        help="whether a lower or higher --metric is better (default: what "
                        "the metric's name says, a loss min, an accuracy max, else give it; "
                        "without --metric, the recorded metric's, which --mode alone "
                        "overrides)")


# -- subcommands ------------------------------------------------------------------
def _ls(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    # (the catalog read once, and listed, ranked and marked from that read: read four
    # times, each row decoded and checked each time, ls took 2.5 s on 1,500 checkpoints)
    mgr._catch_up()
    read = mgr.catalog.checkpoints()
    frame = mgr._list_table(read, branch=args.branch)
    if frame.empty and args.branch is not None:
        branches = sorted({row.branch for row in read}, key=natural_order)
        if branches:  # (a mistyped branch was "no checkpoints", and a success)
            raise CheckpointNotFoundError(
                f"no branch {args.branch!r} in {mgr.store.url}: its branches are "
                f"{', '.join(branches)}")
    if frame.empty:
        print("no checkpoints" + (f" on branch {args.branch!r}" if args.branch else ""))
        return 0
    fixed = {"id", "parent", "branch", "created", "step", "epoch", "batch_idx", "strategy",
             "stored_bytes", "logical_bytes", "pinned", "best", "head", "note"}
    every = sorted((c for c in frame.columns if c not in fixed), key=natural_order)
    on = f" on branch {args.branch!r}" if args.branch else ""
    if args.metric is not None and args.metric not in every and not frame["best"].any():
        raise MetricNotFoundError(
            f"no checkpoint{on} has the metric {args.metric!r}; {metrics_logged(every)}")
    metrics = every if args.all_metrics else every[:_LS_METRICS]
    # (the one 'best' ranks by, given or recorded: shown)
    if mgr.metric in every and mgr.metric not in metrics:
        metrics.append(mgr.metric)
    # (first: a store whose folders it cannot read fails ls before any row, not after)
    stored = human_size(mgr.stored_bytes())
    nan_logged = _nan_logged(read, frame, fixed)
    with_note = bool(frame["note"].astype(bool).any())
    # (on a terminal, cut: a note of 200 characters made lines of 489; piped, whole)
    cut = sys.stdout.isatty()
    columns = ["id", "parent", "branch", "created", "step", "epoch", "batch_idx", "strategy",
               "stored", "logical", "marks"]
    # (list() renames a metric named like one of its columns; these are the table's own)
    labels = [f"metric:{m}" if m in columns or m == "note" else m for m in metrics]
    headers = [*columns, *labels, *(["note"] if with_note else [])]
    keep_best = _kept_best(mgr)
    # (ranked in the whole store, as 'best' resolves, on a branch too)
    places = {cid: place for place, cid in
              enumerate(mgr._best(read, keep_best), 1)}
    rows = [[_cell(r["id"]), _cell(r["parent"]), _cell(r["branch"]),
             _time(r["created"].timestamp()), _cell(r["step"]), _cell(r["epoch"]),
             _cell(r["batch_idx"]), _cell(r["strategy"]), human_size(r["stored_bytes"]),
             human_size(r["logical_bytes"]),
             ",".join([*(["pinned"] if r["pinned"] else []),
                       *([_best_mark(places[r["id"]])] if r["id"] in places else [])]) or "-",
             *("nan" if (r["id"], m) in nan_logged else _cell(r[m]) for m in metrics),
             *([_note_cell(r["note"], cut)] if with_note else [])]
            for r in frame.to_dict("records")]
    fitted = ""
    # (on a terminal: 136 columns for the demo's store; piped, every column; from a
    # notebook's `!ckpt-nb ls`, every column too: the kernel's pty is 80 columns wide
    # whatever the output area, which scrolls)
    fitting = cut and not os.environ.get("JPY_PARENT_PID")
    if fitting:
        table = dict(zip(headers, map(list, zip(*rows))))
        # (given up least important first; a branch's name matters where rows differ)
        one_branch = frame["branch"].nunique() == 1
        ranked = labels[metrics.index(mgr.metric)] if mgr.metric in metrics else None
        # (a metric the same in every row first: it tells no row from another)
        constant = {label for label, m in zip(labels, metrics) if frame[m].nunique() < 2}
        dropped = sorted((m for m in reversed(labels) if m != ranked),
                         key=lambda label: label not in constant)
        order = ["logical", "strategy", "parent", "batch_idx", _SHORTEN_CREATED,
                 *(["branch"] if one_branch else []), "stored",
                 *([] if args.all_metrics else dropped),
                 *([] if one_branch else ["branch"]), "note", "created", "epoch", "step"]
        fitted = _fit_to_terminal(table, shutil.get_terminal_size().columns, order,
                                  created=[r.timestamp() for r in frame["created"]],
                                  notes=list(frame["note"]),
                                  # (given up only where that makes the table fit)
                                  telling=[*([] if one_branch else ["branch"]), "note",
                                           "created", "epoch", "step"])
        headers, rows = list(table), [list(row) for row in zip(*table.values())]
    print(_table(headers, rows, right=_NUMERIC | set(labels)))
    # (a row's stored bytes are what its save added: a deleted base's chunks that its
    # deltas still need are in no row, but in the store's total)
    # (the lines under it wrapped where the table was fitted: on a terminal)
    width = shutil.get_terminal_size().columns if fitting else None
    print("\n" + _wrap(f"{len(frame)} checkpoint{'' if len(frame) == 1 else 's'}{on}; "
                       f"{stored} in the store", width))
    if fitted:
        print(fitted)
    if len(metrics) < len(every):
        print(_wrap(f"{_count(len(every) - len(metrics), 'more metric')} not shown "
                    "(--all-metrics shows them)", width))
    # (the marks the listed rows carry: on a --branch, not those of checkpoints elsewhere)
    listed_places = sorted(places[cid] for cid in frame["id"] if places.get(cid, 1) > 1)
    if listed_places:
        marks = (f"{_best_marks(listed_places)}: the next best by "
                 f"{_printable(str(mgr.metric))} ({mgr.mode}) after best, which the store's "
                 f"run keeps with it (--keep-best {keep_best})")
        print(_wrap(marks, width))
    return 0


_SHORTEN_CREATED = "created, shortened"  # (a step of _fit_to_terminal's order)


def _fit_to_terminal(table: dict[str, list[str]], width: int, order: Sequence[str], *,
                     created: list[float], notes: list[str],
                     telling: Sequence[str] = ()) -> str:
    """Fit ls's ``table`` (header: cells, changed in place) to a terminal ``width``
    columns wide, taking the steps of ``order`` until it fits: a column named is left
    out, ``_SHORTEN_CREATED`` gives "created" without its year and seconds, "note" is
    cut to the room left (left out under ``_NOTE_FEWEST`` columns). The steps named in
    ``telling`` (the columns that tell rows apart) are taken only where the table then
    fits: where even the columns no step names (id, marks, the ranked metric, every
    metric with --all-metrics) do not fit, they stay, and the table is wider.
    Returns the footer line that says what was done ("" where it fitted as it was)."""
    whole = {header: list(cells) for header, cells in table.items()}
    left_out, shortened = _fitting_steps(table, width, order, created, notes)
    fits = _table_width(table) <= width
    if not fits and telling:  # (leaving them out would not make it fit: kept)
        table.clear()
        table.update(whole)
        left_out, shortened = _fitting_steps(
            table, width, [step for step in order if step not in telling], created, notes)
    if not left_out and not shortened:
        return ""
    said = [f"left out: {', '.join(left_out)}"] if left_out else []
    said += [f"shortened: {', '.join(shortened)}"] if shortened else []
    opening = f"to fit {width} columns" if fits else \
        f"the table is wider than {width} columns even so"
    return _wrap(f"{opening}, {'; '.join(said)} (piped, as into `less -S`, ls shows every "
                 "column whole)", width)


def _fitting_steps(table: dict[str, list[str]], width: int, order: Sequence[str],
                   created: list[float], notes: list[str]) -> tuple[list[str], list[str]]:
    """The steps of ``_fit_to_terminal``, taken on ``table`` until it fits: the columns
    left out, and those shortened."""
    left_out: list[str] = []
    shortened: list[str] = []
    for step in order:
        excess = _table_width(table) - width
        if excess <= 0:
            break
        if step == _SHORTEN_CREATED:
            table["created"] = [datetime.fromtimestamp(t).strftime("%m-%d %H:%M")
                                for t in created]
            shortened.append("created")
            continue
        if step not in table:
            continue
        if step == "note":
            room = _column_width("note", table["note"]) - excess
            if room >= _NOTE_FEWEST:
                table["note"] = [_note_cell(n, True, chars=room) for n in notes]
                shortened.append("note")
                continue
        del table[step]
        left_out.append(_printable(step))
    return left_out, [c for c in shortened if c not in left_out]


def _wrap(text: str, width: int | None) -> str:
    """``text`` in lines of at most ``width`` columns as a terminal shows them (a wide
    character takes two, which textwrap counts as one), broken at spaces only; as it is
    where ``width`` is None (piped)."""
    if width is None:
        return text
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        joined = f"{line} {word}" if line else word
        if line and _width(joined) > width:
            lines.append(line)
            line = word
        else:
            line = joined
    return "\n".join([*lines, line])


def _column_width(header: str, cells: Sequence[str]) -> int:
    """The columns a table's column takes, as ``_table`` pads it."""
    return max(_width(_printable(header)), *(_width(_printable(c)) for c in cells))


def _table_width(table: dict[str, list[str]]) -> int:
    """The columns ``_table`` takes for ``table``'s widest line, two between columns."""
    return sum(_column_width(h, cells) for h, cells in table.items()) + 2 * (len(table) - 1)


def _kept_best(mgr: CheckpointManager) -> int:
    """How many checkpoints ls marks best: the ``--keep-best K`` of the store's newest
    run record, where that run ranks as 'best' does here (its metric and mode), as
    ``%ckpt_list`` and the explorer mark them and the run's retention keeps them; else 1
    (another ranking, or none recorded)."""
    from ._run_records import written_keep_best

    return written_keep_best(mgr) or 1


def _best_mark(place: int) -> str:
    """A checkpoint's mark in ls for its place among the best: "best" for the first, the
    one 'best' names; "best#2" and on for the others a run keeps."""
    return "best" if place == 1 else f"best#{place}"


def _best_marks(places: list[int]) -> str:
    """The marks of ``places`` (ascending, each 2 or more) for ls's footer, three or more in
    a row as "best#2 to best#50": one by one, --keep-best 50 made a line of 525 characters."""
    runs: list[list[int]] = []
    for place in places:
        if runs and place == runs[-1][-1] + 1:
            runs[-1].append(place)
        else:
            runs.append([place])
    return ", ".join(f"{_best_mark(run[0])} to {_best_mark(run[-1])}" if len(run) > 2
                     else ", ".join(map(_best_mark, run)) for run in runs)


def _nan_logged(every: Sequence[CheckpointRow], frame: Any,
                fixed: set[str]) -> set[tuple[str, str]]:
    """(id, column) of each NaN metric a checkpoint of ``every`` (the rows ``frame`` lists)
    logged (a diverged run's loss): in ``list()``, a metric never logged is NaN too, and
    both showed as "-"."""
    logged = {row.id: row.metrics for row in every}
    rows = [logged[cid] for cid in frame["id"]]
    # (list()'s metric columns, after its own, are the metrics' names in natural order:
    # sorted plainly, a NaN loss_10 was shown as loss_2's "nan", and loss_10 as "-")
    names = sorted({name for metrics in rows for name in metrics}, key=natural_order)
    columns = [c for c in frame.columns if c not in fixed]
    return {(cid, column) for cid, metrics in zip(frame["id"], rows)
            for name, column in zip(names, columns)
            if _is_nan(metrics.get(name))}


def _moving(name: str) -> bool:
    """Whether an ID names a checkpoint by where it stands ("latest", "best", "-N"), which
    another process's retention may delete between its resolving and its reading: such
    a read is tried again under the store's lock. An id or a prefix is not, and is
    resolved first (``_known``): a typo waited for a training's save only to be told it
    is unknown."""
    return name in ("latest", "best") or name.startswith("-") and name[1:].isdigit()


def _known(mgr: CheckpointManager, *names: str) -> None:
    """Resolve each ID that names a checkpoint itself (an id, a prefix): an unknown one is
    said at once, before any read that another process's lock may hold up."""
    for name in names:
        if not _moving(name):
            mgr.resolve(name)


# How verify() begins its error where the store failed to give what it read; `show`
# checks the newest checkpoints with it, and says it was show that failed.
_VERIFY_UNREAD = "verify failed, as the store could not be read: "


def _show(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    _known(mgr, args.id)
    try:
        cid, skipped, _ = _as_restored_back(mgr, args.id)
        info = mgr.info(cid)
    except StoreError as exc:  # (verify()'s, finding the newest checkpoint that verifies)
        said = str(exc).removeprefix(_VERIFY_UNREAD)
        if said == str(exc):
            raise
        raise StoreError(f"show failed, as the store could not be read while finding the "
                         f"checkpoint {args.id} means (the newest that verifies): {said}"
                         ) from exc
    except CheckpointNotFoundError:  # ("latest" deleted meanwhile by another process's
        if not _moving(args.id):  # retention: again, where none is deleted)
            raise
        with _store_locked(mgr):
            cid, skipped, _ = _as_restored_back(mgr, args.id)
            info = mgr.info(cid)
    # (retention deletes a full base its deltas no longer need: they were rewritten)
    gone = ", deleted" if info["full_base"] and \
        mgr.catalog.get(info["full_base"]) is None else ""
    fields = {
        "id": info["id"], **({"skipped": skipped} if skipped else {}),
        "parent": info["parent"], "children": ", ".join(info["children"]),
        "branch": info["branch"], "created": _time(info["created"]),
        "step": info["step"], "epoch": info["epoch"], "batch_idx": info["batch_idx"],
        "strategy": info["strategy"] + (
            f" ({_count(info['chain'], 'save')} since its full base {info['full_base']}{gone}; "
            + (f"a restore decodes up to {_count(info['depth'], 'delta')} a chunk)"
               if info["depth"] else "every chunk stored whole)") if info["chain"] else ""),
        "stored": human_size(info["stored_bytes"]), "logical": human_size(info["logical_bytes"]),
        "pinned": "yes" if info["pinned"] else "no",
        "metrics": ", ".join(f"{k}={_metric_cell(info['metrics'][k])}"
                            for k in sorted(info["metrics"], key=natural_order)),
        "objects": ", ".join(f"{k} ({v})" for k, v in info["objects"].items()),
        "pickles": "yes" if info["pickles"] else "no", "note": info["note"],
    }
    width = max(map(len, fields))
    for key, value in fields.items():
        print(f"{key + ':':<{width + 1}} {_printable(_cell(value))}")
    print()
    rows = [[t["name"], t["dtype"], _shape(t["shape"])] for t in info["tensors"]]
    print(_table(["tensor", "dtype", "shape"], rows) if rows else "no tensors")
    return 0


def _diff(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    _known(mgr, args.a, args.b)
    try:
        return _diff_resolved(mgr, args)
    except CheckpointNotFoundError:  # ("latest" deleted meanwhile by another process's
        if not (_moving(args.a) or _moving(args.b)):  # retention: again, where none is
            raise  # deleted)
        with _store_locked(mgr):
            return _diff_resolved(mgr, args)


def _diff_resolved(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    found: dict[str, tuple[str, str | None]] = {}  # (latest verified once for both)
    a, skipped, latest = _as_restored_back(mgr, args.a, found)
    b, skipped_b, latest_b = (a, skipped, latest) if args.b == args.a else \
        _as_restored_back(mgr, args.b, found)
    skipped, latest = skipped or skipped_b, latest or latest_b
    frame = mgr.diff(a, b)
    values: Any = []
    not_compared = ""
    try:
        values = mgr.diff_values(a, b)
    except CheckpointNotFoundError:
        raise  # (deleted meanwhile: _diff tries again)
    except StoreError:
        raise  # (the store failed: the command did, not a value)
    except CkptError as exc:  # (a value unreadable here must not hide the tensors' diff)
        not_compared = f"\nvalues not compared: {exc}"
    said = f"\nlatest is {latest}: skipped {skipped}" if skipped else ""
    if a == b:
        said += f"\n{args.a} and {args.b} are the same checkpoint, {a}"
    if frame.empty:
        print("no tensors in either checkpoint")
    else:
        rows = [[r["tensor"], r["status"], _shape(r["shape"]), _cell(r["l2"]),
                 _percent(r["rel_change"])] for _, r in frame.iterrows()]
        print(_table(["tensor", "status", "shape", "l2", "rel_change"], rows, right=_NUMERIC))
    if len(values):
        print("\n" + _values_table(values))
    elif not_compared:
        print(not_compared)
    if frame.empty:
        if said:
            print(said.lstrip("\n"))
        return 0
    counts = frame["status"].value_counts()
    shown = [s for s in ("identical", "changed", "reshaped", "added", "removed")
             if s in ("identical", "changed") or counts.get(s, 0)]
    differ = f"; {len(values)} value{'s differ' if len(values) > 1 else ' differs'}" \
        if len(values) else ""
    print(f"\n{len(frame)} tensors: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in shown)
          + differ + said)
    return 0


def _values_table(values: Any) -> str:
    """``diff_values``' rows as a table, each value cut to a few dozen characters (a
    history of thousands shows as its first items and its length, a float as 6
    significant digits); "-" for the side that lacks it."""
    from ._diff_values import diff_value_texts

    rows = [[r["path"], r["status"], *diff_value_texts(r, width=40)]
            for _, r in values.iterrows()]
    return _table(["value", "status", "A", "B"], rows)


def _as_restored_back(mgr: CheckpointManager, which: str,
                      found: dict[str, tuple[str, str | None]] | None = None
                      ) -> tuple[str, str | None, str | None]:
    """``_as_restored``, with "-N" counted back from the checkpoint "latest" names there,
    and the id "latest" is where ``which`` is "latest" or "-N" (else None): where the
    newest checkpoint failed verification, ``diff DIR -1 latest`` compared one checkpoint
    with itself, "-1" counting from that newest and "latest" skipping it. ``found``
    keeps what "latest" named for the next call (a diff's other side), which verifies
    the newest checkpoint once, not again."""
    found = {} if found is None else found
    back = int(which[1:]) if re.fullmatch(r"-\d+", which) else None
    if back is None and which != "latest":
        return mgr.resolve(which), None, None
    if "latest" not in found:
        found["latest"] = _as_restored(mgr, "latest")
    latest, skipped = found["latest"]
    if back is None:
        return latest, skipped, latest
    newest = mgr.catalog.newest_ids()
    if latest not in newest:  # (deleted meanwhile)
        return mgr.resolve(which), skipped, latest
    older = newest[newest.index(latest):]
    if back >= len(older):
        raise CheckpointNotFoundError(too_far_back(which, len(older),
                                                   f" from latest ({latest}) back"))
    return older[back], skipped, latest


def _as_restored(mgr: CheckpointManager, which: str) -> tuple[str, str | None]:
    """The id ``which`` names as ``restore`` and ``export`` take it, and a note naming the
    newer checkpoints passed over, with why (None where none was): "latest" is the
    newest that verifies, so that show and diff name the checkpoint an export of
    "latest" writes (they showed a newer, corrupt one). It costs a verify of the newest
    (its chunks decoded, as a restore decodes them); any other id is resolved as it is."""
    if which != "latest":
        return mgr.resolve(which), None
    skipped: list[str] = []
    with _progress("verify") as progress:
        found = _newest_verifying(mgr, progress, skipped)
        if found is None and not skipped:  # each deleted while it was read (another
            mgr.resolve("latest")  # process's retention; an empty store says so here):
            with _store_locked(mgr):  # again, where none is deleted
                found = _newest_verifying(mgr, progress, skipped)
    if found is not None:
        return found, None if not skipped else (
            f"{'; '.join(skipped)}, newer: 'latest' is the newest checkpoint that "
            "verifies, as restore and export take it")
    mgr.resolve("latest")  # (an empty store: says it has no checkpoints)
    raise CorruptCheckpointError(
        f"no checkpoint in {mgr.store.url} passes verification: `ckpt-nb verify "
        f"{mgr.store.url}` names what is damaged; `ckpt-nb show {mgr.store.url} ID` shows "
        "that checkpoint as it is")


def _newest_verifying(mgr: CheckpointManager, progress: Any,
                      skipped: list[str]) -> str | None:
    """The newest checkpoint that verifies (None where none does, or each was deleted
    while it was read), adding each newer one passed over, with why, to ``skipped``. A
    store that cannot be read (verify's StoreError) passes none over: it is raised, as
    restore("latest") raises it."""
    mgr._catch_up()
    for cid in mgr.catalog.newest_ids():  # (no row decoded: a store of thousands)
        try:
            report = mgr.verify([cid], progress=progress)
        except CheckpointNotFoundError:
            continue  # deleted meanwhile: the one before it, as restore does
        if cid in report.newer:
            skipped.append(f"{cid} (written by a newer ckpt_nb, which this one cannot read)")
            continue
        if cid not in report.checked:
            continue  # (deleted while it was read)
        problems = report.bad.get(cid)
        if not problems:
            return cid
        more = f", and {len(problems) - 1} more" if len(problems) > 1 else ""
        skipped.append(f"{cid} ({problems[0].removeprefix(f'checkpoint {cid}: ')}{more})")
    return None


def _store_locked(mgr: CheckpointManager) -> contextlib.AbstractContextManager[None]:
    """The store's writers' lock, under which no checkpoint is deleted (none to take
    where the store is open to read only)."""
    return contextlib.nullcontext() if mgr.catalog.read_only else mgr._exclusive(reading=True)



def _verify(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    ids = list(dict.fromkeys(map(mgr.resolve, args.ids)))  # "latest -0" is one checkpoint
    with _progress("verify") as progress:
        report = mgr.verify(ids or None, progress=progress)
    if report.ok:
        print(f"ok: {_count(len(report.checked), 'checkpoint')} verified")
        return 0
    for cid, problems in report.bad.items():
        print(f"bad: {cid}")
        # (a chunk under several deltas of a chain is named once)
        for problem in dict.fromkeys(p.removeprefix(f"checkpoint {cid}: ") for p in problems):
            print(f"  {_printable(_cli_wording(problem))}")
    for key, problem in report.packs.items():
        print(f"bad index: {key}")
        print(f"  {_printable(_cli_wording(problem))}")
    for cid, why in report.newer.items():
        print(f"not checked: {cid}")
        print(f"  {_printable(_cli_wording(why))}")
    summary = f"{len(report.bad)} of {len(report.checked)} checkpoints fail verification" \
        if report.checked else "no checkpoint was checked"
    if report.newer:  # (not 0, as a script's `verify && ...` must not take them for checked)
        one = len(report.newer) == 1
        summary += (f"; {_count(len(report.newer), 'checkpoint')} written by a newer ckpt_nb "
                    f"{'was' if one else 'were'} not checked (upgrade ckpt_nb to verify "
                    f"{'it' if one else 'them'})")
    # (a pack that a failed checkpoint's chunks lie in was cut short or is damaged: gc
    # leaves it as it is; one whose chunks all read has only its index to rewrite)
    unreadable = {key for key in report.packs
                  if any(key in p for problems in report.bad.values() for p in problems)}
    if len(report.packs) > len(unreadable):
        indexes = len(report.packs) - len(unreadable)
        summary += (f"; {_count(indexes, 'pack index', 'pack indexes')} "
                    f"{'is' if indexes == 1 else 'are'} damaged (the chunks read, but a "
                    "rebuilt catalog would miss them: `ckpt-nb gc "
                    f"{shlex.quote(args.directory)}` rewrites them)")
    if unreadable:
        needing = [cid for cid, problems in report.bad.items()
                   if any(key in p for key in unreadable for p in problems)]
        summary += (f"; {_count(len(unreadable), 'pack')} cut short or damaged "
                    f"{'holds' if len(unreadable) == 1 else 'hold'} chunks of "
                    f"{', '.join(needing)}, which cannot be restored: `ckpt-nb rm "
                    f"{shlex.quote(args.directory)} ID` deletes one")
    print(summary)
    return 1


def _gc(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    with _progress("gc", "pack") as progress:
        report = mgr.gc(progress=progress)
    print(f"freed {human_size(report.bytes_freed)}: "
          f"{_count(report.chunks_dropped, 'chunk')} dropped, "
          f"{_count(report.packs_deleted, 'pack')} deleted, "
          f"{_count(report.packs_compacted, 'pack')} compacted, "
          f"{_count(report.chunks_rewritten, 'delta')} stored whole, "
          f"{_count(report.manifests_deleted, 'manifest')} deleted, "
          f"{_count(report.temporaries_deleted, 'temporary', 'temporaries')} deleted")
    if report.damaged_kept:
        _print_kept(mgr)
    return 0


def _print_kept(mgr: CheckpointManager) -> None:
    """Name the files gc kept as damaged, each with what is wrong with it, why gc keeps
    it and how to remove it: gc pointed at `ckpt-nb verify`, which checks checkpoints,
    and said "ok" of a store whose only damage was a pack that none of them uses."""
    from ._rebuild import is_newer
    from ._store import LocalStore

    kept = mgr.catalog.damaged()
    newer = sum(map(is_newer, kept.values()))
    damaged = len(kept) - newer
    what = " and ".join(
        ([_count(damaged, "damaged file")] if damaged else [])
        + ([f"{_count(newer, 'file')} written by a newer ckpt_nb"] if newer else []))
    if damaged and newer:
        why = "what is left in a damaged one may be recovered; a newer ckpt_nb reads the others"
    elif damaged:
        why = f"what is left in {'it' if damaged == 1 else 'them'} may be recovered"
    else:
        why = f"a newer ckpt_nb reads {'it' if newer == 1 else 'them'}"
    # (a checkpoint gc cannot read: the chunks it uses are not known, so no pack goes)
    checkpoints = sum(key.startswith("manifests/") for key in kept)
    if checkpoints == 1:
        those = "that checkpoint is" if len(kept) == 1 else "the checkpoint among them is"
    else:
        those = "those checkpoints are" if checkpoints == len(kept) else \
            f"the {checkpoints} checkpoints among them are"
    print(f"kept {what}, which gc never deletes ({why})"
          + (f"; while {those} there, gc deletes no pack either (it cannot tell which "
             f"chunks {'the checkpoint uses' if checkpoints == 1 else 'they use'}):"
             if checkpoints else ":"))
    store = mgr.store
    for key, why in sorted(kept.items()):
        where = store.root / key if isinstance(store, LocalStore) else f"{store.url}/{key}"
        print(f"  {where}: {why}")
    print("delete one you do not need from the store by hand (with the file system's or "
          "the object store's own tools); gc then forgets it")


def _export(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    """``mgr.export`` in its two steps: the checkpoint read names the id written ("latest"
    skips a newest that fails verification), and the write gets a line of its own."""
    from ._interop import check_export_path, write_file

    check_export_path(args.out)
    which = args.id if args.id == "latest" else _as_restored_back(mgr, args.id)[0]
    skipped: list[str] = []  # (said in one line: not one a checkpoint passed over)
    with _progress("export", "chunk") as progress:  # (the store's errors: "export failed")
        try:
            ck = mgr._read_for_export(which, trust_pickle=args.trust_pickle,
                                      progress=progress, skipped=skipped)
        except CorruptCheckpointError as exc:
            if not skipped:
                raise
            raise CorruptCheckpointError(
                f"{exc} ({_count(len(skipped), 'checkpoint')} tried, the newest "
                f"{skipped[0]}): `ckpt-nb verify {mgr.store.url}` names what is damaged; "
                f"`ckpt-nb show {mgr.store.url} ID` shows that checkpoint as it is") from exc
    if skipped:
        more = f"; and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        warnings.warn(f"skipping checkpoint {skipped[0]}{more}: 'latest' is the newest "
                      f"checkpoint that verifies (`ckpt-nb verify {mgr.store.url}` names "
                      "what is damaged)",
                      stacklevel=1)
    try:
        with _progress(f"export: writing {args.out}", bar_format="{desc}"):
            path = write_file(ck, args.out, only=args.only)
    except CkptError:
        raise
    except OSError as exc:  # the file system's own error: say which file was asked for
        # (its reason alone where it is about that very file: not the path twice)
        same = exc.filename2 is None and exc.filename is not None and \
            os.path.abspath(exc.filename) == os.path.abspath(args.out)
        reason = exc.strerror if same and exc.strerror else _os_reason(exc)
        raise CkptError(f"cannot export to {args.out}: {reason}") from exc
    print(f"{path} ({human_size(path.stat().st_size)}, checkpoint {ck.id})")
    return 0


def _pin(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    return _set_pin(mgr, args.id, True)


def _unpin(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    return _set_pin(mgr, args.id, False)


def _set_pin(mgr: CheckpointManager, which: str, pinned: bool) -> int:
    """Pin or unpin, saying so where it already was (not a second "pinned"). The alias
    (``-N``, latest, best) is read by ``pin`` under the store's lock: read before, while
    another process held it, it could name a checkpoint that process deleted. (Pinning
    one pinned again withdraws a deletion cut short before its commit.)"""
    before = mgr.list()
    cid = mgr.pin(which, pinned)
    if bool(before.loc[before["id"] == cid, "pinned"].any()) == pinned:
        print(f"{cid} was {'already' if pinned else 'not'} pinned")
    else:
        print(f"{'pinned' if pinned else 'unpinned'} {cid}")
    return 0


def _rm(mgr: CheckpointManager, args: argparse.Namespace) -> int:
    deleted = mgr.delete(*args.ids, force=args.force)  # (the aliases read under the lock)
    print(f"deleted {deleted if isinstance(deleted, str) else ', '.join(deleted)}")
    return 0


# -- formatting ---------------------------------------------------------------------
def _table(headers: Sequence[str], rows: Sequence[Sequence[str]],
           right: frozenset[str] | set[str] = frozenset()) -> str:
    """Rows of strings in aligned columns; columns named in ``right`` align right (named
    as given: a metric's name with a control character in it is escaped only after)."""
    aligned = [h in right for h in headers]
    headers = list(map(_printable, headers))
    rows = [list(map(_printable, row)) for row in rows]
    widths = [max(_width(h), *(_width(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        pads = [" " * (w - _width(c)) for c, w in zip(cells, widths)]
        return "  ".join(pad + c if to_right else c + pad
                         for to_right, c, pad in zip(aligned, cells, pads)).rstrip()

    return "\n".join([line(headers), *map(line, rows)])


def _note_cell(note: str, cut: bool, chars: int = _NOTE_CHARS) -> str:
    """A note's cell in ls: where ``cut``, as much as fits ``chars`` columns as shown,
    and "…" (control characters escaped whole, wide characters two columns)."""
    shown = [_printable(c) for c in _cell(note)]
    if not cut or _width("".join(shown)) <= chars:
        return "".join(shown)
    kept, width = [], 0
    for piece in shown:  # (an escape is cut whole, never in its middle)
        width += _width(piece)
        if width > chars - 1:
            break
        kept.append(piece)
    return "".join(kept) + "…"


def _width(text: str) -> int:
    """The columns ``text`` takes on a terminal: CJK characters take two."""
    if text.isascii():  # (each one column: a table's every cell, told apart fast)
        return len(text)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _printable(text: str) -> str:
    """``text`` with control characters escaped as ``repr`` does (``\\n``, ``\\x1b``): a
    note from someone else's store can neither break a table nor drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _os_reason(exc: OSError) -> str:
    """The error as "Is a directory: out.pt", not as "[Errno 21] Is a directory:
    '.out.pt.x1' -> 'out.pt'" (a rename names its target second)."""
    name = exc.filename2 if exc.filename2 is not None else exc.filename
    reason = exc.strerror or str(exc)
    return reason if name is None else f"{reason}: {name}"


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _metric_cell(value: Any) -> str:
    """A logged metric's cell: "nan" for a NaN (a diverged run's), not "-" (never logged)."""
    return "nan" if _is_nan(value) else _cell(value)


def _count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, plural where ``n`` is not 1: "1 checkpoint", "2 checkpoints"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


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


def _time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _shape(shape: Any) -> str:
    if isinstance(shape, tuple):
        return "x".join(map(str, shape)) or "scalar"
    if isinstance(shape, str):  # (a reshape, "(4, 4)->(4, 8)", as the rows' 4x4 -> 4x8)
        return re.sub(r"\(([^()]*)\)", lambda m: _shape(tuple(
            int(n) for n in m.group(1).split(",") if n.strip())), shape).replace("->", " -> ")
    return _cell(shape)


def _percent(fraction: float) -> str:
    if _missing(fraction):
        return "-"
    return "inf" if math.isinf(fraction) else f"{100 * fraction:.4g}%"


@contextlib.contextmanager
def _progress(desc: str, unit: str = "ckpt",
              bar_format: str | None = None) -> Iterator[ProgressFn | None]:
    """A ``progress(done, total)`` callback drawing a tqdm bar, or None without a TTY/tqdm;
    ``bar_format="{desc}"`` draws a line for a step that has no progress to show."""
    if not sys.stderr.isatty():
        yield None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield None
        return
    with tqdm(desc=desc, unit=unit, file=sys.stderr, leave=False, bar_format=bar_format) as bar:
        if bar_format is not None:
            bar.refresh()  # (drawn now: nothing will update it)

        def update(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)
            if done >= total:  # (tqdm redraws at most every 0.1 s: the end, drawn)
                bar.refresh()

        yield update


if __name__ == "__main__":  # (python -m ckpt_nb.cli; python -m ckpt_nb is the same)
    sys.exit(main())
