"""A local store removed and made again at its path (a notebook that reruns its
``shutil.rmtree(STORE)`` cell and trains again; another process) under a manager that
had it open: its reads listed the removed store's checkpoints, from the catalog file it
still had open, and the explorer's Roll back said "no checkpoint ..."."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from conftest import Holder

import ckpt_nb
from ckpt_nb import CheckpointManager, StoreError, StoreFormatError
import warm_python  # (fresh interpreters forked from a warm one)


def run_python(code: str) -> list[str]:
    """What another Python process prints, a word a line, once it has run ``code``."""
    done = warm_python.run([sys.executable, "-c", textwrap.dedent(code)], timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_store_made_again_by_another_process_is_the_one_a_reader_lists(
        tmp_path: Path) -> None:
    """An open reader (the explorer's manager, opened with no metric) lists, resolves and
    loads the store another process made again at the path, ranking by the metric it
    records; the explorer shows its rows."""
    store = tmp_path / "store"
    with CheckpointManager(store, metric="loss") as first_run:
        for n in range(3):
            first_run.save(h=Holder({"w": torch.full((1000,), float(n))}),
                           metrics={"loss": 1.0 / (n + 1)})
    reader = CheckpointManager(store)
    ui = ckpt_nb.explore(reader, namespace={}, poll_seconds=0)
    assert len(reader.list()) == len(ui.table_frame) == 3
    made = run_python(f"""
        import shutil, torch
        from ckpt_nb import CheckpointManager
        shutil.rmtree({str(store)!r})
        with CheckpointManager({str(store)!r}, metric="acc", mode="max") as run:
            model = torch.nn.Linear(4, 4)
            for n in (10, 11):
                with torch.no_grad():
                    model.weight.fill_(n)
                print(run.save(model, metrics={{"acc": n}}))
        """)
    listed = reader.list()
    assert listed["id"].tolist() == made
    assert listed["best"].tolist() == [False, True]  # (acc, max: the new store's record)
    assert reader.resolve("latest") == made[-1]
    assert bool((reader.load(made[0]).state["model"]["weight"] == 10).all())
    assert ui.refresh() and ui.table_frame["id"].tolist() == made
    ui.close()
    reader.close()


def test_a_manager_whose_store_was_made_again_saves_a_new_root_in_it(tmp_path: Path) -> None:
    """A manager whose store was removed and made again lists the new one, and its next
    save names no parent from the removed store: a new root, saved whole, though its
    bytes are those of the removed head (a stale catalog, or the last save's memory of
    its chunks, would have it refer to chunks the new store does not hold)."""
    store = tmp_path / "store"
    size = 300_000  # (above the size that deltas are tried for)
    mine = CheckpointManager(store, strategy="incremental")
    for n in range(3):
        mine.save(h=Holder({"w": torch.full((size,), float(n))}))
    shutil.rmtree(store)
    other = CheckpointManager(store)
    theirs = other.save(h=Holder({"w": torch.full((size,), 100.0)}))
    listed = mine.list()
    assert listed["id"].tolist() == [theirs] and not listed["head"].any()
    saved = mine.save(h=Holder({"w": torch.full((size,), 2.0)}))
    row = other.list().set_index("id").loc[saved]
    assert (row["parent"], row["branch"], row["strategy"]) == (None, "branch-1", "full")
    assert mine.verify().ok
    with CheckpointManager(store) as fresh:
        assert bool((fresh.load(saved).state["h"]["w"] == 2.0).all())
    mine.close()
    other.close()


def test_a_catalog_being_deleted_is_not_made_again_by_a_read(tmp_path: Path) -> None:
    """A read while ``shutil.rmtree`` deletes the store (its catalog gone, its folder not
    yet) writes no catalog into the folder (rmtree's last step then failed "Directory not
    empty"): it lists from the catalog it has open until the folder is gone."""
    store = tmp_path / "store"
    mgr = CheckpointManager(store)
    saved = mgr.save(h=Holder({"w": torch.zeros(1000)}))
    for path in store.glob("catalog.sqlite*"):
        path.unlink()
    assert mgr.list()["id"].tolist() == [saved]
    assert not list(store.glob("catalog.sqlite*"))
    shutil.rmtree(store)
    with pytest.raises(StoreError, match="is gone"):
        mgr.list()
    mgr.close()


def test_a_backup_renamed_over_the_catalog_of_an_open_reader_is_read_again(
        tmp_path: Path) -> None:
    """A catalog file put back under a reader (rsync of a backup folder deletes the
    journal files and renames the backup over the catalog) is opened again at a lock
    take, as at an open, which reads the store again where the lock file says the backup
    is behind: opened without one, the reader listed the backup's 3 checkpoints of 5,
    where it had listed all 5 from the file it had open."""
    store, backup = tmp_path / "store", tmp_path / "backup.sqlite"
    model = torch.nn.Linear(8, 8)
    with CheckpointManager(store) as first:
        ids = [first.save(model, epoch=epoch) for epoch in range(3)]
    shutil.copy(store / "catalog.sqlite", backup)
    reader = CheckpointManager(store)
    opened = reader.catalog
    with CheckpointManager(store) as second:
        ids += [second.save(model, epoch=epoch) for epoch in (3, 4)]
    for journal in store.glob("catalog.sqlite-*"):
        journal.unlink()
    shutil.copy(backup, store / "catalog.sqlite.tmp")
    os.replace(store / "catalog.sqlite.tmp", store / "catalog.sqlite")
    assert reader.list()["id"].tolist() == ids
    assert reader.catalog is not opened  # (the file put back: its own listed all 5 too)
    assert reader.resolve("latest") == ids[-1]
    reader.close()


def test_a_store_made_again_by_a_newer_ckpt_nb_is_refused(tmp_path: Path) -> None:
    """A store made again in a newer format is refused as an open refuses it, not read
    (nor written) in this ckpt_nb's."""
    store = tmp_path / "store"
    mgr = CheckpointManager(store)
    mgr.save(h=Holder({"w": torch.zeros(1000)}))
    shutil.rmtree(store)
    with CheckpointManager(store) as other:
        other.save(h=Holder({"w": torch.ones(1000)}))
    (store / "ckpt_nb.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(StoreFormatError, match="format 99"):
        mgr.list()
    mgr.close()


def test_a_closed_manager_does_not_open_a_store_made_again(tmp_path: Path) -> None:
    store = tmp_path / "store"
    mgr = CheckpointManager(store)
    mgr.save(h=Holder({"w": torch.zeros(1000)}))
    mgr.close()
    shutil.rmtree(store)
    with CheckpointManager(store) as other:
        other.save(h=Holder({"w": torch.ones(1000)}))
    with pytest.raises(StoreError, match="closed"):
        mgr.list()


def test_a_list_of_an_unchanged_store_takes_no_lock(tmp_path: Path) -> None:
    """Only a catalog replaced is opened again, at a lock take: a list() of a store
    another process is saving to (its lock held) neither waits nor opens anything."""
    store = tmp_path / "store"
    mgr = CheckpointManager(store)
    mgr.save(h=Holder({"w": torch.zeros(1000)}))
    catalog = mgr.catalog
    holder = warm_python.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        folder = os.open({str(store)!r}, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(folder, fcntl.LOCK_EX)
        with open({str(store / "catalog.sqlite.lock")!r}, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            print("held", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        listed: list[int] = []
        # (in a thread: a lock take waits for the holder, which lets go only after the join;
        # not timed, as a loaded machine may take a second for three lists)
        listing = threading.Thread(target=lambda: listed.extend(len(mgr.list())
                                                                for _ in range(3)))
        listing.start()
        listing.join(60)
        assert not listing.is_alive(), "list() waited for the lock"
        assert listed == [1, 1, 1]
        assert mgr.catalog is catalog
    finally:
        holder.communicate("", timeout=30)
    mgr.close()


def test_a_store_made_again_many_times_under_a_reader_holds_no_more_deleted_catalogs_open(
        tmp_path: Path) -> None:
    """Each catalog a reader opened again stayed open, deleted, till the manager closed:
    an explorer open while a notebook's set-up cell ran 30 times held 90 files (the
    database, its WAL and shared memory) and their room on disk. The last one replaced
    stays open (another thread may be reading it); those before it are closed."""
    store = tmp_path / "store"
    reader = None
    for run in range(6):
        shutil.rmtree(store, ignore_errors=True)
        with CheckpointManager(store) as writer:
            saved = writer.save(Holder({"run": torch.tensor(run)}))
        if reader is None:
            reader = CheckpointManager(store)
        assert reader.list()["id"].tolist() == [saved]
    held = [os.readlink(fd) for fd in Path("/proc/self/fd").iterdir()
            if fd.is_symlink() and str(store) in os.readlink(fd)]
    deleted = [name for name in held if name.endswith(" (deleted)")]
    assert 0 < len(deleted) <= 3, held  # (one catalog replaced: its files, no more)
    reader.close()
    assert not [fd for fd in Path("/proc/self/fd").iterdir()
                if fd.is_symlink() and str(store) in os.readlink(fd)]
