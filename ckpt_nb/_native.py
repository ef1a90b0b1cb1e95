"""The codec's byte-grouping loops in C (``_bytegroup.c``), loaded through ctypes.

Why C: NumPy's shift-and-or runs at 2-4 GB/s on one core and holds the GIL
between its calls; the C loops run at 25-35 GB/s, and a ctypes call releases
the GIL, so restore threads overlap. Why ctypes: the library needs neither
Python's headers nor its ABI. The build compiles it when a C compiler is
there (``hatch_build.py``); without it, ``lib`` is None and the codec groups
with NumPy, byte for byte the same.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

LIBRARY = Path(__file__).with_name("_bytegroup.so")


def _load() -> ctypes.CDLL | None:
    if os.environ.get("CKPT_NB_NATIVE", "1") == "0" or not LIBRARY.exists():
        return None
    try:
        lib = ctypes.CDLL(str(LIBRARY))
    except OSError:  # built for another platform, or damaged: NumPy does the work
        return None
    args = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    for fn in (lib.ckpt_group, lib.ckpt_ungroup):
        fn.argtypes, fn.restype = args, None
    return lib


lib = _load()


def _flat_uint8(a: np.ndarray) -> bool:
    return a.dtype == np.uint8 and a.flags.c_contiguous


def group(raw: np.ndarray, out: np.ndarray) -> None:
    """Byte k of every element of ``raw`` into row k of ``out`` (shape (itemsize, n))."""
    nrows, per = out.shape
    if lib is None or not (_flat_uint8(raw) and _flat_uint8(out)) or raw.size != nrows * per:
        raise ValueError("group takes contiguous uint8 arrays of matching size")
    lib.ckpt_group(out.ctypes.data, raw.ctypes.data, nrows, per)


def ungroup(rows: list[np.ndarray], out: np.ndarray) -> None:
    """Row k becomes byte k of every element of ``out``."""
    nrows = len(rows)
    per = out.size // nrows if nrows else 0
    if lib is None or not _flat_uint8(out) or nrows * per != out.size or \
            any(not _flat_uint8(r) or r.size != per for r in rows):
        raise ValueError("ungroup takes contiguous uint8 rows that add up to out")
    pointers = (ctypes.c_void_p * nrows)(*(r.ctypes.data for r in rows))
    lib.ckpt_ungroup(out.ctypes.data, pointers, nrows, per)
