"""Retention and the resume of a run stopped in a later batches() loop outside epochs():
the checkpoints that resume depends on stay whatever --keep says, in a real in-process
IPython shell."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_magics import run
from test_session_loops import INTERRUPT_AT, INTERRUPTED_PASSES, SETUP, checkpoints, same, \
    weights

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)


def passes(store: Path, keep: str) -> str:
    """Three passes of 10 batches over one loader, a save every 7 steps, and ``keep``."""
    return INTERRUPTED_PASSES.format(dir=store).replace("--every-steps 7",
                                                        f"--every-steps 7 {keep}")


@pytest.mark.parametrize("keep, exact", [("--keep 2", 7), ("--keep-best 1 --on loss:min", 8)])
def test_retention_keeps_the_exact_checkpoint_a_later_loop_resumes_from(
        shell, tmp_path: Path, capsys, keep: str, exact: int) -> None:
    """The second pass's saves deleted the first pass's newest (``exact``; saves at steps
    1 (the best loss), 8, 15 under --on): the stop said 'not a position to resume' and
    the rerun trained all three passes again."""
    logging = INTERRUPT_AT + "\ndef interrupt_at(n, _stop=interrupt_at):\n" \
        "    ckpt_nb.log(loss=float(n)); _stop(n)\n"  # (the best at step 1: kept)
    run(shell, SETUP + logging)
    assert run(shell, passes(tmp_path / "ref", keep)).success
    expected, steps = weights(shell), shell.user_ns["step"]

    run(shell, SETUP + logging)
    (tmp_path / "interrupt-15").write_text("")
    store = tmp_path / "run"
    error = run(shell, passes(store, keep)).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    by_step = {step: cid for cid, step in checkpoints(store).items()}
    assert f"resumes from checkpoint {by_step[exact]} (step {exact})" in str(error), error
    capsys.readouterr()
    assert run(shell, passes(store, keep)).success
    assert f"resuming from {by_step[exact]}" in capsys.readouterr().out
    assert same(weights(shell), expected) and shell.user_ns["step"] == steps


def test_a_rerun_keeps_the_stops_checkpoint_and_names_its_rollback(
        shell, tmp_path: Path, capsys) -> None:
    """The rerun's own saves deleted the stop's checkpoint under --keep 5, which the stop
    had said was kept for a rollback to the stopped state, and no line named that
    rollback."""
    run(shell, SETUP + INTERRUPT_AT)
    (tmp_path / "interrupt-15").write_text("")
    store = tmp_path / "run"
    run(shell, passes(store, "--keep 5"))
    stopped = next(cid for cid, step in checkpoints(store).items() if step == 16)
    capsys.readouterr()
    assert run(shell, passes(store, "--keep 5")).success
    out = capsys.readouterr().out
    assert f"`%ckpt_rollback {stopped}` puts back the state it stopped with" in out, out
    assert stopped in checkpoints(store)
    assert run(shell, f"%ckpt_rollback {stopped} --dir {store}").success
