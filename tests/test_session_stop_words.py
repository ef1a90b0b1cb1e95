"""What an interrupt's stop says the rerun does, worded by what runs: --no-resume, which
resumes nothing, and an auto() block, which is no %%ckpt_auto cell."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpt_nb
from test_magics import run
from test_session_loops import INTERRUPT_AT, SETUP

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

IN_EPOCHS = """%%ckpt_auto --dir {dir} --every-steps 7 --no-resume
for epoch in ckpt_nb.epochs(3):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step(); step += 1; interrupt_at(step)
"""
PASSES = IN_EPOCHS.replace("ckpt_nb.epochs(3)", "range(3)")


def newest(store: Path) -> str:
    return ckpt_nb.CheckpointManager(store).list()["id"].iloc[-1]


@pytest.mark.parametrize("cell, stopped", [(IN_EPOCHS, 15), (PASSES, 16)])
def test_a_stop_under_no_resume_promises_no_resume(shell, tmp_path: Path, cell: str,
                                                   stopped: int) -> None:
    """It said "run it again to go on from checkpoint X" (in epochs()) and "running the
    cell again resumes from checkpoint X" (in a later loop) where --no-resume resumes
    nothing: the rerun trained on from the objects as they were."""
    run(shell, SETUP + INTERRUPT_AT)
    (tmp_path / "interrupt-15").write_text("")
    error = run(shell, cell.format(dir=tmp_path / "run")).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    cid = newest(tmp_path / "run")
    assert str(error) == (
        f"the cell stopped at step {stopped}; checkpoint {cid} holds it, and with --no-resume "
        "(resume=False) running the cell again runs its loops from their start on the "
        f"objects as they are (in this kernel, trained to step {stopped}, its steps counted on; "
        f"in a new one, as the set-up cell makes them; %ckpt_rollback {cid} puts this "
        "state back first); without it, it would resume the run")


BLOCK = """
with ckpt_nb.auto({dir!r}, every_steps=5):
    for _ in range(12):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(X), Y).backward()
        opt.step(); step += 1; interrupt_at(step)
"""


def test_a_blocks_stop_does_not_send_it_to_a_cell(shell, tmp_path: Path) -> None:
    """An auto() block's loop without the loop helpers was told to loop with them "in a
    %%ckpt_auto cell", as if the block could not resume."""
    run(shell, SETUP + INTERRUPT_AT)
    (tmp_path / "interrupt-7").write_text("")
    error = run(shell, BLOCK.format(dir=str(tmp_path / "run"))).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    assert str(error).endswith(
        "To resume where it stopped, loop with ckpt_nb.epochs()/batches()"), error
