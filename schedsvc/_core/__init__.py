"""Pure scheduling core: task records, edges, hazards, ready queues, limits.

Imports no threading, asyncio or array library; see ``_scheduler`` for the
events it takes and the instructions it gives.
"""

from ._queue import ReadyQueue
from ._scheduler import Instruction, Scheduler
from ._task import FINAL_STATES, TRANSITIONS, Buffer, Task, TaskState, name_of, safe_repr

__all__ = [
    "FINAL_STATES",
    "TRANSITIONS",
    "Buffer",
    "Instruction",
    "ReadyQueue",
    "Scheduler",
    "Task",
    "TaskState",
    "name_of",
    "safe_repr",
]
