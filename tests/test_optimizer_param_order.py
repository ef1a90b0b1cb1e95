"""Optimizer state goes to parameters by name, not by position. Parameter groups built
from a set of names (``decay = {n for n, p in model.named_parameters() if p.ndim >= 2}``)
come out in another order in each process (str hashes are salted per process, so per
Jupyter kernel); by position, parameters of one shape silently took one another's Adam
moments on a restore or a resume, and those of other shapes were refused as "a layer or a
parameter group added since"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sklearn.datasets import load_digits

import warm_python  # (fresh interpreters forked from a warm one)
from digits_code import LOAD_DIGITS  # (scikit-learn's digits, scikit-learn not imported)
from ckpt_nb import CheckpointManager, StateMismatchError
from ckpt_nb._errors import ParameterOrderError

REPO = Path(__file__).resolve().parents[1]


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    data = load_digits()
    return torch.tensor(data.data / 16.0, dtype=torch.float32), torch.tensor(data.target)


def model_of_layers() -> torch.nn.Sequential:
    """Two hidden layers of one shape (their moments swap silently by position), an input
    and an output layer of others, and LayerNorms: weights decayed, the rest not."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.LayerNorm(32),
        torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 10))


def grouped(model: torch.nn.Module, decay: list[str], no_decay: list[str],
            extra: tuple[torch.nn.Parameter, ...] = ()) -> torch.optim.AdamW:
    params = dict(model.named_parameters())
    return torch.optim.AdamW([{"params": [params[n] for n in decay] + list(extra),
                               "weight_decay": 0.1},
                              {"params": [params[n] for n in no_decay], "weight_decay": 0.0}],
                             lr=1e-2)


def names(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    decay = [n for n, p in model.named_parameters() if p.ndim >= 2]
    return decay, [n for n, p in model.named_parameters() if p.ndim < 2]


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    x, y = digits()
    for step in range(steps):
        batch = slice(step * 64, step * 64 + 64)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        opt.step()


def by_name(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every weight and every optimizer state tensor, by its parameter's name."""
    found = {f"weight {n}": p.detach().clone() for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        for slot, value in opt.state[p].items():
            found[f"{n}/{slot}"] = value.clone()
    return found


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_a_restore_into_groups_in_another_order_equals_a_run_never_stopped(
        tmp_path: Path) -> None:
    """Another order within each group, and the groups themselves swapped: each state and
    each group's hyper-parameters go with the parameters of their names."""
    model = model_of_layers()
    decay, no_decay = names(model)
    opt = grouped(model, decay, no_decay)
    train(model, opt, 3)
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(model, opt, rng=False)
    train(model, opt, 3)
    unstopped = by_name(model, opt)

    again = model_of_layers()
    params = dict(again.named_parameters())
    swapped = torch.optim.AdamW(
        [{"params": [params[n] for n in reversed(no_decay)], "weight_decay": 0.0},
         {"params": [params[n] for n in reversed(decay)], "weight_decay": 0.1}], lr=1e-2)
    with CheckpointManager(tmp_path) as mgr:
        mgr.restore("latest", model=again, optimizer=swapped, rng=False)
    assert [g["weight_decay"] for g in swapped.param_groups] == [0.0, 0.1]
    train(again, swapped, 3)
    assert same(by_name(again, swapped), unstopped)


def test_torchs_own_param_names_put_the_state_back_without_the_model(tmp_path: Path) -> None:
    """An optimizer built from named_parameters() (torch >= 2.6) has the names in its own
    state: restored alone, it goes by them, and its groups keep the live names in order."""
    model = model_of_layers()
    opt = torch.optim.AdamW(list(model.named_parameters()), lr=1e-2)
    train(model, opt, 3)
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(optimizer=opt, rng=False)
    saved = by_name(model, opt)

    reversed_opt = torch.optim.AdamW(list(reversed(list(model.named_parameters()))), lr=1e-2)
    with CheckpointManager(tmp_path) as mgr:
        mgr.restore("latest", optimizer=reversed_opt, rng=False)
    assert same(by_name(model, reversed_opt), saved)
    live = reversed_opt.param_groups[0]
    assert live["param_names"] == [n for n, _ in reversed(list(model.named_parameters()))]


def test_names_that_do_not_match_load_by_position_and_a_misfit_says_the_order(
        tmp_path: Path) -> None:
    """A parameter of no module saved (a temperature) leaves the names unmatched: the state
    goes by position, as before, and where that does not fit, the refusal names two of the
    parameters in another order, not a layer added."""
    model = model_of_layers()
    temperature = torch.nn.Parameter(torch.ones(32, 32))
    decay, no_decay = names(model)
    opt = grouped(model, decay, no_decay, (temperature,))
    train(model, opt, 2)
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(model, opt, rng=False)
    saved = by_name(model, opt)

    same_order = grouped(model, decay, no_decay, (temperature,))
    with CheckpointManager(tmp_path) as mgr:
        ck = mgr.restore("latest", model=model, optimizer=same_order, rng=False)
    assert same(by_name(model, same_order), saved)
    assert ck.param_names["optimizer"][0] == [f"model.{n}" for n in decay] + [None]

    other_order = grouped(model, list(reversed(decay)), no_decay, (temperature,))
    with CheckpointManager(tmp_path) as mgr, \
            pytest.raises(ParameterOrderError) as refused:
        mgr.restore("latest", model=model, optimizer=other_order, rng=False)
    said = str(refused.value)
    assert "in another order than when it was saved (the state saved for model.0.weight " \
        "would go to model.6.weight)" in said, said
    assert "param_names['optimizer']" in said and not other_order.state


def test_a_layer_of_another_shape_is_still_refused_as_a_change(tmp_path: Path) -> None:
    """Names in the order saved, one layer of another shape: no word of an order."""
    model = model_of_layers()
    opt = grouped(model, *names(model))
    train(model, opt, 1)
    torch.manual_seed(0)
    wider = torch.nn.Sequential(*model[:6], torch.nn.Linear(32, 12))
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(model, opt, rng=False)
        with pytest.raises(StateMismatchError) as refused:
            mgr.restore("latest", model=wider, optimizer=grouped(wider, *names(wider)),
                        rng=False)
    assert not isinstance(refused.value, ParameterOrderError)
    assert "another order" not in str(refused.value)


# A notebook's training loop (the session layer, as %%ckpt_auto runs it), its groups from
# sets; killed after a save, then resumed in a process whose str hashes are salted apart.
SCRIPT = """
import hashlib, os, signal, torch, ckpt_nb
""" + LOAD_DIGITS + """
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
data = load_digits()
X, Y = torch.tensor(data.data / 16.0, dtype=torch.float32), torch.tensor(data.target)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=120,
                                     shuffle=True)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.LayerNorm(32),
    torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 10))
params = dict(model.named_parameters())
decay = {n for n, p in params.items() if p.ndim >= 2}
no_decay = {n for n, p in params.items() if p.ndim < 2}
print("order", list(decay) + list(no_decay))
# (a parameter of no module: the names do not match one to one)
alone = [torch.nn.Parameter(torch.ones(32, 32))] if os.environ["ALONE"] else []
def made() -> torch.optim.AdamW:
    return torch.optim.AdamW([{"params": [params[n] for n in decay] + alone,
                               "weight_decay": 0.1},
                              {"params": [params[n] for n in no_decay], "weight_decay": 0.0}],
                             lr=1e-2)
opt = made()
with ckpt_nb.auto("store", every_steps=4, sync=True):
    for epoch in ckpt_nb.epochs(2):
        if os.environ["REMADE"]:  # (its state then comes from the checkpoint, put back)
            opt = made()
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if (epoch, i) == (1, 2) and os.environ["DIE"]:
                os.kill(os.getpid(), signal.SIGKILL)
state = [p.detach() for p in model.parameters()]
state += [opt.state[p][k] for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")]
print("state", hashlib.sha1(b"".join(t.numpy().tobytes() for t in state)).hexdigest())
"""


def run(folder: Path, seed: str, *, die: bool = False, remade: bool = False,
        alone: bool = False, returncode: int = 0) -> subprocess.CompletedProcess[str]:
    """The script in a fresh interpreter with PYTHONHASHSEED ``seed`` (forked from a warm
    one started with it: each seed has its own); ``remade``: its optimizer made anew at
    each epoch's top; ``alone``: a parameter of no module in it."""
    folder.mkdir(exist_ok=True)
    (folder / "train.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": seed,
           "DIE": "1" if die else "", "REMADE": "1" if remade else "",
           "ALONE": "1" if alone else ""}
    env.pop("JPY_SESSION_NAME", None)
    done = warm_python.run([sys.executable, folder / "train.py"], cwd=folder, env=env,
                           timeout=300)
    assert done.returncode == (-9 if die else returncode), done.stdout + done.stderr
    return done


@pytest.mark.parametrize("remade", [False, True], ids=["kept", "made-anew-each-epoch"])
def test_a_run_resumed_in_a_process_of_other_str_hashes_ends_as_one_never_stopped(
        tmp_path: Path, remade: bool) -> None:
    """Resumed mid-epoch: the optimizer defined before the loop takes its state at the
    resume; one the epoch's code makes anew, after that code ran again."""
    unstopped = run(tmp_path / "ref", "1", remade=remade)
    run(tmp_path / "run", "1", die=True, remade=remade)
    resumed = run(tmp_path / "run", "2", remade=remade)
    order = [done.stdout.split("order ")[1].splitlines()[0] for done in (unstopped, resumed)]
    assert order[0] != order[1]  # (else this tests nothing: take other seeds)
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert resumed.stdout.split("state ")[1] == unstopped.stdout.split("state ")[1]


def test_a_resume_refused_for_parameters_in_another_order_says_so(tmp_path: Path) -> None:
    """Names that do not match one to one leave the state to go by position, as before:
    where it does not fit, the refusal named "a layer or a parameter group added since"."""
    run(tmp_path, "1", die=True, alone=True)
    refused = run(tmp_path, "2", alone=True, returncode=1)
    said = refused.stderr
    assert "opt: its parameters are in another order than when it was saved (the state " \
        "saved for model." in said, said
    assert "an optimizer's parameters are in another order than when it was saved: build " \
        "them as they were, or run with --no-resume" in said, said
    assert "a layer or a parameter group added since" not in said
