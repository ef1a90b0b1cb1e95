"""accelerate's ``accelerator.prepare(model, opt, loader, sched)`` wraps the optimizer and
the scheduler (AcceleratedOptimizer, AcceleratedScheduler) whose state_dict() is the one
they hold. A checkpoint recorded the wrapper's class, so a restore into the plain
optimizer (an evaluation notebook without accelerate) was refused as "AcceleratedOptimizer's
state", and told to restore into AcceleratedOptimizer; the other way too. They are now
saved and restored through what they hold, as a compiled model is. (The wrappers are
drawn here as accelerate draws them, named as accelerate names them: CI has no
accelerate.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckpt_nb

from ckpt_nb import CheckpointManager
from ckpt_nb._capture import _other_kind


class AcceleratedOptimizer(torch.optim.Optimizer):
    """As accelerate's: the wrapped optimizer's groups, state and state_dict()."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def param_groups(self):  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self):  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self):  # type: ignore[override]
        return self.optimizer.defaults

    def state_dict(self):  # type: ignore[override]
        return self.optimizer.state_dict()

    def load_state_dict(self, state):  # type: ignore[override]
        self.optimizer.load_state_dict(state)

    def step(self, closure=None):  # type: ignore[override]
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)


class AcceleratedScheduler:
    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler

    def step(self) -> None:
        self.scheduler.step()

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, state) -> None:
        self.scheduler.load_state_dict(state)


AcceleratedOptimizer.__module__ = "accelerate.optimizer"
AcceleratedScheduler.__module__ = "accelerate.scheduler"


def trio(prepared: bool) -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    if prepared:
        return model, AcceleratedOptimizer(opt), AcceleratedScheduler(sched)
    return model, opt, sched


def train(model, opt, sched, steps: int = 3) -> None:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        sched.step()


def test_a_prepared_optimizer_and_scheduler_move_to_plain_ones_and_back(
        tmp_path: Path) -> None:
    for saved_prepared in (True, False):
        mgr = CheckpointManager(tmp_path / str(saved_prepared))
        model, opt, sched = trio(saved_prepared)
        train(model, opt, sched)
        cid = mgr.save(model, opt, 0, scheduler=sched)
        assert mgr.load(cid).kinds["optimizer"] == "torch.optim.adamw.AdamW"
        assert mgr.load(cid).kinds["scheduler"] == "torch.optim.lr_scheduler.StepLR"
        live = trio(not saved_prepared)
        mgr.restore(cid, model=live[0], optimizer=live[1], scheduler=live[2])
        train(model, opt, sched)
        train(*live)
        assert torch.equal(live[0].weight, model.weight)
        assert live[2].state_dict() == sched.state_dict()


def test_a_state_recorded_as_the_wrappers_is_checked_as_one_of_unknown_class() -> None:
    """(Checkpoints saved before: their optimizer's class is not known, as a file's.)"""
    model, opt, _ = trio(False)
    state = opt.state_dict()
    assert _other_kind("optimizer", opt, "accelerate.optimizer.AcceleratedOptimizer",
                       state) is None
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    said = _other_kind("optimizer", sgd, "accelerate.optimizer.AcceleratedOptimizer", state)
    assert said is not None and "momentum" in said, said


@pytest.mark.usefixtures("fresh_process_state")
def test_a_track_that_leaves_out_a_prepared_scheduler_says_so(tmp_path: Path, capsys) -> None:
    """track="model,opt" with accelerate's prepared scheduler of opt: no word, where a plain
    StepLR of opt is named (a resume puts opt's learning rate back, not the scheduler's)."""
    model, opt, sched = trio(True)
    with ckpt_nb.auto(tmp_path, namespace={"model": model, "opt": opt, "sched": sched},
                      track="model,opt"):
        pass
    assert 'leaves out sched (AcceleratedScheduler of opt), which sets the learning rate ' \
        'of a tracked optimizer' in capsys.readouterr().out
