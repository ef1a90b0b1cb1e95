"""Training cells whose loops the helpers do not fully track, in a real in-process IPython
shell: a loop without ckpt_nb.epochs()/batches(), batches() used more than once outside
epochs(), and optimizers stepping at different rates. None may resume silently wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpt_nb
from test_magics import run
from test_session_rerun import new_kernel

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

SETUP = """
import os, torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(300, 16)
Y = (X[:, :4].sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=30,
                                     shuffle=True)
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
step = 0

def crash_at(n):
    # A file named crash-N stops the cell with an error at step N, once.
    if os.path.exists(f"crash-{n}"):
        os.remove(f"crash-{n}")
        raise RuntimeError("crash")
"""


def checkpoints(store: Path) -> dict[str, int | None]:
    """The store's checkpoints: id -> step."""
    return {row.id: row.step for row in ckpt_nb.CheckpointManager(store).catalog.checkpoints()}


WHILE_LOOP = """%%ckpt_auto --dir {dir} --every-steps 7 --keep 2
it = iter(loader)
while step < 40:
    try:
        xb, yb = next(it)
    except StopIteration:
        it = iter(loader); continue
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
    step += 1
    crash_at(step)
del it
"""


def test_an_unresumable_run_is_said_and_kept(shell, tmp_path: Path, capsys,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop without the helpers, run again in a new kernel after a crash, trained from
    scratch without a word, and its --keep 2 deleted the crashed run's checkpoints."""
    store = tmp_path / "store"
    run(shell, SETUP)
    (tmp_path / "crash-30").write_text("")
    assert isinstance(run(shell, WHILE_LOOP.format(dir=store)).error_in_exec, RuntimeError)
    crashed = {cid for cid, step in checkpoints(store).items() if step == 30}
    assert len(crashed) == 1  # (saved at the consistent point before the error)
    crashed_id = crashed.pop()

    new_kernel(monkeypatch)
    run(shell, SETUP)
    capsys.readouterr()
    assert run(shell, WHILE_LOOP.format(dir=store)).success
    out = capsys.readouterr().out
    assert f"checkpoint {crashed_id} holds an unfinished run of this cell (step 30) that it " \
        "cannot resume: its loops do not go through ckpt_nb.epochs()/batches()" in out
    assert f"`%ckpt_rollback {crashed_id}`, then run this cell again" in out
    assert crashed_id in checkpoints(store)  # (the new run saved 6 times under --keep 2)
    assert out.count("holds an unfinished run") == 1


def test_a_run_rolled_back_to_goes_on_without_a_word(shell, tmp_path: Path, capsys,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """After the rollback the message advises, the cell goes on with that run's state:
    nothing to say."""
    store = tmp_path / "store"
    run(shell, SETUP)
    (tmp_path / "crash-30").write_text("")
    run(shell, WHILE_LOOP.format(dir=store))
    crashed_id = next(cid for cid, step in checkpoints(store).items() if step == 30)

    new_kernel(monkeypatch)
    run(shell, SETUP)
    assert run(shell, f"%ckpt_rollback {crashed_id} --dir {store}").success
    assert shell.user_ns["step"] == 30
    capsys.readouterr()
    assert run(shell, WHILE_LOOP.format(dir=store)).success
    assert "holds an unfinished run" not in capsys.readouterr().out
    assert shell.user_ns["step"] == 40


def weights(sh) -> list:
    """The model's tensors and its optimizer's."""
    state = sh.user_ns["opt"].state_dict()["state"]
    return [t.clone() for t in sh.user_ns["model"].state_dict().values()] + \
        [t.clone() for per_parameter in state.values() for t in per_parameter.values()]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.equal(y) for x, y in zip(a, b))


TRAIN_STEP = """opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step(); step += 1; crash_at(step)"""

# Three passes over one loader, and a second loader's loop after the first's: batches()
# outside epochs(), 10 batches a loop.
PASSES = """%%ckpt_auto --dir {dir} --every-steps 7
for epoch in range(3):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        """ + TRAIN_STEP + """
"""
TWO_LOADERS = """%%ckpt_auto --dir {dir} --every-steps 7
for i, (xb, yb) in ckpt_nb.batches(loader):
    """ + TRAIN_STEP.replace("        ", "    ") + """
for j, (xb, yb) in ckpt_nb.batches(loader2):
    """ + TRAIN_STEP.replace("        ", "    ") + """
"""
LOADER2 = "loader2 = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), " \
    "batch_size=30, shuffle=True)"


@pytest.mark.parametrize("kernel", ["new", "same"])
@pytest.mark.parametrize("cell, crash, said", [
    # A crash in the first pass resumes it exactly (saved at step 7), the later passes
    # running as plain loops.
    (PASSES, 9, None),
    # One in a later pass cannot be resumed: range(3) went back to 0, the position named
    # the first pass, and it trained 5 passes.
    (PASSES, 15, "its ckpt_nb.batches() went over the same loader again outside "
                 "ckpt_nb.epochs(), and a saved position does not say which pass it is in"),
    # A save in the second loader's loop named a position in the first loader's.
    (TWO_LOADERS, 15, "it ran a second ckpt_nb.batches() loop outside ckpt_nb.epochs(), "
                      "and a saved position does not say which loop it is in"),
])
def test_batches_outside_epochs_never_resumes_wrong(shell, tmp_path: Path, capsys,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    cell: str, crash: int,
                                                    said: str | None, kernel: str) -> None:
    """Outside epochs(), only the cell run's first batches() loop is tracked; a run
    saved after a later one began is not resumed from there, and says so: it resumes
    from its newest checkpoint saved before (step 7, in the first loop: exact), in the
    kernel that stopped it too (its loops went back to the start on the objects as the
    stop left them: three more passes on top, its steps counted from 0 again)."""
    setup = SETUP + LOADER2
    run(shell, setup)
    assert run(shell, cell.format(dir=tmp_path / "ref")).success
    expected, steps = weights(shell), shell.user_ns["step"]

    run(shell, setup)
    (tmp_path / f"crash-{crash}").write_text("")
    store = tmp_path / "run"
    assert isinstance(run(shell, cell.format(dir=store)).error_in_exec, RuntimeError)
    out = capsys.readouterr().out
    if cell is PASSES and said is not None:  # (said as the second pass began)
        assert "this run cannot resume from its checkpoints from here on: " + said in out
    if kernel == "new":
        new_kernel(monkeypatch)
        run(shell, setup)
    assert run(shell, cell.format(dir=store)).success
    out = capsys.readouterr().out
    assert "resumed from" in out and " (batch 7, step 7)" in out  # (it said "epoch None")
    if said is not None:
        assert f"(step {crash}) holds an unfinished run of this cell that it cannot resume " \
            f"from: {said}; resuming from" in out
        assert "the run's newest checkpoint saved before its later loop began (an exact " \
            "position)" in out
    assert same(weights(shell), expected)
    assert shell.user_ns["step"] == steps


def test_a_run_with_no_exact_position_says_to_use_epochs(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its first save in the second pass, the run has no checkpoint to resume exactly:
    the refusal advised to %ckpt_rollback it and run the cell again, which trained 3
    more passes on top of it (40 steps, not 30). It trains from scratch, and says that
    epochs() resumes exactly."""
    cell = PASSES.replace("--every-steps 7", "--every-steps 12")
    run(shell, SETUP)
    assert run(shell, cell.format(dir=tmp_path / "ref")).success
    expected = weights(shell)

    run(shell, SETUP)
    (tmp_path / "crash-15").write_text("")
    store = tmp_path / "run"
    assert isinstance(run(shell, cell.format(dir=store)).error_in_exec, RuntimeError)
    new_kernel(monkeypatch)
    run(shell, SETUP)
    capsys.readouterr()
    assert run(shell, cell.format(dir=store)).success
    out = capsys.readouterr().out
    assert "resumed from" not in out and "interrupt this cell and %ckpt_rollback" not in out
    assert "holds an unfinished run of this cell (step 15) that it cannot resume: its " \
        "ckpt_nb.batches() went over the same loader again outside ckpt_nb.epochs(), and a " \
        "saved position does not say which pass it is in. This cell trains from the objects " \
        "as they are now (that checkpoint is kept while it runs); for a run that resumes " \
        "exactly, put its loops in `for epoch in ckpt_nb.epochs(N)`" in out, out
    assert same(weights(shell), expected) and shell.user_ns["step"] == 30


def steps_along_branches(store: Path) -> list[tuple[int | None, int | None]]:
    """Each checkpoint's step and its parent's, where it has one."""
    rows = {row.id: row for row in ckpt_nb.CheckpointManager(store).catalog.checkpoints()}
    return [(rows[row.parent].step, row.step) for row in rows.values() if row.parent in rows]


def test_a_run_rerun_in_its_kernel_without_resuming_counts_its_steps_on(
        shell, tmp_path: Path) -> None:
    """A loop without the helpers, run again after a crash in the same kernel, trains on
    from the objects as they are: its steps started at 0 again under the crashed run's
    checkpoint at step 30 (7, then 10), going back along the branch."""
    store = tmp_path / "store"
    run(shell, SETUP)
    (tmp_path / "crash-30").write_text("")
    assert isinstance(run(shell, WHILE_LOOP.format(dir=store)).error_in_exec, RuntimeError)
    assert run(shell, WHILE_LOOP.format(dir=store)).success
    assert (30, 37) in steps_along_branches(store)
    assert all(parent < child for parent, child in steps_along_branches(store))
    assert max(checkpoints(store).values()) == 40


INTERRUPTED_PASSES = PASSES.replace("crash_at(step)", "interrupt_at(step)")
INTERRUPT_AT = """
import signal
def interrupt_at(n):
    # A file named interrupt-N interrupts the cell at step N, once.
    if os.path.exists(f"interrupt-{n}"):
        os.remove(f"interrupt-{n}")
        os.kill(os.getpid(), signal.SIGINT)
"""


def test_a_stop_in_a_later_pass_says_the_rerun_resumes_before_it(shell, tmp_path: Path,
                                                                  capsys) -> None:
    """The stop said 'running the cell again starts over (resume needs
    ckpt_nb.epochs()/batches() ...)' of a cell that uses batches(): the rerun went on
    from the objects as they were, its steps from 0 (8, then 3, 6, 8). It says the
    checkpoint the rerun resumes from, which it does in this kernel, bit-exact; a model
    another cell trained since the stop, which this cell does not train, stays as it is."""
    setup = SETUP + INTERRUPT_AT + "head = torch.nn.Linear(2, 2)\n" \
        "head_opt = torch.optim.SGD(head.parameters(), lr=0.1)"
    run(shell, setup)
    assert run(shell, INTERRUPTED_PASSES.format(dir=tmp_path / "ref")).success
    expected, steps = weights(shell), shell.user_ns["step"]

    run(shell, setup)
    (tmp_path / "interrupt-15").write_text("")
    store = tmp_path / "run"
    error = run(shell, INTERRUPTED_PASSES.format(dir=store)).error_in_exec
    assert isinstance(error, KeyboardInterrupt)
    by_step = {step: cid for cid, step in checkpoints(store).items()}
    assert str(error) == (
        f"the cell stopped at step 16; checkpoint {by_step[16]} holds it, not its position "
        "(its ckpt_nb.batches() went over the same loader again outside ckpt_nb.epochs(), "
        "and a saved position does not say which pass it is in): running the cell again "
        f"resumes from checkpoint {by_step[7]} (step 7), the run's newest saved before that "
        "loop began, in this kernel as in a new one")
    assert run(shell, "head_opt.zero_grad(); head(torch.ones(1, 2)).sum().backward(); "
                      "head_opt.step()").success
    trained_head = [t.clone() for t in shell.user_ns["head"].state_dict().values()]
    capsys.readouterr()
    assert run(shell, INTERRUPTED_PASSES.format(dir=store)).success
    out = capsys.readouterr().out
    assert f"resuming from {by_step[7]}" in out
    assert "kept as they are: head (trained by another cell since" in out, out
    assert same(list(shell.user_ns["head"].state_dict().values()), trained_head)
    assert same(weights(shell), expected) and shell.user_ns["step"] == steps
    assert all(parent < child for parent, child in steps_along_branches(store))


def test_a_rollback_to_a_later_pass_trains_on_from_it(shell, tmp_path: Path) -> None:
    """A rollback chooses that checkpoint's state: the rerun does not resume the run's
    exact position before it, but runs its loops from the start on that state."""
    run(shell, SETUP + INTERRUPT_AT)
    (tmp_path / "interrupt-15").write_text("")
    store = tmp_path / "run"
    run(shell, INTERRUPTED_PASSES.format(dir=store))
    stopped = next(cid for cid, step in checkpoints(store).items() if step == 16)
    run(shell, "opt.zero_grad(); torch.nn.functional.cross_entropy(model(X), Y).backward()"
               "; opt.step()")
    assert run(shell, f"%ckpt_rollback {stopped} --dir {store}").success
    rolled_back = shell.user_ns["step"]
    assert run(shell, INTERRUPTED_PASSES.format(dir=store)).success
    assert shell.user_ns["step"] == rolled_back + 30
    assert max(checkpoints(store).values()) == 16 + 30


VALIDATION = """%%ckpt_auto --dir {dir} --every-steps 7
for i, (xb, yb) in ckpt_nb.batches(loader):
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
losses = []
with torch.no_grad():
    for j, (xb, yb) in ckpt_nb.batches(loader2):
        losses.append(torch.nn.functional.cross_entropy(model(xb), yb).item())
        if j == 2 and not losses_seen:
            losses_seen = True
            os.kill(os.getpid(), signal.SIGINT)
"""


def test_no_save_inside_a_later_loop(shell, tmp_path: Path, capsys) -> None:
    """A validation loop's batches() after the training loop's, outside epochs(), is a
    plain loop: an interrupt there saved its position, which a resume took for the
    training loader's (it skipped that many training batches)."""
    run(shell, SETUP + LOADER2 + "\nimport signal\nlosses_seen = False")
    result = run(shell, VALIDATION.format(dir=tmp_path / "store"))
    out = capsys.readouterr().out
    assert "interrupted, but no consistent point came before the cell ended: it ran to " \
        "its end" in out
    assert isinstance(result.error_in_exec, KeyboardInterrupt)  # (after the end's save)
    assert len(shell.user_ns["losses"]) == 10
    assert [row.note for row in ckpt_nb.CheckpointManager(
        tmp_path / "store").catalog.checkpoints()] == ["every 7 steps", "end of cell"]


GAN_SETUP = """
import os, torch, ckpt_nb
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.rand(360, 16)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X), batch_size=30,
                                     shuffle=True)
G = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Sigmoid())
D = torch.nn.Linear(16, 1)
optG = torch.optim.Adam(G.parameters(), lr=1e-2)
optD = torch.optim.Adam(D.parameters(), lr=1e-2)
"""
# The discriminator steps at each batch, the generator accumulates over 4: every 4th
# batch's start is a point with no gradient waiting.
GAN = """%%ckpt_auto --dir {dir} --every-steps 2
bce = torch.nn.functional.binary_cross_entropy_with_logits
for epoch in ckpt_nb.epochs(2):
    for i, (xb,) in ckpt_nb.batches(loader):
        fake = G(torch.randn(len(xb), 4))
        optD.zero_grad()
        (bce(D(xb), torch.ones(len(xb), 1)) + bce(D(fake.detach()), torch.zeros(len(xb), 1))
         ).backward()
        optD.step()
        if os.path.exists(f"crash-{{epoch}}-{{i}}"):
            os.remove(f"crash-{{epoch}}-{{i}}")
            raise RuntimeError("crash")
        (bce(D(fake), torch.ones(len(xb), 1)) / 4).backward()
        if i % 4 == 3:
            optG.step(); optG.zero_grad()
"""


def gan_weights(sh) -> list:
    return [t.clone() for name in ("G", "D") for t in sh.user_ns[name].state_dict().values()] \
        + [t.clone() for name in ("optG", "optD")
           for s in sh.user_ns[name].state_dict()["state"].values() for t in s.values()]


def test_a_save_waits_for_the_optimizer_holding_the_gradients(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save waited for any optimizer's step: the discriminator's, at the next batch,
    ended the wait for the generator's accumulated gradients, saved without them (said
    as 'this loop backpropagates after its step', which it does not), and the resume
    diverged."""
    run(shell, GAN_SETUP)
    assert run(shell, GAN.format(dir=tmp_path / "ref")).success
    expected = gan_weights(shell)
    assert "saving without the gradients" not in capsys.readouterr().out

    run(shell, GAN_SETUP)
    (tmp_path / "crash-0-9").write_text("")
    store = tmp_path / "run"
    assert isinstance(run(shell, GAN.format(dir=store)).error_in_exec, RuntimeError)
    new_kernel(monkeypatch)
    run(shell, GAN_SETUP)
    capsys.readouterr()
    assert run(shell, GAN.format(dir=store)).success
    out = capsys.readouterr().out
    assert "resumed from" in out and "(epoch 0, batch 8, step 8)" in out
    assert "saving without the gradients" not in out
    assert same(gan_weights(shell), expected)




# The step first in the body: every point where the loop could save holds the gradients
# of the batch before.
STEP_FIRST = """%%ckpt_auto --dir {dir} --every-steps 3
for epoch in ckpt_nb.epochs(1):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        if i:
            opt.step(); opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
"""


def test_an_optimizer_left_over_the_same_parameters_holds_no_save_back(
        shell, tmp_path: Path, capsys) -> None:
    """An optimizer made again leaves the old one in the notebook, over the same
    parameters, never stepping: the new one's step is the one the gradients both hold
    wait for (the saves waited 256 steps for the old one's)."""
    run(shell, SETUP + "\nold_opt = torch.optim.SGD(model.parameters(), lr=0.1)")
    assert run(shell, STEP_FIRST.format(dir=tmp_path / "store")).success
    rows = ckpt_nb.CheckpointManager(tmp_path / "store").catalog.checkpoints()
    assert [row.note for row in rows].count("every 3 steps") == 2
    out = capsys.readouterr().out
    assert out.count("saving without the gradients accumulated since the last optimizer "
                     "step: this loop backpropagates after its step") == 1
    assert "(opt's, which stepped since this save began to wait)" in out


# WGAN-style: the critic steps 5 times at each batch, the generator accumulates over
# ``every`` batches (``stop``: it no longer steps from that batch on).
WGAN_SETUP = """
import torch, ckpt_nb
torch.manual_seed(0)
G, D = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
optG = torch.optim.SGD(G.parameters(), lr=1e-3)
optD = torch.optim.SGD(D.parameters(), lr=1e-3)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4 * 640, 8)),
                                   batch_size=4)
"""
WGAN = """%%ckpt_auto --dir {dir} --every-steps 50
for epoch in ckpt_nb.epochs(1):
    for i, (x,) in ckpt_nb.batches(data):
        for _ in range(5):
            optD.zero_grad()
            (D(G(torch.randn(4, 4)).detach()).mean() - D(x).mean()).backward()
            optD.step()
        (-D(G(torch.randn(4, 4))).mean() / 64).backward()
        if (i + 1) % 64 == 0 and i < {stop}:
            optG.step(); optG.zero_grad()
"""


def test_a_save_waits_for_an_optimizer_by_its_own_steps(shell, tmp_path: Path,
                                                         capsys) -> None:
    """The wait was given up after 256 steps of any optimizer: the critic's 5 a batch
    ended it before the generator's step at every 64th batch (320 steps), at nearly
    every save, each said "(later saves do not wait for it again)", which they did."""
    run(shell, WGAN_SETUP)
    assert run(shell, WGAN.format(dir=tmp_path / "store", stop=640)).success
    assert "saving without the gradients" not in capsys.readouterr().out
    rows = ckpt_nb.CheckpointManager(tmp_path / "store").catalog.checkpoints()
    assert {row.batch_idx % 64 for row in rows if row.note == "every 50 steps"} == {0}


def test_an_optimizer_that_stops_stepping_is_given_up_once(shell, tmp_path: Path,
                                                           capsys) -> None:
    """One whose step no longer comes holds no save back past 256 points (twice its
    interval is less), and that is said once, as what it is."""
    run(shell, WGAN_SETUP)
    assert run(shell, WGAN.format(dir=tmp_path / "store", stop=200)).success
    out = capsys.readouterr().out
    assert out.count("saving without the gradients optG accumulated: its step had not "
                     "come in 256 points where the loop could save, nor in twice the points "
                     "between its last two steps; saves wait for it again once it steps")\
        == 1, out
    rows = ckpt_nb.CheckpointManager(tmp_path / "store").catalog.checkpoints()
    assert sum(row.note == "every 50 steps" for row in rows) > 4


BATCHES = """%%ckpt_auto --dir {dir} --every-steps 7
for epoch in ckpt_nb.epochs(1):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
"""


def test_a_loader_is_told_to_be_wrapped_only_where_it_is_not(shell, tmp_path: Path,
                                                              capsys) -> None:
    """Every cell's start line said "wrap it in ckpt_nb.batches()", those that do too."""
    run(shell, SETUP)
    assert run(shell, BATCHES.format(dir=tmp_path / "a")).success
    out = capsys.readouterr().out
    assert "skipped loader (DataLoader: ckpt_nb.batches() restores its order)" in out, out
    assert run(shell, WHILE_LOOP.format(dir=tmp_path / "b")).success
    assert "skipped loader (DataLoader: wrap it in ckpt_nb.batches() to restore its order)" \
        in capsys.readouterr().out


def test_the_loop_helpers_have_a_length_and_are_no_unsaved_variable(
        shell, tmp_path: Path, capsys) -> None:
    """``tqdm(ckpt_nb.epochs(3))`` drew no total (epochs() returned a generator), and
    ``it = ckpt_nb.epochs(3)`` made the saves say "not saving it (generator)"."""
    run(shell, SETUP + "from tqdm import tqdm")
    cell = f"""%%ckpt_auto --dir {tmp_path / "store"} --every-steps 4
it = ckpt_nb.epochs(3)
for epoch in tqdm(it, desc="epochs"):
    for i, (xb, yb) in tqdm(ckpt_nb.batches(loader), desc="batches"):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward(); opt.step()
"""
    assert run(shell, cell).success
    out, err = capsys.readouterr()
    assert "epochs: 100%" in err and "| 3/3 [" in err and "| 10/10 [" in err, err
    assert "not saving" not in out and " it (" not in out, out
    assert len(ckpt_nb.epochs(2, start=1)) == 1  # (outside a session too)
    with pytest.raises(TypeError, match="has no len"):  # (tqdm draws no total, as for it)
        len(ckpt_nb.batches(iter([1])))
