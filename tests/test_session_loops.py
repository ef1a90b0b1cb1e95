"""Training cells whose loops the helpers do not fully track, in a real in-process IPython
shell: a loop without ckpt_nb.epochs()/batches(), batches() used more than once outside
epochs(), and optimizers stepping at different rates. None may resume silently wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpt_nb
from test_magics import run
from test_session_rerun import new_kernel

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

SETUP = """
import os, torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(300, 16)
Y = (X[:, :4].sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=30,
                                     shuffle=True)
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
step = 0

def crash_at(n):
    # A file named crash-N stops the cell with an error at step N, once.
    if os.path.exists(f"crash-{n}"):
        os.remove(f"crash-{n}")
        raise RuntimeError("crash")
"""


def checkpoints(store: Path) -> dict[str, int | None]:
    """The store's checkpoints: id -> step."""
    return {row.id: row.step for row in ckpt_nb.CheckpointManager(store).catalog.checkpoints()}


WHILE_LOOP = """%%ckpt_auto --dir {dir} --every-steps 7 --keep 2
it = iter(loader)
while step < 40:
    try:
        xb, yb = next(it)
    except StopIteration:
        it = iter(loader); continue
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
    step += 1
    crash_at(step)
del it
"""


def test_an_unresumable_run_is_said_and_kept(shell, tmp_path: Path, capsys,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop without the helpers, run again in a new kernel after a crash, trained from
    scratch without a word, and its --keep 2 deleted the crashed run's checkpoints."""
    store = tmp_path / "store"
    run(shell, SETUP)
    (tmp_path / "crash-30").write_text("")
    assert isinstance(run(shell, WHILE_LOOP.format(dir=store)).error_in_exec, RuntimeError)
    crashed = {cid for cid, step in checkpoints(store).items() if step == 30}
    assert len(crashed) == 1  # (saved at the consistent point before the error)
    crashed_id = crashed.pop()

    new_kernel(monkeypatch)
    run(shell, SETUP)
    capsys.readouterr()
    assert run(shell, WHILE_LOOP.format(dir=store)).success
    out = capsys.readouterr().out
    assert f"checkpoint {crashed_id} holds an unfinished run of this cell (step 30) that it " \
        "cannot resume: its loops do not go through ckpt_nb.epochs()/batches()" in out
    assert f"`%ckpt_rollback {crashed_id}`, then run this cell again" in out
    assert crashed_id in checkpoints(store)  # (the new run saved 6 times under --keep 2)
    assert out.count("holds an unfinished run") == 1


def test_a_run_rolled_back_to_goes_on_without_a_word(shell, tmp_path: Path, capsys,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """After the rollback the message advises, the cell goes on with that run's state:
    nothing to say."""
    store = tmp_path / "store"
    run(shell, SETUP)
    (tmp_path / "crash-30").write_text("")
    run(shell, WHILE_LOOP.format(dir=store))
    crashed_id = next(cid for cid, step in checkpoints(store).items() if step == 30)

    new_kernel(monkeypatch)
    run(shell, SETUP)
    assert run(shell, f"%ckpt_rollback {crashed_id} --dir {store}").success
    assert shell.user_ns["step"] == 30
    capsys.readouterr()
    assert run(shell, WHILE_LOOP.format(dir=store)).success
    assert "holds an unfinished run" not in capsys.readouterr().out
    assert shell.user_ns["step"] == 40
