"""The codec's hot loops in C (``_kernels.c``), loaded through ctypes.

Why C: NumPy's shift-and-or groups bytes at 2-4 GB/s on one core and holds the
GIL between its calls; the C loops run at 25-35 GB/s. A restore decodes a
batch of blobs in one C call (zstd, ungroup, XOR, checksum), so its threads let
the GIL go once a batch, not four times a chunk. Why ctypes: the library needs
neither Python's headers nor its ABI. The build compiles it when a C compiler
is there (``hatch_build.py``); without it, ``lib`` is None and the codec works
in NumPy and Python, byte for byte the same.

The decoder calls zstd and xxh3 through function pointers taken from the
libraries the zstandard and xxhash packages ship (the same zstd that encoded),
or the system's; ``decoder`` is False where neither exports them, and the codec
decodes in Python.

Packs are written with direct I/O by a native thread (``BackgroundWriter``),
which needs no GIL to go on after each write; ``writer`` is False without it,
and the store writes from the calling thread.

Calls that take microseconds keep the GIL (through ``ctypes.PyDLL``): during a
save, a thread that let it go for 20 us waited ~70 us to get it back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import xxhash
import zstandard

LIBRARY = Path(__file__).with_name("_kernels.so")

# Statuses of ckpt_decode (``_kernels.c``): 0 done and checked, LEFT for Python.
LEFT = 1


class _XXH128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


class _API(ctypes.Structure):
    _fields_ = [
        ("create_dctx", ctypes.CFUNCTYPE(ctypes.c_void_p)),
        ("free_dctx", ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)),
        ("decompress_dctx", ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)),
        ("is_error", ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_size_t)),
        ("xxh3_128", ctypes.CFUNCTYPE(_XXH128, ctypes.c_void_p, ctypes.c_size_t)),
    ]


# ckpt_job, field for field; numpy fills a batch of them from lists at once.
JOB = np.dtype({
    "names": ["blob", "blob_len", "out", "out_len", "base", "name", "has_name", "status",
              "detail"],
    "formats": ["u8", "u8", "u8", "u8", "u8", ("u1", 8), "u4", "i4", "u8"],
    "offsets": [0, 8, 16, 24, 32, 40, 48, 52, 56],
    "itemsize": 64,
})

_ZSTD = ("ZSTD_createDCtx", "ZSTD_freeDCtx", "ZSTD_decompressDCtx", "ZSTD_isError",
         "ZSTD_getErrorName")
_error_name = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_size_t)


def _libraries(package_dir: str, system_name: str) -> Iterator[ctypes.CDLL]:
    """The package's own compiled modules, then the system's library."""
    candidates = sorted(str(p) for p in Path(package_dir).glob("*.so"))
    found = ctypes.util.find_library(system_name)
    for path in [*candidates, *([found] if found else [])]:
        try:
            yield ctypes.CDLL(path)
        except OSError:
            continue


def _symbols(package_dir: str, system_name: str, names: Sequence[str]) -> list[int] | None:
    for library in _libraries(package_dir, system_name):
        try:
            return [ctypes.cast(getattr(library, n), ctypes.c_void_p).value or 0 for n in names]
        except AttributeError:
            continue
    return None


def _bind_decoder(lib: ctypes.CDLL) -> bool:
    """Hand zstd and xxh3 to the C decoder; True once xxh3 answers as xxhash does."""
    zstd = _symbols(zstandard.__path__[0], "zstd", _ZSTD)
    xxh = _symbols(xxhash.__path__[0], "xxhash", ["XXH3_128bits"])
    if zstd is None or xxh is None:
        return False
    _error_names.append(_error_name(zstd.pop()))
    kinds = [field[1] for field in _API._fields_]
    api = _API(*(kind(address) for kind, address in zip(kinds, zstd + xxh)))
    lib.ckpt_decode_init.argtypes, lib.ckpt_decode_init.restype = [ctypes.POINTER(_API)], None
    lib.ckpt_decode.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ckpt_decode.restype = None
    probe = ctypes.create_string_buffer(b"ckpt_nb")  # the struct comes back as xxhash's does
    got = api.xxh3_128(ctypes.addressof(probe), 7)
    if (got.high64 << 64 | got.low64) != xxhash.xxh3_128_intdigest(b"ckpt_nb"):
        return False
    lib.ckpt_decode_init(ctypes.byref(api))  # copies the pointers; ctypes never unloads
    return True


def _load() -> tuple[ctypes.CDLL | None, bool]:
    if os.environ.get("CKPT_NB_NATIVE", "1") == "0" or not LIBRARY.exists():
        return None, False
    try:
        lib = ctypes.CDLL(str(LIBRARY))
    except OSError:  # built for another platform, or damaged: NumPy does the work
        return None, False
    try:
        args = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        for fn in (lib.ckpt_group, lib.ckpt_ungroup):
            fn.argtypes, fn.restype = args, None
        lib.ckpt_group_xor.argtypes, lib.ckpt_group_xor.restype = [ctypes.c_void_p] * 3 \
            + [ctypes.c_size_t] * 2, None
        return lib, _bind_decoder(lib)
    except AttributeError:  # a library built from an older _kernels.c: rebuild to use it
        return None, False


def _bind_writer(lib: ctypes.CDLL | None) -> bool:
    if lib is None:
        return False
    try:
        lib.ckpt_writer_open.argtypes, lib.ckpt_writer_open.restype = [ctypes.c_int], \
            ctypes.c_void_p
        lib.ckpt_writer_submit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                           ctypes.c_int64]
        lib.ckpt_writer_submit.restype = ctypes.c_int64
        lib.ckpt_writer_wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        lib.ckpt_writer_wait.restype = ctypes.c_int
        lib.ckpt_writer_close.argtypes, lib.ckpt_writer_close.restype = [ctypes.c_void_p], \
            ctypes.c_int
    except AttributeError:  # built from an older _kernels.c
        return False
    return True


def _bind_estimate(lib: ctypes.CDLL | None) -> Callable[..., float] | None:
    """ckpt_estimated_length, called with the GIL held: weighing a 16 KiB sample takes
    ~20 us, and a save's choosing thread that let the GIL go for it waited ~70 us on
    average to get it back from the save's other threads."""
    if lib is None:
        return None
    try:
        fn = ctypes.PyDLL(str(LIBRARY)).ckpt_estimated_length
    except (OSError, AttributeError):  # built from an older _kernels.c
        return None
    fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t] * 2 + [ctypes.c_double]
    fn.restype = ctypes.c_double
    return fn  # type: ignore[no-any-return]


_error_names: list[Callable[[int], bytes]] = []  # ZSTD_getErrorName, once bound


def zstd_error(code: int) -> str:
    """zstd's words for an error code the C decoder met."""
    return _error_names[0](code).decode() if _error_names else f"zstd error {code}"


lib, decoder = _load()
writer = _bind_writer(lib)
_estimate = _bind_estimate(lib)


def _flat_uint8(a: np.ndarray) -> bool:
    return a.dtype == np.uint8 and a.flags.c_contiguous


def group(raw: np.ndarray, out: np.ndarray, base: np.ndarray | None = None) -> None:
    """Byte k of every element of ``raw`` (XOR ``base``, for a delta) into row k of
    ``out`` (shape (itemsize, n))."""
    nrows, per = out.shape
    if lib is None or not (_flat_uint8(raw) and _flat_uint8(out)) or raw.size != nrows * per \
            or (base is not None and (not _flat_uint8(base) or base.size != raw.size)):
        raise ValueError("group takes contiguous uint8 arrays of matching size")
    if base is None:
        lib.ckpt_group(out.ctypes.data, raw.ctypes.data, nrows, per)
    else:
        lib.ckpt_group_xor(out.ctypes.data, raw.ctypes.data, base.ctypes.data, nrows, per)


def ungroup(rows: list[np.ndarray], out: np.ndarray) -> None:
    """Row k becomes byte k of every element of ``out``."""
    nrows = len(rows)
    per = out.size // nrows if nrows else 0
    if lib is None or not _flat_uint8(out) or nrows * per != out.size or \
            any(not _flat_uint8(r) or r.size != per for r in rows):
        raise ValueError("ungroup takes contiguous uint8 rows that add up to out")
    pointers = (ctypes.c_void_p * nrows)(*(r.ctypes.data for r in rows))
    lib.ckpt_ungroup(out.ctypes.data, pointers, nrows, per)


def estimated_length(raw: np.ndarray, base: np.ndarray | None, itemsize: int,
                     keep_ratio: float) -> float | None:
    """``codec.estimated_length`` in one C call; None where the build lacks it or for
    an itemsize the C side does not take (over 16)."""
    if _estimate is None:
        return None
    if not _flat_uint8(raw) or (base is not None and (
            not _flat_uint8(base) or base.size != raw.size)):
        raise ValueError("estimated_length takes contiguous uint8 arrays of one length")
    found = _estimate(raw.ctypes.data, 0 if base is None else base.ctypes.data, raw.size,
                      itemsize, keep_ratio)
    return None if found < 0 else found


def _address(buffer: memoryview | bytes | np.ndarray) -> int:
    array = buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, dtype=np.uint8)
    if not array.flags.c_contiguous:
        raise ValueError("the C decoder takes contiguous buffers")
    return array.ctypes.data


DecodeJob = tuple[memoryview | bytes | np.ndarray, np.ndarray, np.ndarray | None, bytes | None]


def can_decode() -> bool:
    return lib is not None and decoder


def decode(jobs: Sequence[DecodeJob]) -> np.ndarray:
    """Decode (blob, out, base, name head) jobs in one C call; their ``status`` and
    ``detail`` come back in a JOB array. The caller checks ``out`` and ``base``
    are uint8 arrays of the right lengths; the C side checks everything in the blob."""
    if lib is None or not decoder:
        raise RuntimeError("the C decoder is not available")
    table = np.zeros(len(jobs), dtype=JOB)
    if not jobs:
        return table
    for out in (job[1] for job in jobs):
        if not (_flat_uint8(out) and out.flags.writeable):
            raise ValueError("decode writes into writable contiguous uint8 arrays")
    table["blob"] = [_address(blob) for blob, _, _, _ in jobs]
    table["blob_len"] = [len(blob) for blob, _, _, _ in jobs]
    table["out"] = [out.ctypes.data for _, out, _, _ in jobs]
    table["out_len"] = [out.size for _, out, _, _ in jobs]
    table["base"] = [0 if base is None else _address(base) for _, _, base, _ in jobs]
    for i, (_, out, base, name) in enumerate(jobs):
        if base is not None and base.size != out.size:
            raise ValueError("a delta's base has another length than its chunk")
        if name is not None:
            table["name"][i] = np.frombuffer(name, dtype=np.uint8)
            table["has_name"][i] = 1
    lib.ckpt_decode(table.ctypes.data, len(jobs))
    return table


def _raise_errno(code: int) -> None:
    if code < 0:
        raise OSError(-code, os.strerror(-code))


class BackgroundWriter:
    """Writes to one file, in the order given, on a native thread that never needs
    the GIL (``_kernels.c`` says why); a buffer handed over must stay unchanged
    until ``wait`` has seen its write done."""

    def __init__(self, fd: int) -> None:
        if lib is None or not writer:
            raise RuntimeError("the native writer is not available")
        self._lib = lib
        handle = lib.ckpt_writer_open(fd)
        if not handle:
            raise OSError(errno.EAGAIN, "could not start a writer thread")
        self._handle: int | None = handle

    def submit(self, data: np.ndarray, offset: int) -> int:
        """Queue ``data`` (contiguous uint8) for ``offset``; returns the number to ``wait`` for."""
        if self._handle is None or not _flat_uint8(data):
            raise ValueError("submit takes contiguous uint8 data, before close")
        number = self._lib.ckpt_writer_submit(self._handle, data.ctypes.data, data.size, offset)
        _raise_errno(number)
        return number

    def wait(self, number: int) -> None:
        """Until write ``number`` and those before it are done; raises the first failure."""
        if self._handle is not None and number > 0:
            _raise_errno(self._lib.ckpt_writer_wait(self._handle, number))

    def close(self) -> None:
        """Finish the queued writes and stop the thread; raises the first failure."""
        handle, self._handle = self._handle, None
        if handle is not None:
            _raise_errno(self._lib.ckpt_writer_close(handle))
