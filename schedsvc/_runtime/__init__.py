"""Runtime: the lock around the core, argument scanning, and the thread <-> loop bridge."""

from .._core import Task
from ._runtime import BLOCK, NOW, OVER, QUEUE, Runtime, current_worker
from ._scan import buffer_of, scan, substitute

__all__ = [
    "BLOCK",
    "NOW",
    "OVER",
    "QUEUE",
    "Runtime",
    "Task",
    "buffer_of",
    "current_worker",
    "scan",
    "substitute",
]
