"""ckpt_nb: crash-proof, explorable checkpoints for PyTorch training in notebooks.

The public API is what ``__all__`` names; modules with a leading underscore are
private and may change.
"""

from ._capture import RNGState, Stateful
from ._errors import (CaptureError, CheckpointInUseError, CheckpointNotFoundError, CkptError,
                      CorruptCheckpointError, StateMismatchError, StoreError, StoreFormatError,
                      UntrustedPickleError)
from ._manager import Checkpoint, CheckpointManager, GCReport, PickledValue, VerifyReport
from ._store import FsspecStore, LocalStore, MemoryStore, Store, open_store

__version__ = "0.1.0"

__all__ = [
    "CheckpointManager", "Checkpoint", "VerifyReport", "GCReport", "PickledValue",
    "Stateful", "RNGState",
    "Store", "LocalStore", "MemoryStore", "FsspecStore", "open_store",
    "CkptError", "CheckpointNotFoundError", "CorruptCheckpointError", "StateMismatchError",
    "UntrustedPickleError", "StoreFormatError", "CheckpointInUseError", "StoreError",
    "CaptureError",
]
