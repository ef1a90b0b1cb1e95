"""The chunk codec: byte grouping + zstd blobs, their checks, and format-1 blobs."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_nb import CorruptCheckpointError
from ckpt_nb import _codec as codec
from ckpt_nb import _native


def weights(n: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> np.ndarray:
    """Raw bytes of trained-looking weights: small normal values."""
    gen = torch.Generator().manual_seed(seed)
    t = (torch.randn(n, generator=gen) * 0.05).to(dtype)
    return t.view(torch.uint8).numpy().copy()


def decoded(blob: bytes | memoryview, out: np.ndarray, base: np.ndarray | None = None,
            name: str | None = None) -> bool:
    """One blob through ``decode_many``, as a restore decodes: whether its checksum was
    checked (False: a format-1 blob, left to the digest), its error raised."""
    outcome = codec.decode_many([(blob, out, base, name)])[0]
    if isinstance(outcome, CorruptCheckpointError):
        raise outcome
    return outcome


@pytest.fixture(params=["c", "python"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a decoding test with the C decoder and with the Python one."""
    if request.param == "c" and not _native.can_decode():
        pytest.skip("the C decoder is not there (no compiler, or zstd/xxh3 not found)")
    if request.param == "python":
        monkeypatch.setattr(_native, "decoder", False)
    return str(request.param)

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                   torch.int8, torch.complex128])
@pytest.mark.parametrize("name", ["zstd", "none"])
def test_round_trip_every_item_size(dtype: torch.dtype, name: str, decoder: str) -> None:
    raw = weights(40_000, dtype) if not dtype.is_complex else \
        torch.randn(20_000, dtype=dtype).view(torch.uint8).numpy().copy()
    itemsize = torch.empty((), dtype=dtype).element_size()
    blob = codec.encode(raw, itemsize, codec=name)
    out = np.zeros_like(raw)
    assert decoded(blob, out, name=codec.digest(raw)) is True
    assert np.array_equal(out, raw)


def test_grouping_compresses_floats_and_is_exactly_undone() -> None:
    raw = weights(262_144)
    blob = codec.encode(raw, 4)
    assert len(blob) < 0.85 * len(raw)  # the exponent bytes compress
    rows = list(codec._group(raw, 4))
    out = np.empty_like(raw)
    codec._ungroup(rows, out)
    assert np.array_equal(out, raw)


def test_the_build_compiled_the_c_loops_where_there_is_a_compiler() -> None:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the NumPy loops do the grouping")
    assert _native.lib is not None, f"{_native.LIBRARY} is missing: reinstall (pip install -e .)"
    assert _native.writer, "the library lacks the pack writer: reinstall (pip install -e .)"
    assert _native._estimate is not None, "the library lacks ckpt_estimated_length: reinstall"


def test_a_library_left_from_an_older_build_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install whose _kernels.so predates _kernels.c groups in NumPy
    instead of failing at import."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler here")
    source = tmp_path / "old.c"
    source.write_text("void ckpt_group(void) {}\nvoid ckpt_ungroup(void) {}\n")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(tmp_path / "old.so"), str(source)],
                   check=True)
    monkeypatch.setattr(_native, "LIBRARY", tmp_path / "old.so")
    assert _native._load() == (None, False)
    assert not _native._bind_writer(ctypes.CDLL(str(tmp_path / "old.so")))
    assert _native._bind_estimate(ctypes.CDLL(str(tmp_path / "old.so"))) is None


@pytest.mark.skipif(_native.lib is None, reason="the build did not compile _kernels.c")
@pytest.mark.parametrize("itemsize", [2, 3, 4, 8, 16])
def test_the_c_grouping_loops_match_numpy_byte_for_byte(itemsize: int) -> None:
    raw = np.random.default_rng(itemsize).integers(0, 256, itemsize * 70_001, dtype=np.uint8)
    grouped = codec._group(raw, itemsize)
    assert np.array_equal(grouped, codec._group_numpy(raw, itemsize))
    assert np.array_equal(grouped, raw.reshape(-1, itemsize).T)
    out = np.empty_like(raw)
    rows = [np.ascontiguousarray(r) for r in grouped]
    codec._ungroup(rows, out)
    assert np.array_equal(out, raw)
    with pytest.raises(ValueError, match="add up"):
        _native.ungroup(rows, out[:-itemsize])
    base = np.random.default_rng(itemsize + 1).integers(0, 256, len(raw), dtype=np.uint8)
    into = np.empty_like(raw)  # a delta's streams: grouped raw XOR base, in one pass
    assert np.array_equal(codec._group(raw, itemsize, into, base),
                          codec._group_numpy(raw ^ base, itemsize))
    with pytest.raises(ValueError, match="matching size"):
        _native.group(raw, into.reshape(itemsize, -1), base[:-itemsize])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_without_the_c_loops_blobs_are_the_same_bytes(
        dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build without a C compiler writes and reads the same blobs."""
    raw = weights(50_000, dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    base = raw.copy()
    base[::7] ^= 3  # and a delta, grouped into a caller's buffer as a save does
    kept = raw.copy(), base.copy()

    def both() -> tuple[bytes, bytes]:
        delta = codec.encode(raw, itemsize, base=base, base_digest=codec.digest(base),
                             out=np.empty_like(raw))
        return codec.encode(raw, itemsize), delta

    native = both()
    monkeypatch.setattr(_native, "lib", None)
    assert both() == native
    assert np.array_equal(raw, kept[0]) and np.array_equal(base, kept[1])  # left as they were
    out = np.empty_like(raw)
    assert decoded(native[0], out) and np.array_equal(out, raw)
    assert decoded(native[1], out, base) and np.array_equal(out, raw)


def test_delta_round_trip(decoder: str) -> None:
    base = weights(100_000)
    new = base.copy()
    new[4000:4400] ^= 1  # a few low mantissa bits move
    blob = codec.encode(new, 4, base=base, base_digest=codec.digest(base))
    assert codec.info(blob).base == codec.digest(base)
    assert len(blob) < 0.05 * len(new)
    out = np.empty_like(new)
    assert decoded(blob, out, base) is True
    assert np.array_equal(out, new)


def test_a_flipped_byte_in_a_raw_stream_fails_the_checksum(decoder: str) -> None:
    raw = weights(100_000)
    blob = bytearray(codec.encode(raw, 4))
    blob[-10] ^= 0x40  # inside the last stream's payload
    with pytest.raises(CorruptCheckpointError, match="checksum|decompress|length"):
        decoded(bytes(blob), np.empty_like(raw))


def test_a_blob_read_under_another_name_is_refused(decoder: str) -> None:
    raw = weights(10_000)
    blob = codec.encode(raw, 4)
    with pytest.raises(CorruptCheckpointError, match="another chunk"):
        decoded(blob, np.empty_like(raw), name=codec.digest(raw[::-1].copy()))


def test_truncated_and_wrong_length_blobs_are_refused(decoder: str) -> None:
    raw = weights(50_000)
    blob = codec.encode(raw, 4)
    with pytest.raises(CorruptCheckpointError):
        decoded(blob[: len(blob) // 2], np.empty_like(raw))
    with pytest.raises(CorruptCheckpointError, match="length"):
        decoded(blob, np.empty(len(raw) - 4, np.uint8))


def test_the_c_decoder_is_bound_wherever_the_c_loops_are() -> None:
    """zstd and xxh3 are found in the zstandard and xxhash packages (or the system):
    a release of theirs that hid them would silently cost restores their speed."""
    if _native.lib is None:
        pytest.skip("the build did not compile _kernels.c")
    assert _native.decoder, "the C decoder found no zstd / xxh3 to call"


def corrupted(blob: bytes) -> dict[str, bytes]:
    """One broken variant of a 4-stream blob for each check the decoder makes."""
    head, pos = codec._HEADER.size, codec._HEADER.size + codec.CHECK_BYTES + codec.NAME_BYTES
    table = pos  # the stream table follows (a plain blob: no base digest)
    zstd_at = next(i for i in range(4) if blob[table + 9 * i] == codec.ZSTD)
    payload = table + 9 * 4 + sum(int.from_bytes(blob[table + 9 * i + 1 : table + 9 * i + 9],
                                                 "little") for i in range(zstd_at))
    raw_at = next(i for i in range(4) if blob[table + 9 * i] == codec.RAW)
    return {
        "short header": blob[:10],
        "bad magic": b"XXXX" + blob[4:],
        "no streams": blob[:6] + b"\0" + blob[7:],
        "cut in the table": blob[: table + 12],
        "bad method": blob[:table] + b"\x07" + blob[table + 1 :],
        "stream past the end": blob[:-5],
        "raw stream too short": blob[: table + 9 * raw_at + 1]
        + (int.from_bytes(blob[table + 9 * raw_at + 1 : table + 9 * raw_at + 9], "little") - 4)
        .to_bytes(8, "little") + blob[table + 9 * raw_at + 9 :],
        "odd raw length": blob[:8] + (int.from_bytes(blob[8:16], "little") + 1)
        .to_bytes(8, "little") + blob[16:],
        "garbage frame": blob[:payload] + b"\xff" * 8 + blob[payload + 8 :],
        "flipped check": blob[:head] + bytes([blob[head] ^ 1]) + blob[head + 1 :],
    }


def test_the_c_and_python_decoders_refuse_the_same_blobs_with_the_same_words(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if not _native.can_decode():
        pytest.skip("the C decoder is not there")
    raw = weights(40_000)
    good = codec.encode(raw, 4)
    cases = corrupted(good)
    jobs = [(bad, np.empty(len(raw) + (1 if k == "odd raw length" else 0), np.uint8), None, None)
            for k, bad in cases.items()]
    by_c = codec.decode_many(jobs)
    monkeypatch.setattr(_native, "decoder", False)
    by_python = codec.decode_many(jobs)
    for case, c, py in zip(cases, by_c, by_python):
        assert isinstance(c, CorruptCheckpointError), case
        assert isinstance(py, CorruptCheckpointError), case
        if case == "garbage frame":  # zstd's words, through two bindings
            assert "does not decompress" in str(c) and "does not decompress" in str(py), case
        else:
            assert str(c) == str(py), case


def test_a_batch_reports_each_chunk_on_its_own() -> None:
    raws = [weights(30_000, seed=i) for i in range(3)]
    blobs = [codec.encode(r, 4) for r in raws]
    blobs[1] = blobs[1][:-3] + b"\0\0\0"
    outs = [np.zeros_like(r) for r in raws]
    outcomes = codec.decode_many([(b, o, None, codec.digest(r))
                                  for b, o, r in zip(blobs, outs, raws)])
    assert outcomes[0] is True and outcomes[2] is True
    assert isinstance(outcomes[1], CorruptCheckpointError)
    assert np.array_equal(outs[0], raws[0]) and np.array_equal(outs[2], raws[2])


def test_a_delta_flag_that_disagrees_with_the_record_is_corruption(decoder: str) -> None:
    """The caller gives a base where the chunk's record has one: a blob that says
    otherwise (one flipped header byte) is damaged, and restores fall back past it."""
    base = weights(20_000)
    blob = codec.encode(base ^ 1, 4, base=base, base_digest=codec.digest(base))
    with pytest.raises(CorruptCheckpointError, match="a delta where its record has no base"):
        decoded(blob, np.empty_like(base))
    with pytest.raises(CorruptCheckpointError, match="a delta where its record has no base"):
        decoded(codec.encode(base, 4), np.empty_like(base), base)


def as_format_1(blob: bytes) -> bytes:
    """The same blob as ckpt_nb's format 1 wrote it: CKB1, without checksum and name."""
    head = codec._HEADER.size
    extra = codec.CHECK_BYTES + codec.NAME_BYTES
    return codec.MAGIC_V1 + blob[4:head] + blob[head + extra :]


def test_format_1_blobs_still_decode_and_leave_the_check_to_the_caller(decoder: str) -> None:
    raw = weights(30_000)
    old = as_format_1(codec.encode(raw, 4))
    out = np.empty_like(raw)
    assert decoded(old, out, name=codec.digest(raw)) is False
    assert np.array_equal(out, raw) and codec.digest(out) == codec.digest(raw)


@pytest.mark.parametrize("itemsize", [1, 2, 4])
def test_a_prefix_decodes_from_the_heads_of_the_streams(itemsize: int) -> None:
    raw = weights(300_000)
    blob = codec.encode(raw, itemsize)
    for n in (64, 65_536, len(raw), 10 * len(raw)):
        want = raw[: min(n, len(raw)) // itemsize * itemsize]
        assert np.array_equal(codec.decode_prefix(blob, n), want)


@pytest.mark.parametrize("itemsize", [2, 4, 3, 32])
def test_a_delta_is_weighed_by_entropy_alike_in_c_and_numpy(
        itemsize: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights after a small step gain from a delta; unrelated bytes do not; and the
    estimate is near what zstd really stores."""
    before = weights(6_000, seed=1)[: 6_000 // itemsize * itemsize]
    after = before.copy()
    after[::4] ^= 1  # low mantissa bits move
    unrelated = weights(6_000, seed=2)[: len(before)]
    figures = [codec.estimated_length(after, itemsize, before),
               codec.estimated_length(after, itemsize),
               codec.estimated_length(unrelated, itemsize, before)]
    assert figures[0] < 0.5 * figures[1]
    assert figures[2] > 0.97 * figures[1]
    if itemsize == 4:
        assert 0.9 < figures[1] / len(codec.encode(after, 4)) < 1.1
    strided = np.repeat(after, 2)[::2]  # the same bytes, not contiguous
    assert codec.estimated_length(strided, itemsize) == figures[1]
    if _native.lib is not None:
        assert _native._estimate is not None
        c_side = _native.estimated_length(after, before, itemsize, codec._PROBE_RATIO)
        assert c_side == figures[0] if itemsize <= 16 else c_side is None  # (else NumPy's)
        monkeypatch.setattr(_native, "lib", None)
        monkeypatch.setattr(_native, "_estimate", None)
        assert [codec.estimated_length(after, itemsize, before),
                codec.estimated_length(after, itemsize),
                codec.estimated_length(unrelated, itemsize, before)] == \
            pytest.approx(figures, rel=1e-12)  # (sums taken in another order)
