"""The command line's help and refusals say alike what each command needs."""

from __future__ import annotations


from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import CheckpointManager, CheckpointNotFoundError
from ckpt_nb.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_help_shows_the_ranking_options_that_may_come_before_the_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    """README: --metric and --mode may come before the command (``ckpt-nb --metric
    val_loss ls DIR`` works); ``ckpt-nb --help`` named neither but in its epilog."""
    code, out, _ = run(capsys, "--help")
    usage = " ".join(out.split("\n\n")[0].split())
    assert code == 0 and "[--metric METRIC] [--mode {min,max}] COMMAND" in usage
    text = " ".join(out.split())
    assert "--metric METRIC, --on METRIC the metric that ranks checkpoints" in text
    assert "--mode {min,max} whether a lower or higher --metric is better" in text
    assert "every command but gc takes them" in text


def saved(directory: Path, metrics: dict[str, float]) -> list[str]:
    """Three checkpoints of an nn.Linear, each logging ``metrics``."""
    with CheckpointManager(directory) as mgr:
        return [mgr.save(torch.nn.Linear(2, 2), rng=False, metrics=metrics) for _ in range(3)]


def test_show_refuses_an_unknown_metric_naming_those_logged_as_ls_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ls --metric nope`` listed the metrics logged; ``show DIR best --metric nope``
    said only that none had it (and the API's resolve, and so the magics, too)."""
    saved(tmp_path, {"loss_10": 1.0, "loss_2": 2.0})
    said = "no checkpoint has the metric 'nope'; the metrics logged are: loss_2, loss_10"
    assert run(capsys, "show", tmp_path, "best", "--metric", "nope") == \
        (1, "", f"ckpt-nb: {said}\n")
    assert run(capsys, "ls", tmp_path, "--metric", "nope") == (1, "", f"ckpt-nb: {said}\n")
    with CheckpointManager(tmp_path, metric="nope", mode="min") as mgr:
        with pytest.raises(CheckpointNotFoundError) as refused:
            mgr.resolve("best")
    assert str(refused.value) == said


def test_minus_n_too_far_back_names_the_oldest_there_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """"only 3 checkpoints ...: -9 is too far back" left the user to work out -2."""
    ids = saved(tmp_path, {})
    assert run(capsys, "show", tmp_path, "-9") == (1, "", (
        f"ckpt-nb: only 3 checkpoints from latest ({ids[-1]}) back: -9 is too far back; "
        "-2 is the oldest\n"))
    with CheckpointManager(tmp_path) as mgr:
        with pytest.raises(CheckpointNotFoundError) as refused:
            mgr.resolve("-3")
    assert str(refused.value) == "only 3 checkpoints: -3 is too far back; -2 is the oldest"
    with CheckpointManager(tmp_path / "one") as mgr:
        mgr.save(torch.nn.Linear(2, 2), rng=False)
        with pytest.raises(CheckpointNotFoundError) as refused:
            mgr.resolve("-1")
    assert str(refused.value) == ("only 1 checkpoint: -1 is too far back; the latest is "
                                  "the only one")


def test_show_lists_metrics_in_the_order_ls_shows_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """show listed loss_10 before loss_2 (string order); ls's columns are loss_2, loss_10."""
    saved(tmp_path, {"loss_10": 1.0, "loss_2": 2.0, "acc": 0.5})
    code, out, _ = run(capsys, "show", tmp_path, "latest")
    assert code == 0 and "metrics:   acc=0.5, loss_2=2, loss_10=1\n" in out
    code, out, _ = run(capsys, "ls", tmp_path)
    assert code == 0 and out.split()[11:14] == ["acc", "loss_2", "loss_10"]


def test_info_names_the_save_time_created_as_list_and_checkpoint_do(tmp_path: Path) -> None:
    """info() called it created_at, list() and Checkpoint created: one name for one
    value (created_at stays, for code written against it)."""
    (cid, *_) = saved(tmp_path, {})
    with CheckpointManager(tmp_path) as mgr:
        info = mgr.info(cid)
        assert info["created"] == info["created_at"] == mgr.load(cid).created
        assert abs(info["created"] - mgr.list()["created"].iloc[0].timestamp()) < 1e-6


def test_a_folder_that_is_no_store_names_the_stores_it_was_likely_meant_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``ckpt-nb ls checkpoints`` (the folder %%ckpt_auto keeps a store per notebook in),
    ``ls runs/exp`` for ``runs/exp1``, ``ls runs/exp1/manifests``: each said only "no
    checkpoint store at ...", with nothing of where the stores are."""
    monkeypatch.chdir(tmp_path)
    for name in ("exp1", "exp2"):
        saved(tmp_path / "runs" / name, {})
    (tmp_path / "runs" / "notes").mkdir()
    said = {argv: run(capsys, "ls", argv) for argv in (
        "runs", "runs/", "runs/exp", "runs/exp1/manifests", "runs/notes", "elsewhere")}
    assert said == {argv: (2, "", f"ckpt-nb: no checkpoint store at {argv}{hint}\n")
                    for argv, hint in (
        ("runs", ": the stores in it are runs/exp1, runs/exp2; give one of them"),
        ("runs/", ": the stores in it are runs/exp1, runs/exp2; give one of them"),
        ("runs/exp", ": did you mean runs/exp1 or runs/exp2?"),
        ("runs/exp1/manifests", ": it is inside the store at runs/exp1; give that folder"),
        ("runs/notes", ""), ("elsewhere", ""))}
    assert run(capsys, "ls", ".")[2] == ("ckpt-nb: no checkpoint store at .: the stores in it "
                                         "are runs/exp1, runs/exp2; give one of them\n")
    with pytest.raises(CheckpointNotFoundError) as refused:  # (the API's and magics' too)
        ckpt_nb.history(tmp_path / "runs" / "exp3")
    assert str(refused.value).strip("'\"").endswith(
        f": did you mean {tmp_path / 'runs' / 'exp1'} or {tmp_path / 'runs' / 'exp2'}?")
    assert not (tmp_path / "runs" / "exp").exists()


@pytest.mark.parametrize(("argv", "said"), [
    (["ls", "{dir}", "--allmetrics"], "ckpt-nb ls: error: unrecognized arguments: "
     "--allmetrics: did you mean --all-metrics?"),
    (["ls", "{dir}", "--metrics", "loss"], "ckpt-nb ls: error: unrecognized arguments: "
     "--metrics: did you mean --metric?"),
    (["rm", "{dir}", "-2", "--forse"], "ckpt-nb rm: error: unrecognized arguments: --forse: "
     "did you mean --force?"),
    (["export", "{dir}", "latest", "o.safetensors", "--trust_pickle"], "ckpt-nb export: error: "
     "unrecognized arguments: --trust_pickle: did you mean --trust-pickle?"),
    (["show", "{dir}", "best", "--on", "loss:minimum"], "ckpt-nb show: error: --on "
     "loss:minimum: the mode after the ':' is min or max, not 'minimum': --on loss:min"),
    (["ls", "{dir}", "--metric=loss:Maximum"], "ckpt-nb ls: error: --metric loss:Maximum: "
     "the mode after the ':' is min or max, not 'Maximum': --metric loss:max"),
    (["rm", "{dir}", "-2", "-force"], "ckpt-nb rm: error: unrecognized arguments: -force: "
     "did you mean --force?"),  # (one dash, as the magics take -every-steps)
    (["ls", "{dir}", "-all_metrics"], "ckpt-nb ls: error: unrecognized arguments: "
     "-all_metrics: did you mean --all-metrics?"),
    (["ls", "{dir}", "--sort", "step"], "ckpt-nb ls: error: unrecognized arguments: --sort "
     "step"),  # (no option of ls is close: argparse's words alone)
])
def test_a_misspelt_option_names_the_one_meant(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    """``ls DIR --allmetrics`` said "unrecognized arguments: --allmetrics" alone."""
    saved(tmp_path, {"loss": 1.0})
    code, out, err = run(capsys, *(a.format(dir=tmp_path) for a in argv))
    assert (code, out, err.splitlines()[-1]) == (2, "", said)
    assert len(CheckpointManager(tmp_path).list()) == 3  # (rm deleted nothing)


def test_a_metric_named_with_a_colon_is_still_found(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--metric loss:minimum`` is refused as a mode misspelt; ``grad:max_norm``, a
    metric's own name, was refused the same way, though a store logging it ranked by it."""
    with CheckpointManager(tmp_path) as mgr:
        lowest = [mgr.save(torch.nn.Linear(2, 2), rng=False, metrics={"grad:max_norm": v})
                  for v in (1.0, 0.5, 2.0)][1]
    code, out, err = run(capsys, "show", tmp_path, "best", "--metric", "grad:max_norm",
                         "--mode", "min")
    assert (code, err) == (0, "") and out.startswith(f"id:        {lowest}\n")
    assert run(capsys, "ls", tmp_path, "--on", "grad:max_norm:max")[0] == 0


def test_a_prefix_too_short_is_told_the_command_that_lists_ids_not_the_apis_list(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ckpt-nb show DIR 0c6`` said "(list(), ckpt-nb ls)", where every other refusal of
    the command line names `ckpt-nb ls` alone."""
    saved(tmp_path, {})
    assert run(capsys, "show", tmp_path, "f0e") == (1, "", (
        "ckpt-nb: 'f0e' is too short for an id prefix: give at least 4 characters of an id "
        "from `ckpt-nb ls`, or 'latest', 'best' or '-N'\n"))
