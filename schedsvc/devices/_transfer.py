"""The copy tasks between host and device memory, as the frontend names them.

``to_device`` is the callable of a host-to-device copy task: the CUDA
device recognises it and launches the copy on its H2D stream through
pinned staging (run anywhere else it is the identity).  Copies back to the
host are the device's own ``to_host`` (run on a CPU thread, on the device's
D2H stream).
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["to_device"]

T = TypeVar("T")


def to_device(value: T) -> T:
    """A host-to-device copy (launched by the CUDA device on its H2D stream)."""
    return value
