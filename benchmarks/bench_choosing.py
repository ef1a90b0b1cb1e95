"""The choosing thread of an incremental save: what two changes to it bought, side by side.

A save's calling thread decides, chunk by chunk, how each changed chunk is stored
(plain or as a delta), and every batch waits for it. Two things there let the GIL
go and then waited for it behind the save's hashing, compressing and writing
threads, and now do not:

- the catalog rows of the delta bases, asked for a batch at a time, are now asked
  for once, for the storages that train, while the first batch hashes;
- weighing a delta against a plain blob on a 16 KiB sample (once per tensor, at a
  manager's first delta save and every 8th after) is one C call that keeps the GIL.

This script saves d1 of the fine-tune run (workload (c), as in
``bench_incremental.py``) both ways, side by side with torch.save+fsync in one run
(the order rotating each repeat), and prints each as a ratio to torch.save, then
the two ways' paired ratio. "as before" puts the two back: the first, up-front
look-up is skipped (the per-batch ones remain), and the weighing runs in the same
C code but lets the GIL go, as the C histogram call it replaced did (which then
also did a dozen NumPy calls: this understates what the change bought).

Run: ``.venv/bin/python benchmarks/bench_choosing.py [--repeats N]``
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _workloads as w

WAYS = ("as now", "as before")


@contextlib.contextmanager
def as_before() -> Iterator[None]:
    """The choosing thread as it was before the two changes (see the docstring)."""
    from ckpt_nb import _native
    from ckpt_nb._save_pipeline import SavePipeline

    released = ctypes.CDLL(str(_native.LIBRARY)).ckpt_estimated_length
    released.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t] * 2 + [ctypes.c_double]
    released.restype = ctypes.c_double
    look_up = SavePipeline._look_up_bases

    def per_batch_only(self: Any, digests: Any) -> None:
        if getattr(self, "skipped_the_first", False):
            look_up(self, digests)
        self.skipped_the_first = True  # run()'s first call is the up-front one

    held = _native._estimate
    _native._estimate = released
    SavePipeline._look_up_bases = per_batch_only  # type: ignore[method-assign]
    try:
        yield
    finally:
        _native._estimate = held
        SavePipeline._look_up_bases = look_up  # type: ignore[method-assign]


def finetune_part(repeats: int, root: Path) -> None:
    from ckpt_nb import CheckpointManager

    model, opt, gen = w.finetune_setup()
    w.finetune_steps(model, opt, gen, 5)
    times: dict[str, list[float]] = {m: [] for m in ("torch", *WAYS)}
    for r in range(repeats):
        run_dir = root / f"r{r}"
        managers = {m: CheckpointManager(run_dir / m.split()[1], strategy="incremental")
                    for m in WAYS}
        for mgr in managers.values():
            mgr.save(model, opt, epoch=0)  # d0, full
        w.finetune_steps(model, opt, gen, 20)
        for m in w.rotated(list(times), r):
            if m == "torch":
                state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
                times[m].append(w.timed(w.torch_save, state, run_dir / "d1.pt")[0])
                continue
            with as_before() if m == "as before" else contextlib.nullcontext():
                times[m].append(w.timed(managers[m].save, model, opt, epoch=1)[0])
        for mgr in managers.values():
            mgr.close()
        shutil.rmtree(run_dir)
    rows = [["torch.save+fsync", w.median(times["torch"]), 1.0]]
    rows += [[f"ckpt_nb incremental, choosing {m}", w.median(times[m]),
              w.paired_ratio(times[m], times["torch"])] for m in WAYS]
    w.print_table(f"(c) fine-tune d1, median of {repeats}", ["method", "save s", "x save"],
                  rows)
    now, before = (times[m] for m in WAYS)
    print(f"  as now / as before, paired: {w.paired_ratio(now, before):.3f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=16, help="repeats (default 16)")
    args = ap.parse_args()
    if not w.ckpt_nb_available():
        print("ckpt_nb does not import", file=sys.stderr)
        return 1
    from ckpt_nb import _native

    if _native._estimate is None:
        print("the C kernels were not built here (pip install -e .): nothing to compare",
              file=sys.stderr)
        return 1
    print(f"{w.machine_line()}; repeats {args.repeats}")
    with w.scratch() as root:
        finetune_part(args.repeats, root)
    print(f"\nat the end: {w.machine_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
