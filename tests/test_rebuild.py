"""A store whose catalog was lost opens with every whole checkpoint it holds.

Real training on digits, real SQLite, real files: the catalog is deleted (or
spoilt) the way a user or a copy would, and the store is opened again.
"""

from __future__ import annotations

import os
import time
import uuid
import warnings
from pathlib import Path

import pytest
import torch
from conftest import DigitsRun, same

from ckpt_nb import (CheckpointManager, CorruptCheckpointError, FsspecStore, LocalStore,
                     StoreError)
from ckpt_nb._catalog import DamagedCatalog
from ckpt_nb.cli import main as cli

LISTED = ["id", "parent", "branch", "step", "epoch", "batch_idx", "strategy", "pinned", "note",
          "logical_bytes", "val_loss"]


def lose_catalog(store: Path) -> None:
    for path in store.glob("catalog.sqlite*"):
        path.unlink()


def history(store: Path) -> tuple[CheckpointManager, dict[str, list[torch.Tensor]]]:
    """Incremental saves thinned by retention, a rollback that branches, a pin and a
    note; returns the manager and the weights each checkpoint holds."""
    run = DigitsRun(seed=3)
    mgr = CheckpointManager(store, max_to_keep=4, keep_best=1, metric="val_loss",
                            strategy="incremental", full_every=3)
    saved: dict[str, list[torch.Tensor]] = {}
    for step in range(1, 8):
        loss = run.train_step()
        cid = mgr.save(run.model, run.optimizer, 0, scheduler=run.scheduler, step=step,
                       batch_idx=step, metrics={"val_loss": loss if step != 2 else 0.01})
        saved[cid] = run.weights()
    rows = mgr.list()
    mgr.restore(rows["id"].iloc[-3], model=run.model, optimizer=run.optimizer,
                scheduler=run.scheduler)
    for step in range(8, 10):
        cid = mgr.save(run.model, run.optimizer, 1, scheduler=run.scheduler, step=step,
                       metrics={"val_loss": run.train_step()})
        saved[cid] = run.weights()
    mgr.pin(rows["id"].iloc[-2])
    mgr.annotate(cid, "the branch's tip")
    mgr.annotate(rows["id"].iloc[-1], "to be changed")
    mgr.annotate(rows["id"].iloc[-1], "changed after its save")
    kept = set(mgr.list()["id"])
    return mgr, {cid: weights for cid, weights in saved.items() if cid in kept}


def test_a_lost_catalog_is_rebuilt_with_every_checkpoint(tmp_path: Path) -> None:
    store = tmp_path / "exp"
    mgr, saved = history(store)
    before = mgr.list()
    assert len(before) < 9 and before["branch"].nunique() == 2  # retention deleted, branched
    mgr.close()
    lose_catalog(store)

    with pytest.warns(RuntimeWarning, match=rf"rebuilt from the store: {len(before)} "
                                            r"checkpoints recovered; \d+ whose parent"):
        again = CheckpointManager(store, max_to_keep=4, keep_best=1, metric="val_loss",
                                  strategy="incremental", full_every=3)
    after = again.list()
    assert after[LISTED].equals(before[LISTED])  # the DAG, pins and notes included
    assert after["best"].tolist() == before["best"].tolist()
    assert after["created"].tolist() == before["created"].tolist()
    for cid, weights in saved.items():
        run = DigitsRun(seed=7)
        again.restore(cid, model=run.model, optimizer=run.optimizer, scheduler=run.scheduler)
        assert same(run.weights(), weights), cid
    assert again.verify().ok
    report = again.gc()
    assert (report.packs_deleted, report.manifests_deleted, report.chunks_dropped) == (0, 0, 0)

    run = DigitsRun(seed=8)
    again.restore("latest", model=run.model, optimizer=run.optimizer, scheduler=run.scheduler)
    run.train_step()
    new = again.save(run.model, run.optimizer, 2, scheduler=run.scheduler, step=10,
                     metrics={"val_loss": 1.0})
    rows = again.list().set_index("id")
    assert rows.loc[new, "parent"] == after["id"].iloc[-1]
    assert rows.loc[new, "strategy"] == "incremental"  # the chain goes on from the rebuild
    assert before["id"][before["pinned"]].item() in rows.index  # retention kept the pin


def test_a_rebuilt_catalog_charges_each_checkpoint_what_its_save_stored(
        tmp_path: Path) -> None:
    """A rebuild charged a chunk to the oldest kept checkpoint that uses it: the branch's
    first, whose state a checkpoint deleted since had stored, went from its manifest's
    size to a whole state's, and the oldest kept one from its deltas to more than its
    logical size (a chunk that gc moved out of a deleted save's pack)."""
    store = tmp_path / "exp"
    mgr, _ = history(store)
    rows = mgr.list()
    mgr.delete(rows["id"][~rows["pinned"]].iloc[0])  # (a deletion by hand too, and its gc)
    # The main branch's tip restored and saved again as it is, after which the tip is
    # deleted: its pack stays, all of whose chunks the new checkpoint uses, without its
    # save having stored any of them.
    tip = mgr.list().query("branch == 'main'")["id"].iloc[-1]
    run = DigitsRun(seed=5)
    mgr.restore(tip, model=run.model, optimizer=run.optimizer, scheduler=run.scheduler)
    time.sleep(0.1)  # (past how far a pack file's time may lag the clock: _FILE_CLOCK_LAG)
    again = mgr.save(run.model, run.optimizer, 0, scheduler=run.scheduler)
    mgr.delete(tip)
    mgr.gc()
    before = mgr.list().set_index("id")
    mgr.close()
    assert (before["stored_bytes"] <= before["logical_bytes"]).all()
    assert before.loc[again, "stored_bytes"] < before.loc[again, "logical_bytes"] / 4
    lose_catalog(store)
    with pytest.warns(RuntimeWarning, match="rebuilt from the store"):
        after = CheckpointManager(store).list().set_index("id")
    assert after["stored_bytes"].to_dict() == before["stored_bytes"].to_dict()


def test_a_pin_and_a_note_are_kept_in_the_store_until_their_checkpoint_goes(
        tmp_path: Path, digits: DigitsRun) -> None:
    store = tmp_path / "exp"
    mgr = CheckpointManager(store)
    first = mgr.save(digits.model, metrics={"val_loss": 1.0})
    second = mgr.save(digits.model, metrics={"val_loss": 2.0})
    mgr.pin(first)
    mgr.annotate(second, "keep an eye on this one")
    mgr.unpin(first)
    mgr.pin(second)
    assert sorted(p.name for p in (store / "labels").iterdir()) == \
        sorted(f"{cid}.json" for cid in (first, second))
    mgr.delete(first)
    assert [p.name for p in (store / "labels").iterdir()] == [f"{second}.json"]
    mgr.close()
    lose_catalog(store)
    with pytest.warns(RuntimeWarning, match="1 checkpoint recovered"):
        rows = CheckpointManager(store).list()
    assert rows[["id", "pinned", "note"]].values.tolist() == \
        [[second, True, "keep an eye on this one"]]


def test_what_is_not_whole_is_left_out_and_named(tmp_path: Path, digits: DigitsRun) -> None:
    store = tmp_path / "exp"
    mgr = CheckpointManager(store)
    ids = []
    for _ in range(4):
        digits.train_step()
        ids.append(mgr.save(digits.model, digits.optimizer))
    mgr.close()
    lose_catalog(store)
    # The second save's pack cut short (its index gone), the third's manifest spoilt.
    packs = sorted((store / "packs").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    second_pack = packs[1]
    os.truncate(second_pack, second_pack.stat().st_size - 20)
    (store / "manifests" / f"{ids[2]}.json.zst").write_bytes(b"not zstd")

    with pytest.warns(RuntimeWarning) as caught:
        again = CheckpointManager(store)
    message = str(caught[0].message)
    assert "2 checkpoints recovered" in message
    assert f"pack packs/{second_pack.name}" in message and "cut short" in message
    assert f"checkpoint {ids[1]} (its chunk" in message and "is in no pack" in message
    assert f"checkpoint {ids[2]} (manifest of checkpoint {ids[2]} is unreadable" in message
    rows = again.list()
    assert rows["id"].tolist() == [ids[0], ids[3]]
    assert rows["parent"].tolist() == [None, ids[0]]  # its parent gone, joined to the one before
    assert sorted(again.verify().bad) == sorted(ids[1:3])  # (kept in the store, not whole)
    # A pack cut short is no save's leftover (saves rename whole files into place): gc
    # keeps it, and the manifest that needs it, for a whole copy to be put back.
    again.gc()
    assert second_pack.exists() and (store / "manifests" / f"{ids[1]}.json.zst").exists()
    run = DigitsRun(seed=5)
    again.restore(ids[3], model=run.model, optimizer=run.optimizer)
    assert same(run.weights(), digits.weights())


def test_a_pack_deleted_by_hand_leaves_its_checkpoints_named_and_kept(
        tmp_path: Path, digits: DigitsRun, capsys: pytest.CaptureFixture[str]) -> None:
    """A manifest whose chunks are in no pack was taken for a killed save's leftover:
    a rebuild left the checkpoint out unnamed as damaged, verify() said all was well and
    gc() deleted its manifest, though later saves were built on it."""
    store = tmp_path / "exp"
    mgr = CheckpointManager(store)
    ids, packs = [], []
    for _ in range(3):
        digits.train_step()
        before = set((store / "packs").glob("*")) if (store / "packs").exists() else set()
        ids.append(mgr.save(digits.model, digits.optimizer))
        packs.append(set((store / "packs").glob("*")) - before)
    (pack,) = packs[1]
    pack.unlink()
    # With its catalog, the store names the checkpoint (the catalog lists it).
    assert list(mgr.verify().bad) == [ids[1]]
    mgr.close()
    lose_catalog(store)
    with pytest.warns(RuntimeWarning, match=f"kept in the store.*{ids[1]}"):
        again = CheckpointManager(store)
    assert again.list()["id"].tolist() == [ids[0], ids[2]]
    report = again.verify()
    assert list(report.bad) == [ids[1]] and "is damaged" in report.bad[ids[1]][0]
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {ids[1]} is damaged"):
        again.restore(ids[1], model=digits.model)
    assert again.gc().damaged_kept == 1
    assert (store / "manifests" / f"{ids[1]}.json.zst").exists()
    assert cli(["verify", str(store)]) == 1
    assert f"bad: {ids[1]}" in capsys.readouterr().out


def flip_byte(path: Path, from_end: int) -> None:
    data = bytearray(path.read_bytes())
    data[-from_end] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_damaged_pack_index_is_found_by_verify_and_rewritten_by_gc(
        tmp_path: Path, digits: DigitsRun, capsys: pytest.CaptureFixture[str]) -> None:
    """Its chunks read through the catalog, so nothing else saw it; a lost catalog then
    made the store unopenable (a negative read offset: 'open it again', forever)."""
    store = tmp_path / "exp"
    mgr = CheckpointManager(store)
    ids = [mgr.save(digits.model, digits.optimizer) for _ in range(2) if digits.train_step()]
    newest_pack = max((store / "packs").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    flip_byte(newest_pack, 13)  # (in the index's length)
    report = mgr.verify()
    assert not report.ok and not report.bad
    assert "its index is damaged" in report.packs[f"packs/{newest_pack.name}"]
    assert cli(["verify", str(store)]) == 1
    assert f"bad index: packs/{newest_pack.name}" in capsys.readouterr().out
    assert mgr.gc().packs_compacted == 1 and mgr.verify().ok
    mgr.close()
    lose_catalog(store)
    with pytest.warns(RuntimeWarning, match="2 checkpoints recovered"):
        assert CheckpointManager(store).list()["id"].tolist() == ids


@pytest.mark.parametrize("damage", ["pack index", "manifest"])
def test_what_a_rebuild_finds_damaged_stays_in_the_store(
        tmp_path: Path, digits: DigitsRun, damage: str) -> None:
    """gc() used to delete it (the damaged pack, or a damaged manifest's whole pack),
    losing what was readable a moment before; it is kept until deleted by hand."""
    store = tmp_path / "exp"
    mgr = CheckpointManager(store)
    ids = [mgr.save(digits.model, digits.optimizer) for _ in range(2) if digits.train_step()]
    mgr.close()
    newest_pack = max((store / "packs").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    damaged = newest_pack if damage == "pack index" else \
        store / "manifests" / f"{ids[1]}.json.zst"
    flip_byte(damaged, 13)
    lose_catalog(store)
    with pytest.warns(RuntimeWarning, match="kept in the store, and left alone by gc"):
        again = CheckpointManager(store)
    assert again.list()["id"].tolist() == ids[:1]
    before = sorted(p.name for p in store.rglob("*") if p.is_file() and "catalog" not in p.name)
    report = again.gc()
    assert report.damaged_kept >= 1 and (report.packs_deleted, report.manifests_deleted) == (0, 0)
    assert sorted(p.name for p in store.rglob("*")
                  if p.is_file() and "catalog" not in p.name) == before
    named = again.catalog.damaged()  # (with a damaged pack, the manifests it may serve)
    assert f"{damaged.parent.name}/{damaged.name}" in named
    for key in named:  # dealt with by hand: gc collects again
        (store / key).unlink()
    assert again.gc().damaged_kept == 0
    assert again.verify().ok


def test_an_unreadable_catalog_is_refused_with_what_to_do(tmp_path: Path,
                                                          digits: DigitsRun) -> None:
    store = tmp_path / "exp"
    with CheckpointManager(store) as mgr:
        cid = mgr.save(digits.model)
    lose_catalog(store)
    (store / "catalog.sqlite").write_bytes(os.urandom(8192))
    with pytest.raises(DamagedCatalog, match="is damaged: .*move it aside") as caught:
        CheckpointManager(store)
    assert isinstance(caught.value, StoreError) and isinstance(caught.value, OSError)
    (store / "catalog.sqlite").rename(store / "catalog.sqlite.bad")
    with pytest.warns(RuntimeWarning, match="1 checkpoint recovered"):
        assert CheckpointManager(store).list()["id"].tolist() == [cid]


def test_the_cli_opens_a_store_whose_catalog_was_lost(tmp_path: Path, digits: DigitsRun,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "exp"
    with CheckpointManager(store) as mgr:
        cid = mgr.save(digits.model, step=7)
    lose_catalog(store)
    with pytest.warns(RuntimeWarning, match="rebuilt"):
        assert cli(["ls", str(store)]) == 0
    assert cid in capsys.readouterr().out
    assert cli(["ls", str(tmp_path / "nothing-here")]) == 2  # a typo is still refused


def test_an_object_store_opened_from_a_new_cache_has_its_checkpoints(
        tmp_path: Path, digits: DigitsRun, monkeypatch: pytest.MonkeyPatch) -> None:
    # An object store's catalog lives in the machine's cache: a fresh runtime has none.
    url = f"memory://ckpt-nb-rebuild-{uuid.uuid4().hex}"
    monkeypatch.setenv("HOME", str(tmp_path / "first-machine"))
    with CheckpointManager(FsspecStore(url), catalog=tmp_path / "first.sqlite") as mgr:
        ids = [mgr.save(digits.model, step=s) for s in (1, 2)]
        digits.train_step()
        ids.append(mgr.save(digits.model, step=3))
    with pytest.warns(RuntimeWarning, match="3 checkpoints recovered"):
        again = CheckpointManager(FsspecStore(url), catalog=tmp_path / "second.sqlite")
    assert again.list()["id"].tolist() == ids
    run = DigitsRun(seed=9)
    again.restore("latest", model=run.model)
    assert same(run.weights(), digits.weights())
    assert again.gc().packs_deleted == 0


class FlakyStore(LocalStore):
    """A store whose reads fail for a while, as a network does: the one failure we
    cannot make real here."""

    failing = True

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        if self.failing and key.startswith("manifests/"):
            raise ConnectionResetError("connection reset by peer")
        return super().get(key, start, end)


def test_a_rebuild_that_cannot_read_the_store_changes_nothing(
        tmp_path: Path, digits: DigitsRun) -> None:
    store = tmp_path / "exp"
    with CheckpointManager(store) as mgr:
        ids = [mgr.save(digits.model, step=s) for s in (1, 2)]
    lose_catalog(store)
    flaky = FlakyStore(store)
    with pytest.raises(StoreError, match="reading the store to rebuild it failed .*"
                                         "connection reset.*open it again"):
        CheckpointManager(flaky, catalog=store / "catalog.sqlite")
    flaky.failing = False  # (not two checkpoints left out, for a gc to delete)
    with pytest.warns(RuntimeWarning, match="2 checkpoints recovered"):
        again = CheckpointManager(flaky, catalog=store / "catalog.sqlite")
    assert again.list()["id"].tolist() == ids


def test_a_memory_store_opened_again_has_its_checkpoints_without_a_warning(
        digits: DigitsRun) -> None:
    # Its catalog lives in memory, so each manager reads the store: nothing was lost.
    url = f"memory://ckpt-nb-rebuild-{uuid.uuid4().hex}"
    first = CheckpointManager(url)
    cid = first.save(digits.model, step=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = CheckpointManager(url)
    assert second.list()["id"].tolist() == [cid]
    assert second.gc().packs_deleted == 0


def test_an_object_stores_cached_catalog_is_rebuilt_when_another_machine_wrote(
        tmp_path: Path, digits: DigitsRun) -> None:
    # Two runtimes, one object store, a catalog cached on each (catalog=): the first
    # saves, the second resumes and trains on (retention deleting), then the first opens
    # the store again from its old cache, whose gc would delete the second's work.
    url = f"memory://ckpt-nb-stale-{uuid.uuid4().hex}"
    laptop, runtime = tmp_path / "laptop.sqlite", tmp_path / "runtime.sqlite"
    with CheckpointManager(FsspecStore(url), catalog=laptop) as first:
        old = [first.save(digits.model, step=s) for s in (1, 2)]
    with pytest.warns(RuntimeWarning, match="was missing"):
        second = CheckpointManager(FsspecStore(url), catalog=runtime, max_to_keep=2)
    second.restore("latest", model=digits.model)
    digits.train_step()
    new = second.save(digits.model, step=3)
    second.close()
    with pytest.warns(RuntimeWarning, match="no longer matched the store .* 2 checkpoints"):
        again = CheckpointManager(FsspecStore(url), catalog=laptop)
    assert again.list()["id"].tolist() == [old[1], new]
    assert again.gc().packs_deleted == 0
    run = DigitsRun(seed=11)
    again.restore(new, model=run.model)
    assert same(run.weights(), digits.weights())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in step with the store now: no rebuild
        assert CheckpointManager(FsspecStore(url), catalog=laptop).list()["id"].tolist() == \
            [old[1], new]


@pytest.mark.parametrize("kind", ["memory://", "object store, two caches"])
def test_a_manager_whose_catalog_is_its_own_catches_up_before_it_deletes(
        tmp_path: Path, digits: DigitsRun, kind: str) -> None:
    """Two managers open at once on a store whose catalog each keeps to itself (a
    memory:// store's; an object store's, cached per machine): the second's delete ran
    gc from its stale catalog and deleted the first's newer checkpoints (the explorer
    on a memory:// store is such a second manager)."""
    url = f"memory://ckpt-nb-two-{uuid.uuid4().hex}"

    def open_manager(name: str) -> CheckpointManager:
        if kind == "memory://":
            return CheckpointManager(url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a new cache: rebuilt)
            return CheckpointManager(FsspecStore(url), catalog=tmp_path / f"{name}.sqlite")

    first = open_manager("first")
    old = [first.save(digits.model, step=s) for s in (1, 2)]
    second = open_manager("second")
    assert second.list()["id"].tolist() == old
    new = [first.save(digits.model, step=s) for s in (3, 4) if digits.train_step()]
    second.delete(old[0])
    assert second.list()["id"].tolist() == [old[1], *new]
    assert first.verify().ok and [first.load(cid).step for cid in new] == [3, 4]
    third = second.save(digits.model, step=5)
    first.gc()  # (first catches up too: the deleted one gone, the second's new one kept)
    assert first.list()["id"].tolist() == [old[1], *new, third] and first.verify().ok
    assert second.load(third).step == 5


def test_a_pin_made_on_another_machine_is_kept_by_retention_here(
        tmp_path: Path, digits: DigitsRun) -> None:
    """An object store's cached catalog trusted its pins: a checkpoint pinned from
    another machine was deleted by this one's retention."""
    url = f"memory://ckpt-nb-pins-{uuid.uuid4().hex}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (new caches: rebuilt)
        laptop = CheckpointManager(FsspecStore(url), catalog=tmp_path / "laptop.sqlite")
        ids = [laptop.save(digits.model, step=s) for s in (1, 2, 3)]
        runtime = CheckpointManager(FsspecStore(url + "/"), catalog=tmp_path / "rt.sqlite",
                                    max_to_keep=1)  # (the same store, spelt with a slash)
    assert runtime.list()["id"].tolist() == ids
    laptop.pin(ids[0])
    laptop.annotate(ids[1], "from the laptop")
    new = runtime.save(digits.model, step=4)
    assert runtime.list()["id"].tolist() == [ids[0], new]
    assert laptop.list()["id"].tolist() == [ids[0], new] and laptop.verify().ok


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(64, 256))  # 64 KiB: stored as deltas
        self.y = torch.nn.Parameter(torch.zeros(512, 256))


def test_a_rebuilt_catalog_leaves_out_a_chunk_whose_base_is_gone(tmp_path: Path) -> None:
    """A dead delta left in a pack that gc kept (its other chunks live), its base gone:
    a rebuilt catalog that listed it let a later save of the same bytes refer to it,
    and that new checkpoint did not restore."""
    g = torch.Generator().manual_seed(0)
    first = torch.randn(64, 256, generator=g)
    second = first + 1e-4 * torch.randn(64, 256, generator=g)  # a small step: a delta
    net, store = Net(), tmp_path / "exp"
    mgr = CheckpointManager(store, strategy="incremental", chunk_size=8192)
    ids = []
    for w in (first, second, torch.randn(64, 256, generator=g)):
        with torch.no_grad():
            net.w.copy_(w)
            if len(ids) < 2:  # (the third save shares the second's y)
                net.y.copy_(torch.randn(512, 256, generator=g))
        ids.append(mgr.save(net, strategy="full" if len(ids) == 2 else None))
    assert [c for c in mgr.catalog.all_chunks() if c.base]
    mgr.delete(ids[1])  # its deltas of w die, in a pack its y keeps
    mgr.delete(ids[0])  # their base goes with its pack
    mgr.close()
    lose_catalog(store)
    with pytest.warns(RuntimeWarning, match="rebuilt from the store"):
        rebuilt = CheckpointManager(store, strategy="incremental", chunk_size=8192)
    known = {c.digest for c in rebuilt.catalog.all_chunks()}
    assert all(c.base in known for c in rebuilt.catalog.all_chunks() if c.base)
    with torch.no_grad():
        net.w.copy_(second)  # the same bytes again
    cid = rebuilt.save(net)
    assert rebuilt.verify().ok
    fresh = Net()
    rebuilt.restore(cid, model=fresh)
    assert torch.equal(fresh.w, second)

