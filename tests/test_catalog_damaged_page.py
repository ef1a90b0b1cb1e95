"""A local store whose catalog.sqlite has a damaged page (a bad disk): said to be damaged,
with what to do, never taken for a store that did not answer."""

from __future__ import annotations

import os
import sqlite3
import warnings
from pathlib import Path

import pytest
import torch
from conftest import Holder

from ckpt_nb import CheckpointManager, StoreError
from ckpt_nb._catalog import DamagedCatalog
from ckpt_nb.cli import main as cli
import warm_python  # (fresh interpreters forked from a warm one)


def garble_a_chunks_page(catalog: Path, table: str = "chunks") -> None:
    """Overwrite one page of a table of the catalog (the chunks'; its schema left whole)."""
    db = sqlite3.connect(catalog)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = db.execute("SELECT max(pageno) FROM dbstat WHERE name = ?", (table,)).fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with open(catalog, "r+b") as file:
        file.seek((page - 1) * size + 8)
        file.write(os.urandom(size - 8))


def test_a_damaged_catalog_page_is_said_damaged_not_an_outage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SQLite's "database disk image is malformed" was worded by verify() as a store that
    could not be read ("nothing is known to be damaged: run it again when the store
    answers"), and by restore() as a catalog that "failed", saying nothing to do."""
    root = tmp_path / "exp"
    with CheckpointManager(root) as mgr:
        ids = [mgr.save(h=Holder({f"w{i}": torch.randn(5000) for i in range(200)}), step=step)
               for step in range(3)]
    garble_a_chunks_page(root / "catalog.sqlite")
    damaged = "catalog .*catalog.sqlite is damaged: .*malformed.*move it aside"
    with CheckpointManager(root) as mgr:
        with pytest.raises(DamagedCatalog, match=damaged):
            mgr.verify()
        with pytest.raises(DamagedCatalog, match=damaged):
            mgr.restore("latest", h=Holder({}))
    for command in (["verify", str(root)], ["show", str(root), "latest"]):
        assert cli(command) == 1
        err = capsys.readouterr().err
        assert "is damaged" in err and "could not be read" not in err, err
    (root / "catalog.sqlite").rename(tmp_path / "catalog.sqlite.damaged")  # (as it says)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (rebuilt)
        mgr = CheckpointManager(root)
    with mgr:
        assert mgr.verify().ok and mgr.list()["id"].tolist() == ids


def test_a_damaged_page_found_as_the_store_opens_is_a_damaged_catalog_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found as the store opened (its meta table, read first), the damage was a plain
    StoreError ("is unreadable"), found later a DamagedCatalog: code catching the one
    missed the other."""
    root = tmp_path / "exp"
    with CheckpointManager(root) as mgr:
        saved = mgr.save(h=Holder({"w": torch.randn(1000)}), step=1)
    garble_a_chunks_page(root / "catalog.sqlite", "meta")
    with pytest.raises(DamagedCatalog, match=f"the catalog {root / 'catalog.sqlite'} is "
                                             r"damaged: its SQLite file \(.*\).*move it "
                                             r"aside \(rename it, and its -wal and -shm"):
        CheckpointManager(root)
    assert cli(["ls", str(root)]) == 1
    err = capsys.readouterr().err
    assert "is damaged" in err and "move it aside" in err, err
    assert (root / "catalog.sqlite").is_file()  # (a local store's: left where it is)
    (root / "catalog.sqlite").rename(tmp_path / "catalog.sqlite.damaged")  # (as it says)
    with pytest.warns(RuntimeWarning, match="rebuilt"):
        mgr = CheckpointManager(root)
    with mgr:
        assert mgr.list()["id"].tolist() == [saved]


def test_a_catalog_moved_aside_while_another_process_has_it_open_names_its_journal(
        tmp_path: Path) -> None:
    """Moved aside as the damage message says, while another kernel had it open: its
    -wal and -shm stayed, and the store's next opening said only "disk I/O error (is its
    disk full?)"."""
    import subprocess
    import sys

    root = tmp_path / "exp"
    holder = warm_python.Popen(
        [sys.executable, "-c",
         "import sys, torch, ckpt_nb\n"
         "m = ckpt_nb.CheckpointManager(sys.argv[1])\n"
         "for i in range(4): m.save(torch.nn.Linear(64, 64), epoch=i)\n"
         "print('saved', flush=True); sys.stdin.readline()\n", str(root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "saved\n"
        assert (root / "catalog.sqlite-wal").stat().st_size > 0
        (root / "catalog.sqlite").rename(tmp_path / "catalog.sqlite.damaged")
        with pytest.raises(StoreError, match=r"disk I/O error \(its disk has \d+ MiB free: "
                                             r".*; or was "
                                             r"it moved aside or deleted while another process "
                                             r"had it open, leaving catalog\.sqlite-wal and "
                                             r"catalog\.sqlite-shm\? Once no other process has "
                                             r"the store open, move those aside too\)"):
            CheckpointManager(root)
    finally:
        holder.communicate("\n", timeout=60)


def test_a_damaged_catalog_error_survives_pickling_whole() -> None:
    """Made again from its message alone (as an exception crossing processes is, or
    copied), it said its message twice."""
    import copy
    import pickle

    error = DamagedCatalog("its SQLite file (database disk image is malformed)",
                           "/c/catalog.sqlite")
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert type(again) is DamagedCatalog and str(again) == str(error)
        assert (again.what, again.path) == (error.what, error.path)
    for other in (DamagedCatalog("its format, 'x',"),
                  DamagedCatalog("its SQLite file", "/c/catalog.sqlite", advice="close it")):
        again = pickle.loads(pickle.dumps(other))
        assert str(again) == str(other) and again.advice == other.advice


def test_a_seed_that_sqlite_refuses_is_no_damage_and_moves_no_cache(tmp_path: Path) -> None:
    """Any sqlite3.DatabaseError as a catalog opened was called damage, its subclasses
    too (an IntegrityError as a new catalog was seeded): an object store's cache was
    moved aside for it, as damaged, and the error said to move it aside again."""
    from ckpt_nb._catalog import CheckpointRow, Seed, open_cache

    row = CheckpointRow(id="0123456789", parent=None, branch="main", created_at=1.0,
                        step=None, epoch=None, batch_idx=None, metrics={}, strategy="full",
                        full_base=None, chain=0, logical_bytes=0, stored_bytes=0,
                        pinned=False, note="")
    cache = tmp_path / "catalog.sqlite"
    cache.write_bytes(b"")  # (SQLite's new database: one that a killed open left)
    with pytest.raises(StoreError, match=r"catalog.sqlite failed: UNIQUE constraint") as said:
        open_cache(cache, lambda: Seed(checkpoints=[row, row]), lambda catalog: None)
    assert not isinstance(said.value, DamagedCatalog)
    assert cache.is_file() and not list(tmp_path.glob("*.damaged-*"))
