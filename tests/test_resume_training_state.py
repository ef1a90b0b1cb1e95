"""What a resume must put back besides the state_dicts: gradients accumulated for an
optimizer step to come (a save waits for the step), parameters' requires_grad, and a
checkpoint that no longer fits the objects (a refusal that says the ways on). Scripts
stopped (SIGINT, SIGKILL) and run again, their final parameters compared bit for bit with
a run never stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import ckpt_nb
from test_session_jobs import script  # (a script file run in a fresh interpreter)

HEAD = """
import hashlib, os, signal, sys, torch, ckpt_nb
torch.set_num_threads(1)
torch.manual_seed(0)
X = torch.randn(180, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=10,
                                     shuffle=True)

AT = (1, 7)

def stop_at(epoch, i, signum):
    # The file "stop" there stops the script once (SIGINT), or kills it (DIE set).
    if (epoch, i) == AT and (os.path.exists("stop") or os.environ["DIE"]):
        if os.path.exists("stop"):
            os.remove("stop")
        os.kill(os.getpid(), signum)

def digest(model):
    return hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                 for p in model.parameters())).hexdigest()
"""

# Three backward passes a step: 18 batches an epoch, steps after batches 2, 5, 8, ...
ACCUMULATE = HEAD + """
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
try:
    with ckpt_nb.auto("store", every_steps=4, sync=True):
        for epoch in ckpt_nb.epochs(2):
            for i, (xb, yb) in ckpt_nb.batches(loader):
                (torch.nn.functional.cross_entropy(model(xb), yb) / 3).backward()
                if i % 3 == 2:
                    opt.step()
                    opt.zero_grad()
                stop_at(epoch, i, signal.SIGINT)
except KeyboardInterrupt as exc:
    print("interrupted:", exc)
    sys.exit(0)
print("params", digest(model))
"""


def reference(tmp_path: Path, code: str) -> str:
    """The final parameters' digest of a run never stopped (in a store of its own)."""
    (tmp_path / "ref").mkdir()
    done = script(tmp_path / "ref", "train.py", code)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("params ")[1].strip()


@pytest.mark.parametrize("window, at, step, resumed_at", [
    # (gradients of batches 6 and 7 pending: the save waits for the step after batch 8)
    ("i % 3 == 2", (1, 7), 9, "(epoch 1, batch 9, step 9)"),
    # (a window across the epoch's end: batches 16, 17 and 0-3 of epoch 1 make a step)
    ("i % 4 == 3", (0, 16), 5, "(epoch 1, batch 4, step 5)"),
])
def test_an_interrupt_during_gradient_accumulation_saves_after_the_step_and_resumes_bit_exact(
        tmp_path: Path, window: str, at: tuple[int, int], step: int, resumed_at: str) -> None:
    """An interrupt after batch 7 saved before batch 8 with the gradients of batches 6 and
    7 in .grad, which no checkpoint holds: the resume in a new process went on without
    them, silently. The save now waits for the step, at the epoch's end too."""
    code = ACCUMULATE.replace("i % 3 == 2", window).replace("AT = (1, 7)", f"AT = {at}")
    (tmp_path / "stop").touch()
    stopped = script(tmp_path, "train.py", code)
    assert f"interrupted: the cell stopped at step {step}:" in stopped.stdout, stopped.stdout
    again = script(tmp_path, "train.py", code)
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stdout and resumed_at in again.stdout, again.stdout
    assert again.stdout.split("params ")[1].strip() == reference(tmp_path, code)


def linear_sgd() -> tuple[torch.nn.Module, dict[str, Any], list[torch.Tensor]]:
    """A seeded linear model, the notebook namespace of it and its SGD, and 12 batches."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}, \
        [torch.randn(2, 4) for _ in range(12)]


def test_gradients_zeroed_in_place_after_the_step_do_not_hold_a_save_back(
        tmp_path: Path, capsys) -> None:
    """zero_grad(set_to_none=False) writes every gradient after the step: zeros are no
    gradients to wait for, and the save due goes in at the next batch."""
    model, ns, data = linear_sgd()
    with ckpt_nb.auto(str(tmp_path / "s"), namespace=ns, every_steps=2, sync=True):
        for _ in ckpt_nb.epochs(1):
            for i, x in ckpt_nb.batches(data):
                model(x).sum().backward()
                if i % 3 == 2:
                    ns["opt"].step()
                    ns["opt"].zero_grad(set_to_none=False)
    assert "saving without" not in capsys.readouterr().out
    manager = ckpt_nb.CheckpointManager(tmp_path / "s")
    saved = manager.list()
    assert list(saved["step"]) == [2, 4] and saved["batch_idx"].iloc[0] == 6, saved


def test_a_loop_that_backpropagates_after_its_step_still_saves_and_says_so(
        tmp_path: Path, capsys) -> None:
    """With the step first in the loop body, every batch boundary holds the gradients of
    the batch before: waiting for a point without them would never save. A save waits
    one step, then goes in without them, and says so once."""
    model, ns, data = linear_sgd()
    with ckpt_nb.auto(str(tmp_path / "s"), namespace=ns, every_steps=3, sync=True):
        for _ in ckpt_nb.epochs(1):
            for i, x in ckpt_nb.batches(data):
                if i:
                    ns["opt"].step()
                    ns["opt"].zero_grad()
                model(x).sum().backward()
    out = capsys.readouterr().out
    assert out.count("saving without the gradients accumulated since the last optimizer "
                     "step: this loop backpropagates after its step") == 1, out
    steps = sorted(ckpt_nb.CheckpointManager(tmp_path / "s").list()["step"])
    assert steps == [4, 8, 11], steps  # (every 3 steps, a step late; and the cell's end)


UNFREEZE = HEAD + """
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
model[0].requires_grad_(False)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with ckpt_nb.auto("store", every_steps=5, sync=True):
    for epoch in ckpt_nb.epochs(2):
        for i, (xb, yb) in ckpt_nb.batches(loader):
            if (epoch, i) == (1, 2):
                model[0].requires_grad_(True)  # the backbone, trained from here on
                model[2].bias.requires_grad_(False)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            stop_at(epoch, i, signal.SIGKILL)
print("flags", [p.requires_grad for p in model.parameters()])
print("params", digest(model))
"""


def test_a_resume_puts_back_requires_grad_as_the_run_left_it(tmp_path: Path) -> None:
    """A backbone unfrozen in the loop came back frozen after a kill (no state_dict holds
    requires_grad): the resumed run trained on without it, silently."""
    script(tmp_path, "train.py", UNFREEZE, die=True)
    again = script(tmp_path, "train.py", UNFREEZE)
    assert again.returncode == 0, again.stderr
    assert "put back as saved: requires_grad = True (was False) for model's 0.weight, " \
        "0.bias, requires_grad = False (was True) for model's 2.bias" in again.stdout, \
        again.stdout
    assert "flags [True, True, True, False]" in again.stdout
    assert again.stdout.split("params ")[1].strip() == reference(tmp_path, UNFREEZE)


EVAL_MODE = HEAD + """
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                            torch.nn.Dropout(0.2), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with ckpt_nb.auto("store", every_steps=5, sync=True):
    for epoch in ckpt_nb.epochs(2):
        for i, (xb, yb) in ckpt_nb.batches(loader):
            if (epoch, i) == (1, 2):
                model[1].eval()  # its running statistics frozen from here on
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            stop_at(epoch, i, signal.SIGKILL)
print("modes", [m.training for m in model])
print("params", digest(model), model[1].running_mean.sum().item())
"""


def test_a_resume_puts_back_train_and_eval_modes_as_the_run_left_them(tmp_path: Path) -> None:
    """A BatchNorm put in eval mode in the loop trained again after a kill (no state_dict
    holds a module's mode): its running statistics and the weights came out otherwise."""
    script(tmp_path, "train.py", EVAL_MODE, die=True)
    again = script(tmp_path, "train.py", EVAL_MODE)
    assert again.returncode == 0, again.stderr
    assert "put back as saved: eval mode (was training) for model's 1" in again.stdout, \
        again.stdout
    assert "modes [True, False, True, True, True]" in again.stdout
    assert again.stdout.split("params ")[1].strip() == reference(tmp_path, EVAL_MODE)


# A parameter group added by the loop itself at epoch 1: a checkpoint saved after that
# holds two groups, and the optimizer made again holds one.
ADD_GROUP = HEAD + """
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
model[0].requires_grad_(False)
opt = torch.optim.Adam(model[2].parameters(), lr=0.01)
if os.environ.get("ROLLBACK"):
    ckpt_nb.rollback(os.environ["ROLLBACK"], directory="store", namespace=globals())
with ckpt_nb.auto("store", every_steps=5, sync=True):
    for epoch in ckpt_nb.epochs(2):
        if epoch == 1:
            model[0].requires_grad_(True)
            opt.add_param_group({"params": list(model[0].parameters()), "lr": 0.001})
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            stop_at(epoch, i, signal.SIGKILL)
print("params", digest(model))
"""


def test_a_checkpoint_that_no_longer_fits_is_refused_naming_the_ways_on(
        tmp_path: Path, monkeypatch) -> None:
    """The run again died on load_all's bare StateMismatchError, every time, naming
    neither the checkpoint nor a way on; the rollback it names resumes the run."""
    script(tmp_path, "train.py", ADD_GROUP, die=True)
    again = script(tmp_path, "train.py", ADD_GROUP)
    assert again.returncode == 1, again.stdout
    error = again.stderr[again.stderr.index("StateMismatchError: "):]
    manager = ckpt_nb.CheckpointManager(tmp_path / "store")
    rows = manager.list()
    newest = rows.iloc[-1]
    assert error.startswith(f"StateMismatchError: not resuming checkpoint {newest['id']} "
                            f"(step {newest['step']}): checkpoint does not fit; nothing was "
                            "changed:\n  opt: 2 parameter groups in the checkpoint, 1 live "
                            "(where the training loop adds them, add them before it runs "
                            "again, and guard its add so that it does not add them twice: if "
                            "len(opt.param_groups) < 2: opt.add_param_group(...))\n"
                            "the tracked objects are not as they were"), error
    assert "run with --no-resume (auto(resume=False)) not to resume it, or %ckpt_rollback " \
        "ID (ckpt_nb.rollback(ID)) to an earlier checkpoint of the run that fits them" in error
    # The way on that keeps the run: an epoch 0 checkpoint, rolled back to, resumes.
    monkeypatch.setenv("ROLLBACK", rows[rows["epoch"] == 0].iloc[-1]["id"])
    rolled = script(tmp_path, "train.py", ADD_GROUP)
    assert rolled.returncode == 0 and "resumed from" in rolled.stdout, rolled.stderr
    monkeypatch.delenv("ROLLBACK")
    assert rolled.stdout.split("params ")[1].strip() == reference(tmp_path, ADD_GROUP)


ERROR_IN_WINDOW = ACCUMULATE.replace("every_steps=4", "every_steps=100").replace(
    "                stop_at(epoch, i, signal.SIGINT)\n",
    "                if (epoch, i) == AT and os.path.exists('stop'):\n"
    "                    os.remove('stop'); raise RuntimeError('out of memory (simulated)')\n"
).replace("except KeyboardInterrupt as exc:", "except RuntimeError as exc:")


def test_an_error_during_gradient_accumulation_saves_nothing_and_the_rerun_is_exact(
        tmp_path: Path) -> None:
    """An error after batch 7's backward saved the consistent point before it, where the
    gradients of batches 6 and 7 were accumulating: the rerun resumed there without them,
    and trained to other parameters, silently. It now says why it does not save."""
    (tmp_path / "stop").touch()
    stopped = script(tmp_path, "train.py", ERROR_IN_WINDOW)
    assert "not saving after RuntimeError: the gradients changed since the last optimizer " \
        "step" in stopped.stdout, stopped.stdout
    again = script(tmp_path, "train.py", ERROR_IN_WINDOW)
    assert again.returncode == 0, again.stderr
    assert again.stdout.split("params ")[1].strip() == reference(tmp_path, ERROR_IN_WINDOW)


def test_an_error_before_the_backward_pass_still_saves_where_it_stood(tmp_path: Path) -> None:
    """A loop that zeroes its gradients first has none changed since the step where its
    forward pass fails (out of memory): that error's save is made, and resumes exactly."""
    code = ERROR_IN_WINDOW.replace(
        "                (torch.nn.functional.cross_entropy(model(xb), yb) / 3).backward()\n"
        "                if i % 3 == 2:\n                    opt.step()\n"
        "                    opt.zero_grad()\n",
        "                opt.zero_grad()\n"
        "                if (epoch, i) == AT and os.path.exists('stop'):\n"
        "                    os.remove('stop'); raise RuntimeError('out of memory (simulated)')\n"
        "                torch.nn.functional.cross_entropy(model(xb), yb).backward()\n"
        "                opt.step()\n")
    assert "opt.zero_grad()\n                if (epoch, i)" in code
    (tmp_path / "stop").touch()
    stopped = script(tmp_path, "train.py", code)
    assert "not saving" not in stopped.stdout, stopped.stdout
    saved = ckpt_nb.CheckpointManager(tmp_path / "store").list()
    assert "RuntimeError in the cell" in saved["note"].iloc[-1], saved
    again = script(tmp_path, "train.py", code)
    assert "resumed from" in again.stdout and "(epoch 1, batch 7," in again.stdout, again.stdout
    assert again.stdout.split("params ")[1].strip() == reference(tmp_path, code)
