"""A mid-epoch resume is exact where the epoch's code ahead of its batches() loop runs
again on the restored state: what it changes (accumulators zeroed, a permutation or a
value drawn, a scheduler stepped, a list appended to, an optimizer made anew) is put back
as saved, and the loader's shuffle is drawn as in the unstopped run. Scripts killed with
SIGKILL mid-epoch and run again in a fresh interpreter, against a run never stopped."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_nb._session import _Digest
from test_session_jobs import script, unstopped_and_resumed  # (scripts, fresh interpreters)

# Killed mid-epoch (at epoch 1, batch 7, after a save at batch 6), it prints what it trained
# and kept.
SCRIPT = """
import hashlib, os, torch, ckpt_nb
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
{setup}
kept = []
with ckpt_nb.auto("store", every_steps=4):
    for epoch in ckpt_nb.epochs(3):
{prefix}
        for i, batch in ckpt_nb.batches({loader}):
            xb, yb = {batch}
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
{body}
            if os.environ["DIE"] and {die}:
                os.kill(os.getpid(), 9)
{end}
print("kept", kept)
print("params", hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                      for p in model.parameters())).hexdigest())
"""

LOADER = "loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), " \
    "batch_size=20, shuffle=True)"

PATTERNS = {
    # per-epoch accumulators, reported at the epoch's end
    "accumulators": dict(
        setup=LOADER, loader="loader", batch="batch",
        prefix="        running, seen = 0.0, 0",
        body="            running += loss.item() * len(yb); seen += len(yb)",
        end="        kept.append((running / seen, seen)); ckpt_nb.log(train_loss=running / seen)"),
    # manual batching over a permutation drawn at the epoch's top (drawn again as it was:
    # the global generators go back to the epoch's start, so nothing needs putting back)
    "permutation": dict(
        setup="", loader="range(0, len(X), 20)", batch="X[perm[batch:batch + 20]], "
        "Y[perm[batch:batch + 20]]",
        prefix="        perm = torch.randperm(len(X))", body="",
        end="        kept.append(perm[:3].tolist())", said=False),
    # a draw that goes into no variable: a loader over a random subset, made at the top
    "a subset drawn into a loader": dict(
        setup="", loader="loader", batch="batch",
        prefix="        loader = torch.utils.data.DataLoader(torch.utils.data.Subset("
               "torch.utils.data.TensorDataset(X, Y), torch.randperm(200)[:120].tolist()), "
               "batch_size=10, shuffle=True)", body="", end="", said=False,
        die="epoch == 1 and i == 10"),
    # weights edited in place through .data, which bumps no version counter
    "an edit through .data": dict(
        setup=LOADER, loader="loader", batch="batch",
        prefix="        if epoch == 1:\n            model.weight.data.mul_(0.5)", body="",
        end=""),
    # the same from a generator of the notebook's
    "permutation from a generator": dict(
        setup="g = torch.Generator().manual_seed(3)", loader="range(0, len(X), 20)",
        batch="X[perm[batch:batch + 20]], Y[perm[batch:batch + 20]]",
        prefix="        perm = torch.randperm(len(X), generator=g)", body="",
        end="        kept.append(perm[:3].tolist())"),
    # a draw ahead of a shuffling loader that has no generator of its own
    "a draw before the shuffle": dict(
        setup=LOADER, loader="loader", batch="batch[0] + noise, batch[1]",
        prefix="        noise = 0.1 * torch.rand(())", body="", end="", said=False),
    # a scheduler stepped, and a list appended to, at the epoch's top
    "a scheduler stepped": dict(
        setup=LOADER + "\nsched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)",
        loader="loader", batch="batch",
        prefix="        if epoch > 0:\n            sched.step()\n"
               "        kept.append(opt.param_groups[0]['lr'])", body="", end=""),
    # an optimizer made anew each epoch: the resumed epoch trains on with the saved one's
    # state (killed in epoch 0: the steps counted are the newest optimizer's, so epoch 1
    # saves none)
    "an optimizer made anew": dict(
        setup=LOADER, loader="loader", batch="batch",
        prefix="        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)",
        body="", end="", die="epoch == 0 and i == 9"),
    # an array the set-up made, zeroed in place at the epoch's top (the resume copied the
    # saved one into it)
    "an array changed in place": dict(
        setup=LOADER + "\nimport numpy as np\nstats = np.zeros(3)", loader="loader",
        batch="batch", prefix="        stats[:] = 0", body="            stats += loss.item()",
        end="        kept.append(stats.tolist())"),
    # an array and a list the first epoch's batches made, changed in place at a later
    # epoch's top: resumed in a fresh interpreter, the notebook holds the very ones the
    # checkpoint was read into (the array is read again from the store)
    "an array and a list the resume made, changed in place": dict(
        setup=LOADER + "\nimport numpy as np", loader="loader", batch="batch",
        prefix="        if epoch > 0:\n            stats *= 0.5; lrs.append(epoch)",
        body="            if epoch == 0 and i == 0:\n                stats, lrs = np.zeros(3), []"
             "\n            stats += loss.item()",
        end="        kept.append((stats.tolist(), list(lrs)))"),
    # a subset drawn into a loader from a generator of the notebook's, torch's and
    # NumPy's (set as the epoch began, then put back as saved)
    "a subset drawn from a generator into a loader": dict(
        setup="g = torch.Generator().manual_seed(3)", loader="loader", batch="batch",
        prefix="        loader = torch.utils.data.DataLoader(torch.utils.data.Subset("
               "torch.utils.data.TensorDataset(X, Y), torch.randperm(200, generator=g)"
               "[:120].tolist()), batch_size=10, shuffle=True)", body="", end="",
        die="epoch == 1 and i == 10"),
    "a subset drawn from a NumPy generator into a loader": dict(
        setup="import numpy as np\nrng = np.random.default_rng(3)", loader="loader",
        batch="batch", prefix="        loader = torch.utils.data.DataLoader("
        "torch.utils.data.Subset(torch.utils.data.TensorDataset(X, Y), "
        "rng.permutation(200)[:120].tolist()), batch_size=10, shuffle=True)", body="",
        end="", die="epoch == 1 and i == 10"),
    # a warm-up step at the epoch's top: the optimizer's momentum (which its
    # load_state_dict() shares with the checkpoint read) stepped in place
    "an optimizer stepped at the epoch's top": dict(
        setup=LOADER, loader="loader", batch="batch",
        prefix="        opt.zero_grad()\n        torch.nn.functional.cross_entropy("
               "model(X[:20]), Y[:20]).backward()\n        opt.step()", body="", end=""),
    # an object of the notebook's whose load_state_dict() keeps the tensors it is given
    # (an EMA), updated in place at the epoch's top: read again as saved
    "an EMA that keeps the tensors it loads, updated at the epoch's top": dict(
        setup=LOADER + "\nclass EMA:\n    def __init__(self, m): self.shadow = "
        "{k: v.detach().clone() for k, v in m.state_dict().items()}\n"
        "    def update(self, m, d):\n        for k, v in m.state_dict().items(): "
        "self.shadow[k].mul_(d).add_(v.detach(), alpha=1 - d)\n"
        "    def state_dict(self): return {'shadow': self.shadow}\n"
        "    def load_state_dict(self, s): self.shadow = s['shadow']\nema = EMA(model)",
        loader="loader", batch="batch",
        prefix="        if epoch > 0:\n            ema.update(model, 0.5)",
        body="            ema.update(model, 0.9)",
        end="        kept.append(float(ema.shadow['weight'].sum()))"),
    # a notebook's generator the batches draw from and the epoch's top does not: as saved
    "a generator drawn from in the batches only": dict(
        setup=LOADER + "\ng = torch.Generator().manual_seed(3)", loader="loader",
        batch="batch[0] + 0.1 * torch.rand((), generator=g), batch[1]", prefix="",
        body="", end="", said=False),
}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_code_ahead_of_the_batches_loop_resumes_bit_exact_after_a_kill(
        tmp_path: Path, pattern: str) -> None:
    """That code ran again on the restored state: the epoch's loss covered only the
    batches after the resume, the permutation and the loader's order were drawn anew, the
    scheduler stepped twice and the list held a value twice."""
    options = dict(PATTERNS[pattern])
    said_again = options.pop("said", True)  # (whether it changed what it put back)
    code = SCRIPT.format(**{"die": "epoch == 1 and i == 7", **options})
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    said = resumed.stdout + resumed.stderr
    assert "resumed from" in said and ", batch " in said, said
    assert ", batch 0," not in said, said  # (mid-epoch)
    assert resumed.stdout.splitlines()[-2:] == reference.stdout.splitlines()[-2:], said
    assert ("'s code ahead of its batches() loop ran again" in said) == said_again, said


# Killed in epoch 1 after its first batches (resumed at the epoch's start, from the
# checkpoint saved as epoch 0 ended), then again later in epoch 1 (resumed mid-epoch).
TWICE = """
import hashlib, os, time, torch, ckpt_nb
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
with ckpt_nb.auto("store", every_steps=6, sync=True):
    for epoch in ckpt_nb.epochs(3):
        loader = torch.utils.data.DataLoader(torch.utils.data.Subset(
            torch.utils.data.TensorDataset(X, Y), torch.randperm(200)[:120].tolist()),
            batch_size=10, shuffle=True)
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if os.environ["DIE"] and (epoch, i) == (1, 4) and not os.path.exists("once"):
                open("once", "w").close()
                os.kill(os.getpid(), 9)
            if os.environ["DIE"] and (epoch, i) == (1, 9) and os.path.exists("once"):
                os.kill(os.getpid(), 9)
print("params", hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                      for p in model.parameters())).hexdigest())
"""


def test_a_mid_epoch_resume_after_one_at_the_epochs_start_is_exact(tmp_path: Path) -> None:
    """A resume at an epoch's start kept the loop it restored, which held no generators'
    state as the epoch began: a checkpoint saved later in that epoch held none either,
    and its resume drew the epoch's subset anew."""
    reference, resumed = unstopped_and_resumed(tmp_path, TWICE, kills=2)
    said = resumed.stdout + resumed.stderr
    assert "(epoch 1, batch 6," in said, said
    assert resumed.stdout.splitlines()[-1] == reference.stdout.splitlines()[-1], said


# Killed at (epoch, batch) KILL, then run again: the resumed run prints by how much its
# peak memory grew from just before the block to its first batch, and stops there.
BIG_UNTOUCHED = """
import os, sys, numpy as np, torch, ckpt_nb
_KILL = {kill}

def _peak():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) << 10 for line in status
                    if line.startswith("VmHWM:"))

big = np.ones(128 << 18, dtype=np.float32)  # (128 MiB, which the epoch's code leaves: twice
# the growth the test allows, 64 MiB; a copy of it held, or digested through, is over it)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with open("/proc/self/clear_refs", "w") as _f:
    _f.write("5")  # (the peak from here on)
_before = _peak()
with ckpt_nb.auto("store", every_steps=2, max_variable_bytes=512 << 20, sync=True):
    for epoch in ckpt_nb.epochs(2):
        running = 0.0
        for i, _ in ckpt_nb.batches(range(4)):
            if not os.environ["DIE"]:
                print("grew", _peak() - _before, flush=True)
                os._exit(0)
            opt.zero_grad()
            model(torch.ones(1, 8)).sum().backward()
            opt.step()
            if (epoch, i) == _KILL:
                os.kill(os.getpid(), 9)
"""


def resume_grew(tmp_path: Path, kill: tuple[int, int], at: str) -> int:
    """How many bytes the resumed run's peak memory grew by as it resumed ``at``."""
    tmp_path.mkdir()
    code = BIG_UNTOUCHED.format(kill=kill)
    script(tmp_path, "train.py", code, die=True)
    resumed = script(tmp_path, "train.py", code)
    assert resumed.returncode == 0 and f"({at}, step" in resumed.stdout, resumed.stderr
    return int(resumed.stdout.split("grew ")[1].split()[0])


def test_a_mid_epoch_resume_holds_no_copy_of_a_variable_its_epoch_code_leaves(
        tmp_path: Path) -> None:
    """The put-back held a copy of every variable the resume put back, through the
    epoch's code, and digested each through another: a 300 MiB array took 300 MiB more
    at the peak than a resume at the epoch's start, which puts nothing back."""
    at_start = resume_grew(tmp_path / "start", (1, 0), "epoch 1, batch 0")
    mid_epoch = resume_grew(tmp_path / "mid", (1, 2), "epoch 1, batch 2")
    assert mid_epoch - at_start < 64 << 20, (at_start, mid_epoch)


def test_values_that_differ_digest_apart_and_one_value_alike_however_it_lies() -> None:
    """The put-back finds a variable changed by its digest: a dtype or a shape alone
    tells it apart (zeros are zero bytes in each), a generator drawn from too; a view
    that strides digests as its contiguous copy."""
    assert _Digest.of(np.zeros(4, np.float32)) != _Digest.of(np.zeros(4, np.int32))
    assert _Digest.of(np.zeros((2, 2))) != _Digest.of(np.zeros(4))
    assert _Digest.of(torch.zeros(4)) != _Digest.of(torch.zeros(4, dtype=torch.int32))
    assert _Digest.of(torch.zeros(2, 2)) != _Digest.of(torch.zeros(4))
    assert _Digest.of(torch.zeros(4)) != _Digest.of(np.zeros(4, np.float32))
    grid = np.arange(24.0).reshape(4, 6)
    assert _Digest.of(grid[:, ::2]) == _Digest.of(np.ascontiguousarray(grid[:, ::2]))
    assert _Digest.of(grid[:, ::2]) != _Digest.of(grid[:, 1::2])
    assert _Digest.of(torch.from_numpy(grid).t()) == _Digest.of(torch.from_numpy(grid.T.copy()))
    held = [torch.Generator().manual_seed(0)]
    drawn_from = _Digest.of(held)
    torch.rand(1, generator=held[0])
    assert _Digest.of(held) != drawn_from
    # (a quantized tensor by its scale too, not its integers alone; a conjugate view as
    # the values it shows)
    small = torch.quantize_per_tensor(torch.tensor([0.1, 0.2]), 0.1, 0, torch.qint8)
    large = torch.quantize_per_tensor(torch.tensor([0.2, 0.4]), 0.2, 0, torch.qint8)
    assert _Digest.of(small) != _Digest.of(large)
    values = torch.tensor([1 + 2j, 3 - 1j])
    assert _Digest.of(values.conj()) == _Digest.of(values.conj().resolve_conj())
    assert _Digest.of(values.conj()) != _Digest.of(values)


def test_a_digest_reads_the_data_where_it_lies() -> None:
    """It read a copy of an array's or a tensor's bytes: a resume of a 1 GB model and
    array took a GB more at its peak."""
    values = {"array": np.ones(32 << 20, np.uint8), "tensor": torch.ones(32 << 20,
                                                                         dtype=torch.uint8)}
    for kind, value in values.items():
        tracemalloc.start()
        try:
            _Digest.of([value])
            took = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert took < 1 << 20, (kind, took)
