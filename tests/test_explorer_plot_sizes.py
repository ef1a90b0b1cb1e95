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


def test_checkpoints_that_logged_no_metrics_are_compared_as_a_note(
        tmp_path: Path, digits: DigitsRun) -> None:
    """Two step saves between epochs' ends (no metrics) side by side showed a blank 7 x 3.4
    inch figure with one line of text in its middle."""
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        bare = []
        for step in (1, 2):
            digits.train_step()
            bare.append(mgr.save(digits.model, digits.optimizer, step=step))
        logged = mgr.save(digits.model, digits.optimizer, step=3,
                          metrics={"loss": digits.train_step()})
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.tabs.selected_index = 1
        ui.select(bare)
        assert ui.compare_box.layout.display == "flex"
        assert ui.compare_plot.layout.display == "none" and not ui.compare_plot.value
        assert ui.compare_note.layout.display is None
        assert "logged no metrics" in ui.compare_note.value
        ui.select([bare[0], logged])  # (one logged some: drawn)
        assert ui.compare_plot.value and ui.compare_plot.layout.display is None
        assert ui.compare_note.layout.display == "none"
        ui.select(bare)  # (the last drawn plot goes again)
        assert ui.compare_plot.layout.display == "none"
        assert ui.compare_note.layout.display is None and "⚠" not in ui.status.value
    finally:
        ui.close()
