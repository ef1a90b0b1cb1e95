"""Consecutive checkpoints: what a second save costs, against torch.save of the same state.

Part 1, workload (c): a MiniLM-shaped model fine-tuning encoder layers 4-5
and a new head (AdamW). In a manager made with each strategy, save d0 (full:
a manager's first save is), train 20 steps, save d1; report the bytes d1 adds
to the store and d1's save time, as ratios to torch.save of the model and
optimizer state dicts, for strategy incremental, differential, and full
(content dedup only), and for reference incremental with ``codec="none"``
(what the save costs with no compression at all). Then train 20 more steps
and time d2, the save after, in the same managers (for reference: the
targets are set on d1).

Part 2: with 0%, 10% and 50% of MiniLM's tensors changed between two saves,
the incremental save's bytes and time against torch.save: both should grow
with the bytes that changed.

Part 3: the same small incremental save into stores whose catalogs hold 0,
100k and 300k other chunks: its time should not grow with the store.

Run: ``.venv/bin/python benchmarks/bench_incremental.py [--quick] [--baselines-only]``
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

import _workloads as w

STRATEGIES = ("incremental", "differential", "full")
# Part 1's managers, by the name its tables give them: (strategy, codec). The last, for
# reference, is d1 with no compression at all: what hashing, Python and the writes cost.
UNCOMPRESSED = "incremental codec=none"
METHODS = {s: (s, "zstd") for s in STRATEGIES} | {UNCOMPRESSED: ("incremental", "none")}
FRACTIONS = (0.0, 0.1, 0.5)
WARMUP_STEPS = 5
STEPS = 20


def fresh_dir(root: Path) -> Path:
    """A new empty directory under ``root``."""
    return Path(tempfile.mkdtemp(dir=root))


def verify_chain(store: Path, model: w.MiniLMFineTune, opt: torch.optim.Optimizer,
                 d0: w.StateDict, cid0: str, cid1: str) -> str:
    """Restore d1 then d0 into fresh objects and compare with what was saved."""
    from ckpt_nb import CheckpointManager

    m2 = copy.deepcopy(model)
    o2 = torch.optim.AdamW([p for p in m2.parameters() if p.requires_grad], lr=1e-4)
    mgr = CheckpointManager(store)
    out = []
    for cid, want in ((cid1, w.flat_tensors(model, opt)), (cid0, d0)):
        mgr.restore(cid, model=m2, optimizer=o2)
        got = w.flat_tensors(m2, o2)
        ok = got.keys() == want.keys() and all(torch.equal(got[k], v) for k, v in want.items())
        out.append("exact" if ok else "WRONG VALUES")
    return f"restore d1 {out[0]}, then d0 {out[1]}"


def listed_bytes(store: Path, cid: str) -> int:
    """stored_bytes of checkpoint ``cid``'s row in ``mgr.list()``."""
    from ckpt_nb import CheckpointManager

    df = CheckpointManager(store).list()
    return int(df.loc[df["id"] == cid, "stored_bytes"].iloc[0])


def finetune_part(repeats: int, root: Path, with_ours: bool) -> None:
    """Part 1: d1's added bytes and save time after 20 fine-tune steps."""
    model, opt, gen = w.finetune_setup()
    w.finetune_steps(model, opt, gen, WARMUP_STEPS)  # d0 already has optimizer state
    methods = ("torch",) + (tuple(METHODS) if with_ours else ())
    folder = {m: f"m{i}" for i, m in enumerate(METHODS)}
    save_t: dict[str, list[float]] = {m: [] for m in methods}
    cpu_t: dict[str, list[float]] = {m: [] for m in methods}
    save2_t: dict[str, list[float]] = {m: [] for m in methods}
    added: dict[str, list[int]] = {m: [] for m in methods}
    listed: dict[str, int] = {}
    verdicts: dict[str, str] = {}
    logical = w.state_bytes(w.flat_tensors(model, opt))

    for r in range(repeats):
        d = fresh_dir(root)
        mgrs, cid0 = {}, {}
        if with_ours:
            from ckpt_nb import CheckpointManager

            for m, (s, c) in METHODS.items():  # (a first save is full whatever the strategy)
                mgrs[m] = CheckpointManager(d / folder[m], strategy=s, codec=c)
                cid0[m] = mgrs[m].save(model, opt, epoch=r, strategy="full")
        before = {m: w.disk_bytes(d / folder[m]) for m in mgrs}
        d0 = {k: v.clone() for k, v in w.flat_tensors(model, opt).items()} \
            if r == repeats - 1 else {}
        w.finetune_steps(model, opt, gen, STEPS)
        for m in w.rotated(methods, r):
            if m == "torch":
                path = d / "d1.pt"
                state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
                t, cpu, _ = w.timed_cpu(w.torch_save, state, path)
                save_t[m].append(t)
                cpu_t[m].append(cpu)
                added[m].append(w.disk_bytes(path))
                continue
            t, cpu, cid1 = w.timed_cpu(mgrs[m].save, model, opt, epoch=r + 1,
                                       strategy=METHODS[m][0])
            save_t[m].append(t)
            cpu_t[m].append(cpu)
            added[m].append(w.disk_bytes(d / folder[m]) - before[m])
            if r == repeats - 1:
                listed[m] = listed_bytes(d / folder[m], cid1)
                verdicts[m] = verify_chain(d / folder[m], model, opt, d0, cid0[m], cid1)
        # d2, the save after: what a run of checkpoints costs once it is under way.
        w.finetune_steps(model, opt, gen, STEPS)
        for m in w.rotated(methods, r):
            if m == "torch":
                state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
                save2_t[m].append(w.timed(w.torch_save, state, d / "d2.pt")[0])
            else:
                save2_t[m].append(w.timed(mgrs[m].save, model, opt, epoch=r + 2,
                                          strategy=METHODS[m][0])[0])
        shutil.rmtree(d)

    rows = [
        [
            "torch.save" if m == "torch" else f"ckpt_nb {m}",
            w.mb(w.median(added[m])),
            w.median(added[m]) / w.median(added["torch"]),
            w.median(save_t[m]),
            w.paired_ratio(save_t[m], save_t["torch"]),
            w.median(cpu_t[m]),
        ]
        for m in methods
    ]
    w.print_table(
        f"(c) fine-tune d1 after {STEPS} steps: {w.mb(logical)} MB of tensors, median of {repeats}",
        ["method", "d1 adds MB", "x bytes", "save s", "x save", "cpu s"],
        rows,
    )
    print("bytes added = store size on disk after d1 minus after d0; torch.save = whole file; "
          "cpu s = the process's CPU time in the save, every thread")
    # The time ratio depends on the disk: torch.save waits for it, while d1, writing a
    # quarter of the bytes, waits on a fast disk for the processor instead.
    gbps = w.median(added["torch"]) / w.median(save_t["torch"]) / 1e9
    print(f"torch.save+fsync ran at {gbps:.2f} GB/s (the issue's targets were set where it ran "
          f"at about 1 GB/s)")
    w.print_table(
        f"(c) d2, {STEPS} steps after d1 (the same managers): median of {repeats}",
        ["method", "save s", "x save"],
        [["torch.save" if m == "torch" else f"ckpt_nb {m}", w.median(save2_t[m]),
          w.paired_ratio(save2_t[m], save2_t["torch"])] for m in methods],
    )
    if not with_ours:
        return
    for m in METHODS:
        print(f"ckpt_nb {m}: list() stored_bytes of d1 {w.mb(listed[m])} MB; {verdicts[m]}")
    m = "incremental"
    b = w.median(added[m]) / w.median(added["torch"])
    t = w.paired_ratio(save_t[m], save_t["torch"])
    print(f"  target d1 bytes <= 0.30x torch.save: {b:.3f}x  {w.verdict(b, 0.30)}")
    print(f"  target d1 save time <= 0.40x torch.save: {t:.3f}x  {w.verdict(t, 0.40)}")
    cores = os.cpu_count() or 1
    floor = w.median(cpu_t[m]) / cores / w.median(save_t["torch"])
    print(f"  (d1's CPU time spread over {cores} cores would take {floor:.3f}x torch.save: "
          f"its floor on this machine with the disk free)")
    bare = w.paired_ratio(save_t[UNCOMPRESSED], save_t["torch"])
    print(f"  (with no compression at all, d1 takes {bare:.3f}x torch.save: the part of its time "
          f"that no codec can take away)")
    if gbps < 0.8:
        print(f"  (torch.save ran at {gbps:.2f} GB/s, slower than the ~1 GB/s the target was set "
              f"at: where the disk is faster, this time ratio is higher)")


def changed_part(repeats: int, root: Path, with_ours: bool) -> None:
    """Part 2: incremental save cost against the fraction of tensors changed."""
    holder = w.SDHolder(w.minilm_weights())
    torch_t: dict[float, list[float]] = {f: [] for f in FRACTIONS}
    ours_t: dict[float, list[float]] = {f: [] for f in FRACTIONS}
    ours_b: dict[float, list[int]] = {f: [] for f in FRACTIONS}
    changed: dict[float, float] = {}
    torch_size = 0

    for r in range(repeats):
        for f in w.rotated(FRACTIONS, r):
            d = fresh_dir(root)
            if with_ours:
                from ckpt_nb import CheckpointManager

                mgr = CheckpointManager(d / "store")
                mgr.save(weights=holder, epoch=0, strategy="full")
                before = w.disk_bytes(d / "store")
            changed[f] = w.mutate_fraction(holder.sd, f, seed=r)
            order = ("torch", "ours") if r % 2 == 0 else ("ours", "torch")
            for m in order:
                if m == "torch":
                    torch_t[f].append(w.timed(w.torch_save, holder.sd, d / "s1.pt")[0])
                    torch_size = w.disk_bytes(d / "s1.pt")
                elif with_ours:
                    save = mgr.save
                    ours_t[f].append(w.timed(save, weights=holder, epoch=1,
                                             strategy="incremental")[0])
                    ours_b[f].append(w.disk_bytes(d / "store") - before)
            shutil.rmtree(d)

    rows = []
    for f in FRACTIONS:
        row: list[object] = [f"{f:.0%}", f"{changed[f]:.1%}", w.median(torch_t[f])]
        if with_ours:
            row += [
                w.mb(w.median(ours_b[f])),
                w.median(ours_b[f]) / torch_size,
                w.median(ours_t[f]),
                w.paired_ratio(ours_t[f], torch_t[f]),
            ]
        rows.append(row)
    header = ["tensors changed", "bytes changed", "torch.save s"]
    if with_ours:
        header += ["s1 adds MB", "x bytes", "save s", "x save"]
    w.print_table(
        f"incremental save vs fraction changed (MiniLM fp32, torch.save file "
        f"{w.mb(torch_size)} MB), median of {repeats}",
        header,
        rows,
    )
    if not with_ours:
        return
    for what, series in (("bytes", ours_b), ("save time", ours_t)):
        meds = [w.median(series[f]) for f in FRACTIONS]
        grows = all(a < b for a, b in zip(meds, meds[1:], strict=False))
        print(f"  target {what} grows with the fraction changed: "
              f"{'target met' if grows else 'MISSED'}")


STORE_CHUNKS = (0, 100_000, 300_000)


def store_size_part(repeats: int, root: Path) -> None:
    """Part 3: an incremental save's cost against how many chunks the store holds."""
    import sqlite3

    from ckpt_nb import CheckpointManager

    holder = w.SDHolder({"w": torch.randn(1 << 20), "b": torch.randn(1 << 12)})
    ours: dict[int, list[float]] = {n: [] for n in STORE_CHUNKS}
    base: dict[int, list[float]] = {n: [] for n in STORE_CHUNKS}
    for n in STORE_CHUNKS:
        d = fresh_dir(root)
        mgr = CheckpointManager(d / "store", strategy="incremental")
        mgr.save(weights=holder)
        # Rows as earlier checkpoints' chunks would leave them (a long run's store),
        # written straight into the catalog: making them for real would take hours.
        with sqlite3.connect(d / "store" / "catalog.sqlite") as db:
            db.executemany("INSERT INTO chunks VALUES (?, ?, 0, 1, 1, NULL, 0)",
                           ((os.urandom(32).hex(), "packs/other.pack") for _ in range(n)))
        for _ in range(repeats):
            holder.sd["w"].add_(1e-3)
            base[n].append(w.timed(w.torch_save, holder.sd, d / "s.pt")[0])
            ours[n].append(w.timed(mgr.save, weights=holder, strategy="incremental")[0])
        mgr.close()
        shutil.rmtree(d)
    w.print_table(
        f"incremental save of a changed 4 MiB tensor against the store's size, median of "
        f"{repeats}",
        ["chunks in the store", "torch.save s", "save s", "x save"],
        [[f"{n:,}", w.median(base[n]), w.median(ours[n]), w.paired_ratio(ours[n], base[n])]
         for n in STORE_CHUNKS])
    ratios = [w.paired_ratio(ours[n], base[n]) for n in STORE_CHUNKS]
    flat = ratios[-1] < 1.5 * ratios[0]
    print(f"  target save time does not grow with the store: "
          f"{'target met' if flat else 'MISSED'} ({ratios[-1] / ratios[0]:.2f}x)")


def main() -> int:
    """Parse arguments and run both parts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat")
    ap.add_argument("--repeats", type=int, default=None, help="repeats (default 5, 1 with --quick)")
    ap.add_argument("--baselines-only", action="store_true", help="skip ckpt_nb")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 5)
    with_ours = not args.baselines_only and w.ckpt_nb_available()
    if not args.baselines_only and not with_ours:
        print("ckpt_nb does not import; running baselines only", file=sys.stderr)
    print(f"{w.machine_line()}; repeats {repeats}")
    with w.scratch() as root:
        finetune_part(repeats, root, with_ours)
        changed_part(repeats, root, with_ours)
        if with_ours:
            store_size_part(repeats, root)
    print(f"\nat the end: {w.machine_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
