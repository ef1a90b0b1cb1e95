"""Reused per-thread buffers, and filling a buffer from a ``readinto`` source.

Fresh memory costs a page fault per 4 KiB on first touch, which halved the
speed of decoding into new ``bytes``: the codec and the chunk reader work in
buffers that each thread keeps and reuses instead.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np

_local = threading.local()


class ReadInto(Protocol):
    def readinto(self, buffer: memoryview, /) -> int | None: ...


def scratch(slot: str, nbytes: int) -> np.ndarray:
    """This thread's reusable uint8 buffer ``slot``, at least ``nbytes`` long.

    Valid until this thread next asks for the same slot.
    """
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    buf = buffers.get(slot)
    if buf is None or len(buf) < nbytes:
        buf = buffers[slot] = np.empty(nbytes, dtype=np.uint8)
    return buf[:nbytes]


def fill(source: ReadInto, out: memoryview) -> int:
    """``readinto`` until ``out`` is full or ``source`` ends; returns the bytes read."""
    done = 0
    while done < len(out):
        n = source.readinto(out[done:])
        if not n:
            break
        done += n
    return done
