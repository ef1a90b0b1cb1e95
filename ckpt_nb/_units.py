"""Sizes and names as people read and type them, the same in the CLI, the magics and the
explorer: a checkpoint's size reads alike wherever it is shown, metrics come in one order,
and a misspelt option is read one way."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def binary_unit(n: int) -> tuple[int, str]:
    """The largest binary unit (its bytes, its name) that ``n`` bytes, shown to one
    decimal, hold one of: chosen after the rounding, or 1,048,575 bytes showed as
    "1024.0 KiB"."""
    power = 0
    while power < len(BINARY_UNITS) - 1 and round(n / 1024 ** power, 1) >= 1024:
        power += 1
    return 1024 ** power, BINARY_UNITS[power]


def human_size(n: int) -> str:
    """Bytes in binary units (KiB, MiB, ...), one decimal."""
    unit, name = binary_unit(n)
    return f"{n} B" if unit == 1 else f"{n / unit:.1f} {name}"


def natural_order(name: str) -> tuple[list[int | str], str]:
    """Sort key putting loss_2 before loss_10. Names equal but for leading zeros (loss_2,
    loss_02) follow the name itself, not a set's order (which changes with PYTHONHASHSEED).
    Numbers are runs of decimal digits, of any script ('٣'), all of which int() reads;
    not '²', a digit to isdigit() that int() refuses."""
    parts = re.split(r"(\d+)", name)
    return [int(part) if part.isdecimal() else part for part in parts], name


def options_meant(name: str, known: Iterable[str]) -> list[str]:
    """The ``--`` options of ``known`` that a misspelt one (``--every-secs``, ``--keepbest``,
    ``--no_resume``, ``-every-steps``) was meant as: itself with one dash or ``_`` read as
    ``--`` / ``-``, else the two it is closest to; none for an unlike one (``--bogus``)."""
    options = [option for option in known if option.startswith("--")]
    spelt = "--" + name.lstrip("-").replace("_", "-")
    return [spelt] if spelt in options else \
        difflib.get_close_matches(spelt, options, n=2, cutoff=0.85)
