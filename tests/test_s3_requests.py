"""The requests a command sends an S3 server (moto's, on loopback, behind a relay that
notes each request's line): what a listing already says is not asked again per object."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import Holder
from test_s3_outages import OutageRelay

from ckpt_nb import CheckpointManager
from ckpt_nb.cli import main as cli

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture
def relay(bucket: str, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[OutageRelay]:
    """The bucket's server behind a relay that notes each request, which this process
    (the CLI too) talks to."""
    import fsspec.config

    relay = OutageRelay(endpoint)
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", relay.endpoint)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": relay.endpoint})
    yield relay
    relay.close()


def test_ls_and_a_save_under_a_byte_budget_ask_no_size_per_object(
        bucket: str, relay: OutageRelay, capsys: pytest.CaptureFixture[str]) -> None:
    """The store's size came from a HEAD request per pack and per manifest (a 300
    checkpoint store's ls sent 421, in 16 s), and each save under max_bytes sent them
    all again, more than once: the listing holds each object's size."""
    url = f"s3://{bucket}/exp"
    with CheckpointManager(url) as mgr:
        ids = [mgr.save(h=Holder({"w": torch.randn(1000)}), rng=False) for _ in range(8)]
    folders = (f"/{bucket}/exp/manifests/", f"/{bucket}/exp/packs/")
    relay.requests.clear()
    assert cli(["ls", url]) == 0
    assert f"{len(ids)} checkpoints; " in capsys.readouterr().out
    assert [path for under in folders for path in relay.asked("HEAD", under)] == []
    with CheckpointManager(url, max_bytes=10**9) as mgr:
        relay.requests.clear()
        new = mgr.save(h=Holder({"w": torch.randn(1000)}), rng=False)
    asked = [path for under in folders for path in relay.asked("HEAD", under)]
    assert not [path for path in asked if new not in path and ".pack" not in path], asked
    assert len(asked) <= 4, asked  # (the save's own files checked, not the store's)


def test_a_command_reads_each_label_once_and_a_label_changed_elsewhere_again(
        bucket: str, relay: OutageRelay, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every catch-up with the store read every label (pin, note) again: one `show` got
    each 4-5 times. A label changed elsewhere, to a note as long, is still read again."""
    url = f"s3://{bucket}/exp"
    with CheckpointManager(url) as mgr:
        ids = [mgr.save(h=Holder({"w": torch.randn(100)}), rng=False) for _ in range(6)]
        for cid in ids[::2]:
            mgr.annotate(cid, f"note {cid}")
    relay.requests.clear()
    assert cli(["show", url, ids[2]]) == 0
    assert f"note:      note {ids[2]}" in capsys.readouterr().out
    read = relay.asked("GET", f"/{bucket}/exp/labels/")
    assert sorted(read) == sorted(f"/{bucket}/exp/labels/{cid}.json" for cid in ids[::2])
    with pytest.warns(RuntimeWarning, match="rebuilt from the store"):  # (new caches)
        here = CheckpointManager(url, catalog=tmp_path / "here" / "catalog.sqlite")
        elsewhere = CheckpointManager(url, catalog=tmp_path / "elsewhere" / "catalog.sqlite")
    assert here.list()["note"].tolist()[2] == f"note {ids[2]}"
    relay.requests.clear()
    here.list()
    assert relay.asked("GET", f"/{bucket}/exp/labels/") == []
    elsewhere.annotate(ids[2], f"NOTE {ids[2]}")
    elsewhere.pin(ids[1])
    frame = here.list()
    assert frame["note"].tolist()[2] == f"NOTE {ids[2]}"
    assert frame["pinned"].tolist() == [False, True, False, False, False, False]


def test_a_restore_of_many_small_tensors_asks_for_each_pack_not_each_chunk(
        bucket: str, relay: OutageRelay) -> None:
    """A restore sent one ranged GET per chunk, one after another: 1,610 for a model of
    400 small tensors and its AdamW state, 70 times as slow as from local disk. The
    ranges the restore reads are fetched together, a few GETs per pack."""
    url = f"s3://{bucket}/exp"
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(100)])
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with CheckpointManager(url) as mgr:
        cid = mgr.save(model, opt, rng=False)
        packs = list(mgr.store.list("packs"))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    with CheckpointManager(url) as mgr:
        mgr.list()
        relay.requests.clear()
        mgr.restore(cid, model=model, optimizer=opt)
        held = mgr.store._fetched._held  # type: ignore[attr-defined]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    reads = relay.asked("GET", f"/{bucket}/exp/packs/")
    assert 0 < len(reads) <= 2 * len(packs), (len(reads), packs)
    assert held == 0  # (each span dropped once read)
    with CheckpointManager(url) as mgr:  # (verify read each chunk alone too: 951 GETs)
        mgr.list()
        relay.requests.clear()
        assert mgr.verify().ok
        held = mgr.store._fetched._held  # type: ignore[attr-defined]
    reads = relay.asked("GET", f"/{bucket}/exp/packs/")
    assert 0 < len(reads) <= 3 * len(packs), (len(reads), packs)  # (its index too)
    assert held == 0


def test_a_save_lists_each_folder_of_the_store_once_whatever_its_size(
        bucket: str, relay: OutageRelay) -> None:
    """Each listing of a folder asked first whether it was one (s3fs's isdir: a listing
    of every page of it), then listed it again: packs/ and manifests/ twice per save, a
    second per save at 400 checkpoints. A save's LISTs are as many at 12 checkpoints as
    at 2: one per folder (s3fs's find asked whether an empty one was a file too)."""
    url = f"s3://{bucket}/exp"
    holder = Holder({"w": torch.zeros(10)})
    listed = {}
    with CheckpointManager(url) as mgr:
        for n in range(1, 13):
            holder.state["w"] += 1
            relay.requests.clear()
            mgr.save(h=holder, rng=False)
            if n in (2, 12):
                listed[n] = sorted(path for method, path in relay.requests
                                   if method == "GET" and "list-type=" in path)
    assert listed[2] == listed[12], listed
    assert len(listed[12]) == len({p.partition("prefix=")[2] for p in listed[12]}), listed
    for folder in ("packs", "manifests"):
        assert sum(f"prefix=exp%2F{folder}%2F" in p or f"prefix=exp/{folder}/" in p
                   for p in listed[12]) == 1, listed[12]


def test_a_restore_that_fails_holds_no_fetched_bytes_after(bucket: str,
                                                           relay: OutageRelay) -> None:
    """The spans a restore fetched stayed held (up to 256 MiB) where a chunk was bad or
    a Ctrl-C came, until the next restore from the store."""
    from ckpt_nb import CorruptCheckpointError

    url = f"s3://{bucket}/bad"
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(20)])
    with CheckpointManager(url) as mgr:
        cid = mgr.save(model, rng=False)
        pack = next(iter(mgr.store.list("packs")))
        fs, path = mgr.store.fs, mgr.store._path(pack)  # type: ignore[attr-defined]
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF  # (a chunk's byte: its checksum fails)
    fs.pipe_file(path, bytes(data))
    with CheckpointManager(url) as mgr:
        with pytest.raises(CorruptCheckpointError):
            mgr.restore(cid, model=model)
        assert mgr.store._fetched._held == 0  # type: ignore[attr-defined]
        assert not mgr.verify().ok
        assert mgr.store._fetched._held == 0  # type: ignore[attr-defined]


def test_a_pack_cut_short_in_the_bucket_is_not_deduplicated_against_and_sized_once(
        bucket: str, relay: OutageRelay) -> None:
    """A save trusted the catalog's rows of the chunks the store had: after a pack was
    cut short, every save returned an id and none restored. A save asks the size of each
    pack it reuses chunks from (a HEAD, a round trip) once per manager, not at each save."""
    import s3fs

    url = f"s3://{bucket}/exp"
    holder = Holder({"frozen": torch.randn(300_000), "w": torch.zeros(10)})  # (2 chunks)
    with CheckpointManager(url) as mgr:
        mgr.save(h=holder, rng=False)
        (first,) = {row.pack for row in mgr.catalog.all_chunks()}
    fs, path = s3fs.S3FileSystem(), f"{bucket}/exp/{first}"
    fs.pipe_file(path, fs.cat_file(path)[:100])
    saved, asked, packs = {}, [], []
    with pytest.warns(RuntimeWarning, match=first), CheckpointManager(url) as mgr:
        for _ in range(3):
            holder.state["w"] += 1
            relay.requests.clear()
            cid = mgr.save(h=holder, rng=False)
            saved[cid] = {name: value.clone() for name, value in holder.state.items()}
            asked.append(relay.asked("HEAD", f"/{bucket}/exp/packs/"))
            packs.append({row.pack for row in mgr._chunk_rows(mgr._manifest(cid)).values()
                          if row.raw_len == 1 << 20})  # (the frozen tensor's first chunk)
        for cid, state in saved.items():
            restored = mgr.load(cid).state["h"]
            assert all(torch.equal(restored[name], value) for name, value in state.items())
    # The frozen chunks, written again by the first save, lie in its pack; the next saves
    # reuse them, and the last asks nothing of it (the one before read the store again,
    # as the catalog records the cut pack as damaged: it asked its size then).
    (again,) = set.union(*packs)
    assert again != first
    assert not [path for path in asked[-1] if path.endswith(again)], asked


def test_a_save_under_a_byte_budget_lists_the_store_no_more_than_one_without(
        bucket: str, relay: OutageRelay, tmp_path: Path) -> None:
    """Each save under a byte budget listed packs/ and manifests/ again, with their sizes,
    to measure the store (6 listings a save, not 4): the first save measures it, the next
    ones count what they add. Another machine's save (another catalog) is measured."""
    url = f"s3://{bucket}/exp"

    def listings_of_a_save(mgr: CheckpointManager) -> int:
        relay.requests.clear()
        mgr.save(h=Holder({"w": torch.randn(1000)}), rng=False)
        return len([path for method, path in relay.requests
                    if method == "GET" and "list-type" in path])

    with CheckpointManager(url) as mgr:
        mgr.save(h=Holder({"w": torch.randn(1000)}), rng=False)
        unbudgeted = listings_of_a_save(mgr)
    with CheckpointManager(url, max_bytes=10**9) as mgr:
        mgr.save(h=Holder({"w": torch.randn(1000)}), rng=False)
        assert [listings_of_a_save(mgr) for _ in range(3)] == [unbudgeted] * 3
        assert mgr._bytes_bound == mgr.stored_bytes()
        with pytest.warns(RuntimeWarning, match="rebuilt from the store"), \
                CheckpointManager(url, catalog=tmp_path / "elsewhere" / "catalog.sqlite") as other:
            other.save(h=Holder({"w": torch.randn(5000)}), rng=False)
        assert listings_of_a_save(mgr) > unbudgeted
        assert mgr._bytes_bound == mgr.stored_bytes()
