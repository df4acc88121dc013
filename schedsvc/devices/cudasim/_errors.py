"""The simulator's error classes, named and worded as CuPy's.

``CUDARuntimeError`` (a ``RuntimeError``, ``.status``)
    a simulated CUDA call failed: 800 on a driver thread, 900/901 for a sync
    during capture, 719 after a device fault, or an injected launch failure.
``OutOfMemoryError`` (a ``MemoryError``)
    the device memory pool could not allocate (CuPy's message).
``RaceError`` (a ``RuntimeError``)
    an operation was enqueued without being ordered after a conflicting one.
``HostSyncError`` (a ``RuntimeError``)
    a host sync inside ``Simulator.forbid_host_sync()``.
"""

from __future__ import annotations

__all__ = ["CUDARuntimeError", "HostSyncError", "OutOfMemoryError", "RaceError"]

#: status -> (name, description), as ``cudaGetErrorName``/``cudaGetErrorString`` give them
_STATUSES: dict[int, tuple[str, str]] = {
    2: ("cudaErrorMemoryAllocation", "out of memory"),
    101: ("cudaErrorInvalidDevice", "invalid device ordinal"),
    400: ("cudaErrorInvalidResourceHandle", "invalid resource handle"),
    719: ("cudaErrorLaunchFailure", "unspecified launch failure"),
    800: ("cudaErrorNotPermitted", "operation not permitted"),
    900: ("cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"),
    901: ("cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"),
}


class CUDARuntimeError(RuntimeError):
    """A simulated CUDA runtime call failed with ``status``."""

    def __init__(self, status: int) -> None:
        self.status = status
        name, text = _STATUSES.get(status, ("cudaErrorUnknown", "unknown error"))
        super().__init__(f"{name}: {text}")

    def __reduce__(self) -> tuple[type[CUDARuntimeError], tuple[int]]:
        return (type(self), (self.status,))


class OutOfMemoryError(MemoryError):
    """The simulated device memory pool could not allocate ``size`` bytes."""

    def __init__(self, size: int, total: int, limit: int | None) -> None:
        self.size, self.total, self.limit = size, total, limit
        message = f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes"
        if limit is not None:
            message += f", limit set to: {limit:,} bytes"
        super().__init__(message + ").")

    def __reduce__(self) -> tuple[type[OutOfMemoryError], tuple[int, int, int | None]]:
        return (type(self), (self.size, self.total, self.limit))


class RaceError(RuntimeError):
    """An operation was enqueued that is not ordered after a conflicting access to the same block."""


class HostSyncError(RuntimeError):
    """A host synchronisation was made where ``forbid_host_sync()`` forbids one."""
