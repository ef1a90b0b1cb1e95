"""Where an ``--on`` improvement can be saved: a metric logged inside ``batches()`` (or as
an epoch begins, before its loop) measures a state the next optimizer step takes away
before any point where it could be saved. It went unsaved without a word."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import CheckpointManager


def _train(directory: Path, where: str,
           capsys: pytest.CaptureFixture[str]) -> tuple[str, list[float]]:
    """Two epochs of four batches, ``val_loss`` improving at each log; the cell's output,
    and the val_loss of every checkpoint saved."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
    losses = iter([1.0, 0.5, 0.25, 0.125])
    with ckpt_nb.auto(str(directory), on="val_loss:min", namespace={"model": model, "opt": opt},
                      name=where):
        for _ in ckpt_nb.epochs(2):
            if where == "epoch start":
                ckpt_nb.log(val_loss=next(losses))
            for i, (x, y) in ckpt_nb.batches(data):
                if where == "in the loop" and i == 0:
                    ckpt_nb.log(val_loss=next(losses))
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            if where == "epoch end":
                ckpt_nb.log(val_loss=next(losses))
    with CheckpointManager(directory) as mgr:
        saved = [row.metrics.get("val_loss") for row in mgr.catalog.checkpoints()]
    return capsys.readouterr().out, saved


def test_an_improvement_the_next_step_takes_away_is_said_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for where in ("epoch start", "in the loop"):
        said, _ = _train(tmp_path / where.replace(" ", "_"), where, capsys)
        assert said.count("val_loss improved at step 0 but was not saved") == 1, said
        assert "log the --on metric after an epoch's batches() loop" in said


def test_an_improvement_logged_at_the_epochs_end_is_saved_and_not_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    said, saved = _train(tmp_path, "epoch end", capsys)
    assert "not saved" not in said
    assert 1.0 in saved and 0.5 in saved
