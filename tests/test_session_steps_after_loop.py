"""Optimizer steps in a plain loop after the tracked ``ckpt_nb.batches()`` loop, outside
``ckpt_nb.epochs()`` (a few fine-tuning steps after the main loop): a save there holds no
position a resume can go on from. Scripts killed with SIGKILL at such a step and run again
match a run never stopped, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_session_jobs import unstopped_and_resumed  # (scripts, fresh interpreters)

# Four batches, then four fine-tuning steps on the whole set; the kill comes at the third.
SCRIPT = """
import hashlib, os, torch, ckpt_nb
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(64, 4); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16,
                                     shuffle=True)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
with ckpt_nb.auto("store", sync=True{options}) as session:  # (written before the kill)
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
{after_loop}
    for k in range(4):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X), Y).backward()
        opt.step()
        if os.environ["DIE"] and k == 2:
            os.kill(os.getpid(), 9)
print("params", hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                      for p in model.parameters())).hexdigest())
"""

# How the saves at the plain loop's steps come, and what the rerun resumes from.
SAVES = {
    # A save at each step: the newest before the plain loop is before the last batch's
    # fetch (the loop's end is no consistent point).
    "a step trigger": dict(options=", every_steps=1", after_loop="",
                           resumed="resumed from", at=" (batch 3, step 3)"),
    # session.save() after the loop waits for the next consistent point, the plain loop's
    # first step; the run saved none before it, so the rerun trains from the objects.
    "session.save() after the loop": dict(options="", after_loop="    session.save()",
                                          resumed=None, at=None),
}


@pytest.mark.parametrize("saves", SAVES)
def test_a_kill_in_a_plain_loop_after_the_tracked_loop_resumes_exactly(
        tmp_path: Path, saves: str) -> None:
    """A save at such a step recorded the tracked loop's end (batch 4), as a position to go
    on from: the resume skipped every batch and ran the plain loop again from its start,
    silently (its weights differed from the run never stopped)."""
    options = dict(SAVES[saves])
    resumed_from, at = options.pop("resumed"), options.pop("at")
    reference, resumed = unstopped_and_resumed(tmp_path, SCRIPT.format(**options))
    said = resumed.stdout + resumed.stderr
    assert resumed.stdout.splitlines()[-1] == reference.stdout.splitlines()[-1], said
    why = "an optimizer stepped after its ckpt_nb.batches() loop outside ckpt_nb.epochs()"
    if resumed_from is None:
        assert "resumed from" not in said and f"that it cannot resume: {why}" in said, said
    else:
        assert f"that it cannot resume from: {why}" in said, said
        assert resumed_from in said and at in said, said
    told = reference.stdout + reference.stderr
    assert told.count(f"this run cannot resume from its checkpoints from here on: {why}") \
        == 1, told
    if options["after_loop"]:  # (the save() line says where it is taken: not "at the
        # next batch's fetch or the epoch's end", which no plain loop after the loop has)
        assert "after the batches() loop, is not a point a resume can start from (the code " \
            "there would run again): it is taken at the next optimizer step (a checkpoint " \
            "to roll back to, which a resume does not start from) or at the cell's end" \
            in told, told
