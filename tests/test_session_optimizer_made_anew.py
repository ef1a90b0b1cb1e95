"""The step count of a run whose loop makes its optimizer anew at every epoch's top (a
learning rate set by epoch): it went on counting only the newest optimizer's steps, so
``every_steps`` saved nothing after the first epoch. Scripts in a fresh interpreter,
trained on random data, killed (SIGKILL) in epoch 2 and run again."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpt_nb
from test_session_jobs import script  # (a script file run in a fresh interpreter)

# 6 batches an epoch, 3 epochs: 18 steps; a save every 4 steps.
REMADE = """
import hashlib, os, signal, torch, ckpt_nb
torch.set_num_threads(1)
torch.manual_seed(0)
X = torch.randn(60, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=10,
                                     shuffle=True)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)  # (defined, so a resume tracks it)
with ckpt_nb.auto("store", every_steps=4, sync=True):
    for epoch in ckpt_nb.epochs(3):
        opt = torch.optim.SGD(model.parameters(), lr=0.1 / (epoch + 1), momentum=0.9)
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if (epoch, i) == (1, 3) and os.environ["DIE"]:
                os.kill(os.getpid(), signal.SIGKILL)
print("params", hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                      for p in model.parameters())).hexdigest())
"""

# A GAN's two optimizers, both stepping every batch, the generator's made anew each epoch.
TWO = """
import torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(60, 8)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X), batch_size=10)
gen, disc = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
opt_d = torch.optim.SGD(disc.parameters(), lr=0.01)
with ckpt_nb.auto("store", every_steps=4, sync=True):
    for epoch in ckpt_nb.epochs(3):
        opt_g = torch.optim.SGD(gen.parameters(), lr=0.01 / (epoch + 1))
        for i, (xb,) in ckpt_nb.batches(loader):
            opt_d.zero_grad()
            (disc(xb).mean() - disc(gen(xb).detach()).mean()).backward()
            opt_d.step()
            opt_g.zero_grad()
            disc(gen(xb)).mean().backward()
            opt_g.step()
"""


def saved_steps(store: Path) -> list[int]:
    """The steps of the store's checkpoints, in the order they were saved."""
    return [int(s) for s in ckpt_nb.CheckpointManager(store).list()["step"]]


def test_an_optimizer_made_anew_each_epoch_counts_its_steps_on(tmp_path: Path) -> None:
    done = script(tmp_path, "train.py", REMADE)
    assert done.returncode == 0, done.stderr
    assert saved_steps(tmp_path / "store") == [4, 8, 12, 16, 18]


def test_two_optimizers_stepping_each_batch_count_one_step_a_batch(tmp_path: Path) -> None:
    done = script(tmp_path, "train.py", TWO)
    assert done.returncode == 0, done.stderr
    assert saved_steps(tmp_path / "store") == [4, 8, 12, 16, 18]


def test_a_kill_in_a_later_epoch_resumes_counting_on_and_ends_bit_exact(
        tmp_path: Path) -> None:
    (tmp_path / "ref").mkdir()
    unstopped = script(tmp_path / "ref", "train.py", REMADE)
    assert unstopped.returncode == 0, unstopped.stderr
    script(tmp_path, "train.py", REMADE, die=True)  # (killed at step 10, saved at 4 and 8)
    assert saved_steps(tmp_path / "store") == [4, 8]
    again = script(tmp_path, "train.py", REMADE)
    assert again.returncode == 0, again.stderr
    assert saved_steps(tmp_path / "store") == [4, 8, 12, 16, 18]
    assert again.stdout.split("params ")[1] == unstopped.stdout.split("params ")[1]


# A wrapper optimizer over the same parameters stepping an inner one (SAM's shape, or
# ZeroRedundancyOptimizer's), made anew each epoch.
WRAPPED = """
import torch, ckpt_nb
class Wrapper(torch.optim.Optimizer):
    def __init__(self, params):
        params = list(params)
        super().__init__(params, {})
        self.inner = torch.optim.SGD(params, lr=0.1)
    def step(self, closure=None):
        return self.inner.step(closure)
torch.manual_seed(0)
X = torch.randn(60, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=10)
model = torch.nn.Linear(8, 2)
with ckpt_nb.auto("store", every_steps=4, sync=True):
    for epoch in ckpt_nb.epochs(3):
        opt = Wrapper(model.parameters())
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
"""


def test_a_wrapper_optimizer_counts_its_inner_ones_steps_once(tmp_path: Path) -> None:
    """The wrapper's first step counted on from its inner optimizer's, stepped inside it:
    one step too many (an epoch's 6 batches saved as step 7), more at each epoch."""
    done = script(tmp_path, "train.py", WRAPPED)
    assert done.returncode == 0, done.stderr
    assert saved_steps(tmp_path / "store") == [4, 8, 12, 16, 18]


# An optimizer class of its own whose step() calls its base class's, made anew each
# epoch; a plain SGD made before it, so that SGD's step is hooked too.
SUBCLASSED = """
import torch, ckpt_nb
class ClippedSGD(torch.optim.SGD):
    def step(self, closure=None):
        torch.nn.utils.clip_grad_norm_(
            [p for group in self.param_groups for p in group["params"]], 1.0)
        return super().step(closure)
torch.manual_seed(0)
X = torch.randn(60, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=10)
model = torch.nn.Linear(8, 2)
warm_up = torch.optim.SGD(model.parameters(), lr=0.0)
with ckpt_nb.auto("store", every_steps=4, sync=True):
    for epoch in ckpt_nb.epochs(3):
        opt = ClippedSGD(model.parameters(), lr=0.1)
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
"""


def test_a_step_calling_its_base_classes_counts_once(tmp_path: Path) -> None:
    """Both steps were hooked (the subclass's and, inside it, SGD's): each batch counted
    two steps, so every_steps=4 saved every 2 batches, the steps saved up to 36."""
    done = script(tmp_path, "train.py", SUBCLASSED)
    assert done.returncode == 0, done.stderr
    assert saved_steps(tmp_path / "store") == [4, 8, 12, 16, 18]


# A wrapper made once whose inner optimizer keeps momentum: SAM's state_dict() holds only
# its own state; HOLDING's holds the inner one's too; TRACKED holds it in a variable.
INNER_STATE = """
import copy, torch, ckpt_nb
class Wrapper(torch.optim.Optimizer):
    def __init__(self, params):
        params = list(params)
        super().__init__(params, {})
        self.base_optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    def step(self, closure=None):
        return self.base_optimizer.step(closure)
class Holding(Wrapper):
    def state_dict(self):
        return self.base_optimizer.state_dict()
    def load_state_dict(self, state):
        self.base_optimizer.load_state_dict(state)
class Copying(Wrapper):
    def state_dict(self):
        return {"own": super().state_dict(),
                "base": copy.deepcopy(self.base_optimizer.state_dict())}
    def load_state_dict(self, state):
        super().load_state_dict(state["own"])
        self.base_optimizer.load_state_dict(state["base"])
class TwoSteps(torch.optim.Optimizer):  # (SAM's shape: its base stepped by second_step())
    def __init__(self, params):
        self.base_optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        super().__init__(self.base_optimizer.param_groups, {})
        self.param_groups = self.base_optimizer.param_groups
    def second_step(self):
        self.base_optimizer.step()
torch.manual_seed(0)
X = torch.randn(60, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=10)
model = torch.nn.Linear(8, 2)
opt = CLASS(model.parameters())
BASE
with ckpt_nb.auto("store", every_steps=4, sync=True):
    for epoch in ckpt_nb.epochs(2):
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            STEP
"""


@pytest.mark.parametrize(("cls", "base", "told"), [
    ("Wrapper", "", True), ("Holding", "", False), ("Copying", "", False),
    ("TwoSteps", "", True), ("Wrapper", "base = opt.base_optimizer", False)])
def test_an_inner_optimizers_state_no_checkpoint_holds_is_said(
        tmp_path: Path, cls: str, base: str, told: bool) -> None:
    """SAM's base optimizer's momentum: no checkpoint held it, and a resume trained on
    without it, silently. Said once, where neither the wrapper's state_dict() nor a
    tracked variable holds it."""
    done = script(tmp_path, "train.py",
                  INNER_STATE.replace("CLASS", cls).replace("BASE", base).replace(
                      "STEP", "opt.second_step()" if cls == "TwoSteps" else "opt.step()"))
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if "leaves out" in line]
    assert said == ([
        "ckpt_nb: the SGD that opt steps keeps state (momentum_buffer) that "
        "opt.state_dict() leaves out: no checkpoint holds it, so a resume or rollback "
        f"trains on without it; give {cls} a state_dict() and load_state_dict() that "
        "hold its inner optimizer's too"] if told else []), done.stdout
