"""The scheduling state machine: events in, instructions out.

Pure and synchronous: no threads, no event loop, no array library.  The
runtime owns the only lock and calls one method per event while holding it.

Events are the public methods (the runtime calls them directly; no event
object is allocated per task):

* ``submit(task, force, stage)``  admit a task now, or report that it does not fit
* ``publish()``           end the current burst: staged tasks become visible to ``take``
* ``enqueue(task, token)`` queue a task for admission, FIFO, until it fits
* ``take(device)``         a worker asks for the next ready task
* ``finish(task, value, error)``  a running task returned or raised
* ``finish_cancelled(task)``  a running task was cancelled where it was sent
  (a remote executor: taken from the core, not started on the cluster yet)
* ``cancel(task)``         cancel a task that has not started
* ``withdraw(token)``      a ``throttle`` waiter gave up
* ``unreserve(token)``    a ``throttle`` waiter that was let through gives its slot back
* ``barrier(token)``       wake ``token`` once every task admitted so far is final

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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from .._errors import DependencyError, MemoryLimitError
from ._queue import ReadyQueue
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

    def __init__(
        self,
        *,
        max_pending: int,
        max_pending_bytes: int,
        devices: Iterable[str] = ("cpu",),
        clock: Callable[[], float] | None = None,
        check: bool = False,
    ) -> None:
        self.max_pending = max_pending
        # throttle waiters let through that have not used or given back their slot yet
        self._reservations: set[Any] = set()
        self._limit = max_pending  # max_pending - reserved: what a task must stay under to be admitted
        self.max_pending_bytes = max_pending_bytes
        self.queues: dict[str, ReadyQueue] = {d: ReadyQueue() for d in devices}
        self.out: list[Instruction] = []
        self.pending = 0  # admitted, not final
        self.pending_bytes = 0
        self.peak_pending_bytes = 0
        self.running = 0
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
        self._buffers: dict[int, _BufferState] = {}
        self._admission: deque[tuple[Task | None, Any]] = deque()
        self._barriers: list[list[Any]] = []  # [last seq, unfinished count, token]
        self._live: dict[Task, list[Task]] = {}  # check mode: live task -> its parents
        #: while a timeline is recorded: every edge made, as (parent seq, child seq)
        self.edges: list[tuple[int, int]] | None = None

    # -- events --------------------------------------------------------------

    def submit(self, task: Task, force: bool = False, stage: bool = False) -> bool:
        """Admit ``task`` if it fits (``force``: regardless); False leaves it untouched.

        ``stage``: the task belongs to the current burst; whenever it becomes
        ready before the next ``publish()`` it is held back from ``take`` (the
        runtime batches hand-offs this way).  Raises MemoryLimitError if the
        task alone exceeds max_pending_bytes.
        """
        footprint = task.out_bytes
        for buffer in task.buffers:
            footprint += buffer[1]
        if footprint > self.max_pending_bytes:
            raise MemoryLimitError(
                f"{task!r} needs {footprint} bytes (its array arguments plus nbytes={task.out_bytes}) "
                f"but max_pending_bytes is {self.max_pending_bytes}; it could never run. "
                "Raise max_pending_bytes or split the task."
            )
        if not force and (self._admission or not self._fits(task)):
            return False
        if stage:
            task.staged = self._epoch
        self._admit(task)
        return True

    def publish(self) -> None:
        """Move the staged ready tasks into their ready queues, in submission order."""
        epoch = self._epoch
        self._epoch += 1
        staged, self.staged = self.staged, []
        for task in staged:
            if task.staged == epoch:  # not claimed or cancelled meanwhile
                self.queues[task.device].push(task)

    def enqueue(self, task: Task | None, token: Any) -> None:
        """Queue ``task`` for admission; ``("admitted", token)`` follows when it gets in.

        With ``task=None`` the token just waits for room (``throttle``).
        """
        if task is not None:
            self._move(task, "admitting")
        self._admission.append((task, token))
        self._admit_waiters()

    def take(self, device: str) -> Task | None:
        """Hand the next ready task of ``device`` to a worker (ready -> running)."""
        task = self.queues[device].pop()
        if task is not None:
            if self._check:  # hot path: no call unless checking
                self._move(task, "running")
            task.state = "running"
            self.running += 1
        return task

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

        The returned task (already ``running``) is the first this completion
        made ready, on the same device, and no queued task outranks it; the
        caller should run it without a queue hand-off.  ``chain=False``: queue
        it instead.
        """
        self.running -= 1
        if error is None:
            task.value = value
            if self._check:  # hot path: no call unless checking
                self._move(task, "done")
            task.state = "done"
            self.completed += 1
        else:
            task.error = error
            self._move(task, "failed")
            self.failed += 1
            self._finalize_dependents(task)
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

    def finish_cancelled(self, task: Task) -> None:
        """A running task ends ``cancelled``: its executor cancelled it before it started there.

        Only a remote executor can (``cancel`` refuses a running task: a worker
        thread cannot be stopped): the task was taken and sent, and the cluster
        dropped it unrun.  It ends as a task cancelled here would, and so do the
        tasks that take its value.
        """
        self.running -= 1
        self._final(task, "cancelled", None)
        self._finalize_dependents(task)
        self._release_and_cascade(task, inline_ok=False)
        if self._admission:
            self._admit_waiters()

    def cancel(self, task: Task) -> bool:
        """Cancel a task that has not started, and every task that takes its value."""
        state = task.state
        if state == "admitting":
            self._admission = deque(e for e in self._admission if e[0] is not task)
            self._final(task, "cancelled", None)
            self._admit_waiters()  # those queued behind it may fit now
            return True
        if state == "new":
            self._final(task, "cancelled", None)
            return True
        if state not in ("waiting", "ready"):
            return False
        if state == "ready":
            self._unqueue(task)
        self._final(task, "cancelled", None)
        self._finalize_dependents(task)
        if task.n_waiting == 0:
            self._release_and_cascade(task)
        # else it keeps its place in the order until its parents finish
        if self._admission:
            self._admit_waiters()
        return True

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

    def submit_reserved(self, task: Task, token: Any, stage: bool = False) -> bool:
        """Admit ``task`` on the slot reserved for ``token``, ahead of the queue (it was let through first).

        The reservation is used up either way; False (no such reservation, or
        the task does not fit: its bytes, or tasks forced in over the limits)
        leaves the task untouched.
        """
        if not self._release_reservation(token):
            return False
        if self._fits(task):
            return self.submit(task, force=True, stage=stage)
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
                self._final(task, "cancelled", None)
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

    def has_room(self, nbytes: int = 0) -> bool:
        """Would a task holding ``nbytes`` new bytes be admitted now, without waiting?"""
        return (
            not self._admission
            and self.pending < self._limit
            and self.pending_bytes + nbytes <= self.max_pending_bytes
        )

    @property
    def waiting_admission(self) -> int:
        return len(self._admission)

    def ready_count(self, device: str) -> int:
        return self.queues[device].count

    # -- internals -----------------------------------------------------------

    def _unqueue(self, task: Task) -> None:
        if task.staged == self._epoch:
            task.staged = 0  # still in self.staged: publish() skips it
        else:
            self.queues[task.device].discard()

    def _release_reservation(self, token: Any) -> bool:
        if token not in self._reservations:
            return False
        self._reservations.remove(token)
        self._limit += 1
        return True

    def _fits(self, task: Task) -> bool:
        if self.pending >= self._limit:  # hot path: one compare, reserved slots included
            return False
        need = task.out_bytes
        known = self._buffers
        for key, nbytes, _ in task.buffers:
            if key not in known:
                need += nbytes
        return self.pending_bytes + need <= self.max_pending_bytes

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
        parents: list[Task] | None = [] if self._check else None
        for dep in task.deps:
            if dep.state not in FINAL_STATES:
                self._edge(dep, task, parents)
            elif self.edges is not None:  # tracing: a finished parent's value still flows to the child
                self.edges.append((dep.seq, task.seq))
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
            self._live[task] = parents
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

    def _edge(self, parent: Task, child: Task, parents: list[Task] | None) -> None:
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
        """
        work = [root]
        while work:
            parent = work.pop()
            for child in parent.dependents or ():
                if child.state == "waiting" and any(dep is parent for dep in child.deps):
                    self._fail_from(child, parent)
                    work.append(child)

    def _release_and_cascade(self, root: Task, inline_ok: bool = False) -> Task | None:
        """Release a final task with no unfinished parents; queue dependents it made ready.

        With ``inline_ok``, the first task this release made ready is returned
        instead of queued.  Dependents that were finalized early are released in turn.
        """
        inline: Task | None = None
        stack: list[Task] = []  # final tasks whose last parent just finished
        task = root
        while True:
            self._release(task)
            dependents = task.dependents
            if dependents is not None:
                task.dependents = None
                for child in dependents:
                    child.n_waiting -= 1
                    if child.n_waiting:
                        continue
                    if child.state != "waiting":
                        stack.append(child)  # failed or cancelled through a parent earlier
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
        if self._check:
            self._live.pop(task, None)

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
            err = DependencyError(
                f"{task.label} (task #{task.seq}) did not run: its input {parent.label} "
                f"(task #{parent.seq}) {how}; "
                f"the original error: {type(cause).__name__}: {text}"
            )
            err.__cause__ = cause
            self._final(task, "failed", err)

    def _final(self, task: Task, state: TaskState, error: BaseException | None) -> None:
        self._move(task, state)
        task.error = error
        if state == "cancelled":
            self.cancelled += 1
        else:
            self.failed += 1
        if task.watchers is not None:
            self.out.append(("resolve", task))

    def _admit_waiters(self) -> None:
        admission = self._admission
        while admission:
            task = admission[0][0]
            if task is None:  # a throttle waiter: let through only onto a free slot, which it reserves
                if self.pending >= self._limit or self.pending_bytes >= self.max_pending_bytes:
                    return
            elif not self._fits(task):
                return
            token = admission.popleft()[1]
            if task is None:
                self._reservations.add(token)
                self._limit -= 1
            else:
                self._admit(task)
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
        assert self.pending <= self.max_pending or any(t.nested for t in live), "over max_pending"
        states = [t.state for t in live]
        for task in live:  # final tasks stay in the graph only while a parent is unfinished
            assert task.state in ("waiting", "ready", "running") or task.n_waiting > 0, task
        assert self.running == states.count("running")
        for device, queue in self.queues.items():
            ready = queue.tasks()
            assert len(ready) == queue.count, (device, len(ready), queue.count)
            assert all(t.device == device and t in live for t in ready)
        staged = [t for t in self.staged if t.staged == self._epoch]
        assert all(t.state == "ready" and t in live for t in staged)
        assert sum(q.count for q in self.queues.values()) + len(staged) == states.count("ready")
        for task, parents in live.items():
            unfinished = [p for p in parents if p in live]  # released parents are gone
            assert task.n_waiting == len(unfinished), (task, task.n_waiting, unfinished)
            assert (task.state in ("ready", "running")) == (task.n_waiting == 0), task
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
