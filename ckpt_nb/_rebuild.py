"""A lost catalog, read back from the store alone.

The catalog is an index of the store: by the commit protocol, everything in
it was written to the store first. So a store whose catalog is gone (deleted,
left behind when the store was copied, or kept in another machine's cache for
an object store) opens with all of its checkpoints, where an empty catalog
would have shown none and let the next ``gc()`` delete them all:

- where chunks lie, from each pack's trailing index;
- the checkpoints, from their manifests (id, parent, branch, loop position,
  metrics, strategy, chain), each kept only where every chunk it needs, delta
  bases included, is in some pack;
- pins and notes changed after a save, from the labels the manager writes.

What is damaged (a pack whose index does not read, or that was cut short, a
manifest that does not decode, a committed checkpoint whose pack is gone) is left
out, named, and recorded in the catalog as damaged, so that ``gc()`` leaves it in the
store (what is whole in it may yet be recovered, or copied back whole); ``verify()``
names each such checkpoint, and restoring it says it is damaged. A manifest of a
format newer than this ckpt_nb reads (a newer ckpt_nb's save into a shared store) is
kept the same way, named as newer (``NEWER``), not as damaged: the rest opens. A save writes each
file under a temporary name and renames it once whole, so a pack cut short is no
save's leftover but a copy that stopped, or a disk's damage. A read that fails for
another reason (a network error) fails the rebuild, so that nothing whole is
left out for a later ``gc()`` to delete. A manifest whose chunks are in no pack is
the leftover of a save that was killed (it writes its manifest while its last pack
is on its way) only where nothing shows the checkpoint was committed: a catalog
that listed it, a later save built on it, a pin or note given to it. Otherwise its
pack was deleted behind ckpt_nb's back (an object store's lifecycle rule, a hand),
and the checkpoint is damaged, not a leftover for ``gc()`` to delete. In a store that
other machines write with no lock across them (an object store), a manifest or pack
younger than ``GRACE_SECONDS`` that no kept checkpoint needs may be another machine's
save in flight: such a manifest is left out as in flight, never marked damaged, and
read in by a later rebuild once its packs are there; such a pack is left out of the
catalog, so that ``gc()``, which collects a young pack only where its catalog names it,
leaves it. The manifests and packs a rebuild left out, not as damaged, are recorded in
the catalog (``Seed.left_out_keys``), with when each young one grows old: the manager
reads the store again only where something else changed there, or one of them grew old
(a whole store read again at every call, while a killed save's leftover waited for gc).

A deletion is recorded in the store (``deleted/``) before the catalog forgets the
checkpoints, and the record stays until gc has deleted their manifests: a manifest
that a record names is a deleted checkpoint's, which a rebuild leaves out (read back,
it undid a deletion killed before its gc, and a catalog read again after that kill
listed every checkpoint the deletion took). A record that does not read is named,
and deletes nothing.

Deleting a checkpoint joins its children to its parent in the catalog, while
their manifests keep naming it: such a child is joined to the newest earlier
checkpoint of its branch, which is that parent on a branch that retention
thinned; where it is not (the first checkpoint of a branch whose fork point was
deleted) the manager labelled the child with its new parent. Without such a label
(a delete by a ckpt_nb from before labels, whose catalog was lost before a newer one
opened it and wrote them) the child is a root, and the rebuild's summary says so.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import zstandard

from . import _codec as codec
from . import _store
from ._catalog import CheckpointRow, ChunkRow, Seed
from ._errors import CorruptCheckpointError, StoreFormatError
from ._format import (MANIFEST_LIMIT, decode_manifest, id_of, is_checkpoint_id, is_count,
                      is_deletion_key, is_int64, is_pack_key, label_key, manifest_key,
                      read_pack_index)
from ._store import Store, young

# Why a rebuild left out a checkpoint whose manifest is of a newer format: its chunks are
# unknown (gc keeps every pack, as for a damaged one), but nothing in it is damaged.
NEWER = "written by a newer ckpt_nb: upgrade ckpt_nb to read it"


def is_newer(why: str) -> bool:
    """Whether a damaged-list entry's reason is ``NEWER``: a checkpoint to keep, unread."""
    return why == NEWER


@dataclass
class Rebuilt(Seed):
    """A catalog's start read from a store, and what had to be left out or guessed."""

    left_out: list[str] = field(default_factory=list)  # why, one line each
    rejoined: list[str] = field(default_factory=list)  # ids whose parent was gone
    # the checkpoints left out as a killed or failed save's leftovers, each with its line
    leftovers: dict[str, str] = field(default_factory=dict)
    # whether a file listed was gone when read (another process's deletion or gc ran
    # meanwhile, whose compacted packs the listing may lack: ``rebuild`` reads again)
    overtaken: bool = False

    def leave_out(self, what: str, why: object, damaged: str | None = None) -> None:
        """Name something left out, and why; ``damaged``, its key: kept from ``gc()``."""
        self.left_out.append(f"{what} ({why})")
        if damaged is not None:
            self.damaged[damaged] = str(why)

    def summary(self) -> str:
        n = len(self.checkpoints)
        text = f"{n} checkpoint{'' if n == 1 else 's'} recovered"
        rejoined = set(self.rejoined)
        # (a branch's first checkpoint whose fork point was deleted, unlabelled, has no
        # known ancestor: it is a root now, and is not said to be joined to one)
        roots = [row.id for row in self.checkpoints if row.id in rejoined and row.parent is None]
        joined = len(rejoined) - len(roots)
        if joined:
            text += (f"; {joined} whose parent had been deleted "
                     f"{'was joined to its' if joined == 1 else 'were joined to their'} "
                     "nearest kept ancestor")
        if roots:
            text += (f"; {len(roots)} whose parent had been deleted "
                     f"{'is a root' if len(roots) == 1 else 'are roots'} now, the store "
                     f"recording no kept ancestor of {'it' if len(roots) == 1 else 'them'}: "
                     f"{', '.join(roots)}")
        if self.left_out:
            text += f"; left out: {'; '.join(self.left_out)}"
        if self.damaged:
            text += (f"; kept in the store, and left alone by gc(): "
                     f"{', '.join(sorted(self.damaged))}")
        return text


# What a read of a manifest's file asks for first (one request to an object store): all
# of a manifest of some thousand tensors, and of a larger one its zstd frame header (18
# bytes at most), which says how many bytes the frame holds.
_MANIFEST_HEAD = 1 << 20


def _frame_bound(content: int) -> int:
    """The most bytes a zstd frame of ``content`` bytes takes: ZSTD_COMPRESSBOUND (at most
    content + content/256 + 64) with room for its header and checksum."""
    return content + (content >> 8) + (1 << 10)


def read_manifest(store: Store, key: str, checkpoint_id: str) -> bytes:
    """A manifest's file, of which no more is read than a zstd frame of ``MANIFEST_LIMIT``
    bytes or of the size its header gives takes up: a 3 GB file named like a manifest was
    read whole at a rebuild (on S3 three times over) only to find it is no zstd frame."""
    head = store.get(key, 0, _MANIFEST_HEAD)
    if len(head) < _MANIFEST_HEAD:  # (the whole file)
        return head
    try:
        size = zstandard.frame_content_size(head)
    except zstandard.ZstdError as exc:
        raise CorruptCheckpointError(f"manifest of checkpoint {checkpoint_id} is unreadable: "
                                     f"it is no zstd frame ({exc})", checkpoint_id) from exc
    if size > MANIFEST_LIMIT:
        raise CorruptCheckpointError(f"manifest of checkpoint {checkpoint_id} is unreadable: "
                                     f"it claims {size} bytes, more than any manifest",
                                     checkpoint_id)
    bound = _frame_bound(MANIFEST_LIMIT if size < 0 else size)
    blob = head + store.get(key, _MANIFEST_HEAD, bound + 1) if bound >= _MANIFEST_HEAD \
        else head
    if len(blob) > bound:
        raise CorruptCheckpointError(f"manifest of checkpoint {checkpoint_id} is unreadable: "
                                     f"its file is longer than a zstd frame of "
                                     f"{'any manifest' if size < 0 else f'{size} bytes'}",
                                     checkpoint_id)
    return blob


def rebuild(store: Store, committed: Collection[str] = (),
            failed: Collection[str] = ()) -> Rebuilt:
    """Every checkpoint the store holds whole, with its chunks, as a new catalog's rows;
    ``committed``, the ids a catalog listed (one a pack of is gone is then damaged);
    ``failed``, the ids of failed saves whose deletion the store does not record yet
    (``Catalog.failed_saves``), left out as deleted ones are. Read again where another
    process deleted what was listed meanwhile (its gc may have compacted a pack whose
    chunks a kept checkpoint needs into one written after the listing: that checkpoint
    was left out as damaged, and its manifest kept from gc)."""
    for _ in range(3):
        found = _read_store(store, committed, failed)
        if not found.overtaken:
            break
    return found


def _read_store(store: Store, committed: Collection[str], failed: Collection[str]
                ) -> Rebuilt:
    """``rebuild``'s one reading of the store."""
    found = Rebuilt()
    records, unreadable = deletion_records(store)
    for key, why in unreadable.items():
        found.leave_out(f"the deletion record {key}", why)
    deleted = {cid for ids in records.values() for cid in ids} | set(failed)
    pack_times, manifest_times = store.modified("packs"), store.modified("manifests")
    pack_keys = sorted(store.list("packs") if pack_times is None else pack_times)
    manifest_keys = sorted(store.list("manifests") if manifest_times is None else manifest_times)
    copies = _copies(store, found, pack_keys)
    chunks, unusable = _usable(copies)
    young_manifests, young_packs = young(manifest_times), young(pack_times)
    decoded = []
    for key in manifest_keys:
        cid = id_of(key)
        if cid is None or cid in deleted:
            continue
        try:
            blob = read_manifest(store, key, cid)
            manifest = decode_manifest(blob, cid)
        except FileNotFoundError:  # (deleted since the listing: another process's
            found.overtaken = True  # retention or gc, which it is no change to warn of)
            continue
        except CorruptCheckpointError as exc:
            found.leave_out(f"checkpoint {cid}", exc, damaged=key)
            continue
        except StoreFormatError:
            found.leave_out(f"checkpoint {cid}", NEWER, damaged=key)
            continue
        decoded.append((key, cid, manifest, blob))
    parents = {manifest["parent"] for _, _, manifest, _ in decoded
               if isinstance(manifest, dict) and isinstance(manifest.get("parent"), str)}
    manifests = []
    for key, cid, manifest, blob in decoded:
        flaw = _flaw(manifest, cid, chunks)
        if flaw is None:
            manifests.append((manifest, blob))
        else:
            # (a chunk in no pack: a killed save's leftover, unless a damaged pack may
            # hold it or the checkpoint was committed; young, a save in flight, which a
            # later rebuild reads in once its last pack is there)
            unpacked = flaw.startswith("its chunk")
            committed_here = unpacked and (cid in committed or cid in parents or
                                           store.has(label_key(cid)))
            if unpacked and not committed_here and key in young_manifests:
                continue
            damaged = not unpacked or committed_here or \
                any(k.startswith("packs/") for k in found.damaged)
            if damaged:
                found.leave_out(f"checkpoint {cid}", flaw, damaged=key)
            else:
                found.leave_out(f"checkpoint {cid}", f"{flaw}: a killed or failed save's "
                                "leftover, which gc() deletes")
                found.leftovers[cid] = found.left_out[-1]
    manifests.sort(key=lambda pair: (pair[0]["created_at"], pair[0]["id"]))

    guesses = guessed_parents((manifest["id"], manifest["branch"]) for manifest, _ in manifests)
    written = _written_by([(manifest["id"], manifest["created_at"], set(_refs(manifest)))
                           for manifest, _ in manifests], copies, _pack_times(store, pack_keys))
    for manifest, blob in manifests:
        cid, branch = manifest["id"], manifest["branch"]
        refs = _refs(manifest)
        label = _label(store, cid, found)
        parent = manifest.get("parent")
        if parent is not None and parent not in found.refs:
            labelled = label.get("parent", parent)
            parent = labelled if labelled is None or labelled in found.refs else guesses[cid]
            found.rejoined.append(cid)
        row = CheckpointRow(
            id=cid, parent=parent, branch=branch, created_at=manifest["created_at"],
            step=manifest.get("step"), epoch=manifest.get("epoch"),
            batch_idx=manifest.get("batch_idx"), metrics=manifest.get("metrics") or {},
            strategy=manifest["strategy"], full_base=manifest.get("full_base"),
            chain=manifest.get("chain", 0),
            logical_bytes=sum(storage["nbytes"] for storage in manifest["storages"]),
            stored_bytes=len(blob) + written.get(cid, 0),
            pinned=bool(label.get("pinned", False)),
            note=str(label.get("note", manifest.get("note", ""))),
            manifest_digest=codec.digest(blob))
        found.checkpoints.append(row)
        found.refs[cid] = refs
        ranked_by = manifest.get("ranked_by")
        if isinstance(ranked_by, list) and len(ranked_by) == 2 and \
                isinstance(ranked_by[0], str) and ranked_by[1] in ("min", "max"):
            found.ranking = (ranked_by[0], ranked_by[1])  # (the newest save's stands)
            if found.ranking not in found.rankings:
                found.rankings.append(found.ranking)
    chunks, unusable = _without_flying(copies, chunks, unusable, found, young_packs)
    # (a chunk whose bases are gone is left out: a save finding it in the catalog
    # would refer to it instead of storing its bytes)
    found.chunks = [row for digest, row in chunks.items() if digest not in unusable]
    held = {manifest_key(row.id) for row in found.checkpoints} | \
        {row.pack for row in found.chunks} | {manifest_key(cid) for cid in deleted}
    times, flying = {**(pack_times or {}), **(manifest_times or {})}, young_manifests | young_packs
    found.left_out_keys = {
        key: times[key] + _store.GRACE_SECONDS if key in flying else None
        for key in [*pack_keys, *manifest_keys] if key not in held and key not in found.damaged}
    return found


def _refs(manifest: dict[str, Any]) -> list[str]:
    """The chunks a checkpoint's manifest refers to, in its storages' order."""
    return [digest for storage in manifest["storages"] for digest, _ in storage["chunks"]]


def _written_by(order: list[tuple[str, float, set[str]]], copies: dict[str, list[ChunkRow]],
                times: dict[str, float] | None) -> dict[str, int]:
    """The chunk bytes each checkpoint's save wrote, as its catalog row's stored_bytes
    counts them: a save writes the chunks new to the store, each of which its manifest
    refers to, into one pack of its own. ``order``: each kept checkpoint's id, start
    (created_at) and chunks, oldest first; ``times``: when each pack was written, where
    the store gives it on the savers' clock (``_pack_times``).

    The store records no pack's writer, so this is as close as it allows: a pack is
    charged to the oldest kept checkpoint that refers to a chunk of it, where that one
    refers to all of them and, by ``times``, began before the pack was written; and a
    checkpoint to the largest such pack (a save's own holds what changed; gc's
    compaction of a deleted save's pack may leave a chunk it shares, unchanged). A pack
    whose writer was deleted is charged to none, as the catalog charged it, but to a
    kept checkpoint of an identical state (a rollback trained again) where ``times``
    cannot tell it was written before that one began (an object or memory store); and
    a pack that gc wrote (a compaction, a delta stored whole) to the oldest checkpoint
    that uses all of its chunks, where the catalog kept the bytes on the save that
    first wrote them."""
    first: dict[str, int] = {}  # each chunk's oldest user, by its place in ``order``
    for at, (_, _, refs) in enumerate(order):
        for digest in refs:
            first.setdefault(digest, at)
    packs: dict[str, list[ChunkRow]] = {}
    for rows in copies.values():
        for row in rows:
            packs.setdefault(row.pack, []).append(row)
    candidates: dict[int, list[str]] = {}
    for key, rows in packs.items():
        digests = {row.digest for row in rows}
        users = [first[digest] for digest in digests if digest in first]
        if not users:
            continue
        at = min(users)
        _, began, refs = order[at]
        if digests <= refs and (times is None or key not in times
                                or began <= times[key] + _FILE_CLOCK_LAG):
            candidates.setdefault(at, []).append(key)
    sizes = {key: sum(row.length for row in rows) for key, rows in packs.items()}
    return {order[at][0]: max(sizes[key] for key in keys) for at, keys in candidates.items()}


# How far a file's time may lag the clock a save read its start from: a file system
# stamps a write with the kernel's coarse clock, up to a tick (1 to 10 ms) behind.
_FILE_CLOCK_LAG = 0.02


def _pack_times(store: Store, keys: Iterable[str]) -> dict[str, float] | None:
    """When each pack was written, on the clock of the machine that saved it (its start,
    created_at, is read from it): a local store's files' times, where they are finer
    than a second. None elsewhere: an object store stamps an upload by its own clock, in
    whole seconds, and a save takes milliseconds."""
    root = _store.local_root(store)
    if root is None:
        return None
    times: dict[str, float] = {}
    for key in keys:
        try:
            times[key] = (root / key).stat().st_mtime
        except FileNotFoundError:  # (deleted since the listing: read without it)
            continue
    if times and all(t.is_integer() for t in times.values()):  # (a file system's whole
        return None  # seconds: a pack written in a save's first second seemed older)
    return times


def deletion_records(store: Store, pinned: Callable[[str], bool] | None = None
                     ) -> tuple[dict[str, set[str]], dict[str, str]]:
    """The store's deletion records (key -> the ids each names), and those that do not
    read (key -> why): written whole by a deletion, so damage or a hand's. A record
    naming a checkpoint pinned now (``pinned``: by a catalog; by default, by its label)
    is left out: a deletion unpins what it deletes before its record (``delete(force=
    True)``), so that pin came after a deletion cut short before its catalog's commit
    (given in a catalog that an older ckpt_nb rebuilt, say), and the pin wins."""
    if pinned is None:
        pinned = functools.partial(_labelled_pinned, store)
    records: dict[str, set[str]] = {}
    unreadable: dict[str, str] = {}
    for key in store.list("deleted"):
        if not is_deletion_key(key):
            continue
        try:
            record = json.loads(store.get(key))
        except FileNotFoundError:  # (its gc, meanwhile: its manifests are gone)
            continue
        except (ValueError, RecursionError) as exc:  # (CorruptCheckpointError too)
            unreadable[key] = str(exc)
            continue
        ids = record.get("ids") if isinstance(record, dict) else None
        if not isinstance(ids, list) or not all(map(is_checkpoint_id, ids)):
            unreadable[key] = 'not {"ids": [checkpoint ids]}'
            continue
        if not any(map(pinned, ids)):
            records[key] = set(ids)
    return records, unreadable


def _labelled_pinned(store: Store, cid: str) -> bool:
    """Whether a checkpoint's label pins it (one that does not read, not)."""
    try:
        label = json.loads(store.get(label_key(cid)))
    except (FileNotFoundError, ValueError, RecursionError):
        return False
    return isinstance(label, dict) and label.get("pinned") is True


def _without_flying(copies: dict[str, list[ChunkRow]], chunks: dict[str, ChunkRow],
                    unusable: set[str], found: Rebuilt, recent: set[str]
                    ) -> tuple[dict[str, ChunkRow], set[str]]:
    """``chunks`` and ``unusable`` (``_usable``'s) without the packs younger than the grace
    time that hold a chunk no kept checkpoint needs: one may be a save in flight on
    another machine, which gc must not take for dead, nor compact away (gc collects a
    young pack only where its catalog names it). Unchanged where a kept checkpoint would
    then miss a chunk (a young pack holds the only copy: it is no save in flight's)."""
    needed = _with_bases({d for refs in found.refs.values() for d in refs}, chunks)
    flying = {row.pack for rows in copies.values() for row in rows
              if row.pack in recent and row.digest not in needed}
    if not flying:
        return chunks, unusable
    kept = {digest: [row for row in rows if row.pack not in flying]
            for digest, rows in copies.items()}
    fewer, fewer_unusable = _usable({d: rows for d, rows in kept.items() if rows})
    if any(digest not in fewer or digest in fewer_unusable for digest in needed):
        return chunks, unusable
    return fewer, fewer_unusable


def _with_bases(digests: set[str], chunks: dict[str, ChunkRow]) -> set[str]:
    """``digests`` and every delta base under them that ``chunks`` holds."""
    out, frontier = set(), list(digests)
    while frontier:
        digest = frontier.pop()
        if digest in out or digest not in chunks:
            continue
        out.add(digest)
        if chunks[digest].base is not None:
            frontier.append(chunks[digest].base)
    return out


def guessed_parents(checkpoints: Iterable[tuple[str, str]]) -> dict[str, str | None]:
    """The parent a rebuild gives a checkpoint whose own was deleted: the newest earlier
    one of its branch. ``checkpoints`` are (id, branch), oldest first; the manager
    labels a checkpoint whose real parent differs."""
    newest_of_branch: dict[str, str] = {}
    guesses: dict[str, str | None] = {}
    for cid, branch in checkpoints:
        guesses[cid] = newest_of_branch.get(branch)
        newest_of_branch[branch] = cid
    return guesses


def _copies(store: Store, found: Rebuilt, keys: Iterable[str]) -> dict[str, list[ChunkRow]]:
    """Every chunk in a whole pack (of ``keys``, those the store lists), by digest, each
    copy of it."""
    copies: dict[str, list[ChunkRow]] = {}
    for key in keys:
        if not is_pack_key(key):
            continue
        try:
            rows = read_pack_index(store, key)
        except FileNotFoundError:  # (deleted since the listing, as a manifest below)
            found.overtaken = True
            continue
        except CorruptCheckpointError as exc:
            found.leave_out("a pack", exc, damaged=key)
            continue
        for row in rows:
            copies.setdefault(row.digest, []).append(row)
    return copies


def _usable(copies: dict[str, list[ChunkRow]]) -> tuple[dict[str, ChunkRow], set[str]]:
    """Of the copies of each chunk, one whose delta bases are all stored, the shallowest;
    and the chunks that have no such copy (each keeps its shallowest, for ``_flaw`` to
    name what it lacks).

    A pack keeps what it held until it is compacted or deleted: a delta that gc
    rewrote whole (its base then collected) lies in its old pack too, next to the
    whole copy, and a chunk no checkpoint needs any more may lie there as a delta
    against a base long gone.
    """
    chosen: dict[str, ChunkRow] = {}
    unusable: set[str] = set()
    ordered = {digest: sorted(rows, key=lambda r: r.depth) for digest, rows in copies.items()}
    for start in copies:
        if start in chosen or start in unusable:
            continue
        # Depth first, on a stack of its own (a chain may be thousands deep): each
        # chunk's copies in turn, down into a base not yet settled.
        stack, on_path = [[start, 0]], {start}
        while stack:
            frame = stack[-1]
            digest, rows = frame[0], ordered[frame[0]]
            while frame[1] < len(rows) and digest not in chosen:
                base = rows[frame[1]].base
                if base is None or base in chosen:
                    chosen[digest] = rows[frame[1]]
                elif base in unusable or base in on_path or base not in copies:
                    frame[1] += 1
                else:
                    break
            if digest not in chosen and frame[1] < len(rows):
                base = rows[frame[1]].base
                stack.append([base, 0])
                on_path.add(base)
                continue
            if digest not in chosen:
                unusable.add(digest)
            on_path.discard(digest)
            stack.pop()
    for digest, rows in copies.items():
        chosen.setdefault(digest, min(rows, key=lambda r: r.depth))
    return chosen, unusable


def _flaw(manifest: Any, cid: str, chunks: dict[str, ChunkRow]) -> str | None:
    """Why a manifest cannot be a checkpoint of the catalog, if it cannot: a field that
    is not what a save writes, or a chunk it needs (directly, or as the base of a
    delta) that no pack holds."""
    try:
        if manifest["id"] != cid:
            return "its manifest names another checkpoint"
        if not isinstance(manifest["created_at"], (int, float)) or \
                not math.isfinite(manifest["created_at"]) or \
                not isinstance(manifest["branch"], str) or \
                not isinstance(manifest["strategy"], str):
            return "its manifest lacks the time, branch or strategy of its save"
        odd = _odd_field(manifest) or CheckpointRow(  # (what the catalog reads back)
            id=cid, parent=manifest.get("parent"), branch=manifest["branch"],
            created_at=manifest["created_at"], step=manifest.get("step"),
            epoch=manifest.get("epoch"), batch_idx=manifest.get("batch_idx"),
            metrics=manifest.get("metrics") or {}, strategy=manifest["strategy"],
            full_base=manifest.get("full_base"), chain=manifest.get("chain", 0),
            logical_bytes=0, stored_bytes=0, pinned=False, note="").problem()
        if odd is not None:
            return f"its manifest's {odd} is not what a save writes"
        for storage in manifest["storages"]:
            int(storage["nbytes"])
            for digest, _ in storage["chunks"]:
                seen = set()
                while digest is not None and digest not in seen:
                    seen.add(digest)
                    row = chunks.get(digest)
                    if row is None:
                        return f"its chunk {digest[:12]} is in no pack"
                    digest = row.base
                if digest is not None:
                    return "the delta bases of its chunks go round in a loop"
    except (KeyError, TypeError, ValueError) as exc:
        return f"its manifest is malformed: {exc!r}"
    return None


def _odd_field(manifest: dict[str, Any]) -> str | None:
    """The first field a catalog row takes from a manifest that is not of the kind a
    save writes (SQLite holds 64-bit integers; a parent is an id)."""
    for name in ("step", "epoch", "batch_idx"):
        if manifest.get(name) is not None and not is_int64(manifest[name]):
            return name
    chain = manifest.get("chain", 0)
    if not (is_count(chain) and is_int64(chain)):
        return "chain"
    for name in ("parent", "full_base"):
        value = manifest.get(name)
        if value is not None and not is_checkpoint_id(value):
            return name
    metrics = manifest.get("metrics") or {}
    if not isinstance(metrics, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values()):
        return "metrics"
    if not isinstance(manifest.get("note", ""), str):
        return "note"
    return None


def _label(store: Store, cid: str, found: Rebuilt) -> dict[str, Any]:
    """What a checkpoint was given after it was saved: a pin, a note, a new parent."""
    key = label_key(cid)
    try:
        label = json.loads(store.get(key))
        parent = label.get("parent") if isinstance(label, dict) else None
        if not isinstance(label, dict):
            reason = "not a JSON object"
        elif not isinstance(label.get("pinned", False), bool) or \
                not isinstance(label.get("note", ""), str) or \
                parent is not None and not is_checkpoint_id(parent):
            reason = "its pin, note or parent is not what ckpt_nb writes"
        else:
            return label
    except FileNotFoundError:
        return {}  # never pinned, annotated nor re-parented
    except (ValueError, RecursionError) as exc:  # (CorruptCheckpointError too)
        reason = str(exc)
    found.leave_out(f"the pin and note of checkpoint {cid}", reason)
    return {}
