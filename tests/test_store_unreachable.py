"""A store whose server cannot be reached is a StoreError saying so, from the API and the
CLI, whatever the backend raises: hf:// asks its server as its cache of a path is
dropped, before each request, and its httpx ConnectError went out raw (a traceback from
``ckpt-nb ls``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import warm_python  # (fresh interpreters forked from a warm one)

pytest.importorskip("huggingface_hub")  # (the dev extra installs it: CI runs this)

# The Hub at a name that never resolves (.invalid, RFC 2606), with or without a network.
OFFLINE = {"HF_ENDPOINT": "http://ckpt-nb-test.invalid", "HF_HUB_OFFLINE": "0",
           "HF_HUB_DISABLE_TELEMETRY": "1"}

API = """
import ckpt_nb
store = ckpt_nb.FsspecStore("hf://x/y")
try:
    store.has("ckpt_nb.json")
except ckpt_nb.StoreError as exc:
    print("StoreError from", type(exc.__cause__).__name__, exc)
"""


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **OFFLINE, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    return warm_python.run([sys.executable, *argv], env=env, timeout=120)


def test_an_unreachable_hub_is_a_store_error_saying_to_check_the_server() -> None:
    api = run("-c", API)
    said = "looking for ckpt_nb.json at hf://x/y failed: "
    hint = " (check that the server is up, and its address)"
    # (the backend's own error, httpx's ConnectError, is its cause)
    assert api.stdout.startswith(f"StoreError from ConnectError {said}"), api
    assert api.stdout.endswith(f"{hint}\n")
    cli = run("-m", "ckpt_nb", "ls", "hf://x/y")
    assert cli.returncode == 1 and cli.stdout == ""
    assert cli.stderr.startswith(f"ckpt-nb: {said}") and cli.stderr.endswith(f"{hint}\n")
    assert len(cli.stderr.splitlines()) == 1, cli.stderr
