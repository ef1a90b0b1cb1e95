"""The command line's help and refusals say alike what each command needs."""

from __future__ import annotations


import pytest

from ckpt_nb.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_help_shows_the_ranking_options_that_may_come_before_the_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    """README: --metric and --mode may come before the command (``ckpt-nb --metric
    val_loss ls DIR`` works); ``ckpt-nb --help`` named neither but in its epilog."""
    code, out, _ = run(capsys, "--help")
    usage = " ".join(out.split("\n\n")[0].split())
    assert code == 0 and "[--metric METRIC] [--mode {min,max}] COMMAND" in usage
    text = " ".join(out.split())
    assert "--metric METRIC the metric that ranks checkpoints" in text
    assert "--mode {min,max} whether a lower or higher --metric is better" in text
    assert "every command but gc takes them" in text
