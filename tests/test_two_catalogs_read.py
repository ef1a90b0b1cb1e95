"""A store written through two catalogs (a manager's ``catalog=`` elsewhere, and the
store's own), read through the one that did not write last."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager


def test_the_stores_own_catalog_reads_what_another_catalog_deleted_and_saved(
        tmp_path: Path) -> None:
    """Retention through ``catalog=`` deleted a checkpoint that the store's own catalog
    still listed until a writer used it: ``ckpt-nb verify`` reported it damaged ("its
    manifest is missing"), ``ls`` listed it, and the new save was missing."""
    store = tmp_path / "store"
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    own = CheckpointManager(store, max_to_keep=2)
    first = own.save(model, optimizer, epoch=0)
    second = own.save(model, optimizer, epoch=1)
    with pytest.warns(RuntimeWarning, match="rebuilt from the store"), \
            CheckpointManager(store, catalog=tmp_path / "other.sqlite", max_to_keep=2) as other:
        third = other.save(model, optimizer, epoch=2)  # (its retention deletes the first)

    assert list(own.list()["id"]) == [second, third]
    report = own.verify()
    assert report.ok and not report.bad, report
    own.close()
    cli = subprocess.run([sys.executable, "-m", "ckpt_nb", "verify", str(store)],
                         capture_output=True, text=True)
    assert cli.returncode == 0 and first not in cli.stdout, cli.stdout + cli.stderr
