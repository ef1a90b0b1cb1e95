"""``ckpt-nb pin/unpin/rm`` with an alias (``-N``, ``latest``, ``best``) while another
process holds the store's lock and deletes: the alias is read under the lock, where the
command acts, not before it waited (it then named a checkpoint deleted meanwhile)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager
from test_cli import module_env
import warm_python  # (fresh interpreters forked from a warm one)

# Holds STORE's lock until a line comes on stdin, then deletes ID under it.
HOLDER = """
import sys
from ckpt_nb import CheckpointManager
mgr = CheckpointManager(sys.argv[1])
with mgr._exclusive():
    print("held", flush=True)
    sys.stdin.readline()
    mgr.delete(sys.argv[2], force=True)
"""


@pytest.mark.parametrize("command, done", [("pin", "pinned"), ("unpin", "unpinned"),
                                           ("rm", "deleted")])
def test_an_alias_names_the_checkpoint_it_names_once_the_lock_is_taken(
        tmp_path: Path, command: str, done: str) -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with CheckpointManager(tmp_path) as mgr:
        ids = [mgr.save(model, opt, step=step) for step in range(4)]
        if command == "unpin":
            for cid in ids:
                mgr.pin(cid)
        named_first = mgr.resolve("-2")
    env = module_env()
    holder = warm_python.Popen([sys.executable, "-c", HOLDER, str(tmp_path), named_first],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    cli = None
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        cli = warm_python.Popen([sys.executable, "-m", "ckpt_nb", command, str(tmp_path), "-2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
        assert cli.stderr is not None
        assert "waiting for" in cli.stderr.readline()  # (it read the store, and waits)
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.wait(timeout=120) == 0
        out, err = cli.communicate(timeout=120)
    finally:
        for proc in (holder, cli):
            if proc is not None:
                proc.kill()
                proc.wait(timeout=60)
    named_now = ids[ids.index(named_first) - 1]  # (-2 once named_first is deleted)
    assert (cli.returncode, out, err) == (0, f"{done} {named_now}\n", ""), (out, err)
    pinned = CheckpointManager(tmp_path).list().set_index("id")["pinned"]
    assert named_now not in pinned if command == "rm" else \
        pinned[named_now] == (command == "pin")
