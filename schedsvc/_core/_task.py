"""The task record the scheduler moves through its states.

One object per task: the frontend's ``Future`` subclasses ``Task``, so a
submission allocates one record, not a task plus a future.  The core reads and
writes only the scheduling fields; ``fn``/``args``/``kwargs``/``value`` and
``watchers`` are payload it carries for the layers above.
"""

from __future__ import annotations

from typing import Any, Final, Literal

__all__ = ["FINAL_STATES", "TRANSITIONS", "Buffer", "Task", "TaskState", "name_of", "safe_repr"]

TaskState = Literal[
    "new", "admitting", "waiting", "ready", "running", "launched", "done", "failed", "cancelled"
]

#: Legal transitions.  ``admitting``: waiting for room under the limits;
#: ``waiting``: admitted, some parent unfinished; a ``waiting`` task fails or
#: is cancelled without running when a data parent fails or is cancelled;
#: ``running`` -> ``cancelled`` only through ``Scheduler.finish_cancelled``
#: (a remote executor dropped the task unrun), never through ``cancel``.
#: ``launched`` (asynchronous devices only): its work is queued on the device;
#: it is still pending until ``Scheduler.complete``.  ``ready`` -> ``failed``:
#: made ready behind a launched parent whose result then failed.
TRANSITIONS: Final[dict[TaskState, frozenset[TaskState]]] = {
    "new": frozenset({"admitting", "waiting", "ready", "failed", "cancelled"}),
    "admitting": frozenset({"waiting", "ready", "failed", "cancelled"}),
    "waiting": frozenset({"ready", "failed", "cancelled"}),
    "ready": frozenset({"running", "failed", "cancelled"}),
    "running": frozenset({"launched", "done", "failed", "cancelled"}),
    "launched": frozenset({"done", "failed"}),
    "done": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

FINAL_STATES: Final[frozenset[str]] = frozenset({"done", "failed", "cancelled"})

#: One buffer a task touches: (key, nbytes, is_write).  ``key`` identifies the
#: underlying memory (the id of a view's base); the task's args keep it alive.
Buffer = tuple[int, int, bool]


def name_of(fn: Any) -> str | None:
    """``fn.__name__`` if it has a usable one; never raises (user objects run code here)."""
    try:
        name = getattr(fn, "__name__", None)
    except Exception:
        return None
    return name if type(name) is str else None


def safe_repr(obj: Any, limit: int = 80) -> str:
    """``repr(obj)``, shortened to ``limit`` characters; never raises (user objects run code here)."""
    try:
        text = repr(obj)
    except Exception as exc:
        return f"<{type(obj).__name__} object; its repr raised {type(exc).__name__}>"
    if type(text) is not str:
        return f"<{type(obj).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Task:
    """A unit of work and its scheduling state."""

    __slots__ = (
        "after",
        "args",
        "buffers",
        "dependents",
        "deps",
        "device",
        "error",
        "fn",
        "kwargs",
        "n_waiting",
        "name",
        "nested",
        "out_bytes",
        "priority",
        "seq",
        "staged",
        "state",
        "t_ready",
        "value",
        "watchers",
    )

    #: For a task whose value lives in memory the engine tracks (a Tensor): a read
    #: of that memory, as the Buffer ``(key, nbytes, False)``, so that passing the
    #: task is also a read of it (one entry, made once, however often it is read).
    memory: Buffer | None = None

    #: Tasks whose ``fusion`` is the same object (not None) may run as one: the executor that takes one
    #: of them may also take the others that are ready (``Scheduler.take_like``).  A class attribute: a
    #: kind of task that fuses gives it a slot of its own.
    fusion: Any = None

    #: A task the engine made for a submission (a copy of an argument to the submission's device): it is
    #: admitted with that submission and rides on its slot of ``max_pending``.  A class attribute.
    rides: bool = False

    def __init__(
        self,
        fn: Any = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        device: str = "cpu",
        buffers: tuple[Buffer, ...] = (),
        deps: tuple[Task, ...] = (),
        priority: int = 0,
        nbytes: int = 0,
        name: str | None = None,
        nested: bool = False,
    ) -> None:
        # what every task has comes first; a builder on the hot path passes only that, positionally
        # (no keywords: they cost a call on Python 3.11 far more), and stores the rare fields itself
        # when it has them (a slot store is cheap)
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.device = device
        self.buffers = buffers
        self.deps = deps
        self.priority = priority
        self.out_bytes = nbytes  # bytes its result will hold (counted while it is pending)
        #: parents it is ordered after but whose value it does not take (a Tensor's pending write): their
        #: failure does not fail it
        self.after: tuple[Task, ...] = ()
        self.name = name
        self.nested = nested
        self.seq = -1
        self.staged = 0  # the burst (Scheduler epoch) it was staged in; 0: never
        self.state: TaskState = "new"
        self.n_waiting = 0
        self.dependents: list[Task] | None = None
        self.value: Any = None
        self.error: BaseException | None = None
        self.watchers: list[Any] | None = None
        self.t_ready = 0.0

    @property
    def label(self) -> str:
        """The task's name, or its callable's, for messages."""
        return self.name or name_of(self.fn) or "task"

    def __repr__(self) -> str:
        label = self.label
        seq = f"#{self.seq} " if self.seq >= 0 else ""
        return f"<{type(self).__name__} {seq}{label} {self.state}>"
