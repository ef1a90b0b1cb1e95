"""RNG snapshots: the cached NumPy and Python states must always equal what their
getters return."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_nb import CheckpointManager, RNGState
from conftest import DigitsRun, same


def same_numpy(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


@pytest.fixture
def global_bit_generator() -> Iterator[None]:
    """The tests set NumPy's global bit generator: the next test finds the one before."""
    before = np.random.mtrand._rand._bit_generator
    yield
    np.random.set_bit_generator(before)


@pytest.mark.usefixtures("global_bit_generator")
def test_numpy_snapshot_follows_every_kind_of_draw() -> None:
    np.random.seed(3)
    draws = [lambda: None, lambda: np.random.rand(), lambda: np.random.randn(),  # odd: caches
             lambda: np.random.randn(), lambda: np.random.randint(5, size=700),
             lambda: np.random.seed(3), lambda: np.random.standard_normal(3),
             lambda: np.random.set_state(np.random.get_state()),
             lambda: np.random.set_bit_generator(np.random.MT19937(3))]  # (a struct of its own)
    for i in range(200):
        draws[i % len(draws)]()
        assert same_numpy(RNGState.snapshot()[1], np.random.get_state()), i


def test_python_snapshot_follows_every_kind_of_draw() -> None:
    random.seed(3)
    draws = [lambda: None, lambda: random.random(), lambda: random.gauss(0, 1),  # caches
             lambda: random.gauss(0, 1), lambda: random.getrandbits(3000),
             lambda: random.seed(3), lambda: random.shuffle(list(range(50))),
             lambda: random.setstate(random.getstate()), lambda: random.seed(3),
             lambda: random.gauss(0, 1), lambda: random.setstate(random.getstate())]
    for i in range(200):
        draws[i % len(draws)]()
        assert RNGState.snapshot()[0] == random.getstate(), i


def test_state_dict_round_trips_all_generators() -> None:
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    np.random.randn()  # a cached Gaussian is part of the state
    saved = RNGState().state_dict()
    expected = (random.random(), np.random.randn(), np.random.rand(), torch.rand(3))
    random.random()
    np.random.rand(9)
    torch.rand(5)
    RNGState().load_state_dict(saved)
    again = (random.random(), np.random.randn(), np.random.rand(), torch.rand(3))
    assert expected[:3] == again[:3] and torch.equal(expected[3], again[3])


def test_numpy_snapshot_after_a_load_brings_back_a_cached_gaussian() -> None:
    """load_state_dict can set the very key and position last copied, with a Gaussian
    cached where the copy had none: the snapshot then said has_gauss=0."""
    np.random.seed(0)
    np.random.randn()  # an odd draw: a Gaussian cached
    with_cache = RNGState().state_dict()
    expected = np.random.randn()  # uses the cache: key and position stay as they were
    assert RNGState.snapshot()[1][3] == 0
    RNGState().load_state_dict(with_cache)
    assert same_numpy(RNGState.snapshot()[1], np.random.get_state())
    assert np.random.randn() == expected


def numpy_step(run: DigitsRun) -> float:
    """A training step whose batch and augmentation NumPy's global generator draws: an
    odd number of Gaussians, so that every other step ends with one cached."""
    idx = torch.from_numpy(np.random.randint(0, len(run.x), 64))
    noise = torch.from_numpy(np.random.standard_normal((64, 64))).float()
    jitter = 1 + 0.01 * np.random.randn()
    run.optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(run.model(run.x[idx] * jitter + 0.05 * noise),
                                             run.y[idx])
    loss.backward()
    run.optimizer.step()
    run.scheduler.step()
    return loss.item()


def trained_on(run: DigitsRun, steps: int) -> tuple[list[float], list[torch.Tensor], float]:
    """The losses of ``steps`` more steps, the weights after them and NumPy's next draw."""
    return [numpy_step(run) for _ in range(steps)], run.weights(), np.random.random()


def same_training(a: tuple[list[float], list[torch.Tensor], float],
                  b: tuple[list[float], list[torch.Tensor], float]) -> bool:
    return a[0] == b[0] and same(a[1], b[1]) and a[2] == b[2]


def saved(mgr: CheckpointManager, run: DigitsRun, step: int) -> str:
    return mgr.save(run.model, run.optimizer, scheduler=run.scheduler, step=step)


def restored(mgr: CheckpointManager, cid: str | Path) -> DigitsRun:
    """A new run restored from ``cid``, NumPy's global generator having moved on since."""
    np.random.seed(99)
    run = DigitsRun(seed=7)
    mgr.restore(cid, model=run.model, optimizer=run.optimizer, scheduler=run.scheduler)
    return run


def test_a_gaussian_cached_by_a_state_put_back_is_saved(tmp_path: Path) -> None:
    """A loader that previews its next batch and puts NumPy's state back (get_state,
    draws, set_state) brings back the key and position last snapshot with a Gaussian
    cached where the snapshot had none: the save recorded has_gauss=0, and the resumed
    run drew other numbers from then on."""
    np.random.seed(0)
    run = DigitsRun()
    numpy_step(run)  # (an odd number of Gaussians: one is cached)
    mgr = CheckpointManager(tmp_path)
    preview = np.random.get_state()
    np.random.randn()  # (the cached one: key and position stay)
    saved(mgr, run, 1)
    np.random.set_state(preview)
    cid = saved(mgr, run, 1)
    expected = trained_on(run, 3)
    assert same_training(trained_on(restored(mgr, cid), 3), expected)
