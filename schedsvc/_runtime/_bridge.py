"""The bridge from worker threads to the event loop: one per async library, chosen at start.

Worker threads never touch the loop's objects.  What the loop must learn (a
task somebody awaits is final, a queued submission got in, a ``waitall`` is
satisfied) is ``post``-ed under the runtime's lock, and the first item of a
burst schedules one drain on the loop; the rest ride along.  A *token* is the
loop-side object one waiter awaits: an asyncio future, a trio ``Waiter``
(``_trio.py``), or a thread's; ``settle`` completes one from any thread, in
its own loop (or thread), so a waiter elsewhere is woken there directly.

This module and ``_trio.py`` are the only parts of the runtime that know the
async libraries' own objects.  ``open_bridge`` picks the bridge for the
library running the engine's start: ``AsyncioBridge`` here, ``TrioBridge``
(imported only then) for trio.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Awaitable, Callable, Generator
from threading import get_ident
from typing import TYPE_CHECKING, Any

from .._core import FINAL_STATES
from .._errors import FORKED, EngineClosed, SchedsvcError

if TYPE_CHECKING:
    import asyncio

    from .._core import Task
    from ._runtime import Runtime

__all__ = [
    "AsyncioBridge",
    "Bridge",
    "Job",
    "LoopWaiter",
    "Token",
    "fire",
    "is_cancellation",
    "new_token",
    "on_loop",
    "open_bridge",
    "settle",
    "unwatch",
    "watch",
]

_LockType = type(threading.Lock())


class _AsyncioOnFirstUse:
    """The name ``asyncio`` here until asyncio is first used (at the latest when an engine starts): then
    the module itself.  ``import schedsvc`` does not import asyncio, which costs a third of NumPy's import."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_load_asyncio(), name)


def _load_asyncio() -> Any:
    """Import asyncio, and put it (and the token types with its Future) in this module's globals."""
    import asyncio as module

    globals().update(asyncio=module, _TOKEN_TYPES=(module.Future, Token))
    return module


if not TYPE_CHECKING:
    asyncio = _AsyncioOnFirstUse()


class Token:
    """A one-shot that is not an asyncio future (a trio task's, a thread's): ``settle`` completes it
    from any thread.  ``home`` is what it belongs to (a trio run's token; None for a thread)."""

    __slots__ = ()
    home: Any

    def done(self) -> bool:
        raise NotImplementedError

    def settle(self, error: BaseException | None = None) -> None:
        raise NotImplementedError


class LoopWaiter(Token):
    """A one-shot a coroutine of the engine's own asyncio loop awaits (``Bridge.wait``, a batched call).

    It speaks asyncio's future protocol to the one Task that awaits it, and the drain wakes that Task
    directly, in the drain's own turn of the loop (``wake``).  The result of an asyncio future would
    schedule the wake-up as a callback of the next turn instead: a ``Handle`` made, ``call_soon`` and the
    handle's run, about a hundred bytecodes of asyncio's Python per await.  Cancelled (``Task.cancel``),
    it schedules the wake-up as an asyncio future does.
    """

    __slots__ = ("_asyncio_future_blocking", "callback", "context", "error", "home", "state")

    def __init__(self, loop: Any) -> None:
        self.home: asyncio.AbstractEventLoop = loop
        self.state = _PENDING
        self.callback: Callable[[Any], Any] | None = None  # the Task's wake-up (and its context, once set)
        self.context: Any
        self.error: Any  # once failed: the error; once cancelled: the message
        self._asyncio_future_blocking = False

    def __await__(self) -> Generator[Any, None, None]:
        if self.state is _PENDING:
            self._asyncio_future_blocking = True
            yield self  # (woken: the Task asked result(), which raised if it had to)
        else:
            self.result()

    __iter__ = __await__

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.home

    def done(self) -> bool:
        return self.state is not _PENDING

    def cancelled(self) -> bool:
        return self.state is _CANCELLED

    def result(self) -> None:
        state = self.state
        if state is _DONE:
            return
        if state is _CANCELLED:
            raise asyncio.CancelledError(*(() if self.error is None else (self.error,)))
        if state is _PENDING:
            raise asyncio.InvalidStateError("Result is not set.")
        raise self.error

    def add_done_callback(self, fn: Callable[[Any], Any], *, context: Any = None) -> None:
        if self.state is not _PENDING:
            self.home.call_soon(fn, self, context=context)
            return
        if self.callback is not None:
            raise RuntimeError(f"{self!r} is awaited by one Task only")
        self.callback = fn
        self.context = context

    def cancel(self, msg: Any = None) -> bool:
        if self.state is not _PENDING:
            return False
        self.state, self.error = _CANCELLED, msg
        if self.callback is not None:
            self.home.call_soon(self.callback, self, context=self.context)
        return True

    def settle(self, error: BaseException | None = None) -> None:
        """Complete it from any thread, or from a task: woken in a callback of the loop."""
        if asyncio._get_running_loop() is self.home:
            self.home.call_soon(self.wake, error)
        else:
            self.home.call_soon_threadsafe(self.wake, error)

    def wake(self, error: BaseException | None = None) -> None:
        """Complete it, and run the Task's wake-up here and now (its next step): on the loop, in a callback
        (the drain), not in a task (asyncio runs one task at a time)."""
        if self.state is not _PENDING:
            return
        if error is None:
            self.state = _DONE
        else:
            self.state, self.error = _FAILED, error
        callback = self.callback
        if callback is None:
            return
        context = self.context
        self.callback = self.context = None  # (let the Task go: nothing calls it back twice)
        if context is None:
            callback(self)
        else:
            context.run(callback, self)


_PENDING, _DONE, _FAILED, _CANCELLED = "pending", "done", "failed", "cancelled"


def _wake_soon(waiters: list[LoopWaiter]) -> None:
    """Wake ``waiters`` in callbacks of their loop (a drain was interrupted before it woke them)."""
    for waiter in waiters:
        waiter.home.call_soon(waiter.wake)


class Job:
    """A coroutine running in the background on the engine's loop (``Bridge.spawn``)."""

    __slots__ = ("_cancel", "error", "finished")

    def __init__(self) -> None:
        self.error: BaseException | None = None  # what it raised (not its cancellation)
        self.finished: Any = None  # an anyio.Event, set once it has ended
        self._cancel: Callable[[], Any] = lambda: None

    def cancel(self) -> None:
        self._cancel()

    async def wait(self) -> None:
        """Until it has ended (cancelling this wait leaves the job running)."""
        await self.finished.wait()


class Bridge:
    """What both bridges share: the burst of instructions for the loop, and waiting on a task."""

    #: what the loop is (an asyncio loop; a trio run's token): tokens of another home are woken there
    home: Any
    #: the asyncio loop, or None on trio (Dask's client needs one)
    loop: asyncio.AbstractEventLoop | None
    #: has the loop (or trio run) ended?  Asked on every submission
    closed: Callable[[], bool]

    #: the type of the loop's own futures (``loop.create_future()``): the drain settles those of its loop
    #: itself, without a call per waiter
    own_future: Any = None  # (trio: no watcher's type is None)
    #: is ``loop`` an ``asyncio.BaseEventLoop``, which says which thread runs it (``AsyncioBridge``)
    base_loop = False

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.to_loop: list[tuple[str, Any]] = []  # instructions for the loop; under the runtime's lock
        self.drain_scheduled = False

    # -- tokens ------------------------------------------------------------------

    def token(self) -> Any:
        """A one-shot the calling coroutine awaits (in its own loop or run); ``settle`` completes it."""
        return new_token()

    def foreign(self, token: Any) -> bool:
        """Is ``token`` (or a task's watcher) another loop's, run's or thread's (``ThreadToken``): woken there,
        not here?"""
        if isinstance(token, asyncio.Future):
            return token.get_loop() is not self.home
        return isinstance(token, Token) and token.home is not self.home

    def running_loop(self) -> Any:
        """``asyncio._get_running_loop()``, which makes a system call (``getpid``) each time: read without it
        where the engine's loop is the one running on this thread."""
        loop: Any = self.loop
        if self.base_loop and loop._thread_id == get_ident():
            return loop
        return asyncio._get_running_loop()

    async def wait(self, task: Task) -> None:
        """Wait, in whichever library runs the caller, until ``task`` is final (``Runtime.wait``)."""
        rt = self.rt
        if rt.forked:
            raise EngineClosed(FORKED)
        loop: Any = self.loop  # (running_loop(), inlined: this runs at every await)
        if not self.base_loop or loop._thread_id != get_ident():
            loop = asyncio._get_running_loop()
        if loop is None:
            waiter: Any = new_token()
        elif loop is self.loop and self.base_loop:  # (a task of the engine's loop: the drain wakes it)
            waiter = LoopWaiter(loop)
        else:
            waiter = loop.create_future()
        with rt.lock:
            if task.state in FINAL_STATES:
                return
            if loop is not self.loop or (loop is None and waiter.home is not self.home):
                # another loop's, or another trio run's: from now on, collect looks for their waiters
                rt.other_loops = True
            if task.watchers is None:  # watch(task, waiter), inlined: this runs at every await
                task.watchers = [waiter]
            else:
                task.watchers.append(waiter)
            if rt.core.staged and not rt.door.gathering:  # (a batch gathering its burst: at the flush)
                rt.core.publish()
            after = rt.collect()
        if after is not None:
            after()
        try:
            await waiter
        except BaseException:  # cancelled (either library's way), or interrupted
            rt.unwatch(task, waiter)
            raise

    # -- the burst of instructions ---------------------------------------------------

    def post(self, items: list[tuple[str, Any]], wakes: list[Callable[[], None]]) -> None:
        """With the runtime's lock held: deliver ``items`` on the loop; the first of a burst adds the
        drain to ``wakes`` (called once the lock is released)."""
        self.to_loop += items
        if not self.drain_scheduled:
            self.drain_scheduled = True
            wakes.append(self._schedule_drain)

    def _schedule_drain(self) -> None:
        raise NotImplementedError

    def _dropped(self) -> None:
        """The loop has ended: nobody can await anything any more."""
        with self.rt.lock:
            self.to_loop.clear()
            self.drain_scheduled = False

    def _drain(self) -> None:
        with self.rt.lock:
            items, self.to_loop = self.to_loop, []
            self.drain_scheduled = False
        waiters = self._deliver(items)
        del items  # (the Tasks woken below may drop the last reference to a task: this frame holds none)
        for k, waiter in enumerate(waiters):
            try:
                waiter.wake()  # (its Task steps now, not in a callback of the next turn)
            except BaseException:  # KeyboardInterrupt or SystemExit out of its step: the rest later
                _wake_soon(waiters[k + 1 :])
                raise

    def _deliver(self, items: list[tuple[str, Any]]) -> list[LoopWaiter]:
        """Wake the watchers of ``items``, but for the ``LoopWaiter``s, which it returns."""
        loop, own_future = self.loop, self.own_future
        waiters: list[LoopWaiter] = []
        for i, (kind, obj) in enumerate(items):
            if kind != "resolve":  # "admitted" / "barrier": obj is a token
                try:
                    fire(obj, None)
                except BaseException:  # KeyboardInterrupt or SystemExit in a callback: the rest later
                    self._later(items[i + 1 :])
                    _wake_soon(waiters)
                    raise
                continue
            watchers, obj.watchers = obj.watchers, None  # fired once; let them go
            for j, watcher in enumerate(watchers or ()):
                try:
                    if type(watcher) is LoopWaiter:
                        waiters.append(watcher)
                    elif type(watcher) is own_future and watcher.get_loop() is loop:
                        if not watcher.done():  # (this loop's own waiter: settle, without a call)
                            watcher.set_result(None)
                    elif type(watcher) is not _LockType:
                        fire(watcher, obj)
                except BaseException:  # KeyboardInterrupt or SystemExit: the task's other watchers later too
                    obj.watchers = list(watchers[j + 1 :]) or None
                    self._later(items[i:] if obj.watchers else items[i + 1 :])
                    _wake_soon(waiters)
                    raise
        return waiters

    def _later(self, items: list[tuple[str, Any]]) -> None:
        """Deliver ``items`` in a drain of their own (a callback of this one interrupted it)."""
        with self.rt.lock:
            self.to_loop[:0] = items
            rearm = not self.drain_scheduled and bool(self.to_loop)
            self.drain_scheduled = self.drain_scheduled or rearm
        if rearm:
            self._schedule_drain()

    def forget(self) -> None:
        """In a forked child: nothing is delivered to a loop that does not run here."""
        self.to_loop = []
        self.drain_scheduled = False


class AsyncioBridge(Bridge):
    """Hands the runtime's instructions to one asyncio event loop."""

    loop: asyncio.AbstractEventLoop

    def __init__(self, rt: Runtime, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(rt)
        self.loop = self.home = loop
        self.own_future = asyncio.Future
        #: the loop runs on this thread now if its ``_thread_id`` is this thread's: read without the system
        #: call (``getpid``) ``asyncio._get_running_loop()`` makes every time
        self.base_loop = isinstance(loop, asyncio.BaseEventLoop)
        #: has the loop closed?  (its own method, bound: asked on every submission, so no frame of ours)
        self.closed = loop.is_closed

    def current(self) -> Any:
        """The coroutine's task running now on the engine's loop, or None (another loop, a thread)."""
        if asyncio._get_running_loop() is not self.loop:
            return None
        return asyncio.current_task()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the loop's thread soon (from that thread), once the caller has yielded."""
        self.loop.call_soon(fn, *args)

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the loop soon, from any thread (RuntimeError once the loop is closed)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def call_later(self, delay: float, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Run ``fn`` on the loop after ``delay`` seconds (from the loop's thread); returns its cancel."""
        return self.loop.call_later(delay, fn).cancel

    def spawn(self, fn: Callable[[], Awaitable[Any]], name: str, interruptible: bool = True) -> Job:
        """Run ``fn()`` in the background on the loop until it ends or ``job.cancel()`` (Ctrl-C
        interrupts any task on asyncio: ``interruptible`` is for trio's)."""
        import anyio

        job = Job()
        job.finished = anyio.Event()

        async def run() -> None:
            try:
                await fn()
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # (Ctrl-C, SystemExit: out of the loop, as from any task)
                job.error = exc
            finally:
                job.finished.set()

        task = self.loop.create_task(run(), name=name)
        job._cancel = task.cancel
        return job

    def watch_end(self, callback: Callable[[], None]) -> Any:
        """Call ``callback`` when the loop shuts down with this still open (``_lifecycle``)."""
        from .._lifecycle import on_asyncio_end

        return on_asyncio_end(callback)

    def _schedule_drain(self) -> None:
        try:
            if on_loop(self.loop):
                self.loop.call_soon(self._drain)
            else:
                self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # loop closed: nobody can await anything any more
            self._dropped()


def open_bridge(rt: Runtime) -> AsyncioBridge | Any:
    """The bridge for the async library running this call: asyncio, or trio (through anyio or not)."""
    loop = _load_asyncio()._get_running_loop()
    if loop is not None:
        return AsyncioBridge(rt, loop)
    if _in_trio():
        from ._trio import TrioBridge

        return TrioBridge(rt)
    raise SchedsvcError(
        "the engine starts inside a running event loop: asyncio (asyncio.run(main())), trio "
        "(trio.run(main)) or anyio (anyio.run(main, backend='trio')); from code with no event loop "
        "use schedsvc.executor()"
    )


def _in_trio() -> bool:
    trio = sys.modules.get("trio")
    return trio is not None and bool(trio.lowlevel.in_trio_run())


def new_token() -> Any:
    """A one-shot for the calling coroutine, in whichever library runs it."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        return loop.create_future()
    if _in_trio():
        from ._trio import Waiter

        return Waiter()
    raise SchedsvcError("an engine's futures are awaited inside a running asyncio or trio event loop")


def is_cancellation(exc: BaseException) -> bool:
    """Is ``exc`` the cancellation of the coroutine it reached (asyncio's or trio's)?"""
    if isinstance(exc, asyncio.CancelledError):
        return True
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(exc, trio.Cancelled)


def watch(task: Task, watcher: Any) -> None:
    """Add ``watcher`` (a token, a callback, a thread's gate) to those woken when ``task`` is final."""
    if task.watchers is None:
        task.watchers = [watcher]
    else:
        task.watchers.append(watcher)


def unwatch(task: Task, watcher: Any) -> None:
    """Take ``watcher`` off ``task``'s (it gave up waiting), unless the task is final already."""
    if task.watchers is not None and task.state not in FINAL_STATES:
        with contextlib.suppress(ValueError):
            task.watchers.remove(watcher)


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


# built once: `asyncio.Future | Token` makes a new union at every call.  Until asyncio is loaded no asyncio
# future exists: a token is made after asking asyncio for the running loop, which loads it
_TOKEN_TYPES: tuple[type, ...] = (Token,)


def fire(watcher: Any, task: Task | None) -> None:
    """Wake a token (in its own loop) or call a done-callback."""
    if isinstance(watcher, _TOKEN_TYPES):
        settle(watcher)
        return
    try:
        watcher(task)
    except (KeyboardInterrupt, SystemExit):  # as asyncio's callbacks: these stop the loop
        raise
    except BaseException as exc:  # a callback's error (any other) must not stop the others
        report(exc, f"exception in done callback {watcher!r} of {task!r}")


def report(exc: BaseException, message: str) -> None:
    """An error nobody can be raised to: to asyncio's exception handler, or else the ``schedsvc.engine``
    logger."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        loop.call_exception_handler({"message": message, "exception": exc})
    else:
        import logging  # (only for an error nobody can be raised to)

        from .._logging import ENGINE

        logging.getLogger(ENGINE).error(message, exc_info=exc)


def settle(token: Any, error: BaseException | None = None) -> None:
    """Complete a token (with ``error``, if given) from any thread, in its own loop."""
    if not isinstance(token, asyncio.Future):
        token.settle(error)
        return

    def complete() -> None:
        if token.done():
            return
        if error is None:
            token.set_result(None)
        else:
            token.set_exception(error)

    loop = token.get_loop()
    if on_loop(loop):
        complete()
    else:
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there
            loop.call_soon_threadsafe(complete)
