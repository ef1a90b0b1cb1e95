"""A value comes back as the type it was saved as (a container subclass as its base type,
as the README says), or as a placeholder for a pickle, or is refused by name at save:
never as a checkpoint read as damaged."""

from __future__ import annotations

import collections
import enum
import functools
import warnings
from http import HTTPStatus
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import Holder

import ckpt_nb
from ckpt_nb import (CaptureError, CheckpointManager, PickledValue, StoreFormatError,
                     UntrustedPickleError)

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (a rollback test below)


class Split(enum.Enum):
    TRAIN = "train"
    VAL = "val"


class Word(enum.StrEnum):
    LOSS = "loss"


def zero() -> int:
    return 0


class AttributeDict(dict):  # (as Lightning's hparams, an EasyDict, a Box)
    __getattr__ = dict.get


class Steps(list):
    pass


class Pair(tuple):
    pass


class Tags(set):
    pass


class NestedBox:
    """An object of the user's (so pickled) holding an empty nested tensor: torch cannot
    unpickle one, as in a checkpoint from before they were stored as tensors."""

    def __init__(self) -> None:
        self.parts = torch.nested.nested_tensor([])


def linear(fill: float) -> torch.nn.Linear:
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.fill_(fill)
    return model


def test_a_pickled_dict_key_or_set_member_is_a_placeholder_not_a_damaged_checkpoint(
        tmp_path: Path) -> None:
    """An Enum key made the checkpoint 'not describe a state' (a placeholder was
    unhashable), and restore('latest') fell back to the checkpoint before it."""
    mgr = CheckpointManager(tmp_path)
    mgr.save(linear(1.0), epoch=0)
    extra = {"counts": {Split.TRAIN: 100, Split.VAL: 10, "all": 110}, "seen": {Split.TRAIN, 3}}
    cid = mgr.save(linear(2.0), epoch=1, extra=extra)
    model = linear(0.0)
    with pytest.warns(UserWarning, match=r"\['extra/counts/<key 0>', 'extra/counts/<key 1>', "
                                         r"'extra/seen/<member \d>'\] are pickles"):
        ck = mgr.restore("latest", model=model)
    assert ck.id == cid and model.weight[0, 0].item() == 2.0
    counts = ck.extra["counts"]
    keys = [k for k in counts if k != "all"]
    assert len(counts) == 3 and counts["all"] == 110  # (the two placeholders are two keys)
    assert all(isinstance(k, PickledValue) for k in keys)
    assert sorted(counts[k] for k in keys) == [10, 100]
    assert [k.name for k in keys] == ["extra/counts/<key 0>", "extra/counts/<key 1>"]
    assert 3 in ck.extra["seen"] and len(ck.extra["seen"]) == 2
    assert mgr.load(cid, trust_pickle=True).extra == extra


def test_a_pickled_key_in_an_objects_state_needs_trust_as_any_pickle_there(
        tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    cid = mgr.save(holder=Holder({"by_split": {Split.VAL: torch.ones(2)}}))
    with pytest.raises(UntrustedPickleError, match=r"holder/by_split/<key 0> is stored as a "
                                                   "pickle"):
        mgr.restore(cid, holder=Holder({}))
    target = Holder({})
    mgr.restore(cid, holder=target, trust_pickle=True)
    assert torch.equal(target.state["by_split"][Split.VAL], torch.ones(2))


def test_an_export_leaves_out_an_entry_whose_key_it_cannot_write_not_the_whole_file(
        tmp_path: Path) -> None:
    """A placeholder or an Enum as a key went into the .pt file as it was, and
    torch.load(weights_only=True) refused the whole file for it."""
    mgr = CheckpointManager(tmp_path / "s")
    cid = mgr.save(extra={"counts": {Split.TRAIN: 1, Split.VAL: 2, "all": 3},
                          "seen": {Split.TRAIN, 3}, "pairs": {(Split.VAL, 1): 4, (0, 1): 5}})
    for trust in (False, True):
        what = r"<key 0> \(pickled, not loaded" if not trust else \
            r"Split.TRAIN, by its key \(a Split, which torch.load"
        with pytest.warns(UserWarning, match=rf"left out of x{trust}.pt: extra/counts/{what}"):
            path = mgr.export(cid, tmp_path / f"x{trust}.pt", trust_pickle=trust)
        assert torch.load(path, weights_only=True)["extra"] == {
            "counts": {"all": 3}, "seen": {3}, "pairs": {(0, 1): 5}}


def test_an_import_without_trust_leaves_out_entries_with_pickled_keys_not_merged(
        tmp_path: Path) -> None:
    """Each pickled key was left out as None: two of them became one key None, holding
    one of their values."""
    mgr = CheckpointManager(tmp_path / "s")
    cid = mgr.save(extra={"counts": {Split.TRAIN: 1, Split.VAL: 2, "all": 3},
                          "seen": {Split.TRAIN, 3}, "best": Split.VAL})
    path = mgr.export(cid, tmp_path / "x.safetensors", trust_pickle=True)
    with pytest.warns(UserWarning, match=r"left out of .*x.safetensors: extra/counts/<key 0>, "
                                         r"extra/counts/<key 1>, .*extra/best"):
        ck = mgr.restore(path)
    assert ck.extra == {"counts": {"all": 3}, "seen": {3}, "best": None}
    assert mgr.restore(path, trust_pickle=True).extra == mgr.load(cid, trust_pickle=True).extra

def train_two_steps(tmp_path: Path, ns: dict) -> None:
    """Two steps of ``ns``'s model and optimizer in a cell checkpointed at each."""
    with ckpt_nb.auto(str(tmp_path), namespace=ns, name="cell", every_steps=1):
        for _, x in ckpt_nb.batches([torch.ones(1, 2)] * 2):
            ns["opt"].zero_grad()
            ns["model"](x).sum().backward()
            ns["opt"].step()



def test_a_notebook_variable_with_a_pickled_key_is_left_out_of_a_rollback(
        tmp_path: Path, capsys) -> None:
    """An IntEnum key (HTTPStatus.OK) is pickled: the variable held placeholders for keys."""
    model = torch.nn.Linear(2, 2)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
          "codes": {HTTPStatus.OK: 3}, "lr": 0.25}
    train_two_steps(tmp_path, ns)
    fresh = torch.nn.Linear(2, 2)
    back = {"model": fresh, "opt": torch.optim.SGD(fresh.parameters(), lr=0.1), "lr": 0.5}
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the store's own, of the pickles it left out)
        ckpt_nb.rollback("latest", directory=tmp_path, namespace=back)
    assert back["lr"] == 0.25 and "codes" not in back
    assert "left out (they do not read back): codes (it holds values stored as pickles" \
        in capsys.readouterr().out



def test_a_notebook_variable_of_a_dict_subclass_is_skipped_not_made_a_plain_dict(
        tmp_path: Path, capsys) -> None:
    """An EasyDict-like config (``cfg.lr``) came back from a rollback as a plain dict,
    where ``cfg.lr`` then failed, without a word: it is skipped and named, as a list
    subclass is; an OrderedDict, a Counter, a defaultdict come back as themselves."""
    model = torch.nn.Linear(2, 2)
    cfg, kept = AttributeDict(lr=0.1), collections.OrderedDict(a=1)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
          "cfg": cfg, "nested": [AttributeDict(a=1)], "kept": kept}
    train_two_steps(tmp_path, ns)
    out = capsys.readouterr().out
    assert "skipped cfg, nested (AttributeDict, a dict subclass: it would come back as a " \
           "plain dict)" in out
    ns["kept"] = collections.OrderedDict(a=2)
    ckpt_nb.rollback("latest", directory=tmp_path, namespace=ns)
    assert ns["cfg"] is cfg and ns["kept"] == kept and type(ns["kept"]) is type(kept)

BASE_TYPES = [
    pytest.param(AttributeDict(lr=0.1), {"lr": 0.1}, id="dict subclass"),
    pytest.param(Steps([1, 2]), [1, 2], id="list subclass"),
    pytest.param(Pair((1, 2)), (1, 2), id="tuple subclass"),
    pytest.param(Tags({1}), {1}, id="set subclass"),
    pytest.param(np.bytes_(b"ab"), b"ab", id="np.bytes_"),
    pytest.param(np.str_("ab"), "ab", id="np.str_"),
    pytest.param({np.str_("a"): 1, np.str_("b"): 2}, {"a": 1, "b": 2}, id="np.str_ keys"),
    pytest.param({np.str_("a"): 1, 2: 2}, {"a": 1, 2: 2}, id="np.str_ among other keys"),
    pytest.param({Word.LOSS: 1.5}, {"loss": 1.5}, id="StrEnum key"),
    pytest.param(collections.defaultdict(zero, {"a": 1}), {"a": 1}, id="defaultdict(function)"),
    pytest.param(collections.defaultdict(functools.partial(int, 0), {"a": 1}), {"a": 1},
                 id="defaultdict(partial)"),
    pytest.param(collections.defaultdict(lambda: 0, {"a": 1}), {"a": 1},
                 id="defaultdict(lambda)"),
    pytest.param(collections.defaultdict(None, {"a": 1}), {"a": 1}, id="defaultdict(None)"),
]


@pytest.mark.parametrize(("value", "base"), BASE_TYPES)
def test_a_subclass_of_a_stored_type_comes_back_as_its_base_type_without_trust(
        tmp_path: Path, value: Any, base: Any) -> None:
    """They were pickled (23eda6b): a dict subclass in a state_dict (Lightning's hparams)
    reached load_state_dict as a placeholder, or restore raised UntrustedPickleError."""
    mgr = CheckpointManager(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning at save, none at load)
        cid = mgr.save(holder=Holder({"v": value}), extra={"v": value})
        target = Holder({})
        ck = mgr.restore(cid, holder=target)
    for back in (target.state["v"], ck.extra["v"]):
        assert type(back) is type(base) and back == base
        assert [type(k) for k in back] == [type(k) for k in base] if isinstance(base, dict) \
            else True


def test_a_notebook_variable_with_np_str_keys_or_a_function_defaultdict_rolls_back(
        tmp_path: Path) -> None:
    """Both were pickled, so a rollback left them out (np.unique's keys, a defaultdict
    of a notebook's function)."""
    model = torch.nn.Linear(2, 2)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
          "names": {k: 1 for k in np.unique(np.array(["a", "b"]))},
          "tally": collections.defaultdict(zero, {"y": 2})}
    train_two_steps(tmp_path, ns)
    fresh = torch.nn.Linear(2, 2)
    back = {"model": fresh, "opt": torch.optim.SGD(fresh.parameters(), lr=0.1)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ckpt_nb.rollback("latest", directory=tmp_path, namespace=back)
    assert back["names"] == {"a": 1, "b": 1} and type(back["tally"]) is dict
    assert back["tally"] == {"y": 2}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # (torch's own)
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64])
def test_an_empty_nested_tensor_comes_back_with_its_dtype(tmp_path: Path,
                                                          dtype: torch.dtype) -> None:
    """It was pickled, and torch cannot unpickle its own empty nested tensor: no restore
    read the checkpoint, with trust_pickle=True or without."""
    empty = torch.nested.nested_tensor([], dtype=dtype)
    mgr = CheckpointManager(tmp_path)
    cid = mgr.save(holder=Holder({"nt": empty, "w": torch.ones(2)}), extra={"nt": empty})
    target = Holder({})
    ck = mgr.restore(cid, holder=target)
    for back in (target.state["nt"], ck.extra["nt"]):
        assert back.is_nested and back.dtype == dtype and back.unbind() == ()
        assert back.dim() == empty.dim() and back.layout is torch.strided
    assert torch.equal(target.state["w"], torch.ones(2))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # (torch's own)
def test_a_pickled_empty_nested_tensor_is_a_checkpoint_restore_passes_over(
        tmp_path: Path) -> None:
    """torch's raw 'INTERNAL ASSERT FAILED' RuntimeError stopped load(trust_pickle=True)
    and restore('latest', trust_pickle=True), which did not go back to the one before."""
    mgr = CheckpointManager(tmp_path)
    first = mgr.save(linear(1.0))
    second = mgr.save(linear(2.0), extra={"box": NestedBox()})
    with pytest.raises(StoreFormatError, match=r"extra/box holds a nested tensor that torch "
                       r"cannot unpickle \(an empty nested_tensor.*without trust_pickle=True"
                       ) as refused:
        mgr.load(second, trust_pickle=True)
    assert "INTERNAL ASSERT FAILED" in str(refused.value.__cause__)  # (torch's, chained)
    model = linear(0.0)
    with pytest.warns(UserWarning, match=rf"skipping checkpoint {second}, which this ckpt_nb "
                                         r"cannot read \(extra/box holds a nested tensor"):
        assert mgr.restore("latest", model=model, trust_pickle=True).id == first
    assert torch.equal(model.weight, torch.full((2, 2), 1.0))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch without MKL-DNN")
def test_an_mkldnn_tensor_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """It was 'neither JSON, a tensor nor picklable'."""
    with pytest.raises(CaptureError, match=r"extra/x is an MKL-DNN tensor.*\.to_dense\(\)"):
        CheckpointManager(tmp_path).save(extra={"x": torch.ones(2, 2).to_mkldnn()})


class KeyAttrDict(dict):  # (the copy-paste idiom: a missing attribute is a KeyError)
    __getattr__ = dict.__getitem__


class GrowingDict(dict):  # (as a DotMap: a missing attribute is a new child, kept)
    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        return self.setdefault(key, GrowingDict())


@pytest.mark.parametrize("kind", [KeyAttrDict, GrowingDict])
def test_a_dict_with_attribute_access_saves_untouched_and_comes_back_a_dict(
        tmp_path: Path, kind: type) -> None:
    mgr = CheckpointManager(tmp_path / "s")
    model = torch.nn.Linear(2, 2)
    cfg = kind(lr=0.1, nested=kind(depth=2))
    cid = mgr.save(model, None, 0, extra={"cfg": cfg})
    assert cfg == {"lr": 0.1, "nested": {"depth": 2}}  # (no key added by the save)
    back = mgr.load(cid).extra["cfg"]
    assert type(back) is dict and type(back["nested"]) is dict
    assert back == {"lr": 0.1, "nested": {"depth": 2}}

    torch.save({"model": model.state_dict(), "cfg": cfg}, tmp_path / "run.pt")
    imported = mgr.load(mgr.import_file(tmp_path / "run.pt", trust_pickle=True))
    assert imported.extra["cfg"] == {"lr": 0.1, "nested": {"depth": 2}}
    torch.save(kind(model=model.state_dict(), epoch=3), tmp_path / "top.pt")
    top = mgr.load(mgr.import_file(tmp_path / "top.pt", trust_pickle=True))
    assert torch.equal(top.state["model"]["weight"], model.weight.detach())
