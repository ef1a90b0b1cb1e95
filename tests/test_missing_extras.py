"""Without an extra's package, what needs it says what to pip install, as a
MissingDependencyError (a CkptError and an ImportError), as an s3:// store without s3fs
does: a .safetensors export or import without safetensors, the plots and the explorer
without the notebook extra."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from ckpt_nb import CheckpointManager
import warm_python  # (fresh interpreters forked from a warm one)

# Packages hidden from the interpreter (None in sys.modules: their import fails), as on a
# machine without the extra; then each refusal, one a line.
WITHOUT_SAFETENSORS = """
import sys
sys.modules["safetensors"] = sys.modules["safetensors.torch"] = None
import ckpt_nb
from ckpt_nb.cli import main
store, out, made = sys.argv[1:]
with ckpt_nb.CheckpointManager(store) as mgr:
    for call in (lambda: mgr.export("latest", out), lambda: mgr.import_file(made)):
        try:
            call()
        except ImportError as exc:
            print(type(exc).__name__, isinstance(exc, ckpt_nb.CkptError), exc)
print("exit", main(["export", store, "latest", out]))
"""

WITHOUT_MATPLOTLIB = """
import sys
sys.modules["matplotlib"] = None
import ckpt_nb
try:
    ckpt_nb.plot_metrics
except ImportError as exc:
    print(type(exc).__name__, isinstance(exc, ckpt_nb.CkptError), exc)
"""


def run(code: str, *argv: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    return warm_python.run([sys.executable, "-c", code, *map(str, argv)], env=env, timeout=120)


def test_safetensors_files_without_safetensors_name_the_export_extra(tmp_path: Path) -> None:
    """export() to, and import_file() of, a .safetensors path raised a bare
    ModuleNotFoundError ("import of safetensors.torch halted"), and ckpt-nb export said
    that alone: nothing named the package, or the extra that installs it."""
    store, made, out = tmp_path / "store", tmp_path / "made.safetensors", tmp_path / "x.safetensors"
    with CheckpointManager(store) as mgr:
        mgr.save(torch.nn.Linear(2, 2), rng=False)
        mgr.export("latest", made)
    done = run(WITHOUT_SAFETENSORS, store, out, made)
    halted = "halted; None in sys.modules): pip install \"ckpt_nb[export]\""
    assert done.stdout.splitlines() == [
        f"MissingDependencyError True {out} needs safetensors, which could not be imported "
        f"(import of safetensors {halted}",
        f"MissingDependencyError True {made} needs safetensors, which could not be imported "
        f"(import of safetensors {halted}",
        "exit 1"]
    assert done.stderr == (f"ckpt-nb: {out} needs safetensors, which could not be imported "
                           f"(import of safetensors {halted}\n")
    assert not out.exists()


def test_the_plots_without_matplotlib_name_the_notebook_extra() -> None:
    """A plain ImportError quoting 'ckpt_nb[notebook]' (single quotes, which Windows'
    cmd.exe passes on to pip), where s3 and export say MissingDependencyError and
    "ckpt_nb[s3]"."""
    done = run(WITHOUT_MATPLOTLIB)
    assert done.stdout == ("MissingDependencyError True ckpt_nb.plot_metrics needs the "
                           "notebook extra (import of matplotlib halted; None in "
                           "sys.modules): pip install \"ckpt_nb[notebook]\"\n"), done.stderr


# Each fsspec URL whose file system's package is not installed (hidden, as above): what
# fsspec says of it, which the error passes on.
FILE_SYSTEMS = {"gs://bucket/runs": "gcsfs", "az://container/runs": "adlfs",
                "abfs://container/runs": "adlfs", "sftp://host/runs": "paramiko"}
WITHOUT_FILE_SYSTEMS = f"""
import sys
for package in {sorted(set(FILE_SYSTEMS.values()))!r}:
    sys.modules[package] = None
import ckpt_nb
for url in {list(FILE_SYSTEMS)!r}:
    try:
        ckpt_nb.CheckpointManager(url)
    except ImportError as exc:
        print(type(exc).__name__, isinstance(exc, ckpt_nb.CkptError), exc)
"""


def test_the_readme_says_which_stores_need_a_package_and_they_do() -> None:
    """The README's error tree gave MissingDependencyError for s3fs alone; gs://, az://,
    abfs:// and sftp:// stores raise it too, in fsspec's words."""
    said = run(WITHOUT_FILE_SYSTEMS).stdout.splitlines()
    assert [line.split(" ", 3)[:3] for line in said] == [
        ["MissingDependencyError", "True", f"{url}:"] for url in FILE_SYSTEMS]
    assert all(package in line for line, package in zip(said, FILE_SYSTEMS.values()))
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    tree = readme.split("└── MissingDependencyError", 1)[1].split("```", 1)[0]
    entry = " ".join(tree.split())
    for url, package in FILE_SYSTEMS.items():
        protocol = url.split("//")[0] + "//"
        assert re.search(rf"{package} for [^(;]*{protocol}", entry), (protocol, entry)
