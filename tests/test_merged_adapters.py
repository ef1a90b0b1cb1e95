"""A LoRA model (peft) whose adapters are merged into its base weights
(``merge_adapter()``, for a faster evaluation) holds that as a flag on each layer, which
its state_dict() does not: a state saved merged and restored into a fresh (unmerged)
model added the adapters twice; one saved unmerged and restored into a merged model
dropped them; silently, either way. A save and a restore now say so. (The layer is
drawn as peft draws it, its flag named as peft names it: CI has no peft.)"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from ckpt_nb import CheckpointManager


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
