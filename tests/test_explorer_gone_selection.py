"""A selected checkpoint deleted by something else (another explorer, retention, a
manager): the buttons name it. Real stores, real training on digits."""

from __future__ import annotations

from pathlib import Path

import ckpt_nb

from conftest import DigitsRun
from test_explorer_nothing_drawn import saved


def test_a_button_names_the_selected_checkpoint_deleted_elsewhere(
        tmp_path: Path, digits: DigitsRun) -> None:
    """A checkpoint selected in one explorer, deleted in another (or by retention): the
    row went, and Roll back, Pin or Delete then said "select one checkpoint first", as if
    nothing had been clicked."""
    ids = saved(tmp_path / "s", digits, 3)
    ui = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    other = ckpt_nb.explore(tmp_path / "s", namespace={}, poll_seconds=0)
    try:
        ui.select(ids[1])
        other.delete(ids[1])
        assert ui.refresh() and ui.selected == []
        for button in (ui.rollback_button, ui.pin_button, ui.delete_button):
            button.click()
            assert f"{ids[1]}, selected, was deleted" in ui.status.value, ui.status.value
            assert "select another checkpoint" in ui.status.value
        ui.select(ids[0])  # (a new selection: acted on)
        ui.pin_button.click()
        assert f"pinned {ids[0]}" in ui.status.value
        ui.select([])
        ui.pin_button.click()
        assert "select one checkpoint first" in ui.status.value, ui.status.value
    finally:
        ui.close()
        other.close()
