"""Retention and the resume of a run stopped in a later batches() loop outside epochs():
the checkpoints that resume depends on stay whatever --keep says, in a real in-process
IPython shell."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpt_nb
from test_magics import run
from test_session_loops import INTERRUPT_AT, INTERRUPTED_PASSES, PASSES, SETUP, checkpoints, \
    same, weights

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


def test_an_edited_cell_is_told_the_rollback_that_resumes_a_later_loops_run(
        shell, tmp_path: Path, capsys) -> None:
    """The hint named the stop's checkpoint, saved in the later loop: a rollback to it
    made the edited cell's loops start over on the stopped state (after 'resuming
    anyway'). It names the run's exact checkpoint, which the edited cell then resumes."""
    run(shell, SETUP + INTERRUPT_AT)
    assert run(shell, passes(tmp_path / "ref", "")).success
    expected, steps = weights(shell), shell.user_ns["step"]

    run(shell, SETUP + INTERRUPT_AT)
    (tmp_path / "interrupt-15").write_text("")
    store = tmp_path / "run"
    run(shell, passes(store, ""))
    by_step = {step: cid for cid, step in checkpoints(store).items()}
    edited = passes(store, "") + "# edited\n"
    magic, body = edited.split("\n", 1)
    capsys.readouterr()  # (the edited cell, stopped before its loops: the hint alone)
    result = run(shell, f"{magic}\nraise SystemError('before the loops')\n{body}")
    assert isinstance(result.error_in_exec, SystemError)
    out = capsys.readouterr().out
    assert (f"checkpoint {by_step[16]} holds an unfinished run of other code (another cell, "
            "or this one before an edit): not resuming it here; to resume it from checkpoint "
            f"{by_step[7]}, its newest saved before its later loop began, `%ckpt_rollback "
            f"{by_step[7]}`, then run this cell again") in out, out
    assert run(shell, f"%ckpt_rollback {by_step[7]} --dir {store}").success
    capsys.readouterr()
    assert run(shell, edited).success
    out = capsys.readouterr().out
    assert f"this cell changed since checkpoint {by_step[7]} was saved; resuming anyway" in out
    assert same(weights(shell), expected) and shell.user_ns["step"] == steps


def test_an_edited_cell_of_the_same_id_says_only_the_resume_it_makes(
        shell, tmp_path: Path, capsys) -> None:
    """JupyterLab (one cell id, edited) said 'changed since <stop>... resuming anyway',
    then 'cannot resume from <stop>... resuming from <exact>'."""
    run(shell, SETUP + INTERRUPT_AT)
    (tmp_path / "interrupt-15").write_text("")
    store = tmp_path / "run"
    run(shell, passes(store, ""), cell_id="cell-1")
    by_step = {step: cid for cid, step in checkpoints(store).items()}
    capsys.readouterr()
    assert run(shell, passes(store, "") + "# edited\n", cell_id="cell-1").success
    out = capsys.readouterr().out
    assert f"changed since checkpoint {by_step[16]}" not in out, out
    assert f"resuming from {by_step[7]}" in out
    assert out.index(f"resuming from {by_step[7]}") < out.index(
        f"this cell changed since checkpoint {by_step[7]} was saved; resuming anyway")


def test_a_rerun_says_the_checkpoint_its_stop_promised_is_gone(
        shell, tmp_path: Path, capsys) -> None:
    """The stop said 'running the cell again resumes from checkpoint X'; X deleted since
    (ckpt-nb rm), the rerun trained on from the stopped state without a word."""
    run(shell, SETUP + INTERRUPT_AT)
    (tmp_path / "interrupt-15").write_text("")
    store = tmp_path / "run"
    error = run(shell, passes(store, "")).error_in_exec
    by_step = {step: cid for cid, step in checkpoints(store).items()}
    assert f"resumes from checkpoint {by_step[7]} (step 7)" in str(error)
    ckpt_nb.CheckpointManager(store).delete(by_step[7])
    capsys.readouterr()
    assert run(shell, passes(store, "")).success
    out = capsys.readouterr().out
    assert f"checkpoint {by_step[16]} holds an unfinished run of this cell (step 16) that it " \
        "cannot resume: " in out, out
    assert f"and checkpoint {by_step[7]}, the run's newest saved before that loop began, " \
        "which its stop said running the cell again resumes from, was deleted since. This " \
        "cell trains from the objects as they are now" in out, out


def test_the_line_form_keeps_no_exact_checkpoint_and_promises_no_resume(
        shell, tmp_path: Path, capsys) -> None:
    """Under %ckpt_auto (the line form, which runs no code again, so resumes nothing) each
    cell with a later batches() loop kept one more checkpoint whatever --keep said, until
    --off (four cells: six checkpoints under --keep 2), and its notice promised a rerun
    that resumes."""
    run(shell, SETUP)
    assert run(shell, f"%ckpt_auto --dir {tmp_path / 'line'} --every-steps 5 --keep 2").success
    capsys.readouterr()
    two_loops = "\n".join(line[4:] for line in PASSES.splitlines()[2:]) + \
        "\n" + "\n".join(line[4:] for line in PASSES.splitlines()[2:])
    for _ in range(4):
        assert run(shell, two_loops).success
    out = capsys.readouterr().out
    assert run(shell, "%ckpt_auto --off").success
    assert len(checkpoints(tmp_path / "line")) == 2
    assert "hold no position to resume" in out and "a rerun after a stop resumes" not in out


def test_a_deleted_rollback_into_a_later_loop_resumes_that_runs_exact_position(
        shell, tmp_path: Path, capsys) -> None:
    """Rolled back to a save in the later loop, deleted since, whose nearest kept ancestor
    was saved in that loop too: the rerun said 'resuming from <the ancestor>, its nearest
    kept ancestor, in its place', then trained on from the deleted one's state, its loops
    from the start, without a further word. It resumes the run from its newest checkpoint
    saved before that loop, as after a stop there, and says so in one line."""
    run(shell, SETUP)
    assert run(shell, PASSES.format(dir=tmp_path / "ref")).success
    expected, steps = weights(shell), shell.user_ns["step"]

    run(shell, SETUP)
    store = tmp_path / "run"
    assert run(shell, PASSES.format(dir=store)).success
    by_step = {step: cid for cid, step in checkpoints(store).items()}
    assert run(shell, f"%ckpt_rollback {by_step[21]} --dir {store}").success
    ckpt_nb.CheckpointManager(store).delete(by_step[21])
    capsys.readouterr()
    assert run(shell, PASSES.format(dir=store)).success
    out = capsys.readouterr().out
    assert f"checkpoint {by_step[21]}, rolled back to, was deleted since; in its place, " \
        f"checkpoint {by_step[14]} (step 14) holds an unfinished run of this cell that it " \
        "cannot resume from: " in out, out
    assert f"resuming from {by_step[7]}, the run's newest checkpoint saved before its later " \
        f"loop began (an exact position) (the state the rollback put back is replaced by " \
        f"{by_step[7]}'s)" in out, out
    assert f"resuming from {by_step[14]}" not in out, out
    assert same(weights(shell), expected) and shell.user_ns["step"] == steps
