"""ckpt_nb: crash-proof, explorable checkpoints for PyTorch training in notebooks.

The public API is what ``__all__`` names; modules with a leading underscore are
private and may change.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Each public name and its module. They load on first use, so that ``ckpt-nb --help`` and
# a CLI usage error answer before torch has loaded (a second), and Ctrl-C meanwhile is
# the command's to handle. The explorer and the plots need the ``notebook`` extra.
_PUBLIC = {
    **dict.fromkeys(["RNGState", "Stateful"], "_capture"),
    **dict.fromkeys(["CaptureError", "CheckpointInUseError", "CheckpointNotFoundError",
                     "CkptError", "CorruptCheckpointError", "DamagedCatalog",
                     "FileFormatError", "MetricNotFoundError", "MissingDependencyError",
                     "StateMismatchError", "StoreError",
                     "StoreFormatError", "UntrustedPickleError"], "_errors"),
    **dict.fromkeys(["Checkpoint", "CheckpointManager", "GCReport", "PickledValue",
                     "VerifyReport"], "_manager"),
    **dict.fromkeys(["AutoConfig", "AutoSession", "auto", "batches", "epochs", "history",
                     "log", "rollback", "status"], "_session"),
    **dict.fromkeys(["FsspecStore", "LocalStore", "MemoryStore", "Store", "open_store"],
                    "_store"),
    **dict.fromkeys(["explore", "Explorer"], "_explorer"),
    **dict.fromkeys(["plot_metrics", "plot_dag", "plot_diff", "plot_compare", "dag_layout"],
                    "_plots"),
}
_NOTEBOOK_EXTRA = frozenset({"_explorer", "_plots"})

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ loads these
    from ._capture import RNGState, Stateful
    from ._errors import (CaptureError, CheckpointInUseError, CheckpointNotFoundError,
                          CkptError, CorruptCheckpointError, DamagedCatalog,
                          FileFormatError,
                          MetricNotFoundError, MissingDependencyError,
                          StateMismatchError, StoreError,
                          StoreFormatError, UntrustedPickleError)
    from ._explorer import Explorer, explore
    from ._manager import Checkpoint, CheckpointManager, GCReport, PickledValue, VerifyReport
    from ._plots import dag_layout, plot_compare, plot_dag, plot_diff, plot_metrics
    from ._session import (AutoConfig, AutoSession, auto, batches, epochs, history, log,
                           rollback, status)
    from ._store import FsspecStore, LocalStore, MemoryStore, Store, open_store


def __getattr__(name: str):  # noqa: ANN202 - PEP 562: a public name loads on first use
    """Import the module of a public name, and keep the name here from then on."""
    module_name = _PUBLIC.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ckpt_nb' has no attribute {name!r}")
    import importlib

    try:
        module = importlib.import_module(f".{module_name}", __name__)
    except ImportError as exc:
        if module_name not in _NOTEBOOK_EXTRA:
            raise
        from ._errors import MissingDependencyError  # (light: no torch)

        raise MissingDependencyError(f"ckpt_nb.{name} needs the notebook extra ({exc}): "
                                     "pip install \"ckpt_nb[notebook]\"") from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


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
    "auto", "epochs", "batches", "log", "history", "rollback", "status", "AutoConfig",
    "AutoSession",
    "explore", "Explorer", "plot_metrics", "plot_dag", "plot_diff", "plot_compare", "dag_layout",
    "Stateful", "RNGState",
    "Store", "LocalStore", "MemoryStore", "FsspecStore", "open_store",
    "CkptError", "CheckpointNotFoundError", "CorruptCheckpointError", "StateMismatchError",
    "UntrustedPickleError", "StoreFormatError", "CheckpointInUseError", "StoreError",
    "CaptureError", "MetricNotFoundError", "FileFormatError", "DamagedCatalog",
    "MissingDependencyError",
]
