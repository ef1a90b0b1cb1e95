"""Work shared between threads, and memory reused between restores."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ckpt_nb._buffers import ReusedArena
from ckpt_nb._parallel import in_batches, share_work


@pytest.fixture
def pool() -> ThreadPoolExecutor:
    with ThreadPoolExecutor(3) as executor:
        yield executor


def test_every_item_is_worked_once_by_the_caller_and_the_helpers(pool: ThreadPoolExecutor) -> None:
    seen: list[tuple[int, str]] = []
    lock = threading.Lock()

    def work(item: int) -> None:
        time.sleep(0.002)
        with lock:
            seen.append((item, threading.current_thread().name))

    reports: list[int] = []
    share_work(pool, 2, list(range(40)), work, reports.append, weight=lambda i: i)
    assert sorted(i for i, _ in seen) == list(range(40))
    assert threading.current_thread().name in {name for _, name in seen}
    assert len({name for _, name in seen}) > 1
    assert reports == sorted(reports) and reports[-1] == sum(range(40))


def test_the_first_error_stops_the_work_and_nothing_runs_on_after_it(
        pool: ThreadPoolExecutor) -> None:
    started: list[int] = []

    def work(item: int) -> None:
        started.append(item)
        if item == 3:
            raise OSError("disk gone")
        time.sleep(0.005)

    with pytest.raises(OSError, match="disk gone"):
        share_work(pool, 2, list(range(100)), work)
    count = len(started)
    time.sleep(0.05)
    assert len(started) == count < 100  # no thread took an item after the call returned


def test_with_no_helpers_the_caller_does_it_all(pool: ThreadPoolExecutor) -> None:
    names: set[str] = set()
    share_work(pool, 0, [1, 2, 3], lambda _: names.add(threading.current_thread().name))
    assert names == {threading.current_thread().name}


def test_batches_keep_order_and_size() -> None:
    batches = in_batches(list(range(10)), 1, lambda _: 600_000)
    assert [x for b in batches for x in b] == list(range(10))
    assert all(len(b) == 2 for b in batches)


def test_the_arena_is_handed_out_again_only_once_nothing_views_it() -> None:
    arena = ReusedArena(limit=1 << 20)
    first = arena.take(1000)
    first[:] = 7
    held = first[10:20]  # a view, as a restored tensor would hold
    del first
    second = arena.take(1000)
    assert not np.shares_memory(second, held), "memory still in use was handed out"
    second[:] = 9
    assert (held == 7).all()
    del held
    address = second.__array_interface__["data"][0]
    del second
    third = arena.take(800)
    assert third.__array_interface__["data"][0] == address  # warm memory, reused


def test_the_arena_keeps_three_and_nothing_over_its_limit() -> None:
    arena = ReusedArena(limit=1000)
    held = [arena.take(600)]
    assert len(arena._kept) == 1
    held.append(arena.take(100))  # (the first is still held: a second one)
    assert len(arena._kept) == 2
    arena.take(5000)
    assert len(arena._kept) == 2  # over the limit: not kept
    held.append(arena.take(200))
    assert len(arena._kept) == 3
    arena.take(50)  # a fourth: the oldest is forgotten
    assert [len(k) for k in arena._kept] == [100, 200, 50]
    arena.take(700)  # over the limit with the others: the oldest go
    assert [len(k) for k in arena._kept] == [200, 50, 700]
    del held


def test_the_arena_hands_out_the_smallest_free_one_that_fits() -> None:
    """A restore takes a small arena (what it copies into the model) and a large one (what
    the optimizer keeps): the small take must not use up the large free one."""
    arena = ReusedArena(limit=1 << 20)
    large, small = arena.take(800), arena.take(100)
    large_at, small_at = (a.__array_interface__["data"][0] for a in (large, small))
    del large, small
    first = arena.take(90)
    assert first.__array_interface__["data"][0] == small_at
    assert arena.take(500).__array_interface__["data"][0] == large_at


def test_a_long_lived_take_leaves_a_much_larger_free_one_alone() -> None:
    """What may stay held after a restore (a value of ``extra``) takes no free allocation
    over twice its size: a 256 KiB value kept from a re-run restore held the 64 MiB the
    model's storages were decoded into the time before."""
    arena = ReusedArena(limit=1 << 20)
    large = arena.take(800)
    large_at = large.__array_interface__["data"][0]
    del large
    kept = arena.take(100, long_lived=True)
    assert kept.__array_interface__["data"][0] != large_at
    assert arena.take(500, long_lived=True).__array_interface__["data"][0] == large_at
