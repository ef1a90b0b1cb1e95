"""Hostile and damaged files handed to import_file / restore(path): each is refused with a
ckpt_nb error that names the file and what is wrong (never a raw KeyError, EOFError, ...,
nor a hang), and no pickle in one runs without trust_pickle=True."""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import pickletools
import random
import struct
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import same

from ckpt_nb import (CheckpointManager, CheckpointNotFoundError, CkptError,
                     CorruptCheckpointError, FileFormatError, StateMismatchError,
                     StoreError, UntrustedPickleError)
import warm_python  # (fresh interpreters forked from a warm one)

safetensors_torch = pytest.importorskip("safetensors.torch")

MARK = Path(os.environ.get("TMPDIR", "/tmp")) / f"ckpt_nb_pwned_{os.getpid()}"


class Evil:
    """A pickle that leaves a mark when it is loaded."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {MARK}",))


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], meta: str | None) -> Path:
    safetensors_torch.save_file(tensors, path, metadata=None if meta is None else
                                {"ckpt_nb": meta})
    return path


def ours(skeleton: Any, names: list[str] | None = None) -> str:
    """ckpt_nb metadata as an export writes it."""
    return json.dumps({"skeleton": skeleton, "names": names or []})


WEIGHT = {"weight": torch.zeros(4, 4)}
PICKLE = {"__pickle__/x": torch.zeros(1, dtype=torch.uint8)}
HOSTILE_METADATA = {
    "not JSON": (WEIGHT, "{oops", "is not JSON"),
    "without names": (WEIGHT, json.dumps({"skeleton": {}}), 'lacks the "skeleton" and "names"'),
    "not a dict": (WEIGHT, "[1]", 'lacks the "skeleton" and "names"'),
    "a tensor index past the names": (
        WEIGHT, ours({"model": {"x": {"__tensor__": 5}}}, ["weight"]), "IndexError"),
    "a name that is no tensor": (
        WEIGHT, ours({"model": {"x": {"__tensor__": 0}}}, ["nope"]), "KeyError"),
    "a pickle key that is no number": (PICKLE, ours({}), r"tensor '__pickle__/x' is not a pickle"),
    "a pickle key without index": (
        {"__pickle__/": torch.zeros(1, dtype=torch.uint8)}, ours({}), "'__pickle__/' is not"),
    "a deep skeleton": (WEIGHT, '{"skeleton": {"model": ' + '{"a":' * 3000 + "1" + "}" * 3000
                        + '}, "names": []}', "nested too deep"),
    "a step over 64 bits": (
        WEIGHT, ours({"model": {}, "step": 10**30, "ckpt_nb": {}}), r"its step \(10+\) is not"),
    "metrics a list": (
        WEIGHT, ours({"model": {}, "metrics": [1], "ckpt_nb": {}}), "its metrics"),
    "extra a list": (WEIGHT, ours({"model": {}, "extra": [1], "ckpt_nb": {}}), "its extra"),
    "a note that is no text": (
        WEIGHT, ours({"model": {}, "ckpt_nb": {"note": [1]}}), "its ckpt_nb entry"),
    "ckpt_nb entry a list": (WEIGHT, ours({"model": {}, "ckpt_nb": [1]}), "its ckpt_nb entry"),
    "an unknown dict type": (
        WEIGHT, ours({"model": {}, "extra": {"__dict__": [], "type": "os.system"}}),
        "unknown dict type"),
}


@pytest.mark.parametrize("case", HOSTILE_METADATA)
def test_safetensors_metadata_that_does_not_fit_is_refused_by_name(tmp_path: Path,
                                                                   case: str) -> None:
    tensors, meta, problem = HOSTILE_METADATA[case]
    path = write_safetensors(tmp_path / "case.safetensors", tensors, meta)
    mgr = CheckpointManager(tmp_path / "store")
    with pytest.raises(CorruptCheckpointError, match=problem) as caught:
        mgr.import_file(path)
    assert str(path) in str(caught.value)
    with pytest.raises(CorruptCheckpointError, match=problem):
        mgr.restore(path, model=torch.nn.Linear(4, 4))
    assert mgr.list().empty


def test_a_pickle_index_past_the_files_tensors_is_refused_before_a_list_is_built(
        tmp_path: Path) -> None:
    """``__pickle__/999999999999`` in a 200-byte file had a list of 10^12 entries built
    (a hang); an index is bounded by the file's count of tensors."""
    mgr = CheckpointManager(tmp_path / "store")
    for index in (10_000_000, 999_999_999_999):
        path = write_safetensors(tmp_path / "bomb.safetensors",
                                 {f"__pickle__/{index}": torch.zeros(1, dtype=torch.uint8)},
                                 ours({}))
        with pytest.raises(CorruptCheckpointError, match=f"__pickle__/{index}.*under the "
                                                         "file's 1 tensors"):
            mgr.import_file(path)


def legacy_pt() -> bytes:
    buf = io.BytesIO()
    torch.save({"model": torch.nn.Linear(4, 4).state_dict()}, buf,
               _use_new_zipfile_serialization=False)
    return buf.getvalue()


@pytest.mark.parametrize("data", [legacy_pt()[: len(legacy_pt()) // 2], b"\x80\x02"],
                         ids=["legacy cut in half", "a protocol opcode alone"])
@pytest.mark.parametrize("trust", [False, True])
def test_a_damaged_torch_file_is_corrupt_not_a_raw_error(tmp_path: Path, data: bytes,
                                                         trust: bool) -> None:
    path = tmp_path / "damaged.pt"
    path.write_bytes(data)
    mgr = CheckpointManager(tmp_path / "store")
    with pytest.raises(CorruptCheckpointError, match="damaged.pt") as caught:
        mgr.import_file(path, trust_pickle=trust)
    assert caught.value.__cause__ is not None
    with pytest.raises(CorruptCheckpointError, match="damaged.pt"):
        mgr.restore(path, model=torch.nn.Linear(4, 4), trust_pickle=trust)


def test_a_legacy_file_cut_in_its_data_pickle_is_damaged_not_untrusted(tmp_path: Path) -> None:
    """A legacy torch file cut inside its fourth pickle (the data: the first three parse
    whole) was named by the globals read up to the cut ("holds .") and trust_pickle=True
    was offered; cut at every 7th byte of that pickle, it is damaged."""
    data = legacy_pt()
    stream = io.BytesIO(data)
    for _ in range(3):  # (magic number, protocol, system info)
        for _ in pickletools.genops(stream):
            pass
    start = stream.tell()
    for _ in pickletools.genops(stream):
        pass
    mgr = CheckpointManager(tmp_path / "store")
    for cut in range(start + 1, stream.tell(), 7):
        (tmp_path / "cut.pt").write_bytes(data[:cut])
        with pytest.raises(CorruptCheckpointError, match="cut.pt (does not unpickle|cannot "
                           "be read as a torch.save file)"):
            mgr.import_file(tmp_path / "cut.pt")


def test_a_pickle_with_a_bad_opcode_is_damaged_not_untrusted(tmp_path: Path) -> None:
    """torch's weights-only refusal of bytes no pickle holds asked the caller to trust
    the (damaged) file."""
    (tmp_path / "bad.pt").write_bytes(b"\x80\x02\xff")
    with pytest.raises(CorruptCheckpointError, match="bad.pt does not unpickle"):
        CheckpointManager(tmp_path / "store").import_file(tmp_path / "bad.pt")


def test_a_ckpt_nb_torch_file_whose_fields_do_not_fit_is_refused(tmp_path: Path) -> None:
    """The step was handed to the store as it was (ValueError: step must fit in 64 bits)."""
    torch.save({"model": {"w": torch.zeros(2)}, "step": 10**30, "metrics": {"loss": "low"},
                "ckpt_nb": {"id": "x", "branch": "", "note": ""}}, tmp_path / "odd.pt")
    with pytest.raises(CorruptCheckpointError, match=r"odd.pt: its step .* its metrics"):
        CheckpointManager(tmp_path / "store").import_file(tmp_path / "odd.pt")


def evil_export(path: Path, where: str) -> Path:
    """An export (as ckpt_nb writes one) whose pickle runs a command, in ``where``."""
    skeleton: dict[str, Any] = {"model": {"weight": {"__tensor__": 0}}, "extra": {"lr": 0.1},
                                "ckpt_nb": {"id": "x", "branch": "", "note": ""}}
    if where == "extra":
        skeleton["extra"]["evil"] = {"__pickle__": 1}
    elif where == "model":
        skeleton["model"]["evil"] = {"__pickle__": 1}
    else:
        skeleton["rng"] = {"__pickle__": 1}
    payload = torch.from_numpy(np.frombuffer(pickle.dumps(Evil()), np.uint8).copy())
    return write_safetensors(path, {"model/weight": torch.zeros(4, 4), "__pickle__/1": payload},
                             ours(skeleton, ["model/weight"]))


def test_a_pickle_in_extra_is_left_out_with_a_warning_and_runs_nothing(tmp_path: Path) -> None:
    """As the README says (and as an export leaves one out): the whole import was refused,
    with advice to trust "this checkpoint store"."""
    MARK.unlink(missing_ok=True)
    path = evil_export(tmp_path / "evil.safetensors", "extra")
    mgr = CheckpointManager(tmp_path / "store")
    with pytest.warns(UserWarning, match=r"left out of .*evil.safetensors: extra/evil \("
                                         "pickled, not loaded") as caught:
        cid = mgr.import_file(path)
    assert caught[0].filename == __file__  # (the warning points at the caller's line)
    assert mgr.load(cid).extra == {"lr": 0.1, "evil": None}
    with pytest.warns(UserWarning, match="extra/evil"):
        ck = mgr.restore(path, model=torch.nn.Linear(4, 4, bias=False))
    assert ck.extra["evil"] is None
    assert not MARK.exists()


@pytest.mark.parametrize("where", ["model", "rng"])
def test_a_pickle_in_a_state_refuses_the_file_and_runs_nothing(tmp_path: Path,
                                                               where: str) -> None:
    MARK.unlink(missing_ok=True)
    path = evil_export(tmp_path / "evil.safetensors", where)
    mgr = CheckpointManager(tmp_path / "store")
    name = "model/evil" if where == "model" else "rng"
    message = f"evil.safetensors: {name} is stored as a pickle.*if you trust this file"
    with pytest.raises(UntrustedPickleError, match=message):
        mgr.import_file(path)
    with pytest.raises(UntrustedPickleError, match=message):
        mgr.restore(path, model=torch.nn.Linear(4, 4, bias=False))
    assert not MARK.exists() and mgr.list().empty


def mutate(data: bytes, rng: random.Random) -> bytes:
    """``data`` with a few bytes changed, and maybe cut short."""
    out = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        if rng.random() < 0.2 and len(out) > 1:
            out = out[: rng.randrange(1, len(out))]
        else:
            out[rng.randrange(len(out))] = rng.randrange(256)
    if rng.random() < 0.3:
        out[:2] = b"PK"
    return bytes(out)


def test_mutated_torch_files_raise_nothing_but_ckpt_nb_errors(tmp_path: Path) -> None:
    """About 1 in 5 escaped as UnicodeDecodeError, KeyError, struct.error, ..."""
    buf = io.BytesIO()
    torch.save({"model": torch.nn.Linear(4, 4).state_dict(), "epoch": 3}, buf)
    sources, rng = [buf.getvalue(), legacy_pt()], random.Random(0)
    mgr, path = CheckpointManager(tmp_path / "store"), tmp_path / "f.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(150):
            path.write_bytes(mutate(rng.choice(sources), rng))
            try:
                mgr.import_file(path)
            except CkptError:
                pass


def test_mutated_safetensors_metadata_raises_nothing_but_ckpt_nb_errors(
        tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "store")
    cid = mgr.save(torch.nn.Linear(3, 2), epoch=1, metrics={"loss": 0.5},
                   extra={"t": (1, 2), "s": {1, 2}, "b": b"xy", "d": {3: "x"}})
    tensors = safetensors_torch.load_file(mgr.export(cid, tmp_path / "src.safetensors"))
    with open(tmp_path / "src.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    meta = header["__metadata__"]["ckpt_nb"]
    rng, path = random.Random(0), tmp_path / "m.safetensors"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(100):
            text = list(meta)
            for _ in range(rng.randrange(1, 4)):
                text[rng.randrange(len(text))] = rng.choice('{}[]":,0123456789-_aex ')
            write_safetensors(path, tensors, "".join(text))
            try:
                mgr.import_file(path)
            except CkptError:
                pass


def test_a_directory_given_as_a_file_is_named_a_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="is a directory, not a checkpoint file"):
        CheckpointManager(tmp_path / "s").import_file(tmp_path)


@pytest.mark.parametrize("call", ["import_file", "restore"])
def test_a_read_the_system_refuses_inside_torch_load_is_not_called_damaged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """The disk fails (EIO) once ckpt_nb's own reads of the file are done, when torch.load
    opens it: a failing disk cannot be made in a test, so torch's opener raises the
    system's error. The file is fine, and the error says it may be."""
    model = torch.nn.Linear(4, 4)
    path = tmp_path / "old.pt"
    torch.save({"model_state_dict": model.state_dict(), "epoch": 3}, path)

    class FailingDisk:
        def __init__(self, name: str, mode: str) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(name))

    monkeypatch.setattr(torch.serialization, "_open_file", FailingDisk)
    mgr = CheckpointManager(tmp_path / "s")
    with pytest.raises(StoreError, match=r"old\.pt could not be read: Input/output error "
                       r"\(the system's error, not a sign that the file is damaged: it may "
                       r"be fine\)") as raised:
        mgr.import_file(path) if call == "import_file" else mgr.restore(path, model=model)
    assert raised.value.errno == errno.EIO
    monkeypatch.undo()
    assert mgr.import_file(path)


def test_a_whole_file_of_pickle_protocol_4_asks_for_trust_not_called_damaged(
        tmp_path: Path) -> None:
    """Weights-only loading refuses protocol 4's FRAME opcode as "Unsupported operand",
    which was taken for damage."""
    state = {"w": torch.arange(4.0)}
    torch.save(state, tmp_path / "p4.pt", pickle_protocol=4)
    with pytest.raises(UntrustedPickleError, match="pickle protocol 4.*trust_pickle=True"):
        CheckpointManager(tmp_path / "s").import_file(tmp_path / "p4.pt")
    cid = CheckpointManager(tmp_path / "s").import_file(tmp_path / "p4.pt", trust_pickle=True)
    assert torch.equal(CheckpointManager(tmp_path / "s").load(cid).state["model"]["w"],
                       state["w"])


def test_the_pytorch_tutorial_layout_imports_its_scheduler_and_numbers_by_name(
        tmp_path: Path) -> None:
    """``lr_scheduler_state_dict`` came in as an object "lr_scheduler" (restore(scheduler=)
    said "not in the checkpoint"), a ``loss`` tensor and a NumPy ``best_acc`` as extra,
    and the refusal without trust carried torch's terminal escapes (\\x1b[1m)."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 3)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    loss = model(torch.ones(2)).sum()
    torch.save({"epoch": 3, "model_state_dict": model.state_dict(),
                "optimizer_state_dict": optimizer.state_dict(),
                "lr_scheduler_state_dict": scheduler.state_dict(), "loss": loss,
                "best_acc": np.float32(0.75), "val_losses": torch.ones(1),
                "accumulation_steps": 4}, tmp_path / "t.pt")
    mgr = CheckpointManager(tmp_path / "s")
    with pytest.raises(UntrustedPickleError) as refused:
        mgr.import_file(tmp_path / "t.pt")
    assert "\x1b" not in str(refused.value) and "holds numpy." in str(refused.value)
    cid = mgr.import_file(tmp_path / "t.pt", trust_pickle=True)
    fresh_opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    fresh = torch.optim.lr_scheduler.StepLR(fresh_opt, 3)
    ck = mgr.restore(cid, scheduler=fresh, rng=False)
    assert fresh.last_epoch == 4 and set(ck.state) == {"model", "optimizer"}
    assert ck.metrics == {"loss": loss.item(), "best_acc": 0.75}
    # (a tensor of a shape of its own stays; "acc" is no word of accumulation_steps)
    assert list(ck.extra) == ["val_losses", "accumulation_steps"]


def test_two_keys_for_one_object_keep_their_own_names(tmp_path: Path) -> None:
    """A file with a scheduler's state under both names loses neither."""
    torch.save({"scheduler_state_dict": {"a": 1}, "lr_scheduler_state_dict": {"b": 2},
                "state_dict": {"w": torch.ones(1)}, "model_state_dict": {"v": torch.ones(1)}},
               tmp_path / "t.pt")
    state = CheckpointManager(tmp_path / "s").load(
        CheckpointManager(tmp_path / "s").import_file(tmp_path / "t.pt")).state
    assert state == {"scheduler_state_dict": {"a": 1}, "lr_scheduler_state_dict": {"b": 2},
                     "state_dict": {"w": torch.ones(1)},
                     "model_state_dict": {"v": torch.ones(1)}}


class WithExtra(torch.nn.Linear):
    """A module whose state dict holds a plain dict besides its tensors."""

    calls = 0

    def get_extra_state(self) -> dict[str, int]:
        return {"calls": 3}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.calls = state["calls"]


def test_a_saved_module_state_dict_with_other_values_is_the_model(tmp_path: Path) -> None:
    """torch.save(model.state_dict()) of a module with extra state (or a quantized layer's
    dtype and packed parameters) put every key in extra: "model: not in the checkpoint"."""
    torch.save(WithExtra(2, 2).state_dict(), tmp_path / "m.pt")
    mgr = CheckpointManager(tmp_path / "s")
    live = WithExtra(2, 2)
    ck = mgr.restore(tmp_path / "m.pt", model=live)
    assert live.calls == 3 and ck.extra == {}
    quantized = torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(torch.nn.Linear(4, 4)), {torch.nn.Linear}, dtype=torch.qint8)
    torch.save(quantized.state_dict(), tmp_path / "q.pt")
    assert list(mgr.load(tmp_path / "q.pt").state) == ["model"]
    cid = mgr.import_file(tmp_path / "q.pt")
    fresh = torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(torch.nn.Linear(4, 4)), {torch.nn.Linear}, dtype=torch.qint8)
    mgr.restore(cid, model=fresh, rng=False)
    assert torch.equal(fresh(torch.ones(1, 4)), quantized(torch.ones(1, 4)))


def test_a_saved_module_state_dict_keeps_its_module_versions(tmp_path: Path) -> None:
    """The dict() copy of the file's state dict dropped its _metadata (BatchNorm's version),
    in load(path), import_file and export alike."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    torch.save(model.state_dict(), tmp_path / "m.pt")
    versions = model.state_dict()._metadata  # type: ignore[attr-defined]
    mgr = CheckpointManager(tmp_path / "s")
    assert mgr.load(tmp_path / "m.pt").state["model"]._metadata == versions
    cid = mgr.import_file(tmp_path / "m.pt")
    exported = torch.load(mgr.export(cid, tmp_path / "out.pt"), weights_only=True)
    assert exported["model"]._metadata == versions


def test_values_added_by_hand_to_a_saved_state_dict_are_fields_not_model_keys(
        tmp_path: Path) -> None:
    """sd = model.state_dict(); sd["epoch"] = 3: the epoch, metric, optimizer and note are
    what they would be in a dict beside the state dict, not keys the model refuses."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    saved = model.state_dict()
    saved.update(epoch=3, val_loss=0.5, optimizer=opt.state_dict(), note="hi")
    torch.save(saved, tmp_path / "m.pt")
    mgr = CheckpointManager(tmp_path / "s")
    live = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    live_opt = torch.optim.AdamW(live.parameters())
    ck = mgr.restore(tmp_path / "m.pt", model=live, optimizer=live_opt)
    assert (ck.epoch, ck.metrics, ck.extra) == (3, {"val_loss": 0.5}, {"note": "hi"})
    assert same(list(live.state_dict().values()), list(model.state_dict().values()))
    assert same([t for st in live_opt.state.values() for t in st.values()],
                [t for st in opt.state.values() for t in st.values()])
    assert mgr.load(tmp_path / "m.pt").state["model"]._metadata == saved._metadata


def test_a_files_optimizer_state_of_another_class_is_refused(tmp_path: Path) -> None:
    """A file records no class: AdamW's state loaded into SGD(momentum=0.9), whose next step
    failed with KeyError 'momentum'. The same class with other values still loads."""
    model = torch.nn.Linear(2, 2)
    adamw = torch.optim.AdamW(model.parameters())
    model(torch.ones(2)).sum().backward()
    adamw.step()
    torch.save({"model_state_dict": model.state_dict(),
                "optimizer_state_dict": adamw.state_dict(), "epoch": 1}, tmp_path / "a.pt")
    mgr = CheckpointManager(tmp_path / "s")
    cid = mgr.import_file(tmp_path / "a.pt")
    for which in (tmp_path / "a.pt", cid):
        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with pytest.raises(StateMismatchError, match="optimizer: the checkpoint's optimizer "
                                                     "state has no momentum, dampening"):
            mgr.restore(which, model=model, optimizer=sgd)
        assert "betas" not in sgd.param_groups[0]
    other = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.0, amsgrad=True)
    mgr.restore(cid, model=model, optimizer=other)
    assert other.param_groups[0]["lr"] == adamw.param_groups[0]["lr"]
    sgd_state = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.save({"optimizer": sgd_state.state_dict()}, tmp_path / "sgd.pt")
    plain = torch.optim.SGD(model.parameters(), lr=0.3)  # (no momentum: a value, not a class)
    mgr.restore(tmp_path / "sgd.pt", optimizer=plain)
    assert plain.param_groups[0]["momentum"] == 0.9


def test_a_files_keys_that_name_checkpoint_fields_are_objects_of_their_own_name(
        tmp_path: Path) -> None:
    """``rng_state_dict`` was an object "rng", which import_file refused, telling the
    caller to "rename the keyword"."""
    torch.save({"model_state_dict": {"w": torch.ones(2)},
                "rng_state_dict": {"cpu": torch.get_rng_state()},
                "metrics_state_dict": {"n": 1}}, tmp_path / "f.pt")
    mgr = CheckpointManager(tmp_path / "s")
    assert set(mgr.load(tmp_path / "f.pt").state) == \
        {"model", "rng_state_dict", "metrics_state_dict"}
    ck = mgr.load(mgr.import_file(tmp_path / "f.pt"))
    assert ck.state["metrics_state_dict"] == {"n": 1} and ck.rng is None
    assert torch.equal(ck.state["rng_state_dict"]["cpu"], torch.get_rng_state())


def test_a_lightning_checkpoint_holds_its_optimizers_and_schedulers(tmp_path: Path) -> None:
    """optimizer_states[0] and lr_schedulers[0] went to extra: "optimizer: not in the
    checkpoint"."""
    model = torch.nn.Linear(2, 2)
    opts = [torch.optim.AdamW(model.parameters()), torch.optim.SGD(model.parameters(), lr=1)]
    scheduler = torch.optim.lr_scheduler.StepLR(opts[0], 3)
    model(torch.ones(2)).sum().backward()
    opts[0].step()
    scheduler.step()
    torch.save({"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.4.0",
                "state_dict": model.state_dict(),
                "optimizer_states": [o.state_dict() for o in opts],
                "lr_schedulers": [scheduler.state_dict()], "hyper_parameters": {"lr": 1e-3}},
               tmp_path / "l.ckpt")
    mgr = CheckpointManager(tmp_path / "s")
    live = [torch.optim.AdamW(model.parameters()), torch.optim.SGD(model.parameters(), lr=1)]
    live_scheduler = torch.optim.lr_scheduler.StepLR(live[0], 3)
    ck = mgr.restore(tmp_path / "l.ckpt", model=model, optimizer=live[0], optimizer_1=live[1],
                     scheduler=live_scheduler)
    assert live_scheduler.last_epoch == 1 and len(live[0].state) == 2
    assert (ck.epoch, ck.step) == (3, 120)
    assert list(ck.extra) == ["pytorch-lightning_version", "hyper_parameters"]


def test_a_lightning_checkpoints_monitored_score_is_its_metric(tmp_path: Path) -> None:
    """The score ModelCheckpoint monitored at each save was left in extra: "best" across
    imported Lightning checkpoints needed the metric typed in again."""
    model = torch.nn.Linear(2, 2)
    for epoch, score in enumerate((0.5, 0.2, 0.4)):
        checkpoint = {"monitor": "val_loss", "current_score": torch.tensor(score),
                      "best_model_score": torch.tensor(0.2), "best_model_path": "/x/b.ckpt",
                      "dirpath": "/x"}
        torch.save({"epoch": epoch, "global_step": 10 * epoch,
                    "pytorch-lightning_version": "2.4.0", "state_dict": model.state_dict(),
                    "callbacks": {"ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}":
                                  checkpoint},
                    "optimizer_states": [], "lr_schedulers": []}, tmp_path / f"{epoch}.ckpt")
    with CheckpointManager(tmp_path / "s", metric="val_loss") as mgr:
        ids = [mgr.import_file(tmp_path / f"{epoch}.ckpt") for epoch in range(3)]
        assert [round(v, 6) for v in mgr.list()["val_loss"]] == [0.5, 0.2, 0.4]
        assert mgr.resolve("best") == ids[1]
        assert "callbacks" in mgr.load(ids[0]).extra  # (kept as it was)


@pytest.mark.parametrize("make", [torch.tensor, np.int64], ids=["a 0-dim tensor", "np.int64"])
def test_a_position_saved_as_a_tensor_or_numpy_integer_is_the_position(
        tmp_path: Path, make: Any) -> None:
    """``"epoch": torch.tensor(7)`` went to extra, and ls showed no epoch."""
    torch.save({"model": {"w": torch.ones(1)}, "epoch": make(7), "step": make(700)},
               tmp_path / "f.pt")
    mgr = CheckpointManager(tmp_path / "s")
    ck = mgr.load(mgr.import_file(tmp_path / "f.pt", trust_pickle=True))
    assert (ck.epoch, ck.step, ck.extra) == (7, 700, {})
    assert type(ck.epoch) is int


@pytest.mark.parametrize("protocol", [0, 1, 4, 5])
@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_a_pickle_protocol_weights_only_loading_does_not_read_is_named(
        tmp_path: Path, protocol: int, zipped: bool) -> None:
    """Such a plain {"w": tensor} was said to hold "objects other than tensors", or (a
    legacy file of protocol 0 or 1) to be "not a torch.save file"."""
    torch.save({"w": torch.ones(2)}, tmp_path / "p.pt", pickle_protocol=protocol,
               _use_new_zipfile_serialization=zipped)
    saved = "0 or 1" if protocol < 2 else str(protocol)
    with pytest.raises(UntrustedPickleError, match=f"saved with pickle protocol {saved}, "
                                                   r"which torch.load\(weights_only=True\) "
                                                   "does not read.*re-save it"):
        CheckpointManager(tmp_path / "s").load(tmp_path / "p.pt")


def test_an_untrusted_class_is_named_first_in_a_short_message(tmp_path: Path) -> None:
    torch.save({"model": {"w": torch.ones(1)}, "best": np.float32(1)}, tmp_path / "f.pt")
    with pytest.raises(UntrustedPickleError) as refused:
        CheckpointManager(tmp_path / "s").load(tmp_path / "f.pt")
    assert str(refused.value).startswith(f"{tmp_path / 'f.pt'} holds numpy.")
    assert len(str(refused.value)) < 400


def test_a_file_of_the_other_format_is_named_so(tmp_path: Path) -> None:
    """A .safetensors file named .pt was "neither a zip archive nor a pickle", a .pt named
    .safetensors had a "header too large"."""
    safetensors_torch.save_file({"w": torch.ones(2)}, tmp_path / "st.pt")
    torch.save({"w": torch.ones(2)}, tmp_path / "pt.safetensors")
    mgr = CheckpointManager(tmp_path / "s")
    with pytest.raises(CorruptCheckpointError, match="st.pt is a safetensors file, not a "
                                                     "torch.save one.*rename it to "
                                                     "st.safetensors"):
        mgr.load(tmp_path / "st.pt")
    with pytest.raises(CorruptCheckpointError, match="is a torch.save file, not a safetensors "
                                                     "one.*rename it to pt.pt"):
        mgr.load(tmp_path / "pt.safetensors")
    for pad in range(64):  # (a header 128 bytes long begins as a pickle does, with 0x80)
        safetensors_torch.save_file({"w": torch.ones(2)}, tmp_path / "odd.pt",
                                    metadata={"pad": "x" * pad})
        if (tmp_path / "odd.pt").read_bytes()[:1] == b"\x80":
            break
    with pytest.raises(CorruptCheckpointError, match="odd.pt is a safetensors file"):
        mgr.load(tmp_path / "odd.pt")


def sharded(folder: Path, weight_map: dict[str, str] | None = None) -> Path:
    """A sharded model as Hugging Face writes one: two shards and their index."""
    folder.mkdir()
    safetensors_torch.save_file({"a": torch.ones(2)}, folder / "model-00001-of-00002.safetensors")
    safetensors_torch.save_file({"b": torch.zeros(3)}, folder / "model-00002-of-00002.safetensors")
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map or {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    return index


def test_a_sharded_model_reads_through_its_index(tmp_path: Path) -> None:
    """The index was an "unknown suffix", the folder "a store?", and one shard was
    imported as the whole model without a word."""
    index = sharded(tmp_path / "hf")
    mgr = CheckpointManager(tmp_path / "s")
    assert set(mgr.load(mgr.import_file(index)).state["model"]) == {"a", "b"}
    with pytest.raises(CheckpointNotFoundError, match="is a directory.*give the file to read "
                                                      r"\(model.safetensors.index.json\)"):
        mgr.load(tmp_path / "hf")
    with pytest.warns(UserWarning, match="model-00001-of-00002.safetensors is one shard of 2.*"
                                         "give model.safetensors.index.json"):
        mgr.load(tmp_path / "hf" / "model-00001-of-00002.safetensors")


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd.safetensors",
                                   "sub/x.safetensors", "notes.txt"])
def test_a_shard_index_naming_a_file_elsewhere_is_refused(tmp_path: Path, shard: str) -> None:
    safetensors_torch.save_file({"x": torch.ones(1)}, tmp_path / "outside.safetensors")
    index = sharded(tmp_path / "hf", {"a": "model-00001-of-00002.safetensors", "x": shard})
    with pytest.raises(CorruptCheckpointError, match="is not the name of a .* file beside "
                                                     "the index"):
        CheckpointManager(tmp_path / "s").load(index)


def test_an_optimizers_state_saved_alone_is_the_optimizer(tmp_path: Path) -> None:
    """torch.save(opt.state_dict()), or export(only="optimizer"), read back with its state
    and param_groups in extra, and restore(path, optimizer=...) found no optimizer."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2)).sum().backward()
    opt.step()
    mgr = CheckpointManager(tmp_path / "s")
    cid = mgr.save(model, opt)
    torch.save(opt.state_dict(), tmp_path / "plain.pt")
    for path in (tmp_path / "plain.pt", mgr.export(cid, tmp_path / "opt.pt", only="optimizer"),
                 mgr.export(cid, tmp_path / "opt.safetensors", only="optimizer")):
        assert list(mgr.load(path).state) == ["optimizer"] and not mgr.load(path).extra
        live = torch.optim.AdamW(model.parameters())
        mgr.restore(path, optimizer=live)
        assert same(list(live.state[model.weight].values()),
                    list(opt.state[model.weight].values()))


def test_a_shard_index_too_large_for_one_is_refused_unread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ckpt_nb._interop

    index = sharded(tmp_path / "m")
    monkeypatch.setattr(ckpt_nb._interop, "_HEADER_LIMIT", index.stat().st_size - 1)
    with pytest.raises(CorruptCheckpointError, match="too large for a sharded model's index"):
        CheckpointManager(tmp_path / "s").load(index)


@pytest.mark.parametrize("entry", [{"version": 3}, {"id": 3}, "v3", 3])
def test_another_tools_ckpt_nb_key_stays_in_extra(tmp_path: Path, entry: Any) -> None:
    """A file's own top-level "ckpt_nb" value made it a ckpt_nb export: the value was
    dropped (or the file refused as damaged) and its other keys read by the export's rules."""
    torch.save({"model": {"w": torch.ones(2)}, "ckpt_nb": entry, "epoch": 2,
                "val_loss": 0.5}, tmp_path / "theirs.pt")
    mgr = CheckpointManager(tmp_path / "s")
    ck = mgr.restore(mgr.import_file(tmp_path / "theirs.pt"), rng=False)
    assert ck.extra == {"ckpt_nb": entry} and ck.epoch == 2
    assert ck.metrics == {"val_loss": 0.5} and list(ck.state) == ["model"]


def test_an_export_of_a_later_version_with_more_in_its_entry_is_read_as_an_export(
        tmp_path: Path) -> None:
    torch.save({"model": {"w": torch.ones(2)}, "epoch": 2, "metrics": {"loss": 0.5},
                "extra": {}, "step": None, "batch_idx": None, "rng": None,
                "ckpt_nb": {"id": "abc", "branch": "main", "note": "n", "format": 9}},
               tmp_path / "later.pt")
    mgr = CheckpointManager(tmp_path / "s")
    ck = mgr.restore(mgr.import_file(tmp_path / "later.pt"), rng=False)
    assert (ck.epoch, ck.metrics, ck.extra) == (2, {"loss": 0.5}, {})  # (no "ckpt_nb" in it)


def damage_record(path: Path, suffix: str) -> None:
    """Zero 64 bytes inside the record of ``path`` whose name ends with ``suffix``, its
    stored CRC-32 left as it was."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(suffix))
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", f.read(4))
        f.seek(info.header_offset + 30 + name_length + extra_length + 16)
        f.write(b"\0" * 64)


def test_a_torch_zip_whose_record_fails_its_crc_is_refused_by_name(tmp_path: Path) -> None:
    """torch.load does not check a zip record's CRC-32: a file damaged inside a tensor's
    bytes imported and restored without a word, with wrong weights (and verify said ok)."""
    model = torch.nn.Linear(16, 16)
    torch.save(model.state_dict(), tmp_path / "f.pt")
    damage_record(tmp_path / "f.pt", "data/0")
    mgr = CheckpointManager(tmp_path / "s")
    message = r"f.pt is damaged: the bytes of f/data/0 do not match the CRC-32"
    with pytest.raises(CorruptCheckpointError, match=message):
        mgr.import_file(tmp_path / "f.pt")
    with pytest.raises(CorruptCheckpointError, match=message):
        mgr.restore(tmp_path / "f.pt", model=torch.nn.Linear(16, 16))
    assert mgr.list().empty


def test_a_torch_zip_saved_without_crcs_is_read(tmp_path: Path) -> None:
    """set_crc32_options(False) stores 0 for every record: nothing to check, not damage."""
    if not hasattr(torch.serialization, "set_crc32_options"):
        pytest.skip("this torch always writes CRC-32s")
    model = torch.nn.Linear(16, 16)
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(model.state_dict(), tmp_path / "f.pt")
    finally:
        torch.serialization.set_crc32_options(True)
    with zipfile.ZipFile(tmp_path / "f.pt") as archive:
        assert all(info.CRC == 0 for info in archive.infolist())
    restored = torch.nn.Linear(16, 16)
    CheckpointManager(tmp_path / "s").restore(tmp_path / "f.pt", model=restored)
    assert torch.equal(restored.weight, model.weight)


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_a_global_of_a_blocked_module_is_named_without_add_safe_globals(
        tmp_path: Path, zipped: bool) -> None:
    """torch says of os.system "unsupported GLOBAL posix.system whose module posix is
    blocked", which the refusal did not match: it gave a cut repr of torch's message."""
    MARK.unlink(missing_ok=True)
    torch.save({"model": {"w": torch.ones(1)}, "evil": Evil()}, tmp_path / "f.pt",
               _use_new_zipfile_serialization=zipped)
    with pytest.raises(UntrustedPickleError, match=r"holds (posix|nt)\.system, .*can run "
                                                   "commands or code") as refused:
        CheckpointManager(tmp_path / "s").import_file(tmp_path / "f.pt")
    assert "add_safe_globals" not in str(refused.value)
    assert not MARK.exists()


class Eval:
    def __reduce__(self) -> tuple[Any, ...]:
        return (eval, ("1 + 1",))


def test_a_builtin_function_is_never_offered_to_add_safe_globals(tmp_path: Path) -> None:
    """The refusal advised torch.serialization.add_safe_globals([eval])."""
    torch.save({"model": {"w": torch.ones(1)}, "x": Eval()}, tmp_path / "f.pt")
    with pytest.raises(UntrustedPickleError, match=r"holds builtins\.eval, .*trust_pickle=True "
                                                   "only if you trust the file") as refused:
        CheckpointManager(tmp_path / "s").import_file(tmp_path / "f.pt")
    assert "add_safe_globals" not in str(refused.value)


def test_every_global_a_file_needs_is_named_at_once(tmp_path: Path) -> None:
    """A NumPy epoch, an array, a Namespace and a path needed one add_safe_globals after
    another, each refusal naming the next."""
    import argparse

    torch.save({"model": {"w": torch.ones(1)}, "epoch": np.int64(7), "a": np.arange(3),
                "args": argparse.Namespace(lr=0.1), "root": Path("data")}, tmp_path / "f.pt")
    with pytest.raises(UntrustedPickleError) as refused:
        CheckpointManager(tmp_path / "s").import_file(tmp_path / "f.pt")
    message = str(refused.value)
    assert all(name in message for name in ("numpy.dtype", "numpy.ndarray",
                                            "argparse.Namespace", "PosixPath")), message
    assert "add_safe_globals([" in message and "numpy.dtypes.Int64DType" in message
    assert message.count("numpy.ndarray") == 1  # (listed once, in the call to paste)
    allowed = [np._core.multiarray.scalar, np.dtype, np.dtypes.Int64DType,
               np._core.multiarray._reconstruct, np.ndarray, argparse.Namespace, type(Path())]
    with torch.serialization.safe_globals(allowed):
        ck = CheckpointManager(tmp_path / "s").load(tmp_path / "f.pt")
    assert ck.epoch == 7 and ck.extra["args"].lr == 0.1


class Calls:
    """An object whose unpickling calls ``function(*args)``."""

    def __init__(self, function: Any, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.function, self.args)


@pytest.mark.parametrize("function", ["timeit.timeit", "cProfile.run", "pydoc.pipepager",
                                      "numpy.testing._private.utils.runstring"])
def test_a_function_of_any_module_is_never_offered_to_add_safe_globals(
        tmp_path: Path, function: str) -> None:
    """Only modules on a list of those that run code were kept from add_safe_globals:
    timeit.timeit, cProfile.run, pydoc.pipepager and NumPy's runstring, which run what they
    are given, were offered."""
    import importlib

    module, _, name = function.rpartition(".")
    torch.save({"model": {"w": torch.ones(1)},
                "x": Calls(getattr(importlib.import_module(module), name), "1")},
               tmp_path / "f.pt")
    with pytest.raises(UntrustedPickleError, match="trust_pickle=True only if you trust "
                                                   "the file") as refused:
        CheckpointManager(tmp_path / "s").import_file(tmp_path / "f.pt")
    assert function in str(refused.value)
    assert "add_safe_globals" not in str(refused.value)


def test_plain_value_classes_are_offered_to_add_safe_globals(tmp_path: Path) -> None:
    """builtins.range, builtins.slice and types.SimpleNamespace were said to run code."""
    import types

    torch.save({"model": {"w": torch.ones(1)}, "r": range(3), "s": slice(1, 2),
                "n": types.SimpleNamespace(lr=0.1)}, tmp_path / "f.pt")
    with pytest.raises(UntrustedPickleError, match=r"add_safe_globals\(\[builtins\.range, "
                                                   r"builtins\.slice, types\.SimpleNamespace"
                                                   r"\]\)"):
        CheckpointManager(tmp_path / "s").import_file(tmp_path / "f.pt")
    with torch.serialization.safe_globals([range, slice, types.SimpleNamespace]):
        ck = CheckpointManager(tmp_path / "s").load(tmp_path / "f.pt")
    assert ck.extra["r"] == range(3) and ck.extra["n"].lr == 0.1


def test_a_legacy_file_names_every_global_it_needs(tmp_path: Path) -> None:
    """A file saved in the format before torch 1.6 named the first global alone."""
    import argparse

    torch.save({"model": {"w": torch.ones(1)}, "epoch": np.int64(3),
                "args": argparse.Namespace(a=1), "root": Path("data")}, tmp_path / "f.pt",
               _use_new_zipfile_serialization=False)
    with pytest.raises(UntrustedPickleError) as refused:
        CheckpointManager(tmp_path / "s").import_file(tmp_path / "f.pt")
    message = str(refused.value)
    assert all(name in message for name in ("argparse.Namespace", "numpy.dtype,", "PosixPath",
                                            "numpy.dtypes.Int64DType")), message


def test_whole_modules_name_each_class_once_trust_first(tmp_path: Path) -> None:
    torch.save({"model": torch.nn.Sequential(torch.nn.Linear(2, 2))}, tmp_path / "f.pt")
    with pytest.raises(UntrustedPickleError, match="holds whole modules: .*pass "
                                                   "trust_pickle=True") as refused:
        CheckpointManager(tmp_path / "s").import_file(tmp_path / "f.pt")
    assert str(refused.value).count("torch.nn.modules.linear.Linear") == 1


def test_a_record_longer_than_a_crc_block_is_checked_to_its_end(tmp_path: Path) -> None:
    """The CRC-32 is computed over the mapped file a block at a time (reading through
    zipfile took 3 times as long as torch.load): damage past the first block is found."""
    from ckpt_nb import _interop

    weights = torch.arange((_interop._CRC_BLOCK // 4) + 1000, dtype=torch.float32)
    torch.save({"w": weights}, tmp_path / "f.pt")
    mgr = CheckpointManager(tmp_path / "s")
    assert torch.equal(mgr.load(tmp_path / "f.pt").state["model"]["w"], weights)
    with zipfile.ZipFile(tmp_path / "f.pt") as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("data/0"))
    with open(tmp_path / "f.pt", "r+b") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", f.read(4))
        f.seek(info.header_offset + 30 + name_length + extra_length + info.file_size - 8)
        f.write(b"\0" * 8)
    with pytest.raises(CorruptCheckpointError, match=r"the bytes of f/data/0 do not match"):
        mgr.load(tmp_path / "f.pt")


def test_a_file_needing_a_class_not_defined_here_says_so_not_damaged(tmp_path: Path) -> None:
    """A model class from the saving script's __main__, or from a module not importable
    here: the file is intact, and the refusal says what to define or import."""
    (tmp_path / "shapes_lib.py").write_text(
        "import torch\nclass Shape(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.lin = torch.nn.Linear(3, 2)\n")
    saver = ("import torch, shapes_lib\n"
             "class Local(torch.nn.Module):\n"
             "    def __init__(self):\n        super().__init__()\n"
             "        self.lin = torch.nn.Linear(3, 2)\n"
             "torch.save({'model': Local()}, 'main_class.pt')\n"
             "torch.save({'model': shapes_lib.Shape()}, 'module_class.pt')\n")
    warm_python.run([sys.executable, "-c", saver], cwd=tmp_path, check=True,
                    env={**os.environ, "PYTHONPATH": os.pathsep.join(
                        [str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    mgr = CheckpointManager(tmp_path / "s")
    with pytest.raises(FileFormatError, match=r"needs class Local from module __main__ "
                       r"\(the script or notebook that saved it\).*not damaged"):
        mgr.import_file(tmp_path / "main_class.pt", trust_pickle=True)
    with pytest.raises(FileFormatError, match="needs module shapes_lib, which cannot be "
                       "imported here: install it or put it on sys.path"):
        mgr.restore(tmp_path / "module_class.pt", model=torch.nn.Linear(3, 2),
                    trust_pickle=True)


def test_a_torch_save_zip_packed_again_with_deflated_records_reads_exactly(
        tmp_path: Path) -> None:
    """A .pt re-packed by another tool (Info-ZIP's zip deflates each record that shrinks,
    stores the rest) is read as torch.load reads it: a deflated record is not mapped as
    if its bytes were the tensor's (a zero bias read the next records' bytes, silently)."""
    import zlib

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    with torch.no_grad():
        model[0].bias.zero_()
    torch.save({"model": model.state_dict()}, tmp_path / "raw.pt")
    with zipfile.ZipFile(tmp_path / "raw.pt") as src, \
            zipfile.ZipFile(tmp_path / "packed.pt", "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            dst.writestr(info.filename, data, zipfile.ZIP_DEFLATED
                         if len(zlib.compress(data)) < len(data) * 0.9 else zipfile.ZIP_STORED)
    mgr = CheckpointManager(tmp_path / "s")
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    mgr.restore(tmp_path / "packed.pt", model=fresh)
    for read in (mgr.load(tmp_path / "packed.pt").state["model"], fresh.state_dict(),
                 mgr.load(mgr.import_file(tmp_path / "packed.pt")).state["model"]):
        assert all(torch.equal(read[k], v) for k, v in model.state_dict().items())
