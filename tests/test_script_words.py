"""What ``ckpt_nb.auto()`` says in a script (no IPython) of a run it does not resume: in
a script's words, where it told a script to run a set-up cell and %ckpt_rollback, and
called the block "another cell"."""

from __future__ import annotations

import sys
from pathlib import Path

import warm_python  # (fresh interpreters forked from a warm one)
from test_cli import module_env

# A block stopped by an error mid-run, then the same block reached through other calls
# (as a script run again through runpy is): other code, whose run it does not resume.
STOPPED_THEN_CALLED_ELSEWHERE = """
import ckpt_nb, torch
torch.manual_seed(0)
model = torch.nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(3)]

def train(stop):
    with ckpt_nb.auto("runs", every_steps=2, namespace={"model": model, "opt": opt}):
        for epoch in ckpt_nb.epochs(3):
            for i, (x, t) in ckpt_nb.batches(data):
                opt.zero_grad(); ((model(x) - t) ** 2).mean().backward(); opt.step()
                if stop and epoch == 1:
                    raise RuntimeError("stopped")

try:
    train(True)
except RuntimeError:
    pass

def elsewhere():
    train(False)

elsewhere()
"""


def test_a_run_not_resumed_in_a_script_is_told_in_a_script_s_words(tmp_path: Path) -> None:
    done = warm_python.run([sys.executable, "-c", STOPPED_THEN_CALLED_ELSEWHERE], cwd=tmp_path,
                           env=module_env(), timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "holds an unfinished run of other code (another block, or this one edited or " \
           "reached through other calls): not resuming it here; to resume it, call " \
           "`ckpt_nb.rollback(" in said
    assert "model is as a run that stopped at step 4 left it, trained past checkpoint " in said
    assert "this block trains on from there, not from a clean start; make it anew before it " \
           "for one (or `ckpt_nb.rollback(" in said
    assert "cell" not in said and "%ckpt_rollback" not in said
