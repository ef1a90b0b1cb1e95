"""Two ways of running ckpt_nb, side by side with torch.save+fsync in one run.

``bench_writer.py`` and ``bench_choosing.py`` each name two ways (a context
manager that sets ckpt_nb up one way) and run some of these parts:

- (a) a full save of MiniLM's weights, fp32 and bf16 (as in ``bench_full.py``), and of
  five copies of the fp32 weights, each scaled a little (454 MB): a larger model;
- (b) a full save of the digits MLP and its AdamW state (as in ``bench_full.py``);
- (c) d1 of the fine-tune run, incremental (as in ``bench_incremental.py``).

Each repeat saves the same state every way and with torch.save, the order
rotating; each way is printed as a ratio to torch.save (paired per repeat), with
its store's size on disk after the save, then the first way against the second.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

import _workloads as w

Ways = Mapping[str, Callable[[], contextlib.AbstractContextManager[object]]]
Part = Callable[[Ways, int, Path], None]


def main(description: str, default_repeats: int, ways: Callable[[], Ways | None],
         parts: Sequence[Part]) -> int:
    """A script's whole run: ``--repeats``, then each of ``parts`` with the two ways
    ``ways()`` gives (None where the C kernels were not built)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--repeats", type=int, default=default_repeats,
                    help=f"repeats (default {default_repeats})")
    args = ap.parse_args()
    if not w.ckpt_nb_available():
        print("ckpt_nb does not import", file=sys.stderr)
        return 1
    chosen = ways()
    if chosen is None:
        print("the C kernels were not built here (pip install -e .): nothing to compare",
              file=sys.stderr)
        return 1
    print(f"{w.machine_line()}; repeats {args.repeats}")
    with w.scratch() as root:
        for part in parts:
            part(chosen, args.repeats, root)
    print(f"\nat the end: {w.machine_line()}")
    return 0


def folder_of(run_dir: Path, way: str) -> Path:
    return run_dir / way.replace(" ", "-")


def compare(title: str, ways: Ways, repeats: int, root: Path,
            torch_save: Callable[[Path], None],
            ours_save: Callable[[Path, int], None],
            between: Callable[[Path], None] = lambda _: None) -> None:
    """``ours_save(folder, repeat)`` each way and ``torch_save(path)``, rotated;
    ``between(run_dir)`` prepares each repeat."""
    times: dict[str, list[float]] = {m: [] for m in ("torch", *ways)}
    sizes: dict[str, list[int]] = {m: [] for m in ways}
    for r in range(repeats):
        run_dir = root / f"r{r}"
        run_dir.mkdir()
        between(run_dir)
        for m in w.rotated(list(times), r):
            if m == "torch":
                times[m].append(w.timed(torch_save, run_dir / "t.pt")[0])
                continue
            with ways[m]():
                times[m].append(w.timed(ours_save, folder_of(run_dir, m), r)[0])
            sizes[m].append(w.disk_bytes(folder_of(run_dir, m)))
        shutil.rmtree(run_dir)
    rows: list[list[object]] = [["torch.save+fsync", w.median(times["torch"]), 1.0, ""]]
    rows += [[f"ckpt_nb, {m}", w.median(times[m]), w.paired_ratio(times[m], times["torch"]),
              w.mb(w.median(sizes[m]))] for m in ways]
    w.print_table(f"{title}, median of {repeats}", ["method", "save s", "x save", "store MB"],
                  rows)
    first, second = list(ways)
    print(f"  {first} / {second}, paired: "
          f"{w.paired_ratio(times[first], times[second]):.3f}x")


def full_part(ways: Ways, repeats: int, root: Path) -> None:
    """(a) and (b): full saves."""
    from ckpt_nb import CheckpointManager

    fp32 = w.minilm_weights(torch.float32)
    states = {"MiniLM fp32": fp32, "MiniLM bf16": w.minilm_weights(torch.bfloat16),
              "MiniLM fp32 x5": {f"{i}.{k}": (v * (1 + 0.01 * i)).contiguous()
                                 for i in range(5) for k, v in fp32.items()}}
    mlp, opt = w.digits_mlp()
    states["digits MLP + AdamW"] = w.flat_tensors(mlp, opt)
    for name, sd in states.items():
        holder = w.SDHolder(sd)

        def ours(folder: Path, r: int, holder: w.SDHolder = holder) -> None:
            with CheckpointManager(folder) as mgr:
                mgr.save(weights=holder, epoch=r)

        compare(f"{name}, {w.mb(w.state_bytes(sd))} MB, full save", ways, repeats, root,
                lambda path, holder=holder: w.torch_save(holder.sd, path), ours)


def finetune_part(ways: Ways, repeats: int, root: Path) -> None:
    """(c): d1 of the fine-tune run, each way in a manager of its own."""
    from ckpt_nb import CheckpointManager

    model, opt, gen = w.finetune_setup()
    w.finetune_steps(model, opt, gen, 5)
    managers: dict[Path, CheckpointManager] = {}

    def d0(run_dir: Path) -> None:  # each way's d0, then the 20 steps that d1 saves
        for mgr in managers.values():
            mgr.close()
        managers.clear()
        for m, way in ways.items():
            folder = folder_of(run_dir, m)
            managers[folder] = CheckpointManager(folder, strategy="incremental")
            with way():
                managers[folder].save(model, opt, epoch=0)
        w.finetune_steps(model, opt, gen, 20)

    def ours(folder: Path, r: int) -> None:
        managers[folder].save(model, opt, epoch=r + 1)

    def torch_save(path: Path) -> None:
        w.torch_save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)

    compare("(c) fine-tune d1, incremental (store MB: d0 and d1)", ways, repeats, root,
            torch_save, ours, between=d0)
    for mgr in managers.values():
        mgr.close()


@contextlib.contextmanager
def attribute(owner: object, name: str, value: object) -> Iterator[None]:
    """``owner.name`` set to ``value`` for the while."""
    held = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, held)
