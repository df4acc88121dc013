"""schedsvc: an asyncio-native, dependency-aware, backpressured compute engine for array work.

``import schedsvc`` loads the engine and what every program needs (NumPy, the
scheduler, the Tensor); the rest is imported on first use of its name:
``Config`` (pydantic and pydantic-settings, which cost more to import than
NumPy; an Engine built without a Config imports them then), the compiler's
names, the ``concurrent.futures`` view, the Prometheus collector, and
``TaskCancelled`` (an ``asyncio.CancelledError``: asyncio is imported when an
engine starts, or a future is cancelled).
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._engine import Engine
from ._errors import (
    BatchError,
    ConfigError,
    ConfigWarning,
    DependencyError,
    DeviceError,
    EngineClosed,
    InvalidTask,
    LoadError,
    MemoryLimitError,
    QueueFull,
    SchedsvcError,
    TraceError,
)
from ._future import Future
from ._telemetry import Stats
from .tensor import Tensor

if TYPE_CHECKING:
    from ._cancelled import TaskCancelled
    from ._config import Config
    from ._executor import executor
    from ._prometheus import PrometheusCollector
    from .compile import BatchCall, Batched, Compiled, load

    __version__: str

__all__ = [
    "BatchCall",
    "BatchError",
    "Batched",
    "Compiled",
    "Config",
    "ConfigError",
    "ConfigWarning",
    "DependencyError",
    "DeviceError",
    "Engine",
    "EngineClosed",
    "Future",
    "InvalidTask",
    "LoadError",
    "MemoryLimitError",
    "PrometheusCollector",
    "QueueFull",
    "SchedsvcError",
    "Stats",
    "TaskCancelled",
    "Tensor",
    "TraceError",
    "__version__",
    "executor",
    "load",
]

#: public names imported on first use -> the module that defines each
_LAZY = {
    "BatchCall": ".compile",
    "Batched": ".compile",
    "Compiled": ".compile",
    "Config": "._config",
    "PrometheusCollector": "._prometheus",
    "TaskCancelled": "._cancelled",
    "executor": "._executor",
    "load": ".compile",
}


def __getattr__(name: str) -> Any:
    """A name of ``_LAZY``, or ``__version__``, imported now and kept (PEP 562)."""
    if name == "__version__":
        value: Any = _version()
    else:
        where = _LAZY.get(name)
        if where is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def _version() -> str:
    """The installed distribution's version: defined once, in pyproject.toml (importlib.metadata, which
    costs a few milliseconds to import, is loaded only when it is asked for)."""
    from importlib import metadata

    try:
        return metadata.version("schedsvc")
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})
