"""An interrupt's stop that code in the cell catches: ``%run`` of a file holding the
training loop (which shows the KeyboardInterrupt and goes on), or an ``except`` that takes
KeyboardInterrupt. The cell ran on to its end, which was saved as the run's end: told
"run it again to go on from checkpoint X", the cell run again started its loops over on
the trained model, and ended elsewhere than the unstopped run. In a real in-process
IPython shell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from test_magics import run  # (the shell's helper)

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

SETUP = """
import os, signal, torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
data = [(torch.randn(4, 8), torch.randn(4, 2)) for _ in range(5)]
STOP = None
"""

LOOP = """
for epoch in ckpt_nb.epochs(3):
    for i, (x, t) in ckpt_nb.batches(data):
        opt.zero_grad(); ((model(x) - t) ** 2).mean().backward(); opt.step()
        if (epoch, i) == STOP:
            os.kill(os.getpid(), signal.SIGINT)
"""

CATCHES = {
    "%run": "%run -i {loop}\n",
    "except": "try:\n" + "".join(f"    {line}\n" for line in LOOP.strip().splitlines())
              + "except KeyboardInterrupt:\n    pass\n",
}


def weights(shell: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in shell.user_ns["model"].parameters()]


@pytest.mark.parametrize("catch", sorted(CATCHES))
def test_a_stop_caught_in_the_cell_stops_it_and_the_run_resumes_exactly(
        shell: Any, tmp_path: Path, capsys: Any, catch: str) -> None:
    (tmp_path / "loop.py").write_text(LOOP)
    body = CATCHES[catch].format(loop=tmp_path / "loop.py")
    run(shell, SETUP)
    assert run(shell, f"%%ckpt_auto --dir {tmp_path / 'ref'} --every-steps 2\n{body}").success
    reference = weights(shell)

    run(shell, SETUP + "STOP = (1, 2)")
    cell = f"%%ckpt_auto --dir {tmp_path / 'run'} --every-steps 2\n{body}"
    result = run(shell, cell)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    said = str(result.error_in_exec)
    assert said.startswith("the cell stopped at step 8: run it again to go on from checkpoint ")
    assert said.endswith("(its stop was caught in the cell, by %run or an except that takes "
                         "KeyboardInterrupt, and the cell ran on: not the run's end)")
    capsys.readouterr()
    run(shell, "STOP = None")
    assert run(shell, cell).success
    assert "ckpt_nb: resumed from " in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(weights(shell), reference))
