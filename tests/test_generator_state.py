"""A generator's state saved by keyword (``mgr.save(g=gen)``) and one a notebook's
checkpoint holds are one thing: each restores into the other's, in place."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckpt_nb
from ckpt_nb import CaptureError, CheckpointManager, StateMismatchError

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (rollbacks and auto())


def generators() -> dict[str, Any]:
    return {"tg": torch.Generator().manual_seed(1), "ng": np.random.default_rng(2),
            "rs": np.random.RandomState(3), "pg": random.Random(4)}


def draw(gens: dict[str, Any]) -> list[float]:
    return [torch.rand(1, generator=gens["tg"]).item(), gens["ng"].random(),
            gens["rs"].random_sample(), gens["pg"].random()]


def test_a_keyword_save_rolls_back_into_a_notebooks_generators(tmp_path: Path) -> None:
    """A torch.Generator saved by keyword failed the rollback: "g: load_state_dict failed
    ('state')" (the notebook's read its state under another key)."""
    gens = generators()
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(model=model, **gens)
    drawn = draw(gens)
    ckpt_nb.rollback("latest", directory=tmp_path, namespace={"model": model, **gens})
    assert draw(gens) == drawn


def test_a_notebooks_checkpoint_restores_into_generators_by_keyword(tmp_path: Path) -> None:
    gens = generators()
    model = torch.nn.Linear(2, 2)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1), **gens}
    with ckpt_nb.auto(str(tmp_path), namespace=ns, name="cell", every_steps=1):
        for _, x in ckpt_nb.batches([torch.ones(1, 2)] * 2):
            ns["opt"].zero_grad()
            model(x).sum().backward()
            ns["opt"].step()
    drawn = draw(gens)
    with CheckpointManager(tmp_path) as mgr:
        mgr.restore("latest", **gens)
    assert draw(gens) == drawn


def test_a_numpy_random_state_by_keyword_is_restored_in_place(tmp_path: Path) -> None:
    """It was refused: 'pass it in extra='."""
    rs = np.random.RandomState(5)
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(aug=rs)
        drawn = rs.random_sample(3)
        mgr.restore("latest", aug=rs)
        assert np.array_equal(rs.random_sample(3), drawn)


def test_a_system_random_by_keyword_is_refused_saying_what_to_use(tmp_path: Path) -> None:
    """It raised random's bare NotImplementedError."""
    with CheckpointManager(tmp_path) as mgr:
        with pytest.raises(CaptureError, match=r"SystemRandom has no state .*use a "
                                               r"random\.Random"):
            mgr.save(picker=random.SystemRandom())
        mgr.save(picker=random.Random(1))
        with pytest.raises(StateMismatchError, match=r"picker: a random\.SystemRandom has no "
                                                     r"state"):
            mgr.restore("latest", picker=random.SystemRandom())


def test_another_bit_generators_state_is_refused_before_anything_loads(
        tmp_path: Path) -> None:
    """NumPy raised its ValueError after the other objects had loaded."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(model=model, ng=np.random.default_rng(1))
        with torch.no_grad():
            model.weight.zero_()
        with pytest.raises(StateMismatchError, match=r"ng: the checkpoint holds a NumPy PCG64 "
                                                     r"state here, not a MT19937's"):
            mgr.restore("latest", model=model, ng=np.random.Generator(np.random.MT19937(2)))
        assert not model.weight.any()


def test_a_notebooks_system_random_is_skipped_by_name_not_a_failed_save(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its getstate()'s NotImplementedError stopped the cell at the first save."""
    model = torch.nn.Linear(2, 2)
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
          "picker": random.SystemRandom()}
    with ckpt_nb.auto(str(tmp_path), namespace=ns, name="cell", every_steps=1):
        for _, x in ckpt_nb.batches([torch.ones(1, 2)] * 2):
            ns["opt"].zero_grad()
            model(x).sum().backward()
            ns["opt"].step()
    ckpt_nb.rollback("latest", directory=tmp_path, namespace=ns)
    said = " ".join(capsys.readouterr().out.split())
    assert "picker (a SystemRandom, which has no state to save: use random.Random)" in said
