"""Damaged and hand-made stores: reads refuse them by name, and gc never destroys the
only good copy of anything. (Opening such a store never runs its code either: see
test_manager's pickle tests.)"""

from __future__ import annotations

import json
import os
import sqlite3
import warnings
from pathlib import Path

import pytest
import torch
import zstandard

from ckpt_nb import CheckpointManager, CorruptCheckpointError, StoreFormatError


def two_saves(store: Path) -> tuple[str, str]:
    """A store with two checkpoints of a small model, the second changed."""
    model = torch.nn.Linear(64, 64)
    with CheckpointManager(store) as mgr:
        good = mgr.save(model, epoch=0)
        with torch.no_grad():
            model.weight += 1
            model.bias += 1
        bad = mgr.save(model, epoch=1)
    return good, bad


def catalog(store: Path) -> sqlite3.Connection:
    return sqlite3.connect(store / "catalog.sqlite", isolation_level=None)


@pytest.mark.parametrize("loop", ["onto itself", "through another"])
def test_delta_bases_that_go_round_in_a_loop_are_refused_not_followed(
        tmp_path: Path, loop: str) -> None:
    good, bad = two_saves(tmp_path)
    db = catalog(tmp_path)
    first, second = [d for (d,) in db.execute(
        "SELECT digest FROM chunks WHERE digest IN (SELECT digest FROM refs WHERE "
        "checkpoint=?) AND digest NOT IN (SELECT digest FROM refs WHERE checkpoint=?) "
        "ORDER BY digest LIMIT 2", (bad, good))]
    if loop == "onto itself":
        db.execute("UPDATE chunks SET base=digest, depth=1 WHERE digest=?", (first,))
    else:
        db.execute("UPDATE chunks SET base=?, depth=1 WHERE digest=?", (second, first))
        db.execute("UPDATE chunks SET base=?, depth=1 WHERE digest=?", (first, second))
    db.close()
    mgr = CheckpointManager(tmp_path)
    assert list(mgr.verify().bad) == [bad]
    with pytest.raises(CorruptCheckpointError, match="go round in a loop"):
        mgr.load(bad)
    with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
        assert mgr.restore("latest", model=torch.nn.Linear(64, 64)).id == good


def test_a_chunk_the_catalog_makes_huge_is_refused_before_its_memory_is_asked_for(
        tmp_path: Path) -> None:
    """verify() asked numpy for 1 PiB and died of MemoryError."""
    good, bad = two_saves(tmp_path)
    db = catalog(tmp_path)
    db.execute("UPDATE chunks SET raw_len=? WHERE digest IN (SELECT digest FROM refs WHERE "
               "checkpoint=?) AND digest NOT IN (SELECT digest FROM refs WHERE checkpoint=?)",
               (1 << 50, bad, good))
    db.close()
    mgr = CheckpointManager(tmp_path)
    report = mgr.verify()
    assert list(report.bad) == [bad] and "more than any chunk" in report.bad[bad][0]
    with pytest.raises(CorruptCheckpointError):
        mgr.load(bad)
    with pytest.raises(ValueError, match="chunk_size"):
        CheckpointManager(tmp_path, chunk_size=2 << 30)


def test_a_blob_whose_delta_flag_flipped_is_corrupt_and_latest_falls_back(
        tmp_path: Path) -> None:
    good, bad = two_saves(tmp_path)
    db = catalog(tmp_path)
    pack, offset = db.execute(
        "SELECT pack, offset FROM chunks WHERE base IS NULL AND digest IN (SELECT digest "
        "FROM refs WHERE checkpoint=?) AND digest NOT IN (SELECT digest FROM refs WHERE "
        "checkpoint=?)", (bad, good)).fetchone()
    db.close()
    with open(tmp_path / pack, "r+b") as f:  # the header: magic (4) | u8 delta | ...
        f.seek(offset + 4)
        f.write(b"\x01")
    mgr = CheckpointManager(tmp_path)
    assert "a delta where its record has no base" in " ".join(mgr.verify().bad[bad])
    with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
        assert mgr.restore("latest", model=torch.nn.Linear(64, 64)).id == good


def rewrite_manifest(store: Path, cid: str, change) -> None:  # type: ignore[no-untyped-def]
    path = store / "manifests" / f"{cid}.json.zst"
    manifest = json.loads(zstandard.ZstdDecompressor().decompress(path.read_bytes()))
    changed = change(manifest)
    text = changed if isinstance(changed, bytes) else json.dumps(changed).encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(text))


@pytest.mark.parametrize("damage", ["tensors gone", "a size that lies", "not an object",
                                    "nested too deep"])
def test_a_malformed_manifest_is_left_out_or_refused_by_name(tmp_path: Path,
                                                            damage: str) -> None:
    """The catalog is rebuilt from the store, which trusts what the manifests say."""
    good, bad = two_saves(tmp_path)

    def change(manifest: dict) -> object:
        if damage == "tensors gone":
            manifest.pop("tensors")
        elif damage == "a size that lies":
            manifest["storages"][0]["nbytes"] = 10 ** 15
            manifest["storages"][0]["chunks"][0][1] = 10 ** 15
        elif damage == "not an object":
            return [1, 2]
        else:
            return b"[" * 100_000 + b"]" * 100_000
        return manifest

    rewrite_manifest(tmp_path, bad, change)
    os.remove(tmp_path / "catalog.sqlite")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mgr = CheckpointManager(tmp_path)
    listed = mgr.list()["id"].tolist()
    assert good in listed
    if bad in listed:  # (its frame held: its chunks do not)
        with pytest.raises(CorruptCheckpointError, match=bad):
            mgr.load(bad)
        with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
            assert mgr.restore("latest", model=torch.nn.Linear(64, 64)).id == good
    else:
        assert any(bad in str(w.message) for w in caught)
    assert mgr.load(good).epoch == 0


def test_gc_keeps_a_pack_whose_blobs_do_not_fit_the_catalog(tmp_path: Path) -> None:
    """A compaction copies by the catalog's offsets: where they lie, the copy would be
    garbage and the intact original deleted."""
    model = torch.nn.Linear(64, 64)
    with CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(model, epoch=0)
    db = catalog(tmp_path)
    db.execute("UPDATE chunks SET offset = offset + 1 WHERE digest = "
               "(SELECT digest FROM chunks ORDER BY offset LIMIT 1)")
    db.close()
    packs = sorted((tmp_path / "packs").iterdir())
    mgr = CheckpointManager(tmp_path)
    with pytest.warns(RuntimeWarning, match="gc left packs/.* as it was"):
        mgr.gc(compact_below=1.1)  # (every pack compacted, were it sound)
    assert sorted((tmp_path / "packs").iterdir()) == packs
    mgr.close()
    os.remove(tmp_path / "catalog.sqlite")  # the catalog rebuilt from the packs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rebuilt = CheckpointManager(tmp_path)
    assert torch.equal(rebuilt.load(cid).state["model"]["weight"], model.weight)


@pytest.mark.parametrize("stamp", ['{"format": 1e400}', '{"format": 3.9}',
                                   '{"format": true}'])
def test_a_format_stamp_that_is_not_a_whole_number_is_unreadable(tmp_path: Path,
                                                                 stamp: str) -> None:
    CheckpointManager(tmp_path).close()
    (tmp_path / "ckpt_nb.json").write_text(stamp)
    with pytest.raises(StoreFormatError, match="unreadable"):
        CheckpointManager(tmp_path)
