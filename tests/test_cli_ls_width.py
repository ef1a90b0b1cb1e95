"""``ckpt-nb ls`` on a terminal fits its width (COLUMNS, as shutil reads it), leaving out
the least important columns first; piped, it prints every column. The real command, in
a real pseudo-terminal, on a real store (where a test tries many widths, its main() in
this process, on a real pseudo-terminal, as test_ls_fits_the_terminal... checks)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from ckpt_nb import CheckpointManager
from test_cli import module_env, on_terminal, on_terminal_here, run_module
import warm_python  # (fresh interpreters forked from a warm one)


def demo_like(directory: Path, note: str = "") -> list[str]:
    """Three incremental saves ranked by val_loss, with val_acc too, as the demo's store."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    with CheckpointManager(directory, metric="val_loss", strategy="incremental") as mgr:
        return [mgr.save(model, epoch=epoch, step=15 * epoch, note=note,
                         metrics={"val_loss": 1 / epoch, "val_acc": 0.8 + epoch / 100})
                for epoch in range(5, 8)]


def test_ls_fits_the_terminal_least_important_columns_first(tmp_path: Path) -> None:
    """The demo's store made lines of 136 columns on a terminal of 80, each wrapped in
    two. Piped, as a script reads it, the table stays whole."""
    ids = demo_like(tmp_path)
    every = on_terminal(200, "ls", tmp_path)
    assert every[0].split() == ["id", "parent", "branch", "created", "step", "epoch",
                                "batch_idx", "strategy", "stored", "logical", "marks",
                                "val_acc", "val_loss"]
    assert not any("to fit" in line for line in every)
    width = max(map(len, every[:4]))
    for columns, header, footer in (
            (width - 1, ["id", "parent", "branch", "created", "step", "epoch", "batch_idx",
                         "strategy", "stored", "marks", "val_acc", "val_loss"],
             [f"to fit {width - 1} columns, left out: logical (piped, as into `less -S`, ls "
              "shows every column whole)"]),
            (80, ["id", "branch", "created", "step", "epoch", "stored", "marks", "val_acc",
                  "val_loss"],
             ["to fit 80 columns, left out: logical, strategy, parent, batch_idx; shortened:",
              "created (piped, as into `less -S`, ls shows every column whole)"]),
            (40, ["id", "step", "epoch", "marks", "val_loss"],
             ["to fit 40 columns, left out: logical,", "strategy, parent, batch_idx, branch,",
              "stored, val_acc, created (piped, as into",
              "`less -S`, ls shows every column whole)"])):
        lines = on_terminal_here(columns, "ls", tmp_path)
        assert lines[0].split() == header, columns
        assert all(len(line) <= columns for line in lines), (columns, lines)
        assert lines[-len(footer):] == footer, lines
        # (each row's cells under their own headers: the best one is marked, its loss kept)
        best = lines[3].split()
        assert best[0] == ids[2] and best[-1] == "0.1429" and "best" in best
    at_80 = on_terminal(80, "ls", tmp_path)  # (a real process, as the ones above run)
    assert at_80 == on_terminal_here(80, "ls", tmp_path)
    shortened = at_80[1]
    assert re.search(r"  \d\d-\d\d \d\d:\d\d  ", shortened), shortened  # (MM-DD HH:MM)
    piped = run_module("ls", tmp_path)  # (COLUMNS set, as a shell that exports it sets it)
    piped_narrow = warm_python.run([sys.executable, "-m", "ckpt_nb", "ls", str(tmp_path)],
                                   timeout=120, env={**module_env(), "COLUMNS": "40"})
    assert piped_narrow.stdout == piped.stdout
    assert piped.stdout.splitlines()[0].split() == every[0].split()
    assert "to fit" not in piped.stdout


def test_a_narrow_terminal_cuts_the_note_to_the_room_left(tmp_path: Path) -> None:
    """A note takes what room the columns before it leave, down to 8 columns, then goes."""
    demo_like(tmp_path, note="a long note that says what this run tried " * 3)
    whole = on_terminal_here(90, "ls", tmp_path)  # (the metrics but the ranked one go first)
    assert whole[0].split()[-3:] == ["marks", "val_loss", "note"]
    assert whole[1].endswith("  a long note that says what this…")
    lines = on_terminal_here(70, "ls", tmp_path)
    assert lines[0].split()[-3:] == ["marks", "val_loss", "note"]
    assert all(len(line) <= 70 for line in lines), lines
    assert lines[1].endswith("  a long note th…") and len(lines[1]) == 70
    assert "; shortened: created, note (piped" in " ".join(lines[-3:])
    narrow = on_terminal_here(60, "ls", tmp_path)
    assert "note" not in narrow[0].split() and "val_loss" in narrow[0].split()


def test_all_metrics_and_branches_that_differ_are_kept_longer(tmp_path: Path) -> None:
    """--all-metrics asks for every metric: they stay on a narrow terminal; a branch
    column that tells rows apart outlasts the stored sizes."""
    with CheckpointManager(tmp_path, metric="m01", mode="min") as mgr:
        first = mgr.save(torch.nn.Linear(2, 2), rng=False,
                         metrics={f"m{i:02}": i / 10 for i in range(12)})
        mgr.save(torch.nn.Linear(2, 2), rng=False, metrics={"m01": 0.5})
        mgr.head = first
        mgr.save(torch.nn.Linear(2, 2), rng=False, metrics={"m01": 0.2})
    header = on_terminal_here(100, "ls", tmp_path, "--all-metrics")[0].split()
    assert header == ["id", "step", "epoch", "marks", *(f"m{i:02}" for i in range(12))]
    header = on_terminal_here(100, "ls", tmp_path)[0].split()  # (the first 8, by default)
    assert header[:2] == ["id", "branch"] and "stored" not in header
    assert [h for h in header if h.startswith("m") and h != "marks"] == \
        [f"m{i:02}" for i in range(8)]
    rows = on_terminal_here(100, "ls", tmp_path)[1:4]
    assert sorted(row.split()[1] for row in rows) == ["branch-1", "main", "main"]


def test_the_footer_fits_wide_characters_and_says_where_the_table_cannot_fit(
        tmp_path: Path) -> None:
    """textwrap counts a wide character as one column: a footer naming metrics in CJK ran
    past the terminal. And where even id, marks and every metric of --all-metrics are
    wider than the terminal, the footer said "to fit 80 columns" of a table 238 wide, and
    had left out the columns that tell its rows apart (branch, note, step...) for nothing."""
    with CheckpointManager(tmp_path / "wide", metric="val_loss") as mgr:
        mgr.save(torch.nn.Linear(2, 2), rng=False, step=1, epoch=1,
                 metrics={"val_loss": 0.5, "精度_検証": 0.9, "損失_訓練": 0.3})
    for columns in range(28, 70, 2):  # (under 27 the table is wider: id, marks, val_loss)
        lines = on_terminal_here(columns, "ls", tmp_path / "wide")
        assert all(_shown_width(line) <= columns for line in lines), (columns, lines)
    with CheckpointManager(tmp_path / "many", metric="m01", mode="min") as mgr:
        first = mgr.save(torch.nn.Linear(2, 2), rng=False, step=3, metrics={
            "m01": 0.3, **{f"metric_number_{i:02}": i / 10 for i in range(12)}})
        mgr.save(torch.nn.Linear(2, 2), rng=False, step=4, metrics={"m01": 0.5},
                 note="second")
        mgr.head = first
        mgr.save(torch.nn.Linear(2, 2), rng=False, step=4, metrics={"m01": 0.2})
    lines = on_terminal_here(80, "ls", tmp_path / "many", "--all-metrics")
    assert lines[0].split()[:6] == ["id", "branch", "created", "step", "epoch", "marks"]
    assert lines[0].split()[-1] == "note"
    footer = " ".join(lines[lines.index("") + 2:])
    assert footer.startswith("the table is wider than 80 columns even so, left out: "
                             "logical, strategy, parent, batch_idx, stored; shortened: "
                             "created"), footer
    assert "to fit" not in footer


def test_the_lines_under_the_table_are_wrapped_on_a_narrow_terminal(tmp_path: Path) -> None:
    """At COLUMNS under ~30 the "to fit" and marks' footer lines were wrapped, the summary
    line ("1 checkpoint on branch 'main'; ... in the store", 47 columns) and the "more
    metrics not shown" one not. Piped, each stays one line."""
    with CheckpointManager(tmp_path, metric="m00", mode="min") as mgr:
        mgr.save(torch.nn.Linear(2, 2), rng=False, step=1,
                 metrics={f"m{i:02}": i / 10 for i in range(10)})
    lines = on_terminal_here(20, "ls", tmp_path, "--branch", "main")
    under = lines[lines.index("") + 1:]  # (the table itself stays wider: id, marks, m00)
    assert all(_shown_width(line) <= 20 for line in under), under
    said = " ".join(under)
    assert re.match(r"1 checkpoint on branch 'main'; [\d.]+ \w+ in the store the table is "
                    r"wider than 20 columns even so, ", said), said
    assert said.endswith(" 2 more metrics not shown (--all-metrics shows them)"), said
    piped = run_module("ls", tmp_path, "--branch", "main").stdout.splitlines()
    assert piped[-1] == "2 more metrics not shown (--all-metrics shows them)"
    assert re.fullmatch(r"1 checkpoint on branch 'main'; [\d.]+ \w+ in the store", piped[-2])


def _shown_width(line: str) -> int:
    import unicodedata
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def test_a_metric_the_same_in_every_row_goes_before_one_that_differs(tmp_path: Path) -> None:
    """A constant metric (a learning rate never changed) tells no row from another: it
    went last, after val_acc, where it sorted before it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    with CheckpointManager(tmp_path, metric="val_loss") as mgr:
        for epoch in range(3):
            mgr.save(model, epoch=epoch, metrics={"val_loss": 1 / (epoch + 1),
                                                  "val_acc": 0.5 + epoch / 10, "lr": 0.1})
    whole = on_terminal_here(200, "ls", tmp_path)[0].split()
    assert whole[-3:] == ["lr", "val_acc", "val_loss"]
    narrow, wide = 20, 200  # (the widest terminal that leaves lr out: columns only go)
    while wide - narrow > 1:
        middle = (narrow + wide) // 2
        if "lr" in on_terminal_here(middle, "ls", tmp_path)[0].split():
            wide = middle
        else:
            narrow = middle
    header = on_terminal_here(narrow, "ls", tmp_path)[0].split()
    assert "lr" not in header and "val_acc" in header, header


def test_ls_from_a_notebooks_shell_escape_shows_every_column(tmp_path: Path) -> None:
    """A kernel's `!ckpt-nb ls` runs on a pty 80 columns wide whatever the notebook's
    output area (which scrolls): the table stays whole there, as the tutorials show it."""
    demo_like(tmp_path)
    assert on_terminal(60, "ls", tmp_path, in_a_kernel=True) == \
        on_terminal(200, "ls", tmp_path)
