"""The notebook layer as jobs run it: scripts killed and run again, notebooks run headless
(nbclient) into one default store, ``auto()`` called from a function or with the magic's
forms, and a byte budget that cannot be met."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

import ckpt_nb
from ckpt_nb import _session
import warm_python
from test_magics import run  # (the shell's helper)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts like a new process: no last session, no kernel position."""
    for name in ("_last", "_positions", "_position_events", "_left_values",
                 "_position_objects"):
        monkeypatch.setattr(_session, name, {} if name != "_last" else None)


def script(tmp_path: Path, name: str, code: str, *, die: bool = False,
           prefix: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``code`` as a script file of its own in a fresh interpreter (``DIE`` set: it
    kills itself with SIGKILL where the code says); ``prefix`` shifts its lines. The
    interpreter is forked from a warm one (warm_python), as fresh but for torch imported."""
    path = tmp_path / name
    path.write_text(prefix + code)
    env = {**os.environ, "PYTHONPATH": str(REPO), "DIE": "1" if die else ""}
    env.pop("JPY_SESSION_NAME", None)
    done = warm_python.run([sys.executable, str(path)], cwd=tmp_path, env=env, timeout=300)
    if die:
        assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    return done


def unstopped_and_resumed(tmp_path: Path, code: str, kills: int = 1
                          ) -> tuple[subprocess.CompletedProcess[str],
                                     subprocess.CompletedProcess[str]]:
    """A script run never stopped (in tmp_path/ref), and run killed ``kills`` times and
    then to its end (in tmp_path/run), each in a store of its own: both succeeded."""
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    unstopped = script(tmp_path / "ref", "train.py", code)
    assert unstopped.returncode == 0, unstopped.stderr
    for _ in range(kills):
        script(tmp_path / "run", "train.py", code, die=True)
    resumed = script(tmp_path / "run", "train.py", code)
    assert resumed.returncode == 0, resumed.stderr
    return unstopped, resumed


LOOP = """
import os, torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20,
                                     shuffle=True)

def steps(o):
    return int(o.state_dict()["state"][0]["step"]) if o.state_dict()["state"] else 0

def train(model, opt, epochs, die_at=None):
    for epoch in ckpt_nb.epochs(epochs):
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if os.environ["DIE"] and steps(opt) == die_at:
                os.kill(os.getpid(), 9)
"""

IN_FUNCTION = LOOP + """
def main():
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with ckpt_nb.auto("store", every_steps=5):
        train(model, opt, 3, die_at=25)
    print("steps", steps(opt))

main()
"""


def test_auto_in_a_function_warns_and_does_not_resume_without_the_functions_locals(
        tmp_path: Path) -> None:
    """auto() in a function saw the module's globals: it tracked nothing, and the run
    killed mid-way "resumed" at step 20 with a new model, which got 10 steps of 30."""
    killed = script(tmp_path, "train.py", IN_FUNCTION, die=True)
    assert "RuntimeWarning: ckpt_nb tracks no model, opt: auto() in a function" in \
        killed.stderr and "pass namespace=locals()" in killed.stderr, killed.stderr
    again = script(tmp_path, "train.py", IN_FUNCTION)
    assert again.returncode == 1 and "resumed from" not in again.stdout, again.stdout
    assert "StateMismatchError: not resuming checkpoint" in again.stderr, again.stderr
    assert "not model, opt among the function's locals" in again.stderr
    assert "pass namespace=locals()" in again.stderr.splitlines()[-1]
    fixed = script(tmp_path, "fixed.py", IN_FUNCTION.replace(
        'auto("store",', 'auto("store2", namespace=locals(),'))
    assert fixed.returncode == 0 and "steps 30" in fixed.stdout, fixed.stderr
    assert "RuntimeWarning" not in fixed.stderr, fixed.stderr


TWO_BLOCKS = LOOP + """
model = torch.nn.Linear(8, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
head = torch.nn.Linear(2, 2)
opt2 = torch.optim.Adam(head.parameters(), lr=0.05)
with ckpt_nb.auto("store", every_steps=5):  # pretrain: 30 steps
    train(model, opt, 3)
print("pretrained", steps(opt), flush=True)
with ckpt_nb.auto("store", every_steps=5):  # fine-tune the head: 20 steps
    train(torch.nn.Sequential(model, head), opt2, 2, die_at=17)
print("fine-tuned", steps(opt2), flush=True)
"""


def test_unnamed_auto_blocks_of_a_script_resume_their_own_runs_after_a_kill(
        tmp_path: Path) -> None:
    """Every unnamed block was "auto": killed in the second block, the script run again
    resumed the second block's run in the first (its pretraining cut short)."""
    script(tmp_path, "train.py", TWO_BLOCKS, die=True)
    # (edited meanwhile: its lines shifted)
    again = script(tmp_path, "train.py", TWO_BLOCKS, prefix="# two blocks\n\n")
    assert again.returncode == 0 and "pretrained 30\n" in again.stdout, again.stdout
    first, second = again.stdout.split("pretrained 30\n")
    assert "resumed" not in first, again.stdout
    assert "ran to its end before" not in first  # (a script run again trains again)
    assert "resumed from" in second and "fine-tuned 20" in second, again.stdout


def test_track_takes_a_comma_string_and_an_undefined_name_is_refused(tmp_path: Path,
                                                                      capsys) -> None:
    """track="model,opt" was split into characters (m, o, d... not defined), and a name
    not defined tracked nothing, silently."""
    model = torch.nn.Linear(2, 1)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1), "n": 1}
    for track in ("model, opt", ["model", "opt"]):
        with ckpt_nb.auto(str(tmp_path / "a"), namespace=ns, track=track) as session:
            assert list(session.discovery.statefuls) == ["model", "opt"]
    assert capsys.readouterr().out.count("ckpt_nb: tracking model, opt\n") == 2
    with pytest.raises(ckpt_nb.CkptError, match=r"--track \(track=\) names modle, which is "
                                                 r"not defined: nothing ran"):
        with ckpt_nb.auto(str(tmp_path / "b"), namespace=ns, track="modle,opt"):
            raise AssertionError("the block ran")
    assert ckpt_nb.CheckpointManager(tmp_path / "b").list().empty


SETUP = """
import torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20,
                                     shuffle=True)
model = torch.nn.Linear(8, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
crash = True
"""

TRAIN = """%%ckpt_auto --dir {dir} --every-steps 5 --track {track}
for epoch in ckpt_nb.epochs(3):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
        if crash and epoch == 1 and i == 7:
            raise RuntimeError("crash")
"""


def test_a_magic_with_a_track_typo_is_refused_and_a_resume_of_untracked_objects_too(
        shell, tmp_path: Path, capsys) -> None:
    """--track modle,opt tracked the optimizer alone and resumed the loop position, the
    model trained on from scratch; a checkpoint holding a model the cell no longer tracks
    was resumed without it."""
    run(shell, SETUP)
    typo = run(shell, TRAIN.format(dir=tmp_path, track="modle,opt"), cell_id="train")
    assert type(typo.error_in_exec).__name__ == "UsageError"  # (one line, no traceback)
    assert str(typo.error_in_exec).startswith("%ckpt_auto: --track names modle, "
                                              "which is not defined")
    assert not shell.user_ns["opt"].state_dict()["state"]  # (nothing ran)
    crashed = run(shell, TRAIN.format(dir=tmp_path, track="model,opt"), cell_id="train")
    assert isinstance(crashed.error_in_exec, RuntimeError)
    run(shell, SETUP.replace("crash = True", "crash = False"))  # (as in a fresh kernel)
    capsys.readouterr()
    partial = run(shell, TRAIN.format(dir=tmp_path, track="opt"), cell_id="train")
    assert isinstance(partial.error_in_exec, ckpt_nb.StateMismatchError)
    message = str(partial.error_in_exec)
    assert "holds model, which this cell does not track now (it tracks opt)" in message
    assert "define them ahead of the cell's loops" in message, message
    assert "--no-resume" in message and "resumed from" not in capsys.readouterr().out
    resumed = run(shell, TRAIN.format(dir=tmp_path, track="model,opt"), cell_id="train")
    assert resumed.error_in_exec is None and "resumed from" in capsys.readouterr().out


def test_a_session_that_tracks_nothing_warns(tmp_path: Path) -> None:
    with pytest.warns(RuntimeWarning, match="tracks no stateful object"):
        with ckpt_nb.auto(str(tmp_path), namespace={"n": 1}):
            pass


@pytest.mark.parametrize("every, seconds", [("10m", 600), ("1h", 3600), ("30s", 30),
                                            ("1d", 86400), (90, 90), (0.5, 0.5)])
def test_auto_takes_the_magics_duration_forms(tmp_path: Path, every: object,
                                              seconds: float) -> None:
    """every_seconds="10m" raised '<' not supported between 'int' and 'str'."""
    with ckpt_nb.auto(str(tmp_path), namespace={}, every_seconds=every,
                      on="loss:min") as session:
        assert session.config.every_seconds == seconds
        assert session.config.on == ("loss", "min")


@pytest.mark.parametrize("options, error, problem", [
    ({"every_seconds": "soon"}, ValueError, r"every_seconds \(--every\): cannot read 'soon'"),
    ({"every_seconds": [10]}, TypeError, r"every_seconds \(--every-seconds\) takes a number "
                                         r"of seconds or a duration such as '30s'"),
    ({"on": 3}, TypeError, r"on \(--on\) takes \(METRIC, 'min' or 'max'\)"),
    ({"track": 3}, TypeError, r"track \(--track\) takes names"),
    ({"track": " , "}, ValueError, r"track \(--track\) is empty"),
    ({"resume": "no"}, TypeError, r"resume \(--no-resume\) takes True or False, not 'no'"),
    ({"sync": 1}, TypeError, r"sync \(--sync\) takes True or False"),
    ({"strategy": ["full"]}, TypeError, r"strategy \(--strategy\) takes a string"),
    ({"max_variable_bytes": "1GB"}, ValueError, "max_variable_bytes must be a number of bytes"),
    ({"namespace": [1]}, TypeError, r"namespace takes a dict \(globals\(\) or locals\(\)\)"),
    ({"name": 3}, TypeError, "name takes a string, not 3"),
    ({"directory": 3}, TypeError, r"directory \(--dir\) takes a path, not 3"),
])
def test_auto_refuses_an_argument_of_the_wrong_type_by_name(
        tmp_path: Path, options: dict, error: type, problem: str) -> None:
    options = {"directory": str(tmp_path), "namespace": {}, **options}
    with pytest.raises(error, match=problem):
        with ckpt_nb.auto(**options):
            pass
    assert ckpt_nb.status() == {"active": False}


NOTEBOOK_SETUP = """import torch, ckpt_nb
%load_ext ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(8, 2); opt = torch.optim.Adam(model.parameters(), lr={lr})
X = torch.randn(100, 8); Y = (X.sum(1) > 0).long()"""

NOTEBOOK_TRAIN = """%%ckpt_auto --every-steps 5 --keep 2
for s in range(12):  # {name}
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(X), Y).backward(); opt.step()"""


def test_headless_notebooks_sharing_the_default_store_keep_each_others_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run by nbclient (no JPY_SESSION_NAME), notebooks without --dir share
    ./checkpoints/session, and the second one's --keep 2 deleted every checkpoint of the
    first: retention is the cell's runs' now, and the cell says where it writes."""
    # (the kernels take this process's environment, as test_kernel's do: a PYTHONPATH set
    # for them alone was a start-up environment of their own, and a warm kernel server
    # started for it, ~4 s, where none was set)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    store = tmp_path / "checkpoints" / "session"
    kept, outs = {}, []
    for name, lr in (("train_a", 0.05), ("train_b", 0.01)):
        notebook = nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_code_cell(NOTEBOOK_SETUP.format(lr=lr)),
            nbformat.v4.new_code_cell(NOTEBOOK_TRAIN.format(name=name))])
        NotebookClient(notebook, timeout=240, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
        outs.append("".join(o.get("text", "") for o in notebook.cells[1].outputs))
        rows = ckpt_nb.CheckpointManager(store).list()
        kept[name] = set(rows["id"]) - set().union(*kept.values())
        assert len(kept[name]) == 2 and rows["step"].tolist()[-2:] == [10, 12]
    assert set(ckpt_nb.CheckpointManager(store).list()["id"]) == kept["train_a"] | kept["train_b"]
    for out in outs:
        assert out.splitlines()[0] == (f"ckpt_nb: tracking model, opt; variables X, Y -> "
                                       f"{store} (the default store)"), out


def test_a_cell_of_a_notebook_keeps_another_cells_checkpoints(
        shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(The cells of a notebook share its default store: a cell's --keep 2 deleted the
    others' checkpoints, an unfinished run's among them.)"""
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    run(shell, NOTEBOOK_SETUP.format(lr=0.1))
    saved = {}
    for name in ("first", "second", "first"):
        assert run(shell, NOTEBOOK_TRAIN.format(name=name), cell_id=name).error_in_exec is None
        rows = ckpt_nb.CheckpointManager(tmp_path / "checkpoints" / "session").list()
        saved[name] = set(rows["id"][-2:])
        assert len(rows) == 2 * len(saved)  # (two a cell: its newest)
    assert set(rows["id"]) == saved["first"] | saved["second"]


def test_a_byte_budget_that_cannot_be_met_is_warned_of_once(tmp_path: Path) -> None:
    """The newest checkpoint alone over max_bytes, or the pinned, best and newest ones
    together: the store stayed over the budget without a word."""
    lin = torch.nn.Linear(512, 1024)  # (about 1.3 MB a checkpoint)
    mgr = ckpt_nb.CheckpointManager(tmp_path / "a", max_bytes=1_000_000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = []
        for step in range(3):
            with torch.no_grad():
                lin.weight.add_(1)
            ids.append(mgr.save(lin, step=step))
    said = [w for w in caught if "byte budget" in str(w.message)]
    assert len(said) == 1 and said[0].category is RuntimeWarning, said
    assert "over its byte budget (max_bytes=1,000,000)" in str(said[0].message)
    assert f"it keeps {ids[0]} (newest, " in str(said[0].message)
    assert mgr.list()["id"].tolist() == [ids[-1]]

    mgr = ckpt_nb.CheckpointManager(tmp_path / "b", max_bytes=3_000_000, keep_best=1,
                                    metric="loss")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = []
        for step, loss in enumerate((3.0, 1.0, 2.0, 4.0)):
            with torch.no_grad():
                lin.weight.add_(1)
            ids.append(mgr.save(lin, step=step, metrics={"loss": loss}))
            if step == 0:
                mgr.pin(ids[0])
    said = [str(w.message) for w in caught if "byte budget" in str(w.message)]
    assert len(said) == 1, said
    assert all(f"{cid} ({why}" in said[0] for cid, why in (
        (ids[0], "pinned"), (ids[1], "best by loss")))
    assert set(mgr.list()["id"]) == {ids[0], ids[1], ids[3]}


UNNAMED_CELL = """with ckpt_nb.auto({store!r}, every_steps=5, keep=2, namespace=globals()):
    for epoch in ckpt_nb.epochs(2):
        for i in range(6):
            opt{m}.zero_grad()
            torch.nn.functional.cross_entropy(model{m}(X), Y).backward()
            opt{m}.step()
"""


def test_unnamed_auto_blocks_in_two_cells_keep_each_others_checkpoints(
        shell, tmp_path: Path) -> None:
    """Every unnamed block in IPython was "auto", one cell: the second cell's keep=2
    deleted every checkpoint of the first's."""
    run(shell, "import torch, ckpt_nb\ntorch.manual_seed(0)\nX = torch.randn(100, 8)\n"
               "Y = (X.sum(1) > 0).long()\n"
               "modelA = torch.nn.Linear(8, 2)\n"
               "optA = torch.optim.SGD(modelA.parameters(), lr=0.1)\n"
               "modelB = torch.nn.Linear(8, 2)\n"
               "optB = torch.optim.SGD(modelB.parameters(), lr=0.1)\n")
    store = str(tmp_path / "store")
    assert run(shell, UNNAMED_CELL.format(store=store, m="A")).success
    first = set(ckpt_nb.CheckpointManager(store).list()["id"])
    assert len(first) == 2
    assert run(shell, UNNAMED_CELL.format(store=store, m="B")).success
    assert first < set(ckpt_nb.CheckpointManager(store).list()["id"])


SWEEP = """
import os, sys, time, torch, ckpt_nb
torch.manual_seed(int(os.environ["SEED"]))
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
X = torch.randn(50, 8)
with ckpt_nb.auto("store", every_steps=1, keep=2):
    for i, _ in ckpt_nb.batches(range(4)):
        opt.zero_grad(); model(X).sum().backward(); opt.step()
print("saved", flush=True)
if os.environ.get("STAY"):
    sys.stdin.read()  # (a kernel still open: its run is its own)
"""


def test_a_run_of_the_same_code_in_another_live_process_is_not_its_retention(
        tmp_path: Path) -> None:
    """The same notebook run twice at once (a papermill sweep) has the same cells: one
    run's keep=2 deleted the other's checkpoints."""
    path = tmp_path / "sweep.py"
    path.write_text(SWEEP)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SEED": "1", "STAY": "1"}
    env.pop("JPY_SESSION_NAME", None)
    staying = warm_python.Popen([sys.executable, str(path)], cwd=tmp_path, env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert staying.stdout is not None
        assert "saved\n" in iter(staying.stdout.readline, "")
        theirs = set(ckpt_nb.CheckpointManager(tmp_path / "store").list()["id"])
        assert len(theirs) == 2
        done = warm_python.run([sys.executable, str(path)], cwd=tmp_path, timeout=300,
                               env={**env, "SEED": "2", "STAY": ""})
        assert done.returncode == 0, done.stderr
        assert theirs < set(ckpt_nb.CheckpointManager(tmp_path / "store").list()["id"])
    finally:
        staying.communicate("", timeout=60)


# A helper that runs the epoch's batches() loop and sums its losses in a local.
HELPER_SUM = """
import os, torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20,
                                     shuffle=True)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def run_epoch(epoch):
    total, seen, val_total = 0.0, [], 0.0
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        total += loss.item()
        seen.append(i)
        if os.environ["DIE"] and epoch == 1 and i == 7:
            os.kill(os.getpid(), 9)
    with torch.no_grad():  # (a later loop: run whole after a resume in the first)
        for _, (xb, yb) in ckpt_nb.batches(loader):
            val_total += torch.nn.functional.cross_entropy(model(xb), yb).item()
    return total

with ckpt_nb.auto("store", every_steps=4, sync=True):
    for epoch in ckpt_nb.epochs(3):
        ckpt_nb.log(train_loss=run_epoch(epoch))
"""


def test_a_mid_epoch_resume_in_a_helper_says_its_running_sums_start_again(
        tmp_path: Path) -> None:
    """run_epoch()'s `total = 0.0` ... `total += loss.item()` started again at 0 after a
    mid-epoch resume (no checkpoint holds a function's locals): the weights were exact,
    the logged train_loss not, and nothing was said. It is said once now, naming it."""
    _, resumed = unstopped_and_resumed(tmp_path, HELPER_SUM)
    out = resumed.stdout + resumed.stderr
    assert "(epoch 1, batch 6, step 16)" in out, out  # (resumed mid-epoch)
    assert out.count("warning: resumed mid-epoch inside run_epoch(), whose local total "
                     "sums over the loop") == 1, out
    said = out.split("inside run_epoch()")[1].split("\n")[0]
    assert "seen" not in said and "val_total" not in said, out
