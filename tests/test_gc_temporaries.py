"""gc's sweep of half-written files: a killed save's go, and nothing else does (a tester
found gc and every retention deleting any file named with ".tmp-" under the store's
folder: a user's notes, and a store inside it, whose saves then failed)."""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path

import torch

from ckpt_nb import CheckpointManager, LocalStore, StoreError
from conftest import Holder
import warm_python  # (fresh interpreters forked from a warm one)

TESTS = Path(__file__).parent

# A user's files in the store's folder, ".tmp-" in each name, some shaped as ckpt_nb's own.
USERS_FILES = ["results.tmp-old.csv", "notes.txt.tmp-0123456789ab", "my_notes/draft.tmp-2.md",
               f"my_notes/{'d' * 32}.pack.tmp-0123456789ab"]


def write_users_files(store: Path) -> None:
    for name in USERS_FILES:
        (store / name).parent.mkdir(parents=True, exist_ok=True)
        (store / name).write_text("user data")


def temporaries(store: Path) -> list[str]:
    return sorted(p.relative_to(store).as_posix() for p in store.rglob("*.tmp-*"))


def test_gc_and_retention_keep_users_files_and_a_nested_stores_saves_in_flight(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    mgr = CheckpointManager(store, max_to_keep=1)
    mgr.save(h=Holder({"w": torch.zeros(1000)}), rng=False)
    write_users_files(store)
    # Stores inside this one's folder, one named as a folder of its own, each mid-write.
    child, runs = LocalStore(store / "child_store"), LocalStore(store / "runs")
    children = [(child, f"packs/{'e' * 32}.pack"), (child, "manifests/c0ffee.json.zst"),
                (runs, "ckpt_nb.json")]
    with contextlib.ExitStack() as stack:
        writers = [(child, key, stack.enter_context(child.writer(key)))
                   for child, key in children]
        for child, key, out in writers:
            out.write(b"half of " + key.encode())
        in_flight = temporaries(store)
        assert len(in_flight) == len(USERS_FILES) + len(children)
        assert mgr.gc().temporaries_deleted == 0
        kept = mgr.save(h=Holder({"w": torch.ones(1000)}), rng=False)  # (retention: a gc)
        assert list(mgr.list()["id"]) == [kept]
        assert temporaries(store) == in_flight
        for child, key, out in writers:
            out.write(b", then the rest")
    for child, key, _ in writers:
        assert child.get(key) == b"half of " + key.encode() + b", then the rest"
    assert all((store / name).read_text() == "user data" for name in USERS_FILES)


# Saves into STORE, SIGKILLed once its pack's first batch is written (its temporary on disk).
KILLED_MID_SAVE = """
import os, signal, sys, torch
sys.path.insert(0, sys.argv[2])
from conftest import Holder
import ckpt_nb._format as F
flush = F.PackWriter.flush
def flush_then_die(pack):
    flush(pack)
    os.kill(os.getpid(), signal.SIGKILL)
F.PackWriter.flush = flush_then_die
from ckpt_nb import CheckpointManager
CheckpointManager(sys.argv[1]).save(h=Holder({"w": torch.full((1 << 20,), 7.0)}), rng=False)
"""


def test_a_killed_saves_temporaries_are_still_swept(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = CheckpointManager(store).save(h=Holder({"w": torch.zeros(1000)}), rng=False)
    write_users_files(store)
    done = warm_python.run([sys.executable, "-c", KILLED_MID_SAVE, str(store), str(TESTS)])
    assert done.returncode == -9, done.stderr
    left = [name for name in temporaries(store) if name not in USERS_FILES]
    assert left and all(name.startswith(("packs/", "manifests/")) for name in left), left
    for name in left:  # (what reached the disk before the kill: none, where the pack's
        with open(store / name, "ab") as temporary:  # writer thread had not written yet)
            temporary.write(b"\0" * 4096)
    left_bytes = sum((store / name).stat().st_size for name in left)
    # The manifest is written while the pack's last batch goes out: it may be in place
    # (committed to the store, never to the catalog), and gc deletes it with its bytes.
    orphans = [p for p in (store / "manifests").iterdir()
               if ".tmp-" not in p.name and first not in p.name]
    orphan_bytes = sum(p.stat().st_size for p in orphans)
    mgr = CheckpointManager(store)
    report = mgr.gc()
    assert report.temporaries_deleted == len(left)
    assert report.manifests_deleted == len(orphans)
    assert report.bytes_freed == left_bytes + orphan_bytes > 0  # (it said "freed 0 B")
    assert temporaries(store) == sorted(USERS_FILES)
    assert list(mgr.list()["id"]) == [first]
    assert torch.equal(mgr.load(first).state["h"]["w"], torch.zeros(1000))


def test_a_save_whose_temporary_is_deleted_under_it_is_a_store_error(tmp_path: Path) -> None:
    """Something else cleaning the store's folder deletes a save's pack as it is written:
    the save fails by name (it was a bare FileNotFoundError), and earlier ones stay."""
    store = tmp_path / "store"
    mgr = CheckpointManager(store)
    first = mgr.save(h=Holder({"w": torch.zeros(1000)}), rng=False)
    stop = threading.Event()

    def clean() -> None:
        while not stop.is_set():
            for temporary in (store / "packs").glob("*.tmp-*"):
                temporary.unlink(missing_ok=True)

    cleaner = threading.Thread(target=clean)
    cleaner.start()
    try:
        failures = []
        for i in range(1, 6):  # (the cleaner may miss a save: a few tries)
            try:
                mgr.save(h=Holder({"w": torch.full((16 << 20,), float(i))}), rng=False)
            except StoreError as exc:
                failures.append(str(exc))
                break
    finally:
        stop.set()
        cleaner.join()
    assert failures, "the cleaner deleted no save's temporary in 5 saves"
    assert "was deleted while it was written" in failures[0] and "save again" in failures[0]
    assert first in list(mgr.list()["id"])
    assert torch.equal(mgr.load(first).state["h"]["w"], torch.zeros(1000))
    assert mgr.verify().ok
    mgr.gc()
    assert temporaries(store) == []
