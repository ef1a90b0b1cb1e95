"""A long fine-tune run under retention: what the store holds and what a restore costs.

Workload (c), the MiniLM-shaped fine-tune, saved every ``--steps`` AdamW steps,
``--saves`` times, keeping the newest 3: by ckpt_nb with each strategy and no
``full_every`` (a manager per strategy), and by torch.save+fsync writing a file per
save and deleting the fourth newest (what a torch user keeps by hand). Printed:
the store's size on disk at the end and at its largest, as ratios to the three
torch.save files; each save's time as a ratio to torch.save's (paired per save,
median); and restoring the newest checkpoint into live objects at the end, as a
ratio to torch.load and copy_ (median of 5, warm).

Run: ``.venv/bin/python benchmarks/bench_retention.py [--saves N] [--steps K]``
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

import _workloads as w

STRATEGIES = ("full", "incremental", "differential")
KEEP = 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saves", type=int, default=40, help="saves in the run (default 40)")
    ap.add_argument("--steps", type=int, default=10, help="steps between saves (default 10)")
    args = ap.parse_args()
    if not w.ckpt_nb_available():
        print("ckpt_nb does not import", file=sys.stderr)
        return 1
    from ckpt_nb import CheckpointManager

    print(f"{w.machine_line()}; {args.saves} saves, {args.steps} steps apart, keep {KEEP}")
    model, opt, gen = w.finetune_setup()
    w.finetune_steps(model, opt, gen, 5)
    with w.scratch() as root:
        mgrs = {s: CheckpointManager(root / s, strategy=s, max_to_keep=KEEP) for s in STRATEGIES}
        files: list[Path] = []
        save_t: dict[str, list[float]] = {m: [] for m in ("torch", *STRATEGIES)}
        largest = {m: 0 for m in ("torch", *STRATEGIES)}
        for n in range(args.saves):
            w.finetune_steps(model, opt, gen, args.steps)
            for m in w.rotated(("torch", *STRATEGIES), n):
                if m == "torch":
                    files.append(root / f"torch-{n}.pt")
                    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
                    save_t[m].append(w.timed(w.torch_save, state, files[-1])[0])
                    if len(files) > KEEP:
                        files.pop(0).unlink()
                    size = sum(f.stat().st_size for f in files)
                else:
                    save_t[m].append(w.timed(mgrs[m].save, model, opt, epoch=n)[0])
                    size = w.disk_bytes(root / m)
                largest[m] = max(largest[m], size)
        final = {m: w.disk_bytes(root / m) for m in STRATEGIES}
        final["torch"] = sum(f.stat().st_size for f in files)

        target = copy.deepcopy(model)
        target_opt = torch.optim.AdamW([p for p in target.parameters() if p.requires_grad],
                                       lr=1e-4)
        target_opt.load_state_dict(opt.state_dict())
        flat = w.flat_tensors(target, target_opt)
        restore_t = {"torch": [w.timed(w.torch_load_into, files[-1], flat)[0]
                               for _ in range(5)]}
        for s in STRATEGIES:
            restore_t[s] = [w.timed(mgrs[s].restore, "latest", model=target,
                                    optimizer=target_opt)[0] for _ in range(5)]
            exact = all(torch.equal(a, b) for a, b in zip(
                w.flat_tensors(target, target_opt).values(), w.flat_tensors(model, opt).values()))
            if not exact:
                print(f"ckpt_nb {s}: the newest checkpoint restores WRONG VALUES")
            mgrs[s].close()
        rows = [["torch.save, 3 files" if m == "torch" else f"ckpt_nb {m}",
                 w.mb(final[m]), final[m] / final["torch"], largest[m] / largest["torch"],
                 w.paired_ratio(save_t[m], save_t["torch"]),
                 w.median(restore_t[m]) / w.median(restore_t["torch"])]
                for m in ("torch", *STRATEGIES)]
        w.print_table(f"(c) fine-tune under max_to_keep={KEEP}: the store after {args.saves} saves",
                      ["method", "store MB", "x store", "x largest", "x save", "x restore"],
                      rows)
        print("x store / x largest: the store on disk at the end / at its largest, against the "
              "three newest torch.save files; x save: each save against torch.save+fsync, "
              "median; x restore: the newest, into live objects, against torch.load + copy_")
    print(f"\nat the end: {w.machine_line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
