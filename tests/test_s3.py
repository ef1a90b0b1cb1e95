"""Object storage for real: an S3-compatible server (moto's) on loopback, through s3fs.

Each test gets a bucket of its own and a home folder of its own (an object store's
catalog is a cache under ``~/.cache/ckpt_nb``); "another machine" is another home.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CREDENTIALS, Holder, s3_server

from ckpt_nb import (CheckpointManager, CheckpointNotFoundError, CorruptCheckpointError,
                     FsspecStore, StoreError)
from ckpt_nb.cli import main as cli
import warm_python  # (fresh interpreters forked from a warm one)

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto")

def weights(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(300_000, generator=generator),
            "h": torch.randn(1000, generator=generator).half()}


def test_saves_restore_bit_exact_and_gc_keeps_what_is_kept(bucket: str) -> None:
    url = f"s3://{bucket}/exp"
    mgr = CheckpointManager(url, strategy="incremental", max_to_keep=2)
    saved = {}
    state = weights(0)
    for step in range(4):
        state["w"][step * 1000:(step + 1) * 1000] += 1  # (a delta against the one before)
        saved[mgr.save(h=Holder(state), step=step)] = {k: v.clone() for k, v in state.items()}
    ids = mgr.list()["id"].tolist()
    assert len(ids) == 2 and mgr.verify().ok
    assert mgr.gc().packs_deleted == 0
    for cid in ids:
        back = CheckpointManager(url).load(cid).state["h"]
        assert all(torch.equal(back[k], saved[cid][k]) for k in back)


def test_another_process_save_is_seen_not_taken_for_corruption(bucket: str) -> None:
    """fsspec's listing cache, filled by this process, hid the other one's new pack and
    manifest: verify() called the new checkpoint corrupt, restore("latest") skipped it."""
    url = f"s3://{bucket}/exp"
    mgr = CheckpointManager(url)
    mgr.save(h=Holder(weights(1)), step=1)
    assert mgr.verify().ok and mgr.gc().packs_deleted == 0  # (listings now cached)
    writer = textwrap.dedent(f"""
        import torch, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from conftest import Holder
        from test_s3 import weights
        from ckpt_nb import CheckpointManager
        print(CheckpointManager({url!r}).save(h=Holder(weights(2)), step=2))
    """)
    new = warm_python.run([sys.executable, "-c", writer], env=os.environ,
                          check=True).stdout.split()[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mgr.list()["id"].tolist()[-1] == new and mgr.verify().ok
        target = Holder({})
        ck = mgr.restore("latest", h=target)
    assert ck.id == new and torch.equal(target.state["w"], weights(2)["w"])


def test_one_store_under_two_spellings_of_its_url(bucket: str) -> None:
    """s3://b/exp and s3://b/exp/ had a catalog cache and a lock each, and each one's gc
    deleted the other's checkpoints."""
    first = CheckpointManager(f"s3://{bucket}/exp")
    a = first.save(h=Holder(weights(3)))
    second = CheckpointManager(f"s3://{bucket}/exp/")
    b = second.save(h=Holder(weights(4)))
    assert second.gc().packs_deleted == 0
    assert first.list()["id"].tolist() == [a, b] and first.verify().ok


def test_the_cli_reads_an_s3_store_and_refuses_a_mistyped_one(
        bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    CheckpointManager(f"s3://{bucket}/exp").save(h=Holder(weights(5)), step=7)
    assert cli(["ls", f"s3://{bucket}/exp"]) == 0 and "7" in capsys.readouterr().out
    assert cli(["ls", f"s3://{bucket}/typo"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint store at" in err and "bucket" not in err.replace(bucket, "")
    assert cli(["ls", f"s3://{bucket}x/exp"]) == 2  # (as a save says it)
    assert f"the bucket '{bucket}x' does not exist" in capsys.readouterr().err
    assert not s3fs.S3FileSystem().exists(f"{bucket}/typo")  # (nothing written there)


def test_a_chunk_stacked_on_deleted_deltas_is_stored_whole_in_the_bucket(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc reads the chain back with ranged reads (an object store maps no pack), writes
    the chunk whole in a new pack and drops what it stacked on; another machine's
    catalog, rebuilt from the bucket, restores it."""
    url = f"s3://{bucket}/exp"
    mgr = CheckpointManager(url, strategy="incremental", full_every=30)
    state, ids = weights(0), []
    for step in range(11):  # the first chunk of w changes at every save
        state["w"][step * 1000:(step + 1) * 1000] += 1
        ids.append(mgr.save(h=Holder(state), step=step))
    assert max(c.depth for c in mgr.catalog.all_chunks()) == 10
    for cid in ids[:-1]:
        mgr.delete(cid)
    chunks = mgr.catalog.all_chunks()  # the kept one on one delta, it on a whole chunk
    assert [c.depth for c in chunks if c.base] == [10]
    assert len(chunks) == len(mgr.catalog.refs()) + 1
    assert mgr.verify().ok
    back = mgr.load(ids[-1]).state["h"]
    assert all(torch.equal(back[k], state[k]) for k in state)
    monkeypatch.setenv("HOME", str(tmp_path / "another-home"))
    with pytest.warns(RuntimeWarning, match="rebuilt from the store"):
        elsewhere = CheckpointManager(url)
    assert elsewhere.list()["id"].tolist() == [ids[-1]] and elsewhere.verify().ok
    back = elsewhere.load(ids[-1]).state["h"]
    assert all(torch.equal(back[k], state[k]) for k in state)


def on_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, n: int) -> None:
    """Act as machine ``n``: its own HOME, so its own catalog cache."""
    monkeypatch.setenv("HOME", str(tmp_path / f"home-{n}"))


def test_another_machines_compaction_is_read_back_not_collected(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gc on machine 1 moved chunks into a new pack; machine 2's catalog, whose
    checkpoints had not changed, still placed them in the old one, and its next gc
    (retention's) deleted the new pack as an orphan: its own new checkpoint was lost."""
    url = f"s3://{bucket}/exp"
    big = torch.randn(600_000)
    states = [{"big": big, "own": torch.randn(300_000)} for _ in range(3)]
    warnings.simplefilter("ignore", RuntimeWarning)  # (catalogs rebuilt: the point here)
    on_machine(monkeypatch, tmp_path, 1)
    first = CheckpointManager(url, codec="none")
    c1 = first.save(h=Holder(states[0]), rng=False)
    c2 = first.save(h=Holder(states[1]), rng=False)
    first.delete(c1)  # (c1's pack stays: two thirds of it are c2's)
    on_machine(monkeypatch, tmp_path, 2)
    second = CheckpointManager(url, codec="none", max_to_keep=1)
    assert second.list()["id"].tolist() == [c2]
    on_machine(monkeypatch, tmp_path, 1)
    assert first.gc(compact_below=0.99).packs_compacted == 1
    on_machine(monkeypatch, tmp_path, 2)
    assert torch.equal(second.load(c2).state["h"]["own"], states[1]["own"])
    c3 = second.save(h=Holder(states[2]), rng=False)  # retention drops c2, and runs gc
    assert second.verify().ok
    on_machine(monkeypatch, tmp_path, 3)
    third = CheckpointManager(url)
    assert third.list()["id"].tolist() == [c3]
    assert torch.equal(third.load(c3).state["h"]["own"], states[2]["own"])


def test_ids_are_resolved_against_what_the_bucket_holds_now(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{bucket}/exp"
    warnings.simplefilter("ignore", RuntimeWarning)
    on_machine(monkeypatch, tmp_path, 1)
    first = CheckpointManager(url)
    c1 = first.save(h=Holder(weights(1)))
    on_machine(monkeypatch, tmp_path, 2)
    second = CheckpointManager(url)
    on_machine(monkeypatch, tmp_path, 1)
    c2 = first.save(h=Holder(weights(2)))
    on_machine(monkeypatch, tmp_path, 2)
    assert second.resolve("latest") == c2
    assert second.pin(c2) == c2 and torch.equal(second.load(c2).state["h"]["w"], weights(2)["w"])
    second.delete(c1)
    assert second.list()["id"].tolist() == [c2]


def test_a_pack_cut_short_in_the_bucket_is_corruption_and_latest_falls_back(
        bucket: str) -> None:
    """A ranged read past an object's end is S3's 416: it was a StoreError, which
    restore("latest") does not fall back past."""
    url = f"s3://{bucket}/exp"
    mgr = CheckpointManager(url)
    old = mgr.save(h=Holder(weights(1)), rng=False)
    new = mgr.save(h=Holder(weights(2)), rng=False)
    rows = [mgr.catalog.chunks([d])[d] for d, _ in mgr._manifest(new)["storages"][0]["chunks"]]
    later = max(rows, key=lambda r: r.offset)
    fs, path = s3fs.S3FileSystem(), f"{bucket}/exp/{later.pack}"
    fs.pipe_file(path, fs.cat_file(path)[:later.offset])  # cut before that chunk
    fresh = CheckpointManager(url)
    assert list(fresh.verify().bad) == [new]
    with pytest.warns(UserWarning, match=f"skipping checkpoint {new}"):
        assert fresh.restore("latest", h=Holder({})).id == old


def test_the_cli_says_the_backend_failed_when_it_cannot_reach_the_store(
        bucket: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """s3fs's isfile() takes a refused connection for "no such file": the CLI said there
    was no store there."""
    import fsspec.config

    CheckpointManager(f"s3://{bucket}/exp").save(h=Holder(weights(5)))
    # (a port nothing listens on, held bound meanwhile: let go, another test process's
    # server could take it)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
        monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", dead)
        retries = {"retries": {"max_attempts": 1}}
        monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": dead,
                                                       "config_kwargs": retries})
        assert cli(["ls", f"s3://{bucket}/exp"]) == 1
    err = capsys.readouterr().err
    assert "no checkpoint store" not in err and f"s3://{bucket}/exp" in err, err


def test_a_misspelt_bucket_is_refused_not_created(bucket: str) -> None:
    """A first write's makedirs created it (on AWS: a bucket in whatever account)."""
    with pytest.raises(StoreError, match="bucket does not exist.*creates no bucket"):
        CheckpointManager(f"s3://{bucket}x/exp")
    assert not s3fs.S3FileSystem().exists(f"{bucket}x")


def test_the_catalog_cache_follows_xdg_cache_home(bucket: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    CheckpointManager(f"s3://{bucket}/exp").save(h=Holder(weights(1)))
    assert list((tmp_path / "cache" / "ckpt_nb").glob("*/catalog.sqlite"))


def test_an_unwritable_catalog_cache_opens_the_store_to_read_and_says_why(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only home (a container's, CI's): opening failed with pathlib's bare
    "No such file or directory: /proc/nope", and ls with it."""
    url = f"s3://{bucket}/exp"
    saved = CheckpointManager(url).save(h=Holder(weights(1)), step=3)
    (tmp_path / "a file").write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a file" / "cache"))
    with pytest.warns(RuntimeWarning, match=f"the catalog of {url} cannot be cached in "
                                            f"{tmp_path / 'a file' / 'cache'}.*rebuilt in "
                                            "memory, to read only: 1 checkpoint.*"
                                            "XDG_CACHE_HOME.*catalog="):
        mgr = CheckpointManager(url)
    assert mgr.list()["id"].tolist() == [saved]
    restored = Holder({})
    mgr.restore("latest", h=restored)
    assert torch.equal(restored.state["w"], weights(1)["w"])
    with pytest.raises(StoreError, match="open to read only, since its catalog cannot be "
                                         "cached in .*XDG_CACHE_HOME"):
        mgr.save(h=Holder(weights(2)))
    done = warm_python.run([sys.executable, "-m", "ckpt_nb", "ls", url], timeout=120)
    assert done.returncode == 0 and saved in done.stdout
    assert done.stderr.startswith(f"ckpt-nb: warning: the catalog of {url} cannot be cached")
    assert done.stderr.count("\n") == 1 and "XDG_CACHE_HOME" in done.stderr, done.stderr
    with pytest.warns(RuntimeWarning, match="was missing, so it was rebuilt"):
        elsewhere = CheckpointManager(url, catalog=tmp_path / "here.sqlite")
    assert elsewhere.list()["id"].tolist() == [saved]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="runs a process as a user with no passwd entry, which needs root")
def test_a_user_with_no_home_opens_the_store_to_read_and_says_why(bucket: str) -> None:
    """A container run as a uid with no passwd entry and no HOME (docker run --user N):
    opening failed with pathlib's bare "Could not determine home directory"."""
    url = f"s3://{bucket}/exp"
    saved = CheckpointManager(url).save(h=Holder(weights(1)), step=3)
    env = {name: value for name, value in os.environ.items()
           if name not in ("HOME", "XDG_CACHE_HOME")}
    # (it becomes that user once Python, torch, pandas and the S3 client are loaded, as root: the
    # interpreter here may lie in root's home, which no other user can read)
    done = warm_python.run([sys.executable, "-c", textwrap.dedent(f"""
            import os, warnings
            import pandas, s3fs
            from ckpt_nb import CheckpointManager, StoreError
            s3fs.S3FileSystem().ls({bucket!r})
            os.setgid(54321)
            os.setuid(54321)  # (no passwd entry for it: Path.home() has nothing to go on)
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                mgr = CheckpointManager({url!r})
            print(mgr.list()["id"].tolist())
            print(*(str(w.message) for w in said), sep="\\n")
            try:
                mgr.delete({saved!r})
            except StoreError as exc:
                print("refused:", exc)
            """)], timeout=120, env=env, cwd="/")
    assert done.returncode == 0, done.stderr
    listed, warned, refused = done.stdout.splitlines()[:3]
    assert listed == f"[{saved!r}]"
    assert re.search(f"the catalog of {url} cannot be cached in ~/.cache \\(this user has no "
                     "home folder, and XDG_CACHE_HOME is not set\\).*rebuilt in memory, to "
                     "read only.*XDG_CACHE_HOME.*catalog=", warned), warned
    assert refused.startswith("refused:") and "catalog=PATH" in refused, refused


def packs_of(bucket: str) -> set[str]:
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return set(fs.find(f"{bucket}/exp/packs"))


def test_a_checkpoint_whose_pack_left_the_bucket_is_named_damaged_not_collected(
        bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A pack deleted behind ckpt_nb's back (a lifecycle rule): the catalog read again
    from the bucket left its checkpoint out without a word, verify() said all was well,
    restore() said there was no such checkpoint, and gc() deleted its manifest."""
    url = f"s3://{bucket}/exp"
    mgr = CheckpointManager(url)
    ids, packs = [], []
    for seed in range(3):
        before = packs_of(bucket)
        ids.append(mgr.save(h=Holder(weights(seed))))
        packs.append(packs_of(bucket) - before)
    s3fs.S3FileSystem().rm_file(packs[1].pop())
    with pytest.warns(RuntimeWarning, match=f"left out: checkpoint {ids[1]}.*kept in the store"):
        assert mgr.list()["id"].tolist() == [ids[0], ids[2]]
    report = mgr.verify()
    assert list(report.bad) == [ids[1]] and "is damaged" in report.bad[ids[1]][0]
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {ids[1]} is damaged"):
        mgr.restore(ids[1], h=Holder({}))
    assert mgr.gc().manifests_deleted == 0
    assert s3fs.S3FileSystem().exists(f"{bucket}/exp/manifests/{ids[1]}.json.zst")
    assert cli(["verify", url]) == 1 and f"bad: {ids[1]}" in capsys.readouterr().out


def test_a_url_with_an_empty_path_segment_is_refused(
        bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    """s3://b//x saved where no listing of it looked: list() showed nothing."""
    for url in (f"s3://{bucket}//exp", f"s3://{bucket}/exp//run"):
        with pytest.raises(ValueError, match="empty path segment"):
            CheckpointManager(url)
        assert cli(["ls", url]) == 2 and "empty path segment" in capsys.readouterr().err
    assert not s3fs.S3FileSystem().find(bucket)  # (nothing written)


def test_the_catalog_cache_removed_while_open_is_made_again(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every later save failed with a FileNotFoundError naming the lock file."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    mgr = CheckpointManager(f"s3://{bucket}/exp")
    first = mgr.save(h=Holder(weights(1)))
    shutil.rmtree(tmp_path / "cache")
    with pytest.warns(RuntimeWarning, match="was missing, so it was rebuilt"):
        second = mgr.save(h=Holder(weights(2)))
    assert mgr.list()["id"].tolist() == [first, second] and mgr.gc().packs_deleted == 0
    assert list((tmp_path / "cache" / "ckpt_nb").glob("*/catalog.sqlite"))


def test_a_damaged_catalog_cache_is_moved_aside_and_rebuilt_from_the_store(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An object store's catalog is a cache on this machine of what the store holds: a
    damaged one had to be moved aside by hand (and its journal with it). It is moved
    aside, kept with its journal, once no other process has it open."""
    import sqlite3

    from test_catalog_damaged_page import garble_a_chunks_page

    from ckpt_nb._catalog import DamagedCatalog

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = f"s3://{bucket}/exp"
    with CheckpointManager(url) as mgr:
        ids = [mgr.save(h=Holder(weights(step)), step=step) for step in range(2)]
    [cache] = (tmp_path / "cache" / "ckpt_nb").glob("*/catalog.sqlite")
    garble_a_chunks_page(cache, "meta")
    # Another process has it open: it is left where it is, and said damaged as before.
    holder = warm_python.Popen(
        [sys.executable, "-c", "import sqlite3, sys\n"
         "db = sqlite3.connect(sys.argv[1]); db.execute('PRAGMA user_version').fetchone()\n"
         "print('open', flush=True); sys.stdin.readline()\n", str(cache)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        with pytest.raises(DamagedCatalog, match="is damaged: .*; it was not moved aside, "
                                                 "as another process has it open: wait until "
                                                 "that process has closed the store, then open "
                                                 "the store again, which moves the catalog "
                                                 "aside"):
            CheckpointManager(url)
        assert not list(cache.parent.glob("*.damaged-*"))
    finally:
        holder.communicate("\n", timeout=60)
    # A journal left by a process killed after a write (page 1's), beside the damage.
    warm_python.run([sys.executable, "-c", "import os, sqlite3, sys\n"
                    "db = sqlite3.connect(sys.argv[1]); db.execute('PRAGMA user_version = 7')\n"
                    "os._exit(0)\n", str(cache)], check=True, timeout=60)
    assert Path(f"{cache}-wal").stat().st_size > 0 and Path(f"{cache}-shm").exists()
    with pytest.warns(RuntimeWarning) as told:
        mgr = CheckpointManager(url)
    said = [str(w.message) for w in told if "catalog" in str(w.message)]
    [aside] = cache.parent.glob("catalog.sqlite.damaged-*[0-9]")
    assert said == [f"the catalog of {url} was damaged, and was moved aside to {aside} (with "
                    "its -wal and -shm files, where there were such), so it was rebuilt from "
                    "the store: 2 checkpoints recovered"], said
    with mgr:
        assert mgr.list()["id"].tolist() == ids and mgr.verify().ok
        ids.append(mgr.save(h=Holder(weights(2)), step=2))
    # (its journal's write kept: SQLite's last connection, the failed open's, folded the
    # journal into it as it closed; none of it is left beside the new cache)
    kept = sqlite3.connect(aside)
    assert kept.execute("PRAGMA user_version").fetchone()[0] == 7
    # (the page is random bytes: SQLite finds it malformed, a cell's text undecodable or a
    # cell's length too big, as the bytes fall)
    with pytest.raises(sqlite3.DatabaseError):
        kept.execute("SELECT * FROM meta").fetchall()
    kept.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the new cache, as any other)
        assert CheckpointManager(url).list()["id"].tolist() == ids


def test_a_damaged_catalog_cache_a_manager_here_holds_says_to_close_it(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Left where it was because a manager in this process had it open, the damaged cache
    was said to wait for "no other process", and to be moved aside by hand: it is moved
    aside by itself at the first opening after that manager is closed."""
    from test_catalog_damaged_page import garble_a_chunks_page

    from ckpt_nb import DamagedCatalog

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = f"s3://{bucket}/exp"
    first = CheckpointManager(url)
    saved = first.save(h=Holder(weights(1)))
    [cache] = (tmp_path / "cache" / "ckpt_nb").glob("*/catalog.sqlite")
    garble_a_chunks_page(cache, "meta")
    with pytest.raises(DamagedCatalog, match=re.escape(
            f"the catalog {cache} is damaged: its SQLite file (") + r".*\) is not what "
            "ckpt_nb writes; it was not moved aside, as a CheckpointManager in this process "
            r"has it open: close that one \(close\(\), or the end of its with block\), then "
            "open the store again, which moves the catalog aside") as said:
        CheckpointManager(url)
    assert "no other process" not in str(said.value)
    assert not list(cache.parent.glob("*.damaged-*"))
    first.close()
    with pytest.warns(RuntimeWarning, match="was damaged, and was moved aside"):
        again = CheckpointManager(url)
    with again:
        assert again.list()["id"].tolist() == [saved]


def test_a_catalog_cache_damaged_where_its_catch_up_reads_is_moved_aside_too(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opened whole, the cache is compared with the store (its checkpoints read): a damaged
    page found there is moved aside and rebuilt as one found opening it."""
    from test_catalog_damaged_page import garble_a_chunks_page

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = f"s3://{bucket}/exp"
    with CheckpointManager(url) as mgr:
        ids = [mgr.save(h=Holder(weights(step)), step=step) for step in range(2)]
    [cache] = (tmp_path / "cache" / "ckpt_nb").glob("*/catalog.sqlite")
    garble_a_chunks_page(cache, "checkpoints")
    with pytest.warns(RuntimeWarning, match=f"the catalog of {url} was damaged, and was moved "
                                            f"aside to {cache}.damaged-.*2 checkpoints"):
        mgr = CheckpointManager(url)
    with mgr:
        assert mgr.list()["id"].tolist() == ids and mgr.verify().ok


def test_a_server_that_never_answers_fails_in_seconds_not_minutes(
        bucket: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """botocore's defaults, retried by s3fs, waited 7 minutes before a read timeout.
    The store's timeouts reach botocore's client; the dead server is waited for with
    them at 0.3 s (the same settings and retries; at 5 s, ~27 s of waiting, now ~3.5: s3fs's
    five tries and its waits between them)."""
    import fsspec.config

    from ckpt_nb import _store

    timeouts = {"connect_timeout": 5, "read_timeout": 5, "retries": {"total_max_attempts": 1}}
    assert _store.S3_TIMEOUTS == timeouts
    live = FsspecStore(f"s3://{bucket}/exp")
    assert not live.has("anything")  # (botocore's client is made at the first request)
    config = live._files.s3.meta.config
    assert (config.connect_timeout, config.read_timeout,
            config.retries.get("total_max_attempts")) == (5, 5, 1)
    with monkeypatch.context() as scaled, socket.socket() as mute:
        scaled.setattr(_store, "S3_TIMEOUTS", {**timeouts, "connect_timeout": 0.3,
                                               "read_timeout": 0.3})
        mute.bind(("127.0.0.1", 0))  # takes connections (its backlog), answers nothing
        mute.listen(16)
        dead = f"http://127.0.0.1:{mute.getsockname()[1]}"
        scaled.setenv("FSSPEC_S3_ENDPOINT_URL", dead)
        scaled.setitem(fsspec.config.conf, "s3", {"endpoint_url": dead})
        start = time.monotonic()
        assert cli(["ls", f"s3://{bucket}/exp"]) == 1
        assert time.monotonic() - start < 45  # (without the store's own: minutes)
    assert "Read timeout" in capsys.readouterr().err
    # What the caller gives wins, key by key.
    store = FsspecStore(f"s3://{bucket}/exp", config_kwargs={"read_timeout": 120})
    assert store.fs.config_kwargs["read_timeout"] == 120
    assert store.fs.config_kwargs["connect_timeout"] == 5


def test_a_chain_around_s3_waits_as_s3_itself_does(bucket: str) -> None:
    """The timeouts were given by the URL's first scheme alone: dir::s3:// and
    async_wrapper::s3:// (and dir:// with target_protocol='s3') waited botocore's own
    60 s, retried by s3fs, for a server that does not answer."""
    timeouts = (5, 5, 1)
    for store, given in ((FsspecStore(f"dir::s3://{bucket}/chained"), timeouts),
                         (FsspecStore(f"async_wrapper::s3://{bucket}/wrapped"), timeouts),
                         (FsspecStore("dir://", path=f"{bucket}/target", target_protocol="s3"),
                          timeouts),
                         (FsspecStore(f"dir::s3://{bucket}/own",  # (the caller's win, key by key)
                                      s3={"config_kwargs": {"read_timeout": 9}}),
                          (5, 9, 1))):
        with CheckpointManager(store) as mgr:
            saved = mgr.save(h=Holder(weights(1)))
            assert mgr.list()["id"].tolist() == [saved]
        config = store._files.s3.meta.config  # (botocore's client, made at the first request)
        assert (config.connect_timeout, config.read_timeout,
                config.retries["total_max_attempts"]) == given, store


def test_the_callers_botocore_settings_reach_s3_wherever_they_are_given(bucket: str) -> None:
    """config_kwargs= for dir::s3:// went where fsspec gives a chain's options, to dir::,
    which ignored them (S3 waited 5 s, as the README said it would not); s3=
    {"config_kwargs": ...} for s3:// was overridden by the 5 s, and the caller's dict was
    changed in place; async_wrapper::dir:// over target_protocol='s3' got no timeouts."""
    import copy

    chained = {"config_kwargs": {"read_timeout": 60, "connect_timeout": 10}}
    for url, options, connect, read in (
            (f"dir::s3://{bucket}/a", chained, 10, 60),
            (f"dir::s3://{bucket}/a", {**chained, "s3": {"config_kwargs": {"read_timeout": 61}}},
             10, 61),  # (S3's own, key by key)
            ("dir://", {"path": f"{bucket}/b", "target_protocol": "s3", **chained}, 10, 60),
            (f"s3://{bucket}/c", {"s3": {"config_kwargs": {"read_timeout": 60}}}, 5, 60),
            (f"s3://{bucket}/c", {"config_kwargs": {"connect_timeout": 10},
                                  "s3": {"config_kwargs": {"read_timeout": 60}}}, 10, 60),
            ("async_wrapper::dir://", {"dir": {"target_protocol": "s3", "path": f"{bucket}/d"}},
             5, 5)):
        given = copy.deepcopy(options)
        store = FsspecStore(url, **options)
        assert options == given, url  # (the caller's, as they were)
        config = store._files.config_kwargs
        assert (config["connect_timeout"], config["read_timeout"],
                config["retries"]["total_max_attempts"]) == (connect, read, 1), (url, options)
        assert not store.has("ckpt_nb.json")  # (botocore's client, made at the first request)
        client = store._files.s3.meta.config
        assert (client.connect_timeout, client.read_timeout) == (connect, read), url


def test_a_dir_folder_over_s3_holds_the_store_at_the_urls_path(bucket: str) -> None:
    """fsspec gives a dir:: with no path of its own the path of what it wraps, and names
    the store by that path too: dir::s3://b/x saved at s3://b/x/b/x, another store than
    s3://b/x, with a catalog cache and a lock of its own. A store an earlier ckpt_nb
    saved there is named, not shown as an empty one."""
    with CheckpointManager(f"dir::s3://{bucket}/exp") as mgr:
        saved = mgr.save(h=Holder(weights(1)))
    assert f"{bucket}/exp/ckpt_nb.json" in s3fs.S3FileSystem().find(bucket)
    assert not s3fs.S3FileSystem().exists(f"{bucket}/exp/{bucket}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no rebuild: the same cache)
        for url in (f"s3://{bucket}/exp", f"async_wrapper::dir::s3://{bucket}/exp"):
            with CheckpointManager(url) as mgr:
                assert mgr.list()["id"].tolist() == [saved], url
    assert FsspecStore(f"dir::s3://{bucket}/exp").identity == \
        FsspecStore(f"s3://{bucket}/exp").identity
    # Saved by an earlier ckpt_nb: at the path inside itself.
    doubled = f"s3://{bucket}/old/{bucket}/old"
    with CheckpointManager(doubled) as mgr:
        old = mgr.save(h=Holder(weights(2)))
    with pytest.raises(StoreError, match=re.escape(
            f"dir::s3://{bucket}/old is the store at s3://{bucket}/old, which holds none, "
            f"while {doubled} holds one: an earlier ckpt_nb saved") + ".*" + re.escape(
            f"Open it as {doubled} (the same store), or move its files")):
        CheckpointManager(f"dir::s3://{bucket}/old")
    assert not s3fs.S3FileSystem().exists(f"{bucket}/old/ckpt_nb.json")  # (nothing made)
    assert CheckpointManager(f"dir::{doubled}").list()["id"].tolist() == [old]


def test_a_store_is_one_cache_under_s3a_and_two_on_two_servers(
        bucket: str, endpoint: str) -> None:
    """The catalog cache was keyed by the URL alone: s3a:// had a cache (and a lock) of
    its own, and one bucket name on two servers shared one."""
    cid = CheckpointManager(f"s3://{bucket}/exp").save(h=Holder(weights(1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no rebuild: the same cache)
        assert CheckpointManager(f"s3a://{bucket}/exp").list()["id"].tolist() == [cid]
    here = FsspecStore(f"s3://{bucket}/exp", endpoint_url=endpoint)
    there = FsspecStore(f"s3://{bucket}/exp", endpoint_url="http://127.0.0.1:1")
    assert here.identity == FsspecStore(f"s3a://{bucket}/exp/").identity
    assert here.identity != there.identity


def test_a_save_the_server_fails_says_so_and_a_refusal_names_the_credentials(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """"looking for packs/... failed" said neither that the save failed nor what of it
    was kept; "Forbidden" did not say what to check."""
    import fsspec.config

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    server = s3_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})  # every request checked
    url = next(server)
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", url)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": url})
    try:
        assert cli(["ls", "s3://locked/exp"]) == 1
        err = capsys.readouterr().err
        assert "AWS_ACCESS_KEY_ID" in err and "~/.aws" in err, err
        with pytest.raises(StoreError, match="check the credentials"):
            CheckpointManager("s3://locked/exp")
    finally:
        next(server, None)
    unreachable = s3_server()
    url = next(unreachable)
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", url)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": url})
    s3fs.S3FileSystem(endpoint_url=url).mkdir("going")
    mgr = CheckpointManager("s3://going/exp")
    mgr.save(h=Holder(weights(1)))
    next(unreachable, None)  # the server goes
    with pytest.raises(StoreError, match="saving a checkpoint failed, so it was not saved "
                                         r"\(the checkpoints saved before are intact\)"):
        mgr.save(h=Holder(weights(2)))


def test_no_credentials_or_half_of_them_say_where_credentials_come_from(
        bucket: str, tmp_path: Path) -> None:
    """"...failed: Unable to locate credentials" said nothing of what to set."""
    CheckpointManager(f"s3://{bucket}/exp").save(h=Holder(weights(1)))
    bare = {name: value for name, value in os.environ.items()
            if name not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                            "AWS_PROFILE")}
    bare.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
                AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    for env, said in ((bare, "Unable to locate credentials"),
                      ({**bare, "AWS_ACCESS_KEY_ID": "testing"}, "Partial credentials found")):
        done = warm_python.run([sys.executable, "-m", "ckpt_nb", "ls", f"s3://{bucket}/exp"],
                               timeout=120, env=env)
        assert done.returncode == 1 and said in done.stderr, done.stderr
        assert "(check the credentials: the AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY " \
               "environment variables, ~/.aws/credentials" in done.stderr, done.stderr


class StallingRelay:
    """A TCP relay to the S3 server that stops reading a connection once it has passed
    ``limit`` bytes of a request on: small requests go through, a large upload stalls
    midway, as behind a server that stops reading the body."""

    def __init__(self, target_port: int, limit: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target, self.limit, self.held = target_port, limit, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.held += [client, server]
            threading.Thread(target=self._pump, args=(client, server, self.limit),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None),
                             daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, limit: int | None) -> None:
        passed = 0
        with contextlib.suppress(OSError):
            while limit is None or passed < limit:
                data = source.recv(1 << 16)
                if not data:
                    return
                sink.sendall(data)
                passed += len(data)

    def close(self) -> None:
        for sock in (self.listener, *self.held):
            sock.close()


def test_an_upload_the_server_stops_reading_fails_the_save_in_time(
        bucket: str, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp has no write timeout: the save hung for good, and in a notebook every save
    after it, and the end of the cell."""
    import fsspec.config

    from ckpt_nb import _store
    url = f"s3://{bucket}/exp"
    with CheckpointManager(url) as mgr:
        first = mgr.save(h=Holder(weights(1)))
    relay = StallingRelay(int(endpoint.rsplit(":", 1)[1]), limit=1 << 20)
    try:
        stalled = f"http://127.0.0.1:{relay.port}"
        monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", stalled)
        monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": stalled})
        monkeypatch.setattr(_store, "UPLOAD_SECONDS", 3.0)  # (and 1 s per GiB)
        monkeypatch.setattr(_store, "UPLOAD_MIN_RATE", 1 << 30)
        big = {"w": torch.randn(8_000_000, generator=torch.Generator().manual_seed(2))}
        with pytest.warns(RuntimeWarning, match="rebuilt"):  # (another endpoint's cache)
            mgr = CheckpointManager(FsspecStore(url, endpoint_url=stalled))
        with mgr:
            start = time.monotonic()
            with pytest.raises(StoreError, match="the server stopped reading it.*nothing was "
                                                 "saved"):
                mgr.save(h=Holder(big))
            assert time.monotonic() - start < 30
    finally:
        relay.close()
    with CheckpointManager(FsspecStore(url, endpoint_url=endpoint)) as mgr:
        assert mgr.list()["id"].tolist() == [first]
        assert torch.equal(mgr.load(first).state["h"]["w"], weights(1)["w"])


def test_an_upload_leaves_no_spool_file_to_outlive_a_killed_kernel(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spool was a named temporary file: a kernel killed mid-upload (out of memory)
    left a checkpoint's size in /tmp each time."""
    import tempfile
    spools = tmp_path / "tmp"
    spools.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spools))
    store = FsspecStore(f"s3://{bucket}/exp")
    with store.writer("blob") as writer:
        writer.write(b"x" * 1000)
        assert list(spools.iterdir()) == []
    assert store.get("blob") == b"x" * 1000
    with CheckpointManager(store) as mgr:
        cid = mgr.save(h=Holder(weights(3)))
    assert torch.equal(CheckpointManager(f"s3://{bucket}/exp").load(cid).state["h"]["w"],
                       weights(3)["w"])


def test_every_no_store_error_names_a_missing_bucket(
        bucket: str, shell: Any) -> None:
    """The CLI said the bucket did not exist; %ckpt_list, explore() and rollback() said
    only "no checkpoint store at ..."."""
    import ckpt_nb

    url = f"s3://{bucket}x/exp"
    said = f"the bucket '{bucket}x' does not exist (ckpt_nb creates no bucket"
    with pytest.raises(CheckpointNotFoundError, match=re.escape(said)):
        ckpt_nb.plot_metrics(url)
    with pytest.raises(CheckpointNotFoundError, match=re.escape(said)):
        ckpt_nb.rollback(directory=url, namespace={})
    result = shell.run_cell(f"%ckpt_list {url}")
    assert said in str(result.error_in_exec), result.error_in_exec


def test_the_magics_name_an_s3_store_by_its_url(bucket: str, shell: Any, capsys) -> None:
    """The line form's first line and %ckpt_status named it 'bucket/line' (its root, not
    its URL), which %ckpt_list then took for a folder here."""
    url = f"s3://{bucket}/line"
    shell.run_cell("import torch\nmodel = torch.nn.Linear(2, 1)\n"
                   "opt = torch.optim.SGD(model.parameters(), lr=0.1)")
    assert shell.run_cell(f"%ckpt_auto --dir {url}").success
    assert shell.run_cell("model(torch.ones(1, 2)).sum().backward(); opt.step()").success
    assert f"-> {url}\n" in capsys.readouterr().out
    shell.run_cell("%ckpt_status")
    assert f"directory: {url}" in capsys.readouterr().out
    listed = shell.run_cell("%ckpt_list")
    assert listed.success and len(listed.result) == 1, listed.error_in_exec
    shell.run_cell("%ckpt_auto --off")
