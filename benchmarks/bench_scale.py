"""Memory and time of diff, verify and a .safetensors export, each against what a user
would otherwise run on torch.save files of the same states, side by side.

diff: two saves of a ``--mib`` MiB fp32 embedding of which 10 rows changed, against
torch.load of the two torch.save files and each tensor's change norms in float64; the
peak resident memory above the start of a fresh process, and the time. verify: a store
of N incremental saves of a 4 MiB Linear, ``full_every`` above N (one delta chain per
chunk), for each N in ``--chains``, against torch.load of the N torch.save files; the
time. export: a ``--mib`` MiB state exported to .safetensors and to .pt, against
torch.load of its torch.save file and safetensors' save_file / torch.save; the peak
above the start, each in a fresh process, ``--repeats`` times each way in turns (which
goes first alternates: the first to write into fresh memory of a VM pays for it), the
medians. Peaks include the pages of the files read (mapped packs; torch.load's mmap is
off). No targets.

Run: ``.venv/bin/python benchmarks/bench_scale.py [--mib M] [--chains 50,100,200]
[--repeats N]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

import _workloads as w

# Run in a fresh process: a diff or an export, its peak resident memory above its start
# (Linux's VmHWM, reset: a child's ru_maxrss starts at its parent's)
MEASURE = textwrap.dedent("""\
    import json, os, re, sys, time
    from ckpt_nb import CheckpointManager
    def status(field):
        with open("/proc/self/status") as status:
            return int(re.search(field + r":\\s+(\\d+)", status.read()).group(1)) / 1024
    import torch
    store, what, target = sys.argv[1:]
    mgr = CheckpointManager(store) if what in ("diff", "export") else None
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    start, t = status("VmRSS"), time.perf_counter()
    if what == "diff":
        mgr.diff("-1", "latest")
    elif what == "export":
        mgr.export("latest", target)
    elif what == "torch diff":  # (the user's own: both files loaded, norms in float64)
        a, b = (torch.load(f"{store}/{n}.pt", weights_only=True) for n in (0, 1))
        for name in a:
            x, y = a[name].double(), b[name].double()
            float((y - x).norm()), float(x.norm())
    else:  # torch export: the file loaded, written as the target's format
        state = torch.load(f"{store}/0.pt", weights_only=True)
        if target.endswith(".safetensors"):
            from safetensors.torch import save_file
            save_file(state, target)
        else:
            torch.save(state, target)
        with open(target, "rb+") as written:  # (fsync'd, as an export is)
            os.fsync(written.fileno())
    print(json.dumps({"mib": status("VmHWM") - start, "s": time.perf_counter() - t}))
""")


def measured(store: Path, what: str, target: str = "") -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", MEASURE, str(store), what, target],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=300, help="model size in MiB (default 300)")
    ap.add_argument("--chains", default="50,100,200",
                    help="saves in each verify store (default 50,100,200)")
    ap.add_argument("--repeats", type=int, default=4,
                    help="exports each way, in turns; medians (default 4)")
    args = ap.parse_args()
    if not w.ckpt_nb_available():
        print("ckpt_nb does not import", file=sys.stderr)
        return 1
    from ckpt_nb import CheckpointManager

    print(w.machine_line())
    print("x: ckpt_nb's figure over the user's own way with torch.save files, same run")
    torch.manual_seed(0)
    with w.scratch() as root:
        emb = torch.nn.Embedding(args.mib * 2**20 // (4 * 1024), 1024)
        mgr = CheckpointManager(root / "diff", strategy="incremental")
        (root / "files").mkdir()
        for epoch in (0, 1):
            mgr.save(emb, epoch=epoch)
            torch.save(emb.state_dict(), root / "files" / f"{epoch}.pt")
            with torch.no_grad():
                emb.weight[:10].add_(1.0)
        ours, theirs = measured(root / "diff", "diff"), measured(root / "files", "torch diff")
        print(f"diff, {args.mib} MiB, 10 rows changed: +{ours['mib']:.0f} MiB peak "
              f"({ours['mib'] / theirs['mib']:.2f}x torch.load of both and norms: "
              f"+{theirs['mib']:.0f} MiB), {ours['s']:.2f} s ({ours['s'] / theirs['s']:.2f}x)")
        del emb, mgr
        for n in (int(x) for x in args.chains.split(",")):
            model = torch.nn.Linear(1024, 1024)
            mgr = CheckpointManager(root / f"chain{n}", strategy="incremental",
                                    full_every=n + 1)
            files = root / f"files{n}"
            files.mkdir()
            for i in range(n):
                with torch.no_grad():
                    model.weight.add_(torch.randn_like(model.weight) * 1e-4)
                mgr.save(model, epoch=i)
                torch.save(model.state_dict(), files / f"{i}.pt")
            ours_s, report = w.timed(CheckpointManager(root / f"chain{n}").verify)
            theirs_s, _ = w.timed(lambda: [torch.load(p, weights_only=True)
                                           for p in sorted(files.iterdir())])
            print(f"verify, {n} chained saves: {ours_s:.2f} s ({ours_s / theirs_s:.2f}x "
                  f"torch.load of the {n} files: {theirs_s:.2f} s; ok={report.ok})")
        state = torch.nn.Module()
        for i in range(4):
            state.register_parameter(f"w{i}", torch.nn.Parameter(
                torch.randn(args.mib * 2**18 // 4096, 1024) * 0.02))
        CheckpointManager(root / "export").save(state, epoch=0)
        (root / "state").mkdir()
        torch.save(state.state_dict(), root / "state" / "0.pt")
        for suffix in (".safetensors", ".pt"):
            ways = {"ours": (root / "export", "export", str(root / f"out{suffix}")),
                    "theirs": (root / "state", "torch export", str(root / f"theirs{suffix}"))}
            runs: dict[str, list[dict[str, float]]] = {"ours": [], "theirs": []}
            for repeat in range(args.repeats):
                for way in (("ours", "theirs") if repeat % 2 == 0 else ("theirs", "ours")):
                    runs[way].append(measured(*ways[way]))
            ours, theirs = ({key: statistics.median(run[key] for run in runs[way])
                             for key in ("mib", "s")} for way in ("ours", "theirs"))
            print(f"export to {suffix}, {args.mib} MiB, median of {args.repeats}: "
                  f"+{ours['mib']:.0f} MiB peak "
                  f"({ours['mib'] / theirs['mib']:.2f}x torch.load + "
                  f"{'save_file' if suffix == '.safetensors' else 'torch.save'}: "
                  f"+{theirs['mib']:.0f} MiB), {ours['s']:.2f} s "
                  f"({ours['s'] / theirs['s']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
