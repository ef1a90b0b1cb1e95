"""gc names the damaged files it keeps: it said "`ckpt-nb verify` names them" of a junk
pack in an S3 store, and verify, which checks checkpoints, said "ok" and named nothing."""

from __future__ import annotations

import pytest
import torch
from conftest import Holder

from ckpt_nb import CheckpointManager
from ckpt_nb.cli import main as cli

pytest.importorskip("s3fs")
pytest.importorskip("moto")


def test_gc_names_a_junk_pack_it_keeps(bucket: str, endpoint: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    import s3fs

    url = f"s3://{bucket}/exp"
    CheckpointManager(url).save(h=Holder({"w": torch.ones(4)}), rng=False)
    junk = "packs/0123456789abcdef0123456789abcdef.pack"
    s3fs.S3FileSystem(endpoint_url=endpoint).pipe(f"{bucket}/exp/{junk}", b"x" * 5000)
    capsys.readouterr()
    assert cli(["gc", url]) == 0
    out = capsys.readouterr().out
    assert "kept 1 damaged file" in out and f"  {url}/{junk}: " in out, out
    assert "verify" not in out and "by hand" in out, out


def test_show_latest_that_loses_the_store_midway_says_show_failed(
        bucket: str, endpoint: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`ckpt-nb show URL latest`, whose server went down as it checked the newest
    checkpoint, said "verify failed", a command the user did not run."""
    import fsspec.config
    from test_s3_outages import OutageRelay

    url = f"s3://{bucket}/exp"
    CheckpointManager(url).save(h=Holder({"w": torch.ones(4)}), rng=False)
    relay = OutageRelay(endpoint)
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", relay.endpoint)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": relay.endpoint})
    try:
        with pytest.warns(RuntimeWarning, match="rebuilt"):  # (another endpoint's catalog)
            CheckpointManager(url).close()
        relay.trip = f"GET /{bucket}/exp/packs/".encode()  # (down as chunks are read)
        assert cli(["show", url, "latest"]) == 1
    finally:
        relay.close()
    err = capsys.readouterr().err
    assert "show failed, as the store could not be read while finding the checkpoint " \
        "latest means" in err and "verify failed" not in err, err
