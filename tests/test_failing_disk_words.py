"""What a failing disk or a limit of the process's is said as: a StoreError (or a
MemoryError) naming the file and what to do, never a bare OSError; and nothing lost."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from conftest import DigitsRun, Holder, same

from ckpt_nb import CheckpointManager, StoreError

import warm_python  # (fresh interpreters forked from a warm one)


@pytest.mark.parametrize("emptied", [False, True], ids=["written over", "emptied"])
def test_a_lock_file_note_the_disk_refuses_is_a_store_error_naming_it(
        tmp_path: Path, file_size_limit: Callable[[int | None], None], emptied: bool) -> None:
    """The note a save, delete, gc or pin leaves in the lock file, refused (here by
    RLIMIT_FSIZE, as a read-only or failing disk refuses it): it was a bare OSError naming
    no file, or, written over a note as long, cut short unsaid. The note is not skipped:
    its mark tells another catalog of the store that it missed this one's writes."""
    run = DigitsRun()
    mgr = CheckpointManager(tmp_path)
    first = mgr.save(run.model, run.optimizer, step=0, rng=False)
    if emptied:  # (as a lock file made again is: the note grows it)
        os.truncate(tmp_path / "catalog.sqlite.lock", 0)
    weights = run.weights()
    run.train_step()
    file_size_limit(8)  # (the note is longer; every earlier file is already there)
    with pytest.raises(StoreError, match=r"saving a checkpoint failed, so it was not saved "
                       r"\(the checkpoints saved before are intact\): cannot write the lock "
                       r"file .*catalog\.sqlite\.lock .*File too large.*ulimit -f.*"
                       r"nothing was changed"):
        mgr.save(run.model, run.optimizer, step=1, rng=False)
    for refused in (lambda: mgr.pin(first), lambda: mgr.gc(), lambda: mgr.delete(first)):
        with pytest.raises(StoreError, match=r"cannot write the lock file"):
            refused()
    file_size_limit(None)
    assert mgr.list()["id"].tolist() == [first]
    mgr.restore(first, model=run.model, rng=False)
    assert same(run.weights(), weights)
    assert mgr.save(run.model, run.optimizer, step=1, rng=False) != first


def test_a_pack_past_the_file_size_limit_names_the_limit_not_a_full_disk(
        tmp_path: Path, file_size_limit: Callable[[int | None], None]) -> None:
    """A pack that outgrew RLIMIT_FSIZE (ulimit -f), on a disk with room: the save said
    "File too large: free some room, then try again", which no freed room helps."""
    mgr = CheckpointManager(tmp_path)
    first = mgr.save(h=Holder({"w": torch.randn(1 << 20)}), rng=False)
    file_size_limit(1 << 20)
    with pytest.raises(StoreError, match=r"saving a checkpoint failed, so it was not saved: "
                       r"cannot write packs/[0-9a-f]{32}\.pack in the store .*: File too "
                       r"large: this process may write no file over 1\.0 MiB \(1048576 "
                       r"bytes: its file-size limit, ulimit -f\): raise the limit, then try "
                       r"again \(what "
                       r"was saved before is intact\)$"):
        mgr.save(h=Holder({"w": torch.randn(1 << 20)}), rng=False)
    file_size_limit(None)
    assert mgr.list()["id"].tolist() == [first] and mgr.verify().ok


def test_a_file_too_big_for_its_file_system_is_no_full_disk() -> None:
    """EFBIG with no file-size limit set: a file system's own largest file (FAT32's 4 GiB),
    which "free some room" did not help either."""
    from ckpt_nb._store import _why_full

    assert _why_full(OSError(errno.EFBIG, "File too large")) == (
        "the file system takes no file this big (FAT32's largest is 4 GiB): put the store on "
        "another file system")
    assert _why_full(OSError(errno.ENOSPC, "No space left on device")) == "free some room"


# A model's checkpoint whose chunks lie in a pack of some 55 MiB (saved with a 64 MiB tensor of
# noise), into argv[1]; then, with 24 MiB more address space (RLIMIT_AS) than the process
# has, an incremental save (which maps its base's pack) and a load of it; each error said,
# then both again without the limit.
WITHOUT_ROOM_TO_MAP = """
import os, resource, sys, torch
sys.path.insert(0, sys.argv[2])
from conftest import Holder
from ckpt_nb import CheckpointManager
torch.manual_seed(0)
model = torch.nn.Linear(1024, 1024)
CheckpointManager(sys.argv[1]).save(model, big=Holder({"w": torch.rand(16 << 20)}), rng=False)
mgr = CheckpointManager(sys.argv[1], strategy="incremental")  # (no base kept in memory)
small = mgr.save(model, rng=False)  # (its chunks: the big pack's)
weights = [t.clone() for t in model.state_dict().values()]
with torch.no_grad():
    model.weight[0, :10] += 1e-3
size = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (size + (24 << 20), resource.RLIM_INFINITY))
for read in (lambda: mgr.save(model, rng=False), lambda: mgr.load(small)):
    try:
        read()
    except MemoryError as exc:
        print(exc)
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
mgr.restore(small, model=model, rng=False)
print(len(mgr.list()), all(map(torch.equal, model.state_dict().values(), weights)))
mgr.save(model, rng=False)
print(len(mgr.list()), mgr.verify().ok)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc (Linux)")
def test_a_pack_that_cannot_be_mapped_for_want_of_memory_is_said_so(tmp_path: Path) -> None:
    """A save and a load that cannot map a pack under RLIMIT_AS (ulimit -v): a MemoryError
    naming the pack and the limit (the save's saying it was not saved), not a bare
    "OSError: [Errno 12] Cannot allocate memory"; and nothing lost."""
    done = warm_python.run([sys.executable, "-c", WITHOUT_ROOM_TO_MAP, str(tmp_path),
                           str(Path(__file__).parent)])
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    assert len(said) == 4, done.stdout
    mapping = r"no memory left to map packs/[0-9a-f]{32}\.pack of the store .* \(\d+ MiB\): " \
        r"this process's address space \(limited by ulimit -v, RLIMIT_AS\) or the machine's " \
        r"memory ran out; free some, or raise the limit, then try again$"
    assert re.fullmatch(r"saving a checkpoint failed, so it was not saved \(the checkpoints "
                        r"saved before are intact\): " + mapping, said[0]), said[0]
    assert re.fullmatch(mapping, said[1]), said[1]
    assert said[2:] == ["2 True", "3 True"]


# A checkpoint whose chunks share a pack of some 55 MiB with a 64 MiB tensor of noise that
# only it holds, in each of two stores under argv[1]; then, with 24 MiB more address space
# (RLIMIT_AS) than the process has, a save whose retention deletes it in one and a delete()
# of it in the other, whose compaction maps that pack; each said, then the stores audited
# without the limit.
RETENTION_WITHOUT_ROOM_TO_MAP = """
import os, resource, sys, warnings, torch
sys.path.insert(0, sys.argv[2])
from conftest import Holder
from ckpt_nb import CheckpointManager
torch.manual_seed(0)
model = torch.nn.Linear(1024, 1024)
firsts = [CheckpointManager(os.path.join(sys.argv[1], name)).save(
    model, big=Holder({"w": torch.rand(16 << 20)}), rng=False) for name in "ab"]
kept = CheckpointManager(os.path.join(sys.argv[1], "a"), max_to_keep=1)
by_hand = CheckpointManager(os.path.join(sys.argv[1], "b"))
by_hand.save(model, rng=False)
size = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (size + (24 << 20), resource.RLIM_INFINITY))
for write in (lambda: kept.save(model, rng=False), lambda: by_hand.delete(firsts[1])):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            print("returned", write() not in firsts[:1])
        except MemoryError as exc:
            print("raised", exc)
    print(*(str(w.message) for w in caught), sep="\\n")
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
for mgr, first in zip((kept, by_hand), firsts):
    fresh = torch.nn.Linear(1024, 1024)
    mgr.restore("latest", model=fresh, rng=False)
    print(mgr.list()["id"].tolist() != [first], first in mgr.list()["id"].tolist(),
          all(map(torch.equal, fresh.state_dict().values(), model.state_dict().values())),
          mgr.gc().packs_compacted, mgr.verify().ok)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc (Linux)")
def test_a_deletion_whose_compaction_cannot_map_a_pack_is_made_with_a_warning(
        tmp_path: Path) -> None:
    """A save committed before its retention's compaction ran out of address space returns
    its id, and a delete() made before its compaction did is made, each with a warning, as
    where room ran out: both raised the MemoryError "then try again" for what was done."""
    done = warm_python.run([sys.executable, "-c", RETENTION_WITHOUT_ROOM_TO_MAP,
                            str(tmp_path), str(Path(__file__).parent)])
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    assert said[0] == "returned True", done.stdout
    assert re.match(r"checkpoint [0-9a-f]{10} was saved, but retention failed \(no memory "
                    r"left to map packs/", said[1]), said[1]
    assert said[2] == "returned True", done.stdout
    assert re.match(r"checkpoint [0-9a-f]{10} was deleted, but what follows failed \(no "
                    r"memory left to map packs/", said[3]), said[3]
    assert said[4:] == ["True False True 1 True"] * 2, done.stdout


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` made read-only in place by a bind mount over itself (EROFS, as a file
    system remounted read-only after a disk error); skipped where mounting is refused."""
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(folder)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("mounting read-only needs root: " + mounted.stderr.decode().strip())
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_gc_that_cannot_remove_a_temporary_is_a_store_error_saying_why(tmp_path: Path) -> None:
    """A temporary a killed save left, on a file system gone read-only: gc says it stopped,
    names the file and says the file system is read-only; it was a bare OSError."""
    run = DigitsRun()
    mgr = CheckpointManager(tmp_path)
    first = mgr.save(run.model, step=0, rng=False)
    (tmp_path / "packs" / f"{'b' * 32}.pack.tmp-0123456789ab").write_bytes(b"torn")
    with read_only(tmp_path / "packs"):
        with pytest.raises(StoreError, match=r"gc stopped, as the store could not be read or "
                           r"written: cannot remove .*/packs/b{32}\.pack\.tmp-0123456789ab, a "
                           r"temporary .*\(Read-only file system\): its file system is "
                           r"read-only .*then run gc again"):
            mgr.gc()
    assert mgr.gc().temporaries_deleted == 1
    assert mgr.list()["id"].tolist() == [first] and mgr.verify().ok


def test_an_export_to_a_full_disk_says_what_to_do_and_leaves_nothing(tmp_path: Path) -> None:
    """An export to a real full disk (a 1 MiB tmpfs): the OSError names the file and says
    to free room or export elsewhere; it was a plain "No space left on device"."""
    mgr = CheckpointManager(tmp_path / "store")
    mgr.save(torch.nn.Linear(1024, 512), rng=False)  # (2 MiB of weights)
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs needs root: " + mounted.stderr.decode().strip())
    try:
        for name in ("model.pt", "model.safetensors"):
            with pytest.raises(OSError, match=r"No space left on device: its disk is full: "
                               r"free some room, or export to another disk; nothing was left "
                               r"behind") as caught:
                mgr.export("latest", disk / "out" / name)
            assert caught.value.filename == str(disk / "out" / name)
            assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_lock_file_on_a_read_only_file_system_says_so(tmp_path: Path) -> None:
    """The lock file cannot be opened to write, the store's folder having gone read-only
    under a live manager: said to be the file system's doing; "chmod or chown it" could
    not help."""
    run = DigitsRun()
    mgr = CheckpointManager(tmp_path)
    first = mgr.save(run.model, step=0, rng=False)
    with read_only(tmp_path):
        with pytest.raises(StoreError, match=r"cannot open the lock file .*catalog\.sqlite\.lock "
                           r".*\(Read-only file system\): its file system is read-only .*make "
                           r"it writable again.*nothing was changed") as caught:
            mgr.save(run.model, step=1, rng=False)
        assert "chmod" not in str(caught.value)
    assert mgr.list()["id"].tolist() == [first]


# Saves twice into argv[1], then is killed: the catalog's changes are all in its journal.
SAVED_THEN_KILLED = """
import os, signal, sys, torch
from ckpt_nb import CheckpointManager
mgr = CheckpointManager(sys.argv[1])
for step in (0, 1):
    print(mgr.save(torch.nn.Linear(4, 4), step=step, rng=False))
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_catalog_whose_journal_was_deleted_is_said_to_have_been_empty(tmp_path: Path) -> None:
    """A trainer killed with its catalog's changes in catalog.sqlite-wal, which was then
    deleted: the file there reads empty, and is rebuilt; the warning said the catalog
    "was missing", with its file there."""
    done = warm_python.run([sys.executable, "-c", SAVED_THEN_KILLED, str(tmp_path)])
    assert done.returncode == -9, done.stderr
    for journal in ("catalog.sqlite-wal", "catalog.sqlite-shm"):
        (tmp_path / journal).unlink()
    assert (tmp_path / "catalog.sqlite").is_file()
    with pytest.warns(RuntimeWarning, match=r"the catalog of .* was empty \(its file held no "
                      r"catalog: was its journal, catalog\.sqlite-wal, deleted, or did an open "
                      r"fail before it wrote the catalog, an older ckpt_nb's that refused the "
                      r"store\?\), so it was "
                      r"rebuilt from the store"):
        mgr = CheckpointManager(tmp_path)
    assert mgr.list()["id"].tolist() == done.stdout.split()


def test_a_catalog_over_a_file_size_limit_is_not_said_to_be_on_a_full_disk(
        tmp_path: Path, file_size_limit: Callable[[int | None], None]) -> None:
    """SQLite's "disk I/O error" where its journal outgrew RLIMIT_FSIZE (ulimit -f), on a
    disk with room: it said "is its disk full? free some room"."""
    run = DigitsRun()
    mgr = CheckpointManager(tmp_path)
    first = mgr.save(run.model, step=0, rng=False)
    run.train_step()
    limit = (tmp_path / "catalog.sqlite-wal").stat().st_size  # (the pack fits)
    file_size_limit(limit)
    with pytest.raises(StoreError, match=r"the catalog .* failed: disk I/O error \(is this "
                       rf"process's file-size limit, ulimit -f \({limit} bytes\), too small for "
                       r"its journal\? raise it, then try again\)") as caught:
        mgr.save(run.model, step=1, rng=False)
    assert "disk full" not in str(caught.value)
    file_size_limit(None)
    assert mgr.list()["id"].tolist() == [first]


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of ``size`` at ``folder``; skipped where mounting is refused."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs needs root: " + mounted.stderr.decode().strip())
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def fill(disk: Path) -> None:
    """Leave ``disk`` no room at all, as a run that filled it did."""
    with open(disk / "filler", "wb") as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * (64 << 10))
    assert os.statvfs(disk).f_bavail == 0


@pytest.mark.parametrize("catalog", ["kept", "lost"])
def test_a_store_on_a_full_disk_opens_to_read(tmp_path: Path, catalog: str) -> None:
    """A run filled the disk and died; a fresh kernel opens its store to restore or export
    the best checkpoint elsewhere. SQLite has no room for its journal, and the store did
    not open at all ("disk I/O error"; with the catalog lost, "database or disk is full");
    it opens to read, saying so, as a store in a folder this process cannot write does."""
    run = DigitsRun()
    with small_disk(tmp_path / "disk") as disk:
        with CheckpointManager(disk / "store") as mgr:
            ids = [mgr.save(run.model, step=step, rng=False) for step in (0, 1)]
        weights = run.weights()
        if catalog == "lost":
            (disk / "store" / "catalog.sqlite").unlink()
        fill(disk)
        said = r"is missing and its disk is full, so it was rebuilt in memory, to read only" \
            if catalog == "lost" else \
            r"the disk of .* is full, so its catalog was opened to read only"
        with pytest.warns(RuntimeWarning, match=said + r".*free some room on it, then open "
                          r"the store again"):
            reader = CheckpointManager(disk / "store")
        assert reader.list()["id"].tolist() == ids
        run.train_step()
        reader.restore("latest", model=run.model, rng=False)
        assert same(run.weights(), weights)
        reader.export("latest", tmp_path / "model.pt")
        with pytest.raises(StoreError, match=r"open to read only, as its disk was full when it "
                           r"was opened; free some room on it, then open the store again"):
            reader.save(run.model, step=2, rng=False)
        reader.close()
        (disk / "filler").unlink()
        with pytest.warns(RuntimeWarning, match="was missing") if catalog == "lost" else \
                contextlib.nullcontext(), CheckpointManager(disk / "store") as writer:
            assert writer.list()["id"].tolist() == ids
            writer.save(run.model, step=2, rng=False)


def test_a_save_to_a_read_only_file_system_says_so_and_what_to_do(tmp_path: Path) -> None:
    """A save whose pack the file system refuses as read-only (its packs folder, here):
    said to be the file system's doing, with what to do; it named only the errno's words."""
    run = DigitsRun()
    mgr = CheckpointManager(tmp_path)
    first = mgr.save(run.model, step=0, rng=False)
    run.train_step()
    with read_only(tmp_path / "packs"):
        with pytest.raises(StoreError, match=r"saving a checkpoint failed, so it was not saved "
                           r".*cannot write packs/[0-9a-f]{32}\.pack in the store .*: Read-only "
                           r"file system: its file system is read-only .*make it writable "
                           r"again, or copy the store to one that is"):
            mgr.save(run.model, step=1, rng=False)
    assert mgr.list()["id"].tolist() == [first] and mgr.verify().ok


# A save in a process that cannot start a thread: a stack bigger than the address space
# left (RLIMIT_AS) is refused as a pids limit refuses the thread itself. Prints what the
# save raised, the checkpoints listed, and a save once the limit is lifted.
WITHOUT_A_THREAD = """
import resource, sys, threading
sys.path.insert(0, sys.argv[2])
from conftest import DigitsRun
from ckpt_nb import CheckpointManager
run = DigitsRun()
first = CheckpointManager(sys.argv[1]).save(run.model, run.optimizer, rng=False)
mgr = CheckpointManager(sys.argv[1])  # (a new one: none of its threads started)
run.train_step()
threading.stack_size(1 << 30)
size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
try:
    mgr.save(run.model, run.optimizer, rng=False)
except RuntimeError as exc:
    print(type(exc).__name__, exc)
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
threading.stack_size(0)
print(list(mgr.list()["id"]) == [first])
print(mgr.save(run.model, run.optimizer, rng=False) in list(mgr.list()["id"]))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc (Linux)")
def test_a_save_that_cannot_start_a_thread_says_it_was_not_saved(tmp_path: Path) -> None:
    """threading's bare "can't start new thread" (a container's pids limit) named neither
    the save nor that the checkpoints before are intact."""
    done = warm_python.run([sys.executable, "-c", WITHOUT_A_THREAD, str(tmp_path),
                           str(Path(__file__).parent)])
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    assert said[0].startswith(
        "RuntimeError saving a checkpoint failed, so it was not saved (the checkpoints saved "
        "before are intact): this process cannot start a thread (can't start new thread; "
        "the save writes on threads of its own): is a limit"), said
    assert said[1:] == ["True", "True"], said


def test_a_failing_close_of_the_locked_folder_after_a_save_warns_and_keeps_the_save(
        tmp_path: Path, digits: DigitsRun, monkeypatch: pytest.MonkeyPatch) -> None:
    """close() of the store folder's descriptor fails once the save has committed (EIO:
    a close of a folder on a local disk cannot be made to fail, so the lock's os.close
    raises the system's error): the save was said to fail, and was there all the same."""
    mgr = CheckpointManager(tmp_path / "s")
    first = mgr.save(digits.model, digits.optimizer, rng=False)
    real_close = os.close
    failed: list[int] = []

    def close(fd: int) -> None:
        real_close(fd)
        if sys._getframe(1).f_code.co_name == "_folder_locked" and not failed:
            failed.append(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "close", close)
    digits.train_step()
    weights = digits.weights()
    with pytest.warns(UserWarning, match=r"closing the folder of .* after locking it failed "
                      r"\(\[Errno 5\] Input/output error\): what this call did stands"):
        second = mgr.save(digits.model, digits.optimizer, rng=False)
    monkeypatch.undo()
    assert list(CheckpointManager(tmp_path / "s").list()["id"]) == [first, second]
    mgr.restore(second, model=digits.model)
    assert same(digits.weights(), weights)
