"""What a cell says when an interrupt stops it: where the interrupt's save, or the cell's
end save, fails (a real write refused past a file size, as on a full disk), and where a
second interrupt stops it at once. In a real in-process IPython shell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ckpt_nb
from test_magics import run  # (the shell's helper)

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

SETUP = """
import os, signal, time, torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(1024, 1024)  # (4 MiB: its pack is refused past a 1 MiB limit)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(4, 1024)
STOP, FAIL_FROM, HOLD, RAISE = None, None, None, None

def step(i):
    if i == FAIL_FROM:
        while ckpt_nb.status()["pending_write"]:  # (the save before goes in)
            time.sleep(0.01)
        limit(1 << 20)  # (each save from here on fails, as on a full disk)
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
    if i == STOP:
        os.kill(os.getpid(), signal.SIGINT)
    if i == RAISE:
        raise RuntimeError("diverged")
    if i == HOLD:  # (a hung batch: a second interrupt stops it at once)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

class Stopper:
    # A tracked object that interrupts the kernel as its state is captured, when armed:
    # the user pressing Stop while the cell's end is saved.
    def __init__(self):
        self.armed = False
        self.twice = False  # (a second interrupt: stop at once)

    def state_dict(self):
        for _ in range(2 if self.twice else 1) if self.armed else ():
            os.kill(os.getpid(), signal.SIGINT)
        return {"n": torch.zeros(1)}

    def load_state_dict(self, state):
        pass

stopper = Stopper()
"""

CELL = """%%ckpt_auto --dir {dir} --every-steps 2
for epoch in ckpt_nb.epochs(1):
    for i, _ in ckpt_nb.batches(range(6)):
        step(i)
"""


@pytest.fixture
def notebook(shell: Any, file_size_limit: Any) -> Any:
    run(shell, SETUP)
    shell.user_ns["limit"] = file_size_limit
    return shell


def steps_saved(store: Path) -> list[tuple[str, int]]:
    rows = ckpt_nb.CheckpointManager(store).list()
    return list(zip(rows["id"], rows["step"]))


def test_a_failed_interrupt_save_says_so_and_names_the_checkpoint_before(
        notebook: Any, tmp_path: Path, capsys: Any) -> None:
    """It said "saved <the step-2 checkpoint> on interrupt" and "run it again to go on
    from checkpoint <that one>": steps 3 and 4 were lost, and said saved."""
    run(notebook, "STOP, FAIL_FROM = 2, 2")  # (saved at step 2; the interrupt's, at 4, fails)
    error = run(notebook, CELL.format(dir=tmp_path / "run")).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    saved = steps_saved(tmp_path / "run")
    assert [s for _, s in saved] == [2]
    first = saved[0][0]
    said = capsys.readouterr()
    assert "on interrupt" not in said.out, said.out
    assert "ckpt_nb: the state at the interrupt was NOT saved: StoreError: " in said.err
    assert said.err.rstrip().endswith(f"the latest checkpoint is {first} (step 2)"), said.err
    assert str(error) == (f"the cell stopped at step 3, NOT saved (its save failed); the "
                          f"latest checkpoint is {first} (step 2): run the cell again to go "
                          "on from it")


def test_a_failed_interrupt_save_before_any_checkpoint_says_none_holds_the_run(
        notebook: Any, tmp_path: Path, capsys: Any) -> None:
    """It said "run it again to go on from checkpoint None"."""
    run(notebook, "STOP, FAIL_FROM = 0, 0")
    error = run(notebook, CELL.format(dir=tmp_path / "run")).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    assert steps_saved(tmp_path / "run") == []
    assert "None" not in str(error)
    assert str(error) == ("the cell stopped at step 1, NOT saved (its save failed) and no "
                          "checkpoint holds its run: running the cell again starts over from "
                          "the objects as they are")
    said = capsys.readouterr().err
    assert "the state at the interrupt was NOT saved: " in said
    assert said.rstrip().endswith("the latest checkpoint is none"), said

def interrupted_in_the_end_save(notebook: Any, tmp_path: Path
                                ) -> tuple[BaseException, list[tuple[str, int]]]:
    """The cell run to step 5, interrupted as its end is saved: its error, and the
    (id, step) of each checkpoint it saved (steps 2 and 4)."""
    error = run(notebook, CELL.format(dir=tmp_path / "run").replace("range(6)", "range(5)")
                .replace("        step(i)\n", "        step(i)\n        stopper.armed = i == 4\n")
                ).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    saved = steps_saved(tmp_path / "run")
    assert [s for _, s in saved] == [2, 4]
    return error, saved



def test_an_interrupt_during_a_failed_end_save_does_not_call_it_saved(
        notebook: Any, tmp_path: Path, capsys: Any) -> None:
    """It said "the cell's end was NOT saved", then "the save finished (checkpoint
    <the step-4 one>)" and "the cell ran to its end, saved as checkpoint <that one>"."""
    run(notebook, "FAIL_FROM = 4")  # (the end's save, at step 5)
    error, saved = interrupted_in_the_end_save(notebook, tmp_path)
    latest = saved[-1][0]
    said = capsys.readouterr()
    assert "interrupt received: finishing the save of the cell's end" in said.err
    assert "ckpt_nb: the cell's end was NOT saved: " in said.err
    assert said.err.rstrip().endswith(f"the latest checkpoint is {latest} (step 4)"), said.err
    assert "the save finished" not in said.out, said.out
    assert error._render_traceback_() == [
        "KeyboardInterrupt: the cell ran to its end, NOT saved (its save failed); the latest "
        f"checkpoint is {latest} (step 4)"]


def test_a_second_interrupt_before_any_checkpoint_says_nothing_was_saved(
        notebook: Any, tmp_path: Path, capsys: Any) -> None:
    """It ended the cell with a bare "KeyboardInterrupt:", saying nothing of what was
    kept. The traceback stays the user's code's: where a hung cell was stuck."""
    run(notebook, "HOLD = 2")
    error = run(notebook, CELL.format(dir=tmp_path / "run").replace("--every-steps 2",
                                                                   "--every-steps 5")
                ).error_in_exec
    assert isinstance(error, KeyboardInterrupt) and str(error) == ""
    assert steps_saved(tmp_path / "run") == []
    out = capsys.readouterr().out
    said = "ckpt_nb: stopped at once at step 3: not saved; the latest checkpoint is none\n"
    assert said in out, out
    assert out.index(said) < out.index("Traceback")  # (the user's, after it)


def test_a_second_interrupt_names_the_latest_checkpoint(notebook: Any, tmp_path: Path,
                                                        capsys: Any) -> None:
    run(notebook, "HOLD = 2")
    assert isinstance(run(notebook, CELL.format(dir=tmp_path / "run")).error_in_exec,
                      KeyboardInterrupt)
    (latest, step), = steps_saved(tmp_path / "run")
    assert step == 2
    out = capsys.readouterr().out
    assert (f"ckpt_nb: stopped at once at step 3: not saved; the latest checkpoint is "
            f"{latest} (step 2)\n") in out, out


def test_a_second_interrupt_during_the_end_save_says_what_holds_the_run(
        notebook: Any, tmp_path: Path) -> None:
    run(notebook, "stopper.twice = True")
    error, saved = interrupted_in_the_end_save(notebook, tmp_path)
    assert str(error) == ("stopped at once at step 5 while saving the cell's end: not saved; "
                          f"the latest checkpoint is {saved[-1][0]} (step 4)")


@pytest.mark.parametrize("stop", ["HOLD", "RAISE"])
def test_a_run_after_a_stop_no_checkpoint_holds_says_it_starts_from_the_trained_objects(
        notebook: Any, tmp_path: Path, capsys: Any, stop: str) -> None:
    """Stopped at once (or by an error) at step 3, before the first checkpoint, the cell
    run again said nothing, and saved "step 5" holding a model 8 steps trained."""
    cell = CELL.format(dir=tmp_path / "run").replace("--every-steps 2", "--every-steps 5")
    run(notebook, f"{stop} = 2")
    assert run(notebook, cell).error_in_exec is not None
    assert steps_saved(tmp_path / "run") == []
    run(notebook, f"{stop} = None")
    capsys.readouterr()
    assert run(notebook, cell).success
    said = ("ckpt_nb: model, opt are as a run that stopped at step 3 left them, trained past "
            "any checkpoint: this cell trains on from there, not from a clean start; run the "
            "set-up cell again for one\n")
    assert said in capsys.readouterr().out
    # Run again after the set-up cell: new objects, a clean start, nothing said.
    run(notebook, f"{stop} = 2")
    assert run(notebook, cell.replace("/run", "/again")).error_in_exec is not None
    run(notebook, SETUP)
    capsys.readouterr()
    assert run(notebook, cell.replace("/run", "/again")).success
    assert "trained past" not in capsys.readouterr().out


def test_a_stop_past_a_finished_runs_end_names_that_checkpoint(notebook: Any, tmp_path: Path,
                                                               capsys: Any) -> None:
    """A finished cell run again counts its steps on from its end (step 6); stopped at
    once at step 9, before its next save, it said nothing when run again after."""
    cell = CELL.format(dir=tmp_path / "run").replace("--every-steps 2", "--every-steps 5")
    assert run(notebook, cell).success
    (end, step), = steps_saved(tmp_path / "run")[-1:]
    assert step == 6
    run(notebook, "HOLD = 2")
    assert isinstance(run(notebook, cell).error_in_exec, KeyboardInterrupt)
    run(notebook, "HOLD = None")
    capsys.readouterr()
    assert run(notebook, cell).success
    assert (f"ckpt_nb: model, opt are as a run that stopped at step 9 left them, trained past "
            f"checkpoint {end} (step 6): this cell trains on from there, not from a clean "
            f"start; run the set-up cell again for one (or %ckpt_rollback {end})\n"
            ) in capsys.readouterr().out


def test_a_failed_end_save_under_the_line_form_says_not_saved(
        notebook: Any, tmp_path: Path, capsys: Any) -> None:
    """Under %ckpt_auto (the line form) an interrupt with no consistent point after it,
    whose end save failed, said "it ran to its end (latest checkpoint none)"."""
    run(notebook, f"%ckpt_auto --dir {tmp_path / 'run'} --every-steps 2")
    run(notebook, "for i in range(3): step(i)")
    (latest, step), = steps_saved(tmp_path / "run")[-1:]
    capsys.readouterr()
    assert run(notebook, "step(3)\nlimit(1 << 20)\nos.kill(os.getpid(), signal.SIGINT)\n"
                         "time.sleep(0.3)").success
    run(notebook, "limit(None)")
    assert steps_saved(tmp_path / "run")[-1] == (latest, step)
    said = capsys.readouterr()
    assert "ckpt_nb: the cell's end was NOT saved: StoreError: " in said.err
    assert ("ckpt_nb: interrupted, but no consistent point came before the cell ended: it "
            f"ran to its end (NOT saved, said above; the latest checkpoint is {latest} "
            f"(step {step}))\n") in said.out, said.out
    assert "checkpoint none" not in said.out + said.err


def test_a_failed_interrupt_save_under_sync_says_so(notebook: Any, tmp_path: Path,
                                                    capsys: Any) -> None:
    """With --sync the failed save raised StoreError's traceback, not the cell's stop."""
    run(notebook, "STOP, FAIL_FROM = 2, 2")
    error = run(notebook, CELL.format(dir=tmp_path / "run").replace(
        "--every-steps 2", "--every-steps 2 --sync")).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    (first, step), = steps_saved(tmp_path / "run")
    assert step == 2
    said = capsys.readouterr().err
    assert "ckpt_nb: the state at the interrupt was NOT saved: StoreError: " in said
    assert said.rstrip().endswith(f"the latest checkpoint is {first} (step 2)"), said
    assert str(error) == (f"the cell stopped at step 3, NOT saved (its save failed); the "
                          f"latest checkpoint is {first} (step 2): run the cell again to go "
                          "on from it")


@pytest.mark.parametrize("sync", [False, True])
def test_a_cell_whose_every_save_fails_says_so(notebook: Any, tmp_path: Path, capsys: Any,
                                               sync: bool) -> None:
    """Each save failing (a full disk), the cell trains on as a background save's failure
    lets it, saying the first failure, the count of the rest, and that its end was NOT
    saved; with --sync the first failure raised StoreError and stopped the cell."""
    run(notebook, "FAIL_FROM = 0")
    result = run(notebook, CELL.format(dir=tmp_path / "run").replace(
        "--every-steps 2", "--every-steps 2 --sync" if sync else "--every-steps 2"))
    assert result.success, result.error_in_exec
    assert steps_saved(tmp_path / "run") == []
    said = capsys.readouterr().err
    kind = "" if sync else "background "
    assert said.count(f"ckpt_nb: a {kind}save failed: StoreError: ") == 1, said
    assert f"ckpt_nb: 2 more {kind}saves failed the same way" in said, said  # (steps 4, 6)
    assert "ckpt_nb: the cell's end was NOT saved: StoreError: " in said, said


LOAD_INTERRUPTS = """
def _load(self, state):  # (Ctrl-C pressed `load_interrupts` times as the stopper loads)
    for _ in range(getattr(self, "load_interrupts", 0)):
        os.kill(os.getpid(), signal.SIGINT)
    self.load_interrupts = 0
Stopper.load_state_dict = _load
"""


@pytest.mark.parametrize("presses", [1, 2])
def test_an_interrupt_in_a_rollback_under_the_line_form_ends_the_cell(
        notebook: Any, tmp_path: Path, capsys: Any, presses: int) -> None:
    """The line form's handler took the held interrupt as training's: "saving at the next
    consistent point", then "it ran to its end", and the cell succeeded (two presses, one)."""
    run(notebook, LOAD_INTERRUPTS)
    run(notebook, f"%ckpt_auto --dir {tmp_path / 'run'} --every-steps 2")
    run(notebook, "for i in range(4): step(i)")
    saved = steps_saved(tmp_path / "run")
    run(notebook, f"stopper.load_interrupts = {presses}")
    capsys.readouterr()
    error = run(notebook, "%ckpt_rollback -1").error_in_exec
    target = saved[-2][0]
    assert isinstance(error, KeyboardInterrupt)
    assert str(error) == (f"interrupted during the rollback to {target}, which finished "
                          "first: all of it was put back")
    said = capsys.readouterr()
    assert f"ckpt_nb: rolled back to {target} (step 2)" in said.out
    assert said.err.count("interrupt received") == 1, said.err  # (the rollback's)
    assert "no consistent point" not in said.out, said.out
    assert steps_saved(tmp_path / "run") == saved
    assert run(notebook, "for i in range(2): step(i)").success  # (the session goes on)
    assert [s for _, s in steps_saved(tmp_path / "run")] == [2, 4, 4]


def test_an_interrupt_as_a_cell_resumes_is_taken_as_one_during_training(
        notebook: Any, tmp_path: Path, capsys: Any) -> None:
    """A %%ckpt_auto cell's resume gives a held interrupt to the cell's own handler: the
    resume finishes, the cell saves at its next consistent point, then stops."""
    run(notebook, LOAD_INTERRUPTS)
    run(notebook, "STOP = 2")
    assert isinstance(run(notebook, CELL.format(dir=tmp_path / "run")).error_in_exec,
                      KeyboardInterrupt)
    run(notebook, "STOP = None; stopper.load_interrupts = 1")
    capsys.readouterr()
    error = run(notebook, CELL.format(dir=tmp_path / "run")).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    said = capsys.readouterr()
    assert "interrupt received: the resume from " in said.err, said.err
    assert "interrupt received: saving at the next consistent point" in said.err, said.err
    assert "ckpt_nb: resumed from " in said.out
    (cid, step), = steps_saved(tmp_path / "run")[-1:]
    assert step == 4
    assert str(error) == f"the cell stopped at step 4: run it again to go on from checkpoint {cid}"


def test_a_second_interrupt_during_an_errors_save_says_what_holds_the_run(
        notebook: Any, tmp_path: Path) -> None:
    """A cell that failed at a consistent point, interrupted twice as that state is saved:
    a bare KeyboardInterrupt from ckpt_nb's save came out of the cell's end in place of
    the error, saying nothing of what was kept."""
    cell = CELL.format(dir=tmp_path / "run").replace("        step(i)\n", """\
        stopper.armed = stopper.twice = i == 3
        if i == 3:
            raise RuntimeError("diverged")
        step(i)
""")
    error = run(notebook, cell).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    (latest, step), = steps_saved(tmp_path / "run")
    assert step == 2
    assert str(error) == ("stopped at once at step 3 while saving the state before the "
                          f"RuntimeError: not saved; the latest checkpoint is {latest} (step 2)")
    assert isinstance(error.__cause__, RuntimeError)
