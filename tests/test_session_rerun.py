"""Cells run again in one kernel, in a real in-process IPython shell."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import _session
from test_magics import run  # (the shell's helper)

ONE = """
import torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(300, 8); Y = torch.randint(0, 2, (300,))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=50,
                                     shuffle=True)
model = torch.nn.Linear(8, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""


TRAIN = """%%ckpt_auto --dir {dir} --every-steps 6 {options}
for epoch in ckpt_nb.epochs(2):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
"""


# Two models in one notebook, each trained by a cell of its own; B stops once at step 13.
TWO = """
import os, torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20,
                                     shuffle=True)
modelA = torch.nn.Linear(8, 2); optA = torch.optim.Adam(modelA.parameters(), lr=0.05)
modelB = torch.nn.Linear(8, 2); optB = torch.optim.Adam(modelB.parameters(), lr=0.01)
def steps(opt):
    state = opt.state_dict()["state"]
    return int(state[0]["step"]) if state else 0
"""

CELL_A = """%%ckpt_auto --dir {dir} --every-steps 5
for epoch in ckpt_nb.epochs(2):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        optA.zero_grad(); torch.nn.functional.cross_entropy(modelA(xb), yb).backward()
        optA.step()
"""

# $STOP_B "before": raised at a consistent point (saved); "after": past one (not saved).
# (Not a variable: a resume would put it back.)
CELL_B = """%%ckpt_auto --dir {dir} --every-steps 5
for ep in ckpt_nb.epochs(2):
    for j, (xb, yb) in ckpt_nb.batches(loader):
        if os.environ["STOP_B"] == "before" and steps(optB) == 13: raise RuntimeError("B")
        optB.zero_grad(); torch.nn.functional.cross_entropy(modelB(xb), yb).backward()
        optB.step()
        if os.environ["STOP_B"] == "after" and steps(optB) == 13: raise RuntimeError("B")
"""


def new_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a kernel restarted after a crash knows: nothing of the runs before."""
    for name in ("_positions", "_position_events", "_left_values", "_position_objects"):
        monkeypatch.setattr(_session, name, {})
    monkeypatch.setattr(_session, "_left_saved", {})
    monkeypatch.setattr(_session, "_last", None)


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts like a new kernel."""
    new_kernel(monkeypatch)
    monkeypatch.setenv("STOP_B", "")


def weights(sh, model: str, opt: str) -> list[torch.Tensor]:
    """A model's tensors and its optimizer's."""
    state = sh.user_ns[opt].state_dict()["state"]
    return [t.clone() for t in sh.user_ns[model].state_dict().values()] + \
        [t.clone() for per_parameter in state.values() for t in per_parameter.values()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def resumed_line(out: str) -> str:
    return next(line for line in out.splitlines() if "resumed from" in line)


def test_the_line_form_names_a_skipped_variable_once(shell, tmp_path: Path, capsys) -> None:
    """The start line said "skipped loader (...)", then the first save said "not saving
    loader (...)" again."""
    run(shell, ONE)
    run(shell, f"%ckpt_auto --dir {tmp_path / 'line'} --every-steps 2")
    step = "opt.zero_grad(); model(torch.ones(8)).sum().backward(); opt.step()"
    run(shell, "for s in range(3):\n    " + step)
    run(shell, "extra = (i for i in range(3))")  # skipped, first met at a save
    run(shell, step + "\n" + step)
    out = capsys.readouterr().out
    assert out.count("loader (DataLoader") == 1, out
    assert out.count("not saving extra (") == 1, out


def test_no_resume_on_a_trained_model_counts_its_steps_on(shell, tmp_path: Path) -> None:
    """``--no-resume`` on the model the kernel last saved made a new root with steps from
    0, its weights those of the trained model: an unrelated lane in the explorer."""
    store = tmp_path / "nr"
    run(shell, ONE)
    assert run(shell, TRAIN.format(dir=store, options="")).success
    end = ckpt_nb.CheckpointManager(store).list().iloc[-1]
    assert run(shell, TRAIN.format(dir=store, options="--no-resume")).success
    new = ckpt_nb.CheckpointManager(store).list().iloc[-2]  # (the second run's first)
    assert new["parent"] == end["id"] and new["step"] == end["step"] + 6, new

    run(shell, ONE)  # new objects: they come from no checkpoint
    assert run(shell, TRAIN.format(dir=store, options="--no-resume")).success
    table = ckpt_nb.CheckpointManager(store).list()
    first = table.iloc[-2]
    assert first["parent"] is None and first["step"] == 6, first


@pytest.mark.parametrize("kernel", ["same", "new"])
def test_a_finished_run_whose_end_is_deleted_stays_finished(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    """Deleting a finished run's end checkpoint (the explorer's Delete) made the next run
    of the cell resume the run's checkpoint before it: the model put back to step 6, an
    epoch replayed."""
    store = tmp_path / "del"
    run(shell, ONE)
    assert run(shell, TRAIN.format(dir=store, options="")).success
    with ckpt_nb.CheckpointManager(store) as manager:
        end = manager.resolve("latest")
        manager.delete(end)
        before = manager.list()
    if kernel == "new":
        new_kernel(monkeypatch)
        run(shell, ONE)
    capsys.readouterr()
    assert run(shell, TRAIN.format(dir=store, options="")).success
    assert "resumed" not in capsys.readouterr().out
    after = ckpt_nb.CheckpointManager(store).list()
    first = after.iloc[len(before)]  # the new run's first checkpoint
    if kernel == "same":  # (on from the kernel's model, a child of the end's heir)
        assert first["parent"] == before.iloc[-1]["id"], first
        assert list(after["step"].iloc[len(before):]) == [18, 24]
    else:  # (new objects: a new root)
        assert first["parent"] is None and list(after["step"].iloc[len(before):]) == [6, 12]


def b_stopped(shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
              ) -> tuple[Path, list[torch.Tensor]]:
    """A ran, then B stopped at step 13 (saved there) in the store it returns; with what
    B's model and optimizer hold after a run never stopped."""
    run(shell, TWO)
    assert run(shell, CELL_A.format(dir=tmp_path / "ref")).success
    assert run(shell, CELL_B.format(dir=tmp_path / "ref")).success
    expected_b = weights(shell, "modelB", "optB")
    run(shell, TWO)
    monkeypatch.setenv("STOP_B", "before")
    assert run(shell, CELL_A.format(dir=tmp_path / "two")).success
    assert not run(shell, CELL_B.format(dir=tmp_path / "two")).success
    return tmp_path / "two", expected_b


def test_resuming_a_cell_keeps_the_model_another_cell_trained_since(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """B stopped, then A trained on (20 -> 40 steps): resuming B put modelA and optA back
    to their state when B stopped, A's training gone, and the resume line named only
    plain variables. B's own run still resumes bit-exact."""
    store, expected_b = b_stopped(shell, tmp_path, monkeypatch)
    assert run(shell, CELL_A.format(dir=store)).success
    assert shell.user_ns["steps"](shell.user_ns["optA"]) == 40
    trained_a = weights(shell, "modelA", "optA")
    monkeypatch.setenv("STOP_B", "")
    capsys.readouterr()
    assert run(shell, CELL_B.format(dir=store)).success
    line = resumed_line(capsys.readouterr().out)
    assert "kept as they are: modelA, optA (trained by another cell since this one " \
        "stopped, which does not train them)" in line, line
    assert same(weights(shell, "modelA", "optA"), trained_a)
    assert same(weights(shell, "modelB", "optB"), expected_b)


def test_a_resume_puts_back_the_objects_the_set_up_cell_made_since_the_stop(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """B stopped; the set-up cell ran again (a new modelB) and A saved it untrained: the
    resume kept that new modelB "as trained by another cell", and B went on from its
    position with an untrained model and a fresh optimizer."""
    store, expected_b = b_stopped(shell, tmp_path, monkeypatch)
    run(shell, TWO)  # (new objects)
    assert run(shell, CELL_A.format(dir=store)).success
    monkeypatch.setenv("STOP_B", "")
    capsys.readouterr()
    assert run(shell, CELL_B.format(dir=store)).success
    line = resumed_line(capsys.readouterr().out)
    assert "kept as they are" not in line and "put back as saved: modelB, optB" in line, line
    assert same(weights(shell, "modelB", "optB"), expected_b)


def test_a_resume_names_the_objects_it_puts_back_that_changed_since_the_stop(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """B stopped past its last save (its model a step on): what it left is not what any
    checkpoint holds, so the resume puts everything back, naming what changed since."""
    store = tmp_path / "two"
    run(shell, TWO)
    monkeypatch.setenv("STOP_B", "after")
    assert run(shell, CELL_A.format(dir=store)).success
    assert not run(shell, CELL_B.format(dir=store)).success  # not saved at the stop
    assert run(shell, CELL_A.format(dir=store)).success
    monkeypatch.setenv("STOP_B", "")
    capsys.readouterr()
    assert run(shell, CELL_B.format(dir=store)).success
    line = resumed_line(capsys.readouterr().out)
    assert "kept as they are" not in line and "put back as saved: modelA, optA, " in line, line
    assert shell.user_ns["steps"](shell.user_ns["optA"]) == 20


def test_a_resume_in_a_new_kernel_puts_every_object_back(shell, tmp_path: Path, capsys,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """After a crash, "Run All": what the store holds is all there is to go on from."""
    store = tmp_path / "two"
    run(shell, TWO)
    monkeypatch.setenv("STOP_B", "before")
    assert run(shell, CELL_A.format(dir=store)).success
    assert not run(shell, CELL_B.format(dir=store)).success
    new_kernel(monkeypatch)
    monkeypatch.setenv("STOP_B", "")
    run(shell, TWO)
    for _ in range(2):  # (A's run ended: it trains anew, then on)
        assert run(shell, CELL_A.format(dir=store)).success
    capsys.readouterr()
    assert run(shell, CELL_B.format(dir=store)).success
    line = resumed_line(capsys.readouterr().out)
    assert "kept as they are" not in line and "put back as saved: modelA, optA" in line, line
    assert shell.user_ns["steps"](shell.user_ns["optA"]) == 20  # as the stop's checkpoint


PLAIN_A = """
for _ in range(7):
    optA.zero_grad()
    torch.nn.functional.cross_entropy(modelA(X), Y).backward()
    optA.step()
"""


def test_a_resume_keeps_what_a_plain_cell_trained_since_and_puts_back_its_own_objects(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell with no %%ckpt_auto trained modelA after B stopped: the resume of B put
    modelA back, silently; a change to B's own model since goes back, named."""
    store = tmp_path / "two"
    run(shell, TWO)
    monkeypatch.setenv("STOP_B", "before")
    assert run(shell, CELL_A.format(dir=store)).success
    assert not run(shell, CELL_B.format(dir=store)).success  # stopped at step 13, saved
    assert run(shell, PLAIN_A).success
    assert run(shell, "with torch.no_grad():\n    modelB.weight.zero_()").success
    trained_a = weights(shell, "modelA", "optA")
    monkeypatch.setenv("STOP_B", "")
    capsys.readouterr()
    assert run(shell, CELL_B.format(dir=store)).success
    line = resumed_line(capsys.readouterr().out)
    assert "kept as they are: modelA, optA (" in line and "put back as saved: modelB" in line, \
        line
    assert same(weights(shell, "modelA", "optA"), trained_a)


def test_a_finished_cell_in_a_new_kernel_says_how_to_take_its_end_instead(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a crash in a later cell, "Run All" trained a finished cell again from step 0
    without a word: hours gone before the cell that stopped resumed. It now says so at
    once, naming the end checkpoint to roll back to; not in the kernel that ran it, nor
    once the cell's code changed."""
    store = tmp_path / "two"
    run(shell, TWO)
    assert run(shell, CELL_A.format(dir=store)).success
    end = ckpt_nb.CheckpointManager(store).list().iloc[-1]
    capsys.readouterr()
    assert run(shell, CELL_A.format(dir=store)).success  # (the same kernel: counts on)
    assert "ran to its end before" not in capsys.readouterr().out
    new_kernel(monkeypatch)
    run(shell, TWO)
    last = ckpt_nb.CheckpointManager(store).list().iloc[-1]
    assert last["id"] != end["id"] and last["step"] == 40
    assert run(shell, CELL_A.format(dir=store)).success
    out = capsys.readouterr().out
    said = (f"this cell ran to its end before, at checkpoint {last['id']} (epoch "
            f"{last['epoch']}, step {last['step']}): it trains again from the objects as they "
            "are now; to take that run's end state instead, interrupt it and run "
            f"`%ckpt_rollback {last['id']}`")
    assert said in out, out
    new_kernel(monkeypatch)
    run(shell, TWO)
    assert run(shell, CELL_A.format(dir=store) + "# edited\n").success
    assert "ran to its end before" not in capsys.readouterr().out


def test_a_rerun_after_the_checkpoint_rolled_back_to_was_deleted_says_it_resumes_another(
        shell, tmp_path: Path, capsys) -> None:
    """%ckpt_rollback X, X deleted (the explorer's Delete), the cell run again: it resumed
    X's parent without a word, the state rolled back to replaced by an older one."""
    store = tmp_path / "rb"
    train = TRAIN.replace("--every-steps 6", "--every-steps 3").format(dir=store, options="")
    run(shell, ONE)
    assert run(shell, train).success
    table = ckpt_nb.CheckpointManager(store).list().set_index("step")
    rolled_back, parent = table.loc[6, "id"], table.loc[3, "id"]
    assert run(shell, f"%ckpt_rollback {rolled_back}").success
    with ckpt_nb.CheckpointManager(store) as manager:
        manager.delete(rolled_back)
    capsys.readouterr()
    assert run(shell, train).success
    assert f"ckpt_nb: checkpoint {rolled_back}, rolled back to, was deleted since: resuming " \
        f"from {parent}, its nearest kept ancestor, in its place" in capsys.readouterr().out


def test_a_rerun_after_a_deleted_rollback_whose_heir_is_another_cells_says_so(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """%ckpt_rollback to B's first checkpoint (its parent: A's end), that checkpoint
    deleted, B run again: its nearest kept ancestor is A's end, another cell's, and B's
    loops started from batch 0 on the state the rollback put back, without a word."""
    store, _ = b_stopped(shell, tmp_path, monkeypatch)
    monkeypatch.setenv("STOP_B", "never")
    rows = ckpt_nb.CheckpointManager(store).list()
    a_end = rows.id.tolist()[rows.note.tolist().index("end of cell")]
    rolled_back = rows.id.tolist()[rows.note.tolist().index("end of cell") + 1]  # B's first
    assert run(shell, f"%ckpt_rollback {rolled_back}").success
    with ckpt_nb.CheckpointManager(store) as manager:
        manager.delete(rolled_back)
    capsys.readouterr()
    probe = "print('loops start at', ep, j) if not globals().get('_p') else None; " \
            "globals()['_p'] = 1; optB.zero_grad();"
    assert run(shell, CELL_B.format(dir=store).replace("optB.zero_grad();", probe)).success
    out = capsys.readouterr().out
    assert "loops start at 0 0" in out
    assert f"ckpt_nb: checkpoint {rolled_back}, rolled back to, was deleted since, and where " \
        "its loops stood with it: this cell's loops start from the beginning, on the state " \
        f"in memory (to train from a kept checkpoint instead, interrupt the cell and " \
        f"%ckpt_rollback it; {a_end} is the deleted one's nearest kept ancestor)" in out


def test_a_rerun_after_a_deleted_rollback_with_no_kept_ancestor_says_so(
        shell, tmp_path: Path, capsys) -> None:
    """%ckpt_rollback to a run's first checkpoint (a root), that checkpoint deleted, the
    cell run again: with no kept ancestor the position was forgotten, and with it the
    rollback, so the loops started from batch 0 on the rolled-back state without a word."""
    store = tmp_path / "rb"
    train = TRAIN.replace("--every-steps 6", "--every-steps 3").format(dir=store, options="")
    run(shell, ONE)
    assert run(shell, train).success
    root = ckpt_nb.CheckpointManager(store).list().set_index("step").loc[3, "id"]
    assert run(shell, f"%ckpt_rollback {root}").success
    with ckpt_nb.CheckpointManager(store) as manager:
        manager.delete(root)
    capsys.readouterr()
    probe = "print('loops start at', epoch, i) if not globals().get('_p') else None; " \
            "globals()['_p'] = 1; opt.zero_grad();"
    assert run(shell, train.replace("opt.zero_grad();", probe)).success
    out = capsys.readouterr().out
    assert "loops start at 0 0" in out
    assert f"ckpt_nb: checkpoint {root}, rolled back to, was deleted since, and where its " \
        "loops stood with it: this cell's loops start from the beginning, on the state in " \
        "memory (to train from a kept checkpoint instead, interrupt the cell and %ckpt_rollback " \
        "it; none of the deleted one's ancestors is kept)" in out
