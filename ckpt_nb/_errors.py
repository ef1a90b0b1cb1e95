"""The exceptions ckpt_nb raises.

Every error is a ``CkptError`` and also the built-in a caller would catch
without knowing ckpt_nb, so ``except FileNotFoundError`` keeps working; an argument
wrong in itself (a URL no storage takes, ``max_to_keep=-1``) is a plain ValueError or
TypeError, as the standard library's are::

    CkptError (Exception)
    ├── CheckpointNotFoundError (+ FileNotFoundError, KeyError)
    ├── MetricNotFoundError (+ KeyError)             no metric of that name was logged
    ├── CorruptCheckpointError (+ ValueError)       a checksum or manifest is bad
    ├── StateMismatchError (+ ValueError)           restore target does not fit
    ├── FileFormatError (+ ValueError)              a file ckpt_nb cannot read or write
    ├── UntrustedPickleError (+ PermissionError)    pickled data without trust_pickle=True
    ├── StoreFormatError (+ RuntimeError)           store written by a newer ckpt_nb
    ├── CheckpointInUseError (+ PermissionError)    delete() of a pinned checkpoint
    ├── StoreError (+ OSError)                      the storage backend failed
    │   └── DamagedCatalog                          the catalog's SQLite file is damaged
    ├── CaptureError (+ TypeError)                  a value cannot be checkpointed
    └── MissingDependencyError (+ ImportError)      a package it needs is not installed
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._units import natural_order

# Frames a warning never points at: ckpt_nb's own, and the context managers it uses.
_SKIPPED = (os.path.dirname(os.path.abspath(__file__)) + os.sep, contextlib.__file__)
# Modules that run ckpt_nb's code for it (a notebook's magics and hooks, a background
# save's thread): a warning met there has no line of the user's to point at.
_HOSTS = ("IPython.", "ipykernel.", "ipywidgets.", "traitlets.", "concurrent.futures.",
          "threading")


class CkptError(Exception):
    """Base of every error ckpt_nb raises."""


class CheckpointNotFoundError(CkptError, FileNotFoundError, KeyError):
    """No checkpoint matches the id, alias or path asked for."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class MetricNotFoundError(CkptError, KeyError):
    """No metric of the name asked for: a misspelt one must not plot another."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CorruptCheckpointError(CkptError, ValueError):
    """Stored bytes do not match their checksum, or a manifest cannot be read."""

    def __init__(self, message: str, checkpoint_id: str | None = None) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id


class StateMismatchError(CkptError, ValueError):
    """The objects to restore into do not match what the checkpoint holds."""


class ParameterOrderError(StateMismatchError):
    """An optimizer's state does not fit because its parameters are in another order than
    when it was saved (groups built from a set of names), not because the model changed."""


class FileFormatError(CkptError, ValueError):
    """A file to import, restore or export is not of a kind ckpt_nb handles: its suffix,
    its contents (a .pt holding a list), or a dtype its format cannot hold."""


class UntrustedPickleError(CkptError, PermissionError):
    """The checkpoint holds pickled data, which is loaded only with trust_pickle=True."""


class StoreFormatError(CkptError, RuntimeError):
    """The store, or a checkpoint, was written in a format this version of ckpt_nb (or
    a dtype this version of torch) cannot read."""


class CheckpointInUseError(CkptError, PermissionError):
    """The checkpoint is pinned: unpin it (or delete with force=True) first."""


class StoreError(CkptError, OSError):
    """The storage backend failed to read or write."""


# What to do with a damaged catalog: it is rebuilt from the store's own files.
MOVE_ASIDE = ("once no other process has the store open, move it aside (rename it, and its "
              "-wal and -shm files beside it where there are such) and open the store again")


class DamagedCatalog(StoreError):
    """A catalog (its SQLite file, or a value in it) that is not of the kind ckpt_nb
    writes: the store's own files are intact, and rebuild it. Its message says to move
    the catalog aside (rename it, with its -wal and -shm files, once no other process has
    the store open) and open the store again; ``advice`` says what to do instead where
    that is not it: an object store's cache, which its next opening moves aside by itself
    once no manager has it open."""

    def __init__(self, what: str, path: os.PathLike[str] | str | None = None,
                 advice: str | None = None) -> None:
        said = advice or f"{MOVE_ASIDE}, which rebuilds the catalog from the store's own files"
        super().__init__(f"the catalog {path or ''} is damaged: {what} is not what ckpt_nb "
                         f"writes; {said}".replace("  ", " "))
        self.what, self.path, self.advice = what, path, advice

    def __reduce__(self) -> tuple[Any, ...]:
        # (made again from its parts, as pickle and copy make it: by default from its
        # message, given to __init__ as ``what``, which said the message twice)
        return type(self), (self.what, self.path, self.advice), self.__dict__


class CaptureError(CkptError, TypeError):
    """A value cannot be turned into checkpoint state."""


class MissingDependencyError(CkptError, ImportError):
    """A package that what was asked needs is not installed, named with what to install:
    s3fs for an s3:// store (``pip install "ckpt_nb[s3]"``), safetensors for a
    .safetensors file (``"ckpt_nb[export]"``), the plots' and the explorer's packages
    (``"ckpt_nb[notebook]"``); another fsspec URL's file system (gcsfs for gs://, adlfs
    for az:// and abfs://, paramiko for sftp://), in fsspec's words."""


# How the call in progress in this thread words ckpt_nb's warnings: a magic gives the
# Python API's advice in its own words (None: as written).
WARNING_WORDS: contextvars.ContextVar[Callable[[str], str] | None] = \
    contextvars.ContextVar("ckpt_nb_warning_words", default=None)


@dataclasses.dataclass
class Told:
    """What ckpt_nb told the user in this thread while ``telling`` ran: a session's lines
    (``said``) and its warnings (``warned``), in order."""

    said: list[str] = dataclasses.field(default_factory=list)
    warned: list[str] = dataclasses.field(default_factory=list)


# Where the calls in progress in this thread keep what ckpt_nb tells the user, as well as
# telling it, the outermost first: an explorer's button has no cell output to show it in.
_TOLD: contextvars.ContextVar[tuple[Told, ...]] = contextvars.ContextVar("ckpt_nb_told",
                                                                        default=())


@contextlib.contextmanager
def telling() -> Iterator[Told]:
    """Keep ckpt_nb's warnings and a session's lines in this thread, inside, for the
    caller to show (a ``telling`` further out keeps them too). They are said and warned
    as ever as well, for a script; but a button's handler in a browser shows neither (it
    has no cell output, and the kernel's stderr goes to no page)."""
    told = Told()
    token = _TOLD.set((*_TOLD.get(), told))
    try:
        yield told
    finally:
        _TOLD.reset(token)


def tell(line: str) -> None:
    """Keep a line a session said where ``telling`` asks for it."""
    for told in _TOLD.get():
        told.said.append(line)


# Who may have deleted a checkpoint that a caller still names: said alike by the manager
# and the explorer.
DELETED_BY = "(by retention or by hand, in this process or another)"

# The manager's advice on ranking "best" by another metric, in its own words (its
# arguments and the CLI's options), which a rollback words as its ``on``.
RANK_BY_ANOTHER = "give a metric (metric=, --metric) to rank by another"


def metrics_logged(names: Iterable[str]) -> str:
    """What a refusal of a metric no checkpoint logged says of those logged (loss_2
    before loss_10): said alike by 'best' (the manager, the magics, ``ckpt-nb show``)
    and ``ckpt-nb ls --metric``."""
    logged = sorted(set(names), key=natural_order)
    return f"the metrics logged are: {', '.join(logged)}" if logged else \
        "no metrics were logged"


def too_far_back(which: str, count: int, counted: str = "") -> str:
    """The refusal of a ``-N`` past the oldest of ``count`` checkpoints (``counted``: from
    where they are counted), naming the furthest back there is: said alike by the
    manager, the magics and the CLI."""
    oldest = "the latest is the only one" if count == 1 else f"-{count - 1} is the oldest"
    return (f"only {count} checkpoint{'' if count == 1 else 's'}{counted}: {which} is too "
            f"far back; {oldest}")


@contextlib.contextmanager
def warnings_worded(api: str, words: str) -> Iterator[None]:
    """ckpt_nb's warnings in this thread, inside, with ``api`` said as ``words``; the
    wording of a caller further out (a magic around the Python call) wins. Other code's
    warnings, and the user's filters, stay as they are."""
    if WARNING_WORDS.get() is not None:
        yield
        return
    token = WARNING_WORDS.set(lambda text: text.replace(api, words))
    try:
        yield
    finally:
        WARNING_WORDS.reset(token)


def check_flag(name: str, value: object) -> None:
    """Refuse a flag that is not True or False: a string is true, so ``trust_pickle="no"``
    (from a config file, argparse) would unpickle, and ``strict="no"`` be strict."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} takes True or False, not {value!r}")


def warn(message: str, category: type[Warning] = UserWarning,
         *, skipped: tuple[str, ...] = ()) -> None:
    """Warn at the first line outside ckpt_nb on the stack (the user's call), however deep
    inside the package the warning starts: a fixed ``stacklevel`` points into ckpt_nb
    whenever the same code is reached through another path (the magics, the CLI). Where
    that line is IPython's (a magic's or a cell hook's work) or a thread's (a background
    save), there is no line of the user's to show: the warning is ckpt_nb's own, one line.
    ``skipped``: files passed over too (torch's, for a save in an optimizer's step hook:
    the user's line is the ``opt.step()``)."""
    words = WARNING_WORDS.get()
    if words is not None:
        message = words(message)
    frame = sys._getframe(1)
    level = 2  # (1 is this function's own frame)
    while frame is not None and frame.f_code.co_filename.startswith((*_SKIPPED, *skipped)):
        frame = frame.f_back
        level += 1
    if frame is not None and str(frame.f_globals.get("__name__")).startswith(_HOSTS):
        warnings.warn_explicit(message, category, "ckpt_nb", 0, module="ckpt_nb")
    else:
        warnings.warn(message, category, stacklevel=level)
    for told in _TOLD.get():  # (after: a filter that makes it an error raises it instead)
        told.warned.append(message)
