"""Checkpoints of compiled modules inside other modules, and torch.save files of compiled
modules, pair with their plain forms."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.optim.swa_utils import AveragedModel

import ckpt_nb


def net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))


def trained_ema() -> AveragedModel:
    torch.manual_seed(0)
    model = net()
    ema = AveragedModel(torch.compile(model, backend="eager"))
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ema.update_parameters(model)
    return ema


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return len(sa) == len(sb) and all(torch.equal(x, y) for x, y in zip(sa.values(),
                                                                        sb.values()))


def test_an_average_of_a_compiled_model_restores_into_one_of_the_plain_model_and_back(
        tmp_path: Path) -> None:
    """AveragedModel(torch.compile(m)) saved keys 'module._orig_mod.0.weight': restored into
    AveragedModel(m) it was refused (missing 'module.0.weight'), and the other way round."""
    ema = trained_ema()
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        compiled_id = mgr.save(ema, None, 0)
        plain = AveragedModel(net())
        mgr.restore(compiled_id, model=plain)
        assert same(plain, ema) and int(plain.n_averaged) == 3
        plain_id = mgr.save(plain, None, 1)
        back = AveragedModel(torch.compile(net(), backend="eager"))
        mgr.restore(plain_id, model=back)
        assert same(back, ema)


def test_a_torch_save_of_a_compiled_model_imports_under_the_plain_keys(tmp_path: Path) -> None:
    """import_file kept '_orig_mod.weight': diff against the same model saved natively
    listed every tensor as removed and added."""
    model = torch.nn.Linear(4, 2)
    compiled = torch.compile(model, backend="eager")
    torch.save({"model_state_dict": compiled.state_dict(), "epoch": 0}, tmp_path / "a.pt")
    torch.save(compiled.state_dict(), tmp_path / "bare.pt")
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        native = mgr.save(compiled, None, 0)
        for name in ("a.pt", "bare.pt"):
            imported = mgr.import_file(tmp_path / name)
            table = mgr.diff(native, imported)
            weights = table[table["tensor"].str.startswith("objects/model/")]
            assert list(weights["status"]) == ["identical", "identical"], table
            for target in (torch.nn.Linear(4, 2),
                           torch.compile(torch.nn.Linear(4, 2), backend="eager")):
                mgr.restore(imported, model=target)
                assert same(target, model)
