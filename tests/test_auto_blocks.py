"""Which run an unnamed ``auto()`` block resumes, and which checkpoints its ``keep=``
deletes: its own, told apart by the user code that called it (a script's, killed and run
again; a notebook's, in a real in-process IPython shell)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpt_nb
from test_magics import run  # (the shell's helper)
from test_session_jobs import LOOP, script
from test_session_rerun import TWO, new_kernel


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts like a new process."""
    new_kernel(monkeypatch)


def ids(store: Path) -> set[str]:
    return set(ckpt_nb.CheckpointManager(store).list()["id"])


HELPER = LOOP + """
def fit(model, opt, epochs, die_at=None):
    with ckpt_nb.auto("store", every_steps=5, keep=2, namespace=locals()):
        train(model, opt, epochs, die_at)

modelA = torch.nn.Linear(8, 2); optA = torch.optim.Adam(modelA.parameters(), lr=0.05)
modelB = torch.nn.Linear(8, 2); optB = torch.optim.Adam(modelB.parameters(), lr=0.01)
fit(modelA, optA, 2)
print("A", steps(optA), *ckpt_nb.CheckpointManager("store").list()["id"], flush=True)
fit(modelB, optB, 3, die_at=25)
print("B", steps(optB), flush=True)
"""


def test_a_helpers_block_called_on_two_models_is_two_blocks(tmp_path: Path) -> None:
    """A helper's unnamed block was one block for every call: model B's keep=2 deleted
    model A's checkpoints, and after B's run was killed, the script run again resumed
    B's run into model A."""
    killed = script(tmp_path, "train.py", HELPER, die=True)
    a = next(line for line in killed.stdout.splitlines() if line.startswith("A "))
    steps, *kept = a.split()[1:]
    assert steps == "20" and len(kept) == 2, killed.stdout
    assert set(kept) < ids(tmp_path / "store")
    again = script(tmp_path, "train.py", HELPER, prefix="# lines shifted\n\n")
    assert again.returncode == 0, again.stderr
    a, b = again.stdout.split("\nA 20 ")
    assert "resumed" not in a, again.stdout
    assert "resumed from" in b and "B 30\n" in b, again.stdout


SKIPPED = LOOP + """
pre = torch.nn.Linear(8, 2); pre_opt = torch.optim.Adam(pre.parameters(), lr=0.05)
model = torch.nn.Linear(8, 2); opt = torch.optim.Adam(model.parameters(), lr=0.01)
if not os.path.exists("pretrained.pt"):  # pretraining: done once
    with ckpt_nb.auto("store", every_steps=5, keep=2):
        train(pre, pre_opt, 2)
    torch.save(pre.state_dict(), "pretrained.pt")
    print("pretrained", *ckpt_nb.CheckpointManager("store").list()["id"], flush=True)
model.load_state_dict(torch.load("pretrained.pt"))
with ckpt_nb.auto("store", every_steps=5, keep=2):  # fine-tuning
    train(model, opt, 3, die_at=25)
print("fine-tuned", steps(opt), flush=True)
"""


def test_a_block_skipped_on_a_rerun_leaves_the_next_block_its_own_run(tmp_path: Path) -> None:
    """A script's unnamed blocks were told apart by the order they ran: with the
    pretraining block skipped on the rerun, the fine-tuning block took its identity, did
    not resume its killed run and its keep=2 deleted the pretraining's checkpoints."""
    killed = script(tmp_path, "train.py", SKIPPED, die=True)
    pretrained = set(killed.stdout.split("pretrained ")[1].split()[:2])
    # (a comment and a line break added inside the block: the same code to Python)
    edited = SKIPPED.replace("    train(model, opt, 3, die_at=25)\n",
                             "    # three epochs\n    train(model, opt, 3,\n          die_at=25)\n")
    assert edited != SKIPPED
    again = script(tmp_path, "train.py", edited)
    assert again.returncode == 0, again.stderr
    assert "pretrained" not in again.stdout, again.stdout  # (skipped)
    assert "resumed from" in again.stdout, again.stdout
    assert "fine-tuned 30\n" in again.stdout, again.stdout
    assert pretrained < ids(tmp_path / "store")


IDENTICAL = LOOP + """
model = torch.nn.Linear(8, 2); opt = torch.optim.Adam(model.parameters(), lr=0.05)
with ckpt_nb.auto("store", every_steps=5, keep=2):
    train(model, opt, 1)
print("first", *ckpt_nb.CheckpointManager("store").list()["id"], flush=True)
with ckpt_nb.auto("store", every_steps=5, keep=2):
    train(model, opt, 1)
for _ in range(2):
    with ckpt_nb.auto("store2", every_steps=5, keep=2):
        train(model, opt, 1)
"""


def test_identical_blocks_are_two_blocks_and_a_block_run_again_in_a_loop_is_one(
        tmp_path: Path) -> None:
    """(Two blocks of the same code are told apart by their order among such blocks; a
    loop's block is one block, each pass its run: keep=2 keeps the last pass's two.)"""
    done = script(tmp_path, "train.py", IDENTICAL)
    assert done.returncode == 0, done.stderr
    first = set(done.stdout.split("first ")[1].split()[:2])
    assert len(first) == 2 and len(ids(tmp_path / "store")) == 4
    assert first < ids(tmp_path / "store")
    assert len(ids(tmp_path / "store2")) == 2


SETUP = TWO + "stop_at = None\n"

FIT = """def fit(model, opt, epochs):
    with ckpt_nb.auto({store!r}, every_steps=5, keep=2, namespace=locals()):
        for epoch in ckpt_nb.epochs(epochs):
            for i, (xb, yb) in ckpt_nb.batches(loader):
                if steps(opt) == stop_at:
                    raise RuntimeError("stopped")
                opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
"""


def test_a_helper_cells_block_called_from_two_cells_is_two_blocks(
        shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A helper defined in a cell was one block (its cell and line) for the cells calling
    it on two models: B's keep=2 deleted A's checkpoints, and in a new kernel, A's cell
    resumed B's stopped run into model A."""
    store = tmp_path / "store"
    run(shell, SETUP)
    run(shell, FIT.format(store=str(store)))
    assert run(shell, "fit(modelA, optA, 2)").success
    first = ids(store)
    assert len(first) == 2
    run(shell, "stop_at = 23")
    stopped = run(shell, "fit(modelB, optB, 3)")
    assert isinstance(stopped.error_in_exec, RuntimeError)
    assert first < ids(store)
    new_kernel(monkeypatch)
    run(shell, SETUP)
    run(shell, FIT.format(store=str(store)))
    capsys.readouterr()
    assert run(shell, "fit(modelA, optA, 2)").success
    assert "resumed" not in capsys.readouterr().out
    assert shell.user_ns["steps"](shell.user_ns["optA"]) == 20
    assert run(shell, "fit(modelB, optB, 3)").success
    assert "resumed from" in capsys.readouterr().out
    assert shell.user_ns["steps"](shell.user_ns["optB"]) == 30


def test_a_scripts_edited_block_is_told_how_a_script_takes_its_run_over(tmp_path: Path) -> None:
    """The hint said `%ckpt_rollback ID`, then run this cell again: a script has neither."""
    script(tmp_path, "train.py", SKIPPED, die=True)
    changed = SKIPPED.replace("train(model, opt, 3, die_at=25)", "train(model, opt, 4)")
    again = script(tmp_path, "train.py", changed)
    assert "holds an unfinished run of other code" in again.stdout, again.stdout
    assert "to resume it, call `ckpt_nb.rollback(" in again.stdout, again.stdout
    assert "%ckpt_rollback" not in again.stdout
