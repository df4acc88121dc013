"""The runtime: the one door to the scheduling core and its lock.

Frontend calls (submit, cancel, throttle, waitall, stats) and executor reports
(take, finish) arrive here as methods; each takes the lock, applies core
events, and routes what they produced (``collect``): wake a parked worker,
resolve a future, admit a waiter.  Nothing outside ``_runtime/`` and ``_core/``
touches the core or the lock.

Hand-off to workers: a submission from any thread but the event loop's goes
to the ready queue and wakes parked workers at once.  On the loop thread, the
first ``eager`` submissions of each loop iteration do the same (so the first
tasks of a burst start immediately); later ones are *staged* -- admitted and
ordered, but held from the workers -- and handed over in one flush when the
coroutine next yields, which is when ``asyncio.create_task`` work starts too.
A submitting coroutine thus does not fight its own workers for the GIL on
every call.  Every wait flushes first, so staged work never stalls.

What the event loop must learn goes through the bridge (``_bridge``).
Threads blocked in ``result()`` wait on a plain lock that the finishing
worker releases directly, and a coroutine awaiting on another event loop is
woken on its own loop directly (``settle``), so neither needs the engine's
loop.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import types
from collections import deque
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import numpy as np

from .._core import FINAL_STATES, Scheduler, Task
from .._errors import FORKED, EngineClosed, SchedsvcError
from .._timeline import Timeline
from ._bridge import Bridge, fire, open_bridge, settle, unwatch, watch
from ._copies import Copies
from ._scan import register_buffer_types, replace_leaves, substitute, substitute_args
from ._threads import ThreadToken

if TYPE_CHECKING:
    from ..devices import Executor

__all__ = ["BLOCK", "NOW", "OVER", "QUEUE", "Fusion", "Runtime", "current_worker", "set_worker"]

#: what a submission does at the engine's limits (``Runtime.admit``): is not admitted (``submit_nowait``),
#: queues for admission FIFO and awaits (``await eng.submit``), blocks its thread in that queue (the
#: executor view), or is admitted over them (operators, which cannot wait)
NOW, QUEUE, BLOCK, OVER = 0, 1, 2, 3


_SPINS = 16  # GIL yields before a contended acquire blocks
#: how long tasks staged on the loop's thread wait for the loop to hand them over before a worker
#: with nothing to do takes them itself (the loop is busy: it has not come round to its flush)
_STALE_S = 0.002

_LockType = type(threading.Lock())
_local = threading.local()


class Fusion(Protocol):
    """What a task's ``fusion`` is: how the ready tasks that share it run as one, on the worker that took
    one of them (``Runtime.execute``).  It is compared by identity."""

    #: the most weight one run takes
    limit: int

    def weight(self, task: Task) -> int:
        """The share of ``limit`` that ``task`` takes (its rows, say)."""
        ...

    def run(
        self, tasks: list[Task], args: list[Any]
    ) -> tuple[list[tuple[Any, BaseException | None]], dict[str, Any]]:
        """Run ``tasks`` (their arguments, values in place of futures, are ``args``) as one; each one's
        (value, error), in order, and what the trace shows of the run.  Raises nothing."""
        ...


def set_worker(worker: Any) -> None:
    """This thread is ``worker``'s (an executor's thread): ``current_worker`` returns it here."""
    _local.worker = worker


def current_worker() -> Any:
    """The worker object running on this thread, or None outside workers."""
    return getattr(_local, "worker", None)


class Runtime:
    """Scheduler + lock + executors + loop bridge: the one door to the core, for the frontend and the
    executors alike.  Each method takes the lock, applies core events, and acts on what they produced
    (``collect``) once the lock is released."""

    def __init__(
        self,
        core: Scheduler,
        inline_threshold_s: float = 0.0,
        refusal: Callable[[], BaseException] | None = None,
        sync_mode: bool = False,
    ) -> None:
        self.core = core
        self.sync_mode = sync_mode  # debugging: every task runs at its submission, in the caller
        self.inline_threshold_s = inline_threshold_s
        self._costs: dict[Any, float] = {}  # (code, log2 input bytes) -> seconds, smoothed
        self.lock = threading.Lock()
        #: the bridge for the async library that runs the engine's start (asyncio, trio)
        self.bridge = open_bridge(self)
        self.loop = self.bridge.loop  # the asyncio loop; None on trio
        #: ``await rt.wait(task)``: wait on the event loop until ``task`` is final (the bridge's own
        #: method, bound here: no frame of the runtime's on the path of every await)
        self.wait = self.bridge.wait
        #: why a closed engine takes no work (the frontend's message), raised by the submit methods
        #: with the lock held: it must have no side effect (never take the lock)
        self.refusal: Callable[[], BaseException] = refusal or (lambda: EngineClosed("the engine is closed"))
        #: the frontend's own registration of a task's writes (``claim(task, claims)``: the Tensors it
        #: writes), made by the door once the task is admitted or queued, never for one it refuses
        self.claim_writes: Callable[[Task, Any], None] = _no_claims
        self.devices: dict[str, Executor] = {}
        self._pools: list[tuple[Executor, Any]] = []  # (executor, its ready queue), for collect()
        self.anywhere: set[str] = set()  # devices whose queued task any thread may run itself
        self.forwarding: dict[str, Executor] = {}  # executors told of tasks admitted waiting (admitted)
        #: executors whose devices have memory of their own, which rewrite tasks at submission so their
        #: arguments are copied in (and device values copied out for other devices' tasks): ``prepare``
        self.preparers: dict[str, Executor] = {}
        self.copies: Copies | None = None
        self.timeline: Timeline | None = None  # set while a trace is recorded (eng.trace)
        self.worker_threads: set[int] = set()  # idents of threads that run tasks
        self.loop_thread = threading.get_ident()
        self.queue_waits: deque[float] = deque(maxlen=8192)
        self.closed = False
        self.forked = False  # this is a child process forked after the engine started: nothing runs here
        #: has a coroutine on another event loop awaited a task of this engine, or a thread (ThreadToken)
        #: waited for one?  From then on, collect looks for watchers to wake off this loop
        self.other_loops = False
        self.remote = False  # tasks run in other processes (Dask): values are Remote handles
        # throttle() callers let through onto a reserved slot that have not yielded since: (token,
        # their asyncio task); the caller's next submission takes the slot, ahead of the queue
        self.held: list[tuple[Any, Any]] = []
        self._flush_scheduled = False
        self._staged_since = 0.0  # when this burst's flush was scheduled (next_task: a stalled loop)
        self._eager_left = 0
        #: ``until`` waiters: (predicate, token); while any waits, each scheduling event re-checks them
        self._conditions: list[tuple[Callable[[], bool], Any]] = []
        self._recheck_scheduled = False

    def add_device(self, name: str, executor: Executor) -> None:
        self.devices[name] = executor
        self._pools.append((executor, self.core.queues[name]))
        self._eager_left += executor.eager
        register_buffer_types(executor.buffer_types)
        if executor.runs_anywhere:
            self.anywhere.add(name)
        if executor.forwards:
            self.forwarding[name] = executor
        if executor.prepares:
            self.preparers[name] = executor
            self.copies = Copies()
        if not executor.local:
            self.remote = True
            self.inline_threshold_s = 0.0  # no task runs in this process: none runs inline

    # -- called with the lock held -------------------------------------------

    def stage_next(self, priority: int) -> bool:
        """With the lock held, on the loop thread: should the next submission be staged?

        A task with a priority other than the default is never staged, and
        first makes everything staged visible: priorities order only what the
        workers can see.
        """
        if priority:
            self.core.publish()
            return False
        if self._eager_left > 0:
            self._eager_left -= 1
            if self._eager_left == 0 and not self._flush_scheduled:
                self._flush_scheduled = True  # the flush re-arms the budget
                self._staged_since = time.perf_counter()
                self.bridge.call_soon(self._flush)
            return False
        return True

    def collect(self) -> Callable[[], None] | None:
        """Route the core's instructions; return what to do once the lock is released."""
        core = self.core
        timeline = self.timeline
        if timeline is not None:  # Timeline.sample, inlined: this runs at every scheduling event
            timeline.counters.extend((time.perf_counter(), core.pending, core.pending_bytes))
        wakes: list[Callable[[], None]] | None = None  # hot path: most calls route nothing
        if core.out:
            wakes = []
            bridge = self.bridge
            items = core.drain()
            foreign = False
            for item in items:
                if item[0] == "resolve":
                    if self._resolve_elsewhere(item[1], wakes):
                        foreign = True  # nobody waits on the loop: it is not woken for this task
                elif bridge.foreign(item[1]):  # a token awaited on another loop: woken there
                    wakes.append(functools.partial(settle, item[1]))
                    foreign = True
            if foreign:
                items = _without_foreign(items, bridge)
            if items:
                bridge.post(items, wakes)
        for executor, queue in self._pools:
            if not executor.hungry or not queue.count:
                continue
            wake = executor.notify(queue.count)
            if wake is not None:
                if wakes is None:
                    wakes = []
                wakes.append(wake)
        if self._conditions:  # somebody waits for a state (until): re-check it on the loop, off the lock
            if wakes is None:
                wakes = []
            wakes.append(self._recheck_soon)
        if not wakes:
            return None
        if len(wakes) == 1:
            return wakes[0]
        return functools.partial(_call_all, wakes)  # (a lambda would make `wakes` a cell at every call)

    def under_lock(self, event: Callable[..., Any], *args: Any) -> Any:
        """Apply one core event (off the hot path), then act on what it produced."""
        with self.lock:
            result = event(*args)
            after = self.collect()
        if after is not None:
            after()
        return result

    def flush(self) -> None:
        """Hand staged tasks to the workers now (before this thread waits)."""
        self.under_lock(self.core.publish)

    def _flush(self) -> None:
        self.under_lock(self._rearm_and_publish)

    def _rearm_and_publish(self) -> None:
        self._flush_scheduled = False
        self._eager_left = sum(d.eager for d in self.devices.values())
        self.core.publish()

    def _resolve_elsewhere(self, task: Task, wakes: list[Callable[[], None]]) -> bool:
        """Wake who waits for ``task`` outside this loop (threads, other loops) directly, not through it;
        True if that was everyone (the loop has nothing to do for it).

        A thread's gate or token, or a future of another loop, is also taken off the task's watchers
        (rare), so this loop's drain fires only its own, and a task only threads wait for does not wake
        the loop at all.
        """
        elsewhere = False
        other_loops = self.other_loops
        for watcher in task.watchers or ():
            if type(watcher) is _LockType:
                wakes.append(watcher.release)
                elsewhere = True
            elif other_loops and self.bridge.foreign(watcher):
                wakes.append(functools.partial(settle, watcher))
                elsewhere = True
        if elsewhere:
            foreign = self.bridge.foreign
            task.watchers = [
                w for w in task.watchers or () if type(w) is not _LockType and not foreign(w)
            ] or None
            return task.watchers is None
        return False

    # -- the door: every submission enters here ------------------------------------

    def admit(
        self,
        task: Task,
        tid: int,
        how: int,
        claims: Any = None,
        counted: Callable[[], None] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Take ``task`` (a whole task description) into the engine: the one door every way of
        submitting goes through.

        In this order, under one lock hold: refuse it if the engine takes no work; make the copies
        of its arguments its device needs (part of its admission); admit it within the limits --
        ``how`` says what happens at them (``NOW``: not admitted, ``QUEUE``: queued for admission
        FIFO, ``BLOCK``: this thread waits in that queue, ``OVER``: admitted over them, as operators
        cannot wait) -- registering its reads and writes, and the frontend's ``claims`` on what it
        writes (``claim_writes``); hand it to its executor.  A task that is not admitted leaves no
        trace: its copies are dropped, its claims never made.  A nested task (submitted by a running
        task) is admitted over the limits, and while the engine closes.  ``counted`` runs under the
        lock once it is admitted or queued.  ``BLOCK`` waits ``timeout`` seconds at most (then the task
        is cancelled).

        Returns True (admitted), False (``NOW``: at the limits; ``BLOCK``: it timed out or was
        cancelled while it waited), or with ``QUEUE`` the token to await (``admission``).
        """
        token = None
        with self.lock:
            if self.closed and not task.nested:
                raise self.refusal()
            along = self._prepare(task) if self.preparers else None
            stage = tid == self.loop_thread and self.stage_next(task.priority)
            core = self.core
            if how == OVER or task.nested or self.sync_mode:
                admitted = core.submit(task, True, stage, along)
            else:  # (MemoryLimitError raised here, for a task that could never fit, leaves nothing behind)
                admitted = core.submit(task, False, stage, along) or self._use_reserved(
                    task, tid, stage, along
                )
            if not admitted:
                if how != NOW:
                    token = self.bridge.token() if how == QUEUE else self._thread_token(task)
                    core.enqueue(task, token, along)
                core.publish()  # a caller about to wait, or to retry, must see progress
            if admitted or token is not None:
                if claims:
                    self.claim_writes(task, claims)
                if counted is not None:
                    counted()
            after = self.collect()
        if after is not None:
            after()
        if admitted:
            if self.sync_mode:
                self._run_here(task)
            elif self.forwarding:
                self.admitted(task)
            return True
        if how == BLOCK and token is not None:
            return self._wait_admission(task, token, timeout)
        return token if how == QUEUE else False

    async def admission(self, task: Task, token: Any) -> None:
        """Wait, on the loop, until ``task`` -- queued by ``admit(..., QUEUE)`` -- is admitted; if this
        wait is cancelled (or Ctrl-C arrives here), nobody holds the task: it is cancelled."""
        try:
            await token
        except BaseException:
            self.cancel(task)  # not admitted yet, or admitted and now unwanted
            raise
        if self.forwarding:
            self.admitted(task)

    def _thread_token(self, task: Task) -> ThreadToken:
        """A token a thread blocks on until ``task`` is admitted, or cancelled while it waits."""
        token = ThreadToken()
        self.other_loops = True  # its watcher is woken off the loop
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
                self.cancel(task)
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
            after = self.collect()
        if after is not None:
            after()
        return False

    def watch_off_loop(self, task: Task, then: Callable[[], object]) -> None:
        """Call ``then()`` where ``task`` becomes final, off the event loop (the thread that finished or
        cancelled it), once the lock is released.  ``task`` is new: nobody else sees it yet."""
        self.other_loops = True  # (collect looks for watchers woken elsewhere from now on)
        watch(task, ThreadToken(then))

    def _prepare(self, task: Task) -> list[Task] | None:
        """With the lock held, before ``task`` is admitted, on an engine with devices of their own memory:
        its device's executor moves host arguments in as copy tasks; a task elsewhere taking such a
        device's value gets a copy task out instead; a write drops the copies of what it writes.
        Returns the copy tasks made for it (admitted with it, or not at all), if any."""
        copies = self.copies
        assert copies is not None
        if task.buffers:
            copies.written(task)
        along: list[Task] = []
        preparer = self.preparers.get(task.device)
        if preparer is not None:
            preparer.prepare(task, along.append, copies)
            return along or None
        for owner in self.preparers.values():
            if task.fn == owner.to_host:  # a copy out is not copied out again
                return None
        # the values it takes that live on such a device (its results, or its arrays passed as they
        # are) are copied out first, each by a copy task that reads that memory (so it is ordered
        # after writes to it); its other dependencies on them only order it
        swapped: dict[int, Task] = {}
        out_of_devices = functools.partial(self._copy_out, task, swapped)
        args = replace_leaves(task.args, out_of_devices)
        kwargs = replace_leaves(task.kwargs, out_of_devices) if task.kwargs else task.kwargs
        if not swapped:
            return None
        task.args, task.kwargs = args, kwargs
        task.deps = (*(d for d in task.deps if id(d) not in swapped), *swapped.values())
        return list(swapped.values())

    def _copy_out(self, task: Task, swapped: dict[int, Task], value: Any) -> Any:
        """``value`` as ``task`` (elsewhere) takes it: if it lives on a device of its own memory (a task
        of that device, or one of its arrays), the copy task bringing it to the host, made once per
        value (``swapped``, by the id of what it copies)."""
        if isinstance(value, Task):
            owner = self.preparers.get(value.device)
        else:
            for owner in self.preparers.values():
                if owner.holds(value):  # a device array passed as it is
                    break
            else:
                return value
        if owner is None:
            return value
        copy = swapped.get(id(value))
        if copy is None:
            copy = swapped[id(value)] = owner.host_copy(value, task)
        return copy

    def admitted(self, task: Task) -> None:
        """``task`` was admitted waiting for parents: an executor that sends work ahead may send it."""
        executor = self.forwarding.get(task.device)
        if executor is not None and task.state == "waiting":
            executor.admitted(task)

    def _run_here(self, task: Task) -> None:
        """sync_mode: run the admitted ``task`` on this thread now."""
        if self.claim(task):
            self.execute(task, chain=False)
        elif task.state not in FINAL_STATES:
            self.wait_blocking(task, None)  # sync_mode blocks the caller, the loop's thread too

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
            if core.has_room(1):  # under both limits, nobody queued: what lets a waiter through
                return
            token = self.bridge.token()
            core.enqueue(None, token)
            core.publish()  # we are about to wait: let staged work run
            after = self.collect()
        if after is not None:
            after()
        try:
            await token
        except BaseException:  # cancelled: still queued, or let through after all: give the slot back
            self.under_lock(_leave_queue, core, token)
            raise
        caller = self.bridge.current()
        if caller is None or self.bridge.foreign(token):  # a slot is held only on the engine's loop
            self.under_lock(core.unreserve, token)
            return
        entry = (token, caller)
        self.held.append(entry)
        self.bridge.call_soon(self._unhold, entry)  # runs once this caller has yielded

    def _unhold(self, entry: tuple[Any, Any]) -> None:
        """A throttle caller yielded without submitting: its reserved slot goes to the next in line."""
        if entry in self.held:
            self.held.remove(entry)
            self.under_lock(self.core.unreserve, entry[0])

    async def barrier(self) -> None:
        """Wait until every task admitted so far is final."""
        with self.lock:
            if self.core.pending == 0:
                return
            token = self.bridge.token()
            self.core.barrier(token)
            self.core.publish()
            after = self.collect()
        if after is not None:
            after()
        await token

    def cancel(self, task: Task) -> bool:
        """Cancel ``task`` (and what takes its value) if it has not started; True if it is cancelled,
        or its executor cancelled it where it was sent."""
        self.under_lock(self.core.cancel, task)
        executor = self.devices.get(task.device)
        sent = executor is not None and executor.cancel(task)  # (sent ahead while waiting, say)
        return task.state == "cancelled" or sent

    def add_done_callback(self, task: Task, fn: Callable[[Any], Any]) -> None:
        """Call ``fn(task)`` on the loop once ``task`` is final."""
        with self.lock:
            if task.state not in FINAL_STATES:
                watch(task, fn)
                return
        self.bridge.call_soon_threadsafe(fire, fn, task)

    # -- state, for the frontend -------------------------------------------------

    def counts(self) -> tuple[int, int, int, int, int, int, int, int, int]:
        """(submitted, completed, failed, cancelled, pending, running, waiting admission, pending bytes,
        peak pending bytes), read together."""
        core = self.core
        with self.lock:
            return (
                core.submitted,
                core.completed,
                core.failed,
                core.cancelled,
                core.pending,
                core.running,
                core.waiting_admission,
                core.pending_bytes,
                core.peak_pending_bytes,
            )

    @property
    def pending(self) -> int:
        """Tasks admitted and not final (read without the lock: one int)."""
        return self.core.pending

    def describe(self) -> str:
        """The load, for a repr (read without the lock: a snapshot that may be a moment old)."""
        core = self.core
        return (
            f"pending={core.pending}/{core.max_pending} running={core.running} "
            f"bytes={core.pending_bytes}/{core.max_pending_bytes}"
        )

    def writer_of(self, key: int) -> Task | None:
        """The last unfinished task queued to write the memory ``key`` (a Tensor made over it waits for it)."""
        with self.lock:
            return self.core.writer_of(key)

    def has_room(self, nbytes: int) -> bool:
        with self.lock:
            return self.core.has_room(nbytes)

    def limits_text(self) -> str:
        """The limits and what holds them, for a QueueFull message."""
        core = self.core
        held = f", {core.reserved} slots held by throttle() callers" if core.reserved else ""
        return (
            f"{core.pending}/{core.max_pending} tasks{held}, "
            f"{core.pending_bytes}/{core.max_pending_bytes} bytes, {core.waiting_admission} waiting"
        )

    def attach(self, timeline: Timeline) -> None:
        """Record into ``timeline`` from now on (one at a time)."""
        with self.lock:
            if self.timeline is not None:
                raise SchedsvcError(
                    f"a trace is already being recorded to {self.timeline.path!r}; one trace at a time "
                    "(Config(trace_path=...) records the whole life of the engine)"
                )
            self.timeline, self.core.edges = timeline, timeline.edges
            timeline.on_full = self._stop_edges  # past the cap: memory stays bounded
            timeline.loop_thread = self.loop_thread
            timeline.sample(self.core)

    def detach(self) -> Timeline:
        """Stop recording; return the timeline."""
        with self.lock:
            timeline = self.timeline
            assert timeline is not None
            timeline.sample(self.core)
            self.timeline, self.core.edges = None, None
        return timeline

    def _stop_edges(self) -> None:
        """A trace reached its cap: the scheduler stops listing dependency edges (called without the lock)."""
        with self.lock:
            self.core.edges = None

    # -- closing -------------------------------------------------------------------

    async def shutdown(self, cancel_pending: bool, timeout: float) -> list[threading.Thread]:
        """Take no more work; finish (or cancel) what is pending, stop the executors, and wait up to
        ``timeout`` for their threads; return those still alive.

        Nested work that running tasks submit meanwhile is admitted and waited
        for too.  If this is cancelled, unstarted work is cancelled and the
        executors are told to stop.
        """
        self.close()
        closed = functools.partial(EngineClosed, "the engine closed with cancel_pending=True")
        try:
            if cancel_pending:
                self.cancel_pending(closed)
            while True:  # nested work submitted by running tasks is admitted while closing
                await self.barrier()
                if self.settled():
                    break
        except BaseException:  # the close was cancelled (or failed): stop now
            self.cancel_pending(closed)
            self.stop()
            await self.aclose_executors()
            raise
        self.stop()
        await self.aclose_executors()
        return await self.join(timeout)

    async def join(self, timeout: float) -> list[threading.Thread]:
        """Wait, without blocking the loop, for the executors' threads to end; return those still alive."""
        deadline = time.monotonic() + timeout
        while True:
            alive = [t for executor in self.devices.values() for t in executor.join(0)]
            if not alive or time.monotonic() > deadline:
                return alive
            await anyio.sleep(0.001)  # they were told to stop; they exit within microseconds

    def close(self) -> None:
        """Take no more work (nested work of running tasks still gets in)."""
        with self.lock:
            self.closed = True
        if self._conditions:  # a state change that produces no scheduling event
            self._recheck_soon()

    def settled(self) -> bool:
        """Is nothing pending or waiting for admission?"""
        with self.lock:
            return not self.core.pending and not self.core.waiting_admission

    def running(self) -> int:
        with self.lock:
            return self.core.running

    def cancel_pending(self, error: Callable[[], BaseException]) -> None:
        """Cancel every task not started; each submitter still queued gets an ``error()`` of its own."""
        for token in self.under_lock(self.core.cancel_pending):
            settle(token, error())
        for executor in self.devices.values():
            executor.cancel_all()

    def stop(self) -> None:
        """Tell the executors no more work comes; their threads end once idle."""
        for executor in self.devices.values():
            executor.stop()

    def stop_when_idle(self) -> None:
        """Stop an engine that was never closed: staged work is handed over, then the threads end."""
        self.under_lock(self._close_and_publish)
        self.stop()

    def _close_and_publish(self) -> None:
        self.closed = True
        self.core.publish()

    async def aclose_executors(self) -> None:
        for executor in self.devices.values():
            await executor.aclose()

    # -- waiting for a state (tests, tools) --------------------------------------------

    async def until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Wait on the event loop until ``predicate()`` holds; TimeoutError after ``timeout`` seconds.

        ``predicate`` is called on the engine's loop, without the lock (it may
        call ``eng.stats()``): now, then after every scheduling event (``collect``)
        and when the runtime closes -- never by polling.  What it raises is
        raised here.  State that changes without a scheduling event (a worker's
        busy time, a thread leaving) is not seen until the next event.
        """
        token = self.bridge.token()
        entry = (predicate, token)
        self._conditions.append(entry)  # before the first check: a change after it is re-checked
        try:
            if predicate():
                return
            try:
                with anyio.fail_after(timeout):
                    await token
            except TimeoutError:
                raise TimeoutError(f"{predicate!r} did not hold within {timeout} s") from None
        finally:
            with contextlib.suppress(ValueError):
                self._conditions.remove(entry)

    def _recheck_soon(self) -> None:
        """After a scheduling event, from any thread: re-check the ``until`` predicates on the loop, once
        for a burst of events."""
        if self._recheck_scheduled:
            return
        self._recheck_scheduled = True
        try:
            self.bridge.call_soon_threadsafe(self._recheck)
        except RuntimeError:  # the loop is closed: nobody waits on it any more
            self._recheck_scheduled = False

    def _recheck(self) -> None:
        """On the loop: settle each waiter whose predicate holds now (or raised)."""
        self._recheck_scheduled = False  # first: an event from here on schedules another check
        for predicate, token in list(self._conditions):
            if token.done():
                continue
            try:
                held = predicate()
            except Exception as exc:  # the waiter raises it
                settle(token, exc)
                continue
            if held:
                settle(token)

    # -- the executors' door -------------------------------------------------------

    def worker_started(self) -> None:
        with self.lock:
            self.worker_threads.add(get_ident())

    def next_task(self, executor: Executor, worker: Any) -> Task | bool | float | None:
        """A worker of ``executor`` asks for work: a task (running now), None (it is parked: wait for
        its wake-up), False (it leaves: ``executor.leaving`` said so), or a number of seconds: it is
        parked, but tasks staged on the loop's thread wait to be handed over -- if no wake-up comes
        within that time, it says so (``unpark``) and asks again.  Staged tasks the loop has not
        handed over within ``_STALE_S`` are taken here: a loop kept busy (a long synchronous handler,
        a notebook cell that does not await) does not hold back the work queued before."""
        after = None
        park = None
        with self.lock:
            core = self.core
            if executor.leaving(worker, core.queues[executor.name].count):
                self.worker_threads.discard(get_ident())
                return False
            task = core.take(executor.name)
            if task is None and self._flush_scheduled and executor.parks_timed:  # (the loop may be staging)
                if not core.staged:
                    park = _STALE_S * 5  # (until it stages, or its flush comes)
                elif (waited := time.perf_counter() - self._staged_since) >= _STALE_S:
                    core.publish()  # the loop has not come round to its flush: it is busy
                    task = core.take(executor.name)
                    after = self.collect()  # (the other devices' workers, for what was theirs)
                else:
                    park = _STALE_S - waited
            if task is None:  # parked: notify() wakes it
                executor.idle.append(worker)
                executor.hungry = True
        if after is not None:
            after()
        return task if task is not None else park

    def unpark(self, executor: Executor, worker: Any) -> bool:
        """A worker parked with a time limit (``next_task``) woke without being notified: True if it is
        no longer parked; False if it was notified meanwhile -- its wake-up is on its way, and the
        worker must take it (acquire its park lock) before it asks for work again."""
        with self.lock:
            if worker not in executor.idle:
                return False
            executor.idle.remove(worker)
            executor.hungry = bool(executor.idle)
            return True

    def take_all(self, executor: Executor) -> list[Task]:
        """Every ready task of ``executor``'s device, taken (running now); the executor is ``hungry``
        again, under the same lock hold, so no task made ready later goes unnoticed."""
        tasks = []
        with self.lock:
            take = self.core.take
            while (task := take(executor.name)) is not None:
                tasks.append(task)
            executor.hungry = True
        return tasks

    def finish(self, task: Task, value: Any, error: BaseException | None, cancelled: bool = False) -> str:
        """Record the outcome of a task that ran elsewhere; returns the state it was in.

        Only a ``running`` task is finished (``cancelled``: the executor dropped it unrun, and it ends
        as an unstarted task cancelled here would).  A final one (failed through a parent, cancelled)
        is left alone; a task not yet running (sent ahead) is the executor's to keep until it is.
        """
        with self.lock:
            state = task.state
            if state != "running":
                return state
            if cancelled:
                self.core.finish_cancelled(task)
            else:
                self.core.finish(task, value, error, False)
            after = self.collect()
        if after is not None:
            after()
        return state

    def launched(self, task: Task, value: Any) -> None:
        """An asynchronous executor queued ``task``'s work on its device (behind its parents' work):
        dependents on the same device may now be launched behind it, taking ``value`` (a device
        array whose contents are still being computed) in its place."""
        self.under_lock(self._launch, task, value)

    def _launch(self, task: Task, value: Any) -> None:
        task.value = value  # what a dependent launched behind it receives; final at complete
        self.core.launch(task)

    def ahead(self, task: Task) -> list[Task]:
        """The launched parents on its device that a ready or running ``task`` launches behind."""
        with self.lock:
            return list(self.core.ahead(task))

    def complete(self, task: Task, value: Any, error: BaseException | None = None) -> None:
        """A launched task's result is visible to the host (or its device reported ``error``)."""
        self.under_lock(self.core.complete, task, value, error)

    def data_parents(self, task: Task) -> list[Task] | None:
        """The unfinished data parents of a waiting ``task``, if they are all it waits for (no hazard
        edge holds it); None otherwise."""
        with self.lock:
            if task.state != "waiting":
                return None
            parents = [d for d in task.deps if d.state not in FINAL_STATES]
            return parents if len(parents) == task.n_waiting else None

    # -- waiting -----------------------------------------------------------------

    def wait_blocking(self, task: Task, timeout: float | None) -> bool:
        """Block this thread until ``task`` is final; False on timeout.

        A CPU task that is still queued is run right here (this thread would
        only wait) -- with a ``timeout``, only if tasks of its kind have run
        within it (``fits``), so the timeout bounds the wait.  Otherwise, on a
        worker, the pool starts a stand-in thread while this one blocks, so a
        task waiting on another never starves it.
        """
        if self.forked:
            raise EngineClosed(FORKED)
        worker = current_worker()
        # this thread would only wait: run it here (on a device whose tasks any thread may run)
        if (
            task.device in self.anywhere
            and (timeout is None or self.fits(task, timeout))
            and self.claim(task)
        ):
            self.execute(task, chain=False)  # just this task: its dependents go to the queue
            return True
        self.flush()
        gate = threading.Lock()
        gate.acquire()
        with self.lock:
            if task.state in FINAL_STATES:
                return True
            watch(task, gate)
        try:
            if worker is not None:
                worker.blocking(+1)
            got = gate.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))
        finally:
            if worker is not None:
                worker.blocking(-1)
        if not got:
            with self.lock:
                unwatch(task, gate)
            return task.state in FINAL_STATES
        return True

    def after_fork(self) -> None:
        """In a forked child (one thread, a copy of memory): no worker or loop of the engine runs here."""
        self.forked = self.closed = True
        self.inline_threshold_s = 0.0  # an await runs nothing inline: it raises the fork error
        self.lock = threading.Lock()  # another thread of the parent may have held it at the fork
        self.worker_threads = set()
        self.loop_thread = -1
        self._conditions = []  # their loop does not run here
        self.bridge.forget()

    def on_loop_thread(self) -> bool:
        """Is this the running event loop's thread, outside a task?  (A task run inline there may block: it is
        its own; once the loop has ended -- ``asyncio.run`` or ``trio.run`` returned -- blocking stalls nothing.)"""
        ident = get_ident()
        return ident == self.loop_thread and ident not in self.worker_threads and not self.bridge.closed()

    def claim(self, task: Task) -> bool:
        """Take a queued ready task to run on this thread (ready -> running)."""
        with self.lock:
            return self.core.claim(task)

    # -- running one task ----------------------------------------------------

    def is_cheap(self, task: Task) -> bool:
        """Has this kind of task (function, input size) run faster than the inline threshold?"""
        if not self.inline_threshold_s:
            return False
        cost = self._cost(task)
        return cost is not None and cost < self.inline_threshold_s

    def fits(self, task: Task, budget: float) -> bool:
        """Has this kind of task run within ``budget`` seconds?  (Never on the loop's thread, outside a task.)"""
        if self.on_loop_thread():
            return False
        cost = self._cost(task)
        return cost is not None and cost <= budget

    def _cost(self, task: Task) -> float | None:
        """The learned run time of tasks like ``task``; None if none has been timed."""
        try:
            return self._costs.get(_cost_key(task))
        except Exception:  # an unhashable callable, or user code raising in __hash__/__getattr__
            return None

    def run_inline(self, task: Task) -> bool:
        """Run a ready task on this (the awaiting) thread if it is cheap; False if not run.  A task with a
        ``fusion`` is left to a worker, which runs it with the others of its fusion that are ready."""
        if (
            task.state == "ready"
            and task.fusion is None
            and task.device in self.anywhere
            and self.is_cheap(task)
            and self.claim(task)
        ):
            self.execute(task, chain=False)
            return True
        return False

    def execute(self, task: Task, chain: bool = True) -> Task | None:
        """Run a ``running`` task here, record the outcome; return the task to run next.

        On a worker (``chain=True``) that is a dependent this task made ready,
        or else the next queued task of the device, taken under the same lock
        hold as the finish (one lock round trip per task, not two).
        ``chain=False`` (a thread that is not a worker, or one that runs a task it
        waits on): dependents go to the queue and nothing is taken.  On a worker, a
        task with a ``fusion`` runs with the others of it that are ready (``_execute_fused``).
        """
        if task.fusion is not None and chain:  # hot path: the one check a task pays for fusion
            return self._execute_fused(task)
        t0 = time.perf_counter()
        self.queue_waits.append(t0 - task.t_ready)
        key = None
        if self.inline_threshold_s and (task.watchers is not None or not chain):
            try:
                key = _cost_key(task)
                hash(key)
            except Exception:  # user code raising in __hash__/__getattr__: just do not learn
                key = None
        guest = not chain and self._enter_guest()
        try:
            if task.deps:
                if task.kwargs:
                    value = task.fn(*substitute_args(task.args), **substitute(task.kwargs))
                else:
                    value = task.fn(*substitute_args(task.args))
            elif task.kwargs:
                value = task.fn(*task.args, **task.kwargs)
            else:
                value = task.fn(*task.args)
            error = None
        except BaseException as exc:  # the task's failure is its result, whatever it is
            value, error = None, exc
            if exc.__traceback__ is not None:  # without this frame, whose `task` would make a cycle
                exc.__traceback__ = exc.__traceback__.tb_next  # (error -> frame -> task -> error)
        if guest:
            self.worker_threads.discard(get_ident())
        timeline = self.timeline
        if timeline is not None:
            timeline.span(task, t0, time.perf_counter(), error)
        if key is not None:
            elapsed = time.perf_counter() - t0
            old = self._costs.get(key)
            if old is None and len(self._costs) >= _MAX_COST_KEYS:
                self._costs.clear()
            self._costs[key] = elapsed if old is None else 0.7 * old + 0.3 * elapsed
        lock = self.lock
        if not lock.acquire(False):
            _acquire_contended(lock)
        try:
            nxt = self.core.finish(task, value, error, chain)
            if nxt is None and chain:
                nxt = self.core.take(task.device)
            after = self.collect()
        finally:
            lock.release()
        if after is not None:
            after()
        return nxt

    def _execute_fused(self, first: Task) -> Task | None:
        """On a worker: take the ready tasks of ``first``'s fusion too, run them as one, and finish each
        with its own outcome; return the task to run next, as ``execute`` does."""
        fusion: Fusion = first.fusion
        core = self.core
        with self.lock:
            room = fusion.limit - fusion.weight(first)
            tasks = [first, *core.take_like(first.device, fusion, room, fusion.weight)]
        t0 = time.perf_counter()
        for task in tasks:
            self.queue_waits.append(t0 - task.t_ready)
        try:
            args = [substitute_args(t.args) if t.deps else t.args for t in tasks]
            outcomes, described = fusion.run(tasks, args)
        except BaseException as exc:  # (run raises nothing; were it to, no task may stay running)
            outcomes, described = [(None, exc)] * len(tasks), {}
        timeline = self.timeline
        if timeline is not None:
            timeline.fused_span(first, t0, time.perf_counter(), described)
        lock = self.lock
        if not lock.acquire(False):
            _acquire_contended(lock)
        try:
            last = len(tasks) - 1
            for i, task in enumerate(tasks):  # the last one may hand on a dependent to run here
                value, error = outcomes[i]
                nxt = core.finish(task, value, error, i == last)
            if nxt is None:
                nxt = core.take(first.device)
            after = self.collect()
        finally:
            lock.release()
        if after is not None:
            after()
        return nxt

    def _enter_guest(self) -> bool:
        """A thread that is not a worker runs a task: submissions it makes meanwhile are nested."""
        ident = get_ident()
        if ident in self.worker_threads:
            return False
        self.worker_threads.add(ident)
        return True

    def launches(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for device in self.devices.values():
            found.update(device.launches())
        return found

    def busy_seconds(self) -> dict[str, float]:
        busy: dict[str, float] = {}
        for device in self.devices.values():
            busy.update(device.busy_seconds())
        return busy


_MAX_COST_KEYS = 4096
_LONG_LIVED = (types.BuiltinFunctionType, np.ufunc, type)


def _cost_key(task: Task) -> tuple[Any, int]:
    """What makes two tasks alike in cost: the same code, inputs within a factor of two.

    The key never holds a transient object: functions and methods are keyed by
    their code, partials by what they wrap, builtins and ufuncs (long-lived,
    module-level) by themselves, other callables by their class.
    """
    fn = task.fn
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
    if code is None:
        code = fn if isinstance(fn, _LONG_LIVED) else type(fn)
    size = 0
    for buffer in task.buffers:
        size += buffer[1]
    return code, size.bit_length()


def _without_foreign(items: list[tuple[str, Any]], bridge: Bridge) -> list[tuple[str, Any]]:
    """The instructions for the engine's loop: tokens of other loops (and threads' tokens) are woken
    directly, and a task whose every watcher was is left out."""
    return [
        item
        for item in items
        if (item[1].watchers is not None if item[0] == "resolve" else not bridge.foreign(item[1]))
    ]


def _no_claims(task: Task, claims: Any) -> None:
    raise AssertionError(f"{task!r} claims writes, but no frontend registers them")


def _call_all(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()


def _leave_queue(core: Scheduler, token: Any) -> None:
    """A cancelled throttle() leaves the admission queue, or gives back the slot it was let through onto."""
    if not core.withdraw(token):
        core.unreserve(token)


def _acquire_contended(lock: threading.Lock) -> None:
    """Take a lock another thread holds, without queueing on it while this thread lacks the GIL.

    A blocked ``acquire`` can be granted the lock while the thread still waits for
    the GIL; the holder of the GIL then blocks on the lock, and two workers
    convoy, trading the GIL and the lock on every task.  ``sleep(0)`` gives up
    the GIL so the holder can finish, and the lock is only taken with the GIL.
    """
    for _ in range(_SPINS):
        time.sleep(0)
        if lock.acquire(False):
            return
    lock.acquire()
