"""The notebook layer in real Jupyter kernels (ipykernel through jupyter_client).

A training cell on scikit-learn's digits runs under ``%%ckpt_auto``; its kernel
is killed with SIGKILL or interrupted mid-training, and a re-run (in a fresh
kernel, or the same one) must end bit-identical to a run never stopped.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from jupyter_client.manager import KernelManager

import ckpt_nb

SETUP = """
import os, time, torch, ckpt_nb
from sklearn.datasets import load_digits
%load_ext ckpt_nb
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
digits = load_digits()
X = torch.tensor(digits.data / 16.0, dtype=torch.float32)
Y = torch.tensor(digits.target)
torch.manual_seed(0)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=90,
                                     shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                            torch.nn.Linear(48, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=15, gamma=0.7)
history = []
DELAY = 0.0
print("pid", os.getpid())
"""

TRAIN = """%%ckpt_auto --dir {dir} --every-steps 6
for epoch in ckpt_nb.epochs(4):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        sched.step()
        time.sleep(DELAY)
    history.append(round(loss.item(), 6))
    ckpt_nb.log(loss=loss.item())
torch.save({{"model": model.state_dict(), "opt": opt.state_dict(),
            "sched": sched.state_dict(), "history": history}}, {result!r})
"""


class Kernel:
    """A real ipykernel, with the outputs of each cell collected as text."""

    def __init__(self, cwd: Path) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(cwd), env={**os.environ, "PYTHONHASHSEED": "0"})
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        self.pid: int | None = None

    def run(self, code: str, timeout: float = 180) -> tuple[str, dict[str, Any]]:
        """Run a cell to its end: (its stdout, stderr and error text, the reply)."""
        chunks: list[str] = []
        reply = self.client.execute_interactive(code, timeout=timeout,
                                                output_hook=lambda m: chunks.append(_text(m)))
        text = "".join(chunks)
        if self.pid is None and text.startswith("pid "):
            self.pid = int(text.split()[1])
        return text, reply["content"]

    def start(self, code: str) -> str:
        return self.client.execute(code)

    def collect(self, msg_id: str, timeout: float = 180) -> tuple[str, dict[str, Any]]:
        """The output and reply of a cell started with ``start``."""
        chunks: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("the kernel did not finish the cell in time") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            chunks.append(_text(msg))
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        reply = self.client.get_shell_msg(timeout=30)
        return "".join(chunks), reply["content"]

    def close(self) -> None:
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)


def _text(msg: dict[str, Any]) -> str:
    content = msg["content"]
    if msg["msg_type"] == "stream":
        return content["text"]
    if msg["msg_type"] == "error":
        return f"{content['ename']}: {content['evalue']}\n"
    return ""


@pytest.fixture
def kernels(tmp_path: Path) -> Iterator[list[Kernel]]:
    """Start kernels with ``kernels.append(Kernel(tmp_path))``; all are shut down."""
    started: list[Kernel] = []
    yield started
    for kernel in started:
        try:
            kernel.close()
        except Exception:  # noqa: BLE001 - a killed kernel may already be gone
            pass


def new_kernel(kernels: list[Kernel], cwd: Path) -> Kernel:
    kernel = Kernel(cwd)
    kernels.append(kernel)
    out, reply = kernel.run(SETUP)
    assert reply["status"] == "ok", out
    return kernel


def load_result(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def assert_identical(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["history"] == b["history"]
    assert a["sched"] == b["sched"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    state_a, state_b = a["opt"]["state"], b["opt"]["state"]
    assert state_a.keys() == state_b.keys()
    for index in state_a:
        for name, value in state_a[index].items():
            assert torch.equal(value, state_b[index][name]), (index, name)


def wait_for_checkpoint(store: Path, *, min_step: int, mid_epoch: bool,
                        timeout: float = 120) -> None:
    """Poll the store from outside until a checkpoint past ``min_step`` committed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (store / "catalog.sqlite").is_file():
            with ckpt_nb.CheckpointManager(store) as mgr:
                rows = mgr.list()
            done = rows[rows["step"] >= min_step]
            if mid_epoch:
                done = done[done["batch_idx"].fillna(0) > 0]
            if len(done):
                return
        time.sleep(0.1)
    raise TimeoutError(f"no checkpoint past step {min_step} in {store}")


@pytest.fixture
def reference(tmp_path: Path, kernels: list[Kernel]) -> tuple[Kernel, Path]:
    """An uninterrupted run: its kernel and its final state."""
    kernel = new_kernel(kernels, tmp_path)
    out, reply = kernel.run(TRAIN.format(dir="ref", result=str(tmp_path / "ref.pt")))
    assert reply["status"] == "ok", out
    first_line = out.splitlines()[0]
    assert first_line.startswith("ckpt_nb: tracking model, opt, sched"), first_line
    return kernel, tmp_path / "ref.pt"


def test_sigkill_then_fresh_kernel_resumes_bit_identical(
        tmp_path: Path, kernels: list[Kernel], reference: tuple[Kernel, Path]) -> None:
    crashed = new_kernel(kernels, tmp_path)
    crashed.run("DELAY = 0.03")
    cell = TRAIN.format(dir="crash", result=str(tmp_path / "crash.pt"))
    crashed.start(cell)
    wait_for_checkpoint(tmp_path / "crash", min_step=30, mid_epoch=True)
    assert crashed.pid is not None
    os.kill(crashed.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while crashed.manager.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not crashed.manager.is_alive()
    assert not (tmp_path / "crash.pt").exists()  # it really died mid-run

    fresh = new_kernel(kernels, tmp_path)
    out, reply = fresh.run(cell)
    assert reply["status"] == "ok", out
    assert "ckpt_nb: resumed from " in out and "(epoch " in out and ", step " in out, out
    assert_identical(load_result(tmp_path / "crash.pt"), load_result(reference[1]))


def test_interrupt_then_rerun_in_the_same_kernel_is_bit_identical(
        tmp_path: Path, kernels: list[Kernel], reference: tuple[Kernel, Path]) -> None:
    kernel = new_kernel(kernels, tmp_path)
    kernel.run("DELAY = 0.03")
    cell = TRAIN.format(dir="intr", result=str(tmp_path / "intr.pt"))
    msg_id = kernel.start(cell)
    wait_for_checkpoint(tmp_path / "intr", min_step=12, mid_epoch=False)
    kernel.manager.interrupt_kernel()
    out, reply = kernel.collect(msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", out
    assert "on interrupt" in out, out
    kernel.run("DELAY = 0.0")
    out, reply = kernel.run(cell)
    assert reply["status"] == "ok", out
    assert "ckpt_nb: resumed from " in out, out
    assert_identical(load_result(tmp_path / "intr.pt"), load_result(reference[1]))


def test_rollback_in_the_kernel_then_rerun_branches(
        tmp_path: Path, reference: tuple[Kernel, Path]) -> None:
    kernel, expected = reference
    with ckpt_nb.CheckpointManager(tmp_path / "ref") as mgr:
        main = mgr.list()
    middle = main[main["epoch"] == 2]["id"].iloc[0]
    out, reply = kernel.run(f"%ckpt_rollback {middle}")
    assert reply["status"] == "ok" and f"rolled back to {middle}" in out, out
    with ckpt_nb.CheckpointManager(tmp_path / "ref") as mgr:
        saved = mgr.load(middle)
    out, _ = kernel.run("print(float(model[0].weight.detach().double().sum()))")
    assert float(out) == float(saved.state["model"]["0.weight"].double().sum())
    cell = TRAIN.format(dir="ref", result=str(tmp_path / "again.pt"))
    out, reply = kernel.run(cell)
    assert reply["status"] == "ok" and f"resumed from {middle}" in out, out
    assert_identical(load_result(tmp_path / "again.pt"), load_result(expected))
    with ckpt_nb.CheckpointManager(tmp_path / "ref") as mgr:
        table = mgr.list().set_index("id")
    new = table.drop(index=list(main["id"]))
    assert new["parent"].iloc[0] == middle
    assert set(new["branch"]) != {"main"} and len(set(new["branch"])) == 1


def test_discovery_background_failure_and_unload(tmp_path: Path,
                                                 kernels: list[Kernel]) -> None:
    kernel = new_kernel(kernels, tmp_path)
    kernel.run("stream = (i for i in range(3)); handle = open('notes.txt', 'w')\n"
               "square = lambda v: v * v")
    out, reply = kernel.run("%ckpt_auto --dir live --every-steps 1 --sync")
    assert reply["status"] == "ok"
    assert "tracking model, opt, sched" in out
    for skipped in ("stream (generator)", "handle (open file)", "square (lambda)"):
        assert skipped in out, out
    step = ("opt.zero_grad(); torch.nn.functional.cross_entropy(model(X), Y).backward(); "
            "opt.step()")
    out, reply = kernel.run(step)
    assert reply["status"] == "ok", out
    store = tmp_path / "live"
    with ckpt_nb.CheckpointManager(store) as mgr:
        before = list(mgr.list()["id"])
    assert before
    kernel.run("%ckpt_auto --dir live --every-steps 1")  # background writes from here on
    # A real failure: the store's manifest folder becomes a file, so writes there fail.
    (store / "manifests").rename(store / "manifests.away")
    (store / "manifests").write_text("not a folder")
    out1, _ = kernel.run(step)
    out2, _ = kernel.run(step)
    assert "ckpt_nb: a background save failed" in out1 + out2, out1 + out2
    (store / "manifests").unlink()
    (store / "manifests.away").rename(store / "manifests")
    with ckpt_nb.CheckpointManager(store) as mgr:  # nothing earlier was lost
        assert set(before) <= set(mgr.list()["id"])
        assert mgr.verify().ok
        for cid in before:
            mgr.load(cid)
    out, reply = kernel.run("%unload_ext ckpt_nb")
    assert reply["status"] == "ok", out
    out, reply = kernel.run("%ckpt_status")
    assert reply["status"] == "error" and "ckpt_status" in out
    shutil.rmtree(store)
