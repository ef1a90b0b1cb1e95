"""Crash safety: SIGKILL a training loop mid-save (or mid-gc) and audit the store it left.

A worker (``_crash_worker.py``) logs the state hash it is about to save to
``begun.log`` and, once ``save`` returns, ``<id> <hash>`` to ``committed.log``.
After the kill the store must open; list only checkpoints the worker committed
(plus at most the one save in flight, committed to the catalog but not yet
logged); have kept the newest ones retention promised; restore each
bit-exactly; verify; give them all back from the store alone, were its catalog
lost; and survive a gc that leaves no temporaries and no unreferenced packs.
``CKPT_NB_CRASH_TRIALS=N`` runs N trials of each test (a soak); on failure the
message names the seed, and the trial's store is left in pytest's temporary
directory.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import sys
import time
import types
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import _crash_worker
import pytest
from _crash_worker import KEEP, build, state_hash

from ckpt_nb import CheckpointManager, CkptError
from ckpt_nb._rebuild import deletion_records

# Workers fork from a server that has imported torch once: a real process, SIGKILLed, but
# one that is ready in milliseconds rather than seconds.
CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["torch", "torch._dynamo", "torch.optim", "ckpt_nb",
                                "_crash_worker"])
SOAK = int(os.environ.get("CKPT_NB_CRASH_TRIALS", "0"))
SAVE_TRIALS = [("full" if i % 2 == 0 else "incremental", 1000 + i) for i in range(SOAK or 12)]
GC_TRIALS = [("gc", 2000 + i) for i in range(SOAK or 6)]
PARALLEL = 2  # workers run (and die) concurrently; each trial is still audited alone


@pytest.fixture(autouse=True)
def real_main(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forkserver starts from ``__main__``'s spec, which the IPython shell of the
    notebook tests (its namespace made ``__main__``) lacks, where they ran first."""
    if not hasattr(sys.modules["__main__"], "__spec__"):
        monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))


@dataclass
class Trial:
    mode: str
    seed: int
    store: Path
    delay: float
    exit_code: int | None
    stderr: str

    def __str__(self) -> str:
        return (f"trial mode={self.mode} seed={self.seed} (killed {self.delay:.3f}s after "
                f"ready, rc={self.exit_code}) store={self.store}")


def run_and_kill(mode: str, seed: int, root: Path) -> Trial:
    """Start a worker, wait until it is ready, let it run a seeded random while, SIGKILL it."""
    delay = random.Random(seed).uniform(0.05, 1.5)
    store, log = root / "store", root / "worker.log"
    parent, child = CONTEXT.Pipe(duplex=False)
    proc = CONTEXT.Process(target=_crash_worker.serve,
                           args=(str(store), seed, mode, child, str(log)), daemon=True)
    proc.start()
    child.close()
    try:
        ready = parent.poll(60) and parent.recv() == "ready"
        if ready:
            time.sleep(delay)
            proc.kill()
        proc.join(60)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    stderr = log.read_text() if log.exists() else ""
    if not ready:
        raise RuntimeError(f"worker {mode}/{seed} never got ready (rc={proc.exitcode}):\n{stderr}")
    return Trial(mode, seed, store, delay, proc.exitcode, stderr)


class Runner:
    """Runs trials a few at a time, ahead of the tests that audit them."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.pool = ThreadPoolExecutor(PARALLEL)
        self.futures: dict[tuple[str, int], Future[Trial]] = {}

    def submit(self, key: tuple[str, int]) -> None:
        if key not in self.futures:
            root = self.factory.mktemp(f"crash-{key[0]}-{key[1]}")
            self.futures[key] = self.pool.submit(run_and_kill, *key, root)

    def get(self, key: tuple[str, int], queue: list[tuple[str, int]]) -> Trial:
        at = queue.index(key)
        for ahead in queue[at : at + PARALLEL]:
            self.submit(ahead)
        return self.futures[key].result()


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory):
    r = Runner(tmp_path_factory)
    yield r
    r.pool.shutdown(cancel_futures=True)


def read_log(path: Path) -> list[tuple[str, str]]:
    """The complete lines of a side log, as (first, second) pairs."""
    if not path.exists():
        return []
    text = path.read_text()
    return [tuple(line.split()) for line in text.splitlines(keepends=True)  # type: ignore[misc]
            if line.endswith("\n")]


def audit(trial: Trial) -> None:
    """Everything a crash may and may not leave behind; raises AssertionError with the seed."""
    assert trial.exit_code == -signal.SIGKILL, f"{trial}: the worker was not killed:\n" \
                                               f"{trial.stderr}"
    assert "Traceback" not in trial.stderr, f"{trial}: the worker failed:\n{trial.stderr}"
    begun = {int(step): digest for step, digest in read_log(trial.store / "begun.log")}
    committed = dict(read_log(trial.store / "committed.log"))
    logged = list(committed)
    keep = KEEP[trial.mode]

    mgr = CheckpointManager(trial.store)
    try:
        rows = mgr.catalog.checkpoints()
        listed = mgr.list()["id"].tolist()
        assert listed == [r.id for r in rows], trial
        steps = {r.id: r.step for r in rows}

        # Only what was committed, plus at most the newest save still in flight.
        extra = [cid for cid in listed if cid not in committed]
        assert len(extra) <= 1, f"{trial}: unlogged checkpoints {extra}"
        expected = {cid: committed[cid] for cid in listed if cid in committed}
        if extra:
            assert extra == listed[-1:], f"{trial}: unlogged {extra} is not the newest"
            in_flight = max(begun)
            assert steps[extra[0]] == in_flight, f"{trial}: {extra} is not the save in flight"
            assert len(begun) == len(logged) + 1, trial
            expected[extra[0]] = begun[in_flight]
        # Retention may drop old ones, never the newest it promised to keep.
        must_keep = logged[-(keep - 1):] if extra else logged[-keep:]
        assert set(must_keep) <= set(listed), \
            f"{trial}: committed checkpoints lost: {set(must_keep) - set(listed)}"
        if logged:
            assert listed, f"{trial}: {len(logged)} committed saves, none listed"
        for cid in listed:
            assert begun[steps[cid]] == expected[cid], f"{trial}: {cid} has the wrong step"

        # Every listed checkpoint restores bit-exactly into fresh objects.
        for cid in listed:
            model, optimizer = build(seed=12345)
            try:
                mgr.restore(cid, model=model, optimizer=optimizer, rng=False)
            except CkptError as exc:
                pytest.fail(f"{trial}: checkpoint {cid} (step {steps[cid]}) does not restore: "
                            f"{exc!r}")
            assert state_hash(model, optimizer) == expected[cid], \
                f"{trial}: checkpoint {cid} (step {steps[cid]}) restores different state"

        report = mgr.verify()
        assert report.ok, f"{trial}: verify failed: {report.bad}"
        # A deletion killed between its record in the store and the catalog's commit: the
        # store says they are deleted (a rebuild leaves them out, gc completes it), the
        # catalog lists them, whole, until then.
        records, _ = deletion_records(mgr.store)
        recorded = {cid for ids in records.values() for cid in ids} & set(listed)
        assert not recorded & set(must_keep), f"{trial}: retention recorded {recorded}"
        audit_rebuild(trial, listed, expected, set(begun.values()), recorded)

        mgr.gc()
        listed = [cid for cid in listed if cid not in recorded]
        assert mgr.list()["id"].tolist() == listed, f"{trial}: gc changed the checkpoints"
        report = mgr.verify()
        assert report.ok, f"{trial}: verify failed after gc: {report.bad}"
        temporaries = [str(p) for p in trial.store.rglob("*") if ".tmp-" in p.name]
        assert not temporaries, f"{trial}: temporaries left after gc: {temporaries}"
        packs = set(mgr.store.list("packs"))
        referenced = mgr.catalog.packs()
        assert packs <= referenced, f"{trial}: unreferenced packs after gc: {packs - referenced}"
        assert referenced <= packs, f"{trial}: missing packs: {referenced - packs}"
        manifests = {k.removeprefix("manifests/").removesuffix(".json.zst")
                     for k in mgr.store.list("manifests")}
        assert manifests == set(listed), f"{trial}: manifests {manifests} != {set(listed)}"

        # Training resumes: the crashed store takes a new save, which restores.
        model, optimizer = build(seed=trial.seed)
        resumed = CheckpointManager(trial.store, max_to_keep=keep, strategy="incremental")
        try:
            if listed:  # the next save is a delta against the crash survivor
                resumed.restore(listed[-1], model=model, optimizer=optimizer, rng=False)
            cid = resumed.save(model, optimizer, rng=False)
            fresh, fresh_opt = build(seed=1)
            resumed.restore(cid, model=fresh, optimizer=fresh_opt, rng=False)
            assert state_hash(fresh, fresh_opt) == state_hash(model, optimizer), trial
            assert resumed.verify().ok, trial
        finally:
            resumed.close()
    finally:
        mgr.close()


def audit_rebuild(trial: Trial, listed: list[str], expected: dict[str, str],
                  begun: set[str], recorded: set[str]) -> None:
    """Were the catalog lost now, a copy of the store without it would open with every
    listed checkpoint but those a deletion recorded, each restoring bit-exactly; anything
    more it finds (whole saves that a kill kept from committing) holds a state the worker
    saved."""
    copy = trial.store.parent / "without-catalog"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(trial.store, copy, ignore=shutil.ignore_patterns("catalog.sqlite*"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rebuilt = CheckpointManager(copy)
    try:
        found = rebuilt.list()["id"].tolist()
        assert set(listed) - recorded <= set(found), \
            f"{trial}: a rebuilt catalog lost {set(listed) - recorded - set(found)}"
        assert not recorded & set(found), f"{trial}: deleted {recorded & set(found)} came back"
        for cid in found:
            model, optimizer = build(seed=12345)
            rebuilt.restore(cid, model=model, optimizer=optimizer, rng=False)
            got = state_hash(model, optimizer)
            assert got == expected[cid] if cid in expected else got in begun, \
                f"{trial}: rebuilt checkpoint {cid} restores a state never saved"
    finally:
        rebuilt.close()
        shutil.rmtree(copy)


@pytest.mark.parametrize("mode,seed", SAVE_TRIALS, ids=[f"{m}-{s}" for m, s in SAVE_TRIALS])
def test_kill_during_save(runner: Runner, mode: str, seed: int) -> None:
    audit(runner.get((mode, seed), SAVE_TRIALS))


@pytest.mark.parametrize("mode,seed", GC_TRIALS, ids=[f"{m}-{s}" for m, s in GC_TRIALS])
def test_kill_during_retention_and_gc(runner: Runner, mode: str, seed: int) -> None:
    audit(runner.get((mode, seed), GC_TRIALS))
