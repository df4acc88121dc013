"""``Engine``: the asyncio frontend that turns calls into scheduled tasks."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Callable
from threading import get_ident
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar

from ._config import Config
from ._core import FINAL_STATES, Scheduler
from ._errors import DeviceError, EngineClosed, InvalidTask, QueueFull, SchedsvcError
from ._future import Future
from ._runtime import Runtime, scan
from ._runtime._runtime import settle
from ._telemetry import Stats, percentile
from .devices import check_device, make_device

__all__ = ["Engine"]

T = TypeVar("T")

_JOIN_TIMEOUT_S = 30.0


class Engine:
    """Runs submitted callables on worker threads, in dependency order, within limits.

    Use ``async with Engine(...) as eng`` (or ``await eng.start()`` and
    ``await eng.aclose()``).  ``Engine(config, **overrides)``: keywords override
    fields of ``config`` (or of ``Config()`` read from the environment).
    """

    def __init__(self, config: Config | None = None, **overrides: Any) -> None:
        if config is None:
            config = Config(**overrides)
        elif overrides:
            config = Config(**{**config.model_dump(), **overrides})
        self.config = config
        self._rt: Runtime | None = None
        self._state = "new"
        self._closing: asyncio.Future[None] | None = None
        self._sync_mode = config.sync_mode
        self._default_device = "cpu" if "cpu" in config.devices else config.devices[0]

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> Engine:
        """Start the workers on the running event loop."""
        if self._state != "new":
            raise EngineClosed(f"{self!r} was already started; create a new Engine")
        if self.config.backend != "threads":
            raise SchedsvcError(
                f"backend={self.config.backend!r} is not available in this release; use backend='threads'"
            )
        for name in self.config.devices:
            check_device(name)
        core = Scheduler(
            max_pending=self.config.max_pending,
            max_pending_bytes=self.config.max_pending_bytes,
            devices=self.config.devices,
            clock=time.perf_counter,
        )
        rt = Runtime(core, asyncio.get_running_loop(), self.config.inline_threshold_us / 1e6)
        for name in self.config.devices:
            rt.add_device(name, make_device(name, rt, self.config))
        for device in rt.devices.values():
            device.start()
        self._rt = rt
        self._state = "running"
        return self

    async def aclose(self, *, cancel_pending: bool = False) -> None:
        """Finish (or with ``cancel_pending``, cancel) pending work, then stop every thread.

        Tasks that are running may still submit nested work; it is waited for
        too.  A second ``aclose`` waits for the first.  If the close itself is
        cancelled, unstarted work is cancelled and the threads are told to stop.
        """
        if self._closing is not None:
            await asyncio.shield(self._closing)
            if self._rt is not None:  # a close that was cancelled left threads finishing up
                await self._join(self._rt, _JOIN_TIMEOUT_S)
            return
        rt = self._rt
        if rt is None or self._state != "running":
            self._state = "closed"
            return
        self._state = "closing"
        self._closing = asyncio.get_running_loop().create_future()
        try:
            await self._close(rt, cancel_pending)
        finally:
            self._state = "closed"
            self._closing.set_result(None)

    async def _close(self, rt: Runtime, cancel_pending: bool) -> None:
        with rt.lock:
            rt.closed = True
        try:
            if cancel_pending:
                self._cancel_pending(rt)
            while True:  # nested work submitted by running tasks is admitted while closing
                await self._barrier()
                with rt.lock:
                    if not rt.core.pending and not rt.core.waiting_admission:
                        break
        except BaseException:
            self._cancel_pending(rt)
            for device in rt.devices.values():
                device.stop()
            raise
        for device in rt.devices.values():
            device.stop()
        stuck = await self._join(rt, _JOIN_TIMEOUT_S)
        if stuck:
            warnings.warn(f"schedsvc: threads still running after close: {stuck}", RuntimeWarning, 2)

    def _cancel_pending(self, rt: Runtime) -> None:
        for token in rt.under_lock(rt.core.cancel_pending):
            settle(token, EngineClosed("the engine closed with cancel_pending=True"))

    @staticmethod
    async def _join(rt: Runtime, timeout: float) -> list[Any]:
        """Wait, without blocking the loop, for the device threads to end; return those still alive."""
        deadline = time.monotonic() + timeout
        while True:
            alive = [t for d in rt.devices.values() for t in d.join(0)]
            if not alive or time.monotonic() > deadline:
                return alive
            await asyncio.sleep(0.001)  # they were told to stop; they exit within microseconds

    async def __aenter__(self) -> Engine:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose(cancel_pending=exc_type is not None)

    @property
    def closed(self) -> bool:
        return self._state in ("closing", "closed")

    # -- submitting ------------------------------------------------------------

    async def submit(
        self,
        fn: Callable[..., T],
        /,
        *args: Any,
        device: str | None = None,
        priority: int = 0,
        name: str | None = None,
        reads: Any = (),
        writes: Any = (),
        nbytes: int | None = None,
        **kwargs: Any,
    ) -> Future[T]:
        """Admit ``fn(*args, **kwargs)`` as a task, waiting while the engine is at its limits."""
        rt = self._running()
        tid = get_ident()
        task: Future[T] = self._task(fn, args, kwargs, device, priority, name, reads, writes, nbytes, tid)
        if self._sync_mode:
            return self._run_here(task)
        token = None
        with rt.lock:
            if rt.closed:
                raise self._closed_error()
            stage = tid == rt.loop_thread and rt.stage_next(priority)
            if not rt.core.submit(task, task.nested, stage):
                token = asyncio.get_running_loop().create_future()
                rt.core.enqueue(task, token)
                rt.core.publish()  # we are about to wait: let staged work run
            after = rt.collect()
        if after is not None:
            after()
        if token is not None:
            try:
                await token
            except asyncio.CancelledError:
                task.cancel()  # not admitted yet, or admitted and now unwanted
                raise
        return task

    def submit_nowait(
        self,
        fn: Callable[..., T],
        /,
        *args: Any,
        device: str | None = None,
        priority: int = 0,
        name: str | None = None,
        reads: Any = (),
        writes: Any = (),
        nbytes: int | None = None,
        **kwargs: Any,
    ) -> Future[T]:
        """Admit a task now, or raise QueueFull at the limits.  Callable from any thread.

        Inside a running task, submissions are admitted over the limits (and
        while the engine closes), so nested work can never deadlock it.
        """
        rt = self._rt
        tid = get_ident()
        if rt is None or (self._state != "running" and tid not in rt.worker_threads):
            raise self._closed_error()
        task: Future[T] = self._task(fn, args, kwargs, device, priority, name, reads, writes, nbytes, tid)
        if self._sync_mode:
            return self._run_here(task)
        with rt.lock:
            if rt.closed and not task.nested:
                raise self._closed_error()
            stage = tid == rt.loop_thread and rt.stage_next(priority)
            admitted = rt.core.submit(task, task.nested, stage)
            if not admitted:
                rt.core.publish()  # a caller that retries must see progress
            after = rt.collect()
        if after is not None:
            after()
        if not admitted:
            raise QueueFull(self._full_message(task))
        return task

    async def run(self, fn: Callable[..., T], /, *args: Any, **options: Any) -> T:
        """Submit a task and return its result."""
        fut: Future[T] = await self.submit(fn, *args, **options)
        return await fut

    async def waitall(self) -> None:
        """Wait until every task submitted so far is final (at once on a closed engine)."""
        if self._rt is None:
            raise self._closed_error()
        await self._barrier()

    async def throttle(self) -> None:
        """Wait until the engine is under its limits (room for one more task)."""
        rt = self._running()
        core = rt.core
        with rt.lock:
            if (
                not core.waiting_admission
                and core.pending < core.max_pending
                and (core.pending_bytes < core.max_pending_bytes)
            ):
                return
            token = asyncio.get_running_loop().create_future()
            core.enqueue(None, token)
            after = rt.collect()
        if after is not None:
            after()
        try:
            await token
        except asyncio.CancelledError:
            rt.under_lock(core.withdraw, token)
            raise

    def stats(self) -> Stats:
        """A snapshot of the counters."""
        rt = self._rt
        if rt is None:
            raise EngineClosed(f"{self!r} has not started; use 'async with Engine(...)'")
        core = rt.core
        with rt.lock:
            counts = (
                core.submitted,
                core.completed,
                core.failed,
                core.cancelled,
                core.pending,
                core.running,
                core.waiting_admission,
                core.pending_bytes,
                core.peak_pending_bytes,
            )
            waits = list(rt.queue_waits)
        return Stats(
            *counts,
            max_pending=core.max_pending,
            max_pending_bytes=core.max_pending_bytes,
            queue_wait_p50_s=percentile(waits, 0.5),
            queue_wait_p99_s=percentile(waits, 0.99),
            worker_busy_s=MappingProxyType(rt.busy_seconds()),
        )

    # -- internals -------------------------------------------------------------

    def _running(self) -> Runtime:
        rt = self._rt
        if rt is None or self._state != "running":
            raise self._closed_error()
        return rt

    def _closed_error(self) -> EngineClosed:
        if self._state == "new":
            return EngineClosed("the engine has not started; use 'async with Engine(...) as eng'")
        return EngineClosed("the engine is closed; submit to an engine that is running")

    def _task(
        self,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        device: str | None,
        priority: int,
        name: str | None,
        reads: Any,
        writes: Any,
        nbytes: int | None,
        tid: int,
    ) -> Future[Any]:
        if not callable(fn):
            raise InvalidTask(f"submit() needs a callable first, got {type(fn).__name__} {fn!r}")
        if device is None:
            device = self._default_device
        elif device not in self.config.devices:
            check_device(device)  # an unknown or unavailable device says so first
            raise DeviceError(
                f"device {device!r} is not one of this engine's devices {self.config.devices}; "
                f"add it with Config(devices=(..., {device!r}))"
            )
        if type(priority) is not int:
            raise InvalidTask(f"priority must be an int, got {priority!r}")
        if nbytes is None:
            nbytes = 0
        elif type(nbytes) is not int or nbytes < 0:
            raise InvalidTask(
                f"nbytes must be a non-negative int (bytes the result will hold), got {nbytes!r}"
            )
        deps, buffers = scan(args, kwargs, reads, writes)
        for dep in deps:
            if getattr(dep, "_engine", None) is not self:
                raise InvalidTask(f"{dep!r} belongs to another engine; await it and pass its value")
        nested = tid in self._rt.worker_threads  # type: ignore[union-attr]
        return Future(self, fn, args, kwargs or None, device, priority, nbytes, buffers, deps, name, nested)

    def _run_here(self, task: Future[T]) -> Future[T]:
        """sync_mode: run the task in the caller now; its error is raised here."""
        rt = self._running()
        with rt.lock:
            rt.core.submit(task, force=True)
            claimed = rt.core.claim(task)
            after = rt.collect()
        if after is not None:
            after()
        if claimed:
            rt.execute(task, chain=False)
        elif task.state not in FINAL_STATES:
            task.result()
        if task.state == "failed" and task.error is not None:
            raise task.error
        return task

    def _cancel(self, task: Future[Any]) -> bool:
        rt = self._rt
        if rt is None:
            return False
        rt.under_lock(rt.core.cancel, task)
        return task.state == "cancelled"

    async def _barrier(self) -> None:
        rt = self._rt
        assert rt is not None
        with rt.lock:
            if rt.core.pending == 0:
                return
            token = asyncio.get_running_loop().create_future()
            rt.core.barrier(token)
            rt.core.publish()
            after = rt.collect()
        if after is not None:
            after()
        await token

    def _full_message(self, task: Future[Any]) -> str:
        core = self._rt.core  # type: ignore[union-attr]
        return (
            f"engine at its limits ({core.pending}/{core.max_pending} tasks, "
            f"{core.pending_bytes}/{core.max_pending_bytes} bytes, {core.waiting_admission} waiting): "
            f"{task!r} was not admitted; use 'await eng.submit(...)' to wait for room"
        )

    def __repr__(self) -> str:
        rt = self._rt
        if rt is None:
            return f"<Engine {self._state} cpu_workers={self.config.cpu_workers}>"
        core = rt.core
        return (
            f"<Engine {self._state} devices={','.join(self.config.devices)} "
            f"pending={core.pending}/{core.max_pending} running={core.running} "
            f"bytes={core.pending_bytes}/{core.max_pending_bytes}>"
        )
