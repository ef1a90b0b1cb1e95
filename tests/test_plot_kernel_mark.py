"""``plot_dag`` marks the kernel as the explorer's live DAG does: ``kernel ⇢`` on the
nearest kept ancestor of a checkpoint the kernel's state came from, deleted since."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import matplotlib
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from matplotlib.figure import Figure
from matplotlib.text import Annotation

import ckpt_nb
from ckpt_nb import _session
from ckpt_nb._plots import dag_layout

matplotlib.use("Agg")


@pytest.fixture
def kernel(shell: InteractiveShell, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A kernel that trained a model under ``%%ckpt_auto``, three saves, into a store."""
    monkeypatch.setattr(_session, "_positions", {})
    monkeypatch.setattr(_session, "_position_events", {})
    monkeypatch.setattr(_session, "_left_values", {})
    monkeypatch.setattr(_session, "_last", None)
    shell.run_cell("import torch, ckpt_nb\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 2)\n"
                   "opt = torch.optim.SGD(model.parameters(), 0.1)")
    assert shell.run_cell(f"%%ckpt_auto --dir {tmp_path / 'k'} --every-steps 1\n"
                          "for _ in ckpt_nb.epochs(3):\n"
                          "    opt.zero_grad(); model(torch.ones(1, 4)).sum().backward(); "
                          "opt.step()").success
    yield tmp_path / "k"


def kernel_marks(fig: Figure) -> dict[str, tuple[float, float]]:
    """The figure's kernel marks: each one's text and the point it marks."""
    return {t.get_text(): tuple(t.xy) for t in fig.axes[0].texts
            if isinstance(t, Annotation) and t.get_text().startswith("kernel")}


def test_the_dag_marks_the_kernel_at_the_heir_of_its_deleted_checkpoint(kernel: Path) -> None:
    """The figure drew no mark at all once the kernel's checkpoint was deleted."""
    with ckpt_nb.CheckpointManager(kernel) as mgr:
        *_, heir, current = mgr.list()["id"]
        assert _session.kernel_position(mgr) == current
        assert kernel_marks(ckpt_nb.plot_dag(mgr)) == {"kernel": (0, 2)}  # lane 0, row 2
        mgr.delete(current)
        table = mgr.list()
        row = next(n.row for n in dag_layout(table) if n.id == heir)
        by_default = ckpt_nb.plot_dag(kernel)  # (this process's kernel, from a path)
        # the explorer's call: its manager and table, the kernel's position passed
        as_explorer = ckpt_nb.plot_dag(mgr, current=current, table=table)
    for fig in (by_default, as_explorer):
        assert kernel_marks(fig) == {"kernel ⇢": (0, row)}
        assert fig.axes[0].get_xlabel() == (
            f"kernel ⇢: the kernel's state came from {current},\ndeleted since; "
            f"{heir} is its nearest\nkept ancestor")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # ("Glyph 8674 missing from font")
            assert fig._repr_png_().startswith(b"\x89PNG")


def test_the_dag_says_when_no_ancestor_of_the_kernels_checkpoint_is_kept(
        kernel: Path) -> None:
    with ckpt_nb.CheckpointManager(kernel) as mgr:
        ids = list(mgr.list()["id"])
        for cid in reversed(ids):
            mgr.delete(cid)
        other = mgr.save(torch.nn.Linear(1, 1), rng=False)  # (no kin of the kernel's)
    fig = ckpt_nb.plot_dag(kernel)
    assert kernel_marks(fig) == {}
    assert fig.axes[0].get_xlabel() == (
        f"kernel ⇢: the kernel's state came from {ids[-1]},\ndeleted since; no ancestor\n"
        "of it is kept")
    assert any(t.get_text().startswith(other) for t in fig.axes[0].texts)
