"""CheckpointManager's engine where its state is unusual: a metric logged only as NaN or
±inf, a head that another manager deleted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager, CheckpointNotFoundError


def test_best_where_every_metric_is_nan_or_inf_says_none_is_finite(tmp_path: Path) -> None:
    """The metric is logged, only never finite (a diverged run): "no checkpoint has the
    metric" sent users looking for a typo in its name."""
    model = torch.nn.Linear(2, 2)
    mgr = CheckpointManager(tmp_path, metric="val_loss")
    mgr.save(model, metrics={"val_loss": math.nan})
    mgr.save(model, metrics={"val_loss": math.inf})
    with pytest.raises(CheckpointNotFoundError, match=r"no checkpoint has a finite 'val_loss' "
                                                      r"\(NaN and ±inf are never best\)"):
        mgr.restore("best", model=model)
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint has the metric 'val_acc'"):
        CheckpointManager(tmp_path, metric="val_acc").restore("best", model=model)


def test_head_column_shows_the_heir_of_a_head_another_manager_deleted(tmp_path: Path) -> None:
    """As where this manager deletes its head itself: the head column is on the checkpoint
    the next save descends from."""
    model = torch.nn.Linear(4, 4)
    mine = CheckpointManager(tmp_path)
    first = mine.save(model)
    second = mine.save(model)
    other = CheckpointManager(tmp_path)
    other.delete(second)
    other.close()
    table = mine.list()
    assert list(table["id"][table["head"]]) == [first]
    third = mine.save(model)
    table = mine.list()
    assert list(table["id"][table["head"]]) == [third]
    assert table["parent"].tolist() == [None, first]
