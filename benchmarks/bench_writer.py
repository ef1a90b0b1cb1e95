"""Who writes a pack: the C kernels' writer thread, against the saving Python thread.

A durable save writes its pack with direct I/O, a 4 MiB stage at a time. Where
the C kernels were built, a native thread writes the stages while the pack's
Python thread fills the next ones; without them, that Python thread writes each
stage itself and, back from the disk, waits for the GIL before it can go on.
This script saves the same states both ways, side by side with torch.save+fsync
in one run (``_ab.py``: full saves of MiniLM fp32, bf16 and five copies of fp32,
454 MB, and of the digits MLP with AdamW; d1 of the fine-tune run).

Run: ``.venv/bin/python benchmarks/bench_writer.py [--repeats N]``
"""

from __future__ import annotations

import sys

import _ab


def ways() -> _ab.Ways | None:
    from ckpt_nb import _native

    if not _native.writer:
        return None
    return {"native thread": lambda: _ab.attribute(_native, "writer", True),
            "python thread": lambda: _ab.attribute(_native, "writer", False)}


if __name__ == "__main__":
    sys.exit(_ab.main(__doc__.splitlines()[0], 12, ways, [_ab.full_part, _ab.finetune_part]))
