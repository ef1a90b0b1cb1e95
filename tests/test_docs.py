"""The README and the tutorials say what the code has: every public name, list()'s
columns, every command of the CLI, and a demo whose last line runs as printed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ckpt_nb import CheckpointManager, MemoryStore
from ckpt_nb.cli import _parser

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    """The README's section of that title, up to the next one."""
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_names_each_column_of_list() -> None:
    """Its comment on mgr.list() left out the note."""
    lines = section("Python API").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mgr.list()"))
    comment = lines[start].split("#", 1)[1]
    for line in lines[start + 1:]:
        if not line.lstrip().startswith("#"):
            break
        comment += line.split("#", 1)[1]
    with CheckpointManager(MemoryStore()) as mgr:
        columns = list(mgr.list().columns)
    missing = [column for column in columns if not re.search(rf"\b{column}\b", comment)
               and not (column.endswith("_bytes") and "stored/logical bytes" in comment)]
    assert missing == [], f"the README's list() comment leaves out {missing}"


def test_the_readme_and_the_storage_notebook_name_every_cli_command() -> None:
    """pin, unpin and rm were in neither the README's CLI block nor (unpin) the notebook."""
    commands = list(_parser()[1])
    block = section("CLI").split("```bash\n", 1)[1].split("```", 1)[0]
    assert [c for c in commands if f"ckpt-nb {c} " not in block] == []
    notebook = json.loads((ROOT / "notebooks" / "03-storage.ipynb").read_text())
    listing = next("".join(cell["source"]) for cell in notebook["cells"]
                   if cell["cell_type"] == "markdown"
                   and "".join(cell["source"]).startswith("## The command line"))
    assert [c for c in commands if f"`{c}`" not in listing] == []
