"""The check of a manifest's storages and tensors' layouts (``_format._manifest_problem``):
its fast path for what a save writes refuses exactly what the record-by-record checks
refuse, with the same words, and leaves those checks to the records it does not accept
(they took 3 us a tensor: 0.2 s for a manifest of 60,000 tensors, at each read)."""

from __future__ import annotations

import copy
import hashlib
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_nb import CheckpointManager
from ckpt_nb import _format
from ckpt_nb._format import (_manifest_problem, _storage_fits, _tensor_problem,
                             decode_manifest, manifest_key)


def record_by_record(manifest: dict[str, Any]) -> str | None:
    """What ``_manifest_problem`` says of a manifest whose frame holds, judged by the
    checks of one storage and one tensor at a time."""
    storages, tensors = manifest["storages"], manifest["tensors"]
    if not all(_storage_fits(storage) for storage in storages):
        return "a storage's chunks do not add up to its size"
    for index, tensor in enumerate(tensors):
        problem = _tensor_problem(tensor, storages)
        if problem:
            return f"tensor {index} ({str(tensor.get('name'))[:80]!r}): {problem}"
    return None


def digest(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def sound_manifest() -> dict[str, Any]:
    """Storages of each kind, and tensors in them as saves lay them out (a view, a
    transposed one, a scalar, an empty one)."""
    storages: list[Any] = [
        {"name": "a", "nbytes": 96, "chunks": [[digest(0), 64], [digest(1), 32]]},
        {"name": "b", "nbytes": 40, "kind": "tensor", "chunks": [[digest(2), 40]]},
        {"name": "p", "nbytes": 7, "kind": "pickle", "chunks": [[digest(3), 7]]},
        {"name": "e", "nbytes": 0, "chunks": []},
    ]
    tensors: list[Any] = [
        {"name": "w", "storage": 0, "offset": 0, "shape": [4, 6], "stride": [6, 1],
         "dtype": "float32"},
        {"name": "wt", "storage": 0, "offset": 0, "shape": [6, 4], "stride": [1, 6],
         "dtype": "float32"},
        {"name": "row", "storage": 0, "offset": 18, "shape": [6], "stride": [1],
         "dtype": "float32"},
        {"name": "s", "storage": 1, "offset": 4, "shape": [], "stride": [], "dtype": "float64"},
        {"name": "h", "storage": 1, "offset": 0, "shape": [20], "stride": [1],
         "dtype": "bfloat16"},
        {"name": "none", "storage": 3, "offset": 0, "shape": [0, 5], "stride": [5, 1],
         "dtype": "int64"},
    ]
    return {"format": 3, "storages": storages, "tensors": tensors, "state": {}}


ODD_VALUES: list[Any] = [True, False, None, 1.5, 1.0, -1, 0, 1, 3, 5, 20, 24, 96, 97,
                         (1 << 63) - 1, 1 << 63, 1 << 64, 1 << 80, "3", [1], {}, [],
                         "float32", "float8_e4m3fn", "no_such_dtype", digest(9),
                         digest(9).upper(), digest(9)[:63], [digest(9), 96], [digest(9)]]
TENSOR_KEYS = ["storage", "offset", "shape", "stride", "dtype", "name"]
STORAGE_KEYS = ["nbytes", "chunks", "name", "kind"]


def damaged_copy(rng: random.Random) -> dict[str, Any]:
    """A sound manifest with one to three of its records' fields changed or dropped."""
    manifest = copy.deepcopy(sound_manifest())
    for _ in range(rng.randint(1, 3)):
        storages, tensors = manifest["storages"], manifest["tensors"]
        where = rng.random()
        if where < 0.6:
            record, keys = rng.choice(tensors), TENSOR_KEYS
        elif where < 0.85:
            record = rng.choice(storages)
            if not isinstance(record, dict):
                continue
            keys = STORAGE_KEYS
        else:  # (inside a list: a size, a stride, a chunk, a chunk's digest or size)
            record = rng.choice([*(t[k] for t in tensors for k in ("shape", "stride")
                                   if isinstance(t.get(k), list) and t[k]),
                                 *(c for s in storages if isinstance(s, dict)
                                   and isinstance(s.get("chunks"), list)
                                   for c in s["chunks"] if isinstance(c, list) and c)])
            keys = list(range(len(record)))
        key = rng.choice(keys)
        if isinstance(record, dict) and rng.random() < 0.15:
            record.pop(key, None)
        else:
            record[key] = copy.deepcopy(rng.choice(ODD_VALUES))
        if rng.random() < 0.05:
            storages[rng.randrange(len(storages))] = rng.choice(ODD_VALUES)
    return manifest


def test_the_fast_path_refuses_exactly_what_the_record_checks_refuse() -> None:
    rng = random.Random(7)
    said: set[str | None] = set()
    for _ in range(20_000):
        manifest = damaged_copy(rng)
        expected = record_by_record(manifest)
        assert _manifest_problem(manifest) == expected, manifest
        said.add(expected and expected.split(":")[-1][:20])
    assert _manifest_problem(sound_manifest()) is None
    assert len(said) > 8  # (many kinds of damage met, and sound manifests too)
    assert None in said


@pytest.mark.parametrize("shape, stride, offset, ok", [
    ([1 << 40, 1 << 23, 0], [0, 0, 0], 0, True),  # (no element: torch takes it)
    ([1 << 40, 1 << 40, 0], [0, 0, 0], 0, False),  # (its product passes 64 bits first)
    ([24], [1], 0, True), ([25], [1], 0, False), ([2, 12], [12, 1], 0, True),
    ([24], [1], 1, False), ([], [], 23, True), ([], [], 24, False), ([3], [0], 23, True),
])
def test_a_layout_at_the_edge_of_its_storage(shape: list[int], stride: list[int],
                                             offset: int, ok: bool) -> None:
    manifest = sound_manifest()
    manifest["tensors"][0].update(shape=shape, stride=stride, offset=offset)
    assert (_manifest_problem(manifest) is None) == ok
    assert _manifest_problem(manifest) == record_by_record(manifest)


def test_a_saved_manifest_is_checked_without_the_record_by_record_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A manifest as a save writes it, of thousands of tensors, is read by the fast path
    alone; a damaged one is still named by the record's own check."""
    model = torch.nn.ModuleList(torch.nn.Linear(3, 2) for _ in range(1500))
    model.append(torch.nn.Linear(8, 4).half())
    tied = torch.nn.Linear(5, 5)
    with CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(model, tied=tied, extra={"t": torch.arange(10.0)[2:8].view(2, 3).t()})
    blob = (tmp_path / manifest_key(cid)).read_bytes()
    judged: list[str] = []
    real = _format._tensor_problem

    def counted(tensor: dict[str, Any], storages: list[dict[str, Any]]) -> str | None:
        judged.append(tensor["name"])
        return real(tensor, storages)

    monkeypatch.setattr(_format, "_tensor_problem", counted)
    manifest = decode_manifest(blob, cid)
    assert len(manifest["tensors"]) > 3000
    assert judged == []
    manifest["tensors"][-1]["offset"] += 10 ** 6
    assert _manifest_problem(manifest).startswith(f"tensor {len(manifest['tensors']) - 1} ")
    assert judged == [manifest["tensors"][-1]["name"]]
