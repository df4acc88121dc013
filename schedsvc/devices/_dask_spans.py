"""Traced tasks on the cluster: each worker times its task and logs a span; ``Spans`` places it here.

While a trace is recorded, a task sent runs inside ``apply_traced``: the
worker times it and logs a span event (worker, thread, times, argument
shapes, error) on this engine's topic.  The event travels the same ordered
streams as the task's completion (worker -> scheduler -> client), so it is
here before the task's future is done; the span goes on a track per Dask
worker, and its time counts in ``stats().worker_busy_s``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core import Task
from .._timeline import describe
from ._dask_payload import apply_writing

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["SPAN_WAIT_S", "Spans", "apply_traced"]

SPAN_WAIT_S = 2.0  # how long a finished traced task waits for its span event (it is normally there)
_MAX_SHAPES = 8


def apply_traced(
    run: Callable[..., Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    key: str,
    topic: str,
) -> Any:
    """Run on a worker: ``run(fn, args, kwargs)``, timed, and its span logged on ``topic``.

    The event is logged before the task returns, so the worker sends it to the
    scheduler ahead of the task's completion, and the client receives it first.
    """
    import distributed

    start = time.time()
    error: str | None = None
    try:
        result = run(fn, args, kwargs)
        if run is apply_writing and result[2] is not None:  # it raised after a partial write
            error = describe(result[2])
        return result
    except BaseException as exc:
        error = describe(exc)
        raise
    finally:
        stop = time.time()
        worker = distributed.get_worker()
        shapes = [list(a.shape) for a in args if isinstance(a, np.ndarray)][:_MAX_SHAPES]
        worker.log_event(
            topic,
            {
                "key": key,
                "start": start,
                "stop": stop,
                "worker": worker.address,
                "nthreads": worker.state.nthreads,
                "thread": threading.current_thread().name,
                "shapes": shapes,
                "error": error,
            },
        )


class Spans:
    """The span events of one engine's traced tasks (on ``topic``), placed on its trace as they come."""

    def __init__(self, rt: Runtime, loop: asyncio.AbstractEventLoop, topic: str) -> None:
        self.rt = rt
        self.loop = loop
        self.topic = topic  # this engine's span events, and no other engine's
        # traced tasks on the cluster whose span has not come back yet, by Dask key
        self.traced: dict[str, Task] = {}
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._busy: dict[str, float] = {}  # seconds of traced tasks per Dask worker track

    def expect(self, key: str, task: Task) -> None:
        """``task`` was sent traced, as ``key``: its span will come."""
        self.traced[key] = task

    def expects(self, key: str) -> bool:
        """Was ``key`` sent traced, and has its span not come yet?"""
        return key in self.traced

    def forget(self, key: str) -> None:
        """Nothing more will come for ``key`` (cancelled, or its span came)."""
        self.traced.pop(key, None)

    def clear(self) -> None:
        self.traced.clear()

    def busy_seconds(self) -> dict[str, float]:
        """Seconds spent in the tasks traced so far, per Dask worker track."""
        return dict(self._busy)

    def on_span(self, event: tuple[float, dict[str, Any]]) -> None:
        """On the loop: a traced task's span, logged by its worker; placed on the trace, if one is on."""
        _, msg = event
        key = msg["key"]
        task = self.traced.pop(key, None)
        waiter = self._waiters.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if task is None:  # not ours, or given up on
            return
        track = f"dask {msg['worker']}"
        if msg["nthreads"] > 1:
            track += f" {msg['thread']}"
        start, stop = msg["start"], msg["stop"]
        self._busy[track] = self._busy.get(track, 0.0) + (stop - start)
        timeline = self.rt.timeline
        if timeline is not None:  # the trace may have ended while the task ran
            shapes = tuple(tuple(s) for s in msg["shapes"]) or None
            timeline.remote_span(task, track, start, stop, shapes, msg["error"])

    async def wait_for(self, key: str) -> None:
        """A traced task is done: its span event is normally here already; wait briefly if not."""
        waiter = self._waiters[key] = self.loop.create_future()
        try:
            await asyncio.wait_for(waiter, SPAN_WAIT_S)
        except TimeoutError:  # the worker died after running it, say: the task is done without a span
            pass
        finally:
            self._waiters.pop(key, None)
            self.traced.pop(key, None)
