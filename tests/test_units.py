"""Sizes as the CLI, the explorer and the gc reports show them."""

from __future__ import annotations

import pytest

from ckpt_nb._units import human_size


@pytest.mark.parametrize(("size", "shown"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1075, "1.0 KiB"), (1076, "1.1 KiB"),
    (1048524, "1023.9 KiB"), (1048525, "1.0 MiB"), (1048575, "1.0 MiB"),
    (1048576, "1.0 MiB"), (1073741000, "1.0 GiB"), (1099511627775, "1.0 TiB"),
    (2000 * 1024 ** 4, "2000.0 TiB")])
def test_a_size_takes_the_unit_it_shows_in(size: int, shown: str) -> None:
    """The unit was chosen before the rounding: 1,048,575 bytes showed as "1024.0 KiB"."""
    assert human_size(size) == shown
