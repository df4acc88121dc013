"""``Engine``: the asyncio frontend that turns calls into scheduled tasks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import operator
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Coroutine, Iterable, Iterator, Sequence
from inspect import (
    CO_ASYNC_GENERATOR,
    CO_COROUTINE,
    CO_ITERABLE_COROUTINE,
    isasyncgenfunction,
    iscoroutinefunction,
)
from threading import get_ident
from types import BuiltinFunctionType, FunctionType, MappingProxyType, MethodType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ._config import Config
from ._core import FINAL_STATES, Buffer, Scheduler, Task, name_of, safe_repr
from ._errors import DeviceError, EngineClosed, InvalidTask, QueueFull, SchedsvcError, TraceError
from ._future import Future, stop_through_await
from ._runtime import Runtime, buffer_of, scan
from ._runtime._runtime import FORKED, settle
from ._telemetry import Stats, percentiles
from ._timeline import Timeline
from .devices import check_device, make_device
from .tensor import OPS, Op, Tensor, concrete
from .tensor._tensor import ACTIVE, tracing

if TYPE_CHECKING:
    from .compile import Compiled

__all__ = ["Engine"]

T = TypeVar("T")

_JOIN_TIMEOUT_S = 30.0
_INTERRUPT_GRACE_S = 0.5  # after Ctrl-C, how long a close waits for running tasks before saying so


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
            config = config.replace(**overrides)
        self.config = config
        self._rt: Runtime | None = None
        self._state = "new"
        self._closing: asyncio.Future[None] | None = None
        self._sync_mode = config.sync_mode
        self._remote = config.backend == "dask"  # tasks run on a Dask cluster
        self._default_device = "cpu" if "cpu" in config.devices else config.devices[0]
        self._compile_counts = [0, 0]  # traces, replays of this engine's compiled functions
        # (token, asyncio task) of throttle() calls let through onto a reserved slot whose caller has
        # not yielded since (loop thread only): its next submission takes the slot, ahead of the queue
        self._held: list[tuple[asyncio.Future[None], asyncio.Task[Any] | None]] = []
        self._waits_cache: tuple[int, float, float] = (-1, 0.0, 0.0)  # (samples seen, p50, p99)
        # memory key -> the Tensor that owns it, for arrays wrapped by asarray: Tensors over one
        # array share their writes, and eng.submit(..., out=array) counts as a write of them
        self._owners: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
        self._loop_watch: AsyncGenerator[None, None] | None = None  # see _watch_loop_end
        # a task that writes Tensors, until admitted -> each owner and its last write before the task
        self._unadmitted_writes: dict[Task, list[tuple[Tensor, Any]]] = {}
        self._abandoned = ""  # why the engine stopped without aclose(): its loop closed, or a fork

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> Engine:
        """Start the workers on the running event loop."""
        if self._state != "new":
            raise EngineClosed(f"{self!r} was already started; create a new Engine")
        remote = self._remote
        if remote:
            _check_dask_config(self.config)
        for name in self.config.devices:
            check_device(name)
        timeline = None if self.config.trace_path is None else Timeline(self.config.trace_path)
        core = Scheduler(
            max_pending=self.config.max_pending,
            max_pending_bytes=self.config.max_pending_bytes,
            devices=self.config.devices,
            clock=time.perf_counter,
        )
        # on Dask no task runs in this process, so none runs inline on an awaiting thread
        inline_s = 0.0 if remote else self.config.inline_threshold_us / 1e6
        rt = Runtime(core, asyncio.get_running_loop(), inline_s)
        if remote:
            from .devices import dask

            rt.remote = True
            rt.add_device("cpu", await dask.connect(rt, self.config))
        else:
            for name in self.config.devices:
                rt.add_device(name, make_device(name, rt, self.config))
        for device in rt.devices.values():
            device.start()
        self._rt = rt
        self._state = "running"
        _STARTED.add(self)  # for a fork: the child's copy refuses work
        self._loop_watch = _watch_loop_end(self)
        if timeline is not None:  # the engine's whole life, written at aclose()
            self._attach(rt, timeline)
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
        if rt is not None and rt.loop.is_closed() and self._state == "running":  # closed late, elsewhere
            self._abandon(rt, _LOOP_CLOSED, warn=False)  # being closed now: nothing to warn about
        if rt is None or self._state != "running":
            self._state = "closed"
            if rt is not None and self._abandoned == _LOOP_CLOSED:  # its threads were told to stop
                await self._join(rt, _JOIN_TIMEOUT_S)
            return
        self._state = "closing"
        self._closing = asyncio.get_running_loop().create_future()
        try:
            await self._close(rt, cancel_pending)
        finally:
            self._state = "closed"
            self._closing.set_result(None)
            _finish(self._loop_watch)

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
        except BaseException:  # the close was cancelled (or failed): stop now
            self._cancel_pending(rt)
            for device in rt.devices.values():
                device.stop()
            self._write_life_trace(rt)  # with the tasks finished so far: a later aclose has no more to add
            await _aclose_devices(rt)
            raise
        for device in rt.devices.values():
            device.stop()
        await _aclose_devices(rt)
        stuck = await self._join(rt, _JOIN_TIMEOUT_S)
        if stuck:
            warnings.warn(f"schedsvc: threads still running after close: {stuck}", RuntimeWarning, 2)
        self._write_life_trace(rt)

    def _write_life_trace(self, rt: Runtime) -> None:
        """Write ``Config(trace_path=...)``'s trace of the engine's whole life (once)."""
        if self.config.trace_path is not None and rt.timeline is not None:
            self._detach(rt).write()

    def _cancel_pending(self, rt: Runtime) -> None:
        for token in rt.under_lock(rt.core.cancel_pending):
            settle(token, EngineClosed("the engine closed with cancel_pending=True"))
        for device in rt.devices.values():
            cancel_all = getattr(device, "cancel_all", None)  # a remote executor: tasks sent, not started
            if cancel_all is not None:
                cancel_all()

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
        interrupted = exc_type is not None and issubclass(
            exc_type, asyncio.CancelledError | KeyboardInterrupt
        )
        notice = asyncio.ensure_future(self._say_what_close_waits_for()) if interrupted else None
        try:
            await self.aclose(cancel_pending=exc_type is not None)
        finally:
            if notice is not None:
                notice.cancel()

    async def _say_what_close_waits_for(self) -> None:
        """After Ctrl-C, a close that waits for running tasks says so once, and how to stop waiting."""
        await asyncio.sleep(_INTERRUPT_GRACE_S)  # tasks about to finish need no word
        rt = self._rt
        if rt is None or self._state != "closing":
            return
        with rt.lock:
            running = rt.core.running
        if running:
            tasks = "task" if running == 1 else "tasks"
            print(
                f"schedsvc: cancelled the queued tasks; waiting for {running} running {tasks} "
                "to finish (press Ctrl-C again to exit without waiting)",
                file=sys.stderr,
                flush=True,
            )

    @property
    def closed(self) -> bool:
        return self._state in ("closing", "closed")

    # -- submitting ------------------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **options: Any) -> Coroutine[Any, Any, Future[T]]:
        """Admit ``fn(*args, **kwargs)`` as a task, waiting while the engine is at its limits.

        Options: ``device``, ``priority``, ``name``, ``reads``, ``writes``,
        ``nbytes``; other keywords are passed to ``fn``.  ``await`` it.
        """
        if ACTIVE[0] and tracing.depth:  # checked here: an un-awaited coroutine would never check
            raise _submit_while_tracing(fn)
        return self._submit(fn, *args, **options)

    async def _submit(
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
        rt = self._running()
        tid = get_ident()
        task: Future[T] = self._task(fn, args, kwargs, device, priority, name, reads, writes, nbytes, tid)
        if self._sync_mode:
            try:
                return self._run_here(task)
            except StopIteration as exc:  # PEP 479 would make it a bare RuntimeError in this coroutine
                raise stop_through_await(task, exc) from exc
        token = None
        try:
            with rt.lock:
                if rt.closed:
                    raise self._closed_error()
                stage = tid == rt.loop_thread and rt.stage_next(priority)
                if not rt.core.submit(task, task.nested, stage) and not self._use_reserved(
                    rt, task, tid, stage
                ):
                    token = asyncio.get_running_loop().create_future()
                    rt.core.enqueue(task, token)
                    rt.core.publish()  # we are about to wait: let staged work run
                after = rt.collect()
        except BaseException:  # not admitted (closed, MemoryLimitError): as if never submitted
            self._unwrite(task)
            raise
        if self._unadmitted_writes:
            self._unadmitted_writes.pop(task, None)  # admitted, or queued in order: its writes stand
        if after is not None:
            after()
        if token is not None:
            try:
                await token
            except asyncio.CancelledError:
                task.cancel()  # not admitted yet, or admitted and now unwanted
                raise
        if rt.remote and task.state == "waiting":
            rt.devices["cpu"].forward(task)  # type: ignore[attr-defined]
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
        if rt is None or (self._state != "running" and tid not in rt.worker_threads) or rt.loop.is_closed():
            raise self._refusal()
        task: Future[T] = self._task(fn, args, kwargs, device, priority, name, reads, writes, nbytes, tid)
        if self._sync_mode:
            return self._run_here(task)
        try:
            with rt.lock:
                if rt.closed and not task.nested:
                    raise self._closed_error()
                stage = tid == rt.loop_thread and rt.stage_next(priority)
                admitted = rt.core.submit(task, task.nested, stage) or self._use_reserved(
                    rt, task, tid, stage
                )
                if not admitted:
                    rt.core.publish()  # a caller that retries must see progress
                after = rt.collect()
        except BaseException:  # not admitted (closed, MemoryLimitError): as if never submitted
            self._unwrite(task)
            raise
        if after is not None:
            after()
        if self._unadmitted_writes:
            if not admitted:
                self._unwrite(task)
            self._unadmitted_writes.pop(task, None)
        if not admitted:
            raise QueueFull(self._full_message(task))
        if rt.remote and task.state == "waiting":
            rt.devices["cpu"].forward(task)  # type: ignore[attr-defined]
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
        """Wait until the engine is under its limits (room for one more task), first come first served.

        Waiters are let through one per free slot, in the same queue as
        ``await submit`` calls.  A caller that had to wait holds its slot until
        it next yields to the event loop: its next submission takes it, and
        nobody queued behind it does.
        """
        rt = self._running()
        core = rt.core
        with rt.lock:
            if core.has_room(1):  # under both limits, nobody queued: what lets a waiter through
                return
            token = asyncio.get_running_loop().create_future()
            core.enqueue(None, token)
            core.publish()  # we are about to wait: let staged work run
            after = rt.collect()
        if after is not None:
            after()
        try:
            await token
        except asyncio.CancelledError:  # still queued, or let through after all: give the slot back
            rt.under_lock(_leave_queue, core, token)
            raise
        if token.get_loop() is not rt.loop:  # a slot is held only on the engine's loop: give it back now
            rt.under_lock(rt.core.unreserve, token)
            return
        entry = (token, asyncio.current_task())
        self._held.append(entry)
        rt.loop.call_soon(self._unhold, rt, entry)  # runs once this caller has yielded

    def _unhold(self, rt: Runtime, entry: tuple[asyncio.Future[None], Any]) -> None:
        """A throttle caller yielded without submitting: its reserved slot goes to the next in line."""
        if entry in self._held:
            self._held.remove(entry)
            rt.under_lock(rt.core.unreserve, entry[0])

    def _use_reserved(self, rt: Runtime, task: Task, tid: int, stage: bool) -> bool:
        """With the lock held, ``task`` did not fit: admit it on the slot throttle() let its caller onto."""
        if not self._held or tid != rt.loop_thread or asyncio._get_running_loop() is not rt.loop:
            return False
        caller = asyncio.current_task()
        for entry in self._held:
            if entry[1] is caller:
                self._held.remove(entry)
                return rt.core.submit_reserved(task, entry[0], stage)
        return False

    def map(
        self,
        fn: Callable[..., T],
        source: Iterable[Any] | AsyncIterable[Any],
        /,
        *,
        max_inflight: int | None = None,
        ordered: bool = True,
        device: str | None = None,
        **options: Any,
    ) -> AsyncGenerator[T, None]:
        """Run ``fn(item)`` as a task per item of ``source``; an async generator of the results.

        ``source`` is an iterable or an async iterable; an item that is a
        Future or Tensor (say, from another stage) is a dependency, as in
        ``submit``.  At most ``max_inflight`` items (default: twice the
        device's workers; on Dask, twice the cluster's worker threads when
        the engine started) are submitted and not yet yielded: the source is
        pulled ahead, concurrently, up to that window.  Results come in source
        order (``ordered=True``) or as they finish; an item's error, and the
        source's, is raised at its place in that order.
        When the generator ends early (an error, ``aclose()``, a cancelled
        consumer), unstarted tasks are cancelled and a generator source is
        closed.  ``options`` (``priority``, ``name``, ``nbytes``, ...) go to
        ``submit``.
        """
        from ._pipeline import pipeline

        check_fn(fn)  # now, not at the first item: an async generator starts only when iterated
        return pipeline(self, fn, source, max_inflight, ordered, device, options)

    @contextlib.contextmanager
    def trace(self, path: str | os.PathLike[str], *, max_spans: int = 2_000_000) -> Iterator[Timeline]:
        """Record what runs inside the block; write it to ``path`` as Chrome trace JSON at the end.

        Open the file in https://ui.perfetto.dev or ``chrome://tracing``: a
        track per worker thread (per Dask worker on ``backend="dask"``) with a
        span per task (name, argument shapes, error), flow arrows along
        dependency edges, and counter tracks of pending tasks and bytes.  Tasks that finish inside the block are
        recorded: await the work (``await eng.waitall()``) before leaving it.
        Spans past ``max_spans`` are counted, not kept (about 100 bytes each).
        A path whose directory is missing or not writable raises
        ``FileNotFoundError`` or ``PermissionError`` here, before recording
        (a directory: ``IsADirectoryError``; an empty path or ``max_spans < 1``: ``ValueError``).
        """
        rt = self._running()
        timeline = Timeline(path, max_spans)
        self._attach(rt, timeline)
        try:
            yield timeline
        finally:
            self._detach(rt)
            timeline.write()

    def _attach(self, rt: Runtime, timeline: Timeline) -> None:
        with rt.lock:
            if rt.timeline is not None:
                raise SchedsvcError(
                    f"a trace is already being recorded to {rt.timeline.path!r}; one trace at a time "
                    "(Config(trace_path=...) records the whole life of the engine)"
                )
            rt.timeline, rt.core.edges = timeline, timeline.edges
            timeline.on_full = functools.partial(_stop_edges, rt)  # past the cap: memory stays bounded
            timeline.loop_thread = rt.loop_thread
            timeline.sample(rt.core)

    def _detach(self, rt: Runtime) -> Timeline:
        with rt.lock:
            timeline = rt.timeline
            assert timeline is not None
            timeline.sample(rt.core)
            rt.timeline, rt.core.edges = None, None
        return timeline

    def stats(self) -> Stats:
        """A snapshot of the counters."""
        rt = self._rt
        if rt is None:
            raise EngineClosed(f"{self!r} has not started; use 'async with Engine(...)'")
        core = rt.core
        waits = None
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
            ended = core.completed + core.failed  # at least the queue-wait samples taken so far
            seen, p50, p99 = self._waits_cache
            # the percentiles are sorted out of the window again once an eighth of it is new: a
            # per-request stats() then costs microseconds, not a sort of 8,192 samples
            if ended - seen >= max(1, len(rt.queue_waits) >> 3):
                waits = list(rt.queue_waits)
        if waits is not None:
            p50, p99 = percentiles(waits, (0.5, 0.99))
            self._waits_cache = (ended, p50, p99)
        return Stats(
            *counts,
            max_pending=core.max_pending,
            max_pending_bytes=core.max_pending_bytes,
            queue_wait_p50_s=p50,
            queue_wait_p99_s=p99,
            worker_busy_s=MappingProxyType(rt.busy_seconds()),
            compile_traces=self._compile_counts[0],
            compile_replays=self._compile_counts[1],
        )

    @property
    def pending(self) -> int:
        """Tasks admitted and not yet final (0 before start): a cheap load figure to read per request."""
        rt = self._rt
        return 0 if rt is None else rt.core.pending

    def has_room(self, nbytes: int = 0) -> bool:
        """Would a submission holding ``nbytes`` new bytes be admitted now, without waiting?

        For load shedding: ask before reading a request.  False unless the
        engine is running.  Another submission may take the room before yours.
        """
        if type(nbytes) is not int or nbytes < 0:
            raise InvalidTask(f"has_room(nbytes=...) needs a non-negative int of bytes, got {nbytes!r}")
        rt = self._rt
        if rt is None or self._state != "running":
            return False
        with rt.lock:
            return rt.core.has_room(nbytes)

    # -- tensors ---------------------------------------------------------------

    def asarray(self, obj: Any, dtype: Any = None, *, device: str | None = None, shape: Any = None) -> Tensor:
        """A Tensor of ``obj`` (an array, anything ``np.asarray`` takes, a Tensor or a Future).

        An ndarray is used as it is, not copied (as ``np.asarray``): in-place
        Tensor operations write it, ordered with the tasks that use it.  A
        Future that is not done needs ``shape=`` and ``dtype=``: its value is
        checked against them when it arrives.
        """
        device = self._device(device)
        self._no_tensors("eng.asarray")
        if isinstance(obj, Tensor):
            return obj if dtype is None or np.dtype(dtype) == obj.dtype else obj.astype(dtype)
        if isinstance(obj, Future):
            return self._future_tensor(obj, dtype, shape, device)
        array = np.asarray(obj, dtype=dtype)
        self._running()
        if shape is not None and tuple(shape) != array.shape:
            raise ValueError(f"asarray(shape={tuple(shape)}) does not match the array's shape {array.shape}")
        tensor = concrete(self, array, device)
        owner = self._owners.get(tensor.memory[0])
        if owner is None:
            self._owners[tensor.memory[0]] = tensor
        else:  # another Tensor over the same memory: they share one owner, so writes are seen by both
            tensor._root = owner
        return tensor

    def zeros(self, shape: Any, dtype: Any = float, *, device: str | None = None) -> Tensor:
        """A Tensor of zeros, created by a task."""
        return self._create("zeros", device, shape=_shape_arg(shape), dtype=np.dtype(dtype))

    def ones(self, shape: Any, dtype: Any = float, *, device: str | None = None) -> Tensor:
        """A Tensor of ones, created by a task."""
        return self._create("ones", device, shape=_shape_arg(shape), dtype=np.dtype(dtype))

    def empty(self, shape: Any, dtype: Any = float, *, device: str | None = None) -> Tensor:
        """A Tensor with uninitialised contents, created by a task."""
        return self._create("empty", device, shape=_shape_arg(shape), dtype=np.dtype(dtype))

    def full(self, shape: Any, fill_value: Any, dtype: Any = None, *, device: str | None = None) -> Tensor:
        """A Tensor filled with ``fill_value`` (its dtype unless ``dtype`` is given)."""
        attrs = {"shape": _shape_arg(shape), "fill_value": fill_value}
        attrs["dtype"] = np.dtype(dtype) if dtype is not None else np.asarray(fill_value).dtype
        return self._create("full", device, **attrs)

    def arange(
        self, start: Any, stop: Any = None, step: Any = 1, dtype: Any = None, *, device: str | None = None
    ) -> Tensor:
        """``np.arange`` as a Tensor: ``arange(stop)`` or ``arange(start, stop, step)``."""
        if stop is None:
            start, stop = 0, start
        attrs = {"start": start, "stop": stop, "step": step}
        if dtype is not None:
            attrs["dtype"] = np.dtype(dtype)
        return self._create("arange", device, **attrs)

    def compile(
        self, fn: Callable[..., Any], *, max_signatures: int = 64, name: str | None = None
    ) -> Compiled:
        """Compile ``fn`` (array code on Tensors) the way ``hybridize`` does: trace once, replay fused.

        The first call with a signature (the shapes, dtypes and devices of the
        arguments, and the values of the other arguments) traces ``fn`` on
        symbolic tensors; later calls replay the optimised graph as one task.
        ``max_signatures`` signatures are kept, least recently used first out.
        """
        from .compile import Compiled

        self._no_tensors("eng.compile")
        return Compiled(self, fn, max_signatures=max_signatures, name=name)

    def _create(self, name: str, device: str | None, **attrs: Any) -> Tensor:
        op = OPS[name]
        if ACTIVE[0] and tracing.depth:  # inside a compiled function: a node of its graph
            return tracing.trace.record(op, (), attrs, None)  # type: ignore[no-any-return]
        self._no_tensors(f"eng.{name}")
        shape, dtype, _ = op.infer((), attrs)
        return self._tensor_task(op, [], attrs, shape, dtype, None, None, device=self._device(device))

    def _future_tensor(self, fut: Future[Any], dtype: Any, shape: Any, device: str) -> Tensor:
        if fut.state == "done" and shape is None:
            return self.asarray(fut.value, dtype, device=device)
        if shape is None or dtype is None:
            raise TypeError(
                f"{fut!r} has not finished, so its shape and dtype are not known yet; "
                "await it first, or pass shape= and dtype= to eng.asarray"
            )
        attrs = {"shape": _shape_arg(shape), "dtype": np.dtype(dtype)}
        return self._tensor_task(
            _CHECKED, [fut], attrs, attrs["shape"], attrs["dtype"], None, None, device=device
        )

    def _device(self, device: str | None) -> str:
        """The device a task or Tensor asked for (None: the default), checked against this engine's."""
        if device is None:
            return self._default_device
        if device not in self.config.devices:
            check_device(device)  # an unknown or unavailable device says so first
            raise DeviceError(
                f"device {device!r} is not one of this engine's devices {self.config.devices}; "
                f"add it with Config(devices=(..., {device!r}))"
            )
        return device

    def _tensor_task(
        self,
        op: Op,
        args: Sequence[Any],
        kwargs: dict[str, Any] | None,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        root: Tensor | None,
        target: Tensor | None,
        memory: tuple[int, int] | None = None,
        device: str | None = None,
        out_bytes: int | None = None,
        replay: Any = None,
        limits: bool = False,
        waiting: list[asyncio.Future[None]] | None = None,
    ) -> Tensor:
        """Queue one Tensor operation; it is admitted over the limits (operators cannot wait).

        ``replay``: the ``Compiled`` this task replays, counted under the lock.
        ``limits``: admit it only within the limits (not nested), else raise
        QueueFull -- or, given ``waiting``, queue it for admission (FIFO) and
        append the token to await there.
        """
        rt = self._rt
        tid = get_ident()
        if rt is None or (self._state != "running" and tid not in rt.worker_threads) or rt.loop.is_closed():
            raise self._refusal()
        args = tuple(args)
        deps: list[Task] = []
        plain = True  # are the deps exactly the operands, in order? (then they share one tuple)
        buffers: list[Buffer] = []
        for arg in args:  # hot path: one pass, no helper calls for the common operand
            if type(arg) is Tensor:
                deps.append(arg)
                if device is None:
                    device = arg.device
                buffers.append(arg.memory)  # (key, nbytes, False): a read of its memory
                owner = arg._root
                last = (arg if owner is None else owner)._last_write
                if last is not None and last is not arg and last.state != "done":
                    deps.append(last)  # reading after a write that fails fails, as NumPy stops
                    plain = False
                continue
            plain = False
            if isinstance(arg, Task):
                deps.append(arg)
                if device is None:
                    device = arg.device
                held = arg.memory
                if held is not None:
                    buffers.append(held)
                    pending = _pending_write(arg)
                    if pending is not None:
                        deps.append(pending)
            elif isinstance(arg, np.ndarray):
                key, nb = buffer_of(arg)
                buffers.append((key, nb, False))
        if target is not None:
            plain = False
            deps.append(target)
            buffers.append((target.memory[0], target.memory[1], True))
            previous = _pending_write(target)
            if previous is not None:
                deps.append(previous)  # a failed write fails the writes after it, as NumPy would stop
        if len(buffers) > 1:
            buffers = _merge(buffers)
        if out_bytes is None:
            fresh = root is None and target is None and memory is None
            out_bytes = math.prod(shape) * dtype.itemsize if fresh else 0
        task = Tensor(
            self,
            op.fn,
            args,
            kwargs or None,
            device or self._default_device,
            0,
            out_bytes,
            tuple(buffers),
            args if plain else tuple(deps),
            op.name,
            tid in rt.worker_threads,
        )
        task.shape, task.dtype, task._last_write = shape, dtype, None
        if target is not None:  # a write: the owner points at it (_last_write), not back
            task.memory, task._root = target.memory, None
        elif root is not None:
            task.memory, task._root = root.memory, root
        else:
            task.memory = (id(task), out_bytes, False) if memory is None else (memory[0], memory[1], False)
            task._root = None
        if self._sync_mode:
            if replay is not None:
                replay.replays += 1
                self._compile_counts[1] += 1
            self._run_here(task)
            return task
        with rt.lock:
            if rt.closed and not task.nested:
                raise self._closed_error()
            stage = tid == rt.loop_thread and rt.stage_next(0)
            if limits:
                admitted = self._admit_within_limits(rt, task, tid, stage, waiting)
            else:
                admitted = rt.core.submit(task, True, stage)
            if replay is not None and admitted:  # counted under the lock already held, not a second one
                replay.replays += 1
                self._compile_counts[1] += 1
            after = rt.collect()
        if after is not None:
            after()
        if not admitted:
            raise QueueFull(self._full_message(task, "await compiled.submit(...)"))
        return task

    def _admit_within_limits(
        self, rt: Runtime, task: Tensor, tid: int, stage: bool, waiting: list[asyncio.Future[None]] | None
    ) -> bool:
        """With the lock held: admit ``task`` as ``submit_nowait`` would, or (``waiting``) queue it."""
        core = rt.core
        if core.submit(task, task.nested, stage) or self._use_reserved(rt, task, tid, stage):
            return True
        if waiting is None:
            core.publish()  # a caller that retries must see progress
            return False
        token = asyncio.get_running_loop().create_future()  # the caller's loop: it awaits the token
        core.enqueue(task, token)
        core.publish()  # the caller is about to wait: let staged work run
        waiting.append(token)
        return True  # queued: counted as a call now

    def _no_tensors(self, what: str) -> None:
        if self._remote:
            raise InvalidTask(
                f"{what}: Tensors and compiled functions run on this process's devices and are not "
                "available with backend='dask'; submit functions that take and return arrays "
                "(eng.submit(np.matmul, a, b)), or use backend='threads'"
            )

    # -- internals -------------------------------------------------------------

    def _running(self) -> Runtime:
        rt = self._rt
        if rt is None or self._state != "running" or rt.loop.is_closed():
            raise self._refusal()
        return rt

    def _refusal(self) -> EngineClosed:
        """Why the engine takes no work, found without its lock: one whose loop has closed is stopped first."""
        rt = self._rt
        if rt is not None and self._state == "running" and rt.loop.is_closed():
            self._abandon(rt, _LOOP_CLOSED)  # takes the lock: never call this with it held
        return self._closed_error()

    def _closed_error(self) -> EngineClosed:
        """Why the engine takes no work (no side effect: safe with the lock held)."""
        if self._state == "new":
            return EngineClosed("the engine has not started; use 'async with Engine(...) as eng'")
        if self._abandoned == _LOOP_CLOSED:
            return EngineClosed(
                "the event loop this engine was started on has closed (the engine was never closed with "
                "'await eng.aclose()'); create a new Engine on the running loop: 'async with ss.Engine() as eng'"
            )
        if self._abandoned == _FORKED:
            return EngineClosed(FORKED)
        return EngineClosed("the engine is closed; submit to an engine that is running")

    def _abandon(self, rt: Runtime, why: str, warn: bool = True) -> None:
        """The engine's loop closed while it was open: warn, and let its threads finish what is queued and end."""
        if warn:
            _warn_unclosed(f"{self!r} was still open when its event loop closed", 5)
        self._state, self._abandoned = "closed", why
        _stop_devices(rt)

    def _loop_ended(self) -> None:
        """The engine's loop is shutting down (``asyncio.run`` returned) and the engine is still open."""
        rt = self._rt
        if rt is not None and self._state == "running":
            self._abandon(rt, _LOOP_CLOSED, warn=False)
            _warn_unclosed(f"{self!r} was still open when its event loop ended", 3)

    def _after_fork(self) -> None:
        """In a forked child: the engine's threads did not come along; it refuses work from now on."""
        if self._rt is not None and self._state != "closed":
            self._state, self._abandoned, self._closing = "closed", _FORKED, None
            self._rt.after_fork()

    def __del__(self) -> None:
        rt = getattr(self, "_rt", None)
        if rt is None or getattr(self, "_state", None) != "running":
            return
        text = f"unclosed {self!r}"
        self._state = "closed"
        # in a thread of its own: the last reference may go while this thread holds the engine's lock
        with contextlib.suppress(RuntimeError):  # at interpreter exit no thread starts: they die anyway
            threading.Thread(target=_stop_devices, args=(rt,), name="schedsvc-stop", daemon=True).start()
        _warn_unclosed(text, 3, self)

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
        if ACTIVE[0] and tracing.depth:
            raise _submit_while_tracing(fn)
        kind = type(fn)
        if kind is FunctionType:  # hot path: a plain function may still be an async one
            if fn.__code__.co_flags & _ASYNC_CODE:
                raise _async_fn(fn)
        elif kind not in _SYNC_KINDS:  # builtins, ufuncs and NumPy functions need no check
            check_fn(fn)
        device = self._default_device if device is None else self._device(device)  # hot path: no call
        if type(priority) is not int:
            raise InvalidTask(f"priority must be an int, got {priority!r}")
        if nbytes is None:
            nbytes = 0
        elif type(nbytes) is not int or nbytes < 0:
            raise InvalidTask(
                f"nbytes must be a non-negative int (bytes the result will hold), got {nbytes!r}"
            )
        if self._remote:
            _check_remote_writes(fn, kwargs, writes)
        deps, buffers = scan(args, kwargs, reads, writes)
        # hot path: plain loops, no generator per submission
        for dep in deps:
            if getattr(dep, "_engine", None) is not self:
                raise InvalidTask(f"{dep!r} belongs to another engine; await it and pass its value")
            if type(dep) is Tensor and dep.owner._last_write is not None:
                deps = _with_pending_writes(deps, deps)
                break
        written: list[Tensor] = []
        for buffer in buffers:
            if buffer[2]:  # a write: `await t` of a Tensor over this memory must wait for this task
                written = self._written_tensors(kwargs, writes, buffers)
                deps = _with_pending_writes(deps, written)
                break
        nested = tid in self._rt.worker_threads  # type: ignore[union-attr]
        task: Future[Any] = Future(
            self, fn, args, kwargs or None, device, priority, nbytes, buffers, deps, name, nested
        )
        if written:  # undone by _unwrite if the task is not admitted after all
            self._unadmitted_writes[task] = [(t.owner, t.owner._last_write) for t in written]
            for target in written:
                target.owner._last_write = task
        return task

    def _unwrite(self, task: Task) -> None:
        """``task`` was not admitted (QueueFull, closed, too big): its Tensors' last writes are as before."""
        for owner, previous in self._unadmitted_writes.pop(task, ()):
            if owner._last_write is task:
                owner._last_write = previous

    def _written_tensors(
        self, kwargs: dict[str, Any], writes: Any, buffers: tuple[Buffer, ...]
    ) -> list[Tensor]:
        written = _tensors_in((kwargs.get("out"), writes))
        return written + [o for b in buffers if b[2] and (o := self._owners.get(b[0])) is not None]

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
            rt.wait_blocking(task, None)  # sync_mode blocks the caller, the loop's thread too
        if task.state == "failed" and task.error is not None:
            raise task.error
        return task

    def _cancel(self, task: Future[Any]) -> bool:
        rt = self._rt
        if rt is None:
            return False
        rt.under_lock(rt.core.cancel, task)
        if rt.remote:  # sent to Dask (running, or forwarded while waiting): cancel it there too
            sent = bool(rt.devices[task.device].cancel(task))  # type: ignore[attr-defined]
            return task.state == "cancelled" or sent
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

    def _full_message(self, task: Future[Any], waiting_form: str = "await eng.submit(...)") -> str:
        core = self._rt.core  # type: ignore[union-attr]
        return (
            f"engine at its limits ({core.pending}/{core.max_pending} tasks"
            f"{f', {core.reserved} slots held by throttle() callers' if core.reserved else ''}, "
            f"{core.pending_bytes}/{core.max_pending_bytes} bytes, {core.waiting_admission} waiting): "
            f"{task!r} was not admitted; use '{waiting_form}' to wait for room"
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


_ASYNC_CODE = CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE
_SYNC_KINDS = frozenset({BuiltinFunctionType, np.ufunc, type(np.sum)})  # type(np.sum): NumPy's dispatcher
_ASYNC_CALLS: dict[type, bool] = {}  # a callable's type -> is calling it async (its __call__ is)


def check_fn(fn: Any) -> None:
    """Raise InvalidTask unless ``fn`` is a synchronous callable (a task's function)."""
    if not callable(fn):
        raise InvalidTask(f"submit() needs a callable first, got {type(fn).__name__} {safe_repr(fn)}")
    if _is_async(fn):
        raise _async_fn(fn)


def _is_async(fn: Any) -> bool:
    """Is ``fn`` (or what a method or partial wraps, or a callable object's ``__call__``) ``async def``?"""
    kind = type(fn)
    while kind is MethodType or kind is functools.partial:  # hot for bound methods and partials: no inspect
        fn = fn.__func__ if kind is MethodType else fn.func
        kind = type(fn)
    if kind is FunctionType:
        return bool(fn.__code__.co_flags & _ASYNC_CODE)
    if kind in _SYNC_KINDS:
        return False
    known = _ASYNC_CALLS.get(kind)  # other callables: their type's __call__ decides, once per type
    if known is None:
        try:
            call = kind.__call__
            known = any(iscoroutinefunction(f) or isasyncgenfunction(f) for f in (fn, call))
        except Exception:  # user objects run code in these look-ups: a callable we cannot see into is sync
            known = False
        if len(_ASYNC_CALLS) >= 1024:  # classes made at run time must not grow this for ever
            _ASYNC_CALLS.clear()
        _ASYNC_CALLS[kind] = known
    return known


def _async_fn(fn: Any) -> InvalidTask:
    label = name_of(fn) or safe_repr(fn)
    return InvalidTask(
        f"{label} is an async function: a task runs on a worker thread, where calling it would only "
        "create a coroutine (or async generator) and never run it. Await it in your async code "
        f"(await {label}(...)); submit synchronous functions (def, not async def) to the engine"
    )


def _leave_queue(core: Scheduler, token: Any) -> None:
    """A cancelled throttle() leaves the admission queue, or gives back the slot it was let through onto."""
    if not core.withdraw(token):
        core.unreserve(token)


def _check_dask_config(config: Config) -> None:
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


def _check_remote_writes(fn: Any, kwargs: dict[str, Any], writes: Any) -> None:
    """On Dask a task writes into its own copy of a buffer: refuse writes that cannot come back."""
    label = name_of(fn) or "task"
    if not (type(writes) is tuple and not writes):
        raise InvalidTask(
            f"{label}: writes= declares memory the task changes through a closure; on backend='dask' the "
            "task runs in another process on a copy, so the change could never reach this array. "
            "Return the new array instead, or pass the array as out= (it is written back)"
        )
    out = kwargs.get("out")
    if out is not None and not isinstance(out, np.ndarray):
        raise InvalidTask(
            f"{label}: out= must be a NumPy array of this process on backend='dask' (it is written back "
            f"after the task), got {type(out).__name__}; return the new value instead"
        )


_LOOP_CLOSED = "loop closed"
_FORKED = "forked"
_STARTED: weakref.WeakSet[Engine] = weakref.WeakSet()  # engines started in this process (not kept alive)


def _watch_loop_end(engine: Engine) -> AsyncGenerator[None, None]:
    """An async generator, started and left suspended, that the engine's loop closes when it shuts down.

    asyncio has no hook for a loop's end, but ``asyncio.run`` (and every Runner) closes the async
    generators still suspended on its loop (``shutdown_asyncgens``) before it closes the loop: the
    generator's ``finally`` is the moment an engine that was never closed is found out.  It holds the
    engine weakly, so a forgotten engine is still garbage-collected (and warns then, in ``__del__``).
    """
    ref = weakref.ref(engine)

    async def watch() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            engine = ref()
            if engine is not None:
                engine._loop_ended()

    gen = watch()
    with contextlib.suppress(StopIteration):  # run to its yield: the loop's hooks now track it
        gen.asend(None).send(None)
    return gen


def _finish(gen: AsyncGenerator[None, None] | None) -> None:
    """Close a suspended ``_watch_loop_end`` generator now (its ``finally`` has nothing to await)."""
    if gen is not None:
        with contextlib.suppress(StopIteration, RuntimeError):
            gen.aclose().send(None)


def _after_fork_in_child() -> None:
    for engine in list(_STARTED):
        engine._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _stop_devices(rt: Runtime) -> None:
    """Stop an engine that was never closed: staged work is handed over, then the threads end when idle."""
    rt.under_lock(_close_and_publish, rt)
    for device in rt.devices.values():
        device.stop()


def _close_and_publish(rt: Runtime) -> None:
    rt.closed = True
    rt.core.publish()


def _warn_unclosed(what: str, stacklevel: int, source: Any = None) -> None:
    """The one ResourceWarning of an engine left open (its loop ended or closed, or it was collected)."""
    warnings.warn(
        f"{what}; its worker threads stop once the queued tasks ran. Close an engine with "
        "'async with ss.Engine() as eng' or 'await eng.aclose()'",
        ResourceWarning,
        stacklevel,
        source=source,
    )


async def _aclose_devices(rt: Runtime) -> None:
    """Close what remote executors started (a Dask client, a local cluster)."""
    for device in rt.devices.values():
        aclose = getattr(device, "aclose", None)
        if aclose is not None:
            await aclose()


def _shape_arg(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        return (operator.index(shape),)
    return tuple(operator.index(d) for d in shape)


def _submit_while_tracing(fn: Any) -> TraceError:
    return TraceError(
        f"eng.submit({name_of(fn) or 'fn'}, ...) inside a compiled function: it would run once, "
        "while tracing, and never on replay; submit outside the compiled function"
    )


def _pending_write(tensor: Any) -> Task | None:
    """The last queued write to a Tensor's memory, unless it finished (a failed one counts)."""
    last = tensor.owner._last_write if type(tensor) is Tensor else None
    return last if last is not None and last.state != "done" and last is not tensor else None


def _with_pending_writes(deps: tuple[Task, ...], tensors: Sequence[Any]) -> tuple[Task, ...]:
    """``deps`` plus the pending last write of each of ``tensors``."""
    extra = [w for t in tensors if (w := _pending_write(t)) is not None]
    return (*deps, *extra)


def _merge(buffers: list[Buffer]) -> list[Buffer]:
    """One entry per buffer, a write if any use writes (a read and a write of one buffer is a write)."""
    merged: dict[int, Buffer] = {}
    for buffer in buffers:
        seen = merged.get(buffer[0])
        if seen is None or (buffer[2] and not seen[2]):
            merged[buffer[0]] = buffer
    return list(merged.values())


def _tensors_in(obj: Any) -> list[Tensor]:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, list | tuple):
        return [t for item in obj for t in _tensors_in(item)]
    return []


def _checked(value: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    """The value of a Future made a Tensor: it must have the shape and dtype declared for it."""
    array = np.asarray(value)
    if array.shape != shape or array.dtype != dtype:
        raise TypeError(
            f"eng.asarray(future, shape={shape}, dtype={dtype}): the future's value has "
            f"shape {array.shape} and dtype {array.dtype}"
        )
    return array


_CHECKED = Op("asarray", _checked, lambda metas, attrs: (attrs["shape"], attrs["dtype"], False))


def _stop_edges(rt: Runtime) -> None:
    """A trace reached its cap: the scheduler stops listing dependency edges (called without the lock)."""
    with rt.lock:
        rt.core.edges = None
