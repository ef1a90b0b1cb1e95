"""Reused buffers, and filling a buffer from a ``readinto`` source.

Fresh memory costs a page fault per 4 KiB on first touch, which halved the
speed of decoding into new ``bytes``: the codec and the chunk reader work in
buffers that each thread keeps and reuses instead, and restores decode into
memory that an earlier restore let go (``RESTORE_ARENA``).
"""

from __future__ import annotations

import ctypes
import os
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
    """Allocations handed out again once nothing refers to them any more.

    A restore decodes every storage into fresh memory, then copies most of them
    into live tensors and drops them. Faulting that memory in cost as much as
    decoding it (45 MB: 4-60 ms here, the most when the kernel compacts memory
    for huge pages), while ``torch.load`` gets warm pages back from malloc for
    tensors under its 32 MiB threshold. So arenas are kept and reused, but only
    when no array or tensor views them: each view holds a reference, which
    ``sys.getrefcount`` counts.

    A restore takes one for the storages it copies into live tensors, free again
    once it is done, and one for each owner of those kept as they are (an
    optimizer's ``load_state_dict`` keeps the tensors it is given; a value of
    ``extra`` is handed out): in one allocation, the optimizer's state held the
    copied model's memory too, and any other value's. Three are kept, since the
    next restore cannot take the optimizer's of the last (the optimizer still
    holds it); it takes the one before, which the optimizer let go of as it
    loaded. At most ``limit`` bytes are kept in all.
    """

    SLOTS = 3

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._kept: list[np.ndarray] = []  # the most recently handed out last

    def take(self, nbytes: int, *, long_lived: bool = False) -> np.ndarray:
        """``nbytes`` of uint8 memory, warm when one handed out before is free: the
        smallest that fits (the most recently used of those: warmest), so that the small
        take of a restore leaves the large one its own. ``long_lived``: the memory may stay
        held after the restore (an optimizer's state, a value of ``extra``), so no free
        allocation over twice its size is taken for it: a 256 KiB value kept from a
        re-run restore held the 64 MiB the model's storages were decoded into before."""
        with self._lock:  # the view is made under the lock, so two takers never share
            # References: the list, the loop's name, getrefcount's argument; any more are
            # views.
            free = [kept for kept in self._kept
                    if nbytes <= len(kept) <= (2 * nbytes if long_lived else len(kept))
                    and sys.getrefcount(kept) == 3]
            if free:
                chosen = min(reversed(free), key=len)
                self._kept = [k for k in self._kept if k is not chosen] + [chosen]
                return chosen[:nbytes]
            arena = np.empty(nbytes, dtype=np.uint8)
            if nbytes <= self.limit:
                self._kept.append(arena)
                while len(self._kept) > self.SLOTS or \
                        sum(len(k) for k in self._kept) > self.limit:
                    del self._kept[0]
            return arena[:nbytes]

    def release(self) -> None:
        """Forget the kept memory (each arena is freed once its last view goes)."""
        with self._lock:
            self._kept = []


# Shared by a process's managers: restores into a model of up to 512 MiB reuse memory.
RESTORE_ARENA = ReusedArena(512 << 20)


def give_back_freed_memory() -> None:
    """Hand the heap memory freed so far back to the system (glibc's ``malloc_trim``):
    glibc keeps it for the process's next allocations, so the delta bases a closed
    manager let go (its incremental saves' raw chunks: 285 MiB of a 256 MiB model) stayed
    in its memory for the rest of the session. Called at ``close()`` only: after a save
    it cost up to 16 ms, for memory the next save takes again. Elsewhere than glibc (macOS,
    musl), nothing."""
    try:
        glibc = sys.platform.startswith("linux") and \
            (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
        if glibc:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (ValueError, OSError, AttributeError):  # (no such name, library or function)
        pass


def _fresh_arena_lock() -> None:
    """A child forked during a restore has the arena's lock held by a thread it lacks."""
    RESTORE_ARENA._lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_arena_lock)
