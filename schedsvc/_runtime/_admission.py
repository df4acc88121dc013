"""Admission: the door every submission goes through, and the hand-off of admitted work to the workers.

``Admission.admit`` takes a whole task description into the engine under one
lock hold: it refuses it if the engine takes no work, makes the device copies
its arguments need (``DeviceCopies``), admits it within the limits or queues
it (``NOW``, ``QUEUE``, ``BLOCK``, ``OVER``), and applies the frontend's write
claims once it is in.  ``throttle`` waits for room without submitting, and
holds the slot it got for its caller's next submission.

Hand-off to workers: a submission from any thread but the event loop's goes
to the ready queue and wakes parked workers at once (or is launched at once, on
a device that launches where work is made ready).  On the loop thread, the
first ``eager`` submissions of each loop iteration do the same (so the first
tasks of a burst start immediately); later ones are *staged* -- admitted and
ordered, but held from the workers -- and handed over in one flush when the
coroutine next yields, which is when ``asyncio.create_task`` work starts too.
A submitting coroutine thus does not fight its own workers for the GIL on
every call.  Every wait flushes first, so staged work never stalls.  A device
that launches on the submitting thread (CUDA) has its tasks launched at once,
never staged.  Batched calls (tasks with a ``fusion``) made on the loop's
thread are always staged, on every device, and a wait does not flush them
(``gathering``): the calls of one turn of the loop -- a burst of requests
parsed together, a gather of many calls -- reach the workers together at its
end, and run as one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._core import FINAL_STATES, Scheduler, Task
from .._errors import stop_through_await
from ._bridge import watch
from ._threads import ThreadToken

if TYPE_CHECKING:
    from ._copies import DeviceCopies
    from ._runtime import Runtime

__all__ = ["BLOCK", "NOW", "OVER", "QUEUE", "Admission"]

#: what a submission does at the engine's limits (``rt.door.admit``): is not admitted (``submit_nowait``),
#: queues for admission FIFO and awaits (``await eng.submit``), blocks its thread in that queue (the
#: executor view), or is admitted over them (operators, which cannot wait)
NOW, QUEUE, BLOCK, OVER = 0, 1, 2, 3


class Admission:
    """Admitting tasks within the engine's limits, and staging what the loop's thread submits.

    It holds its own references to what it reads on every submission (the runtime's lock, core,
    bridge and device tables), and calls the runtime's ``collect`` through ``rt``.  In a forked
    child, ``Closing.after_fork`` gives it the new lock and closes it.
    """

    def __init__(
        self,
        rt: Runtime,
        copies: DeviceCopies,
        refusal: Callable[[], BaseException],
        gone: Callable[[], BaseException],
    ) -> None:
        self.rt = rt
        self.lock = rt.lock
        self.core = rt.core
        self.bridge = rt.bridge
        self.sync_mode = rt.sync_mode
        self.loop_thread = rt.loop_thread
        self.preparers = rt.preparers  # (the dict, filled as devices are added)
        self.forwarding = rt.forwarding
        self.metered = rt.metered  # (the list, filled as budgeted devices are added)
        self.collect = rt.collect
        #: none of the above applies (the runtime says so as devices are added): admit skips their checks
        self.plain = not self.sync_mode
        self.copies = copies
        #: why a closed engine takes no work (the frontend's message), raised by ``admit`` with the lock
        #: held: it must have no side effect (never take the lock)
        self.refusal = refusal
        #: why it takes no work once its loop has closed (raised without the lock: the frontend stops it)
        self.gone = gone
        self.worker_threads = rt.worker_threads  # (their submissions are nested)
        #: the frontend's own registration of a task's writes (``claim(task, claims)``: the Tensors it
        #: writes), made by the door once the task is admitted or queued, never for one it refuses
        self.claim_writes: Callable[[Task, Any], None] = _no_claims
        self.closed = False  # no more work is taken (nested work of running tasks still gets in)
        # throttle() callers let through onto a reserved slot that have not yielded since: (token,
        # their asyncio task); the caller's next submission takes the slot, ahead of the queue
        self.held: list[tuple[Any, Any]] = []
        #: is a flush of staged tasks scheduled on the loop, and since when (``Dispatch.next_task``
        #: takes staged tasks itself once the loop has not come round to it for a while)
        self.flush_scheduled = False
        self.eager_left = 0  # submissions of this loop iteration still handed to the workers at once
        #: batched calls are staged this turn of the loop: the flush at its end hands them over together,
        #: not the await of each
        self.gathering = False
        #: devices whose tasks are never staged (``Device.staged``): they launch on the submitting thread
        self.unstaged: set[str] = set()

    # -- the door: every submission enters here ------------------------------------

    def admit(
        self,
        task: Task,
        tid: int,
        how: int,
        claims: Any = None,
        counted: Callable[[], None] | None = None,
        timeout: float | None = None,
        riders: list[Task] | None = None,
    ) -> Any:
        """Take ``task`` (a whole task description) into the engine: the one door every way of
        submitting goes through.

        A task submitted on a thread that runs a task (``tid``) is nested.  In this order, under one
        lock hold: refuse it if the engine takes no work (its loop closed, or it closed: a nested
        task still gets in); make the copies of its arguments its device needs (part of its
        admission); admit it within the limits --
        ``how`` says what happens at them (``NOW``: not admitted, ``QUEUE``: queued for admission
        FIFO, ``BLOCK``: this thread waits in that queue, ``OVER``: admitted over them, as operators
        cannot wait) -- registering its reads and writes, and the frontend's ``claims`` on what it
        writes (``claim_writes``); hand it to its device.  A task that is not admitted leaves no
        trace: its copies are dropped, its claims never made.  A nested task (submitted by a running
        task) is admitted over the limits, and while the engine closes.  ``counted`` runs under the
        lock once it is admitted or queued.  ``riders``: tasks made to read its result (the outputs
        picked from a call's), admitted right after it, on its slot (``Scheduler.ride``).  ``BLOCK`` waits ``timeout`` seconds at most (then the task
        is cancelled).  In sync mode the task runs here once admitted, and its error is raised here.

        Returns True (admitted), False (``NOW``: at the limits; ``BLOCK``: it timed out or was
        cancelled while it waited), or with ``QUEUE`` the token to await (``admission``).
        """
        if self.bridge.closed():  # the loop is gone: the frontend stops the engine, and says why
            raise self.gone()
        if tid in self.worker_threads:
            task.nested = True
        with self.lock:
            if self.closed and not task.nested:
                raise self.refusal()
            if self.plain:  # no device copies, budgets, forwarding or sync_mode: none of their checks
                along = None
                force = how == OVER or task.nested
            else:
                along = self.copies.prepare(task) if self.preparers else None
                if self.metered:  # a budgeted device's memory, as its allocator sees it now
                    self.rt.meter()
                force = how == OVER or task.nested or self.sync_mode
            if tid != self.loop_thread:
                stage = False
            elif task.fusion is not None:
                stage = self.stage_fused()
            elif task.priority or self.eager_left:  # (stage_next's common answer, without a call)
                stage = self.stage_next(task.priority)
            else:
                stage = task.device not in self.unstaged
            core = self.core
            if force:
                admitted = core.submit(task, True, stage, along)
            else:  # (MemoryLimitError raised here, for a task that could never fit, leaves nothing behind)
                admitted = core.submit(task, False, stage, along) or self._use_reserved(
                    task, tid, stage, along
                )
            if admitted:
                if claims or counted is not None:
                    self._claim(task, claims, counted)
                if riders is not None:
                    core.ride(riders, task, stage)
            else:
                token = None
                if how != NOW:
                    token = self.bridge.token() if how == QUEUE else self._thread_token(task)
                    core.enqueue(task, token, along, riders)
                    if claims or counted is not None:
                        self._claim(task, claims, counted)
                core.publish()  # a caller about to wait, or to retry, must see progress
            after = self.collect()
        if after is not None:
            after()
        if admitted:
            if self.plain:
                return True
            if self.sync_mode:
                self._run_here(task)
                if task.state == "failed" and task.error is not None:  # its error at the call
                    error = task.error
                    if how == QUEUE and isinstance(error, StopIteration):  # (PEP 479: not through await)
                        raise stop_through_await(task, error) from error
                    raise error
                for rider in riders or ():
                    self._run_here(rider)
            elif self.forwarding:
                for admitted_task in (task, *(riders or ())):
                    self.admitted(admitted_task)
            return True
        if how == BLOCK and token is not None:
            return self._wait_admission(task, token, timeout)
        return token if how == QUEUE else False

    def hold(self, task: Task, tid: int) -> bool:
        """A batched call made on the loop's thread, admitted the short way if it can be: within the
        limits and ready at once, it is held with the others of its fusion (``Scheduler.hold``) for a
        worker to take together -- the one a previous call of it woke, or the one the flush at the end of
        this turn of the loop wakes.  False, and nothing done: ``admit`` decides (a closed engine, the
        limits, a write queued to its rows, a nested call, sync mode, devices that copy or forward)."""
        if tid != self.loop_thread or not self.plain or tid in self.worker_threads or self.bridge.closed():
            return False
        with self.lock:
            if self.closed or not self.core.hold(task):
                return False
            if not self.flush_scheduled:
                self._schedule_flush()
        return True

    def _claim(self, task: Task, claims: Any, counted: Callable[[], None] | None) -> None:
        """With the lock held, once ``task`` is admitted or queued: the frontend's claims on what it
        writes, and its count."""
        if claims:
            self.claim_writes(task, claims)
        if counted is not None:
            counted()

    async def admission(self, task: Task, token: Any, riders: tuple[Task, ...] = ()) -> None:
        """Wait, on the loop, until ``task`` -- queued by ``admit(..., QUEUE)`` -- is admitted (with its
        ``riders``, as given to ``admit``); if this wait is cancelled (or Ctrl-C arrives here), nobody
        holds the task: it is cancelled."""
        try:
            await token
        except BaseException:
            self.rt.cancel(task)  # not admitted yet, or admitted and now unwanted
            raise
        if self.forwarding:
            for admitted_task in (task, *riders):
                self.admitted(admitted_task)

    def admitted(self, task: Task) -> None:
        """``task`` was admitted waiting for parents: a device that sends work ahead may send it."""
        device = self.forwarding.get(task.device)
        if device is not None and task.state == "waiting":
            device.admitted(task)

    def _run_here(self, task: Task) -> None:
        """sync_mode: run the admitted ``task`` on this thread now."""
        rt = self.rt
        if rt.claim(task):
            rt.execute(task, chain=False)
        elif task.state not in FINAL_STATES:
            rt.wait_blocking(task, None)  # sync_mode blocks the caller, the loop's thread too

    # -- a thread blocked at the limits --------------------------------------------

    def _thread_token(self, task: Task) -> ThreadToken:
        """A token a thread blocks on until ``task`` is admitted, or cancelled while it waits."""
        token = ThreadToken()
        self.rt.other_loops = True  # its watcher is woken off the loop
        watch(task, token)  # cancelled while queued (fut.cancel()): this thread is woken too
        return token

    def _wait_admission(self, task: Task, token: ThreadToken, timeout: float | None) -> bool:
        """Block this thread (not the event loop's) until ``task`` is admitted; False if it was cancelled
        while it waited, or ``timeout`` passed first (it is cancelled then).  A close that cancels
        pending work raises its error here."""
        try:
            woken = token.wait(timeout)
        except BaseException:  # interrupted (Ctrl-C): not wanted, admitted or not
            if self._give_up(task):
                self.rt.cancel(task)
            raise
        if not woken and not self._give_up(task):
            return False
        if token.error is not None:
            raise token.error
        if task.state == "cancelled":
            return False
        if self.forwarding:
            self.admitted(task)
        return True

    def _give_up(self, task: Task) -> bool:
        """A blocked submission stops waiting: cancel its task unless it got in; True if it did."""
        with self.lock:
            if task.state != "admitting":
                return task.state != "cancelled"
            self.core.cancel(task)
            after = self.rt.collect()
        if after is not None:
            after()
        return False

    # -- throttle: room without a submission ------------------------------------------

    def _use_reserved(self, task: Task, tid: int, stage: bool, along: list[Task] | None) -> bool:
        """With the lock held, ``task`` did not fit: admit it on the slot throttle() let its caller onto."""
        if not self.held or tid != self.loop_thread:
            return False
        caller = self.bridge.current()
        if caller is None:
            return False
        for entry in self.held:
            if entry[1] == caller:  # (asyncio: the task itself; trio: the task and its yields so far)
                self.held.remove(entry)
                return self.core.submit_reserved(task, entry[0], stage, along)
        return False

    async def throttle(self) -> None:
        """Wait until the engine is under its limits (``Engine.throttle``)."""
        core = self.core
        with self.lock:
            if self.metered:
                self.rt.meter()
            # under both limits, nobody queued, no busy device over its budget: what lets a waiter through
            if core.has_room(1) and (not core.budgeted or core.devices_have_room()):
                return
            token = self.bridge.token()
            core.enqueue(None, token)
            core.publish()  # we are about to wait: let staged work run
            after = self.rt.collect()
        if after is not None:
            after()
        try:
            await token
        except BaseException:  # cancelled: still queued, or let through after all: give the slot back
            self.rt.under_lock(_leave_queue, core, token)
            raise
        caller = self.bridge.current()
        if caller is None or self.bridge.foreign(token):  # a slot is held only on the engine's loop
            self.rt.under_lock(core.unreserve, token)
            return
        entry = (token, caller)
        self.held.append(entry)
        self.bridge.call_soon(self._unhold, entry)  # runs once this caller has yielded

    def _unhold(self, entry: tuple[Any, Any]) -> None:
        """A throttle caller yielded without submitting: its reserved slot goes to the next in line."""
        if entry in self.held:
            self.held.remove(entry)
            self.rt.under_lock(self.core.unreserve, entry[0])

    # -- staging on the loop's thread -------------------------------------------------

    def stage_next(self, priority: int) -> bool:
        """With the lock held, on the loop thread: should the next submission be staged?

        A task with a priority other than the default is never staged, and
        first makes everything staged visible: priorities order only what the
        workers can see.
        """
        if priority:
            self.core.publish()
            return False
        if self.eager_left > 0:
            self.eager_left -= 1
            if self.eager_left == 0 and not self.flush_scheduled:
                self._schedule_flush()  # the flush re-arms the budget
            return False
        return True

    def stage_fused(self) -> bool:
        """With the lock held, on the loop thread: a batched call is staged, so that the calls of this turn
        of the loop -- coroutines that each call and await, a gather of many calls -- reach the workers (or
        are launched) as one batch by the flush at its end.  Until then an await does not hand staged work
        over (``gathering``)."""
        self.gathering = True
        if not self.flush_scheduled:
            self._schedule_flush()
        return True

    def _schedule_flush(self) -> None:
        """With the lock held, on the loop thread: the flush at the end of this turn of the loop (once)."""
        self.flush_scheduled = True
        self.bridge.call_soon(self._flush)

    def flush(self) -> None:
        """Hand staged tasks to the workers now (before this thread waits)."""
        self.rt.under_lock(self.core.publish)

    def _flush(self) -> None:
        self.rt.under_lock(self._rearm_and_publish)

    def _rearm_and_publish(self) -> None:
        self.flush_scheduled = self.gathering = False
        self.eager_left = sum(d.eager for d in self.rt.devices.values())
        self.core.publish()

    def close_and_publish(self) -> None:
        """With the lock held: take no more work, and hand what is staged to the workers."""
        self.closed = True
        self.core.publish()


def _no_claims(task: Task, claims: Any) -> None:
    raise AssertionError(f"{task!r} claims writes, but no frontend registers them")


def _leave_queue(core: Scheduler, token: Any) -> None:
    """A cancelled throttle() leaves the admission queue, or gives back the slot it was let through onto."""
    if not core.withdraw(token):
        core.unreserve(token)
