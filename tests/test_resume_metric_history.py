"""The metric history a mid-epoch resume goes on with is the unstopped run's: each record
log() appends carries the metrics logged before (the epoch's val_loss) as they stood at the
save, though a mid-epoch checkpoint holds none of its own. A script killed with SIGKILL and
run again in a fresh interpreter, against a run never stopped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_session_jobs import script, unstopped_and_resumed  # (scripts, fresh interpreters)

# Killed at epoch 1, batch 7 (saved at its batch 6); prints the run's stored history. Two
# epochs: the resumed records of epoch 1 are those that carry epoch 0's val_loss.
SCRIPT = """
import json, os, torch, ckpt_nb
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(200, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20,
                                     shuffle=True)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with ckpt_nb.auto("store", every_steps=4):
    for epoch in ckpt_nb.epochs(2):
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            ckpt_nb.log(train_loss=loss.item())
            if os.environ["DIE"] and epoch == 1 and i == 7:
                os.kill(os.getpid(), 9)
        with torch.no_grad():
            ckpt_nb.log(val_loss=torch.nn.functional.cross_entropy(model(X), Y).item())
with ckpt_nb.CheckpointManager("store") as store:
    newest = store.load(store.list().iloc[-1]["id"])
print("history", json.dumps(newest.extra["ckpt_nb_run"]["history"]))
"""


def test_a_mid_epoch_resume_carries_the_metrics_logged_before_it(tmp_path: Path) -> None:
    """The resumed records after the save lacked epoch 0's val_loss, which the unstopped
    run's carried until epoch 1 logged its own."""
    reference, resumed = unstopped_and_resumed(tmp_path, SCRIPT)
    assert "resumed from" in resumed.stdout + resumed.stderr and ", batch " in resumed.stdout
    assert resumed.stdout.splitlines()[-1] == reference.stdout.splitlines()[-1]


# The epoch validates first (its val_loss logged ahead of the batches() loop, as the
# --on metric); killed at epoch 1, batch 10 (saved at its batches 1 and 8, steps 21 and
# 28: the newest written resumes); two epochs: the resumed one is the last.
VALIDATE_FIRST = """
import json, os, torch, ckpt_nb
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
X = torch.randn(400, 8); Y = (X.sum(1) > 0).long(); Xv, Yv = X[:100], Y[:100]
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20,
                                     shuffle=True)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with ckpt_nb.auto("store", every_steps=7, on="val_loss:min"):
    for epoch in ckpt_nb.epochs(2):
        with torch.no_grad():
            ckpt_nb.log(val_loss=torch.nn.functional.cross_entropy(model(Xv), Yv).item())
        for i, (xb, yb) in ckpt_nb.batches(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if os.environ["DIE"] and epoch == 1 and i == 10:
                os.kill(os.getpid(), 9)
with ckpt_nb.CheckpointManager("store") as store:
    run = store.load(store.list().iloc[-1]["id"]).extra["ckpt_nb_run"]
print("history", json.dumps(run["history"]), "best", run["best"])
"""


def test_a_log_ahead_of_the_batches_loop_is_not_recorded_again_on_a_mid_epoch_resume(
        tmp_path: Path) -> None:
    """The epoch's code ahead of batches() runs again as a mid-epoch resume begins; its
    log() recorded a val_loss the unstopped run never logged (measured at step 28, on the
    mid-epoch state), which could become the run's best and said that it improved at
    step 28 but was not saved."""
    reference, resumed = unstopped_and_resumed(tmp_path, VALIDATE_FIRST)
    at = re.search(r"resumed from \w+ \(epoch 1, batch \d+, step (\d+)\)", resumed.stdout)
    assert at is not None, resumed.stdout
    assert resumed.stdout.splitlines()[-1] == reference.stdout.splitlines()[-1]
    assert f"improved at step {at[1]} " not in resumed.stdout + resumed.stderr


# A stop file ends the training at an epoch's top (a graceful stop), a skip file skips
# epoch 1's training; after the epochs() loop a test loop through batches() and a log().
# Killed at epoch 1, batch 10, then run again with the file there: the resumed epoch's
# code ahead of batches() leaves the epoch without its batches() loop.
LEFT_AT_THE_TOP = """
import json, os, torch, ckpt_nb
torch.manual_seed(0)
X = torch.randn(400, 8); Y = (X.sum(1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20,
                                     shuffle=True)
test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=20)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
seen = {}
with ckpt_nb.auto("store", every_steps=7):
    for epoch in ckpt_nb.epochs(int(os.environ.get("EPOCHS", "3"))):
        if os.path.exists("SKIP") and epoch == 1:
            continue
        if os.path.exists("STOP"):
            break
        for i, (xb, yb) in ckpt_nb.batches(loader):
            seen[epoch] = seen.get(epoch, 0) + 1
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if os.environ["DIE"] and epoch == 1 and i == 10:
                os.kill(os.getpid(), 9)
    tested = sum(1 for _ in ckpt_nb.batches(test_loader))
    with torch.no_grad():
        ckpt_nb.log(test_loss=torch.nn.functional.cross_entropy(model(X), Y).item())
with ckpt_nb.CheckpointManager("store") as store:
    run = store.load(store.list().iloc[-1]["id"]).extra["ckpt_nb_run"]
print("seen", json.dumps(seen), "tested", tested)
print("history", json.dumps(run["history"]))
"""


@pytest.mark.parametrize("leave", ["break", "no epochs left", "continue"])
def test_an_epoch_left_ahead_of_the_resumed_batches_loop_ends_the_resume_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leave: str) -> None:
    """The resumed epoch's code ahead of batches() left the epoch without its batches()
    loop (a break on a stop file; the loop, now shorter, had no epoch left; a continue
    on a skip file). Its silence of log() went on: the log() after the loop recorded
    nothing (test_loss). And its skip of the batches done went to the next batches()
    loop: the test loop after the loop, or epoch 2's, lost its first batches."""
    script(tmp_path, "train.py", LEFT_AT_THE_TOP, die=True)
    if leave == "no epochs left":
        monkeypatch.setenv("EPOCHS", "1")
    else:
        (tmp_path / ("STOP" if leave == "break" else "SKIP")).touch()
    resumed = script(tmp_path, "train.py", LEFT_AT_THE_TOP)
    assert resumed.returncode == 0, resumed.stderr
    assert re.search(r"resumed from \w+ \(epoch 1, batch \d+", resumed.stdout), resumed.stdout
    seen, history = resumed.stdout.splitlines()[-2:]
    assert seen.endswith("tested 20"), resumed.stdout
    if leave == "continue":
        assert '"2": 20' in seen, resumed.stdout
    assert '"test_loss"' in history, resumed.stdout
