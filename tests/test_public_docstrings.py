"""The public API's docstrings say what a user needs in words and numbers, not by the
name of something private the user cannot see (``S3_TIMEOUTS``, ``_root_in``)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from typing import Any

import pytest

import ckpt_nb

pytest.importorskip("matplotlib")  # (the plots' and the explorer's: the notebook extra)

def private_names() -> set[str]:
    """The names ckpt_nb's modules define (classes, constants) outside ``__all__``."""
    names = set()
    for info in pkgutil.iter_modules(ckpt_nb.__path__):
        if info.name in ("__main__", "_kernels"):
            continue
        module = importlib.import_module(f"ckpt_nb.{info.name}")
        names |= {name for name, value in vars(module).items()
                  if not callable(value) or getattr(value, "__module__", "") == module.__name__}
    return names - set(ckpt_nb.__all__)


def public_docs() -> Iterator[tuple[str, Any]]:
    """Each public name, and each public method and property of a public class."""
    for name in ckpt_nb.__all__:
        value = getattr(ckpt_nb, name)
        yield name, value
        if inspect.isclass(value):
            for attr, member in vars(value).items():
                if not attr.startswith("_") and (callable(member) or isinstance(member, property)):
                    yield f"{name}.{attr}", member


def test_public_docstrings_name_nothing_private() -> None:
    private = private_names()
    named = {}
    for where, value in public_docs():
        said = re.findall(r"``([A-Za-z_]\w*)(?:\(\))?``", inspect.getdoc(value) or "")
        bad = sorted({n for n in said if n.startswith("_") and not n.endswith("__")
                      or n in private and n[0].isupper()})
        if bad:
            named[where] = bad
    assert not named


def test_the_explorers_actions_have_docstrings() -> None:
    """Explorer.pin, unpin and delete had none (help() showed their signatures alone)."""
    bare = [name for name, member in vars(ckpt_nb.Explorer).items()
            if not name.startswith("_") and callable(member) and not inspect.getdoc(member)]
    assert not bare


def test_the_plots_docstrings_give_their_limits_numbers() -> None:
    """Each says the number its limit is (in words: its constant is private); they must
    not drift apart."""
    from ckpt_nb import _plots

    dag, diff, compare = (" ".join(plot.__doc__.split()) for plot in
                          (_plots.plot_dag, _plots.plot_diff, _plots.plot_compare))
    assert f"Past {_plots.DAG_LANES_NAMED} branches" in dag
    assert f"a figure {_plots.DAG_WIDTH:g} inches wide" in dag
    assert f"Past {_plots.DIFF_BARS} tensors the {_plots.DIFF_BARS} most changed" in diff
    assert f"more than {_plots.COMPARE_MOST} checkpoints the first {_plots.COMPARE_MOST}" in \
        compare


def test_fsspec_stores_docstring_gives_its_s3_timeouts() -> None:
    from ckpt_nb import _store

    said = " ".join(_store.FsspecStore.__doc__.split())
    assert f"``{_store.S3_TIMEOUTS}``".replace("'", '"') in said


def test_log_and_the_session_classes_say_what_they_take_and_hold() -> None:
    """help(log) said neither what a value may be nor where to call it; AutoConfig's and
    AutoSession's were one line each, naming no field or method."""
    log = inspect.getdoc(ckpt_nb.log) or ""
    for said in ("one-element tensor", "NumPy", "after the epoch's ``batches()`` loop",
                 "``%%ckpt_auto`` cell", "Outside a session it records nothing"):
        assert said in log, said
    config = inspect.getdoc(ckpt_nb.AutoConfig) or ""
    fields = [f.name for f in dataclasses.fields(ckpt_nb.AutoConfig) if f.name != "magic"]
    assert [name for name in fields if f"``{name}``" not in config] == []
    session = inspect.getdoc(ckpt_nb.AutoSession) or ""
    for name in ("config", "manager", "step", "metrics", "history", "best", "status()",
                 "save()", "log()", "rollback()", "epochs()", "batches()"):
        assert f"``{name}``" in session, name
