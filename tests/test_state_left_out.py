"""An object whose state_dict() is empty while it holds state that changes as it runs
(a torchmetrics Metric's accumulators, kept out of state_dict() unless
``metric.persistent(True)``; a module of non-persistent buffers) was saved as nothing and
restored as nothing, silently: a resumed run's metric started from zero. A save now says
so, once per manager and name, naming what is left out and how to put it in."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager


class RunningMean(torch.nn.Module):
    """An accumulator as torchmetrics' MeanMetric holds one by default: out of its state."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(()), persistent=False)
        self.register_buffer("count", torch.zeros(()), persistent=False)

    def update(self, value: torch.Tensor) -> None:
        self.total += value
        self.count += 1


class WithTable(torch.nn.Module):
    """Weights beside a constant non-persistent table (a position-ids buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("ids", torch.arange(3), persistent=False)


def test_a_stateful_whose_state_is_all_left_out_is_said_once(tmp_path: Path) -> None:
    model, mean = torch.nn.Linear(3, 2), RunningMean()
    mean.update(torch.tensor(4.0))
    mgr = CheckpointManager(tmp_path)
    with pytest.warns(RuntimeWarning) as told:
        cid = mgr.save(model, None, 0, mean=mean)
    said = [str(w.message) for w in told if "state_dict() is empty" in str(w.message)]
    assert len(said) == 1, said
    assert said[0].startswith("mean (RunningMean): its state_dict() is empty"), said
    assert "total, count" in said[0], said
    # (a constant table needs nothing: the advice is for buffers training changes)
    assert "if training changes them, register them with persistent=True" in said[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mgr.save(model, None, 1, mean=mean)  # (said once per manager and name)
    fresh = RunningMean()
    mgr.restore(cid, model=torch.nn.Linear(3, 2), mean=fresh)
    assert fresh.count.item() == 0  # (what the warning said: nothing of it came back)


def test_state_with_anything_in_it_and_stateless_modules_are_not_told(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CheckpointManager(tmp_path).save(WithTable(), None, 0, loss_fn=torch.nn.CrossEntropyLoss(),
                                         act=torch.nn.ReLU())
