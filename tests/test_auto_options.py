"""auto()'s options: the magic's spellings, a keyword it does not take, NumPy numbers and
the metric's name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt_nb
from ckpt_nb._magics import CkptMagics

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)


def objects() -> dict[str, object]:
    model = torch.nn.Linear(2, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}


def test_every_is_the_magics_every(tmp_path: Path) -> None:
    """every="10m" (the README's "the magic's forms too") was a TypeError naming
    AutoConfig.__init__."""
    for every, seconds in (("10m", 600.0), (90, 90.0), ("90", 90.0)):
        with ckpt_nb.auto(str(tmp_path / str(every)), namespace=objects(), every=every) as s:
            assert s.config.every_seconds == seconds
    with pytest.raises(ValueError, match=r"every \(--every\) and every_seconds "
                                         r"\(--every-seconds\) say the same: give one"):
        with ckpt_nb.auto(str(tmp_path), namespace={}, every="10m", every_seconds=5):
            pass
    assert ckpt_nb.status() == {"active": False}


@pytest.mark.parametrize("every", [0, -1, "0s", "soon", [1]])
def test_a_bad_every_is_named_every(tmp_path: Path, every: object) -> None:
    """auto(every=0) was refused as "every_seconds (--every-seconds)", a keyword the
    caller never wrote."""
    with pytest.raises((TypeError, ValueError), match=r"^every \(--every\)"):
        with ckpt_nb.auto(str(tmp_path), namespace=objects(), every=every):
            pass
    assert ckpt_nb.status() == {"active": False}


@pytest.mark.parametrize(("keyword", "hint"), [
    ("every_stepz", "every_steps"), ("namespce", "namespace"), ("dir", "directory"),
    ("no_resume", "resume=False"),
    # (CheckpointManager's and Lightning's names: max_to_keep was matched to nothing, and
    # every_n_epochs to every_steps, which counts optimizer steps)
    ("max_to_keep", "keep (CheckpointManager's max_to_keep)"),
    ("metric", "on=(METRIC, 'min'|'max')"), ("mode", "on=(METRIC, 'min'|'max')"),
    ("every_n_epochs", "on=(METRIC, ...) with a log() at each epoch's end"),
])
def test_a_keyword_auto_does_not_take_names_auto_and_its_options(
        tmp_path: Path, keyword: str, hint: str) -> None:
    with pytest.raises(TypeError) as raised:
        with ckpt_nb.auto(str(tmp_path), namespace={}, **{keyword: 1}):
            pass
    message = str(raised.value)
    assert message.startswith(f"auto() got an unexpected keyword argument {keyword!r}: "
                              f"did you mean {hint}"), message
    assert "? It takes directory, namespace, name, every, every_steps, every_seconds, on, " \
        "keep, keep_best" in message
    assert "AutoConfig" not in message
    assert ckpt_nb.status() == {"active": False}


def test_a_keyword_with_no_close_match_ends_its_sentence(tmp_path: Path) -> None:
    """It read "... keyword argument 'frob' It takes directory, ..."."""
    with pytest.raises(TypeError) as raised:
        with ckpt_nb.auto(str(tmp_path), namespace={}, frob=1):
            pass
    assert str(raised.value).startswith("auto() got an unexpected keyword argument 'frob'. "
                                        "It takes directory, namespace, ")


def test_numpy_numbers_are_numbers(tmp_path: Path) -> None:
    """every_steps=np.int64(10) was "not a positive integer"; np.float32 seconds a
    TypeError."""
    with ckpt_nb.auto(str(tmp_path), namespace=objects(), every_steps=np.int64(10),
                      every_seconds=np.float32(5), keep=np.uint8(3),
                      keep_best=np.int32(1), on="loss:min") as session:
        config = session.config
    assert (config.every_steps, config.every_seconds, config.keep, config.keep_best) == \
        (10, 5.0, 3, 1)
    assert [type(v) for v in (config.every_steps, config.keep, config.keep_best)] == [int] * 3
    assert type(config.every_seconds) is float


@pytest.mark.parametrize(("options", "error", "problem"), [
    ({"every_steps": np.int64(0)}, ValueError, "must be a positive integer"),
    ({"every_steps": np.bool_(True)}, ValueError, "must be a positive integer"),
    ({"every_steps": True}, ValueError, "must be a positive integer"),
    ({"every_seconds": np.float64("inf")}, ValueError, "positive and finite"),
    ({"every_seconds": np.float32("nan")}, ValueError, "positive and finite"),
    ({"every_seconds": True}, TypeError, "takes a number of seconds"),
])
def test_numbers_that_cannot_work_are_still_refused(tmp_path: Path, options: dict,
                                                    error: type, problem: str) -> None:
    with pytest.raises(error, match=problem):
        with ckpt_nb.auto(str(tmp_path), namespace={}, **options):
            pass


@pytest.mark.parametrize("name", ["", "  ", 5, None])
def test_on_names_its_metric_by_a_non_empty_string(tmp_path: Path, name: object) -> None:
    """on=("", "min") and on=(5, "min") were taken, and never fired (the magic refuses an
    empty --on)."""
    with pytest.raises(ValueError, match=r"on \(--on\) names its metric as ckpt_nb.log\(\) "
                                         f"does, by a non-empty string, not {name!r}"):
        with ckpt_nb.auto(str(tmp_path), namespace={}, on=(name, "min")):
            pass
    assert ckpt_nb.status() == {"active": False}


def test_any_save_restarts_the_step_count_as_the_docs_say(tmp_path: Path) -> None:
    """--every-steps counts from the last save of any kind: an --on save every 7 steps
    keeps a 10-step trigger from firing. The help and README said "every N steps"."""
    ns = objects()
    model, opt = ns["model"], ns["opt"]
    with ckpt_nb.auto(str(tmp_path), namespace=ns, every_steps=10, on="val_loss:min",
                      sync=True):
        for epoch in ckpt_nb.epochs(3):
            for _ in ckpt_nb.batches(range(7)):
                opt.zero_grad()
                model(torch.ones(2)).sum().backward()
                opt.step()
            ckpt_nb.log(val_loss=1.0 / (epoch + 1))
    table = ckpt_nb.CheckpointManager(tmp_path).list()
    assert list(table["step"]) == [7, 14, 21]
    help_text = " ".join(CkptMagics.ckpt_auto.__doc__.split())
    assert "Any save, whichever trigger or the cell's end takes it, restarts the count of " \
           "--every-steps and the clock of --every / --every-seconds" in help_text
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert "Any save restarts each count: `--every-steps 10` saves 10 steps after the last " \
           "save of any kind" in readme
