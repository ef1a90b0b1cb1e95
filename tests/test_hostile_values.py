"""Values in a hostile store that name a dtype or a size: a read refuses them as damage
before it asks for their memory, and restore('latest') passes over their checkpoint."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import warm_python
import zstandard
from test_hostile import catalog, rewrite_manifest

import ckpt_nb
from ckpt_nb import CheckpointManager, CorruptCheckpointError
from ckpt_nb._discovery import RandomState
from ckpt_nb._format import RUN_KEY

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (a rollback test below)


def changed(store: Path, cid: str, change: Callable[[dict[str, Any]], Any]) -> None:
    """Checkpoint ``cid``'s manifest changed by ``change``, its digest in the catalog
    cleared (as a store's author would, so that only the values' own checks are left)."""
    rewrite_manifest(store, cid, change)
    catalog(store).execute("UPDATE checkpoints SET manifest_digest=''")


def saved_twice(store: Path) -> tuple[str, str, dict[str, Any]]:
    """Two checkpoints of a notebook's MT19937 generator (its state as JSON text), and the
    first one's state."""
    rng = np.random.RandomState(0)
    with CheckpointManager(store) as mgr:
        good = mgr.save(gen=RandomState(rng))
        first = rng.get_state(legacy=False)
        rng.random_sample(10)
        bad = mgr.save(gen=RandomState(rng))
    return good, bad, first


@pytest.mark.parametrize("dtype", ["U1000", "float64", "uint8"])
def test_a_generator_array_of_a_dtype_no_generator_has_is_damage_latest_passes_over(
        tmp_path: Path, dtype: str) -> None:
    """The dtype came from the store: "U500000000" asked NumPy for 7.45 GiB, and a
    restore('latest') raised NumPy's error instead of taking the checkpoint before."""
    good, bad, first = saved_twice(tmp_path)

    def change(manifest: dict[str, Any]) -> dict[str, Any]:
        state = json.loads(manifest["state"]["objects"]["gen"]["numpy"])
        state["state"]["key"]["dtype"] = dtype
        manifest["state"]["objects"]["gen"]["numpy"] = json.dumps(state)
        return manifest

    changed(tmp_path, bad, change)
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {bad}: gen: .*'{dtype}'"):
        mgr.load(bad)
    rng = np.random.RandomState(9)
    with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
        assert mgr.restore("latest", gen=rng).id == good
    assert np.array_equal(rng.get_state(legacy=False)["state"]["key"], first["state"]["key"])


def test_a_numpy_scalar_of_a_kind_no_save_writes_is_damage(tmp_path: Path) -> None:
    """np.void(n) is n bytes: a manifest's {"__npscalar__": "V8", "value": 10**10} asked
    for 10 GB."""
    with CheckpointManager(tmp_path) as mgr:
        good = mgr.save(extra={"x": np.float32(1.5)})
        bad = mgr.save(extra={"x": np.float32(2.5)})

    def change(manifest: dict[str, Any]) -> dict[str, Any]:
        manifest["state"]["extra"]["x"] = {"__npscalar__": "V8", "value": 1 << 20}
        return manifest

    changed(tmp_path, bad, change)
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(CorruptCheckpointError, match=r"extra/x: a NumPy scalar of dtype \|V8"):
        mgr.load(bad)
    with pytest.warns(UserWarning, match=f"skipping checkpoint {bad}"):
        assert mgr.load("latest").extra == {"x": np.float32(1.5)}
    assert mgr.load(good).id == good


def trained_in_a_cell_then_changed(store: Path, change: Callable[[dict[str, Any]], Any]
                                   ) -> dict[str, Any]:
    """A step of a cell's training, holding a frame, checkpointed, its manifest changed by
    ``change``; and a namespace to roll back into, of a fresh model and lr 0.5."""
    model = torch.nn.Linear(2, 2)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
          "frame": pd.DataFrame({"a": [1, 2, 3, 4]}), "lr": 0.25}
    with ckpt_nb.auto(str(store), namespace=ns, name="cell", every_steps=1):
        for _, x in ckpt_nb.batches([torch.ones(1, 2)]):
            ns["opt"].zero_grad()
            ns["model"](x).sum().backward()
            ns["opt"].step()
            ckpt_nb.log(loss=1.0)
    changed(store, CheckpointManager(store).list()["id"].iloc[-1], change)
    fresh = torch.nn.Linear(2, 2)
    return {"model": fresh, "opt": torch.optim.SGD(fresh.parameters(), lr=0.1), "lr": 0.5}


def test_a_frame_column_of_a_dtype_no_frame_has_is_left_out_of_a_rollback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The dtypes a frame is put back with are the store's: "V500000000" made its 4 rows
    take 2 GB."""
    def change(manifest: dict[str, Any]) -> dict[str, Any]:
        pairs = manifest["state"]["extra"][RUN_KEY]["variables"]["frame"]["__dict__"]
        next(pair for pair in pairs if pair[0] == "dtypes")[1] = ["V16000"]
        return manifest

    back = trained_in_a_cell_then_changed(tmp_path, change)
    capsys.readouterr()
    ckpt_nb.rollback("latest", directory=tmp_path, namespace=back)
    assert back["lr"] == 0.25 and "frame" not in back
    assert "frame (CorruptCheckpointError: a column of dtype 'V16000', which no frame has" \
        in capsys.readouterr().out


def test_a_metric_history_whose_counts_no_values_bound_is_a_malformed_run_record(
        tmp_path: Path) -> None:
    """A run of records with no metrics was made as many times as the store said: 10**12
    empty dicts for a few bytes of JSON."""
    def change(manifest: dict[str, Any]) -> dict[str, Any]:
        manifest["state"]["extra"][RUN_KEY]["history"] = {
            "keys": [[]], "runs": [[0, 1 << 20]], "columns": {}}
        return manifest

    back = trained_in_a_cell_then_changed(tmp_path, change)
    with pytest.raises(CorruptCheckpointError, match="its metric history: .*records of no "
                                                     "metrics"):
        ckpt_nb.rollback("latest", directory=tmp_path, namespace=back)
    assert back["lr"] == 0.5


# Two checkpoints saved into argv[1], its catalog deleted, and a 1 GiB file named like a
# manifest (sparse: it takes no disk) holding argv[2]'s head; then, with 256 MiB more
# address space (RLIMIT_AS) than the process has, the store opened, the file put in place
# of the first checkpoint's manifest and that one loaded: the load's error, whether the
# rebuild listed both checkpoints, and what it said.
BIG_FILE_AS_A_MANIFEST = """
import os, resource, sys, warnings
import torch
from ckpt_nb import CheckpointManager
store = sys.argv[1]
with CheckpointManager(store) as mgr:
    ids = [mgr.save(model=torch.nn.Linear(4, 4), step=step) for step in range(2)]
    mgr.list()  # (pandas imported before the limit)
for name in os.listdir(store):
    if name.startswith("catalog.sqlite"):
        os.remove(os.path.join(store, name))
with open(os.path.join(store, "manifests", "abcdef0123.json.zst"), "wb") as f:
    f.write(bytes.fromhex(sys.argv[2]))
    f.truncate(1 << 30)
size = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    listed = list(CheckpointManager(store).list()["id"])
    os.replace(os.path.join(store, "manifests", "abcdef0123.json.zst"),
               os.path.join(store, "manifests", ids[0] + ".json.zst"))
    try:
        CheckpointManager(store).load(ids[0])
    except Exception as exc:
        print(type(exc).__name__, exc)
print(listed == ids)
print(*[str(w.message) for w in said], sep="\\n")
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("head", [
    pytest.param(b"", id="zeros"),
    # a zstd frame's header that says 100 bytes, with the rest of the file after it
    pytest.param(zstandard.ZstdCompressor().compress(b"x" * 100)[:6], id="a frame of 100 bytes")])
def test_a_huge_file_named_like_a_manifest_is_left_out_unread(tmp_path: Path,
                                                             head: bytes) -> None:
    """A rebuild read such a file whole to find it is no manifest: 3 GB of memory for a
    3 GB sparse file, which takes no room on disk (on S3 three times the object's size)."""
    done = warm_python.run([sys.executable, "-c", BIG_FILE_AS_A_MANIFEST, str(tmp_path),
                           head.hex()])
    assert done.returncode == 0, done.stderr[-2000:]
    loaded, listed, said = done.stdout.split("\n", 2)
    assert loaded.startswith("CorruptCheckpointError manifest of checkpoint ") and \
        " is unreadable: " in loaded, loaded
    assert listed == "True"
    assert "left out: checkpoint abcdef0123 (manifest of checkpoint abcdef0123 is " \
        "unreadable: " in said and "manifests/abcdef0123.json.zst" in said, said
