"""Runtime: the lock around the core, argument scanning, and the thread <-> loop bridge.

``Runtime`` (``_runtime``) is the one door to the core; its parts each do one job:
``Admission``, ``DeviceCopies``, ``Dispatch``, ``Waiting``, ``Closing``, ``Status``.
``Device`` (``_device``) is the interface the runtime drives each kind of device through
(``schedsvc.devices`` holds the kinds).
"""

from types import MappingProxyType

from .._core import Task
from ._admission import BLOCK, NOW, OVER, QUEUE
from ._bridge import Job, LoopWaiter, is_cancellation, on_loop
from ._copies import Copies, CopyTask
from ._device import Device, Keyer
from ._dispatch import Fusion, Staging
from ._memory import exports_memory, memory_of
from ._remote import Remote
from ._runtime import Runtime
from ._scan import (
    _KEYERS,
    SCALAR_TYPES,
    buffer_of,
    replace_leaves,
    scan,
    substitute,
    substitute_args,
    tasks_and_scalars,
)
from ._scan import _Found as Found  # what an argument's __schedsvc_visit__ hook is handed
from ._threads import current_worker, set_worker

#: the argument types devices registered as memory (a CuPy array, say), type -> (obj -> (key,
#: nbytes)); a read-only view, kept current: devices add to it with ``register_buffer_types``
BUFFER_TYPES = MappingProxyType(_KEYERS)

__all__ = [
    "BLOCK",
    "BUFFER_TYPES",
    "NOW",
    "OVER",
    "QUEUE",
    "SCALAR_TYPES",
    "Copies",
    "CopyTask",
    "Found",
    "Job",
    "LoopWaiter",
    "Remote",
    "Staging",
    "Device",
    "Fusion",
    "Keyer",
    "Runtime",
    "Task",
    "buffer_of",
    "current_worker",
    "exports_memory",
    "is_cancellation",
    "memory_of",
    "on_loop",
    "replace_leaves",
    "scan",
    "set_worker",
    "substitute",
    "substitute_args",
    "tasks_and_scalars",
]
