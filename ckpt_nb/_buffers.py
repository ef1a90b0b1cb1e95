"""Reused buffers, and filling a buffer from a ``readinto`` source.

Fresh memory costs a page fault per 4 KiB on first touch, which halved the
speed of decoding into new ``bytes``: the codec and the chunk reader work in
buffers that each thread keeps and reuses instead, and restores decode into
memory that the last restore let go (``RESTORE_ARENA``).
"""

from __future__ import annotations

import sys
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


class ReusedArena:
    """One allocation handed out again once nothing refers to it any more.

    A restore decodes every storage into fresh memory, then copies most of them
    into live tensors and drops them. Faulting that memory in cost as much as
    decoding it (45 MB: 4-60 ms here, the most when the kernel compacts memory
    for huge pages), while ``torch.load`` gets warm pages back from malloc for
    tensors under its 32 MiB threshold. So the arena is kept and reused, but
    only when no array or tensor views it: each view of it holds a reference,
    which ``sys.getrefcount`` counts. At most ``limit`` bytes are kept.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._kept: np.ndarray | None = None

    def take(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of uint8 memory, warm when the last one handed out is free."""
        with self._lock:  # the view is made under the lock, so two takers never share
            kept = self._kept
            # References: self._kept, ``kept``, getrefcount's argument; any more are views.
            if kept is not None and len(kept) >= nbytes and sys.getrefcount(kept) == 3:
                return kept[:nbytes]
            arena = np.empty(nbytes, dtype=np.uint8)
            self._kept = arena if nbytes <= self.limit else None
            return arena[:nbytes]

    def release(self) -> None:
        """Forget the kept memory (it is freed once its last view goes)."""
        with self._lock:
            self._kept = None


# Shared by a process's managers: restores into a model of up to 512 MiB reuse memory.
RESTORE_ARENA = ReusedArena(512 << 20)
