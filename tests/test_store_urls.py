"""fsspec URLs that cannot hold a store, or whose server is not there: refused by name,
with what to do, before anything is written."""

from __future__ import annotations

import re
import socket
import zipfile
from pathlib import Path

import pytest

from ckpt_nb import CheckpointManager, FsspecStore, StoreError
from ckpt_nb.cli import main as cli


def test_a_file_system_that_only_reads_is_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """http:// was said to have "an empty path segment ('//')", and zip:// raised
    IsADirectoryError naming a folder: neither said that it cannot be written."""
    archive = tmp_path / "runs.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("exp/ckpt_nb.json", '{"format": 3}')
    web = r"a web server's files .*give a folder's path or a URL that can be written"
    for url, said in (("http://example.com/runs/exp", web), ("https://example.com/x", web),
                      (f"zip://exp::file://{archive}",
                       "an archive's files .*unpack the archive into a folder")):
        scheme = url.split("://")[0]
        with pytest.raises(ValueError, match=f"{scheme}:// reads {said}"):
            CheckpointManager(url)
        assert cli(["ls", url]) == 2 and f"{scheme}:// reads" in capsys.readouterr().err


def test_a_server_that_refuses_the_connection_as_the_store_opens_is_a_store_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    """ftp:// connects as it opens: a refused connection was a bare ConnectionRefusedError
    ("ls failed: Connection refused" from the CLI), naming no store."""
    # (a port nothing listens on, held bound meanwhile: let go, another test process's
    # server could take it)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"ftp://127.0.0.1:{probe.getsockname()[1]}/exp"
        with pytest.raises(StoreError, match=f"opening {url} failed: .*Connection refused "
                                             r"\(check that the server is up"):
            FsspecStore(url)
        assert cli(["ls", url]) == 1 and f"opening {url} failed" in capsys.readouterr().err


def test_a_cache_or_a_reader_inside_the_chain_is_refused_by_name() -> None:
    """Only the URL's text and each file system's ``.fs`` were looked at: an
    async_wrapper's (``.sync_fs``) cache, and an http file system given as dir://'s
    target_protocol=, opened a store."""
    with pytest.raises(ValueError, match="Give the URL without simplecache::"):
        FsspecStore("async_wrapper::simplecache::memory://urls-cached")
    with pytest.raises(ValueError, match="dir://: http:// reads a web server's files"):
        FsspecStore("dir://", path="example.com/x", target_protocol="http")


def test_a_reader_in_a_chain_is_named_as_the_url_gives_it() -> None:
    """tar::s3://... was refused as "tar:// reads ...", a URL it was not given as."""
    with pytest.raises(ValueError, match=r"tar::s3://b/x.tar: tar:: reads an archive's"):
        FsspecStore("tar::s3://b/x.tar")


def test_a_failure_to_open_that_reaches_no_server_does_not_blame_one(tmp_path: Path) -> None:
    """Every OSError as the store opened said "check that the server is up": a cache
    folder under a file (a local error, no server asked) said it too."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(StoreError, match="opening filecache::memory://x failed: .*Not a "
                                         "directory") as said:
        FsspecStore("filecache::memory://x", filecache={"cache_storage": f"{a_file}/c"})
    assert "server" not in str(said.value)


def test_a_chain_missing_what_it_wraps_is_refused_naming_the_url() -> None:
    """``dir://x`` with no target let fsspec's AttributeError out ('NoneType' object has
    no attribute 'startswith')."""
    with pytest.raises(ValueError, match=r"^dir://x: fsspec cannot open it as given "
                                         r"\(AttributeError: .*\): a chained URL names what "
                                         r"it wraps"):
        FsspecStore("dir://x")


def test_a_store_at_a_file_systems_root_lists_its_keys_whole() -> None:
    """A store at ``memory://``'s root (the fsspec store, not the private one the URL
    alone opens) listed 'acks/...pack' and 'anifests/...': each key's first letter cut,
    as the cut made room for a '/' after an empty root."""
    import fsspec
    import torch

    memory = fsspec.filesystem("memory")
    try:
        store = FsspecStore("memory://")
        with CheckpointManager(store) as mgr:
            ids = [mgr.save(torch.nn.Linear(2, 2), rng=False) for _ in range(2)]
        keys = set(store.list(""))  # (other tests' memory:// stores lie below it too)
        assert {"ckpt_nb.json", *(f"manifests/{cid}.json.zst" for cid in ids)} <= keys, keys
        assert not any(key.startswith(("acks/", "anifests/")) for key in keys), keys
        with CheckpointManager(FsspecStore("memory://")) as again:
            assert list(again.list()["id"]) == ids
            assert again.verify().ok
    finally:
        for top in ("packs", "manifests", "labels", "runs", "deleted", "ckpt_nb.json"):
            if memory.exists(f"/{top}"):
                memory.rm(f"/{top}", recursive=True)


def test_an_archive_given_as_an_option_is_refused_by_name(tmp_path: Path) -> None:
    """dir:// over target_protocol='zip' was refused as "[Errno 21] Is a directory", naming
    a folder (the archive's file system opens its file as it is made), not as zip://."""
    archive = tmp_path / "runs.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("q/ckpt_nb.json", '{"format": 3}')
    said = r"^dir://q: zip:// reads an archive's files .*unpack the archive into a folder"
    with pytest.raises(ValueError, match=said):
        FsspecStore("dir://q", target_protocol="zip", fo=str(archive))
    with pytest.raises(ValueError, match=said):
        FsspecStore("dir://q", target_protocol="zip", target_options={"fo": str(archive)})


def test_a_chain_part_that_nothing_uses_is_refused_naming_the_url(tmp_path: Path) -> None:
    """fsspec gives what follows a file system that wraps none to it as options it
    ignores: s3://bucket/exp::x opened s3://bucket/exp, another store than the URL says.
    A scheme no storage knows was named as the URL's first ('s3'), not as the one it is."""
    for url, holder, unused in (("s3://bucket/exp::x", "s3://bucket/exp", "::x"),
                                ("s3://bucket/a::b/exp", "s3://bucket/a", "::b/exp"),
                                ("memory://a::memory://b", "memory://a", "::memory://b")):
        with pytest.raises(ValueError, match=re.escape(
                f"{url}: {holder} holds files itself and wraps no other file system, so "
                f"fsspec would ignore what follows it ('{unused}')") + ".*give the URL of "
                "one store"):
            FsspecStore(url)
    with pytest.raises(ValueError, match=r"^s3://bucket/exp::xy: no storage knows the "
                                         r"scheme 'xy'"):
        FsspecStore("s3://bucket/exp::xy")


def test_chains_that_wrap_and_local_paths_with_colons_still_open(tmp_path: Path) -> None:
    """What the check of a chain's parts must leave alone: a file system that wraps the
    next (dir::, async_wrapper::), and a local folder whose name holds '::', as a path
    or a file:// URL (a LocalStore, never split by fsspec)."""
    import fsspec
    import torch

    try:
        for url in ("dir::memory://urls-wrapped", "async_wrapper::memory://urls-async"):
            with CheckpointManager(url) as mgr:
                saved = mgr.save(torch.nn.Linear(2, 2), rng=False)
                assert mgr.list()["id"].tolist() == [saved] and mgr.verify().ok
    finally:
        for top in ("/urls-wrapped", "/urls-async"):
            fsspec.filesystem("memory").rm(top, recursive=True)
    folder = tmp_path / "a::b"
    for location in (str(folder), folder.as_uri()):
        with CheckpointManager(location) as mgr:
            mgr.save(torch.nn.Linear(2, 2), rng=False)
            assert mgr.store.root == folder and len(mgr.list()) in (1, 2)


def test_an_empty_chain_part_or_a_scheme_in_capitals_is_refused_as_what_it_is() -> None:
    """Each was said to be a file system that "holds files itself" and wraps none: an
    empty part (named as '', or not at all) and 'DIR', which fsspec took for a local
    path; 'S3://' was a scheme no storage knows."""
    joins = "'::' joins a file system to the one it wraps"
    for url, said in (("::s3://bkt1/a", "starts with '::'"),
                      ("dir::::s3://bkt1/a", "has '::::', an empty part between two '::'"),
                      ("dir::s3://bkt1/a::", "ends with '::'")):
        with pytest.raises(ValueError, match=re.escape(f"{url} {said}: {joins}")):
            FsspecStore(url)
    for url, scheme in (("DIR::s3://bkt1/a", "DIR"), ("dir::S3://bkt1/a", "S3"),
                        ("S3://bkt1/a", "S3")):
        with pytest.raises(ValueError, match=re.escape(
                f"{url}: schemes are lower case: write {scheme.lower()!r}, not {scheme!r}")):
            FsspecStore(url)


def test_a_dir_folder_holds_the_store_at_the_urls_path(tmp_path: Path) -> None:
    """dir::memory://exp saved at /exp//exp/ (fsspec gives a dir:: with no path of its own
    the path of what it wraps, and names the store by it too); dir::file:// was refused
    naming the folder doubled; dir::dir:: doubles it whatever is done."""
    import fsspec
    import torch

    memory = fsspec.filesystem("memory")
    try:
        with CheckpointManager("dir::memory://urls-dir") as mgr:
            saved = mgr.save(torch.nn.Linear(2, 2), rng=False)
        found = memory.find("/urls-dir")
        assert "/urls-dir/ckpt_nb.json" in found and not any("//" in p for p in found), found
        with CheckpointManager("dir::memory://urls-dir") as mgr:
            assert mgr.list()["id"].tolist() == [saved] and mgr.verify().ok
        inner = FsspecStore("dir://sub::memory://urls-dir")  # (its own path: inside the folder)
        assert inner._files_root == "/urls-dir/sub"
    finally:
        memory.rm("/urls-dir", recursive=True)
    folder = tmp_path / "x"
    with pytest.raises(ValueError, match=re.escape(f"dir::{folder.as_uri()} is the folder "
                                                   f"{folder} on this machine")):
        FsspecStore(f"dir::{folder.as_uri()}")
    with pytest.raises(ValueError, match=r"^dir::dir::memory://q: fsspec gives each dir:: "
                                         r".*give one dir::"):
        FsspecStore("dir::dir::memory://q")


def test_an_empty_location_is_refused_not_taken_as_the_current_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``CheckpointManager(os.environ.get("CKPT_DIR", ""))`` with the variable unset made
    a store in the current folder, among the notebook's files, without a word; ``ckpt-nb
    ls ""`` listed that folder."""
    monkeypatch.chdir(tmp_path)
    for location in ("", "file://"):
        with pytest.raises(ValueError, match="location is empty.*pass a folder.*or a URL"):
            CheckpointManager(location)
        assert cli(["ls", location]) == 2 and "location is empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    CheckpointManager(".")  # (the current folder, named)
    assert (tmp_path / "ckpt_nb.json").is_file()
