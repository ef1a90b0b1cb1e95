"""Who writes a pack: the C kernels' writer thread, against the saving Python thread.

A durable save writes its pack with direct I/O, a 4 MiB stage at a time. Where
the C kernels were built, a native thread writes the stages while the pack's
Python thread fills the next ones; without them, that Python thread writes each
stage itself and, back from the disk, waits for the GIL before it can go on.
This script saves the same states both ways, side by side with torch.save+fsync
in one run (the order rotating each repeat), and prints each as a ratio to
torch.save, then the two ways' paired ratio:

- (a) a full save of MiniLM's weights, fp32 and bf16 (as in ``bench_full.py``), and of
  five copies of the fp32 weights, each scaled a little (454 MB): a larger model;
- (c) d1 of the fine-tune run, incremental (as in ``bench_incremental.py``).

Run: ``.venv/bin/python benchmarks/bench_writer.py [--repeats N]``
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import _workloads as w

WAYS = {"native thread": True, "python thread": False}  # name -> _native.writer


def compare(title: str, repeats: int, root: Path,
            torch_save: Callable[[Path], None],
            ours_save: Callable[[Path, int], None],
            between: Callable[[Path], None] = lambda _: None) -> None:
    """``ours_save(folder, repeat)`` with each way and ``torch_save(path)``, rotated;
    ``between(run_dir)`` prepares each repeat."""
    from ckpt_nb import _native

    times: dict[str, list[float]] = {m: [] for m in ("torch", *WAYS)}
    for r in range(repeats):
        run_dir = root / f"r{r}"
        run_dir.mkdir()
        between(run_dir)
        for m in w.rotated(list(times), r):
            if m == "torch":
                times[m].append(w.timed(torch_save, run_dir / "t.pt")[0])
                continue
            _native.writer = WAYS[m]
            try:
                times[m].append(w.timed(ours_save, run_dir / m.split()[0], r)[0])
            finally:
                _native.writer = True
        shutil.rmtree(run_dir)
    rows = [["torch.save+fsync", w.median(times["torch"]), 1.0]]
    rows += [[f"ckpt_nb, pack written by the {m}", w.median(times[m]),
              w.paired_ratio(times[m], times["torch"])] for m in WAYS]
    w.print_table(f"{title}, median of {repeats}", ["method", "save s", "x save"], rows)
    native, python = (times[m] for m in WAYS)
    print(f"  native thread / python thread, paired: {w.paired_ratio(native, python):.3f}x")


def full_part(repeats: int, root: Path) -> None:
    from ckpt_nb import CheckpointManager

    fp32 = w.minilm_weights(torch.float32)
    five = {f"{i}.{k}": (v * (1 + 0.01 * i)).contiguous()
            for i in range(5) for k, v in fp32.items()}
    for name, sd in (("fp32", fp32), ("bf16", w.minilm_weights(torch.bfloat16)),
                     ("fp32 x5", five)):
        holder = w.SDHolder(sd)

        def ours(folder: Path, r: int, holder: w.SDHolder = holder) -> None:
            with CheckpointManager(folder) as mgr:
                mgr.save(weights=holder, epoch=r)

        compare(f"(a) MiniLM {name}, {w.mb(w.state_bytes(sd))} MB, full save", repeats, root,
                lambda path, holder=holder: w.torch_save(holder.sd, path), ours)


def finetune_part(repeats: int, root: Path) -> None:
    from ckpt_nb import CheckpointManager

    model, opt, gen = w.finetune_setup()
    w.finetune_steps(model, opt, gen, 5)
    managers: dict[Path, CheckpointManager] = {}

    def d0(run_dir: Path) -> None:  # each way's d0, then the 20 steps that d1 saves
        for mgr in managers.values():
            mgr.close()
        managers.clear()
        for m in WAYS:
            folder = run_dir / m.split()[0]
            managers[folder] = CheckpointManager(folder, strategy="incremental")
            managers[folder].save(model, opt, epoch=0)
        w.finetune_steps(model, opt, gen, 20)

    def ours(folder: Path, r: int) -> None:
        managers[folder].save(model, opt, epoch=r + 1)

    def torch_save(path: Path) -> None:
        w.torch_save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)

    compare("(c) fine-tune d1, incremental", repeats, root, torch_save, ours, between=d0)
    for mgr in managers.values():
        mgr.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=12, help="repeats (default 12)")
    args = ap.parse_args()
    if not w.ckpt_nb_available():
        print("ckpt_nb does not import", file=sys.stderr)
        return 1
    from ckpt_nb import _native

    if not _native.writer:
        print("the C kernels were not built here (pip install -e .): nothing to compare",
              file=sys.stderr)
        return 1
    print(f"{w.machine_line()}; repeats {args.repeats}")
    with w.scratch() as root:
        full_part(args.repeats, root)
        finetune_part(args.repeats, root)
    print(f"\nat the end: {w.machine_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
