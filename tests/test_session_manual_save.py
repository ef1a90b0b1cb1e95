"""``session.save()`` called where a resume cannot start from (a batch's body, the epoch's
code ahead of or after its batches() loop) is taken at the next consistent point: scripts
killed with SIGKILL after it and run again match a run never stopped, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_session_jobs import unstopped_and_resumed  # (scripts, fresh interpreters)

# A Lightning port: save at each validation. It prints what save() returned, the history
# and learning rate the epochs' code made, and the weights.
SCRIPT = """
import hashlib, os, torch, ckpt_nb
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(96, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16,
                                     shuffle=True)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", patience=0)
ACC = [0.5, 0.6, 0.55, 0.7]
hist, returned = [], []
with ckpt_nb.auto("store") as session:
    for epoch in ckpt_nb.epochs(4):
        hist.append(-epoch)
{ahead}
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
{body}
            if os.environ["DIE"] and (epoch, i) == {die}:
                os.kill(os.getpid(), 9)
        sched.step(ACC[epoch]); hist.append(ACC[epoch])
        ckpt_nb.log(val_acc=ACC[epoch])
{tail}
print("returned", returned)
print("hist", hist, "lr", opt.param_groups[0]["lr"])
print("params", hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                      for p in model.parameters())).hexdigest())
"""

SAVE = "returned.append(session.save(wait=True))"

# Where save() is called, where the kill comes, and where the resume goes on: the
# consistent point after the save.
WHERE = {
    "at each epoch's end, after validation": dict(
        ahead="", body="", tail=f"        {SAVE}", die=(2, 1), resumed="(epoch 2, batch 0,"),
    "in a batch's body, after its step": dict(
        ahead="", body=f"            if (epoch, i) == (1, 2):\n                {SAVE}",
        tail="", die=(1, 4), resumed="(epoch 1, batch 3,"),
    "in the epoch's code ahead of its batches() loop": dict(
        ahead=f"        if epoch == 1:\n            {SAVE}", body="", tail="", die=(1, 3),
        resumed="(epoch 1, batch 1,"),
}


@pytest.mark.parametrize("where", WHERE)
def test_a_save_asked_where_no_resume_starts_resumes_exactly_after_a_kill(
        tmp_path: Path, where: str) -> None:
    """It recorded the position as it stood: a resume ran the epoch's tail again (the
    scheduler stepped twice, the history appended twice), or the batch or the code ahead
    of the loop again, silently."""
    options = dict(WHERE[where])
    resumed_at = options.pop("resumed")
    reference, resumed = unstopped_and_resumed(tmp_path, SCRIPT.format(**options))
    said = resumed.stdout + resumed.stderr
    assert "resumed from" in said and resumed_at in said, said
    assert resumed.stdout.splitlines()[-2:] == reference.stdout.splitlines()[-2:], said
    told = reference.stdout + reference.stderr
    assert told.count("is not a point a resume can start from") == 1, told
    # (taken later: save() returns no id, as where it is not waited for)
    asked = 4 if where.startswith("at each") else 1
    assert f"returned {[None] * asked}" in told, told
