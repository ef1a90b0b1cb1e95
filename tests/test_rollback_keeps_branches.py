"""A cell's --keep after a rollback: the checkpoint rolled back to and the branch rolled
back from stay (to diff the branches, as notebook 02 does), in a real in-process IPython
shell training on sklearn digits."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpt_nb
from test_magics import SETUP, TRAIN, run

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)


# (half the digits: 9 batches an epoch, 27 steps a run, saves at steps 7, 14 and 21 and at
# its end, one more than --keep 3 keeps; the fork, the first kept, lies mid-run, in epoch 1)
HALF_SETUP = SETUP.replace("TensorDataset(X, Y)", "TensorDataset(X[:900], Y[:900])")
assert HALF_SETUP != SETUP


def cell(store: Path, options: str = "") -> str:
    """The training cell under --keep 3 (and ``options``)."""
    return TRAIN.format(dir=store, stop="pass").replace(
        "--every-steps 7", f"--every-steps 7 --keep 3 {options}")


@pytest.mark.parametrize("options", ["--no-resume", ""])
def test_a_rerun_after_a_rollback_keeps_the_fork_and_the_branch_it_left(
        shell, tmp_path: Path, options: str) -> None:
    """Run again on the new branch (a new run, or the rolled-back run resumed), the cell's
    --keep 3 deleted the first run's checkpoints, its end and the one rolled back to too,
    and the new branch's first checkpoint became a root."""
    store = tmp_path / "s"
    run(shell, HALF_SETUP)
    assert run(shell, cell(store), cell_id="train").success
    first = list(ckpt_nb.CheckpointManager(store).list().id)
    assert len(first) == 3
    fork = first[0]
    assert run(shell, f"%ckpt_rollback {fork}").success
    assert run(shell, cell(store, options), cell_id="train").success
    assert run(shell, cell(store), cell_id="train").success  # (and run once more on it)

    rows = ckpt_nb.CheckpointManager(store).list().set_index("id")
    assert set(first) <= set(rows.index), "the branch rolled back from was deleted"
    branch = [cid for cid in rows.index if cid not in first]
    assert len(branch) == 3, "--keep 3 still counts the new branch's checkpoints"
    lineage, at = [], branch[-1]
    while at is not None:
        lineage.append(at)
        parent = rows.loc[at, "parent"]
        at = None if parent is None or parent != parent else parent  # (NaN: a root)
    assert lineage[-1] == fork, "the new branch descends from the checkpoint rolled back to"
    ckpt_nb.CheckpointManager(store).diff(first[-1], branch[-1])  # (notebook 02's last step)


def test_the_line_forms_keep_after_a_rollback_keeps_the_branch_it_left(
        shell, tmp_path: Path) -> None:
    """The line form's --keep 2 deleted the checkpoints saved before the rollback, the one
    rolled back to too, as the cell form's did."""
    store = tmp_path / "s"
    train = "for xb, yb in loader:\n    opt.zero_grad()\n" \
        "    torch.nn.functional.cross_entropy(model(xb), yb).backward()\n    opt.step()\n"
    run(shell, SETUP)
    assert run(shell, f"%ckpt_auto --dir {store} --every-steps 5 --keep 2").success
    assert run(shell, train).success
    first = list(ckpt_nb.CheckpointManager(store).list().id)
    assert len(first) == 2
    assert run(shell, f"%ckpt_rollback {first[0]}").success
    assert run(shell, train).success and run(shell, train).success
    rows = ckpt_nb.CheckpointManager(store).list().set_index("id")
    assert set(first) <= set(rows.index), "the branch rolled back from was deleted"
    branch = [cid for cid in rows.index if cid not in first]
    assert len(branch) == 2 and rows.loc[branch[0], "parent"] == first[0]
    run(shell, "%ckpt_auto --off")
