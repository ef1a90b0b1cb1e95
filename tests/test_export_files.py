"""Exports as files: a .safetensors export is written by ckpt_nb from the loaded
checkpoint's memory (the bytes safetensors' own writer makes, no view copied whole), and
a killed export's temporary is removed by the next export into its folder."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import Holder, same_safetensors_file
from test_scale import _peak_mib  # (a script run in a fresh process: its memory)

from ckpt_nb import CheckpointManager
from ckpt_nb._errors import FileFormatError
from ckpt_nb._interop import read_file
import warm_python  # (fresh interpreters forked from a warm one)

safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402


def _held_dtypes() -> list[torch.dtype]:
    """Every dtype safetensors' save_file writes, asked of it."""
    held = []
    for dtype in sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)},
                        key=str):
        try:
            with warnings.catch_warnings():  # (torch calls complex32 experimental)
                warnings.simplefilter("ignore")
                safetensors_torch.save({"probe": torch.zeros(2, dtype=dtype)})
        except Exception:  # noqa: BLE001 - any refusal
            continue
        held.append(dtype)
    return held


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s values, in order."""
    return t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)


def _values(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random values of ``dtype``: random bytes for one-byte dtypes (bools 0 or 1)."""
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.itemsize == 1:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).view(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, 1000, shape, generator=gen).to(dtype)


def test_a_safetensors_export_is_save_files_file_for_every_dtype_and_view(
        tmp_path: Path) -> None:
    """Written by ckpt_nb now, not by save_file: each dtype, a transposed view, views of one
    storage, conjugate and negative bits, a strided view over the write block, an empty
    and a 0-dim tensor, a pickle: the same bytes save_file writes of plain copies."""
    gen = torch.Generator().manual_seed(0)
    state = {str(d).removeprefix("torch."): _values(d, (5, 6), gen) for d in _held_dtypes()}
    assert len(state) >= 15 and "float8_e4m3fn" in state and "bfloat16" in state
    z, big = torch.randn(4, 3, dtype=torch.complex64, generator=gen), torch.randn(2400, 2400)
    state.update({"t": state["float32"].t(), "tied": state["float32"], "z": z, "real": z.real,
                  "conj": z.conj(), "neg": z.conj().imag, "slice": big[7:9, 100:300],
                  "big_t": big.t(), "big_t1": big.t()[None], "big_cols": big[:, ::3],
                  "empty": torch.zeros(0, 4), "scalar": torch.tensor(2.5),
                  "f4_t": state["float4_e2m1fn_x2"].t()})
    with CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(h=Holder(state), extra={"kind": Holder, "n": 3})
        path = mgr.export(cid, tmp_path / "out.safetensors", trust_pickle=True)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        written = {name: f.get_tensor(name) for name in f.keys()}
    for name, value in state.items():
        assert (written[f"h/{name}"].dtype, written[f"h/{name}"].shape) == \
            (value.dtype, value.shape), name
        assert _raw(written[f"h/{name}"]).equal(_raw(value)), name
    assert any(name.startswith("__pickle__/") for name in written)
    save_file_copy = {name: t.contiguous().clone() for name, t in written.items()}
    safetensors_torch.save_file(save_file_copy, tmp_path / "theirs.safetensors", metadata=meta)
    assert same_safetensors_file(path, tmp_path / "theirs.safetensors")
    back = read_file(path, trust_pickle=True)
    assert back.extra == {"kind": Holder, "n": 3}
    assert all(_raw(back.state["h"][name]).equal(_raw(value)) for name, value in state.items())


def test_a_safetensors_export_copies_no_view_whole(tmp_path: Path) -> None:
    """Views of one storage were each cloned, and a transposed weight copied whole, before
    safetensors wrote them: +128 MiB here, for 128 MiB of state."""
    flat = (torch.arange(16 << 20) % 7).float()  # 64 MiB, compressible
    state = {**{f"part{i}": flat[i << 22:(i + 1) << 22] for i in range(4)},
             "weight_t": (torch.arange(16 << 20) % 5).float().view(4096, 4096).t()}
    with CheckpointManager(tmp_path) as mgr:
        cid = mgr.save(s=Holder(state))
    found = _peak_mib(f"""
        mgr = CheckpointManager({str(tmp_path)!r})
        before = start()
        mgr.load({cid!r})  # (its memory is kept, and the export's load takes it again)
        load = peak() - before
        before = start()
        mgr.export({cid!r}, {str(tmp_path / "out.safetensors")!r})
        print(json.dumps({{"load": load, "export": peak() - before}}))
    """)
    # (the old way took +130 MiB; now staging buffers and one bounded copy, ~50 MiB)
    assert found["load"] > 100 and found["export"] < 80, found
    back = safetensors_torch.load_file(tmp_path / "out.safetensors")
    assert all(back[f"s/{name}"].equal(value) for name, value in state.items())


def test_what_safetensors_cannot_name_or_shape_is_refused_by_name(tmp_path: Path) -> None:
    """A lone surrogate in a name, a 0-dim float4 pair: safetensors' own errors, raw."""
    with CheckpointManager(tmp_path / "s") as mgr:
        odd = mgr.save(h=Holder({"a\udc80": torch.ones(2)}))
        scalar = mgr.save(h=Holder({"q": torch.zeros((), dtype=torch.uint8).view(
            torch.float4_e2m1fn_x2)}))
        with pytest.raises(FileFormatError, match=r"'h/a\\udc80' cannot be.*to a \.pt path"):
            mgr.export(odd, tmp_path / "odd.safetensors")
        with pytest.raises(FileFormatError, match=r"0-dim float4_e2m1fn_x2 tensor \(h/q\)"):
            mgr.export(scalar, tmp_path / "scalar.safetensors")
        assert torch.equal(read_file(mgr.export(odd, tmp_path / "odd.pt")).state["h"][
            "a\udc80"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.pt", "s"]


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


EXPORT = textwrap.dedent("""\
    import sys
    from ckpt_nb import CheckpointManager
    CheckpointManager(sys.argv[1]).export("latest", sys.argv[2])
""")


def test_an_export_killed_mid_write_leaves_a_temporary_the_next_export_removes(
        tmp_path: Path) -> None:
    """A SIGKILL while the file was written left ``.out.safetensors.XXXXXXXX`` for good."""
    with CheckpointManager(tmp_path / "s") as mgr:  # (256 MiB exported, 2 MiB stored)
        mgr.save(s=Holder({f"w{i}": (torch.arange(16 << 20) % 3).float() for i in range(4)}))
    out = tmp_path / "out"
    out.mkdir()
    killed = None
    for _ in range(5):  # (a try where the export ends before it is seen writing is retried)
        child = warm_python.Popen([sys.executable, "-c", EXPORT, tmp_path / "s",
                                  out / "model.safetensors"])
        deadline = time.monotonic() + 60
        while child.poll() is None and time.monotonic() < deadline:
            growing = [p for p in out.iterdir() if p.name.startswith(".")
                       and p.stat().st_size > 1 << 20]
            if growing:
                child.send_signal(signal.SIGKILL)
                killed = growing[0]
                break
            time.sleep(0.001)
        child.wait()
        if killed is not None and killed.exists():
            break
        killed = None  # (or the export renamed it in place before the kill came)
        (out / "model.safetensors").unlink()
    assert killed is not None, "the export was never seen writing"
    assert killed.name.startswith(f".model.safetensors.ckpt_nb-{child.pid}-") and \
        killed.name.endswith(".tmp"), killed.name
    assert sorted(p.name for p in out.iterdir()) == [killed.name]  # (left, as SIGKILL does)
    with CheckpointManager(tmp_path / "s") as mgr:
        mgr.export("latest", out / "other.pt")
    assert sorted(p.name for p in out.iterdir()) == ["other.pt"]


def test_only_a_dead_exports_temporaries_are_removed(tmp_path: Path) -> None:
    """Of the files named like an export's temporary, only a regular file of a process
    that is gone, and that no writer holds locked, goes; near names and others' stay."""
    dead, live = _dead_pid(), os.getppid()
    leftover = f".a.pt.ckpt_nb-{dead}-k2x_9abc.tmp"
    kept = [f".a.pt.ckpt_nb-{live}-k2x_9abc.tmp",  # (a live process's, writing now)
            f".b.pt.ckpt_nb-{dead}-locked00.tmp",  # (a live writer in another pid namespace)
            f".a.pt.ckpt_nb-{dead}-k2x_9abc.tmp.bak", f".a.pt.ckpt_nb-{dead}-k2x.tmp",
            f"a.pt.ckpt_nb-{dead}-k2x_9abc.tmp", f".a.pt.{dead}-k2x_9abc.tmp",
            f".a.pt.ckpt_nb-{dead}-K2X_9ABC.tmp", ".a.pt.k2x_9abc"]
    for name in [leftover, *kept]:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / f".c.pt.ckpt_nb-{dead}-folder00.tmp").mkdir()
    (tmp_path / f".d.pt.ckpt_nb-{dead}-symlink0.tmp").symlink_to(tmp_path / kept[-1])
    with CheckpointManager(tmp_path / "s") as mgr:
        mgr.save(torch.nn.Linear(2, 2))
        with open(tmp_path / kept[1], "rb") as writer:
            fcntl.flock(writer, fcntl.LOCK_EX)
            mgr.export("latest", tmp_path / "model.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*kept, f".c.pt.ckpt_nb-{dead}-folder00.tmp", f".d.pt.ckpt_nb-{dead}-symlink0.tmp",
         "model.safetensors", "s"])


def test_safetensors_names_that_would_clash_are_refused_not_one_value_written_for_two(
        tmp_path: Path) -> None:
    """``{"a/b": x, "a": {"b": y}}``, keys 1 and "1", bytes keys: both read back as one
    value, silently. Refused, naming them; a .pt export and the store keep every value."""
    extra = {"a/b": torch.tensor([1.0]), "a": {"b": torch.tensor([2.0])},
             "ids": {1: torch.tensor([5.0]), "1": torch.tensor([6.0])},
             "raw": {b"x": 1, b"y": 2}}
    with CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(torch.nn.Linear(1, 1), extra=extra)
        with pytest.raises(FileFormatError, match=r"extra/a/b, extra/ids/1, extra/raw/key "
                                                  r"would name two values.*\.pt path"):
            mgr.export(cid, tmp_path / "out" / "x.safetensors")
        for back in (mgr.load(cid).extra, read_file(mgr.export(cid, tmp_path / "x.pt")).extra):
            assert back["a/b"].item() == 1 and back["a"]["b"].item() == 2
            assert back["ids"][1].item() == 5 and back["ids"]["1"].item() == 6
            assert back["raw"] == {b"x": 1, b"y": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s", "x.pt"]


def test_an_object_saved_as_ckpt_nb_is_refused_whole_and_exports_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``save(model, ckpt_nb=ema)``: the file's own ``ckpt_nb`` entry took its place in
    either format, and the export dropped it without a word. A save now refuses the name;
    a store an earlier ckpt_nb wrote with it exports the object alone."""
    import ckpt_nb._manager

    ema = torch.nn.Linear(2, 2)
    with CheckpointManager(tmp_path / "s") as mgr:
        with pytest.raises(ValueError, match=r"\['ckpt_nb'\] name checkpoint fields"):
            mgr.save(torch.nn.Linear(2, 2), ckpt_nb=ema)
        with monkeypatch.context() as earlier:  # (the name was free before)
            earlier.setattr(ckpt_nb._manager, "RESERVED",
                            ckpt_nb._manager.RESERVED - {"ckpt_nb"})
            cid = mgr.save(torch.nn.Linear(2, 2), ckpt_nb=ema)
        for suffix in (".pt", ".safetensors"):
            with pytest.raises(FileFormatError, match=r"object named 'ckpt_nb'.*only='ckpt_nb'"):
                mgr.export(cid, tmp_path / f"all{suffix}")
            alone = mgr.export(cid, tmp_path / f"ema{suffix}", only="ckpt_nb")
            other = torch.nn.Linear(2, 2)
            other.load_state_dict(safetensors_torch.load_file(alone) if suffix == ".safetensors"
                                  else torch.load(alone, weights_only=True))
            assert other.weight.equal(ema.weight) and other.bias.equal(ema.bias)
    assert not any(p.name.startswith("all") for p in tmp_path.iterdir())


def test_a_safetensors_export_says_format_pt_and_one_object_exports_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hugging Face's loaders check ``{"format": "pt"}``; ``model/weight`` keys did not
    load into a model, and there was no way to export the model alone."""
    from ckpt_nb.cli import main

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(3)).sum().backward()
    opt.step()
    with CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(model, opt, 1)
        whole = mgr.export(cid, tmp_path / "all.safetensors")
        with safe_open(whole, "pt") as f:
            assert f.metadata()["format"] == "pt" and "ckpt_nb" in f.metadata()
            assert {"model/weight", "optimizer/state/0/exp_avg"} <= set(f.keys())
        with pytest.raises(FileFormatError, match=r"holds no object of that name, only "
                                                  r"'model', 'optimizer'"):
            mgr.export(cid, tmp_path / "x.pt", only="ema")
        alone = [mgr.export(cid, tmp_path / "model.safetensors", only="model"),
                 mgr.export(cid, tmp_path / "model.pt", only="model")]
        assert main(["export", str(tmp_path / "s"), cid, str(tmp_path / "cli.safetensors"),
                     "--only", "model"]) == 0
        alone.append(tmp_path / "cli.safetensors")
        for path in alone:
            other = torch.nn.Linear(3, 2)
            other.load_state_dict(safetensors_torch.load_file(path) if path.suffix ==
                                  ".safetensors" else torch.load(path, weights_only=True))
            assert other.weight.equal(model.weight) and other.bias.equal(model.bias)
            restored = torch.nn.Linear(3, 2)
            mgr.restore(path, model=restored)  # (ckpt_nb reads it back too)
            assert restored.weight.equal(model.weight)
    assert "cli.safetensors" in capsys.readouterr().out


def test_a_read_only_file_is_refused_and_a_link_is_replaced_not_followed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 0444 file was replaced without a word; what happens to a link is now told."""
    from ckpt_nb.cli import main

    shared, frozen = tmp_path / "shared.pt", tmp_path / "frozen.pt"
    shared.write_text("old")
    (tmp_path / "best.pt").symlink_to(shared)
    frozen.write_text("keep me")
    frozen.chmod(0o444)
    with CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(torch.nn.Linear(2, 2))
        with pytest.raises(PermissionError, match=r"it exists and is read-only.*frozen\.pt"):
            mgr.export(cid, frozen)
        assert main(["export", str(tmp_path / "s"), cid, str(frozen)]) == 1
        said = capsys.readouterr().err  # (the path once: it was said again at the end)
        assert said.count(str(frozen)) == 1 and said.rstrip().endswith("to have it replaced")
        mgr.export(cid, tmp_path / "best.pt")
    assert frozen.read_text() == "keep me" and shared.read_text() == "old"
    assert not (tmp_path / "best.pt").is_symlink()
    assert main(["export", "--help"]) == 0
    usage = " ".join(capsys.readouterr().out.split())
    assert "replaced atomically (a link at OUT is replaced, not followed" in usage
    assert ".pth, .bin, .ckpt" in usage and "--only NAME" in usage and "id prefix" in usage


def test_a_failed_export_leaves_no_folder_it_made_and_a_folder_target_is_named(
        tmp_path: Path) -> None:
    """Refused complex32 (before any write) and a torch.save failure (during one) left
    ``typo/deep/``; a folder at the target was named by the export's temporary."""
    z = torch.randn(3, dtype=torch.complex64)
    with CheckpointManager(tmp_path / "s") as mgr:
        half = mgr.save(Holder({"c": torch.zeros(2, dtype=torch.complex32)}))
        views = mgr.save(Holder({"z": z, "real": z.real}))
        with pytest.raises(FileFormatError, match="complex32"):
            mgr.export(half, tmp_path / "typo" / "deep" / "x.safetensors")
        with pytest.raises(FileFormatError, match="torch.save cannot write"):
            mgr.export(views, tmp_path / "typo" / "deep" / "x.pt")
        (tmp_path / "model.pt").mkdir()
        with pytest.raises(IsADirectoryError) as found:
            mgr.export(views, tmp_path / "model.pt")
    assert found.value.filename == str(tmp_path / "model.pt")
    assert ".ckpt_nb-" not in str(found.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "s"]
    assert list((tmp_path / "model.pt").iterdir()) == []


@pytest.mark.parametrize("under", ["x.pt", "sub/x.safetensors"])
def test_a_file_where_the_export_needs_a_folder_is_named(tmp_path: Path, under: str) -> None:
    """An export under a file said "File exists", naming the file but not the problem."""
    (tmp_path / "notes.txt").write_text("kept")
    with CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(torch.nn.Linear(2, 2))
        with pytest.raises(NotADirectoryError, match="a file is in the way, where the "
                                                     "export needs a folder") as found:
            mgr.export(cid, tmp_path / "notes.txt" / under)
    assert found.value.filename == str(tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "kept"


def test_a_bytes_path_exports(tmp_path: Path) -> None:
    """``os.fsencode(path)``, as os.listdir(bytes) gives names, was a TypeError."""
    with CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(torch.nn.Linear(2, 2))
        for name in ("b.pt", "b.safetensors"):
            path = mgr.export(cid, os.fsencode(tmp_path / name))
            assert path == tmp_path / name and read_file(path).state["model"]


def _my_loss(x: torch.Tensor) -> torch.Tensor:
    return x


def test_a_registered_class_or_function_kept_as_a_value_stays_in_a_pt_export(
        tmp_path: Path) -> None:
    """Lightning-style hparams ``{"act": nn.ReLU, "loss": fn}``: torch.load reads them once
    they are registered, yet the export wrote None, and told to register "its type"."""
    with CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(torch.nn.Linear(1, 1), extra={"act": torch.nn.ReLU, "loss": _my_loss})
        with torch.serialization.safe_globals([torch.nn.ReLU, _my_loss]):
            path = mgr.export(cid, tmp_path / "reg.pt", trust_pickle=True)
            back = torch.load(path, weights_only=True)["extra"]
        assert back == {"act": torch.nn.ReLU, "loss": _my_loss}
        with pytest.warns(UserWarning, match=r"extra/act \(ReLU, .*pass it to torch\."
                                             r"serialization\.add_safe_globals"):
            mgr.export(cid, tmp_path / "unreg.pt", trust_pickle=True)


def test_a_name_near_the_file_systems_limit_exports(tmp_path: Path) -> None:
    """A legal 240-character name failed with ENAMETOOLONG: the temporary's name was ~30
    characters longer. Its temporary (a cut name) is still one a later export removes."""
    from ckpt_nb._interop import _TEMPORARY, _atomic_target

    names = ["m" * 237 + ".pt", "é" * 120 + ".safetensors", "x" + "é" * 120 + ".pt"]
    with CheckpointManager(tmp_path / "s") as mgr:
        cid = mgr.save(torch.nn.Linear(2, 2))
        for name in names:
            assert read_file(mgr.export(cid, tmp_path / name)).state["model"]["weight"].shape \
                == (2, 2)
    for name in names:
        fd, tmp = _atomic_target(tmp_path / name)
        os.close(fd)
        assert _TEMPORARY.fullmatch(Path(tmp).name) and Path(tmp).exists(), tmp
    with CheckpointManager(tmp_path / "s") as mgr:  # (this pid's, unlocked: leftovers)
        mgr.export("latest", tmp_path / "other.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*names, "other.pt", "s"])
