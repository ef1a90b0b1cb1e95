"""``ckpt-nb ls`` marks the K best a ``%%ckpt_auto --keep-best K`` run keeps, as
``%ckpt_list`` and the explorer mark them, with ``best`` (what ``ckpt-nb`` resolves)
told from the others. Real sessions, a real store, the real command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import CheckpointManager, _session
from ckpt_nb.cli import main

pytestmark = pytest.mark.usefixtures("fresh_process_state")

LOSSES = (0.5, 0.2, 0.9, 0.3, 0.4, 0.8)


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def marks(out: str) -> dict[str, str]:
    """Each listed checkpoint's id and its cell in the marks column."""
    header, *lines = out.split("\n\n")[0].splitlines()
    at = header.index(" marks ") + 1  # (its cells start where its header does)
    return {line.split()[0]: line[at:].split()[0] for line in lines}


def kept_best_store(directory: Path) -> dict[str, float]:
    """A run that ranks by loss (min) and keeps its 3 best (and its 10 newest: none is
    deleted), logging each of ``LOSSES`` and saving; its checkpoints' ids and losses,
    oldest first (it saves where the loss improved too)."""
    ns = {"model": torch.nn.Linear(4, 2)}
    with ckpt_nb.auto(directory, namespace=ns, on=("loss", "min"), keep=10, keep_best=3,
                      name="x", track=["model"], sync=True) as session:
        for loss in LOSSES:
            ckpt_nb.log(loss=loss)
            session.save(wait=True)
    with CheckpointManager(directory) as mgr:
        frame = mgr.list()
    return dict(zip(frame["id"], frame["loss"]))


def ranked(losses: dict[str, float], mode: str = "min") -> list[str]:
    """The ids best first: by loss, the newer first where two are level."""
    ids = list(losses)
    sign = 1 if mode == "min" else -1
    return sorted(ids, key=lambda cid: (sign * losses[cid], -ids.index(cid)))


def test_ls_marks_the_k_best_the_run_keeps_and_best_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run with --keep-best 3 keeps its 3 best, and %ckpt_list and the explorer mark
    the 3: ls marked one, 'best' (review)."""
    losses = kept_best_store(tmp_path)
    capsys.readouterr()  # (the session's own lines)
    first, second, third = ranked(losses)[:3]
    code, out, err = run(capsys, "ls", tmp_path)
    assert code == 0 and err == ""
    assert marks(out) == {**dict.fromkeys(losses, "-"), first: "best", second: "best#2",
                          third: "best#3"}
    assert out.splitlines()[-1] == (
        "best#2, best#3: the next best by loss (min) after best, which the store's run "
        "keeps with it (--keep-best 3)")
    with _session.listing_manager(tmp_path) as manager:  # (as %ckpt_list marks them)
        assert set(manager.list().query("best")["id"]) == {first, second, third}
    code, out, _ = run(capsys, "show", tmp_path, "best")
    assert code == 0 and out.startswith(f"id:        {first}\n")
    # Pinned and among the best: both; the same ranking given: the same marks.
    assert run(capsys, "pin", tmp_path, second)[0] == 0
    code, out, _ = run(capsys, "ls", tmp_path, "--metric", "loss", "--mode", "min")
    assert code == 0 and marks(out)[second] == "pinned,best#2" and marks(out)[first] == "best"


def test_ls_marks_one_best_for_another_ranking_and_by_the_store_on_a_branch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The run's K counts for its own ranking alone: another (--mode max) ranks one best,
    the 'best' ckpt-nb resolves. On a branch, the marks are the store's, as 'best'
    resolves (a branch's own best was marked 'best' where the store's best was
    elsewhere)."""
    losses = kept_best_store(tmp_path)
    capsys.readouterr()  # (the session's own lines)
    code, out, _ = run(capsys, "ls", tmp_path, "--mode", "max")
    assert code == 0 and "best#" not in out
    assert [cid for cid, mark in marks(out).items() if mark != "-"] == \
        [ranked(losses, "max")[0]]
    first = ranked(losses)[0]
    with CheckpointManager(tmp_path) as mgr:  # (a branch from the first checkpoint)
        mgr.restore(next(iter(losses)), model=torch.nn.Linear(4, 2))
        side = [mgr.save(torch.nn.Linear(4, 2), metrics={"loss": v})
                for v in (losses[first] - 0.01, 0.1)]
        branch = mgr.info(side[0])["branch"]
    assert branch != "main"
    code, out, _ = run(capsys, "ls", tmp_path, "--branch", branch)
    assert code == 0 and marks(out) == {side[0]: "best#2", side[1]: "best"}
    code, out, _ = run(capsys, "ls", tmp_path, "--branch", "main")
    assert code == 0 and marks(out) == {**dict.fromkeys(losses, "-"), first: "best#3"}
