"""The SQLite catalog: which checkpoints exist, how they relate, where chunks lie.

A checkpoint exists once its row is committed here, and not before; the
store's files are written first. The catalog knows nothing of tensors, nor of
the store: a new catalog is seeded with what its maker read back from the
store (``_rebuild``), in the transaction that creates it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import resource
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._errors import DamagedCatalog, StoreError, StoreFormatError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

SCHEMA_VERSION = 1
# The meta flag set once the store holds a label for every pin and note the catalog
# holds (a store saved before labels held them in its catalog alone): see the manager.
LABELS_WRITTEN = "labels_written"
CATALOG_ID = "catalog_id"  # (meta) the random id that tells this catalog from another
CATALOG_ID_FILE = "catalog_id_file"  # (meta) the "device:inode" of the file it was made in
LABEL_CHANGES = "label_changes"  # (meta) how many pins, notes or tags were ever changed here
# The meta key of the metric and mode ("min" or "max") the store's checkpoints are ranked
# by: recorded by a manager given metric= when it saves, the default of one opened without.
RANKING = "ranking"
# The meta key of every ranking (metric, mode) saves recorded, each once, oldest first:
# "best" by the record is worth a word only where the store held others. Absent from a
# catalog made before ckpt_nb kept it.
RANKINGS = "rankings"
# The meta key of the store keys the last rebuild listed and left out, not as damaged: see
# ``Seed.left_out_keys``.
LEFT_OUT_KEYS = "left_out_keys"
# The meta key of the ids of failed saves whose files the store may keep, until their
# deletion is recorded in the store: see ``Catalog.failed_saves``.
FAILED_SAVES = "failed_saves"
# The meta key of how many transactions ever changed the catalog: see ``Catalog.generation``.
GENERATION = "generation"


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    parent TEXT,
    branch TEXT NOT NULL,
    created_at REAL NOT NULL,
    step INTEGER,
    epoch INTEGER,
    batch_idx INTEGER,
    metrics TEXT NOT NULL DEFAULT '{}',
    strategy TEXT NOT NULL,
    full_base TEXT,
    chain INTEGER NOT NULL DEFAULT 0,
    logical_bytes INTEGER NOT NULL DEFAULT 0,
    stored_bytes INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER NOT NULL DEFAULT 0,
    note TEXT NOT NULL DEFAULT '',
    tags TEXT NOT NULL DEFAULT '{}',
    manifest_digest TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS checkpoints_parent ON checkpoints(parent);
CREATE TABLE IF NOT EXISTS chunks (
    digest TEXT PRIMARY KEY,
    pack TEXT NOT NULL,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL,
    raw_len INTEGER NOT NULL,
    base TEXT,
    depth INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS chunks_pack ON chunks(pack);
CREATE INDEX IF NOT EXISTS chunks_base ON chunks(base);
CREATE TABLE IF NOT EXISTS refs (
    checkpoint TEXT NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (checkpoint, digest)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS refs_digest ON refs(digest);
CREATE TABLE IF NOT EXISTS branches (name TEXT PRIMARY KEY, tip TEXT);
"""

# The kinds of object a SQLite schema holds, in words (any other is named by its type).
_SCHEMA_KINDS = {"table": "a table", "index": "an index", "view": "a view",
                 "trigger": "a trigger"}


@functools.cache
def _own_schema() -> dict[tuple[str, str], tuple[str, str | None]]:
    """Every object a catalog of ckpt_nb's holds, (type, name) -> (table, SQL), as SQLite
    records them: read back from ``_SCHEMA`` made in memory, in SQLite's own normalized
    text. Older catalogs hold these too (the schema has only gained the index
    chunks_base since), and SQLite's own statistics tables, which ANALYZE or PRAGMA
    optimize makes, hold no SQL."""
    made = sqlite3.connect(":memory:")
    try:
        made.executescript(_SCHEMA)
        made.execute("ANALYZE")
        return {(kind, name): (table, sql) for kind, name, table, sql in
                made.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")}
    finally:
        made.close()


def _foreign_object(db: sqlite3.Connection) -> str | None:
    """The first object in a catalog's schema that ckpt_nb does not make, in words (None
    where there is none): a trigger or a view runs SQL its author wrote as ckpt_nb reads or
    writes the catalog (one deleted every earlier checkpoint's refs at the next save, so
    that gc deleted their packs; one with an endless recursive query hung the open), and
    so may a table or index made otherwise. Read from sqlite_master alone, which runs none
    of it."""
    own = _own_schema()
    for kind, name, table, sql in db.execute(  # (triggers and views first: they run SQL)
            "SELECT type, name, tbl_name, sql FROM sqlite_master "
            "ORDER BY type NOT IN ('trigger', 'view')").fetchall():
        made = own.get((kind, name))
        if made is None:
            said = _SCHEMA_KINDS.get(kind) or f"an entry of type {kind!r}"
            return f"{said} {name!r} that ckpt_nb does not make"
        if made != (table, sql):
            return f"the {kind} {name!r}, made otherwise than ckpt_nb makes it"
    return None


def _missing_table(db: sqlite3.Connection) -> str | None:
    """The first of ckpt_nb's tables that a catalog which holds any of them lacks (None
    where it holds all, or none: a new catalog), so that a table deleted from outside is
    named as damage at open, not met later as SQLite's "no such table". Every catalog
    ckpt_nb ever made holds all of them."""
    found = {name for (name,) in db.execute("SELECT name FROM sqlite_master "
                                            "WHERE type = 'table'").fetchall()}
    own = [name for kind, name in _own_schema()
           if kind == "table" and not name.startswith("sqlite_")]
    if not found.intersection(own):
        return None
    return next((name for name in own if name not in found), None)


@dataclass
class CheckpointRow:
    """One committed checkpoint, as the catalog records it."""

    id: str
    parent: str | None
    branch: str
    created_at: float
    step: int | None
    epoch: int | None
    batch_idx: int | None
    metrics: dict[str, float]
    strategy: str
    full_base: str | None
    chain: int
    logical_bytes: int
    stored_bytes: int
    pinned: bool
    note: str
    tags: dict[str, Any] = field(default_factory=dict)
    manifest_digest: str = ""
    seq: int = 0

    @classmethod
    def from_sql(cls, row: sqlite3.Row) -> CheckpointRow:
        """A row as the catalog holds it, refused (``DamagedCatalog``) unless it is of
        the kind ckpt_nb writes: a hand-edited or damaged catalog fails here, by name,
        not as a TypeError deep in a listing."""
        data = dict(row)
        try:
            data["metrics"] = json.loads(data["metrics"])
            data["tags"] = json.loads(data["tags"])
        except (TypeError, ValueError, RecursionError) as exc:
            raise DamagedCatalog(f"checkpoint {data.get('id')}'s metrics or tags") from exc
        data["pinned"] = bool(data["pinned"])
        checked = cls(**data)
        problem = checked.problem()
        if problem is not None:
            raise DamagedCatalog(f"checkpoint {data.get('id')}'s {problem}")
        return checked

    def problem(self) -> str | None:
        """What in this row is not of the kind ckpt_nb writes, if anything."""
        if not all(isinstance(v, str) for v in (self.id, self.branch, self.strategy, self.note)):
            return "id, branch, strategy or note"
        if not all(v is None or isinstance(v, str) for v in (self.parent, self.full_base)):
            return "parent"
        if not isinstance(self.created_at, (int, float)) or \
                not 0 <= self.created_at < _LAST_TIME:
            return "time of saving"
        if not all(v is None or isinstance(v, int) for v in (self.step, self.epoch,
                                                              self.batch_idx)):
            return "step, epoch or batch_idx"
        if not all(isinstance(v, int) for v in (self.chain, self.logical_bytes,
                                                 self.stored_bytes)):
            return "chain or sizes"
        if not isinstance(self.metrics, dict) or not isinstance(self.tags, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool)
                for v in self.metrics.values()):
            return "metrics or tags"
        return None


HEIRS_KEPT = 10_000  # deleted checkpoints whose heir is remembered, newest first
def _read_only_uri(path: Path) -> str:
    """SQLite's URI to read a catalog in a folder it cannot write: with no journal left
    beside it the file is whole, and is read as immutable (WAL mode would create its
    shared-memory file); else read-only, which reads the journal too."""
    journal = path.with_name(path.name + "-wal")
    whole = not journal.exists() or journal.stat().st_size == 0
    return f"{path.absolute().as_uri()}?{'immutable=1' if whole else 'mode=ro'}"


_LAST_TIME = 2**33  # seconds since 1970: the year 2242 (pandas' times end in 2262)


# What to do with a catalog that cannot be read: the store's own files rebuild it. Its
# journal goes with it (a new catalog beside an old journal does not open), once no
# process has it open (one that does keeps writing it).
def open_cache(path: str | Path, seed: Callable[[], Seed],
               check: Callable[[Catalog], None]) -> tuple[Catalog, Path | None]:
    """A catalog that only caches what its store holds (an object store's, on this
    machine), opened and ``check``ed (brought up to date with the store); where either
    finds it damaged, and no connection has it open, it is moved aside (kept, with its
    -wal and -shm, ``moved_aside``) and made again from ``seed``. Returns the catalog and
    where a damaged one was moved (None where none was). A local store's catalog is not
    opened this way: it may hold what its store's files do not (a copy put back)."""
    path = Path(path)
    found = _file_id(path)
    try:
        catalog = Catalog(path, seed)
    except DamagedCatalog as exc:
        damaged = exc
    else:
        try:
            check(catalog)
            return catalog, None
        except DamagedCatalog as exc:
            catalog.close()
            damaged, found = exc, catalog.file_id
    aside = moved_aside(path, found)
    if aside is not None:
        return Catalog(path, seed), aside
    holder = _holder(path, found) if found is not None else None
    if holder not in _TOLD:
        raise damaged  # (where it could not be moved: moved by hand, as the error says)
    raise DamagedCatalog(damaged.what, path, advice=(
        f"it was not moved aside, as {holder} has it open: {_TOLD[holder]}, then open the "
        "store again, which moves the catalog aside (kept, with its -wal and -shm) and "
        "rebuilds it from the store's own files")) from damaged.__cause__


def moved_aside(path: Path, file_id: tuple[int, int] | None) -> Path | None:
    """Rename the catalog at ``path`` (the file ``file_id`` names) to
    ``NAME.damaged-TIME``, its -wal and -shm first, each beside it under that name with
    its suffix (a new catalog beside an old journal does not open, and SQLite reads them
    together again); the new name, or None where it was not moved: a connection (of this
    process or another) has it open, whose writes would go on into the moved files while
    SQLite, as it closes, deleted the new catalog's journal by name; or it is no longer
    that file; or it cannot be renamed."""
    if file_id is None or _file_id(path) != file_id or _holder(path, file_id):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    for count in range(2, 100):
        if not any(Path(f"{aside}{suffix}").exists() for suffix in ("", "-wal", "-shm")):
            break
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{count}")
    try:
        for suffix in ("-wal", "-shm", ""):
            with contextlib.suppress(FileNotFoundError):
                os.rename(f"{path}{suffix}", f"{aside}{suffix}")
    except OSError:
        return None
    return aside


# The catalogs this process has open (``_holder``): POSIX locks tell no
# process of its own.
_OPEN_CATALOGS: weakref.WeakSet[Catalog] = weakref.WeakSet()
_OPEN_CATALOGS_LOCK = threading.Lock()  # (a set changed while it is read raises)


# Who may have a catalog open (``_holder``), and what to do for it to be closed.
_THIS_PROCESS, _ANOTHER_PROCESS = "a CheckpointManager in this process", "another process"
_UNTOLD = "a process (this system cannot tell which)"
_TOLD = {_THIS_PROCESS: "close that one (close(), or the end of its with block)",
         _ANOTHER_PROCESS: "wait until that process has closed the store"}


def _holder(path: Path, file_id: tuple[int, int]) -> str | None:
    """Who has the catalog at ``path`` open: a connection of this process's (one of its
    managers'), or another process's, which in WAL mode holds a lock on the file and its
    -shm for as long as it is open (taken here for a moment, the way SQLite's last
    connection tells it is the last); None where none has. ``_UNTOLD`` where that cannot
    be told (no fcntl, a file this process cannot write)."""
    with _OPEN_CATALOGS_LOCK:
        if any(catalog.file_id == file_id for catalog in _OPEN_CATALOGS):
            return _THIS_PROCESS
    if fcntl is None:
        return _UNTOLD
    for name in (path, Path(f"{path}-shm")):
        try:
            fd = os.open(name, os.O_RDWR)
        except FileNotFoundError:
            continue
        except OSError:
            return _UNTOLD
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_UN)
        except OSError as exc:
            return _ANOTHER_PROCESS if exc.errno in (errno.EACCES, errno.EAGAIN) else _UNTOLD
        finally:
            os.close(fd)
    return None


def _file_id(path: Path) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path``; None where there is none (an
    in-memory catalog, or a file deleted meanwhile)."""
    if str(path) == ":memory:":
        return None
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


class _Closed:
    """Stands in for a closed database, so that using it says what happened (sqlite3's
    own "Cannot operate on a closed database" names no file and no way out)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __getattr__(self, name: str) -> Any:
        raise StoreError(f"the catalog {self.path} was closed (CheckpointManager.close(), or "
                         "the end of its with block): open the store again with a new "
                         "CheckpointManager")


@dataclass
class Seed:
    """What a new catalog starts with: checkpoints in the order they were made, the
    digests each refers to, and where every chunk lies."""

    checkpoints: list[CheckpointRow] = field(default_factory=list)
    refs: dict[str, list[str]] = field(default_factory=dict)
    chunks: list[ChunkRow] = field(default_factory=list)
    damaged: dict[str, str] = field(default_factory=dict)  # store key -> what is wrong
    ranking: tuple[str, str] | None = None  # the metric and mode the newest save ranked by
    rankings: list[tuple[str, str]] = field(default_factory=list)  # each one saves recorded
    # The manifests and packs listed and left out, not as damaged (a save in flight, a
    # killed save's leftovers, a pack whose chunks lie in others too), each with when it
    # grows older than the grace time, and a rebuild reads it otherwise (None: never).
    left_out_keys: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class ChunkRow:
    """Where one content-addressed chunk lies, and what it is a delta of."""

    digest: str
    pack: str
    offset: int
    length: int
    raw_len: int
    base: str | None
    depth: int


def _errors_named(cls: type[Catalog]) -> type[Catalog]:
    """Have every public method raise sqlite3's errors (a full disk, an I/O error) as a
    StoreError that names the catalog: ``except OSError`` catches it, as it catches the
    store's."""
    def named(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(self: Catalog, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc
            except DamagedCatalog as exc:
                raise DamagedCatalog(exc.what, self.path) from exc.__cause__
        return wrapper

    for name, value in list(vars(cls).items()):
        if not name.startswith("_") and callable(value) and \
                name not in ("close", "transaction", "snapshot"):
            setattr(cls, name, named(value))
    return cls


# Free room under which a catalog's "disk I/O error" is most likely a full disk's.
_LITTLE_ROOM = 1 << 20


def _room(folder: Path) -> int:
    """The bytes free to this user on ``folder``'s disk (0 where it cannot be asked)."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def disk_full(folder: Path) -> bool:
    """Whether ``folder``'s disk has too little room left for SQLite to open a catalog to
    write (its journal and shared-memory files)."""
    return _room(folder) < _LITTLE_ROOM


def _why_short_of_room(folder: Path, text: str, reading: bool = False) -> str:
    """What SQLite's "database or disk is full" or "disk I/O error" most likely means
    here, asked as a question, with what to do: its I/O error is also what a file-size
    limit (ulimit -f) that its journal outgrew gives, on a disk with room, and what a
    failing disk gives."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if "full" not in text and limit != resource.RLIM_INFINITY:
        return (f"is this process's file-size limit, ulimit -f ({limit} bytes), too small "
                "for its journal? raise it, then try again")
    room = _room(folder)
    if "full" in text or room < _LITTLE_ROOM:
        return "is its disk full? " + ("SQLite needs a little room even to read"
                                       if reading else "free some room, then try again")
    return (f"its disk has {room >> 20} MiB free: is a quota reached, or is the disk "
            "failing? the system's log (dmesg) says more")


@_errors_named
class Catalog:
    """The SQLite database beside (or for) a store; WAL mode, full sync."""

    def __init__(self, path: str | Path, seed: Callable[[], Seed] | None = None) -> None:
        """Open (or create) the catalog at ``path``; a new one is filled with ``seed()``
        in the transaction that creates it, so no other process sees it half filled."""
        self.path = Path(path)
        self._lock = threading.RLock()
        self._in_unit = False  # (a transaction() or snapshot() of this catalog is open)
        self._forked_mid_unit = False  # (a child's copy, forked while _in_unit: unusable)
        # A store in a folder this process cannot write (another user's, a read-only
        # mount, an archive) is read where its catalog is whole: to look into, not to
        # change (a write raises, naming the catalog).
        self.read_only = self.path.is_file() and not (
            os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK))
        self.disk_full = False  # (read only, as its disk had no room: ``_read_on_a_full_disk``)
        try:  # (a _Closed after close(), which raises at its first use: never yielded)
            self._db: sqlite3.Connection = sqlite3.connect(
                _read_only_uri(self.path) if self.read_only else self.path, timeout=30,
                check_same_thread=False, isolation_level=None, uri=self.read_only)
        except sqlite3.OperationalError as exc:
            raise self._unopenable(exc, self._not_regular_files()) from exc
        try:
            self._open(seed)
            self.file_id = _file_id(self.path)
            with _OPEN_CATALOGS_LOCK:
                _OPEN_CATALOGS.add(self)
        except BaseException as exc:
            # (looked at first: SQLite's last connection deletes the -wal as it closes)
            not_regular = self._not_regular_files()
            self._db.close()
            if isinstance(exc, sqlite3.OperationalError) and self._read_on_a_full_disk():
                return
            if isinstance(exc, sqlite3.OperationalError):
                raise self._unopenable(exc, not_regular) from exc
            if isinstance(exc, DamagedCatalog):
                raise DamagedCatalog(exc.what, self.path) from exc.__cause__
            if isinstance(exc, sqlite3.Error):  # (as found later: damage is its exact type)
                raise self._failed(exc) from exc
            raise

    def _not_regular_files(self) -> list[str]:
        """The names of the catalog, its -wal and -shm where one is there and is not a
        regular file (a FIFO, a folder): SQLite says only "disk I/O error" or "unable to
        open database file"."""
        return [p.name for p in (self.path, self.path.with_name(self.path.name + "-wal"),
                                 self.path.with_name(self.path.name + "-shm"))
                if p.exists() and not p.is_file()]

    def _read_on_a_full_disk(self) -> bool:
        """Open the catalog to read only where its disk has no room left for SQLite's
        journal (a run that filled the disk and died): to list, restore and export from,
        as a store in a folder this process cannot write is. False where that is not it,
        or does not open either: the first failure is said."""
        if self.read_only or not self.path.is_file() or not disk_full(self.path.parent):
            return False
        self.read_only = self.disk_full = True
        self._db = sqlite3.connect(_read_only_uri(self.path), timeout=30,
                                   check_same_thread=False, isolation_level=None, uri=True)
        try:
            self._open(None)
        except (sqlite3.Error, StoreError):
            self._db.close()
            self.read_only = self.disk_full = False
            return False
        self.file_id = _file_id(self.path)
        with _OPEN_CATALOGS_LOCK:
            _OPEN_CATALOGS.add(self)
        return True

    def _unopenable(self, exc: sqlite3.OperationalError, not_regular: list[str]) -> StoreError:
        if not os.access(self.path.parent, os.W_OK):
            hint = (" (its folder is read-only, and SQLite writes a journal beside it even to "
                    "read: copy the store somewhere writable to open it)")
        elif not_regular:
            are, them = ("is", "it") if len(not_regular) == 1 else ("are", "them")
            hint = (f" ({' and '.join(not_regular)} {are} not a regular file (a FIFO or a "
                    f"folder?): once no other process has the store open, move {them} aside "
                    "and open the store again)")
        elif "I/O" in str(exc) or "full" in str(exc):
            journal = [p.name for p in (self.path.with_name(self.path.name + "-wal"),
                                        self.path.with_name(self.path.name + "-shm"))
                       if p.exists()]
            moved = "" if not journal else (
                "; or was it moved aside or deleted while another process had it open, "
                f"leaving {' and '.join(journal)}? Once no other process has the store "
                "open, move those aside too")
            hint = f" ({_why_short_of_room(self.path.parent, str(exc), reading=True)}{moved})"
        else:
            hint = ""
        return StoreError(f"cannot open the catalog {self.path}: {exc}{hint}")

    def _failed(self, exc: sqlite3.Error) -> StoreError:
        if type(exc) is sqlite3.DatabaseError:  # (SQLite's "malformed", "not a database")
            return DamagedCatalog(f"its SQLite file ({exc})", self.path)
        text = str(exc)
        hint = f" ({_why_short_of_room(self.path.parent, text)})" \
            if "full" in text or "I/O" in text else ""
        return StoreError(f"the catalog {self.path} failed: {text}{hint}")

    def _open(self, seed: Callable[[], Seed] | None) -> None:
        self._db.row_factory = sqlite3.Row
        # (beside ``_refuse_foreign_objects``: a function that a schema's SQL names runs
        # only where SQLite deems it harmless)
        self._db.execute("PRAGMA trusted_schema=OFF")
        if self.read_only:
            try:
                self._db.execute("SELECT 1 FROM sqlite_master").fetchone()  # (reads the WAL)
            except sqlite3.OperationalError:
                self._db.close()
                self._db = self._copied_into_memory()
            self._refuse_foreign_objects()
            found = self._meta("schema_version")
            if found is None:
                raise StoreError(f"the catalog {self.path} is empty, and its folder "
                                 "read-only: there is nothing to read")
            self._check_schema(found)
            return
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self.transaction() as db:
            self._refuse_foreign_objects()  # (first: a trigger would fire at the next write)
            found = self._meta("schema_version")
            if found is None:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                self._set_meta("schema_version", str(SCHEMA_VERSION))
                self._set_meta("created_at", str(time.time()))
                # (a new catalog's pins and notes are all given after it, as labels)
                self._set_meta(LABELS_WRITTEN, "1")
                if seed is not None:
                    self._seed(db, seed())
            else:
                self._check_schema(found)
                # (added since: a retention's collection asks what is stacked on its chunks)
                db.execute("CREATE INDEX IF NOT EXISTS chunks_base ON chunks(base)")

    def _refuse_foreign_objects(self) -> None:
        """Refuse a catalog whose schema holds what ckpt_nb does not make (``_foreign_object``),
        before any query reads or writes its tables: opening a store never runs what its
        author wrote."""
        found = _foreign_object(self._db)
        if found is not None:
            raise DamagedCatalog(f"its schema, with {found} (none of it was run),")
        missing = _missing_table(self._db)
        if missing is not None:
            raise DamagedCatalog(f"its schema, without the table {missing!r} that ckpt_nb "
                                 "makes,")

    def _check_schema(self, found: str) -> None:
        if not str(found).isdigit():
            raise DamagedCatalog(f"its format, {found!r},")
        if int(found) > SCHEMA_VERSION:
            raise StoreFormatError(
                f"catalog {self.path} has format {found}, newer than this ckpt_nb "
                f"reads ({SCHEMA_VERSION}): upgrade ckpt_nb to open it, or move the catalog "
                "aside (it is an index of the store) and the store opens rebuilt from its "
                "files"
            )

    def replaced(self) -> bool:
        """Whether the file at ``path`` is no longer the one this catalog opened (it was
        deleted, or deleted and made again by another manager's rebuild): writes here
        would go into a file no other process reads."""
        return self.file_id is not None and _file_id(self.path) != self.file_id

    def uid(self) -> str:
        """This catalog's own random id, made the first time it is asked for (a store's
        lock file names the catalog that last wrote the store, to tell another apart).
        It is tied to the file (its device and inode, kept beside it): a copy of the
        catalog made as a new file (moved to a local disk, used with ``catalog=``) gets an
        id of its own (not a copy written over the catalog file, which keeps its inode), as
        the same id said the copy had seen the original's saves, and gc from the
        original deleted what was saved through the copy."""
        found = self.known_uid()
        if found is None:
            with self.transaction():
                found = self.known_uid()  # (another process's, made meanwhile)
                if found is None:
                    found = uuid.uuid4().hex
                    self._set_meta(CATALOG_ID, found)
                    self._set_meta(CATALOG_ID_FILE, self._file_key())
        return found

    def known_uid(self) -> str | None:
        """``uid()`` where one was made for this file, without making one (a write)."""
        with self._lock:
            found, made_in = self._meta(CATALOG_ID), self._meta(CATALOG_ID_FILE)
        return found if found is not None and made_in == self._file_key() else None

    def _file_key(self) -> str:
        """The "device:inode" of the file this catalog opened ("" in memory)."""
        return "" if self.file_id is None else "%d:%d" % self.file_id

    def stored_uid(self) -> str | None:
        """The id this catalog's file holds, whatever file it was made in: a copy of the
        catalog keeps the original's (put back as a new file, by rsync or a move, it
        would take a new one at its first lock take), so that the lock file's note of
        the original tells the copy apart at open."""
        with self._lock:
            return self._meta(CATALOG_ID)

    def counts(self) -> tuple[int, int, int]:
        """How many checkpoint rows were ever inserted (SQLite's AUTOINCREMENT counter,
        which deletes do not lower), how many there are, and how many times a pin, a
        note or tags were changed (``update``): a store's lock file notes them after each
        write, and a catalog that has seen fewer saves, or as many and fewer deletes, or
        as many of both and fewer label changes, was put back from a copy made before
        that write."""
        with self._lock:
            found = self._db.execute(
                "SELECT (SELECT seq FROM sqlite_sequence WHERE name = 'checkpoints'), "
                "(SELECT count(*) FROM checkpoints)").fetchone()
            labels = self._meta(LABEL_CHANGES)
        return int(found[0] or 0), int(found[1]), int(labels or 0)

    def after_fork(self) -> None:
        """In a child forked while another thread held this catalog's lock (a save's
        commit): a fresh lock, or the child's first use of it waits forever."""
        if not self._lock._is_owned():  # type: ignore[attr-defined]
            self._lock = threading.RLock()
            # (another thread's transaction or snapshot was open at the fork: the child's
            # copy of the connection is inside it, and SQLite's connections do not cross a
            # fork; ended here, it would act on the parent's)
            self._forked_mid_unit = self._in_unit

    def _refuse_forked_mid_unit(self) -> None:
        if self._forked_mid_unit:
            raise StoreError(f"this process was forked from one that was writing the catalog "
                             f"{self.path} (a DataLoader's worker started during a save): "
                             "its copy of the catalog cannot be used here; open a "
                             "CheckpointManager of the store in this process")

    def close(self) -> None:
        """Close the database; any later use raises a StoreError that says so."""
        with self._lock:
            if not isinstance(self._db, _Closed):
                self._db.close()
                self._db = _Closed(self.path)  # type: ignore[assignment]
                with _OPEN_CATALOGS_LOCK:
                    _OPEN_CATALOGS.discard(self)

    def generation(self) -> int:
        """How many transactions ever changed the catalog, in any process: a reseed from
        a store read at one generation is stale at another (``reseed``'s ``since``)."""
        with self._lock:
            return int(self._meta(GENERATION) or 0)

    def reseed(self, start: Seed, since: int | None = None) -> bool:
        """Replace every checkpoint and chunk row with ``start``, in one transaction. Each
        checkpoint it no longer holds (deleted elsewhere) gets its parent as its heir, as
        a delete here records (``heir_of``), so that a manager whose live objects came
        from it saves under its nearest kept ancestor, not as a new root. With ``since``
        (the ``generation`` at which the store was read for ``start``), nothing is
        replaced where another manager of this catalog wrote it meanwhile (a save's
        commit, on a catalog that processes share: ``start`` would drop its row);
        returns whether it was replaced."""
        with self.transaction() as db:
            if since is not None and self.generation() != since:
                return False
            kept = {row.id for row in start.checkpoints}
            for cid, parent in db.execute("SELECT id, parent FROM checkpoints").fetchall():
                if cid not in kept:
                    self._set_meta(f"heir:{cid}", parent or "")
            self._forget_oldest_heirs(db)
            for table in ("refs", "chunks", "checkpoints", "branches"):
                db.execute(f"DELETE FROM {table}")
            self._seed(db, start)
        return True

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic, durable unit of change. Any exception ends it, a Ctrl-C included
        (rolled back, unless its COMMIT went through): one left open keeps the store
        locked for every other process, and this one's next transaction fails."""
        with self._lock:
            self._refuse_forked_mid_unit()
            if self._in_unit:  # (SQLite has no nested transactions: a caller's mistake)
                raise RuntimeError("Catalog.transaction() within a transaction or snapshot")
            self._end_left_open()
            try:
                self._in_unit = True
                self._db.execute("BEGIN IMMEDIATE")
                yield self._db
                self._db.execute("INSERT INTO meta VALUES (?, '1') ON CONFLICT(key) DO UPDATE "
                                 "SET value = CAST(value AS INTEGER) + 1", (GENERATION,))
                # (a full disk fails it: the change is not made, in any process)
                self._db.execute("COMMIT")
            except BaseException:
                self._roll_back()
                raise
            finally:
                self._in_unit = False

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads that all see the catalog as of one moment: a commit of another
        process's (a gc rewriting chunks, then dropping their old bases) falls before
        or after them all, never between two. Its read transaction is ended on any
        exception, a Ctrl-C included: one left open blocks this catalog's writes."""
        with self._lock:
            self._refuse_forked_mid_unit()
            if self._in_unit:  # (within a transaction or snapshot: one moment already)
                yield
                return
            try:
                self._end_left_open()
                self._in_unit = True
                self._db.execute("BEGIN")  # deferred: the first read takes the snapshot
                yield
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._roll_back()
                raise self._failed(exc) from exc
            except BaseException:
                self._roll_back()
                raise
            finally:
                self._in_unit = False

    def _end_left_open(self) -> None:
        """Roll back a transaction that an earlier call left open (a second Ctrl-C that
        stopped its ROLLBACK) before a new one begins."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def _roll_back(self) -> None:
        """End the transaction in flight, where it is still open (a COMMIT that returned
        has ended it). A ROLLBACK that fails leaves it to ``_end_left_open``."""
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def _copied_into_memory(self) -> sqlite3.Connection:
        """The read-only catalog and its WAL, read through a copy in a temporary folder
        into memory: SQLite reads a WAL only through its shared-memory file, which it
        cannot create in a folder it cannot write (a store copied without its -shm after
        its trainer was killed read as empty)."""
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            with tempfile.TemporaryDirectory(prefix="ckpt_nb-catalog-") as folder:
                copy = Path(folder) / self.path.name
                shutil.copyfile(self.path, copy)
                with contextlib.suppress(FileNotFoundError):  # (checkpointed meanwhile)
                    shutil.copyfile(wal, copy.with_name(wal.name))
                source = sqlite3.connect(copy)
                memory = sqlite3.connect(":memory:", check_same_thread=False,
                                         isolation_level=None)
                memory.execute("PRAGMA trusted_schema=OFF")  # (as ``_open`` sets it)
                try:
                    source.backup(memory)
                finally:
                    source.close()
        except OSError as exc:
            raise StoreError(f"cannot read the catalog {self.path}: its folder is read-only, "
                             "so SQLite reads its journal from a copy, and copying it to a "
                             f"temporary folder failed ({exc}): copy the store somewhere "
                             "writable to open it") from exc
        memory.row_factory = sqlite3.Row
        return memory

    def _meta(self, key: str) -> str | None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        except sqlite3.OperationalError:  # a brand-new, empty database
            return None
        return None if row is None else row[0]

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def flag(self, key: str) -> bool:
        """Whether a one-off task recorded by ``set_flag`` was done on this catalog."""
        with self._lock:
            return self._meta(key) is not None

    def set_flag(self, key: str) -> None:
        """Record that a one-off task is done (after its work, so a crash redoes it)."""
        with self.transaction():
            self._set_meta(key, "1")

    def ranking(self) -> tuple[str, str] | None:
        """The metric and mode ("min" or "max") recorded by ``set_ranking``, or None
        where none was (no save ranked by a metric, or the catalog was rebuilt from a
        store whose saves were made before ckpt_nb kept it in their manifests too: ranking
        then falls back to what the metric's name says)."""
        with self._lock:
            found = self._meta(RANKING)
        try:
            metric, mode = json.loads(found) if found else (None, None)
        except (ValueError, TypeError):
            return None
        if isinstance(metric, str) and mode in ("min", "max"):
            return metric, mode
        return None

    def set_ranking(self, metric: str, mode: str) -> None:
        """Record the metric and mode the store's checkpoints are ranked by ("best"), and
        add it to those ever recorded."""
        with self.transaction():
            ever = self.rankings_recorded()
            if ever is None:  # (a catalog made before they were kept: its own, if any)
                ever = [] if self.ranking() is None else [self.ranking()]
            self._set_meta(RANKING, json.dumps([metric, mode]))
            self._set_meta(RANKINGS, json.dumps(
                [list(r) for r in dict.fromkeys([*ever, (metric, mode)])]))

    def rankings_recorded(self) -> list[tuple[str, str]] | None:
        """Every ranking saves ever recorded here (``set_ranking``), oldest first; None
        where the catalog does not know (one made before ckpt_nb kept them, or holding a
        value ckpt_nb does not write)."""
        with self._lock:
            found = self._meta(RANKINGS)
        try:
            ever = json.loads(found) if found else None
        except (ValueError, TypeError):
            return None
        if found is None and self.ranking() is None:
            return []
        if not isinstance(ever, list) or not all(
                isinstance(r, list) and len(r) == 2 and isinstance(r[0], str)
                and r[1] in ("min", "max") for r in ever):
            return None
        return [(metric, mode) for metric, mode in ever]

    # -- checkpoints --------------------------------------------------------
    def checkpoints(self) -> list[CheckpointRow]:
        """Every committed checkpoint, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM checkpoints ORDER BY seq").fetchall()
        return [CheckpointRow.from_sql(r) for r in rows]

    def newest(self, limit: int) -> list[CheckpointRow]:
        """The newest ``limit`` checkpoints, newest first: only those rows are decoded."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM checkpoints ORDER BY seq DESC LIMIT ?",
                                    (limit,)).fetchall()
        return [CheckpointRow.from_sql(r) for r in rows]

    def newest_ids(self, limit: int = -1) -> list[str]:
        """Checkpoint ids, newest first (at most ``limit``): no row decoded."""
        with self._lock:
            return [r[0] for r in self._db.execute(
                "SELECT id FROM checkpoints ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()]

    def pinned_or_noted(self) -> list[CheckpointRow]:
        """The checkpoints with a pin or a note, oldest first: no other row is decoded."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM checkpoints WHERE pinned OR note != '' "
                                    "ORDER BY seq").fetchall()
        return [CheckpointRow.from_sql(r) for r in rows]

    def get(self, checkpoint_id: str) -> CheckpointRow | None:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM checkpoints WHERE id=?", (checkpoint_id,)
            ).fetchone()
        return None if row is None else CheckpointRow.from_sql(row)

    def ids_at_step(self, step: int) -> list[str]:
        """The ids of the checkpoints saved at ``step``, newest first: no row decoded."""
        with self._lock:
            return [r[0] for r in self._db.execute(
                "SELECT id FROM checkpoints WHERE step=? ORDER BY seq DESC", (step,)).fetchall()]

    def ids_with_prefix(self, prefix: str) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM checkpoints WHERE id LIKE ? ESCAPE '\\'",
                (prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
            ).fetchall()
        return [r[0] for r in rows]

    def children(self, checkpoint_id: str) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM checkpoints WHERE parent=? ORDER BY seq", (checkpoint_id,)
            ).fetchall()
        return [r[0] for r in rows]

    def commit_checkpoint(
        self, row: CheckpointRow, new_chunks: Iterable[ChunkRow], refs: Iterable[str]
    ) -> None:
        """Make a checkpoint visible: chunks, refs, row and branch tip in one transaction.
        A row of the same save already there (its manifest's digest: a reader sharing
        this catalog read the store again without the lock after the save's files had
        landed, and listed it) gives way to this one: the save is committed, not refused.
        A new chunk's row replaces one already there: the save wrote it again, as the
        pack that row names was found missing or cut short."""
        with self.transaction() as db:
            db.execute("DELETE FROM checkpoints WHERE id=? AND manifest_digest=?",
                       (row.id, row.manifest_digest))
            self._insert(db, row, new_chunks, refs)

    def _seed(self, db: sqlite3.Connection, start: Seed) -> None:
        self._insert_chunks(db, start.chunks)
        for row in start.checkpoints:
            self._insert(db, row, (), start.refs.get(row.id, ()))
        self._set_meta("damaged", json.dumps(start.damaged))
        if start.ranking is not None:
            self._set_meta(RANKING, json.dumps(list(start.ranking)))
        self._set_meta(RANKINGS, json.dumps([list(r) for r in start.rankings]))
        self._set_meta(LEFT_OUT_KEYS, json.dumps(start.left_out_keys))

    def damaged(self) -> dict[str, str]:
        """The packs and manifests a rebuild found damaged (key -> what is wrong): kept
        in the store, never collected, for what is left in them to be recovered."""
        with self._lock:
            found = self._meta("damaged")
        try:
            damaged = json.loads(found) if found else {}
        except (ValueError, RecursionError) as exc:
            raise DamagedCatalog("its list of damaged files") from exc
        if not isinstance(damaged, dict):
            raise DamagedCatalog("its list of damaged files")
        return damaged

    def left_out_keys(self) -> dict[str, float | None]:
        """The store keys the last rebuild left out, not as damaged (``Seed.left_out_keys``);
        none where it did not say (a catalog of an older ckpt_nb): the store is then read
        again where it holds any."""
        with self._lock:
            found = self._meta(LEFT_OUT_KEYS)
        with contextlib.suppress(ValueError, RecursionError):
            keys = json.loads(found) if found else {}
            if isinstance(keys, dict) and all(
                    when is None or isinstance(when, (int, float)) for when in keys.values()):
                return keys
        return {}

    def failed_saves(self) -> list[str]:
        """The ids of saves that failed after writing files the store may keep (an
        upload whose reply was lost may have landed), until their deletion is recorded
        in the store: noted here first, since the store may not answer then."""
        with self._lock:
            found = self._meta(FAILED_SAVES)
        with contextlib.suppress(ValueError, RecursionError):
            ids = json.loads(found) if found else []
            if isinstance(ids, list) and all(isinstance(cid, str) for cid in ids):
                return ids
        return []

    def note_failed_save(self, checkpoint_id: str) -> None:
        """Add a failed save's id to ``failed_saves``."""
        with self.transaction():
            self._set_meta(FAILED_SAVES,
                           json.dumps(sorted({*self.failed_saves(), checkpoint_id})))

    def forget_failed_saves(self, ids: Iterable[str]) -> None:
        """Take ids out of ``failed_saves`` (their deletion is recorded in the store)."""
        with self.transaction():
            self._set_meta(FAILED_SAVES,
                           json.dumps(sorted(set(self.failed_saves()) - set(ids))))

    @staticmethod
    def _insert_chunks(db: sqlite3.Connection, chunks: Iterable[ChunkRow],
                       replacing: bool = False) -> None:
        db.executemany(
            f"INSERT OR {'REPLACE' if replacing else 'IGNORE'} INTO chunks"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(c.digest, c.pack, c.offset, c.length, c.raw_len, c.base, c.depth)
             for c in chunks],
        )

    @classmethod
    def _insert(cls, db: sqlite3.Connection, row: CheckpointRow, new_chunks: Iterable[ChunkRow],
                refs: Iterable[str]) -> None:
        cls._insert_chunks(db, new_chunks, replacing=True)
        db.executemany("INSERT OR IGNORE INTO refs VALUES (?, ?)",
                       [(row.id, d) for d in set(refs)])
        db.execute(
            "INSERT INTO checkpoints (id, parent, branch, created_at, step, epoch,"
            " batch_idx, metrics, strategy, full_base, chain, logical_bytes,"
            " stored_bytes, pinned, note, tags, manifest_digest)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row.id, row.parent, row.branch, row.created_at, row.step, row.epoch,
             row.batch_idx, json.dumps(row.metrics), row.strategy, row.full_base,
             row.chain, row.logical_bytes, row.stored_bytes, int(row.pinned),
             row.note, json.dumps(row.tags), row.manifest_digest),
        )
        db.execute("INSERT OR REPLACE INTO branches VALUES (?, ?)", (row.branch, row.id))

    def delete_checkpoints(self, ids: Iterable[str]) -> None:
        """Forget checkpoints; their children are re-parented to the grandparent, which
        is also recorded as each one's heir (``heir_of``)."""
        with self.transaction() as db:
            for cid in ids:
                parent = db.execute("SELECT parent FROM checkpoints WHERE id=?",
                                    (cid,)).fetchone()
                if parent is None:
                    continue
                db.execute("UPDATE checkpoints SET parent=? WHERE parent=?", (parent[0], cid))
                db.execute("UPDATE branches SET tip=? WHERE tip=?", (parent[0], cid))
                db.execute("DELETE FROM refs WHERE checkpoint=?", (cid,))
                db.execute("DELETE FROM checkpoints WHERE id=?", (cid,))
                self._set_meta(f"heir:{cid}", parent[0] or "")
            db.execute("DELETE FROM branches WHERE tip IS NULL")
            self._forget_oldest_heirs(db)

    @staticmethod
    def _forget_oldest_heirs(db: sqlite3.Connection) -> None:
        """Keep the heirs of the last ``HEIRS_KEPT`` deleted checkpoints only."""
        # (a rowid range, not a scan of every heir at each retention's delete: a replaced
        # row takes the next rowid, so the oldest heirs have the lowest)
        db.execute("DELETE FROM meta WHERE rowid <= (SELECT max(rowid) FROM meta) - ? "
                   "AND key LIKE 'heir:%'", (HEIRS_KEPT,))

    def heir_of(self, checkpoint_id: str) -> str | None:
        """The nearest kept ancestor of a deleted checkpoint (None for a root, or one
        deleted too long ago): where a manager whose live objects came from it, and
        that another manager deleted, saves next."""
        seen = set()
        with self._lock:
            at: str | None = checkpoint_id
            while at and at not in seen and self.get(at) is None:
                seen.add(at)
                at = self._meta(f"heir:{at}") or None
        return None if at in seen else at

    def was_deleted(self, checkpoint_id: str) -> bool:
        """Whether a checkpoint of this id was in the store and has been deleted (one of
        the last ``HEIRS_KEPT``): an id read a moment before retention took it is no typo."""
        with self._lock:
            return self._meta(f"heir:{checkpoint_id}") is not None

    def update(self, checkpoint_id: str, **fields: Any) -> None:
        """Change the pinned flag, the note or the tags of a checkpoint."""
        allowed = {"pinned", "note", "tags"}
        if not fields or set(fields) - allowed:
            raise ValueError(f"only {sorted(allowed)} can be updated")
        if "tags" in fields:
            fields["tags"] = json.dumps(fields["tags"])
        assignments = ", ".join(f"{name}=?" for name in fields)
        with self.transaction() as db:
            db.execute(f"UPDATE checkpoints SET {assignments} WHERE id=?",
                       (*fields.values(), checkpoint_id))
            # (counted: a copy of the catalog put back after a pin is told by it)
            self._set_meta(LABEL_CHANGES, str(int(self._meta(LABEL_CHANGES) or 0) + 1))

    # -- branches -----------------------------------------------------------
    def branch_tips(self) -> dict[str, str]:
        with self._lock:
            rows = self._db.execute("SELECT name, tip FROM branches").fetchall()
        return {r[0]: r[1] for r in rows}

    # -- chunks -------------------------------------------------------------
    def known(self, digests: Iterable[str]) -> set[str]:
        """Those of these digests that name a stored chunk."""
        return {r[0] for r in self._chunks_where_digest_in("digest", digests)}

    def chunks(self, digests: Iterable[str]) -> dict[str, ChunkRow]:
        """Location rows for the digests asked for (absent ones are left out)."""
        return {r["digest"]: ChunkRow(*r) for r in self._chunks_where_digest_in("*", digests)}

    def _chunks_where_digest_in(self, columns: str, digests: Iterable[str]) -> list[sqlite3.Row]:
        wanted = list(set(digests))
        found: list[sqlite3.Row] = []
        with self._lock:
            for i in range(0, len(wanted), 500):
                part = wanted[i : i + 500]
                marks = ",".join("?" * len(part))
                found += self._db.execute(
                    f"SELECT {columns} FROM chunks WHERE digest IN ({marks})", part).fetchall()
        return found

    def forget_damaged_gone(self, exists: Callable[[str], bool]) -> dict[str, str]:
        """The damaged keys still in the store (one deleted by hand is forgotten)."""
        with self.transaction():
            damaged = self.damaged()
            kept = {key: why for key, why in damaged.items() if exists(key)}
            if kept != damaged:
                self._set_meta("damaged", json.dumps(kept))
        return kept

    def note_damaged(self, key: str, why: str) -> None:
        """Add a pack a save or gc found missing or cut short to ``damaged``: gc() then
        keeps it, for what is left in it to be recovered, and counts it. (Written only
        where new: a save may find it again at every batch.)"""
        if self.damaged().get(key) == why:
            return
        with self.transaction():
            damaged = self.damaged()
            if damaged.get(key) != why:
                self._set_meta("damaged", json.dumps({**damaged, key: why}))

    def chunks_in_pack(self, pack: str) -> list[ChunkRow]:
        with self._lock:
            return [ChunkRow(*r) for r in
                    self._db.execute("SELECT * FROM chunks WHERE pack=?", (pack,)).fetchall()]

    def all_chunks(self) -> list[ChunkRow]:
        with self._lock:
            return [ChunkRow(*r) for r in self._db.execute("SELECT * FROM chunks").fetchall()]

    def refs(self, checkpoint_id: str | None = None) -> set[str]:
        """Digests referenced directly by one checkpoint, or by any."""
        with self._lock:
            if checkpoint_id is None:
                rows = self._db.execute("SELECT DISTINCT digest FROM refs").fetchall()
            else:
                rows = self._db.execute("SELECT digest FROM refs WHERE checkpoint=?",
                                        (checkpoint_id,)).fetchall()
            return {r[0] for r in rows}

    def referenced(self, digests: Iterable[str]) -> set[str]:
        """Those of these digests that some checkpoint refers to directly (an index
        lookup each: a retention's collection asks of its deleted checkpoints' chunks)."""
        return {r[0] for r in self._where_in("SELECT DISTINCT digest FROM refs WHERE digest",
                                             digests)}

    def stacked_on(self, digests: Iterable[str]) -> list[ChunkRow]:
        """The chunks stored as deltas on any of these digests."""
        return [ChunkRow(*r) for r in self._where_in("SELECT * FROM chunks WHERE base",
                                                     digests)]

    def _where_in(self, query: str, values: Iterable[str]) -> list[sqlite3.Row]:
        """``query`` + `` IN (...)`` over ``values``, 500 at a time."""
        wanted = list(set(values))
        found: list[sqlite3.Row] = []
        with self._lock:
            for i in range(0, len(wanted), 500):
                part = wanted[i : i + 500]
                found += self._db.execute(f"{query} IN ({','.join('?' * len(part))})",
                                          part).fetchall()
        return found

    def drop_chunks(self, digests: Iterable[str]) -> None:
        with self.transaction() as db:
            db.executemany("DELETE FROM chunks WHERE digest=?", [(d,) for d in digests])

    def move_chunks(self, moved: Iterable[ChunkRow]) -> None:
        """Point chunks at their new place (a compaction's pack; a delta rewritten
        whole, with no base), in one transaction."""
        with self.transaction() as db:
            db.executemany(
                "UPDATE chunks SET pack=?, offset=?, length=?, base=?, depth=? WHERE digest=?",
                [(c.pack, c.offset, c.length, c.base, c.depth, c.digest) for c in moved],
            )

    def packs(self) -> set[str]:
        with self._lock:
            return {r[0] for r in self._db.execute("SELECT DISTINCT pack FROM chunks").fetchall()}
