"""RNG snapshots: the cached NumPy and Python states must always equal what their
getters return."""

from __future__ import annotations

import random

import numpy as np
import torch

from ckpt_nb import RNGState


def same_numpy(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def test_numpy_snapshot_follows_every_kind_of_draw() -> None:
    np.random.seed(3)
    draws = [lambda: None, lambda: np.random.rand(), lambda: np.random.randn(),  # odd: caches
             lambda: np.random.randn(), lambda: np.random.randint(5, size=700),
             lambda: np.random.seed(3), lambda: np.random.standard_normal(3),
             lambda: np.random.set_state(np.random.get_state())]
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
