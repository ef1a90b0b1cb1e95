"""What a failing disk or a limit of the process's is said as: a StoreError (or a
MemoryError) naming the file and what to do, never a bare OSError; and nothing lost."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import DigitsRun, same

from ckpt_nb import CheckpointManager, StoreError


@pytest.mark.parametrize("emptied", [False, True], ids=["written over", "emptied"])
def test_a_lock_file_note_the_disk_refuses_is_a_store_error_naming_it(
        tmp_path: Path, file_size_limit: Callable[[int | None], None], emptied: bool) -> None:
    """The note a save, delete, gc or pin leaves in the lock file, refused (here by
    RLIMIT_FSIZE, as a read-only or failing disk refuses it): it was a bare OSError naming
    no file, or, written over a note as long, cut short unsaid. The note is not skipped:
    its mark tells another catalog of the store that it missed this one's writes."""
    run = DigitsRun()
    mgr = CheckpointManager(tmp_path)
    first = mgr.save(run.model, run.optimizer, step=0, rng=False)
    if emptied:  # (as a lock file made again is: the note grows it)
        os.truncate(tmp_path / "catalog.sqlite.lock", 0)
    weights = run.weights()
    run.train_step()
    file_size_limit(8)  # (the note is longer; every earlier file is already there)
    with pytest.raises(StoreError, match=r"saving a checkpoint failed, so it was not saved "
                       r"\(the checkpoints saved before are intact\): cannot write the lock "
                       r"file .*catalog\.sqlite\.lock .*File too large.*ulimit -f.*"
                       r"nothing was changed"):
        mgr.save(run.model, run.optimizer, step=1, rng=False)
    for refused in (lambda: mgr.pin(first), lambda: mgr.gc(), lambda: mgr.delete(first)):
        with pytest.raises(StoreError, match=r"cannot write the lock file"):
            refused()
    file_size_limit(None)
    assert mgr.list()["id"].tolist() == [first]
    mgr.restore(first, model=run.model, rng=False)
    assert same(run.weights(), weights)
    assert mgr.save(run.model, run.optimizer, step=1, rng=False) != first
