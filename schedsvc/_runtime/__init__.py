"""Runtime: the lock around the core, argument scanning, and the thread <-> loop bridge."""

from .._core import Task
from ._runtime import Device, Runtime, current_worker
from ._scan import scan, substitute

__all__ = ["Device", "Runtime", "Task", "current_worker", "scan", "substitute"]
