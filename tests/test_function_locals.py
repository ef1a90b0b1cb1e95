"""``auto(namespace=locals())`` in a function, as the README says to write it there: Python
neither keeps the dict ``locals()`` gave up to date nor reads it back, so every save held
the function's plain variables as they were when it was called (a counter at 0, a best
at inf), and a resume's "put back as saved" went into that dict, not the function: a
list of losses came back empty. They are read from the function at each save and written
back into it now. Scripts in a fresh interpreter, killed (SIGKILL) mid-run and run
again."""

from __future__ import annotations

from pathlib import Path

import ckpt_nb
from ckpt_nb._format import RUN_KEY
from test_session_jobs import script, unstopped_and_resumed

IN_MAIN = """
import os, signal, torch, ckpt_nb

def main():
    torch.manual_seed(0)
    X = torch.randn(60, 8); Y = (X.sum(1) > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=10,
                                         shuffle=True)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen, best, losses = 0, float("inf"), []
    with ckpt_nb.auto("store", every_steps=4, sync=True, namespace=locals()):
        for epoch in ckpt_nb.epochs(3):
            for i, (xb, yb) in ckpt_nb.batches(loader):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                seen += len(xb)
                if (epoch, i) == (2, 1) and os.environ["DIE"]:
                    os.kill(os.getpid(), signal.SIGKILL)
            val = torch.nn.functional.cross_entropy(model(X), Y).item()
            best = min(best, val)
            losses.append(round(val, 6))
    print("end", seen, best, losses, model.weight.sum().item())

main()
"""


def test_a_functions_locals_are_saved_as_they_stand_and_put_back(tmp_path: Path) -> None:
    unstopped, resumed = unstopped_and_resumed(tmp_path, IN_MAIN)
    assert "resumed from" in resumed.stdout, resumed.stdout
    assert "no checkpoint holds a function's locals" not in resumed.stdout, resumed.stdout
    end = unstopped.stdout.splitlines()[-1]
    assert end.startswith("end 180 ") and resumed.stdout.splitlines()[-1] == end
    saved = ckpt_nb.CheckpointManager(tmp_path / "ref" / "store").load("latest")
    assert saved.extra[RUN_KEY]["variables"]["seen"] == 180


def test_a_copy_of_the_functions_locals_puts_them_back_too(tmp_path: Path) -> None:
    """``namespace=dict(locals())`` (what ``locals()`` gives from 3.13 on: a copy): the
    saves read the function, but before 3.13 a resume wrote the frame's own dict, not the
    copy the values were put back into, and said "seen = 120 (was 0)" of a run that went on
    from 0 (it ended at 60 seen, not 180)."""
    code = IN_MAIN.replace("namespace=locals()", "namespace=dict(locals())")
    unstopped, resumed = unstopped_and_resumed(tmp_path, code)
    assert "put back as saved: seen = 120 (was 0)" in resumed.stdout, resumed.stdout
    assert resumed.stdout.splitlines()[-1] == unstopped.stdout.splitlines()[-1]


WRAPPER = """
import contextlib

@contextlib.contextmanager
def tracked(namespace):
    with ckpt_nb.auto("store", every_steps=4, sync=True, namespace=namespace) as session:
        yield session
"""


def test_locals_passed_through_a_context_manager_of_the_users_are_the_functions(
        tmp_path: Path) -> None:
    """``with tracked(locals()):``, the project's defaults around ``auto()``: the function
    was looked for as auto()'s caller alone, the wrapper, so every save held seen at 0 and
    a resume went on from 0 (it ended at 60 seen, not 180), saying nothing."""
    code = IN_MAIN.replace("def main():", WRAPPER + "\ndef main():").replace(
        'ckpt_nb.auto("store", every_steps=4, sync=True, namespace=locals())',
        "tracked(locals())")
    unstopped, resumed = unstopped_and_resumed(tmp_path, code)
    assert "seen = 120 (was 0)" in resumed.stdout, resumed.stdout
    # (the start line read the wrapper's code, where no batches() takes the loader)
    assert "wrap it in ckpt_nb.batches()" not in unstopped.stdout, unstopped.stdout
    assert resumed.stdout.splitlines()[-1] == unstopped.stdout.splitlines()[-1]


ROLLBACK_IN_MAIN = """
import torch, ckpt_nb

def main():
    torch.manual_seed(0)
    X = torch.randn(40, 8); Y = (X.sum(1) > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=10)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = 0
    with ckpt_nb.auto("store", every_steps=4, sync=True, namespace=locals()):
        for epoch in ckpt_nb.epochs(2):
            for i, (xb, yb) in ckpt_nb.batches(loader):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                seen += len(xb)
    ckpt_nb.rollback("-1", namespace=locals())
    print("seen", seen)

main()
"""


def test_a_rollback_in_a_function_puts_its_locals_back(tmp_path: Path) -> None:
    """It said "restored ... seen" and left the function's seen at 80."""
    done = script(tmp_path, "train.py", ROLLBACK_IN_MAIN)
    assert done.returncode == 0, done.stderr
    assert "restored model, opt, X, Y, seen" in done.stdout, done.stdout
    assert done.stdout.splitlines()[-1] == "seen 40", done.stdout
