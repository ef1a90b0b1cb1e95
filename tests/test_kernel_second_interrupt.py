"""A second (and third) interrupt in a real kernel that lands in ckpt_nb's own work: the
wait for the interrupt's save to be written, the cell's end waiting for it, the session's
close. The cell ends with ckpt_nb's one line naming the checkpoint to go on from, no
traceback through ckpt_nb's frames; no handler or writer thread is left behind; the
rerun resumes bit-identical to a run never stopped.

The interrupts are real SIGINTs the kernel sends its main thread at chosen points: the
first from the training loop at step ``FIRST_AT``; the others from the writer thread as it
starts the interrupt's write (not an earlier one that started late), once it sees the main
thread asleep in a wait for it (so they land in that wait, every time), or from the
store's ``close`` as the session closes. Its frames alone do not say it sleeps: they show
the wait as it is about to block, and a signal then (or one the process hands another
thread) is taken only once the wait is over, here once the write is in: the two
interrupts came as one. So the kernel's own record of the thread says it too.
"""

from __future__ import annotations

import platform
import re
import sys
from pathlib import Path

import pytest
import test_kernel
from test_kernel import EVERY, Kernel, Kernels, Reference, assert_identical, catalog, \
    position, resumed_line, train_cell

kernels, reference = test_kernel.kernels, test_kernel.reference  # (their fixtures)

FUTEX = {"x86_64": 202, "aarch64": 98}  # (the futex system call's number, by machine)
pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in FUTEX,
    reason="tells a thread asleep in a wait by /proc/self/task/*/syscall (Linux, x86_64 or "
           "aarch64)")

FIRST_AT = 4 * EVERY + 3  # (the interrupt's save is taken at that step: no trigger's)

INTERRUPTS = f'''
import signal, sys, threading
import ckpt_nb._manager as manager_module
# (names of _: no checkpoint holds them, and a resume does not arm them again)
_FIRST_AT, _SECOND, _FUTEX = {FIRST_AT}, None, {FUTEX.get(platform.machine())}
_armed = None
_main_tid = threading.get_native_id()  # (the cell runs on it; main_thread().native_id may
# be the parent's, read before a fork)
_save_state, _close = manager_module.CheckpointManager.save_state, \\
    manager_module.CheckpointManager.close

def interrupt():  # (to the main thread: its wait wakes to take it)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

def pace(step):  # (the first interrupt, from the loop)
    global _armed
    if step == _FIRST_AT:
        _armed = _SECOND
        interrupt()

def main_asleep():
    """Whether the main thread sleeps in a futex wait with no timeout: a lock's (a signal
    wakes it), not the GIL's, which waits 5 ms at a time and takes no signal."""
    with open(f"/proc/self/task/{{_main_tid}}/syscall") as record:
        fields = record.read().split()  # (number, then arguments: the 4th is the timeout)
    return fields[0] == str(_FUTEX) and fields[4] == "0x0"

def main_waits_in(function):
    """Until the main thread is asleep in a wait of threading's below ``function``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(threading.main_thread().ident)
        names = []
        while frame is not None:
            names.append((frame.f_code.co_filename, frame.f_code.co_name))
            frame = frame.f_back
        if names and names[0][0] == threading.__file__ and \\
                function in [name for _, name in names] and main_asleep():
            return
        time.sleep(0.002)

def save_state(self, *args, **kwargs):  # (on the writer thread)
    global _armed
    if _armed == "wait" and kwargs.get("step") == _FIRST_AT:  # (the interrupt's save)
        _armed = None
        main_waits_in("_snapshot_and_write")  # (the interrupt's save waits for this write)
        interrupt()
        main_waits_in("end_cell")  # (the cell's end waits for it)
        interrupt()
    return _save_state(self, *args, **kwargs)

def close(self):
    global _armed
    if _armed == "close":  # (the session's, as the cell ends)
        _armed = None
        interrupt()
    return _close(self)

manager_module.CheckpointManager.save_state = save_state
manager_module.CheckpointManager.close = close
'''

LEFT = '''
print("handler", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
print("writers", [t.name for t in threading.enumerate() if t.name.startswith("ckpt_nb")])
'''


def error_lines(kernel: Kernel, msg_id: str) -> list[str]:
    """The cell's error as the front end shows it, colours stripped."""
    return [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in kernel.tracebacks[msg_id]]


@pytest.mark.parametrize("second", ["wait", "close"])
def test_a_second_interrupt_in_ckpt_nbs_work_ends_the_cell_with_its_line(
        tmp_path: Path, kernels: Kernels, reference: Reference, second: str) -> None:
    """It ended with a bare KeyboardInterrupt whose traceback ended in ckpt_nb (the wait
    for the write in concurrent.futures, the store's close), and without the line that
    names the checkpoint to go on from."""
    kernel = kernels.start(tmp_path)
    out, reply = kernel.run(INTERRUPTS + f"_SECOND = {second!r}")
    assert reply["status"] == "ok", out
    cell = train_cell("run", tmp_path / "run.pt")
    msg_id = kernel.execute(cell)
    out, reply = kernel.finish(msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", out
    rows = catalog(tmp_path / "run")
    (saved, row), = [(cid, r) for cid, r in rows.set_index("id").iterrows()
                     if r["step"] == FIRST_AT]
    assert (row["epoch"], row["batch_idx"]) == position(FIRST_AT)
    assert rows["step"].max() == FIRST_AT  # (nothing past the interrupt)
    if second == "wait":
        said = f"stopped at once at step {FIRST_AT}: checkpoint {saved} holds it"
        assert "the cell stops once the write in flight is in" in out, out
    else:
        said = f"the cell stopped at step {FIRST_AT}: run it again to go on from " \
               f"checkpoint {saved}"
        assert f"ckpt_nb: saved {saved} on interrupt" in out, out
        assert "ckpt_nb: interrupt received: the session closes first" in out, out
    assert error_lines(kernel, msg_id) == [f"KeyboardInterrupt: {said}"], out

    out, reply = kernel.run(LEFT)
    assert out.split("\n")[:2] == ["handler True", "writers []"], out

    out, reply = kernel.run(cell)
    assert reply["status"] == "ok", out
    assert resumed_line(saved, row) in out, out
    assert_identical(tmp_path / "run.pt", reference)
