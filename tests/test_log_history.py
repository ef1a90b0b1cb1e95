"""ckpt_nb.history(): every value ckpt_nb.log() recorded, as a DataFrame, where list() has
only the kept checkpoints' metrics (with --on and --keep, most of the learning curve)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from sklearn.datasets import load_digits

import ckpt_nb

pytestmark = pytest.mark.usefixtures("fresh_process_state")


def digits_training() -> dict[str, object]:
    X, Y = (torch.tensor(a) for a in load_digits(return_X_y=True))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 10))
    return {"loader": torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(X.float() / 16.0, Y), batch_size=200,
                shuffle=True),
            "model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def test_history_reads_every_logged_value_where_list_has_the_kept_ones(tmp_path: Path) -> None:
    """auto(on="val_loss:min", keep=2) over 6 epochs: list() had 2 rows, and the 6 logged
    values were only in an undocumented columnar record."""
    ns = digits_training()
    model, opt = ns["model"], ns["opt"]
    logged = []
    with ckpt_nb.auto(str(tmp_path / "s"), namespace=ns, on="val_loss:min", keep=2) as session:
        for epoch in ckpt_nb.epochs(6):
            for _, (xb, yb) in ckpt_nb.batches(ns["loader"]):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            values = {"val_loss": 1.0 / (epoch + 1) + 0.1 * (epoch == 5), "loss": loss.item()}
            if epoch == 2:
                values["lr"] = 0.01
            ckpt_nb.log(**values)
            logged.append((session.step, epoch, values))
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        assert len(mgr.list()) == 2
        frame = ckpt_nb.history(mgr)
    assert list(frame.columns) == ["step", "epoch", "val_loss", "loss", "lr"]
    assert len(frame) == 6
    for (_, row), (step, epoch, values) in zip(frame.iterrows(), logged):
        assert (row["step"], row["epoch"]) == (step, epoch)
        assert row["val_loss"] == values["val_loss"] and row["loss"] == values["loss"]
        # (each metric as it stood at that call: NaN before it was first logged)
        assert row["lr"] == 0.01 if epoch >= 2 else math.isnan(row["lr"])
    assert str(frame["step"].dtype) == "Int64"
    # (a directory too; an earlier checkpoint's history ends where it was saved)
    earlier = ckpt_nb.history(tmp_path / "s", "-1")
    pd.testing.assert_frame_equal(earlier, frame.iloc[:5])


def test_history_of_a_checkpoint_no_session_saved_says_where_its_metrics_are(
        tmp_path: Path) -> None:
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(torch.nn.Linear(2, 2), metrics={"loss": 0.5})
    with pytest.raises(ckpt_nb.MetricNotFoundError) as raised:
        ckpt_nb.history(tmp_path / "s")
    assert str(raised.value).strip("'\"") == (
        f"checkpoint {cid} holds no ckpt_nb.log() history: a CheckpointManager.save() saved "
        "it, not a %%ckpt_auto cell or an auto() block; the metrics it was saved with are in "
        "list()")
    with pytest.raises(ckpt_nb.CheckpointNotFoundError, match="no checkpoint store at"):
        ckpt_nb.history(tmp_path / "typo")
    assert not (tmp_path / "typo").exists()
