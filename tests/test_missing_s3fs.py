"""An s3:// store where s3fs is not installed: the error names ckpt_nb's extra."""

from __future__ import annotations

import os
import sys
from pathlib import Path
import warm_python  # (fresh interpreters forked from a warm one)

# s3fs hidden from the interpreter (None in sys.modules: "import s3fs" fails), as on a
# machine without the extra; then the API's and the CLI's refusals, one a line.
HIDDEN = """
import sys
sys.modules["s3fs"] = None
import ckpt_nb
from ckpt_nb.cli import main
try:
    ckpt_nb.CheckpointManager("s3://bucket/runs")
except ImportError as exc:
    print(type(exc).__name__, isinstance(exc, ckpt_nb.CkptError), exc)
print("exit", main(["ls", "s3://bucket/runs"]))
"""


def test_an_s3_store_without_s3fs_names_the_extra_to_install() -> None:
    """fsspec's "Install s3fs to access S3" named no package to pip install: the
    README's is ``ckpt_nb[s3]``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    done = warm_python.run([sys.executable, "-c", HIDDEN], env=env, timeout=120)
    said = ("s3://bucket/runs needs s3fs, which could not be imported (import of s3fs "
            "halted; None in sys.modules): pip install \"ckpt_nb[s3]\"")
    assert done.stdout.splitlines() == [f"MissingDependencyError True {said}", "exit 1"]
    assert done.stderr == f"ckpt-nb: {said}\n"
