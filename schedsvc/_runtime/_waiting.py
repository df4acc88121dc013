"""Waiting: for a task (blocking a thread, or running it right there), for every task, for a state.

A thread that would only wait for a queued task runs it itself, and an
awaiting loop thread runs a ready task itself when tasks like it have run
faster than the inline threshold: ``Dispatch.execute`` learns those costs,
``Waiting`` reads them.  ``until`` waits on the loop for a predicate, checked
again after every scheduling event (``Runtime.collect``), never by polling.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import threading
import types
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import numpy as np

from .._core import FINAL_STATES, Task
from .._errors import FORKED, EngineClosed
from ._bridge import Token, fire, settle, unwatch, watch
from ._threads import ThreadToken, current_worker

if TYPE_CHECKING:
    from ._dispatch import Dispatch
    from ._runtime import Runtime

__all__ = ["MAX_COST_KEYS", "Waiting", "cost_key"]

#: the most kinds of task whose cost is remembered (past it, the table starts again)
MAX_COST_KEYS = 4096
_LONG_LIVED = (types.BuiltinFunctionType, np.ufunc, type)
#: exact types keyed at once (a getattr that fails builds an AttributeError: thousands of instructions)
_OWN_KEY = frozenset((types.BuiltinFunctionType, np.ufunc))
_ufunc = np.ufunc
_LockType = type(threading.Lock())


class Waiting:
    """Waiting for tasks and states; running a task on the thread that would only wait for it."""

    def __init__(self, rt: Runtime, dispatch: Dispatch, costs: dict[Any, float]) -> None:
        self.rt = rt
        self.bridge = rt.bridge
        self.anywhere = rt.anywhere  # devices whose queued task any thread may run itself
        self.dispatch = dispatch  # (a task run on the waiting thread is run as a worker runs it)
        self.inline_threshold_s = dispatch.inline_threshold_s
        self._costs = costs  # learned by Dispatch.execute
        #: ``until`` waiters: (predicate, token); while any waits, each scheduling event re-checks them
        self.conditions: list[tuple[Callable[[], bool], Any]] = []
        self._recheck_scheduled = False

    # -- one task ----------------------------------------------------------------------

    def run_inline(self, task: Task) -> bool:
        """Run a ready task on this (the awaiting) thread if it is cheap; False if not run.  A task with a
        ``fusion`` is left to a worker, which runs it with the others of its fusion that are ready."""
        if (
            task.state == "ready"
            and task.fusion is None
            and task.device in self.anywhere
            and self.is_cheap(task)
            and self.dispatch.claim(task)
        ):
            self.dispatch.execute(task, chain=False)
            return True
        return False

    def wait_blocking(self, task: Task, timeout: float | None) -> bool:
        """Block this thread until ``task`` is final; False on timeout.

        A CPU task that is still queued is run right here (this thread would
        only wait) -- with a ``timeout``, only if tasks of its kind have run
        within it (``fits``), so the timeout bounds the wait.  Otherwise, on a
        worker, the pool starts a stand-in thread while this one blocks, so a
        task waiting on another never starves it.
        """
        rt = self.rt
        if rt.forked:
            raise EngineClosed(FORKED)
        worker = current_worker()
        # this thread would only wait: run it here (on a device whose tasks any thread may run)
        if (
            task.device in self.anywhere
            and (timeout is None or self.fits(task, timeout))
            and self.dispatch.claim(task)
        ):
            self.dispatch.execute(task, chain=False)  # just this task: its dependents go to the queue
            return True
        rt.flush()
        gate = threading.Lock()
        gate.acquire()
        with rt.lock:
            if task.state in FINAL_STATES:
                return True
            rt.other_loops = True  # (collect looks for watchers woken elsewhere from now on: this gate)
            watch(task, gate)
            if self.conditions:  # a thread now waits on the task: what an ``until`` may wait to see
                self.recheck_soon()
        try:
            if worker is not None:
                worker.blocking(+1)
            got = gate.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))
        finally:
            if worker is not None:
                worker.blocking(-1)
        if not got:
            with rt.lock:
                unwatch(task, gate)
            return task.state in FINAL_STATES
        return True

    def watch_off_loop(self, task: Task, then: Callable[[], object]) -> None:
        """Call ``then()`` where ``task`` becomes final, off the event loop (the thread that finished or
        cancelled it), once the lock is released.  ``task`` is new: nobody else sees it yet."""
        self.rt.other_loops = True  # (collect looks for watchers woken elsewhere from now on)
        watch(task, ThreadToken(then))

    def add_done_callback(
        self, task: Task, fn: Callable[[Any], Any], context: contextvars.Context | None = None
    ) -> None:
        """Call ``fn(task)`` on the loop once ``task`` is final (in ``context``, if given); added by a
        coroutine on another asyncio loop, on that loop, woken directly (not through the engine's)."""
        loop = self.bridge.running_loop()
        watcher: Any = fn
        if loop is not None and loop is not self.rt.loop:
            watcher = LoopCallback(fn, context, loop, task)
        elif context is not None:
            watcher = Callback(fn, context)
        with self.rt.lock:
            if task.state not in FINAL_STATES:
                if type(watcher) is LoopCallback:
                    self.rt.other_loops = True  # (collect looks for watchers woken elsewhere from now on)
                watch(task, watcher)
                return
        if type(watcher) is LoopCallback:
            watcher.settle()
        else:
            self.bridge.call_soon_threadsafe(fire, watcher, task)

    def remove_done_callback(self, task: Task, fn: Callable[[Any], Any]) -> int:
        """Take every ``fn`` added by ``add_done_callback`` off ``task``'s watchers, unless already handed
        on to be called; how many.  (A new list: a drain on the loop may be reading the old one.)"""
        with self.rt.lock:
            watchers = task.watchers
            if not watchers:
                return 0
            kept = [w for w in watchers if type(w) is _LockType or not _is_callback(w, fn)]
            task.watchers = kept or None
        return len(watchers) - len(kept)

    def on_loop_thread(self) -> bool:
        """Is this the running event loop's thread, outside a task?  (A task run inline there may block: it is
        its own; once the loop has ended -- ``asyncio.run`` or ``trio.run`` returned -- blocking stalls nothing.)"""
        ident = get_ident()
        rt = self.rt
        return ident == rt.loop_thread and ident not in rt.worker_threads and not self.bridge.closed()

    # -- what a task costs ----------------------------------------------------------------

    def is_cheap(self, task: Task) -> bool:
        """Has this kind of task (function, input size) run faster than the inline threshold, and can it not
        wait for the event loop (``cannot_wait``: it is to run there)?"""
        if not self.inline_threshold_s:
            return False
        try:
            key = cost_key(task)
            cost = self._costs.get(key)
        except Exception:  # an unhashable callable, or user code raising in __hash__/__getattr__
            return False
        if cost is None or cost >= self.inline_threshold_s:
            return False
        code = key[0]
        return type(code) is _ufunc or cannot_wait(code, task.fn)  # (a ufunc, the common kind: no call)

    def fits(self, task: Task, budget: float) -> bool:
        """Has this kind of task run within ``budget`` seconds?  (Never on the loop's thread, outside a task.)"""
        if self.on_loop_thread():
            return False
        cost = self._cost(task)
        return cost is not None and cost <= budget

    def _cost(self, task: Task) -> float | None:
        """The learned run time of tasks like ``task``; None if none has been timed."""
        try:
            return self._costs.get(cost_key(task))
        except Exception:  # an unhashable callable, or user code raising in __hash__/__getattr__
            return None

    # -- every task, or a state -------------------------------------------------------------

    async def barrier(self) -> None:
        """Wait until every task admitted so far is final.  It always yields to the loop once at least (a
        checkpoint, as every wait): a caller that loops on it (the close) lets the loop run meanwhile."""
        rt = self.rt
        with rt.lock:
            idle = rt.core.pending == 0
            if not idle:
                token = self.bridge.token()
                rt.core.barrier(token)
                rt.core.publish()
                after = rt.collect()
        if idle:
            await anyio.lowlevel.checkpoint()
            return
        if after is not None:
            after()
        try:
            await token
        except BaseException:  # cancelled, timed out: the barrier goes with its waiter
            rt.under_lock(rt.core.drop_barrier, token)
            raise

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
        self.conditions.append(entry)  # before the first check: a change after it is re-checked
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
                self.conditions.remove(entry)

    def recheck_soon(self) -> None:
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
        for predicate, token in list(self.conditions):
            if token.done():
                continue
            try:
                held = predicate()
            except Exception as exc:  # the waiter raises it
                settle(token, exc)
                continue
            if held:
                settle(token)


class Callback:
    """A done-callback added with asyncio's ``context=``: called in that context, on the engine's loop."""

    __slots__ = ("context", "fn")

    def __init__(self, fn: Callable[[Any], Any], context: contextvars.Context) -> None:
        self.fn = fn
        self.context = context

    def __call__(self, task: Any) -> Any:
        return self.context.run(self.fn, task)

    def __repr__(self) -> str:
        return repr(self.fn)


class LoopCallback(Token):
    """A done-callback added by a coroutine on another asyncio loop (``home``): handed to that loop, from
    wherever the task became final, as a token of that loop is."""

    __slots__ = ("context", "fn", "home", "task")

    def __init__(
        self, fn: Callable[[Any], Any], context: contextvars.Context | None, home: Any, task: Task
    ) -> None:
        self.fn = fn
        self.context = context
        self.home = home
        self.task = task

    def done(self) -> bool:
        return False

    def settle(self, error: BaseException | None = None) -> None:
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody there waits any more
            self.home.call_soon_threadsafe(self.fn, self.task, context=self.context)

    def __repr__(self) -> str:
        return repr(self.fn)


def _is_callback(watcher: Any, fn: Callable[[Any], Any]) -> bool:
    """Is ``watcher`` (one of a task's) the done-callback ``fn``, however it was added?"""
    if type(watcher) is Callback or type(watcher) is LoopCallback:
        watcher = watcher.fn
    return bool(watcher == fn)


#: where the code of a function that cannot wait for the event loop lives: NumPy's, and the engine's own (its
#: Tensor ops, copies and compiled replays)
_OWN_DIRS = (os.path.dirname(np.__file__) + os.sep, os.path.dirname(os.path.dirname(__file__)) + os.sep)
#: the file name of a compiled function's generated replay (``compile._graph.emit``)
_REPLAY_FILE = "<schedsvc compiled "


def cannot_wait(code: Any, fn: Any) -> bool:
    """May a task of ``fn`` (``code``, its ``cost_key``'s) run on the event loop's thread: does it never wait
    for something the loop would do?  NumPy's functions, the engine's own, and functions of a module that
    are not Python (``math.sqrt``, ufuncs) -- never a user's function, nor a method of an object (a queue's
    ``get``, a lock's ``acquire``, an event's ``wait``), which may wait for a coroutine to feed it."""
    if isinstance(code, types.CodeType):
        where = code.co_filename
        return where.startswith(_OWN_DIRS) or where.startswith(_REPLAY_FILE)
    if type(code) is np.ufunc:
        return True
    while isinstance(fn, functools.partial):
        fn = fn.func
    if type(fn) is types.BuiltinFunctionType:
        owner = fn.__self__
        return owner is None or isinstance(owner, types.ModuleType)
    return False


def cost_key(task: Task) -> tuple[Any, int]:
    """What makes two tasks alike in cost: the same code, inputs within a factor of two.

    The key never holds a transient object: functions and methods are keyed by
    their code, partials by what they wrap, builtins and ufuncs (long-lived,
    module-level) by themselves, other callables by their class.
    """
    fn = task.fn
    kind = type(fn)
    if kind is types.FunctionType:  # hot path: no failing getattr for the common kinds
        code = fn.__code__
    elif kind in _OWN_KEY:  # (neither has __code__ or __func__)
        code = fn
    else:
        code = _code_of(fn)
    size = 0
    for buffer in task.buffers:
        size += buffer[1]
    return code, size.bit_length()


def _code_of(fn: Any) -> Any:
    """``cost_key``'s key for a callable other than a plain function, builtin or ufunc."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
    if code is None:
        code = fn if isinstance(fn, _LONG_LIVED) else type(fn)
    return code
