"""The CLI's reads and bookkeeping (ls, show, verify, gc, pin, unpin, rm) never import
torch, whose import takes seconds; diff and export, which read tensors, import it then."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from ckpt_nb import CheckpointManager
from ckpt_nb._format import _ITEMSIZES
from test_cli import module_env

# Run in a real interpreter (not one of warm_python's, which hold torch already): each
# command's exit code, and whether torch was imported once it ended.
_COMMANDS = """
import json, sys
from ckpt_nb.cli import main
store = sys.argv[1]
seen = []
for argv in (["ls", store], ["show", store, "latest"], ["show", store, "best"],
             ["verify", store], ["pin", store, "-1"], ["unpin", store, "-1"],
             ["rm", store, "-2"], ["gc", store], ["diff", store, "-1", "latest"],
             ["export", store, "latest", sys.argv[2]]):
    code = main(argv)
    seen.append([argv[0], code, "torch" in sys.modules])
print(json.dumps(seen))
"""


def test_reads_and_bookkeeping_import_no_torch_and_tensor_commands_still_work(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    tensors = {"half": torch.randn(3, dtype=torch.bfloat16), "mask": torch.rand(5) > 0.5,
               "count": torch.arange(6), "phase": torch.randn(2, dtype=torch.complex64),
               "scale": torch.randn(4).to(torch.float8_e4m3fn)}
    optimizer = torch.optim.AdamW(model.parameters())
    with CheckpointManager(store, metric="loss") as mgr:
        for step in range(3):
            model(torch.randn(2, 8)).sum().backward()
            optimizer.step()
            mgr.save(model, optimizer, step=step, metrics={"loss": 1.0 / (step + 1)},
                     extra={"tensors": tensors, "lr": 1e-3})
    exported = tmp_path / "latest.pt"
    done = subprocess.run([sys.executable, "-c", _COMMANDS, str(store), str(exported)],
                          capture_output=True, text=True, env=module_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == [["ls", 0, False], ["show", 0, False], ["show", 0, False],
                    ["verify", 0, False], ["pin", 0, False], ["unpin", 0, False],
                    ["rm", 0, False], ["gc", 0, False], ["diff", 0, True],
                    ["export", 0, True]], done.stderr
    state = torch.load(exported, weights_only=True)
    assert torch.equal(state["model"]["weight"], model.weight.detach())


def test_the_item_sizes_read_without_torch_are_this_torchs():
    """A manifest is checked (its tensors within their storages) without importing torch,
    by a table of item sizes: it must hold every dtype of this torch, at its size."""
    dtypes = {str(d).removeprefix("torch."): d.itemsize for d in vars(torch).values()
              if isinstance(d, torch.dtype)}
    assert _ITEMSIZES == dtypes
