"""Keywords a torch or Lightning user passes out of habit were taken as Statefuls:
restore(map_location="cpu") said "map_location: not in the checkpoint", as if the
checkpoint lacked something, and save(metric=..., val_loss=..., global_step=...,
notes=...) said "pass it in extra=", where metrics=, step= or note= was meant."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import DigitsRun, same

from ckpt_nb import CheckpointManager


def test_restore_names_what_it_does_instead_of_torch_loads_options(
        tmp_path: Path, digits: DigitsRun) -> None:
    with CheckpointManager(tmp_path / "store") as mgr:
        digits.train_step()
        mgr.save(digits.model, digits.optimizer, 0)
        digits.train_step()
        trained = digits.weights()
        with pytest.raises(TypeError, match=(
                r"^restore\(\) got map_location='cpu', torch.load's option, which restore\(\) "
                r"does not take: restore copies the checkpoint into each live tensor where it "
                r"is, on its device, so the option is not needed: for another device, move "
                r"the model there first .*load_state_dict the state from load\(\), which casts "
                r"each tensor \(nothing was changed\)$")):
            mgr.restore("latest", model=digits.model, map_location="cpu")
        with pytest.raises(TypeError, match=(
                r"got weights_only=True, torch.load's option, .*: restore never unpickles a "
                r"value unless trust_pickle=True \(for a store you trust\)")):
            mgr.restore("latest", model=digits.model, weights_only=True)
        with pytest.raises(TypeError, match=r"got strickt=False, .* did you mean strict=\?"):
            mgr.restore("latest", model=digits.model, strickt=False)
        assert same(digits.weights(), trained)  # (refused before anything changed)


@pytest.mark.parametrize(("given", "meant"), [
    ({"metric": {"val_loss": 0.3}}, "did you mean metrics=?"),
    ({"val_loss": 0.3}, "did you mean metrics={'val_loss': 0.3}?"),
    ({"val_acc": torch.tensor(0.75)}, "did you mean metrics={'val_acc': tensor(0.7500)}?"),
    ({"global_step": 100}, "did you mean step=?"),
    ({"notes": "x"}, "did you mean note=?"),
    ({"lr": 0.01}, "pass it in extra={'lr': ...} if it is plain data"),
])
def test_save_names_the_option_a_plain_keyword_meant(
        tmp_path: Path, digits: DigitsRun, given: dict, meant: str) -> None:
    with CheckpointManager(tmp_path / "store") as mgr:
        with pytest.raises(TypeError) as refused:
            mgr.save(digits.model, digits.optimizer, 0, **given)
        assert list(mgr.list()["id"]) == []
    (name, value), = given.items()
    assert str(refused.value) == (
        f"save() got {name}={value!r}, but a further keyword names an object to save (one "
        f"with state_dict() / load_state_dict()), and {type(value).__name__} has none: "
        f"{meant} (nothing was saved)")


def test_a_further_stateful_by_any_keyword_still_saves_and_restores(
        tmp_path: Path, digits: DigitsRun) -> None:
    """Any Stateful by keyword is a contract, whatever its name (lr_scheduler is close to
    scheduler=, a generator to none)."""
    generator = torch.Generator().manual_seed(3)
    with CheckpointManager(tmp_path / "store") as mgr:
        digits.train_step()
        mgr.save(digits.model, digits.optimizer, 0, lr_scheduler=digits.scheduler,
                 loader_gen=generator)
        drawn = torch.rand(3, generator=generator)
        digits.scheduler.step()
        ck = mgr.restore("latest", digits.model, digits.optimizer,
                         lr_scheduler=digits.scheduler, loader_gen=generator)
    assert ck.kinds["lr_scheduler"] == "torch.optim.lr_scheduler.StepLR"
    assert torch.equal(torch.rand(3, generator=generator), drawn)
