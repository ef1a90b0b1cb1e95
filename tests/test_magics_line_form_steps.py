"""The line form's step count, driven through a real, in-process IPython shell."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

import ckpt_nb

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

SETUP = """
import torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def train(n):
    for _ in range(n):
        opt.zero_grad(); model(torch.ones(4)).sum().backward(); opt.step()
"""


def run(sh: InteractiveShell, code: str) -> None:
    result = sh.run_cell(code, store_history=False)
    assert result.success, (code, result.error_in_exec)


def saved(store: Path) -> list[tuple[str, str | None, int]]:
    rows = ckpt_nb.CheckpointManager(store).list()
    return list(zip(rows["id"], rows["parent"], rows["step"]))


def test_the_line_form_counts_its_steps_on_from_the_checkpoint_the_model_came_from(
        shell, tmp_path: Path) -> None:
    """It counted from 0: after a cell's run to step 4, the line form's save of 3 steps
    more said step 3, a child with a lower step than its parent; after a rollback, too."""
    store = tmp_path / "s"
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {store}\ntrain(4)")
    run(shell, f"%ckpt_auto --dir {store}")
    run(shell, "train(3)")
    run(shell, "%ckpt_auto --off")
    (cell_end, _, _), line_save = saved(store)
    assert line_save[1:] == (cell_end, 7)
    run(shell, f"%ckpt_rollback {cell_end} --dir {store}")
    run(shell, f"%ckpt_auto --dir {store}")
    run(shell, "train(2)")
    run(shell, "%ckpt_auto --off")
    assert saved(store)[-1][1:] == (cell_end, 6)
    run(shell, SETUP)  # (new objects: as a cell's run, step 0 in a new root)
    run(shell, f"%ckpt_auto --dir {store}")
    run(shell, "train(2)")
    run(shell, "%ckpt_auto --off")
    assert saved(store)[-1][1:] == (None, 2)


@pytest.mark.parametrize("after", ["cell", "rollback"])
def test_the_line_form_counts_the_steps_of_an_optimizer_made_anew(
        shell, tmp_path: Path, after: str) -> None:
    """After a %%ckpt_auto cell under it that made its model and optimizer anew, or a
    rollback into a model and optimizer made anew, the old optimizer's count stayed in the
    most any optimizer took: the new one's first steps counted none (11 where 14 were
    taken; after the rollback, no save at all of the 5 steps trained)."""
    store = tmp_path / "s"
    made = "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.01)"
    run(shell, SETUP)
    run(shell, f"%ckpt_auto --dir {store} --every-steps 2")
    if after == "cell":
        run(shell, "train(3)")
        run(shell, f"%%ckpt_auto --dir {store}\n{made}\ntrain(6)")
        start = 9
    else:
        run(shell, "train(5)")
        run(shell, made)
        run(shell, "%ckpt_rollback -1")
        start = 4
    run(shell, "train(5)")
    run(shell, "%ckpt_auto --off")
    rows = saved(store)
    assert [step for _, _, step in rows[-3:]] == [start + 2, start + 4, start + 5]
    steps = {cid: step for cid, _, step in rows}
    assert all(parent is None or steps[parent] < step for _, parent, step in rows)


@pytest.mark.parametrize("form", ["line", "cell"])
def test_an_on_save_at_the_step_an_every_steps_save_took_is_one_checkpoint(
        shell, tmp_path: Path, form: str) -> None:
    """A cell whose last step an --every-steps save took, then logging the --on metric,
    saved that state twice: the "every 5 steps" checkpoint without the metric, and a
    byte-identical "val_loss improved" one (--keep and -N counted both)."""
    store = tmp_path / "s"
    run(shell, SETUP)
    options = f"--dir {store} --every-steps 5 --on val_loss"
    cell = "train(10)\nckpt_nb.log(val_loss=0.5)"
    if form == "line":
        run(shell, f"%ckpt_auto {options}")
        run(shell, cell)
        run(shell, "%ckpt_auto --off")
    else:  # (a loop without the helpers: right after the step is a consistent point)
        run(shell, f"%%ckpt_auto {options}\n{cell}")
    rows = ckpt_nb.CheckpointManager(store).list()
    last = "val_loss improved" if form == "line" else "end of cell"
    assert rows["step"].tolist() == [5, 10]
    assert rows["note"].tolist() == ["every 5 steps", last]
    assert rows["val_loss"].tolist()[1] == 0.5
    assert rows["parent"].tolist()[1] == rows["id"].tolist()[0]


def test_a_cell_whose_last_step_a_trigger_saved_saves_what_it_changed_after(
        shell, tmp_path: Path) -> None:
    """Under the line form, a cell whose last step an --every-steps save took, then
    recording what it measured (``log.append(...)``), saved nothing at its end: the
    variables it changed after that step were in no checkpoint, and a rollback to the
    latest put ``log`` back without them (a cell of 3 steps saved them)."""
    store = tmp_path / "s"
    run(shell, SETUP + "log = []")
    run(shell, f"%ckpt_auto --dir {store} --every-steps 2")
    run(shell, "train(2)\nlog.append('evaluated')")
    run(shell, "log.append('later, in a cell that trains nothing')")
    run(shell, "%ckpt_rollback latest")
    run(shell, "%ckpt_auto --off")
    assert shell.user_ns["log"] == ["evaluated"]
    rows = ckpt_nb.CheckpointManager(store).list()
    assert rows["step"].tolist() == [2] and rows["note"].tolist() == ["every 2 steps"]
