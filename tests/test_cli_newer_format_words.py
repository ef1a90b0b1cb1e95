"""What ``ckpt-nb verify`` and ``gc`` say of checkpoints a newer ckpt_nb wrote: one or
several, each in words that agree with their number."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager
from test_cli import module_env
from test_old_stores import from_a_newer_ckpt_nb
import warm_python  # (fresh interpreters forked from a warm one)


def cli(*argv: object) -> subprocess.CompletedProcess[str]:
    return warm_python.run([sys.executable, "-m", "ckpt_nb", *map(str, argv)],
                           env=module_env(), timeout=120)


@pytest.mark.parametrize(("newer", "verified", "kept"), [
    (1, "; 1 checkpoint written by a newer ckpt_nb was not checked (upgrade ckpt_nb to "
        "verify it)",
     "kept 1 file written by a newer ckpt_nb, which gc never deletes (a newer ckpt_nb reads "
     "it); while that checkpoint is there, gc deletes no pack either (it cannot tell which "
     "chunks the checkpoint uses):"),
    (2, "; 2 checkpoints written by a newer ckpt_nb were not checked (upgrade ckpt_nb to "
        "verify them)",
     "kept 2 files written by a newer ckpt_nb, which gc never deletes (a newer ckpt_nb reads "
     "them); while those checkpoints are there, gc deletes no pack either (it cannot tell "
     "which chunks they use):"),
])
def test_checkpoints_of_a_newer_format_are_said_in_words_that_agree_with_their_number(
        tmp_path: Path, newer: int, verified: str, kept: str) -> None:
    """verify said "1 written by a newer ckpt_nb were not checked"; gc, "kept 1 damaged
    file or files of a newer ckpt_nb, ..., and while such a checkpoint is there, every
    pack:"."""
    with CheckpointManager(tmp_path) as mgr:
        ids = [mgr.save(torch.nn.Linear(4, 2), step=step) for step in range(3)]
    for cid in ids[-newer:]:
        from_a_newer_ckpt_nb(tmp_path, cid)
    done = cli("verify", tmp_path)
    assert done.returncode == 1 and done.stdout.splitlines()[-1] == (
        f"0 of {3 - newer} checkpoints fail verification" + verified), done.stdout
    for path in tmp_path.glob("catalog.sqlite*"):  # (a rebuild lists them as kept)
        path.unlink()
    done = cli("gc", tmp_path)
    assert done.returncode == 0 and done.stdout.splitlines()[1] == kept, done.stdout
