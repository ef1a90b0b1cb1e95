"""Saves and restores of a model of many tiny tensors, against torch.save / torch.load.

A ``ParameterList`` of N four-element parameters and its Adam state (3N tensors) is the
worst case of per-tensor cost: every storage is a chunk of its own, with its hash,
catalog row and bookkeeping. Measured side by side, median of the repeats:

- ``torch.save`` + fsync, and ckpt_nb's ``save`` (full, into one store);
- the same save with Python's cyclic collector left running during it (ckpt_nb pauses
  it while it saves: the objects a save of many tensors makes set off full collections);
- ``torch.load`` + ``load_state_dict`` of model and optimizer, and ckpt_nb's ``restore``.

No target in the issue: this shows how far from torch.save the per-tensor cost is.
Run: ``.venv/bin/python benchmarks/bench_many_tensors.py [--quick] [--tensors N] [--repeats N]``
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

import _workloads as w


def build(n: int) -> tuple[torch.nn.ParameterList, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(4)) for _ in range(n)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model:
        p.grad = torch.ones_like(p)
    optimizer.step()
    return model, optimizer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5,000 tensors, one repeat")
    parser.add_argument("--tensors", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = 5_000 if args.quick else args.tensors
    repeats = 1 if args.quick else args.repeats
    print(w.machine_line())
    if not w.ckpt_nb_available():
        print("ckpt_nb does not import: nothing to measure")
        return 1
    import ckpt_nb
    from ckpt_nb import _manager

    model, optimizer = build(n)
    fresh_model, fresh_optimizer = build(n)
    times: dict[str, list[float]] = {}

    def record(name: str, fn, *fn_args) -> object:  # noqa: ANN001 - any callable
        seconds, out = w.timed(fn, *fn_args)
        times.setdefault(name, []).append(seconds)
        return out

    def collector_running() -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    with w.scratch() as root:
        pt = root / "state.pt"
        with ckpt_nb.CheckpointManager(root / "store") as mgr:
            mgr.save(model, optimizer)  # (warm-up: imports, the store's first files)
            for _ in range(repeats):
                record("torch.save+fsync", w.torch_save,
                       {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, pt)
                cid = record("ckpt_nb save", mgr.save, model, optimizer)
                paused = _manager.collector_paused
                _manager.collector_paused = collector_running
                try:
                    record("ckpt_nb save, collector running", mgr.save, model, optimizer)
                finally:
                    _manager.collector_paused = paused

                def torch_restore() -> None:
                    state = w.torch_load(pt)
                    fresh_model.load_state_dict(state["model"])
                    fresh_optimizer.load_state_dict(state["optimizer"])

                record("torch.load+load_state_dict", torch_restore)
                record("ckpt_nb restore", lambda: mgr.restore(
                    cid, model=fresh_model, optimizer=fresh_optimizer))
        assert all(torch.equal(a, b) for a, b in zip(model, fresh_model))
    save_base, load_base = times["torch.save+fsync"], times["torch.load+load_state_dict"]
    rows = [(name, f"{w.median(ts):.3f}", f"{w.paired_ratio(ts, base):.2f}x")
            for name, ts in times.items()
            for base in [load_base if "load" in name or "restore" in name else save_base]]
    w.print_table(f"{n:,} parameters + Adam ({3 * n:,} tensors), median of {repeats} "
                  "(ratio to torch.save+fsync, or to torch.load+load_state_dict)",
                  ("what", "s", "ratio"), rows)
    print(w.machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
