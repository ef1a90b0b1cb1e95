"""A manifest that is no regular file (a FIFO, a symbolic link) in a store copied, or
whose catalog was lost: its checkpoint is named as damaged and gc keeps what it needs,
or the store is refused by name; it never vanishes while gc deletes its pack."""

from __future__ import annotations

import os
import shutil
import sqlite3
import warnings
from pathlib import Path

import pytest
from conftest import DigitsRun

from ckpt_nb import CheckpointManager, StoreError


def three_saves(store: Path) -> list[str]:
    """A store with three checkpoints of a classifier trained on digits, an epoch apart."""
    run = DigitsRun()
    ids = []
    with CheckpointManager(store, strategy="incremental") as mgr:
        for epoch in range(3):
            for _ in range(5):
                run.train_step()
            ids.append(mgr.save(run.model, run.optimizer, epoch=epoch))
    return ids


def copied(tmp_path: Path) -> tuple[Path, list[str]]:
    """A store saved in one folder and copied to another (``shutil.copytree``, as ``cp -r``
    or a download makes one), which a catalog opening it reads again."""
    ids = three_saves(tmp_path / "made")
    shutil.copytree(tmp_path / "made", tmp_path / "copy")
    return tmp_path / "copy", ids


def files(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_a_fifo_manifest_of_a_copied_store_is_listed_named_and_kept_by_gc(
        tmp_path: Path) -> None:
    store, ids = copied(tmp_path)
    manifest = store / "manifests" / f"{ids[-1]}.json.zst"
    manifest.unlink()
    os.mkfifo(manifest)
    packs = files(store / "packs")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (nothing is left out: it is listed, as it was)
        mgr = CheckpointManager(store)
        assert mgr.list()["id"].tolist() == ids
    assert mgr.verify().bad == {ids[-1]: [f"{manifest} is not a regular file: move it out "
                                          "of the store"]}
    assert mgr.gc().packs_deleted == 0
    assert files(store / "packs") == packs and manifest.exists()


def test_a_rebuild_names_a_fifo_manifest_and_gc_keeps_every_pack(tmp_path: Path) -> None:
    store, ids = copied(tmp_path)
    manifest = store / "manifests" / f"{ids[-1]}.json.zst"
    manifest.unlink()
    os.mkfifo(manifest)
    for path in store.glob("catalog.sqlite*"):
        path.unlink()
    packs = files(store / "packs")
    with pytest.warns(RuntimeWarning, match=f"2 checkpoints recovered; left out: checkpoint "
                                            f"{ids[-1]} .*{manifest} is not a regular file"):
        mgr = CheckpointManager(store)
    assert mgr.list()["id"].tolist() == ids[:2]
    assert list(mgr.verify().bad) == [ids[-1]]
    report = mgr.gc()
    assert (report.packs_deleted, report.damaged_kept) == (0, 1)
    assert files(store / "packs") == packs and manifest.exists()


def test_a_rebuild_names_a_fifo_pack_as_no_regular_file(tmp_path: Path) -> None:
    """(It was said to have been cut short, which sent the user looking for a full disk.)"""
    store, ids = copied(tmp_path)
    pack = max((store / "packs").iterdir(), key=lambda path: path.stat().st_mtime_ns)
    pack.unlink()
    os.mkfifo(pack)
    for path in store.glob("catalog.sqlite*"):
        path.unlink()
    with pytest.warns(RuntimeWarning, match=f"left out: .*{pack} is not a regular file") \
            as caught:
        mgr = CheckpointManager(store)
    assert "cut short" not in str(caught[0].message)
    assert ids[-1] not in mgr.list()["id"].tolist() and pack.exists()


@pytest.mark.parametrize("catalog", ["copied", "deleted"])
def test_a_store_with_a_linked_manifest_is_refused_by_name_and_left_as_it_was(
        tmp_path: Path, catalog: str) -> None:
    """The link's target holds the manifest: read, it would be followed; left unread, its
    checkpoint vanished, and gc deleted its pack."""
    store, ids = copied(tmp_path)
    manifest = store / "manifests" / f"{ids[-1]}.json.zst"
    target = tmp_path / "elsewhere.json.zst"
    manifest.rename(target)
    os.symlink(target, manifest)
    if catalog == "deleted":
        for path in store.glob("catalog.sqlite*"):
            path.unlink()
    before = {path: path.read_bytes() for path in store.rglob("*") if path.is_file()}
    with pytest.raises(StoreError, match=f"symbolic links in place of its files "
                                         f"\\({manifest} -> {target}\\)"):
        CheckpointManager(store)
    assert {path: path.read_bytes() for path in store.rglob("*") if path.is_file()} == before


def test_a_store_whose_files_all_link_into_a_cache_is_refused_not_opened_empty(
        tmp_path: Path) -> None:
    """A DVC or git-annex checkout links each file into a cache: opened as holding no
    checkpoints, its catalog was rewritten empty and ``%%ckpt_auto`` trained from scratch."""
    store, ids = copied(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    for folder in ("manifests", "packs"):
        for path in (store / folder).iterdir():
            path.rename(cache / path.name)
            os.symlink(cache / path.name, path)
    with pytest.raises(StoreError, match="symbolic links in place of its files .* and 5 more"
                                         ".*put the files themselves there"):
        CheckpointManager(store)
    with pytest.raises(StoreError, match="symbolic links"):
        CheckpointManager(store, catalog=tmp_path / "elsewhere.sqlite")
    rows = sqlite3.connect(store / "catalog.sqlite").execute(
        "SELECT id FROM checkpoints ORDER BY created_at").fetchall()
    assert [cid for (cid,) in rows] == ids and len(os.listdir(cache)) == 6
