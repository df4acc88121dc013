"""``Future``: the handle ``submit`` returns, awaitable from asyncio and trio, blockable from threads."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, cast

from ._core import FINAL_STATES, Task
from ._errors import SchedsvcError, stop_through_await
from ._runtime import Remote, is_cancellation

if TYPE_CHECKING:
    import asyncio

    from ._port import Port

    # a type checker sees an asyncio future (asyncio.wait, gather and as_completed take it); at run time it
    # is not one, it speaks the protocol (asyncio.isfuture)
    _AsyncioFuture = asyncio.Future
else:
    _AsyncioFuture = Generic

__all__ = ["Future"]

T = TypeVar("T")
_SET = (
    "{self!r}.{what}: a task's outcome is set by the engine when the task ends; for a value of your own "
    "to await, make an asyncio future (loop.create_future()) or an anyio Event"
)


class Future(Task, _AsyncioFuture[T]):  # type: ignore[misc]  # (disjoint bases: only for the type checker)
    """The result of a submitted task; pass it to another task to depend on it.

    ``await fut`` returns the value or raises the task's exception.  A
    cancelled task raises ``ss.TaskCancelled`` -- from ``await fut``,
    ``fut.result()`` and ``fut.exception()`` alike, under asyncio and trio --
    which is both an ``asyncio.CancelledError`` and a
    ``concurrent.futures.CancelledError``, so either ``except`` catches it
    (an asyncio task that lets it through ends cancelled, as when it awaits a
    cancelled ``asyncio.Future``).  Cancelling a coroutine that awaits a
    future cancels the task if it has not started, as with ``asyncio.Future``
    (under trio: a cancel scope around the ``await``); wrap it in
    ``asyncio.shield`` (a shielded trio ``CancelScope``) to keep it running.

    It is an asyncio future as well (``asyncio.isfuture(fut)``; on a Dask engine, whose values
    are fetched from the cluster by ``await``, an awaitable): ``asyncio.wait``,
    ``as_completed``, ``wait_for``, ``shield`` and ``gather`` take it as it is
    (type checkers see an ``asyncio.Future[T]``).
    ``get_loop()`` is the engine's loop (from a coroutine on another loop:
    that one), and callbacks added through ``add_done_callback`` run on that
    loop's thread, never on a worker.  (A Tensor is awaitable, not an asyncio
    future: its await also waits for the writes queued to its memory.)  A
    task that has started cannot be cancelled (``cancel()`` is False), and
    asyncio waits for such a future: Python 3.11's ``asyncio.wait_for(fut, t)``
    returns only once the task has ended (nothing is left running), and a
    cancelled ``gather`` ends with its started tasks.  To give up at a deadline
    and leave the task running, ``async with asyncio.timeout(t): await fut``
    (under trio, ``anyio.fail_after(t)``).
    """

    __slots__ = ("_blocking", "_port")

    def __init__(
        self,
        port: Port,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        device: str,
        buffers: tuple[Any, ...] = (),
        deps: tuple[Task, ...] = (),
    ) -> None:
        # positional all the way: this runs once per submission.  The fields few tasks have (priority,
        # out_bytes, name, nested, after) keep Task's defaults unless the builder stores them.
        Task.__init__(self, fn, args, kwargs, device, buffers, deps)
        self._port = port  # the engine it belongs to, as the frontend sees it

    def done(self) -> bool:
        """True once the task finished, failed or was cancelled."""
        return self.state in FINAL_STATES

    def cancelled(self) -> bool:
        return self.state == "cancelled"

    def set_result(self, result: object) -> NoReturn:
        """Refused: a task's outcome is the engine's to set, when the task ends (asyncio's own futures
        have it; a type checker sees this one as such)."""
        raise SchedsvcError(_SET.format(self=self, what="set_result()"))

    def set_exception(self, exception: object) -> NoReturn:
        """Refused, as ``set_result``."""
        raise SchedsvcError(_SET.format(self=self, what="set_exception()"))

    def running(self) -> bool:
        return self.state == "running"

    def __await__(self) -> Generator[Any, None, T]:
        if self.state not in FINAL_STATES and not self._port.run_inline(self):
            try:
                yield from self._port.wait(self).__await__()
            except BaseException as exc:
                if is_cancellation(exc):
                    self.cancel()  # the awaiter gave up: an unstarted task is not wanted
                raise
        if self._port.remote and self.state == "done" and isinstance(self.value, Remote):
            return (yield from self.value.get().__await__())  # type: ignore[no-any-return]
        try:
            return self._outcome()
        except StopIteration as exc:  # PEP 479 would turn it into a bare RuntimeError here
            raise stop_through_await(self, exc) from exc

    async def wait(self) -> Future[T]:
        """Wait until the task is final, without raising its error; returns the future."""
        if self.state not in FINAL_STATES:
            await self._port.wait(self)
        return self

    def result(self, timeout: float | None = None) -> T:
        """Block until the value is there (for threads, not coroutines); raise the task's error.

        Raises TimeoutError after ``timeout`` seconds.  Inside a task, waiting
        on another task is safe: a queued task runs right here.  On the event
        loop's thread a future that is not final raises SchedsvcError (blocking
        there would stall the loop): use ``await fut``.
        """
        port = self._port
        if port.remote:
            return self._remote_result(timeout)
        if self.state not in FINAL_STATES:
            if port.on_loop_thread():
                raise blocks_the_loop(self, "result()")
            if not port.wait_blocking(self, timeout):
                raise TimeoutError(f"{self!r} did not finish within {timeout} s")
        return self._outcome()

    def _remote_result(self, timeout: float | None) -> T:
        """``result()`` on a Dask engine: wait, then fetch the value from the cluster (not on the loop)."""
        port = self._port
        if port.on_loop_thread():
            if self.state in FINAL_STATES and not isinstance(self.value, Remote):
                return self._outcome()
            raise blocks_the_loop(self, "result()")  # the value is still on the cluster
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.state not in FINAL_STATES and not port.wait_blocking(self, timeout):
            raise TimeoutError(f"{self!r} did not finish within {timeout} s")
        value = self.value
        if self.state == "done" and isinstance(value, Remote):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            return value.get_blocking(left)  # type: ignore[no-any-return]
        return self._outcome()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        """``np.asarray(fut)`` (and NumPy functions given a future): the task's value as an array, as
        ``result()`` gives it -- waited for off the event loop; on it, only once the task is final, else
        TypeError (waiting would stall the loop: ``await fut`` first).  Its error is raised."""
        import numpy as np  # (here: NumPy is the frontend's, not every submission's)

        if self.state not in FINAL_STATES and self._port.on_loop_thread():
            raise TypeError(
                f"np.asarray() of {self!r} needs its value, and waiting here would block the event loop; "
                "use 'await fut' (then np.asarray() of the value)"
            )
        value = np.asarray(self.result(), dtype=dtype)
        return value.copy() if copy else value

    def exception(self) -> BaseException | None:
        """The task's exception, or None if it succeeded; it must be done."""
        if self.state not in FINAL_STATES:
            import asyncio  # (here, not at import: see _runtime/_bridge.py)

            raise asyncio.InvalidStateError(f"{self!r} is not done; await fut.wait() first")
        if self.state == "cancelled":
            raise _cancelled(self)
        return self.error

    def cancel(self, msg: Any = None) -> bool:
        """Cancel the task and the tasks that take its value, if it has not started.

        ``msg`` is accepted for asyncio's sake (``Task.cancel`` passes it on) and not used.
        """
        return self._port.cancel(self)

    #: asyncio's protocol: the message of a cancellation (``asyncio.gather`` reads it of a cancelled future;
    #: an engine task is cancelled without one)
    _cancel_message: Any = None

    def _make_cancelled_error(self) -> BaseException:
        """asyncio's protocol: the error a combinator raises for this cancelled future (``asyncio.gather``
        asks for it): a plain ``asyncio.CancelledError``, as an asyncio future's, so that a timeout around the
        combinator turns it into ``TimeoutError`` (Python 3.12's ``asyncio.timeout`` tests its type exactly).
        Reading the future itself raises ``TaskCancelled``."""
        import asyncio  # (here, not at import: see _runtime/_bridge.py)

        return asyncio.CancelledError(f"{self!r} was cancelled")

    def add_done_callback(
        self, fn: Callable[[Future[T]], Any], *, context: contextvars.Context | None = None
    ) -> None:
        """Call ``fn(future)`` on the engine's event loop once the task is final (in ``context``, if given).

        Added by a coroutine on another asyncio loop, ``fn`` is called on that loop instead, as ``get_loop()``
        there says; either way never on a worker thread.
        """
        port = self._port
        if port.loop_closed():  # it could never be called
            raise port.refusal()
        port.add_done_callback(self, fn, context)

    def remove_done_callback(self, fn: Callable[[Future[T]], Any]) -> int:
        """Take every ``fn`` added by ``add_done_callback`` off the task's, unless already called; how many."""
        return self._port.remove_done_callback(self, fn)

    # -- the asyncio future protocol ---------------------------------------------------------

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """The asyncio loop its done-callbacks run on: the engine's, or the calling coroutine's own loop if
        that is another (a future is awaitable from any loop); RuntimeError under trio, outside asyncio."""
        loop = self._port.running_loop() or self._port.loop
        if loop is None:
            raise RuntimeError(f"{self!r} belongs to an engine running under trio, which has no asyncio loop")
        return cast("asyncio.AbstractEventLoop", loop)

    @property  # type: ignore[override]  # (None, unlike an asyncio future's bool: asyncio reads it so)
    def _asyncio_future_blocking(self) -> bool | None:
        """asyncio's protocol: True only while a coroutine yields this future to its Task to wait on.

        None (not an asyncio future, ``asyncio.isfuture`` says) on a Dask engine: its value is on the
        cluster, fetched by ``await``, which asyncio then uses (``gather`` and ``wait_for`` wrap it in a task).
        """
        if self._port.remote:
            return None
        return getattr(self, "_blocking", False)  # (unset until asyncio sets it: no cost per task)

    @_asyncio_future_blocking.setter
    def _asyncio_future_blocking(self, value: bool) -> None:
        self._blocking = value

    def _outcome(self) -> T:
        """The value, or raise the error (a cancelled task: ``TaskCancelled``)."""
        state = self.state
        if state == "done":
            return self.value  # type: ignore[no-any-return]
        if state == "cancelled":
            raise _cancelled(self)
        error = self.error
        assert error is not None
        raise error

    def __repr__(self) -> str:
        label = self.label
        extra = ""
        if self.state == "failed" and self.error is not None:
            extra = f" {type(self.error).__name__}"
        seq = f"#{self.seq} " if self.seq >= 0 else ""
        return f"<Future {seq}{label} {self.state}{extra}>"


def blocks_the_loop(what: object, call: str, name: str = "fut") -> SchedsvcError:
    """The one refusal of a blocking wait (``result()``, ``wait_to_read()``) on the event loop's thread."""
    return SchedsvcError(
        f"{what!r}.{call} on the event loop's thread would block the loop that drives the engine until "
        f"the value is there; use 'await {name}' there (a Jupyter or IPython cell can await at its top "
        f"level); {call} is for other threads"
    )


def _cancelled(task: Future[Any]) -> BaseException:
    """The error a cancelled task gives however it is read (``TaskCancelled``, made on first use)."""
    from ._cancelled import TaskCancelled

    return TaskCancelled(f"{task!r} was cancelled")
