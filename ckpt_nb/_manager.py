"""``CheckpointManager``: save, restore, inspect and prune checkpoints.

A save walks down the layers: live objects -> capture (state tree) -> codec
(blobs, in the stages of ``_save_pipeline``, overlapping the writes) -> store (one pack, one
manifest, each atomic) -> catalog (one transaction, last). A restore walks back
up and checks every chunk against its digest before any live object changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import decimal
import difflib
import errno
import fcntl
import gc
import hashlib
import inspect
import json
import math
import numbers
import os
import re
import reprlib
import sqlite3
import stat
import sys
import threading
import time
import types
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar, overload

import numpy as np

from . import _codec as codec
from ._buffers import RESTORE_ARENA, give_back_freed_memory, scratch
from ._catalog import (LABELS_WRITTEN, Catalog, CheckpointRow, ChunkRow, DamagedCatalog,
                       disk_full, open_cache)
from ._errors import (DELETED_BY, RANK_BY_ANOTHER, CaptureError, CheckpointInUseError,
                      CheckpointNotFoundError, CkptError, CorruptCheckpointError,
                      ParameterOrderError, StateMismatchError, StoreError, StoreFormatError,
                      check_flag, metrics_logged, too_far_back, warn)
from ._format import (FORMAT, RUN_KEY, check_format, chunk_row_problem, decode_manifest,
                      encode_manifest, has_pickle, id_of, is_deletion_key, is_pack_key,
                      is_run_key, label_key, manifest_key, new_deletion_key, pickle_problem,
                      pack_size, read_pack_index, stamp_format, write_pack)
from ._metric_names import metric_mode_from_name
from ._not_state import NotState
from ._parallel import in_batches, share_work
from ._rebuild import (Rebuilt, deletion_records, guessed_parents, is_newer, read_manifest,
                       rebuild)
from ._save_pipeline import MAX_DEPTH, Memo, SavePipeline
from ._store import CATALOG_FILE, Store, local_root, open_store, why_unwritable, young
from ._lazy import LazyModule
from ._units import natural_order

if TYPE_CHECKING:
    import torch

    from . import _capture as capture
    from ._capture import FlatState, SlotNames, SnapshotBuffers, Unflattener
else:  # (a store's reads need neither: the CLI's ls, show and verify never import torch)
    torch = LazyModule("torch", globals(), "torch")
    capture = LazyModule("ckpt_nb._capture", globals(), "capture")

STRATEGIES = ("full", "incremental", "differential")
# Names that are not keywords for Statefuls: checkpoint fields, and restore()'s options
# (an object saved as strict= could never be given back to restore).
RESERVED = frozenset({"epoch", "step", "batch_idx", "metrics", "extra", "rng", "strategy",
                      "note", "branch", "strict", "trust_pickle", "which", "progress",
                      "ckpt_nb"})  # (the last marks an exported file's fields)
ProgressFn = Callable[[int, int], None]
# What makes two tensor records the same view of their storage's bytes (diff)
_VIEW_FIELDS = ("shape", "stride", "offset", "dtype", "conj", "neg")
# The lock files this thread holds, through any manager: a read through another catalog
# of the same store in that thread (a progress callback, a warning hook) would wait on
# its own thread's flock for ever, so it reads from its catalog as it is
_HELD_HERE = threading.local()
# How many times this process took each lock file, through any manager: a manager whose
# last release was the latest take knows no other manager here wrote the store since
_LOCK_TAKES: Counter[str] = Counter()

T = TypeVar("T")
# list()'s columns before its metrics'
_LIST_COLUMNS = ("id", "parent", "branch", "created", "step", "epoch", "batch_idx", "strategy",
                 "stored_bytes", "logical_bytes", "pinned", "best", "head", "note")
# Set while an export reads the checkpoint it writes (``_read_for_export``)
_EXPORT_READING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "ckpt_nb_export_reading", default=False)


@dataclass(eq=False)
class PickledValue:
    """A value stored as a pickle, left unloaded because trust_pickle was not given.
    Equal only to itself, and so hashable: it can stand for a dict key or a set member
    (an Enum), and two of them stay two keys."""

    name: str

    def __repr__(self) -> str:
        return f"<pickled value {self.name!r}: restore with trust_pickle=True to load it>"


@dataclass
class Checkpoint(NotState):
    """A restored (or loaded) checkpoint: its metadata and the state not put back in place.

    ``id``, ``parent`` (None for a root) and ``branch`` place it in the store's DAG;
    ``created`` is when it was saved (Unix time, seconds); ``step``, ``epoch`` and
    ``batch_idx`` are the position given to ``save()`` (None where not given: after
    ``save(model, optimizer, epoch)`` at an epoch's end, a loop goes on at ``epoch + 1``);
    ``metrics`` the numbers logged with it, ``extra`` its other values; ``strategy``
    "full", "incremental" or "differential"; ``note`` and ``pinned`` as ``annotate()`` and
    ``pin()`` set them. ``state`` holds each saved object's state that was not put back
    into a live object (all of them for ``load()``), by the name it was saved under;
    ``rng`` the random generators' states (None where saved with ``rng=False``)."""

    id: str
    parent: str | None
    branch: str
    created: float
    step: int | None
    epoch: int | None
    batch_idx: int | None
    metrics: dict[str, float]
    extra: dict[str, Any]
    strategy: str
    note: str
    pinned: bool
    state: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] | None = None
    kinds: dict[str, str] = field(default_factory=dict)
    """The class of each object whose state was saved ("torch.optim.adam.Adam")."""
    param_names: dict[str, SlotNames] = field(default_factory=dict)
    """Each optimizer's parameters' names ("model.0.weight"), group by group in the order
    saved, None for one outside the modules saved with it; a restore puts the state on the
    parameters by these names."""
    missing_keys: dict[str, list[str]] = field(default_factory=dict)
    """What a restore with ``strict=False`` skipped: each module's keys the checkpoint
    lacks (they kept their live values), by the object's name; only the modules that
    skipped some, so empty where strict or where everything fitted."""
    unexpected_keys: dict[str, list[str]] = field(default_factory=dict)
    """The checkpoint's keys that ``strict=False`` left out, each module's by its name
    (as ``missing_keys``)."""

    def __repr__(self) -> str:
        where = ", ".join(f"{k}={v}" for k, v in
                          (("epoch", self.epoch), ("batch_idx", self.batch_idx),
                           ("step", self.step)) if v is not None)
        return f"Checkpoint({self.id!r}, {where or 'no position'}, metrics={self.metrics})"


@dataclass
class VerifyReport(NotState):
    """What ``verify()`` found.

    - ``checked``: the ids of the checkpoints it read, in the order asked for (oldest
      first by default);
    - ``bad``: each failing checkpoint's id, with its problems;
    - ``packs``: each pack whose own index is damaged (its chunks read, through the
      catalog, but a rebuilt catalog could not find them: ``gc()`` rewrites it);
    - ``newer``: each checkpoint written by a newer ckpt_nb, which this one cannot read,
      so did not check (not corrupt, but not verified either);
    - ``ok`` (and the report's truth): nothing bad, damaged or unchecked."""

    checked: list[str]
    bad: dict[str, list[str]]
    packs: dict[str, str] = field(default_factory=dict)
    newer: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.bad and not self.packs and not self.newer

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class GCReport(NotState):
    """What ``gc()`` reclaimed.

    - ``chunks_dropped``: chunks no kept checkpoint needs, forgotten by the catalog;
    - ``packs_deleted``: pack files deleted whole (every chunk in them dead);
    - ``packs_compacted``: packs rewritten without their dead chunks (and packs whose own
      index is damaged, rewritten whole);
    - ``manifests_deleted``: manifests of checkpoints no longer in the catalog (deleted,
      or from a save killed before its commit);
    - ``temporaries_deleted``: half-written files that killed saves left;
    - ``bytes_freed``: the store's bytes all of the above gave back;
    - ``damaged_kept``: packs and manifests found damaged and left in the store, for a
      person to look at (``verify()`` names them);
    - ``chunks_rewritten``: deltas stored whole, so that the deleted bases they needed
      could go."""

    chunks_dropped: int = 0
    packs_deleted: int = 0
    packs_compacted: int = 0
    manifests_deleted: int = 0
    temporaries_deleted: int = 0
    bytes_freed: int = 0
    damaged_kept: int = 0
    chunks_rewritten: int = 0


@dataclass
class Dropped:
    """A deletion whose gc collects only what it leaves (a save's retention): the
    checkpoints, the chunks they referred to (read before the catalog forgot them), and
    the key of the deletion's record."""

    ids: Sequence[str]
    held: set[str]
    record: str


# The store format whose readers read CKB2 chunk blobs (what a gc's rewrite writes)
_CKB2_FORMAT = 2
LOCK_QUIET_SECONDS = 1.0  # a wait for another process's lock said after this long
MANIFESTS_KEPT = 32  # decoded manifests a manager keeps (the newest saves', the last read)
# The fewest characters of an id that name a checkpoint, as git's: restore("3"), meant as
# step 3, restored whichever checkpoint's id alone began with a 3
SHORTEST_PREFIX = 4
MAX_CHUNK_BYTES = 1 << 30  # the largest chunk_size
# No chunk of any store is larger (stores made before chunk_size had its bound may hold
# chunks over MAX_CHUNK_BYTES): a catalog row that says one is, is damaged, and refused
# before its buffer is asked for.
_LARGEST_CHUNK_READ = 1 << 40

# Over a byte budget, a pack with this much dead in it is compacted (not half of it):
# the index and the header are never live, and are a few percent of a small pack.
BUDGET_COMPACT_BELOW = 0.9

# A local store's lock file, in its folder whatever catalog a manager uses: one lock
# for all of the store's writers (one beside each catalog let two writers in).
STORE_LOCK_FILE = CATALOG_FILE + ".lock"

_MEMORY_LOCKS: dict[str, threading.RLock] = {}
_MEMORY_LOCKS_GUARD = threading.Lock()


def _memory_store_lock(url: str) -> threading.RLock:
    """The lock of the managers of one memory:// store (which lives in this process)."""
    with _MEMORY_LOCKS_GUARD:
        return _MEMORY_LOCKS.setdefault(url, threading.RLock())


_MANAGERS: weakref.WeakSet[CheckpointManager] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A child forked while a manager saved (a DataLoader's workers, forked as an epoch
    starts under a background save) has that manager's locks (its ``_busy``, its
    catalog's, a memory:// store's) held by threads it does not have, and pools whose
    threads it does not have: give it fresh ones, or its first save or close() waits
    forever. (Its forking thread's own holds, if any, stay.)"""
    global _MEMORY_LOCKS_GUARD
    for manager in list(_MANAGERS):
        manager._released = None  # (the parent's next take writes a note as this one's)
        if not manager._busy._is_owned():  # type: ignore[attr-defined]
            manager._busy = threading.RLock()
            manager._pool = manager._pack_writer = None
            for catalog in (*manager._replaced_catalogs, getattr(manager, "catalog", None)):
                if catalog is not None:
                    catalog.after_fork()
    _MEMORY_LOCKS_GUARD = threading.Lock()
    for url, lock in list(_MEMORY_LOCKS.items()):
        if not lock._is_owned():  # type: ignore[attr-defined]
            _MEMORY_LOCKS[url] = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _new_id() -> str:
    return uuid.uuid4().hex[:10]


# What threading raises where the system refuses a thread (a pids limit, no memory for
# its stack): said bare, it named neither the save nor that nothing was lost.
_NO_THREAD = "can't start new thread"


def _saved_at(step: str, ids: list[str]) -> str:
    """Which checkpoints were saved at ``step`` (``ids``, newest first), in words."""
    newest = " (the newest first)" if len(ids) > 1 else ""
    return f"step {step} was saved as {', '.join(ids[:3])}{newest}"


class CheckpointManager(NotState):
    """Checkpoints of one training run (or many branching runs) in one store.

    ``max_to_keep`` keeps the newest N, ``keep_best`` the best K by ``metric``
    (``mode`` "min" or "max"; left out, the metric's name says it: a loss or error is
    "min", an accuracy or score "max"; a name that says neither takes the mode the
    store's saves recorded for it, else is refused);
    pinned checkpoints and the newest are always kept.
    A manager's saves record its ``metric`` and ``mode`` in the catalog; one opened without
    ``metric=`` ranks by those ("best", ``list()``'s best column), but retention by
    ``keep_best`` still needs ``metric=`` given.
    ``keep_best`` without ``max_to_keep`` keeps only those (as Lightning's ``save_top_k``
    and Orbax do): the best K, the pinned, the newest and the head, the others deleted;
    with ``max_bytes`` (and no ``max_to_keep``), the budget says how many others stay.
    ``strategy`` is "full", "incremental" (deltas against the parent) or
    "differential" (deltas against the branch's last full checkpoint);
    ``full_every`` bounds a chain of deltas (without it a chunk stacks at most 8, or
    ``max_to_keep``). ``max_bytes`` is a byte budget (the oldest go first).

    ``codec="none"`` stores raw bytes; ``level`` is zstd's, ``threads`` the encoding
    and decoding threads (default: the cores, up to 4), ``chunk_size`` the bytes a chunk holds
    (a multiple of 64 bytes from 4 KiB to 1 GiB; default 1 MiB), the unit of deduplication.
    ``durable=False`` skips fsync (for throwaway stores: a crash may then lose a committed
    checkpoint). ``catalog`` puts the SQLite catalog elsewhere (a relative path from the
    working directory at open; default: beside a local store, or in
    ``$XDG_CACHE_HOME/ckpt_nb`` for an object store). A local store with a catalog
    elsewhere is still locked in its own folder, and other managers (``ckpt-nb gc DIR``
    among them) use the catalog beside it: each writer whose catalog is not the one that
    wrote the store last lists the store first, and reads it again where it is behind (a
    gc from the other catalog deleted what this one saved), which costs time on a large
    store each time the two alternate.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | Store,
        max_to_keep: int | None = None,
        *,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: str | None = None,
        strategy: str = "full",
        full_every: int | None = None,
        max_bytes: int | None = None,
        codec: str = "zstd",
        level: int = 1,
        threads: int | None = None,
        chunk_size: int = 1 << 20,
        durable: bool = True,
        catalog: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(directory, (str, os.PathLike, Store)):
            raise TypeError(f"directory must be a folder's path or a store URL "
                            f"(CheckpointManager('runs/exp1')), not {directory!r}")
        _check_choice("strategy", strategy, STRATEGIES)
        mode = _ranking_mode(metric, mode)
        if mode is None and not isinstance(directory, Store) and \
                "://" not in os.fspath(directory) and not Path(directory).expanduser().exists():
            raise _no_direction(str(metric), ())  # (no store there: none recorded it)
        check_flag("durable", durable)
        _check_choice("codec", codec, codec_names())
        for name, value in (("max_to_keep", max_to_keep), ("keep_best", keep_best),
                            ("full_every", full_every), ("max_bytes", max_bytes)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, not {value!r}")
        if keep_best is not None and metric is None:
            raise ValueError("keep_best needs metric=, the name of the metric to rank by")
        if not isinstance(level, int) or isinstance(level, bool) or not -7 <= level <= 22:
            raise ValueError(f"level must be an integer from -7 to 22 (zstd's levels; 1, the "
                             f"default, is the fastest that compresses well), not {level!r}")
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool)
                                    or threads < 1):
            raise ValueError(f"threads must be a positive integer or None (one per core, up "
                             f"to 4), not {threads!r}")
        if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or \
                not 4096 <= chunk_size <= MAX_CHUNK_BYTES or chunk_size % 64:
            raise ValueError(f"chunk_size must be a multiple of 64 bytes from 4096 to 1 GiB, "
                             f"not {chunk_size!r}")
        self.store = open_store(directory, **({} if isinstance(directory, Store)
                                              or "://" in os.fspath(directory)
                                              else {"durable": durable}))
        self.max_to_keep, self.keep_best, self.metric, self.mode = (
            max_to_keep, keep_best, metric, mode)
        self.strategy, self.full_every, self.max_bytes = strategy, full_every, max_bytes
        self.codec, self.level, self.chunk_size = codec, level, chunk_size
        self.threads = threads or min(4, os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None
        self._pack_writer: ThreadPoolExecutor | None = None
        self._lock_path: Path | None = None
        self._read_only_rebuild = False  # the catalog is rebuilt in memory, to read only
        self._disk_full = False  # ...as there is no room for it on the store's full disk
        self._cache_refused = ""  # where an object store's catalog cache cannot be, and why
        self._told_blocked = False  # retention said gc is stopped by a damaged checkpoint
        self._told_not_caught_up = False  # a read said another catalog's writes went unread
        self._told_over_budget = False  # retention said the kept checkpoints pass max_bytes
        self._told_unranked = False  # retention said no checkpoint logs keep_best's metric
        self._told_never_best = False  # a save said it logs metrics, but not the one ranked
        self._told_left_out: set[str] = set()  # objects said to save nothing of their state
        self._told_stray: set[str] = set()  # optimizers a save said step no saved module
        self._holding = threading.local()  # .lock: this thread is in _exclusive()
        # An upper bound of ``stored_bytes()`` (its last measure plus what saves added
        # since), and the catalog's generation then: a save under ``max_bytes`` that it
        # keeps under the budget measures nothing (each measured the whole store). None
        # where it is unknown: at open, after a gc or a failure.
        self._bytes_bound: int | None = None
        self._bound_generation = -1
        # The lock file's note as this manager's last release left it, with this
        # process's take count then, and whether this take found it so: no other
        # process, and no other manager here, took the lock in between (a save killed
        # there left bytes that no catalog counts).
        self._released: tuple[str, int] | None = None
        self._untouched = False
        self._busy = threading.RLock()  # held in _exclusive(): close() waits for a save
        # Told a wait for another process's lock (``_wait_for``), then None once it is
        # taken: the explorer's status line says it, which stderr alone did not show.
        self._on_lock_wait: Callable[[str | None], None] | None = None
        self._replaced_catalogs: list[Catalog] = []  # the last opened again, till close()
        self._closed = False  # (close() was called: a catalog replaced is not opened again)
        _MANAGERS.add(self)  # (a forked child's copy gets a fresh _busy)
        self._left_out_named: set[str] = set()  # what a catch-up's rebuild left out, warned of
        # (the catalog and its counts as the last catch-up left them, and the version of
        # each label it read then: one unchanged since, in an unchanged catalog, is not read)
        self._labels_read: tuple[Any, dict[str, str]] = (None, {})
        self._failed_saves: set[str] = set()  # ids whose manifest a failed save left behind
        self._noted_now: set[str] = set()  # (the id the failing save now noted: _saving)
        # A deletion's collection failed (retention's, delete()'s): the next one collects
        # the whole store (gc), as the checkpoints that one deleted left what only a whole
        # gc finds.
        self._collection_failed = False
        self._format = check_format(self.store)  # (as found: restamped by _stamp_format)
        self.catalog = self._open_catalog(self._catalog_path(catalog))
        self._catch_up_with_a_copy_put_back()
        # The ranking the last save with a metric recorded, taken where none is given
        # (this manager's saves then record nothing: it ranks as another's did), and
        # taken again at each catch-up where a later save recorded another.
        self._ranking_taken: tuple[str, str] | None = None
        self._ranking_said = False  # (that "best" came from the record: said once)
        if self.mode is None:  # (a metric whose name says neither way: the record's)
            self.mode = self._recorded_mode(str(metric))
        self._follow_recorded_ranking()
        self.head: str | None = None
        """The checkpoint the live objects came from (last saved or restored): the next
        save's parent."""
        self._manifests: dict[str, dict[str, Any]] = {}
        self._listeners: list[Callable[[str, str], None]] = []
        self._retention_dropped: list[str] = []  # (told to the listeners once unlocked)
        self._delta_wins: dict[str, tuple[bool, int]] = {}  # storage -> (delta won, at save)
        # (storage, chunk index, length) -> what the last save saw there: its xxh3,
        # its digest, and, for a chunk that save wrote, the head of its bytes.
        self._digest_memo: Memo = {}
        self._delta_bases: dict[str, np.ndarray] = {}  # raw bytes of the last save's deltas' ends
        # Packs of an object store a save found long enough for the chunks it reused from
        # them (pack -> its size then): each asked for once (a HEAD is a round trip), until
        # a save fails. A local store's are looked at by every save (a stat).
        self._whole_packs: dict[str, int] = {}
        self._told_damaged_packs: set[str] = set()  # (said once by a save's warning)
        self._saves = 0
        self._write_missing_labels()

    # -- set-up -----------------------------------------------------------------
    def _catalog_path(self, catalog: str | os.PathLike[str] | None) -> str:
        root = local_root(self.store)
        if catalog is not None:
            path = Path(catalog).absolute()  # (not another after a chdir, a notebook's %cd)
        elif root is not None:
            path = root / "catalog.sqlite"
            if not path.exists() and root.is_dir() and not os.access(root, os.W_OK):
                self._read_only_rebuild = True  # (another user's store, a read-only mount)
                return ":memory:"
            if not path.exists() and root.is_dir() and disk_full(root):
                self._read_only_rebuild = self._disk_full = True  # (a run filled the disk)
                return ":memory:"
        else:
            key = hashlib.sha256(self.store.identity.encode()).hexdigest()[:16]
            if self.store.url.startswith("memory://"):
                return ":memory:"
            try:
                cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
            except RuntimeError:  # (a uid with no passwd entry nor HOME: docker --user N)
                self._cache_refused = ("~/.cache (this user has no home folder, and "
                                       "XDG_CACHE_HOME is not set)")
                self._read_only_rebuild = True
                return ":memory:"
            path = Path(cache) / "ckpt_nb" / key / "catalog.sqlite"
            refused = _unwritable(path.parent)
            if refused:  # (a read-only home: a container's, CI's; a stale cache, rebuilt)
                self._cache_refused = f"{path.parent} ({refused})"
                self._read_only_rebuild = True
                return ":memory:"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot make {path.parent}, the folder of the catalog {path}: "
                             f"{exc.strerror or exc}") from exc
        # (a local store's own, wherever its catalog is: the managers of one store, each
        # with its catalog, lock one file)
        self._lock_path = path.with_name(path.name + ".lock") if root is None else \
            root / STORE_LOCK_FILE
        return str(path)

    def _open_catalog(self, path: str) -> Catalog:
        """The store's catalog; one that is not there is rebuilt from the store, with a
        warning (an empty one would show no checkpoints, and gc would delete them). So
        is the cached catalog of a store elsewhere (an object store's) that no longer
        lists what the store holds: another machine saved or deleted there, and gc would
        delete what it saved."""
        found: list[Rebuilt] = []

        def read_store(committed: AbstractSet[str] = frozenset(),
                       failed: Collection[str] = ()) -> Rebuilt:
            try:
                found.append(rebuild(self.store, committed, failed))
            except OSError as exc:
                raise StoreError(f"the catalog of {self.store.url} is missing or stale, and "
                                 f"reading the store to rebuild it failed ({exc}); nothing "
                                 "was changed: open it again") from exc
            return found[-1]

        # (a file there that holds no catalog: its journal, which held every change since
        # it was made, deleted after a kill; a file cut to nothing)
        why = "was missing" if path == ":memory:" or not Path(path).is_file() else \
            (f"was empty (its file held no catalog: was its journal, {Path(path).name}-wal, "
             "deleted, or did an open fail before it wrote the catalog, an older ckpt_nb's "
             "that refused the store?)")

        def catch_up(catalog: Catalog) -> None:
            nonlocal why
            if not found and self._behind_the_store(catalog):
                why = ("no longer matched the store (written from elsewhere, or a save here "
                       "was cut short)")
                with self._exclusive():
                    catalog.reseed(read_store(_committed(catalog), catalog.failed_saves()))

        aside = None
        if local_root(self.store) is None and path != ":memory:":  # (a cache of the store)
            catalog, aside = open_cache(path, read_store, catch_up)
        else:
            catalog = Catalog(path, seed=read_store)
        if aside is not None:
            why = (f"was damaged, and was moved aside to {aside} (with its -wal and -shm "
                   "files, where there were such)")
        if self._read_only_rebuild and self._cache_refused:
            catalog.read_only = True
            warn(f"the catalog of {self.store.url} cannot be cached in {self._cache_refused}, "
                 f"so it was rebuilt in memory, to read only: {found[0].summary()}; to "
                 f"change the store, {_CACHE_ELSEWHERE}", RuntimeWarning)
        elif self._read_only_rebuild:
            catalog.read_only = True
            warn(f"the catalog of {self.store.url} is missing and "
                 f"{'its disk is full' if self._disk_full else 'its folder cannot be written'}"
                 f", so it was rebuilt in memory, to read only: {found[0].summary()}"
                 f"{_FREE_ROOM_TO_WRITE if self._disk_full else ''}", RuntimeWarning)
        elif catalog.disk_full:
            warn(f"the disk of {self.store.url} is full, so its catalog was opened to read "
                 f"only (to list, restore and export){_FREE_ROOM_TO_WRITE}", RuntimeWarning)
        # (an in-memory catalog, for a memory:// store, is read from its store every time)
        elif found and (found[-1].checkpoints or found[-1].left_out or aside is not None) \
                and path != ":memory:":
            warn(f"the catalog of {self.store.url} {why}, so it was rebuilt from "
                 f"the store: {found[-1].summary()}", RuntimeWarning)
        return catalog

    def _write_missing_labels(self) -> None:
        """Write the labels of every pinned or annotated checkpoint, and of every one
        joined to a new parent, that lack one, once per catalog (its flag set last, so
        a crash only means doing it again): a ckpt_nb from before labels kept them in
        the catalog alone, and a catalog rebuilt from the store then lost them
        (retention deleted a checkpoint that had been pinned)."""
        if self.catalog.read_only or self.catalog.flag(LABELS_WRITTEN):
            return
        try:
            with self._exclusive():
                self._catch_up()  # (an object store's labels, made elsewhere, first)
                for row in self.catalog.pinned_or_noted():
                    if not self.store.has(label_key(row.id)):
                        self._label(row.id)
                self._label_rejoined()
                self.catalog.set_flag(LABELS_WRITTEN)
        except OSError as exc:  # (StoreError too) a store this process may only read
            warn(f"the pins and notes of {self.store.url} are in its catalog only, and "
                 f"writing them into the store failed ({exc}): a catalog rebuilt from the "
                 "store would lose them; they are written at the next open that can",
                 RuntimeWarning)

    def _behind_the_store(self, catalog: Catalog) -> bool:
        """Whether the store holds checkpoints the catalog does not list, or lacks some it
        does, or its chunks lie in other packs (another machine's gc compacted them: a
        gc from here would delete the new pack as an orphan); what a rebuild found
        damaged aside, and what the last one left out (a save in flight, a killed save's
        leftover: the whole store was read again at every call until gc deleted it)
        while a rebuild would read it as that one did: none of it grown older than the
        grace time, none of its checkpoints given a label. A checkpoint that a deletion
        record names is deleted, its manifest there or not: where the catalog lists it
        (deleted elsewhere, or a deletion here cut short before its catalog's commit) the
        catalog is behind."""
        left_out = catalog.left_out_keys()
        if any(when is not None and when <= time.time() for when in left_out.values()):
            return True
        rows = catalog.checkpoints()
        pins = {row.id for row in rows if row.pinned}
        records, _ = deletion_records(self.store, pins.__contains__)
        deleted = {cid for ids in records.values() for cid in ids} | {*catalog.failed_saves()}
        listed = {row.id for row in rows}
        if listed & deleted:
            return True
        aside = set(catalog.damaged()) | set(left_out)
        stored = {id_of(key) for key in self.store.list("manifests") if key not in aside}
        if stored - {None} - deleted != listed:
            return True
        if set(self.store.list("packs")) - aside != catalog.packs():
            return True
        unread = {id_of(key) for key in left_out} - {None}
        return bool(unread) and any(id_of(key) in unread for key in self.store.list("labels"))

    @contextlib.contextmanager
    def _saving(self) -> Iterator[None]:
        """A store's failure in a save, said to be the save's: "looking for packs/...
        failed" said neither that the save failed nor that what was saved before is intact
        (what fails before the commit leaves no checkpoint; a half-written pack is gc's).
        A full disk's error says the last already, and is not made to say it twice."""
        self._noted_now = set()  # (the id a failure of this save notes)
        try:
            yield
        except StoreError as exc:
            self._check_there()
            intact = "" if "intact" in str(exc) else \
                " (the checkpoints saved before are intact)"
            unrecorded: list[str] = []
            with contextlib.suppress(Exception):  # (a catalog failing too: said as it was)
                # (this save's own: an earlier failed save's, or another process's on a
                # shared catalog, is no part of what reached the store of this one)
                unrecorded = [cid for cid in self.catalog.failed_saves()
                              if cid in self._noted_now]
            told = "" if not unrecorded else (
                f"; what reached the store of it could not be deleted: checkpoint"
                f"{'s' * (len(unrecorded) > 1)} {', '.join(unrecorded)} "
                f"{'is' if len(unrecorded) == 1 else 'are'} recorded as deleted in this "
                "catalog, and will be in the store at this manager's next call that reaches "
                "it (until then a catalog on another machine may list it)")
            failed = StoreError(f"saving a checkpoint failed, so it was not saved{intact}: "
                                f"{exc}{told}")
            failed.errno = exc.errno
            raise failed from exc

    def _check_there(self) -> None:
        """Refuse a local store whose folder was removed while this manager had it open:
        its catalog, still open, lists checkpoints whose files are gone."""
        root = local_root(self.store)
        if root is not None and not root.is_dir():
            raise StoreError(f"the store at {self.store.url} is gone: its folder was removed "
                             "while this manager had it open")

    def _stamp_format(self, needed: int = FORMAT) -> None:
        """Stamp an older store with this ckpt_nb's format before writing what a reader
        of its format (below ``needed``) would misread (a save's manifest; a gc's
        rewritten chunk, a CKB2 blob): that reader then refuses the store by its
        format, where it read the new files as damage."""
        if self._format < needed:
            stamp_format(self.store)
            # (set before the warning: under warnings-as-errors it raises, and every later
            # save of this manager would restamp and raise again, never saving)
            older, self._format = self._format, FORMAT
            warn(f"the store at {self.store.url} was of format {older}; this write made it "
                 f"format {FORMAT}, so a ckpt_nb that writes format {older} (an older "
                 "version, a teammate's) now refuses it by name: upgrade every ckpt_nb that "
                 "shares this store (pip install -U ckpt_nb)")

    def _catch_up(self) -> None:
        """A catalog of this process's own (a memory:// store's; an object store's, a
        cache on this machine) does not see what other managers saved, deleted, pinned
        or noted: read the store again where it has moved on, before anything is written
        or collected (a gc from a stale catalog deleted the other manager's new
        checkpoints; retention, a checkpoint pinned elsewhere). A local store's catalog
        is the store's own: only checked to be there still (``_exclusive`` reads the
        store again where another catalog wrote it last), and opened again where another
        catalog file took its place (the store removed and made again at its path: a
        notebook that reruns its ``shutil.rmtree(STORE)`` cell, or another process; a
        rebuild by another manager), at a lock take as a writer's. That costs a stat of
        the folder and one of the catalog; where the catalog file is missing, the next
        writer's lock take rebuilds it (one rebuilt here, from what a ``shutil.rmtree``
        in progress left, was written into the folder it deletes). Where another catalog
        wrote the store last, it is read again too (``_catch_up_with_another_catalog``).
        A failed save's deletion that the store could not be told of then is told first."""
        self._record_failed_saves()
        if local_root(self.store) is not None:
            self._check_there()
            catalog = self.catalog
            if catalog.replaced() and catalog.path.exists():  # (the store made again?)
                if catalog.read_only:  # (it takes no lock: it writes nothing)
                    self._reopen_if_removed()
                else:  # (a lock take opens it again, and reads the store where it is behind)
                    with self._exclusive(reading=True):
                        pass
            self._catch_up_with_another_catalog()
        else:
            self._read_store_again()
        self._follow_recorded_ranking()

    def _read_store_again(self) -> None:
        """Bring the catalog up to the store where it is behind (rebuilt from the
        store), and its pins and notes up to the store's labels."""
        if self._behind_the_store(self.catalog):
            since = self.catalog.generation()
            found = rebuild(self.store, _committed(self.catalog), self.catalog.failed_saves())
            if not self.catalog.reseed(found, since):
                return  # (written meanwhile by another manager of this catalog, outside any
                # lock: its commit stands, and a later call reads the store again if behind)
            new = [line for line in found.left_out if line not in self._left_out_named]
            if new:  # (once each: a killed save's leftover stays until gc)
                self._left_out_named.update(new)
                warn(self._read_again_said(found, new), RuntimeWarning)
            return
        # Pins and notes changed elsewhere: each label is read, but on an object store
        # whose listing gives versions (S3's ETags), one read at an earlier catch-up
        # into this same catalog, unchanged since, is not (a CLI command read each 4-5
        # times: 40 of the 78 requests of a `show`)
        catalog, read = self._labels_read
        if catalog != (self.catalog, self.catalog.counts()):
            read = {}
        versions = self.store.versions("labels")
        for key in versions if versions is not None else list(self.store.list("labels")):
            version = versions.get(key) if versions is not None else None
            if version is not None and read.get(key) == version:
                continue
            row = self.catalog.get(id_of(key) or "")
            try:
                label = json.loads(self.store.get(key))
            except (FileNotFoundError, ValueError):
                continue  # (deleted meanwhile, or damaged: the catalog's stands)
            if row is None or not isinstance(label, dict) or \
                    not isinstance(label.get("pinned", False), bool) or \
                    not isinstance(label.get("note", ""), str):
                continue  # (one no save writes, left out as a rebuild leaves it out)
            found = {"pinned": label.get("pinned", row.pinned),
                     "note": label.get("note", row.note)}
            change = {name: value for name, value in found.items()
                      if value != getattr(row, name)}
            if change:
                self.catalog.update(row.id, **change)
            if version is not None:
                read[key] = version
        self._labels_read = ((self.catalog, self.catalog.counts()), read)

    def _read_again_said(self, found: Rebuilt, new: list[str]) -> str:
        """The warning of a catch-up whose rebuild left ``new`` out: a leftover of this
        manager's own failed save (its manifest, which could not be deleted then) is
        said to be that, not a change made elsewhere."""
        mine = sorted(cid for cid in found.leftovers if cid in self._failed_saves)
        one = len(mine) == 1
        own = (f"checkpoint{'' if one else 's'} {', '.join(mine)}, which a save here that "
               f"failed left in the store (its manifest could not be deleted then), "
               f"{'is no checkpoint' if one else 'are no checkpoints'}: gc() deletes "
               f"{'it' if one else 'them'}")
        if mine and set(new) <= {found.leftovers[cid] for cid in mine}:
            return f"the store at {self.store.url} was read again: {own}"
        return (f"the store at {self.store.url} changed elsewhere and was read again: "
                f"{found.summary()}{f'; {own}' if mine else ''}")

    @contextlib.contextmanager
    def _exclusive(self, reading: bool = False) -> Iterator[None]:
        """One writer at a time: saves, deletes and gc (across processes through a lock
        on a local store's folder and its lock file, or on a lock file beside an object
        store's catalog cache; a memory:// store's managers, in one process). Under it,
        a catalog another manager replaced is opened again, and a local store that
        another catalog wrote last is read again: a gc or retention from a catalog that
        missed those saves deleted them; the lock file keeps the last writer's mark until
        that catch-up is done. ``reading``: held only so that nothing is deleted under a
        read (the lock file says so to those who wait)."""
        if getattr(self._holding, "lock", False):  # (this thread has it already)
            yield
            return
        if getattr(getattr(self, "catalog", None), "read_only", False):  # (set once open)
            if self._cache_refused:
                raise StoreError(f"the store at {self.store.url} is open to read only, since "
                                 f"its catalog cannot be cached in {self._cache_refused}: "
                                 f"{_CACHE_ELSEWHERE}")
            if self._disk_full or self.catalog.disk_full:
                raise StoreError(f"the store at {self.store.url} is open to read only, as its "
                                 f"disk was full when it was opened{_FREE_ROOM_TO_WRITE}")
            raise StoreError(f"the store at {self.store.url} is open to read only (this "
                             "process cannot write its folder): copy it somewhere writable "
                             "to change it")
        self._holding.lock = True
        try:
            if self._lock_path is None:
                with self._busy, _memory_store_lock(self.store.url):
                    # (a memory:// store's writers are managers of this process, whose
                    # saves a catch-up reads into this catalog: its generation tells)
                    self._untouched = True
                    yield
                return
            with self._busy, self._folder_locked(), self._open_lock() as handle:
                self._wait_for(handle)
                held = _HELD_HERE.__dict__.setdefault("paths", Counter())
                held[str(self._lock_path)] += 1
                _LOCK_TAKES[str(self._lock_path)] += 1
                caught_up = False  # (whether this catalog has seen what the note says)
                try:
                    note = self._lock_note()
                    self._untouched = self._released == (
                        note, _LOCK_TAKES[str(self._lock_path)] - 1)
                    self._released = None  # (until this take's note is written)
                    self._reopen_if_removed()
                    catalog = getattr(self, "catalog", None)  # (None while first opened)
                    mine = "" if catalog is None else self._catalog_mark()
                    last = _mark_in(note)
                    behind = _missed_writes(last, mine) and local_root(self.store) is not None
                    # (until the catch-up is done the note keeps the last writer's mark: a
                    # take after it was cut short, a kill or Ctrl-C, reads the store again)
                    self._note_holder(handle, (last or "-") if behind else mine,
                                      reading and catalog is not None)
                    if behind:
                        self._read_store_again()
                        # (then this catalog's own mark, before the body: the other's kept
                        # through it would say, after a kill there, that the other catalog
                        # had seen this one's save, and its gc deleted it)
                        self._note_holder(handle, self._catalog_mark(),
                                          reading and catalog is not None)
                    caught_up = True
                    yield
                finally:
                    if getattr(self, "catalog", None) is not None and caught_up:
                        # (what this holder wrote counted: its next take reads nothing again)
                        with contextlib.suppress(CkptError, OSError, sqlite3.Error):
                            self._released = (self._note_holder(handle, self._catalog_mark()),
                                              _LOCK_TAKES[str(self._lock_path)])
                    fcntl.flock(handle, fcntl.LOCK_UN)
                    held[str(self._lock_path)] -= 1
                    if not held[str(self._lock_path)]:
                        del held[str(self._lock_path)]
        finally:
            self._holding.lock = False

    @contextlib.contextmanager
    def _folder_locked(self) -> Iterator[None]:
        """A local store's folder locked (flock on the folder itself, which cannot be
        deleted under a live store as its lock file can: a second writer then got in).
        Where the filesystem locks no folders (NFS), the lock file alone."""
        root = local_root(self.store)
        folder = None
        if root is not None:
            with contextlib.suppress(OSError):  # (gone: _check_there says so)
                folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if folder is not None:
                with contextlib.suppress(OSError):  # (not BlockingIOError: it waits)
                    self._wait_for(folder)
            yield
        finally:
            if folder is not None:
                # (unlocked, not only closed: a child forked meanwhile shares the lock,
                # and kept the folder locked after this close)
                with contextlib.suppress(OSError):
                    fcntl.flock(folder, fcntl.LOCK_UN)
                try:
                    os.close(folder)
                except OSError as exc:  # (the descriptor is freed all the same)
                    warn(f"closing the folder of {self.store.url} after locking it failed "
                         f"({exc}): what this call did stands, and the lock is released; "
                         "if it happens again, is the disk failing? dmesg says more")

    def _catch_up_with_a_copy_put_back(self) -> None:
        """A copy of the catalog put back over it (a backup, written in place or renamed
        over it as rsync does) misses the saves made since and lists checkpoints deleted
        since: its "latest" was old, and its gc deleted the newer checkpoints' packs. The
        lock file notes how many checkpoints the catalog that wrote the store last had
        ever listed; where this catalog, by the id its file holds, is that one and counts
        fewer, the store is read again now (a writer's lock take does so too)."""
        root = local_root(self.store)
        if root is None or self._lock_path is None or self.catalog.read_only:
            return
        last = self._last_mark()
        stored = self.catalog.stored_uid()  # (a copy made as a new file keeps it too)
        if stored is None or not last.startswith(f"{stored}@"):
            self._catch_up_with_another_catalog()  # (another catalog's mark, if any)
            return
        if not _missed_writes(last, f"{stored}@{self._counts()}"):
            return
        why = (f"the catalog of {self.store.url} is older than the store's last write (a copy "
               "of it was put back?)")
        # (a copy made as a new file elsewhere is one given as catalog=, read again unsaid,
        # as at a lock take after another catalog's write)
        put_back = self.catalog.known_uid() == stored or \
            Path(self.catalog.path) == root / "catalog.sqlite"
        try:
            with self._exclusive(reading=True):  # (it reads the store again)
                pass
        except CkptError as exc:
            warn(f"{why}, and reading the store again failed ({exc}): its 'latest' may be "
                 f"old; move {self.catalog.path} aside, and the store opens rebuilt",
                 RuntimeWarning)
            return
        if put_back:
            warn(f"{why}, so it was brought up to the store", RuntimeWarning)

    def _catch_up_with_another_catalog(self) -> None:
        """Read a local store again, under the reading lock, where the lock file says
        another catalog wrote it last (a manager's ``catalog=`` elsewhere): only a
        writer's lock take did, and until then this catalog listed what that one's
        retention deleted (``ckpt-nb verify`` called it damaged: "its manifest is
        missing") and missed its saves. Where this catalog wrote last (one catalog, the
        common case) it costs a read of the lock file; a writer holds the lock, caught up.
        Where that lock cannot be taken (a lock file this user may not write), the read
        goes on from the catalog as it is, said once."""
        if self._lock_path is None or self.catalog.read_only or \
                getattr(self._holding, "lock", False) or \
                str(self._lock_path) in getattr(_HELD_HERE, "paths", ()):
            return
        last = self._last_mark().partition("@")[0]
        if not last or last == self.catalog.known_uid():
            return  # (no mark: none written, or an older ckpt_nb's, read at a writer's take)
        try:
            with self._exclusive(reading=True):  # (it reads the store again)
                pass
        except CkptError as exc:
            if not self._told_not_caught_up:
                self._told_not_caught_up = True
                warn(f"the store at {self.store.url} was written last through another "
                     f"catalog, and reading it again failed ({exc}): this catalog may list "
                     "checkpoints deleted since and miss new ones", RuntimeWarning)

    def _open_lock(self) -> IO[str]:
        """The lock file; an object store's catalog cache removed meanwhile (a cache
        cleaner, ``rm -rf ~/.cache``) is made again, since the store holds everything.
        One that is not a regular file (a FIFO, a folder) is refused, not waited on."""
        assert self._lock_path is not None
        cache = self._lock_path.parent
        try:
            if local_root(self.store) is None:
                cache.mkdir(parents=True, exist_ok=True)
            # (not appending: a note is written over the last, ``_note_holder``; not
            # blocking: a FIFO opened to write waits for a reader, forever)
            handle = os.open(self._lock_path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o666)
        except OSError as exc:
            if self._lock_path.exists() and not self._lock_path.is_file():
                raise self._lock_not_a_file() from exc  # (a folder; a FIFO no process reads)
            # (one there is opened whatever its folder allows: the file is what refuses)
            fix = why_unwritable(exc) if exc.errno == errno.EROFS else \
                "make it writable for this user (chmod or chown it, as its owner or " \
                "root)" if self._lock_path.exists() else \
                f"make {cache} writable (for an object store's catalog cache, " \
                "XDG_CACHE_HOME may name another folder)"
            raise StoreError(f"cannot open the lock file {self._lock_path} of "
                             f"{self.store.url} ({exc.strerror or exc}): {fix}, then try "
                             "again; nothing was changed") from exc
        if not stat.S_ISREG(os.fstat(handle).st_mode):  # (a FIFO that a process reads)
            os.close(handle)
            raise self._lock_not_a_file()
        os.set_blocking(handle, True)
        return open(handle, "w")

    def _lock_not_a_file(self) -> StoreError:
        """The error of a lock file that is not a regular file: no lock can be taken on it."""
        return StoreError(f"the lock file {self._lock_path} of {self.store.url} is not a "
                          "regular file (a FIFO or a folder?): move it away (ckpt_nb makes "
                          "it again), then try again; nothing was changed")

    def _wait_for(self, handle: IO[str] | int) -> None:
        """Take a lock (of the lock file or the store's folder). Where another process
        keeps it past a second (a long save, a gc, a kernel stopped at a breakpoint),
        say so and whose it is, once, rather than wait without a word."""
        assert self._lock_path is not None
        deadline = time.monotonic() + LOCK_QUIET_SECONDS
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
            try:
                note = self._lock_path.read_text().partition("\n")[0].split()
            except OSError:  # (a cache cleaner took it)
                note = []
            holder = next(iter(note), "")
            who = "another manager in this process" if holder == str(os.getpid()) else \
                f"process {holder}" if holder.isdigit() else "another process"
            doing = "reading it" if note[2:] == ["reading"] else \
                "saving to it or collecting it"
            waiting = f"waiting for {self.store.url}: {who} is {doing} (lock file " \
                f"{self._lock_path})"
            self._say_lock_wait(waiting)
            told = self._on_lock_wait
            if told is not None:
                with contextlib.suppress(Exception):  # (a teller's failure stops no wait)
                    told(waiting)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX)
            finally:
                if told is not None:
                    with contextlib.suppress(Exception):
                        told(None)
            break

    def _say_lock_wait(self, waiting: str) -> None:
        """Say a wait for another process's lock, on stderr (the CLI's manager says it
        above its progress bar, in the CLI's words)."""
        print(f"ckpt_nb: {waiting}", file=sys.stderr, flush=True)

    def _catalog_mark(self) -> str:
        """The catalog's id, how many checkpoints it ever listed and how many it lists,
        and how many times it changed a pin or note where it did, ``ID@EVER:NOW[:LABELS]``:
        what the lock file notes of the catalog that wrote last."""
        return f"{self.catalog.uid()}@{self._counts()}"

    def _counts(self) -> str:
        """``EVER:NOW[:LABELS]`` (``Catalog.counts``), LABELS left out while none changed,
        as a ckpt_nb before it wrote them."""
        ever, now, labels = self.catalog.counts()
        return f"{ever}:{now}:{labels}" if labels else f"{ever}:{now}"

    def _last_mark(self) -> str:
        """The mark the lock file's last holder left (``_catalog_mark``; "" where none: a
        ckpt_nb before ids, or the file deleted meanwhile)."""
        return _mark_in(self._lock_note())

    def _lock_note(self) -> str:
        """The lock file's text, the last holder's note (``_note_holder``; "" where none)."""
        assert self._lock_path is not None
        try:
            # (not a FIFO, which opened to read waits for a writer: ``_open_lock`` refuses it)
            return self._lock_path.read_text() if self._lock_path.is_file() else ""
        except OSError:  # (deleted meanwhile: no catalog is known to have written last)
            return ""

    def _note_holder(self, handle: IO[str], mark: str, reading: bool = False) -> str:
        """Leave this process's pid and a catalog's mark (``_catalog_mark``) in the lock
        file, held, and "reading" after them where it is held for a read. Written over
        the last note, then cut to its length, so that the file is never empty (a Ctrl-C
        between a truncate and the write left it so, and the next lock take read the
        whole store again); one stopped between the two keeps the rest of the last
        note after the new one's line. Returns the note."""
        note = f"{os.getpid()} {mark}{' reading' if reading else ''}\n".encode()
        try:
            written = 0
            while written < len(note):  # (a write cut short: the next says why, EFBIG)
                written += os.pwrite(handle.fileno(), note[written:], written)
            os.ftruncate(handle.fileno(), len(note))
        except OSError as exc:
            # (not ignored: the mark is what tells another catalog of this store that it
            # missed this one's writes; one that was not told, its gc deleted them)
            error = StoreError(f"cannot write the lock file {self._lock_path} of "
                               f"{self.store.url} ({exc.strerror or exc}): "
                               f"{why_unwritable(exc)}, then try again; nothing was changed")
            error.errno = exc.errno
            raise error from exc
        return note.decode()

    def _reopen_if_removed(self) -> None:
        """Open the catalog again where its file was removed (an object store's cache
        cleaned; a local store's catalog deleted to be rebuilt), or replaced by another
        manager's rebuild or by the store made again at its path: saves would go on into
        the removed file, for no other process to see, and a gc from it deleted the other
        manager's checkpoints; reads listed the removed store's checkpoints. The next
        save's parent is the head's heir in the new catalog (none in a store made again:
        a new root); what the old store's checkpoints left in memory (manifests, the
        digests and bases of the last save's chunks) is of ids and chunk digests that the
        new catalog does not list, and a save writes every chunk it does not list."""
        catalog = getattr(self, "catalog", None)  # (None while it is first opened)
        if catalog is None or not catalog.replaced():
            return
        # (not under another thread's save, delete or gc: it would go on in the new
        # catalog with what it read from the old)
        with self._busy:
            if self.catalog is not catalog or self._closed:  # (another thread did it; closed)
                return
            self._format = check_format(self.store)  # (a store made again: a newer ckpt_nb's?)
            # (the old one is closed with the manager or at the next replacement, not
            # now: another thread may be reading it; one replaced before is read by none,
            # and each held its files, deleted, open: a notebook's set-up cell rerun under
            # an open explorer replaces one at every run)
            for older in self._replaced_catalogs:
                older.close()
            self._replaced_catalogs = [catalog]
            self.catalog = self._open_catalog(str(catalog.path))
            if hasattr(self, "_ranking_taken"):  # (while first opened, __init__ takes it after)
                self._follow_recorded_ranking()  # (the ranking the new catalog records)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ckpt_nb")
        return self._pool

    def _writer(self) -> ThreadPoolExecutor:
        """One thread that appends a save's batches to its pack, in order."""
        if self._pack_writer is None:
            self._pack_writer = ThreadPoolExecutor(1, thread_name_prefix="ckpt_nb-pack")
        return self._pack_writer

    def close(self) -> None:
        """Stop the thread pool, close the catalog, and let go of the memory kept for the
        next save's deltas and the next restore (the latter shared by the process's
        managers: one closing only costs the next restore its warm pages), handing it back
        to the system (``malloc_trim``, where glibc would keep it). A save, delete
        or gc running in another thread is waited for (closed under it, its pools refused
        it work); a load, restore, verify or diff is not (it may fail, its catalog or its
        pool closed under it): close the manager after them."""
        with self._busy:
            self._closed = True
            for pool in (self._pool, self._pack_writer):
                if pool is not None:
                    pool.shutdown()
            self._pool = self._pack_writer = None
            for catalog in (*self._replaced_catalogs, self.catalog):
                catalog.close()
            self._replaced_catalogs = []
            self._delta_bases = {}
            self._manifests = {}
        RESTORE_ARENA.release()
        give_back_freed_memory()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        try:
            found = len(self.catalog.checkpoints())
            count = f"{found} checkpoint{'' if found == 1 else 's'}"
        except StoreError:
            count = "closed"
        return f"CheckpointManager({self.store.url!r}, {count})"

    def add_listener(self, callback: Callable[[str, str], None]) -> None:
        """Call ``callback(event, checkpoint_id)`` after each save, restore, delete, pin
        and unpin (both the event "pin"); retention's deletions are each a "delete",
        after the save whose retention made them. A callback's exception is a warning:
        the operation is done by then, and the other callbacks are still called."""
        self._listeners.append(callback)

    def _notify(self, event: str, checkpoint_id: str) -> None:
        """Call each listener; one that raises is told as a RuntimeWarning, not raised: the
        save (restore, pin, delete) it follows is committed, and raising would make it look
        failed, lose a save's id, and skip the listeners after it."""
        for callback in list(self._listeners):
            try:
                callback(event, checkpoint_id)
            except Exception as exc:
                name = getattr(callback, "__qualname__", None) or repr(callback)
                warn(f"listener {name} failed on the {event!r} of checkpoint {checkpoint_id} "
                     f"({type(exc).__name__}: {exc}); the {event} itself succeeded, and the "
                     "other listeners were called", RuntimeWarning)

    def _notify_retention(self) -> None:
        """Tell the listeners of the checkpoints retention deleted (a "delete" each),
        outside the store's lock: a listener mirroring the store would keep them."""
        dropped, self._retention_dropped = self._retention_dropped, []
        for cid in dropped:
            self._notify("delete", cid)

    # -- save -------------------------------------------------------------------
    def save(
        self,
        model: Any = None,
        optimizer: Any = None,
        epoch: int | None = None,
        *,
        metrics: Mapping[str, float] | None = None,
        scheduler: Any = None,
        batch_idx: int | None = None,
        step: int | None = None,
        extra: Mapping[str, Any] | None = None,
        scaler: Any = None,
        strategy: str | None = None,
        note: str = "",
        rng: bool = True,
        progress: ProgressFn | None = None,
        **statefuls: Any,
    ) -> str:
        """Save a checkpoint and return its id; it exists once this returns.

        Any further Stateful goes by keyword (``ema=ema``). A failed save leaves
        every earlier checkpoint as it was.
        """
        if progress is not None and hasattr(progress, "state_dict"):
            raise CaptureError("progress= takes a callback, progress(done, total), not a "
                            "Stateful: give the object another keyword (e.g. tracker=...)")
        _refuse_mixed_up(model, optimizer, scheduler)
        _refuse_plain_keywords("save", statefuls, _keyword_names(CheckpointManager.save))
        objects = {"model": model, "optimizer": optimizer, "scheduler": scheduler,
                   "scaler": scaler, **statefuls}
        objects = {k: v for k, v in objects.items() if v is not None}
        if not objects and not extra and not metrics:
            raise ValueError("save() was given nothing to save: pass the model and optimizer "
                             "(save(model, optimizer, epoch)), any other object by keyword "
                             "(ema=ema), or values in extra= or metrics=")
        state = self.capture(objects, metrics=metrics, extra=extra, rng=rng)
        self._warn_never_best(state.metrics, batch_idx)
        named = state.skeleton.get("param_names", {})  # (the capture's walk of them)
        for name in set(_optimizers_off_the_modules(objects, named)) - self._told_stray:
            self._told_stray.add(name)  # (once per manager: each save would say it again)
            warn(f"{name} steps parameters that no module saved with it holds: if the "
                 f"training uses it, re-create it on the model's parameters ({name} = "
                 f"torch.optim.SGD(model.parameters(), ...)) after `model = ...` ran again, "
                 "or the model never trains")
        return self.save_state(state, epoch=epoch, batch_idx=batch_idx, step=step,
                               metrics=metrics, strategy=strategy, note=note, progress=progress)

    def _warn_never_best(self, metrics: Mapping[str, float], batch_idx: int | None) -> None:
        """Say, once per manager, that a save logs metrics but not the one this manager
        ranks by: that checkpoint is never "best" (a misspelt ``metric=``). A mid-epoch
        save (``batch_idx`` given) is not told: its metrics are the training's, and the
        validation metric that ranks comes with the epoch's end."""
        if self.metric is None or not self._ranks_its_saves() or not metrics \
                or batch_idx is not None or self.metric in metrics or self._told_never_best:
            return
        self._told_never_best = True
        warn(f"this save logs {', '.join(map(repr, sorted(metrics)))} but not {self.metric!r}, "
             f"the metric {'keep_best' if self.keep_best else 'this manager'} ranks by: "
             f"this checkpoint is never 'best'{_did_you_mean(self.metric, metrics)}",
             RuntimeWarning)

    def _tell_left_out(self, name: str, obj: Any) -> None:
        """Say, once per manager and name, that an object's ``state_dict()`` is empty while
        it holds state that changes as it runs (a torchmetrics Metric's accumulators,
        non-persistent buffers): the checkpoint holds none of it, and a resume starts it
        anew (it restored nothing, silently)."""
        left = capture.state_left_out(obj)
        if not left:
            return
        self._told_left_out.add(name)
        torchmetrics = any(hasattr(m, "_defaults") for m in obj.modules())
        shown = ", ".join(left[:6]) + (f", ... ({len(left)} in all)" if len(left) > 6 else "")
        warn(f"{name} ({type(obj).__name__}): its state_dict() is empty, so this save holds "
             f"none of its state ({shown}" + (
                 ": torchmetrics keeps a metric's states out of state_dict(); "
                 f"{name}.persistent(True) before training puts them in" if torchmetrics else
                 ": non-persistent buffers; if training changes them, register them with "
                 "persistent=True to save them")
             + "), and a restore or resume leaves it as it is", RuntimeWarning)

    def capture(self, objects: Mapping[str, Any], *, metrics: Mapping[str, float] | None = None,
                extra: Mapping[str, Any] | None = None,
                rng: bool | Mapping[str, Any] = True,
                copy_tensors: bool | SnapshotBuffers = False) -> FlatState:
        """Take the state of live objects, ready for ``save_state``.

        With ``copy_tensors`` the state owns its bytes, so training may go on while
        a background thread saves it. ``rng`` may be an RNG state taken earlier.
        """
        if not isinstance(rng, Mapping):
            check_flag("rng", rng)
        if not isinstance(copy_tensors, capture.SnapshotBuffers):
            check_flag("copy_tensors", copy_tensors)
        clash = RESERVED & set(objects)
        if clash:
            raise ValueError(f"{sorted(clash)} name checkpoint fields, restore()'s options or "
                             "(ckpt_nb) an exported file's, not objects: rename the keyword "
                             "(e.g. ema=...)")
        if extra is not None and not isinstance(extra, Mapping):
            raise CaptureError(f"extra must be a dict of values by name (extra={{'losses': "
                               f"losses}}), not a {type(extra).__name__}")
        # (a torch.compile / DataParallel wrapper by the module it runs: its keys then
        # load into the module with the wrapper or without; a generator by its state)
        objects = {name: capture.as_stateful(obj) for name, obj in objects.items()}
        tree: dict[str, Any] = {}
        kinds: dict[str, str] = {}
        for name, obj in objects.items():
            if not isinstance(obj, capture.Stateful):
                raise TypeError(f"{name}: {type(obj).__name__} has no state_dict() / "
                                "load_state_dict(); pass it in extra= if it is plain data")
        measured = {key: as_metric(key, value) for key, value in _metric_items(metrics)}
        with collector_paused():
            for name, obj in objects.items():
                try:
                    tree[name] = obj.state_dict()
                except Exception as exc:  # noqa: BLE001 - whatever the object's code raises
                    raise CaptureError(
                        f"{name} ({type(obj).__name__}): its state_dict() failed "
                        f"({type(exc).__name__}: {exc}); nothing was saved" + (
                            ". A DataLoader's order is saved by ckpt_nb.batches() in a "
                            "%%ckpt_auto cell or an auto() block, not by save(): leave it out"
                            if isinstance(obj, torch.utils.data.DataLoader) else "")) from exc
                kinds[name] = f"{type(obj).__module__}.{type(obj).__qualname__}"
                if not tree[name] and name not in self._told_left_out:
                    self._tell_left_out(name, obj)
                if name not in self._told_left_out and (merged := capture.merged_adapters(obj)):
                    self._told_left_out.add(name)
                    warn(f"{name}: saved with the adapters of {len(merged)} layers "
                         + capture.MERGED_WORDS, RuntimeWarning)
            rng_state = dict(rng) if isinstance(rng, Mapping) else \
                (capture.RNGState().state_dict() if rng else None)
            flat = capture.flatten(
                {"objects": tree, "extra": dict(extra or {}), "rng": rng_state},
                copy_tensors=copy_tensors, trained=capture.trained_storages(objects.values()))
        flat.skeleton["types"] = kinds
        # Each optimizer's parameters by name: a restore puts its state back by them where
        # the live optimizer holds them in another order (groups built from a set).
        modules = {name: obj for name, obj in objects.items()
                   if isinstance(obj, torch.nn.Module)}
        optimizers = {name: obj for name, obj in objects.items()
                      if isinstance(obj, torch.optim.Optimizer)}
        if modules and optimizers:
            flat.skeleton["param_names"] = capture.parameter_names(optimizers, modules)
        flat.metrics = measured
        return flat

    def save_state(
        self,
        state: FlatState,
        *,
        epoch: int | None = None,
        batch_idx: int | None = None,
        step: int | None = None,
        metrics: Mapping[str, float] | None = None,
        strategy: str | None = None,
        note: str = "",
        parent: str | None | types.EllipsisType = ...,
        progress: ProgressFn | None = None,
    ) -> str:
        """Write captured state as a checkpoint (the second half of ``save``); its metrics
        are ``capture``'s unless ``metrics`` are given here."""
        strategy = strategy or self.strategy
        _check_choice("strategy", strategy, STRATEGIES)
        metrics = {k: as_metric(k, v)
                   for k, v in _metric_items(state.metrics if metrics is None else metrics)}
        if not isinstance(note, str):
            raise TypeError(f"note must be a string, not {note!r}")
        with self._saving(), self._exclusive(), collector_paused():
            self._catch_up()
            bound = self._bound_still_known()
            self._bytes_bound = None  # (unknown again until this save is through)
            parent_id = self.head if parent is ... else parent
            parent_row = self.catalog.get(parent_id) if parent_id else None
            if parent_id and parent_row is None:  # deleted by another manager: its heir
                parent_id = self.catalog.heir_of(parent_id)
                parent_row = self.catalog.get(parent_id) if parent_id else None
            strategy, base_id, chain = self._plan(strategy, parent_row)
            row = CheckpointRow(
                id=_new_id(), parent=parent_id, branch=self._branch_for(parent_row),
                created_at=time.time(), step=_opt_int("step", step),
                epoch=_opt_int("epoch", epoch), batch_idx=_opt_int("batch_idx", batch_idx),
                metrics=metrics, strategy=strategy,
                full_base=None, chain=chain, logical_bytes=state.logical_bytes,
                stored_bytes=0, pinned=False, note=note,
            )
            row.full_base = row.id if strategy == "full" else parent_row.full_base  # type: ignore[union-attr]
            base_chunks = self._base_chunks(base_id)
            self._stamp_format()
            self._record_ranking()
            manifest: dict[str, Any] = {}
            blob = b""

            def write_manifest(chunks: dict[str, Any]) -> None:
                """Write the manifest (while the pipeline writes its last batches)."""
                nonlocal blob
                manifest.update(chunks, format=state.format, id=row.id, parent=parent_id,
                                branch=row.branch, created_at=row.created_at, step=row.step,
                                epoch=row.epoch, batch_idx=row.batch_idx, metrics=metrics,
                                strategy=strategy, chain=chain, full_base=row.full_base,
                                note=note, state=state.skeleton)
                if self._ranks_its_saves():  # (what a rebuilt catalog's record is read from)
                    manifest["ranked_by"] = [self.metric, self.mode]
                blob = encode_manifest(manifest)
                self.store.put(manifest_key(row.id), blob)

            new_rows: list[ChunkRow] = []
            try:
                new_rows, refs = SavePipeline(self, state, strategy, base_chunks,
                                              progress).run(write_manifest)
                row.manifest_digest = codec.digest(blob)
                row.stored_bytes = sum(r.length for r in new_rows) + len(blob)
                self.catalog.commit_checkpoint(row, new_rows, refs)
            except BaseException as exc:
                self._whole_packs = {}  # (looked at again: the store may have failed)
                self._discard_uncommitted(row.id, blob, {r.pack for r in new_rows})
                if isinstance(exc, MemoryError) and str(exc):  # (ckpt_nb's own, worded)
                    raise MemoryError("saving a checkpoint failed, so it was not saved (the "
                                      f"checkpoints saved before are intact): {exc}") from exc
                if isinstance(exc, RuntimeError) and str(exc) == _NO_THREAD:
                    raise RuntimeError(
                        "saving a checkpoint failed, so it was not saved (the checkpoints "
                        "saved before are intact): this process cannot start a thread "
                        f"({_NO_THREAD}; the save writes on threads of its own): is a limit "
                        "on its threads or memory reached (a container's pids limit, ulimit "
                        "-u or -v)? end other processes or raise the limit, then save "
                        "again") from exc
                raise
            self._check_still_there(row.id, {r.pack for r in new_rows})
            self._keep_manifest(row.id, manifest)
            if parent is ...:
                self.head = row.id
            if bound is not None:
                packs: dict[str, list[ChunkRow]] = {}
                for new in new_rows:
                    packs.setdefault(new.pack, []).append(new)
                self._bytes_bound = bound + len(blob) + sum(map(pack_size, packs.values()))
            try:
                self._apply_retention(protect={row.id})
                self._bound_generation = self.catalog.generation()
            except (OSError, MemoryError) as exc:  # (StoreError; a pack not mapped, too)
                # the checkpoint is committed all the same: its id is returned, with a warning
                self._bytes_bound = None
                self._collection_failed = True  # (the next one collects the whole store)
                warn(f"checkpoint {row.id} was saved, but retention failed ({exc}); "
                     "it runs again at the next save, which frees what this one left where "
                     "it deletes a checkpoint; or call gc()", RuntimeWarning)
        self._notify("save", row.id)
        self._notify_retention()
        return row.id

    def _discard_uncommitted(self, cid: str, manifest: bytes, packs: AbstractSet[str]) -> None:
        """Delete what a save whose catalog commit failed wrote (its manifest, where
        written, and its new pack, whole: a full disk at the commit left it there, and a
        retry on the same disk failed for want of its room). Nothing refers to them: the
        pack is this save's own (a chunk the store had went in no pack) and no catalog
        ever named its chunks; a save holds the store's lock. Not where the catalog does
        list the checkpoint (interrupted after the commit) or cannot say: gc removes them."""
        if not (manifest or packs):
            return
        try:
            if self.catalog.get(cid) is not None:
                return
        except Exception:  # noqa: BLE001 - unknown: left for gc (a catch-up names it)
            self._failed_saves.add(cid)
            return
        for key in [manifest_key(cid)] * bool(manifest) + sorted(packs):
            try:
                self.store.delete(key)
            except Exception:  # noqa: BLE001 - left for gc (a catch-up names it)
                self._failed_saves.add(cid)
        if manifest and cid in self._failed_saves:
            with contextlib.suppress(Exception):  # (a catalog failing too: a catch-up names it)
                self.catalog.note_failed_save(cid)
                self._noted_now = {cid}
                self._record_failed_saves()

    def _record_failed_saves(self) -> None:
        """Record in the store, as deletions, the failed saves whose manifest could not be
        deleted (``Catalog.failed_saves``): an upload whose reply was lost as the server
        went away may have landed whole, and a catalog read again from the store (here,
        or on another machine) listed the save, as "latest", though it had raised. A
        deletion record keeps every rebuild from listing it, and gc() deletes its files
        (then the record). Where the store does not answer, the catalog keeps them, and
        leaves them out of its own rebuilds, until a later call records them."""
        if self.catalog.read_only or not (failed := self.catalog.failed_saves()):
            return
        with contextlib.suppress(OSError):  # (StoreError too: told at the next call)
            self.store.put(new_deletion_key(), json.dumps({"ids": failed}).encode())
            self.catalog.forget_failed_saves(failed)

    def _check_still_there(self, cid: str, packs: AbstractSet[str]) -> None:
        """Refuse a save whose manifest or new packs left the store before its commit, in
        a store other machines write with no lock across them: a gc there may have taken
        them for a killed save's leftovers (one HEAD each; an id returned is a checkpoint
        that exists). The catalog then forgets it again. Where the store stops answering
        midway, what was already found gone still refuses the save."""
        if self.store.locked_everywhere:
            return
        gone: list[str] = []
        for key in (manifest_key(cid), *sorted(packs)):
            try:
                if not self.store.has(key):
                    gone.append(key)
            except StoreError as exc:
                if gone:  # (known gone: refused below, whatever the rest would say)
                    break
                # committed, its files uploaded: it stands, unchecked
                warn(f"checkpoint {cid} is saved, but the store could not be asked whether "
                     f"its files are still there ({exc}): another machine's gc may have taken "
                     "them meanwhile; once the store answers, verify() (`ckpt-nb verify "
                     f"{self.store.url}`) checks it", RuntimeWarning)
                return
        if gone:
            self.catalog.delete_checkpoints([cid])
            raise StoreError(
                f"checkpoint {cid} was written, but {', '.join(gone)} left the store before "
                "its commit (another machine's gc may have taken them for a killed save's "
                "leftovers): it is not saved; save again")

    def _plan(self, strategy: str, parent: CheckpointRow | None) -> tuple[str, str | None, int]:
        """The strategy this save really uses, its delta base, and its chain length."""
        if strategy == "full" or parent is None:
            return "full", None, 0
        chain = parent.chain + 1
        if self.full_every is not None and chain >= self.full_every:
            return "full", None, 0
        base = parent.id if strategy == "incremental" else parent.full_base
        if base is None or self.catalog.get(base) is None:
            return "full", None, 0
        return strategy, base, chain

    def _branch_for(self, parent: CheckpointRow | None) -> str:
        tips = self.catalog.branch_tips()
        if parent is None:
            if not tips:
                return "main"
        elif tips.get(parent.branch) == parent.id:
            return parent.branch
        n = len(tips)
        while f"branch-{n}" in tips:
            n += 1
        return f"branch-{n}"

    def _base_chunks(self, base_id: str | None) -> dict[tuple[str, int], tuple[str, int]]:
        """(storage name, chunk index) -> (digest, raw length) in the delta base."""
        if base_id is None:
            return {}
        manifest = self._manifest(base_id)
        found = {}
        for storage in manifest["storages"]:
            for i, (digest, raw_len) in enumerate(storage["chunks"]):
                found[(storage["name"], i)] = (digest, raw_len)
        return found

    # -- reading chunks -----------------------------------------------------------
    def _read_scratch(self, row: ChunkRow) -> np.ndarray:
        """A chunk's blob, read into this thread's reused buffer (valid until its next use)."""
        blob = scratch("blob", row.length)
        try:
            got = self.store.read_into(row.pack, row.offset, memoryview(blob))
        except FileNotFoundError as exc:
            raise CorruptCheckpointError(f"pack {row.pack} is missing from the store") from exc
        if got != row.length:
            raise CorruptCheckpointError(f"pack {row.pack} ends inside chunk {row.digest[:12]}")
        return blob

    def _row(self, digest: str, rows: Mapping[str, ChunkRow] | None) -> ChunkRow:
        """A chunk's catalog row, from ``rows`` when it is there."""
        row = (rows or {}).get(digest) or self.catalog.chunks([digest]).get(digest)
        if row is None:
            raise CorruptCheckpointError(f"chunk {digest[:12]} is not in the catalog")
        return _checked_row(row)

    def _read_prefix(self, digest: str, nbytes: int, rows: Mapping[str, ChunkRow],
                     views: Mapping[str, memoryview] | None = None) -> np.ndarray:
        """The first ``nbytes`` of a chunk's raw bytes, unchecked: for choosing an encoding."""
        prefix = None
        for row in reversed(self._chain(digest, rows)):  # (the deepest base first)
            try:
                part = codec.decode_prefix(self._blob(row, views), nbytes)
            except ValueError as exc:  # (CorruptCheckpointError too)
                raise CorruptCheckpointError(f"chunk {row.digest[:12]} in {row.pack} does "
                                             f"not decode: {exc}") from exc
            if prefix is not None:
                np.bitwise_xor(part, prefix[: len(part)], out=part)
            prefix = part
        assert prefix is not None
        return prefix

    def _chain(self, digest: str, rows: Mapping[str, ChunkRow] | None,
               above: AbstractSet[str] = frozenset()) -> list[ChunkRow]:
        """A chunk's row, then those of its delta bases, deepest last: walked, not
        recursed into, since a damaged catalog's chain may be thousands long."""
        chain, seen = [], set(above)
        at: str | None = digest
        while at is not None:
            row = self._row(at, rows)
            _check_chain(row, seen)
            seen.add(row.digest)
            chain.append(row)
            at = row.base
        return chain

    def _pack_views(self, rows: Mapping[str, ChunkRow]) -> dict[str, memoryview]:
        """Zero-copy views of the packs these chunks lie in, where the store maps them."""
        views = {}
        for pack in {r.pack for r in rows.values()}:
            try:
                view = self.store.view(pack)
            except FileNotFoundError:
                continue  # the read of a chunk in it says so
            if view is not None:
                views[pack] = view
        return views

    def _in_whole_packs(self, rows: Mapping[str, ChunkRow]) -> set[str]:
        """Those of these chunks (``rows``: with their delta bases') that lie, with their
        bases, in packs the store holds and long enough to hold them: a save refers to, or
        takes a delta against, no other, and writes such a chunk again (it has its bytes).
        Damage from outside ckpt_nb (a pack deleted by hand, a copy cut short, a disk that
        lost writes) is seen in the pack's size alone: a flipped bit is verify()'s to find."""
        damaged = self._damaged_packs(rows.values())
        whole: dict[str, bool] = {}
        for digest in rows:
            chain, at = [], digest
            while at is not None and at not in whole:
                row = rows.get(at)
                if row is None or row.digest in chain:  # (gone, or a loop: read it says so)
                    break
                chain.append(at)
                at = row.base
            below = whole.get(at, True) if at is not None else True
            for link in reversed(chain):
                below = below and rows[link].pack not in damaged
                whole[link] = below
        return {digest for digest, ok in whole.items() if ok}

    def _damaged_packs(self, rows: Iterable[ChunkRow]) -> set[str]:
        """The packs of these chunks that the store lacks or that end before a chunk does:
        recorded as damaged (gc() keeps them for what is left in them), and said once."""
        ends: dict[str, int] = {}
        for row in rows:
            ends[row.pack] = max(ends.get(row.pack, 0), row.offset + row.length)
        damaged = set()
        for pack, end in ends.items():
            if self._whole_packs.get(pack, -1) >= end:
                continue
            try:
                size = self.store.size(pack)
            except FileNotFoundError:
                why = "is missing from the store"
            else:
                if size >= end:
                    if local_root(self.store) is None:
                        self._whole_packs[pack] = size
                    continue
                why = _cut_short(size, end)
            damaged.add(pack)
            self._pack_found_damaged(pack, why, "this save stored those chunks again and is "
                                                "whole")
        return damaged

    def _pack_found_damaged(self, pack: str, why: str, done: str) -> None:
        """Record a pack found missing or cut short as damaged, and say so once: what it
        means for the checkpoints saved before, and ``done``, what was done about it."""
        self.catalog.note_damaged(pack, why)
        if pack not in self._told_damaged_packs:
            self._told_damaged_packs.add(pack)
            warn(f"pack {pack} of the store at {self.store.url} {why} (changed outside "
                 "ckpt_nb: deleted, a copy cut short, a disk error): the checkpoints saved "
                 f"before whose chunks lie in it may not restore (verify() names them); {done}",
                 RuntimeWarning)

    def _deletion_pending(self) -> bool:
        """Whether a deletion cut short (killed after its record, before its catalog's
        commit) waits in the store: a deletion then collects the whole store, as gc()
        does, which completes it. One listing, of a folder mostly empty; a record gc
        keeps (one that does not read, one a pin withdrew) is no deletion waiting."""
        if not any(is_deletion_key(key) for key in self.store.list("deleted")):
            return False
        # (only one gc completes and then deletes: readable, not withdrawn by a pin, and
        # naming no damaged manifest, which gc keeps. One whose manifests are gone is
        # still waiting: killed before its record went, its chunks are not yet freed)
        pins = {row.id for row in self.catalog.checkpoints() if row.pinned}
        records, _ = deletion_records(self.store, pins.__contains__)
        damaged = self.catalog.damaged()
        return any(not any(manifest_key(cid) in damaged for cid in ids)
                   for ids in records.values())

    @contextlib.contextmanager
    def _prefetching(self, rows: Mapping[str, ChunkRow], digests: Iterable[str]
                     ) -> Iterator[None]:
        """Tell the store which chunks (and the delta bases they need) are read in the
        block, and that none are once it ends: an object store's fetched bytes a failed
        or interrupted read left are let go then, not held until the next read."""
        packs = self._prefetch(rows, digests)
        try:
            yield
        finally:
            for pack in packs:
                self.store.prefetch(pack, [])

    def _prefetch(self, rows: Mapping[str, ChunkRow], digests: Iterable[str]) -> list[str]:
        """Tell the store which chunks (and the delta bases they need) are read next;
        the packs they are in."""
        ranges: dict[str, list[tuple[int, int]]] = {}
        wanted, seen = list(digests), set()
        while wanted:
            digest = wanted.pop()
            row = rows.get(digest) if digest not in seen else None
            seen.add(digest)
            if row is not None:
                ranges.setdefault(row.pack, []).append((row.offset, row.length))
                if row.base:
                    wanted.append(row.base)
        for pack, spans in ranges.items():
            self.store.prefetch(pack, spans)
        return list(ranges)

    def _blob(self, row: ChunkRow,
              views: Mapping[str, memoryview] | None) -> memoryview | np.ndarray:
        """A chunk's blob: a slice of its pack's view, else read into this thread's buffer."""
        view = views.get(row.pack) if views else None
        if view is None:
            return self._read_scratch(row)
        if row.offset + row.length > len(view):
            raise CorruptCheckpointError(f"pack {row.pack} ends inside chunk {row.digest[:12]}")
        return view[row.offset : row.offset + row.length]

    def _read_raw(self, digest: str, rows: Mapping[str, ChunkRow] | None = None,
                  views: Mapping[str, memoryview] | None = None,
                  above: AbstractSet[str] = frozenset()) -> np.ndarray:
        """A chunk's raw bytes, checked against its digest (delta bases resolved);
        ``above``: the chunks stacked on it, being decoded."""
        out = None
        for row in reversed(self._chain(digest, rows, above)):  # (the deepest base first)
            base, out = out, _raw_buffer(row)
            blob = self._blob(row, views)  # (after the base, which may reuse its buffer)
            self._check_decoded(row, out, codec.decode_many([(blob, out, base, row.digest)])[0])
        assert out is not None
        return out

    def _decode_chunk(self, row: ChunkRow, out: np.ndarray,
                      rows: Mapping[str, ChunkRow] | None = None,
                      views: Mapping[str, memoryview] | None = None) -> memoryview | np.ndarray:
        """Decode a chunk into ``out``; returns its blob (in this thread's reused buffer
        where its pack is not mapped: valid until the next read)."""
        _check_chain(row, frozenset())
        base = self._read_raw(row.base, rows, views, frozenset({row.digest})) if row.base \
            else None
        blob = self._blob(row, views)  # after the base, which may reuse the same buffer
        self._check_decoded(row, out, codec.decode_many([(blob, out, base, row.digest)])[0])
        return blob

    def _decode_chunks(self, jobs: Sequence[tuple[ChunkRow, np.ndarray]],
                       rows: Mapping[str, ChunkRow], views: Mapping[str, memoryview]) -> None:
        """Decode chunks into their arrays: those in mapped packs in one codec call
        (one release of the GIL), the others, which are read first, one by one."""
        mapped, blobs = [], []
        for row, out in jobs:
            if row.pack not in views:
                self._decode_chunk(row, out, rows, views)
                continue
            _check_chain(row, frozenset())
            base = self._read_raw(row.base, rows, views, frozenset({row.digest})) \
                if row.base else None
            mapped.append((row, out))
            blobs.append((self._blob(row, views), out, base, row.digest))
        for (row, out), outcome in zip(mapped, codec.decode_many(blobs)):
            self._check_decoded(row, out, outcome)

    @staticmethod
    def _check_decoded(row: ChunkRow, out: np.ndarray,
                       outcome: bool | CorruptCheckpointError) -> None:
        """Raise for a chunk that failed to decode, naming it; check a CKB1 one's digest."""
        if isinstance(outcome, CorruptCheckpointError):  # "chunk fails its checksum", ...
            detail = str(outcome).removeprefix("chunk ")
            raise CorruptCheckpointError(
                f"chunk {row.digest[:12]} in {row.pack} {detail}") from outcome
        if not outcome and codec.digest(out) != row.digest:
            raise CorruptCheckpointError(
                f"chunk {row.digest[:12]} in {row.pack} fails its checksum")

    def _rows_with_bases(self, digests: Iterable[str],
                         known: dict[str, ChunkRow] | None = None) -> dict[str, ChunkRow]:
        """Catalog rows of these chunks and of the delta bases they need, in few queries;
        absent ones are left out. ``known``: rows read before (a scan of many
        checkpoints, whose chains share their bases), taken as they are and added to."""
        wanted, rows = set(digests), {}
        known = {} if known is None else known
        with self.catalog.snapshot():
            while wanted:
                cached = {d: known[d] for d in wanted if d in known}
                found = self.catalog.chunks(wanted - cached.keys()) if len(cached) < len(
                    wanted) else {}
                for row in found.values():
                    _checked_row(row)
                known.update(found)
                rows.update(cached)
                rows.update(found)
                wanted = {r.base for r in (*cached.values(), *found.values())
                          if r.base and r.base not in rows}
        return rows

    def _chunk_rows(self, manifest: Mapping[str, Any],
                    known: dict[str, ChunkRow] | None = None) -> dict[str, ChunkRow]:
        """The rows of every chunk a checkpoint needs, delta bases included."""
        wanted = {d for s in manifest["storages"] for d, _ in s["chunks"]}
        rows = self._rows_with_bases(wanted, known)
        missing = (wanted | {r.base for r in rows.values() if r.base}) - rows.keys()
        if missing:
            raise CorruptCheckpointError(
                f"{len(missing)} chunks (e.g. {sorted(missing)[0][:12]}) are missing")
        return rows

    def _manifest(self, checkpoint_id: str, *, keep: bool = True) -> dict[str, Any]:
        """A checkpoint's manifest, checked against its digest; kept for the next call
        unless ``keep`` is False (a scan of many)."""
        if not keep and checkpoint_id not in self._manifests:
            manifest = self._manifest(checkpoint_id)
            del self._manifests[checkpoint_id]
            return manifest
        if checkpoint_id not in self._manifests:
            row = self.catalog.get(checkpoint_id)
            if row is None:
                raise CheckpointNotFoundError(f"no checkpoint {checkpoint_id!r}")
            try:
                blob = read_manifest(self.store, manifest_key(checkpoint_id), checkpoint_id)
            except FileNotFoundError as exc:
                raise CorruptCheckpointError(
                    f"checkpoint {checkpoint_id}: its manifest is missing", checkpoint_id) from exc
            if row.manifest_digest and codec.digest(blob) != row.manifest_digest:
                raise CorruptCheckpointError(
                    f"checkpoint {checkpoint_id}: its manifest fails its checksum", checkpoint_id)
            self._keep_manifest(checkpoint_id, decode_manifest(blob, checkpoint_id))
        else:  # (the most recently used are kept)
            self._manifests[checkpoint_id] = self._manifests.pop(checkpoint_id)
        return self._manifests[checkpoint_id]

    def _keep_manifest(self, checkpoint_id: str, manifest: dict[str, Any]) -> None:
        """Keep a decoded manifest for the next read (at most ``MANIFESTS_KEPT``: one of
        a model with thousands of tensors takes megabytes in memory)."""
        self._manifests[checkpoint_id] = manifest
        while len(self._manifests) > MANIFESTS_KEPT:
            del self._manifests[next(iter(self._manifests))]

    def _saved_extra(self, checkpoint_id: str) -> Any:
        """A checkpoint's ``extra`` as its manifest holds it, without reading a chunk:
        JSON values as they are, tensors and pickles as their records. (Not kept: the
        notebook layer scans a store's manifests with it.)"""
        return self._manifest(checkpoint_id, keep=False)["state"]["extra"]

    def _decode_storages(self, checkpoint_id: str, manifest: Mapping[str, Any],
                         progress: ProgressFn | None = None,
                         groups: list[int] | None = None) -> list[torch.Tensor]:
        """Every storage of a checkpoint, decoded into fresh memory and verified;
        ``groups``: the allocation each is decoded into (``_storage_groups``)."""
        return self._reading_again_if_moved(
            manifest, lambda rows: self._decode_rows(checkpoint_id, manifest, rows, progress,
                                                     groups))

    def _reading_again_if_moved(self, manifest: Mapping[str, Any],
                                read: Callable[[dict[str, ChunkRow]], T],
                                known: dict[str, ChunkRow] | None = None) -> T:
        """``read(rows)`` of a checkpoint's chunks; read again where it failed because
        a compaction (a gc, in this process or another) moved the chunks meanwhile.
        ``known``: rows read before (``_rows_with_bases``), forgotten on such a move."""
        rows = self._chunk_rows(manifest, known)
        for _ in range(3):
            try:
                return read(rows)
            except CorruptCheckpointError:
                if known:
                    known.clear()
                moved = self._chunk_rows(manifest)
                if moved == rows:
                    raise
                rows = moved
        # Overtaken each time (a save under a byte budget compacts after each): read
        # under the store's lock, where no compaction runs.
        with self._exclusive():
            return read(self._chunk_rows(manifest))

    def _decode_rows(self, checkpoint_id: str, manifest: Mapping[str, Any],
                     rows: dict[str, ChunkRow], progress: ProgressFn | None,
                     groups: list[int] | None) -> list[torch.Tensor]:
        for storage in manifest["storages"]:  # (before memory is taken for them)
            for digest, raw_len in storage["chunks"]:
                if rows[digest].raw_len != raw_len:
                    raise CorruptCheckpointError(
                        f"checkpoint {checkpoint_id}: chunk {digest[:12]} holds "
                        f"{rows[digest].raw_len} bytes, its manifest says {raw_len}",
                        checkpoint_id)
            if sum(raw_len for _, raw_len in storage["chunks"]) != storage["nbytes"]:
                raise CorruptCheckpointError(
                    f"checkpoint {checkpoint_id}: storage {storage['name']} chunks do not "
                    "add up to its size", checkpoint_id)
        sizes = [s["nbytes"] for s in manifest["storages"]]
        try:
            buffers = _arena(sizes, groups)
        except MemoryError:  # (numpy's message names an array of no name)
            doing = "export" if _EXPORT_READING.get() else "restore or load"
            raise MemoryError(f"checkpoint {checkpoint_id} holds {sum(sizes) / 2**30:.1f} GiB "
                              "of tensors, more memory than this process could take: free "
                              f"some, or {doing} it on a machine with more") from None
        jobs = []
        for storage, buf in zip(manifest["storages"], buffers):
            view, pos = buf.numpy(), 0
            for digest, raw_len in storage["chunks"]:
                jobs.append((rows[digest], view[pos : pos + raw_len]))
                pos += raw_len
        views = self._pack_views(rows)
        batches = in_batches(jobs, sum(len(out) for _, out in jobs) // (8 * self.threads),
                             lambda job: len(job[1]))
        try:
            with self._prefetching(rows, (row.digest for row, _ in jobs)):
                share_work(self._executor(), self.threads - 1, batches,
                           lambda batch: self._decode_chunks(batch, rows, views),
                           None if progress is None else lambda done: progress(done, len(jobs)),
                           weight=len)
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"checkpoint {checkpoint_id}: {exc}",
                                         checkpoint_id) from exc
        return buffers

    # -- resolving ids ---------------------------------------------------------------
    def resolve(self, which: str = "latest") -> str:
        """The id meant by "latest", "best", "-N" (N back from latest) or an id prefix (of 4
        characters at least: a number is a step, not an id; one that is a step saved is
        refused, naming that step's checkpoints, even where an id begins with it).

        Only "best" reads every checkpoint's row: the others cost the same in a store
        of thousands. A store written from elsewhere (an object store's) is read again
        first, where it has moved on."""
        self._catch_up()
        return self._resolve(which)

    def _best_by(self, metric: str, mode: str) -> str:
        """``resolve("best")`` ranked by ``metric`` and ``mode`` for this call alone (a
        rollback's ``on=``): the manager's own ranking, which its saves record and its
        retention keeps by, is never changed, so a save on another thread meanwhile is
        ranked by its own."""
        self._catch_up()
        return self._resolve("best", (metric, mode))

    def _resolve(self, which: str, ranking: tuple[str, str] | None = None) -> str:
        """``resolve`` against the catalog as it stands (the caller caught up); "best" by
        ``ranking`` where one is given, else by the manager's own."""
        _check_which(which)
        back = 0 if which == "latest" else \
            int(which[1:]) if which.startswith("-") and which[1:].isdigit() else None
        if back is not None:
            ids = self.catalog.newest_ids(back + 1)
            if back < len(ids):
                return ids[back]
            if ids:
                raise CheckpointNotFoundError(too_far_back(which, len(ids)))
        elif which == "best":
            rows = self.catalog.checkpoints()
            metric, mode = ranking or (self.metric, self.mode)
            best = self._best(rows, 1, (metric, mode) if metric is not None else None)
            # (the record may be another run's in this store: said once where it is used,
            # where that may be so)
            recorded = "" if ranking is not None or self._ranking_taken != (metric, mode) \
                else f"an earlier save recorded in this store: {RANK_BY_ANOTHER}"
            if best and recorded and not self._ranking_said and \
                    self._others_may_rank(rows, str(metric)):
                self._ranking_said = True
                warn(f"'best' is by {metric} ({mode}), the ranking {recorded}")
            if best:
                return best[0]
            if rows and metric is None:
                raise CheckpointNotFoundError(
                    "'best' needs a metric to rank by, and no save to this store recorded "
                    "one: CheckpointManager(..., "
                    "metric='val_loss'), or in a notebook %%ckpt_auto --on val_loss:min")
            recorded = recorded and f", the metric {recorded}"
            if any(metric in r.metrics for r in rows):  # (a diverged run's, all)
                raise CheckpointNotFoundError(f"no checkpoint has a finite {metric!r} "
                                              f"(NaN and ±inf are never best){recorded}")
            if rows:
                logged = metrics_logged(name for r in rows for name in r.metrics)
                raise CheckpointNotFoundError(f"no checkpoint has the metric "
                                              f"{metric!r}{recorded}; {logged}")
        elif self.catalog.get(which) is not None:
            return which
        elif len(which) < SHORTEST_PREFIX:
            raise CheckpointNotFoundError(self._too_short(which))
        elif not self.catalog.ids_with_prefix(which):
            for cid, why in _damaged_checkpoints(self.catalog).items():
                if cid.startswith(which) and is_newer(why):
                    raise StoreFormatError(f"checkpoint {cid} was {why}")
                if cid.startswith(which):
                    raise CorruptCheckpointError(
                        f"checkpoint {cid} is damaged ({why}): {_DAMAGED_KEPT}", cid)
        if not self.catalog.newest_ids(1):
            raise CheckpointNotFoundError(self._no_checkpoints_yet())
        matches = self.catalog.ids_with_prefix(which)
        at_step = self._ids_at_step(which)
        if matches and at_step:  # (a step meant, as like as not)
            raise CheckpointNotFoundError(
                f"{which!r} is ambiguous: {' and '.join(sorted(matches)[:2])}"
                f"{' and more' if len(matches) > 2 else ''} start"
                f"{'s' if len(matches) == 1 else ''} with it, and a step is not an id: "
                f"{_saved_at(which, at_step)}: give the id of the checkpoint meant")
        if len(matches) == 1:
            return matches[0]
        if matches:
            more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
            raise CheckpointNotFoundError(
                f"{which!r} is ambiguous: {len(matches)} checkpoints start with it "
                f"({', '.join(sorted(matches)[:5])}{more}): give more of the id")
        if self.catalog.was_deleted(which):
            raise CheckpointNotFoundError(
                f"checkpoint {which} was deleted {DELETED_BY}: use an id from list() "
                "(ckpt-nb ls), 'latest', 'best' or '-N'")
        raise CheckpointNotFoundError(
            f"no checkpoint {which!r} in {self.store.url}: use an id from list() (ckpt-nb ls), "
            "'latest', 'best' or '-N'"
            + (f"; a step is not an id: {_saved_at(which, at_step)}" if at_step else ""))

    def _too_short(self, which: str) -> str:
        """The refusal of an id prefix too short to name a checkpoint; a number is named
        as a step, with the checkpoints saved at it."""
        said = (f"{which!r} is too short for an id prefix: give at least {SHORTEST_PREFIX} "
                "characters of an id from list() (ckpt-nb ls), or 'latest', 'best' or '-N'")
        at_step = self._ids_at_step(which)
        if at_step is None:
            return said
        if not at_step:
            return f"{said}; a step is not an id, and no checkpoint is at step {which}"
        return f"{said}; a step is not an id: {_saved_at(which, at_step)}"

    def _ids_at_step(self, which: str) -> list[str] | None:
        """The checkpoints saved at the step ``which`` names, newest first; None where it
        is no number, or one no step is written as ("0764", an id's prefix: a leading
        zero). Steps run to thousands, whose digits begin some ids: restore("4000") took
        the checkpoint whose id began so."""
        if not which.isdecimal() or len(which) > 18 or str(int(which)) != which:
            return None  # (18 digits: SQLite's integers are 64 bits)
        return self.catalog.ids_at_step(int(which))

    def _no_checkpoints_yet(self) -> str:
        """The refusal of a read from an empty store, naming a folder that this manager
        made as it opened (nothing was there: a misspelt path, mostly)."""
        made = getattr(self.store, "root", None) if getattr(self.store, "made_here", False) \
            else None
        return (f"the store at {self.store.url} has no checkpoints yet"
                + (f": there was no folder {made} until this manager made it (a misspelt "
                   "path?)" if made is not None else ""))

    def _recorded_mode_of(self, metric: str) -> str | None:
        """The mode the store's saves recorded for ``metric``, if they ranked by it."""
        recorded = self.catalog.ranking()
        return recorded[1] if recorded is not None and recorded[0] == metric else None

    def _recorded_mode(self, metric: str) -> str:
        """The mode the store's saves recorded for ``metric``, a name that says neither
        way is better (``auroc``, ``top1``), as ``ckpt-nb --metric`` takes it; where none
        is recorded, refused (the catalog closed): a guess would keep the worst
        checkpoints as the best."""
        recorded = self._recorded_mode_of(metric)
        if recorded is not None:
            return recorded
        logged = {name for row in self.catalog.checkpoints() for name in row.metrics}
        self.catalog.close()
        raise _no_direction(metric, logged)

    def _follow_recorded_ranking(self) -> None:
        """Take the ranking the store records now, where this manager ranks by the
        record (it was given no metric, and none was set on it since): a manager opened
        before a save first recorded one (a notebook's explorer, opened before training
        with ``on=``) said no save had, and a later ranking was not followed. Changed
        under ``_busy``, so that a save on another thread never sees half of it (and
        records that half as its own)."""
        if not self._ranks_by_the_record() or self.catalog.ranking() == self._ranking_taken:
            return  # (the lock only where it changed: it waits for a save on another thread)
        with self._busy:
            recorded = self.catalog.ranking()
            if not self._ranks_by_the_record() or recorded == self._ranking_taken:
                return
            self._ranking_taken = recorded
            self._ranking_said = False  # (another ranking: said again where "best" uses it)
            self.metric, self.mode = recorded or (None, self.mode)

    def _others_may_rank(self, rows: list[CheckpointRow], metric: str) -> bool:
        """Whether "best" by the recorded ranking may not be what another run in this
        store meant: saves recorded other rankings (or the catalog, an older one, does not
        say), or an epoch's end was saved logging metrics without the recorded one. Where
        neither, the ranking is the only one the store ever had, and saying so at every
        use (each CLI command) was noise."""
        ever = self.catalog.rankings_recorded()
        return ever is None or len(ever) > 1 or any(
            row.batch_idx is None and row.metrics and metric not in row.metrics
            for row in rows)

    def _ranks_by_the_record(self) -> bool:
        """Whether this manager ranks by the ranking the store records: it was given no
        metric, and none was set on it since (a session's ``on=``)."""
        return self.metric is None or (self.metric, self.mode) == self._ranking_taken

    def _ranks_its_saves(self) -> bool:
        """Whether this manager's saves record its ranking: it was given a metric (one
        taken from the record, or none, leaves the record as it is)."""
        return self.metric is not None and (self.metric, self.mode) != self._ranking_taken

    def _record_ranking(self) -> None:
        """Record the metric and mode this manager was given in the catalog, where it
        holds others: the default of a manager opened later without ``metric=`` (the
        explorer's, the CLI's), which would otherwise guess from the metric's name. Only
        a save records it: a reader ranking by another metric changes nothing."""
        if not self._ranks_its_saves():
            return
        # (and where the catalog, an older one, keeps no rankings: from then on it does)
        if self.catalog.ranking() != (self.metric, self.mode) or \
                self.catalog.rankings_recorded() is None:
            self.catalog.set_ranking(self.metric, self.mode)

    def _best(self, rows: list[CheckpointRow], k: int,
              ranking: tuple[str, str] | None = None) -> list[str]:
        """The ids of the ``k`` best of ``rows`` by ``ranking`` (metric, mode), else by
        the manager's own."""
        metric, mode = ranking or (self.metric, self.mode)
        if metric is None:
            return []
        scored = [r for r in rows if metric in r.metrics
                  and math.isfinite(r.metrics[metric])]  # (±inf: a diverged run)
        sign = 1 if mode == "min" else -1
        scored.sort(key=lambda r: (sign * r.metrics[metric], -r.seq))
        return [r.id for r in scored[:k]]

    # -- restore ------------------------------------------------------------------------
    def restore(
        self,
        which: str | os.PathLike[str] = "latest",
        model: Any = None,
        optimizer: Any = None,
        *,
        scheduler: Any = None,
        scaler: Any = None,
        rng: bool = True,
        strict: bool = True,
        trust_pickle: bool = False,
        progress: ProgressFn | None = None,
        **statefuls: Any,
    ) -> Checkpoint:
        """Put a checkpoint back into live objects, in place, all or nothing.

        ``which`` is "latest" (the newest that verifies), "best", "-N", an id, or
        the path of a file ``import_file`` reads (.pt, .pth, .bin, .ckpt or .safetensors,
        in any case). Objects not passed stay in
        ``Checkpoint.state`` (a restore that puts an optimizer back warns, naming
        them); ``rng=False`` leaves the random generators alone.
        ``strict=False`` lets a module take a state with missing or unexpected keys
        (as ``load_state_dict(strict=False)``; the Checkpoint's ``missing_keys`` and
        ``unexpected_keys`` name them); shapes and dtypes must still fit, and
        keys the live module ties (tensors sharing memory) take no different values (a
        checkpoint saved untied is refused: torch would keep one of them, silently).
        ``trust_pickle=True`` unpickles values stored as pickles (only for a store you
        trust: a pickle can run code); an unpickled object's own error is raised as it is,
        a damaged checkpoint's is ``CorruptCheckpointError`` as without it (for "latest",
        the one before is tried). Raises ``StateMismatchError`` naming what does
        not fit, with nothing changed. A Ctrl-C while it reads changes nothing; one while
        it puts the state in is held until all of it is in, then raised.
        """
        for flag, value in (("rng", rng), ("strict", strict), ("trust_pickle", trust_pickle)):
            check_flag(flag, value)
        _refuse_plain_keywords("restore", statefuls, _keyword_names(CheckpointManager.restore))
        targets = {"model": model, "optimizer": optimizer, "scheduler": scheduler,
                   "scaler": scaler, **statefuls}
        targets = {k: v for k, v in targets.items() if v is not None}
        _check_which(which, files=True)
        with capture.RestoreInterrupts("restore") as interrupts:  # (Ctrl-C: all or nothing)
            path = os.fspath(which)
            from_file = self._names_a_file(path)
            if from_file:
                from ._interop import out_of_file, read_file

                ck = read_file(path, trust_pickle=trust_pickle)
                # (the file is mapped: a module copies its state out of it, the rest is
                # copied here, so that nothing live or returned holds the file's pages)
                memo: dict[int, Any] = {}
                ck.state = {name: state if isinstance(targets.get(name), torch.nn.Module)
                            and capture.copies_what_it_loads(targets[name])
                            else out_of_file(state, memo) for name, state in ck.state.items()}
                ck.extra, ck.rng = out_of_file(ck.extra, memo), out_of_file(ck.rng, memo)
            else:
                # (a module copies its state into its own tensors: decoded apart from what
                # is kept as it is, which alone stays held)
                ck = self._load_verified(path, trust_pickle, progress, targets, copied={
                    name for name, obj in targets.items() if isinstance(obj, torch.nn.Module)})
            interrupts.commit(f"restore of {ck.id}")
            put_back = None
            if rng and ck.rng is not None:  # first, so that a state that does not load is
                put_back = capture.rng_put_back()  # refused before anything changes
                problem = capture.rng_problem(ck.rng)
                if problem is not None:
                    raise StateMismatchError(
                        f"rng: the checkpoint's random generator states do not load "
                        f"({problem}); nothing was changed (rng=False restores the rest)")
                capture.RNGState().load_state_dict(ck.rng)
            try:
                skipped = capture.load_all(targets, ck.state, strict=strict, kinds=ck.kinds,
                                           param_names=ck.param_names)
            except StateMismatchError as exc:
                if put_back is not None:
                    put_back()
                ways = _partial_restore_ways(targets, ck.state, strict, os.fspath(which))
                if not ways or isinstance(exc, ParameterOrderError):
                    raise
                raise StateMismatchError(f"{exc}\n  {ways}") from None
            except BaseException:
                if put_back is not None:
                    put_back()
                raise
            _warn_nothing_taken(ck.id, targets, skipped)
            ck.missing_keys = {name: keys for name, (keys, _) in skipped.items() if keys}
            ck.unexpected_keys = {name: keys for name, (_, keys) in skipped.items() if keys}
            for name in targets:
                ck.state.pop(name)
            if ck.state and any(isinstance(obj, torch.optim.Optimizer)
                                for obj in targets.values()):
                _warn_left_out(ck)
            if from_file:  # (the live objects now descend from no checkpoint: a new root next)
                self.head = None
            elif self.catalog.get(ck.id) is not None:
                self.head = ck.id
                self._notify("restore", ck.id)
        return ck

    def _load_verified(self, which: str, trust_pickle: bool, progress: ProgressFn | None,
                       needed: Iterable[str], skipped: list[str] | None = None, *,
                       copied: AbstractSet[str] = frozenset(),
                       tell_pickles: bool = True) -> Checkpoint:
        """``load``'s read of a checkpoint. ``skipped``: where given, each newer checkpoint
        "latest" passes over is added to it ("ID, which ..."), not warned of one by one (the
        CLI's export said 200 lines for a store of 200 sharing a damaged chunk). ``copied``:
        the objects a restore copies into live ones (``_load``); ``tell_pickles``, as
        ``load`` takes it."""
        if which != "latest":
            return self._load(self.resolve(which), trust_pickle=trust_pickle, progress=progress,
                              needed=needed, copied=copied, tell_pickles=tell_pickles)
        self._catch_up()  # (once: the ids below are known ones)
        tried: set[str] = set()
        passed_over: set[str] = set()  # (damaged, or a newer ckpt_nb's)
        for attempt in range(4):  # (again where all those tried were deleted meanwhile)
            # Overtaken each time (another process's retention deleted each checkpoint
            # while it was read): read under the store's lock, where none is deleted.
            last = attempt == 3 and not self.catalog.read_only
            with self._exclusive(reading=True) if last else contextlib.nullcontext():
                for cid in [cid for cid in self.catalog.newest_ids()
                            if cid not in (passed_over if last else tried)]:
                    tried.add(cid)
                    try:
                        return self._load(cid, trust_pickle=trust_pickle, progress=progress,
                                          needed=needed, copied=copied,
                                          tell_pickles=tell_pickles)
                    except CheckpointNotFoundError:
                        continue  # deleted meanwhile: the one before it
                    except CorruptCheckpointError as exc:
                        why = f"{cid}, which fails verification ({exc})"
                    except StoreFormatError as exc:  # (a newer ckpt_nb's, or torch's)
                        why = f"{cid}, which this ckpt_nb cannot read ({exc})"
                    if skipped is None:
                        warn(f"skipping checkpoint {why}; trying the one before it")
                    else:
                        skipped.append(why)
                    passed_over.add(cid)
        if not self.catalog.newest_ids(1):
            raise CheckpointNotFoundError(self._no_checkpoints_yet())
        raise CorruptCheckpointError(f"no checkpoint in {self.store.url} passes verification")

    def load(self, which: str | os.PathLike[str] = "latest", *, trust_pickle: bool = False,
             progress: ProgressFn | None = None, needed: Iterable[str] = (),
             tell_pickles: bool = True) -> Checkpoint:
        """Read a checkpoint into fresh objects, touching nothing live.

        ``"latest"`` is the newest checkpoint that reads whole, as for ``restore``: one
        that fails verification is skipped with a warning. Pickled values are left as
        ``PickledValue`` placeholders unless ``trust_pickle``, and a warning names them
        (``tell_pickles=False``: the caller says what they mean, a notebook's resume
        refusing them); in the objects named in ``needed`` they raise instead. A file's
        path reads that file, as ``restore`` does.
        """
        check_flag("trust_pickle", trust_pickle)
        check_flag("tell_pickles", tell_pickles)
        _check_which(which, files=True)
        path = os.fspath(which)
        if self._names_a_file(path):
            from ._interop import out_of_file, read_file

            ck = read_file(path, trust_pickle=trust_pickle)
            if not _EXPORT_READING.get():  # (an export writes the file and drops it)
                # The file is mapped: what is returned is copied out of it, as a store's
                # checkpoint is read into memory of its own (saved over in place, the file
                # would change the values held, or kill the process with SIGBUS).
                memo: dict[int, Any] = {}
                ck.state, ck.extra, ck.rng = (out_of_file(ck.state, memo),
                                              out_of_file(ck.extra, memo),
                                              out_of_file(ck.rng, memo))
            return ck
        return self._load_verified(path, trust_pickle, progress, needed,
                                   tell_pickles=tell_pickles)

    def _names_a_file(self, which: str) -> bool:
        """Whether ``which`` means a file, not a checkpoint: it has a path separator or a
        suffix (ids have neither), or names something on disk that is no id here. Such an
        argument gets a file's errors ("no file X", "X is a directory"), not an unknown
        id's."""
        if which in ("latest", "best") or which[1:].isdigit() and which.startswith("-"):
            return False
        if any(sep and sep in which for sep in (os.sep, os.altsep)) or Path(which).suffix:
            return True
        return os.path.exists(which) and not self.catalog.ids_with_prefix(which)

    @contextlib.contextmanager
    def _reading(self, cid: str) -> Iterator[None]:
        """Reading a checkpoint's files: a failure because retention or another process
        deleted it meanwhile (a file it needed went with it) says so, not "damaged"."""
        try:
            yield
        except CkptError as exc:
            try:
                self._catch_up()  # (another manager's delete, where the catalog is this
                # one's; a store removed whole is named so there)
            except StoreError:
                if isinstance(exc, StoreError):  # (the server gone meanwhile: the read's
                    raise exc from exc.__cause__  # failure is named, not the look's)
                raise
            if self.catalog.get(cid) is None:
                raise CheckpointNotFoundError(
                    f"checkpoint {cid} was deleted (by retention, here or in another "
                    "process) while it was being read") from None
            raise

    def _load(self, cid: str, *, trust_pickle: bool, progress: ProgressFn | None,
              needed: Iterable[str], copied: AbstractSet[str] = frozenset(),
              tell_pickles: bool = True) -> Checkpoint:
        """``load`` of a checkpoint by its id; the storages that only the objects
        ``copied`` view (modules a restore copies into live ones) are decoded apart, and
        each other owner's apart (``_storage_groups``)."""
        row = self.catalog.get(cid)
        with self._reading(cid):
            if row is None:
                raise CheckpointNotFoundError(f"no checkpoint {cid!r}")
            manifest = self._manifest(cid)
            storages = self._decode_storages(cid, manifest, progress,
                                             _storage_groups(manifest, copied))
        skeleton = manifest["state"]
        unloaded: list[str] = []

        def placeholder(name: str) -> PickledValue:
            unloaded.append(name)
            return PickledValue(name)

        needed = set(needed)

        def decode(strict: Unflattener, lenient: Unflattener
                   ) -> tuple[dict[str, Any], Any, Any, dict[str, str]]:
            """The state's objects, extra, rng and kinds, ``strict`` decoding the objects
            ``needed`` (a pickle there is loaded or refused), ``lenient`` the rest; an
            error of its record is CorruptCheckpointError, except under trust_pickle."""
            try:
                entries = skeleton["objects"]  # names are keywords: str, may start with "__"
                entries = dict(entries["__dict__"] if "__dict__" in entries else entries.items())
                objects = {name: (strict if name in needed else lenient).decode(value, name)
                           for name, value in entries.items()}
                extra = lenient.decode(skeleton["extra"], "extra")
                rng = strict.decode(skeleton["rng"], "rng") if skeleton.get("rng") else None
                kinds = _kinds(skeleton)
                for name, kind in kinds.items():
                    problem = capture.generator_state_problem(kind, objects.get(name))
                    if problem is not None:
                        raise CorruptCheckpointError(f"checkpoint {cid}: {name}: {problem}", cid)
                return objects, extra, rng, kinds
            except _RECORD_ERRORS as exc:
                if strict.trust_pickle or isinstance(exc, CkptError) and \
                        not isinstance(exc, CaptureError):
                    raise
                # Without pickles no code of the store's runs here: what fails is its record.
                raise CorruptCheckpointError(
                    f"checkpoint {cid}: its manifest does not describe a state "
                    f"({type(exc).__name__}: {exc})", cid) from exc

        if trust_pickle:  # (bytes that are no pickle's are not unpickled)
            problem = pickle_problem(skeleton, manifest["storages"])
            if problem is not None:
                raise CorruptCheckpointError(
                    f"checkpoint {cid}: its manifest is damaged ({problem})", cid)
        try:
            objects, extra, rng, kinds = decode(
                capture.Unflattener(manifest["tensors"], storages, trust_pickle=trust_pickle),
                capture.Unflattener(manifest["tensors"], storages, trust_pickle=trust_pickle,
                                    on_pickle=placeholder))
        except _RECORD_ERRORS as exc:
            if not trust_pickle or isinstance(exc, CkptError) and \
                    not isinstance(exc, CaptureError):
                raise
            # An unpickled object's own error is the caller's to read: it is one where the
            # state decodes with the pickles left out (which raises CorruptCheckpointError
            # where it does not: the record's error).
            unpickled = capture.Unflattener(manifest["tensors"], storages,
                                            on_pickle=lambda name: None)
            decode(unpickled, unpickled)
            raise
        if unloaded and tell_pickles and not _EXPORT_READING.get():
            warn(f"checkpoint {cid}: {unloaded} are pickles and were not loaded; "
                 "pass trust_pickle=True to load them")
        return Checkpoint(
            id=cid, parent=row.parent, branch=row.branch, created=row.created_at,
            step=row.step, epoch=row.epoch, batch_idx=row.batch_idx, metrics=row.metrics,
            extra=extra, strategy=row.strategy, note=row.note, pinned=row.pinned,
            state=objects, rng=rng, kinds=kinds, param_names=_param_names(skeleton))

    # -- inspecting -------------------------------------------------------------------------
    def list(self, *, branch: str | None = None) -> Any:
        """Every checkpoint as a pandas DataFrame, oldest first, a column per metric (in
        natural order: loss_2 before loss_10, as the CLI and the refusals name them);
        ``created`` is tz-aware UTC (``.dt.tz_convert(None)`` for naive), so that no reader
        takes it for local time."""
        self._catch_up()
        return self._list_table(self.catalog.checkpoints(), branch=branch)

    def _list_table(self, every: list[CheckpointRow], *, branch: str | None = None) -> Any:
        """``list()``'s table of ``every`` row of the catalog as one read gave them (the
        caller caught up): ``ckpt-nb ls`` ranks and marks the same rows, not a second
        read of a catalog of thousands."""
        import pandas as pd

        rows = every if branch is None else [r for r in every if r.branch == branch]
        names = sorted({m for r in rows for m in r.metrics}, key=natural_order)
        # A metric named like a column (a "step" logged as a metric) is "metric:step"
        # (or "metric:metric:step", where a metric has that name too).
        columns: dict[str, str] = {}
        for m in names:
            label = m
            while label in _LIST_COLUMNS or label != m and label in names:
                label = f"metric:{label}"
            columns[m] = label
        best = set(self._best(rows, self.keep_best or 1))
        head = self.head
        if head is not None and self.catalog.get(head) is None:  # deleted by another manager
            head = self.catalog.heir_of(head)  # (where the next save descends from)
        table = pd.DataFrame(
            [{"id": r.id, "parent": r.parent, "branch": r.branch,
              "created": pd.Timestamp(r.created_at, unit="s", tz="UTC"), "step": r.step,
              "epoch": r.epoch, "batch_idx": r.batch_idx, "strategy": r.strategy,
              "stored_bytes": r.stored_bytes, "logical_bytes": r.logical_bytes,
              "pinned": r.pinned, "best": r.id in best, "head": r.id == head,
              "note": r.note, **{columns[m]: r.metrics.get(m, math.nan) for m in names}}
             for r in rows],
            columns=[*_LIST_COLUMNS, *columns.values()])
        for column in ("step", "epoch", "batch_idx"):
            table[column] = table[column].astype("Int64")
        # (an empty table's columns of the types a full one's have)
        table = table.astype({"id": str, "branch": str, "strategy": str, "note": str,
                              "created": "datetime64[ns, UTC]", "stored_bytes": "int64",
                              "logical_bytes": "int64", "pinned": bool, "best": bool,
                              "head": bool, **{c: "float64" for c in columns.values()}})
        table["parent"] = pd.Series([r.parent for r in rows], dtype=object)
        return table

    def latest_step(self) -> int | None:
        """The ``step`` of the newest checkpoint ("latest"), as Orbax's ``latest_step()``:
        None on a store with no checkpoint yet (a first run, where ``info("latest")``
        raises), or where that checkpoint was saved without ``step=``."""
        self._catch_up()
        rows = self.catalog.checkpoints()
        return rows[-1].step if rows else None

    def all_steps(self) -> list[int]:
        """The steps of the checkpoints, each once, ascending, as Orbax's ``all_steps()``;
        a checkpoint saved without ``step=`` has none, and adds nothing."""
        self._catch_up()
        return sorted({row.step for row in self.catalog.checkpoints() if row.step is not None})

    def info(self, which: str = "latest") -> dict[str, Any]:
        """One checkpoint's catalog row and the tensors its manifest lists. ``created`` is
        when it was saved, in seconds since the epoch, as ``Checkpoint.created`` (and
        ``list()``'s ``created`` column as a timestamp); ``created_at`` is the same value,
        under the name it had first. ``chain`` is the count of saves since the last full
        one (what ``full_every`` bounds); ``depth`` the most deltas a restore decodes for
        one chunk (0: every chunk stored whole), a differential save's 1 at most, however
        long its chain."""
        cid = self.resolve(which)
        with self._reading(cid):
            manifest = self._manifest(cid)
            row = self.catalog.get(cid)
            if row is None:
                raise CheckpointNotFoundError(f"no checkpoint {cid!r}")
        storages = manifest["storages"]
        try:
            tensors = [{"name": t["name"], "dtype": t["dtype"], "shape": tuple(t["shape"]),
                        "stride": tuple(t["stride"]), "offset": t["offset"],
                        "storage": storages[t["storage"]]["name"],
                        "chunks": len(storages[t["storage"]]["chunks"])}
                       for t in manifest["tensors"]]
            objects = _kinds(manifest["state"])
            pickles = has_pickle(manifest["state"])
            digests = {d for s in storages for d, _ in s["chunks"]}
        except (KeyError, IndexError, TypeError, ValueError, RecursionError) as exc:
            raise CorruptCheckpointError(f"checkpoint {cid}: its manifest does not describe "
                                         f"its tensors ({type(exc).__name__}: {exc})",
                                         cid) from exc
        depth = max((r.depth for r in self.catalog.chunks(digests).values()), default=0)
        return {**{k: v for k, v in vars(row).items() if k not in ("tags", "seq")},
                "created": row.created_at, "depth": depth,
                "children": self.catalog.children(cid), "tensors": tensors,
                "objects": objects, "pickles": pickles}

    def diff(self, a: str, b: str) -> Any:
        """Per-tensor change from checkpoint ``a`` to ``b`` as a pandas DataFrame. A
        tensor whose view and chunks are the same on both sides is not read; the others
        are read a batch at a time, so a diff takes memory for a few tensors, not two models.
        The rows of a generator's state (the RNG's, ``rng/...``, a tracked
        ``torch.Generator``'s, those a run record keeps of its loop) say whether it changed,
        with no l2 or rel_change (NaN, unchanged too): its state is words, not a vector whose
        norm means anything.
        The other values (an optimizer's lr, ``extra``, step): ``diff_values``."""
        import pandas as pd

        from ._capture import dtype_from_name

        ids = [self.resolve(a), self.resolve(b)]
        manifests, sides = [], []
        kinds: dict[str, Any] = {}  # (each object's class: which tensors are generators')
        for cid in ids:
            with self._reading(cid):
                manifest = self._manifest(cid)
            try:
                chunks = [tuple(d for d, _ in s["chunks"]) for s in manifest["storages"]]
                sizes = [sum(n for _, n in s["chunks"]) for s in manifest["storages"]]
                sides.append({t["name"]: (t, chunks[t["storage"]], sizes[t["storage"]],
                                          _sizes(t["shape"]), dtype_from_name(t["dtype"]))
                              for t in manifest["tensors"]})
                types = manifest["state"]["types"] if "types" in manifest["state"] else {}
                if not isinstance(types, Mapping):
                    raise TypeError(f"its types are a {type(types).__name__}, not a dict")
                kinds.update(types)
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise _undescribed(cid, exc) from exc
            manifests.append(manifest)
        left, right = sides
        records, unread = [], []
        for name in list(left) + [n for n in right if n not in left]:
            ra, ca, na, shape_a, dtype_a = left.get(name, (None,) * 5)
            rb, cb, nb, shape_b, dtype_b = right.get(name, (None,) * 5)
            record: dict[str, Any] = {"tensor": name, "status": "changed", "shape": None,
                                      "dtype": None, "changed": True, "same_chunks": False,
                                      "l2": math.nan, "rel_change": math.nan}
            if ra is None or rb is None:
                shape, dtype = (shape_a, dtype_a) if rb is None else (shape_b, dtype_b)
                record.update(status="removed" if rb is None else "added",
                              shape=shape, dtype=str(dtype)[6:])
            else:
                record.update(shape=shape_b, dtype=str(dtype_b)[6:] if dtype_a == dtype_b
                              else f"{str(dtype_a)[6:]}->{str(dtype_b)[6:]}")
                same_layout = all(ra.get(k) == rb.get(k) for k in _VIEW_FIELDS)
                if same_layout and ca == cb:
                    record.update(status="identical", changed=False, same_chunks=True,
                                  **_NO_NORMS if _random_state(name, kinds) else _NO_CHANGE)
                elif shape_a != shape_b:
                    record.update(status="reshaped", shape=f"{shape_a}->{shape_b}")
                else:
                    unread.append((record, ra, rb, na, nb))
            records.append(record)
        for batch in self._diff_batches(unread):
            left_tensors, right_tensors = (
                self._diff_tensors(cid, manifest, [job[side] for job in batch])
                for side, cid, manifest in zip((1, 2), ids, manifests))
            for (record, *_), ta, tb in zip(batch, left_tensors, right_tensors):
                changed = ta.dtype != tb.dtype or not _same_values(ta, tb)
                record.update(status="changed" if changed else "identical", changed=changed,
                              **(_NO_NORMS if _random_state(record["tensor"], kinds)
                                 else _change_norms(ta, tb) if changed else _NO_CHANGE))
        return pd.DataFrame(records, columns=["tensor", "status", "shape", "dtype", "changed",
                                              "same_chunks", "l2", "rel_change"])

    def diff_values(self, a: str, b: str) -> Any:
        """The values other than tensors that differ from checkpoint ``a`` to ``b``, as a
        pandas DataFrame of ``path``, ``status`` (changed, added or removed) and the value
        in ``a`` and in ``b`` (None on the side without it). ``diff`` compares the tensors;
        this, the rest: step, epoch, batch_idx and metrics (``metrics/NAME``); each object's
        state beside its tensors (``objects/optimizer/param_groups/0/lr``, a scheduler's);
        the objects' types (``types/NAME``); ``extra`` (``extra/KEY``); and the variables a
        notebook session captured (``variables/NAME``). Only the manifests are read: a
        pickled value is compared by its stored bytes and never unpickled, and stands as a
        placeholder whose repr says so (``<pickled value (312 bytes, 9f8e7d6c)>``), as does
        a tensor met among values (``<tensor 8x4 float32>``). Left out: the RNG
        state and a session's own records, which change at every save (the RNG's tensors
        are among ``diff``'s rows)."""
        import pandas as pd

        from ._diff_values import ValueDiff, ValueSide

        sides = []
        for cid in (self.resolve(a), self.resolve(b)):
            with self._reading(cid):
                sides.append(ValueSide(self, cid, self._manifest(cid), RUN_KEY))
        rows = ValueDiff(*sides).rows()  # (as object: a column of 5 and 0.5 made 5.0)
        return pd.DataFrame(rows, columns=["path", "status", "a", "b"], dtype=object)

    @staticmethod
    def _diff_batches(unread: list[tuple[Any, ...]]) -> Iterator[list[tuple[Any, ...]]]:
        """Tensors to compare, (record, left, right, left bytes, right bytes), in batches
        of about ``_DIFF_BATCH_BYTES`` of storages to decode: the views of one storage go
        together and weigh it once (a flat parameter buffer was decoded once a view)."""
        batch: list[tuple[Any, ...]] = []
        seen: set[tuple[int, int]] = set()
        size = 0
        for job in sorted(unread, key=lambda job: (job[1]["storage"], job[2]["storage"])):
            sides = ((1, job[1]["storage"]), (2, job[2]["storage"]))
            cost = sum(n for side, n in zip(sides, job[3:]) if side not in seen)
            if batch and cost and size + cost > _DIFF_BATCH_BYTES:
                yield batch
                batch, seen, size = [], set(), 0
                cost = job[3] + job[4]
            batch.append(job)
            seen.update(sides)
            size += cost
        if batch:
            yield batch

    def _diff_tensors(self, cid: str, manifest: Mapping[str, Any],
                      records: list[dict[str, Any]]) -> list[torch.Tensor]:
        """These tensors of a checkpoint, with only the storages they view decoded."""
        wanted = sorted({rec["storage"] for rec in records})
        at = {index: n for n, index in enumerate(wanted)}
        with self._reading(cid):
            storages = self._decode_storages(
                cid, {"storages": [manifest["storages"][index] for index in wanted]})
        decoder = capture.Unflattener(
            [{**rec, "storage": at[rec["storage"]]} for rec in records], storages)
        try:
            return [decoder.tensor(i).detach() for i in range(len(records))]
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            raise _undescribed(cid, exc) from exc  # (torch's own, for a view past its storage)

    # -- integrity ---------------------------------------------------------------------------
    def _index_problem(self, key: str) -> str | None:
        """What is wrong with a pack's own index (which a rebuilt catalog is read from),
        checked against the catalog's rows for the pack; None when nothing is."""
        try:
            found = {row.digest: row for row in read_pack_index(self.store, key)}
        except CorruptCheckpointError as exc:
            return str(exc)
        except FileNotFoundError:  # compacted or collected meanwhile, unless still in use
            return f"pack {key} is missing from the store" \
                if self.catalog.chunks_in_pack(key) else None
        for row in self.catalog.chunks_in_pack(key):
            if found.get(row.digest) != row:
                return (f"pack {key}: its index disagrees with the catalog about chunk "
                        f"{row.digest[:12]}")
        return None

    def verify(self, ids: Iterable[str] | None = None,
               progress: ProgressFn | None = None) -> VerifyReport:
        """Re-read every chunk of the checkpoints (all by default) and check checksums;
        also each pack's own index, which a lost catalog would be rebuilt from. A store
        that fails to give what is read (a server down) stops it with a ``StoreError``
        naming the checkpoints already found damaged, if any: never a report calling
        what was not read checked, or damaged."""
        self._catch_up()
        wanted = [self.resolve(i) for i in ids] if ids is not None else \
            [r.id for r in self.catalog.checkpoints()]
        good: set[str] = set()
        bad: dict[str, list[str]] = {}
        packs: set[str] = set()
        checked: list[str] = []
        newer: dict[str, str] = {}
        known: dict[str, ChunkRow] = {}  # (rows read: the chains the checkpoints share)

        def check(rows: dict[str, ChunkRow]) -> list[str]:
            failed = self._check_chunks(rows, good)
            problems = [failed[digest] for digest in sorted(failed)]
            if problems and any(not self.store.has(row.pack) for row in rows.values()):
                raise CorruptCheckpointError("; ".join(dict.fromkeys(problems)))  # moved? again
            packs.update(row.pack for row in rows.values())
            return problems

        # The newest first: their chunks' delta chains hold the older ones', each then
        # decoded once (the oldest first decoded each chain again, one chunk longer).
        for n, cid in enumerate(reversed(wanted), 1):
            try:
                self._manifests.pop(cid, None)
                problems = self._reading_again_if_moved(self._manifest(cid), check, known)
            except StoreFormatError:  # (not damage: this ckpt_nb cannot read it)
                if self.catalog.get(cid) is not None:
                    newer[cid] = _NOT_CHECKED
                continue
            except CkptError as exc:
                if isinstance(exc, StoreError) and isinstance(exc.__cause__, sqlite3.Error):
                    raise  # the catalog's own (damaged, its disk full): said as it is
                if isinstance(exc, StoreError) and not isinstance(exc, DamagedCatalog):
                    # the backend failed (a server down): not damage, as restore says
                    raise _unread(exc, bad) from exc
                problems = [str(exc)]
            if problems:
                try:  # (another catalog's delete, which this one hears of only now)
                    self._catch_up()
                except StoreError as exc:
                    if isinstance(exc, DamagedCatalog) or isinstance(exc.__cause__, sqlite3.Error):
                        raise
                    raise _unread(exc, bad) from exc
            # Not deleted meanwhile (retention, here or in another process); one a catch-up
            # found damaged is said below, as a rebuild's
            if self.catalog.get(cid) is not None or \
                    ids is not None and cid in _damaged_checkpoints(self.catalog):
                checked.append(cid)
                if problems:
                    bad[cid] = problems
            if progress is not None:
                progress(n, len(wanted))
        order = {cid: n for n, cid in enumerate(wanted)}  # (said in the order asked for)
        checked.sort(key=order.__getitem__)
        bad = {cid: bad[cid] for cid in checked if cid in bad}
        damaged_indexes: dict[str, str] = {}
        try:
            if ids is None:  # (what a rebuild left out as damaged is in no catalog row)
                for cid, why in _damaged_checkpoints(self.catalog).items():
                    if not self.store.has(manifest_key(cid)):
                        continue
                    if is_newer(why):
                        newer[cid] = _NOT_CHECKED
                        continue
                    checked.append(cid)
                    bad[cid] = [f"checkpoint {cid} is damaged ({why}): {_DAMAGED_KEPT}"]
            for key in sorted(packs):
                if (problem := self._index_problem(key)) is not None:
                    self._catch_up()  # (a pack another catalog's delete or gc took?)
                    problem = self._index_problem(key)
                if problem is not None:
                    damaged_indexes[key] = problem
        except StoreError as exc:
            if isinstance(exc, DamagedCatalog) or isinstance(exc.__cause__, sqlite3.Error):
                raise  # the catalog's own: said as it is
            raise _unread(exc, bad, damaged_indexes) from exc
        return VerifyReport(checked, bad, damaged_indexes, newer)

    def _check_chunks(self, rows: Mapping[str, ChunkRow], good: set[str]) -> dict[str, str]:
        """Decode and check the chunks of ``rows`` not in ``good``, adding them there;
        returns why each that failed did (a chunk on a failed base fails as it did).
        Each is decoded once, from its base's bytes, walking each delta chain from its
        root and keeping a chunk's bytes only while the chunks on it are decoded:
        decoding each chunk's whole chain again made a verify grow with the square of
        its chains' length."""
        needed: set[str] = set()  # the chunks to check, and the bases below them
        for digest in rows.keys() - good:
            at: str | None = digest
            while at is not None and at in rows and at not in needed:
                needed.add(at)
                at = rows[at].base
        on: dict[str, list[str]] = {}
        for digest in sorted(needed):
            if rows[digest].base is not None:
                on.setdefault(rows[digest].base, []).append(digest)
        views = self._pack_views({digest: rows[digest] for digest in needed})
        with self._prefetching(rows, needed):  # (an object store's: ranges fetched together)
            return self._check_decodes(rows, needed, on, views, good)

    def _check_decodes(self, rows: Mapping[str, ChunkRow], needed: set[str],
                       on: Mapping[str, list[str]], views: Mapping[str, memoryview],
                       good: set[str]) -> dict[str, str]:
        """``_check_chunks``' reading: each chunk decoded after its base, and those whose
        bytes or bases are bad, with why."""
        failed: dict[str, str] = {}
        todo = [(digest, None) for digest in sorted(needed) if rows[digest].base is None]
        while todo:
            digest, base = todo.pop()
            row = rows[digest]
            try:
                raw = _raw_buffer(row)
                blob = self._blob(row, views)
                self._check_decoded(row, raw, codec.decode_many([(blob, raw, base, digest)])[0])
            except CorruptCheckpointError as exc:
                above = [digest]
                while above:
                    at = above.pop()
                    failed[at] = str(exc)
                    above.extend(on.get(at, ()))
                continue
            good.add(digest)
            todo.extend((child, raw) for child in on.get(digest, ()))
        for digest in sorted(needed - good - failed.keys()):  # (on no root: a loop of bases)
            try:
                self._decode_chunk(rows[digest], _raw_buffer(rows[digest]), rows, views)
                good.add(digest)
            except CorruptCheckpointError as exc:
                failed[digest] = str(exc)
        return failed

    # -- pins, deletes, retention ---------------------------------------------------------------
    def pin(self, which: str, pinned: bool = True) -> str:
        """Protect a checkpoint from retention (``pinned=False`` releases it)."""
        check_flag("pinned", pinned)
        with self._exclusive():  # (not between another process's pinned check and delete)
            self._catch_up()
            cid = self._resolve(which)
            if pinned:
                self._withdraw_deletion(cid)
            self._label(cid, pinned=pinned)
        self._notify("pin", cid)
        return cid

    def unpin(self, which: str) -> str:
        """Let retention delete a pinned checkpoint again; returns its id."""
        return self.pin(which, False)

    def annotate(self, which: str, note: str) -> str:
        """Set a checkpoint's note (shown by list(), the CLI and the explorer)."""
        if not isinstance(note, str):
            raise TypeError(f"note must be a string, not {note!r}")
        with self._exclusive():
            self._catch_up()
            cid = self._resolve(which)
            self._label(cid, note=note)
        return cid

    def _label(self, cid: str, parent: str | None | types.EllipsisType = ...,
               **change: Any) -> None:
        """Change a checkpoint's pin or note: in the store first (as a label, which a
        rebuilt catalog reads back), then in the catalog. Under the store's lock.
        ``parent``: the one the label names, where not the catalog's (the parent a
        deletion about to be recorded gives it, ``_label_heirs``)."""
        row = self.catalog.get(cid)
        if row is None:
            raise CheckpointNotFoundError(f"checkpoint {cid} was deleted meanwhile")
        label = {"pinned": row.pinned, "note": row.note,
                 "parent": row.parent if parent is ... else parent, **change}
        self.store.put(label_key(cid), json.dumps(label).encode())
        if change:
            self.catalog.update(cid, **change)

    def _label_rejoined(self) -> None:
        """Label every checkpoint whose parent a rebuilt catalog would not guess (see
        ``_rebuild``) and whose label is missing or says another parent: a branch's
        first checkpoint whose fork point was deleted by a ckpt_nb from before labels,
        or one whose deletion's labels could not be written (``_label_heirs``)."""
        rows = self.catalog.checkpoints()
        guesses = guessed_parents((row.id, row.branch) for row in rows)
        for row in rows:
            if row.parent != guesses[row.id] and self._labelled_parent(row.id) != row.parent:
                self._label(row.id)

    def _labelled_parent(self, cid: str) -> str | None | bool:
        """The parent a checkpoint's label gives, or False without a readable one."""
        try:
            label = json.loads(self.store.get(label_key(cid)))
        except (FileNotFoundError, ValueError):
            return False
        return label.get("parent", False) if isinstance(label, dict) else False

    @overload
    def delete(self, which: str, *, force: bool = False) -> str: ...

    @overload
    def delete(self, which: str, second: str, /, *more: str, force: bool = False
               ) -> list[str]: ...

    def delete(self, which: str, *more: str, force: bool = False) -> str | list[str]:
        """Delete a checkpoint; other checkpoints keep every chunk they share with it,
        and its children descend from its parent. A pinned one raises
        ``CheckpointInUseError`` unless ``force=True``. Returns its id (``which`` is read
        under the store's lock, as the deletion is done). Several (``delete(a, b, c)``)
        are read first, then deleted in one pass (none where one is unknown or pinned);
        that returns their ids. It frees what the deleted checkpoints alone held, work in
        proportion to them; ``gc()`` sweeps the whole store (a killed save's leftovers)."""
        check_flag("force", force)
        named = (which, *more)
        for one in named:
            if not isinstance(one, (str, os.PathLike)) and isinstance(one, Iterable):
                # (a list, a set, list()'s id column, an array of ids)
                raise TypeError("delete() takes checkpoint ids as separate arguments: "
                                f"delete(*ids), not a {type(one).__name__} of them")
            _check_which(one)
        with self._exclusive(), _said_as_stopped(
                f"delete of {', '.join(named)}", "the other checkpoints are as they were; "
                "where it is still listed, its deletion may be recorded, which the next gc "
                "completes: pin it to keep it, or delete it again"):
            # (under the lock: the pins checked where no other process can set them)
            self._catch_up()
            ids = list(dict.fromkeys(self._resolve(one) for one in named))
            pinned = [cid for cid in ids if (row := self.catalog.get(cid)) is not None
                      and row.pinned]
            if pinned and not force:
                raise CheckpointInUseError(
                    f"checkpoint{'s' if len(pinned) > 1 else ''} {', '.join(pinned)} "
                    f"{'are' if len(pinned) > 1 else 'is'} pinned: unpin "
                    f"{'them' if len(pinned) > 1 else 'it'} first, or pass force=True"
                    + (" (nothing was deleted)" if len(ids) > 1 else ""))
            try:
                self._drop(ids, whole_store=self._collection_failed or self._deletion_pending())
                self._collection_failed = False
            except (OSError, MemoryError) as exc:  # (StoreError; a pack not mapped, too)
                # after the catalog let them go: deleted all the same, with a warning
                if any(self.catalog.get(cid) is not None for cid in ids):
                    raise
                self._collection_failed = True  # (the next deletion collects the whole store)
                its = "their" if len(ids) > 1 else "its"
                warn(f"checkpoint{'s' if len(ids) > 1 else ''} {', '.join(ids)} "
                     f"{'were' if len(ids) > 1 else 'was'} deleted, but what follows failed "
                     f"({exc}): gc() frees {its} space and labels {its} children later",
                     RuntimeWarning)
        for cid in ids:
            self._notify("delete", cid)
        return ids[0] if not more else ids

    def _nothing_to_delete(self) -> bool:
        """Whether retention can delete nothing, known without a row read: no more
        checkpoints in the store than ``max_to_keep`` keeps (``keep_best`` beside it only
        keeps more), and the store under ``max_bytes`` by the bound a save keeps
        (``_bytes_bound``). Not ``keep_best`` alone, which deletes all but the best.
        (Each save's retention decoded every row of the catalog: 40 ms a save at 500
        checkpoints under a notebook's --keep 1000, which deleted none; a byte budget's
        measured the whole store too, 350 ms a save at 1,000 checkpoints.)"""
        if self.keep_best is not None and self.max_to_keep is None and self.max_bytes is None:
            return False
        if self.max_bytes is not None and \
                (self._bytes_bound is None or self._bytes_bound > self.max_bytes):
            return False
        return self.max_to_keep is None or self.catalog.counts()[1] <= self.max_to_keep

    def _bound_still_known(self) -> int | None:
        """The bound of the store's bytes the last save left (``_bytes_bound``), where
        nothing but this manager's saves can have added bytes since: the catalog not
        changed since (another process's save, a catch-up that read another machine's),
        and the lock not taken since by another (a save killed there left its pack,
        which no catalog lists). Called under the lock, caught up; else None."""
        if self._bytes_bound is None or not self._untouched or \
                self.catalog.generation() != self._bound_generation:
            return None
        return self._bytes_bound

    def _apply_retention(self, protect: set[str], among: AbstractSet[str] | None = None) -> None:
        """Delete what the retention rules let go; the newest, pinned, best and head stay.
        ``among``: the checkpoints the rules count, rank and may delete (the notebook
        layer's, its cell's runs: the store may hold other notebooks'); None, all."""
        if self._nothing_to_delete():
            return
        rows = self.catalog.checkpoints()
        protected = protect | {r.id for r in rows if r.pinned} | {rows[-1].id}
        if self.head:
            protected.add(self.head)
        ours = rows if among is None else [r for r in rows if r.id in among]
        best = set(self._best(ours, self.keep_best)) if self.keep_best else set()
        protected |= best
        # keep_best by a metric no checkpoint it ranks carries (a misspelt one) deletes
        # none: it would keep the newest alone, deleting the best models of the run.
        unranked = self.keep_best is not None and \
            not any(self.metric in r.metrics for r in ours)
        if unranked:
            self._warn_unranked(ours)
        # A damaged manifest stops gc (its chunks may lie in any pack), as does one of a
        # newer format: checkpoints that retention deletes then free no room, and a byte
        # budget would delete them all.
        blocked = sorted(id_of(key) or key for key in self.catalog.damaged()
                         if key.startswith("manifests/"))
        # keep_best alone deletes all but the best; beside a byte budget it only keeps
        # them, and the budget says how many others stay.
        if self.max_to_keep is not None or \
                self.keep_best is not None and self.max_bytes is None and not unranked:
            staying = protected | ({r.id for r in ours[-self.max_to_keep:]}
                                   if self.max_to_keep else set())
            doomed = [r.id for r in ours if r.id not in staying]
            if doomed:
                self._drop(doomed, whole_store=self._collection_failed)
                self._collection_failed = False
                self._retention_dropped.extend(doomed)
        taken = self.stored_bytes() if self.max_bytes is not None else 0
        self._bytes_bound = taken if self.max_bytes is not None else None
        if self.max_bytes is not None and taken > self.max_bytes:
            if blocked:
                self._warn_blocked(blocked)
                return
            # Over the budget, gc frees all it can before a checkpoint goes: a crashed
            # save's orphans, the dead part of every pack, and the deleted deltas under
            # kept chunks (each such chunk stored whole).
            tight = {"compact_below": BUDGET_COMPACT_BELOW, "whole_over": 0}
            self._gc_locked(**tight)
            while (taken := self.stored_bytes()) > self.max_bytes:
                deletable = [row for row in self.catalog.checkpoints()
                             if row.id not in protected and (among is None or row.id in among)]
                if not deletable:
                    break
                oldest = self._oldest_that_may_free(deletable, taken - self.max_bytes)
                self._drop(oldest, **tight)
                self._retention_dropped.extend(oldest)
            self._bytes_bound = taken  # (measured since the last gc)
            if taken > self.max_bytes and not self._told_over_budget:
                # (said once per manager, as _warn_blocked: every save would say it again)
                self._told_over_budget = True
                kept = self.catalog.checkpoints()

                def why(row: CheckpointRow) -> str:
                    """Why retention keeps a checkpoint it left over the budget."""
                    for reason, holds in (("newest", row is kept[-1]), ("pinned", row.pinned),
                                          (f"best by {self.metric}", row.id in best),
                                          ("the head", row.id == self.head),
                                          ("just saved", row.id in protect)):
                        if holds:
                            return reason
                    return "another run's"  # (not among those it may delete)

                held = [f"{row.id} ({why(row)}, {row.stored_bytes:,} bytes)"
                        for row in reversed(kept)]
                warn(f"the store at {self.store.url} takes {taken:,} bytes, over its byte "
                     f"budget (max_bytes={self.max_bytes:,}), and retention deletes nothing "
                     f"more: it keeps {', '.join(held[:6])}"
                     f"{f' and {len(held) - 6} more' if len(held) > 6 else ''}; raise max_bytes, "
                     "or unpin or delete checkpoints"
                     + (" (or lower keep_best)" if self.keep_best else ""), RuntimeWarning)
        elif blocked and len(rows) > len(self.catalog.checkpoints()):
            self._warn_blocked(blocked)

    def _warn_unranked(self, rows: list[CheckpointRow]) -> None:
        """Say, once per manager, that ``keep_best`` keeps every checkpoint for want of
        its metric, where the saves log others: a typo's, which no later error names."""
        # (only epoch-end saves tell: a mid-epoch one logs the training's metrics alone,
        # and the ranked validation metric comes with the epoch's end)
        logged = {name for r in rows if r.batch_idx is None for name in r.metrics}
        if not logged or self._told_unranked:
            return
        self._told_unranked = True
        warn(f"keep_best={self.keep_best} ranks by {self.metric!r}, which no checkpoint "
             f"logs, so retention deletes none by it until one does; "
             f"{metrics_logged(logged)}{_did_you_mean(str(self.metric), logged)}",
             RuntimeWarning)

    def _oldest_that_may_free(self, deletable: list[CheckpointRow], excess: int) -> list[str]:
        """The ids of the fewest of ``deletable`` (oldest first) that deleted together may
        free ``excess`` bytes, in a store a tight gc has just collected. Counted as freed:
        their manifests, and of each pack that loses a chunk (no kept checkpoint refers to
        it, or it is a delta whose base goes, to be stored whole elsewhere) all but the
        chunks that stay in it; the whole copies count as nothing. That is never less than
        what they free, so none of them is one that deleting the oldest one at a time (a
        gc after each, as retention once did: a whole-store gc per checkpoint) would keep;
        the budget then measures the store, and takes more where it is still over."""
        if deletable[0].stored_bytes >= excess:  # (a save's retention, mostly: no estimate)
            return [deletable[0].id]
        chunks = {c.digest: c for c in self.catalog.all_chunks()}
        refs = {row.id: self.catalog.refs(row.id) & chunks.keys()
                for row in self.catalog.checkpoints()}
        holders = Counter(digest for held in refs.values() for digest in held)
        stacked: dict[str, list[str]] = {}  # a chunk's digest: the deltas on it
        staying: Counter[str] = Counter()  # a pack: the bytes of its referred-to chunks
        for chunk in chunks.values():
            if chunk.base is not None:
                stacked.setdefault(chunk.base, []).append(chunk.digest)
            if holders[chunk.digest]:
                staying[chunk.pack] += chunk.length
        out: set[str] = set()  # chunks that leave their pack
        touched: set[str] = set()  # packs that lose a chunk
        freed = 0

        def leave(digest: str) -> None:
            nonlocal freed
            chunk = chunks[digest]
            if digest in out:
                return
            out.add(digest)
            if chunk.pack not in touched:
                touched.add(chunk.pack)
                with contextlib.suppress(FileNotFoundError):
                    freed += self.store.size(chunk.pack) - staying[chunk.pack]
            staying[chunk.pack] -= chunk.length
            freed += chunk.length

        for count, row in enumerate(deletable, 1):
            with contextlib.suppress(FileNotFoundError):
                freed += self.store.size(manifest_key(row.id))
            for digest in refs[row.id]:
                holders[digest] -= 1
                if not holders[digest]:
                    leave(digest)
                    for above in stacked.get(digest, ()):
                        if holders[above]:
                            leave(above)
            if freed >= excess:
                break
        return [row.id for row in deletable[:count]]

    def _warn_blocked(self, damaged: list[str]) -> None:
        """Say once per manager that retention frees no room while the store holds a
        damaged checkpoint, or one of a newer format (a byte budget then deletes none)."""
        if self._told_blocked:
            return
        self._told_blocked = True
        why = _damaged_checkpoints(self.catalog)
        newer = [cid for cid in damaged if is_newer(why.get(cid, ""))]
        broken = [cid for cid in damaged if cid not in newer]
        if broken:
            warn(f"the store at {self.store.url} holds damaged checkpoints ({', '.join(broken)}"
                 "), so gc() frees no room and a byte budget deletes nothing: verify() says "
                 "what is wrong with them; put back what they miss, or delete their manifests "
                 "by hand", RuntimeWarning)
        else:
            warn(f"the store at {self.store.url} holds checkpoints written by a newer ckpt_nb "
                 f"({', '.join(newer)}), whose chunks this one cannot tell, so gc() frees no "
                 "room and a byte budget deletes nothing: upgrade ckpt_nb (pip install -U "
                 "ckpt_nb)", RuntimeWarning)

    def _drop(self, ids: Sequence[str], *, whole_store: bool = True, **gc_options: Any) -> None:
        """Delete checkpoints: their children's labels first, then a record of the
        deletion in the store (written whole and durable: the deletion is made), then
        the catalog's commit, then gc, which deletes their manifests, then the record.
        A rebuild leaves out what a record names, so a catalog read again (or rebuilt)
        after a kill before that gc does not bring the checkpoints back; a kill before
        the catalog's commit leaves them listed until the next gc (or read again)
        completes the deletion. Labels that cannot be written do not stop it: their error
        is raised once it is made, and gc() writes them later. Not ``whole_store`` (a
        save's retention), gc collects only what these checkpoints leave (``Dropped``)."""
        if not ids:
            return
        unlabelled = None
        try:
            self._label_heirs(set(ids))
        except OSError as exc:  # (StoreError too)
            unlabelled = exc
        # A pinned one (delete(force=True)) is unpinned first: a record naming a pinned
        # checkpoint is one a later pin withdrew (``deletion_records``).
        unpinned = [cid for cid in ids if (row := self.catalog.get(cid)) and row.pinned]
        for cid in unpinned:
            self._label(cid, pinned=False)
        record = new_deletion_key()
        dropped = None if whole_store else Dropped(
            ids, set().union(*(self.catalog.refs(cid) for cid in ids)), record)
        try:
            self.store.put(record, json.dumps({"ids": list(ids)}).encode())
            self._forget(ids)
        except BaseException:
            # (not deleted: the pins come back first, which withdraw the record even where
            # it cannot be deleted now; then the record goes, so that no later gc
            # completes a deletion that failed. Where the catalog did forget them, it
            # stays, for a rebuild)
            listed = False
            with contextlib.suppress(Exception):
                listed = self.catalog.get(ids[0]) is not None
            if listed:
                for cid in unpinned:
                    with contextlib.suppress(Exception):
                        self.catalog.update(cid, pinned=True)
                    with contextlib.suppress(Exception):
                        self._label(cid, pinned=True)
                with contextlib.suppress(Exception):
                    self.store.delete(record)
            raise
        if unlabelled is not None:
            raise unlabelled
        self._gc_locked(dropped=dropped, **gc_options)

    def _forget(self, ids: Sequence[str]) -> None:
        """Take deleted checkpoints out of the catalog (their deletion is recorded)."""
        heir = self._kept_ancestor(self.head, set(ids)) if self.head in ids else self.head
        self.catalog.delete_checkpoints(ids)
        for cid in ids:
            self._manifests.pop(cid, None)
        # The live objects hold the deleted head's state: the next save descends from
        # its nearest kept ancestor, as the head's children do now.
        self.head = heir

    def _label_heirs(self, going: set[str]) -> None:
        """Label the checkpoints whose parent is ``going`` with the parent the deletion
        gives them (the nearest kept ancestor), where a rebuilt catalog would not guess it
        (see ``_rebuild``): a branch's first checkpoint, whose fork point goes. Before the
        deletion is recorded, so that a rebuild after it never makes that one a root; a
        label written for a deletion that then failed names a parent used only once its
        own is gone, when it is the one the catalog gives."""
        rows = [row for row in self.catalog.checkpoints() if row.id not in going]
        guesses = guessed_parents((row.id, row.branch) for row in rows)
        for row in rows:
            if row.parent in going:
                parent = self._kept_ancestor(row.parent, going)
                if parent != guesses[row.id]:
                    self._label(row.id, parent=parent)

    def _withdraw_deletion(self, cid: str) -> None:
        """Delete the records of deletions that name ``cid``, which the catalog lists: cut
        short before the catalog's commit, they are withdrawn by a pin (a later gc would
        complete them). Only where this machine's lock covers every writer: elsewhere a
        catalog caught up lists no recorded checkpoint, but another machine's record may
        have come since."""
        if not self.store.locked_everywhere:
            return
        records, _ = deletion_records(self.store)
        for key, ids in records.items():
            if cid in ids:
                self.store.delete(key)

    def _kept_ancestor(self, cid: str | None, going: set[str]) -> str | None:
        """The nearest ancestor of ``cid`` that is not ``going``."""
        seen: set[str] = set()
        while cid is not None and cid in going and cid not in seen:
            seen.add(cid)
            row = self.catalog.get(cid)
            cid = row.parent if row is not None else None
        return None if cid in going else cid

    def stored_bytes(self) -> int:
        """Bytes the store's packs and manifests take (a listing of each folder, with its
        sizes)."""
        return sum(self.store.sizes("packs").values()) + \
            sum(self.store.sizes("manifests").values())

    # -- garbage collection ---------------------------------------------------------------
    def gc(self, *, compact_below: float = 0.5,
           progress: ProgressFn | None = None) -> GCReport:
        """Reclaim what no checkpoint needs: orphans of crashed saves, dead chunks.

        A pack whose live bytes fall under ``compact_below`` of its size is
        rewritten with only the live chunks. Safe to interrupt at any point.
        ``progress(done, total)`` follows the packs, each read or compacted. On a full
        disk it frees what takes no room to free, and warns of the rest.
        """
        if isinstance(compact_below, bool) or not isinstance(compact_below, (int, float)) \
                or not compact_below >= 0:
            raise ValueError(f"compact_below must be a fraction of a pack's size, 0 or more "
                             f"(0 compacts none, above 1 every pack), not {compact_below!r}")
        with self._exclusive(), _said_as_stopped(
                "gc", "every checkpoint is as it was but one a delete() that did not finish "
                "had recorded as deleted, which a gc completes (a gc may stop at any point)"):
            self._catch_up()
            report = self._gc_locked(compact_below, repair_indexes=True, partial=True,
                                     progress=progress)
            # A run's ends (the notebook layer's runs/<id>.json) matter while a checkpoint
            # it names is kept: one that does not read stays, as damage does.
            kept = {row.id for row in self.catalog.checkpoints()}
            for key in filter(is_run_key, self.store.list("runs")):
                with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
                    ends = json.loads(self.store.get(key))["ends"]
                    if not kept & {cid for end in ends for cid in (end["end"], *end["before"])}:
                        report.bytes_freed += self.store.size(key)
                        self.store.delete(key)
            try:
                self._label_rejoined()
            except OSError as exc:  # (StoreError too)
                warn(f"gc could not label checkpoints whose parent was deleted "
                     f"({exc}): a rebuilt catalog would give them the wrong parent "
                     "until gc() runs again", RuntimeWarning)
            return report

    def _gc_locked(self, compact_below: float = 0.5, *, repair_indexes: bool = False,
                   whole_over: int = MAX_DEPTH, partial: bool = False,
                   progress: ProgressFn | None = None, dropped: Dropped | None = None
                   ) -> GCReport:
        """Collect what no checkpoint needs; with ``repair_indexes`` (an explicit gc(),
        not the one each retention deletion runs) also read every pack's own index and
        rewrite the packs whose index is damaged. A rewrite that fails for want of room
        raises, unless ``partial`` (then it warns, and what it would have freed stays):
        retention over a byte budget must stop there, not delete checkpoints instead.
        With ``dropped``, only what a deletion just made leaves (``_collect_dropped``)."""
        self._bytes_bound = None  # (a rewrite may store a chunk whole: measured again)
        if dropped is not None:
            return self._collect_dropped(dropped, compact_below, whole_over)
        swept, swept_bytes = self.store.sweep_temporaries()
        report = GCReport(temporaries_deleted=swept, bytes_freed=swept_bytes)
        damaged = self.catalog.forget_damaged_gone(self.store.has)
        report.damaged_kept = len(damaged)
        # A recorded deletion that the catalog's commit did not follow (killed between
        # them) is completed first: the store says those checkpoints are deleted.
        # One naming a checkpoint pinned since is withdrawn: the pin wins (see
        # ``deletion_records``).
        rows = self.catalog.checkpoints()
        pins = {row.id for row in rows if row.pinned}
        records, _ = deletion_records(self.store, pins.__contains__)  # (unread ones stay)
        if self.store.locked_everywhere:
            for key in deletion_records(self.store, lambda _: False)[0].keys() - records:
                self.store.delete(key)
        deleted = {cid for ids in records.values() for cid in ids}
        unfinished = [row.id for row in rows if row.id in deleted]
        if unfinished:
            with contextlib.suppress(OSError):  # (StoreError too: gc() labels them later)
                self._label_heirs(set(unfinished))
            self._forget(unfinished)
        # What frees space without taking any goes first (on a full disk, a compaction
        # fails): the deleted checkpoints' manifests and labels, then the dead packs.
        # (only files of the names ckpt_nb makes: any other is no orphan of a save)
        # Where other machines write with no lock across them, a young one that this
        # catalog never had may be a save in flight there (``GRACE_SECONDS``).
        known = {r.id for r in rows} - deleted
        times = {**(self.store.modified("manifests") or {}),
                 **(self.store.modified("labels") or {})}
        recent = young(times)
        keys = list(times or [*self.store.list("manifests"), *self.store.list("labels")])
        swept: set[str] = set()
        for key in keys:
            cid = id_of(key)
            if cid is not None and cid not in known and key not in damaged and \
                    (key not in recent or cid in deleted or self.catalog.was_deleted(cid)):
                report.bytes_freed += self.store.size(key)
                self.store.delete(key)
                swept.add(key)
                report.manifests_deleted += key.startswith("manifests/")
        # A deletion's record goes once its checkpoints' manifests have (before, a rebuild
        # would have brought them back).
        left = {id_of(key) for key in keys if key.startswith("manifests/") and key not in swept}
        for key, ids in records.items():
            if not ids & left:
                self.store.delete(key)
        if any(key.startswith("manifests/") for key in damaged):
            # A damaged manifest's chunks are unknown, and may lie in any pack: none is
            # collected until it is dealt with (deleted by hand, once nothing in it is
            # wanted), so that what is whole of that checkpoint stays in the store. (The
            # deleted checkpoints' manifests went above: left, a catalog read again from
            # the store would bring them back, and retention would keep none.)
            return report
        chunks = {c.digest: c for c in self.catalog.all_chunks()}
        named = self.catalog.packs()
        live = self.catalog.refs() & set(chunks)
        try:
            report.chunks_rewritten = self._rewrite_whole(chunks, live, whole_over)
        except OSError as exc:  # (StoreError too) out of space: the chains stay as they are
            if not partial:
                raise
            warn(f"gc could not store long delta chains whole ({exc}): run gc() "
                 "again once there is room", RuntimeWarning)
        frontier = list(live)
        while frontier:
            base = chunks[frontier.pop()].base
            if base and base not in live and base in chunks:
                live.add(base)
                frontier.append(base)
        dead = set(chunks) - live
        if dead:
            try:  # (before their packs go: a save must never find a chunk whose pack is gone)
                self.catalog.drop_chunks(dead)
            except OSError as exc:  # (StoreError too) SQLite takes room to delete rows
                if not partial:
                    raise
                warn(f"gc could not update the catalog ({exc}), so no pack could "
                     "go: free some room outside the store, then run gc() again",
                     RuntimeWarning)
                return report
            report.chunks_dropped = len(dead)
        by_pack: dict[str, list[ChunkRow]] = {}
        for digest in live:
            by_pack.setdefault(chunks[digest].pack, []).append(chunks[digest])
        # (a young pack the catalog does not name may be a save in flight elsewhere: a
        # rebuild leaves such packs out of it)
        pack_times = self.store.modified("packs")
        recent = young(pack_times) - named
        stored = list(self.store.list("packs") if pack_times is None else pack_times)
        packs = [key for key in stored if is_pack_key(key) and key not in damaged]
        for key in sorted(by_pack.keys() - set(stored)):
            self._pack_found_damaged(key, "is missing from the store", "the next save that "
                                     "needs its chunks stores them again")
        for key in packs:
            if key not in by_pack and key not in recent:
                report.bytes_freed += self.store.size(key)
                self.store.delete(key)
                report.packs_deleted += 1
        for done, key in enumerate(packs, 1):
            if progress is not None:
                progress(done - 1, len(packs))
            members = by_pack.get(key)
            if not members:
                continue
            size = self.store.size(key)
            end = max(c.offset + c.length for c in members)
            if size < end:  # (kept, not compacted: what is left in it may be recovered)
                self._pack_found_damaged(
                    key, _cut_short(size, end),
                    "gc() keeps it, and the next save that needs its chunks stores them again")
                report.damaged_kept += 1
                continue
            if sum(c.length for c in members) < compact_below * size or \
                    repair_indexes and self._index_problem(key) is not None:
                if not self._compact(key, members, size, report, partial):
                    break
        if progress is not None:
            progress(len(packs), len(packs))
        return report

    def _collect_dropped(self, dropped: Dropped, compact_below: float,
                         whole_over: int) -> GCReport:
        """What a deletion just made leaves, collected in the order gc collects (the
        deleted checkpoints' manifests and labels, then their record, then the chunks,
        then the packs): work in proportion to the deleted checkpoints, not to the
        store. A chunk goes where no kept checkpoint refers to it and none that stays is
        stored as a delta on it; a pack goes with its last chunk, and one left under
        ``compact_below`` of its size is compacted. A kill at any point leaves what gc()
        collects: it alone sweeps a killed save's files and what older deletions left."""
        report = GCReport()
        damaged = self.catalog.damaged()
        for cid in dropped.ids:
            for key in (manifest_key(cid), label_key(cid)):
                if key in damaged:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    size = self.store.size(key)
                    self.store.delete(key)
                    report.bytes_freed += size
                    report.manifests_deleted += key.startswith("manifests/")
        if not any(manifest_key(cid) in damaged for cid in dropped.ids):
            self.store.delete(dropped.record)  # (once their manifests have gone: see gc)
        if any(key.startswith("manifests/") for key in damaged):
            return report  # (a damaged manifest's chunks may lie in any pack: see gc)
        # The chunks they referred to and the bases under those; of them, those no
        # checkpoint refers to now, and the chunks stacked on those.
        chunks = self.catalog.chunks(dropped.held)
        below = {row.base for row in chunks.values() if row.base is not None}
        while below - chunks.keys():
            found = self.catalog.chunks(below - chunks.keys())
            chunks.update(found)
            below = {row.base for row in found.values() if row.base is not None}
        unreferenced = set(chunks) - self.catalog.referenced(chunks)
        while True:  # (up through chunks kept only as bases: K on B on a dropped chunk)
            above = [row for row in self.catalog.stacked_on(unreferenced)
                     if row.digest not in unreferenced]
            held = self.catalog.referenced(row.digest for row in above)
            bases_only = {row.digest: row for row in above if row.digest not in held}
            if not bases_only:
                break
            chunks.update(bases_only)
            unreferenced |= bases_only.keys()
        # As gc does: kept chunks stacked on more than ``whole_over`` of those are stored
        # whole, so that those can go (saves with a long ``full_every``).
        referenced = (set(chunks) - unreferenced) | held  # (every chunk above is held)
        rows = {**chunks, **{row.digest: row for row in above}}
        was_in = {digest: row.pack for digest, row in rows.items()}
        report.chunks_rewritten = self._rewrite_whole(rows, referenced, whole_over)
        touched = {was_in[digest] for digest, row in rows.items()
                   if row.pack != was_in[digest]}  # (the packs the chunks stored whole left)
        if report.chunks_rewritten:
            above = [row for row in self.catalog.stacked_on(unreferenced)
                     if row.digest not in unreferenced]
        # The dead: those that no chunk but a dead one is stacked on.
        dead = set(unreferenced)
        needed = {row.base for row in above} & dead
        while needed:  # (a chunk needed as a base keeps its own base too)
            dead -= needed
            needed = {chunks[digest].base for digest in needed} & dead
        if dead:
            self.catalog.drop_chunks(dead)  # (before their packs go: see gc)
            report.chunks_dropped = len(dead)
        for key in sorted((touched | {chunks[digest].pack for digest in dead}) - damaged.keys()):
            members = self.catalog.chunks_in_pack(key)
            try:
                size = self.store.size(key)
            except FileNotFoundError:
                continue
            if not members:
                self.store.delete(key)
                report.bytes_freed += size
                report.packs_deleted += 1
            elif sum(c.length for c in members) < compact_below * size:
                self._compact(key, members, size, report, partial=False)
        return report

    def _compact(self, key: str, members: list[ChunkRow], size: int, report: GCReport,
                 partial: bool) -> bool:
        """Rewrite pack ``key`` (``size`` bytes) with only ``members``, then delete it;
        False where it stopped for want of room (``partial``: it warns; else it raises),
        the pack left as it was."""
        moved = None
        try:
            moved = self._compacted(key, members)
            if moved is None:
                return True
            self.catalog.move_chunks(moved)
        except OSError as exc:  # (StoreError too) out of space: what is left stays
            if moved:  # (written, but the catalog did not take it: an orphan)
                with contextlib.suppress(OSError):
                    self.store.delete(moved[0].pack)
            if not partial:
                raise
            warn(f"gc stopped compacting at {key}, which stays as it was "
                 f"({exc}): run gc() again once there is room",
                 RuntimeWarning)
            return False
        self.store.delete(key)
        report.packs_compacted += 1
        report.bytes_freed += size - sum(c.length for c in moved)
        return True

    def _compacted(self, key: str, members: list[ChunkRow]) -> list[ChunkRow] | None:
        """Copy a pack's live chunks into a new pack; their new rows, or None (and the
        new pack dropped) where a blob does not fit its record: the catalog or the pack
        is damaged, and the original stays for verify() to name and a rebuild to read."""
        views = self._pack_views({row.digest: row for row in members})
        try:
            with write_pack(self.store) as pack:
                for row in sorted(members, key=lambda c: c.offset):
                    blob = self._blob(_checked_row(row), views)
                    if not codec.matches(blob, row.digest, row.raw_len, row.base):
                        raise CorruptCheckpointError(f"chunk {row.digest[:12]} does not fit "
                                                     "its record")
                    if isinstance(blob, np.ndarray):  # the reused buffer: the pack writes later
                        blob = blob.copy()
                    pack.add(row.digest, memoryview(blob), row.raw_len, row.base, row.depth)
        except CorruptCheckpointError as exc:
            warn(f"gc left {key} as it was: {exc} (verify() names the checkpoints "
                 "it touches)", RuntimeWarning)
            return None
        return pack.rows

    def _rewrite_whole(self, chunks: dict[str, ChunkRow], referenced: set[str],
                       over: int) -> int:
        """Store whole the chunks that checkpoints refer to and that are stacked on more
        than ``over`` chunks no checkpoint refers to, which can then go. ``chunks`` gets
        the new rows; returns how many were rewritten.

        Saves stack no more than ``MAX_DEPTH`` deltas (``SavePipeline``), gc's usual
        ``over``: this frees the deleted checkpoints' deltas under a chunk stacked
        higher (a store saved with a long ``full_every``, or before saves were
        bounded), which would otherwise stay as long as the chunk does, and be decoded
        at each of its restores. A byte budget asks for all of them (``over=0``).
        """
        def deleted_below(digest: str) -> int:
            n, base = 0, chunks[digest].base
            while base is not None and base not in referenced and base in chunks and \
                    n <= over:
                n, base = n + 1, chunks[base].base
            return n

        doomed = sorted((d for d in referenced if deleted_below(d) > over),
                        key=lambda d: (chunks[d].pack, chunks[d].offset))
        if not doomed:
            return 0
        read: dict[str, ChunkRow] = {}  # the doomed chunks and their chains
        for digest in doomed:
            at: str | None = digest
            while at is not None and at in chunks and at not in read:
                read[at] = chunks[at]
                at = chunks[at].base
        views = self._pack_views(read)
        self._stamp_format(_CKB2_FORMAT)
        with write_pack(self.store) as pack:
            for digest in doomed:
                try:
                    raw = _raw_buffer(chunks[digest])
                    itemsize = codec.info(self._decode_chunk(chunks[digest], raw, chunks,
                                                             views)).itemsize
                except CorruptCheckpointError:
                    continue  # its chain stays, for verify() to name
                parts = codec.encode_parts(raw, itemsize, name=digest, codec=self.codec,
                                           level=self.level)
                pack.add(digest, parts, len(raw), None, 0)
        self.catalog.move_chunks(pack.rows)
        chunks.update((row.digest, row) for row in pack.rows)
        return len(pack.rows)

    # -- interop ---------------------------------------------------------------------------
    def export(self, which: str, path: str | bytes | os.PathLike[Any], *,
               trust_pickle: bool = False, progress: ProgressFn | None = None,
               only: str | None = None) -> Path:
        """Write a checkpoint as a .pt (``torch.load(weights_only=True)``) or .safetensors
        file; ``progress(done, total)`` follows the reading of its chunks.

        A .safetensors file names each tensor by its path (``model/weight``,
        ``optimizer/state/0/exp_avg``); ``only="model"`` writes that object's state alone,
        under its own keys, so that ``model.load_state_dict(load_file(path))`` (or
        ``torch.load``) takes it. An existing file (or link) at ``path`` is replaced
        atomically; a read-only one is refused (PermissionError).
        """
        from ._interop import check_export_path, write_file

        check_flag("trust_pickle", trust_pickle)
        _check_file_path("export", path)
        check_export_path(path)
        return write_file(self._read_for_export(which, trust_pickle=trust_pickle,
                                               progress=progress), path, only=only)

    def _read_for_export(self, which: str, *, trust_pickle: bool = False,
                        progress: ProgressFn | None = None,
                        skipped: list[str] | None = None) -> Checkpoint:
        """``load`` for an export (``export``'s first step): the export's own warning names
        each pickle it leaves out of the file and how to keep it, so this read says none.
        ``skipped``: as ``_load_verified`` takes it, for "latest"."""
        token = _EXPORT_READING.set(True)
        try:
            if which == "latest":  # (never a file's name)
                return self._load_verified(which, trust_pickle, progress, (), skipped)
            return self.load(which, trust_pickle=trust_pickle, progress=progress)
        finally:
            _EXPORT_READING.reset(token)

    def import_file(self, path: str | os.PathLike[str], *, trust_pickle: bool = False,
                    note: str | None = None) -> str:
        """Bring a torch.save (or safetensors) checkpoint into the store; returns its id."""
        from ._interop import read_file

        check_flag("trust_pickle", trust_pickle)
        _check_file_path("import_file", path)
        ck = read_file(path, trust_pickle=trust_pickle)
        holders = {name: _StateHolder(state) for name, state in ck.state.items()}
        extra, rng = dict(ck.extra), ck.rng
        if rng is not None and capture.rng_problem(rng) is not None:  # (kept, but not as RNG state)
            extra.setdefault("rng", rng)
            rng = None
        flat = self.capture(holders, metrics=ck.metrics, extra=extra, rng=rng or False)
        # (the holders' class says nothing of the state's: a file does not say it either)
        flat.skeleton["types"] = {name: ck.kinds.get(name, "imported") for name in holders}
        return self.save_state(flat, epoch=ck.epoch, step=ck.step, batch_idx=ck.batch_idx,
                               metrics=ck.metrics, strategy="full", parent=None,
                               note=note if note is not None else f"imported from {path}")


_DAMAGED_KEPT = ("its manifest stays in the store, and gc() leaves it: put back what is "
                 "missing (a backup, an earlier object version), or delete the manifest "
                 "by hand if the checkpoint is not wanted")


def _unread(exc: StoreError, bad: Mapping[str, list[str]],
            packs: Mapping[str, str] | None = None) -> StoreError:
    """verify()'s error where the store failed to give what it read: what it had found
    damaged by then, with it (a report of the rest would call unread ones checked)."""
    found = [f"{cid}: {problems[0]}" for cid, problems in bad.items()] + \
        [f"{key}: {problem}" for key, problem in (packs or {}).items()]
    known = (f"found damaged before it: {'; '.join(found)}; the rest was not checked"
             if found else "nothing is known to be damaged")
    return StoreError(f"verify failed, as the store could not be read: {exc}; {known}: fix "
                      "what the error names (a server down: wait until it answers), then "
                      "run it again")


_NOT_CHECKED = ("written by a newer ckpt_nb, not checked: upgrade ckpt_nb (pip install -U "
                "ckpt_nb) to verify it")


# What to do with a store opened to read only on a full disk, to save or delete again.
_FREE_ROOM_TO_WRITE = ("; free some room on it, then open the store again (a new manager) to "
                       "change it")

# What to do where an object store's catalog cannot be cached on this machine.
_CACHE_ELSEWHERE = ("set XDG_CACHE_HOME to a folder this process can write, or give the "
                    "manager catalog=PATH")


def _unwritable(folder: Path) -> str:
    """Why ``folder`` cannot be made or written ("" where it can): made here if missing."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    return "" if os.access(folder, os.W_OK) else "not writable"


def _missed_writes(last: str, mine: str) -> bool:
    """Whether the store may hold writes that the catalog marked ``mine`` has not seen,
    by the mark the lock file's last holder left (``_catalog_mark``): another catalog's,
    or this one's as it was after saves, deletes or pin and note changes that it no
    longer shows (a copy of it put back since). A write in flight only moves the catalog
    on from the mark."""
    last_id, _, last_counts = last.partition("@")
    my_id, _, my_counts = mine.partition("@")
    if last_id != my_id:
        return True
    form = r"(\d+):(\d+)(?::(\d+))?"
    counts = re.fullmatch(form, last_counts), re.fullmatch(form, my_counts)
    if counts[0] is None:  # (a ckpt_nb before counts wrote last: what it saw is unknown)
        return True
    if counts[1] is None:
        return False
    (last_ever, last_now, last_labels), (my_ever, my_now, my_labels) = (
        [int(n or 0) for n in c.groups()] for c in counts)
    # (more saves, else as many and fewer checkpoints left, else more label changes)
    return (last_ever, -last_now, last_labels) > (my_ever, -my_now, my_labels)


@contextlib.contextmanager
def _said_as_stopped(work: str, left: str) -> Iterator[None]:
    """A store's failure during ``work`` (under its lock: taking the lock says its own
    failure) said as that work's, with what it leaves and what to do: the store's own
    error names only the file it was at ("listing deleted at ... failed"). The catalog's
    own say what to do already."""
    try:
        yield
    except StoreError as exc:
        if isinstance(exc, DamagedCatalog) or isinstance(exc.__cause__, sqlite3.Error):
            raise  # (the catalog's own: it says what to do)
        raise StoreError(f"{work} stopped, as the store could not be read or written: {exc}; "
                         f"{left}: fix what the error names (a server down: wait until it "
                         "answers), then run it again") from exc


def _committed(catalog: Catalog) -> set[str]:
    """The ids a catalog knows were committed: a rebuild that finds one of them not whole
    keeps it as damaged (its pack was deleted), not as a killed save's leftover."""
    return {row.id for row in catalog.checkpoints()} | set(_damaged_checkpoints(catalog))


def _damaged_checkpoints(catalog: Catalog) -> dict[str, str]:
    """The checkpoints whose manifest a rebuild found damaged (id -> what is wrong)."""
    return {cid: why for key, why in catalog.damaged().items()
            if key.startswith("manifests/") and (cid := id_of(key)) is not None}


def _cut_short(size: int, end: int) -> str:
    """What is wrong with a pack of ``size`` bytes whose chunks end at ``end``."""
    return f"was cut short ({size} bytes, where its chunks end at byte {end})"


def _raw_buffer(row: ChunkRow) -> np.ndarray:
    """Memory for a chunk's raw bytes, once its catalog row's size is one a save makes."""
    if not 0 <= row.raw_len <= _LARGEST_CHUNK_READ:
        raise CorruptCheckpointError(f"chunk {row.digest[:12]} in {row.pack}: the catalog "
                                     f"gives it {row.raw_len} bytes, more than any chunk")
    return np.empty(row.raw_len, dtype=np.uint8)


# What decoding a state raises where its record, or (with trust_pickle) a pickle, is at fault.
_RECORD_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError,
                  OverflowError)


def _kinds(skeleton: Mapping[str, Any]) -> dict[str, str]:
    """What kind of object each saved name was, as a manifest's state records it."""
    kinds = skeleton.get("types") or {}
    if not isinstance(kinds, dict) or not all(isinstance(v, str) for v in kinds.values()):
        raise TypeError(f"its types are {type(kinds).__name__}, not names of kinds")
    return dict(kinds)


def _param_names(skeleton: Mapping[str, Any]) -> dict[str, SlotNames]:
    """Each optimizer's parameter names as a manifest's state records them (none before
    they were recorded); one not laid out as names is left out, and its state goes to
    parameters by position, as it did before."""
    recorded = skeleton.get("param_names")
    if not isinstance(recorded, dict):
        return {}
    return {name: groups for name, groups in recorded.items()
            if isinstance(groups, list) and all(isinstance(names, list) and all(
                n is None or isinstance(n, str) for n in names) for names in groups)}


def _checked_row(row: ChunkRow) -> ChunkRow:
    """A chunk's catalog row, once it is one a save writes."""
    problem = chunk_row_problem(row)
    if problem is not None:
        raise CorruptCheckpointError(
            f"chunk {str(row.digest)[:12]}: the catalog's record of it is damaged ({problem}): "
            "move catalog.sqlite aside, and the store's own files rebuild it")
    return row


_collector_lock = threading.Lock()
# The threads of the saves running with automatic collection paused, one entry a save (a
# child forked meanwhile keeps its forking thread's alone: the others are not in it).
_collector_pausers: list[int] = []
_collector_threshold = 0  # automatic collection's first threshold before the pause


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off while a save runs: a save of tens of thousands of
    tensors makes objects enough to set off several full collections of the whole heap
    (half its time, at 60,000 tensors), where after it one runs at most. Saves at once
    (a notebook's background one, another thread's) share one pause. It pauses by the
    first threshold, not ``gc.disable()``: a ``gc.disable()`` or ``gc.enable()`` of the
    user's, before the save or during it, stays as the user left it."""
    global _collector_threshold
    with _collector_lock:
        if not _collector_pausers:
            _collector_threshold, *older = gc.get_threshold()
            gc.set_threshold(0, *older)
        _collector_pausers.append(threading.get_ident())
    try:
        yield
    finally:
        with _collector_lock:
            _collector_pausers.remove(threading.get_ident())
            if not _collector_pausers:
                _resume_collector()


def _resume_collector() -> None:
    """Automatic collection back at the threshold the pause found (one the user set
    during the pause stays)."""
    threshold, *older = gc.get_threshold()
    if threshold == 0:
        gc.set_threshold(_collector_threshold, *older)


def _collector_after_fork_in_child() -> None:
    """A child forked while another thread saved (a DataLoader's worker) has no thread
    to end that save's pause: without this, it never collected a cycle in its life."""
    global _collector_lock
    _collector_lock = threading.Lock()
    forking = threading.get_ident()
    if _collector_pausers and forking not in _collector_pausers:
        _resume_collector()
    _collector_pausers[:] = [thread for thread in _collector_pausers if thread == forking]


os.register_at_fork(after_in_child=_collector_after_fork_in_child)


def _check_chain(row: ChunkRow, above: AbstractSet[str]) -> None:
    """Refuse a chunk whose delta bases lead back to itself (a damaged catalog): its
    decoding would never end."""
    if row.base is not None and (row.base == row.digest or row.base in above):
        raise CorruptCheckpointError(f"chunk {row.digest[:12]} in {row.pack}: its delta "
                                     "bases go round in a loop")


# Of the groups a restore decodes into, the arena serves the one it copies into live
# tensors, the largest other and those of at least this size; smaller ones get memory of
# their own from malloc (warm too), leaving the arena's few slots to the large ones.
_ARENA_SMALLEST = 64 << 10


def _arena(sizes: list[int], groups: list[int] | None = None) -> list[torch.Tensor]:
    """Uint8 buffers of these sizes, 64-byte aligned views of one allocation per group
    (``groups[i]``: storage i's, from ``_storage_groups``; all in one where None), the
    last restores' memory where nothing refers to it any more (``RESTORE_ARENA``). A
    view that outlives the restore (an optimizer's state, a value of
    ``Checkpoint.extra``) holds its own group's memory alone: in one allocation, a
    0.3 MiB optimizer state held a 1 GiB ``extra`` value for as long as it lived.

    Groups are taken from the smallest up, so that the arena keeps the largest.
    NumPy asks the kernel for huge pages on a big allocation and torch does
    not: first-touch page faults of ``torch.empty`` cost more than decoding.
    """
    groups = groups if groups is not None else [1] * len(sizes)
    offsets, totals = [], dict.fromkeys(groups, 0)
    for group, size in zip(groups, sizes):
        offsets.append(totals[group])
        totals[group] += -(-size // 64) * 64
    kept = [(total, group) for group, total in totals.items() if group != 0 and total]
    largest_kept = max(kept)[1] if kept else None
    arenas = {group: RESTORE_ARENA.take(total, long_lived=group != 0)
              if group in (0, largest_kept) or total >= _ARENA_SMALLEST
              else np.empty(total, dtype=np.uint8)
              for total, group in sorted((t, g) for g, t in totals.items() if t)}
    # An empty storage gets none of the arena's addresses: at the next storage's, two
    # tensors of different dtypes "view the same data" to torch.save, which refuses.
    return [torch.from_numpy(arenas[group][o : o + n]) if n
            else torch.empty(0, dtype=torch.uint8)
            for group, o, n in zip(groups, offsets, sizes)]


def _storage_groups(manifest: Mapping[str, Any], copied: AbstractSet[str]) -> list[int]:
    """The allocation each storage of a checkpoint is decoded into (``_arena``): 0 for
    those that only the objects ``copied`` view (modules a restore loads, which copy
    them into their own tensors), and one group for each other set of owners viewing a
    storage (an object, a value of ``extra``, a notebook variable a session saved, a
    random generator's state: a tensor's name up to its second "/", a variable's up to
    its fourth), so that what a restore leaves referenced holds memory in proportion to
    its owner, not to the checkpoint. All in one where the manifest names no tensors (a
    damaged one: ``_load`` says so)."""
    run, variables = f"extra/{RUN_KEY}", f"extra/{RUN_KEY}/variables/"
    try:
        owner_of: list[str | None] = [None] * len(manifest["storages"])
        shared: dict[int, set[str]] = {}  # storages that more than one owner views
        owner, within = "", "\0"  # the last record's owner, and the names within it
        for record in manifest["tensors"]:  # (tens of thousands, in their owners' order)
            name, storage = record["name"], record["storage"]
            if not name.startswith(within):
                cut = name.find("/", name.find("/") + 1)
                owner = name if cut < 0 else name[:cut]
                if owner == run and name.startswith(variables):
                    cut = name.find("/", len(variables))
                    owner = name if cut < 0 else name[:cut]
                within = owner + "/" if owner != run else "\0"  # (its variables apart)
            seen = owner_of[storage]
            if seen is None:
                owner_of[storage] = owner
            elif seen != owner:
                shared.setdefault(storage, {seen}).add(owner)
    except (LookupError, TypeError, AttributeError):
        return [1] * len(manifest.get("storages") or ())
    copied_owners = {f"objects/{name}" for name in copied}
    numbers: dict[str | frozenset[str] | None, int] = {}
    groups = []
    for storage, owner in enumerate(owner_of):
        owners = shared.get(storage)
        if owners is None and owner in copied_owners or owners and owners <= copied_owners:
            groups.append(0)
        else:
            key = owner if owners is None else frozenset(owners)
            groups.append(numbers.setdefault(key, len(numbers) + 1))
    return groups


class _StateHolder:
    """Presents an already-taken state dict as a Stateful."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def state_dict(self) -> Any:
        return self._state

    def load_state_dict(self, state: Any) -> None:
        self._state = state


def _as_float(t: torch.Tensor, complex_: bool = False) -> torch.Tensor:
    """``t`` in double precision, complex where ``complex_`` (one side of a diff is)."""
    if complex_ or t.is_complex():
        return t.resolve_conj().to(torch.complex128)
    return t.double()


# Elements of a tensor a diff casts to double at once (16 MiB as float64), and the bytes
# of the tensors it reads at once, both sides' (more where one tensor is larger)
_NORM_BLOCK = 1 << 21
_DIFF_BATCH_BYTES = 64 << 20


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one dtype and shape hold the same values, a NaN the same as
    a NaN where both hold one (torch.equal called an unchanged tensor with a NaN changed:
    one sharing its storage with a changed one, or saved in other chunk sizes); by their
    bytes where torch has no comparison for the dtype on the CPU (complex32, float4)."""
    try:
        if torch.equal(a, b):
            return True
        if not (a.is_floating_point() or a.is_complex()):
            return False
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    except (NotImplementedError, RuntimeError):
        as_ints = capture.SAME_SIZE_INTS[a.dtype.itemsize]  # (views of any strides at one size)
        return torch.equal(a.resolve_conj().resolve_neg().view(as_ints),
                           b.resolve_conj().resolve_neg().view(as_ints))


# A generator state's norms: none (its words' l2, 4.3e+10, was drawn as a change of the
# model's size in the explorer's Diff tab).
_NO_NORMS = {"l2": math.nan, "rel_change": math.nan}
_NO_CHANGE = {"l2": 0.0, "rel_change": 0.0}

# The fields of a run record's loop that hold generators' states (the RNG's as an epoch or
# the loop began, its loaders' and the notebook's generators').
_LOOP_GENERATORS = ("_rng", "_rng_now", "_generators")


def _random_state(tensor: str, kinds: Mapping[str, str]) -> bool:
    """Whether a checkpoint's ``tensor`` is (part of) a generator's state: the RNG's, a
    tracked generator's (by its object's kind, ``types`` in a manifest), or one a
    ``%%ckpt_auto`` run record keeps of its loop. Their norms rank nothing: a
    ``torch.Generator`` in the notebook changed by "0.024" of itself beside a model."""
    parts = tensor.split("/")
    if parts[0] == "rng":
        return True
    if parts[0] == "objects" and len(parts) > 2:
        return str(kinds.get(parts[1], "")).rpartition(".")[2] in ("GeneratorState",
                                                                   "RandomState")
    return len(parts) > 3 and parts[:3] == ["extra", RUN_KEY, "loop"] \
        and parts[3].endswith(_LOOP_GENERATORS)


def _change_norms(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """A diff's l2 (of ``b - a``) and rel_change (to ``a``'s norm); NaN where the
    dtype has no cast to double on the CPU (float4)."""
    either = a.is_complex() or b.is_complex()
    try:
        if a.numel() > _NORM_BLOCK:
            l2, base = _norms_by_block(a, b, torch.complex128 if either else torch.float64)
        else:
            da, db = _as_float(a, either), _as_float(b, either)
            l2 = float(torch.linalg.vector_norm(db - da))
            base = float(torch.linalg.vector_norm(da))
    except (NotImplementedError, RuntimeError):
        return {"l2": math.nan, "rel_change": math.nan}
    return {"l2": l2, "rel_change": l2 / base if base else (0.0 if l2 == 0 else math.inf)}


def _norms_by_block(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """``_change_norms``' norms of ``b - a`` and of ``a``, large tensors of one shape cast
    to ``dtype`` a slice of about ``_NORM_BLOCK`` elements (or a row) at a time, into
    two buffers: the whole in double took 2.4 GB for a 300 MiB tensor, and fresh blocks
    fragmented the heap by 1 GB. The norms of the blocks' norms: the whole's, to
    float64 rounding."""
    if a.is_contiguous() and b.is_contiguous():
        a, b = a.view(-1), b.view(-1)
    row = a[0].numel()
    rows = max(1, _NORM_BLOCK // row)
    buffer_a, buffer_b = (torch.empty(min(rows, len(a)) * row, dtype=dtype) for _ in "ab")
    changes, sizes = [], []
    for i in range(0, len(a), rows):
        block_a, block_b = a[i : i + rows], b[i : i + rows]
        da = buffer_a[: block_a.numel()].view(block_a.shape).copy_(block_a)
        db = buffer_b[: block_b.numel()].view(block_b.shape).copy_(block_b)
        sizes.append(torch.linalg.vector_norm(da))
        changes.append(torch.linalg.vector_norm(db.sub_(da)))
    return (float(torch.linalg.vector_norm(torch.stack(changes))),
            float(torch.linalg.vector_norm(torch.stack(sizes))))


def _sizes(shape: Any) -> tuple[int, ...]:
    """A tensor record's shape, once it is one a save writes."""
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise ValueError(f"{shape!r} is not a list of sizes")
    return tuple(shape)


def _check_which(which: Any, *, files: bool = False) -> None:
    """Refuse a checkpoint named by other than a string (a list of ids, a number): it
    was read as its str(), an id no checkpoint has. ``files``: a path may name a file."""
    if not isinstance(which, (str, os.PathLike) if files else str):
        raise TypeError(f"which must be \"latest\", \"best\", \"-N\" or a checkpoint id"
                        f"{' (or the path of a .pt / .safetensors file)' if files else ''}, "
                        f"not {which!r}{_as_step(which)}")


def _as_step(which: Any) -> str:
    """The way on for a number given as a checkpoint (Orbax's ``restore(step)``): -N as a
    string, or the checkpoint of a step looked up in list()."""
    if isinstance(which, (bool, np.bool_)) or not isinstance(which, numbers.Integral):
        return ""
    which = int(which)  # (a NumPy integer's repr: np.int64(2000))
    if which < 0:
        return f" (N back from latest is the string '{which}')"
    return f"; a step is not an id: mgr.list().query('step == {which}')['id'].iloc[-1] " \
        f"is the newest checkpoint saved at step {which}"


def _check_file_path(call: str, path: Any) -> None:
    """Refuse a file's path of another type by name (``export(cid, 5)`` said only
    "expected str, bytes or os.PathLike object")."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{call}()'s path must be a file's path (a str or a pathlib.Path: "
                        f"'model.pt'), not {path!r}")


def _mark_in(note: str) -> str:
    """The catalog's mark a lock-file note names (``_note_holder``'s second word; "" where
    none: a ckpt_nb before ids, or no note)."""
    words = note.split()
    return words[1] if len(words) > 1 else ""


def _refuse_mixed_up(model: Any, optimizer: Any, scheduler: Any) -> None:
    """Refuse a save's objects in each other's places (``save(optimizer, model)``, an
    optimizer as the scheduler): saved so, the swap shows only at restore, as missing and
    unexpected keys. Only what is surely not the place's: any other Stateful goes."""
    for place, value, wrong in (("model", model, torch.optim.Optimizer),
                                ("optimizer", optimizer, torch.nn.Module),
                                ("scheduler", scheduler, (torch.optim.Optimizer,
                                                          torch.nn.Module))):
        if isinstance(value, wrong):
            kind = "an optimizer" if isinstance(value, torch.optim.Optimizer) else "a module"
            raise TypeError(f"save()'s {place} is {kind} ({type(value).__name__}): were the "
                            "objects given in another order? save(model, optimizer, epoch, "
                            "scheduler=...) takes the model first; nothing was saved")


# torch.load's options, which a restore is given out of habit: what restore does instead
_TORCH_LOAD_OPTIONS = {
    "map_location": "restore copies the checkpoint into each live tensor where it is, on its "
                    "device, so the option is not needed: for another device, move the model "
                    "there first (model.to('cuda')) and then restore; for another dtype, "
                    "restore into a model of the checkpoint's dtype and cast it after, or "
                    "load_state_dict the state from load(), which casts each tensor",
    "weights_only": "restore never unpickles a value unless trust_pickle=True (for a store "
                    "you trust), so weights_only=True is what it does already",
}


def _keyword_names(method: Callable[..., Any]) -> list[str]:
    """A method's own named parameters (not ``self``, not its ``**`` Statefuls)."""
    return [p.name for p in inspect.signature(method).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _closest_option(name: str, options: Sequence[str]) -> str | None:
    """The option a keyword was meant as: a near spelling (``notes``: note), one of its
    words (``global_step``: step) or its start (``sched``: scheduler); else None."""
    lower = name.lower()
    near = difflib.get_close_matches(lower, options, n=1, cutoff=0.8) or \
        [o for o in options if o in lower.split("_") or len(lower) >= 4 and o.startswith(lower)]
    return near[0] if near else None


def _refuse_plain_keywords(call: str, statefuls: Mapping[str, Any],
                           options: Sequence[str]) -> None:
    """Refuse a further keyword whose value is no Stateful, naming the option meant: such
    keywords are objects to save or restore into, so a habitual ``metric=``,
    ``global_step=`` or ``map_location=`` was taken for one and refused as an object
    (``pass it in extra=``, ``not in the checkpoint``), not as the option it is."""
    for name, value in statefuls.items():
        if value is None or isinstance(capture.as_stateful(value), capture.Stateful):
            continue
        given = f"{call}() got {name}={reprlib.repr(value)}"
        if call == "restore" and name in _TORCH_LOAD_OPTIONS:
            raise TypeError(f"{given}, torch.load's option, which restore() does not take: "
                            f"{_TORCH_LOAD_OPTIONS[name]} (nothing was changed)")
        meant = _closest_option(name, options)
        if meant is not None:
            hint = f"did you mean {meant}=?"
        elif call == "save" and metric_mode_from_name(name) is not None and _one_number(value):
            hint = f"did you mean metrics={{{name!r}: {reprlib.repr(value)}}}?"
        elif call == "save":
            hint = f"pass it in extra={{{name!r}: ...}} if it is plain data"
        else:
            hint = f"its options are {', '.join(o + '=' for o in options)}"
        what, done = ("to save", "saved") if call == "save" else ("to restore into", "changed")
        raise TypeError(f"{given}, but a further keyword names an object {what} (one with "
                        f"state_dict() / load_state_dict()), and {type(value).__name__} has "
                        f"none: {hint} (nothing was {done})")


def _one_number(value: Any) -> bool:
    """Whether ``value`` is what a metric takes (``as_metric``): a number, or a tensor or
    array of one (``loss`` itself)."""
    try:
        as_metric("value", value)
    except CaptureError:
        return False
    return True


def _optimizers_off_the_modules(objects: Mapping[str, Any],
                                param_names: Mapping[str, SlotNames]) -> list[str]:
    """The optimizers among ``objects`` that step parameters of none of its modules, but
    shaped as one module's are: ``model = ...`` ran again, the optimizer's line not, so it
    steps the old model's parameters (as the magics' own check says). One for a part not
    saved (a discriminator) is shaped otherwise, and left alone. ``param_names``: each
    optimizer's parameters' names among the modules (``parameter_names``), None where
    no module holds one."""
    modules = [obj for obj in objects.values() if isinstance(obj, torch.nn.Module)]
    stray = []
    for name, names in param_names.items():
        params = [p for group in objects[name].param_groups for p in group["params"]]
        if not params or any(n is not None for group in names for n in group):
            continue
        shapes = Counter(tuple(p.shape) for p in params)
        # Shaped as a whole module's (or a part's: a head fine-tuned alone) parameters, or
        # as several of one's; a lone tensor (an RL temperature, a learnt loss weight)
        # of a shape some module also has (a bias of 1) is a part not saved, not a swap.
        if any(shapes == Counter(tuple(p.shape) for p in sub.parameters())
               or len(params) > 1 and not shapes - Counter(tuple(p.shape)
                                                           for p in module.parameters())
               for module in modules for sub in module.modules()):
            stray.append(name)
    return stray


def _metric_items(metrics: Any) -> Iterable[tuple[Any, Any]]:
    """The (name, value) pairs of ``metrics``, refused with what to give where it is not a
    dict (``metrics=[0.5]`` failed inside ckpt_nb, an AttributeError)."""
    if metrics is None:
        return ()
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a dict of name -> number (metrics={{'val_loss': "
                        f"0.31}}), not {type(metrics).__name__} {reprlib.repr(metrics)}")
    return metrics.items()


def _partial_restore_ways(targets: Mapping[str, Any], states: Mapping[str, Any],
                          strict: bool, which: str) -> str:
    """How to take the part of a checkpoint that fits a module changed since its save (a
    layer added or renamed, a head resized: transfer learning), for the refusal's last
    line; "" where no module target's keys or shapes differ."""
    keyed, reshaped, moved = [], {}, False
    for name, obj in targets.items():
        module, state = capture.unwrap(obj), states.get(name)
        if not isinstance(module, torch.nn.Module) or not isinstance(state, Mapping):
            continue
        current = module.state_dict()
        missing, unexpected = capture.skipped_keys(module, state, current)
        if (missing or unexpected) and current.keys() & state.keys():
            keyed.append(name)  # (none in common: renamed, which strict=False loads nothing of)
            moved = moved or bool(missing and unexpected)
        differ = [key for key, value in state.items() if isinstance(value, torch.Tensor)
                  and isinstance(current.get(key), torch.Tensor) and not isinstance(
                      current[key], torch.nn.parameter.UninitializedTensorMixin)  # (lazy)
                  and current[key].shape != value.shape]
        if differ:
            reshaped[name] = differ
    if reshaped:
        name, keys = next(iter(reshaped.items()))
        return (f"to take the rest, whose shapes fit (a backbone under a new head), load it "
                f"without those keys: state = mgr.load({which!r}).state[{name!r}]; "
                f"{name}.load_state_dict({{k: v for k, v in state.items() if k not in "
                f"{keys[:4]!r}{' + ...' if len(keys) > 4 else ''}}}, strict=False)")
    if keyed and strict:
        return (f"restore(..., strict=True) needs the same keys: restore(..., strict=False) "
                f"loads those that fit into {', '.join(keyed)}, leaving the others as they "
                "are (the Checkpoint's missing_keys and unexpected_keys name them)"
                + ("; where a layer moved (renamed, or wrapped in an adapter: 0.weight now "
                   "0.base.weight), rename its keys in the state from load() instead, or it "
                   "keeps its values as built" if moved else ""))
    return ""


def _warn_nothing_taken(cid: str, targets: Mapping[str, Any],
                        skipped: Mapping[str, tuple[list[str], list[str]]]) -> None:
    """Warn of a module that a restore with ``strict=False`` put none of the checkpoint's
    keys into (renamed layers: ``fc1.weight`` now where ``0.weight`` was saved): it stays
    as it was, and only the Checkpoint's missing_keys would tell."""
    for name, (missing, unexpected) in skipped.items():
        module = capture.unwrap(targets[name])
        if not (isinstance(module, torch.nn.Module) and missing and unexpected):
            continue
        if set(missing) >= set(module.state_dict()):
            warn(f"restore(..., strict=False) of checkpoint {cid} put none of its keys into "
                 f"{name}, which stays as it was: the checkpoint holds {unexpected[:4]}"
                 f"{' ...' if len(unexpected) > 4 else ''}, {name} {missing[:4]}"
                 f"{' ...' if len(missing) > 4 else ''}; take the state from load() and "
                 "rename its keys to load it", RuntimeWarning)


def _warn_left_out(ck: Checkpoint) -> None:
    """Name the saved objects a restore that resumes training (it puts an optimizer
    back) did not put back: an EMA model, a generator or a scheduler left out of the
    call stays as freshly built, and the run goes on from another state than the one
    saved, without a word. (A restore of a model alone, to evaluate it, is not told.)"""
    def kind_of(name: str) -> str:
        kind = ck.kinds.get(name, "").rpartition(".")[2]  # (a file's: none known)
        return "Generator" if kind == "GeneratorState" else kind

    held = ", ".join(f"{name} ({kind_of(name)})" if kind_of(name) else name
                     for name in ck.state)
    them = "it" if len(ck.state) == 1 else "them"
    warn(f"checkpoint {ck.id} also holds {held}, not restored: "
         f"{'it is' if len(ck.state) == 1 else 'they are'} in ck.state; pass {them} by "
         f"keyword to restore {them} (restore(..., {next(iter(ck.state))}=...))")


def _undescribed(cid: str, exc: Exception) -> CorruptCheckpointError:
    """A checkpoint whose manifest's tensor records do not hold (diff)."""
    return CorruptCheckpointError(f"checkpoint {cid}: its manifest does not describe its "
                                  f"tensors ({type(exc).__name__}: {exc})", cid)


def _opt_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer or None, not {value!r}")
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"{name} must fit in 64 bits, not {value}")
    return int(value)


def as_metric(name: Any, value: Any) -> float:
    """A metric's value as a float: a Python or NumPy number, or a one-element tensor
    or array (``loss`` itself, not only ``loss.item()``)."""
    if not isinstance(name, str):
        raise CaptureError(f"metric names must be strings, not {name!r}")
    if isinstance(value, (torch.Tensor, np.ndarray)):
        count = value.numel() if isinstance(value, torch.Tensor) else value.size
        if count != 1:
            raise CaptureError(f"metric {name!r} must be one number, not {count} of them")
        value = value.item()
    if isinstance(value, decimal.Decimal):  # (a number, though not a numbers.Real)
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise CaptureError(f"metric {name!r} must be a number, not {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        raise CaptureError(f"metric {name!r} is {reprlib.repr(value)}, too large for the float "
                           "a metric is stored as: log it scaled (in millions, say)") from None


def _ranking_mode(metric: str | None, mode: str | None) -> str | None:
    """``mode`` checked, or where it is left out the direction ``metric``'s name says: a
    "min" taken for an accuracy kept the worst checkpoints as the best and deleted the
    rest. Without a metric, "min" (a store's recorded ranking replaces it); None where
    the name says neither (``_recorded_mode`` asks the store)."""
    if metric is not None and not isinstance(metric, str):
        raise TypeError(f"metric must be the name of a logged metric (metric='val_loss'), "
                        f"not {metric!r}")
    if mode is not None:
        _check_choice("mode", mode, ("min", "max"))
        return mode
    if metric is None:
        return "min"
    return metric_mode_from_name(metric)


def _no_direction(metric: str, logged: Iterable[str]) -> ValueError:
    """The refusal of a metric whose name says neither way is better, where no save
    recorded its mode (``logged``: the metrics the store's saves log, for a misspelt one)."""
    return ValueError(f"metric={metric!r}: its name does not say whether a lower or a "
                      f"higher {metric} is better, and no save here recorded it; give "
                      f"mode=\"min\" or mode=\"max\"{_did_you_mean(metric, logged)}")


def _did_you_mean(metric: str, logged: Iterable[str]) -> str:
    """"; did you mean metric='val_loss'?" for the logged name closest to a misspelt one."""
    close = difflib.get_close_matches(metric, sorted(logged), n=1)
    return f"; did you mean metric={close[0]!r}?" if close else ""


def _check_choice(name: str, value: str, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, not {value!r}")


def codec_names() -> tuple[str, ...]:
    return codec.CODECS
