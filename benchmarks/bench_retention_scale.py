"""A save under retention rules that delete nothing, against the number of checkpoints
in the store: a byte budget far from reached (``max_bytes``), and ``keep_best`` beside a
``max_to_keep`` the store does not reach (a notebook's ``--keep 10000 --keep-best 2``).
Each measured the whole store at every save (every pack and manifest listed, every
catalog row read), so a save's time grew with the store: 193 ms at 2,000 checkpoints
where a save without retention took 4 ms.

A small model (a few hundred KB with AdamW's state) is saved incrementally into stores of
``--sizes`` checkpoints (built once each, without retention); then each configuration's
manager saves ``--repeats`` more, each after an AdamW step, side by side with torch.save+
fsync of the same state to a file. Printed: each configuration's median save time as a
ratio to torch.save's, per store size, and how that ratio grows from the smallest store
to the largest (target: at most 1.5x, as a save without retention). A manager's first
save measures the store (it cannot know what others wrote before it opened): it is not
timed.

Run: ``.venv/bin/python benchmarks/bench_retention_scale.py [--sizes 100,2000]
[--repeats 9]``
"""

from __future__ import annotations

import argparse
import shutil
import sys
import warnings
from pathlib import Path

import torch

import _workloads as w

CONFIGS = {
    "no retention": {},
    "max_bytes=1 TB": {"max_bytes": 10**12},
    "max_to_keep=10000, keep_best=2": {"max_to_keep": 10_000, "keep_best": 2,
                                       "metric": "loss"},
}


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    optimizer.zero_grad()
    loss = model(torch.randn(32, 64)).square().mean()
    loss.backward()
    optimizer.step()
    return float(loss)


def build(store: Path, count: int) -> None:
    """A store of ``count`` incremental checkpoints, saved without retention."""
    from ckpt_nb import CheckpointManager

    model, optimizer = model_and_optimizer()
    with CheckpointManager(store, strategy="incremental", full_every=10) as mgr:
        for step in range(count):
            loss = train_step(model, optimizer)
            mgr.save(model, optimizer, step=step, metrics={"loss": loss})


def measure(store: Path, options: dict[str, object], repeats: int,
            baseline_file: Path) -> tuple[list[float], list[float]]:
    """``repeats`` saves into ``store`` by a manager with ``options``, each beside a
    torch.save+fsync of the same state (their seconds)."""
    from ckpt_nb import CheckpointManager

    model, optimizer = model_and_optimizer()
    ours, base = [], []
    with CheckpointManager(store, strategy="incremental", full_every=10,
                           **options) as mgr:  # type: ignore[arg-type]
        mgr.save(model, optimizer, metrics={"loss": train_step(model, optimizer)})
        for r in range(repeats):
            loss = train_step(model, optimizer)
            for method in w.rotated(["ckpt_nb", "torch"], r):
                if method == "ckpt_nb":
                    seconds, _ = w.timed(mgr.save, model, optimizer, metrics={"loss": loss})
                    ours.append(seconds)
                else:
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                    seconds, _ = w.timed(w.torch_save, state, baseline_file)
                    base.append(seconds)
    return ours, base


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,2000",
                        help="store sizes (checkpoints), comma-separated")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(w.machine_line())
    if not w.ckpt_nb_available():
        print("ckpt_nb does not import: nothing to measure")
        return 0
    warnings.simplefilter("ignore")  # (retention's own notes, not what is measured)
    ratios: dict[str, dict[int, float]] = {name: {} for name in CONFIGS}
    rows = []
    with w.scratch() as root:
        for size in sizes:
            template = root / f"store_{size}"
            build(template, size)
            for name, options in CONFIGS.items():
                store = root / f"copy_{size}"
                shutil.copytree(template, store)
                ours, base = measure(store, options, args.repeats, root / "torch.pt")
                ratio = w.paired_ratio(ours, base)
                ratios[name][size] = ratio
                rows.append([f"{size:,}", name, w.median(base), w.median(ours), ratio])
                shutil.rmtree(store)
    w.print_table(f"a save into a store of N checkpoints, median of {args.repeats}",
                  ["N", "retention", "torch.save s", "save s", "x save"], rows)
    smallest, largest = sizes[0], sizes[-1]
    for name, by_size in ratios.items():
        growth = by_size[largest] / by_size[smallest]
        print(f"  target {name}: save time grows at most 1.5x from {smallest:,} to "
              f"{largest:,} checkpoints: {growth:.2f}x  {w.verdict(growth, 1.5)}")
    print(f"\nat the end: {w.machine_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
