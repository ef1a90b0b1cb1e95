"""Full checkpoints: ckpt_nb against torch.save/torch.load and safetensors.

Workloads: (a) MiniLM weights fp32, (a) the same in bf16, (b) an 8.5M-param
MLP with its AdamW state. For each method, every save goes to a fresh
directory (so ckpt_nb's dedup never sees an earlier repeat), methods run
interleaved in a rotating order, and each figure is the median over repeats
of the ratio to torch.save / torch.load measured in the same repeat.

Run: ``.venv/bin/python benchmarks/bench_full.py [--quick] [--baselines-only]``
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

import _workloads as w

BASELINES = ("torch", "safetensors")
OURS = ("ckpt_nb zstd", "ckpt_nb none")
LABELS = {
    "torch": "torch.save / torch.load",
    "safetensors": "safetensors save_file / load_file+copy_",
    "ckpt_nb zstd": "ckpt_nb codec=zstd",
    "ckpt_nb none": "ckpt_nb codec=none",
}


@dataclass
class Workload:
    """One state to checkpoint, in the form each method takes it."""

    name: str
    torch_obj: Callable[[], object]  # what torch.save writes
    flat: w.StateDict  # live tensors for safetensors (restored into in place)
    statefuls: dict[str, object]  # keyword arguments to mgr.save / mgr.restore
    verify: Callable[[Path, str], bool]  # restores a checkpoint into fresh objects, compares
    stored_target: float | None  # None: the issue sets none (a model with its optimizer)
    restore_target: float
    logical: int = field(init=False)

    def __post_init__(self) -> None:
        self.logical = w.state_bytes(self.flat)


@dataclass
class Artifact:
    """Where one method's checkpoint lies: a file or a store, and its id."""

    dir: Path
    path: Path
    cid: str | None = None


def weights_workload(name: str, dtype: torch.dtype, stored: float, restore: float) -> Workload:
    """Workload (a): MiniLM weights in ``dtype``, saved through an SDHolder."""
    holder = w.SDHolder(w.minilm_weights(dtype))

    def verify(store: Path, cid: str) -> bool:
        from ckpt_nb import CheckpointManager

        fresh = w.SDHolder({k: torch.zeros_like(v) for k, v in holder.sd.items()})
        CheckpointManager(store).restore(cid, weights=fresh)
        return all(torch.equal(fresh.sd[k], v) for k, v in holder.sd.items())

    return Workload(name, lambda: holder.sd, holder.sd, {"weights": holder}, verify, stored,
                    restore)


def mlp_workload(steps: int) -> Workload:
    """Workload (b): the digits MLP and its AdamW, saved as model + optimizer."""
    model, opt = w.digits_mlp(steps)

    def verify(store: Path, cid: str) -> bool:
        from ckpt_nb import CheckpointManager

        m2 = copy.deepcopy(model)
        with torch.no_grad():
            for p in m2.parameters():
                p.zero_()
        o2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)
        CheckpointManager(store).restore(cid, model=m2, optimizer=o2)
        want, got = w.flat_tensors(model, opt), w.flat_tensors(m2, o2)
        return want.keys() == got.keys() and all(torch.equal(got[k], v) for k, v in want.items())

    return Workload(
        "(b) digits MLP + AdamW",
        lambda: {"model": model.state_dict(), "optimizer": opt.state_dict()},
        w.flat_tensors(model, opt),
        {"model": model, "optimizer": opt},
        verify,
        None,  # the 0.83x is for weights: Adam's moments compress less
        1.5,
    )


def save_once(method: str, wl: Workload, root: Path) -> tuple[float, Artifact]:
    """Save ``wl`` with ``method`` into a fresh directory under ``root``; returns seconds."""
    d = Path(tempfile.mkdtemp(dir=root))
    if method == "torch":
        art = Artifact(d, d / "ckpt.pt")
        return w.timed(lambda: w.torch_save(wl.torch_obj(), art.path))[0], art
    if method == "safetensors":
        art = Artifact(d, d / "ckpt.safetensors")
        return w.timed(w.st_save, wl.flat, art.path)[0], art
    from ckpt_nb import CheckpointManager

    mgr = CheckpointManager(d / "store", codec=method.split()[1])
    t, cid = w.timed(mgr.save, epoch=0, **wl.statefuls)
    return t, Artifact(d, d / "store", cid)


def restore_once(method: str, wl: Workload, art: Artifact) -> float:
    """Restore ``art`` with ``method``; returns seconds."""
    if method == "torch":
        return w.timed(w.torch_load, art.path)[0]
    if method == "safetensors":
        return w.timed(w.st_load_into, art.path, wl.flat)[0]
    from ckpt_nb import CheckpointManager

    return w.timed(lambda: CheckpointManager(art.path).restore(art.cid, **wl.statefuls))[0]


def listed_bytes(art: Artifact) -> int:
    """stored_bytes of the checkpoint's row in ``mgr.list()``."""
    from ckpt_nb import CheckpointManager

    df = CheckpointManager(art.path).list()
    return int(df.loc[df["id"] == art.cid, "stored_bytes"].iloc[0])


def run(wl: Workload, methods: tuple[str, ...], repeats: int, root: Path) -> None:
    """Benchmark one workload and print its table and targets."""
    save_t: dict[str, list[float]] = {m: [] for m in methods}
    warm_t: dict[str, list[float]] = {m: [] for m in methods}
    cold_t: dict[str, list[float]] = {m: [] for m in methods}
    into_t: list[float] = []  # torch.load + copy_ into the live tensors, warm
    last: dict[str, Artifact] = {}
    for m in methods:  # warm-up: lazy imports, allocator, first-touch of the files
        _, art = save_once(m, wl, root)
        restore_once(m, wl, art)
        shutil.rmtree(art.dir)
    for r in range(repeats):
        for m in w.rotated(methods, r):
            t, art = save_once(m, wl, root)
            save_t[m].append(t)
            if m in last:
                shutil.rmtree(last[m].dir)
            last[m] = art
        for m in w.rotated(methods, r):
            w.drop_cache(last[m].path)
            cold_t[m].append(restore_once(m, wl, last[m]))
            warm_t[m].append(restore_once(m, wl, last[m]))
            if m == "torch":
                into_t.append(w.timed(w.torch_load_into, last[m].path, wl.flat)[0])

    base = "torch"
    sizes = {m: w.disk_bytes(last[m].path) for m in methods}
    rows = []
    for m in methods:
        rows.append([
            LABELS[m],
            w.mb(sizes[m]),
            sizes[m] / sizes[base],
            w.median(save_t[m]),
            w.paired_ratio(save_t[m], save_t[base]),
            f"{wl.logical / w.median(save_t[m]) / 1e6:.0f}",
            w.median(warm_t[m]),
            w.paired_ratio(warm_t[m], warm_t[base]),
            w.median(cold_t[m]),
            w.paired_ratio(cold_t[m], cold_t[base]),
        ])
    w.print_table(
        f"{wl.name}: {w.mb(wl.logical)} MB of tensors, median of {repeats}",
        ["method", "disk MB", "x size", "save s", "x save", "save MB/s",
         "warm s", "x warm", "cold s", "x cold"],
        rows,
    )
    print("ratios (x) are vs torch.save file size / torch.save+fsync / "
          "torch.load(weights_only=True)")

    if "ckpt_nb zstd" not in methods:
        return
    for m in OURS:
        ok = wl.verify(last[m].path, last[m].cid)
        print(f"{LABELS[m]}: restore round trip {'exact' if ok else 'WRONG VALUES'}; "
              f"list() stored_bytes {w.mb(listed_bytes(last[m]))} MB")
    m = "ckpt_nb zstd"
    checks = [
        ("stored", sizes[m] / sizes[base], wl.stored_target),
        ("save time", w.paired_ratio(save_t[m], save_t[base]), 1.25),
        ("restore warm", w.paired_ratio(warm_t[m], warm_t[base]), wl.restore_target),
        ("restore cold", w.paired_ratio(cold_t[m], cold_t[base]), wl.restore_target),
    ]
    for what, value, limit in checks:
        if limit is None:
            print(f"  ({what} {value:.3f}x torch: no target, the issue's 0.83x is for weights "
                  "and this holds Adam's moments too)")
            continue
        print(f"  target {what} <= {limit:.2f}x torch: {value:.3f}x  {w.verdict(value, limit)}")
    print(f"  (for reference: a warm restore in place vs torch.load + copy_ into the live "
          f"tensors, {w.median(into_t):.3f} s: {w.paired_ratio(warm_t[m], into_t):.3f}x)")


def main() -> int:
    """Parse arguments and run every workload."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat, short MLP training")
    ap.add_argument("--repeats", type=int, default=None, help="repeats (default 5, 1 with --quick)")
    ap.add_argument("--baselines-only", action="store_true", help="skip ckpt_nb")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 5)
    methods = BASELINES
    if not args.baselines_only:
        if not w.ckpt_nb_available():
            print("ckpt_nb does not import; running baselines only", file=sys.stderr)
        else:
            methods = BASELINES + OURS
    print(f"{w.machine_line()}; repeats {repeats}")

    workloads = [
        lambda: weights_workload("(a) MiniLM fp32", torch.float32, 0.83, 1.5),
        lambda: weights_workload("(a) MiniLM bf16", torch.bfloat16, 0.69, 2.0),
        lambda: mlp_workload(20 if args.quick else 300),
    ]
    with w.scratch() as root:
        for make in workloads:
            run(make(), methods, repeats, root)
    print(f"\nat the end: {w.machine_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
