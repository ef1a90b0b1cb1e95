"""Where the explorer has nothing to draw, it shows no image (an empty one is a broken-image
icon in the browser) and says why. Real stores, real training on digits."""

from __future__ import annotations

import shutil
from pathlib import Path

import ckpt_nb

from conftest import DigitsRun


def saved(path: Path, digits: DigitsRun, count: int) -> list[str]:
    with ckpt_nb.CheckpointManager(path, metric="loss") as mgr:
        return [mgr.save(digits.model, digits.optimizer, epoch,
                         metrics={"loss": sum(digits.train_step() for _ in range(2)) / 2})
                for epoch in range(count)]


def test_a_tab_first_opened_on_a_store_that_cannot_be_read_shows_no_image(
        tmp_path: Path, digits: DigitsRun) -> None:
    """The store removed before Metrics or Diff was ever drawn: the status line said so,
    and under it the tab showed a broken-image icon."""
    ids = saved(tmp_path / "s", digits, 3)
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.select(ids[1])
        shutil.rmtree(tmp_path / "s")
        for tab, image in ((1, ui.metrics_plot), (3, ui.diff_plot)):
            ui.tabs.selected_index = tab
            assert "no longer exists" in ui.status.value
            assert image.value == b"" and image.layout.display == "none", tab
        saved(tmp_path / "s", digits, 2)  # (a store there again: drawn and shown)
        assert ui.refresh()
        ui.select(["-1", "latest"])
        for tab, image in ((1, ui.metrics_plot), (1, ui.compare_plot), (3, ui.diff_plot)):
            ui.tabs.selected_index = tab
            assert image.value and image.layout.display is None, tab
    finally:
        ui.close()


def test_a_diff_of_a_checkpoint_with_itself_says_so(tmp_path: Path, digits: DigitsRun) -> None:
    """From and to the same: a plot of every tensor "identical", "+0" for each metric, and
    no word on why."""
    ids = saved(tmp_path / "s", digits, 2)
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.tabs.selected_index = 3
        ui.diff_a.value = ids[0]
        ui.diff_b.value = ids[0]
        same = f"from and to are the same checkpoint, {ids[0]}: nothing differs; choose " \
            "another from or to"
        assert same in ui.status.value and "⚠" not in ui.status.value
        assert ui.diff_table.value == f"<i>{same}</i>"
        assert ui.diff_plot.layout.display == "none"
        ui.diff_b.value = ids[1]  # (another: drawn)
        assert ui.diff_plot.layout.display is None and ui.diff_plot.value
        assert "byte-identical" in ui.diff_table.value
    finally:
        ui.close()


def test_the_same_checkpoint_said_goes_once_another_pair_is_drawn(
        tmp_path: Path, digits: DigitsRun) -> None:
    """'from and to are the same checkpoint' stayed in the status line after another pair
    was chosen and drawn, and a refresh said it again over an action's message."""
    ids = saved(tmp_path / "s", digits, 3)
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.tabs.selected_index = 3
        ui.diff_a.value = ids[0]
        ui.diff_b.value = ids[0]
        assert "the same checkpoint" in ui.status.value
        ui.diff_b.value = ids[2]  # (another: drawn, and the status line no longer says so)
        assert "byte-identical" in ui.diff_table.value
        assert "the same checkpoint" not in ui.status.value, ui.status.value
        ui.diff_b.value = ids[0]
        assert "the same checkpoint" in ui.status.value
        ui._say(f"pinned {ids[1]}: retention will keep it")  # (as Pin says, then a refresh)
        assert ui.refresh()
        assert f"pinned {ids[1]}" in ui.status.value, ui.status.value
        assert "the same checkpoint" in ui.diff_table.value  # (the tab still says it)
    finally:
        ui.close()


def test_a_long_metric_name_with_nothing_to_draw_fits_in_the_figure(
        tmp_path: Path, digits: DigitsRun) -> None:
    """A metric logged only as NaN, with a long name: "no data: no checkpoint logged NAME
    as a finite number" was one centred line wider than the figure, cut off at both edges
    (the explorer's Metrics tab showed "lata: no checkpoint logged grad_norm_…_num")."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    name = "grad_norm_after_clipping_of_the_whole_network_parameters"
    with ckpt_nb.CheckpointManager(tmp_path / "s") as mgr:
        for epoch in range(2):
            mgr.save(digits.model, digits.optimizer, epoch,
                     metrics={name: float("nan"), "loss": digits.train_step()})
    fig = ckpt_nb.plot_metrics(tmp_path / "s", name)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    [text] = fig.axes[0].texts
    assert " ".join(text.get_text().replace("_\n", "_").split()) == \
        f"no data: no checkpoint logged {name} as a finite number"
    box = text.get_window_extent(canvas.get_renderer())
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, (box, fig.bbox)


def test_a_tab_not_drawn_yet_shows_no_image(tmp_path: Path, digits: DigitsRun) -> None:
    """The tabs are drawn in the kernel when opened; while the kernel runs a cell (a
    %%ckpt_auto cell below the explorer, its saves showing live in the table) a click on
    Metrics or Diff waits for the cell's end, and meanwhile the tab showed its images
    undrawn: a broken-image icon."""
    ids = saved(tmp_path / "s", digits, 3)
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        images = (ui.metrics_plot, ui.compare_plot, ui.diff_plot)
        assert [i.layout.display for i in images] == ["none"] * 3
        ui.select(ids[1:])
        assert [i.layout.display for i in images] == ["none"] * 3  # (no tab drawn yet)
        ui.tabs.selected_index = 1
        assert ui.metrics_plot.value and ui.metrics_plot.layout.display is None
        assert ui.compare_plot.value and ui.compare_plot.layout.display is None
        ui.tabs.selected_index = 3
        assert ui.diff_plot.value and ui.diff_plot.layout.display is None
    finally:
        ui.close()

