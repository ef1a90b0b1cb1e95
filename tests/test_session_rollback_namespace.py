"""ckpt_nb.rollback(directory=...) in a process where no session ran, without
namespace=: the refusal names the argument missing, not the directory given."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import ckpt_nb
import warm_python  # (fresh interpreters forked from a warm one)

ROLLBACK_DIRECTORY_ONLY = """
import ckpt_nb, torch
model = torch.nn.Linear(2, 2)
try:
    ckpt_nb.rollback("latest", directory={store!r})
except TypeError as exc:
    print(type(exc).__name__, exc)
"""


def test_rollback_with_a_directory_and_no_namespace_asks_for_the_namespace(
        tmp_path: Path) -> None:
    """It said "nothing to roll back ... or pass directory= and namespace=" though
    directory= was given (a CheckpointNotFoundError, for an argument left out)."""
    store = tmp_path / "store"
    with ckpt_nb.auto(str(store), namespace={"model": torch.nn.Linear(2, 2)}):
        pass
    code = ROLLBACK_DIRECTORY_ONLY.format(store=str(store))
    done = warm_python.run([sys.executable, "-c", code], cwd=tmp_path, timeout=120,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               filter(None, [str(Path(ckpt_nb.__file__).parents[1]),
                                             os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stderr
    said = ("TypeError namespace= is missing: no ckpt_nb session has run in this process "
            "to take it from; pass namespace=globals() (the namespace to put the "
            "checkpoint's objects back into)")
    assert done.stdout.strip() == said, done.stdout
