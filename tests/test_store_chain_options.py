"""A chained URL's options reach the file system they are for: the object store's
(``endpoint_url=``, ``key=``, ``secret=``, ``client_kwargs=``) its innermost, S3, as
``s3={...}`` would give them, where fsspec gave them to the outermost (``dir::``), which
ignored them; one an outer file system takes stays there; one none takes is refused.
A real S3 server (moto's, on loopback) that this process is told of only through the
options: no endpoint nor credentials in the environment or fsspec's configuration."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import Holder, s3_server, unconfigured_bucket

from ckpt_nb import CheckpointManager, FsspecStore

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto")

KEY, SECRET = "chain-key", "chain-secret"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from s3_server()


@pytest.fixture
def bucket(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return unconfigured_bucket(server, KEY, SECRET, tmp_path, monkeypatch)


def test_the_object_stores_options_reach_s3_through_a_chain(bucket: str, server: str) -> None:
    """dir::s3:// with endpoint_url=, key= and secret= asked AWS itself, with no
    credentials (dir:: took them, and ignored them)."""
    options = {"endpoint_url": server, "key": KEY, "secret": SECRET,
               "client_kwargs": {"region_name": "us-east-1"}}
    plain = s3fs.S3FileSystem(endpoint_url=server, key=KEY, secret=SECRET,
                              skip_instance_cache=True)
    for path, url in ((f"{bucket}/dir", f"dir::s3://{bucket}/dir"),
                      (f"{bucket}/wrapped", f"async_wrapper::s3://{bucket}/wrapped"),
                      (f"{bucket}/both", f"async_wrapper::dir::s3://{bucket}/both")):
        given = {**options, "client_kwargs": dict(options["client_kwargs"])}
        store = FsspecStore(url, **given)
        assert given == options, url  # (the caller's, as they were)
        files = store._files
        assert (files.endpoint_url, files.key, files.secret) == (server, KEY, SECRET), url
        assert files.client_kwargs == {"region_name": "us-east-1"}, url
        with CheckpointManager(store) as mgr:
            saved = mgr.save(h=Holder({"w": torch.arange(4.0)}), rng=False)
            assert mgr.list()["id"].tolist() == [saved], url
        plain.invalidate_cache()
        assert plain.exists(f"{path}/ckpt_nb.json"), url
        assert str(server) in store.identity, url  # (its catalog's cache: this server's)


def test_an_option_an_outer_file_system_takes_stays_there(bucket: str, server: str) -> None:
    """fsspec gives the outermost file system the options not keyed by a scheme: one it
    takes (async_wrapper's semaphore=, every file system's use_listings_cache=) is still
    its, while the object store's go to S3; one a middle layer takes alone goes there."""
    semaphore = asyncio.Semaphore(4)
    store = FsspecStore(f"async_wrapper::dir::s3://{bucket}/outer", endpoint_url=server,
                        key=KEY, secret=SECRET, semaphore=semaphore, use_listings_cache=False)
    assert store.fs.semaphore is semaphore and not store.fs.dircache.use_listings_cache
    # (an option of every file system: the innermost's too, the store's own)
    assert not store._files.dircache.use_listings_cache and store._files.endpoint_url == server
    store = FsspecStore(f"dir::async_wrapper::s3://{bucket}/middle", endpoint_url=server,
                        key=KEY, secret=SECRET, semaphore=semaphore)
    assert store.fs.fs.semaphore is semaphore and store._files.key == KEY
    assert not store.has("ckpt_nb.json")  # (S3 asked: the server answered, credentials taken)


def test_an_option_no_file_system_of_the_chain_takes_is_refused(bucket: str,
                                                                 server: str) -> None:
    """endpoint= (a typo of endpoint_url=) went to dir::, which ignored it: the store
    was looked for on AWS. Given twice, at the top and in S3's own options, differently,
    one of them was dropped without a word."""
    with pytest.raises(TypeError, match=re.escape(
            f"dir::s3://{bucket}/x: no file system of the chain (dir, s3) takes the option "
            "'endpoint'; did you mean endpoint_url=?")):
        FsspecStore(f"dir::s3://{bucket}/x", endpoint=server, key=KEY, secret=SECRET)
    with pytest.raises(TypeError, match=re.escape("(async_wrapper, dir, s3) takes the option "
                                                  "'max_concurrency_tasks'; did you mean ")):
        FsspecStore(f"async_wrapper::dir::s3://{bucket}/x", max_concurrency_tasks=4)
    with pytest.raises(TypeError, match=re.escape(
            f"dir::s3://{bucket}/x: endpoint_url is given twice, as endpoint_url= and in "
            "s3=, with different values: give it once")):
        FsspecStore(f"dir::s3://{bucket}/x", endpoint_url=server,
                    s3={"endpoint_url": "http://127.0.0.1:9"})
    # The same value twice is the same option; S3's own settings win key by key.
    store = FsspecStore(f"dir::s3://{bucket}/x", endpoint_url=server, key=KEY, secret=SECRET,
                        client_kwargs={"region_name": "us-east-1", "verify": False},
                        s3={"endpoint_url": server,
                            "client_kwargs": {"region_name": "eu-west-1"}})
    assert store._files.client_kwargs == {"region_name": "eu-west-1", "verify": False}
