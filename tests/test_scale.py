"""Memory and time that grow with a model or a store no faster than they must: diff reads
only what changed, verify decodes each chunk of a delta chain once, and an export to
safetensors writes from the loaded checkpoint without copies of it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Holder, same_safetensors_file
from safetensors import safe_open
from safetensors.torch import save_file

from ckpt_nb import CheckpointManager
from ckpt_nb import _codec as codec


def _peak_mib(script: str) -> dict[str, float]:
    """What ``script`` prints as JSON, run in a fresh process: there ``start()`` gives
    its resident memory in MiB and ``peak()`` the most it held since (Linux's VmHWM)."""
    prelude = textwrap.dedent("""\
        import json, re, torch
        from ckpt_nb import CheckpointManager
        def status(field):
            with open("/proc/self/status") as status:
                return int(re.search(field + r":\\s+(\\d+)", status.read()).group(1)) / 1024
        def start():
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")
            return status("VmRSS")
        def peak():
            return status("VmHWM")
    """)
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(digest, raw bytes) of each chunk decoded from now on, by the real decoder."""
    decoded: list[tuple[str, int]] = []
    real = codec.decode_many

    def decode_many(jobs: Any) -> Any:
        decoded.extend((digest, len(out)) for _, out, _, digest in jobs)
        return real(jobs)

    monkeypatch.setattr(codec, "decode_many", decode_many)
    return decoded


def _old_norms(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """diff's l2 and rel_change as they were computed, on the whole tensors at once."""
    either = a.is_complex() or b.is_complex()
    da, db = ((t.resolve_conj().to(torch.complex128) if either else t.double()) for t in (a, b))
    l2 = float(torch.linalg.vector_norm(db - da))
    return l2, l2 / float(torch.linalg.vector_norm(da))


def test_diff_gives_the_norms_of_the_whole_tensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    z = torch.randn(6, 5, dtype=torch.complex64)
    before = {"w": torch.randn(40, 30), "t": torch.randn(30, 40).t(), "same": torch.randn(100),
              "h": torch.randn(8, 8, dtype=torch.bfloat16), "z": z, "conj": z.conj(),
              "big": torch.randn(2_100_000), "gone": torch.ones(3), "shape": torch.zeros(4, 4)}
    after = {"w": before["w"] + 0.01 * torch.randn(40, 30), "t": torch.randn(40, 30),
             "same": before["same"], "h": before["h"].float() + 1, "z": z * 1.5,
             "conj": (z * 1.5).conj(), "big": before["big"] + torch.randn(2_100_000),
             "new": torch.ones(2), "shape": torch.zeros(16)}
    with CheckpointManager(tmp_path) as mgr:
        a, b = mgr.save(s=Holder(before)), mgr.save(s=Holder(after))
        table = mgr.diff(a, b).set_index("tensor")
    for name in ("w", "t", "h", "z", "conj"):  # (one block: the very same sums)
        row = table.loc[f"objects/s/{name}"]
        assert row["status"] == "changed" and not row["same_chunks"], name
        assert (row["l2"], row["rel_change"]) == _old_norms(before[name], after[name]), name
    big = table.loc["objects/s/big"]  # (16 MiB in double: blocks, summed otherwise)
    assert (big["l2"], big["rel_change"]) == pytest.approx(
        _old_norms(before["big"], after["big"]), rel=1e-12)
    assert table.loc["objects/s/h", "dtype"] == "bfloat16->float32"
    assert table.loc["objects/s/same", ["status", "same_chunks", "l2"]].tolist() == [
        "identical", True, 0.0]
    assert table.loc["objects/s/gone", "status"] == "removed"
    assert table.loc["objects/s/new", ["status", "shape"]].tolist() == ["added", (2,)]
    assert table.loc["objects/s/shape", ["status", "shape"]].tolist() == [
        "reshaped", "(4, 4)->(16,)"]


def test_diff_reads_no_tensor_whose_chunks_are_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It decoded both checkpoints whole, a large frozen tensor too."""
    frozen = torch.randn(1024, 1024)  # 4 MiB
    with CheckpointManager(tmp_path) as mgr:
        a = mgr.save(s=Holder({"frozen": frozen, "head": torch.zeros(10)}))
        b = mgr.save(s=Holder({"frozen": frozen, "head": torch.ones(10)}))
        decoded = _counting_decodes(monkeypatch)
        table = mgr.diff(a, b).set_index("tensor")
    assert table.loc["objects/s/frozen", "status"] == "identical"
    assert table.loc["objects/s/head", "l2"] == pytest.approx(10 ** 0.5)
    assert sum(n for _, n in decoded) < 1 << 20


def test_diff_decodes_a_storage_many_tensors_view_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Views of one storage larger than a batch (a flat parameter buffer) each decoded the
    whole storage again: ten views of 80 MB, 1.5 GB decoded."""
    from ckpt_nb import _manager
    monkeypatch.setattr(_manager, "_DIFF_BATCH_BYTES", 1 << 20)  # (the storage: 4 MiB)
    flat = torch.randn(1 << 20)
    views = {f"w{i}": flat[i << 16:(i + 1) << 16].view(256, 256) for i in range(16)}
    with CheckpointManager(tmp_path) as mgr:
        a = mgr.save(s=Holder(views))
        with torch.no_grad():
            flat += 0.01
        b = mgr.save(s=Holder(views))
        decoded = _counting_decodes(monkeypatch)
        table = mgr.diff(a, b)
    views_rows = table[table["tensor"].str.startswith("objects/s/")]
    assert (views_rows["status"] == "changed").all() and len(views_rows) == 16
    assert sum(n for _, n in decoded) == 2 * flat.numel() * 4


def test_diff_of_a_large_tensor_takes_memory_for_the_two_sides_not_their_doubles(
        tmp_path: Path) -> None:
    """Each side cast to double, and their difference: 8 times the tensor (2.4 GB for a
    300 MiB one). Now the two decoded sides and two 16 MiB blocks."""
    n = 16 << 20  # 64 MiB of float32, compressible: the packs mapped in memory are small
    with CheckpointManager(tmp_path) as mgr:
        w = (torch.arange(n) % 7).float()
        a = mgr.save(s=Holder({"w": w}))
        w[:1000] += 1
        b = mgr.save(s=Holder({"w": w}))
    found = _peak_mib(f"""
        mgr = CheckpointManager({str(tmp_path)!r})
        before = start()
        row = mgr.diff({a!r}, {b!r}).iloc[0]
        print(json.dumps({{"extra": peak() - before, "l2": row["l2"]}}))
    """)
    assert found["l2"] == pytest.approx(1000 ** 0.5)
    assert found["extra"] < 4 * 64  # (it was 8 times)


def test_verify_decodes_each_chunk_of_a_delta_chain_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each chunk was decoded through its whole chain of bases, each time: 200 saves
    of a chain took 32 s to verify, 100 took 8.5 s."""
    torch.manual_seed(0)
    w = torch.randn(64, 256)  # 4 chunks of 16 KiB
    with CheckpointManager(tmp_path, strategy="incremental", full_every=1000,
                           chunk_size=1 << 14) as mgr:
        for step in range(12):
            w += 1e-3 * torch.randn_like(w)
            mgr.save(s=Holder({"w": w}), step=step)
        chunks = mgr.catalog.chunks({d for r in mgr.catalog.checkpoints()
                                     for d in mgr.catalog.refs(r.id)})
    assert sum(row.base is not None for row in chunks.values()) >= 4 * 11  # (deltas)
    decoded = _counting_decodes(monkeypatch)
    assert CheckpointManager(tmp_path).verify().ok
    assert sorted(digest for digest, _ in decoded) == sorted(chunks)


def test_verify_reads_each_chunks_row_once_over_a_delta_chain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each checkpoint asked the catalog for its chunks' whole chain of bases again, and
    opened every pack of it: 200 chained saves verified in 1.5 s, 4x the time of 100."""
    from ckpt_nb._catalog import Catalog
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    with CheckpointManager(tmp_path, strategy="incremental", full_every=1000,
                           chunk_size=1 << 14) as mgr:
        for step in range(30):
            w += 1e-3 * torch.randn_like(w)
            mgr.save(s=Holder({"w": w}), step=step)
    asked: list[int] = []
    real = Catalog.chunks

    def chunks(self: Catalog, digests: Any) -> Any:
        asked.append(len(digests))
        return real(self, digests)

    monkeypatch.setattr(Catalog, "chunks", chunks)
    assert CheckpointManager(tmp_path).verify().ok
    assert sum(asked) <= 6 * 30, asked  # (each chunk once, RNG states too: it was 1920)


def test_verify_finds_a_flipped_byte_deep_in_a_delta_chain(tmp_path: Path) -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    with CheckpointManager(tmp_path, strategy="incremental", full_every=1000,
                           chunk_size=1 << 14) as mgr:
        ids = []
        for step in range(12):
            w += 1e-3 * torch.randn_like(w)
            ids.append(mgr.save(s=Holder({"w": w}), step=step))
        own = mgr.catalog.refs(ids[5]) - mgr.catalog.refs(ids[4])
        row = max(mgr.catalog.chunks(own).values(), key=lambda r: r.raw_len)
    assert row.base is not None
    pack = tmp_path / row.pack
    data = bytearray(pack.read_bytes())
    data[row.offset + row.length // 2] ^= 0xFF
    pack.write_bytes(bytes(data))
    report = CheckpointManager(tmp_path).verify()
    assert report.checked == ids
    assert list(report.bad) == ids[5:]  # (the later ones' chunks are deltas on it)
    assert all(any(row.digest[:12] in p for p in report.bad[cid]) for cid in ids[5:])


def test_an_export_to_safetensors_is_what_save_file_writes_of_plain_copies(
        tmp_path: Path) -> None:
    """Shared storages (a tied weight, a complex tensor and its real part), a
    transposed view, a conjugate: the file is byte for byte the one of old."""
    torch.manual_seed(0)
    z, w = torch.randn(4, 3, dtype=torch.complex64), torch.randn(5, 6)
    state = {"z": z, "real": z.real, "w": w, "tied": w, "t": torch.randn(6, 5).t(),
             "conj": torch.randn(3, dtype=torch.complex64).conj(), "x": torch.arange(7)}
    with CheckpointManager(tmp_path) as mgr:
        path = mgr.export(mgr.save(s=Holder(state)), tmp_path / "out.safetensors")
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    for name, value in state.items():
        assert torch.equal(tensors[f"s/{name}"], value.resolve_conj()), name
    plain = {name: t.contiguous().clone() for name, t in tensors.items()}
    save_file(plain, tmp_path / "plain.safetensors", metadata=meta)
    assert same_safetensors_file(path, tmp_path / "plain.safetensors")


def test_an_export_to_safetensors_takes_no_memory_beyond_the_loaded_checkpoint(
        tmp_path: Path) -> None:
    """It copied the state twice over after loading it (+1204 MiB for a 400 MiB one)."""
    with CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(s=Holder({f"w{i}": (torch.arange(4 << 20) % 5).float() + i
                                 for i in range(4)}))  # 64 MiB, compressible
    found = _peak_mib(f"""
        mgr = CheckpointManager({str(tmp_path)!r})
        before = start()
        mgr.load({cid!r})  # (its memory is kept, and the export's load takes it again)
        load = peak() - before
        before = start()
        mgr.export({cid!r}, {str(tmp_path / "out.safetensors")!r})
        print(json.dumps({{"load": load, "export": peak() - before}}))
    """)
    assert found["load"] > 48 and found["export"] < 32  # (it was 128 more)
