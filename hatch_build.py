"""Build hook: compile the codec's hot loops and the pack writer (ckpt_nb/_kernels.c).

The result is a plain shared library that ckpt_nb/_native.py loads with ctypes.
Without a working C compiler the build goes on without it, with a warning, and
ckpt_nb groups bytes with NumPy, decodes in Python and writes packs from Python
threads instead (the same bytes, slower).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "ckpt_nb/_kernels.c"
LIBRARY = "ckpt_nb/_kernels.so"


class BytegroupBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.name != "posix":
            return
        source, library = Path(self.root, SOURCE), Path(self.root, LIBRARY)
        partial = library.with_suffix(".so.partial")
        compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
        command = [*compiler, "-O3", "-shared", "-fPIC", "-pthread", "-o", str(partial),
                   str(source), "-lm"]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            self.app.display_warning(
                f"ckpt_nb: could not compile {SOURCE} ({detail.strip()}); "
                "the codec falls back to NumPy and Python, which are slower")
            partial.unlink(missing_ok=True)
            return
        os.replace(partial, library)
        build_data["artifacts"].append(LIBRARY)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
