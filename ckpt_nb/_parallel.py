"""Splitting work into batches, and sharing batches between threads.

On a VM a pool thread that sleeps takes from 0.1 to several milliseconds to
wake, and every hand-off of the GIL between threads on two CPUs costs a
wake-up: work goes to threads a batch at a time, and the thread that asks for
the work takes batches too, since it is awake anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import TypeVar

T = TypeVar("T")


def in_batches(jobs: list[T], nbytes: int, size: Callable[[T], int]) -> list[list[T]]:
    """Consecutive jobs in batches of about ``nbytes`` (at least 1 MiB) by ``size``.

    Each hand-off between threads costs about as much as coding a small chunk.
    """
    nbytes = max(nbytes, 1 << 20)
    batches: list[list[T]] = [[]]
    filled = 0
    for job in jobs:
        if filled >= nbytes:
            batches.append([])
            filled = 0
        batches[-1].append(job)
        filled += size(job)
    return [b for b in batches if b]


def share_work(pool: Executor, helpers: int, items: Sequence[T], work: Callable[[T], None],
               progress: Callable[[int], None] | None = None,
               weight: Callable[[T], int] = lambda _: 1) -> None:
    """``work`` on every item, by this thread and up to ``helpers`` pool threads,
    each taking the next item when done with its last.

    ``progress`` is called on this thread with the total weight done so far.
    The first error stops the taking of items; it is raised here once every
    thread has stopped, so nothing runs on after this returns.
    """
    lock = threading.Lock()
    queue = iter(items)
    errors: list[BaseException] = []
    done = [0]

    def drain(report: Callable[[int], None] | None) -> None:
        while True:
            with lock:
                item = _END if errors else next(queue, _END)
            if item is _END:
                return
            try:
                work(item)  # type: ignore[arg-type]
                with lock:
                    done[0] += weight(item)  # type: ignore[arg-type]
                    so_far = done[0]
                if report is not None:
                    report(so_far)
            except BaseException as exc:  # raised by the caller once all have stopped
                with lock:
                    errors.append(exc)
                return

    futures = [pool.submit(drain, None) for _ in range(min(helpers, len(items) - 1))]
    drain(progress)
    for future in futures:
        future.result()
    if errors:
        raise errors[0]
    if progress is not None:
        progress(done[0])  # the helpers may have finished last


_END = object()
