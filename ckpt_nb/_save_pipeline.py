"""How one save turns a captured state's storages into chunks in a new pack.

A batch (``ENCODE_BATCH`` bytes of chunks) at a time, in three stages that run
side by side:

- a pool thread hashes the next batch: xxh3 of every chunk and, where that is
  new at its place, blake3 (which lets the GIL go for a whole chunk);
- the calling thread decides, chunk by chunk, whether it is stored already,
  plain, or as a delta against its base, and groups its bytes into streams in
  one of ``BUFFER_SETS`` reused buffers;
- a pool thread has zstd compress the batch before in one call, on zstd's own
  threads and without the GIL, and the pack's own thread writes the batches in
  order (a pool thread waiting for the batch before would starve the hashing).

Why this shape: on a 2-vCPU VM two Python threads coding a chunk each ran no
faster than one, as every short C call that lets the GIL go costs a wake-up
on the other vCPU to get it back. Here the stages hand over once a batch.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _codec as codec
from ._catalog import ChunkRow
from ._errors import CaptureError
from ._format import write_pack
from ._parallel import in_batches

if TYPE_CHECKING:
    from ._capture import FlatState
    from ._manager import CheckpointManager

ProgressFn = Callable[[int, int], None]

DELTA_REPROBE = 8  # saves between re-tries of the encoding that lost
DELTA_SAMPLE = 16 << 10  # bytes of a chunk both encodings are tried on
SAMPLES_KEPT = 64 << 20  # at most this much of them kept between saves
# A save keeps the raw bytes the next save's deltas will be taken against (packs bypass
# the page cache, so a base not kept is read back from the disk): of each delta it
# writes, this chunk where the next save is incremental, its base where differential;
# and, in a full save followed by delta saves, the chunks of the storages that train.
DELTA_BASES_KEPT = 256 << 20
# Smaller tensors (biases, norms) are stored whole: a delta would save next to
# nothing, and choosing one cost more than all of their bytes.
DELTA_MIN_STORAGE = 64 << 10
# A delta must be this much smaller than the plain blob: its base is read back at
# every restore that uses it, and at this save unless the last one kept it (reading
# and decoding it cost as much as compressing the chunk).
DELTA_GAIN = 0.97
DELTA_GAIN_BASE_ON_DISK = 0.90
# Without full_every, a chunk stacks at most this many deltas (or max_to_keep, if fewer)
# before it is stored whole again: a restore decodes the whole stack, and retention can
# free a deleted checkpoint's deltas only once no kept chunk is stacked on them.
MAX_DEPTH = 8
ENCODE_BATCH = 8 << 20  # bytes of chunks a save encodes, and then writes, at a time
BUFFER_SETS = 3  # batches encoded ahead of the one being written, plus one


@dataclass(frozen=True)
class Seen:
    """What a save saw at one chunk's place (a manager keeps these from its last save)."""

    check: bytes
    digest: str
    head: np.ndarray | None  # its first bytes, where that save wrote the chunk

    def kept(self, digest: str) -> bool:
        """Whether this is chunk ``digest`` and its head was kept."""
        return self.digest == digest and self.head is not None


Memo = dict[tuple[str, int, int], Seen]  # (storage, chunk index, length) -> Seen
_Job = tuple[int, int, np.ndarray, "tuple[str, int] | None"]  # storage, chunk, bytes, base
_Chosen = tuple[int, int, np.ndarray, str, bytes, "codec.Prepared | None", "str | None"]
# per chunk; the catalog's rows of those it has, with their delta bases'
_Hashed = tuple[list[tuple[bytes, str, "Seen | None"]], dict[str, ChunkRow]]
_Blob = tuple[str, "codec.Parts", int, "str | None", int]  # digest, parts, raw length, base, depth


class NothingToWrite(Exception):
    """Every chunk was already stored, so the empty pack is dropped."""


class SavePipeline:
    """One save's chunks: ``run()`` writes the new ones and hands over the manifest's part."""

    def __init__(self, mgr: CheckpointManager, state: FlatState, strategy: str,
                 base_chunks: Mapping[tuple[str, int], tuple[str, int]],
                 progress: ProgressFn | None) -> None:
        self.mgr, self.state, self.progress = mgr, state, progress
        self.options = {"codec": mgr.codec, "level": mgr.level}
        # Catalog rows of the delta bases this save uses, looked up a batch at a time
        # for the chunks that changed (their delta chains, and where to read them).
        self.base_rows: dict[str, ChunkRow] = {}
        self.base_views: dict[str, memoryview] = {}
        full_every = mgr.full_every
        self.max_depth = (full_every - 1) if full_every else \
            min(MAX_DEPTH, mgr.max_to_keep or MAX_DEPTH)
        self.storage_bytes = {st.name: st.data.nbytes for st in state.storages}
        self.memo = mgr._digest_memo
        self.fresh_memo: Memo = {}
        self.kept_bases = mgr._delta_bases  # digest -> raw bytes, from the last save
        # The next save is likely of the manager's strategy (a full save there is its
        # first, or a full_every-th), else of this one's.
        self.next_strategy = mgr.strategy if mgr.strategy != "full" else strategy
        self.fresh_bases: dict[str, np.ndarray] = {}
        self.fresh_bases_bytes = 0
        self.sampled = 0  # bytes of chunk heads kept for the next save's delta probes
        self.refs: list[str] = []
        self.written: set[str] = set()
        self.storages_out: list[dict[str, Any]] = []
        self.jobs = self._jobs(base_chunks)
        self.base_uses = Counter(base[0] for *_, base in self.jobs if base is not None)

    def _jobs(self, base_chunks: Mapping[tuple[str, int], tuple[str, int]]) -> list[_Job]:
        """Every chunk of every storage, with the base a delta of it may use."""
        chunk_size = self.mgr.chunk_size
        jobs: list[_Job] = []
        for si, storage in enumerate(self.state.storages):
            size = max(chunk_size - chunk_size % storage.itemsize, storage.itemsize)
            data = storage.data
            count = max(1, math.ceil(len(data) / size)) if len(data) else 0
            self.storages_out.append({"name": storage.name, "nbytes": int(data.nbytes),
                                      "itemsize": storage.itemsize, "device": storage.device,
                                      "kind": storage.kind, "chunks": [None] * count})
            for ci in range(count):
                jobs.append((si, ci, data[ci * size : (ci + 1) * size],
                             base_chunks.get((storage.name, ci))))
        # The storages that train first: their chunks are the ones to compress and
        # write, so the disk starts early, and hashing the frozen rest (which writes
        # nothing) overlaps with the last writes.
        jobs.sort(key=lambda job: not self.state.storages[job[0]].trains)
        return jobs

    def run(self, named: Callable[[dict[str, Any]], None]) -> tuple[list[ChunkRow], list[str]]:
        """Write the new chunks; returns their rows and every chunk the checkpoint refers to.

        ``named`` gets the manifest's part (storages and tensors) as soon as every chunk
        is named, so the caller writes the manifest while the last batches go out.
        """
        mgr = self.mgr
        mgr._saves += 1
        pool, writer = mgr._executor(), mgr._writer()
        writing: list[Future[None]] = []
        hashing: list[Future[_Hashed]] = []
        compressing: list[Future[list[_Blob]]] = []
        buffer_written: list[Future[None] | None] = [None] * BUFFER_SETS
        try:
            with ENCODE_BUFFERS.take(ENCODE_BATCH + mgr.chunk_size) as buffers, \
                    write_pack(mgr.store) as self.pack:
                try:
                    batches = in_batches(self.jobs, ENCODE_BATCH, lambda job: len(job[2]))
                    hashing.extend(pool.submit(self._hash, b) for b in batches[:1])
                    # The rows of the delta bases of the storages that train (those
                    # that change), in one query while the first batch hashes: asked
                    # for a batch at a time, every query waited for the GIL behind
                    # the save's other threads.
                    self._look_up_bases(base[0] for si, _, _, base in self.jobs
                                        if base is not None and self.state.storages[si].trains)
                    done = 0
                    for n, batch in enumerate(batches):
                        if n + 1 < len(batches):
                            hashing.append(pool.submit(self._hash, batches[n + 1]))
                        buffer = n % BUFFER_SETS
                        chosen = self._choose(batch, hashing.pop(0).result(), buffers[buffer],
                                              buffer_written[buffer])
                        if any(prepared is not None for *_, prepared, _ in chosen):
                            compressing.append(pool.submit(self._compress, chosen))
                            writing.append(writer.submit(self._write, compressing[-1], chosen))
                            buffer_written[buffer] = writing[-1]
                        done += len(batch)
                        if self.progress is not None:
                            self.progress(done, len(self.jobs))
                    named({"storages": self.storages_out,
                           "tensors": [t.to_json() for t in self.state.tensors]})
                    for future in writing:
                        future.result()
                finally:  # on an error, let the threads finish with the pack before it goes
                    for future in hashing + compressing + writing:
                        with contextlib.suppress(Exception):
                            future.result()
                if not self.pack.rows:
                    raise NothingToWrite
            new_rows = self.pack.rows
        except NothingToWrite:
            new_rows = []
        mgr._digest_memo = self.fresh_memo
        mgr._delta_bases = self.fresh_bases
        return new_rows, self.refs

    # -- stage 1: hashing (a pool thread) -------------------------------------------------
    def _hash(self, batch: list[_Job]) -> _Hashed:
        """Each chunk's checksum, digest and memo entry, and the catalog's rows of those
        the store has (and of their delta bases, whose packs are looked at too)."""
        hashes = [self._identify(raw, self.state.storages[si].name, ci)
                  for si, ci, raw, _ in batch]
        return hashes, self.mgr._rows_with_bases(digest for _, digest, _ in hashes)

    def _identify(self, raw: np.ndarray, name: str, ci: int) -> tuple[bytes, str, Seen | None]:
        """The chunk's checksum and digest (and what the last save saw in its place)."""
        # xxh3 runs ~6x faster than blake3: a chunk whose xxh3 matches what this
        # process hashed for the same place at the last save keeps that digest.
        check = codec.checksum(raw)
        seen = self.memo.get((name, ci, len(raw)))
        digest = seen.digest if seen is not None and seen.check == check else codec.digest(raw)
        return check, digest, seen

    # -- stage 2: choosing and grouping (the calling thread) ------------------------------
    def _choose(self, batch: list[_Job], hashed: _Hashed, buffer: np.ndarray,
                buffer_written: Future[None] | None) -> list[_Chosen]:
        """Which chunks are new, and how each is encoded; groups them into ``buffer``
        once the batch that used it last (``buffer_written``) is in the pack."""
        hashes, rows = hashed
        known = self.mgr._in_whole_packs(rows)  # (one in a missing or short pack is new)
        news = []
        for (_, _, _, base), (_, digest, _) in zip(batch, hashes):
            news.append(digest not in known and digest not in self.written)
            self.written.add(digest)
        self._look_up_bases(base[0] for (*_, base), new in zip(batch, news)
                            if new and base is not None)
        found = []
        for (si, ci, raw, base), (check, digest, seen), new in zip(batch, hashes, news):
            storage = self.state.storages[si]
            against = self._delta_base(raw, storage.itemsize, base, storage.name, digest,
                                       seen) if new else None
            found.append((si, ci, raw, check, digest, seen, new, against))
        # Ask for the delta bases not in memory all at once: written with direct I/O,
        # they are read back from the disk.
        self.mgr._prefetch(self.base_rows, (
            a for _, _, raw, _, _, seen, _, a in found
            if a is not None and self._in_memory(a, seen, len(raw)) is None))
        chosen: list[_Chosen] = []
        used = 0
        for si, ci, raw, check, digest, seen, new, against in found:
            storage = self.state.storages[si]
            prepared, head = None, None
            if new:
                if used == 0 and buffer_written is not None:
                    buffer_written.result()
                out = buffer[used : used + len(raw)]
                used += len(raw)
                base_raw = None if against is None else self._base_bytes(against, seen, len(raw))
                prepared = self._prepare(raw, storage.itemsize, check, digest, base_raw,
                                         against, out)
                if base_raw is not None:
                    self._keep_delta_end(against, base_raw, digest, raw,  # type: ignore[arg-type]
                                         seen)
                if self.sampled < SAMPLES_KEPT:
                    head = raw[:DELTA_SAMPLE].copy()
                    self.sampled += len(head)
            if against is None and self.next_strategy != "full" and storage.trains and \
                    self._may_delta(storage.name):
                kept = self._keep_base(digest, raw, copy=True)
                if kept is not None and not new:  # (a new chunk's is checked once written)
                    self._unchanged(kept, check, si)
            self.fresh_memo[(storage.name, ci, len(raw))] = Seen(check, digest, head)
            self.storages_out[si]["chunks"][ci] = [digest, len(raw)]
            self.refs.append(digest)
            chosen.append((si, ci, raw, digest, check, prepared, against))
        return chosen

    def _look_up_bases(self, digests: Iterable[str]) -> None:
        """Fetch the catalog rows of these delta bases (and of theirs), and map their packs;
        a base in a missing or short pack is left out (the chunk is stored whole)."""
        rows = self.mgr._rows_with_bases(d for d in set(digests) if d not in self.base_rows)
        whole = self.mgr._in_whole_packs(rows)
        rows = {digest: row for digest, row in rows.items() if digest in whole}
        self.base_rows.update(rows)
        self.base_views.update(self.mgr._pack_views(
            {d: r for d, r in rows.items() if r.pack not in self.base_views}))

    def _prepare(self, raw: np.ndarray, itemsize: int, check: bytes, digest: str,
                 base_raw: np.ndarray | None = None, base_digest: str | None = None,
                 out: np.ndarray | None = None) -> codec.Prepared:
        return codec.prepare(raw, itemsize, base=base_raw, base_digest=base_digest,
                             check=check, name=digest, out=out, **self.options)

    def _may_delta(self, name: str) -> bool:
        """Whether a later save may store this storage's chunks as deltas."""
        return self.storage_bytes[name] >= DELTA_MIN_STORAGE and \
            self.options["codec"] != "none" and \
            self.mgr._delta_wins.get(name, (True, 0))[0] is not False

    def _delta_base(self, raw: np.ndarray, itemsize: int, base: tuple[str, int] | None,
                    name: str, digest: str, seen: Seen | None) -> str | None:
        """The chunk to store a new chunk as a delta against, if any."""
        if base is None or base[1] != len(raw) or base[0] == digest or \
                self.storage_bytes[name] < DELTA_MIN_STORAGE or self.options["codec"] == "none":
            return None  # (uncompressed, a delta is no smaller)
        row = self.base_rows.get(base[0])
        if row is None or row.depth >= self.max_depth:
            return None  # gone, or its chain of deltas is as long as it may get
        # Which encoding wins is a property of the tensor (weights gain from a delta,
        # Adam's moments do not), so it is decided on a sample now and then: the head
        # the last save kept, else one decoded from the heads of the base's streams.
        mgr = self.mgr
        wins, since = mgr._delta_wins.get(name, (None, 0))
        if wins is None or mgr._saves - since >= DELTA_REPROBE:
            n = min(len(raw), DELTA_SAMPLE - DELTA_SAMPLE % itemsize)
            known = self._in_memory(base[0], seen, n)
            head = known[:n] if known is not None else \
                mgr._read_prefix(base[0], n, self.base_rows, self.base_views)
            sample = raw[:n]
            kept = self._in_memory(base[0], seen, len(raw))
            gain = DELTA_GAIN if kept is not None and len(kept) == len(raw) else \
                DELTA_GAIN_BASE_ON_DISK
            wins = codec.estimated_length(sample, itemsize, head) < \
                gain * codec.estimated_length(sample, itemsize)
            mgr._delta_wins[name] = (wins, mgr._saves)
        return base[0] if wins else None

    def _in_memory(self, digest: str, seen: Seen | None, size: int) -> np.ndarray | None:
        """The first ``size`` or more raw bytes of chunk ``digest``, where the last save
        kept them: the whole chunk (the ends of its deltas) or the head of one it wrote."""
        for known in (self.kept_bases.get(digest),
                      seen.head if seen is not None and seen.kept(digest) else None):
            if known is not None and len(known) >= size:
                return known
        return None

    def _base_bytes(self, digest: str, seen: Seen | None, size: int) -> np.ndarray:
        """A delta base's raw bytes (``size`` of them): from memory where the last save
        kept them all, else read back (and checked) from the store."""
        known = self._in_memory(digest, seen, size)
        if known is not None and len(known) == size:
            return known
        return self.mgr._read_raw(digest, self.base_rows, self.base_views)

    def _keep_delta_end(self, base_digest: str, base_raw: np.ndarray, digest: str,
                        raw: np.ndarray, seen: Seen | None) -> None:
        """Keep the end of a delta just encoded that the next save's will be taken
        against: its base for a differential save, else this chunk, copied into the
        base's memory where no other chunk of this save needs that (fresh memory
        costs a page fault per 4 KiB)."""
        if self.next_strategy == "differential":
            self._keep_base(base_digest, base_raw, copy=False)
            return
        ours = seen is None or base_raw is not seen.head  # (else the last save's sample)
        if ours and self.base_uses[base_digest] == 1 and base_digest not in self.fresh_bases \
                and digest not in self.kept_bases:
            self.kept_bases.pop(base_digest, None)  # no later lookup may find it changed
            np.copyto(base_raw, raw)
            self._keep_base(digest, base_raw, copy=False)
        else:
            self._keep_base(digest, raw, copy=True)

    def _keep_base(self, digest: str, raw: np.ndarray, *, copy: bool) -> np.ndarray | None:
        """Keep a chunk's raw bytes (named by their digest) for the next save's deltas;
        ``copy`` where they are the live state's. Returns the copy it made, if any."""
        if digest in self.fresh_bases or self.fresh_bases_bytes + len(raw) > DELTA_BASES_KEPT:
            return None
        kept = self.kept_bases.get(digest)
        made = None
        if kept is not None and len(kept) == len(raw):
            raw = kept  # kept already: no copy
        elif copy:
            raw = made = raw.copy()
        self.fresh_bases[digest] = raw
        self.fresh_bases_bytes += len(raw)
        return made

    # -- stage 3: compressing (a pool thread) and writing (the pack's thread) ---------------
    def _compress(self, chosen: list[_Chosen]) -> list[_Blob]:
        """The new chunks' blobs, their streams compressed in one call."""
        rows = [p.streams[i] for *_, p, _ in chosen if p is not None for i in p.to_compress]
        packed = iter(codec.compress_streams(rows, self.mgr.level, self.mgr.threads))
        blobs = []
        for si, _, raw, digest, check, prepared, base_digest in chosen:
            if prepared is None:
                continue
            parts = codec.finish(prepared, [next(packed) for _ in prepared.to_compress])
            if base_digest is not None and codec.blob_length(parts) >= len(raw):
                parts = codec.encode_parts(raw, self.state.storages[si].itemsize, check=check,
                                           name=digest, **self.options)
                base_digest = None  # the delta did not pay
            depth = self.base_rows[base_digest].depth + 1 if base_digest else 0
            blobs.append((digest, parts, len(raw), base_digest, depth))
        return blobs

    def _write(self, compressed: Future[list[_Blob]], chosen: list[_Chosen]) -> None:
        """Append a batch's blobs to the pack (batches come in order: one thread), then
        check that their chunks did not change since they were hashed."""
        for blob in compressed.result():
            self.pack.add(*blob)
        self.pack.flush()  # all of it: a later batch reuses these streams' memory
        for si, _, raw, _, check, prepared, _ in chosen:
            if prepared is not None:
                self._unchanged(raw, check, si)

    def _unchanged(self, raw: np.ndarray, check: bytes, si: int) -> None:
        """Refuse a chunk whose bytes changed after it was hashed (another thread went
        on training during the save): its blob, or the copy kept as the next delta's
        base, would not be the bytes its name and checksum say, and a later save that
        found the name in the store would refer to them."""
        if codec.checksum(raw) != check:
            name = self.state.storages[si].name
            raise CaptureError(f"{name} changed while it was being saved (another thread "
                               "is still training?): nothing was saved; save between "
                               "steps, or let ckpt_nb copy the state first "
                               "(mgr.capture(..., copy_tensors=True), then save_state)")


class EncodeBuffers:
    """Sets of buffers that saves encode batches into, shared by a process's managers.

    Fresh memory costs a page fault per 4 KiB, which made grouping slower than
    copying: a save takes a set (of ``BUFFER_SETS``, one per batch in flight; a
    batch ends past ``ENCODE_BATCH``, so each holds that plus a chunk) and gives
    it back.
    """

    KEEP = 2  # sets kept per size, for saves running at the same time

    def __init__(self) -> None:
        self._free: dict[int, list[list[np.ndarray]]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def take(self, size: int) -> Iterator[list[np.ndarray]]:
        with self._lock:
            free = self._free.setdefault(size, [])
            buffers = free.pop() if free else None
        if buffers is None:
            buffers = [np.empty(size, dtype=np.uint8) for _ in range(BUFFER_SETS)]
        try:
            yield buffers
        finally:
            with self._lock:
                free = self._free.setdefault(size, [])
                if len(free) < self.KEEP:
                    free.append(buffers)


ENCODE_BUFFERS = EncodeBuffers()
