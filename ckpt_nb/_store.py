"""Where bytes live: a small key/value ``Store`` interface and its backends.

Keys are relative, ``/``-separated paths made of ``[A-Za-z0-9._-]`` segments;
ckpt_nb builds them from hex digests and generated ids only, never from names
found in a manifest. Every write is atomic: a reader sees the old value, the
new value, or nothing, and never a torn file, even after SIGKILL.
``ckpt_nb.testing.StoreConformance`` is the suite every backend must pass.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import difflib
import errno
import functools
import inspect
import io
import mmap
import os
import re
import resource
import shlex
import socket
import stat
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from . import _native
from ._buffers import fill
from ._errors import CorruptCheckpointError, MissingDependencyError, StoreError
from ._not_state import NotState
from ._units import human_size

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

_KEY = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
TMP_MARK = ".tmp-"
_TMP_HEX_DIGITS = 12  # after TMP_MARK in a temporary's name: which write made it
CATALOG_FILE = "catalog.sqlite"  # in a local store's folder
# A temporary's name, its value's name first: ``LocalStore.writer`` makes no other.
_TEMPORARY = re.compile(rf"(.+){re.escape(TMP_MARK)}[0-9a-f]{{{_TMP_HEX_DIGITS}}}")


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe store key, else raise ValueError."""
    if not _KEY.fullmatch(key) or any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"invalid store key {key!r}: use '/'-separated [A-Za-z0-9._-] parts")
    if TMP_MARK in key:
        raise ValueError(f"invalid store key {key!r}: {TMP_MARK!r} is reserved")
    return key


class Writer(Protocol):
    def write(self, data: bytes | memoryview, /) -> int: ...  # (as a file's)


class Store(ABC, NotState):
    """A flat namespace of immutable byte values with atomic puts."""

    url: str
    # Whether this machine's lock covers every writer of the store (a local folder, a
    # store in this process's memory); not so an object store's, written from anywhere.
    locked_everywhere: bool = True

    @abstractmethod
    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """The value's bytes ``[start, end)``; ``FileNotFoundError`` if absent."""

    @abstractmethod
    def writer(self, key: str) -> contextlib.AbstractContextManager[Writer]:
        """A context whose writes become ``key`` atomically when it exits cleanly.

        On an exception nothing is stored and the old value, if any, stays.
        """

    @abstractmethod
    def has(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int:
        """Length of the value in bytes; ``FileNotFoundError`` if absent."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; removing an absent key is not an error."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix`` (a folder, e.g. ``"packs"``), in no set order."""

    def sizes(self, prefix: str) -> dict[str, int]:
        """Each key under ``prefix`` and its value's length in bytes, from one listing
        where the store gives sizes in it (an object store: a request per key made
        ``ckpt-nb ls`` and a save under a byte budget one HEAD per pack and manifest);
        a key deleted meanwhile is left out."""
        found = {}
        for key in self.list(prefix):
            with contextlib.suppress(FileNotFoundError):
                found[key] = self.size(key)
        return found

    def versions(self, prefix: str) -> dict[str, str | None] | None:
        """Each key under ``prefix`` with a tag that changes whenever its value does (an
        object store's ETag; None for a key listed without one), from one listing; None
        where the store's listings give no such tags."""
        return None

    def read_into(self, key: str, start: int, out: memoryview) -> int:
        """Fill ``out`` with the value's bytes from ``start``; returns how many.

        Fewer than ``len(out)`` only where the value ends first. Restores read
        every chunk through here into a reused buffer: a fresh ``bytes`` per
        chunk costs a page fault per 4 KiB, which made reading slower than
        decoding. ``FileNotFoundError`` if absent.
        """
        data = self.get(key, start, start + len(out))
        out[: len(data)] = data
        return len(data)

    def view(self, key: str) -> memoryview | None:
        """The whole value as a read-only view without copying it, where the
        store can give one (LocalStore maps the file), else None: callers then
        read what they need with ``read_into``. ``FileNotFoundError`` if absent.

        Restores decode chunks straight out of the view: reading a pack through
        a buffer first cost as much as decoding it.
        """
        if not self.has(key):
            raise FileNotFoundError(key)
        return None

    def prefetch(self, key: str, ranges: Iterable[tuple[int, int]]) -> None:
        """A hint that these (start, length) ranges of the value are read next, so
        that a store can fetch them ahead, together. It may do nothing (the default)."""

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` under ``key`` atomically."""
        with self.writer(key) as out:
            out.write(data)

    def sweep_temporaries(self) -> tuple[int, int]:
        """Remove half-written values a crash left behind; returns how many, and their
        bytes (what gc reports freed). A store that writes none has none to remove."""
        return 0, 0

    def modified(self, prefix: str) -> dict[str, float] | None:
        """Keys under ``prefix`` with the time each was written (seconds since the
        epoch), where other machines may write this store (not ``locked_everywhere``):
        there a file that no catalog names yet may be a save in flight (gc leaves one
        younger than an hour alone). None where this machine's lock covers every writer."""
        return None

    @property
    def identity(self) -> str:
        """What tells this store from every other, for keying its catalog cache and lock
        (by default its URL)."""
        return self.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


# What a store that cannot be made for want of permission (a read-only folder or file
# system) adds to its error.
UNWRITABLE_STORE = " (a folder this process cannot write): give a directory it can write"


class LocalStore(Store):
    """A directory on local disk; values are files, fsynced before they appear."""

    def __init__(self, root: str | os.PathLike[str], *, durable: bool = True) -> None:
        refuse_empty_location(os.fspath(root))
        self.root = Path(root).expanduser().absolute()
        self.durable = durable
        self.url = self.root.as_uri()
        # (a store this opening made, rather than found: a read from it names a misspelt
        # path, where "no checkpoints yet" alone did not)
        self.made_here = not self.root.exists()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            blocking = next((p for p in (self.root, *self.root.parents) if p.is_file()), None)
            if blocking is not None:  # (said as %ckpt_list and explore() say it)
                raise StoreError(f"{blocking} is a file: give a directory, the folder a "
                                 "CheckpointManager saves its checkpoints into") from None
            unwritable = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
            raise StoreError(f"cannot create store directory {self.root}: {exc}"
                             + (UNWRITABLE_STORE if unwritable else "")) from exc
        _refuse_links(self.root)
        self._refuse_linked_values()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _refuse_linked_values(self) -> None:
        """Refuse a store whose values in its own folders (manifests, packs, labels,
        records) are symbolic links, as a DVC or git-annex checkout into a cache makes
        them: ckpt_nb reads no link, so such a store opened as holding no checkpoints,
        its catalog was rewritten empty, and a notebook's ``%%ckpt_auto`` trained from
        scratch."""
        try:
            links = [key for folder in _OWN_FOLDERS for key, entry in self._entries(folder)
                     if entry.is_symlink()]
        except OSError:
            return  # (unreadable: the first read says so)
        if links:
            first = self.root / links[0]
            more = f", and {len(links) - 1} more" if len(links) > 1 else ""
            raise StoreError(
                f"the store at {self.root} holds symbolic links in place of its files "
                f"({first} -> {os.readlink(first)}{more}): ckpt_nb follows no links inside "
                "a store, so it would find no checkpoint there; put the files themselves "
                f"there (`cp -rL {shlex.quote(str(self.root))} NEW` copies the store with them; "
                "DVC and git-annex can check files out as copies, or unlock them), then "
                "open it again")

    def _open(self, key: str, buffering: int = -1) -> Any:
        """A value's file, for reading. A link, a FIFO or a device there is damage (a
        copied or hostile store may hold one: a FIFO would block the read forever)."""
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | _NO_FOLLOW | getattr(os, "O_NONBLOCK", 0))
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise CorruptCheckpointError(f"{path} is a symbolic link: ckpt_nb reads no "
                                         "links in a store; put the file itself there") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CorruptCheckpointError(f"{path} is not a regular file: move it out of the "
                                         "store")
        return open(fd, "rb", buffering=buffering)

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        with self._open(key) as f:
            if start:
                f.seek(start)
            if end is None:
                return f.read()
            return f.read(end - (start or 0))

    @contextlib.contextmanager
    def writer(self, key: str) -> Iterator[Writer]:
        # The file system's refusals are StoreErrors naming the key: in opening, in each
        # write, and in closing; not what the caller's own code raises in between.
        path = self._path(key)
        tmp = path.with_name(f"{path.name}{TMP_MARK}{uuid.uuid4().hex[:_TMP_HEX_DIGITS]}")
        with _writing(key, self.root):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if self.durable and _DirectWriter.available:
                with _DirectWriter(fd) as direct:
                    yield _NamedWriter(direct, key, self.root)
                    with _writing(key, self.root):
                        direct.finish()
            else:
                with os.fdopen(fd, "wb", buffering=0, closefd=False) as raw:
                    yield _NamedWriter(_FullWriter(raw, fd if self.durable else None), key,
                                       self.root)
            with _writing(key, self.root):
                if self.durable:
                    os.fsync(fd)
                os.close(fd)
                fd = -1
                try:
                    os.replace(tmp, path)
                except FileNotFoundError as exc:
                    raise StoreError(
                        f"cannot write {key} in the store {self.root}: its temporary "
                        f"{tmp.name} was deleted while it was written, by something else that "
                        "cleans that folder (a script, or an older ckpt_nb's gc of a store "
                        "whose folder holds this one): nothing was saved under it, and what "
                        "was saved before is intact; stop that cleanup, or move this store "
                        "out of the other's folder, then save again"
                    ) from exc
                if self.durable:
                    _fsync_dir(path.parent)
        except BaseException:
            # (a file system gone read-only or failing refuses these too: their OSError,
            # naming only the temporary, took the place of the error in flight, which says
            # what failed; gc sweeps a temporary left)
            with contextlib.suppress(OSError):
                if fd >= 0:
                    os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def read_into(self, key: str, start: int, out: memoryview) -> int:
        with self._open(key, buffering=0) as f:
            f.seek(start)
            return fill(f, out)

    def view(self, key: str) -> memoryview:
        # Committed values are never rewritten in place (writes go to a new name and
        # are renamed over), so the mapping stays what it was when it was made.
        with self._open(key) as f:
            if os.fstat(f.fileno()).st_size == 0:
                return memoryview(b"")
            try:
                return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            except OSError as exc:
                if exc.errno != errno.ENOMEM:
                    raise
                # (as a MemoryError: "[Errno 12] Cannot allocate memory" named no file,
                # and said nothing of a limit)
                raise MemoryError(
                    f"no memory left to map {key} of the store {self.root} "
                    f"({os.fstat(f.fileno()).st_size / 2**20:.0f} MiB): this process's "
                    "address space (limited by ulimit -v, RLIMIT_AS) or the machine's memory "
                    "ran out; free some, or raise the limit, then try again") from exc

    def prefetch(self, key: str, ranges: Iterable[tuple[int, int]]) -> None:
        # Packs are written with direct I/O, so not left in the page cache: a read
        # would otherwise fault them in 128 KiB at a time, one round trip each.
        if not hasattr(os, "posix_fadvise"):
            return
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except OSError:
            return  # a hint: the read itself reports what is wrong
        try:
            for start, length in _merged(ranges):
                os.posix_fadvise(fd, start, length, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)

    def has(self, key: str) -> bool:
        # (a link or a FIFO there is held too, not followed: read, it fails as damage; taken
        # for gone, gc forgot the damaged checkpoint it was, and deleted its packs)
        try:
            return not stat.S_ISDIR(os.lstat(self._path(key)).st_mode)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            raise

    def size(self, key: str) -> int:
        return os.lstat(self._path(key)).st_size

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(key))

    def list(self, prefix: str = "") -> Iterator[str]:
        for key, _ in self._entries(prefix):
            yield key

    def sizes(self, prefix: str) -> dict[str, int]:
        found = {}
        for key, entry in self._entries(prefix):
            with contextlib.suppress(FileNotFoundError):
                found[key] = entry.stat(follow_symlinks=False).st_size
        return found

    def _entries(self, prefix: str) -> Iterator[tuple[str, os.DirEntry[str]]]:
        """The keys under ``prefix``, each with its directory entry: every name ckpt_nb
        could have written, not a copy named "x (1).pack". A link, a FIFO or a device of
        such a name is listed too, never followed: reading it fails as damage (``_open``),
        which a rebuild names and gc keeps; left unlisted, its checkpoint vanished from a
        catalog read again, and gc deleted the packs it needs."""
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir() or base.is_symlink():
            return
        # (a key cut from its path as a string: pathlib's relative_to for each file was
        # a third of the time an open and an ls of a store of 1,500 checkpoints took)
        root = os.path.join(os.fspath(self.root), "")
        folders = [os.fspath(base)]
        while folders:
            try:
                entries = os.scandir(folders.pop())
            except FileNotFoundError:  # (removed meanwhile, as os.walk skips it)
                continue
            with entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                        continue
                    key = entry.path[len(root):].replace(os.sep, "/")
                    if TMP_MARK not in key and _is_key(key):
                        yield key, entry

    def sweep_temporaries(self) -> tuple[int, int]:
        """Remove the temporaries ckpt_nb's own writes left (``writer``'s names, in the
        store's top and its own folders, not below): a user's ``notes.tmp-2.md``, and a
        store inside this one's folder, with its saves in flight, are no part of it."""
        count = freed = 0
        for folder in ("", *_OWN_FOLDERS):
            path = self.root / folder
            if folder and path.is_symlink():
                continue  # (refused when the store opened: one made since is not its own)
            try:
                entries = os.scandir(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with entries:
                for entry in entries:
                    if entry.is_file(follow_symlinks=False) and \
                            _is_own_temporary(entry.name, folder):
                        try:
                            size = entry.stat(follow_symlinks=False).st_size
                            os.unlink(entry.path)
                        except FileNotFoundError:
                            continue
                        except OSError as exc:  # (a bare OSError named only the file)
                            error = StoreError(
                                f"cannot remove {entry.path}, a temporary that a write cut "
                                f"short left in the store {self.root} ({exc.strerror or exc}): "
                                f"{why_unwritable(exc)}, then run gc again")
                            error.errno = exc.errno
                            raise error from exc
                        count, freed = count + 1, freed + size
        return count, freed


_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _is_key(key: str) -> bool:
    try:
        check_key(key)
    except ValueError:
        return False
    return True


# The folders ckpt_nb writes its values into (``_format``; its format file is at the top).
_OWN_FOLDERS = ("packs", "manifests", "labels", "runs", "deleted")
# What ckpt_nb keeps at a local store's top: its folders, its format file, its catalog.
_OWN_NAMES = re.compile("|".join([*_OWN_FOLDERS, r"ckpt_nb\.json", r"catalog\.sqlite.*"]))


def _is_own_temporary(name: str, folder: str) -> bool:
    """Whether ``name``, in ``folder`` (one of ``_OWN_FOLDERS``, or "" for the store's top),
    is a temporary ``LocalStore.writer`` made for a value of a name ckpt_nb makes: a store
    named ``runs`` inside this one keeps its own ``ckpt_nb.json``'s."""
    # (imported here: ``_format`` imports this module)
    from ._format import FORMAT_KEY, id_of, is_deletion_key, is_pack_key, is_run_key

    match = _TEMPORARY.fullmatch(name)
    if match is None:
        return False
    key = f"{folder}/{match[1]}" if folder else match[1]
    return key == FORMAT_KEY or is_pack_key(key) or is_deletion_key(key) or \
        is_run_key(key) or id_of(key) is not None


def _refuse_links(root: Path) -> None:
    """Refuse a store whose own folders or files are symbolic links: its writes,
    SQLite's among them, and gc's deletions would land in whatever they point to."""
    try:
        with os.scandir(root) as entries:
            links = [entry.name for entry in entries
                     if entry.is_symlink() and _OWN_NAMES.fullmatch(entry.name)]
    except OSError:
        return  # (unreadable: the first read says so)
    if links:
        raise StoreError(
            f"the store at {root} holds a symbolic link ({root / links[0]} -> "
            f"{os.readlink(root / links[0])}): ckpt_nb follows no links inside a store, "
            "since its writes and gc's deletions would land outside it; put the folder "
            "or file itself there")


_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
_REFUSED = _FULL | {errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}


def why_unwritable(exc: OSError) -> str:
    """What to do about a file the file system would not write or remove (the lock file, a
    temporary gc sweeps): a full disk's "free some room" cannot help a read-only one."""
    if exc.errno == errno.EROFS:
        return "its file system is read-only (remounted so after a disk error?): make it " \
            "writable again, or copy the store to one that is"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "its disk is full: free some room"
    if exc.errno == errno.EFBIG:
        return "its disk is full, or this process may write no file that large (ulimit -f): " \
            "free some room, or raise the limit"
    if exc.errno == errno.EIO:
        return "its disk failed to write it: check the disk (the system's log, dmesg, says " \
            "more)"
    return "make it, and its folder, writable for this user"


def _why_full(exc: OSError) -> str:
    """What to do about a write refused for want of room: a file past this process's
    file-size limit (ulimit -f, EFBIG) is no full disk, which "free some room" said."""
    if exc.errno != errno.EFBIG:
        return "free some room"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        return (f"this process may write no file over {human_size(limit)} ({limit} bytes: "
                "its file-size limit, ulimit -f): raise the limit")
    return ("the file system takes no file this big (FAT32's largest is 4 GiB): put the "
            "store on another file system")


@contextlib.contextmanager
def _writing(key: str, root: Path) -> Iterator[None]:
    """The file system's refusals to write ``key`` as StoreErrors that name it (the errno
    kept): "[Errno 28] No space left on device" said neither what nor where."""
    try:
        yield
    except StoreError:
        raise
    except OSError as exc:
        if exc.errno not in _REFUSED:
            raise
        hint = f": {_why_full(exc)}, then try again (what was saved before is intact)" \
            if exc.errno in _FULL else f": {why_unwritable(exc)}" \
            if exc.errno in (errno.EROFS, errno.EIO) else ""
        error = StoreError(f"cannot write {key} in the store {root}: "
                           f"{exc.strerror or exc}{hint}")
        error.errno = exc.errno
        raise error from exc


class _NamedWriter:
    """A writer whose methods raise the file system's refusals as ``_writing`` does."""

    def __init__(self, inner: Any, key: str, root: Path) -> None:
        self._inner, self._key, self._root = inner, key, root

    def write(self, data: bytes | memoryview, /) -> int:
        with _writing(self._key, self._root):
            return self._inner.write(data)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            with _writing(self._key, self._root):
                return attribute(*args, **kwargs)
        return call


def _merged(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, length) ranges, sorted, with touching or overlapping ones joined."""
    out: list[list[int]] = []
    for start, length in sorted(ranges):
        if out and start <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], start + length - out[-1][0])
        else:
            out.append([start, length])
    return [(s, n) for s, n in out]


class _FullWriter:
    """Loops over short writes, which a raw file may return.

    Given ``fd``, it also starts the kernel's write-back of every few MiB as
    they are written (``sync_file_range``, Linux), so the disk works while the
    caller encodes the next chunks and the closing fsync finds little left to
    flush: on a 75 MB pack that fsync went from ~42 ms to ~3 ms. Durability
    still comes from that fsync alone.
    """

    KICK_BYTES = 4 << 20

    def __init__(self, raw: io.RawIOBase, fd: int | None = None) -> None:
        self._raw = raw
        self._fd = fd if _sync_file_range is not None else None
        self._written = 0
        self._flushed = 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += self._raw.write(view[done:]) or 0
        self._wrote(done)
        return done

    def write_many(self, parts: Sequence[bytes | memoryview]) -> int:
        """Write ``parts`` in order, gathered into few system calls (``writev``).

        Each return from a blocking call waits for the GIL, which encoding threads
        hold: a pack written a blob part at a time spent most of its time there.
        """
        views = [memoryview(p).cast("B") for p in parts]
        if not hasattr(os, "writev"):
            return sum(self.write(v) for v in views)
        fd, first, done = self._raw.fileno(), 0, 0
        while first < len(views):
            n = os.writev(fd, views[first : first + _IOV_MAX])
            done += n
            while first < len(views) and n >= len(views[first]):
                n -= len(views[first])
                first += 1
            if n:  # a short write ended inside this part
                views[first] = views[first][n:]
        self._wrote(done)
        return done

    def _wrote(self, nbytes: int) -> None:
        self._written += nbytes
        if self._fd is not None and self._written - self._flushed >= self.KICK_BYTES:
            _sync_file_range(self._fd, self._flushed, self._written - self._flushed,
                             _SYNC_FILE_RANGE_WRITE)
            self._flushed = self._written


class _DirectWriter:
    """Writes a file of more than a few MiB with direct I/O (``O_DIRECT``, Linux).

    Why: buffered writes copy every byte into freshly allocated page cache, on
    the CPU, which here ran at 0.3-1 GB/s while encoding threads competed for
    the same two cores; direct writes DMA from reused, aligned staging buffers,
    with no CPU spent. Where the C kernels were built, a native thread writes the
    stages (``_native.BackgroundWriter``) while the caller fills the next ones: a
    Python thread back from each write waited for the GIL as long as the disk had
    taken, with the disk idle. Smaller files, and file systems that refuse direct
    I/O, are written the ordinary way. Durability still comes from the caller's
    fsync. What is written this way is not left in the page cache;
    ``LocalStore.view`` asks the kernel to read ahead.
    """

    available = hasattr(os, "O_DIRECT") and fcntl is not None
    ALIGN = 4096  # covers 512-byte and 4 KiB logical blocks
    STAGE = 4 << 20
    STAGES = 3  # one being filled, the others on their way to the disk
    _free_stages: list[list[np.ndarray]] = []  # reused: fresh memory costs page faults
    _lock = threading.Lock()

    def __init__(self, fd: int) -> None:
        self._fd = fd
        with self._lock:
            stages = self._free_stages.pop() if self._free_stages else None
        if stages is None:
            stages = [self._aligned(self.STAGE) for _ in range(self.STAGES)]
        self._stages = stages
        self._sent = [0] * len(stages)  # the background write each stage went out in
        self._current = 0  # the stage being filled
        self._filled = 0  # bytes in it, not yet written
        self._written = 0  # bytes handed to the disk: the current stage's file offset
        self._direct: bool | None = None  # unknown until the first full stage
        self._background: _native.BackgroundWriter | None = None
        self._may_hand_on = _native.writer  # to a native thread, once direct I/O works
        self._finished = False

    @classmethod
    def _aligned(cls, size: int) -> np.ndarray:
        spare = np.empty(size + cls.ALIGN, dtype=np.uint8)
        skip = -spare.ctypes.data % cls.ALIGN
        return spare[skip : skip + size]

    def __enter__(self) -> _DirectWriter:
        return self

    def finish(self) -> None:
        """Write what is staged (else the block's clean exit does)."""
        if not self._finished:
            self._finished = True
            self._finish()

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is None:
                self.finish()
        finally:
            try:
                self._stop_background()  # (its writes read the stages: first)
            finally:
                if self._background is None:  # (else in a thread's hands: not reused)
                    with self._lock:
                        self._free_stages.append(self._stages)

    def _stop_background(self) -> None:
        """Stop the native thread, through a Ctrl-C that comes meanwhile (raised once
        it stopped): left running, it wrote from stages put back for another file, into
        a descriptor its caller closes. A write error is left to the error on its way,
        which says more."""
        interrupted: KeyboardInterrupt | None = None
        while self._background is not None:
            try:
                with contextlib.suppress(OSError):
                    self._background.close()
                self._background = None
            except KeyboardInterrupt as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted

    def write(self, data: bytes | memoryview) -> int:
        return self.write_many([data])

    def write_many(self, parts: Sequence[bytes | memoryview]) -> int:
        # memoryview copies keep the GIL (NumPy's let it go per part, and each
        # return then waited for the encoding threads to hand it back).
        total = 0
        for part in parts:
            view = memoryview(part).cast("B")
            pos = 0
            while pos < len(view):
                stage = memoryview(self._stages[self._current])
                n = min(len(view) - pos, self.STAGE - self._filled)
                stage[self._filled : self._filled + n] = view[pos : pos + n]
                self._filled += n
                pos += n
                if self._filled == self.STAGE:
                    self._send(self.STAGE)
            total += len(view)
        if self._direct and self._filled >= self.ALIGN:
            # What fills whole blocks goes now: the disk works while the caller
            # encodes, instead of after the last part, on the closing thread.
            self._send(self._filled - self._filled % self.ALIGN)
        return total

    def _finish(self) -> None:
        """Write what is staged: padded to a block when direct, then cut back."""
        length = self._written + self._filled
        if not self._direct:
            self._send(self._filled)
            return
        padded = -(-self._filled // self.ALIGN) * self.ALIGN
        self._stages[self._current][self._filled : padded] = 0
        self._filled = padded
        self._send(padded)
        if self._background is not None:
            self._background.close()  # (kept until it returns: __exit__ stops it otherwise)
            self._background = None
        os.ftruncate(self._fd, length)

    def _send(self, n: int) -> None:
        """Write the current stage's first ``n`` bytes, and carry the rest (less
        than a block) to the start of the next stage."""
        stage = self._stages[self._current]
        if self._direct is None:
            self._direct = n % self.ALIGN == 0 and self._set_direct(True)
        elif self._direct and self._background is None and self._may_hand_on:
            try:
                self._background = _native.BackgroundWriter(self._fd)
            except OSError:  # no thread to be had: this one writes
                self._may_hand_on = False
        if self._background is not None:
            self._sent[self._current] = self._background.submit(stage[:n], self._written)
        else:
            self._write_now(stage[:n])
        self._written += n
        tail = self._filled - n
        following = (self._current + 1) % len(self._stages)
        if self._background is not None:
            self._background.wait(self._sent[following])  # free to fill again
        self._stages[following][:tail] = stage[n : n + tail]
        self._current, self._filled = following, tail

    def _write_now(self, data: np.ndarray) -> None:
        view, done = memoryview(data), 0
        while done < len(view):
            try:
                done += os.pwrite(self._fd, view[done:], self._written + done)
            except OSError as exc:
                if not (self._direct and exc.errno == errno.EINVAL and done == 0):
                    raise
                self._direct = self._set_direct(False)  # the file system refused it

    def _set_direct(self, on: bool) -> bool:
        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        try:
            fcntl.fcntl(self._fd, fcntl.F_SETFL,
                        flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
        except OSError:
            return False
        return on


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` where there is one (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


_SYNC_FILE_RANGE_WRITE = 2
_IOV_MAX = 1024
_sync_file_range = _load_sync_file_range()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MemoryStore(Store):
    """A store in a dict: for tests and throwaway sessions."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.url = f"memory://{id(self):x}"

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        try:
            value = self._data[check_key(key)]
        except KeyError:
            raise FileNotFoundError(key) from None
        return value[start:end]

    @contextlib.contextmanager
    def writer(self, key: str) -> Iterator[Writer]:
        check_key(key)
        buf = io.BytesIO()
        yield buf
        with self._lock:
            self._data[key] = buf.getvalue()

    def view(self, key: str) -> memoryview:
        return memoryview(self.get(key))

    def has(self, key: str) -> bool:
        return check_key(key) in self._data

    def size(self, key: str) -> int:
        return len(self.get(key))

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(check_key(key), None)

    def list(self, prefix: str = "") -> Iterator[str]:
        head = f"{check_key(prefix)}/" if prefix else ""
        return iter([k for k in list(self._data) if k.startswith(head)])


@contextlib.contextmanager
def _spool() -> Iterator[tuple[IO[bytes], str]]:
    """A local temporary file to upload from, and a path that opens it. Where the system
    lets a process open its own descriptors by path (Linux's /proc), the file has no
    name: a kernel killed mid-upload (out of memory, say) leaves nothing behind in the
    temporary folder, where a named spool kept a checkpoint's size there each time."""
    if os.path.isdir("/proc/self/fd"):
        with tempfile.TemporaryFile(prefix="ckpt_nb-") as spool:
            yield spool, f"/proc/self/fd/{spool.fileno()}"
    else:
        with tempfile.NamedTemporaryFile(prefix="ckpt_nb-") as spool:
            yield spool, spool.name


class FsspecStore(Store):
    """Any fsspec file system (object storage, memory://, ...), under one root.

    A value is spooled to a local temporary file and uploaded in one put, which
    object stores make visible atomically. Listings and sizes are asked of the store
    itself, never of fsspec's listing cache (another process's save would look
    missing); a failure of the backend (a connection refused, a botocore error) is a
    ``StoreError`` that names the store.

    An S3 store (the innermost file system S3's: ``dir::s3://`` too) waits 5 seconds to
    connect and 5 for each read, one attempt of botocore's for each of s3fs's own retries
    (``{"connect_timeout": 5, "read_timeout": 5, "retries": {"total_max_attempts": 1}}``):
    a server that takes connections but never answers fails a request in about 30
    seconds (botocore's own defaults waited minutes, retried by s3fs five times over).
    For other timeouts, pass ``config_kwargs={...}`` (botocore's ``Config``; given to S3
    in a chain too), give them in S3's own options (``s3={"config_kwargs": ...}``), or set
    them in fsspec's configuration; the keys given there win (S3's own options' first).

    In a chain (``dir::s3://``, ``target_protocol='s3'``), an option given at the top
    goes to the outermost file system of the chain that takes it: the object store's
    (``endpoint_url=``, ``key=``, ``secret=``) reach S3, where fsspec gave them to
    ``dir::``, which ignored them; one that none takes is a ``TypeError``.

    A file system on this machine's disk (``file://``, ``local://``, a cache or folder
    over one) is refused, naming the folder: a local store is a ``LocalStore``, which
    every manager of that folder locks, and whose writes are atomic. Through fsspec its
    catalog and lock were a cache elsewhere, and another manager's gc deleted its
    checkpoints. So are a caching file system (``simplecache::s3://...``), whose stale
    copies of the labels other machines rewrite hid their pins from retention, and one
    that only reads (http, an archive), each by name, at any layer of the chain the URL
    and its options open, and a chain with a part that none of its file systems uses
    (``s3://b/exp::x``, which fsspec opens as ``s3://b/exp``).

    A ``dir::`` folder with no path of its own holds the store at the path of what it
    wraps: ``dir::s3://b/x`` is the store ``s3://b/x`` (not ``s3://b/x/b/x``).
    """

    def __init__(self, url: str, **storage_options: object) -> None:
        _check_parts(url)
        _check_writable(url, options=storage_options)
        storage_options = _routed(url, storage_options)
        self.fs, root = _opened(url, storage_options)
        layers = _layers(self.fs, root)
        timed = _with_timeouts(url, storage_options, layers[-1][0])
        if timed is not storage_options:  # (S3 inside: opened again, with its timeouts)
            self.fs, root = _opened(url, timed)
            layers = _layers(self.fs, root)
        _check_chain_used(url, layers)
        _check_writable(url, layers)
        doubled, former = _root_in(url, layers), root
        if doubled is not None:  # (the store at the URL's path, not at that path inside it)
            root = ""
            layers = _layers(self.fs, root)
        folder = _local_folder(layers)
        if folder is not None:
            raise ValueError(
                f"{url} is the folder {folder} on this machine: give its path instead "
                f"(CheckpointManager({folder!r}), LocalStore({folder!r})), whose lock every "
                "manager of the folder takes and whose writes are atomic; through fsspec, "
                "another manager's gc there would delete the checkpoints saved this way")
        cache = _cache_in(url, layers)
        if cache is not None:
            raise ValueError(
                f"{url}: {cache}:: serves what it read once from a copy on this machine, "
                "while other machines rewrite a store's labels (pins, notes) in place: a "
                "checkpoint pinned there would read as unpinned here, and retention here "
                f"would delete it. Give the URL without {cache}:: (ckpt_nb keeps its own "
                "cache of the store's catalog on this machine)")
        if "//" in root.strip("/") or "//" in layers[-1][1].strip("/"):
            # An object store keeps the empty segment in its keys: s3://b//x is another
            # store than s3://b/x, whose listings (by folder) found nothing in it.
            raise ValueError(f"{url} has an empty path segment ('//'): write the URL "
                             "with single slashes between its parts")
        self.root = root.rstrip("/")
        self.url = canonical_url(url)
        # (the innermost file system holds the files: dir::s3://b/x is an S3 store)
        self._uploads_async = _uploads_async(layers)
        self._files, files_root = layers[-1]
        self._files_root = files_root.rstrip("/")
        protocols = _protocols(self._files)
        self._s3 = bool(protocols & {"s3", "s3a"})
        if self._s3:
            _check_bucket(url, self._files_root)
        # An object store has no folders to make, and its makedirs creates a bucket (on
        # AWS, a misspelt one in whatever account and region are configured): a write
        # to a bucket that is not there fails instead, naming it.
        self._makes_folders = not protocols & _BUCKETED
        self.locked_everywhere = "memory" in protocols  # (this process's: one lock)
        # Where an earlier ckpt_nb saved this store, at its path inside itself, in the
        # outermost file system and the innermost (one in this process's memory it did not).
        self._doubled_root = former if doubled is not None and not self.locked_everywhere \
            else None
        self._doubled_files = doubled
        self._fetched = _Fetched()

    @property
    def identity(self) -> str:
        """The store's files as the file system that holds them names them (s3a:// is
        s3://; dir::s3://b/x and async_wrapper::s3://b/x are s3://b/x, the same store),
        and the endpoint or host it talks to: s3://b/x on two servers is two stores."""
        files = self._files
        protocol = _name(files)
        scheme, sep, rest = self.url.partition("://")
        if files is not self.fs:  # (a chain, or options, that name the files' system)
            same = f"{protocol}://{self._files_root.lstrip('/')}"
        else:
            same = f"{protocol}://{rest}" if sep and scheme in _protocols(files) else self.url
        where = (getattr(files, "client_kwargs", None) or {}).get("endpoint_url") or \
            getattr(files, "endpoint_url", None) or \
            (getattr(files, "host", None) if files is not self.fs else None)
        return f"{same} at {where}" if where else same

    def _path(self, key: str) -> str:
        # (a store at its file system's top, a dir:: folder's, is its keys alone: a '/'
        # before them is kept inside it, an empty path segment in S3)
        return f"{self.root}/{check_key(key)}" if self.root else check_key(key)

    @contextlib.contextmanager
    def _asking(self, what: str, path: str | None = None) -> Iterator[None]:
        """Ask the backend, fresh: its own errors become StoreErrors, those of dropping
        what it cached of ``path`` too (hf:// asks its server there: offline, its
        ConnectError went out raw, a traceback from ``ckpt-nb ls``)."""
        try:
            if path is not None:
                self.fs.invalidate_cache(path)
            yield
        except (FileNotFoundError, StoreError):
            raise
        except Exception as exc:  # noqa: BLE001 - any backend's own (botocore's are not OSError)
            raise StoreError(f"{what} at {self.url} failed: {exc}"
                             f"{self._hint(exc, writing=what.startswith(_WRITES))}") from exc

    def _hint(self, exc: Exception, writing: bool = False) -> str:
        """What to check where the server could not be reached, where it refused who we
        are (S3's 403) or, in a write, what we may do, or where there were no credentials
        to give it; and that an object archived (S3's GLACIER) is restored first, which
        no credentials or retry change."""
        if isinstance(exc, (ConnectionError, TimeoutError)) or _UNREACHABLE.search(str(exc)):
            where = ": FSSPEC_S3_ENDPOINT_URL, or FsspecStore(url, endpoint_url=...)" \
                if self._s3 else ""
            return f" (check that the server is up, and its address{where})"
        if _ARCHIVED.search(" ".join(_told(exc))):
            return (" (the object is archived: its storage class, such as GLACIER, is "
                    "read only once restored; restore it first, with S3's restore-object, "
                    "or copy it back to the STANDARD class)")
        if not (isinstance(exc, PermissionError) or _DENIED.search(str(exc))):
            return ""
        if self._s3 and getattr(self._files, "anon", False):
            return (" (the store was opened anonymously, anon=True, which sends no "
                    "credentials and reads only what is public: drop anon=True to use "
                    "the AWS credentials configured, or give them: FsspecStore(url, "
                    "key=..., secret=...))")
        if writing and _WRITE_DENIED.search(str(exc)):
            return (" (the credentials given may not write or delete there: check that "
                    "they are allowed to, not only to read (on S3, s3:PutObject and "
                    "s3:DeleteObject on the bucket's objects))")
        if self._s3:
            return (" (check the credentials: the AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY environment variables, ~/.aws/credentials, "
                    "or FsspecStore(url, key=..., secret=...))")
        return " (check the credentials this file system is given)"

    def missing_bucket(self) -> str | None:
        """The bucket the URL names, where the store has buckets and that one is not
        there (ckpt_nb creates none)."""
        if self._makes_folders:
            return None
        bucket = self._files_root.lstrip("/").split("/", 1)[0]
        self._files.invalidate_cache(bucket)
        with self._asking(f"looking for the bucket {bucket}"):
            return None if self._files.exists(bucket) else bucket

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        path = self._path(key)
        with self._asking(f"reading {key}"):
            try:
                return self.fs.cat_file(path, start=start, end=end)
            except FileNotFoundError:
                raise
            except Exception:
                # A range that starts past the end (S3's 416): nothing there, as a local
                # file reads, so a pack cut short is corruption (which restore("latest")
                # falls back past), not a failure of the backend.
                if start is not None and start >= self.fs.size(path):
                    return b""
                raise

    def read_into(self, key: str, start: int, out: memoryview) -> int:
        got = self._fetched.take(key, start, out, functools.partial(self._fetch, key))
        return got if got is not None else super().read_into(key, start, out)

    def prefetch(self, key: str, ranges: Iterable[tuple[int, int]]) -> None:
        """Read these ranges of a pack together: near ones (64 KiB apart) merged into
        spans of up to 16 MiB, the first read of one fetching it and the spans after it,
        32 MiB in all, at once (``cat_ranges``: concurrently on S3), each held until
        ``read_into`` has read every range in it. A restore of many small tensors sent
        one GET per chunk, one after another: 1,610 for a model of 400 small tensors, 70
        times as slow as from local disk. A range larger than a span, or one read where
        256 MiB are held already, is read as it comes; no ranges drop the plan."""
        self._fetched.plan(key, ranges)

    def _fetch(self, key: str, spans: Sequence[tuple[int, int]]) -> list[Any]:
        """The bytes of these [start, end) spans of a value, or for each that failed its
        error (a read of it then asks again, and says why)."""
        path = self._path(key)
        try:
            with self._asking(f"reading {key}"):
                got = list(self.fs.cat_ranges([path] * len(spans), [s for s, _ in spans],
                                              [e for _, e in spans], on_error="return"))
        except (OSError, StoreError) as exc:
            if _unreachable(exc):
                raise  # (asking again would wait out the timeouts twice)
            return [exc] * len(spans)
        for each in got:
            if isinstance(each, Exception) and _unreachable(each):
                with self._asking(f"reading {key}"):
                    raise each
        return got

    @contextlib.contextmanager
    def writer(self, key: str) -> Iterator[Writer]:
        path = self._path(key)
        with _spool() as (spool, local):
            yield spool
            spool.flush()
            try:
                with self._asking(f"upload of {key}", path):
                    if self._makes_folders:
                        self.fs.makedirs(path.rpartition("/")[0], exist_ok=True)
                    self._put(local, path, os.fstat(spool.fileno()).st_size)
            except FileNotFoundError as exc:  # (S3's NoSuchBucket)
                raise StoreError(f"upload of {key} to {self.url} failed: {exc} (ckpt_nb "
                                 "creates no bucket: create it, or check its name)") from exc

    def _put(self, local: str, path: str, size: int) -> None:
        """Upload a file, within ``UPLOAD_SECONDS + size / UPLOAD_MIN_RATE`` where the file
        system is asynchronous (s3fs): a server that stops reading the body midway hangs
        the write for good (aiohttp has no write timeout), and with it every later save."""
        if not self._uploads_async:
            self.fs.put_file(local, path)
            return
        from fsspec.asyn import sync
        from fsspec.exceptions import FSTimeoutError

        deadline = UPLOAD_SECONDS + size / UPLOAD_MIN_RATE
        try:
            sync(self.fs.loop, self.fs._put_file, local, path, timeout=deadline)
        except FSTimeoutError:
            raise StoreError(f"upload of {size} bytes to {path} took over {deadline:.0f} s "
                             "(the server stopped reading it): nothing was saved") from None

    def has(self, key: str) -> bool:
        path = self._path(key)
        with self._asking(f"looking for {key}", path):
            try:  # (not isfile(), which takes any failure for "no": a server down)
                found = self.fs.info(path).get("type") == "file"
            except FileNotFoundError:
                found = False
        if not found and self._doubled_root is not None:
            self._refuse_doubled(key)
        return found

    def _refuse_doubled(self, key: str) -> None:
        """Where ``key`` is the format stamp, which tells a store there: refuse to take this
        store for a new one where an earlier ckpt_nb saved it at its path inside itself
        (``_root_in``), which holds one; it would have shown no checkpoints, and saved
        beside them."""
        from ._format import FORMAT_KEY  # (the format module builds on this one)

        if key != FORMAT_KEY:
            return
        former = f"{self._doubled_root}/{FORMAT_KEY}"
        with self._asking(f"looking for {former}", former):
            try:
                there = self.fs.info(former).get("type") == "file"
            except FileNotFoundError:
                there = False
        if not there:
            return
        scheme = _name(self._files)
        now, before = f"{scheme}://{self._files_root}", f"{scheme}://{self._doubled_files}"
        raise StoreError(
            f"{self.url} is the store at {now}, which holds none, while {before} holds one: "
            "an earlier ckpt_nb saved the store of a URL such as this one (a dir:: folder "
            f"with no path of its own) at its path inside itself. Open it as {before} (the "
            "same store), or move its files (ckpt_nb.json and the folders packs, manifests, "
            f"labels, runs and deleted) to {now} and open this URL again")

    def size(self, key: str) -> int:
        path = self._path(key)
        with self._asking(f"the size of {key}", path):
            return int(self.fs.size(path))

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError), self._asking(f"deleting {key}", path):
            self.fs.rm_file(path)

    def list(self, prefix: str = "") -> Iterator[str]:
        yield from self._found(prefix)

    def sizes(self, prefix: str) -> dict[str, int]:
        return {key: int(info["size"]) if info.get("size") is not None else self.size(key)
                for key, info in self._found(prefix, detail=True)}

    def versions(self, prefix: str) -> dict[str, str | None] | None:
        return {key: str(info["ETag"]) if info.get("ETag") else None
                for key, info in self._found(prefix, detail=True)}

    def modified(self, prefix: str) -> dict[str, float] | None:
        # (one listing with details: S3 gives each object's LastModified in it)
        if self.locked_everywhere:
            return None
        return {key: _written_at(info) for key, info in self._found(prefix, detail=True)}

    def _s3_below(self) -> bool:
        """Whether the store's file system is S3's, or a ``dir::`` folder right over it,
        which both take s3fs's ``find(prefix=)``."""
        from fsspec.implementations.dirfs import DirFileSystem

        return self.fs is self._files or \
            isinstance(self.fs, DirFileSystem) and self.fs.fs is self._files

    def _found(self, prefix: str, detail: bool = False) -> Iterator[Any]:
        """The keys under ``prefix`` (with ``detail``, each with its info, as pairs), from
        one listing: a folder not there lists nothing, and a value at ``prefix`` itself
        (which ``find`` gives as its own listing) is no key under it. (An ``isdir`` asked
        first listed the folder twice, on S3 every page of it: a save to a store of 400
        checkpoints took a second.)"""
        base = self._path(prefix) if prefix else self.root
        parent, _, name = base.rpartition("/")
        where: dict[str, Any] = {"path": base}
        if self._s3 and parent and self._s3_below():
            # (as the folder's name after its parent's: s3fs asks whether a folder that
            # lists nothing is a file, a HEAD and a LIST more for each empty one)
            where = {"path": parent, "prefix": f"{name}/"}
        with self._asking(f"listing {prefix or 'the store'}", base):
            try:
                found = self.fs.find(**where, detail=True) if detail else \
                    dict.fromkeys(self.fs.find(**where))
            except FileNotFoundError:  # (S3's NoSuchBucket)
                found = {}
        top = self.root.strip("/")
        cut = len(top) + 1 if top else 0  # (a store at a file system's root: memory://)
        under = f"{prefix}/" if prefix else ""
        for path, info in found.items():
            key = path.lstrip("/")[cut:]
            if key.startswith(under) and _is_key(key):  # (a name ckpt_nb could have written)
                yield (key, info) if detail else key


# The bucket names botocore sends (S3's own rules, for new buckets, are stricter).
_S3_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")
# Object stores whose first path part is a bucket, which a write would create.
_BUCKETED = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"}
# The refusals of a server that does not take the credentials given (S3's 403s), and
# botocore's own where it finds none, or half of them, to give.
_DENIED = re.compile(r"Forbidden|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|"
                     r"InvalidClientTokenId|ExpiredToken|Unable to locate credentials|"
                     r"Partial credentials found")
# A refusal of what the credentials ask (S3's AccessDenied, which s3fs words "Access
# Denied"), not of who they are: in a write, by credentials that may only read.
_WRITE_DENIED = re.compile(r"Access ?Denied|Forbidden")
# A server not reached: refused, not answering, or a name that does not resolve
# (botocore's words, aiohttp's, and the resolver's: glibc's, macOS's, Windows').
_UNREACHABLE = re.compile(r"Could not connect to the endpoint URL|Connect timeout on endpoint|"
                          r"Read timeout on endpoint|Cannot connect to host|"
                          r"Connection refused|Connection was closed before|"
                          r"Name or service not known|Temporary failure in name resolution|"
                          r"nodename nor servname provided|getaddrinfo failed")
# An object in an archive's storage class (S3's GLACIER, DEEP_ARCHIVE), which is not read
# until restored from it: S3's error code, and its words (s3fs calls it a PermissionError).
_ARCHIVED = re.compile(r"InvalidObjectState|not valid for the object's storage class")
# What ``FsspecStore._asking`` says of a request that writes or deletes.
_WRITES = ("upload of", "deleting")
# The longest an upload to an asynchronous file system (s3fs) may take: this many seconds,
# plus its size at this rate (bytes a second): a server that stops reading fails the save.
UPLOAD_SECONDS = 120.0
UPLOAD_MIN_RATE = 1 << 20

# FsspecStore.prefetch: ranges of a pack at most this many bytes apart are fetched in one
# span (the bytes between are read and dropped), spans at most this long; a read fetches
# its span and those after it, this many bytes at most; no more than this many bytes are
# held at once (a span is dropped once every range in it is read, and one unread for
# PREFETCH_IDLE seconds, as a restore stopped midway leaves it, by the next prefetch).
PREFETCH_GAP = 64 << 10
PREFETCH_SPAN = 16 << 20
PREFETCH_AHEAD = 32 << 20
PREFETCH_HELD = 256 << 20
PREFETCH_IDLE = 60.0


class _Span:
    """A part of a pack to fetch in one request: ``[start, end)``, the ranges in it not
    read yet, and its bytes once fetched."""

    def __init__(self, start: int, end: int, ranges: list[tuple[int, int]]) -> None:
        self.start, self.end = start, end
        self.unread = set(ranges)
        self.data: bytes | None = None
        self.fetching = False


class _Fetched:
    """The spans that ``FsspecStore.prefetch`` planned and its reads fetch and read
    (from several threads at once), each dropped once its ranges are read."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._plans: dict[str, list[_Span]] = {}
        self._used: dict[str, float] = {}  # (when each plan was last read from)
        self._held = 0

    def plan(self, key: str, ranges: Iterable[tuple[int, int]]) -> None:
        """Plan the spans for these (start, length) ranges of ``key``: near ones merged,
        none longer than PREFETCH_SPAN. It replaces an earlier plan for ``key``, and
        drops those unread for PREFETCH_IDLE seconds."""
        spans: list[_Span] = []
        for start, length in sorted(set(ranges)):
            if length <= 0 or start < 0 or length > PREFETCH_SPAN:
                continue
            end = start + length
            last = spans[-1] if spans else None
            if last is not None and start - last.end <= PREFETCH_GAP and \
                    max(end, last.end) - last.start <= PREFETCH_SPAN:
                last.end = max(end, last.end)
                last.unread.add((start, length))
            else:
                spans.append(_Span(start, end, [(start, length)]))
        now = time.monotonic()
        with self._lock:
            for older in [k for k, used in self._used.items() if now - used > PREFETCH_IDLE]:
                self._drop(older)
            self._drop(key)
            if spans:
                self._plans[key], self._used[key] = spans, now

    def take(self, key: str, start: int, out: memoryview,
             fetch: Callable[[Sequence[tuple[int, int]]], list[Any]]) -> int | None:
        """Fill ``out`` from the span planned around it, fetching it first (with the
        spans after it) where it is not yet; None where no span holds all of it, its
        fetch failed or came short (the value ends first), or there is no room."""
        end = start + len(out)
        with self._lock:
            spans = self._plans.get(key, [])
            span = next((s for s in spans if s.start <= start and end <= s.end), None)
            while span is not None and span.data is None:
                if span.fetching:
                    self._lock.wait()
                    span = span if span in self._plans.get(key, ()) else None
                    continue
                batch, size = [], 0
                for later in spans[spans.index(span):]:
                    if later.data is not None or later.fetching or \
                            size + later.end - later.start > PREFETCH_AHEAD:
                        break
                    batch.append(later)
                    size += later.end - later.start
                if self._held + size > PREFETCH_HELD:
                    return None
                for each in batch:
                    each.fetching = True
                self._held += size  # (its room taken while it is fetched)
                got: list[Any] = []
                self._lock.release()
                try:
                    got = fetch([(each.start, each.end) for each in batch])
                finally:
                    self._lock.acquire()
                    self._held -= size
                    current = self._plans.get(key) is spans  # (not replaced meanwhile)
                    for i, each in enumerate(batch):
                        data = got[i] if i < len(got) else None
                        each.fetching = False
                        if current and isinstance(data, bytes) and \
                                len(data) == each.end - each.start:
                            each.data = data
                            self._held += len(data)
                        elif each in spans:
                            spans.remove(each)
                    self._lock.notify_all()
                if not current or span not in spans:
                    return None
            if span is None or span.data is None:
                return None
            self._used[key] = time.monotonic()
            span.unread.discard((start, len(out)))
            data = span.data
            if not span.unread:
                spans.remove(span)
                self._held -= len(data)
                if not spans:
                    self._drop(key)
        out[:] = memoryview(data)[start - span.start : end - span.start]
        return len(out)

    def _drop(self, key: str) -> None:
        """Drop the plan for ``key`` and what it holds (the lock held)."""
        self._held -= sum(len(span.data) for span in self._plans.pop(key, ())
                          if span.data is not None)
        self._used.pop(key, None)


# How long (seconds) a pack, manifest or label that no catalog names is left alone in a
# store that several machines may write at once (``Store.modified``): it may be another
# machine's save in flight, whose manifest is written before its last pack is uploaded
# and which commits only after. An hour is well over a save's time at the slowest upload
# a save accepts (UPLOAD_MIN_RATE: 3.5 GB in an hour), while a killed save's leftovers
# wait no longer than that for gc.
GRACE_SECONDS = 3600.0

# How long an S3 store waits (seconds) before it calls a server down. s3fs retries a
# timeout five times itself, so botocore makes one attempt: a server that takes
# connections but never answers fails a request in about 30 s, not minutes. (FsspecStore's
# docstring gives these values: change both.)
S3_TIMEOUTS: dict[str, Any] = {"connect_timeout": 5, "read_timeout": 5,
                               "retries": {"total_max_attempts": 1}}


def _unreachable(exc: BaseException) -> bool:
    """Whether an error says the server was not reached (refused, not answering)."""
    return isinstance(exc, (ConnectionError, TimeoutError)) or \
        any(_UNREACHABLE.search(said) for said in _told(exc))


def _told(exc: BaseException) -> list[str]:
    """What ``exc`` and the errors it was raised from say, with their codes (botocore's
    error code, which s3fs leaves out of the error it raises in its place)."""
    said: list[str] = []
    at: BaseException | None = exc
    while at is not None and len(said) < 16:
        code = (getattr(at, "response", None) or {}).get("Error", {}).get("Code")
        said += [str(at)] + ([str(code)] if code else [])
        at = at.__cause__ or at.__context__
    return said


def _written_at(info: dict[str, Any]) -> float:
    """When a listed object was written, from the details its file system gives (S3's
    LastModified, a local or memory file's mtime or creation); 0 (long ago) where it
    gives none, so that gc collects there as before."""
    for name in ("LastModified", "last_modified", "updated", "mtime", "created"):
        value = info.get(name)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def young(times: dict[str, float] | None, now: float | None = None) -> set[str]:
    """The keys of ``times`` (``Store.modified``'s) written under ``GRACE_SECONDS`` ago:
    none where the store gave no times (its lock covers every writer)."""
    if not times:
        return set()
    now = time.time() if now is None else now
    return {key for key, at in times.items() if now - at < GRACE_SECONDS}


def _layers(fs: Any, root: str) -> list[tuple[Any, str]]:
    """The file systems ``fs`` opens, from itself to the innermost, which holds the files
    (a ``dir::`` folder's, a cache's target, an ``async_wrapper``'s ``sync_fs``), each
    with the path that ``root`` names in it."""
    from fsspec import AbstractFileSystem
    from fsspec.implementations.dirfs import DirFileSystem

    layers = [(fs, root)]
    while len(layers) < 16:
        if isinstance(fs, DirFileSystem):
            root = fs._join(root)
        inner = next((layer for name in ("fs", "sync_fs")
                      if isinstance(layer := getattr(fs, name, None), AbstractFileSystem)),
                     None)
        if inner is None:
            break
        fs = inner
        layers.append((fs, root))
    return layers


def _uploads_async(layers: list[tuple[Any, str]]) -> bool:
    """Whether the outermost of ``layers`` uploads asynchronously (s3fs, an
    async_wrapper): a ``dir::`` folder is an asynchronous file system that hands its
    uploads to the one it wraps, which may not be one (``dir::memory://`` raised
    "'MemoryFileSystem' object has no attribute '_put_file'" at the first save)."""
    from fsspec.implementations.dirfs import DirFileSystem

    for fs, _ in layers:
        if not getattr(fs, "async_impl", False):
            return False
        if not isinstance(fs, DirFileSystem):
            return True
    return False


def _local_folder(layers: list[tuple[Any, str]]) -> str | None:
    """The folder on this machine's disk that the innermost of ``layers`` holds the
    store in, where it is fsspec's local file system; else None."""
    from fsspec.implementations.local import LocalFileSystem

    fs, root = layers[-1]
    return root if isinstance(fs, LocalFileSystem) else None


def _cache_in(url: str, layers: list[tuple[Any, str]]) -> str | None:
    """The scheme, as ``url`` spells it, of a caching file system (simplecache,
    filecache, blockcache) among ``layers``, which serves a file it read once from its
    copy on this machine; else None."""
    from fsspec.implementations.cached import CachingFileSystem

    for fs, _ in layers:
        if isinstance(fs, CachingFileSystem):
            names = _protocols(fs)
            return next((part for part in url.split("::") if part in names),
                        sorted(names)[0])
    return None


# File systems that only read (a web server's files, an archive's, a repository's at a
# commit): a store's files are written, deleted and rewritten in place.
_READ_ONLY = {"http": "a web server's files", "https": "a web server's files",
              "zip": "an archive's files", "tar": "an archive's files",
              "libarchive": "an archive's files", "github": "a repository's files",
              "gist": "a gist's files", "git": "a repository's files",
              "reference": "references to files", "data": "data in its URL"}
_ARCHIVES = {"zip", "tar", "libarchive"}


def _check_writable(url: str, layers: list[tuple[Any, str]] | None = None,
                    options: dict[str, object] | None = None) -> None:
    """Refuse a URL whose chain opens a file system that only reads, by name: from the
    URL's text and the ``target_protocol`` its ``options`` give, before it is opened (an
    archive's is opened as a file: its folder was said to be a directory, and http's
    kept the scheme in its paths, called an empty path segment), and from ``layers``,
    what it opened."""
    named = [part.split("://", 1)[0] + ("://" if "://" in part else "::")
             for part in url.split("::")]
    named += [f"{protocol}://" for protocol in _targets(options or {})]
    if layers is not None:
        named += [f"{protocol}://" for fs, _ in layers for protocol in sorted(_protocols(fs))]
    for name in named:
        scheme = name.rstrip(":/")
        if scheme in _READ_ONLY:
            instead = "unpack the archive into a folder and give its path" \
                if scheme in _ARCHIVES else \
                "give a folder's path or a URL that can be written (s3://bucket/path)"
            raise ValueError(f"{url}: {name} reads {_READ_ONLY[scheme]} and writes "
                             f"none, and a store's files are written and deleted: {instead}")


def _targets(options: dict[str, object], depth: int = 0) -> list[str]:
    """The file systems that ``options`` name to be opened (``target_protocol``), in
    their ``target_options`` and in a chain's options for one of its schemes too."""
    found = [str(options["target_protocol"])] if "target_protocol" in options else []
    if depth < 8:
        for value in options.values():
            if isinstance(value, dict):
                found += _targets(value, depth + 1)
    return found


def _check_bucket(url: str, root: str) -> None:
    """Refuse an S3 URL whose bucket botocore would refuse at each request (with a
    page of its regexes), or that names none (s3:///x); an access point's ARN is left
    to it."""
    bucket = root.split("/", 1)[0]
    if bucket.startswith("arn:") or _S3_BUCKET.fullmatch(bucket):
        return
    if not bucket:
        raise ValueError(f"{url} names no bucket: write s3://BUCKET/PATH")
    raise ValueError(f"{url}: {bucket!r} is not a bucket name (letters, digits, '.', '-' "
                     "and '_' only)")


def _protocols(fs: Any) -> set[str]:
    return {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)


def _name(fs: Any) -> str:
    """The file system's own name for its scheme (s3fs's for s3a:// is s3)."""
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def _opened(url: str, options: dict[str, object]) -> tuple[Any, str]:
    """fsspec's file system for ``url`` and the path it names there; its refusals said
    as a store's: a scheme it does not know (named: in a chain, not always the first),
    a server not reached as it opens, a chain missing what it wraps."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url, **_copied(options))
    except ValueError as exc:
        if not str(exc).startswith("Protocol not known"):
            raise
        scheme = str(exc).rpartition(":")[2].strip() or url.split("://")[0]
        raise ValueError(f"{url}: no storage knows the scheme {scheme!r}: a "
                         "store is a path, a file:// URL or an fsspec URL "
                         "(s3://bucket/path, with pip install \"ckpt_nb[s3]\")") from exc
    except OSError as exc:  # (a file system that connects as it opens: ftp, sftp, ...)
        unreached = isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror)) or \
            _UNREACHABLE.search(str(exc))
        hint = " (check that the server is up, and its address in the URL)" \
            if unreached else ""
        raise StoreError(f"opening {url} failed: {exc}{hint}") from exc
    except ImportError as exc:  # (fsspec's "Install s3fs to access S3": pip names no package)
        raise _missing_file_system(url, exc) from exc
    except (AttributeError, TypeError) as exc:  # (a chain missing its target: dir://x)
        raise ValueError(f"{url}: fsspec cannot open it as given ({type(exc).__name__}: "
                         f"{exc}): a chained URL names what it wraps (dir::s3://bucket/"
                         "path), or its options do (target_protocol=)") from exc


def _missing_file_system(url: str, exc: ImportError) -> MissingDependencyError:
    """fsspec's refusal of a URL whose file system's package is not installed (or does
    not import: the cause says why), with what to install: for S3, ckpt_nb's extra."""
    why = exc.__cause__ or exc
    if "s3fs" in str(exc):
        return MissingDependencyError(f"{url} needs s3fs, which could not be imported "
                                      f"({why}): pip install \"ckpt_nb[s3]\"")
    return MissingDependencyError(f"{url}: {exc} (its file system's package could not be "
                                  f"imported: {why})")


def _check_parts(url: str) -> None:
    """Refuse a chained URL with an empty part, and a scheme written in capitals, before
    fsspec opens them: it took ``::s3://b/x``'s empty part, and ``DIR::s3://b/x``'s
    'DIR', for a local path (a file system that wraps none), and 'S3://' for a scheme
    no storage knows."""
    from fsspec import available_protocols

    parts = url.split("::")
    if len(parts) > 1 and "" in parts:
        where = "starts with '::'" if not parts[0] else "ends with '::'" if not parts[-1] \
            else "has '::::', an empty part between two '::'"
        raise ValueError(f"{url} {where}: '::' joins a file system to the one it wraps "
                         "(dir::s3://bucket/path)")
    for part in parts:
        scheme = part.partition("://")[0]
        if scheme != scheme.lower() and scheme.lower() in available_protocols():
            raise ValueError(f"{url}: schemes are lower case: write {scheme.lower()!r}, not "
                             f"{scheme!r} (fsspec takes {scheme!r} for a local path or a "
                             "scheme no storage knows)")


def _check_chain_used(url: str, layers: list[tuple[Any, str]]) -> None:
    """Refuse a chained URL with a part that no file system of the chain uses: fsspec
    gives what follows a file system that wraps none (``s3://b/exp::x``, a path with
    '::' in it) to that one as options it ignores, and the store would be elsewhere
    than the URL says."""
    parts = url.split("::")
    if len(layers) >= len(parts):
        return
    holder, unused = parts[len(layers) - 1], "::".join(parts[len(layers):])
    raise ValueError(f"{url}: {holder} holds files itself and wraps no other file system, "
                     f"so fsspec would ignore what follows it ('::{unused}'); '::' joins a "
                     "file system to the one it wraps (dir::s3://bucket/path): give the URL "
                     "of one store, without a '::' in its path")


def _root_in(url: str, layers: list[tuple[Any, str]]) -> str | None:
    """Where a chain whose first parts name no path put the store inside a ``dir::``
    folder among them (``dir::s3://b/x``: s3://b/x/b/x), else None. fsspec gives each such
    part the path of the part it wraps, and returns that path to name the store in the
    outermost file system too: a ``dir::`` folder (its path already that one) held the
    store at that path inside itself. The store is at the folder's top (root "") instead,
    at the URL's path, as ``s3://b/x`` is; a second such ``dir::`` is refused (its folder
    is that path too, inside the first's)."""
    from fsspec.implementations.dirfs import DirFileSystem

    parts, root = url.split("::"), layers[0][1].strip("/")
    folders = []
    for part, (fs, _) in zip(parts[:-1], layers):
        if part.partition("://")[2].strip("/"):
            break  # (a path of its own: fsspec gave none to the parts before it)
        if isinstance(fs, DirFileSystem) and fs.path.strip("/") == root:
            folders.append(fs)
    if not folders:
        return None
    if len(folders) > 1:
        raise ValueError(f"{url}: fsspec gives each dir:: with no path of its own the path "
                         "of what it wraps, so the store would be at that path inside itself "
                         "once for each: give one dir:: (dir::s3://bucket/path)")
    return _layers(layers[0][0], layers[0][1])[-1][1].rstrip("/")


def _routed(url: str, options: dict[str, object]) -> dict[str, object]:
    """``options`` (copied) with each one given at the top of a chain (``dir::s3://``, or
    ``target_protocol=``) moved to the outermost file system of the chain that takes it
    (``_options_taken``): fsspec gives them all to the outermost, where ``dir::`` ignored
    S3's ``endpoint_url=``, ``key=`` and ``secret=`` (the store was looked for on AWS).
    One the outermost takes stays there, as fsspec gives it (``asynchronous=``, an
    async_wrapper's ``semaphore=``); one given in that file system's own options too
    (``s3={...}``) is merged with them, theirs winning key by key for a dict, and refused
    where they differ otherwise. One that no file system of the chain names goes to the
    innermost that may take it in its ``**kwargs`` (``_takes_any``: SFTP's ``username=``),
    and is refused where none may (``TypeError``, as an unknown keyword is: ``_none_takes``,
    all such in one). fsspec's options for every file system (``skip_instance_cache=``)
    reach the innermost too. Options keyed by a scheme of the chain are fsspec's to give
    as they are. The same ``options`` where the URL opens one file system, or one that
    fsspec does not know (it refuses it)."""
    layers = _option_layers(url, options)
    if layers is None:
        return options
    parts = url.split("::")
    keyed = {scheme for scheme, _, _ in layers[:len(parts)]}
    routed = _copied(options)
    unknown: list[str] = []
    for name, value in options.items():
        if name in keyed:
            continue
        taker = next((layer for layer in layers if name in _options_taken(layer[1])), None)
        if taker is None:  # (the innermost that may take it in its **kwargs: SFTP's)
            taker = next((layer for layer in reversed(layers) if _takes_any(layer[1])), None)
        if taker is None:
            unknown.append(name)
            continue
        path = taker[2]
        if not path:
            continue  # (the outermost's: fsspec gives it there)
        own: Any = routed
        for key in path:
            own = own.setdefault(key, {})
            if not isinstance(own, dict):
                return options  # (for fsspec to refuse, as it would)
        del routed[name]
        if name not in own:
            own[name] = value
        elif isinstance(value, dict) and isinstance(own[name], dict):
            own[name] = {**value, **own[name]}
        elif own[name] != value:
            where = path[0] + "=" + "".join(f"[{key!r}]" for key in path[1:])
            raise TypeError(f"{url}: {name} is given twice, as {name}= and in {where}, "
                            "with different values: give it once")
    if unknown:
        raise TypeError(_none_takes(url, layers, unknown, options))
    innermost = layers[-1][2]
    for name in _EVERY_FILE_SYSTEMS & options.keys():
        own = routed
        for key in innermost:
            own = own.setdefault(key, {})
            if not isinstance(own, dict):
                return options  # (for fsspec to refuse, as it would)
        own.setdefault(name, options[name])
    if _protocols(layers[-1][1]) & {"s3", "s3a"}:
        own = routed
        for key in innermost:
            own = own.get(key) if isinstance(own, dict) else None
        if isinstance(own, dict):
            _check_botocore_options(url, own)
    return routed


def _check_botocore_options(url: str, options: dict[str, object]) -> None:
    """Refuse a name in S3's ``config_kwargs`` that botocore's ``Config`` does not take,
    or in its ``client_kwargs`` one that its ``create_client`` does not, naming the
    closest it takes: botocore refused it only at the first request, as a StoreError
    that did not say which option it was (``AioSession.__init__() got an unexpected
    keyword argument``)."""
    from botocore.config import Config
    from botocore.session import Session

    client = {p.name for p in inspect.signature(Session.create_client).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
    from aiobotocore.config import AioConfig  # (s3fs's: connector_args=, http_session_cls=)

    config = set(Config.OPTION_DEFAULTS) | {
        p.name for p in inspect.signature(AioConfig.__init__).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
    for group, valid in (("config_kwargs", config),
                         ("client_kwargs", client)):
        given = options.get(group)
        if not isinstance(given, dict):
            continue
        for name in given:
            if name not in valid:
                close = difflib.get_close_matches(str(name), sorted(valid), n=1)
                hint = f"did you mean {close[0]}?" if close else \
                    f"it takes {', '.join(sorted(valid))}"
                raise TypeError(f"{url}: {group} has {name!r}, which botocore's "
                                f"{'Config' if group == 'config_kwargs' else 'create_client'} "
                                f"does not take: {hint}")


# The options fsspec takes for every file system (its instance cache's, its listings
# cache's): given at the top of a chain, the outermost takes them, and the innermost, the
# store's own, is given them too (skip_instance_cache=True at the top of dir::s3:// gave
# dir:: a new instance, and S3 the cached one).
_EVERY_FILE_SYSTEMS = frozenset(
    {"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths"})


def _none_takes(url: str, layers: list[tuple[str, type, tuple[str, ...]]],
                unknown: list[str], options: dict[str, object]) -> str:
    """The refusal of ``unknown``, the options no file system of the chain takes, all of
    them: each with the closest option taken, else the way to give it to a file system as
    it is (its own options), or for a scheme reached by ``target_protocol=`` given its
    options as a dict, that those are its ``target_options``."""
    taken = sorted({n for _, cls, _ in layers for n in _options_taken(cls)})
    by_target = {scheme: path for scheme, _, path in layers
                 if path and path[-1] == "target_options"}
    parts = url.split("::")
    said: list[tuple[str, str | None]] = []  # (each option, what to say of it or None)
    for name in unknown:
        value = options[name]
        close = difflib.get_close_matches(name, taken, n=1)
        if close:
            said.append((name, f"did you mean {close[0]}=?"))
        elif name in by_target and isinstance(value, dict):
            given = "".join(f"{key}={{" for key in by_target[name]) + \
                ", ".join(f"{key!r}: ..." for key in value) + "}" * len(by_target[name])
            said.append((name, f"target_protocol={name!r} takes its options as {given}"))
        else:
            said.append((name, None))
    chain = ", ".join(scheme for scheme, _, _ in layers)
    refused = f"{url}: no file system of the chain ({chain}) takes the option" \
        if len(layers) > 1 else f"{url}: its file system ({chain}) takes no option"
    if len(said) == 1 and (said[0][1] or "").startswith("did you"):
        return f"{refused} {said[0][0]!r}; {said[0][1]}"
    plain = ", ".join(f"{name!r}: ..." for name, why in said if why is None)
    owner = f"{layers[len(parts) - 1][0]}=" if len(parts) > 1 else "target_options="
    as_given = f" (an option in a file system's own options is given to it as it is: " \
        f"{owner}{{{plain}}})" if plain and len(layers) > 1 else ""
    return f"{refused}{'s' if len(said) > 1 else ''} " + ", ".join(
        repr(name) if why is None else f"{name!r} ({why})" for name, why in said) + as_given


def _option_layers(url: str, options: dict[str, object]
                   ) -> list[tuple[str, type, tuple[str, ...]]] | None:
    """The file systems that ``url`` and ``options`` open, from the outermost to the
    innermost: each one's scheme, class, and the keys in ``options`` of the options
    fsspec gives it (the outermost's: the top; a chain's others': their scheme's, such
    as ``s3``; one a ``target_protocol=`` names: its ``target_options``). None where a
    scheme is one no installed file system takes (fsspec says which as it opens it)."""
    import fsspec

    parts = url.split("::")
    schemes = [part.partition("://")[0] if "://" in part else part for part in parts]
    paths: list[tuple[str, ...]] = [(), *((scheme,) for scheme in schemes[1:])]
    own = options if len(parts) == 1 else options.get(schemes[-1])
    while isinstance(own, dict) and "target_protocol" in own and len(paths) < 16:
        schemes.append(str(own["target_protocol"]))
        paths.append((*paths[-1], "target_options"))
        own = own.get("target_options")
    try:
        classes = [fsspec.get_filesystem_class(scheme) for scheme in schemes]
    except (ValueError, ImportError):
        return None
    return list(zip(schemes, classes, paths))


@functools.cache
def _options_taken(cls: type) -> frozenset[str]:
    """The options a file system class takes by name: its constructor's and its bases'
    (to which it gives the rest), those fsspec takes for every file system (its
    listings cache's, ``skip_instance_cache``), and for S3 the botocore session's, to
    which s3fs gives the rest of its options (``profile=``)."""
    from fsspec.dircache import DirCache

    functions = [vars(base)["__init__"] for base in cls.__mro__ if "__init__" in vars(base)]
    functions.append(DirCache.__init__)
    if _protocols(cls) & {"s3", "s3a"}:
        from aiobotocore.session import AioSession

        functions.append(AioSession.__init__)
    named = {"skip_instance_cache"}
    for function in functions:
        named |= {parameter.name for parameter in inspect.signature(function).parameters.values()
                  if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)}
    return frozenset(named - {"self"})


@functools.cache
def _takes_any(cls: type) -> bool:
    """Whether a file system class may take options it does not name: a constructor of
    its own or its bases' (but fsspec's abstract ones) with ``**kwargs`` that it keeps or
    gives to anything but its base's constructor (SFTP's, for paramiko: ``username=``), or whose
    source is not there to tell. S3's are the botocore session's, which
    ``_options_taken`` names."""
    from fsspec.asyn import AsyncFileSystem
    from fsspec.spec import AbstractFileSystem

    if _protocols(cls) & {"s3", "s3a"}:
        return False
    return any(_keeps_kwargs(vars(base)["__init__"]) for base in cls.__mro__
               if "__init__" in vars(base)
               and base not in (AbstractFileSystem, AsyncFileSystem, object))


def _keeps_kwargs(init: Callable[..., Any]) -> bool:
    """Whether ``init`` has ``**kwargs`` and uses them other than in
    ``super().__init__(**kwargs)`` (True where its source cannot be read)."""
    import ast
    import textwrap

    var = [p.name for p in inspect.signature(init).parameters.values()
           if p.kind is p.VAR_KEYWORD]
    if not var:
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (OSError, TypeError, SyntaxError):
        return True
    forwarded = {id(call_kw.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
                 and isinstance(node.func.value, ast.Call)
                 and isinstance(node.func.value.func, ast.Name)
                 and node.func.value.func.id == "super"
                 for call_kw in node.keywords if call_kw.arg is None}
    return any(isinstance(node, ast.Name) and node.id == var[0] and id(node) not in forwarded
               for node in ast.walk(tree))


def _with_timeouts(url: str, options: dict[str, object], files: Any) -> dict[str, object]:
    """``options`` (copied) with ``S3_TIMEOUTS`` under the botocore settings given, where
    ``files``, the innermost file system the URL opens, is S3's: in fsspec's configuration,
    then the caller's ``config_kwargs``, then those of S3's own options, each winning key by
    key. S3's own options are its scheme's in a chain (``dir::s3://``'s ``s3=``), and
    ``target_options`` where an option names it (``target_protocol='s3'``), where
    ``_routed`` put the caller's ``config_kwargs`` already. The same ``options`` where it
    is not S3's."""
    import fsspec.config

    protocols = _protocols(files)
    if not protocols & {"s3", "s3a"}:
        return options
    timed = _copied(options)
    parts = url.split("::")
    scheme = parts[-1].partition("://")[0]
    given = None
    if len(parts) > 1:
        own = timed.setdefault(scheme, {})
    else:  # (fsspec gives the URL's file system its scheme's options and the rest, merged)
        nested = timed.pop(scheme, {})
        if not isinstance(nested, dict):
            return options  # (for fsspec to refuse, as it would)
        given = timed.pop("config_kwargs", None)
        own = timed = {**nested, **timed}
    while isinstance(own, dict) and "target_protocol" in own:
        own = own.setdefault("target_options", {})
    if not isinstance(own, dict):
        return options  # (for fsspec to refuse, as it would)
    # fsspec's configuration (as it applies it), the caller's, S3's own options'
    settings = [fsspec.config.conf.get(protocol, {}).get("config_kwargs") or {}
                for protocol in sorted(protocols)] + [given or {}, own.get("config_kwargs") or {}]
    if not all(isinstance(found, dict) for found in settings):
        return options  # (for s3fs to refuse, as it would)
    # (copied: botocore writes into the retries it is given, S3_TIMEOUTS' own otherwise)
    own["config_kwargs"] = _copied({name: value for found in [S3_TIMEOUTS, *settings]
                                    for name, value in found.items()})
    return timed


def _copied(options: dict[str, object]) -> dict[str, object]:
    """``options`` with every dict in them copied (not the other values: a session, a file
    system): fsspec updates the options of a URL's first file system with the rest, in
    place, which changed the caller's."""
    return {name: _copied(value) if isinstance(value, dict) else value
            for name, value in options.items()}


def canonical_url(url: str) -> str:
    """A store's URL as ckpt_nb keys it: ``s3://b/exp/`` and ``s3://b/exp`` are one store
    (with two keys, each had a catalog cache and a lock of its own, and each one's gc
    deleted the other's checkpoints)."""
    head, sep, rest = url.partition("://")
    return head + sep + rest.rstrip("/") if sep and rest.rstrip("/") else url


# The URL schemes of this machine's disk (fsspec's names for it): their stores are the
# LocalStore of the folder, whose lock every manager of it takes.
LOCAL_SCHEMES = ("file://", "local://")


def open_store(location: str | os.PathLike[str] | Store, **options: object) -> Store:
    """A store for a path, a URL (the scheme picks the backend) or a Store; a file:// or
    local:// URL is the folder's LocalStore."""
    if isinstance(location, Store):
        return location
    text = os.fspath(location)
    refuse_empty_location(text)
    if "://" not in text:
        return LocalStore(text, **options)  # type: ignore[arg-type]
    if text.startswith(LOCAL_SCHEMES):
        return LocalStore(file_url_path(text), **options)  # type: ignore[arg-type]
    if text == "memory://":
        return MemoryStore()
    return FsspecStore(text, **options)


def refuse_empty_location(text: str) -> None:
    """Refuse an empty location (an unset variable's ``os.environ.get("DIR", "")``): taken
    as a path, it was the current folder, and a store's files landed among the
    notebook's own without a word."""
    if text in ("", *LOCAL_SCHEMES):
        raise ValueError(f"the store's location is empty ({text!r}): pass a folder "
                         "('runs/exp'; '.' for the current one) or a URL "
                         "('s3://bucket/prefix')")


def file_url_path(url: str) -> Path:
    """The path a file:// (or local://) URL names, its %-escapes decoded, so that a local
    store's own ``url`` (``Path.as_uri()``, which escapes a space as %20) opens that store
    again; ``file://runs/exp`` is taken as the relative path it was meant as."""
    parsed = urllib.parse.urlparse(url)
    host = "" if parsed.netloc == "localhost" else parsed.netloc
    return Path(urllib.parse.unquote(host + parsed.path))


def local_root(store: Store) -> Path | None:
    """The directory of a local store, where the catalog can live beside the data."""
    return store.root if isinstance(store, LocalStore) else None


def location(store: Store) -> str:
    """How the user names a store: a local one's folder, any other's URL (an object
    store's root is its bucket path, without the scheme that opens it again)."""
    root = local_root(store)
    return str(root) if root is not None else store.url


def store_exists(location: str | os.PathLike[str]) -> bool:
    """Whether a location holds a store: a local folder a catalog or a format stamp (a
    store whose catalog was lost opens rebuilt), a URL its format stamp (one round
    trip). Lets callers refuse a typo before ``CheckpointManager`` would create an
    empty store there (and, on an object store, its bucket)."""
    from ._format import FORMAT_KEY  # (the format module builds on this one)

    text = os.fspath(location)
    refuse_empty_location(text)
    if "://" in text and not text.startswith(LOCAL_SCHEMES):
        return text != "memory://" and open_store(text).has(FORMAT_KEY)
    if text.startswith(LOCAL_SCHEMES):
        text = str(file_url_path(text))
    return _is_store_folder(Path(text).expanduser())  # (as LocalStore takes it)


def _is_store_folder(path: Path) -> bool:
    """Whether a local folder holds a catalog or a format stamp."""
    from ._format import FORMAT_KEY  # (the format module builds on this one)

    return any((path / name).is_file() for name in (CATALOG_FILE, FORMAT_KEY))


def _holds_store(path: Path) -> bool:
    """Whether a local folder is a store's, False where it cannot be read (the folders
    looked through for the stores a typed path was meant for)."""
    with contextlib.suppress(OSError):
        return _is_store_folder(path)
    return False


def _store_folders(folder: Path, budget: list[int]) -> list[str]:
    """The names of the folders in ``folder`` that are stores, sorted; at most
    ``budget[0]`` folders looked at, all calls together (a home folder's thousands)."""
    found = []
    with contextlib.suppress(OSError):
        for child in sorted(folder.iterdir()):
            if budget[0] <= 0:
                break
            with contextlib.suppress(OSError):
                if child.is_dir() and not child.name.startswith("."):
                    budget[0] -= 1
                    if _holds_store(child):
                        found.append(child.name)
    return found


def _local_stores_near(location: str, path: Path) -> str:
    """Where the stores are that a local path holding none was likely meant for: the
    store it lies inside (``runs/exp1/manifests``), the stores in the folder it names
    (``checkpoints``, where ``%%ckpt_auto`` keeps one per notebook: ``runs``), or a store
    beside it of a name close to its own (``runs/exp`` for ``runs/exp1``); "" where none."""
    typed = location.rstrip("/\\") or location
    shown = (lambda *parts: os.path.normpath(os.path.join(typed, *parts))) \
        if "://" not in location else (lambda *parts: "/".join([typed, *parts]))
    parent_text = typed
    for above in list(path.parents)[:8]:
        parent_text = os.path.dirname(parent_text)
        if _holds_store(above):
            return (f": it is inside the store at {parent_text or above}; give that folder")
    budget = [500]
    if path.is_dir():
        stores = _store_folders(path, budget)
        deeper = [] if stores else [f"{name}/{inner}" for name in sorted(
            child.name for child in _subfolders(path)) for inner in
            _store_folders(path / name, budget)]
        names = (stores or deeper)
        if len(names) == 1:
            return f": the store in it is {shown(names[0])}; give that folder"
        if names:
            listed = ", ".join(shown(name) for name in names[:5])
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            return f": the stores in it are {listed}{more}; give one of them"
        return ""
    if not path.parent.is_dir():
        return ""
    close = sorted(difflib.get_close_matches(path.name, _store_folders(path.parent, budget),
                                             n=3, cutoff=0.6),  # (the closest first, ties
                   key=lambda name: (-difflib.SequenceMatcher(  # by name)
                       None, path.name, name).ratio(), name))
    if not close:
        return ""
    beside = os.path.dirname(typed)
    names = " or ".join(os.path.join(beside, name) if beside else name for name in close)
    return f": did you mean {names}?"


def _subfolders(folder: Path) -> list[Path]:
    """The folders in ``folder``, hidden ones left out; none where it cannot be read."""
    with contextlib.suppress(OSError):
        return [child for child in folder.iterdir()
                if not child.name.startswith(".") and child.is_dir()][:200]
    return []


def why_no_store(location: str) -> str:
    """Why ``location`` holds no store, where a path is a file or a URL's bucket is not
    there (as a save says); "" otherwise. Every "no checkpoint store" error ends with it."""
    if "://" not in location or location.startswith(LOCAL_SCHEMES):
        path = file_url_path(location) if "://" in location else location
        return ": it is a file; a store is the folder a CheckpointManager saves into" \
            if os.path.isfile(path) else _local_stores_near(location, Path(path).expanduser())
    if location == "memory://":
        return ""
    bucket = FsspecStore(location).missing_bucket()
    return f": the bucket {bucket!r} does not exist (ckpt_nb creates no bucket: create " \
        "it, or check its name)" if bucket else ""
