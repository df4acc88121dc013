"""The bridge from worker threads to the event loop, for asyncio.

Worker threads never touch the loop's objects.  What the loop must learn (a
task somebody awaits is final, a queued submission got in, a ``waitall`` is
satisfied) is ``post``-ed under the runtime's lock, and the first item of a
burst schedules one ``call_soon_threadsafe(drain)``; the rest ride along.  A
*token* is the loop-side object one waiter awaits (an asyncio future here);
``settle`` completes one from any thread, on its own loop, so a coroutine
awaiting on another loop is woken there directly.

This module is the only part of the runtime that knows asyncio's objects.  A
second async library (trio) is a second class with these methods, chosen at
engine start; the runtime calls nothing else of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._core import FINAL_STATES
from .._errors import FORKED, EngineClosed
from ._threads import ThreadToken

if TYPE_CHECKING:
    from .._core import Task
    from ._runtime import Runtime

__all__ = ["AsyncioBridge", "fire", "on_loop", "settle", "unwatch", "watch"]

_LockType = type(threading.Lock())


class AsyncioBridge:
    """Hands the runtime's instructions to one asyncio event loop."""

    #: what a waiter's wait raises when its caller is cancelled
    Cancelled = asyncio.CancelledError

    def __init__(self, rt: Runtime, loop: asyncio.AbstractEventLoop) -> None:
        self.rt = rt
        self.loop = loop
        self.to_loop: list[tuple[str, Any]] = []  # instructions for the loop; under the runtime's lock
        self.drain_scheduled = False
        #: has the loop closed?  (its own method, bound: asked on every submission, so no frame of ours)
        self.closed: Callable[[], bool] = loop.is_closed

    # -- tokens ------------------------------------------------------------------

    def token(self) -> asyncio.Future[None]:
        """A one-shot the calling coroutine awaits (on its own loop); ``settle`` completes it."""
        return asyncio.get_running_loop().create_future()

    def foreign(self, token: Any) -> bool:
        """Is ``token`` (or a task's watcher) a future of another event loop, or a thread's (woken off the loop)?"""
        if type(token) is ThreadToken:
            return True
        return isinstance(token, asyncio.Future) and token.get_loop() is not self.loop

    def current(self) -> Any:
        """The coroutine's task running now on the engine's loop, or None (another loop, a thread)."""
        if asyncio._get_running_loop() is not self.loop:
            return None
        return asyncio.current_task()

    async def wait(self, task: Task) -> None:
        """Wait on the event loop until ``task`` is final (``Runtime.wait``)."""
        rt = self.rt
        if rt.forked:
            raise EngineClosed(FORKED)
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        with rt.lock:
            if task.state in FINAL_STATES:
                return
            if loop is not self.loop:
                rt.other_loops = True  # from now on, collect looks for their waiters
            watch(task, waiter)
            if rt.core.staged:
                rt.core.publish()
            after = rt.collect()
        if after is not None:
            after()
        try:
            await waiter
        except asyncio.CancelledError:
            with rt.lock:
                unwatch(task, waiter)
            raise

    # -- scheduling on the loop --------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_for(self, token: asyncio.Future[None], timeout: float) -> None:
        """Await ``token`` for at most ``timeout`` seconds (TimeoutError after; the token is cancelled)."""
        await asyncio.wait_for(token, timeout)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the loop's thread soon (from that thread)."""
        self.loop.call_soon(fn, *args)

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the loop soon, from any thread (RuntimeError once the loop is closed)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def post(self, items: list[tuple[str, Any]], wakes: list[Callable[[], None]]) -> None:
        """With the runtime's lock held: deliver ``items`` on the loop; the first of a burst adds the
        drain to ``wakes`` (called once the lock is released)."""
        self.to_loop += items
        if not self.drain_scheduled:
            self.drain_scheduled = True
            wakes.append(self._schedule_drain)

    def _schedule_drain(self) -> None:
        try:
            if on_loop(self.loop):
                self.loop.call_soon(self._drain)
            else:
                self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # loop closed: nobody can await anything any more
            with self.rt.lock:
                self.to_loop.clear()
                self.drain_scheduled = False

    def _drain(self) -> None:
        with self.rt.lock:
            items, self.to_loop = self.to_loop, []
            self.drain_scheduled = False
        for i, (kind, obj) in enumerate(items):
            try:
                if kind == "resolve":
                    watchers, obj.watchers = obj.watchers, None  # fired once; let them go
                    for watcher in watchers or ():
                        if type(watcher) is not _LockType:
                            fire(watcher, obj)
                else:  # "admitted" / "barrier": obj is a token
                    fire(obj, None)
            except BaseException:  # KeyboardInterrupt in a callback: deliver the rest later
                with self.rt.lock:
                    self.to_loop[:0] = items[i + 1 :]
                    rearm = not self.drain_scheduled and bool(self.to_loop)
                    self.drain_scheduled = self.drain_scheduled or rearm
                if rearm:
                    self._schedule_drain()
                raise

    def forget(self) -> None:
        """In a forked child: nothing is delivered to a loop that does not run here."""
        self.to_loop = []
        self.drain_scheduled = False


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


def fire(watcher: Any, task: Task | None) -> None:
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


def settle(token: asyncio.Future[None] | ThreadToken, error: BaseException | None = None) -> None:
    """Complete an asyncio future (with ``error``, if given) from any thread, on its own loop; a
    thread's token is settled here and now."""
    if type(token) is ThreadToken:
        token.set(error)
        return
    assert isinstance(token, asyncio.Future)

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
