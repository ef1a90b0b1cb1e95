"""A restore into a module whose tensors share memory (tied weights, a buffer that is a
view of a parameter) from a checkpoint that gives them different values: load_state_dict
would keep whichever it copied last, silently, so the restore refuses it before anything
changes. Where the checkpoint ties them too, or holds the same bytes for them, it loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager, StateMismatchError
from ckpt_nb._capture import check_module


class Tied(torch.nn.Module):
    def __init__(self, tie: bool = True) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.out = torch.nn.Linear(4, 10, bias=False)
        if tie:
            self.out.weight = self.emb.weight


class ViewBuffer(torch.nn.Module):
    """A buffer that is a view of the parameter's first half, or a tensor of its own."""

    def __init__(self, view: bool = True) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.randn(6))
        self.register_buffer("head", self.p.data[:3] if view else torch.randn(3))


class SideBySide(torch.nn.Module):
    """Two parameters side by side in one flat buffer: one storage, no overlap."""

    def __init__(self) -> None:
        super().__init__()
        flat = torch.randn(10)
        self.a = torch.nn.Parameter(flat[:4])
        self.b = torch.nn.Parameter(flat[4:])


@pytest.mark.parametrize("strict", [True, False])
def test_an_untied_checkpoint_into_a_tied_model_is_refused_with_nothing_changed(
        tmp_path: Path, strict: bool) -> None:
    """It kept the saved out.weight in both (emb.weight's saved value lost), no warning."""
    mgr = CheckpointManager(tmp_path)
    cid = mgr.save(Tied(tie=False))
    live = Tied()
    optimizer = torch.optim.SGD(live.parameters(), lr=0.1, momentum=0.9)
    before = live.emb.weight.detach().clone()
    with pytest.raises(StateMismatchError) as caught:
        mgr.restore(cid, model=live, optimizer=optimizer, strict=strict)
    message = str(caught.value)
    assert "['emb.weight', 'out.weight'] share memory" in message, message
    assert "different values" in message and "nothing was changed" in message, message
    assert "untied" in message and "load()" in message, message
    assert torch.equal(live.emb.weight, before) and live.out.weight is live.emb.weight


def test_a_tied_model_takes_an_untied_checkpoint_of_equal_values(tmp_path: Path) -> None:
    """A .safetensors export keeps each tensor on its own: restored from the file, the
    tied model takes it (same bytes, NaN too), and stays tied."""
    model = Tied()
    with torch.no_grad():
        model.emb.weight[0, 0] = float("nan")
    mgr = CheckpointManager(tmp_path / "store")
    path = mgr.export(mgr.save(model), tmp_path / "tied.safetensors")
    live = Tied()
    mgr.restore(str(path), model=live)
    assert live.out.weight is live.emb.weight
    assert torch.equal(live.emb.weight.view(torch.int32), model.emb.weight.view(torch.int32))


def test_a_view_buffer_is_checked_against_the_parameter_it_views(tmp_path: Path) -> None:
    """A buffer that views part of a parameter: saved from a module where it was a tensor
    of its own, it loads where its values are the parameter's, and is refused where not."""
    mgr = CheckpointManager(tmp_path)
    own = ViewBuffer(view=False)
    differs = mgr.save(own)
    with torch.no_grad():
        own.head.copy_(own.p[:3])
    agrees = mgr.save(own)
    live = ViewBuffer()
    before = live.p.detach().clone()
    with pytest.raises(StateMismatchError, match=r"\['p', 'head'\] share memory"):
        mgr.restore(differs, model=live)
    assert torch.equal(live.p, before)
    mgr.restore(agrees, model=live)
    assert torch.equal(live.p, own.p) and live.head.data_ptr() == live.p.data_ptr()
    mirrored = ViewBuffer()  # (saved as a view too: it comes back sharing, as it was)
    mgr.restore(mgr.save(mirrored), model=live)
    assert torch.equal(live.p, mirrored.p)


def test_tensors_side_by_side_in_one_buffer_are_not_taken_for_tied(tmp_path: Path) -> None:
    """One storage, no overlap: a checkpoint of any values loads."""
    saved = torch.nn.Module()
    saved.a, saved.b = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.zeros(6))
    mgr = CheckpointManager(tmp_path)
    live = SideBySide()
    mgr.restore(mgr.save(saved), model=live)
    assert torch.equal(live.a, saved.a) and torch.equal(live.b, saved.b)
    assert live.a.untyped_storage().data_ptr() == live.b.untyped_storage().data_ptr()


def test_a_flat_buffer_beside_its_many_views_is_checked_in_linear_time() -> None:
    """A flat buffer registered beside its parameter views: one overlapping group of
    every key, which was ordered in quadratic time (60,000 views: 18 s a restore)."""
    count = 20_000
    flat = torch.randn(4 * count)
    live = torch.nn.Module()
    for i in range(count):
        live.register_parameter(f"p{i}", torch.nn.Parameter(flat[4 * i:4 * i + 4]))
    live.register_buffer("flat", flat)
    state = {key: value.clone() for key, value in live.state_dict().items()}
    assert check_module("model", live, state, strict=True) == []
    state["flat"][-1] += 1
    refused, = check_module("model", live, state, strict=True)
    assert f"'p8', 'p9'] ... ({count + 1} keys) share memory" in refused  # (not all named)


class ConjugateBuffer(torch.nn.Module):
    """A buffer that reads another's memory conjugated (``.conj()``) or negated
    (``._neg_view()``), or (not ``tied``) a tensor of its own holding that value."""

    def __init__(self, view: str, tied: bool = True) -> None:
        super().__init__()
        self.register_buffer("a", torch.randn(3, dtype=torch.complex64))
        as_view = self.a.conj() if view == "conj" else self.a._neg_view()
        self.register_buffer("c", as_view if tied else as_view.resolve_conj().resolve_neg())


def holding(**tensors: torch.Tensor) -> torch.nn.Module:
    """A module of these buffers, each a tensor of its own: a checkpoint to save."""
    module = torch.nn.Module()
    for name, tensor in tensors.items():
        module.register_buffer(name, tensor)
    return module


@pytest.mark.parametrize("view", ["conj", "neg"])
def test_a_conjugate_view_buffer_takes_a_checkpoint_of_consistent_values(
        tmp_path: Path, view: str) -> None:
    """The conj (neg) bit was ignored: an untied checkpoint with c == conj(a), which
    load_state_dict leaves as saved, was refused; one with another c still is."""
    mgr = CheckpointManager(tmp_path)
    own = ConjugateBuffer(view, tied=False)
    consistent, saved_c = mgr.save(own), own.c.clone()
    with torch.no_grad():
        own.c.add_(1)
    differs = mgr.save(own)
    live = ConjugateBuffer(view)
    with pytest.raises(StateMismatchError, match=r"\['a', 'c'\] share memory"):
        mgr.restore(differs, model=live)
    mgr.restore(consistent, model=live)
    assert torch.equal(live.a, own.a) and torch.equal(live.c, saved_c)
    assert live.c.data_ptr() == live.a.data_ptr()


def test_tensors_of_two_storages_over_one_memory_are_checked(tmp_path: Path) -> None:
    """torch.from_numpy of an array and of its slice: two storages over one memory,
    which were not compared, so a checkpoint of different values lost one silently."""
    np = pytest.importorskip("numpy")
    array = np.zeros(6, dtype=np.float32)
    live = torch.nn.Module()
    live.register_buffer("all", torch.from_numpy(array))
    live.register_buffer("tail", torch.from_numpy(array[2:]))
    mgr = CheckpointManager(tmp_path)
    differs = mgr.save(holding(all=torch.arange(6.0), tail=torch.full((4,), 9.0)))
    with pytest.raises(StateMismatchError, match=r"\['all', 'tail'\] share memory"):
        mgr.restore(differs, model=live)
    assert not array.any()
    mgr.restore(mgr.save(holding(all=torch.arange(6.0), tail=torch.arange(2.0, 6.0))),
                model=live)
    assert array.tolist() == list(range(6))
