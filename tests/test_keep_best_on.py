"""--on METRIC --keep-best K keeps what Lightning's save_top_k=K (with save_last) keeps: the
K best values logged and the newest. The trigger saved only a new best, so an epoch whose
value was the second best was never saved, and retention kept the best K of the
improvements instead (an older, worse model in its place)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import ckpt_nb
from test_session_jobs import unstopped_and_resumed  # (scripts, fresh interpreters)

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)


def train(store: Path, logged: list[float], mode: str, keep_best: int | None,
          ) -> list[dict[str, torch.Tensor]]:
    """An epoch of training then the value logged, each epoch: the model's weights as
    measured, by epoch."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    measured = []
    with ckpt_nb.auto(str(store), namespace={"model": model, "opt": opt},
                      on=("val_acc", mode), keep_best=keep_best, sync=True):
        for epoch in ckpt_nb.epochs(len(logged)):
            for _, x in ckpt_nb.batches([torch.randn(8, 4) for _ in range(2)]):
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
            measured.append({k: v.clone() for k, v in model.state_dict().items()})
            ckpt_nb.log(val_acc=logged[epoch])
    return measured


def kept_by_save_top_k(logged: list[float], mode: str, k: int) -> list[int]:
    """The epochs a save_top_k=k, save_last run keeps, by the documented ranking: finite
    values only, the newer first among equals."""
    sign = 1 if mode == "min" else -1
    ranked = sorted((e for e, v in enumerate(logged) if math.isfinite(v)),
                    key=lambda e: (sign * logged[e], -e))
    return sorted({*ranked[:k], len(logged) - 1})


def test_keep_best_keeps_the_k_best_logged_and_the_newest(tmp_path: Path) -> None:
    """The reproducer: [0.50, 0.90, 0.70, 0.85, 0.80, 0.60] kept 0.9, 0.5 and the end
    (0.6); the 0.85 and 0.8 models were never saved."""
    logged = [0.50, 0.90, 0.70, 0.85, 0.80, 0.60]
    measured = train(tmp_path, logged, "max", 3)
    with ckpt_nb.CheckpointManager(tmp_path) as mgr:
        rows = mgr.list()
        assert rows["val_acc"].tolist() == [0.90, 0.85, 0.80, 0.60]
        assert rows["note"].tolist() == ["val_acc improved", "val_acc ranks among the 3 best",
                                         "val_acc ranks among the 3 best", "end of cell"]
        for cid, epoch in zip(rows["id"], kept_by_save_top_k(logged, "max", 3)):
            state = mgr.load(cid).state["model"]  # (the model measured, not a later one)
            assert all(torch.equal(state[k], v) for k, v in measured[epoch].items())


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("keep_best", [1, 2, 3])
def test_ties_rank_the_newer_first_and_nan_or_inf_is_never_kept_as_best(
        tmp_path: Path, mode: str, keep_best: int) -> None:
    """Ties, NaN and ±inf as README's Ranking says: an equal value is saved and ranks
    ahead of the older (which retention then deletes), a NaN or infinite one never ranks."""
    sign = 1 if mode == "min" else -1
    logged = [sign * v for v in (3.0, math.nan, 2.0, 2.0, -math.inf, 4.0, 1.0, 5.0, 1.0, 1.5)]
    train(tmp_path, logged, mode, keep_best)
    with ckpt_nb.CheckpointManager(tmp_path) as mgr:
        epochs = [int(e) - 1 for e in mgr.list()["epoch"]]  # (a checkpoint's: the next epoch)
    assert epochs == kept_by_save_top_k(logged, mode, keep_best)


def test_without_keep_best_on_saves_only_an_improvement(tmp_path: Path) -> None:
    """--on alone deletes nothing: it saves a new best, not an equal one."""
    train(tmp_path, [0.5, 0.5, 0.7, 0.6, 0.7, 0.6], "max", None)
    with ckpt_nb.CheckpointManager(tmp_path) as mgr:
        rows = mgr.list()
    assert rows["note"].tolist() == ["val_acc improved"] * 2 + ["end of cell"]
    assert rows["val_acc"].tolist() == [0.5, 0.7, 0.6]


# Killed in epoch 5; keep=20 keeps every save, so the saves after the resume show.
SCRIPT = """
import os, torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ACC = [0.50, 0.90, 0.70, 0.85, 0.80, 0.60, 0.75, 0.95]
with ckpt_nb.auto("store", on="val_acc:max", keep_best=3, keep=20):
    for epoch in ckpt_nb.epochs(len(ACC)):
        for i, x in ckpt_nb.batches([torch.ones(8, 4)] * 3):
            opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()
            if os.environ["DIE"] and epoch == 5 and i == 1:
                os.kill(os.getpid(), 9)
        ckpt_nb.log(val_acc=ACC[epoch])
with ckpt_nb.CheckpointManager("store") as store:
    print("saves:", store.list()[["step", "epoch", "val_acc", "note"]].to_string())
"""


def test_a_resume_ranks_as_the_unstopped_run(tmp_path: Path) -> None:
    """A resume goes on with the K best the run had logged: it saves no value the
    unstopped run did not (0.6 and 0.75 rank below 0.9, 0.85 and 0.8)."""
    reference, resumed = unstopped_and_resumed(tmp_path, SCRIPT)
    assert "resumed from" in resumed.stdout + resumed.stderr
    table = resumed.stdout.split("saves:")[1]
    assert table == reference.stdout.split("saves:")[1]
    assert "0.60" not in table and "0.75" not in table, table
