"""A resume or rollback puts a saved variable back in place only where the live object is
one something may train (a leaf tensor that requires grad, a Parameter): any other tensor
or array is replaced. A loop's batch left in a variable by a failed run (``xb = X[s:s +
10]``, a view of the data set; ``x`` of ``for x, t in data``, one of its items) was written
over with the checkpoint's batch at the resume: the data set changed, silently. In a real
in-process IPython shell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ckpt_nb import _session
from test_magics import run  # (the shell's helper)

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)


def fail_then_resume(shell: Any, cell: str, monkeypatch: Any) -> None:
    """Run ``cell`` to its error (the batch variables left behind), then again: it resumes."""
    monkeypatch.setenv("CKPT_NB_TEST_FAIL", "1")
    assert not run(shell, cell).success
    monkeypatch.delenv("CKPT_NB_TEST_FAIL")
    assert run(shell, cell).success

SETUP = """
import os, numpy as np, torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(8, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
X = {make}(50, 8); Y = {make}(50, 2)
X0, Y0 = X.copy() if isinstance(X, np.ndarray) else X.clone(), Y.copy() \\
    if isinstance(Y, np.ndarray) else Y.clone()
"""

LOOP = """%%ckpt_auto --dir {store} --every-steps 2
for epoch in ckpt_nb.epochs(3):
    for i, s in ckpt_nb.batches(range(0, 50, 10)):
        xb, yb = X[s:s + 10], Y[s:s + 10]
        opt.zero_grad()
        ((model(torch.as_tensor(xb)) - torch.as_tensor(yb)) ** 2).mean().backward()
        opt.step()
        if (epoch, i) == {fail_at} and os.environ.get("CKPT_NB_TEST_FAIL"):
            raise RuntimeError("a bug")
"""


@pytest.mark.parametrize("make", ["torch.randn", "np.random.default_rng(0).standard_normal"])
@pytest.mark.parametrize("fail_at", [(2, 0), (1, 2)], ids=["epoch-start", "mid-epoch"])
def test_a_resume_leaves_the_data_a_left_batch_views_as_it_was(
        shell: Any, tmp_path: Path, monkeypatch: Any, make: str,
        fail_at: tuple[int, int]) -> None:
    make = make if make == "torch.randn" else f"lambda *s: {make}(s, dtype=np.float32)"
    run(shell, SETUP.format(make=f"({make})"))
    cell = LOOP.format(store=tmp_path / "ref", fail_at=fail_at)
    assert run(shell, cell).success
    reference = [p.detach().clone() for p in shell.user_ns["model"].parameters()]

    run(shell, SETUP.format(make=f"({make})"))
    cell = LOOP.format(store=tmp_path / "run", fail_at=fail_at)
    fail_then_resume(shell, cell, monkeypatch)  # (xb, yb: views of the last batch)
    ns = shell.user_ns
    for data, before in ((ns["X"], ns["X0"]), (ns["Y"], ns["Y0"])):
        assert np.array_equal(np.asarray(data), np.asarray(before))
    assert all(torch.equal(a, b) for a, b in zip(ns["model"].parameters(), reference))


def test_a_tensor_an_optimizer_trains_is_still_put_back_in_place() -> None:
    """A ``torch.func`` style dict of leaves that require grad, which the optimizer holds,
    and a Parameter: the saved values are copied into them, so the optimizer still trains
    them; a plain tensor and an array beside them are replaced, not written into."""
    from ckpt_nb._discovery import assign_in_place

    w, frozen = torch.ones(3, requires_grad=True), torch.nn.Parameter(torch.ones(2), False)
    batch, array = torch.ones(4), np.ones(4)
    opt = torch.optim.SGD([w], lr=0.5)
    ns: dict[str, Any] = {"params": {"w": w, "frozen": frozen, "batch": batch}, "a": array}
    assign_in_place(ns, "params", {"w": torch.zeros(3), "frozen": torch.zeros(2),
                                   "batch": torch.zeros(4)})
    assign_in_place(ns, "a", np.zeros(4))
    assert ns["params"]["w"] is w and opt.param_groups[0]["params"][0] is w
    assert ns["params"]["frozen"] is frozen and not frozen.any() and w.requires_grad
    assert not w.detach().any()
    assert ns["params"]["batch"] is not batch and batch.all() and not ns["params"]["batch"].any()
    assert ns["a"] is not array and array.all() and not ns["a"].any()


ITEMS = """
import os, torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(8, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [{item} for _ in range(5)]
before = [[v.clone() for v in (b.values() if isinstance(b, dict) else b)] for b in data]
"""

ITEMS_LOOP = """%%ckpt_auto --dir {store} --every-steps 2
for epoch in ckpt_nb.epochs(3):
    for i, batch in ckpt_nb.batches(data):
        x, t = (batch["x"], batch["t"]) if isinstance(batch, dict) else batch
        opt.zero_grad(); ((model(x) - t) ** 2).mean().backward(); opt.step()
        if (epoch, i) == (2, 0) and os.environ.get("CKPT_NB_TEST_FAIL"):
            raise RuntimeError("a bug")
"""


@pytest.mark.parametrize("item", ['[torch.randn(4, 8), torch.randn(4, 2)]',
                                  '{"x": torch.randn(4, 8), "t": torch.randn(4, 2)}'],
                         ids=["list", "dict"])
def test_a_resume_leaves_the_data_set_whose_item_a_batch_variable_is_as_it_was(
        shell: Any, tmp_path: Path, monkeypatch: Any, item: str) -> None:
    """``batch`` left by the failed run is the list (or dict) ``data[1]``: refilled with
    the saved batch (``data[0]``'s items), it changed the data set."""
    run(shell, ITEMS.format(item=item))
    fail_then_resume(shell, ITEMS_LOOP.format(store=tmp_path / "run"), monkeypatch)
    ns = shell.user_ns
    for got, want in zip(ns["data"], ns["before"]):
        values = got.values() if isinstance(got, dict) else got
        assert all(torch.equal(a, b) for a, b in zip(values, want))


HELD = """
import os, torch, ckpt_nb
torch.manual_seed(0)
class Items(torch.utils.data.Dataset):  # (its items no notebook variable holds)
    def __init__(self, items): self.items = items
    def __len__(self): return len(self.items)
    def __getitem__(self, i): return self.items[i]
ds = Items([{"x": torch.randn(4, 8), "t": torch.randn(4, 2)} for _ in range(5)])
nested = {"train": [[torch.randn(4, 8), torch.randn(4, 2)] for _ in range(5)]}
before = repr([sorted(b.items()) for b in ds.items]) + repr(nested)
model = torch.nn.Linear(8, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
class Logger:  # (holds the list the notebook's losses is)
    def __init__(self, seen): self.seen = seen
logger = Logger(losses)
"""

HELD_LOOP = """%%ckpt_auto --dir {store} --every-steps 2
for epoch in ckpt_nb.epochs(3):
    for i, batch in ckpt_nb.batches(ds):
        pair = nested["train"][i]
        x, t = batch["x"], batch["t"]
        opt.zero_grad(); loss = ((model(x) - t) ** 2 + pair[0].sum() * 0).mean()
        loss.backward(); opt.step(); losses.append(loss.item())
        if (epoch, i) == (2, 0) and os.environ.get("CKPT_NB_TEST_FAIL"):
            raise RuntimeError("a bug")
"""


def test_a_resume_writes_into_no_list_or_dict_the_save_did_not_take(
        shell: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """``batch``, an item of a Dataset object's list, and ``pair``, two levels down in a
    dict, were refilled with the saved batch at the resume, changing the data set; a
    list the save took (``losses``, which a logger holds too) is still refilled."""
    run(shell, HELD)
    fail_then_resume(shell, HELD_LOOP.format(store=tmp_path / "run"), monkeypatch)
    ns = shell.user_ns
    assert repr([sorted(b.items()) for b in ns["ds"].items]) + repr(ns["nested"]) \
        == ns["before"]
    assert ns["logger"].seen is ns["losses"] and len(ns["losses"]) == 15


ALIASES = """
import os, torch, ckpt_nb
torch.manual_seed(0)
X, Y = torch.randn(40, 8), torch.randn(40, 2)
model = torch.nn.Sequential(torch.nn.Linear(8, 2), torch.nn.BatchNorm1d(2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
w, params = model[0].weight, dict(model.named_parameters())
buf, groups = model[1].running_mean, opt.param_groups
seen = []
"""

ALIASES_LOOP = """%%ckpt_auto --dir {store} --every-steps 3
for epoch in ckpt_nb.epochs(3):
    {epoch_code}
    for i, s in ckpt_nb.batches(range(0, 40, 10)):
        opt.zero_grad(); loss = ((model(X[s:s + 10]) - Y[s:s + 10]) ** 2).mean()
        {batch_code}
        loss.backward(); opt.step()
        if (epoch, i) == (1, 2) and os.environ.get("CKPT_NB_TEST_FAIL"):
            raise RuntimeError("a bug")
"""

# What the loop does through each alias, and what the alias must still be after a resume
USES = {
    "weight": ("pass", "loss = loss + 0.01 * w.pow(2).sum()", "model[0].weight", "w"),
    "buffer": ("pass", "seen.append(buf.sum().item())", "model[1].running_mean", "buf"),
    "groups": ('for g in groups: g["lr"] = 0.1 * 0.5 ** epoch', "pass", "opt.param_groups",
               "groups"),
}


@pytest.mark.parametrize("kernel", ["same", "new"])
@pytest.mark.parametrize("alias", list(USES))
def test_a_variable_that_is_part_of_a_tracked_object_stays_it_after_a_resume(
        shell: Any, tmp_path: Path, monkeypatch: Any, alias: str, kernel: str) -> None:
    """weight: ``w = model[0].weight`` beside ``params = dict(model.named_parameters())``
    was taken for an item of a data set (``params`` holds it) and replaced by the saved
    tensor: the loop's penalty on ``w`` then trained a tensor no model holds. buffer:
    ``buf = model[1].running_mean``, no tensor that trains, was replaced by the saved one,
    which the model no longer updated: what the loop read from it stood still. groups:
    ``groups = opt.param_groups`` was the list torch's ``load_state_dict()`` had replaced:
    the learning rate the epoch's code set there no longer reached the optimizer."""
    epoch_code, batch_code, owner, name = USES[alias]
    cell = ALIASES_LOOP.format(store="{store}", epoch_code=epoch_code, batch_code=batch_code)
    run(shell, ALIASES)
    assert run(shell, cell.format(store=tmp_path / "ref")).success
    reference = [t.clone() for t in shell.user_ns["model"].state_dict().values()]
    reference_seen = list(shell.user_ns["seen"])
    run(shell, ALIASES)
    monkeypatch.setenv("CKPT_NB_TEST_FAIL", "1")
    assert not run(shell, cell.format(store=tmp_path / "run")).success
    monkeypatch.delenv("CKPT_NB_TEST_FAIL")
    if kernel == "new":  # (which lists and dicts its saves took, a new kernel does not know)
        monkeypatch.setattr(_session, "_saved_ids", {})
    assert run(shell, cell.format(store=tmp_path / "run")).success
    ns = shell.user_ns
    assert ns[name] is eval(owner, ns)
    assert all(torch.equal(a, b) for a, b in zip(ns["model"].state_dict().values(), reference))
    assert ns["seen"] == reference_seen


ALIKE = """
import os, torch, ckpt_nb
torch.manual_seed(0)
w = torch.zeros(8, 2, requires_grad=True); b = torch.zeros(2, requires_grad=True)
params = [w, b]; opt = torch.optim.SGD(params, lr=0.1)
history = []; state = {"history": history}
data = [(torch.randn(16, 8), torch.randn(16, 2)) for _ in range(5)]
"""

ALIKE_LOOP = """%%ckpt_auto --dir {store} --every-steps 2
for epoch in ckpt_nb.epochs(3):
    for i, (x, t) in ckpt_nb.batches(data):
        opt.zero_grad(); ((x @ w + b - t) ** 2).mean().backward(); opt.step()
        history.append(i)
        if (epoch, i) == (2, 0) and os.environ.get("CKPT_NB_TEST_FAIL"):
            raise RuntimeError("a bug")
"""


def test_a_variable_another_holds_alike_stays_held_by_it_after_a_resume(
        shell: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """``w`` in ``params = [w, b]`` (the optimizer's), ``history`` in ``state``: replaced
    as items of another variable, the optimizer trained a ``w`` the loop no longer used,
    and ``state["history"]`` stopped growing: the very list saved is refilled, held alike."""
    run(shell, ALIKE)
    assert run(shell, ALIKE_LOOP.format(store=tmp_path / "ref")).success
    reference = shell.user_ns["w"].detach().clone()
    run(shell, ALIKE)
    fail_then_resume(shell, ALIKE_LOOP.format(store=tmp_path / "run"), monkeypatch)
    ns = shell.user_ns
    assert ns["w"] is ns["params"][0] is ns["opt"].param_groups[0]["params"][0]
    assert torch.equal(ns["w"], reference)
    assert ns["state"]["history"] is ns["history"] and len(ns["history"]) == 15


FUNC = """
import os, torch, ckpt_nb
from torch.func import functional_call
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [torch.randn(16, 8) for _ in range(5)]
"""

FUNC_LOOP = """%%ckpt_auto --dir {store} --every-steps 2
for epoch in ckpt_nb.epochs(3):
    for i, x in ckpt_nb.batches(data):
        opt.zero_grad()
        functional_call(model, (params, buffers), (x,)).pow(2).mean().backward()
        opt.step()
        if (epoch, i) == (2, 0) and os.environ.get("CKPT_NB_TEST_FAIL"):
            raise RuntimeError("a bug")
"""


def test_a_variable_holding_a_modules_buffers_still_holds_them_after_a_resume(
        shell: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """``torch.func``'s ``buffers = dict(model.named_buffers())``: given tensors of their
    own at the resume, the loop's BatchNorm statistics went on in them, the model's stayed
    as saved (and its later checkpoints with them), silently."""
    run(shell, FUNC)
    assert run(shell, FUNC_LOOP.format(store=tmp_path / "ref")).success
    reference = {k: v.clone() for k, v in shell.user_ns["model"].state_dict().items()}
    run(shell, FUNC)
    fail_then_resume(shell, FUNC_LOOP.format(store=tmp_path / "run"), monkeypatch)
    ns = shell.user_ns
    assert all(ns["buffers"][k] is b for k, b in ns["model"].named_buffers())
    assert all(torch.equal(v, reference[k]) for k, v in ns["model"].state_dict().items())
