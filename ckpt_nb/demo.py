"""The README's demo: train on scikit-learn's digits, checkpoint, list, restore.

Run it with ``python -m ckpt_nb.demo [DIR]``; it needs scikit-learn.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from ._errors import CkptError, MissingDependencyError
from .cli import _run_as_command

DEMO_MARK = "ckpt_nb-demo.txt"  # (the demo deletes a folder only where it finds this)
PROG = "python -m ckpt_nb.demo"


def main(argv: list[str] | None = None) -> int:
    """Run the demo (``argv``: ``sys.argv[1:]`` by default); return the exit code. As
    ``ckpt-nb`` does, a reader that leaves (``| head -1``), a Ctrl-C and a missing
    scikit-learn end it with a line, not a traceback."""
    return _run_as_command(PROG, lambda: _demo_said(argv), as_program=argv is None)


def _demo_said(argv: list[str] | None) -> int:
    """``_demo``, its errors (a missing scikit-learn, a store's) said in one line."""
    try:
        return _demo(argv)
    except CkptError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1


def _demo(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None,  # (None: -OO)
        epilog="DIR starts afresh: it must be new, empty, or an earlier run of the demo.")
    parser.add_argument("directory", nargs="?", default="runs/demo", metavar="DIR",
                        help="where the demo's store goes (default: runs/demo)")
    args = parser.parse_args(argv)
    # (here, not as the module loads: a Ctrl-C while torch loads, seconds, is one line)
    import torch

    from ._manager import CheckpointManager
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise MissingDependencyError(
            f"the demo trains on scikit-learn's digits, and scikit-learn could not be "
            f"imported ({exc}): pip install scikit-learn") from exc

    directory = Path(args.directory)
    if directory.exists() and not (directory / DEMO_MARK).is_file():
        if not directory.is_dir() or any(directory.iterdir()):
            parser.error(f"{directory} is there and is not a store of this demo's: give a "
                         "new or empty folder (the demo starts its store afresh)")
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    (directory / DEMO_MARK).write_text("A store of `python -m ckpt_nb.demo`, which deletes "
                                       "it to start again.\n")
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    train, val = slice(0, 1500), slice(1500, None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=8)
    mgr = CheckpointManager(directory, max_to_keep=3, keep_best=1, metric="val_loss",
                            strategy="incremental", full_every=4)

    def evaluate() -> tuple[float, float]:
        with torch.no_grad():
            logits = model(x[val])
            loss = torch.nn.functional.cross_entropy(logits, y[val])
            return float(loss), float((logits.argmax(1) == y[val]).float().mean())

    for epoch in range(8):
        perm = torch.randperm(1500)
        for batch_idx in range(0, 1500, 100):
            idx = perm[batch_idx : batch_idx + 100]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[train][idx]), y[train][idx]).backward()
            optimizer.step()
        scheduler.step()
        val_loss, val_acc = evaluate()
        cid = mgr.save(model, optimizer, epoch, scheduler=scheduler, step=(epoch + 1) * 15,
                       metrics={"val_loss": val_loss, "val_acc": val_acc})
        print(f"epoch {epoch}: val_loss {val_loss:.4f}  val_acc {val_acc:.3f}  -> {cid}")

    print(f"\nThe store at {directory} (newest 3 and the best by val_loss are kept):")
    columns = ["id", "parent", "branch", "epoch", "step", "strategy", "stored_bytes",
               "logical_bytes", "best", "val_loss", "val_acc"]
    print(mgr.list()[columns].to_string(index=False))
    best = mgr.restore("best", model=model, optimizer=optimizer, scheduler=scheduler)
    val_loss, val_acc = evaluate()
    print(f"\nrestored the best checkpoint {best.id} (epoch {best.epoch}): "
          f"val_loss {val_loss:.4f}, as saved {best.metrics['val_loss']:.4f}")
    report = mgr.verify()
    print(f"verify: {len(report.checked)} checkpoints, "
          f"{'all good' if report.ok else f'bad: {list(report.bad)}'}")
    store = shlex.quote(str(directory))
    cli = cli_command()
    print(f"\nTry: {cli} ls {store}    {cli} diff {store} -1 latest")
    return 0


def cli_command() -> str:
    """How the user can run this interpreter's ``ckpt-nb`` from a shell: plain where
    PATH finds that script (an active venv), else by its path (the README's setup leaves
    the venv inactive, where a plain ``ckpt-nb`` is not found, or is another install's)."""
    script = shutil.which("ckpt-nb", path=os.path.dirname(sys.executable))
    if script is None:  # (ckpt_nb not installed here, only on the path: run as a module)
        return f"{shlex.quote(shortest_path(sys.executable))} -m ckpt_nb"
    found = shutil.which("ckpt-nb")
    if found is not None and os.path.samefile(found, script):
        return "ckpt-nb"
    return shlex.quote(shortest_path(script))


def shortest_path(path: str) -> str:
    """``path`` relative to the working folder where that is shorter (.venv/bin/ckpt-nb)."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # (another drive, on Windows)
        return path
    return relative if len(relative) < len(path) else path


if __name__ == "__main__":
    raise SystemExit(main())
