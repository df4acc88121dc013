"""Pure scheduling core: task records, edges, hazards, ready queues, limits.

Imports no threading, asyncio or array library; see ``_scheduler`` for the
events it takes and the instructions it gives.
"""

from ._queue import ReadyQueue
from ._scheduler import Barrier, Cancel, Enqueue, Finish, Instruction, Scheduler, Submit, Take, Withdraw
from ._task import FINAL_STATES, TRANSITIONS, Buffer, Task, TaskState, name_of, safe_repr

__all__ = [
    "FINAL_STATES",
    "TRANSITIONS",
    "Barrier",
    "Buffer",
    "Cancel",
    "Enqueue",
    "Finish",
    "Instruction",
    "ReadyQueue",
    "Scheduler",
    "Submit",
    "Take",
    "Task",
    "TaskState",
    "Withdraw",
    "name_of",
    "safe_repr",
]
