"""The Python API as issue 2 words it: restore(path) and load(path) report a path's own
problem, list()'s times say their zone, each error is also the matching built-in, nested
tensors need no trust to restore, info() gives the real restore depth, and a failed save's
message says once what it means to."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from conftest import Holder

from ckpt_nb import CheckpointManager, CkptError
from ckpt_nb._errors import FileFormatError

pytest.importorskip("safetensors")


def test_errors_that_were_a_bare_ckpterror_are_the_matching_builtin_too(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "s")
    torch.save([torch.ones(1)], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"list\.pt holds a list, not a dict of state") as got:
        mgr.import_file(tmp_path / "list.pt")
    assert isinstance(got.value, FileFormatError) and isinstance(got.value, CkptError)
    cid = mgr.save(h=Holder({"w": torch.ones(2)}))
    with pytest.raises(FileFormatError, match=r"unknown suffix"):
        mgr.export(cid, tmp_path / "model.zip")


def test_safetensors_refusal_names_every_dtype_and_its_tensors_at_once(
        tmp_path: Path) -> None:
    """It named the first refused dtype it met, and at most 3 of its tensors."""
    with warnings.catch_warnings():  # (torch calls complex32 experimental)
        warnings.simplefilter("ignore")
        state = {**{f"c{i}": torch.ones(2, dtype=torch.complex128) for i in range(7)},
                 "half": torch.ones(2, dtype=torch.complex32), "fine": torch.ones(2)}
        mgr = CheckpointManager(tmp_path / "s")
        cid = mgr.save(h=Holder(state))
    with pytest.raises(ValueError) as got:
        mgr.export(cid, tmp_path / "m.safetensors")
    message = str(got.value)
    assert isinstance(got.value, FileFormatError)
    assert "complex128 tensors (h/c0, h/c1, h/c2, h/c3, h/c4 and 2 more)" in message, message
    assert "complex32 tensors (h/half)" in message and "fine" not in message, message
    assert not (tmp_path / "m.safetensors").exists()
