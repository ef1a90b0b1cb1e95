"""What a cell says about runs it could resume, and what following it does: the hints of
a finished cell run again, of another cell's unfinished run, and the resume's line after
a rollback, in a real in-process IPython shell."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import ckpt_nb
from test_magics import run  # (the shell's helper)
from test_session_rerun import ONE, TRAIN, TWO, new_kernel, resumed_line, same, weights


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts like a new kernel."""
    new_kernel(monkeypatch)
    monkeypatch.delenv("STOP_A", raising=False)
    monkeypatch.delenv("STOP_B", raising=False)


# $STOP_A: an interrupt at that step (as a user's); $STOP_B: an error at that step, at a
# consistent point (saved there). (Not variables: a resume would put them back.)
CELL_A = """%%ckpt_auto --dir {dir} --every-steps 5 {options}
import signal
for epoch in ckpt_nb.epochs(2):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        if steps(optA) == int(os.environ.get("STOP_A") or -1):
            os.kill(os.getpid(), signal.SIGINT)
        optA.zero_grad(); torch.nn.functional.cross_entropy(modelA(xb), yb).backward()
        optA.step()
"""

CELL_B = """%%ckpt_auto --dir {dir} --every-steps 5
for ep in ckpt_nb.epochs(2):
    for j, (xb, yb) in ckpt_nb.batches(loader):
        if steps(optB) == int(os.environ.get("STOP_B") or -1): raise RuntimeError("B")
        optB.zero_grad(); torch.nn.functional.cross_entropy(modelB(xb), yb).backward()
        optB.step()
"""

PLAIN = "for s in range(3):\n    opt.zero_grad(); model(torch.ones(8)).sum().backward(); opt.step()"


def ends(shell, tmp_path: Path, options: str = "") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """What A's and B's models and optimizers hold after A, then B, run unstopped."""
    run(shell, TWO)
    assert run(shell, CELL_A.format(dir=tmp_path / "ref", options=options)).success
    expected_a = weights(shell, "modelA", "optA")
    assert run(shell, CELL_B.format(dir=tmp_path / "ref")).success
    return expected_a, weights(shell, "modelB", "optB")


def ids(cell: str, with_ids: bool) -> str | None:
    return cell if with_ids else None


@pytest.mark.parametrize(("options", "with_ids"), [("", False), ("", True), ("--keep 1", True)])
def test_run_all_after_a_crash_following_the_finished_cells_hint_resumes_the_later_cell(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, options: str,
        with_ids: bool) -> None:
    """B stopped after A ran to its end; in a new kernel A says it ran to its end at R, and
    to interrupt it and roll back to R. Done so, B started its loops over from R's state
    (a rollback made no cell resume its own run), and under --keep 1 the interrupt's save
    had deleted R, so the rollback failed."""
    expected_a, expected_b = ends(shell, tmp_path, options)
    store = tmp_path / "two"
    run(shell, TWO)
    assert run(shell, CELL_A.format(dir=store, options=options), ids("A", with_ids)).success
    monkeypatch.setenv("STOP_B", "13")
    assert not run(shell, CELL_B.format(dir=store), ids("B", with_ids)).success
    stop = ckpt_nb.CheckpointManager(store).list().iloc[-1]["id"]

    new_kernel(monkeypatch)  # (the crash), then "Run All"
    monkeypatch.setenv("STOP_A", "3")
    monkeypatch.setenv("STOP_B", "")
    run(shell, TWO)
    capsys.readouterr()
    stopped = run(shell, CELL_A.format(dir=store, options=options), ids("A", with_ids))
    assert isinstance(stopped.error_in_exec, KeyboardInterrupt)
    out = capsys.readouterr().out
    end = re.search(r"ran to its end before, at checkpoint (\w+) .*`%ckpt_rollback (\w+)`", out)
    assert end is not None and end[1] == end[2], out
    assert "other code" not in out or not with_ids, out
    assert run(shell, f"%ckpt_rollback {end[1]}").success
    assert same(weights(shell, "modelA", "optA"), expected_a)  # (that run's end state)
    capsys.readouterr()
    assert run(shell, CELL_B.format(dir=store), ids("B", with_ids)).success
    assert f"resumed from {stop} " in resumed_line(capsys.readouterr().out)
    assert same(weights(shell, "modelB", "optB"), expected_b)
    assert same(weights(shell, "modelA", "optA"), expected_a)


def test_after_a_rollback_to_its_own_end_a_cell_starts_from_there(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollback to the cell's own end is where the user wants it to start: its later run
    that went on from there (stopped) is not resumed."""
    store = tmp_path / "own"
    run(shell, TWO)
    assert run(shell, CELL_B.format(dir=store)).success
    end = ckpt_nb.CheckpointManager(store).list().iloc[-1]["id"]
    monkeypatch.setenv("STOP_B", "33")
    assert not run(shell, CELL_B.format(dir=store)).success  # (on from the end, stopped)
    run(shell, f"%ckpt_rollback {end}")
    monkeypatch.setenv("STOP_B", "")
    capsys.readouterr()
    assert run(shell, CELL_B.format(dir=store)).success
    assert "resumed" not in capsys.readouterr().out
    assert shell.user_ns["steps"](shell.user_ns["optB"]) == 40


def test_the_other_codes_run_hint_is_not_given_where_following_it_cannot_resume(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell that cell ids tell apart from the stopped run's was told to roll back to
    that run and run again, which never resumes it; without cell ids (this cell may be
    that one edited) it still is."""
    run(shell, TWO)
    monkeypatch.setenv("STOP_B", "13")
    assert not run(shell, CELL_B.format(dir=tmp_path / "ids"), "B").success
    capsys.readouterr()
    assert run(shell, CELL_A.format(dir=tmp_path / "ids", options=""), "A").success
    assert "other code" not in capsys.readouterr().out

    new_kernel(monkeypatch)
    run(shell, TWO)
    assert not run(shell, CELL_B.format(dir=tmp_path / "no-ids")).success
    stop = ckpt_nb.CheckpointManager(tmp_path / "no-ids").list().iloc[-1]["id"]
    capsys.readouterr()
    assert run(shell, CELL_A.format(dir=tmp_path / "no-ids", options="")).success
    assert f"checkpoint {stop} holds an unfinished run of other code" in \
        capsys.readouterr().out


def line_form_then_cell(shell, tmp_path: Path, capsys,
                        monkeypatch: pytest.MonkeyPatch) -> str:
    """What the line form (on the default store) and then a cell on that store say, after
    the line form saved."""
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    run(shell, ONE)
    run(shell, "%ckpt_auto --every-steps 2")
    assert run(shell, PLAIN).success
    assert run(shell, TRAIN.format(dir=tmp_path / "checkpoints" / "session", options="")).success
    return capsys.readouterr().out


def test_the_line_forms_checkpoints_are_no_other_codes_run(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell after the line form's saves was told to roll back to one of them and run
    again, but line-form runs are never resumed."""
    out = line_form_then_cell(shell, tmp_path, capsys, monkeypatch)
    assert "resumed" not in out and "other code" not in out, out


def test_the_line_form_names_its_store_as_a_path_as_a_cell_does(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """The line form named its store as a file:// URL, where a cell names a path."""
    out = line_form_then_cell(shell, tmp_path, capsys, monkeypatch)
    assert "file://" not in out and f" -> {tmp_path / 'checkpoints' / 'session'}\n" in out, out


def test_a_rerun_after_a_rollback_to_its_stop_says_nothing_changed(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """B stopped, A trained on, the user rolled back to B's stop: B run again said it
    kept modelA "as trained by another cell" and put back modelB and optB, which the
    rollback had put back (its in-place copy counted as a change)."""
    _, expected_b = ends(shell, tmp_path)
    store = tmp_path / "two"
    run(shell, TWO)
    assert run(shell, CELL_A.format(dir=store, options=""), "A").success
    monkeypatch.setenv("STOP_B", "13")
    assert not run(shell, CELL_B.format(dir=store), "B").success
    stop = ckpt_nb.CheckpointManager(store).list().iloc[-1]["id"]
    assert run(shell, CELL_A.format(dir=store, options=""), "A").success
    run(shell, f"%ckpt_rollback {stop}")
    monkeypatch.setenv("STOP_B", "")
    capsys.readouterr()
    assert run(shell, CELL_B.format(dir=store), "B").success
    line = resumed_line(capsys.readouterr().out)
    assert "kept as they are" not in line and "put back as saved" not in line, line
    assert same(weights(shell, "modelB", "optB"), expected_b)
    assert shell.user_ns["steps"](shell.user_ns["optA"]) == 20  # (as at B's stop)


def test_a_run_stopped_again_after_its_resume_keeps_what_another_cell_trained_since(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """B stopped, resumed, stopped again; A trained on: the second resume put modelA back
    (A's training undone), for the first resume's put-back counted as B's training."""
    store = tmp_path / "two"
    run(shell, TWO)
    assert run(shell, CELL_A.format(dir=store, options=""), "A").success
    monkeypatch.setenv("STOP_B", "13")
    assert not run(shell, CELL_B.format(dir=store), "B").success
    monkeypatch.setenv("STOP_B", "17")
    assert not run(shell, CELL_B.format(dir=store), "B").success  # (resumed, stopped again)
    assert run(shell, CELL_A.format(dir=store, options=""), "A").success
    trained_a = weights(shell, "modelA", "optA")
    monkeypatch.setenv("STOP_B", "")
    capsys.readouterr()
    assert run(shell, CELL_B.format(dir=store), "B").success
    line = resumed_line(capsys.readouterr().out)
    assert "kept as they are: modelA, optA (" in line, line
    assert same(weights(shell, "modelA", "optA"), trained_a)
