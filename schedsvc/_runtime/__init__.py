"""Runtime: the lock around the core, argument scanning, and the thread <-> loop bridge."""

from .._core import Task
from ._runtime import Device, Runtime, current_worker
from ._scan import buffer_of, scan, substitute

__all__ = ["Device", "Runtime", "Task", "buffer_of", "current_worker", "scan", "substitute"]
