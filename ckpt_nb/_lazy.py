"""Modules imported where first used: torch takes seconds to import, and the CLI's reads
(``ckpt-nb ls``, ``show``, ``verify``, ``gc``, ``pin``, ``rm``) never touch a tensor."""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for a module in a namespace until one of its attributes is read, then imports
    it and takes its place there: later reads are those of the module itself."""

    def __init__(self, name: str, namespace: dict[str, Any], key: str) -> None:
        self._name, self._namespace, self._key = name, namespace, key

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._name)
        self._namespace[self._key] = module
        return getattr(module, attr)
