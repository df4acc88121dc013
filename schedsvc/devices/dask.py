"""Dask: ready CPU tasks run on a Dask distributed cluster.

The only module that imports Dask, and only when an engine with
``backend="dask"`` starts.  The scheduling core is unchanged: it still orders
data dependencies and buffer hazards and admits work under the limits; this
device takes the tasks it makes ready and sends them with ``client.submit``.

* A Future among a task's arguments becomes its parent's Dask future, so
  intermediate values stay on the workers and move only to a worker that needs
  them.  A finished task's value is a ``Remote`` holding its Dask future; the
  value comes to this process only when the schedsvc Future is awaited (or
  ``result()`` is called), and is then kept.  The values asked for in one turn
  of the loop (``asyncio.gather`` over many futures) come in one
  ``client.gather``.
* ``out=`` a NumPy array of this process: the worker writes into its copy and
  sends it back, and the copy is written into the array here before the task
  counts as finished -- even if the task then raised, as NumPy leaves a
  partial write in place -- so later tasks (ordered after it by the hazard
  rules) see the write.  ``writes=`` (memory written through a closure) cannot
  be brought back and is refused at submission.
* Completions are watched on the engine's event loop (the async ``Client``
  lives there); each one is reported to the core under the runtime lock, as a
  worker thread would.  ``cancel()`` of a sent task cancels its Dask future,
  and the task ends ``cancelled`` (``Scheduler.finish_cancelled``), with its
  dependents, as an unstarted task does on threads.
* While a trace is recorded, a task sent runs inside ``_apply_traced``: the
  worker times it and logs a span event (worker, thread, times, argument
  shapes, error) on this engine's topic.  The event travels the same ordered
  streams as the task's completion (worker -> scheduler -> client), so it is
  here before the task's future is done; the span goes on a track per Dask
  worker, and its time counts in ``stats().worker_busy_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import multiprocessing
import os
import pickle
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core import FINAL_STATES, Task, name_of
from .._errors import DeviceError, InvalidTask, SchedsvcError
from .._runtime import Device, Remote, on_loop
from .._timeline import describe

if TYPE_CHECKING:
    from .._config import Config
    from .._runtime import Runtime

__all__ = ["DaskDevice", "DaskValue", "Fetcher"]

# Dask's objects, as this module sees them (distributed is untyped, and optional)
Client = Any
DaskFuture = Any
LocalCluster = Any

_MAIN_GUARD = '`if __name__ == "__main__":`'
_START_A_CLUSTER = "start one with: dask scheduler, and dask worker tcp://HOST:8786 on each machine"
_CLOSE_TIMEOUT_S = 20.0
_SPAN_WAIT_S = 2.0  # how long a finished traced task waits for its span event (it is normally there)
_MAX_SHAPES = 8


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise SchedsvcError(
            "backend='dask' needs Dask distributed, which is not installed; pip install 'schedsvc[dask]'"
        ) from exc
    return distributed


async def _start_local_cluster(distributed: Any, config: Config) -> LocalCluster:
    """A cluster of ``cpu_workers`` processes here; if its workers cannot start, one error says why."""
    method = _start_method()
    if method != "fork":
        _leave_if_importing_main()
        _check_main_can_run_again(method)
    cluster = distributed.LocalCluster(
        n_workers=config.cpu_workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",  # any free port: 8787 may be taken by another cluster
        asynchronous=True,
    )
    try:
        return await cluster
    except Exception as exc:
        with contextlib.suppress(Exception):  # what did start (the scheduler, some workers) stops
            await asyncio.wait_for(cluster.close(), _CLOSE_TIMEOUT_S)
        raise DeviceError(_workers_failed(exc, config, method)) from _without_tracebacks(exc)


def _start_method() -> str:
    """How Dask starts worker processes: spawn and forkserver run the main module again in each."""
    import dask

    return str(dask.config.get("distributed.worker.multiprocessing-method", "spawn"))


def _main_module() -> str | None:
    """What a spawned worker runs again before it starts: the main module's file or name, if any."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return str(spec.name)
    path = getattr(main, "__file__", None)
    return None if path is None else str(path)


def _leave_if_importing_main() -> None:
    """In a worker process that is still running the main module, an engine can never start: leave.

    That is a program without a main guard, run again in each worker of the
    cluster its main process is starting.  A traceback per worker would bury
    the main process's error, which says what to do; this is one line each.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # what multiprocessing checks
        main = getattr(sys.modules.get("__mp_main__"), "__file__", None) or "the main module"
        raise SystemExit(
            f"schedsvc: a Dask worker process ran {main} again, and it starts an engine: "
            "this worker exits (the main process says what to do)"
        )


def _check_main_can_run_again(method: str) -> None:
    """A main module read from standard input (``python -``) cannot be run again in the workers."""
    main = _main_module()
    if main is None or getattr(sys.modules.get("__main__"), "__spec__", None) is not None:
        return  # nothing to run again (python -c, a notebook), or a module run with -m: imported by name
    start_dir = getattr(multiprocessing.process, "ORIGINAL_DIR", None) or ""  # where spawn looks, as it does
    if not os.path.isfile(os.path.join(start_dir, main)):
        raise DeviceError(
            f"backend='dask' cannot start a local cluster from this program: Dask starts each worker with the "
            f"{method!r} method, which runs the main module again from its file, and {main!r} is no file "
            "(a program read from standard input, python -). Run the program from a file, with the code that "
            f"starts the engine under {_MAIN_GUARD}, or connect to a running cluster with "
            f"dask_address='tcp://HOST:8786' ({_START_A_CLUSTER})"
        )


def _workers_failed(exc: Exception, config: Config, method: str) -> str:
    """What to say when the local cluster's workers did not start."""
    text = f"backend='dask' could not start a local cluster of {config.cpu_workers} worker processes ({exc})."
    main = _main_module()
    if main is not None and method != "fork":
        text += (
            f" The usual cause: Dask starts each worker with the {method!r} method, which runs the main module "
            f"({main}) again in it, and a program without a main guard starts the engine again there. Put the "
            f"code that starts the engine under {_MAIN_GUARD}, or connect"
        )
    else:
        text += " Connect"
    return text + f" to a running cluster with dask_address='tcp://HOST:8786' ({_START_A_CLUSTER})"


def _without_tracebacks(exc: BaseException) -> BaseException:
    """``exc`` and the errors chained to it, without their frames: Dask's internals, dozens of lines each."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__
    return exc


async def _threads(client: Client, config: Config) -> int:
    """The cluster's worker threads now; ``cpu_workers`` if none has joined yet."""
    try:
        threads = sum((await client.nthreads()).values())
    except Exception:  # the scheduler went away just now: the first task will say so; this is a default
        return config.cpu_workers
    return threads if threads > 0 else config.cpu_workers


class DaskValue(Remote):
    """A finished task's value, held by the cluster as a Dask future."""

    __slots__ = ("fetcher",)

    handle: DaskFuture

    def __init__(self, handle: DaskFuture, fetcher: Fetcher) -> None:
        super().__init__(handle)
        self.fetcher = fetcher

    async def _fetch(self) -> Any:
        return await self.fetcher.fetch(self.handle)

    def _fetch_blocking(self, timeout: float | None) -> Any:
        loop = self.handle.client.loop.asyncio_loop
        return asyncio.run_coroutine_threadsafe(self._fetch(), loop).result(timeout)


class Fetcher:
    """Brings values here: the fetches asked for in one turn of the loop go in one ``client.gather``.

    ``await asyncio.gather(*futures)`` over many results then costs one round
    trip to the cluster, not one per result.  A fetch asked for alone is one
    gather of one key, as before.
    """

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.asked: list[tuple[DaskFuture, asyncio.Future[Any]]] = []
        self._jobs: set[asyncio.Task[None]] = set()

    def fetch(self, dfut: DaskFuture) -> asyncio.Future[Any]:
        """(On the loop) the value of ``dfut``, gathered with the others asked for in this turn."""
        waiter = self.loop.create_future()
        if not self.asked:  # the first of this turn: gather after the callbacks already queued
            self.loop.call_soon(self._flush)
        self.asked.append((dfut, waiter))
        return waiter

    def _flush(self) -> None:
        batch, self.asked = self.asked, []
        job = self.loop.create_task(self._gather(batch))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def _gather(self, batch: list[tuple[DaskFuture, asyncio.Future[Any]]]) -> None:
        batch = [(dfut, waiter) for dfut, waiter in batch if not waiter.done()]  # not given up on
        if not batch:
            return
        try:
            values = await self.client.gather([dfut for dfut, _ in batch])
        except BaseException:  # also a CancelledError, which is not an Exception: only ours re-raises
            if _closing(batch):
                raise
            # a key could not be fetched (released, lost with its worker): each alone, with its own outcome
            for dfut, waiter in batch:
                try:
                    value = await dfut
                except BaseException as exc:
                    if _closing(batch):
                        raise
                    if not waiter.done():
                        waiter.set_exception(exc)
                else:
                    if not waiter.done():
                        waiter.set_result(value)
            return
        for (_, waiter), value in zip(batch, values, strict=True):
            if not waiter.done():
                waiter.set_result(value)


def _closing(batch: list[tuple[DaskFuture, asyncio.Future[Any]]]) -> bool:
    """Is this fetch job itself being cancelled (the loop closes)?  Then its waiters are cancelled too."""
    task = asyncio.current_task()
    if task is None or not task.cancelling():
        return False
    for _, waiter in batch:
        waiter.cancel()
    return True


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
        # hungry (true) while no pump is scheduled: the runtime calls notify() when tasks become ready
        self.sent: dict[Task, DaskFuture] = {}  # tasks on the cluster, until the core records their end
        # ended before the core ran them: (value, error, cancelled on the cluster)
        self.early: dict[Task, tuple[Any, BaseException | None, bool]] = {}
        # sent tasks that write out=: their Dask result is (value, out, ...) until written back here
        self.writers: set[Task] = set()
        self._watchers: set[asyncio.Task[None]] = set()
        self._prefix = f"schedsvc-{uuid.uuid4().hex[:8]}"
        self._count = itertools.count()
        # traced tasks on the cluster whose span has not come back yet, by Dask key
        self.traced: dict[str, Task] = {}
        self._span_waiters: dict[str, asyncio.Future[None]] = {}
        self._busy: dict[str, float] = {}  # seconds of traced tasks per Dask worker track
        self.topic = f"{self._prefix}-spans"  # this engine's span events, and no other engine's
        assert rt.loop is not None  # (open refuses a trio engine)
        self.loop: asyncio.AbstractEventLoop = rt.loop
        self.fetcher = Fetcher(client, rt.loop)
        client.subscribe_topic(self.topic, self._on_span)

    @classmethod
    async def open(cls, rt: Runtime, name: str, config: Config) -> DaskDevice:
        """Start an async Client on the running loop (and a LocalCluster if no address is given)."""
        if rt.loop is None:
            raise DeviceError(
                "backend='dask' runs under asyncio only: Dask's Client is built on asyncio; run the program "
                "with asyncio.run(main()) or anyio.run(main, backend='asyncio'), or use the local devices"
            )
        distributed = _import_distributed()
        cluster = None
        if config.dask_address is None:
            cluster = await _start_local_cluster(distributed, config)
            address = cluster.scheduler_address
        else:
            address = config.dask_address
        try:
            client = await distributed.Client(
                address, asynchronous=True, set_as_default=False, timeout=config.dask_timeout_s
            )
        except BaseException as exc:
            if cluster is not None:
                await cluster.close()
            if isinstance(exc, OSError | TimeoutError):
                raise SchedsvcError(
                    f"backend='dask': could not reach the Dask scheduler at {address!r} ({exc}); "
                    "start one (dask scheduler), fix dask_address, or leave it unset for a local cluster"
                ) from exc
            raise
        return cls(rt, client, cluster, await _threads(client, config))

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

    def notify(self, ready: int) -> Callable[[], None] | None:
        """With the lock held: schedule one pump on the loop for the ready tasks."""
        self.hungry = False
        return self._schedule_pump

    def admitted(self, task: Task) -> None:
        self.forward(task)

    def busy_seconds(self) -> dict[str, float]:
        """Seconds spent in the tasks traced so far, per Dask worker (threads are not timed otherwise)."""
        return dict(self._busy)

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
        run = _apply_writing if isinstance(out, np.ndarray) else _apply
        traced = self.rt.timeline is not None
        args: Any = ()
        dkwargs: Any = {}
        try:
            args = _to_dask(task.args, self.sent)
            dkwargs = _to_dask(kwargs, self.sent)
            if traced:
                dfut = self.client.submit(
                    _apply_traced,
                    run,
                    task.fn,
                    args,
                    dkwargs,
                    key,
                    self.topic,
                    key=key,
                    pure=False,
                    priority=task.priority,
                )
            else:
                dfut = self.client.submit(
                    run, task.fn, args, dkwargs, key=key, pure=False, priority=task.priority
                )
        except BaseException as exc:  # could not even be sent (unpicklable, client closed): it failed
            self._finish(task, None, _diagnosed(exc, task, args, dkwargs))
            return
        if traced:
            self.traced[key] = task
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
            if dfut.key in self.traced and status in ("finished", "error"):
                await self._wait_for_span(dfut.key)
            if status == "finished":
                if out is None:
                    value = DaskValue(dfut, self.fetcher)
                else:
                    value, error = _write_back(out, await dfut)
            elif status == "error":
                error = _remote_error(dfut)
            else:  # cancelled there (fut.cancel(), aclose(cancel_pending=True)) before it ran
                cancelled = True
        except Exception as exc:  # the client lost the scheduler, the value could not be fetched, ...
            error = exc
        except BaseException:  # the watcher itself was cancelled (the loop is shutting down)
            self._finish(task, None, SchedsvcError(f"{task!r}: stopped watching its Dask future"))
            raise
        self.traced.pop(dfut.key, None)  # cancelled, or its span came: nothing more will come
        self._finish(task, value, error, cancelled)

    # -- traced spans --------------------------------------------------------------

    def _on_span(self, event: tuple[float, dict[str, Any]]) -> None:
        """On the loop: a traced task's span, logged by its worker; placed on the trace, if one is on."""
        _, msg = event
        key = msg["key"]
        task = self.traced.pop(key, None)
        waiter = self._span_waiters.pop(key, None)
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

    async def _wait_for_span(self, key: str) -> None:
        """A traced task is done: its span event is normally here already; wait briefly if not."""
        waiter = self._span_waiters[key] = self.loop.create_future()
        try:
            await asyncio.wait_for(waiter, _SPAN_WAIT_S)
        except TimeoutError:  # the worker died after running it, say: the task is done without a span
            pass
        finally:
            self._span_waiters.pop(key, None)
            self.traced.pop(key, None)

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
            await asyncio.wait(list(self._watchers), timeout=_CLOSE_TIMEOUT_S)
        self.sent.clear()
        self.early.clear()
        self.writers.clear()
        self.traced.clear()
        await _close_quietly(
            "the Dask client",
            self.client.close(),
            "the scheduler forgets this client's tasks when it notices the client is gone",
        )
        if self.cluster is not None:
            await _close_quietly(
                "the local Dask cluster",
                self.cluster.close(),
                "its worker processes end with this process at the latest",
            )


async def _close_quietly(what: str, closing: Coroutine[Any, Any, Any], after: str) -> None:
    """Await a close for at most ``_CLOSE_TIMEOUT_S``; a close that hangs or fails is a warning.

    The engine's own work is over by then: a slow scheduler must not turn
    ``aclose()`` into an error after every result was delivered.
    """
    try:
        await asyncio.wait_for(closing, _CLOSE_TIMEOUT_S)
    except TimeoutError:
        problem = f"did not close within {_CLOSE_TIMEOUT_S:g} s"
    except Exception as exc:
        problem = f"failed to close ({type(exc).__name__}: {exc})"
    else:
        return
    warnings.warn(
        f"schedsvc: {what} {problem}; the engine closed anyway ({after})",
        RuntimeWarning,
        stacklevel=2,
    )


def _apply(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run on a worker: the task itself (options of ``client.submit`` never reach ``fn``)."""
    return fn(*args, **kwargs)


def _apply_writing(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, np.ndarray, BaseException | None, bool]:
    """Run on a worker: the task, then what it wrote into its copy of ``out``, error or not.

    The last item says whether ``fn`` returned ``out`` itself (as ufuncs do):
    identity does not survive the trip back, so it is sent as a flag.
    """
    out = kwargs["out"]
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:  # the partial write must still reach the frontend's array
        return None, out, exc, False
    returned_out = value is out
    return (None if returned_out else value), out, None, returned_out


def _apply_traced(
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
        if run is _apply_writing and result[2] is not None:  # it raised after a partial write
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


def _write_back(
    out: np.ndarray, result: tuple[Any, np.ndarray, BaseException | None, bool]
) -> tuple[Any, Any]:
    """Copy the worker's ``out`` into the frontend's array; the task's (value, error)."""
    value, written, error, returned_out = result
    np.copyto(out, written)
    return (out if returned_out else value), error


def _diagnosed(
    exc: BaseException, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> BaseException:
    """A send failure as the task's error: for a serialisation failure, which part cannot be pickled."""
    if not isinstance(exc, TypeError | pickle.PicklingError) and "serializ" not in str(exc):
        return exc  # a closed client, a cancelled send: nothing to pickle again (large arrays take long)
    try:
        return _unsendable(task, args, kwargs) or exc
    except Exception:  # the diagnosis must not lose the task's outcome
        return exc


def _unsendable(task: Task, args: tuple[Any, ...], kwargs: dict[str, Any]) -> InvalidTask | None:
    """Which part of a task that failed to send cannot be pickled, as an error that says what to do.

    Only on that error path: each part is pickled alone, as Dask would.
    """
    import cloudpickle  # Dask's own serializer for code and objects (a dependency of distributed)

    parts = [("its function", task.fn)]
    parts += [(f"argument {i}", arg) for i, arg in enumerate(args)]
    parts += [(f"keyword argument {name!r}", arg) for name, arg in kwargs.items()]
    for what, obj in parts:
        try:
            cloudpickle.dumps(obj)
        except Exception as exc:
            error = InvalidTask(
                f"task {task.label!r} (#{task.seq}): {what}, a {type(obj).__name__}, cannot be sent to the Dask "
                f"workers ({exc}). Pass picklable data (arrays, numbers, strings, ...) or create the object "
                "inside the task, or use backend='threads' to run tasks in this process"
            )
            error.__cause__ = exc
            return error
    return None


def _remote_error(dfut: DaskFuture) -> BaseException:
    error = dfut._state.exception
    traceback = dfut._state.traceback
    if isinstance(error, BaseException):
        return error.with_traceback(traceback) if traceback is not None else error
    return SchedsvcError(f"the Dask task {dfut.key!r} failed: {error!r}")


def _to_dask(obj: Any, sent: dict[Task, DaskFuture]) -> Any:
    """``obj`` with each Task replaced by its Dask future (or its value, if it lives here)."""
    if isinstance(obj, Task):
        dfut = sent.get(obj)
        if dfut is not None:
            return dfut
        value = obj.value
        return value.handle if isinstance(value, Remote) else value
    kind = type(obj)
    if kind is tuple or kind is list:
        return kind(_to_dask(x, sent) for x in obj)
    if kind is dict:
        return {k: _to_dask(v, sent) for k, v in obj.items()}
    if isinstance(obj, tuple):  # a namedtuple
        items = [_to_dask(x, sent) for x in obj]
        return kind._make(items) if hasattr(kind, "_make") else kind(items)
    if isinstance(obj, list | dict):  # a subclass: a shallow copy keeps its class and state
        new = copy.copy(obj)
        if isinstance(obj, list):
            new[:] = [_to_dask(x, sent) for x in obj]
        else:
            for key, value in obj.items():
                new[key] = _to_dask(value, sent)
        return new
    return obj
