"""restore(strict=False) loaded a backbone from a whole model's checkpoint without a word
of what it skipped, where torch's load_state_dict(strict=False) returns the missing and
unexpected keys."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import DigitsRun

from ckpt_nb import CheckpointManager


def test_a_restore_with_strict_false_names_what_each_module_skipped(
        tmp_path: Path, digits: DigitsRun) -> None:
    for _ in range(3):
        digits.train_step()
    with CheckpointManager(tmp_path / "store") as mgr:
        mgr.save(digits.model, digits.optimizer, 0)
        backbone = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
        wider = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10), torch.nn.Linear(10, 2))
        cut = mgr.restore("latest", model=backbone, strict=False)
        assert cut.unexpected_keys == {"model": ["2.weight", "2.bias"]}
        assert cut.missing_keys == {}
        assert torch.equal(backbone[0].weight, digits.model[0].weight)
        grown = mgr.restore("latest", model=wider, strict=False)
        assert grown.missing_keys == {"model": ["3.weight", "3.bias"]}
        assert grown.unexpected_keys == {}
        assert torch.equal(wider[2].bias, digits.model[2].bias)
        whole = DigitsRun(seed=1)
        strict = mgr.restore("latest", model=whole.model, optimizer=whole.optimizer)
        loose = mgr.restore("latest", model=whole.model, strict=False)  # (all of it fits)
    assert strict.missing_keys == strict.unexpected_keys == {}
    assert loose.missing_keys == loose.unexpected_keys == {}
