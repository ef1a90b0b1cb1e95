"""Pure functions that turn raw chunk bytes into stored blobs and back.

A blob is self-describing::

    b"CKB1" | u8 delta | u8 itemsize | u8 nstreams | u8 reserved | u64 raw_len
    | [32-byte base digest, when delta] | nstreams x (u8 method, u64 length) | payloads

The raw bytes (XORed with the base chunk for a delta) are split into
``itemsize`` byte-grouped streams: byte i of every element goes to stream i, so
the slowly varying sign/exponent bytes of floats sit together and compress,
while mantissa bytes, which never compress, are stored raw at memcpy speed.
Content addresses are blake3 digests of the raw (not encoded) bytes, so a
decoded chunk is checked against the very name it is stored under.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

import blake3
import numpy as np
import zstandard

from ._errors import CorruptCheckpointError

MAGIC = b"CKB1"
_HEADER = struct.Struct("<4sBBBBQ")
_STREAM = struct.Struct("<BQ")
RAW, ZSTD = 0, 1
DIGEST_BYTES = 32
# A compressed stream is kept only when it is smaller than this fraction of raw;
# a long stream is first probed on a sample, as mantissa bytes never compress.
_KEEP_RATIO = 0.97
_PROBE_BYTES = 8192
CODECS = ("zstd", "none")

_local = threading.local()


def digest(data: memoryview | bytes | np.ndarray) -> str:
    """The content address of raw bytes: blake3, hex."""
    return blake3.blake3(data).hexdigest()


@dataclass(frozen=True)
class BlobInfo:
    """What a blob's header says."""

    raw_len: int
    itemsize: int
    base: str | None  # hex digest of the chunk this is a delta against


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(compression_params=_params(level))
    return cache[level]


def _params(level: int) -> zstandard.ZstdCompressionParameters:
    """zstd settings for byte-grouped tensor streams.

    At level 1, longer minimum matches and small tables leave the exponent
    stream to the entropy coder: 10% smaller and 40% faster than plain level 1
    on real fp32 weights (benchmarks/bench_codec.py).
    """
    if level <= 1:
        return zstandard.ZstdCompressionParameters.from_level(
            level, min_match=7, window_log=17, hash_log=12, chain_log=12)
    return zstandard.ZstdCompressionParameters.from_level(level)


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def _group(raw: np.ndarray, itemsize: int) -> np.ndarray:
    """Byte i of every element into row i: shape (itemsize, n)."""
    if itemsize == 1:
        return raw.reshape(1, -1)
    return np.ascontiguousarray(raw.reshape(-1, itemsize).T)


def encode(
    raw: np.ndarray,
    itemsize: int,
    *,
    codec: str = "zstd",
    level: int = 1,
    base: np.ndarray | None = None,
    base_digest: str | None = None,
) -> bytes:
    """Encode a uint8 array; with ``base``, as the XOR delta against it."""
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError("encode takes a flat uint8 array")
    if len(raw) % itemsize:
        itemsize = 1
    delta = base is not None
    if delta:
        if base_digest is None or len(base) != len(raw):
            raise ValueError("a delta needs a base of the same length and its digest")
        raw = np.bitwise_xor(raw, base)
    streams = _group(raw, itemsize) if codec == "zstd" else raw.reshape(1, -1)
    parts: list[bytes | memoryview] = []
    table: list[tuple[int, int]] = []
    for row in streams:
        method, payload = RAW, memoryview(row)
        if codec == "zstd" and len(row) >= 64:
            cctx = _compressor(level)
            probe = row[:_PROBE_BYTES]
            if len(row) <= 8 * _PROBE_BYTES or \
                    len(cctx.compress(probe.data)) < _KEEP_RATIO * len(probe):
                packed = cctx.compress(row.data)
                if len(packed) < _KEEP_RATIO * len(row):
                    method, payload = ZSTD, packed
        table.append((method, len(payload)))
        parts.append(payload)
    head = _HEADER.pack(MAGIC, int(delta), itemsize, len(streams), 0, len(raw))
    if delta:
        head += bytes.fromhex(base_digest)
    head += b"".join(_STREAM.pack(m, n) for m, n in table)
    return b"".join([head, *parts])


def _parse(blob: memoryview) -> tuple[BlobInfo, list[tuple[int, memoryview]]]:
    if len(blob) < _HEADER.size:
        raise CorruptCheckpointError("chunk blob is truncated")
    magic, delta, itemsize, nstreams, _, raw_len = _HEADER.unpack_from(blob)
    if magic != MAGIC or itemsize == 0 or nstreams == 0:
        raise CorruptCheckpointError("chunk blob has a bad header")
    pos = _HEADER.size
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
    return BlobInfo(raw_len, itemsize, base), streams


def info(blob: bytes | memoryview) -> BlobInfo:
    """Read a blob's header without decoding it."""
    return _parse(memoryview(blob))[0]


def decode_into(
    blob: bytes | memoryview, out: np.ndarray, base: np.ndarray | None = None
) -> None:
    """Decode a blob into the flat uint8 array ``out`` (its raw length).

    A delta blob needs ``base``, the decoded raw bytes of its base chunk.
    """
    meta, streams = _parse(memoryview(blob))
    if len(out) != meta.raw_len:
        raise CorruptCheckpointError("chunk blob length does not match its record")
    if (meta.base is None) != (base is None):
        raise ValueError("a delta blob is decoded with its base, a plain one without")
    n_streams = len(streams)
    per = meta.raw_len // n_streams if n_streams else 0
    if per * n_streams != meta.raw_len:
        raise CorruptCheckpointError("chunk blob streams do not add up")
    columns = out.reshape(-1, n_streams) if n_streams > 1 else out.reshape(1, -1)
    for i, (method, payload) in enumerate(streams):
        if method == ZSTD:
            try:
                data = _decompressor().decompress(payload, max_output_size=per)
            except zstandard.ZstdError as exc:
                raise CorruptCheckpointError(f"chunk blob does not decompress: {exc}") from exc
        else:
            data = payload
        if len(data) != per:
            raise CorruptCheckpointError("chunk blob stream has the wrong length")
        src = np.frombuffer(data, dtype=np.uint8)
        if n_streams > 1:
            columns[:, i] = src
        else:
            out[:] = src
    if base is not None:
        np.bitwise_xor(out, base, out=out)
