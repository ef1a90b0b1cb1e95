"""An export of a checkpoint holding a pickle, without trust_pickle, says one warning for
it: what is left out of the file, why, and how to keep it. The read before the write said
"... are pickles and were not loaded" as well: two warnings for one value, in the Python
API, the CLI and the explorer alike."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

import ckpt_nb
from ckpt_nb import CheckpointManager
import warm_python  # (fresh interpreters forked from a warm one)


class Point:
    """A user class: stored as a pickle."""

    def __init__(self, x: int) -> None:
        self.x = x


def left_out(name: str) -> str:
    """The export's warning; a .pt cannot keep the object even where trusted (its class
    is a user's, which torch.load(weights_only=True) refuses): it names .safetensors."""
    to = " to .safetensors" if name.endswith(".pt") else ""
    return f"left out of {name}: extra/point (pickled, not loaded: export{to} with " \
        "trust_pickle=True)"


def saved_with_a_pickle(store: Path) -> str:
    with CheckpointManager(store) as mgr:
        return mgr.save(torch.nn.Linear(2, 2), extra={"point": Point(3), "keep": [1, 2]})


def test_the_python_export_says_one_warning_for_a_pickle(tmp_path: Path) -> None:
    cid = saved_with_a_pickle(tmp_path / "store")
    mgr = CheckpointManager(tmp_path / "store")
    for name in ("a.pt", "a.safetensors"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mgr.export(cid, tmp_path / name)
        assert [str(w.message) for w in caught] == [left_out(name)]
    with warnings.catch_warnings():  # (the model alone: the pickle in extra is no concern)
        warnings.simplefilter("error")
        mgr.export(cid, tmp_path / "model.pt", only="model")
    with warnings.catch_warnings(record=True) as caught:  # (a load still says it)
        warnings.simplefilter("always")
        mgr.load(cid)
    assert [str(w.message) for w in caught] == [
        f"checkpoint {cid}: ['extra/point'] are pickles and were not loaded; pass "
        "trust_pickle=True to load them"]


def test_the_cli_and_the_explorer_export_say_one_warning_for_a_pickle(tmp_path: Path) -> None:
    cid = saved_with_a_pickle(tmp_path / "store")
    done = warm_python.run([sys.executable, "-m", "ckpt_nb", "export", str(tmp_path / "store"),
                           cid, str(tmp_path / "a.pt")])
    assert done.returncode == 0, done.stderr
    assert done.stderr == "ckpt-nb: warning: " + left_out("a.pt").replace(
        "trust_pickle=True", "--trust-pickle") + "\n"
    ui = ckpt_nb.explore(tmp_path / "store", namespace={}, poll_seconds=0)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ui.export(cid, str(tmp_path / "b.pt"))
    finally:
        ui.close()
    assert [str(w.message) for w in caught] == [left_out("b.pt")]
