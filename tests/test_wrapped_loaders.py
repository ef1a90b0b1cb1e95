"""A DataLoader wrapped by a library that forwards ``state_dict()`` to a loader that has
none (accelerate's ``DataLoaderShard`` after ``accelerator.prepare(loader)``, over a plain
DataLoader: its ``state_dict()`` raises AttributeError): it is a loader, which batches()
saves and puts back, not a Stateful whose state a save takes (the first save of the
session failed, a bare AttributeError from the wrapper's code)."""

from __future__ import annotations

from pathlib import Path

import torch

from ckpt_nb._discovery import discover
from test_session_jobs import unstopped_and_resumed

SHARD = """
class Shard(torch.utils.data.DataLoader):
    '''As accelerate's DataLoaderShard over a plain DataLoader: a state_dict() that
    reads an attribute only a stateful base loader gives it.'''
    def state_dict(self):
        return self.dl_state_dict
    def load_state_dict(self, state):
        self.base_dataloader.load_state_dict(state)
"""


def test_a_loader_whose_state_dict_fails_is_a_loader_not_a_stateful() -> None:
    namespace: dict = {"torch": torch}
    exec(SHARD, namespace)
    data = torch.utils.data.TensorDataset(torch.randn(12, 3))
    found = discover({"loader": namespace["Shard"](data, shuffle=True)},
                     code="for i, (x,) in ckpt_nb.batches(loader):\n    pass\n")
    assert "loader" not in found.statefuls
    assert found.skipped["loader"] == "DataLoader: ckpt_nb.batches() restores its order"


WRAPPED = """
import os, torch, ckpt_nb
""" + SHARD + """
torch.manual_seed(0)
X = torch.randn(120, 8); Y = (X.sum(1) > 0).long()
loader = Shard(torch.utils.data.TensorDataset(X, Y), batch_size=10, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
steps = 0
with ckpt_nb.auto("store", every_steps=5):
    for epoch in ckpt_nb.epochs(2):
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step(); steps += 1
            if os.environ["DIE"] and steps == 17:
                os.kill(os.getpid(), 9)
print("weights", [round(v, 12) for v in torch.cat([p.flatten() for p in
                                                   model.parameters()]).tolist()])
"""


def test_a_wrapped_loader_resumes_mid_epoch_bit_exact(tmp_path: Path) -> None:
    unstopped, resumed = unstopped_and_resumed(tmp_path, WRAPPED)
    said = resumed.stdout.split("resumed from")[1].split(")")[0]
    assert ", step 10" in said or ", step 15" in said, resumed.stdout  # (mid-epoch)
    assert resumed.stdout.split("weights")[1] == unstopped.stdout.split("weights")[1]


def test_torchdatas_stateful_loader_is_not_asked_for_its_state_at_discovery() -> None:
    """torchdata's StatefulDataLoader's state_dict() works; asked at discovery (before the
    loop) it made the epoch's iterator, starting its workers and drawing from torch's RNG
    ahead of the cell's own seeding: it is a Stateful, found without asking it."""
    asked = []

    def state_dict(self):
        asked.append(1)
        return {}
    kind = type("StatefulDataLoader", (torch.utils.data.DataLoader,), {
        "__module__": "torchdata.stateful_dataloader.stateful_dataloader",
        "state_dict": state_dict, "load_state_dict": lambda self, state: None})
    loader = kind(torch.utils.data.TensorDataset(torch.randn(12, 3)), shuffle=True)
    found = discover({"loader": loader},
                     code="for i, (x,) in ckpt_nb.batches(loader):\n    pass\n")
    assert found.statefuls["loader"] is loader
    assert not asked
