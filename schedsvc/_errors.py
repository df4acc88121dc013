"""The errors schedsvc raises.

Every error derives from one base class, so ``except ss.SchedsvcError`` catches
them all::

    SchedsvcError
    ├── QueueFull           submit_nowait() or a compiled call at max_pending / max_pending_bytes /
    │                       a device's max_device_bytes
    ├── MemoryLimitError    a task can never fit max_pending_bytes
    ├── DependencyError     a task's input failed or was cancelled; __cause__ is why
    ├── TaskCancelled       the task awaited (or read with result()) was cancelled
    │                       (also asyncio's and concurrent.futures' CancelledError)
    ├── EngineClosed        the engine is closed, closing, or was never started
    ├── DeviceError         unknown or unavailable device
    ├── InvalidTask         not callable, bad priority/nbytes, a future of another engine (TypeError)
    ├── TraceError          a compiled function did something a replay cannot repeat (TypeError)
    │   └── BatchError      eng.compile(fn, batch_axis=...): fn mixes the rows of a batch
    ├── LoadError           ss.load: not a saved compiled function, or one that disagrees with itself (ValueError)
    └── ConfigError         also a pydantic ValidationError's message, re-raised (ValueError)

Each message says what happened and what to do about it.  One warning,
``ConfigWarning`` (a ``UserWarning``), says a ``SCHEDSVC_*`` environment
variable names no setting and is ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "BatchError",
    "ConfigError",
    "ConfigWarning",
    "DependencyError",
    "DeviceError",
    "EngineClosed",
    "InvalidTask",
    "LoadError",
    "MemoryLimitError",
    "QueueFull",
    "SchedsvcError",
    "TaskCancelled",
    "TraceError",
    "stop_through_await",
]


class SchedsvcError(Exception):
    """Base class of every error schedsvc raises."""


class QueueFull(SchedsvcError):
    """``submit_nowait`` (or a compiled call) found the engine at ``max_pending`` or ``max_pending_bytes``, or
    no room in its device's byte budget (``max_device_bytes``); the message names the limit that is full."""


class MemoryLimitError(SchedsvcError):
    """A task needs more bytes than ``max_pending_bytes`` allows, so it could never run."""


class DependencyError(SchedsvcError):
    """A task did not run because a task it depends on failed or was cancelled."""


if TYPE_CHECKING:
    from ._cancelled import TaskCancelled
else:

    def __getattr__(name: str) -> Any:
        """``TaskCancelled`` on first use (``_cancelled.py``): its bases are asyncio's and concurrent.futures'
        errors, and ``import schedsvc`` does not import asyncio (a third of NumPy's import time)."""
        if name != "TaskCancelled":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from ._cancelled import TaskCancelled

        globals()["TaskCancelled"] = TaskCancelled
        return TaskCancelled


class EngineClosed(SchedsvcError):
    """The engine is closed (or not started) and takes no more work."""


class DeviceError(SchedsvcError):
    """The device named is unknown, or is not available on this machine."""


class ConfigError(SchedsvcError, ValueError):
    """A configuration value is invalid; the message names the field."""


class ConfigWarning(UserWarning):
    """A ``SCHEDSVC_*`` environment variable names no setting, so it is ignored; the message names the closest."""


class InvalidTask(SchedsvcError, TypeError):
    """A submission is malformed: not callable, a bad option, or a foreign future."""


class TraceError(SchedsvcError, TypeError):
    """While ``eng.compile`` traced a function, it needed a value (data-dependent control flow)
    or had a Python side effect that a replay would not repeat."""


class BatchError(TraceError):
    """``eng.compile(fn, batch_axis=...)`` could not prove that every output row of ``fn`` depends only
    on the same input row (the message names the op and the axis), or a call does not fit the batch."""


class LoadError(SchedsvcError, ValueError):
    """``ss.load`` refused a file: not JSON, truncated, nested too deeply, not a saved compiled function,
    or a graph whose shapes and dtypes disagree with what its operations give; the message names the file."""


#: what an engine says in a process forked from the one that started it
FORKED = (
    "this process was forked from the one that started the engine, and the engine's threads did not "
    "come along, so its work would never run here; create a new Engine in the child process"
)


def stop_through_await(fut: object, exc: BaseException) -> RuntimeError:
    """A task's StopIteration (or StopAsyncIteration) cannot pass through ``await`` (PEP 479): say so.

    Python would raise a bare ``RuntimeError('generator raised StopIteration')``; this one names the task
    and says where the exception itself is (``__cause__``, ``fut.exception()``, ``fut.result()``).
    """
    return RuntimeError(
        f"{fut!r} raised {type(exc).__name__}({exc}), which Python cannot raise through 'await' or an "
        "async generator (PEP 479); "
        "it is this error's __cause__, and fut.exception() returns it (fut.result() raises it unchanged)"
    )
