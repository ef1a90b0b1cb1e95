"""Reading and writing the files other tools use: torch.save (.pt) and safetensors.

Exports are plain: a .pt file is a dict that ``torch.load(weights_only=True)``
opens (``{"model": ..., "optimizer": ..., "epoch": ..., ...}``), and a
.safetensors file holds the tensors under their state names, with the rest of
the state as JSON metadata so that ckpt_nb can read it back whole. One object's state
can also go alone, under its own keys, as its ``load_state_dict`` takes them.
"""

from __future__ import annotations

import _compat_pickle
import contextlib
import copy
import errno
import fcntl
import functools
import io
import json
import mmap
import os
import pickle
import pickletools
import re
import reprlib
import stat
import struct
import sys
import tempfile
import threading
import types
import warnings
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import _stdlib_values as stdlib_values
from ._capture import (Unflattener, flatten, module_versions, storage_bytes, torch_has_dtype,
                       uncompiled_keys)
from ._errors import (CheckpointNotFoundError, CkptError, CorruptCheckpointError, FileFormatError,
                      MissingDependencyError, StoreError, UntrustedPickleError, warn)
from ._format import is_int64
from ._store import _DirectWriter, why_unwritable

if TYPE_CHECKING:
    from ._manager import Checkpoint

_META_KEYS = ("epoch", "step", "batch_idx", "metrics", "extra", "rng", "ckpt_nb")
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
# What read_file and write_file take, in any case (a Windows-made MODEL.PT too)
SUFFIXES = (*_TORCH_SUFFIXES, ".safetensors")
_SUFFIX_HINT = "use " + "/".join(SUFFIXES)


def _suffix(path: str | os.PathLike[str]) -> str:
    return Path(path).suffix.lower()


def _portable(value: Any, name: str, dropped: list[str], *, weights_only: bool) -> Any:
    """``value`` in types the file's reader takes back: NumPy arrays as tensors, NumPy
    scalars as Python's, unloaded pickles left out; and, for a torch file, what
    ``torch.load(weights_only=True)`` reads: frozensets as sets, an empty bytes as an
    empty bytearray, a torch.Generator as its state (``set_state`` takes it), paths,
    dates and the like as text, and any other object left out (unless its type was
    registered with ``torch.serialization.add_safe_globals``), as that load refuses
    the whole file for one of them. ``dropped`` gets each one left out, and why."""
    from ._manager import PickledValue

    def portable(v: Any, where: str) -> Any:
        return _portable(v, where, dropped, weights_only=weights_only)

    if isinstance(value, PickledValue):
        to = " to .safetensors" if weights_only else ""  # (a .pt keeps no user's class)
        dropped.append(f"{name} (pickled, not loaded: export{to} with trust_pickle=True)")
        return None
    # (not a long double, nor a masked array or matrix: those go as the objects below)
    if type(value) in (np.ndarray, np.memmap) and torch_has_dtype(value.dtype):
        return torch.from_numpy(value if value.dtype.isnative else  # (native order only)
                                value.astype(value.dtype.newbyteorder("=")))
    if isinstance(value, np.generic) and value.dtype.type not in (np.longdouble, np.clongdouble):
        return value.item()
    if isinstance(value, Mapping):
        plain = {}
        for i, (k, v) in enumerate(value.items()):
            where = f"{name}/{k}" if name else str(k)
            key = k if type(k) in (str, int) else _portable_key(
                k, _key_name(k, name, f"<key {i}>",
                             where if type(k) is tuple else f"{where}, by its key"), dropped,
                weights_only=weights_only)
            if isinstance(k, PickledValue):
                where = k.name
            if key is not _LEFT_OUT:
                plain[key] = portable(v, where)
        metadata = module_versions(value)
        if metadata is None:
            return plain
        state = OrderedDict(plain)  # a state dict: its module versions, as torch.save keeps
        state._metadata = metadata  # type: ignore[attr-defined]
        return state
    if type(value) in (list, tuple, torch.Size):
        return type(value)(portable(v, f"{name}/{i}" if name else str(i))
                           for i, v in enumerate(value))
    if type(value) in (set, frozenset):
        members = [m for i, v in enumerate(value) if (m := _portable_key(
            v, _key_name(v, name, f"<member {i}>", f"{name}/{v}"), dropped,
            weights_only=weights_only)) is not _LEFT_OUT]
        # (weights_only loads sets, not frozensets)
        return set(members) if weights_only or type(value) is set else frozenset(members)
    if not weights_only:
        return value
    if type(value) is bytes and not value:  # (nor an empty bytes, pickled as bytes())
        return bytearray()
    if isinstance(value, torch.Generator):  # (nor a generator)
        return value.get_state()
    if type(value) in stdlib_values.TYPES:
        return stdlib_values.portable(value)
    if isinstance(value, _WEIGHTS_ONLY_LEAVES) or _registered_safe(type(value)) or \
            _registered_safe(value):  # (a class or function kept as a value: nn.ReLU)
        return value
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        what, advice = value.__qualname__, "pass it"
    else:
        what, advice = f"a {type(value).__name__}", f"pass its class, {type(value).__qualname__},"
    dropped.append(f"{name} ({what}, which torch.load(weights_only=True) refuses: export to "
                   f".safetensors, or {advice} to torch.serialization.add_safe_globals)")
    return None


_LEFT_OUT = object()  # (a key or set member left out of an export)


def _key_name(key: Any, name: str, place: str, text: str) -> str:
    """How a warning names a dict key or set member: ``text`` (``extra/counts/Split.TRAIN,
    by its key``), a placeholder's own name (``extra/counts/<key 0>``), or its ``place``
    under ``name`` for a tuple that holds placeholders (their text is a long repr)."""
    from ._manager import PickledValue

    if isinstance(key, PickledValue):
        return key.name
    if type(key) is tuple and any(isinstance(k, PickledValue) for k in key):
        return f"{name}/{place}"
    return text


def _portable_key(key: Any, name: str, dropped: list[str], *, weights_only: bool) -> Any:
    """A dict key or set member as ``_portable`` makes values, or ``_LEFT_OUT`` where
    it (or a part of it) is left out: not as None, where two such keys would become one
    and take one value."""
    before = len(dropped)
    plain = _portable(key, name, dropped, weights_only=weights_only)
    if len(dropped) > before:
        return _LEFT_OUT
    try:
        hash(plain)
    except TypeError:  # (a frozenset made a set for weights_only, in a tuple key)
        dropped.append(f"{name} (a {type(key).__name__} key, which torch.load("
                       "weights_only=True) reads back only as a set, which no key can be: "
                       "export to .safetensors)")
        return _LEFT_OUT
    return plain


# What torch.load(weights_only=True) reads back, besides the containers above.
_WEIGHTS_ONLY_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray,
                        torch.Tensor, torch.dtype, torch.device)


def _registered_safe(kind: Any) -> bool:
    """Whether the user let ``torch.load(weights_only=True)`` build this type, or find
    this class or function (``add_safe_globals`` takes both)."""
    registered = getattr(torch.serialization, "get_safe_globals", lambda: [])()
    return any((g[0] if isinstance(g, tuple) else g) is kind for g in registered)


# An export's temporary beside its target: ``.NAME.ckpt_nb-PID-XXXXXXXX.tmp`` (mkstemp's
# eight random characters), so that a later export can tell a killed one's leftover.
_TEMPORARY = re.compile(r"\..+\.ckpt_nb-([1-9][0-9]*)-[a-z0-9_]{8}\.tmp", re.DOTALL)
# The most of the target's name a temporary's takes, in bytes: a name near the file
# system's 255-byte limit would leave no room for the ~30 the temporary adds.
_TEMPORARY_NAME = 64
# Held while a temporary is made and locked, and while leftovers are looked for: a thread's
# temporary is never taken for a leftover of this pid between the two.
_TEMPORARIES = threading.Lock()


def _atomic_target(path: Path) -> tuple[int, str]:
    """A new temporary beside ``path``, open and locked until it is closed (a live writer's,
    whatever its pid says in another pid namespace); leftovers of dead exports go first."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # (said "File exists: PARENT")
        in_the_way = next((folder for folder in (path.parent, *path.parent.parents)
                           if folder.exists() and not folder.is_dir()), path.parent)
        raise NotADirectoryError(errno.ENOTDIR, "a file is in the way, where the export "
                                 "needs a folder: choose another path, or move the file",
                                 str(in_the_way)) from None
    # (cut at a byte count: a cut character's bytes come back as surrogates, and mkstemp
    # gives them back as the same bytes)
    name = os.fsdecode(os.fsencode(path.name)[:_TEMPORARY_NAME])
    with _TEMPORARIES:
        _remove_leftovers(path.parent)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.ckpt_nb-{os.getpid()}-",
                                       suffix=".tmp", dir=path.parent)
        except OSError as exc:
            exc.filename = str(path)  # (not the temporary's name, which says nothing)
            raise
        with contextlib.suppress(OSError):  # (a file system without locks: the pid says it)
            fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, tmp


def _remove_leftovers(folder: Path) -> None:
    """Delete the temporaries that exports killed mid-write (SIGKILL, a dead kernel) left
    in ``folder``, which nothing else would ever remove: only files of the exact name an
    export gives them, whose process is gone (or is this one) and that no writer holds."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        found = _TEMPORARY.fullmatch(entry.name)
        try:
            if found is None or not entry.is_file(follow_symlinks=False):
                continue
        except OSError:
            continue
        pid = int(found.group(1))
        if pid != os.getpid() and _alive(pid):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # (gone meanwhile, or another user's)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (a live writer holds it)
            os.unlink(entry.path)
        except OSError:
            pass
        finally:
            os.close(fd)


def _alive(pid: int) -> bool:
    """Whether a process of this pid runs on this machine (another user's too)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except OSError:  # (not ours to signal: alive)
        pass
    return True


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # (elsewhere: set and put back at once)
    os.umask(mask)
    return mask


def check_export_path(path: str | bytes | os.PathLike[Any]) -> None:
    """Refuse a suffix no exporter handles, or a URL, before any work is done."""
    path = os.fsdecode(path)
    if "://" in path:  # (it would be made a local folder named "s3:")
        raise FileFormatError(f"cannot export to {path!r}: an export is a local "
                              "file; give a path, then copy the file where it should go")
    if _suffix(path) not in SUFFIXES:
        raise FileFormatError(f"cannot export to {path!r}: unknown suffix, use a "
                              ".pt or .safetensors path (or .pth, .bin, .ckpt: torch.save's "
                              "too)")
    if _suffix(path) == ".safetensors":
        _safetensors(path)


def _safetensors(path: str | os.PathLike[str]) -> types.ModuleType:
    """The safetensors package, which reads and writes ``path``; not installed (it comes
    with the ``export`` extra), a refusal saying what to install, not a bare
    ModuleNotFoundError."""
    try:
        import safetensors
        import safetensors.torch  # noqa: F401 - (what export writes with)
    except ImportError as exc:
        raise MissingDependencyError(f"{os.fspath(path)} needs safetensors, which could not "
                                     f"be imported ({exc}): pip install \"ckpt_nb[export]\""
                                     ) from exc
    return safetensors


def write_file(ck: Checkpoint, path: str | bytes | os.PathLike[Any], *,
               only: str | None = None) -> Path:
    """Write ``ck`` to ``path``; the suffix picks the format. ``only`` names one object,
    written alone under its own keys, as its ``load_state_dict`` takes them; else each
    tensor of a .safetensors file is named by its path (``model/weight``,
    ``optimizer/state/0/exp_avg``). An existing file at ``path`` (or a link) is replaced
    atomically; a read-only one is refused."""
    path = os.fsdecode(path)
    check_export_path(path)
    target = Path(path)
    dropped: list[str] = []
    safetensors = _suffix(target) == ".safetensors"
    if only is not None:
        if only not in ck.state:
            raise FileFormatError(f"cannot export {only!r} alone: checkpoint {ck.id} holds no "
                                  f"object of that name, only {', '.join(map(repr, ck.state))}")
        payload = _portable(ck.state[only], only, dropped, weights_only=not safetensors)
    else:
        if "ckpt_nb" in ck.state:  # (the file's own entry of that name would replace it)
            raise FileFormatError(f"cannot export checkpoint {ck.id} whole: its object named "
                                  "'ckpt_nb' has the name of the file's own entry (its id, "
                                  "branch and note), which would replace it; export each "
                                  "object alone (only='ckpt_nb', or --only ckpt_nb), and "
                                  "save it under another keyword (ema=...) from now on")
        payload = {**_portable(ck.state, "", dropped, weights_only=not safetensors),
                   "epoch": ck.epoch, "step": ck.step, "batch_idx": ck.batch_idx,
                   "metrics": dict(ck.metrics),
                   "extra": _portable(ck.extra, "extra", dropped, weights_only=not safetensors),
                   "rng": ck.rng, "ckpt_nb": {"id": ck.id, "branch": ck.branch,
                                              "note": ck.note}}
    # (what safetensors cannot hold is refused before any folder or file is made)
    layout = _safetensors_layout(payload, only) if safetensors else None
    _check_replaceable(target)
    created = _new_folders(target.parent)
    try:
        fd, tmp = _atomic_target(target)
        try:
            if layout is not None:
                _write_safetensors(layout, fd, target)
            else:
                with open(fd, "wb", closefd=False) as raw:
                    sink = _WriteErrors(raw)
                    try:
                        torch.save(payload, sink)
                        raw.flush()
                    except RuntimeError as exc:
                        if sink.error is not None:  # (a full disk: torch says "unexpected pos")
                            raise _naming(sink.error, target) from exc
                        # e.g. one storage viewed as two dtypes (z, z.real)
                        raise FileFormatError(f"torch.save cannot write checkpoint {ck.id} "
                                              f"({exc}): export it to a .safetensors path, "
                                              "which holds each tensor's values apart") from exc
                    except OSError as exc:
                        raise _naming(exc, target) from exc
            try:
                os.fsync(fd)  # (on the disk before its name is the target's)
            except OSError as exc:
                raise _naming(exc, target) from exc
            # The mode a plain new file gets: mkstemp's is 0600, for a secret, and an
            # export is a file to share.
            os.chmod(tmp, 0o666 & ~_umask())
            try:
                os.replace(tmp, target)
            except OSError as exc:  # (a folder made there meanwhile: named, not the temporary)
                raise _naming(exc, target) from exc
        finally:
            with contextlib.suppress(OSError):  # (a child forked meanwhile shares the lock)
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            if os.path.exists(tmp):
                os.unlink(tmp)
    except BaseException:
        _remove_folders(created)
        raise
    if dropped:
        warn(f"left out of {target.name}: {'; '.join(dropped)}")
    return target


def _check_replaceable(target: Path) -> None:
    """Refuse a target that is a folder, or a file made read-only (torch.save and cp would
    fail to write it; an atomic replace would not), before any work."""
    try:
        found = os.lstat(target)
    except OSError:
        return
    if stat.S_ISDIR(found.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    if stat.S_ISREG(found.st_mode) and not found.st_mode & 0o222:
        raise PermissionError(errno.EACCES, "it exists and is read-only; make it writable "
                              "(chmod u+w) or delete it to have it replaced", str(target))


def _new_folders(folder: Path) -> list[Path]:
    """The folders of ``folder``'s path that do not exist yet, deepest first: an export
    that fails removes the ones it made."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_folders(folders: list[Path]) -> None:
    """Remove the folders a failed export made, deepest first, while they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # (something else was put in it meanwhile, or it is gone)
            return


class _WriteErrors:
    """A file whose write errors are kept: torch.save reports a failed write (a full
    disk, a file-size limit) as its zip writer's "unexpected pos", without the cause."""

    def __init__(self, file: Any) -> None:
        self.file, self.error = file, None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.file.flush()


def _naming(exc: OSError, target: Path) -> OSError:
    """The file system's error, naming the file asked for, not its temporary; a full
    disk's says what to do, and that the export left nothing (its temporary and the
    folders it made are removed; a file there before is as it was)."""
    said = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        said += f": {why_unwritable(exc)}, or export to another disk; nothing was left behind"
    return OSError(exc.errno, said, str(target))


# A non-contiguous view is written through copies of at most this much (and, where
# there is no direct I/O, small tensors are gathered into writes of this much).
_WRITE_BLOCK = 16 << 20
# safetensors' limit on a file's header (its MAX_HEADER_SIZE)
_HEADER_LIMIT = 100_000_000


@dataclass
class _Layout:
    """A safetensors file, all but its bytes: what ``_write_safetensors`` writes."""

    header: bytes
    order: list[str]
    tensors: dict[str, torch.Tensor | np.ndarray]


def _safetensors_layout(payload: Any, only: str | None) -> _Layout:
    """The file safetensors' ``save_file`` writes of ``payload``'s plain values, refused
    here, before any file is made, where safetensors cannot hold it. Each tensor is
    named by its path in the state (``model/weight``); with ``only``, in that object's
    state (``weight``)."""
    flat = flatten({only: payload} if only is not None else payload)
    # (torch wants writable memory: a read-only array is copied; a pickle's bytes are
    # written as they are)
    storages = [torch.from_numpy(s.data if s.data.flags.writeable else s.data.copy())
                if s.kind == "tensor" else torch.empty(0, dtype=torch.uint8)
                for s in flat.storages]
    decoder = Unflattener([t.to_json() for t in flat.tensors], storages)
    tensors: dict[str, torch.Tensor | np.ndarray] = {
        f"__pickle__/{i}": s.data for i, s in enumerate(flat.storages) if s.kind == "pickle"}
    names: list[str] = []
    clashes: list[str] = []
    for i, rec in enumerate(flat.tensors):  # (the file holds plain values)
        name = rec.name if only is None else rec.name.removeprefix(f"{only}/")
        if name in tensors or name.startswith("__pickle__/"):
            clashes.append(name)
        names.append(name)
        tensors[name] = decoder.tensor(i).detach()
    if clashes:
        raise FileFormatError(
            f"safetensors names each tensor by its path in the state, and "
            f"{_some(sorted(set(clashes)))} would name two values (a key with '/' in it beside "
            "nested keys, keys 1 and '1', bytes keys, or a __pickle__/N name, which ckpt_nb "
            "gives its pickles): rename the keys, or export to a .pt path instead")
    meta = {"skeleton": flat.skeleton[only] if only is not None else flat.skeleton,
            "names": names}
    dtypes = {name: t.dtype if isinstance(t, torch.Tensor) else torch.uint8
              for name, t in tensors.items()}
    refused = _refused_dtypes(dtypes)
    if refused:
        listed = " or ".join(f"{str(dtype).removeprefix('torch.')} tensors ({_some(which)})"
                             for dtype, which in refused.items())
        raise FileFormatError(f"safetensors cannot hold {listed}: export to a .pt path "
                              "instead")
    order = _safetensors_order(dtypes)
    # ("format": "pt", as save_file's callers write it: Hugging Face's loaders check it)
    metadata = {"format": "pt", "ckpt_nb": json.dumps(meta)}
    return _Layout(_safetensors_header(tensors, order, metadata), order, tensors)


def _write_safetensors(layout: _Layout, fd: int, target: Path) -> None:
    """Write ``layout`` to ``fd``, its bytes taken straight from the loaded checkpoint's
    memory with direct I/O (save_file wanted a contiguous copy of each view and a clone of
    views of one storage, and wrote through the page cache: 4x the time of torch.load +
    save_file)."""
    try:
        # (direct I/O: no page cache to fill first, on the CPU, and to write back on fsync)
        with (_DirectWriter(fd) if _DirectWriter.available else
              open(fd, "wb", buffering=_WRITE_BLOCK, closefd=False)) as out:
            out.write(struct.pack("<Q", len(layout.header)) + layout.header)
            for name in layout.order:
                for piece in _pieces(layout.tensors[name]):
                    out.write(piece)
    except OSError as exc:
        raise _naming(exc, target) from exc


# A lone surrogate (a name decoded from bytes with surrogateescape): not UTF-8
_SURROGATE = re.compile("[\ud800-\udfff]")


def _safetensors_header(tensors: Mapping[str, torch.Tensor | np.ndarray], order: list[str],
                        metadata: dict[str, str]) -> bytes:
    """The header safetensors writes of ``tensors`` in ``order``, padded with spaces to a
    multiple of 8 bytes (so that the data starts aligned)."""
    unnamed = [name for name in order if _SURROGATE.search(name)]
    if unnamed:
        raise FileFormatError(f"safetensors holds names as UTF-8, which "
                              f"{_some([repr(n) for n in unnamed])} cannot be (lone "
                              "surrogates): export to a .pt path instead")
    known = _safetensors_dtypes()
    header: dict[str, Any] = {"__metadata__": metadata}
    start = 0
    for name in order:
        t = tensors[name]
        label, per_element, _ = known[t.dtype if isinstance(t, torch.Tensor) else torch.uint8]
        shape = list(t.shape)
        if per_element != 1:  # (float4 pairs: safetensors counts the halves)
            if not shape:
                raise FileFormatError(f"safetensors cannot hold a 0-dim "
                                      f"{str(t.dtype).removeprefix('torch.')} tensor "
                                      f"({name}): export to a .pt path instead")
            shape[-1] *= per_element
        header[name] = {"dtype": label, "shape": shape,
                        "data_offsets": [start, start + t.nbytes]}
        start += t.nbytes
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    if len(text) > _HEADER_LIMIT:
        raise FileFormatError(f"the state's names and metadata take {len(text)} bytes, over "
                              f"the {_HEADER_LIMIT} a safetensors reader reads: export to a "
                              ".pt path instead")
    return text


def _pieces(t: torch.Tensor | np.ndarray) -> Iterator[np.ndarray]:
    """The bytes of ``t``'s values in order: a contiguous view's straight from its storage,
    any other's through copies of at most ``_WRITE_BLOCK`` (the whole tensor's copy, for a
    transposed weight, would double the export's memory)."""
    if isinstance(t, np.ndarray):
        yield t
        return
    if t.is_contiguous() and not t.is_conj() and not t.is_neg():
        start = t.storage_offset() * t.element_size()
        yield storage_bytes(t.untyped_storage())[start:start + t.nbytes]
        return
    if t.dim() == 0 or t.nbytes <= _WRITE_BLOCK:
        yield from _pieces(t.resolve_conj().resolve_neg().contiguous())
        return
    if t.shape[0] == 1:
        yield from _pieces(t[0])
        return
    rows = max(1, _WRITE_BLOCK // max(1, t.nbytes // t.shape[0]))
    for first in range(0, t.shape[0], rows):
        yield from _pieces(t[first:first + rows])


@functools.cache
def _safetensors_dtypes() -> dict[torch.dtype, tuple[str, int, int]]:
    """Each dtype safetensors holds: its name in a file, how many of its elements one of
    torch's is (2 for float4 pairs), and its place in safetensors' order of tensors
    (larger items first). Asked of safetensors itself, one element of each dtype, so that
    the file is the one its writer makes."""
    from safetensors.torch import save

    def header(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        data = save(tensors)
        return json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])

    probes = {}
    for dtype in {d for d in vars(torch).values() if isinstance(d, torch.dtype)}:
        try:
            with warnings.catch_warnings():  # (torch calls complex32 experimental)
                warnings.simplefilter("ignore")
                probe = torch.empty(1, dtype=dtype)
                header({"probe": probe})
        except Exception:  # noqa: BLE001 - a KeyError in 0.8; any refusal is one
            continue
        probes[str(dtype)] = probe
    found = header(probes)
    order = sorted(found, key=lambda name: found[name]["data_offsets"])
    return {probes[name].dtype: (found[name]["dtype"], found[name]["shape"][0],
                                 order.index(name)) for name in found}


def _safetensors_order(dtypes: Mapping[str, torch.dtype]) -> list[str]:
    """The names in the order safetensors writes them: by dtype, larger items first (so
    each tensor starts aligned), then by name."""
    known = _safetensors_dtypes()
    return sorted(dtypes, key=lambda name: (known[dtypes[name]][2], name))


def _refused_dtypes(dtypes: Mapping[str, torch.dtype]) -> dict[torch.dtype, list[str]]:
    """Each dtype safetensors cannot hold, with the names of its tensors, all at once: its
    own refusal names only the first it meets."""
    known = _safetensors_dtypes()
    refused: dict[torch.dtype, list[str]] = {}
    for name, dtype in dtypes.items():
        if dtype not in known:
            refused.setdefault(dtype, []).append(name)
    return refused


def _some(names: list[str], shown: int = 5) -> str:
    """A handful of names, and how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _read_safetensors(path: Path, trust_pickle: bool) -> dict[str, Any]:
    safetensors = _safetensors(path)
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            meta = (f.metadata() or {}).get("ckpt_nb")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except safetensors.SafetensorError as exc:
        with open(path, "rb") as f:
            head = f.read(16)
        if _sniffed(head) == "torch":
            raise _misnamed(path, head, "safetensors") from exc
        raise CorruptCheckpointError(f"{path} cannot be read as a safetensors file: "
                                     f"{exc}") from exc
    if meta is None:
        return {"model": tensors}
    try:
        meta = json.loads(meta)
    except (ValueError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{path}: its ckpt_nb metadata is not JSON, or nested "
                                     f"too deep ({type(exc).__name__}: {exc})") from exc
    names = meta.get("names") if isinstance(meta, dict) else None
    if not isinstance(names, list) or "skeleton" not in meta:
        raise CorruptCheckpointError(f"{path}: its ckpt_nb metadata lacks the \"skeleton\" "
                                     "and \"names\" a ckpt_nb export writes: damaged, or not "
                                     "one of ours")
    left_out: list[str] = []

    def unloaded(name: str) -> _Unloaded:
        """A pickle without trust: one in extra is left out, as an export leaves one out;
        one in an object's state or in the RNG's refuses the file, as a restore needs it."""
        if name != "extra" and not name.startswith("extra/"):
            raise UntrustedPickleError(
                f"{path}: {name or 'a value'} is stored as a pickle, which can run code when "
                "loaded: pass trust_pickle=True if you trust this file")
        left_out.append(name)
        return _Unloaded()

    class _Decoder(Unflattener):
        def tensor(self, index: int) -> torch.Tensor:
            return tensors[names[index]]

    decoder = _Decoder([], _pickle_storages(path, tensors), trust_pickle=trust_pickle,
                       on_pickle=unloaded)
    try:
        data = decoder.decode(meta["skeleton"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError,
            OverflowError, RecursionError) as exc:
        # (with trust_pickle, an unpickled object's own error is the caller's to read)
        if trust_pickle and not isinstance(exc, CkptError):
            raise
        # Without pickles no code of the file's runs here: what fails is its metadata.
        raise CorruptCheckpointError(f"{path}: its ckpt_nb metadata does not describe a "
                                     f"state ({type(exc).__name__}: {exc})") from exc
    if left_out:
        if isinstance(data, dict) and "extra" in data:
            data["extra"] = _unloaded_as_none(data["extra"])
        warn(f"left out of {path}: {', '.join(left_out)} (pickled, not loaded: pass "
             "trust_pickle=True if you trust the file)")
    return data


def _safetensors_metadata(path: Path) -> dict[str, str]:
    """A safetensors file's ``__metadata__`` (text by name): another tool's is kept in
    an import's extra, as ``safetensors_metadata``."""
    with _safetensors(path).safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


class _Unloaded:
    """A pickle of an imported file's extra, left out: its place while the file is read
    (each its own, so that two such dict keys stay two keys until they go)."""


def _unloaded_as_none(value: Any) -> Any:
    """``value`` with each pickle left out as None in its place, and a dict entry whose
    key holds one, or a set member that does, left out whole (as None, two such keys
    would become one, with one of their values)."""
    if isinstance(value, _Unloaded):
        return None
    if isinstance(value, dict):  # (an OrderedDict's, a defaultdict's type and attributes kept)
        kept = copy.copy(value)
        kept.clear()
        kept.update((k, _unloaded_as_none(v)) for k, v in value.items()
                    if not _holds_unloaded(k))
        return kept
    if type(value) in (list, tuple):
        return type(value)(_unloaded_as_none(v) for v in value)
    if type(value) in (set, frozenset):
        return type(value)(v for v in value if not _holds_unloaded(v))
    return value


def _holds_unloaded(key: Any) -> bool:
    return isinstance(key, _Unloaded) or \
        type(key) in (tuple, frozenset) and any(_holds_unloaded(k) for k in key)


def _pickle_storages(path: Path, tensors: Mapping[str, torch.Tensor]
                     ) -> list[torch.Tensor | None]:
    """The file's pickles by storage index, as ``_write_safetensors`` names them.

    An export holds a tensor for each storage, so an index is below the file's count of
    tensors: a larger one (``__pickle__/999999999999``) would have a list that long built.
    """
    indices = {str(i): i for i in range(len(tensors))}
    pickles = {k.removeprefix("__pickle__/"): v for k, v in tensors.items()
               if k.startswith("__pickle__/")}
    bad = [f"__pickle__/{k}" for k in pickles if k not in indices]
    if bad:
        raise CorruptCheckpointError(f"{path}: tensor {reprlib.repr(bad[0])} is not a pickle "
                                     "a ckpt_nb export writes (__pickle__/N, N under the "
                                     f"file's {len(tensors)} tensors)")
    by_index = {indices[k]: v for k, v in pickles.items()}
    return [by_index.get(i) for i in range(max(by_index, default=-1) + 1)]


# What torch.load(weights_only=True) says of a pickle's bytes, not of the objects in it:
# "pass trust_pickle=True" would be the wrong advice for a damaged file.
_DAMAGED_PICKLE = ("String is too long", "persistent")


def _pickle_damage(path: Path) -> str | None:
    """Why a torch file's pickle does not parse as one, or None: its opcodes read, no
    object built, so no code runs. ("Unsupported operand" is also what weights-only
    loading says of protocol 4's FRAME, in a whole file saved with ``pickle_protocol=4``.)"""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
                pickles = [io.BytesIO(archive.read(name))]
        else:  # (the legacy format: magic number, protocol, system info, then the data;
            # a file cut in the data's pickle was named by its globals read so far, ".")
            pickles = [io.BytesIO(path.read_bytes())] * 4
        for stream in pickles:
            for _ in pickletools.genops(stream):
                pass
    except Exception as exc:  # noqa: BLE001 - any failure to read it as a pickle is damage
        return _plain(exc) or type(exc).__name__
    return None


# A terminal's escape sequences (torch's message sets its advice in bold)
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def _plain(exc: BaseException) -> str:
    """torch's message without escape sequences, which print as ``\x1b[1m`` in a repr,
    a log or a notebook's traceback."""
    return _ANSI_ESCAPE.sub("", str(exc))


def _sniffed(head: bytes) -> str | None:
    """The format a file's first bytes say it is: "torch" (a zip archive, a pickle: protocol
    2 and up start with PROTO, a legacy file of protocol 0 or 1 with its magic number as a
    LONG), "safetensors" (its header's length, then the JSON header), or None."""
    # (safetensors first: its header's length may begin with a pickle's first byte)
    if len(head) >= 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < _HEADER_LIMIT:
        return "safetensors"
    if head[:2] == b"PK" or head[:1] in (b"\x80", b"L"):
        return "torch"
    return None


def _misnamed(path: Path, head: bytes, expected: str) -> CorruptCheckpointError:
    """The refusal of a file that is not of its suffix's format, naming the one it is."""
    found = _sniffed(head)
    if found is not None and found != expected:
        right = ".safetensors" if found == "safetensors" else ".pt"
        return CorruptCheckpointError(f"{path} is a {_FORMATS[found]} file, not a "
                                      f"{_FORMATS[expected]} one as its suffix says: rename "
                                      f"it to {path.stem}{right}")
    what = "neither a zip archive nor a pickle" if expected == "torch" else \
        "no header length, then JSON"
    return CorruptCheckpointError(f"{path} is not a {_FORMATS[expected]} file ({what})")


_FORMATS = {"torch": "torch.save", "safetensors": "safetensors"}


def _pickle_protocol(path: Path) -> int | None:
    """The pickle protocol a torch file was saved with (0 for 0 or 1, which write no
    PROTO), or None where its pickle cannot be found."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
                with archive.open(name) as pkl:
                    head = pkl.read(2)
        else:
            with open(path, "rb") as f:
                head = f.read(2)
    except (OSError, StopIteration, zipfile.BadZipFile, RuntimeError, ValueError):
        return None
    if not head:
        return None
    return head[1] if head[:1] == b"\x80" and len(head) == 2 else 0


# The global torch.load(weights_only=True) refused, in its message: one not allowed, or
# one of a module it never allows (os, sys, posix, nt: torch 2.6 and later)
_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)|"
                             r"unsupported GLOBAL (\S+) whose module \S+ is blocked")
_UNPICKLER_ERROR = re.compile(r"WeightsUnpickler error:\s*([^\n]+)")
# pickle's words for a class that its module lacks here (one defined in the saving
# script's or notebook's __main__, say)
_MISSING_CLASS = re.compile(r"Can't get attribute '([^']+)' on <module '([^']+)'")
# Globals known to build values alone (data, no commands, code or files), which a refusal
# may offer to torch.serialization.add_safe_globals; any other (os.system, eval,
# timeit.timeit, a class of the user's) gets the trust_pickle advice alone. Besides these,
# numpy.dtypes' dtype classes and torch.nn.modules' Module classes (a whole module saved).
_VALUE_GLOBALS = frozenset({
    "numpy.dtype", "numpy.ndarray", "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct", "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar", "argparse.Namespace", "types.SimpleNamespace",
    "uuid.UUID", "decimal.Decimal", "fractions.Fraction",
    *(f"datetime.{c}" for c in ("date", "time", "datetime", "timedelta", "timezone")),
    *(f"collections.{c}" for c in ("OrderedDict", "defaultdict", "deque", "Counter")),
    *(f"{m}.{c}" for m in ("pathlib", "pathlib._local")
      for c in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath",
                "PureWindowsPath")),
    *(f"builtins.{c}" for c in ("range", "slice", "set", "frozenset", "complex", "bytearray",
                                "bytes", "int", "float", "bool", "str", "list", "dict",
                                "tuple")),
})


def _builds_values_alone(name: str) -> bool:
    """Whether a global (``module.name``) is one of ``_VALUE_GLOBALS``, a NumPy dtype class
    or a torch.nn module class (looked up only where its module is imported: nothing is
    imported for it)."""
    if name in _VALUE_GLOBALS:
        return True
    module, _, attr = name.rpartition(".")
    found = getattr(sys.modules.get(module), attr, None)
    if module == "numpy.dtypes":
        return isinstance(found, type) and issubclass(found, np.dtype)
    return module.startswith("torch.nn.modules.") and isinstance(found, type) and \
        issubclass(found, torch.nn.Module)


def _pickle_globals(path: Path) -> tuple[set[str], set[str]]:
    """Every global a torch file's pickle names, and the codes of the NumPy dtypes it builds
    (``'i8'``: their classes must be allowed too), read from its opcodes (nothing built, no
    code run): a zip's data.pkl, or a legacy file's main pickle (its fourth)."""
    names: set[str] = set()
    dtype_codes: set[str] = set()
    try:
        with contextlib.ExitStack() as stack:
            if zipfile.is_zipfile(path):
                archive = stack.enter_context(zipfile.ZipFile(path))
                data = next(i for i in archive.namelist() if i.endswith("/data.pkl"))
                pickles = [stack.enter_context(archive.open(data))]
            else:
                legacy = stack.enter_context(open(path, "rb"))
                pickles = [legacy] * 4  # (magic number, protocol, system info, the data)
            for stream in pickles:
                memo: dict[Any, str | None] = {}
                top: str | None = None  # (the global the last opcode pushed, if one)
                strings: list[str] = []  # (the last two strings pushed: STACK_GLOBAL's)
                for op, arg, _ in pickletools.genops(stream):
                    if op.name in ("GLOBAL", "STACK_GLOBAL"):
                        top = _python3_name(*arg.split(" ", 1)) if op.name == "GLOBAL" \
                            else ".".join(strings)
                        names.add(top)
                    elif op.name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                        memo[len(memo) if op.name == "MEMOIZE" else arg] = top
                    elif op.name in ("BINGET", "LONG_BINGET", "GET"):
                        top = memo.get(arg)
                    else:
                        if top == "numpy.dtype" and isinstance(arg, str):
                            dtype_codes.add(arg)
                        top = None
                        strings = (strings + [arg])[-2:] if isinstance(arg, str) else []
    except Exception:  # noqa: BLE001 - a damaged file: what was read so far
        pass
    return names, dtype_codes


def _python3_name(module: str, name: str) -> str:
    """A protocol 2 pickle's global under the name Python 3 unpickles it as
    (``__builtin__.xrange``: ``builtins.range``), as torch's weights-only loader reads it."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    else:
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return f"{module}.{name}"


def _unsafe_globals(path: Path, text: str) -> tuple[list[str], list[str]]:
    """Every global of a torch file's pickle that weights-only loading does not build, and
    the NumPy dtype classes its dtypes need besides, read from its opcodes; else the one
    torch's refusal names."""
    allowed = getattr(torch._weights_only_unpickler, "_get_allowed_globals", dict)()
    user = getattr(torch._weights_only_unpickler, "_get_user_allowed_globals", dict)()
    names, dtype_codes = _pickle_globals(path)
    found = sorted(names - set(allowed) - set(user))
    if not found:
        refused = _REFUSED_GLOBAL.search(text)
        return ([next(g for g in refused.groups() if g)] if refused else []), []
    dtype_classes = set()
    for code in dtype_codes:
        with contextlib.suppress(TypeError, ValueError):
            dtype_classes.add(f"numpy.dtypes.{type(np.dtype(code)).__name__}")
    return found, sorted(dtype_classes - set(allowed) - set(user) - set(found)) \
        if "numpy.dtype" in names else []


def _untrusted(path: Path, exc: pickle.UnpicklingError) -> UntrustedPickleError:
    """The refusal of a file that torch.load(weights_only=True) does not read, its cause
    first: a protocol that loader does not parse, or every global it would not build
    (torch's own message, ~900 characters, buries the first alone). add_safe_globals is
    offered only where each is known to build values alone (``_VALUE_GLOBALS``): never
    for os.system, eval or a class of the user's."""
    text = _plain(exc)
    protocol = _pickle_protocol(path)
    if "Unsupported operand" in text and protocol is not None and protocol not in (2, 3):
        saved, trusted = ("0 or 1", "(protocol 1 loads that way; 0 not at all)") \
            if protocol == 0 else (str(protocol), "(a full unpickling can run code)")
        return UntrustedPickleError(
            f"{path} was saved with pickle protocol {saved}, which torch.load(weights_only="
            "True) does not read (it reads 2 and 3): re-save it with torch.save's default "
            f"protocol, or pass trust_pickle=True if you trust the file {trusted}")
    names, dtype_classes = _unsafe_globals(path, text)
    if names:
        held = ", ".join(names)
        code = [n for n in names if not _builds_values_alone(n)]
        if code:
            which = "they" if len(code) == len(names) else ", ".join(code)
            return UntrustedPickleError(
                f"{path} holds {held}, which torch.load(weights_only=True) does not build, "
                f"and {which} can run commands or code as the file loads (none is a class "
                "known to hold values alone). Pass trust_pickle=True only if you trust the "
                "file: a full unpickling runs what it names")
        # (the first named, then each once in the call to paste: a whole module's are many)
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        modules = any(n.startswith("torch.nn.modules.") for n in names)
        return UntrustedPickleError(
            f"{path} holds {'whole modules: ' if modules else ''}{names[0]}{more}, which "
            "torch.load(weights_only=True) does not build (loading them could run code): "
            "pass trust_pickle=True if you trust the file"
            + (" (restore takes each module's state_dict())" if modules else "")
            + ", or allow them with torch.serialization.add_safe_globals(["
            + ", ".join(names + dtype_classes) + "])")
    detail = _UNPICKLER_ERROR.search(text)
    lines = [line.strip() for line in text.splitlines() if line.strip() and
             not line.startswith("Check the documentation of torch.load")]
    said = detail.group(1).strip() if detail else lines[-1] if lines else type(exc).__name__
    return UntrustedPickleError(
        f"{path} holds objects other than tensors and plain data, and loading them could "
        f"run code: pass trust_pickle=True if you trust the file (torch says: {said})")


# How much of a record the CRC-32 check reads at a time (not the whole record: one copy
# of a file's tensors, the one torch.load makes, is enough)
_CRC_BLOCK = 16 << 20


def _damaged_records(path: Path) -> list[str]:
    """The records of a torch.save zip whose bytes fail the CRC-32 stored for them, which
    torch's own zip reader does not check. A file saved with
    ``torch.serialization.set_crc32_options(False)`` stores 0 for every record, and has
    nothing to check; any other record is checked, its stored 0 too. A file that zipfile
    cannot open (the legacy format, or a damaged directory) is left to torch.load."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return []
    damaged: list[str] = []
    with archive, open(path, "rb") as file:
        records = archive.infolist()
        if all(info.CRC == 0 for info in records):
            return []
        size = os.fstat(file.fileno()).st_size
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        try:
            for info in records:
                crc = _stored_crc(mapped, info) if mapped is not None and \
                    info.compress_type == zipfile.ZIP_STORED else _read_crc(archive, info)
                if crc is None:  # (torch.load says what else is wrong, as it did before)
                    return damaged
                if crc != info.CRC:
                    damaged.append(info.filename)
        finally:
            if mapped is not None:
                mapped.close()
    return damaged


def _records_stored(path: Path) -> bool:
    """Whether each record of a zip is stored as it is, as torch.save writes them: mapped,
    torch takes a record's bytes as they lie in the file, where a zip re-packed by another
    tool (Info-ZIP's zip deflates what shrinks) holds them compressed, which torch's reader
    inflates when it reads the file whole."""
    try:
        with zipfile.ZipFile(path) as archive:
            return all(info.compress_type == zipfile.ZIP_STORED for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False


def _stored_crc(mapped: mmap.mmap, info: zipfile.ZipInfo) -> int | None:
    """The CRC-32 of a stored (uncompressed) record's bytes, computed over the mapped file
    a block at a time, as they lie (zipfile's reads copy each block twice over: 3 times
    the time); None where its local header is not one or its bytes run past the end."""
    header = mapped[info.header_offset:info.header_offset + 30]
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        return None
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    start = info.header_offset + 30 + name_length + extra_length
    if start + info.compress_size > len(mapped):
        return None
    crc = 0
    end = start + info.compress_size
    with memoryview(mapped) as view:
        for offset in range(start, end, _CRC_BLOCK):
            block_end = min(offset + _CRC_BLOCK, end)
            with view[offset:block_end] as block:
                crc = zlib.crc32(block, crc)
            # (the pages read leave this process's memory: the file's cache keeps them)
            first_page = offset - offset % mmap.PAGESIZE
            mapped.madvise(mmap.MADV_DONTNEED, first_page, block_end - first_page)
    return crc


def _read_crc(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> int | None:
    """A compressed record's CRC-32 as zipfile reads it: the stored one where the bytes
    match it, another where they do not; None where zipfile cannot read it."""
    try:
        with archive.open(info) as record:
            while record.read(_CRC_BLOCK):
                pass
    except zipfile.BadZipFile as exc:
        return None if "CRC" not in str(exc) else (info.CRC + 1) & 0xFFFFFFFF
    except (EOFError, ValueError, NotImplementedError, RuntimeError):
        return None
    return info.CRC


def _read_torch(path: Path, trust_pickle: bool) -> Any:
    with open(path, "rb") as f:
        head = f.read(16)
    # torch.save writes a zip archive (or, before torch 1.6, a pickle): anything else
    # is not one, whatever torch.load's refusal would suggest (trusting it).
    if _sniffed(head) != "torch":
        raise _misnamed(path, head, "torch")
    damaged = _damaged_records(path)
    if damaged:
        raise CorruptCheckpointError(
            f"{path} is damaged: the bytes of {_some(damaged)} do not match the CRC-32 the "
            "file stores for them (torch.load does not check it, and would read wrong "
            "values): save or copy the file again from a good source")
    try:
        # A zip archive's tensors are mapped from the file, as safetensors' are, not read
        # into memory first (a 1 GiB file took 1.3 GiB where mapped it takes 0.3); a
        # legacy pickle cannot be mapped.
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle,
                          mmap=head[:4] == b"PK\x03\x04" and _records_stored(path))
    except pickle.UnpicklingError as exc:
        damage = _plain(exc) if trust_pickle or any(m in str(exc) for m in _DAMAGED_PICKLE) \
            else _pickle_damage(path)
        if damage is not None:
            raise CorruptCheckpointError(f"{path} does not unpickle: {damage}") from exc
        raise _untrusted(path, exc) from exc
    except PermissionError:
        raise
    except Exception as exc:  # (a damaged file fails in torch's readers in many ways)
        if isinstance(exc, OSError) and exc.errno not in (None, errno.EINVAL):
            raise _unreadable(path, exc) from exc  # (EINVAL: torch's seek in a cut zip)
        if (missing := _missing_code(path, exc)) is not None:
            raise missing from exc
        why = "an object in it failed to load, or " if trust_pickle else ""
        raise CorruptCheckpointError(f"{path} cannot be read as a torch.save file ({why}it is "
                                     f"damaged or cut short): {type(exc).__name__}: "
                                     f"{_plain(exc)}") from exc


def _unreadable(path: Path, exc: OSError) -> StoreError:
    """A read of a file that the system refused (EIO on a failing disk, an NFS timeout, a
    file deleted meanwhile): no sign of damage, so not called damaged, as a user told so
    may delete or download again a good file."""
    error = StoreError(f"{path} could not be read: {exc.strerror or exc} (the system's "
                       "error, not a sign that the file is damaged: it may be fine): is its "
                       "disk failing, or a network mount gone? read it again once the disk "
                       "answers; dmesg says more")
    error.errno = exc.errno
    return error


def _missing_code(path: Path, exc: Exception) -> FileFormatError | None:
    """The refusal of an intact file whose pickle names a class, or a module, that Python
    cannot find here; None for any other failure. Not damage: the code is to be defined
    or imported first."""
    if isinstance(exc, AttributeError) and (found := _MISSING_CLASS.search(str(exc))):
        name, module = found.groups()
        if repr(sys.modules.get("__main__")).startswith(f"<module {module!r}"):
            module = "__main__"  # (as the pickle names it: under python -m, its spec's name)
        where = " (the script or notebook that saved it)" if module == "__main__" else ""
        return FileFormatError(
            f"{path} needs class {name} from module {module}{where}, which is not defined "
            "here, and is not damaged: define it "
            f"(or import it{'' if module == '__main__' else f' from {module}'}) first, then "
            f"read the file again with trust_pickle=True ({_plain(exc)})")
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return FileFormatError(
            f"{path} needs module {exc.name}, which cannot be imported here: install it or "
            "put it on sys.path first, then read the file again with trust_pickle=True")
    return None


def out_of_file(value: Any, memo: dict[int, Any]) -> Any:
    """``value`` with each tensor in its dicts, lists and tuples copied into memory of its
    own, and each other object it holds deep-copied where that works (tensors sharing a
    storage share one copy, through ``memo``): read from a mapped file (a .pt zip, a
    .safetensors), a tensor a live object keeps (an optimizer's state, which its
    load_state_dict does not copy) would be killed by SIGBUS once the file is saved over."""
    if isinstance(value, torch.Tensor):
        return copy.deepcopy(value, memo)
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = out_of_file(item, memo)
        return value
    if isinstance(value, list):
        value[:] = [out_of_file(item, memo) for item in value]
        return value
    if type(value) is tuple:
        return tuple(out_of_file(item, memo) for item in value)
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return value
    try:
        return copy.deepcopy(value, memo)
    except Exception:  # noqa: BLE001 - an object that cannot be copied stays as it is
        return value


def read_file(path: str | os.PathLike[str], *, trust_pickle: bool = False) -> Checkpoint:
    """A Checkpoint from a .pt / .safetensors file, ours or a conventional one.

    Conventional dicts map ``model_state_dict`` / ``state_dict`` to "model",
    ``optimizer_state_dict`` to "optimizer", and so on; a dict of tensors alone is
    a model's state dict.
    """
    from ._manager import Checkpoint

    source = Path(path)
    skeleton = False  # (the file's dict is what ckpt_nb's safetensors metadata describes)
    if source.is_dir():
        files = _model_files(source)
        raise CheckpointNotFoundError(
            f"{source} is a directory, not a checkpoint file: " +
            (f"give the file to read ({_some(files)})" if files else
             f"a store? open it with CheckpointManager({os.fspath(source)!r})"))
    if not source.is_file():
        raise CheckpointNotFoundError(f"no file {source}")
    if source.name.lower().endswith(_INDEX):
        data = _read_shards(source, trust_pickle)
    elif _suffix(source) not in SUFFIXES:
        raise FileFormatError(f"{source}: unknown suffix, {_SUFFIX_HINT} (or a sharded "
                              f"model's {_INDEX})")
    else:
        if (shard := _SHARD.fullmatch(source.name)) and int(shard.group(2)) > 1:
            indices = [n for n in _model_files(source.parent) if n.lower().endswith(_INDEX)]
            warn(f"{source.name} is one shard of {int(shard.group(2))}, a part of the model "
                 f"only: give {indices[0] if indices else 'the index (.index.json)'} beside "
                 "it to read them all")
        skeleton = _suffix(source) == ".safetensors"
        data = _read_safetensors(source, trust_pickle) if skeleton \
            else _read_torch(source, trust_pickle)
    if not isinstance(data, Mapping):
        raise FileFormatError(f"{source} holds a {type(data).__name__}, not a dict of state: "
                              "save a dict ({\"model\": model.state_dict(), ...}) to import it")
    if isinstance(versions := module_versions(data), Mapping):
        # torch.save(model.state_dict()): a module's, whatever its values (a quantized
        # layer's dtype and packed parameters, a get_extra_state()'s dict), versions kept;
        # but for values added to it by hand (sd["epoch"] = 3): top-level, not tensors
        added = {k: v for k, v in data.items() if isinstance(k, str) and "." not in k
                 and k != "_extra_state" and not isinstance(v, torch.Tensor)}
        model = data
        if added:
            model = OrderedDict((k, v) for k, v in data.items() if k not in added)
            model._metadata = versions  # type: ignore[attr-defined]
        state, meta = _split_state(added, export=False) if added else ({}, {})
        if "model" in state:  # (sd["model"] = ...: kept, where it cannot be the model)
            meta.setdefault("extra", {})["model"] = state.pop("model")
        state["model"] = uncompiled_keys(model)
    elif data.keys() == {"state", "param_groups"}:  # (an optimizer's alone: export only=)
        state, meta = {"optimizer": data}, {}
    else:
        export = "ckpt_nb" in data if skeleton else _is_a_ckpt_nb_export(data)
        state, meta = _split_state(dict(data), export=export)
    if skeleton and "ckpt_nb" not in (found := _safetensors_metadata(source)) and found:
        meta.setdefault("extra", {})["safetensors_metadata"] = found  # (another tool's)
    _check_meta(source, meta)
    return Checkpoint(
        id=str(source), parent=None, branch="", created=source.stat().st_mtime,
        step=meta.get("step"), epoch=meta.get("epoch"), batch_idx=meta.get("batch_idx"),
        metrics=meta.get("metrics", {}), extra=meta.get("extra", {}), strategy="file",
        note=(meta.get("ckpt_nb") or {}).get("note", ""), pinned=False, state=state,
        rng=meta.get("rng"))


# A sharded model's index (Hugging Face's model.safetensors.index.json), and a shard's name
_INDEX = ".index.json"
_SHARD = re.compile(r".+-([0-9]+)-of-([0-9]+)\.(?:safetensors|bin|pt|pth)", re.IGNORECASE)


def _model_files(folder: Path) -> list[str]:
    """The files in ``folder`` to give read_file: a sharded model's indices, else its
    checkpoint files (sorted)."""
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.is_file())
    except OSError:
        return []
    indices = [n for n in names if n.lower().endswith(_INDEX)]
    return indices or [n for n in names if _suffix(n) in SUFFIXES]


def _read_shards(index: Path, trust_pickle: bool) -> dict[str, Any]:
    """A sharded model (an index whose ``weight_map`` gives each tensor's file) as one
    model state: every shard read, each checked to hold the tensors the index puts in
    it. Shards are file names beside the index, never paths elsewhere."""
    if index.stat().st_size > _HEADER_LIMIT:  # (Hugging Face's are kilobytes)
        raise CorruptCheckpointError(f"{index} is {index.stat().st_size} bytes, too large "
                                     "for a sharded model's index")
    try:
        spec = json.loads(index.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        raise CorruptCheckpointError(f"{index} is not a sharded model's index (not JSON: "
                                     f"{exc})") from exc
    weight_map = spec.get("weight_map") if isinstance(spec, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(v, str) for v in weight_map.values()):
        raise CorruptCheckpointError(f"{index} has no \"weight_map\" of tensor names to shard "
                                     "files, as a sharded model's index has")
    model: dict[str, Any] = {}
    missing: list[str] = []
    for name in dict.fromkeys(weight_map.values()):
        if Path(name).name != name or name in (".", "..") or "\\" in name or \
                _suffix(name) not in SUFFIXES:
            raise CorruptCheckpointError(f"{index}: shard {name!r} is not the name of a "
                                         f"{'/'.join(SUFFIXES)} file beside the index")
        shard = index.parent / name
        if not shard.is_file():
            raise CheckpointNotFoundError(f"{index}: its shard {name} is not in {index.parent}")
        if _suffix(name) == ".safetensors":
            data = _read_safetensors(shard, trust_pickle)
            tensors = data["model"] if set(data) == {"model"} else None
        else:
            tensors = _read_torch(shard, trust_pickle)
        if not isinstance(tensors, Mapping) or \
                not all(isinstance(t, torch.Tensor) for t in tensors.values()):
            raise FileFormatError(f"{shard} is not a shard of a model (tensors by name)")
        missing += [k for k, v in weight_map.items() if v == name and k not in tensors]
        twice = [k for k in tensors if k in model]
        if twice:
            raise CorruptCheckpointError(f"{index}: shard {name} repeats {_some(twice)}, of "
                                         "an earlier shard: which to take is not known")
        model.update(tensors)
    if missing:  # (a tied weight saved once, say: a restore names it if the model needs it)
        warn(f"{index} names tensors its shards do not hold: {_some(missing)}")
    return {"model": model}


def _number(value: Any) -> bool:
    """Whether ``value`` fits a metric (a real number a float holds)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, float) or isinstance(value, int) and abs(value) < 2 ** 1023


def _check_meta(source: Path, meta: Mapping[str, Any]) -> None:
    """Refuse a ckpt_nb file's fields that no checkpoint holds (the file is damaged or
    hand-made), rather than have them fail later, in the store or in the caller's hands."""
    problems = [f"its {key} ({reprlib.repr(meta[key])}) is not a 64-bit integer"
                for key in ("epoch", "step", "batch_idx")
                if meta.get(key) is not None and not is_int64(meta[key])]
    metrics = meta.get("metrics", {})
    if not isinstance(metrics, Mapping) or \
            not all(isinstance(k, str) and _number(v) for k, v in metrics.items()):
        problems.append(f"its metrics ({reprlib.repr(metrics)}) are not numbers by name")
    if not isinstance(meta.get("extra", {}), Mapping):
        problems.append(f"its extra ({reprlib.repr(meta['extra'])}) is not a dict")
    info = meta.get("ckpt_nb") or {}
    if not isinstance(info, Mapping) or not isinstance(info.get("note", ""), str):
        problems.append(f"its ckpt_nb entry ({reprlib.repr(info)}) is not a dict with a "
                        "text note")
    if problems:
        raise CorruptCheckpointError(f"{source}: {'; '.join(problems)}: the file is damaged, "
                                     "or not a ckpt_nb export")


def _split_state(data: dict[str, Any], export: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    if all(isinstance(v, torch.Tensor) for v in data.values()):
        return {"model": uncompiled_keys(data)}, {}
    if export:
        meta = {k: data.pop(k) for k in _META_KEYS if k in data}
        return data, meta
    from ._manager import RESERVED

    state: dict[str, Any] = {}
    meta: dict[str, Any] = {"metrics": {}, "extra": {}}
    # A whole module saved as an object (YOLOv5's and ultralytics' {"model": model, "ema":
    # ema, ...}, read with trust_pickle) is the object of its key, its state dict taken:
    # restore(model=...) loads it (in extra, it was a pickle restore did not look at).
    modules = [k for k, v in data.items() if isinstance(k, str) and
               isinstance(v, torch.nn.Module)]
    data = {k: v.state_dict() if k in modules else v for k, v in data.items()}
    names = _object_names(data)
    names.update({k: k for k in modules if k not in names and k not in RESERVED and
                  k not in names.values()})
    lightning = _lightning_objects(data, set(names.values()))
    for key, value in data.items():
        if key in names:
            state[names[key]] = uncompiled_keys(value)
        elif key in lightning:
            state.update(lightning[key])
        elif not isinstance(key, str):  # (a dict keyed by numbers: not a convention's)
            meta["extra"][key] = value
        elif key in ("epoch", "step", "batch_idx", "global_step") and \
                (position := _integer(value)) is not None:
            meta["step" if key == "global_step" else key] = position
        elif key == "metrics" and isinstance(value, Mapping) and \
                all(isinstance(k, str) and _number(v) for k, v in value.items()):
            meta["metrics"].update({k: float(v) for k, v in value.items()})
        elif _METRIC_WORDS & set(key.lower().split("_")) and \
                (number := _scalar(value)) is not None:
            meta["metrics"][key] = number
        else:  # (what does not fit a field stays, as it was, in extra)
            meta["extra"][key] = value
    if lightning or "pytorch-lightning_version" in data:
        for name, number in _lightning_scores(data.get("callbacks")).items():
            meta["metrics"].setdefault(name, number)
    return state, meta


def _lightning_scores(callbacks: Any) -> dict[str, float]:
    """The value each of a Lightning checkpoint's ModelCheckpoint callbacks monitored at
    this save (its ``current_score``, by its ``monitor``), as the checkpoint's metrics: an
    imported checkpoint ranks as "best" by them, as it did in Lightning. (Not
    ``best_model_score``: that is the best checkpoint's, another file's.) The callbacks
    themselves stay in extra."""
    scores: dict[str, float] = {}
    if not isinstance(callbacks, Mapping):
        return scores
    for entry in callbacks.values():
        if isinstance(entry, Mapping) and isinstance(entry.get("monitor"), str) and \
                (number := _scalar(entry.get("current_score"))) is not None:
            scores.setdefault(entry["monitor"], number)
    return scores


def _is_a_ckpt_nb_export(data: Mapping[Any, Any]) -> bool:
    """Whether a torch file is an export of ckpt_nb's, by its entry of that name (the
    checkpoint's id, branch and note: a later version may add to them), not by the key
    alone: another tool's file may have a "ckpt_nb" value of its own, which then stays in
    extra."""
    entry = data.get("ckpt_nb")
    return isinstance(entry, Mapping) and isinstance(entry.get("id"), str)


# Words that make a top-level number of a torch.save dict a metric (val_loss, best_acc),
# as parts of its name: accumulation_steps is none.
_METRIC_WORDS = frozenset({"loss", "acc", "accuracy", "score", "metric", "f1", "auc",
                           "perplexity", "ppl", "bleu"})

# The names the conventions give an object, by the name ckpt_nb and restore() use
_OBJECT_ALIASES = {"state_dict": "model", "lr_scheduler": "scheduler"}


def _object_names(data: Mapping[Any, Any]) -> dict[str, str]:
    """The object each of a conventional dict's states is, by its key: ``state_dict`` the
    model, ``X_state_dict`` or a bare ``model``, ``optimizer``, ``scheduler``, ``scaler``
    X, and an LR scheduler's (``lr_scheduler[_state_dict]``) the scheduler, as
    restore(scheduler=...) names it. Keys that would be one object keep their own
    names (nothing of a file is dropped), as do those whose X names a checkpoint field
    or one of restore()'s options (``rng_state_dict`` is an object "rng_state_dict",
    not the RNG state: the file does not say that it holds ckpt_nb's)."""
    from ._manager import RESERVED

    names: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not isinstance(value, Mapping):
            continue
        if key.endswith("_state_dict") or key == "state_dict":
            name = key.removesuffix("_state_dict")
        elif key in ("model", "optimizer", "scheduler", "lr_scheduler", "scaler"):
            name = key
        else:
            continue
        names[key] = _OBJECT_ALIASES.get(name, name)
    taken = list(names.values())
    return {key: name if taken.count(name) == 1 and name not in RESERVED else key
            for key, name in names.items()}


def _lightning_objects(data: Mapping[Any, Any], taken: set[str]) -> dict[str, dict[str, Any]]:
    """A PyTorch Lightning checkpoint's optimizer and LR scheduler states, by the key of
    their list: ``optimizer_states`` [a, b] are the objects "optimizer", "optimizer_1",
    and ``lr_schedulers`` "scheduler", "scheduler_1" (restore(optimizer=...,
    optimizer_1=...)). Only in a file laid out as Lightning's (a ``state_dict``, a position
    and both lists, of state dicts), and not over a name another key took: else the lists
    stay in extra."""
    if "state_dict" not in data or not ("epoch" in data or "global_step" in data):
        return {}
    found: dict[str, dict[str, Any]] = {}
    for key, name in (("optimizer_states", "optimizer"), ("lr_schedulers", "scheduler")):
        states = data.get(key)
        if not isinstance(states, list) or \
                not all(isinstance(s, Mapping) for s in states):
            return {}
        if states:  # (an empty list stays in extra, as it was)
            found[key] = {name if i == 0 else f"{name}_{i}": s for i, s in enumerate(states)}
    if any(taken & set(objects) for objects in found.values()):
        return {}
    return found


def _integer(value: Any) -> int | None:
    """A position (epoch, step) as a whole number: a Python or NumPy integer, or a 0-dim
    integer tensor (``torch.tensor(7)``, as a loop's counter often is); None else."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_quantized or value.layout is not torch.strided or \
                value.is_floating_point() or value.is_complex() or value.dtype is torch.bool:
            return None
        try:
            value = value.item()
        except (RuntimeError, NotImplementedError):  # (a meta tensor has no value)
            return None
    elif isinstance(value, np.integer):
        value = int(value)
    return value if is_int64(value) else None


def _scalar(value: Any) -> float | None:
    """A conventional dict's top-level number as a metric: a Python or NumPy real number,
    or a 0-dim real tensor (``loss`` as it is, not ``loss.item()``); None for anything
    else (a tensor of a shape of its own stays in extra, with its shape)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_complex() or value.is_quantized or \
                value.dtype is torch.bool or value.layout is not torch.strided:
            return None
        try:
            value = value.item()
        except (RuntimeError, NotImplementedError):  # (a meta tensor has no value)
            return None
    elif isinstance(value, (np.floating, np.integer)):
        value = value.item()  # (a long double's is one again, and stays in extra)
    return float(value) if _number(value) else None
