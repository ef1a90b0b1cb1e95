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
(``_ab.py``). "as before" puts the two back: the first, up-front
look-up is skipped (the per-batch ones remain), and the weighing runs in the same
C code but lets the GIL go, as the C histogram call it replaced did (which then
also did a dozen NumPy calls: this understates what the change bought).

Run: ``.venv/bin/python benchmarks/bench_choosing.py [--repeats N]``
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator
from typing import Any

import _ab


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


def ways() -> _ab.Ways | None:
    from ckpt_nb import _native

    if _native._estimate is None:
        return None
    return {"choosing as now": contextlib.nullcontext, "choosing as before": as_before}


if __name__ == "__main__":
    sys.exit(_ab.main(__doc__.splitlines()[0], 16, ways, [_ab.finetune_part]))
