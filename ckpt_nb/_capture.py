"""Turning live objects into checkpoint state and back.

State is a tree of dicts, lists and scalars with tensors at the leaves (what
``state_dict()`` returns). ``flatten`` splits it into a JSON skeleton and the
raw bytes of each distinct tensor storage, so tensors that share memory (tied
weights, views) are stored once and come back sharing it. Common value types
(NumPy's, sets, bytes, paths, dates: ``_stdlib_values``) are stored as JSON as
well; the rest are pickled, and unpickled only on explicit trust.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import inspect
import json
import math
import numbers
import pickle
import random
import signal
import sys
import threading
import warnings
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.nn.parameter import UninitializedTensorMixin

from . import _stdlib_values as stdlib_values
from ._errors import (CaptureError, CorruptCheckpointError, ParameterOrderError,
                      StateMismatchError, StoreFormatError, UntrustedPickleError, warn)


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict()``: modules,
    optimizers, schedulers, GradScalers and user objects alike."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


_MT_STATE_BYTES = 624 * 4 + 4  # NumPy's mt19937_state: uint32_t key[624]; int pos
_numpy_last: tuple[bytes, bytes, tuple[Any, ...] | dict[str, Any]] | None = None
# The global RandomState, its MT19937, and views of their structs' bytes (the MT19937's
# state, the RandomState's _AugState): ``.raw`` reads one in ~0.1 us, string_at in ~1.
_numpy_views: tuple[Any, Any, Any, Any] | None = None


class _AugState(ctypes.Structure):
    """NumPy's aug_bitgen_t, in a RandomState after its bitgen_t: where the legacy
    Gaussian cache (has_gauss, gauss) lives, outside the bit generator's own struct."""

    _fields_ = [("bit_generator", ctypes.c_void_p), ("has_gauss", ctypes.c_int),
                ("gauss", ctypes.c_double)]


@functools.cache
def _aug_state_offset() -> int | None:
    """Where a RandomState's ``_AugState`` lies from the object's start, or None where
    the raw reads do not give what ``set_state()`` set (another NumPy's layout): found by
    pointers in a RandomState of its own (its bitgen_t holds the MT19937 struct's address,
    its aug_bitgen_t that bitgen_t's), and checked there."""
    probe = np.random.RandomState(np.random.MT19937(0))
    try:
        state_address = probe._bit_generator.ctypes.state_address
        base, size = id(probe), type(probe).__basicsize__
        words = np.frombuffer(ctypes.string_at(base, size - size % np.dtype(np.uintp).itemsize),
                              np.uintp)
    except (AttributeError, TypeError, ValueError):
        return None
    bitgen = np.flatnonzero(words == state_address)
    if len(bitgen) != 1:
        return None
    aug = np.flatnonzero(words == base + int(bitgen[0]) * words.itemsize)
    if len(aug) != 1:
        return None
    offset = int(aug[0]) * words.itemsize
    key = probe._bit_generator.state["state"]["key"]
    for has_gauss, gauss in ((1, 0.125), (0, -2.5)):
        probe.set_state(("MT19937", key, 17, has_gauss, gauss))
        raw = ctypes.string_at(state_address, _MT_STATE_BYTES)
        fields = _AugState.from_address(base + offset)
        if not (np.array_equal(np.frombuffer(raw[:-4], np.uint32), key)
                and int.from_bytes(raw[-4:], sys.byteorder, signed=True) == 17
                and (fields.has_gauss, fields.gauss) == (has_gauss, gauss)):
            return None
    return offset


def _numpy_state() -> tuple[Any, ...] | dict[str, Any]:
    """NumPy's global generator's state: an MT19937's as ``np.random.get_state()``'s
    legacy tuple, another bit generator's (``np.random.set_bit_generator(PCG64())``) as
    ``get_state(legacy=False)``'s dict. An MT19937's is cached: ``get_state`` copies its
    key element by element (~50 us, most of a small training step's budget), while a raw
    read of its struct and of the cached Gaussian (~1 us) tells whether anything changed
    since the last copy. The bit generator's type is checked every call, so that no
    struct is read as an MT19937's that is not one."""
    global _numpy_last, _numpy_views
    # (the RandomState np.random's functions and get_state() draw from and read: bound at
    # NumPy's import, it stays so where a user rebinds np.random.mtrand._rand)
    rand = np.random.get_state.__self__
    bit_generator = rand._bit_generator
    if type(bit_generator) is not np.random.MT19937:
        return np.random.get_state(legacy=False)  # (a few us: PCG64's is two ints)
    views = _numpy_views
    if views is None or views[0] is not rand or views[1] is not bit_generator:
        offset = _aug_state_offset()
        if offset is None or type(rand) is not np.random.RandomState:
            return np.random.get_state()
        # (holding both objects keeps the memory viewed alive)
        views = _numpy_views = (
            rand, bit_generator,
            (ctypes.c_char * _MT_STATE_BYTES).from_address(bit_generator.ctypes.state_address),
            (ctypes.c_char * ctypes.sizeof(_AugState)).from_address(id(rand) + offset))
    raw, aug = views[2].raw, views[3].raw
    last = _numpy_last
    if last is not None and last[0] == raw and last[1] == aug:
        return last[2]
    state = np.random.get_state()
    _numpy_last = (raw, aug, state)
    return state


# CPython's RandomObject after its object header: int index; uint32_t state[624]
_PY_STATE_BYTES = 4 + 624 * 4
_python_last: tuple[bytes, Any, tuple[Any, ...]] | None = None
_python_raw_ok: bool | None = None


def _python_state() -> tuple[Any, ...]:
    """``random.getstate()``, cached the same way: it builds a 625-int tuple (~10 us)
    while a raw read of the generator's C struct (~1 us) says whether it moved. The
    raw layout is checked against ``getstate()`` once; where it differs (another
    Python build), every call is a plain ``getstate()``."""
    global _python_last, _python_raw_ok
    inst = random._inst  # type: ignore[attr-defined]
    if _python_raw_ok is False or type(inst) is not random.Random:
        return random.getstate()
    raw = ctypes.string_at(id(inst) + object.__basicsize__, _PY_STATE_BYTES)
    gauss = inst.gauss_next
    last = _python_last
    if last is not None and last[0] == raw and last[1] == gauss:
        return last[2]
    state = random.getstate()
    if _python_raw_ok is None:
        internal = state[1]
        _python_raw_ok = (int.from_bytes(raw[:4], sys.byteorder, signed=True) == internal[-1]
                          and np.array_equal(np.frombuffer(raw[4:], np.uint32),
                                             np.array(internal[:-1], dtype=np.uint32)))
    _python_last = (raw, gauss, state) if _python_raw_ok else None
    return state


class RNGState:
    """The random number generators a training loop draws from, as a Stateful:
    Python's ``random``, NumPy's global state, torch's CPU and CUDA generators."""

    @staticmethod
    def snapshot() -> tuple[Any, ...]:
        """The generators' states as they come, for hot paths; ``state_dict`` of it later."""
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return _python_state(), _numpy_state(), torch.get_rng_state(), cuda

    def state_dict(self, snapshot: tuple[Any, ...] | None = None) -> dict[str, Any]:
        python, numpy, cpu, cuda = snapshot or self.snapshot()
        version, internal, gauss = python
        state: dict[str, Any] = {
            "python": {"version": version, "state": list(internal), "gauss": gauss}}
        if isinstance(numpy, dict):  # (not an MT19937: under a key a reader before it lacks)
            state[NUMPY_BIT_GENERATOR] = _with_tensors(numpy)
        else:
            kind, keys, pos, has_gauss, cached = numpy
            state["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.copy()),
                              "pos": int(pos), "has_gauss": int(has_gauss),
                              "cached": float(cached)}
        state["torch"] = cpu
        if cuda is not None:
            state["cuda"] = cuda
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        py = state["python"]
        random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
        npy = state.get("numpy")
        if npy is None:
            saved = state[NUMPY_BIT_GENERATOR]
            _use_bit_generator(saved["bit_generator"])
            np.random.set_state(_with_arrays(saved))
        else:
            _use_bit_generator("MT19937")
            np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32),
                                 npy["pos"], npy["has_gauss"], npy["cached"]))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            saved = state["cuda"][: torch.cuda.device_count()]
            torch.cuda.set_rng_state_all(saved)


# Where RNGState keeps NumPy's global generator's state when its bit generator is not an
# MT19937 (whose is under "numpy", as before there were others): get_state(legacy=False)'s
# dict, its arrays as tensors. A manifest holding one is of format 5 (``_Flattener``).
NUMPY_BIT_GENERATOR = "numpy_bit_generator"
_NUMPY_BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")


def _with_tensors(value: Any) -> Any:
    """A NumPy generator's state with its arrays (Philox's counter, SFC64's words) as
    tensors, which a checkpoint stores as bytes and an export as tensors, never pickled."""
    if isinstance(value, dict):
        return {key: _with_tensors(v) for key, v in value.items()}
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    return value.item() if isinstance(value, np.generic) else value


def _with_arrays(value: Any) -> Any:
    """``_with_tensors`` undone: the state as its bit generator's ``state`` setter takes it."""
    if isinstance(value, Mapping):
        return {key: _with_arrays(v) for key, v in value.items()}
    return value.numpy() if isinstance(value, torch.Tensor) else value


def _use_bit_generator(name: Any) -> None:
    """Give NumPy's global generator a bit generator of kind ``name`` where its own is of
    another (``set_state`` takes only its own kind's state): a new one, set right after."""
    if type(np.random.mtrand._rand._bit_generator).__name__ == name:
        return
    if name not in _NUMPY_BIT_GENERATORS:
        raise CaptureError(
            f"NumPy's global generator was saved with a {str(name)[:40]!r} bit generator, "
            f"not one of NumPy's ({', '.join(_NUMPY_BIT_GENERATORS)}): set one of its kind "
            "with np.random.set_bit_generator() before the restore, or restore with rng=False")
    if not hasattr(np.random, "set_bit_generator"):
        raise CaptureError(
            f"NumPy's global generator was saved with a {name} bit generator, which this "
            f"NumPy ({np.__version__}) cannot set (np.random.set_bit_generator came in NumPy "
            "1.25): upgrade NumPy, or restore with rng=False")
    np.random.set_bit_generator(getattr(np.random, name)())


AnyGenerator = torch.Generator | np.random.Generator | np.random.RandomState | random.Random


_SYSTEM_RANDOM = ("a random.SystemRandom has no state to save or restore (it draws from the "
                  "operating system): use a random.Random")


class GeneratorState:
    """A generator of its own passed by keyword (a DataLoader's ``generator=``, a NumPy
    ``Generator`` or ``RandomState``, a ``random.Random``) as a Stateful: its state is
    saved, and restored into it in place, so the next epoch shuffles as an uninterrupted
    run would (taken through ``extra=``, it came back a new object that the DataLoader
    does not use). It reads the state the notebook's generators are saved with too
    (``_discovery``'s: torch's under "state", NumPy's and Python's as JSON text), so a
    checkpoint of either restores into the other's."""

    KINDS = {"torch": "torch.Generator", "numpy": "NumPy generator",
             "python": "random.Random"}

    def __init__(self, generator: AnyGenerator) -> None:
        self.generator = generator

    @staticmethod
    def wraps(obj: object) -> bool:
        return isinstance(obj, (torch.Generator, np.random.Generator, np.random.RandomState,
                                random.Random))

    def _kind(self) -> str:
        return "torch" if isinstance(self.generator, torch.Generator) else \
            "python" if isinstance(self.generator, random.Random) else "numpy"

    def state_dict(self) -> dict[str, Any]:
        g = self.generator
        if isinstance(g, random.SystemRandom):
            raise CaptureError(_SYSTEM_RANDOM)
        if isinstance(g, torch.Generator):
            return {"torch": g.get_state()}
        if isinstance(g, np.random.Generator):
            return {"numpy": g.bit_generator.state}
        if isinstance(g, np.random.RandomState):
            return {"numpy": g.get_state(legacy=False)}
        return {"python": g.getstate()}

    def _saved(self, state: Any) -> Any:
        """This kind's state in ``state``, in either format, or None."""
        if not isinstance(state, Mapping):
            return None
        kind = self._kind()
        found = state.get("state") if kind == "torch" and "torch" not in state \
            else state.get(kind)
        if isinstance(found, str):  # (_discovery's JSON text)
            try:
                found = json.loads(found, object_hook=json_to_array)
            except json.JSONDecodeError:
                return None
            if kind == "python" and isinstance(found, list) and len(found) == 3:
                found = (found[0], tuple(found[1]), found[2])
        return found

    def problem(self, state: Any) -> str | None:
        """Why ``state`` is not this kind of generator's, or None (``load_all`` asks
        before it loads anything)."""
        kind, found = self._kind(), self._saved(state)
        if isinstance(self.generator, random.SystemRandom):
            return _SYSTEM_RANDOM
        if kind == "numpy" and isinstance(found, Mapping):
            g = self.generator
            live = g.bit_generator.state if isinstance(g, np.random.Generator) \
                else g.get_state(legacy=False)
            if found.get("bit_generator") != live["bit_generator"]:
                return (f"the checkpoint holds a NumPy {found.get('bit_generator')} state "
                        f"here, not a {live['bit_generator']}'s: restore it into a generator "
                        "of that bit generator")
            return None
        if found is not None and (kind != "torch" or isinstance(found, torch.Tensor)):
            return None
        saved = next((f"a {self.KINDS[k]}'s state" for k in self.KINDS
                      if isinstance(state, Mapping) and k in state), "no generator's state")
        return (f"the checkpoint holds {saved} here, not a {self.KINDS[kind]}'s: restore it "
                "into the kind of generator it was saved from")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        problem = self.problem(state)
        if problem is not None:
            raise StateMismatchError(problem)
        g, found = self.generator, self._saved(state)
        if isinstance(g, torch.Generator):
            g.set_state(found)
        elif isinstance(g, np.random.Generator):
            g.bit_generator.state = found
        elif isinstance(g, np.random.RandomState):
            g.set_state(found)
        else:
            g.setstate(found)


def array_to_json(value: Any) -> Any:
    """``json.dumps``'s ``default`` for a NumPy generator's state (arrays, NumPy ints)."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} in a NumPy generator's state")


# The dtypes of the arrays in NumPy's bit generators' states (MT19937's key is uint32;
# Philox's and SFC64's words are uint64): all ``array_to_json`` is given.
_GENERATOR_DTYPES = ("uint32", "uint64")


def json_to_array(record: dict[str, Any]) -> Any:
    """``json.loads``'s ``object_hook`` undoing ``array_to_json``. The text is the store's:
    an array of another dtype is refused, as one such as "U500000000" asks for GBs."""
    if set(record) != {"__ndarray__", "dtype"}:
        return record
    values, dtype = record["__ndarray__"], record["dtype"]
    if dtype not in _GENERATOR_DTYPES or not isinstance(values, list):
        raise CorruptCheckpointError(
            f"a generator's saved state holds an array of dtype {str(dtype)[:40]!r}, not of "
            f"{' or '.join(_GENERATOR_DTYPES)} as NumPy's generators do: the checkpoint is "
            "damaged or was not written by ckpt_nb; restore another one")
    try:
        return np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise CorruptCheckpointError(f"a generator's saved state holds a {dtype} array that "
                                     f"does not read ({exc}): the checkpoint is damaged; "
                                     "restore another one") from exc


def generator_state_problem(kind: str, state: Any) -> str | None:
    """Why the state a manifest holds for a generator of ``kind`` does not read, or None:
    ``load`` asks, so that ``restore('latest')`` passes over such a checkpoint rather than
    refuse it at the generator (text that is no JSON is the restore's mismatch to tell)."""
    module, _, name = kind.rpartition(".")
    if not module.startswith("ckpt_nb.") or name not in ("GeneratorState", "RandomState") \
            or not isinstance(state, Mapping):
        return None
    for text in state.values():
        if isinstance(text, str):
            try:
                json.loads(text, object_hook=json_to_array)
            except CorruptCheckpointError as exc:
                return str(exc)
            except RecursionError:
                return "its saved state is text nested too deep to read"
            except json.JSONDecodeError:
                pass
    return None


def as_stateful(obj: Any) -> Any:
    """What a keyword's object is saved and restored through: the module a wrapper runs
    (``unwrap``), the optimizer or scheduler accelerate's wrapper drives
    (``unwrap_state``), a generator's ``GeneratorState``, else the object itself."""
    return GeneratorState(obj) if GeneratorState.wraps(obj) else unwrap_state(unwrap(obj))


# Wrappers whose state_dict() and load_state_dict() are those of the object they hold
# (accelerate's, from accelerator.prepare(): on a CPU or GPU they pass both straight on),
# by class, and the attribute that holds it. Saved and restored through what they hold,
# a checkpoint records the optimizer's own class (AdamW), and moves between a prepared
# optimizer and a plain one, either way, as a compiled model's does.
_STATE_WRAPPERS = {"accelerate.optimizer.AcceleratedOptimizer": "optimizer",
                   "accelerate.scheduler.AcceleratedScheduler": "scheduler"}


def _state_wrapper_attr(kind: type) -> str | None:
    return next((_STATE_WRAPPERS[name] for c in kind.__mro__
                 if (name := f"{c.__module__}.{c.__qualname__}") in _STATE_WRAPPERS), None)


def unwrap_state(obj: Any) -> Any:
    """The optimizer or LR scheduler an accelerate wrapper holds (``obj`` for any other)."""
    attr = _state_wrapper_attr(type(obj))
    inner = getattr(obj, attr, None) if attr is not None else None
    return inner if callable(getattr(inner, "state_dict", None)) \
        and callable(getattr(inner, "load_state_dict", None)) else obj


def rng_put_back() -> Callable[[], None]:
    """What sets the generators back as they are now, NumPy's global bit generator as the
    very object the notebook set (a load of another kind's state replaces it)."""
    state, bit_generator = RNGState().state_dict(), np.random.mtrand._rand._bit_generator

    def put_back() -> None:
        if np.random.mtrand._rand._bit_generator is not bit_generator:
            np.random.set_bit_generator(bit_generator)
        RNGState().load_state_dict(state)
    return put_back


def rng_problem(state: Any) -> str | None:
    """Why ``RNGState().load_state_dict(state)`` would fail, or None: tried, and the
    generators put back as they were either way."""
    put_back = rng_put_back()
    try:
        cuda = state.get("cuda")
        if cuda is not None and not (isinstance(cuda, (list, tuple)) and all(
                isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda)):
            return "its cuda entry is not a list of generator states"
        # (tried without CUDA's: setting those would start CUDA, which before did not say)
        RNGState().load_state_dict({k: v for k, v in state.items() if k != "cuda"})
    except Exception as exc:  # noqa: BLE001 - whatever a malformed state makes torch raise
        return f"{type(exc).__name__}: {exc}"
    finally:
        put_back()
    return None


@dataclass
class TensorRecord:
    """A tensor as a view (offset, shape, stride, dtype) of a stored storage, with
    torch's lazy conjugate and negative bits (``x.conj()``, ``x.conj().imag``): its
    bytes are the unconjugated, unnegated values. A tensor in plain state (not a
    state dict's, which are detached) may be an ``nn.Parameter`` or want grads."""

    name: str
    storage: int
    offset: int
    shape: list[int]
    stride: list[int]
    dtype: str
    conj: bool = False
    neg: bool = False
    requires_grad: bool = False
    parameter: bool = False

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not False}


@dataclass
class StorageBytes:
    """The raw bytes of one storage (or pickle), as a flat uint8 array."""

    name: str
    data: np.ndarray
    itemsize: int
    device: str
    kind: str = "tensor"  # or "pickle"
    trains: bool = False  # backs a trained parameter or its optimizer state: changes every step


@dataclass
class FlatState:
    """A state tree split into a JSON skeleton and raw byte buffers."""

    skeleton: dict[str, Any]
    tensors: list[TensorRecord] = field(default_factory=list)
    storages: list[StorageBytes] = field(default_factory=list)
    format: int = 3  # the manifest format its skeleton needs (_format.MANIFEST_FORMAT)
    metrics: dict[str, float] = field(default_factory=dict)  # capture()'s, for save_state

    @property
    def logical_bytes(self) -> int:
        return sum(s.data.nbytes for s in self.storages)


_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values()
           if isinstance(d, torch.dtype)}
_DTYPE_NAMES = {d: name for name, d in _DTYPES.items()}


def dtype_from_name(name: str) -> torch.dtype:
    """The dtype a manifest names; one this torch lacks (a newer torch's) is the
    checkpoint's format, not damage: ``restore("latest")`` passes over it, and ``load``
    names the dtype. (``verify()`` checks stored bytes, not dtypes: it reports such a
    checkpoint checked, as its bytes are sound.)"""
    try:
        return _DTYPES[name]
    except KeyError:
        raise StoreFormatError(
            f"this torch ({torch.__version__}) has no dtype {name!r}: "
            "restore with the torch version that wrote the checkpoint, or a newer one"
        ) from None


def storage_bytes(storage: torch.UntypedStorage) -> np.ndarray:
    """A zero-copy uint8 view of a CPU storage."""
    flat = torch.empty(0, dtype=torch.uint8).set_(storage)
    return flat.numpy()


class SnapshotBuffers:
    """Reused memory for snapshots taken while training goes on.

    Two sets alternate, so one can be written out while the next is taken;
    copying into memory already mapped runs 2-3x faster than into fresh pages.
    The caller must not start a set again before the write that used it ended.
    """

    def __init__(self) -> None:
        self._sets: list[dict[tuple[str, int], torch.Tensor]] = [{}, {}]
        self._turn = 0
        self._used: dict[tuple[str, int], torch.Tensor] = {}

    def start(self) -> None:
        """Begin a snapshot in the other set; buffers the last one did not use go."""
        self._sets[self._turn] = self._used
        self._turn ^= 1
        self._used = {}

    def copy(self, name: str, storage: torch.UntypedStorage) -> torch.UntypedStorage:
        key = (name, storage.nbytes())
        buffer = self._sets[self._turn].get(key)
        if buffer is None:
            buffer = torch.empty(storage.nbytes(), dtype=torch.uint8)
        self._used[key] = buffer
        source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        buffer.copy_(source)
        return buffer.untyped_storage()


class _Flattener:
    def __init__(self, copy_tensors: bool | SnapshotBuffers,
                 trained: set[tuple[str, int]]) -> None:
        self.flat = FlatState(skeleton={})
        self._by_ptr: dict[tuple[str, int, int], int] = {}
        # The storages met so far, held: a temporary one (a list of floats made a tensor,
        # a copied array) freed before the walk ends would leave its address to the next,
        # which the lookup above would take for the same storage.
        self._held: list[torch.UntypedStorage] = []
        self._copy = copy_tensors
        self._trained = trained
        self._open: set[int] = set()  # ids of the containers on the path being encoded
        self.subclassed: list[str] = []  # tensors of a subclass, stored as plain tensors

    def encode(self, value: Any, name: str) -> Any:
        """A value as JSON that names its tensors' records (and pickles, if it must)."""
        if not isinstance(value, _CONTAINERS):
            return self._encode(value, name)
        # A tree of values: a container met again on its own path would recurse forever,
        # and one nested past the interpreter's stack would fail to decode as well.
        if id(value) in self._open:
            raise CaptureError(f"{name} contains itself (a reference cycle): a checkpoint "
                               "holds trees of values; save a copy without the cycle")
        if len(self._open) >= MAX_NESTING:
            raise CaptureError(f"{name} is nested more than {MAX_NESTING} containers deep: "
                               "save it flatter, or as bytes")
        self._open.add(id(value))
        try:
            return self._encode(value, name)
        finally:
            self._open.discard(id(value))

    def tensor(self, t: torch.Tensor, name: str, *, requires_grad: bool = False,
               parameter: bool = False) -> dict[str, Any]:
        if t.is_quantized and t.dtype in _QUANTIZED and t.qscheme() in _QSCHEMES:
            return self.quantized(t, name)
        if t.layout in _SPARSE:
            return self.sparse(t, name)
        if t.is_nested and (parts := _nested_parts(t)) is not None:
            self.flat.format = max(self.flat.format, 4)  # (a format-3 reader would misread it)
            node = {"__nested__": str(t.layout).removeprefix("torch."),
                    "requires_grad": requires_grad,
                    "parts": [self.tensor(p, f"{name}/{i}") for i, p in enumerate(parts)]}
            if not parts:  # (its dtype, which no part carries)
                node["dtype"] = _DTYPE_NAMES[t.dtype]
            return node
        if t.layout == torch._mkldnn:  # (torch cannot pickle one either)
            raise CaptureError(f"{name} is an MKL-DNN tensor, which torch cannot save: save "
                               "its .to_dense() (and .to_mkldnn() it again after a restore)")
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            return self.pickled(t, name)
        device = _device_name(t.device)
        if device == "meta":
            raise CaptureError(f"{name} is on the meta device and holds no data to save: give "
                               "it memory first (a module's .to_empty(device='cpu'), then "
                               "load or initialise its weights), or leave it out of the save")
        storage = t.untyped_storage()
        address = storage.data_ptr()
        key = (device, address, storage.nbytes())
        index = self._by_ptr.get(key)
        if index is None:
            if isinstance(self._copy, SnapshotBuffers):
                cpu = self._copy.copy(name, storage)
            elif device != "cpu":
                cpu = storage.cpu()
            else:
                cpu = storage.clone() if self._copy else storage
            index = len(self.flat.storages)
            self.flat.storages.append(
                StorageBytes(name, storage_bytes(cpu), t.element_size(), device,
                             trains=(device, address) in self._trained)
            )
            self._by_ptr[key] = index
            self._held.append(storage)
        record = TensorRecord(name, index, t.storage_offset(), list(t.shape),
                              list(t.stride()), _DTYPE_NAMES[t.dtype], t.is_conj(), t.is_neg(),
                              requires_grad, parameter)
        self.flat.tensors.append(record)
        return {"__tensor__": len(self.flat.tensors) - 1}

    def quantized(self, t: torch.Tensor, name: str) -> dict[str, Any]:
        """A quantized tensor as its integers (``int_repr``, a copy: views of one
        quantized storage come back apart) and its scale and zero point, or a
        channel's each: raw bytes and JSON, where a pickle would need trust."""
        scheme = t.qscheme()
        node = {"__quantized__": self.tensor(t.int_repr(), name)["__tensor__"],
                "qscheme": _QSCHEMES[scheme]}
        if scheme is torch.per_tensor_affine:
            node.update(scale=self.encode(t.q_scale(), name), zero_point=t.q_zero_point())
        else:
            node.update(scales=self.tensor(t.q_per_channel_scales(), f"{name}/scales"),
                        zero_points=self.tensor(t.q_per_channel_zero_points(),
                                                f"{name}/zero_points"),
                        axis=t.q_per_channel_axis())
        return node

    def sparse(self, t: torch.Tensor, name: str) -> dict[str, Any]:
        """A sparse tensor as its index and value tensors (as they are: an
        uncoalesced COO tensor stays uncoalesced)."""
        if t.layout is torch.sparse_coo:
            parts = {"indices": t._indices(), "values": t._values()}
        else:
            compressed, plain = _COMPRESSED_INDICES[t.layout]
            parts = {"compressed_indices": getattr(t, compressed)(),
                     "plain_indices": getattr(t, plain)(), "values": t.values()}
        node: dict[str, Any] = {"__sparse__": str(t.layout).removeprefix("torch."),
                                "size": list(t.shape)}
        if t.layout is torch.sparse_coo:
            node["coalesced"] = t.is_coalesced()
        node.update({key: self.tensor(part, f"{name}/{key}") for key, part in parts.items()})
        return node

    def pickled(self, value: Any, name: str) -> dict[str, Any]:
        try:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise CaptureError(  # (the pickle's error, said here, is all its cause holds)
                f"{name} ({type(value).__name__}) cannot be saved: it is neither JSON, "
                f"a tensor nor picklable ({exc}); leave it out of the save, or save the "
                "data it holds (for a function, the settings that make it)"
            ) from None
        self.flat.storages.append(
            StorageBytes(name, np.frombuffer(data, dtype=np.uint8), 1, "cpu", "pickle")
        )
        return {"__pickle__": len(self.flat.storages) - 1}

    def _encode(self, value: Any, name: str) -> Any:
        if type(value) is list and len(value) >= _RECORD_RUN and \
                (records := _flat_records(value)) is not None:
            return records
        if type(value) in _PLAIN_SEQUENCES and all(type(v) in _PLAIN for v in value):
            # (Python's RNG state is 625 ints: one check, not 625 calls)
            return list(value) if type(value) is list else {"__tuple__": list(value)}
        if type(value) in _PLAIN_SEQUENCES and len(value) >= _FLOAT_RUN \
                and all(type(v) is float for v in value):
            # (a loss history: raw float64 bytes encode 20x faster than JSON, and long
            # ones share their unchanged head's chunks with the checkpoint before)
            floats = torch.from_numpy(np.array(value, dtype=np.float64))
            self.flat.format = max(self.flat.format, 4)  # (as for stdlib values, below)
            return {"__floats__": self.tensor(floats, name)["__tensor__"],
                    "tuple": type(value) is tuple}
        # Scalars of their exact types only: a subclass (an IntEnum, a StrEnum) would come
        # back as its base, so it is pickled like other objects.
        if value is None or type(value) in (bool, str, int):
            return value
        if type(value) is np.str_:  # (np.unique's keys: data, back as a str, not a pickle)
            return str(value)
        if isinstance(value, np.generic) and torch_has_dtype(value.dtype):
            # (before float and complex: np.float64 and np.complex128 subclass them)
            return {"__npscalar__": value.dtype.str, "value": self.encode(value.item(), name)}
        if type(value) is float:
            return value if math.isfinite(value) else {"__float__": repr(value)}
        if type(value) is complex:
            return {"__complex__": [self.encode(value.real, name),
                                    self.encode(value.imag, name)]}
        if isinstance(value, UninitializedTensorMixin):
            raise CaptureError(f"{name} is not initialized yet (a lazy module that has not "
                               "run): run one forward pass before saving")
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter) and not value.is_nested:
                self.subclassed.append(name)  # (a jagged nested tensor's comes back itself)
            return self.tensor(value.detach(), name, requires_grad=value.requires_grad,
                               parameter=isinstance(value, torch.nn.Parameter))
        # (a subclass, np.ma.MaskedArray or np.matrix, would come back a plain array
        # without its mask or type: it is pickled; a memmap's data is its whole value)
        if type(value) in (np.ndarray, np.memmap) and torch_has_dtype(value.dtype):
            if not (value.flags.writeable and value.flags.c_contiguous):
                value = np.array(value, order="C")  # torch refuses read-only memory
            # torch takes native byte order only: the bytes of another go as they are
            native = value if value.dtype.isnative else value.view(value.dtype.newbyteorder("="))
            t = torch.from_numpy(native)
            return {"__ndarray__": self.tensor(t, name)["__tensor__"], "dtype": value.dtype.str}
        if isinstance(value, (bytes, bytearray)):
            raw = torch.from_numpy(np.frombuffer(value, dtype=np.uint8).copy())
            return {"__bytes__": self.tensor(raw, name)["__tensor__"],
                    "type": "bytearray" if isinstance(value, bytearray) else "bytes"}
        if isinstance(value, (set, frozenset)):  # (a subclass's by its base's tag)
            kind = "frozenset" if isinstance(value, frozenset) else "set"
            return {f"__{kind}__": [self.encode(v, f"{name}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, torch.Generator) and value.device.type == "cpu":
            # (a DataLoader's own generator, say: its state is bytes, seed included)
            return {"__generator__": self.tensor(value.get_state(), name)["__tensor__"]}
        if isinstance(value, torch.dtype):
            return {"__dtype__": _DTYPE_NAMES[value]}
        if isinstance(value, torch.device):
            return {"__device__": str(value)}
        if type(value) is torch.Size:  # (a tensor's shape kept in extra: back as a Size;
            # a reader from before reads the tuple in it, as it always had)
            return {"__tuple__": list(value), "size": True}
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return {"__tuple__": [self.encode(v, f"{name}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, f"{name}/{i}") for i, v in enumerate(value)]
        metadata = module_versions(value)
        if isinstance(value, dict) and isinstance(metadata, dict):
            # nn.Module.state_dict()'s module versions, which load_state_dict reads
            # (a quantized Linear's cannot load without them), as torch.save keeps them
            return {"__state_dict__": self.encode(dict(value), name),
                    "metadata": self.encode(dict(metadata), f"{name}/_metadata")}
        kind = _DICT_KINDS.get(type(value))
        if kind is not None and (kind != "defaultdict" or
                                 value.default_factory in _DEFAULT_FACTORIES.values()):
            # (a defaultdict come back a dict would raise KeyError where it gave a default)
            node = {"__dict__": self._pairs(value, name), "type": kind}
            if kind == "defaultdict":
                node["factory"] = value.default_factory.__name__
            return node
        if isinstance(value, dict) and _plain_keys(value):
            if NUMPY_BIT_GENERATOR in value:  # (an RNG state a format-4 reader looks for
                self.flat.format = max(self.flat.format, 5)  # under "numpy", mid-resume)
            # (keys as exact strs: a StrEnum's or np.str_'s read back as a str from the
            # store, so they do from the manager's own copy of the manifest too)
            return {str.__str__(k): self.encode(v, f"{name}/{k}") for k, v in value.items()}
        if isinstance(value, dict):
            return {"__dict__": self._pairs(value, name)}
        node = stdlib_values.encode(value) if type(value) in stdlib_values.TYPES else None
        if node is None:
            return self.pickled(value, name)
        # (came within format 3: a reader from before read such a node as a plain dict)
        self.flat.format = max(self.flat.format, 4)
        return node

    def _pairs(self, value: dict[Any, Any], name: str) -> list[list[Any]]:
        return [[self.encode(k, f"{name}/key"), self.encode(v, f"{name}/{k}")]
                for k, v in value.items()]


_PLAIN = {int, str, bool, type(None)}  # JSON as they are (floats may be nan or inf)
_CONTAINERS = (list, tuple, dict, set, frozenset)
MAX_NESTING = 100  # containers within containers a value may hold
# The dict types that come back as themselves (other subclasses come back dicts); a
# defaultdict only with a built-in factory (another one is code, which is not stored).
_DICT_KINDS: dict[type, str] = {OrderedDict: "OrderedDict", Counter: "Counter",
                                defaultdict: "defaultdict"}
_DICT_TYPES = {kind: t for t, kind in _DICT_KINDS.items()}
_DEFAULT_FACTORIES: dict[str, type] = {t.__name__: t for t in (
    int, float, complex, str, bytes, bool, list, dict, set, frozenset, tuple, OrderedDict,
    Counter)}
# Quantized tensors stored as integers and scales (others, such as quint4x2's packed
# nibbles or embedding bags' float zero points, are pickled).
_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32}
_QSCHEMES = {torch.per_tensor_affine: "per_tensor_affine",
             torch.per_channel_affine: "per_channel_affine"}
# The compressed sparse layouts, and the methods that give their two index tensors.
_COMPRESSED_INDICES = {
    torch.sparse_csr: ("crow_indices", "col_indices"),
    torch.sparse_csc: ("ccol_indices", "row_indices"),
    torch.sparse_bsr: ("crow_indices", "col_indices"),
    torch.sparse_bsc: ("ccol_indices", "row_indices"),
}
_SPARSE_LAYOUTS = {str(layout).removeprefix("torch."): layout
                   for layout in (torch.sparse_coo, *_COMPRESSED_INDICES)}
_SPARSE = frozenset(_SPARSE_LAYOUTS.values())
_PLAIN_SEQUENCES = {list, tuple}  # (not a namedtuple: its type is a subclass)
_FLOAT_RUN = 256  # lists of floats at least this long are stored as float64 bytes
_RECORD_RUN = 64  # lists of dicts at least this long are tried as flat records


def torch_has_dtype(dtype: np.dtype) -> bool:
    """Whether a NumPy dtype is stored as torch's: not a long double (np.longdouble,
    np.clongdouble), which torch has no dtype for (and whose ``item()`` is one again),
    so is pickled as it is."""
    return dtype.kind in "biufc" and dtype.type not in (np.longdouble, np.clongdouble)


def _device_name(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" and device.index is None else str(device)


def _flat_records(rows: list[Any]) -> list[dict[str, Any]] | None:
    """A list of flat dicts of scalars (a history a user keeps in a notebook variable,
    which each save captures) as ``encode`` gives it, in one pass; None where it holds
    anything else. Through ``encode`` each record cost ~15 us at every save: seconds
    per save after a long run, on the training thread."""
    out = []
    for row in rows:
        if type(row) is not dict:
            return None
        record = {}
        for key, v in row.items():
            if type(key) is not str or key.startswith("__"):
                return None
            kind = type(v)
            if kind is float:
                record[key] = v if math.isfinite(v) else {"__float__": repr(v)}
            elif kind in _PLAIN:
                record[key] = v
            else:
                return None
        out.append(record)
    return out


def _plain_keys(d: dict[Any, Any]) -> bool:
    return all(isinstance(k, str) and not k.startswith("__") for k in d)


def trained_storages(objects: Iterable[Any]) -> set[tuple[str, int]]:
    """(device, address) of the storages that change at every step: the parameters
    these modules train, and these optimizers' state (momenta) for theirs."""
    found: set[tuple[str, int]] = set()
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            tensors: Iterable[Any] = (p for p in obj.parameters() if p.requires_grad)
        elif isinstance(obj, torch.optim.Optimizer):
            tensors = (v for state in obj.state.values() for v in state.values())
        else:
            continue
        found.update((str(t.device), t.untyped_storage().data_ptr()) for t in tensors
                     if isinstance(t, torch.Tensor)
                     and not isinstance(t, UninitializedTensorMixin))  # (refused in flatten)
    return found


def flatten(tree: Mapping[str, Any], *, copy_tensors: bool | SnapshotBuffers = False,
            trained: set[tuple[str, int]] | None = None) -> FlatState:
    """Split a state tree; with ``copy_tensors``, its bytes no longer alias live memory.
    ``trained`` (``trained_storages``) marks the storages that train."""
    __tracebackhide__ = True  # (IPython: a value that cannot be saved is the caller's)
    flattener = _Flattener(copy_tensors, trained or set())
    try:
        flattener.flat.skeleton = {k: flattener.encode(v, k) for k, v in tree.items()}
    except CaptureError as error:  # (it names the value's path: the walk's frames say no more)
        raise error.with_traceback(None)
    if flattener.subclassed:  # (a subclass's type, and what it holds beside its data, is code)
        names = flattener.subclassed
        warn(f"{names[:3]}{f' and {len(names) - 3} more' if len(names) > 3 else ''} are "
             "tensor subclasses, stored as plain tensors: they come back as torch.Tensor "
             "(restored in place, a live tensor keeps its own type)")
    return flattener.flat


@dataclass
class Unflattener:
    """Rebuilds a state tree from its skeleton and the decoded storages."""

    tensors: list[dict[str, Any]]
    storages: list[torch.Tensor]  # flat uint8 tensors
    trust_pickle: bool = False
    on_pickle: Callable[[str], Any] | None = None

    def __post_init__(self) -> None:
        self._cache: dict[int, torch.Tensor] = {}

    def tensor(self, index: int) -> torch.Tensor:
        # (a negative index, or a bool, would pick another tensor as Python's lists do: the
        # read names the checkpoint as for any index past the end)
        if not (type(index) is int and 0 <= index < len(self.tensors)):
            raise IndexError(f"a state node names tensor {index!r}, not one of the "
                             f"{len(self.tensors)} its manifest has")
        if index not in self._cache:
            rec = self.tensors[index]
            base = self.storages[rec["storage"]]
            t = torch.empty(0, dtype=dtype_from_name(rec["dtype"]))
            t.set_(base.untyped_storage(), rec["offset"], rec["shape"], rec["stride"])
            if rec.get("neg"):
                t = torch._neg_view(t)
            if rec.get("conj"):
                t = t.conj()
            if rec.get("requires_grad") and not (t.is_floating_point() or t.is_complex()):
                raise CorruptCheckpointError(f"{rec['name']}: a {rec['dtype']} tensor cannot "
                                             "require grad")
            if rec.get("parameter"):
                t = torch.nn.Parameter(t, requires_grad=bool(rec.get("requires_grad")))
            elif rec.get("requires_grad"):
                t.requires_grad_(True)
            self._cache[index] = t
        return self._cache[index]

    def decode(self, value: Any, name: str = "") -> Any:
        if isinstance(value, list):
            return [self.decode(v, name) for v in value]
        if not isinstance(value, dict):
            return value
        if "__tensor__" in value:
            return self.tensor(value["__tensor__"])
        if "__ndarray__" in value:
            return self.tensor(value["__ndarray__"]).numpy().view(np.dtype(value["dtype"]))
        if "__state_dict__" in value:
            state = OrderedDict(self.decode(value["__state_dict__"], name))
            state._metadata = OrderedDict(  # type: ignore[attr-defined]
                self.decode(value["metadata"], name))
            return state
        if "__quantized__" in value:
            return self.quantized(value, name)
        if "__sparse__" in value:
            return self.sparse(value, name)
        if "__nested__" in value:
            return self.nested(value, name)
        if "__npscalar__" in value:
            dtype = np.dtype(value["__npscalar__"])
            if dtype.kind not in "biufc":  # (what a save writes: np.void(10**10) takes 10 GB)
                raise CorruptCheckpointError(f"{name or 'a NumPy scalar'}: a NumPy scalar of "
                                             f"dtype {str(dtype)[:40]}, which no save writes: "
                                             "the checkpoint is damaged")
            return dtype.type(self.decode(value["value"], name))
        if "__float__" in value:
            return float(value["__float__"])
        if "__floats__" in value:
            floats = self.tensor(value["__floats__"]).tolist()
            return tuple(floats) if value.get("tuple") else floats
        if "__complex__" in value:
            real, imag = (self.decode(v, name) for v in value["__complex__"])
            return complex(real, imag)
        if "__bytes__" in value:
            raw = self.tensor(value["__bytes__"]).numpy().tobytes()
            return bytearray(raw) if value.get("type") == "bytearray" else raw
        if "__generator__" in value:
            generator = torch.Generator()
            try:
                generator.set_state(self.tensor(value["__generator__"]).clone())
            except RuntimeError as exc:
                raise CorruptCheckpointError(
                    f"{name or 'a generator'}: its state does not fit a CPU generator ({exc})"
                ) from exc
            return generator
        if "__set__" in value:
            return set(self._members(value["__set__"], name))
        if "__frozenset__" in value:
            return frozenset(self._members(value["__frozenset__"], name))
        if "__dtype__" in value:
            return dtype_from_name(value["__dtype__"])
        if "__device__" in value:
            return torch.device(value["__device__"])
        if "__tuple__" in value and value.get("size") is True:
            dims = value["__tuple__"]
            if not (isinstance(dims, list) and all(type(d) is int and d >= 0 for d in dims)):
                raise CorruptCheckpointError(f"{name or 'a torch.Size'}: {dims!r} is not a "
                                             "list of sizes")
            return torch.Size(dims)
        if "__tuple__" in value:
            return tuple(self.decode(v, name) for v in value["__tuple__"])
        if "__dict__" in value:
            pairs = self._pairs(value["__dict__"], name)
            kind = value.get("type")
            if kind is None:
                return pairs
            if kind == "defaultdict":
                factory = _DEFAULT_FACTORIES.get(value.get("factory", ""))
                if factory is None:
                    raise CorruptCheckpointError(f"{name or 'a defaultdict'}: unknown default "
                                                 f"factory {value.get('factory')!r}")
                return defaultdict(factory, pairs)
            dict_type = _DICT_TYPES.get(kind)
            if dict_type is None:
                raise CorruptCheckpointError(f"{name or 'a dict'}: unknown dict type {kind!r}")
            return dict_type(pairs)
        if not stdlib_values.TAGS.isdisjoint(value):
            tag = next(t for t in value if t in stdlib_values.TAGS)
            return stdlib_values.decode(value, tag, name)
        if "__pickle__" in value:
            if not self.trust_pickle:
                if self.on_pickle is not None:
                    return self.on_pickle(name)
                raise UntrustedPickleError(
                    f"{name or 'a value'} is stored as a pickle, which can run code when "
                    "loaded: pass trust_pickle=True if you trust this checkpoint store"
                )
            raw = self.storages[value["__pickle__"]].numpy().tobytes()
            try:
                return pickle.loads(raw)  # noqa: S301 - only with trust_pickle=True
            except (AttributeError, ImportError) as exc:  # (its class is not here)
                raise StateMismatchError(
                    f"{name or 'a value'} is an object whose class this process cannot find "
                    f"({exc}): import or define the class first (one defined in a notebook "
                    "is in that notebook's kernel only)") from exc
            except RuntimeError as exc:
                if b"_rebuild_nested_tensor" not in raw:
                    raise
                # (torch's INTERNAL ASSERT for its own empty nested tensor: a checkpoint
                # holding one cannot be read so, and restore('latest') passes over it)
                raise StoreFormatError(
                    f"{name or 'a value'} holds a nested tensor that torch cannot unpickle "
                    "(an empty nested_tensor([]), which an older ckpt_nb pickled, or one in "
                    "an object of yours; torch's error is chained): load the checkpoint "
                    "without trust_pickle=True, where it comes back as a PickledValue "
                    "placeholder, or restore another checkpoint") from exc
        return {k: self.decode(v, f"{name}/{k}" if name else k) for k, v in value.items()}

    def _members(self, members: list[Any], name: str) -> list[Any]:
        """A set's members, each pickled one named apart (``name/<member 0>``)."""
        return [self.decode(v, f"{name}/<member {i}>") for i, v in enumerate(members)]

    def _pairs(self, pairs: list[list[Any]], name: str) -> dict[Any, Any]:
        """A dict stored as its pairs (keys that are not plain strings). A pickled key
        is named ``name/<key 0>``, and a value by its key, or ``name/<value 0>`` where
        that key is no string or number."""
        decoded = {}
        for i, (k, v) in enumerate(pairs):
            key = self.decode(k, f"{name}/<key {i}>")
            label = key if type(key) in (str, int, float, bool) else f"<value {i}>"
            decoded[key] = self.decode(v, f"{name}/{label}")
        return decoded

    def quantized(self, node: Mapping[str, Any], name: str) -> torch.Tensor:
        ints = self.tensor(node["__quantized__"])
        try:
            if node.get("qscheme") == "per_tensor_affine":
                return torch._make_per_tensor_quantized_tensor(
                    ints, self.decode(node["scale"]), node["zero_point"])
            if node.get("qscheme") == "per_channel_affine":
                scales, zero_points = self.decode(node["scales"]), self.decode(node["zero_points"])
                axis = node["axis"]
                # (torch does not check these, and would read past the scales)
                if not (isinstance(axis, int) and 0 <= axis < ints.dim()
                        and scales.shape == zero_points.shape == (ints.shape[axis],)):
                    raise RuntimeError(f"{tuple(scales.shape)} scales and "
                                       f"{tuple(zero_points.shape)} zero points for axis "
                                       f"{axis} of {tuple(ints.shape)}")
                return torch._make_per_channel_quantized_tensor(ints, scales, zero_points, axis)
        except (RuntimeError, TypeError) as exc:
            raise CorruptCheckpointError(f"{name or 'a tensor'}: its quantization does not "
                                         f"fit its integers ({exc})") from exc
        raise CorruptCheckpointError(f"{name or 'a tensor'} is quantized by an unknown "
                                     f"scheme {node.get('qscheme')!r}")

    def sparse(self, node: Mapping[str, Any], name: str) -> torch.Tensor:
        layout = _SPARSE_LAYOUTS.get(node["__sparse__"])
        if layout is None:
            raise CorruptCheckpointError(f"{name or 'a tensor'} has an unknown sparse layout "
                                         f"{node['__sparse__']!r}")
        values = self.decode(node["values"])
        try:  # with the indices checked: out of range, torch would read past memory
            if layout is torch.sparse_coo:
                return torch.sparse_coo_tensor(self.decode(node["indices"]), values,
                                               node["size"], is_coalesced=node["coalesced"],
                                               check_invariants=True)
            return torch.sparse_compressed_tensor(
                self.decode(node["compressed_indices"]), self.decode(node["plain_indices"]),
                values, node["size"], layout=layout, check_invariants=True)
        except (RuntimeError, TypeError) as exc:
            raise CorruptCheckpointError(f"{name or 'a tensor'}: its sparse indices do not "
                                         f"fit its size {node['size']} ({exc})") from exc


    def nested(self, node: Mapping[str, Any], name: str) -> torch.Tensor:
        layout = _NESTED_LAYOUTS.get(node["__nested__"])
        if layout is None:
            raise CorruptCheckpointError(f"{name or 'a tensor'} has an unknown nested layout "
                                         f"{node['__nested__']!r}")
        parts = [self.decode(p) for p in node["parts"]]
        dtype = dtype_from_name(node["dtype"]) if "dtype" in node else None
        try:
            with warnings.catch_warnings():  # (torch calls the strided layout a prototype)
                warnings.simplefilter("ignore", UserWarning)
                return torch.nested.nested_tensor(parts, layout=layout, dtype=dtype,
                                                  requires_grad=bool(node["requires_grad"]))
        except (RuntimeError, TypeError, ValueError) as exc:
            raise CorruptCheckpointError(f"{name or 'a tensor'}: its nested parts do not "
                                         f"make a nested tensor ({exc})") from exc


def _nested_parts(t: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """A nested tensor's components (views of its buffer, so stored once), where
    ``torch.nested.nested_tensor`` rebuilds it from them, none for an empty strided one
    (``nested_tensor([])``, which torch cannot unpickle); None for a jagged one ragged in
    a later dimension, or empty (torch builds neither from parts: those stay pickles)."""
    if t.layout not in _NESTED_LAYOUTS.values():
        return None
    try:
        parts = t.detach().unbind()
    except RuntimeError:
        return None
    if not parts:
        return parts if t.layout is torch.strided and t.dim() == 1 else None
    if t.layout is torch.jagged and (getattr(t, "_ragged_idx", 1) != 1
                                     or len({p.shape[1:] for p in parts}) > 1):
        return None
    return parts


_NESTED_LAYOUTS = {"strided": torch.strided, "jagged": torch.jagged}


# -- validating and loading in place --------------------------------------------


def module_versions(value: Any) -> Any:
    """A state dict's ``_metadata`` (its module versions, which ``state_dict()`` sets on
    the instance), or None: read past the type's ``__getattr__``, which a config dict with
    attribute access (``__getattr__ = dict.__getitem__``, a DotMap) would answer with a
    KeyError or with a new child stored in the user's object."""
    try:
        return object.__getattribute__(value, "_metadata")
    except AttributeError:
        return None


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        layout = "" if value.layout is torch.strided else \
            f" {str(value.layout).removeprefix('torch.')}"
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}{layout}"
    return type(value).__name__


def check_module(name: str, module: torch.nn.Module, state: Mapping[str, Any],
                 strict: bool) -> list[str]:
    """Problems that would make ``module.load_state_dict(state)`` fail or cast."""
    current = module.state_dict()
    problems = []
    missing, unexpected = skipped_keys(module, state, current)
    if strict and missing:
        problems.append(f"{name}: missing keys {missing[:10]}"
                        + (" ..." if len(missing) > 10 else ""))
    if strict and unexpected:
        problems.append(f"{name}: unexpected keys {unexpected[:10]}"
                        + (" ..." if len(unexpected) > 10 else ""))
    problems += _versions_torch_fails_on(name, module, state)
    if strict and missing and unexpected:  # (the counters filled in too: they move with
        # the prefix as the rest do)
        problems += _prefix_hint(name, current, state, [k for k in current if k not in state],
                                 unexpected)
    casts: set[tuple[torch.dtype, torch.dtype]] = set()
    reshaped = False  # (a shape differs: no cast makes the state fit)
    on_meta: list[str] = []  # (torch would load nothing into them, and say only a warning)
    tied_copies = getattr(state, "_tied_copies", set())
    for key, saved in state.items():
        live = current.get(key)
        if isinstance(live, UninitializedTensorMixin):
            continue  # a lazy module not run yet: load_state_dict gives it the saved shape
        if key in tied_copies:
            continue  # (filled from the key it is tied to, alike in memory: named for that)
        if isinstance(live, torch.Tensor) and isinstance(saved, torch.Tensor):
            if live.shape != saved.shape or live.dtype != saved.dtype:
                problems.append(f"{name}: {key} is {_describe(saved)} in the checkpoint "
                                f"but {_describe(live)} in the live object")
                if live.shape == saved.shape:
                    casts.add((saved.dtype, live.dtype))
                else:
                    reshaped = True
            elif live.layout != saved.layout:
                problems.append(f"{name}: {key} is {_describe(saved)} in the checkpoint "
                                f"but {_describe(live)} in the live object, which torch "
                                "cannot copy between: give the module a buffer of the "
                                "checkpoint's layout, or take it from load() instead")
            elif live.layout in _COMPRESSED_INDICES and live._nnz() != saved._nnz():
                problems.append(f"{name}: {key} is {_describe(live)} with {live._nnz()} "
                                f"elements set, the checkpoint's with {saved._nnz()}, and "
                                "torch copies only between compressed sparse tensors of "
                                f"as many: take it from load() and assign it "
                                f"({name}.{key} = ...) instead")
            elif live.layout in _COMPRESSED_INDICES and \
                    live.values().shape[1:] != saved.values().shape[1:]:
                problems.append(f"{name}: {key}'s blocks or dense part are "
                                f"{tuple(saved.values().shape[1:])} in the checkpoint but "
                                f"{tuple(live.values().shape[1:])} in the live object, which "
                                "torch cannot copy between: take it from load() and assign "
                                f"it ({name}.{key} = ...) instead")
            elif live.layout is torch.sparse_coo and live._nnz() and \
                    (live.sparse_dim(), live.dense_dim()) != (saved.sparse_dim(),
                                                              saved.dense_dim()):
                problems.append(f"{name}: {key} has {saved.sparse_dim()} sparse and "
                                f"{saved.dense_dim()} dense dimensions in the checkpoint but "
                                f"{live.sparse_dim()} and {live.dense_dim()} in the live "
                                "object, which torch cannot copy between: take it from load() "
                                f"and assign it ({name}.{key} = ...) instead")
            elif not _copies_in_place(live.dtype):
                problems.append(f"{name}: {key} is {_describe(live)}, which torch cannot copy "
                                "into in place: take it from load() instead")
            elif live.is_meta:
                on_meta.append(key)
            elif live.is_inference():
                problems.append(f"{name}: {key} was made under torch.inference_mode(), and "
                                "torch cannot copy into it outside: build the module outside "
                                "inference mode, or take it from load() instead")
            elif live.layout is torch.strided and \
                    any(n > 1 and step == 0 for n, step in zip(live.shape, live.stride())):
                problems.append(f"{name}: {key} is an expanded view (its elements share "
                                "memory), which torch cannot copy into: make it a tensor of "
                                "its own (.clone()), or take it from load() instead")
    if casts and not reshaped:
        problems.append(_cast_hint(name, casts, state))
    if on_meta:
        problems.append(f"{name}: {on_meta[:10]}{' ...' if len(on_meta) > 10 else ''} "
                        f"{'is' if len(on_meta) == 1 else 'are'} on the meta device (built "
                        "under torch.device('meta')), with no memory to load into: give "
                        f"{name} memory first ({name}.to_empty(device='cpu')), then restore")
    # (the checks above rule out what the comparison below cannot take: casts, expanded
    # views, memory on the meta device)
    return problems or _tie_conflicts(name, current, state)


def _cast_hint(name: str, casts: set[tuple[torch.dtype, torch.dtype]],
               state: Mapping[str, Any]) -> str:
    """Advice where tensors differ from the module's in dtype alone. Casting the module
    restores it as saved only where the file is of one floating dtype throughout (a
    half-precision file into a float32 model): not mixed precision (float16 weights, float32
    BatchNorm), nor an integer dtype, which Module.to does not take."""
    copy_advice = f"take the state from load() and {name}.load_state_dict() it, which " \
        "casts each tensor as it copies"
    saved_dtype, live_dtype = next(iter(casts))
    if len(casts) > 1 or not saved_dtype.is_floating_point or \
            not live_dtype.is_floating_point or \
            any(isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != saved_dtype
                for t in state.values()):
        return f"{name}: to restore it, {copy_advice}"
    return (f"{name}: to restore it as saved, cast {name} first ({name}.to({saved_dtype})), "
            f"then back ({name}.to({live_dtype})) if you want; or {copy_advice}")


def _prefix_hint(name: str, current: Mapping[str, Any], state: Mapping[str, Any],
                 missing: list[str], unexpected: list[str]) -> list[str]:
    """Advice where the checkpoint's keys are the module's with a prefix before them
    (a Lightning module's ``model.``: its inner model restored alone), or the other way
    round (the inner model's state restored into the Lightning module). Keys alike in name
    only (a Linear's state into a Sequential's first layer) are told apart by their
    shapes: restoring with the prefix would fail again on them."""
    for longer, shorter, where, other in ((unexpected, missing, "checkpoint's", "module's"),
                                          (missing, unexpected, "module's", "checkpoint's")):
        first = shorter[0]
        prefix = next((k[:-len(first)] for k in longer
                       if k.endswith(f".{first}")), None)
        if prefix is None or prefix in _WRAPPER_PREFIXES or \
                not set(shorter) <= {k.removeprefix(prefix) for k in longer}:
            continue
        attribute = prefix.rstrip(".")
        said = f"{name}: the {where} keys are the {other} with {prefix!r} before them"
        pairs = ((prefix + k, k) if where == "checkpoint's" else (k, prefix + k)
                 for k in shorter)  # (the checkpoint's key, the module's)
        differ = next(((saved, live) for saved, live in pairs
                       if isinstance(state[saved], torch.Tensor)
                       and isinstance(current[live], torch.Tensor)
                       and not isinstance(current[live], UninitializedTensorMixin)
                       and state[saved].shape != current[live].shape), None)
        if differ is not None:  # (a dtype alone differing is not: the cast hint says how)
            saved, live = differ
            unfit = f"it does not fit {name}.{attribute} either" if where == "module's" \
                else f"its part under {prefix!r} does not fit {name} either"
            return [f"{said}, but not their shapes (the checkpoint's {saved!r} is "
                    f"{tuple(state[saved].shape)}, {name}'s {live!r} "
                    f"{tuple(current[live].shape)}): {unfit}"]
        advice = "restore into the module that holds this one as ." + attribute if \
            where == "checkpoint's" else f"restore into {name}.{attribute} instead"
        return [f"{said}: {advice}, or take the state from load() and strip the prefix"]
    return []


def _with_tied_copies(module: torch.nn.Module, state: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state`` with each key it lacks whose live tensor is one it holds, tied (the same
    memory, shape and strides), given that key's value: safetensors' ``save_model`` keeps
    one of tied weights, and its ``load_model`` fills the others so. ``state`` itself where
    none is filled."""
    current = module.state_dict()
    missing = [k for k in current if k not in state]
    if not missing:
        return state
    held: dict[tuple[Any, ...], str] = {}
    for key, live in current.items():
        if key in state and (alias := _alias(live)) is not None:
            held.setdefault(alias, key)
    tied = {key: state[held[alias]] for key in missing
            if (alias := _alias(current[key])) is not None and alias in held}
    if not tied:
        return state
    filled = OrderedDict(state)
    filled.update(tied)
    filled._tied_copies = set(tied)  # type: ignore[attr-defined] # (not the file's: not named)
    if hasattr(state, "_metadata"):  # (module versions, which load_state_dict reads)
        filled._metadata = state._metadata  # type: ignore[attr-defined]
    return filled


def _alias(t: Any) -> tuple[Any, ...] | None:
    """What two tied tensors have alike (device, address, shape, strides, dtype); None for
    what has no memory of its own to compare (no tensor, meta, empty, no storage)."""
    # (an uninitialized parameter first: torch raises on its numel())
    if not isinstance(t, torch.Tensor) or isinstance(t, UninitializedTensorMixin) or \
            t.layout != torch.strided or t.is_meta or not t.numel():
        return None
    try:
        address = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
    except (RuntimeError, NotImplementedError):  # (a wrapper subclass: no storage)
        return None
    return t.device, address, tuple(t.shape), t.stride(), t.dtype


def skipped_keys(module: torch.nn.Module, state: Mapping[str, Any],
                 current: Mapping[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """The module's keys that ``state`` lacks (but those torch fills in itself) and the
    state's keys the module lacks: what a strict load refuses, and a load with
    ``strict=False`` skips. ``current``: the module's state dict, where already taken."""
    current = module.state_dict() if current is None else current
    filled = _counters_torch_fills(module, state)
    return ([k for k in current if k not in state and k not in filled],
            [k for k in state if k not in current])


def _counters_torch_fills(module: torch.nn.Module, state: Mapping[str, Any]) -> set[str]:
    """The ``num_batches_tracked`` keys that a BatchNorm's (any ``_NormBase``'s) load fills
    in itself where the state lacks them, as torch's strict load_state_dict accepts: a
    module tracking running stats whose version in the state's metadata is None or under
    2 (a state saved before torch 0.4.1, or a plain dict without metadata, as torchvision's
    older .pth files are)."""
    metadata = getattr(state, "_metadata", None)
    filled = set()
    for path, sub in module.named_modules(remove_duplicate=False):
        if isinstance(sub, torch.nn.modules.batchnorm._NormBase) and sub.track_running_stats:
            local = metadata.get(path, {}) if isinstance(metadata, Mapping) else {}
            version = local.get("version") if isinstance(local, Mapping) else None
            # (a version of another type, which torch's load fails on: not filled, so the
            # key is named missing before anything changes)
            if version is None or isinstance(version, numbers.Real) and version < 2:
                filled.add(f"{path}.num_batches_tracked" if path else "num_batches_tracked")
    return filled


def _versions_torch_fails_on(name: str, module: torch.nn.Module,
                             state: Mapping[str, Any]) -> list[str]:
    """A BatchNorm's (any ``_NormBase``'s) version in the state's metadata that is not a
    number (``"2"``): torch's load compares it with 2 before anything else, and fails
    midway, the modules before it loaded."""
    metadata = getattr(state, "_metadata", None)
    if not isinstance(metadata, Mapping):
        return []
    problems = []
    for path, sub in module.named_modules(remove_duplicate=False):
        local = metadata.get(path, {})
        version = local.get("version") if isinstance(local, Mapping) else None
        if isinstance(sub, torch.nn.modules.batchnorm._NormBase) and version is not None \
                and not isinstance(version, numbers.Real):
            problems.append(f"{name}: the checkpoint's version of {path or 'the module'} "
                            f"({type(sub).__name__}) is {version!r}, not a number, which "
                            "torch's load_state_dict fails on: take the state from load() "
                            f"and set its _metadata[{path!r}]['version'] to the number")
    return problems


def _tie_conflicts(name: str, current: Mapping[str, Any], state: Mapping[str, Any]) -> list[str]:
    """Keys whose live tensors overlap in memory (tied weights, views of one tensor, or of
    one array through storages of their own: ``torch.from_numpy`` of an array and of its
    slice) and to which the checkpoint gives different values: load_state_dict would keep
    whichever it copies last, and say nothing. Costs one sort of the keys where no live
    tensors overlap, nothing more where the checkpoint shares memory as the live module
    does (the usual tied weights)."""
    by_device: defaultdict[torch.device, dict[str, tuple[int, int]]] = defaultdict(dict)
    for key, live in current.items():
        saved = state.get(key)
        if all(isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_nested
               and not t.is_quantized for t in (live, saved)) \
                and not isinstance(live, UninitializedTensorMixin) and live.numel():
            try:
                by_device[live.device][key] = _address_span(live)
            except (RuntimeError, NotImplementedError):  # (a wrapper subclass: no storage)
                continue
    problems = []
    for spans in by_device.values():
        for overlapping in _overlapping(spans):
            if not _loads_alike([current[k] for k in overlapping],
                                [state[k] for k in overlapping]):
                more = f" ... ({len(overlapping)} keys)" if len(overlapping) > 10 else ""
                problems.append(
                    f"{name}: {overlapping[:10]}{more} share memory in the live module (tied "
                    "weights, or views of one tensor or array) but the checkpoint holds "
                    "different values for them (it was saved from a module where they were "
                    "not tied): loading would keep only one. Restore into a module built as "
                    "the saved one was (untied), or take the state from load(), drop the "
                    "keys you do not want, and load_state_dict(..., strict=False) it "
                    "yourself")
    return problems


def _address_span(t: torch.Tensor) -> tuple[int, int]:
    """The first and past-the-last address that a strided tensor reaches in its device's
    memory (whatever storage it is a view of)."""
    first = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
    return first, first + (1 + sum((n - 1) * step for n, step in zip(t.shape, t.stride()))) \
        * t.element_size()


def _overlapping(spans: Mapping[str, tuple[int, int]]) -> list[list[str]]:
    """The groups of two or more keys whose address ``spans`` (on one device) overlap,
    each in ``spans``' order: views side by side in one buffer make none."""
    order = {key: i for i, key in enumerate(spans)}
    groups: list[list[str]] = []
    reach = -1
    for key in sorted(spans, key=spans.__getitem__):
        first, last = spans[key]
        if first >= reach:
            groups.append([])
        groups[-1].append(key)
        reach = max(reach, last)
    return [sorted(group, key=order.__getitem__) for group in groups if len(group) > 1]


def _loads_alike(live: list[torch.Tensor], saved: list[torch.Tensor]) -> bool:
    """Whether copying ``saved`` into ``live`` (overlapping tensors, of one storage or of
    several over one memory), in order, leaves each holding its saved values."""
    def bits(t: torch.Tensor) -> tuple[bool, bool]:  # (a conj or neg view reads its memory so)
        return t.is_conj(), t.is_neg()

    if len({s.device for s in saved}) == 1 \
            and len({s.data_ptr() - t.data_ptr() for s, t in zip(saved, live)}) == 1 \
            and all(s.stride() == t.stride() and bits(s) == bits(t)
                    for s, t in zip(saved, live)):
        return True  # (the checkpoint shares memory as the live module does)
    first = live[0]
    if all(t.data_ptr() == first.data_ptr() and t.stride() == first.stride()
           and t.shape == first.shape and t.dtype == first.dtype and bits(t) == bits(first)
           for t in live):
        return all(_same_bytes(s, saved[0]) for s in saved[1:])  # (one tensor, tied)
    # Else copy them, in order, into memory laid out as the live one (from its first
    # address they reach, rounded down so that each starts at a whole item), and compare.
    start = min(t.data_ptr() for t in live)
    start -= start % max(t.element_size() for t in live)
    if any((t.data_ptr() - start) % t.element_size() for t in live):
        return True  # (items at addresses not a multiple of their size, from an unaligned
        # numpy array: no view of fresh memory lays them out so, and nothing is refused)
    scratch = torch.UntypedStorage(max(_address_span(t)[1] for t in live) - start,
                                   device=saved[0].device)
    views = [_with_bits(torch.empty(0, dtype=t.dtype, device=scratch.device).set_(
        scratch, (t.data_ptr() - start) // t.element_size(), t.shape, t.stride()), t)
        for t in live]
    for view, value in zip(views, saved):
        view.copy_(value)
    return all(_same_bytes(view, value) for view, value in zip(views, saved))


def _with_bits(view: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``view`` read as ``like`` reads its memory: conjugated, negated (a ``.conj()`` or
    ``._neg_view()`` of another tensor stores the other's values)."""
    if like.is_conj():
        view = view.conj()
    return view._neg_view() if like.is_neg() else view


# Integer dtypes by item size: two tensors of a dtype torch cannot compare, compared by bytes
SAME_SIZE_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one dtype and shape hold the same bytes (a NaN equals
    itself); views of one memory are compared without reading it."""
    a, b = (t.resolve_conj().resolve_neg() for t in (a, b.to(a.device)))
    if a.is_complex():  # (complex128's 16 bytes: two float64s)
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    as_ints = SAME_SIZE_INTS[a.element_size()]  # (views of any strides at one size)
    return torch.equal(a.view(as_ints), b.view(as_ints))


@functools.cache
def _copies_in_place(dtype: torch.dtype) -> bool:
    """Whether ``copy_`` works into tensors of ``dtype`` (not into torch's sub-byte
    integers: a module's load_state_dict would fail there after loading the rest)."""
    def probe() -> torch.Tensor:
        if dtype in _QUANTIZED_DTYPES:
            with warnings.catch_warnings():  # (torch deprecates making quantized tensors)
                warnings.simplefilter("ignore")
                return torch._empty_affine_quantized([2], scale=1.0, zero_point=0, dtype=dtype)
        return torch.zeros(2 * dtype.itemsize, dtype=torch.uint8).view(dtype)

    try:
        probe().copy_(probe())
    except (RuntimeError, TypeError):
        return False
    return True


_QUANTIZED_DTYPES = frozenset(getattr(torch, n) for n in (
    "qint8", "quint8", "qint32", "quint4x2", "quint2x4") if hasattr(torch, n))


def check_optimizer(name: str, optimizer: torch.optim.Optimizer,
                    state: Mapping[str, Any]) -> list[str]:
    groups = state.get("param_groups")
    if not isinstance(groups, list) or "state" not in state:
        return [f"{name}: the checkpoint holds no optimizer state"]
    if not isinstance(state["state"], Mapping) or \
            not all(isinstance(slots, Mapping) for slots in state["state"].values()) or \
            not all(isinstance(g, Mapping) and isinstance(g.get("params"), list)
                    for g in groups):
        return [f"{name}: the checkpoint's optimizer state is not laid out as an "
                "optimizer's state_dict() (its state and parameter groups)"]
    live = optimizer.param_groups
    if len(groups) != len(live):
        # (groups the loop adds: built again before a resume, the loop's own add would
        # add their parameters twice, which torch refuses)
        return [f"{name}: {len(groups)} parameter groups in the checkpoint, {len(live)} live"
                + (f" (where the training loop adds them, add them before it runs again, and "
                   f"guard its add so that it does not add them twice: if "
                   f"len({name}.param_groups) < {len(groups)}: {name}.add_param_group(...))"
                   if len(groups) > len(live) else "")]
    problems = []
    for i, (saved, now) in enumerate(zip(groups, live)):
        if len(saved["params"]) != len(now["params"]):
            problems.append(f"{name}: group {i} has {len(saved['params'])} parameters in the "
                            f"checkpoint, {len(now['params'])} live")
    if problems:
        return problems
    params = {pid: p for saved, now in zip(groups, live)
              for pid, p in zip(saved["params"], now["params"])}
    # torch's own optimizers keep each parameter's state in its shape (or factored, as
    # Adafactor's); LBFGS keeps the whole model's flat vectors under the first one, and
    # other libraries' optimizers their own layouts (Shampoo's preconditioners).
    shaped_like_parameters = isinstance(optimizer, _TORCH_OPTIMIZERS) and \
        not isinstance(optimizer, torch.optim.LBFGS)
    for pid, slots in state["state"].items():
        param = params.get(pid)
        if param is None:
            problems.append(f"{name}: state for unknown parameter {pid}")
            continue
        for slot, value in slots.items():
            if shaped_like_parameters and isinstance(value, torch.Tensor) and \
                    value.dim() > 0 and not _fits_parameter(value, param):
                problems.append(f"{name}: state {pid}/{slot} is {_describe(value)}, "
                                f"parameter is {_describe(param)}")
    return problems


SlotNames = list[list[str | None]]
"""An optimizer's parameter names, group by group and slot by slot (None: not known)."""


def _names_of_parameters(modules: Mapping[str, torch.nn.Module]) -> dict[int, list[str]]:
    """Every name of each parameter among ``modules`` ("model.0.weight"), by its id: a
    tied one, or one in two modules, has several."""
    names: dict[int, list[str]] = defaultdict(list)
    for key, module in modules.items():
        for name, param in module.named_parameters(remove_duplicate=False):
            names[id(param)].append(f"{key}.{name}")
    return names


def parameter_names(optimizers: Mapping[str, torch.optim.Optimizer],
                    modules: Mapping[str, torch.nn.Module]) -> dict[str, SlotNames]:
    """The name of each optimizer's parameters among ``modules``, None where none of them
    holds it. Recorded at save: optimizer state goes to parameters by position, and groups
    built from a set of names come out in another order in each process. A parameter under
    several names takes the least, so that it is named alike whatever order the modules
    come in."""
    names = {pid: min(every) for pid, every in _names_of_parameters(modules).items()}
    return {key: [[names.get(id(p)) for p in group["params"]]
                  for group in optimizer.param_groups]
            for key, optimizer in optimizers.items()}


def _live_names(optimizer: torch.optim.Optimizer, modules: Mapping[str, torch.nn.Module],
                saved: SlotNames) -> SlotNames:
    """The live optimizer's parameters named as ``saved`` names them: each by the one of
    its names among the live ``modules`` that the record holds (None for none, or two)."""
    wanted = {name for group in saved for name in group if name is not None}
    found = {pid: [name for name in every if name in wanted]
             for pid, every in _names_of_parameters(modules).items()}
    return [[names[0] if len(names := found.get(id(p), [])) == 1 else None
             for p in group["params"]] for group in optimizer.param_groups]


def _slot_names(optimizer: torch.optim.Optimizer, state: Any, recorded: SlotNames | None,
                modules: Mapping[str, torch.nn.Module]) -> list[tuple[SlotNames, SlotNames]]:
    """The saved and the live names of the optimizer's parameters, in the ways known:
    torch's own ``param_names`` (an optimizer built from ``named_parameters()``) where
    both have them, then the names recorded at save against the live modules'."""
    groups = state.get("param_groups") if isinstance(state, Mapping) else None
    if not isinstance(groups, list) or not all(
            isinstance(g, Mapping) and isinstance(g.get("params"), list) for g in groups):
        return []  # (check_optimizer names what is wrong with it)
    sizes = [len(g["params"]) for g in groups]
    ways = []
    live = optimizer.param_groups
    if groups and live and all("param_names" in g for g in live) and all(
            isinstance(g.get("param_names"), list) for g in groups):
        ways.append(([list(g["param_names"]) for g in groups],
                     [list(g["param_names"]) for g in live]))
    if recorded is not None and modules:
        ways.append((recorded, _live_names(optimizer, modules, recorded)))
    return [(saved, now) for saved, now in ways if [len(names) for names in saved] == sizes
            and all(isinstance(n, str) or n is None for names in saved for n in names)]


def _by_name(state: Mapping[str, Any], saved: SlotNames, live: SlotNames
             ) -> Mapping[str, Any] | None:
    """``state`` with its groups' parameters in the live optimizer's order, name by name
    (torch then puts each saved state on the parameter of its name); None where the names
    do not match one to one (a name missing, or twice). Parameters moved between groups
    take their state along; a group takes the hyper-parameters (lr, weight decay) of the
    saved group its parameters all come from, and where they come from several, those of
    the saved group in its place."""
    every_saved = [name for names in saved for name in names]
    every_live = [name for names in live for name in names]
    if not all(isinstance(name, str) for name in every_saved + every_live) or \
            len(set(every_saved)) != len(every_saved) or \
            len(every_live) != len(every_saved) or set(every_live) != set(every_saved):
        return None
    groups = state["param_groups"]
    if saved == live or len(groups) != len(live):
        return state  # (the same order; or check_optimizer refuses the count)
    torch_names = {pid: name for g in groups
                   for pid, name in zip(g["params"], g.get("param_names") or ())}
    slot = {name: pid for g, names in zip(groups, saved) for pid, name in zip(g["params"], names)}
    home = {name: k for k, names in enumerate(saved) for name in names}
    sources = [{home[name] for name in names} for names in live]
    whole = all(len(s) == 1 for s in sources) and len(set.union(*sources)) == len(sources)
    reordered = []
    for i, names in enumerate(live):
        like = groups[min(sources[i])] if whole else groups[i]
        params = [slot[name] for name in names]
        group = {**like, "params": params}
        if "param_names" in like:  # (torch keeps the loaded names: the live ones' order)
            if not all(pid in torch_names for pid in params):
                return None
            group["param_names"] = [torch_names[pid] for pid in params]
        reordered.append(group)
    return {**state, "param_groups": reordered}


def _swapped(saved: SlotNames, live: SlotNames) -> tuple[str, str] | None:
    """Two parameters the optimizer holds in another order than when it was saved: the
    one whose saved state would go, by position, to the other; None where the groups'
    sizes differ or no parameter held then is elsewhere now."""
    if [len(names) for names in saved] != [len(names) for names in live]:
        return None
    every_saved = [name for names in saved for name in names]
    every_live = [name for names in live for name in names]
    return next(((was, now) for was, now in zip(every_saved, every_live)
                 if was is not None and now is not None and was != now
                 and was in every_live and now in every_saved), None)


def _fits_parameter(state: torch.Tensor, param: torch.Tensor) -> bool:
    """Whether a per-parameter state tensor of one of torch's optimizers can be this
    parameter's: torch's load_state_dict takes any shape, and the optimizer's next step
    fails. Moments have the parameter's shape, factored ones (Adafactor's) 1 where they
    sum: always the parameter's number of dimensions (its scalars, a step, are not asked
    about). One of another number is another parameter's (the groups' order changed) or
    a parameter reshaped since."""
    return state.dim() == param.dim() and \
        all(s in (p, 1) for s, p in zip(state.shape, param.shape))


def _other_kind(name: str, obj: Any, saved: str | None, state: Any) -> str | None:
    """Why an optimizer or scheduler cannot take the state of another class: torch's
    load_state_dict does, then SGD given Adam's state fails at its next step (its
    groups have no momentum), AdamW given Adam's runs Adam (no decoupled decay)."""
    if not isinstance(obj, _CHECKED_KINDS):
        return None
    if saved is None or "." not in saved or saved in _STATE_WRAPPERS:
        # (not known: a file imported from elsewhere; a wrapper's, saved by a ckpt_nb
        # that recorded accelerate's wrapper, not the optimizer it held)
        return _other_hyperparameters(name, obj, state)
    saved_class, live_class = saved.rsplit(".", 1)[-1], type(obj).__name__
    if saved_class == live_class:
        return None
    return (f"{name}: its state in the checkpoint is {saved_class}'s, the live object is "
            f"{live_class}: restore into {saved_class}, or take the state from load() and "
            "convert it")


def _other_hyperparameters(name: str, obj: Any, state: Any) -> str | None:
    """For a state whose class is not recorded (a torch.save file's): why an optimizer
    cannot take it, as far as its parameter groups tell. A group has every hyper-parameter
    of its optimizer's class, so one that lacks a number the live class has (SGD's
    momentum in AdamW's groups) is another class's; flags (foreach, fused, ...) are left
    aside, as torch versions add them, and a value of another size is no other class."""
    if not isinstance(obj, torch.optim.Optimizer) or not isinstance(state, Mapping):
        return None
    groups = state.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) for g in groups):
        return None  # (check_optimizer names what is wrong with it)
    numbers = [key for key, value in obj.defaults.items()
               if isinstance(value, (int, float, tuple, torch.Tensor))
               and not isinstance(value, bool)]
    missing = [key for key in numbers if any(key not in g for g in groups)]
    if not missing:
        return None
    live_class = type(obj).__name__
    return (f"{name}: the checkpoint's optimizer state has no {', '.join(missing)} in its "
            f"parameter groups, which {live_class} has: it is another optimizer's state (the "
            "file does not say which); restore into that class, or take the state from "
            "load() and convert it")


_CHECKED_KINDS = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
# torch's own optimizers (and so subclasses of them): their state is known
_TORCH_OPTIMIZERS = tuple(c for c in vars(torch.optim).values() if isinstance(c, type)
                          and issubclass(c, torch.optim.Optimizer)
                          and c is not torch.optim.Optimizer)
_EXTRA_STATE = "_extra_state"  # (torch's key for a module's get_extra_state())


def merged_adapters(obj: Any) -> list[str]:
    """The layers of a module whose adapters are merged into its base weights (peft's
    ``merge_adapter()``: a LoRA layer's ``merged_adapters``): a flag that its state_dict()
    does not hold, so a state saved merged and restored into an unmerged model adds the
    adapters twice, and one saved unmerged and restored into a merged model drops them,
    silently. Only where peft is imported: the walk over a model's modules took 6 ms a
    save on one of 1,500 modules."""
    if not isinstance(obj, torch.nn.Module) or "peft" not in sys.modules:
        return []
    return [path for path, module in obj.named_modules()
            if isinstance(merged := getattr(module, "merged_adapters", None), list) and merged]


MERGED_WORDS = ("merged into its base weights (peft's merge_adapter()), which its "
                "state_dict() does not record: restored into a model whose adapters are not "
                "merged (or the other way) it adds them twice (or drops them), silently; "
                "unmerge_adapter() before saving and before restoring")


def state_left_out(obj: Any) -> list[str]:
    """What a module whose ``state_dict()`` is empty holds all the same, that changes as it
    runs and no save takes: its non-persistent buffers (``register_buffer(...,
    persistent=False)``), and a torchmetrics ``Metric``'s states (``tp``, ``mean_value``),
    which torchmetrics keeps out of ``state_dict()`` unless ``metric.persistent(True)``.
    Empty where the state holds anything (a model's constant non-persistent buffers, such
    as a position-ids table, beside its weights, are no loop state)."""
    if not isinstance(obj, torch.nn.Module):
        return []
    left: list[str] = []
    for path, module in obj.named_modules():
        prefix = f"{path}." if path else ""
        unsaved = getattr(module, "_non_persistent_buffers_set", ())
        left += [prefix + n for n in module._buffers if n in unsaved]  # (in their order)
        defaults, persistent = getattr(module, "_defaults", None), \
            getattr(module, "_persistent", None)
        if isinstance(defaults, dict) and isinstance(persistent, dict):  # (torchmetrics)
            left += [prefix + n for n in defaults if not persistent.get(n)]
    return left


def _from_torch(obj: Any) -> bool:
    name = getattr(obj, "__module__", None) or type(obj).__module__
    return name == "torch" or name.startswith("torch.")


@functools.cache
def _class_loads_on_its_own(cls: type) -> bool:
    """Whether a module class loads its state with code from outside torch."""
    return any(not _from_torch(next(c for c in cls.__mro__ if attr in vars(c)))
               for attr in ("load_state_dict", "_load_from_state_dict", "set_extra_state"))


def _runs_own_load_code(module: torch.nn.Module) -> bool:
    """Whether loading this module runs code that may refuse once some of its tensors
    are copied (and that validation cannot foresee): extra state, load hooks, or a
    load method from outside torch."""
    for m in module.modules():
        if _class_loads_on_its_own(type(m)):
            return True
        hooks = [*m._load_state_dict_pre_hooks.values(), *m._load_state_dict_post_hooks.values()]
        if any(not _from_torch(getattr(h, "hook", h)) for h in hooks):
            return True
    return False


# torch's own loaders that copy each tensor given into the module's own (nn.Module's,
# and the norms', which fill in or drop running statistics first): torch.ao's quantized
# modules load by packing, and the packed weights keep the tensors given (the bias)
_COPYING_LOADERS = ("torch.nn.modules.module", "torch.nn.modules.batchnorm",
                    "torch.nn.modules.instancenorm")


@functools.cache
def _class_copies_what_it_loads(cls: type) -> bool:
    return all(next(c for c in cls.__mro__ if attr in vars(c)).__module__ in _COPYING_LOADERS
               for attr in ("load_state_dict", "_load_from_state_dict", "set_extra_state"))


def copies_what_it_loads(module: torch.nn.Module) -> bool:
    """Whether ``module.load_state_dict`` keeps none of the tensors it is given (each is
    copied into the module's own): where it may, a state read from a mapped file is to be
    copied out of the mapping first (the file saved over would change or kill them)."""
    return not _runs_own_load_code(module) and \
        all(_class_copies_what_it_loads(type(m)) for m in module.modules())


def _backup(obj: Any) -> dict[str, Any]:
    """What ``_put_back`` needs to undo a load: the object's state, its tensors copied
    (a module's to the CPU: a copy on its GPU could run that out of memory, and they
    are copied back into its own; another object may keep the tensors it is given)."""
    state = obj.state_dict()
    copies: dict[int, Any] = {}
    to_cpu = isinstance(obj, torch.nn.Module)

    def collect(value: Any) -> None:
        if isinstance(value, UninitializedTensorMixin):
            raise _NoBackup("a lazy module's parameter is not initialized yet")
        if isinstance(value, torch.Tensor):
            copies[id(value)] = value.detach().to("cpu", copy=True) if to_cpu \
                else value.detach().clone()
        elif isinstance(value, Mapping):
            for item in value.values():
                collect(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)

    collect(state)
    return copy.deepcopy(state, copies)  # (tensors as copied: grad-tracking ones too)


class _NoBackup(Exception):
    """An object's state cannot be copied to put back."""


def _put_back(obj: Any, backup: dict[str, Any]) -> bool:
    """Undo a load that failed part way; whether that worked. A module takes its own
    state back through load_state_dict; where its load code refuses even that, its
    parameters and buffers are copied back, and its extra state set again."""
    try:
        obj.load_state_dict(backup)
        return True
    except Exception:  # noqa: BLE001 - whatever the object's own code raises
        if not isinstance(obj, torch.nn.Module):
            return False
    live = dict(obj.named_parameters(remove_duplicate=False))
    live.update(obj.named_buffers(remove_duplicate=False))
    try:
        with torch.no_grad():
            for key, value in backup.items():
                target = live.get(key)
                if isinstance(target, torch.Tensor) and isinstance(value, torch.Tensor) \
                        and target.shape == value.shape:
                    target.copy_(value)
                elif key.endswith(_EXTRA_STATE):
                    path = key.removesuffix(_EXTRA_STATE).rstrip(".")
                    obj.get_submodule(path).set_extra_state(value)
                else:  # (a state_dict entry that is no live tensor: a quantized weight)
                    return False
    except Exception:  # noqa: BLE001
        return False
    return True


# The wrappers whose state is the module they run under a prefix, by class, and the
# attribute that holds that module.
_WRAPPERS = {"torch._dynamo.eval_frame.OptimizedModule": "_orig_mod",
             "torch.nn.parallel.data_parallel.DataParallel": "module",
             "torch.nn.parallel.distributed.DistributedDataParallel": "module"}
_WRAPPER_PREFIXES = {"_orig_mod.": "torch.compile", "module.": "DataParallel"}


def unwrap(obj: Any) -> Any:
    """The module a torch.compile / DataParallel / DistributedDataParallel wrapper runs
    (``obj`` itself for any other): saved and restored through it, a checkpoint's keys
    are the same with and without the wrapper, so it moves between the two."""
    while isinstance(obj, torch.nn.Module):
        attr = next((_WRAPPERS[name] for c in type(obj).__mro__
                     if (name := f"{c.__module__}.{c.__qualname__}") in _WRAPPERS), None)
        inner = getattr(obj, attr, None) if attr is not None else None
        if not isinstance(inner, torch.nn.Module):
            return obj
        obj = inner
    return obj


def _unprefixed(module: torch.nn.Module, state: Mapping[str, Any]) -> Mapping[str, Any]:
    """A state saved through a wrapper (by ckpt_nb before it unwrapped them, or by
    ``torch.save(compiled.state_dict())``) as its module's: where every key carries a
    wrapper's prefix and, stripped of it, the keys fit this module (exactly, or but for
    keys torch or the tied copies fill in: an old BatchNorm's counter, a tied weight saved
    once); a module of a different architecture is left to fail on its keys. ``state``
    otherwise."""
    live_state = module.state_dict()
    prefix = ""
    candidate = state
    while candidate and not _keys_fit(module, live_state, candidate):
        step = next((p for p in _WRAPPER_PREFIXES if all(k.startswith(p) for k in candidate)),
                    None)
        if step is None:
            return _compiled_inside(live_state, state)
        prefix += step
        candidate = _without_prefix(state, prefix)
    return candidate


def _keys_fit(module: torch.nn.Module, live_state: Mapping[str, Any],
              state: Mapping[str, Any]) -> bool:
    """Whether ``state``'s keys are the module's, but for those its load fills in."""
    if not set(state) <= set(live_state):
        return False
    missing = set(live_state) - set(state) - _counters_torch_fills(module, state)
    return not missing or not missing - set(_with_tied_copies(module, state))


def _without_prefix(state: Mapping[str, Any], prefix: str) -> OrderedDict[str, Any]:
    """``state`` with ``prefix`` stripped from its keys and from its metadata's module
    paths (the wrapper's own path, and any outside it, becoming the root's "")."""
    stripped = OrderedDict((k.removeprefix(prefix), v) for k, v in state.items())
    metadata = getattr(state, "_metadata", None)
    if isinstance(metadata, Mapping):  # (module versions by module path: "" is the root's)
        stripped._metadata = OrderedDict(  # type: ignore[attr-defined]
            (k.removeprefix(prefix) if k.startswith(prefix) else "", v)
            for k, v in metadata.items() if f"{k}.".startswith(prefix))
    return stripped


def _uncompiled(key: str) -> str:
    """A state key or module path without the ``_orig_mod`` steps of torch.compile."""
    return ".".join(step for step in key.split(".") if step != "_orig_mod")


def uncompiled_keys(state: Any) -> Any:
    """A module's state dict saved through torch.compile (``torch.save(compiled.state_dict())``,
    keys ``_orig_mod.weight``) under the keys the module it runs has, as ckpt_nb saves a
    compiled module: so that ``diff`` pairs its tensors with a native save's. Anything else
    as it is."""
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state) or \
            not any("_orig_mod" in k.split(".") for k in state):
        return state
    renamed = OrderedDict((_uncompiled(k), v) for k, v in state.items())
    if len(renamed) != len(state):
        return state
    metadata = getattr(state, "_metadata", None)
    if isinstance(metadata, Mapping):  # (the module a wrapper runs is at the wrapper's path)
        versions = OrderedDict((_uncompiled(path), version) for path, version in
                               metadata.items() if not path.endswith("_orig_mod"))
        versions.update((_uncompiled(path), version) for path, version in metadata.items()
                        if path.endswith("_orig_mod"))
        renamed._metadata = versions  # type: ignore[attr-defined]
    return renamed


def _compiled_inside(live: Mapping[str, Any], state: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state`` under the live module's keys where the two differ only by a compiled
    module inside (``AveragedModel(torch.compile(m))`` saved, ``AveragedModel(m)`` live,
    or the other way round); ``state`` otherwise."""
    by_plain = {_uncompiled(k): k for k in live}
    if len(by_plain) != len(live) or {_uncompiled(k) for k in state} != set(by_plain) \
            or len(state) != len(live):
        return state
    renamed = OrderedDict((by_plain[_uncompiled(k)], v) for k, v in state.items())
    metadata = getattr(state, "_metadata", None)
    live_metadata = getattr(live, "_metadata", None)
    if isinstance(metadata, Mapping) and isinstance(live_metadata, Mapping):
        saved = {_uncompiled(path): version for path, version in metadata.items()}
        renamed._metadata = OrderedDict(  # type: ignore[attr-defined]
            (path, saved.get(_uncompiled(path), version))
            for path, version in live_metadata.items())
    return renamed


def _wrapper_hint(name: str, state: Mapping[str, Any]) -> list[str]:
    """Advice for a module's state whose keys all carry a wrapper's prefix."""
    for prefix, wrapper in _WRAPPER_PREFIXES.items():
        if state and all(isinstance(k, str) and k.startswith(prefix) for k in state):
            return [f"{name}: the checkpoint's keys carry the {prefix!r} prefix of a {wrapper} "
                    "wrapper's state_dict, and without it do not fit this module either: "
                    "restore into a module of the saved architecture, or take the state "
                    "from load() and strip the prefix"]
    return []


def _adapter_hint(name: str, module: torch.nn.Module, state: Mapping[str, Any]) -> list[str]:
    """Advice for a module refused a state where one side is a LoRA (peft) model and the
    other not: their keys differ by more than a prefix (``base_model.model.``, a layer's
    ``.base_layer.``, the adapters' own), which the refusal's key lists do not say."""
    def lora(keys: Iterable[Any]) -> bool:
        return any(isinstance(k, str) and (".lora_A." in k or ".lora_B." in k) for k in keys)

    live_state = module.state_dict()
    saved, live = lora(state), lora(live_state)
    if saved and live and not any(".base_layer." in str(k) for k in state) \
            and any(".base_layer." in k for k in live_state):
        return [f"{name}: the checkpoint holds a LoRA (peft) model's adapters alone (the "
                "adapter_model file save_pretrained() writes), named without the adapter's "
                "name: set_peft_model_state_dict(model, safetensors.torch.load_file(path)), "
                "or PeftModel.from_pretrained(base, folder), takes it"]
    if saved and not live:
        return [f"{name}: the checkpoint is a LoRA (peft) model's, with its adapters; this "
                "module has none: restore into the model get_peft_model(base, config) "
                "gives (then merge_and_unload() for a plain one)"]
    if live and not saved:
        return [f"{name}: this module is a LoRA (peft) model, the checkpoint holds a model "
                "without adapters: restore into the base model before get_peft_model() "
                "wraps it"]
    return []


class RestoreInterrupts:
    """Ctrl-C and a restore, all or nothing. Before ``commit()`` (reading, decoding and
    checking: what takes long) an interrupt stops the restore at once, its message saying
    that nothing was changed. From ``commit()`` on (putting state into the live objects)
    the main thread holds SIGINT until the block ends, says so at the first, and delivers
    it then to the handler it held it from: every interrupt, a second or a third too, so
    that no Ctrl-C leaves half the objects as they were. Where that handler is Python's
    or a ckpt_nb session's (which would save at the next consistent point and let the cell
    run on), the cell ends with a KeyboardInterrupt saying the restore finished: it was
    what was interrupted. A ``resume`` (a %%ckpt_auto cell's, before it trains) gives it to
    the session's handler, as one during training. A restore inside another's commit holds
    nothing of its own; off the main thread no signal comes."""

    def __init__(self, what: str, *, resume: bool = False) -> None:
        self.what = what
        self.resume = resume
        self.committing = False
        self.held = 0
        self._previous: Any = None  # (the SIGINT handler while this one holds it)

    def __enter__(self) -> RestoreInterrupts:
        return self

    def commit(self, what: str | None = None) -> None:
        """From here on, hold interrupts; ``what`` names the restore in the messages after."""
        self.what = what or self.what
        # (the handler goes in first: an interrupt before it stops a restore that changed
        # nothing, and says so; one after it is held)
        if threading.current_thread() is threading.main_thread():
            current = signal.getsignal(signal.SIGINT)
            # (one set outside Python is not put back; a restore outside holds them)
            if current is not None and \
                    not isinstance(getattr(current, "__self__", None), RestoreInterrupts):
                signal.signal(signal.SIGINT, self._hold)
                self._previous = current
        self.committing = True

    def _hold(self, signum: int, frame: Any) -> None:
        if not self.held:
            print(f"ckpt_nb: interrupt received: the {self.what} finishes first (it puts "
                  "back all or nothing), then the interrupt is taken", file=sys.stderr,
                  flush=True)
        self.held += 1

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: Any) -> None:
        if not self.committing:
            if isinstance(error, KeyboardInterrupt) and not error.args:
                error.args = (f"{self.what} interrupted before anything was put back: "
                              "nothing was changed",)
            return
        previous, self._previous = self._previous, None
        if previous is None:
            return
        signal.signal(signal.SIGINT, previous)
        if not self.held or previous is signal.SIG_IGN or \
                (error is not None and not isinstance(error, Exception)):
            return  # (an exit, say, stops it already)
        if previous is signal.default_int_handler or \
                (not self.resume and _is_session_handler(previous)):
            message = f"interrupted during the {self.what}, which " + (
                "finished first: all of it was put back" if error is None
                else f"failed first: {error}")
            interrupt = KeyboardInterrupt(message)
            # (IPython shows this line alone, not the frames of ckpt_nb that raised it)
            interrupt._render_traceback_ = (  # type: ignore[attr-defined]
                lambda: [f"KeyboardInterrupt: {message}"])
            raise interrupt from error
        if previous is signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)
        else:  # (the user's own handler; a resuming cell's, which saves, then stops)
            previous(signal.SIGINT, inspect.currentframe())


def _is_session_handler(handler: Any) -> bool:
    """Whether ``handler`` is a ckpt_nb session's SIGINT handler (``AutoSession``'s)."""
    from ._session import AutoSession  # (here: _session imports this module)
    return isinstance(getattr(handler, "__self__", None), AutoSession)


def load_all(targets: Mapping[str, Any], states: Mapping[str, Any], strict: bool = True,
             kinds: Mapping[str, str] | None = None,
             param_names: Mapping[str, SlotNames] | None = None,
             modules: Mapping[str, Any] | None = None) -> dict[str, tuple[list[str], list[str]]]:
    """Validate every target against its state, then load them all or none; returns
    each module's (missing, unexpected) keys that ``strict=False`` let it skip, for the
    modules that skipped some (none where strict).

    Modules and optimizers are checked structurally before anything changes, and
    an optimizer or LR scheduler against the class its state was saved from
    (``kinds``, where known). An optimizer's state goes to its parameters by name where
    the names are known on both sides (torch's ``param_names``, or ``param_names``
    recorded at save against the target modules and ``modules``), else by position, as
    torch's load_state_dict puts it. What runs code of its own as it loads (other
    Statefuls; modules with extra state, load hooks or a load method from outside
    torch) can still refuse: those load first, each but the last backed up, and are
    put back if one of them refuses. A Ctrl-C during the loads waits for them to end
    (``RestoreInterrupts``).
    """
    targets = {name: as_stateful(obj) for name, obj in targets.items()}
    for name, obj in targets.items():
        if name in states and (merged := merged_adapters(obj)):
            warn(f"{name}: restoring into a model with the adapters of {len(merged)} layers "
                 + MERGED_WORDS, RuntimeWarning)
    states = {name: _with_tied_copies(targets[name], _unprefixed(targets[name], state))
              if isinstance(targets.get(name), torch.nn.Module) and isinstance(state, Mapping)
              and all(isinstance(k, str) for k in state) else state
              for name, state in states.items()}
    named_by = {key: module for key, module in
                {**targets, **{k: as_stateful(m) for k, m in (modules or {}).items()}}.items()
                if isinstance(module, torch.nn.Module)}
    orders: dict[str, tuple[SlotNames, SlotNames]] = {}
    for name, obj in targets.items():
        if isinstance(obj, torch.optim.Optimizer) and name in states and \
                not isinstance(obj, torch.optim.LBFGS):  # (its state is flat vectors)
            ways = _slot_names(obj, states[name], (param_names or {}).get(name), named_by)
            matched = next((state for state in (_by_name(states[name], *names)
                                                for names in ways) if state is not None), None)
            if matched is not None:
                states[name] = matched
            elif ways:
                orders[name] = ways[0]
    problems: list[str] = []
    reordered: list[str] = []
    skipped: dict[str, tuple[list[str], list[str]]] = {}
    for name, obj in targets.items():
        if name not in states:
            problems.append(f"{name}: not in the checkpoint (it holds {sorted(states)})")
        elif not isinstance(obj, Stateful):
            problems.append(f"{name}: {type(obj).__name__} has no load_state_dict()")
        elif (other := _other_kind(name, obj, (kinds or {}).get(name),
                                   states[name])) is not None:
            problems.append(other)
        elif isinstance(obj, GeneratorState) and \
                (other := obj.problem(states[name])) is not None:
            problems.append(f"{name}: {other}")
        elif isinstance(obj, torch.nn.Module):
            found = check_module(name, obj, states[name], strict)
            problems += found + (_wrapper_hint(name, states[name]) +
                                 _adapter_hint(name, obj, states[name]) if found else [])
            if not strict and any(keys := skipped_keys(obj, states[name])):
                skipped[name] = keys
        elif isinstance(obj, torch.optim.Optimizer):
            found = check_optimizer(name, obj, states[name])
            swapped = _swapped(*orders[name]) if found and name in orders else None
            if swapped is None:
                problems += found
            else:
                reordered.append(name)
                problems.append(
                    f"{name}: its parameters are in another order than when it was saved "
                    f"(the state saved for {swapped[0]} would go to {swapped[1]}), and not all "
                    "of them have a name in the modules restored with it to put it back by: "
                    "build its parameter groups in the order saved (the checkpoint's "
                    f"param_names[{name!r}], from load(), lists it), and from sorted(names), "
                    "not a set of names, whose order changes with each process")
    if problems:
        error = ParameterOrderError if len(reordered) == len(problems) else StateMismatchError
        raise error("checkpoint does not fit; nothing was changed:\n  " + "\n  ".join(problems))
    checked = (torch.nn.Module, torch.optim.Optimizer)
    risky = [n for n, obj in targets.items() if not isinstance(obj, checked)] + \
        [n for n, obj in targets.items()
         if isinstance(obj, torch.nn.Module) and _runs_own_load_code(obj)]
    order = risky + [n for n, obj in targets.items() if n not in risky
                     and isinstance(obj, torch.optim.Optimizer)] \
        + [n for n, obj in targets.items() if n not in risky and isinstance(obj, torch.nn.Module)]
    with RestoreInterrupts("restore") as interrupts:
        interrupts.commit()
        _load_in_order(targets, states, order, risky[:-1], strict)
    return skipped


def _load_optimizer(opt: torch.optim.Optimizer, state: Any) -> None:
    """``opt.load_state_dict(state)``, its ``param_groups`` list, their dicts and its
    ``state`` dict kept: torch's load makes them anew, and a variable holding them
    (``groups = opt.param_groups``, whose learning rate the loop sets) then held the old
    ones, which no longer drove the optimizer. Where the class loads in its own way (a
    wrapper sharing its groups with its base optimizer), it is left as torch leaves it."""
    groups, dicts, held = opt.param_groups, list(opt.param_groups), opt.state
    opt.load_state_dict(state)
    if type(opt).load_state_dict is not torch.optim.Optimizer.load_state_dict or \
            "param_groups" not in vars(opt) or "state" not in vars(opt):
        return
    fresh = opt.param_groups
    if fresh is not groups and type(fresh) is list and len(fresh) == len(dicts) and \
            all(type(d) is dict for d in (*fresh, *dicts)):
        for old, new in zip(dicts, fresh):
            items = dict(new)
            old.clear()
            old.update(items)
        groups[:] = dicts
        opt.param_groups = groups
    if opt.state is not held and type(opt.state) is type(held):
        items = dict(opt.state)
        held.clear()
        held.update(items)
        opt.state = held


def _load_in_order(targets: Mapping[str, Any], states: Mapping[str, Any], order: list[str],
                   backed_up: list[str], strict: bool) -> None:
    """load_all's commit: each target in ``order``, those of ``backed_up`` copied first
    and put back if a later one refuses."""
    backups: dict[str, Any] = {}
    done: list[str] = []
    for name in order:
        obj = targets[name]
        # The last of them is not copied (it may hold a whole model: a copy would cost a
        # restore as much again): should it refuse, it alone may be half loaded, and says so.
        if name in backed_up:
            with contextlib.suppress(_NoBackup, RuntimeError, TypeError, MemoryError):
                backups[name] = _backup(obj)  # (else it loads, as torch would, without)
        try:
            if isinstance(obj, torch.nn.Module):
                obj.load_state_dict(states[name], strict=strict)
            elif isinstance(obj, torch.optim.Optimizer):
                _load_optimizer(obj, states[name])
            else:
                obj.load_state_dict(states[name])
        except Exception as exc:
            changed = [n for n in done if n not in backups]
            changed += [n for n, backup in backups.items()
                         if n != name and not _put_back(targets[n], backup)]
            # (the one that refused is "half loaded", not "changed": it may have refused
            # before it changed anything, and refuse its put-back as well)
            half = "" if name in backups and _put_back(obj, backups[name]) else \
                "it may be half loaded; "
            raise StateMismatchError(
                f"{name}: load_state_dict failed ({exc}); {half}"
                + (f"{changed} were changed all the same" if changed else
                   "nothing else was changed" if half else "nothing was changed")
            ) from exc
        done.append(name)
