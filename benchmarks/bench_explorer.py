"""How fast the explorer opens and draws on a store of hundreds of checkpoints.

Builds a store of ~300 checkpoints of a small MLP trained on scikit-learn's
digits (incremental saves with loss and accuracy, two rollbacks that start two
more branches), then times, median over repeats:

- the baseline: opening the store and reading its catalog (``CheckpointManager(d).list()``),
  which is the least any view of the store has to do;
- ``explore(d)``: opening the app (table, DAG view, no plot: plots render lazily);
- switching to the Metrics tab (two PNGs) and to the Diff tab (a diff of two
  checkpoints, its PNG and table), and ``refresh()``;
- each plot function on the directory (store opened inside), as a Figure and
  rendered to PNG.

Target: ``explore()`` opens in under a second. Run:
``.venv/bin/python benchmarks/bench_explorer.py [--quick] [--repeats N] [--checkpoints N]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import _workloads as w

OPEN_TARGET_S = 1.0


def build_store(path: Path, n: int) -> list[str]:
    """``n`` checkpoints of a digits MLP; at a third and two thirds of the way, roll
    back 20 checkpoints and go on from there (a new branch)."""
    import numpy as np
    from sklearn.datasets import load_digits

    import ckpt_nb

    torch.manual_seed(0)
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    ids: list[str] = []
    with ckpt_nb.CheckpointManager(path, strategy="incremental", metric="loss") as mgr:
        for k in range(n):
            if k in (n // 3, 2 * n // 3):
                mgr.restore(ids[-20], model=model, optimizer=opt)
            idx = torch.as_tensor(rng.integers(0, len(x), 128))
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            with torch.no_grad():
                acc = float((model(x).argmax(1) == y).float().mean())
            ids.append(mgr.save(model, opt, k // 10, step=k,
                                metrics={"loss": loss.item(), "acc": acc}))
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, 100 checkpoints")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--checkpoints", type=int, default=300)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    n = 100 if args.quick else args.checkpoints
    print(w.machine_line())
    if not w.ckpt_nb_available():
        print("ckpt_nb does not import: nothing to measure")
        return 1
    import ckpt_nb
    from ckpt_nb import _plots

    with w.scratch() as root:
        store = root / "store"
        build_s, ids = w.timed(build_store, store, n)
        frame = ckpt_nb.CheckpointManager(store).list()
        print(f"store: {len(frame)} checkpoints on {frame['branch'].nunique()} branches, "
              f"built in {build_s:.1f} s")
        a, b = ids[n // 2], ids[-1]

        def list_catalog() -> None:
            with ckpt_nb.CheckpointManager(store) as mgr:
                mgr.list()

        def tab(ui: ckpt_nb.Explorer, index: int) -> None:
            ui.tabs.selected_index = 0
            ui.tabs.selected_index = index

        times: dict[str, list[float]] = {}

        def record(name: str, fn, *fn_args) -> object:  # noqa: ANN001 - any callable
            seconds, out = w.timed(fn, *fn_args)
            times.setdefault(name, []).append(seconds)
            return out

        w.timed(ckpt_nb.explore(store, poll_seconds=0).close)  # warm-up: imports, caches
        for _ in range(repeats):
            record("catalog list (baseline)", list_catalog)
            ui = record("explore() open", lambda: ckpt_nb.explore(store, poll_seconds=0))
            try:
                ui.select([a])
                record("Metrics tab (2 PNGs)", tab, ui, 1)
                ui.select([a, b])
                record("Diff tab (diff + PNG + table)", tab, ui, 3)
                record("refresh() on the Diff tab", ui.refresh)
            finally:
                ui.close()
            for name, make in (
                    ("plot_metrics", lambda: _plots.plot_metrics(store, "loss", selected=[a])),
                    ("plot_dag", lambda: _plots.plot_dag(store, current=b, selected=[a])),
                    ("plot_diff", lambda: _plots.plot_diff(store, a, b)),
                    ("plot_compare", lambda: _plots.plot_compare(store, [a, b]))):
                fig = record(f"{name} -> Figure", make)
                record(f"{name} -> PNG", _plots.to_png, fig)

        base = times["catalog list (baseline)"]
        rows = [(name, w.median(ts), f"{w.paired_ratio(ts, base):.1f}x")
                for name, ts in times.items()]
        w.print_table(f"{len(frame)} checkpoints, median of {repeats} (seconds, ratio to "
                      "catalog list)", ("what", "s", "ratio"), rows)
        opened = w.median(times["explore() open"])
        print(f"\nexplore() opens in {opened:.3f} s (target < {OPEN_TARGET_S:.1f} s): "
              f"{w.verdict(opened, OPEN_TARGET_S)}")
    print(w.machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
