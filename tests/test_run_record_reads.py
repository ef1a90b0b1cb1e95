"""How many manifests a reader reads, and how, for the ``--keep-best`` of a store's newest
run (``ckpt-nb ls``, ``%ckpt_list``, the explorer): a store that sessions wrote, the newest
one's alone; one that scripts wrote (no run record), its 16 newest, fetched several at a
time: one by one, each ``ls`` of an object store waited for 16 GETs in turn. A real local
store whose reads of manifests take an object store's round trip, and count."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import CheckpointManager, LocalStore, _run_records

pytestmark = pytest.mark.usefixtures("fresh_process_state")

ROUND_TRIP = 0.05  # s, a manifest's GET


class FarStore(LocalStore):
    """A local store whose manifests come back a round trip late, counted: how many were
    read, and the most read at once."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._lock = threading.Lock()
        self.manifest_reads = self.reading = self.most_at_once = 0

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        if not key.startswith("manifests/"):
            return super().get(key, start, end)
        with self._lock:
            self.manifest_reads += 1
            self.reading += 1
            self.most_at_once = max(self.most_at_once, self.reading)
        try:
            time.sleep(ROUND_TRIP)
            return super().get(key, start, end)
        finally:
            with self._lock:
                self.reading -= 1


def test_a_store_scripts_wrote_has_its_16_newest_manifests_read_together(
        tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, metric="loss") as mgr:
        for i in range(20):
            mgr.save(torch.nn.Linear(2, 2), metrics={"loss": 1 / (i + 1)})
    store = FarStore(tmp_path)
    with CheckpointManager(store) as mgr:
        assert _run_records.written_keep_best(mgr) is None
    assert store.manifest_reads == _run_records.RUN_RECORD_DEPTH
    assert store.most_at_once > 1


def test_a_store_a_session_wrote_last_has_its_newest_manifest_read_alone(
        tmp_path: Path) -> None:
    ns = {"model": torch.nn.Linear(4, 2)}
    with ckpt_nb.auto(tmp_path, namespace=ns, on="loss:min", keep=20, keep_best=3, name="x",
                      track=["model"], sync=True) as session:
        for loss in (0.5, 0.2, 0.9, 0.3):
            ckpt_nb.log(loss=loss)
            session.save(wait=True)
    store = FarStore(tmp_path)
    with CheckpointManager(store) as mgr:
        assert _run_records.written_keep_best(mgr) == 3
    assert store.manifest_reads == 1
