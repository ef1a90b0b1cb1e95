"""The hints a magic's usage error gives: each pastes as it is, and none is given where
the words' meaning is not clear. Driven through a real, in-process IPython shell."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets import TraitError

import ckpt_nb

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)

SMALL = """
import torch, ckpt_nb
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
STEP = "opt.zero_grad(); model(torch.ones(4)).sum().backward(); opt.step()"


def usage_error(sh: InteractiveShell, code: str) -> str:
    result = sh.run_cell(code, store_history=False)
    assert isinstance(result.error_in_exec, UsageError), (code, result.error_in_exec)
    return str(result.error_in_exec)


@pytest.mark.parametrize(("line", "paste"), [
    ('"my runs"', '--dir "my runs"'),  # (it said --dir ""my runs"")
    ("'my runs'", '--dir "my runs"'),  # (it said --dir "'my runs'": a folder with quotes)
])
def test_a_quoted_store_given_bare_is_hinted_as_it_pastes(
        shell, tmp_path: Path, line: str, paste: str) -> None:
    shell.run_cell(SMALL, store_history=False)
    message = usage_error(shell, f"%%ckpt_auto {line}\n{STEP}")
    assert message.endswith(f"take the store as {paste}")
    assert shell.run_cell(f"%%ckpt_auto {paste}\n{STEP}", store_history=False).success
    assert len(ckpt_nb.CheckpointManager(tmp_path / "my runs").list()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my runs"]


@pytest.mark.parametrize(("code", "message"), [
    # a path after an option's value is the store, whichever option (it was --sync's alone)
    ("%ckpt_auto --track model,opt runs/o", "runs/o: %ckpt_auto and %%ckpt_auto take the "
     "store as --dir runs/o"),  # (it said --track model,opt,runs/o)
    ("%ckpt_auto --every 10m runs/o", "runs/o: %ckpt_auto and %%ckpt_auto take the store "
     "as --dir runs/o"),
    ("%ckpt_auto --every-steps 2 runs/o", "runs/o: %ckpt_auto and %%ckpt_auto take the "
     "store as --dir runs/o"),
    ("%ckpt_auto --keep 2 runs/o", "runs/o: %ckpt_auto and %%ckpt_auto take the store as "
     "--dir runs/o"),
    ("%ckpt_auto --track model, opt", "opt: give --track its names without spaces, "
     "--track model,opt"),
    # (names with a space alone between them: it said "unrecognized arguments: opt")
    ("%ckpt_auto --track model opt", "opt: give --track its names without spaces, "
     "--track model,opt"),
    ("%ckpt_auto --track model opt sched --sync", "opt sched: give --track its names "
     "without spaces, --track model,opt,sched"),
    ("%ckpt_rollback -1 --dir my runs", "runs: quote a --dir with spaces, --dir \"my runs\""),
    # (one of the magic's own options misspelt: it said "unrecognized arguments" alone)
    ("%ckpt_auto --every-secs 10", "--every-secs 10: did you mean --every-seconds or "
     "--every-steps?"),
    ("%ckpt_auto --keepbest 2", "--keepbest 2: did you mean --keep-best?"),
    ("%ckpt_auto -every-steps 10", "-every-steps 10: did you mean --every-steps?"),
    ("%ckpt_auto --no_resume", "--no_resume: did you mean --no-resume?"),
    ("%ckpt_rollback latest --trustpickle", "--trustpickle: did you mean --trust-pickle?"),
    ("%ckpt_auto --resume", "--resume"),  # (not --no-resume: the opposite)
    # (no hint: what the words were meant as is not clear, or the hint would be wrong)
    ("%ckpt_auto --track model,opt extra", "extra"),  # (it said --track model,opt,extra)
    ("%ckpt_auto --dir 'my runs' extra", "extra"),  # (it said --dir "my runs extra")
    ("%ckpt_auto --dir runs/a runs/b", "runs/b"),  # (it said --dir "runs/a runs/b")
    ('%ckpt_auto --dir ""my runs""', 'my runs""'),  # (it said --dir " my runs""")
    ("%ckpt_auto --off runs/o", "runs/o"),  # (its --dir hint was refused: --off takes none)
    ("%ckpt_auto --every 10 m", "m"),
    ("%ckpt_auto --bogus runs/o", "--bogus runs/o"),
])
def test_words_no_option_takes_are_hinted_only_where_clear(
        shell, code: str, message: str) -> None:
    magic = code.split()[0][1:]
    assert usage_error(shell, code) == f"%{magic}: unrecognized arguments: {message}"


def test_a_rollback_dir_with_a_space_unquoted_says_to_quote_it(shell, tmp_path: Path) -> None:
    """%ckpt_rollback --dir my runs: argparse takes runs for the ID; the error said "no
    checkpoint store at my" alone."""
    (tmp_path / "my runs").mkdir()
    assert usage_error(shell, "%ckpt_rollback --dir my runs").endswith(
        "; quote a --dir with spaces, --dir \"my runs\"")


@pytest.mark.parametrize(("root", "store"), [
    ("memory://", "memory://exp"),  # (it was memory:/exp, a local folder "memory:")
    ("file:///srv/runs", "file:///srv/runs/exp"),
    ("s3://bucket/runs/", "s3://bucket/runs/exp"),
    ("s3://bucket/runs", "s3://bucket/runs/exp"),
])
def test_a_root_dir_url_keeps_its_scheme(
        root: str, store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JPY_SESSION_NAME", "/work/exp.ipynb")
    assert ckpt_nb._session.default_directory({}, root) == store


def test_a_memory_root_dir_makes_no_local_folder(
        shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "exp.ipynb"))
    magics = shell.magics_manager.registry["CkptMagics"]
    shell.run_cell(SMALL, store_history=False)
    try:
        assert shell.run_cell("%config CkptMagics.root_dir = 'memory://'").success
        assert shell.run_cell(f"%%ckpt_auto\n{STEP}", store_history=False).success
        assert list(tmp_path.iterdir()) == []
    finally:
        shell.config.pop("CkptMagics", None)
        magics.root_dir = "checkpoints"


def test_a_new_kernel_opens_the_default_store_the_last_one_wrote(
        shell, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a crash, a new kernel's %ckpt_list, %ckpt_rollback, %ckpt_ui and %ckpt_status
    said "no store to list: ... run %ckpt_auto first" of the store the cells wrote."""
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "exp.ipynb"))
    magics = shell.magics_manager.registry["CkptMagics"]
    store = Path("runs") / "exp"  # (as root_dir names it: from the working directory)
    shell.run_cell(SMALL, store_history=False)
    try:
        assert shell.run_cell("%config CkptMagics.root_dir = 'runs'").success
        assert usage_error(shell, "%ckpt_list") == (
            "%ckpt_list: no store to list (no %ckpt_auto or %%ckpt_auto cell has run in this "
            f"kernel, and there is no checkpoint store at {store}, the default one): "
            "%ckpt_list DIR")
        assert shell.run_cell(f"%%ckpt_auto\n{STEP}", store_history=False).success
        saved = shell.user_ns["model"].weight.detach().clone()
        shell.run_cell("import torch\nwith torch.no_grad(): model.weight.zero_()")
        monkeypatch.setattr(ckpt_nb._session, "_last", None)  # (a new kernel)
        monkeypatch.setattr(ckpt_nb._session, "_positions", {})
        capsys.readouterr()
        table = shell.run_cell("%ckpt_list", store_history=False).result
        assert len(table) == 1
        said = f"ckpt_nb: no session in this kernel: %ckpt_list opens the default store, {store}\n"
        assert capsys.readouterr().out.startswith(said)
        assert shell.run_cell("%ckpt_rollback latest", store_history=False).success
        assert capsys.readouterr().out.startswith(said.replace("ckpt_list", "ckpt_rollback"))
        assert bool((shell.user_ns["model"].weight == saved).all())
        assert shell.run_cell("%ckpt_ui", store_history=False).result is not None
        assert capsys.readouterr().out.startswith(said.replace("ckpt_list", "ckpt_ui"))
        assert shell.run_cell("%ckpt_status", store_history=False).success
        assert f"; the default store, {store}, is what %ckpt_list" in capsys.readouterr().out
    finally:
        shell.config.pop("CkptMagics", None)
        magics.root_dir = "checkpoints"


def test_a_cap_set_while_the_line_form_runs_takes_the_variable(
        shell, tmp_path: Path, capsys) -> None:
    """The skip message's %config CkptMagics.max_variable_mb = N did nothing to the line
    form running until %ckpt_auto was run again: it took the cap as it started."""
    magics = shell.magics_manager.registry["CkptMagics"]
    shell.run_cell(SMALL + "import numpy as np\nbig = np.zeros((2 << 20) // 8 + 1)")
    try:
        assert shell.run_cell("%config CkptMagics.max_variable_mb = 1").success
        assert shell.run_cell(f"%ckpt_auto --dir {tmp_path / 'line'}").success
        said = capsys.readouterr().out
        assert "%config CkptMagics.max_variable_mb = 3 takes it" in said
        assert shell.run_cell("%config CkptMagics.max_variable_mb = 3").success
        assert shell.run_cell(STEP).success
        assert "big" in ckpt_nb.status()["variables"]
    finally:
        shell.run_cell("%ckpt_auto --off")
        shell.config.pop("CkptMagics", None)
        magics.max_variable_mb = 100


def test_auto_says_the_cap_in_its_own_keyword(tmp_path: Path, capsys) -> None:
    """auto() was told %config CkptMagics.max_variable_mb = 3, which it cannot paste, and
    a cap under 1 MiB was "the 0 MiB cap"."""
    import numpy as np
    import torch

    model = torch.nn.Linear(4, 2)
    big = np.zeros(int(2.4 * 2**20) // 8)
    for cap, said in ((2 << 20, "big (2.4 MiB, over the 2 MiB cap: max_variable_bytes=3 << 20 "
                                "takes it)"),
                      (3, "big (2.4 MiB, over the 3 bytes cap: max_variable_bytes=3 << 20 "
                          "takes it)"),
                      (1536, "big (2.4 MiB, over the 1.5 KiB cap: max_variable_bytes=3 << 20 "
                             "takes it)")):
        with ckpt_nb.auto(str(tmp_path / "runs"), namespace={"model": model, "big": big},
                          max_variable_bytes=cap):
            pass
        assert said in capsys.readouterr().out
    with pytest.raises(TypeError, match="unexpected keyword argument 'magic'"):
        with ckpt_nb.auto(str(tmp_path / "runs"), namespace={}, magic=True):
            pass


def test_a_variable_just_over_the_cap_is_said_to_be(shell, tmp_path: Path, capsys) -> None:
    """100 MiB and 8 bytes was "100.0 MiB, over the 100 MiB cap"."""
    shell.run_cell(SMALL + "import numpy as np\nbig = np.zeros((100 << 20) // 8 + 1)")
    assert shell.run_cell(f"%%ckpt_auto --dir {tmp_path}\n{STEP}").success
    assert ("big (100.0 MiB, just over the 100 MiB cap: %config CkptMagics.max_variable_mb = "
            "101 takes it)") in capsys.readouterr().out


def test_a_variable_over_a_gib_is_said_as_the_explorer_says_sizes() -> None:
    """The cap's message had a byte formatter of its own, which stopped at MiB: "1,024.0
    MiB, just over the 1,024 MiB cap", where the CLI and the explorer say GiB."""
    from ckpt_nb._discovery import _over_the_cap

    assert _over_the_cap((1 << 30) + 8, 1 << 30, magic=True) == (
        "1.0 GiB, just over the 1 GiB cap: %config CkptMagics.max_variable_mb = 1025 takes it")


class Opaque:
    """An object a checkpoint holds only as a pickle. A module's class, as a kernel's
    are (the test shell's namespace has no __name__: a class made in it had no module,
    and each pickle of it searched every loaded module, ~10 ms, for it)."""


def test_no_cap_is_offered_for_a_frame_no_cap_takes(shell, tmp_path: Path, capsys) -> None:
    """A frame over the cap was offered the cap that takes it though a column of it
    would not come back as saved, which a bigger cap then said."""
    magics = shell.magics_manager.registry["CkptMagics"]
    shell.user_ns["C"] = Opaque
    shell.run_cell(SMALL + "import pandas as pd\n"
                   "df = pd.DataFrame({'a': range(100_000), 'o': [C()] * 100_000})")
    try:
        assert shell.run_cell("%config CkptMagics.max_variable_mb = 1").success
        assert shell.run_cell(f"%%ckpt_auto --dir {tmp_path}\n{STEP}").success
        said = capsys.readouterr().out
        assert "skipped df (its column 'o' (object) would not come back as saved" in said
        assert "takes it" not in said
    finally:
        shell.config.pop("CkptMagics", None)
        magics.max_variable_mb = 100



def test_a_blank_default_dir_names_root_dir_as_the_default(shell) -> None:
    """It said the default is ./checkpoints/<notebook name>, which root_dir changes."""
    magics = shell.magics_manager.registry["CkptMagics"]
    with pytest.raises(TraitError) as refused:
        magics.default_dir = "  "
    assert str(refused.value).endswith(
        "the default (<CkptMagics.root_dir>/<notebook name>: ./checkpoints/<notebook name> "
        "unless root_dir is set)")


def test_a_cap_in_the_config_loads(shell, tmp_path: Path, capsys) -> None:
    """A max_variable_mb of ipython_config.py (set before the magics are made) failed
    %load_ext ckpt_nb: its observer looked for a line form not made yet."""
    shell.run_cell("%unload_ext ckpt_nb")
    shell.config.CkptMagics.max_variable_mb = 1
    try:
        assert shell.run_cell("%load_ext ckpt_nb").success
        assert shell.magics_manager.registry["CkptMagics"].max_variable_mb == 1
        shell.run_cell(SMALL + "import numpy as np\nbig = np.zeros((2 << 20) // 8 + 1)")
        assert shell.run_cell(f"%%ckpt_auto --dir {tmp_path}\n{STEP}").success
        assert "over the 1 MiB cap" in capsys.readouterr().out
    finally:
        shell.config.pop("CkptMagics", None)
        shell.magics_manager.registry["CkptMagics"].max_variable_mb = 100


@pytest.mark.parametrize("magic", ["ckpt_list", "ckpt_ui"])
def test_an_option_the_store_magics_do_not_take_is_refused_not_taken_for_a_store(
        shell, tmp_path: Path, magic: str) -> None:
    """%ckpt_list --frob said "no checkpoint store at --frob"; a store whose name begins
    with '-' is quoted."""
    message = usage_error(shell, f"%{magic} --frob")
    assert message == f"%{magic}: unknown option --frob: it takes DIR or --dir DIR (a " \
        "directory whose name begins with '-' is quoted: '--frob')" + ELSEWHERE[magic]
    with ckpt_nb.CheckpointManager(tmp_path / "-runs") as mgr:
        mgr.save(torch.nn.Linear(2, 2))
    assert len(shell.run_cell("%ckpt_list '-runs'", store_history=False).result) == 1


ELSEWHERE = {  # (where the options a store magic does not take are)
    "ckpt_list": "; in a cell, !ckpt-nb ls DIR takes ls's options (--branch, --all-metrics, "
                 "--metric ...)",
    "ckpt_ui": "; ckpt_nb.explore(DIR, poll_seconds=S) takes the explorer's options",
}


@pytest.mark.parametrize(("magic", "line", "option"), [
    ("ckpt_list", "runs --all-metrics", "--all-metrics"),
    ("ckpt_list", "runs --branch main", "--branch"),
    ("ckpt_list", "--dir runs --all-metrics", "--all-metrics"),
    ("ckpt_ui", "runs --poll-seconds 0", "--poll-seconds"),
])
def test_an_option_after_the_store_is_refused_by_name_not_taken_into_the_store(
        shell, tmp_path: Path, magic: str, line: str, option: str) -> None:
    """%ckpt_list store --all-metrics said "no checkpoint store at store --all-metrics", on
    a store that is there; a store with ' -' in its name is quoted."""
    with ckpt_nb.CheckpointManager(tmp_path / "runs") as mgr:
        mgr.save(torch.nn.Linear(2, 2))
    text = line.removeprefix("--dir ")
    assert usage_error(shell, f"%{magic} {line}") == (
        f"%{magic}: unknown option {option}: it takes DIR or --dir DIR and no option (a "
        f"directory with ' -' in its name is quoted: '{text}')" + ELSEWHERE[magic])
    with ckpt_nb.CheckpointManager(tmp_path / "my -runs") as mgr:
        mgr.save(torch.nn.Linear(2, 2))
    assert len(shell.run_cell("%ckpt_list 'my -runs'", store_history=False).result) == 1
