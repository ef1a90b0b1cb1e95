"""A tracked object whose state holds values the store keeps as pickles (an Enum, a
deque): a notebook's resume and rollback refuse to load it, as ``restore()`` does, unless
the user trusts the store (``--trust-pickle``); nothing is loaded before the refusal."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch

import ckpt_nb
from test_magics import run  # (the shell's helper)

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

SETUP = """
import collections, enum, os, torch, ckpt_nb
from sklearn.datasets import load_digits
digits = load_digits()
X = torch.tensor(digits.data / 16.0, dtype=torch.float32)
Y = torch.tensor(digits.target)
torch.manual_seed(0)
class Digits(torch.utils.data.TensorDataset):
    def state_dict(self):
        return {"last": collections.deque([0], maxlen=1)}
    def load_state_dict(self, state):
        self.last = state["last"]
loader = torch.utils.data.DataLoader(Digits(X, Y), batch_size=200, shuffle=True)
model = torch.nn.Linear(64, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
class Mode(enum.Enum):
    MIN = "min"
    MAX = "max"
class Stopper:
    def __init__(self):
        self.mode, self.best, self.recent = Mode.MIN, None, collections.deque(maxlen=3)
    def update(self, value):
        self.recent.append(value)
        if self.best is None or (value < self.best if self.mode == Mode.MIN
                                 else value > self.best):
            self.best = value
    def state_dict(self):
        return {"mode": self.mode, "best": self.best, "recent": self.recent}
    def load_state_dict(self, state):
        self.mode, self.best, self.recent = state["mode"], state["best"], state["recent"]
stopper = Stopper()
clip = 1.0
"""

TRAIN = """%%ckpt_auto --dir {dir} --every-steps 4 {options}
for epoch in ckpt_nb.epochs(3):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward(); opt.step()
    stopper.update(round(loss.item(), 6))
    if epoch == 1 and os.path.exists("crash"):  # (a file: a variable would be put back)
        os.remove("crash"); raise RuntimeError("crash")
"""


def state(shell) -> list[torch.Tensor]:
    """The model's weights and the optimizer's momentum, copied."""
    ns = shell.user_ns
    return [t.clone() for t in ns["model"].state_dict().values()] + \
        [s["momentum_buffer"].clone() for s in ns["opt"].state.values()]


def test_a_resume_refuses_pickled_state_and_trust_pickle_loads_it(shell, tmp_path: Path,
                                                                  capsys) -> None:
    """The resume handed the Stopper's load_state_dict() PickledValue placeholders for its
    Enum and deque (restore() refuses them): the run went on tracking the wrong mode."""
    run(shell, SETUP)
    (tmp_path / "crash").touch()
    crashed = run(shell, TRAIN.format(dir=tmp_path, options=""), cell_id="train")
    assert isinstance(crashed.error_in_exec, RuntimeError)
    saved = list(shell.user_ns["stopper"].recent)  # (two epochs' losses)
    run(shell, SETUP)  # (as in a fresh kernel)
    run(shell, "stopper.best = -1.0; clip = 3.0")
    before = state(shell)
    capsys.readouterr()
    refused = run(shell, TRAIN.format(dir=tmp_path, options=""), cell_id="train")
    assert isinstance(refused.error_in_exec, ckpt_nb.UntrustedPickleError)
    message = str(refused.error_in_exec)
    assert message.startswith("not resuming checkpoint "), message
    assert ": the states of stopper, the loader's dataset hold values stored as pickles " \
           "(stopper/mode, stopper/recent, dataset/last), which are loaded only where you " \
           "trust the store" in message, message
    assert message.endswith("nothing was loaded. Run the cell with --trust-pickle "
                            "(auto(trust_pickle=True)) if you trust this store, or with "
                            "--no-resume (auto(resume=False)) not to resume it")
    out = capsys.readouterr()
    assert "resumed from" not in out.out and "trust_pickle=True to load" not in out.err
    # Nothing was loaded: the objects and the variables are as they were.
    ns = shell.user_ns
    assert all(torch.equal(a, b) for a, b in zip(before, state(shell), strict=True))
    assert (ns["stopper"].mode, ns["stopper"].best, list(ns["stopper"].recent)) == \
        (ns["Mode"].MIN, -1.0, [])
    assert ns["clip"] == 3.0 and not hasattr(ns["loader"].dataset, "last")
    # (trusted, a pickle whose class is not defined: refused too, not a fresh start)
    mode = ns.pop("Mode")
    unknown = run(shell, TRAIN.format(dir=tmp_path, options="--trust-pickle"), cell_id="train")
    assert isinstance(unknown.error_in_exec, ckpt_nb.StateMismatchError)
    assert "import or define the class first" in str(unknown.error_in_exec)
    assert str(unknown.error_in_exec).endswith("or run the cell with --no-resume "
                                               "(auto(resume=False)) not to resume it")
    assert ns["clip"] == 3.0 and list(ns["stopper"].recent) == []
    ns["Mode"] = mode
    trusted = run(shell, TRAIN.format(dir=tmp_path, options="--trust-pickle"), cell_id="train")
    assert trusted.success, trusted.error_in_exec
    assert "resumed from" in capsys.readouterr().out
    stopper = ns["stopper"]
    assert stopper.mode is ns["Mode"].MIN and ns["clip"] == 1.0
    assert isinstance(stopper.recent, collections.deque) and stopper.recent.maxlen == 3
    assert list(stopper.recent)[:2] == saved and len(stopper.recent) == 3
    assert isinstance(ns["loader"].dataset.last, collections.deque)


def test_a_rollback_refuses_pickled_state_and_trust_pickle_loads_it(shell, tmp_path: Path,
                                                                    capsys) -> None:
    """%ckpt_rollback put the placeholders into the Stopper and said "restored ...,
    stopper"; the Python API's rollback() alike."""
    run(shell, SETUP)
    assert run(shell, TRAIN.format(dir=tmp_path, options=""), cell_id="train").success
    end = ckpt_nb.CheckpointManager(tmp_path).resolve("latest")
    run(shell, "stopper.best = -1.0; stopper.mode = Mode.MAX; clip = 3.0")
    before = state(shell)
    capsys.readouterr()
    refused = run(shell, f"%ckpt_rollback {end}")
    assert type(refused.error_in_exec).__name__ == "UsageError"  # (one line, no traceback)
    assert str(refused.error_in_exec) == (
        f"%ckpt_rollback: not rolling back to {end}: the state of stopper holds values stored "
        "as pickles (stopper/mode, stopper/recent), which are loaded only where you trust the "
        "store: unpickling runs code that the store names; nothing was changed: "
        f"%ckpt_rollback {end} --trust-pickle loads them, if you trust this store")
    with pytest.raises(ckpt_nb.UntrustedPickleError, match=r"nothing was changed: "
                       r"rollback\(\.\.\., trust_pickle=True\) loads them"):
        ckpt_nb.rollback(end, namespace=shell.user_ns)
    ns = shell.user_ns
    assert all(torch.equal(a, b) for a, b in zip(before, state(shell), strict=True))
    assert (ns["stopper"].mode, ns["stopper"].best, ns["clip"]) == (ns["Mode"].MAX, -1.0, 3.0)
    assert "rolled back" not in capsys.readouterr().out
    assert ckpt_nb.rollback(end, namespace=shell.user_ns, trust_pickle=True) == end
    assert ns["stopper"].mode is ns["Mode"].MIN and ns["clip"] == 1.0
    run(shell, "stopper.mode = Mode.MAX; clip = 3.0")
    assert run(shell, f"%ckpt_rollback {end} --trust-pickle").success
    assert "restored model, opt, stopper" in capsys.readouterr().out
    assert ns["stopper"].mode is ns["Mode"].MIN and ns["clip"] == 1.0
    assert isinstance(ns["stopper"].recent, collections.deque)


def test_trust_pickle_is_a_cells_and_a_rollbacks_option(shell, tmp_path: Path) -> None:
    """The line form resumes no run: a --trust-pickle there would look obeyed. auto()
    takes trust_pickle= as the cell takes --trust-pickle, True or False alone."""
    refused = run(shell, "%ckpt_auto --trust-pickle")
    assert str(refused.error_in_exec) == (
        "%ckpt_auto: --trust-pickle is a %%ckpt_auto cell's (its resume loads the pickles); "
        "the line form resumes no run: %ckpt_rollback ID --trust-pickle loads them in a "
        "rollback")
    assert ckpt_nb.status() == {"active": False}
    with ckpt_nb.auto(str(tmp_path), namespace={"model": torch.nn.Linear(2, 1)},
                      trust_pickle=True) as session:
        assert session.config.trust_pickle
    with pytest.raises(TypeError, match=r"trust_pickle \(--trust-pickle\) takes True or False"):
        with ckpt_nb.auto(str(tmp_path), namespace={}, trust_pickle="no"):
            pass
    with pytest.raises(TypeError, match="trust_pickle takes True or False, not 'no'"):
        ckpt_nb.rollback("latest", directory=tmp_path, namespace={}, trust_pickle="no")
    for magic in ("ckpt_auto", "ckpt_rollback"):
        assert "--trust-pickle" in shell.find_line_magic(magic).__doc__
