"""schedsvc: an asyncio-native, dependency-aware, backpressured compute engine for array work."""

from importlib import metadata as _metadata

from ._config import Config
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
    TaskCancelled,
    TraceError,
)
from ._executor import executor
from ._future import Future
from ._prometheus import PrometheusCollector
from ._telemetry import Stats
from .compile import BatchCall, Batched, Compiled, load
from .tensor import Tensor

try:
    __version__: str = _metadata.version("schedsvc")  # defined once, in pyproject.toml
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

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
