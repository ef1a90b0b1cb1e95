"""How long a save waits for the step of an optimizer holding accumulated gradients, in a
real in-process IPython shell (and the bookkeeping it counts by, in the pure API)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb._session import _Gradients
from test_magics import run

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

# A GAN trained in phases over 3 epochs of 300 batches: both nets at each batch, then the
# critic alone, then the generator accumulating over 40 batches.
PHASES_SETUP = """
import torch, ckpt_nb
torch.manual_seed(0)
G, D = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
optG = torch.optim.SGD(G.parameters(), lr=1e-3)
optD = torch.optim.SGD(D.parameters(), lr=1e-3)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4 * 300, 8)),
                                   batch_size=4)
"""
PHASES = """%%ckpt_auto --dir {dir} --every-steps 25
for epoch in ckpt_nb.epochs(3):
    for i, (x,) in ckpt_nb.batches(data):
        optD.zero_grad()
        (D(G(torch.randn(4, 4)).detach()).mean() - D(x).mean()).backward()
        optD.step()
        if epoch != 1:
            every = 1 if epoch == 0 else 40
            (-D(G(torch.randn(4, 4))).mean() / every).backward()
            if i % every == every - 1:
                optG.step(); optG.zero_grad()
"""


def test_a_save_waits_from_when_it_began_for_an_optimizer_that_rested(
        shell, tmp_path: Path, capsys) -> None:
    """The wait was counted from the optimizer's last step: the generator rested for
    the critic's 300 batches, so as it accumulated again each save went at once without
    its gradients (a resume from one went on without them: the run diverged)."""
    run(shell, PHASES_SETUP)
    assert run(shell, PHASES.format(dir=tmp_path / "store")).success
    assert "saving without the gradients" not in capsys.readouterr().out
    rows = ckpt_nb.CheckpointManager(tmp_path / "store").catalog.checkpoints()
    last_epoch = [row.batch_idx for row in rows if row.epoch == 2 and row.note == "every 25 steps"]
    assert last_epoch and {batch % 40 for batch in last_epoch} == {0}, last_epoch


STOPS_SETUP = """
import torch, ckpt_nb
torch.manual_seed(0)
model, other = torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
other_opt = torch.optim.SGD(other.parameters(), lr=1e-3)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4 * 400, 8)),
                                   batch_size=4)
"""
# ``opt`` steps at each batch until batch 50, and the loop backpropagates on into its
# model; ``other_opt`` steps at each batch (its gradients zeroed before).
STOPS = """%%ckpt_auto --dir {dir} --every-steps 20
for epoch in ckpt_nb.epochs(1):
    for i, (x,) in ckpt_nb.batches(data):
        other_opt.zero_grad(); other(x).mean().backward(); other_opt.step()
        model(x).mean().backward()
        if i < 50:
            opt.step(); opt.zero_grad()
"""


def test_an_optimizer_given_up_is_said_as_that_alone(shell, tmp_path: Path, capsys) -> None:
    """Where the one optimizer waited for was given up, and none stepped since the wait
    began, a second line said that "this loop backpropagates after its step" (naming
    no optimizer), which it does not."""
    run(shell, STOPS_SETUP)
    assert run(shell, STOPS.format(dir=tmp_path / "store")).success
    out = capsys.readouterr().out
    assert out.count("saving without the gradients opt accumulated: its step had not come "
                     "in 256 points") == 1, out
    assert "backpropagates after its step" not in out, out


def test_an_optimizer_gone_leaves_no_steps_counted() -> None:
    """The points of each optimizer's last step and its interval were kept by id and
    never cleared: an optimizer made again may take a dead one's id, and its interval
    (twice it: how long a save waits for it)."""
    gradients = _Gradients()
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    gradients.sample(optimizer)
    gradients.points = 1000
    gradients.sample(optimizer)
    assert len(gradients.interval) == len(gradients.last_step) == 1
    del optimizer
    gc.collect()
    assert len(gradients.interval) == len(gradients.last_step) == 0
