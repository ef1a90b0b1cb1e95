"""A listener that raises (an upload, a W&B artifact that is down) made a committed save
look failed: save() raised instead of returning its id, the listeners after it and
retention's "delete" events were skipped, and a restore raised after the model was loaded."""

from __future__ import annotations

import warnings
from pathlib import Path

from conftest import DigitsRun, same

from ckpt_nb import CheckpointManager


def test_a_raising_listener_is_a_warning_and_the_others_are_still_told(
        tmp_path: Path, digits: DigitsRun) -> None:
    def upload(event: str, cid: str) -> None:
        raise ConnectionError("upload failed")

    events: list[tuple[str, str]] = []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with CheckpointManager(tmp_path / "store", max_to_keep=1) as mgr:
            mgr.add_listener(upload)  # (first: it ran before the recording one)
            mgr.add_listener(lambda event, cid: events.append((event, cid)))
            saved = []
            for epoch in range(2):
                digits.train_step()
                saved.append(mgr.save(digits.model, digits.optimizer, epoch))
            first, second = saved
            assert list(mgr.list()["id"]) == [second]  # (retention deleted the first)
            at_second = digits.weights()
            digits.train_step()
            ck = mgr.restore("latest", digits.model, digits.optimizer)
            assert ck.id == second and same(digits.weights(), at_second)
            assert mgr.pin(second) == second
            assert mgr.delete(second, force=True) == second
    assert events == [("save", first), ("save", second), ("delete", first),
                      ("restore", second), ("pin", second), ("delete", second)]
    failures = [str(w.message) for w in said if issubclass(w.category, RuntimeWarning)
                and "listener" in str(w.message)]
    assert len(failures) == len(events)
    assert failures[0] == (
        "listener test_a_raising_listener_is_a_warning_and_the_others_are_still_told.<locals>"
        f".upload failed on the 'save' of checkpoint {first} (ConnectionError: upload failed); "
        "the save itself succeeded, and the other listeners were called")
    assert f"on the 'restore' of checkpoint {second}" in failures[3]
