"""Values a save cannot store as they are, and wrapped modules: each is stored as
itself, refused by name, or compared as it can be, never a raw error or a silent
change of type."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import Holder

import ckpt_nb
from ckpt_nb import CaptureError, CheckpointManager, PickledValue, StateMismatchError


with warnings.catch_warnings():
    warnings.simplefilter("ignore", PendingDeprecationWarning)  # (NumPy's, of np.matrix)
    MATRIX = np.matrix([[1, 2], [3, 4]])


@pytest.mark.parametrize("value", [
    np.longdouble(1) / 3,
    np.clongdouble(1 + 2j) / 3,
    np.arange(3, dtype=np.longdouble) / 3,
    np.ma.masked_array([1.0, 2.0], mask=[0, 1]),
    MATRIX,
], ids=["longdouble", "clongdouble", "longdouble array", "masked array", "matrix"])
def test_a_numpy_value_torch_has_no_type_for_comes_back_as_itself_with_trust(
        tmp_path: Path, value: object) -> None:
    """A long double was a RecursionError (its item() is one again) or torch's TypeError;
    a masked array came back without its mask, a matrix as a plain array."""
    mgr = CheckpointManager(tmp_path)
    cid = mgr.save(extra={"v": value, "plain": np.arange(3.0)})
    back = mgr.load(cid, trust_pickle=True).extra["v"]
    assert type(back) is type(value)
    assert np.array_equal(np.ma.getmaskarray(back), np.ma.getmaskarray(value))
    assert np.array_equal(np.asarray(back), np.asarray(value))
    with pytest.warns(UserWarning, match="extra/v.*trust_pickle=True"):
        untrusted = mgr.load(cid).extra
    assert isinstance(untrusted["v"], PickledValue)
    assert type(untrusted["plain"]) is np.ndarray  # (a plain array is no pickle)


def test_an_export_leaves_out_by_name_what_a_torch_file_cannot_hold(tmp_path: Path) -> None:
    """A long-double array made torch.from_numpy raise; a masked array lost its mask."""
    mgr = CheckpointManager(tmp_path / "s")
    cid = mgr.save(extra={"ld": np.arange(2, dtype=np.longdouble), "m": MATRIX})
    with pytest.warns(UserWarning, match="left out of e.pt: extra/ld .*; extra/m"):
        exported = mgr.export(cid, tmp_path / "e.pt", trust_pickle=True)
    assert torch.load(exported, weights_only=True)["extra"] == {"ld": None, "m": None}
    extra = mgr.restore(mgr.export(cid, tmp_path / "e.safetensors", trust_pickle=True),
                        trust_pickle=True).extra
    assert extra["ld"].dtype == np.longdouble and type(extra["m"]) is np.matrix


def test_extra_that_is_not_a_dict_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="extra must be a dict.*not a list"):
        CheckpointManager(tmp_path).save(extra=[1, 2])


def test_a_metric_too_large_for_a_float_is_refused_by_name(tmp_path: Path) -> None:
    """Was a raw OverflowError naming nothing, from save() and ckpt_nb.log alike."""
    with pytest.raises(CaptureError, match="metric 'tokens_seen' is 1000.*too large"):
        CheckpointManager(tmp_path).save(metrics={"tokens_seen": 10**400})
    with pytest.raises(CaptureError, match="metric 'big' is 1000.*too large"):
        ckpt_nb.log(big=10**400)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
        self.bn = torch.nn.BatchNorm1d(2)


def wrapped(net: torch.nn.Module, how: str) -> torch.nn.Module:
    if how == "compile":
        return torch.compile(net, backend="eager")
    if how == "DataParallel":
        return torch.nn.DataParallel(net)
    return torch.compile(torch.nn.DataParallel(net), backend="eager")


@pytest.mark.parametrize("how", ["compile", "DataParallel", "both"])
def test_a_wrapped_module_saves_and_restores_as_the_module_it_runs(
        tmp_path: Path, how: str) -> None:
    """A torch.compile / DataParallel wrapper's keys carried its prefix (_orig_mod.,
    module.), which the plain module refused, and the other way round."""
    mgr = CheckpointManager(tmp_path)
    torch.manual_seed(0)
    net = Net()
    cid = mgr.save(wrapped(net, how))
    assert set(mgr.load(cid).state["model"]) == set(Net().state_dict())
    assert mgr.load(cid).kinds["model"].endswith(".Net")
    plain = Net()
    mgr.restore(cid, model=plain)
    assert torch.equal(plain.fc.weight, net.fc.weight)
    other = Net()
    mgr.restore(mgr.save(plain), model=wrapped(other, how))
    assert torch.equal(other.fc.weight, net.fc.weight)


@pytest.mark.parametrize("how", ["compile", "DataParallel", "both"])
def test_a_state_saved_with_a_wrappers_prefix_loads_into_the_plain_module(
        tmp_path: Path, how: str) -> None:
    """Such a state (a torch.save of a wrapper's state_dict, or a checkpoint of an
    earlier ckpt_nb) fits the plain module exactly once its prefix goes: it loads, with
    its module versions; into another architecture it is refused, naming the prefix."""
    torch.manual_seed(0)
    net = Net()
    torch.save({"model_state_dict": wrapped(net, how).state_dict()}, tmp_path / "w.pt")
    mgr = CheckpointManager(tmp_path / "store")
    cid = mgr.import_file(tmp_path / "w.pt")
    for source in (cid, tmp_path / "w.pt"):
        plain = Net()
        plain.bn.num_batches_tracked.fill_(5)
        mgr.restore(source, model=plain)
        assert torch.equal(plain.fc.weight, net.fc.weight)
        assert plain.bn.num_batches_tracked == 0
    saved = mgr.load(cid).state["model"]
    stripped = ckpt_nb._capture._unprefixed(Net(), saved)
    assert stripped._metadata["bn"]["version"] == saved._metadata[
        next(k for k in saved._metadata if k.endswith("bn"))]["version"]
    # (an import drops torch.compile's steps from the keys: only DataParallel's is left)
    hint = "carry the 'module.' prefix of a" if how != "compile" else "missing keys"
    with pytest.raises(StateMismatchError, match=hint):
        mgr.restore(cid, model=torch.nn.Linear(2, 2))


@pytest.mark.parametrize("make", [
    lambda s: (torch.ones(2, dtype=torch.complex64) * s).to(torch.complex32),
    lambda s: torch.full((3,), s, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
], ids=["complex32", "float4"])
def test_diff_compares_dtypes_torch_cannot_compare_by_their_bytes(tmp_path: Path,
                                                                   make) -> None:
    """Was torch's NotImplementedError ("equal_cpu" / "copy_" not implemented)."""
    mgr = CheckpointManager(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch: ComplexHalf support is experimental)
        a = mgr.save(extra={"t": make(1), "same": make(1)})
        t = make(1)  # (the same values in another storage, one element in: compared)
        raw = torch.cat([torch.zeros(t.dtype.itemsize, dtype=torch.uint8), t.view(torch.uint8)])
        b = mgr.save(extra={"t": make(2), "same": raw.view(t.dtype)[1:]})
        table = mgr.diff(a, b).set_index("tensor")
    assert not table.loc["extra/same", "same_chunks"]
    assert table.loc["extra/t", "changed"] and table.loc["extra/t", "status"] == "changed"
    assert not table.loc["extra/same", "changed"]
    if table.loc["extra/t", "dtype"] == "complex32":  # (a cast exists: norms)
        assert table.loc["extra/t", "l2"] == pytest.approx(2 ** 0.5)
    else:  # (none: left empty)
        assert np.isnan(table.loc["extra/t", "l2"])


def test_a_torch_size_comes_back_a_torch_size_in_every_form(tmp_path: Path) -> None:
    """A shape kept in extra came back a plain tuple, so ``torch.zeros(shape).shape ==
    shape`` held while ``shape.numel()`` raised."""
    mgr = CheckpointManager(tmp_path / "s")
    shape = torch.zeros(2, 0, 3).shape
    cid = mgr.save(extra={"shape": shape, "shapes": [shape, (2, 3)]})
    for back in (mgr.load(cid).extra, mgr.restore(mgr.export(cid, tmp_path / "e.pt")).extra,
                 mgr.restore(mgr.export(cid, tmp_path / "e.safetensors")).extra):
        assert type(back["shape"]) is torch.Size and back["shape"] == shape
        assert [type(s) for s in back["shapes"]] == [torch.Size, tuple]


class _Tagged(torch.Tensor):
    """A tensor subclass, as a library (DTensor, torchvision's tv_tensors) makes them."""


def test_a_tensor_subclass_is_named_where_it_is_stored_as_a_plain_tensor(
        tmp_path: Path) -> None:
    """Its type came back torch.Tensor from a save or an import, without a word."""
    holder = Holder({"plain": torch.ones(2), "param": torch.nn.Parameter(torch.ones(2)),
                     "tagged": torch.ones(3).as_subclass(_Tagged)})
    mgr = CheckpointManager(tmp_path / "s")
    with pytest.warns(UserWarning, match=r"\['objects/model/tagged'\] are tensor subclasses, "
                                         r"stored as plain tensors"):
        cid = mgr.save(model=holder)
    assert type(mgr.load(cid).state["model"]["tagged"]) is torch.Tensor
    torch.save({"model": {"w": torch.ones(2).as_subclass(_Tagged)}}, tmp_path / "f.pt")
    with pytest.warns(UserWarning, match=r"objects/model/w'\] are tensor subclasses"):
        mgr.import_file(tmp_path / "f.pt", trust_pickle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mgr.save(model=Holder({"plain": torch.ones(2),
                               "param": torch.nn.Parameter(torch.ones(2)),
                               "jagged": torch.nested.nested_tensor(  # (comes back nested)
                                   [torch.ones(2), torch.ones(3)], layout=torch.jagged)}))
