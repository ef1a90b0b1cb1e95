"""A resume's data order and augmentation, bit-identical to a run never stopped: the
notebook's own generators a Dataset draws from, a loader wrapped in a progress bar, and
generators a sampler or dataset holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb._discovery import discover
from test_magics import final_state, run, same  # (the shell's helpers)
from test_session_jobs import script, unstopped_and_resumed  # (fresh interpreters)

# A script killed (DIE) mid-epoch, after a save at epoch 1, batch 6; it prints a digest of
# its parameters. ``data`` defines ``loader``; ``wrap`` is what batches() is given.
SCRIPT = """
import hashlib, os, random, numpy as np, torch, ckpt_nb
from tqdm import tqdm
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
{data}
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
with ckpt_nb.auto("store", every_steps=4):
    for epoch in ckpt_nb.epochs(2):
        for i, (xb, yb) in ckpt_nb.batches({wrap}):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if os.environ["DIE"] and epoch == 1 and i == 7:
                os.kill(os.getpid(), 9)
print("params", hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                      for p in model.parameters())).hexdigest())
"""

# A Dataset augmenting from a generator of the notebook's (``noise()``).
AUGMENTED = """
{rng}
class Augmented(torch.utils.data.Dataset):
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return X[i] + 0.1 * noise(), Y[i]

loader = torch.utils.data.DataLoader(Augmented(), batch_size=20, shuffle=True)
"""

NOTEBOOK_GENERATORS = {
    "torch": "aug = torch.Generator().manual_seed(123)\n"
             "def noise(): return torch.randn(8, generator=aug)",
    "numpy": "aug = np.random.default_rng(5)\n"
             "def noise(): return torch.from_numpy(aug.normal(size=8).astype('float32'))",
    "legacy numpy": "aug = np.random.RandomState(5)\n"
                    "def noise(): return torch.from_numpy(aug.normal(size=8).astype('float32'))",
    "python": "aug = random.Random(5)\n"
              "def noise(): return torch.tensor([aug.gauss(0, 1) for _ in range(8)])",
}

# A sampler drawing its order from a NumPy generator of its own, and a dataset augmenting
# from a torch.Generator it holds (under names of their own).
HELD = """
class Shuffled(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n, self.rng = n, np.random.default_rng(11)
    def __len__(self):
        return self.n
    def __iter__(self):
        return iter(self.rng.permutation(self.n).tolist())

class Augmented(torch.utils.data.Dataset):
    def __init__(self):
        self.noise = torch.Generator().manual_seed(7)
    def __len__(self):
        return len(X)
    def __getitem__(self, i):
        return X[i] + 0.1 * torch.randn(8, generator=self.noise), Y[i]

loader = torch.utils.data.DataLoader(Augmented(), batch_size=20, sampler=Shuffled(len(X)))
"""

OWN_GENERATOR = """
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20,
                                     shuffle=True, generator=torch.Generator().manual_seed(42))
"""


def killed_and_resumed(tmp_path: Path, data: str, wrap: str = "loader") -> tuple[str, str]:
    """The parameters' digest of a run never stopped, and of a run killed and run again."""
    code = SCRIPT.format(data=data, wrap=wrap)
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    assert "resumed from" in resumed.stdout + resumed.stderr
    return reference.stdout.split()[-1], resumed.stdout.split()[-1]


@pytest.mark.parametrize("kind", NOTEBOOK_GENERATORS)
def test_augmentation_from_a_notebook_generator_resumes_bit_exact_after_a_kill(
        tmp_path: Path, kind: str) -> None:
    """The resume put the notebook's generator back as saved, then fetched the skipped
    batches through the Dataset, which drew from it again; and the save held it as after
    the next batch's fetch, which the resume fetches again."""
    expected, resumed = killed_and_resumed(
        tmp_path, AUGMENTED.format(rng=NOTEBOOK_GENERATORS[kind]))
    assert resumed == expected


# A generator of batches of the user's (no DataLoader), drawing the epoch's order from a
# generator of the notebook's as it starts: at the first batch's fetch, inside batches().
BATCH_GENERATORS = {
    "torch": "order = torch.Generator().manual_seed(5)\n"
             "def permutation(): return torch.randperm(len(X), generator=order)",
    "numpy": "order = np.random.default_rng(5)\n"
             "def permutation(): return torch.from_numpy(order.permutation(len(X)))",
}

OWN_BATCHES = """
{rng}
def shuffled(size):
    perm = permutation()
    for k in range(0, len(X), size):
        yield X[perm[k:k + size]], Y[perm[k:k + size]]
"""


@pytest.mark.parametrize("kind", BATCH_GENERATORS)
def test_a_generator_of_batches_drawing_its_order_from_a_notebook_generator_resumes_bit_exact(
        tmp_path: Path, kind: str) -> None:
    """batches(shuffled(20)): the resume set the notebook's generator as saved, mid-epoch,
    before the replay's first fetch drew the epoch's permutation from it: the epoch went
    on in another order (the start line said resumed). It is set as the loop began for the
    replay now, and put back as saved after it."""
    expected, resumed = killed_and_resumed(
        tmp_path, OWN_BATCHES.format(rng=BATCH_GENERATORS[kind]), wrap="shuffled(20)")
    assert resumed == expected


# A Sampler of the user's drawing the epoch's order from a notebook generator it names
# (not one it holds), as the loader's iterator starts: at the first batch's fetch.
GLOBAL_SAMPLER = """
order = torch.Generator().manual_seed(5)
class Shuffled(torch.utils.data.Sampler):
    def __len__(self):
        return len(X)
    def __iter__(self):
        return iter(torch.randperm(len(X), generator=order).tolist())

loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20,
                                     sampler=Shuffled())
"""


def test_a_sampler_drawing_from_a_notebook_generator_it_names_resumes_bit_exact(
        tmp_path: Path) -> None:
    """The start line said "ckpt_nb.batches() restores its order", and the resumed epoch
    went on in another: the sampler drew its permutation from ``order`` as saved."""
    expected, resumed = killed_and_resumed(tmp_path, GLOBAL_SAMPLER)
    assert resumed == expected


# Two loaders zipped (semi-supervised: labelled and unlabelled batches), their orders drawn
# from notebook generators as their iterators start, at the first fetch.
ZIPPED = """
first, second = torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)
labelled = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X[:100], Y[:100]),
                                       batch_size=10, shuffle=True, generator=first)
unlabelled = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X[100:]),
                                         batch_size=10, shuffle=True, generator=second)
def pairs():
    for (xb, yb), (xu,) in zip(labelled, unlabelled):
        yield xb + 0.1 * xu.mean(0), yb
"""


def test_zipped_loaders_with_notebook_generators_resume_bit_exact(tmp_path: Path) -> None:
    """batches() given what a zip of two loaders yields: the generators their samplers drew
    the orders from (the loaders' generator=, notebook variables) were as saved."""
    expected, resumed = killed_and_resumed(tmp_path, ZIPPED, wrap="pairs()")
    assert resumed == expected


def test_a_loader_in_a_progress_bar_resumes_its_own_generators_order(tmp_path: Path) -> None:
    """batches(tqdm(loader)) looked for the loader's generator= on the progress bar."""
    expected, resumed = killed_and_resumed(tmp_path, OWN_GENERATOR,
                                           wrap="tqdm(loader, disable=True)")
    assert resumed == expected


def test_generators_a_sampler_and_dataset_hold_resume_bit_exact(tmp_path: Path) -> None:
    """Only a DataLoader's generator= and its samplers' ``generator`` were saved: a
    sampler's own NumPy generator and a dataset's torch.Generator started the resumed
    epoch elsewhere, while the start line said its order was restored."""
    expected, resumed = killed_and_resumed(tmp_path, HELD)
    assert resumed == expected


def test_a_sampler_whose_generator_changed_kind_since_the_save_still_resumes(
        tmp_path: Path) -> None:
    """A saved state of a generator of another kind (the sampler's NumPy one, now a
    random.Random) is not set on it (it would fail): the order is the new sampler's."""
    (tmp_path / "run").mkdir()
    script(tmp_path / "run", "train.py", SCRIPT.format(data=HELD, wrap="loader"), die=True)
    changed = HELD.replace("np.random.default_rng(11)", "random.Random(11)").replace(
        "self.rng.permutation(self.n).tolist()", "self.rng.sample(range(self.n), self.n)")
    resumed = script(tmp_path / "run", "train.py", SCRIPT.format(data=changed, wrap="loader"))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout + resumed.stderr


def test_the_start_line_names_a_loaders_generator_that_no_checkpoint_holds() -> None:
    """The start line said "ckpt_nb.batches() restores its order" of a loader whose
    sampler draws from a SystemRandom, whose state nothing can save."""
    class Shuffled(torch.utils.data.Sampler[int]):
        def __init__(self) -> None:
            import random
            self.rng = random.SystemRandom()

        def __len__(self) -> int:
            return 4

        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(self.rng.sample(range(4), 4))

    loader = torch.utils.data.DataLoader(list(range(4)), sampler=Shuffled())
    summary = discover({"loader": loader}).summary()
    assert "wrap it in ckpt_nb.batches() to restore its order, but not the draws from " \
        "sampler.rng (a SystemRandom, which has no state to save: use random.Random)" \
        in summary, summary
    plain = torch.utils.data.DataLoader(list(range(4)), shuffle=True)
    assert discover({"loader": plain}).summary().endswith(
        "(DataLoader: wrap it in ckpt_nb.batches() to restore its order)")


# The same in a kernel: a cell interrupted mid-epoch, then run again.
SETUP = """
import os, signal, random, numpy as np, torch, ckpt_nb
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
""" + AUGMENTED + """
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

def stop_if(point):
    if os.path.exists(point):
        os.remove(point)
        os.kill(os.getpid(), signal.SIGINT)
"""

TRAIN = """%%ckpt_auto --dir {dir} --every-steps 4
for epoch in ckpt_nb.epochs(3):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        stop_if(f"after-{{epoch}}-{{i}}")
"""


def stopped_then_resumed(shell, capsys, tmp_path: Path, setup: str, cell: str, stop_at: str,
                         stopped_by: type[BaseException],
                         when_stopped: Callable[[], None] = lambda: None) -> None:
    """A reference run of ``cell`` (a template of ``dir``), then one stopped by
    ``stopped_by`` where the file ``stop_at`` is (``tmp_path / "run"``'s store; then
    ``when_stopped`` checks it), run again: it resumes, and ends bit-exact where the
    reference did."""
    run(shell, setup)
    assert run(shell, cell.format(dir=tmp_path / "ref")).success
    expected = final_state(shell)

    run(shell, setup)
    (tmp_path / stop_at).touch()
    cell = cell.format(dir=tmp_path / "run")
    assert isinstance(run(shell, cell).error_in_exec, stopped_by)
    when_stopped()
    capsys.readouterr()
    assert run(shell, cell).success
    assert "resumed from" in capsys.readouterr().out
    assert same(final_state(shell), expected)


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_augmentation_from_a_notebook_generator_resumes_bit_exact_after_an_interrupt(
        shell, tmp_path: Path, capsys, kind: str) -> None:
    """The same kernel, the cell interrupted mid-epoch and run again: the skipped batches
    drew from the notebook's generator after it was put back."""
    stopped_then_resumed(shell, capsys, tmp_path, SETUP.format(rng=NOTEBOOK_GENERATORS[kind]),
                         TRAIN, "after-1-4", KeyboardInterrupt)
    assert ckpt_nb.status() == {"active": False}


FAILING = TRAIN.replace("        opt.zero_grad()\n", "        fail_if(f\"fail-{{epoch}}-{{i}}\")\n"
                        "        opt.zero_grad()\n")


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_augmentation_from_a_notebook_generator_resumes_bit_exact_after_an_error(
        shell, tmp_path: Path, capsys, kind: str) -> None:
    """An error raised after a batch was fetched saved the consistent point before the
    fetch with the notebook's generator as the fetch left it: the resume fetched that
    batch again from there, and drew other augmentation."""
    setup = SETUP.format(rng=NOTEBOOK_GENERATORS[kind]) + (
        "def fail_if(point):\n    if os.path.exists(point):\n        os.remove(point)\n"
        "        raise RuntimeError('boom')\n")

    def error_saved() -> None:
        assert "RuntimeError in the cell" in ckpt_nb.CheckpointManager(tmp_path / "run").list(
            )["note"].iloc[-1]

    stopped_then_resumed(shell, capsys, tmp_path, setup, FAILING, "fail-1-5", RuntimeError,
                         error_saved)


OWN_ONLY = """
class Plain(torch.utils.data.Dataset):
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return X[i], Y[i]

loader = torch.utils.data.DataLoader(Plain(), batch_size=20, shuffle=True,
                                     generator=torch.Generator().manual_seed(3))
"""


def test_a_checkpoint_holding_fewer_loader_generators_puts_back_those_it_holds(
        tmp_path: Path) -> None:
    """A run saved by an earlier ckpt_nb holds its loader's generator= alone; resumed by one
    that also counts a generator its Dataset holds, no state was put back (the lists
    differed in length): the epoch replayed another order, silently."""
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    before = SCRIPT.format(data=OWN_ONLY, wrap="loader")
    reference = script(tmp_path / "ref", "train.py", before)
    script(tmp_path / "run", "train.py", before, die=True)
    now = SCRIPT.format(data=OWN_ONLY.replace(
        "class Plain(torch.utils.data.Dataset):\n",
        "class Plain(torch.utils.data.Dataset):\n"
        "    def __init__(self):\n        self.rng = np.random.default_rng(1)  # (unused)\n\n"),
        wrap="loader")
    resumed = script(tmp_path / "run", "train.py", now)
    assert resumed.returncode == 0, resumed.stderr
    out = resumed.stdout + resumed.stderr
    assert "resumed from" in out and "the checkpoint holds the state of 1 of this loader's 2 " \
        "generators" in out, out
    assert resumed.stdout.split()[-1] == reference.stdout.split()[-1]


# batches(zip(l1, l2)): zip() makes the loaders' iterators before batches() begins (each
# draws its workers' base seed from its generator=), and their samplers draw the epoch's
# order at the first fetch, inside batches(). ``generators``: written inline in each
# DataLoader(...) or notebook variables; ``die``: the batch of epoch 1 the run is killed
# at (2: its newest save is at epoch 0's end; 8: mid-epoch 1).
ZIPPED_INLINE = """
import hashlib, os, torch, ckpt_nb
from torch.utils.data import DataLoader, TensorDataset
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
{generators}
labelled = DataLoader(TensorDataset(X[:100], Y[:100]), batch_size=10, shuffle=True,
                      generator={first})
unlabelled = DataLoader(TensorDataset(X[100:]), batch_size=10, shuffle=True,
                        generator={second})
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
with ckpt_nb.auto("store", every_steps=5, sync=True):  # (the kill loses no save)
    for epoch in ckpt_nb.epochs(3):
        for i, ((xb, yb), (xu,)) in ckpt_nb.batches(zip(labelled, unlabelled)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb + 0.1 * xu.mean(0)), yb).backward()
            opt.step()
            if os.environ["DIE"] and epoch == 1 and i == {die}:
                os.kill(os.getpid(), 9)
print("params", hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                      for p in model.parameters())).hexdigest())
"""

ZIPPED_GENERATORS = {
    "inline": dict(generators="", first="torch.Generator().manual_seed(7)",
                   second="torch.Generator().manual_seed(8)"),
    "named": dict(generators="g1, g2 = torch.Generator().manual_seed(7), "
                             "torch.Generator().manual_seed(8)", first="g1", second="g2"),
}


@pytest.mark.parametrize("generators, die", [("inline", 2), ("inline", 8), ("named", 2)],
                         ids=["inline, epoch end", "inline, mid-epoch", "named, epoch end"])
def test_zipped_loaders_given_to_batches_resume_bit_exact(tmp_path: Path, generators: str,
                                                          die: int) -> None:
    """batches(zip(labelled, unlabelled)) with the loaders' generator= written inline: the
    resumed epoch went on in another order (the rerun's loaders start from their seeds), while
    the start line said "ckpt_nb.batches() restores its order". batches() sees through the
    zip to the loaders' iterators now: their generators are saved as the loop begins and set
    for the replay (at an epoch's end, as saved, with the base seed zip() drew redrawn)."""
    code = ZIPPED_INLINE.format(die=die, **ZIPPED_GENERATORS[generators])
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    assert f"step {10 if die == 2 else 15})" in resumed.stdout  # (resumed from)
    assert resumed.stdout.split()[-1] == reference.stdout.split()[-1]


def test_a_loader_in_a_progress_bar_inside_a_zip_resumes_bit_exact_mid_epoch(
        tmp_path: Path) -> None:
    """batches(zip(tqdm(labelled), unlabelled)), generator= written inline: zip() holds the
    progress bar's iterator (a generator yet to start, which makes the loader's at the first
    fetch), where batches() looked for a DataLoader's alone: labelled's generator was neither
    saved nor set, and the resumed epoch went on in another order without a word. Found
    through the wrapper now, it draws its order (and its workers' seed) in the loop, as a
    loader given alone does: set as the loop began, the epoch is the unstopped run's. (With
    workers here; without, in the kernel interrupted: ..._resumes_in_the_kernel_interrupted.)"""
    code = ZIPPED_INLINE.format(die=8, **ZIPPED_GENERATORS["inline"]).replace(
        "generator=torch.Generator().manual_seed(7))",
        "generator=torch.Generator().manual_seed(7), num_workers=1)").replace(
        "batches(zip(labelled, unlabelled))",
        "batches(zip(tqdm(labelled, disable=True), unlabelled))").replace(
        "import hashlib", "from tqdm import tqdm\nimport hashlib")
    assert "zip(tqdm(" in code and "num_workers=1" in code
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    assert "step 15)" in resumed.stdout  # (resumed from epoch 1, batch 6)
    assert "another order" not in resumed.stdout, resumed.stdout
    assert resumed.stdout.split()[-1] == reference.stdout.split()[-1]


def test_a_loader_given_to_a_generator_function_inside_a_zip_resumes_bit_exact_mid_epoch(
        tmp_path: Path) -> None:
    """batches(zip(shifted(labelled), unlabelled)), ``def shifted(dl): for ... in dl``, its
    generator= written inline: as with tqdm(labelled), the loader's iterator is made in the
    loop, but the generator function's has no ``self`` to find it through: its generator
    was neither saved nor set, the resumed epoch in another order without a word. Its
    arguments are looked through now, as a wrapper's ``self`` is."""
    code = ZIPPED_INLINE.format(die=8, **ZIPPED_GENERATORS["inline"]).replace(
        "batches(zip(labelled, unlabelled))", "batches(zip(shifted(labelled), unlabelled))"
    ).replace("model = torch.nn", "def shifted(dl):\n    for xb, yb in dl:\n"
              "        yield xb + 1, yb\nmodel = torch.nn")
    assert "zip(shifted(" in code and "def shifted(dl)" in code
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    assert "step 15)" in resumed.stdout  # (resumed from epoch 1, batch 6)
    assert resumed.stdout.split()[-1] == reference.stdout.split()[-1]


def test_loaders_in_a_zip_inside_the_zip_given_to_batches_resume_bit_exact_mid_epoch(
        tmp_path: Path) -> None:
    """batches(zip(zip(labelled, unlabelled))), generator= written inline: the inner zip's
    iterators (made as the outer one was) were not looked into, the loaders' generators
    neither saved nor set, and the resumed epoch went on in another order, the start line
    saying "restores its order". Its members are read as the outer zip's now."""
    code = ZIPPED_INLINE.format(die=8, **ZIPPED_GENERATORS["inline"]).replace(
        "for i, ((xb, yb), (xu,)) in ckpt_nb.batches(zip(labelled, unlabelled)):",
        "for i, (((xb, yb), (xu,)),) in ckpt_nb.batches(zip(zip(labelled, unlabelled))):")
    assert "zip(zip(" in code
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    assert "step 15)" in resumed.stdout  # (resumed from epoch 1, batch 6)
    assert resumed.stdout.split()[-1] == reference.stdout.split()[-1]


@pytest.mark.parametrize("zipped", ["tqdm(labelled, disable=True), unlabelled",
                                    "labelled, unlabelled"], ids=["in a wrapper", "itself"])
def test_a_zipped_loader_with_persistent_workers_is_said_at_a_resume(
        tmp_path: Path, zipped: str) -> None:
    """A loader with persistent workers in the zip given to batches(), its generator= a
    notebook variable: the resume makes its iterator anew, which draws its workers' base
    seed from the generator before the epoch's order, where the unstopped run kept the
    epoch before's: the resumed epoch went on in another order without a word, the start
    line saying "restores its order". Both say so now, as of the other zipped loaders it
    cannot replay."""
    code = ZIPPED_INLINE.format(die=8, **ZIPPED_GENERATORS["named"]).replace(
        "generator=g1)", "generator=g1, num_workers=1, persistent_workers=True)").replace(
        "batches(zip(labelled, unlabelled))", f"batches(zip({zipped}))").replace(
        "import hashlib", "from tqdm import tqdm\nimport hashlib")
    assert "persistent_workers=True" in code and f"zip({zipped})" in code
    (tmp_path / "run").mkdir()
    script(tmp_path / "run", "train.py", code, die=True)
    resumed = script(tmp_path / "run", "train.py", code)
    assert "step 15)" in resumed.stdout, resumed.stdout + resumed.stderr  # (resumed from)
    assert "in another order than a run never stopped for labelled in the zip()" in \
        resumed.stdout, resumed.stdout
    assert "skipped labelled (DataLoader: in the zip() given to ckpt_nb.batches(), with " \
        "persistent workers, its iterator is made anew by a resume" in resumed.stdout  # (start)


# A notebook generator seeded by each epoch's code, the loader on it made there too: the
# way on that the refusal of a generator made inside the epoch gives (one defined ahead).
RESEEDED = """
import hashlib, os, torch, ckpt_nb
from torch.utils.data import DataLoader, TensorDataset
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
g = torch.Generator()
with ckpt_nb.auto("store", every_steps=5, sync=True):  # (the kill loses no save)
    for epoch in ckpt_nb.epochs(3):
        g.manual_seed(100 + epoch)
        loader = DataLoader(TensorDataset(X, Y), batch_size=20, shuffle=True, generator=g)
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if os.environ["DIE"] and epoch == 1 and i == 2:
                os.kill(os.getpid(), 9)
print("params", hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                      for p in model.parameters())).hexdigest())
"""


def test_a_notebook_generator_the_epochs_code_seeds_resumes_bit_exact_at_an_epochs_end(
        tmp_path: Path) -> None:
    """Resumed from a save at epoch 0's end, batches() set the loader's generator (``g``,
    a notebook variable) to its state at that save, over the ``g.manual_seed(101)`` that
    epoch 1's code had just run: the epoch went on in another order. The notebook's own
    generators are left as the epoch's code left them now (the resume put them back as
    saved before it ran)."""
    reference, resumed = unstopped_and_resumed(tmp_path, RESEEDED)
    assert "step 10)" in resumed.stdout  # (resumed from epoch 1, batch 0)
    assert resumed.stdout.split()[-1] == reference.stdout.split()[-1]


def test_a_zip_says_which_loaders_a_resume_cannot_replay_and_no_others() -> None:
    """What batches(zip(...)) replays of the zipped loaders: a notebook loader in this
    process, its iterator yet to draw (l1), is set as the loop began; one with workers
    that drew its order from its generator= as zip() made it (l2), and one that is no
    notebook variable (its generator= unknown), are the ones a mid-epoch resume names; one
    drawing from the global generators alone (l3: set as the epoch began before zip()
    draws) and a plain list are not named."""
    from ckpt_nb._session import _zipped_loaders

    data = torch.utils.data.TensorDataset(torch.arange(8.0))

    def loader(workers: int = 0, seed: int | None = 1) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            data, batch_size=2, shuffle=True, num_workers=workers,
            generator=None if seed is None else torch.Generator().manual_seed(seed))

    namespace = {"l1": loader(), "l2": loader(workers=1), "l3": loader(workers=1, seed=None)}
    made = zip(namespace["l1"], namespace["l2"], namespace["l3"], loader(), [1, 2])
    try:
        found, unreplayed = _zipped_loaders(made, namespace)
        assert [data for _, data in found] == [namespace["l1"]]
        assert unreplayed == "l2, a DataLoader that is no notebook variable"
        assert _zipped_loaders(iter([1]), namespace) == ([], "")
    finally:
        del made  # (its workers end)
    # (l2's generator= a notebook variable: put back as saved before zip() draws from it)
    made = zip(namespace["l2"], namespace["l3"])
    try:
        assert _zipped_loaders(made, namespace, {id(namespace["l2"].generator)}) == ([], "")
    finally:
        del made


@pytest.mark.parametrize("first, die, said", [
    ("torch.Generator().manual_seed(7), num_workers=1", 2, True),
    ("g1, num_workers=1", 8, False)], ids=["inline, epoch end", "named, mid-epoch"])
def test_a_zipped_loader_with_workers_is_said_at_any_resume_it_cannot_replay(
        tmp_path: Path, first: str, die: int, said: bool) -> None:
    """A zipped loader with workers draws its order as zip() makes its iterator: from a
    generator= written inline, a resume at an epoch's end went on in another order without a
    word (only a mid-epoch one said so); from a notebook generator (put back as saved before
    the epoch's code makes the zip) it resumes exactly, and was named all the same."""
    code = ZIPPED_INLINE.format(die=die, generators="g1 = torch.Generator().manual_seed(7)",
                                first=first, second="None")
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    assert f"step {10 if die == 2 else 15})" in resumed.stdout  # (resumed from)
    assert ("in another order than a run never stopped for labelled" in resumed.stdout) \
        is said, resumed.stdout
    # (and so does the start line: it said "restores its order" of labelled)
    assert ("skipped labelled (DataLoader: in the zip() given to ckpt_nb.batches(), with "
            "workers" in resumed.stdout) is said, resumed.stdout
    if not said:
        assert resumed.stdout.split()[-1] == reference.stdout.split()[-1]


def test_a_notebook_generator_of_a_loader_with_persistent_workers_resumes_at_an_epochs_end(
        tmp_path: Path) -> None:
    """persistent_workers=True on a notebook generator ``g``, resumed from a save at epoch
    0's end: the resume makes the loader's kept iterator anew, which draws from ``g``, and
    that draw (set over before, as saved) was left in it, so the epoch went on in another
    order. The notebook's own generators go back as the epoch's code left them now."""
    code = RESEEDED.replace(
        "        g.manual_seed(100 + epoch)\n        loader = DataLoader(TensorDataset(X, Y), "
        "batch_size=20, shuffle=True, generator=g)\n", "").replace(
        "g = torch.Generator()\n", "g = torch.Generator().manual_seed(7)\nloader = DataLoader("
        "TensorDataset(X, Y), batch_size=20, shuffle=True, generator=g, num_workers=1,\n"
        "                    persistent_workers=True)\n")
    assert "persistent_workers=True" in code and "manual_seed(100" not in code
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    assert "step 10)" in resumed.stdout  # (resumed from epoch 1, batch 0)
    assert resumed.stdout.split()[-1] == reference.stdout.split()[-1]


# The loader, and its generator= written inline, made anew by each epoch's code.
INLINE_RESEEDED = {
    "alone": RESEEDED.replace("g = torch.Generator()\n", "").replace(
        "        g.manual_seed(100 + epoch)\n", "").replace(
        ", generator=g)", ",\n                            generator=torch.Generator().manual_seed("
        "100 + epoch))"),
    "zipped": RESEEDED.replace("g = torch.Generator()\n", "").replace(
        "        g.manual_seed(100 + epoch)\n        loader = DataLoader(TensorDataset(X, Y), "
        "batch_size=20, shuffle=True, generator=g)\n",
        "        l1, l2 = (DataLoader(TensorDataset(X, Y), batch_size=20, shuffle=True,\n"
        "                             generator=torch.Generator().manual_seed(s + epoch))\n"
        "                  for s in (100, 200))\n").replace(
        "for i, (xb, yb) in ckpt_nb.batches(loader):",
        "for i, ((xb, yb), (xu, _)) in ckpt_nb.batches(zip(l1, l2)):").replace(
        "torch.nn.functional.cross_entropy(model(xb), yb).backward()",
        "(torch.nn.functional.cross_entropy(model(xb), yb) + model(xu).pow(2).mean())"
        ".backward()"),
}


@pytest.mark.parametrize("form", sorted(INLINE_RESEEDED))
def test_a_loader_the_epochs_code_makes_with_an_inline_generator_resumes_at_an_epochs_end(
        tmp_path: Path, form: str) -> None:
    """``loader = DataLoader(..., generator=torch.Generator().manual_seed(100 + epoch))``
    in the epoch's code (alone, or two zipped), resumed from a save at epoch 0's end: the
    resume set the new loader's generator to the state saved with epoch 0's loader, and the
    epoch went on in another order without a word. A generator of a loader made since the
    resume is left as the epoch's code made it, as the unstopped run's was."""
    code = INLINE_RESEEDED[form]
    assert "manual_seed(100 + epoch))" in code or "manual_seed(s + epoch))" in code
    assert "g = torch.Generator()" not in code
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    assert "step 10)" in resumed.stdout  # (resumed from epoch 1, batch 0)
    assert resumed.stdout.split()[-1] == reference.stdout.split()[-1]


def test_a_loader_in_a_progress_bar_inside_a_zip_resumes_in_the_kernel_interrupted(
        shell, tmp_path: Path, capsys) -> None:
    """batches(zip(tqdm(l1), l2)), interrupted mid-epoch 1 and run again in the same kernel:
    l1's generator (written inline) went on from where the interrupt left it, not as the
    epoch began. Set as the loop began now, as for a loader given alone."""
    setup = SETUP.format(rng=NOTEBOOK_GENERATORS["torch"]) + """
from tqdm import tqdm
l1 = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X[:100], Y[:100]),
                                 batch_size=10, shuffle=True,
                                 generator=torch.Generator().manual_seed(7))
"""
    cell = TRAIN.replace("ckpt_nb.batches(loader):",
                         "ckpt_nb.batches(zip(tqdm(l1, disable=True), loader)):").replace(
        "for i, (xb, yb) in", "for i, ((xb, yb), _) in")
    assert "zip(tqdm(l1" in cell
    stopped_then_resumed(shell, capsys, tmp_path, setup, cell, "after-1-5", KeyboardInterrupt)


def test_a_loader_the_epochs_code_makes_with_an_inline_generator_resumes_in_the_same_kernel(
        shell, tmp_path: Path, capsys) -> None:
    """The same, in the kernel that was interrupted after epoch 0's last batch (the
    previous epoch's loader and its generator still there): the new one's generator is
    left as the epoch's code made it."""
    cell = TRAIN.replace(
        "    for i, (xb, yb) in ckpt_nb.batches(loader):\n",
        "    loader = torch.utils.data.DataLoader(\n"
        "        Augmented(), batch_size=20, shuffle=True,\n"
        "        generator=torch.Generator().manual_seed(100 + epoch))\n"
        "    for i, (xb, yb) in ckpt_nb.batches(loader):\n")
    assert "manual_seed(100 + epoch)" in cell
    stopped_then_resumed(shell, capsys, tmp_path, SETUP.format(rng=NOTEBOOK_GENERATORS["torch"]),
                         cell, "after-0-9", KeyboardInterrupt)
