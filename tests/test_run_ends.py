"""A run that ran to its end stays ended: its end checkpoint deleted, its catalog rebuilt
from the store, or after it ended again on another branch (the store's runs/ files)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from test_session_rerun import new_kernel

import ckpt_nb
from ckpt_nb import CheckpointManager, FsspecStore


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts like a new process."""
    new_kernel(monkeypatch)


def objects() -> dict[str, Any]:
    """A script's namespace: a model, its optimizer, a loader of 6 batches an epoch."""
    torch.manual_seed(0)
    x, y = torch.randn(300, 8), torch.randint(0, 2, (300,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=50,
                                         shuffle=True)
    model = torch.nn.Linear(8, 2)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
            "loader": loader}


def train(ns: dict[str, Any], store: str | Path, every: int = 2, stop_at: int | None = None
          ) -> None:
    """The named block of a script: two epochs, 12 steps; ``stop_at``: an error raised at
    that step's consistent point, once it is saved (``every`` divides it)."""
    with ckpt_nb.auto(str(store), every_steps=every, name="train", namespace=ns) as session:
        for _ in ckpt_nb.epochs(2):
            for _, (x, y) in ckpt_nb.batches(ns["loader"]):
                if session.step == stop_at:
                    raise RuntimeError("stopped")
                ns["opt"].zero_grad()
                torch.nn.functional.cross_entropy(ns["model"](x), y).backward()
                ns["opt"].step()


def run_files(store: Path) -> list[str]:
    return sorted(path.name for path in (store / "runs").glob("*.json"))


def test_a_finished_run_stays_finished_once_its_catalog_is_rebuilt(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its end deleted, the store copied without its catalog: the rebuilt catalog had lost
    the note of the run's end, and the block resumed the finished run from the checkpoint
    before it, training an epoch again."""
    store = tmp_path / "rb"
    train(objects(), store)
    with CheckpointManager(store) as manager:
        manager.delete("latest")
        kept = manager.list()["id"].tolist()
    for path in tmp_path.glob("rb/catalog.sqlite*"):
        path.unlink()
    new_kernel(monkeypatch)
    capsys.readouterr()
    with pytest.warns(RuntimeWarning, match="rebuilt"):
        train(objects(), store)
    assert "resumed" not in capsys.readouterr().out
    with CheckpointManager(store) as manager:
        table = manager.list()
        assert table["id"].tolist()[:len(kept)] == kept
        assert table["parent"].iloc[len(kept)] is None  # (new objects: a new root)
        assert manager.verify().ok  # (runs/ is none of its business)


def test_a_run_ended_on_two_branches_stays_finished_once_both_ends_are_deleted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rolled back to step 6 and run on to a second end on a new branch, both ends then
    deleted: only the last end was noted, and the block resumed the first branch's step-10
    checkpoint."""
    store, ns = tmp_path / "r9", objects()
    train(ns, store)
    with CheckpointManager(store) as manager:
        table = manager.list()
    first_end, middle = table["id"].iloc[-1], table[table["step"] == 6]["id"].iloc[0]
    ckpt_nb.rollback(middle, directory=store, namespace=ns)
    train(ns, store, every=100)  # (the same run, on from step 6)
    with CheckpointManager(store) as manager:
        second_end = manager.resolve("latest")
        assert manager.list()["parent"].iloc[-1] == middle
        manager.delete(first_end)
        manager.delete(second_end)
    [name] = run_files(store)
    ends = json.loads((store / "runs" / name).read_text())["ends"]
    assert [end["end"] for end in ends] == [first_end, second_end]
    assert set(table["id"].iloc[:-1]) <= set(ends[0]["before"])
    assert ends[1]["before"] == table["id"].tolist()[:3]  # (steps 2, 4, 6)
    capsys.readouterr()
    train(ns, store)
    assert "resumed" not in capsys.readouterr().out


def test_a_run_gone_on_past_a_rollback_resumes_its_new_branch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The checkpoints a run ended after are those on the path to its end: one made on a
    new branch after a rollback, the end since deleted, is resumed."""
    store, ns = tmp_path / "branch", objects()
    train(ns, store)
    with CheckpointManager(store) as manager:
        table = manager.list()
    ckpt_nb.rollback(table[table["step"] == 6]["id"].iloc[0], directory=store, namespace=ns)
    with pytest.raises(RuntimeError, match="stopped"):
        train(ns, store, stop_at=8)
    with CheckpointManager(store) as manager:
        stopped = manager.resolve("latest")
        manager.delete(table["id"].iloc[-1])
    capsys.readouterr()
    train(ns, store)
    assert f"resumed from {stopped}" in capsys.readouterr().out


def test_a_store_noted_before_run_files_keeps_its_runs_ended(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A store written before run files noted a run's last end in its catalog alone."""
    store = tmp_path / "old"
    train(objects(), store)
    [path] = (store / "runs").glob("*.json")
    path.unlink()
    with CheckpointManager(store) as manager:
        with manager.catalog.transaction():
            manager.catalog._set_meta(f"ckpt_nb_run_end:{path.stem}", manager.resolve("latest"))
        manager.delete("latest")
    capsys.readouterr()
    train(objects(), store)
    assert "resumed" not in capsys.readouterr().out


def test_gc_removes_a_run_file_once_the_runs_checkpoints_are_all_deleted(
        tmp_path: Path) -> None:
    store = tmp_path / "gc"
    train(objects(), store)
    (store / "runs" / "notes.txt").write_text("mine")  # (not a name ckpt_nb makes)
    [name] = run_files(store)
    with CheckpointManager(store) as manager:
        ids = manager.list()["id"].tolist()
        for cid in ids[1:]:
            manager.delete(cid)
        manager.gc()
        assert run_files(store) == [name]  # (its first checkpoint is left)
        manager.delete(ids[0])
        manager.gc()
    assert run_files(store) == [] and (store / "runs" / "notes.txt").read_text() == "mine"


def test_an_object_stores_run_stays_finished_on_a_new_machine_and_gc_prunes_it(
        bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On S3 the catalog is a cache of this machine's: another machine's is rebuilt, and
    the end the run file notes is read from the store."""
    url = f"s3://{bucket}/exp"
    train(objects(), url)
    assert [key.rsplit("/", 1)[-1] for key in FsspecStore(url).list("runs")] != []
    with CheckpointManager(url) as manager:
        manager.delete("latest")
    monkeypatch.setenv("HOME", str(tmp_path / "another"))  # (a cache of its own)
    new_kernel(monkeypatch)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the catalog rebuilt)
        train(objects(), url)
    assert "resumed" not in capsys.readouterr().out
    with CheckpointManager(url) as manager:
        for cid in manager.list()["id"]:
            manager.delete(cid)
        manager.gc()
        assert manager.verify().ok
    assert list(FsspecStore(url).list("runs")) == []


def test_a_long_runs_end_reads_no_manifest_of_its_own_saves_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Noting where a run ended read the manifest of each of its checkpoints back (up to
    256: seconds of round trips on an object store at each finished cell)."""
    from ckpt_nb import _session

    reads: list[str] = []
    note_end = _session.AutoSession._note_end

    def counted(self: Any, end_id: str) -> None:
        get = self.manager.store.get
        self.manager.store.get = lambda key: reads.append(key) or get(key)
        try:
            note_end(self, end_id)
        finally:
            self.manager.store.get = get

    monkeypatch.setattr(_session.AutoSession, "_note_end", counted)
    ns = objects()
    ns["loader"] = torch.utils.data.DataLoader(ns["loader"].dataset, batch_size=10)
    train(ns, tmp_path / "s", every=1)  # (60 saves: more than the manager keeps read)
    assert len(CheckpointManager(tmp_path / "s").list()) == 60
    assert not [key for key in reads if key.startswith("manifests/")], reads
    ends = json.loads(next((tmp_path / "s" / "runs").iterdir()).read_text())["ends"]
    assert len(ends[0]["before"]) >= 59  # (the whole run: none of it read back)
