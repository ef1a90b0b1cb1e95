"""The run records a notebook session writes into each checkpoint it saves, read back
without a session: ``ckpt-nb ls``, ``%ckpt_list`` and the explorer mark the best
checkpoints by the ``--keep-best`` of the run that wrote them. Nothing here needs torch."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ._codec import digest
from ._errors import CkptError
from ._format import RUN_KEY, decode_manifest, is_count, manifest_key
from ._rebuild import read_manifest

if TYPE_CHECKING:
    from ._catalog import CheckpointRow
    from ._manager import CheckpointManager

# How many of a store's newest checkpoints are read for the newest run record.
RUN_RECORD_DEPTH = 16


def written_keep_best(manager: CheckpointManager, known: dict[str, Any] | None = None
                      ) -> int | None:
    """The ``--keep-best`` K of the session that wrote the store's newest run record, where
    that run's ``--on`` is the ranking ``manager`` ranks by (its ``metric=``, else the one
    the store's last save with a metric recorded); else None (one best). One rule for
    every reader: a script's save with another metric since makes "best" that metric's,
    and the run's K best by its own are no longer marked (``%ckpt_list`` marked them while
    ``ckpt-nb ls`` and the explorer named another best). ``known``: each checkpoint's run
    record (None: it has none) as read before, added to here: a caller that asks at each
    refresh (the explorer) reads only new checkpoints' manifests. Only the newest
    ``RUN_RECORD_DEPTH`` checkpoints are looked at: a store only scripts wrote (or wrote
    last) had every manifest read for none (on an object store, a GET each); the newest
    is read first (a session's last save holds one), the others together."""
    if manager.metric is None:
        return None
    runs = known if known is not None else {}
    newest = manager.catalog.newest(RUN_RECORD_DEPTH)
    for rows in (newest[:1], newest[1:]):
        read = _run_records(manager, [row for row in rows if row.id not in runs])
        runs.update((cid, run) for cid, run in read.items() if run is not _UNREAD)
        for row in rows:
            run = runs.get(row.id, read.get(row.id))
            if isinstance(run, dict):
                on, keep_best = run.get("on"), run.get("keep_best")
                ranks_alike = isinstance(on, (list, tuple)) and \
                    tuple(on) == (manager.metric, manager.mode)
                return keep_best if ranks_alike and is_count(keep_best) else None
    return None


# A run record that could not be read (a store that failed): read again at the next ask.
_UNREAD = object()


def _run_records(manager: CheckpointManager, rows: list[CheckpointRow]) -> dict[str, Any]:
    """Each of ``rows``' run record as its manifest holds it (None: it has none;
    ``_UNREAD``: its manifest could not be read), the manifests fetched by a few threads at
    once: one by one, an ``ls`` of an object store that scripts wrote waited for 16 GETs in
    turn. Each is checked against its digest and decoded here, as a restore reads it."""
    def fetched(row: CheckpointRow) -> bytes | None:
        with contextlib.suppress(CkptError, OSError):
            return read_manifest(manager.store, manifest_key(row.id), row.id)
        return None

    if len(rows) > 1:
        with ThreadPoolExecutor(min(len(rows), 8), thread_name_prefix="ckpt_nb-runs") as pool:
            blobs = list(pool.map(fetched, rows))
    else:
        blobs = [fetched(row) for row in rows]
    runs: dict[str, Any] = {}
    for row, blob in zip(rows, blobs):
        runs[row.id] = _UNREAD
        if blob is None or row.manifest_digest and digest(blob) != row.manifest_digest:
            continue
        with contextlib.suppress(CkptError, KeyError, TypeError):
            runs[row.id] = decode_manifest(blob, row.id)["state"]["extra"].get(RUN_KEY)
    return runs
