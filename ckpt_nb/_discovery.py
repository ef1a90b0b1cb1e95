"""Finding what to checkpoint in a notebook's namespace.

Statefuls (modules, optimizers, schedulers, scalers, anything with
``state_dict``/``load_state_dict``) are tracked as objects and restored in
place. Plain variables that can be stored without pickling (numbers,
strings, bytes, paths, dates and times, containers of them, NumPy arrays,
tensors, generators, DataFrames) are captured by value. Everything else is
skipped, with the reason said once.
"""

from __future__ import annotations

import ast
import builtins
import copy
import dataclasses
import functools
import inspect
import io
import json
import linecache
import random
import re
import shlex
import sys
import textwrap
import threading
import types
import weakref
from collections import defaultdict
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from . import _capture as capture
from . import _stdlib_values as stdlib_values
from ._capture import _DICT_KINDS, Unflattener, array_to_json, flatten, torch_has_dtype
from ._errors import CorruptCheckpointError
from ._not_state import NotState
from ._units import binary_unit, human_size

_HIDDEN = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})
_LOCKS = (type(threading.Lock()), type(threading.RLock()), threading.Condition,
          threading.Semaphore, threading.Event)
_MAX_DEPTH = 6
_warned_loaders: weakref.WeakSet[Any] = weakref.WeakSet()  # persistent workers, said once


@dataclass
class Discovery:
    """What a namespace holds, sorted into tracked objects, variables and the rest."""

    statefuls: dict[str, Any] = field(default_factory=dict)
    variables: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        parts = [f"tracking {', '.join(self.statefuls) or 'no stateful objects'}"]
        if self.variables:
            names = list(self.variables)
            shown = ", ".join(names[:8]) + (f", ... ({len(names)})" if len(names) > 8 else "")
            parts.append(f"variables {shown}")
        line = "; ".join(parts)
        if self.skipped:
            line += "; skipped " + skipped_text(self.skipped)
        return line


# Why an object of the user's own holding loop state (an early stopper's class, a
# SimpleNamespace of ``best`` / ``bad``) is skipped, after its type's name, and the ways on.
_NO_STATE_DICT = (", no state_dict(): not saved, nor put back on resume; give it "
                  "state_dict()/load_state_dict(), or keep its fields in plain variables")


# Why an iterator (a loader's, drawn with next() in the loop) is not resumed where it was,
# after its type; several: ``_ITERATORS``, once after their names (``skipped_text``).
_ITERATOR = (": an iterator, whose place no checkpoint holds: after a resume it goes on "
             "from where it stands then (in a new process, from its start), not from where "
             "the stopped run was; a loader's iterator drawn with next() in the loop resumes "
             "exactly as a loader zip()ped with the tracked one, `batches(zip(loader, "
             "other))`")
_ITERATORS = (": iterators, whose places no checkpoint holds: after a resume they go on "
              "from where they stand then (in a new process, from their start), not from "
              "where the stopped run was; a loader's iterator drawn with next() in the loop "
              "resumes exactly as a loader zip()ped with the tracked one, "
              "`batches(zip(loader, other))`")

# The reasons said after a skipped value's type, once for all the names with one (each
# with its type), by their words for several. The user's own objects come last.
_SAID_AFTER_TYPES = {
    _ITERATOR: _ITERATORS,
    _NO_STATE_DICT: _NO_STATE_DICT.replace("give it", "give them").replace(
        "its fields", "their fields"),
}


def skipped_text(skipped: Mapping[str, str]) -> str:
    """``name (why)``, the names with one reason together (``a, b (why)``): three
    Datasets were three copies of one paragraph on a line. Objects of the user's own
    without state_dict() last, their types each and the reason once:
    ``st (SimpleNamespace), stopper (Stopper), no state_dict(): ...``."""
    names: dict[str, list[str]] = {}
    typed: dict[str, list[str]] = {}  # (by the reason said once after them)
    for name, why in skipped.items():
        tail = next((tail for tail in _SAID_AFTER_TYPES if why.endswith(tail)), None)
        if tail is not None:
            typed.setdefault(tail, []).append(f"{name} ({why[:-len(tail)]})")
        else:
            names.setdefault(why, []).append(name)
    parts = [f"{', '.join(together)} ({why})" for why, together in names.items()]
    parts += [", ".join(together) + (tail if len(together) == 1 else _SAID_AFTER_TYPES[tail])
              for tail, together in typed.items()]
    return ", ".join(parts)


class _Unsupported(Exception):
    pass


def plain_size(value: Any, depth: int = 0, limit: int | None = None) -> int:
    """Bytes a plain value would take; raises _Unsupported for anything else. A frame
    over ``limit`` bytes (the caller's cap) is checked by its first rows alone: a cap
    is said to take it only where no column of those fails (its whole round trip, as
    long as a save, is made once a cap takes it)."""
    if depth > _MAX_DEPTH:
        raise _Unsupported("nested too deeply")
    # Exact types: a subclass (an IntEnum, a namedtuple) would be pickled, or come back
    # as its base type.
    if value is None or type(value) in (bool, int, float, str, complex):
        return 8 if not isinstance(value, str) else len(value)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if type(value) in stdlib_values.TYPES:
        if stdlib_values.encode(value) is None:  # (a tzinfo or slice bound that is not)
            raise _Unsupported(f"{type(value).__name__} with a part that would need a pickle")
        return 64
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise _Unsupported("tensor on the meta device: it holds no data")
        if value.layout == torch.strided and not (value.is_quantized or value.is_nested):
            return value.untyped_storage().nbytes()
        flat = flatten({"value": value})  # (sparse and quantized: their parts)
        if any(s.kind == "pickle" for s in flat.storages):
            raise _Unsupported("nested tensor" if value.is_nested else f"{value.dtype} tensor")
        return sum(s.data.nbytes for s in flat.storages)
    if isinstance(value, torch.Generator) and value.device.type == "cpu":
        return value.get_state().nbytes
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufc":
            raise _Unsupported(f"NumPy array of {value.dtype}")
        if not torch_has_dtype(value.dtype):
            raise _Unsupported(f"NumPy array of {value.dtype}, which no tensor holds")
        return value.nbytes
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        if not torch_has_dtype(value.dtype):
            raise _Unsupported(f"NumPy {value.dtype} scalar, which no tensor holds")
        return 8
    if _is_frame(value):
        size = int(value.memory_usage(deep=True).sum()) if hasattr(value, "columns") \
            else int(value.memory_usage(deep=True))
        problem = _frame_problem(value) if limit is None or size <= limit \
            else _problem_of(value.iloc[:_FRAME_SAMPLE_ROWS])
        if problem is not None:
            raise _Unsupported(problem)
        return size
    if type(value) is torch.Size:
        return 8 * len(value)
    if type(value) in (list, tuple, set, frozenset):
        return sum(plain_size(v, depth + 1, limit) for v in value) + 8 * len(value)
    if isinstance(value, dict):
        if type(value) is not dict and type(value) not in _DICT_KINDS:
            raise _Unsupported(f"{type(value).__name__}, a dict subclass: it would come "
                               "back as a plain dict")
        if not all(isinstance(k, (str, int, float, bool)) for k in value):
            raise _Unsupported("dict with non-scalar keys")
        return sum(plain_size(v, depth + 1, limit) for v in value.values()) + 16 * len(value)
    raise _Unsupported(type(value).__name__)


# The rows of a frame over the cap whose round trip says whether a cap could take it.
_FRAME_SAMPLE_ROWS = 1000

# The last verdict on each frame discovery met (by id: it holds a weak reference, to
# tell a later frame at the same address), for as long as its columns are the same.
_frame_verdicts: dict[int, tuple[weakref.ref[Any], tuple[Any, ...], str | None]] = {}


def _frame_problem(frame: Any) -> str | None:
    """Why a DataFrame or Series would not come back as it is (a tz-aware, period,
    interval or nullable column), found by storing and reading it as a save and a
    restore would; None where it comes back equal. A restore of one that does not
    would fail, or hold placeholders for the values stored as pickles. The round trip
    takes as long as a save of the frame: it is made once per frame and layout, not at
    each save (a value that changes it later is left out, named, by the restore)."""
    layout = (frame.shape, tuple(map(str, frame.dtypes if hasattr(frame, "columns")
                                     else [frame.dtype])), str(frame.index.dtype))
    seen = _frame_verdicts.get(id(frame))
    if seen is not None and seen[0]() is frame and seen[1] == layout:
        return seen[2]
    problem = _problem_of(frame)
    for key in [k for k, (ref, _, _) in _frame_verdicts.items() if ref() is None]:
        del _frame_verdicts[key]
    _frame_verdicts[id(frame)] = (weakref.ref(frame), layout, problem)
    return problem


def _problem_of(frame: Any) -> str | None:
    if _plainly_stored(frame) or _round_trips(frame):
        return None
    if hasattr(frame, "columns"):
        for i, column in enumerate(frame.columns):
            part = frame.iloc[:, [i]]
            if not _round_trips(part):
                return (f"its column {column!r} ({part.dtypes.iloc[0]}) would not come back "
                        "as saved: convert that column to keep the frame in checkpoints")
    return f"{type(frame).__name__} of {getattr(frame, 'dtype', 'its index')} would not " \
        "come back as saved"


def _plainly_stored(frame: Any) -> bool:
    """Whether a frame is NumPy columns of numbers and naive times, labelled by distinct
    strings or integers, on a numeric index: stored as arrays, it comes back as it is,
    without the round trip (of its whole data, at each save) that proves it of others."""
    if hasattr(frame, "columns"):
        if frame.columns.nlevels != 1:
            return False
        dtypes, labels = list(frame.dtypes), list(frame.columns)
    else:
        dtypes, labels = [frame.dtype], [frame.name]
    return frame.index.nlevels == 1 and _numpy_kind(frame.index.dtype, "iuf") \
        and all(_numpy_kind(t, "biufcmM") for t in dtypes) \
        and all(label is None or type(label) in (str, int) for label in labels) \
        and len(set(labels)) == len(labels)


def _numpy_kind(dtype: Any, kinds: str) -> bool:
    return isinstance(dtype, np.dtype) and dtype.kind in kinds


def _round_trips(frame: Any) -> bool:
    """Whether a frame's storable form, flattened and read back without pickles,
    equals it (its dtypes too)."""
    try:
        flat = flatten({"value": to_storable(frame)})
        if any(s.kind == "pickle" for s in flat.storages):
            return False
        storages = [torch.from_numpy(s.data) for s in flat.storages]
        decoder = Unflattener([t.to_json() for t in flat.tensors], storages)
        back = from_storable(decoder.decode(flat.skeleton["value"]))
        return type(back) is type(frame) and bool(frame.equals(back)) \
            and bool(frame.index.equals(back.index))
    except Exception:  # noqa: BLE001 - whatever pandas raises on a column it cannot rebuild
        return False


def _is_frame(value: Any) -> bool:
    module = type(value).__module__
    return module.startswith("pandas") and type(value).__name__ in ("DataFrame", "Series")


# What an IterableDataset without state_dict() needs, said of it or of its DataLoader.
_STATELESS_STREAM = ("checkpoints hold none of its state; where it changes as it is iterated "
                     "(an epoch counter that __iter__ advances), give it state_dict() and "
                     "load_state_dict() for a resume to go on with the order an unstopped run "
                     "has")


def _stateless_stream(value: Any) -> bool:
    """An IterableDataset no checkpoint holds the state of (a map-style one's __iter__
    never runs in a DataLoader; a Stateful one is tracked, or reached by its loader)."""
    return isinstance(value, torch.utils.data.IterableDataset) and not _is_stateful(value)


# Which batches() loop restores its loader's order, where the code does not say which.
_TRACKED = "each epoch's first batches() loop; outside epochs(), the cell's first"


def _skip_reason(value: Any, loops: Container[str] = (), named: Container[int] = (),
                 held: Container[int] = (), ours: Container[int] = ()) -> str | None:
    """Why a value is reported as skipped; None for things silently ignored (code).
    ``loops``: where the code that runs passes it to ``batches()`` (``_batches_loops``),
    none where it does not or is not known; ``named``: the ids of the values
    said under names of their own (a loader's dataset said there); ``held``: the ids of
    the generators checkpoints hold (``_held_generators``); ``ours``: those of the
    notebook's own, put back as saved before the epoch's code runs again."""
    if isinstance(value, types.GeneratorType) or inspect.isasyncgen(value):
        return "generator"
    if isinstance(value, io.IOBase):
        return "open file"
    if isinstance(value, _LOCKS):
        return "lock"
    if isinstance(value, types.LambdaType) and value.__name__ == "<lambda>":
        return "lambda"
    if isinstance(value, Iterator) and not isinstance(value, NotState) \
            and not _holds_fields(value):  # (``u_iter = iter(loader)``, drawn by next() in
        # the loop; not a loop helper of ckpt_nb's, nor a class of the user's, which a
        # state_dict() makes resumable: _NO_STATE_DICT)
        return type(value).__name__ + _ITERATOR
    if isinstance(value, torch.utils.data.DataLoader):
        unheld = loader_random(value)[1]
        dataset = value.dataset
        what = "position" if _stateless_stream(dataset) else "order"  # (a stream's is its own)
        stream = _stateless_stream(dataset) and id(dataset) not in named
        if _ZIPPED in loops and (_FIRST in loops or _EITHER in loops) \
                and value.num_workers > 0 \
                and _quietly_held(value, ours):
            # (as a resume says it: _session._zipped_loaders)
            use = ("in the zip() given to ckpt_nb.batches(), with workers, it draws its "
                   f"{what} as zip() makes its iterator, before batches() can set its "
                   "generators: a resume may go on in another order; to resume it exactly, "
                   "make its generator= a notebook variable (`g = torch.Generator()."
                   "manual_seed(7)`, then `generator=g`)" + (
                       ", with persistent_workers=False" if value.persistent_workers else ""))
        elif _IN_ZIP in loops and (_FIRST in loops or _EITHER in loops) \
                and value.num_workers > 0 and value.persistent_workers:
            use = ("in the zip() given to ckpt_nb.batches(), with persistent workers, its "
                   "iterator is made anew by a resume, where a run never stopped kept it "
                   f"from the epoch before: a resume may go on in another {what}; "
                   "persistent_workers=False (and a notebook variable for its generator=) "
                   "resumes it exactly")
        elif _FIRST in loops:
            use = f"ckpt_nb.batches() restores its {what}"
        elif _LATER in loops and _EITHER not in loops:
            use = ("passed to a later batches() loop alone, a plain enumerate: a resume "
                   f"does not restore its sampler's or generators' state (batches() tracks "
                   f"{_TRACKED})")
        elif _EITHER in loops:
            use = f"ckpt_nb.batches() restores its {what} in the loop it tracks ({_TRACKED})"
        else:
            use = f"wrap it in ckpt_nb.batches() to restore its {what}"
        return f"DataLoader: {use}" + (
            "" if not unheld else ", but not the draws from " + ", ".join(
                f"{place} ({why})" for place, why in unheld.items())
            + ": after a resume they differ from a run never stopped") + (
            f"; its dataset ({type(dataset).__name__}) has no state_dict(), so "
            f"{_STATELESS_STREAM}" if stream else "")
    if _stateless_stream(value):
        return f"{type(value).__name__}: a Dataset without state_dict(), so {_STATELESS_STREAM}"
    if isinstance(value, torch.utils.data.Dataset) and (places := _unheld_draws(value, held)):
        them = "it" if len(places) == 1 else "them"
        own = [place.split(" ")[0] for place in places if "." not in place.split(" ")[0]]
        unless = "" if not own else (
            f" unless a DataLoader over it is passed to batches(), which saves "
            f"{', '.join(own)} (the dataset's own generators, not its attributes')")
        return (f"{type(value).__name__}: a Dataset without state_dict() holding "
                f"{', '.join(places)}, which no checkpoint holds{unless}: after a resume the "
                f"draws of its __getitem__ differ from an unstopped run's (the replayed "
                f"batches are fetched again); give it state_dict()/load_state_dict() holding "
                f"{'its' if them == 'it' else 'their'} state, or assign {them} to a notebook "
                f"variable for checkpoints to hold {them}")
    return None


def _unread(value: Any, exc: Exception) -> str:
    """Why a value whose reading raised is skipped (an ``AttrDict`` config's
    ``__getattr__`` raising KeyError for ``load_state_dict``, a dead ``weakref.proxy``):
    one odd object never stops a cell."""
    return f"{type(value).__name__}: not read ({type(exc).__name__} reading it)"


def _quietly(read: Callable[[], Any], otherwise: Any = False) -> Any:
    """``read()``, or ``otherwise`` where reading a value it looks at raised."""
    try:
        return read()
    except Exception:  # noqa: BLE001 - whatever an object's attributes raise
        return otherwise


def _unheld_draws(dataset: Any, held: Container[int]) -> list[str]:
    """The generators a map-style Dataset without state_dict() holds, as attributes or
    its attributes' (a transform's, a Subset's dataset's), that checkpoints do not: a
    resume fetches the batches it replays through ``__getitem__`` again, drawing from
    them as they are."""
    found: dict[int, str] = {}
    for attribute, value in getattr(dataset, "__dict__", {}).items():
        try:
            inner = None if isinstance(value, (type, types.ModuleType)) \
                else getattr(value, "__dict__", None)  # (a module's: the global generators)
            parts = [(attribute, value), *((f"{attribute}.{a}", v) for a, v
                                           in (inner or {}).items())]
        except Exception:  # noqa: BLE001 - a dead weakref.proxy, a __getattr__ raising KeyError
            continue
        for place, rng in parts:
            if isinstance(rng, _RANDOM_KINDS) and not isinstance(rng, random.SystemRandom) \
                    and id(rng) not in held:
                found.setdefault(id(rng), f"{place} ({_random_kind(rng)})")
    return list(found.values())


def _random_kind(rng: Any) -> str:
    """What a generator is, by its library: a NumPy and a torch ``Generator`` were both
    said "(Generator)"."""
    for kind, name in ((torch.Generator, "torch.Generator"),
                       (np.random.Generator, "np.random.Generator"),
                       (np.random.RandomState, "np.random.RandomState"),
                       (random.Random, "random.Random")):
        if isinstance(rng, kind):
            return name if type(rng) is kind else f"{type(rng).__name__}, a {name}"
    return type(rng).__name__


def _held_generators(namespace: Mapping[str, Any], names: list[str]) -> set[int]:
    """The ids of the generators checkpoints hold: those named in the notebook, and
    those a loader's ``batches()`` saves as its epoch begins (``loader_random``)."""
    held: set[int] = set()
    for name in names:
        value = namespace.get(name)
        try:
            if isinstance(value, _RANDOM_KINDS) and not isinstance(value, random.SystemRandom):
                held.add(id(value))
            elif isinstance(value, torch.utils.data.DataLoader):
                held.update(map(id, loader_random(value)[0].values()))
        except Exception:  # noqa: BLE001 - an odd object: discover() says it was not read
            continue
    return held


# The generators a checkpoint holds the state of (``RandomState``: not a SystemRandom).
_RANDOM_KINDS = (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)


def loader_random(loader: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The generators a DataLoader draws from besides the global ones, by where it holds
    them: its own ``generator=`` and its samplers' first (the order of the checkpoints
    that held torch's alone), then those its sampler, batch sampler and dataset hold as
    attributes: a resume replays its order from them. Also those no checkpoint can hold,
    with why and what to use instead."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)
    places = [(f"{name}.generator", getattr(owner, "generator", None)) for name, owner
              in (("loader", loader), ("sampler", sampler), ("batch_sampler.sampler", inner))]
    for name, owner in (("sampler", sampler), ("batch_sampler", batch_sampler),
                        ("batch_sampler.sampler", inner),
                        ("dataset", getattr(loader, "dataset", None))):
        places += [(f"{name}.{attribute}", value)
                   for attribute, value in getattr(owner, "__dict__", {}).items()]
    held: dict[str, Any] = {}
    unheld: dict[str, str] = {}
    seen: set[int] = set()
    for place, value in places:
        if id(value) in seen:
            continue
        if isinstance(value, random.SystemRandom):
            unheld[place] = "a SystemRandom, which has no state to save: use random.Random"
        elif isinstance(value, np.random.BitGenerator):
            unheld[place] = (f"a bare {type(value).__name__}: draw from "
                             "np.random.Generator(it) instead")
        elif isinstance(value, _RANDOM_KINDS):
            held[place] = value
        else:
            continue
        seen.add(id(value))
    return held, unheld


def _quietly_held(loader: Any, ours: Container[int] = frozenset()) -> bool:
    """Whether a loader draws from generators other than the global ones and ``ours``
    (ids): those a resume cannot put back as saved before the epoch's code runs again."""
    try:
        return any(id(rng) not in ours for rng in loader_random(loader)[0].values())
    except Exception:  # noqa: BLE001 - an odd sampler's attributes: said, to be safe
        return True


def warn_persistent_workers(value: Any, name: str | None, order_kept: bool = True) -> None:
    """Say once per loader, where it is used (a cell whose code names it, a ``batches()``
    given it), that its persistent workers' random state is not saved: they keep it from
    epoch to epoch, where fresh workers are seeded from the state that ``batches()``
    replays, so their random augmentation cannot resume bit-identical (its order does:
    ``batches()`` keeps or makes the iterator as the run did; not in a zip() given to it,
    ``order_kept`` False, whose start line says so). ``name``: the notebook's for it,
    where it has one."""
    if not isinstance(value, torch.utils.data.DataLoader) or value.num_workers == 0 \
            or not value.persistent_workers or value in _warned_loaders:
        return
    _warned_loaders.add(value)
    owner = f"{name}'s" if name else "the loader's"
    print(f"ckpt_nb: warning: {owner} persistent workers keep a random state from epoch "
          "to epoch that checkpoints do not hold: after a resume, the random draws in its "
          "workers (a Dataset's augmentation) differ from an unstopped run's" + (
              ", though the order of its batches is the same" if order_kept else "")
          + "; persistent_workers=False resumes bit-identical",
          file=sys.stderr, flush=True)


class LoopIterator(NotState):
    """What ``ckpt_nb.epochs()`` and ``batches()`` return: their loop, with the length
    of what it goes over where that has one, so that ``tqdm()`` around it shows a total
    (a generator has none). ckpt_nb's own, never state: a save does not name one a
    variable holds (``it = ckpt_nb.epochs(4)``) as left out."""

    def __init__(self, loop: Iterator[Any], length: int | None) -> None:
        self._loop = loop
        self._length = length

    def __iter__(self) -> LoopIterator:
        return self

    def __next__(self) -> Any:
        __tracebackhide__ = True  # (IPython: a refusal to resume shows the cell's frame)
        return next(self._loop)

    def __len__(self) -> int:
        if self._length is None:  # (as len() of a DataLoader over an IterableDataset)
            raise TypeError("the iterable this loop goes over has no len()")
        return self._length


def _code_names(code: str, name: str) -> bool:
    """Whether ``code`` names ``name`` (not as another name's part or an attribute)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}\b", code) is not None


# Where the code passes a loader to batches(): the first batches() loop of an epoch (of
# the cell run, outside epochs()) is the one batches() tracks; one surely after it in the
# same epoch is a plain enumerate that saves none of its loader's state; where the code
# does not say which (a branch, a loop that runs it again), it may be either.
_FIRST, _LATER, _EITHER = "first", "later", "either"
# Passed to batches() as a zip()'s argument itself (``batches(zip(l1, l2))``,
# ``zip(iter(l1), l2)``, not ``zip(tqdm(l1), l2)``): zip() makes its iterator before
# batches() begins, which, with workers, draws the epoch's order as it is made (said beside
# one of the above); and anywhere in such a zip(), wrapped too: a resume makes its iterator
# anew, which, with persistent workers, an unstopped run kept from the epoch before.
_ZIPPED, _IN_ZIP = "zipped", "in a zip"



def _made_by_zip(argument: ast.expr) -> ast.Name | None:
    """The name whose iterator a ``zip()`` argument makes as zip() is called, ahead of the
    loop: ``l1`` in ``zip(l1, ...)`` and in ``zip(iter(l1), ...)``; None for others (a
    wrapper's, ``tqdm(l1)``, makes it in the loop)."""
    if isinstance(argument, ast.Call) and isinstance(argument.func, ast.Name) \
            and argument.func.id == "iter" and len(argument.args) == 1 \
            and not argument.keywords:
        argument = argument.args[0]
    return argument if isinstance(argument, ast.Name) else None

class _Code(NamedTuple):
    module: ast.Module
    called: frozenset[str]  # the names it calls: a helper may be one (``run_epoch(ld)``)


class _CkptAliases(ast.NodeTransformer):
    """Names ``from ckpt_nb import batches as B`` binds, read as ``batches``/``epochs``."""

    def __init__(self, aliases: Mapping[str, str]) -> None:
        self.aliases = aliases

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.aliases.get(node.id, node.id), node.ctx), node)


@functools.lru_cache(maxsize=16)
def _parsed(code: str) -> _Code | None:
    """The code as Python (a cell's IPython syntax, ``%time`` or ``!ls``, turned into
    it), or None where it is none or too deeply nested to read."""
    try:
        module = ast.parse(code)
    except (RecursionError, MemoryError):  # (a 5,000-term sum: too deep to compile)
        return None
    except (SyntaxError, ValueError):
        try:
            from IPython.core.inputtransformer2 import TransformerManager
            module = ast.parse(TransformerManager().transform_cell(code))
        except Exception:  # noqa: BLE001 - IPython absent, or code that is not Python at all
            return None
        module.body = [s for statement in module.body for s in _cell_magic_body(statement)]
    aliases = {a.asname: a.name for n in ast.walk(module) if isinstance(n, ast.ImportFrom)
               and (n.module or "").split(".")[0] == "ckpt_nb" for a in n.names
               if a.asname and a.name in ("batches", "epochs")}
    if aliases:
        module = _CkptAliases(aliases).visit(module)
    return _Code(module, frozenset(n.func.id for n in ast.walk(module)
                                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)))


# Cell magics that run their body as the cell's own code, in the notebook's namespace, once.
_PYTHON_CELL_MAGICS = frozenset({"time", "capture"})


def _cell_magic_body(statement: ast.stmt) -> list[ast.stmt]:
    """A ``%%time`` or ``%%capture`` line under ``%%ckpt_auto``: the body it runs, read
    as Python (IPython makes it a ``run_cell_magic`` call given the body as a string, in
    which no loop and no ``batches()`` were read: the loader was said not wrapped)."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
            and call.func.attr == "run_cell_magic" and len(call.args) == 3 \
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                    for a in call.args) and call.args[0].value in _PYTHON_CELL_MAGICS:
        inner = _parsed(call.args[2].value)
        if inner is not None:
            return copy.deepcopy(inner.module.body)  # (the parse is cached: not shared)
    return [statement]


def names_bound(code: str | None) -> set[str]:
    """The names ``code`` assigns outside its functions and classes (``model = Net()``,
    ``for epoch in ...``): objects a cell makes as it runs, which discovery finds at its
    saves, not as it starts. Empty where the code is not Python."""
    parsed = _parsed(code) if code else None
    if parsed is None:
        return set()
    names: set[str] = set()
    pending: list[ast.AST] = list(parsed.module.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        pending.extend(ast.iter_child_nodes(node))
    return names


def _is_call_of(node: ast.AST, name: str) -> bool:
    """A call of ``name`` or ``something.name`` (``ckpt_nb.batches(loader)``)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == name) or \
        (isinstance(func, ast.Attribute) and func.attr == name)


def _name_nodes(nodes: list[ast.AST]) -> list[ast.Name]:
    return [n for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)]


def _call_arguments(call: ast.Call) -> list[ast.AST]:
    return [*call.args, *(k.value for k in call.keywords)]


@functools.lru_cache(maxsize=64)
def _definition_of(code: types.CodeType) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """A namespace function's definition, read from its source (once: each save sorts
    the namespace again); None where it has no source to read (an exec'd one)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(code)))
    except Exception:  # noqa: BLE001 - no source, or source that is no definition alone
        return None
    found = tree.body[0] if tree.body else None
    return found if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


# The top-level modules whose callables run no batches() loop of the notebook's: the
# reader goes on past a call of one (``print(...)``, ``model.train()``, ``torch.no_grad()``).
_LIBRARIES = frozenset({"builtins", "torch", "numpy", "math", "random", "time", "tqdm",
                        "pandas", "itertools", "ckpt_nb", "IPython"})


def _callee(func: ast.expr) -> str | None:
    """A call's target as text where it is a name or a name's attribute (``print``,
    ``model.train``), or a method of ``get_ipython()`` (a magic); None where it is other."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    if isinstance(func, ast.Attribute) and _is_call_of(func.value, "get_ipython"):
        return f"get_ipython().{func.attr}"
    return None


@functools.lru_cache(maxsize=16)
def _callees(module: ast.Module) -> frozenset[str]:
    """The targets the code calls, as ``_callee``'s text (once: each save reads them)."""
    return frozenset(callee for n in ast.walk(module) if isinstance(n, ast.Call)
                     if (callee := _callee(n.func)) is not None)


def _value_named(namespace: Mapping[str, Any], name: str) -> Any:
    """The value a name or an attribute of a name (``trainer.loader``) holds, or None."""
    owner_name, _, attribute = name.partition(".")
    owner = namespace.get(owner_name)
    return owner if not attribute or owner is None \
        else inspect.getattr_static(owner, attribute, None)  # (no property run)


def _method_calls(module: ast.Module) -> frozenset[str]:
    """The methods of named objects the code calls (``trainer.fit``), as ``_callee``'s text."""
    return frozenset(c for c in _callees(module) if "." in c and "(" not in c)


def _method(namespace: Mapping[str, Any], callee: str) -> Any:
    """The function a call ``owner.name(...)`` of a namespace object runs where it is a
    plain method of the object's class outside the libraries (``trainer.fit()``, which
    may pass ``self.loader`` to batches()); None for others (a static or class method,
    an instance's own attribute, a module's function)."""
    owner_name, _, attribute = callee.partition(".")
    owner = namespace.get(owner_name)
    if owner is None or is_code(owner) or attribute in getattr(owner, "__dict__", {}):
        return None
    function = inspect.getattr_static(type(owner), attribute, None)
    if not isinstance(function, types.FunctionType) or \
            str(getattr(function, "__module__", "")).split(".")[0] in _LIBRARIES:
        return None
    return function


def _library_calls(module: ast.Module, namespace: Mapping[str, Any]) -> frozenset[str]:
    """The calls in the code (``_callee``'s text: ``print``, ``torch.no_grad``,
    ``model.train``) of a library's callables, which call no batches() loop."""
    found: set[str] = set()
    for callee in _callees(module):
        if callee.startswith("get_ipython()."):
            found.add(callee)  # (a magic: its code is not read)
            continue
        owner_name, _, attribute = callee.partition(".")
        try:
            if not attribute:
                target = namespace[owner_name] if owner_name in namespace \
                    else getattr(builtins, owner_name, None)
            elif owner_name in namespace:
                owner = namespace[owner_name]
                target = getattr(owner if isinstance(owner, types.ModuleType) else type(owner),
                                 attribute, None)
            else:
                continue
            if target is None:  # (a name the namespace does not hold yet, defined or imported
                continue        # in the cell; an instance's own attribute): not followed
            if not (is_code(target) or isinstance(target, types.BuiltinMethodType)):
                target = type(target)  # (an instance called: its class's code runs)
            module_name = getattr(target, "__module__", None)
        except Exception:  # noqa: BLE001 - an object whose attributes raise: not followed
            continue
        if isinstance(module_name, str) and module_name.split(".")[0] in _LIBRARIES:
            found.add(callee)
    return frozenset(found)


class _Scope:
    """An epoch's body (or the code outside epochs()), read in order: whether a
    batches() call came before in it, and whether a call the reader cannot see into
    did (which may have run one)."""

    def __init__(self) -> None:
        self.seen = False
        self.opaque = False


class _LoopReader:
    """Reads where code passes names to batches() (_FIRST, _LATER or _EITHER), going
    into the helpers and the methods of named objects it calls whose source it reads,
    and which names reach code it cannot read (a helper's helper, a partial, a container,
    a subscript, an object whose method it cannot read): those may be passed to any loop."""

    def __init__(self, module: ast.Module,
                 functions: Mapping[str, tuple[types.CodeType, bool]],
                 library: frozenset[str]) -> None:
        self.functions = functions  # (the namespace's, by name: their code, and whether
        self.library = library      # their globals are the namespace)
        self.defined = {n.name: n for n in module.body
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.passes: list[tuple[tuple[str, ...], str]] = []  # (a batches() call's names)
        self.escapes: set[str] = set()
        self.binding: dict[str, list[str]] | None = None  # (a helper's: its parameters)
        self.shared = True  # (whether the helper read has the namespace as its globals)
        self.reading: set[str] = set()
        self.bare: set[str] = set()  # (a helper's parameters bound to a name alone)

    def names(self, node: ast.Name) -> list[str]:
        """The namespace names a name in the code read stands for (in a helper: its
        parameter's argument; a global of another module's function: none)."""
        if self.binding is None or (self.shared and node.id not in self.binding):
            return [node.id]
        return self.binding.get(node.id, [])

    def block(self, statements: list[ast.stmt], scope: _Scope, repeated: bool,
              after: bool) -> None:
        """``repeated``: whether the block may run more than once in a scope's run;
        ``after``: whether a batches() loop surely ran before it in that run."""
        for statement in statements:
            self.statement(statement, scope, repeated, after)
            after = after or _runs_batches(statement)

    def statement(self, node: ast.AST, scope: _Scope, repeated: bool, after: bool) -> None:
        """A statement (or a part of one: a ``with`` item, an ``except`` clause)."""
        if isinstance(node, ast.ClassDef) and self.binding is None:
            # (its methods run where a call of an instance the namespace does not hold
            # yet runs them: the names they read may be passed to any loop)
            self.escapes.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                                and isinstance(n.ctx, ast.Load))
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return  # (its body runs where it is called)
        if isinstance(node, (ast.For, ast.AsyncFor)):
            if not isinstance(node.iter, ast.Name):  # (`for x in loader`: no batches() loop)
                self.expression(node.iter, scope, repeated, after)
            if _iterates(node.iter, "epochs"):  # (each epoch tracks its own first loop)
                self.block(node.body, _Scope(), False, False)
            else:
                self.block(node.body, scope, True, after or _iterates(node.iter, "batches"))
            self.block(node.orelse, scope, repeated, after)
            return
        if isinstance(node, ast.While):
            self.expression(node.test, scope, True, after)
            self.block(node.body, scope, True, after)
            self.block(node.orelse, scope, repeated, after)
            return
        for _, value in ast.iter_fields(node):
            if isinstance(value, ast.expr):
                self.expression(value, scope, repeated, after)
            elif isinstance(value, list):
                statements = [v for v in value if isinstance(v, ast.stmt)]
                self.block(statements, scope, repeated, after)
                for part in value:
                    if isinstance(part, ast.expr):
                        self.expression(part, scope, repeated, after)
                    elif isinstance(part, (ast.withitem, ast.excepthandler, ast.match_case)):
                        self.statement(part, scope, repeated, after)

    def expression(self, node: ast.AST, scope: _Scope, repeated: bool, after: bool) -> None:
        """The calls in an expression, in order; then the names in it that reached no
        call the reader follows, which may be passed to any loop."""
        calls = sorted(_calls(node, repeated), key=lambda c: (c[0].lineno, c[0].col_offset))
        followed: set[int] = set()
        handed: set[int] = set()  # (an attribute's owner an unread call is given it from)
        for call, again in calls:
            followed.add(id(call.func))
            if _is_call_of(call, "batches"):
                arguments = _name_nodes(_call_arguments(call))
                followed.update(map(id, arguments))
                where = _LATER if after else _FIRST \
                    if not scope.seen and not scope.opaque and not again else _EITHER
                scope.seen = True
                # (``batches(self.loader)``: the attribute of the object self stands for)
                attributes = {id(a.value): a.attr for a in _call_arguments(call)
                              if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name)}
                self.passes.append((tuple(
                    (f"{n}.{attributes[id(a)]}" if self.binding is None or a.id in self.bare
                     or a.id not in self.binding else "?") if id(a) in attributes else n
                    for a in arguments for n in self.names(a)), where))
                # (a later loop's zip() is a plain enumerate's: the tracked loop's alone
                # says a loader is zipped, `batches(l1)` then `batches(zip(l1, l2))`)
                zips = [] if where == _LATER else [
                    z for z in ast.walk(ast.Tuple(_call_arguments(call)))
                    if isinstance(z, ast.Call) and isinstance(z.func, ast.Name)
                    and z.func.id == "zip"]
                for kind, names in (
                        (_ZIPPED, [n for z in zips for a in z.args
                                   if (n := _made_by_zip(a)) is not None]),
                        (_IN_ZIP, _name_nodes([a for z in zips for a in z.args]))):
                    if names:
                        self.passes.append((tuple(n for a in names for n in self.names(a)),
                                            kind))
            elif isinstance(call.func, ast.Name) and call.func.id not in self.reading \
                    and (definition := self.definition(call.func.id)) is not None:
                followed.update(map(id, self.helper(call, definition, scope, repeated or again,
                                                    after)))
            elif (method := _callee(call.func)) is not None and "." in method \
                    and method not in self.reading \
                    and (definition := self.definition(method)) is not None:
                assert isinstance(call.func, ast.Attribute)  # (a method: its owner is self)
                bound = ast.Call(call.func, [call.func.value, *call.args], call.keywords)
                followed.update(map(id, self.helper(bound, definition, scope, repeated or again,
                                                    after, method)))
            elif _is_call_of(call, "epochs") or _callee(call.func) in self.library:
                followed.update(id(a) for a in _call_arguments(call) if isinstance(a, ast.Name))
            else:
                scope.opaque = True
                handed.update(id(a.value) for a in _call_arguments(call)  # (``f(self.loader)``)
                              if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name))
                if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
                    self.escapes.update(self.names(call.func.value))  # (its method may pass
                    # the loaders it holds to a loop: ``self.fit()`` in a method read)
        # (a loader read in place, `loader.dataset` or `[... for x in loader]`, is iterated
        # or looked at here, not passed to a loop elsewhere)
        read_here = {id(n.value) for n in ast.walk(node) if isinstance(n, ast.Attribute)} | \
            {id(n.iter) for n in ast.walk(node) if isinstance(n, ast.comprehension)}
        read_here -= handed
        for name in _name_nodes([node]):
            if id(name) not in followed and id(name) not in read_here and \
                    isinstance(name.ctx, ast.Load):
                self.escapes.update(self.names(name))

    def definition(self, name: str) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef,
                                            bool] | None:
        """A helper the code calls, and whether its globals are the namespace's."""
        if self.binding is None and name in self.defined:
            return self.defined[name], True
        if self.binding is None and name in self.functions:
            code, shared = self.functions[name]
            found = _definition_of(code)
            return None if found is None else (found, shared)
        return None  # (a helper's helper: its globals are not known here)

    def helper(self, call: ast.Call, definition: tuple[ast.FunctionDef | ast.AsyncFunctionDef,
                                                       bool],
               scope: _Scope, repeated: bool, after: bool,
               name: str | None = None) -> list[ast.Name]:
        """Read a helper's body where it is called, its parameters bound to the call's
        arguments (a method's first, to its owner); the names it binds (the others, passed
        on through ``*``, escape). ``name``: the call's, where it is not the function's."""
        function, shared = definition
        name = name or function.name
        arguments = function.args
        positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
        bound: dict[str, ast.AST] = {k.arg: k.value for k in call.keywords if k.arg}
        for parameter, argument in zip(positional, call.args):
            if isinstance(argument, ast.Starred):
                break
            bound[parameter] = argument
        rest = call.args[len(positional):]
        if arguments.vararg and rest:  # (``def wrapper(*a, **k)``: a decorator's)
            bound[arguments.vararg.arg] = ast.Tuple(list(rest), ast.Load())
        if arguments.kwarg:
            left = [k.value for k in call.keywords if k.arg not in bound]
            if left:
                bound[arguments.kwarg.arg] = ast.Tuple(left, ast.Load())
        bare = {p for p, a in bound.items() if isinstance(a, ast.Name)}
        nodes = {p: _name_nodes([a]) for p, a in bound.items()}
        binding = {p: [n for node in found for n in self.names(node)]
                   for p, found in nodes.items()}
        parameters = {*positional, *(a.arg for a in arguments.kwonlyargs)}
        if arguments.vararg:
            parameters.add(arguments.vararg.arg)
        if arguments.kwarg:
            parameters.add(arguments.kwarg.arg)
        outer = self.binding, self.shared, self.bare
        # (a parameter no argument binds, another module's global: no notebook name; a
        # local the body assigns, which a notebook name may share)
        declared = {n for s in ast.walk(function) if isinstance(s, (ast.Global, ast.Nonlocal))
                    for n in s.names}
        assigned = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, (ast.Store, ast.Del))} - parameters - declared
        self.binding, self.shared = {**dict.fromkeys(assigned, []),
                                     **{p: [] for p in parameters}, **binding}, shared
        self.bare = bare
        self.reading.add(name)
        try:
            self.block(function.body, scope, repeated, after)
        finally:
            self.binding, self.shared, self.bare = outer
            self.reading.discard(name)
        return [n for found in nodes.values() for n in found]


def _calls(node: ast.AST, repeated: bool) -> list[tuple[ast.Call, bool]]:
    """The calls in an expression, each with whether it may run more than once (in a
    comprehension's element, or a loop of it after the first); none in a lambda."""
    if isinstance(node, ast.Lambda):
        return []
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        first = node.generators[0]
        return _calls(first.iter, repeated) + [
            found for part in ast.iter_child_nodes(node) if part is not first
            for found in _calls(part, True)] + [
            found for part in ast.iter_child_nodes(first) if part is not first.iter
            for found in _calls(part, True)]
    found = [(node, repeated)] if isinstance(node, ast.Call) else []
    return found + [c for part in ast.iter_child_nodes(node) for c in _calls(part, repeated)]


def _iterates(node: ast.AST, name: str) -> bool:
    """Whether a ``for`` over this iterates a call of ``name`` (``batches(loader)``,
    ``tqdm(ckpt_nb.epochs(3))``), not one in a branch of it or in a lambda."""
    if _is_call_of(node, name):
        return True
    return isinstance(node, ast.Call) and any(_iterates(a, name) for a in node.args)


def _runs_batches(node: ast.stmt) -> bool:
    """Whether a statement that completes has surely run a batches() loop: a ``for`` over
    one, or a ``with`` block holding such a ``for``."""
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return _iterates(node.iter, "batches")
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return any(map(_runs_batches, node.body))
    return False


def _loaders_in(value: Any, objects: bool = True) -> list[Any]:
    """The DataLoaders a value is or holds, one level down (``loaders["train"]``; with
    ``objects``, an object's attributes too: ``trainer.loader``)."""
    if isinstance(value, torch.utils.data.DataLoader):
        return [value]
    if isinstance(value, Mapping):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif objects and not is_code(value):
        items = _quietly(lambda: _attribute_values(value), [])
    else:
        return []
    return [v for v in items if isinstance(v, torch.utils.data.DataLoader)]


def _attribute_values(value: Any) -> list[Any]:
    """An object's attribute values, read without running its code: its ``__dict__``,
    its ``__slots__`` and its class's attributes (a loader a class method uses)."""
    found = list(getattr(value, "__dict__", {}).values())
    for kind in type(value).__mro__:
        found += kind.__dict__.values()
        for slot in kind.__dict__.get("__slots__", ()):
            member = kind.__dict__.get(slot)
            if isinstance(member, types.MemberDescriptorType):
                found.append(_quietly(lambda member=member: member.__get__(value), None))
    return found


@functools.lru_cache(maxsize=16)
def helper_accumulators(code: types.CodeType, line: int) -> tuple[str, ...]:
    """The locals of a function of the user's that runs a batches() loop (the one at its
    ``line``, the frame's) which it sets before that loop and adds to in it (``total =
    0.0``, then ``total += loss.item()``): no checkpoint holds a function's locals, so a
    resume mid-epoch starts them again at their first value; a later loop's (validation)
    run whole after it. None where its source cannot be read."""
    function = _definition_of(code)
    if function is None:
        return ()
    line -= code.co_firstlineno - 1  # (in the function's source alone, as ast reads it)
    declared = {n for s in ast.walk(function) if isinstance(s, (ast.Global, ast.Nonlocal))
                for n in s.names}
    found: dict[str, None] = {}
    for loop in ast.walk(function):
        if not isinstance(loop, (ast.For, ast.AsyncFor)) or not _iterates(loop.iter, "batches") \
                or not loop.lineno <= line <= (loop.end_lineno or loop.lineno):
            continue
        before = {t.id for n in ast.walk(function) if isinstance(n, (ast.Assign, ast.AnnAssign))
                  and n.lineno < loop.lineno
                  for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
                  for t in ast.walk(target) if isinstance(t, ast.Name)}  # (`a, b = 0, 0`)
        found.update((n.target.id, None) for part in loop.body for n in ast.walk(part)
                     if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)
                     and n.target.id in before and n.target.id not in declared)
    return tuple(found)


def _batches_loops(code: str, namespace: Mapping[str, Any]) -> dict[int, set[str]] | None:
    """Where ``code`` passes each DataLoader of ``namespace`` (by id) to batches(): _FIRST
    (the loop batches() tracks), _LATER (a loop surely after it in the same epoch, which
    saves none of its loader's state), _EITHER; directly, through a helper or a method
    (``trainer.fit()``, ``self.loader``) whose source it reads, or under another name
    bound to the same object. Conservative: a loader
    that reaches code the reader cannot follow (a static method, a partial, a container, a
    subscript), a batches() call given what names no loader, and a first loop after a
    call the reader cannot see into, are _EITHER. None where the code is not Python
    (never raises: a start line goes on with its general wording). A ``%run`` of a
    Python file is read as that file's code; one it cannot read makes every loader
    _EITHER, as code it cannot see into (it may pass them to batches())."""
    code, unread = _with_run_files(code)
    parsed = _parsed(code)
    if parsed is None:
        return None
    functions = []
    for name in sorted(parsed.called | _method_calls(parsed.module)):
        value = namespace.get(name) if "." not in name else \
            _quietly(lambda name=name: _method(namespace, name), None)
        if isinstance(value, types.FunctionType):
            try:
                unwrapped = inspect.unwrap(value)  # (a decorated helper: its own code)
            except Exception:  # noqa: BLE001 - a __wrapped__ cycle
                continue
            if isinstance(unwrapped, types.FunctionType):
                functions.append((name, unwrapped.__code__, unwrapped.__globals__ is namespace))
    read = _read_loops(code, tuple(functions), _library_calls(parsed.module, namespace))
    if read is None:
        return None
    passes, escapes = read
    loaders = [v for v in namespace.values()
               if _quietly(lambda v=v: isinstance(v, torch.utils.data.DataLoader))]
    loops: dict[int, set[str]] = {}
    for passed, where in passes:
        values = [_quietly(lambda n=n: _value_named(namespace, n), None) for n in passed]
        direct = [v for v in values if isinstance(v, torch.utils.data.DataLoader)]
        if where in (_ZIPPED, _IN_ZIP):  # (said beside the loop it is passed to)
            for loader in direct:
                loops.setdefault(id(loader), set()).add(where)
            continue
        held = [loader for v in values if v is not None
                and not isinstance(v, torch.utils.data.DataLoader)
                for loader in _loaders_in(v, objects=False)]
        for loader in direct:
            loops.setdefault(id(loader), set()).add(where)
        for loader in held if direct or held else loaders:  # (a name it cannot resolve)
            loops.setdefault(id(loader), set()).add(_EITHER)
    for name in escapes:
        for loader in _loaders_in(namespace.get(name)):
            loops.setdefault(id(loader), set()).add(_EITHER)
    for loader in loaders if unread else ():
        loops.setdefault(id(loader), set()).add(_EITHER)
    return loops


_RUN_MAGIC = re.compile(r"%run\b|run_line_magic")  # (a cell that may hold one)
# %run's options that take a value (IPython's "nidtN:b:pD:l:rs:T:em:G"); -m runs a module.
_RUN_VALUED = frozenset("NbDlsTm")


def _run_file(arguments: str) -> str | None:
    """The Python file a ``%run`` line's arguments run, where it is one this process can
    read now (relative to the working directory, as %run finds it); None for a module
    (-m), a notebook, a name IPython expands ($x, {x}), or no such file."""
    if any(c in arguments for c in "${"):
        return None
    try:
        words = shlex.split(arguments)
    except ValueError:
        return None
    while words and words[0].startswith("-") and len(words[0]) > 1:
        option = words.pop(0)
        if "m" in option[1:]:
            return None
        if option[-1] in _RUN_VALUED and words:
            words.pop(0)  # (its value)
    if not words:
        return None
    path = Path(words[0]).expanduser()
    if not path.suffix and not path.exists():
        path = path.with_suffix(".py")
    return str(path) if path.suffix == ".py" and path.is_file() else None


class _RunFiles(ast.NodeTransformer):
    """``%run FILE`` statements (``get_ipython().run_line_magic('run', ...)``) replaced by
    FILE's code, where it reads as Python; ``unread`` where one does not."""

    def __init__(self) -> None:
        self.found = self.unread = False

    def visit_Expr(self, node: ast.Expr) -> Any:
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "run_line_magic"
                and _is_call_of(call.func.value, "get_ipython") and len(call.args) == 2
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                        for a in call.args) and call.args[0].value == "run"):
            return node
        self.found = True
        path = _run_file(call.args[1].value)
        try:
            body = ast.parse(Path(path).read_text(encoding="utf-8")).body \
                if path is not None else None
        except Exception:  # noqa: BLE001 - unreadable, or no Python
            body = None
        if not body:
            self.unread = True
            return node
        return body


def _with_run_files(code: str) -> tuple[str, bool]:
    """The code with each ``%run`` of a Python file in it replaced by that file's code
    (the training loop there: discovery read only the cell, and told a loader the file
    passes to batches() to be wrapped in it), and whether a ``%run`` was not read (a
    module, a notebook, a file it cannot read or parse). The code as it is where it runs
    no file; read anew each time (the file may have changed since)."""
    if not _RUN_MAGIC.search(code):
        return code, False
    parsed = _parsed(code)
    if parsed is None:
        return code, False
    files = _RunFiles()
    try:
        module = files.visit(copy.deepcopy(parsed.module))  # (the parse is cached: not shared)
        if not files.found:
            return code, False
        return ast.unparse(ast.fix_missing_locations(module)), files.unread
    except Exception:  # noqa: BLE001 - code ast reads in a way this does not expect
        return code, True


@functools.lru_cache(maxsize=16)
def _read_loops(code: str, functions: tuple[tuple[str, types.CodeType, bool], ...],
                library: frozenset[str]
                ) -> tuple[list[tuple[tuple[str, ...], str]], set[str]] | None:
    """``_batches_loops`` by name, for the code, the namespace's functions it calls and
    its library calls (once: each save sorts the namespace again)."""
    parsed = _parsed(code)
    if parsed is None:
        return None
    try:
        reader = _LoopReader(parsed.module, {n: (c, s) for n, c, s in functions}, library)
        reader.block(parsed.module.body, _Scope(), False, False)
    except Exception:  # noqa: BLE001 - code ast reads in a way this does not expect
        return None
    return reader.passes, reader.escapes


def code_run_by(frame: types.FrameType) -> str | None:
    """The code a frame runs, for ``discover(code=)``: its file's, at a module's top
    level; in a function (``auto(namespace=locals())`` in ``main()``), that function's
    body alone, which the reader reads from its start (the file's top level skips the
    bodies of its functions, where each loader then read as passed to no batches()).
    None where there is no source."""
    lines = linecache.getlines(frame.f_code.co_filename, frame.f_globals)
    if frame.f_code.co_name == "<module>" or not lines:
        return "".join(lines) or None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(frame.f_code)))
        function = tree.body[0]
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        return ast.unparse(function.body)
    except Exception:  # noqa: BLE001 - no source, or source that is no definition alone
        return None


def is_code(value: Any) -> bool:
    """Whether a value is code (a module, class, function, method): never state to capture."""
    return isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
                              types.MethodType, functools.partial))


def _state_dict_fails(value: Any) -> bool:
    """Whether a DataLoader's ``state_dict()`` raises: accelerate's ``DataLoaderShard``
    has one that works only over torchdata's StatefulDataLoader, and fails over a plain
    DataLoader (``accelerator.prepare(loader)``). Such a loader is no Stateful: it is a
    loader, which ``batches()`` saves and puts back as it does a plain one's. torchdata's
    own (StatefulDataLoader and its subclasses) is not asked: it works, and asked before
    the loop it makes the epoch's iterator (starting its workers, drawing from torch's
    RNG) ahead of the cell's own ``torch.manual_seed``."""
    if not isinstance(value, torch.utils.data.DataLoader):
        return False
    owner = next((c for c in type(value).__mro__ if "state_dict" in vars(c)), None)
    if (getattr(owner, "__module__", None) or "").startswith("torchdata."):
        return False
    try:
        value.state_dict()
    except Exception:  # noqa: BLE001 - whatever the wrapper's own code raises
        return True
    return False


def _is_stateful(value: Any) -> bool:
    """Whether a value's class gives it ``state_dict()`` and ``load_state_dict()``: asked
    of the class, since the Protocol's check asks the instance, whose ``__getattr__`` (a
    DotMap config's) would store a new child under each name asked for."""
    if isinstance(value, type):
        return False
    methods = ("state_dict", "load_state_dict")
    if all(callable(getattr(type(value), method, None)) for method in methods):
        return not _state_dict_fails(value)
    # A proxy or wrapper forwarding them (wrapt's ObjectProxy, a class delegating to its
    # model by __getattr__) is asked itself, as before; a mapping (a config dict with
    # attribute access) never is: its answer would be a new child stored in it, or a
    # KeyError, for a value that is no state of the kind.
    return not isinstance(value, Mapping) and \
        all(callable(getattr(value, method, None)) for method in methods)


def _not_state(value: Any) -> bool:
    """Whether ``value`` is ckpt_nb's own, never state: a NotState, or a list, tuple or
    dict of nothing else (``dag_layout()``'s list of DagNodes, a list of managers)."""
    if isinstance(value, NotState):
        return True
    items = value.values() if type(value) is dict else value \
        if type(value) in (list, tuple) else ()
    return bool(items) and all(isinstance(item, NotState) for item in items)


def discover(namespace: Mapping[str, Any], *, track: list[str] | None = None,
             max_variable_bytes: int = 100 << 20, code: str | None = None,
             magic: bool = False) -> Discovery:
    """Sort a namespace (``track`` names, if given, else everything public). ``code``:
    the code that runs (a cell's), where known: a DataLoader it passes to ``batches()``
    is not told to be wrapped in it, and one it passes to a later loop alone is told
    that its state is not restored (``_batches_loops``). ``magic``: the session is a
    magic's, whose cap is set by ``%config``, not ``auto()``'s ``max_variable_bytes=``."""
    found = Discovery()
    names = track if track is not None else [
        n for n in namespace if not n.startswith("_") and n not in _HIDDEN]
    streams = {id(namespace[n]) for n in names
               if _quietly(lambda n=n: _stateless_stream(namespace.get(n)))}
    held = _held_generators(namespace, names)
    ours = {id(namespace[n]) for n in names if _quietly(  # (the notebook's own generators)
        lambda n=n: isinstance(namespace.get(n), _RANDOM_KINDS)
        and not isinstance(namespace.get(n), random.SystemRandom))}
    loops = {} if code is None or not any(_quietly(
        lambda n=n: isinstance(namespace.get(n), torch.utils.data.DataLoader)) for n in names) \
        else _quietly(lambda: _batches_loops(code, namespace), None)  # (None: either said)
    restored = _quietly(lambda: _samplers_batches_restores(namespace, names, loops, held),
                        set())
    for name in names:
        if name not in namespace:
            found.skipped[name] = "not defined"
            continue
        value = namespace[name]
        try:
            if isinstance(value, torch.Generator):
                found.statefuls[name] = GeneratorState(value)
            elif isinstance(value, random.SystemRandom):  # (its getstate() raised at each save)
                found.skipped[name] = ("a SystemRandom, which has no state to save: use "
                                       "random.Random")
            elif isinstance(value, (np.random.Generator, np.random.RandomState, random.Random)):
                found.statefuls[name] = RandomState(value)
            elif isinstance(value, torch.nn.Module) and _on_meta(value):
                found.skipped[name] = ("module on the meta device, holding no data to save: "
                                       "to_empty() or load it first")
            elif _is_stateful(value):
                found.statefuls[name] = value
            elif (reason := _skip_reason(
                    value, {_EITHER} if loops is None else loops.get(id(value), set()), streams,
                    held, ours)) is not None:
                found.skipped[name] = reason
                if code is not None and _code_names(code, name):
                    warn_persistent_workers(value, name, order_kept=_IN_ZIP not in (
                        loops or {}).get(id(value), ()))
            elif is_code(value) or _not_state(value) or \
                    type(value).__module__.startswith(("IPython", "ipykernel")):
                if track is not None:
                    found.skipped[name] = f"{type(value).__name__}: " + (
                        _OWN_OBJECT if _not_state(value) else "code is not state")
            else:
                try:
                    size = plain_size(value, limit=max_variable_bytes)
                except _Unsupported as exc:
                    if id(value) in restored:
                        continue  # (its loader's line says batches() restores its order)
                    found.skipped[name] = str(exc) + (
                        _NO_STATE_DICT if str(exc) == type(value).__name__
                        and _holds_fields(value) else "")
                    continue
                if size > max_variable_bytes:
                    found.skipped[name] = _over_the_cap(size, max_variable_bytes, magic)
                else:
                    found.variables[name] = value
        except Exception as exc:  # noqa: BLE001 - whatever an object's attributes raise
            found.skipped[name] = _unread(value, exc)
    _drop_contained_modules(found.statefuls)
    return found


def _samplers_batches_restores(namespace: Mapping[str, Any], names: list[str],
                                loops: Mapping[int, set[str]] | None,
                                held: Container[int]) -> set[int]:
    """The ids of the samplers and batch samplers of the loaders the code passes to the
    ``batches()`` loop it tracks, whose every generator batches() saves as the epoch
    begins (``loader_random``) and whose ``__iter__`` changes no field of theirs
    (``_advances_own_fields``): a resume puts them back, so a sampler of the user's own
    holding a ``torch.Generator`` resumed its order bit-exact while the start line said it
    was "not saved, nor put back on resume"."""
    found: set[int] = set()
    for name in names:
        loader = namespace.get(name)
        if not isinstance(loader, torch.utils.data.DataLoader) or loops is not None and \
                not {_FIRST, _EITHER} & loops.get(id(loader), set()):
            continue
        batch_sampler = getattr(loader, "batch_sampler", None)
        for part in (getattr(loader, "sampler", None), batch_sampler,
                     getattr(batch_sampler, "sampler", None)):
            if part is not None and not _unheld_draws(part, held) and \
                    not _advances_own_fields(part):
                found.add(id(part))
    return found


# The methods that change a list, dict or set in place (``self.seen.append(i)``).
_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update",
                       "add", "discard", "setdefault", "popitem", "sort", "reverse"})


def _advances_own_fields(sampler: Any) -> bool:
    """Whether a sampler's ``__iter__`` (or a method of its class that it calls) sets or
    changes a field of its own (``self.epoch += 1``, seeding a generator made anew each
    epoch, as DistributedSampler's ``set_epoch`` does by hand): state that no checkpoint
    holds and batches() does not put back, so the order after a resume is another. True
    where its source cannot be read; False for torch's own samplers, which keep none."""
    kind = type(sampler)
    if kind.__module__.split(".")[0] == "torch":
        return False
    functions = {"__iter__": inspect.getattr_static(kind, "__iter__", None)}
    read: set[str] = set()
    while functions:
        name, function = functions.popitem()
        read.add(name)
        if not isinstance(function, types.FunctionType):
            return True
        if function.__module__.split(".")[0] == "torch":
            continue
        tree = _definition_of(function.__code__)
        if tree is None or not tree.args.args:
            return True
        this = tree.args.args[0].arg
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else \
                node.targets if isinstance(node, ast.Delete) else []
            if any(_rooted_at(target, this) and not isinstance(target, ast.Name)
                   for target in targets):
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Attribute) and _rooted_at(owner, this) and \
                        node.func.attr in _MUTATORS:
                    return True
                if isinstance(owner, ast.Name) and owner.id == this and \
                        node.func.attr not in read:
                    functions[node.func.attr] = inspect.getattr_static(
                        kind, node.func.attr, None)
    return False


def _rooted_at(node: ast.expr, name: str) -> bool:
    """Whether an expression is ``name``'s attribute or item, however deep
    (``self.epoch``, ``self.counts[i]``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id == name


# Why ckpt_nb's own object named to track (``--track mgr``) is skipped, and what to track.
_OWN_OBJECT = ("ckpt_nb's own, not training state: no checkpoint holds it, and a resume "
               "leaves it as it is; track what the run trains and changes instead (the "
               "model, the optimizer, the variables the cell updates)")


def _holds_fields(value: Any) -> bool:
    """Whether a value is an object of the user's own holding fields, loop state a save
    does not hold (an early stopper's ``best`` and ``bad``): an instance of a class the
    notebook or script defines, a SimpleNamespace or a dataclass, with attributes. A
    Dataset class of the notebook's is none: its data, made again by the rerun's code."""
    kind = type(value)
    return (kind.__module__ == "__main__" or kind is types.SimpleNamespace
            or dataclasses.is_dataclass(kind)) and not isinstance(
                value, torch.utils.data.Dataset) \
        and bool(getattr(value, "__dict__", None))


def _over_the_cap(size: int, cap: int, magic: bool) -> str:
    """Why a variable of ``size`` bytes is skipped, and the setting that takes it (its
    size in MiB, rounded up), in the words of the front end that made the session: "just
    over" where its size, as shown, is the cap's (100.0 MiB over a 100 MiB cap)."""
    unit = binary_unit(size)[0]
    just = "just " if round(size / unit, 1) <= cap / unit else ""
    mib = -(-size // 2**20)
    setting = f"%config CkptMagics.max_variable_mb = {mib}" if magic \
        else f"max_variable_bytes={mib} << 20"
    return f"{_amount(size)}, {just}over the {_amount(cap)} cap: {setting} takes it"


def _amount(size: int) -> str:
    """``size`` bytes as ``human_size`` shows them, but a whole number of its unit without
    the decimal, in words for bytes (a cap reads as it was set): 2.4 MiB, 100 MiB,
    512 KiB, 3 bytes."""
    unit, name = binary_unit(size)
    if size % unit:
        return human_size(size)
    return f"{size // unit:,} {'bytes' if unit == 1 else name}"


def _on_meta(module: torch.nn.Module) -> bool:
    """Whether a module has a parameter or buffer on the meta device (built without
    memory, to be materialized): a save of it would fail mid-cell."""
    return any(t.is_meta for t in module.parameters()) or any(t.is_meta for t in module.buffers())


def _drop_contained_modules(statefuls: dict[str, Any]) -> None:
    """Track each module once: a part of another module goes, and so does a wrapper
    (torch.compile, DataParallel) whose parameters are exactly the wrapped module's."""
    modules = {n: m for n, m in statefuls.items() if isinstance(m, torch.nn.Module)}
    params = {n: {id(p) for p in m.parameters()} for n, m in modules.items()}
    for name, module in modules.items():
        for other_name, other in modules.items():
            if other is module or other_name not in statefuls or name not in statefuls:
                continue
            if any(sub is module for sub in other.modules()):
                wrapper = params[name] == params[other_name]
                del statefuls[other_name if wrapper else name]


class GeneratorState(capture.GeneratorState):
    """A notebook's ``torch.Generator`` as a Stateful. It saves its state under "state" (as
    a ckpt_nb before keyword generators did), and reads that or a keyword's ("torch")."""

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.generator.get_state()}


class RandomState(capture.GeneratorState):
    """A notebook's NumPy ``Generator`` / ``RandomState`` or ``random.Random`` as a
    Stateful: its state as JSON text (NumPy's holds 128-bit integers and arrays; a loader's
    generators are saved as that text in a tensor), read back as that or as a keyword's."""

    @property
    def rng(self) -> np.random.Generator | np.random.RandomState | random.Random:
        return self.generator  # type: ignore[return-value]

    def state_dict(self) -> dict[str, Any]:
        if isinstance(self.rng, random.Random):
            return {"python": json.dumps(self.rng.getstate())}
        rng = self.rng
        state = rng.bit_generator.state if isinstance(rng, np.random.Generator) \
            else rng.get_state(legacy=False)
        return {"numpy": json.dumps(state, default=array_to_json)}


# -- plain variables as storable values ---------------------------------------------


def to_storable(value: Any) -> Any:
    """A variable as JSON-and-tensor data; DataFrames become their columns."""
    if _is_frame(value):
        import pandas as pd

        frame = value.to_frame() if isinstance(value, pd.Series) else value
        return {"__frame__": "series" if isinstance(value, pd.Series) else "frame",
                "name": None if not isinstance(value, pd.Series) else _plain(value.name),
                "columns": [_plain(c) for c in frame.columns],
                "dtypes": [str(t) for t in frame.dtypes],
                "data": [_column(frame.iloc[:, i], times_as_ints=True)
                         for i in range(frame.shape[1])],
                "index": _column(frame.index.to_series()),
                "index_name": _label(frame.index.name), "columns_name": _label(frame.columns.name)}
    if isinstance(value, torch.Tensor):  # (a leaf keeps requires_grad and its Parameter type)
        return value if value.is_leaf else value.detach()
    if type(value) in (list, tuple):
        return type(value)(to_storable(v) for v in value)
    if isinstance(value, dict):
        return _like(value, {k: to_storable(v) for k, v in value.items()})
    return value


def _like(original: dict[Any, Any], items: dict[Any, Any]) -> dict[Any, Any]:
    """``items`` as a dict of ``original``'s type, where that is one the store keeps."""
    if type(original) is defaultdict:
        return defaultdict(original.default_factory, items)
    if type(original) in _DICT_KINDS:
        return type(original)(items)
    return items


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _label(name: Any) -> str | int | None:
    """An index's or a column axis's name where it is a plain label (most are: a
    pickled one would leave the whole frame out of checkpoints), else None."""
    name = _plain(name)
    return name if type(name) in (str, int) else None


def _column(series: Any, *, times_as_ints: bool = False) -> Any:
    """A column's values: an array where NumPy holds them, else a list. Naive times,
    with ``times_as_ints``, go as their int64 ticks, which the column's recorded dtype
    reads back exactly (a list of a million datetimes took seconds each way); times with
    a zone go as their UTC ticks, which the recorded dtype reads back in its zone."""
    if times_as_ints and getattr(series.dtype, "tz", None) is not None:
        return series.array.asi8
    array = series.to_numpy()
    if array.dtype.kind in "biufc":
        return array
    if times_as_ints and array.dtype.kind in "mM":
        return array.view(np.int64)
    return [_plain(v) for v in array.tolist()]


def from_storable(value: Any) -> Any:
    if isinstance(value, dict) and "__frame__" in value:
        import pandas as pd

        columns = {i: pd.Series(col) for i, col in enumerate(value["data"])}
        frame = pd.DataFrame(columns)
        frame.columns = value["columns"]
        frame.index = pd.Index(value["index"], name=value.get("index_name"))
        frame = frame.astype(dict(zip(value["columns"], _column_dtypes(value["dtypes"]))))
        frame.columns.name = value.get("columns_name")
        if value["__frame__"] == "series":
            series = frame.iloc[:, 0]
            series.name = value["name"]
            return series
        return frame
    if isinstance(value, list):
        return [from_storable(v) for v in value]
    if type(value) is tuple:  # (not a torch.Size, which holds ints only)
        return tuple(from_storable(v) for v in value)
    if isinstance(value, dict):
        return _like(value, {k: from_storable(v) for k, v in value.items()})
    return value


def _column_dtypes(names: list[Any]) -> list[Any]:
    """A stored frame's column dtypes, refused where an item would be over 16 bytes: no
    frame's is, and the names come from the store ("V500000000" made 4 rows take 2 GB)."""
    import pandas as pd

    for name in names:
        dtype = pd.api.types.pandas_dtype(name)
        for part in (dtype, getattr(dtype, "subtype", None)):  # (Sparse[...], interval[...])
            if isinstance(part, np.dtype) and part.itemsize > 16:
                raise CorruptCheckpointError(f"a column of dtype {str(name)[:40]!r}, which no "
                                             "frame has: the checkpoint is damaged")
    return names


def assign_in_place(namespace: dict[str, Any], name: str, saved: Any,
                    refillable: AbstractSet[int] = frozenset(),
                    tracked: AbstractSet[int] = frozenset()) -> None:
    """Put a saved variable back (``_put_back``). A list or dict is refilled in place only
    where it is one the save took as a variable (``refillable``'s ids), so what else holds
    it (a logger, ``state = {"history": history}``) holds it still; any other is made
    anew: a batch of a data set left in a variable (``for batch in data``, ``batch =
    ds.items[i]``) is one of its items, which a refill would write into. A part of a
    tracked object (``tracked``, ``parts_of``: ``buf = model.bn.running_mean``, ``groups =
    opt.param_groups``) is left as it is: its object's load put it back, or kept it."""
    namespace[name] = _put_back(namespace.get(name), saved, refillable, tracked)


def saved_ids(variables: Mapping[str, Any]) -> dict[str, int]:
    """The ids of the lists and dicts a save takes, by name (``refillable``)."""
    return {name: id(value) for name, value in variables.items()
            if isinstance(value, (list, dict))}


def refillable(namespace: Mapping[str, Any], taken: Mapping[str, int]) -> set[int]:
    """The ids of the lists and dicts that variables hold now that a save took under the
    same names (``taken``, its ``saved_ids``, where this process made it): those a resume
    or rollback to it refills in place (``assign_in_place``)."""
    return {id(namespace[name]) for name, was in taken.items()
            if name in namespace and id(namespace[name]) == was}


def parts_of(objects: Iterable[Any]) -> set[int]:
    """The ids of the parameters and buffers of these objects' modules, and of their
    optimizers' ``param_groups`` list, its dicts and ``state`` dict (``_load_optimizer``
    keeps them)."""
    found: set[int] = set()
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            found.update(map(id, (*obj.parameters(), *obj.buffers())))
        elif isinstance(obj, torch.optim.Optimizer):
            groups = getattr(obj, "param_groups", None)
            found.update(map(id, (groups, getattr(obj, "state", None))))
            found.update(map(id, groups if isinstance(groups, list) else ()))
            found.discard(id(None))
    return found


def _put_back(live: Any, saved: Any, refillable: AbstractSet[int] = frozenset(),
              tracked: AbstractSet[int] = frozenset()) -> Any:
    """``saved``, with the live tensors that train kept and given the saved values, down
    into lists, dicts and tuples: a tensor there may be one an optimizer trains (a
    ``torch.func`` dict of parameters), which a new tensor would leave untrained. A live
    list or dict is refilled only where ``refillable`` (ids: one the save took as a
    variable), else made anew; a part of a tracked object (``tracked``) is left as it is.

    Only such a tensor (a leaf that requires grad, or a Parameter) takes the saved
    values in place; any other tensor or array is replaced: it may be a batch the loop
    left in a variable, a view of the data set or one of its items (``xb = X[s:s + 64]``,
    ``for x, y in data``), and copying the saved batch into it wrote over the data."""
    if id(live) in tracked:
        return live  # (a tracked module's buffer, an optimizer's groups: their load's)
    if isinstance(live, list) and isinstance(saved, list):
        items = [_put_back(old, new, refillable, tracked)
                 for old, new in zip(live, saved)] + saved[len(live):]
        if id(live) not in refillable:
            return items
        live[:] = items
        return live
    if isinstance(live, dict) and type(saved) is type(live):  # (defaultdicts too)
        items = {k: _put_back(live[k], v, refillable, tracked) if k in live else v
                 for k, v in saved.items()}
        if id(live) not in refillable:
            fresh = saved.copy()  # (its type: a defaultdict's default_factory kept)
            fresh.update(items)
            return fresh
        live.clear()
        live.update(items)
        return live
    if type(live) is tuple and type(saved) is tuple:
        return tuple(_put_back(old, new, refillable, tracked)
                     for old, new in zip(live, saved)) + saved[len(live):]
    if isinstance(live, torch.Tensor) and isinstance(saved, torch.Tensor) \
            and live.shape == saved.shape and live.dtype == saved.dtype and live.is_leaf \
            and (live.requires_grad or isinstance(live, torch.nn.Parameter)):
        try:
            with torch.no_grad():  # (a leaf an optimizer trains stays that optimizer's)
                live.copy_(saved)
        except RuntimeError:  # (an inference tensor, an expanded or sparse one: replaced)
            return saved
        return live
    return saved
