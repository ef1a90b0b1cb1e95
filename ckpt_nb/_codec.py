"""Pure functions that turn raw chunk bytes into stored blobs and back.

A blob is self-describing::

    magic | u8 delta | u8 itemsize | u8 nstreams | u8 reserved | u64 raw_len
    | [CKB2 only: 16-byte xxh3-128 of the raw bytes, 8-byte head of their digest]
    | [32-byte base digest, when delta] | nstreams x (u8 method, u64 length) | payloads

The raw bytes (XORed with the base chunk for a delta) are split into
``itemsize`` byte-grouped streams: byte i of every element goes to stream i, so
the slowly varying sign/exponent bytes of floats sit together and compress,
while mantissa bytes, which never compress, are stored raw at memcpy speed.
Content addresses are blake3 digests of the raw (not encoded) bytes. A CKB2
blob also carries an xxh3-128 checksum of its raw bytes, which ``decode_many``
checks at ~25 GB/s (blake3 runs at ~4), so a restore need not re-hash with
blake3, and the head of their digest, which ties the blob to the name it is
read under. CKB1 blobs (format 1 stores) are still read and checked by digest.
"""

from __future__ import annotations

import struct
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import blake3
import numpy as np
import xxhash
import zstandard

from . import _native
from ._buffers import fill, scratch
from ._errors import CorruptCheckpointError

MAGIC_V1 = b"CKB1"
MAGIC = b"CKB2"
_HEADER = struct.Struct("<4sBBBBQ")
_STREAM = struct.Struct("<BQ")
RAW, ZSTD = 0, 1
DIGEST_BYTES = 32
CHECK_BYTES = 16
NAME_BYTES = 8
# A compressed stream is kept only when it is smaller than this fraction of raw.
# A long stream is first probed on a sample and compressed only where that gains
# 8%: mantissa bytes never compress, and Adam's, at 4%, are not worth zstd's time.
_KEEP_RATIO = 0.97
_PROBE_BYTES = 8192
_PROBE_RATIO = 0.92
CODECS = ("zstd", "none")
_LITTLE = sys.byteorder == "little"
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}

_local = threading.local()

Parts = list[bytes | memoryview]


def digest(data: memoryview | bytes | np.ndarray) -> str:
    """The content address of raw bytes: blake3, hex."""
    return blake3.blake3(data).hexdigest()


def checksum(data: memoryview | bytes | np.ndarray) -> bytes:
    """The fast integrity check of raw bytes a CKB2 blob carries: xxh3-128."""
    return xxhash.xxh3_128_digest(data)


@dataclass(frozen=True)
class BlobInfo:
    """What a blob's header says."""

    raw_len: int
    itemsize: int
    base: str | None  # hex digest of the chunk this is a delta against
    check: bytes | None = None  # xxh3-128 of the raw bytes (CKB2 blobs)
    name: bytes | None = None  # the first bytes of their digest (CKB2 blobs)


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(compression_params=_params(level))
    return cache[level]


def _params(level: int) -> zstandard.ZstdCompressionParameters:
    """zstd settings for byte-grouped tensor streams.

    At level 1, long minimum matches and tiny match tables leave the exponent
    stream to the entropy coder, which is what compresses it: on MiniLM's
    exponent bytes 8% smaller than plain level 1, and 2-3x faster both ways
    (hash_log 12 -> 6 alone: 4% smaller, 2x faster).
    """
    if level <= 1:
        return zstandard.ZstdCompressionParameters.from_level(
            level, min_match=7, window_log=17, hash_log=6, chain_log=6)
    return zstandard.ZstdCompressionParameters.from_level(level)


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def _decompress_into(payload: memoryview, row: np.ndarray, *, whole: bool = True) -> None:
    """Decompress one zstd frame into ``row``, which it must fill; with ``whole``
    the frame must also end there (else ``row`` takes just its head)."""
    target = memoryview(row)
    try:
        reader = _decompressor().stream_reader(payload, read_across_frames=False)
        if fill(reader, target) != len(target) or (whole and reader.read(1)):
            raise CorruptCheckpointError("chunk blob stream has the wrong length")
    except zstandard.ZstdError as exc:
        raise CorruptCheckpointError(f"chunk blob does not decompress: {exc}") from exc


def _group(raw: np.ndarray, itemsize: int, out: np.ndarray | None = None,
           base: np.ndarray | None = None) -> np.ndarray:
    """Byte i of every element (of raw XOR ``base``, for a delta) into row i: shape
    (itemsize, n), in ``out`` if given (a flat uint8 buffer of raw's length) and
    the C loops are there.

    In C when the build compiled ``_native``'s loops, XOR and all in one pass.
    Else with NumPy: on little-endian hosts byte i is ``(word >> 8i)`` cast to
    uint8, vectorized shifts that run about twice as fast as numpy's transposing
    copy.
    """
    if _native.lib is None or itemsize == 1:
        if base is not None:
            raw = np.bitwise_xor(raw, base, out=out)
        return raw.reshape(1, -1) if itemsize == 1 else _group_numpy(raw, itemsize)
    shape = (itemsize, len(raw) // itemsize)
    rows = np.empty(shape, dtype=np.uint8) if out is None else out.reshape(shape)
    _native.group(raw, rows, base)
    return rows


def _group_numpy(raw: np.ndarray, itemsize: int) -> np.ndarray:
    if not _LITTLE or itemsize not in _UINT:
        return np.ascontiguousarray(raw.reshape(-1, itemsize).T)
    words = raw.view(_UINT[itemsize])
    out = np.empty((itemsize, len(words)), dtype=np.uint8)
    # The shifted words are a temporary: this thread's reused buffer (a fresh one
    # per chunk made grouping 3x slower, all of it in first-touch page faults).
    shifted = scratch("group", raw.nbytes).view(words.dtype) if itemsize > 2 else None
    for i in range(itemsize):
        if i == 0:
            np.copyto(out[0], words, casting="unsafe")
        elif shifted is None:
            np.copyto(out[i], words >> 8, casting="unsafe")
        else:
            np.right_shift(words, 8 * i, out=shifted)
            np.copyto(out[i], shifted, casting="unsafe")
    return out


def _ungroup(rows: list[np.ndarray], out: np.ndarray) -> None:
    """The inverse of ``_group``: row i becomes byte i of every element of ``out``.

    In C when it was built. Else with NumPy: on little-endian hosts the words
    are built by shift-and-or, in place,
    twice as fast as scattering rows into strided columns for 2-byte elements,
    as fast for 4-byte ones.
    """
    n = len(rows)
    if n == 1:
        if not np.may_share_memory(rows[0], out):  # else decompressed in place
            out[:] = rows[0]
        return
    if _native.lib is None:
        _ungroup_numpy(rows, out)
    else:
        _native.ungroup(rows, out)


def _ungroup_numpy(rows: list[np.ndarray], out: np.ndarray) -> None:
    n = len(rows)
    if not _LITTLE or n not in _UINT:
        columns = out.reshape(-1, n)
        for i, row in enumerate(rows):
            columns[:, i] = row
        return
    words = out.view(_UINT[n])
    np.copyto(words, rows[-1])
    for row in reversed(rows[:-1]):
        np.left_shift(words, 8, out=words)
        np.bitwise_or(words, row, out=words, casting="unsafe")


def _compressible(cctx: zstandard.ZstdCompressor, row: np.ndarray) -> bool:
    """Whether a long stream is worth compressing, judged on a sample of it."""
    if len(row) <= 8 * _PROBE_BYTES:
        return True
    probe = row[:_PROBE_BYTES]
    return len(cctx.compress(probe.data)) < _PROBE_RATIO * len(probe)


def estimated_length(raw: np.ndarray, itemsize: int, base: np.ndarray | None = None) -> float:
    """About how many bytes ``raw`` (its XOR against ``base``) would take as a blob.

    On byte-grouped streams zstd level 1 is an entropy coder (see ``_params``),
    so each stream is costed at its order-0 entropy, or raw where that would not
    gain the 8% the codec asks for: a tenth of the time of compressing a sample
    both ways, to weigh a delta against a plain blob. The same in C and NumPy
    but for the last bits (the sums are taken in another order).
    """
    if len(raw) % itemsize:
        itemsize = 1
    found = _native.estimated_length(
        np.ascontiguousarray(raw), None if base is None else np.ascontiguousarray(base),
        itemsize, _PROBE_RATIO)
    if found is not None:
        return found
    data = raw if base is None else np.bitwise_xor(raw, base)
    columns = data[: len(data) // itemsize * itemsize].reshape(-1, itemsize)
    counts = np.stack([np.bincount(columns[:, k], minlength=256)
                       for k in range(itemsize)]).astype(np.float64)
    per = len(raw) // itemsize
    if per == 0:
        return float(len(raw))
    p = counts / per
    with np.errstate(divide="ignore", invalid="ignore"):
        bits = -np.where(p > 0, p * np.log2(p), 0.0).sum(axis=1)
    coded = bits * per / 8
    return float(np.where(coded < _PROBE_RATIO * per, coded, per).sum())


@dataclass
class Prepared:
    """A chunk split into its streams, some waiting to be compressed (``finish``)."""

    head: bytes  # the header up to the stream table
    streams: list[np.ndarray]
    to_compress: list[int]  # which streams to try compressing


def prepare(
    raw: np.ndarray,
    itemsize: int,
    *,
    codec: str = "zstd",
    level: int = 1,
    base: np.ndarray | None = None,
    base_digest: str | None = None,
    check: bytes | None = None,
    name: str | None = None,
    out: np.ndarray | None = None,
) -> Prepared:
    """Group a flat uint8 array into streams, and say which are worth compressing.

    With ``base``, the blob will be the XOR delta against it; ``check`` is the
    raw bytes' ``checksum`` when the caller already has it, ``name`` their digest.
    ``out``, a uint8 buffer of raw's length, takes the streams where they are
    not ``raw`` itself: the caller's reused memory (fresh memory per chunk cost
    more in page faults than grouping); it must stay unchanged until written.
    """
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError("encode takes a flat uint8 array")
    if check is None:
        check = checksum(raw)
    if name is None:
        name = digest(raw)
    if len(raw) % itemsize:
        itemsize = 1
    delta = base is not None
    if delta and (base_digest is None or len(base) != len(raw)):
        raise ValueError("a delta needs a base of the same length and its digest")
    if codec == "zstd":
        streams = list(_group(raw, itemsize, out, base))
    else:
        streams = [raw if base is None else np.bitwise_xor(raw, base, out=out)]
    cctx = _compressor(level)
    to_compress = [i for i, row in enumerate(streams)
                   if codec == "zstd" and len(row) >= 64 and _compressible(cctx, row)]
    head = _HEADER.pack(MAGIC, int(delta), itemsize, len(streams), 0, len(raw)) + check \
        + bytes.fromhex(name[: 2 * NAME_BYTES])
    if delta:
        head += bytes.fromhex(base_digest)  # type: ignore[arg-type]
    return Prepared(head, streams, to_compress)


def compress_streams(rows: list[np.ndarray], level: int = 1,
                     threads: int = 1) -> list[bytes | memoryview]:
    """zstd frames of these streams, in one call that runs on ``threads`` threads.

    One call for a whole batch lets zstd's own threads do the work with the GIL
    released throughout: threads of ours that took a stream each spent more
    time handing the GIL to one another than compressing.
    """
    cctx = _compressor(level)
    if threads <= 1 or len(rows) < 2:
        return [cctx.compress(row.data) for row in rows]
    frames = cctx.multi_compress_to_buffer([row.data for row in rows], threads=threads)
    return [memoryview(frames[i]) for i in range(len(rows))]


def finish(prepared: Prepared, packed: list[bytes | memoryview]) -> Parts:
    """The blob's pieces, given the compressed forms of ``prepared.to_compress``;
    a stream stays raw where compressing it did not pay."""
    table: list[tuple[int, int]] = []
    parts: Parts = []
    frames = dict(zip(prepared.to_compress, packed))
    for i, row in enumerate(prepared.streams):
        method, payload = RAW, memoryview(row)
        frame = frames.get(i)
        if frame is not None and len(frame) < _KEEP_RATIO * len(row):
            method, payload = ZSTD, frame
        table.append((method, len(payload)))
        parts.append(payload)
    return [prepared.head + b"".join(_STREAM.pack(m, n) for m, n in table), *parts]


def encode_parts(raw: np.ndarray, itemsize: int, *, level: int = 1, **options: object) -> Parts:
    """Encode a uint8 array as a CKB2 blob in pieces (written out without a join);
    the options are ``prepare``'s."""
    prepared = prepare(raw, itemsize, level=level, **options)  # type: ignore[arg-type]
    rows = [prepared.streams[i] for i in prepared.to_compress]
    return finish(prepared, compress_streams(rows, level))


def encode(raw: np.ndarray, itemsize: int, **options: object) -> bytes:
    """``encode_parts`` joined into one bytes object."""
    return b"".join(encode_parts(raw, itemsize, **options))  # type: ignore[arg-type]


def blob_length(parts: Parts) -> int:
    return sum(len(p) for p in parts)


def _parse(blob: memoryview) -> tuple[BlobInfo, list[tuple[int, memoryview]]]:
    if len(blob) < _HEADER.size:
        raise CorruptCheckpointError("chunk blob is truncated")
    magic, delta, itemsize, nstreams, _, raw_len = _HEADER.unpack_from(blob)
    if magic not in (MAGIC, MAGIC_V1) or itemsize == 0 or nstreams == 0:
        raise CorruptCheckpointError("chunk blob has a bad header")
    pos = _HEADER.size
    check = name = None
    if magic == MAGIC:
        check = bytes(blob[pos : pos + CHECK_BYTES])
        name = bytes(blob[pos + CHECK_BYTES : pos + CHECK_BYTES + NAME_BYTES])
        pos += CHECK_BYTES + NAME_BYTES
    base = None
    if delta:
        base = bytes(blob[pos : pos + DIGEST_BYTES]).hex()
        pos += DIGEST_BYTES
    table = []
    for _ in range(nstreams):
        if pos + _STREAM.size > len(blob):
            raise CorruptCheckpointError("chunk blob is truncated")
        table.append(_STREAM.unpack_from(blob, pos))
        pos += _STREAM.size
    streams = []
    for method, length in table:
        if method not in (RAW, ZSTD) or pos + length > len(blob):
            raise CorruptCheckpointError("chunk blob is truncated or has a bad stream")
        streams.append((method, blob[pos : pos + length]))
        pos += length
    return BlobInfo(raw_len, itemsize, base, check, name), streams


def info(blob: bytes | memoryview) -> BlobInfo:
    """Read a blob's header without decoding it."""
    return _parse(memoryview(blob))[0]


def matches(blob: bytes | memoryview | np.ndarray, digest: str, raw_len: int,
            base: str | None) -> bool:
    """Whether a blob's header fits the record it is filed under (its name, length and
    delta base), read without decoding: what a copy checks before the original goes."""
    try:
        meta = info(memoryview(blob))
    except (CorruptCheckpointError, ValueError, struct.error):
        return False
    return meta.raw_len == raw_len and meta.base == base and \
        (meta.name is None or meta.name == bytes.fromhex(digest[: 2 * NAME_BYTES]))


def decode_prefix(blob: bytes | memoryview, nbytes: int) -> np.ndarray:
    """The first ``nbytes`` (whole elements) of a blob's raw bytes, unchecked.

    Byte-grouped streams hold element i at position i, so a prefix needs only
    the head of each stream: a delta's worth is judged on a sample this way
    without decoding its base chunk whole. A delta blob's prefix is still
    XORed with its base's: the caller does that. Nothing here is verified, so
    it may only steer choices, never be stored or restored.
    """
    meta, streams = _parse(memoryview(blob))
    n_streams = len(streams)
    per = min(nbytes, meta.raw_len) // n_streams
    rows = []
    for method, payload in streams:
        if method == ZSTD:
            row = np.empty(per, dtype=np.uint8)
            _decompress_into(payload, row, whole=False)
        else:
            row = np.frombuffer(payload[:per], dtype=np.uint8)
        rows.append(row)
    out = np.empty(per * n_streams, dtype=np.uint8)
    _ungroup(rows, out)
    return out


DecodeJob = tuple[bytes | memoryview | np.ndarray, np.ndarray, np.ndarray | None, str | None]

# What the C decoder's statuses mean (``_kernels.c``, CKPT_E*).
_NATIVE_ERRORS = {
    -1: "chunk blob is truncated",
    -2: "chunk blob has a bad header",
    -3: "chunk blob belongs to another chunk",
    -4: "chunk blob length does not match its record",
    -6: "chunk blob streams do not add up",
    -7: "chunk blob is truncated or has a bad stream",
    -8: "chunk blob stream has the wrong length",
    -10: "chunk fails its checksum",
}


# A blob's delta flag against its record's base (given with the job, or not): one of the
# two is damaged.
_DELTA_MISMATCH = "chunk blob is a delta where its record has no base, or plain where it has one"


def decode_many(jobs: Sequence[DecodeJob]) -> list[bool | CorruptCheckpointError]:
    """Decode each (blob, out, base, name) job's blob into the flat uint8 array ``out``
    (its raw length), in one C call where the C decoder is there. A delta blob needs
    ``base``, the decoded raw bytes of its base chunk; ``name`` is the digest the blob
    is read under. Each job's outcome is True where the blob carried a checksum and the
    result matched it; False for a CKB1 blob, which the caller must check against its
    digest; or its ``CorruptCheckpointError``, so a caller can name the chunk that
    failed."""
    if not _native.can_decode():
        return [_outcome(job) for job in jobs]
    heads = [None if name is None else bytes.fromhex(name[: 2 * NAME_BYTES])
             for _, _, _, name in jobs]
    table = _native.decode([(blob, out, base, head)
                            for (blob, out, base, _), head in zip(jobs, heads)])
    outcomes: list[bool | CorruptCheckpointError] = []
    for job, status, detail in zip(jobs, table["status"].tolist(), table["detail"].tolist()):
        if status == 0:
            outcomes.append(True)
        elif status == _native.LEFT:  # a CKB1 blob
            outcomes.append(_outcome(job))
        elif status == -5:
            outcomes.append(CorruptCheckpointError(_DELTA_MISMATCH))
        elif status == -9:
            outcomes.append(CorruptCheckpointError(
                f"chunk blob does not decompress: {_native.zstd_error(detail)}"))
        elif status == -11:
            raise MemoryError("no memory left to decode a chunk")
        else:
            outcomes.append(CorruptCheckpointError(_NATIVE_ERRORS[status]))
    return outcomes


def _outcome(job: DecodeJob) -> bool | CorruptCheckpointError:
    try:
        return _decode_python(*job)
    except CorruptCheckpointError as exc:
        return exc


def _decode_python(
    blob: bytes | memoryview | np.ndarray, out: np.ndarray, base: np.ndarray | None,
    name: str | None,
) -> bool:
    """One ``decode_many`` job where the C decoder is not there, or for a CKB1 blob."""
    meta, streams = _parse(memoryview(blob))
    if name is not None and meta.name is not None and \
            bytes.fromhex(name[: 2 * NAME_BYTES]) != meta.name:
        raise CorruptCheckpointError("chunk blob belongs to another chunk")
    if len(out) != meta.raw_len:
        raise CorruptCheckpointError("chunk blob length does not match its record")
    if (meta.base is None) != (base is None):
        raise CorruptCheckpointError(_DELTA_MISMATCH)
    n_streams = len(streams)
    per = meta.raw_len // n_streams if n_streams else 0
    if per * n_streams != meta.raw_len:
        raise CorruptCheckpointError("chunk blob streams do not add up")
    # Compressed streams decompress into this thread's reused buffer (or
    # straight into ``out`` when there is one stream); raw ones are read in place.
    spare = out if n_streams == 1 else scratch("streams", meta.raw_len)
    rows = []
    for i, (method, payload) in enumerate(streams):
        if method == ZSTD:
            row = spare[i * per : (i + 1) * per]
            _decompress_into(payload, row)
        elif len(payload) != per:
            raise CorruptCheckpointError("chunk blob stream has the wrong length")
        else:
            row = np.frombuffer(payload, dtype=np.uint8)
        rows.append(row)
    _ungroup(rows, out)
    if base is not None:
        np.bitwise_xor(out, base, out=out)
    if meta.check is None:
        return False
    if checksum(out) != meta.check:
        raise CorruptCheckpointError("chunk fails its checksum")
    return True
