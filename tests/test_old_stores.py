"""Stores shared with other versions of ckpt_nb: older ones (saved before labels, or in
an older format) and newer ones (a checkpoint of a manifest format this one cannot read).

The older versions' stores are made here by this ckpt_nb, then put in the state the
older one left them in (no labels, no flag in the catalog, an older format stamp); a
newer version's checkpoint is a manifest restamped with a newer format, and its
catalog row's digest, as a newer save's commit writes them. Real files, real SQLite.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import uuid
import warnings
from pathlib import Path

import pytest
import torch
import zstandard
from conftest import DigitsRun, Holder, same

from ckpt_nb import CheckpointManager, FsspecStore, StoreFormatError
from ckpt_nb import _codec as codec
from ckpt_nb._catalog import LABELS_WRITTEN
from ckpt_nb._format import FORMAT, MANIFEST_FORMAT


def lose_catalog(store: Path) -> None:
    for path in store.glob("catalog.sqlite*"):
        path.unlink()


def as_before_labels(store: Path) -> None:
    """Leave the store as a ckpt_nb from before labels left it: pins, notes and new
    parents in the catalog alone, which has no flag saying they were written out."""
    shutil.rmtree(store / "labels")
    with sqlite3.connect(store / "catalog.sqlite") as db:
        db.execute("DELETE FROM meta WHERE key=?", (LABELS_WRITTEN,))
    db.close()


def test_pins_notes_and_new_parents_of_a_store_saved_before_labels_survive_a_rebuild(
        tmp_path: Path, digits: DigitsRun) -> None:
    store = tmp_path / "exp"
    with CheckpointManager(store) as mgr:
        ids = []
        for step in range(3):
            digits.train_step()
            ids.append(mgr.save(digits.model, digits.optimizer, step=step))
        mgr.pin(ids[0])
        mgr.annotate(ids[0], "the good one")
        mgr.annotate(ids[2], "diverged")
        mgr.restore(ids[1], model=digits.model, optimizer=digits.optimizer)
        fork = mgr.save(digits.model, digits.optimizer, step=10)  # a branch from ids[1]
        mgr.delete(ids[1])  # its fork point gone: the branch joins ids[0]
    as_before_labels(store)

    CheckpointManager(store).close()  # this ckpt_nb opens it: the labels are written
    assert sorted(p.stem for p in (store / "labels").iterdir()) == sorted([ids[0], ids[2],
                                                                           fork])
    lose_catalog(store)
    with pytest.warns(RuntimeWarning, match="3 checkpoints recovered") as caught:
        mgr = CheckpointManager(store, max_to_keep=1)
    assert "is a root" not in str(caught[0].message)
    rows = mgr.list().set_index("id")
    assert rows.loc[ids[0], ["pinned", "note"]].tolist() == [True, "the good one"]
    assert rows.loc[ids[2], "note"] == "diverged" and rows.loc[fork, "parent"] == ids[0]
    digits.train_step()
    mgr.save(digits.model, digits.optimizer, step=11)
    assert ids[0] in mgr.list()["id"].tolist()  # retention kept the pinned one


def test_labels_are_written_once_per_catalog(tmp_path: Path, digits: DigitsRun) -> None:
    store = tmp_path / "exp"
    with CheckpointManager(store) as mgr:
        pinned = mgr.pin(mgr.save(digits.model))
    as_before_labels(store)
    CheckpointManager(store).close()
    label = store / "labels" / f"{pinned}.json"
    assert json.loads(label.read_text())["pinned"] is True
    label.unlink()  # (gone by hand): the next open reads one flag, and writes nothing
    CheckpointManager(store).close()
    assert not label.exists()


def test_a_rebuild_names_a_branch_whose_fork_point_went_unlabelled_as_a_root(
        tmp_path: Path, digits: DigitsRun) -> None:
    store = tmp_path / "exp"
    with CheckpointManager(store) as mgr:
        first = mgr.save(digits.model, step=0)
        digits.train_step()
        fork_point = mgr.save(digits.model, step=1)
        digits.train_step()
        third = mgr.save(digits.model, step=2)
        mgr.restore(fork_point, model=digits.model)
        digits.train_step()
        branch = mgr.save(digits.model, step=10)
        mgr.delete(fork_point)
    # (deleted by a ckpt_nb from before labels, whose catalog was then lost)
    shutil.rmtree(store / "labels")
    lose_catalog(store)
    with pytest.warns(RuntimeWarning) as caught:
        rows = CheckpointManager(store).list().set_index("id")
    message = str(caught[0].message)
    assert f"1 whose parent had been deleted is a root now, the store recording no kept " \
        f"ancestor of it: {branch}" in message
    assert "was joined to its nearest kept ancestor" in message  # (the main line's third)
    assert rows.loc[branch, "parent"] is None and rows.loc[third, "parent"] == first


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
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for cid in ids[5:-1]:
            mgr.delete(cid)
    restamped = [str(w.message) for w in said if "this write made it format" in str(w.message)]
    assert len(restamped) == (found < after), restamped  # (a team on the older one is told)
    assert mgr.gc().chunks_rewritten == 0  # (the deletes rewrote the chain's end)
    assert json.loads(stamp.read_text())["format"] == after
    assert same(list(mgr.load(ids[-1]).state["model"].values()), [model.weight.detach()])


def test_a_restamp_under_warnings_as_errors_raises_once_and_the_next_save_goes_in(
        tmp_path: Path) -> None:
    """Under -W error the restamp's warning raises: the manager set its format after the
    warning, so each later save restamped and raised again, and none went in."""
    CheckpointManager(tmp_path).save(Holder({"w": torch.ones(3)}))
    (tmp_path / "ckpt_nb.json").write_text(json.dumps({"format": 1}))
    mgr = CheckpointManager(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="was of format 1; this write made it format"):
            mgr.save(Holder({"w": torch.zeros(3)}))
        cid = mgr.save(Holder({"w": torch.full((3,), 2.0)}))
    assert mgr.list()["id"].tolist()[-1] == cid
    mgr.close()


def from_a_newer_ckpt_nb(store: Path, cid: str, catalog: Path | None = None) -> None:
    """Make ``cid`` a checkpoint a newer ckpt_nb saved: its manifest of a newer format,
    and its catalog row's digest of it, as that version's commit writes it."""
    path = store / "manifests" / f"{cid}.json.zst"
    manifest = json.loads(zstandard.ZstdDecompressor().decompress(path.read_bytes()))
    manifest["format"] = MANIFEST_FORMAT + 1
    blob = zstandard.ZstdCompressor().compress(json.dumps(manifest).encode())
    path.write_bytes(blob)
    with sqlite3.connect(catalog or store / "catalog.sqlite") as db:
        db.execute("UPDATE checkpoints SET manifest_digest=? WHERE id=?",
                   (codec.digest(blob), cid))
    db.close()


def saved_with_a_newer_last(store: Path, digits: DigitsRun,
                            catalog: Path | None = None) -> list[str]:
    with CheckpointManager(store, catalog=catalog) as mgr:
        ids = []
        for step in range(3):
            digits.train_step()
            ids.append(mgr.save(digits.model, step=step))
    from_a_newer_ckpt_nb(store, ids[-1], catalog)
    return ids


def test_a_checkpoint_of_a_newer_format_is_skipped_by_latest_and_not_called_corrupt(
        tmp_path: Path, digits: DigitsRun) -> None:
    store = tmp_path / "exp"
    ids = saved_with_a_newer_last(store, digits)
    mgr = CheckpointManager(store)
    report = mgr.verify()
    assert report.bad == {} and report.checked == ids[:2] and not report.ok
    assert report.newer == {ids[2]: "written by a newer ckpt_nb, not checked: upgrade "
                                    "ckpt_nb (pip install -U ckpt_nb) to verify it"}
    run = DigitsRun(seed=4)
    with pytest.warns(UserWarning, match=f"skipping checkpoint {ids[2]}, which this ckpt_nb "
                                         f"cannot read .*has format {MANIFEST_FORMAT + 1}, "
                                         "written by a newer ckpt_nb"):
        assert mgr.restore("latest", model=run.model).id == ids[1]
    with pytest.warns(UserWarning, match=f"skipping checkpoint {ids[2]}"):
        assert mgr.load("latest").id == ids[1]
    with pytest.raises(StoreFormatError) as refused:
        mgr.load(ids[2])
    # (it said "has format 5: upgrade ckpt_nb": not what this one reads, how to upgrade,
    # nor that the rest of the store reads, as the store-level refusal says)
    assert str(refused.value) == (
        f"checkpoint {ids[2]} has format {MANIFEST_FORMAT + 1}, written by a newer ckpt_nb; "
        f"this ckpt_nb reads up to format {MANIFEST_FORMAT}: upgrade ckpt_nb (pip install -U "
        "ckpt_nb) to open it; the store's other checkpoints still read ('latest' skips this one)")


def test_a_rebuild_leaves_out_a_checkpoint_of_a_newer_format_and_opens_the_rest(
        tmp_path: Path, digits: DigitsRun) -> None:
    store = tmp_path / "exp"
    ids = saved_with_a_newer_last(store, digits)
    lose_catalog(store)
    with pytest.warns(RuntimeWarning, match=f"2 checkpoints recovered; left out: checkpoint "
                                            f"{ids[2]} \\(written by a newer ckpt_nb: "
                                            "upgrade ckpt_nb to read it\\)"):
        mgr = CheckpointManager(store, max_to_keep=1)
    assert mgr.list()["id"].tolist() == ids[:2]
    report = mgr.verify()
    assert report.bad == {} and list(report.newer) == [ids[2]] and not report.ok
    with pytest.raises(StoreFormatError, match=f"checkpoint {ids[2]} was written by a newer"):
        mgr.load(ids[2][:6])
    files = sorted(p.relative_to(store) for p in store.rglob("*") if p.is_file()
                   and p.parent.name in ("packs", "manifests"))
    with pytest.warns(RuntimeWarning, match=f"written by a newer ckpt_nb \\({ids[2]}\\)"):
        mgr.save(digits.model, step=3)  # retention deletes, gc frees nothing
    assert mgr.gc().damaged_kept == 1
    # (the packs all stay while a checkpoint this ckpt_nb cannot read is there; the
    # manifests of the checkpoints retention deleted go)
    assert all((store / path).exists() for path in files
               if path.parent.name == "packs" or ids[2] in path.name)
    assert not (store / "manifests" / f"{ids[1]}.json.zst").exists()
    assert mgr.load("latest").step == 3


def test_an_object_store_with_a_newer_clients_checkpoint_opens_every_time(
        tmp_path: Path, digits: DigitsRun) -> None:
    # The newer client saved into the store; this machine's cached catalog does not list
    # that checkpoint, so each open reads the store again: it must open, and once in step
    # with the store, open without reading it again.
    url = f"memory://ckpt-nb-newer-{uuid.uuid4().hex}"
    root = tmp_path / "bucket"
    ids = saved_with_a_newer_last(root, digits, catalog=tmp_path / "newer.sqlite")
    with CheckpointManager(FsspecStore(url), catalog=tmp_path / "here.sqlite") as mgr:
        for path in root.rglob("*"):  # the bucket, as the newer client left it
            if path.is_file():
                mgr.store.put(str(path.relative_to(root)), path.read_bytes())
    with pytest.warns(RuntimeWarning, match=f"left out: checkpoint {ids[2]} \\(written by"):
        again = CheckpointManager(FsspecStore(url), catalog=tmp_path / "here.sqlite")
    assert again.list()["id"].tolist() == ids[:2]
    again.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in step with the store now: no rebuild
        assert CheckpointManager(FsspecStore(url), catalog=tmp_path / "here.sqlite") \
            .list()["id"].tolist() == ids[:2]


def test_the_cli_says_a_checkpoint_of_a_newer_format_was_not_checked(
        tmp_path: Path, digits: DigitsRun, capsys: pytest.CaptureFixture[str]) -> None:
    """`ckpt-nb verify` counted it as "0 of 2 checkpoints fail verification" and exited 1
    with no line on it; `show latest` passed over it without a word."""
    from ckpt_nb.cli import main

    store = tmp_path / "exp"
    ids = saved_with_a_newer_last(store, digits)
    assert main(["verify", str(store)]) == 1  # (a script's `verify && ...` must stop)
    out = capsys.readouterr().out
    assert f"not checked: {ids[2]}\n  written by a newer ckpt_nb, not checked" in out, out
    assert out.rstrip().endswith("0 of 2 checkpoints fail verification; 1 checkpoint written "
                                 "by a newer ckpt_nb was not checked (upgrade ckpt_nb to verify "
                                 "it)")
    assert main(["show", str(store), "latest"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"id:        {ids[1]}"
    assert lines[1] == (f"skipped:   {ids[2]} (written by a newer ckpt_nb, which this one "
                        "cannot read), newer: 'latest' is the newest checkpoint that verifies, "
                        "as restore and export take it")


def test_a_checkpoint_of_a_dtype_this_torch_lacks_is_passed_over_not_called_corrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer torch's dtype (an older torch cannot run here: its dtype table stands in)
    was reported as corruption by restore and load."""
    from ckpt_nb import _capture
    with CheckpointManager(tmp_path) as mgr:
        old = mgr.save(h=Holder({"w": torch.ones(2)}))
        new = mgr.save(h=Holder({"w": torch.ones(2, dtype=torch.float8_e5m2)}))
    monkeypatch.delitem(_capture._DTYPES, "float8_e5m2")
    with CheckpointManager(tmp_path) as mgr:
        with pytest.raises(StoreFormatError, match="has no dtype 'float8_e5m2': restore with"):
            mgr.load(new)
        with pytest.warns(UserWarning, match=f"skipping checkpoint {new}, which this ckpt_nb "
                                             "cannot read .*has no dtype"):
            assert mgr.load("latest").id == old
