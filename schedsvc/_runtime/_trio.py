"""The bridge for trio (imported only when an engine starts inside a trio run).

Trio has no futures: a ``Waiter`` parks the awaiting trio task with
``wait_task_rescheduled`` and ``settle`` reschedules it, in the run's thread
(from another thread through the run's token, ``run_sync_soon``).  A cancel
scope that cancels the parked task takes it off the waiter (``Abort.SUCCEEDED``):
it raises ``trio.Cancelled`` as every trio checkpoint does.  The burst of
instructions for the loop is drained by one ``run_sync_soon`` callback, as
asyncio's is by one ``call_soon_threadsafe``.

A system task that sleeps until the run ends tells the engine that its loop
has gone (what ``asyncio.run``'s ``shutdown_asyncgens`` does for asyncio) and
runs ``eng.map``'s feeders: trio's structured concurrency has no other place
for a task that outlives the call that started it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

import anyio
import trio

from ._bridge import Bridge, Job, Token, report

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["TrioBridge", "Waiter"]


class Waiter(Token):
    """A one-shot one trio task awaits; ``settle`` wakes it from any thread."""

    __slots__ = ("error", "home", "is_done", "task", "thread")

    def __init__(self) -> None:
        self.home = trio.lowlevel.current_trio_token()
        self.thread = threading.get_ident()
        self.task: trio.lowlevel.Task | None = None  # the task parked on it
        self.is_done = False
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.is_done

    def __await__(self) -> Generator[Any, None, None]:
        if not self.is_done:
            self.task = trio.lowlevel.current_task()
            yield from trio.lowlevel.wait_task_rescheduled(self._abort).__await__()
        if self.error is not None:
            raise self.error

    def _abort(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        self.task = None  # cancelled while parked: a later settle wakes nobody
        return trio.lowlevel.Abort.SUCCEEDED

    def settle(self, error: BaseException | None = None) -> None:
        if threading.get_ident() == self.thread:
            self._settle(error)
            return
        with contextlib.suppress(trio.RunFinishedError):  # the run is over: nobody waits there
            self.home.run_sync_soon(self._settle, error)

    def _settle(self, error: BaseException | None) -> None:
        if self.is_done:
            return
        self.is_done = True
        self.error = error
        task = self.task
        if task is not None and trio.lowlevel.in_trio_run():
            self.task = None
            trio.lowlevel.reschedule(task)


class TrioBridge(Bridge):
    """Hands the runtime's instructions to one trio run."""

    loop = None

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.home = trio.lowlevel.current_trio_token()
        self.ended = False  # the run's main task has returned
        self.closed = self._has_ended
        self._on_end: list[Callable[[], None]] = []
        self._watching = trio.CancelScope()  # cancelled once nobody watches: the task lets the engine go
        trio.lowlevel.spawn_system_task(self._until_the_run_ends, name="schedsvc: end of the trio run")

    def _has_ended(self) -> bool:
        return self.ended

    async def _until_the_run_ends(self) -> None:
        with self._watching:
            try:
                await trio.sleep_forever()
            finally:
                if not self._watching.cancel_called:  # the run is ending (it cancels its system tasks)
                    self.ended = True
                    for callback in self._on_end:
                        _guarded(callback)

    def current(self) -> Any:
        """The trio task running now (on the run's thread), or None outside the run -- with the count of
        its yields to the scheduler: a throttle caller holds its slot only until it next yields, and the
        release (``run_sync_soon``) may run after its wake-up in the same batch (trio orders a batch at
        random), so a caller that has yielded since is not the one that holds the slot."""
        try:
            task = trio.lowlevel.current_task()
        except RuntimeError:
            return None
        return (task, getattr(task, "_schedule_points", 0))  # (what trio.testing's checkpoint checks count)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` in the run soon, once the caller has yielded."""
        self.call_soon_threadsafe(fn, *args)

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` in the run soon, from any thread (RuntimeError once the run has ended)."""
        try:
            self.home.run_sync_soon(_guarded, fn, *args)
        except trio.RunFinishedError as exc:
            raise RuntimeError("the trio run has ended") from exc

    def call_later(self, delay: float, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Run ``fn`` in the run after ``delay`` seconds (from the run's thread); returns its cancel."""

        async def later() -> None:
            await trio.sleep(delay)
            fn()

        return self.spawn(later, "schedsvc: timer").cancel

    def spawn(self, fn: Callable[[], Awaitable[Any]], name: str, interruptible: bool = False) -> Job:
        """Run ``fn()`` in the background (a system task of the run) until it ends or ``job.cancel()``.

        System tasks are shielded from Ctrl-C; ``interruptible`` lets it raise there (the user's code that
        ``fn`` runs, as ``eng.map``'s source), for ``fn`` to hand on: a job holds what it raised."""
        job = Job()
        job.finished = anyio.Event()
        scope = trio.CancelScope()
        job._cancel = scope.cancel

        async def run() -> None:
            try:
                with scope:
                    await fn()
            except BaseException as exc:  # a system task must not raise: the job holds it
                job.error = exc
            finally:
                job.finished.set()

        trio.lowlevel.spawn_system_task(_interruptible if interruptible else _protected, run, name=name)
        return job

    def watch_end(self, callback: Callable[[], None]) -> Any:
        """Call ``callback`` when the run ends with this still open; ``finish(handle)`` forgets it."""
        self._on_end.append(callback)
        return _Forget(self, callback)

    def _schedule_drain(self) -> None:
        try:
            self.home.run_sync_soon(self._drain_guarded)
        except trio.RunFinishedError:  # the run is over: nobody can await anything any more
            self._dropped()

    def _drain_guarded(self) -> None:
        _guarded(self._drain)


async def _protected(run: Callable[[], Awaitable[None]]) -> None:
    await run()


@trio.lowlevel.disable_ki_protection
async def _interruptible(run: Callable[[], Awaitable[None]]) -> None:
    await run()


class _Forget:
    """``watch_end``'s handle: ``cancel()`` takes the callback off, and ends the watch when none is left (an
    engine closed in a long run is not kept alive by it)."""

    __slots__ = ("bridge", "callback")

    def __init__(self, bridge: TrioBridge, callback: Callable[[], None]) -> None:
        self.bridge, self.callback = bridge, callback

    def cancel(self) -> None:
        callbacks = self.bridge._on_end
        if self.callback in callbacks:
            callbacks.remove(self.callback)
        if not callbacks:
            self.bridge._watching.cancel()


def _guarded(fn: Callable[..., Any], *args: Any) -> None:
    """Run a callback in the run's own context: what it raises is reported, as trio allows none there."""
    try:
        fn(*args)
    except BaseException as exc:
        report(exc, f"schedsvc: exception in {fn!r} on the trio run")
