"""A LoRA model (peft) whose adapters are merged into its base weights
(``merge_adapter()``, for a faster evaluation) holds that as a flag on each layer, which
its state_dict() does not: a state saved merged and restored into a fresh (unmerged)
model added the adapters twice; one saved unmerged and restored into a merged model
dropped them; silently, either way. A save and a restore now say so. (The layer is
drawn as peft draws it, its flag named as peft names it: CI has no peft.)"""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager, StateMismatchError


@pytest.fixture(autouse=True)
def peft_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check runs where peft is imported (a user of LoRA layers has): a stand-in."""
    monkeypatch.setitem(sys.modules, "peft", sys.modules.get("peft") or types.ModuleType("peft"))


class LoraLinear(torch.nn.Module):
    """As peft's LoRA Linear: a base layer, the adapter's A and B, ``merged_adapters``."""

    def __init__(self) -> None:
        super().__init__()
        self.base_layer = torch.nn.Linear(4, 4)
        self.lora_A = torch.nn.Linear(4, 2, bias=False)
        self.lora_B = torch.nn.Linear(2, 4, bias=False)
        self.merged_adapters: list[str] = []

    def delta(self) -> torch.Tensor:
        return self.lora_B.weight @ self.lora_A.weight

    def merge_adapter(self) -> None:
        with torch.no_grad():
            self.base_layer.weight += self.delta()
        self.merged_adapters.append("default")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        return out if self.merged_adapters else out + self.lora_B(self.lora_A(x))


def test_a_save_of_merged_adapters_and_a_restore_into_them_are_told(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(LoraLinear(), torch.nn.ReLU(), LoraLinear())
    x = torch.randn(3, 4)
    unmerged = model(x)
    mgr = CheckpointManager(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = mgr.save(model)  # (unmerged: nothing to say)
    for layer in (model[0], model[2]):
        layer.merge_adapter()
    with pytest.warns(RuntimeWarning, match="model: saved with the adapters of 2 layers "
                      "merged into its base weights .* unmerge_adapter"):
        mgr.save(model)
    with pytest.warns(RuntimeWarning, match="model: restoring into a model with the adapters "
                      "of 2 layers merged .* silently"):
        mgr.restore(plain, model=model)
    assert not torch.allclose(model(x), unmerged)  # (what it says: the adapters dropped)


class Peft(torch.nn.Module):
    """As peft's PeftModel names its keys: base_model.model. ahead of the base model's."""

    def __init__(self) -> None:
        super().__init__()
        self.base_model = torch.nn.Module()
        self.base_model.model = torch.nn.Sequential(LoraLinear())


@pytest.mark.parametrize("saved, live, said", [
    (Peft, lambda: torch.nn.Sequential(torch.nn.Linear(4, 4)),
     "model: the checkpoint is a LoRA (peft) model's, with its adapters; this module has "
     "none: restore into the model get_peft_model(base, config) gives"),
    (lambda: torch.nn.Sequential(torch.nn.Linear(4, 4)), Peft,
     "model: this module is a LoRA (peft) model, the checkpoint holds a model without "
     "adapters: restore into the base model before get_peft_model() wraps it"),
])
def test_a_lora_state_and_a_plain_model_are_told_apart_in_the_refusal(
        tmp_path: Path, saved, live, said: str) -> None:
    """The refusal listed ten missing and ten unexpected keys, which differ by more than a
    prefix (base_model.model., .base_layer.), and said nothing of why."""
    mgr = CheckpointManager(tmp_path)
    cid = mgr.save(saved())
    with pytest.raises(StateMismatchError) as caught:
        mgr.restore(cid, model=live())
    assert said in str(caught.value), str(caught.value)


def test_an_adapter_file_alone_is_told_how_peft_loads_it(tmp_path: Path) -> None:
    """peft's save_pretrained() writes the adapters alone, without the adapter's name."""
    from safetensors.torch import save_file
    model = Peft()
    adapters = {k: v
                for k, v in model.state_dict().items() if ".lora_" in k}
    save_file(adapters, tmp_path / "adapter_model.safetensors")
    with pytest.raises(StateMismatchError, match="adapters alone .* "
                       "set_peft_model_state_dict"):
        CheckpointManager(tmp_path / "store").restore(
            str(tmp_path / "adapter_model.safetensors"), model=Peft())


def test_without_peft_imported_no_model_is_walked(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """No LoRA layer is there to find (and the walk costs a large model's save time)."""
    monkeypatch.delitem(sys.modules, "peft")
    model = LoraLinear()
    model.merge_adapter()
    with CheckpointManager(tmp_path / "s") as mgr, warnings.catch_warnings():
        warnings.simplefilter("error")
        mgr.save(model)
