"""Metric names come in one order wherever they are shown: natural (loss_2 before
loss_10), the same from run to run, and for any name a metric may have."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager, CheckpointNotFoundError
from ckpt_nb._units import natural_order
from ckpt_nb.cli import main


def saved(directory: Path, metrics: dict[str, float]) -> str:
    with CheckpointManager(directory) as mgr:
        return mgr.save(torch.nn.Linear(2, 2), rng=False, metrics=metrics)


def test_numbers_are_decimal_digits_of_any_script_and_not_superscripts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """'²' is a digit to isdigit() and not to int(): a store logging r² failed resolve()
    of an unknown metric, ckpt-nb show and ckpt-nb ls with a ValueError."""
    assert sorted(["x_10", "x_٣", "x_2"], key=natural_order) == ["x_2", "x_٣", "x_10"]
    cid = saved(tmp_path, {"r²": 0.9, "²": 1.0, "x2²": 3.0})
    with CheckpointManager(tmp_path, metric="nope") as mgr:
        with pytest.raises(CheckpointNotFoundError) as refused:
            mgr.resolve("best")
    assert str(refused.value).endswith("the metrics logged are: r², x2², ²")
    assert main(["show", str(tmp_path), "latest"]) == 0
    assert "metrics:   r²=0.9, x2²=3, ²=1\n" in capsys.readouterr().out
    assert main(["ls", str(tmp_path)]) == 0
    assert cid in capsys.readouterr().out
