"""A newcomer's slips with ``CheckpointManager``: each is refused by name, or warned of,
before it costs a checkpoint. Real stores, real modules and optimizers, real sessions."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import CheckpointManager, CheckpointNotFoundError

pytestmark = pytest.mark.usefixtures("fresh_process_state")

LOSSES = (0.9, 0.2, 0.5, 0.7)


def test_keep_best_by_a_metric_no_save_logs_deletes_none_and_says_the_likely_one(
        tmp_path: Path) -> None:
    """metric="val_los" (the saves log val_loss), keep_best=2: every checkpoint but the
    newest was deleted, the 0.2 model among them, without a word."""
    model = torch.nn.Linear(4, 2)
    with CheckpointManager(tmp_path, keep_best=2, metric="val_los", mode="min") as mgr:
        with pytest.warns(RuntimeWarning) as said:
            ids = [mgr.save(model, epoch=i, metrics={"val_loss": v})
                   for i, v in enumerate(LOSSES)]
        assert list(mgr.list()["id"]) == ids
    assert [str(w.message) for w in said] == [
        "this save logs 'val_loss' but not 'val_los', the metric keep_best ranks by: this "
        "checkpoint is never 'best'; did you mean metric='val_loss'?",
        "keep_best=2 ranks by 'val_los', which no checkpoint logs, so retention deletes none "
        "by it until one does; the metrics logged are: val_loss; did you mean "
        "metric='val_loss'?"]  # (once each per manager)
    with CheckpointManager(tmp_path, keep_best=2, metric="val_loss") as mgr:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (the metric logged: the documented rule)
            mgr.save(model, epoch=4, metrics={"val_loss": 0.8})
        assert list(mgr.list()["val_loss"]) == [0.2, 0.5, 0.8]


def test_a_sessions_keep_best_by_a_metric_never_logged_deletes_none(tmp_path: Path) -> None:
    """--on val_los:min --keep-best 2 in a cell logging val_loss deleted every checkpoint
    but the newest as the run went; the end line said only that --on never fired."""
    ns = {"model": torch.nn.Linear(4, 2)}
    with pytest.warns(RuntimeWarning, match="keep_best=2 ranks by 'val_los', which no "
                                            "checkpoint logs"):
        with ckpt_nb.auto(tmp_path, namespace=ns, on=("val_los", "min"), keep_best=2,
                          name="x", track=["model"], sync=True) as session:
            for loss in LOSSES:
                ckpt_nb.log(val_loss=loss)
                session.save(wait=True)
    with CheckpointManager(tmp_path) as mgr:
        assert sorted(mgr.list()["val_loss"]) == sorted(LOSSES)


class Boom:
    """A value whose unpickling runs code: it must never be unpickled untrusted."""
    ran = False

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return Boom.mark, ()

    @staticmethod
    def mark() -> None:
        Boom.ran = True


def test_a_flag_that_is_not_a_bool_is_refused_and_no_pickle_runs(tmp_path: Path) -> None:
    """trust_pickle="no" (from a config file) is true, and unpickled the store's code in
    restore, load and import_file; strict="no" was strict, rng="yes" taken."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path / "store") as mgr:
        cid = mgr.save(model, extra={"obj": Boom()})
        Boom.ran = False
        exported = mgr.export(cid, tmp_path / "x.safetensors", trust_pickle=True)
        Boom.ran = False
        calls = {
            "trust_pickle": [lambda v: mgr.restore(cid, model=model, trust_pickle=v),
                             lambda v: mgr.load(cid, trust_pickle=v),
                             lambda v: mgr.load(exported, trust_pickle=v),
                             lambda v: mgr.import_file(exported, trust_pickle=v),
                             lambda v: mgr.export(cid, tmp_path / "y.pt", trust_pickle=v)],
            "strict": [lambda v: mgr.restore(cid, model=model, strict=v)],
            "rng": [lambda v: mgr.restore(cid, model=model, rng=v),
                    lambda v: mgr.save(model, rng=v)],
            "copy_tensors": [lambda v: mgr.capture({"model": model}, copy_tensors=v)],
            "force": [lambda v: mgr.delete(cid, force=v)],
            "pinned": [lambda v: mgr.pin(cid, v)],
        }
        for flag, uses in calls.items():
            for use in uses:
                for value in ("no", "False", 0, None):
                    with pytest.raises(TypeError) as refused:
                        use(value)
                    assert str(refused.value) == f"{flag} takes True or False, not {value!r}"
        assert not Boom.ran and len(mgr.list()) == 1  # (nothing saved, pinned nor deleted)
        assert not mgr.list()["pinned"].any()
    with pytest.raises(TypeError, match="durable takes True or False, not 'no'"):
        CheckpointManager(tmp_path / "other", durable="no")  # type: ignore[arg-type]


def test_a_restore_names_the_saved_objects_it_leaves_out(tmp_path: Path) -> None:
    """The README saved ema=ema and restored without it: the EMA and a generator stayed
    as freshly built, and a scheduler left out restarted its schedule, without a word."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 1.0 / (1 + e))
    ema = torch.optim.swa_utils.AveragedModel(model)
    gen = torch.Generator().manual_seed(3)
    with CheckpointManager(tmp_path / "store") as mgr:
        cid = mgr.save(model, optimizer, 0, scheduler=sched, ema=ema, gen=gen)
        with pytest.warns(UserWarning) as said:
            ck = mgr.restore(cid, model=model, optimizer=optimizer)
        assert [str(w.message) for w in said] == [
            f"checkpoint {cid} also holds scheduler (LambdaLR), ema (AveragedModel), gen "
            "(Generator), not restored: they are in ck.state; pass them by keyword to "
            "restore them (restore(..., scheduler=...))"]
        assert list(ck.state) == ["scheduler", "ema", "gen"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (all put back: nothing to say)
            mgr.restore(cid, model=model, optimizer=optimizer, scheduler=sched, ema=ema,
                        gen=gen)
            mgr.restore(cid, model=model)  # (the model alone, to evaluate it: no resume)
            mgr.export(cid, tmp_path / "model.pt", only="model")
            mgr.restore(tmp_path / "model.pt", model=model)  # (a file holding the model alone)


def test_a_save_refuses_objects_in_each_others_places_and_an_empty_one(
        tmp_path: Path) -> None:
    """save(optimizer, model) stored an SGD as the model, scheduler=optimizer an optimizer
    as the scheduler, and save() a checkpoint of RNG state alone: all without a word."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    with CheckpointManager(tmp_path) as mgr:
        for call, said in (
                (lambda: mgr.save(optimizer, model, 1), "save()'s model is an optimizer (SGD)"),
                (lambda: mgr.save(model, model), "save()'s optimizer is a module (Linear)"),
                (lambda: mgr.save(model, optimizer, scheduler=optimizer),
                 "save()'s scheduler is an optimizer (SGD)"),
                (lambda: mgr.save(model, optimizer, scheduler=model),
                 "save()'s scheduler is a module (Linear)")):
            with pytest.raises(TypeError) as refused:
                call()
            assert str(refused.value) == (
                f"{said}: were the objects given in another order? save(model, optimizer, "
                "epoch, scheduler=...) takes the model first; nothing was saved")
        for empty in (lambda: mgr.save(), lambda: mgr.save(None, None, 2)):
            with pytest.raises(ValueError, match="save.. was given nothing to save: pass the "
                                                 "model and optimizer"):
                empty()
        assert len(mgr.list()) == 0
        mgr.save(model, optimizer, scheduler=sched)  # (the right places)
        mgr.save(epoch=1, extra={"note": "data only"})  # (values alone are a save)
        assert len(mgr.list()) == 2


def test_a_save_says_its_optimizer_steps_a_model_made_anew(tmp_path: Path) -> None:
    """The model cell run again, the optimizer's not: the optimizer steps the old model's
    parameters and save(model, opt) said nothing, where the magics warn."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = torch.nn.Linear(4, 2)
    with CheckpointManager(tmp_path) as mgr:
        with pytest.warns(UserWarning) as said:
            mgr.save(model, optimizer, 0)
            mgr.save(model, optimizer, 1)  # (once per manager)
        assert [str(w.message) for w in said] == [
            "optimizer steps parameters that no module saved with it holds: if the training "
            "uses it, re-create it on the model's parameters (optimizer = "
            "torch.optim.SGD(model.parameters(), ...)) after `model = ...` ran again, or the "
            "model never trains"]
        other = torch.optim.SGD(torch.nn.Linear(3, 3).parameters(), lr=0.1)  # (a part unsaved)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            mgr.save(model, torch.optim.SGD(model.parameters(), lr=0.1), 2, gan_opt=other)
            # (an RL temperature's optimizer: one tensor, shaped as a critic's last bias)
            critic = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
            log_alpha = torch.zeros(1, requires_grad=True)
            mgr.save(critic, torch.optim.Adam(critic.parameters()), 3,
                     alpha_opt=torch.optim.Adam([log_alpha]))


def test_mid_epoch_saves_of_training_metrics_are_not_told_of_the_ranked_one(
        tmp_path: Path) -> None:
    """Saves every few steps log the training loss, the validation loss comes with the
    epoch's end: the never-best and keep_best warnings fired on this correct run, and
    suggested the training loss as the ranking's metric."""
    model = torch.nn.Linear(4, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with CheckpointManager(tmp_path, keep_best=1, metric="val_loss") as mgr:
            for epoch in range(2):
                for batch_idx in (3, 7):
                    mgr.save(model, epoch=epoch, batch_idx=batch_idx,
                             metrics={"train_loss": 1.0 / (1 + batch_idx)})
                mgr.save(model, epoch=epoch, metrics={"train_loss": 0.1,
                                                      "val_loss": 0.5 - epoch / 10})
            assert len(mgr.list()) == 1  # (the best; the others once one carried it)
    with pytest.warns(RuntimeWarning, match="did you mean metric='val_loss'"):
        with CheckpointManager(tmp_path / "typo", keep_best=1, metric="val_los",
                               mode="min") as mgr:
            mgr.save(model, epoch=0, metrics={"val_loss": 0.5})  # (an epoch's end: told)


@pytest.mark.parametrize("metrics", [[0.5], 0.5, "val_loss"])
def test_metrics_that_are_not_a_dict_are_refused_by_name(tmp_path: Path,
                                                         metrics: object) -> None:
    """metrics=[0.5] raised an AttributeError from inside ckpt_nb ('list' object has no
    attribute 'items'), where extra=[1, 2] said what to give."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path) as mgr:
        for call in (lambda: mgr.save(model, metrics=metrics),
                     lambda: mgr.capture({"model": model}, metrics=metrics),
                     lambda: mgr.save_state(mgr.capture({"model": model}), metrics=metrics)):
            with pytest.raises(TypeError) as refused:
                call()  # type: ignore[no-untyped-call]
            assert str(refused.value).startswith(
                "metrics must be a dict of name -> number (metrics={'val_loss': 0.31}), not "
                f"{type(metrics).__name__} ")
        assert len(mgr.list()) == 0


def test_a_store_path_that_is_a_file_is_refused_as_such(tmp_path: Path) -> None:
    """CheckpointManager("afile") said "cannot create store directory ...: [Errno 17] File
    exists", where %ckpt_list and explore() say it is a file."""
    (tmp_path / "afile").write_text("notes")
    for directory in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        for opening in (CheckpointManager, ckpt_nb.open_store):
            with pytest.raises(ckpt_nb.StoreError) as refused:
                opening(directory)
            assert str(refused.value) == (
                f"{tmp_path / 'afile'} is a file: give a directory, the folder a "
                "CheckpointManager saves its checkpoints into")
    assert (tmp_path / "afile").read_text() == "notes"


def test_arguments_of_the_wrong_type_are_refused_by_name(tmp_path: Path) -> None:
    """delete([a, b]) said "sequence item 0: expected str instance, list found";
    export(cid, 5), import_file(3) and CheckpointManager(None) said "expected str, bytes
    or os.PathLike object", naming no argument; pin([a]) looked for the id "['...']"."""
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"directory must be a folder's path or a store URL "
                                        r"\(CheckpointManager\('runs/exp1'\)\), not None"):
        CheckpointManager(None)  # type: ignore[arg-type]
    with CheckpointManager(tmp_path / "store") as mgr:
        a, b = mgr.save(model), mgr.save(model)
        for ids, kind in (([a, b], "list"), (mgr.list()["id"], "Series"),
                          (mgr.list()["id"].to_numpy(), "ndarray")):
            with pytest.raises(TypeError, match=r"delete\(\) takes checkpoint ids as separate "
                                                rf"arguments: delete\(\*ids\), not a {kind} of "):
                mgr.delete(ids)  # type: ignore[arg-type]
        for call in (lambda: mgr.delete(5), lambda: mgr.pin([a]), lambda: mgr.info(5)):
            with pytest.raises(TypeError, match="which must be \"latest\", \"best\", \"-N\" or "
                                                "a checkpoint id, not"):
                call()
        for call, name in ((lambda: mgr.export(a, 5), "export"),
                           (lambda: mgr.import_file(3), "import_file")):
            with pytest.raises(TypeError) as refused:
                call()
            assert str(refused.value) == (f"{name}()'s path must be a file's path (a str or a "
                                          "pathlib.Path: 'model.pt'), not "
                                          f"{5 if name == 'export' else 3}")
        assert list(mgr.list()["id"]) == [a, b] and not mgr.list()["pinned"].any()
        assert mgr.delete(a, b) == [a, b]  # (as separate arguments)


@pytest.mark.parametrize("rules", [{"max_to_keep": 2}, {"keep_best": 1, "metric": "loss"},
                                   {"max_bytes": 6_000}])
def test_listeners_are_told_of_what_retention_deletes(tmp_path: Path, rules: dict) -> None:
    """add_listener promises a "delete" event: retention's deletions sent none, so a
    listener mirroring the store (the notebook's explorer, a dashboard) kept them."""
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    events: list[tuple[str, str]] = []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")  # (the budget's: the newest alone passes it)
        with CheckpointManager(tmp_path / "store", **rules) as mgr:
            mgr.add_listener(lambda event, cid: events.append((event, cid)))
            saved = []
            for epoch in range(5):
                with torch.no_grad():
                    model.weight.add_(1.0)
                saved.append(mgr.save(model, optimizer, epoch, metrics={"loss": 1.0 + epoch}))
            kept = set(mgr.list()["id"])
    gone = [cid for cid in saved if cid not in kept]
    assert gone
    assert sorted(cid for event, cid in events if event == "delete") == sorted(gone)
    over = [str(w.message) for w in said if "byte budget" in str(w.message)]
    assert len(over) == ("max_bytes" in rules)
    assert not any("keep_best" in text for text in over)  # (none to lower)


def test_a_read_from_a_folder_the_manager_made_names_a_misspelt_path(tmp_path: Path) -> None:
    """A misspelt path made an empty store there, and the restore said only "no
    checkpoints yet": the user looked for a lost run."""
    model = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path / "runs" / "exp1") as mgr:
        mgr.save(model, epoch=0)
    with CheckpointManager(tmp_path / "runs" / "exp_1") as typo:
        with pytest.raises(CheckpointNotFoundError, match=(
                r"has no checkpoints yet: there was no folder .*exp_1 until this manager "
                r"made it \(a misspelt path\?\)")):
            typo.restore("latest", model=model)
    (tmp_path / "empty").mkdir()
    with CheckpointManager(tmp_path / "empty") as found:  # (a folder that was there: as before)
        with pytest.raises(CheckpointNotFoundError) as refused:
            found.load("latest")
        assert str(refused.value).endswith("has no checkpoints yet")


class PreparedLoader(torch.utils.data.DataLoader):
    """As accelerate's prepared DataLoader over a plain one: its state_dict() raises."""

    def state_dict(self) -> dict:
        return self.dl_state_dict  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict) -> None:
        pass


def test_an_object_whose_state_dict_fails_is_named_and_nothing_is_saved(
        tmp_path: Path) -> None:
    """save(loader=prepared_loader) was accelerate's bare AttributeError, from its code."""
    mgr = CheckpointManager(tmp_path)
    loader = PreparedLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)))
    with pytest.raises(ckpt_nb.CkptError) as caught:
        mgr.save(torch.nn.Linear(2, 2), loader=loader)
    said = str(caught.value)
    assert said.startswith("loader (PreparedLoader): its state_dict() failed (AttributeError: "),\
        said
    assert "nothing was saved" in said and "ckpt_nb.batches()" in said, said
    assert mgr.list().empty
