"""The explorer's plots at their own size: a box's flex stretched each PNG to the output's
width (a 672 px plot blurred to 2220 px in a 2400 px window, pushing what is below it out
of sight); and selected checkpoints that logged no metrics compared as a note, not a
blank figure. Real stores, real training on digits."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib.image

import ckpt_nb

from conftest import DigitsRun
from test_explorer_nothing_drawn import saved


def pixel_width(png: bytes) -> int:
    return matplotlib.image.imread(io.BytesIO(png), format="png").shape[1]


def test_each_plot_is_shown_at_most_as_wide_as_its_pixels(
        tmp_path: Path, digits: DigitsRun) -> None:
    ids = saved(tmp_path / "s", digits, 3)
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.select(ids[:2])
        ui.tabs.selected_index = 1
        ui.tabs.selected_index = 3
        for image in (ui.metrics_plot, ui.compare_plot, ui.diff_plot):
            assert image.value and image.layout.display is None
            assert image.layout.max_width == f"{pixel_width(image.value)}px"
        assert ui.metrics_plot.layout.max_width == "672px"  # (7 in at 96 dpi)
    finally:
        ui.close()
