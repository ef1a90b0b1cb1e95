"""The explorer marks best as many checkpoints as the store's runs keep as best: a
``%%ckpt_auto --keep-best K`` run's K (its run record's, as ``%ckpt_list`` marks them), or
an ``explore(manager)``'s ``keep_best``, followed as it changes. Real stores, real
sessions, another real process."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import CheckpointManager, _plots, _run_records, _session
import warm_python  # (fresh interpreters forked from a warm one)


def marked_best(ui: ckpt_nb.Explorer) -> tuple[set[str], set[str]]:
    """The explorer's best: the DAG's gold nodes, and the rows whose loss is bold."""
    return ({n["id"] for n in ui.dag.nodes if n["best"]},
            {r["id"] for r in ui.table.rows if "loss" in r["best"]})


def listed_best(store: Path) -> set[str]:
    """The checkpoints ``%ckpt_list`` marks best (ranked as the store's newest run)."""
    with _session.listing_manager(store) as manager:
        return set(manager.list().query("best")["id"])


def test_the_explorer_follows_the_keep_best_of_the_stores_runs(tmp_path: Path) -> None:
    """Opened before a run with --keep-best 2 saved, the explorer marked its one best
    (gold and bold) while %ckpt_list marked two; another process's run with --keep-best 3
    since changed nothing either."""
    store = tmp_path / "s"
    with CheckpointManager(store) as first:  # (the store exists: nothing ranked yet)
        first.save(torch.nn.Linear(4, 2))
    ui = ckpt_nb.explore(store, namespace={}, poll_seconds=0)
    try:
        assert marked_best(ui) == (set(), set())
        ns = {"model": torch.nn.Linear(4, 2)}
        with ckpt_nb.auto(store, namespace=ns, on=("loss", "min"), keep_best=2, name="x",
                          track=["model"], sync=True) as session:
            for loss in (0.5, 0.2, 0.9, 0.3):
                ckpt_nb.log(loss=loss)
                session.save(wait=True)
        assert ui.refresh()
        two = listed_best(store)
        assert len(two) == 2 and marked_best(ui) == (two, two)
        warm_python.run([sys.executable, "-c", textwrap.dedent(f"""
            import torch, ckpt_nb
            ns = {{"model": torch.nn.Linear(4, 2)}}
            with ckpt_nb.auto({str(store)!r}, namespace=ns, on=("loss", "min"), keep_best=3,
                              name="y", track=["model"], sync=True) as session:
                for loss in (0.4, 0.1, 0.8, 0.7, 0.6):
                    ckpt_nb.log(loss=loss)
                    session.save(wait=True)
            """)], check=True, timeout=300)
        assert ui.refresh()
        three = listed_best(store)
        assert len(three) == 3 and marked_best(ui) == (three, three)
        assert {n.id for n in _plots.dag_layout(ui.table_frame) if n.best} == three  # (figure)
    finally:
        ui.close()


def test_explore_of_a_manager_marks_its_keep_best(tmp_path: Path) -> None:
    """explore(manager) with keep_best=2: the DAG's gold was the two best (list()'s best
    column), the bold in the table only the best."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path, keep_best=2, max_to_keep=10, metric="loss") as mgr:
        ids = [mgr.save(model, metrics={"loss": v}) for v in (0.3, 0.1, 0.2, 0.4)]
        ui = ckpt_nb.explore(mgr, namespace={}, poll_seconds=0)
        try:
            assert marked_best(ui) == ({ids[1], ids[2]}, {ids[1], ids[2]})
        finally:
            ui.close()


def test_the_explorer_reads_at_most_the_newest_manifests_for_a_run_record(tmp_path: Path
                                                                          ) -> None:
    """A store that scripts saved to last has no run record among its newest
    checkpoints: the explorer read every checkpoint's manifest at its opening for one (on
    an object store, a GET each), and %ckpt_list at each listing. Only the newest
    RUN_RECORD_DEPTH are read; a run that has not ended (its kernel killed), newest,
    is found."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path, metric="loss") as mgr:
        ids = [mgr.save(model, metrics={"loss": 1 - i / 100}) for i in range(40)]
    ui = ckpt_nb.explore(tmp_path, namespace={}, poll_seconds=0)
    try:
        assert marked_best(ui) == ({ids[-1]}, {ids[-1]})
        assert len(ui._run_records) == _run_records.RUN_RECORD_DEPTH < len(ids)
        ns = {"model": model}
        with pytest.raises(RuntimeError, match="the cell failed"):
            with ckpt_nb.auto(tmp_path, namespace=ns, on=("loss", "min"), keep_best=2,
                              name="x", track=["model"], sync=True) as session:
                for loss in (0.25, 0.05):
                    ckpt_nb.log(loss=loss)
                    session.save(wait=True)
                raise RuntimeError("the cell failed")  # (the run never ends: no runs/)
        assert ui.refresh()
        two = listed_best(tmp_path)
        assert len(two) == 2 and marked_best(ui) == (two, two)
    finally:
        ui.close()
