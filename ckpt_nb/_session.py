"""The session behind ``%ckpt_auto``: triggers, loop helpers, background saves,
resume and rollback. Pure Python: the magics are a thin skin over it, and
scripts can use it directly through ``ckpt_nb.auto()``.

A save is taken only at a *consistent point*, where the loop body is complete:
when ``batches()`` hands out the next batch, at an epoch boundary, or (in a
loop without the helpers) right after an optimizer step. The training thread
only copies the state there; compression and I/O run on a writer thread.
"""

from __future__ import annotations

import _thread
import ast
import builtins
import contextlib
import copy
import ctypes
import dataclasses
import datetime
import difflib
import functools
import gc
import hashlib
import inspect
import itertools
import json
import keyword
import linecache
import math
import numbers
import operator
import os
import random
import re
import reprlib
import signal
import site
import socket
import sqlite3
import sys
import sysconfig
import textwrap
import threading
import time
import types
import uuid
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from pathlib import Path, PurePath
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
import xxhash
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)

from ._capture import (RestoreInterrupts, RNGState, SnapshotBuffers, Stateful, as_stateful,
                       load_all, rng_problem, unwrap, unwrap_state)
from ._catalog import CheckpointRow
from ._discovery import (_HIDDEN, _MAX_DEPTH, Discovery, GeneratorState, LoopIterator, NotState,
                         RandomState, _is_stateful, assign_in_place, code_run_by, discover,
                         _quietly_held, from_storable, helper_accumulators, is_code,
                         loader_random, names_bound, refillable, saved_ids, skipped_text,
                         parts_of, to_storable, warn_persistent_workers)
from ._errors import (RANK_BY_ANOTHER, CaptureError, CheckpointNotFoundError, CkptError,
                      CorruptCheckpointError, MetricNotFoundError, ParameterOrderError,
                      StateMismatchError, UntrustedPickleError, check_flag, tell, warn,
                      warnings_worded)
from ._format import RUN_KEY, is_count, run_key
from ._metric_names import metric_mode_from_name
from ._manager import (RESERVED, STRATEGIES, Checkpoint, CheckpointManager, PickledValue,
                       as_metric)
from ._run_records import written_keep_best
from ._store import (LOCAL_SCHEMES, canonical_url, file_url_path, location, store_exists,
                     why_no_store)

if TYPE_CHECKING:
    import pandas as pd

_ENDED = "ckpt_nb_run_end:"  # + a run's id: the catalog's key of the checkpoint it ended at


class History:
    """The metrics ``log()`` recorded, a record per call, kept by column too as they
    come: a save stores each column whole (a float column as float64 bytes, whose
    unchanged head the store already has), where a list of records cost a JSON
    encoding per record at every save (a second a save after 16k steps)."""

    def __init__(self, records: Iterable[dict[str, Any]] = ()) -> None:
        self._records: list[dict[str, Any]] = []
        self._shapes: dict[tuple[str, ...], int] = {}  # key tuple -> its index
        self._runs: list[list[int]] = []  # [shape index, how many records in a row]
        self._columns: dict[str, list[Any]] = {}
        for record in records:
            self.append(record)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._records)

    def __getitem__(self, index: Any) -> Any:
        return self._records[index]

    def append(self, record: dict[str, Any]) -> None:
        self._records.append(record)
        shape = tuple(record)
        index = self._shapes.setdefault(shape, len(self._shapes))
        if self._runs and self._runs[-1][0] == index:
            self._runs[-1][1] += 1
        else:
            self._runs.append([index, 1])
        for key, value in record.items():
            self._columns.setdefault(key, []).append(value)

    def storable(self) -> dict[str, Any]:
        return {"keys": [list(shape) for shape in self._shapes], "runs": self._runs,
                "columns": self._columns}

    @classmethod
    def from_storable(cls, stored: Any) -> History:
        """The history a checkpoint holds: by column, or (saved before) as records."""
        if isinstance(stored, list):
            return cls(stored)
        try:
            shapes = [tuple(keys) for keys in stored["keys"]]
            if () in shapes:  # (a record holds step and epoch: the values bound its runs)
                raise ValueError("records of no metrics, whose counts no values bound")
            columns = {key: iter(values) for key, values in stored["columns"].items()}
            records = [{key: next(columns[key]) for key in shapes[index]}
                       for index, count in stored["runs"] for _ in range(count)]
            if any(next(values, records) is not records for values in columns.values()):
                raise ValueError("a column holds more values than its records")
        except (KeyError, IndexError, TypeError, ValueError, StopIteration) as exc:
            raise CorruptCheckpointError(f"the run's metric history is malformed ({exc!r})") \
                from exc
        return cls(records)


# auto() keywords spelt as the magic's options or as other tools name them, and what
# auto() takes for them
_OTHER_SPELLINGS = {"dir": "directory", "no_resume": "resume=False",
                    # (CheckpointManager's, Lightning's and Orbax's names for auto()'s own)
                    "max_to_keep": "keep (CheckpointManager's max_to_keep)",
                    "save_top_k": "keep_best with on=(METRIC, 'min'|'max')",
                    "metric": "on=(METRIC, 'min'|'max')",
                    "monitor": "on=(METRIC, 'min'|'max')",
                    "mode": "on=(METRIC, 'min'|'max')",
                    "every_n_train_steps": "every_steps",
                    "save_interval_steps": "every_steps",
                    "every_n_epochs": "on=(METRIC, ...) with a log() at each epoch's end, or "
                                      "session.save() there (every_steps counts optimizer "
                                      "steps, not epochs)",
                    "train_time_interval": "every (seconds, or '10min')"}


@dataclass
class AutoConfig(NotState):
    """The options of a ``%%ckpt_auto`` cell or a ``ckpt_nb.auto()`` block, as read: a
    session's ``config``. ``auto()`` takes each field as a keyword, the magic as the flag
    beside it; None means "not used".

    - ``directory`` (--dir): the store, a folder or a store URL (None: the default one).
    - ``every_steps`` (--every-steps), ``every_seconds`` (--every, --every-seconds): save
      that many optimizer steps, or seconds, after the last save.
    - ``on`` (--on): (METRIC, "min" or "max"): save when ``ckpt_nb.log()``'s METRIC
      improves; with ``keep_best`` K, where it ranks among the K best logged.
    - ``keep`` (--keep), ``keep_best`` (--keep-best): keep the newest N checkpoints of the
      run, the best K by ``on``.
    - ``strategy`` (--strategy): "full", "incremental" or "differential" chunks.
    - ``track`` (--track): the names to track (None: found by discovery).
    - ``resume`` (not --no-resume): resume the cell's unfinished run.
    - ``sync`` (--sync): save on the training thread, not behind it.
    - ``trust_pickle`` (--trust-pickle): a resume unpickles what the states hold as
      pickles (only for a store you trust).
    - ``max_variable_bytes``: the largest plain variable captured.
    - ``save_on_signals`` (--on-signal): the signals (SIGTERM by default) that save at the
      next consistent point and then end the process as the signal asks (a preemption's
      SIGTERM lost every step since the last trigger); () turns it off.
    """

    directory: str | None = None
    every_steps: int | None = None
    every_seconds: float | None = None
    on: tuple[str, str] | None = None  # (metric, "min" | "max")
    keep: int | None = None
    keep_best: int | None = None
    strategy: str = "full"
    track: list[str] | None = None
    resume: bool = True
    sync: bool = False
    trust_pickle: bool = False
    max_variable_bytes: int = 100 << 20
    save_on_signals: tuple[str, ...] = ("SIGTERM",)
    magic: bool = False  # (made by %ckpt_auto: its messages name %config, not auto()'s keywords)

    @classmethod
    def from_keywords(cls, directory: Any, options: dict[str, Any]) -> AutoConfig:
        """``auto()``'s options as a config: ``every=`` is the magic's ``--every``, and a
        keyword it does not take is named with those it does (the dataclass's own
        TypeError named ``AutoConfig.__init__``, which no user calls)."""
        options = dict(options)
        every = options.pop("every", None)
        if every is not None:
            if options.get("every_seconds") is not None:
                raise ValueError("every (--every) and every_seconds (--every-seconds) say the "
                                 "same: give one of them")
            options["every_seconds"] = every
        fields = [f.name for f in dataclasses.fields(cls) if f.name not in ("directory", "magic")]
        for name in options:
            if name not in fields:
                valid = ["directory", "namespace", "name", "every", *fields]
                hint = _OTHER_SPELLINGS.get(name) or next(
                    iter(difflib.get_close_matches(name, valid, n=1)), None)
                raise TypeError(f"auto() got an unexpected keyword argument {name!r}"
                                + (f": did you mean {hint}?" if hint else ".")
                                + f" It takes {', '.join(valid)}")
        try:
            return cls(directory=directory, **options)
        except (TypeError, ValueError) as exc:
            if every is None:
                raise
            message = re.sub(r"every_seconds \(--every(-seconds)?\)", "every (--every)", str(exc))
            raise type(exc)(message) from None  # (named as the caller spelt it)

    def __post_init__(self) -> None:
        """Refuse what would never fire or cannot work, naming the option both ways
        (``auto(every_steps=...)`` and the magic's ``--every-steps``)."""
        self._take_the_magics_forms()
        for name in ("every_steps", "keep", "keep_best"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} (--{name.replace('_', '-')}) must be a positive "
                                 f"integer, not {value!r}")
            setattr(self, name, int(value))  # (a NumPy integer, say)
        if self.every_seconds is not None and not 0 < self.every_seconds < math.inf:
            raise ValueError("every_seconds (--every-seconds) must be positive and finite, "
                             f"not {self.every_seconds!r}")  # (nan and inf never fire)
        if self.keep_best and not self.on:
            raise ValueError("keep_best (--keep-best) ranks by a metric: give on=(METRIC, "
                             "'min'|'max') (--on METRIC:min|max) too")
        if self.on is not None and (len(self.on) != 2 or self.on[1] not in ("min", "max")):
            raise ValueError(f"on (--on) must be (METRIC, 'min' or 'max'), not {self.on!r}")
        if self.on is not None and (not isinstance(self.on[0], str) or not self.on[0].strip()):
            raise ValueError("on (--on) names its metric as ckpt_nb.log() does, by a non-empty "
                             f"string, not {self.on[0]!r}")  # (it would never fire)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy (--strategy) must be {', '.join(STRATEGIES)}, not "
                             f"{self.strategy!r}")

    def _take_the_magics_forms(self) -> None:
        """Read the forms the magic takes as text (``every_seconds="10m"``,
        ``on="loss:min"``, ``track="model,opt"``: a string was split into characters) and
        refuse a value of the wrong type by name, where it failed later as a raw
        TypeError ('<' not supported between int and str) or did something else."""
        if self.directory is not None:
            if not isinstance(self.directory, (str, os.PathLike)):
                raise TypeError(f"directory (--dir) takes a path, not {self.directory!r}")
            self.directory = os.fspath(self.directory)
        if isinstance(self.every_seconds, str):
            try:
                self.every_seconds = parse_duration(self.every_seconds)
            except ValueError as exc:
                raise ValueError(f"every_seconds (--every): {exc}") from None
        elif self.every_seconds is not None:
            if isinstance(self.every_seconds, bool) or \
                    not isinstance(self.every_seconds, numbers.Real):
                raise TypeError("every_seconds (--every-seconds) takes a number of seconds or "
                                "a duration such as '30s', '10m', '1h' or '1d', not "
                                f"{self.every_seconds!r}")
            self.every_seconds = float(self.every_seconds)  # (a NumPy float, say)
        if isinstance(self.on, str):
            self.on = parse_metric_trigger(self.on, keyword=True)
        elif isinstance(self.on, list):
            self.on = tuple(self.on)  # type: ignore[assignment]
        elif self.on is not None and not isinstance(self.on, tuple):
            raise TypeError(f"on (--on) takes (METRIC, 'min' or 'max') or 'METRIC:min', not "
                            f"{self.on!r}")
        if isinstance(self.track, str):
            self.track = [name.strip() for name in self.track.split(",") if name.strip()]
        elif self.track is not None:
            if not isinstance(self.track, (list, tuple)) or \
                    not all(isinstance(name, str) for name in self.track):
                raise TypeError("track (--track) takes names: 'model,opt' or ['model', 'opt'], "
                                f"not {self.track!r}")
            self.track = list(self.track)
        if self.track is not None and not self.track:
            raise ValueError("track (--track) is empty: name what it should track ('model,opt')")
        if not isinstance(self.strategy, str):
            raise TypeError(f"strategy (--strategy) takes a string, not {self.strategy!r}")
        for name, flag in (("resume", "--no-resume"), ("sync", "--sync"),
                           ("trust_pickle", "--trust-pickle")):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} ({flag}) takes True or False, not "
                                f"{getattr(self, name)!r}")
        if isinstance(self.max_variable_bytes, bool) or \
                not isinstance(self.max_variable_bytes, numbers.Integral) or \
                self.max_variable_bytes < 0:
            raise ValueError("max_variable_bytes must be a number of bytes (an integer, 0 or "
                             f"more), not {self.max_variable_bytes!r}")
        self.max_variable_bytes = int(self.max_variable_bytes)
        self.save_on_signals = _signal_names(self.save_on_signals)


# Signals a session does not take: SIGINT is the interrupt (it stops the cell, not the
# process), and SIGKILL and SIGSTOP cannot be caught.
_NOT_SAVED_ON = {"SIGINT": "it is the interrupt, which saves at the next consistent point "
                           "already and stops the cell",
                 "SIGKILL": "it cannot be caught", "SIGSTOP": "it cannot be caught",
                 # (their default does not end the process: ending on one, "as the signal
                 # asks", would end a script at a terminal's resize)
                 **dict.fromkeys(("SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH"),
                                 "its default is to ignore it: it ends nothing"),
                 **dict.fromkeys(("SIGTSTP", "SIGTTIN", "SIGTTOU"),
                                 "its default stops the process, which ends nothing")}


def _signal_names(value: Any) -> tuple[str, ...]:
    """``save_on_signals`` (--on-signal) as signal names: "TERM", "SIGTERM,SIGUSR1", names
    or numbers in a list; "", "none", () or None: none."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [] if value.strip().lower() in ("", "none") else value.split(",")
    elif isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or \
            any(isinstance(v, bool) or not isinstance(v, (str, int)) for v in value):
        raise TypeError("save_on_signals (--on-signal) takes signal names: 'TERM', "
                        f"('SIGTERM', 'SIGUSR1'), or () for none, not {value!r}")
    names = []
    for item in value:
        if isinstance(item, str):
            name = item.strip().upper()
            name = name if name.startswith("SIG") else "SIG" + name
        else:
            name = signal.Signals(item).name if item in set(signal.Signals) else str(item)
        if name not in signal.Signals.__members__:
            raise ValueError(f"save_on_signals (--on-signal): there is no signal {item!r} "
                             "here: name one such as TERM, USR1 or HUP, or none")
        if name in _NOT_SAVED_ON:
            raise ValueError(f"save_on_signals (--on-signal) cannot take {name}: "
                             f"{_NOT_SAVED_ON[name]}")
        names.append(name)
    return tuple(dict.fromkeys(names))


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "10m", "2h" or "1d"."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    body, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        value = float(body) * unit
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a duration: use e.g. 30s, 10m or 2h") from None
    if not 0 < value < math.inf:  # (nan and inf would never fire)
        raise ValueError(f"a duration must be positive and finite, not {text!r}")
    return value


def parse_metric_trigger(text: str, *, keyword: bool = False) -> tuple[str, str]:
    """``"val_loss:min"`` -> ("val_loss", "min"); a bare name only where it says which
    way is better (``"val_loss"``, ``"accuracy"``). ``keyword``: refused in the Python
    API's words (``on="val_loss:min"``), not the magics' (``--on val_loss:min``)."""
    def spelt(value: str) -> str:
        return f"on={value!r}" if keyword else f"--on {value}"

    name, colon, mode = text.partition(":")
    if not colon:
        mode = metric_mode_from_name(name) or ""
        if name and not mode:
            raise ValueError(f"{spelt(name)}: say whether a lower or a higher {name} is "
                             f"better, {spelt(name + ':min')} or {spelt(name + ':max')}")
    if not name or mode not in ("min", "max"):
        raise ValueError(f"{'on=' if keyword else '--on'} takes "
                         + ("'METRIC:min' or 'METRIC:max' (or (METRIC, 'min'))" if keyword
                            else "METRIC:min or METRIC:max") + f", not {text!r}")
    return name, mode


def default_directory(namespace: dict[str, Any], root: str = "checkpoints") -> str:
    """<root>/<notebook name>, or <root>/session outside a known notebook (``root``, a
    folder or a store URL: the magics' CkptMagics.root_dir)."""
    path = os.environ.get("JPY_SESSION_NAME") or namespace.get("__vsc_ipynb_file__") or ""
    stem = (Path(str(path)).stem if path else "session") or "session"
    if "://" in root:  # (a URL: memory://'s // is kept)
        return root + ("" if root.endswith("/") else "/") + stem
    return str(Path(root) / stem)


@dataclass
class _Loop:
    """Where the training loop is: the epoch, and how many of its batches are done."""

    epoch: int | None = None
    next_batch: int = 0
    epoch_rng: dict[str, Any] | None = None
    start_rng: dict[str, Any] | None = None  # (as the epoch began, before its prefix)
    # The notebook's tracked generators' state_dict()s then, by stored key (a subset drawn
    # from one ahead of batches() is drawn again on a mid-epoch resume).
    start_generators: dict[str, Any] | None = None
    # Theirs as the epoch's tracked batches() loop began (after the code ahead of it): a
    # generator of batches of the user's that draws its order from one as it starts (at
    # the first next()) draws it again on the replay that skips the done batches.
    batch_generators: dict[str, Any] | None = None
    # The states of the loader's own generators (DataLoader(generator=g)) as the epoch
    # began: its order comes from them, not from the global generators.
    loader_rng: list[torch.Tensor] | None = None
    generators: list[torch.Generator | _HeldRandom] = dataclasses.field(default_factory=list)
    # The tracked DataLoader (weakly): a save at an epoch's end holds how its next begins.
    loader: weakref.ref[torch.utils.data.DataLoader] | None = None
    # Whether the epoch's iter(loader) reused the iterator its persistent workers kept
    # (_reuses_iterator): a fresh one draws from the loader's generator before its order.
    iterator_reused: bool | None = None
    # The state_dict()s of the loader's dataset, sampler and batch sampler as the epoch
    # began: a replay of the epoch starts them there (one that advances in __iter__).
    loader_states: dict[str, Any] | None = None
    # How the tracked loader cut the epoch as it began (_loader_shape): a mid-epoch resume
    # skips next_batch batches, which are the same samples only in batches of that size.
    loader_shape: dict[str, Any] | None = None
    in_batches: bool = False
    # The id() of the loader batches() tracks in this epoch (outside epochs(), in the cell
    # run); None until batches() runs.
    tracked_loader: int | None = None
    # Outside epochs(), what a batches() loop after the first did (``_UNTRACKED_LOOPS``):
    # a resume cannot go on from a position saved since.
    untracked: str | None = None


# Why a position saved after an untracked batches() loop began outside epochs() is not
# resumed, by what the loop was ("untracked" in a checkpoint's loop record).
_UNTRACKED_LOOPS = {
    "again": "its ckpt_nb.batches() went over the same loader again outside "
             "ckpt_nb.epochs(), and a saved position does not say which pass it is in",
    "another": "it ran a second ckpt_nb.batches() loop outside ckpt_nb.epochs(), and a "
               "saved position does not say which loop it is in",
    "after": "an optimizer stepped after its ckpt_nb.batches() loop outside "
             "ckpt_nb.epochs() (a plain loop's steps), and a saved position does not say "
             "how far past that loop it is",
}


# What a rollback's or a resume's line names the variables it left out by, as they do not
# read back (the explorer's status line finds them in its rollback's line).
LEFT_UNREAD = "left out (they do not read back): "
# How a rollback's line ends: what its next save does (NEXT_SAVE starts both ways).
NEXT_SAVE = "; the next save "
BRANCH_NEXT = NEXT_SAVE + "starts a branch from it"


def next_save_words(manager: CheckpointManager, cid: str) -> str:
    """How a rollback to ``cid`` says where the next save goes: a branch from it, or, to
    its branch's tip (latest, say), on along that branch, as the save does."""
    with contextlib.suppress(Exception):  # (a catalog that does not read: the usual words)
        row = manager.catalog.get(cid)
        if row is not None and manager.catalog.branch_tips().get(row.branch) == cid:
            return f"{NEXT_SAVE}goes on along its branch, {row.branch}"
    return BRANCH_NEXT
# How a rollback refused for pickles is done with them loaded (the magic says its line).
TRUST_PICKLE_ROLLBACK = "rollback(..., trust_pickle=True)"


class RollbackPlan(NamedTuple):
    """What a rollback would restore: the tracked objects of its objects' names and its
    variables (``restored``), the objects it holds that nothing here would take, and
    what it would warn of."""

    id: str
    restored: list[str]
    not_restored: list[str]
    tracked: list[str]  # the kernel's tracked objects
    # A notice for each optimizer it restores that may step a module made anew since
    # (``_orphaned_optimizers``): known before the rollback, for a question to say.
    orphaned: list[str]

    def refusal(self) -> str:
        """Why a rollback that would restore nothing is refused, and what to do."""
        return (f"nothing to roll back: {self.id} holds "
                f"{', '.join(self.not_restored) or 'no objects'}, and this kernel tracks no "
                f"object of those names (it has {', '.join(self.tracked) or 'none'}); name "
                f"them so, or restore by hand: CheckpointManager.restore({self.id!r}, ...)")


class _Write(NamedTuple):
    """A save that went in: its id, the optimizer steps seen, the metrics it holds and
    its note (why it was made)."""

    id: str
    steps_seen: int
    metrics: dict[str, float]
    note: str


class _FinishedRun(NamedTuple):
    """A cell's last run, which ran to its end: its end checkpoint's row, and its record."""

    row: CheckpointRow
    run: dict[str, Any]


@dataclass
class _Pending:
    """A run to resume once the loop helpers start."""

    checkpoint: Checkpoint
    run: _SavedRun


@dataclass
class _EpochPutBack:
    """What a mid-epoch resume put back, for the epoch's batches() loop to put back again
    what the epoch's code ahead of it changed as it ran again (``_undo_epoch_prefix``)."""

    checkpoint: Checkpoint
    step: int | None
    objects: dict[str, tuple[Any, Any]]  # stored key: (the object loaded, its _footprint)
    variables: dict[str, Any]  # name: the _fingerprint of the value put back
    # The generators set as the epoch began for its code to draw again: their _footprints
    # then (one its code did not draw from is put back unnamed).
    rewound: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass
class _SavedRun:
    """A checkpoint's run record, checked whole (and its variables read) before any of
    it is put back: a malformed one must not leave a rollback or resume half done."""

    variables: dict[str, Any]
    history: History
    step: int | None
    best: float | None = None
    loop: dict[str, Any] | None = None  # (a resume's only)
    # Variables that do not read back, and why: left out, where the rest is put back.
    unreadable: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def read(cls, checkpoint_id: str, run: Any, *, resume: bool = False) -> _SavedRun:
        """The record as saved by ``AutoSession.save``, or CorruptCheckpointError naming
        the checkpoint and what is wrong. None (a checkpoint saved without a session) is
        an empty record; ``resume`` needs its loop position and best metric too."""

        def corrupt(problem: str) -> CorruptCheckpointError:
            return _malformed(checkpoint_id, problem, resume=resume)

        if run is None and not resume:
            return cls({}, History(), None)
        if not isinstance(run, dict):
            raise corrupt(f"a {type(run).__name__}, not a dict")
        names = _variable_names(checkpoint_id, run.get("variables"), resume=resume)
        variables, unreadable = {}, {}
        for name in names:
            stored = run["variables"][name]
            if _pickled_names(stored):  # (one an older version captured)
                unreadable[name] = "it holds values stored as pickles, which are not loaded"
                continue
            try:
                variables[name] = from_storable(stored)
            except Exception as exc:  # noqa: BLE001 - whatever a malformed value makes pandas raise
                unreadable[name] = textwrap.shorten(f"{type(exc).__name__}: {exc}", 160)
        try:
            history = History.from_storable(run.get("history", []))
        except CorruptCheckpointError as exc:
            raise corrupt(f"its metric history: {exc.__cause__ or exc!r}") from exc
        step = run.get("step")
        if not (is_count(step) or step is None and not resume):
            raise corrupt(f"step {step!r}")
        if not resume:
            return cls(variables, history, step, unreadable=unreadable)
        if "best" not in run:
            raise corrupt("no best metric")
        best, loop = run["best"], run.get("loop")
        if best is not None and (isinstance(best, bool) or not isinstance(best, (int, float))):
            raise corrupt(f"best {best!r}")
        if not isinstance(loop, dict):
            raise corrupt("no loop position" if loop is None else f"loop {loop!r}")
        epoch, next_batch, epoch_rng = (loop.get("epoch"), loop.get("next_batch"),
                                        loop.get("epoch_rng"))
        if not (epoch is None or is_count(epoch)) or not is_count(next_batch):
            raise corrupt(f"epoch {epoch!r}, batch {next_batch!r}")
        if epoch_rng is not None:
            problem = rng_problem(epoch_rng) if isinstance(epoch_rng, dict) else "not a dict"
            if problem:
                raise corrupt(f"the epoch's RNG state: {problem}")
        if not isinstance(loop.get("untracked"), (str, type(None))):
            raise corrupt(f"untracked {loop['untracked']!r}")
        for key in ("loader_rng", "loader_rng_now"):
            states = loop.get(key)
            if states is not None and not (isinstance(states, list) and all(
                    isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in states)):
                raise corrupt(f"{key} is not a list of generator states")
        for key in ("loader_iterator_reused", "loader_iterator_kept"):
            if loop.get(key) not in (True, False, None):
                raise corrupt(f"{key} {loop[key]!r}")
        for key in ("loader_states", "loader_states_now"):
            if not isinstance(loop.get(key), (dict, type(None))):
                raise corrupt(f"{key} is not a dict of state_dicts")
        if not isinstance(loop.get("loader_shape"), (dict, type(None))):
            raise corrupt(f"loader_shape {loop['loader_shape']!r}")
        return cls(variables, history, step, best, loop, unreadable)

    def unread(self) -> str:
        """The variables left out because they do not read back, for the line a rollback
        or resume says; empty where there are none."""
        if not self.unreadable:
            return ""
        return f"; {LEFT_UNREAD}" + ", ".join(
            f"{name} ({why})" for name, why in self.unreadable.items())


def _pickled_names(value: Any) -> list[str]:
    """The names of the pickles' placeholders a decoded value holds: a restore would put
    them back in place of the values (a variable's DataFrame cell, an object's Enum or
    deque handed to its load_state_dict()) without a word."""
    if isinstance(value, PickledValue):
        return [value.name]
    if isinstance(value, dict):  # (its keys too: an Enum key is pickled)
        return [name for item in value.items() for part in item for name in _pickled_names(part)]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [name for v in value for name in _pickled_names(v)]
    return []


_PICKLES_NAMED = 8  # (the keys a refusal names; the rest are counted)
_LOADER_STATE_PATH = re.compile(rf"^extra/{RUN_KEY}/loop/loader_states(_now)?/")


def _pickled_states(states: Mapping[str, Any]) -> str:
    """What of ``states`` (by their owners' names) a checkpoint holds as pickles, which
    were left as placeholders, in words; "" where nothing. A resume or rollback would hand
    them to the owners' load_state_dict(), as values, where restore() refuses them."""
    found = {owner: names for owner, state in states.items() if (names := _pickled_names(state))}
    if not found:
        return ""
    # (a loader's state in a run record, named from its place: dataset/last)
    keys = [_LOADER_STATE_PATH.sub("", name) for names in found.values() for name in names]
    more = len(keys) - _PICKLES_NAMED
    owners = list(found)
    return ((f"the state of {owners[0]} holds" if len(owners) == 1 else
             f"the states of {', '.join(owners)} hold")
            + " values stored as pickles (" + ", ".join(keys[:_PICKLES_NAMED])
            + (f" and {more} more" if more > 0 else "") + "), which are loaded only where "
            "you trust the store: unpickling runs code that the store names")


# Values a resume compares with the saved ones cheaply, to say which it puts back.
_CHEAP = (bool, int, float, complex, str, bytes, type(None), PurePath, datetime.date,
          datetime.time, datetime.timedelta)


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type (``1`` is not ``1.0`` once put back); NaN is NaN."""
    return type(a) is type(b) and (a == b or a != a and b != b)


class _Digest(NamedTuple):
    """What a variable that is not cheap to compare held, as a digest of its data: a
    resume names it where the value it puts back differs from the live one. It only
    tells changes apart (no adversary forges one): xxh3, fed straight from the data's
    memory, takes a resume a fraction of a second a GB and no copy."""

    hex: str

    @classmethod
    def of(cls, value: Any) -> _Digest:
        digest = xxhash.xxh3_128()
        _feed(digest, to_storable(value))
        return cls(digest.hexdigest())


def _feed(digest: Any, value: Any) -> None:
    """Add a storable value (``to_storable``'s) to ``digest``: its types, shapes and
    data, so that values a resume would put back differently digest differently."""
    digest.update(f"<{type(value).__qualname__}".encode())
    if isinstance(value, torch.Tensor):
        digest.update(f"{value.dtype}{tuple(value.shape)}{value.layout}".encode())
        if value.is_quantized:  # (its integers alone: a scale doubled with them halved)
            scheme = value.qscheme()
            digest.update(str(scheme).encode())
            if scheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                digest.update(f"{value.q_scale()!r},{value.q_zero_point()}".encode())
            else:
                digest.update(f"{value.q_per_channel_axis()}".encode())
                digest.update(_raw_bytes(value.q_per_channel_scales()))
                digest.update(_raw_bytes(value.q_per_channel_zero_points()))
        for part in _data_of(value.detach()):
            digest.update(_raw_bytes(part))
    elif isinstance(value, np.ndarray) and value.dtype != object:
        digest.update(f"{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8))
    elif isinstance(value, torch.Generator):  # (its repr names its address, not its state)
        digest.update(_raw_bytes(value.get_state()))
    elif isinstance(value, (list, tuple)):
        for item in value:
            _feed(digest, item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    else:
        digest.update(repr(value).encode())
    digest.update(b">")


def _raw_bytes(t: torch.Tensor) -> np.ndarray:
    """A dense tensor's data as flat bytes: a view of its memory where it lies contiguous
    on the CPU, a copy only of one that does not (strided, on another device)."""
    # (a conjugate or negative view holds its data unconjugated: resolved, a copy)
    return t.cpu().resolve_conj().resolve_neg().contiguous().reshape(-1) \
        .view(torch.uint8).numpy()


def _data_of(t: torch.Tensor) -> list[torch.Tensor]:
    """The dense tensors that hold a tensor's data: itself; a sparse one's indices and
    values; a quantized one's integers."""
    if t.layout == torch.sparse_coo:
        t = t.coalesce()
        return [t.indices(), t.values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return [t.ccol_indices(), t.row_indices(), t.values()]
    return [t.int_repr()] if t.is_quantized else [t]


# Where a manifest's state points at a tensor (its index in the manifest's tensors)
_TENSOR_REFS = frozenset({"__tensor__", "__quantized__", "__floats__", "__ndarray__",
                          "__bytes__", "__generator__"})


def _held_objects(manifest: dict[str, Any]) -> dict[str, Any]:
    """The objects a checkpoint holds, by stored key, as data to compare with another
    checkpoint's: each one's state as the manifest records it, with each tensor's record
    and chunk digests in place of its index (which shifts as other objects change)."""
    tensors, storages = manifest["tensors"], manifest["storages"]

    def data(node: Any) -> Any:
        if isinstance(node, list):
            return [data(item) for item in node]
        if not isinstance(node, dict):
            return node
        found = {}
        for key, value in node.items():
            if key in _TENSOR_REFS and is_count(value):
                record = tensors[value]
                found[key] = ({k: v for k, v in record.items() if k not in ("name", "storage")},
                              storages[record["storage"]]["chunks"])
            elif key == "__pickle__" and is_count(value):
                found[key] = storages[value]["chunks"]
            else:
                found[key] = data(value)
        return found

    return {key: data(state) for key, state in manifest["state"].get("objects", {}).items()}


def _malformed(checkpoint_id: str, problem: str, *, resume: bool) -> CorruptCheckpointError:
    """The error for a run record a rollback or resume cannot use, and what to do."""
    return CorruptCheckpointError(
        f"checkpoint {checkpoint_id}'s run record is malformed ({problem}): nothing was "
        "restored; " + ("run the cell with --no-resume (auto(resume=False)) not to resume it"
                        if resume else "roll back to another checkpoint"), checkpoint_id)


def _variable_names(checkpoint_id: str, variables: Any, *, resume: bool = False) -> list[str]:
    """The names of a run record's variables, each one a rollback may assign: a Python
    name that is no keyword and no dunder (``__builtins__`` would change what every
    name means), or CorruptCheckpointError."""
    if variables is None:
        return []
    if not isinstance(variables, dict):
        raise _malformed(checkpoint_id, f"its variables are a {type(variables).__name__}, "
                         "not a dict", resume=resume)
    for name in variables:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) \
                or name.startswith("__") and name.endswith("__"):
            raise _malformed(checkpoint_id, f"a variable named {name!r}, which is no "
                             "notebook variable's name", resume=resume)
    return list(variables)


class BackgroundWriter:
    """One save in flight at a time; failures are kept until someone looks (each one:
    the one before a cell's end save failed too, and was not said)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt_nb-writer")
        self._future: Future[str] | None = None
        self.errors: list[BaseException] = []
        self.last_id: str | None = None
        self.started = 0.0  # when the save in flight was handed over (time.monotonic())
        self._noted: weakref.WeakSet[Future[str]] = weakref.WeakSet()  # (by _done)
        self._noting = threading.Lock()

    def submit(self, fn: Any) -> Future[str]:
        """Hand ``fn`` (a save) over; its future says whether that save went in."""
        self.wait()
        self.started = time.monotonic()
        self._future = self._pool.submit(fn)
        self._future.add_done_callback(self._done)
        return self._future

    def _done(self, future: Future[str]) -> None:
        """Note a save's outcome, once: as it completes, and at wait(), whose waiter wakes
        before the future's callbacks run (a failure must be in ``errors`` by then)."""
        with self._noting:
            if future in self._noted:
                return
            self._noted.add(future)
        if (error := future.exception()) is not None:
            self.errors.append(error)
        else:
            self.last_id = future.result()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the save in flight, at most ``timeout`` s: whether none is left."""
        if self._future is not None:
            # (not result(timeout): a save that failed with a TimeoutError reads the same)
            if not wait_for([self._future], timeout).done:
                return False
            self._done(self._future)  # (kept in self.errors, said by take_errors)
            self._future = None
        return True

    @property
    def busy(self) -> bool:
        return self._future is not None and not self._future.done()

    def take_errors(self) -> list[BaseException]:
        errors, self.errors = self.errors, []
        return errors

    def close(self) -> None:
        self.wait()
        self._pool.shutdown()


def _stopped(message: str) -> KeyboardInterrupt:
    """The KeyboardInterrupt that stops a cell once its state is saved: IPython shows
    it as this one line (``_render_traceback_``), not the frames of the optimizer hook
    that raised it; front ends still see a KeyboardInterrupt."""
    error = KeyboardInterrupt(message)
    error._render_traceback_ = lambda: [f"KeyboardInterrupt: {message}"]  # type: ignore[attr-defined]
    return error


def _said_stop(error: KeyboardInterrupt) -> bool:
    """Whether ckpt_nb raised this interrupt (``_stopped``), its message saying what the
    stop kept; else a second interrupt stopped the cell at once, bare."""
    return hasattr(error, "_render_traceback_")


def _stopped_in_ckpt_nb(error: BaseException) -> bool:
    """Whether a second interrupt stopped ckpt_nb's own code (a save, its wait for the
    write, a loop helper's or the optimizer hook's bookkeeping, the session's handler),
    or library code it called: the innermost frame of its traceback that is neither the
    standard library's nor an installed package's is ckpt_nb's. Those frames tell the
    user nothing; the cell's own show where its code was stuck."""
    own = os.path.dirname(os.path.realpath(__file__)) + os.sep
    library = _library_dirs()
    filenames = []
    trace = error.__traceback__
    while trace is not None:
        filenames.append(trace.tb_frame.f_code.co_filename)
        trace = trace.tb_next
    for filename in reversed(filenames):
        if filename.startswith("<frozen "):
            continue
        path = os.path.realpath(filename)
        if path.startswith(own):
            return True
        if not path.startswith(library):
            return False
    return False


class _RunsManager(CheckpointManager):
    """The store as a session opens it: retention (--keep, --keep-best) counts and
    deletes the checkpoints of the session's own runs only (``runs``). A store is shared
    by a notebook's cells, and by every notebook run headless (./checkpoints/session):
    one notebook's --keep 2 deleted another's checkpoints."""

    runs: Callable[[], AbstractSet[str]] | None = None
    # Checkpoints the cell named to roll back to (``_tell_finished``): its own retention
    # (an interrupt's save under --keep 1) deleted the one it had just named.
    named: AbstractSet[str] = frozenset()

    def _apply_retention(self, protect: set[str], among: AbstractSet[str] | None = None) -> None:
        if self._nothing_to_delete():
            return  # (before the runs: they read every row of the catalog)
        limits = self.max_to_keep, self.keep_best, self.max_bytes
        if among is None and self.runs is not None and limits != (None, None, None):
            among = self.runs()  # (which reads the manifests it has not read yet)
        super()._apply_retention(protect | self.named, among)


class _Gradients:
    """The gradients of the optimizers' parameters as the last optimizer step left them.
    One that changed since, or appeared, waits for a step to come (gradient
    accumulation); no checkpoint holds gradients, so a resume would lose it."""

    def __init__(self) -> None:
        self.stepped: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.marks: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        self.marked_at: int | None = None  # (the optimizer steps seen when they were taken)
        # (at every step, cheaply: one gradient of each optimizer, as marks are taken)
        self.samples: dict[int, tuple[weakref.ref[torch.Tensor], int] | None] = {}
        # While a save waits: each optimizer seen holding gradients accumulated since its
        # step, by id, and its count of steps then (``AutoSession._gradients_pending``).
        self.waiting_for: dict[int, int] | None = None
        self.waiting_since: int | None = None  # (the points passed when a save began to wait)
        # Consistent points passed (a tracked loop's batches, or steps outside loops), and
        # each optimizer's: the point of its latest step and the points between its last two.
        self.points = 0
        # (weakly: an optimizer made again may take a dead one's id)
        self.last_step: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = \
            weakref.WeakKeyDictionary()
        self.interval: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = \
            weakref.WeakKeyDictionary()
        # Those a save stopped waiting for (``AutoSession._overdue``), until they step again
        self.given_up: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.said = False  # (that a save went ahead without them)
        self.said_given_up = False

    def optimizers(self, objects: Iterable[Any]) -> list[torch.optim.Optimizer]:
        """The optimizers among ``objects`` and those that stepped."""
        return list({id(o): o for o in (*self.stepped, *objects)
                     if isinstance(o, torch.optim.Optimizer)}.values())

    def parameters(self, objects: Iterable[Any]) -> list[torch.Tensor]:
        """The parameters of the optimizers among ``objects`` and of those that stepped:
        flat lists, where a model's parameters() walks its modules (five times the time)."""
        return [p for o in self.optimizers(objects) for group in o.param_groups
                for p in group["params"]]

    def mark(self, objects: Iterable[Any], steps_seen: int) -> None:
        """After an optimizer step where a save is due, every optimizer's parameters (a
        GAN's generator step follows a backward pass into the discriminator's too): each
        gradient's tensor (weakly: a zero_grad() frees it) and its version counter, which a
        backward pass into it bumps. Not at every step: it walks every parameter."""
        self.marks = {id(p): (weakref.ref(g), g._version) for p in self.parameters(objects)
                      if (g := p.grad) is not None}
        self.marked_at = steps_seen

    def sample(self, optimizer: torch.optim.Optimizer) -> None:
        """At every optimizer step: the first gradient of its parameters, as ``mark``
        takes them all (a backward pass reaches every parameter of a dense model), and the
        points since its step before."""
        self.stepped.add(optimizer)
        self.given_up.discard(optimizer)
        if (last := self.last_step.get(optimizer)) is not None:
            self.interval[optimizer] = self.points - last
        self.last_step[optimizer] = self.points
        first = _first_gradient(optimizer)
        self.samples[id(optimizer)] = None if first is None else \
            (weakref.ref(first), first._version)

    def sampled_changed(self) -> list[torch.optim.Optimizer]:
        """The optimizers whose sampled gradient changed or appeared since their last
        step: without marks from the last step, what says gradients may be accumulating."""
        changed = []
        for optimizer in self.stepped:
            sample = self.samples.get(id(optimizer))
            first = _first_gradient(optimizer)
            if first is None:
                continue
            if sample is None or sample[0]() is not first or sample[1] != first._version:
                changed.append(optimizer)
        return changed

    def accumulated(self, objects: Iterable[Any]) -> list[torch.optim.Optimizer]:
        """The optimizers whose parameters hold a gradient that changed or appeared since
        the last step; one zeroed in place since (``zero_grad(set_to_none=False)``) holds
        nothing to lose."""
        return [o for o in self.optimizers(objects)
                if any(self._changed(p) for group in o.param_groups for p in group["params"])]

    def _changed(self, p: torch.Tensor) -> bool:
        g = p.grad
        if g is None:
            return False
        mark = self.marks.get(id(p))
        if mark is not None and mark[0]() is g and mark[1] == g._version:
            return False
        return bool(_data_of(g)[-1].any())


def _storage(tensor: torch.Tensor) -> int | None:
    """The address of a tensor's storage (its detached copies and views share it), or
    None where it has no plain one: sparse, nested, meta, empty."""
    if tensor.layout is not torch.strided or tensor.is_nested or tensor.is_meta or \
            not tensor.numel():
        return None
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # (a tensor subclass without one)
        return None


# (torch's optimizer module: a save in a step hook warns at the user's ``opt.step()``)
_TORCH_OPTIM = os.path.abspath(sys.modules[torch.optim.Optimizer.__module__].__file__ or "\0")


def _orphaned_optimizers(names: Iterable[str], found: Discovery,
                         namespace: Mapping[str, Any]) -> list[str]:
    """A notice for each optimizer of ``names`` that may drive the parameters of a module
    that is gone: tensors no tracked module holds, and nothing else the namespace reaches
    either (no module, tensor, container or object holding one, tracked or not, nor a
    function's closure): most of them where they are shaped as a tracked module's
    parameters, all of them where they are shaped otherwise (the model re-created with
    another shape: a hidden layer of 48, not 32; an optimizer of a part not saved, a
    discriminator, has its module in the namespace). The module's cell was run again
    (``model = ...``) and the optimizer's was not: the optimizer steps the old model's
    parameters and the model never trains. It is said, not refused: an optimizer left
    from an earlier experiment looks the same, and restoring it does no harm."""
    modules = {n: m for n, m in found.statefuls.items() if isinstance(m, torch.nn.Module)}
    if not modules:
        return []
    tracked = {_storage(p) for m in modules.values() for p in m.parameters()}
    # name -> (the tracked module its parameters are shaped as, None where none; storages)
    suspects: dict[str, tuple[str | None, set[int]]] = {}
    for name in names:
        optimizer = found.statefuls.get(name)
        if not isinstance(optimizer, torch.optim.Optimizer):
            continue
        params = [p for group in optimizer.param_groups for p in group["params"]]
        storages = {_storage(p) for p in params} - {None}
        if not storages or storages & tracked:
            continue
        shapes = Counter(tuple(p.shape) for p in params)
        like = next((n for n, m in modules.items()
                     if not shapes - Counter(tuple(p.shape) for p in m.parameters())), None)
        suspects[name] = like, storages
    if not suspects:  # (the walk only then: most optimizers drive a tracked module)
        return []
    # (an optimizer's own groups, reached through a loop's `g` or `p` left in the
    # namespace, hold nothing: nor does a variable holding fewer than half of them)
    own = {id(kept) for name in suspects for group in found.statefuls[name].param_groups
           for kept in (group, group["params"])}
    held = _held_storages(namespace, set().union(*(s for _, s in suspects.values())), own)
    notices = []
    for name, (like, storages) in suspects.items():
        if like is not None and 2 * len(storages & held) <= len(storages):
            notices.append(f"{name} drives parameters no tracked module holds: if the "
                           f"training uses it, re-create it after `{like}` (run its cell "
                           f"again); if it's left from earlier, `del {name}` or leave it out "
                           "with --track (track=)")
        elif like is None and not storages & held:
            trained = [n for n, m in modules.items() if next(m.parameters(), None) is not None]
            after = f"`{trained[0]}`" if len(trained) == 1 else "the model it trains"
            notices.append(f"{name} drives parameters that nothing in the namespace holds, "
                           "shaped as no tracked module's (a model made anew since, of "
                           f"another shape?): if the training uses it, re-create it after "
                           f"{after} (run its cell again), or the model never trains; if "
                           f"it's left from earlier, `del {name}` or leave it out with "
                           "--track (track=)")
    return notices


def _held_storages(namespace: Mapping[str, Any], wanted: set[int],
                   passed_over: AbstractSet[int] = frozenset()) -> set[int]:
    """Which of the ``wanted`` tensor storages a public name of the namespace reaches,
    tracked or not (a variable over the size cap, a module in a dict, an object's
    attribute), other than through an optimizer: those are held, not orphaned. Stops
    once all are found; modules give their parameters and buffers, not a state_dict;
    values whose ids are ``passed_over`` are not walked.
    Only plain dicts, lists, tuples, sets, deques, instance ``__dict__``s and ``__slots__``,
    modules' public attributes and functions' closures are walked, read
    without the object's own hooks (a lazy proxy's ``__getattr__``, a shelf's unpickling);
    a walk past ``_HELD_WALK_MOST`` values, or one that fails, takes all as held: the
    warning it serves is not worth a slow or failed rollback."""
    held: set[int] = set()
    seen: set[int] = set(passed_over)
    queue = deque((value, 0) for name, value in namespace.items()
                  if not name.startswith("_") and name not in _HIDDEN)
    try:
        while queue and held != wanted:  # (breadth first: each value at its shallowest)
            value, depth = queue.popleft()
            if id(value) in seen or depth > _MAX_DEPTH or \
                    isinstance(value, (torch.optim.Optimizer, str, bytes, int, float)):
                continue
            seen.add(id(value))
            if len(seen) > _HELD_WALK_MOST:
                return wanted
            if is_code(value):  # (a function's closure and defaults: `step = make_step()`)
                queue.extend((item, depth + 1) for item in _code_holds(value))
            elif isinstance(value, torch.Tensor):
                held.update(s for s in (_storage(value),) if s in wanted)
            elif isinstance(value, torch.nn.Module):
                held.update(s for t in (*value.parameters(), *value.buffers())
                            if (s := _storage(t)) in wanted)
                # (and what its modules keep besides: heads in a plain list attribute)
                queue.extend((item, depth + 1) for module in value.modules()
                             for key, item in object.__getattribute__(module, "__dict__")
                             .items() if not key.startswith("_"))
            elif isinstance(value, dict):
                queue.extend((item, depth + 1) for item in value.values())
            elif isinstance(value, (list, tuple, set, frozenset, deque)):
                queue.extend((item, depth + 1) for item in value)
            else:  # (an object of the user's own: a trainer, an EMA, a wrapper)
                # (and its __slots__' values: a dataclass(slots=True) holding the model)
                queue.extend((item, depth + 1) for item in _slot_values(value))
                try:
                    attributes = object.__getattribute__(value, "__dict__")
                except Exception:  # noqa: BLE001 - (none: __slots__ alone, a C type)
                    continue
                if type(attributes) is dict:
                    queue.extend((item, depth + 1) for item in attributes.values())
    except Exception:  # noqa: BLE001 - (a value's own failure: nothing to warn of)
        return wanted
    return held


# The most values the walk for an orphaned optimizer's holders visits (~0.1 s here).
_HELD_WALK_MOST = 100_000


def _slot_values(value: Any) -> list[Any]:
    """The values an object keeps in its classes' ``__slots__`` (``_held_storages``),
    read through the slots' own descriptors, not the object's hooks; unset ones left out."""
    found: list[Any] = []
    for cls in type(value).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if isinstance(slot := cls.__dict__.get(name), types.MemberDescriptorType):
                with contextlib.suppress(AttributeError):
                    found.append(slot.__get__(value, cls))
    return found


def _code_holds(value: Any) -> list[Any]:
    """What a function keeps alive that its code uses (``_held_storages``): its closure's
    cells, its defaults; a bound method's object, a partial's function and arguments.
    Not a module's or a class's namespace, nor a function's globals (the namespace
    itself, or a library's)."""
    if isinstance(value, types.MethodType):
        return [value.__self__, value.__func__]
    if isinstance(value, functools.partial):
        return [value.func, *value.args, *value.keywords.values()]
    if not isinstance(value, types.FunctionType):
        return []
    kept: list[Any] = [*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values()]
    for cell in value.__closure__ or ():
        with contextlib.suppress(ValueError):  # (a cell not yet filled)
            kept.append(cell.cell_contents)
    return kept


def _first_gradient(optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
    """The gradient of an optimizer's first parameter that has one (``_Gradients``'
    sample)."""
    return next((g for group in optimizer.param_groups for p in group["params"]
                 if (g := p.grad) is not None), None)


# Flags of a tracked module's members that no state_dict holds, kept in the run record
# (its key, the members, the flag's attribute, how the resume's line names its values):
# a resume puts them back as the run left them (``_flags_off``, ``_put_back_flags``).
_MODULE_FLAGS = (
    # a backbone unfrozen in the loop came back frozen
    ("frozen", torch.nn.Module.named_parameters, "requires_grad",
     lambda on: f"requires_grad = {on} (was {not on})"),
    # a BatchNorm the loop put in eval mode trained again ("" is the module itself)
    ("eval", torch.nn.Module.named_modules, "training",
     lambda on: f"{'training' if on else 'eval'} mode (was {'eval' if on else 'training'})"),
)


def _flags_off(statefuls: Mapping[str, Any]) -> dict[str, dict[str, list[str]]]:
    """For each of ``_MODULE_FLAGS``, the members of each tracked module whose flag is off,
    by stored key, where any."""
    record: dict[str, dict[str, list[str]]] = {}
    for field, members, flag, _ in _MODULE_FLAGS:
        record[field] = {}
        for name, obj in statefuls.items():
            if isinstance(obj, torch.nn.Module):
                off = [n for n, member in members(unwrap(obj)) if not getattr(member, flag)]
                if off:
                    record[field][_stored_key(name)] = off
    return record


def _put_back_flags(objects: Mapping[str, Any], run: Mapping[str, Any]) -> list[str]:
    """Set the ``_MODULE_FLAGS`` of the modules' members as the run record has them (off
    for the names it lists, on for the others). Returns what it changed, for the resume's
    line; a record saved before a flag was kept changes nothing of it."""
    changed = []
    for field, members, flag, say in _MODULE_FLAGS:
        offs = run.get(field)
        if not isinstance(offs, dict):
            continue
        for key, obj in objects.items():
            off = offs.get(key, [])
            if not isinstance(obj, torch.nn.Module) or not isinstance(off, list):
                continue
            flipped: dict[bool, list[str]] = {True: [], False: []}
            for name, member in members(unwrap(obj)):
                if getattr(member, flag) != (name not in off):
                    setattr(member, flag, name not in off)
                    flipped[name not in off].append(name or "itself")
            changed += [f"{say(on)} for {_live_name(key)}'s " + ", ".join(names[:3])
                        + (f" and {len(names) - 3} more" if names[3:] else "")
                        for on, names in flipped.items() if names]
    return changed


_HYPERPARAMETERS_NAMED = 3  # (a resume's line names the first few; the rest are counted)

# The hyper-parameters a scheduler drives as it steps (and sets as it is made), by the
# setting it keeps in the group beside them (OneCycleLR, CyclicLR: max_momentum): the
# saved value is where the schedule stood, no edit; the setting is compared instead.
_SCHEDULED = {"lr": "initial_lr", "momentum": "max_momentum", "betas": "max_momentum"}


def _changed_hyperparameters(objects: Mapping[str, Any], saved: Mapping[str, Any],
                             same: Iterable[str]) -> list[str]:
    """The optimizers' hyper-parameters (``lr``, ``weight_decay``, ``betas``, ...) that
    a resume puts back otherwise than they are now, in words (``opt's lr = 0.01 (was
    0.001)``): an lr the cell's code set ahead of its loop, or the set-up cell's edited, is
    replaced by the saved one, which the line said nothing of. An optimizer the stop left
    (``same``) is compared as it stands, unless a scheduler made since drives it: as it
    was made it set what it steps (a OneCycleLR its lr and momentum), which is compared
    by the scheduler's settings instead (``initial_lr``, ``max_momentum``), as a new
    optimizer's is; a new one's lr not at all where no scheduler keeps its starting lr (a
    ReduceLROnPlateau or the loop's own decay moved the saved lr from the one it is made
    with, which is no edit)."""
    same = set(same)
    rescheduled = {id(getattr(unwrap_state(obj), "optimizer", None))
                   for key, obj in objects.items()
                   if key not in same and isinstance(unwrap_state(obj), _SCHEDULERS)}
    changed = []
    for key, obj in objects.items():
        optimizer, state = unwrap_state(obj), saved.get(key)
        if not isinstance(optimizer, torch.optim.Optimizer) or not isinstance(state, Mapping):
            continue
        groups = state.get("param_groups")
        if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
            continue  # (refused by the load, which names it)
        for index, (old, new) in enumerate(zip(groups, optimizer.param_groups)):
            if not isinstance(old, Mapping):
                continue
            held = [name for name in old if name not in ("params", "param_names")
                    and name in new]
            anew = key not in same or id(optimizer) in rescheduled
            names = [name for name in held if not (anew and _SCHEDULED.get(name) in held)
                     and (name != "lr" or key in same)]
            where = f"{_live_name(key)}'s " + (f"group {index} " if len(groups) > 1 else "")
            changed += [f"{where}{name} = {old[name]!r} (was {new[name]!r})" for name in names
                        if _hyperparameter_differs(old[name], new[name])]
    if len(changed) > _HYPERPARAMETERS_NAMED:
        changed[_HYPERPARAMETERS_NAMED:] = [
            f"{len(changed) - _HYPERPARAMETERS_NAMED} more optimizer hyper-parameters"]
    return changed


def _hyperparameter_differs(saved: Any, live: Any) -> bool:
    """Whether a saved hyper-parameter is not the live one (a tensor lr compared by its
    value; betas given as a list, read back as a tuple, are the same)."""
    if isinstance(saved, torch.Tensor) or isinstance(live, torch.Tensor):
        try:
            return bool(torch.as_tensor(saved).ne(torch.as_tensor(live)).any())
        except (RuntimeError, TypeError, ValueError):
            return True
    if isinstance(saved, (list, tuple)) and isinstance(live, (list, tuple)):
        return len(saved) != len(live) or any(map(_hyperparameter_differs, saved, live))
    return bool(saved != live)


def _unfit(checkpoint_id: str, step: int | None, error: StateMismatchError
           ) -> StateMismatchError:
    """The refusal to resume a run whose checkpoint does not fit the objects as they are
    now (a layer or a parameter group added since, or by the loop after its start), and
    the ways on, where it was load_all's bare error, every time the cell ran. Parameters
    in another order (groups built from a set of names) are named as that, not as a change."""
    why = "an optimizer's parameters are in another order than when it was saved" \
        if isinstance(error, ParameterOrderError) else \
        "the tracked objects are not as they were when it was saved (a layer or a parameter " \
        "group added since, or by the loop after the saved position)"
    return StateMismatchError(
        f"not resuming checkpoint {checkpoint_id} (step {step}): {error}\n{why}: build them "
        "as they were, or run with --no-resume (auto(resume=False)) not to resume it, or "
        "%ckpt_rollback ID (ckpt_nb.rollback(ID)) to an earlier checkpoint of the run that "
        "fits them, then run the cell again")


def _stepping(optimizer: torch.optim.Optimizer) -> Iterator[Any]:
    """The optimizers whose steps are under way on this thread's stack, innermost first:
    the ``self`` of each of torch's hooked-step frames (one code for every class). The
    stack, not a count the hooks keep: a step that raised would leave a count behind."""
    code = getattr(getattr(type(optimizer), "step", None), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            yield frame.f_locals.get("self")
        frame = frame.f_back


def _inside_own_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether this optimizer step runs inside another step of the same optimizer (its
    class's step() calling its base class's, each wrapped by torch's hooks)."""
    return sum(1 for stepping in _stepping(optimizer) if stepping is optimizer) > 1


def _stepping_outer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer | None:
    """The optimizer whose step() this one's step runs inside (a wrapper's: SAM's base
    optimizer); None at the top."""
    return next((stepping for stepping in _stepping(optimizer)
                 if isinstance(stepping, torch.optim.Optimizer) and stepping is not optimizer),
                None)


def _leaves(value: Any, kinds: tuple[type, ...], most: int = 100_000) -> list[Any]:
    """The values of ``kinds`` within nested mappings, lists and tuples (a state_dict()),
    looking into ``most`` of them at most, each once (a state that holds itself). Other
    values spend none of that: a long list of floats beside the tensors (a loss history)
    hid them, in one key order or the other, where it spent it all."""
    found, pending, opened = [], [value], set()
    while pending and len(opened) < most:
        item = pending.pop()
        if isinstance(item, kinds):
            found.append(item)
            continue
        if isinstance(item, Mapping):
            inside: Any = item.values()
        elif isinstance(item, (list, tuple)):
            inside = item
        else:
            continue
        if id(item) in opened:
            continue
        opened.add(id(item))
        # (filtered at C speed: a million floats, 0.1 s on a busy 2-core machine)
        pending.extend(itertools.compress(inside, map(
            operator.not_, map(_ATOMS.__contains__, map(type, inside)))))
    return found


_ATOMS = frozenset({float, int, bool, str, bytes, type(None)})  # (no leaves inside them)


def _state_left_out(inner: torch.optim.Optimizer, outer: torch.optim.Optimizer) -> list[str]:
    """The names of ``inner``'s state tensors where ``outer.state_dict()`` holds none of
    them, anywhere in it (under "state", a key of its own as a fixed SAM's "base", a
    Lookahead's "fast_state"), as the very tensors or as copies of them: a wrapper that
    saves only its own state (SAM's), so no checkpoint holds its inner optimizer's
    momentum; [] where it holds them, or there are none."""
    held = [(key, value) for state in inner.state.values() if isinstance(state, Mapping)
            for key, value in state.items()
            if isinstance(value, torch.Tensor) and value.dim() > 0]
    if not held:
        return []
    try:
        saved = outer.state_dict()
    except Exception:  # noqa: BLE001 - a user's state_dict(): the save will say
        return []
    found = _leaves(saved, (torch.Tensor,))
    ids = {id(t) for t in found}

    def kept(value: torch.Tensor) -> bool:
        return id(value) in ids or any(
            t.shape == value.shape and t.dtype == value.dtype and t.device == value.device
            and torch.equal(t, value) for t in found)

    # (one is enough: a wrapper that saves its inner optimizer's state saves all of it)
    return [] if kept(held[0][1]) else sorted({k for k, _ in held})


def _holds_state_of(obj: Any, saved: Any) -> bool:
    """Whether ``obj`` (loaded from ``saved``) still holds any of ``saved``'s own tensors
    or arrays, so that a change in place to it changed the checkpoint read too."""
    if isinstance(obj, torch.optim.Optimizer):
        return True
    if saved is None or isinstance(obj, torch.nn.Module):  # (its load copies)
        return False
    mine = _leaves(saved, (torch.Tensor, np.ndarray))
    if not mine:
        return False
    state = getattr(obj, "state_dict", None)
    try:
        now = _leaves(state() if callable(state) else obj, (torch.Tensor, np.ndarray))
    except Exception:  # noqa: BLE001 - a user's state_dict(): read it again to be safe
        return True
    ptrs = {t.untyped_storage().data_ptr() for t in mine if isinstance(t, torch.Tensor)
            and t.numel()}
    arrays = [a for a in mine if isinstance(a, np.ndarray)]
    return any((isinstance(t, torch.Tensor) and t.numel()
                and t.untyped_storage().data_ptr() in ptrs)
               or (isinstance(t, np.ndarray) and any(np.shares_memory(t, a) for a in arrays))
               for t in now)


class AutoSession(NotState):
    """Automatic checkpoints for the code run while it is active: what a ``%%ckpt_auto``
    cell runs under, and what ``with ckpt_nb.auto(...) as session:`` gives. It finds the
    objects to track, resumes the cell's unfinished run, and saves at the triggers, at
    an interrupt and at the end. ckpt_nb's own, never state: a save does not name the
    variable that holds it as left out of checkpoints.

    Its main fields: ``config`` (an ``AutoConfig``, the options as read), ``manager``
    (the ``CheckpointManager`` of its store), ``step`` (optimizer steps, counted on from
    the checkpoint the model came from), ``metrics``, ``history`` and ``best`` (what
    ``ckpt_nb.log()`` recorded). Its main methods: ``status()`` (what
    ``%ckpt_status`` shows), ``save()`` (a checkpoint, at the next point a resume can
    start from), ``log()``, ``rollback()``, and ``epochs()`` and ``batches()`` (the loop
    helpers that resume mid-epoch).
    """

    def __init__(self, config: AutoConfig, namespace: dict[str, Any],
                 *, out: Any = None) -> None:
        self.config = config
        self.namespace = namespace
        # The function whose locals() the namespace is (auto(namespace=locals()) in a
        # function): Python neither keeps that dict up to date nor reads it back.
        self.locals_frame: types.FrameType | None = None
        self.out = out or sys.stdout
        directory = config.directory or default_directory(namespace)
        metric, mode = config.on if config.on else (None, "min")
        self.manager = _RunsManager(
            directory, max_to_keep=config.keep, keep_best=config.keep_best,
            metric=metric, mode=mode, strategy=config.strategy)
        self._run_of: dict[str, dict[str, Any] | None] = {}  # id -> whose run it holds
        self._finished: _FinishedRun | None = None  # this cell's last run, ended (begin_cell)
        self._written: dict[str, set[str]] = {}  # run id -> the checkpoints this session saved
        # The kernel's newest exact position (saved or resumed from outside a later loop:
        # ``_exact_before``): exact positions taken, and the newest written's (number, run
        # id, checkpoint id); one taken since but not yet written leaves it unknown.
        self._exact_taken = 0
        self._exact_written: tuple[int, str, str] | None = None
        self.manager.runs = self._own_checkpoints
        self.url = store_url(self.manager)  # (resolved: the key of the kernel's position)
        self._follow_position()
        self.manager.add_listener(self._on_manager_event)
        self.writer = BackgroundWriter()
        self._buffers = SnapshotBuffers()
        self.step = 0
        self._steps_by_optimizer: dict[int, int] = {}
        self._parameters_by_optimizer: dict[int, frozenset[int]] = {}  # (ids, at its first step)
        self._first_step_began: dict[int, int] = {}  # (_steps_seen as its first step began)
        self._stepped_at: dict[int, int] = {}  # (_steps_seen as its last step ended)
        self._gradients = _Gradients()  # (as the last optimizer step left them)
        self.history = History()
        self.metrics: dict[str, float] = {}
        # A checkpoint carries a metric only for the state it was measured on: the count
        # of optimizer steps this session had seen when each metric was last logged.
        self._steps_seen = 0
        self._line_cell_began = 0  # (_steps_seen as the line form's cell began)
        self._logged_at: dict[str, int] = {}
        self.best: float | None = None
        # With --keep-best K: the K best values of the --on metric logged, best first (the
        # newer first among equals, as retention ranks them): a value ranking among them
        # is saved, as the kept set of Lightning's save_top_k holds it.
        self._best_values: list[float] = []
        self.loop = _Loop()
        self.cell_hash: str | None = None
        self._code: str | None = None  # (the cell's, where known: discover()'s code)
        self.cell_id: str | None = None
        self._run_id = uuid.uuid4().hex[:16]  # (a resume goes on with the resumed run's)
        self._position: str | None = None  # this session's last save, resume or rollback
        self.last_save_step = 0
        self._last_write: _Write | None = None  # this session's last save that went in
        self.last_save_time = time.monotonic()
        self.last_consistent_step: int | None = None
        self._consistent_rng: tuple[Any, ...] | None = None
        # the notebook's generators there, where the loop fetched a batch from them since
        self._consistent_random: list[tuple[Any, Any]] = []
        self._metric_due = False
        # A save() asked where no resume starts (a batch's body, an epoch's code around
        # its batches() loop), taken at the next consistent point: its note, whether it waits.
        self._save_asked: tuple[str, bool] | None = None
        self._told_save_later = False  # that save() is taken at the next consistent point
        self._metric_reason = ""  # (why the due --on save is: the note it carries)
        self._told_skipped: set[tuple[str, str]] = set()  # (name, why), said once
        # What was tracked as the cell's loop began (its epochs(), else its first batches()),
        # where a resume in a new process begins: an object a save tracks beyond them (one
        # the loop made) is told once, as such a resume refuses its checkpoints.
        self._tracked_at_loop: set[str] | None = None
        self._told_made_in_loop: set[str] = set()
        self._said_failures: set[str] = set()  # background save failures said (ids out)
        self._failure_repeats = 0  # and how many came again since
        self._told_slow = False  # that due saves wait for a slow store's write (once a cell)
        self._told_dropped = False  # that an --on improvement went unsaved (once)
        # That the cell tracks no stateful object, put off to its first save where the cell
        # makes them as it runs (``model = Net()`` ahead of its loop, in a new kernel).
        self._tell_no_state_at_save = False
        self._told_inner_state = False  # that a wrapper's inner optimizer's state is unsaved
        self._told_untracked = False  # that its checkpoints from here are not resumed (once)
        self._kept_exact: str | None = None  # the exact checkpoint its later loop keeps
        self._sorted = False  # whether rediscover() ran: its first sort is the start line's
        # The tracked modules by name as last sorted (id, their parameters' storages), and
        # the storages of those bound to another module since the last save's check
        # (``model = ...`` run again under the line form): an optimizer over them is asked.
        self._modules_seen: dict[str, tuple[int, set[int]]] = {}
        self._remade: set[int] = set()
        self._start_versions: dict[str, tuple[tuple[int, int], ...]] = {}  # (begin_cell's)
        self._interrupts = 0
        # The stop an interrupt's save raised into the cell's code (its message), until the
        # cell ends: where the cell ends without it, code in the cell caught it (%run, which
        # shows an error and goes on; an except that takes KeyboardInterrupt).
        self._stop_raised: str | None = None
        # The frame of the cell run's tracked loop (epochs(), or batches() outside it) while
        # it has not run to its end, and the error IPython last showed as the cell began: an
        # error shown since through that frame (%run shows one and goes on) stopped the loop,
        # and the cell that ran on did not end the run (``_caught_error``).
        self._loop_frame: Any = None
        self._shown_before: BaseException | None = None
        self._pending: _Pending | None = None
        self._pending_skip: tuple[int, dict[str, Any] | None] | None = None  # (batches, RNG)
        self._pending_loader_rng: list[torch.Tensor] | None = None  # the loader's, to set
        self._pending_loader_start: _LoaderStart | None = None  # how its epoch began
        # (the torch generators there were as a resume at an epoch's end put the run back)
        self._generators_at_resume: weakref.WeakSet[Any] | None = None
        self._epoch_put_back: _EpochPutBack | None = None  # (a mid-epoch resume's)
        self._step_offset = 0  # steps done before this session (a resumed run's)
        self._previous_sigint: Any = None
        self._second_sigint: Any = None  # where a second interrupt goes
        # save_on_signals: the handlers before ckpt_nb's, each signal's handler of the
        # user's that it hands the signal to once saved (SIG_DFL: none), the signal that
        # came (and the frame it came in), and the timer that bounds the wait for a
        # consistent point.
        self._previous_signals: dict[int, Any] = {}
        self._chained_signals: dict[int, Any] = {}
        self._signalled: int | None = None
        self._signal_frame: FrameType | None = None
        self._signal_timer: threading.Timer | None = None
        # (torch's SIGCHLD handler and its wrapper, which holds its error while a signal
        # is pending: _hold_worker_deaths)
        self._previous_sigchld: tuple[Any, Any] | None = None
        self._grace_over = False  # the timer handed the signal to the main thread again
        self._cell_start_step = 0
        self._any_cell = True  # the line form's watch of a cell, not a %%ckpt_auto cell
        self._ending = False  # end_cell's save is running
        self._told_held = False  # that interrupts wait for the cell's end (said once)
        self._in_save = False  # a save's capture (and, --sync, its write) is running
        self._hook = register_optimizer_step_post_hook(self._after_step)
        self._pre_hook = register_optimizer_step_pre_hook(self._before_step)
        self.discovery = Discovery()
        self.closed = False

    # -- where the kernel stands -----------------------------------------------------
    def _follow_position(self) -> None:
        """Make the next save a child of what the kernel's state came from (this
        process's last save, resume or rollback on this store), so branches form."""
        position = _positions.get(self.url)
        if position is not None and self.manager.catalog.get(position) is None:
            # Deleted since (the explorer's Delete, ckpt-nb rm): the state descends from
            # its nearest kept ancestor, as the manager's own next save would.
            if _position_events.get(self.url) == "rollback":  # (a resume says so)
                _deleted_rollbacks.setdefault(self.url, position)
            position = self.manager.catalog.heir_of(position)
            if position is None:
                gone = _deleted_rollbacks.get(self.url)
                _forget_position(self.url)
                if gone is not None:  # (the rerun says so: no kept ancestor to name)
                    _deleted_rollbacks[self.url] = gone
            else:
                _positions[self.url] = position
        if position is not None:
            self.manager.head = position

    def _on_manager_event(self, event: str, checkpoint_id: str) -> None:
        if event == "save":
            self._position = checkpoint_id
            _positions[self.url] = checkpoint_id
            _deleted_rollbacks.pop(self.url, None)
            _set_position_event(self.url, event)
            _publish("save", checkpoint_id, self.url)
        elif event == "delete":  # (retention's, the end save's in place of the last)
            if _positions.get(self.url) == checkpoint_id:
                self._follow_position()
            _publish("delete", checkpoint_id, self.url)

    def _moved_to(self, ck: Checkpoint, event: str, objects: Iterable[Any]) -> None:
        """The kernel's state came from ``ck``: ``objects`` are what it was put into."""
        self.manager.head = ck.id
        self._position = ck.id
        # (the checkpoint's metrics were measured on what it put back)
        self._logged_at = dict.fromkeys(ck.metrics, self._steps_seen)
        _positions[self.url] = ck.id
        _set_position_event(self.url, event)
        _position_objects[self.url] = (ck.step, _trained(objects))
        _deleted_rollbacks.pop(self.url, None)
        _publish(event, ck.id, self.url)
        # (a resume goes on from an exact position; a rollback's may be none)
        self._exact_taken += 1
        run = ck.extra.get(RUN_KEY)
        if event == "resume" and isinstance(run, dict) and isinstance(run.get("run"), str):
            self._exact_written = (self._exact_taken, run["run"], ck.id)

    def _newest_exact(self) -> str | None:
        """The id of this run's newest exact position, as a save in a later loop records
        it (``_exact_before`` reads it at once, where a walk back would read a manifest
        for each save since); None where it is not known yet (its save not yet written)."""
        written = self._exact_written
        if written is None or written[0] != self._exact_taken or written[1] != self._run_id:
            return None
        return written[2]

    # -- life cycle ---------------------------------------------------------------
    def say(self, message: str, *, failure: bool = False) -> None:
        """Tell the user one line, as ckpt_nb's, in the cell's output (a ``failure``: on
        stderr)."""
        print(f"ckpt_nb: {message}", file=sys.stderr if failure else self.out, flush=True)
        tell(message)

    def rediscover(self) -> Discovery:
        """Sort the namespace again: what is tracked changes as the notebook runs. The
        first sort is the one the session's start line names (a cell's, or the line
        form's): what it skips a save does not name again."""
        self._pull_locals()
        self.discovery = discover(self.namespace, track=self.config.track,
                                  max_variable_bytes=self.config.max_variable_bytes,
                                  code=self._code, magic=self.config.magic)
        for name, module in self.discovery.statefuls.items():
            seen = self._modules_seen.get(name)
            if isinstance(module, torch.nn.Module) and (seen is None or seen[0] != id(module)):
                if seen is not None and self._sorted:
                    self._remade |= seen[1]
                self._modules_seen[name] = (id(module), {_storage(p) for p in
                                                         module.parameters()} - {None})
        if not self._sorted:
            self._sorted = True
            self._told_skipped.update(self.discovery.skipped.items())
        return self.discovery

    def _tell_orphaned_after_remade(self, found: Discovery) -> None:
        """At a save: where a tracked module was made anew since the last one (the
        ``model = ...`` cell run again under the line form, which starts no cell to warn
        at), warn of an optimizer left stepping the old one's parameters, once for that
        change: its checkpoints hold a model that never trains. Only those over the old
        one's parameters are asked: one left from earlier is not named at each change."""
        if not self._remade:
            return
        old, self._remade = self._remade, set()
        names = [n for n, o in found.statefuls.items() if isinstance(o, torch.optim.Optimizer)
                 and any(_storage(p) in old for group in o.param_groups for p in group["params"])]
        for notice in _orphaned_optimizers(names, found, self.namespace) if names else ():
            warn(notice, RuntimeWarning, skipped=(_TORCH_OPTIM,))

    def begin_cell(self, source: str | None = None, cell_id: str | None = None,
                   *, unseen: Iterable[str] = (), store_from: str | None = None,
                   code: str | None = None) -> None:
        """Start of a training cell: report what is tracked, find a run to resume.
        ``cell_id`` is the notebook's id of the cell, where the front end sends one;
        ``unseen``, the stateful objects of a function that called ``auto()`` without
        ``namespace=locals()``, which the session does not see; ``store_from``, the
        setting the store came from where the cell named none (the start line names the
        store then, as it does the default one); ``code``, the code around what runs
        where ``source`` is not it (an ``auto()`` block's file or cell)."""
        self.cell_hash = hashlib.sha256(source.encode()).hexdigest()[:16] if source else None
        self._code = code if code is not None else source
        self.cell_id = cell_id
        self._finished = None
        self.begin_line_cell()
        self._any_cell = False
        self._consistent()
        self._report_background_error()
        found = self.rediscover()
        # (what the cell's run trains, told at its stop: what changed since this start)
        self._start_versions = {_stored_key(n): _versions(obj)
                                for n, obj in found.statefuls.items()}
        undefined = [n for n in self.config.track or () if found.skipped.get(n) == "not defined"]
        if undefined:  # (a typo tracked nothing, and a resume went on without it)
            raise CaptureError(f"--track (track=) names {', '.join(undefined)}, which "
                            f"{'is' if len(undefined) == 1 else 'are'} not defined: nothing "
                            "ran; fix the name or define it first")
        store_from = store_from or (None if self.config.directory else "the default store")
        default = f" -> {location(self.manager.store)} ({store_from})" if store_from else ""
        self.say(found.summary() + default)
        self._tell_optimizers_left_out(found)
        self._tell_schedulers_left_out(found)
        unseen = list(unseen)
        made_here = not found.statefuls and not unseen and self.config.track is None and \
            bool(names_bound(self._code) - set(self.namespace))
        self._tell_no_state_at_save = made_here
        if (not found.statefuls and not made_here) or unseen:
            self._tell_no_state(unseen)
        if source is not None and self.config.resume:
            self._find_resume(unseen)
        if self._pending is None:
            self._count_on()
            self._tell_left_unsaved()
            # (a resume says it of the objects it puts back; a cell that starts afresh
            # trained its re-created model not at all, its optimizer stepping the old one's)
            for notice in _orphaned_optimizers(list(found.statefuls), found, self.namespace):
                warn(notice, RuntimeWarning)

    def _tell_no_state(self, unseen: list[str]) -> None:
        """Warn that the session tracks none of ``unseen`` (the stateful locals of a
        function that called auto() without its namespace), or no stateful object at all:
        at the cell's start, or at its first save where the cell makes its objects as it
        runs."""
        warn("ckpt_nb tracks " + (
            f"no {', '.join(unseen)}: auto() in a function sees its module's globals, "
            "not the function's locals; pass namespace=locals()" if unseen else
            "no stateful object (no model, optimizer or generator): its checkpoints "
            "hold none, and a resume puts back the loop's position without them"),
            RuntimeWarning)

    def _tell_optimizers_left_out(self, found: Discovery) -> None:
        """Under an explicit --track, name the optimizers in the namespace that it leaves
        out though they step a tracked module's parameters (with their LR schedulers), and
        how to take them: a resume put the model back as saved and the optimizer's state
        (Adam's moments, its step count) not, and the run went on from another optimizer
        state without a word: not the run that was stopped (``--track model``, as for
        Lightning's save_weights_only)."""
        if self.config.track is None:
            return
        tracked = {id(obj) for obj in found.statefuls.values()}
        owners = {id(p): name for name, obj in found.statefuls.items()
                  if isinstance(obj, torch.nn.Module) for p in obj.parameters()}
        left: dict[int, tuple[str, list[str]]] = {}  # id -> (its name, the modules it steps)
        for name, value in self.namespace.items():
            if name.startswith("_") or not isinstance(value, torch.optim.Optimizer) \
                    or id(value) in tracked or id(value) in left:
                continue
            modules = list(dict.fromkeys(owners[id(p)] for group in value.param_groups
                                         for p in group["params"] if id(p) in owners))
            if modules:
                left[id(value)] = (name, modules)
        if not left:
            return
        schedulers = {name: left[id(value.optimizer)][0]
                      for name, value in self.namespace.items()
                      if not name.startswith("_") and isinstance(value, _SCHEDULERS)
                      and id(value) not in tracked
                      and id(getattr(value, "optimizer", None)) in left}
        told = []
        for name, modules in left.values():
            owned = " and ".join(f"{module}'s" for module in modules)
            told.append(f"{name} ({type(self.namespace[name]).__name__} over {owned} "
                        "parameters)")
        told += [f"{name} ({type(self.namespace[name]).__name__} of {optimizer})"
                 for name, optimizer in schedulers.items()]
        one = len(told) == 1
        wanted = ",".join([*self.config.track, *(name for name, _ in left.values()),
                           *schedulers])
        self.say(f"{'--track' if self.config.magic else 'track='} leaves out "
                 + (told[0] if one else ", ".join(told[:-1]) + " and " + told[-1])
                 + f": a resume restarts {'its' if one else 'their'} state (an optimizer's "
                 "moments and step count), and the run does not go on as it would have; "
                 + (f"--track {wanted}" if self.config.magic else f'track="{wanted}"')
                 + f" takes {'it' if one else 'them'}")

    def _tell_schedulers_left_out(self, found: Discovery) -> None:
        """Under an explicit --track, name the LR schedulers in the namespace that it leaves
        out though it tracks their optimizer, and how to take them: a resume put the
        optimizer's learning rate back as saved and the scheduler not, and the run went on
        at another rate without a word (without --track, discovery takes them)."""
        if self.config.track is None:
            return
        # (accelerate's prepared optimizer and scheduler by what they hold: the scheduler
        # it wraps steps the optimizer the prepared one wraps)
        optimizers = {id(unwrap_state(obj)): name for name, obj in found.statefuls.items()
                      if isinstance(obj, torch.optim.Optimizer)}
        tracked = {id(obj) for obj in found.statefuls.values()}
        left = {name: optimizers[id(unwrap_state(value).optimizer)]
                for name, value in self.namespace.items()
                if not name.startswith("_") and isinstance(unwrap_state(value), _SCHEDULERS)
                and id(value) not in tracked
                and id(getattr(unwrap_state(value), "optimizer", None)) in optimizers}
        if not left:
            return
        one = len(left) == 1
        wanted = ",".join([*self.config.track, *left])
        self.say(f"{'--track' if self.config.magic else 'track='} leaves out "
                 + ", ".join(f"{name} ({type(self.namespace[name]).__name__} of {optimizer})"
                             for name, optimizer in left.items())
                 + f", which set{'s' if one else ''} the learning rate of a tracked optimizer: "
                 f"a resume puts the optimizer{'' if len(set(left.values())) == 1 else 's'} "
                 "back as saved, not the "
                 f"scheduler{'' if one else 's'}, and the run goes on at another rate; "
                 + (f"--track {wanted}" if self.config.magic else f'track="{wanted}"')
                 + f" takes {'it' if one else 'them'}")

    def _tell_left_unsaved(self) -> None:
        """Say that this run starts from models or optimizers that a run stopped (an error,
        a second interrupt) had trained past every checkpoint, where nothing resumes: its
        steps count on from that checkpoint's (or 0), and the user likely thinks it starts
        clean."""
        left = _left_unsaved.pop(self.url, None)
        if left is None or _positions.get(self.url) != left.position:
            return  # (a save, resume or rollback since: that checkpoint holds them)
        live = {_stored_key(n): obj for n, obj in self.discovery.statefuls.items()}
        trained = [_live_name(key) for key, was in left.objects.items() if was.trained
                   and was.ref() is live.get(key) and _versions(live[key]) == was.versions]
        if not trained:
            return
        row = self.manager.catalog.get(left.position) if left.position else None
        past = "any checkpoint" if row is None else f"checkpoint {row.id}" + \
            (f" (step {row.step})" if row.step is not None else "")
        self.say(f"{', '.join(trained)} {'is' if len(trained) == 1 else 'are'} as a run that "
                 f"stopped at step {left.step} left {'it' if len(trained) == 1 else 'them'}, "
                 f"trained past {past}: " + (
                     "this cell trains on from there, not from a clean start; run the set-up "
                     "cell again for one" + ("" if row is None else
                                             f" (or %ckpt_rollback {row.id})")
                     if _in_ipython() else
                     "this block trains on from there, not from a clean start; make "
                     f"{'it' if len(trained) == 1 else 'them'} anew before it for one"
                     + ("" if row is None else " (or " + _rollback_advice(
                         row.id, self.config.directory or location(self.manager.store))
                        .removeprefix("call ").partition(", or give")[0] + ")")))

    def begin_line_cell(self) -> None:
        """Start of any cell a session watches: a new loop, no interrupt pending."""
        self._interrupts = 0
        self._stop_raised = None
        self._loop_frame = None
        self._shown_before = getattr(sys, "last_value", None)
        self._line_cell_began = self._steps_seen
        self.loop = _Loop()
        self._tracked_at_loop = None
        self._install_sigint()
        self._install_signals()

    def end_cell(self, error: BaseException | None = None, *, final: bool = True) -> None:
        """End of a cell: a save (``final`` marks the run finished), or on error the
        last consistent state."""
        # The stop an interrupt's save raised, caught in the cell (by %run, say), which ran
        # on to its end: not an end of the run (the run is the interrupt's checkpoint's, to
        # resume), but the stop it was, raised again.
        caught = self._stop_raised if error is None else None
        if caught is not None:
            error = _stopped(caught)
        # An error caught in the cell that stopped its loop (%run shows it and goes on): as
        # though it had reached the cell, not the run's end (said below).
        failed = self._caught_error() if error is None and final else None
        if failed is not None:
            error = failed
        # An interrupt that no consistent point came after (a cell that stopped training):
        # the cell ran to its end, which is saved; a cell of its own then stops.
        interrupted = error is None and self._interrupts > 0
        # The handler stays for the save: one interrupt now lets it finish (and stops the
        # cell after it), a second stops it (a failed save leaves earlier ones intact).
        # Past the first interrupt the cell's code had the handler before's: the session's
        # takes them again, and holds those that come outside a save (``_on_sigint``).
        self._ending = True
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._on_sigint)
        end_id = self._position  # (where no end save is due, the latest holds the end)
        end_failed = False  # (an end save tried that did not go in: said NOT saved)
        try:
            if error is None:
                # (a metric that improved on a state saved without it: a cell that evaluated)
                # (and a line form's cell that trained: a save at its last step holds not
                # what it changed after, its end's takes that one's place)
                if final or self.step > self.last_save_step or self._metric_due \
                        or self._save_asked is not None or \
                        self._steps_seen > self._line_cell_began:
                    try:
                        end_id = self._save_end(final)
                        end_failed = end_id is None
                    except KeyboardInterrupt as stop:  # (a second interrupt: stop at once)
                        if _said_stop(stop):
                            raise
                        self.writer.wait()  # (a write it cut short goes on; held: see above)
                        raise _stopped(self._stopped_at_once("while saving the cell's end")
                                       ) from None
                if interrupted:
                    latest = "no checkpoint holds its run" if self._position is None \
                        else self._latest_said()
                    self.say("interrupted, but no consistent point came before the cell "
                             "ended: it ran to its end (" +
                             ("NOT saved, said above; " if end_failed else "") + latest + ")")
                if final and self.config.on and self.config.on[0] not in self.metrics:
                    name = self.config.on[0]
                    logged = ", ".join(sorted(self.metrics)) or "nothing"
                    call = f"{name}=..." if name.isidentifier() and \
                        not keyword.iskeyword(name) else f"**{{{name!r}: ...}}"
                    self.say(f"--on {name}:{self.config.on[1]} never fired: the cell logged "
                             f"no {name!r} (it logged {logged}; ckpt_nb.log({call}) "
                             "feeds it)")
            elif isinstance(error, KeyboardInterrupt) and self._interrupts:
                if not _said_stop(error):  # (a second interrupt: a bare KeyboardInterrupt)
                    self.writer.wait()  # (the interrupt's save it cut short goes on)
                    if final and _stopped_in_ckpt_nb(error):  # (its frames say nothing)
                        raise _stopped(self._stopped_at_once()) from None
                    self.say(self._stopped_at_once())
                # (else: saved at the consistent point before the interrupt was raised)
            elif self.last_consistent_step == self.step and self.step > self.last_save_step \
                    and self._gradients_held():
                self.writer.wait()
                self.say(f"not saving after {type(error).__name__}: the gradients changed since "
                         "the last optimizer step (no checkpoint holds them: with gradient "
                         "accumulation a resume would go on without them); "
                         + self._latest_said())
            elif self.last_consistent_step == self.step and self.step > self.last_save_step:
                # (the notebook's generators as there too, not as the batch's fetch left them)
                fetched = _random_states(self.discovery.statefuls) \
                    if self._consistent_random else []
                _put_random(self._consistent_random)
                try:
                    cid = self._save(reason=f"{type(error).__name__} in the cell", wait=True,
                                     unsaved=f"the state before the {type(error).__name__}",
                                     rng=RNGState().state_dict(self._consistent_rng))
                except KeyboardInterrupt as stop:  # (a second interrupt: stop at once)
                    if _said_stop(stop):
                        raise
                    self.writer.wait()
                    raise _stopped(self._stopped_at_once(
                        f"while saving the state before the {type(error).__name__}")
                                   ) from error
                finally:
                    _put_random(fetched)
                if cid is not None:  # (a failed one is said where it failed)
                    self.say(f"saved {cid} at step {self.step}, the last consistent point "
                             f"before the {type(error).__name__}")
            elif self.step > self.last_save_step:
                self.writer.wait()  # (a save in flight is the latest once in)
                self.say(f"not saving after {type(error).__name__}: the model changed since the "
                         f"last consistent point; {self._latest_said()}")
            self.writer.wait()
        finally:
            self._restore_sigint()
            self._restore_signals()
            self._ending = False
            self._told_held = False
            during_save = error is None and not interrupted and self._interrupts > 0
            signalled, self._signalled = self._signalled, None
            self._pending = None
            self._save_asked = None  # (an error before its point: not the next cell's)
            self._interrupts = 0
            self._stop_raised = None
            self._loop_frame = self._shown_before = None  # (a frame holds its locals)
            if error is not None:  # (what a resume of this run compares the live values with)
                _left_values[self.url] = self._comparable_values()
                last = self._last_write
                left = _weak_objects(self.discovery.statefuls, self._start_versions)
                if last is not None and last.id == self._position \
                        and last.steps_seen == self._steps_seen:
                    _left_saved[last.id] = left
                else:  # (said by the next cell that starts from them: _tell_left_unsaved)
                    _left_unsaved[self.url] = _LeftUnsaved(self.step, _positions.get(self.url),
                                                           left)
            self._report_background_error()
            self._report_repeats()
        if during_save and end_id is not None:
            self.say(f"interrupted while saving the cell's end: the save finished "
                     f"(checkpoint {end_id})")
        if signalled is not None and error is None:  # (no consistent point came after it)
            self._signalled = signalled
            self._end_on_signal(None if end_failed else end_id, at_end=True)
        if failed is not None:
            then = f"run the cell again to go on from checkpoint {self._position}" \
                if self._position is not None and self._resumable() \
                and self.loop.untracked is None else self._latest_said()
            self.say(f"the cell's loop stopped at step {self.step} on the "
                     f"{type(failed).__name__} shown above, which was caught in the cell (by "
                     "%run, which shows an error and goes on), and the cell ran on: not the "
                     f"run's end; {then}")
        if caught is not None and final:
            raise _stopped(f"{caught} (its stop was caught in the cell, by %run or an "
                           "except that takes KeyboardInterrupt, and the cell ran on: not the "
                           "run's end)")
        if (interrupted or during_save) and final:
            raise _stopped(f"the cell ran to its end, saved as checkpoint {end_id}"
                           if end_id is not None else
                           "the cell ran to its end, NOT saved (its save failed); "
                           + self._latest_said())

    def _caught_error(self) -> BaseException | None:
        """The error IPython showed during the cell (``sys.last_value``: ``%run``, which
        catches every error, shows it and goes on) that unwound out of the frame of the
        cell's tracked loop, which did not run to its end: the loop stopped on it, not by
        the code's choice (a ``break``, an early stop, ends the run). An ``except`` of the
        cell's own shows nothing: its code's choice too."""
        frame, shown = self._loop_frame, getattr(sys, "last_value", None)
        if frame is None or shown is None or shown is self._shown_before:
            return None
        tb = shown.__traceback__
        # (its first frame is where it was caught: caught in the loop's own frame, shown
        # there by showtraceback(), it did not stop the loop, which the code then left)
        tb = tb.tb_next if tb is not None else None
        while tb is not None:
            if tb.tb_frame is frame:
                return shown
            tb = tb.tb_next
        return None

    def _stopped_at_once(self, when: str = "") -> str:
        """What a second interrupt, which stops a cell at once, left: whether a checkpoint
        holds the state it stopped with, and the latest one."""
        last = self._last_write
        at = f"stopped at once at step {self.step}{' ' + when if when else ''}"
        if last is not None and last.id == self._position and last.steps_seen == self._steps_seen:
            return f"{at}: checkpoint {last.id} holds it"
        return f"{at}: not saved; {self._latest_said()}"

    def close(self) -> KeyboardInterrupt | None:
        """Flush pending saves and remove every hook. An interrupt meanwhile is held until
        it is done (one that cut it short left the write in flight unwaited, and the
        message of the cell's stop unsaid): returned, for a cell that ended without an
        error to stop with it; one that ended with one stops already."""
        if self.closed:
            return None
        self.closed = True
        held: list[int] = []

        def hold(signum: int, frame: Any) -> None:
            if not held:
                print("ckpt_nb: interrupt received: the session closes first (the write in "
                      "flight goes in whole or not at all)", file=sys.stderr, flush=True)
            held.append(signum)

        before = self._previous_sigint if self._previous_sigint is not None else \
            signal.getsignal(signal.SIGINT) \
            if threading.current_thread() is threading.main_thread() else None
        if before is not None:
            signal.signal(signal.SIGINT, hold)
        self._previous_sigint = None
        try:
            self._restore_signals()
            self._hook.remove()
            self._pre_hook.remove()
            self.writer.close()
            self._report_background_error()
            self._report_repeats()
            self.manager.close()
        finally:
            if before is not None:
                signal.signal(signal.SIGINT, before)
        # A closed session may stay referenced (below a cell's on the stack, by an
        # explorer): its two sets of staging buffers, each the size of the state, go now.
        self._buffers = SnapshotBuffers()
        if self in _sessions:
            _sessions.remove(self)
        below = active()
        if below is not None and below.url == self.url:
            below._count_on_after(self)
        if not held:
            return None
        latest = f"the latest checkpoint is {self._position}" if self._position else \
            "no checkpoint holds its run"
        return _stopped(f"interrupted as the session closed, after the cell ran to its end: "
                        f"{latest}")

    # -- interrupts ---------------------------------------------------------------
    def _install_sigint(self) -> None:
        """Take SIGINT for the cell, so an interrupt saves first (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous_sigint = signal.getsignal(signal.SIGINT)
        # A second interrupt goes to the handler before ckpt_nb's: past the line form's
        # own, where a %%ckpt_auto cell runs inside it (which would ask for a third).
        outer = getattr(self._previous_sigint, "__self__", None)
        self._second_sigint = outer._second_sigint if isinstance(outer, AutoSession) \
            else self._previous_sigint
        self._cell_start_step = self.step
        signal.signal(signal.SIGINT, self._on_sigint)

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # (a second interrupt can land in this frame before the handler is swapped: its
        # KeyboardInterrupt is the cell's, with no frame of ckpt_nb's in IPython's
        # traceback)
        __tracebackhide__ = True  # noqa: F841
        if self._any_cell and self.step == self._cell_start_step and not self._ending:
            # A cell the line form watches that has not trained: nothing to save first,
            # so it stops at once.
            raise _stopped("the cell stopped (it trained nothing, so nothing was saved)")
        self._interrupts += 1
        if self._interrupts > 1:
            if self._ending and not self._in_save:
                # The cell's end waits for the write in flight, or notes where it stands:
                # cut short, it left the write unwaited and the cell's stop unsaid.
                if not self._told_held:
                    self._told_held = True
                    print("ckpt_nb: interrupt received: the cell stops once the write in "
                          "flight is in (a checkpoint goes in whole or not at all)",
                          file=sys.stderr, flush=True)
                return
            # (a save: stopped at once, or where the handler before could not take it
            # back; end_cell says what the stop left)
            raise KeyboardInterrupt
        if callable(self._second_sigint) and not self._ending:
            # A second interrupt is then the handler before's own, Python's KeyboardInterrupt
            # raised in the cell's code, with no frame of ckpt_nb's in its traceback.
            signal.signal(signal.SIGINT, self._second_sigint)
        what = "finishing the save of the cell's end" if self._ending else \
            "saving at the next consistent point"
        print(f"ckpt_nb: interrupt received: {what} (interrupt again to stop at once)",
              file=sys.stderr, flush=True)

    def _install_signals(self) -> None:
        """Take ``save_on_signals`` (SIGTERM: a preemption, a job's end) for the cell, so
        that the process saves before it ends (main thread only). A signal ignored on
        purpose (nohup's SIGHUP) or handled outside Python is left as it is; a handler of
        the user's gets the signal once the state is saved."""
        if threading.current_thread() is not threading.main_thread() or self._previous_signals:
            return
        self._signalled = None
        for name in self.config.save_on_signals:
            signum = signal.Signals[name]
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN or previous is None:
                continue
            outer = getattr(previous, "__self__", None)  # (the line form's, below a cell's)
            self._chained_signals[signum] = outer._chained_signals.get(signum) \
                if isinstance(outer, AutoSession) else previous
            self._previous_signals[signum] = previous
            signal.signal(signum, self._on_signal)

    def _hold_worker_deaths(self) -> None:
        """A signal sent to the process group (scancel) ends a DataLoader's workers too,
        and torch's SIGCHLD handler raised their death (``RuntimeError: DataLoader worker
        (pid N) is killed by signal``) wherever the main thread was, mid-step, even in this
        handler: the cell ended with it unsaved. While the signal is pending it is held:
        the next fetch fails on the dead workers, and the state before it is saved
        (``_save_before_a_failed_fetch``)."""
        torch_handler = signal.getsignal(signal.SIGCHLD)
        if not callable(torch_handler) or self._previous_sigchld is not None:
            return

        def held(signum: int, frame: Any) -> None:
            try:
                torch_handler(signum, frame)
            except RuntimeError:
                if self._signalled is None:
                    raise

        self._previous_sigchld = torch_handler, held
        signal.signal(signal.SIGCHLD, held)

    def _restore_signals(self) -> None:
        if self._previous_sigchld is not None:
            torch_handler, held = self._previous_sigchld
            if signal.getsignal(signal.SIGCHLD) is held:  # (one the code set since stays)
                signal.signal(signal.SIGCHLD, torch_handler)
            self._previous_sigchld = None
        for signum, previous in self._previous_signals.items():
            # (a handler the cell's code set since, its own or a library's, stays: it
            # replaced ckpt_nb's for the rest of the cell, and is the signal's after it)
            if getattr(signal.getsignal(signum), "__self__", None) is self:
                signal.signal(signum, previous)
        self._previous_signals = {}
        self._cancel_signal_timer()

    def _cancel_signal_timer(self) -> None:
        if self._signal_timer is not None:
            self._signal_timer.cancel()
            self._signal_timer = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        """A signal of ``save_on_signals``: save at the next consistent point, then end as
        the signal asks; at once where there is nothing new to save. A second one, or no
        consistent point within ``_SIGNAL_GRACE`` s, ends the process as the signal would."""
        __tracebackhide__ = True  # noqa: F841
        name = signal.Signals(signum).name
        if self._signalled is not None:  # (said already where it is the grace's end)
            self._end_now(signum, frame, None if self._grace_over else f"{name} again")
            return
        self._signalled, self._signal_frame = signum, frame
        self._hold_worker_deaths()
        if not self._ending and not self._in_save and self.step == self.last_save_step \
                and not self._metric_due and self._save_asked is None and not self._interrupts \
                and self._last_save_written(_SIGNAL_WRITE_WAIT):
            self._end_on_signal(self._position, nothing_new=True)
            return
        what = "finishing the save of the cell's end" if self._ending else \
            "finishing the save in progress" if self._in_save else \
            "saving at the next consistent point"
        then = "handing it to the handler set before ckpt_nb's" \
            if callable(self._chained_signals.get(signum)) else \
            "stopping the cell" if _in_ipython() else "ending"
        print(f"ckpt_nb: {name} received: {what}, then {then} ({name} again ends the "
              "process at once)", file=sys.stderr, flush=True)
        if self._ending or self._in_save:  # (a save is running: no consistent point to
            # wait for; it ends as the signal asks once the save is in, however long the
            # save takes: the grace's end cut it short, "no consistent point came")
            return
        self._signal_timer = threading.Timer(_SIGNAL_GRACE, self._signal_overdue, (signum,))
        self._signal_timer.daemon = True
        self._signal_timer.start()

    def _last_save_written(self, timeout: float | None = None) -> bool:
        """Whether the last save is in the store (waited for where it is in flight, at
        most ``timeout`` s), so that "nothing new since" names it: the one before it did
        not hold this state. (A bounded wait in a signal handler: the code it stopped may
        hold the manager's lock, which the write waits for.)"""
        failures = len(self.writer.errors)
        return self.writer.wait(timeout) and len(self.writer.errors) == failures

    def _end_after_save(self, cid: str | None, waited: bool) -> None:
        """A signal of ``save_on_signals`` came while a save ran (``_in_save``): end as it
        asks, with that save (its write waited for where it was not: ``waited``)."""
        __tracebackhide__ = True  # noqa: F841
        if cid is None and not waited:
            cid = self.writer.last_id if self._last_save_written() else None
        self._end_on_signal(cid)

    def _signal_overdue(self, signum: int) -> None:
        """No consistent point came within ``_SIGNAL_GRACE`` s of the signal (code that
        does not train, or a call that does not return): end as the signal would. Runs on
        the timer's thread, which cannot set a handler: a handler of the user's gets the
        signal in the main thread, else the process exits with the status the signal
        would have given."""
        if self._signalled != signum or self._signal_timer is None:  # (a save began)
            return
        name = signal.Signals(signum).name
        latest = f"the latest checkpoint is {self._position}" if self._position else \
            "no checkpoint holds the run"
        print(f"ckpt_nb: no consistent point came within {_SIGNAL_GRACE:g} s of {name}: "
              f"ending without a save ({latest})", file=sys.stderr, flush=True)
        if callable(self._chained_signals.get(signum)):
            # (our handler, in the main thread: _end_now. The signal itself, sent to that
            # thread, wakes the call it may be in, one that does not return; a signal
            # only simulated, _thread.interrupt_main's, waits for that call to end)
            self._grace_over = True
            if hasattr(signal, "pthread_kill"):
                signal.pthread_kill(threading.main_thread().ident, signum)
            else:
                _thread.interrupt_main(signum)
            return
        if _in_ipython():  # (a kernel sends the line to the notebook from a thread of its
            # own, which the exit would stop before it is sent: the kernel died unexplained)
            time.sleep(_SIGNAL_SAID_WAIT)
        os._exit(128 + signum)

    def _end_now(self, signum: int, frame: Any, why: str | None) -> None:
        """End as the signal would, without saving: the handler before ckpt_nb's, or the
        signal's default action; ``why`` said first (None: said already)."""
        self._restore_signals()
        chained = self._chained_signals.get(signum)
        self._signalled, self._grace_over = None, False
        if why is not None:
            print(f"ckpt_nb: {why}: ending at once, NOT saved; "
                  + (f"the latest checkpoint is {self._position}" if self._position else
                     "no checkpoint holds the run"), file=sys.stderr, flush=True)
        if callable(chained):
            chained(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    def _end_on_signal(self, checkpoint_id: str | None, *, at_end: bool = False,
                       nothing_new: bool = False) -> None:
        """After the save a signal asked for (``checkpoint_id``; None: it failed, said),
        end as the signal asks: a handler of the user's gets it (training goes on where it
        returns); in a kernel, the cell stops, saying so; in a script, the process exits
        with the signal's status (143 for SIGTERM), the ``with`` block closed first."""
        __tracebackhide__ = True  # noqa: F841
        signum, frame = self._signalled, self._signal_frame
        assert signum is not None
        self._cancel_signal_timer()
        self._signalled = self._signal_frame = None
        name = signal.Signals(signum).name
        chained = self._chained_signals.get(signum)
        if nothing_new:
            held = f"nothing new to save since checkpoint {checkpoint_id}" \
                if checkpoint_id is not None else "nothing trained to save"
        elif checkpoint_id is None:
            held = f"NOT saved (its save failed); {self._latest_said()}" \
                if self._position is not None else "NOT saved, and no checkpoint holds its run"
        else:
            held = f"saved as checkpoint {checkpoint_id}"
        where = "at the cell's end" if at_end else f"at step {self.step}"
        # (a position the loop helpers hold: a rerun resumes there, as after an interrupt)
        resumable = not at_end and not nothing_new and checkpoint_id is not None and \
            self.config.resume and self.cell_hash is not None and \
            self.loop.untracked is None and (self.loop.epoch is not None or self.loop.in_batches)
        if callable(chained):
            self.say(f"{name} {where}: {held}; the handler set before ckpt_nb's takes it now")
            chained(signum, frame)
            return
        if _in_ipython():
            raise _stopped(f"{name}: the cell stopped {where}, {held}"
                           + (": run it again to go on from there" if resumable else ""))
        self.say(f"{name} {where}: {held}; exiting with status {128 + signum}, as {name} asks"
                 + (": running the script again goes on from there" if resumable else ""))
        raise SystemExit(128 + signum)

    # -- triggers -------------------------------------------------------------------
    def _consistent(self, rng: tuple[Any, ...] | None = None) -> bool:
        """Mark a consistent point: the state here is one a resume can start from.
        ``rng``: the generators' snapshot taken there, if the code since drew from them.
        Where a save is due and gradients wait for an optimizer step
        (``_gradients_pending``), it is none: returns False, and the save waits."""
        self._gradients.points += 1
        if self.due() is not None and self._gradients_pending():
            self.last_consistent_step = None  # (the state changed since the last one)
            return False
        self._gradients.waiting_for = self._gradients.waiting_since = None
        self.last_consistent_step = self.step
        # raw: converted only if a save needs it
        self._consistent_rng = rng if rng is not None else RNGState.snapshot()
        self._consistent_random = []
        return True

    def _gradients_pending(self) -> bool:
        """Whether the optimizers' parameters hold gradients accumulated since their last
        step (gradient accumulation): no checkpoint holds them, so a resume from a save
        here would lose them, and the save waits for the step of each optimizer holding
        them (a GAN's generator accumulating over 4 batches while its discriminator steps
        at each: the discriminator's step is not the one that consumes them). A loop that
        backpropagates after its step (the step first in its body) has no point without
        them: once each has stepped and holds new ones, the save goes ahead without them,
        and says so once. It walks every parameter: only where a save is due (one that
        fell due after the last step, which took no marks then, goes by each optimizer's
        sampled gradient)."""
        gradients = self._gradients
        if gradients.marked_at != self._steps_seen:  # (fell due since the last step)
            holding = gradients.sampled_changed()
        else:
            holding = gradients.accumulated(self.discovery.statefuls.values())
        holding = [o for o in holding if o not in gradients.given_up]
        if not holding:
            return False
        if gradients.waiting_for is None or gradients.waiting_since is None:
            gradients.waiting_for, gradients.waiting_since = {}, gradients.points
        steps = self._steps_by_optimizer
        for optimizer in holding:
            gradients.waiting_for.setdefault(id(optimizer), steps.get(id(optimizer), 0))
        stepped = [o for o in holding if steps.get(id(o), 0) != gradients.waiting_for[id(o)]]
        # (one over the same parameters as one that stepped, an optimizer made again and
        # the old one left in the notebook, waits for nothing)
        consumed = {id(p) for o in stepped for group in o.param_groups for p in group["params"]}
        unstepped = [o for o in holding if o not in stepped and not any(
            id(p) in consumed for group in o.param_groups for p in group["params"])]
        if overdue := [o for o in unstepped if self._overdue(o)]:
            # (an optimizer that no longer steps: its gradients would stop every save)
            gradients.given_up.update(overdue)
            if not gradients.said_given_up:
                gradients.said_given_up = True
                self.say(f"saving without the gradients {self._names_of(overdue)} "
                         f"accumulated: its step had not come in {self._MOST_POINTS_WAITED} "
                         "points where the loop could save, nor in twice the points between "
                         "its last two steps; saves wait for it again once it steps, and a "
                         "resume from one saved without them goes on without them (said "
                         "once)")
            unstepped = [o for o in unstepped if o not in overdue]
        if unstepped:
            return True
        if stepped and not gradients.said:
            gradients.said = True
            self.say("saving without the gradients accumulated since the last optimizer "
                     "step: this loop backpropagates after its step, so no point comes "
                     "between the two; a resume from such a checkpoint goes on without "
                     f"them ({self._names_of(stepped)}'s, which stepped since this save "
                     "began to wait)")
        return False

    # Points a save waits at least for the step of one holding accumulated gradients
    _MOST_POINTS_WAITED = 256

    def _overdue(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether a save stops waiting for ``optimizer``'s step: none came in
        _MOST_POINTS_WAITED points, nor in twice its own last interval (a WGAN's generator
        steps once in 64 batches while its critic steps 5 times in each: all optimizers'
        steps are no measure of it), since its last step or, where that came before, since
        the wait began (a generator that rested for a phase of the critic's training and
        accumulates again was given up at once)."""
        gradients = self._gradients
        assert gradients.waiting_since is not None  # (a save is waiting)
        since = max(gradients.last_step.get(optimizer, gradients.waiting_since),
                    gradients.waiting_since)
        limit = max(self._MOST_POINTS_WAITED, 2 * gradients.interval.get(optimizer, 0))
        return gradients.points - since > limit

    def _names_of(self, objects: Iterable[Any]) -> str:
        """The tracked objects' names (their type's where untracked), for a message."""
        names = {id(obj): name for name, obj in self.discovery.statefuls.items()}
        return ", ".join(names.get(id(o), type(o).__name__) for o in objects)

    def _gradients_held(self) -> bool:
        """At an error: whether gradients changed since the last optimizer step, so that
        the consistent point before may have had them accumulating (as an interrupt's save
        waits for the step, an error's is not made): by the marks where the last step took
        them, else by each optimizer's sampled gradient."""
        if self._gradients.marked_at == self._steps_seen:
            return bool(self._gradients.accumulated(self.discovery.statefuls.values()))
        return bool(self._gradients.sampled_changed())

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Note when an optimizer's first step began: one stepped inside it (a wrapper's
        inner optimizer: SAM, ZeroRedundancyOptimizer) is not one it counts on from."""
        if active() is self and id(optimizer) not in self._steps_by_optimizer:
            # (set anew: a first step that raised before it ended left one behind)
            self._first_step_began[id(optimizer)] = self._steps_seen

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if active() is not self:
            return
        if _inside_own_step(optimizer):
            # (a subclass's step() calling super().step(), both hooked: one step, counted
            # as the outer one ends, once the subclass's code after it has run too)
            return
        key = id(optimizer)
        if key not in self._steps_by_optimizer:
            self._steps_by_optimizer[key] = self._steps_taken_over(optimizer)
            if not self._told_inner_state:
                self._tell_inner_state_unsaved(optimizer)
        self._steps_by_optimizer[key] += 1
        self._steps_seen += 1
        self._stepped_at[key] = self._steps_seen
        if self._metric_due and self.config.on and not self._told_dropped:
            self._told_dropped = True
            self.say(f"{self._metric_reason} at step {self.step} but was not saved: "
                     "the optimizer stepped before any point where the state it measured "
                     "could be saved (it was logged inside the batches() loop, or as an "
                     "epoch began); log the --on metric after an epoch's batches() loop, "
                     "where the epoch's end saves it")
        self._metric_due = False  # the state the metric was measured on is gone
        self.step = max(self._steps_by_optimizer.values()) + self._step_offset
        self._gradients.sample(optimizer)
        if self.due() is not None:  # (what a save due at the next point compares against)
            self._gradients.mark(self.discovery.statefuls.values(), self._steps_seen)
        # With no loop helpers, right after the step is a consistent point. Not inside an
        # epoch of epochs() (a step outside its tracked batches() loop, or a plain loop
        # over the data): the position saved there, the epoch's start, would be replayed.
        if not self.loop.in_batches and self.loop.epoch is None:
            if self.loop.tracked_loader is not None and self.loop.untracked is None:
                # (past the tracked loop: its position, the loop's end, does not say how
                # many steps since; a resume skipped every batch and ran them again)
                self.loop.untracked = "after"
            self._consistent()
            self.checkpoint_if_due()

    def _tell_inner_state_unsaved(self, optimizer: torch.optim.Optimizer) -> None:
        """Say, once, where an optimizer stepped inside another's step() keeps state that
        the outer one's state_dict() leaves out and nothing tracks: a resume or rollback
        would train on without it (SAM's base optimizer's momentum), silently."""
        if any(obj is optimizer for obj in self.discovery.statefuls.values()):
            return
        # (or a tracked one sharing its very parameter groups, which steps it from a method
        # of its own: SAM's second_step(), as its README uses it)
        outer = _stepping_outer(optimizer) or next(
            (obj for obj in self.discovery.statefuls.values()
             if isinstance(obj, torch.optim.Optimizer) and obj is not optimizer
             and (obj.param_groups is optimizer.param_groups
                  or any(g is h for g in obj.param_groups for h in optimizer.param_groups))),
            None)
        if outer is None:
            return
        left_out = _state_left_out(optimizer, outer)
        if left_out:
            self._told_inner_state = True
            name = self._names_of([outer])
            self.say(f"the {type(optimizer).__name__} that {name} steps keeps "
                     f"state ({', '.join(left_out)}) that {name}.state_dict() leaves out: no "
                     "checkpoint holds it, so a resume or rollback trains on without it; "
                     f"give {type(outer).__name__} a state_dict() and load_state_dict() that "
                     "hold its inner optimizer's too")

    def _steps_taken_over(self, optimizer: torch.optim.Optimizer) -> int:
        """The steps an optimizer stepping for the first time counts on from: those of
        the most-stepped earlier one over any of the same parameters (the one it was made
        anew in place of, a learning rate set by epoch), so that the run's step, the most
        any optimizer took, goes on; 0 for one over parameters of its own (a GAN's second
        optimizer, whose steps in the same batches are not steps more)."""
        parameters = frozenset(id(p) for group in optimizer.param_groups
                               for p in group["params"])
        self._parameters_by_optimizer[id(optimizer)] = parameters
        began = self._first_step_began.pop(id(optimizer), self._steps_seen)
        return max((self._steps_by_optimizer[key]
                    for key, earlier in self._parameters_by_optimizer.items()
                    if key in self._steps_by_optimizer and not parameters.isdisjoint(earlier)
                    and self._stepped_at.get(key, 0) <= began),  # (not stepped inside it)
                   default=0)

    def due(self) -> str | None:
        """Why a save is due now, or None."""
        if self._signalled is not None:
            return signal.Signals(self._signalled).name
        if self._interrupts:
            return "interrupt"
        if self._metric_due:  # (the state it was measured on may be saved, but without it)
            return self._metric_reason
        if self._save_asked is not None:
            return self._save_asked[0]
        if self.step == self.last_save_step:
            return None
        if self.config.every_steps and self.step - self.last_save_step >= self.config.every_steps:
            return f"every {self.config.every_steps} steps"
        if self.config.every_seconds and \
                time.monotonic() - self.last_save_time >= self.config.every_seconds:
            return f"every {self.config.every_seconds:g} s"
        return None

    def checkpoint_if_due(self) -> None:
        """Save if a trigger is due; an interrupt's save then stops the cell."""
        self._report_background_error()
        reason = self.due()
        if reason is None:
            return
        signalled = self._signalled is not None  # (due() says it first)
        interrupted = reason == "interrupt" or signalled
        asked = self._save_asked  # (not put off: a save() taken at once waits for the write)
        if not interrupted and not self._metric_due and asked is None and self._put_off(reason):
            return
        rng = RNGState().state_dict(self._consistent_rng)
        if self._metric_due and not interrupted:  # (it waits for the write in flight)
            self.writer.wait()
            self._report_background_error()
            # (a save of this state without the metric, an "every N steps" one, goes)
            waited = asked is not None and asked[1]
            cid = self._save_in_place(reason=reason, wait=waited, rng=rng)
            if self._signalled is not None:  # (it came during the save)
                self._end_after_save(cid, waited)
            return
        if signalled:  # (a consistent point came: no end without a save)
            self._cancel_signal_timer()
        waited = interrupted or (asked is not None and asked[1])
        cid = self._save(reason=reason, wait=waited,
                         unsaved=f"the state at the {reason if signalled else 'interrupt'}"
                         if interrupted else None, rng=rng)
        if self._signalled is not None:  # (before the save, or during it)
            self._end_after_save(cid, waited)
            return  # (a handler of the user's that returned: training goes on)
        if not interrupted:
            return
        # A position to go on from is one the loop helpers of a %%ckpt_auto cell hold.
        resumable = self.cell_hash is not None and self.loop.untracked is None and (
            self.loop.epoch is not None or self.loop.in_batches) and self.config.resume
        if cid is None:  # (the save failed, said: an older checkpoint does not hold it)
            latest = self._position
            if latest is None:
                raise _stopped(f"the cell stopped at step {self.step}, NOT saved (its save "
                               "failed) and no checkpoint holds its run: running the cell "
                               "again starts over from the objects as they are")
            raise _stopped(f"the cell stopped at step {self.step}, NOT saved (its save "
                           f"failed); {self._latest_said()}: "
                           + ("run the cell again to go on from it" if resumable else
                              f"%ckpt_rollback {latest} puts it back"))
        self.say(f"saved {cid} on interrupt")
        if resumable:
            self._stop_raised = f"the cell stopped at step {self.step}: run it again to go " \
                                f"on from checkpoint {cid}"
        else:
            self._stop_raised = f"the cell stopped at step {self.step}; checkpoint {cid} " \
                                "holds it, " + self._rerun_after_stop(cid)
        raise _stopped(self._stop_raised)

    def _rerun_after_stop(self, cid: str) -> str:
        """What running the cell again does after a stop saved as ``cid`` at a position
        no rerun can go on from (or with --no-resume, which resumes none), the same in this
        kernel and a new one (``_resume_now``)."""
        start_over = ("its loops from their start on the objects as they are (in this "
                      f"kernel, trained to step {self.step}, its steps counted on; in a new "
                      f"one, as the set-up cell makes them; %ckpt_rollback {cid} puts this "
                      "state back first)")
        if not self.config.resume:
            return (f"and with --no-resume (resume=False) running the cell again runs "
                    f"{start_over}; without it, it would resume the run")
        run = self._run_record(cid) or {}
        exact = self._exact_ancestor(cid, run) \
            if self.cell_hash is not None and self.loop.untracked is not None \
            and isinstance(run.get("run"), str) else None
        if exact is not None:
            row = self.manager.catalog.get(exact)
            at = f" (step {row.step})" if row is not None and row.step is not None else ""
            return (f"not its position ({_UNTRACKED_LOOPS[self.loop.untracked or 'another']})"
                    f": running the cell again resumes from checkpoint {exact}{at}, the run's "
                    "newest saved before that loop began, in this kernel as in a new one")
        how = "loop with `for epoch in ckpt_nb.epochs(N)`" \
            if self.cell_hash is not None and self.loop.untracked is not None else \
            "loop with ckpt_nb.epochs()/batches()" if self.cell_hash is not None else \
            "loop with ckpt_nb.epochs()/batches() in a %%ckpt_auto cell or a ckpt_nb.auto() " \
            "block"  # (the line form's: a cell or a block of its own)
        return (f"not a position to resume: running the cell again runs {start_over}. To "
                f"resume where it stopped, {how}")

    _PUT_OFF_AFTER = 2.0  # s a due save waits for the one in flight before it is put off

    def _put_off(self, reason: str) -> bool:
        """Whether a due save waits for the write in flight while training goes on: taking
        it meant waiting there, and a hung store stalled each trigger until its write timed
        out. The trigger stays due; nothing is copied, so the buffers being written stay
        as they are. A write in within ``_PUT_OFF_AFTER`` s is waited for, as before."""
        if self.config.sync or self.writer.wait(
                max(0.0, self.writer.started + self._PUT_OFF_AFTER - time.monotonic())):
            return False
        if not self._told_slow:
            self._told_slow = True
            where = file_url_path(self.url) if self.url.startswith("file://") else self.url
            self.say(f"the store {where} is slow (writing a checkpoint has taken "
                     f"{time.monotonic() - self.writer.started:.0f} s so far): saves due "
                     f"{reason} are put off until the write is in, training goes on")
        return True

    def _ranks(self, value: float) -> str | None:
        """Why a finite value of the --on metric just logged is saved, or None: it improved
        on the run's best, or with --keep-best K, it ranks among the K best logged, where
        retention keeps it (the newer first among equals). Saving improvements alone left
        the second to Kth best values unsaved, and the K kept the best of the improvements."""
        assert self.config.on is not None  # (log() asks only with --on)
        name, mode = self.config.on
        sign = 1 if mode == "min" else -1
        improved = self.best is None or sign * value < sign * self.best
        if improved:
            self.best = value
        k = self.config.keep_best
        if k is None:
            return f"{name} improved" if improved else None
        rank = sum(sign * kept < sign * value for kept in self._best_values)
        if rank >= k:
            return None
        self._best_values.insert(rank, value)
        del self._best_values[k:]
        return f"{name} improved" if improved else \
            f"{name} equals the best" if value == self.best else \
            f"{name} ranks among the {k} best"

    def log(self, **metrics: float) -> None:
        """Record metrics: they go into the next checkpoint and drive ``--on``. Not while
        the epoch's code ahead of its batches() loop runs again on a mid-epoch resume: the
        unstopped run logged there before the save, which holds its records; a value
        measured again now, on the mid-epoch state, is none of the run's (it became its
        best, and an --on improvement no checkpoint held). Not recording it leaves all
        that log() sets (the history, the metrics, best, a due save) as the run stood
        at the save, without a put-back that must list each."""
        if self._epoch_put_back is not None:
            return
        for name, value in metrics.items():
            self.metrics[name] = _metric_value(name, value)
            self._logged_at[name] = self._steps_seen
        self.history.append({"step": self.step, "epoch": self.loop.epoch, **self.metrics})
        if self.config.on and self.config.on[0] in metrics:
            value = self.metrics[self.config.on[0]]
            # (NaN or ±inf: a diverged run, never best, as "best" says)
            reason = self._ranks(value) if math.isfinite(value) else None
            if reason is not None:
                self._metric_due, self._metric_reason = True, reason
                # Without the loop helpers the consistent point is right after the step,
                # and the next step takes away the state measured: save it now.
                if not self.loop.in_batches and self.loop.epoch is None and \
                        self.last_consistent_step == self.step:
                    self.checkpoint_if_due()

    # -- saving -------------------------------------------------------------------------
    def save(self, *, wait: bool = False, reason: str = "manual") -> str | None:
        """A checkpoint of the tracked state, at a point a resume can start from: now,
        where the code runs outside the loop helpers or none has begun; in a batches()
        loop's body or an epoch's code around it, at the next consistent point (before
        the next batch is fetched, the epoch's end, the cell's end), as a trigger's save
        waits: a position saved there would make a resume run that code again (said
        once). ``wait``: the save's write is waited for (a failure said), and the id of a
        save taken now returned (None where it failed); otherwise, or taken later, None.
        ``reason``: the checkpoint's note."""
        where = self._no_resume_point()
        if where is None:
            cid = self._save(reason=reason, wait=wait)
            if self._signalled is not None and not self._ending:  # (it came during the save)
                self._end_after_save(cid, wait)
            return cid
        self._save_asked = (reason, wait or (self._save_asked is not None
                                             and self._save_asked[1]))
        if not self._told_save_later:
            self._told_save_later = True
            later = "at the next optimizer step (a checkpoint to roll back to, which a " \
                "resume does not start from) or at the cell's end" \
                if where == _AFTER_THE_LOOP else "at the next consistent point (before the " \
                "next batch is fetched, at the epoch's end, or at the cell's end)"
            self.say(f"save() at step {self.step}, {where}, is not a point a resume can "
                     f"start from (the code there would run again): it is taken {later} and "
                     "returns None (said once)")
        return None

    def _no_resume_point(self) -> str | None:
        """Where the code stands, where the loop helpers' position there is not one a
        resume can start from (theirs are the points before a batch's fetch and the epoch
        boundaries); None where they hold no position (none has begun, or there are none)."""
        loop = self.loop
        if loop.in_batches:
            return "in a batches() loop's body"
        if loop.epoch is not None:
            return f"in epoch {loop.epoch} outside its batches() loop"
        if loop.tracked_loader is not None:
            return _AFTER_THE_LOOP
        return None

    def _save(self, *, reason: str, finished: bool = False, wait: bool = False,
              rng: dict[str, Any] | None = None, unsaved: str | None = None) -> str | None:
        """``_snapshot_and_write``, marked as running: a signal of ``save_on_signals`` that
        comes meanwhile waits for it (ending the process inside it lost the save, and
        named the checkpoint before)."""
        self._in_save = True
        try:
            return self._snapshot_and_write(reason=reason, finished=finished, wait=wait,
                                            rng=rng, unsaved=unsaved)
        finally:
            self._in_save = False

    def _snapshot_and_write(self, *, reason: str, finished: bool = False, wait: bool = False,
                            rng: dict[str, Any] | None = None,
                            unsaved: str | None = None) -> str | None:
        """Snapshot tracked state now and write it (behind the training thread). Where
        ``wait`` (or --sync): the new checkpoint's id, or None where this save failed,
        which is said as ``unsaved`` (what was lost: "the cell's end") NOT saved, with
        the latest checkpoint; a message of the caller's must not name the last save of
        the writer, an older one. Not waited for: None."""
        if self._pending is not None:  # (no loop helper took it: this run is a new one)
            self._leave_pending("its loops do not go through ckpt_nb.epochs()/batches(), "
                                "which put back where a run stopped")
        if self.loop.untracked is not None and not finished:
            self._tell_untracked()
        found = self.rediscover()
        self._tell_skipped(found)
        # (a finished run is resumed by none; one past its tracked loop, from the newest
        # checkpoint saved before, which the later loop's objects are not in)
        if not finished and self.loop.untracked is None:
            self._tell_made_in_loop(found)
        self._tell_orphaned_after_remade(found)
        if self._tell_no_state_at_save:  # (the cell made none of them as it ran)
            self._tell_no_state_at_save = False
            if not found.statefuls:
                self._tell_no_state([])
        run = {"finished": finished, "cell": self.cell_hash, "cell_id": self.cell_id,
               "run": self._run_id, "owner": _owner(),
               "step": self.step, "on": list(self.config.on) if self.config.on else None,
               "keep_best": self.config.keep_best,
               "history": self.history.storable(), "best": self.best,
               "loop": {"epoch": self.loop.epoch, "next_batch": self.loop.next_batch,
                        "epoch_rng": self.loop.epoch_rng, "loader_rng": self.loop.loader_rng,
                        "start_rng": self.loop.start_rng,
                        "start_generators": self.loop.start_generators,
                        "batch_generators": self.loop.batch_generators,
                        "loader_rng_now": [g.get_state() for g in self.loop.generators],
                        "loader_iterator_reused": self.loop.iterator_reused,
                        "loader_states": self.loop.loader_states,
                        "loader_shape": self.loop.loader_shape,
                        "untracked": self.loop.untracked,
                        "exact": self._newest_exact() if self.loop.untracked else None,
                        # (how the next epoch begins: only a save at an epoch's end uses it)
                        **_loader_now(self.loop.loader if self.loop.next_batch == 0
                                      else None)},
               "variables": {n: to_storable(v) for n, v in found.variables.items()},
               **_flags_off(found.statefuls)}
        taken_ids = saved_ids(found.variables)
        if not self.config.sync:
            self._buffers.start()
        objects = {_stored_key(n): obj for n, obj in found.statefuls.items()}
        # The history keeps every metric logged; the checkpoint, those measured on its state.
        metrics = {name: value for name, value in self.metrics.items()
                   if self._logged_at.get(name) == self._steps_seen}
        state = self.manager.capture(objects, metrics=metrics,
                                     extra={RUN_KEY: run}, rng=rng or True,
                                     copy_tensors=False if self.config.sync else self._buffers)
        epoch, batch = self.loop.epoch, self.loop.next_batch
        fields = dict(epoch=epoch, batch_idx=batch if epoch is not None or batch else None,
                      step=self.step, metrics=metrics, note=reason)
        self.last_save_step, self.last_save_time = self.step, time.monotonic()
        self._metric_due = False
        self._save_asked = None

        steps_seen, trained = self._steps_seen, _trained(found.statefuls.values())
        if self.loop.untracked is None:
            self._exact_taken += 1
        exact_taken = self._exact_taken if self.loop.untracked is None else None

        def write() -> str:
            self._follow_position()  # a rollback elsewhere may have moved the kernel
            if exact_taken is None and self._resumable() and \
                    (exact := self._newest_exact()) is not None:
                # (what a rerun after a stop in this later loop resumes from: kept while
                # the run goes on, whatever --keep says; the saves before are written; one
                # at a time: the run's earlier exact checkpoints are not resumed from)
                kept, self._kept_exact = self._kept_exact, exact
                self.manager.named = {*(self.manager.named - {kept}), exact}
            cid = self.manager.save_state(state, **fields)
            _saved_ids[cid] = taken_ids  # (the lists and dicts a put back may refill)
            self._written.setdefault(run["run"], set()).add(cid)  # (_path_to's)
            if exact_taken is not None:
                self._exact_written = (exact_taken, run["run"], cid)
            if finished:
                self._note_end(cid)
            _position_objects[self.url] = (fields["step"], trained)
            self._last_write = _Write(cid, steps_seen, metrics, reason)
            return cid

        if self.config.sync:  # (a failure said as a background one's: training goes on)
            try:
                self.writer.last_id = write()
            except Exception as exc:  # (as the writer thread catches it)
                self.writer.errors.append(exc)
                self._report_background_error(
                    unsaved=(unsaved or f"the save ({reason})") if wait else None)
                return None
            return self.writer.last_id
        written = self.writer.submit(write)
        if not wait:
            return None
        self.writer.wait()
        failed = written.exception()
        self._report_background_error(
            unsaved=None if failed is None else (unsaved or f"the save ({reason})"))
        return None if failed is not None else written.result()

    def _note_end(self, end_id: str) -> None:
        """Note in the store (``runs/<run id>.json``, which a rebuilt catalog leaves as it
        is) that this run ended at ``end_id``, and its checkpoints on the path there:
        their records say it had not ended, and once that end is deleted (the explorer's
        Delete, ``ckpt-nb rm``) the run must not be resumed from them (``_ended``). A run
        that ends again on another branch (run on after a rollback) adds an end; one
        whose checkpoints are all gone is dropped."""
        manager = self.manager
        try:
            path = self._path_to(end_id, self._run_ends(self._run_id))
            key = run_key(self._run_id)
            with manager._exclusive():  # (read and put again: gc's pruning waits)
                self._ends_read.pop(self._run_id, None)
                ends = self._run_ends(self._run_id)
                if ends:
                    kept = {row.id for row in manager.catalog.checkpoints()}
                    ends = [end for end in ends if kept & {end["end"], *end["before"]}]
                ends = [*ends, {"end": end_id, "before": path}]
                manager.store.put(key, json.dumps({"ends": ends}).encode())
                self._ends_read[self._run_id] = ends
        except (OSError, CkptError, sqlite3.Error) as exc:  # (StoreError too)
            warn(f"checkpoint {end_id} ended the cell's run, but noting so in the store "
                 f"failed ({exc}): were {end_id} deleted, running the cell again would "
                 "resume the run from its checkpoint before; pass --no-resume "
                 "(auto(resume=False)) then", RuntimeWarning)

    _PATH_KEPT = 256  # a run's checkpoints an end notes: the newest, those a resume takes

    def _path_to(self, end_id: str, ends: list[dict[str, Any]]) -> list[str]:
        """This run's checkpoints on the path to ``end_id`` (at most ``_PATH_KEPT``),
        oldest first: its catalog ancestors while their records are this run's (the
        manager keeps its newest saves' manifests), up to the first one on the path to an
        earlier end of the run (a rollback's), whose own path before it is taken whole."""
        catalog = self.manager.catalog
        path: list[str] = []  # (newest first)
        row = catalog.get(end_id)
        at = row.parent if row is not None else None
        while at is not None and len(path) < self._PATH_KEPT:
            earlier = next((end["before"] for end in ends if at in end["before"]), None)
            if earlier is not None:
                path.extend(reversed(earlier[:earlier.index(at) + 1]))
                break
            if at not in self._written.get(self._run_id, ()):  # (else: read its record)
                run = self._run_record(at)
                if run is None or run.get("run") != self._run_id:
                    break
            path.append(at)
            row = catalog.get(at)
            at = row.parent if row is not None else None
        return path[:self._PATH_KEPT][::-1]

    @functools.cached_property
    def _ends_read(self) -> dict[str, list[dict[str, Any]]]:
        """The ends of each run this session read or noted (``_run_ends``): on an object
        store each read is a round trip."""
        return {}

    def _run_ends(self, run_id: str) -> list[dict[str, Any]]:
        """The ends ``_note_end`` noted of a run: none where its file is missing, or does
        not read (hand-edited: it ends nothing). A store that cannot be read raises."""
        if run_id not in self._ends_read:
            try:
                noted = json.loads(self.manager.store.get(run_key(run_id)))["ends"]
                ends = [end for end in noted if isinstance(end, dict)
                        and isinstance(end.get("end"), str) and isinstance(end.get("before"), list)
                        and all(isinstance(cid, str) for cid in end["before"])]
            except (FileNotFoundError, ValueError, KeyError, TypeError, RecursionError):
                ends = []  # (CorruptCheckpointError too: a run id no save makes)
            self._ends_read[run_id] = ends
        return self._ends_read[run_id]

    def _ended(self, run: dict[str, Any], checkpoint_id: str) -> bool:
        """Whether the run of ``checkpoint_id``'s record ended after it: an end of the run
        that ``_note_end`` noted with it on the path there is deleted (a run resumed after
        a rollback to an earlier checkpoint, gone on past it on a new branch, has not
        ended at its new checkpoints)."""
        run_id = run.get("run")
        if not isinstance(run_id, str):
            return False  # (saved before runs had ids)
        catalog = self.manager.catalog
        try:
            if any(checkpoint_id in end["before"] and catalog.get(end["end"]) is None
                   for end in self._run_ends(run_id)):
                return True
            with catalog._lock:  # (a store's note before run files: the catalog's, last end)
                end = catalog._meta(f"{_ENDED}{run_id}")
            return end is not None and catalog.get(end) is None \
                and catalog.heir_of(end) == checkpoint_id
        except (OSError, sqlite3.Error):
            return False

    def _tell_skipped(self, found: Discovery) -> None:
        """Say once what a save leaves out that the cell's first line did not name (a
        DataFrame made in the cell with a column that would not come back)."""
        new = {name: why for name, why in found.skipped.items()
               if (name, why) not in self._told_skipped}
        if new:
            self._told_skipped.update(new.items())
            self.say("not saving " + skipped_text(new))

    def _note_loop_began(self) -> None:
        """Note what is tracked as the cell's loop begins (``_tell_made_in_loop``)."""
        if self._tracked_at_loop is None and not self._any_cell:
            self._tracked_at_loop = set(self.rediscover().statefuls)

    def _pull_locals(self) -> None:
        """Read the function's locals into the namespace (``locals_frame``): the dict
        ``locals()`` gave holds them as they were when it was called."""
        if self.locals_frame is None:
            return
        live = self.locals_frame.f_locals  # (before 3.13: the very dict, brought up to date)
        if live is not self.namespace:  # (3.13 on: a view of the frame; locals() a copy)
            self.namespace.clear()
            self.namespace.update(live)

    def _push_locals(self, names: Iterable[str]) -> None:
        """Write the namespace's ``names`` back into the function's locals
        (``locals_frame``), right after they were put back: a resume's values otherwise
        stay in a dict the function never reads."""
        frame = self.locals_frame
        values = {name: self.namespace[name] for name in names if name in self.namespace}
        if frame is None or not values:
            return
        # Before 3.13 f_locals is the frame's dict brought up to date from its variables
        # (which drops the put-back values where the namespace is that dict, and is not
        # the namespace where it is a copy of locals()); each is set in it, then written
        # into the variables. From 3.13 on, f_locals writes through (PEP 667).
        live = frame.f_locals
        for name, value in values.items():
            live[name] = value
        if sys.version_info < (3, 13):
            ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))

    def _untracked_refusal(self, ck: Checkpoint, step: int | None, untracked: list[str],
                           tracked: set[str]) -> str:
        """Why a resume refuses checkpoint ``ck``, which holds the objects ``untracked``
        (names) that the cell does not track now (sorted by ``rediscover`` just before).
        Where the namespace holds something else under each (``best_model = None`` ahead
        of the loop, ``copy.deepcopy(model)`` in it), that is said, with what to make it:
        "define them ahead of the cell's loops" read oddly where the name was defined, as
        None. As ``_tell_made_in_loop`` said at the first save."""
        start = (f"not resuming checkpoint {ck.id} (step {step}): it holds "
                 f"{', '.join(untracked)}, which this cell does not track now (it tracks "
                 f"{', '.join(map(_live_name, tracked)) or 'nothing'}), and the loop would "
                 "go on from the saved position without their state")
        # (each sorted now as a value or skipped: none that --track leaves out)
        held = {name: self.namespace[name] for name in untracked if name in self.namespace
                and (name in self.discovery.variables or name in self.discovery.skipped)}
        if len(held) < len(untracked):
            return (f"{start}; define them ahead of the cell's loops (one made inside a "
                    "loop, a generator seeded by epoch say, is not there yet as a resume "
                    "begins), or add them to --track, or run with --no-resume "
                    "(auto(resume=False)) not to resume it")
        kinds = {name: ck.kinds.get(_stored_key(name), "").rpartition(".")[2] or "object"
                 for name in held}
        now = ", ".join(f"{name} is {'None' if value is None else _a(type(value).__name__)}"
                        f" here, where the checkpoint holds {_a(kinds[name])}"
                        for name, value in held.items())
        them = "it" if len(held) == 1 else "them"
        make = f"{untracked[0]} {_a(kinds[untracked[0]])}" if len(held) == 1 else \
            "each what the checkpoint holds"
        module = next((name for name in held if ck.kinds.get(_stored_key(name), "")
                       .startswith("torch.nn.")), None)
        source = None if module is None else _copied_from(
            self.discovery.statefuls, kinds[module], module)
        example = "" if module is None else f" (`{module} = copy.deepcopy({source})`" + (
            f" in place of `{module} = None`)" if held[module] is None else ")")
        return (f"{start}: {now} (a resume begins where the loop does, before a loop that "
                f"makes {them} has run); make {make} ahead of the cell's loops, where a "
                f"resume finds {them} to load{example}, and run the cell again; or run "
                "with --no-resume (auto(resume=False)) not to resume it")

    def _tell_made_in_loop(self, found: Discovery) -> None:
        """Say once of each object a save tracks that the cell's loop made (``best_model =
        copy.deepcopy(model)`` on an improvement): a resume in a new process begins as the
        loop does, before the loop makes it, and refuses every checkpoint holding it
        (``_resume_now``), so this run could not go on after a crash."""
        if self._tracked_at_loop is None:
            return
        made = [name for name in found.statefuls
                if name not in self._tracked_at_loop and name not in self._told_made_in_loop]
        if not made:
            return
        self._told_made_in_loop.update(made)
        names = ", ".join(f"{name} ({type(found.statefuls[name]).__name__})" for name in made)
        them = "it" if len(made) == 1 else "them"
        # (a copy of a module the loop began with, by its type: an EMA's AveragedModel or
        # a new head is made ahead as it is, not copied)
        copied = next(((name, source) for name in made
                       for source in sorted(self._tracked_at_loop)
                       if isinstance(found.statefuls[name], torch.nn.Module)
                       and type(found.statefuls.get(source)) is type(found.statefuls[name])),
                      None)
        example = "" if copied is None else (
            f" (`{copied[0]} = copy.deepcopy({copied[1]})`; or keep "
            f"`copy.deepcopy({copied[1]}.state_dict())` in the variable, saved as a value)")
        self.say(f"{names}, made in the cell's loop, {'is' if len(made) == 1 else 'are'} in "
                 "its checkpoints from this one on, which a resume in a new process (a "
                 "kernel restarted after a crash) refuses: it begins where the loop does, "
                 f"before the loop makes {them}; make {them} ahead of the cell's loops too, "
                 f"where a resume finds {them} to load{example}")

    def _save_end(self, finished: bool) -> str | None:
        """The cell's end save: its id, or None where it failed (said)."""
        self.writer.wait()
        if self._interrupts > 1:  # (a second interrupt, held during that wait: stop at once)
            raise KeyboardInterrupt
        self._report_background_error()  # (the save in flight's, said apart)
        prior = self._last_write
        # (a line form's cell whose last step a trigger saved: its end's save, of the same
        # state and the variables the cell changed after it, is that trigger's)
        reason = prior.note if not finished and prior is not None and \
            prior.id == self._position and prior.steps_seen == self._steps_seen and \
            self._steps_seen > self._line_cell_began else "end of cell"
        return self._save_in_place(reason=reason, finished=finished, wait=True,
                                   unsaved="the cell's end")

    def _save_in_place(self, *, reason: str, finished: bool = False, wait: bool = False,
                       rng: dict[str, Any] | None = None, unsaved: str | None = None
                       ) -> str | None:
        """``save()``, where the save in flight is in. Where this run's last save holds
        the same state (no optimizer step since, the same objects, no metric that this one
        lacks), that one goes once this one is in: one checkpoint per state, not an "every
        N steps" one and an "end of cell" or an --on one (whose metric the other lacks).
        Retention counts the two as one meanwhile; this save is then waited for."""
        prior = self._last_write
        if prior is None or prior.id != self._position or prior.steps_seen != self._steps_seen:
            return self._save(reason=reason, finished=finished, wait=wait, rng=rng,
                              unsaved=unsaved)
        manager = self.manager
        limits = manager.max_to_keep, manager.keep_best
        manager.max_to_keep, manager.keep_best = (None if n is None else n + 1 for n in limits)
        try:
            cid = self._save(reason=reason, finished=finished, wait=True, rng=rng,
                             unsaved=unsaved)
        finally:
            manager.max_to_keep, manager.keep_best = limits
        written = self._last_write
        if cid is None or written is None:
            return None  # (the save failed: the prior one stays)
        # Under the store's lock: no other process pins, notes or saves a child of the
        # prior one between the look and the delete. One a user marked (pinned, noted,
        # tagged) stays.
        with contextlib.suppress(CkptError), manager._exclusive():
            row = manager.catalog.get(prior.id)
            if prior.metrics.items() <= written.metrics.items() and row is not None \
                    and not row.pinned \
                    and row.note == prior.note and not row.tags \
                    and manager.catalog.children(prior.id) == [written.id] \
                    and self._same_objects(prior.id, written.id):
                manager.delete(prior.id)
                return cid
        if limits != (None, None):  # two states after all: retention as the user set it
            with manager._exclusive(), contextlib.suppress(OSError):  # (next save's, else)
                manager._catch_up()
                manager._apply_retention(protect={written.id})
            manager._notify_retention()
        return cid

    def _same_objects(self, first: str, second: str) -> bool:
        """Whether two checkpoints hold the same tracked objects (``_held_objects``)."""
        try:
            return _held_objects(self.manager._manifest(first)) == \
                _held_objects(self.manager._manifest(second))
        except (CkptError, KeyError, IndexError, TypeError):
            return False  # (unreadable: keep both)

    def _report_background_error(self, unsaved: str | None = None) -> None:
        """Say that a background save failed. The same failure again (a full disk, at
        every trigger after) is counted, not said: the count comes when the cell ends.
        ``unsaved``: the last one is a save waited for, which the cell must not pass over
        (the cell's end, the state at an interrupt): what it lost, said NOT saved."""
        errors = self.writer.take_errors()
        for i, error in enumerate(errors):
            line = f"{type(error).__name__}: {error}"
            if unsaved is not None and i == len(errors) - 1:
                self.say(f"{unsaved} was NOT saved: {line}; {self._latest_said()}",
                         failure=True)
            elif _FILE_ID.sub("", line) in self._said_failures:
                self._failure_repeats += 1
            else:
                self._said_failures.add(_FILE_ID.sub("", line))
                self.say(f"a {'' if self.config.sync else 'background '}save failed: {line}",
                         failure=True)

    def _latest(self) -> str:
        """The latest checkpoint of this session's (its last save that went in, or the
        one it resumed or rolled back to) and its step, in words; "none" where none."""
        row = self.manager.catalog.get(self._position) if self._position else None
        return "none" if row is None else _with_step(row)

    def _latest_said(self) -> str:
        """"the latest checkpoint is ID (step S)" (``_latest``); where this session has
        none, the one its state came from (a finished run's end, its cell run again:
        "none" misled, as if nothing was saved), said so."""
        began = _positions.get(self.url) if self._position is None else None
        row = self.manager.catalog.get(began) if began is not None else None
        if row is None:
            return f"the latest checkpoint is {self._latest()}"
        return f"this run saved none; the latest checkpoint is {_with_step(row)}, where it began"

    def _report_repeats(self) -> None:
        if self._failure_repeats:
            print(f"ckpt_nb: {self._failure_repeats} more "
                  f"{'' if self.config.sync else 'background '}save"
                  f"{'s' if self._failure_repeats > 1 else ''} failed the same way",
                  file=sys.stderr, flush=True)
        self._failure_repeats = 0
        self._said_failures.clear()
        self._told_slow = False

    # -- resume -----------------------------------------------------------------------------
    def _find_resume(self, unseen: list[str]) -> None:
        """Pick the unfinished run this cell resumes, if any; refuse to resume it where
        ``unseen`` names stateful objects the session does not see (``begin_cell``).

        Where the kernel stands (its last save, resume or rollback on this store) when
        that is a run of this cell, or the checkpoint the user rolled back to unless cell
        ids say it is another cell's; else its newest checkpoint (in a fresh kernel after
        a crash, "Run All" resumes each cell where it stopped; in this one, a cell stopped
        before another cell ran goes on where it stopped). A run is this cell's by the
        notebook's cell id where both have one, else by the cell's code. Another cell's
        run is not resumed (but after a rollback, where no cell ids tell the cells
        apart): this cell's loop would go on from that cell's position (the cells of a
        notebook share its default store). After a rollback to another cell's checkpoint
        (a finished cell's end, as its "Run All" hint advises), this cell's own unfinished
        run resumes where it went on from that checkpoint (``_own_run_after``).
        Without cell ids, an edited cell is another cell until the user rolls back to its
        run: nothing tells the two apart (a fine-tune cell is often the training cell's
        copy, and a fix may rewrite much of a cell), and a new cell taken for an edit
        trains on silently from the other run's position, where an edit taken for a new
        cell is told the rollback that resumes its run.
        """
        self._pending = self._run_to_resume(unseen)
        if (gone := _deleted_rollbacks.get(self.url)) is not None:
            self._tell_rollback_deleted(gone, self._pending)

    def _tell_rollback_deleted(self, gone: str, pending: _Pending | None) -> None:
        """Say that the checkpoint rolled back to was deleted since, and with it where its
        run's loops stood, so the rerun does not go on from it: what it does instead (the
        position is now its nearest kept ancestor), and how to choose otherwise."""
        heir = _positions.get(self.url)
        deleted = f"checkpoint {gone}, rolled back to, was deleted since"
        if pending is None:
            kept = f"{heir} is the deleted one's nearest kept ancestor" if heir is not None \
                else "none of the deleted one's ancestors is kept"
            self.say(f"{deleted}, and where its loops stood with it: this cell's loops start "
                     "from the beginning, on the state in memory (to train from a kept checkpoint "
                     f"instead, interrupt the cell and %ckpt_rollback it; {kept})")
            return
        if (pending.run.loop or {}).get("untracked") is not None:
            return  # (not resumed: the resume says what it does in its place)
        resumed = pending.checkpoint.id
        which = "its nearest kept ancestor" if resumed == heir else \
            f"this cell's run that went on from {heir}, its nearest kept ancestor" \
            if heir is not None else "this cell's unfinished run (none of the deleted " \
            "one's ancestors is kept)"
        self.say(f"{deleted}: resuming from {resumed}, {which}, in its place (the state the "
                 f"rollback put back is replaced by {resumed}'s; %%ckpt_auto --no-resume "
                 "trains on from it, its loops from the start)")

    def _run_to_resume(self, unseen: list[str]) -> _Pending | None:
        """The run ``_find_resume`` picks, read, or None."""
        position = _positions.get(self.url)
        rolled_back = _position_events.get(self.url) == "rollback"
        candidate = None
        run = self._run_record(position) if position is not None else None
        if run is not None and not run.get("finished") and \
                (rolled_back or not self._ended(run, position)):
            # After a rollback, a cell is taken for the run's, edited, unless cell ids
            # tell them apart: without ids, going on with another cell looks the same.
            if self._is_this_cell(run) or (rolled_back and not self._told_apart(run)):
                candidate = position
        if candidate is None and not rolled_back:
            candidate = self._newest_of_this_cell()
        elif candidate is None and position is not None and \
                (run is None or not self._is_this_cell(run)):
            # Rolled back to another cell's checkpoint (the end of the cell before, as a
            # finished cell's "Run All" hint advises): this cell's run that went on from
            # it goes on; a rollback to the cell's own checkpoint means to start from there.
            candidate = self._own_run_after(position)
            # (a deleted rollback's heir stands in for it here, but holds another state
            # than the kernel's: _tell_rollback_deleted says what the cell does instead)
            if candidate is None and run is not None and not run.get("finished") and \
                    self._told_apart(run) and self.url not in _deleted_rollbacks:
                self.say(f"checkpoint {position}, rolled back to, holds a run of another "
                         "cell: this cell's loops start from its state, not from that run's "
                         "position")
        if candidate is None:
            return None
        try:
            ck = self._read(candidate)
        except StateMismatchError as exc:  # (--trust-pickle: a pickle's class not defined;
            # starting afresh, the cell's --keep would delete the run it was asked to resume)
            raise StateMismatchError(f"not resuming checkpoint {candidate}: {exc}; or run the "
                                     "cell with --no-resume (auto(resume=False)) not to "
                                     "resume it") from exc
        except CkptError as exc:
            self.say(f"cannot read checkpoint {candidate} ({exc}); starting afresh")
            return None
        run = ck.extra.get(RUN_KEY)
        if not isinstance(run, dict) or run.get("finished") or run.get("cell") is None:
            return None
        if unseen:  # (the run's checkpoints hold none of them: it went on without them)
            raise StateMismatchError(
                f"not resuming checkpoint {ck.id} (step {ck.step}): auto() in a function sees "
                f"its module's globals, not {', '.join(unseen)} among the function's locals, "
                "and the loop would go on from the saved position with them as they are now; "
                "pass namespace=locals() (or auto(resume=False) not to resume)")
        for notice in _orphaned_optimizers([_live_name(key) for key in ck.state],
                                           self.discovery, self.namespace):
            warn(f"resuming checkpoint {ck.id}: {notice}", RuntimeWarning)
        saved = _SavedRun.read(ck.id, run, resume=True)  # (before the cell runs a line)
        return _Pending(ck, saved)

    def _read(self, checkpoint_id: str) -> Checkpoint:
        """A checkpoint a resume reads: its pickles loaded where the cell trusts the store
        (--trust-pickle), else left as placeholders, unsaid: the resume refuses those of
        its objects (``_resume_now``), and leaves out a variable holding one, said."""
        return self.manager.load(checkpoint_id, trust_pickle=self.config.trust_pickle,
                                 tell_pickles=False)

    def _leave_pending(self, why: str, *, go_on: bool = True, promised: bool = False,
                       deleted: str | None = None) -> None:
        """Leave the run found to resume as it is (``why``: what keeps this cell from
        resuming it): say so, unless the kernel's state is its checkpoint's already (a
        rollback to it, or the stop that saved it said so), and keep that checkpoint
        while the cell runs. Retention counts it as this cell's own: under --keep the
        cell's new saves deleted the crashed run's without a word. ``go_on``: whether a
        rollback to it, then this cell, goes on with that run (not where its position is
        no loop's the cell tracks: run again, its loops start over on that state);
        ``promised``: the stop that saved it said a rerun resumes the run (said even so);
        ``deleted``: the checkpoint rolled back to, deleted since, that it stands in for
        (the kernel holds that one's state, not its own: said too)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        checkpoint_id = pending.checkpoint.id
        self.manager.named = {*self.manager.named, checkpoint_id}
        said = _positions.get(self.url) == checkpoint_id and not promised and deleted is None
        # (its steps count on from the kernel's position, as a cell's that finds no run)
        self._count_on()
        self._tell_left_unsaved()
        if said:
            return
        self.say(_in_place_of(deleted)
                 + f"checkpoint {checkpoint_id} holds an unfinished run of this cell (step "
                 f"{pending.run.step}) that it cannot resume: {why}. This cell trains from "
                 "the objects as they are now"
                 + (" (as the rollback put them back), its loops from the start" if deleted
                    else "") + " (that checkpoint is kept while it runs); "
                 + ("to go on with that run instead, interrupt this cell and "
                    + _rollback_advice(checkpoint_id, self.config.directory
                                       or location(self.manager.store)) if go_on else
                    "for a run that resumes exactly, put its loops in `for epoch in "
                    "ckpt_nb.epochs(N)` (each epoch tracks its first batches() loop)"))

    def _exact_before(self, later: Checkpoint) -> _Pending | None:
        """The newest of ``later``'s run's checkpoints before it whose position is exact
        (``_exact_ancestor``), read, or None."""
        run = later.extra.get(RUN_KEY, {})
        at = self._exact_ancestor(later.id, run) if isinstance(run.get("run"), str) else None
        if at is None:
            return None
        try:
            ck = self._read(at)
            return _Pending(ck, _SavedRun.read(ck.id, ck.extra[RUN_KEY], resume=True))
        except CkptError as exc:
            self.say(f"cannot read checkpoint {at} ({exc})")
            return None

    def _exact_ancestor(self, later: str, record: dict[str, Any]) -> str | None:
        """The newest checkpoint of ``later``'s run (``record``, its run record, as the
        caller read it) before it whose position is exact (saved before a later loop
        began: ``_untracked_loop``), or None: the one ``record`` names
        (``_newest_exact``), else ``later``'s catalog ancestors while their records are
        that run's (``_PATH_KEPT`` at most: a store of an earlier ckpt_nb)."""
        catalog, run_id = self.manager.catalog, record["run"]
        named = (record.get("loop") or {}).get("exact")
        if isinstance(named, str) and catalog.get(named) is not None and \
                (run := self._run_record(named)) is not None and run.get("run") == run_id and \
                isinstance(loop := run.get("loop"), dict) and loop.get("untracked") is None:
            return named
        row = catalog.get(later)
        at, walked = (row.parent if row is not None else None), 0
        while at is not None and walked < self._PATH_KEPT:
            run = self._run_record(at)
            if run is None or run.get("run") != run_id:
                return None
            if isinstance(loop := run.get("loop"), dict) and loop.get("untracked") is None:
                return at
            row, walked = catalog.get(at), walked + 1
            at = row.parent if row is not None else None
        return None

    def _count_on(self) -> None:
        """A run of the models and optimizers the kernel's position was saved from or put
        into (a finished cell run again) counts its steps on from that position's, so that
        they never go back along a branch. New ones (the set-up cell run again) descend
        from no checkpoint: step 0, in a new root, as in a fresh kernel. ``epochs()``
        still counts from its own start."""
        if self.url not in _position_objects:
            self._tell_finished()
            self._tell_rolled_back_elsewhere()
        step, trained = _position_objects.get(self.url, (None, []))
        if not trained:
            return
        live = {id(obj) for obj in self.discovery.statefuls.values()}
        if any(ref() is not None and id(ref()) in live for ref in trained):
            if step:  # (with the steps the cell took before a run to resume was left)
                taken = self.step - self._step_offset
                self.last_save_step = self._step_offset = step
                self.step = step + taken
        else:
            _forget_position(self.url)
            self.manager.head = None

    def _count_on_after(self, above: AutoSession) -> None:
        """Active again after ``above`` closed (a %%ckpt_auto cell or ``auto()`` block run
        under the line form), on this store: where the kernel's state last came from it (its
        saves, its resume), this session's steps count on from that checkpoint's, as after a
        rollback. They went on from this session's own count, without the steps the cell
        took: a save at step 13 under the cell's end at step 18."""
        step, trained = _position_objects.get(self.url, (None, []))
        if above._position is None or _positions.get(self.url) != above._position \
                or step is None:
            return
        # (sorted again: the cell may have made the model and optimizer it trained anew)
        live = {id(obj) for obj in self.rediscover().statefuls.values()}
        if any(ref() is not None and id(ref()) in live for ref in trained):
            self._count_from(step)

    def _count_from(self, step: int) -> None:
        """The kernel's state is a checkpoint's at ``step`` (rolled back to, or a cell's
        under the line form): the later steps count on from it, by what the optimizers it
        tracks now take. Those no longer tracked (the old ``opt`` that a cell made anew)
        are forgotten: their steps stayed in the most any optimizer took and held the step
        back, a new optimizer's first steps counted none (11 where 14 were taken)."""
        tracked = {id(obj) for obj in self.discovery.statefuls.values()}
        for key in [key for key in self._steps_by_optimizer if key not in tracked]:
            del self._steps_by_optimizer[key]  # (one that steps again counts on anew)
        self.step = self.last_save_step = step
        self._step_offset = step - max(self._steps_by_optimizer.values(), default=0)

    def _tell_rolled_back_elsewhere(self) -> None:
        """Where the models and optimizers this store's run tracks are those a rollback
        on another store put back (``%ckpt_rollback latest --dir S_old``, then a cell on
        S), say so: the position is that store's, so here the run starts over on them,
        its loops from the start and its steps from 0, in a new root, which went without
        a word."""
        live = {id(obj): name for name, obj in self.discovery.statefuls.items()}
        for url, event in reversed(_position_events.items()):  # (the newest first)
            _, trained = _position_objects.get(url, (None, []))
            names = [live[id(obj)] for ref in trained
                     if (obj := ref()) is not None and id(obj) in live]
            if not names:
                continue
            if event != "rollback" or url == self.url or url not in _positions:
                return  # (trained since, by a save on a store: no rollback's state)
            where = str(file_url_path(url)) if url.startswith("file:") else url
            self.say(f"{', '.join(names)} come{'s' if len(names) == 1 else ''} from "
                     f"checkpoint {_positions[url]} of {where} (rolled back to there); "
                     f"that position is that store's, so in "
                     f"{location(self.manager.store)} this run starts over on "
                     f"{'it' if len(names) == 1 else 'them'}: its loops from the start, "
                     "steps from 0, in a new root")
            return

    def _tell_finished(self) -> None:
        """In a kernel that has not saved, resumed or rolled back on this store (a new one,
        after a crash: "Run All"), say that this cell, unchanged, ran to its end before and
        trains again from scratch, and how to take that end instead, before hours go by."""
        finished, self._finished = self._finished, None
        if finished is None or finished.run.get("cell") != self.cell_hash or not _in_ipython():
            return  # (a script run again means to train again)
        row = finished.row
        at = ", ".join(f"{name} {value}" for name, value in
                       (("epoch", row.epoch), ("step", row.step)) if value is not None)
        self.manager.named = {row.id}  # (kept while the cell runs, whatever --keep says)
        self.say(f"this cell ran to its end before, at checkpoint {row.id}"
                 f"{f' ({at})' if at else ''}: it trains again from the objects as they are "
                 f"now; to take that run's end state instead, interrupt it and run "
                 f"`%ckpt_rollback {row.id}`")

    def _run_record(self, checkpoint_id: str) -> dict[str, Any] | None:
        """The run bookkeeping a checkpoint holds (read from its manifest alone)."""
        try:
            extra = self.manager._saved_extra(checkpoint_id)
        except (CkptError, KeyError, TypeError):
            return None
        run = extra.get(RUN_KEY) if isinstance(extra, dict) else None
        return run if isinstance(run, dict) else None

    def _own_checkpoints(self) -> set[str]:
        """The checkpoints of this cell's runs (``_is_this_cell``), the only ones its
        retention deletes; the line form's, those this process saved. Never those of a
        run another live process saves (the same notebook run twice at once, a papermill
        sweep, has the same cells), nor where a dead one's unfinished run of this cell
        resumes from (``_resume_points``): the other kernel's --keep deleted a crashed
        kernel's run within seconds, and its restart trained from scratch."""
        own = set()
        alive: dict[str, bool] = {}  # (an owner asked once a pass)
        rows = self.manager.catalog.checkpoints()
        for row in rows:
            run = self._run_summary(row.id)
            if run is None or not self._is_this_cell(run):
                continue
            owner = run["owner_key"]
            if owner not in alive:
                alive[owner] = _live_owner(run["owner"]) is not None
            if not alive[owner] and (self.cell_hash is not None or run["owner"] == _owner()):
                own.add(row.id)
        own -= self._rolled_back_branches(rows)
        if self.cell_hash is None:
            return own  # (the line form's runs are never resumed)
        return own - self._resume_points(rows, alive)

    def _rolled_back_branches(self, rows: list[CheckpointRow]) -> set[str]:
        """The checkpoints this kernel rolled back to on this store (``_rolled_back_to``)
        and those on their other branches, off the lineage the kernel's saves go on
        (``rows``: the catalog's, in save order): a rollback forks to compare the branches,
        and the cell's --keep, run again on the new one, deleted the branch it came from,
        the fork point too, leaving the new branch a root."""
        forks = _rolled_back_to.get(self.url)
        if not forks:
            return set()
        parents = {row.id: row.parent for row in rows}
        lineage: set[str] = set()
        at = self.manager.head
        while at is not None and at not in lineage:
            lineage.add(at)
            at = parents.get(at)
        kept: set[str] = set()
        for row in rows:  # (a parent is saved before its children)
            if row.id in forks or row.id not in lineage and \
                    (row.parent in forks or row.parent in kept):
                kept.add(row.id)
        return kept

    def _run_summary(self, checkpoint_id: str) -> dict[str, Any] | None:
        """What retention needs of a checkpoint's run record, read once (it never
        changes): whose cell and run it is, who saved it, whether it ended the run, and
        the exact checkpoint a resume of it takes where it was saved in a later loop."""
        if checkpoint_id not in self._run_of:
            run = self._run_record(checkpoint_id)
            loop = run.get("loop") if run is not None else None
            self._run_of[checkpoint_id] = None if run is None else {
                **{key: run.get(key) for key in ("cell", "cell_id", "owner", "run", "finished")},
                "owner_key": json.dumps(run.get("owner"), sort_keys=True, default=str),
                "exact": loop.get("exact") if isinstance(loop, dict)
                and loop.get("untracked") is not None else None}
        return self._run_of[checkpoint_id]

    def _resume_points(self, rows: list[CheckpointRow], alive: Mapping[str, bool]) -> set[str]:
        """The checkpoints a kernel started now would resume this cell's unfinished run
        of another, dead process from (``_newest_of_this_cell``): the newest such run's
        newest checkpoint (and the exact one before it, where that was saved in a later
        loop), passing over the runs live processes (this one too) train; none past a
        newer dead run that ended. ``rows``: the catalog's, their summaries read;
        ``alive``: whether each owner of this cell's runs lives."""
        taken: set[Any] = set()  # (runs a live process trains on)
        points: set[str] = set()
        for row in reversed(rows):
            run = self._run_of.get(row.id)
            if run is None or not self._is_this_cell(run):
                continue
            if run["owner"] == _owner() or alive[run["owner_key"]]:
                taken.add(run["run"])
            elif run["run"] not in taken:
                if run["finished"] or self._ended(run, row.id):
                    break  # (a kernel started now resumes none past it)
                # (a kernel started now resumes this one run and no older: each crash of a
                # --no-resume run, never taken over, kept one more for ever)
                points.update(cid for cid in (row.id, run["exact"]) if isinstance(cid, str))
                break
        return points

    def _is_this_cell(self, run: dict[str, Any]) -> bool:
        if self.cell_id is not None and run.get("cell_id") is not None:
            return bool(run["cell_id"] == self.cell_id)
        return run.get("cell") == self.cell_hash

    def _told_apart(self, run: dict[str, Any]) -> bool:
        """Whether cell ids say the run is another cell's (where both have one)."""
        return self.cell_id is not None and run.get("cell_id") is not None \
            and run["cell_id"] != self.cell_id

    def _newest_of_this_cell(self, *, tell: bool = True) -> str | None:
        """This cell's newest checkpoint, when that run is unfinished; else None, saying
        so (where ``tell``) when the store's newest cell run is an unfinished one of other
        code that this cell could resume after a rollback: not the line form's (never
        resumed), nor one that cell ids tell apart from this cell (it never resumes it).
        Runs another live process saves, finished or not, are passed over (saying so of
        an unfinished one, where ``tell``): a kernel restarted after a crash goes on with
        its own dead run, not another kernel's newer one that is training now, nor one
        that kernel ran to its end since (that end is the one told of, where no dead run
        is found)."""
        newest: tuple[str, dict[str, Any]] | None = None
        passed_over: tuple[str, str] | None = None  # (the newest live run's checkpoint, owner)
        finished_live: _FinishedRun | None = None  # (the newest run a live process finished)
        alive: dict[str, str | None] = {}  # (an owner asked once a pass)
        live_runs: set[str] = set()  # (the runs passed over: a live process trains them)
        for row in reversed(self.manager.catalog.checkpoints()):
            run = self._run_record(row.id)
            if run is None:
                continue
            if newest is None and tell and run.get("cell") is not None \
                    and not self._told_apart(run) and not self._is_this_cell(run):
                newest = (row.id, run)
            if self._is_this_cell(run):
                key = json.dumps(run.get("owner"), sort_keys=True, default=str)
                if key not in alive:
                    alive[key] = _live_owner(run.get("owner"))
                if (owner := alive[key]) is not None:
                    if run.get("run") not in live_runs:  # (the run's newest checkpoint)
                        if run.get("finished"):
                            finished_live = finished_live or _FinishedRun(row, run)
                        else:
                            passed_over = passed_over or (row.id, owner)
                    if isinstance(run.get("run"), str):
                        live_runs.add(run["run"])
                    continue
                if run.get("run") in live_runs:
                    continue  # (an earlier part of a run a live process took over)
                found = None if run.get("finished") or self._ended(run, row.id) else row.id
                if run.get("finished") or (finished_live is not None and found is None):
                    self._finished = finished_live or _FinishedRun(row, run)
                if tell and passed_over is not None:
                    self._tell_passed_over(*passed_over, found)
                return found
        if finished_live is not None:
            self._finished = finished_live
        if tell and passed_over is not None:
            self._tell_passed_over(*passed_over, None)
        if newest is not None and not newest[1].get("finished") and \
                not self._ended(newest[1], newest[0]):
            self._tell_other_code(*newest)
        return None

    def _tell_other_code(self, checkpoint_id: str, run: dict[str, Any]) -> None:
        """Say that ``checkpoint_id`` holds an unfinished run of other code, not resumed
        here, and the rollback that resumes it: to that checkpoint, or, where it was saved
        in a later loop (a rollback to it starts the loops over on its state), to the
        run's exact checkpoint before it (``_exact_ancestor``); none where there is none.
        A run another live process saves is that process's to train on: it is named, and
        no takeover advised."""
        if (owner := _live_owner(run.get("owner"))) is not None:
            self.say(f"checkpoint {checkpoint_id} holds an unfinished run of other code "
                     f"{_OTHER_CODE[_in_ipython()]} of {owner}, which "
                     "trains it or goes on with it there: not resuming it here")
            return
        at = checkpoint_id
        if isinstance(loop := run.get("loop"), dict) and loop.get("untracked") is not None:
            exact = self._exact_ancestor(checkpoint_id, run) \
                if isinstance(run.get("run"), str) else None
            if exact is None:
                return  # (no position of that run to resume)
            at = exact
        before = "" if at == checkpoint_id else \
            f" from checkpoint {at}, its newest saved before its later loop began"
        self.say(f"checkpoint {checkpoint_id} holds an unfinished run of other code "
                 f"{_OTHER_CODE[_in_ipython()]}: not resuming it here; to resume it"
                 f"{before}, " + _rollback_advice(at, self.config.directory
                                                   or location(self.manager.store)))

    def _tell_passed_over(self, checkpoint_id: str, owner: str, found: str | None) -> None:
        """Say that the run of ``checkpoint_id``, which ``owner`` trains now, is not resumed,
        and which run of this cell is (``found``) or that the cell starts one of its own."""
        instead = f"resuming {found}, this cell's newest run whose process has ended, " \
            "instead" if found is not None else "this cell starts a run of its own"
        self.say(f"checkpoint {checkpoint_id} holds a run of this cell that {owner} saved: "
                 f"{instead} (%ckpt_rollback {checkpoint_id} takes that run over)")

    def _own_run_after(self, checkpoint_id: str) -> str | None:
        """This cell's newest unfinished run's newest checkpoint where it descends from
        ``checkpoint_id``: that run went on from the state a rollback put back."""
        newest = self._newest_of_this_cell(tell=False)
        if newest is None or newest == checkpoint_id:
            return None
        seen: set[str] = set()
        row = self.manager.catalog.get(newest)
        while row is not None and row.parent is not None and row.parent not in seen:
            if row.parent == checkpoint_id:
                return newest
            seen.add(row.parent)
            row = self.manager.catalog.get(row.parent)
        return None

    def _apply(self, ck: Checkpoint, saved: _SavedRun,
               keep: Iterable[str] = ()) -> tuple[dict[str, Any], list[str]]:
        """Load a checkpoint (its run record checked: ``_SavedRun.read``) into the live
        objects but those ``keep`` names (stored keys), and variables, RNG aside; returns
        the objects and the variables put back."""
        found = self.rediscover()
        targets = {_stored_key(n): obj for n, obj in found.statefuls.items()
                   if _stored_key(n) in ck.state and _stored_key(n) not in keep}
        variables = [n for n in saved.variables if self._assignable(n, found.statefuls)]
        load_all(targets, ck.state, kinds=ck.kinds, param_names=ck.param_names,
                 modules={_stored_key(n): obj for n, obj in found.statefuls.items()})
        kept = refillable(self.namespace, _saved_ids.get(ck.id, {}))
        tracked = parts_of(found.statefuls.values())
        for name in variables:
            assign_in_place(self.namespace, name, saved.variables[name], kept, tracked)
        self._push_locals(variables)
        self.history = saved.history
        self.metrics = dict(ck.metrics)
        if saved.step is not None:
            self._count_from(saved.step)
        return targets, variables

    def _rebaseline(self, objects: Mapping[str, Any]) -> None:
        """``objects`` (by stored key) were just put back in place, which bumped their
        version counters: what a resume tells changed since a stop, and what a run
        trains, is counted from them as they are now (what the checkpoint put back holds
        otherwise than a stop is read from the manifests, ``_trained_since``). A cell run
        again after a rollback to its stop said it kept a model the rollback had put back,
        and put back as saved what already was."""
        versions = {key: _versions(obj) for key, obj in objects.items()}
        for key in versions.keys() & self._start_versions.keys():
            self._start_versions[key] = versions[key]
        for cid, left in _left_saved.items():
            if self.manager.catalog.get(cid) is None:
                continue  # (another store's stop: this store's checkpoint changed its objects)
            for key, entry in list(left.items()):
                if key in versions and entry.ref() is objects[key]:
                    left[key] = dataclasses.replace(entry, versions=versions[key])

    def _assignable(self, name: str, statefuls: dict[str, Any]) -> bool:
        """Whether a saved variable is put back under ``name``: never over a tracked
        object or code (a module, a function, a class), and, named like a builtin
        (``len``), only where the notebook has that name already."""
        if name not in self.namespace:
            return name not in vars(builtins)
        return name not in statefuls and not is_code(self.namespace[name])

    def _comparable_values(self) -> dict[str, Any]:
        """The notebook's public values that are cheap to compare (numbers, strings,
        paths, dates), and the digests of the other variables a save captures: what a
        resume compares the live ones with (``_changed_since``)."""
        values: dict[str, Any] = {name: _Digest.of(value) for name, value
                                  in self.rediscover().variables.items()}
        values.update((name, value) for name, value in self.namespace.items()
                      if not name.startswith("_") and isinstance(value, _CHEAP))
        return values

    def _changed_since(self, saved: _SavedRun) -> dict[str, str]:
        """The variables a resume would put back that the user changed since the run
        stopped (``clip = 1.0`` before running the cell again): variables whose live value
        differs from the saved one and from the one the run left in this process (the
        loop's own ``epoch`` went on past the save), or, in a fresh process, from the
        saved one. Cheap values as ``name = saved (was live)``, others as ``name (type)``
        (``name (saved type, was live type)`` where the types differ)."""
        left = _left_values.get(self.url, {})
        changed = {}
        for name, value in saved.variables.items():
            if name not in self.namespace:
                continue
            live = self.namespace[name]
            if isinstance(value, _CHEAP) and isinstance(live, _CHEAP):
                if not _same(live, value) and not _same(live, left.get(name, value)):
                    changed[name] = f"{name} = {reprlib.repr(value)} (was {reprlib.repr(live)})"
                continue
            digest = _Digest.of(live)
            if digest != _Digest.of(value) and digest != left.get(name):
                kind, was = type(value).__name__, type(live).__name__
                changed[name] = f"{name} ({kind}{'' if was == kind else f', was {was}'})"
        return changed

    def _trained_since(self, ck: Checkpoint) -> list[str]:
        """The objects (stored keys) that the kernel's position (a later save or resume of
        this process) holds otherwise than ``ck``, where the live objects are that
        position's: what other runs changed since ``ck``. None where nothing here says
        what changed (a new kernel; the set-up cell run again)."""
        position = _positions.get(self.url)
        _, trained = _position_objects.get(self.url, (None, []))
        live = {id(obj) for obj in self.discovery.statefuls.values()}
        if position in (None, ck.id) or \
                not any(ref() is not None and id(ref()) in live for ref in trained):
            return []
        try:
            then, now = (_held_objects(self.manager._manifest(cid)) for cid in (ck.id, position))
        except (CkptError, KeyError, IndexError, TypeError):
            return []  # (unreadable: put back, as saved)
        return [key for key, state in then.items() if key in now and now[key] != state]

    def _start_as_saved(self, loader: torch.utils.data.DataLoader | None,
                        start: _LoaderStart) -> None:
        """Begin a resumed epoch's loader as the saved run's began, before iter(loader):
        its dataset, sampler and batch sampler in their states then (one advancing in
        __iter__ would be a step further), and a persistent-workers iterator kept or made
        anew as then (a new one draws from the loader's generator before its order)."""
        if loader is None:
            return
        statefuls = _loader_statefuls(loader)
        for place, state in (start.states or {}).items():
            if place in statefuls:
                try:
                    statefuls[place].load_state_dict(state)
                except Exception as exc:  # noqa: BLE001 - the user's load_state_dict
                    self.say(f"the loader's {place} did not take its state as the epoch "
                             f"began ({type(exc).__name__}: {exc}): the resumed epoch may "
                             "come in another order than the unstopped run's")
        reuses = _reuses_iterator(loader)
        if reuses is not None and start.iterator_reused not in (None, reuses):
            # (a dropped iterator shuts its workers down. A new one draws its workers' seed
            # from the loader's generator= or, without one, the global generator, and its
            # sampler its first indices from the generators it holds or the global one,
            # as the resume set them: the unstopped run's drew them epochs before, so they
            # are put back, or the order drawn next is another)
            before = [(g, g.get_state())
                      for g in (torch.default_generator, *_loader_generators(loader))]
            try:
                loader._iterator = loader._get_iterator() if start.iterator_reused else None
            finally:
                for g, state in before:
                    g.set_state(state)
        elif reuses is None:
            self.say(f"this torch ({torch.__version__}) keeps a DataLoader's persistent "
                     "workers otherwise than ckpt_nb knows: the resumed epoch may come in "
                     "another order than the unstopped run's; persistent_workers=False "
                     "resumes bit-identical")

    def _resume_now(self, loader: Any = None) -> int | None:
        """Restore the pending run in place; returns the epoch to start at. In the kernel
        that stopped it, the objects that other runs trained since are kept as they are:
        putting them back would undo that training (those the stop left, where the run
        resumes from a checkpoint before it: ``_exact_before``). ``loader``: what the
        tracked ``batches()`` loop goes over, where that loop resumes the run."""
        __tracebackhide__ = True
        stopped = self._pending.checkpoint.id if self._pending is not None else None
        if self._pending is not None and \
                (untracked := (self._pending.run.loop or {}).get("untracked")) is not None:
            why = _UNTRACKED_LOOPS.get(untracked, "its position was saved outside the loops "
                                       "it tracks")
            later = self._pending.checkpoint
            # In the kernel that stopped it too (its objects are as that checkpoint holds
            # them): its loops from the start on them trained the passes before the stop
            # again. A rollback to it chose that state: its loops start over on it. Not
            # where it stands in for a deleted checkpoint rolled back to, whose state the
            # kernel holds: that run is resumed as after a stop.
            deleted = _deleted_rollbacks.get(self.url)
            rolled_back = _positions.get(self.url) == later.id and deleted is None and \
                _position_events.get(self.url) == "rollback"
            exact = None if rolled_back else self._exact_before(later)
            promised = (self._pending.run.loop or {}).get("exact")  # (the stop named it)
            if exact is None and not rolled_back and isinstance(promised, str) and \
                    self.manager.catalog.get(promised) is None:
                why += (f", and checkpoint {promised}, the run's newest saved before that "
                        "loop began, which its stop said running the cell again resumes "
                        "from, was deleted since")
            else:
                promised = None
            if exact is None:
                self._leave_pending(why, go_on=False, promised=promised is not None,
                                    deleted=deleted)
                return None
            # (both kept while this run goes on, whatever --keep says: its own saves
            # deleted the stop's, which the stop said a rollback takes back)
            self.manager.named = {*self.manager.named, later.id, exact.checkpoint.id}
            rollback = f"`%ckpt_rollback {later.id}`" if _in_ipython() else \
                f"`ckpt_nb.rollback({later.id!r}, directory=" \
                f"{self.config.directory or location(self.manager.store)!r}, " \
                "namespace=globals())` before the block"
            self.say(_in_place_of(deleted)
                     + f"checkpoint {later.id} (step {later.step}) holds an unfinished run of "
                     f"this cell that it cannot resume from: {why}; resuming from "
                     f"{exact.checkpoint.id}, the run's newest checkpoint saved before its "
                     f"later loop began (an exact position)"
                     + (f" (the state the rollback put back is replaced by "
                        f"{exact.checkpoint.id}'s)" if deleted else "")
                     + f". {rollback} puts back the state it stopped with instead (its loops "
                     "then start over on it): both checkpoints are kept while this run goes on")
            self._pending = exact
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        ck, saved = pending.checkpoint, pending.run
        if loader is not None and saved.loop and saved.loop.get("epoch_rng") is not None:
            # (resumed by batches(): outside epochs(), nothing loaded yet)
            self._refuse_recut_loader(ck.id, saved.step, saved.loop.get("epoch"),
                                      saved.loop["next_batch"], saved.loop.get("loader_shape"),
                                      loader, loaded=False)
        tracked = {_stored_key(n) for n in self.rediscover().statefuls}
        untracked = [_live_name(key) for key in ck.state if key not in tracked]
        if untracked:  # (a typo in --track, or a set-up cell not run again)
            raise StateMismatchError(self._untracked_refusal(ck, saved.step, untracked,
                                                             tracked))
        if ck.extra[RUN_KEY].get("cell") != self.cell_hash:  # (said once it resumes)
            self.say(f"this cell changed since checkpoint {ck.id} was saved; resuming anyway")
        changed = self._changed_since(saved)
        since = self._trained_since(ck)
        # (only the very objects the cell left: ones the set-up cell made since go back)
        left = _left_saved.get(stopped or ck.id, {})
        live = {_stored_key(n): obj for n, obj in self.discovery.statefuls.items()}
        same = [key for key, obj in left.items() if obj.ref() is live.get(key)]
        touched = [key for key in same if _versions(live[key]) != left[key].versions]
        # Changed since the stop (by another cell, checkpointed or not) and not trained by
        # this cell's run: kept. What the run trains goes back, said where it had changed.
        kept = [key for key in same if (key in since or key in touched)
                and not left[key].trained]
        # (what load_state_dict() would be handed: the objects put back, and the loader's
        # dataset, sampler and batch sampler as the run record holds them)
        pickled = _pickled_states(
            {_live_name(key): state for key, state in ck.state.items() if key not in kept}
            | {f"the loader's {place}": state for when in ("loader_states", "loader_states_now")
               for place, state in ((saved.loop or {}).get(when) or {}).items()})
        if pickled:
            raise UntrustedPickleError(
                f"not resuming checkpoint {ck.id} (step {saved.step}): {pickled}; nothing was "
                "loaded. Run the cell with --trust-pickle (auto(trust_pickle=True)) if you "
                "trust this store, or with --no-resume (auto(resume=False)) not to resume it")
        # (read before the load: an lr the cell's code set ahead of its loop is put back)
        hyper = _changed_hyperparameters(
            {key: obj for key, obj in live.items() if key not in kept}, ck.state, same)
        # (a Ctrl-C as it goes in is held, then this cell's: saved at the next consistent
        # point, as one during training)
        with RestoreInterrupts(f"resume from {ck.id}", resume=True) as interrupts:
            interrupts.commit()
            try:
                targets, variables = self._apply(ck, saved, keep=kept)
            except StateMismatchError as exc:  # (a layer or a parameter group added since)
                raise _unfit(ck.id, saved.step, exc) from None
        self._rebaseline(targets)
        # What log() carries into each record goes on as the run stood at the save (its
        # newest record's): a mid-epoch checkpoint holds no metrics, and the records after
        # it lacked the epoch's val_loss that the unstopped run's held.
        carried = {name: value for name, value in (saved.history[-1] if saved.history else {})
                   .items() if name not in ("step", "epoch")}
        self.metrics = {**carried, **ck.metrics}
        if isinstance(run_id := ck.extra[RUN_KEY].get("run"), str):
            self._run_id = run_id  # (the run goes on: its end ends it)
        self._moved_to(ck, "resume", targets.values())
        self.best = saved.best
        if self.config.on and self.config.keep_best:
            # (each value once: the records carry a value on until the next is logged, so
            # equal values logged apart read as one, and an equal one is saved again)
            name = self.config.on[0]
            self._best_values = sorted(
                {r[name] for r in saved.history if isinstance(r.get(name), float)
                 and math.isfinite(r[name])},
                reverse=self.config.on[1] == "max")[:self.config.keep_best]
        self.last_consistent_step = self.step
        loop = saved.loop
        assert loop is not None  # (read for a resume)
        self.loop = _Loop(epoch=loop["epoch"], next_batch=loop["next_batch"],
                          epoch_rng=loop["epoch_rng"], loader_rng=loop.get("loader_rng"),
                          start_rng=loop.get("start_rng"),
                          start_generators=loop.get("start_generators"),
                          batch_generators=loop.get("batch_generators"),
                          loader_states=loop.get("loader_states"),
                          loader_shape=loop.get("loader_shape"))
        if loop["epoch_rng"] is not None and loop["next_batch"]:
            RNGState().load_state_dict(loop.get("start_rng") or loop["epoch_rng"])
            self._pending_skip = (loop["next_batch"], ck.rng)
            if loop["epoch"] is not None:  # (in an epoch: its code ahead of the loop runs next)
                self._epoch_put_back = _EpochPutBack(
                    ck, saved.step,
                    {key: (obj, _footprint(obj)) for key, obj in targets.items()},
                    {name: _fingerprint(saved.variables[name]) for name in variables},
                    self._rewind_generators(targets, loop.get("start_generators")))
            self._pending_loader_rng = loop.get("loader_rng")
            self._pending_loader_start = _LoaderStart(loop.get("loader_iterator_reused"),
                                                      loop.get("loader_states"))
        else:
            self._pending_loader_rng = loop.get("loader_rng_now")
            self._pending_loader_start = _LoaderStart(loop.get("loader_iterator_kept"),
                                                      loop.get("loader_states_now"))
            # (a generator the epoch's code makes after this for its loader draws from it
            # as the unstopped run's new one did: not set from the checkpoint)
            self._generators_at_resume = _live_generators()
            if ck.rng is not None:
                RNGState().load_state_dict(ck.rng)
        missing = [_live_name(n) for n in ck.state if n not in targets and n not in kept] + \
            [n for n in saved.variables if n not in variables]
        changed = [_live_name(n) for n in dict.fromkeys([*since, *touched]) if n in targets] + \
            [text for name, text in changed.items() if name in variables]
        changed += _put_back_flags(targets, ck.extra[RUN_KEY]) + hyper
        at = ", ".join(f"{name} {value}" for name, value in (
            ("epoch", loop["epoch"]), ("batch", loop["next_batch"]), ("step", saved.step))
            if value is not None)  # (outside epochs() it has none, as a rollback says)
        self.say(f"resumed from {ck.id} ({at})"
                 + (f"; not restored (not defined now): {missing}" if missing else "")
                 + (f"; kept as they are: {', '.join(map(_live_name, kept))} (trained by "
                    "another cell since this one stopped, which does not train them)"
                    if kept else "")
                 + (f"; put back as saved: {', '.join(changed)}" if changed else "")
                 + ("; --no-resume trains on with the optimizer's values as set (its loops "
                    "from their start)" if hyper else "")
                 + saved.unread())
        return loop["epoch"]

    def _refuse_recut_loader(self, checkpoint_id: str, step: int | None, epoch: int | None,
                             skip: int, shape: Mapping[str, Any] | None, loader: Any,
                             loaded: bool) -> None:
        """Refuse a mid-epoch resume whose loader (the one the tracked ``batches()`` loop
        is given) now cuts the epoch otherwise than when it was saved (another batch_size,
        another data set): skipping the batches done would repeat some of the epoch's
        samples and leave out others, without a word. ``skip``: the batches done, saved
        ``epoch`` and ``shape`` (``_loader_shape``); ``loaded``: whether the resume put the
        objects back already (in ``epochs()``, before the epoch's code made or changed the
        loader), else nothing is."""
        if not skip or not shape:
            return  # (at an epoch's end any loader goes on: nothing is skipped)
        now = _loader_shape(loader, _data_loader(loader), {})
        differs = [(what, shape.get(key), now[key]) for key, what in
                   (("batch_size", "batch_size"), ("samples", "samples an epoch"),
                    ("batches", "batches an epoch"))
                   if shape.get(key) is not None and now[key] is not None
                   and shape.get(key) != now[key]]
        if not differs or [what for what, _, _ in differs] == ["batches an epoch"] and \
                shape.get("samples") is not None and now["samples"] is not None:
            return  # (drop_last alone changed: the batches done are the same samples)
        name = shape.get("name") or "the loader"
        raise StateMismatchError(
            f"not resuming checkpoint {checkpoint_id} (step {step}): it was saved "
            f"{skip} batches into " + ("its epoch" if epoch is None else f"epoch {epoch}")
            + f" of {name}, which now has " + " and ".join(
                f"{what} {new} (was {old})" for what, old, new in differs)
            + f": skipping {skip} of its batches now would train some of the "
            "epoch's samples twice and leave others out; "
            + (f"the tracked objects are as {checkpoint_id} holds them, no batch was trained"
               if loaded else "nothing was loaded")
            + ". Make the loader as it was and run the cell again to resume exactly, or "
            "%ckpt_rollback ID (ckpt_nb.rollback(ID)) to a checkpoint of the run at an "
            "epoch's end (batch 0), which goes on with any loader, or run with --no-resume "
            "(auto(resume=False)) not to resume it")

    def _undo_epoch_prefix(self) -> None:
        """Put back what the epoch's code ahead of its batches() loop changed as it ran
        again after a mid-epoch resume: the run stopped past it, so its effects (a
        scheduler stepped, accumulators zeroed, a permutation drawn, an optimizer made
        anew) are undone, as the unstopped run stood at the save. The tracked objects it
        rebound or changed are loaded again (others are not: a big model is not loaded
        twice), and the variables it rebound or changed (by their fingerprints) are read
        again from the checkpoint (``_saved_variables``), not held as copies through the
        epoch's code (as much memory again as the variables)."""
        put_back = self._epoch_put_back
        assert put_back is not None  # (batches() calls it where epochs() resumed)
        ck = put_back.checkpoint
        live = {_stored_key(n): obj for n, obj in self.rediscover().statefuls.items()}
        again = {key: obj for key, obj in live.items() if key in put_back.objects
                 and (obj is not put_back.objects[key][0] or put_back.objects[key][1] is None
                      or _footprint(obj) != put_back.objects[key][1])}
        # (a generator set as the epoch began is put back as saved; named where its code
        # drew from it)
        said = [key for key in again if key not in put_back.rewound
                or _footprint(again[key]) != put_back.rewound[key]]
        state = ck.state
        # (an object changed in place whose load_state_dict() kept the very tensors or
        # arrays of ck.state, which the epoch's code changed with it: an optimizer, a
        # user's EMA that keeps the dict it is given; read again as saved)
        stepped = [key for key, obj in again.items() if obj is put_back.objects[key][0]
                   and _holds_state_of(obj, ck.state.get(key))]
        if stepped:
            state = self._read_again(put_back, map(_live_name, stepped)).state
        try:
            # (an optimizer made anew here: its parameters named by the live modules)
            load_all(again, state, kinds=ck.kinds, param_names=ck.param_names, modules=live)
        except StateMismatchError as exc:  # (one it made anew, of another shape)
            raise _unfit(ck.id, put_back.step, exc) from None
        self._rebaseline(again)
        if any(obj is not put_back.objects[key][0] for key, obj in again.items()):
            _position_objects[self.url] = (ck.step, _trained(
                {**{key: obj for key, (obj, _) in put_back.objects.items()}, **again}.values()))
        changed = [name for name, fingerprint in put_back.variables.items()
                   if name not in self.namespace or _differs(self.namespace[name], fingerprint)]
        kept = refillable(self.namespace, _saved_ids.get(ck.id, {}))
        tracked = parts_of(live.values())
        for name, value in self._saved_variables(put_back, changed).items():
            assign_in_place(self.namespace, name, value, kept, tracked)
        self._push_locals(changed)
        if said or changed:
            self.say(f"epoch {self.loop.epoch}'s code ahead of its batches() loop ran again "
                     f"as it resumed; what it changed is put back as saved in {ck.id}: "
                     + ", ".join([*map(_live_name, said), *changed]))

    def _saved_variables(self, put_back: _EpochPutBack, names: list[str]) -> dict[str, Any]:
        """The values the resume put back under ``names``, as saved: a cheap one is its
        fingerprint; another is decoded again from the run record of the checkpoint the
        resume loaded, where that still holds it as saved, else read from the store (the
        notebook held the very object decoded and the epoch's code changed it in place;
        that read takes the whole checkpoint's memory for a while)."""
        stored = put_back.checkpoint.extra[RUN_KEY]["variables"]
        values: dict[str, Any] = {}
        for name in names:
            fingerprint = put_back.variables[name]
            if not isinstance(fingerprint, _Digest) and fingerprint is not _UNDIGESTED:
                values[name] = fingerprint
            elif isinstance(fingerprint, _Digest) and \
                    _fingerprint(value := from_storable(stored[name])) == fingerprint:
                values[name] = value
        if len(values) < len(names):
            lost = [name for name in names if name not in values]
            stored = self._read_again(put_back, lost).extra[RUN_KEY]["variables"]
            values.update((name, from_storable(stored[name])) for name in lost)
        return {name: values[name] for name in names}

    def _read_again(self, put_back: _EpochPutBack, changed: Iterable[str]) -> Checkpoint:
        """The resumed checkpoint read again from the store, for what the epoch's code
        changed in place where the resume's own copy changed with it."""
        try:
            return self._read(put_back.checkpoint.id)
        except (CkptError, OSError) as exc:  # (deleted meanwhile: retention, another
            # process's delete; a store that stopped reading)
            raise StateMismatchError(
                f"epoch {self.loop.epoch}'s code ahead of its batches() loop changed "
                f"{', '.join(changed)} in place as it ran again on the resume from "
                f"checkpoint {put_back.checkpoint.id}, and that checkpoint no longer reads "
                f"({type(exc).__name__}: {exc}), so they cannot be put back as saved; run "
                "the cell again to resume from the newest checkpoint") from exc

    def _generator_states(self) -> dict[str, Any]:
        """The notebook's tracked generators' state_dict()s, by stored key (small)."""
        return {_stored_key(name): obj.state_dict()
                for name, obj in self.discovery.statefuls.items()
                if isinstance(obj, (GeneratorState, RandomState))}

    def _set_generators(self, states: dict[str, Any]) -> None:
        """Set the notebook's tracked generators to ``states`` (``_generator_states``'s,
        by stored key); one of another kind now is left as it is."""
        self._rewind_generators(
            {_stored_key(name): obj for name, obj in self.discovery.statefuls.items()}, states)

    def _rewind_generators(self, targets: dict[str, Any], states: dict[str, Any] | None
                           ) -> dict[str, Any]:
        """Set the tracked generators the resume loaded to their states as the epoch
        began, so that its code ahead of batches() draws again what it drew (a subset
        drawn from a notebook's generator into a loader); their _footprints then."""
        rewound = {}
        for key, state in (states or {}).items():
            if isinstance(obj := targets.get(key), (GeneratorState, RandomState)):
                with contextlib.suppress(Exception):  # (one of another kind now: as saved)
                    obj.load_state_dict(state)
                    rewound[key] = _footprint(obj)
        return rewound

    # -- loop helpers -------------------------------------------------------------------------
    def epochs(self, n: int, start: int = 0) -> Iterator[int]:
        """``range(start, n)`` that records the epoch (each end is a consistent point)
        and, resuming, starts at the saved epoch."""
        __tracebackhide__ = True  # (its refusals to resume are not ckpt_nb's faults)
        self._note_loop_began()
        resumed = self._resume_now()
        epoch = resumed if resumed is not None else start
        if resumed is not None and (resumed > n or resumed == n and self._pending_skip):
            # (epochs(N) lowered since the stop, below where the run stood: nothing is
            # trained, and the run ends as though it had run to its end)
            self.say(f"the resumed run stood in epoch {resumed}, past the end of "
                     f"epochs({n}) (edited since it stopped): nothing is left to train, and "
                     f"the run ends at the state it resumed; run the cell with --no-resume "
                     f"(auto(resume=False)) to train epochs({n}) again from there")
        self._loop_frame = _loop_caller(sys._getframe(1))
        try:
            yield from self._epochs_from(epoch, n, resumed)
            self._loop_frame = None  # (it ran to its end)
        finally:
            # (the loop left before the resumed epoch's batches() began: a break or a
            # return in its code ahead of the loop, an error caught around it, no epochs
            # left; the log()s after it count, and a batches() loop after it skips nothing)
            self._drop_resume_position()

    def _drop_resume_position(self) -> None:
        """Forget where a mid-epoch resume goes on in its epoch's batches() loop, once
        that epoch is left without one (its body took another way than the run it
        resumes: a skip or stop file, a time budget): the resume's silence of log(), and
        the batches it skips, which the next batches() loop took (the next epoch's, or an
        evaluation's after the loop, lost that many)."""
        self._epoch_put_back = None
        self._pending_skip = self._pending_loader_rng = self._pending_loader_start = None
        self._generators_at_resume = None

    def _epochs_from(self, epoch: int, n: int, resumed: int | None) -> Iterator[int]:
        """epochs()'s loop, from ``epoch`` (``resumed``: the epoch a resume began in)."""
        while epoch < n:
            if self.loop.epoch != epoch or resumed is None:
                self.loop = _Loop(epoch=epoch, generators=self.loop.generators,
                                  loader=self.loop.loader)
                self.loop.start_rng = RNGState().state_dict()
                self.loop.start_generators = self._generator_states()
            elif self.loop.start_rng is None:  # (resumed at the epoch's start: none saved)
                self.loop.start_rng = RNGState().state_dict()
                self.loop.start_generators = self._generator_states()
            resumed = None
            yield epoch
            self._drop_resume_position()  # (an epoch with no batches() loop)
            # The epoch's body is complete (its loader's generators are the next one's).
            self.loop = _Loop(epoch=epoch + 1, generators=self.loop.generators,
                              loader=self.loop.loader)
            if self._consistent():
                self.checkpoint_if_due()
            epoch += 1

    def batches(self, loader: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        """The epoch's first loader is tracked (outside epochs(), the cell run's first
        loop): its position is the one saved, and skipped on resume. A later one
        (validation, say) is a plain enumeration: a position does not say which loader it
        is in, and a resume would take it for the first's. Its saves say so: a rerun
        after a stop there resumes from the run's newest checkpoint saved before it
        began."""
        if (data_loader := _data_loader(loader)) is not None:  # (a loader the code names
            # is warned of as the cell starts: discover())
            warn_persistent_workers(data_loader, next(
                (name for name, value in self.namespace.items() if value is data_loader), None))
        if self.loop.tracked_loader is not None:
            if self.loop.epoch is None:  # (outside epochs(), the cell run's first is tracked)
                self._untracked_loop(loader)
            yield from enumerate(loader)  # (in an epoch, its steps are no consistent points)
            return
        # (the epoch's resume, before the code ahead of this loop ran again; not one this
        # loop makes, just now)
        prefix_ran = self._epoch_put_back is not None
        self._note_loop_began()
        self._resume_now(loader)
        self.loop.tracked_loader = id(loader)
        outer = self.loop.epoch is None  # (the cell run's loop, not an epoch's)
        if outer:
            self._loop_frame = _loop_caller(sys._getframe(1))
        skip, rng_after = self._pending_skip or (0, None)
        if skip and prefix_ran and (put_back := self._epoch_put_back) is not None:
            self._undo_epoch_prefix()
            # (epochs() resumed before the epoch's code made or changed the loader; a
            # refusal after what that code changed is put back leaves the objects as saved)
            self._refuse_recut_loader(put_back.checkpoint.id, put_back.step, self.loop.epoch,
                                      skip, self.loop.loader_shape, loader, loaded=True)
        self._epoch_put_back = None  # (it holds the checkpoint's state: not kept through)
        loader_rng, self._pending_skip, self._pending_loader_rng = \
            self._pending_loader_rng, None, None
        start, self._pending_loader_start = self._pending_loader_start, None
        before, self._generators_at_resume = self._generators_at_resume, None
        # A Dataset drawing from a notebook's generator draws again as the skipped batches
        # are fetched: those go back as at the stop after it, as the global ones do.
        held = _random_states(self.discovery.statefuls) if skip else []
        if skip:
            self._tell_helper_locals()
        if skip and self.loop.batch_generators:
            # (as the loop began: a generator of batches draws its order from them as the
            # skip fetches its first batch; put back as at the stop after the skip)
            self._set_generators(self.loop.batch_generators)
        # The notebook's own generators: a resume puts them back as saved (as the epoch
        # began, for a resume in it) before the epoch's code runs again and draws from them.
        ours = {id(obj.generator if isinstance(obj, GeneratorState) else obj.rng)
                for obj in self.discovery.statefuls.values()
                if isinstance(obj, (GeneratorState, RandomState))}
        # (zip(l1, l2): its loaders' iterators, made as zip() was, before this loop began)
        zipped, unreplayed = _zipped_loaders(loader, self.namespace, ours)
        generators = self.loop.generators = _loader_generators(
            loader, [data for _, data in zipped])
        self.loop.loader = None if data_loader is None else weakref.ref(data_loader)
        if start is not None:  # (before the generators are set: a new iterator draws)
            self._start_as_saved(data_loader, start)
        if loader_rng is not None:
            # (an earlier ckpt_nb saved the loader's own generators alone, first in the list)
            fitting = [(g, state) for g, state in zip(generators, loader_rng) if _fits(g, state)]
            # At an epoch's end, the notebook's own were put back as saved by the resume,
            # and the epoch's code may have drawn from them or seeded them since, as the
            # unstopped run's did (`g.manual_seed(100 + epoch)`): they are as its now.
            # A generator the epoch's code made since (`DataLoader(..., generator=torch.
            # Generator().manual_seed(100 + epoch))`) is as the unstopped run's made it:
            # the checkpoint holds the state of the previous epoch's loader's.
            kept = set() if skip else ours | _made_since(before, generators)
            for generator, state in fitting:
                if id(generator.rng if isinstance(generator, _HeldRandom)
                      else generator) not in kept:
                    generator.set_state(state)  # (as the epoch began, or as it was saved)
            if len(fitting) != len(generators):
                self.say(f"the checkpoint holds the state of {len(fitting)} of this loader's "
                         f"{len(generators)} generators (saved by an earlier ckpt_nb, or the "
                         "loader changed since): the draws of the others are not replayed")
            if not skip:  # (as saved at an epoch's end: before zip() made the iterators,
                # each drawing its workers' base seed from its loader's generator, then)
                for iterator, data in zipped:
                    if iterator is not None and isinstance(data.generator, torch.Generator) \
                            and id(data.generator) not in kept:
                        iterator._base_seed = torch.empty((), dtype=torch.int64).random_(
                            generator=data.generator).item()
        if start is not None and unreplayed:  # (resumed: mid-epoch or at an epoch's end)
            self.say(f"the resumed epoch may go on in another order than a run never stopped "
                     f"for {unreplayed} in the zip() given to batches(): its iterator drew "
                     "its order as zip() made it, before the resume could set its generators "
                     "(a loader with workers, one that is no notebook variable), or, with "
                     "persistent workers, is made anew where a run never stopped kept it from "
                     "the epoch before; to resume it exactly, make its generator= a notebook "
                     "variable (`g = torch.Generator().manual_seed(7)`), with "
                     "persistent_workers=False, and give batches() a generator of the "
                     "zipped batches (`def pairs(): yield from zip(l1, l2)`, then "
                     "batches(pairs())), whose iterators are made inside the loop")
        if not skip:
            self.loop.epoch_rng = RNGState().state_dict()
            self.loop.batch_generators = self._generator_states()
            self.loop.loader_rng = [g.get_state() for g in generators]
            self.loop.loader_states, unsaved = _loader_states(data_loader)
            self.loop.loader_shape = _loader_shape(loader, data_loader, self.namespace,
                                                   stateful=bool(self.loop.loader_states))
            if unsaved:
                self.say(f"not saved as the epoch began, so a resume in it may replay "
                         f"another order: the loader's {unsaved}")
            self.loop.next_batch = 0
        self.loop.iterator_reused = _reuses_iterator(data_loader)
        if skip and self.loop.epoch_rng is not None:
            # (the epoch's order as saved: iter(loader) draws a shuffle's seed from it, and
            # the code ahead of this loop drew from it since the resume set it)
            RNGState().load_state_dict(self.loop.epoch_rng)
        iterator = iter(loader)
        for _ in range(skip):
            next(iterator)
        if rng_after is not None:
            RNGState().load_state_dict(rng_after)
        _put_random(held)
        index = skip
        self.loop.in_batches = True
        try:
            while True:
                # The consistent point is before the next batch is fetched: a Dataset that
                # augments in this process draws from the generators, and a resume fetches
                # that batch again, from the generators as they were here.
                rng, before = RNGState.snapshot(), _random_states(self.discovery.statefuls)
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                except Exception:
                    if index > skip:  # (a consistent point within the epoch)
                        self._save_before_a_failed_fetch(index, rng, before)
                    raise
                if index > skip:
                    self.loop.next_batch = index
                    if self._consistent(rng):
                        self._consistent_random = before  # (for a save on an error)
                        fetched: list[tuple[Any, Any]] = []
                        if before and self.due() is not None:  # (saved as before the fetch too)
                            fetched = _random_states(self.discovery.statefuls)
                            _put_random(before)
                        try:
                            self.checkpoint_if_due()
                        finally:
                            _put_random(fetched)
                yield index, batch
                index += 1
            # Not a consistent point: a save using it would hold what the code after the loop
            # changes (sched.step()) with a position that says it has not run, and a resume
            # would run it again. The next is the epoch boundary.
            self.loop.next_batch = index
            if outer:
                self._loop_frame = None  # (it ran to its end)
        finally:
            self.loop.in_batches = False

    def _tell_helper_locals(self) -> None:
        """Resumed mid-epoch in a function of the user's (``run_epoch()``) whose locals
        sum over the loop (``total = 0.0``, then ``total += ...`` in it): say once that
        they start again at their first value, which no checkpoint holds."""
        frame = sys._getframe(1)
        while frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] \
                in ("ckpt_nb", "tqdm"):  # (this loop's helpers, a progress bar around it)
            frame = frame.f_back
        if frame is None or frame.f_code.co_name.startswith("<") or \
                frame.f_code in _told_helper_locals or frame is self.locals_frame:
            return  # (the function whose locals() the session saves and puts back)
        names = _quietly_read(lambda: helper_accumulators(frame.f_code, frame.f_lineno))
        if not names:
            return
        _told_helper_locals.add(frame.f_code)
        one = len(names) == 1
        them, they = ("it", "it starts") if one else ("them", "they start")
        self.say(f"warning: resumed mid-epoch inside {frame.f_code.co_name}(), whose "
                 f"{'local' if one else 'locals'} {', '.join(names)} "
                 f"{'sums' if one else 'sum'} over the loop: no checkpoint holds "
                 f"a function's locals, so {they} again "
                 "from the value the function sets before the loop, and what the epoch logs from "
                 f"{them} differs from an unstopped run's (the weights resume exactly); keep "
                 "running sums in notebook variables or in the cell's own code")

    def _save_before_a_failed_fetch(self, index: int, rng: Any,
                                    before: list[tuple[Any, Any]]) -> None:
        """A fetch of batch ``index`` that failed after a signal of ``save_on_signals``:
        the signal, sent to the process group (Slurm's scancel, ``kill -TERM -PGID``),
        reached the loader's workers too, which died. The state before the fetch is the
        consistent point the signal asked to save at: saved there, then ended as the
        signal asks. (The error ended the run unsaved.)"""
        if self._signalled is None:
            return
        self.loop.next_batch = index
        if not self._consistent(rng):
            return
        self._consistent_random = before
        _put_random(before)
        self.checkpoint_if_due()

    def _untracked_loop(self, loader: Iterable[Any]) -> None:
        """Outside epochs(), a batches() loop after the cell run's first: a position saved
        from here on would not say which loop, or which pass over the loader, it is in, and
        a resume took it for the first loop's (``for epoch in range(3)`` trained 5 epochs;
        a save in a validation loop skipped that many training batches). Its saves say so
        in their loop record, which a resume refuses. A second pass over the tracked loader
        is said at once: the run needs epochs() to resume; another loader (a validation
        loop, with no save inside) where a save is made."""
        if self.loop.untracked not in (None, "after"):  # (what a later loop is tells more)
            return
        self.loop.untracked = "again" if id(loader) == self.loop.tracked_loader else "another"
        if self.loop.untracked == "again":
            self._tell_untracked()

    def _tell_untracked(self) -> None:
        """Say once that this run's checkpoints from here on are not resumed, and why."""
        if self._told_untracked:
            return
        self._told_untracked = True
        why = _UNTRACKED_LOOPS[self.loop.untracked or "another"]
        if not self._resumable():  # (the line form, --no-resume: no rerun resumes)
            self.say(f"this run's checkpoints from here on hold no position to resume: {why}")
            return
        self.say(f"this run cannot resume from its checkpoints from here on: {why}, so a "
                 "resume would go on from the wrong place (a rerun after a stop resumes from "
                 "the newest saved before, or trains from the objects as they are where "
                 "there is none; %ckpt_rollback puts a checkpoint back). For a run "
                 "that resumes exactly, put its loops in `for epoch in ckpt_nb.epochs(N)` "
                 "(each epoch tracks its first batches() loop)")

    def _resumable(self) -> bool:
        """Whether a rerun of this run's code resumes it: a cell's or a named block's
        (not the line form's, which runs no code again), without ``--no-resume``."""
        return self.cell_hash is not None and self.config.resume

    # -- rollback and status ---------------------------------------------------------------------
    def rollback_plan(self, which: str = "latest", *,
                      on: tuple[str, str] | None = None) -> RollbackPlan:
        """What a rollback to ``which`` would do, read from its manifest alone; "best" is
        by ``on`` (metric, mode) where given, else by the session's ranking."""
        if on is not None and str(which) != "best":  # (ignored, it would look obeyed)
            raise ValueError(f"on= ranks 'best' and nothing else: rollback({which!r}) "
                             "takes none")
        cid = self.manager._best_by(*on) if on is not None else self.manager.resolve(which)
        state = self.manager._manifest(cid)["state"]
        extra = state.get("extra") if isinstance(state, dict) else None
        run = extra.get(RUN_KEY) if isinstance(extra, dict) else None
        names = _variable_names(cid, run.get("variables")) if isinstance(run, dict) else []
        found = self.rediscover()
        self._remade.clear()  # (the plan's notices say it: a save after it does not again)
        live = found.statefuls
        objects = [_live_name(key) for key in state.get("types") or {}]
        variables = [n for n in names if self._assignable(n, live)]
        restored = [n for n in objects if n in live] + variables
        return RollbackPlan(cid, restored, [n for n in objects if n not in live]
                            + [n for n in names if n not in variables], list(live),
                            _orphaned_optimizers(restored, found, self.namespace))

    def rollback(self, which: str = "latest", *, on: tuple[str, str] | None = None,
                 trust_pickle: bool = False) -> str:
        """Put tracked objects and variables back to a checkpoint, in place; "best" is by
        ``on`` (metric, mode) where given, for this rollback alone (the session's saves
        and retention rank by its own, a save on another thread meanwhile too). One that
        would restore nothing is refused, and the kernel's position stays, as one whose
        objects' states hold pickles without ``trust_pickle`` (which unpickles them: only
        for a store you trust). A Ctrl-C while it reads changes nothing; one while it
        puts the state in is taken once that is done, saying the rollback finished."""
        with RestoreInterrupts("rollback") as interrupts:
            return self._rollback(which, on, interrupts, trust_pickle=trust_pickle)

    def _rollback(self, which: str, on: tuple[str, str] | None,
                  interrupts: RestoreInterrupts, *, trust_pickle: bool = False) -> str:
        self.writer.wait()
        self._report_background_error()
        plan = self.rollback_plan(which, on=on)
        if not plan.restored:
            raise StateMismatchError(plan.refusal())
        cid, missing = plan.id, plan.not_restored
        # (its own trust, not the session's: a cell's --trust-pickle is for its resume)
        ck = self.manager.load(cid, trust_pickle=trust_pickle, tell_pickles=False)
        pickled = _pickled_states({name: ck.state[_stored_key(name)] for name in plan.restored
                                   if _stored_key(name) in ck.state})
        if pickled:
            raise UntrustedPickleError(
                f"not rolling back to {ck.id}: {pickled}; nothing was changed: "
                f"{TRUST_PICKLE_ROLLBACK} loads them, if you trust this store")
        saved = _SavedRun.read(ck.id, ck.extra.get(RUN_KEY))
        interrupts.commit(f"rollback to {ck.id}")
        try:
            targets, variables = self._apply(ck, saved)
        except StateMismatchError as exc:
            if isinstance(exc, ParameterOrderError):  # (says its own way on)
                raise
            raise StateMismatchError(
                f"{exc}\nthe tracked objects are not as they were when {ck.id} was saved (a "
                "layer added or resized, another optimizer, since): build them as they were "
                "to roll back, or take the part that fits from its state, "
                f"CheckpointManager({location(self.manager.store)!r}).load({ck.id!r})"
                ".state (a model's: load_state_dict(..., strict=False) without the keys "
                "named)") from None
        self._rebaseline(targets)
        self._moved_to(ck, "rollback", targets.values())
        _rolled_back_to.setdefault(self.url, set()).add(ck.id)
        if ck.rng is not None:
            RNGState().load_state_dict(ck.rng)
        _left_values[self.url] = self._comparable_values()
        restored = [_live_name(key) for key in targets] + variables
        left = f" (not {', '.join(missing)}: nothing here takes "\
            f"{'it' if len(missing) == 1 else 'them'})" if missing else ""
        where = ", ".join(f"{label} {value}" for label, value in
                          (("epoch", ck.epoch), ("step", ck.step)) if value is not None)
        metric, mode = on or (self.manager.metric, self.manager.mode)
        best = f", best by {metric} ({mode})" if str(which) == "best" else ""
        self.say(f"rolled back to {ck.id}{f' ({where})' if where else ''}{best}: restored "
                 f"{', '.join(restored)}{left}{saved.unread()}"
                 f"{next_save_words(self.manager, ck.id)}"
                 f"{_left_as_they_are(ck, self.discovery.statefuls, targets.values())}")
        for notice in plan.orphaned:  # (after the line: what was restored, then what to check)
            warn(f"rolled back to {ck.id}: {notice}", RuntimeWarning)
        if plan.orphaned:  # (said: the next save does not say it again)
            self._remade.clear()
        return ck.id

    def status(self) -> dict[str, Any]:
        """What ``%ckpt_status`` shows: the store, what is tracked and skipped, the
        triggers, the step, the last save and whether a write is pending."""
        triggers = [t for t in (
            f"every {self.config.every_steps} steps" if self.config.every_steps else None,
            f"every {self.config.every_seconds:g} s" if self.config.every_seconds else None,
            (f"when {self.config.on[0]} ranks among the {self.config.keep_best} best "
             f"({self.config.on[1]})" if self.config.keep_best else
             f"when {self.config.on[0]} improves ({self.config.on[1]})") if self.config.on
            else None,
        ) if t]
        return {"directory": location(self.manager.store),  # (as a cell's first line)
                "tracking": list(self.discovery.statefuls),
                "variables": list(self.discovery.variables),
                "skipped": dict(self.discovery.skipped),
                "triggers": triggers or ["end of cell only"], "step": self.step,
                "last_save": self.writer.last_id, "head": self.manager.head,
                "pending_write": self.writer.busy, "background": not self.config.sync}


# -- the module-level face: one active session per kernel ------------------------------------

_sessions: list[AutoSession] = []  # the last is active; a cell's session sits on a line one
_positions: dict[str, str] = {}  # store URL -> the checkpoint the kernel's state came from
_position_events: dict[str, str] = {}  # store URL -> how it got there: save, resume, rollback
# store URL -> the checkpoint rolled back to where it was deleted since (the position is
# its nearest kept ancestor then): a resume from that ancestor says it replaces its state
_deleted_rollbacks: dict[str, str] = {}
# Where a save() asked after the tracked batches() loop, outside epochs(), stands
_AFTER_THE_LOOP = "after the batches() loop"
# store URL -> the checkpoints this kernel rolled back to: their branches stay whatever a
# cell's --keep says (``AutoSession._rolled_back_branches``)
_rolled_back_to: dict[str, set[str]] = {}
_left_values: dict[str, dict[str, Any]] = {}  # store URL -> cheap values as a run left them
# checkpoint id -> the ids of the lists and dicts its save took, by name, for the saves of
# this process: a put back refills in place only the one the variable held then
_saved_ids: dict[str, dict[str, int]] = {}
# Checkpoints that hold the tracked objects as a cell that stopped left them, and those
# objects (weakly, by stored key): a resume of one keeps what later runs of this process
# trained since (``_trained_since``), if it is still the object the cell left
_left_saved: dict[str, dict[str, _LeftObject]] = {}
# store URL -> the tracked objects a cell that stopped left trained past every checkpoint
_left_unsaved: dict[str, _LeftUnsaved] = {}


@dataclass(frozen=True)
class _LeftObject:
    """A tracked object as a stopped cell left it."""

    ref: weakref.ref[Any]
    versions: tuple[tuple[int, int], ...]  # (_versions at the stop)
    trained: bool  # whether the cell's run changed it (its own model, optimizer)


@dataclass(frozen=True)
class _LeftUnsaved:
    """The state a stopped cell left that no checkpoint holds (``_tell_left_unsaved``)."""

    step: int  # where it stopped
    position: str | None  # the kernel's position then (what its state came from)
    objects: dict[str, _LeftObject]


def _with_step(row: CheckpointRow) -> str:
    """A checkpoint's id and its step, in words: ``ID (step S)``."""
    return row.id + (f" (step {row.step})" if row.step is not None else "")


# Seconds a kernel's end at a signal's grace waits for its line to reach the notebook.
_SIGNAL_SAID_WAIT = 2.0
# Seconds a signal of save_on_signals waits for a consistent point before it ends the
# process unsaved (a preemption's own grace, 30 s in Kubernetes, may end it sooner)
_SIGNAL_GRACE = 60.0
# Seconds a signal's handler waits for a save in flight before it takes the signal as one
# to save at the next consistent point (``_last_save_written``).
_SIGNAL_WRITE_WAIT = 10.0

# What schedules an optimizer's learning rate (ReduceLROnPlateau is an LRScheduler from
# torch 2.2 on).
_SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def _left_as_they_are(ck: Checkpoint, statefuls: Mapping[str, Any],
                      restored: Iterable[Any]) -> str:
    """The tracked objects that a rollback to ``ck`` leaves as they are because it does
    not hold them (made after it was saved: a fine-tune's optimizer), for the end of its
    line; "" where none. They keep what later training gave them (an optimizer's momentum),
    and a run from the rolled-back state trains on with it: said, the user can choose."""
    put_back = {id(_wrapped_object(obj)) for obj in restored}  # (another name of one: put back)
    left = [(name, _wrapped_object(obj)) for name, obj in statefuls.items()
            if _stored_key(name) not in ck.state and id(_wrapped_object(obj)) not in put_back]
    if not left:
        return ""
    names = ", ".join(f"{name} ({type(obj).__name__})" for name, obj in left)
    one = len(left) == 1
    return (f"; not in {ck.id}, left as {'it is' if one else 'they are'}: {names}; run the "
            f"cell{'' if one else 's'} that make{'s' if one else ''} {'it' if one else 'them'} "
            f"again to start {'it' if one else 'them'} afresh")


def _wrapped_object(stateful: Any) -> Any:
    """The notebook's object a tracked one stands for: a generator's, not its wrapper."""
    return stateful.generator if isinstance(stateful, (GeneratorState, RandomState)) \
        else stateful


def _weak_objects(statefuls: dict[str, Any], start: dict[str, tuple[tuple[int, int], ...]]
                  ) -> dict[str, _LeftObject]:
    left = {}
    for name, obj in statefuls.items():
        key, versions = _stored_key(name), _versions(obj)
        with contextlib.suppress(TypeError):  # (one that takes no weak reference: put back)
            left[key] = _LeftObject(weakref.ref(obj), versions, start.get(key) != versions)
    return left


def _versions(obj: Any) -> tuple[tuple[int, int], ...]:
    """Where a module's or an optimizer's tensors lie and their version counters: what
    training it in place changes (an optimizer's step, in any cell, checkpointed or
    not). Read from the tensors themselves: a user's state_dict() may cost, or act."""
    if isinstance(obj, torch.nn.Module):
        tensors = [*obj.parameters(), *obj.buffers()]
    elif isinstance(obj, torch.optim.Optimizer):
        tensors = [value for state in obj.state.values() if isinstance(state, Mapping)
                   for value in state.values() if isinstance(value, torch.Tensor)]
    else:
        return ()  # (others are put back by a resume, as saved)
    found = []
    for tensor in tensors:
        with contextlib.suppress(RuntimeError):  # (a tensor with no storage)
            found.append((tensor.data_ptr(), tensor._version))
    return tuple(found)
# store URL -> the step of the kernel's position, and the models and optimizers it was
# saved from or put into (weakly: the set-up cell run again frees them)
_position_objects: dict[str, tuple[int | None, list[weakref.ref[Any]]]] = {}
_subscribers: list[Callable[[str, str, str], None]] = []
# The latest session's config, namespace and store (the folder or URL it opened: its --dir
# as given may be relative, or the default store's, which names another folder after a %cd).
_last: tuple[AutoConfig, dict[str, Any], str] | None = None


def _started(pid: int) -> int | None:
    """When a process started (clock ticks since boot, Linux), to tell it from a later
    one given its pid; None where that cannot be read, or it has ended (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def _owner_of(pid: int) -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": pid, "started": _started(pid)}


def _owner() -> dict[str, Any]:
    """Who saves a run (this process, asked at each save: a fork is another): a fresh
    kernel resumes a run only where the process that saved it is gone (a kernel that
    died), not another kernel that is training it now."""
    return _owner_of(os.getpid())


def _live_owner(owner: Any) -> str | None:
    """The process of this machine, other than this one, that saved a run and is running
    still (the same pid, started at the same time), in words; else None."""
    if not isinstance(owner, dict) or owner.get("host") != _owner()["host"]:
        return None
    pid = owner.get("pid")
    if not is_count(pid) or pid in (0, os.getpid()):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:  # (another user's: alive)
        pass
    started, now = owner.get("started"), _started(pid)
    if started is not None and now != started:
        return None  # (ended, a zombie; or its pid went to a later process)
    return f"process {pid} (another kernel, still running)"


def _a(kind: str) -> str:
    """A class's name with its article: "a Linear", "an AveragedModel"."""
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _copied_from(statefuls: Mapping[str, Any], kind: str, copy_name: str) -> str:
    """The name of the tracked module that a loop's copy ``copy_name`` of class ``kind``
    was likely made from, for the example of making the copy ahead of the loop: "model"
    was written where the notebook's is ``net``, a name the example then did not run
    with."""
    return next((name for name, obj in statefuls.items() if name != copy_name
                 and isinstance(obj, torch.nn.Module) and type(obj).__name__ == kind),
                "model")


def _set_position_event(url: str, event: str) -> None:
    """Record how the kernel's state got to its position on ``url``, the newest last: a
    cell on another store says where the objects it trains came from by the newest."""
    _position_events.pop(url, None)
    _position_events[url] = event


def _forget_position(url: str) -> None:
    _positions.pop(url, None)
    _position_objects.pop(url, None)
    _position_events.pop(url, None)
    _deleted_rollbacks.pop(url, None)


def _in_place_of(deleted: str | None) -> str:
    """The words a resume's line begins with where the checkpoint it found stands in for
    ``deleted``, a checkpoint rolled back to and deleted since (its nearest kept ancestor,
    or this cell's run that went on from that)."""
    return "" if deleted is None else \
        f"checkpoint {deleted}, rolled back to, was deleted since; in its place, "


def _footprint(obj: Any) -> Any:
    """What code changing a tracked object in place changes: a module's tensors by where
    they lie, their version counters and a digest of their bytes (an edit through
    ``.data`` bumps no version), an optimizer's by where they lie and their version
    counters (with its hyperparameters and counts), the rest (schedulers, scalers, generators:
    small) by a digest of their state. None where it cannot be read: a module with extra
    state, a state that does not digest."""
    try:
        if isinstance(obj, torch.nn.Module):
            extra = any(type(m).get_extra_state is not torch.nn.Module.get_extra_state
                        for m in obj.modules())
            if extra:
                return None
            contents = xxhash.xxh3_128()  # (in place through .data: no version)
            for t in [*obj.parameters(), *obj.buffers()]:
                for part in _data_of(t.detach()):
                    contents.update(_raw_bytes(part))
            return _versions(obj), contents.hexdigest()
        if isinstance(obj, torch.optim.Optimizer):
            plain = [{k: v for k, v in group.items() if k != "params"} | {
                "params": [id(p) for p in group["params"]]} for group in obj.param_groups]
            plain += [{k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
                      for state in obj.state.values() if isinstance(state, Mapping)]
            return _versions(obj), _Digest.of(plain)
        return _Digest.of(as_stateful(obj).state_dict())
    except Exception:  # noqa: BLE001 - a user's state_dict(), or one that does not digest
        return None


# The fingerprint of a value that does not digest: always taken for changed.
_UNDIGESTED = object()


def _fingerprint(value: Any) -> Any:
    """What a variable's value is compared by (``_differs``) with a later one, without a
    copy held: a cheap value (immutable) itself, another's digest."""
    if isinstance(value, _CHEAP):
        return value
    try:
        return _Digest.of(value)
    except Exception:  # noqa: BLE001 - a value that does not digest: taken for changed
        return _UNDIGESTED


def _differs(live: Any, fingerprint: Any) -> bool:
    """Whether a live variable holds otherwise (by type and data) than a value of that
    ``fingerprint`` (``_fingerprint``'s)."""
    if isinstance(fingerprint, _Digest):
        return isinstance(live, _CHEAP) or _fingerprint(live) != fingerprint
    return fingerprint is _UNDIGESTED or not _same(live, fingerprint)


def _trained(objects: Iterable[Any]) -> list[weakref.ref[Any]]:
    """The models and optimizers among tracked objects, by weak reference: whether the
    live ones are those a checkpoint holds tells a model that goes on from a new one. A
    module with no parameters or buffers (a loss) holds nothing trained, so it tells
    nothing: kept from one set-up cell, beside a new model, it made that count on."""
    return [weakref.ref(obj) for obj in objects if isinstance(obj, torch.optim.Optimizer)
            or isinstance(obj, torch.nn.Module)
            and next(itertools.chain(obj.parameters(), obj.buffers()), None) is not None]


def store_url(store: str | os.PathLike[str] | CheckpointManager) -> str:
    """The key a store is known by: its URL (a local folder's resolved file:// URI, a
    manager's too: one opened through a link or ``sub/..`` is the same store, and the
    kernel's position in it was lost, a rollback's cell taking it for another)."""
    text = store.store.url if isinstance(store, CheckpointManager) else os.fspath(store)
    if "://" in text and not text.startswith(LOCAL_SCHEMES):
        return canonical_url(text)
    path = file_url_path(text) if text.startswith(LOCAL_SCHEMES) else Path(text)
    return path.expanduser().resolve().as_uri()


def last_directory() -> str | None:
    """The store of the active session, else of the last one in this process."""
    session = active()
    if session is not None:
        return location(session.manager.store)
    return None if _last is None else _last_store(_last)


def _last_store(last: tuple[AutoConfig, dict[str, Any], str]) -> str:
    """The store a session opened, as its --dir named it (the default store's path where
    it named none) while that names the same store, else (a relative one after a %cd)
    the folder or URL it opened."""
    config, namespace, opened = last
    given = config.directory or default_directory(namespace)
    with contextlib.suppress(Exception):  # (a URL it cannot read: the store it opened)
        if store_url(given) == store_url(opened):
            return given
    return opened


def listing_manager(directory: str | os.PathLike[str]) -> CheckpointManager:
    """The store opened to list it as it ranks: by the ranking its last save with a metric
    recorded, marking the ``--keep-best`` K best where its newest run ranks so too
    (``written_keep_best``), the kernel's position as head; as ``ckpt-nb ls``, the
    explorer and a rollback to "best" rank it."""
    manager = CheckpointManager(directory)
    try:
        manager.keep_best = written_keep_best(manager)
        manager.head = kernel_position(manager)
    except BaseException:
        manager.close()
        raise
    return manager



def kernel_position(store: str | os.PathLike[str] | CheckpointManager) -> str | None:
    """The checkpoint this process's tracked state came from (its last save, resume or
    rollback) in that store, or None."""
    return _positions.get(store_url(store))


def subscribe(callback: Callable[[str, str, str], None]) -> Callable[[], None]:
    """Call ``callback(event, checkpoint_id, store_url)`` on every "save", "resume" and
    "rollback" of any session; it may run on the writer thread. Returns the unsubscriber."""
    _subscribers.append(callback)

    def unsubscribe() -> None:
        with contextlib.suppress(ValueError):
            _subscribers.remove(callback)

    return unsubscribe


def _publish(event: str, checkpoint_id: str, url: str) -> None:
    for callback in list(_subscribers):
        try:
            callback(event, checkpoint_id, url)
        except Exception as exc:  # noqa: BLE001 - a listener must not break a save
            warn(f"ckpt_nb: a subscriber failed on {event}: {exc!r}", RuntimeWarning)


def active() -> AutoSession | None:
    """The session the loop helpers report to (the newest open one), or None."""
    while _sessions and _sessions[-1].closed:
        _sessions.pop()
    return _sessions[-1] if _sessions else None


def start(config: AutoConfig, namespace: dict[str, Any], *, nested: bool = False) -> AutoSession:
    """Make a session active. A ``nested`` one (a cell's) pauses the one below it;
    otherwise the previous sessions are flushed and closed."""
    global _last
    if not nested:
        stop()
    session = AutoSession(config, namespace)
    _sessions.append(session)
    _last = (config, namespace, location(session.manager.store))
    return session


def stop() -> None:
    """Close every session, flushing their pending saves."""
    while _sessions:
        _sessions.pop().close()


_FILE_ID = re.compile(r"[0-9a-f]{10,32}")  # (a pack's or manifest's name in a failure)


def _stored_key(name: str) -> str:
    """The key a tracked object is saved under: its name, or "ns:NAME" for a name a
    checkpoint keeps for its own fields (a NumPy generator called ``rng``), which the
    manager refuses as an object's ("ns:" is in no Python name)."""
    return f"ns:{name}" if name in RESERVED else name


def _live_name(key: str) -> str:
    """The notebook name of an object saved under ``key`` (``_stored_key``)."""
    return key[3:] if key.startswith("ns:") else key


# The functions a mid-epoch resume warned of their accumulating locals (once each).
_told_helper_locals: weakref.WeakSet[types.CodeType] = weakref.WeakSet()


def _quietly_read(read: Callable[[], tuple[str, ...]]) -> tuple[str, ...]:
    """``read()``, or nothing where reading the user's source raised."""
    try:
        return read()
    except Exception:  # noqa: BLE001 - source ast reads in a way this does not expect
        return ()


def _loader_generators(loader: Any, zipped: Iterable[Any] = ()
                       ) -> list[torch.Generator | _HeldRandom]:
    """The generators a loader draws its order from, other than the global ones: a
    DataLoader's ``generator=``, its samplers' and those its sampler, batch sampler and
    dataset hold (``loader_random``), through wrappers (``tqdm(loader)``) too, then the
    ``zipped`` loaders' (``_zipped_loaders``). NumPy's and Python's as ``_HeldRandom``: a
    checkpoint holds each one's state as a tensor."""
    found: dict[int, Any] = {}
    for layer in [*_wrapped(loader), *zipped]:
        found.update((id(rng), rng) for rng in loader_random(layer)[0].values())
    return [rng if isinstance(rng, torch.Generator) else _HeldRandom(rng)
            for rng in found.values()]


def _live_generators() -> weakref.WeakSet[Any]:
    """The torch generators that objects hold now (a resume at an epoch's end, before the
    epoch's code runs again: ``_made_since``)."""
    found: weakref.WeakSet[Any] = weakref.WeakSet()
    objects = gc.get_objects()
    for at in range(0, len(objects), 10_000):  # (their referents: a generator is untracked)
        found.update(obj for obj in gc.get_referents(*objects[at:at + 10_000])
                     if issubclass(type(obj), torch.Generator))
    return found


def _made_since(before: weakref.WeakSet[Any] | None, generators: Iterable[Any]) -> set[int]:
    """Ids of the torch ``generators`` made since ``before`` was taken: the epoch's code
    made them anew, as the unstopped run's did (``DataLoader(...,
    generator=torch.Generator().manual_seed(100 + epoch))``)."""
    if before is None:
        return set()
    return {id(rng) for rng in generators if isinstance(rng, torch.Generator) and rng not in before}


def _zipped_loaders(loader: Any, namespace: Mapping[str, Any],
                    ours: AbstractSet[int] = frozenset()
                    ) -> tuple[list[tuple[Any, torch.utils.data.DataLoader]], str]:
    """A ``zip()`` that ``batches()`` is given (or a wrapper of it, ``tqdm(zip(l1, l2))``):
    the iterators of notebook DataLoaders in it that drew no order yet, with their loaders
    (made in this process, their samplers draw the epoch's order at the first fetch, in
    the loop: a resume sets their generators ahead of it, as for a loader given alone),
    and with None for an iterator, the loaders in a wrapper whose iterator is a generator
    yet to start (``zip(tqdm(l1), l2)``: it makes the loader's iterator in the loop);
    and the names of the others that draw from generators of their own other than the
    notebook's (``ours``, ids: put back as saved before the epoch's code makes the zip),
    which drew their order as zip() made them (workers fetching ahead), or whose loader is
    no notebook variable (its generator= is not known), and of any with persistent workers
    (made anew by a resume, where an unstopped run kept it from the epoch before)."""
    made = next((layer for layer in _wrapped(loader) if type(layer) is zip), None)
    if made is None:
        return [], ""
    try:
        iterators = _zip_members(made)
    except Exception:  # noqa: BLE001 - a Python whose zip() reduces otherwise
        return [], ""
    loaders = {id(_index_sampler(value)): (name, value) for name, value in namespace.items()
               if isinstance(value, torch.utils.data.DataLoader)}
    found, unreplayed = [], []
    for iterator in iterators:
        if not isinstance(iterator, torch.utils.data.dataloader._BaseDataLoaderIter):
            # (a wrapper's, ``zip(tqdm(l1), l2)``: a generator yet to start makes its
            # loader's iterator at the first fetch, in the loop, as a loader given alone)
            # (a list, a range: none, no order drawn)
            for inner in _wrapper_loaders(iterator):
                persistent = inner.num_workers > 0 and inner.persistent_workers
                if inspect.getgeneratorstate(iterator) == inspect.GEN_CREATED \
                        and not persistent:
                    found.append((None, inner))
                elif persistent or _quietly_held(inner, ours):
                    unreplayed.append(next((name for name, value in namespace.items()
                                            if value is inner),
                                           "a DataLoader that is no notebook variable"))
            continue
        name, data = loaders.get(id(getattr(iterator, "_index_sampler", None)), (None, None))
        started = getattr(iterator, "_sampler_iter", None)
        if data is not None and isinstance(
                iterator, torch.utils.data.dataloader._SingleProcessDataLoaderIter) \
                and getattr(iterator, "_num_yielded", None) == 0 \
                and isinstance(started, types.GeneratorType) \
                and inspect.getgeneratorstate(started) == inspect.GEN_CREATED:
            found.append((iterator, data))
        elif getattr(iterator, "_persistent_workers", False) or \
                _quietly_held(data if data is not None else _LoaderParts(iterator), ours):
            # (one drawing from the global generators alone, or the notebook's, draws as the
            # unstopped run's: they are set as the epoch began before its code makes the zip;
            # not one with persistent workers: a resume makes anew the iterator that an
            # unstopped run kept from the epoch before, and its base seed draws first)
            unreplayed.append(name or "a DataLoader that is no notebook variable")
    return found, ", ".join(unreplayed)


def _zip_members(made: zip) -> list[Any]:
    """The iterators a ``zip()`` holds, and those of a zip() in it (``zip(zip(l1, l2),
    l3)``: made as the outer one was, before the loop)."""
    return [member for iterator in made.__reduce__()[1]
            for member in (_zip_members(iterator) if type(iterator) is zip else [iterator])]


def _wrapper_loaders(iterator: Any) -> list[torch.utils.data.DataLoader]:
    """The DataLoaders a wrapper's iterator in a zip() draws from: a generator (tqdm's
    ``__iter__``) holds the wrapper as its ``self``, which holds the loader
    (``_data_loader``); one yet to start, those it is given as well (its locals are its
    arguments: ``zip(shifted(l1), l2)``, ``def shifted(dl): for x, y in dl: ...``);
    none for an iterator of another kind, or one holding none."""
    if not isinstance(iterator, types.GeneratorType) or iterator.gi_frame is None:
        return []
    try:
        values = dict(iterator.gi_frame.f_locals)
    except Exception:  # noqa: BLE001 - a frame's locals that cannot be read
        return []
    if inspect.getgeneratorstate(iterator) != inspect.GEN_CREATED:
        values = {"self": values.get("self")}  # (a started one's locals: its own doings)
    found = {id(loader): loader for value in values.values() if value is not None
             and (loader := _data_loader(value)) is not None}
    return list(found.values())


class _LoaderParts:
    """What ``loader_random`` reads of a DataLoader, from one of its iterators (whose
    loader is not known): its samplers and dataset; its ``generator=`` is not kept."""

    generator = None

    def __init__(self, iterator: Any) -> None:
        index = getattr(iterator, "_index_sampler", None)
        batched = getattr(iterator, "_auto_collation", False)
        self.batch_sampler = index if batched else None
        self.sampler = getattr(index, "sampler", None) if batched else index
        self.dataset = getattr(iterator, "_dataset", None)


def _index_sampler(loader: torch.utils.data.DataLoader) -> Any:
    """What a DataLoader's iterators draw indices from (its batch sampler, or its sampler
    where it batches none), as its iterators keep it; None where it cannot be read."""
    try:
        return loader._index_sampler
    except Exception:  # noqa: BLE001 - a DataLoader subclass of another make
        return None


# Where wrappers of a loader keep it: tqdm's ``iterable``, accelerate's ``base_dataloader``
# and ``_loader``, and the names of the like.
_WRAPPED = ("iterable", "loader", "_loader", "dataloader", "_dataloader", "base_dataloader")
_MAX_WRAPPERS = 4


class _LoaderStart(NamedTuple):
    """How a saved run's tracked loader began the epoch a resume goes on with (or the
    next, saved at an epoch's end)."""

    iterator_reused: bool | None  # (_reuses_iterator)
    states: dict[str, Any] | None  # (_loader_states)


def _data_loader(loader: Any) -> torch.utils.data.DataLoader | None:
    """The DataLoader that ``batches()`` is given, or wrapped in what it is given."""
    return next((layer for layer in _wrapped(loader)
                 if isinstance(layer, torch.utils.data.DataLoader)), None)


def _loader_shape(loader: Any, data_loader: torch.utils.data.DataLoader | None,
                  namespace: Mapping[str, Any], stateful: bool = False) -> dict[str, Any]:
    """How ``loader`` cuts an epoch: its batches an epoch, its DataLoader's batch_size and
    samples an epoch (its sampler's length; None where it has none; a ``zip()``'s, those
    of each loader in it), and the notebook variable that holds it (None where none).
    ``stateful``: its dataset, sampler or batch sampler has a state, which a resume puts
    back as the epoch began only after the check: lengths that may follow it (a curriculum
    sampler's, growing as each epoch's iterator is made) are None, not compared."""
    name = next((key for key, value in namespace.items()
                 if value is loader or (data_loader is not None and value is data_loader)),
                None)
    made = next((layer for layer in _wrapped(loader) if type(layer) is zip), None)
    if made is not None:  # (zip(l1, l2), which has no len: each loader's, in order)
        try:
            members = [_member_shape(member) for member in _zip_members(made)]
        except Exception:  # noqa: BLE001 - a Python whose zip() reduces otherwise
            members = []
        return {"name": name or "the zip() given to batches()", "batches": None,
                "batch_size": [size for size, _ in members] or None,
                "samples": [samples for _, samples in members] or None}
    batched = data_loader is not None and data_loader.batch_size is not None
    return {"name": name, "batches": None if stateful else _length(lambda: len(loader)),
            "batch_size": data_loader.batch_size if batched else None,
            "samples": _length(lambda: len(data_loader.sampler))
            if batched and not stateful else None}


def _member_shape(iterator: Any) -> tuple[int | None, int | None]:
    """The batch_size and samples an epoch of the DataLoader an iterator in a ``zip()``
    draws from (``_loader_shape``), or Nones (a list's, a batch sampler of another make):
    the batches a mid-epoch resume skips are that loader's too."""
    if isinstance(iterator, torch.utils.data.dataloader._BaseDataLoaderIter):
        if not iterator._auto_collation:
            return None, None
        batcher = iterator._index_sampler  # (its batch sampler)
        return getattr(batcher, "batch_size", None), _length(lambda: len(batcher.sampler))
    inner = _wrapper_loaders(iterator)  # (zip(tqdm(l1), l2): the loader it wraps)
    if len(inner) != 1 or inner[0].batch_size is None:
        return None, None
    return inner[0].batch_size, _length(lambda: len(inner[0].sampler))


def _reuses_iterator(loader: torch.utils.data.DataLoader | None) -> bool | None:
    """Whether ``iter(loader)`` reuses the iterator its persistent workers kept from the
    epoch before: a new one draws its workers' seed from the loader's generator before
    its sampler draws the order, a reused one does not. None where torch keeps it
    otherwise than ``DataLoader._iterator`` (a version ckpt_nb does not know)."""
    if loader is None or loader.num_workers == 0 or not loader.persistent_workers:
        return False
    if not hasattr(loader, "_iterator") or not callable(getattr(loader, "_get_iterator", None)):
        return None
    return loader._iterator is not None


# Where a DataLoader keeps the objects its order can come from.
_LOADER_PARTS = ("dataset", "sampler", "batch_sampler")


def _loader_statefuls(loader: torch.utils.data.DataLoader | None) -> dict[str, Stateful]:
    """The loader's dataset, sampler and batch sampler that have a state_dict(), by
    place; a Module's is its weights, tracked by name or not at all. A map-style dataset
    is one: the replay of a resumed epoch's batches runs its __getitem__ again (an
    augmentation drawing from its own generator), from its state as the epoch began."""
    return {} if loader is None else {
        place: part for place in _LOADER_PARTS
        if isinstance(part := getattr(loader, place, None), Stateful)
        and not isinstance(part, (type, torch.nn.Module))}


def _loader_states(loader: torch.utils.data.DataLoader | None
                   ) -> tuple[dict[str, Any], str]:
    """Copies of the state_dict()s of ``_loader_statefuls``, and the ones that raised."""
    states, failed = {}, []
    for place, part in _loader_statefuls(loader).items():
        try:
            states[place] = copy.deepcopy(part.state_dict())
        except Exception as exc:  # noqa: BLE001 - the user's state_dict()
            failed.append(f"{place} ({type(exc).__name__}: {exc})")
    return states, ", ".join(failed)


def _loader_now(loader: weakref.ref[torch.utils.data.DataLoader] | None) -> dict[str, Any]:
    """How the tracked loader's next epoch begins, as a save at an epoch's end holds it."""
    live = None if loader is None else loader()
    return {"loader_iterator_kept": _reuses_iterator(live),
            "loader_states_now": _loader_states(live)[0]}


def _wrapped(loader: Any) -> list[Any]:
    """The loader and what it wraps, outermost first (a few layers at most): a progress
    bar around a DataLoader holds none of its generators."""
    layers = [loader]
    while len(layers) <= _MAX_WRAPPERS:
        inner = next((value for name in _WRAPPED
                      if (value := getattr(layers[-1], name, None)) is not None), None)
        if inner is None or any(inner is layer for layer in layers):
            break
        layers.append(inner)
    return layers


class _HeldRandom:
    """A NumPy ``Generator`` / ``RandomState`` or a ``random.Random`` that a loader holds,
    with a ``torch.Generator``'s ``get_state`` / ``set_state``: its state (``RandomState``'s
    JSON) as a uint8 tensor, which is what a run record holds of a loader's generators."""

    def __init__(self, rng: Any) -> None:
        self.rng = rng

    def get_state(self) -> torch.Tensor:
        text = json.dumps(RandomState(self.rng).state_dict())
        return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)

    def set_state(self, state: torch.Tensor) -> None:
        RandomState(self.rng).load_state_dict(json.loads(bytes(state.numpy()).decode()))


def _fits(generator: torch.Generator | _HeldRandom, state: torch.Tensor) -> bool:
    """Whether a saved state is one of this generator's kind: a loader changed since the
    save may hold other kinds, in the same number, which a state of another would break."""
    mine = generator.get_state()
    if isinstance(generator, torch.Generator):
        return state.numel() == mine.numel()
    try:
        return _random_kind(state) == _random_kind(mine)
    except (ValueError, TypeError, AttributeError):  # (a torch.Generator's state, say)
        return False


def _random_kind(state: torch.Tensor) -> tuple[str, Any]:
    """A ``_HeldRandom`` state's kind: Python's, or NumPy's of its bit generator."""
    (key, text), = json.loads(bytes(state.numpy()).decode()).items()
    return key, json.loads(text).get("bit_generator") if key == "numpy" else None


def _random_states(statefuls: dict[str, Any]) -> list[tuple[Any, Any]]:
    """The notebook's tracked generators with their states now, as each keeps it (cheap:
    taken before each batch). A Dataset that draws from one draws as a batch is fetched:
    a resume, which fetches the skipped batches and the next one again, needs them as
    they were before."""
    states: list[tuple[Any, Any]] = []
    for obj in statefuls.values():
        if isinstance(obj, GeneratorState):
            states.append((obj.generator, obj.generator.get_state()))
        elif isinstance(obj, RandomState) and not isinstance(obj.rng, random.SystemRandom):
            rng = obj.rng
            states.append((rng, rng.getstate() if isinstance(rng, random.Random)
                           else rng.bit_generator.state if isinstance(rng, np.random.Generator)
                           else rng.get_state()))
    return states


def _put_random(states: list[tuple[Any, Any]]) -> None:
    """Set generators back to states ``_random_states`` took."""
    for rng, state in states:
        if isinstance(rng, (torch.Generator, np.random.RandomState)):
            rng.set_state(state)
        elif isinstance(rng, random.Random):
            rng.setstate(state)
        else:
            rng.bit_generator.state = state


def _loop_caller(frame: Any) -> Any:
    """The frame whose code loops over ckpt_nb.epochs() or batches(): the first from
    ``frame`` out that is not ckpt_nb's own (LoopIterator) or a generator's around it (a
    progress bar: tqdm's, rich's track(), one of the notebook's own), which an error in
    the loop's body does not unwind through."""
    while frame is not None and (
            str(frame.f_globals.get("__name__", "")).split(".")[0] == "ckpt_nb"
            or frame.f_code.co_flags & inspect.CO_GENERATOR):
        frame = frame.f_back
    return frame


def epochs(n: int, start: int = 0) -> LoopIterator:
    """``range(start, n)`` that records the epoch, and resumes it after a crash; its
    len() is the range's (resumed, the loop yields the epochs left)."""
    session = active()
    return LoopIterator(iter(range(start, n)) if session is None else session.epochs(n, start),
                        _length(lambda: len(range(start, n))))


def batches(loader: Iterable[Any]) -> LoopIterator:
    """``enumerate(loader)`` that records the position and saves when a save is due; its
    len() is the loader's, where that has one (resumed, the loop yields the batches left)."""
    session = active()
    return LoopIterator(enumerate(loader) if session is None else session.batches(loader),
                        _length(lambda: len(loader)))  # type: ignore[arg-type]


def _length(measure: Callable[[], int]) -> int | None:
    """A loop's length, or None where what it goes over has none (an iterator, a loader
    over an IterableDataset, a float count of epochs): a progress bar's total, which no
    loop is stopped for."""
    try:
        return measure()
    except Exception:  # noqa: BLE001 - whatever a __len__ raises
        return None


_RECORD_FIELDS = frozenset({"step", "epoch"})  # what each record of the history holds


def _metric_value(name: str, value: Any) -> float:
    """A logged metric as the float a checkpoint stores (as ``CheckpointManager.save``
    takes one): a value that is no number, or a name a history record has for its own
    field, is refused by name, before the call records anything."""
    if name in _RECORD_FIELDS:
        raise CaptureError(f"ckpt_nb.log({name}=...): every record of the metric history "
                           f"holds the {name} already; give the metric another name")
    return as_metric(name, value)  # (a CaptureError naming the metric, where it is no number)


def log(**metrics: float) -> None:
    """Record metrics for the next checkpoint (and for ``--on METRIC``): ``best`` and
    ``--keep-best`` rank by them, and the run's history keeps them.

    Each value is a number: a Python or NumPy int or float, or a one-element tensor or
    array (``loss`` itself, not only ``loss.item()``); each is checked before any is
    recorded. A name is a keyword (``log(val_loss=v, accuracy=a)``; one that is not an
    identifier as ``log(**{"val/loss": v})``), but not ``step`` or ``epoch``, which each
    record of the history holds already.

    Call it inside a ``%%ckpt_auto`` cell or a ``with ckpt_nb.auto(...):`` block; the
    ``--on`` metric after the epoch's ``batches()`` loop (a validation at the epoch's
    end), where no optimizer step takes away the state it measured before a save.
    Outside a session it records nothing, and warns so once."""
    __tracebackhide__ = True  # (IPython: a value that is no number is the caller's)
    try:
        values = {name: _metric_value(name, value) for name, value in metrics.items()}
    except CaptureError as error:  # (it names the metric: the check's frames say no more)
        raise error.with_traceback(None)
    session = active()
    if session is None:
        _tell_log_outside_a_session()
    else:
        session.log(**values)


@functools.cache
def _tell_log_outside_a_session() -> None:
    """Once a process: a cell that forgot ``%%ckpt_auto`` logged into nothing, unsaid."""
    warn("ckpt_nb.log() outside a session records nothing: call it inside a %%ckpt_auto cell "
         "(or a `with ckpt_nb.auto(...):` block), after the epoch's batches() loop for --on; "
         "its metrics go into that session's next checkpoint (said once)")


def rollback(which: str = "latest", *, directory: str | os.PathLike[str] | None = None,
             namespace: dict[str, Any] | None = None,
             on: tuple[str, str] | str | None = None, trust_pickle: bool = False) -> str:
    """Restore tracked objects and variables to a checkpoint, in place; the next save
    is its child. Uses the active session, else ``directory`` (default: the store of
    the last session in this process) and ``namespace`` (default: that session's;
    where none ran, a TypeError asks for it). ``on`` ranks "best" for this rollback
    alone, as ``auto(on=...)`` takes it
    (``("val_loss", "min")`` or ``"val_loss:min"``): a store saved without one records no
    metric to rank by; the store's record is left as it is. ``trust_pickle=True``
    unpickles values stored as pickles (an Enum, a deque in an object's state: only for a
    store you trust); without it a checkpoint whose objects' states hold them is refused
    (``UntrustedPickleError``), nothing changed. A Ctrl-C while the store is
    opened (a temporary session's) changes nothing, as one while the checkpoint is read,
    and says so; one while a temporary session closes after the state went back is taken
    once it is closed, saying the rollback finished."""
    ranking = _rollback_ranking(which, on)
    check_flag("trust_pickle", trust_pickle)
    caller = sys._getframe(1)
    with RestoreInterrupts("rollback") as interrupts, _session_for(directory, namespace) \
            as session, warnings_worded(*_RANK_BY_ANOTHER):
        _refuse_unranked_best(session, which, ranking)
        # (namespace=locals() in a function: its variables are put back into the function)
        bound = _function_locals(namespace, caller) \
            if namespace is not None and session.locals_frame is None else None
        if bound is not None:
            session.locals_frame = bound
        try:
            return session._rollback(which, ranking, interrupts, trust_pickle=trust_pickle)
        finally:
            if bound is not None:
                session.locals_frame = None


def rollback_plan(which: str = "latest", *, directory: str | os.PathLike[str] | None = None,
                  namespace: dict[str, Any] | None = None,
                  on: tuple[str, str] | str | None = None) -> RollbackPlan:
    """What ``rollback`` with these arguments would restore (``AutoSession.rollback_plan``),
    touching nothing."""
    ranking = _rollback_ranking(which, on)
    with _session_for(directory, namespace) as session, warnings_worded(*_RANK_BY_ANOTHER):
        _refuse_unranked_best(session, which, ranking)
        return session.rollback_plan(which, on=ranking)


def _rollback_ranking(which: str, on: tuple[str, str] | str | None) -> tuple[str, str] | None:
    """A rollback's ``on=``, checked as ``auto(on=...)``'s is; refused but for "best",
    which alone it ranks (an ignored one would look obeyed)."""
    if on is None:
        return None
    if str(which) != "best":
        raise ValueError(f"on= ranks 'best' and nothing else: rollback({which!r}) takes none")
    return AutoConfig(on=on).on


# The manager's way to rank "best" by another metric, which a rollback takes as on=.
_RANK_BY_ANOTHER = (RANK_BY_ANOTHER, "rollback('best', on=(METRIC, 'min'|'max')) ranks by "
                    "another")

# What a rollback to "best" of a store that no metric ranks can do instead (the magic
# says it in its own words).
UNRANKED_BEST_WAYS = ("rollback('best', on=(METRIC, 'min'|'max')), or roll back by id "
                      "(list() (ckpt-nb ls))")


def _refuse_unranked_best(session: AutoSession, which: str,
                          ranking: tuple[str, str] | None) -> None:
    """"best" of a store that no metric ranks (none given, no save recorded one), refused
    with a rollback's ways on (the manager's names ``metric=``, which a rollback has not)."""
    if str(which) != "best" or ranking is not None:
        return
    session.manager._catch_up()  # (the ranking a save recorded since it was opened, taken)
    if session.manager.metric is None and \
            session.manager.catalog.newest_ids(1):  # (an empty store: the manager says so)
        raise CheckpointNotFoundError(
            "'best' needs a metric to rank by, and no save to this store recorded one: "
            f"{UNRANKED_BEST_WAYS}")


@contextlib.contextmanager
def _session_for(directory: str | os.PathLike[str] | None,
                 namespace: dict[str, Any] | None) -> Iterator[AutoSession]:
    """The session a rollback uses: the active one where it is on that store and
    namespace, else a temporary one on the last session's settings."""
    session = active()
    if session is not None and (directory is None or store_url(directory) == session.url) \
            and namespace in (None, session.namespace):
        yield session
        return
    if _last is None and directory is not None and namespace is None:
        # (a caller's globals() are not guessed: a helper's module is not the notebook)
        raise TypeError("namespace= is missing: no ckpt_nb session has run in this process "
                        "to take it from; pass namespace=globals() (the namespace to put the "
                        "checkpoint's objects back into)")
    if _last is None and directory is None:
        raise CheckpointNotFoundError(
            "nothing to roll back: no ckpt_nb session has run in this process; run a "
            "ckpt_nb.auto() block first, or pass directory= and namespace= (the store's "
            "folder or URL, and the namespace to put its objects back into: globals())")
    config, last_namespace = _last[:2] if _last else (AutoConfig(), {})
    last_store = _last_store(_last) if _last else default_directory(last_namespace)
    config = dataclasses.replace(config, directory=last_store)
    if directory is None:
        _refuse_a_store_gone(last_store)
    another_store = directory is not None and (
        _last is None or store_url(directory) != store_url(last_store))
    if directory is not None:
        if not store_exists(directory):
            raise CheckpointNotFoundError(f"no checkpoint store at {directory}" + (
                why_no_store(os.fspath(directory)) or ": give the --dir of a %ckpt_auto run"))
        # Another store's own settings, not the last session's: its --on ranked a "best"
        # of this store by a metric it never had, and its --track left out what this
        # store's checkpoints hold.
        config = AutoConfig(directory=os.fspath(directory), magic=config.magic,
                            max_variable_bytes=config.max_variable_bytes) if another_store \
            else dataclasses.replace(config, directory=os.fspath(directory))
    temporary = AutoSession(config, namespace if namespace is not None else last_namespace)
    try:
        yield temporary
    finally:
        temporary.close()


# (the magics say it as --dir)
STORE_MOVED_WAY_ON = "give its new place as directory="


def _refuse_a_store_gone(store: str) -> None:
    """Refuse a rollback from the last session's local store whose folder is no longer
    there (renamed, moved or deleted since the session ran): opening it made an empty
    store at the old path and called that path misspelt."""
    if ("://" not in store or store.startswith(LOCAL_SCHEMES)) and not store_exists(store):
        raise CheckpointNotFoundError(
            f"no checkpoint store at {store} any more: the last session's store was "
            "renamed, moved or deleted since it ran, and nothing was rolled back; put it "
            f"back, or {STORE_MOVED_WAY_ON}")


def history(store: str | os.PathLike[str] | CheckpointManager,
            which: str = "latest") -> pd.DataFrame:
    """Every value ``ckpt_nb.log()`` recorded in the run that a checkpoint of a
    ``%%ckpt_auto`` cell or an ``auto()`` block holds, up to that save, as a DataFrame: a
    row per log() call, with its step and epoch and a column per metric, each as it stood
    at that call (its latest value; NaN before it was first logged). ``list()`` has only
    the kept checkpoints' metrics: with --on and --keep, most of the learning curve
    would be missing. ``which``: as ``CheckpointManager.resolve`` takes it ("latest",
    "best", "-N" or an id prefix). Reads the checkpoint's manifest alone, no tensor."""
    import pandas as pd  # (here: importing ckpt_nb loads no pandas)

    if isinstance(store, CheckpointManager):
        manager, own = store, False
    else:
        if not store_exists(store):
            raise CheckpointNotFoundError(f"no checkpoint store at {store}"
                                          f"{why_no_store(os.fspath(store))}")
        manager, own = CheckpointManager(store), True
    try:
        checkpoint_id = manager.resolve(which)
        extra = manager._saved_extra(checkpoint_id)
    finally:
        if own:
            manager.close()
    run = extra.get(RUN_KEY) if isinstance(extra, dict) else None
    if run is None:
        raise MetricNotFoundError(
            f"checkpoint {checkpoint_id} holds no ckpt_nb.log() history: a "
            "CheckpointManager.save() saved it, not a %%ckpt_auto cell or an auto() block; "
            "the metrics it was saved with are in list()")
    records = list(_SavedRun.read(checkpoint_id, run).history)
    metrics = list(dict.fromkeys(name for record in records for name in record
                                 if name not in _RECORD_FIELDS))
    frame = pd.DataFrame.from_records(records, columns=["step", "epoch", *metrics])
    return frame.astype({"step": "Int64", "epoch": "Int64",
                         **dict.fromkeys(metrics, "float64")})


def status() -> dict[str, Any]:
    """The active session's ``AutoSession.status()`` with ``"active": True``, else
    ``{"active": False}``."""
    session = active()
    return {"active": False} if session is None else {"active": True, **session.status()}


# (a frame's file, the source of the statement it runs or None where unread) -> the
# statement's place (line, column) -> its ordinal among identical ones
_unnamed_sites: dict[tuple[str, str | None], dict[tuple[int, int], int]] = {}


def _unnamed_block(caller: FrameType) -> str:
    """What tells an unnamed ``auto()`` block's runs from another's: the user code that
    called it, from its outermost frame in to the block (``_user_frames``), each frame by
    what it runs (``_frame_site``), which a rerun gives it again, edits that shift lines
    too. Every block was "auto": after a kill in the second, the first resumed the
    second's run, and one cell's ``keep=`` deleted every other cell's checkpoints. Then a
    script's blocks were told apart by the order they ran (one skipped on a rerun gave
    its identity to the next: no resume, and its ``keep=`` deleted the other's
    checkpoints), and a helper's block was one block for every model it was called on
    (a fresh kernel's call on the first model resumed the second's run into it)."""
    return "\n".join(_frame_site(frame) for frame in reversed(_user_frames(caller)))


def _user_frames(caller: FrameType) -> list[FrameType]:
    """The frames of user code from ``caller`` out: not the standard library's, an
    installed package's, ckpt_nb's, IPython's or ipykernel's; none past the IPython that
    runs a cell (a kernel's loop, a test harness, which a rerun need not share).
    ``caller`` alone where none is user code."""
    library = _library_dirs()
    shells = tuple(os.path.dirname(os.path.realpath(module.__file__)) + os.sep
                   for module in map(sys.modules.get, ("IPython", "ipykernel"))
                   if module is not None and getattr(module, "__file__", None))
    frames: list[FrameType] = []
    frame: FrameType | None = caller
    while frame is not None:
        filename = frame.f_code.co_filename
        path = "<frozen>" if filename.startswith("<frozen ") else os.path.realpath(filename)
        if path == "<frozen>" or path.startswith(library + shells):
            if frames and path.startswith(shells):
                break
        else:
            frames.append(frame)
        frame = frame.f_back
    return frames or [caller]


def _library_dirs() -> tuple[str, ...]:
    """The folders of code that is not the user's: the standard library, installed
    packages and their scripts, ckpt_nb."""
    paths = sysconfig.get_paths()
    dirs = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib", "scripts")
            if key in paths]
    dirs += getattr(site, "getsitepackages", list)()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    dirs.append(os.path.dirname(__file__))
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


def _frame_site(frame: FrameType) -> str:
    """What one frame of a block's caller runs. An IPython cell (its code held in
    ``linecache``, not read from a file) by its code and the frame's line, as
    ``%%ckpt_auto`` tells cells apart where the front end sends no cell id: an edited
    cell is another cell. A file by its path and the code of the innermost statement
    running there (the ``with`` block, body included, or the call into the next frame,
    as ``ast.unparse`` gives it back: without comments or layout),
    and its ordinal among identical statements of the file in the order this process
    first ran them (a call made again from one place: its own). Where the source cannot
    be read (a ``.pyc`` alone, an ``exec``'d string), by the ordinal of its line among the
    file's such lines instead, which a rerun that skips one of them shifts."""
    filename = frame.f_code.co_filename
    lines = linecache.getlines(filename, frame.f_globals)
    held = linecache.cache.get(filename)
    if lines and held is not None and len(held) == 4 and held[1] is None:  # (no file time)
        return f"auto at line {frame.f_lineno} of\n{''.join(lines)}"
    path = os.path.abspath(filename)
    source = "".join(lines)
    statement = _statement_running(frame, source) if source else None
    # (as Python reads it: a comment or a line break edited inside makes no other block)
    text = None if statement is None else ast.unparse(statement)
    place = (frame.f_lineno, 0) if statement is None else \
        (statement.lineno, statement.col_offset)
    sites = _unnamed_sites.setdefault((path, text), {})
    ordinal = sites.setdefault(place, len(sites) + 1)
    return f"auto#{ordinal} in {path}" if text is None else f"#{ordinal} in {path}:\n{text}"


def _statement_running(frame: FrameType, source: str) -> ast.stmt | None:
    """The innermost statement of ``source`` around what ``frame`` runs now: by the
    instruction's lines and columns where Python keeps them (3.11 on), else by its line
    (a one-line ``with ...: train()`` is then taken for its body's statement)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # (the file changed since, or is not Python)
        return None
    positions = list(getattr(frame.f_code, "co_positions", list)())  # (one per 2 bytes)
    line, end_line, column, end_column = positions[frame.f_lasti // 2] \
        if 0 <= frame.f_lasti // 2 < len(positions) else (None,) * 4
    if None in (line, end_line, column, end_column):  # (a line alone: any statement over it)
        start, end = (frame.f_lineno, math.inf), (frame.f_lineno, 0)
    else:
        start, end = (line, column), (end_line, end_column)
    found = None
    for node in ast.walk(tree):  # (outer statements first)
        if isinstance(node, ast.stmt) and (node.lineno, node.col_offset) <= start and \
                end <= (node.end_lineno or node.lineno, node.end_col_offset or 0):
            found = node
    return found


def _rollback_advice(checkpoint_id: str, directory: str) -> str:
    """How to take a run over where ckpt_nb runs: the magic in IPython, the function in a
    script (which has no cell to run again) with the store's ``directory`` written out."""
    if _in_ipython():
        return f"`%ckpt_rollback {checkpoint_id}`, then run this cell again"
    return (f"call `ckpt_nb.rollback({checkpoint_id!r}, directory={directory!r}, "
            "namespace=globals())` before the block, or give the block a name= of its own")


# What other code an unfinished run not resumed is of: in IPython, a cell's; in a script,
# a block's, told apart by the calls that reach it (a script run through runpy, or from
# another function, is other code).
_OTHER_CODE = {True: "(another cell, or this one before an edit)",
               False: "(another block, or this one edited or reached through other calls)"}


def _in_ipython() -> bool:
    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


@contextlib.contextmanager
def auto(directory: str | None = None, *, namespace: dict[str, Any] | None = None,
         name: str | None = None, **options: Any) -> Iterator[AutoSession]:
    """``%%ckpt_auto`` as a context manager, for scripts and tests.

    ``with ckpt_nb.auto("runs/x", every_steps=50, namespace=globals()): ...``
    resumes an unfinished run of the block called ``name`` and saves at its end. A
    ``name`` given is the block's as a notebook's cell id is a cell's: another name's
    run is never resumed, even after a rollback to it. An unnamed block is told from
    others by the user code that calls it (the chain of calls that reaches it, each by
    what it runs, so that edits which shift lines keep it).

    The options are ``%ckpt_auto``'s, spelt as keywords: ``every_steps=N``,
    ``every="10m"`` (or ``every_seconds=600``), ``on=("val_loss", "min")`` (or
    ``on="val_loss:min"``), ``keep=N``, ``keep_best=K``, ``strategy="full" |
    "incremental" | "differential"``, ``track=["model", "opt"]`` (or
    ``track="model,opt"``), ``resume=False``, ``sync=True``, ``trust_pickle=True`` (a
    resume unpickles values its objects' states hold as pickles: only for a store you
    trust; without it such a resume is refused), ``max_variable_bytes=N`` and
    ``save_on_signals=("SIGTERM",)`` (the default: SIGTERM saves at the next consistent
    point, then the process exits with status 143; ``()`` turns it off).
    """
    caller = sys._getframe(2)
    unseen: list[str] = []
    if namespace is None:
        namespace = caller.f_globals
        if caller.f_locals is not namespace:  # (called in a function)
            unseen = [n for n, value in caller.f_locals.items() if namespace.get(n) is not value
                      and _is_stateful(value)]
    elif not isinstance(namespace, dict):
        raise TypeError(f"namespace takes a dict (globals() or locals()), not "
                        f"{type(namespace).__name__}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name takes a string, not {name!r}")
    session = start(AutoConfig.from_keywords(directory, options), namespace, nested=True)
    session.locals_frame = _function_locals(namespace, caller)
    # ("auto:" is in no notebook's cell id, which are letters, digits, - and _)
    try:
        session.begin_cell(name or _unnamed_block(caller),
                           cell_id=None if name is None else f"auto:{name}", unseen=unseen,
                           code=code_run_by(session.locals_frame or caller))
        try:
            yield session
        except BaseException as exc:
            session.end_cell(exc)
            raise
        session.end_cell()
    finally:
        stop = session.close()  # (an interrupt meanwhile: held until it is done)
        session.locals_frame = None
    if stop is not None:
        raise stop


def _function_locals(namespace: dict[str, Any],
                     frame: types.FrameType | None) -> types.FrameType | None:
    """The function whose ``locals()`` ``namespace`` is: ``frame``'s, or one that called it
    through code of the user's passing it on (a context manager of theirs around
    ``auto()``, ``with tracked(locals()):``, whose saves otherwise held the function's
    variables as at the call); None where it is no function's (a module's locals() is
    its globals, which the session reads and writes as they are)."""
    while frame is not None and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        live = frame.f_locals
        if live is namespace or (namespace and set(live) == namespace.keys() and all(
                live[name] is value for name, value in namespace.items())):
            return frame
        frame = frame.f_back
    return None
