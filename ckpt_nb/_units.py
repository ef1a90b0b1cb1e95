"""Sizes and names as people read them, the same in the CLI and the explorer: a
checkpoint's size reads alike wherever it is shown, and metrics come in one order."""

from __future__ import annotations

import re


def human_size(n: int) -> str:
    """Bytes in binary units (KiB, MiB, ...), one decimal."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while power < len(units) - 1 and n >= 1024 ** (power + 1):
        power += 1
    return f"{n} B" if power == 0 else f"{n / 1024 ** power:.1f} {units[power]}"


def natural_order(name: str) -> tuple[list[int | str], str]:
    """Sort key putting loss_2 before loss_10. Names equal but for leading zeros (loss_2,
    loss_02) follow the name itself, not a set's order (which changes with PYTHONHASHSEED).
    Numbers are runs of decimal digits, of any script ('٣'), all of which int() reads;
    not '²', a digit to isdigit() that int() refuses."""
    parts = re.split(r"(\d+)", name)
    return [int(part) if part.isdecimal() else part for part in parts], name
