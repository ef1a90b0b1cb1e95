"""Stores shared with other versions of ckpt_nb: older ones (saved before labels, or in
an older format) and newer ones (a checkpoint of a manifest format this one cannot read).

The older versions' stores are made here by this ckpt_nb, then put in the state the
older one left them in (no labels, no flag in the catalog, an older format stamp); a
newer version's checkpoint is a manifest restamped with a newer format, and its
catalog row's digest, as a newer save's commit writes them. Real files, real SQLite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import same

from ckpt_nb import CheckpointManager
from ckpt_nb._format import FORMAT


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 8192))

    def step(self) -> None:
        with torch.no_grad():
            self.weight[:, :16] += 1


@pytest.mark.parametrize(("found", "after"), [(1, FORMAT), (2, 2)])
def test_a_gc_that_stores_chunks_whole_restamps_a_store_too_old_for_their_blobs(
        tmp_path: Path, found: int, after: int) -> None:
    """Deleting the checkpoints under a long delta chain stores its kept end whole, as a
    CKB2 blob: a format-1 store is restamped first, so that a format-1 reader refuses
    it by its format instead of reading a blob it cannot decode as damage; a format-2
    reader reads CKB2 blobs, and its store keeps its stamp."""
    model = Chain()
    with CheckpointManager(tmp_path, strategy="incremental", full_every=30,
                           chunk_size=8192) as mgr:
        ids = []
        for step in range(12):
            model.step()
            ids.append(mgr.save(model, step=step))
    stamp = tmp_path / "ckpt_nb.json"
    stamp.write_text(json.dumps({"format": found}))
    mgr = CheckpointManager(tmp_path)
    for cid in ids[:5]:
        mgr.delete(cid)  # (a chain of five deleted deltas: nothing stored whole yet)
    assert json.loads(stamp.read_text())["format"] == found
    for cid in ids[5:-1]:
        mgr.delete(cid)
    assert mgr.gc().chunks_rewritten == 0  # (the deletes rewrote the chain's end)
    assert json.loads(stamp.read_text())["format"] == after
    assert same(list(mgr.load(ids[-1]).state["model"].values()), [model.weight.detach()])
