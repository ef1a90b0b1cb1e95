"""keep_best beside a byte budget, which keeps the best and lets the budget decide the
rest."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import DigitsRun, same

from ckpt_nb import CheckpointManager


def check_restores(mgr: CheckpointManager, states: dict[int, list[torch.Tensor]]) -> None:
    """Every checkpoint kept restores bit-exact (a delta's base chain rewritten or not)."""
    for cid, step in zip(mgr.list()["id"], mgr.list()["step"]):
        run = DigitsRun(seed=99)
        mgr.restore(cid, model=run.model, optimizer=run.optimizer, scheduler=run.scheduler)
        assert same(run.weights() + run.optimizer_tensors(), states[step]), step



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
                            max_bytes=budget, keep_best=2, metric="score")
    run.train_step()
    mgr.save(run.model, run.optimizer, scheduler=run.scheduler, step=30,
             metrics={"score": 50.0})
    states[30] = run.weights() + run.optimizer_tensors()
    kept = list(mgr.list()["step"])
    assert mgr.stored_bytes() <= budget
    assert kept[:2] == [1, 2] and len(kept) > 10, kept  # the best, and the newest others
    assert kept[2:] == list(range(kept[2], 31)), kept
    check_restores(mgr, states)
