"""Two real Jupyter kernels training into one store, one of them SIGKILLed: what a kernel
restarted after the crash resumes, and what the other kernel's retention leaves of the
crashed run. Each kernel runs in a folder of its own, where the training cell holds at a
step while a file ``hold-<step>`` exists (test_kernel's ``pace``), so every kernel stops
where the test says, whatever the machine's speed."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import ckpt_nb
from test_kernel import EPOCHS, EVERY, TRAIN, Kernel, Kernels, wait_for_file


@pytest.fixture
def started() -> Iterator[Kernels]:
    kernels = Kernels()
    yield kernels
    kernels.close()


def cell(store: Path, options: str = "", epochs: int = EPOCHS) -> str:
    """The training cell, the same code in every kernel (its result file is each
    kernel's own, in its folder)."""
    return TRAIN.format(dir=str(store), every=EVERY, epochs=epochs, result="result.pt") \
        .replace("--every-steps", f"{options} --every-steps".lstrip())


def held(kernels: Kernels, folder: Path, code: str, *steps: int,
         kernel: Kernel | None = None) -> tuple[Kernel, str]:
    """A kernel started in ``folder`` (made), running ``code`` up to where it holds at
    ``steps[0]`` (held at each of ``steps`` in turn, as the test lifts the holds); the
    kernel and the cell's message id. ``kernel``: one started in ``folder`` already."""
    if kernel is None:
        folder.mkdir()
    for step in steps:
        (folder / f"hold-{step}").touch()
    if kernel is None:
        kernel = kernels.start(folder)
    msg_id = kernel.execute(code)
    wait_for_file(folder / f"held-{steps[0]}", kernel)
    return kernel, msg_id


def saved_at(store: Path, step: int) -> str:
    """The id of the store's checkpoint of ``step``, once it is written (a save is
    handed to a background writer)."""
    deadline = time.monotonic() + 60
    while True:
        with ckpt_nb.CheckpointManager(store) as mgr:
            rows = mgr.list()
        found = rows[rows["step"] == step]
        if len(found) == 1:
            return str(found["id"].iloc[0])
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)


def kill(kernel: Kernel) -> None:
    assert kernel.pid is not None
    os.kill(kernel.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while kernel.manager.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not kernel.manager.is_alive()


def restart_resumes(kernels: Kernels, folder: Path, code: str, checkpoint: str) -> None:
    """A kernel started now runs the cell: it resumes ``checkpoint``, the dead run's."""
    folder.mkdir()
    out, reply = kernels.start(folder).run(code)
    assert reply["status"] == "ok", out
    assert f"resumed from {checkpoint} " in out, out
    assert "ran to its end before" not in out, out


def test_another_kernels_keep_leaves_a_crashed_kernels_run_for_its_restart(
        tmp_path: Path, started: Kernels) -> None:
    """Kernels A and B ran the same --keep 2 cell; A was SIGKILLed, and B's retention
    deleted every checkpoint of A's run within seconds: A's restart said the cell had run
    to its end (at B's checkpoint) and trained from scratch."""
    store = tmp_path / "store"
    code = cell(store, "--keep 2")
    crashed, _ = held(started, tmp_path / "a", code, 4 * EVERY + 1)
    dead_newest = saved_at(store, 4 * EVERY)
    other, _ = held(started, tmp_path / "b", code, 2 * EVERY + 1, 8 * EVERY + 1)
    kill(crashed)
    (tmp_path / "b" / f"hold-{2 * EVERY + 1}").unlink()  # (B saves on, A dead)
    wait_for_file(tmp_path / "b" / f"held-{8 * EVERY + 1}", other)
    with ckpt_nb.CheckpointManager(store) as mgr:
        kept = mgr.list()
    # (B's --keep 2 deleted the runs' older checkpoints, but A's resume point)
    assert list(kept[kept["step"] <= 4 * EVERY]["id"]) == [dead_newest], kept
    restart_resumes(started, tmp_path / "c", code, dead_newest)


def test_a_restart_resumes_its_crashed_run_past_one_a_live_kernel_finished_since(
        tmp_path: Path, started: Kernels) -> None:
    """Kernel B ran the cell to its end after kernel A, which trained it too, was
    SIGKILLed; B still up, A's restart stopped at B's finished run ("this cell ran to its
    end before, at checkpoint <B's>") and trained from scratch, A's run never named."""
    store = tmp_path / "store"
    code = cell(store)
    crashed, _ = held(started, tmp_path / "a", code, 4 * EVERY + 1)
    dead_newest = saved_at(store, 4 * EVERY)
    other, msg_id = held(started, tmp_path / "b", code, EVERY + 1)
    kill(crashed)
    (tmp_path / "b" / f"hold-{EVERY + 1}").unlink()
    out, reply = other.finish(msg_id)
    assert reply["status"] == "ok", out
    restart_resumes(started, tmp_path / "c", code, dead_newest)


def test_a_run_of_other_code_a_live_kernel_trains_is_named_not_offered_to_take_over(
        tmp_path: Path, started: Kernels) -> None:
    """Kernel B ran another cell into the store while kernel A trained its own: B was
    told to `%ckpt_rollback` A's checkpoint "to resume it", though A was training it."""
    store = tmp_path / "store"
    training, _ = held(started, tmp_path / "a", cell(store), 2 * EVERY + 1)
    saved_at(store, 2 * EVERY)
    (tmp_path / "b").mkdir()
    out, reply = started.start(tmp_path / "b").run(cell(store, epochs=1))
    assert reply["status"] == "ok", out
    assert (f"holds an unfinished run of other code (another cell, or this one before an "
            f"edit) of process {training.pid} (another kernel, still running), which "
            "trains it or goes on with it there: not resuming it here") in out, out
    assert "%ckpt_rollback" not in out, out


def test_crashed_runs_never_resumed_keep_one_resume_point_in_all(
        tmp_path: Path, started: Kernels) -> None:
    """A --no-resume --keep 2 cell SIGKILLed mid-run again and again, one kernel at a
    time: each crashed run kept its resume point for a restart that never took it over
    (2, 4, 4, 5, ... kept), while only the newest is one a restart resumes."""
    store = tmp_path / "store"
    code = cell(store, "--no-resume --keep 2")
    kept = []

    def set_up(folder: Path) -> Kernel:
        folder.mkdir()
        return started.start(folder)

    # (each kernel starts and sets up while the one before trains: it runs the cell, its
    # first touch of the store, only once that one is dead)
    with ThreadPoolExecutor(1) as ahead:
        coming = ahead.submit(set_up, tmp_path / "k0")
        for n in range(4):
            ready = coming.result()
            if n < 3:
                coming = ahead.submit(set_up, tmp_path / f"k{n + 1}")
            kernel, _ = held(started, tmp_path / f"k{n}", code, 4 * EVERY + 1, kernel=ready)
            kill(kernel)
            with ckpt_nb.CheckpointManager(store) as mgr:
                kept.append(len(mgr.list()))
    # (the newest dead run's resume point beside the --keep 2, and at most one save
    # more that the kill left before its retention ran)
    assert kept[-1] <= 4, kept
