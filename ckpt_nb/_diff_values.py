"""The values of two checkpoints beside their tensors, compared from their manifests
alone (``CheckpointManager.diff_values``): an optimizer's lr, a scheduler's state, step,
metrics, ``extra``, a notebook's variables. A pickle is compared by its stored bytes and
never unpickled; a tensor is named in words (``diff`` compares those)."""

from __future__ import annotations

import hashlib
import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ._capture import Unflattener, dtype_from_name
from ._errors import CkptError, CorruptCheckpointError, StoreFormatError

if TYPE_CHECKING:
    from ._manager import CheckpointManager

# The tags of a manifest's state nodes that stand for tensors (diff's rows), and those
# of them whose value is the index of a tensor record
_TENSOR_TAGS = frozenset({"__tensor__", "__quantized__", "__floats__", "__ndarray__",
                          "__bytes__", "__generator__", "__sparse__", "__nested__"})
_TENSOR_INDEXES = _TENSOR_TAGS - {"__sparse__", "__nested__"}
# A list or tuple of containers this long or shorter is compared item by item (an
# optimizer's param_groups); a longer one (a history of records) as one value, one row.
_VALUE_ITEMS = 16
# The JSON levels of state a diff of values walks down: a save nests at most 100
# containers (MAX_NESTING), each up to three levels deep (a dict of other keys: its
# pairs, a pair), under the few of a checkpoint's own.
_VALUE_DEPTH = 320
_MISSING: Any = object()  # (a key one side has and the other not: None is a value)


@dataclass(frozen=True)
class UnloadedValue:
    """A value ``diff_values`` leaves in the store, said in words: a pickle (a diff never
    unpickles one), a tensor (``diff`` compares those), a device or dtype this torch cannot
    rebuild (another backend's, a newer torch's), or a container holding any of these."""

    description: str

    def __repr__(self) -> str:
        return f"<{self.description}>"


class _ValueRepr(reprlib.Repr):
    """reprlib's short repr, a float's to 6 significant digits (a scheduler's lr
    0.00034549150281252633 as 0.000345492) unless ``exact``."""

    def __init__(self, exact: bool) -> None:
        super().__init__()
        self.exact = exact
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdict = 6
        self.maxstring = self.maxother = 60
        self.maxlevel = 3

    def repr_float(self, value: float, level: int) -> str:
        text = repr(value)
        return text if self.exact or len(text) <= 10 else f"{value:.6g}"


_VALUE_REPRS = {exact: _ValueRepr(exact) for exact in (False, True)}


def diff_value_text(value: Any, width: int = 60, exact: bool = False) -> str:
    """A value of ``diff_values`` in about ``width`` characters, as the CLI and the
    explorer show it: a long list as its first items and its length (a history of
    thousands must not flood the output), a long string cut, a float to 6 significant
    digits unless ``exact``."""
    if isinstance(value, UnloadedValue):
        return value.description
    text = _VALUE_REPRS[exact].repr(value)
    if len(text) > width:
        text = text[: width - 1] + "…"
    if isinstance(value, (list, tuple, set, frozenset, dict)) and len(value) > 6:
        text += f" ({len(value)} {'keys' if isinstance(value, dict) else 'items'})"
    return text


def diff_value_texts(row: Mapping[str, Any], width: int = 60,
                     missing: str = "-") -> tuple[str, str]:
    """A row of ``diff_values`` as the texts of its two values (``missing`` on the side
    without one); floats in all their digits where 6 would read the same."""
    texts = ("", "")
    for exact in (False, True):
        texts = (missing if row["status"] == "added" else
                 diff_value_text(row["a"], width, exact),
                 missing if row["status"] == "removed" else
                 diff_value_text(row["b"], width, exact))
        if texts[0] != texts[1]:
            break
    return texts


def _node_kind(node: Any) -> str:
    """What a node of a manifest's state is, as a diff of values walks it."""
    if isinstance(node, list):
        return "list"
    if not isinstance(node, dict):
        return "scalar"
    if "__pickle__" in node:
        return "pickle"
    if not _TENSOR_TAGS.isdisjoint(node):
        return "tensor"
    if "__state_dict__" in node:
        return "state_dict"
    if "__dict__" in node:
        return "pairs"
    if "__tuple__" in node and node.get("size") is not True:
        return "tuple"
    if any(key.startswith("__") for key in node):  # (a set, a date, a NumPy scalar...)
        return "tagged"
    return "dict"


def _known_device_type(device: str) -> bool:
    """Whether this torch knows a device string's type ("cpu:x" is malformed, and
    "npu:0" another backend's)."""
    try:
        torch.device(device.partition(":")[0])
    except RuntimeError:
        return False
    return True


def _unknown_to_torch(node: Any) -> str | None:
    """The first device or dtype in a node that this torch cannot rebuild, in words: a
    device of a backend not registered here (``torch.device("npu:0")``), a newer torch's
    dtype. Such a value is the store's, not damage; None where the node holds none."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            device, dtype = item.get("__device__"), item.get("__dtype__")
            if isinstance(device, str) and not _known_device_type(device):
                return f"torch.device({reprlib.repr(device)}), a device this torch does not know"
            if isinstance(dtype, str):
                try:
                    dtype_from_name(dtype)
                except StoreFormatError:
                    return f"dtype {reprlib.repr(dtype)[1:-1]}, which this torch " \
                        f"({torch.__version__}) lacks"
            stack.extend(reversed(item.values()))
    return None


def _union(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The keys of both, ``a``'s in its order, then those only ``b`` has."""
    return list(a) + [key for key in b if key not in a]


class ValueSide:
    """One checkpoint in a diff of values: its values by their top paths, and the tensor
    records and stored bytes its nodes point at."""

    def __init__(self, mgr: CheckpointManager, cid: str, manifest: Mapping[str, Any],
                 run_key: str) -> None:
        self.mgr, self.cid, self.manifest = mgr, cid, manifest
        state = manifest.get("state")
        top: dict[str, Any] = {"step": manifest.get("step"), "epoch": manifest.get("epoch"),
                               "batch_idx": manifest.get("batch_idx"),
                               "metrics": manifest.get("metrics") or {}}
        if not isinstance(state, dict):
            raise self.error("state", TypeError(f"it is {type(state).__name__}"))
        for key in ("objects", "types", "extra"):
            node = state.get(key) or {}
            if not isinstance(node, dict):
                raise self.error(key, TypeError(f"it is {type(node).__name__}"))
            top[key] = node
        run = top["extra"].get(run_key) if _node_kind(top["extra"]) == "dict" else None
        if isinstance(run, dict):  # (a notebook session's: its captured variables)
            top["extra"] = {k: v for k, v in top["extra"].items() if k != run_key}
            top["variables"] = run.get("variables", _MISSING)
        self.top = top

    def error(self, path: str, exc: Exception) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"checkpoint {self.cid}: its manifest's {path} is "
                                      f"malformed ({type(exc).__name__}: {exc})", self.cid)

    def record(self, index: Any, path: str) -> dict[str, Any]:
        try:
            record = self.manifest["tensors"][index]
            if type(index) is not int or index < 0 or not isinstance(record, dict):
                raise IndexError(f"no tensor record {index!r}")
            return record
        except (KeyError, IndexError, TypeError) as exc:
            raise self.error(path, exc) from exc

    def chunks(self, index: Any, path: str) -> list[Any]:
        try:
            storage = self.manifest["storages"][index]
            if type(index) is not int or index < 0 or not isinstance(storage["chunks"], list):
                raise IndexError(f"no storage {index!r}")
            return storage["chunks"]
        except (KeyError, IndexError, TypeError) as exc:
            raise self.error(path, exc) from exc

    def stored_bytes(self, index: int) -> torch.Tensor:
        """A storage's bytes as the store holds them (a pickle's: not unpickled)."""
        with self.mgr._reading(self.cid):
            (raw,) = self.mgr._decode_storages(
                self.cid, {"storages": [self.manifest["storages"][index]]})
        return raw

    def pairs(self, node: Mapping[str, Any], path: str) -> dict[str, Any]:
        """A dict stored as its pairs (keys that are not strings: an optimizer's state by
        parameter index), by its keys as a path names them."""
        found: dict[str, Any] = {}
        try:
            for i, (key, value) in enumerate(node["__dict__"]):
                plain = key is None or isinstance(key, (str, int, float, bool))
                found[str(key) if plain else f"<key {i}>"] = value
        except (TypeError, ValueError) as exc:
            raise self.error(path, exc) from exc
        return found

    def value(self, node: Any, path: str) -> Any:
        """A node as ``diff_values`` gives it: its value where it is JSON, else in words."""
        if node is _MISSING:
            return None
        kind = _node_kind(node)
        if kind == "pickle":  # (by its size and digest: two that differ read apart)
            chunks = self.chunks(node["__pickle__"], path)
            try:
                size = sum(n for _, n in chunks)
                digest = hashlib.sha256("".join(d for d, _ in chunks).encode()).hexdigest()
            except (TypeError, ValueError) as exc:
                raise self.error(path, exc) from exc
            return UnloadedValue(f"pickled value ({size} bytes, {digest[:8]})")
        if kind == "tensor":
            return UnloadedValue(self.tensor_text(node, path))
        if self.holds_refs(node, path):
            return UnloadedValue(self.container_text(node, kind, path))
        try:
            return Unflattener([], []).decode(node, path)
        except (CkptError, KeyError, IndexError, TypeError, ValueError, OverflowError,
                RecursionError, RuntimeError) as exc:  # (torch.device's: RuntimeError)
            unknown = _unknown_to_torch(node)
            if unknown is None:
                raise self.error(path, exc) from exc
            itself = isinstance(node, dict) and ("__device__" in node or "__dtype__" in node)
            return UnloadedValue(unknown if itself else f"value holding {unknown}")

    def container_text(self, node: Any, kind: str, path: str) -> str:
        """A container that holds tensors or pickles, in words."""
        if kind in ("list", "tuple"):
            return f"{kind} of {len(self.items(node, path))} items"
        if kind == "pairs":
            pairs = self.pairs(node, path)
            frame = pairs.get("__frame__")
            if frame is not None:
                return f"pandas {'Series' if frame == 'series' else 'DataFrame'}"
            return f"dict of {len(pairs)} keys"
        if kind == "dict":
            return f"dict of {len(node)} keys"
        if kind == "state_dict":
            return "module state"
        return "value holding tensors or pickles"

    def items(self, node: Any, path: str) -> list[Any]:
        """A list's or tuple's items."""
        items = node if isinstance(node, list) else node.get("__tuple__")
        if not isinstance(items, list):
            raise self.error(path, TypeError(f"a tuple of {type(items).__name__}"))
        return items

    def tensor_text(self, node: Mapping[str, Any], path: str) -> str:
        for tag in ("__quantized__", "__sparse__", "__nested__"):
            if tag in node:
                return f"{tag.strip('_')} tensor"
        if "__generator__" in node:
            return "torch.Generator state"
        tag = next(iter(_TENSOR_INDEXES.intersection(node)))
        record = self.record(node[tag], path)
        shape = record.get("shape")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise self.error(path, TypeError(f"a tensor's shape is {reprlib.repr(shape)}"))
        count = math.prod(shape)
        if tag == "__floats__":
            return f"list of {count} floats (a tensor: see diff)"
        if tag == "__bytes__":
            return f"{count} bytes (a tensor: see diff)"
        dims = "x".join(map(str, shape)) if shape else "scalar"
        kind = "array" if tag == "__ndarray__" else "tensor"
        return f"{kind} {dims} {record.get('dtype')}"

    def holds_refs(self, node: Any, path: str) -> bool:
        """Whether a node holds a tensor or a pickle anywhere (walked without recursion:
        a node may be as deep as a damaged manifest makes it)."""
        stack = [(node, 0)]
        while stack:
            item, depth = stack.pop()
            if depth > _VALUE_DEPTH:
                raise self.error(path, ValueError("nested deeper than a save writes"))
            if isinstance(item, dict):
                if "__pickle__" in item or not _TENSOR_TAGS.isdisjoint(item):
                    return True
                stack.extend((v, depth + 1) for v in item.values())
            elif isinstance(item, list):
                stack.extend((v, depth + 1) for v in item)
        return False


class ValueDiff:
    """The rows of ``diff_values``: the two sides' values walked together, path by path."""

    def __init__(self, a: ValueSide, b: ValueSide) -> None:
        self.a, self.b = a, b
        self.found: list[dict[str, Any]] = []

    def rows(self) -> list[dict[str, Any]]:
        for key in _union(self.a.top, self.b.top):
            self.walk(key, self.a.top.get(key, _MISSING), self.b.top.get(key, _MISSING), 0)
        return self.found

    def walk(self, path: str, na: Any, nb: Any, depth: int) -> None:
        if na is _MISSING and nb is _MISSING:
            return
        if depth > _VALUE_DEPTH:
            side = self.a if isinstance(na, (dict, list)) else self.b
            raise side.error(path, ValueError("nested deeper than a save writes"))
        ka, kb = _node_kind(na), _node_kind(nb)
        if na is _MISSING or nb is _MISSING:
            if "tensor" not in (ka, kb):  # (diff's rows have an added tensor)
                self.row(path, "added" if na is _MISSING else "removed", na, nb)
            return
        if ka != kb:
            self.row(path, "changed", na, nb)
            return
        if ka == "tensor":
            return
        if ka == "dict":
            for key in _union(na, nb):
                self.walk(f"{path}/{key}", na.get(key, _MISSING), nb.get(key, _MISSING),
                          depth + 1)
            return
        if ka == "state_dict":  # (a module's: its tensors, and the versions of its parts)
            self.walk(path, na["__state_dict__"], nb["__state_dict__"], depth + 1)
            self.walk(f"{path}/_metadata", na.get("metadata", _MISSING),
                      nb.get("metadata", _MISSING), depth + 1)
            return
        if ka == "pairs":
            pa, pb = self.a.pairs(na, path), self.b.pairs(nb, path)
            if na.get("type") == nb.get("type") and "__frame__" not in pa and \
                    "__frame__" not in pb:
                for key in _union(pa, pb):
                    self.walk(f"{path}/{key}", pa.get(key, _MISSING), pb.get(key, _MISSING),
                              depth + 1)
                return
        if ka in ("list", "tuple"):
            ia, ib = self.a.items(na, path), self.b.items(nb, path)
            # (item by item where an item is a container, or one this torch cannot
            # rebuild: whole, [npu:0, 0] and [npu:0, 1] read the same in words)
            if max(len(ia), len(ib)) <= _VALUE_ITEMS and any(
                    _node_kind(v) not in ("scalar", "tagged") or _unknown_to_torch(v)
                    for v in ia + ib):
                for i in range(max(len(ia), len(ib))):
                    self.walk(f"{path}/{i}", ia[i] if i < len(ia) else _MISSING,
                              ib[i] if i < len(ib) else _MISSING, depth + 1)
                return
        if not self.same(na, nb, path, depth):
            self.row(path, "changed", na, nb)

    def row(self, path: str, status: str, na: Any, nb: Any) -> None:
        self.found.append({"path": path, "status": status, "a": self.a.value(na, path),
                           "b": self.b.value(nb, path)})

    def same(self, na: Any, nb: Any, path: str, depth: int) -> bool:
        """Whether two nodes hold the same value: JSON by its types and values (1 is not
        1.0 nor True), a pickle by its stored bytes, a tensor by its view and chunks."""
        if depth > _VALUE_DEPTH:
            raise self.a.error(path, ValueError("nested deeper than a save writes"))
        if type(na) is not type(nb):
            return False
        if isinstance(na, list):
            return len(na) == len(nb) and all(self.same(x, y, path, depth + 1)
                                              for x, y in zip(na, nb))
        if not isinstance(na, dict):
            return na == nb or (isinstance(na, float) and math.isnan(na) and math.isnan(nb))
        if na.keys() != nb.keys():
            return False
        for key, va in na.items():
            vb = nb[key]
            if key == "__pickle__":
                same = self.same_pickle(va, vb, path)
            elif key in _TENSOR_INDEXES and type(va) is int:
                ra, rb = self.a.record(va, path), self.b.record(vb, path)
                view = [k for k in _union(ra, rb) if k not in ("name", "storage")]
                same = all(ra.get(k) == rb.get(k) for k in view) and \
                    self.a.chunks(ra.get("storage"), path) == self.b.chunks(rb.get("storage"),
                                                                            path)
            else:
                same = self.same(va, vb, path, depth + 1)
            if not same:
                return False
        return True

    def same_pickle(self, ia: Any, ib: Any, path: str) -> bool:
        """Two pickles the same by their bytes, never unpickled: by their chunks' digests,
        read only where the two were cut into chunks of other sizes (a chunk_size
        changed between the saves)."""
        ca, cb = self.a.chunks(ia, path), self.b.chunks(ib, path)
        if ca == cb:
            return True
        try:
            sizes_a, sizes_b = [n for _, n in ca], [n for _, n in cb]
        except (TypeError, ValueError) as exc:
            raise self.a.error(path, exc) from exc
        if sizes_a == sizes_b or sum(sizes_a) != sum(sizes_b):
            return False
        return torch.equal(self.a.stored_bytes(ia), self.b.stored_bytes(ib))
