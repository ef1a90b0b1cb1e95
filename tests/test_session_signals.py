"""A preemption's SIGTERM (save_on_signals, --on-signal): the state is saved at the next
consistent point and the process ends as the signal asks; a new process resumes bit-exact.
Scripts that train on digits send the signal to themselves at a chosen batch, so that it
lands there whatever the machine's speed; they run in fresh interpreters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError

import ckpt_nb
from digits_code import LOAD_DIGITS  # (scikit-learn's digits, scikit-learn not imported)
from test_session_jobs import REPO, script  # (a script file run in a fresh interpreter)
import warm_python  # (fresh interpreters forked from a warm one)

TRAIN = """
import hashlib, os, signal, sys, time, torch, ckpt_nb
""" + LOAD_DIGITS.replace("{", "{{").replace("}", "}}") + """
torch.set_num_threads(1)
digits = load_digits()
X = torch.tensor(digits.data / 16.0, dtype=torch.float32)
Y = torch.tensor(digits.target)
del digits
torch.manual_seed(0)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=100,
                                     shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                            torch.nn.Linear(32, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
{before}
with ckpt_nb.auto("store", every_steps=1000{options}):
    for epoch in ckpt_nb.epochs(3):
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if (epoch, i) == (1, 5) and not os.path.exists("signalled"):
                open("signalled", "w").close()
                {signal}
print("params", hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                      for p in model.parameters())).hexdigest())
"""
SIGTERM = "os.kill(os.getpid(), signal.SIGTERM)"
STOPPED_AT = 18 + 6  # (18 batches an epoch: epoch 1's batch 5 is the 24th step)


def train(before: str = "", options: str = "", signal: str = SIGTERM) -> str:
    return TRAIN.format(before=before, options=options, signal=signal)


def checkpoints(store: Path) -> list[tuple[int, str]]:
    with ckpt_nb.CheckpointManager(store) as mgr:
        rows = mgr.list()
    return list(zip(rows["step"], rows["note"]))


def params(stdout: str) -> str:
    return stdout.split("params ")[1].strip()


def test_sigterm_saves_at_the_next_consistent_point_exits_143_and_a_new_process_resumes(
        tmp_path: Path) -> None:
    """auto(every_steps=1000) SIGTERMed at step 24: rc -15 and an empty store, every step
    lost. Now the step is saved, the script exits with 143, and running it again ends
    bit-identical to a run never stopped."""
    (tmp_path / "ref").mkdir()
    unstopped = script(tmp_path / "ref", "train.py", train(signal="pass"))
    assert unstopped.returncode == 0, unstopped.stderr
    stopped = script(tmp_path, "train.py", train())
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stdout + stopped.stderr
    assert "params" not in stopped.stdout
    assert "ckpt_nb: SIGTERM received: saving at the next consistent point, then ending " \
        "(SIGTERM again ends the process at once)" in stopped.stderr
    [(step, note)] = checkpoints(tmp_path / "store")
    assert (step, note) == (STOPPED_AT, "SIGTERM")
    with ckpt_nb.CheckpointManager(tmp_path / "store") as mgr:
        saved = mgr.list().iloc[0]
    assert (saved["epoch"], saved["batch_idx"]) == (1, 6)  # (before batch 6 is fetched)
    assert f"ckpt_nb: SIGTERM at step {STOPPED_AT}: saved as checkpoint {saved['id']}; " \
        "exiting with status 143, as SIGTERM asks: running the script again goes on from " \
        "there" in stopped.stdout
    resumed = script(tmp_path, "train.py", train())
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {saved['id']} (epoch 1, batch 6, step {STOPPED_AT})" in resumed.stdout
    assert params(resumed.stdout) == params(unstopped.stdout)


def test_a_handler_of_the_users_gets_the_signal_once_saved_and_is_put_back(
        tmp_path: Path) -> None:
    """A SIGTERM handler the script set (a flag its loop reads) is chained: ckpt_nb saves
    first, then hands it the signal; training goes on as the handler decides, and the
    handler is the signal's again after the block."""
    before = """
def on_term(signum, frame):
    with ckpt_nb.CheckpointManager("store") as mgr:
        print("handler: saved before it", mgr.list()["step"].tolist(), flush=True)
signal.signal(signal.SIGTERM, on_term)
"""
    done = script(tmp_path, "train.py", train(before) + "print('after', "
                  "signal.getsignal(signal.SIGTERM) is on_term)\n")
    assert done.returncode == 0, done.stderr
    assert f"handler: saved before it [{STOPPED_AT}]" in done.stdout, done.stdout
    assert "the handler set before ckpt_nb's takes it now" in done.stdout
    assert "after True" in done.stdout
    assert "SIGTERM received: saving at the next consistent point, then handing it to the " \
        "handler set before ckpt_nb's" in done.stderr
    assert checkpoints(tmp_path / "store") == [(STOPPED_AT, "SIGTERM"), (54, "end of cell")]


# The signal sent as the step-18 save is written (in the main thread with sync=True, on the
# writer's thread else): where it lands is then the save's, whatever the machine's speed.
SIGNAL_AS_STEP_18_IS_WRITTEN = """
import ckpt_nb._manager
written = ckpt_nb._manager.CheckpointManager.save_state
def save_state(self, *args, **kwargs):
    if kwargs.get("step") == 18 and not os.path.exists("signalled"):
        open("signalled", "w").close()
        os.kill(os.getpid(), signal.SIGTERM)
    return written(self, *args, **kwargs)
ckpt_nb._manager.CheckpointManager.save_state = save_state
"""


@pytest.mark.parametrize("sync", [True, False])
def test_a_signal_during_a_save_ends_with_that_save_named(tmp_path: Path, sync: bool) -> None:
    """With sync=True, SIGTERM while step 18's save was written took "nothing new to save
    since checkpoint <step 12's>" and ended inside the save: step 18's was lost (1,000
    steps with --every-steps 1000). In the background, it named step 12's while step 18's
    was being written. The newest checkpoint, in the store, is the one named."""
    code = train(SIGNAL_AS_STEP_18_IS_WRITTEN, f", sync={sync}", "pass") \
        .replace("every_steps=1000", "every_steps=6")
    done = script(tmp_path, "train.py", code)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    with ckpt_nb.CheckpointManager(tmp_path / "store") as mgr:
        rows = mgr.list()
        assert mgr.verify().ok
    assert 18 in rows["step"].tolist() and rows["step"].max() <= 19, rows
    newest = rows["id"].iloc[-1]
    assert f"saved as checkpoint {newest}" in done.stdout or \
        f"nothing new to save since checkpoint {newest}" in done.stdout, done.stdout


def test_a_signal_during_a_save_longer_than_the_grace_waits_for_it(tmp_path: Path) -> None:
    """A save that outlasts the grace (a large state written to a slow disk, --sync): the
    grace ran from the signal, and its end cut the save short, "no consistent point came
    within 0.5 s of SIGTERM: ending without a save" after "finishing the save in
    progress", step 18's save lost. The save is waited for and named."""
    slow = SIGNAL_AS_STEP_18_IS_WRITTEN.replace(
        "os.kill(os.getpid(), signal.SIGTERM)\n",
        "os.kill(os.getpid(), signal.SIGTERM)\n        time.sleep(1.5)\n") + \
        "import ckpt_nb._session\nckpt_nb._session._SIGNAL_GRACE = 0.5\n"
    code = train(slow, ", sync=True", "pass").replace("every_steps=1000", "every_steps=6")
    done = script(tmp_path, "train.py", code)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    assert "no consistent point came" not in done.stderr, done.stderr
    with ckpt_nb.CheckpointManager(tmp_path / "store") as mgr:
        rows = mgr.list()
    assert rows["step"].tolist() == [6, 12, 18], rows
    assert f"SIGTERM at step 18: saved as checkpoint {rows['id'].iloc[-1]}; exiting with " \
        "status 143" in done.stdout, done.stdout


def test_a_signal_to_the_process_group_saves_though_the_loaders_workers_died(
        tmp_path: Path) -> None:
    """Slurm's scancel (``kill -TERM -PGID``) reaches the DataLoader's workers too, which
    die: the next fetch raised "DataLoader worker exited unexpectedly" and the run ended
    unsaved, exit 1. The state before that fetch is saved, and a rerun goes on from it."""
    code = train(signal="os.killpg(os.getpgid(0), signal.SIGTERM)") \
        .replace("shuffle=True)", "shuffle=True, num_workers=2)") \
        .replace("import hashlib,", "import hashlib, time,")
    code = "import os\nos.setsid()  # (its own process group: the signal's, not pytest's)\n" \
        + code.replace("opt.step()\n", "opt.step()\n            time.sleep(0.02)\n", 1)
    (tmp_path / "ref").mkdir()
    unstopped = script(tmp_path / "ref", "train.py", code.replace("os.killpg(", "(", 1))
    assert unstopped.returncode == 0, unstopped.stderr
    done = script(tmp_path, "train.py", code)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    [(step, note)] = checkpoints(tmp_path / "store")
    assert (step, note) == (STOPPED_AT, "SIGTERM"), done.stdout + done.stderr
    assert "exited unexpectedly" not in done.stdout
    resumed = script(tmp_path, "train.py", code)
    assert resumed.returncode == 0, resumed.stderr
    assert params(resumed.stdout) == params(unstopped.stdout)


@pytest.mark.parametrize("order", [
    "shuffle=True",
    # (the workers' seed from the loader's generator, the sampler's order from the global one)
    "sampler=torch.utils.data.RandomSampler(X), generator=torch.Generator().manual_seed(5)",
])
def test_a_signal_at_an_epochs_end_resumes_a_persistent_workers_loader_in_its_order(
        tmp_path: Path, order: str) -> None:
    """SIGTERM in epoch 0's last step is saved at epoch 1's start. The resume made the
    loader's persistent-workers iterator (kept by the unstopped run since epoch 0) anew,
    which drew its workers' seed from the global generator the resume had just set (or the
    loader's generator=, its sampler the global one for its first indices): epoch 1 came
    in another order, the weights not the unstopped run's."""
    code = train().replace("(epoch, i) == (1, 5)", "(epoch, i) == (0, 17)") \
        .replace("shuffle=True)", f"{order}, num_workers=2, persistent_workers=True)")
    (tmp_path / "ref").mkdir()
    unstopped = script(tmp_path / "ref", "train.py", code.replace(SIGTERM, "pass"))
    assert unstopped.returncode == 0, unstopped.stderr
    stopped = script(tmp_path, "train.py", code)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stdout + stopped.stderr
    assert checkpoints(tmp_path / "store") == [(18, "SIGTERM")]
    resumed = script(tmp_path, "train.py", code)
    assert resumed.returncode == 0, resumed.stderr
    assert "(epoch 1, batch 0, step 18)" in resumed.stdout, resumed.stdout
    assert params(resumed.stdout) == params(unstopped.stdout)


@pytest.mark.parametrize("options", [", save_on_signals=()", ", save_on_signals='none'"])
def test_save_on_signals_off_leaves_sigterm_its_default(tmp_path: Path, options: str) -> None:
    done = script(tmp_path, "train.py", train(options=options))
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr
    assert checkpoints(tmp_path / "store") == []


def test_a_second_sigterm_ends_the_process_at_once_unsaved(tmp_path: Path) -> None:
    done = script(tmp_path, "train.py", train(signal=f"{SIGTERM}; {SIGTERM}"))
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr
    assert "ckpt_nb: SIGTERM again: ending at once, NOT saved; no checkpoint holds the " \
        "run" in done.stderr
    assert checkpoints(tmp_path / "store") == []


def test_no_consistent_point_after_the_signal_ends_the_process_after_the_grace(
        tmp_path: Path) -> None:
    """Code that never reaches a consistent point after the signal (a call that does not
    return) ends as the signal's default would, once the grace is over."""
    before = "import ckpt_nb._session\nckpt_nb._session._SIGNAL_GRACE = 0.5"
    done = script(tmp_path, "train.py", train(before, signal=f"{SIGTERM}; time.sleep(120)"))
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    assert "ckpt_nb: no consistent point came within 0.5 s of SIGTERM: ending without a " \
        "save (no checkpoint holds the run)" in done.stderr
    assert checkpoints(tmp_path / "store") == []


def test_no_consistent_point_after_the_signal_hands_it_to_the_users_handler_after_the_grace(
        tmp_path: Path) -> None:
    """With a handler of the user's chained, the grace's end was handed to the main thread
    by _thread.interrupt_main, which wakes no call: one that does not return (here a wait
    on an event nobody sets) kept the handler from ever running, the process alive past
    its "ending without a save" line. The main thread is sent the signal itself."""
    before = """
import ckpt_nb._session, threading
ckpt_nb._session._SIGNAL_GRACE = 0.5
def on_term(signum, frame):
    print("handler: took it", flush=True)
    sys.exit(7)
signal.signal(signal.SIGTERM, on_term)
"""
    code = train(before, signal=f"{SIGTERM}; threading.Event().wait()")
    (tmp_path / "train.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("JPY_SESSION_NAME", None)
    try:  # (without the signal it waits for good: 120 s, well over a loaded machine's run)
        done = warm_python.run([sys.executable, str(tmp_path / "train.py")], cwd=tmp_path,
                               env=env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the handler of the user's never ran: the process waited on, past the "
                    "grace")
    assert done.returncode == 7, done.stdout + done.stderr
    assert "handler: took it" in done.stdout
    assert "ckpt_nb: no consistent point came within 0.5 s of SIGTERM: ending without a " \
        "save (no checkpoint holds the run)" in done.stderr
    assert "SIGTERM again:" not in done.stderr, done.stderr  # (one signal came)
    assert checkpoints(tmp_path / "store") == []


def test_a_signal_with_nothing_trained_since_the_last_save_ends_at_once(tmp_path: Path) -> None:
    """Nothing to save first: it does not wait for a consistent point that may never come."""
    loop = "    for epoch in ckpt_nb.epochs(3):"
    code = train().replace(loop, f"    {SIGTERM}\n    time.sleep(120)\n{loop}")
    done = script(tmp_path, "train.py", code)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    assert "ckpt_nb: SIGTERM at step 0: nothing trained to save; exiting with status 143, as " \
        "SIGTERM asks\n" in done.stdout
    assert checkpoints(tmp_path / "store") == []


@pytest.mark.parametrize(("given", "names"), [
    ("TERM", ("SIGTERM",)), ("sigterm,USR1", ("SIGTERM", "SIGUSR1")),
    ([signal.SIGUSR2, "HUP"], ("SIGUSR2", "SIGHUP")), ("none", ()), ((), ()), (None, ()),
])
def test_save_on_signals_takes_names_numbers_and_none(given: object, names: tuple) -> None:
    assert ckpt_nb.AutoConfig(save_on_signals=given).save_on_signals == names
    assert ckpt_nb.AutoConfig().save_on_signals == ("SIGTERM",)


@pytest.mark.parametrize(("given", "message"), [
    ("INT", "save_on_signals (--on-signal) cannot take SIGINT: it is the interrupt, which "
            "saves at the next consistent point already and stops the cell"),
    ("KILL", "save_on_signals (--on-signal) cannot take SIGKILL: it cannot be caught"),
    # (taken, a terminal's resize ended the script "as the signal asks")
    ("WINCH", "save_on_signals (--on-signal) cannot take SIGWINCH: its default is to ignore "
              "it: it ends nothing"),
    ("TREM", "save_on_signals (--on-signal): there is no signal 'TREM' here: name one such "
             "as TERM, USR1 or HUP, or none"),
])
def test_a_signal_that_cannot_save_is_refused_by_name(tmp_path: Path, shell, given: str,
                                                      message: str) -> None:
    with pytest.raises(ValueError) as raised:
        with ckpt_nb.auto(str(tmp_path), namespace={}, save_on_signals=given):
            pass
    assert str(raised.value) == message
    result = shell.run_cell(f"%%ckpt_auto --dir {tmp_path} --on-signal {given}\npass",
                            store_history=False)
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec) == f"%ckpt_auto: {message}"


def test_the_magic_takes_sigterm_for_the_cell_alone_and_on_signal_none_leaves_it(
        tmp_path: Path, shell) -> None:
    before = signal.getsignal(signal.SIGTERM)
    cell = "import signal\nseen = signal.getsignal(signal.SIGTERM)"
    assert shell.run_cell(f"%%ckpt_auto --dir {tmp_path}\n{cell}", store_history=False).success
    assert isinstance(getattr(shell.user_ns["seen"], "__self__", None), ckpt_nb.AutoSession)
    assert signal.getsignal(signal.SIGTERM) is before
    assert shell.run_cell(f"%%ckpt_auto --dir {tmp_path} --on-signal none\n{cell}",
                          store_history=False).success
    assert shell.user_ns["seen"] is before


def test_a_handler_the_cells_code_sets_stays_after_the_cell(tmp_path: Path, shell) -> None:
    """A SIGTERM handler set inside the block or cell (the code's own, or a library's) was
    replaced at its end by the one before ckpt_nb's (SIG_DFL): the process lost it without
    a word. It stays, as a handler set before the cell does."""
    before = signal.getsignal(signal.SIGTERM)

    def mine(signum: int, frame: object) -> None:
        pass

    try:
        with ckpt_nb.auto(str(tmp_path / "block"), namespace={"model": torch.nn.Linear(2, 2)}):
            signal.signal(signal.SIGTERM, mine)
        assert signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, before)
        shell.user_ns.update(mine=mine, model=torch.nn.Linear(2, 2))
        assert shell.run_cell(f"%%ckpt_auto --dir {tmp_path / 'cell'}\nimport signal\n"
                              "signal.signal(signal.SIGTERM, mine)", store_history=False).success
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_graces_end_in_a_kernel_says_why_in_the_notebook(tmp_path: Path) -> None:
    """No consistent point within the grace ends the kernel, as the signal would: the line
    that says so, sent to the notebook from the kernel's own thread, was cut off by the
    exit, and the kernel died without a word in the cell."""
    from test_kernel import Kernel  # (a real ipykernel, forked warm: conftest)
    kernel = Kernel(tmp_path)
    try:
        kernel.setup()
        kernel.run("import signal, ckpt_nb._session\nckpt_nb._session._SIGNAL_GRACE = 0.5")
        msg_id = kernel.execute(f"""%%ckpt_auto --dir {tmp_path / 'store'} --every-steps 1000
for epoch in ckpt_nb.epochs(1):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(120)  # (a call that does not return)
""")
        said = "ckpt_nb: no consistent point came within 0.5 s of SIGTERM: ending without " \
            "a save (no checkpoint holds the run)"
        try:
            out = kernel.read(msg_id, lambda text: said in text, timeout=60)
        except TimeoutError as stopped:
            out = str(stopped)
        assert said in out, out
    finally:
        kernel.close()


def test_a_signal_to_a_kernels_process_group_saves_though_its_loaders_workers_died(
        tmp_path: Path) -> None:
    """scancel's SIGTERM to the kernel's process group ends the loader's workers too: torch's
    SIGCHLD handler raised their death mid-step (here inside ckpt_nb's own handler), "not
    saving after RuntimeError: the model changed since the last consistent point", every
    step lost. It is held while the signal is pending: the step is saved, the cell stops."""
    from test_kernel import Kernel  # (a real ipykernel, forked warm: conftest)
    kernel = Kernel(tmp_path)
    try:
        kernel.setup()
        msg_id = kernel.execute(f"""%%ckpt_auto --dir {tmp_path / 'store'} --every-steps 1000
workers = torch.utils.data.DataLoader(loader.dataset, batch_size=90, shuffle=True,
                                      num_workers=2)
for epoch in ckpt_nb.epochs(1):
    for i, (xb, yb) in ckpt_nb.batches(workers):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        if i == 2:
            print("group", os.getpgid(0), flush=True)
            while os.path.exists("hold"):  # (the step's compute: the signal comes here)
                time.sleep(0.01)
""")
        (tmp_path / "hold").touch()
        out = kernel.read(msg_id, lambda text: "group " in text)
        group = int(out.split("group ")[1].split()[0])
        assert group != os.getpgid(0)  # (the kernel's own group, not pytest's)
        workers = [int(pid) for task in Path(f"/proc/{group}/task").iterdir()
                   for pid in (task / "children").read_text().split()]
        assert workers
        os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + 60  # (no hang where they outlive it: it fails below)
        for pid in workers:  # (dead, in the compute: their SIGCHLD came there)
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and \
                    Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
                time.sleep(0.01)
        (tmp_path / "hold").unlink()
        out, reply = kernel.finish(msg_id)
        assert "RuntimeError" not in out, out
        [(step, note)] = checkpoints(tmp_path / "store")
        assert (step, note) == (3, "SIGTERM"), out
        assert reply["ename"] == "KeyboardInterrupt", out
        assert reply["evalue"].startswith("SIGTERM: the cell stopped at step 3, saved as "), out
    finally:
        kernel.close()


def test_a_sigchld_handler_the_blocks_code_sets_after_the_signal_stays(tmp_path: Path) -> None:
    """The signal wraps the SIGCHLD handler (torch's: a worker's death held while it is
    pending); one the code set after it (its own, a library's) was replaced at the block's
    end by the one the wrapper held, lost without a word. It stays, as for SIGTERM."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGCHLD)
    taken = []

    def torchs(signum: int, frame: object) -> None:
        pass

    def mine(signum: int, frame: object) -> None:
        pass

    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: taken.append(signum))
        signal.signal(signal.SIGCHLD, torchs)
        with ckpt_nb.auto(str(tmp_path / "block"), namespace={"model": torch.nn.Linear(2, 2)}):
            signal.raise_signal(signal.SIGTERM)  # (nothing to save: handed on, which returns)
            assert taken == [signal.SIGTERM]
            assert signal.getsignal(signal.SIGCHLD) is not torchs  # (the wrapper)
            signal.signal(signal.SIGCHLD, mine)
        assert signal.getsignal(signal.SIGCHLD) is mine
        with ckpt_nb.auto(str(tmp_path / "block"), namespace={"model": torch.nn.Linear(2, 2)}):
            signal.signal(signal.SIGCHLD, torchs)
            signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGCHLD) is torchs  # (the wrapper's own put back)
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGCHLD, before[1])
