"""A store remembers the metric and mode its checkpoints are ranked by: a manager opened
without ``metric=`` (the explorer's, the CLI's, a fresh kernel's) ranks as its writer did,
and a metric whose direction nobody said and whose name does not say is marked best
nowhere. Real SQLite catalogs, real stores, a real in-process IPython shell."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import ckpt_nb
from ckpt_nb import CheckpointManager, CheckpointNotFoundError, _metric_names, _plots, _session
from ckpt_nb.cli import main


def bleu_store(directory: Path, scores: tuple[float, ...] = (0.1, 0.9, 0.5),
               **ranking: str) -> list[str]:
    """Checkpoints of an nn.Linear logging ``bleu`` (higher is better), saved by a
    manager given ``ranking`` (metric=, mode=) or none."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(directory, **ranking) as mgr:  # type: ignore[arg-type]
        return [mgr.save(model, step=i, metrics={"bleu": s}) for i, s in enumerate(scores)]


def explorer_best(directory: Path) -> tuple[dict[str, list[str]], list[str]]:
    """What the explorer marks best: the table's bold metrics per row, the DAG's gold."""
    ui = ckpt_nb.explore(directory, namespace={}, poll_seconds=0)
    try:
        return ({r["id"]: r["best"] for r in ui.table.rows},
                [n["id"] for n in ui.dag.nodes if n["best"]])
    finally:
        ui.close()


def test_a_manager_without_metric_ranks_as_the_stores_saves_did(tmp_path: Path) -> None:
    """CheckpointManager(metric="bleu", mode="max") saved; the explorer, a plain manager
    and the CLI took bleu for a loss and marked the worst checkpoint best."""
    ids = bleu_store(tmp_path, metric="bleu", mode="max")
    with CheckpointManager(tmp_path) as mgr:
        assert (mgr.metric, mgr.mode) == ("bleu", "max")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (the store's only ranking: nothing to say)
            assert mgr.resolve("best") == ids[1]
        assert list(mgr.list().query("best")["id"]) == [ids[1]]
    bold, gold = explorer_best(tmp_path)
    assert bold == {ids[0]: [], ids[1]: ["bleu"], ids[2]: []} and gold == [ids[1]]
    assert _plots.plot_dag(tmp_path) is not None  # (opens its own manager: no error)
    assert main(["show", str(tmp_path), "best"]) == 0


def test_best_by_the_record_is_said_only_where_another_ranking_may_be_meant(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """"'best' is by X, the ranking an earlier save recorded" was said at every use (each
    `ckpt-nb show DIR best`) of a store that only ever had that ranking: now where the
    store held another, once a manager."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path, metric="bleu", mode="max") as run:
        for epoch, bleu in enumerate((0.1, 0.9)):
            run.save(model, epoch=epoch, batch_idx=5, metrics={"loss": 1.0})  # (mid-epoch)
            run.save(model, epoch=epoch, metrics={"loss": 0.5, "bleu": bleu})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["show", str(tmp_path), "best"]) == 0
        with CheckpointManager(tmp_path) as plain:
            best = plain.resolve("best")
    assert "is by" not in capsys.readouterr().err
    with CheckpointManager(tmp_path, metric="loss") as other:  # (another ranking recorded)
        other.save(model, metrics={"loss": 0.7, "bleu": 0.95})
    with CheckpointManager(tmp_path, metric="bleu", mode="max") as again:
        top = again.save(model, metrics={"loss": 0.9, "bleu": 0.99})
    with CheckpointManager(tmp_path) as plain:
        with pytest.warns(UserWarning, match=r"'best' is by bleu \(max\), the ranking an "
                                             "earlier save recorded in this store"):
            assert plain.resolve("best") == top != best
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (said once a manager)
            assert plain.resolve("best") == top
    for path in tmp_path.glob("catalog.sqlite*"):
        path.unlink()
    with pytest.warns(RuntimeWarning, match="rebuilt"):  # (the rankings, from the manifests)
        rebuilt = CheckpointManager(tmp_path)
    with rebuilt, pytest.warns(UserWarning, match=r"'best' is by bleu \(max\)"):
        assert rebuilt.resolve("best") == top


def test_a_catalog_made_before_rankings_were_kept_keeps_them_from_its_next_ranked_save(
        tmp_path: Path) -> None:
    """A catalog of an earlier ckpt_nb records the ranking but not those before it, so
    "best" by it is said (another may have been meant); the next save ranking by it keeps
    the rankings from then on: its saves ranking as before never wrote them, and the
    warning stayed at every use."""
    ids = bleu_store(tmp_path, metric="bleu", mode="max")
    with sqlite3.connect(tmp_path / "catalog.sqlite") as db:  # (as an earlier ckpt_nb left it)
        db.execute("DELETE FROM meta WHERE key = 'rankings'")
    db.close()
    with CheckpointManager(tmp_path) as plain:
        with pytest.warns(UserWarning, match=r"'best' is by bleu \(max\), the ranking an "):
            assert plain.resolve("best") == ids[1]
    with CheckpointManager(tmp_path, metric="bleu", mode="max") as run:
        run.save(torch.nn.Linear(2, 2), metrics={"bleu": 0.2})
    with CheckpointManager(tmp_path) as plain, warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plain.resolve("best") == ids[1]


def test_another_runs_recorded_metric_is_named_where_best_uses_it(tmp_path: Path) -> None:
    """Yesterday's run saved with metric="val_loss"; today's plain manager, logging acc
    alone, restored yesterday's best into today's model without a word."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path, metric="val_loss") as yesterday:
        old = yesterday.save(model, metrics={"val_loss": 0.1})
    with CheckpointManager(tmp_path) as today:
        for acc in (0.5, 0.9):
            today.save(model, metrics={"acc": acc})
        with pytest.warns(UserWarning, match="'best' is by val_loss .min., the ranking an "
                                             "earlier save recorded"):
            assert today.restore("best", model=model, rng=False).id == old
    with CheckpointManager(tmp_path / "acc_only", metric="val_loss") as ranked:
        ranked.save(model, metrics={"acc": 0.5})
        with pytest.raises(CheckpointNotFoundError) as given:
            ranked.resolve("best")
    assert str(given.value) == ("no checkpoint has the metric 'val_loss'; the metrics "
                                "logged are: acc")
    with CheckpointManager(tmp_path / "acc_only") as plain:
        with pytest.raises(CheckpointNotFoundError) as taken:
            plain.resolve("best")
    assert str(taken.value) == ("no checkpoint has the metric 'val_loss', the metric an "
                                "earlier save recorded in this store: give a metric "
                                "(metric=, --metric) to rank by another; the metrics logged "
                                "are: acc")


def test_an_explicit_metric_wins_and_a_reader_records_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = bleu_store(tmp_path, metric="bleu", mode="max")
    with CheckpointManager(tmp_path, metric="bleu", mode="min") as reader:
        assert reader.resolve("best") == ids[0]
        reader.list()
    capsys.readouterr()
    assert main(["show", str(tmp_path), "best", "--metric", "bleu", "--mode", "min"]) == 0
    assert ids[0] in capsys.readouterr().out
    with CheckpointManager(tmp_path) as mgr:
        assert (mgr.metric, mgr.mode) == ("bleu", "max")  # (only a save records)


def test_the_last_save_given_a_metric_sets_the_ranking(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)

    def recorded() -> tuple[str | None, str]:
        with CheckpointManager(tmp_path) as mgr:
            return mgr.metric, mgr.mode

    translate = CheckpointManager(tmp_path, metric="bleu", mode="max")
    translate.save(model, metrics={"bleu": 0.4})
    with CheckpointManager(tmp_path) as plain:
        assert (plain.metric, plain.mode) == ("bleu", "max")
        with CheckpointManager(tmp_path, metric="wer") as asr:
            asr.save(model, metrics={"wer": 0.1})
        assert recorded() == ("wer", "min")
        plain.save(model, metrics={"bleu": 0.0})  # (it was given no metric: records none)
        assert recorded() == ("wer", "min")
    translate.save(model, metrics={"bleu": 0.5})
    assert recorded() == ("bleu", "max")
    translate.close()


def test_a_recorded_ranking_turns_no_retention_on(tmp_path: Path) -> None:
    """keep_best still needs metric= given; max_to_keep alone keeps the newest, the
    recorded best among them or not."""
    ids = bleu_store(tmp_path, (0.9, 0.1), metric="bleu", mode="max")
    with pytest.raises(ValueError, match="keep_best needs metric="):
        CheckpointManager(tmp_path, keep_best=1)
    with CheckpointManager(tmp_path, max_to_keep=2) as mgr:
        newer = [mgr.save(torch.nn.Linear(2, 2), metrics={"bleu": 0.2}) for _ in range(2)]
        assert set(mgr.list()["id"]) == set(newer) and ids[0] not in set(mgr.list()["id"])


def test_a_rebuilt_catalog_keeps_the_ranking_of_the_last_save_given_a_metric(
        tmp_path: Path) -> None:
    """The manifests hold the record too: a lost catalog, a memory:// store's (read from
    the store at each open) and an object store's cache on another machine rank as the
    last save given a metric did, not as a later save that took the record."""
    model = torch.nn.Linear(2, 2)
    for url in (tmp_path / "local", f"memory://ranking-{tmp_path.name}"):
        with CheckpointManager(url, metric="wer") as asr:
            first = asr.save(model, metrics={"wer": 0.1})
        with CheckpointManager(url, metric="bleu", mode="max") as translate:
            translate.save(model, metrics={"bleu": 0.2})
            best = translate.save(model, metrics={"bleu": 0.9})
        with CheckpointManager(url) as plain:  # (it took bleu, max: it records nothing)
            plain.save(model, metrics={"bleu": 0.5})
        if isinstance(url, Path):
            (url / "catalog.sqlite").unlink()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # (the catalog was rebuilt)
            with CheckpointManager(url) as mgr, pytest.warns(UserWarning, match="'best'"):
                assert (mgr.metric, mgr.mode) == ("bleu", "max")
                assert mgr.resolve("best") == best != first


def test_a_store_whose_saves_recorded_no_ranking_has_no_best(tmp_path: Path) -> None:
    """A rebuilt catalog of saves made without a metric (or by a ckpt_nb from before
    manifests held the ranking) ranks by none: "best" needs metric=."""
    bleu_store(tmp_path)
    (tmp_path / "catalog.sqlite").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the catalog was rebuilt)
        with CheckpointManager(tmp_path) as mgr:
            assert mgr.metric is None
            with pytest.raises(CheckpointNotFoundError, match="no save to this store recorded"):
                mgr.resolve("best")


def test_a_metric_whose_direction_is_unknown_is_best_nowhere(tmp_path: Path) -> None:
    """No ranking recorded, and "quality" says neither lower nor higher: the explorer and
    the plots guessed "min" and marked the worst checkpoint best."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path) as mgr:
        ids = [mgr.save(model, metrics={"quality": b, "val_acc": a, "loss": loss})
               for b, a, loss in ((0.1, 0.5, 2.0), (0.9, 0.7, 1.0), (0.5, 0.6, 3.0))]
        table = mgr.list()
    assert _plots.metric_mode("quality") is None
    assert _plots.metric_mode("quality", "quality", "max") == "max"
    assert _plots.best_by_metric(table) == {"val_acc": ids[1], "loss": ids[1]}
    only_quality = table.drop(columns=["val_acc", "loss"])
    assert _plots.best_by_metric(only_quality) == {}
    assert not any(n.best for n in _plots.dag_layout(only_quality))
    bold, _ = explorer_best(tmp_path)
    assert all("quality" not in marked for marked in bold.values())


@pytest.mark.parametrize(("name", "mode"), [
    ("bleu", "max"), ("val_wer", "min"), ("FID", "min"), ("mAP50", "max"), ("miou", "max"),
    ("rougeL", "max"), ("previous_loss", "min"), ("center_loss", "min"), ("power", None),
    ("dice_loss", "min"), ("bce_dice_loss", "min"), ("map_loss", "min"), ("wer_acc", "max"),
    ("confidence", None)])
def test_a_metric_name_says_its_direction_by_its_words(name: str, mode: str | None) -> None:
    """bleu, wer, fid, map and iou said nothing (wer and cer were once guessed right as
    losses); a short one only as a word: "iou" is in "previous", "fid" in "confidence"."""
    assert _metric_names.metric_mode_from_name(name) == mode


def test_a_sessions_on_metric_ranks_a_fresh_kernels_best(
        tmp_path: Path, shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    """%%ckpt_auto --on bleu:max saved; %ckpt_ui and rollback("best") in a fresh kernel
    ranked bleu as a loss, or refused "best" for want of a metric."""
    store = tmp_path / "store"
    shell.run_cell("import torch, ckpt_nb\nmodel = torch.nn.Linear(4, 2)\n"
                   "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                   "scores = [0.2, 0.9, 0.5]", store_history=False)
    result = shell.run_cell(f"""%%ckpt_auto --dir {store} --on bleu:max
for epoch in ckpt_nb.epochs(3):
    opt.zero_grad(); model(torch.ones(1, 4)).sum().backward(); opt.step()
    ckpt_nb.log(bleu=scores[epoch])
""", store_history=False)
    assert result.success
    for name, fresh in (("_last", None), ("_positions", {}), ("_position_events", {})):
        monkeypatch.setattr(_session, name, fresh)  # (a new kernel's)
    frame = CheckpointManager(store).list()
    best = frame.loc[frame["bleu"] == 0.9, "id"].item()
    assert list(frame.query("best")["id"]) == [best]
    assert explorer_best(store)[1] == [best]
    assert ckpt_nb.rollback("best", directory=store, namespace=shell.user_ns) == best


def test_of_equal_values_the_table_and_the_dag_mark_the_one_best_restores(
        tmp_path: Path) -> None:
    """The table's bold took the oldest of equal losses, restore("best") the newest."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path, metric="loss") as mgr:
        ids = [mgr.save(model, metrics={"loss": v}) for v in (1.0, 0.5, 0.5)]
        assert mgr.resolve("best") == ids[2]
        assert _plots.best_by_metric(mgr.list()) == {"loss": ids[2]}
    bold, gold = explorer_best(tmp_path)
    assert bold[ids[2]] == ["loss"] and not bold[ids[1]] and gold == [ids[2]]


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_manager_opened_before_the_first_ranked_save_follows_the_record(
        tmp_path: Path, where: str) -> None:
    """A manager (a notebook's explorer) opened before a run with on= saved said "no save
    to this store recorded" a metric, while a fresh one found the best: the ranking was
    read at open alone. It follows the record (and a later one); one given metric= keeps
    its own."""
    url = tmp_path if where == "local" else f"memory://follow-{tmp_path.name}"
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(url) as warmup:
        warmup.save(model, metrics={"bleu": 0.0, "wer": 1.0})  # (unranked)
    early, given = CheckpointManager(url), CheckpointManager(url, metric="wer", mode="max")
    ui = ckpt_nb.explore(url, namespace={}, poll_seconds=0)
    try:
        with pytest.raises(CheckpointNotFoundError, match="no save to this store recorded"):
            early.resolve("best")
        ids = bleu_store(url, metric="bleu", mode="max")  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (the store's only ranking: nothing to say)
            assert early.resolve("best") == ids[1]
            assert list(early.list().query("best")["id"]) == [ids[1]]
            assert early.restore("best", model=model, rng=False).id == ids[1]
            ui.refresh()
            assert ui.select("best") == [ids[1]]
        assert [n["id"] for n in ui.dag.nodes if n["best"]] == [ids[1]]
        with CheckpointManager(url, metric="wer") as asr:  # (another run: another record)
            wer = asr.save(model, metrics={"wer": 0.01})
        with pytest.warns(UserWarning, match=r"'best' is by wer \(min\)"):  # (said again)
            assert early.resolve("best") == wer
        worst = early.save(model, metrics={"wer": 2.0})  # (ranks as the record: records none)
        assert given.resolve("best") == worst  # (it keeps its own: max)
        assert (given.metric, given.mode) == ("wer", "max")
        with CheckpointManager(url) as fresh:
            assert (fresh.metric, fresh.mode) == ("wer", "min")
    finally:
        ui.close()
        early.close()
        given.close()


def test_an_active_sessions_rollback_to_best_follows_a_ranking_recorded_since(
        tmp_path: Path) -> None:
    """The session's manager (no on=) was opened before another manager's ranked saves:
    rollback("best") refused, saying no save to the store recorded a metric."""
    model = torch.nn.Linear(2, 2)
    with ckpt_nb.auto(tmp_path, namespace={"model": model}):
        ids = bleu_store(tmp_path, metric="bleu", mode="max")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (the store's only ranking: nothing to say)
            assert ckpt_nb.rollback("best") == ids[1]


def test_a_metrics_name_gives_its_direction_where_no_mode_is_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """metric="accuracy" with keep_best=2 ranked lower-is-better: it deleted the most
    accurate checkpoint and restored the least as "best"; the CLI's --metric likewise."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path, keep_best=2, metric="accuracy") as mgr:
        ids = [mgr.save(model, step=i, metrics={"accuracy": a})
               for i, a in enumerate((0.5, 0.97, 0.6, 0.7, 0.65))]
        assert mgr.mode == "max" and mgr.resolve("best") == ids[1]
        assert list(mgr.list()["id"]) == [ids[1], ids[3], ids[4]]
    capsys.readouterr()
    assert main(["show", str(tmp_path), "best", "--metric", "accuracy"]) == 0
    assert ids[1] in capsys.readouterr().out
    with pytest.raises(ValueError) as refused:
        CheckpointManager(tmp_path / "other", keep_best=2, metric="quality")
    assert str(refused.value) == (
        "metric='quality': its name does not say whether a lower or a higher quality is "
        'better, and no save here recorded it; give mode="min" or mode="max"')
    assert not (tmp_path / "other").exists()  # (refused before the store is made)
    with pytest.raises(TypeError, match="metric must be the name of a logged metric"):
        CheckpointManager(tmp_path, keep_best=2, metric=1)  # type: ignore[arg-type]
    with CheckpointManager(tmp_path / "q", metric="quality", mode="max") as mgr:
        mgr.save(model, metrics={"quality": 1.0})
    assert main(["show", str(tmp_path / "q"), "best", "--metric", "quality"]) == 0  # recorded
    with CheckpointManager(tmp_path / "q", metric="quality") as mgr:  # (as the CLI takes it)
        assert mgr.mode == "max"
    with pytest.raises(ValueError, match="no save here recorded it; give mode=\"min\" or "
                       "mode=\"max\"; did you mean metric='quality'[?]"):
        CheckpointManager(tmp_path / "q", metric="qualty")  # (a typo: the record is another's)
    with CheckpointManager(tmp_path / "q2") as mgr:
        mgr.save(model, metrics={"quality": 1.0})
    capsys.readouterr()
    assert main(["show", str(tmp_path / "q2"), "best", "--metric", "quality"]) == 2
    assert capsys.readouterr().err == (
        "ckpt-nb: --metric quality: its name does not say whether a lower or a higher value "
        "is better; give --mode min or --mode max\n")
    assert main(["show", str(tmp_path / "q2"), "best", "--metric", "quality",
                 "--mode", "max"]) == 0
