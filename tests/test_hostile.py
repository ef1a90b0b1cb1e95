"""Damaged and hand-made stores: reads refuse them by name, and gc never destroys the
only good copy of anything. (Opening such a store never runs its code either: see
test_manager's pickle tests.)"""

from __future__ import annotations

import json
import os
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import pytest
import torch
import zstandard
from conftest import Holder

from ckpt_nb import CheckpointManager, CorruptCheckpointError, StoreError, StoreFormatError
from ckpt_nb._format import decode_manifest


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


def damaged(damage: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A change for ``rewrite_manifest`` that damages a manifest as ``damage`` says: the
    cases every reader of a manifest must refuse by the checkpoint's name."""
    def change(manifest: dict[str, Any]) -> dict[str, Any]:
        if damage == "offset 1.5":
            manifest["tensors"][0]["offset"] = 1.5
        elif damage == "storage 99":
            manifest["tensors"][0]["storage"] = 99
        elif damage == "offset past the end":
            manifest["tensors"][0]["offset"] = 10 ** 9
        elif damage == "a trillion elements":
            manifest["tensors"][0]["shape"] = [10 ** 6, 10 ** 6]
        elif damage == "stride -1":
            manifest["tensors"][0]["stride"] = [-1, 1]
        elif damage == "sizes past 64 bits":  # (torch refuses their product, 0 or not)
            manifest["tensors"][0].update(shape=[1 << 40, 1 << 40, 0], stride=[0, 0, 0])
        elif damage == "types a list":
            manifest["state"]["types"] = [1]
        elif damage == "a pickle past the end":
            manifest["state"]["extra"]["obj"] = {"__pickle__": 99}
        elif damage == "a pickle of a tensor's bytes":
            manifest["state"]["extra"]["obj"] = {"__pickle__": 0}
        elif damage == "extra 900 deep":
            deep: dict[str, Any] = {}
            for _ in range(900):
                deep = {"d": deep}
            manifest["state"]["extra"] = deep
        else:
            raise ValueError(f"no such damage: {damage!r}")
        return manifest
    return change


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


@pytest.mark.parametrize("part", ["packs", "manifests", "runs", "catalog.sqlite"])
def test_a_store_whose_own_parts_are_links_is_refused_and_nothing_outside_is_touched(
        tmp_path: Path, part: str) -> None:
    """A link inside a downloaded store would have gc delete, and saves write, outside it."""
    store, outside = tmp_path / "store", tmp_path / "outside"
    two_saves(store)
    outside.mkdir()
    (outside / "thesis.tex").write_text("years of work")
    target = store / part
    if part == "runs":  # (made by a notebook's first finished run)
        os.symlink(outside, target)
    elif target.is_dir():
        for child in target.iterdir():
            child.rename(outside / child.name)
        target.rmdir()
        os.symlink(outside, target)
    else:
        for sidecar in store.glob("catalog.sqlite*"):
            sidecar.unlink()
        other = sqlite3.connect(outside / "app.db")
        other.execute("CREATE TABLE bookmarks (url TEXT)")
        other.close()
        os.symlink(outside / "app.db", target)
    with pytest.raises(StoreError, match=f"symbolic link .*{part}"):
        CheckpointManager(store)
    assert (outside / "thesis.tex").read_text() == "years of work"
    if part == "catalog.sqlite":
        tables = sqlite3.connect(outside / "app.db").execute(
            "SELECT name FROM sqlite_master").fetchall()
        assert tables == [("bookmarks",)]


def test_files_of_names_ckpt_nb_never_makes_are_left_alone(tmp_path: Path) -> None:
    """A desktop's copy, a stray note, a FIFO (tar keeps them): gc deletes none, a
    rebuild reads none, and reading a value that is not a file fails by name, at once."""
    good, bad = two_saves(tmp_path)
    pack = sorted((tmp_path / "packs").iterdir())[0]
    strays = [tmp_path / "packs" / f"{pack.stem} (1).pack", tmp_path / "packs" / "old.pack",
              tmp_path / "manifests" / "notes.txt", tmp_path / "labels" / "mine.json"]
    (tmp_path / "labels").mkdir(exist_ok=True)
    for stray in strays:
        stray.write_bytes(pack.read_bytes()[:100])
    os.remove(tmp_path / "catalog.sqlite")
    with pytest.warns(RuntimeWarning, match="2 checkpoints recovered"):
        mgr = CheckpointManager(tmp_path)
    mgr.gc()
    assert all(stray.exists() for stray in strays)
    manifest = tmp_path / "manifests" / f"{bad}.json.zst"
    manifest.unlink()
    os.mkfifo(manifest)
    mgr = CheckpointManager(tmp_path)
    assert mgr.verify().bad[bad] == [f"{manifest} is not a regular file: move it out of "
                                     "the store"]
    with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
        assert mgr.restore("latest", model=torch.nn.Linear(64, 64)).id == good


@pytest.mark.parametrize("field, value", [("step", 10 ** 30), ("parent", [1]),
                                          ("created_at", float("nan")), ("chain", {"a": 1}),
                                          ("created_at", 1e12), ("created_at", -5.0),
                                          ("chain", None),
                                          ("full_base", ["x"]), ("metrics", {"loss": "low"}),
                                          ("epoch", "seven")])
def test_a_manifest_field_no_save_writes_leaves_out_that_checkpoint_only(
        tmp_path: Path, field: str, value: object) -> None:
    good, bad = two_saves(tmp_path)

    def change(manifest: dict) -> dict:
        manifest[field] = value
        return manifest

    rewrite_manifest(tmp_path, bad, change)
    os.remove(tmp_path / "catalog.sqlite")
    named = "time" if field == "created_at" else field
    with pytest.warns(RuntimeWarning, match=f"left out: checkpoint {bad} .*{named}"):
        mgr = CheckpointManager(tmp_path)
    assert mgr.list()["id"].tolist() == [good]


@pytest.mark.parametrize("label", [{"parent": [1]}, {"pinned": "false"}, {"note": {"a": 1}}])
def test_a_label_no_save_writes_is_left_out_by_name(tmp_path: Path, label: dict) -> None:
    good, bad = two_saves(tmp_path)
    (tmp_path / "labels").mkdir(exist_ok=True)
    (tmp_path / "labels" / f"{bad}.json").write_text(json.dumps(label))
    os.remove(tmp_path / "catalog.sqlite")
    with pytest.warns(RuntimeWarning, match=f"left out: the pin and note of checkpoint {bad}"):
        mgr = CheckpointManager(tmp_path)
    row = mgr.list().set_index("id").loc[bad]
    assert (row["parent"], bool(row["pinned"]), row["note"]) == (good, False, "")


def test_a_frame_that_claims_terabytes_is_no_manifest(tmp_path: Path) -> None:
    good, bad = two_saves(tmp_path)
    path = tmp_path / "manifests" / f"{bad}.json.zst"
    # A frame that announces 2**44 bytes of content (zstd would allocate them): its
    # descriptor given an 8-byte content size, after the window byte.
    body = zstandard.ZstdCompressor(write_content_size=False).compress(b'{"x": 1}')
    path.write_bytes(body[:4] + bytes([body[4] | 0xC0]) + body[5:6]
                     + (1 << 44).to_bytes(8, "little") + body[6:])
    catalog(tmp_path).execute("UPDATE checkpoints SET manifest_digest=''")
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(CorruptCheckpointError, match="more than any manifest"):
        mgr.load(bad)
    assert list(mgr.verify().bad) == [bad]


@pytest.mark.parametrize("size", [0, 10])
def test_a_pack_too_short_to_hold_an_index_is_cut_short(tmp_path: Path, size: int) -> None:
    good, bad = two_saves(tmp_path)
    short = tmp_path / "packs" / f"{'0' * 32}.pack"
    short.write_bytes(b"x" * size)
    os.remove(tmp_path / "catalog.sqlite")
    with pytest.warns(RuntimeWarning, match="cut short"):
        mgr = CheckpointManager(tmp_path)
    assert sorted(mgr.list()["id"]) == sorted([good, bad])
    assert mgr.gc().damaged_kept == 1 and short.exists()  # (damage: left for a person)


def test_a_delta_chain_thousands_deep_is_walked_not_recursed(tmp_path: Path) -> None:
    """A damaged catalog's chain: a RecursionError used to escape every read and gc."""
    good, bad = two_saves(tmp_path)
    db = catalog(tmp_path)
    (first,) = db.execute("SELECT digest FROM refs WHERE checkpoint=? AND digest NOT IN "
                          "(SELECT digest FROM refs WHERE checkpoint=?) LIMIT 1",
                          (bad, good)).fetchone()
    pack, offset, length = db.execute("SELECT pack, offset, length FROM chunks WHERE "
                                      "digest=?", (first,)).fetchone()
    links = [f"{i:064x}" for i in range(1, 5000)]
    db.execute("UPDATE chunks SET base=?, depth=5000 WHERE digest=?", (links[0], first))
    db.executemany("INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?)",
                   [(d, pack, offset, length, 16, b, 4999 - i)
                    for i, (d, b) in enumerate(zip(links, links[1:] + [None]))])
    db.close()
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(CorruptCheckpointError, match=bad):
        mgr.load(bad)
    assert list(mgr.verify().bad) == [bad]
    with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
        assert mgr.restore("latest", model=torch.nn.Linear(64, 64)).id == good


@pytest.mark.parametrize("column, value", [("pack", "../../../etc/passwd"), ("pack", ""),
                                           ("length", -1), ("digest", None),
                                           ("raw_len", "many")])
def test_a_chunk_row_no_save_writes_is_damage_named_by_the_read(
        tmp_path: Path, column: str, value: object) -> None:
    good, bad = two_saves(tmp_path)
    db = catalog(tmp_path)
    db.execute("PRAGMA foreign_keys=OFF")
    setting = "'z' || substr(digest, 2)" if column == "digest" else "?"  # (each its own)
    db.execute(f"UPDATE chunks SET {column}={setting} WHERE digest IN (SELECT digest FROM "
               "refs WHERE checkpoint=? EXCEPT SELECT digest FROM refs WHERE checkpoint=?)",
               (bad, good) if column == "digest" else (value, bad, good))
    db.close()
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(CorruptCheckpointError):
        mgr.load(bad)
    assert list(mgr.verify().bad) == [bad]
    with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
        assert mgr.restore("latest", model=torch.nn.Linear(64, 64)).id == good


@pytest.mark.parametrize("column, value", [("metrics", "{not json"), ("metrics", "[1, 2]"),
                                           ("tags", ""), ("created_at", "yesterday"),
                                           ("created_at", 1e300), ("step", "many")])
def test_a_checkpoint_row_no_save_writes_names_the_catalog_and_the_way_out(
        tmp_path: Path, column: str, value: object) -> None:
    two_saves(tmp_path)
    catalog(tmp_path).execute(f"UPDATE checkpoints SET {column}=?", (value,))
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(StoreError, match=f"catalog {tmp_path / 'catalog.sqlite'} is damaged"
                                         ".* move it aside"):
        mgr.list()
    mgr.close()
    for sidecar in tmp_path.glob("catalog.sqlite*"):
        sidecar.rename(tmp_path / f"aside-{sidecar.name}")
    with pytest.warns(RuntimeWarning, match="2 checkpoints recovered"):
        assert len(CheckpointManager(tmp_path).list()) == 2


@pytest.mark.parametrize("damage", ["offset 1.5", "storage 99", "types a list",
                                    "extra 900 deep"])
def test_every_reader_of_a_damaged_manifest_names_the_checkpoint(tmp_path: Path,
                                                                damage: str) -> None:
    """diff, info and export read manifests too: they raised torch's TypeError,
    IndexError or RecursionError."""
    good, bad = two_saves(tmp_path)
    rewrite_manifest(tmp_path, bad, damaged(damage))
    catalog(tmp_path).execute("UPDATE checkpoints SET manifest_digest=''")
    mgr = CheckpointManager(tmp_path)
    for read in (lambda: mgr.load(bad), lambda: mgr.info(bad), lambda: mgr.diff(good, bad),
                 lambda: mgr.export(bad, tmp_path / "out.pt")):
        try:
            read()
        except CorruptCheckpointError as exc:
            assert bad in str(exc)


def lose_catalog(store: Path) -> None:
    for sidecar in store.glob("catalog.sqlite*"):
        sidecar.unlink()


# Damage to where a tensor lies in its storage: torch refused each at a read with its own
# RuntimeError or IndexError, and verify() passed them.
LAYOUT_DAMAGE = ["offset 1.5", "storage 99", "offset past the end", "a trillion elements",
                 "stride -1", "sizes past 64 bits"]


@pytest.mark.parametrize("damage", LAYOUT_DAMAGE)
def test_a_tensor_outside_its_storage_is_damage_that_verify_and_a_rebuild_name(
        tmp_path: Path, damage: str) -> None:
    """Where the catalog is rebuilt (lost, or an object store opened on a new machine),
    nothing but the manifest says where a tensor lies: verify() said ok and the CLI exited
    0, and restore("latest", trust_pickle=True) raised torch's bare RuntimeError."""
    from ckpt_nb.cli import main

    good, bad = two_saves(tmp_path)
    rewrite_manifest(tmp_path, bad, damaged(damage))
    lose_catalog(tmp_path)
    with pytest.warns(RuntimeWarning, match=f"left out: checkpoint {bad} .*its manifest is "
                                            r"damaged \(tensor 0 \('objects/model/weight'\)"):
        mgr = CheckpointManager(tmp_path)
    assert list(mgr.verify().bad) == [bad]
    for trust in (False, True):
        with pytest.raises(CorruptCheckpointError, match=f"checkpoint {bad} is damaged"):
            mgr.restore(bad, model=torch.nn.Linear(64, 64), trust_pickle=trust)
        assert mgr.restore("latest", model=torch.nn.Linear(64, 64),
                           trust_pickle=trust).id == good
    mgr.close()
    assert main(["verify", str(tmp_path)]) == 1


@pytest.mark.parametrize("damage", LAYOUT_DAMAGE)
def test_a_tensor_outside_its_storage_is_damage_where_no_digest_is_kept(
        tmp_path: Path, damage: str) -> None:
    """The same, where the catalog lists the checkpoint without its manifest's digest:
    "latest" passes over it, with and without trust_pickle."""
    from ckpt_nb.cli import main

    good, bad = two_saves(tmp_path)
    rewrite_manifest(tmp_path, bad, damaged(damage))
    catalog(tmp_path).execute("UPDATE checkpoints SET manifest_digest=''")
    mgr = CheckpointManager(tmp_path)
    assert list(mgr.verify().bad) == [bad]
    for trust in (False, True):
        with pytest.raises(CorruptCheckpointError, match=f"checkpoint {bad}: its manifest is "
                                                         "damaged"):
            mgr.restore(bad, model=torch.nn.Linear(64, 64), trust_pickle=trust)
        with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
            assert mgr.restore("latest", model=torch.nn.Linear(64, 64),
                               trust_pickle=trust).id == good
    mgr.close()
    assert main(["verify", str(tmp_path)]) == 1


@pytest.mark.parametrize("damage", ["types a list", "extra 900 deep", "a pickle past the end",
                                    "a pickle of a tensor's bytes"])
def test_a_damaged_state_is_damage_with_trust_pickle_too(tmp_path: Path, damage: str) -> None:
    """With trust_pickle every error of the read was raised as it was (a bare IndexError,
    TypeError, RecursionError or UnpicklingError), so "latest" did not pass over it: only
    an unpickled object's own error is the caller's (see the test below)."""
    good, bad = two_saves(tmp_path)
    rewrite_manifest(tmp_path, bad, damaged(damage))
    catalog(tmp_path).execute("UPDATE checkpoints SET manifest_digest=''")
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {bad}: its manifest"):
        mgr.load(bad, trust_pickle=True)
    with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
        assert mgr.restore("latest", model=torch.nn.Linear(64, 64),
                           trust_pickle=True).id == good


def _refuse_to_load(why: str) -> None:
    raise ValueError(why)


class RefusesToLoad:
    """A pickled value whose unpickling raises its own error."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _refuse_to_load, ("the object's own reason",)


def test_an_unpickled_object_s_own_error_is_the_caller_s_with_trust_pickle(
        tmp_path: Path) -> None:
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(torch.nn.Linear(2, 2), extra={"obj": 1})
        cid = mgr.save(torch.nn.Linear(2, 2), extra={"obj": RefusesToLoad()})
        with pytest.raises(ValueError, match="the object's own reason") as raised:
            mgr.restore("latest", model=torch.nn.Linear(2, 2), trust_pickle=True)
        assert not isinstance(raised.value, CorruptCheckpointError)
        with pytest.warns(UserWarning, match="pickles and were not loaded"):
            assert mgr.load(cid).extra["obj"].name == "extra/obj"  # (untrusted: left out)


def _with_lr_changed(frame: bytes, lr: float) -> tuple[int, int]:
    """Where a flipped bit leaves ``frame`` a manifest that reads, all as it was but the
    optimizer's lr (zstd holds the JSON's digits as they are: many such bits exist)."""
    def read(data: bytes) -> Any:
        try:
            return json.loads(zstandard.ZstdDecompressor().decompress(data))
        except (zstandard.ZstdError, ValueError):
            return None

    whole = read(frame)
    for position in range(18, len(frame)):  # (past the frame's header: its size as it was)
        for bit in range(8):
            flipped = bytearray(frame)
            flipped[position] ^= 1 << bit
            changed = read(bytes(flipped))
            try:
                group = changed["state"]["objects"]["optimizer"]["param_groups"][0]
            except (KeyError, TypeError, IndexError):
                continue
            if isinstance(group, dict) and group.get("lr") not in (lr, None):
                group["lr"] = lr
                if changed == whole:
                    return position, bit
    raise AssertionError("no single bit changes the lr alone")


def test_a_bit_flipped_in_a_manifest_is_damage_where_no_catalog_holds_its_digest(
        tmp_path: Path) -> None:
    """A manifest was checked by its digest in the catalog alone: one rebuilt (lost, a
    read-only store's, an object store opened on a new machine) took the digest off the
    flipped file, verify() said ok, and restore() put back lr 7.25 where 0.25 was saved."""
    from ckpt_nb.cli import main

    model = torch.nn.Linear(8, 8)
    with CheckpointManager(tmp_path) as mgr:
        good = mgr.save(model, torch.optim.SGD(model.parameters(), lr=0.5), rng=False)
        bad = mgr.save(model, torch.optim.SGD(model.parameters(), lr=0.25), rng=False)
    path = tmp_path / "manifests" / f"{bad}.json.zst"
    blob = path.read_bytes()
    # The frame a ckpt_nb without the checksum wrote holds the same blocks, after a
    # header as long: a bit that changes its lr alone is one of this frame's.
    bare = zstandard.ZstdCompressor(level=3).compress(zstandard.ZstdDecompressor()
                                                      .decompress(blob))
    assert blob[5:len(bare)] == bare[5:]
    position, bit = _with_lr_changed(bare, 0.25)
    flipped = bytearray(blob)
    flipped[position] ^= 1 << bit
    path.write_bytes(bytes(flipped))
    lose_catalog(tmp_path)
    with pytest.warns(RuntimeWarning, match=f"left out: checkpoint {bad} .*is unreadable"):
        mgr = CheckpointManager(tmp_path)
    assert list(mgr.verify().bad) == [bad]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {bad} is damaged"):
        mgr.restore(bad, model=model, optimizer=optimizer)
    assert mgr.restore("latest", model=model, optimizer=optimizer).id == good
    assert optimizer.param_groups[0]["lr"] == 0.5
    mgr.close()
    assert main(["verify", str(tmp_path)]) == 1


def test_every_bit_flipped_in_a_manifest_is_refused_or_changes_nothing(
        tmp_path: Path) -> None:
    """Before the frame's checksum, half of a manifest's flipped bits read as other JSON."""
    with CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(torch.nn.Linear(4, 4), epoch=3, rng=False, extra={"lr": 0.25})
    blob = (tmp_path / "manifests" / f"{cid}.json.zst").read_bytes()
    whole = decode_manifest(blob, cid)
    for position in range(len(blob)):
        for bit in range(8):
            flipped = bytearray(blob)
            flipped[position] ^= 1 << bit
            try:
                assert decode_manifest(bytes(flipped), cid) == whole, (position, bit)
            except CorruptCheckpointError:
                pass


def test_a_manifest_written_without_the_checksum_reads_as_before(tmp_path: Path) -> None:
    """As a ckpt_nb before the checksum wrote it, in a catalog rebuilt from it."""
    good, bad = two_saves(tmp_path)
    rewrite_manifest(tmp_path, bad, lambda manifest: manifest)  # (no checksum)
    path = tmp_path / "manifests" / f"{bad}.json.zst"
    assert not zstandard.get_frame_parameters(path.read_bytes()).has_checksum
    lose_catalog(tmp_path)
    with pytest.warns(RuntimeWarning, match="2 checkpoints recovered"):
        mgr = CheckpointManager(tmp_path)
    assert mgr.verify().ok
    assert mgr.load(bad).epoch == 1


def test_a_manifest_a_save_wrote_over_256_mib_reads_in_a_fresh_manager(tmp_path: Path) -> None:
    """A long string (JSON writes each non-ASCII character as 6 bytes) made a manifest a
    save wrote and a fresh process refused as claiming "more than any manifest"."""
    with CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(torch.nn.Linear(2, 2), extra={"corpus": "é" * 50_000_000})
    assert len(CheckpointManager(tmp_path).load(cid).extra["corpus"]) == 50_000_000


def test_a_checkpoint_too_large_for_memory_is_named_with_its_size(tmp_path: Path) -> None:
    """A manifest that claims a 1 TiB tensor (2**20 references to one zero chunk, as a
    save of a zero tensor that size writes) fails as a MemoryError that names the
    checkpoint and its size, not numpy's "Unable to allocate" about an array of no name."""
    with CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(Holder({"w": torch.zeros(256, 1024)}))

    def claim_a_tebibyte(manifest: dict) -> dict:
        storage = manifest["storages"][0]
        storage["chunks"] = storage["chunks"] * (1 << 20)
        storage["nbytes"] = 1 << 40
        manifest["tensors"][0]["shape"] = [1 << 28, 1024]
        return manifest

    rewrite_manifest(tmp_path, cid, claim_a_tebibyte)
    with catalog(tmp_path) as db:  # (the claim is consistent: its checksum is updated too)
        blob = (tmp_path / "manifests" / f"{cid}.json.zst").read_bytes()
        db.execute("UPDATE checkpoints SET manifest_digest = ? WHERE id = ?",
                   (blake3.blake3(blob).hexdigest(), cid))
    with pytest.raises(MemoryError, match=f"checkpoint {cid} holds 1024.0 GiB of tensors"):
        CheckpointManager(tmp_path).load(cid)
