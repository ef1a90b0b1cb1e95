"""RNG snapshots: the cached NumPy and Python states must always equal what their
getters return."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_nb import CheckpointManager, RNGState, StateMismatchError
import warm_python  # (fresh interpreters forked from a warm one)
from conftest import DigitsRun, same
from digits_code import LOAD_DIGITS  # (scikit-learn's digits, scikit-learn not imported)


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


def restored(mgr: CheckpointManager, cid: str | Path, *, other_kind: bool = True) -> DigitsRun:
    """A new run restored from ``cid``, NumPy's global generator having moved on since to
    another state, and with ``other_kind`` to another bit generator (SFC64, or MT19937
    from an SFC64)."""
    if other_kind:
        np.random.set_bit_generator(np.random.MT19937(99) if isinstance(
            np.random.mtrand._rand._bit_generator, np.random.SFC64) else np.random.SFC64(99))
    else:
        np.random.seed(99)
    run = DigitsRun(seed=7)
    mgr.restore(cid, model=run.model, optimizer=run.optimizer, scheduler=run.scheduler)
    return run


@pytest.mark.usefixtures("global_bit_generator")
@pytest.mark.parametrize("kind", ["MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64"])
def test_training_resumes_bit_exact_whatever_numpys_global_bit_generator(
        tmp_path: Path, kind: str) -> None:
    """After np.random.set_bit_generator(PCG64(...)) every save raised KeyError: 1 (the
    snapshot read the state as MT19937's, 2,500 bytes from PCG64's smaller struct, and
    looked in get_state()'s dict as in its legacy tuple). A restore sets the saved
    kind of bit generator back, whichever the live one is."""
    np.random.set_bit_generator(getattr(np.random, kind)(5))
    run = DigitsRun()
    mgr = CheckpointManager(tmp_path)
    for step in range(3):
        numpy_step(run)
        cid = saved(mgr, run, step)
    expected = trained_on(run, 4)
    again = restored(mgr, cid)
    assert type(np.random.mtrand._rand._bit_generator).__name__ == kind
    assert same_training(trained_on(again, 4), expected)
    # (a reader of format 4 looks for NumPy's state under "numpy": it refuses the others)
    assert mgr._manifest(cid)["format"] == (3 if kind == "MT19937" else 5)


@pytest.mark.usefixtures("global_bit_generator")
@pytest.mark.parametrize("kind", ["PCG64", "Philox"])
@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_an_export_keeps_numpys_global_generator_of_another_bit_generator(
        tmp_path: Path, kind: str, suffix: str) -> None:
    """PCG64's state is two 128-bit ints, Philox's holds uint64 arrays: kept as plain
    values and tensors, an export brings them back, and so does its import's checkpoint."""
    np.random.set_bit_generator(getattr(np.random, kind)(5))
    run = DigitsRun()
    mgr = CheckpointManager(tmp_path / "store")
    numpy_step(run)
    exported = mgr.export(saved(mgr, run, 1), tmp_path / f"e{suffix}")
    imported = mgr.import_file(exported)
    expected = trained_on(run, 2)
    assert same_training(trained_on(restored(mgr, exported), 2), expected)
    assert same_training(trained_on(restored(mgr, imported), 2), expected)
    assert mgr._manifest(imported)["format"] == 5


@pytest.mark.usefixtures("global_bit_generator")
def test_a_refused_restore_leaves_the_notebooks_own_bit_generator(tmp_path: Path) -> None:
    """A restore refused after it set an MT19937's state puts the generators back as they
    were: NumPy's global one the very PCG64 the notebook set (and may draw from
    itself), in its state, not a new one of its kind."""
    mgr = CheckpointManager(tmp_path)
    np.random.seed(0)
    cid = mgr.save(torch.nn.Linear(4, 2))
    mine = np.random.PCG64(1)
    np.random.set_bit_generator(mine)
    before = mine.state
    with pytest.raises(StateMismatchError):
        mgr.restore(cid, model=torch.nn.Linear(4, 3))
    assert np.random.mtrand._rand._bit_generator is mine and mine.state == before


@pytest.mark.usefixtures("global_bit_generator")
def test_a_bit_generator_numpy_lacks_is_named_and_nothing_changes(tmp_path: Path) -> None:
    """A state saved with a bit generator of another library (randomgen's, say) cannot
    be set into a new one of its kind: the restore names it, and changes nothing."""
    np.random.set_bit_generator(np.random.PCG64(5))
    mgr = CheckpointManager(tmp_path / "store")
    model = torch.nn.Linear(2, 2)
    data = torch.load(mgr.export(mgr.save(model), tmp_path / "e.pt"), weights_only=True)
    data["rng"]["numpy_bit_generator"]["bit_generator"] = "AESCounter"
    torch.save(data, tmp_path / "other.pt")
    mine, weight = np.random.mtrand._rand._bit_generator, model.weight.detach().clone()
    before = mine.state
    with torch.no_grad():
        model.weight.add_(1)
    with pytest.raises(StateMismatchError, match="saved with a 'AESCounter' bit generator, "
                       r"not one of NumPy's .*np.random.set_bit_generator\(\) before the "
                       "restore, or restore with rng=False"):
        mgr.restore(tmp_path / "other.pt", model=model)
    assert np.random.mtrand._rand._bit_generator is mine and mine.state == before
    assert torch.equal(model.weight, weight + 1)

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
    assert same_training(trained_on(restored(mgr, cid, other_kind=False), 3), expected)


def test_a_rebound_mtrand_rand_does_not_hide_the_generator_np_random_draws_from(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """np.random's functions stay bound to the RandomState of NumPy's import: one a user
    rebinds np.random.mtrand._rand to is not what they draw from, and the snapshot's cache,
    keyed on it, gave a state from before the draws."""
    from ckpt_nb._capture import _numpy_state

    np.random.seed(11)
    _numpy_state()
    monkeypatch.setattr(np.random.mtrand, "_rand", np.random.RandomState(5))
    _numpy_state()  # (cached: the rebound one's struct does not move as np.random draws)
    np.random.rand(3)
    key, expected = _numpy_state()[1:3], np.random.get_state()[1:3]
    assert np.array_equal(key[0], expected[0]) and key[1] == expected[1]


# A training script under ckpt_nb.auto() whose batches and augmentation NumPy's global
# generator draws, a PCG64 set as that generator's (argv: store, the step it SIGKILLs
# itself at or 0, and whether to set the PCG64). It prints its weights' digest, NumPy's
# next draw and the bit generator's kind at its end.
NUMPY_TRAINER = """
import hashlib, os, signal, sys
import numpy as np, torch, ckpt_nb
store, crash_at, set_pcg64 = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "pcg64"
if set_pcg64:
    np.random.set_bit_generator(np.random.PCG64(0))
torch.manual_seed(0)
""" + LOAD_DIGITS + """
data = load_digits()
x, y = torch.tensor(data.data / 16.0, dtype=torch.float32), torch.tensor(data.target)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
step = 0
with ckpt_nb.auto(store, name="train", every_steps=1, sync=True,
                  namespace={"model": model, "opt": opt}):
    for epoch in ckpt_nb.epochs(3):
        for _ in ckpt_nb.batches(range(5)):
            idx = torch.from_numpy(np.random.randint(0, len(x), 64))
            noise = torch.from_numpy(np.random.standard_normal((64, 64))).float()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx] + 0.05 * noise), y[idx])
            loss.backward()
            opt.step()
            step += 1
            if step == crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values()))
print(digest.hexdigest(), repr(np.random.random()),
      type(np.random.mtrand._rand._bit_generator).__name__)
"""


def test_a_run_under_a_pcg64_resumes_bit_exact_in_a_new_process(tmp_path: Path) -> None:
    """Killed mid-epoch and run again in a new process, which has not set the PCG64 (its
    set-up cell not run again): the resume sets NumPy's generator back to the saved PCG64
    and its state, and the run ends as an unstopped one (the loop died with KeyError: 1
    at its first batch)."""
    def trained(store: str, crash_at: int, setup: str) -> subprocess.CompletedProcess[str]:
        return warm_python.run([sys.executable, "-c", NUMPY_TRAINER, str(tmp_path / store),
                                str(crash_at), setup], timeout=300)

    unstopped = trained("unstopped", 0, "pcg64")
    assert unstopped.returncode == 0, unstopped.stderr
    assert trained("run", 8, "pcg64").returncode == -signal.SIGKILL
    resumed = trained("run", 0, "none")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout, resumed.stdout
    last = unstopped.stdout.splitlines()[-1]
    assert last.endswith(" PCG64") and resumed.stdout.splitlines()[-1] == last
