"""Cells run again in one kernel, in a real in-process IPython shell."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def new_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a kernel restarted after a crash knows: nothing of the runs before."""
    for name in ("_positions", "_position_events", "_left_values", "_position_objects"):
        monkeypatch.setattr(_session, name, {})
    monkeypatch.setattr(_session, "_last", None)


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts like a new kernel."""
    new_kernel(monkeypatch)


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
