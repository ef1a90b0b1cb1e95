"""What the user's code changed between a save and its resume, in a real in-process IPython
shell on scikit-learn's digits: a resume that would go on silently wrong is refused,
naming what differs and the ways on, with nothing loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from digits_code import LOAD_DIGITS
from test_magics import final_state, run, same

SETUP = LOAD_DIGITS + """
import os, signal, torch, ckpt_nb
torch.manual_seed(0)
X, Y = (torch.tensor(a) for a in load_digits(return_X_y=True))
X = X.float() / 16.0
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=90,
                                     shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

def stop_at(epoch, i):
    if (epoch, i) == stop_at.where:  # (an attribute: no variable the cell captures)
        os.kill(os.getpid(), signal.SIGINT)
stop_at.where = None
"""

TRAIN = """%%ckpt_auto --dir {dir} --every-steps 50
for epoch in ckpt_nb.epochs(2):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        stop_at(epoch, i)
"""

BATCHES_45 = ("loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), "
              "batch_size=45, shuffle=True)")


@pytest.mark.parametrize("where", ["epochs", "batches"])
def test_a_loader_cut_otherwise_is_not_resumed_mid_epoch(shell: InteractiveShell,
                                                         tmp_path: Path, capsys,
                                                         where: str) -> None:
    """The loader made again with another batch_size after a stop mid-epoch: the resume
    skipped as many of the new, smaller batches as the run had done of the old, training
    the epoch's first samples again (or leaving some out) without a word. It is refused,
    naming the batch size, no batch trained (outside epochs() nothing loaded; in it the
    objects as the checkpoint holds them, put back before the epoch's code made the
    loader); with the loader as it was, it resumes."""
    cell = TRAIN if where == "epochs" else \
        TRAIN.replace("for epoch in ckpt_nb.epochs(2):\n    ", "epoch = 0\nif True:\n    ")
    run(shell, SETUP)
    assert run(shell, cell.format(dir=tmp_path / "reference")).success
    unstopped = final_state(shell)
    run(shell, SETUP)
    shell.user_ns["stop_at"].where = (0 if where == "batches" else 1, 4)
    assert not run(shell, cell.format(dir=tmp_path / "s")).success  # (interrupted, saved)
    stopped = final_state(shell)
    shell.user_ns["stop_at"].where = None
    run(shell, BATCHES_45)
    with torch.no_grad():
        for p in shell.user_ns["model"].parameters():
            p.add_(1.0)  # (changed since the stop: a refused resume puts nothing back)
    changed = final_state(shell)
    capsys.readouterr()
    result = run(shell, cell.format(dir=tmp_path / "s"))
    out = capsys.readouterr()
    text = out.out + out.err + str(result.error_in_exec)
    assert not result.success and "StateMismatchError" in type(result.error_in_exec).__name__
    assert "batch_size 45 (was 90)" in text and "--no-resume" in text, text
    if where == "epochs":  # (put back as epochs() began, before the loader was at hand)
        assert "the tracked objects are as" in text and "no batch was trained" in text
        assert same(final_state(shell), stopped)
    else:
        assert "nothing was loaded" in text
        assert same(final_state(shell), changed), "a refused resume loaded something"
    assert not same(changed, stopped)
    run(shell, "loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), "
               "batch_size=90, shuffle=True)")
    capsys.readouterr()
    assert run(shell, cell.format(dir=tmp_path / "s")).success
    assert "resumed from" in capsys.readouterr().out
    assert same(final_state(shell), unstopped)  # (the refused try left no trace)


def test_an_lr_set_ahead_of_the_loop_is_named_as_the_resume_puts_it_back(
        shell: InteractiveShell, tmp_path: Path, capsys) -> None:
    """The cell edited after a stop to set the optimizer's lr ahead of its loop: the resume
    put the saved lr back over it (as the README says) without a word, where it names the
    variables it puts back. The line names it now, and how to train on with it; a resume
    onto an optimizer made anew as before names nothing."""
    run(shell, SETUP)
    shell.user_ns["stop_at"].where = (0, 4)
    assert not run(shell, TRAIN.format(dir=tmp_path / "s"), cell_id="train").success
    shell.user_ns["stop_at"].where = None
    # (its cell id, as JupyterLab sends it, tells the edited cell as the same)
    edited = TRAIN.replace("for epoch", "for group in opt.param_groups:\n    group['lr'] = "
                           "0.01\nfor epoch", 1)
    capsys.readouterr()
    assert run(shell, edited.format(dir=tmp_path / "s"), cell_id="train").success
    out = capsys.readouterr().out
    assert "put back as saved: opt's lr = 0.05 (was 0.01);" in out and "--no-resume" in out, out
    assert shell.user_ns["opt"].param_groups[0]["lr"] == 0.05

    run(shell, SETUP)  # (a new model and optimizer, as a new kernel's: nothing edited)
    shell.user_ns["stop_at"].where = (0, 4)
    assert not run(shell, TRAIN.format(dir=tmp_path / "t")).success
    shell.user_ns["stop_at"].where = None
    run(shell, SETUP.split("\ndef stop_at")[0])
    capsys.readouterr()
    assert run(shell, TRAIN.format(dir=tmp_path / "t")).success
    out = capsys.readouterr().out
    assert "resumed from" in out and "lr =" not in out, out


def _digits_model(classes: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, classes))


def test_a_backbone_under_a_new_head_is_told_how_to_load(tmp_path: Path) -> None:
    """Transfer learning: run A's 10-class model restored into run B's with a 5-class head.
    The refusal named the shapes only, with strict=False refused alike; it now gives the
    load that takes the backbone, which works, and a layer added is told strict=False."""
    from ckpt_nb import CheckpointManager, StateMismatchError

    torch.manual_seed(0)
    trained = _digits_model(10)
    with CheckpointManager(tmp_path / "a") as mgr:
        cid = mgr.save(model=trained, epoch=0)
        new = _digits_model(5)
        before = [t.clone() for t in new.state_dict().values()]
        for strict in (True, False):
            with pytest.raises(StateMismatchError) as refused:
                mgr.restore(cid, model=new, strict=strict)
            assert "state = mgr.load(" in str(refused.value) and \
                "['2.weight', '2.bias']" in str(refused.value), refused.value
        assert same(list(new.state_dict().values()), before)
        state = mgr.load(cid).state["model"]
        new.load_state_dict({k: v for k, v in state.items()
                             if k not in ['2.weight', '2.bias']}, strict=False)
        assert torch.equal(new[0].weight, trained[0].weight)

        deeper = torch.nn.Sequential(*_digits_model(10), torch.nn.ReLU(), torch.nn.Linear(10, 5))
        with pytest.raises(StateMismatchError, match=r"missing keys(.|\n)*strict=False\) loads"):
            mgr.restore(cid, model=deeper)
        assert mgr.restore(cid, model=deeper, strict=False).missing_keys == {
            "model": ["4.weight", "4.bias"]}
        adapted = _digits_model(10)  # (a LoRA-style adapter around its first layer)
        adapted[0] = torch.nn.ModuleDict({"base": adapted[0]})
        with pytest.raises(StateMismatchError, match=r"0\.weight now 0\.base\.weight"):
            mgr.restore(cid, model=adapted)


def test_strict_false_that_takes_nothing_warns(tmp_path: Path) -> None:
    """The layers renamed since the save (fc1 where 0 was): restore(strict=False) loaded
    nothing, said only by the Checkpoint's missing_keys, and training went on from random
    weights. It warns now, naming both sides' keys."""
    from ckpt_nb import CheckpointManager

    class Named(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.act, self.fc2 = (torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                            torch.nn.Linear(32, 10))

    with CheckpointManager(tmp_path / "a") as mgr:
        cid = mgr.save(model=_digits_model(10), epoch=0)
        with pytest.warns(RuntimeWarning, match=r"put none of its keys into model(.|\n)*fc1"):
            mgr.restore(cid, model=Named(), strict=False)


def test_a_rollback_into_a_resized_head_says_the_way_on(shell: InteractiveShell, tmp_path: Path,
                                                        capsys) -> None:
    """The model made again with a 5-class head, then %ckpt_rollback to a checkpoint of the
    10-class one: the refusal named the shapes and said only to look in another store. It
    says now that the objects changed since, and how to take the part that fits."""
    run(shell, SETUP)
    assert run(shell, TRAIN.format(dir=tmp_path / "s")).success
    run(shell, "model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), "
               "torch.nn.Linear(32, 5))\nopt = torch.optim.SGD(model.parameters(), lr=0.05)")
    capsys.readouterr()
    result = run(shell, "%ckpt_rollback latest")
    text = str(result.error_in_exec)
    assert "(32, 5)" not in text and "(5, 32) float32 in the live object" in text, text
    assert "build them as they were" in text and ".load(" in text, text


def test_epochs_lowered_below_the_stop_says_nothing_is_left(shell: InteractiveShell,
                                                            tmp_path: Path, capsys) -> None:
    """epochs(2) edited to epochs(1) after a stop in epoch 1: the resume said it resumed
    in epoch 1 and trained nothing, the run ending without a word. It says so now."""
    run(shell, SETUP)
    shell.user_ns["stop_at"].where = (1, 4)
    assert not run(shell, TRAIN.format(dir=tmp_path / "s"), cell_id="train").success
    shell.user_ns["stop_at"].where = None
    stopped = final_state(shell)
    capsys.readouterr()
    assert run(shell, TRAIN.replace("epochs(2)", "epochs(1)").format(dir=tmp_path / "s"),
               cell_id="train").success
    out = capsys.readouterr().out
    assert "past the end of epochs(1)" in out and "nothing is left to train" in out, out
    assert same(final_state(shell), stopped)


def test_a_loader_the_epochs_code_makes_by_epoch_resumes(shell: InteractiveShell,
                                                         tmp_path: Path, capsys) -> None:
    """A curriculum: the epoch's code makes its loader over more samples each epoch. The
    set-up cell's loader (run again, as in a new kernel) cuts the epoch otherwise than the
    one the stopped epoch made; the resume compares the one batches() is given, after
    the epoch's code made it again, and goes on."""
    cell = TRAIN.replace(
        "for epoch in ckpt_nb.epochs(2):\n", "for epoch in ckpt_nb.epochs(2):\n    loader = "
        "torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X[:900 + 450 * epoch], "
        "Y[:900 + 450 * epoch]), batch_size=90, shuffle=True)\n")
    run(shell, SETUP)
    shell.user_ns["stop_at"].where = (1, 4)
    assert not run(shell, cell.format(dir=tmp_path / "s")).success
    run(shell, SETUP)
    capsys.readouterr()
    result = run(shell, cell.format(dir=tmp_path / "s"))
    assert result.success, result.error_in_exec
    assert "resumed from" in capsys.readouterr().out


@pytest.mark.parametrize("scheduler", ["OneCycleLR(opt, max_lr=0.05, total_steps=60)",
                                       "ReduceLROnPlateau(opt, patience=0, factor=0.5)"])
def test_what_a_scheduler_moved_is_not_named_as_edited(shell: InteractiveShell,
                                                       tmp_path: Path, capsys,
                                                       scheduler: str) -> None:
    """A new kernel, nothing edited: the resume named the betas a OneCycleLR had cycled
    (the new one set them to its max_momentum), or the lr a ReduceLROnPlateau had lowered,
    as put back otherwise than set, and told --no-resume to train on with them. The
    scheduler's own settings are compared instead: an edited max_lr is named."""
    setup = SETUP.replace("opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)",
                          "opt = torch.optim.Adam(model.parameters(), lr=0.01)\n"
                          f"sched = torch.optim.lr_scheduler.{scheduler}")
    plateau = scheduler.startswith("Reduce")
    cell = TRAIN.replace("    for i, (xb", "    sched.step(1.0)\n    for i, (xb") if plateau \
        else TRAIN.replace("        stop_at(", "        sched.step()\n        stop_at(")
    run(shell, setup)
    shell.user_ns["stop_at"].where = (1, 4)
    assert not run(shell, cell.format(dir=tmp_path / "s")).success
    run(shell, setup)  # (a new model, optimizer and scheduler, as a new kernel's)
    capsys.readouterr()
    assert run(shell, cell.format(dir=tmp_path / "s")).success
    out = capsys.readouterr().out
    assert "resumed from" in out and "put back as saved:" not in out, out
    if plateau:
        return
    run(shell, setup)
    shell.user_ns["stop_at"].where = (1, 4)
    assert not run(shell, cell.format(dir=tmp_path / "t")).success
    run(shell, setup.replace("max_lr=0.05", "max_lr=0.02"))
    capsys.readouterr()
    assert run(shell, cell.format(dir=tmp_path / "t")).success
    out = capsys.readouterr().out
    assert "opt's max_lr = 0.05 (was 0.02)" in out and "betas" not in out, out


def test_a_recut_loader_refused_in_an_epoch_leaves_the_objects_as_saved(
        shell: InteractiveShell, tmp_path: Path, capsys) -> None:
    """The refusal in epochs() said the tracked objects were as the checkpoint holds
    them, but came before what the epoch's code ahead of its loop changed as it ran again
    was put back: its lr, halved each epoch there, was halved once more."""
    cell = TRAIN.replace("    for i, (xb", "    for group in opt.param_groups:\n"
                         "        group['lr'] *= 0.5\n    for i, (xb")
    run(shell, SETUP)
    shell.user_ns["stop_at"].where = (1, 4)
    assert not run(shell, cell.format(dir=tmp_path / "s")).success
    stopped = final_state(shell)
    shell.user_ns["stop_at"].where = None
    run(shell, BATCHES_45)
    capsys.readouterr()
    result = run(shell, cell.format(dir=tmp_path / "s"))
    assert "the tracked objects are as" in str(result.error_in_exec), result.error_in_exec
    assert same(final_state(shell), stopped)
    assert shell.user_ns["opt"].param_groups[0]["lr"] == 0.0125


def test_a_loader_made_again_with_drop_last_alone_resumes(shell: InteractiveShell,
                                                          tmp_path: Path, capsys) -> None:
    """drop_last=True where the stop's loader had none: the epoch's last, short batch
    left out, the batches done the very same samples. The resume was refused as though
    they were other ones; it goes on now, and a data set of another size is refused."""
    run(shell, SETUP)
    shell.user_ns["stop_at"].where = (1, 4)
    assert not run(shell, TRAIN.format(dir=tmp_path / "s")).success
    shell.user_ns["stop_at"].where = None
    run(shell, BATCHES_45.replace("(X, Y), batch_size=45", "(X[:900], Y[:900]), batch_size=90"))
    result = run(shell, TRAIN.format(dir=tmp_path / "s"))
    assert "samples an epoch 900 (was 1797)" in str(result.error_in_exec), result.error_in_exec
    run(shell, BATCHES_45.replace("batch_size=45", "batch_size=90, drop_last=True"))
    capsys.readouterr()
    result = run(shell, TRAIN.format(dir=tmp_path / "s"))
    assert result.success, result.error_in_exec
    assert "resumed from" in capsys.readouterr().out


def test_a_scheduler_made_in_the_cell_is_no_edit_in_the_same_kernel(
        shell: InteractiveShell, tmp_path: Path, capsys) -> None:
    """The cell makes its OneCycleLR ahead of the loop: run again after the stop, it set
    the optimizer's lr and momentum to its start, which the resume named as edited. An
    lr the edited cell sets under a set-up cell's StepLR is still named."""
    made_here = TRAIN.replace(
        "for epoch", "sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, "
        "total_steps=60)\nfor epoch").replace("        stop_at(", "        sched.step()\n"
                                              "        stop_at(")
    stepped = TRAIN.replace("    stop_at(epoch, i)\n", "    stop_at(epoch, i)\n    sched.step()\n")
    for setup, cell, edited, named in (
            (SETUP, made_here, made_here, None),
            (SETUP + "sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)\n", stepped,
             stepped.replace("for epoch", "for group in opt.param_groups:\n    group['lr'] = "
                             "0.001\nfor epoch", 1), "opt's lr = 0.025 (was 0.001)")):
        run(shell, setup)
        shell.user_ns["stop_at"].where = (1, 4)
        assert not run(shell, cell.format(dir=tmp_path / "s"), cell_id="train").success
        shell.user_ns["stop_at"].where = None
        capsys.readouterr()
        assert run(shell, edited.format(dir=tmp_path / "s"), cell_id="train").success
        out = capsys.readouterr().out
        assert (named in out) if named else "put back as saved:" not in out, out


def test_a_zipped_loader_cut_otherwise_is_not_resumed_mid_epoch(shell: InteractiveShell,
                                                                tmp_path: Path) -> None:
    """batches(zip(loader, loader2)), one made again with another batch_size: a zip() has
    no len and is no DataLoader, so the check saw nothing and the resume skipped the done
    batches in the new size without a word. Each zipped loader's is compared."""
    cell = TRAIN.replace("ckpt_nb.batches(loader)", "ckpt_nb.batches(zip(loader, loader2))") \
        .replace("(xb, yb)", "((xb, yb), _)")
    run(shell, SETUP + "loader2 = torch.utils.data.DataLoader(torch.utils.data.TensorDataset("
                       "X, Y), batch_size=90, shuffle=True)\n")
    shell.user_ns["stop_at"].where = (1, 4)
    assert not run(shell, cell.format(dir=tmp_path / "s")).success
    shell.user_ns["stop_at"].where = None
    run(shell, BATCHES_45)
    result = run(shell, cell.format(dir=tmp_path / "s"))
    assert "zip() given to batches(), which now has batch_size [45, 90] (was [90, 90])" in \
        str(result.error_in_exec), result.error_in_exec
    run(shell, BATCHES_45.replace("batch_size=45", "batch_size=90"))
    result = run(shell, cell.format(dir=tmp_path / "s"))
    assert result.success, result.error_in_exec



CURRICULUM = """
class Curriculum(torch.utils.data.Sampler):
    \"\"\"More of the data each epoch: its epoch advances as an epoch's iterator is made.\"\"\"
    def __init__(self):
        self.epoch, self.g = 0, torch.Generator().manual_seed(1)
    def __len__(self):
        return min(900 + 450 * self.epoch, len(X))
    def __iter__(self):
        n, self.epoch = len(self), self.epoch + 1
        yield from torch.randperm(n, generator=self.g).tolist()
    def state_dict(self):
        return {"epoch": self.epoch, "g": self.g.get_state()}
    def load_state_dict(self, state):
        self.epoch = state["epoch"]
        self.g.set_state(state["g"])
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=90,
                                     sampler=Curriculum())
"""


@pytest.mark.parametrize("new_kernel", [False, True])
def test_a_sampler_whose_length_follows_its_state_resumes(shell: InteractiveShell,
                                                          tmp_path: Path,
                                                          new_kernel: bool) -> None:
    """A curriculum sampler, its length growing as each epoch's iterator is made: the
    check measured it before its state as the epoch began was put back (one epoch on, or
    a new kernel's at 0) and refused a resume that went on bit-exact before it. Lengths
    that follow a loader's state are not compared; the resume is exact."""
    run(shell, SETUP + CURRICULUM)
    assert run(shell, TRAIN.format(dir=tmp_path / "reference")).success
    unstopped = final_state(shell)
    run(shell, SETUP + CURRICULUM)
    shell.user_ns["stop_at"].where = (1, 4)
    assert not run(shell, TRAIN.format(dir=tmp_path / "s")).success
    shell.user_ns["stop_at"].where = None
    if new_kernel:
        run(shell, SETUP + CURRICULUM)
    result = run(shell, TRAIN.format(dir=tmp_path / "s"))
    assert result.success, result.error_in_exec
    assert same(final_state(shell), unstopped)



def test_a_hyper_parameter_equal_in_value_is_no_edit() -> None:
    """lr=1 saved, the cell setting 1.0 (or a tensor lr, its float): the comparison that
    takes them for equal was shadowed by a later function of the same name, which tells
    types apart, so the resume named them as put back otherwise than set."""
    from ckpt_nb._session import _changed_hyperparameters

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1, momentum=0.5)
    saved = {"opt": opt.state_dict()}
    opt.param_groups[0]["lr"] = 1.0
    assert _changed_hyperparameters({"opt": opt}, saved, ["opt"]) == []
    opt.param_groups[0]["lr"] = 0.5
    assert _changed_hyperparameters({"opt": opt}, saved, ["opt"]) == ["opt's lr = 1 (was 0.5)"]
