"""An object the loop makes (a best-model copy, ``best_model = copy.deepcopy(model)`` on
an improvement, where ``best_model = None`` came before) is tracked by the saves after
it, but a resume in a new process begins where the loop does, before it exists, and
refuses those checkpoints: a run killed then could not go on. The first save that holds
it says so, and how to make it resumable. Scripts in a fresh interpreter."""

from __future__ import annotations

from pathlib import Path

from test_session_jobs import script  # (a script file run in a fresh interpreter)

BEST_COPY = """
import copy, torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(60, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=10)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
best_model, best = {ahead}, float("inf")
with ckpt_nb.auto("store", every_steps=4, sync=True):
    for epoch in ckpt_nb.epochs(3):
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        val = torch.nn.functional.cross_entropy(model(X), Y).item()
        if val < best:
            best, best_model = val, copy.deepcopy(model)
"""

SAID = "best_model (Linear), made in the cell's loop, is in its checkpoints from this one on"


def test_a_best_model_copy_made_in_the_loop_is_said_once(tmp_path: Path) -> None:
    done = script(tmp_path, "train.py", BEST_COPY.format(ahead="None"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(SAID) == 1, done.stdout
    assert "`best_model = copy.deepcopy(model)`" in done.stdout


def test_one_made_ahead_of_the_loop_is_not(tmp_path: Path) -> None:
    done = script(tmp_path, "train.py", BEST_COPY.format(ahead="copy.deepcopy(model)"))
    assert done.returncode == 0, done.stderr
    assert "made in the cell's loop" not in done.stdout, done.stdout


KILLED = BEST_COPY.replace("            opt.step()\n", """            opt.step()
            if os.environ["DIE"] and epoch == 1 and i == 3:
                os.kill(os.getpid(), signal.SIGKILL)
""").replace("import copy,", "import copy, os, signal,")


def test_the_refusal_to_resume_says_what_the_name_holds_now(tmp_path: Path) -> None:
    """Killed after a save holding the loop's copy, the run again in a new process was
    refused with "define them ahead of the cell's loops", though best_model was defined
    (as None): the refusal says what it is now and what to make it."""
    script(tmp_path, "train.py", KILLED.format(ahead="None"), die=True)
    refused = script(tmp_path, "train.py", KILLED.format(ahead="None"))
    assert "StateMismatchError" in refused.stderr, refused.stderr
    assert "best_model is None here, where the checkpoint holds a Linear" in refused.stderr
    assert "make best_model a Linear ahead of the cell's loops" in refused.stderr
    assert "(`best_model = copy.deepcopy(model)` in place of `best_model = None`)" \
        in refused.stderr
    assert "define them ahead" not in refused.stderr, refused.stderr


LATER_LOOP = """
import torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(60, 8); Y = (X.sum(1) > 0).long()
data = torch.utils.data.TensorDataset(X, Y)
loader = torch.utils.data.DataLoader(data, batch_size=10)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with ckpt_nb.auto("store", every_steps=4, sync=True):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    head = torch.nn.Linear(2, 2)
    opt2 = torch.optim.SGD(head.parameters(), lr=0.1)
    for i, (xb, yb) in ckpt_nb.batches(torch.utils.data.DataLoader(data, batch_size=5)):
        opt2.zero_grad()
        torch.nn.functional.cross_entropy(head(model(xb)), yb).backward()
        opt2.step()
"""


def test_one_made_for_a_later_loop_is_not_said_to_be_refused(tmp_path: Path) -> None:
    """A head made between a cell's loops was said to be made in its loop and refused by a
    resume, with `head = copy.deepcopy(model)` to do; a resume takes that run from its
    newest checkpoint saved before the later loop began, which does not hold it."""
    done = script(tmp_path, "train.py", LATER_LOOP)
    assert done.returncode == 0, done.stderr
    assert "a saved position does not say which loop" in done.stdout, done.stdout
    assert "made in the cell's loop" not in done.stdout, done.stdout


def test_an_ema_made_in_the_loop_is_not_told_to_be_a_copy_of_the_model(tmp_path: Path) -> None:
    """The way on named `ema = copy.deepcopy(model)` for every module, an EMA's
    AveragedModel too, which is made ahead as it is, not copied."""
    done = script(tmp_path, "train.py", BEST_COPY.replace(
        "best, best_model = val, copy.deepcopy(model)",
        "best, ema = val, torch.optim.swa_utils.AveragedModel(model)").format(ahead="None"))
    assert done.returncode == 0, done.stderr
    assert "ema (AveragedModel), made in the cell's loop, is in its" in done.stdout
    assert "copy.deepcopy" not in done.stdout, done.stdout


def test_the_example_copies_the_notebooks_own_model_by_its_name(tmp_path: Path) -> None:
    """Where the model is ``net``, the first save's words and the refusal's example were
    `best_net = copy.deepcopy(model)`, a name the notebook does not have."""
    killed = KILLED.replace("model", "net").format(ahead="None")
    told = script(tmp_path, "train.py", killed, die=True)
    assert "(`best_net = copy.deepcopy(net)`; or keep `copy.deepcopy(net.state_dict())`" \
        in told.stdout, told.stdout
    refused = script(tmp_path, "train.py", killed)
    assert "(`best_net = copy.deepcopy(net)` in place of `best_net = None`)" \
        in refused.stderr, refused.stderr


def test_the_refusal_words_an_averaged_model_with_its_article(tmp_path: Path) -> None:
    """"where the checkpoint holds a AveragedModel"; and an EMA is no copy to make."""
    killed = KILLED.replace("best, best_model = val, copy.deepcopy(model)",
                            "best, best_model = val, torch.optim.swa_utils.AveragedModel(model)")
    script(tmp_path, "train.py", killed.format(ahead="None"), die=True)
    refused = script(tmp_path, "train.py", killed.format(ahead="None"))
    assert "best_model is None here, where the checkpoint holds an AveragedModel" \
        in refused.stderr, refused.stderr
    assert "make best_model an AveragedModel ahead of the cell's loops" in refused.stderr
    assert "copy.deepcopy" not in refused.stderr, refused.stderr
