"""Several processes on one local store: a catalog deleted or kept elsewhere, a lock file
deleted, retention in one process under a restore in another, close() under a save. Each
test runs the other side as a real process (or thread) against real SQLite."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import collects_cycles, stderr_once_said

from ckpt_nb import CheckpointManager, MemoryStore, StoreError
from ckpt_nb.cli import main
import warm_python  # (fresh interpreters forked from a warm one)


def python(code: str, *, stdin: int | None = None) -> subprocess.Popen[str]:
    """``code`` run by another Python process, its output piped."""
    return warm_python.Popen([sys.executable, "-c", textwrap.dedent(code)], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ids_saved_by(code: str) -> list[str]:
    """The ids another process prints, one a line, once it has run ``code``."""
    out, err = python(code).communicate(timeout=120)
    assert err.count("Error") == 0, err
    return out.split()


def every_one_loads(store: Path, ids: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a rebuild's warning)
        with CheckpointManager(store) as fresh:
            for cid in ids:
                fresh.load(cid)


def test_a_catalog_deleted_under_a_manager_is_opened_again_rebuilt(tmp_path: Path) -> None:
    """The README fixes a bad catalog by deleting it: a manager that had it open went on
    saving into the deleted file, and its gc deleted what a manager on the rebuilt
    catalog saved."""
    store = tmp_path / "store"
    model = torch.nn.Linear(64, 64)
    first = CheckpointManager(store)
    ids = [first.save(model, epoch=epoch) for epoch in range(2)]
    deleted = first.catalog
    for path in store.glob("catalog.sqlite*"):
        if path.suffix != ".lock":
            path.unlink()
    ids += ids_saved_by(f"""
        import torch, warnings
        from ckpt_nb import CheckpointManager
        warnings.simplefilter("ignore")  # (the rebuild's)
        with CheckpointManager({str(store)!r}) as mgr:
            model = torch.nn.Linear(64, 64)
            print(mgr.save(model, epoch=0), mgr.save(model, epoch=1))
        """)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ids.append(first.save(model, epoch=2))
        report = first.gc()
    assert first.catalog is not deleted
    first.close()
    with pytest.raises(StoreError, match="closed"):  # (with its manager, not left open)
        deleted.checkpoints()
    assert report.manifests_deleted == report.packs_deleted == 0
    every_one_loads(store, ids)


def test_gc_beside_the_store_keeps_what_a_catalog_elsewhere_saved(tmp_path: Path) -> None:
    """A run with ``catalog=`` elsewhere and ``ckpt-nb gc DIR``, whose catalog is the one
    beside the store: two locks, and the second gc deleted the run's newer checkpoints."""
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere" / "catalog.sqlite"
    model = torch.nn.Linear(64, 64)
    gc = [sys.executable, "-m", "ckpt_nb", "gc", str(store)]
    with CheckpointManager(store, catalog=elsewhere) as run:
        ids = [run.save(model, epoch=0)]
        warm_python.run(gc, check=True, timeout=120)
        for epoch in (1, 2):
            with torch.no_grad():
                model.weight.add_(1)
            ids.append(run.save(model, epoch=epoch))
        done = warm_python.run(gc, check=True, timeout=120)
        assert "0 packs deleted" in done.stdout and "0 manifests deleted" in done.stdout
        assert torch.equal(run.load(ids[-1]).state["model"]["weight"], model.weight)
    every_one_loads(store, ids)


def test_a_deleted_lock_file_lets_no_second_writer_in(tmp_path: Path) -> None:
    """Deleting catalog.sqlite.lock (a cleanup of stray lock files) while a gc held it
    let another process's save in at once: the store's folder is locked too."""
    store = tmp_path / "store"
    CheckpointManager(store).save(torch.nn.Linear(8, 8))
    holder = python(f"""
        import sys
        from ckpt_nb import CheckpointManager
        def hold(done, total):
            if done == 0:
                print("holding", flush=True)
                sys.stdin.readline()
        with CheckpointManager({str(store)!r}) as mgr:
            mgr.gc(progress=hold)
        """, stdin=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "holding"
    (store / "catalog.sqlite.lock").unlink()
    writer = python(f"""
        import torch
        from ckpt_nb import CheckpointManager
        with CheckpointManager({str(store)!r}) as mgr:
            print(mgr.save(torch.nn.Linear(8, 8)))
        """)
    assert writer.stderr is not None
    try:
        said = ""
        while "waiting for" not in said:  # (it says so once it has waited a second)
            line = writer.stderr.readline()
            assert line, "the second writer got in while the gc held the lock"
            said += line
        assert writer.poll() is None
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(60)
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    every_one_loads(store, out.split())


@contextlib.contextmanager
def another_process_keeping_one(store: Path) -> Iterator[None]:
    """Another process saving to ``store`` over and over with max_to_keep=1, each save's
    retention deleting the checkpoint before it (its pack too: the weights change)."""
    CheckpointManager(store).save(torch.nn.Linear(64, 64))
    saver = python(f"""
        import time, torch
        from ckpt_nb import CheckpointManager
        model = torch.nn.Linear(64, 64)
        with CheckpointManager({str(store)!r}, max_to_keep=1) as mgr:
            for epoch in range(1000):
                with torch.no_grad():
                    model.weight.add_(1)
                mgr.save(model, epoch=epoch)
                print("saved", flush=True)
                time.sleep(0.05)
        """)
    assert saver.stdout is not None
    try:
        assert saver.stdout.readline().strip() == "saved"
        yield
    finally:
        saver.kill()
        saver.wait()


def slowed(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The manager's real method ``name``, run late, as a large model's or a slow disk's
    read is: once the other process has saved twice more (its retention has deleted
    what was the newest), or half a second at most (where nothing can be saved: under
    the store's lock, which the reader may hold)."""
    method = getattr(CheckpointManager, name)

    def late(self: CheckpointManager, *args: Any, **kwargs: Any) -> Any:
        saved, deadline = self.catalog.counts()[0], time.monotonic() + 0.5
        while self.catalog.counts()[0] < saved + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        return method(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointManager, name, late)


def test_latest_outrun_by_another_process_retention_is_read_under_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process's retention deleted each checkpoint a slow restore("latest")
    picked, three rounds over: a healthy store was called corrupt."""
    slowed(monkeypatch, "_decode_rows")
    store = tmp_path / "store"
    with another_process_keeping_one(store), CheckpointManager(store) as reader, \
            warnings.catch_warnings():
        warnings.simplefilter("error")  # (no checkpoint is skipped as damaged)
        restored = reader.restore("latest", model=torch.nn.Linear(64, 64))
    assert restored.epoch is not None


def test_show_latest_outrun_by_another_process_retention_shows_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`ckpt-nb show latest` verified each checkpoint in turn, each deleted meanwhile,
    and said no checkpoint passes verification; then the one it found was deleted before
    its info was read (with info slowed too, every time)."""
    slowed(monkeypatch, "verify")
    slowed(monkeypatch, "info")
    store = tmp_path / "store"
    with another_process_keeping_one(store):
        assert main(["show", str(store), "latest"]) == 0
    assert "epoch" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["show", "abcdef12"], ["diff", "abcdef12", "latest"]])
def test_an_unknown_id_is_said_without_waiting_for_a_save(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """show and diff tried every CheckpointNotFoundError again under the store's lock: a
    typo waited for a training's save, and only then was said to be unknown."""
    store = tmp_path / "store"
    with CheckpointManager(store) as mgr:
        mgr.save(torch.nn.Linear(2, 2))
        with mgr._exclusive():  # (as a save in another process would hold it)
            held = threading.Thread(target=lambda: main([argv[0], str(store), *argv[1:]]))
            held.start()
            held.join(60)  # (a wait for the lock lasts till this block's end: still alive)
            waited = held.is_alive()
        held.join(60)
    err = capsys.readouterr().err
    assert not waited and "waiting for" not in err, err
    assert "no checkpoint 'abcdef12'" in err


def test_close_waits_for_a_save_in_another_thread(tmp_path: Path) -> None:
    """close() shut the save's thread pools under it: "cannot schedule new futures after
    shutdown" from the saving thread."""
    model = torch.nn.ParameterDict({f"p{i}": torch.nn.Parameter(torch.randn(1 << 20))
                                    for i in range(8)})
    mgr = CheckpointManager(tmp_path, chunk_size=1 << 16)
    started, outcome = threading.Event(), []

    def slowly(done: int, total: int) -> None:
        started.set()
        time.sleep(0.01)

    def save() -> None:
        try:
            outcome.append(mgr.save(model, progress=slowly))
        except Exception as exc:  # (the thread's, said by the assert below)
            outcome.append(exc)

    saving = threading.Thread(target=save)
    saving.start()
    assert started.wait(60)
    mgr.close()
    saving.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], str), outcome
    every_one_loads(tmp_path, outcome)


@contextlib.contextmanager
def a_save_in_another_thread(mgr: CheckpointManager) -> Iterator[None]:
    """A save running in another thread (a notebook session's background writer) for as
    long as the ``with`` block runs: it holds the store's locks meanwhile."""
    started, release = threading.Event(), threading.Event()
    model = torch.nn.Linear(64, 64)

    def held(done: int, total: int) -> None:
        started.set()
        release.wait(60)

    saving = threading.Thread(target=lambda: mgr.save(model, progress=held))
    saving.start()
    assert started.wait(60)
    try:
        yield
    finally:
        release.set()
        saving.join(60)


def saves_within(mgr: CheckpointManager, seconds: float) -> bool:
    """Whether a save finishes within ``seconds`` (in a thread left to finish after)."""
    done = threading.Event()
    model = torch.nn.Linear(64, 64)
    threading.Thread(target=lambda: (mgr.save(model), done.set()), daemon=True).start()
    return done.wait(seconds)


def test_dataloader_workers_forked_under_a_save_keep_no_lock(tmp_path: Path) -> None:
    """A DataLoader's workers, forked as an epoch started while a background save held
    the store's folder lock, shared that lock and kept it after the save: every later
    save waited for the workers to exit (half of a session's checkpoints were missing)."""
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4, num_workers=2,
        multiprocessing_context="fork")
    with CheckpointManager(tmp_path / "store") as mgr:
        with a_save_in_another_thread(mgr):
            batches = iter(loader)  # (the workers are forked here, the save under way)
            next(batches)
        saved = saves_within(mgr, 30)
        del batches  # (its workers stop, before the assert, which would keep them)
    assert saved, "the next save waited for the forked workers"


class CollectsCycles(torch.utils.data.Dataset[bool]):
    """Items that say whether the worker's collector frees cycles."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> bool:
        return collects_cycles()


def test_dataloader_workers_forked_under_a_save_collect_cycles(tmp_path: Path) -> None:
    """A save pauses the cyclic collector; a DataLoader's workers, forked as an epoch
    started under a background save, had no thread to end that pause: the cycles their
    Dataset made were never freed (667 MiB max RSS against 341 for 200,000 of them)."""
    loader = torch.utils.data.DataLoader(
        CollectsCycles(), batch_size=None, num_workers=2, multiprocessing_context="fork")
    with CheckpointManager(tmp_path / "store") as mgr:
        with a_save_in_another_thread(mgr):
            workers_collect = list(loader)  # (forked here, the save under way)
    assert workers_collect == [True, True]


def test_a_process_forked_under_a_save_can_close_its_copy(tmp_path: Path) -> None:
    """A child forked while another thread saved got the manager's lock held by a thread
    it does not have: its close() (or save) waited forever."""
    fork = multiprocessing.get_context("fork")
    closed = fork.Event()

    def child(mgr: CheckpointManager) -> None:
        mgr.close()
        closed.set()
        time.sleep(60)  # (alive while the parent saves again)

    with CheckpointManager(tmp_path / "store") as mgr:
        with a_save_in_another_thread(mgr):
            process = fork.Process(target=child, args=(mgr,))
            process.start()
        copy_closed = closed.wait(30)
        saved = saves_within(mgr, 30)
        process.kill()  # (lets go of what it holds, before the asserts)
        process.join(60)
    assert copy_closed, "the forked copy's close() waited for a thread it does not have"
    assert saved, "the next save waited for the forked process"


@contextlib.contextmanager
def forked_while_held(held: Callable[[], contextlib.AbstractContextManager[Any]],
                      child: Callable[[], None]) -> Iterator[Any]:
    """``child`` run in a process forked while another thread is inside ``held()``, which
    that thread leaves as the block ends."""
    taken, release = threading.Event(), threading.Event()

    def holder() -> None:
        with held():
            taken.set()
            release.wait(60)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert taken.wait(30)
        process = multiprocessing.get_context("fork").Process(target=child)
        process.start()
        yield process
    finally:
        release.set()
        thread.join(60)


@pytest.mark.parametrize("held", ["catalog", "arena", "memory store"])
def test_a_process_forked_while_a_thread_holds_a_lock_can_use_its_copy(
        tmp_path: Path, held: str) -> None:
    """The fork hook gave a child a fresh save lock only: a catalog transaction, a
    restore's arena or a memory:// store's lock held by another thread at the fork left
    the child's close(), restore or save waiting forever."""
    from ckpt_nb._buffers import RESTORE_ARENA
    from ckpt_nb._manager import _memory_store_lock

    fork = multiprocessing.get_context("fork")
    done = fork.Event()
    mgr = CheckpointManager(MemoryStore() if held == "memory store" else tmp_path / "s")
    cid = mgr.save(torch.nn.Linear(4, 4))
    lock = {"catalog": mgr.catalog._lock, "arena": RESTORE_ARENA._lock,
            "memory store": _memory_store_lock(mgr.store.url)}[held]

    def child() -> None:
        mgr.restore(cid, model=torch.nn.Linear(4, 4), rng=False)
        mgr.save(torch.nn.Linear(4, 4))
        mgr.close()
        done.set()

    with forked_while_held(lambda: lock, child) as process:
        finished = done.wait(30)
    process.kill()
    process.join(60)
    mgr.close()
    assert finished, f"the forked child waited for the {held} lock of a thread it lacks"


@pytest.mark.parametrize("unit", ["transaction", "snapshot"])
def test_a_process_forked_inside_a_catalog_unit_says_to_open_its_own_manager(
        tmp_path: Path, unit: str) -> None:
    """A child forked while another thread was inside a catalog transaction or snapshot
    holds a copy of the connection inside it, which SQLite's connections cannot carry
    across a fork: its save and restore say so, and what to do (a RuntimeError said the
    caller had nested transactions); the parent goes on saving."""
    fork = multiprocessing.get_context("fork")
    said = fork.Queue()
    mgr = CheckpointManager(tmp_path / "s")
    cid = mgr.save(torch.nn.Linear(4, 4))

    def child() -> None:
        for call in (lambda: mgr.restore(cid, model=torch.nn.Linear(4, 4), rng=False),
                     lambda: mgr.save(torch.nn.Linear(4, 4))):
            try:
                call()
                said.put("no error")
            except Exception as exc:  # noqa: BLE001 - its kind and words are the test
                said.put(f"{type(exc).__name__}: {exc}")
        mgr.close()

    with forked_while_held(getattr(mgr.catalog, unit), child) as process:
        answers = [said.get(timeout=60) for _ in range(2)]
    process.join(60)
    for answer in answers:
        assert answer.startswith("StoreError: ") and "this process was forked from one " \
            "that was writing the catalog" in answer and "open a CheckpointManager of the " \
            "store in this process" in answer, answer
    assert mgr.save(torch.nn.Linear(4, 4)) in mgr.list()["id"].tolist()
    mgr.close()


def test_gc_beside_the_store_keeps_what_a_copy_of_its_catalog_saved(tmp_path: Path) -> None:
    """The catalog copied to a local disk and used with ``catalog=``: the copy kept the
    original's id, so a gc from the original took the store as unchanged since it last
    wrote it, and deleted both checkpoints saved through the copy."""
    store, copy = tmp_path / "store", tmp_path / "local.sqlite"
    model = torch.nn.Linear(64, 64)
    with CheckpointManager(store) as first:
        ids = [first.save(model, epoch=0)]
    shutil.copy(store / "catalog.sqlite", copy)
    with CheckpointManager(store, catalog=copy) as run:
        for epoch in (1, 2):
            with torch.no_grad():
                model.weight.add_(1)
            ids.append(run.save(model, epoch=epoch))
        gc = warm_python.run([sys.executable, "-m", "ckpt_nb", "gc", str(store)], timeout=120)
        assert gc.returncode == 0, gc.stderr
    every_one_loads(store, ids)


@pytest.mark.parametrize("later", ["saves", "deletes", "an older ckpt_nb's lock take"])
def test_a_backup_of_the_catalog_put_back_is_brought_up_to_the_store(
        tmp_path: Path, later: str) -> None:
    """A copy of the catalog written back over it keeps its id: its "latest" was the
    backup's, and a gc from it deleted the checkpoints saved since as a crashed save's
    leftovers. The lock file's note of what the last writer's catalog had seen tells it."""
    store, backup = tmp_path / "store", tmp_path / "backup.sqlite"
    model = torch.nn.Linear(64, 64)
    with CheckpointManager(store) as first:
        ids = [first.save(model, epoch=epoch) for epoch in range(3)]
    shutil.copy(store / "catalog.sqlite", backup)
    with CheckpointManager(store) as second:
        if later != "deletes":
            for epoch in (3, 4):
                with torch.no_grad():
                    model.weight.add_(1)
                ids.append(second.save(model, epoch=epoch))
        for gone in (ids.pop(0), ids.pop(1)):
            second.delete(gone)
        catalog_id = second.catalog.uid()
    if later == "an older ckpt_nb's lock take":  # (its note: the pid and the id alone)
        (store / "catalog.sqlite.lock").write_text(f"{os.getpid()} {catalog_id}\n")
    shutil.copyfile(backup, store / "catalog.sqlite")  # (in place: the same inode)
    gc = warm_python.run([sys.executable, "-m", "ckpt_nb", "gc", str(store)], timeout=120)
    said = "(a copy of it was put back?)" in gc.stderr  # (not where the note cannot tell)
    assert gc.returncode == 0 and said == ("older" not in later), gc.stderr
    assert "0 packs deleted" in gc.stdout, gc.stdout
    with CheckpointManager(store) as reopened:
        assert list(reopened.list()["id"]) == ids
        assert reopened.verify().bad == {}
        assert torch.equal(reopened.restore("latest").state["model"]["weight"], model.weight)
    every_one_loads(store, ids)


@pytest.mark.parametrize("since", ["pinned", "unpinned"])
def test_a_backup_put_back_after_a_pin_alone_is_brought_up_to_the_store(
        tmp_path: Path, since: str) -> None:
    """No save nor delete since the backup, only a pin and a note: the lock file's
    counts of checkpoints were the backup's, so nothing was read again, and retention
    from the backup deleted the checkpoint pinned since (its label said pinned)."""
    store, backup = tmp_path / "store", tmp_path / "backup.sqlite"
    model = torch.nn.Linear(8, 8)
    with CheckpointManager(store) as first:
        ids = [first.save(model, epoch=epoch) for epoch in range(3)]
        if since == "unpinned":
            first.pin(ids[0])
    shutil.copy(store / "catalog.sqlite", backup)
    with CheckpointManager(store) as second:
        second.pin(ids[0], since == "pinned")
        second.annotate(ids[1], "the one to compare with")
    shutil.copyfile(backup, store / "catalog.sqlite")
    with pytest.warns(RuntimeWarning, match="a copy of it was put back"):
        reopened = CheckpointManager(store, max_to_keep=2)
    with reopened:
        assert reopened.list().set_index("id").loc[ids[0], "pinned"] == (since == "pinned")
        assert reopened.list().set_index("id").loc[ids[1], "note"] == "the one to compare with"
        ids.append(reopened.save(model, epoch=3))
        kept = list(reopened.list()["id"])
    assert kept == ([ids[0], ids[2], ids[3]] if since == "pinned" else ids[2:])


@pytest.mark.parametrize("put_back", ["copied over it", "renamed over it"])
def test_a_backup_put_back_is_read_again_before_anything_is_listed_or_loaded(
        tmp_path: Path, put_back: str) -> None:
    """rsync puts a file back as a new one (a temporary file renamed over it): the copy's
    id, tied to the old file, went unchecked at open, and ``ckpt-nb ls`` listed 3 of 5,
    ``load("latest")`` the backup's latest, without a word."""
    store, backup = tmp_path / "store", tmp_path / "backup.sqlite"
    model = torch.nn.Linear(8, 8)
    with CheckpointManager(store) as first:
        ids = [first.save(model, epoch=epoch) for epoch in range(3)]
    shutil.copy(store / "catalog.sqlite", backup)
    with CheckpointManager(store) as second:
        ids += [second.save(model, epoch=epoch) for epoch in (3, 4)]
    if put_back == "copied over it":
        shutil.copyfile(backup, store / "catalog.sqlite")
    else:
        shutil.copy(backup, store / "catalog.sqlite.tmp")
        os.replace(store / "catalog.sqlite.tmp", store / "catalog.sqlite")
    ls = warm_python.run([sys.executable, "-m", "ckpt_nb", "ls", str(store)], timeout=120)
    assert ls.returncode == 0 and all(cid in ls.stdout for cid in ids), ls.stdout
    assert "older than the store's last write (a copy of it was put back?)" in ls.stderr
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with CheckpointManager(store) as reopened:
            assert reopened.load("latest").id == ids[-1]
            assert list(reopened.list()["id"]) == ids
    assert not said, [str(w.message) for w in said]  # (caught up once, by ls)


def test_managers_with_catalogs_of_their_own_in_turn_are_not_taken_for_a_copy(
        tmp_path: Path) -> None:
    """The store's own catalog, a copy of it given as ``catalog=`` (behind it, and so read
    again) and a catalog of its own save in turn: none was put back, and none warns so."""
    store = tmp_path / "store"
    model = torch.nn.Linear(8, 8)
    with CheckpointManager(store) as first:
        ids = [first.save(model, epoch=0)]
    shutil.copy(store / "catalog.sqlite", tmp_path / "copy.sqlite")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with CheckpointManager(store) as first:  # (the copy is behind it: read again)
            ids.append(first.save(model, epoch=0))
        for epoch in range(1, 5):
            for catalog in (tmp_path / "copy.sqlite", tmp_path / "own.sqlite", None):
                with CheckpointManager(store, catalog=catalog) as mgr:
                    ids.append(mgr.save(model, epoch=epoch))
    assert not [w for w in said if "put back" in str(w.message)], \
        [str(w.message) for w in said]
    every_one_loads(store, ids)


@pytest.mark.parametrize("missed, stop", [("a copy put back", signal.SIGKILL),
                                           ("a copy put back", signal.SIGINT),
                                           ("another catalog's saves", signal.SIGKILL)])
def test_a_catch_up_cut_short_leaves_the_next_gc_to_read_the_store_again(
        tmp_path: Path, missed: str, stop: signal.Signals) -> None:
    """A process that reads the store again at its lock take (its catalog missed saves)
    and is killed, or Ctrl-C'd, while it rebuilds: its take had noted its own, stale,
    mark already, so the next gc took its catalog as up to date and deleted the
    checkpoints it missed."""
    store, backup = tmp_path / "store", tmp_path / "backup.sqlite"
    model = torch.nn.Linear(64, 64)
    with CheckpointManager(store) as first:
        ids = [first.save(model, epoch=epoch) for epoch in range(3)]
    shutil.copy(store / "catalog.sqlite", backup)
    elsewhere = {} if missed == "a copy put back" else {"catalog": tmp_path / "other.sqlite"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the other catalog's rebuild)
        with CheckpointManager(store, **elsewhere) as second:
            for epoch in (3, 4):
                with torch.no_grad():
                    model.weight.add_(1)
                ids.append(second.save(model, epoch=epoch))
    if missed == "a copy put back":
        shutil.copyfile(backup, store / "catalog.sqlite")  # (in place: the same inode)
    # (the rebuild's start said on stdout, then a wait for the signal: a real kill at a
    # known point of the catch-up, nothing of ckpt_nb replaced. The wait is in short
    # sleeps: a SIGINT the kernel hands another thread of the process (a native one) wakes
    # no sleep of the main thread, whose handler runs only once its sleep is over; one
    # sleep of 120 s outlived the 60 s waited here, under load, 1 run in 10)
    catching_up = python(f"""
        import faulthandler, signal, sys, time
        from ckpt_nb import CheckpointManager, _rebuild
        faulthandler.register(signal.SIGUSR1)  # (its stack, where the signal did not end it)
        def at_rebuild(frame, event, arg):
            if event == "call" and frame.f_code is _rebuild.rebuild.__code__:
                print("rebuilding", flush=True)
                for _ in range(1200):
                    time.sleep(0.1)
        sys.setprofile(at_rebuild)
        CheckpointManager({str(store)!r}).gc()
        """)
    try:
        assert catching_up.stdout is not None
        assert catching_up.stdout.readline() == "rebuilding\n", catching_up.stderr.read()
        catching_up.send_signal(stop)
        _, said = catching_up.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # (what it was doing, said)
        catching_up.send_signal(signal.SIGUSR1)
        time.sleep(1)
        catching_up.kill()
        _, said = catching_up.communicate()
        raise AssertionError(f"{stop!r} did not end the catch-up in 60 s: {said}") from None
    finally:
        if catching_up.poll() is None:
            catching_up.kill()
            catching_up.communicate()
    assert catching_up.returncode != 0, said
    gc = warm_python.run([sys.executable, "-m", "ckpt_nb", "gc", str(store)], timeout=120)
    assert gc.returncode == 0 and "0 packs deleted" in gc.stdout, (gc.stdout, gc.stderr)
    assert "0 manifests deleted" in gc.stdout, gc.stdout
    with CheckpointManager(store) as reopened:
        assert list(reopened.list()["id"]) == ids
        assert reopened.verify().bad == {}
    every_one_loads(store, ids)


def test_a_save_killed_after_a_catch_up_is_not_taken_as_the_other_catalogs(
        tmp_path: Path) -> None:
    """A save whose lock take read the store again (another catalog wrote last) kept
    that catalog's mark in the lock file through the save: killed after its commit,
    it left the note saying the other catalog had seen the save, and that catalog's
    gc deleted it."""
    store = tmp_path / "store"
    with CheckpointManager(store) as beside:
        ids = [beside.save(torch.nn.Linear(8, 8), epoch=0)]
        # (killed in its save, after the commit: before its take's release)
        killed = python(f"""
            import os, warnings, torch
            from ckpt_nb import CheckpointManager, _manager
            warnings.simplefilter("ignore")
            commit = _manager.Catalog.commit_checkpoint
            def commit_then_die(catalog, row, *args):
                commit(catalog, row, *args)
                print(row.id, flush=True)
                os.kill(os.getpid(), 9)
            _manager.Catalog.commit_checkpoint = commit_then_die
            CheckpointManager({str(store)!r}, catalog={str(tmp_path / "other.sqlite")!r}
                              ).save(torch.nn.Linear(8, 8), epoch=1)
            """)
        out, err = killed.communicate(timeout=120)
        assert killed.returncode == -9 and len(out.split()) == 1, err
        ids += out.split()
        report = beside.gc()
        assert report.manifests_deleted == report.packs_deleted == 0, report
    every_one_loads(store, ids)


def test_a_relative_catalog_stays_the_one_opened_after_a_chdir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``catalog="cat.sqlite"``, then a notebook's ``%cd``: the next save took the catalog
    for deleted (its path named another file) and built a new one in the new folder."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    model = torch.nn.Linear(4, 4)
    with CheckpointManager(tmp_path / "store", catalog="cat.sqlite") as mgr:
        mgr.save(model, epoch=0)
        monkeypatch.chdir(tmp_path / "b")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no rebuild)
            mgr.save(model, epoch=1)
        assert len(mgr.list()) == 2
    assert list((tmp_path / "b").iterdir()) == []


def test_a_wait_for_a_read_under_the_lock_says_reading(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A restore("latest") outrun three times reads under the store's lock: a writer
    waiting for it was told the reader was saving to the store or collecting it."""
    with CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(torch.nn.Linear(2, 2))
        reader = python(f"""
            import sys
            from ckpt_nb import CheckpointManager
            with CheckpointManager({str(tmp_path)!r}) as mgr:
                with mgr._exclusive(reading=True):  # (as the fourth try of "latest")
                    print("held", flush=True)
                    sys.stdin.readline()  # (held until the writer has said it waits)
            """, stdin=subprocess.PIPE)
        assert reader.stdout is not None and reader.stdout.readline() == "held\n"
        pinning = threading.Thread(target=mgr.pin, args=(cid,))  # (waits for it)
        pinning.start()
        err = stderr_once_said(capsys, "waiting for")
        assert reader.stdin is not None
        reader.stdin.write("go\n")
        reader.stdin.flush()
        pinning.join(60)
        reader.wait(timeout=60)
    assert f"waiting for {mgr.store.url}: process {reader.pid} is reading it" in err, err
