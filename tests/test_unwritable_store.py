"""A store that cannot be made for want of permission (a notebook in a read-only folder,
whose default store is there; a --dir there): the error says so and what to do, where
it was errno's words alone ("Operation not permitted")."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import ckpt_nb
from IPython.core.error import UsageError

pytestmark = pytest.mark.usefixtures("fresh_process_state")  # (each test a new kernel)


def unwritable(tmp_path: Path) -> Path:
    """A folder in which no folder can be made: a read-only one of the test's, or (as
    root, whom no mode stops) one in sysfs."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    for where in (folder, Path("/sys")):
        try:
            (where / "probe").mkdir()
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                return where
        else:
            (where / "probe").rmdir()
    pytest.skip("no folder here refuses a new folder to this process")


def test_a_default_store_that_cannot_be_made_says_to_give_dir_or_root_dir(
        shell, tmp_path: Path) -> None:
    where = unwritable(tmp_path)
    try:
        shell.run_cell(f'%config CkptMagics.root_dir = "{where / "checkpoints"}"')
        result = shell.run_cell("%%ckpt_auto --every-steps 2\nran = True")
        assert isinstance(result.error_in_exec, UsageError)
        said = str(result.error_in_exec)
        assert said.startswith("%ckpt_auto: cannot create store directory "
                               f"{where / 'checkpoints' / 'session'}: ")
        assert said.endswith("(a folder this kernel cannot write), the default store: give "
                             "--dir DIR in a folder it can write, or %config "
                             'CkptMagics.root_dir = "DIR" (the folder of the default stores)')
        assert "ran" not in shell.user_ns
        result = shell.run_cell(f"%ckpt_auto --dir {where / 'runs'}")
        assert str(result.error_in_exec).endswith(
            "(a folder this kernel cannot write): give a directory it can write")
        assert ckpt_nb.status() == {"active": False}
    finally:
        shell.run_cell('%config CkptMagics.root_dir = "checkpoints"')
        (tmp_path / "read-only").chmod(0o700)


def test_auto_in_a_script_says_the_folder_cannot_be_written(tmp_path: Path) -> None:
    where = unwritable(tmp_path)
    try:
        with pytest.raises(ckpt_nb.StoreError, match=r"cannot create store directory .*"
                           r"\(a folder this process cannot write\): give a directory it "
                           r"can write$"):
            with ckpt_nb.auto(os.fspath(where / "runs"), namespace={}):
                pass
    finally:
        (tmp_path / "read-only").chmod(0o700)
