"""``ckpt-nb show`` and ``diff`` take "latest" as ``export`` and ``restore`` do: the newest
checkpoint that verifies, naming a newer one passed over and why."""

from __future__ import annotations

import re
import struct
import warnings
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager
from ckpt_nb.cli import main


def saved(directory: Path, count: int) -> tuple[list[str], list[Path]]:
    """``count`` full saves of a trained nn.Linear, and the pack each one wrote."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    ids, packs = [], []
    with CheckpointManager(directory) as mgr:
        for step in range(count):
            with torch.no_grad():
                model.weight += 1
            before = set((directory / "packs").glob("*.pack"))
            ids.append(mgr.save(model, step=step, strategy="full"))
            (new,) = set((directory / "packs").glob("*.pack")) - before
            packs.append(new)
    return ids, packs


def flip_byte_in_blobs(pack: Path) -> None:
    """Corrupt one byte halfway through the pack's blobs (past the header, before the index)."""
    data = bytearray(pack.read_bytes())
    (index_len,) = struct.unpack("<Q", data[-16:-8])
    data[(8 + len(data) - 16 - index_len) // 2] ^= 0xFF
    pack.write_bytes(bytes(data))


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_show_latest_is_the_checkpoint_export_writes_and_names_the_corrupt_one_skipped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """show showed the corrupt newest checkpoint while export wrote the one before it."""
    ids, packs = saved(tmp_path / "store", 3)
    flip_byte_in_blobs(packs[2])
    with pytest.warns(UserWarning, match=f"skipping checkpoint {ids[2]}"):
        code, out, _ = run(capsys, "export", tmp_path / "store", "latest", tmp_path / "m.pt")
    assert code == 0 and out.endswith(f", checkpoint {ids[1]})\n")
    code, out, err = run(capsys, "show", tmp_path / "store", "latest")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"id:        {ids[1]}"
    assert lines[1].startswith(f"skipped:   {ids[2]} (chunk ") and lines[1].endswith(
        "fails its checksum), newer: 'latest' is the newest checkpoint that verifies, as "
        "restore and export take it")
    assert "step:      1" in lines
    code, out, _ = run(capsys, "show", tmp_path / "store", ids[2])  # by id: as it is
    assert code == 0 and out.startswith(f"id:        {ids[2]}\nparent:")


def test_show_latest_of_a_sound_store_says_nothing_skipped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids, _ = saved(tmp_path, 2)
    code, out, _ = run(capsys, "show", tmp_path, "latest")
    assert code == 0 and out.startswith(f"id:        {ids[1]}\nparent:    {ids[0]}\n")
    assert "skipped" not in out


def test_diff_latest_compares_the_newest_that_verifies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """diff failed on the corrupt newest checkpoint's chunks, which export passes over."""
    ids, packs = saved(tmp_path, 3)
    flip_byte_in_blobs(packs[2])
    code, out, err = run(capsys, "diff", tmp_path, ids[1], "latest")
    assert (code, err) == (0, "")
    *_, summary, note, same = out.splitlines()
    assert summary.endswith(" identical, 0 changed")  # ids[1] against itself
    assert note.startswith(f"latest is {ids[1]}: skipped {ids[2]} (chunk ")
    assert same == f"{ids[1]} and latest are the same checkpoint, {ids[1]}"
    code, out, _ = run(capsys, "diff", tmp_path, "latest", ids[0])
    assert code == 0 and out.splitlines()[-1].startswith(f"latest is {ids[1]}: skipped")
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:] if line}
    assert rows["objects/model/weight"] == "changed"


def test_show_latest_where_none_verifies_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, packs = saved(tmp_path, 2)
    for pack in packs:
        flip_byte_in_blobs(pack)
    for argv in (["show", tmp_path, "latest"], ["diff", tmp_path, "latest", "-1"]):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (1, "") and err == (
            f"ckpt-nb: no checkpoint in {tmp_path} passes verification: `ckpt-nb verify "
            f"{tmp_path}` names what is damaged; `ckpt-nb show {tmp_path} ID` shows that "
            "checkpoint as it is\n")


def test_minus_n_counts_back_from_the_latest_that_verifies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's ``diff DIR -1 latest`` compared a checkpoint with itself where the
    newest failed verification: "latest" skipped it, and "-1" counted back from it."""
    ids, packs = saved(tmp_path, 3)
    flip_byte_in_blobs(packs[2])
    code, out, err = run(capsys, "diff", tmp_path, "-1", "latest")
    assert (code, err) == (0, "")
    *_, summary, note = out.splitlines()
    assert " 0 changed" not in summary, out  # ids[0] against ids[1]
    assert note.startswith(f"latest is {ids[1]}: skipped {ids[2]} (chunk ")
    code, out, _ = run(capsys, "show", tmp_path, "-1")
    assert code == 0 and out.startswith(f"id:        {ids[0]}\nskipped:   {ids[2]} (chunk ")
    code, out, _ = run(capsys, "export", tmp_path, "-1", tmp_path / "m.pt")
    assert code == 0 and out.endswith(f", checkpoint {ids[0]})\n")
    code, out, err = run(capsys, "show", tmp_path, "-2")
    assert (code, out) == (1, "") and err == (
        f"ckpt-nb: only 2 checkpoints from latest ({ids[1]}) back: -2 is too far back; "
        "-1 is the oldest\n")
    code, out, _ = run(capsys, "diff", tmp_path, "-0", "latest")
    assert code == 0 and out.splitlines()[-1] == (
        f"-0 and latest are the same checkpoint, {ids[1]}")
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "and '-N' counts back from that one" in " ".join(out.split())


def test_export_latest_says_the_checkpoints_it_passed_over_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """export said a warning per checkpoint passed over (201 lines for a store of 200
    sharing a damaged chunk), and where none verified, no advice."""
    ids, packs = saved(tmp_path, 4)
    for pack in packs[1:]:
        flip_byte_in_blobs(pack)
    with pytest.warns(UserWarning) as said:
        code, out, _ = run(capsys, "export", tmp_path, "latest", tmp_path / "m.pt")
    assert code == 0 and out.endswith(f", checkpoint {ids[0]})\n")
    assert len(said) == 1, [str(w.message) for w in said]
    assert re.fullmatch(f"skipping checkpoint {ids[3]}, which fails verification \\(.*\\); "
                        "and 2 more: 'latest' is the newest checkpoint that verifies "
                        f"\\(`ckpt-nb verify {tmp_path.as_uri()}` names what is damaged\\)",
                        str(said[0].message))
    flip_byte_in_blobs(packs[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning a checkpoint)
        code, out, err = run(capsys, "export", tmp_path, "latest", tmp_path / "m.pt")
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert re.fullmatch(f"ckpt-nb: no checkpoint in {tmp_path} passes verification \\(4 "
                        f"checkpoints tried, the newest {ids[3]}, which fails verification .*"
                        f"\\): `ckpt-nb verify {tmp_path}` names what is damaged; .*\n", err)
