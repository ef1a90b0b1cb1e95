"""Files other tools wrote, restored as torch's own load_state_dict would take them:
old module versions, states saved with tied weights once, and the hints a mismatch
gives for the usual layouts."""

from __future__ import annotations

import sys
import textwrap
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager, StateMismatchError
import warm_python  # (fresh interpreters forked from a warm one)


def old_batchnorm_state(version: int | None) -> OrderedDict[str, torch.Tensor]:
    """A BatchNorm's state without ``num_batches_tracked``, its module version ``version``
    (None: a plain dict, no metadata, as torchvision's older .pth files are)."""
    bn = torch.nn.BatchNorm1d(4)
    bn.running_mean.fill_(0.5)
    state = bn.state_dict()
    del state["num_batches_tracked"]
    if version is None:
        return OrderedDict(state)
    state._metadata[""]["version"] = version  # type: ignore[attr-defined]
    return state


@pytest.mark.parametrize("version", [None, 1])
@pytest.mark.parametrize("nested", [False, True], ids=["alone", "under model"])
def test_an_old_batchnorm_state_restores_as_torch_loads_it(tmp_path: Path, version: int | None,
                                                          nested: bool) -> None:
    """torch fills num_batches_tracked in for a module version under 2; restore refused
    it as a missing key."""
    state = old_batchnorm_state(version)
    torch.save({"model": state, "epoch": 2} if nested else state, tmp_path / "bn.pt")
    by_torch = torch.nn.BatchNorm1d(4)
    by_torch.num_batches_tracked.fill_(3)
    by_torch.load_state_dict(torch.load(tmp_path / "bn.pt")["model"] if nested else
                             torch.load(tmp_path / "bn.pt"))
    restored = torch.nn.BatchNorm1d(4)
    restored.num_batches_tracked.fill_(3)
    mgr = CheckpointManager(tmp_path / "s")
    mgr.restore(tmp_path / "bn.pt", model=restored)
    assert all(torch.equal(a, b) for a, b in zip(restored.state_dict().values(),
                                                  by_torch.state_dict().values()))
    other = torch.nn.BatchNorm1d(4)
    mgr.restore(mgr.import_file(tmp_path / "bn.pt"), model=other)  # (through the store too)
    assert torch.equal(other.running_mean, state["running_mean"])


def test_a_current_batchnorm_state_without_its_counter_is_still_refused(
        tmp_path: Path) -> None:
    """At module version 2 torch's strict load says the key is missing, and so does restore."""
    torch.save(old_batchnorm_state(2), tmp_path / "bn.pt")
    with pytest.raises(RuntimeError, match="num_batches_tracked"):
        torch.nn.BatchNorm1d(4).load_state_dict(torch.load(tmp_path / "bn.pt"))
    with pytest.raises(StateMismatchError, match=r"missing keys \['num_batches_tracked'\]"):
        CheckpointManager(tmp_path / "s").restore(tmp_path / "bn.pt",
                                                  model=torch.nn.BatchNorm1d(4))


def test_a_torchvision_style_state_restores_into_a_nested_batchnorm(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    torch.save({k: v for k, v in model.state_dict().items() if "num_batches" not in k},
               tmp_path / "tv.pth")
    restored = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    CheckpointManager(tmp_path / "s").restore(tmp_path / "tv.pth", model=restored)
    assert torch.equal(restored[0].weight, model[0].weight)


class Tied(torch.nn.Module):
    """An embedding whose output layer shares its weight, as language models' do."""

    def __init__(self, tied: bool = True) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(5, 3)
        self.out = torch.nn.Linear(3, 5, bias=False)
        if tied:
            self.out.weight = self.emb.weight


def test_a_tied_model_saved_with_one_copy_restores_tied_and_bit_exact(tmp_path: Path) -> None:
    """safetensors' save_model keeps one of tied weights: restore said missing keys
    ['out.weight'], where its load_model fills it."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    saved = Tied()
    safetensors_torch.save_model(saved, str(tmp_path / "t.safetensors"))
    mgr = CheckpointManager(tmp_path / "s")
    for source in (tmp_path / "t.safetensors", mgr.import_file(tmp_path / "t.safetensors")):
        restored = Tied()
        mgr.restore(source, model=restored)
        assert restored.out.weight is restored.emb.weight
        assert torch.equal(restored.emb.weight, saved.emb.weight)
    with pytest.raises(StateMismatchError, match=r"missing keys \['out.weight'\]"):
        mgr.restore(tmp_path / "t.safetensors", model=Tied(tied=False))


def test_whole_modules_saved_as_objects_restore_as_their_states(tmp_path: Path) -> None:
    """YOLOv5's and ultralytics' layout, {"model": model, "ema": ema, ...}: read with
    trust_pickle, the modules went to extra, and restore(model=...) said "model: not in
    the checkpoint (it holds [])"."""
    torch.manual_seed(0)
    model, ema = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    torch.save({"model": model, "ema": ema, "epoch": 3, "best_fitness": 0.5},
               tmp_path / "yolo.pt")
    mgr = CheckpointManager(tmp_path / "s")
    ck = mgr.load(mgr.import_file(tmp_path / "yolo.pt", trust_pickle=True))
    assert sorted(ck.state) == ["ema", "model"] and ck.epoch == 3
    assert ck.extra == {"best_fitness": 0.5}
    restored, restored_ema = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    mgr.restore(tmp_path / "yolo.pt", model=restored, ema=restored_ema, trust_pickle=True)
    assert torch.equal(restored.weight, model.weight)
    assert torch.equal(restored_ema.bias, ema.bias)


def inner() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


class Lit(torch.nn.Module):
    """A Lightning module's layout: the model an attribute of it."""

    def __init__(self) -> None:
        super().__init__()
        self.model = inner()


def test_a_lightning_state_into_its_inner_model_names_the_prefix(tmp_path: Path) -> None:
    """Missing and unexpected keys were listed without a word of the 'model.' between them."""
    torch.save({"state_dict": Lit().state_dict(), "epoch": 1, "global_step": 10},
               tmp_path / "lit.ckpt")
    mgr = CheckpointManager(tmp_path / "s")
    with pytest.raises(StateMismatchError, match=r"model: the checkpoint's keys are the "
                                                 r"module's with 'model\.' before them: "
                                                 r"restore into the module that holds this "
                                                 r"one as \.model"):
        mgr.restore(tmp_path / "lit.ckpt", model=inner())
    torch.save(inner().state_dict(), tmp_path / "inner.pt")
    with pytest.raises(StateMismatchError, match=r"model: the module's keys are the "
                                                 r"checkpoint's with 'model\.' before them: "
                                                 r"restore into model\.model instead"):
        mgr.restore(tmp_path / "inner.pt", model=Lit())


def test_keys_alike_in_name_only_give_no_prefix_advice_but_a_shape_that_differs(
        tmp_path: Path) -> None:
    """A Linear(2, 2)'s state into a Sequential(Linear(64, 128), ...) was told to restore
    into model.0 instead, by the keys' names alone: that failed again, on the shapes. The
    other way round too; a dtype alone differing keeps the advice (the cast hint follows)."""
    mgr = CheckpointManager(tmp_path / "s")
    mgr.save(torch.nn.Linear(2, 2), None, 0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    with pytest.raises(StateMismatchError) as raised:
        mgr.restore("latest", model=model)
    assert "model: the module's keys are the checkpoint's with '0.' before them, but not " \
        "their shapes (the checkpoint's 'weight' is (2, 2), model's '0.weight' (128, 64)): " \
        "it does not fit model.0 either" in str(raised.value)
    assert "restore into" not in str(raised.value)
    with pytest.raises(StateMismatchError, match=r"weight is \(2, 2\) float32 in the "
                                                 r"checkpoint but \(128, 64\) float32"):
        mgr.restore("latest", model=model[0])  # (what the old advice said)

    wrapper = torch.nn.Module()
    wrapper.model = torch.nn.Linear(64, 128)
    mgr.save(wrapper, None, 1)
    with pytest.raises(StateMismatchError) as raised:
        mgr.restore("latest", model=torch.nn.Linear(2, 2))
    assert "model: the checkpoint's keys are the module's with 'model.' before them, but " \
        "not their shapes (the checkpoint's 'model.weight' is (128, 64), model's 'weight' " \
        "(2, 2)): its part under 'model.' does not fit model either" in str(raised.value)

    torch.save(inner().half().state_dict(), tmp_path / "half.pt")
    with pytest.raises(StateMismatchError, match=r"restore into model\.model instead"):
        mgr.restore(tmp_path / "half.pt", model=Lit())


def test_a_half_precision_file_into_a_float32_model_says_what_to_do(tmp_path: Path) -> None:
    torch.save(inner().half().state_dict(), tmp_path / "half.pt")
    model = inner()
    with pytest.raises(StateMismatchError, match=r"cast model first \(model\.to\(torch\."
                                                 r"float16\)\), then back \(model\.to\(torch"
                                                 r"\.float32\)\)"):
        CheckpointManager(tmp_path / "s").restore(tmp_path / "half.pt", model=model)
    model.half()  # (as the advice says)
    CheckpointManager(tmp_path / "s").restore(tmp_path / "half.pt", model=model)


def test_another_tools_safetensors_metadata_is_kept_in_extra(tmp_path: Path) -> None:
    """A foreign file's __metadata__ was dropped on import."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    safetensors_torch.save_file({"w": torch.ones(2)}, tmp_path / "m.safetensors",
                                metadata={"format": "pt", "base_model": "tiny"})
    mgr = CheckpointManager(tmp_path / "s")
    ck = mgr.load(mgr.import_file(tmp_path / "m.safetensors"))
    assert ck.extra == {"safetensors_metadata": {"format": "pt", "base_model": "tiny"}}
    safetensors_torch.save_file({"w": torch.ones(2)}, tmp_path / "bare.safetensors")
    assert mgr.load(mgr.import_file(tmp_path / "bare.safetensors")).extra == {}
    ours = mgr.export(mgr.save(torch.nn.Linear(2, 2), extra={"k": 1}), tmp_path / "o.safetensors")
    assert mgr.load(mgr.import_file(ours)).extra == {"k": 1}  # (ckpt_nb's own: no entry)


def test_a_batchnorm_version_that_is_no_number_is_refused_before_anything_changes(
        tmp_path: Path) -> None:
    """torch's load fails on it with a TypeError midway; the check raised that TypeError."""
    state = old_batchnorm_state(1)
    state._metadata[""]["version"] = "1"  # type: ignore[attr-defined]
    torch.save(state, tmp_path / "bn.pt")
    with pytest.raises(StateMismatchError, match=r"missing keys \['num_batches_tracked'\]"):
        CheckpointManager(tmp_path / "s").restore(tmp_path / "bn.pt",
                                                  model=torch.nn.BatchNorm1d(4))


def test_a_lazy_module_restored_without_every_key_takes_what_there_is(tmp_path: Path) -> None:
    """A missing key with a lazy module raised torch's raw ValueError ('Attempted to use an
    uninitialized parameter in numel'), looking for tied copies to fill it from."""
    saved = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    state = saved.state_dict()
    del state["1.bias"]
    torch.save(state, tmp_path / "partial.pt")
    lazy = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.LazyLinear(2))
    CheckpointManager(tmp_path / "s").restore(tmp_path / "partial.pt", model=lazy, strict=False)
    assert torch.equal(lazy[0].weight, saved[0].weight)
    with pytest.raises(StateMismatchError, match=r"missing keys \['1\.bias'\]"):
        CheckpointManager(tmp_path / "s").restore(
            tmp_path / "partial.pt",
            model=torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.LazyLinear(2)))


def test_a_wrapper_prefixed_state_that_relies_on_a_fill_restores(tmp_path: Path) -> None:
    """A DataParallel save ('module.') of an old BatchNorm without its counter, or of a
    tied model with one copy, was refused: 'without it do not fit this module either'."""
    saved = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    saved[1].running_mean.add_(2)
    torch.save(OrderedDict((f"module.{k}", v) for k, v in saved.state_dict().items()
                           if not k.endswith("num_batches_tracked")), tmp_path / "dp_bn.pt")
    restored = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    mgr = CheckpointManager(tmp_path / "s")
    mgr.restore(tmp_path / "dp_bn.pt", model=restored)
    assert torch.equal(restored[1].running_mean, saved[1].running_mean)
    tied = Tied()
    torch.save({"_orig_mod.emb.weight": tied.emb.weight.detach()}, tmp_path / "tied.pt")
    restored_tied = Tied()
    mgr.restore(tmp_path / "tied.pt", model=restored_tied)
    assert restored_tied.out.weight is restored_tied.emb.weight
    assert torch.equal(restored_tied.emb.weight, tied.emb.weight)


def test_the_prefix_hint_is_given_for_a_model_with_a_batchnorm(tmp_path: Path) -> None:
    """The counter torch fills in was left out of the module's keys it compared: a model
    with a BatchNorm had no hint."""
    def net() -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))

    class LitBN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = net()

    torch.save(net().state_dict(), tmp_path / "inner.pt")
    with pytest.raises(StateMismatchError, match=r"model: the module's keys are the "
                                                 r"checkpoint's with 'model\.' before them"):
        CheckpointManager(tmp_path / "s").restore(tmp_path / "inner.pt", model=LitBN())


def test_a_batchnorm_version_that_is_no_number_is_refused_with_every_key_there(
        tmp_path: Path) -> None:
    """With every key present, torch's load compared "2" < 2 midway: the Linear before the
    BatchNorm was loaded, then a StateMismatchError said it may be half loaded."""
    def net() -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))

    state = net().state_dict()
    state._metadata["1"]["version"] = "2"  # type: ignore[attr-defined]
    torch.save(state, tmp_path / "bn.pt")
    model = net()
    before = model[0].weight.clone()
    with pytest.raises(StateMismatchError, match=r"nothing was changed:\n  model: the "
                                                 r"checkpoint's version of 1 \(BatchNorm1d\) "
                                                 r"is '2', not a number"):
        CheckpointManager(tmp_path / "s").restore(tmp_path / "bn.pt", model=model)
    assert torch.equal(model[0].weight, before)


def test_the_cast_hint_is_given_only_where_a_cast_restores_the_file(tmp_path: Path) -> None:
    """It was given where shapes differed too, for mixed precision (float16 weights, a
    float32 BatchNorm: cast one way, the other failed), and as model.to(torch.int32)."""
    def net(width: int = 4) -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.BatchNorm1d(width))

    mixed = net().half()
    mixed[1].float()
    wider = net(5).half()
    counter = net().state_dict()
    counter["1.num_batches_tracked"] = counter["1.num_batches_tracked"].int()
    mgr = CheckpointManager(tmp_path / "s")
    for label, state, hint in (("mixed", mixed.state_dict(), "take the state from load()"),
                               ("wider", wider.state_dict(), None),
                               ("counter", counter, "take the state from load()")):
        torch.save(state, tmp_path / f"{label}.pt")
        with pytest.raises(StateMismatchError) as refused:
            mgr.restore(tmp_path / f"{label}.pt", model=net())
        message = str(refused.value)
        assert "cast model first" not in message, label
        assert (hint in message) if hint else ("load_state_dict() it" not in message), label


def test_a_refused_tied_state_names_only_the_key_the_file_holds(tmp_path: Path) -> None:
    """The key filled from its tied one was said to be '(6, 3) float32 in the checkpoint'."""
    torch.save({"emb.weight": torch.randn(6, 3)}, tmp_path / "t.pt")
    with pytest.raises(StateMismatchError, match=r"emb\.weight is \(6, 3\) float32 in the "
                                                 r"checkpoint") as refused:
        CheckpointManager(tmp_path / "s").restore(tmp_path / "t.pt", model=Tied())
    assert "out.weight" not in str(refused.value)


# (in a process of its own: a tensor left mapped from the file dies of SIGBUS there)
SAVED_OVER = textwrap.dedent("""
    import sys, torch
    from ckpt_nb import CheckpointManager
    store, path = sys.argv[1:]
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    mgr = CheckpointManager(store)
    cid = mgr.save(model, optimizer, 0, extra={"ema": torch.ones(64)})
    mgr.export(cid, path)
    fresh = torch.nn.Linear(64, 64)
    again = torch.optim.Adam(fresh.parameters())
    ck = mgr.restore(path, model=fresh, optimizer=again)
    with open(path, "wb"):  # (saved over in place, as torch.save does: the file cut short)
        pass
    exp_avg = again.state[fresh.weight]["exp_avg"]
    assert torch.equal(exp_avg, optimizer.state[model.weight]["exp_avg"])
    assert torch.equal(ck.extra["ema"], torch.ones(64))
    print("read")
""")


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_what_a_restore_from_a_file_keeps_outlives_the_file_saved_over(
        tmp_path: Path, suffix: str) -> None:
    """A file's tensors are mapped, not read whole: an optimizer keeps the tensors its
    load_state_dict is given, which must be copied out of the mapping first."""
    done = warm_python.run([sys.executable, "-c", SAVED_OVER, str(tmp_path / "s"),
                           str(tmp_path / f"run{suffix}")], timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "read", done.stderr


# (in a process of its own: a tensor left mapped from the file dies of SIGBUS there)
QUANTIZED_SAVED_OVER = textwrap.dedent("""
    import sys, warnings, torch
    from ckpt_nb import CheckpointManager
    warnings.simplefilter("ignore")
    store, path = sys.argv[1:]

    def build(seed):
        torch.manual_seed(seed)
        return torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(torch.nn.Linear(16, 16)), {torch.nn.Linear}, dtype=torch.qint8)

    saved, x = build(0), torch.randn(2, 16)
    torch.save({"model": saved.state_dict()}, path)
    live = build(1)
    CheckpointManager(store).restore(path, model=live)
    torch.save({"model": build(2).state_dict()}, path)  # (the next save, in place)
    assert torch.equal(live(x), saved(x)), "the restored model changed with the file"
    print("read")
""")


def test_a_quantized_model_restored_from_a_file_keeps_nothing_of_the_file(
        tmp_path: Path) -> None:
    """torch's quantized modules load by packing their weights, and the packed weights
    keep the bias tensor they are given: read from a mapped .pt it changed (or died of
    SIGBUS) once the file was saved over."""
    done = warm_python.run([sys.executable, "-c", QUANTIZED_SAVED_OVER, str(tmp_path / "s"),
                           str(tmp_path / "q.pt")], timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "read", done.stderr


def test_what_load_of_a_file_returns_does_not_change_with_the_file_saved_over(
        tmp_path: Path) -> None:
    """load(path) of a mapped .pt returned tensors of the mapping: the next torch.save to
    the same path, in place, changed the values held (silently, where the new file is as
    long) or killed the process with SIGBUS (where it is shorter)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    path = tmp_path / "last.pt"
    torch.save({"model": model.state_dict(), "best": model.weight.detach() * 2}, path)
    ck = CheckpointManager(tmp_path / "s").load(path)
    held, best = ck.state["model"]["weight"], ck.extra["best"]
    first = held.clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    torch.save({"model": model.state_dict(), "best": model.weight.detach() * 2}, path)
    assert torch.equal(held, first) and torch.equal(best, first * 2)
