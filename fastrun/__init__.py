"""fastrun: measure every algorithm, cache the result, dispatch to the fastest.

Quick tour::

    import fastrun
    with fastrun.session(strategy="fast-run", cache="cache.bin"):
        c = fastrun.call("matmul", a, b)      # searched once, then a dictionary lookup

Names are imported lazily so that ``import fastrun`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from fastrun._version import __version__

_EXPORTS = {
    "AlgoAttribute": "fastrun.attribute",
    "Algorithm": "fastrun.algorithm",
    "AlgorithmDesc": "fastrun.algorithm",
    "Operator": "fastrun.operator",
    "Problem": "fastrun.operator",
    "Registry": "fastrun.registry",
    "default_registry": "fastrun.registry",
    "Strategy": "fastrun.core.strategy",
    "SearchOptions": "fastrun.core.strategy",
    "ExecutionPolicy": "fastrun.core.strategy",
    "Entry": "fastrun.cache",
    "PersistentCache": "fastrun.cache",
    "InMemoryCache": "fastrun.cache",
    "FileCache": "fastrun.cache",
    "CacheCorruptWarning": "fastrun.cache",
    "CacheUnwritableWarning": "fastrun.cache",
    "AlgoChooser": "fastrun.core.chooser",
    "NoUsableAlgorithmError": "fastrun.core.chooser",
    "Session": "fastrun.api",
    "session": "fastrun.api",
    "call": "fastrun.api",
    "current_session": "fastrun.api",
    "get_device": "fastrun.devices",
    "configure_threads": "fastrun.devices.cpu.threads",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fastrun' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
