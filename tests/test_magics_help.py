"""The magics' help and usage errors, driven through a real, in-process IPython shell."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets import TraitError

import ckpt_nb
from ckpt_nb import _session
from ckpt_nb._magics import MAGIC_NAMES, CkptMagics

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

SMALL = """
import torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""




def run(sh: InteractiveShell, code: str):
    return sh.run_cell(code, store_history=False)


def usage_error(sh: InteractiveShell, code: str) -> str:
    result = run(sh, code)
    assert isinstance(result.error_in_exec, UsageError), (code, result.error_in_exec)
    return str(result.error_in_exec)


def saved_store(sh: InteractiveShell, directory: Path) -> str:
    """A store with one checkpoint, by a %%ckpt_auto cell; its checkpoint's id."""
    run(sh, SMALL)
    assert run(sh, f"%%ckpt_auto --dir {directory}\n"
                   "opt.zero_grad(); model(torch.ones(4)).sum().backward(); opt.step()").success
    return str(ckpt_nb.CheckpointManager(directory).list()["id"].iloc[-1])


def test_ckpt_list_takes_dir_as_rollback_and_ui_do(shell, tmp_path: Path) -> None:
    """%ckpt_list --dir DIR looked for a store at "--dir DIR"."""
    first = saved_store(shell, tmp_path / "first")
    saved_store(shell, tmp_path / "second")
    for line in (f"--dir {tmp_path / 'first'}", f"--dir={tmp_path / 'first'}",
                 f"--dir '{tmp_path / 'first'}'"):
        table = run(shell, f"%ckpt_list {line}").result
        assert list(table["id"]) == [first], line
    assert "%ckpt_list --dir needs a directory" in usage_error(shell, "%ckpt_list --dir")


def test_ckpt_list_dir_lists_that_store_while_a_session_is_active(
        shell, tmp_path: Path) -> None:
    first = saved_store(shell, tmp_path / "first")
    assert run(shell, f"%ckpt_auto --dir {tmp_path / 'active'}").success
    table = run(shell, f"%ckpt_list --dir {tmp_path / 'first'}").result
    assert list(table["id"]) == [first]


def test_ckpt_auto_help_says_what_the_readme_promises(shell) -> None:
    """--on left out the bare name, --keep what it keeps, --dir its default, --every
    1d and a plain number of seconds."""
    help_text = " ".join(shell.find_line_magic("ckpt_auto").__doc__.split())
    assert "--on val_loss" in help_text and "--on accuracy" in help_text
    assert "keep the newest N checkpoints of this cell's run" in help_text
    assert "alone (no --keep) it deletes the others but the newest, as Lightning's " \
           "save_top_k does" in help_text  # (of 12 saves, 2 were kept, unsaid)
    assert "./checkpoints/<notebook name>, or ./checkpoints/session where the notebook is " \
           "unknown, as in nbconvert or papermill jobs" in help_text
    assert "1d, or a number of seconds" in help_text
    trait_help = " ".join(CkptMagics.class_traits()["default_dir"].help.split())
    assert "./checkpoints/session where the notebook is unknown" in trait_help


def test_help_examples_are_accepted(shell) -> None:
    """What the help offers works: a bare --on name, --every 1d, --every 90."""
    for line in ("--on val_loss", "--on accuracy", "--every 1d", "--every 90"):
        assert run(shell, f"%ckpt_auto {line}").success, line  # (each replaces the last)


@pytest.mark.parametrize(("code", "message"), [
    ("%ckpt_auto --on", "%ckpt_auto: argument --on: expected one argument"),
    ("%ckpt_auto --every-steps 1.5",
     "%ckpt_auto: argument --every-steps: invalid int value: '1.5'"),
    ("%%ckpt_auto --keep x\nran = True", "%ckpt_auto: argument --keep: invalid int value"),
    ("%ckpt_auto --strategy zip", "%ckpt_auto: argument --strategy: invalid choice"),
    ("%ckpt_auto --dir 'unclosed", "%ckpt_auto: No closing quotation"),
    ("%ckpt_rollback --dir", "%ckpt_rollback: argument --dir: expected one argument"),
    ("%ckpt_rollback latest extra", "%ckpt_rollback: unrecognized arguments: extra"),
    ("%ckpt_rollback 'unclosed", "%ckpt_rollback: No closing quotation"),
    ("%ckpt_list", "%ckpt_list: no store to list"),
    ("%ckpt_ui --dir", "%ckpt_ui --dir needs a directory"),
])
def test_usage_errors_name_their_magic(shell, code: str, message: str) -> None:
    """argparse's complaints came without the magic's name."""
    assert message in usage_error(shell, code)
    assert "ran" not in shell.user_ns
    assert ckpt_nb.status() == {"active": False}


def test_a_rollback_that_names_no_checkpoint_is_refused_and_changes_nothing(
        shell, tmp_path: Path) -> None:
    """A bare %ckpt_rollback rolled back to latest at once, dropping what the kernel
    trained since, though the README gives the ID as required."""
    store = tmp_path / "s"
    saved_store(shell, store)
    assert run(shell, "opt.zero_grad(); model(torch.ones(4)).sum().backward(); opt.step()"
               ).success
    trained = [p.clone() for p in shell.user_ns["model"].parameters()]
    for line in ("%ckpt_rollback", f"%ckpt_rollback --dir {store}",
                 f"%ckpt_rollback --on loss:min --dir {store}"):
        assert usage_error(shell, line) == (
            "%ckpt_rollback: name the checkpoint to roll back to, nothing was changed: "
            "%ckpt_rollback ID (or a prefix of it, as %ckpt_list shows), latest (the store's "
            "newest), best, or -N (the one saved N before latest: -1 the one just before it)")
        assert all(p.equal(t) for p, t in zip(shell.user_ns["model"].parameters(), trained))


def test_ckpt_list_of_no_store_names_the_magic(shell, tmp_path: Path) -> None:
    message = usage_error(shell, f"%ckpt_list --dir {tmp_path / 'nowhere'}")
    assert message == f"%ckpt_list: no checkpoint store at {tmp_path / 'nowhere'}"


def test_ckpt_status_refuses_arguments(shell, tmp_path: Path, capsys) -> None:
    """%ckpt_status DIR printed the active session's status, as if DIR had been read."""
    saved_store(shell, tmp_path / "s")
    capsys.readouterr()
    for line in ("extra", str(tmp_path / "s"), "--dir x"):
        message = usage_error(shell, f"%ckpt_status {line}")
        assert f"%ckpt_status takes no arguments, not {line!r}" in message
        assert "%ckpt_list DIR" in message
    assert "no session active" not in capsys.readouterr().out
    assert run(shell, "%ckpt_status  ").success
    assert "no session active" in capsys.readouterr().out


def test_a_metric_name_no_keyword_can_spell_is_still_watched(shell, tmp_path: Path) -> None:
    """--on 'val loss:min' is kept: ckpt_nb.log(**{"val loss": v}) feeds it (as a dict of
    metrics named "val/loss" from other tools does)."""
    run(shell, SMALL)
    cell = (f"%%ckpt_auto --dir {tmp_path} --on 'val loss:min' --keep-best 1\n"
            "for epoch in ckpt_nb.epochs(3):\n"
            "    for i, x in ckpt_nb.batches([torch.ones(4)] * 2):\n"
            "        opt.zero_grad(); model(x).sum().backward(); opt.step()\n"
            "    ckpt_nb.log(**{'val loss': [0.5, 0.3, 0.4][epoch]})")
    assert run(shell, cell).success
    table = ckpt_nb.CheckpointManager(tmp_path).list()
    assert 0.3 in set(table["val loss"])


@pytest.mark.parametrize(("name", "value", "message"), [
    ("max_variable_mb", -1, "CkptMagics.max_variable_mb is the largest plain variable "
                            "captured, in MiB: 0 or more, not -1"),
    ("default_dir", "  ", "CkptMagics.default_dir is blank: give a directory"),
    ("root_dir", "", "CkptMagics.root_dir is empty: give a folder, \"checkpoints\""),
    ("root_dir", " ", "CkptMagics.root_dir is blank: give a folder"),
])
def test_a_bad_config_value_is_refused_where_it_is_set(
        shell, tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, value: object,
        message: str) -> None:
    """max_variable_mb = -1 was taken, and every later %%ckpt_auto failed, naming
    max_variable_bytes and -1048576. (Said once: each unloaded instance said it too.)"""
    run(shell, "%unload_ext ckpt_nb")
    run(shell, "%load_ext ckpt_nb")
    magics = shell.magics_manager.registry["CkptMagics"]
    try:
        run(shell, f"%config CkptMagics.{name} = {value!r}")
        assert caplog.text.count(message) == 1
        assert (magics.max_variable_mb, magics.default_dir, magics.root_dir) == \
            (100, "", "checkpoints")
        with pytest.raises(TraitError, match=message):
            setattr(magics, name, value)
        run(shell, SMALL)
        assert run(shell, f"%%ckpt_auto --dir {tmp_path}\nopt.step()").success
        # (the shell's config keeps the refused value: a reload says which, and how to fix)
        run(shell, "%unload_ext ckpt_nb")
        assert usage_error(shell, "%load_ext ckpt_nb").startswith(
            f"%load_ext ckpt_nb: {message}")
        run(shell, f"%config CkptMagics.{name} = {magics.trait_defaults(name)!r}")
        assert run(shell, "%load_ext ckpt_nb").success
    finally:
        shell.config.pop("CkptMagics", None)  # (the next test's shell loads afresh)


def test_zero_mib_is_a_cap(shell) -> None:
    magics = shell.magics_manager.registry["CkptMagics"]
    try:
        assert run(shell, "%config CkptMagics.max_variable_mb = 0").success
        assert magics.max_variable_mb == 0
    finally:
        shell.config.pop("CkptMagics", None)


def test_a_second_line_form_says_what_it_replaces(shell, tmp_path: Path, capsys) -> None:
    """A second %ckpt_auto dropped the first one's store, triggers and retention unsaid."""
    run(shell, SMALL)
    assert run(shell, f"%ckpt_auto --dir {tmp_path / 'a'} --every-steps 5 --keep 3").success
    assert "replaces" not in capsys.readouterr().out
    assert run(shell, f"%ckpt_auto --dir {tmp_path / 'b'} --on val_loss").success
    out = capsys.readouterr().out
    assert "ckpt_nb: this %ckpt_auto replaces the session's earlier one, which stops " \
           f"({tmp_path / 'a'}: every 5 steps, keep 3)\n" in out
    assert ckpt_nb.status()["triggers"] == ["when val_loss improves (min)"]
    assert run(shell, "%ckpt_auto --off").success


@pytest.mark.parametrize("directory", [True, False])
def test_the_same_line_again_says_it_restarts(shell, tmp_path: Path, capsys,
                                               directory: bool) -> None:
    """A cell run again with the same line said it "replaces" an earlier session that
    stops, as if something had been dropped."""
    run(shell, SMALL)
    line = "%ckpt_auto --every-steps 5 --keep 3" + (f" --dir {tmp_path}" if directory else "")
    assert run(shell, line).success
    capsys.readouterr()
    assert run(shell, line).success
    out = capsys.readouterr().out
    assert "ckpt_nb: %ckpt_auto again with the same options: checkpointing restarts, and " \
           "each trigger's count with it\n" in out
    assert "replaces" not in out
    assert run(shell, "%ckpt_auto --off").success


@pytest.mark.parametrize(("line", "option"), [
    ("%ckpt_auto --every-steps 5 --every-steps 10", "--every-steps"),
    ("%ckpt_auto --every-steps=5 --every-steps 10", "--every-steps"),
    ("%ckpt_auto --every 5 --every-seconds 10 --every 10m", "--every"),
    ("%ckpt_auto --keep-b 1 --on loss --keep-best 2", "--keep-best"),
    ("%%ckpt_auto --sync --sync\nran = True", "--sync"),
    ("%ckpt_rollback --dir a --dir b", "--dir"),
])
def test_an_option_given_twice_is_refused(shell, line: str, option: str) -> None:
    """argparse kept the last silently: --every-steps 5 --every-steps 10 saved every 10."""
    assert usage_error(shell, line).endswith(f": {option} is given twice: give it once")
    assert "ran" not in shell.user_ns
    assert ckpt_nb.status() == {"active": False}


def test_the_line_form_refuses_no_resume(shell) -> None:
    """The line form resumes no run: --no-resume there was taken, and meant nothing."""
    assert usage_error(shell, "%ckpt_auto --no-resume") == (
        "%ckpt_auto: --no-resume is a %%ckpt_auto cell's (it resumes the cell's unfinished "
        "run); the line form resumes no run")
    assert ckpt_nb.status() == {"active": False}


def test_every_rollback_error_names_the_store_it_looked_in(shell, tmp_path: Path) -> None:
    """Trained in one store with --on, then a cell in another: "no checkpoint has the
    metric 'val_loss'" and "only 1 checkpoint: -1 is too far back" named no store, and
    gave no --dir hint (an id not found did), though the last cell's store, which the
    rollback took, was the wrong one."""
    run(shell, SMALL)
    assert run(shell, f"%%ckpt_auto --dir {tmp_path / 'main'} --on val_loss:min\n"
                      "for epoch in ckpt_nb.epochs(3):\n"
                      "    opt.zero_grad(); model(torch.ones(4)).sum().backward(); opt.step()\n"
                      "    ckpt_nb.log(val_loss=1.0 / (epoch + 1))").success
    scratch = tmp_path / "scratch"
    assert run(shell, f"%%ckpt_auto --dir {scratch}\nx = 1").success
    for line, said in (
            ("best --on val_loss:min",
             "no checkpoint has the metric 'val_loss'; no metrics were logged"),
            ("-1", "only 1 checkpoint: -1 is too far back; the latest is the only one"),
            ("best", "'best' needs a metric to rank by, and no save to this store recorded "
                     "one: %ckpt_rollback best --on METRIC:min|max, or roll back by id "
                     "(%ckpt_list, then %ckpt_rollback ID)")):
        assert usage_error(shell, f"%ckpt_rollback {line}") == (
            f"%ckpt_rollback: {said}; it looked in {scratch}, the store of the last "
            f"session: for a checkpoint of another store, %ckpt_rollback {line} --dir PATH")
        # (a store the line gives is the one meant: the line names it)
        assert usage_error(shell, f"%ckpt_rollback {line} --dir {scratch}") == (
            f"%ckpt_rollback: {said}")
    # (one that names the store already says it once)
    assert usage_error(shell, "%ckpt_rollback nosuchid") == (
        f"%ckpt_rollback: no checkpoint 'nosuchid' in {scratch}: use an id from %ckpt_list, "
        "'latest', 'best' or '-N'; it looked in the store of the last session: for a "
        "checkpoint of another store, %ckpt_rollback nosuchid --dir PATH")
    assert usage_error(shell, f"%ckpt_rollback -1 --dir {tmp_path / 'main'}x") == (
        f"%ckpt_rollback: no checkpoint store at {tmp_path / 'main'}x: did you mean "
        f"{tmp_path / 'main'}?")
    assert usage_error(shell, f"%ckpt_rollback -1 --dir {tmp_path / 'nowhere'}") == (
        f"%ckpt_rollback: no checkpoint store at {tmp_path / 'nowhere'}: give the --dir of a "
        "%ckpt_auto run")
    assert run(shell, f"%ckpt_rollback best --on val_loss:min --dir {tmp_path / 'main'}").success


def test_rollback_help_says_what_minus_n_counts_and_it_counts_so(
        shell, tmp_path: Path) -> None:
    """%ckpt_rollback? said "-N" and no more (the CLI's help: "N back from latest")."""
    help_text = " ".join(shell.find_line_magic("ckpt_rollback").__doc__.split())
    assert "-N, the checkpoint saved N before latest (-1 the one just before it), counted " \
           "in save order over the whole store" in help_text
    assert "latest, the store's newest checkpoint" in help_text
    store = tmp_path / "s"
    first = saved_store(shell, store)
    cell = (f"%%ckpt_auto --dir {store}\n"
            "opt.zero_grad(); model(torch.ones(4)).sum().backward(); opt.step()")
    assert run(shell, cell).success
    second = ckpt_nb.CheckpointManager(store).resolve("latest")
    assert run(shell, f"%ckpt_rollback {first}").success
    assert run(shell, cell).success  # (saves a child of the first)
    table = ckpt_nb.CheckpointManager(store).list()
    assert list(table["parent"].iloc[-1:]) == [first]
    assert run(shell, "%ckpt_rollback -1").success
    assert _session.kernel_position(store) == second  # (saved before latest: not its parent)


def test_help_metavars_are_the_words_the_help_uses(shell) -> None:
    """%ckpt_auto? showed --every-steps EVERY_STEPS, --keep KEEP, --on ON beside "save
    every N steps", "the newest N", "METRIC:min"; --no-resume did not say it is a cell's
    alone (the line form refuses it); the module's docstring left %ckpt_ui out."""
    auto = " ".join(shell.find_line_magic("ckpt_auto").__doc__.split())
    for usage in ("[--every-steps N]", "[--every-seconds S]", "[--every DURATION]",
                  "[--on METRIC[:min|max]]", "[--keep N]", "[--keep-best K]",
                  "[--track NAMES]"):
        assert usage in auto, usage
    assert not re.search(r"\b(EVERY_STEPS|EVERY_SECONDS|EVERY|ON|KEEP|KEEP_BEST|TRACK)\b", auto)
    assert "--no-resume a %%ckpt_auto cell's only" in auto
    assert "comma-separated without spaces (model,opt)" in auto
    rollback = " ".join(shell.find_line_magic("ckpt_rollback").__doc__.split())
    assert "%ckpt_rollback [--dir DIR] [--on METRIC[:min|max]] [--trust-pickle] " \
           "ID|latest|best|-N" in rollback
    assert "%ckpt_ui" in " ".join(ckpt_nb._magics.__doc__.split())


@pytest.mark.parametrize(("code", "message"), [
    ("%%ckpt_auto runs/o\nran = True", "%ckpt_auto: unrecognized arguments: runs/o: "
     "%ckpt_auto and %%ckpt_auto take the store as --dir runs/o"),
    ("%ckpt_auto --sync my runs", "%ckpt_auto: unrecognized arguments: my runs: %ckpt_auto "
     "and %%ckpt_auto take the store as --dir \"my runs\""),
    ("%%ckpt_auto --track model, opt\nran = True", "%ckpt_auto: unrecognized arguments: "
     "opt: give --track its names without spaces, --track model,opt"),
    ("%ckpt_auto --track=model, opt, sched --sync", "%ckpt_auto: unrecognized arguments: "
     "opt, sched: give --track its names without spaces, --track model,opt,sched"),
    ("%ckpt_auto --dir my runs --sync", "%ckpt_auto: unrecognized arguments: runs: quote a "
     "--dir with spaces, --dir \"my runs\""),
    ("%ckpt_rollback latest --dir 'my' runs", "%ckpt_rollback: unrecognized arguments: runs: "
     "quote a --dir with spaces, --dir \"my runs\""),
    # (the CLI's, CheckpointManager's and Lightning's options: the magic's own named)
    ("%ckpt_rollback best --metric val_loss", "%ckpt_rollback: unrecognized arguments: "
     "--metric val_loss: --metric is --on METRIC:min|max here"),
    ("%%ckpt_auto --max-to-keep 3\nran = True", "%ckpt_auto: unrecognized arguments: "
     "--max-to-keep 3: --max-to-keep is --keep N here"),
    # (where the words' meaning is not clear, argparse's complaint alone)
    ("%ckpt_auto --on val_loss min", "%ckpt_auto: unrecognized arguments: min"),
    ("%ckpt_auto --bogus x", "%ckpt_auto: unrecognized arguments: --bogus x"),
    ("%ckpt_rollback latest extra", "%ckpt_rollback: unrecognized arguments: extra"),
])
def test_words_no_option_takes_say_what_they_were_meant_as(
        shell, code: str, message: str) -> None:
    """%%ckpt_auto runs/o said "unrecognized arguments: runs/o" (%ckpt_list and %ckpt_ui
    take a bare DIR: users try it), --track model, opt "unrecognized arguments: opt"."""
    assert usage_error(shell, code) == message
    assert "ran" not in shell.user_ns
    assert ckpt_nb.status() == {"active": False}


def test_a_variable_over_the_cap_is_said_with_the_cap_that_takes_it(
        shell, tmp_path: Path, capsys) -> None:
    """"big (2.0 MiB, over the 1 MiB cap)" did not say how to raise the cap."""
    magics = shell.magics_manager.registry["CkptMagics"]
    try:
        run(shell, SMALL + "import numpy as np\nbig = np.zeros((2 << 20) // 8 + 1)")
        assert run(shell, "%config CkptMagics.max_variable_mb = 1").success
        cell = f"%%ckpt_auto --dir {tmp_path}\nopt.step()"
        assert run(shell, cell).success
        assert ("; skipped big (2.0 MiB, over the 1 MiB cap: %config CkptMagics.max_variable_mb"
                " = 3 takes it)") in capsys.readouterr().out
        assert run(shell, "%config CkptMagics.max_variable_mb = 3").success  # (as said)
        assert magics.max_variable_mb == 3
        assert run(shell, cell).success
        assert "variables big" in capsys.readouterr().out
    finally:
        shell.config.pop("CkptMagics", None)


def test_root_dir_holds_each_notebooks_default_store(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """%config CkptMagics.default_dir = "runs" (the README's example) made runs/ itself
    the store, one for every notebook where set in ipython_config.py, whose cells resume
    and prune each other's runs: root_dir is the folder of each notebook's own."""
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "exp1.ipynb"))
    magics = shell.magics_manager.registry["CkptMagics"]
    trait_help = " ".join(CkptMagics.class_traits()["root_dir"].help.split())
    assert "<root_dir>/<notebook name>, each notebook's own" in trait_help
    assert "<CkptMagics.root_dir>/<notebook name>" in " ".join(
        shell.find_line_magic("ckpt_auto").__doc__.split())
    run(shell, SMALL)
    cell = "%%ckpt_auto\nopt.zero_grad(); model(torch.ones(4)).sum().backward(); opt.step()"
    try:
        assert run(shell, "%config CkptMagics.root_dir = 'runs'").success
        assert magics.root_dir == "runs"
        assert run(shell, cell).success
        store = tmp_path / "runs" / "exp1"
        assert f" -> {store} (the default store)\n" in capsys.readouterr().out
        assert len(ckpt_nb.CheckpointManager(store).list()) == 1
        assert run(shell, "%ckpt_list").result["id"].tolist() == \
            ckpt_nb.CheckpointManager(store).list()["id"].tolist()
        monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "exp2.ipynb"))
        assert run(shell, "%ckpt_auto").success  # (the line form too)
        assert f" -> {tmp_path / 'runs' / 'exp2'}\n" in capsys.readouterr().out
        assert run(shell, "%ckpt_auto --off").success
        # default_dir, the store itself, wins
        assert run(shell, f"%config CkptMagics.default_dir = '{tmp_path / 'one'}'").success
        assert run(shell, cell).success
        assert f" -> {tmp_path / 'one'} (CkptMagics.default_dir)\n" in capsys.readouterr().out
    finally:
        shell.config.pop("CkptMagics", None)
        magics.default_dir, magics.root_dir = "", "checkpoints"
    assert _session.default_directory({}, "s3://bucket/runs/") == "s3://bucket/runs/exp2"
    assert _session.default_directory({}) == str(Path("checkpoints") / "exp2")


@pytest.mark.parametrize("word", ["-h", "--help"])
def test_help_words_print_each_magics_help_and_do_nothing_else(
        shell, tmp_path: Path, capsys, word: str) -> None:
    """IPython's magic parsers take no -h: %ckpt_rollback -h said "name the checkpoint to
    roll back to", %ckpt_auto -h "unrecognized arguments: -h", %ckpt_list -h and %ckpt_ui
    -h looked for a store at "-h", and %%ckpt_auto -h ran nothing but said nothing."""
    store = tmp_path / "s"
    saved_store(shell, store)  # (a rollback has a session's store to roll back in)
    assert run(shell, "opt.zero_grad(); model(torch.ones(4)).sum().backward(); opt.step()"
               ).success
    trained = [p.clone() for p in shell.user_ns["model"].parameters()]
    saved = ckpt_nb.CheckpointManager(store).list()["id"].tolist()
    other = tmp_path / "other"
    codes = [*(f"%{name} {word}" for name in MAGIC_NAMES["line"]),
             *(f"%%{name} {word}\nran = True" for name in MAGIC_NAMES["cell"]),
             f"%ckpt_rollback -1 {word}", f"%ckpt_rollback --dir {store} {word} latest",
             f"%ckpt_auto --dir {other} --every-steps 5 {word}",
             f"%%ckpt_auto --dir {other} {word} --keep 2\nran = True"]
    capsys.readouterr()
    for code in codes:
        result = run(shell, code)
        assert result.success and result.result is None, (code, result.error_in_exec)
        name = code.lstrip("%").split()[0]
        shown = " ".join(capsys.readouterr().out.split())
        # (the text %name? shows, its usage without the reST "::" that opens it)
        help_text = " ".join(shell.find_line_magic(name).__doc__.split()).removeprefix(":: ")
        ends = " (help only: the %%ckpt_auto cell was not run)" if "\n" in code else ""
        assert shown == help_text + ends, code
        assert re.match(f"%{name}[ :]", shown), shown
    assert "ran" not in shell.user_ns
    assert ckpt_nb.status() == {"active": False}
    assert all(p.equal(t) for p, t in zip(shell.user_ns["model"].parameters(), trained))
    assert ckpt_nb.CheckpointManager(store).list()["id"].tolist() == saved
    assert not other.exists() and not (tmp_path / "checkpoints").exists()
    # (a store named "-h", quoted, is that store; a -N is no option, as before)
    assert usage_error(shell, f"%ckpt_list '{word}'") == \
        f"%ckpt_list: no checkpoint store at {word}"
    assert run(shell, "%ckpt_rollback -0").success
