"""A run refused for a later loop outside epochs() resumes from its newest checkpoint
saved before that loop began (an exact position), however many saves the later loop made
since: in a real in-process IPython shell, crashed and run again in a new kernel."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_magics import run
from test_session_loops import SETUP, same, weights
from test_session_rerun import new_kernel

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

# Two passes of 270 batches over one loader outside epochs(), a save at each step: the
# second pass's saves cannot be resumed from, and the first's newest is ~270 saves back
# (the crashes below, 260 and 265 saves into the second pass, past the 256 of the walk).
ONE_SAMPLE = "loader = torch.utils.data.DataLoader(" \
    "torch.utils.data.TensorDataset(X[:270], Y[:270]), batch_size=1, shuffle=True)"
LONG_PASSES = """%%ckpt_auto --dir {dir} --every-steps {every} --keep 1000
for epoch in range(2):
    for i, (xb, yb) in ckpt_nb.batches(loader):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step(); step += 1; crash_at(step)
"""
EXACT = "the run's newest checkpoint saved before its later loop began (an exact position)"


@pytest.fixture
def in_memory(tmp_path: Path) -> Iterator[Path]:
    """A folder for the crashed run's store in memory (/dev/shm, where there is one; else
    tmp_path): its ~1,070 saves, one at a time, each fsync their files, folders and
    catalog, ~6 ms a sync on a disk, which the walk back to the exact position (what this
    tests) is not about; the same store, written and synced the same way."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="ckpt-nb-exact-", dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_later_loops_many_saves_do_not_hide_the_exact_position(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch,
        in_memory: Path) -> None:
    """The walk back to the exact position read one manifest per save and stopped after
    256: 280 saves into the second pass, the run said it could not resume and trained
    from scratch. Resumed from there and crashed again 265 saves into the second pass
    (no exact save since the resume), the same."""
    setup = SETUP + ONE_SAMPLE
    run(shell, setup)
    # (the reference saves only at its end: its weights are what is compared)
    assert run(shell, LONG_PASSES.format(dir=tmp_path / "ref", every=1000)).success
    expected = weights(shell)

    store = in_memory / "run"
    for crash in (530, 535):
        new_kernel(monkeypatch)
        run(shell, setup)
        (tmp_path / f"crash-{crash}").write_text("")
        capsys.readouterr()
        assert isinstance(run(shell, LONG_PASSES.format(dir=store, every=1)).error_in_exec,
                          RuntimeError)
        if crash == 535:  # (resumed from the first pass's newest: its batch 269)
            assert "resumed from" in capsys.readouterr().out
    new_kernel(monkeypatch)
    run(shell, setup)
    capsys.readouterr()
    assert run(shell, LONG_PASSES.format(dir=store, every=1)).success
    out = capsys.readouterr().out
    assert "resuming from" in out and EXACT in out, out
    assert "(batch 269, step 269)" in out, out
    assert same(weights(shell), expected) and shell.user_ns["step"] == 540
