"""A store written through two catalogs (a manager's ``catalog=`` elsewhere, and the
store's own), read through the one that did not write last."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager
import warm_python  # (fresh interpreters forked from a warm one)


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
    cli = warm_python.run([sys.executable, "-m", "ckpt_nb", "verify", str(store)])
    assert cli.returncode == 0 and first not in cli.stdout, cli.stdout + cli.stderr


HELD_AND_READ = """
import sys, torch, ckpt_nb
store, other = sys.argv[1], sys.argv[2]
a = ckpt_nb.CheckpointManager(store)
b = ckpt_nb.CheckpointManager(store, catalog=other)
b.save(torch.nn.Linear(8, 8), step=0)
a.list()  # (a catches up: its mark is the store's last)
seen = []
a.save(torch.nn.Linear(8, 8), step=1, progress=lambda done, total: seen.append(len(b.list())))
print("seen", sorted(set(seen)))
"""


def test_a_read_through_another_catalog_inside_a_save_of_this_thread_goes_on(
        tmp_path: Path) -> None:
    """A save's progress callback reading the store through a manager with its own
    catalog (a dashboard beside the save) waited for the lock its own thread held: the
    process hung for ever. It reads from its catalog as it is."""
    done = warm_python.run([sys.executable, "-c", HELD_AND_READ, str(tmp_path / "store"),
         str(tmp_path / "other.sqlite")], timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["seen", "[1]"], done.stdout
