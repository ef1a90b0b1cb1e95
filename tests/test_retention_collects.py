"""A save's retention collects what the checkpoints it deletes leave, not the whole store:
it ran a whole-store gc per deletion (every pack sized, every manifest and label listed:
a save deleting one of 800 checkpoints took 0.07 s of CPU, one deleting none 0.02 s; now
0.025 s). What it leaves is all gc() would free of them, each kept checkpoint whole, its
delta bases too."""

from __future__ import annotations

import collections
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Holder

from ckpt_nb import CheckpointManager
from ckpt_nb._format import id_of
import warm_python  # (fresh interpreters forked from a warm one)

STORE_CALLS = ("list", "modified", "size", "has", "get", "put", "delete", "writer")


def counting(mgr: CheckpointManager) -> collections.Counter[str]:
    """The calls the manager's store (and its catalog's reads of all chunks) take from
    now on, by name: the real store's, each counted."""
    calls: collections.Counter[str] = collections.Counter()

    def counted(name: str, call: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return call(*args, **kwargs)
        return wrapped

    for name in STORE_CALLS:
        setattr(mgr.store, name, counted(name, getattr(mgr.store, name)))
    for name in ("all_chunks", "packs"):
        setattr(mgr.catalog, name, counted(name, getattr(mgr.catalog, name)))
    return calls


def store_calls_of_a_retention_save(path: Path, saved: int) -> collections.Counter[str]:
    """The store's calls (and the catalog's reads of all chunks) made by a save whose
    retention deletes one checkpoint, in a store of ``saved`` checkpoints."""
    with CheckpointManager(path, max_to_keep=saved) as mgr:
        for i in range(saved):
            mgr.save(h=Holder({"w": torch.full((100,), float(i))}), rng=False)
    with CheckpointManager(path, max_to_keep=saved) as mgr:
        mgr.save(h=Holder({"w": torch.full((100,), -1.0)}), rng=False)  # (opened, caught up)
        calls = counting(mgr)
        mgr.save(h=Holder({"w": torch.full((100,), -2.0)}), rng=False)
        assert len(mgr.list()) == saved
    return calls


def test_a_retention_save_asks_the_store_as_much_whatever_its_size(tmp_path: Path) -> None:
    small = store_calls_of_a_retention_save(tmp_path / "small", 5)
    large = store_calls_of_a_retention_save(tmp_path / "large", 60)
    assert small == large
    assert small["all_chunks"] == small["packs"] == small["list"] == 0
    assert small["delete"] >= 3  # (its manifest, its label, the deletion's record, its pack)


def store_calls_of_a_delete(path: Path, saved: int, deleting: int) -> collections.Counter[str]:
    """The store's calls (and the catalog's reads of all chunks) made by one ``delete()``
    of ``deleting`` checkpoints in the middle of a store of ``saved``."""
    with CheckpointManager(path) as mgr:
        ids = [mgr.save(h=Holder({"w": torch.full((100,), float(i))}), rng=False)
               for i in range(saved)]
    with CheckpointManager(path) as mgr:
        mgr.list()  # (opened, caught up)
        calls = counting(mgr)
        middle = ids[2:2 + deleting]
        assert mgr.delete(*middle) == (middle if deleting > 1 else middle[0])
        assert list(mgr.list()["id"]) == [cid for cid in ids if cid not in middle]
    return calls


def test_a_delete_asks_the_store_as_much_whatever_its_size(tmp_path: Path) -> None:
    """delete() collected the whole store (every pack and manifest listed, each
    checkpoint's label read: 234 ms a deletion in a store of 2,000); it collects what the
    deleted checkpoints leave, as retention does, and gc() the rest."""
    small = store_calls_of_a_delete(tmp_path / "small", 5, 1)
    large = store_calls_of_a_delete(tmp_path / "large", 60, 1)
    assert small == large
    assert small["all_chunks"] == small["packs"] == small["modified"] == 0
    assert small["list"] == 1  # (deleted/: a deletion cut short, which it would complete)
    assert small["delete"] >= 3  # (its manifest, its label, the deletion's record, its pack)
    with CheckpointManager(tmp_path / "large") as mgr:
        assert mgr.verify().ok and mgr.gc().bytes_freed == 0  # (it left nothing to collect)


def test_several_deleted_in_one_call_ask_the_store_once_for_all(tmp_path: Path) -> None:
    one = store_calls_of_a_delete(tmp_path / "one", 60, 1)
    ten = store_calls_of_a_delete(tmp_path / "ten", 60, 10)
    assert ten["list"] == 1 and ten["modified"] == 0  # (deleted/ alone)
    assert ten["put"] == one["put"]  # (one record of the deletion)
    with CheckpointManager(tmp_path / "ten") as mgr:
        assert mgr.verify().ok and mgr.gc().bytes_freed == 0
        for i, cid in enumerate(mgr.list()["id"]):
            w = mgr.load(cid).state["h"]["w"]
            assert torch.equal(w, torch.full((100,), float(i if i < 2 else i + 10)))


def test_a_delete_of_several_with_one_pinned_or_unknown_deletes_none(tmp_path: Path) -> None:
    from ckpt_nb import CheckpointInUseError, CheckpointNotFoundError

    with CheckpointManager(tmp_path) as mgr:
        ids = [mgr.save(h=Holder({"w": torch.full((10,), float(i))}), rng=False)
               for i in range(4)]
        mgr.pin(ids[2])
        with pytest.raises(CheckpointInUseError, match=f"{ids[2]} is pinned.*nothing was"):
            mgr.delete(ids[1], ids[2])
        with pytest.raises(CheckpointNotFoundError):
            mgr.delete(ids[1], "nosuchid")
        assert list(mgr.list()["id"]) == ids
        assert mgr.delete(ids[1], ids[2], "latest", ids[1], force=True) == [ids[1], ids[2], ids[3]]
        assert list(mgr.list()["id"]) == ids[:1]


# In one process: 12 incremental saves (deltas stacked 11 deep, full_every=20) into
# ROOT/source, their states in ROOT/expected.pt; then, for each point 0, 1, ...: a copy of
# the store in ROOT/<point>, and a child that saves once more there with max_to_keep=2 and
# SIGKILLs itself just before the point-th step of that retention's collection (a store
# write or delete, a pack written, a catalog change): its kept chunk, stacked on the 11
# deleted deltas, is stored whole, and those go. The first point whose child ends is last.
KILL_IN_THE_COLLECTION = """
import os, shutil, signal, sys, torch
import ckpt_nb._manager as M
from ckpt_nb import CheckpointManager
root = sys.argv[1]
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Linear(128, 128)
expected = {}
with CheckpointManager(f"{root}/source", strategy="incremental", full_every=20,
                       chunk_size=4096) as mgr:
    for step in range(13):
        with torch.no_grad():
            model.weight[:, step] += 1
        if step < 12:
            cid = mgr.save(m=model, rng=False)
        expected[cid if step < 12 else "last"] = {
            k: v.clone() for k, v in model.state_dict().items()}
torch.save(expected, f"{root}/expected.pt")
collect = M.CheckpointManager._collect_dropped
for point in range(300):
    store = f"{root}/{point}"
    shutil.copytree(f"{root}/source", store)
    pid = os.fork()
    if pid == 0:
        counting = [False, 0]
        def step(call):
            def wrapped(*args, **kwargs):
                if counting[0]:
                    if counting[1] == point:
                        os.kill(os.getpid(), signal.SIGKILL)
                    counting[1] += 1
                return call(*args, **kwargs)
            return wrapped
        def counted_collect(self, *args, **kwargs):
            counting[0] = True
            return collect(self, *args, **kwargs)
        M.CheckpointManager._collect_dropped = counted_collect
        mgr = CheckpointManager(store, max_to_keep=2, strategy="incremental", full_every=20,
                                chunk_size=4096)
        for name in ("put", "delete", "writer"):
            setattr(mgr.store, name, step(getattr(mgr.store, name)))
        for name in ("drop_chunks", "move_chunks"):
            setattr(mgr.catalog, name, step(getattr(mgr.catalog, name)))
        mgr.restore("latest", m=torch.nn.Linear(128, 128))
        mgr.save(m=model, rng=False)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        break
"""


def test_a_retention_killed_at_any_step_of_its_collection_loses_nothing_kept(
        tmp_path: Path) -> None:
    """Each store a kill left lists the newest two, each whole; gc() then leaves only
    their files."""
    done = warm_python.run([sys.executable, "-c", KILL_IN_THE_COLLECTION, str(tmp_path)])
    assert done.returncode == 0, done.stderr
    expected = torch.load(tmp_path / "expected.pt")
    points = sorted((p for p in tmp_path.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    assert len(points) > 10  # (its manifests, labels, record, the whole pack, the packs)
    for store in points:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a read again says what it found)
            mgr = CheckpointManager(store)
        with mgr:
            listed = list(mgr.list()["id"])
            assert len(listed) == 2 and listed[0] == list(expected)[-2], store.name
            for cid, want in zip(listed, (expected[listed[0]], expected["last"])):
                got = mgr.load(cid).state["m"]
                assert all(torch.equal(got[k], v) for k, v in want.items()), store.name
            mgr.gc()
            assert mgr.verify().ok, store.name
            assert set(mgr.store.list("packs")) == mgr.catalog.packs(), store.name
            assert {id_of(key) for key in mgr.store.list("manifests")} == set(listed)
            assert not list(mgr.store.list("deleted")), store.name
        shutil.rmtree(store)


def weights(mgr: CheckpointManager, cid: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in mgr.load(cid).state["m"].items()}


@pytest.mark.parametrize("strategy, full_every", [("full", 4), ("incremental", 4),
                                                 ("differential", 4), ("incremental", 20)])
def test_retention_leaves_gc_nothing_and_every_kept_checkpoint_whole(
        tmp_path: Path, strategy: str, full_every: int) -> None:
    """Deltas on chunks that only deleted checkpoints referred to stay while a kept one
    needs them (a branch, a pin, a frozen layer shared by all), and go with the last; a
    long ``full_every`` has its kept chunks stacked on many deleted deltas stored whole."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(128, 128))
    model[0].requires_grad_(False)  # (a frozen layer: chunks every checkpoint shares)
    saved: dict[str, dict[str, torch.Tensor]] = {}
    on_deleted_bases = 0  # (saves after which a kept delta's base is no kept one's chunk)
    with CheckpointManager(tmp_path, max_to_keep=3, strategy=strategy, full_every=full_every,
                           chunk_size=4096) as mgr:
        for step in range(30):
            if step == 12:  # a branch from two checkpoints back
                mgr.restore(list(mgr.list()["id"])[-2], m=model)
            with torch.no_grad():
                model[1].weight[:, step % 128] += 1
            cid = mgr.save(m=model, step=step, rng=False)
            saved[cid] = {k: v.clone() for k, v in model.state_dict().items()}
            if step == 7:
                mgr.pin(cid)
            kept = list(mgr.list()["id"])
            assert cid in kept and len(kept) <= 4  # (the newest three, and the pinned one)
            for kept_id in kept:
                assert all(torch.equal(weights(mgr, kept_id)[k], v)
                           for k, v in saved[kept_id].items()), (step, kept_id)
            refs = mgr.catalog.refs()
            bases = {row.base for row in mgr.catalog.chunks(refs).values()}
            on_deleted_bases += bool(bases - refs - {None})
        assert on_deleted_bases > 10 or strategy == "full"
        report = mgr.gc()
        assert (report.chunks_dropped, report.packs_deleted, report.manifests_deleted,
                report.chunks_rewritten, report.bytes_freed) == (0, 0, 0, 0, 0), report
        assert mgr.verify().ok
        manifests = {p.name.split(".")[0] for p in (tmp_path / "manifests").iterdir()}
        assert manifests == set(mgr.list()["id"])
        assert not list((tmp_path / "deleted").iterdir())


def test_a_kept_chunk_on_bases_only_kept_for_it_is_stored_whole(tmp_path: Path) -> None:
    """A pinned checkpoint's chunk stacked, through bases no checkpoint refers to any
    more (its parent went at an earlier save), on the deltas that a later retention
    deletes: that retention left the chain (depth 10) for gc(), which then freed 68% of
    the store (review)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 128)

    def step(mgr: CheckpointManager, i: int) -> str:
        with torch.no_grad():
            model.weight[:, i % 128] += 1
        return mgr.save(m=model, step=i, rng=False)

    with CheckpointManager(tmp_path, strategy="incremental", full_every=100,
                           chunk_size=4096) as mgr:
        ids = [step(mgr, i) for i in range(9)]  # one chain of deltas
        mgr.pin(ids[8])
        mgr.max_to_keep = 1
        step(mgr, 9)  # (the first eight go)
        kept = step(mgr, 10)  # (its parent goes)
        mgr.pin(kept)
        mgr.restore(ids[8], m=model)
        step(mgr, 11)  # (a branch from the pinned one)
        mgr.unpin(ids[8])
        step(mgr, 12)  # (its retention deletes the branch and the one unpinned)
        assert max(c.depth for c in mgr.catalog.all_chunks()) <= 8
        report = mgr.gc()
        assert (report.chunks_dropped, report.bytes_freed, report.chunks_rewritten) == (0, 0, 0)
        assert mgr.verify().ok


class _DeleteFailsOnce:
    """A store whose next delete fails as a server that stopped answering would."""

    def __init__(self, store: Any) -> None:
        self.store, self.failing = store, False

    def delete(self, key: str) -> None:
        if self.failing:
            self.failing = False
            from ckpt_nb import StoreError
            raise StoreError("the server stopped answering (the test's)")
        self.store.delete(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_what_a_failed_collection_left_goes_at_the_next_deleting_save(tmp_path: Path
                                                                       ) -> None:
    """The warning said retention "runs again at the next save", but a save's retention
    collects only what its own deletions leave: the failed one's manifest, record and
    chunks stayed until gc() (review)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 128)
    with CheckpointManager(tmp_path, max_to_keep=2, strategy="full", chunk_size=4096) as mgr:
        for i in range(3):
            with torch.no_grad():
                model.weight[:, i] += 1
            mgr.save(m=model, rng=False)
        mgr.store = _DeleteFailsOnce(mgr.store)
        mgr.store.failing = True
        with torch.no_grad():
            model.weight[:, 9] += 1
        with pytest.warns(RuntimeWarning, match="retention failed .*it runs again at the "
                          "next save, which frees what this one left"):
            mgr.save(m=model, rng=False)
        mgr.store = mgr.store.store
        with torch.no_grad():
            model.weight[:, 10] += 1
        mgr.save(m=model, rng=False)
        listed = set(mgr.list()["id"])
        assert {id_of(k) for k in mgr.store.list("manifests")} == listed
        assert not list(mgr.store.list("deleted"))
        report = mgr.gc()
        assert (report.chunks_dropped, report.bytes_freed) == (0, 0)


def test_a_deletion_record_gc_keeps_makes_no_delete_collect_the_whole_store(
        tmp_path: Path) -> None:
    """A record that does not read stays after gc (it deletes nothing); every delete()
    then took it for a deletion cut short and collected the whole store."""
    path = tmp_path / "store"
    with CheckpointManager(path) as mgr:
        ids = [mgr.save(h=Holder({"w": torch.full((100,), float(i))}), rng=False)
               for i in range(5)]
    (path / "deleted").mkdir(exist_ok=True)
    (path / "deleted" / f"{'0' * 32}.json").write_text("{cut short")
    with CheckpointManager(path) as mgr:
        mgr.gc()
        calls = counting(mgr)
        mgr.delete(ids[2])
        assert list(mgr.list()["id"]) == ids[:2] + ids[3:]
    assert calls["packs"] == calls["all_chunks"] == 0, calls


def test_a_deletion_stopped_after_its_manifests_went_completes_at_the_next_delete(
        tmp_path: Path) -> None:
    """Stopped after it deleted its checkpoint's manifest, before its record went: the
    record names no checkpoint listed or with a manifest, so the next delete() took it
    for one gc keeps, and the deleted checkpoint's chunks stayed until a gc()."""
    path = tmp_path / "store"
    with CheckpointManager(path) as mgr:
        ids = [mgr.save(h=Holder({"w": torch.randn(20000)}), rng=False) for _ in range(5)]
    mgr = CheckpointManager(path)
    real = mgr.store.delete

    def delete(key: str, *args: Any, **kwargs: Any) -> Any:
        if key.startswith("deleted/"):
            raise KeyboardInterrupt  # (as its record goes)
        return real(key, *args, **kwargs)

    mgr.store.delete = delete  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt), mgr:
        mgr.delete(ids[1])
    assert list(mgr.store.list("deleted"))
    with CheckpointManager(path) as mgr:
        mgr.delete(ids[3])
        assert list(mgr.list()["id"]) == [ids[0], ids[2], ids[4]]
        assert not list(mgr.store.list("deleted"))
        assert mgr.gc().bytes_freed == 0


def test_a_save_under_its_keep_reads_no_row_of_the_catalog(tmp_path: Path) -> None:
    """Each save's retention decoded every row of the catalog, though a store holding
    no more than max_to_keep has none to delete: 40 ms a save at 500 checkpoints under a
    notebook's --keep 1000. Past the keep, retention deletes the oldest, as before."""
    with CheckpointManager(tmp_path, max_to_keep=4) as mgr:
        ids = [mgr.save(h=Holder({"w": torch.full((100,), 0.0)}), rng=False)]  # (caught up)
        listed = collections.Counter[str]()
        every_row = mgr.catalog.checkpoints

        def counted() -> Any:
            listed["checkpoints"] += 1
            return every_row()

        mgr.catalog.checkpoints = counted  # type: ignore[method-assign]
        ids += [mgr.save(h=Holder({"w": torch.full((100,), float(i))}), rng=False)
                for i in range(1, 4)]
        assert listed["checkpoints"] == 0
        ids.append(mgr.save(h=Holder({"w": torch.full((100,), 4.0)}), rng=False))
        assert listed["checkpoints"] >= 1
        assert list(mgr.list()["id"]) == ids[1:]
