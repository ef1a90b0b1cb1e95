"""Two machines on one S3 store (moto's, on loopback), with no lock across them: one's
gc and retention never take the other's save in flight for a killed save's leftover,
and a damaged checkpoint does not stop retention.

"Another machine" is another catalog (another cache folder, so another lock).
"""

from __future__ import annotations

import re
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import Holder

from ckpt_nb import CheckpointManager, FsspecStore, StoreError, _store

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto")

def machine(url: str | FsspecStore, tmp_path: Path, n: int, **options: object
            ) -> CheckpointManager:
    """A manager on machine ``n``: a catalog cache (and lock) of its own."""
    return CheckpointManager(url, catalog=tmp_path / f"machine-{n}" / "catalog.sqlite",
                             **options)


def files(bucket: str, folder: str) -> dict[str, bytes]:
    """The objects under ``exp/<folder>`` of a store, by key."""
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    root = f"{bucket}/{folder}"
    return {path[len(bucket) + 1:]: fs.cat_file(path) for path in fs.find(root)}


def a_save_elsewhere(bucket: str, tmp_path: Path
                     ) -> tuple[CheckpointManager, str, dict[str, bytes], tuple[str, bytes]]:
    """The files a save on a third machine writes into ``exp`` (its packs by key, its
    manifest's key and bytes), for a test to write one by one, as the save does; that
    machine's manager (of another store) and the checkpoint's id."""
    elsewhere = machine(f"s3://{bucket}/scratch", tmp_path, 3)
    flying = elsewhere.save(h=Holder({"w": torch.randn(100_000)}))
    packs = {f"exp/{key[len('scratch/'):]}": data
             for key, data in files(bucket, "scratch/packs").items()}
    manifest = (f"exp/manifests/{flying}.json.zst",
                s3fs.S3FileSystem().cat_file(f"{bucket}/scratch/manifests/{flying}.json.zst"))
    return elsewhere, flying, packs, manifest


def test_a_save_in_flight_survives_another_machines_gc(bucket: str, tmp_path: Path) -> None:
    """A save uploads its packs, then its manifest while its last pack is on its way, and
    commits after: another machine's gc in between took the pack for a killed save's
    orphan, then the manifest for its leftover, and deleted both; the save returned its
    id all the same."""
    url = f"s3://{bucket}/exp"
    first = machine(url, tmp_path, 1).save(h=Holder({"w": torch.randn(100_000)}))
    second = machine(url, tmp_path, 2)
    elsewhere, flying, packs, manifest = a_save_elsewhere(bucket, tmp_path)
    fs = s3fs.S3FileSystem()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (nothing said damaged, nor left out)
        for key, data in packs.items():  # its packs are up, its manifest not yet
            fs.pipe_file(f"{bucket}/{key}", data)
        assert second.gc().packs_deleted == 0
        assert set(packs) <= set(files(bucket, "exp/packs"))
        fs.rm([f"{bucket}/{key}" for key in packs])  # its manifest is up, its pack not yet
        fs.pipe_file(f"{bucket}/{manifest[0]}", manifest[1])
        report = second.gc()
        assert report.manifests_deleted == report.damaged_kept == 0
        assert manifest[0] in files(bucket, "exp/manifests")
        assert second.list()["id"].tolist() == [first] and second.verify().ok
        for key, data in packs.items():  # the last pack is up: the save is whole
            fs.pipe_file(f"{bucket}/{key}", data)
        assert second.list()["id"].tolist() == [first, flying]
        assert second.verify().ok and second.gc().packs_deleted == 0
        back = second.load(flying).state["h"]["w"]
    assert torch.equal(back, elsewhere.load(flying).state["h"]["w"])


def test_a_save_in_flight_is_not_called_damaged_beside_a_damaged_pack(
        bucket: str, tmp_path: Path) -> None:
    """Where a damaged pack might hold its chunk, a rebuild marked a young manifest whose
    pack was not up yet damaged, not a save in flight."""
    url = f"s3://{bucket}/exp"
    machine(url, tmp_path, 1).save(h=Holder({"w": torch.randn(1000)}))
    _, flying, _, manifest = a_save_elsewhere(bucket, tmp_path)
    fs = s3fs.S3FileSystem()
    fs.pipe_file(f"{bucket}/exp/packs/{'0' * 32}.pack", b"not a pack")
    fs.pipe_file(f"{bucket}/{manifest[0]}", manifest[1])
    with pytest.warns(RuntimeWarning, match="kept in the store") as said:
        second = machine(url, tmp_path, 2)
    assert flying not in str(said[0].message)
    assert list(second.catalog.damaged()) == [f"packs/{'0' * 32}.pack"]


class ThenAfterManifests(FsspecStore):
    """An S3 store that runs ``then`` as soon as a manifest is uploaded: another machine
    acting in a save's window between its manifest and its commit."""

    def __init__(self, url: str, then: Callable[[str], None]) -> None:
        super().__init__(url)
        self.then = then

    def put(self, key: str, data: bytes | memoryview) -> None:
        super().put(key, data)
        if key.startswith("manifests/"):
            self.then(key)


def test_a_save_whose_files_were_collected_before_its_commit_fails(
        bucket: str, tmp_path: Path) -> None:
    """Another machine's gc (one from before the grace time, or a hand) deleted a save's
    manifest before its commit: save() returned the id of a checkpoint that was gone."""
    url = f"s3://{bucket}/exp"
    fs = s3fs.S3FileSystem()
    first = machine(url, tmp_path, 1).save(h=Holder({"w": torch.randn(1000)}))
    mgr = machine(ThenAfterManifests(url, lambda key: fs.rm_file(f"{bucket}/exp/{key}")),
                  tmp_path, 2)
    with pytest.raises(StoreError, match=r"checkpoint \w+ was written, but manifests/.* left "
                                         "the store before its commit.*not saved; save again"):
        mgr.save(h=Holder({"w": torch.randn(1000)}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (its leftover pack, read again)
        assert mgr.list()["id"].tolist() == [first] and mgr.head is None


def test_a_damaged_checkpoint_does_not_stop_keep_n(bucket: str, tmp_path: Path) -> None:
    """A kept checkpoint's pack left the bucket: gc could free nothing, so it left the
    deleted checkpoints' manifests too, the next save's catalog read them back from the
    store, and max_to_keep=2 kept every checkpoint saved after (25 and growing)."""
    url = f"s3://{bucket}/exp"
    mgr = machine(url, tmp_path, 1, max_to_keep=2)
    ids = [mgr.save(h=Holder({"w": torch.randn(50_000)}), rng=False)]
    lost = set(files(bucket, "exp/packs"))  # (the first checkpoint's)
    ids.append(mgr.save(h=Holder({"w": torch.randn(50_000)}), rng=False))
    s3fs.S3FileSystem().rm([f"{bucket}/{key}" for key in lost])
    with pytest.warns(RuntimeWarning) as said:
        for _ in range(6):
            ids.append(mgr.save(h=Holder({"w": torch.randn(50_000)}), rng=False))
    damaged = ids[:1]
    assert mgr.list()["id"].tolist() == ids[-2:]
    assert sum("frees no room" in str(w.message) for w in said) == 1
    manifests = {key.rsplit("/", 1)[-1].split(".")[0] for key in files(bucket, "exp/manifests")}
    assert manifests == {*damaged, *ids[-2:]}
    assert list(mgr.verify().bad) == damaged


class _Counting(FsspecStore):
    """An S3 store that counts the reads of each key: a catalog read again from the store
    reads every manifest, so the reads of one that no catalog holds count those."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads: Counter[str] = Counter()

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self.reads[key] += 1
        return super().get(key, start, end)


def test_a_save_in_flight_is_read_again_once_its_pack_is_up_not_at_every_call(
        bucket: str, tmp_path: Path) -> None:
    """A manifest whose pack is not up (another machine's save in flight, or a killed
    save's leftover) is in no catalog: every list(), verify() and save() read the whole
    store again (on 40 checkpoints, 5 of each took 17 s where they took 5), until gc() or
    retention removed it."""
    url = f"s3://{bucket}/exp"
    store = _Counting(url)
    mgr = machine(store, tmp_path, 1)
    ids = [mgr.save(h=Holder({"w": torch.randn(1000)})) for _ in range(2)]
    elsewhere, flying, packs, manifest = a_save_elsewhere(bucket, tmp_path)
    fs = s3fs.S3FileSystem()
    fs.pipe_file(f"{bucket}/{manifest[0]}", manifest[1])  # its manifest is up, its pack not
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a save in flight is not named)
        assert mgr.list()["id"].tolist() == ids  # (read again: the new manifest)
        store.reads.clear()
        for _ in range(3):
            mgr.list()
            assert mgr.verify().ok
        ids.append(mgr.save(h=Holder({"w": torch.randn(1000)})))
        assert store.reads[manifest[0][len("exp/"):]] == 0  # (not read again)
        for key, data in packs.items():  # its last pack is up: the save is whole
            fs.pipe_file(f"{bucket}/{key}", data)
        assert mgr.list()["id"].tolist() == [*ids[:2], flying, ids[2]]
    assert torch.equal(mgr.load(flying).state["h"]["w"], elsewhere.load(flying).state["h"]["w"])


def test_a_leftover_is_read_again_once_as_it_grows_old_and_named_for_gc(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A young manifest whose pack is not up is left out as a save in flight; once older
    than the grace time, a catalog read again names it as a leftover (which gc()
    deletes): it is read again once then, not at every call."""
    monkeypatch.setattr(_store, "GRACE_SECONDS", 5.0)
    url = f"s3://{bucket}/exp"
    store = _Counting(url)
    mgr = machine(store, tmp_path, 1)
    first = mgr.save(h=Holder({"w": torch.randn(1000)}))
    _, flying, _, manifest = a_save_elsewhere(bucket, tmp_path)
    s3fs.S3FileSystem().pipe_file(f"{bucket}/{manifest[0]}", manifest[1])
    written = time.time()
    key = manifest[0][len("exp/"):]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (young: a save in flight, not named)
        assert mgr.list()["id"].tolist() == [first]
        reads = store.reads[key]
        mgr.list()
        assert store.reads[key] == reads
    time.sleep(max(0.0, written + 6.5 - time.time()))  # (S3 keeps whole seconds)
    with pytest.warns(RuntimeWarning, match=f"left out: checkpoint {flying} \\(its chunk "
                                            "\\w+ is in no pack: a killed or failed save's "
                                            "leftover, which gc\\(\\) deletes\\)"):
        assert mgr.list()["id"].tolist() == [first]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (named once)
        reads = store.reads[key]
        mgr.list()
        assert store.reads[key] == reads
        assert mgr.gc().manifests_deleted == 1


class _NetworkGoneForPacks(_Counting):
    """An S3 store whose network goes (``gone``) for packs and deletes: a save's
    manifest is up, its pack's upload fails, and so does the save's cleanup."""

    gone = False

    def _put(self, local: str, path: str, size: int) -> None:
        if self.gone and "/packs/" in path:
            raise ConnectionError("the network is gone")
        super()._put(local, path, size)

    def delete(self, key: str) -> None:
        if self.gone:
            raise StoreError(f"deleting {key} at {self.url} failed: the network is gone")
        super().delete(key)


def test_a_failed_saves_leftover_is_recorded_deleted_not_a_change_elsewhere(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save whose pack upload failed, and whose manifest could not be deleted then,
    left it in the store: the catalog was read again at every call after, and the
    warning said that the store "changed elsewhere". Its deletion is recorded in the
    store: nothing is said, nothing read again, and gc() deletes it."""
    monkeypatch.setattr(_store, "GRACE_SECONDS", 0.0)  # (old at once)
    url = f"s3://{bucket}/exp"
    store = _NetworkGoneForPacks(url)
    mgr = machine(store, tmp_path, 1)
    first = mgr.save(h=Holder({"w": torch.randn(1000)}))
    store.gone = True
    with pytest.raises(StoreError, match="saving a checkpoint failed") as failed:
        mgr.save(h=Holder({"w": torch.randn(1000)}))
    assert "recorded as deleted" not in str(failed.value)  # (recorded in the store at once)
    store.gone = False
    left = [key for key in files(bucket, "exp/manifests") if first not in key]
    assert len(left) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (not said, and not read again)
        assert mgr.list()["id"].tolist() == [first]
        reads = store.reads[left[0][len("exp/"):]]
        mgr.list()
        mgr.save(h=Holder({"w": torch.randn(1000)}))
        assert store.reads[left[0][len("exp/"):]] == reads
        assert mgr.gc().manifests_deleted == 1


def test_checkpoints_another_machine_deletes_during_a_verify_are_not_called_damaged(
        bucket: str, tmp_path: Path) -> None:
    """Another machine deleted a checkpoint while a verify here ran: verify() called it
    damaged ("its manifest is missing"), and its pack "missing from the store", where
    this catalog had not heard of the delete yet. A real damage is still said."""
    url = f"s3://{bucket}/exp"
    trainer = machine(url, tmp_path, 1, strategy="full")
    ids = [trainer.save(h=Holder({"w": torch.randn(10_000)}), step=n) for n in range(4)]
    with pytest.warns(RuntimeWarning, match="rebuilt"):  # (its cache, made)
        laptop = machine(url, tmp_path, 2)
    assert laptop.list()["id"].tolist() == ids

    def delete_meanwhile(n: int, total: int) -> None:
        if n == 1:  # (the newest read: the oldest's manifest goes before it is read)
            trainer.delete(ids[0])
        if n == total:  # (every manifest read: a pack goes before the packs are read)
            trainer.delete(ids[2])

    report = laptop.verify(progress=delete_meanwhile)
    assert report.ok, (report.bad, report.packs)
    assert report.checked == [ids[1], ids[2], ids[3]]  # (the third read before it went)
    assert laptop.list()["id"].tolist() == [ids[1], ids[3]]
    digest = laptop._manifest(ids[1])["storages"][0]["chunks"][0][0]
    pack = f"{bucket}/exp/{laptop.catalog.chunks([digest])[digest].pack}"
    fs = s3fs.S3FileSystem()
    data = bytearray(fs.cat_file(pack))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(pack, bytes(data))
    report = laptop.verify()
    assert list(report.bad) == [ids[1]] and report.checked == [ids[1], ids[3]]


class _RepliesLost(FsspecStore):
    """An S3 store whose server goes away (``gone``) with a pack upload's reply: the
    pack landed whole, but the save was told its upload failed; deletes and the
    deletion records' uploads fail while it is gone."""

    gone = False

    def _put(self, local: str, path: str, size: int) -> None:
        if self.gone and "/deleted/" in path:
            raise ConnectionError("the network is gone")
        super()._put(local, path, size)
        if self.gone and "/packs/" in path:
            raise ConnectionError("the network went with the reply")

    def delete(self, key: str) -> None:
        if self.gone:
            raise StoreError(f"deleting {key} at {self.url} failed: the network is gone")
        super().delete(key)


def test_a_save_that_failed_as_its_upload_replies_were_lost_is_never_listed(
        bucket: str, tmp_path: Path) -> None:
    """A save's pack upload landed whole, but its reply was lost as the server went
    away: the save raised "it was not saved", its files could not be deleted, and once
    the server was back the catalog read again from the store listed it as "latest";
    a catalog rebuilt elsewhere too, and retention counted it."""
    url = f"s3://{bucket}/exp"
    store = _RepliesLost(url)
    mgr = machine(store, tmp_path, 1)
    first = mgr.save(h=Holder({"w": torch.randn(1000)}))
    store.gone = True
    with pytest.raises(StoreError, match=r"not saved.*: checkpoint (\w+) is recorded as "
                                         "deleted in this catalog.*another machine") as failed:
        mgr.save(h=Holder({"w": torch.randn(1000)}))
    store.gone = False
    cid = re.search(r"checkpoint (\w+) is recorded", str(failed.value))[1]
    assert f"exp/manifests/{cid}.json.zst" in files(bucket, "exp/manifests")
    restarted = machine(url, tmp_path, 1)  # (the kernel restarted: the catalog remembers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (its files are no change elsewhere)
        assert restarted.list()["id"].tolist() == [first]
        assert restarted.resolve("latest") == first
    with pytest.warns(RuntimeWarning, match="rebuilt"):  # (another machine's cache, made)
        elsewhere = machine(url, tmp_path, 2)
    assert elsewhere.list()["id"].tolist() == [first]
    assert mgr.list()["id"].tolist() == [first] and mgr.resolve("latest") == first
    assert restarted.gc().manifests_deleted == 1
    assert list(files(bucket, "exp/manifests")) == [f"exp/manifests/{first}.json.zst"]
    assert restarted.verify().ok and elsewhere.list()["id"].tolist() == [first]


class _ThenAfterListing(FsspecStore):
    """An S3 store that runs ``then`` once, as soon as it has listed the manifests with
    their times (a catalog read again has listed the store, and reads what it lists)."""

    then: Callable[[], None] | None = None

    def modified(self, prefix: str) -> dict[str, float] | None:
        found = super().modified(prefix)
        if prefix == "manifests" and self.then is not None:
            then, self.then = self.then, None
            then()
        return found


def test_a_checkpoint_deleted_elsewhere_while_the_store_is_read_again_is_not_left_out(
        bucket: str, tmp_path: Path) -> None:
    """Another machine's retention deleted a checkpoint between a catch-up's listing
    and its reads: the warning said "left out: pack packs/... (bucket/exp/packs/...)",
    which reads as damage; and where its gc moved a chunk a kept checkpoint needs into a
    new pack, which the listing lacked, that checkpoint was left out as damaged."""
    url = f"s3://{bucket}/exp"
    trainer = machine(url, tmp_path, 1, strategy="full")
    ids = [trainer.save(h=Holder({"w": torch.randn(1000)}), step=n) for n in range(2)]
    store = _ThenAfterListing(url)
    with pytest.warns(RuntimeWarning, match="rebuilt"):  # (its cache, made)
        laptop = machine(store, tmp_path, 2)
    ids.append(trainer.save(h=Holder({"w": torch.randn(1000)}), step=2))
    store.then = lambda: trainer.delete(ids[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (nothing left out, nothing damaged)
        assert laptop.list()["id"].tolist() == ids[1:] and store.then is None
        assert laptop.verify().ok and laptop.catalog.damaged() == {}


def test_a_save_committed_while_a_reader_on_its_catalog_reads_the_store_again_stays(
        bucket: str, tmp_path: Path) -> None:
    """A reader and a saver on one catalog (the default cache on this machine): the
    reader's catch-up read the store without the lock, the saver committed a save
    meanwhile, and the reader's reseed put back the catalog as the store was before it:
    the save's row was gone from the catalog, and the reader's list() lacked it."""
    url = f"s3://{bucket}/exp"
    saver = CheckpointManager(url)
    first = saver.save(h=Holder({"w": torch.randn(1000)}))
    store = _ThenAfterListing(url)
    reader = CheckpointManager(store)
    assert reader.catalog.path == saver.catalog.path
    elsewhere = machine(url, tmp_path, 3).save(h=Holder({"w": torch.randn(1000)}))
    saved: list[str] = []
    store.then = lambda: saved.append(saver.save(h=Holder({"w": torch.randn(1000)})))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (read again: the other machine's)
        listed = reader.list()["id"].tolist()
    assert saved and saver.catalog.get(saved[0]) is not None
    assert listed == [first, elsewhere, saved[0]]


def test_a_save_a_reader_on_its_catalog_listed_before_its_commit_is_saved(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader sharing the saver's catalog (the default cache) read the store again
    without the lock once the save's manifest and pack had landed, before its commit, and
    listed it; the save's commit then failed on its own row ('UNIQUE constraint failed'),
    and the save raised 'it was not saved' though it was listed, as latest."""
    from ckpt_nb import _catalog
    from ckpt_nb._rebuild import rebuild

    url = f"s3://{bucket}/exp"
    saver = CheckpointManager(url)
    first = saver.save(h=Holder({"w": torch.randn(1000)}))
    reader = CheckpointManager(url)
    assert reader.catalog.path == saver.catalog.path
    commit = _catalog.Catalog.commit_checkpoint

    def read_first(self: _catalog.Catalog, *args: object) -> None:
        # (the reader's catch-up, at this moment: its reseed, from the store as it is)
        reader.catalog.reseed(rebuild(reader.store), reader.catalog.generation())
        commit(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_catalog.Catalog, "commit_checkpoint", read_first)
    second = saver.save(h=Holder({"w": torch.randn(1000)}))
    monkeypatch.undo()
    assert saver.list()["id"].tolist() == [first, second]
    assert reader.list()["id"].tolist() == [first, second]
    assert saver.verify().ok


def test_a_failed_saves_error_names_its_own_leftover_not_an_earlier_saves(
        bucket: str, tmp_path: Path) -> None:
    """Two saves fail in turn as the server goes away with their pack upload's reply:
    the second's error said "what reached the store of it could not be deleted:
    checkpoints A, B are recorded as deleted", A being the first save's (and, on a catalog
    that processes share, any other process's failed save was named as this one's)."""
    store = _RepliesLost(f"s3://{bucket}/exp")
    mgr = machine(store, tmp_path, 1)
    mgr.save(h=Holder({"w": torch.randn(1000)}))
    store.gone = True
    named = []
    for _ in range(2):
        with pytest.raises(StoreError, match="recorded as deleted") as failed:
            mgr.save(h=Holder({"w": torch.randn(1000)}))
        named.append(re.findall(r"checkpoints? ([\w, ]+?) (?:is|are) recorded",
                                str(failed.value))[0].split(", "))
    store.gone = False
    assert len(named[0]) == 1 and len(named[1]) == 1 and named[0] != named[1], named
    assert sorted(mgr.catalog.failed_saves()) == sorted(named[0] + named[1])
