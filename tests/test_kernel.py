"""The notebook layer in real Jupyter kernels (ipykernel through jupyter_client and nbclient).

A training cell on scikit-learn's digits (shuffling DataLoader, Dropout, AdamW,
StepLR) runs under ``%%ckpt_auto``; its kernel is killed with SIGKILL or
interrupted mid-training, and a re-run (in a fresh kernel, or the same one) must
end bit-identical to a run never stopped.

The kill and the interrupt land at a chosen step: the loop calls ``pace(step)``,
which stops while a file ``hold-<step>`` exists in the kernel's folder (and says
so with ``held-<step>``). That makes the tests independent of the machine's speed
without changing what is trained.
"""

from __future__ import annotations

import math
import os
import queue
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd
import pytest
import torch
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

import ckpt_nb
from digits_code import LOAD_DIGITS  # (scikit-learn's digits, scikit-learn not imported)

SAMPLES, BATCH, EPOCHS, EVERY = 1797, 90, 4, 6  # digits has 1797 images
PER_EPOCH = math.ceil(SAMPLES / BATCH)
TIMEOUT = 240  # seconds; generous, kernels start slowly on a loaded machine

SETUP = f"""
import itertools, os, time, torch, ckpt_nb
{LOAD_DIGITS}
%load_ext ckpt_nb
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
X, Y = (torch.tensor(a) for a in load_digits(return_X_y=True))
X = X.float() / 16.0
torch.manual_seed(0)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size={BATCH},
                                     shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                            torch.nn.Linear(48, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=15, gamma=0.7)
history = []

def pace(step):
    if os.path.exists(f"hold-{{step}}"):
        open(f"held-{{step}}", "w").close()
        while os.path.exists(f"hold-{{step}}"):
            time.sleep(0.01)

print("pid", os.getpid())
"""

TRAIN = """%%ckpt_auto --dir {dir} --every-steps {every}
for epoch in ckpt_nb.epochs({epochs}):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        sched.step()
        pace(sched.last_epoch)
    history.append(round(loss.item(), 6))
    ckpt_nb.log(loss=loss.item())
torch.save({{"model": model.state_dict(), "opt": opt.state_dict(),
            "sched": sched.state_dict(), "history": history}}, {result!r})
"""


def train_cell(directory: str, result: Path) -> str:
    return TRAIN.format(dir=directory, every=EVERY, epochs=EPOCHS, result=str(result))


def position(step: int) -> tuple[int, int]:
    """(epoch, batch) of the consistent point right after global step ``step``."""
    return divmod(step, PER_EPOCH)


class Kernel:
    """A real ipykernel; each cell's stream and error output is collected as text."""

    def __init__(self, cwd: Path) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(cwd))
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.pid: int | None = None
        self._output: dict[str, list[str]] = {}
        self.tracebacks: dict[str, list[str]] = {}  # (each cell's error, as the kernel sent it)

    def setup(self) -> None:
        self.client.wait_for_ready(timeout=TIMEOUT)
        out, reply = self.run(SETUP)
        assert reply["status"] == "ok", out
        self.pid = int(out.split()[1])

    def execute(self, code: str, cell_id: str | None = None) -> str:
        """Start a cell; returns its message id (read it with ``read``). ``cell_id``: as
        JupyterLab sends it, in the request's metadata."""
        msg = self.client.session.msg("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True})
        if cell_id is not None:
            msg["metadata"]["cellId"] = cell_id
        self.client.shell_channel.send(msg)
        msg_id = msg["header"]["msg_id"]
        self._output[msg_id] = []
        return msg_id

    def read(self, msg_id: str, until: Callable[[str], bool],
             timeout: float = TIMEOUT) -> str:
        """Read the cell's output until ``until(all output so far)`` holds."""
        chunks = self._output[msg_id]
        deadline = time.monotonic() + timeout
        while not until("".join(chunks)):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.manager.is_alive():
                raise TimeoutError(f"the kernel stopped short; its output:\n{''.join(chunks)}")
            try:
                msg = self.client.get_iopub_msg(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            content = msg["content"]
            if msg["msg_type"] == "stream":
                chunks.append(content["text"])
            elif msg["msg_type"] == "error":
                chunks.append(f"{content['ename']}: {content['evalue']}\n")
                self.tracebacks[msg_id] = content["traceback"]
            elif msg["msg_type"] == "status" and content["execution_state"] == "idle":
                chunks.append("\0")  # the cell is over
        return "".join(chunks)

    def finish(self, msg_id: str) -> tuple[str, dict[str, Any]]:
        """The whole output of a started cell and its reply."""
        out = self.read(msg_id, lambda text: text.endswith("\0"))
        while True:
            reply = self.client.get_shell_msg(timeout=TIMEOUT)
            if reply["parent_header"].get("msg_id") == msg_id:
                return out.rstrip("\0"), reply["content"]

    def run(self, code: str, cell_id: str | None = None) -> tuple[str, dict[str, Any]]:
        """Run a cell to its end: (its output, its reply)."""
        return self.finish(self.execute(code, cell_id))

    def close(self) -> None:
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)


class Kernels:
    """Started kernels, all shut down by ``close``, on failure too."""

    def __init__(self) -> None:
        self.started: list[Kernel] = []

    def start(self, cwd: Path) -> Kernel:
        kernel = Kernel(cwd)
        self.started.append(kernel)
        kernel.setup()
        return kernel

    def close(self) -> None:
        for kernel in self.started:
            try:
                kernel.close()
            except Exception:  # noqa: BLE001 - a killed kernel may be gone already
                pass


@pytest.fixture
def kernels() -> Iterator[Kernels]:
    started = Kernels()
    yield started
    started.close()


class Reference:
    """An uninterrupted run: its kernel (still up), store and final state."""

    def __init__(self, kernel: Kernel, folder: Path, out: str) -> None:
        self.kernel, self.folder, self.out = kernel, folder, out
        self.store = folder / "ref"
        self.result = torch.load(folder / "ref.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    folder = tmp_path_factory.mktemp("reference")
    started = Kernels()
    try:
        kernel = started.start(folder)
        out, reply = kernel.run(train_cell("ref", folder / "ref.pt"))
        assert reply["status"] == "ok", out
        yield Reference(kernel, folder, out)
    finally:
        started.close()


def assert_identical(result_file: Path, reference: Reference) -> None:
    """Weights, optimizer state, scheduler and metric history equal bit for bit."""
    a, b = torch.load(result_file, weights_only=True), reference.result
    assert a["history"] == b["history"]
    assert a["sched"] == b["sched"]
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["opt"]["param_groups"] == b["opt"]["param_groups"]
    state_a, state_b = a["opt"]["state"], b["opt"]["state"]
    assert state_a.keys() == state_b.keys()
    for index in state_a:
        assert state_a[index].keys() == state_b[index].keys()
        for name, value in state_a[index].items():
            assert torch.equal(value, state_b[index][name]), (index, name)


def catalog(store: Path) -> pd.DataFrame:
    with ckpt_nb.CheckpointManager(store) as mgr:
        return mgr.list()


def wait_for_file(path: Path, kernel: Kernel) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline or not kernel.manager.is_alive():
            raise TimeoutError(f"the kernel never reached {path.name}")
        time.sleep(0.02)


def killed_where_held(kernels: Kernels, tmp_path: Path, kill_at: int, setup: str,
                      cell: str) -> Kernel:
    """A kernel that ran ``setup``, then ``cell`` up to where it holds at ``kill_at`` (the
    cell's hold file), SIGKILLed there, dead, its hold file gone."""
    hold = tmp_path / f"hold-{kill_at}"
    hold.touch()
    crashed = kernels.start(tmp_path)
    out, reply = crashed.run(setup)
    assert reply["status"] == "ok", out
    crashed.execute(cell)
    wait_for_file(tmp_path / f"held-{kill_at}", crashed)
    assert crashed.pid is not None
    os.kill(crashed.pid, signal.SIGKILL)  # (a save handed to the background may be mid-write)
    deadline = time.monotonic() + 60
    while crashed.manager.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not crashed.manager.is_alive()
    hold.unlink()
    return crashed


def resumed_line(checkpoint_id: str, row: pd.Series) -> str:
    return (f"ckpt_nb: resumed from {checkpoint_id} (epoch {int(row['epoch'])}, "
            f"batch {int(row['batch_idx'])}, step {int(row['step'])})")


def test_the_kernels_digits_are_scikit_learns() -> None:
    """What SETUP's load_digits (scikit-learn's data file, read without importing
    scikit-learn) answers is what sklearn.datasets.load_digits answers, bit for bit."""
    from sklearn.datasets import load_digits
    theirs, defined = load_digits(), {}
    exec(LOAD_DIGITS, defined)
    ours = defined["load_digits"]()
    pairs = [(ours.data, theirs.data), (ours.target, theirs.target),
             *zip(defined["load_digits"](return_X_y=True), load_digits(return_X_y=True))]
    for a, b in pairs:
        assert a.dtype == b.dtype and a.shape == b.shape and a.strides == b.strides
        assert a.tobytes() == b.tobytes()


def test_reference_run_reports_what_it_tracks(reference: Reference) -> None:
    first = reference.out.splitlines()[0]
    assert first.startswith("ckpt_nb: tracking model, opt, sched"), first
    assert "loader (DataLoader" in first, first
    rows = catalog(reference.store)
    assert list(rows["step"]) == list(range(EVERY, EPOCHS * PER_EPOCH, EVERY)) + \
        [EPOCHS * PER_EPOCH]
    assert rows["branch"].nunique() == 1 and rows["parent"].iloc[0] is None
    assert list(rows["parent"].iloc[1:]) == list(rows["id"].iloc[:-1])


# A cell before the training cell, saving to the same store (as the cells of a notebook
# do by default): a fresh kernel's "Run All" must not resume the training cell's run in it.
WARM_UP = """%%ckpt_auto --dir crash
for epoch in ckpt_nb.epochs(1):
    warmed_up = True
"""


def test_sigkill_then_notebook_in_a_fresh_kernel_resumes_bit_identical(
        tmp_path: Path, kernels: Kernels, reference: Reference) -> None:
    kill_at = 7 * EVERY + 1  # one step after a save was handed to the background writer
    cell = train_cell("crash", tmp_path / "crash.pt")
    killed_where_held(kernels, tmp_path, kill_at, WARM_UP, cell)
    assert not (tmp_path / "crash.pt").exists()

    with ckpt_nb.CheckpointManager(tmp_path / "crash") as mgr:
        assert mgr.verify().ok
        newest = mgr.list().iloc[-1]
    assert newest["step"] in (kill_at - 1, kill_at - 1 - EVERY)
    assert (newest["epoch"], newest["batch_idx"]) == position(newest["step"])
    assert newest["batch_idx"] > 0  # the kill landed mid-epoch

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SETUP),
                                               nbformat.v4.new_code_cell(WARM_UP),
                                               nbformat.v4.new_code_cell(cell)])
    NotebookClient(notebook, timeout=TIMEOUT, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    warm_up = "".join(o.get("text", "") for o in notebook.cells[1].outputs)
    assert "resumed" not in warm_up, warm_up  # (it resumed the training cell's run)
    out = "".join(o.get("text", "") for o in notebook.cells[2].outputs)
    assert out.splitlines()[0].startswith("ckpt_nb: tracking model, opt, sched"), out
    assert resumed_line(newest['id'], newest) in out, out
    assert_identical(tmp_path / "crash.pt", reference)


# A Dataset that augments as it is indexed, in the kernel's process (torchvision's random
# transforms with num_workers=0): each batch fetched draws from torch's global generator.
AUGMENT = f"""
class Augmented(torch.utils.data.Dataset):
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return X[i] + 0.05 * torch.randn(64), Y[i]

loader = torch.utils.data.DataLoader(Augmented(), batch_size={BATCH}, shuffle=True)
"""


def test_sigkill_with_augmentation_in_the_kernel_resumes_bit_identical(
        tmp_path: Path, kernels: Kernels) -> None:
    """The checkpoint's RNG state is the one before the next batch is fetched: it was the
    one after, so the resumed run augmented that batch with other random numbers."""
    kernel = kernels.start(tmp_path)
    out, reply = kernel.run(AUGMENT)
    assert reply["status"] == "ok", out
    out, reply = kernel.run(train_cell("ref", tmp_path / "ref.pt"))
    assert reply["status"] == "ok", out
    reference = Reference(kernel, tmp_path, out)

    kill_at = 3 * EVERY + 1  # (epoch 0: the kill lands mid-epoch)
    cell = train_cell("crash", tmp_path / "crash.pt")
    killed_where_held(kernels, tmp_path, kill_at, AUGMENT, cell)
    newest = catalog(tmp_path / "crash").iloc[-1]
    assert newest["batch_idx"] > 0

    fresh = kernels.start(tmp_path)
    out, reply = fresh.run(AUGMENT)
    assert reply["status"] == "ok", out
    out, reply = fresh.run(cell)
    assert reply["status"] == "ok", out
    assert resumed_line(newest["id"], newest) in out, out
    assert_identical(tmp_path / "crash.pt", reference)


def test_interrupt_then_rerun_in_the_same_kernel_is_bit_identical(
        tmp_path: Path, kernels: Kernels, reference: Reference) -> None:
    stop_at = 4 * EVERY + 3
    hold = tmp_path / f"hold-{stop_at}"
    hold.touch()
    cell = train_cell("intr", tmp_path / "intr.pt")
    kernel = kernels.start(tmp_path)
    msg_id = kernel.execute(cell)
    wait_for_file(tmp_path / f"held-{stop_at}", kernel)
    kernel.manager.interrupt_kernel()
    kernel.read(msg_id, lambda text: "interrupt received" in text)
    hold.unlink()
    out, reply = kernel.finish(msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", out
    saved = re.search(r"ckpt_nb: saved (\S+) on interrupt", out)
    assert saved, out
    rows = catalog(tmp_path / "intr").set_index("id")
    row = rows.loc[saved[1]]
    assert (row["step"], row["epoch"], row["batch_idx"]) == (stop_at, *position(stop_at))
    assert rows["step"].max() == stop_at  # nothing past the interrupt
    assert not (tmp_path / "intr.pt").exists()

    out, reply = kernel.run(cell)
    assert reply["status"] == "ok", out
    assert resumed_line(saved[1], row) in out, out
    assert_identical(tmp_path / "intr.pt", reference)


def test_sigterm_stops_the_cell_saved_and_a_rerun_in_the_same_kernel_is_bit_identical(
        tmp_path: Path, kernels: Kernels, reference: Reference) -> None:
    """A preemption's SIGTERM to the kernel lost every step since the last trigger: it is
    saved at the next consistent point, the cell stops saying so, and the kernel, still
    up, goes on from there bit for bit when the cell is run again."""
    stop_at = 4 * EVERY + 3
    hold = tmp_path / f"hold-{stop_at}"
    hold.touch()
    cell = train_cell("term", tmp_path / "term.pt")
    kernel = kernels.start(tmp_path)
    msg_id = kernel.execute(cell)
    wait_for_file(tmp_path / f"held-{stop_at}", kernel)
    assert kernel.pid is not None
    os.kill(kernel.pid, signal.SIGTERM)
    kernel.read(msg_id, lambda text: "SIGTERM received" in text)
    hold.unlink()
    out, reply = kernel.finish(msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", out
    rows = catalog(tmp_path / "term").set_index("id")
    saved = rows.index[rows["note"] == "SIGTERM"]
    assert len(saved) == 1, rows
    row = rows.loc[saved[0]]
    assert (row["step"], row["epoch"], row["batch_idx"]) == (stop_at, *position(stop_at))
    assert rows["step"].max() == stop_at  # nothing past the signal
    assert reply["evalue"] == f"SIGTERM: the cell stopped at step {stop_at}, saved as " \
        f"checkpoint {saved[0]}: run it again to go on from there", out
    assert kernel.manager.is_alive()

    out, reply = kernel.run(cell)
    assert reply["status"] == "ok", out
    assert resumed_line(saved[0], row) in out, out
    assert_identical(tmp_path / "term.pt", reference)


def test_rollback_then_train_on_creates_branches(reference: Reference) -> None:
    kernel, store = reference.kernel, reference.store
    main = catalog(store)
    main_branch = main["branch"].iloc[0]
    middle = main[(main["epoch"] == 2) & (main["batch_idx"] > 0)].iloc[0]
    out, reply = kernel.run(f"%ckpt_rollback {middle['id']}")
    assert reply["status"] == "ok" and f"ckpt_nb: rolled back to {middle['id']}" in out, out
    out, reply = kernel.run(
        "torch.save({'model': model.state_dict(), 'history': history,"
        " 'position': ckpt_nb._session.kernel_position('ref')}, 'rolled.pt')")
    assert reply["status"] == "ok", out
    rolled = torch.load(reference.folder / "rolled.pt", weights_only=True)
    with ckpt_nb.CheckpointManager(store) as mgr:
        saved = mgr.load(middle["id"]).state["model"]
    assert saved.keys() == rolled["model"].keys()
    for key, value in saved.items():
        assert torch.equal(rolled["model"][key], value), key
    assert rolled["history"] == reference.result["history"][:2]  # a captured variable
    assert rolled["position"] == middle["id"]

    # Re-running the cell continues from the mid-run checkpoint, on a new branch.
    out, reply = kernel.run(train_cell("ref", reference.folder / "again.pt"))
    assert reply["status"] == "ok", out
    assert resumed_line(middle['id'], middle) in out, out
    assert_identical(reference.folder / "again.pt", reference)
    table = catalog(store)
    branch = table[~table["id"].isin(main["id"])]
    assert branch["parent"].iloc[0] == middle["id"]
    assert branch["branch"].nunique() == 1 and branch["branch"].iloc[0] != main_branch
    assert list(branch["step"]) == list(main[main["step"] > middle["step"]]["step"])

    # %ckpt_rollback -N, then a different cell: its save is a child of that checkpoint.
    ids = list(table["id"])
    earlier = main[main["epoch"] == 1].iloc[0]["id"]
    back = len(ids) - 1 - ids.index(earlier)
    out, reply = kernel.run(f"%ckpt_rollback -{back}")
    assert reply["status"] == "ok" and f"rolled back to {earlier}" in out, out
    out, reply = kernel.run(
        "%%ckpt_auto --dir ref\n"
        "for xb, yb in itertools.islice(loader, 3):\n"
        "    opt.zero_grad()\n"
        "    torch.nn.functional.cross_entropy(model(xb), yb).backward()\n"
        "    opt.step()\n")
    assert reply["status"] == "ok", out
    after = catalog(store)
    new = after[~after["id"].isin(table["id"])]
    assert len(new) == 1 and new["parent"].iloc[0] == earlier
    assert new["branch"].iloc[0] not in (main_branch, branch["branch"].iloc[0])


def test_a_deleted_rollback_then_another_cell_says_only_what_it_does(
        tmp_path: Path, kernels: Kernels) -> None:
    """The explorer rolls back to a mid-run checkpoint and deletes it; a cell of another
    id (the training cell's copy) then said that the deleted one's parent, never rolled
    back to, was and held another cell's run, before the line that the checkpoint rolled
    back to was deleted. That line alone is said; the cell's loops start from the
    beginning on the state in memory, its first save a child of the deleted checkpoint's
    nearest kept ancestor (as its children were re-parented), its steps counted on."""
    kernel = kernels.start(tmp_path)
    out, reply = kernel.run(train_cell("s", tmp_path / "first.pt"), cell_id="train")
    assert reply["status"] == "ok", out
    first = catalog(tmp_path / "s")
    by_step = first.set_index("step")
    gone, heir = by_step.loc[2 * EVERY, "id"], by_step.loc[EVERY, "id"]
    out, reply = kernel.run(f"ui = ckpt_nb.explore('s', poll_seconds=0)\n"
                            f"ui.rollback({gone!r}); ui.delete({gone!r})")
    assert reply["status"] == "ok", out
    out, reply = kernel.run(train_cell("s", tmp_path / "copy.pt"), cell_id="copy")
    assert reply["status"] == "ok", out
    assert "holds a run of another cell" not in out and "resum" not in out, out
    assert f"ckpt_nb: checkpoint {gone}, rolled back to, was deleted since, and where its " \
        "loops stood with it: this cell's loops start from the beginning, on the state in " \
        "memory (to train from a kept checkpoint instead, interrupt the cell and " \
        f"%ckpt_rollback it; {heir} is the deleted one's nearest kept ancestor)" in out, out
    new = catalog(tmp_path / "s")
    new = new[~new["id"].isin(first["id"])].iloc[0]
    assert new["parent"] == heir
    assert (new["epoch"], new["batch_idx"]) == (first["epoch"].iloc[0],
                                                first["batch_idx"].iloc[0])
    assert new["step"] == 3 * EVERY


BROKEN = """%%ckpt_auto --dir broken --every-steps 5
for epoch in ckpt_nb.epochs(2):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        if epoch == 1 and i == 0:  # the store's manifest folder becomes a file
            while ckpt_nb.status()["pending_write"]:  # once the epoch's save is in
                time.sleep(0.01)
            os.rename("broken/manifests", "broken/manifests.away")
            open("broken/manifests", "w").close()
    if epoch == 0:
        torch.save(model.state_dict(), "epoch0.pt")
    print("epoch", epoch, "done")
"""


def test_discovery_background_failure_rollback_and_unload(tmp_path: Path,
                                                          kernels: Kernels) -> None:
    kernel = kernels.start(tmp_path)
    out, reply = kernel.run("stream = (i for i in range(3))\n"
                            "handle = open('notes.txt', 'w')\n"
                            "square = lambda v: v * v")
    assert reply["status"] == "ok", out
    out, reply = kernel.run(BROKEN)
    first = out.splitlines()[0]
    assert first.startswith("ckpt_nb: tracking model, opt, sched"), out
    for skipped in ("stream (generator)", "handle (open file)", "square (lambda)",
                    "loader (DataLoader"):
        assert skipped in first, first
    assert "epoch 1 done" in out, out  # training went on
    # Reported during the run (at the next step), again the same way counted, the count
    # said at the end of the cell.
    assert out.count("ckpt_nb: a background save failed") == 1, out
    assert re.search(r"ckpt_nb: \d+ more background saves? failed the same way", out), out

    store = tmp_path / "broken"
    rows = catalog(store)
    assert list(rows["step"]) == [5, 10, 15, PER_EPOCH]  # the saves before the failure
    (store / "manifests").unlink()
    (store / "manifests.away").rename(store / "manifests")
    with ckpt_nb.CheckpointManager(store) as mgr:
        assert mgr.verify().ok
    last_good = rows.iloc[-1]["id"]
    out, reply = kernel.run(f"%ckpt_rollback {last_good}")
    assert reply["status"] == "ok" and f"rolled back to {last_good}" in out, out
    out, reply = kernel.run(
        "saved = torch.load('epoch0.pt')\n"
        "print(all(torch.equal(v, saved[k]) for k, v in model.state_dict().items()))")
    assert out.strip() == "True", out

    # %unload_ext removes the magics and every hook of a running line session.
    out, reply = kernel.run("%ckpt_auto --dir live --every-steps 1")
    assert reply["status"] == "ok", out
    step = ("opt.zero_grad(); torch.nn.functional.cross_entropy(model(X), Y).backward(); "
            "opt.step()")
    out, reply = kernel.run(step)
    assert reply["status"] == "ok", out
    before = len(catalog(tmp_path / "live"))
    assert before >= 1
    out, reply = kernel.run("%unload_ext ckpt_nb")
    assert reply["status"] == "ok", out
    out, reply = kernel.run(step + "\nprint(ckpt_nb.status())")
    assert reply["status"] == "ok" and "{'active': False}" in out, out
    assert len(catalog(tmp_path / "live")) == before
    for magic in ("%ckpt_auto --dir live", "%%ckpt_auto --dir live\npass", "%ckpt_rollback"):
        out, reply = kernel.run(magic)
        assert reply["status"] == "error" and "ckpt_" in out and "not found" in out, out


# Code at the top of each epoch, ahead of its batches() loop: a scheduler stepped, a list
# appended to, a draw ahead of the loader's shuffle, accumulators zeroed. A mid-epoch resume
# runs it again on the restored state; what it changes is put back as saved.
PREFIX_TRAIN = """%%ckpt_auto --dir {dir} --every-steps {every}
for epoch in ckpt_nb.epochs({epochs}):
    if epoch > 0:
        sched.step()
    lrs.append(opt.param_groups[0]["lr"])
    shift = 0.01 * torch.rand(())
    running, seen = 0.0, 0
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb + shift), yb)
        loss.backward()
        opt.step()
        running += loss.item() * len(yb); seen += len(yb)
        pace(epoch * {per_epoch} + i + 1)
    history.append(round(running / seen, 6))
    ckpt_nb.log(loss=running / seen)
torch.save({{"model": model.state_dict(), "opt": opt.state_dict(), "lrs": lrs,
            "sched": sched.state_dict(), "history": history}}, {result!r})
"""


def prefix_cell(directory: str, result: Path) -> str:
    return PREFIX_TRAIN.format(dir=directory, every=EVERY, epochs=EPOCHS, per_epoch=PER_EPOCH,
                               result=str(result))


def test_code_ahead_of_the_batches_loop_resumes_bit_identical_after_a_kill_and_an_interrupt(
        tmp_path: Path, kernels: Kernels) -> None:
    """That code ran again on the restored state: the scheduler stepped twice, the list
    held a learning rate twice, the shuffle was drawn after another draw and the epoch's
    mean loss covered only the batches after the resume. In a fresh kernel after a
    SIGKILL, and in the same kernel after an interrupt."""
    kernel = kernels.start(tmp_path)
    assert kernel.run("lrs = []")[1]["status"] == "ok"
    out, reply = kernel.run(prefix_cell("ref", tmp_path / "ref.pt"))
    assert reply["status"] == "ok", out
    reference = Reference(kernel, tmp_path, out)

    stop_at = PER_EPOCH + 7  # (epoch 1, batch 7: saved there on the interrupt)
    hold = tmp_path / f"hold-{stop_at}"
    hold.touch()
    interrupted = kernels.start(tmp_path)
    assert interrupted.run("lrs = []")[1]["status"] == "ok"
    cell = prefix_cell("intr", tmp_path / "intr.pt")
    msg_id = interrupted.execute(cell)
    wait_for_file(tmp_path / f"held-{stop_at}", interrupted)
    interrupted.manager.interrupt_kernel()
    interrupted.read(msg_id, lambda text: "interrupt received" in text)
    hold.unlink()
    out, reply = interrupted.finish(msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", out
    out, reply = interrupted.run(cell)
    assert reply["status"] == "ok", out
    assert_identical(tmp_path / "intr.pt", reference)
    assert torch.load(tmp_path / "intr.pt")["lrs"] == reference.result["lrs"]
    assert "epoch 1's code ahead of its batches() loop ran again" in out, out

    kill_at = PER_EPOCH + 13  # (epoch 1: saved at its batches 4 and 10, in the background)
    cell = prefix_cell("crash", tmp_path / "crash.pt")
    killed_where_held(kernels, tmp_path, kill_at, "lrs = []", cell)
    newest = catalog(tmp_path / "crash").iloc[-1]
    assert newest["epoch"] == 1 and newest["batch_idx"] > 0

    fresh = kernels.start(tmp_path)
    assert fresh.run("lrs = []")[1]["status"] == "ok"
    out, reply = fresh.run(cell)
    assert reply["status"] == "ok", out
    assert resumed_line(newest["id"], newest) in out, out
    assert_identical(tmp_path / "crash.pt", reference)
    assert torch.load(tmp_path / "crash.pt")["lrs"] == reference.result["lrs"]
    assert "epoch 1's code ahead of its batches() loop ran again" in out, out


# A training cell whose loss is a module of the set-up cell's: it holds nothing trained.
LOSS_MODULE_CELL = """%%ckpt_auto --dir arch --every-steps 10
for epoch in ckpt_nb.epochs(1):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
        sched.step()
"""


def test_a_new_model_beside_the_old_loss_module_starts_at_step_0_in_a_new_root(
        tmp_path: Path, kernels: Kernels) -> None:
    """A model, optimizer and scheduler built anew (another width) in a cell of their own
    counted on from the old run's steps, their first checkpoint a child of the other
    architecture's: the loss module (no parameters) was the same object, and any one kept
    made the run go on. The same objects run again still count on."""
    kernel = kernels.start(tmp_path)
    out, reply = kernel.run("loss_fn = torch.nn.CrossEntropyLoss()")
    assert reply["status"] == "ok", out
    out, reply = kernel.run(LOSS_MODULE_CELL)
    assert reply["status"] == "ok" and "tracking model, opt, sched, loss_fn" in out, out
    first = catalog(tmp_path / "arch")
    assert list(first["step"]) == [10, PER_EPOCH]
    out, reply = kernel.run(
        "model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), "
        "torch.nn.Linear(32, 10))\n"
        "opt = torch.optim.AdamW(model.parameters(), lr=1e-2)\n"
        "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=15)")
    assert reply["status"] == "ok", out
    out, reply = kernel.run(LOSS_MODULE_CELL)
    assert reply["status"] == "ok", out
    rebuilt = catalog(tmp_path / "arch").iloc[len(first):]
    assert list(rebuilt["step"]) == [10, PER_EPOCH]
    assert rebuilt["parent"].iloc[0] is None  # (a new root)
    out, reply = kernel.run(LOSS_MODULE_CELL)  # (the same objects: they go on)
    assert reply["status"] == "ok", out
    again = catalog(tmp_path / "arch").iloc[len(first) + len(rebuilt):]
    assert list(again["step"]) == [PER_EPOCH + 10, 2 * PER_EPOCH]
    assert again["parent"].iloc[0] == rebuilt["id"].iloc[-1]
