"""IPython magics: a thin skin over ``ckpt_nb._session``.

``%load_ext ckpt_nb`` registers ``%ckpt_auto`` / ``%%ckpt_auto``,
``%ckpt_rollback``, ``%ckpt_list``, ``%ckpt_status`` and ``%ckpt_ui``; ``%unload_ext
ckpt_nb`` removes them and every hook. Defaults are ``CkptMagics`` traitlets, settable
with ``%config CkptMagics.NAME = VALUE`` or in ipython_config.py: ``root_dir``,
``default_dir``, ``sync`` and ``max_variable_mb``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.utils.process import arg_split
from traitlets import Bool, Int, TraitError, Unicode, observe, validate

from . import _session as session_mod
from ._errors import (RANK_BY_ANOTHER, CaptureError, CkptError, StateMismatchError,
                      UntrustedPickleError, warnings_worded)
from ._session import (TRUST_PICKLE_ROLLBACK, UNRANKED_BEST_WAYS, AutoConfig, parse_duration,
                       parse_metric_trigger)
from ._store import (LOCAL_SCHEMES, UNWRITABLE_STORE, file_url_path, location, store_exists,
                     why_no_store)
from ._units import options_meant

_NEGATIVE_VALUE = re.compile(r"(--[a-z-]+)\s+(-[\d.])")
MAGIC_NAMES = {"line": ("ckpt_auto", "ckpt_rollback", "ckpt_list", "ckpt_status", "ckpt_ui"),
               "cell": ("ckpt_auto",)}


@magics_class
class CkptMagics(Magics):
    """Automatic, resumable checkpoints for training cells."""

    default_dir = Unicode("", help="The store of this kernel's cells that give no --dir "
                                   "(default: <root_dir>/<notebook name>: "
                                   "./checkpoints/<notebook name>, or ./checkpoints/session "
                                   "where the notebook is unknown, as in nbconvert or "
                                   "papermill jobs). One store for every notebook, set in "
                                   "ipython_config.py: their cells resume and prune each "
                                   "other's runs; set root_dir there. A relative one is in "
                                   "the folder the kernel was in as %load_ext ckpt_nb ran, "
                                   "as root_dir's").tag(config=True)
    root_dir = Unicode("checkpoints", help="The folder (or store URL) of the default stores, "
                                           "<root_dir>/<notebook name>, each notebook's own "
                                           "(<root_dir>/session where the notebook is "
                                           "unknown): for ipython_config.py. A relative one "
                                           "is in the folder the kernel was in as %load_ext "
                                           "ckpt_nb ran (the notebook's), whatever %cd does "
                                           "later").tag(config=True)
    sync = Bool(False, help="Write checkpoints on the training thread").tag(config=True)
    max_variable_mb = Int(100, help="Largest plain variable captured, in MiB").tag(config=True)

    @validate("max_variable_mb")
    def _max_variable_mb(self, proposal: Any) -> int:
        """Refused where it is set: a bad cap failed every later %ckpt_auto, in bytes."""
        if proposal["value"] < 0:
            raise TraitError("CkptMagics.max_variable_mb is the largest plain variable "
                             "captured, in MiB: 0 or more, not "
                             f"{proposal['value']!r}")
        return proposal["value"]

    @observe("max_variable_mb")
    def _cap_set(self, change: Any) -> None:
        """A cap set while the line form runs is the session's from its next cell (its
        skip message says to set it): the session took the cap in bytes as it started."""
        if self._line_session is not None:
            self._line_session.config.max_variable_bytes = change["new"] << 20

    @validate("default_dir")
    def _default_dir(self, proposal: Any) -> str:
        """A blank one would name a folder of spaces; "" is the default store."""
        if proposal["value"] and not proposal["value"].strip():
            raise TraitError("CkptMagics.default_dir is blank: give a directory, or \"\" for "
                             "the default (<CkptMagics.root_dir>/<notebook name>: "
                             "./checkpoints/<notebook name> unless root_dir is set)")
        return proposal["value"]

    @validate("root_dir")
    def _root_dir(self, proposal: Any) -> str:
        """A blank one would name a folder of spaces, an empty one no folder at all."""
        if not proposal["value"].strip():
            raise TraitError(f"CkptMagics.root_dir is {'blank' if proposal['value'] else 'empty'}"
                             ": give a folder, \"checkpoints\" (the default) or \".\" (the "
                             "working directory)")
        return proposal["value"]

    def __init__(self, shell: Any) -> None:
        # (before the config is loaded: a max_variable_mb set in it calls _cap_set)
        self._line_session: session_mod.AutoSession | None = None
        # The folder a relative root_dir is in: the kernel's as the extension loads (the
        # notebook's), so that the default store stays the notebook's after a %cd.
        self._root_home = os.getcwd()
        super().__init__(shell)
        self._cell_id: str | None = None  # the running cell's, where the front end sends it

    def _default_store(self) -> str:
        """The store of a magic given no --dir: CkptMagics.default_dir, else <root_dir>/
        <notebook name>, a relative one in the folder the kernel was in as %load_ext
        ckpt_nb ran (the notebook's), whatever %cd did since: its own path while the
        kernel is still there, else that folder's."""
        store = self.default_dir or session_mod.default_directory(self.shell.user_ns,
                                                                  self.root_dir)
        if "://" not in store and not os.path.isabs(os.path.expanduser(store)):
            with contextlib.suppress(OSError):  # (a working folder deleted: anchored)
                if os.path.samefile(os.getcwd(), self._root_home):
                    return store
            store = os.path.join(self._root_home, store)
        return store

    def note_cell(self, info: Any) -> None:
        """pre_run_cell: keep the cell's id (JupyterLab and Notebook 7 send one), which
        tells a run of this cell from another's when its code was edited."""
        self._cell_id = getattr(info, "cell_id", None)

    # -- %ckpt_auto ---------------------------------------------------------------
    @magic_arguments()
    @argument("--dir", default=None, help="checkpoint store directory (default: "
              "CkptMagics.default_dir, else <CkptMagics.root_dir>/<notebook name>: "
              "./checkpoints/<notebook name>, or ./checkpoints/session where the notebook is "
              "unknown, as in nbconvert or papermill jobs)")
    @argument("--every-steps", type=int, default=None, metavar="N",
              help="save N optimizer steps after the last save")
    @argument("--every-seconds", default=None, metavar="S",
              help="save S seconds after the last save: "
              "a number of seconds (90), or a duration as --every takes (10m)")
    @argument("--every", default=None, metavar="DURATION",
              help="save DURATION after the last save: 90s, 10m, "
              "2h, 1d, or a number of seconds (90)")
    @argument("--on", default=None, metavar="METRIC[:min|max]",
              help="save when METRIC (as ckpt_nb.log() names it) "
              "improves (with --keep-best K, where it ranks among the K best logged): "
              "METRIC:min or METRIC:max, or a bare name that says which way is "
              "better: --on val_loss (lower), --on accuracy (higher)")
    @argument("--keep", type=int, default=None, metavar="N",
              help="keep the newest N checkpoints of this cell's run")
    @argument("--keep-best", type=int, default=None, metavar="K",
              help="keep the best K checkpoints of this cell's run by the --on metric, "
              "which saves each value that ranks among the K best logged; "
              "alone (no --keep) it deletes the others but the newest, as Lightning's "
              "save_top_k does")
    @argument("--strategy", default="full", choices=("full", "incremental", "differential"),
              help="how a checkpoint stores its chunks: full (the default: every chunk, "
              "deduplicated), incremental (a changed chunk as its XOR against the parent's) "
              "or differential (XOR against the branch's last full checkpoint)")
    @argument("--track", default=None, metavar="NAMES",
              help="the names to track, comma-separated without spaces (model,opt); "
              "without it, discovery finds them")
    @argument("--no-resume", action="store_true",
              help="a %%%%ckpt_auto cell's only: do not resume the cell's unfinished run, "
                   "train on from the objects as they are (new objects start a new root)")
    @argument("--trust-pickle", action="store_true",
              help="a %%%%ckpt_auto cell's only: its resume unpickles the values that the "
                   "tracked objects' states hold as pickles (an Enum, a deque, an object of "
                   "your own class), which it refuses otherwise; only for a store you "
                   "trust: unpickling runs code that the store names")
    @argument("--on-signal", default=None, metavar="SIGNALS",
              help="the signals that save at the next consistent point and then end the "
              "process as they ask, comma-separated without spaces (TERM,USR1); the default "
              "is TERM (a preemption's or a job's end), none turns it off; in a kernel the "
              "cell stops, saying so")
    @argument("--sync", action="store_true", help="save on the training thread "
              "(%%config CkptMagics.sync = True: every session does)")
    @argument("--off", action="store_true", help="stop the line form's checkpointing of "
              "the session (%%ckpt_auto --off), letting go of its buffers")
    @line_cell_magic
    def ckpt_auto(self, line: str, cell: str | None = None) -> Any:
        """Checkpoint training automatically: for one cell (%%) or the session (%).

        Any save, whichever trigger or the cell's end takes it, restarts the count of
        --every-steps and the clock of --every / --every-seconds.
        """
        __tracebackhide__ = True
        if _help_shown(self.ckpt_auto, line, cell):
            return None
        # A negative value would be taken for an option ("expected one argument"): bind it
        # to its option, for the check that names it.
        line = _NEGATIVE_VALUE.sub(r"\1=\2", line)
        args = _arguments(self.ckpt_auto, line)
        if args.off:
            self._stop_line_form(line, cell)
            return None
        if cell is None and args.no_resume:  # (an ignored one would look obeyed)
            raise UsageError("%ckpt_auto: --no-resume is a %%ckpt_auto cell's (it resumes the "
                             "cell's unfinished run); the line form resumes no run")
        if cell is None and args.trust_pickle:
            raise UsageError("%ckpt_auto: --trust-pickle is a %%ckpt_auto cell's (its resume "
                             "loads the pickles); the line form resumes no run: "
                             "%ckpt_rollback ID --trust-pickle loads them in a rollback")
        try:
            config = self._config(args)
        except ValueError as exc:
            raise UsageError(f"%ckpt_auto: {exc}") from None
        if cell is None:
            self._start_line_session(config)
            return None
        session = self._start(config, nested=True)
        try:
            try:
                session.begin_cell(cell, cell_id=self._cell_id, store_from=None if args.dir
                                   else "CkptMagics.default_dir" if self.default_dir
                                   else "the default store")
            except CaptureError as exc:  # (a --track name not defined: nothing ran)
                raise UsageError(f"%ckpt_auto: {_magic_wording(exc)}") from None
            try:
                value = self._run(cell)
            except BaseException as exc:
                session.end_cell(exc)
                raise
            session.end_cell()  # (raises KeyboardInterrupt for an interrupt it swallowed)
        finally:
            stop = session.close()  # (an interrupt meanwhile: held until it is done)
        if stop is not None:
            raise stop
        return value

    def _config(self, args: Any) -> AutoConfig:
        for name in ("dir", "every", "every_seconds", "on", "track", "on_signal"):
            setattr(args, name, _unquoted(getattr(args, name)))
        if args.every is not None and args.every_seconds is not None:
            raise ValueError("--every and --every-seconds say the same: give one of them")
        for name in ("on", "track"):  # (an empty one would switch itself off unseen)
            if getattr(args, name) is not None and not getattr(args, name).strip(" ,"):
                raise ValueError(f"--{name} is empty: name what it should "
                                 + ("watch (METRIC:min)" if name == "on" else "track (a,b)"))
        for name in ("every_steps", "keep", "keep_best"):  # (AutoConfig's say keep_best=)
            value = getattr(args, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, "
                                 f"not {value}")
        if args.keep_best is not None and not args.on:
            raise ValueError("--keep-best ranks by a metric: give --on METRIC:min|max too")
        every = args.every if args.every is not None else args.every_seconds
        every_seconds = parse_duration(every) if every is not None else None
        on = parse_metric_trigger(args.on) if args.on else None
        return AutoConfig(  # (which checks the values)
            directory=args.dir or self._default_store(),
            every_steps=args.every_steps,
            every_seconds=every_seconds, on=on, keep=args.keep, keep_best=args.keep_best,
            strategy=args.strategy,
            track=[n.strip() for n in args.track.split(",") if n.strip()] if args.track else None,
            resume=not args.no_resume, sync=args.sync or self.sync,
            trust_pickle=args.trust_pickle,
            max_variable_bytes=self.max_variable_mb << 20, magic=True,
            **({} if args.on_signal is None else {"save_on_signals": args.on_signal}))

    def _start(self, config: AutoConfig, *, nested: bool) -> session_mod.AutoSession:
        """Start a session; a store that cannot be opened (a --dir that is a file, say)
        is a usage error, not a traceback from deep inside the store."""
        __tracebackhide__ = True
        try:
            return session_mod.start(config, self.shell.user_ns, nested=nested)
        except (CkptError, ValueError) as exc:  # (ValueError: a URL no storage takes)
            text = str(exc)
            if text.endswith(UNWRITABLE_STORE):  # (a read-only notebook folder, say)
                text = text.removesuffix(UNWRITABLE_STORE) + (
                    " (a folder this kernel cannot write), the default store: give --dir DIR "
                    "in a folder it can write, or %config CkptMagics.root_dir = \"DIR\" "
                    "(the folder of the default stores)"
                    if config.directory == self._default_store()
                    else UNWRITABLE_STORE.replace("process", "kernel"))
            raise UsageError(f"%ckpt_auto: {text}") from None

    def _cell_number(self) -> int:
        """The number IPython gave the running cell, so that a traceback of the cell's
        body says "Cell In[7]" as the cell's own line does (read from the frame that
        runs the cell: IPython 8 and 9 count executions at different moments)."""
        numbers = getattr(self.shell.compile, "_filename_map", {})
        frame = sys._getframe(1)
        while frame is not None:
            number = numbers.get(frame.f_code.co_filename)
            if number is not None:
                return int(number)
            frame = frame.f_back
        return int(self.shell.execution_count)

    def _run(self, cell: str) -> Any:
        """Run the cell's code in the user namespace; the last expression is the value."""
        __tracebackhide__ = True
        source = self.shell.transform_cell(cell)
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:  # shown as IPython shows a cell's, without our frames
            exc.filename = f"Cell In[{self._cell_number()}]"
            shown = "".join(traceback.format_exception_only(exc)).rstrip()
            raise UsageError(f"%%ckpt_auto: the cell does not parse\n{shown}") from None
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        filename = self.shell.compile.cache(source, self._cell_number(), raw_code=cell)
        namespace = self.shell.user_ns
        exec(compile(tree, filename, "exec"), namespace)  # noqa: S102 - the user's own cell
        if last is not None:
            expression = ast.Expression(last.value)
            return eval(compile(expression, filename, "eval"), namespace)  # noqa: S307
        return None

    def _start_line_session(self, config: AutoConfig) -> None:
        earlier = self._line_session
        if earlier is not None and config.directory in (None, earlier.config.directory) and \
                dataclasses.replace(config, directory=earlier.config.directory) == earlier.config:
            print("ckpt_nb: %ckpt_auto again with the same options: checkpointing restarts, "
                  "and each trigger's count with it")  # (a cell run again, most often)
        elif earlier is not None:  # (its triggers and retention went without a word)
            status = earlier.status()
            kept = [f"{label} {value}" for label, value in (
                ("keep", earlier.config.keep), ("keep best", earlier.config.keep_best)) if value]
            print(f"ckpt_nb: this %ckpt_auto replaces the session's earlier one, which stops "
                  f"({status['directory']}: {', '.join(status['triggers'] + kept)})")
        self.stop_line_session()
        session = self._start(config, nested=False)
        store = location(session.manager.store)
        session.say(session.rediscover().summary() + f" -> {store}")  # (a path, as a cell's)
        # (as a cell's run: steps count on from the checkpoint the model came from, never
        # below its parent's, and a model a stopped run trained past it is said)
        session._count_on()
        session._tell_left_unsaved()
        self._line_session = session
        self.shell.events.register("pre_run_cell", self._pre_run_cell)
        self.shell.events.register("post_run_cell", self._post_run_cell)

    def _pre_run_cell(self, info: Any) -> None:
        if self._line_session is not None and session_mod.active() is self._line_session:
            self._line_session.begin_line_cell()

    def _post_run_cell(self, result: Any) -> None:
        session = self._line_session
        if session is not None and session_mod.active() is session:
            session.end_cell(result.error_in_exec, final=False)

    def _stop_line_form(self, line: str, cell: str | None) -> None:
        __tracebackhide__ = True
        if cell is not None or line.split() != ["--off"]:
            raise UsageError("%ckpt_auto: --off takes no other option, and no cell: it stops "
                             "the line form (%ckpt_auto --off)")
        session = self._line_session
        if session is None:
            print("ckpt_nb: the session is not being checkpointed (%ckpt_auto starts it)")
            return
        self._stop_line_session_saying("stopped checkpointing the session")

    def _stop_line_session_saying(self, stopped: str, then: str = "") -> None:
        """Stop the line form, saying so with its latest checkpoint: "ckpt_nb: {stopped};
        its latest checkpoint is ID (step S){then}"."""
        session = self._line_session
        session.writer.wait()  # (the write in flight is where it stands once in)
        # Where the session stands (its last save, or a rollback's checkpoint): not the
        # writer's last save, a newer one after a rollback. (Read before its catalog closes.)
        latest = session._latest() if session._position else None
        self.stop_line_session()
        print(f"ckpt_nb: {stopped}" + (f"; its latest checkpoint is {latest}" if latest else "")
              + then)

    def stop_line_session(self) -> None:
        if self._line_session is None:
            return
        for event, callback in (("pre_run_cell", self._pre_run_cell),
                                ("post_run_cell", self._post_run_cell)):
            try:
                self.shell.events.unregister(event, callback)
            except ValueError:
                pass
        self._line_session.close()
        self._line_session = None

    # -- the other magics -----------------------------------------------------------------
    def _store_to_open(self, magic: str, nothing: str, again: str) -> str:
        """The store a magic given no DIR opens: the active or last session's, else (a
        new kernel, after a crash, say) the default store %%ckpt_auto writes to where one
        is there, said on the output's first line. A usage error naming the default store
        looked at where there is none: "%magic: {nothing} (...): {again}"."""
        __tracebackhide__ = True
        store = session_mod.last_directory()
        if store is not None:
            return store
        store = self._default_store()
        try:
            found = store_exists(store)
        except (CkptError, ValueError) as exc:  # (a backend that fails, a bad URL)
            raise UsageError(f"%{magic}: {exc}") from None
        if not found:
            raise UsageError(f"%{magic}: {nothing} (no %ckpt_auto or %%ckpt_auto cell has run "
                             "in this kernel, and there is no checkpoint store at "
                             f"{store}, the default one): {again}")
        print(f"ckpt_nb: no session in this kernel: %{magic} opens the default store, {store}")
        return store

    @magic_arguments()
    @argument("which", metavar="ID|latest|best|-N", help="ID (or prefix); latest, the "
              "store's newest checkpoint; best; or -N, the checkpoint saved N before latest "
              "(-1 the one just before it), counted in save order over the whole store "
              "(every cell's runs and branches), not back along a branch")
    @argument("--dir", default=None, help="store directory (default: the session's, else "
              "in a new kernel the default store, where it is there)")
    @argument("--on", default=None, metavar="METRIC[:min|max]",
              help="rank best by METRIC for this rollback alone, "
              "as a %%%%ckpt_auto cell's --on takes it (METRIC:min or METRIC:max, or a bare "
              "name that says which way is better): a store saved without --on has no "
              "metric to rank by; the store's own is left as it is")
    @argument("--trust-pickle", action="store_true",
              help="unpickle the values that the objects' states hold as pickles (an Enum, "
              "a deque, an object of your own class), which a rollback refuses otherwise; "
              "only for a store you trust: unpickling runs code that the store names")
    @line_magic
    def ckpt_rollback(self, line: str) -> None:
        """%ckpt_rollback ID|latest|best|-N [--dir DIR] [--on METRIC[:min|max]]
        [--trust-pickle]: restore tracked state in place. -1 is the checkpoint saved just
        before latest (the store's newest), -2 the one before that."""
        if _help_shown(self.ckpt_rollback, line):
            return
        # (none named is refused: latest, taken for it, dropped what the kernel trained since)
        try:
            args = _arguments(self.ckpt_rollback, line)
        except UsageError as exc:
            if "arguments are required" in str(exc):
                _refuse_repeats(self.ckpt_rollback, line)  # (said first, as where one is named)
                raise UsageError(_ROLLBACK_WHICH_MISSING) from None
            raise
        on = _unquoted(args.on)
        if on is not None and _unquoted(args.which) != "best":  # (ignored, it looks obeyed)
            raise UsageError(f"%ckpt_rollback: --on ranks best and nothing else: "
                             f"%ckpt_rollback {args.which} takes none")
        try:
            ranking = parse_metric_trigger(on) if on is not None else None
        except ValueError as exc:
            raise UsageError(f"%ckpt_rollback: {exc}") from None
        directory, which = _unquoted(args.dir), _unquoted(args.which)
        default = None if directory is not None or session_mod.last_directory() is not None \
            else self._store_to_open(
                "ckpt_rollback", "no store to roll back from",
                f"%ckpt_rollback {args.which} --dir PATH (the store's directory)")
        directory = directory or default
        store = directory if directory is not None else session_mod.last_directory()
        try:
            with warnings_worded(*_RANK_BY_ANOTHER):
                session_mod.rollback(which, directory=directory, namespace=self.shell.user_ns,
                                     on=ranking, trust_pickle=args.trust_pickle)
        except UntrustedPickleError as exc:  # (the store is found: no "it looked in")
            raise UsageError("%ckpt_rollback: " + _magic_wording(exc, store).replace(
                TRUST_PICKLE_ROLLBACK, f"%ckpt_rollback {line.strip()} --trust-pickle")) from None
        except (CkptError, ValueError) as exc:  # (ValueError: a URL no storage knows)
            text = _magic_wording(exc, store)
            # (a checkpoint named by id was found: another store would not make it fit)
            found = isinstance(exc, StateMismatchError) and \
                which not in ("latest", "best") and re.fullmatch(r"-\d+", which) is None
            where = _where_it_looked(text, store, line) \
                if directory in (None, default) and not found \
                else _spaced_dir_hint(line, which) if text.startswith("no checkpoint store") \
                else ""
            raise UsageError(f"%ckpt_rollback: {text}{where}") from None

    @line_magic
    def ckpt_list(self, line: str) -> Any:
        """%ckpt_list [DIR] (or --dir DIR, as %ckpt_rollback takes it): the store as a
        table (by default the active or last session's, else the default store where it
        is there, as %ckpt_rollback and %ckpt_ui take). The rest of the line is DIR: a
        path with spaces needs no quotes."""
        if _help_shown(self.ckpt_list, line):
            return None
        directory = _directory("ckpt_list", line)
        session = session_mod.active()
        if session is not None and directory is None:
            return session.manager.list()
        directory = directory or self._store_to_open("ckpt_list", "no store to list",
                                                       "%ckpt_list DIR")
        try:
            if not store_exists(directory):
                raise UsageError(f"%ckpt_list: no checkpoint store at {directory}"
                                 f"{why_no_store(directory)}")
            with session_mod.listing_manager(directory) as manager:  # (its metric: best)
                return manager.list()
        except (CkptError, ValueError) as exc:  # (a store that does not open, a backend
            raise UsageError(f"%ckpt_list: {exc}") from None  # that fails, a bad URL)

    @line_magic
    def ckpt_ui(self, line: str) -> Any:
        """%ckpt_ui [DIR] (or --dir DIR, as %ckpt_rollback takes it): the explorer for DIR,
        or for the active or last session's store, else the default store; where that is
        not there yet, the explorer waits for the first %%ckpt_auto cell and shows its store
        (wherever its --dir puts it). The rest of the line is DIR: a path with spaces needs
        no quotes."""
        if _help_shown(self.ckpt_ui, line):
            return None
        if _terminal(self.shell):  # (it showed the widget's repr, and polled on unseen)
            shown = f"%ckpt_list {line.strip()}".strip()
            raise UsageError("%ckpt_ui: the explorer is a widget, which the terminal IPython "
                             f"cannot show: {shown} shows the store here (ckpt-nb ls DIR in "
                             "a shell), and %ckpt_ui opens the explorer in Jupyter "
                             "(JupyterLab, Notebook 7, VS Code)")
        from ._explorer import explore

        directory = _directory("ckpt_ui", line)
        # Given no DIR in a kernel that has run no session, the default store, which the
        # first %%ckpt_auto cell makes: followed till it is there (the explorer opened
        # above the training cell, to watch it fill); a DIR given that is not there is
        # refused (a typo).
        wait = directory is None and session_mod.last_directory() is None
        if wait:
            directory = self._default_store()
            try:
                found = store_exists(directory)
            except (CkptError, ValueError) as exc:  # (a backend that fails, a bad URL)
                raise UsageError(f"%ckpt_ui: {exc}") from None
            print(f"ckpt_nb: no session in this kernel: %ckpt_ui opens the default store, "
                  f"{directory}" + ("" if found else ", not made yet: the first %%ckpt_auto "
                                    "cell's checkpoints show as it saves them"))
        directory = directory or self._store_to_open(
            "ckpt_ui", "no store to explore", "%ckpt_ui DIR")
        try:
            ui = explore(directory, namespace=self.shell.user_ns, wait=wait)
        except CkptError as exc:
            raise UsageError(f"%ckpt_ui: {exc}") from None
        if wait:  # (a first cell's %%ckpt_auto --dir elsewhere: that store, as %ckpt_ui opens)
            ui._follow_first_session()
        return ui

    @line_magic
    def ckpt_status(self, line: str) -> None:
        """%ckpt_status: what is tracked, the triggers, the last save, pending writes."""
        if _help_shown(self.ckpt_status, line):
            return
        if line.strip():  # (an ignored one would look obeyed: "%ckpt_status DIR", say)
            raise UsageError(f"%ckpt_status takes no arguments, not {line.strip()!r}: it "
                             "shows the active session; %ckpt_list DIR shows a store")
        status = session_mod.status()
        if not status.pop("active"):
            last, default = session_mod.last_directory(), None
            if last is None:
                store = self._default_store()
                with contextlib.suppress(CkptError, ValueError):  # (a URL that fails)
                    default = store if store_exists(store) else None
            print("ckpt_nb: no session active (run %ckpt_auto or a %%ckpt_auto cell)"
                  + (f"; the last one's store, {last}, is what %ckpt_list, %ckpt_rollback "
                     "and %ckpt_ui open" if last is not None else
                     f"; the default store, {default}, is what %ckpt_list, %ckpt_rollback "
                     "and %ckpt_ui open" if default is not None else ""))
            return
        for key, value in status.items():
            print(f"{key:>14}: {value}")


def _terminal(shell: Any) -> bool:
    """Whether ``shell`` is the terminal IPython's (``ipython``, ``ipython -c``, ``ipython
    script.ipy``), which shows no widget: a widget's text is all it prints."""
    return any(kind.__name__ == "TerminalInteractiveShell" for kind in type(shell).__mro__)


def load(shell: Any) -> CkptMagics:
    __tracebackhide__ = True
    try:
        magics = CkptMagics(shell)
    except TraitError as exc:  # (the shell keeps a %config value refused before, to reload)
        # (the instance put itself in the shell's configurables before it failed)
        shell.configurables[:] = [c for c in shell.configurables if not isinstance(c, CkptMagics)]
        raise UsageError(f"%load_ext ckpt_nb: {exc}: set it again, %config "
                         "CkptMagics.NAME = VALUE, then %load_ext ckpt_nb") from None
    shell.register_magics(magics)
    shell.events.register("pre_run_cell", magics.note_cell)
    return magics


def unload(shell: Any, magics: CkptMagics) -> None:
    with contextlib.suppress(ValueError):
        shell.events.unregister("pre_run_cell", magics.note_cell)
    with contextlib.suppress(ValueError):  # (%config set each unloaded one, and said each
        shell.configurables.remove(magics)  # refusal once per %load_ext)
    if magics._line_session is not None:  # (%reload_ext too: it went on unseen, saving nothing)
        magics._stop_line_session_saying("unloading stopped checkpointing the session",
                                         ": %ckpt_auto starts it again")
    session_mod.stop()
    table = shell.magics_manager.magics
    for kind, names in MAGIC_NAMES.items():
        for name in names:
            table[kind].pop(name, None)


def _help_shown(magic: Any, line: str, cell: str | None = None) -> bool:
    """Print the magic's help where its line has a word ``-h`` or ``--help`` (as argparse
    takes it, wherever it stands), and say so: the magic then does nothing else. The
    magics' parsers have no -h of their own (IPython's make none), which made ``-h`` a
    usage error, or a store or checkpoint named "-h"."""
    try:
        words = arg_split(line)
    except ValueError:  # (an unclosed quote: the words as they stand)
        words = line.split()
    if not _HELP_WORDS.intersection(words):
        return False
    print(_help_text(magic))
    if cell is not None:
        print(f"\n(help only: the %%{magic.__name__} cell was not run)")
    return True


_HELP_WORDS = frozenset({"-h", "--help"})


def _help_text(magic: Any) -> str:
    """The text ``%magic?`` shows: an argparse magic's usage opens it as a reST literal
    block ("::", then the usage indented), shown here as the usage alone, its wrapped
    lines under its first option (argparse indented them by the "::" too)."""
    doc = magic.__doc__ or ""
    if not doc.startswith("::\n\n"):
        return inspect.cleandoc(doc)
    usage, _, rest = doc.removeprefix("::\n\n").partition("\n\n")
    first, *wrapped = usage.splitlines()
    indent = " " * (len(magic.__name__) + 2)  # ("%ckpt_auto ")
    return "\n".join([first.strip(), *(indent + line.strip() for line in wrapped),
                      "", rest.strip()])


def _arguments(magic: Any, line: str) -> Any:
    """The magic's parsed arguments; argparse's complaint (and an unclosed quote) is
    named with the magic, as the magic's own errors are."""
    __tracebackhide__ = True
    try:
        args = parse_argstring(magic, line)
    except (UsageError, ValueError) as exc:
        hint = _other_option_hint(magic, line) or _misspelt_option_hint(magic, line) \
            or _stray_words_hint(magic, line) if str(exc).startswith("unrecognized") else ""
        raise UsageError(f"%{magic.__name__}: {exc}{hint}") from None
    _refuse_repeats(magic, line)
    return args


# Other tools' options (the CLI's, CheckpointManager's, Lightning's), and the magics' own
# option for each, which the magic names where it has that option.
_OTHER_OPTIONS = {"--metric": "--on METRIC:min|max", "--mode": "--on METRIC:min|max",
                  "--monitor": "--on METRIC:min|max", "--max-to-keep": "--keep N",
                  "--save-top-k": "--keep-best K", "--every-n-train-steps": "--every-steps N"}


def _other_option_hint(magic: Any, line: str) -> str:
    """For an option the magic does not take but another tool spells so (``%ckpt_rollback
    best --metric val_loss``, as ``ckpt-nb`` takes it): the magic's own; "" otherwise."""
    for token in arg_split(line):
        name = token.partition("=")[0]
        meant = _OTHER_OPTIONS.get(name)
        if meant is not None and _option_action(magic, name) is None and \
                _option_action(magic, meant.split()[0]) is not None:
            return f": {name} is {meant} here"
    return ""


def _misspelt_option_hint(magic: Any, line: str) -> str:
    """For an option the magic does not take that is one of its own misspelt
    (``--every-secs``, ``--keepbest``, ``--no_resume``, ``-every-steps``): the one meant,
    or the two it is as close to; "" otherwise (``--bogus``)."""
    for token in arg_split(line):
        name = token.partition("=")[0]
        if not name.startswith("-") or _ROLLBACK_BACK.fullmatch(name) \
                or _option_action(magic, name) is not None:
            continue
        close = options_meant(name, magic.parser._option_string_actions)
        if close:
            return f": did you mean {' or '.join(close)}?"
    return ""


def _option_action(magic: Any, option: str) -> Any:
    """The argparse action of ``option`` (``--every-s`` too: argparse takes a prefix of
    one option for it), or None."""
    actions = magic.parser._option_string_actions  # (option string -> its action)
    action = actions.get(option)
    if action is None:
        found = {action for string, action in actions.items() if string.startswith(option)}
        action = found.pop() if len(found) == 1 else None
    return action


_ROLLBACK_WHICH_MISSING = (
    "%ckpt_rollback: name the checkpoint to roll back to, nothing was changed: "
    "%ckpt_rollback ID (or a prefix of it, as %ckpt_list shows), latest (the store's newest), "
    "best, or -N (the one saved N before latest: -1 the one just before it)")
_ROLLBACK_BACK = re.compile(r"-\d+")  # (%ckpt_rollback -N: the positional, not an option)


def _stray_words_hint(magic: Any, line: str) -> str:
    """What words no option took ("unrecognized arguments") were meant as, where that is
    clear: a store given bare, as %ckpt_list and %ckpt_ui take it (``%%ckpt_auto
    runs/o``, or ``--keep 2 runs/o``: a path after an option's value), the names of
    ``--track model, opt`` after its comma, a ``--dir`` with a space unquoted; ""
    otherwise. Each hint pastes as it is: the words lose their quotes, and a path with a
    space is quoted once."""
    option, value, strays = None, "", []  # (the option whose value the strays follow)
    takes_value = off = known = False  # (known: option is one the magic takes)
    positionals = sum(not action.option_strings for action in magic.parser._actions)
    for token in arg_split(line):
        if takes_value:
            value, takes_value = token, False
        elif positionals and (not token.startswith("-") or _ROLLBACK_BACK.fullmatch(token)):
            positionals -= 1  # (%ckpt_rollback's ID or -N: taken)
        elif not token.startswith("-"):
            strays.append(token)
        elif strays:  # (the first run of them is the one said)
            break
        else:
            name, equals, value = token.partition("=")
            action = _option_action(magic, name)
            off = off or (action is not None and action.dest == "off")
            takes_value = action is not None and action.nargs is None and not equals
            option = name if action is None else action.option_strings[0] \
                if action.nargs is None else None  # (a flag's strays follow no value)
            known = action is not None
    words = [str(_unquoted(word)) for word in strays]
    if not strays or off:  # (--off takes no other option: a --dir hint would be refused)
        return ""
    given = [n for word in [value, *words] for n in word.split(",") if n]
    # (--track model, opt; --track model opt, names alone: not --track model,opt extra)
    if option == "--track" and (value.endswith(",") or "," not in value
                                and all(n.isidentifier() for n in given)):
        return f": give --track its names without spaces, --track {','.join(given)}"
    if option == "--dir":
        spaced = _unquoted(value) != value and " " in value  # (quoted already: not it)
        paths = "/" in value and any("/" in word for word in words)  # (a second store)
        quotes = any(q in word for word in [str(_unquoted(value)), *strays] for q in "'\"")
        if spaced or paths or quotes:
            return ""
        path = " ".join([str(_unquoted(value)), *words])
        return f": quote a --dir with spaces, --dir {_quoted(path)}"
    store = " ".join(words)
    if magic.__name__ == "ckpt_auto" and (option is None or known and "/" in store):
        return f": %ckpt_auto and %%ckpt_auto take the store as --dir {_quoted(store)}"
    return ""


def _spaced_dir_hint(line: str, which: str) -> str:
    """For ``%ckpt_rollback --dir my runs``, where argparse took ``runs`` for the ID and
    found no store at ``my``: that a --dir with a space is quoted; "" otherwise."""
    tokens = arg_split(line)
    for i, token in enumerate(tokens[:-2]):
        if token == "--dir" and _unquoted(tokens[i + 1]) == tokens[i + 1] \
                and tokens[i + 2] == which:
            return f"; quote a --dir with spaces, --dir \"{tokens[i + 1]} {which}\""
    return ""


def _quoted(path: str) -> str:
    """A path as an option's value: quoted where it has a space."""
    return f'"{path}"' if " " in path else path


def _refuse_repeats(magic: Any, line: str) -> None:
    """An option given twice: argparse keeps the last, silently (``--every-steps 5
    --every-steps 10``), which may not be the one meant."""
    __tracebackhide__ = True
    seen: set[str] = set()
    for token in arg_split(line):
        option = token.split("=", 1)[0]
        if not option.startswith("--"):
            continue
        action = _option_action(magic, option)
        if action is None:
            continue
        if action.dest in seen:
            raise UsageError(f"%{magic.__name__}: {action.option_strings[0]} is given twice: "
                             "give it once")
        seen.add(action.dest)


def _directory(magic: str, line: str) -> str | None:
    """The DIR of ``%magic [DIR]`` or ``%magic --dir DIR`` (the rest of the line, so a
    path with spaces needs no quotes), or None where the line names none."""
    text = line.strip()
    flag = re.fullmatch(r"--dir(?:[\s=]\s*(.*))?", text, re.DOTALL)
    if flag:
        if not flag.group(1):
            raise UsageError(f"%{magic} --dir needs a directory: %{magic} --dir DIR")
        text = flag.group(1)
    elif text.startswith("-"):  # (taken for a store's name, it said "no store at --frob")
        option = text.split()[0]
        raise UsageError(f"%{magic}: unknown option {option}: it takes DIR or --dir DIR "
                         f"(a directory whose name begins with '-' is quoted: '{text}')"
                         + _OPTIONS_ELSEWHERE[magic])
    # An option after the store ("runs --all-metrics", as ckpt-nb ls takes it) was taken
    # for part of the store's name: "no checkpoint store at runs --all-metrics".
    option_after = _OPTION_AFTER_STORE.search(text) if _unquoted(text) == text else None
    if option_after:
        raise UsageError(f"%{magic}: unknown option {option_after.group(1)}: it takes DIR or "
                         f"--dir DIR and no option (a directory with ' -' in its name is "
                         f"quoted: '{text}')" + _OPTIONS_ELSEWHERE[magic])
    return _unquoted(text) or None


_OPTION_AFTER_STORE = re.compile(r"\s(--?[A-Za-z][\w-]*)")
# Where the options of a store magic that takes none are (its one-line call as a function).
_OPTIONS_ELSEWHERE = {
    "ckpt_list": "; in a cell, !ckpt-nb ls DIR takes ls's options (--branch, --all-metrics, "
                 "--metric ...)",
    "ckpt_ui": "; ckpt_nb.explore(DIR, poll_seconds=S) takes the explorer's options",
}


# The manager's way to rank "best" by another metric, which a rollback takes as --on.
_RANK_BY_ANOTHER = (RANK_BY_ANOTHER, "%ckpt_rollback best --on METRIC:min|max ranks by another")
# The Python API's words for what a notebook does with a magic (the CLI has its own).
_MAGIC_WORDS = {
    UNRANKED_BEST_WAYS: "%ckpt_rollback best --on METRIC:min|max, or roll back by id "
                        "(%ckpt_list, then %ckpt_rollback ID)",
    "--track (track=)": "--track",
    "list() (ckpt-nb ls)": "%ckpt_list",
    session_mod.STORE_MOVED_WAY_ON: "give its new place as --dir",
    _RANK_BY_ANOTHER[0]: _RANK_BY_ANOTHER[1],
}


def _magic_wording(error: Exception, store: str | None = None) -> str:
    """An error of the Python API in the magics' words, naming a local ``store`` by the
    folder the user gave (``--dir store``), not by the file:// URL the API names it by
    (as ``LocalStore`` makes it: absolute, links not followed)."""
    text = str(error)
    for api, magic in _MAGIC_WORDS.items():
        text = text.replace(api, magic)
    if store and ("://" not in store or store.startswith(LOCAL_SCHEMES)):
        folder = file_url_path(store) if "://" in store else store
        text = text.replace(Path(folder).expanduser().absolute().as_uri(), store)
    return text


def _where_it_looked(text: str, store: str | None, line: str) -> str:
    """What a rollback error on the session's store (the line gave no --dir) adds: that
    store, where ``text`` does not name it ("... in STORE", "... at STORE"), and how to
    name another. In a notebook that ran several, "no checkpoint has the metric", "-1 is
    too far back" or an id not found may say the last cell's store is the wrong one."""
    named = store is None or f" in {store}" in text or f" at {store}" in text
    whose = "the default store" if session_mod.last_directory() is None else \
        f"the store of the {'active' if session_mod.active() else 'last'} session"
    again = " ".join(part for part in ("%ckpt_rollback", line.strip(), "--dir PATH") if part)
    return (f"; it looked in{'' if named else f' {store},'} {whose}: for a checkpoint of "
            f"another store, {again}")


def _unquoted(value: str | None) -> str | None:
    """An argument without the quotes around it: IPython's magic arguments keep them
    (``--dir "my runs"`` would name a folder with quotes in its name)."""
    if value is not None and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value
