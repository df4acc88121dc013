"""The runtime: one lock around the core, the workers, and the thread -> loop bridge.

Hand-off to workers: a submission from any thread but the event loop's goes
to the ready queue and wakes parked workers at once.  On the loop thread, the
first ``size`` submissions of each loop iteration do the same (so the first
tasks of a burst start immediately); later ones are *staged* -- admitted and
ordered, but held from the workers -- and handed over in one flush when the
coroutine next yields, which is when ``asyncio.create_task`` work starts too.
A submitting coroutine thus does not fight its own workers for the GIL on
every call.  Every wait flushes first, so staged work never stalls.

Worker threads never touch asyncio objects.  What the loop must learn (a
future somebody awaits is final, a queued submission got in, a ``waitall``
is satisfied) is appended to ``_to_loop`` under the lock, and the first such
item of a burst schedules one ``call_soon_threadsafe(_drain_to_loop)``; the
rest ride along.  Threads blocked in ``result()`` wait on a plain lock that
the finishing worker releases directly, and a coroutine awaiting on another
event loop is woken on its own loop directly (``settle``), so neither needs
the engine's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import types
from collections import deque
from collections.abc import Callable
from threading import get_ident
from typing import Any, Protocol

import numpy as np

from .._core import FINAL_STATES, Instruction, Scheduler, Task
from .._errors import EngineClosed
from .._timeline import Timeline
from ._scan import substitute, substitute_args

__all__ = ["FORKED", "Device", "Runtime", "current_worker"]

#: what an engine says in a process forked from the one that started it
FORKED = (
    "this process was forked from the one that started the engine, and the engine's threads did not "
    "come along, so its work would never run here; create a new Engine in the child process"
)

_SPINS = 16  # GIL yields before a contended acquire blocks

_LockType = type(threading.Lock())
_local = threading.local()


def current_worker() -> Any:
    """The worker object running on this thread, or None outside workers."""
    return getattr(_local, "worker", None)


class Device(Protocol):
    """What the runtime needs of an executor kind (see ``schedsvc.devices``)."""

    name: str

    def start(self) -> None: ...

    size: int  # submissions handed to it at once per loop iteration before staging starts
    idle: list[Any]

    @property
    def concurrency(self) -> int:
        """Tasks it runs at once; ``eng.map``'s default window is twice this."""

    def wake(self, ready: int) -> Callable[[], None] | None: ...
    def stop(self) -> None: ...
    def join(self, timeout: float | None) -> list[threading.Thread]: ...
    def busy_seconds(self) -> dict[str, float]: ...


class Runtime:
    """Scheduler + lock + devices + loop bridge; shared by the frontend and the workers."""

    def __init__(
        self, core: Scheduler, loop: asyncio.AbstractEventLoop, inline_threshold_s: float = 0.0
    ) -> None:
        self.core = core
        self.inline_threshold_s = inline_threshold_s
        self._costs: dict[Any, float] = {}  # (code, log2 input bytes) -> seconds, smoothed
        self.lock = threading.Lock()
        self.loop = loop
        self.devices: dict[str, Device] = {}
        self._pools: list[tuple[Device, Any]] = []  # (device, its ready queue), for collect()
        self.timeline: Timeline | None = None  # set while a trace is recorded (eng.trace)
        self.worker_threads: set[int] = set()  # idents of threads that run tasks
        self.loop_thread = threading.get_ident()
        self.queue_waits: deque[float] = deque(maxlen=8192)
        self.closed = False
        self.forked = False  # this is a child process forked after the engine started: nothing runs here
        self.other_loops = False  # has a coroutine on another event loop awaited a task of this engine?
        self.remote = False  # tasks run in other processes (Dask): values are Remote handles
        self._to_loop: list[Instruction] = []
        self._drain_scheduled = False
        self._flush_scheduled = False
        self._eager_left = 0

    def add_device(self, name: str, device: Device) -> None:
        self.devices[name] = device
        self._pools.append((device, self.core.queues[name]))
        self._eager_left += device.size

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
                self.loop.call_soon(self._flush)
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
            for item in core.drain():
                if item[0] == "resolve":
                    self._resolve_elsewhere(item[1], wakes)
                elif item[1].get_loop() is not self.loop:  # a token awaited on another loop
                    wakes.append(functools.partial(settle, item[1]))
                    continue
                self._to_loop.append(item)
            if self._to_loop and not self._drain_scheduled:
                self._drain_scheduled = True
                wakes.append(self._schedule_drain)
        for device, queue in self._pools:
            if not device.idle or not queue.count:
                continue
            wake = device.wake(queue.count)
            if wake is not None:
                if wakes is None:
                    wakes = []
                wakes.append(wake)
        if not wakes:
            return None
        if len(wakes) == 1:
            return wakes[0]
        return lambda: _call_all(wakes)

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
        self._eager_left = sum(d.size for d in self.devices.values())
        self.core.publish()

    def _resolve_elsewhere(self, task: Task, wakes: list[Callable[[], None]]) -> None:
        """Wake who waits for ``task`` outside this loop (threads, other loops) directly, not through it.

        A future of another loop is also taken off the task's watchers (rare), so this
        loop's drain fires only its own, with no per-watcher loop check there.
        """
        elsewhere = False
        other_loops = self.other_loops
        for watcher in task.watchers or ():
            if type(watcher) is _LockType:
                wakes.append(watcher.release)
            elif other_loops and _elsewhere(watcher, self.loop):
                wakes.append(functools.partial(settle, watcher))
                elsewhere = True
        if elsewhere:
            task.watchers = [w for w in task.watchers or () if not _elsewhere(w, self.loop)]

    # -- the loop side ---------------------------------------------------------

    def _schedule_drain(self) -> None:
        try:
            if _on_loop(self.loop):
                self.loop.call_soon(self._drain_to_loop)
            else:
                self.loop.call_soon_threadsafe(self._drain_to_loop)
        except RuntimeError:  # loop closed: nobody can await anything any more
            with self.lock:
                self._to_loop.clear()
                self._drain_scheduled = False

    def _drain_to_loop(self) -> None:
        with self.lock:
            items, self._to_loop = self._to_loop, []
            self._drain_scheduled = False
        for i, (kind, obj) in enumerate(items):
            try:
                if kind == "resolve":
                    watchers, obj.watchers = obj.watchers, None  # fired once; let them go
                    for watcher in watchers or ():
                        if type(watcher) is not _LockType:
                            _fire(watcher, obj)
                else:  # "admitted" / "barrier": obj is an asyncio future token
                    _fire(obj, None)
            except BaseException:  # KeyboardInterrupt in a callback: deliver the rest later
                with self.lock:
                    self._to_loop[:0] = items[i + 1 :]
                    rearm = not self._drain_scheduled and bool(self._to_loop)
                    self._drain_scheduled = self._drain_scheduled or rearm
                if rearm:
                    self._schedule_drain()
                raise

    # -- waiting -----------------------------------------------------------------

    async def wait(self, task: Task) -> None:
        """Wait on the event loop until ``task`` is final."""
        if self.forked:
            raise EngineClosed(FORKED)
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        with self.lock:
            if task.state in FINAL_STATES:
                return
            if loop is not self.loop:
                self.other_loops = True  # from now on, collect looks for their waiters
            _watch(task, waiter)
            if self.core.staged:
                self.core.publish()
            after = self.collect()
        if after is not None:
            after()
        try:
            await waiter
        except asyncio.CancelledError:
            with self.lock:
                _unwatch(task, waiter)
            raise

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
        # this thread would only wait: run it here (not on Dask, where no task runs in this process)
        if (
            task.device == "cpu"
            and not self.remote
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
            _watch(task, gate)
        try:
            if worker is not None:
                worker.pool.blocking(+1)
            got = gate.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))
        finally:
            if worker is not None:
                worker.pool.blocking(-1)
        if not got:
            with self.lock:
                _unwatch(task, gate)
            return task.state in FINAL_STATES
        return True

    def after_fork(self) -> None:
        """In a forked child (one thread, a copy of memory): no worker or loop of the engine runs here."""
        self.forked = self.closed = True
        self.inline_threshold_s = 0.0  # an await runs nothing inline: it raises the fork error
        self.lock = threading.Lock()  # another thread of the parent may have held it at the fork
        self.worker_threads = set()
        self.loop_thread = -1
        self._to_loop = []

    def on_loop_thread(self) -> bool:
        """Is this the event loop's thread, outside a task?  (A task run inline there may block: it is its own.)"""
        ident = get_ident()
        return ident == self.loop_thread and ident not in self.worker_threads

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
        """Run a ready task on this (the awaiting) thread if it is cheap; False if not run."""
        if task.state == "ready" and task.device == "cpu" and self.is_cheap(task) and self.claim(task):
            self.execute(task, chain=False)
            return True
        return False

    def execute(self, task: Task, chain: bool = True) -> Task | None:
        """Run a ``running`` task here, record the outcome; return the task to run next.

        On a worker (``chain=True``) that is a dependent this task made ready,
        or else the next queued task of the device, taken under the same lock
        hold as the finish (one lock round trip per task, not two).
        ``chain=False`` (a thread that is not a worker, or one that runs a task it
        waits on): dependents go to the queue and nothing is taken.
        """
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

    def _enter_guest(self) -> bool:
        """A thread that is not a worker runs a task: submissions it makes meanwhile are nested."""
        ident = get_ident()
        if ident in self.worker_threads:
            return False
        self.worker_threads.add(ident)
        return True

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


def _call_all(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _elsewhere(watcher: Any, loop: asyncio.AbstractEventLoop) -> bool:
    """Is ``watcher`` an asyncio future of another loop (woken directly when its task finished)?"""
    return isinstance(watcher, asyncio.Future) and watcher.get_loop() is not loop


def _watch(task: Task, watcher: Any) -> None:
    if task.watchers is None:
        task.watchers = [watcher]
    else:
        task.watchers.append(watcher)


def _unwatch(task: Task, watcher: Any) -> None:
    if task.watchers is not None and task.state not in FINAL_STATES:
        with contextlib.suppress(ValueError):
            task.watchers.remove(watcher)


def _fire(watcher: Any, task: Task | None) -> None:
    """Wake an asyncio future (on its own loop) or call a done-callback."""
    if isinstance(watcher, asyncio.Future):
        settle(watcher)
        return
    try:
        watcher(task)
    except Exception as exc:  # a callback's error must not stop the others
        asyncio.get_running_loop().call_exception_handler(
            {"message": f"exception in done callback {watcher!r} of {task!r}", "exception": exc}
        )


def settle(token: asyncio.Future[None], error: BaseException | None = None) -> None:
    """Complete an asyncio future (with ``error``, if given) from any thread, on its own loop."""

    def complete() -> None:
        if token.done():
            return
        if error is None:
            token.set_result(None)
        else:
            token.set_exception(error)

    loop = token.get_loop()
    if _on_loop(loop):
        complete()
    else:
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there
            loop.call_soon_threadsafe(complete)


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
