"""A training loop that checkpoints until it is SIGKILLed; test_crash.py is its victim's judge.

    python _crash_worker.py STORE_DIR SEED MODE     MODE: full | incremental | gc

Each step trains once, appends ``<step> <hash>`` to ``begun.log``, saves, then
appends ``<id> <hash>`` to ``committed.log`` (both flushed and fsynced), where
the hash covers every tensor of the model and optimizer state. ``gc`` mode saves
with ``max_to_keep=2`` and short delta chains, so retention and gc (including
pack compaction, thanks to a frozen layer whose chunk outlives its pack) run on
every save. It prints ``ready`` once torch is imported and the store is open.

The tests fork it from a server that has torch imported already (``serve``),
which saves the ~3 s torch and torch._dynamo (AdamW) take to import per trial;
run it as a script to reproduce a trial by hand.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import torch

KEEP = {"full": 4, "incremental": 4, "gc": 2}


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """~200k parameters; the first layer is frozen, so its bytes never change."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    model[0].requires_grad_(False)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def state_hash(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """sha256 of the bytes of every model tensor, then every optimizer state tensor, in order."""
    h = hashlib.sha256()
    tensors = list(model.state_dict().values())
    for _, param_state in sorted(optimizer.state_dict()["state"].items()):
        tensors += [v for _, v in sorted(param_state.items()) if isinstance(v, torch.Tensor)]
    for t in tensors:
        h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def append_line(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def main(store_dir: str, seed: int, mode: str,
         ready: Callable[[], None] = lambda: print("ready", flush=True)) -> None:
    from ckpt_nb import CheckpointManager

    torch.set_num_threads(1)
    model, optimizer = build(seed)
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(64, 128, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    strategy = "full" if mode == "full" else "incremental"
    mgr = CheckpointManager(store_dir, max_to_keep=KEEP[mode], strategy=strategy, threads=2,
                            full_every=3 if mode == "gc" else None)
    side = Path(store_dir)
    ready()
    for step in range(1, 2001):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if mode == "gc" and step % 3 == 0:  # the frozen layer moves now and then: its chunk
            with torch.no_grad():          # outlives its pack, so gc compacts packs often
                model[0].weight.mul_(0.999)
        digest = state_hash(model, optimizer)
        append_line(side / "begun.log", f"{step} {digest}")
        cid = mgr.save(model, optimizer, step=step, metrics={"loss": loss.item()}, rng=False)
        append_line(side / "committed.log", f"{cid} {digest}")


def serve(store_dir: str, seed: int, mode: str, conn: Connection, log: str) -> None:
    """``main`` in a forked child: output to ``log``, ``"ready"`` sent down ``conn``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    main(store_dir, seed, mode, ready=lambda: conn.send("ready"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "full")
