"""The Python API as issue 2 words it: restore(path) and load(path) report a path's own
problem, list()'s times say their zone, each error is also the matching built-in, nested
tensors need no trust to restore, info() gives the real restore depth, and a failed save's
message says once what it means to."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import DigitsRun, Holder, same

from ckpt_nb import CheckpointManager, CheckpointNotFoundError, CkptError, StoreError
from ckpt_nb._errors import FileFormatError
from ckpt_nb.cli import main

pytest.importorskip("safetensors")


def test_errors_that_were_a_bare_ckpterror_are_the_matching_builtin_too(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "s")
    torch.save([torch.ones(1)], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"list\.pt holds a list, not a dict of state") as got:
        mgr.import_file(tmp_path / "list.pt")
    assert isinstance(got.value, FileFormatError) and isinstance(got.value, CkptError)
    cid = mgr.save(h=Holder({"w": torch.ones(2)}))
    with pytest.raises(FileFormatError, match=r"unknown suffix"):
        mgr.export(cid, tmp_path / "model.zip")


def test_safetensors_refusal_names_every_dtype_and_its_tensors_at_once(
        tmp_path: Path) -> None:
    """It named the first refused dtype it met, and at most 3 of its tensors."""
    with warnings.catch_warnings():  # (torch calls complex32 experimental)
        warnings.simplefilter("ignore")
        state = {**{f"c{i}": torch.ones(2, dtype=torch.complex128) for i in range(7)},
                 "half": torch.ones(2, dtype=torch.complex32), "fine": torch.ones(2)}
        mgr = CheckpointManager(tmp_path / "s")
        cid = mgr.save(h=Holder(state))
    with pytest.raises(ValueError) as got:
        mgr.export(cid, tmp_path / "m.safetensors")
    message = str(got.value)
    assert isinstance(got.value, FileFormatError)
    assert "complex128 tensors (h/c0, h/c1, h/c2, h/c3, h/c4 and 2 more)" in message, message
    assert "complex32 tensors (h/half)" in message and "fine" not in message, message
    assert not (tmp_path / "m.safetensors").exists()


def store_with_one(tmp_path: Path) -> tuple[CheckpointManager, DigitsRun]:
    run = DigitsRun()
    mgr = CheckpointManager(tmp_path / "store")
    mgr.save(run.model, run.optimizer, 0)
    return mgr, run


@pytest.mark.parametrize("how", ["restore", "load"])
def test_a_path_that_names_no_checkpoint_gets_the_files_error_not_an_unknown_ids(
        tmp_path: Path, how: str) -> None:
    """A mistyped path, the store's own folder or a file of a suffix nobody reads were all
    "no checkpoint '/tmp/...' in file://...: use an id from list()"."""
    mgr, run = store_with_one(tmp_path)
    (tmp_path / "notes.txt").write_text("not a checkpoint")

    def call(which: Any) -> Any:
        return mgr.restore(which, model=run.model) if how == "restore" else mgr.load(which)

    with pytest.raises(CheckpointNotFoundError, match=r"^no file .*typo\.pt$"):
        call(tmp_path / "typo.pt")
    with pytest.raises(CheckpointNotFoundError, match=r"is a directory.*a store\? open it "
                                                      r"with CheckpointManager\("):
        call(str(tmp_path / "store"))
    with pytest.raises(FileFormatError, match=r"notes\.txt: unknown suffix, use "
                                              r"\.pt/\.pth/\.bin/\.ckpt/\.safetensors"):
        call(tmp_path / "notes.txt")
    with pytest.raises(CheckpointNotFoundError, match="use an id from list"):
        call("0123456789")  # (an id-like name still gets the id's error)


@pytest.mark.parametrize("name", ["old.PT", "old.ckpt", "old.Safetensors"])
def test_restore_takes_every_file_import_file_takes(tmp_path: Path, name: str) -> None:
    """restore(path) took .pt, .pth, .bin and .safetensors in lower case, where
    import_file took .ckpt and any case too."""
    mgr, run = store_with_one(tmp_path)
    path = tmp_path / name
    if name.lower().endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file(run.model.state_dict(), path)
    else:
        torch.save({"model_state_dict": run.model.state_dict(), "epoch": 7}, path)
    expected = run.weights()
    with torch.no_grad():
        for p in run.model.parameters():
            p.zero_()
    ck = mgr.restore(path, model=run.model)
    assert same(run.weights(), expected)
    assert mgr.load(path).state["model"].keys() == run.model.state_dict().keys()
    assert mgr.import_file(path) in set(mgr.list()["id"])
    assert ck.epoch == (None if name.endswith("afetensors") else 7)


def test_list_created_is_utc_and_cli_shows_it_in_local_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """created was a naive timestamp holding UTC, read as local time by anyone who
    compared it with datetime.now()."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        mgr = CheckpointManager(tmp_path / "s")
        assert str(mgr.list()["created"].dtype) == "datetime64[ns, UTC]"  # (empty too)
        before = time.time()
        mgr.save(torch.nn.Linear(2, 2))
        created = mgr.list()["created"].iloc[0]
        assert str(created.tz) == "UTC" and before - 1 <= created.timestamp() <= time.time()
        assert main(["ls", str(tmp_path / "s")]) == 0
        local = datetime.fromtimestamp(created.timestamp()).strftime("%Y-%m-%d %H:%M")
        assert local in capsys.readouterr().out
    finally:
        monkeypatch.undo()
        time.tzset()


def nested_state() -> dict[str, torch.Tensor]:
    with warnings.catch_warnings():  # (torch calls the strided layout a prototype)
        warnings.simplefilter("ignore")
        return {
            "strided": torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)]),
            "jagged": torch.nested.nested_tensor(
                [torch.randn(2, 3, dtype=torch.bfloat16), torch.randn(5, 3,
                                                                       dtype=torch.bfloat16)],
                layout=torch.jagged),
            "grad": torch.nested.nested_tensor([torch.randn(1), torch.randn(3)],
                                               requires_grad=True),
        }


def test_a_nested_tensor_is_stored_as_raw_bytes_and_restores_without_trust(
        tmp_path: Path) -> None:
    """It was pickled, silently, so its restore needed trust_pickle=True."""
    state = nested_state()
    mgr = CheckpointManager(tmp_path / "s")
    cid = mgr.save(h=Holder(state))
    assert not mgr.info(cid)["pickles"]
    holder = Holder({})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning of pickles left out)
        mgr.restore(cid, h=holder)
    for name, saved in state.items():
        back = holder.state[name]
        assert back.is_nested and back.layout == saved.layout, name
        assert back.requires_grad == saved.requires_grad, name
        assert same(list(back.detach().unbind()), list(saved.detach().unbind())), name
    export = mgr.export(cid, tmp_path / "n.safetensors")
    back = mgr.load(mgr.import_file(export)).state["h"]["jagged"]
    assert same(list(back.unbind()), list(state["jagged"].unbind()))


def test_only_a_checkpoint_holding_a_nested_tensor_needs_a_reader_of_format_4(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader from before nested tensors were stored would have read one as a plain
    dict: it refuses that checkpoint by name, and reads the others of the store."""
    from ckpt_nb import StoreFormatError, _format
    mgr = CheckpointManager(tmp_path / "s")
    plain = mgr.save(h=Holder({"w": torch.ones(3)}))
    nested = mgr.save(h=Holder(nested_state()))
    assert (mgr._manifest(plain)["format"], mgr._manifest(nested)["format"]) == (3, 4)
    assert json.loads((tmp_path / "s" / "ckpt_nb.json").read_text())["format"] == 3
    monkeypatch.setattr(_format, "MANIFEST_FORMAT", 3)  # (the reader before)
    earlier = CheckpointManager(tmp_path / "s")
    assert torch.equal(earlier.load(plain).state["h"]["w"], torch.ones(3))
    with pytest.raises(StoreFormatError, match=f"checkpoint {nested} has format 4, written by a "
                       "newer ckpt_nb; this ckpt_nb reads up to format 3: upgrade"):
        earlier.load(nested)


@pytest.mark.parametrize("value", [date(2026, 12, 5), Decimal("1.10"),
                                   Path("/runs/a"), [0.5] * 300])
def test_values_a_format_3_reader_would_read_as_dicts_need_format_4(
        tmp_path: Path, value: object) -> None:
    """Dates, decimals, paths (_stdlib_values) and long lists of floats came within
    format 3: a reader from before them loaded ``{'__decimal__': '1.10'}`` and put it in
    a notebook's variables. Their checkpoints are format 4, which such a reader refuses."""
    with CheckpointManager(tmp_path) as mgr:
        plain, holding = mgr.save(extra={"x": [0.5] * 3}), mgr.save(extra={"x": value})
        assert (mgr._manifest(plain)["format"], mgr._manifest(holding)["format"]) == (3, 4)
        assert mgr.load(holding).extra["x"] == value


def test_keep_best_alone_keeps_the_best_and_the_newest(tmp_path: Path) -> None:
    """As documented (Lightning's save_top_k, Orbax): not every checkpoint."""
    mgr = CheckpointManager(tmp_path / "s", keep_best=2, metric="val_loss")
    model = torch.nn.Linear(2, 2)
    for epoch, loss in enumerate([0.5, 0.4, 0.9, 0.8, 0.7]):
        mgr.save(model, None, epoch, metrics={"val_loss": loss})
    assert list(mgr.list()["epoch"]) == [0, 1, 4]
    assert "keep_best`` without ``max_to_keep`` keeps only those" in \
        " ".join(CheckpointManager.__doc__.split())


def test_info_gives_a_differential_checkpoints_real_restore_depth(tmp_path: Path) -> None:
    """show's "chain 4" is the count of saves since the full one: a differential
    checkpoint is one delta from it, and info() now says so."""
    mgr = CheckpointManager(tmp_path / "diff", strategy="differential")
    inc = CheckpointManager(tmp_path / "inc", strategy="incremental")
    holder = Holder({"w": torch.zeros(1 << 16)})
    for step in range(5):
        holder.state["w"][step] = 1.0  # (a small change: a delta pays)
        last, last_inc = mgr.save(h=holder), inc.save(h=holder)
    info = mgr.info(last)
    assert (info["strategy"], info["chain"], info["depth"]) == ("differential", 4, 1)
    assert (inc.info(last_inc)["chain"], inc.info(last_inc)["depth"]) == (4, 4)
    assert same([mgr.load(last).state["h"]["w"]], [holder.state["w"]])


def test_a_save_that_runs_out_of_room_says_earlier_checkpoints_are_intact_once(
        tmp_path: Path, file_size_limit: Callable[[int | None], None]) -> None:
    holder = Holder({"w": torch.randn(3 << 20)})  # a 12 MiB pack
    mgr = CheckpointManager(tmp_path)
    mgr.save(h=holder)
    holder.state["w"] = torch.randn(3 << 20)
    file_size_limit(5 << 20)
    try:
        with pytest.raises(StoreError) as got:
            mgr.save(h=holder)
    finally:
        file_size_limit(None)
    message = str(got.value)
    assert message.startswith("saving a checkpoint failed, so it was not saved: "), message
    assert message.count("intact") == 1, message


def test_an_export_to_a_url_is_a_file_format_error(tmp_path: Path) -> None:
    """It was a bare ValueError, no CkptError."""
    mgr = CheckpointManager(tmp_path / "s")
    cid = mgr.save(torch.nn.Linear(2, 2))
    with pytest.raises(FileFormatError, match="an export is a local file"):
        mgr.export(cid, "s3://bucket/model.pt")


@pytest.mark.parametrize("host", ["ipywidgets.widgets.widget", "traitlets.traitlets",
                                  "IPython.core.magic"])
def test_a_warning_met_under_a_host_is_ckpt_nbs_own(host: str) -> None:
    """A rollback from an explorer button warned at a line of ipywidgets' (its click
    handler's), which says nothing to the user."""
    from ckpt_nb._errors import warn

    code = compile("warn('the message')", f"/site-packages/{host.replace('.', '/')}.py", "exec")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(code, {"__name__": host, "warn": warn})  # noqa: S102 - a frame of that module
    assert [(w.filename, str(w.message)) for w in caught] == [("ckpt_nb", "the message")]
