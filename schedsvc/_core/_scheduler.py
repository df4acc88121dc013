"""The scheduling state machine: events in, instructions out.

Pure and synchronous: no threads, no event loop, no array library.  The
runtime owns the only lock and calls one method per event while holding it.

Events are the public methods (the runtime calls them directly; no event
object is allocated per task):

* ``submit(task, force, stage)``  admit a task now, or report that it does not fit
* ``publish()``           end the current burst: staged tasks become visible to ``take``
* ``enqueue(task, token)`` queue a task for admission, FIFO, until it fits
* ``take(device)``         a worker asks for the next ready task
* ``take_like(device, fusion, limit, weight)``  the worker that took a task with a ``fusion``
  also takes the other ready tasks of it, to run them as one
* ``finish(task, value, error)``  a running task returned or raised (on an
  asynchronous device: only a task that failed before it launched)
* ``launch(task)``         a running task's work is queued on its asynchronous device
* ``complete(task, value, error)``  a launched task's result is visible to the host
* ``finish_cancelled(task)``  a running task was cancelled where it was sent
  (a remote executor: taken from the core, not started on the cluster yet)
* ``cancel(task)``         cancel a task that has not started
* ``withdraw(token)``      a ``throttle`` waiter gave up
* ``unreserve(token)``    a ``throttle`` waiter that was let through gives its slot back
* ``barrier(token)``       wake ``token`` once every task admitted so far is final
* ``drop_barrier(token)``  its waiter gave up

Instructions appear in ``out`` (``drain()`` empties it):

* ``("resolve", task)``   task is final and has watchers to wake
* ``("admitted", token)`` the queued submission behind ``token`` was admitted (a
  ``throttle`` waiter: let through, and holding one reserved slot until ``unreserve``
  or ``submit_reserved``)
* ``("barrier", token)``  every task admitted before that barrier is final

Ready tasks wait in per-device ``ReadyQueue``s; workers pull them with
``take``, so "run this task" is the answer to a ``take`` event.

Ordering rules: data dependencies (``task.deps``) and buffer hazards (RAW, WAR,
WAW on ``task.buffers`` keys) become edges in submission order; reads of the
same buffer are unordered.  A failed or cancelled parent fails or cancels the
tasks that take its value; a hazard edge only orders.

Two completion points.  A task on a synchronous device (the CPU) passes both
at ``finish``.  A task on an *asynchronous* device (``asynchronous=``: its
executor queues work, e.g. on CUDA streams) goes ``running -> launched``
(``launch``: its work is queued on the device behind its parents' work) ``->
done | failed`` (``complete``).  An edge to a dependent on the *same* device
is passed at the parent's launch (the executor orders the dependent behind it
on the device); every other edge at the parent's completion.  So a dependent
is ready once each of its unfinished parents is launched on its device.
Until it completes, a launched task holds its buffers, bytes, max_pending
slot and barrier count.

* Out-of-order completion: a task's ``complete`` that arrives before the
  completion of a parent it was launched behind is held; the task stays
  ``launched`` and concludes (done or failed, ``("resolve", task)``) when its
  last such parent completes.  Its dependents never see an outcome before its
  parents'.
* Failure after launch: when a launched task's result fails, a dependent that
  takes its value and was made ready behind it fails: at once with a
  ``DependencyError`` if it is still ready (it never runs), else (running or
  launched) when it concludes, whatever it reported, with a ``DependencyError``
  whose cause is the original error.
* A task that fails while launching reports ``finish(task, None, error)``; if
  it was made ready behind launched parents it is final at once but keeps its
  place (buffers, edges) until they complete, as a failed waiting task does.

Byte budgets: ``max_pending_bytes`` for everything, and optionally one per
device (``device_bytes=``): a task's ``out_bytes`` and each buffer it is the
first pending user of count for its device while it is pending.  Admission is
one FIFO: a task that does not fit its device's budget waits, and so does
everything queued behind it, on any device.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from itertools import chain
from typing import Any

from .._errors import DependencyError, MemoryLimitError
from ._queue import HELD, ReadyQueue
from ._task import FINAL_STATES, TRANSITIONS, Task, TaskState, name_of

__all__ = ["Instruction", "Scheduler"]

Instruction = tuple[str, Any]


class _BufferState:
    """Hazard record of one buffer while unfinished tasks touch it."""

    __slots__ = ("nbytes", "readers", "users", "writer")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.users = 0  # unfinished tasks that touch this buffer
        self.writer: Task | None = None  # last unfinished writer
        self.readers: dict[Task, None] = {}  # unfinished readers since that write


class Scheduler:
    """Task states, dependency edges, buffer hazards, ready queues and limits."""

    # slots: more than 30 instance attributes would leave the shared-key dict and slow every access
    __slots__ = (
        "_admission",
        "_ahead",
        "_along",
        "_barriers",
        "_behind",
        "_behind_of",
        "_budgeted",
        "_buffers",
        "_cancelling",
        "_carried",
        "_check",
        "_clock",
        "_copies",
        "_device_peak",
        "_device_pending",
        "_device_used",
        "_doomed",
        "_epoch",
        "_held",
        "_hooks",
        "_host_copy",
        "_limit",
        "_live",
        "_max_footprint",
        "_owner",
        "_reservations",
        "_rider_of",
        "_riders_of_queued",
        "_seq",
        "asynchronous",
        "cancelled",
        "completed",
        "edges",
        "failed",
        "launched",
        "max_device_bytes",
        "max_pending",
        "max_pending_bytes",
        "out",
        "peak_pending_bytes",
        "pending",
        "pending_bytes",
        "queues",
        "riding",
        "running",
        "staged",
        "submitted",
    )

    def __init__(
        self,
        *,
        max_pending: int,
        max_pending_bytes: int,
        devices: Iterable[str] = ("cpu",),
        asynchronous: Iterable[str] = (),
        device_bytes: Mapping[str, int] | None = None,
        clock: Callable[[], float] | None = None,
        check: bool = False,
        host_copy: Any = None,
    ) -> None:
        self.max_pending = max_pending
        # throttle waiters let through that have not used or given back their slot yet
        self._reservations: set[Any] = set()
        self._limit = max_pending  # max_pending - reserved: what a task must stay under to be admitted
        self.max_pending_bytes = max_pending_bytes
        self.queues: dict[str, ReadyQueue] = {d: ReadyQueue() for d in devices}
        #: devices whose executors launch work asynchronously (``launch``/``complete``)
        self.asynchronous = frozenset(asynchronous)
        #: byte budget per device (devices not named have none)
        self.max_device_bytes: dict[str, int] = dict(device_bytes or {})
        unknown = (self.asynchronous | self.max_device_bytes.keys()) - self.queues.keys()
        if unknown:
            raise ValueError(
                f"unknown devices {sorted(unknown)}; the scheduler's devices are {sorted(self.queues)}"
            )
        self._budgeted = bool(self.max_device_bytes)
        #: the callable of a host-to-device copy task: what it reads is host memory, not its device's
        #: (only its result counts against the device's budget)
        self._host_copy = host_copy
        # the largest footprint that fits every limit: submit's one compare (the exact check when over it)
        self._max_footprint = min([max_pending_bytes, *self.max_device_bytes.values()])
        # bytes per device, counted only when some device has a budget
        self._device_pending: dict[str, int] = dict.fromkeys(self.queues, 0)
        self._device_peak: dict[str, int] = dict.fromkeys(self.queues, 0)
        #: bytes live in each budgeted device's memory as its allocator last reported them
        #: (``device_used``): results user code still references, and what work in flight allocated
        self._device_used: dict[str, int] = dict.fromkeys(self.queues, 0)
        self._owner: dict[int, tuple[str, int]] = {}  # buffer key -> (device that brought it in, nbytes)
        self.out: list[Instruction] = []
        self.pending = 0  # admitted, not final
        #: of those, the tasks made for a submission (its copies, the outputs picked from a call's
        #: result), which ride on its slot: the slots of ``max_pending`` in use are ``pending - riding``
        self.riding = 0
        #: tasks made to read a submission's result (``submit``'s ``riders``), while they ride: each ->
        #: the task whose slot they ride on; that task -> them.  Such riders outlive their submission: as it
        #: ends, its slot passes to the first of them, which carries the others (``_pass_slot``).
        self._rider_of: dict[Task, Task] = {}
        self._carried: dict[Task, dict[Task, None]] = {}
        self._riders_of_queued: dict[Task, list[Task]] = {}  # a task queued for admission -> its riders
        #: tasks made for submissions: admitted, then those that ended done, failed, cancelled (``counts``)
        self._copies = {"admitted": 0, "done": 0, "failed": 0, "cancelled": 0}
        self.pending_bytes = 0
        self.peak_pending_bytes = 0
        self.running = 0
        self.launched = 0  # launched, not complete
        self.submitted = 0
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self._seq = 0
        self.staged: list[Task] = []  # ready tasks of the current burst, held from take()
        self._epoch = 1  # the current burst; publish() ends it
        self._cancelling = False
        self._clock = clock or (lambda: 0.0)
        self._check = check
        self._hooks = check or self._budgeted  # _admit and _release call their (cold) hooks
        self._buffers: dict[int, _BufferState] = {}
        self._admission: deque[tuple[Task | None, Any]] = deque()
        #: a queued task -> the tasks made for it (its device copies), admitted with it, just before it
        self._along: dict[Task, list[Task]] = {}
        self._barriers: list[list[Any]] = []  # [last seq, unfinished count, token]
        self._live: dict[Task, list[Task]] = {}  # check mode: live task -> its parents
        # asynchronous devices: edges passed at a parent's launch, held until it completes
        self._behind: dict[Task, int] = {}  # task -> edges from launched, incomplete parents on its device
        self._behind_of: dict[Task, list[Task]] = {}  # launched task -> its dependents on its device
        self._ahead: dict[Task, list[Task]] = {}  # task -> the launched parents it may launch behind
        self._held: dict[Task, tuple[Any, BaseException | None]] = {}  # completed before those parents
        self._doomed: dict[Task, Task] = {}  # running/launched task -> its input whose result failed
        #: while a timeline is recorded: every edge made, as (parent seq, child seq)
        self.edges: list[tuple[int, int]] | None = None

    # -- events --------------------------------------------------------------

    def submit(
        self, task: Task, force: bool = False, stage: bool = False, along: list[Task] | None = None
    ) -> bool:
        """Admit ``task`` if it fits (``force``: regardless); False leaves it untouched.

        ``stage``: the task belongs to the current burst; whenever it becomes
        ready before the next ``publish()`` it is held back from ``take`` (the
        runtime batches hand-offs this way).  Raises MemoryLimitError if the
        task alone exceeds max_pending_bytes or its device's budget.
        ``along``: tasks made for it (the copies of its arguments to its device), part of its
        admission: they fit the limits together, and are admitted (just before it) or not with it.
        """
        footprint = task.out_bytes
        for buffer in task.buffers:
            footprint += buffer[1]
        if footprint > self._max_footprint:
            self._refuse(task, footprint)
        if along:
            return self._submit_along(task, force, stage, along)
        if not force:
            if self._admission or not self._fits(task):
                if self._budgeted:
                    self._check_held([task])
                return False
        elif self._budgeted:
            self._check_held([task])
        if stage:
            task.staged = self._epoch
        self._admit(task)
        return True

    def hold(self, task: Task) -> bool:
        """Admit ``task`` -- a call with a ``fusion``, no dependencies, and one buffer it reads -- if it fits
        and is ready at once: counted within the limits and its read registered as ``submit`` does, but
        held, not queued: listed by its fusion only, so that the worker that takes one of its fusion takes
        it too (``take_like``), and a worker takes it itself only once nothing else is ready.  False, and
        nothing done, where ``submit`` would do more than that: the task does not fit (or others wait
        for room), a pending task writes its buffer, the engine is cancelling its work, or the core keeps
        books that a held task would skip (check mode, riders, device budgets, a recorded timeline)."""
        if self._hooks or self._admission or self._cancelling or self.edges is not None:
            return False
        if self.pending - self.riding >= self._limit:
            return False
        key, nbytes, _ = task.buffers[0]
        buf = self._buffers.get(key)
        need = task.out_bytes
        if buf is None:
            need += nbytes
        elif buf.writer is not None:
            return False
        pending_bytes = self.pending_bytes + need
        if pending_bytes > self.max_pending_bytes:
            return False
        if buf is None:
            buf = self._buffers[key] = _BufferState(nbytes)
        buf.users += 1
        buf.readers[task] = None
        self.submitted += 1
        task.seq = self._seq = self._seq + 1
        self.pending += 1
        self.pending_bytes = pending_bytes
        if pending_bytes > self.peak_pending_bytes:
            self.peak_pending_bytes = pending_bytes
        task.state = "ready"
        task.t_ready = self._clock()
        task.staged = HELD
        self.queues[task.device].hold(task)
        return True

    def _submit_along(self, task: Task, force: bool, stage: bool, along: list[Task]) -> bool:
        for extra in along:
            self._refuse_never_fitting(extra)
        group = [*along, task]
        if not force and (self._admission or not self._fits_group(group)):
            if self._budgeted:
                self._check_held(group)
            return False
        if force and self._budgeted:
            self._check_held(group)
        for extra in along:
            if stage:
                extra.staged = self._epoch
            self._admit_rider(extra)
        if stage:
            task.staged = self._epoch
        self._admit(task)
        return True

    def ride(self, riders: list[Task], task: Task, stage: bool = False) -> None:
        """Admit ``riders`` -- tasks made to read the result of ``task``, which was just admitted (the
        outputs picked from a call's result) -- over the limits, on ``task``'s slot of ``max_pending``:
        a call and its outputs are one task within the limits.  Their bytes are ``task``'s result's (they
        should count none of their own)."""
        self._hooks = True  # (_released passes the slot on)
        carried = None
        for rider in riders:
            if stage:
                rider.staged = self._epoch
            self._admit(rider)
            if rider.state not in FINAL_STATES and task.state not in FINAL_STATES:
                if carried is None:
                    carried = self._carried.setdefault(task, {})
                carried[rider] = None
                self._rider_of[rider] = task
                self.riding += 1

    def _pass_slot(self, task: Task) -> None:
        """``task`` is released: if it rode on another's slot, it gets off; if others ride on its slot,
        the slot passes to the first of them, which carries the rest."""
        on = self._rider_of.pop(task, None)
        if on is not None:
            self.riding -= 1
            del self._carried[on][task]
        carried = self._carried.pop(task, None)
        if carried:
            heir = next(iter(carried))
            del carried[heir], self._rider_of[heir]
            self.riding -= 1
            if carried:
                self._carried[heir] = carried
                for rider in carried:
                    self._rider_of[rider] = heir

    def _admit_rider(self, extra: Task) -> None:
        """Admit a task made for a submission (just before it), on that submission's slot."""
        self._hooks = True  # (_released counts it out)
        self._admit(extra)
        copies = self._copies
        copies["admitted"] += 1
        if extra.state in FINAL_STATES:  # failed at once (its input had failed): never pending
            copies[extra.state] += 1
        elif extra.rides:
            self.riding += 1

    def _refuse_never_fitting(self, task: Task) -> None:
        footprint = task.out_bytes + sum(buffer[1] for buffer in task.buffers)
        if footprint > self._max_footprint:
            self._refuse(task, footprint)

    def _on_device(self, task: Task, nbytes: int) -> int:
        """Of ``nbytes`` a task adds, those on its device: a host-to-device copy reads host memory."""
        return task.out_bytes if task.fn is self._host_copy and task.fn is not None else nbytes

    def publish(self) -> None:
        """Move the staged ready tasks into their ready queues, in submission order."""
        epoch = self._epoch
        self._epoch += 1
        staged, self.staged = self.staged, []
        for task in staged:
            if task.staged == epoch:  # not claimed or cancelled meanwhile
                self.queues[task.device].push(task)

    def enqueue(
        self, task: Task | None, token: Any, along: list[Task] | None = None, riders: list[Task] | None = None
    ) -> None:
        """Queue ``task`` for admission; ``("admitted", token)`` follows when it gets in.

        With ``task=None`` the token just waits for room (``throttle``).  ``along``: as ``submit``'s,
        and ``riders``: as ``ride``'s, admitted with it when it gets in.
        """
        if task is not None:
            self._move(task, "admitting")
            if along:
                self._along[task] = along
            if riders:
                self._riders_of_queued[task] = riders
        self._admission.append((task, token))
        self._admit_waiters()

    def take(self, device: str) -> Task | None:
        """Hand the next ready task of ``device`` to a worker (ready -> running): a held one (``hold``) once
        no other is ready."""
        queue = self.queues[device]
        task = queue.pop()
        if task is None and queue.held:
            task = queue.pop_held()
        if task is not None:
            if self._check:  # hot path: no call unless checking
                self._move(task, "running")
            task.state = "running"
            self.running += 1
        return task

    def take_like(
        self, device: str, fusion: Any, limit: int, weight: Callable[[Task], int] | None = None
    ) -> list[Task]:
        """Hand the ready tasks of ``device`` whose ``fusion`` is ``fusion`` to the worker that runs one
        of them (ready -> running): oldest first, whatever their priority, while their weights (default
        1 each) add up to at most ``limit``."""
        taken = self.queues[device].take_like(fusion, limit, weight)
        check = self._check
        for task in taken:
            if check:  # hot path: no call unless checking
                self._move(task, "running")
            task.state = "running"
        self.running += len(taken)
        return taken

    def claim(self, task: Task) -> bool:
        """Take a specific ready task out of its queue to run it now (ready -> running)."""
        if task.state != "ready":
            return False
        self._unqueue(task)
        self._move(task, "running")
        self.running += 1
        return True

    def finish(
        self, task: Task, value: Any = None, error: BaseException | None = None, chain: bool = True
    ) -> Task | None:
        """Record a running task's outcome; return a dependent to run at once, if any.

        On an asynchronous device a task that launched reports ``complete``;
        ``finish`` is only for one that failed before it launched (an error).
        The returned task (already ``running``) is the first this completion
        made ready, on the same device, and no queued task outranks it; the
        caller should run it without a queue hand-off.  ``chain=False``: queue
        it instead.
        """
        self.running -= 1
        if error is None:
            task.value = value
            if self._check:  # hot path: no call unless checking
                self._check_finish(task)
                self._move(task, "done")
            task.state = "done"
            self.completed += 1
        else:
            self._fail_running(task, error)
            if (
                task in self._behind
            ):  # failed while launching behind launched parents: held until they complete
                if task.watchers is not None:
                    self.out.append(("resolve", task))
                return None
        if task.watchers is not None:
            self.out.append(("resolve", task))
        inline = self._release_and_cascade(task, inline_ok=chain)
        if self._admission:
            self._admit_waiters()
        if inline is not None:
            queue = self.queues[inline.device]
            top = queue.top_priority()
            if top is not None and top > inline.priority:
                queue.push(inline)
                return None
            if self._check:  # hot path: no call unless checking
                self._move(inline, "running")
            inline.state = "running"
            self.running += 1
        return inline

    def finish_all(self, tasks: list[Task], outcomes: list[tuple[Any, BaseException | None]]) -> Task | None:
        """``finish`` each of ``tasks`` -- the calls of one fused run, taken together -- with its
        ``(value, error)``, in order; the last may hand on a dependent to run at once, as ``finish`` does.

        A call that succeeded and that nothing depends on is finished here in a few steps (the common
        case of a batch: its reads released, its caller resolved); any other goes through ``finish``."""
        check = self._check  # (checking moves every task through finish)
        last = tasks[-1]
        out = self.out
        release = self._release
        nxt = None
        done = 0
        for task, (value, error) in zip(tasks, outcomes, strict=True):
            if check or error is not None or task.dependents is not None:
                nxt = self.finish(task, value, error, task is last)
                continue
            task.value = value
            task.state = "done"
            done += 1
            if task.watchers is not None:
                out.append(("resolve", task))
            release(task)
        self.running -= done
        self.completed += done
        if done and self._admission:
            self._admit_waiters()
        return nxt

    def finish_cancelled(self, task: Task) -> None:
        """A running task ends ``cancelled``: its executor cancelled it before it started there.

        Only a remote executor can (``cancel`` refuses a running task: a worker
        thread cannot be stopped): the task was taken and sent, and the cluster
        dropped it unrun.  It ends as a task cancelled here would, and so do the
        tasks that take its value.
        """
        self.running -= 1
        self._doomed.pop(task, None)
        self._final(task, "cancelled", None)
        self._finalize_dependents(task)
        if task not in self._behind:  # else its launched parents release it when they complete
            self._release_and_cascade(task, inline_ok=False)
        if self._admission:
            self._admit_waiters()

    def cancel(self, task: Task) -> bool:
        """Cancel a task that has not started, and every task that takes its value."""
        state = task.state
        if state == "admitting":
            self._admission = deque(e for e in self._admission if e[0] is not task)
            self._along.pop(task, None)  # never admitted: nothing else saw them
            self._riders_of_queued.pop(task, None)
            self._final(task, "cancelled", None, admitted=False)
            if task.dependents is not None:  # ordered after it while it was queued: not any more
                self._finalize_dependents(task)
                self._release_and_cascade(task, admitted=False)
            self._admit_waiters()  # those queued behind it may fit now
            return True
        if state == "new":
            self._final(task, "cancelled", None, admitted=False)
            return True
        if state not in ("waiting", "ready"):
            return False
        if state == "ready":
            self._unqueue(task)
        self._final(task, "cancelled", None)
        self._finalize_dependents(task)
        if task.n_waiting == 0 and task not in self._behind:
            self._release_and_cascade(task)
        # else it keeps its place in the order until its parents finish
        if self._admission:
            self._admit_waiters()
        return True

    def launch(self, task: Task, chain: bool = False) -> Task | None:
        """A running task's work is queued on its asynchronous device (running -> launched).

        Each dependent on the same device is no longer kept waiting by it: one
        whose unfinished parents are all launched on that device becomes ready,
        to be launched behind them.  The task stays pending until ``complete``.
        ``chain``: the first dependent made ready is returned (already ``running``)
        for the caller to launch at once, without a queue hand-off, unless a
        queued task outranks it, as ``finish`` hands on one.
        """
        if self._check:  # hot path: no call unless checking
            assert task.device in self.asynchronous, f"launch of {task!r}: {task.device} is not asynchronous"
            self._move(task, "launched")
        task.state = "launched"
        self.running -= 1
        self.launched += 1
        device = task.device
        dependents = task.dependents
        behind = [child for child in dependents if child.device == device] if dependents else []
        self._behind_of[task] = behind
        if not behind:
            return None
        rest = [child for child in dependents if child.device != device]  # type: ignore[union-attr]
        task.dependents = rest or None
        ahead = self._ahead
        inline: Task | None = None
        for child in behind:
            self._behind[child] = self._behind.get(child, 0) + 1
            ahead.setdefault(child, []).append(task)
            child.n_waiting -= 1
            if child.n_waiting == 0 and child.state == "waiting":
                if chain and inline is None and child.staged != self._epoch and not self._cancelling:
                    inline = child  # launched next by the caller: no queue hand-off
                else:
                    self._ready_behind(child)
        if inline is None:
            return None
        if self._check:  # hot path: no call unless checking
            self._move(inline, "ready")
        inline.state = "ready"
        inline.t_ready = self._clock()
        queue = self.queues[device]
        if queue.count:  # (hot path: nothing else is ready)
            top = queue.top_priority()
            if top is not None and top > inline.priority:
                queue.push(inline)
                return None
        if self._check:
            self._move(inline, "running")
        inline.state = "running"
        self.running += 1
        return inline

    def ahead(self, task: Task) -> list[Task]:
        """The launched parents (on its device, not complete) that ``task`` was made ready behind: its
        executor orders its work after theirs on the device.  (A query, not an event.)"""
        return self._ahead.get(task, [])

    def complete(self, task: Task, value: Any = None, error: BaseException | None = None) -> None:
        """A launched task's result is visible to the host (launched -> done | failed).

        If a parent it was launched behind has not completed yet, the outcome
        is held and the task concludes when the last such parent completes;
        if such a parent's result failed, it concludes failed with a
        ``DependencyError`` whatever it reported here.
        """
        if self._check:
            assert task.state == "launched" and task not in self._held, f"complete of {task!r}"
        if task in self._behind:
            self._held[task] = (value, error)
            return
        self._conclude(task, value, error)
        self._settle(task)
        if self._admission:
            self._admit_waiters()

    def withdraw(self, token: Any) -> bool:
        """Take a waiter that holds no task (``throttle``) out of the admission queue.

        False if it was not queued (let through already: then it may hold a
        reserved slot, which ``unreserve`` gives back).
        """
        before = len(self._admission)
        self._admission = deque(e for e in self._admission if e[1] is not token)
        self._admit_waiters()
        return len(self._admission) < before

    def unreserve(self, token: Any) -> bool:
        """The ``throttle`` waiter ``token``, let through, gives its reserved slot back (False: it held none)."""
        if not self._release_reservation(token):
            return False
        self._admit_waiters()
        return True

    def submit_reserved(
        self, task: Task, token: Any, stage: bool = False, along: list[Task] | None = None
    ) -> bool:
        """Admit ``task`` on the slot reserved for ``token``, ahead of the queue (it was let through first).

        The reservation is used up either way; False (no such reservation, or
        the task does not fit: its bytes, or tasks forced in over the limits)
        leaves the task untouched.
        """
        if not self._release_reservation(token):
            return False
        if self._fits_group([*along, task]) if along else self._fits(task):
            return self.submit(task, force=True, stage=stage, along=along)
        self._admit_waiters()
        return False

    def cancel_pending(self) -> list[Any]:
        """Stop starting work: cancel queued tasks now and each task as it becomes ready.

        Returns the tokens of submissions still waiting for admission (their
        tasks are cancelled); the caller tells those submitters.
        """
        self._cancelling = True
        tokens = []
        while self._admission:
            task, token = self._admission.popleft()
            if task is not None:
                self._along.pop(task, None)
                self._riders_of_queued.pop(task, None)
                self._final(task, "cancelled", None, admitted=False)
            tokens.append(token)
        for task in [*self.staged, *(t for q in self.queues.values() for t in q.tasks())]:
            self.cancel(task)
        self.staged = []
        return tokens

    def barrier(self, token: Any) -> None:
        """Wake ``token`` once every task admitted so far is final."""
        if self.pending == 0:
            self.out.append(("barrier", token))
        else:
            self._barriers.append([self._seq, self.pending, token])

    def drop_barrier(self, token: Any) -> None:
        """The waiter of ``token``'s barrier gave up (its ``waitall`` was cancelled): forget the barrier."""
        self._barriers = [entry for entry in self._barriers if entry[2] is not token]

    def drain(self) -> list[Instruction]:
        """Return and clear the instructions produced so far."""
        out, self.out = self.out, []
        return out

    # -- queries -------------------------------------------------------------

    def fits(self, task: Task) -> bool:
        """Would ``task`` be admitted now (room, and nobody queued ahead)?"""
        return not self._admission and self._fits(task)

    @property
    def reserved(self) -> int:
        """Slots held by throttle waiters that were let through."""
        return len(self._reservations)

    @property
    def copies(self) -> Mapping[str, int]:
        """Tasks made for submissions (riding on their slots): how many were admitted, and ended done,
        failed, cancelled."""
        return self._copies

    def device_used(self, device: str, nbytes: int) -> None:
        """Event: ``device``'s allocator holds ``nbytes`` of live memory now (a budgeted device)."""
        self._device_used[device] = nbytes

    def devices_have_room(self) -> bool:
        """Is every budgeted device either under its budget or idle?  (An idle device's memory is held by
        results user code references: only dropping them frees it, so nobody waits for that.)"""
        pending, used = self._device_pending, self._device_used
        for device, budget in self.max_device_bytes.items():
            if pending[device] and pending[device] + used[device] >= budget:
                return False
        return True

    @property
    def budgeted(self) -> bool:
        """Has some device a byte budget (``max_device_bytes``)?"""
        return self._budgeted

    def has_room(self, nbytes: int = 0) -> bool:
        """Would a task holding ``nbytes`` new bytes be admitted now, without waiting?"""
        return (
            not self._admission
            and self.pending - self.riding < self._limit
            and self.pending_bytes + nbytes <= self.max_pending_bytes
        )

    def writer_of(self, key: int) -> Task | None:
        """The last admitted, unfinished task that writes buffer ``key``, if any."""
        buf = self._buffers.get(key)
        return None if buf is None else buf.writer

    def device_pending_bytes(self, device: str) -> int:
        """Bytes pending on ``device`` (counted only when some device has a budget: 0 otherwise)."""
        return self._device_pending[device]

    def device_peak_bytes(self, device: str) -> int:
        """The most bytes ever pending on ``device`` (counted only when some device has a budget)."""
        return self._device_peak[device]

    @property
    def waiting_barriers(self) -> int:
        """Barriers whose tasks are not all final yet (``barrier``, not given up)."""
        return len(self._barriers)

    @property
    def waiting_admission(self) -> int:
        return len(self._admission)

    def ready_count(self, device: str) -> int:
        queue = self.queues[device]
        return queue.count + queue.held

    # -- internals -----------------------------------------------------------

    def _unqueue(self, task: Task) -> None:
        if task.staged == self._epoch:
            task.staged = 0  # still in self.staged: publish() skips it
        elif task.staged == HELD:
            self.queues[task.device].discard_held()
        else:
            self.queues[task.device].discard()

    def _release_reservation(self, token: Any) -> bool:
        if token not in self._reservations:
            return False
        self._reservations.remove(token)
        self._limit += 1
        return True

    def _fits(self, task: Task) -> bool:
        if self.pending - self.riding >= self._limit:  # hot path: one compare, reserved slots included
            return False
        need = task.out_bytes
        known = self._buffers
        for key, nbytes, _ in task.buffers:
            if key not in known:
                need += nbytes
        if self.pending_bytes + need > self.max_pending_bytes:
            return False
        return not self._budgeted or self._fits_device(task.device, self._on_device(task, need))

    def _fits_group(self, tasks: list[Task]) -> bool:
        """Do ``tasks`` (what was made for a submission, then the submission) fit the limits together?
        They need one slot, the submission's (what was made for it rides on it), and room for their bytes."""
        if self.pending - self.riding >= self._limit:
            return False
        total, need = self._group_bytes(tasks)
        if self.pending_bytes + total > self.max_pending_bytes:
            return False
        return not self._budgeted or all(self._fits_device(d, n) for d, n in need.items())

    def _group_bytes(self, tasks: list[Task]) -> tuple[int, dict[str, int]]:
        """The new bytes ``tasks`` bring in together (each buffer counted once), and those per device."""
        known = self._buffers
        new: set[int] = set()
        need: dict[str, int] = {}
        total = 0
        for task in tasks:
            added = task.out_bytes
            for key, nbytes, _ in task.buffers:
                if key not in known and key not in new:
                    new.add(key)
                    added += nbytes
            total += added
            need[task.device] = need.get(task.device, 0) + self._on_device(task, added)
        return total, need

    def _idle_and_held(self, tasks: list[Task]) -> bool:
        """Is a queued submission kept out only by results referenced on a device with no unfinished work?
        Then waiting cannot make room: it is let in, and its device's allocator has the last word (the
        memory may have been freed meanwhile; if not, it fails with MemoryLimitError as it allocates)."""
        return self._held_against(self._group_bytes(tasks)[1]) is not None

    def _check_held(self, tasks: list[Task]) -> None:
        """Raise MemoryLimitError if only dropping referenced device results could make room for ``tasks``
        (what was made for a submission, then the submission): no work on that device is unfinished, so
        nothing the engine runs can make the room, and admitting it would only fail it at its allocation."""
        held = self._held_against(self._group_bytes(tasks)[1])
        if held is None:
            return
        device, nbytes = held
        budget, used = self.max_device_bytes[device], self._device_used[device]
        raise MemoryLimitError(
            f"{tasks[-1]!r} needs {nbytes:,} bytes on {device}, but arrays still referenced there hold "
            f"{used:,} of its max_device_bytes={budget:,} and no work on it is unfinished: nothing the "
            "engine runs can free them. Drop the device results you no longer need (or move them to the "
            "host with .to('cpu')), or raise max_device_bytes."
        )

    def _held_against(self, need: dict[str, int]) -> tuple[str, int] | None:
        """The idle budgeted device (and the bytes needed there) whose referenced memory leaves no room."""
        for device, nbytes in need.items():
            budget = self.max_device_bytes.get(device)
            idle = not self._device_pending[device]
            if budget is not None and idle and self._device_used[device] + nbytes > budget:
                return device, nbytes
        return None

    def _fits_device(self, device: str, need: int) -> bool:
        """Room on ``device`` for ``need`` more bytes: its unfinished tasks' bytes, plus what its memory
        holds (referenced results; what running work allocated, counted twice: erring on the safe side
        while work is in flight, exact once the device is idle), stay within its budget."""
        budget = self.max_device_bytes.get(device)
        return budget is None or self._device_pending[device] + self._device_used[device] + need <= budget

    def _refuse(self, task: Task, footprint: int) -> None:
        """Raise MemoryLimitError if a task of ``footprint`` bytes could never be admitted."""
        what = f"{task!r} needs {footprint} bytes (its array arguments plus nbytes={task.out_bytes})"
        if footprint > self.max_pending_bytes:
            raise MemoryLimitError(
                f"{what} but max_pending_bytes is {self.max_pending_bytes}; it could never run. "
                "Raise max_pending_bytes or split the task."
            )
        budget = self.max_device_bytes.get(task.device)
        if budget is not None and self._on_device(task, footprint) > budget:
            raise MemoryLimitError(
                f"{what} but max_device_bytes for {task.device} is {budget}; it could never run. "
                f"Raise max_device_bytes for {task.device} or split the task."
            )

    def _admit(self, task: Task) -> None:
        self.submitted += 1
        self._seq += 1
        task.seq = self._seq
        for dep in task.deps:
            if dep.state == "failed" or dep.state == "cancelled":
                self._fail_from(task, dep)  # never held anything: nothing to release
                task.args, task.kwargs, task.deps, task.buffers = (), None, (), ()
                return
        self.pending += 1
        parents: list[Task] | None = [] if self._hooks else None
        for dep in task.deps:
            if dep.state not in FINAL_STATES:
                self._edge(dep, task, parents)
            elif self.edges is not None:  # tracing: a finished parent's value still flows to the child
                self.edges.append((dep.seq, task.seq))
        if task.after:  # parents it only runs after: their failure is not its own
            for parent in task.after:
                if parent.state not in FINAL_STATES:
                    self._edge(parent, task, parents)
        bytes_in = task.out_bytes
        buffers = self._buffers
        for key, nbytes, write in task.buffers:
            buf = buffers.get(key)
            if buf is None:
                buf = buffers[key] = _BufferState(nbytes)
                bytes_in += nbytes
            buf.users += 1
            writer = buf.writer
            if writer is not None:
                self._edge(writer, task, parents)
            if write:
                for reader in buf.readers:
                    self._edge(reader, task, parents)
                buf.readers = {}
                buf.writer = task
            else:
                buf.readers[task] = None
        self.pending_bytes += bytes_in
        if self.pending_bytes > self.peak_pending_bytes:
            self.peak_pending_bytes = self.pending_bytes
        if parents is not None:
            self._admitted(task, parents)
        if task.n_waiting:
            self._move(task, "waiting")
        elif self._cancelling:
            self._move(task, "waiting")
            self.cancel(task)
        else:
            if self._check:  # hot path: no call unless checking
                self._move(task, "ready")
            task.state = "ready"
            task.t_ready = self._clock()
            if task.staged == self._epoch:
                self.staged.append(task)
            else:
                self.queues[task.device].push(task)

    def _admitted(self, task: Task, parents: list[Task]) -> None:
        """Check mode: remember the task's parents; byte budgets: count its bytes for its device."""
        if self._check:
            self._live[task] = parents
        if self._budgeted:
            owner = self._owner
            device = task.device
            added = task.out_bytes
            for key, _, _ in task.buffers if task.fn is not self._host_copy or task.fn is None else ():
                if key not in owner:
                    nbytes = self._buffers[key].nbytes
                    owner[key] = (device, nbytes)
                    added += nbytes
            held = self._device_pending[device] = self._device_pending[device] + added
            if held > self._device_peak[device]:
                self._device_peak[device] = held

    def _released(self, task: Task) -> None:
        """Check mode: forget the task; a rider: off its submission's slot; byte budgets: give back its
        device's bytes (before its buffers go)."""
        if self._check:
            self._live.pop(task, None)
        if task.rides:
            self.riding -= 1
            self._copies[task.state] += 1
        elif self._rider_of or self._carried:
            self._pass_slot(task)
        if self._budgeted:
            pending = self._device_pending
            pending[task.device] -= task.out_bytes
            owner, buffers = self._owner, self._buffers
            for key, _, _ in task.buffers:
                if key not in buffers and key in owner:  # freed by this release
                    device, nbytes = owner.pop(key)
                    pending[device] -= nbytes

    def _edge(self, parent: Task, child: Task, parents: list[Task] | None) -> None:
        if parent.state == "launched" and parent.device == child.device:
            self._behind_of[parent].append(child)  # the child may launch behind it: no wait
            self._behind[child] = self._behind.get(child, 0) + 1
            self._ahead.setdefault(child, []).append(parent)
        else:
            if parent.dependents is None:
                parent.dependents = [child]
            else:
                parent.dependents.append(child)
            child.n_waiting += 1
        if parents is not None:
            parents.append(parent)
        if self.edges is not None:
            self.edges.append((parent.seq, child.seq))

    def _finalize_dependents(self, root: Task) -> None:
        """``root`` failed or was cancelled: so are, now, the tasks that take its value, transitively.

        They are final for their futures at once, but each keeps its place in
        the graph (buffers, edges) until its own parents finish: a hazard edge
        orders only through the last writer, so releasing it early would let a
        later reader overtake an earlier writer that is still running.
        A dependent made ready behind ``root``'s launch fails now if still ready;
        one running or launched fails when it concludes (``_doomed``).
        """
        work = [root]
        while work:
            parent = work.pop()
            behind = self._behind_of.get(parent) or ()
            for child in chain(parent.dependents or (), behind):
                state = child.state
                if state in FINAL_STATES or not any(dep is parent for dep in child.deps):
                    continue
                if state == "waiting":
                    self._fail_from(child, parent)
                    work.append(child)
                elif state == "ready":
                    self._unqueue(child)
                    self._fail_from(child, parent)
                    work.append(child)
                elif child not in self._doomed:  # running or launched behind it
                    self._doomed[child] = parent

    def _release_and_cascade(self, root: Task, inline_ok: bool = False, admitted: bool = True) -> Task | None:
        """Release a final task with no unfinished parents; queue dependents it made ready.

        With ``inline_ok``, the first task this release made ready is returned
        instead of queued.  Dependents that were finalized early are released in turn.
        ``admitted=False``: ``root`` was cancelled while queued for admission (it holds nothing to
        release); only the tasks ordered after it meanwhile are let go.
        """
        inline: Task | None = None
        stack: list[Task] = []  # final tasks whose last parent just finished
        task = root
        while True:
            if admitted or task is not root:
                self._release(task)
            dependents = task.dependents
            if dependents is not None:
                task.dependents = None
                for child in dependents:
                    child.n_waiting -= 1
                    if child.n_waiting:
                        continue
                    if child.state != "waiting":  # failed or cancelled through a parent earlier
                        if child not in self._behind:  # else a launched parent releases it when it completes
                            stack.append(child)
                        continue
                    if self._cancelling:
                        self._final(child, "cancelled", None)
                        self._finalize_dependents(child)
                        stack.append(child)
                        continue
                    if self._check:  # hot path: no call unless checking
                        self._move(child, "ready")
                    child.state = "ready"
                    child.t_ready = self._clock()
                    if child.staged == self._epoch:
                        self.staged.append(child)  # its burst is not handed over yet
                    elif inline_ok and inline is None and child.device == root.device:
                        inline = child
                    else:
                        self.queues[child.device].push(child)
            if not stack:
                return inline
            task = stack.pop()

    def _release(self, task: Task) -> None:
        self.pending -= 1
        buffers = self._buffers
        freed = task.out_bytes
        for key, _, write in task.buffers:
            buf = buffers[key]
            buf.users -= 1
            if buf.users == 0:
                del buffers[key]
                freed += buf.nbytes
            elif write:
                if buf.writer is task:
                    buf.writer = None
            else:
                buf.readers.pop(task, None)
        self.pending_bytes -= freed
        if self._hooks:
            self._released(task)
        # a final task no longer needs its inputs or its callable: let them go
        if task.name is None:
            task.name = name_of(task.fn)
        task.fn = None
        task.args = ()
        task.kwargs = None
        task.deps = ()
        task.buffers = ()
        if self._barriers:
            self._count_barriers(task)

    def _count_barriers(self, task: Task) -> None:
        fired = False
        for entry in self._barriers:
            if task.seq <= entry[0]:
                entry[1] -= 1
                if entry[1] == 0:
                    self.out.append(("barrier", entry[2]))
                    fired = True
        if fired:
            self._barriers = [entry for entry in self._barriers if entry[1]]

    def _fail_from(self, task: Task, parent: Task) -> None:
        """Finish ``task`` without running it because ``parent`` failed or was cancelled."""
        if parent.state == "cancelled":
            self._final(task, "cancelled", None)
        else:
            self._final(task, "failed", self._dependency_error(task, parent))

    def _dependency_error(self, task: Task, parent: Task, launched: bool = False) -> DependencyError:
        """The error of ``task``, which takes the value of ``parent``, which failed."""
        cause = parent.error
        if isinstance(cause, DependencyError) and cause.__cause__ is not None:
            cause = cause.__cause__  # point at the original failure, not the relay
            how = "did not run either"
        else:
            how = "failed"
        try:
            text = str(cause)
        except Exception:  # a user exception whose __str__ raises
            text = "<unprintable>"
        if len(text) > 200:  # the whole text is on __cause__
            text = text[:200] + "..."
        did = "has no result" if launched else "did not run"
        err = DependencyError(
            f"{task.label} (task #{task.seq}) {did}: its input {parent.label} "
            f"(task #{parent.seq}) {how}; "
            f"the original error: {type(cause).__name__}: {text}"
        )
        err.__cause__ = cause
        return err

    def _final(
        self, task: Task, state: TaskState, error: BaseException | None, admitted: bool = True
    ) -> None:
        """``task`` ends ``state``; counted unless it was never admitted (cancelled while it waited for
        admission), so that submitted == completed + failed + cancelled + pending."""
        self._move(task, state)
        task.error = error
        if admitted:
            if state == "cancelled":
                self.cancelled += 1
            else:
                self.failed += 1
        if task.watchers is not None:
            self.out.append(("resolve", task))

    def _check_finish(self, task: Task) -> None:
        assert task.state != "launched", f"finish of {task!r}: a launched task reports complete"
        assert task not in self._behind, (
            f"finish of {task!r}: launched parents have not completed; use launch/complete"
        )
        assert task not in self._doomed, (
            f"finish of {task!r}: an input failed after launch; use launch/complete"
        )

    def _fail_running(self, task: Task, error: BaseException) -> None:
        """A running task raised (or, on an asynchronous device, failed to launch)."""
        if self._check:
            assert task.state != "launched", f"finish of {task!r}: a launched task reports complete"
        parent = self._doomed.pop(task, None) if self._doomed else None
        if parent is not None:  # an input it was made ready behind failed: that is the cause
            error = self._dependency_error(task, parent)
        task.error = error
        self._move(task, "failed")
        self.failed += 1
        self._finalize_dependents(task)

    def _ready_behind(self, task: Task) -> None:
        """A waiting task's unfinished parents are all launched on its device: it may launch behind them."""
        if self._cancelling:
            self._final(task, "cancelled", None)  # keeps its place until those parents complete
            self._finalize_dependents(task)
            return
        self._move(task, "ready")
        task.t_ready = self._clock()
        if task.staged == self._epoch:
            self.staged.append(task)
        else:
            self.queues[task.device].push(task)

    def _conclude(self, task: Task, value: Any, error: BaseException | None) -> None:
        """A launched task whose launched parents have all completed ends done or failed."""
        self.launched -= 1
        parent = self._doomed.pop(task, None)
        if parent is not None:
            self._final(task, "failed", self._dependency_error(task, parent, launched=True))
            self._finalize_dependents(task)
        elif error is None:
            self._move(task, "done")
            task.value = value
            self.completed += 1
            if task.watchers is not None:
                self.out.append(("resolve", task))
        else:
            self._final(task, "failed", error)
            self._finalize_dependents(task)

    def _settle(self, root: Task) -> None:
        """``root`` concluded: pass its edges to the dependents launched behind it, then release.

        A dependent whose last launched parent this was concludes now if its
        outcome was held, and is released if it is final; iteratively, so a
        long chain completed in reverse order does not recurse.
        """
        done = [root]
        work = [root]
        behind, held = self._behind, self._held
        while work:
            task = work.pop()
            for child in self._behind_of.pop(task, ()):
                left = behind[child] - 1
                if left:
                    behind[child] = left
                    ahead = self._ahead[child]  # (by identity: a Tensor's == is an operation)
                    del ahead[next(i for i, t in enumerate(ahead) if t is task)]
                    continue
                del behind[child]
                del self._ahead[child]
                if child.n_waiting:
                    continue  # still waiting for others (or final, and released by them)
                outcome = held.pop(child, None)
                if outcome is not None:
                    self._conclude(child, *outcome)
                    work.append(child)
                    done.append(child)
                elif child.state in FINAL_STATES:
                    done.append(child)
        for task in done:
            self._release_and_cascade(task)

    def _admit_waiters(self) -> None:
        admission = self._admission
        while admission:
            task = admission[0][0]
            if task is None:  # a throttle waiter: let through only onto a free slot, which it reserves
                if self.pending - self.riding >= self._limit or self.pending_bytes >= self.max_pending_bytes:
                    return
                if self._budgeted and not self.devices_have_room():
                    return
            else:
                along = self._along.get(task) if self._along else None
                group = [*along, task] if along else [task]
                if not (self._fits_group(group) if along else self._fits(task)) and not (
                    self._budgeted and self._idle_and_held(group)
                ):
                    return
            token = admission.popleft()[1]
            if task is None:
                self._reservations.add(token)
                self._limit -= 1
            else:
                for extra in self._along.pop(task, ()) if self._along else ():
                    self._admit_rider(extra)
                self._admit(task)
                riders = self._riders_of_queued.pop(task, None) if self._riders_of_queued else None
                if riders:
                    self.ride(riders, task)
            self.out.append(("admitted", token))

    def _move(self, task: Task, state: TaskState) -> None:
        if self._check and state not in TRANSITIONS[task.state]:
            raise AssertionError(f"illegal transition {task.state} -> {state} for {task!r}")
        task.state = state

    # -- invariants ----------------------------------------------------------

    def validate(self) -> None:
        """Check every invariant; needs ``check=True`` (tracks live tasks)."""
        assert self._check, "validate() needs Scheduler(check=True)"
        live = self._live
        assert self.pending == len(live), (self.pending, len(live))
        assert self.riding == sum(t.rides or t in self._rider_of for t in live), (self.riding, live)
        assert self._rider_of.keys() <= live.keys() and self._carried.keys() <= live.keys()
        assert self.pending - self.riding <= self.max_pending or any(t.nested for t in live), (
            "over max_pending"
        )
        states = [t.state for t in live]
        behind = self._behind
        for task in live:  # final tasks stay in the graph only while a parent is unfinished
            assert task.state not in FINAL_STATES or task.n_waiting > 0 or task in behind, task
        assert self.running == states.count("running")
        assert self.launched == states.count("launched")
        for device, queue in self.queues.items():
            ready = queue.tasks()
            assert len(ready) == queue.count + queue.held, (device, len(ready), queue.count, queue.held)
            assert all(t.device == device and t in live for t in ready)
            for task in ready:  # each ready task with a fusion is listed by it, once
                if task.fusion is not None:
                    assert sum(t is task for t in queue.like(task.fusion)) == 1, (device, task)
        staged = [t for t in self.staged if t.staged == self._epoch]
        assert all(t.state == "ready" and t in live for t in staged)
        assert sum(q.count for q in self.queues.values()) + len(staged) == states.count("ready")
        for task, parents in live.items():
            # released parents are gone; one still queued for admission holds its edges
            unfinished = [p for p in parents if p in live or p.state == "admitting"]
            # an edge from a parent launched on the task's device was passed at that launch
            ahead = [p for p in unfinished if p.state == "launched" and p.device == task.device]
            assert task.n_waiting == len(unfinished) - len(ahead), (task, task.n_waiting, unfinished)
            assert behind.get(task, 0) == len(ahead), (task, behind.get(task), ahead)
            if task.state in ("ready", "running", "launched"):
                assert task.n_waiting == 0, task
            elif task.state == "waiting":
                assert task.n_waiting > 0, task
        self._validate_asynchronous()
        users: dict[int, int] = {}
        for task in live:
            for key, _, _ in task.buffers:
                users[key] = users.get(key, 0) + 1
        assert users.keys() == self._buffers.keys()
        for key, buf in self._buffers.items():
            assert buf.users == users[key], key
            assert buf.writer is None or buf.writer in live
            assert all(r in live for r in buf.readers)
        held = sum(b.nbytes for b in self._buffers.values()) + sum(t.out_bytes for t in live)
        assert self.pending_bytes == held, (self.pending_bytes, held)
        assert self.peak_pending_bytes >= self.pending_bytes
        for entry, _ in self._admission:
            assert entry is None or entry.state == "admitting"
        assert self._limit == self.max_pending - len(self._reservations), self._reservations
        self._validate_devices()

    def _validate_asynchronous(self) -> None:
        live = self._live
        launched = {t for t in live if t.state == "launched"}
        assert all(t.device in self.asynchronous for t in launched)
        assert self._behind_of.keys() == launched, (self._behind_of.keys(), launched)
        counts: dict[Task, int] = {}
        for parent, children in self._behind_of.items():
            for child in children:
                assert child in live and child.device == parent.device, (parent, child)
                counts[child] = counts.get(child, 0) + 1
        assert counts == self._behind, (counts, self._behind)
        assert {c: len(p) for c, p in self._ahead.items()} == self._behind, (self._ahead, self._behind)
        for task in self._held:
            assert task.state == "launched" and task in self._behind, task
        for task, parent in self._doomed.items():
            assert task.state in ("running", "launched") and parent.state == "failed", (task, parent)

    def _validate_devices(self) -> None:
        if not self._budgeted:
            assert not self._owner and not any(self._device_pending.values())
            return
        assert self._owner.keys() <= self._buffers.keys()  # (a host copy's host memory has no device)
        held = dict.fromkeys(self.queues, 0)
        for task in self._live:
            held[task.device] += task.out_bytes
        for key, (device, nbytes) in self._owner.items():
            assert self._buffers[key].nbytes == nbytes, key
            held[device] += nbytes
        assert held == self._device_pending, (held, self._device_pending)
        for device, nbytes in held.items():
            assert self._device_peak[device] >= nbytes, device
