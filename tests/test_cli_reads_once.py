"""``ckpt-nb ls`` and ``show`` on a store of many checkpoints: each reads (decodes and
checks) the catalog's rows once at most. ls read them four times (list(), its NaN
metrics, its best marks, the run record's newest 16), and ``show -3`` twice through
list() for ids alone: 2.5 s for an ls of 1,500 checkpoints. Counted on a real store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager
from ckpt_nb._catalog import CheckpointRow
from ckpt_nb._run_records import RUN_RECORD_DEPTH
from ckpt_nb.cli import main

SAVES = 40


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The id of each catalog row decoded from now on (the real decoding, counted)."""
    seen: list[str] = []
    decode = CheckpointRow.from_sql.__func__  # type: ignore[attr-defined]

    def counted(cls: type[CheckpointRow], row: object) -> CheckpointRow:
        checked = decode(cls, row)
        seen.append(checked.id)
        return checked

    monkeypatch.setattr(CheckpointRow, "from_sql", classmethod(counted))
    return seen


def test_ls_and_show_read_each_row_once_at_most(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], decoded: list[str]) -> None:
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path, strategy="full", metric="loss") as mgr:
        ids = [mgr.save(model, step=i, metrics={"loss": 1 / (i + 1)}) for i in range(SAVES)]
    for argv, most, shown in ((["ls"], SAVES + RUN_RECORD_DEPTH, f"{SAVES} checkpoints"),
                              (["show", "best"], SAVES + RUN_RECORD_DEPTH, f"id:        {ids[-1]}"),
                              (["show", "-3"], RUN_RECORD_DEPTH, f"id:        {ids[-4]}")):
        decoded.clear()
        assert main([argv[0], str(tmp_path), *argv[1:]]) == 0
        out = capsys.readouterr().out
        assert shown in out and len(decoded) <= most, (argv, len(decoded), out)
