"""The engine as a ``concurrent.futures.Executor``: ``eng.executor()`` and ``ss.executor()``.

``eng.executor()`` is a view of a running engine for synchronous code in
other threads and for libraries that take an executor (``loop.run_in_executor``,
``concurrent.futures.wait``/``as_completed``).  ``ss.executor(**config)`` is the
same for programs with no event loop: it owns an engine, run on a private
event loop thread, and closes it at ``shutdown()``.

Its futures are real ``concurrent.futures.Future``s, completed where their
task ends (on the worker that ran it, or the thread that cancelled it), never
through the event loop: a program whose loop is busy, or that has none, still
sees them complete.  ``submit`` from a thread at the engine's limits blocks
that thread in the admission queue (FIFO with ``await eng.submit``); from a
running task it is admitted over the limits; on the event loop's thread, where
blocking would stall the engine's loop, it raises ``QueueFull`` instead.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, RUNNING
from threading import get_ident
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ._core import FINAL_STATES
from ._errors import EngineClosed, QueueFull, SchedsvcError
from ._runtime import BLOCK, NOW, current_worker
from ._submission import build_task, plain_options

if TYPE_CHECKING:
    from ._config import Config
    from ._engine import Engine
    from ._future import Future
    from ._runtime import Found

__all__ = ["EngineExecutor", "ExecutorFuture", "executor"]

T = TypeVar("T")
P = ParamSpec("P")

_AFTER_SHUTDOWN = "cannot schedule new futures after shutdown"


#: this thread's waits in concurrent.futures.wait/as_completed (``counts``: waiter id -> how many futures it is on)
_waits = threading.local()


class _Waiters(list[Any]):
    """An executor future's waiters: ``concurrent.futures.wait`` and ``as_completed`` put their caller's waiter
    on each future it waits for, then block on it, then take it off.  A worker of the engine that blocks so
    counts as blocked meanwhile (from the first future's to the last one's), and its pool starts a stand-in:
    tasks that wait so for the engine's other tasks never starve it (``Future.result`` does the same)."""

    __slots__ = ()

    def append(self, waiter: Any) -> None:
        super().append(waiter)
        _blocked(waiter, +1)

    def remove(self, waiter: Any) -> None:
        super().remove(waiter)
        _blocked(waiter, -1)


def _blocked(waiter: Any, delta: int) -> None:
    """Count ``waiter`` on one more (or one fewer) future of this thread's; a worker blocks from the first to
    the last."""
    worker = current_worker()
    if worker is None:  # not one of the engine's workers: nothing can starve
        return
    counts: dict[int, int] = _waits.__dict__.setdefault("counts", {})
    key = id(waiter)
    count = counts.get(key, 0) + delta
    if count:
        counts[key] = count
    else:
        counts.pop(key, None)
    if (delta > 0 and count == 1) or (delta < 0 and count == 0):
        worker.blocking(delta)


class ExecutorFuture(concurrent.futures.Future[T]):
    """A ``concurrent.futures.Future`` of one engine task; pass it to ``eng.submit`` to depend on it.

    ``cancel()`` cancels the task if it has not started (False once it runs).
    """

    def __init__(self, task: Future[T], owner: EngineExecutor) -> None:
        super().__init__()
        self._task = task  # the engine's record: its value is what a dependent task takes
        self._owner = owner
        self._waiters = _Waiters()  # (concurrent.futures.wait and as_completed install theirs here)

    def cancel(self) -> bool:
        """Cancel the task if it has not started; False once it runs or has finished."""
        state = self._state
        if state in (CANCELLED, CANCELLED_AND_NOTIFIED):
            return True
        if state == FINISHED:
            return False
        # the engine cancels it (and what takes its value) and marks this future, on this thread
        # (the task's off-loop watcher runs before the runtime's cancel returns)
        return self._task.cancel()

    def result(self, timeout: float | None = None) -> T:
        """The task's value (its exception raised), waiting as ``Future.result`` does (see ``_wait``).

        On the event loop's thread, a task that has not finished raises
        SchedsvcError instead of blocking the loop that drives the engine.
        """
        if self._state != FINISHED:
            timeout = self._wait(timeout, "result()")
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state != FINISHED:
            timeout = self._wait(timeout, "exception()")
        return super().exception(timeout)

    def _wait(self, timeout: float | None, call: str) -> float | None:
        """Wait as ``Future.result`` does before the standard wait; return the time left of ``timeout``.

        On one of the engine's workers (a task waiting on another), a queued task
        runs right here, or the pool starts a stand-in while this worker blocks: a
        task waiting on another never starves the engine.  On another thread
        without a timeout, a task still queued runs right here too (this thread
        would only wait); with a timeout it waits, so the timeout holds whatever
        the task takes.  The event loop's thread never runs a task, nor waits for
        one: its work may be held until the loop runs again.
        """
        port = self._task._port
        if port.on_loop_thread():
            if self._task.state not in FINAL_STATES:
                raise _blocks_the_loop(self, call)
            return timeout  # final: this future is being completed on the thread that ended it
        if timeout is not None and not port.in_task():
            return timeout
        if timeout is None:
            port.wait_blocking(self._task, None)
            return None
        deadline = time.monotonic() + timeout
        port.wait_blocking(self._task, timeout)
        return max(0.0, deadline - time.monotonic())

    def running(self) -> bool:
        return self._state == RUNNING or self._task.state in ("running", "launched")

    def _task_final(self) -> None:
        """Where the task ended (off the event loop): complete this future from it.  Called once."""
        task = self._task
        self._owner._forget(self)  # first: a caller that drops this future must free its value
        if task.state == "cancelled":
            concurrent.futures.Future.cancel(self)
            self.set_running_or_notify_cancel()  # what wait() and as_completed() look for
        elif task.state == "done":
            self.set_result(task.value)
        else:
            assert task.error is not None
            self.set_exception(task.error)

    # passed to eng.submit: the scanner depends on its task, and the task receives its value
    def __schedsvc_visit__(self, found: Found, write: bool) -> None:
        found.deps.append(self._task)

    def __schedsvc_substitute__(self) -> Any:
        return self._task.value


def _results(
    futures: list[ExecutorFuture[T]], end: float | None, unsubmitted: bool, timeout: float | None
) -> Iterator[T]:
    """``map``'s iterator: each result in order, waiting until ``end``; the futures not reached are
    cancelled when it stops.  ``unsubmitted``: an item after these found no room in time."""
    try:
        futures.reverse()
        while futures:  # (no local holds a future while its result is yielded: the caller may drop it)
            yield _result_or_cancel(futures.pop(), None if end is None else end - time.monotonic())
        if unsubmitted:
            raise TimeoutError(
                f"Executor.map: the engine was at its limits for the whole timeout of {timeout} s, so not every "
                "item could be submitted; give map a longer timeout, or raise the engine's max_pending"
            )
    finally:
        for fut in futures:
            fut.cancel()


def _result_or_cancel(fut: ExecutorFuture[T], timeout: float | None) -> T:
    try:
        return fut.result(timeout)
    finally:
        fut.cancel()


def _blocks_the_loop(fut: ExecutorFuture[Any], call: str) -> SchedsvcError:
    """The refusal of a blocking wait for an executor future on the event loop's thread."""
    return SchedsvcError(
        f"{fut!r}.{call} on the event loop's thread would block the loop that drives the engine until "
        "the value is there; on the loop, pass the future to eng.submit or eng.asarray as a dependency, "
        "or await it ('await asyncio.wrap_future(fut)' under asyncio); "
        f"{call} is for other threads"
    )


class EngineExecutor(concurrent.futures.Executor):
    """A ``concurrent.futures.Executor`` submitting to an engine (``eng.executor()``, ``ss.executor()``).

    ``submit(fn, *args, **kwargs)`` passes every keyword to ``fn``; the
    device and priority of its tasks are the executor's.  ``shutdown()``
    stops taking work and waits for (or, with ``cancel_futures``, cancels
    the unstarted of) the futures it returned; an executor from
    ``ss.executor()`` also closes its engine.
    """

    def __init__(self, engine: Engine, device: str | None = None, priority: int = 0) -> None:
        if engine.config.backend == "dask":
            raise SchedsvcError(
                "eng.executor() is not available with backend='dask': its values stay on the cluster "
                "until fetched; use the Dask client's own executor (client.get_executor()), "
                "or backend='threads'"
            )
        if type(priority) is not int:
            raise TypeError(f"priority must be an int, got {priority!r}")
        port = engine._port
        self._engine = engine
        self._port = port
        self._device = port.default_device if device is None else port.device(device)
        self._options = plain_options(self._device, priority)  # what each of its submissions takes
        self._lock = threading.Lock()
        self._shutdown = False
        self._live: set[ExecutorFuture[Any]] | None = set()  # returned and not final (shutdown waits)
        self._loop_thread: _LoopThread | None = None  # ss.executor(): the loop its engine runs on

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> ExecutorFuture[T]:
        """Run ``fn(*args, **kwargs)`` as a task; a concurrent.futures.Future of its result.

        Every keyword goes to ``fn``, ``name=`` and ``priority=`` included: the
        engine's options here are the executor's (``eng.executor(device=, priority=)``).

        At the engine's limits it blocks this thread until there is room (a
        task submitting is admitted over them; on the event loop's thread it
        raises QueueFull).  RuntimeError after ``shutdown()``.
        """
        return self._submit(fn, args, kwargs, None)

    def _submit(
        self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
    ) -> ExecutorFuture[T]:
        """``submit``; a thread at the limits waits at most ``timeout`` seconds for room (then the
        future comes back cancelled, never admitted)."""
        if self._shutdown:
            raise RuntimeError(_AFTER_SHUTDOWN)
        port = self._port
        tid = get_ident()
        if not port.started or (port.state != "running" and tid not in port.worker_threads):
            if self._shutdown:  # shut down meanwhile (and its engine closed)
                raise RuntimeError(_AFTER_SHUTDOWN)
            raise port.refusal()
        task: Future[T]
        task, written = build_task(port, fn, args, kwargs, tid, self._options)
        fut = ExecutorFuture(task, self)
        port.watch_off_loop(task, fut._task_final)
        if self._live is not None and not self._track(fut):
            raise RuntimeError(_AFTER_SHUTDOWN)
        # a thread blocks in the admission queue at the limits; the event loop's thread must not
        on_loop = tid == port.loop_thread and tid not in port.worker_threads
        try:
            # BLOCK: False if cancelled while it waited, or not admitted within the timeout (cancelled too)
            if not port.admit(task, tid, NOW if on_loop else BLOCK, written, None, timeout) and on_loop:
                raise QueueFull(
                    port.full_message(task)
                    + " (executor.submit() on the event loop's thread does not block the loop)"
                )
        except EngineClosed:
            if task.state == "cancelled":  # queued, then the engine closed cancelling pending work
                return fut
            self._forget(fut)
            if self._shutdown:  # shut down meanwhile (and its engine closed)
                raise RuntimeError(_AFTER_SHUTDOWN) from None
            raise
        except BaseException:  # not admitted (QueueFull, MemoryLimitError, closed): as if never submitted
            self._forget(fut)
            raise
        return fut

    def map(
        self, fn: Callable[..., T], /, *iterables: Any, timeout: float | None = None, chunksize: int = 1
    ) -> Iterator[T]:
        """``Executor.map``: ``fn`` of each item, as tasks submitted now; an iterator of their results.

        ``timeout`` counts from this call, and bounds the submissions that wait
        for room at the engine's limits too: an item that could not be
        submitted, or whose result is not there, by then raises TimeoutError
        at its turn, and the items after it are cancelled.
        """
        end = None if timeout is None else time.monotonic() + timeout
        futures: list[ExecutorFuture[T]] = []
        unsubmitted = False
        try:
            for args in zip(*iterables, strict=False):
                left = None if end is None else max(0.0, end - time.monotonic())
                fut = self._submit(fn, args, {}, left)
                if end is not None and fut.cancelled() and time.monotonic() >= end:
                    unsubmitted = True  # no room for it within the timeout
                    break
                futures.append(fut)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
        return _results(futures, end, unsubmitted, timeout)

    def _track(self, fut: ExecutorFuture[Any]) -> bool:
        """Count ``fut`` among those shutdown waits for; False if shut down meanwhile."""
        with self._lock:
            if self._shutdown or self._live is None:
                return False
            self._live.add(fut)
            return True

    def _forget(self, fut: ExecutorFuture[Any]) -> None:
        live = self._live
        if live is not None:
            with self._lock:
                live.discard(fut)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; cancel the unstarted tasks (``cancel_futures``); wait for the rest (``wait``)."""
        with self._lock:
            self._shutdown = True
            live = list(self._live or ())
        loop_thread = self._loop_thread
        if wait and self._on_worker():
            raise SchedsvcError(
                f"{self!r}.shutdown(wait=True) inside one of its engine's tasks would wait for that "
                "task itself; call shutdown(wait=False) there, or shut down outside the tasks"
            )
        if loop_thread is not None:
            loop_thread.close(cancel_futures)
            if wait:
                loop_thread.join()
            return
        if cancel_futures:
            for fut in live:
                fut.cancel()
        if wait and live:
            concurrent.futures.wait(live)

    def _on_worker(self) -> bool:
        return self._port.in_task()

    @property
    def engine(self) -> Engine:
        """The engine it submits to."""
        return self._engine

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "open"
        return f"<EngineExecutor {state} device={self._device} engine={self._engine!r}>"


def executor(
    config: Config | None = None, /, *, max_workers: int | None = None, **overrides: Any
) -> EngineExecutor:
    """A ``concurrent.futures.Executor`` that owns an engine, for programs with no event loop.

    ``ss.executor(max_workers=4)`` (the engine's ``cpu_workers``), or a
    ``Config`` and/or its fields as keywords, as ``ss.Engine`` takes them.
    The engine runs on a private event loop thread; ``shutdown()`` (or
    leaving ``with``) closes it: it finishes the work submitted (or cancels
    what has not started, with ``cancel_futures=True``) and ends its threads.
    """
    if max_workers is not None:
        if type(max_workers) is not int:
            raise TypeError(f"max_workers must be an int, got {max_workers!r}")
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        overrides["cpu_workers"] = max_workers
    from ._engine import Engine

    engine = Engine(config, **overrides)  # a bad setting fails here, in the caller's thread
    ex = EngineExecutor(engine)
    ex._live = None  # shutdown closes the engine, which waits for (or cancels) everything
    loop_thread = _LoopThread(engine)
    _OPEN.add(loop_thread)
    loop_thread.start()
    ex._loop_thread = loop_thread
    weakref.finalize(
        ex, loop_thread.close, False
    )  # dropped without shutdown: the work finishes, then it closes
    return ex


class _LoopThread:
    """The event loop thread of ``ss.executor()``: it starts the engine, then serves until told to close."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Future[bool] | None = None
        self.closing = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._main, name="schedsvc-executor-loop", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.ready.wait()
        if self.error is not None:
            self.thread.join()
            raise self.error

    def _main(self) -> None:
        try:
            with asyncio.Runner() as runner:
                runner.run(self._serve())
        finally:
            _OPEN.discard(self)

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stop = self.loop.create_future()
        try:
            await self.engine.start()
        except BaseException as exc:  # raised in the thread that called ss.executor()
            self.error = exc
            return
        finally:
            self.ready.set()
        cancel = await self.stop
        await self.engine.aclose(cancel_pending=cancel)

    def close(self, cancel: bool) -> None:
        """From any thread: close the engine (cancelling unstarted work with ``cancel``); the first call counts."""
        with self.lock:
            if self.closing or self.loop is None:
                return
            self.closing = True
        stop = self.stop
        assert stop is not None
        with contextlib.suppress(RuntimeError):  # its loop ended already
            self.loop.call_soon_threadsafe(_stop, stop, cancel)

    def join(self) -> None:
        if self.thread is not threading.current_thread():
            self.thread.join()


def _stop(stop: asyncio.Future[bool], cancel: bool) -> None:
    if not stop.done():
        stop.set_result(cancel)


_OPEN: set[_LoopThread] = set()  # the loop threads of ss.executor() engines still running


@atexit.register
def _close_at_exit() -> None:
    """At interpreter exit, ss.executor() engines left open (or shut down without waiting) finish their
    work and close, as ThreadPoolExecutor's threads do."""
    for loop_thread in list(_OPEN):
        loop_thread.close(False)
        loop_thread.join()
