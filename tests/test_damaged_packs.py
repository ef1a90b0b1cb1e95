"""A pack damaged from outside ckpt_nb (deleted by hand, a copy cut short, a disk that lost
writes) is never deduplicated against: the next save stores its chunks again, says once
which pack it found damaged, and restores bit-exact; gc() reports such a pack.

Without the check, a save trusted the catalog's rows of the chunks it had, so every save
after the damage returned an id and none of them could be restored."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
from conftest import DigitsRun, same

from ckpt_nb import CheckpointManager

HIDDEN = 512  # (a first layer of 128 KiB: stored as deltas by delta saves)


def frozen_run() -> DigitsRun:
    """A run whose last layer is frozen: its chunks are the same at every save."""
    run = DigitsRun(seed=1, hidden=HIDDEN)
    run.model[2].requires_grad_(False)
    return run


def damage(pack: Path, how: str) -> None:
    """Cut a pack to a third (a copy cut short), or delete it (a user's rm)."""
    if how == "cut short":
        os.truncate(pack, pack.stat().st_size // 3)
    else:
        pack.unlink()


def the_packs(mgr: CheckpointManager) -> set[str]:
    return {row.pack for row in mgr.catalog.all_chunks()}


def restores_as_saved(mgr: CheckpointManager, cid: str,
                      saved: tuple[list[torch.Tensor], list[torch.Tensor]]) -> bool:
    fresh = frozen_run()
    mgr.restore(cid, model=fresh.model, optimizer=fresh.optimizer, rng=False)
    return same(fresh.weights(), saved[0]) and same(fresh.optimizer_tensors(), saved[1])


def damage_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "changed outside ckpt_nb" in str(w.message)]


@pytest.mark.parametrize("how", ["cut short", "deleted"])
@pytest.mark.parametrize("strategy", ["full", "incremental"])
def test_a_save_after_a_pack_is_damaged_stores_its_chunks_again(
        tmp_path: Path, strategy: str, how: str) -> None:
    run = frozen_run()
    mgr = CheckpointManager(tmp_path / "exp", strategy=strategy)
    run.train_step()
    mgr.save(run.model, run.optimizer, rng=False)
    (first,) = the_packs(mgr)  # (the frozen layer's chunk lies in it, last)
    run.train_step()
    mgr.save(run.model, run.optimizer, rng=False)  # (its chunk deduplicated against it)
    damage(tmp_path / "exp" / first, how)

    saved = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            run.train_step()
            cid = mgr.save(run.model, run.optimizer, rng=False)
            saved[cid] = (run.weights(), run.optimizer_tensors())
    for cid, state in saved.items():
        assert restores_as_saved(mgr, cid, state)
    told = damage_warnings(caught)
    assert len(told) == 1 and first in told[0] and "this save stored those chunks again" \
        in told[0] and ("missing" if how == "deleted" else "cut short") in told[0]
    report = mgr.verify()
    assert not report.ok  # (the checkpoints saved before the damage: named)
    assert not set(saved) & set(report.bad)

    # A fresh manager's save is whole too, and "latest" is the newest.
    mgr.close()
    again = CheckpointManager(tmp_path / "exp", strategy=strategy)
    run.train_step()
    cid = again.save(run.model, run.optimizer, rng=False)
    assert restores_as_saved(again, cid, (run.weights(), run.optimizer_tensors()))
    fresh = frozen_run()
    assert again.restore("latest", model=fresh.model, optimizer=fresh.optimizer,
                         rng=False).id == cid


def test_a_delta_save_takes_no_delta_against_a_chunk_in_a_damaged_pack(tmp_path: Path) -> None:
    run = DigitsRun(seed=1, hidden=HIDDEN)
    mgr = CheckpointManager(tmp_path / "exp", strategy="incremental")
    run.train_step()
    mgr.save(run.model, run.optimizer, rng=False)
    before = the_packs(mgr)
    run.train_step()
    mgr.save(run.model, run.optimizer, rng=False)
    (second,) = the_packs(mgr) - before
    deltas = [row for row in mgr.catalog.chunks_in_pack(second) if row.base is not None]
    assert deltas  # (what the next save takes its deltas against: kept in memory)
    damage(tmp_path / "exp" / second, "cut short")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.train_step()
        cid = mgr.save(run.model, run.optimizer, rng=False)
    fresh = DigitsRun(seed=2, hidden=HIDDEN)
    mgr.restore(cid, model=fresh.model, optimizer=fresh.optimizer, rng=False)
    assert same(fresh.weights(), run.weights())
    assert same(fresh.optimizer_tensors(), run.optimizer_tensors())
    assert len(damage_warnings(caught)) == 1


@pytest.mark.parametrize("how", ["cut short", "deleted"])
def test_gc_reports_a_damaged_pack_and_keeps_one_cut_short(tmp_path: Path, how: str) -> None:
    run = frozen_run()
    mgr = CheckpointManager(tmp_path / "exp")
    for _ in range(2):
        run.train_step()
        mgr.save(run.model, run.optimizer, rng=False)
    first = min(the_packs(mgr), key=lambda key: (tmp_path / "exp" / key).stat().st_mtime)
    damage(tmp_path / "exp" / first, how)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reports = [mgr.gc(), mgr.gc()]
    told = damage_warnings(caught)
    assert len(told) == 1 and first in told[0]
    assert ("missing" if how == "deleted" else "cut short") in told[0]
    if how == "cut short":  # (kept for what is left in it, and counted at every gc)
        assert [report.damaged_kept for report in reports] == [1, 1]
        assert (tmp_path / "exp" / first).exists()
    run.train_step()
    cid = mgr.save(run.model, run.optimizer, rng=False)
    assert restores_as_saved(mgr, cid, (run.weights(), run.optimizer_tensors()))
