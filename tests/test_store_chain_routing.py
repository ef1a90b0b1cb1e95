"""Where a chained URL's options go that no file system of the chain names: to the
innermost that takes any in its ``**kwargs`` (SFTP's, for paramiko), refused only where
none does, every one named in one refusal with the way to give it that works; and
fsspec's options for every file system (its instance and listings caches') reach the
innermost, the store's own, as well as the outermost. A real S3 server (moto's, on
loopback) that this process is told of only through the options."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
import torch
from conftest import Holder, s3_server, unconfigured_bucket
from fsspec.implementations.memory import MemoryFileSystem

from ckpt_nb import CheckpointManager, FsspecStore

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto")

KEY, SECRET = "routing-key", "routing-secret"


class KeywordsFS(MemoryFileSystem):
    """A file system whose real options come in ``**kwargs``, as fsspec's
    ``SFTPFileSystem(host, **ssh_kwargs)`` hands ``username=`` to paramiko."""

    protocol = "kwfs"

    def __init__(self, host: str | None = None, **ssh_kwargs: object) -> None:
        self.ssh_kwargs = ssh_kwargs
        super().__init__()

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path.removeprefix("kwfs://"))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from s3_server()


@pytest.fixture
def bucket(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return unconfigured_bucket(server, KEY, SECRET, tmp_path, monkeypatch)


def test_an_option_a_file_system_takes_in_its_kwargs_reaches_it() -> None:
    """username= at the top of dir::kwfs:// was refused as taken by no file system."""
    fsspec.register_implementation("kwfs", KeywordsFS, clobber=True)
    store = FsspecStore("dir::kwfs://host/x", username="u", password="p")
    assert store._files.ssh_kwargs == {"username": "u", "password": "p"}
    with CheckpointManager(store) as mgr:
        saved = mgr.save(h=Holder({"w": torch.arange(4.0)}), rng=False)
        assert mgr.list()["id"].tolist() == [saved]


def test_every_option_no_file_system_takes_is_named_with_a_way_that_works(
        bucket: str, server: str) -> None:
    """Only the first was named; a typo's refusal pointed also to s3={'endpoint': ...},
    which S3 refused at the first request; s3={...} beside target_protocol='s3' pointed to
    target_options={'s3': ...}, not to S3's own options."""
    with pytest.raises(TypeError) as refused:
        FsspecStore(f"dir::s3://{bucket}/x", endpoint=server, secret=SECRET, key=KEY)
    assert str(refused.value) == (
        f"dir::s3://{bucket}/x: no file system of the chain (dir, s3) takes the option "
        "'endpoint'; did you mean endpoint_url=?")
    with pytest.raises(TypeError) as refused:
        FsspecStore(f"dir::s3://{bucket}/x", endpoint=server, secrets=SECRET, key=KEY)
    assert str(refused.value) == (
        f"dir::s3://{bucket}/x: no file system of the chain (dir, s3) takes the options "
        "'endpoint' (did you mean endpoint_url=?), 'secrets' (did you mean secret=?)")
    with pytest.raises(TypeError) as refused:
        FsspecStore(f"dir::s3://{bucket}/x", endpoint_url=server, key=KEY, secret=SECRET,
                    regoin="x", zone="y", secrets=SECRET)
    assert str(refused.value) == (
        f"dir::s3://{bucket}/x: no file system of the chain (dir, s3) takes the options "
        "'regoin', 'zone', 'secrets' (did you mean secret=?) (an option in a file system's "
        "own options is given to it as it is: s3={'regoin': ..., 'zone': ...})")
    s3_options = {"endpoint_url": server, "key": KEY, "secret": SECRET}
    with pytest.raises(TypeError, match=re.escape(
            "dir://: no file system of the chain (dir, s3) takes the option 's3' "
            "(target_protocol='s3' takes its options as target_options={'endpoint_url': "
            "..., 'key': ..., 'secret': ...})")):
        FsspecStore("dir://", path=f"{bucket}/t", target_protocol="s3", s3=s3_options)
    with CheckpointManager(FsspecStore("dir://", path=f"{bucket}/t", target_protocol="s3",
                                       target_options=s3_options)) as mgr:
        saved = mgr.save(h=Holder({"w": torch.arange(4.0)}), rng=False)
        assert mgr.list()["id"].tolist() == [saved]


def test_every_file_systems_options_reach_the_innermost_too(bucket: str, server: str) -> None:
    """skip_instance_cache=True at the top of dir::s3:// gave dir:: a new instance and S3
    the cached one; use_listings_cache=False left S3's listings cached."""
    options = {"endpoint_url": server, "key": KEY, "secret": SECRET}
    url = f"dir::s3://{bucket}/x"
    first = FsspecStore(url, skip_instance_cache=True, **options)
    second = FsspecStore(url, skip_instance_cache=True, **options)
    assert first._files is not second._files
    store = FsspecStore(url, use_listings_cache=False, listings_expiry_time=5, **options)
    assert not store.fs.dircache.use_listings_cache
    assert not store._files.dircache.use_listings_cache
    assert store._files.dircache.listings_expiry_time == 5
    # (S3's own options win)
    store = FsspecStore(url, use_listings_cache=False, skip_instance_cache=True,
                        s3={"use_listings_cache": True}, **options)
    assert store._files.dircache.use_listings_cache and not store.fs.dircache.use_listings_cache
    with CheckpointManager(store) as mgr:
        saved = mgr.save(h=Holder({"w": torch.arange(4.0)}), rng=False)
        assert mgr.list()["id"].tolist() == [saved]
