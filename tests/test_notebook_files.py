"""The tutorials' files hold what their cells print, not how a run of them went."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_no_cell_keeps_metadata_but_its_tags() -> None:
    """02-compare-and-rollback's diff-values cell kept the timestamps of the run that
    stored it (an editor's `execution` metadata): every refresh would change them."""
    kept = {(path.name, index): sorted(cell["metadata"])
            for path in NOTEBOOKS
            for index, cell in enumerate(json.loads(path.read_text())["cells"])
            if set(cell.get("metadata", {})) - {"tags"}}
    assert not kept


def refresh_command() -> list[str]:
    """The README's command that stores a notebook's new outputs, but the notebook."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"`\.venv/bin/(jupyter nbconvert [^`]*?)\s+notebooks/NAME\.ipynb`",
                      readme)
    assert found is not None, "the README's refresh command is not where it was"
    words = shlex.split(found.group(1))
    return [str(Path(sys.executable).parent / "jupyter"), *words[1:]]


def test_the_readmes_refresh_command_clears_what_a_cell_kept_but_its_tags(
        tmp_path: Path) -> None:
    """The README's command kept timings out of the cells it ran, but left those already
    there (the diff-values cell's), and a session's widget state in the notebook's
    metadata. Run here without --execute: what it leaves of the metadata, not the
    outputs, is what is tested."""
    notebook = json.loads(NOTEBOOKS[0].read_text())
    notebook["cells"][1]["metadata"] = {"execution": {"iopub.status.busy": "2026-01-01"},
                                        "tags": ["nbval-ignore-output"], "scrolled": True}
    kept = dict(notebook["metadata"])
    notebook["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {}, "version_major": 2, "version_minor": 0}}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    subprocess.run([w for w in refresh_command() if w != "--execute"] + [str(path)],
                   check=True, capture_output=True, timeout=300)
    refreshed = json.loads(path.read_text())
    assert refreshed["cells"][1]["metadata"] == {"tags": ["nbval-ignore-output"]}
    assert refreshed["metadata"] == kept  # (its kernel, its language)


def test_the_readmes_refresh_command_stores_a_cells_printed_lines_as_one_output(
        tmp_path: Path) -> None:
    """Lines a cell printed came as one output or several, as the kernel flushed them:
    a run stored other outputs than the last, with nothing changed."""
    code = "import time\nprint('a', flush=True)\ntime.sleep(0.5)\nprint('b', flush=True)"
    notebook = json.loads(NOTEBOOKS[0].read_text())
    notebook["cells"] = [{"cell_type": "code", "execution_count": None, "id": "printing",
                          "metadata": {}, "outputs": [], "source": code}]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    subprocess.run([*refresh_command(), str(path)], check=True, capture_output=True,
                   timeout=300, cwd=tmp_path)
    (cell,) = json.loads(path.read_text())["cells"]
    assert cell["outputs"] == [{"name": "stdout", "output_type": "stream",
                                "text": ["a\n", "b\n"]}]


def test_the_storage_tutorial_gives_sizes_against_torch_save_as_the_readme_does() -> None:
    """03-storage's "vs torch.save" was torch.save's size over ckpt_nb's (1.26: higher is
    smaller), the README's benchmarks ckpt_nb's over torch.save's (0.826: lower is)."""
    notebook = json.loads((ROOT / "notebooks" / "03-storage.ipynb").read_text())
    (cell,) = [c for c in notebook["cells"] if "torch.save x 6" in "".join(c["source"])]
    (shown,) = [o["data"]["text/plain"] for o in cell["outputs"] if "data" in o]
    header, *rows = "".join(shown).splitlines()
    assert header.split() == ["stored", "MiB", "÷", "torch.save"]
    sizes = {row.rsplit(None, 2)[0]: (float(row.split()[-2]), float(row.split()[-1]))
             for row in rows}
    baseline = sizes.pop("torch.save x 6")[0]
    # (each shown to 2 decimals: the ratio of the shown sizes may differ by 0.01)
    assert len(sizes) == 4 and all(abs(ratio - stored / baseline) < 0.011 and ratio < 1
                                   for stored, ratio in sizes.values())
