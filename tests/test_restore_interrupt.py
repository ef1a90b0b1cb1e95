"""Ctrl-C during a restore (``CheckpointManager.restore``, ``ckpt_nb.rollback``,
``%ckpt_rollback``) leaves the state all as before or all the checkpoint's, never a mix,
and says which.

The interrupts are real SIGINTs sent to a real process: by a Stateful that sends one to
its own process as it loads (so it lands in the middle of the commit, every time), by a
``progress`` callback while the checkpoint is read, and by a timer at random moments.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_kernel import TIMEOUT, Kernel  # (a real ipykernel)
from test_session_jobs import script  # (a script file run in a fresh interpreter)

COMMON = '''
import hashlib, json, os, random, signal, threading, time, torch, ckpt_nb

class Interrupting:
    """A Stateful that takes its state, then sends its own process SIGINT ``times``
    times: a real Ctrl-C in the middle of a restore's commit (such objects load first)."""
    def __init__(self):
        self.value, self.times = "ckpt", 0
    def state_dict(self):
        return {"value": self.value}
    def load_state_dict(self, state):
        self.value = state["value"]
        for _ in range(self.times):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # (its handler runs: the next is an interrupt of its own)

def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().numpy())
    return h.hexdigest()[:12]

def parts():
    return {"model": digest(model.state_dict().values()),
            "opt": digest(v for s in opt.state_dict()["state"].values() for v in s.values()),
            "interrupting": interrupting.value, "rng": digest([torch.get_rng_state()]),
            **({"history": repr(history)} if "history" in globals() else {})}

def train():
    opt.zero_grad(); model(torch.randn(8, 64)).sum().backward(); opt.step()

def change():
    """Everything a restore puts back, changed: the state as it is "before" one."""
    train(); interrupting.value = "before"; torch.rand(1)
    if "history" in globals():
        history.append(len(history))

def which(ckpt, before):
    """Each part: the checkpoint's, as before, or neither."""
    now = parts()
    return {k: "ckpt" if now[k] == ckpt[k] else "before" if now[k] == before[k] else "??"
            for k in now}

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, WIDTH), torch.nn.ReLU(),
                            torch.nn.Linear(WIDTH, 10))
opt = torch.optim.AdamW(model.parameters())
interrupting = Interrupting()
train()
'''

MANAGER = COMMON + '''
mgr = ckpt_nb.CheckpointManager("store")
mgr.save(model, opt, interrupting=interrupting)
mgr.restore("latest", model, opt, interrupting=interrupting)
ckpt = parts()  # (as a restore leaves it)
change()
before = parts()
interrupting.times = TIMES

def interrupt_reading(done, total):
    if not getattr(interrupt_reading, "sent", False):
        interrupt_reading.sent = True
        os.kill(os.getpid(), signal.SIGINT)

try:
    mgr.restore("latest", model, opt, interrupting=interrupting, progress=PROGRESS)
    error = None
except KeyboardInterrupt as stop:
    error = str(stop)
print(json.dumps({"which": which(ckpt, before), "error": error, "id": mgr.head}))
'''


def manager_script(tmp_path: Path, *, times: int = 0,
                   reading: bool = False) -> tuple[dict, str]:
    """Run MANAGER in a fresh interpreter: (what it printed, its stderr)."""
    code = MANAGER.replace("WIDTH", "256").replace("TIMES", str(times)) \
        .replace("PROGRESS", "interrupt_reading" if reading else "None")
    done = script(tmp_path, "restore.py", code)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


PARTS = ("model", "opt", "interrupting", "rng")  # (and history, where there is one)
ALL_CKPT, ALL_BEFORE = dict.fromkeys(PARTS, "ckpt"), dict.fromkeys(PARTS, "before")


@pytest.mark.parametrize("times", [1, 3])
def test_an_interrupt_in_restores_commit_is_taken_once_it_is_done(tmp_path: Path,
                                                                 times: int) -> None:
    """The first object loaded sends SIGINT: the rest still load (the RNG, loaded before
    them, stays loaded), then KeyboardInterrupt says the restore finished. A second and a
    third Ctrl-C are held too: they do not break the restore in two."""
    result, stderr = manager_script(tmp_path, times=times)
    assert result["which"] == ALL_CKPT
    assert result["error"] == f"interrupted during the restore of {result['id']}, which " \
        "finished first: all of it was put back"
    assert stderr.count(f"ckpt_nb: interrupt received: the restore of {result['id']} "
                        "finishes first (it puts back all or nothing), then the interrupt is "
                        "taken") == 1, stderr


def test_an_interrupt_while_restore_reads_changes_nothing_and_says_so(tmp_path: Path) -> None:
    result, _ = manager_script(tmp_path, reading=True)
    assert result["which"] == ALL_BEFORE
    assert result["error"] == "restore interrupted before anything was put back: nothing " \
        "was changed"


SOAK = COMMON + '''
mgr = ckpt_nb.CheckpointManager("store")
mgr.save(model, opt, interrupting=interrupting)
took = time.monotonic()
mgr.restore("latest", model, opt, interrupting=interrupting)
took = time.monotonic() - took
ckpt = parts()
seen = []
for _ in range(TRIES):
    change()
    before = parts()
    timer = threading.Timer(random.uniform(0, took), os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        mgr.restore("latest", model, opt, interrupting=interrupting)
        error = None
    except KeyboardInterrupt as stop:
        error = str(stop)
    try:
        timer.join(); time.sleep(0.05)  # (one that came after the restore: taken here)
    except KeyboardInterrupt:
        pass
    seen.append({"which": which(ckpt, before), "error": error})
print(json.dumps({"seen": seen, "id": mgr.head}))
'''


def test_interrupts_at_random_moments_of_a_restore_leave_no_mix(tmp_path: Path) -> None:
    """A model of 30 MB (90 with its optimizer), restored again and again, each time with a
    SIGINT from a timer at a random moment of it: every time all before or all the
    checkpoint's, with the message that says which."""
    code = SOAK.replace("WIDTH", "100000").replace("TRIES", "10")
    done = script(tmp_path, "soak.py", code)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    finished = f"interrupted during the restore of {result['id']}, which finished first: " \
        "all of it was put back"
    for seen in result["seen"]:
        if seen["error"] == "restore interrupted before anything was put back: nothing " \
                "was changed":
            assert seen["which"] == ALL_BEFORE, seen
        elif seen["error"] == "":  # (a bare KeyboardInterrupt: the timer's came outside the
            # restore's guard, just before it began or just after it ended, as a loaded
            # machine's scheduling may have it)
            assert seen["which"] in (ALL_BEFORE, ALL_CKPT), seen
        else:  # (finished first, or the interrupt came after it)
            assert seen["error"] in (finished, None), seen
            assert seen["which"] == ALL_CKPT, seen


ROLLBACK = COMMON + '''
history = [0]
with ckpt_nb.auto("store", namespace=globals()):
    train()
ckpt_nb.rollback("latest", directory="store", namespace=globals())
ckpt = parts()  # (as a rollback leaves it)
change()
before = parts()
interrupting.times = TIMES
try:
    cid = ckpt_nb.rollback("latest", directory="store", namespace=globals())
    error = None
except KeyboardInterrupt as stop:
    error = str(stop)
print(json.dumps({"which": which(ckpt, before), "error": error}))
'''


@pytest.mark.parametrize("times", [1, 2])
def test_an_interrupt_in_a_rollbacks_commit_is_taken_once_it_is_done(tmp_path: Path,
                                                                    times: int) -> None:
    """The objects, the variables (history) and the RNG all go back, then the interrupt."""
    code = ROLLBACK.replace("WIDTH", "256").replace("TIMES", str(times))
    done = script(tmp_path, "rollback.py", code)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["which"] == ALL_CKPT | {"history": "ckpt"}
    cid = re.findall(r"ckpt_nb: rolled back to (\w+)", done.stdout)
    assert len(cid) == 2 and cid[0] == cid[1], done.stdout
    assert result["error"] == f"interrupted during the rollback to {cid[1]}, which " \
        "finished first: all of it was put back"
    assert done.stderr.count(f"ckpt_nb: interrupt received: the rollback to {cid[1]} "
                             "finishes first") == 1, done.stderr


def test_an_interrupt_in_ckpt_rollback_in_a_kernel_is_taken_once_it_is_done(
        tmp_path: Path) -> None:
    """The same in a real ipykernel: the cell ends with the one-line KeyboardInterrupt
    that says the rollback finished, and the state is all the checkpoint's."""
    kernel = Kernel(tmp_path)
    try:
        kernel.client.wait_for_ready(timeout=TIMEOUT)
        setup = "%load_ext ckpt_nb\nhistory = [0]\n" + COMMON.replace("WIDTH", "256")
        for cell in (setup, "%%ckpt_auto --dir store\ntrain()", "%ckpt_rollback latest",
                     "ckpt = parts(); change(); before = parts(); interrupting.times = 2"):
            out, reply = kernel.run(cell)
            assert reply["status"] == "ok", out
        out, reply = kernel.run("%ckpt_rollback latest")
        assert reply["status"] == "error", out
        cid = re.search(r"rolled back to (\w+)", out)
        assert cid is not None, out
        assert f"KeyboardInterrupt: interrupted during the rollback to {cid[1]}, which " \
            "finished first: all of it was put back" in out
        assert out.count("ckpt_nb: interrupt received: the rollback to") == 1, out
        out, reply = kernel.run("print(json.dumps(which(ckpt, before)))")
        assert json.loads(out.strip().splitlines()[-1]) == ALL_CKPT | {"history": "ckpt"}
    finally:
        kernel.close()



OPENING = COMMON + '''
import sys
history = [0]
with ckpt_nb.auto("store", namespace=globals()):
    train()
ckpt_nb.rollback("latest", directory="store", namespace=globals())
ckpt = parts()  # (as a rollback leaves it)

def interrupt_in(code):
    """Send this process SIGINT as ``code`` is called: a real Ctrl-C at that point."""
    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code and not profile.sent:
            profile.sent = True
            os.kill(os.getpid(), signal.SIGINT)
    profile.sent = False
    sys.setprofile(profile)

seen = {}
for name, code in (("opening", ckpt_nb.CheckpointManager._open_catalog.__code__),
                   ("closing", ckpt_nb._session.AutoSession.close.__code__)):
    change()
    before = parts()
    interrupt_in(code)
    try:
        ckpt_nb.rollback("latest", directory="store", namespace=globals())
        error = None
    except KeyboardInterrupt as stop:
        error = str(stop)
    finally:
        sys.setprofile(None)
    seen[name] = {"which": which(ckpt, before), "error": error}
print(json.dumps(seen))
'''


def test_an_interrupt_while_a_rollback_opens_or_closes_its_session_says_what_it_did(
        tmp_path: Path) -> None:
    """%ckpt_rollback in a kernel whose cell had ended opens a temporary session on the
    store: a Ctrl-C there (about 1 in 6, 0-100 ms in) was a bare KeyboardInterrupt with
    ckpt_nb's frames, not "nothing was changed"; one while it closed, after the state went
    back, a bare one too."""
    done = script(tmp_path, "opening.py", OPENING.replace("WIDTH", "256"))
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["opening"] == {"which": ALL_BEFORE | {"history": "before"}, "error":
                               "rollback interrupted before anything was put back: nothing "
                               "was changed"}
    cid = re.findall(r"ckpt_nb: rolled back to (\w+)", done.stdout)
    assert seen["closing"] == {"which": ALL_CKPT | {"history": "ckpt"}, "error":
                               f"interrupted during the rollback to {cid[-1]}, which "
                               "finished first: all of it was put back"}
