"""Resumes of loaders whose order is not the generators' alone: a DataLoader whose
persistent workers keep its iterator from epoch to epoch, a dataset that advances its own
state in ``__iter__``; and a parameter group the loop adds. Scripts killed with SIGKILL
and run again, each against a run never stopped."""

from __future__ import annotations

import os
import re
import types
from pathlib import Path

import pytest
import torch

from ckpt_nb._discovery import discover
from test_session_jobs import script, unstopped_and_resumed  # (fresh interpreters)

# A run of 3 epochs of 10 batches, killed (DIE) in epoch 2 at batch ``die_at``, with its
# loader's workers (its process group, as a kernel's restart kills it: orphaned, they held
# the script's output open until they noticed, 5 s later); it prints the line its resume
# said, and a digest of the order it saw and of its parameters.
SCRIPT = """
import hashlib, os, torch, ckpt_nb
os.setsid()  # (its own process group: the kill's, not the warm interpreter's)
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
{data}
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
order = []
with ckpt_nb.auto("store", every_steps={every}):
    for epoch in ckpt_nb.epochs(3):
        for i, (xb, yb) in ckpt_nb.batches(loader):
            order.append(xb[0, 0].item())
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if os.environ["DIE"] and epoch == 2 and i == {die_at}:
                os.killpg(0, 9)
print("digest", hashlib.sha1(repr(order[-5:]).encode() + b"".join(
    p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
"""

# Saves every 10 steps are at the epochs' ends (the resume starts epoch 2 at batch 0);
# every 3, in the epochs (it replays a later epoch from its start to the batch saved).
AT_AN_EPOCHS_END, IN_THE_EPOCH = 10, 3


def resumed_at(said: str) -> tuple[int, int]:
    """The epoch and batch a resume went on from (the kill may come before the latest
    save is written: the one before it)."""
    found = re.search(r"resumed from \w+ \(epoch (\d+), batch (\d+),", said)
    assert found, said
    return int(found[1]), int(found[2])


def as_meant(every: int, said: str) -> bool:
    """Whether the resume went on from a later epoch's end or a batch in it, as meant."""
    epoch, batch = resumed_at(said)
    return epoch >= 1 and (batch == 0) == (every == AT_AN_EPOCHS_END)


def killed_and_resumed(tmp_path: Path, data: str, every: int, die_at: int = 6
                       ) -> tuple[str, str, str]:
    """The digest of a run never stopped, of one killed and run again, and what the
    run again said."""
    code = SCRIPT.format(data=data, every=every, die_at=die_at)
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    said = resumed.stdout + resumed.stderr
    return reference.stdout.split()[-1], resumed.stdout.split()[-1], said


PERSISTENT = """
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(X, Y), batch_size=20, shuffle=True, num_workers=2,
    persistent_workers=True, generator=torch.Generator().manual_seed(42))
"""


@pytest.mark.parametrize("every", [AT_AN_EPOCHS_END, IN_THE_EPOCH])
def test_a_loader_with_persistent_workers_resumes_its_order_in_a_later_epoch(
        tmp_path: Path, every: int) -> None:
    """From its second epoch on, the unstopped run's iter(loader) reused the iterator its
    persistent workers kept, drawing no seed for them from the loader's generator; the
    resume put the generator back, then made a new iterator, which drew one before the
    order: every batch after it came in another order."""
    expected, resumed, said = killed_and_resumed(tmp_path, PERSISTENT, every)
    assert as_meant(every, said), said
    assert resumed == expected
    assert "the order of its batches is the same" in said  # (the warning, said truly)


# A stream that reshuffles by its own epoch counter, which its __iter__ advances.
EPOCH_STREAM = """
class EpochStream(torch.utils.data.IterableDataset):
    def __init__(self):
        self.epoch = 0
    def __iter__(self):
        order = torch.randperm(len(X), generator=torch.Generator().manual_seed(self.epoch))
        self.epoch += 1
        return ((X[j], Y[j]) for j in order.tolist())
{state}
{loader}
"""
STATE = """
    def state_dict(self):
        return {"epoch": self.epoch}
    def load_state_dict(self, state):
        self.epoch = state["epoch"]
"""
NAMED = "ds = EpochStream()\nloader = torch.utils.data.DataLoader(ds, batch_size=20)"
UNNAMED = "loader = torch.utils.data.DataLoader(EpochStream(), batch_size=20)"


@pytest.mark.parametrize("loader", [NAMED, UNNAMED], ids=["tracked", "reached by the loader"])
@pytest.mark.parametrize("every", [AT_AN_EPOCHS_END, IN_THE_EPOCH])
def test_a_dataset_advancing_its_state_in_iter_resumes_its_order(
        tmp_path: Path, loader: str, every: int) -> None:
    """A tracked dataset was put back as at the save, a step past the epoch's start,
    and the replay of the epoch's iter(loader) advanced it again: the epoch came in the
    next one's order, without a word (one the loader alone reaches was not saved)."""
    data = EPOCH_STREAM.format(state=STATE, loader=loader)
    expected, resumed, said = killed_and_resumed(tmp_path, data, every)
    assert as_meant(every, said), said
    assert resumed == expected


def test_a_dataset_without_a_state_dict_is_said_what_it_needs() -> None:
    """Discovery said only "skipped ds (EpochStream)": a resume of a stream advancing
    an epoch counter in __iter__ went on in another order, with no reason given."""
    class EpochStream(torch.utils.data.IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(())

    summary = discover({"ds": EpochStream()}).summary()
    assert "skipped ds (EpochStream: a Dataset without state_dict(), so checkpoints hold " \
        "none of its state; where it changes as it is iterated (an epoch counter that " \
        "__iter__ advances), give it state_dict() and load_state_dict()" in summary, summary


def test_a_loader_over_a_stream_without_a_state_dict_says_what_it_needs() -> None:
    """Reached by its loader alone, the stream was said nothing of: the start line said
    'ckpt_nb.batches() restores its order' where no checkpoint holds its state. Where it
    has a name of its own, it is said there, once."""
    class EpochStream(torch.utils.data.IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(())

    stream = EpochStream()
    loader = torch.utils.data.DataLoader(stream, batch_size=None)
    needs = "checkpoints hold none of its state; where it changes as it is iterated (an " \
        "epoch counter that __iter__ advances), give it state_dict() and load_state_dict()"
    alone = discover({"loader": loader}, code="for i, b in ckpt_nb.batches(loader): pass")
    assert alone.skipped["loader"].startswith(
        "DataLoader: ckpt_nb.batches() restores its position; its dataset (EpochStream) has "
        "no state_dict(), so " + needs), alone.skipped
    named = discover({"ds": stream, "loader": loader}).summary()
    assert named.count(needs) == 1 and "skipped ds (EpochStream: a Dataset without " \
        "state_dict()" in named and "loader (DataLoader: wrap it in ckpt_nb.batches() to " \
        "restore its position)" in named, named


# The loop adds a parameter group in its second epoch; ``guard`` is the cell's condition
# on it, ``before`` what runs before the loop.
GROUPS = """
import hashlib, os, torch, ckpt_nb
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20,
                                     shuffle=True)
model, head = torch.nn.Linear(8, 2), torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
{before}
with ckpt_nb.auto("store", every_steps=3, name="train"):
    for epoch in ckpt_nb.epochs(3):
        if epoch == 1{guard}:
            opt.add_param_group(dict(params=head.parameters(), lr=0.05))
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            out = model(xb) if epoch == 0 else head(model(xb))
            torch.nn.functional.cross_entropy(out, yb).backward()
            opt.step()
            if os.environ["DIE"] and epoch == 1 and i == 6:
                os.kill(os.getpid(), 9)
print("params", hashlib.sha1(b"".join(p.detach().numpy().tobytes() for p in
                                      [*model.parameters(), *head.parameters()])).hexdigest())
"""


def test_a_parameter_group_the_loop_adds_is_said_how_to_resume(tmp_path: Path) -> None:
    """The refusal said to build the groups as they were; built before the cell, its
    own add_param_group ran again and torch refused the parameters twice. The guard it
    says now resumes bit-exact."""
    guarded = " and len(opt.param_groups) < 2"
    plain = GROUPS.format(before="", guard="")
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    reference = script(tmp_path / "ref", "train.py", plain)
    assert reference.returncode == 0, reference.stderr
    script(tmp_path / "run", "train.py", plain, die=True)
    refused = script(tmp_path / "run", "train.py", plain)
    assert refused.returncode != 0
    assert "opt: 2 parameter groups in the checkpoint, 1 live (where the training loop " \
        "adds them, add them before it runs again, and guard its add so that it does not " \
        "add them twice: if len(opt.param_groups) < 2: opt.add_param_group(...))" \
        in refused.stderr, refused.stderr
    build = "opt.add_param_group(dict(params=head.parameters(), lr=0.05))"
    resumed = script(tmp_path / "run", "train.py", GROUPS.format(before=build, guard=guarded))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert resumed.stdout.split()[-1] == reference.stdout.split()[-1]


# A map-style dataset and a sampler whose state_dict()s count their calls; the dataset's
# returns its data, as some "stateful" datasets' do.
COUNTED = """
import torch, ckpt_nb
torch.manual_seed(0)
calls = {"dataset": 0, "sampler": 0}
class HeavyDataset(torch.utils.data.TensorDataset):
    def state_dict(self):
        calls["dataset"] += 1
        return {"tensors": self.tensors}
    def load_state_dict(self, state):
        self.tensors = state["tensors"]
class CountedSampler(torch.utils.data.SequentialSampler):
    def state_dict(self):
        calls["sampler"] += 1
        return {}
    def load_state_dict(self, state):
        pass
ds = HeavyDataset(torch.randn(200, 8), torch.randint(0, 2, (200,)))
loader = torch.utils.data.DataLoader(ds, batch_size=20, sampler=CountedSampler(ds))
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with ckpt_nb.auto("store", every_steps=3, namespace={"model": model, "opt": opt,
                                                      "loader": loader}):
    for epoch in ckpt_nb.epochs(2):
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
print("calls", calls["dataset"], calls["sampler"])
"""


def test_a_map_style_datasets_state_is_not_copied_into_each_save(tmp_path: Path) -> None:
    """A map-style Dataset's state_dict() (its 53 MB of tensors) was deep-copied at each
    epoch's start and each save. It is taken as an epoch begins (the replay of a resumed
    epoch's batches runs its __getitem__ again, from that state) and for a save at an
    epoch's end (the next epoch's start), as a sampler's is, not for the 6 saves in
    epochs."""
    done = script(tmp_path, "train.py", COUNTED)
    assert done.returncode == 0, done.stderr
    dataset_calls, sampler_calls = map(int, done.stdout.split()[-2:])
    assert dataset_calls == sampler_calls
    assert sampler_calls <= 4, done.stdout  # (2 epochs' starts; saves at an epoch's end)


def test_map_style_datasets_are_skipped_in_a_word_and_merged() -> None:
    """Every plain Dataset was said a Dataset without state_dict() whose state
    __iter__ may change, though a DataLoader never iterates a map-style one: a
    TensorDataset and its two random_split Subsets put the paragraph three times on the
    start line."""
    ds = torch.utils.data.TensorDataset(torch.randn(10, 3))
    train_ds, val_ds = torch.utils.data.random_split(ds, [8, 2])
    summary = discover({"ds": ds, "train_ds": train_ds, "val_ds": val_ds}).summary()
    assert summary.endswith("skipped ds (TensorDataset), train_ds, val_ds (Subset)"), summary


class Stopper:  # (an early stopper of the user's, without state_dict())
    __module__ = "__main__"  # (as a notebook's class, or a script's)

    def __init__(self) -> None:
        self.best, self.bad = float("inf"), 0


class Pairs(torch.utils.data.Dataset):  # (a notebook's Dataset class)
    __module__ = "__main__"

    def __init__(self) -> None:
        self.x = torch.arange(4.0)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


def test_objects_of_the_users_own_holding_loop_state_are_skipped_with_why_and_the_way_on(
        ) -> None:
    """An early stopper of the user's class and a SimpleNamespace of best / bad were said
    "skipped st (SimpleNamespace), stopper (Stopper)": the type alone, though the loop
    changes them and a resume does not put them back. The reason and the ways on are said
    once for them, last; a library's object (an open file) keeps its word."""
    namespace = {"log_file": open(os.devnull), "st": types.SimpleNamespace(best=1.0, bad=0),
                 "stopper": Stopper()}
    try:
        summary = discover(namespace).summary()
    finally:
        namespace["log_file"].close()
    assert summary.endswith(
        "skipped log_file (open file), st (SimpleNamespace), stopper (Stopper), no "
        "state_dict(): not saved, nor put back on resume; give them "
        "state_dict()/load_state_dict(), or keep their fields in plain variables"), summary
    # (a Dataset class of the notebook's: its data, which the rerun's code makes again)
    data = discover({"ds": Pairs(), "stopper": Stopper()}).summary()
    assert "skipped ds (Pairs), stopper (Stopper), no state_dict(): not saved, nor put " \
        "back on resume; give it " in data, data
    alone = discover({"stopper": Stopper()}).summary()
    assert alone.endswith("skipped stopper (Stopper), no state_dict(): not saved, nor put "
                          "back on resume; give it state_dict()/load_state_dict(), or keep "
                          "its fields in plain variables"), alone


class Shuffled(torch.utils.data.Sampler):  # (a notebook's sampler, its own generator)
    __module__ = "__main__"

    def __init__(self, n: int) -> None:
        self.n, self.gen = n, torch.Generator().manual_seed(11)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(torch.randperm(self.n, generator=self.gen).tolist())


TRAINING = """
for i, (x,) in ckpt_nb.batches(loader):
    pass
"""


def test_a_sampler_holding_its_generator_is_not_said_unsaved_where_batches_restores_it(
        ) -> None:
    """A sampler of the user's own with its torch.Generator, in the loader the cell
    passes to batches(), was "skipped sampler (Shuffled), no state_dict(): not saved, nor
    put back on resume", though batches() saves and puts back its generator (the resume
    is bit-exact). Where no batches() restores it, it is still said."""
    sampler = Shuffled(8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)),
                                         batch_size=2, sampler=sampler)
    namespace = {"sampler": sampler, "loader": loader, "stopper": Stopper()}
    tracked = discover(namespace, code=TRAINING).summary()
    assert "sampler" not in tracked.split("skipped ")[1], tracked
    assert "skipped loader (DataLoader: ckpt_nb.batches() restores its order), stopper " \
        "(Stopper), no state_dict()" in tracked, tracked
    unwrapped = discover(namespace, code=TRAINING.replace("ckpt_nb.batches(loader)",
                                                          "enumerate(loader)")).summary()
    assert "sampler (Shuffled), stopper (Stopper), no state_dict(): not saved" in unwrapped, \
        unwrapped


class EpochSeeded(torch.utils.data.Sampler):  # (DistributedSampler's order, by itself)
    __module__ = "__main__"

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.epoch += 1
        return iter(self._order())

    def _order(self) -> list[int]:
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)
                              ).tolist()


class Remembering(Shuffled):  # (the generator batches() saves, and a field it does not)
    __module__ = "__main__"

    def __iter__(self):  # type: ignore[no-untyped-def]
        order = torch.randperm(self.n, generator=self.gen).tolist()
        self.orders = getattr(self, "orders", [])
        self.orders.append(order)
        return iter(order)


@pytest.mark.parametrize("kind", [EpochSeeded, Remembering])
def test_a_sampler_whose_iter_changes_its_own_fields_is_still_said_unsaved(
        kind: type[torch.utils.data.Sampler]) -> None:
    """A sampler whose __iter__ counts its epochs (seeding a generator made anew from the
    count) or keeps what it drew, in the loader the cell passes to batches(), was no longer
    listed, the start line saying only "batches() restores its order": the count is in no
    checkpoint, and the resumed run's later epochs came in another order than the
    unstopped run's."""
    sampler = kind(8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)),
                                         batch_size=2, sampler=sampler)
    tracked = discover({"sampler": sampler, "loader": loader}, code=TRAINING).summary()
    assert f"sampler ({kind.__name__}), no state_dict(): not saved, nor put back on " \
        "resume" in tracked, tracked


def test_an_auto_block_passing_its_loader_to_batches_is_not_told_to_wrap_it(
        tmp_path: Path) -> None:
    """auto()'s start line said "wrap it in ckpt_nb.batches()" of the loader its block
    passes to batches() (its file is the code it reads)."""
    done = script(tmp_path, "train.py", COUNTED)
    assert done.returncode == 0, done.stderr
    assert "skipped loader (DataLoader: ckpt_nb.batches() restores its order)" in \
        done.stdout + done.stderr
