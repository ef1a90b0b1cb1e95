"""A deletion that committed stays deleted: through a catalog read again, a catalog rebuilt
from scratch, and an object store's catalog on another machine; and a deletion SIGKILLed
at any point of its order (labels, its record, the catalog's commit, gc) leaves every
checkpoint it did not take listed and restorable bit-exact, and none listed whose files
are gone.

A deletion records itself in the store (``deleted/<hex>.json``) before the catalog forgets
its checkpoints; gc deletes their manifests, then the record. Without the record, a
catalog read again (or rebuilt) after a kill before that gc took every manifest still
there for a checkpoint: all the deleted ones came back.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import Holder

from ckpt_nb import CheckpointManager
import warm_python  # (fresh interpreters forked from a warm one)

TESTS = Path(__file__).parent

# In one process (torch imported once): saves checkpoints a0..a5 on the main branch and
# b0, b1 on a branch from a2 (so that deleting a2 joins b0, a branch's first checkpoint, to
# a1: a label's work) into ROOT/source, each holding w = its number, and writes their ids
# and parents to ROOT/ids.json. Then, for each deletion (retention keeping 7 at a save, so
# deleting a0 and a1; delete(a2)) and each point 0, 1, ...: copies the store to
# ROOT/<deletion>/<point>, and forks a child that runs the deletion there and SIGKILLs
# itself just before the point-th step of it (a store write or delete, a catalog change),
# having named each step it finished in ROOT/<deletion>/<point>.steps. The first point
# whose child ends the deletion unkilled is the last.
KILL_AT_EACH_STEP = """
import json, os, shutil, signal, sys, torch
sys.path.insert(0, sys.argv[2])
from conftest import Holder
import ckpt_nb._manager as M
from ckpt_nb import CheckpointManager
root = sys.argv[1]
torch.set_num_threads(1)
mgr = CheckpointManager(f"{root}/source")
ids = {}
for i in range(6):
    ids[f"a{i}"] = mgr.save(h=Holder({"w": torch.full((3000,), float(i))}), rng=False)
mgr.restore(ids["a2"], h=Holder({}))
for i in range(2):
    ids[f"b{i}"] = mgr.save(h=Holder({"w": torch.full((3000,), 10.0 + i)}), rng=False)
parents = {row.id: row.parent for row in mgr.catalog.checkpoints()}
mgr.close()
json.dump({"ids": ids, "parents": parents}, open(f"{root}/ids.json", "w"))
drop = M.CheckpointManager._drop
for how in ("retention", "delete"):
    for point in range(200):
        store = f"{root}/{how}/{point}"
        shutil.copytree(f"{root}/source", store)
        pid = os.fork()
        if pid == 0:
            steps = open(f"{store}.steps", "w", buffering=1)
            counting = [False, 0]
            def step(name, call):
                def wrapped(*args, **kwargs):
                    if counting[0]:
                        if counting[1] == point:
                            os.kill(os.getpid(), signal.SIGKILL)
                        counting[1] += 1
                    result = call(*args, **kwargs)
                    if counting[0]:
                        steps.write(name + "\\n")
                    return result
                return wrapped
            def counted_drop(self, *args, **kwargs):
                counting[0] = True
                drop(self, *args, **kwargs)
            M.CheckpointManager._drop = counted_drop
            mgr = CheckpointManager(store, max_to_keep=7 if how == "retention" else None)
            mgr.store.put = step("put", mgr.store.put)
            mgr.store.delete = step("delete", mgr.store.delete)
            for name in ("delete_checkpoints", "drop_chunks", "move_chunks"):
                setattr(mgr.catalog, name, step(name, getattr(mgr.catalog, name)))
            if how == "retention":
                mgr.save(h=Holder({"w": torch.full((3000,), 99.0)}), rng=False)
            else:
                mgr.delete(ids["a2"])
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) == 0:
            break
"""


def python(*args: str, env: dict[str, str] | None = None) -> None:
    """Run this interpreter on ``args``; fail with what it said, where it failed."""
    if args[0] == "-c":  # (as PYTHONWARNINGS=ignore, which a warm server of its own reads)
        args = ("-c", "import warnings; warnings.simplefilter('ignore')\n" + args[1], *args[2:])
    done = warm_python.run([sys.executable, *args], env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr


def listed(store: Path, catalog: Path | None = None) -> dict[str, str | None]:
    """Each checkpoint a manager lists, with its parent, once every one of them was
    restored bit-exact (its w is its number, 99 the killed save's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a rebuild says what it recovered)
        mgr = CheckpointManager(store, catalog=catalog)
    try:
        rows = {row.id: row.parent for row in mgr.catalog.checkpoints()}
        for cid in rows:
            w = mgr.load(cid).state["h"]["w"]
            assert w.shape == (3000,) and bool((w == w[0]).all()), cid
        return rows
    finally:
        mgr.close()


def rebuilt(store: Path, scratch: Path) -> dict[str, str | None]:
    """What a catalog rebuilt from the store alone lists (in a copy of the store)."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(store, scratch)
    for name in ("catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite-shm"):
        (scratch / name).unlink(missing_ok=True)
    return listed(scratch)


def collected_after_a_read_again(store: Path) -> dict[str, str | None]:
    """What the store lists once a gc read it again (its lock file's note emptied, as a
    Ctrl-C between its truncate and its write left it: the next lock take reads the
    store again) and collected it."""
    (store / "catalog.sqlite.lock").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with CheckpointManager(store) as mgr:
            mgr.gc()
    return listed(store)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stores each deletion left, killed at each of its steps (``KILL_AT_EACH_STEP``)."""
    root = tmp_path_factory.mktemp("killed")
    python("-c", KILL_AT_EACH_STEP, str(root), str(TESTS))
    return root


@pytest.mark.parametrize("how", ["retention", "delete"])
def test_a_deletion_killed_at_any_step_stays_made_or_unmade(killed: Path, tmp_path: Path,
                                                           how: str) -> None:
    found = json.loads((killed / "ids.json").read_text())
    ids, parents = found["ids"], found["parents"]
    going = {ids["a0"], ids["a1"]} if how == "retention" else {ids["a2"]}
    kept = set(ids.values()) - going
    points = sorted((p for p in (killed / how).iterdir() if p.name.isdigit()),
                    key=lambda p: int(p.name))
    steps = (killed / how / f"{points[-1].name}.steps").read_text().split()
    # (the children's labels, if any, and the record, then the catalog's commit)
    recorded_at = steps.index("delete_checkpoints") - 1
    for store in points:
        done = (killed / how / f"{store.name}.steps").read_text().split()
        recorded, committed = len(done) > recorded_at, len(done) > recorded_at + 1
        after_kill = listed(store)
        new = set(after_kill) - set(ids.values())  # (retention's own save)
        assert set(after_kill) == kept | new | (set() if committed else going), (store.name, done)
        # A catalog rebuilt from the store alone: the deletion is made once it is recorded,
        # whatever the catalog said; what went is not brought back, nor anything else lost.
        again = rebuilt(store, tmp_path / "scratch")
        assert set(again) == kept | new | (set() if recorded else going), (store.name, done)
        # Read again and collected: a recorded deletion stays made (completed where the
        # catalog's commit had not followed); the store then rebuilds to the same catalog,
        # parents and all (a branch's first checkpoint joined to its fork point's parent).
        collected = collected_after_a_read_again(store)
        assert collected == again, (store.name, done)
        assert rebuilt(store, tmp_path / "scratch") == collected, (store.name, done)
        if how == "delete":
            assert collected[ids["b0"]] == (ids["a1"] if recorded else ids["a2"])
        assert not list((store / "deleted").glob("*")), (store.name, done)
        shutil.rmtree(store)
    assert len(points) == len(steps) + 1 and steps[:recorded_at + 1] == ["put"] * (
        recorded_at + 1) and recorded_at == (how == "delete"), steps
    assert parents[ids["b0"]] == ids["a2"]


# Saves with max_to_keep=2 into STORE (catalog= CATALOG), SIGKILLed as its retention's gc
# starts: the deletion is committed, the deleted checkpoints' manifests still there.
KILLED_BEFORE_ITS_GC = """
import os, signal, sys, torch
sys.path.insert(0, sys.argv[3])
from conftest import Holder
import ckpt_nb._manager as M
M.CheckpointManager._gc_locked = lambda *_, **__: os.kill(os.getpid(), signal.SIGKILL)
M.CheckpointManager(sys.argv[1], catalog=sys.argv[2] or None, max_to_keep=2).save(
    h=Holder({"w": torch.full((3000,), 99.0)}), rng=False)
"""


def kill_before_its_gc(store: str, catalog: Path | None = None) -> None:
    done = warm_python.run([sys.executable, "-c", KILLED_BEFORE_ITS_GC, store,
                           str(catalog or ""), str(TESTS)])
    assert done.returncode == -9, done.stderr


def test_retention_killed_before_its_gc_stays_made_when_read_again(tmp_path: Path) -> None:
    """The tester's case: 30 saves, then retention keeping 5 killed after its commit; the
    lock file's note emptied (the next lock take reads the store again), gc listed 31.
    Or the catalog deleted, the README's recovery: "31 checkpoints recovered"."""
    store = tmp_path / "store"
    with CheckpointManager(store) as mgr:
        for i in range(6):
            mgr.save(h=Holder({"w": torch.full((3000,), float(i))}), rng=False)
    kill_before_its_gc(str(store))
    kept = listed(store)
    assert len(kept) == 2
    assert rebuilt(store, tmp_path / "scratch") == kept
    assert collected_after_a_read_again(store) == kept
    assert not list((store / "deleted").iterdir())
    assert len(list((store / "manifests").iterdir())) == 2


def test_a_deletion_on_an_object_store_stays_made_on_another_machine(
        bucket: str, tmp_path: Path) -> None:
    """Another machine's catalog (a cache of its own) is rebuilt from the store: a
    retention killed before its gc left the deleted checkpoints' manifests there."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    url = f"s3://{bucket}/exp"
    here, there = tmp_path / "here" / "catalog.sqlite", tmp_path / "there" / "catalog.sqlite"
    with CheckpointManager(url, catalog=here) as mgr:
        for i in range(4):
            mgr.save(h=Holder({"w": torch.full((3000,), float(i))}), rng=False)
    kill_before_its_gc(url, here)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with CheckpointManager(url, catalog=there) as elsewhere:
            assert len(elsewhere.catalog.checkpoints()) == 2
            with CheckpointManager(url, catalog=here) as mgr:
                kept = [row.id for row in mgr.catalog.checkpoints()]
                assert len(kept) == 2 and mgr.gc().manifests_deleted == 3
            elsewhere.gc()  # (read again: nothing changed but what gc deleted)
            assert [row.id for row in elsewhere.catalog.checkpoints()] == kept
            assert not list(elsewhere.store.list("deleted"))


def test_a_pin_withdraws_a_deletion_cut_short_before_its_commit(tmp_path: Path) -> None:
    """A deletion killed between its record and the catalog's commit leaves its
    checkpoints listed: gc would complete it, unless one of them was pinned since (a
    later wish); its record then goes, so no rebuild takes the pinned checkpoint."""
    store = tmp_path / "store"
    with CheckpointManager(store) as mgr:
        first = mgr.save(h=Holder({"w": torch.zeros(3000)}), rng=False)
        mgr.save(h=Holder({"w": torch.ones(3000)}), rng=False)
    done = warm_python.run([sys.executable, "-c", f"""
import os, signal
import ckpt_nb._catalog as C
C.Catalog.delete_checkpoints = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
from ckpt_nb import CheckpointManager
CheckpointManager({str(store)!r}).delete({first!r})
"""])
    assert done.returncode == -9, done.stderr
    assert len(list((store / "deleted").iterdir())) == 1 and first in listed(store)
    with CheckpointManager(store) as mgr:
        mgr.pin(first)
        mgr.gc()
    assert first in listed(store) and first in rebuilt(store, tmp_path / "scratch")
    assert not list((store / "deleted").iterdir())


def test_a_pin_given_where_records_are_not_read_wins_over_the_record(tmp_path: Path) -> None:
    """A pin given without withdrawing the record (by a ckpt_nb that reads no records,
    in a catalog it rebuilt, or by ``ckpt-nb pin`` of one already pinned) was overruled:
    gc completed the deletion and deleted the pinned checkpoint. A deletion unpins what
    it deletes before its record, so a record naming a pinned one is older than the pin:
    gc withdraws it, a read-again and a rebuild keep the checkpoint."""
    store = tmp_path / "store"
    with CheckpointManager(store) as mgr:
        first = mgr.save(h=Holder({"w": torch.zeros(3000)}), rng=False)
        mgr.save(h=Holder({"w": torch.ones(3000)}), rng=False)
        mgr.pin(first)
    done = warm_python.run([sys.executable, "-c", f"""
import os, signal
import ckpt_nb._catalog as C
C.Catalog.delete_checkpoints = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
from ckpt_nb import CheckpointManager
CheckpointManager({str(store)!r}).delete({first!r}, force=True)
"""])
    assert done.returncode == -9, done.stderr
    assert json.loads((store / "labels" / f"{first}.json").read_text())["pinned"] is False
    # (pinned as an older ckpt_nb pins: the label and the catalog, the record left)
    (store / "labels" / f"{first}.json").write_text(
        json.dumps({"pinned": True, "note": "", "parent": None}))
    with CheckpointManager(store) as mgr:
        mgr.catalog.update(first, pinned=True)
        assert rebuilt(store, tmp_path / "scratch") == listed(store)
        mgr.gc()
    assert first in listed(store) and not list((store / "deleted").iterdir())


def test_a_deletion_that_fails_as_its_record_is_written_is_undone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record's write that fails after its file is in place (the folder's fsync: EIO,
    a Ctrl-C) raised, and the record stayed: the checkpoint the user was told was not
    deleted went at the next gc. The record goes, and the pin a forced delete took off
    comes back."""
    import ckpt_nb._store as store_module

    store = tmp_path / "store"
    mgr = CheckpointManager(store)
    first = mgr.save(h=Holder({"w": torch.zeros(3000)}), rng=False)
    mgr.save(h=Holder({"w": torch.ones(3000)}), rng=False)
    mgr.pin(first)
    fsync_dir = store_module._fsync_dir

    def failing(path: Path) -> None:
        fsync_dir(path)
        if Path(path).name == "deleted":
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(store_module, "_fsync_dir", failing)
    with pytest.raises(OSError, match="Input/output error"):
        mgr.delete(first, force=True)
    monkeypatch.undo()
    assert not list((store / "deleted").iterdir())
    assert mgr.catalog.get(first).pinned
    mgr.gc()
    mgr.close()
    assert first in listed(store) and first in rebuilt(store, tmp_path / "scratch")


def test_a_forced_delete_whose_record_can_be_neither_kept_nor_deleted_keeps_its_pin(
        tmp_path: Path) -> None:
    """An object store's outage: the record's put raises after its object is stored,
    and its delete fails too. The pin came back only after the record's delete, so it
    stayed off, and the next gc completed the deletion the user was told had failed. The
    pin comes back first: it withdraws the record that could not be deleted."""
    store = tmp_path / "store"
    mgr = CheckpointManager(store)
    first = mgr.save(h=Holder({"w": torch.zeros(3000)}), rng=False)
    mgr.save(h=Holder({"w": torch.ones(3000)}), rng=False)
    mgr.pin(first)
    put, delete = mgr.store.put, mgr.store.delete

    def put_then_fail(key: str, data: bytes) -> None:
        put(key, data)
        if key.startswith("deleted/"):
            raise ConnectionResetError("connection reset after the write")

    def failing_delete(key: str) -> None:
        if key.startswith("deleted/"):
            raise ConnectionResetError("connection reset")
        delete(key)

    mgr.store.put, mgr.store.delete = put_then_fail, failing_delete  # type: ignore[method-assign]
    with pytest.raises(ConnectionResetError):
        mgr.delete(first, force=True)
    mgr.store.put, mgr.store.delete = put, delete  # type: ignore[method-assign]
    assert len(list((store / "deleted").iterdir())) == 1 and mgr.catalog.get(first).pinned
    mgr.gc()
    mgr.close()
    assert first in listed(store) and first in rebuilt(store, tmp_path / "scratch")


def test_a_deletion_completed_by_gc_labels_the_branch_its_checkpoint_began(
        tmp_path: Path) -> None:
    """A deletion cut short before its commit is completed by a later gc; a branch saved
    from its checkpoint meanwhile got no label for its new parent, and a rebuilt catalog
    made the branch's first checkpoint a root."""
    store = tmp_path / "store"
    with CheckpointManager(store) as mgr:
        ids = [mgr.save(h=Holder({"w": torch.full((3000,), float(i))}), rng=False)
               for i in range(4)]
    done = warm_python.run([sys.executable, "-c", f"""
import os, signal
import ckpt_nb._catalog as C
C.Catalog.delete_checkpoints = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
from ckpt_nb import CheckpointManager
CheckpointManager({str(store)!r}).delete({ids[1]!r})
"""])
    assert done.returncode == -9, done.stderr
    with CheckpointManager(store) as mgr:
        mgr.restore(ids[1], h=Holder({}))
        branch = mgr.save(h=Holder({"w": torch.full((3000,), 10.0)}), rng=False)
        mgr.delete(ids[3])  # (completes the deletion of ids[1] too: its record waits)
        assert mgr.catalog.get(branch).parent == ids[0]
    assert ids[1] not in listed(store)
    assert rebuilt(store, tmp_path / "scratch")[branch] == ids[0]


def test_a_deletion_record_that_does_not_read_deletes_nothing(tmp_path: Path) -> None:
    """A record ckpt_nb did not write whole (a hand's, a damaged copy) is named by a
    rebuild, which lists every checkpoint, and gc leaves it; a file of another name
    under deleted/ is no record."""
    store = tmp_path / "store"
    with CheckpointManager(store) as mgr:
        cid = mgr.save(h=Holder({"w": torch.zeros(3000)}), rng=False)
    (store / "deleted").mkdir()
    bad = store / "deleted" / f"{'0' * 32}.json"
    bad.write_text('{"ids": "' + cid + '"}')
    (store / "deleted" / "notes.txt").write_text(json.dumps({"ids": [cid]}))
    (store / "catalog.sqlite").unlink()
    with pytest.warns(RuntimeWarning, match=f"deleted/{'0' * 32}.json"):
        mgr = CheckpointManager(store)
    with mgr:
        assert [row.id for row in mgr.catalog.checkpoints()] == [cid]
        mgr.gc()
    assert bad.exists() and (store / "deleted" / "notes.txt").exists()


# Saves once into STORE, then for each point 0, 1, ...: forks a child whose gc is
# SIGKILLed just before the point-th call into C (a write, a truncate, ...) that the lock
# file's note writer makes, and copies the lock file it left to STORE/notes/<point>.
# The first point whose child ends unkilled is the last.
NOTE_KILLED = """
import os, shutil, signal, sys, torch
sys.path.insert(0, sys.argv[2])
from conftest import Holder
import ckpt_nb._manager as M
from ckpt_nb import CheckpointManager
store = sys.argv[1]
with CheckpointManager(store) as mgr:
    mgr.save(h=Holder({"w": torch.zeros(3000)}), rng=False)
os.mkdir(f"{store}/notes")
for point in range(100):
    pid = os.fork()
    if pid == 0:
        calls = [0]
        def profile(frame, event, arg):
            if event == "c_call" and frame.f_code is M.CheckpointManager._note_holder.__code__:
                if calls[0] == point:
                    shutil.copy(f"{store}/catalog.sqlite.lock", f"{store}/notes/{point}")
                    os.kill(os.getpid(), signal.SIGKILL)
                calls[0] += 1
        mgr = CheckpointManager(store)
        sys.setprofile(profile)
        mgr.gc()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        break
"""


def test_the_lock_files_note_is_never_empty(tmp_path: Path) -> None:
    """It was cut to nothing, then written: a Ctrl-C (or a kill) between the two left it
    empty, which the next lock take read as another catalog's write, and it read the
    whole store again (a 1000-checkpoint store's minutes)."""
    store = tmp_path / "store"
    python("-c", NOTE_KILLED, str(store), str(TESTS))
    notes = list((store / "notes").iterdir())
    assert len(notes) >= 4  # (a note before the gc's body and one after, each a few calls)
    for note in notes:
        words = note.read_text().split()
        assert len(words) >= 2 and words[0].isdigit() and "@" in words[1], note.name
