"""A command that waits for another process's lock says so in the CLI's words, on a line
of its own above its progress bar, in a terminal."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import torch

from ckpt_nb import CheckpointManager
from test_cli import module_env
import warm_python  # (fresh interpreters forked from a warm one)

# Holds STORE's lock until a line comes on stdin.
HOLDER = """
import sys
from ckpt_nb import CheckpointManager
with CheckpointManager(sys.argv[1]) as mgr, mgr._exclusive():
    print("held", flush=True)
    sys.stdin.readline()
"""


def read_until(fd: int, said: bytes, seconds: float) -> bytes:
    """What the terminal's other end ``fd`` shows, until ``said`` is in it (b"" for its
    end: the command exited) or ``seconds`` pass."""
    shown, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline and (not said or said not in shown):
        if not select.select([fd], [], [], 0.1)[0]:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # (EIO: the command exited, the terminal closed)
            break
        if not chunk:
            break
        shown += chunk
    return shown


def test_a_lock_wait_is_a_ckpt_nb_line_above_the_progress_bar(tmp_path: Path) -> None:
    """It was printed onto the gc bar's line ("gc: 0pack [00:00, ?pack/s]ckpt_nb:
    waiting for file:///..."), and said "ckpt_nb:" where the CLI's lines say "ckpt-nb:"."""
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(torch.nn.Linear(4, 2), step=0)
    env = module_env()
    holder = warm_python.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    terminal, side = os.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    cli = None
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        cli = warm_python.Popen([sys.executable, "-m", "ckpt_nb", "gc", str(tmp_path)],
                               stdin=side, stdout=side, stderr=side, env=env)
        os.close(side)
        shown = read_until(terminal, b"waiting for", 120)
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.wait(timeout=120) == 0
        shown += read_until(terminal, b"", 120)
        assert cli.wait(timeout=120) == 0, shown
    finally:
        for proc in (holder, cli):
            if proc is not None:
                proc.kill()
                proc.wait(timeout=60)
        os.close(terminal)
    text = shown.decode()
    lines = re.split(r"[\r\n]", text)
    waiting = f"ckpt-nb: waiting for {tmp_path}: process {holder.pid} is saving to it or " \
        "collecting it (lock file "
    assert any(line.startswith(waiting) for line in lines), text
    assert "ckpt_nb:" not in text and "gc: " in text  # (the bar was drawn)
