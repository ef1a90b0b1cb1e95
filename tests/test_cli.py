"""The ``ckpt-nb`` command line, run against a real store of a small trained model."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import sqlite3
import struct
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pytest
import torch

from ckpt_nb import CheckpointManager, StoreError, _manager
from ckpt_nb._units import human_size
from ckpt_nb.cli import main
import warm_python  # (fresh interpreters forked from a warm one)


@dataclass
class Store:
    directory: Path
    ids: list[str]
    packs: list[Path]  # the pack each save wrote, in save order


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """Three checkpoints of an nn.Linear trained with AdamW on random data."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 16), torch.randn(64, 8)
    directory = tmp_path / "store"
    ids, packs = [], []
    with CheckpointManager(directory) as mgr:
        for epoch in range(3):
            for _ in range(5):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
            before = set((directory / "packs").glob("*.pack"))
            ids.append(mgr.save(model, optimizer, epoch=epoch, step=5 * (epoch + 1),
                                metrics={"loss": loss.item(), "acc": 0.25 * epoch}))
            (new,) = set((directory / "packs").glob("*.pack")) - before
            packs.append(new)
    return Store(directory, ids, packs)


# A subprocess's command prefix under which root, too, is refused a file of mode 0 (it
# runs without the capabilities that let root read it); none where this is not root.
AS_A_USER = ["setpriv", "--inh-caps=-all",
             "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"] \
    if os.geteuid() == 0 else []


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def module_env() -> dict[str, str]:
    """The environment of a fresh interpreter that imports this checkout's ckpt_nb."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHONWARNINGS", None)
    return env


def on_terminal(columns: int, *argv: object, in_a_kernel: bool = False) -> list[str]:
    """The lines ``python -m ckpt_nb ARGV`` shows on a terminal ``columns`` wide (run
    from a notebook kernel's ``!`` where ``in_a_kernel``)."""
    import pty

    env = {**module_env(), "COLUMNS": str(columns)}
    env.pop("JPY_PARENT_PID", None)  # (these tests run from a notebook too)
    if in_a_kernel:
        env["JPY_PARENT_PID"] = str(os.getpid())  # (as a kernel's environment has it)
    reader, writer = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "ckpt_nb", *map(str, argv)],
                              stdout=writer, stderr=subprocess.PIPE, timeout=120, env=env)
        os.close(writer)
        shown = b""
        with contextlib.suppress(OSError):  # (EIO: the terminal's writer is gone)
            while chunk := os.read(reader, 1 << 16):
                shown += chunk
    finally:
        os.close(reader)
    assert done.returncode == 0, done.stderr
    return shown.decode().replace("\r\n", "\n").splitlines()


def on_terminal_here(columns: int, *argv: object) -> list[str]:
    """The lines ``on_terminal`` shows, from ``main(ARGV)`` in this process, its standard
    output a real pseudo-terminal ``columns`` wide (COLUMNS): the same code path without
    a new interpreter's start (seconds each, where a test tries many widths)."""
    import pty
    import threading

    reader, writer = pty.openpty()
    shown = bytearray()

    def drain() -> None:  # (a pty holds a few KiB: read as ls writes)
        with contextlib.suppress(OSError):  # (EIO: the terminal's writer is gone)
            while chunk := os.read(reader, 1 << 16):
                shown.extend(chunk)

    draining = threading.Thread(target=drain)
    draining.start()
    saved = {name: os.environ.get(name) for name in ("COLUMNS", "JPY_PARENT_PID")}
    stdout = sys.stdout
    try:
        os.environ["COLUMNS"] = str(columns)
        os.environ.pop("JPY_PARENT_PID", None)  # (these tests run from a notebook too)
        with open(writer, "w", encoding="utf-8") as terminal:
            sys.stdout = terminal
            code = main([*map(str, argv)])
    finally:
        sys.stdout = stdout
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        draining.join(timeout=60)
        os.close(reader)
    assert code == 0
    return bytes(shown).decode().replace("\r\n", "\n").splitlines()


def run_module(*argv: object) -> subprocess.CompletedProcess[str]:
    """``python -m ckpt_nb ARGV`` in a fresh interpreter: stderr as a terminal would get it."""
    return warm_python.run([sys.executable, "-m", "ckpt_nb", *map(str, argv)],
                           env=module_env(), timeout=120)


def flip_byte_in_blobs(pack: Path) -> None:
    """Corrupt one byte halfway through the pack's blobs (past the header, before the index)."""
    data = bytearray(pack.read_bytes())
    (index_len,) = struct.unpack("<Q", data[-16:-8])
    blobs_end = len(data) - 16 - index_len
    data[(8 + blobs_end) // 2] ^= 0xFF
    pack.write_bytes(bytes(data))


def test_ls_lists_every_checkpoint(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "ls", store.directory)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["id", "parent", "branch", "created"]
    assert "acc" in lines[0] and "loss" in lines[0]
    assert len(lines) == 6 and lines[4] == ""
    for line, cid in zip(lines[1:], store.ids):
        assert line.startswith(cid)
        assert "main" in line and "full" in line and "KiB" in line
    assert "NaN" not in out and "<NA>" not in out
    assert lines[1].split()[1] == "-"  # the first checkpoint has no parent
    assert lines[2].split()[1] == store.ids[0]


def test_ls_branch_and_best(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    # (a mistyped branch was "no checkpoints on branch 'nope'", and exit 0)
    assert run(capsys, "ls", store.directory, "--branch", "nope") == (
        1, "", f"ckpt-nb: no branch 'nope' in {store.directory}: its branches are main\n")
    code, out, _ = run(capsys, "ls", store.directory, "--metric", "acc", "--mode", "max")
    best = [line for line in out.splitlines() if " best " in line]
    assert code == 0 and len(best) == 1 and best[0].startswith(store.ids[2])


def test_show_fields_and_tensors(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", store.directory, store.ids[1][:6])
    assert code == 0
    assert f"id:        {store.ids[1]}" in out
    assert f"parent:    {store.ids[0]}" in out
    assert f"children:  {store.ids[2]}" in out
    assert "epoch:     1" in out and "acc=0.25" in out
    weight = next(line for line in out.splitlines() if line.startswith("objects/model/weight"))
    assert weight.split() == ["objects/model/weight", "float32", "8x16"]


def test_show_resolves_aliases(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    for alias, expected in (("latest", store.ids[2]), ("-1", store.ids[1])):
        code, out, _ = run(capsys, "show", store.directory, alias)
        assert code == 0 and out.startswith(f"id:        {expected}")
    code, out, _ = run(capsys, "show", store.directory, "best", "--metric", "loss")
    assert code == 0 and out.startswith(f"id:        {store.ids[2]}")  # loss falls each epoch


def test_diff(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "diff", store.directory, store.ids[0], store.ids[2])
    assert code == 0
    table, values, summary = out.rstrip("\n").split("\n\n")
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert rows["objects/model/weight"][1:3] == ["changed", "8x16"]
    assert float(rows["objects/model/weight"][3]) > 0
    assert rows["objects/model/weight"][4].endswith("%")
    assert rows["rng/numpy/keys"][1:] == ["identical", "624", "-", "-"]
    header, *value_rows = (line.split() for line in values.splitlines())
    assert header == ["value", "status", "A", "B"]
    assert [r[:2] for r in value_rows] == [["step", "changed"], ["epoch", "changed"],
                                           ["metrics/loss", "changed"],
                                           ["metrics/acc", "changed"]]
    assert value_rows[0][2:] == ["5", "15"] and value_rows[3][2:] == ["0.0", "0.5"]
    statuses = [r[1] for r in rows.values()]
    assert summary == (f"{len(statuses)} tensors: {statuses.count('identical')} identical, "
                       f"{statuses.count('changed')} changed; 4 values differ")
    code, out, _ = run(capsys, "diff", store.directory, "latest", store.ids[2])
    *_, summary, same = out.splitlines()
    n = summary.split()[0]
    assert code == 0 and summary == f"{n} tensors: {n} identical, 0 changed"
    assert same == f"latest and {store.ids[2]} are the same checkpoint, {store.ids[2]}"


def test_verify_ok(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "verify", store.directory) == (0, "ok: 3 checkpoints verified\n", "")
    assert run(capsys, "verify", store.directory, store.ids[0], "latest")[:2] == (
        0, "ok: 2 checkpoints verified\n")


def test_verify_names_the_corrupt_checkpoint(store: Store,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    flip_byte_in_blobs(store.packs[2])  # only the last checkpoint's chunks live there
    code, out, _ = run(capsys, "verify", store.directory)
    assert code == 1
    bad = [line.split()[1] for line in out.splitlines() if line.startswith("bad: ")]
    assert bad == [store.ids[2]]
    assert "checksum" in out
    assert out.splitlines()[-1] == "1 of 3 checkpoints fail verification"
    assert run(capsys, "verify", store.directory, store.ids[0], store.ids[1])[0] == 0


def test_verify_export_and_gc_progress_bars_on_a_tty(
        store: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    pytest.importorskip("tqdm")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = run(capsys, "verify", store.directory)
    assert code == 0 and out == "ok: 3 checkpoints verified\n" and "verify" in err
    code, out, err = run(capsys, "export", store.directory, "latest", tmp_path / "m.pt")
    assert code == 0 and "m.pt" in out and "export" in err and "chunk" in err
    assert "100%" in err and f"export: writing {tmp_path / 'm.pt'}" in err  # (it vanished at 44%)
    code, out, err = run(capsys, "gc", store.directory)
    assert code == 0 and out.startswith("freed ") and "gc" in err and "pack" in err
    monkeypatch.setitem(sys.modules, "tqdm", None)  # tqdm is optional
    assert run(capsys, "verify", store.directory) == (0, "ok: 3 checkpoints verified\n", "")


def test_gc_reports_what_it_reclaimed(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    manifests = store.directory / "manifests"
    orphan = manifests / "0123456789.json.zst"  # as left by a save that crashed
    orphan.write_bytes((manifests / f"{store.ids[0]}.json.zst").read_bytes())
    code, out, _ = run(capsys, "gc", store.directory)
    assert code == 0 and out.startswith("freed ") and "1 manifest deleted" in out
    assert not orphan.exists()
    assert run(capsys, "verify", store.directory)[0] == 0
    store.packs[1].unlink()  # (by hand: the second checkpoint is damaged, and kept)
    for path in store.directory.glob("catalog.sqlite*"):
        path.unlink()
    with pytest.warns(RuntimeWarning, match="rebuilt"):
        code, out, _ = run(capsys, "gc", store.directory)
    assert code == 0 and "kept 1 damaged file, which gc never deletes (what is left in it may " \
        "be recovered); while that checkpoint is there, gc deletes no pack either (it cannot " \
        "tell which chunks the checkpoint uses):\n" in out, out
    assert f"  {store.directory / 'manifests' / store.ids[1]}" in out, out
    assert "delete one you do not need from the store by hand" in out and "verify" not in out


def test_export_pt(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out" / "last.pt"
    code, out, _ = run(capsys, "export", store.directory, "latest", target)
    assert code == 0 and out.startswith(str(target)) and "KiB" in out
    payload = torch.load(target, weights_only=True)
    assert payload["model"]["weight"].shape == (8, 16)
    assert payload["epoch"] == 2 and payload["ckpt_nb"]["id"] == store.ids[2]


def test_export_safetensors(store: Store, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    target = tmp_path / "first.safetensors"
    assert run(capsys, "export", store.directory, store.ids[0], target)[0] == 0
    assert safetensors.load_file(target)["model/weight"].shape == (8, 16)


def test_rm_of_several_deletes_them_in_one_pass(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """rm took one id: deleting 200 checkpoints took 200 runs, each a pass over the store."""
    run(capsys, "pin", store.directory, store.ids[1])
    code, out, err = run(capsys, "rm", store.directory, store.ids[0], store.ids[1])
    assert (code, out) == (1, "") and "pinned" in err and "nothing was deleted" in err
    assert run(capsys, "rm", store.directory, store.ids[0], "-1", "--force")[:2] == \
        (0, f"deleted {store.ids[0]}, {store.ids[1]}\n")
    _, out, _ = run(capsys, "ls", store.directory)
    assert store.ids[0] not in out and store.ids[1] not in out and store.ids[2] in out
    assert run(capsys, "verify", store.directory)[:2] == (0, "ok: 1 checkpoint verified\n")


def test_pin_unpin_rm(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "pin", store.directory, store.ids[1])[:2] == (0, f"pinned {store.ids[1]}\n")
    code, out, err = run(capsys, "rm", store.directory, store.ids[1])
    assert code == 1 and out == "" and "pinned" in err
    assert "--force" in err and "force=True" not in err  # the CLI's flag, not the API's
    assert run(capsys, "unpin", store.directory, "-1")[:2] == (0, f"unpinned {store.ids[1]}\n")
    assert run(capsys, "rm", store.directory, store.ids[1])[:2] == (0, f"deleted {store.ids[1]}\n")
    run(capsys, "pin", store.directory, store.ids[0])
    assert run(capsys, "rm", store.directory, store.ids[0], "--force")[0] == 0
    _, out, _ = run(capsys, "ls", store.directory)
    assert store.ids[0] not in out and store.ids[1] not in out and store.ids[2] in out
    assert run(capsys, "verify", store.directory)[:2] == (0, "ok: 1 checkpoint verified\n")


@pytest.mark.parametrize("argv", [
    ["show", "{dir}", "no-such-id"],
    ["diff", "{dir}", "latest", "-9"],
    ["export", "{dir}", "latest", "{dir}/out.txt"],
    ["show", "{dir}", "best"],  # 'best' without --metric
])
def test_errors_are_one_line(store: Store, capsys: pytest.CaptureFixture[str],
                             argv: list[str]) -> None:
    code, out, err = run(capsys, *(a.format(dir=store.directory) for a in argv))
    assert code == 1 and out == ""
    assert err.startswith("ckpt-nb: ") and err.count("\n") == 1 and "Traceback" not in err


def test_missing_store_is_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere"
    assert run(capsys, "ls", missing) == (2, "", f"ckpt-nb: no checkpoint store at {missing}\n")
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(capsys, "verify", empty)[0] == 2
    assert list(empty.iterdir()) == []


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["frobnicate", "x"]) == 2
    assert main(["--help"]) == 0
    assert "verify" in capsys.readouterr().out


def test_python_dash_m(store: Store) -> None:
    result = run_module("ls", store.directory)
    assert result.returncode == 0, result.stderr
    assert all(cid in result.stdout for cid in store.ids)


@pytest.mark.parametrize("make", ["file", "directory", "manifest", "catalog"])
def test_file_system_errors_are_one_line(store: Store, tmp_path: Path, make: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """One ``ckpt-nb: WHAT: WHY`` line that names the file, whichever command met it."""
    if make == "file":  # the export's folder is a file
        (tmp_path / "afile").touch()
        argv: list[object] = ["export", store.directory, "latest", tmp_path / "afile" / "x.pt"]
        expected = (f"ckpt-nb: cannot export to {tmp_path / 'afile' / 'x.pt'}: a file is in "
                    "the way, where the export needs a folder: choose another path, or move "
                    "the file: ")
        named = tmp_path / "afile"
    elif make == "directory":  # the export's target is a folder
        (tmp_path / "d.pt").mkdir()
        argv = ["export", store.directory, "latest", tmp_path / "d.pt"]
        expected = f"ckpt-nb: cannot export to {tmp_path / 'd.pt'}: Is a directory\n"  # (once)
        named = tmp_path / "d.pt"
    elif make == "manifest":  # a file the store reads is a folder
        named = store.directory / "manifests" / f"{store.ids[1]}.json.zst"
        named.unlink()
        named.mkdir()
        argv = ["show", store.directory, store.ids[1]]
        expected = "ckpt-nb: "
    else:  # sqlite cannot open the catalog
        (store.directory / "catalog.sqlite").unlink()
        (store.directory / "catalog.sqlite").mkdir()
        argv = ["ls", store.directory]
        expected = "ckpt-nb: cannot "
        named = store.directory
    code, out, err = run(capsys, *argv)
    assert code == 1 and out == ""
    assert err.startswith(expected) and err.count("\n") == 1 and "Traceback" not in err
    assert str(named) in err


def test_catalog_errors_are_one_line(store: Store, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def locked(*_: object) -> str:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(CheckpointManager, "pin", locked)  # as a write that timed out would
    assert run(capsys, "pin", store.directory, "latest") == (
        1, "", f"ckpt-nb: cannot use the catalog of {store.directory}: database is locked\n")


def test_url_stores(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "ls", store.directory.as_uri())
    assert code == 0 and all(cid in out for cid in store.ids)
    missing = (tmp_path / "nowhere").as_uri()  # a typo in a file:// URL is refused too
    assert run(capsys, "ls", missing) == (2, "", f"ckpt-nb: no checkpoint store at {missing}\n")
    assert not (tmp_path / "nowhere").exists()
    url = f"memory://ckpt-nb-cli-{uuid.uuid4().hex}/store"  # lives as long as this process
    try:
        with CheckpointManager(url) as mgr:
            cid = mgr.save(torch.nn.Linear(2, 2), None, step=1, rng=False)
        code, out, _ = run(capsys, "ls", url)
        assert code == 0 and out.splitlines()[1].startswith(cid)
        assert run(capsys, "verify", url)[:2] == (0, "ok: 1 checkpoint verified\n")
    finally:
        fs, root = fsspec.core.url_to_fs(url)
        fs.rm(root, recursive=True)


def test_a_local_url_is_the_folder_and_a_mistyped_one_is_created_nowhere(
        store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "ls", f"local://{store.directory}")
    assert code == 0 and all(cid in out for cid in store.ids)
    missing = f"local://{tmp_path / 'nowhere'}"
    assert run(capsys, "ls", missing) == (2, "", f"ckpt-nb: no checkpoint store at {missing}\n")
    assert not (tmp_path / "nowhere").exists()


def test_diff_without_tensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with CheckpointManager(tmp_path / "relu") as mgr:
        for step in (1, 2):
            mgr.save(torch.nn.ReLU(), None, step=step, rng=False)
    assert run(capsys, "diff", tmp_path / "relu", "-1", "latest") == (
        0, "no tensors in either checkpoint\n\nvalue  status   A  B\nstep   changed  1  2\n", "")


def test_diff_lists_an_lr_change_and_extra_values_cut_short(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two saves differing only in the optimizer's lr and in extra read "2 identical, 0
    changed", nothing about lr or extra; a history of thousands is cut to a line."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = list(range(5000))
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(model, optimizer, 0, rng=False,
                 extra={"lr_note": "lr 0.1", "batch": 32, "history": history})
        optimizer.param_groups[0]["lr"] = 0.001
        mgr.save(model, optimizer, 0, rng=False,
                 extra={"lr_note": "lr 0.001", "history": history + [5000], "seed": 7})
    code, out, _ = run(capsys, "diff", tmp_path, "-1", "latest")
    assert code == 0
    _, values, summary = out.split("\n\n")
    assert [re.split(r"\s{2,}", line) for line in values.splitlines()] == [
        ["value", "status", "A", "B"],
        ["objects/optimizer/param_groups/0/lr", "changed", "0.1", "0.001"],
        ["extra/lr_note", "changed", "'lr 0.1'", "'lr 0.001'"],
        ["extra/batch", "removed", "32", "-"],
        ["extra/history", "changed", "[0, 1, 2, 3, 4, 5, ...] (5000 items)",
         "[0, 1, 2, 3, 4, 5, ...] (5001 items)"],
        ["extra/seed", "added", "-", "7"]]
    assert summary == "2 tensors: 2 identical, 0 changed; 5 values differ\n"


def test_verify_options_between_ids(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, count in ((["--metric", "loss", "best"], 1), (["best", "--metric", "loss"], 1),
                        ([store.ids[0], "--metric", "loss", "best", "-1"], 3)):
        assert run(capsys, "verify", store.directory, *argv) == (
            0, f"ok: {count} checkpoint{'s' if count > 1 else ''} verified\n", "")


def test_verify_counts_each_checkpoint_once(store: Store,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "verify", store.directory, "latest", "latest", "-0", store.ids[2][:5]) == (
        0, "ok: 1 checkpoint verified\n", "")


def test_notes_cannot_break_the_table_or_reach_the_terminal(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    with CheckpointManager(store.directory) as mgr:
        mgr.annotate(store.ids[1], "two\nlines \x1b[31mred\x1b[0m")
    escaped = "two\\nlines \\x1b[31mred\\x1b[0m"
    code, out, _ = run(capsys, "ls", store.directory)
    lines = out.splitlines()[:-2]  # (the table, not its blank line and footer)
    assert code == 0 and len(lines) == 4 and "\x1b" not in out
    assert lines[0].endswith("note") and lines[2].endswith(escaped)
    code, out, _ = run(capsys, "show", store.directory, store.ids[1])
    assert code == 0 and f"note:      {escaped}\n" in out and "\x1b" not in out


def test_messages_name_the_store_as_given(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "sp ace" / "日本"
    with CheckpointManager(directory) as mgr:
        mgr.save(torch.nn.Linear(2, 2), None, step=1, rng=False)
    code, _, err = run(capsys, "show", directory, "nope")
    assert code == 1 and f"no checkpoint 'nope' in {directory}: " in err and "%" not in err


def test_warnings_are_ckpt_nb_lines(store: Store) -> None:
    (store.directory / "catalog.sqlite").unlink()  # rebuilt from the store, with a warning
    result = run_module("ls", store.directory)
    assert result.returncode == 0 and all(cid in result.stdout for cid in store.ids)
    assert result.stderr.startswith(
        f"ckpt-nb: warning: the catalog of {store.directory} was missing, so it was rebuilt")
    assert result.stderr.count("\n") == 1 and "cli.py" not in result.stderr


def test_a_url_with_no_store_is_refused_and_nothing_is_written() -> None:
    """ls at a mistyped URL printed "no checkpoints" and wrote a format stamp there (on
    S3, creating the bucket)."""
    import uuid

    from ckpt_nb import FsspecStore

    url = f"memory://ckpt-nb-typo-{uuid.uuid4().hex}/exp"
    assert main(["ls", url]) == 2
    assert not list(FsspecStore(url).list())


def test_python_dash_m_ckpt_nb_cli_runs_the_cli(store: Store) -> None:
    """``python -m ckpt_nb.cli verify`` used to run nothing and exit 0 on a corrupt store."""
    data = bytearray(store.packs[-1].read_bytes())
    data[len(data) // 3] ^= 0xFF
    store.packs[-1].write_bytes(bytes(data))
    done = warm_python.run([sys.executable, "-m", "ckpt_nb.cli", "verify", store.directory],
                           env=module_env(), timeout=120)  # (run_module's warm interpreter)
    assert done.returncode == 1 and store.ids[-1] in done.stdout


def test_the_demo_refuses_a_folder_of_other_files_and_starts_its_own_afresh(
        tmp_path: Path, one_thread: None) -> None:
    from ckpt_nb import demo

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as stopped:
        demo.main([str(tmp_path)])
    assert stopped.value.code == 2 and (tmp_path / "notes.txt").read_text() == "mine"
    assert demo.main([str(tmp_path / "demo")]) == 0
    (tmp_path / "demo" / "leftover").write_text("x")
    assert demo.main([str(tmp_path / "demo")]) == 0
    assert not (tmp_path / "demo" / "leftover").exists()


def test_export_names_a_full_disk_not_torch_or_safetensors_internals(
        store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        file_size_limit: Callable[[int | None], None]) -> None:
    """Over a file-size limit (as on a full disk) torch said "unexpected pos" and advised
    .safetensors; safetensors raised its own error with a traceback. The error says what
    to do, and that nothing was left behind. (Run by ``main`` in this process under the
    limit: a write past it fails with EFBIG, SIGXFSZ being ignored, as Python starts.)"""
    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
    with CheckpointManager(tmp_path / "big") as mgr:  # (256 KiB of weights)
        mgr.save(torch.nn.Linear(256, 256))
    for name in ("model.pt", "model.safetensors"):
        file_size_limit(100_000)
        try:
            code, out, err = run(capsys, "export", tmp_path / "big", "latest", tmp_path / name)
        finally:
            file_size_limit(None)
        assert code == 1, err
        assert out == "" and err == (
            f"ckpt-nb: cannot export to {tmp_path / name}: File too large: its disk is full, or "
            "this process may write no file that large (ulimit -f): free some room, or raise "
            "the limit, or export to another disk; nothing was left behind\n")
        assert not list(tmp_path.glob(f".{name}*"))  # (no temporary left)


def test_export_to_a_url_is_refused_not_written_to_a_folder_named_like_it(
        store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(store.directory), "latest", "s3://bucket/model.pt"]) == 1
    assert "an export is a local file" in capsys.readouterr().err
    assert not (tmp_path / "s3:").exists()


def test_export_trust_pickle_writes_a_pickled_value(tmp_path: Path) -> None:
    CheckpointManager(tmp_path / "s").save(torch.nn.Linear(2, 2),
                                           extra={"obj": Store(tmp_path, [], [])})
    done = run_module("export", tmp_path / "s", "latest", tmp_path / "a.safetensors")
    assert done.returncode == 0 and "export with --trust-pickle" in done.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["export", str(tmp_path / "s"), "latest", str(tmp_path / "b.safetensors"),
                     "--trust-pickle"]) == 0
        ck = CheckpointManager(tmp_path / "t").import_file(tmp_path / "b.safetensors",
                                                           trust_pickle=True)
    assert CheckpointManager(tmp_path / "t").load(ck, trust_pickle=True).extra["obj"] == \
        Store(tmp_path, [], [])


def test_ls_labels_metrics_named_like_its_columns_and_ctrl_c_is_one_line(
        store: Store, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    with CheckpointManager(store.directory) as mgr:
        mgr.save(torch.nn.Linear(2, 2), metrics={"marks": 1.0, "stored": 2.0})
    assert main(["ls", str(store.directory)]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header.count("marks") == 1 and "metric:marks" in header and "metric:stored" in header

    def interrupted(*_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr("ckpt_nb.cli._ls", interrupted)
    assert main(["ls", str(store.directory)]) == 130
    assert capsys.readouterr().err == "ckpt-nb: ls interrupted\n"


def test_show_says_a_deleted_full_base_is_deleted_and_version(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = torch.nn.Linear(64, 64)
    with CheckpointManager(tmp_path, max_to_keep=2, strategy="incremental") as mgr:
        for _ in range(4):
            with torch.no_grad():
                model.weight[0] += 1
            mgr.save(model)
    assert main(["show", str(tmp_path), "latest"]) == 0
    assert re.search(r"incremental \(3 saves since its full base \w+, deleted; (a restore "
                     r"decodes up to \d+ deltas? a chunk|every chunk stored whole)\)",
                     capsys.readouterr().out)
    assert main(["--version"]) == 0 and capsys.readouterr().out.startswith("ckpt-nb 0.")


@pytest.fixture
def read_only_store(store: Store, tmp_path: Path) -> Iterator[Path]:
    """The store seen through a read-only bind mount (another user's folder, an archive)."""
    view = tmp_path / "read-only"
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(store.directory),
                              str(view)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("mounting read-only needs root: " + mounted.stderr.decode().strip())
    try:
        yield view
    finally:
        subprocess.run(["umount", "--lazy", str(view)], check=True)


def test_a_read_only_store_can_be_looked_into_not_changed(
        read_only_store: Path, store: Store, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every command failed: SQLite could not write the journal it reads through."""
    assert not os.access(read_only_store, os.W_OK)
    for argv in (["ls"], ["show", "latest"], ["verify"], ["diff", "-1", "latest"],
                 ["export", "latest", str(tmp_path / "out.safetensors")]):
        assert main([argv[0], str(read_only_store), *argv[1:]]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert all(cid in out for cid in store.ids), out
    for argv in (["gc"], ["pin", "latest"], ["rm", "latest"]):
        assert main([argv[0], str(read_only_store), *argv[1:]]) == 1
        assert "is open to read only" in capsys.readouterr().err
    mgr = CheckpointManager(read_only_store)
    model = torch.nn.Linear(16, 8)
    assert mgr.restore("latest", model=model).id == store.ids[-1]
    with pytest.raises(StoreError, match="copy it somewhere writable"):
        mgr.save(model)
    mgr.close()


def test_a_read_only_store_without_its_catalog_is_read_from_a_rebuild_in_memory(
        read_only_store: Path, store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """It could not be opened at all: the rebuilt catalog had nowhere to go."""
    for path in store.directory.glob("catalog.sqlite*"):
        path.unlink()  # (through the writable side of the mount)
    with pytest.warns(RuntimeWarning, match="rebuilt in memory, to read only: 3 checkpoints"):
        assert main(["ls", str(read_only_store)]) == 0
    out = capsys.readouterr().out
    assert all(cid in out for cid in store.ids), out
    with pytest.warns(RuntimeWarning, match="rebuilt in memory"):
        assert main(["gc", str(read_only_store)]) == 1
    assert "is open to read only" in capsys.readouterr().err
    with pytest.warns(RuntimeWarning, match="rebuilt in memory") as caught:
        mgr = CheckpointManager(read_only_store, metric="loss")
    assert caught[0].filename == __file__
    model = torch.nn.Linear(16, 8)
    assert mgr.restore("best", model=model).id == store.ids[-1]  # (min loss: the last)
    with pytest.raises(StoreError, match="copy it somewhere writable"):
        mgr.pin(store.ids[0])
    mgr.close()
    assert not list(store.directory.glob("catalog.sqlite*"))


def test_export_trust_pickle_of_a_class_this_process_lacks_is_one_line(tmp_path: Path) -> None:
    """The class of a pickled value defined in a notebook's kernel: a raw traceback."""
    script = ("import torch, ckpt_nb\nclass Foo: pass\n"
              f"ckpt_nb.CheckpointManager({str(tmp_path / 's')!r}).save("
              "torch.nn.Linear(2, 2), extra={'obj': Foo()})\n")
    warm_python.run([sys.executable, "-c", script], check=True, timeout=120, env=module_env())
    done = run_module("export", tmp_path / "s", "latest", tmp_path / "o.safetensors",
                      "--trust-pickle")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "extra/obj is an object whose class this process cannot find" in done.stderr


def test_diff_writes_a_reshape_as_its_rows_do_and_ls_aligns_cjk_metrics(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(torch.nn.Linear(4, 4), metrics={"損失": 0.5})
        mgr.save(torch.nn.Linear(8, 4), metrics={"損失": 0.25})
    assert main(["diff", str(tmp_path), "-1", "latest"]) == 0
    assert "objects/model/weight  reshaped   4x4 -> 4x8" in capsys.readouterr().out
    assert main(["ls", str(tmp_path)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()[:-2]
    cjk = header.index("損失")
    assert all(len(row) == len(header) + 2 for row in rows)  # (each CJK character: 2 columns)
    assert all(row.endswith(("0.5", "0.25")) for row in rows) and cjk > 0


def test_ls_ends_with_the_store_total_where_a_deleted_base_is_in_no_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rows of deltas whose full base was deleted summed to 24 KB of a 3.3 MB store."""
    model = torch.nn.Linear(256, 256)
    with CheckpointManager(tmp_path, strategy="incremental") as mgr:
        ids = []
        for row in range(4):
            with torch.no_grad():
                model.weight[row] += 1
            ids.append(mgr.save(model, rng=False))
        mgr.delete(ids[0])
        mgr.gc()
        rows, total = int(mgr.list()["stored_bytes"].sum()), mgr.stored_bytes()
    assert total > 10 * rows  # (the base's chunks: kept, as the deltas need them)
    code, out, _ = run(capsys, "ls", tmp_path)
    assert code == 0
    assert out.splitlines()[-2:] == ["", f"3 checkpoints; {human_size(total)} in the store"]
    code, out, _ = run(capsys, "ls", tmp_path, "--branch", "main")
    assert out.splitlines()[-1] == \
        f"3 checkpoints on branch 'main'; {human_size(total)} in the store"


def test_a_reader_that_stops_early_ends_the_command_quietly_with_its_own_exit_code(
        store: Store) -> None:
    """Piped into ``head``, ls exited 1 with no message (and show 0 or 1, by a race)."""
    with CheckpointManager(store.directory) as mgr:
        mgr.annotate(store.ids[0], "x" * 20_000)  # (ls writes past the buffer, mid-command)
    # (`python -m ckpt_nb ls STORE | head -1`, its exit status as `set -o pipefail` gives it)
    reading, writing = os.pipe()
    try:
        head = subprocess.Popen(["head", "-1"], stdin=reading, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        listing = warm_python.Popen([sys.executable, "-m", "ckpt_nb", "ls", store.directory],
                                    stdout=writing, stderr=subprocess.PIPE, text=True,
                                    env=module_env())
    finally:
        os.close(reading)
        os.close(writing)
    shown, head_err = head.communicate(timeout=120)
    _, err = listing.communicate(timeout=120)
    assert (head.returncode, listing.returncode, shown.split()[0], head_err + err) == \
        (0, 0, "id", "")
    flip_byte_in_blobs(store.packs[2])
    for argv, code in ((["ls"], 0), (["show", "latest"], 0), (["verify"], 1)):
        reader_gone = warm_python.Popen(  # (the pipe breaks at the first write, or at exit)
            [sys.executable, "-m", "ckpt_nb", argv[0], store.directory, *argv[1:]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=module_env())
        assert reader_gone.stdout is not None
        reader_gone.stdout.close()
        reader_gone.stdout = None  # (closed: communicate reads stderr alone)
        _, err = reader_gone.communicate(timeout=120)
        assert (reader_gone.returncode, err) == (code, ""), argv


def test_an_ambiguous_prefix_says_how_many_checkpoints_it_matches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight ids started with the prefix, five were named, and nothing said there were more;
    then they were named in the order they were made, not sorted."""
    monkeypatch.setattr(_manager, "SHORTEST_PREFIX", 1)  # (one letter, here, may name ids)
    starts: dict[str, list[str]] = {}
    with CheckpointManager(tmp_path) as mgr:
        while max(map(len, starts.values()), default=0) < 7:
            cid = mgr.save(torch.nn.Linear(1, 1), rng=False)
            starts.setdefault(cid[0], []).append(cid)
    prefix, ids = max(starts.items(), key=lambda item: len(item[1]))
    ids.sort()  # (named in sorted order: the first five of them)
    code, out, err = run(capsys, "pin", tmp_path, prefix)
    assert code == 1 and out == "" and err == (
        f"ckpt-nb: {prefix!r} is ambiguous: {len(ids)} checkpoints start with it "
        f"({', '.join(ids[:5])} and {len(ids) - 5} more): give more of the id\n")
    code, _, err = run(capsys, "diff", tmp_path, "latest", prefix)
    assert code == 1 and f"{len(ids)} checkpoints start with it" in err
    assert run(capsys, "show", tmp_path, "nope")[2].startswith("ckpt-nb: no checkpoint 'nope'")


def test_store_options_before_the_command_are_taken(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """``ckpt-nb --metric loss show DIR best`` said "invalid choice: 'loss'"."""
    code, out, _ = run(capsys, "--metric", "loss", "show", store.directory, "best")
    assert code == 0 and out.startswith(f"id:        {store.ids[2]}")
    assert run(capsys, "--mode=max", "--metric", "acc", "verify", store.directory, "best") == (
        0, "ok: 1 checkpoint verified\n", "")
    assert run(capsys, "--metric", "loss")[0] == 2  # (no command: a usage error still)


def test_pinning_twice_and_unpinning_what_is_not_pinned_say_so(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    cid = store.ids[2]
    assert run(capsys, "unpin", store.directory, "latest") == (0, f"{cid} was not pinned\n", "")
    assert run(capsys, "pin", store.directory, "latest") == (0, f"pinned {cid}\n", "")
    assert run(capsys, "pin", store.directory, "latest") == (
        0, f"{cid} was already pinned\n", "")
    assert run(capsys, "unpin", store.directory, "latest") == (0, f"unpinned {cid}\n", "")
    with CheckpointManager(store.directory) as mgr:
        assert not mgr.list()["pinned"].any()


def test_a_store_path_that_is_a_file_says_so(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a file").write_text("x")
    for location in (tmp_path / "a file", (tmp_path / "a file").as_uri()):
        assert run(capsys, "ls", location) == (
            2, "", f"ckpt-nb: no checkpoint store at {location}: it is a file; a store is the "
                   "folder a CheckpointManager saves into\n")


def test_ls_orders_metrics_naturally_shows_eight_and_refuses_an_unknown_metric(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Columns came as m_1, m_10, m_11, m_2, all of them (25 made rows of 900 characters);
    ``--metric nope`` listed the store as if it were a metric of it."""
    names = [f"m_{i}" for i in range(1, 13)]
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(torch.nn.Linear(1, 1), rng=False, metrics={n: 1.0 for n in names})
    code, out, _ = run(capsys, "ls", tmp_path)
    header = out.splitlines()[0].split()
    assert code == 0 and header[header.index("marks") + 1:] == names[:8]
    assert out.splitlines()[-1] == "4 more metrics not shown (--all-metrics shows them)"
    code, out, _ = run(capsys, "ls", tmp_path, "--all-metrics")
    assert out.splitlines()[0].split()[-12:] == names and "not shown" not in out
    code, out, _ = run(capsys, "ls", tmp_path, "--metric", "m_11", "--mode", "min")
    assert out.splitlines()[0].split()[-9:] == [*names[:8], "m_11"] and "best" in out
    assert out.splitlines()[-1] == "3 more metrics not shown (--all-metrics shows them)"
    assert run(capsys, "ls", tmp_path, "--metric", "nope") == (
        1, "", f"ckpt-nb: no checkpoint has the metric 'nope'; the metrics logged are: "
               f"{', '.join(names)}\n")


def test_ls_shows_the_recorded_metric_it_marks_best_by_and_counts_one_more_metric(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The metric the store's saves recorded ranking by was hidden where 8 others sorted
    before it, beside the 'best' it marked by it; one hidden was "1 more metrics"."""
    aux = [f"aux{i}" for i in range(8)]
    with CheckpointManager(tmp_path, metric="val_loss") as mgr:
        for i in range(3):
            mgr.save(torch.nn.Linear(1, 1), rng=False,
                     metrics={"val_loss": 1 / (i + 1), **{n: 1.0 for n in aux}})
    code, out, _ = run(capsys, "ls", tmp_path)
    header = out.splitlines()[0].split()
    assert code == 0 and header[header.index("marks") + 1:] == [*aux, "val_loss"]
    assert out.splitlines()[3].split()[-1] == "0.3333" and "best" in out.splitlines()[3]
    assert "not shown" not in out
    with CheckpointManager(tmp_path, metric="val_loss") as mgr:
        mgr.save(torch.nn.Linear(1, 1), rng=False,
                 metrics={"val_loss": 0.1, "zz": 1.0, **{n: 1.0 for n in aux}})
    code, out, _ = run(capsys, "ls", tmp_path)
    assert out.splitlines()[-1] == "1 more metric not shown (--all-metrics shows them)"


def test_diff_shows_l2_and_rng_state_without_norms(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table lacked diff()'s l2; the RNG state's words had norms such as 4.3e+10."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(model)
        torch.rand(10)
        with torch.no_grad():
            model.bias += 3
        mgr.save(model)
    code, out, _ = run(capsys, "diff", tmp_path, "-1", "latest")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line}
    assert code == 0 and out.split()[:5] == ["tensor", "status", "shape", "l2", "rel_change"]
    assert rows["objects/model/bias"][1:4] == ["changed", "2", "4.243"]  # (3 * sqrt(2))
    assert rows["rng/torch"][1:] == ["changed", "5056", "-", "-"]


def test_export_names_the_checkpoint_it_wrote(store: Store, tmp_path: Path) -> None:
    """``export latest`` skipped a newest that fails verification, and said only where
    it wrote the older one."""
    flip_byte_in_blobs(store.packs[2])
    done = run_module("export", store.directory, "latest", tmp_path / "m.pt")
    assert done.returncode == 0 and f"skipping checkpoint {store.ids[2]}" in done.stderr
    assert done.stdout.startswith(f"{tmp_path / 'm.pt'} (") and \
        done.stdout.endswith(f", checkpoint {store.ids[1]})\n")
    assert torch.load(tmp_path / "m.pt", weights_only=True)["ckpt_nb"]["id"] == store.ids[1]


def test_a_url_of_an_unknown_scheme_is_named_with_what_a_store_can_be(capsys) -> None:
    """A typo in the scheme printed fsspec's bare "Protocol not known: s4"."""
    assert main(["ls", "s4://b/x"]) == 2  # (a usage error, as a missing store)
    err = capsys.readouterr().err
    assert "s4://b/x: no storage knows the scheme 's4': a store is a path" in err, err
    with pytest.raises(ValueError, match="no storage knows the scheme 's4'"):
        CheckpointManager("s4://b/x")


def test_a_malformed_url_is_a_usage_error_on_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An invalid bucket name printed botocore's "Parameter validation failed:\\nInvalid
    bucket name..." and its regexes, and exited 1 as a failure of the store would."""
    pytest.importorskip("s3fs")
    folder = tmp_path / "runs"
    for url, said in (("s3://BAD_BUCKET!/exp", "'BAD_BUCKET!' is not a bucket name"),
                      ("s3://", "names no bucket"),
                      (f"simplecache::file://{folder}", f"is the folder {folder}")):
        code, out, err = run(capsys, "ls", url)
        assert (code, out) == (2, "") and err.startswith(f"ckpt-nb: {url}")
        assert said in err and err.count("\n") == 1 and "regex" not in err, err
        with pytest.raises(ValueError, match=re.escape(said)):
            CheckpointManager(url)
    assert not folder.exists()


def test_a_read_only_store_whose_catalog_has_a_journal_but_no_shm_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A store copied without its -shm after its trainer was killed read as "empty":
    SQLite reads a WAL only through a -shm, which it cannot make in a read-only folder."""
    directory = tmp_path / "store"
    killed = ("import os, sys, torch; from ckpt_nb import CheckpointManager\n"
              "m = CheckpointManager(sys.argv[1]); lin = torch.nn.Linear(4, 4)\n"
              "print(*(m.save(lin, epoch=i) for i in range(3)))\n"
              "os._exit(0)  # (killed: the catalog's WAL is left as it was)")
    ids = warm_python.run([sys.executable, "-c", killed, str(directory)], check=True,
                          env=module_env()).stdout.split()
    assert (directory / "catalog.sqlite-wal").stat().st_size > 0
    (directory / "catalog.sqlite-shm").unlink()
    view = tmp_path / "read-only"
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(directory), str(view)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("mounting read-only needs root: " + mounted.stderr.decode().strip())
    try:
        assert main(["ls", str(view)]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert all(cid in out for cid in ids) and "3 checkpoints" in out, out
        assert main(["export", str(view), "latest", str(tmp_path / "out.pt")]) == 0
        assert ids[-1] in capsys.readouterr().out
        assert main(["rm", str(view), "latest"]) == 1
        assert "is open to read only" in capsys.readouterr().err
    finally:
        subprocess.run(["umount", "--lazy", str(view)], check=True)
    assert not (directory / "catalog.sqlite-shm").exists()


def test_export_blames_the_store_not_out_for_a_pack_it_cannot_read(
        store: Store, tmp_path: Path) -> None:
    """An unreadable pack was reported as "cannot export to OUT: Permission denied: PACK"."""
    store.packs[2].chmod(0)
    out = tmp_path / "out.pt"
    try:
        done = subprocess.run([*AS_A_USER, sys.executable, "-m", "ckpt_nb", "export",
                               str(store.directory), store.ids[2], str(out)],
                              capture_output=True, text=True)
    finally:
        store.packs[2].chmod(0o644)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"ckpt-nb: export failed: Permission denied: {store.packs[2]}\n"
    assert not out.exists()


def test_verify_advises_gc_for_a_damaged_index_and_rm_for_a_pack_cut_short(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """A pack cut short inside its chunks got "their chunks read ...: `ckpt-nb gc` rewrites
    them", though they did not, and gc leaves such a pack as it is."""
    data = store.packs[0].read_bytes()
    (index_len,) = struct.unpack("<Q", data[-16:-8])
    store.packs[0].write_bytes(data[:len(data) - 16 - index_len])  # its chunks whole
    with store.packs[2].open("r+b") as pack:
        pack.truncate(100)  # inside its first chunk
    code, out, _ = run(capsys, "verify", store.directory)
    bad = [line.split()[1] for line in out.splitlines() if line.startswith("bad: ")]
    assert code == 1 and bad and store.ids[0] not in bad, out
    assert out.splitlines()[-1] == (
        f"{len(bad)} of 3 checkpoints fail verification; 1 pack index is damaged (the chunks "
        f"read, but a rebuilt catalog would miss them: `ckpt-nb gc {store.directory}` rewrites "
        f"them); 1 pack cut short or damaged holds chunks of {', '.join(bad)}, which cannot be "
        f"restored: `ckpt-nb rm {store.directory} ID` deletes one")


def test_export_trust_pickle_says_what_a_shell_user_can_do(tmp_path: Path) -> None:
    """``--trust-pickle`` to a .pt "also wrote" pickles it left out, with advice to call
    torch.serialization.add_safe_globals; a class not found said to define it first."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "mycfg.py").write_text("class Cfg:\n    lr = 0.1\n")
    # (mycfg importable as from a PYTHONPATH folder: run with it as the working folder,
    # which `python -c`/`-m` puts first on the path, in run_module's warm interpreter
    # where a PYTHONPATH of its own would start another, seconds long)
    mods = tmp_path / "mods"
    warm_python.run([sys.executable, "-c", (
        "import sys, torch, mycfg; from ckpt_nb import CheckpointManager\n"
        "CheckpointManager(sys.argv[1]).save(torch.nn.Linear(2, 2), extra={'cfg': "
        "mycfg.Cfg()})"), str(tmp_path / "store")], check=True, env=module_env(), cwd=mods)

    def export(out: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return warm_python.run([sys.executable, "-m", "ckpt_nb", "export", str(tmp_path / "store"),
                               "latest", str(tmp_path / out), "--trust-pickle"],
                               env=module_env(), cwd=cwd)

    done = export("a.pt", tmp_path)  # (no mycfg.py there)
    assert done.returncode == 1 and done.stderr == (
        "ckpt-nb: extra/cfg is an object whose class this process cannot find (No module "
        "named 'mycfg'): make its module importable (PYTHONPATH=FOLDER ckpt-nb ..., where "
        "FOLDER holds it; a class defined in a notebook cannot be found outside it)\n")
    done = export("a.pt", mods)
    assert done.returncode == 0 and done.stderr == (
        "ckpt-nb: warning: left out of a.pt: extra/cfg (a Cfg, which "
        "torch.load(weights_only=True) refuses: export to .safetensors)\n")
    done = export("a.safetensors", mods)
    assert (done.returncode, done.stderr) == (0, "")
    kept = warm_python.run([sys.executable, "-c", (
        "import sys; from ckpt_nb import CheckpointManager\n"
        "m = CheckpointManager(sys.argv[2]); cid = m.import_file(sys.argv[1], trust_pickle=True)\n"
        "print(type(m.load(cid, trust_pickle=True).extra['cfg']).__name__)"),
        str(tmp_path / "a.safetensors"), str(tmp_path / "again")], env=module_env(), cwd=mods)
    assert kept.stdout == "Cfg\n", kept.stderr
    help_text = " ".join(run_module("export", "--help").stdout.split())
    assert "a .safetensors OUT keeps them, a .pt leaves them out" in help_text


def test_a_nan_metric_is_shown_as_nan_not_as_never_logged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A diverged run's NaN loss was "-" in ls and show, as a metric never logged is."""
    with CheckpointManager(tmp_path) as mgr:
        model = torch.nn.Linear(2, 2)
        nan_id = mgr.save(model, metrics={"loss": float("nan")})
        other_id = mgr.save(model, metrics={"acc": 1.0})
    code, out, _ = run(capsys, "ls", tmp_path)
    rows = {line.split()[0]: line.split()[-2:] for line in out.splitlines()[1:3]}
    assert code == 0 and rows == {nan_id: ["-", "nan"], other_id: ["1", "-"]}, out
    code, out, _ = run(capsys, "show", tmp_path, nan_id)
    assert code == 0 and "metrics:   loss=nan\n" in out


def test_a_nan_metric_is_shown_in_its_own_column_where_names_sort_naturally(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ls shows loss_2 before loss_10; a NaN loss_10 was marked in loss_2's column (its
    1.0 shown as "nan") and loss_10 was "-", as never logged."""
    with CheckpointManager(tmp_path) as mgr:
        nan_id = mgr.save(torch.nn.Linear(2, 2),
                          metrics={"loss_2": 1.0, "loss_10": float("nan")})
    code, out, _ = run(capsys, "ls", tmp_path)
    header, row = (line.split() for line in out.splitlines()[:2])
    assert code == 0 and row[0] == nan_id, out
    assert header[-2:] == ["loss_2", "loss_10"] and row[-2:] == ["1", "nan"], out


def test_verify_says_a_missing_pack_once_not_once_per_chunk(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    store.packs[2].unlink()
    code, out, _ = run(capsys, "verify", store.directory)
    pack = f"packs/{store.packs[2].name}"
    assert code == 1 and f"bad: {store.ids[2]}\n  pack {pack} is missing from the store\n" in out



@pytest.mark.parametrize("stamp", ["{}", "[3]", '{"format": -1}', '{"format": 3'])
def test_a_damaged_format_stamp_says_what_it_should_read(
        store: Store, stamp: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It said Python's words ("unreadable: 'format'"), and took a format of -1."""
    (store.directory / "ckpt_nb.json").write_text(stamp)
    code, out, err = run(capsys, "ls", store.directory)
    assert (code, out) == (1, "") and err.startswith(
        f"ckpt-nb: {store.directory}/ckpt_nb.json is unreadable (it ")
    assert err.endswith(': it should read {"format": N}, N the store\'s format, a whole '
                        'number from 1 (this ckpt_nb writes 3); restore the file, or write '
                        '{"format": 3} where this ckpt_nb wrote the store\n'), err


def test_a_read_only_store_without_its_format_stamp_is_read(
        read_only_store: Path, store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """Opening it stamped it, and failed: "cannot write ckpt_nb.json"."""
    (store.directory / "ckpt_nb.json").unlink()  # (through the writable side of the mount)
    code, out, err = run(capsys, "ls", read_only_store)
    assert (code, err) == (0, "") and all(cid in out for cid in store.ids), out
    assert not (store.directory / "ckpt_nb.json").exists()


def test_ls_writes_to_a_latin_1_or_closed_standard_output(tmp_path: Path) -> None:
    """A CJK note failed the whole ls where stdout was Latin-1 ("'latin-1' codec can't
    encode"), and a closed stdout (``>&-``) gave an AttributeError traceback."""
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(torch.nn.Linear(2, 2), note="日本語 run")
    latin = subprocess.run([sys.executable, "-m", "ckpt_nb", "ls", str(tmp_path)],
                           capture_output=True, env={**os.environ, "PYTHONIOENCODING": "latin-1"})
    assert (latin.returncode, latin.stderr) == (0, b"")
    assert b"\\u65e5\\u672c\\u8a9e run" in latin.stdout
    closed = subprocess.run(["sh", "-c", 'exec "$0" -m ckpt_nb ls "$1" >&-', sys.executable,
                             str(tmp_path)], capture_output=True, text=True)
    assert (closed.returncode, closed.stderr) == (0, "")


def test_an_ambiguous_prefix_in_capitals_says_how_many_it_matches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's own check was case-sensitive, so "F" got the API's terse message."""
    monkeypatch.setattr(_manager, "SHORTEST_PREFIX", 1)  # (one letter, here, may name ids)
    starts: dict[str, list[str]] = {}
    with CheckpointManager(tmp_path) as mgr:
        while not any(len(ids) > 1 for ids in starts.values()):
            cid = mgr.save(torch.nn.Linear(1, 1), rng=False)
            if cid[0] in "abcdef":
                starts.setdefault(cid[0], []).append(cid)
    letter, ids = next((k, v) for k, v in starts.items() if len(v) > 1)
    code, out, err = run(capsys, "show", tmp_path, letter.upper())
    assert (code, out) == (1, "") and err == (
        f"ckpt-nb: {letter.upper()!r} is ambiguous: 2 checkpoints start with it "
        f"({', '.join(sorted(ids))}): give more of the id\n")


def test_counts_of_one_are_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ "1 checkpoints verified", "1 saves since", "up to 0 deltas a chunk" (gc's "1
    manifests deleted": test_gc_reports_what_it_reclaimed)."""
    model = torch.nn.Linear(4, 4)
    with CheckpointManager(tmp_path, strategy="incremental") as mgr:
        first = mgr.save(model)
        mgr.save(model)  # (nothing changed: no delta)
    assert run(capsys, "verify", tmp_path, "latest")[:2] == (0, "ok: 1 checkpoint verified\n")
    code, out, _ = run(capsys, "show", tmp_path, "latest")
    assert code == 0 and (f"strategy:  incremental (1 save since its full base {first}; "
                          "every chunk stored whole)\n") in out


@pytest.mark.parametrize("command", ["show", "diff", "pin", "unpin", "rm", "export"])
def test_every_id_argument_says_what_it_takes(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """show, diff, pin, unpin and rm listed ID (or A and B) with no help at all."""
    assert main([command, "--help"]) == 0
    positional = " ".join(capsys.readouterr().out.split("positional arguments:")[1]
                          .split("options:")[0].split())
    ids = positional.count("'latest', 'best' (by --metric, or the store's recorded metric), "
                           "'-N' or an id prefix")
    assert ids == (2 if command == "diff" else 1), positional


def test_a_damaged_checkpoint_error_says_what_to_do(
        store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """"checkpoint ID: chunk ... fails its checksum", and nothing more; then its advice
    left out the store (`ckpt-nb rm ID`, a usage error): each command runs as printed,
    the store named as typed, quoted for the shell."""
    flip_byte_in_blobs(store.packs[2])
    typed = tmp_path / "my store"
    store.directory.rename(typed)
    code, out, err = run(capsys, "export", typed, store.ids[2], tmp_path / "o.pt")
    assert (code, out) == (1, "") and err.startswith(f"ckpt-nb: checkpoint {store.ids[2]}: ")
    assert err.endswith(f"fails its checksum (`ckpt-nb verify '{typed}'` names every damaged "
                        f"checkpoint; `ckpt-nb rm '{typed}' {store.ids[2]}` deletes this one, "
                        "or give another id)\n")
    verify, rm = (shlex.split(command) for command in re.findall(r"`ckpt-nb ([^`]*)`", err))
    assert main(verify) == 1 and store.ids[2] in capsys.readouterr().out
    assert main(rm) == 0
    assert main(verify) == 0


def test_help_and_usage_errors_answer_before_torch_loads() -> None:
    """``ckpt-nb --help`` took a second, torch's import, and Ctrl-C in it printed a
    traceback: the package's public names load on first use."""
    code = ("import sys\nfrom ckpt_nb.cli import main\n"
            "codes = [main(['--help']), main(['ls'])]\n"
            "print(codes, 'torch' in sys.modules)\n"
            "import ckpt_nb\n"
            "assert sorted(ckpt_nb._PUBLIC) == sorted(ckpt_nb.__all__)\n"
            "print('torch' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)  # (not forked: torch must not be loaded)
    assert run.stdout.splitlines()[-2:] == ["[0, 2] False", "False"], run.stdout
    # Each public name loads on first use (torch with it: here, in a warm interpreter
    # that has torch loaded, ckpt_nb not, seconds sooner than a fresh one).
    code = ("import ckpt_nb\n"
            "loaded = [getattr(ckpt_nb, name) for name in ckpt_nb.__all__]\n"
            "print(len(loaded), set(ckpt_nb.__all__) <= set(dir(ckpt_nb)))\n")
    run = warm_python.run([sys.executable, "-c", code], env=module_env(), timeout=120,
                          check=True)
    assert run.stdout.splitlines()[-1:] == ["41 True"], run.stdout


def test_messages_of_the_api_are_in_the_cli_s_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """'best' where no checkpoint has a finite metric said "give a metric (metric=,
    --metric)", and verify of a damaged manifest said "gc() leaves it"."""
    with CheckpointManager(tmp_path, metric="loss") as mgr:
        first = mgr.save(torch.nn.Linear(2, 2), metrics={"loss": float("nan")})
        mgr.save(torch.nn.Linear(2, 2), metrics={"loss": float("nan")})
    code, out, err = run(capsys, "show", tmp_path, "best")
    assert (code, out) == (1, "") and err == (
        "ckpt-nb: no checkpoint has a finite 'loss' (NaN and ±inf are never best), the "
        "metric an earlier save recorded in this store: give a metric (--metric NAME) to "
        "rank by another\n")
    (tmp_path / "manifests" / f"{first}.json.zst").write_bytes(b"not a manifest")
    (tmp_path / "catalog.sqlite").unlink()  # (rebuilt: the damaged manifest is left out)
    done = run_module("verify", tmp_path)
    assert done.returncode == 1 and f"bad: {first}\n" in done.stdout, done.stdout
    assert "gc()" not in done.stdout + done.stderr
    assert "`ckpt-nb gc` leaves it" in done.stdout
    assert "left alone by `ckpt-nb gc`" in done.stderr, done.stderr


def run_barred_from(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``ckpt-nb ARGS`` run as a user who may not open ``path`` (its mode put back after)."""
    mode = path.stat().st_mode
    path.chmod(0)
    try:
        return subprocess.run([*AS_A_USER, sys.executable, "-m", "ckpt_nb", *args],
                              capture_output=True, text=True)
    finally:
        path.chmod(mode)


def test_ls_of_a_store_with_an_unreadable_folder_fails_before_any_row(store: Store) -> None:
    """It printed every row, then failed on the total line with exit 1: a script that
    checks the exit code got a table it was told to throw away."""
    manifests = store.directory / "manifests"
    done = run_barred_from(manifests, "ls", str(store.directory))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"ckpt-nb: ls failed: Permission denied: {manifests}\n"


def test_gc_with_a_lock_file_it_cannot_open_says_to_make_the_file_writable(
        store: Store) -> None:
    """It said to make the store's folder writable, which it was."""
    lock = store.directory / "catalog.sqlite.lock"
    done = run_barred_from(lock, "gc", str(store.directory))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"ckpt-nb: cannot open the lock file {lock} of {store.directory} (Permission "
        "denied): make it writable for this user (chmod or chown it, as its owner or root), "
        "then try again; nothing was changed\n")


def test_gc_takes_no_metric_nor_mode(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """gc took --metric and --mode, and did nothing with them (it ranks nothing); then
    refused them as "unrecognized arguments: --metric=loss", a form the user never typed
    where they came before the command."""
    for argv in (["gc", store.directory, "--metric", "loss"], ["--metric", "loss", "gc",
                 store.directory], ["gc", "--mode=max", store.directory]):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, ""), err
        assert err.endswith("ckpt-nb gc: error: gc takes no --metric/--mode (they rank best; "
                            "gc ranks nothing)\n"), err
    assert main(["gc", "--help"]) == 0
    assert "--metric" not in capsys.readouterr().out


def test_a_ctrl_c_as_the_command_exits_is_not_a_death_by_signal(store: Store) -> None:
    """Python's exit sets SIGINT back to its default action, then unloads torch (half a
    second): a Ctrl-C meanwhile killed ``ls``, exit -2, though it had printed its table.
    Ctrl-C here comes every 2 ms from the table's first byte on."""
    listing = subprocess.Popen(  # (SIGINT's default action, as a shell starts a command)
        [sys.executable, "-m", "ckpt_nb", "ls", str(store.directory)], env=module_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert listing.stdout is not None
    listing.stdout.read(1)
    deadline = time.monotonic() + 60
    while listing.poll() is None and time.monotonic() < deadline:
        listing.send_signal(signal.SIGINT)
        time.sleep(0.002)
    _, err = listing.communicate(timeout=60)
    assert listing.returncode in (0, 130), err.decode()


def test_ls_cuts_a_long_note_on_a_terminal_and_keeps_it_whole_when_piped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A note of 200 characters made table lines of 489 on a terminal; `show`, and ls
    piped into another program, give it whole."""
    note = "n" * 30 + "\t" + "x" * 169
    with CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(torch.nn.Linear(1, 1), rng=False, note=note)
    row = on_terminal_here(80, "ls", tmp_path)[1]
    assert row.endswith("  " + "n" * 30 + "…") and len(row) < 200, row
    code, piped, _ = run(capsys, "ls", tmp_path)  # (its standard output no terminal)
    assert code == 0 and piped.splitlines()[1].endswith("  " + "n" * 30 + "\\t" + "x" * 169)
    code, shown, _ = run(capsys, "show", tmp_path, cid)
    assert code == 0 and ("n" * 30 + "\\t" + "x" * 169) in shown


def test_a_metric_named_with_a_control_character_aligns_right_as_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its header was escaped before its alignment was looked up by name: left-aligned."""
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(torch.nn.Linear(1, 1), rng=False,
                 metrics={"x\ny": 1.0, "loss": 0.5, "zz": 123.0})
    code, out, _ = run(capsys, "ls", tmp_path)
    header, row = out.splitlines()[:2]
    assert code == 0 and header.endswith("  loss  x\\ny   zz")
    assert row.endswith("   0.5     1  123")


def test_mode_without_metric_ranks_by_the_recorded_metric_in_that_mode(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`best --mode max` without --metric ranked by the recorded val_loss, lowest first:
    --mode was ignored without a word."""
    with CheckpointManager(tmp_path, metric="val_loss") as mgr:
        ids = [mgr.save(torch.nn.Linear(1, 1), rng=False, metrics={"val_loss": v})
               for v in (1.0, 0.25, 0.5)]
    for argv, best in ((["--mode", "max"], ids[0]), (["--mode", "min"], ids[1]), ([], ids[1])):
        code, out, _ = run(capsys, "show", tmp_path, "best", *argv)
        assert code == 0 and out.startswith(f"id:        {best}\n"), (argv, out)
    code, out, _ = run(capsys, "ls", tmp_path, "--mode", "max")
    assert [line.split()[0] for line in out.splitlines() if "best" in line] == [ids[0]]
    with CheckpointManager(tmp_path) as mgr:  # (the record stays as the saves left it)
        assert (mgr.metric, mgr.mode) == ("val_loss", "min")


def test_a_metric_with_its_mode_as_a_notebook_s_on_gives_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ls --on val_loss:min` (a notebook's --on) was a usage error, and `--metric
    acc:max` said no checkpoint has the metric 'acc:max'."""
    with CheckpointManager(tmp_path) as mgr:
        ids = [mgr.save(torch.nn.Linear(1, 1), rng=False, metrics={"score": v})
               for v in (1.0, 0.25, 0.5)]
    for argv, best in ((["--metric", "score:max"], ids[0]), (["--on", "score:min"], ids[1]),
                       (["--on=score:max", "--mode", "max"], ids[0])):
        code, out, err = run(capsys, "show", tmp_path, "best", *argv)
        assert code == 0 and out.startswith(f"id:        {best}\n"), (argv, out, err)
    code, out, _ = run(capsys, "--on", "score:max", "ls", tmp_path)
    assert [line.split()[0] for line in out.splitlines() if "best" in line] == [ids[0]]
    code, out, _ = run(capsys, "show", tmp_path, "best", "--on", "score:MAX")
    assert code == 0 and out.startswith(f"id:        {ids[0]}\n"), out
    code, out, err = run(capsys, "show", tmp_path, "best", "--on", "score:min", "--mode", "max")
    assert (code, out) == (2, "") and err.endswith(
        "error: score:min says min, and --mode max: give one\n"), err
    code, out, err = run(capsys, "ls", tmp_path, "--on", "score:min", "--metric", "score")
    assert (code, out) == (2, "") and err.endswith(  # (argparse kept the last, silently)
        "error: --on and --metric each name the metric: give one\n"), err
    code, _, err = run(capsys, "gc", tmp_path, "--on", "score:min")
    assert code == 2 and "gc takes no --metric/--mode" in err


def test_mode_without_metric_on_a_store_that_recorded_none_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ls --mode max` on a store whose saves recorded no ranking marked nothing best,
    without a word (review)."""
    with CheckpointManager(tmp_path) as mgr:
        for v in (1.0, 0.25):
            mgr.save(torch.nn.Linear(1, 1), rng=False, metrics={"val_loss": v})
    code, out, err = run(capsys, "ls", tmp_path, "--mode", "max")
    assert code == 0 and "best" not in out
    assert "warning: --mode max ranks nothing: no save to this store recorded a metric " \
        "to rank by; give --metric NAME with it" in err


def test_a_note_cut_on_a_terminal_fits_its_columns_and_keeps_escapes_whole() -> None:
    """A note of wide characters was cut to 31 characters (63 columns), one with an
    escape in its middle showed a stray backslash (review)."""
    from ckpt_nb.cli import _note_cell, _width
    wide = _note_cell("中" * 40, cut=True)
    assert wide.endswith("…") and _width(wide) <= 32
    escaped = _note_cell("x" * 30 + "\x1b[31m", cut=True)
    assert escaped == "x" * 30 + "…"
    assert _note_cell("x" * 30 + "\x1b[31m", cut=False) == "x" * 30 + "\\x1b[31m"
