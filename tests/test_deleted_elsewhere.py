"""A manager whose head another manager (with a catalog of its own) deleted saves under
that checkpoint's nearest kept ancestor, as it does where the delete was its own."""

from __future__ import annotations

import uuid

import torch
from conftest import Holder

from ckpt_nb import CheckpointManager


def test_a_head_deleted_by_a_manager_with_its_own_catalog_hands_on_to_its_ancestor() -> None:
    """Another manager of a memory:// store (each has its catalog) deleted this one's
    head: the catalog read again had no record of the delete, so the next save was a
    new root, on a new branch, saved whole, where it belonged under the head's parent."""
    url = f"memory://ckpt-nb-heir-{uuid.uuid4().hex}/exp"
    mine = CheckpointManager(url, strategy="incremental")
    ids = [mine.save(h=Holder({"w": torch.full((1000,), float(n))})) for n in range(3)]
    other = CheckpointManager(url)
    other.delete(ids[2])
    assert mine.list()["head"].tolist() == [False, True]  # (where the next save goes)
    saved = mine.save(h=Holder({"w": torch.full((1000,), 3.0)}))
    row = mine.list().set_index("id").loc[saved]
    assert (row["parent"], row["branch"], row["strategy"]) == (ids[1], "main", "incremental")
