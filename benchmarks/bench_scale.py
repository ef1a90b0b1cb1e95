"""Memory and time of diff, verify and a .safetensors export as a model or a store grows.

diff: two saves of a ``--mib`` MiB fp32 embedding of which 10 rows changed; the peak
resident memory above the start of a fresh process, and the time. verify: a store of
N incremental saves of a 4 MiB Linear, ``full_every`` above N (one delta chain per
chunk), for each N in ``--chains``; the time. export: a ``--mib`` MiB state exported to
.safetensors and to .pt; the peak above the start, each in a fresh process.
Peaks include the pages of the packs the store maps (about the state's size where it
compresses little). No targets.

Run: ``.venv/bin/python benchmarks/bench_scale.py [--mib M] [--chains 50,100,200]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

import _workloads as w

# Run in a fresh process: a diff or an export, its peak resident memory above its start
# (Linux's VmHWM, reset: a child's ru_maxrss starts at its parent's)
MEASURE = textwrap.dedent("""\
    import json, re, sys, time
    from ckpt_nb import CheckpointManager
    def status(field):
        with open("/proc/self/status") as status:
            return int(re.search(field + r":\\s+(\\d+)", status.read()).group(1)) / 1024
    store, what, target = sys.argv[1:]
    mgr = CheckpointManager(store)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    start, t = status("VmRSS"), time.perf_counter()
    if what == "diff":
        mgr.diff("-1", "latest")
    else:
        mgr.export("latest", target)
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
    args = ap.parse_args()
    if not w.ckpt_nb_available():
        print("ckpt_nb does not import", file=sys.stderr)
        return 1
    from ckpt_nb import CheckpointManager

    print(w.machine_line())
    torch.manual_seed(0)
    with w.scratch() as root:
        emb = torch.nn.Embedding(args.mib * 2**20 // (4 * 1024), 1024)
        mgr = CheckpointManager(root / "diff", strategy="incremental")
        mgr.save(emb, epoch=0)
        with torch.no_grad():
            emb.weight[:10].add_(1.0)
        mgr.save(emb, epoch=1)
        found = measured(root / "diff", "diff")
        print(f"diff, {args.mib} MiB, 10 rows changed: +{found['mib']:.0f} MiB peak, "
              f"{found['s']:.2f} s")
        del emb, mgr
        for n in (int(x) for x in args.chains.split(",")):
            model = torch.nn.Linear(1024, 1024)
            mgr = CheckpointManager(root / f"chain{n}", strategy="incremental",
                                    full_every=n + 1)
            for i in range(n):
                with torch.no_grad():
                    model.weight.add_(torch.randn_like(model.weight) * 1e-4)
                mgr.save(model, epoch=i)
            t = time.perf_counter()
            ok = CheckpointManager(root / f"chain{n}").verify().ok
            print(f"verify, {n} chained saves: {time.perf_counter() - t:.2f} s (ok={ok})")
        state = torch.nn.Module()
        for i in range(4):
            state.register_parameter(f"w{i}", torch.nn.Parameter(
                torch.randn(args.mib * 2**18 // 4096, 1024) * 0.02))
        CheckpointManager(root / "export").save(state, epoch=0)
        for suffix in (".safetensors", ".pt"):
            found = measured(root / "export", "export", str(root / f"out{suffix}"))
            print(f"export to {suffix}, {args.mib} MiB: +{found['mib']:.0f} MiB peak, "
                  f"{found['s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
