"""The README and the tutorials say what the code has: every public name, list()'s
columns, every command of the CLI, and a demo whose last line runs as printed."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import ckpt_nb
from ckpt_nb import CheckpointManager, MemoryStore
from ckpt_nb.cli import _parser

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def readme_code() -> str:
    """The README's code: its fenced blocks and its inline code spans."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", README, flags=re.M | re.S)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", README, flags=re.M | re.S)
    return "\n".join([*blocks, *re.findall(r"`([^`]+)`", prose)])


def section(title: str) -> str:
    """The README's section of that title, up to the next one."""
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_names_every_public_name_and_every_manager_method() -> None:
    """Fourteen names of __all__ and eight of CheckpointManager's methods (load, which an
    error message suggests, among them) were in no line of it."""
    code = readme_code()
    missing = [name for name in ckpt_nb.__all__ if not re.search(rf"\b{name}\b", code)]
    methods = [name for name, value in vars(CheckpointManager).items()
               if callable(value) and not name.startswith("_")]
    missing += [f"CheckpointManager.{name}()" for name in methods  # (not torch.load())
                if not re.search(rf"(?<![\w.]){name}\(|(mgr|CheckpointManager)\.{name}\b",
                                 code)]
    assert not missing, f"the README's code never names {missing}"


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


@pytest.mark.parametrize("venv_active", [False, True])
def test_the_demos_last_line_runs_as_printed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        venv_active: bool) -> None:
    """It said "Try: ckpt-nb ls runs/demo", which the README's one command, leaving the
    venv inactive, does not find: it names the venv's ckpt-nb by its path then."""
    from ckpt_nb import demo

    scripts = os.path.dirname(sys.executable)
    others = [p for p in os.environ["PATH"].split(os.pathsep)
              if p and os.path.realpath(p) != os.path.realpath(scripts)]
    monkeypatch.setenv("PATH", os.pathsep.join([scripts, *others] if venv_active else others))
    monkeypatch.chdir(tmp_path)
    assert demo.main(["runs/my demo"]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("Try: "), last
    ls, diff = (shlex.split(command) for command in last[len("Try: "):].split("    "))
    assert ls[0] == "ckpt-nb" if venv_active else os.path.isfile(ls[0]), ls
    assert ls[1:] == ["ls", "runs/my demo"] and diff[1:] == ["diff", "runs/my demo", "-1",
                                                            "latest"]
    for command in (ls, diff):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    assert "val_loss" in done.stdout or "model/" in done.stdout, done.stdout


def test_the_readme_python_api_block_runs_top_to_bottom(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It resolved "-1" with one checkpoint saved, annotated and exported the checkpoint it
    had deleted a line before, saved after close(), and diffed a and b, never defined. Run
    here as a script, given what it takes from a training loop (and the file it imports)."""
    import torch

    block = section("Python API").split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    torch.save({"model_state_dict": model.state_dict(), "epoch": 1}, "old.pt")
    events: list[str] = []
    given = {"model": model, "optimizer": optimizer,
             "sched": torch.optim.lr_scheduler.StepLR(optimizer, 1),
             "scaler": torch.amp.GradScaler("cpu"),
             "ema": torch.optim.swa_utils.AveragedModel(model),
             "epoch": 3, "hist": [0.5, 0.4], "fn": lambda event, cid: events.append(event)}
    exec(compile(block, "README.md, Python API", "exec"), given)  # noqa: S102 - our README
    assert events == ["save", "save", "delete"]
    with CheckpointManager("runs/exp1") as mgr:
        assert list(mgr.list()["note"]) == ["baseline", "imported from old.pt", ""]
    assert {p.name for p in tmp_path.iterdir()} == {
        "runs", "old.pt", "model.pt", "model.safetensors", "w.safetensors"}


def test_the_readme_resume_loop_goes_on_after_the_epoch_saved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python API showed no resume: ck.epoch after save(model, optimizer, epoch) at an
    epoch's end is the epoch finished, and a loop starting at ck.epoch ran it twice."""
    import torch

    block = section("Python API").split("```python\n")[2].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    with CheckpointManager("runs") as mgr:
        for epoch in range(3):  # (the run killed after its third epoch)
            mgr.save(model, optimizer, epoch, scheduler=sched)
        ran: list[int] = []
        given = {"mgr": mgr, "model": model, "optimizer": optimizer, "sched": sched,
                 "num_epochs": 5}
        exec(compile(block.replace("    ...", "    ran.append(epoch)"), "README.md", "exec"),
             {**given, "ran": ran})  # noqa: S102 - our README
    assert ran == [3, 4]
