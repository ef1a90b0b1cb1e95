"""Model-based fuzz of CheckpointManager: random configurations and random operations, each
checked against a plain-Python model of what the store must hold. Hand-written tests pin one
path each; retention, pins, branches, deltas and a second manager interact in ways no one
writes down.

A seed opens a store with a random configuration (``max_to_keep``, ``keep_best`` on a metric,
min or max, that saves may lack or log as NaN or ±inf, ``strategy`` and ``full_every``,
``max_bytes``, ``chunk_size``) and runs ``OPS`` random operations: saves (per-save strategy,
after training all layers, with some frozen, of a few embedding rows, or none), restores (by
id, prefix, "latest", "best", "-N") that start branches, pins and unpins, deletes (pinned
ones, with and without force), gc, verify, reopening with other options, a second manager on
the same store (saving, pinning, deleting, collecting), export and ``import_file`` round
trips, and diffs. After each one, the store and the model agree on: the checkpoints
``list()`` shows; each one's model, whole AdamW state, epoch, step, metrics and extra, loaded
bit-exact; retention (the newest N and the best K kept, pinned never deleted, a byte budget
exceeded only for checkpoints it may not delete); each parent (the nearest kept ancestor);
the head, best and pinned columns; and ``verify()`` and ``diff()``.

A failure names the seed, the configuration and the operations up to it, and the command
that runs that seed alone (``pytest tests/test_engine_fuzz.py -k seed_7`` for one of the
usual 16). ``CKPT_NB_FUZZ_SEEDS=200`` runs seeds 0 to 199 instead (a long local run: about a
second a seed), of it and of the SIGKILL fuzz after it, whose worker saves, deletes,
collects, pins and restores under a byte budget or max_to_keep until it is killed. The tests
after those pin what they found.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import signal
import time
import traceback
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import torch
from test_crash import CONTEXT, real_main  # noqa: F401 (a fixture: the forkserver's __main__)

from ckpt_nb import CheckpointManager, CheckpointNotFoundError, CkptError

SEEDS = list(range(int(os.environ.get("CKPT_NB_FUZZ_SEEDS", "0")) or 16))
OPS = 48
KILL_SEEDS = list(range(int(os.environ.get("CKPT_NB_FUZZ_SEEDS", "0")) or 5))
METRIC = "val"


def build() -> tuple[torch.nn.Sequential, torch.optim.AdamW]:
    """An embedding (a few rows of it change: sparse deltas) before a small MLP."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 64), torch.nn.Linear(64, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.Linear(64, 8))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def copy_tree(tree: Any) -> Any:
    """A state tree's own copy: the live one trains on, in place."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: copy_tree(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(copy_tree(v) for v in tree)
    return tree


def difference(a: Any, b: Any, path: str) -> str | None:
    """The first place two state trees differ (tensors compared bit for bit), or None."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: {type(a).__name__} vs {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        bits_a, bits_b = (t.contiguous().reshape(-1).view(torch.uint8) for t in (a, b))
        return None if torch.equal(bits_a, bits_b) else f"{path}: values differ"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        return next((d for k in a if (d := difference(a[k], b[k], f"{path}/{k}"))), None)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b))
                     if (d := difference(x, y, f"{path}[{i}]"))), None)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def flat_tensors(tree: Any, prefix: str, into: dict[str, torch.Tensor]) -> None:
    """Tensors of a state tree by the names diff() gives them."""
    if isinstance(tree, torch.Tensor):
        into[prefix] = tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            flat_tensors(v, f"{prefix}/{k}", into)
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            flat_tensors(v, f"{prefix}/{i}", into)


class Fuzz:
    """One seed's store, its manager, and the model of what they must hold."""

    def __init__(self, seed: int, root: Path) -> None:
        self.seed, self.root, self.r = seed, root, random.Random(seed)
        self.store = root / "store"
        self.log: list[str] = []
        self.model, self.optimizer = build()
        torch.manual_seed(seed)
        self.step = 0
        self.expected: dict[str, dict[str, Any]] = {}  # what each checkpoint must load as
        self.parent_of: dict[str, str | None] = {}  # as saved (the model's DAG)
        self.order: list[str] = []  # every checkpoint ever made, oldest first
        self.deleted: set[str] = set()
        self.pinned: set[str] = set()
        self.head: str | None = None  # the checkpoint self.mgr's live objects came from
        r = self.r
        self.cfg: dict[str, Any] = {
            "max_to_keep": r.choice([None, None, 1, 2, 3, 5]),
            "keep_best": r.choice([None, None, 1, 2]),
            "strategy": r.choice(["full", "incremental", "differential"]),
            "full_every": r.choice([None, None, 2, 3, 5]),
            "max_bytes": r.choice([None, None, None, 400_000, 1_500_000, 4_000_000]),
            "mode": r.choice(["min", "max"]),
            "chunk_size": r.choice([None, None, 4096, 16384]),
        }
        if self.cfg["keep_best"] or r.random() < 0.5:
            self.cfg["metric"] = METRIC
        self.mgr = self.open()

    def open(self) -> CheckpointManager:
        return CheckpointManager(self.store,
                                 **{k: v for k, v in self.cfg.items() if v is not None})

    def report(self) -> str:
        return (f"seed {self.seed} failed (run it alone: CKPT_NB_FUZZ_SEEDS={self.seed + 1} "
                f"pytest 'tests/test_engine_fuzz.py::test_manager_agrees_with_its_model"
                f"[seed_{self.seed}]')\nconfiguration: {self.cfg}\noperations:\n  "
                + "\n  ".join(self.log))

    def kept(self) -> list[str]:
        return [c for c in self.order if c not in self.deleted]

    def nearest_kept(self, cid: str | None) -> str | None:
        while cid is not None and cid in self.deleted:
            cid = self.parent_of[cid]
        return cid

    def best(self, among: list[str], k: int) -> list[str]:
        """The model's k best: finite metrics only, the newer first among equals."""
        sign = 1 if self.cfg["mode"] == "min" else -1
        scored = [(sign * v, -i, c) for i, c in enumerate(self.order) if c in among
                  and (v := self.expected[c]["metrics"].get(METRIC)) is not None
                  and math.isfinite(v)]
        return [c for *_, c in sorted(scored)[:k]]

    def live(self, **fields: Any) -> dict[str, Any]:
        """What a checkpoint of the live objects must load as."""
        return {"model": copy_tree(self.model.state_dict()),
                "optimizer": copy_tree(self.optimizer.state_dict()), "step": self.step, **fields}

    def remember(self, cid: str, parent: str | None, expected: dict[str, Any]) -> None:
        self.expected[cid] = expected
        self.parent_of[cid] = parent
        self.order.append(cid)

    def forget_gone(self, before: set[str]) -> set[str]:
        """Note what retention deleted; it never takes a pinned checkpoint."""
        gone = before - set(self.mgr.list()["id"])
        assert not gone & self.pinned, f"retention deleted pinned {sorted(gone & self.pinned)}"
        self.deleted |= gone
        if gone:
            self.log.append(f"  retention deleted {sorted(gone)}")
        return gone

    # -- operations -----------------------------------------------------------------------
    def train(self) -> None:
        kind = self.r.choice(["all", "all", "frozen", "rows", "none", "last"])
        self.log.append(f"train {kind}")
        layers = list(self.model)
        if kind == "none":
            return
        if kind == "rows":
            with torch.no_grad():
                for i in self.r.sample(range(256), self.r.randint(1, 4)):
                    layers[0].weight[i] += 0.01 * torch.randn(64)
            return
        frozen = {"all": [], "frozen": layers[:2], "last": layers[:4]}[kind]
        for layer in frozen:
            layer.requires_grad_(False)
        for _ in range(self.r.randint(1, 3)):
            x, y = torch.randint(0, 256, (16,)), torch.randn(16, 8)
            self.optimizer.zero_grad(set_to_none=True)
            ((self.model(x) - y) ** 2).mean().backward()
            self.optimizer.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        for layer in frozen:
            layer.requires_grad_(True)

    def metric(self) -> dict[str, float]:
        """The metrics of a save: the ranked one may be missing, NaN or ±inf."""
        metrics, c = {"loss": float(self.step)}, self.r.random()
        if c < 0.05:
            metrics[METRIC] = math.nan
        elif c < 0.1:
            metrics[METRIC] = self.r.choice([math.inf, -math.inf])
        elif c >= 0.2:
            metrics[METRIC] = round(self.r.uniform(0, 10), 3)
        return metrics

    def op_save(self) -> None:
        self.train()
        strategy = self.r.choice([None, None, "full", "incremental", "differential"])
        metrics = self.metric()
        extra = {"k": self.r.randint(0, 1000), "list": [1, 2.5, "x"]}
        epoch = self.r.randint(0, 50)
        before = set(self.kept())
        cid = self.mgr.save(self.model, self.optimizer, epoch, metrics=metrics, step=self.step,
                            extra=extra, strategy=strategy)
        self.log.append(f"save {cid} strategy={strategy} metrics={metrics}")
        self.remember(cid, self.head, self.live(epoch=epoch, metrics=metrics, extra=extra))
        self.head = cid
        gone = self.forget_gone(before)
        assert cid not in gone, f"retention deleted the checkpoint just saved, {cid}"
        self.check_retention(cid, before | {cid}, gone)

    def check_retention(self, cid: str, before: set[str], gone: set[str]) -> None:
        """The newest N, the best K and the pinned stay; a byte budget is exceeded only
        for checkpoints retention may not delete."""
        keep_best, max_to_keep, max_bytes = (self.cfg[k] for k in
                                             ("keep_best", "max_to_keep", "max_bytes"))
        best = self.best(list(before), keep_best) if keep_best else []
        assert not gone & set(best), f"retention deleted best {sorted(gone & set(best))}"
        kept = self.kept()
        if max_to_keep and not max_bytes:
            allowed = max_to_keep + (keep_best or 0) + len(self.pinned) + 1
            assert len(kept) <= allowed, f"{len(kept)} kept, over the {allowed} allowed"
            recent = set(self.order[-max_to_keep:]) & gone
            assert not recent, f"retention deleted recent {sorted(recent)}"
        if max_bytes and self.mgr.stored_bytes() > max_bytes:
            deletable = set(kept) - self.pinned - set(best) - {cid}
            assert not deletable, f"over max_bytes={max_bytes:,} ({self.mgr.stored_bytes():,})" \
                                  f" yet {sorted(deletable)} kept"

    def op_restore(self) -> None:
        kept = self.kept()
        form = self.r.choice(["id", "prefix", "latest", "best", "-N"])
        if not kept or form == "best" and not self.cfg.get("metric"):
            return
        if form == "best":
            best = self.best(kept, 1)
            if not best:  # (each one lacks the metric or logs it NaN or ±inf)
                logged = any(METRIC in self.expected[c]["metrics"] for c in kept)
                self.log.append(f"restore best (expect a refusal, {METRIC} logged: {logged})")
                with pytest.raises(CheckpointNotFoundError, match=(
                        f"a finite '{METRIC}'" if logged else f"the metric '{METRIC}'")):
                    self.mgr.restore("best", model=self.model, optimizer=self.optimizer)
                return
            target, which = best[0], "best"
        elif form == "-N":
            back = self.r.randrange(len(kept))
            target, which = kept[-1 - back], f"-{back}"
        else:
            target = kept[-1] if form == "latest" else self.r.choice(kept)
            which = {"id": target, "latest": "latest", "prefix": target[:8]}[form]
            if sum(c.startswith(which) for c in kept) > 1:
                which = target
        self.log.append(f"restore {which} (expect {target})")
        ck = self.mgr.restore(which, model=self.model, optimizer=self.optimizer)
        assert ck.id == target, f"restore({which!r}) gave {ck.id}, not {target}"
        expected = self.expected[target]
        for name, live in (("model", self.model), ("optimizer", self.optimizer)):
            d = difference(live.state_dict(), expected[name], name)
            assert d is None, f"restore {target}: {d}"
        self.head, self.step = target, expected["step"]

    def op_pin(self) -> None:
        kept = self.kept()
        if not kept:
            return
        cid = self.r.choice(kept)
        if cid in self.pinned and self.r.random() < 0.7:
            self.log.append(f"unpin {cid}")
            self.mgr.unpin(cid)
            self.pinned.discard(cid)
        else:
            self.log.append(f"pin {cid}")
            self.mgr.pin(cid)
            self.pinned.add(cid)

    def op_delete(self) -> None:
        kept = self.kept()
        if not kept:
            return
        cid = self.r.choice(kept)
        force = self.r.random() < 0.3
        self.log.append(f"delete {cid} force={force} pinned={cid in self.pinned}")
        if cid in self.pinned and not force:
            with pytest.raises(CkptError, match="pinned"):
                self.mgr.delete(cid)
            return
        self.mgr.delete(cid, force=force)
        self.deleted.add(cid)
        self.pinned.discard(cid)

    def op_gc(self) -> None:
        compact_below = self.r.choice([0.5, 0.9, 1.0])
        self.log.append(f"gc compact_below={compact_below}")
        self.mgr.gc(compact_below=compact_below)

    def op_verify(self) -> None:
        self.log.append("verify")
        report = self.mgr.verify()
        assert report.ok and not report.bad, f"verify: {report}"

    def op_reopen(self) -> None:
        self.log.append("reopen")
        self.mgr.close()
        if self.r.random() < 0.3:
            self.cfg.update(max_to_keep=self.r.choice([None, 1, 2, 3]),
                            strategy=self.r.choice(["full", "incremental", "differential"]),
                            full_every=self.r.choice([None, 2, 3]))
            self.log.append(f"  with {self.cfg}")
        self.mgr = self.open()
        self.head = None  # (a fresh manager's next save is a new root)

    def op_second(self) -> None:
        """A second manager on the store (no retention of its own): it lists the same
        checkpoints, and may collect, save a new root, pin and delete."""
        self.log.append("second manager")
        other = CheckpointManager(self.store)
        try:
            assert set(other.list()["id"]) == set(self.kept()), "the second manager lists " \
                f"{sorted(other.list()['id'])}"
            if self.r.random() < 0.5:
                self.log.append("  its gc")
                other.gc()
            if self.r.random() < 0.4:
                self.train()
                metrics = {"loss": float(self.step)}
                if self.r.random() < 0.7:
                    metrics[METRIC] = round(self.r.uniform(0, 10), 3)
                before = set(self.kept())
                cid = other.save(self.model, self.optimizer, 1, metrics=metrics,
                                 step=self.step, extra={"by": 2})
                self.log.append(f"  its save {cid} metrics={metrics}")
                self.remember(cid, None, self.live(epoch=1, metrics=metrics, extra={"by": 2}))
                assert set(other.list()["id"]) == before | {cid}, "it deleted some"
            if self.r.random() < 0.3 and self.kept():
                cid = self.r.choice(self.kept())
                self.log.append(f"  its pin {cid}")
                other.pin(cid)
                self.pinned.add(cid)
            if self.r.random() < 0.4 and self.kept():
                # (often the first manager's head: its next save descends from the heir)
                cid = self.head if self.head in self.kept() and self.r.random() < 0.5 \
                    else self.r.choice(self.kept())
                if cid not in self.pinned:
                    self.log.append(f"  its delete {cid}")
                    other.delete(cid)
                    self.deleted.add(cid)
        finally:
            other.close()

    def op_export(self) -> None:
        kept = self.kept()
        if not kept:
            return
        cid = self.r.choice(kept)
        path = self.root / f"export-{len(self.log)}{self.r.choice(['.pt', '.safetensors'])}"
        self.log.append(f"export {cid} to {path.name}")
        self.mgr.export(cid, path)
        before = set(kept)
        new = self.mgr.import_file(path)
        path.unlink()
        self.log.append(f"  imported as {new}")
        ck = self.mgr.load(new)
        expected = self.expected[cid]
        for name in ("model", "optimizer"):
            d = difference(ck.state[name], expected[name], name)
            assert d is None, f"export of {cid} to {path.name}, imported as {new}: {d}"
        assert (ck.epoch, ck.step) == (expected["epoch"], expected["step"]), path.name
        self.remember(new, None, {**expected, "metrics": ck.metrics, "extra": ck.extra})
        gone = self.forget_gone(before)
        assert new not in gone, f"retention deleted the import just made, {new}"

    def op_diff(self) -> None:
        kept = self.kept()
        if len(kept) < 2:
            return
        a, b = self.r.sample(kept, 2)
        self.log.append(f"diff {a} {b}")
        rows = dict(zip(*(self.mgr.diff(a, b)[c] for c in ("tensor", "status"))))
        left: dict[str, torch.Tensor] = {}
        right: dict[str, torch.Tensor] = {}
        for name in ("model", "optimizer"):
            flat_tensors(self.expected[a][name], f"objects/{name}", left)
            flat_tensors(self.expected[b][name], f"objects/{name}", right)
        for name in left.keys() | right.keys():
            if name not in left or name not in right:
                status = "added" if name not in left else "removed"
            elif left[name].shape != right[name].shape:
                status = "reshaped"
            else:
                status = "changed" if difference(left[name], right[name], name) else "identical"
            assert rows.get(name) == status, f"diff {a} {b}: {name} is {rows.get(name)!r}, " \
                                             f"not {status!r}"
        others = [n for n in rows if n.startswith("objects/") and n not in left | right]
        assert not others, f"diff {a} {b}: rows of neither state: {others[:5]}"

    # -- invariants -----------------------------------------------------------------------
    def check(self, loads: bool = True) -> None:
        """The invariants; ``loads``: each checkpoint loaded and compared too (after an
        operation that writes chunks, packs or manifests, and at the end of a run)."""
        table = self.mgr.list()
        kept = self.kept()
        assert list(table["id"]) == kept, f"list() shows {list(table['id'])}, not {kept}"
        for row in table.itertuples():
            if loads:
                expected = self.expected[row.id]
                ck = self.mgr.load(row.id)
                for name in ("model", "optimizer"):
                    d = difference(ck.state[name], expected[name], name)
                    assert d is None, f"{row.id} loads wrong: {d}"
                for name in ("epoch", "step", "metrics", "extra"):
                    d = difference(getattr(ck, name), expected[name], name)
                    assert d is None, f"{row.id} loads wrong: {d}"
            assert row.pinned == (row.id in self.pinned), f"{row.id}: pinned is {row.pinned}"
            parent = self.nearest_kept(self.parent_of[row.id])
            assert row.parent == parent, f"{row.id}: parent {row.parent}, not {parent}"
        head = self.nearest_kept(self.head)
        heads = list(table["id"][table["head"]])
        assert heads == ([head] if head else []), f"head column on {heads}, not on {head}"
        if self.cfg.get("metric"):
            best = set(self.best(kept, self.cfg["keep_best"] or 1))
            assert set(table["id"][table["best"]]) == best, \
                f"best column on {sorted(table['id'][table['best']])}, not on {sorted(best)}"
        last: dict[str, str | None] = {}
        for row in table.itertuples():  # a branch is a chain
            if row.branch in last:
                assert row.parent == last[row.branch], \
                    f"{row.id}'s parent {row.parent} is not branch {row.branch}'s last"
            last[row.branch] = row.id

    def run(self, ops: int) -> None:
        weighted: list[tuple[Callable[[], None], float]] = [
            (self.op_save, 10), (self.op_restore, 3), (self.op_pin, 1), (self.op_delete, 1.5),
            (self.op_gc, 1), (self.op_verify, 0.5), (self.op_reopen, 1), (self.op_second, 1),
            (self.op_export, 0.7), (self.op_diff, 1)]
        operations, weights = zip(*weighted)
        # Those that write no chunk, pack or manifest (a pin writes a label, a restore
        # reads; each checked by what list() shows) leave every load as the last check's:
        # loads are checked after the others, and at the end.
        reading = {self.op_restore, self.op_pin, self.op_verify, self.op_diff}
        loaded = True
        for _ in range(ops):
            operation = self.r.choices(operations, weights)[0]
            operation()
            loaded = operation not in reading
            self.check(loads=loaded)
        if not loaded:
            self.check()


@pytest.mark.usefixtures("one_thread")
@pytest.mark.filterwarnings("ignore:the store at .* over its byte budget:RuntimeWarning")
@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed_{s}" for s in SEEDS])
def test_manager_agrees_with_its_model(tmp_path: Path, seed: int) -> None:
    fuzz = Fuzz(seed, tmp_path)
    try:
        fuzz.run(OPS)
    except Exception as exc:
        raise AssertionError(fuzz.report()) from exc
    finally:
        fuzz.mgr.close()


def kill_child(store: str, states: str, seed: int, conn: Connection) -> None:
    """Random saves (under a byte budget or max_to_keep, maybe keep_best), deletes, gc, pins
    and restores until killed; each save's state goes to ``<tag>.pt`` in ``states`` first."""
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    r = random.Random(seed)
    options: dict[str, Any] = {"strategy": r.choice(["full", "incremental", "differential"]),
                               "chunk_size": r.choice([4096, 16384, 1 << 20])}
    limit = r.choice(["max_to_keep", "max_bytes", None])
    if limit:
        options[limit] = r.choice([1, 2, 3] if limit == "max_to_keep" else
                                  [300_000, 1_000_000, 2_000_000])
    if r.random() < 0.4:
        options.update(keep_best=1, metric=METRIC, mode="min")
    mgr = CheckpointManager(store, **options)
    model, optimizer = build()
    conn.send("ready")
    try:
        work(mgr, model, optimizer, r, Path(states))
    except BaseException:
        conn.send(traceback.format_exc())
        raise


def work(mgr: CheckpointManager, model: torch.nn.Sequential, optimizer: torch.optim.AdamW,
         r: random.Random, states: Path) -> None:
    """The worker's loop, one random operation a turn."""
    for tag in itertools.count():
        ids = list(mgr.list()["id"])
        op = r.random()
        if op < 0.6 or not ids:
            if r.random() < 0.3:
                with torch.no_grad():
                    model[0].weight[r.randrange(256)] += 1
            else:
                optimizer.zero_grad()
                model(torch.randint(0, 256, (16,))).pow(2).mean().backward()
                optimizer.step()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       states / f"{tag}.pt")
            mgr.save(model, optimizer, metrics={METRIC: r.random()}, extra={"tag": tag})
        elif op < 0.7 and len(ids) > 1:
            mgr.delete(r.choice(ids[:-1]), force=True)
        elif op < 0.8:
            mgr.gc(compact_below=r.choice([0.5, 1.0]))
        elif op < 0.9:
            (mgr.pin if r.random() < 0.4 else mgr.unpin)(r.choice(ids))
        else:
            mgr.restore(r.choice(ids), model=model, optimizer=optimizer)


def audit_kill(store: Path, states: Path, when: str) -> None:
    """Every listed checkpoint loads bit-exact to the state saved under its tag; verify agrees."""
    mgr = CheckpointManager(store)
    try:
        for cid in mgr.list()["id"]:
            ck = mgr.load(cid)
            expected = torch.load(states / f"{ck.extra['tag']}.pt")
            for name in ("model", "optimizer"):
                d = difference(ck.state[name], expected[name], name)
                assert d is None, f"{when}: {cid} (tag {ck.extra['tag']}) loads wrong: {d}"
        report = mgr.verify()
        assert report.ok, f"{when}: verify: {report}"
    finally:
        mgr.close()


@pytest.mark.usefixtures("real_main")
@pytest.mark.parametrize("seed", KILL_SEEDS, ids=[f"kill_seed_{s}" for s in KILL_SEEDS])
def test_store_killed_amid_budget_deletes_and_gc_opens_whole(tmp_path: Path, seed: int) -> None:
    """test_crash kills saves under max_to_keep; here a kill may land in a byte budget's
    compaction, a delete, a gc, a pin or a restore too: every checkpoint left restores, and
    the store takes gc, a new save and retention."""
    store, states = tmp_path / "store", tmp_path / "states"
    states.mkdir()
    parent, child = CONTEXT.Pipe(duplex=False)
    proc = CONTEXT.Process(target=kill_child, args=(str(store), str(states), seed, child),
                           daemon=True)
    proc.start()
    child.close()
    try:
        assert parent.poll(60) and parent.recv() == "ready", f"seed {seed}: no worker"
        time.sleep(random.Random(seed).uniform(0.2, 1.5))
        proc.kill()
        proc.join(60)
        assert proc.exitcode == -signal.SIGKILL, \
            f"seed {seed}: the worker failed first:\n{parent.recv() if parent.poll() else ''}"
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    where = f"seed {seed} (store {store})"
    audit_kill(store, states, f"{where}, after the kill")
    with CheckpointManager(store) as mgr:
        mgr.gc()
    audit_kill(store, states, f"{where}, after gc")
    model, optimizer = build()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
               states / "new.pt")
    with CheckpointManager(store, max_to_keep=1) as mgr:
        mgr.save(model, optimizer, extra={"tag": "new"})
    audit_kill(store, states, f"{where}, after a save and retention")
