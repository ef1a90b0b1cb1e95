"""ckpt_nb: crash-proof, explorable checkpoints for PyTorch training in notebooks.

The public API is what ``__all__`` names; modules with a leading underscore are
private and may change.
"""

from ._capture import RNGState, Stateful
from ._errors import (CaptureError, CheckpointInUseError, CheckpointNotFoundError, CkptError,
                      CorruptCheckpointError, FileFormatError, MetricNotFoundError,
                      StateMismatchError, StoreError, StoreFormatError, UntrustedPickleError)
from ._manager import Checkpoint, CheckpointManager, GCReport, PickledValue, VerifyReport
from ._session import AutoConfig, AutoSession, auto, batches, epochs, log, rollback, status
from ._store import FsspecStore, LocalStore, MemoryStore, Store, open_store

__version__ = "0.1.0"

_LAZY = {"explore": "_explorer", "Explorer": "_explorer", "plot_metrics": "_plots",
         "plot_dag": "_plots", "plot_diff": "_plots", "plot_compare": "_plots",
         "dag_layout": "_plots"}


def __getattr__(name: str):  # noqa: ANN202 - the explorer and plots load on first use
    """The explorer and the plots need the ``notebook`` extra; import them lazily."""
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(f".{_LAZY[name]}", __name__)
        except ImportError as exc:
            raise ImportError(f"ckpt_nb.{name} needs the notebook extra: "
                              f"pip install 'ckpt_nb[notebook]' ({exc})") from exc
        return getattr(module, name)
    raise AttributeError(f"module 'ckpt_nb' has no attribute {name!r}")

_registered = None  # the CkptMagics instance while the extension is loaded


def load_ipython_extension(ipython):  # noqa: ANN001, ANN201 - IPython's hook
    """``%load_ext ckpt_nb``: register the magics."""
    global _registered
    from ._magics import load

    if _registered is None:
        _registered = load(ipython)


def unload_ipython_extension(ipython):  # noqa: ANN001, ANN201 - IPython's hook
    """``%unload_ext ckpt_nb``: remove the magics, the sessions and every hook."""
    global _registered
    from ._magics import unload

    if _registered is not None:
        unload(ipython, _registered)
        _registered = None


__all__ = [
    "CheckpointManager", "Checkpoint", "VerifyReport", "GCReport", "PickledValue",
    "auto", "epochs", "batches", "log", "rollback", "status", "AutoConfig", "AutoSession",
    "explore", "Explorer", "plot_metrics", "plot_dag", "plot_diff", "plot_compare", "dag_layout",
    "Stateful", "RNGState",
    "Store", "LocalStore", "MemoryStore", "FsspecStore", "open_store",
    "CkptError", "CheckpointNotFoundError", "CorruptCheckpointError", "StateMismatchError",
    "UntrustedPickleError", "StoreFormatError", "CheckpointInUseError", "StoreError",
    "CaptureError", "MetricNotFoundError", "FileFormatError",
]
