"""An S3 server (moto's, on loopback) that goes away in the middle of an operation, behind
a relay that stops passing requests on; and the URLs an object store is refused under.

A failure of the backend is a ``StoreError`` saying so, never a report of damage, nor a
checkpoint said to be unsaved that was committed.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import CREDENTIALS, Holder, s3_server
from test_s3_two_machines import ThenAfterManifests

from ckpt_nb import CheckpointManager, FsspecStore, StoreError
from ckpt_nb.cli import main as cli

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto")


def weights(seed: int) -> dict[str, torch.Tensor]:
    return {"w": torch.randn(200_000, generator=torch.Generator().manual_seed(seed))}


# A request's first line: a client sends a request only once the one before it on its
# connection is answered, so each request's line opens what the relay receives.
_REQUEST_LINE = re.compile(rb"([A-Z]+) (\S+) HTTP/1\.[01]\r\n")


class OutageRelay:
    """A TCP relay to the S3 server that notes each request as (method, path), and goes
    down (closes each connection at its next request, and each new one at once) when
    ``down`` is set, or at the first request whose head holds ``trip``: that request is
    not passed on either. Each request that holds ``refuse`` is not passed on, its
    connection closed (a server failing one object's reads, retries and all)."""

    def __init__(self, endpoint: str) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.target = int(endpoint.rsplit(":", 1)[1])
        self.down = False
        self.trip: bytes | None = None
        self.refuse: bytes | None = None
        self.requests: list[tuple[str, str]] = []
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            server = socket.create_connection(("127.0.0.1", self.target))
            self.held += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(1 << 16):
                if requests and (line := _REQUEST_LINE.match(data)):
                    self.requests.append((line[1].decode(), line[2].decode()))
                if requests and self.trip is not None and self.trip in data:
                    self.down = True
                if self.down or requests and self.refuse is not None and self.refuse in data:
                    break
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def asked(self, method: str, under: str) -> list[str]:
        """The paths of the ``method`` requests noted under the path ``under``."""
        return [path for m, path in self.requests if m == method and path.startswith(under)]

    def close(self) -> None:
        for sock in (self.listener, *self.held):
            sock.close()


@pytest.fixture
def relay(bucket: str, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[OutageRelay]:
    """The bucket's server behind a relay, which this process (the CLI too) talks to."""
    import fsspec.config

    relay = OutageRelay(endpoint)
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", relay.endpoint)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": relay.endpoint})
    yield relay
    relay.close()


def saved(url: str, n: int) -> tuple[list[str], bytes]:
    """``n`` checkpoints saved in ``url``: their ids, and the path the newest one's pack
    is asked for under (as a request's head holds it)."""
    with CheckpointManager(url) as mgr:
        ids = [mgr.save(h=Holder(weights(seed)), step=seed) for seed in range(n)]
        digest = mgr._manifest(ids[-1])["storages"][0]["chunks"][0][0]
        pack = mgr.catalog.chunks([digest])[digest].pack
    return ids, f"/{url.removeprefix('s3://')}/{pack}".encode()


def test_verify_while_the_server_is_down_fails_and_calls_nothing_damaged(
        bucket: str, relay: OutageRelay, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint whose pack the server failed to give was reported as failing
    verification (while the server was down: "3 of 3 checkpoints fail verification")."""
    url = f"s3://{bucket}/exp"
    _, newest_pack = saved(url, 3)
    mgr = CheckpointManager(url)
    relay.refuse = newest_pack
    with pytest.raises(StoreError, match=r"verify failed, as the store could not be read: .*"
                                         "check that the server is up.*FSSPEC_S3_ENDPOINT_URL"
                                         r".*\); nothing is known to be damaged: fix what the "
                                         "error names.*then run it again"):
        mgr.verify()
    assert cli(["verify", url]) == 1
    out, err = capsys.readouterr()
    assert "bad:" not in out and "nothing is known to be damaged" in err, (out, err)
    relay.refuse = None
    assert mgr.verify().ok
    relay.down = True  # (the server goes, for good)
    with pytest.raises(StoreError):
        mgr.verify()


def test_damage_found_before_the_server_stops_answering_is_still_said(
        bucket: str, relay: OutageRelay, endpoint: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The newest checkpoint's pack was damaged, and the server went away as verify read
    an older one: it said "nothing is known to be damaged", and the damage it had found
    was lost (in the CLI's verify too)."""
    url = f"s3://{bucket}/exp"
    ids, newest_pack = saved(url, 3)
    direct = s3fs.S3FileSystem(endpoint_url=endpoint)
    path = newest_pack.decode().lstrip("/")
    data = bytearray(direct.cat_file(path))
    data[100:200] = bytes(100)
    direct.pipe_file(path, bytes(data))
    mgr = CheckpointManager(url)
    assert mgr.verify([ids[-1]]).bad.keys() == {ids[-1]}
    mgr._manifests.clear()
    older = f"/{bucket}/exp/manifests/{ids[-2]}".encode()  # (read after the newest)
    relay.trip = older
    with pytest.raises(StoreError, match=f"could not be read: .*found damaged before it: "
                                         f"{ids[-1]}: .*the rest was not checked: fix what"):
        mgr.verify()
    mgr.close()
    relay.down, relay.trip = False, older
    assert cli(["verify", url]) == 1
    out, err = capsys.readouterr()
    assert "bad:" not in out and f"found damaged before it: {ids[-1]}" in err, (out, err)


def test_an_archived_pack_says_to_restore_it_not_to_check_the_credentials(
        bucket: str, endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A pack moved to GLACIER (a lifecycle rule) refuses its reads (S3's
    InvalidObjectState, which s3fs makes a PermissionError): it was said to need the
    credentials checked, and the store to answer."""
    import boto3

    url = f"s3://{bucket}/exp"
    ids, newest_pack = saved(url, 2)
    key = newest_pack.decode().removeprefix(f"/{bucket}/")
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").copy_object(
        Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key},
        StorageClass="GLACIER")
    archived = r"the object is archived: .*restore it first"
    with CheckpointManager(url) as mgr:
        with pytest.raises(StoreError, match=f"{archived}.*fix what the error names") as said:
            mgr.verify()
        assert "credentials" not in str(said.value)
        with pytest.raises(StoreError, match=archived):
            mgr.restore("latest", h=Holder({}))
    assert cli(["show", url, "latest"]) == 1
    out, err = capsys.readouterr()
    assert ids[0] not in out + err and "the object is archived" in err, (out, err)


def test_show_latest_while_a_read_fails_fails_and_shows_no_older_one(
        bucket: str, relay: OutageRelay, capsys: pytest.CaptureFixture[str]) -> None:
    """One failed read of the newest checkpoint's pack passed it over as damaged: an
    older one was shown as 'latest', as restore("latest") never does."""
    url = f"s3://{bucket}/exp"
    ids, newest_pack = saved(url, 3)
    relay.refuse = newest_pack
    assert cli(["show", url, "latest"]) == 1
    out, err = capsys.readouterr()
    assert ids[1] not in out + err and "nothing is known to be damaged" in err, (out, err)
    relay.refuse = None
    assert cli(["show", url, "latest"]) == 0 and ids[2] in capsys.readouterr().out


def test_a_committed_save_whose_files_the_store_cannot_be_asked_about_stands(
        bucket: str, relay: OutageRelay, endpoint: str) -> None:
    """The server went away after the commit, at the HEAD requests that check the
    save's files are still there: the save said "so it was not saved", yet it was
    committed, and the next save forked a branch beside it."""
    url = f"s3://{bucket}/exp"
    mgr = CheckpointManager(url)
    first = mgr.save(h=Holder(weights(1)))
    relay.trip = f"HEAD /{bucket}/exp/manifests/".encode()
    with pytest.warns(RuntimeWarning, match="is saved, but the store could not be asked "
                                            "whether its files are still there.*verify"):
        second = mgr.save(h=Holder(weights(2)))
    relay.down, relay.trip = False, None
    assert mgr.head == second and mgr.verify().ok
    third = mgr.save(h=Holder(weights(3)))
    parents = mgr.list().set_index("id")["parent"].to_dict()
    assert parents == {first: None, second: first, third: second}
    with pytest.warns(RuntimeWarning, match="rebuilt"):  # (another endpoint's cache)
        elsewhere = CheckpointManager(FsspecStore(url, endpoint_url=endpoint))
    target = Holder({})
    elsewhere.restore(second, h=target)
    assert torch.equal(target.state["w"], weights(2)["w"])


def test_a_save_found_gone_before_the_server_stops_answering_is_not_saved(
        bucket: str, relay: OutageRelay, endpoint: str) -> None:
    """Another machine's gc took the save's manifest, and the server went away at the
    HEAD of its first pack: the gone manifest was forgotten, the save returned the id of
    a checkpoint whose manifest was not there, and set head to it."""
    url = f"s3://{bucket}/exp"
    direct = s3fs.S3FileSystem(endpoint_url=endpoint)  # (the other machine: no relay)

    def collected_elsewhere(key: str) -> None:
        direct.rm_file(f"{bucket}/exp/{key}")
        relay.trip = f"HEAD /{bucket}/exp/packs/".encode()

    mgr = CheckpointManager(ThenAfterManifests(url, collected_elsewhere))
    with pytest.raises(StoreError, match=r"checkpoint \w+ was written, but manifests/\S+ left "
                                         "the store before its commit.*not saved; save again"):
        mgr.save(h=Holder(weights(1)))
    assert relay.down and mgr.head is None and mgr.catalog.checkpoints() == []


def test_a_cache_over_the_store_is_refused_naming_it(bucket: str) -> None:
    """simplecache:: served a label another machine had rewritten from its stale copy:
    a checkpoint pinned there read as unpinned, and retention here deleted it."""
    for cache in ("simplecache", "filecache", "blockcache"):
        url = f"{cache}::s3://{bucket}/exp"
        with pytest.raises(ValueError, match=f"Give the URL without {cache}::"):
            CheckpointManager(url)
        assert cli(["ls", url]) == 2
    assert not s3fs.S3FileSystem().find(bucket)  # (nothing written)


def test_a_folder_over_a_missing_bucket_creates_no_bucket(
        bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    """dir::s3://typo/x was taken for a file system with folders (only its outermost
    layer was looked at): its first write made the folder, creating the bucket."""
    typo = f"{bucket}-typo"
    with pytest.raises(StoreError, match="ckpt_nb creates no bucket"):
        CheckpointManager(f"dir::s3://{typo}/exp")
    assert not s3fs.S3FileSystem().exists(typo)
    assert cli(["ls", f"dir::s3://{typo}/exp"]) == 2  # (as for s3://typo/exp)
    assert f"the bucket '{typo}' does not exist" in capsys.readouterr().err


def test_a_url_with_no_bucket_before_its_path_says_it_names_none() -> None:
    """s3:///x said "The specified bucket does not exist", naming none."""
    for url in ("s3:///exp", "s3://"):
        with pytest.raises(ValueError, match=f"{url} names no bucket"):
            FsspecStore(url)


def read_only_user(endpoint: str) -> dict[str, str]:
    """Credentials (as environment variables) of a user who may read the server's
    buckets, and not write them (four requests)."""
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1")
    iam.create_user(UserName="reader")
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:Get*", "s3:List*"], "Resource": "*"}]}
    iam.put_user_policy(UserName="reader", PolicyName="read",
                        PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


def test_a_write_the_credentials_may_not_make_says_they_may_only_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write with credentials that may read the bucket said "check the credentials"
    (the variables that give them), which were right: they may not write."""
    import fsspec.config

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    # (the first five requests unchecked: the bucket, and the user made with them)
    server = s3_server({"INITIAL_NO_AUTH_ACTION_COUNT": "5"})
    endpoint = next(server)
    try:
        import boto3

        monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", endpoint)
        monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="runs")
        reader = read_only_user(endpoint)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "writer"))
        for name, value in reader.items():  # (what no policy names is allowed to none)
            monkeypatch.setenv(name, value)
        s3fs.S3FileSystem.clear_instance_cache()
        with pytest.raises(StoreError, match="upload of ckpt_nb.json .*failed: Access Denied "
                                             r"\(the credentials given may not write or "
                                             "delete there.*s3:PutObject"):
            CheckpointManager("s3://runs/exp")  # (a new store: its format is written)
    finally:
        next(server, None)


def test_a_gc_or_delete_the_server_stops_answering_says_which_stopped(
        bucket: str, relay: OutageRelay) -> None:
    """A gc() or delete() whose store stopped answering said only the store's own error
    ("listing deleted at ... failed"): not that the gc or the delete stopped, what it left,
    or what to do."""
    url = f"s3://{bucket}/exp"
    ids, _ = saved(url, 3)
    mgr = CheckpointManager(url)
    relay.down = True
    with pytest.raises(StoreError, match=r"^gc stopped, as the store could not be read or "
                                         r"written: .+; every checkpoint is as it was but one "
                                         r"a delete\(\) that did not finish had recorded as "
                                         r"deleted, which a gc completes \(a gc may stop at "
                                         r"any point\): fix what the error names"
                                         r".*then run it again"):
        mgr.gc()
    with pytest.raises(StoreError, match=rf"^delete of {ids[0]} stopped, as the store could "
                                         r"not be read or written: .+; the other checkpoints "
                                         r"are as they were; where it is still listed, its "
                                         r"deletion may be recorded, which the next gc "
                                         r"completes: pin it to keep it, or delete it again: "
                                         r"fix what the error names"):
        mgr.delete(ids[0])
    relay.down = False
    mgr.gc()
    assert list(CheckpointManager(url).list()["id"]) == ids


def test_a_restore_cut_off_mid_read_names_the_read_that_failed(
        bucket: str, relay: OutageRelay) -> None:
    """The server went away while a restore read a pack: the error named "listing
    deleted at s3://... failed" (the catch-up that looks for a deletion meanwhile, which
    failed too), not the pack read that failed. The target is left as it was."""
    url = f"s3://{bucket}/exp"
    ids, newest_pack = saved(url, 2)
    mgr = CheckpointManager(url)
    assert mgr.list()["id"].tolist() == ids
    relay.trip = newest_pack
    target = Holder({"w": torch.zeros(3)})
    with pytest.raises(StoreError, match="packs/") as failed:
        mgr.restore(ids[-1], h=target)
    assert "listing" not in str(failed.value) and "deleted" not in str(failed.value)
    assert torch.equal(target.state["w"], torch.zeros(3))
    relay.down, relay.trip = False, None
    mgr.restore(ids[-1], h=target)
    assert torch.equal(target.state["w"], weights(1)["w"])
