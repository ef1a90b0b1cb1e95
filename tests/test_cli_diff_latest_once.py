"""``ckpt-nb diff`` verifies the checkpoint "latest" names once, whichever sides name it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager
import warm_python  # (fresh interpreters forked from a warm one)

# The CLI in a fresh interpreter that counts the packs it opens (Python's audit hook sees
# every open), said as the last line of stderr.
COUNTING = """
import sys
from ckpt_nb.cli import main
opened = []
sys.addaudithook(lambda event, args: opened.append(args[0]) if event == "open"
                 and str(args[0]).endswith(".pack") else None)
code = main(sys.argv[1:])
print(f"packs opened: {len(opened)}", file=sys.stderr)
sys.exit(code)
"""


def packs_opened(*argv: object) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    done = warm_python.run([sys.executable, "-c", COUNTING, *map(str, argv)], env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("packs opened: "), done.stderr
    return int(last.removeprefix("packs opened: "))


@pytest.mark.parametrize(("a", "b", "ids_of"), [("-1", "latest", (1, 2)), ("-2", "-1", (0, 1))])
def test_diff_verifies_latest_once_where_both_sides_count_from_it(
        tmp_path: Path, a: str, b: str, ids_of: tuple[int, int]) -> None:
    """``diff DIR -1 latest`` verified the newest checkpoint once for each side."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    with CheckpointManager(tmp_path) as mgr:
        ids = []
        for step in range(3):
            with torch.no_grad():
                model.weight += 1
            ids.append(mgr.save(model, step=step, strategy="full"))
    verify_latest = packs_opened("verify", tmp_path, "latest")
    by_ids = packs_opened("diff", tmp_path, *(ids[i] for i in ids_of))
    assert verify_latest > 0 and by_ids > 0
    assert packs_opened("diff", tmp_path, a, b) == by_ids + verify_latest
