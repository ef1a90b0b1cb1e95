"""The on-store layout: pack files of chunk blobs, and JSON manifests.

    ckpt_nb.json                 {"format": 3}
    packs/<hex>.pack             b"CKNBPAK1" | blobs ... | index JSON | u64 len | b"CKNBIDX1"
    manifests/<id>.json.zst      one checkpoint's tensors, chunks and JSON state (a zstd
                                 frame with its content checksum; none before it came)
    labels/<id>.json             what changed after its save: pin, note, a parent deleted
    runs/<run id>.json           where a notebook cell's run ended, and its checkpoints
                                 on the path to each end (``_session``), a run at a time
    deleted/<hex>.json           {"ids": [...]}: one deletion, the checkpoints it took

A checkpoint's new chunks go into one pack, written and fsynced once: one
durable write per save, however many tensors. The packs' trailing indexes, the
manifests and the labels make the catalog rebuildable from the store alone
(``_rebuild``), the deletion records telling it which manifests gc has yet to delete
(a deletion is recorded before the catalog forgets the checkpoints, and its record goes
once their manifests have); the run files are no part of the catalog, and outlive its
rebuild. Deletion records need no new format: a ckpt_nb from before them lists and
deletes none of them (it reads only the folders above), and reads the store as before.

Format 2 adds CKB2 chunk blobs (they carry an xxh3 checksum, see ``_codec``);
format 3 adds state nodes for module versions (``state_dict()._metadata``),
quantized and sparse tensors, sets, bytes, complex numbers, generators, dict
types, long lists of floats as float64 bytes, and the lazy conjugate / negative
bits of a tensor record (see ``_capture``), which a format-2 reader would
misread. Older stores are read as they are, and restamped by the first save
into them. Labels came in format 3 too (after its first release): a store saved
before them held its pins and notes in its catalog alone, and the manager writes
them as labels the first time it opens that catalog to write, so that a catalog
rebuilt later keeps them. A manifest of format 4 holds nodes that a format-3
reader from before them would misread as plain dicts: nested tensors, long lists
of floats as bytes, and paths, dates, decimals, UUIDs and the like
(``_stdlib_values``); the store's own format stays 3 (see ``MANIFEST_FORMAT``). One of
format 5 holds the state of NumPy's global generator with a bit generator other than
MT19937 (``np.random.set_bit_generator``), which a format-4 reader looked for in vain
under "numpy" halfway through a resume (``_capture.NUMPY_BIT_GENERATOR``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import struct
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import zstandard

from ._catalog import ChunkRow
from ._errors import CaptureError, CorruptCheckpointError, StoreFormatError
from ._store import Store, Writer, local_root

FORMAT = 3
# The newest manifest this reader takes. A manifest is written at the lowest format its
# state needs (4: nested tensors' nodes; 5: a NumPy RNG state of another bit generator than
# MT19937), so that an earlier reader refuses by name the checkpoints it would misread, and
# reads the rest of the store.
MANIFEST_FORMAT = 5
FORMAT_KEY = "ckpt_nb.json"
PACK_MAGIC = b"CKNBPAK1"
INDEX_MAGIC = b"CKNBIDX1"
_U64 = struct.Struct("<Q")
_ID = re.compile(r"[0-9a-f]{6,32}")


def check_format(store: Store) -> int:
    """Stamp a new store with the format; refuse one written by a newer ckpt_nb.

    Returns the format found, so that an older store is restamped only when
    something new is written to it (``stamp_format``): opening never writes. A
    store in a folder this process cannot write is read without a stamp (it opens
    to read only: stamping it failed the open).
    """
    if not store.has(FORMAT_KEY):
        root = local_root(store)
        if root is None or not root.is_dir() or os.access(root, os.W_OK):
            stamp_format(store)
        return FORMAT
    try:
        stamp = json.loads(store.get(FORMAT_KEY))
    except (ValueError, RecursionError) as exc:
        raise _unreadable_stamp(store, f"it is not JSON: {exc}") from exc
    found = stamp.get("format") if isinstance(stamp, dict) else None
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        try:
            shown = json.dumps(stamp)
        except RecursionError:  # (nested too deep to write out)
            shown = "a nested value"
        raise _unreadable_stamp(store, "it reads " + (
            shown if len(shown) <= 60 else shown[:57] + "..."))
    if found > FORMAT:
        raise StoreFormatError(
            f"the store at {store.url} has format {found}; this ckpt_nb reads up to "
            f"format {FORMAT}: upgrade ckpt_nb (pip install -U ckpt_nb) to open it"
        )
    return found


def _unreadable_stamp(store: Store, why: str) -> StoreFormatError:
    """A damaged ``ckpt_nb.json``, said with what it should hold (it said Python's
    ``'format'`` for a missing key)."""
    return StoreFormatError(
        f"{store.url}/{FORMAT_KEY} is unreadable ({why}): it should read {{\"format\": N}}, "
        f"N the store's format, a whole number from 1 (this ckpt_nb writes {FORMAT}); "
        f"restore the file, or write {{\"format\": {FORMAT}}} where this ckpt_nb wrote the "
        "store")


def stamp_format(store: Store) -> None:
    store.put(FORMAT_KEY, json.dumps({"format": FORMAT}).encode())


def new_pack_key() -> str:
    return f"packs/{uuid.uuid4().hex}.pack"


def is_pack_key(key: str) -> bool:
    """Whether ``key`` is a name ``new_pack_key`` makes: gc deletes no other file."""
    return _PACK_KEY.fullmatch(key) is not None


_PACK_KEY = re.compile(r"packs/[0-9a-f]{32}\.pack")
_DIGEST = re.compile(r"[0-9a-f]{64}")


def new_deletion_key() -> str:
    """Where a deletion's record goes (``_manager``'s ``_drop``): one file per deletion,
    so that it names all the checkpoints it takes at once, or none."""
    return f"deleted/{uuid.uuid4().hex}.json"


def is_deletion_key(key: str) -> bool:
    """Whether ``key`` is a name ``new_deletion_key`` makes: gc deletes no other file."""
    return _DELETION_KEY.fullmatch(key) is not None


_DELETION_KEY = re.compile(r"deleted/[0-9a-f]{32}\.json")


def manifest_key(checkpoint_id: str) -> str:
    return f"manifests/{_checked_id(checkpoint_id)}.json.zst"


def label_key(checkpoint_id: str) -> str:
    return f"labels/{_checked_id(checkpoint_id)}.json"


# The key of a checkpoint's ``extra`` under which a session saves its run record (its
# notebook variables under "variables"): a name of the format, which restores (``_manager``)
# and sessions (``_session``) both read.
RUN_KEY = "ckpt_nb_run"


def run_key(run_id: str) -> str:
    """Where the ends of a run of ``%%ckpt_auto`` (``auto()``) are noted."""
    if not _ID.fullmatch(run_id):
        raise CorruptCheckpointError(f"invalid run id {run_id!r} in a checkpoint's run record")
    return f"runs/{run_id}.json"


def is_run_key(key: str) -> bool:
    """Whether ``key`` is a name ``run_key`` makes: gc deletes no other file."""
    return _RUN_FILE.fullmatch(key) is not None


_RUN_FILE = re.compile(r"runs/[0-9a-f]{6,32}\.json")


def id_of(key: str) -> str | None:
    """The checkpoint a manifest's or a label's key names (None for any other key)."""
    for folder, suffix in (("manifests/", ".json.zst"), ("labels/", ".json")):
        if key.startswith(folder) and key.endswith(suffix):
            name = key[len(folder) : -len(suffix)]
            return name if _ID.fullmatch(name) else None
    return None


def is_checkpoint_id(value: object) -> bool:
    """Whether ``value`` is an id a save makes."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def _checked_id(checkpoint_id: str) -> str:
    if not _ID.fullmatch(checkpoint_id):
        raise CorruptCheckpointError(f"invalid checkpoint id {checkpoint_id!r}")
    return checkpoint_id


@dataclass
class PackWriter:
    """Appends blobs to one pack; ``rows`` says where each landed.

    Blobs are gathered and written a few MiB at a time, in one ``write_many``
    where the writer has it: a system call per blob part cost more, in waits
    for the GIL on the way back, than the writing itself.
    """

    key: str
    out: Writer
    offset: int = len(PACK_MAGIC)
    rows: list[ChunkRow] = field(default_factory=list)
    _pending: list[bytes | memoryview] = field(default_factory=list, init=False, repr=False)
    _pending_bytes: int = field(default=0, init=False, repr=False)

    GATHER_BYTES: ClassVar[int] = 4 << 20

    def add(self, digest: str, blob: bytes | memoryview | list[bytes | memoryview], raw_len: int,
            base: str | None, depth: int) -> None:
        """Append one blob, given whole or as the pieces ``codec.encode_parts`` made.

        The pieces must not change until the pack is written out (``flush``).
        """
        parts = blob if isinstance(blob, list) else [blob]
        length = sum(memoryview(part).nbytes for part in parts)
        self._pending.extend(parts)
        self._pending_bytes += length
        if self._pending_bytes >= self.GATHER_BYTES:
            self.flush()
        self.rows.append(ChunkRow(digest, self.key, self.offset, length, raw_len, base, depth))
        self.offset += length

    def flush(self) -> None:
        """Write out the blobs gathered so far."""
        write_many = getattr(self.out, "write_many", None)
        if write_many is not None:
            write_many(self._pending)
        else:
            for part in self._pending:
                self.out.write(part)
        self._pending.clear()
        self._pending_bytes = 0


@contextmanager
def write_pack(store: Store) -> Iterator[PackWriter]:
    """A pack that becomes visible, index and all, when the block exits cleanly."""
    key = new_pack_key()
    with store.writer(key) as out:
        out.write(PACK_MAGIC)
        pack = PackWriter(key, out)
        yield pack
        pack.flush()
        index = _pack_index(pack.rows)
        out.write(index)
        out.write(_U64.pack(len(index)))
        out.write(INDEX_MAGIC)


def _pack_index(rows: list[ChunkRow]) -> bytes:
    """A pack's trailing index, as ``write_pack`` writes it."""
    return json.dumps([[r.digest, r.offset, r.length, r.raw_len, r.base, r.depth]
                       for r in rows]).encode()


def pack_size(rows: list[ChunkRow]) -> int:
    """The bytes of the pack ``write_pack`` wrote with these rows, known without asking
    the store (a byte budget counts what each save adds)."""
    blobs = max((r.offset + r.length for r in rows), default=len(PACK_MAGIC))
    return blobs + len(_pack_index(rows)) + _U64.size + len(INDEX_MAGIC)


def read_pack_index(store: Store, key: str) -> list[ChunkRow]:
    """The chunks a pack holds, from its own trailing index."""
    size = store.size(key)
    if size < len(PACK_MAGIC) + 16:
        store.get(key, 0, len(PACK_MAGIC))  # (a FIFO or a device there is named as such)
        raise CorruptCheckpointError(f"pack {key} has no index (it was cut short)")
    tail = store.get(key, size - 16, size)
    if len(tail) != 16 or tail[8:] != INDEX_MAGIC:
        raise CorruptCheckpointError(f"pack {key} has no index (it was cut short)")
    (length,) = _U64.unpack(tail[:8])
    end = size - 16 - length  # where the blobs end and the index starts
    if end < len(PACK_MAGIC):
        raise CorruptCheckpointError(f"pack {key}: its index is damaged (its length points "
                                     "before the pack's start)")
    try:
        rows = [ChunkRow(d, key, o, n, r, b, depth)
                for d, o, n, r, b, depth in json.loads(store.get(key, end, size - 16))]
    except (ValueError, TypeError) as exc:  # (a JSON error is a ValueError)
        raise CorruptCheckpointError(f"pack {key}: its index is damaged ({exc})") from exc
    for row in rows:
        if not (isinstance(row.digest, str) and isinstance(row.offset, int)
                and isinstance(row.length, int) and len(PACK_MAGIC) <= row.offset
                and 0 < row.length <= end - row.offset):
            raise CorruptCheckpointError(f"pack {key}: its index is damaged (a chunk lies "
                                         "outside the pack's blobs)")
        if not (is_count(row.raw_len) and is_count(row.depth)
                and (row.base is None or isinstance(row.base, str) and row.base != row.digest)):
            raise CorruptCheckpointError(f"pack {key}: its index is damaged (chunk "
                                         f"{str(row.digest)[:12]}'s length, base or depth)")
    return rows


def chunk_row_problem(row: ChunkRow) -> str | None:
    """What in a chunk's catalog row is not what a save writes, if anything: a row read
    from a damaged catalog names no file outside the packs, and sizes no buffer."""
    if not (isinstance(row.digest, str) and _DIGEST.fullmatch(row.digest)):
        return "its digest"
    if not (isinstance(row.pack, str) and is_pack_key(row.pack)):
        return f"its pack's name {row.pack!r}"
    if not (is_count(row.offset) and is_count(row.length) and is_count(row.raw_len)
            and is_count(row.depth) and row.offset >= len(PACK_MAGIC) and row.length > 0):
        return "its offset, length, size or depth"
    if row.base is not None and not (isinstance(row.base, str) and _DIGEST.fullmatch(row.base)):
        return "its delta base"
    return None


def is_count(value: object) -> bool:
    """A count a record holds: a whole number, not negative (and not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_int64(value: object) -> bool:
    """A whole number (not a bool) SQLite holds: an epoch, a step, a batch index."""
    return isinstance(value, int) and not isinstance(value, bool) and \
        -(1 << 63) <= value < 1 << 63


# A manifest is JSON of a few hundred bytes a tensor, and the plain values saved (a long
# string of a notebook's, say): a save refuses one whose parsed value would take over 4 GiB
# (``parse_cost``), so a frame that takes more is damage, not a manifest to allocate memory
# for. Its bytes alone do not bound that: a list of zeros parses into 4 times its JSON, a
# list of empty dicts 24 times, and a 115 KB frame of 1.2 GB of zeros took 5 GB to read.
MANIFEST_LIMIT = 4 << 30
# What parsing JSON takes in CPython (3.11, measured with tracemalloc), at most, for
# each byte that starts or ends a value, a list, an object or a dict entry: a list's slot and
# an int or a float 40, a string 2 x 28 and its text, a dict entry's new key 110 (with the
# decoder's memo of keys), an empty list 63 + 25 where CPython takes 56 (88 with an item).
# JSON of up to ``_UNCOUNTED`` bytes cannot take more than the limit, and is not counted.
_PARSE_COSTS = {b",": 40, b":": 110, b'"': 28, b"[": 63, b"{": 63, b"]": 25, b"}": 25}
_UNCOUNTED = MANIFEST_LIMIT // (1 + max(_PARSE_COSTS.values()))


def parse_cost(text: bytes | bytearray) -> int:
    """An upper bound of the bytes the value ``json.loads(text)`` returns takes, from the
    counts of the bytes that make its values (those inside strings too: an overestimate,
    which a few hundred commas in a long string do not change)."""
    return len(text) + sum(text.count(byte) * cost for byte, cost in _PARSE_COSTS.items())


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    text = json.dumps(manifest).encode()
    if len(text) > _UNCOUNTED and (cost := parse_cost(text)) > MANIFEST_LIMIT:
        raise CaptureError(f"the checkpoint's plain values take {len(text) >> 20} MiB as JSON, "
                           f"which would take up to {cost >> 20} MiB of memory to read back, "
                           f"over the {MANIFEST_LIMIT >> 30} GiB a manifest may: keep large "
                           "values (long strings, long lists of numbers) as tensors, NumPy "
                           "arrays or bytes, which are stored as raw bytes")
    # With the frame's content checksum: a manifest's own check, where no catalog holds its
    # digest (a rebuilt one reads the digest off the file). Any zstd reader checks it (a
    # ckpt_nb from before it too), and reads a manifest written without it as before.
    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(text)


def decode_manifest(data: bytes, checkpoint_id: str) -> dict[str, Any]:
    """A manifest, its frame of storages and chunks checked (what a read trusts to size
    and place the bytes it decodes)."""
    try:
        text = _inflate(data).decode()  # (its bytes freed before the parse: GBs, maybe)
        manifest = json.loads(text)
        del text
        problem = _manifest_problem(manifest)
    except (zstandard.ZstdError, ValueError, RecursionError) as exc:
        raise CorruptCheckpointError(
            f"manifest of checkpoint {checkpoint_id} is unreadable: {exc}", checkpoint_id
        ) from exc
    except MemoryError as exc:  # (as a damaged one, so "latest", verify and a rebuild go on)
        raise CorruptCheckpointError(
            f"manifest of checkpoint {checkpoint_id} is unreadable: it does not fit in this "
            "process's memory (the manifest is damaged, or was saved where there was more "
            "memory: read it there)", checkpoint_id) from exc
    if problem:
        raise CorruptCheckpointError(
            f"checkpoint {checkpoint_id}: its manifest is damaged ({problem})", checkpoint_id)
    if manifest.get("format", 0) > MANIFEST_FORMAT:  # (as check_format says of a store's)
        raise StoreFormatError(
            f"checkpoint {checkpoint_id} has format {manifest['format']}, written by a newer "
            f"ckpt_nb; this ckpt_nb reads up to format {MANIFEST_FORMAT}: upgrade ckpt_nb "
            "(pip install -U ckpt_nb) to open it; the store's other checkpoints still read "
            "('latest' skips this one)"
        )
    return manifest


def _inflate(data: bytes) -> bytes | bytearray:
    """A manifest's frame decompressed, refused past ``MANIFEST_LIMIT`` (what its JSON would
    take to read, ``parse_cost``) before that memory is taken: a frame over ``_UNCOUNTED``
    bytes, or one that does not say its size, is read and counted a piece at a time."""
    size = zstandard.frame_content_size(data)
    if size > MANIFEST_LIMIT:
        raise ValueError(f"it claims {size} bytes, more than any manifest")
    if 0 <= size <= _UNCOUNTED:
        return zstandard.ZstdDecompressor().decompress(data)
    text, cost = bytearray(), 0
    with zstandard.ZstdDecompressor().stream_reader(data) as reader:
        while part := reader.read(16 << 20):
            text += part
            cost += parse_cost(part)
            if cost > MANIFEST_LIMIT:
                raise ValueError(f"it holds more than any manifest: {len(text) >> 20} MiB of "
                                 f"JSON so far, which would take over {cost >> 20} MiB of "
                                 "memory to read")
    return text


def _manifest_problem(manifest: Any) -> str | None:
    """What is wrong with a decoded manifest's frame, if anything: its storages, and
    its tensors' places in them."""
    if not isinstance(manifest, dict):
        return f"it holds a {type(manifest).__name__}, not an object"
    if not is_count(manifest.get("format", 0)):
        return f"its format is {manifest.get('format')!r}"
    storages, tensors = manifest.get("storages"), manifest.get("tensors")
    if not isinstance(storages, list) or not isinstance(tensors, list) or \
            not all(isinstance(t, dict) for t in tensors) or \
            not isinstance(manifest.get("state"), dict):
        return "its storages, tensors or state are missing"
    if not _storages_fit(storages):
        return "a storage's chunks do not add up to its size"
    return _tensors_problem(tensors, storages)


def _storages_fit(storages: list[Any]) -> bool:
    """Whether every storage's chunks are digests and sizes that add up to its size.

    A fast path for what a save writes (exact ints, 64-character digests checked as one
    string: a manifest may hold 60,000 storages); anything else is judged by
    ``_storage_fits`` alone."""
    digests: list[str] = []
    for storage in storages:
        if type(storage) is dict and type(chunks := storage.get("chunks")) is list and \
                type(nbytes := storage.get("nbytes")) is int and nbytes >= 0 and \
                type(storage.get("name")) is str:
            total = 0
            for chunk in chunks:
                if not (type(chunk) is list and len(chunk) == 2 and type(chunk[0]) is str
                        and len(chunk[0]) == 64 and type(chunk[1]) is int and chunk[1] >= 0):
                    break
                digests.append(chunk[0])
                total += chunk[1]
            else:
                if total == nbytes:
                    continue
        if not _storage_fits(storage):
            return False
    return _HEX.fullmatch("".join(digests)) is not None or all(map(_storage_fits, storages))


_HEX = re.compile(r"[0-9a-f]*")


def _storage_fits(storage: Any) -> bool:
    """Whether a storage's chunks are digests and sizes that add up to its size."""
    chunks = storage.get("chunks") if isinstance(storage, dict) else None
    return (isinstance(chunks, list) and is_count(storage.get("nbytes"))
            and isinstance(storage.get("name"), str)
            and all(isinstance(c, list) and len(c) == 2 and isinstance(c[0], str)
                    and _DIGEST.fullmatch(c[0]) is not None and is_count(c[1]) for c in chunks)
            and sum(c[1] for c in chunks) == storage["nbytes"])


_INT64_END = 1 << 63


def _tensors_problem(tensors: list[dict[str, Any]], storages: list[dict[str, Any]]) -> str | None:
    """What is wrong with the first tensor that does not fit in its storage, if any.

    A fast path for what a save writes (exact ints in range, a known dtype, within its
    storage), under 1 us a tensor where ``_tensor_problem`` takes 3: a manifest may
    hold 60,000 tensors. It only accepts; any tensor it does not is judged, and named, by
    ``_tensor_problem``."""
    nbytes_of = {index: storage["nbytes"] for index, storage in enumerate(storages)
                 if storage.get("kind", "tensor") == "tensor"}
    itemsizes: dict[str, int | None] = {}
    for index, tensor in enumerate(tensors):
        storage, offset = tensor.get("storage"), tensor.get("offset")
        shape, stride, dtype = tensor.get("shape"), tensor.get("stride"), tensor.get("dtype")
        if type(storage) is int and type(offset) is int and 0 <= offset < _INT64_END and \
                type(shape) is list and type(stride) is list and len(shape) == len(stride) \
                and type(dtype) is str:
            nbytes = nbytes_of.get(storage)
            itemsize = itemsizes[dtype] if dtype in itemsizes else \
                itemsizes.setdefault(dtype, _itemsize(dtype))
            numel, end = 1, offset + 1
            for size, step in zip(shape, stride):
                if not (type(size) is int and type(step) is int and 0 <= size < _INT64_END
                        and 0 <= step < _INT64_END):
                    break
                numel *= size
                if numel >= _INT64_END:
                    break
                end += step * (size - 1)
            else:
                if nbytes is not None and itemsize is not None and \
                        (not numel or end * itemsize <= nbytes):
                    continue
        problem = _tensor_problem(tensor, storages)
        if problem:
            return f"tensor {index} ({str(tensor.get('name'))[:80]!r}): {problem}"
    return None


def _tensor_problem(tensor: dict[str, Any], storages: list[dict[str, Any]]) -> str | None:
    """What in a tensor's record does not fit in its storage, if anything: torch refuses
    such a view with a bare error, at a read; checked with the manifest, ``verify()`` and
    a rebuilt catalog name the checkpoint too."""
    index = tensor.get("storage")
    if not (is_count(index) and index < len(storages)):
        return f"its storage {index!r} is not one of the {len(storages)} it has"
    storage = storages[index]
    if storage.get("kind", "tensor") != "tensor":
        return f"its storage {index} holds a pickle, not a tensor's bytes"
    offset, shape, stride = tensor.get("offset"), tensor.get("shape"), tensor.get("stride")
    if not (isinstance(shape, list) and isinstance(stride, list) and len(shape) == len(stride)
            and all(is_count(n) and n < _INT64_END for n in (offset, *shape, *stride))):
        return (f"its offset {offset!r}, shape {shape!r} and stride {stride!r} are not "
                "whole numbers from 0, with a stride for each size")
    numel = 1
    for size in shape:  # (as torch counts, where a product past 64 bits is refused)
        numel *= size
        if numel >> 64:
            break
    if numel >= _INT64_END:
        return f"its shape {shape} holds more elements than a tensor can"
    dtype = tensor.get("dtype")
    if not isinstance(dtype, str):
        return f"its dtype {dtype!r} is not a name"
    itemsize = _itemsize(dtype)
    if itemsize is None:  # (a newer torch's dtype: the read names it, as a format)
        return None
    end = offset + 1 + sum(step * (size - 1) for size, step in zip(shape, stride))
    if numel and end * itemsize > storage["nbytes"]:
        return (f"its elements reach {end * itemsize} bytes into its storage {index}, "
                f"which holds {storage['nbytes']}")
    return None


# Bytes per element of the dtypes torch 2.13 names, so that checking a manifest needs no
# torch, whose import takes seconds (the CLI's ls, show and verify never import it).
_ITEMSIZES = {
    **dict.fromkeys(("bool", "uint8", "int8", "quint8", "qint8", "quint4x2", "quint2x4",
                     "bits8", "bits1x8", "bits2x4", "bits4x2", "float8_e4m3fn",
                     "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
                     "float4_e2m1fn_x2", *(f"{kind}{bits}" for kind in ("int", "uint")
                                           for bits in range(1, 8))), 1),
    **dict.fromkeys(("int16", "uint16", "float16", "bfloat16", "bits16"), 2),
    **dict.fromkeys(("int32", "uint32", "float32", "qint32", "complex32"), 4),
    **dict.fromkeys(("int64", "uint64", "float64", "complex64"), 8),
    "complex128": 16,
}


@functools.lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int | None:
    """The bytes of an element of a dtype a manifest names; None where this torch lacks it
    (a newer torch's: looked up in this torch, which it imports)."""
    if dtype in _ITEMSIZES:
        return _ITEMSIZES[dtype]
    from ._capture import dtype_from_name

    try:
        return dtype_from_name(dtype).itemsize
    except StoreFormatError:
        return None


def has_pickle(skeleton: Any) -> bool:
    """Whether a manifest's state holds a pickled value anywhere."""
    if isinstance(skeleton, dict):
        return "__pickle__" in skeleton or any(has_pickle(v) for v in skeleton.values())
    if isinstance(skeleton, list):
        return any(has_pickle(v) for v in skeleton)
    return False


def pickle_problem(state: Any, storages: list[dict[str, Any]]) -> str | None:
    """A pickle node of a manifest's state that names no pickle's storage, if any:
    checked before a read with ``trust_pickle`` unpickles anything (a tensor's bytes, or
    none, are no pickle of the store's). Not part of ``decode_manifest``: a read without
    ``trust_pickle`` leaves such a value unloaded, as ``diff_values`` names it, and a
    walk of a notebook's long lists costs as much as their parse. Walked without
    recursion: the state may be nested as deep as JSON reads."""
    todo: list[Any] = [state]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if "__pickle__" in node:
                index = node["__pickle__"]
                if not (is_count(index) and index < len(storages)
                        and storages[index].get("kind", "pickle") == "pickle"):
                    return f"a pickled value's storage {index!r} holds no pickle"
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return None
