"""What a restore or load leaves referenced holds memory in proportion to itself, not to
the checkpoint: the decoded storages of one owner (an object, a value of ``extra``, a
notebook variable a session saved) are one allocation apart from the others'."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

BIG_MIB = 256

_SCRIPT = textwrap.dedent("""\
    import gc, json, sys
    import numpy as np, torch
    from ckpt_nb import CheckpointManager
    from ckpt_nb._session import RUN_KEY

    def rss():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) / 1024 for line in status
                        if line.startswith("VmRSS"))

    store, big_mib = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    big = np.random.default_rng(0).random(big_mib << 17)
    with CheckpointManager(store) as mgr:
        # (as a session saves notebook variables: in its run record, all under one key)
        variables = {"big": big, "xb": torch.ones(64, 64)}
        mgr.save(model, opt, extra={"small": torch.ones(64, 64), RUN_KEY: {"variables": variables}})
    del big, variables
    gc.collect()
    grown = {}
    before = rss()
    with CheckpointManager(store) as mgr:
        ck = mgr.restore("latest", model=model, optimizer=opt)
    del ck
    gc.collect()
    grown["restore"] = rss() - before  # (the optimizer holds its restored state)
    before = rss()
    with CheckpointManager(store) as mgr:
        extra = mgr.load("latest").extra
        small, xb = extra["small"], extra[RUN_KEY]["variables"]["xb"]
    del extra
    gc.collect()
    grown["load"] = rss() - before  # (``small`` and ``xb`` hold their own 16 KiB each)
    assert small.shape == xb.shape == (64, 64)
    print(json.dumps(grown))
""")


def test_state_kept_after_a_restore_holds_no_other_values_memory(tmp_path: Path) -> None:
    """The optimizer keeps the 0.3 MiB of state a restore gives it, and a value of
    ``extra`` and a notebook variable are kept from a load: decoded into one allocation
    with a 256 MiB notebook variable, each held all of it for as long as it lived."""
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path / "store"), str(BIG_MIB)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    grown = json.loads(done.stdout)
    assert grown["restore"] < BIG_MIB / 4 and grown["load"] < BIG_MIB / 4, grown
