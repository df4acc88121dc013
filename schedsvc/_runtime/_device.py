"""The device interface: what every kind of device (CPU threads, Dask, CUDA streams) implements.

A ``Device`` serves one device name (``"cpu"``, ``"cuda:0"``) for an engine.
It never touches the scheduling core or its lock: it calls the runtime
(``rt``), which is the one door to both.  Its life, as the runtime drives it:

1. ``await Kind.open(rt, name, config)`` builds it (a remote kind connects
   here); ``start()`` starts its threads.
2. Whenever tasks of its device become ready and it is ``hungry``, the runtime
   calls ``dispatch(ready)`` with its lock held, on the thread that made them
   ready (the event loop for a submission or a Tensor op, a worker for a task's
   dependents, a stream's watcher for what a completion freed).  This is the
   one verb that says which thread runs or launches a ready task: the device
   returns what to do on that thread once the lock is released, or None.  A
   thread device releases a parked worker, which takes its tasks from the
   runtime (``rt.next_task``) and parks in ``idle`` again when there are none
   (the device is hungry again).  A device that launches work asynchronously
   (CUDA streams) launches them right there (``rt.launch_first``,
   ``rt.launched``), handing only what may block to a thread of its own.
3. It reports each outcome through the runtime: ``rt.execute`` for a task run
   on the calling thread (the CPU path: a task is launched and complete at
   once), ``rt.finish`` for one that ended elsewhere, ``rt.launched`` and
   ``rt.complete_all`` for a device that queues work asynchronously (its
   completions in bulk: every task of a stream up to the last event passed).
4. ``cancel(task)`` cancels one task it was sent and has not started, and
   ``cancel_all()`` every such task (a close that cancels pending work);
   ``stop()`` says no more work will come; ``join(timeout)`` and ``aclose()``
   wait for its threads and release what ``open`` acquired.

Its class says what the engine may assume of it: ``local`` (tasks run in this
process, so a task's value is a real object, a thread that would only wait
may run a queued task itself, and Tensors may live on it), and
``buffer_types`` (argument types it understands as memory, with how to key
them: a view keys to the object that owns its memory, so tasks touching the
same memory through different views are ordered).

A new kind is one module in ``schedsvc.devices`` with one ``Device`` subclass,
named in ``KINDS`` there; it is imported only when an engine uses it, so its
libraries (CuPy, Dask) are imported by that module alone.  The interface lives
here, beside the runtime that drives it, so the runtime never imports the
devices package.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .._config import Config
    from .._core import Task
    from ._copies import Copies
    from ._runtime import Runtime

__all__ = ["Device", "Keyer"]

#: How a device keys a buffer argument: ``(key, nbytes)`` of the memory it
#: lives in -- the same key for every view of that memory.
Keyer = Callable[[Any], tuple[int, int]]


class Device(abc.ABC):
    """Base of every kind of device; the methods below are the whole interface (``open`` and ``dispatch``
    each kind must write; the others have defaults that suit a kind that does not need them)."""

    #: the kind's name in ``Config`` (``backend=``) and in messages
    kind: ClassVar[str] = ""
    #: tasks run in this process (values are real objects; a waiting thread may run one itself)
    local: ClassVar[bool] = True
    #: does it launch work asynchronously (CUDA streams)?  Then its tasks have two completion
    #: points: ``rt.launched`` (queued on the device behind its parents, so a same-device dependent
    #: may be launched behind it) and ``rt.complete`` (visible to the host; ``rt.complete_all`` for several)
    asynchronous: ClassVar[bool] = False
    #: does its device have memory of its own?  Then ``Config.max_device_bytes`` budgets it
    own_memory: ClassVar[bool] = False
    #: do its workers park with a time limit when ``rt.next_task`` returns a number of seconds (and call
    #: ``rt.unpark`` when it runs out)?  Then they take the tasks a busy event loop has staged and not
    #: handed over; without it a parked worker waits for the loop to hand them over
    parks_timed: ClassVar[bool] = False
    #: may its tasks submitted on the event loop's thread be staged -- held, then handed over together when
    #: the submitting coroutine yields (``Admission``)?  Not for a device that launches on the thread that
    #: made the work ready: a held task would only be launched later, by the flush
    staged: ClassVar[bool] = True
    #: argument types it understands as memory, beyond NumPy arrays and the buffer protocol
    #: (which every engine scans), with how to key them
    buffer_types: Mapping[type, Keyer] = {}

    def __init__(self, rt: Runtime, name: str) -> None:
        self.rt = rt
        self.name = name  # the device it serves
        #: does it want to be told of ready work (``dispatch``)?  The runtime reads this with its lock
        #: held at every scheduling event, so it is a plain attribute the device keeps true
        self.hungry = True
        #: submissions of one event-loop iteration handed to it at once, before the rest are staged
        #: (held, then handed over together when the submitting coroutine yields)
        self.eager = 1
        #: its workers parked waiting for work (a thread device's): ``rt.next_task`` appends a
        #: worker that found none and makes the device ``hungry``; ``dispatch`` takes them out
        self.idle: list[Any] = []

    @classmethod
    @abc.abstractmethod
    async def open(cls, rt: Runtime, name: str, config: Config) -> Device:
        """Build the device ``name`` (a remote kind connects here)."""

    @classmethod
    def check_device(cls, name: str, config: Config | None = None) -> None:
        """Raise ``DeviceError`` unless this machine can run device ``name`` of this kind (its name is
        well formed already: ``cpu``, or ``KIND:N``); say how to make it available."""

    @classmethod
    def check_config(cls, config: Config) -> None:
        """Raise if ``config`` asks for something this kind cannot do (at engine start)."""

    def check_task(self, fn: Any, kwargs: dict[str, Any], writes: Any) -> None:
        """Raise ``InvalidTask`` if this kind cannot run such a task (called at submission when
        ``vets_tasks`` is true)."""

    #: does ``check_task`` check anything?  (Otherwise the engine does not call it per submission.)
    vets_tasks: ClassVar[bool] = False

    #: may any thread run one of its queued tasks by calling it (a thread that would only wait for
    #: it, an awaiting loop thread for a cheap one)?  True for host threads, not for streams or remote
    runs_anywhere: ClassVar[bool] = False

    def start(self) -> None:
        """Start the threads it runs on (after ``open``, before the first ``dispatch``)."""

    def leaving(self, worker: Any, ready: int) -> bool:
        """With the runtime's lock held (``rt.next_task``): should ``worker`` end now, with ``ready``
        tasks queued?"""
        return False

    @abc.abstractmethod
    def dispatch(self, ready: int) -> Callable[[], None] | None:
        """With the runtime's lock held, on the thread that made them ready: ``ready`` tasks of its device
        wait in its queue.  Return what to do on this thread once the lock is released (wake a parked
        worker, launch them here), or None."""

    def admitted(self, task: Task) -> None:
        """A task of its device was admitted waiting for parents (called when ``forwards`` is true):
        a remote kind may send it ahead, behind its parents' remote work."""

    #: does ``admitted`` do anything?  (Otherwise the engine does not call it per submission.)
    forwards: ClassVar[bool] = False

    #: does it ``prepare`` tasks at submission (a device with memory of its own: host arguments are
    #: copied in as tasks of their own, its values copied out for other devices' tasks)?
    prepares: ClassVar[bool] = False

    def prepare(self, task: Task, submit: Callable[[Task], None], copies: Copies) -> None:
        """With the runtime's lock held, before ``task`` (of its device) is admitted: replace host
        arguments with copy tasks, ``submit``ting each first (``copies`` finds one again)."""

    def to_host(self, value: Any) -> Any:
        """Run on a host thread: ``value`` (of its device) copied to host memory."""
        return value

    def host_copy(self, value: Any, task: Task) -> Task:
        """A task on ``task``'s device that copies ``value`` (a task of this device, or one of its
        arrays) to the host, reading its memory."""
        raise NotImplementedError

    def holds(self, obj: Any) -> bool:
        """Is ``obj`` an array in this device's memory?"""
        return False

    #: tasks it runs at once (threads, streams, a cluster's threads when the engine started)
    concurrency: int = 1

    @property
    def window(self) -> int:
        """Tasks worth keeping in flight on it (``eng.map``'s default ``max_inflight``): twice what it
        runs at once, so each runner has its next task ready when it finishes one."""
        return 2 * self.concurrency

    def cancel(self, task: Task) -> bool:
        """Cancel ``task`` if it was sent and has not started (from any thread); False otherwise."""
        return False

    def cancel_all(self) -> None:
        """Cancel every task it was sent and has not started (``aclose(cancel_pending=True)``)."""

    def stop(self) -> None:
        """No more work will come: let its threads end once the work queued for them ran."""

    def join(self, timeout: float | None) -> list[threading.Thread]:
        """Wait up to ``timeout`` for its threads to end; return those still alive."""
        return []

    async def aclose(self) -> None:
        """Release what ``open`` acquired (a client, a cluster), after ``stop``."""

    def busy_seconds(self) -> dict[str, float]:
        """Seconds spent running tasks, per worker track (thread, stream, remote worker)."""
        return {}

    def launches(self) -> dict[str, int]:
        """Tasks launched per stream (an asynchronous device's)."""
        return {}

    def sweeps(self) -> dict[str, int]:
        """Completion reports per stream (an asynchronous device's): each reports every task of the stream
        whose work passed."""
        return {}

    def used_bytes(self) -> int:
        """Bytes live in the device's own memory now, as its allocator counts them (``own_memory``
        kinds): results user code still references and what work in flight allocated.  Read under the
        runtime's lock: it must not block or take that lock."""
        return 0
