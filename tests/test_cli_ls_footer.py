"""``ckpt-nb ls``'s footer line on the best#k marks: it names only the marks its listed
rows carry (on a ``--branch``, not those of checkpoints elsewhere), three or more in a row
as "best#2 to best#N". Real sessions, a real store, the real command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import CheckpointManager
from ckpt_nb.cli import main

pytestmark = pytest.mark.usefixtures("fresh_process_state")


def keep_best_run(store: Path, losses: list[float], keep_best: int) -> None:
    ns = {"model": torch.nn.Linear(4, 2)}
    with ckpt_nb.auto(store, namespace=ns, on="loss:min", keep=100, keep_best=keep_best,
                      name="x", track=["model"], sync=True) as session:
        for loss in losses:
            ckpt_nb.log(loss=loss)
            session.save(wait=True)


def ls(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    capsys.readouterr()
    assert main(["ls", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def footer_of_marks(lines: list[str]) -> list[str]:
    return [line for line in lines if "the next best by" in line]


def test_a_branch_without_marks_has_no_footer_on_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep_best_run(tmp_path, [0.5, 0.2, 0.9, 0.3], keep_best=3)
    with CheckpointManager(tmp_path) as mgr:  # a side branch of worse checkpoints
        mgr.restore(mgr.list()["id"].iloc[0], model=torch.nn.Linear(4, 2))
        for loss in (5.0, 6.0):
            mgr.save(torch.nn.Linear(4, 2), metrics={"loss": loss})
        branch = mgr.list()["branch"].iloc[-1]
    lines = ls(capsys, str(tmp_path), "--branch", branch)
    assert "2 checkpoints on branch" in "\n".join(lines)
    assert footer_of_marks(lines) == []


def test_a_branch_footer_names_the_marks_its_rows_carry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep_best_run(tmp_path, [0.5, 0.2, 0.9, 0.3], keep_best=3)
    with CheckpointManager(tmp_path) as mgr:  # a branch holding one of the 3 best, not best
        mgr.restore(mgr.list()["id"].iloc[0], model=torch.nn.Linear(4, 2))
        mgr.save(torch.nn.Linear(4, 2), metrics={"loss": 0.21})
        branch = mgr.list()["branch"].iloc[-1]
    lines = ls(capsys, str(tmp_path), "--branch", branch)
    at = lines[0].index(" marks ") + 1
    assert "1 checkpoint on branch" in "\n".join(lines)
    mark = lines[1][at:].split()[0]
    assert mark in ("best#2", "best#3")
    assert footer_of_marks(lines) == [f"{mark}: the next best by loss (min) after best, "
                                      "which the store's run keeps with it (--keep-best 3)"]


def test_many_marks_are_a_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep_best_run(tmp_path, [1 / (i + 1) for i in range(12)], keep_best=50)
    with CheckpointManager(tmp_path) as mgr:
        ranked = int(mgr.list()["loss"].notna().sum())  # (all marked: fewer than 50)
    assert ranked > 3
    footer = footer_of_marks(ls(capsys, str(tmp_path)))
    assert footer == [f"best#2 to best#{ranked}: the next best by loss (min) after best, "
                      "which the store's run keeps with it (--keep-best 50)"]


def test_on_a_terminal_the_marks_footer_is_wrapped_to_its_width(tmp_path: Path) -> None:
    """The "to fit N columns" line was wrapped to the terminal, the marks' line beside it
    not: 101 characters at COLUMNS=60. Piped, it stays one line, as the table stays whole."""
    from test_cli import on_terminal_here

    keep_best_run(tmp_path, [1 / (i + 1) for i in range(4)], keep_best=3)
    lines = on_terminal_here(60, "ls", tmp_path)
    assert all(len(line) <= 60 for line in lines), lines
    at = next(i for i, line in enumerate(lines) if line.startswith("best#2, best#3: "))
    assert " ".join(lines[at:at + 2]) == (
        "best#2, best#3: the next best by loss (min) after best, which the store's run keeps "
        "with it (--keep-best 3)"), lines
