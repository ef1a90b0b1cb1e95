"""One "best" for every reader of a store: ranked by the ranking its last save with a
metric recorded, the K best marked where its newest run's ``--on`` is that ranking. A
script's save with another metric after a ``--keep-best`` run made ``ckpt-nb show DIR
best``, ``ls`` and the explorer name one checkpoint, ``%ckpt_list`` and a fresh
process's rollback another. Real sessions, a real store, the real command line, a real
second process."""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import CheckpointManager, _session
from ckpt_nb.cli import main
import warm_python  # (fresh interpreters forked from a warm one)

pytestmark = pytest.mark.usefixtures("fresh_process_state")


def keep_best_run(store: Path) -> None:
    """A run ranking by loss (min) that keeps its 3 best, saving four losses."""
    ns = {"model": torch.nn.Linear(4, 2)}
    with ckpt_nb.auto(store, namespace=ns, on="loss:min", keep=20, keep_best=3, name="x",
                      track=["model"], sync=True) as session:
        for loss in (0.5, 0.2, 0.9, 0.3):
            ckpt_nb.log(loss=loss)
            session.save(wait=True)


def ls_marks(store: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """``ckpt-nb ls``'s marks column: each marked checkpoint's id and mark."""
    assert main(["ls", str(store)]) == 0
    header, *lines = capsys.readouterr().out.split("\n\n")[0].splitlines()
    at = header.index(" marks ") + 1
    cells = {line.split()[0]: line[at:].split()[0] for line in lines}
    return {cid: mark for cid, mark in cells.items() if mark != "-"}


def shown_best(store: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["show", str(store), "best"]) == 0
    return capsys.readouterr().out.split()[1]


def listed_best(store: Path) -> set[str]:
    """What ``%ckpt_list`` (no session active) marks best."""
    with _session.listing_manager(store) as manager:
        return set(manager.list().query("best")["id"])


def explorer_best(store: Path) -> set[str]:
    """The explorer's gold: its DAG's best nodes."""
    ui = ckpt_nb.explore(store, namespace={}, poll_seconds=0)
    try:
        return {node["id"] for node in ui.dag.nodes if node["best"]}
    finally:
        ui.close()


def rolled_back_best(store: Path) -> str:
    """``ckpt_nb.rollback("best")`` on the store in a new process: the id it restores."""
    code = textwrap.dedent(f"""
        import warnings, torch, ckpt_nb
        warnings.simplefilter("ignore")
        print(ckpt_nb.rollback("best", directory={str(store)!r},
                               namespace={{"model": torch.nn.Linear(4, 2)}}))
        """)
    done = warm_python.run([sys.executable, "-c", code], timeout=300, check=True)
    return done.stdout.split()[-1]


def test_a_script_save_with_another_metric_makes_best_its_metrics_everywhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep_best_run(tmp_path)
    with CheckpointManager(tmp_path, metric="acc", mode="max") as mgr:
        by_acc = mgr.save(torch.nn.Linear(4, 2), metrics={"acc": 0.9, "loss": 1.0})
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ("'best' is by acc (max), the ranking ...")
        assert ls_marks(tmp_path, capsys) == {by_acc: "best"}
        assert shown_best(tmp_path, capsys) == by_acc
        assert listed_best(tmp_path) == {by_acc}
        assert explorer_best(tmp_path) == {by_acc}
    assert rolled_back_best(tmp_path) == by_acc


def test_a_keep_best_run_alone_is_marked_its_k_best_everywhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep_best_run(tmp_path)
    with CheckpointManager(tmp_path) as mgr:
        table = mgr.list()
    # (the newer first among equals: --on and the manual save after it save each loss)
    by_loss = list(table.iloc[::-1].sort_values("loss", kind="stable")["id"][:3])
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ls_marks(tmp_path, capsys) == dict(zip(by_loss, ["best", "best#2", "best#3"]))
        assert shown_best(tmp_path, capsys) == by_loss[0]
        assert listed_best(tmp_path) == set(by_loss)
        assert explorer_best(tmp_path) == set(by_loss)
    assert rolled_back_best(tmp_path) == by_loss[0]
