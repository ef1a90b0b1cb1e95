"""Every Store backend against the shipped conformance suite, plus LocalStore specifics."""

from __future__ import annotations

import errno
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ckpt_nb import FsspecStore, LocalStore, MemoryStore, StoreError, open_store
from ckpt_nb.testing import StoreConformance


class TestLocalStore(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LocalStore:
        return LocalStore(tmp_path / "store")


class TestLocalStoreNotDurable(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LocalStore:
        return LocalStore(tmp_path / "store", durable=False)


class TestMemoryStore(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> MemoryStore:
        return MemoryStore()


class TestFsspecMemory(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> FsspecStore:
        return FsspecStore(f"memory://ckpt-nb-test-{uuid.uuid4().hex}")


# -- LocalStore specifics ---------------------------------------------------------------------

def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_sweep_temporaries_removes_leftovers(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    pack = f"packs/{'a' * 32}.pack"
    store.put(pack, b"kept")
    store.put("ckpt_nb.json", b"{}")
    (tmp_path / "packs" / f"{'b' * 32}.pack.tmp-0123456789ab").write_bytes(b"torn")
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "c0ffee.json.zst.tmp-ba9876543210").write_bytes(b"")
    (tmp_path / "ckpt_nb.json.tmp-00112233aabb").write_bytes(b"")
    (tmp_path / "top.tmp-x").write_bytes(b"a user's")  # (not a name ckpt_nb makes)
    assert sorted(store.list()) == ["ckpt_nb.json", pack]  # never listed
    assert store.sweep_temporaries() == (3, len(b"torn"))  # (how many, and their bytes)
    assert _files(tmp_path) == ["ckpt_nb.json", pack, "top.tmp-x"]
    assert store.get(pack) == b"kept"
    assert store.sweep_temporaries() == (0, 0)


def test_sweep_temporaries_keeps_what_ckpt_nb_did_not_write(tmp_path: Path) -> None:
    """Only the temporaries of names ckpt_nb makes, in its own folders: a user's files
    named with ".tmp-", and the ones of a store inside this one's folder, stay."""
    store = LocalStore(tmp_path)
    others = ["results.tmp-old.csv", "notes.txt.tmp-0123456789ab",
              "my_notes/draft.tmp-2.md", f"my_notes/{'d' * 32}.pack.tmp-0123456789ab",
              f"child/packs/{'e' * 32}.pack.tmp-0123456789ab", "runs/ckpt_nb.json.tmp-0123456789ab",
              "packs/deep/c0ffee.json.tmp-0123456789ab", "packs/x (1).pack.tmp-0123456789ab",
              f"packs/{'f' * 32}.pack.tmp-0123"]
    for name in others:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"not ckpt_nb's")
    assert store.sweep_temporaries() == (0, 0)
    assert _files(tmp_path) == sorted(others)


def test_a_write_whose_temporary_is_deleted_is_a_store_error(tmp_path: Path) -> None:
    """Something else deleting the temporary mid-write (a cleanup of the folder) fails the
    write by name, the key's earlier value kept; it was a bare FileNotFoundError."""
    store = LocalStore(tmp_path)
    key = f"packs/{'a' * 32}.pack"
    store.put(key, b"earlier")
    with pytest.raises(StoreError, match=r"its temporary .*\.tmp-[0-9a-f]{12} was deleted "
                       r"while it was written.*what was saved before is intact.*save again"):
        with store.writer(key) as out:
            out.write(b"later")
            for temporary in (tmp_path / "packs").glob("*.tmp-*"):
                temporary.unlink()
    assert store.get(key) == b"earlier"
    assert _files(tmp_path) == [key]


def test_failed_write_leaves_no_temporary(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("k", b"old")
    with pytest.raises(OSError):
        with store.writer("k") as out:
            out.write(b"new")
            raise OSError("disk on fire")
    assert _files(tmp_path) == ["k"]
    assert store.get("k") == b"old"


def test_a_clean_up_that_fails_leaves_the_error_in_flight_said(tmp_path: Path) -> None:
    """A write that fails where its temporary cannot be removed either (a file system gone
    read-only mid-save refuses both): the write's own error comes through, not the
    clean-up's OSError naming only the temporary. The temporary is made a folder, a real
    refusal of that unlink (EISDIR) that needs no failing disk."""
    store = LocalStore(tmp_path)
    key = f"packs/{'a' * 32}.pack"
    store.put(key, b"earlier")
    with pytest.raises(RuntimeError, match="the write's own failure"):
        with store.writer(key) as out:
            out.write(b"later")
            (temporary,) = (tmp_path / "packs").glob("*.tmp-*")
            temporary.unlink()
            temporary.mkdir()
            raise RuntimeError("the write's own failure")
    assert store.get(key) == b"earlier"
    assert store.sweep_temporaries() == (0, 0)  # (a folder: not a temporary of ckpt_nb's)


def test_base_store_sweep_is_a_no_op() -> None:
    assert MemoryStore().sweep_temporaries() == (0, 0)


def test_open_store_picks_backends(tmp_path: Path) -> None:
    plain = open_store(tmp_path / "a")
    assert isinstance(plain, LocalStore) and plain.root == tmp_path / "a"
    assert isinstance(open_store(str(tmp_path / "b")), LocalStore)
    url = open_store(f"file://{tmp_path / 'c'}")
    assert isinstance(url, LocalStore) and url.root == tmp_path / "c"
    assert (tmp_path / "c").is_dir()
    assert open_store(tmp_path / "d", durable=False).durable is False
    memory = open_store("memory://")
    assert isinstance(memory, MemoryStore)
    assert open_store("memory://") is not memory  # each is a fresh, private store
    named = open_store(f"memory://ckpt-nb-{uuid.uuid4().hex}")
    assert isinstance(named, FsspecStore)
    assert open_store(plain) is plain


def test_a_local_store_reopens_from_its_own_url(tmp_path: Path) -> None:
    from ckpt_nb._session import store_url

    folder = tmp_path / "runs 100% é" / "exp"
    store = open_store(folder)
    assert store.url == folder.as_uri() and "%20" in store.url  # a space is escaped
    again = open_store(store.url)
    assert isinstance(again, LocalStore) and again.root == folder
    assert store_url(store.url) == store_url(folder) == store.url  # one key for the session
    assert store_url(store.url.replace("file://", "local://", 1)) == store.url  # (fsspec's)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs 100% é"]


def test_a_local_url_opens_the_folder_and_fsspec_over_a_local_disk_is_refused(
        tmp_path: Path) -> None:
    """Through fsspec a local folder's catalog and lock were a cache elsewhere: another
    manager of the folder, by its path, locked it alone, and its gc deleted the
    checkpoints saved through fsspec, without a word."""
    folder = tmp_path / "runs"
    store = open_store(f"local://{folder}")
    assert isinstance(store, LocalStore) and store.root == folder
    cached = (f"simplecache::file://{folder}", f"filecache::local://{folder}")
    for url in (f"file://{folder}", f"local://{folder}", *cached):
        with pytest.raises(ValueError, match=f"is the folder {folder} on this machine: give "
                                             "its path instead.*LocalStore"):
            FsspecStore(url)
    for url in cached:
        with pytest.raises(ValueError, match="give its path instead"):
            open_store(url)
    with pytest.raises(ValueError, match="without simplecache::"):  # (its own refusal)
        FsspecStore(f"simplecache::memory://ckpt-nb-{uuid.uuid4().hex}")


def test_managers_of_a_folder_by_its_path_and_its_local_url_keep_each_others_saves(
        tmp_path: Path) -> None:
    import torch

    from ckpt_nb import CheckpointManager

    class Holder:
        def __init__(self, value: float) -> None:
            self.state = {"w": torch.full((1000,), value)}

        def state_dict(self) -> dict:
            return self.state

        def load_state_dict(self, state: dict) -> None:
            self.state = state

    folder = tmp_path / "runs"
    by_path = CheckpointManager(folder)
    first = by_path.save(h=Holder(1))
    by_url = CheckpointManager(f"local://{folder}")
    assert by_url.catalog.path == folder / "catalog.sqlite"
    saved = [by_url.save(h=Holder(2)), by_url.save(h=Holder(3))]
    last = by_path.save(h=Holder(4))
    report = by_path.gc()
    assert report.manifests_deleted == report.packs_deleted == 0
    assert by_path.list()["id"].tolist() == [first, *saved, last]
    restored = Holder(0)
    by_path.restore(saved[0], h=restored)
    assert restored.state["w"][0] == 2 and by_path.verify().ok


def test_a_catalog_whose_folder_cannot_be_made_is_a_store_error_naming_it(
        tmp_path: Path) -> None:
    from ckpt_nb import CheckpointManager

    (tmp_path / "a file").write_bytes(b"")
    catalog = tmp_path / "a file" / "catalog.sqlite"
    with pytest.raises(StoreError, match=f"cannot make {catalog.parent}, the folder of the "
                                         f"catalog {catalog}: File exists"):
        CheckpointManager(tmp_path / "store", catalog=catalog)
    catalog = tmp_path / "a file" / "below" / "catalog.sqlite"
    with pytest.raises(StoreError, match="Not a directory"):
        CheckpointManager(tmp_path / "store", catalog=catalog)


def test_open_store_expands_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    store = open_store("~/runs")
    assert isinstance(store, LocalStore) and store.root == tmp_path / "runs"


def test_local_store_writes_are_real_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("packs/x.pack", b"abc")
    assert (tmp_path / "packs" / "x.pack").read_bytes() == b"abc"
    assert store.url == tmp_path.as_uri()
    assert not any(".tmp-" in name for name in os.listdir(tmp_path / "packs"))


def test_manager_runs_on_an_fsspec_store(tmp_path: Path) -> None:
    """The whole engine over fsspec: catalog local, data in the file system."""
    import torch

    from ckpt_nb import CheckpointManager

    mgr = CheckpointManager(FsspecStore(f"memory://ckpt-nb-mgr-{uuid.uuid4().hex}"),
                            catalog=tmp_path / "catalog.sqlite", max_to_keep=2)
    weights = {"w": torch.randn(5000)}

    class Holder:
        def state_dict(self):
            return weights

        def load_state_dict(self, state):
            weights["w"] = state["w"]

    ids = [mgr.save(h=Holder(), step=i) for i in range(3)]
    assert list(mgr.list()["id"]) == ids[1:]
    assert torch.equal(mgr.load(ids[-1]).state["h"]["w"], weights["w"]) and mgr.verify().ok


@pytest.fixture(params=["native thread", "python"])
def stage_writer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Direct writes go out on the C kernels' writer thread where they were built,
    else from the calling thread: both ways are tested."""
    from ckpt_nb import _native

    if request.param == "native thread" and not _native.writer:
        pytest.skip("the C kernels were not built")
    monkeypatch.setattr(_native, "writer", request.param == "native thread")
    return str(request.param)


@pytest.mark.usefixtures("stage_writer")
@pytest.mark.parametrize("size", [0, 1, 4095, 4096, (4 << 20) - 1, 4 << 20, (9 << 20) + 123,
                                  (21 << 20) + 4097])
def test_direct_writes_keep_every_byte(tmp_path: Path, size: int) -> None:
    """Durable LocalStore writes go through O_DIRECT from an aligned stage, padded and cut back."""
    store = LocalStore(tmp_path)
    data = os.urandom(size)
    with store.writer("v") as out:
        half = size // 3
        out.write(data[:half])
        out.write_many([memoryview(data)[half : 2 * half], data[2 * half :]])
    assert (tmp_path / "v").stat().st_size == size
    assert store.get("v") == data


@pytest.mark.usefixtures("stage_writer")
def test_direct_writes_of_many_parts_keep_every_byte(tmp_path: Path) -> None:
    """A pack's batches: parts of odd sizes, many calls, stages filled across parts."""
    rng = np.random.default_rng(0)
    sizes = [int(n) for n in rng.integers(0, 300_000, size=120)] + [5 << 20, 7, 4096]
    parts = [os.urandom(n) for n in sizes]
    store = LocalStore(tmp_path)
    with store.writer("v") as out:
        for i in range(0, len(parts), 9):
            out.write_many([memoryview(p) if i % 2 else p for p in parts[i : i + 9]])
    assert store.get("v") == b"".join(parts)


@pytest.mark.usefixtures("stage_writer")
def test_a_write_the_kernel_refuses_leaves_nothing(
        tmp_path: Path, file_size_limit: Callable[[int | None], None]) -> None:
    store = LocalStore(tmp_path)
    file_size_limit(9 << 20)
    calls = 0
    with pytest.raises(OSError) as caught, store.writer("v") as out:
        for _ in range(8):
            out.write_many([os.urandom(3 << 20), b"x" * 1001])
            calls += 1
    # Not at the end: within the stages that may be on their way to the disk.
    assert caught.value.errno == errno.EFBIG and calls < 8
    assert not store.has("v") and list(tmp_path.iterdir()) == []
    store.put("v", b"after")  # the stage went back to be reused
    assert store.get("v") == b"after"


def test_a_file_system_refusing_direct_io_gets_ordinary_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_nb import _store

    real_pwrite = os.pwrite

    def refuse_direct(fd: int, data: object, offset: int) -> int:
        if _store.fcntl.fcntl(fd, _store.fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(_store.os, "pwrite", refuse_direct)
    data = os.urandom((6 << 20) + 5)
    LocalStore(tmp_path).put("v", data)
    assert LocalStore(tmp_path).get("v") == data


@pytest.mark.usefixtures("stage_writer")
def test_a_failed_direct_write_leaves_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    with pytest.raises(RuntimeError), store.writer("v") as out:
        out.write(os.urandom(13 << 20))
        raise RuntimeError("crash mid-write")
    assert not store.has("v") and list(tmp_path.iterdir()) == []
    store.put("v", b"after")  # the stage went back to be reused
    assert store.get("v") == b"after"


def test_stages_after_the_first_go_out_on_the_native_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage_writer: str) -> None:
    from ckpt_nb import _native

    submitted: list[int] = []
    real_submit = _native.BackgroundWriter.submit

    def counted(self: _native.BackgroundWriter, data: np.ndarray, offset: int) -> int:
        submitted.append(offset)
        return real_submit(self, data, offset)

    monkeypatch.setattr(_native.BackgroundWriter, "submit", counted)
    data = os.urandom((13 << 20) + 11)
    LocalStore(tmp_path).put("v", data)
    assert LocalStore(tmp_path).get("v") == data
    if stage_writer == "native thread":  # the first stage finds out whether direct I/O works
        assert submitted == [4 << 20, 8 << 20, 12 << 20, 13 << 20]  # the last, padded
    else:
        assert submitted == []


def test_without_a_writer_thread_the_pack_thread_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_nb import _native

    def no_thread(fd: int) -> None:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(_native, "writer", True)
    monkeypatch.setattr(_native, "BackgroundWriter", no_thread)
    data = os.urandom((9 << 20) + 3)
    LocalStore(tmp_path).put("v", data)
    assert LocalStore(tmp_path).get("v") == data


def test_the_native_writer_reports_the_first_failed_write(tmp_path: Path) -> None:
    from ckpt_nb import _native

    if not _native.writer:
        pytest.skip("the C kernels were not built")
    path = tmp_path / "read-only"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    try:
        writer = _native.BackgroundWriter(fd)
        block = np.ones(4096, dtype=np.uint8)
        number = writer.submit(block, 0)
        with pytest.raises(OSError) as caught:
            writer.wait(number)
        assert caught.value.errno == errno.EBADF
        with pytest.raises(OSError, match="Bad file descriptor"):
            writer.submit(block, 4096)  # nothing more is queued after a failure
        with pytest.raises(OSError):
            writer.close()
        with pytest.raises(ValueError, match="before close"):
            writer.submit(block, 0)
    finally:
        os.close(fd)


def test_prefetch_ranges_are_merged() -> None:
    from ckpt_nb._store import _merged

    assert _merged([(10, 5), (0, 4), (4, 2), (12, 10), (40, 1)]) == [(0, 6), (10, 12), (40, 1)]


def test_a_store_url_with_a_trailing_slash_is_the_same_store() -> None:
    """Each spelling had a catalog cache and a lock of its own, and each one's gc
    deleted the other's checkpoints."""
    from ckpt_nb._session import store_url

    url = f"memory://ckpt-nb-slash-{uuid.uuid4().hex}/exp"
    assert FsspecStore(url + "/").url == FsspecStore(url).url == url
    assert store_url(url + "//") == store_url(url) == url


class RefusingFileSystem:
    """What an object store's client raises when its endpoint is down (botocore's
    errors are not OSErrors): the one part of a real outage made up here."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        def refuse(*args: object, **kwargs: object) -> None:
            if name == "invalidate_cache":
                return None
            raise RuntimeError("Could not connect to the endpoint URL")

        return refuse


def test_a_backend_failure_is_a_store_error_that_names_the_store() -> None:
    url = f"memory://ckpt-nb-down-{uuid.uuid4().hex}"
    store = FsspecStore(url)
    store.fs = RefusingFileSystem()
    for call in (lambda: store.get("a"), lambda: store.has("a"), lambda: store.size("a"),
                 lambda: list(store.list("packs")), lambda: store.delete("a"),
                 lambda: store.put("a", b"x")):
        with pytest.raises(StoreError, match=f"at {url} failed: Could not connect"):
            call()


@pytest.mark.parametrize("interrupts", [1, 2])
def test_a_ctrl_c_as_the_native_writer_stops_leaves_no_thread_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupts: int) -> None:
    """A real SIGINT as the pack's writer stops its native thread (one more as it is
    stopped again on the way out): the thread was left running, writing from stages put
    back for the next file, into a descriptor closed under it."""
    from ckpt_nb import _native

    if not _native.writer:
        pytest.skip("the C kernels were not built")
    store = LocalStore(tmp_path)
    data = os.urandom((13 << 20) + 11)
    store.put("warm", data)
    threads = set(os.listdir("/proc/self/task"))  # (ids: one of an earlier test may end)
    left = [interrupts]

    real_close = _native.BackgroundWriter.close

    def close(self: _native.BackgroundWriter) -> None:
        if left[0]:  # (as a Ctrl-C lands at the entry of close, before its thread stops)
            left[0] -= 1
            signal.raise_signal(signal.SIGINT)
        real_close(self)

    monkeypatch.setattr(_native.BackgroundWriter, "close", close)
    with pytest.raises(KeyboardInterrupt):
        store.put("v", data)
    assert left == [0]
    assert not set(os.listdir("/proc/self/task")) - threads  # (no thread of its own left)
    assert not store.has("v")
    other = os.urandom((9 << 20) + 5)
    store.put("v", other)  # (the stages, back to be reused, hold nothing of a thread's)
    assert store.get("v") == other and store.get("warm") == data
