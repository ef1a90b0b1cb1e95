"""A save whose retention can delete nothing reads no catalog row and measures no store:
under a byte budget it far from reaches (each save listed every pack and manifest, and
read every row: 350 ms a save at 1,000 checkpoints), and under keep_best beside a
max_to_keep the store does not reach. Where something may have added bytes that the
saves did not count (another manager's save, a save killed in another process), the
store is measured again, and the budget still holds."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import DigitsRun

from ckpt_nb import CheckpointManager
from ckpt_nb._store import LocalStore


class SizingCountedStore(LocalStore):
    """A local store that counts its listings with sizes (what measuring it costs)."""

    measured: int = 0

    def sizes(self, prefix: str) -> dict[str, int]:
        self.measured += 1
        return super().sizes(prefix)


def count_row_reads(mgr: CheckpointManager) -> list[int]:
    """Count the calls that decode every checkpoint row of the manager's catalog."""
    calls = [0]
    read: Callable[[], Any] = mgr.catalog.checkpoints

    def counted() -> Any:
        calls[0] += 1
        return read()

    mgr.catalog.checkpoints = counted  # type: ignore[method-assign]
    return calls


def save(mgr: CheckpointManager, run: DigitsRun, step: int) -> str:
    return mgr.save(run.model, run.optimizer, scheduler=run.scheduler, step=step,
                    metrics={"loss": run.train_step()})


def test_a_save_under_a_byte_budget_measures_the_store_once(tmp_path: Path) -> None:
    """The first save measures the store; the next ones count what they add, exactly."""
    store = SizingCountedStore(tmp_path / "s")
    run = DigitsRun()
    with CheckpointManager(store, max_bytes=10**12) as mgr:
        save(mgr, run, 0)  # (the store's first lock take reads it again: a new catalog)
        rows_read = count_row_reads(mgr)
        first = store.measured
        for step in range(1, 12):
            save(mgr, run, step)
        assert store.measured == first, "a save under the budget measured the store"
        assert rows_read[0] == 0
        assert mgr._bytes_bound == mgr.stored_bytes()  # (each pack's index counted)


def test_the_budget_still_deletes_once_the_saves_reach_it(tmp_path: Path) -> None:
    """A budget that the saves' own bytes reach deletes the oldest, as it did."""
    run = DigitsRun()
    with CheckpointManager(tmp_path / "probe") as probe:
        save(probe, run, 0)
        each = probe.stored_bytes()
    budget = each * 5 + each // 2
    with CheckpointManager(tmp_path / "s", max_bytes=budget) as mgr:
        for step in range(12):
            save(mgr, run, step)
            assert mgr.stored_bytes() <= budget
        assert len(mgr.list()) == 5


def test_another_managers_save_is_measured(tmp_path: Path) -> None:
    """A save through another manager of the store adds bytes this one did not count."""
    store = SizingCountedStore(tmp_path / "s")
    run = DigitsRun()
    with CheckpointManager(store, max_bytes=10**12) as mgr, \
            CheckpointManager(tmp_path / "s") as other:
        save(mgr, run, 0)
        save(mgr, run, 1)
        before = store.measured
        save(other, run, 2)
        save(mgr, run, 3)
        assert store.measured > before
        assert mgr._bytes_bound == mgr.stored_bytes()


def test_a_save_killed_in_another_process_is_measured(tmp_path: Path) -> None:
    """A save SIGKILLed in another process left a pack that no catalog lists: the next
    save here measures the store (its budget then sees the bytes), and counts from there."""
    run = DigitsRun()
    store = SizingCountedStore(tmp_path / "s")
    with CheckpointManager(store, max_bytes=10**12) as mgr:
        save(mgr, run, 1)
        save(mgr, run, 2)
        before = store.measured
        killed = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import os, signal
            from ckpt_nb import CheckpointManager
            from ckpt_nb._format import write_pack
            mgr = CheckpointManager({str(store.root)!r})
            with mgr._exclusive():
                with write_pack(mgr.store) as pack:
                    pack.add("ab" * 32, os.urandom(5000), 5000, None, 0)
                os.kill(os.getpid(), signal.SIGKILL)
            """)], check=False)
        assert killed.returncode == -9
        save(mgr, run, 3)
        assert store.measured > before
        assert mgr._bytes_bound == mgr.stored_bytes()  # (the killed save's pack counted)
        save(mgr, run, 4)
        assert mgr._bytes_bound == mgr.stored_bytes()


@pytest.mark.parametrize("kept", [1000, 4])
def test_keep_best_beside_max_to_keep_reads_no_row_till_the_store_passes_it(
        tmp_path: Path, kept: int) -> None:
    """keep_best only keeps more than max_to_keep would: with no more checkpoints than
    max_to_keep, nothing can go, and no row is read; past it, the oldest go, the best
    kept, as before."""
    run = DigitsRun()
    with CheckpointManager(tmp_path / "s", max_to_keep=kept, keep_best=2,
                           metric="loss") as mgr:
        cid = save(mgr, run, 0)  # (the store's first lock take reads it again: a new catalog)
        losses = {cid: mgr.catalog.get(cid).metrics["loss"]}
        rows_read = count_row_reads(mgr)
        for step in range(1, 10):
            cid = save(mgr, run, step)
            losses[cid] = mgr.catalog.get(cid).metrics["loss"]
            if step < kept:
                assert rows_read[0] == 0, step
        ids = list(mgr.list()["id"])
    best = sorted(losses, key=losses.__getitem__)[:2]
    if kept >= 10:
        assert len(ids) == 10
    else:
        assert set(best) <= set(ids)
        assert set(list(losses)[-kept:]) <= set(ids)
        assert len(ids) <= kept + 2
