"""The repository's own files: what a fresh clone gets."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_no_tracked_file_is_a_link_out_of_the_repository() -> None:
    """f093572 committed `.venv` as a link to /work/main/.venv (a clone's venv, linked
    in for its tests; `.venv/` in .gitignore matches a folder only): in a fresh clone it
    dangles, and `bash .ci/install`'s `python3 -m venv .venv` fails ('File exists')."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-s"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    links = [line.split("\t", 1)[1] for line in listed if line.startswith("120000 ")]
    outside = [path for path in links
               if not (ROOT / path).resolve().is_relative_to(ROOT)
               or not (ROOT / path).exists()]
    assert outside == [], outside
    assert ".venv" not in [line.split("\t", 1)[1] for line in listed]
