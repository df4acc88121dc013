"""Runtime: the lock around the core, argument scanning, and the thread <-> loop bridge."""

from .._core import Task
from ._runtime import Runtime, current_worker
from ._scan import buffer_of, scan, substitute

__all__ = ["Runtime", "Task", "buffer_of", "current_worker", "scan", "substitute"]
