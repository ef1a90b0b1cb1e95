"""``CheckpointManager.diff_values``: the values a diff of tensors does not show (an
optimizer's lr, a scheduler's state, step, ``extra``, a notebook's variables), read from
the manifests of real saves, a pickle compared by its bytes and never unpickled."""

from __future__ import annotations

import enum
import sys
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

import ckpt_nb
from ckpt_nb import CheckpointManager, CorruptCheckpointError
from ckpt_nb._diff_values import UnloadedValue, diff_value_text, diff_value_texts
from test_hostile import catalog, damaged, rewrite_manifest
import warm_python  # (fresh interpreters forked from a warm one)

UNPICKLED: list[str] = []  # what a Tripwire's unpickling recorded


def _tripped(label: str) -> str:
    UNPICKLED.append(label)
    return label


class Tripwire:
    """A pickled value whose unpickling is seen (it calls ``_tripped``)."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __reduce__(self) -> tuple[Any, ...]:
        return _tripped, (self.label,)


class Color(enum.Enum):
    RED = 1
    BLUE = 2


def rows(frame: Any) -> dict[str, tuple[str, Any, Any]]:
    return {r.path: (r.status, r.a, r.b) for r in frame.itertuples()}


def test_an_lr_change_and_extra_values_are_listed_beside_the_tensors(tmp_path: Path) -> None:
    """The tester's repro: two saves differing in the optimizer's lr and in extra showed
    'byte-identical: 2 of 2 tensors' and nothing else."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)
    with CheckpointManager(tmp_path) as mgr:
        a = mgr.save(model, optimizer, 0, scheduler=scheduler, step=10, rng=False,
                     extra={"lr_note": "lr 0.1", "batch": 32, "gone": True,
                            "cfg": {"wd": 0.0, "betas": (0.9, 0.99)}})
        optimizer.param_groups[0]["lr"] = 0.001
        b = mgr.save(model, optimizer, 0, scheduler=scheduler, step=20, rng=False,
                     extra={"lr_note": "lr 0.001", "batch": 64, "new": [1, 2],
                            "cfg": {"wd": 0.0, "betas": (0.8, 0.99)}})
        assert mgr.diff(a, b)["status"].tolist() == ["identical", "identical"]
        values = mgr.diff_values(a, b)
        assert list(values.columns) == ["path", "status", "a", "b"]
        assert rows(values) == {
            "step": ("changed", 10, 20),
            "objects/optimizer/param_groups/0/lr": ("changed", 0.1, 0.001),
            "extra/lr_note": ("changed", "lr 0.1", "lr 0.001"),
            "extra/batch": ("changed", 32, 64),
            "extra/gone": ("removed", True, None),
            "extra/cfg/betas": ("changed", (0.9, 0.99), (0.8, 0.99)),
            "extra/new": ("added", None, [1, 2]),
        }
        assert [type(v) for v in values["a"]] == [int, float, str, int, bool, tuple, type(None)]
        assert mgr.diff_values(b, b).empty


def test_numbers_keep_their_types(tmp_path: Path) -> None:
    """A column of ints and floats alone: pandas made step 5 a float, 5.0."""
    with CheckpointManager(tmp_path) as mgr:
        a = mgr.save(torch.nn.Linear(2, 2), step=5, rng=False, metrics={"loss": 0.5})
        b = mgr.save(torch.nn.Linear(2, 2), step=15, rng=False, metrics={"loss": 0.25})
        values = mgr.diff_values(a, b)
    assert [(r.path, r.a, r.b) for r in values.itertuples()] == [
        ("step", 5, 15), ("metrics/loss", 0.5, 0.25)]
    assert [type(v) for v in values["a"]] == [int, float]


def test_adam_betas_a_scheduler_s_state_and_the_optimizer_s_type(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(adam, step_size=1, gamma=0.5)
    with CheckpointManager(tmp_path) as mgr:
        a = mgr.save(model, adam, 1, scheduler=scheduler, rng=False)
        model(torch.ones(3, 4)).sum().backward()
        adam.step()
        scheduler.step()
        adam.param_groups[0]["betas"] = (0.5, 0.999)
        b = mgr.save(model, adam, 2, scheduler=scheduler, rng=False)
        sgd = mgr.save(model, torch.optim.SGD(model.parameters(), lr=0.01), 2, rng=False)
        found = rows(mgr.diff_values(a, b))
        assert found["epoch"] == ("changed", 1, 2)
        assert found["objects/optimizer/param_groups/0/lr"] == ("changed", 0.01, 0.005)
        assert found["objects/optimizer/param_groups/0/betas"] == (
            "changed", (0.9, 0.999), (0.5, 0.999))
        assert found["objects/scheduler/last_epoch"] == ("changed", 0, 1)
        assert found["objects/scheduler/_last_lr"] == ("changed", [0.01], [0.005])
        assert not any("/state/" in path for path in found)  # (its moments: diff's tensors)
        changed = rows(mgr.diff_values(b, sgd))
        assert changed["types/optimizer"] == (
            "changed", "torch.optim.adam.Adam", "torch.optim.sgd.SGD")
        assert changed["objects/optimizer/param_groups/0/momentum"][0] == "added"
        assert changed["objects/scheduler"][0] == "removed"


def test_pickled_values_are_compared_by_their_bytes_and_never_unpickled(
        tmp_path: Path) -> None:
    UNPICKLED.clear()
    with CheckpointManager(tmp_path) as mgr:
        a = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={
            "same": Tripwire("kept"), "other": Tripwire("one"), "color": Color.RED})
        b = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={
            "same": Tripwire("kept"), "other": Tripwire("two"), "color": Color.BLUE})
        found = rows(mgr.diff_values(a, b))
    assert UNPICKLED == []
    assert set(found) == {"extra/other", "extra/color"}
    status, old, new = found["extra/other"]
    assert status == "changed" and isinstance(old, UnloadedValue) and old != new
    size = len(pickle.dumps(Tripwire("one"), protocol=pickle.HIGHEST_PROTOCOL))
    assert diff_value_text(old).startswith(f"pickled value ({size} bytes, ")


def test_a_pickle_cut_into_chunks_of_other_sizes_is_the_same_by_its_bytes(
        tmp_path: Path) -> None:
    """Two managers of other chunk sizes cut the same pickle apart: other digests, the
    same value."""
    big = Tripwire("x" * 10_000)
    with CheckpointManager(tmp_path, chunk_size=4096) as mgr:
        a = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"obj": big})
    with CheckpointManager(tmp_path, chunk_size=8192) as mgr:
        b = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"obj": big})
        c = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"obj": Tripwire("y" * 10_000)})
        assert mgr.diff_values(a, b).empty
        assert rows(mgr.diff_values(a, c))["extra/obj"][0] == "changed"


def test_a_long_history_is_one_row_and_its_text_stays_short(tmp_path: Path) -> None:
    """A metric history of thousands (ints, records: JSON, not a tensor) must not flood
    the Diff tab nor ``ckpt-nb diff``."""
    ints = list(range(5000))
    records = [{"step": i, "loss": 1 / (i + 1)} for i in range(2000)]
    with CheckpointManager(tmp_path) as mgr:
        a = mgr.save(torch.nn.Linear(2, 2), rng=False,
                     extra={"ints": ints, "records": records})
        b = mgr.save(torch.nn.Linear(2, 2), rng=False,
                     extra={"ints": ints + [5000], "records": records + [{"step": 2000}]})
        found = rows(mgr.diff_values(a, b))
    assert list(found) == ["extra/ints", "extra/records"]
    assert found["extra/ints"][2] == ints + [5000]  # (the values themselves, whole)
    for path, count in (("extra/ints", 5001), ("extra/records", 2001)):
        text = diff_value_text(found[path][2])
        assert len(text) < 80 and text.endswith(f"({count} items)"), text


def test_floats_show_six_digits_and_all_of_them_where_six_read_the_same() -> None:
    """A cosine schedule's lr in 20 digits widened the CLI's table; cut to 6, two lrs
    apart by less would read as no change."""
    assert diff_value_texts({"status": "changed", "a": 0.0005,
                             "b": 0.00034549150281252633}) == ("0.0005", "0.000345492")
    assert diff_value_texts({"status": "changed", "a": 0.1, "b": 0.1000000001}) == (
        "0.1", "0.1000000001")
    assert diff_value_texts({"status": "added", "a": None, "b": [0.30000000000000004]},
                            missing="—") == ("—", "[0.3]")
    assert diff_value_texts({"status": "removed", "a": 5.0, "b": None}) == ("5.0", "-")


def test_a_notebook_session_s_variables_are_listed_without_its_own_records(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    namespace: dict[str, Any] = {"model": model, "opt": torch.optim.SGD(model.parameters(),
                                                                         lr=0.1),
                                 "lr": 0.1, "tag": "first"}
    with ckpt_nb.auto(str(tmp_path), namespace=namespace) as session:
        session.save(wait=True)
        namespace["lr"], namespace["tag"] = 0.01, "second"
        namespace["opt"].param_groups[0]["lr"] = 0.01
        session.save(wait=True)
    with CheckpointManager(tmp_path) as mgr:
        a, b = mgr.list()["id"]
        assert rows(mgr.diff_values(a, b)) == {
            "objects/opt/param_groups/0/lr": ("changed", 0.1, 0.01),
            "variables/lr": ("changed", 0.1, 0.01),
            "variables/tag": ("changed", "first", "second"),
        }


@pytest.mark.parametrize("damage", ["types a list", "extra 900 deep", "a pickle past the end"])
def test_a_damaged_manifest_s_values_name_the_checkpoint(tmp_path: Path, damage: str) -> None:
    with CheckpointManager(tmp_path) as mgr:
        good = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"obj": Color.RED})
        bad = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"obj": Color.BLUE})
    rewrite_manifest(tmp_path, bad, damaged(damage))
    catalog(tmp_path).execute("UPDATE checkpoints SET manifest_digest=''")
    with CheckpointManager(tmp_path) as mgr:
        for a, b in ((good, bad), (bad, good)):
            with pytest.raises(CorruptCheckpointError, match=f"checkpoint {bad}: its manifest"):
                mgr.diff_values(a, b)


def test_a_device_or_dtype_this_torch_cannot_rebuild_is_named_not_malformed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A store saved where a privateuse1 backend was renamed (``torch.device("npu:0")``):
    ``ckpt-nb diff`` printed torch's RuntimeError and no tensors; a newer torch's dtype
    was called malformed."""
    from ckpt_nb.cli import main

    script = ("import torch, ckpt_nb\ntorch.utils.rename_privateuse1_backend('npu')\n"
              f"with ckpt_nb.CheckpointManager({str(tmp_path)!r}) as mgr:\n"
              "    for i in (0, 1):\n"
              "        mgr.save(torch.nn.Linear(2, 2), rng=False, step=i, extra={\n"
              "            'device': torch.device(f'npu:{i}'), 'dtype': torch.float32,\n"
              "            'devices': [torch.device('npu:0'), i]})\n")
    warm_python.run([sys.executable, "-c", script], check=True, timeout=120)
    with pytest.raises(RuntimeError):  # (the backend is registered there, not here)
        torch.device("npu:0")
    with CheckpointManager(tmp_path) as mgr:
        a, b = mgr.list()["id"]
    rewrite_manifest(tmp_path, a, lambda manifest: manifest["state"]["extra"].update(
        dtype={"__dtype__": "float4_e9m9"}) or manifest)  # (a newer torch's)
    catalog(tmp_path).execute("UPDATE checkpoints SET manifest_digest=''")
    npu = "torch.device('npu:{}'), a device this torch does not know"
    with CheckpointManager(tmp_path) as mgr:
        found = rows(mgr.diff_values(a, b))
    assert found["extra/device"] == ("changed", UnloadedValue(npu.format(0)),
                                     UnloadedValue(npu.format(1)))
    # (a list holding one is compared item by item: the item that changed is the row)
    assert found["extra/devices/1"] == ("changed", 0, 1) and "extra/devices/0" not in found
    assert found["extra/dtype"] == (
        "changed", UnloadedValue(f"dtype float4_e9m9, which this torch ({torch.__version__}) "
                                 "lacks"), torch.float32)
    assert main(["diff", str(tmp_path), a, b]) == 0
    out = capsys.readouterr().out
    assert "objects/model/weight" in out and npu.format(1) in out


@pytest.mark.parametrize("shape", [[None, 2], ["a", "b"], [-1], "2x2", None])
def test_a_malformed_tensor_shape_among_values_names_the_checkpoint(
        tmp_path: Path, shape: Any) -> None:
    with CheckpointManager(tmp_path) as mgr:
        bad = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"t": torch.ones(2)})
        good = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"t": 1})

    def change(manifest: dict[str, Any]) -> dict[str, Any]:
        record = manifest["tensors"][manifest["state"]["extra"]["t"]["__tensor__"]]
        record["shape"] = shape
        return manifest

    rewrite_manifest(tmp_path, bad, change)
    catalog(tmp_path).execute("UPDATE checkpoints SET manifest_digest=''")
    with CheckpointManager(tmp_path) as mgr:  # (refused with the manifest, by the tensor)
        for a, b in ((good, bad), (bad, good)):
            with pytest.raises(CorruptCheckpointError, match=rf"checkpoint {bad}: its manifest "
                               r"is damaged \(tensor \d+ \('extra/t'\): its offset 0, shape"):
                mgr.diff_values(a, b)


@pytest.fixture
def unreadable_value(tmp_path: Path) -> tuple[Path, str, str]:
    """Two saves, the second's ``extra/obj`` a pickle past the end of its storages."""
    with CheckpointManager(tmp_path) as mgr:
        good = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"obj": Color.RED})
        bad = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"obj": Color.BLUE})
    rewrite_manifest(tmp_path, bad, lambda manifest: manifest["state"]["extra"].update(
        obj={"__pickle__": 99}) or manifest)
    catalog(tmp_path).execute("UPDATE checkpoints SET manifest_digest=''")
    return tmp_path, good, bad


def test_the_cli_shows_the_tensors_where_the_values_cannot_be_compared(
        unreadable_value: tuple[Path, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_nb.cli import main

    store, good, bad = unreadable_value
    assert main(["diff", str(store), good, bad]) == 0
    out = capsys.readouterr().out
    assert "objects/model/weight" in out and "2 tensors: " in out
    assert f"\nvalues not compared: checkpoint {bad}: its manifest's extra/obj is malformed" \
        in out and out.count("not compared") == 1


def test_a_store_that_fails_the_values_fails_the_diff(
        unreadable_value: tuple[Path, str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store's failure while the values are read (a network's) said "values not
    compared" and exit 0: the command failed, not a value."""
    from ckpt_nb import StoreError
    from ckpt_nb.cli import main

    def failing(self: CheckpointManager, a: str, b: str) -> None:
        raise StoreError("reading manifests/x.json.zst failed: connection reset")

    store, good, bad = unreadable_value
    monkeypatch.setattr(CheckpointManager, "diff_values", failing)
    assert main(["diff", str(store), good, good]) == 1
    said = capsys.readouterr()
    assert "not compared" not in said.out and "connection reset" in said.err


def test_the_explorer_shows_the_tensors_where_the_values_cannot_be_compared(
        unreadable_value: tuple[Path, str, str]) -> None:
    store, good, bad = unreadable_value
    ui = ckpt_nb.explore(store, namespace={}, poll_seconds=0)
    try:
        ui.tabs.selected_index = 3
        ui.select([good, bad])
        shown = ui.diff_table.value
    finally:
        ui.close()
    assert f"<b>values</b>: not compared: checkpoint {bad}: its manifest&#x27;s extra/obj " \
        "is malformed" in shown
    assert "rel_change" in shown and "objects/model/weight" in shown


def test_the_cli_counts_one_value_that_differs_and_two_that_differ(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_nb.cli import main

    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path) as mgr:
        for step, lr in ((1, 0.1), (2, 0.1), (3, 0.2)):
            mgr.save(model, rng=False, step=step, extra={"lr": lr})
        first, second, third = mgr.list()["id"]
    assert main(["diff", str(tmp_path), first, second]) == 0
    assert capsys.readouterr().out.endswith("2 identical, 0 changed; 1 value differs\n")
    assert main(["diff", str(tmp_path), second, third]) == 0
    assert capsys.readouterr().out.endswith("2 identical, 0 changed; 2 values differ\n")


def test_a_device_of_a_type_this_torch_knows_that_it_refuses_is_malformed(
        tmp_path: Path) -> None:
    with CheckpointManager(tmp_path) as mgr:
        bad = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"device": torch.device("cpu")})
        good = mgr.save(torch.nn.Linear(2, 2), rng=False, extra={"device": 1})
    rewrite_manifest(tmp_path, bad, lambda manifest: manifest["state"]["extra"].update(
        device={"__device__": "cpu:abc"}) or manifest)
    catalog(tmp_path).execute("UPDATE checkpoints SET manifest_digest=''")
    with CheckpointManager(tmp_path) as mgr:
        with pytest.raises(CorruptCheckpointError,
                           match=f"checkpoint {bad}: its manifest's extra/device is malformed"):
            mgr.diff_values(good, bad)
