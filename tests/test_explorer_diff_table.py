"""The Diff tab's tables read as tables: the headers of ``CheckpointManager.diff``'s over
their columns. A real store."""

from __future__ import annotations

from pathlib import Path

import torch

import ckpt_nb


def test_the_diff_tables_headers_sit_over_their_columns(tmp_path: Path) -> None:
    """pandas' to_html put text-align: right on the header row, the cells left: "tensor"
    sat far right of its column."""
    model = torch.nn.Linear(2, 2)
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        a = mgr.save(model)
        with torch.no_grad():
            model.weight.add_(1)
        b = mgr.save(model)
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.select([a, b])
        ui.tabs.selected_index = 3
        assert "<th>tensor</th>" in ui.diff_table.value
        assert "text-align: right" not in ui.diff_table.value
        assert '<tr style="text-align: left;">' in ui.diff_table.value
    finally:
        ui.close()
