"""Metric names come in one order wherever they are shown: natural (loss_2 before
loss_10), the same from run to run, and for any name a metric may have."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ckpt_nb
from ckpt_nb import CheckpointManager, CheckpointNotFoundError, MetricNotFoundError
from ckpt_nb._errors import metrics_logged
from ckpt_nb._units import natural_order
from ckpt_nb.cli import main

NATURAL = ["acc", "loss_2", "loss_10"]


def saved(directory: Path, metrics: dict[str, float]) -> str:
    with CheckpointManager(directory) as mgr:
        return mgr.save(torch.nn.Linear(2, 2), rng=False, metrics=metrics)


def test_list_plots_and_the_explorer_order_metrics_as_resolve_and_the_cli_do(
        tmp_path: Path) -> None:
    """resolve() and the CLI said acc, loss_2, loss_10; list()'s columns (so the explorer's
    table and dropdown) and plot_metrics/plot_compare's refusals said loss_10 first."""
    saved(tmp_path, {"loss_10": 1.0, "loss_2": 2.0, "acc": 0.5})
    with CheckpointManager(tmp_path) as mgr:
        assert list(mgr.list().columns)[-3:] == NATURAL
        table = mgr.list()
    said = "its metrics are 'acc', 'loss_2', 'loss_10'"
    with pytest.raises(MetricNotFoundError, match=said):
        ckpt_nb.plot_metrics(tmp_path, "nope")
    with pytest.raises(MetricNotFoundError, match=said):
        ckpt_nb.plot_compare(tmp_path, ["latest", "latest"], ["nope"])
    # a table given in another order (the caller's own) is refused in the same words
    with pytest.raises(MetricNotFoundError, match=said):
        ckpt_nb.plot_metrics(tmp_path, "nope", table=table[[*table.columns[:-3],
                                                             "loss_10", "loss_2", "acc"]])
    ui = ckpt_nb.explore(tmp_path, poll_seconds=0)
    try:
        assert [name for _, name in ui.metric.options] == NATURAL
        assert ui.table.columns[-4:-1] == NATURAL  # (then the note)
    finally:
        ui.close()


def test_names_equal_but_for_leading_zeros_keep_one_order() -> None:
    """loss_2 and loss_02 tie on their numbers: they came in the order of the set they
    were taken from, which changes with PYTHONHASHSEED."""
    names = ["loss_2", "loss_02", "acc_1", "acc_01"]
    assert sorted(names, key=natural_order) == sorted(reversed(names), key=natural_order) \
        == ["acc_01", "acc_1", "loss_02", "loss_2"]
    code = ("from ckpt_nb._errors import metrics_logged; "
            f"print(metrics_logged({names!r}))")
    said = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": str(seed)}
                           ).stdout for seed in range(8)}
    assert said == {"the metrics logged are: acc_01, acc_1, loss_02, loss_2\n"}
    assert metrics_logged(names) == said.pop().rstrip("\n")


def test_numbers_are_decimal_digits_of_any_script_and_not_superscripts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """'²' is a digit to isdigit() and not to int(): a store logging r² failed resolve()
    of an unknown metric, ckpt-nb show and ckpt-nb ls with a ValueError."""
    assert sorted(["x_10", "x_٣", "x_2"], key=natural_order) == ["x_2", "x_٣", "x_10"]
    cid = saved(tmp_path, {"r²": 0.9, "²": 1.0, "x2²": 3.0})
    with CheckpointManager(tmp_path, metric="nope", mode="min") as mgr:
        with pytest.raises(CheckpointNotFoundError) as refused:
            mgr.resolve("best")
    assert str(refused.value).endswith("the metrics logged are: r², x2², ²")
    assert main(["show", str(tmp_path), "latest"]) == 0
    assert "metrics:   r²=0.9, x2²=3, ²=1\n" in capsys.readouterr().out
    assert main(["ls", str(tmp_path)]) == 0
    assert cid in capsys.readouterr().out
