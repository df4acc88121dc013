"""Runtime: the lock around the core, argument scanning, and the thread <-> loop bridge.

``Runtime`` (``_runtime``) is the one door to the core; its parts each do one job:
``Admission``, ``DeviceCopies``, ``Dispatch``, ``Waiting``, ``Closing``, ``Status``.
``Device`` (``_device``) is the interface the runtime drives each kind of device through
(``schedsvc.devices`` holds the kinds).
"""

from .._core import Task
from ._admission import BLOCK, NOW, OVER, QUEUE
from ._device import Device, Keyer
from ._dispatch import Fusion
from ._runtime import Runtime
from ._scan import buffer_of, scan, substitute
from ._threads import current_worker, set_worker

__all__ = [
    "BLOCK",
    "NOW",
    "OVER",
    "QUEUE",
    "Device",
    "Fusion",
    "Keyer",
    "Runtime",
    "Task",
    "buffer_of",
    "current_worker",
    "scan",
    "set_worker",
    "substitute",
]
