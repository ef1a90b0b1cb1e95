"""A hostile catalog: SQL its author wrote into catalog.sqlite (a trigger, a view, a table
made otherwise) is refused as the store opens, before any of it runs; and special files
(FIFOs, folders) in place of the catalog, its journal or the lock file are named as such,
at once, never waited on. Real stores, real SQLite, real FIFOs."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import warm_python  # (fresh interpreters forked from a warm one)
from conftest import Holder
from test_hostile import two_saves

from ckpt_nb import CheckpointManager, DamagedCatalog, StoreError

# A subprocess's command prefix under which root, too, cannot write a folder of mode 555
# (as test_cli's); none where this is not root.
AS_A_USER = ["setpriv", "--inh-caps=-all",
             "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"] \
    if os.geteuid() == 0 else []

# What a store's author may write into (or delete from) its catalog, and how the refusal
# names it.
PLANTED = {
    # (fired by ckpt_nb's own INSERT at the next save: gc then deleted every earlier pack)
    "trigger": (["CREATE TRIGGER t AFTER INSERT ON checkpoints BEGIN "
                 "DELETE FROM refs WHERE checkpoint != NEW.id; END"], "with a trigger 't'"),
    # (an endless recursive query in its place hung the open: this one hides every row)
    "view": (["ALTER TABLE checkpoints RENAME TO kept",
              "CREATE VIEW checkpoints AS SELECT * FROM kept WHERE 0"],
             "with a view 'checkpoints'"),
    "table": (["CREATE TABLE notes (text TEXT)"], "with a table 'notes'"),
    "index": (["CREATE INDEX refs_by_both ON refs(digest, checkpoint)"],
              "with an index 'refs_by_both'"),
    "table made otherwise": (["ALTER TABLE branches ADD COLUMN color TEXT DEFAULT 'red'"],
                             "with the table 'branches', made otherwise"),
    "index made otherwise": (["DROP INDEX chunks_pack",
                              "CREATE INDEX chunks_pack ON chunks(pack, offset)"],
                             "with the index 'chunks_pack', made otherwise"),
    # (named at open, not met later as SQLite's "no such table")
    "table missing": (["DROP TABLE branches"], "without the table 'branches'"),
}


def plant(store: Path, statements: list[str]) -> None:
    with sqlite3.connect(store / "catalog.sqlite", isolation_level=None) as db:
        for statement in statements:
            db.execute(statement)
    db.close()


def schema(catalog: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(catalog)
    try:
        return db.execute("SELECT type, name FROM sqlite_master ORDER BY name").fetchall()
    finally:
        db.close()


@pytest.mark.parametrize("planted", PLANTED)
def test_sql_a_store_s_author_wrote_into_its_catalog_is_refused_before_it_runs(
        tmp_path: Path, planted: str) -> None:
    """With the trigger, the user's next save deleted the refs of every earlier checkpoint,
    and their own gc() then deleted all their packs; the catalog was never looked at."""
    store = tmp_path / "store"
    ids = list(two_saves(store))
    statements, named = PLANTED[planted]
    plant(store, statements)
    planted_schema = schema(store / "catalog.sqlite")
    with pytest.raises(DamagedCatalog, match=f"is damaged: its schema, {named}.* "
                                             "move it aside .* rebuilds the catalog"):
        CheckpointManager(store)
    assert schema(store / "catalog.sqlite") == planted_schema  # (nothing written)
    # The way out the error gives: moved aside, the catalog is rebuilt from the store.
    (store / "catalog.sqlite").rename(store / "catalog.sqlite.hostile")
    with pytest.warns(RuntimeWarning, match="2 checkpoints recovered"):
        mgr = CheckpointManager(store)
    with mgr:
        ids.append(mgr.save(h=Holder({"w": torch.ones(4)}), step=9))
        mgr.gc()
        assert mgr.list()["id"].tolist() == ids and mgr.verify().ok
        assert all(mgr.load(cid) for cid in ids)
    assert not {kind for kind, _ in schema(store / "catalog.sqlite")} - {"table", "index"}


def test_a_hostile_catalog_in_a_folder_this_process_cannot_write_is_refused_too(
        tmp_path: Path) -> None:
    """A store opened to read (another user's, a read-only mount) showed no checkpoint
    through the view in place of the checkpoints table."""
    store = tmp_path / "store"
    two_saves(store)
    plant(store, PLANTED["view"][0])
    store.chmod(0o555)
    try:
        done = subprocess.run([*AS_A_USER, sys.executable, "-m", "ckpt_nb", "ls", str(store)],
                              capture_output=True, text=True)
    finally:
        store.chmod(0o755)
    assert done.returncode == 1 and done.stdout == ""
    assert "is damaged: its schema, with a view 'checkpoints' that ckpt_nb does not " \
        "make" in done.stderr, done.stderr


def test_a_hostile_catalog_cache_is_moved_aside_and_made_again_without_it(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An object store's catalog cache is rebuilt from the store, not copied: nothing of
    what was planted in it comes along."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = f"s3://{bucket}/exp"
    with CheckpointManager(url) as mgr:
        ids = [mgr.save(h=Holder({"w": torch.full((4,), float(step))}), step=step)
               for step in range(2)]
    [cache] = (tmp_path / "cache" / "ckpt_nb").glob("*/catalog.sqlite")
    plant(cache.parent, PLANTED["trigger"][0])
    with pytest.warns(RuntimeWarning, match="was damaged, and was moved aside .* 2 "
                                            "checkpoints recovered"):
        mgr = CheckpointManager(url)
    with mgr:
        ids.append(mgr.save(h=Holder({"w": torch.full((4,), 2.0)}), step=2))
        mgr.gc()
        assert mgr.list()["id"].tolist() == ids and mgr.verify().ok
    assert ("trigger", "t") not in schema(cache)
    [aside] = cache.parent.glob("catalog.sqlite.damaged-*[0-9]")
    assert ("trigger", "t") in schema(aside)


def test_a_catalog_of_an_older_ckpt_nb_analyzed_by_sqlite_opens(tmp_path: Path) -> None:
    """What ckpt_nb's own catalogs hold, any version's, and SQLite's statistics (ANALYZE,
    PRAGMA optimize: a user's sqlite3 shell) are no foreign objects."""
    ids = list(two_saves(tmp_path))
    plant(tmp_path, ["DROP INDEX chunks_base", "ANALYZE"])  # (made since the first version)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with CheckpointManager(tmp_path) as mgr:
            assert mgr.list()["id"].tolist() == ids and mgr.verify().ok
            assert mgr.catalog._db.execute("PRAGMA trusted_schema").fetchone()[0] == 0
    assert {("index", "chunks_base"), ("table", "sqlite_stat1")} <= set(
        schema(tmp_path / "catalog.sqlite"))


def test_a_fifo_in_place_of_the_lock_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Opened to read or write, a FIFO waits for a process at its other end: opening the
    store, and every command (`ckpt-nb ls` too), hung forever. Reads need no lock file."""
    ids = list(two_saves(tmp_path))
    lock = tmp_path / "catalog.sqlite.lock"
    lock.unlink()
    os.mkfifo(lock)

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return warm_python.run([sys.executable, "-m", "ckpt_nb", *args, str(tmp_path)],
                               timeout=120)  # (a guard: before, it never ended)

    listed = command("ls")
    assert listed.returncode == 0 and all(cid in listed.stdout for cid in ids), listed
    collected = command("gc")
    assert collected.returncode == 1 and collected.stdout == ""
    assert collected.stderr == f"ckpt-nb: the lock file {lock} of {tmp_path} is not a " \
        "regular file (a FIFO or a folder?): move it away (ckpt_nb makes it again), then " \
        "try again; nothing was changed\n"
    # One that a process reads opens without waiting: refused all the same.
    reader = os.open(lock, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(StoreError, match="is not a regular file"):
            CheckpointManager(tmp_path).gc()
    finally:
        os.close(reader)
    lock.unlink()  # (the way out it gives)
    with CheckpointManager(tmp_path) as mgr:
        assert mgr.list()["id"].tolist() == ids and mgr.gc().packs_deleted == 0


def test_a_folder_in_place_of_the_lock_file_is_said_to_be_no_file(tmp_path: Path) -> None:
    """gc said to make it writable (chmod or chown it): a folder is no lock file."""
    two_saves(tmp_path)
    lock = tmp_path / "catalog.sqlite.lock"
    lock.unlink()
    lock.mkdir()
    with pytest.raises(StoreError, match="is not a regular file .* move it away") as refused:
        CheckpointManager(tmp_path).gc()
    assert "chmod" not in str(refused.value)


@pytest.mark.parametrize("name", ["catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite-shm",
                                  "catalog.sqlite as a folder"])
def test_a_catalog_or_journal_that_is_no_regular_file_is_named(tmp_path: Path,
                                                                name: str) -> None:
    """SQLite's "disk I/O error" was said to mean a full disk ("unable to open database
    file", for a folder, nothing)."""
    ids = list(two_saves(tmp_path))
    path = tmp_path / name.split()[0]
    if name.endswith("folder"):
        path.unlink()
        path.mkdir()
    else:
        path.unlink(missing_ok=True)  # (a closed catalog leaves no journal)
        os.mkfifo(path)
    with pytest.raises(StoreError, match=f"cannot open the catalog .*: .* \\({path.name} is "
                                         r"not a regular file \(a FIFO or a folder\?\): once "
                                         "no other process has the store open, move it "
                                         "aside and open the store again\\)$"):
        CheckpointManager(tmp_path)
    # The way out it gives (a FIFO at the -wal is gone already: SQLite deleted it as it
    # closed the catalog).
    if path.is_dir():
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "the catalog .* was missing, so it was rebuilt")
        with CheckpointManager(tmp_path) as mgr:
            assert mgr.list()["id"].tolist() == ids and mgr.verify().ok
