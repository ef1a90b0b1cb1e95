"""A rollback to a store other than the last session's: ranked and restored by that
store's own settings, not the last session's."""

from __future__ import annotations

import collections.abc
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import ckpt_nb
from ckpt_nb import CheckpointManager, _session

SETUP = """
import torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
VL = [0.5, 0.1, 0.9]; ACC = [0.9, 0.2, 0.5]   # val_loss's best is epoch 1, acc's epoch 0
"""

LOOP = """
for epoch in ckpt_nb.epochs(3):
    for i in ckpt_nb.batches(range(2)):
        opt.zero_grad(); model(torch.ones(2)).sum().backward(); opt.step()
    ckpt_nb.log(val_loss=VL[epoch], acc=ACC[epoch])
"""


pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)


def run(sh: InteractiveShell, code: str) -> None:
    result = sh.run_cell(code, store_history=False)
    assert result.success, result.error_in_exec or result.error_before_exec


def best_by(store: Path, metric: str, mode: str) -> str:
    table = ckpt_nb.CheckpointManager(store).list()
    pick = table[metric].idxmin() if mode == "min" else table[metric].idxmax()
    return str(table["id"][pick])


def test_best_of_another_store_is_ranked_by_that_stores_metric(shell, tmp_path: Path,
                                                                capsys) -> None:
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'a'} --on val_loss:min --every-steps 2" + LOOP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'b'} --on acc:max --every-steps 2" + LOOP)
    capsys.readouterr()
    run(shell, f"%ckpt_rollback --dir {tmp_path / 'a'} best")
    wanted = best_by(tmp_path / "a", "val_loss", "min")
    assert wanted != best_by(tmp_path / "a", "acc", "max")
    assert f"rolled back to {wanted} " in capsys.readouterr().out
    assert _session.kernel_position(tmp_path / "a") == wanted


def test_best_of_a_store_in_a_fresh_kernel_is_ranked_by_its_metric(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README: rollback to best works after a cell has ended, on --dir DIR too."""
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'a'} --on val_loss:min --every-steps 2" + LOOP)
    monkeypatch.setattr(_session, "_last", None)  # (a new kernel)
    monkeypatch.setattr(_session, "_positions", {})
    wanted = best_by(tmp_path / "a", "val_loss", "min")
    capsys.readouterr()
    run(shell, f"%ckpt_rollback --dir {tmp_path / 'a'} best")
    assert f"rolled back to {wanted} (epoch 2, step 4), best by val_loss (min): " \
        in capsys.readouterr().out
    assert ckpt_nb.rollback("best", directory=tmp_path / "a", namespace=shell.user_ns) == wanted


def test_best_of_a_store_saved_without_on_is_ranked_by_the_rollbacks_on(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tutorial 02's store, saved without --on: %ckpt_rollback best was refused, naming
    CheckpointManager(metric=) and %%ckpt_auto --on, which a rollback has neither of."""
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'a'} --every-steps 2" + LOOP)
    monkeypatch.setattr(_session, "_last", None)  # (a new kernel)
    monkeypatch.setattr(_session, "_positions", {})
    result = shell.run_cell(f"%ckpt_rollback best --dir {tmp_path / 'a'}",
                            store_history=False)
    assert str(result.error_in_exec) == (
        "%ckpt_rollback: 'best' needs a metric to rank by, and no save to this store "
        "recorded one: %ckpt_rollback best --on METRIC:min|max, or roll back by id "
        "(%ckpt_list, then %ckpt_rollback ID)")
    with pytest.raises(ckpt_nb.CheckpointNotFoundError, match=re.escape(
            "recorded one: rollback('best', on=(METRIC, 'min'|'max')), or roll back by id")):
        ckpt_nb.rollback("best", directory=tmp_path / "a", namespace=shell.user_ns)
    capsys.readouterr()
    for on, (metric, mode) in (("val_loss:min", ("val_loss", "min")), ("acc", ("acc", "max"))):
        wanted = best_by(tmp_path / "a", metric, mode)
        run(shell, f"%ckpt_rollback best --dir {tmp_path / 'a'} --on {on}")
        assert f"rolled back to {wanted} " in capsys.readouterr().out
        assert _session.kernel_position(tmp_path / "a") == wanted
    assert best_by(tmp_path / "a", "val_loss", "min") != best_by(tmp_path / "a", "acc", "max")
    assert ckpt_nb.rollback("best", directory=tmp_path / "a", namespace=shell.user_ns,
                            on=("val_loss", "min")) == best_by(tmp_path / "a", "val_loss", "min")
    assert ckpt_nb.CheckpointManager(tmp_path / "a").metric is None  # (not recorded)
    for line, message in ((f"latest --dir {tmp_path / 'a'} --on acc",
                           "--on ranks best and nothing else: %ckpt_rollback latest takes none"),
                          ("best --on acc:up", "--on takes METRIC:min or METRIC:max")):
        result = shell.run_cell(f"%ckpt_rollback {line}", store_history=False)
        assert isinstance(result.error_in_exec, UsageError), line
        assert str(result.error_in_exec).startswith(f"%ckpt_rollback: {message}"), line
    with pytest.raises(ValueError, match="on= ranks 'best' and nothing else"):
        ckpt_nb.rollback("-1", directory=tmp_path / "a", namespace=shell.user_ns, on="acc")


def test_the_active_sessions_best_is_ranked_by_the_rollbacks_on_and_its_own_after(
        shell, tmp_path: Path, capsys) -> None:
    """--on ranks that rollback's "best" alone: the session's saves and retention rank by
    its own --on after it."""
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'a'} --every-steps 2" + LOOP)
    run(shell, f"%ckpt_auto --dir {tmp_path / 'a'} --on acc:max")
    capsys.readouterr()
    run(shell, "%ckpt_rollback best --on val_loss:min")
    wanted = best_by(tmp_path / "a", "val_loss", "min")
    assert f"rolled back to {wanted} (epoch 2, step 4), best by val_loss (min): " \
        in capsys.readouterr().out
    session = _session.active()
    assert session is not None and session.url == _session.store_url(tmp_path / "a")
    assert (session.manager.metric, session.manager.mode) == ("acc", "max")
    run(shell, "%ckpt_auto --off")


def test_another_store_restores_what_it_holds_not_what_the_last_session_tracked(
        shell, tmp_path: Path, capsys) -> None:
    """The last session tracked the model alone: a rollback to a store that holds the
    optimizer too puts its momentum back, not the later training's."""
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'a'}" + LOOP)
    saved = ckpt_nb.CheckpointManager(tmp_path / "a").load("latest").state["opt"]
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'b'} --track model" + LOOP)
    capsys.readouterr()
    run(shell, f"%ckpt_rollback --dir {tmp_path / 'a'} latest")
    out = capsys.readouterr().out
    assert "restored model, opt" in out and "not opt" not in out
    live = shell.user_ns["opt"].state_dict()["state"]
    assert all(torch.equal(live[k]["momentum_buffer"], saved["state"][k]["momentum_buffer"])
               for k in saved["state"])


REBIND_SETUP = """
import torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
_FAIL_AT = None
"""

REBIND_TRAIN = """%%ckpt_auto --dir {dir} --every-steps 3
for epoch in ckpt_nb.epochs(2):
    for i, _ in ckpt_nb.batches(range(3)):
        opt.zero_grad(); model(torch.ones(1, 4)).sum().backward(); opt.step()
        if _FAIL_AT == (epoch, i):
            raise RuntimeError("stop")
"""


ORPHAN_NOTICE = ("opt drives parameters no tracked module holds: if the training uses it, "
                 "re-create it after `model` (run its cell again); if it's left from "
                 "earlier, `del opt` or leave it out with --track (track=)")


def test_a_rollback_into_a_model_re_created_after_its_optimizer_says_so(
        shell, tmp_path: Path) -> None:
    """The model cell run again, the optimizer cell not: the optimizer steps the old
    model's parameters. A rollback said it restored both, and the cell run again after it
    trained nothing; it now warns, naming both ways out, and rolls back."""
    run(shell, REBIND_SETUP)
    run(shell, REBIND_TRAIN.format(dir=tmp_path / "s"))
    run(shell, "model = torch.nn.Linear(4, 2)")
    with pytest.warns(RuntimeWarning) as caught:
        run(shell, "%ckpt_rollback -1")
    assert any(ORPHAN_NOTICE in str(w.message) for w in caught)
    assert _session.kernel_position(tmp_path / "s") == \
        ckpt_nb.CheckpointManager(tmp_path / "s").resolve("-1")
    run(shell, "opt = torch.optim.SGD(model.parameters(), lr=0.1)")
    run(shell, "%ckpt_rollback -1")
    after = shell.user_ns["model"].weight.detach().clone()
    run(shell, REBIND_TRAIN.format(dir=tmp_path / "s"))
    assert not torch.equal(shell.user_ns["model"].weight, after)


@pytest.mark.parametrize("leftover", [
    pytest.param("for g in opt.param_groups:\n    g['lr'] = 0.1", id="g"),
    pytest.param("for p in opt.param_groups[0]['params']:\n    pass\n"
                 "groups = opt.param_groups", id="p and the groups"),
])
def test_a_loop_variable_over_the_optimizers_groups_hides_no_re_created_model(
        shell, tmp_path: Path, leftover: str) -> None:
    """A `for g in opt.param_groups` loop leaves `g`, the optimizer's own group, in the
    namespace, and a `for p in ...` loop the old model's last parameter: neither keeps the
    old model as a user's own value does, yet either silenced the warning."""
    run(shell, REBIND_SETUP)
    run(shell, REBIND_TRAIN.format(dir=tmp_path / "s"))
    run(shell, leftover)
    run(shell, "model = torch.nn.Linear(4, 2)")
    assert any(ORPHAN_NOTICE in message for message in rollback_warnings(shell))


def test_a_resume_into_a_model_re_created_after_its_optimizer_says_so(
        shell, tmp_path: Path) -> None:
    run(shell, REBIND_SETUP)
    run(shell, "_FAIL_AT = (1, 1)")
    assert not shell.run_cell(REBIND_TRAIN.format(dir=tmp_path / "s"),
                              store_history=False).success
    run(shell, "model = torch.nn.Linear(4, 2); _FAIL_AT = None")
    with pytest.warns(RuntimeWarning) as caught:
        run(shell, REBIND_TRAIN.format(dir=tmp_path / "s"))
    assert any("resuming checkpoint" in str(w.message) and ORPHAN_NOTICE in str(w.message)
               for w in caught)


def test_a_cell_run_on_a_model_re_created_after_its_optimizer_says_so(
        shell, tmp_path: Path) -> None:
    """The model cell run again, the optimizer cell not, then the training cell: it
    trained nothing (the optimizer stepped the old model) and said nothing, where the
    README says the magics say it, as a rollback and a resume do and a manager's save()."""
    run(shell, REBIND_SETUP)
    run(shell, REBIND_TRAIN.format(dir=tmp_path / "s"))
    run(shell, "model = torch.nn.Linear(4, 2)")
    before = shell.user_ns["model"].weight.detach().clone()
    with pytest.warns(RuntimeWarning) as caught:
        run(shell, REBIND_TRAIN.format(dir=tmp_path / "s"))
    assert [str(w.message) for w in caught if "drives" in str(w.message)] == [ORPHAN_NOTICE]
    assert torch.equal(shell.user_ns["model"].weight, before)  # (what it warns of)
    run(shell, "opt = torch.optim.SGD(model.parameters(), lr=0.1)")  # (the way out: quiet)
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        run(shell, REBIND_TRAIN.format(dir=tmp_path / "s"))
    assert not [w for w in quiet if "drives" in str(w.message)]
    assert not torch.equal(shell.user_ns["model"].weight, before)


OTHER_SHAPE_NOTICE = (
    "opt drives parameters that nothing in the namespace holds, shaped as no tracked "
    "module's (a model made anew since, of another shape?): if the training uses it, "
    "re-create it after `model` (run its cell again), or the model never trains; if it's "
    "left from earlier, `del opt` or leave it out with --track (track=)")


def drives_warnings(shell: InteractiveShell, code: str) -> list[str]:
    """The optimizer notices ckpt_nb warns of as ``code`` runs (which must succeed)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(shell, code)
    return [str(w.message) for w in caught if "drives parameters" in str(w.message)]


def test_a_cell_run_on_a_model_re_created_with_another_shape_says_so(
        shell, tmp_path: Path) -> None:
    """The model cell run again with another hidden size (4 -> 3 -> 2 made 4 -> 5 -> 2),
    the optimizer cell not: the optimizer stepped the old model's parameters and the
    model never trained, without a word (only a model of the same shape was told)."""
    run(shell, REBIND_SETUP.replace("torch.nn.Linear(4, 2)", (
        "torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))")))
    run(shell, REBIND_TRAIN.format(dir=tmp_path / "s"))
    run(shell, "model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), "
               "torch.nn.Linear(5, 2))")
    before = [p.detach().clone() for p in shell.user_ns["model"].parameters()]
    assert drives_warnings(shell, REBIND_TRAIN.format(dir=tmp_path / "s")) == \
        [OTHER_SHAPE_NOTICE]
    assert all(torch.equal(p, b) for p, b in zip(shell.user_ns["model"].parameters(), before))
    assert any(message.endswith(OTHER_SHAPE_NOTICE)  # (a rollback says it too)
               for message in rollback_warnings(shell))
    run(shell, "opt = torch.optim.SGD(model.parameters(), lr=0.1)")  # (the way out: quiet)
    assert drives_warnings(shell, REBIND_TRAIN.format(dir=tmp_path / "s")) == []


@pytest.mark.parametrize("setup", [
    pytest.param("d_net = torch.nn.Linear(3, 1)\n"
                 "opt_d = torch.optim.SGD(d_net.parameters(), lr=0.1)\n",
                 id="a discriminator's optimizer, the discriminator untracked"),
    pytest.param("def make_scale():\n"
                 "    scale = torch.ones(3, requires_grad=True)\n"
                 "    return (lambda x: x * scale), scale\n"
                 "apply_scale, _ = make_scale()\n"
                 "opt_d = torch.optim.SGD([apply_scale.__closure__[0].cell_contents], lr=0.1)\n",
                 id="a tensor a closure holds"),
    pytest.param("kept = [torch.zeros(3, 3, requires_grad=True), torch.zeros(3)]\n"
                 "opt_d = torch.optim.SGD([kept[0]], lr=0.1)\n",
                 id="a list of tensors the user keeps"),
    pytest.param("model.heads = [torch.nn.Linear(3, 3)]\n"
                 "opt_d = torch.optim.SGD(model.heads[0].parameters(), lr=0.1)\n",
                 id="a module a model keeps in a plain list"),
    pytest.param("import collections\nparts = collections.deque([torch.nn.Linear(3, 1)])\n"
                 "opt_d = torch.optim.SGD(parts[0].parameters(), lr=0.1)\n",
                 id="a module in a deque"),
    pytest.param("import dataclasses\n@dataclasses.dataclass(slots=True)\nclass Parts:\n"
                 "    d_net: object\nparts = Parts(torch.nn.Linear(3, 1))\n"
                 "opt_d = torch.optim.SGD(parts.d_net.parameters(), lr=0.1)\n",
                 id="a module an object with __slots__ keeps"),
])
def test_an_optimizer_of_another_shape_that_the_namespace_holds_is_not_orphaned(
        shell, tmp_path: Path, setup: str) -> None:
    """Shaped as no tracked module's and driving none, but its parameters held by a
    module, a closure or a list the namespace reaches (a part not saved): not warned of,
    at a cell's start or at a rollback."""
    run(shell, "import torch, ckpt_nb\nmodel = torch.nn.Linear(4, 2)\n"
               "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n" + setup)
    cell = (f"%%ckpt_auto --dir {tmp_path / 's'} --track model,opt,opt_d --every-steps 1\n"
            "for i in ckpt_nb.batches(range(2)):\n"
            "    opt.zero_grad(); model(torch.ones(4)).sum().backward(); opt.step()\n")
    assert drives_warnings(shell, cell) == []
    assert drives_warnings(shell, "%ckpt_rollback -1") == []


def test_the_line_form_warns_once_of_a_model_re_created_after_its_optimizer(
        shell, tmp_path: Path) -> None:
    """The same under the line form (%ckpt_auto on, plain training cells): no cell starts
    to warn at, and its saves held an untrained model with no word. The first save after
    the change warns, once, of the optimizer over the old model's parameters; the later
    ones, and those after the optimizer's cell is run again, say nothing more."""
    train = "for i in range(3):\n    opt.zero_grad(); model(torch.ones(4)).sum().backward()" \
        "; opt.step()"
    run(shell, REBIND_SETUP)
    # (an optimizer left from earlier, over parameters of its own: not named at the change)
    run(shell, "stale = torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1)")
    run(shell, f"%ckpt_auto --dir {tmp_path / 's'} --every-steps 2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(shell, train)  # (no change: quiet)
        quiet = len(caught)
        run(shell, "model = torch.nn.Linear(4, 2)")
        before = shell.user_ns["model"].weight.detach().clone()
        run(shell, train)
        run(shell, train)
        assert torch.equal(shell.user_ns["model"].weight, before)  # (what it warns of)
        run(shell, "opt = torch.optim.SGD(model.parameters(), lr=0.1)")
        run(shell, train)
    run(shell, "%ckpt_auto --off")
    told = [str(w.message) for w in caught if "drives" in str(w.message)]
    assert quiet == 0 and told == [ORPHAN_NOTICE]
    assert not torch.equal(shell.user_ns["model"].weight, before)


def rollback_warnings(shell: InteractiveShell) -> list[str]:
    """The warnings of ``%ckpt_rollback -1``, which must succeed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(shell, "%ckpt_rollback -1")
    return [str(w.message) for w in caught]


def test_an_optimizer_left_from_an_earlier_experiment_lets_a_rollback_go_on(
        shell, tmp_path: Path) -> None:
    """A new model and a new optimizer, the old ``opt`` still defined: it drives no
    tracked module, and rolling it back does no harm. The rollback was refused, telling
    the user to re-create it; it warns, naming ``del opt`` too."""
    run(shell, "import torch, ckpt_nb\nmodel = torch.nn.Linear(4, 2)\n"
               "opt = torch.optim.Adam(model.parameters())")
    loop = (f"%%ckpt_auto --dir {tmp_path / 's'} --every-steps 2\n"
            "for i in ckpt_nb.batches(range(4)):\n"
            "    O.zero_grad(); model(torch.ones(4)).sum().backward(); O.step()\n")
    run(shell, loop.replace("O.", "opt."))
    run(shell, "model = torch.nn.Linear(4, 2)\n"
               "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)")
    run(shell, loop.replace("O.", "optimizer."))
    assert any(ORPHAN_NOTICE in message for message in rollback_warnings(shell))
    assert _session.kernel_position(tmp_path / "s") == \
        ckpt_nb.CheckpointManager(tmp_path / "s").resolve("-1")


@pytest.mark.parametrize("setup", [
    pytest.param("student = torch.nn.Linear(4, 2); models = {'student': student}\n"
                 "del student; teacher = torch.nn.Linear(4, 2)\n"
                 "opt = torch.optim.SGD(models['student'].parameters(), lr=0.1)\n",
                 id="a module in a dict, a tracked one of its shape"),
    pytest.param("model = torch.nn.Linear(64, 64).half()\n"
                 "master = [p.detach().float().requires_grad_() for p in model.parameters()]\n"
                 "opt = torch.optim.SGD(master, lr=0.1)\n",
                 id="fp32 master copies over the variable cap"),
])
def test_an_optimizer_of_parameters_the_namespace_holds_untracked_is_not_orphaned(
        shell, tmp_path: Path, setup: str) -> None:
    """Parameters held by no tracked object but by a value the namespace reaches (a
    module in a dict, a list of tensors skipped as too large) are no re-created module's:
    a rollback was refused for them."""
    run(shell, "import torch, ckpt_nb\n" + setup)
    try:
        run(shell, "%config CkptMagics.max_variable_mb = 0")  # (master: skipped, not held)
        run(shell, f"%%ckpt_auto --dir {tmp_path / 's'} --every-steps 1\n"
                   "for i in ckpt_nb.batches(range(2)):\n"
                   "    opt.zero_grad()\n"
                   "    sum(p.float().sum() for p in opt.param_groups[0]['params']).backward()\n"
                   "    opt.step()\n")
        assert not any("drives parameters" in message for message in rollback_warnings(shell))
    finally:
        shell.config.pop("CkptMagics", None)  # (the next test's shell loads afresh)


def test_an_optimizer_of_a_tensor_variable_or_another_shape_is_not_taken_for_orphaned(
        shell, tmp_path: Path) -> None:
    """Only parameters shaped as a tracked module's, in none of the tracked objects or
    variables, are a re-created module's: a tensor trained directly, or a module an
    object of the user's own holds, is not."""
    run(shell, "import torch, ckpt_nb\nmodel = torch.nn.Linear(4, 2)\n"
               "w = torch.zeros(2, 4, requires_grad=True)\n"
               "opt = torch.optim.SGD([w], lr=0.1)\n"
               "class Holder:\n"
               "    def __init__(self): self.net = torch.nn.Linear(4, 2)\n"
               "    def state_dict(self): return self.net.state_dict()\n"
               "    def load_state_dict(self, state): self.net.load_state_dict(state)\n"
               "holder = Holder()\n"
               "opt2 = torch.optim.SGD(holder.net.parameters(), lr=0.1)")
    run(shell, f"%%ckpt_auto --dir {tmp_path / 's'}\n"
               "for step in ckpt_nb.batches(range(3)):\n"
               "    opt.zero_grad(); (w.sum() + model(torch.ones(4)).sum()).backward()\n"
               "    opt.step(); opt2.zero_grad(); holder.net(torch.ones(4)).sum().backward()\n"
               "    opt2.step()")
    run(shell, "%ckpt_rollback latest")


def test_every_seconds_takes_a_duration_as_every_and_auto_do(shell, tmp_path: Path) -> None:
    """auto(every_seconds="10m") was taken; %%ckpt_auto --every-seconds 10m was argparse's
    "invalid float value"."""
    run(shell, f"%ckpt_auto --dir {tmp_path / 's'} --every-seconds 10m")
    assert _session.active().config.every_seconds == 600
    run(shell, "%ckpt_auto --off")
    run(shell, f"%ckpt_auto --dir {tmp_path / 's'} --every-seconds 90")
    assert _session.active().config.every_seconds == 90
    run(shell, "%ckpt_auto --off")
    bad = shell.run_cell("%ckpt_auto --every-seconds 10x", store_history=False)
    assert "cannot read '10x' as a duration" in str(bad.error_in_exec)


def test_every_option_of_ckpt_auto_has_help_and_strategy_names_its_default() -> None:
    from ckpt_nb._magics import CkptMagics

    parser = CkptMagics.ckpt_auto.parser
    assert all(action.help for action in parser._actions if action.dest != "help")
    strategy = next(a for a in parser._actions if a.dest == "strategy")
    assert "full (the default" in strategy.help


def test_a_cell_on_the_configured_default_dir_says_where_it_writes(
        shell, tmp_path: Path, capsys) -> None:
    """The line form said "-> .../runs"; a cell on CkptMagics.default_dir said nothing."""
    run(shell, "import torch, ckpt_nb\nmodel = torch.nn.Linear(2, 2)")
    run(shell, f'%config CkptMagics.default_dir = "{tmp_path / "runs"}"')
    try:
        capsys.readouterr()
        run(shell, "%%ckpt_auto\nx = 1")
        assert f"-> {tmp_path / 'runs'} (CkptMagics.default_dir)\n" in capsys.readouterr().out
        run(shell, f"%%ckpt_auto --dir {tmp_path / 'other'}\nx = 1")
        assert " -> " not in capsys.readouterr().out
    finally:
        run(shell, '%config CkptMagics.default_dir = ""')


def test_a_scripts_edited_block_is_told_the_rollback_with_its_directory(
        tmp_path: Path) -> None:
    """The hint said `directory=...` where the store was known."""
    from test_auto_blocks import SKIPPED
    from test_session_jobs import script

    script(tmp_path, "train.py", SKIPPED, die=True)
    again = script(tmp_path, "train.py", SKIPPED.replace("train(model, opt, 3, die_at=25)",
                                                         "train(model, opt, 4)"))
    assert "directory='store', namespace=globals())` before the block" in again.stdout, \
        again.stdout


class _LazyProxy:
    """A lazy proxy's shape (wrapt, lazy_object_proxy): slots, and attribute reads that
    run the user's code."""

    __slots__ = ("factory",)

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"the proxy's factory ran for {name}")


class _Shelf(collections.abc.Mapping):
    """A mapping whose values unpickle a database (shelve, sqlitedict)."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("the shelf was read")

    def __iter__(self) -> Iterator[str]:
        return iter(["a"])

    def __len__(self) -> int:
        return 1


def test_the_walk_for_an_optimizers_holders_runs_no_users_code() -> None:
    """vars() on a slots proxy called its __getattr__ (a RuntimeError ended the rollback),
    and a Mapping's values() read a shelf; a huge namespace is taken as holding all."""
    weight = torch.nn.Parameter(torch.ones(3))
    wanted = {_session._storage(weight)}
    space = {"proxy": _LazyProxy(), "shelf": _Shelf(), "kept": {"w": weight}}
    assert _session._held_storages(space, wanted) == wanted
    assert _session._held_storages({"proxy": _LazyProxy(), "shelf": _Shelf()}, wanted) == set()
    many = {"many": [[i] for i in range(_session._HELD_WALK_MOST + 1)]}
    assert _session._held_storages(many, wanted) == wanted


class _Gate:
    """A tracked object whose load waits for the test: a rollback slow to put its state
    in (a big model's), while a save on another thread runs."""

    def __init__(self) -> None:
        self.loading, self.release = threading.Event(), threading.Event()

    def state_dict(self) -> dict[str, Any]:
        return {"n": torch.zeros(1)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loading.set()
        assert self.release.wait(30)


def test_a_save_during_a_rollback_by_another_metric_ranks_by_the_sessions_own(
        tmp_path: Path) -> None:
    """rollback("best", on=...) set the ranking on the session's manager for the whole
    rollback: a save on another thread meanwhile (a step hook) ranked its retention by
    it, deleting the best by the session's metric, and recorded it as the store's."""
    store, gate = tmp_path / "s", _Gate()
    ns = {"model": torch.nn.Linear(4, 2), "gate": gate}
    with ckpt_nb.auto(store, namespace=ns, on=("loss", "min"), keep_best=2, name="x",
                      track=["model", "gate"], sync=True) as session:
        for loss, acc in ((0.1, 0.5), (0.5, 0.6), (0.9, 0.7)):
            ckpt_nb.log(loss=loss, acc=acc)
            session.save(wait=True)
        best_by_acc = best_by(store, "acc", "max")
        table = ckpt_nb.CheckpointManager(store).list()
        best_by_loss = set(table.sort_values("loss")["id"][:2])
        assert best_by_acc not in best_by_loss
        saved: list[str] = []

        def save_meanwhile() -> None:
            try:
                assert gate.loading.wait(30)
                ckpt_nb.log(loss=0.8, acc=0.95)
                saved.append(session.save(wait=True))
            finally:
                gate.release.set()

        thread = threading.Thread(target=save_meanwhile)
        thread.start()
        assert ckpt_nb.rollback("best", on="acc:max") == best_by_acc
        thread.join()
        assert (session.manager.metric, session.manager.mode) == ("loss", "min")
        assert session.manager._manifest(saved[0]).get("ranked_by") == ["loss", "min"]
    with ckpt_nb.CheckpointManager(store) as manager:
        assert best_by_loss <= set(manager.list()["id"])
        assert manager.catalog.ranking() == ("loss", "min")


def test_a_rollback_ranked_by_the_stores_own_metric_given_on_says_nothing_of_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """on= equal to the store's recorded ranking warned "'best' is by acc (max), the
    ranking an earlier save recorded in this store: give a metric ...", on= given."""
    ns = {"model": torch.nn.Linear(4, 2)}
    with ckpt_nb.auto(tmp_path, namespace=ns, on=("acc", "max"), name="x", track=["model"],
                      sync=True) as session:
        for acc in (0.5, 0.9, 0.7):
            ckpt_nb.log(acc=acc)
            session.save(wait=True)
    monkeypatch.setattr(_session, "_last", None)  # (a new kernel)
    monkeypatch.setattr(_session, "_positions", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ckpt_nb.rollback("best", directory=tmp_path, namespace=ns,
                                on="acc:max") == \
            ckpt_nb.CheckpointManager(tmp_path, metric="acc", mode="max").resolve("best")


def test_every_rollback_error_says_it_may_be_another_stores(
        shell, tmp_path: Path) -> None:
    """%ckpt_rollback best of a store with no metric, or -99, named no store and gave no
    --dir hint, as an id not found did: the last session's store may be the wrong one."""
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'a'} --every-steps 2" + LOOP)
    elsewhere = "the store of the last session: for a checkpoint of another store, " \
        "%ckpt_rollback {} --dir PATH"
    for line, said in (
            ("best", "'best' needs a metric to rank by, and no save to this store recorded "
                     "one: %ckpt_rollback best --on METRIC:min|max, or roll back by id "
                     f"(%ckpt_list, then %ckpt_rollback ID); it looked in {tmp_path / 'a'}, "
                     + elsewhere.format("best")),
            ("best --on loss:min", "no checkpoint has the metric 'loss'; the metrics logged "
                                   f"are: acc, val_loss; it looked in {tmp_path / 'a'}, "
                                   + elsewhere.format("best --on loss:min")),
            ("-99", "only 3 checkpoints: -99 is too far back; -2 is the oldest; it looked in "
                    f"{tmp_path / 'a'}, " + elsewhere.format("-99")),
            ("nosuchid", f"no checkpoint 'nosuchid' in {tmp_path / 'a'}: use an id from "
                         "%ckpt_list, 'latest', 'best' or '-N'; it looked in "
                         + elsewhere.format("nosuchid"))):
        result = shell.run_cell(f"%ckpt_rollback {line}", store_history=False)
        assert isinstance(result.error_in_exec, UsageError), line
        assert str(result.error_in_exec) == f"%ckpt_rollback: {said}", line


def test_a_checkpoint_found_by_id_that_does_not_fit_gives_no_other_store_hint(
        shell, tmp_path: Path) -> None:
    """A rollback by id refused for shapes that do not fit ended "for a checkpoint of
    another store, %ckpt_rollback ID --dir PATH", though this store held it; by latest,
    best or -N another store may still hold the one meant."""
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'a'} --every-steps 2" + LOOP)
    first = ckpt_nb.CheckpointManager(tmp_path / "a").list()["id"].iloc[0]
    run(shell, "model = torch.nn.Linear(2, 3); "
               "opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)")
    for line, hinted in ((first, False), ("latest", True), ("-1", True)):
        result = shell.run_cell(f"%ckpt_rollback {line}", store_history=False)
        assert isinstance(result.error_in_exec, UsageError), line
        said = str(result.error_in_exec)
        assert "does not fit" in said and "nothing was changed" in said, said
        assert ("another store" in said) == hinted, (line, said)


def another_run_logs_loss_alone(store: Path) -> None:
    """An epoch's end saved into ``store`` without the metric its ranking records (another
    run's), where "best" by the record is worth a word."""
    with CheckpointManager(store) as other:
        other.save(torch.nn.Linear(2, 2), epoch=0, metrics={"loss": 1.0})


def test_best_by_the_stores_recorded_ranking_is_said_in_the_magics_words(
        shell, tmp_path: Path, capsys) -> None:
    """%ckpt_rollback best, ranked by the metric an earlier save recorded, warned "give a
    metric (metric=, --metric) to rank by another", which a rollback takes neither of."""
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'a'} --on acc:max --every-steps 2" + LOOP)
    run(shell, f"%ckpt_auto --dir {tmp_path / 'a'}")
    another_run_logs_loss_alone(tmp_path / 'a')  # (so the ranking is said)
    with pytest.warns(UserWarning) as caught:
        run(shell, "%ckpt_rollback best")
    assert [str(w.message) for w in caught] == [
        "'best' is by acc (max), the ranking an earlier save recorded in this store: "
        "%ckpt_rollback best --on METRIC:min|max ranks by another"]
    assert f"rolled back to {best_by(tmp_path / 'a', 'acc', 'max')} " in capsys.readouterr().out
    # Other code's warnings during it are left to the user's filters, as they are outside
    # (all were caught and said again after, as from a file: a module's filter missed them)
    (tmp_path / "noisylib.py").write_text(
        "import warnings\n"
        "class Noisy:\n"
        "    def state_dict(self): return {}\n"
        "    def load_state_dict(self, state): warnings.warn('noisy load')\n")
    run(shell, f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
               "import noisylib; noisy = noisylib.Noisy()")
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'b'} --track noisy\npass")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("default")
        warnings.filterwarnings("ignore", "noisy load", module="noisylib")
        run(shell, f"%ckpt_rollback latest --dir {tmp_path / 'b'}")
    assert not [w for w in said if "noisy load" in str(w.message)], said
    sys.path.remove(str(tmp_path))
    run(shell, "%ckpt_auto --off")


def test_best_by_the_stores_recorded_ranking_is_said_in_the_python_words(
        shell, tmp_path: Path, capsys) -> None:
    """ckpt_nb.rollback("best") from Python, ranked by the metric an earlier save
    recorded, names its own on= (not the manager's metric= and the CLI's --metric, which
    a rollback takes neither of); inside %ckpt_rollback the magic's words win (above)."""
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path} --on acc:max --every-steps 2" + LOOP)
    run(shell, f"%ckpt_auto --dir {tmp_path}")
    another_run_logs_loss_alone(tmp_path)  # (so the ranking is said)
    with pytest.warns(UserWarning) as caught:
        run(shell, "ckpt_nb.rollback('best')")
    assert [str(w.message) for w in caught] == [
        "'best' is by acc (max), the ranking an earlier save recorded in this store: "
        "rollback('best', on=(METRIC, 'min'|'max')) ranks by another"]
    assert f"rolled back to {best_by(tmp_path, 'acc', 'max')} " in capsys.readouterr().out
    run(shell, "%ckpt_auto --off")


def test_a_rollback_from_the_last_sessions_store_renamed_since_says_so_and_makes_none(
        shell, tmp_path: Path) -> None:
    """The store renamed after its cell ran: a rollback without --dir made an empty store
    at the old path and said "no checkpoints yet ... (a misspelt path?)"."""
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'a'} --every-steps 2" + LOOP)
    (tmp_path / "a").rename(tmp_path / "renamed")
    with pytest.raises(UsageError, match="renamed, moved or deleted since it ran, and nothing "
                       "was rolled back; put it back, or give its new place as --dir") as refused:
        shell.run_line_magic("ckpt_rollback", "latest")
    assert "misspelt" not in str(refused.value) and not (tmp_path / "a").exists()
    with pytest.raises(ckpt_nb.CheckpointNotFoundError,
                       match="put it back, or give its new place as directory="):
        ckpt_nb.rollback("latest")
    assert not (tmp_path / "a").exists()
    run(shell, f"%ckpt_rollback latest --dir {tmp_path / 'renamed'}")


def test_a_cell_on_another_store_after_a_rollback_says_its_run_starts_over_there(
        shell, tmp_path: Path, capsys) -> None:
    """``%ckpt_rollback -2 --dir old``, then a cell on ``new``: it trained from the
    rolled-back objects with its loops from the start and its steps from 0, in a new root,
    without a word. One line says where the objects came from and that the run starts
    over there; once this store's saves hold them, no cell says it again."""
    old, new = tmp_path / "old", tmp_path / "new"
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {old} --every-steps 2" + LOOP)
    run(shell, f"%ckpt_rollback --dir {old} -2")
    rolled_to = CheckpointManager(old).resolve("-2")
    capsys.readouterr()
    run(shell, f"%%ckpt_auto --dir {new} --every-steps 2" + LOOP)
    said = [line for line in capsys.readouterr().out.splitlines() if "rolled back" in line]
    assert said == [f"ckpt_nb: model, opt come from checkpoint {rolled_to} of {old} (rolled "
                    f"back to there); that position is that store's, so in {new} this run "
                    "starts over on them: its loops from the start, steps from 0, in a new "
                    "root"], said
    assert CheckpointManager(new).list()["step"].tolist()[0] == 2  # (from 0: its first save)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'third'} --every-steps 2" + LOOP)
    assert "rolled back" not in capsys.readouterr().out


def test_a_cell_on_the_rolled_back_store_by_another_spelling_goes_on_from_there(
        shell, tmp_path: Path, capsys) -> None:
    """``%ckpt_rollback --dir S -2``, then a cell on S spelled through a link (or
    ``sub/../S``): the kernel's position was keyed by each spelling, so the cell did not
    go on from the rolled-back checkpoint but started over in a new root, and said that
    the objects came from another store."""
    old = tmp_path / "old"
    (tmp_path / "link").symlink_to(old)
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {old} --every-steps 2" + LOOP)
    run(shell, f"%ckpt_rollback --dir {old} -2")
    rolled_to = CheckpointManager(old).resolve("-2")
    capsys.readouterr()
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'link'} --every-steps 2" + LOOP)
    out = capsys.readouterr().out
    assert f"ckpt_nb: resumed from {rolled_to} (epoch 1, batch 0, step 2)" in out, out
    assert "rolled back to there" not in out, out
