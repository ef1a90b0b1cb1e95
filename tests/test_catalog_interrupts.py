"""A Ctrl-C (a real SIGINT) or a SQLite error next to a catalog transaction's BEGIN,
COMMIT or ROLLBACK, or while a catalog query is read: the catalog's transaction is ended,
so this manager saves again, another process opens and lists the store, and every
checkpoint restores."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_nb import CheckpointManager
from conftest import DigitsRun, same


class _Faults:
    """What the catalog's connections do at one statement, run from one context
    manager of the catalog: a real SIGINT raised in this process right after the
    statement ran ("after"), or before it runs, so that it never runs ("before"), or a
    SQLite error in its place ("error")."""

    def __init__(self) -> None:
        self.planned: list[tuple[str, str, str]] = []  # (statement, caller, what)

    def at(self, sql: str, caller: str, what: str) -> None:
        self.planned.append((sql, caller, what))

    def struck(self, sql: str, caller: str) -> str | None:
        for i, (planned_sql, planned_caller, what) in enumerate(self.planned):
            if (planned_sql, planned_caller) == (sql, caller):
                del self.planned[i]
                return what
        return None


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Faults]:
    """Faults planned for the catalog connections opened in this test."""
    planned = _Faults()

    class Connection(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            what = planned.struck(sql, sys._getframe(1).f_code.co_name)
            if what == "before":
                signal.raise_signal(signal.SIGINT)
            if what == "error":
                raise sqlite3.OperationalError("disk I/O error")
            cursor = super().execute(sql, *args)
            if what == "after":
                signal.raise_signal(signal.SIGINT)
            return cursor

    real_connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect",
                        lambda *a, **k: real_connect(*a, factory=Connection, **k))
    yield planned
    assert not planned.planned, "a planned fault was never reached"


def _saved(store: Path, digits: DigitsRun, n: int) -> tuple[CheckpointManager,
                                                                dict[str, list[torch.Tensor]]]:
    mgr = CheckpointManager(store, strategy="incremental")
    weights = {}
    for _ in range(n):
        digits.train_step()
        weights[mgr.save(digits.model, digits.optimizer)] = digits.weights()
    return mgr, weights


def _all_well(mgr: CheckpointManager, store: Path, digits: DigitsRun,
              weights: dict[str, list[torch.Tensor]]) -> None:
    """Another process lists every checkpoint; this manager saves again; each restores."""
    listed = subprocess.run(
        [sys.executable, "-c", "import sys; from ckpt_nb import CheckpointManager; "
         "print(' '.join(CheckpointManager(sys.argv[1]).list()['id']))", str(store)],
        capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == list(weights)
    digits.train_step()
    weights[mgr.save(digits.model, digits.optimizer)] = digits.weights()
    assert list(mgr.list()["id"]) == list(weights)
    for cid, kept in weights.items():
        mgr.restore(cid, model=digits.model)
        assert same(digits.weights(), kept)


def _note_committed(mgr: CheckpointManager, digits: DigitsRun,
                    weights: dict[str, list[torch.Tensor]]) -> None:
    """Add the checkpoint of a save whose commit went through before the Ctrl-C."""
    for cid in mgr.list()["id"]:
        weights.setdefault(cid, digits.weights())


_OPERATIONS: dict[str, Callable[[CheckpointManager, DigitsRun, str], Any]] = {
    "save": lambda mgr, digits, first: mgr.save(digits.model, digits.optimizer),
    "annotate": lambda mgr, digits, first: mgr.annotate(first, "kept"),
    "restore": lambda mgr, digits, first: mgr.restore(first, model=digits.model),
}


@pytest.mark.parametrize(("operation", "sql", "caller", "when"), [
    ("annotate", "BEGIN IMMEDIATE", "transaction", "after"),  # (while waiting on a writer)
    ("save", "COMMIT", "transaction", "before"),
    ("save", "COMMIT", "transaction", "after"),
    ("restore", "BEGIN", "snapshot", "after"),
    ("restore", "COMMIT", "snapshot", "before"),
    ("save", "COMMIT", "snapshot", "before"),
])
def test_a_ctrl_c_next_to_begin_or_commit_leaves_no_transaction_open(
        tmp_path: Path, digits: DigitsRun, faults: _Faults, operation: str, sql: str,
        caller: str, when: str) -> None:
    mgr, weights = _saved(tmp_path / "s", digits, 2)
    faults.at(sql, caller, when)
    digits.train_step()
    with pytest.raises(KeyboardInterrupt):
        _OPERATIONS[operation](mgr, digits, next(iter(weights)))
    assert not mgr.catalog._db.in_transaction
    _note_committed(mgr, digits, weights)
    _all_well(mgr, tmp_path / "s", digits, weights)


def test_a_transaction_left_open_by_a_second_ctrl_c_is_ended_by_the_next_one(
        tmp_path: Path, digits: DigitsRun, faults: _Faults) -> None:
    mgr, weights = _saved(tmp_path / "s", digits, 2)
    faults.at("BEGIN IMMEDIATE", "transaction", "after")
    faults.at("ROLLBACK", "_roll_back", "before")  # (the second Ctrl-C stops the ROLLBACK)
    with pytest.raises(KeyboardInterrupt):
        mgr.annotate(next(iter(weights)), "kept")
    digits.train_step()  # (this manager's next transaction ends the one left open)
    weights[mgr.save(digits.model, digits.optimizer)] = digits.weights()
    _all_well(mgr, tmp_path / "s", digits, weights)


def test_a_sqlite_error_at_a_snapshots_commit_rolls_it_back(
        tmp_path: Path, digits: DigitsRun, faults: _Faults) -> None:
    mgr, weights = _saved(tmp_path / "s", digits, 2)
    faults.at("COMMIT", "snapshot", "error")
    digits.train_step()
    with pytest.raises(OSError, match="disk I/O error"):
        mgr.save(digits.model, digits.optimizer)
    _all_well(mgr, tmp_path / "s", digits, weights)


def test_a_ctrl_c_while_a_catalog_query_is_read_holds_no_lock(
        tmp_path: Path, digits: DigitsRun) -> None:
    """IPython keeps the traceback (sys.last_traceback), with the frames it went through."""
    mgr, weights = _saved(tmp_path / "s", digits, 3)
    gone = list(weights)[1]

    def in_refs(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_name == "<setcomp>" and frame.f_back.f_code.co_name == "refs":
            return interrupt
        return None

    def interrupt(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            sys.settrace(None)
            signal.raise_signal(signal.SIGINT)
        return interrupt

    sys.settrace(in_refs)
    try:
        mgr.delete(gone)
    except KeyboardInterrupt:
        kept_traceback = sys.exc_info()[2]
    finally:
        sys.settrace(None)
    assert kept_traceback is not None
    if gone not in list(mgr.list()["id"]):  # (the interrupt came after its commit)
        del weights[gone]
    _all_well(mgr, tmp_path / "s", digits, weights)
    del kept_traceback


def test_a_sqlite_error_at_a_snapshots_begin_is_a_store_error(
        tmp_path: Path, digits: DigitsRun, faults: _Faults) -> None:
    """It came out as a raw sqlite3.OperationalError, which ``except OSError`` missed."""
    mgr, weights = _saved(tmp_path / "s", digits, 2)
    faults.at("BEGIN", "snapshot", "error")
    with pytest.raises(OSError, match=r"the catalog .*catalog\.sqlite failed: disk I/O error"):
        mgr.restore(next(iter(weights)), model=digits.model)
    _all_well(mgr, tmp_path / "s", digits, weights)
