"""fsspec URLs that cannot hold a store, or whose server is not there: refused by name,
with what to do, before anything is written."""

from __future__ import annotations

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
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"ftp://127.0.0.1:{probe.getsockname()[1]}/exp"
    with pytest.raises(StoreError, match=f"opening {url} failed: .*Connection refused "
                                         r"\(check that the server is up"):
        FsspecStore(url)
    assert cli(["ls", url]) == 1 and f"opening {url} failed" in capsys.readouterr().err
