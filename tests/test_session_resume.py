"""Resumes, interrupted saves and the metrics checkpoints carry, in a real in-process
IPython shell: the cases a notebook user meets in a training cell. Each test has a store
of its own, which is what the process's positions and cells run are kept by."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ckpt_nb
from test_magics import final_state, run, same  # (the shell's helpers)
import warm_python  # (fresh interpreters forked from a warm one)

# A Dataset that augments in this process, as torchvision's random transforms do with
# num_workers=0: each batch fetched draws from torch's global generator.
SETUP = """
import os, signal, torch, ckpt_nb
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(300, 16)
Y = (X[:, :4].sum(1) > 0).long()

class Augmented(torch.utils.data.Dataset):
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return X[i] + 0.1 * torch.randn(16), Y[i]

loader = torch.utils.data.DataLoader(Augmented(), batch_size=30, shuffle=True)
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
history = []

def stop_if(point):
    # A file named for the point stops the cell there, once: an interrupt or a crash.
    if os.path.exists(point):
        with open(point) as file:
            how = file.read()
        os.remove(point)
        if how == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            raise RuntimeError("diverged")
"""

# (The same code each run: a resume goes on with a run of this cell's code only.)
TRAIN = """%%ckpt_auto --dir {dir} --every-steps 7
for epoch in ckpt_nb.epochs(3):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        stop_if(f"before-{{epoch}}-{{i}}")
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        stop_if(f"after-{{epoch}}-{{i}}")
    history.append(round(loss.item(), 6))
len(history)
"""


@pytest.mark.parametrize("how, where, saved", [
    ("interrupt", "after", "interrupt"),  # saved at the next consistent point
    ("crash", "before", "RuntimeError in the cell"),  # saved at the consistent point before
    ("crash", "after", "every 7 steps"),  # not saved: resumes the periodic save, as after a kill
])
def test_main_process_augmentation_resumes_bit_exact(shell, tmp_path: Path, capsys, how: str,
                                                     where: str, saved: str) -> None:
    """The consistent point of batches() is before the next batch is fetched (its
    augmentation drawn): a checkpoint's RNG state was the one after, so the batch
    fetched again on resume came out augmented differently."""
    run(shell, SETUP)
    assert run(shell, TRAIN.format(dir=tmp_path / "ref")).result == 3
    expected, expected_history = final_state(shell), list(shell.user_ns["history"])

    run(shell, SETUP)
    (tmp_path / f"{where}-1-5").write_text(how)
    cell = TRAIN.format(dir=tmp_path / "run")
    first = run(shell, cell)
    assert first.error_in_exec is not None
    assert ckpt_nb.CheckpointManager(tmp_path / "run").list()["note"].iloc[-1] == saved
    capsys.readouterr()
    second = run(shell, cell)
    assert second.success and second.result == 3
    assert "ckpt_nb: resumed from" in capsys.readouterr().out
    assert same(final_state(shell), expected)
    assert shell.user_ns["history"][-2:] == expected_history[-2:]


# The user pressing Stop while the end-of-cell save runs: a tracked object that sends
# SIGINT to the kernel as its state is captured.
SIGNALLER = """
class Signaller:
    def __init__(self):
        self.interrupts = 0

    def state_dict(self):
        for _ in range(self.interrupts):
            os.kill(os.getpid(), signal.SIGINT)
        return {"calls": torch.zeros(1)}

    def load_state_dict(self, state):
        pass

signaller = Signaller()
"""

SHORT = """%%ckpt_auto --dir {dir}
for epoch in ckpt_nb.epochs(1):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
"""


def test_one_interrupt_during_the_end_of_cell_save_lets_it_finish(shell, tmp_path: Path,
                                                                  capsys) -> None:
    """The handler was put back before the save: the first interrupt raised inside it,
    the checkpoint was lost and the cell ended in a traceback through ckpt_nb."""
    run(shell, SETUP + SIGNALLER + "signaller.interrupts = 1")
    result = run(shell, SHORT.format(dir=tmp_path / "run"))
    error = result.error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    rows = ckpt_nb.CheckpointManager(tmp_path / "run").list()
    assert list(rows["note"]) == ["end of cell"] and rows["step"].iloc[0] == 10
    assert error._render_traceback_() == [
        f"KeyboardInterrupt: the cell ran to its end, saved as checkpoint {rows['id'].iloc[0]}"]
    out = capsys.readouterr()
    assert "interrupt received: finishing the save of the cell's end" in out.err
    assert "interrupted while saving the cell's end: the save finished" in out.out


def test_a_second_interrupt_stops_the_end_of_cell_save_and_keeps_the_earlier_ones(
        shell, tmp_path: Path) -> None:
    run(shell, SETUP + SIGNALLER)
    cell = SHORT.format(dir=tmp_path / "run")
    assert run(shell, cell).success
    run(shell, "signaller.interrupts = 2")
    assert isinstance(run(shell, cell).error_in_exec, KeyboardInterrupt)
    with ckpt_nb.CheckpointManager(tmp_path / "run") as mgr:
        assert len(mgr.list()) == 1 and mgr.verify().ok
    run(shell, "signaller.interrupts = 0")
    assert run(shell, cell).success


def evaluate(model: torch.nn.Module, val: torch.Tensor) -> float:
    with torch.no_grad():
        return model(val).pow(2).mean().item()


def test_a_checkpoint_carries_a_metric_only_for_the_state_it_was_measured_on(
        tmp_path: Path) -> None:
    """Periodic saves carried the last logged val_loss though the model had trained
    since: ``best`` (and --keep-best) picked a model nobody had evaluated."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    data, val = [torch.randn(8, 4) for _ in range(10)], torch.randn(32, 4)
    with ckpt_nb.auto(str(tmp_path), namespace={"model": model, "opt": opt}, sync=True,
                      every_steps=4, on=("val_loss", "min")) as session:
        for epoch in ckpt_nb.epochs(4):
            for _, x in ckpt_nb.batches(data):
                opt.zero_grad()
                (model(x).pow(2).mean() * (1 if epoch < 2 else -1)).backward()
                opt.step()
            ckpt_nb.log(val_loss=evaluate(model, val))  # better for 2 epochs, then worse
        assert [r["step"] for r in session.history] == [10, 20, 30, 40]
    with ckpt_nb.CheckpointManager(tmp_path, metric="val_loss") as mgr:
        rows = mgr.list()
        measured = rows[rows["val_loss"].notna()]
        assert set(measured["batch_idx"]) == {0}  # epoch ends, where it was logged
        assert rows[rows["batch_idx"] > 0]["val_loss"].isna().all()
        best = mgr.restore("best", model=model)
    assert evaluate(model, val) == best.metrics["val_loss"] == measured["val_loss"].min()


def test_a_metric_logged_in_a_line_session_cell_is_saved_with_the_model_it_measured(
        shell, tmp_path: Path) -> None:
    """It was saved only with the next cell's first step, on another model."""
    run(shell, """
import torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.3)
data, val = [torch.randn(8, 4) for _ in range(5)], torch.randn(32, 4)
def evaluate():
    with torch.no_grad():
        return model(val).pow(2).mean().item()
""")
    run(shell, f"%ckpt_auto --dir {tmp_path / 'run'} --on val_loss:min")
    evaluated = []
    for _ in range(3):
        run(shell, "for x in data:\n"
                   "    opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()")
        run(shell, "v = evaluate(); ckpt_nb.log(val_loss=v)")
        evaluated.append(shell.user_ns["v"])
    rows = ckpt_nb.CheckpointManager(tmp_path / "run").list()
    # (the training cell's end saved the state, the evaluating cell's log saved it with
    # val_loss in that one's place: one checkpoint per state)
    assert list(rows["step"]) == [5, 10, 15]
    assert list(rows["val_loss"]) == evaluated
    run(shell, "%ckpt_rollback best")
    assert run(shell, "evaluate()").result == min(evaluated)


def test_an_error_after_a_resume_names_the_checkpoint_it_resumed_from(shell, tmp_path: Path,
                                                                      capsys) -> None:
    """It said "the latest checkpoint is none": it knew only the session's own saves."""
    run(shell, SETUP)
    cell = TRAIN.format(dir=tmp_path / "run")
    (tmp_path / "after-0-8").write_text("crash")
    assert isinstance(run(shell, cell).error_in_exec, RuntimeError)
    capsys.readouterr()
    (tmp_path / "after-0-8").write_text("crash")  # (resumed from step 7, it trains step 8)
    assert isinstance(run(shell, cell).error_in_exec, RuntimeError)
    out = capsys.readouterr().out
    resumed = ckpt_nb.CheckpointManager(tmp_path / "run").list()["id"].iloc[-1]
    assert f"ckpt_nb: resumed from {resumed} " in out
    assert "not saving after RuntimeError: the model changed since the last consistent " \
           f"point; the latest checkpoint is {resumed} (step 7)\n" in out


def test_an_error_in_a_finished_cells_rerun_names_the_checkpoint_it_began_from(
        shell, tmp_path: Path, capsys) -> None:
    """A finished cell run again (a new run on the trained model, its steps counted on from
    its end) that stopped before its first save said "the latest checkpoint is none":
    its end checkpoint, which the next run names itself, is right there."""
    run(shell, SETUP)
    cell = TRAIN.format(dir=tmp_path / "run")
    assert run(shell, cell).result == 3
    end = ckpt_nb.CheckpointManager(tmp_path / "run").list().iloc[-1]
    capsys.readouterr()
    (tmp_path / "after-0-1").write_text("crash")
    assert isinstance(run(shell, cell).error_in_exec, RuntimeError)
    assert "not saving after RuntimeError: the model changed since the last consistent " \
           f"point; this run saved none; the latest checkpoint is {end.id} (step {end.step}), " \
           "where it began\n" in capsys.readouterr().out


PLAIN_LOOP = """for step in range(12):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(X[:30]), Y[:30]).backward()
    opt.step()
    if step == 7:
        os.kill(os.getpid(), signal.SIGINT)
"""


@pytest.mark.parametrize("form", ["cell", "line"])
def test_an_interrupt_where_no_resume_can_follow_says_what_is_true(shell, tmp_path: Path,
                                                                   form: str) -> None:
    """It said "run it again to go on from checkpoint X" where running it again starts
    its loops over: a cell without the loop helpers, and any cell of the line form. Then
    it said "starts over", where the rerun trains on from the objects as they are."""
    run(shell, SETUP)
    if form == "line":
        run(shell, f"%ckpt_auto --dir {tmp_path / 'run'}")
        result = run(shell, PLAIN_LOOP)
    else:
        result = run(shell, f"%%ckpt_auto --dir {tmp_path / 'run'}\n" + PLAIN_LOOP)
    error = result.error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    cid = ckpt_nb.CheckpointManager(tmp_path / "run").list()["id"].iloc[-1]
    assert str(error) == (
        f"the cell stopped at step 9; checkpoint {cid} holds it, not a position to resume: "
        "running the cell again runs its loops from their start on the objects as they are "
        "(in this kernel, trained to step 9, its steps counted on; in a new one, as the "
        f"set-up cell makes them; %ckpt_rollback {cid} puts this state back first). To "
        "resume where it stopped, loop with ckpt_nb.epochs()/batches()" +
        (" in a %%ckpt_auto cell or a ckpt_nb.auto() block" if form == "line" else ""))


def test_an_interrupt_in_the_loop_helpers_says_to_run_the_cell_again(shell,
                                                                     tmp_path: Path) -> None:
    run(shell, SETUP)
    (tmp_path / "after-0-3").write_text("interrupt")
    error = run(shell, TRAIN.format(dir=tmp_path / "run")).error_in_exec
    cid = ckpt_nb.CheckpointManager(tmp_path / "run").list()["id"].iloc[-1]
    assert str(error) == f"the cell stopped at step 4: run it again to go on from checkpoint {cid}"


def test_a_loader_with_persistent_workers_is_warned_of_once_where_it_is_used(
        shell, tmp_path: Path, capsys) -> None:
    """Its workers keep their random state from epoch to epoch, which no checkpoint
    holds: a resume of augmentation in them differs, and nothing said so. Then it was
    said in the first cell whose namespace held it, one that did not use it, and not in
    the cell that did: it is said where a cell's code names it, or its batches() gets it."""
    run(shell, SETUP + "persistent = torch.utils.data.DataLoader(Augmented(), batch_size=30, "
                       "num_workers=2, persistent_workers=True)\n"
                       "fresh = torch.utils.data.DataLoader(Augmented(), num_workers=2)\n"
                       "handed = torch.utils.data.DataLoader(Augmented(), batch_size=300, "
                       "num_workers=1, persistent_workers=True)\n"
                       "def pick():\n    return handed")
    cell = f"%%ckpt_auto --dir {tmp_path / 'run'}\n"

    def warnings(code: str) -> list[str]:
        capsys.readouterr()
        assert run(shell, cell + code).success
        return [line for line in capsys.readouterr().err.splitlines() if "warning" in line]

    assert warnings("for epoch in ckpt_nb.epochs(1):\n    pass") == []
    said = ("persistent workers keep a random state from epoch to epoch that checkpoints do "
            "not hold: after a resume, the random draws in its workers (a Dataset's "
            "augmentation) differ from an unstopped run's, though the order of its batches "
            "is the same; persistent_workers=False resumes bit-identical")
    assert warnings("n = len(persistent) + len(fresh)") == [
        f"ckpt_nb: warning: persistent's {said}"]
    assert warnings("n = len(persistent)") == []
    batches = "for i, b in ckpt_nb.batches(pick()):\n    pass"
    assert warnings(batches) == [f"ckpt_nb: warning: handed's {said}"]
    assert warnings(batches) == []


@pytest.mark.parametrize("metrics, message", [
    ({"acc": "high"}, r"^metric 'acc' must be a number, not str$"),
    ({"loss": None}, r"^metric 'loss' must be a number, not NoneType$"),
    ({"loss": torch.ones(3)}, r"^metric 'loss' must be one number, not 3 of them$"),
    ({"step": 3}, r"log\(step=\.\.\.\): every record of the metric history holds the step"),
    ({"epoch": 1.0}, r"log\(epoch=\.\.\.\): every record of the metric history holds the epoch"),
])
def test_a_metric_that_is_no_number_or_a_records_own_field_is_refused_by_name(
        tmp_path: Path, metrics: dict, message: str) -> None:
    """It raised float()'s ValueError or TypeError, naming no metric, or (step=)
    overwrote the history's step; nothing of the call is recorded."""
    with ckpt_nb.auto(str(tmp_path), namespace={}, sync=True) as session:
        ckpt_nb.log(loss=torch.tensor(0.5), n=2)
        with pytest.raises(ckpt_nb.CaptureError, match=message):
            ckpt_nb.log(val=1.0, **metrics)
        assert list(session.history) == [{"step": 0, "epoch": None, "loss": 0.5, "n": 2.0}]
    with pytest.raises(ckpt_nb.CaptureError, match=message):  # (and with no session)
        ckpt_nb.log(**metrics)


def test_on_metric_saves_the_measured_state_in_a_loop_without_helpers(tmp_path: Path) -> None:
    """The next step cleared the due save before the consistent point after it: no
    improvement was ever saved, only the end of the cell."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ckpt_nb.auto(str(tmp_path), namespace={"model": model, "opt": opt},
                      on=("val_loss", "min"), sync=True):
        for step in range(1, 51):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
            if step % 10 == 5:
                ckpt_nb.log(val_loss=100.0 - step)
    rows = ckpt_nb.CheckpointManager(tmp_path).list()
    improved = rows[rows["note"] == "val_loss improved"]
    assert improved["step"].tolist() == [5, 15, 25, 35, 45]
    assert improved["val_loss"].tolist() == [95.0, 85.0, 75.0, 65.0, 55.0]


@pytest.mark.parametrize("mode, diverged, values", [
    ("min", float("-inf"), [3.0, 2.0, 1.0]), ("max", float("inf"), [1.0, 2.0, 3.0])])
def test_on_metric_takes_no_infinity_for_an_improvement(tmp_path: Path, mode: str,
                                                        diverged: float,
                                                        values: list[float]) -> None:
    """-inf under --on val_loss:min was the best ever: no later improvement was saved,
    where the store's "best" (which leaves out ±inf, as NaN) ranked those."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    logged = [values[0], diverged, *values[1:]]
    with ckpt_nb.auto(str(tmp_path), namespace={"model": model, "opt": opt},
                      on=("score", mode), sync=True):
        for epoch in ckpt_nb.epochs(len(logged)):
            for _, x in ckpt_nb.batches([torch.ones(2)] * 2):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            ckpt_nb.log(score=logged[epoch])
    mgr = ckpt_nb.CheckpointManager(tmp_path, metric="score", mode=mode)
    rows = mgr.list()
    # (the last improvement is the cell's last state: its end save takes its place)
    assert rows["score"].dropna().tolist() == values
    assert rows["note"].tolist() == ["score improved"] * 2 + ["end of cell"]
    assert mgr.load("best").metrics["score"] == values[-1]


TRAINER = """
import sys, time, torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with ckpt_nb.auto(sys.argv[1], name="train", every_steps=1, sync=True,
                  namespace={"model": model, "opt": opt}):
    for epoch in ckpt_nb.epochs(100):
        for _, x in ckpt_nb.batches([torch.ones(2)] * 2):
            opt.zero_grad(); model(x).sum().backward(); opt.step()
        if epoch == 1:
            print("trained", flush=True)
            time.sleep(120)  # (alive, mid-run, as a kernel still training)
"""


def trained(store: Path, held_at: int) -> subprocess.Popen:
    """TRAINER in a process of its own, once it has trained epoch ``held_at`` (held
    there, alive, as a kernel still training)."""
    trainer = warm_python.Popen(
        [sys.executable, "-c", TRAINER.replace("if epoch == 1:", f"if epoch == {held_at}:"),
         str(store)], stdout=subprocess.PIPE, text=True)
    assert trainer.stdout is not None and "trained\n" in iter(trainer.stdout.readline, "")
    return trainer


def run_the_cell_here(store: Path) -> int:
    """TRAINER's cell run again in this process (a fresh kernel): the epoch it starts at."""
    model = torch.nn.Linear(2, 1)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}
    with ckpt_nb.auto(str(store), name="train", namespace=ns, sync=True):
        for epoch in ckpt_nb.epochs(100):
            return epoch
    return 100


def test_a_run_another_live_process_trains_is_not_resumed_one_that_died_is(
        tmp_path: Path, capsys) -> None:
    """The same notebook run in a second kernel took the first kernel's run over mid-way,
    and both trained it on, side by side."""
    import subprocess
    import sys
    for store, alive in ((tmp_path / "alive", True), (tmp_path / "died", False)):
        trainer = warm_python.Popen([sys.executable, "-c", TRAINER, str(store)],
                                   stdout=subprocess.PIPE, text=True)
        try:
            assert trainer.stdout is not None
            assert "trained\n" in iter(trainer.stdout.readline, "")
            if not alive:
                trainer.kill()
                trainer.wait(timeout=60)
            model = torch.nn.Linear(2, 1)
            ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}
            with ckpt_nb.auto(str(store), name="train", namespace=ns, sync=True):
                for _ in ckpt_nb.epochs(100):  # (a resume is the loop helpers')
                    break
        finally:
            trainer.kill()
            trainer.wait(timeout=60)
        out = capsys.readouterr().out
        assert (f"that process {trainer.pid} (another kernel, still running) saved" in out) \
            is alive
        assert ("resumed from" in out) is not alive, out


def resident_mib() -> int:
    with open("/proc/self/status") as status:
        return int(status.read().split("RssAnon:")[1].split()[0]) // 1024


def test_a_closed_session_lets_go_of_its_staging_buffers(tmp_path: Path) -> None:
    """Each run of a cell kept its two sets of staging buffers (twice the model) in a
    closed session on the stack: a kernel that reran a training cell ran out of memory."""
    from ckpt_nb import _session
    model = torch.nn.Linear(4096, 4096)  # (64 MiB of weights, 64 of grads)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ns = {"model": model, "opt": opt}
    grown = []
    for _ in range(4):
        with ckpt_nb.auto(str(tmp_path), namespace=ns, every_steps=1):
            for _ in ckpt_nb.batches(range(2)):
                model(torch.ones(2, 4096)).sum().backward()
                opt.step()
                opt.zero_grad()
        grown.append(resident_mib())
        assert _session._sessions == []
    assert grown[-1] - grown[0] < 64, grown  # (it was 128 MiB a run)


def test_a_background_save_failing_again_the_same_way_is_counted_not_repeated(
        tmp_path: Path, file_size_limit, capsys) -> None:
    """A full disk printed the same 300-character line (but for the pack's name) at
    every trigger of the cell."""
    model = torch.nn.Linear(1024, 1024)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ns = {"model": model, "opt": opt}
    with ckpt_nb.auto(str(tmp_path), namespace=ns, every_steps=1, strategy="full"):
        for i, _ in ckpt_nb.batches(range(8)):
            if i == 2:
                file_size_limit(1 << 20)  # (a pack past 1 MiB is refused, as on a full disk)
            model(torch.ones(2, 1024)).sum().backward()
            opt.step()
            opt.zero_grad()
    file_size_limit(None)
    err = capsys.readouterr().err
    assert err.count("a background save failed: StoreError") == 1, err
    assert err.rstrip().endswith("more background saves failed the same way"), err
    assert ckpt_nb.CheckpointManager(tmp_path).verify().ok  # (those before, intact)


def test_a_dead_run_is_resumed_past_a_newer_one_another_live_process_trains(
        tmp_path: Path, capsys) -> None:
    """A killed kernel's fresh restart, with another kernel training the same cell into
    the store, saw that kernel's newer checkpoint, trained from scratch and let retention
    prune its own dead run."""
    trainers = []
    try:
        for _ in range(2):  # (the second starts a run of its own: the first is alive)
            trainers.append(trained(tmp_path, held_at=1))
            if len(trainers) == 1:
                dead_newest = ckpt_nb.CheckpointManager(tmp_path).resolve("latest")
        died, alive = trainers
        died.kill()
        died.wait(timeout=60)
        assert ckpt_nb.CheckpointManager(tmp_path).resolve("latest") != dead_newest
        run_the_cell_here(tmp_path)
    finally:
        for trainer in trainers:
            trainer.kill()
            trainer.wait(timeout=60)
    out = capsys.readouterr().out
    assert f"resumed from {dead_newest} " in out, out
    assert f"process {alive.pid} (another kernel, still running)" in out, out


def test_a_run_a_live_process_took_over_is_not_resumed_from_its_older_checkpoints(
        tmp_path: Path, capsys) -> None:
    """A killed kernel's run, resumed by a second kernel that is training it on now:
    a third kernel passed over the second's checkpoints, then resumed the same run from
    the dead one's older checkpoint and trained it a second time beside it (review)."""
    trainers = []
    try:
        for held_at in (1, 3):  # (the second resumes the first's run, and is held in it)
            trainers.append(trained(tmp_path, held_at))
            if len(trainers) == 1:
                trainers[0].kill()
                trainers[0].wait(timeout=60)
        started_at = run_the_cell_here(tmp_path)
    finally:
        for trainer in trainers:
            trainer.kill()
            trainer.wait(timeout=60)
    out = capsys.readouterr().out
    assert started_at == 0 and "resumed from" not in out, out
    assert f"process {trainers[1].pid} (another kernel, still running) saved: this cell " \
        "starts a run of its own" in out, out
