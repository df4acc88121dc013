"""Dask: ready CPU tasks run on a Dask distributed cluster.

The only module that imports Dask (with its ``_dask_*`` helpers), and only
when an engine with ``backend="dask"`` starts.  The scheduling core is
unchanged: it still orders data dependencies and buffer hazards and admits
work under the limits; ``DaskDevice`` takes the tasks it makes ready and
sends them with ``client.submit``.  A task whose only unfinished inputs are
already on the cluster is sent at once, behind them (``forward``), so Dask
runs a chain without a round trip here per link.  Completions are watched on
the engine's event loop (the async ``Client`` lives there); each one is
reported to the core under the runtime lock, as a worker thread would.
``cancel()`` of a sent task cancels its Dask future, and the task ends
``cancelled`` (``Scheduler.finish_cancelled``), with its dependents, as an
unstarted task does on threads.

The rest is in modules of its own, each readable alone:

* ``_dask_cluster`` -- the connection: the async ``Client``, the
  ``LocalCluster`` started when no ``dask_address`` is set (and the
  main-guard errors of its worker processes), and a close that cannot hang
  ``aclose()``.
* ``_dask_payload`` -- what a task becomes on the cluster: parents' Dask
  futures among its arguments, the function its worker runs, ``out=``
  written back here (``writes=`` through a closure could never come back and
  is refused at submission, ``check_task``), the error of a task that could
  not be pickled or that raised.
* ``_dask_values`` -- a finished task's value, a ``Remote`` (``DaskValue``)
  that stays on the cluster until the schedsvc Future is awaited; the values
  asked for in one turn of the loop come in one ``client.gather``
  (``Fetcher``).
* ``_dask_spans`` -- while a trace is recorded: each worker's timing of its
  task, logged as an event on this engine's topic, placed on a track per Dask
  worker and counted in ``stats().worker_busy_s``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core import FINAL_STATES, Task, name_of
from .._errors import DeviceError, InvalidTask, SchedsvcError
from .._logging import DEVICES_DASK, Throttled
from .._runtime import Device, on_loop
from ._dask_cluster import CLOSE_TIMEOUT_S, Client, DaskFuture, LocalCluster, close, connect, worker_threads
from ._dask_payload import apply, apply_writing, diagnosed, remote_error, to_dask, write_back
from ._dask_spans import Spans, apply_traced
from ._dask_values import DaskValue, Fetcher

if TYPE_CHECKING:
    from .._config import Config
    from .._runtime import Runtime

__all__ = ["DaskDevice", "DaskValue", "Fetcher"]


class DaskDevice(Device):
    """Sends the core's ready tasks of its device ("cpu") to a Dask cluster; reports their end back."""

    kind = "dask"
    local = False  # values stay on the cluster (Remote) until asked for
    vets_tasks = True  # writes that could not come back are refused at submission (check_task)
    forwards = True  # a task waiting only for tasks on the cluster is sent right behind them

    def __init__(self, rt: Runtime, client: Client, cluster: LocalCluster | None, threads: int) -> None:
        super().__init__(rt, "cpu")
        # never staged (Runtime.stage_next): a submission is sent at once, so its dependents,
        # submitted next, can go to the cluster right behind it (see forward); a staged parent
        # is not visible to take(), so its children would wait for it to finish here instead
        self.eager = 1 << 30
        self.client = client
        self.cluster = cluster
        self.concurrency = threads  # the cluster's worker threads at start: eng.map's window is twice this
        # hungry (true) while no pump is scheduled: the runtime calls dispatch() when tasks become ready
        self.sent: dict[Task, DaskFuture] = {}  # tasks on the cluster, until the core records their end
        # ended before the core ran them: (value, error, cancelled on the cluster)
        self.early: dict[Task, tuple[Any, BaseException | None, bool]] = {}
        # sent tasks that write out=: their Dask result is (value, out, ...) until written back here
        self.writers: set[Task] = set()
        self._watchers: set[asyncio.Task[None]] = set()
        self._prefix = f"schedsvc-{uuid.uuid4().hex[:8]}"
        self._count = itertools.count()
        assert rt.loop is not None  # (open refuses a trio engine)
        self.loop: asyncio.AbstractEventLoop = rt.loop
        self.fetcher = Fetcher(client, rt.loop)
        self.spans = Spans(rt, rt.loop, f"{self._prefix}-spans")
        client.subscribe_topic(self.spans.topic, self.spans.on_span)
        self._lost = Throttled(logging.getLogger(DEVICES_DASK))

    @classmethod
    async def open(cls, rt: Runtime, name: str, config: Config) -> DaskDevice:
        """Start an async Client on the running loop (and a LocalCluster if no address is given)."""
        if rt.loop is None:
            raise DeviceError(
                "backend='dask' runs under asyncio only: Dask's Client is built on asyncio; run the program "
                "with asyncio.run(main()) or anyio.run(main, backend='asyncio'), or use the local devices"
            )
        client, cluster = await connect(config)
        return cls(rt, client, cluster, await worker_threads(client, config))

    @classmethod
    def check_config(cls, config: Config) -> None:
        """Settings that have no meaning on a Dask cluster fail at start, naming the field."""
        if config.sync_mode:
            raise SchedsvcError(
                "sync_mode=True runs every task in the caller, so it cannot run on Dask; "
                "use backend='threads' with sync_mode, or sync_mode=False with backend='dask'"
            )
        if tuple(config.devices) != ("cpu",):
            raise DeviceError(
                f"devices={tuple(config.devices)}: backend='dask' runs CPU tasks only; use devices=('cpu',)"
            )

    def check_task(self, fn: Any, kwargs: dict[str, Any], writes: Any) -> None:
        """A task writes into its own copy of a buffer on the cluster: refuse writes that cannot come back."""
        label = name_of(fn) or "task"
        if not (type(writes) is tuple and not writes):
            raise InvalidTask(
                f"{label}: writes= declares memory the task changes through a closure; on backend='dask' "
                "the task runs in another process on a copy, so the change could never reach this array. "
                "Return the new array instead, or pass the array as out= (it is written back)"
            )
        out = kwargs.get("out")
        if out is not None and not isinstance(out, np.ndarray):
            raise InvalidTask(
                f"{label}: out= must be a NumPy array of this process on backend='dask' (it is written "
                f"back after the task), got {type(out).__name__}; return the new value instead"
            )

    # -- the Device interface -------------------------------------------------

    def dispatch(self, ready: int) -> Callable[[], None] | None:
        """With the lock held: schedule one pump on the loop for the ready tasks."""
        self.hungry = False
        return self._schedule_pump

    def admitted(self, task: Task) -> None:
        self.forward(task)

    def busy_seconds(self) -> dict[str, float]:
        """Seconds spent in the tasks traced so far, per Dask worker (threads are not timed otherwise)."""
        return self.spans.busy_seconds()

    # -- sending -----------------------------------------------------------------

    def _schedule_pump(self) -> None:
        loop = self.loop
        try:
            if on_loop(loop):
                loop.call_soon(self._pump)
            else:
                loop.call_soon_threadsafe(self._pump)
        except RuntimeError:  # the loop is closed: nothing can run any more
            pass

    def _pump(self) -> None:
        """On the loop: take every ready task and send it to the cluster."""
        for task in self.rt.take_all(self):  # hungry again: later ready tasks wake us again
            if task not in self.sent:
                self._send(task)
            elif task in self.early:  # forwarded, and its outcome is already here
                self._finish(task, *self.early.pop(task))

    def forward(self, task: Task) -> None:
        """A task just admitted waits only for parents that are on the cluster: send it now.

        Dask itself then starts it when its parents' data is there, with no
        round trip through this process per link of a chain.  Only data
        dependencies qualify: a task held back by a buffer hazard (or one that
        writes ``out=``, which is written back here in order) waits for the core.
        """
        loop = self.loop
        if not on_loop(loop):
            loop.call_soon_threadsafe(self.forward, task)
            return
        if task in self.sent or isinstance((task.kwargs or {}).get("out"), np.ndarray):
            return
        parents = self.rt.data_parents(task)
        if parents is None:  # not waiting any more, or some edge is a buffer hazard
            return
        if any(p in self.writers for p in parents):  # its value exists only once written back
            return
        unsent = any(p not in self.sent for p in parents)
        if unsent:
            self._pump()  # parents that are ready but not sent yet go first
            if any(p not in self.sent for p in parents):
                return
        self._send(task)

    def _send(self, task: Task) -> None:
        kwargs = task.kwargs or {}
        out = kwargs.get("out")
        key = f"{task.label}-{next(self._count)}-{self._prefix}"
        run = apply_writing if isinstance(out, np.ndarray) else apply
        traced = self.rt.timeline is not None
        args: Any = ()
        dkwargs: Any = {}
        try:
            args = to_dask(task.args, self.sent)
            dkwargs = to_dask(kwargs, self.sent)
            if traced:
                dfut = self.client.submit(
                    apply_traced,
                    run,
                    task.fn,
                    args,
                    dkwargs,
                    key,
                    self.spans.topic,
                    key=key,
                    pure=False,
                    priority=task.priority,
                )
            else:
                dfut = self.client.submit(
                    run, task.fn, args, dkwargs, key=key, pure=False, priority=task.priority
                )
        except BaseException as exc:  # could not even be sent (unpicklable, client closed): it failed
            self._finish(task, None, diagnosed(exc, task, args, dkwargs))
            return
        if traced:
            self.spans.expect(key, task)
        self.sent[task] = dfut
        if isinstance(out, np.ndarray):
            self.writers.add(task)
        watcher = self.loop.create_task(self._watch(task, dfut, out if isinstance(out, np.ndarray) else None))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch(self, task: Task, dfut: DaskFuture, out: np.ndarray | None) -> None:
        """Wait for the Dask future; report the outcome to the core without fetching the value."""
        value: Any = None
        error: BaseException | None = None
        cancelled = False
        try:
            await dfut._exception()  # waits for the key's final state; moves no data
            status = dfut.status
            if self.spans.expects(dfut.key) and status in ("finished", "error"):
                await self.spans.wait_for(dfut.key)
            if status == "finished":
                if out is None:
                    value = DaskValue(dfut, self.fetcher)
                else:
                    value, error = write_back(out, await dfut)
            elif status == "error":
                error = remote_error(dfut)
            else:  # cancelled there (fut.cancel(), aclose(cancel_pending=True)) before it ran
                cancelled = True
        except Exception as exc:  # the client lost the scheduler, the value could not be fetched, ...
            error = exc
            self._lost.warning(
                "%s: the outcome of %r could not be read from the cluster (%s: %s); the task fails with it",
                self.client,
                task,
                type(exc).__name__,
                exc,
            )
        except BaseException:  # the watcher itself was cancelled (the loop is shutting down)
            self._finish(task, None, SchedsvcError(f"{task!r}: stopped watching its Dask future"))
            raise
        self.spans.forget(dfut.key)  # cancelled, or its span came: nothing more will come
        self._finish(task, value, error, cancelled)

    def _finish(self, task: Task, value: Any, error: BaseException | None, cancelled: bool = False) -> None:
        """Record the outcome in the core, if it has the task running (on the loop).

        ``cancelled``: the cluster dropped the task unrun; it ends ``cancelled``,
        as a task cancelled before it started does, and so do its dependents.
        """
        state = self.rt.finish(task, value, error, cancelled)
        if state == "running" or state in FINAL_STATES:  # (final: failed through a parent, cancelled)
            self.sent.pop(task, None)
            self.writers.discard(task)
        else:  # forwarded, and done before the core made it ready: kept for the pump
            self.early[task] = (value, error, cancelled)

    # -- cancelling and closing ------------------------------------------------

    def cancel(self, task: Task) -> bool:
        """Cancel a task that was sent (from any thread); False if it is not in flight."""
        dfut = self.sent.get(task)
        if dfut is None or dfut.done():
            return False
        self._call_on_loop(self._cancel_now, [dfut])
        return True

    def cancel_all(self) -> None:
        """Cancel every task in flight (``aclose(cancel_pending=True)``)."""
        futures = [f for f in list(self.sent.values()) if not f.done()]
        if futures:
            self._call_on_loop(self._cancel_now, futures)

    def _cancel_now(self, futures: list[DaskFuture]) -> None:
        job = self.loop.create_task(self.client.cancel(futures, reason="cancelled by schedsvc"))
        self._watchers.add(job)
        job.add_done_callback(self._watchers.discard)

    def _call_on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self.loop
        if on_loop(loop):
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    async def aclose(self) -> None:
        """Close the client, and the local cluster if this engine started it."""
        if self._watchers:  # after the engine's barrier: cancels, and forwarded tasks failing
            await asyncio.wait(list(self._watchers), timeout=CLOSE_TIMEOUT_S)
        self.sent.clear()
        self.early.clear()
        self.writers.clear()
        self.spans.clear()
        await close(self.client, self.cluster)
