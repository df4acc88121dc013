"""schedsvc: an asyncio-native, dependency-aware, backpressured compute engine for array work."""

from ._config import Config
from ._engine import Engine
from ._errors import (
    ConfigError,
    DependencyError,
    DeviceError,
    EngineClosed,
    InvalidTask,
    MemoryLimitError,
    QueueFull,
    SchedsvcError,
)
from ._future import Future
from ._telemetry import Stats

__version__ = "0.1.0"

__all__ = [
    "Config",
    "ConfigError",
    "DependencyError",
    "DeviceError",
    "Engine",
    "EngineClosed",
    "Future",
    "InvalidTask",
    "MemoryLimitError",
    "QueueFull",
    "SchedsvcError",
    "Stats",
    "__version__",
]
