"""Runtime: the lock around the core, argument scanning, and the thread <-> loop bridge.

``Runtime`` (``_runtime``) is the one door to the core; its parts each do one job:
``Admission``, ``DeviceCopies``, ``Dispatch``, ``Waiting``, ``Closing``, ``Status``.
"""

from .._core import Task
from ._admission import BLOCK, NOW, OVER, QUEUE
from ._dispatch import Fusion
from ._runtime import Runtime
from ._scan import buffer_of, scan, substitute
from ._threads import current_worker, set_worker

__all__ = [
    "BLOCK",
    "NOW",
    "OVER",
    "QUEUE",
    "Fusion",
    "Runtime",
    "Task",
    "buffer_of",
    "current_worker",
    "scan",
    "set_worker",
    "substitute",
]
