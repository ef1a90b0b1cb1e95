"""The notebook layer driven through a real, in-process IPython shell."""

from __future__ import annotations

import inspect
import math
import pydoc
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from torch.optim.optimizer import _global_optimizer_post_hooks

import ckpt_nb
from ckpt_nb import StateMismatchError, _session

SETUP = """
import torch, ckpt_nb, threading
from sklearn.datasets import load_digits
digits = load_digits()
X = torch.tensor(digits.data / 16.0, dtype=torch.float32)
Y = torch.tensor(digits.target)
torch.manual_seed(0)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=100,
                                     shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                            torch.nn.Linear(32, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
history = []
STOP_AT = None
"""

TRAIN = """%%ckpt_auto --dir {dir} --every-steps 7
for epoch in ckpt_nb.epochs(3):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        sched.step()
        if STOP_AT == (epoch, i):
            {stop}
    history.append(round(loss.item(), 6))
    ckpt_nb.log(loss=loss.item())
len(history)
"""


pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)


def run(sh: InteractiveShell, code: str, cell_id: str | None = None):
    """Run a cell; ``cell_id`` as JupyterLab sends it with each execution."""
    return sh.run_cell(code, store_history=False, cell_id=cell_id)


def final_state(sh: InteractiveShell) -> list[torch.Tensor]:
    ns = sh.user_ns
    tensors = [t.clone() for t in ns["model"].state_dict().values()]
    tensors += [v.clone() for s in ns["opt"].state_dict()["state"].values() for v in s.values()]
    return tensors


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def reference(sh: InteractiveShell, tmp_path: Path, setup: str = SETUP,
              cell: str = TRAIN) -> tuple[list[torch.Tensor], list[float]]:
    run(sh, setup)
    result = run(sh, cell.format(dir=tmp_path / "ref", stop="pass"))
    assert result.success and result.result == 3
    return final_state(sh), list(sh.user_ns["history"])


INTERRUPT = "import os, signal; os.kill(os.getpid(), signal.SIGINT)"


def interrupt_at(sh: InteractiveShell, cell: str, store: Path,
                 stop_at: tuple[int, int]) -> None:
    """Run a training ``cell`` until an interrupt at (epoch, batch) ``stop_at``, which
    saves the run there."""
    run(sh, f"STOP_AT = {stop_at}")
    first = run(sh, cell.format(dir=store, stop=INTERRUPT))
    assert isinstance(first.error_in_exec, KeyboardInterrupt)


def rerun_ends_as_the_reference(sh: InteractiveShell, cell: str, store: Path,
                                expected: list[torch.Tensor], history: list[float],
                                stop: str = INTERRUPT) -> None:
    """Run the training ``cell`` that stopped (with its ``stop``: the same code) again,
    unstopped: it ends as the run never stopped did."""
    run(sh, "STOP_AT = None")
    second = run(sh, cell.format(dir=store, stop=stop))
    assert second.success and second.result == 3
    assert same(final_state(sh), expected)
    assert sh.user_ns["history"] == history


def test_load_and_unload_remove_everything(tmp_path: Path) -> None:
    sh = InteractiveShell.instance()
    sh.run_cell("%load_ext ckpt_nb")
    assert "ckpt_auto" in sh.magics_manager.magics["cell"]
    before = len(_global_optimizer_post_hooks)
    sh.run_cell(f"%ckpt_auto --dir {tmp_path} --every-steps 2")
    assert len(_global_optimizer_post_hooks) == before + 1
    sh.run_cell("%unload_ext ckpt_nb")
    assert "ckpt_auto" not in sh.magics_manager.magics["cell"]
    assert "ckpt_rollback" not in sh.magics_manager.magics["line"]
    assert len(_global_optimizer_post_hooks) == before and ckpt_nb.status() == {"active": False}


def test_a_reload_says_it_stopped_the_line_form(shell, tmp_path: Path, capsys) -> None:
    """`%reload_ext ckpt_nb` (and `%unload_ext`) stopped the line form without a word: the
    cells after it trained unsaved while the user took them for checkpointed."""
    run(shell, SMALL)
    assert run(shell, f"%ckpt_auto --dir {tmp_path / 'line'}").success
    assert run(shell, "opt.zero_grad(); model(data[0]).sum().backward(); opt.step()").success
    saved = ckpt_nb.CheckpointManager(tmp_path / "line").list()["id"].iloc[-1]
    capsys.readouterr()
    assert run(shell, "%reload_ext ckpt_nb").success
    assert capsys.readouterr().out == (
        f"ckpt_nb: unloading stopped checkpointing the session; its latest checkpoint is "
        f"{saved} (step 1): %ckpt_auto starts it again\n")
    assert ckpt_nb.status() == {"active": False}
    assert run(shell, "%unload_ext ckpt_nb").success  # (no line form now: nothing said)
    assert capsys.readouterr().out == ""
    run(shell, "%load_ext ckpt_nb")


def test_interrupt_saves_then_rerun_continues_bit_exact(shell, tmp_path: Path) -> None:
    expected, expected_history = reference(shell, tmp_path)
    run(shell, SETUP)
    interrupt_at(shell, TRAIN, tmp_path / "run", (1, 4))
    notes = list(ckpt_nb.CheckpointManager(tmp_path / "run").list()["note"])
    assert notes[-1] == "interrupt"
    rerun_ends_as_the_reference(shell, TRAIN, tmp_path / "run", expected, expected_history)
    # the run is finished now: a third run starts afresh on a new branch
    rows = ckpt_nb.CheckpointManager(tmp_path / "run").list()
    assert rows["note"].iloc[-1] == "end of cell" and rows["branch"].nunique() == 1


# A loader that draws its order from a generator of its own, as PyTorch's reproducibility
# notes advise: the epoch's order is replayed from its state, not the global one's.
GENERATOR_SETUP = SETUP.replace(
    "shuffle=True)", "shuffle=True,\n    generator=torch.Generator().manual_seed(1))")


@pytest.mark.parametrize("stop_at", [(1, 4), (1, 17)])
@pytest.mark.parametrize("kernel", ["same", "fresh"])
def test_a_loader_with_its_own_generator_resumes_bit_exact(
        shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys,
        stop_at: tuple[int, int], kernel: str) -> None:
    """Mid-epoch, and at the epoch's end (where the next epoch's order is drawn from the
    generator's state at the save); in this kernel, or a fresh one whose setup made the
    generator anew."""
    assert "generator=torch.Generator().manual_seed(1)" in GENERATOR_SETUP
    expected, expected_history = reference(shell, tmp_path, GENERATOR_SETUP)
    run(shell, GENERATOR_SETUP)
    interrupt_at(shell, TRAIN, tmp_path / "run", stop_at)
    if kernel == "fresh":
        for name, empty in (("_last", None), ("_positions", {}), ("_position_events", {}),
                            ("_left_values", {})):
            monkeypatch.setattr(_session, name, empty)
        run(shell, GENERATOR_SETUP)
    else:
        run(shell, "STOP_AT = None")
    capsys.readouterr()  # (the same cell: a fresh kernel resumes a run of this cell's code)
    second = run(shell, TRAIN.format(dir=tmp_path / "run", stop=INTERRUPT))
    assert second.success and second.result == 3
    assert "resumed from" in capsys.readouterr().out
    assert same(final_state(shell), expected)
    assert shell.user_ns["history"][-3 if kernel == "same" else -2:] == \
        expected_history[-3 if kernel == "same" else -2:]


# A per-epoch scheduler stepped after the training loop, then a validation loader: the
# position is the training loader's, and the lines after it must run once per epoch.
VAL_SETUP = SETUP.replace("StepLR(opt, step_size=10)", "ExponentialLR(opt, gamma=0.8)") + """
val_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X[:500], Y[:500]),
                                         batch_size=100, shuffle=True)
"""

TRAIN_VAL = """%%ckpt_auto --dir {dir} --every-steps 7
for epoch in ckpt_nb.epochs(3):
    model.train()
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    sched.step()
    model.eval()
    val_loss = 0.0
    with torch.no_grad():
        for j, (xb, yb) in ckpt_nb.batches(val_loader):
            val_loss += torch.nn.functional.cross_entropy(model(xb), yb).item()
            if STOP_AT == (epoch, j):
                {stop}
    history.append(round(val_loss, 6))
len(history)
"""


@pytest.mark.parametrize("stop", ["interrupt", "error"])
def test_a_stop_in_validation_resumes_the_training_loader_bit_exact(
        shell, tmp_path: Path, capsys, stop: str) -> None:
    """Only the epoch's first batches() is tracked. The validation loader's position was
    saved as the training loader's (after an interrupt the rerun trained from batch 2
    again), and the end of the training loop was a consistent point (an error in
    validation saved the stepped scheduler at it: the rerun stepped it again)."""
    expected, expected_history = reference(shell, tmp_path, VAL_SETUP, TRAIN_VAL)
    run(shell, VAL_SETUP)
    run(shell, "STOP_AT = (1, 1)")
    # (the rerun is the same code; the resume puts STOP_AT back, but not an Event)
    run(shell, "go_on = threading.Event()")
    action = "import os, signal; os.kill(os.getpid(), signal.SIGINT)" if stop == "interrupt" \
        else "if not go_on.is_set(): raise RuntimeError('bad batch')"
    first = run(shell, TRAIN_VAL.format(dir=tmp_path / "val", stop=action))
    assert isinstance(first.error_in_exec, KeyboardInterrupt if stop == "interrupt"
                      else RuntimeError)
    row = ckpt_nb.CheckpointManager(tmp_path / "val").list().iloc[-1]
    saved = (row["note"], row["epoch"], row["batch_idx"], row["step"])
    # 18 batches an epoch: an interrupt saves at the epoch's end; after an error the newest
    # checkpoint is the last periodic one, in the training loop
    assert saved == (("interrupt", 2, 0, 36) if stop == "interrupt"
                     else ("every 7 steps", 1, 17, 35))
    run(shell, "STOP_AT = None; go_on.set()")
    capsys.readouterr()
    second = run(shell, TRAIN_VAL.format(dir=tmp_path / "val", stop=action))
    assert second.success and second.result == 3
    assert f"resumed from {row['id']} (epoch {saved[1]}, batch {saved[2]}, step {saved[3]})" \
        in capsys.readouterr().out
    assert same(final_state(shell), expected)
    assert shell.user_ns["history"] == expected_history
    assert shell.user_ns["sched"].last_epoch == 3


# The training cell over a plain loop of the data, inside ckpt_nb.epochs()
PLAIN_LOADER = TRAIN.replace("ckpt_nb.batches(loader)", "enumerate(loader)")


def test_epochs_over_a_plain_loop_save_at_epoch_boundaries_and_resume_bit_exact(
        shell, tmp_path: Path) -> None:
    """With epochs() but not batches(), a step was a consistent point: a save there held
    the epoch's start as its position, and the rerun trained that epoch's first batches
    twice."""
    expected, expected_history = reference(shell, tmp_path, SETUP, PLAIN_LOADER)
    run(shell, SETUP)
    run(shell, "STOP_AT = (1, 4)")
    stop = "import os, signal; os.kill(os.getpid(), signal.SIGINT)"
    first = run(shell, PLAIN_LOADER.format(dir=tmp_path / "plain", stop=stop))
    assert isinstance(first.error_in_exec, KeyboardInterrupt)
    rows = ckpt_nb.CheckpointManager(tmp_path / "plain").list()
    assert {(e, b) for e, b in zip(rows["epoch"], rows["batch_idx"])} <= \
        {(1, 0), (2, 0)}  # (every save at an epoch boundary: 18 batches an epoch)
    assert rows["note"].iloc[-1] == "interrupt" and rows["step"].iloc[-1] == 36
    run(shell, "STOP_AT = None")
    second = run(shell, PLAIN_LOADER.format(dir=tmp_path / "plain", stop=stop))
    assert second.success and second.result == 3
    assert same(final_state(shell), expected)
    assert shell.user_ns["history"] == expected_history


def test_a_later_loader_of_the_epoch_takes_no_save_inside(shell, tmp_path: Path) -> None:
    """Its steps are not consistent points: a save there would record the first loader's
    position (done) with the second part-way, and a resume would run the second again."""
    run(shell, SETUP)
    cell = (f"%%ckpt_auto --dir {tmp_path / 'two'} --every-steps 1\n"
            "for epoch in ckpt_nb.epochs(2):\n"
            "    for i, _ in ckpt_nb.batches(range(3)):\n"
            "        opt.zero_grad(); model(X).sum().backward(); opt.step()\n"
            "    for j, _ in ckpt_nb.batches(range(2)):\n"
            "        opt.zero_grad(); model(X).sum().backward(); opt.step()")
    assert run(shell, cell).success
    rows = ckpt_nb.CheckpointManager(tmp_path / "two").list()
    saved = list(zip(rows["epoch"], rows["batch_idx"], rows["step"]))
    # (epoch, batches of the first loader done, step): 5 steps an epoch; the end of the
    # cell's save took the place of the step-10 one
    assert saved == [(0, 1, 1), (0, 2, 2), (1, 0, 5), (1, 1, 6), (1, 2, 7), (2, 0, 10)]


def test_a_cell_resumes_its_own_run_by_cell_id_even_edited(shell, tmp_path: Path,
                                                            capsys) -> None:
    """With the front end's cell ids, an edited cell resumes its run, and another cell
    (even one of the same code) never does."""
    run(shell, SETUP)
    crash = TRAIN.format(dir=tmp_path / "ids", stop="pass").replace(
        "        opt.zero_grad()",
        "        if STOP_AT == (epoch, i):\n            raise RuntimeError('diverged')\n"
        "        opt.zero_grad()")
    run(shell, "STOP_AT = (0, 2)")
    assert isinstance(run(shell, crash, cell_id="train").error_in_exec, RuntimeError)
    run(shell, "STOP_AT = None")
    capsys.readouterr()
    other = run(shell, crash, cell_id="copy")  # (the same code in another cell)
    assert other.success
    out = capsys.readouterr().out
    assert "resumed" not in out and "other code" not in out  # (ids: it never resumes it)
    run(shell, "STOP_AT = (0, 2)")
    assert isinstance(run(shell, crash, cell_id="train").error_in_exec, RuntimeError)
    run(shell, "STOP_AT = None")
    capsys.readouterr()
    edited = run(shell, TRAIN.format(dir=tmp_path / "ids", stop="pass"), cell_id="train")
    assert edited.success
    out = capsys.readouterr().out
    assert "this cell changed since" in out and "(epoch 0, batch 2, step" in out


def test_a_line_session_forgets_an_interrupt_at_each_cell(shell, tmp_path: Path,
                                                          capsys) -> None:
    run(shell, SETUP + "import os, signal\n")
    run(shell, f"%ckpt_auto --dir {tmp_path / 'line'} --every-steps 50")
    step = "    opt.zero_grad(); model(X[:40]).sum().backward(); opt.step()\n"
    first = run(shell, "for s in range(3):\n" + step +
                "    if s == 1: os.kill(os.getpid(), signal.SIGINT)")
    assert isinstance(first.error_in_exec, KeyboardInterrupt)
    for _ in range(2):  # (each raised KeyboardInterrupt after its first step, uninterrupted)
        assert run(shell, "for s in range(3):\n" + step).success
    # a cell that stops training after an interrupt runs to its end, and says so
    capsys.readouterr()
    run(shell, "for s in range(3):\n" + step + "os.kill(os.getpid(), signal.SIGINT)\n"
               "reached_end = True")
    assert shell.user_ns["reached_end"] and "ran to its end" in capsys.readouterr().out
    # a cell that trains nothing stops at once: nothing is saved first (it ran to its
    # end, a long evaluation, say, and Run All went on)
    stopped = run(shell, "os.kill(os.getpid(), signal.SIGINT)\nnot_reached = True")
    assert isinstance(stopped.error_in_exec, KeyboardInterrupt)
    assert "not_reached" not in shell.user_ns
    # a %%ckpt_auto cell inside the line form: a second interrupt stops it at once
    nested = run(shell, f"%%ckpt_auto --dir {tmp_path / 'nested'}\n"
                        "for s in range(3):\n" + step +
                        "    if s == 1:\n        os.kill(os.getpid(), signal.SIGINT)\n"
                        "        os.kill(os.getpid(), signal.SIGINT)\n"
                        "        second_passed = True\n")
    assert isinstance(nested.error_in_exec, KeyboardInterrupt)
    assert "second_passed" not in shell.user_ns


def test_an_interrupt_no_consistent_point_came_after_stops_the_cell_at_its_end(
        shell, tmp_path: Path, capsys) -> None:
    """(It used to be swallowed: the cell ended as a success, and Run All went on.)"""
    run(shell, SETUP)
    result = run(shell, f"%%ckpt_auto --dir {tmp_path / 'c'}\nimport os, signal\n"
                        "os.kill(os.getpid(), signal.SIGINT)\nreached_end = True")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert shell.user_ns["reached_end"] and "ran to its end" in capsys.readouterr().out
    rows = ckpt_nb.CheckpointManager(tmp_path / "c").list()
    assert list(rows["note"]) == ["end of cell"]


def test_exception_saves_last_consistent_state_and_reraises(shell, tmp_path: Path, capsys) -> None:
    run(shell, SETUP)
    cell = TRAIN.format(dir=tmp_path / "err", stop="raise RuntimeError('diverged')")
    run(shell, "STOP_AT = (0, 2)")
    result = run(shell, cell.replace("        opt.zero_grad()",
                                     "        if STOP_AT == (epoch, i):\n"
                                     "            raise RuntimeError('diverged')\n"
                                     "        opt.zero_grad()"))
    assert isinstance(result.error_in_exec, RuntimeError)
    rows = ckpt_nb.CheckpointManager(tmp_path / "err").list()
    assert rows["note"].iloc[-1] == "RuntimeError in the cell"
    assert (rows["epoch"].iloc[-1], rows["batch_idx"].iloc[-1], rows["step"].iloc[-1]) == (0, 2, 2)
    out = capsys.readouterr()
    assert "diverged" in out.out + out.err
    assert "line" in out.out + out.err  # the traceback shows the user's cell
    # (said, as an interrupt's save is: it was made without a word)
    assert f"ckpt_nb: saved {rows['id'].iloc[-1]} at step 2, the last consistent point " \
        "before the RuntimeError" in out.out


def test_discovery_reports_what_it_tracks_and_skips(shell, tmp_path: Path, capsys) -> None:
    run(shell, SETUP)
    run(shell, "gen = (i for i in range(3)); fh = open(__file__ if '__file__' in dir() else "
               f"'{tmp_path / 'f.txt'}', 'w'); lock = threading.Lock(); fn = lambda x: x\n"
               "compiled = torch.compile(model)\nfrom pandas import DataFrame\n"
               "frame = DataFrame({'a': [1, 2], 'b': ['x', 'y']})\n"
               "import datetime, pathlib\ndata_dir = pathlib.Path('data')\n"
               "started = datetime.datetime(2024, 1, 2, tzinfo=datetime.timezone.utc)\n"
               "import collections, enum\nP = collections.namedtuple('P', 'a b')\n"
               "point = P(1, 2)\nclass Color(enum.IntEnum):\n    RED = 1\ncolor = Color.RED")
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'd'}\nopt.step()")
    line = capsys.readouterr().out
    assert "tracking model, opt, sched" in line and "compiled" not in line.split(";")[0]
    for skipped in ("gen (generator)", "fh (open file)", "lock (lock)", "fn (lambda)",
                    "loader (DataLoader", "point (P)", "color (Color)"):  # (a namedtuple
        # failed every save: it was taken for a tuple; an IntEnum came back an int)
        assert skipped in line
    ck = ckpt_nb.CheckpointManager(tmp_path / "d").load("latest")
    variables = ck.extra["ckpt_nb_run"]["variables"]
    assert {"history", "X", "frame"} <= set(variables)
    assert variables["data_dir"] == Path("data")  # (stored as JSON: no pickle, no trust)
    assert variables["started"].isoformat() == "2024-01-02T00:00:00+00:00"


def test_the_session_a_block_binds_is_not_said_as_left_out(shell, tmp_path: Path,
                                                            capsys) -> None:
    """Each `with ckpt_nb.auto(...) as session:` said `not saving session (AutoSession)`
    at its first save: ckpt_nb's own object, no state of the user's. The second block
    finds the first one's, closed, in the namespace as it begins."""
    run(shell, SETUP)
    block = (f"with ckpt_nb.auto({str(tmp_path / 'd')!r}, name='{{}}') as session:\n"
             "    opt.zero_grad(); model(X[:8]).sum().backward(); opt.step()\n"
             "    session.save(wait=True)")
    for name in ("first", "second"):
        assert run(shell, block.format(name)).success
        out = capsys.readouterr().out
        assert "tracking model, opt, sched" in out and "not saving" not in out, out
        assert "session" not in out.split("variables ")[1].split(";")[0]


def test_the_explorer_a_variable_holds_is_not_said_as_left_out(shell, tmp_path: Path,
                                                                capsys) -> None:
    """`ui = %ckpt_ui` (as the README's `ui.select(...)` has it), then a cell: its start
    line said `skipped ui (Explorer)`, and the line form `not saving ui (Explorer)`, of
    ckpt_nb's own object."""
    run(shell, SMALL)
    step = "opt.zero_grad(); model(data[0]).sum().backward(); opt.step()"
    assert run(shell, f"%%ckpt_auto --dir {tmp_path / 'd'}\n{step}").success
    assert run(shell, "ui = %ckpt_ui").success
    capsys.readouterr()
    assert run(shell, f"%%ckpt_auto --dir {tmp_path / 'd'}\n{step}").success
    run(shell, f"%ckpt_auto --dir {tmp_path / 'd'}")
    assert run(shell, step).success
    run(shell, "%ckpt_auto --off")
    run(shell, "ui.close()")
    out = capsys.readouterr().out
    assert "tracking model, opt" in out and "Explorer" not in out, out


def test_a_cell_that_makes_its_model_is_not_said_to_track_nothing(shell, tmp_path: Path,
                                                                   recwarn) -> None:
    """A cell making its model and optimizer ahead of its loop, in a new kernel, warned
    "tracks no stateful object ...: its checkpoints hold none" as it started, though its
    saves held them (and resumed them). A cell that makes none still says so."""
    run(shell, "import torch, ckpt_nb\ndata = [torch.ones(4, 2)] * 3")
    cell = (f"%%ckpt_auto --dir {tmp_path / 'd'}\n"
            "model = torch.nn.Linear(2, 1)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for i, x in ckpt_nb.batches(data):\n"
            "    opt.zero_grad(); model(x).sum().backward(); opt.step()")
    assert run(shell, cell).success
    assert not [w for w in recwarn if "tracks no stateful" in str(w.message)]
    held = ckpt_nb.CheckpointManager(tmp_path / "d").load("latest").state
    assert {"model", "opt"} <= set(held)
    run(shell, "del model, opt")
    with pytest.warns(RuntimeWarning, match="tracks no stateful object"):
        assert run(shell, f"%%ckpt_auto --dir {tmp_path / 'e'}\nvalue = 5").success


def test_rollback_restores_in_place_and_branches(shell, tmp_path: Path, capsys) -> None:
    run(shell, SETUP)
    run(shell, TRAIN.format(dir=tmp_path / "rb", stop="pass"))
    run(shell, f"%ckpt_auto --dir {tmp_path / 'rb'} --every-steps 1000")
    mgr = ckpt_nb.CheckpointManager(tmp_path / "rb")
    early = mgr.list()["id"].iloc[1]
    saved = mgr.load(early)
    params = list(shell.user_ns["model"].parameters())
    history_obj = shell.user_ns["history"]
    run(shell, f"%ckpt_rollback {early}")
    assert f"rolled back to {early}" in capsys.readouterr().out
    assert all(a is b for a, b in zip(params, shell.user_ns["model"].parameters()))
    assert same(list(shell.user_ns["model"].state_dict().values()),
                list(saved.state["model"].values()))
    assert shell.user_ns["history"] is history_obj
    assert history_obj == saved.extra["ckpt_nb_run"]["variables"]["history"]
    run(shell, "for xb, yb in loader:\n    opt.zero_grad()\n"
               "    torch.nn.functional.cross_entropy(model(xb), yb).backward()\n    opt.step()")
    table = ckpt_nb.CheckpointManager(tmp_path / "rb").list().set_index("id")
    child = table.index[-1]
    assert table.loc[child, "parent"] == early and table.loc[child, "branch"] != "main"
    run(shell, "%ckpt_status")
    assert "every 1000 steps" in capsys.readouterr().out


def test_bad_options_give_clear_errors(shell, capsys) -> None:
    for line, message in (("--every 5x", "duration"), ("--on loss:up", "METRIC:min"),
                          ("--keep-best 2", "--on"), ("--every-steps 0", "positive"),
                          ("--every -3m", "positive and finite, not '-3m'"),
                          ("--every-steps -2", "positive"),
                          ("--every 10m --every-seconds 5", "give one of them"),
                          ("--on ''", "--on is empty"), ("--track ','", "--track is empty")):
        result = run(shell, f"%ckpt_auto {line}")
        assert not result.success
        assert message in capsys.readouterr().err + str(result.error_in_exec)


def test_a_period_that_never_fires_is_refused(shell) -> None:
    """nan and inf seconds were accepted, and a save never fell due."""
    for line in ("--every-seconds nan", "--every-seconds inf", "--every inf", "--every 1e400m"):
        result = run(shell, f"%ckpt_auto {line}")
        assert isinstance(result.error_in_exec, UsageError), line
        assert "positive and finite" in str(result.error_in_exec)
        assert ckpt_nb.status() == {"active": False}


def test_a_dir_that_cannot_be_a_store_is_a_usage_error(shell, tmp_path: Path) -> None:
    """(It was the store's StoreError, with a long traceback through the session.)"""
    (tmp_path / "file").touch()
    hooks = len(_global_optimizer_post_hooks)
    for directory in (tmp_path / "file", tmp_path / "file" / "sub"):
        result = run(shell, f"%%ckpt_auto --dir {directory}\nran = True")
        assert isinstance(result.error_in_exec, UsageError)
        said = f"{tmp_path / 'file'} is a file: give a directory"  # (it was errno's words)
        assert said in str(result.error_in_exec)
        assert "ran" not in shell.user_ns
        result = run(shell, f"%ckpt_auto --dir {directory}")
        assert isinstance(result.error_in_exec, UsageError)
        assert said in str(result.error_in_exec)
    assert ckpt_nb.status() == {"active": False}
    assert len(_global_optimizer_post_hooks) == hooks


def test_helpers_without_a_session_are_plain() -> None:
    assert list(ckpt_nb.epochs(3)) == [0, 1, 2]
    assert list(ckpt_nb.batches("ab")) == [(0, "a"), (1, "b")]
    ckpt_nb.log(loss=1.0)
    with pytest.raises(ckpt_nb.CkptError, match="no ckpt_nb session"):
        ckpt_nb.rollback("latest")


def test_rollback_after_the_cell_then_rerun_continues_on_a_branch(shell, tmp_path: Path,
                                                                  capsys) -> None:
    expected, expected_history = reference(shell, tmp_path)
    events: list[tuple[str, str]] = []
    unsubscribe = _session.subscribe(lambda event, cid, url: events.append((event, cid)))
    run(shell, SETUP)
    assert run(shell, TRAIN.format(dir=tmp_path / "br", stop="pass")).success
    mgr = ckpt_nb.CheckpointManager(tmp_path / "br")
    main_rows = mgr.list()
    assert _session.kernel_position(tmp_path / "br") == main_rows["id"].iloc[-1]
    middle = main_rows[main_rows["epoch"] == 1]["id"].iloc[0]  # mid-run: epoch 1 unfinished
    run(shell, f"%ckpt_rollback {middle}")  # no session is active after the cell
    assert f"rolled back to {middle}" in capsys.readouterr().out
    assert _session.kernel_position(str(tmp_path / "br")) == middle
    rerun = run(shell, TRAIN.format(dir=tmp_path / "br", stop="pass"))
    assert rerun.success and f"resumed from {middle}" in capsys.readouterr().out
    assert same(final_state(shell), expected)  # the continuation is exact
    assert shell.user_ns["history"] == expected_history
    table = mgr.list().set_index("id")
    new = table.drop(index=list(main_rows["id"]))
    assert new["parent"].iloc[0] == middle
    assert new["branch"].nunique() == 1 and new["branch"].iloc[0] != "main"
    assert ("rollback", middle) in events and ("resume", middle) in events
    assert ("save", new.index[-1]) in events
    unsubscribe()


FINE_TUNE = """%%ckpt_auto --dir {dir}
steps = 0
for epoch in ckpt_nb.epochs(2):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        steps += 1
steps
"""


def test_another_cell_after_a_rollback_runs_its_own_loops_whole(shell, tmp_path: Path,
                                                                 capsys) -> None:
    """Rolled back to a mid-run checkpoint of the training cell, a fine-tune cell took
    over that run's position (epoch 1, batch 10): it ran 10 of its 36 steps. Cell ids
    (JupyterLab and Notebook 7 send them) tell the cells apart; without, the fine-tune
    cell is taken for the training one edited (see the README)."""
    run(shell, SETUP)
    assert run(shell, TRAIN.format(dir=tmp_path / "ft", stop="pass"), cell_id="train").success
    rows = ckpt_nb.CheckpointManager(tmp_path / "ft").list()
    middle = rows[(rows["epoch"] == 1) & (rows["batch_idx"] > 0)]["id"].iloc[0]
    run(shell, f"%ckpt_rollback {middle}")
    capsys.readouterr()
    result = run(shell, FINE_TUNE.format(dir=tmp_path / "ft"), cell_id="fine-tune")
    out = capsys.readouterr().out
    assert result.success and result.result == 36, out
    assert "resumed" not in out and f"checkpoint {middle}, rolled back to, holds a run" in out


def test_no_resume_starts_a_new_root_branch(shell, tmp_path: Path) -> None:
    run(shell, SETUP)
    run(shell, "STOP_AT = (0, 3)")
    interrupt = "import os, signal; os.kill(os.getpid(), signal.SIGINT)"
    run(shell, TRAIN.format(dir=tmp_path / "nr", stop=interrupt))
    first = set(ckpt_nb.CheckpointManager(tmp_path / "nr").list()["id"])
    run(shell, SETUP)  # new objects: they come from no checkpoint
    cell = TRAIN.format(dir=tmp_path / "nr", stop="pass").replace(
        "--every-steps 7", "--every-steps 7 --no-resume")
    assert run(shell, cell).success
    table = ckpt_nb.CheckpointManager(tmp_path / "nr").list().set_index("id")
    new = table.drop(index=list(first))
    assert new["parent"].isna().iloc[0] and new["branch"].iloc[0] != "main"


def test_rollback_errors_name_the_problem(shell, tmp_path: Path) -> None:
    """With no session yet, the magic says --dir is the way (it said "no session", then
    that it looked in "the store of the last session", and named directory= and
    namespace=, keywords of the Python API); the Python API keeps its keywords."""
    result = run(shell, "%ckpt_rollback best")
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec) == (
        "%ckpt_rollback: no store to roll back from (no %ckpt_auto or %%ckpt_auto cell has "
        "run in this kernel, and there is no checkpoint store at checkpoints/session, the "
        "default one): %ckpt_rollback best --dir PATH (the store's directory)")
    with pytest.raises(ckpt_nb.CkptError, match="no ckpt_nb session has run in this "
                                                "process; .* pass directory= and namespace="):
        ckpt_nb.rollback("latest")
    result = run(shell, f"%ckpt_rollback latest --dir {tmp_path / 'nowhere'}")
    assert "no checkpoint store at" in str(result.error_in_exec)
    run(shell, SETUP)
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'e'}\nopt.step()")
    result = run(shell, "%ckpt_rollback nosuchid")
    assert "nosuchid" in str(result.error_in_exec)


AWKWARD = """
import torch, ckpt_nb, io, threading
torch.manual_seed(1)
X = torch.randn(64, 8)
Y = torch.randint(0, 3, (64,))
backbone = torch.nn.Linear(8, 16).to("cpu")
head = torch.nn.Linear(16, 3)
parallel = torch.nn.DataParallel(backbone)           # a wrapper: tracked through backbone
compiled = torch.compile(head, backend="eager")      # likewise, through head
opt_a = torch.optim.SGD(backbone.parameters(), lr=0.1, momentum=0.9)
opt_b = torch.optim.AdamW(head.parameters(), lr=1e-2)
stream = (i for i in range(3)); buffer = io.StringIO(); guard = threading.Lock()
square = lambda v: v * v
"""

AWKWARD_TRAIN = """%%ckpt_auto --dir {dir} --every-steps 2
sched_b = torch.optim.lr_scheduler.StepLR(opt_b, step_size=3)  # made after the optimizer
for epoch in ckpt_nb.epochs(2):
    for i in range(3):
        opt_a.zero_grad(); opt_b.zero_grad()
        torch.nn.functional.cross_entropy(compiled(parallel(X)), Y).backward()
        opt_a.step(); opt_b.step(); sched_b.step()
"""


def test_wrappers_two_optimizers_and_late_scheduler(shell, tmp_path: Path, capsys) -> None:
    run(shell, AWKWARD)
    result = run(shell, AWKWARD_TRAIN.format(dir=tmp_path / "aw"))
    assert result.success, result.error_in_exec
    line = capsys.readouterr().out.splitlines()[0]
    tracked = line.split(";")[0]
    assert all(n in tracked for n in ("backbone", "head", "opt_a", "opt_b"))
    assert "parallel" not in tracked and "compiled" not in tracked
    for skipped in ("stream (generator)", "buffer (open file)", "guard (lock)", "square (lambda)"):
        assert skipped in line
    mgr = ckpt_nb.CheckpointManager(tmp_path / "aw")
    first = mgr.list()["id"].iloc[0]
    saved = mgr.load(first)
    assert {"backbone", "head", "opt_a", "opt_b", "sched_b"} <= set(saved.state)
    ns = shell.user_ns
    params = [id(p) for p in ns["backbone"].parameters()]
    run(shell, f"%ckpt_rollback {first}")
    assert torch.equal(ns["backbone"].weight, saved.state["backbone"]["weight"])
    assert torch.equal(ns["compiled"](ns["parallel"](ns["X"])),  # the wrappers see it too
                       ns["head"](ns["backbone"](ns["X"])))
    assert [id(p) for p in ns["opt_a"].param_groups[0]["params"]] == params
    assert ns["sched_b"].last_epoch == saved.state["sched_b"]["last_epoch"]


def test_a_changed_model_is_refused_and_left_alone(shell, tmp_path: Path) -> None:
    run(shell, AWKWARD)
    run(shell, AWKWARD_TRAIN.format(dir=tmp_path / "ch"))
    run(shell, "backbone.to(torch.float64)")
    before = shell.user_ns["backbone"].weight.detach().clone()
    result = run(shell, "%ckpt_rollback latest")
    message = str(result.error_in_exec)
    assert "nothing was changed" in message and "backbone: weight" in message
    assert "float64 in the live object" in message
    assert torch.equal(shell.user_ns["backbone"].weight, before)


def test_rollback_keeps_a_tensor_optimized_directly_the_optimizers(shell, tmp_path: Path) -> None:
    """A leaf tensor trained without a module (an input being optimized, say) is
    rolled back in place: the optimizer still holds it, and it still wants grads."""
    run(shell, "import torch, ckpt_nb\ntorch.manual_seed(0)\n"
               "w = torch.zeros(64, 10, requires_grad=True)\n"
               "opt = torch.optim.Adam([w], lr=0.05)\n"
               "from sklearn.datasets import load_digits\nd = load_digits()\n"
               "X = torch.tensor(d.data / 16.0, dtype=torch.float32)\n"
               "Y = torch.tensor(d.target)")
    cell = (f"%%ckpt_auto --dir {tmp_path / 'w'} --every-steps 5\n"
            "for step in ckpt_nb.batches(range(20)):\n"
            "    opt.zero_grad()\n"
            "    torch.nn.functional.cross_entropy(X @ w, Y).backward()\n"
            "    opt.step()")
    assert run(shell, cell).success
    w = shell.user_ns["w"]
    mgr = ckpt_nb.CheckpointManager(tmp_path / "w")
    early = mgr.list()["id"].iloc[0]
    saved = mgr.load(early).extra["ckpt_nb_run"]["variables"]["w"]
    assert not torch.equal(w.detach(), saved)
    assert run(shell, f"%ckpt_rollback {early}").success
    assert shell.user_ns["w"] is w and w.requires_grad
    assert shell.user_ns["opt"].param_groups[0]["params"][0] is w
    assert torch.equal(w.detach(), saved)


def train_nested(ns: dict[str, Any], steps: int) -> None:
    """Steps of an optimizer over the tensors in ``ns``'s dict, list and tuple."""
    for _, x in ckpt_nb.batches([torch.ones(2)] * steps):
        ns["opt"].zero_grad()
        (ns["params"]["w"] * x + ns["layers"][0] + ns["pair"][0]).sum().backward()
        ns["opt"].step()


def test_rollback_and_resume_put_back_tensors_in_a_dict_list_or_tuple_in_place(
        tmp_path: Path) -> None:
    """torch.func-style parameters in a dict came back as new tensors without
    requires_grad (a Parameter as a plain tensor), which the optimizer no longer trained."""
    params = {"w": torch.zeros(2, requires_grad=True)}
    layers = [torch.nn.Parameter(torch.zeros(2))]
    pair = (torch.zeros(2, requires_grad=True), "bias")
    live = [params["w"], layers[0], pair[0]]
    ns = {"params": params, "layers": layers, "pair": pair,
          "opt": torch.optim.SGD(live, lr=0.1)}
    with ckpt_nb.auto(str(tmp_path), namespace=ns, every_steps=2, sync=True):
        train_nested(ns, 4)
    early = ckpt_nb.CheckpointManager(tmp_path).list()["id"].iloc[0]
    saved = ckpt_nb.CheckpointManager(tmp_path).load(early).extra["ckpt_nb_run"]["variables"]
    assert isinstance(saved["layers"][0], torch.nn.Parameter) and saved["params"]["w"] \
        .requires_grad  # (as a fresh kernel, which has no live tensors, gets them)

    def put_back() -> None:
        now = [ns["params"]["w"], ns["layers"][0], ns["pair"][0]]
        assert all(a is b for a, b in zip(now, live)) and ns["pair"][1] == "bias"
        assert all(t.requires_grad for t in now) and isinstance(now[1], torch.nn.Parameter)
        assert same(now, [saved["params"]["w"], saved["layers"][0], saved["pair"][0]])

    ckpt_nb.rollback(early, directory=tmp_path, namespace=ns)
    put_back()
    train_nested(ns, 2)  # (the optimizer trains them on)
    assert not same(live, [saved["params"]["w"], saved["layers"][0], saved["pair"][0]])
    store = tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="crash"):  # (a run to resume: its save at step 2)
        with ckpt_nb.auto(str(store), namespace=ns, name="cell", every_steps=2, sync=True):
            for _ in ckpt_nb.epochs(1):
                train_nested(ns, 3)
                raise RuntimeError("crash")
    saved = ckpt_nb.CheckpointManager(store).load("latest").extra["ckpt_nb_run"]["variables"]
    train_nested(ns, 1)
    with ckpt_nb.auto(str(store), namespace=ns, name="cell"):
        for _ in ckpt_nb.epochs(1):
            put_back()


def test_a_variable_a_save_could_not_store_or_read_back_is_skipped_by_name(
        tmp_path: Path, capsys) -> None:
    """A long double failed the cell's first save (a raw TypeError, a RecursionError),
    as did a module on the meta device; a frame with a tz-aware, period, interval or
    nullable column was captured and made every checkpoint of the run refused by a
    rollback, or came back holding '<pickled value ...>' strings."""
    import numpy as np
    import pandas as pd
    skipped = {
        "precise": (np.arange(3, dtype=np.longdouble),
                    f"NumPy array of {np.dtype(np.longdouble)}, which no tensor holds"),
        "eps": (np.longdouble(1e-20), f"NumPy {np.dtype(np.longdouble)} scalar"),
        "skeleton": (torch.nn.Linear(4, 4, device="meta"), "module on the meta device"),
        "ghost": (torch.empty(3, device="meta"), "tensor on the meta device"),
        "months": (pd.Series(pd.period_range("2024-01", periods=2, freq="M")),
                   "Series of period[M] would not come back as saved"),
        "flags": (pd.DataFrame({"b": pd.array([True, None], dtype="boolean")}),
                  "its column 'b' (boolean) would not come back as saved"),
        "spans": (pd.DataFrame({"i": pd.interval_range(0, 2)}), "its column 'i' (interval"),
        "names": (pd.DataFrame({"s": pd.array(["a", None], dtype="string")}),
                  "its column 's' (string)")}
    kept = {"log": pd.DataFrame({"t": pd.date_range("2024-01-01", periods=2),
                                 "n": pd.array([1, None], dtype="Int64"), "s": ["a", None]}),
            "words": pd.Series(pd.array(["a", "b"], dtype="string"), name="w"),
            "zoned": pd.DataFrame({"t": pd.date_range("2024-03-10 01:00", periods=3, freq="h",
                                                     tz="America/New_York"),
                                   "utc": pd.date_range("2024-01-01", periods=3, tz="UTC")}),
            "times": pd.DataFrame({"at": pd.to_datetime(["2024-01-01 00:00:01.5", None]),
                                   "took": pd.to_timedelta(["1s", None]), "x": [0.5, 1.0]})}
    model = torch.nn.Linear(2, 1)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
          **{name: value for name, (value, _) in skipped.items()}, **kept}
    with ckpt_nb.auto(str(tmp_path), namespace=ns, every_steps=1, sync=True):
        for i, x in ckpt_nb.batches([torch.ones(2)] * 4):
            ns["opt"].zero_grad()
            model(x).sum().backward()
            ns["opt"].step()
            if i == 1:  # (made in the cell: the save that leaves it out says so, once)
                ns["late"] = skipped["spans"][0]
    out = capsys.readouterr().out
    for name, (_, why) in skipped.items():
        assert f"{name} ({why}" in out.splitlines()[0], name
    assert out.count("not saving late (its column 'i' (interval") == 1, out
    rows = ckpt_nb.CheckpointManager(tmp_path).list()
    assert rows["step"].tolist() == [1, 2, 3, 4]  # (the cell ran to its end)
    ns.update(log=None, words=None, times=None, zoned=None)
    ckpt_nb.rollback("latest", directory=tmp_path, namespace=ns)
    assert all(ns[name].equals(value) for name, value in kept.items())


def test_sets_bytes_sparse_and_nested_tensors_are_variables(
        shell, tmp_path: Path, capsys) -> None:
    run(shell, SETUP)
    run(shell, "seen = {3, 1}\nraw = b'\\x00\\x01'\nadj = torch.eye(3).to_sparse()\n"
               "ragged = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])\n"
               "import numpy as np\nz = np.complex64(1j)")
    run(shell, f"%%ckpt_auto --dir {tmp_path / 'v'}\nopt.step()")
    skipped = capsys.readouterr().out.splitlines()[0].split("; skipped ")[1]
    assert skipped.startswith("digits (Bunch, a dict subclass") and \
        "), loader (DataLoader: " in skipped and "skipped" not in skipped.split("loader (")[1]
    variables = ckpt_nb.CheckpointManager(tmp_path / "v").load("latest") \
        .extra["ckpt_nb_run"]["variables"]
    assert variables["seen"] == {1, 3} and variables["raw"] == b"\x00\x01"
    assert torch.equal(variables["adj"].to_dense(), torch.eye(3)) and variables["z"] == 1j
    assert [t.tolist() for t in variables["ragged"].unbind()] == [[1, 1], [1, 1, 1]]
    shell.user_ns["ragged"] = None
    run(shell, f"%ckpt_rollback latest --dir {tmp_path / 'v'}")
    assert shell.user_ns["ragged"].is_nested


def test_rollback_keeps_a_defaultdict_a_defaultdict(shell, tmp_path: Path) -> None:
    run(shell, SETUP)
    run(shell, "from collections import defaultdict\nlosses = defaultdict(list)")
    cell = (f"%%ckpt_auto --dir {tmp_path / 'dd'} --every-steps 1\n"
            "for step, _ in ckpt_nb.batches(range(3)):\n"
            "    opt.zero_grad(); model(X).sum().backward(); opt.step()\n"
            "    losses['train'].append(step)")
    assert run(shell, cell).success
    losses = shell.user_ns["losses"]
    first = ckpt_nb.CheckpointManager(tmp_path / "dd").list()["id"].iloc[0]
    assert run(shell, f"%ckpt_rollback {first}").success
    assert shell.user_ns["losses"] is losses and losses == {"train": [0]}
    assert run(shell, "losses['val'].append(1.0)").success  # no KeyError: still a defaultdict


@pytest.mark.parametrize("options, problem", [
    ({"every_seconds": float("nan")}, "positive and finite"),
    ({"every_steps": 0}, r"every_steps \(--every-steps\) must be a positive integer"),
    ({"keep": 2.5}, "positive integer"),
    ({"keep_best": 1}, "ranks by a metric"),
    ({"on": ("loss", "lowest")}, "'min' or 'max'"),
    ({"strategy": "fast"}, "must be full, incremental, differential, not 'fast'"),
])
def test_auto_refuses_options_that_cannot_work(tmp_path: Path, options: dict,
                                               problem: str) -> None:
    """The same checks as the magic's (a nan period never fired there either)."""
    with pytest.raises(ValueError, match=problem):
        with ckpt_nb.auto(str(tmp_path), namespace={}, **options):
            pass
    assert ckpt_nb.status() == {"active": False}


def test_a_rollback_that_would_restore_nothing_is_refused_and_the_kernel_stays(
        tmp_path: Path) -> None:
    """(It said "restored nothing" and moved the kernel's position there.)"""
    net = torch.nn.Linear(2, 2)
    mgr = ckpt_nb.CheckpointManager(tmp_path / "s")
    cid = mgr.save(model=net)  # saved as "model"; the kernel calls it "net"
    before = torch.clone(net.weight.data)
    with torch.no_grad():
        net.weight += 1
    with pytest.raises(ckpt_nb.CkptError, match=f"nothing to roll back: {cid} holds model, "
                                                "and this kernel tracks no object of those "
                                                "names \\(it has net\\)"):
        ckpt_nb.rollback(cid, directory=tmp_path / "s", namespace={"net": net})
    assert _session.kernel_position(tmp_path / "s") is None
    assert ckpt_nb.rollback(cid, directory=tmp_path / "s", namespace={"model": net}) == cid
    assert torch.equal(net.weight, before)


def test_the_metric_history_is_stored_by_column_and_comes_back_as_logged(
        tmp_path: Path) -> None:
    """log()'s records are stored by column, a float column as float64 bytes (whose head
    an earlier checkpoint already stored): each save encoded every record as JSON, on the
    training thread, a second a save after 16k steps."""
    net = torch.nn.Linear(2, 2)
    with ckpt_nb.auto(str(tmp_path), namespace={"net": net}, sync=True) as session:
        for i in range(600):
            ckpt_nb.log(loss=float("nan") if i == 7 else i / 7,
                        **({"val": i / 3} if i >= 300 else {}))
        logged = [dict(record) for record in session.history]
    mgr = ckpt_nb.CheckpointManager(tmp_path)
    cid = mgr.resolve("latest")
    stored = mgr.load(cid).extra[_session.RUN_KEY]["history"]
    assert stored["keys"] == [["step", "epoch", "loss"], ["step", "epoch", "loss", "val"]]
    assert stored["runs"] == [[0, 300], [1, 300]]
    columns = mgr._manifest(cid)["state"]["extra"][_session.RUN_KEY]["history"]["columns"]
    assert "__floats__" in columns["loss"] and "__floats__" in columns["val"]
    history = _session.History.from_storable(stored)
    assert math.isnan(history[7]["loss"]) and math.isnan(logged[7]["loss"])
    assert history[:7] + history[8:] == logged[:7] + logged[8:]
    assert [list(r) for r in (history[299], history[300])] == stored["keys"]
    history.append({"step": 600, "loss": 1.0})  # and it goes on by column
    assert column_lengths(history) == {"step": 601, "epoch": 600, "loss": 601, "val": 300}
    with pytest.raises(ckpt_nb.CorruptCheckpointError, match="metric history is malformed"):
        _session.History.from_storable({**stored, "runs": [[0, 601]]})


def column_lengths(history: _session.History) -> dict[str, int]:
    return {key: len(values) for key, values in history.storable()["columns"].items()}


def test_ckpt_list_after_the_cell_lists_the_last_sessions_store(shell, tmp_path: Path) -> None:
    run(shell, SETUP)
    assert run(shell, TRAIN.format(dir=tmp_path / "done", stop="pass")).success
    table = run(shell, "%ckpt_list").result
    assert list(table["id"]) == list(ckpt_nb.CheckpointManager(tmp_path / "done").list()["id"])


def test_quoted_magic_arguments_lose_their_quotes(shell, tmp_path: Path) -> None:
    """IPython's magic arguments keep quotes: --dir "my runs" named a folder with quotes
    in its name, and --track "model,opt" tracked nothing."""
    run(shell, SETUP)
    cell = TRAIN.format(dir='"my runs"', stop="pass").replace(
        "--every-steps 7", '--every-steps 7 --every "10m" --track "model,opt,sched"')
    assert run(shell, cell).success
    assert (tmp_path / "my runs").is_dir() and not (tmp_path / '"my runs"').exists()
    rows = ckpt_nb.CheckpointManager(tmp_path / "my runs").list()
    assert set(ckpt_nb.CheckpointManager(tmp_path / "my runs").load(rows["id"].iloc[-1])
               .state) >= {"model", "opt", "sched"}
    assert run(shell, f'%ckpt_rollback "{rows["id"].iloc[1]}" --dir "my runs"').success


def test_a_traceback_in_the_cell_names_the_cell_as_ipython_does(shell, tmp_path: Path,
                                                                 capsys) -> None:
    """The body's frames said "Cell In[0]" whatever the cell's number."""
    run(shell, SETUP)
    capsys.readouterr()
    failed = shell.run_cell(f"%%ckpt_auto --dir {tmp_path / 'tb'}\nfor i in range(3):\n"
                            "    1 / 0\n", store_history=True)
    assert isinstance(failed.error_in_exec, ZeroDivisionError)
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # (colours)
    shown = re.findall(r"Cell In\[(\d+)\], line (\d+)", out)
    assert shown == [(str(failed.execution_count), "1"), (str(failed.execution_count), "2")]
    assert failed.execution_count > 0


def test_a_cell_that_does_not_parse_or_is_interrupted_shows_none_of_ckpt_nbs_frames(
        shell, tmp_path: Path, capsys) -> None:
    """A SyntaxError showed ckpt_nb's and ast's frames and "File <unknown>"; an interrupt
    the frames of torch's optimizer hook and of ckpt_nb's session that raised it."""
    run(shell, SETUP)
    capsys.readouterr()
    broken = shell.run_cell(f"%%ckpt_auto --dir {tmp_path / 'p'}\nfor i in range(3)\n"
                            "    pass\n", store_history=True)
    assert isinstance(broken.error_in_exec, UsageError)
    out = re.sub(r"\x1b\[[0-9;]*m", "", "".join(capsys.readouterr()))
    assert f'File "Cell In[{broken.execution_count}]", line 1' in out
    assert "SyntaxError: expected ':'" in out and ".py" not in out
    for interrupts, stop in ((1, INTERRUPT), (2, f"{INTERRUPT}; {INTERRUPT}")):
        run(shell, "STOP_AT = (0, 2)")
        result = run(shell, TRAIN.format(dir=tmp_path / f"i{interrupts}", stop=stop))
        assert isinstance(result.error_in_exec, KeyboardInterrupt)
        out = re.sub(r"\x1b\[[0-9;]*m", "", "".join(capsys.readouterr()))
        assert "_session.py" not in out and "optimizer.py" not in out, out
        if interrupts == 1:
            assert "KeyboardInterrupt: the cell stopped at step 3: run it again" in out, out


def test_a_refused_resume_shows_the_cells_frame_not_ckpt_nbs(shell, tmp_path: Path,
                                                              capsys) -> None:
    """A resume refused (the model built wider since the stop) showed the three frames of
    ckpt_nb that raised it: its loop helper's, epochs()' and the resume's. IPython hides
    none but the last, where the error is raised."""
    run(shell, SETUP)
    run(shell, "STOP_AT = (0, 2)")
    stopped = run(shell, TRAIN.format(dir=tmp_path / "r", stop=INTERRUPT))
    assert isinstance(stopped.error_in_exec, KeyboardInterrupt)
    run(shell, "model = torch.nn.Sequential(torch.nn.Linear(64, 40), torch.nn.ReLU(), "
               "torch.nn.Dropout(0.1), torch.nn.Linear(40, 10))\n"
               "opt = torch.optim.AdamW(model.parameters(), lr=1e-2)\n"
               "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)")
    capsys.readouterr()
    refused = run(shell, TRAIN.format(dir=tmp_path / "r", stop=INTERRUPT))
    assert isinstance(refused.error_in_exec, StateMismatchError), refused
    out = re.sub(r"\x1b\[[0-9;]*m", "", "".join(capsys.readouterr()))
    assert "for epoch in ckpt_nb.epochs(3):" in out and "not resuming checkpoint" in out, out
    assert re.findall(r"ckpt_nb/_\w+\.py:\d+, in ([\w.]+)", out) == ["AutoSession._resume_now"], out


def test_a_metric_trigger_on_a_metric_never_logged_says_so(shell, tmp_path: Path,
                                                           capsys) -> None:
    run(shell, SETUP)
    cell = TRAIN.format(dir=tmp_path / "typo", stop="pass").replace(
        "--every-steps 7", "--on los:min")
    assert run(shell, cell).success
    assert "--on los:min never fired: the cell logged no 'los' (it logged loss" \
        in capsys.readouterr().out


def test_a_metric_trigger_on_a_name_no_keyword_takes_hints_a_call_that_parses(
        shell, tmp_path: Path, capsys) -> None:
    """--on 123:min hinted ckpt_nb.log(123=...), a SyntaxError."""
    run(shell, SETUP)
    cell = TRAIN.format(dir=tmp_path / "digits", stop="pass").replace(
        "--every-steps 7", "--on 123:min")
    assert run(shell, cell).success
    assert "--on 123:min never fired: the cell logged no '123' (it logged loss; " \
        "ckpt_nb.log(**{'123': ...}) feeds it)" in capsys.readouterr().out


def test_numpy_and_python_generator_objects_are_tracked_and_resume_bit_exact(
        shell, tmp_path: Path, capsys) -> None:
    """np.random.default_rng() and random.Random() objects were skipped ("Generator"), and
    a resumed run drew other numbers."""
    setup = SETUP + "import numpy as np, random\nrng = np.random.default_rng(0)\n" \
        "jitter = random.Random(0)\n"  # ("rng" is a checkpoint's field too: kept apart)
    cell = TRAIN.replace("loss = torch.nn.functional.cross_entropy(model(xb), yb)",
                         "loss = torch.nn.functional.cross_entropy(model(xb), yb) * "
                         "(1 + 0.1 * rng.random() + 0.1 * jitter.random())")
    expected, expected_history = reference(shell, tmp_path, setup, cell)
    run(shell, setup)
    capsys.readouterr()
    interrupt_at(shell, cell, tmp_path / "gen", (1, 4))
    tracking = capsys.readouterr().out.splitlines()[0]
    assert "rng" in tracking.split(";")[0] and "jitter" in tracking.split(";")[0], tracking
    rerun_ends_as_the_reference(shell, cell, tmp_path / "gen", expected, expected_history)
    rows = ckpt_nb.CheckpointManager(tmp_path / "gen").list()
    capsys.readouterr()
    assert run(shell, f"%ckpt_rollback {rows['id'].iloc[1]} --dir {tmp_path / 'gen'}").success
    assert "rng" in capsys.readouterr().out.split("restored")[1]


SMALL = """
import torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [torch.ones(4, 2)] * 4
"""

PRETRAIN = """%%ckpt_auto --dir {dir} --every-steps 2
# pretraining
for epoch in ckpt_nb.epochs(10):
    for i, x in ckpt_nb.batches(data):
        if epoch == 7: raise RuntimeError("stopped pretraining here")
        opt.zero_grad(); model(x).sum().backward(); opt.step()
"""

OTHER_CELL = """%%ckpt_auto --dir {dir}
# fine-tuning, another cell
ran = []
for epoch in ckpt_nb.epochs(10):
    ran.append(epoch)
    for i, x in ckpt_nb.batches(data):
        opt.zero_grad(); model(x).sum().backward(); opt.step()
"""


def test_without_cell_ids_another_cell_never_takes_over_a_stopped_run(
        shell, tmp_path: Path, capsys) -> None:
    """A cell run after a stopped one (nbclient sends no cell ids) was taken for it
    edited, and ran epochs 7..9 from the pretraining's state. An edited cell resumes
    after the rollback the message names."""
    run(shell, SMALL)
    assert isinstance(run(shell, PRETRAIN.format(dir=tmp_path)).error_in_exec, RuntimeError)
    stopped = ckpt_nb.CheckpointManager(tmp_path).list()["id"].iloc[-1]
    capsys.readouterr()
    assert run(shell, OTHER_CELL.format(dir=tmp_path)).success
    out = capsys.readouterr().out
    assert shell.user_ns["ran"] == list(range(10)) and "resumed" not in out
    assert f"to resume it, `%ckpt_rollback {stopped}`, then run this cell again" in out
    edited = PRETRAIN.replace("epoch == 7", "epoch == 99")
    assert run(shell, f"%ckpt_rollback {stopped}").success
    capsys.readouterr()
    assert run(shell, edited.format(dir=tmp_path) + "print('done', epoch)").success
    out = capsys.readouterr().out
    assert "this cell changed since" in out and f"resumed from {stopped} (epoch 7," in out


def test_an_auto_block_resumes_only_the_run_of_its_name(tmp_path: Path, capsys) -> None:
    """auto(name="finetune") resumed the unfinished run of "pretrain" (epochs 7..9), and
    after a rollback to that run an explicit name must not be taken for it edited."""
    model = torch.nn.Linear(2, 1)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}

    def train(name: str, stop: int | None = None) -> list[int]:
        ran = []
        with ckpt_nb.auto(str(tmp_path), namespace=ns, name=name, every_steps=2):
            for epoch in ckpt_nb.epochs(10):
                ran.append(epoch)
                for _, x in ckpt_nb.batches([torch.ones(4, 2)] * 4):
                    if epoch == stop:
                        raise KeyboardInterrupt
                    ns["opt"].zero_grad()
                    ns["model"](x).sum().backward()
                    ns["opt"].step()
        return ran

    with pytest.raises(KeyboardInterrupt):
        train("pretrain", stop=7)
    stopped = ckpt_nb.CheckpointManager(tmp_path).list()["id"].iloc[-1]
    assert train("finetune") == list(range(10))
    ckpt_nb.rollback(stopped, directory=tmp_path, namespace=ns)
    capsys.readouterr()
    assert train("finetune") == list(range(10))
    assert "resumed" not in capsys.readouterr().out
    ckpt_nb.rollback(stopped, directory=tmp_path, namespace=ns)
    assert train("pretrain") == [7, 8, 9]


def test_on_a_bare_metric_name_ranks_the_way_the_name_says_or_asks(
        shell, tmp_path: Path, capsys) -> None:
    """--on acc meant min: --keep-best 1 kept the worst accuracy."""
    assert _session.parse_metric_trigger("val_loss") == ("val_loss", "min")
    assert _session.parse_metric_trigger("val_accuracy") == ("val_accuracy", "max")
    assert _session.parse_metric_trigger("f1:min") == ("f1", "min")
    for ambiguous in ("lr", "score_loss"):
        result = run(shell, f"%ckpt_auto --on {ambiguous}")
        assert isinstance(result.error_in_exec, UsageError)
        assert f"--on {ambiguous}:min or --on {ambiguous}:max" in str(result.error_in_exec)
    run(shell, SMALL)
    cell = (f"%%ckpt_auto --dir {tmp_path} --on acc --keep-best 1 --keep 1\n"
            "for epoch in ckpt_nb.epochs(4):\n"
            "    for i, x in ckpt_nb.batches(data):\n"
            "        opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()\n"
            "    ckpt_nb.log(acc=[0.9, 0.1, 0.5, 0.6][epoch])")
    assert run(shell, cell).success
    table = run(shell, f"%ckpt_list {tmp_path}").result
    assert table.loc[table["best"], "acc"].tolist() == [0.9]


def test_ckpt_list_after_the_session_marks_its_best_and_the_head(
        shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the cell, %ckpt_list opened the store with no metric: best and head were
    False on every row."""
    run(shell, SMALL)
    cell = (f"%%ckpt_auto --dir {tmp_path} --on val_loss:min --keep-best 2 --keep 3\n"
            "for epoch in ckpt_nb.epochs(6):\n"
            "    for i, x in ckpt_nb.batches(data):\n"
            "        opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()\n"
            "    ckpt_nb.log(val_loss=[5, 1, 4, 3, 2, 6][epoch])")
    assert run(shell, cell).success
    assert run(shell, "%ckpt_rollback best").success
    table = run(shell, "%ckpt_list").result
    # (saved where val_loss ranked among the 2 best logged, and at the end, 6; kept: the
    # best 2)
    assert sorted(table.loc[table["best"], "val_loss"]) == [1.0, 2.0]
    assert table.loc[table["head"], "val_loss"].tolist() == [1.0]
    monkeypatch.setattr(_session, "_positions", {})  # a fresh kernel: the ranking stays
    table = run(shell, f"%ckpt_list {tmp_path}").result
    assert sorted(table.loc[table["best"], "val_loss"]) == [1.0, 2.0]
    assert not table["head"].any()


def saved_with_record(store: Path, change: Any) -> tuple[str, dict[str, Any]]:
    """A checkpoint whose run record is a real unfinished one ``change``d, saved as the
    store's newest; and a fresh namespace of the same objects."""
    model = torch.nn.Linear(4, 4)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1), "lr": 0.1}
    with pytest.raises(RuntimeError, match="crash"):
        with ckpt_nb.auto(str(store), namespace=ns, name="cell", every_steps=1):
            for epoch in ckpt_nb.epochs(2):
                for _, x in ckpt_nb.batches([torch.ones(1, 4)] * 3):
                    if epoch == 1:
                        raise RuntimeError("crash")  # (an unfinished run)
                    ns["opt"].zero_grad()
                    ns["model"](x).sum().backward()
                    ns["opt"].step()
    with ckpt_nb.CheckpointManager(store) as mgr:
        record = mgr.load("latest").extra["ckpt_nb_run"]
        change(record)
        cid = mgr.save(model=ns["model"], opt=ns["opt"], extra={"ckpt_nb_run": record})
    fresh = torch.nn.Linear(4, 4)
    return cid, {"model": fresh, "opt": torch.optim.SGD(fresh.parameters(), lr=0.1), "lr": 0.5}


def test_rollback_puts_back_no_builtin_the_notebook_does_not_have(
        shell, tmp_path: Path) -> None:
    """A run record naming len and print shadowed them: print(len([1, 2])) failed."""
    cid, _ = saved_with_record(tmp_path, lambda r: r["variables"].update(
        {"len": "hijacked", "print": 0, "lr": 0.25}))
    run(shell, "import torch\nmodel = torch.nn.Linear(4, 4)\nlr = 0.1")
    result = run(shell, f"%ckpt_rollback {cid} --dir {tmp_path}")
    assert result.success, result.error_in_exec
    assert run(shell, "shown = str(len([1, 2]))\nprint(shown)").success
    assert shell.user_ns["shown"] == "2" and shell.user_ns["lr"] == 0.25
    assert "len" not in shell.user_ns and "print" not in shell.user_ns
    run(shell, "len = 'mine'")  # a notebook's own variable of that name is put back
    assert run(shell, f"%ckpt_rollback {cid} --dir {tmp_path}").success
    assert shell.user_ns["len"] == "hijacked"


@pytest.mark.parametrize("label,change", [
    ("dunder", lambda r: r["variables"].update({"__builtins__": {"x": 1}})),
    ("no name", lambda r: r["variables"].update({"not a name!": 2})),
    ("keyword", lambda r: r["variables"].update({"class": 2})),
    ("a list", lambda r: r.update(variables=[1, 2])),
    ("step", lambda r: r.update(step="x")),
    ("history", lambda r: r.update(history={"keys": 1})),
])
def test_a_malformed_run_record_is_refused_before_anything_is_rolled_back(
        tmp_path: Path, label: str, change: Any) -> None:
    """They raised raw AttributeError, TypeError, KeyError, with the model already
    rolled back."""
    cid, ns = saved_with_record(tmp_path, change)
    before = [t.clone() for t in ns["model"].state_dict().values()]
    with pytest.raises(ckpt_nb.CorruptCheckpointError, match=f"checkpoint {cid}'s run record"):
        ckpt_nb.rollback(cid, directory=tmp_path, namespace=ns)
    assert same(list(ns["model"].state_dict().values()), before) and ns["lr"] == 0.5
    assert "df" not in ns and "__builtins__" not in ns


def unreadable_frames() -> list[Any]:
    """Stored frames that do not read back: malformed, or holding the pickles an
    earlier capture of a tz-aware or string-with-NA column made."""
    import pandas as pd

    def frame(data: list[Any], dtype: str) -> dict[str, Any]:
        return {"__frame__": "frame", "data": [data], "columns": ["a"], "index": [0, 1],
                "dtypes": [dtype], "name": None}

    return [pytest.param(frame([1, 2], "banana"), id="frame dtype"),
            pytest.param({"__frame__": "frame"}, id="frame keys"),
            pytest.param(frame([pd.Timestamp(0, tz="UTC")] * 2, "datetime64[ns, UTC]"),
                         id="tz-aware"),
            pytest.param(frame(["a", pd.NA], "string"), id="string with NA")]


@pytest.mark.filterwarnings("ignore:checkpoint .* are pickles")  # (the store's own)
@pytest.mark.parametrize("stored", unreadable_frames())
def test_a_variable_that_does_not_read_back_is_left_out_and_the_rest_rolled_back(
        tmp_path: Path, capsys, stored: dict[str, Any]) -> None:
    """One such variable made every checkpoint of the run refused (a tz-aware column:
    "Cannot convert input [<pickled value ...>] to Timestamp"), or came back silently
    holding '<pickled value ...>' strings (a string column with NA)."""
    cid, ns = saved_with_record(tmp_path, lambda r: r["variables"].update(df=stored, lr=0.25))
    ckpt_nb.rollback(cid, directory=tmp_path, namespace=ns)
    saved = ckpt_nb.CheckpointManager(tmp_path).load(cid).state["model"]
    assert same(list(ns["model"].state_dict().values()), list(saved.values()))
    assert ns["lr"] == 0.25 and "df" not in ns
    line = capsys.readouterr().out
    assert f"rolled back to {cid}" in line and "left out (they do not read back): df (" in line


def test_a_resume_leaves_out_a_variable_that_does_not_read_back(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """Running the cell again after a crash failed as the rollback did."""
    cid, ns = saved_with_record(tmp_path, lambda r: r["variables"].update(
        df={"__frame__": "frame"}, lr=0.25))
    monkeypatch.setattr(_session, "_positions", {})  # a fresh kernel resumes the newest
    capsys.readouterr()
    with ckpt_nb.auto(str(tmp_path), namespace=ns, name="cell"):
        for epoch in ckpt_nb.epochs(2):
            assert epoch == 1 and ns["lr"] == 0.25 and "df" not in ns
    line = next(x for x in capsys.readouterr().out.splitlines() if "resumed from" in x)
    assert cid in line, line
    assert line.endswith("left out (they do not read back): df (KeyError: 'data')"), line


@pytest.mark.parametrize("change", [
    lambda r: r.pop("loop"), lambda r: r.pop("best"),
    lambda r: r["loop"].update(epoch_rng="x"), lambda r: r["loop"].update(next_batch=-1),
    lambda r: r["loop"].update(loader_rng=[1, 2])])
def test_resuming_a_malformed_run_record_says_so_before_the_block_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Any) -> None:
    """KeyError and TypeError came out of ckpt_nb.epochs()."""
    cid, ns = saved_with_record(tmp_path, change)
    monkeypatch.setattr(_session, "_positions", {})  # a fresh kernel resumes the newest
    before = [t.clone() for t in ns["model"].state_dict().values()]
    ran = False
    with pytest.raises(ckpt_nb.CorruptCheckpointError, match=f"checkpoint {cid}'s run record"
                       ".*--no-resume"):
        with ckpt_nb.auto(str(tmp_path), namespace=ns, name="cell"):
            ran = True
    assert not ran and same(list(ns["model"].state_dict().values()), before)
    assert ckpt_nb.status() == {"active": False}


def test_a_rollback_line_leaves_out_what_the_checkpoint_does_not_have(
        tmp_path: Path, capsys) -> None:
    """It said "(epoch None, step None)"."""
    model = torch.nn.Linear(2, 2)
    with ckpt_nb.CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(model=model)
    ckpt_nb.rollback(cid, directory=tmp_path, namespace={"model": model})
    assert f"rolled back to {cid}: restored model;" in capsys.readouterr().out
    with ckpt_nb.CheckpointManager(tmp_path) as mgr:  # (one object left out is "it")
        cid = mgr.save(model=model, ema=torch.nn.Linear(2, 2))
    ckpt_nb.rollback(cid, directory=tmp_path, namespace={"model": model})
    assert "restored model (not ema: nothing here takes it)" in capsys.readouterr().out


FINE_TUNE_OPT2 = """%%ckpt_auto --dir {dir}
for epoch in ckpt_nb.epochs(1):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt2.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt2.step()
    sched2.step()
"""


def test_a_rollback_names_the_tracked_objects_the_checkpoint_does_not_hold(
        shell, tmp_path: Path, capsys) -> None:
    """A rollback to the pre-train's end left the fine-tune's optimizer, made after that
    end was saved, with the momentum the fine-tune gave it, and said nothing: the
    fine-tune run again from the rolled-back model went otherwise than the first."""
    run(shell, SETUP)
    assert run(shell, TRAIN.format(dir=tmp_path, stop="pass")).success
    end = str(ckpt_nb.CheckpointManager(tmp_path).list().id.iloc[-1])
    run(shell, "opt2 = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)\n"
               "sched2 = torch.optim.lr_scheduler.StepLR(opt2, 5)\nnet = model")
    assert run(shell, FINE_TUNE_OPT2.format(dir=tmp_path)).success
    momentum = [s["momentum_buffer"].clone() for s in shell.user_ns["opt2"].state.values()]
    capsys.readouterr()
    assert run(shell, f"%ckpt_rollback {end}").success
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"ckpt_nb: rolled back to {end} ") and line.endswith(
        f"; the next save starts a branch from it; not in {end}, left as they are: opt2 "
        "(SGD), sched2 (StepLR); run the cells that make them again to start them afresh"), line
    assert "net" not in line.partition("left as")[2]  # (model's other name: put back)
    assert len(momentum) == 4 and same(  # (left as they are, as said)
        [s["momentum_buffer"] for s in shell.user_ns["opt2"].state.values()], momentum)
    run(shell, "del sched2")
    assert run(shell, f"%ckpt_rollback {end}").success
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        f"; not in {end}, left as it is: opt2 (SGD); run the cell that makes it again to "
        "start it afresh")


def test_a_track_that_leaves_out_a_scheduler_of_a_tracked_optimizer_says_so(
        shell, tmp_path: Path, capsys) -> None:
    """--track model,opt with the cell stepping sched (StepLR of opt): a resume put opt's
    learning rate back as saved and sched not, and the run went on at another rate
    without a word."""
    run(shell, SETUP)
    train = TRAIN.format(dir="{dir}", stop="pass").replace("--every-steps 7", "{options}") \
        .replace("ckpt_nb.epochs(3)", "ckpt_nb.epochs(1)")  # (told as the cell starts)
    assert run(shell, train.format(dir=tmp_path / "a", options="--track model,opt")).success
    told = ("ckpt_nb: --track leaves out sched (StepLR of opt), which sets the learning rate "
            "of a tracked optimizer: a resume puts the optimizer back as saved, not the "
            "scheduler, and the run goes on at another rate; --track model,opt,sched takes it\n")
    out = capsys.readouterr().out
    assert out.startswith("ckpt_nb: tracking model, opt\n" + told), out
    for options in ("--track model,opt,sched", ""):
        assert run(shell, train.format(dir=tmp_path / "b", options=options)).success
        assert "leaves out" not in capsys.readouterr().out, options
    run(shell, "warm = torch.optim.lr_scheduler.LinearLR(opt)")
    with ckpt_nb.auto(tmp_path / "c", namespace=shell.user_ns, track="model,opt"):
        pass
    assert "ckpt_nb: track= leaves out sched (StepLR of opt), warm (LinearLR of opt), which " \
        "set the learning rate of a tracked optimizer: a resume puts the optimizer back as " \
        'saved, not the schedulers, and the run goes on at another rate; ' \
        'track="model,opt,sched,warm" takes them\n' in capsys.readouterr().out


def test_a_track_that_leaves_out_the_optimizer_of_a_tracked_model_says_so(
        shell, tmp_path: Path, capsys) -> None:
    """--track model with the cell stepping opt (AdamW over model's parameters): a resume
    put the model back and restarted opt's moments, and the run was not the unstopped one
    without a word (the start line said only "tracking model"). Its scheduler is named
    with it; an optimizer of an untracked module is not."""
    run(shell, SETUP + "other = torch.nn.Linear(2, 2)\n"
                       "opt_other = torch.optim.SGD(other.parameters(), lr=0.1)")
    train = TRAIN.format(dir="{dir}", stop="pass").replace("--every-steps 7", "{options}") \
        .replace("ckpt_nb.epochs(3)", "ckpt_nb.epochs(1)")  # (told as the cell starts)
    assert run(shell, train.format(dir=tmp_path / "a", options="--track model")).success
    out = capsys.readouterr().out
    assert out.startswith(
        "ckpt_nb: tracking model\n"
        "ckpt_nb: --track leaves out opt (AdamW over model's parameters) and sched (StepLR of "
        "opt): a resume restarts their state (an optimizer's moments and step count), and the "
        "run does not go on as it would have; --track model,opt,sched takes them\n"), out
    assert "opt_other" not in out
    for options in ("--track model,opt,sched", ""):
        assert run(shell, train.format(dir=tmp_path / "b", options=options)).success
        assert "leaves out" not in capsys.readouterr().out, options
    run(shell, "del sched\nhead = model[3]")
    with ckpt_nb.auto(tmp_path / "c", namespace=shell.user_ns, track="head"):
        pass
    assert "ckpt_nb: track= leaves out opt (AdamW over head's parameters): a resume restarts " \
        "its state (an optimizer's moments and step count), and the run does not go on as it " \
        'would have; track="head,opt" takes it\n' in capsys.readouterr().out


def test_session_help_shows_docstrings_not_section_comments() -> None:
    """help(AutoSession) showed "# -- loop helpers ---" as the doc of epochs."""
    shown = pydoc.render_doc(ckpt_nb.AutoSession, renderer=pydoc.plaintext)
    assert "# --" not in shown
    for name, member in vars(_session.AutoSession).items():
        if callable(member) and not name.startswith("_"):
            assert inspect.getdoc(member), name
    assert inspect.getdoc(ckpt_nb.status)


def test_a_stopped_cell_resumes_after_another_cell_ran_in_between(shell, tmp_path: Path,
                                                                  capsys) -> None:
    """The stop said "run it again to go on"; once another cell had saved, the kernel's
    position was that cell's finished run, and the stopped cell trained from the top."""
    run(shell, SETUP)
    crash = TRAIN.format(dir=tmp_path / "both", stop="pass").replace(
        "        opt.zero_grad()",
        "        if STOP_AT == (epoch, i):\n            raise RuntimeError('diverged')\n"
        "        opt.zero_grad()")  # (at a consistent point: the stop saves)
    run(shell, "STOP_AT = (0, 2)")
    assert isinstance(run(shell, crash, cell_id="train").error_in_exec, RuntimeError)
    run(shell, "STOP_AT = None")
    assert run(shell, FINE_TUNE.format(dir=tmp_path / "both"), cell_id="fine-tune").success
    capsys.readouterr()
    # (fixed: the resume puts STOP_AT back as saved, so the raise goes)
    fixed = TRAIN.format(dir=tmp_path / "both", stop="pass")
    assert run(shell, fixed, cell_id="train").success
    assert "resumed from" in capsys.readouterr().out


def test_ckpt_status_after_a_cell_names_the_store_the_other_magics_open(
        shell, tmp_path: Path, capsys) -> None:
    run(shell, SETUP)
    assert run(shell, TRAIN.format(dir=tmp_path / "st", stop="pass")).success
    capsys.readouterr()
    run(shell, "%ckpt_status")
    out = capsys.readouterr().out
    assert "no session active" in out and f"the last one's store, {tmp_path / 'st'}" in out


def test_the_magics_open_the_last_sessions_store_after_a_cd(shell, tmp_path: Path,
                                                             capsys) -> None:
    """A cell on the default store (or a relative --dir), then %cd: %ckpt_list,
    %ckpt_status and %ckpt_rollback took the store's relative path in the new folder
    ("no checkpoint store at checkpoints/session"), not the store the cell wrote."""
    run(shell, "import torch\nmodel = torch.nn.Linear(3, 2)\n"
               "opt = torch.optim.SGD(model.parameters(), lr=0.1)")
    step = "opt.zero_grad(); model(torch.ones(1, 3)).sum().backward(); opt.step()"
    assert run(shell, f"%%ckpt_auto\n{step}").success
    first = ckpt_nb.CheckpointManager(tmp_path / "checkpoints" / "session").list()["id"].iloc[-1]
    saved = [t.clone() for t in shell.user_ns["model"].state_dict().values()]
    (tmp_path / "elsewhere").mkdir()
    run(shell, "%cd elsewhere")
    run(shell, step)  # (trained past the checkpoint)
    capsys.readouterr()
    assert run(shell, "%ckpt_status").success
    assert str(tmp_path / "checkpoints" / "session") in capsys.readouterr().out
    listed = run(shell, "%ckpt_list")
    assert listed.success and list(listed.result["id"]) == [first]
    assert run(shell, "%ckpt_rollback latest").success
    assert f"rolled back to {first}" in capsys.readouterr().out
    assert same(list(shell.user_ns["model"].state_dict().values()), saved)
    assert not (tmp_path / "elsewhere" / "checkpoints").exists()


def test_a_cell_run_after_its_head_was_deleted_elsewhere_descends_from_the_heir(
        shell, tmp_path: Path) -> None:
    """The explorer's Delete of the kernel's checkpoint: the next run started a new root."""
    run(shell, SETUP)
    cell = TRAIN.format(dir=tmp_path / "h", stop="pass")
    assert run(shell, cell).success
    before = ckpt_nb.CheckpointManager(tmp_path / "h").list()["id"].tolist()
    with ckpt_nb.CheckpointManager(tmp_path / "h") as other:
        other.delete(before[-1])
    assert run(shell, cell + "# edited\n").success  # (another run, not a resume)
    rows = ckpt_nb.CheckpointManager(tmp_path / "h").list().set_index("id")
    first_new = [cid for cid in rows.index if cid not in before][0]
    assert rows.loc[first_new, "parent"] == before[-2]


def test_rollback_to_an_id_of_another_store_names_the_store_and_dir(shell,
                                                                   tmp_path: Path) -> None:
    """It said only "no checkpoint ... in <the last session's store>": the id was from
    the store of an earlier cell, which --dir opens."""
    run(shell, SMALL)
    cell = ("%%ckpt_auto --dir {dir}\n"
            "for x in data:\n"
            "    opt.zero_grad(); model(x).sum().backward(); opt.step()")
    assert run(shell, cell.format(dir=tmp_path / "first")).success
    first = ckpt_nb.CheckpointManager(tmp_path / "first").list()["id"].iloc[-1]
    assert run(shell, cell.format(dir=tmp_path / "second")).success
    result = run(shell, f"%ckpt_rollback {first}")
    assert isinstance(result.error_in_exec, UsageError)
    message = str(result.error_in_exec)
    assert f"in {tmp_path / 'second'}: " in message and "file://" not in message
    assert f"%ckpt_rollback {first} --dir PATH" in message
    assert run(shell, f"%ckpt_rollback {first} --dir {tmp_path / 'first'}").success


def test_a_resume_names_every_variable_it_puts_back_over_a_change(
        shell, tmp_path: Path, capsys) -> None:
    """A DataFrame changed between the stop and the rerun was put back silently (only
    numbers, strings and the like were named); what the loop itself added to a list
    after the save is no change of the user's."""
    run(shell, SMALL + "import pandas as pd\nresults = pd.DataFrame({'a': [1]})\n"
            "seen = []\nclip = 1e9")
    cell = (f"%%ckpt_auto --dir {tmp_path} --every-steps 3\n"
            "for epoch in ckpt_nb.epochs(3):\n"
            "    for i, x in ckpt_nb.batches(data):\n"
            "        seen.append((epoch, i))\n"
            "        if (epoch, i) == (1, 2) and clip > 1: raise RuntimeError('exploded')\n"
            "        opt.zero_grad(); model(x).sum().backward(); opt.step()")
    assert isinstance(run(shell, cell).error_in_exec, RuntimeError)
    run(shell, "results = pd.DataFrame({'a': [1, 2, 3]}); clip = 1.0")
    capsys.readouterr()
    run(shell, cell)
    line = next(x for x in capsys.readouterr().out.splitlines() if "resumed from" in x)
    assert line.endswith("; put back as saved: results (DataFrame), "
                         "clip = 1000000000.0 (was 1.0)"), line
    assert len(shell.user_ns["results"]) == 1


ENDS_ON_A_TRIGGER = """%%ckpt_auto --dir {dir} --every-steps 4 --keep 3 --on loss:min
for epoch in ckpt_nb.epochs(3):
    for i, x in ckpt_nb.batches(data):
        opt.zero_grad(); loss = model(x).sum(); loss.backward(); opt.step()
    ckpt_nb.log(loss=loss.item())
{after}
"""


def test_a_run_ends_with_one_checkpoint_of_its_last_state(shell, tmp_path: Path) -> None:
    """The last "every 4 steps" save and the "end of cell" one held the same state: two
    rows of step 12, and --keep 3 kept one checkpoint fewer of the run."""
    run(shell, SMALL)
    assert run(shell, ENDS_ON_A_TRIGGER.format(dir=tmp_path / "one", after="")).success
    with _session.listing_manager(tmp_path / "one") as manager:  # (its --on: best)
        rows = manager.list()
    assert rows["step"].tolist() == [4, 8, 12]
    assert rows["note"].iloc[-1] == "end of cell"
    assert rows["parent"].iloc[-1] == rows["id"].iloc[1]
    assert rows["loss"].iloc[-1] == shell.user_ns["loss"].item() and rows["best"].iloc[-1]
    assert run(shell, "%ckpt_rollback best").success
    # What the code after the loop changed without an optimizer step is another state.
    run(shell, SMALL)
    after = "with torch.no_grad(): model.weight.mul_(0)"
    assert run(shell, ENDS_ON_A_TRIGGER.format(dir=tmp_path / "two", after=after)).success
    rows = ckpt_nb.CheckpointManager(tmp_path / "two").list()
    assert rows["step"].tolist() == [8, 12, 12]
    # One given a note meanwhile (by another process: the explorer, the CLI) is kept.
    run(shell, SMALL)
    after = ("from ckpt_nb import _session\n_session.active().writer.wait()\n"  # (step 12's in)
             f"ckpt_nb.CheckpointManager({str(tmp_path / 'three')!r}).annotate('latest', 'keep')")
    assert run(shell, ENDS_ON_A_TRIGGER.format(dir=tmp_path / "three", after=after)).success
    rows = ckpt_nb.CheckpointManager(tmp_path / "three").list()
    assert rows["step"].tolist() == [8, 12, 12] and rows["note"].tolist()[1:] == [
        "keep", "end of cell"]


def test_a_finished_cell_run_again_counts_its_steps_on(shell, tmp_path: Path,
                                                       capsys) -> None:
    """Run again on the same model, its checkpoints said step 4, 8, 12 again under the
    step-12 end of the first run: the steps went back along the branch. A new model (the
    set-up cell run again) starts at step 0; an interrupted second run resumes its step."""
    run(shell, SMALL + "STOP = None")
    cell = ENDS_ON_A_TRIGGER.replace(" --keep 3", "").format(
        dir=tmp_path / "on", after="").replace(
        "        opt.zero_grad()", f"        if STOP == (epoch, i): {INTERRUPT}\n"
        "        opt.zero_grad()")
    assert run(shell, cell).success
    run(shell, "STOP = (1, 2)")
    assert isinstance(run(shell, cell).error_in_exec, KeyboardInterrupt)
    run(shell, "STOP = None")
    capsys.readouterr()
    assert run(shell, cell).success
    out = capsys.readouterr().out
    assert "(epoch 1, batch 3, step 19); put back as saved: STOP (tuple, was NoneType)" in out
    rows = ckpt_nb.CheckpointManager(tmp_path / "on").list()
    assert rows["step"].tolist() == [4, 8, 12, 16, 19, 20, 24]
    assert rows["epoch"].tolist() == [1, 2, 3, 1, 1, 2, 3]
    assert (rows["parent"].iloc[1:] == rows["id"].iloc[:-1].values).all()
    run(shell, SMALL + "STOP = None")  # (the resume put back STOP = (1, 2))
    assert run(shell, cell).success
    rows = ckpt_nb.CheckpointManager(tmp_path / "on").list()
    assert rows["step"].tolist()[-3:] == [4, 8, 12]
    assert rows["parent"].iloc[-3] is None and rows["branch"].iloc[-3] != "main"


def test_a_warning_from_a_magic_is_ckpt_nbs_one_line_and_a_failed_save_prints_once(
        shell, tmp_path: Path, capsys) -> None:
    """In a notebook, warnings pointed at ckpt_nb's lines, then at IPython's (events.py:
    101, "func(*args, **kwargs)"), and a failed background save printed twice."""
    import warnings
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        mgr.save(torch.nn.Linear(2, 2))
    (tmp_path / "s" / "catalog.sqlite").unlink()
    run(shell, SETUP)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(shell, f"%ckpt_auto --dir {tmp_path / 's'} --every-steps 1")
        session = _session.active()

        def broken(*args, **kwargs):
            raise OSError(28, "No space left on device")

        session.manager.save_state = broken  # a full disk, which cannot be made real here
        run(shell, "opt.zero_grad(); model(X).sum().backward(); opt.step()")
        run(shell, "opt.zero_grad(); model(X).sum().backward(); opt.step()")
    rebuilt = [w for w in caught if "was missing, so it was rebuilt" in str(w.message)]
    assert [(w.filename, w.lineno) for w in rebuilt] == [("ckpt_nb", 0)], caught
    assert not [w for w in caught if "background save failed" in str(w.message)]
    assert capsys.readouterr().err.count("background save failed: OSError") == 2  # (a save each)


def test_a_rollback_replaces_a_captured_tensor_that_takes_no_copy(tmp_path: Path,
                                                                   capsys) -> None:
    """Predictions collected under torch.inference_mode() (an inference tensor, in a list)
    refused the in-place copy: the rollback failed half done, the models loaded and the
    kernel's position left behind."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.inference_mode():
        preds = [model(torch.ones(2)), torch.zeros(3).expand(2, 3)]
    ns = {"model": model, "opt": opt, "preds": preds, "wide": torch.zeros(1).expand(4)}
    with ckpt_nb.auto(str(tmp_path), namespace=ns, name="eval", sync=True):
        pass
    first = ckpt_nb.CheckpointManager(tmp_path).list()["id"].iloc[-1]
    with torch.no_grad():
        model.weight += 1
    with torch.inference_mode():
        ns["preds"][0] = model(torch.ones(2))
    ckpt_nb.rollback(first, directory=tmp_path, namespace=ns)
    assert f"rolled back to {first}" in capsys.readouterr().out
    assert ns["preds"] is preds and torch.equal(preds[0], model(torch.ones(2)))
    assert torch.equal(ns["wide"], torch.zeros(4))


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_a_failed_cell_and_a_rollback_with_a_sparse_tensor_variable(
        shell, tmp_path: Path, capsys) -> None:
    """Their digest of captured variables raised on a sparse tensor: a second traceback
    after the cell's error, and a rollback that restored the state then failed."""
    run(shell, "import torch\nmodel = torch.nn.Linear(4, 2)\n"
               "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
               "adj = torch.eye(3).to_sparse()\nrows = torch.eye(3).to_sparse_csr()")
    result = run(shell, f"%%ckpt_auto --dir {tmp_path} --every-steps 1\n"
                        "for i in range(3):\n"
                        "    opt.zero_grad(); model(torch.ones(8, 4)).sum().backward()\n"
                        "    opt.step()\n"
                        "raise ValueError('diverged')")
    assert isinstance(result.error_in_exec, ValueError)
    assert run(shell, "%ckpt_rollback latest").success
    assert "rolled back to" in capsys.readouterr().out


def test_a_frame_is_read_back_once_per_layout_and_not_over_the_cap(monkeypatch) -> None:
    """The read-back check of a frame ran at every save (16 s for a million rows on a time
    index), over the size cap too, where the frame is skipped anyway: there its first rows
    alone are read back, to say whether a bigger cap takes it."""
    import pandas as pd
    from ckpt_nb import _discovery
    checked = []
    monkeypatch.setattr(_discovery, "_round_trips",
                        lambda frame, real=_discovery._round_trips:
                        checked.append(frame.shape) or real(frame))
    log = pd.DataFrame({"loss": [0.5, 0.25]}, index=pd.date_range("2024", periods=2))
    for _ in range(3):
        assert "log" in _discovery.discover({"log": log}).variables
    assert checked == [(2, 1)]
    log["phase"] = "train"  # (a new column: checked again)
    assert "log" in _discovery.discover({"log": log}).variables and checked[-1] == (2, 2)
    big = pd.DataFrame({"s": ["x" * 100] * 20_000})
    found = _discovery.discover({"big": big}, max_variable_bytes=1 << 20)
    assert "over the 1 MiB cap" in found.skipped["big"]
    assert checked[2:] == [(1000, 1)]  # (over the cap, its first rows alone: does a cap take it)


def test_rollback_keeps_a_frames_axis_names_and_a_torch_size(tmp_path: Path) -> None:
    """A frame came back with its index and column axis unnamed (``equals`` does not
    look at names), and a shape variable was skipped as a "Size"."""
    import pandas as pd
    log = pd.DataFrame({"loss": [0.5, 0.25]}, index=pd.Index([10, 20], name="step"))
    log.columns.name = "metric"
    model = torch.nn.Linear(2, 1)
    ns = {"model": model, "log": log, "shape": torch.zeros(2, 3).shape,
          "losses": log["loss"]}
    with ckpt_nb.auto(str(tmp_path), namespace=ns, sync=True):
        pass
    ns.update(log=None, shape=None, losses=None)
    ckpt_nb.rollback("latest", directory=tmp_path, namespace=ns)
    assert (ns["log"].index.name, ns["log"].columns.name) == ("step", "metric")
    assert ns["log"].equals(log) and (ns["losses"].name, ns["losses"].index.name) == \
        ("loss", "step")
    assert type(ns["shape"]) is torch.Size and ns["shape"] == (2, 3)


def test_ckpt_status_in_a_session_names_its_store_as_a_path(shell, tmp_path: Path,
                                                            capsys) -> None:
    """The line form's status said file:///..., where the cells' first lines say a path."""
    run(shell, SETUP)
    assert run(shell, f"%ckpt_auto --dir {tmp_path / 'line'}").success
    capsys.readouterr()
    run(shell, "%ckpt_status")
    out = capsys.readouterr().out
    assert str(tmp_path / "line") in out and "file://" not in out, out
    run(shell, "%unload_ext ckpt_nb")


def test_ckpt_auto_off_stops_the_line_form(shell, tmp_path: Path, capsys) -> None:
    """The README said the line form's buffers are held "until %ckpt_auto is stopped",
    and nothing but %unload_ext stopped it (`%ckpt_auto stop` was refused)."""
    run(shell, SETUP)
    step = "for s in range(3):\n    opt.zero_grad(); model(X[:40]).sum().backward(); opt.step()\n"
    assert run(shell, f"%ckpt_auto --dir {tmp_path / 'line'}").success
    assert run(shell, step).success
    saved = ckpt_nb.CheckpointManager(tmp_path / "line").list()["id"].tolist()
    capsys.readouterr()
    assert run(shell, "%ckpt_auto --off").success
    assert capsys.readouterr().out == ("ckpt_nb: stopped checkpointing the session; its "
                                       f"latest checkpoint is {saved[-1]} (step 3)\n")
    assert run(shell, step).success  # (trained: no save now)
    assert ckpt_nb.CheckpointManager(tmp_path / "line").list()["id"].tolist() == saved
    assert run(shell, "%ckpt_auto --off").success
    assert "the session is not being checkpointed" in capsys.readouterr().out
    refused = run(shell, "%ckpt_auto --off --keep 2")
    assert "--off takes no other option" in str(refused.error_in_exec)


def test_the_line_form_counts_on_from_a_cell_run_under_it(shell, tmp_path: Path) -> None:
    """A %%ckpt_auto cell run under the line form, on its store, saved up to step 7; the
    line form's next save, its child, said step 5: the line form went on from its own
    count (3), without the cell's steps, and steps went back along the branch."""
    run(shell, SMALL)
    steps = "for s in range({}):\n    opt.zero_grad(); model(data[0]).sum().backward(); opt.step()"
    assert run(shell, f"%ckpt_auto --dir {tmp_path / 'd'} --every-steps 2").success
    assert run(shell, steps.format(3)).success
    assert run(shell, f"%%ckpt_auto --dir {tmp_path / 'd'}\n{steps.format(4)}").success
    assert run(shell, steps.format(2)).success
    run(shell, "%ckpt_auto --off")
    table = ckpt_nb.CheckpointManager(tmp_path / "d").list().set_index("id")
    assert table["step"].tolist() == [2, 3, 7, 9]
    for cid, row in table.iterrows():
        assert row["parent"] is None or table.loc[row["parent"], "step"] < row["step"], cid


def test_the_line_form_counts_on_from_a_cell_under_it_that_made_its_model_anew(
        shell, tmp_path: Path) -> None:
    """The same, where the cell makes its model and optimizer as it runs (the all-in-one
    cell): the line form looked for the objects the cell trained among those it had
    sorted before the cell, the old ones, and its next save said step 5 under step 9."""
    run(shell, SMALL)
    steps = "for s in range({}):\n    opt.zero_grad(); model(data[0]).sum().backward(); opt.step()"
    assert run(shell, f"%ckpt_auto --dir {tmp_path / 'd'} --every-steps 2").success
    assert run(shell, steps.format(3)).success
    assert run(shell, f"%%ckpt_auto --dir {tmp_path / 'd'}\nmodel = torch.nn.Linear(2, 1)\n"
                      f"opt = torch.optim.SGD(model.parameters(), lr=0.1)\n{steps.format(6)}"
               ).success
    assert run(shell, steps.format(5)).success
    run(shell, "%ckpt_auto --off")
    table = ckpt_nb.CheckpointManager(tmp_path / "d").list().set_index("id")
    assert table["step"].tolist() == [2, 3, 9, 11, 13, 14]  # (the new opt's steps counted)
    for cid, row in table.iterrows():
        assert row["parent"] is None or table.loc[row["parent"], "step"] < row["step"], cid


def test_ckpt_auto_off_names_the_checkpoint_the_session_rolled_back_to(
        shell, tmp_path: Path, capsys) -> None:
    """After a rollback it named the writer's last save, a newer checkpoint than the one
    the session stands at."""
    run(shell, SETUP)
    step = "for s in range(2):\n    opt.zero_grad(); model(X[:40]).sum().backward(); opt.step()\n"
    assert run(shell, f"%ckpt_auto --dir {tmp_path / 'line'}").success
    assert run(shell, step).success
    assert run(shell, step).success
    first, second = ckpt_nb.CheckpointManager(tmp_path / "line").list()["id"].tolist()
    assert run(shell, f"%ckpt_rollback {first}").success
    capsys.readouterr()
    assert run(shell, "%ckpt_auto --off").success
    assert capsys.readouterr().out == ("ckpt_nb: stopped checkpointing the session; its "
                                       f"latest checkpoint is {first} (step 2)\n")


def test_magic_errors_are_said_in_the_magics_words(shell, tmp_path: Path) -> None:
    """The magics said the Python API's words: a store by its file:// URL where --dir
    named its folder, list() (ckpt-nb ls) for the listing %ckpt_list shows, and options
    both ways (keep_best (--keep-best) ... on=(METRIC, 'min'|'max') (--on METRIC:min|max))."""
    run(shell, SMALL)
    cell = ("%%ckpt_auto --dir store --keep 1\n"
            "opt.zero_grad(); model(data[0]).sum().backward(); opt.step()")
    assert run(shell, cell).success
    deleted = ckpt_nb.CheckpointManager(tmp_path / "store").list()["id"].iloc[-1]
    assert run(shell, cell).success  # (its save deletes the first: --keep 1)
    unknown = ("no checkpoint 'nosuchid' in store: use an id from %ckpt_list, 'latest', "
               "'best' or '-N'")
    for line, message in (
            ("%ckpt_rollback nosuchid --dir store", f"%ckpt_rollback: {unknown}"),
            ("%ckpt_rollback nosuchid", f"%ckpt_rollback: {unknown}; it looked in the store "
             "of the last session: for a checkpoint of another store, %ckpt_rollback "
             "nosuchid --dir PATH"),
            (f"%ckpt_rollback {deleted} --dir store", f"%ckpt_rollback: checkpoint {deleted} "
             "was deleted (by retention or by hand, in this process or another): use an id "
             "from %ckpt_list, 'latest', 'best' or '-N'"),
            ("%ckpt_auto --keep-best 2",
             "%ckpt_auto: --keep-best ranks by a metric: give --on METRIC:min|max too"),
            ("%ckpt_auto --keep 0", "%ckpt_auto: --keep must be a positive integer, not 0"),
            ("%ckpt_auto --every-steps -2",
             "%ckpt_auto: --every-steps must be a positive integer, not -2"),
            ("%%ckpt_auto --dir store --track modle\npass",
             "%ckpt_auto: --track names modle, which is not defined: nothing ran; fix the "
             "name or define it first")):
        result = run(shell, line)
        assert isinstance(result.error_in_exec, UsageError), (line, result.error_in_exec)
        assert str(result.error_in_exec) == message, line


def test_a_store_url_no_storage_knows_is_a_usage_error(shell) -> None:
    """%ckpt_list s4://b/x gave fsspec's ValueError as a raw traceback."""
    for line in ("%ckpt_list s4://b/x", "%ckpt_rollback latest --dir s4://b/x"):
        result = run(shell, line)
        assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
        assert "no storage knows the scheme 's4'" in str(result.error_in_exec)
    # (%%ckpt_auto gave the store's ValueError as a traceback, the cell not run)
    for line in ("%%ckpt_auto --dir s4://b/x\nran = True", "%ckpt_auto --dir memory://a//b"):
        result = run(shell, line)
        assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
        assert str(result.error_in_exec).startswith("%ckpt_auto: "), result.error_in_exec
        assert "ran" not in shell.user_ns


def test_a_rollback_to_a_branchs_tip_says_the_next_save_goes_on_along_it(
        tmp_path: Path, capsys) -> None:
    """A rollback to latest (its branch's tip) said "the next save starts a branch from
    it", but the next save went on along that branch: it says so now, and the words for a
    rollback to a checkpoint with children stay."""
    model = torch.nn.Linear(2, 2)
    ns = {"model": model}
    with ckpt_nb.auto(tmp_path, namespace=ns, track=["model"]) as session:
        session.save(wait=True)
        model.weight.data += 1  # (and the block's end saves)
    first, tip = ckpt_nb.CheckpointManager(tmp_path).list().id
    capsys.readouterr()
    ckpt_nb.rollback("latest", directory=tmp_path, namespace=ns)
    said = capsys.readouterr().out.rstrip()
    assert said.startswith(f"ckpt_nb: rolled back to {tip} ") and said.endswith(
        "): restored model; the next save goes on along its branch, main"), said
    with ckpt_nb.auto(tmp_path, namespace=ns, track=["model"]) as session:
        model.weight.data += 1
    after_tip = ckpt_nb.CheckpointManager(tmp_path).list().id.iloc[-1]
    rows = ckpt_nb.CheckpointManager(tmp_path).list().set_index("id")
    assert (rows.loc[after_tip, "parent"], rows.loc[after_tip, "branch"]) == (tip, "main")
    capsys.readouterr()
    ckpt_nb.rollback(first, directory=tmp_path, namespace=ns)
    said = capsys.readouterr().out.rstrip()
    assert said.startswith(f"ckpt_nb: rolled back to {first} ") and said.endswith(
        "): restored model; the next save starts a branch from it"), said
    with ckpt_nb.auto(tmp_path, namespace=ns, track=["model"]) as session:
        model.weight.data += 1
    branched = ckpt_nb.CheckpointManager(tmp_path).list().id.iloc[-1]
    rows = ckpt_nb.CheckpointManager(tmp_path).list().set_index("id")
    assert (rows.loc[branched, "parent"], rows.loc[branched, "branch"]) == (first, "branch-1")


# A cell that stops at epoch 1, batch 2 while STOP is set (a KeyboardInterrupt).
_STOPPING_CELL = ("%%ckpt_auto --every-steps 2\nfor epoch in ckpt_nb.epochs(3):\n"
                  "    for i, x in ckpt_nb.batches(data):\n"
                  "        if (epoch, i) == (1, 2) and STOP.is_set(): raise KeyboardInterrupt\n"
                  "        opt.zero_grad(); model(x).sum().backward(); opt.step()\n")


def _stopped_then_run_again_after_a_cd(shell, capsys, tmp_path: Path, store: str) -> str:
    """A cell on the default store (``store``, under ``tmp_path``) interrupted, then %cd
    sub, then the same cell again: checks that it resumed the stopped checkpoint from that
    store and made none under sub/; the stopped checkpoint's id."""
    run(shell, "import threading\nSTOP = threading.Event()\nSTOP.set()")  # (not restored)
    assert isinstance(run(shell, _STOPPING_CELL).error_in_exec, KeyboardInterrupt)
    stopped = ckpt_nb.CheckpointManager(tmp_path / store).list()["id"].iloc[-1]
    (tmp_path / "sub").mkdir()
    run(shell, "%cd sub\nSTOP.clear()")
    capsys.readouterr()
    assert run(shell, _STOPPING_CELL).success
    out = capsys.readouterr().out
    assert f"resumed from {stopped}" in out and str(tmp_path / store) in out.splitlines()[0], out
    assert not (tmp_path / "sub" / store.split("/")[0]).exists()
    return stopped


def test_the_default_store_stays_the_notebooks_after_a_cd(shell, tmp_path: Path,
                                                          capsys) -> None:
    """An interrupted cell on the default store, then %cd, then the same cell again: the
    rerun wrote a new store, sub/checkpoints/session, and trained on from the objects as
    they were, not resuming the stopped run. A relative root_dir is in the folder the
    kernel loaded ckpt_nb in now; an explicit relative --dir stays the current folder's."""
    run(shell, SMALL)
    stopped = _stopped_then_run_again_after_a_cd(shell, capsys, tmp_path, "checkpoints/session")
    assert run(shell, "%ckpt_list").result["id"].iloc[-1] != stopped  # (the store written)
    # (a --dir given is the current folder's, as any path typed)
    assert run(shell, _STOPPING_CELL.replace("--every-steps 2",
                                             "--dir here --every-steps 2")).success
    assert (tmp_path / "sub" / "here").is_dir() and not (tmp_path / "here").exists()


def test_ckpt_nbs_own_objects_a_namespace_holds_are_not_said_as_left_out(
        shell, tmp_path: Path, capsys) -> None:
    """`mgr = CheckpointManager(...)`, `ck = mgr.load(...)`, a report, a config, a plot and
    a DAG layout: each cell's start line said `skipped mgr (CheckpointManager), ck
    (Checkpoint), ...`, and the line form `not saving ...`, of ckpt_nb's own objects. A
    matplotlib Figure of the user's own is still named; a rollback and a resume leave
    ckpt_nb's objects as they are."""
    run(shell, SMALL)
    step = "opt.zero_grad(); model(data[0]).sum().backward(); opt.step()"
    store = tmp_path / "d"
    assert run(shell, f"%%ckpt_auto --dir {store}\n{step}").success
    assert run(shell, f"mgr = ckpt_nb.CheckpointManager({str(store)!r})\n"
                      "ck = mgr.load('latest')\nreport = mgr.verify()\n"
                      "config = ckpt_nb.AutoConfig(every_steps=2)\nstore = mgr.store\n"
                      "layout = ckpt_nb.dag_layout(mgr.list())\n"
                      "drawn = ckpt_nb.plot_dag(mgr)\n"
                      "import matplotlib.figure\nplain = matplotlib.figure.Figure()").success
    own = ["mgr", "ck", "report", "config", "store", "layout", "drawn"]
    before = {name: shell.user_ns[name] for name in own}
    capsys.readouterr()
    assert run(shell, f"%%ckpt_auto --dir {store}\n{step}").success
    run(shell, f"%ckpt_auto --dir {store}")
    assert run(shell, step).success
    run(shell, "%ckpt_auto --off")
    out = capsys.readouterr().out
    assert "tracking model, opt" in out and "skipped plain (Figure)" in out, out
    assert "drawn" not in out, out
    for name in ("CheckpointManager", "Checkpoint", "VerifyReport", "AutoConfig", "LocalStore",
                 "DagNode"):
        assert name not in out, out
    assert run(shell, f"%ckpt_rollback {before['ck'].id}").success
    assert all(shell.user_ns[name] is value for name, value in before.items())
    # (a resume: a cell stopped, then run again, its objects there all along)
    cell = (f"%%ckpt_auto --dir {store} --every-steps 1\nfor epoch in ckpt_nb.epochs(2):\n"
            "    for i, x in ckpt_nb.batches(data):\n"
            "        if (epoch, i) == (1, 1) and STOP.is_set(): raise KeyboardInterrupt\n"
            f"        {step}\n")
    run(shell, "import threading\nSTOP = threading.Event()\nSTOP.set()")
    assert isinstance(run(shell, cell).error_in_exec, KeyboardInterrupt)
    run(shell, "STOP.clear()")
    capsys.readouterr()
    assert run(shell, cell).success and "resumed from" in capsys.readouterr().out
    assert all(shell.user_ns[name] is value for name, value in before.items())
    run(shell, "mgr.close()")


def test_a_relative_default_dir_stays_the_notebooks_after_a_cd(shell, tmp_path: Path,
                                                               capsys) -> None:
    """%config CkptMagics.default_dir = "runs/exp1" (the README's example), a cell stopped,
    %cd sub, the same cell again: it wrote a new store, sub/runs/exp1, and did not resume
    (root_dir was anchored in the notebook's folder, default_dir, the store itself, not)."""
    magics = shell.magics_manager.registry["CkptMagics"]
    run(shell, SMALL)
    try:
        assert run(shell, "%config CkptMagics.default_dir = 'runs/exp1'").success
        _stopped_then_run_again_after_a_cd(shell, capsys, tmp_path, "runs/exp1")
    finally:
        shell.config.pop("CkptMagics", None)
        magics.default_dir = ""


def test_ckpt_nbs_own_object_named_to_track_is_said_to_be_no_training_state(
        shell, tmp_path: Path, capsys) -> None:
    """`%%ckpt_auto --track model,opt,mgr` (the store's manager named by mistake): its
    start line said `skipped mgr (CheckpointManager: code is not state)`, which it is not.
    It says what it is, ckpt_nb's own, and what to track instead; a function named is
    still code."""
    run(shell, SMALL)
    step = "opt.zero_grad(); model(data[0]).sum().backward(); opt.step()"
    store = tmp_path / "d"
    assert run(shell, f"%%ckpt_auto --dir {store}\n{step}").success
    assert run(shell, f"mgr = ckpt_nb.CheckpointManager({str(store)!r})\n"
                      "def helper(): pass").success
    capsys.readouterr()
    assert run(shell, f"%%ckpt_auto --dir {store} --track model,opt,mgr,helper\n{step}").success
    out = capsys.readouterr().out
    assert "tracking model, opt" in out, out
    assert ("mgr (CheckpointManager: ckpt_nb's own, not training state: no checkpoint holds "
            "it, and a resume leaves it as it is; track what the run trains and changes "
            "instead (the model, the optimizer, the variables the cell updates))") in out, out
    assert "helper (function: code is not state)" in out, out
    run(shell, "mgr.close()")
