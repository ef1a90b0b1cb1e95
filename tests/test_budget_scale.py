"""Retention over a byte budget that has many checkpoints to delete: a few gc runs for
all of them, the same ones kept as deleting them one at a time would keep, each kept one
whole; and keep_best beside a byte budget, which keeps the best and lets the budget
decide the rest."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from copy import deepcopy
from pathlib import Path

import pytest
import torch
from conftest import DigitsRun, same

from ckpt_nb import CheckpointManager
from ckpt_nb._manager import BUDGET_COMPACT_BELOW

SAVES = 48


def build_store(path: Path, strategy: str) -> tuple[DigitsRun, dict[int, list[torch.Tensor]]]:
    """A run of ``SAVES`` checkpoints (steps 0 to SAVES - 1) that branches twice and pins
    a few; its state at each step, to check restores against."""
    run = DigitsRun(seed=2)
    mgr = CheckpointManager(path, strategy=strategy, full_every=6, chunk_size=4096)
    states: dict[int, list[torch.Tensor]] = {}
    for step in range(SAVES):
        if step in (17, 34):  # a branch from five checkpoints back
            mgr.restore(list(mgr.list()["id"])[-5], model=run.model, optimizer=run.optimizer,
                        scheduler=run.scheduler)
        loss = run.train_step()
        cid = mgr.save(run.model, run.optimizer, scheduler=run.scheduler, step=step,
                       metrics={"loss": loss})
        states[step] = run.weights() + run.optimizer_tensors()
        if step % 13 == 4:
            mgr.pin(cid)
    mgr.close()
    return run, states


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory
          ) -> Callable[[Path, str], tuple[DigitsRun, dict[int, list[torch.Tensor]]]]:
    """build_store's, each strategy's built once a module: a copy of its store at the path
    given, its run (its own copy, to train on) and its states."""
    made: dict[str, tuple[Path, DigitsRun, dict[int, list[torch.Tensor]]]] = {}

    def copy_of(path: Path, strategy: str) -> tuple[DigitsRun, dict[int, list[torch.Tensor]]]:
        if strategy not in made:
            where = tmp_path_factory.mktemp(f"built-{strategy}")
            made[strategy] = (where, *build_store(where, strategy))
        where, run, states = made[strategy]
        shutil.copytree(where, path)
        return deepcopy(run), dict(states)

    return copy_of


def delete_one_at_a_time(mgr: CheckpointManager, budget: int, protected: set[str]) -> None:
    """A byte budget's retention as it was before it deleted in batches: the oldest
    first, each with a gc of its own, until the store fits."""
    tight = {"compact_below": BUDGET_COMPACT_BELOW, "whole_over": 0}
    with mgr._exclusive():
        mgr._gc_locked(**tight)
        for row in mgr.catalog.checkpoints():
            if mgr.stored_bytes() <= budget:
                break
            if row.id not in protected:
                mgr._drop([row.id], **tight)


def check_restores(mgr: CheckpointManager, states: dict[int, list[torch.Tensor]]) -> None:
    """Every checkpoint kept restores bit-exact (a delta's base chain rewritten or not)."""
    for cid, step in zip(mgr.list()["id"], mgr.list()["step"]):
        run = DigitsRun(seed=99)
        mgr.restore(cid, model=run.model, optimizer=run.optimizer, scheduler=run.scheduler)
        assert same(run.weights() + run.optimizer_tensors(), states[step]), step


@pytest.mark.parametrize("strategy", ["full", "incremental", "differential"])
def test_a_byte_budget_keeps_what_deleting_one_at_a_time_kept(
        tmp_path: Path, strategy: str, built: Callable[..., tuple[DigitsRun, dict]]) -> None:
    """Deleting together the oldest checkpoints that may free enough, then measuring,
    keeps the checkpoints the one-at-a-time loop kept (a checkpoint more at most where
    the batch leaves fewer packs), pinned and best ones among them, under the budget."""
    run, states = built(tmp_path / "built", strategy)
    total = CheckpointManager(tmp_path / "built").stored_bytes()
    run.train_step()
    states[SAVES] = run.weights() + run.optimizer_tensors()
    for fraction, keep_best in ((0.3, None), (0.6, 3), (0.85, None)):
        budget = int(total * fraction)
        ranked = {"keep_best": keep_best, "metric": "loss"} if keep_best else {}
        batched, one_by_one = tmp_path / f"batched{fraction}", tmp_path / f"one{fraction}"
        for copy in (batched, one_by_one):
            shutil.copytree(tmp_path / "built", copy)
        mgr = CheckpointManager(batched, strategy=strategy, full_every=6, chunk_size=4096,
                                max_bytes=budget, **ranked)
        mgr.save(run.model, run.optimizer, scheduler=run.scheduler, step=SAVES)
        ref = CheckpointManager(one_by_one, strategy=strategy, full_every=6, chunk_size=4096,
                                metric="loss")  # (ranks, deleting nothing)
        cid = ref.save(run.model, run.optimizer, scheduler=run.scheduler, step=SAVES)
        rows = ref.catalog.checkpoints()
        best = set(ref._best(rows, keep_best)) if keep_best else set()
        delete_one_at_a_time(ref, budget, {cid} | best | {r.id for r in rows if r.pinned})
        kept, kept_before = list(mgr.list()["step"]), list(ref.list()["step"])
        assert set(kept_before) <= set(kept) and len(kept) <= len(kept_before) + 1, fraction
        assert mgr.stored_bytes() <= budget and len(kept) < SAVES, fraction
        assert set(mgr.list()["step"][mgr.list()["pinned"]]) == {4, 17, 30, 43}, fraction
        check_restores(mgr, states)
        mgr.close()
        ref.close()


def test_a_byte_budget_deletes_many_checkpoints_in_a_few_gc_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        built: Callable[..., tuple[DigitsRun, dict]]) -> None:
    """Each deletion ran a gc of the whole store, and measured it: a store reopened with
    half its size as budget took minutes to delete hundreds of checkpoints."""
    run, states = built(tmp_path / "store", "full")
    tmp_path = tmp_path / "store"
    budget = CheckpointManager(tmp_path).stored_bytes() // 2
    gc_runs = []
    gc_locked = CheckpointManager._gc_locked

    def counted(self: CheckpointManager, *args: object, **kwargs: object) -> object:
        gc_runs.append(kwargs)
        return gc_locked(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CheckpointManager, "_gc_locked", counted)
    mgr = CheckpointManager(tmp_path, strategy="full", chunk_size=4096, max_bytes=budget)
    run.train_step()
    states[SAVES] = run.weights() + run.optimizer_tensors()
    mgr.save(run.model, run.optimizer, scheduler=run.scheduler, step=SAVES)
    assert len(mgr.list()) < SAVES // 2 + 4 and mgr.stored_bytes() <= budget
    assert len(gc_runs) <= 4, len(gc_runs)
    check_restores(mgr, states)


def test_keep_best_beside_a_byte_budget_keeps_the_best_and_the_budget_the_rest(
        tmp_path: Path) -> None:
    """With max_bytes and no max_to_keep, keep_best keeps the best K and the budget
    deletes the oldest others until the store fits (keep_best alone deleted all but the
    best, the pinned and the newest, however far under the budget that left it)."""
    run = DigitsRun(seed=3)
    mgr = CheckpointManager(tmp_path, strategy="incremental", chunk_size=4096)
    states = {}
    for step in range(30):
        run.train_step()
        score = 0.1 if step in (1, 2) else 1.0 + step  # the best: two of the oldest
        mgr.save(run.model, run.optimizer, scheduler=run.scheduler, step=step,
                 metrics={"score": score})
        states[step] = run.weights() + run.optimizer_tensors()
    budget = mgr.stored_bytes() * 6 // 10
    mgr.close()
    mgr = CheckpointManager(tmp_path, strategy="incremental", chunk_size=4096,
                            max_bytes=budget, keep_best=2, metric="score",
                            mode="min")
    run.train_step()
    mgr.save(run.model, run.optimizer, scheduler=run.scheduler, step=30,
             metrics={"score": 50.0})
    states[30] = run.weights() + run.optimizer_tensors()
    kept = list(mgr.list()["step"])
    assert mgr.stored_bytes() <= budget
    assert kept[:2] == [1, 2] and len(kept) > 10, kept  # the best, and the newest others
    assert kept[2:] == list(range(kept[2], 31)), kept
    check_restores(mgr, states)
