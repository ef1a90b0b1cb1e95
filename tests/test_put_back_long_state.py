"""A tracked object whose load_state_dict() keeps the tensors it is given (an EMA), and
whose state_dict() also holds a long list (a loss history of 100,000 values), changed in
place at the epoch's top: a mid-epoch resume reads it again as saved, whichever key its
state_dict() lists first. The walk of its state spent its 100,000-item budget in the list
first and found none of the EMA's tensors: the put-back kept the epoch's in-place update."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_nb._session import _holds_state_of
from test_resume_epoch_prefix import LOADER, SCRIPT
from test_session_jobs import unstopped_and_resumed

EMA = (LOADER + "\nclass EMA:\n    def __init__(self, m):\n        self.shadow = "
       "{{k: v.detach().clone() for k, v in m.state_dict().items()}}\n"
       "        self.log = [0.0] * 100_000\n"
       "    def update(self, m, d):\n        for k, v in m.state_dict().items(): "
       "self.shadow[k].mul_(d).add_(v.detach(), alpha=1 - d)\n"
       "    def state_dict(self): return {state}\n"
       "    def load_state_dict(self, s): self.shadow, self.log = s['shadow'], s['log']\n"
       "ema = EMA(model)")
ORDERS = {"shadow first": "{'shadow': self.shadow, 'log': self.log}",
          "log first": "{'log': self.log, 'shadow': self.shadow}"}


class Kept:
    def __init__(self, state: dict) -> None:
        self.state = state

    def state_dict(self) -> dict:
        return self.state


@pytest.mark.parametrize("order", [0, 1])
def test_a_long_list_beside_the_tensors_hides_them_in_neither_order(order: int) -> None:
    shadow = {"weight": torch.ones(2, 8), "bias": torch.zeros(2)}
    items = [("shadow", shadow), ("log", [0.0] * 100_000)]
    saved = dict(items if order == 0 else items[::-1])
    assert _holds_state_of(Kept(saved), saved)


def test_a_state_that_holds_itself_still_shows_its_tensors() -> None:
    saved: dict = {"shadow": {"weight": torch.ones(2, 8)}}
    saved["me"] = saved
    assert _holds_state_of(Kept(saved), saved)


@pytest.mark.parametrize("order", ORDERS)
def test_an_ema_with_a_long_log_is_put_back_exactly(tmp_path: Path, order: str) -> None:
    code = SCRIPT.format(
        setup=EMA.format(state=ORDERS[order]), loader="loader", batch="batch",
        prefix="        if epoch > 0:\n            ema.update(model, 0.5)",
        body="            ema.update(model, 0.9)",
        end="        kept.append(float(ema.shadow['weight'].sum()))",
        die="epoch == 1 and i == 7").replace("ckpt_nb.epochs(3)", "ckpt_nb.epochs(2)")
    # (two epochs: the kill and the resume still land mid-epoch 1, after its top's in-place
    # update; the epoch's end then reads the EMA the put-back left)
    assert "ckpt_nb.epochs(2)" in code
    reference, resumed = unstopped_and_resumed(tmp_path, code)
    said = resumed.stdout + resumed.stderr
    assert "resumed from" in said and ", batch 0," not in said, said
    assert resumed.stdout.splitlines()[-2:] == reference.stdout.splitlines()[-2:], said
