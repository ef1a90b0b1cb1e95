"""The Python API's refusals in its own words (keywords, plain Python), not the magics'
(``--on``, ``%ckpt_auto``): a script's user has neither."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import ckpt_nb
import warm_python  # (fresh interpreters forked from a warm one)


@pytest.mark.parametrize("on, message", [
    ("foo", "on='foo': say whether a lower or a higher foo is better, on='foo:min' or "
            "on='foo:max'"),
    ("foo:up", "on= takes 'METRIC:min' or 'METRIC:max' (or (METRIC, 'min')), not 'foo:up'"),
])
def test_auto_refuses_an_on_in_its_keywords_words(tmp_path: Path, on: str, message: str) -> None:
    """auto(on="foo") said "--on foo: ... --on foo:min", a flag auto() does not take."""
    with pytest.raises(ValueError) as refused:
        with ckpt_nb.auto(str(tmp_path), on=on, namespace={}):
            pass
    assert str(refused.value) == message
    with pytest.raises(ValueError) as refused:  # (rollback() takes on= as auto() does)
        ckpt_nb.rollback("best", directory=tmp_path, namespace={}, on=on)
    assert str(refused.value) == message


def test_rollback_with_no_store_known_says_what_to_do_in_plain_python(tmp_path: Path) -> None:
    """It said "run %ckpt_auto first", a magic a script cannot run."""
    code = ("import ckpt_nb\ntry:\n    ckpt_nb.rollback()\nexcept ckpt_nb.CheckpointNotFoundError"
            " as exc:\n    print(exc)")
    done = warm_python.run([sys.executable, "-c", code], cwd=tmp_path, timeout=120,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               filter(None, [str(Path(ckpt_nb.__file__).parents[1]),
                                             os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "nothing to roll back: no ckpt_nb session has run in this process; run a "
        "ckpt_nb.auto() block first, or pass directory= and namespace= (the store's folder "
        "or URL, and the namespace to put its objects back into: globals())")


def test_log_outside_a_session_warns_once_where_to_call_it(tmp_path: Path) -> None:
    """A script (or a cell) that forgot its session logged into nothing, unsaid."""
    code = "import ckpt_nb\nckpt_nb.log(loss=1.0)\nckpt_nb.log(loss=0.5)\n"
    done = warm_python.run([sys.executable, "-c", code], cwd=tmp_path, timeout=120,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               filter(None, [str(Path(ckpt_nb.__file__).parents[1]),
                                             os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("ckpt_nb.log() outside a session records nothing: call it "
                             "inside a %%ckpt_auto cell (or a `with ckpt_nb.auto(...):` "
                             "block)") == 1, done.stderr
