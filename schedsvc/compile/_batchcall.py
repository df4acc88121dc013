"""``BatchCall``: one call of a batched compiled function, the ``ss.Future`` its caller awaits; the function
of a call that runs alone (``Deferred``); the check of ``exact=``."""

from __future__ import annotations

from collections.abc import Generator
from threading import get_ident
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .._core import FINAL_STATES
from .._errors import BatchError
from .._future import Future
from .._runtime import BUFFER_TYPES, LoopWaiter, buffer_of, is_cancellation

if TYPE_CHECKING:
    from .._port import Port
    from ._batched import Batched
    from ._fused import Group

__all__ = ["BatchCall", "Deferred", "check_exact"]

R = TypeVar("R")


class BatchCall(Future[R]):
    """One call of a batched compiled function: a task of its own, ``await call`` gives the caller's rows.

    It is an ``ss.Future``: ``result(timeout)`` from other threads, ``cancel()``
    (before it runs), ``exception()``, ``add_done_callback`` and passing it to
    other tasks work as for any task.  For type checkers, ``BatchCall[R]``
    gives ``R``: an ``np.ndarray`` of the caller's rows, or a tuple or list of
    them, as the function returns a Tensor, a tuple or a list.
    """

    __slots__ = ("fusion", "number", "rows")

    fusion: Group | None
    number: int  # the how-manieth call of its function (the trace lists a batch's callers)
    rows: int  # its rows along the batch axis (0: not known until its Future arguments are there)

    def rows_call(self, port: Port, group: Group, x: np.ndarray, rows: int, device: str) -> None:
        """``__init__`` for a call of one ndarray batched on axis 0 (the common case of serving), every
        field set here: one read of its buffer, no dependencies, and a list of waiters (awaited on the
        loop without the lock)."""
        self.fn = group
        self.args = (x,)
        self.kwargs = None
        self.device = device
        self.buffers = ((*buffer_of(x), False),)
        self.deps = self.after = ()
        self.priority = self.n_waiting = 0
        self.out_bytes = group.row_bytes * rows
        self.nested = False
        self.seq = -1
        self.staged = 0
        self.state = "new"
        self.dependents = self.value = self.error = None
        self.watchers = []
        self.t_ready = 0.0
        self._port = port
        self.fusion = group
        self.rows = rows

    def __await__(self) -> Generator[Any, None, R]:
        """The caller's rows.  On the engine's loop a call of one array waits on a future of that loop
        put on the list of waiters the call was made with: no lock and no hand-over of staged work (the
        calls of this turn of the loop are handed to the workers together at its end, as one batch)."""
        watchers = self.watchers
        if self.state in FINAL_STATES or watchers is None:
            return (yield from Future.__await__(self))
        port = self._port
        loop = port.loop
        if port.base_loop and loop._thread_id == get_ident():  # (running_loop(), inlined: hot)
            waiter: Any = LoopWaiter(loop)  # (the drain wakes this coroutine's Task itself)
        elif loop is not None and port.running_loop() is loop:
            waiter = loop.create_future()
        else:
            return (yield from Future.__await__(self))
        watchers.append(waiter)
        waiter._asyncio_future_blocking = True  # (its own __await__, inlined: yielded to the Task here,
        try:  # which asks its result() once woken, and so raises here if it has to)
            yield waiter
        except BaseException as exc:
            self._port.unwatch(self, waiter)
            if is_cancellation(exc):
                self.cancel()  # the awaiter gave up: an unstarted call is not wanted
            raise
        return self.value if self.state == "done" else self._outcome()  # (_outcome, its hot path inlined)

    def __repr__(self) -> str:
        rows = f" rows={self.rows}" if self.rows else ""
        extra = f" {type(self.error).__name__}" if self.state == "failed" and self.error is not None else ""
        return f"<BatchCall {self.label} #{self.number}{rows} {self.state}{extra}>"


class Deferred:
    """The function of a call whose Future arguments were pending at the call: its rows and key are
    known only when they are there, so it runs alone, checked then."""

    __slots__ = ("batched",)

    def __init__(self, batched: Batched[..., Any]) -> None:
        self.batched = batched

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        batched = self.batched
        statics: dict[Any, Any] = {}
        key, values, rows = batched.parse(args, kwargs, statics)
        if any(type(v) in BUFFER_TYPES for v in values):
            raise BatchError(
                f"{batched!r}: a call whose Futures were pending at the call runs alone on the host, and "
                "their values are device arrays; pass them as Tensors (eng.asarray(future, shape=..., "
                "dtype=...))"
            )
        group = batched.group(key, values, rows, statics or None, None)
        return group(*values)

    @property
    def __name__(self) -> str:
        return f"batch:{self.batched.name}"


def check_exact(exact: Any) -> None:
    """``eng.compile(exact=...)`` is a bool (checked with or without ``batch_axis``)."""
    if type(exact) is not bool:
        raise TypeError(
            f"eng.compile(exact=...) must be a bool (True: each caller's rows bit for bit as the unbatched "
            f"call; False: results may differ from it in the last bits), got {type(exact).__name__} {exact!r}"
        )
