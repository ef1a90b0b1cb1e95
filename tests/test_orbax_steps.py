"""Orbax's first-run pattern (``if mngr.latest_step() is not None:``) had no counterpart:
the README's row, ``info("latest")["step"]``, raised on a fresh store, and gave None for
its own epoch-based saves."""

from __future__ import annotations

from pathlib import Path

from conftest import DigitsRun

from ckpt_nb import CheckpointManager


def test_latest_step_and_all_steps_as_orbax_gives_them(tmp_path: Path,
                                                      digits: DigitsRun) -> None:
    with CheckpointManager(tmp_path / "store", max_to_keep=3) as mgr:
        assert mgr.latest_step() is None and mgr.all_steps() == []  # (a first run)
        for step in range(1, 13):
            digits.train_step()
            if step % 3 == 0:
                mgr.save(digits.model, digits.optimizer, step=step)
        assert mgr.latest_step() == 12
        assert mgr.all_steps() == [6, 9, 12]  # (retention deleted step 3's)
        mgr.save(digits.model, digits.optimizer, 4)  # (an epoch's end, with no step=)
        assert mgr.latest_step() is None
        assert mgr.all_steps() == [9, 12]
    with CheckpointManager(tmp_path / "store") as again:  # (a new process's view)
        assert again.all_steps() == [9, 12] and again.latest_step() is None
