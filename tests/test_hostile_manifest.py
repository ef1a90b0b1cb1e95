"""Manifests made to take a reader's memory, and state nodes that name another tensor: each
is damage named by its checkpoint (so "latest" passes over it, verify() lists it and a
rebuild leaves it out), never a bare MemoryError, an OOM-killed kernel or another value."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import blake3
import pytest
import torch
import zstandard
from test_hostile import catalog, lose_catalog, rewrite_manifest, two_saves

from ckpt_nb import CaptureError, CheckpointManager, CorruptCheckpointError


def pad_with_zeros(store: Path, cid: str, zeros: int) -> None:
    """Gives a checkpoint's manifest a list of ``zeros`` zeros (a frame of a few hundred KB
    that inflates to twice as many bytes), its digest updated in the catalog: a store
    made to take its reader's memory."""
    path = store / "manifests" / f"{cid}.json.zst"
    text = json.dumps(json.loads(zstandard.ZstdDecompressor().decompress(path.read_bytes())))
    frame = io.BytesIO()
    with zstandard.ZstdCompressor(level=1, write_checksum=True).stream_writer(
            frame, closefd=False) as out:
        out.write(text[:-1].encode() + b', "pad": [')
        block = b"0," * (8 << 20)
        for start in range(0, zeros - 1, 8 << 20):
            out.write(block[: 2 * min(8 << 20, zeros - 1 - start)])
        out.write(b"0]}")
    path.write_bytes(frame.getvalue())
    catalog(store).execute("UPDATE checkpoints SET manifest_digest=? WHERE id=?",
                           (blake3.blake3(frame.getvalue()).hexdigest(), cid))


def test_a_frame_of_a_billion_zeros_is_damage_that_latest_verify_and_a_rebuild_pass_over(
        tmp_path: Path) -> None:
    """300 MB of JSON zeros under the 4 GiB the frame may hold: json.loads made them 1.2 GB
    of list (a 1.2 GB frame of 115 KB took 5 GB: a bare MemoryError in a process with
    less, a kernel OOM-killed in one without a cap), and a store without its catalog did
    not open."""
    good, bad = two_saves(tmp_path)
    pad_with_zeros(tmp_path, bad, 150_000_000)
    assert (tmp_path / "manifests" / f"{bad}.json.zst").stat().st_size < 1 << 20
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {bad} is unreadable: it "
                                                     "holds more than any manifest"):
        mgr.load(bad)
    assert list(mgr.verify().bad) == [bad]
    with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
        assert mgr.restore("latest", model=torch.nn.Linear(64, 64)).id == good
    mgr.close()
    lose_catalog(tmp_path)
    with pytest.warns(RuntimeWarning, match=f"left out: checkpoint {bad}"):
        mgr = CheckpointManager(tmp_path)
    assert mgr.list()["id"].tolist() == [good]
    assert mgr.load(good).epoch == 0


def test_a_manifest_that_does_not_fit_in_memory_is_damage_by_name(tmp_path: Path) -> None:
    """A manifest under the limit that a process with less memory cannot parse (here 60
    million zeros, 0.5 GB of list, in a process allowed 0.3 GB more): a bare MemoryError
    ended restore("latest") where it should pass over it."""
    good, bad = two_saves(tmp_path)
    pad_with_zeros(tmp_path, bad, 60_000_000)
    code = textwrap.dedent(f"""
        import resource, warnings, torch
        from ckpt_nb import CheckpointManager, CorruptCheckpointError
        mgr = CheckpointManager({str(tmp_path)!r})
        model = torch.nn.Linear(64, 64)
        mgr.load({good!r})
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) << 10 for line in status
                        if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + (300 << 20), resource.RLIM_INFINITY))
        try:
            mgr.load({bad!r})
        except CorruptCheckpointError as exc:
            print("refused:", exc)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            print("latest:", mgr.restore("latest", model=model).id)
        print("warned:", [str(w.message) for w in caught])
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"refused: manifest of checkpoint {bad} is unreadable: it does not fit in this " \
           "process's memory" in done.stdout
    assert f"latest: {good}" in done.stdout and f"skipping checkpoint {bad}" in done.stdout


def test_the_largest_variable_a_session_captures_reads_back(tmp_path: Path) -> None:
    """A notebook's list of 6.6 million short strings (a vocabulary), just under the 100 MiB
    a session captures by default, of a kind whose JSON takes 7 times its size to read:
    its manifest is over the size read without counting, and reads back whole."""
    from ckpt_nb._discovery import plain_size

    tokens = [f"w{i}" for i in range(6_600_000)]
    assert plain_size(tokens) <= 100 << 20
    with CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(torch.nn.Linear(2, 2), extra={"tokens": tokens})
    frame = (tmp_path / "manifests" / f"{cid}.json.zst").read_bytes()
    assert len(zstandard.ZstdDecompressor().decompress(frame)) > 38 << 20
    assert CheckpointManager(tmp_path).load(cid).extra["tokens"] == tokens


def test_a_save_whose_values_would_take_over_4_gib_to_read_is_refused_and_keeps_the_store(
        tmp_path: Path) -> None:
    """44 million empty strings are 176 MB of JSON, and would parse into 0.4 GB (4.1 GiB
    by the count a read makes, which cannot tell them from 44 million strings of a few
    characters, near 3 GB): a save wrote what every read then refused as damage."""
    with CheckpointManager(tmp_path) as mgr:
        kept = mgr.save(torch.nn.Linear(2, 2), epoch=0)
        with pytest.raises(CaptureError, match="would take up to 4[0-9]{3} MiB of memory to "
                                               "read back, over the 4 GiB a manifest may"):
            mgr.save(torch.nn.Linear(2, 2), epoch=1, extra={"names": [""] * 44_000_000})
        assert mgr.list()["id"].tolist() == [kept]
    assert len(list((tmp_path / "manifests").iterdir())) == 1
    assert CheckpointManager(tmp_path).load(kept).epoch == 0


@pytest.mark.parametrize("node", [{"__tensor__": -1}, {"__tensor__": True},
                                  {"__ndarray__": -1, "dtype": "<f4"},
                                  {"__bytes__": -2, "type": "bytes"}, {"__floats__": -1},
                                  {"__generator__": -1}],
                         ids=["tensor -1", "tensor true", "ndarray -1", "bytes -2",
                              "floats -1", "generator -1"])
def test_a_state_node_that_names_a_tensor_from_the_end_is_damage(
        tmp_path: Path, node: dict[str, Any]) -> None:
    """Python's lists take -1 as the last item: {"__tensor__": -1} loaded the model's bias
    where 999 was refused."""
    good, bad = two_saves(tmp_path)

    def change(manifest: dict[str, Any]) -> dict[str, Any]:
        manifest["state"]["extra"]["value"] = node
        return manifest

    rewrite_manifest(tmp_path, bad, change)
    catalog(tmp_path).execute("UPDATE checkpoints SET manifest_digest=''")
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {bad}: its manifest does "
                                                     "not describe a state .*names tensor"):
        mgr.load(bad)
    with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
        assert mgr.restore("latest", model=torch.nn.Linear(64, 64)).id == good
