"""``Engine``: the async frontend (asyncio, or trio through anyio) that turns calls into scheduled tasks.

The Engine has the task record of each submission built (a Future, by
``_submission.build_task``, which checks it) and hands it to the runtime,
the one door to the scheduling core.  Tensors,
compiled functions and ``map`` pipelines reach the engine through its
``Port`` (``_port.py``); the Tensor's memory tracking lives in
``tensor/_tracking.py``, compile's state in ``compile/``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import sys
import warnings
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable, Sequence
from threading import get_ident
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack, overload

import anyio
import numpy as np

from ._asyncdef import async_generator_function, refused_while_tracing
from ._errors import EngineClosed, InvalidTask, QueueFull
from ._future import Future
from ._lifecycle import STARTED, finish, watch_loop_end
from ._logging import ENGINE, settings, tally
from ._options import given, refuse_taken
from ._port import LOOP_CLOSED, Port
from ._runtime import NOW, QUEUE, is_cancellation
from ._submission import NO_WRITES, PLAIN, build_task
from ._telemetry import Stats, percentiles
from ._timeline import Recording, Timeline
from ._typing import as_run, as_submit, as_submit_nowait
from ._validate import check_fn, check_map_order, refuse_submit_while_tracing
from .tensor import Tensor, TensorMemory, asarray, create, shape_arg

if TYPE_CHECKING:
    from ._config import Config
    from ._executor import EngineExecutor
    from ._typing import BatchOptions, CompileOptions
    from .compile import Batched, Compiled
    from .tensor import Array

__all__ = ["Engine", "check_fn"]

T = TypeVar("T")
P = ParamSpec("P")
Tensors = TypeVar("Tensors", bound=tuple[Tensor, ...])

_JOIN_TIMEOUT_S = 30.0
_INTERRUPT_GRACE_S = 0.5  # after Ctrl-C, how long a close waits for running tasks before saying so
_log = logging.getLogger(ENGINE)


class Engine:
    """Runs submitted callables on worker threads, in dependency order, within limits.

    Use ``async with Engine(...) as eng`` (or ``await eng.start()`` and
    ``await eng.aclose()``).  ``Engine(config, **overrides)``: keywords override
    fields of ``config`` (or of ``Config()`` read from the environment).
    """

    def __init__(self, config: Config | None = None, **overrides: Any) -> None:
        if config is None:
            from ._config import Config  # pydantic is imported by the first engine, not by `import schedsvc`

            config = Config(**overrides)
        elif overrides:
            config = config.replace(**overrides)
        self.config = config
        self._port = Port(config, TensorMemory())
        self._closing: anyio.Event | None = None  # set once the first aclose has finished
        self._waits_cache: tuple[int, float, float] = (-1, 0.0, 0.0)  # (samples seen, p50, p99)

    @property
    def _rt(self) -> Any:
        """The runtime once started (for tests and tools that look inside; the frontend uses the Port)."""
        return self._port._rt

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> Engine:
        """Start the workers on the running event loop; an engine starts once (``RuntimeError`` while it runs,
        ``EngineClosed`` once it has closed)."""
        port = self._port
        if port.state == "running":  # a mistake, not a closed engine
            raise RuntimeError(f"{self!r} is running already: start() it once ('async with eng:' starts it)")
        if port.state != "new":
            raise EngineClosed(f"{self!r} was started and closed; an engine starts once: create a new Engine")
        await port.start(None if self.config.trace_path is None else Timeline(self.config.trace_path))
        STARTED.add(port)  # for a fork: the child's copy refuses work
        port.loop_watch = watch_loop_end(port)
        if _log.isEnabledFor(logging.INFO):
            _log.info("engine started: %s", settings(self.config))
        return self

    async def aclose(self, *, cancel_pending: bool = False) -> None:
        """Finish (or with ``cancel_pending``, cancel) pending work, then stop every thread.

        Tasks that are running may still submit nested work; it is waited for
        too.  A second ``aclose`` waits for the first.  If the close itself is
        cancelled, unstarted work is cancelled and the threads are told to stop.
        """
        port = self._port
        if self._closing is not None:
            await self._closing.wait()
            if port.started:  # a close that was cancelled left threads finishing up
                await port.join(_JOIN_TIMEOUT_S)
            return
        if port.loop_closed() and port.state == "running":  # closed late, elsewhere
            port.abandon(LOOP_CLOSED, warn=False)  # being closed now: nothing to warn about
        if not port.open:
            port.state = "closed"
            if port.started and port.abandoned == LOOP_CLOSED:  # its threads were told to stop
                await port.join(_JOIN_TIMEOUT_S)
            return
        port.state = "closing"
        self._closing = anyio.Event()
        try:
            try:
                stuck = await port.shutdown(cancel_pending, _JOIN_TIMEOUT_S)
            finally:  # (a cancelled close writes the tasks finished so far: a later aclose adds none)
                self._write_life_trace()
            if stuck:
                warnings.warn(f"schedsvc: threads still running after close: {stuck}", RuntimeWarning, 2)
            if _log.isEnabledFor(logging.INFO):
                _log.info("engine closed: %s", tally(self.stats()))
        finally:
            port.state = "closed"
            self._closing.set()
            finish(port.loop_watch)

    def _write_life_trace(self) -> None:
        """Write ``Config(trace_path=...)``'s trace of the engine's whole life (once)."""
        if self.config.trace_path is not None and self._port.tracing_life():
            self._port.detach().write()

    async def __aenter__(self) -> Engine:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        interrupted = exc is not None and (isinstance(exc, KeyboardInterrupt) or is_cancellation(exc))
        notice = None
        if interrupted and self._port.started:
            notice = self._port.spawn(
                functools.partial(_say_what_close_waits_for, self._port), "schedsvc notice"
            )
        try:
            # a cancel scope's cancellation (trio's, anyio's) holds inside the scope: the close after it
            # is shielded from it, as asyncio's own task.cancel() (delivered once) lets it run; a second
            # Ctrl-C, or a second task.cancel(), still stops it
            scoped = exc is not None and anyio.current_effective_deadline() == -math.inf
            with anyio.CancelScope(shield=True) if scoped else contextlib.nullcontext():
                await self.aclose(cancel_pending=exc_type is not None)
        finally:
            if notice is not None:
                notice.cancel()

    @property
    def closed(self) -> bool:
        return self._port.state in ("closing", "closed")

    # -- submitting ------------------------------------------------------------

    # as_submit: type checkers check a call against fn's parameters (_typing.Submit's overloads)
    @as_submit
    @refused_while_tracing(refuse_submit_while_tracing)  # at the call: a coroutine not awaited never checks
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
        """Admit ``fn(*args, **kwargs)`` as a task, waiting while the engine is at its limits.

        Options: ``device``, ``priority``, ``name``, ``reads``, ``writes``,
        ``nbytes``; other keywords are passed to ``fn``.  ``await`` it.  A call
        giving an option that ``fn`` itself declares as a parameter is refused
        (``ss.InvalidTask``): bind the keyword for ``fn`` with
        ``functools.partial(fn, name=...)`` instead.
        """
        port = self._port
        # an option given: does fn declare it too?  (as few tests as can tell: this runs at every submission)
        if (
            name is not None
            or device is not None
            or nbytes is not None
            or priority
            or reads is not NO_WRITES
            or writes is not NO_WRITES
        ):
            refuse_taken(fn, "eng.submit", given(device, priority, name, reads, writes, nbytes))
            options = (device, priority, name, reads, writes, nbytes)
        else:
            options = PLAIN
        tid = get_ident()
        task: Future[T]
        task, written = build_task(port, fn, args, kwargs, tid, options)
        token = port.admit(task, tid, QUEUE, written)
        if token is not True:  # queued: wait for room (cancelled meanwhile: the task is cancelled)
            await port.admission(task, token)
        return task

    @as_submit_nowait
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
        while the engine closes), so nested work can never deadlock it.  Options
        and keywords as ``submit``: an option ``fn`` declares too is refused.
        """
        tid = get_ident()
        port = self._port
        # an option given: does fn declare it too?  (as few tests as can tell: this runs at every submission)
        if (
            name is not None
            or device is not None
            or nbytes is not None
            or priority
            or reads is not NO_WRITES
            or writes is not NO_WRITES
        ):
            refuse_taken(fn, "eng.submit_nowait", given(device, priority, name, reads, writes, nbytes))
            options = (device, priority, name, reads, writes, nbytes)
        else:
            options = PLAIN
        task: Future[T]
        task, written = build_task(port, fn, args, kwargs, tid, options)
        if not port.admit(task, tid, NOW, written):
            raise QueueFull(port.full_message(task))
        return task

    def executor(self, *, device: str | None = None, priority: int = 0) -> EngineExecutor:
        """A ``concurrent.futures.Executor`` over this engine, for other threads and for libraries.

        Its ``submit(fn, *args, **kwargs)`` returns a ``concurrent.futures.Future``
        (which ``eng.submit`` also takes as a dependency); every keyword goes to
        ``fn``, and its tasks run on ``device`` with ``priority``.  From a thread
        at the engine's limits, ``submit`` blocks until there is room (in line
        with ``await eng.submit``); in a task, it is admitted over them; on the
        event loop's thread it raises QueueFull rather than block the loop.
        ``shutdown()`` waits for (or cancels) its futures; the engine stays open.
        """
        from ._executor import EngineExecutor

        return EngineExecutor(self, device, priority)

    @as_run
    async def run(self, fn: Callable[..., T], /, *args: Any, **options: Any) -> T:
        """Submit a task and return its result (options and keywords as ``submit``: an option ``fn`` declares
        too is refused; ``functools.partial`` gives it to ``fn``)."""
        if options:
            refuse_taken(fn, "eng.run", options)
        fut: Future[T] = await self.submit(fn, *args, **options)
        return await fut

    async def waitall(self) -> None:
        """Wait until every task submitted so far is final (at once on a closed engine)."""
        await self._port.barrier()

    async def throttle(self) -> None:
        """Wait until the engine is under its limits (room for one more task), first come first served.

        Waiters are let through one per free slot, in the same queue as
        ``await submit`` calls.  A caller that had to wait holds its slot until
        it next yields to the event loop: its next submission takes it, and
        nobody queued behind it does.  With ``max_device_bytes``, it also waits
        while a device with work in flight is at its budget, which counts the
        device results still referenced: a producer of device Tensors that
        throttles stays within the budget as its consumer drops what it read.
        """
        self._port.running()
        await self._port.throttle()

    @async_generator_function  # what it returns; it checks its arguments at the call
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
        ``submit``.  At most ``max_inflight`` items (default: the device's
        executor's window, twice what it runs at once -- its worker threads,
        or on Dask the cluster's worker threads when the engine started) are
        submitted and not yet yielded: the source is pulled ahead,
        concurrently, up to that window.  Results come in source order
        (``ordered=True``) or as they finish; an item's error, and the
        source's, is raised at its place in that order.  When the generator
        ends early (an error, ``aclose()``, a cancelled consumer), unstarted
        tasks are cancelled and a generator source is closed.  ``options``
        (``priority``, ``name``, ``nbytes``, ...) go to ``submit``; one that
        ``fn`` declares too (``device`` as well) is refused at the call, as
        there: ``functools.partial`` gives it to ``fn``.  Iterate it
        on the engine's event loop (another loop gets SchedsvcError); other
        threads use ``eng.executor().map``.
        """
        from ._pipeline import pipeline

        check_map_order(fn, source)
        check_fn(fn)  # now, not at the first item: an async generator starts only when iterated
        if options or device is not None:
            refuse_taken(fn, "eng.map", {"device": device, **options} if device is not None else options)
        return pipeline(self, self._port, fn, source, max_inflight, ordered, device, options)

    def trace(self, path: str | os.PathLike[str], *, max_spans: int = 2_000_000) -> Recording:
        """Record what runs inside the block; write it to ``path`` as Chrome trace JSON at the end.

        Open the file in https://ui.perfetto.dev or ``chrome://tracing``: a
        track per worker thread (per Dask worker on ``backend="dask"``) with a
        span per task (name, argument shapes, error), flow arrows along
        dependency edges, and counter tracks of pending tasks and bytes.  Tasks that finish inside the block are
        recorded: await the work (``await eng.waitall()``) before leaving it.
        Spans past ``max_spans`` are counted, not kept (about 100 bytes each).
        The block is ``with`` or ``async with``, alike.
        A path whose directory is missing or not writable raises
        ``FileNotFoundError`` or ``PermissionError`` here, before recording
        (a directory: ``IsADirectoryError``; an empty path or ``max_spans < 1``: ``ValueError``).
        """
        return Recording(self._port, path, max_spans)

    def stats(self) -> Stats:
        """A snapshot of the counters."""
        port = self._port
        if not port.started:
            raise EngineClosed(f"{self!r} has not started; use 'async with Engine(...)'")
        counts = port.counts()
        ended = counts[1] + counts[2]  # at least the queue-wait samples taken so far
        seen, p50, p99 = self._waits_cache
        # the percentiles are sorted out of the window again once an eighth of it is new: a
        # per-request stats() then costs microseconds, not a sort of 8,192 samples
        if ended - seen >= max(1, len(port.queue_waits) >> 3):
            p50, p99 = percentiles(list(port.queue_waits), (0.5, 0.99))
            self._waits_cache = (ended, p50, p99)
        waits, wait_sum, runs, run_sum = port.latency_histograms()
        return Stats(
            *counts[:9],
            copies=counts[9],
            max_pending=self.config.max_pending,
            max_pending_bytes=self.config.max_pending_bytes,
            queue_wait_p50_s=p50,
            queue_wait_p99_s=p99,
            worker_busy_s=MappingProxyType(port.busy_seconds()),
            stream_launches=MappingProxyType(port.launches()),
            stream_sweeps=MappingProxyType(port.sweeps()),
            compile_traces=self._port.compile_counts.traces,
            compile_replays=self._port.compile_counts.replays,
            batches=self._port.compile_counts.batches,
            batch_rows=self._port.compile_counts.batch_rows,
            batch_sizes=MappingProxyType(dict(sorted(self._port.compile_counts.batch_sizes.items()))),
            queue_wait_histogram=waits,
            queue_wait_sum_s=wait_sum,
            run_time_histogram=runs,
            run_time_sum_s=run_sum,
        )

    @property
    def pending(self) -> int:
        """Tasks admitted and not yet final (0 before start): a cheap load figure to read per request."""
        return self._port.pending

    def has_room(self, nbytes: int = 0, *, device: str | None = None) -> bool:
        """Would a submission holding ``nbytes`` new bytes be admitted now, without waiting?

        For load shedding: ask before reading a request.  Room means under
        ``max_pending`` and ``max_pending_bytes`` with nobody queued ahead, and
        room for ``nbytes`` in the byte budget (``max_device_bytes``) of
        ``device`` -- without ``device``, of every device that has one, so an
        engine whose GPU budget is full says False even for CPU work: name the
        device to ask about it alone.  A device with work in flight that is at
        its budget has no room (as ``throttle`` sees it).  False unless the
        engine is running.  Another submission may take the room before yours.
        """
        if type(nbytes) is not int or nbytes < 0:
            raise InvalidTask(f"has_room(nbytes=...) needs a non-negative int of bytes, got {nbytes!r}")
        if device is not None:
            self._port.device(device)  # one the engine does not have says so
        if not self._port.open:
            return False
        return self._port.has_room(nbytes, device)

    # -- tensors ---------------------------------------------------------------

    def asarray(self, obj: Any, dtype: Any = None, *, device: str | None = None, shape: Any = None) -> Tensor:
        """A Tensor of ``obj`` (an array, anything ``np.asarray`` takes, a Tensor, a Future, or a
        ``concurrent.futures.Future`` of ``eng.executor()``).

        An ndarray is used as it is, not copied (as ``np.asarray``): in-place
        Tensor operations write it, ordered with the tasks that use it.  A
        Future that is not done needs ``shape=`` and ``dtype=``: its value is
        checked against them when it arrives.  Without ``device``, a device
        array (or a Tensor, or a Future's value) stays on the device it lives
        on; with ``device``, it is copied there as ``t.to(device)`` copies.
        """
        return asarray(self._port, obj, dtype, device, shape)

    def zeros(self, shape: Any, dtype: Any = float, *, device: str | None = None) -> Tensor:
        """A Tensor of zeros, created by a task."""
        return create(self._port, "zeros", device, shape=shape_arg(shape), dtype=np.dtype(dtype))

    def ones(self, shape: Any, dtype: Any = float, *, device: str | None = None) -> Tensor:
        """A Tensor of ones, created by a task."""
        return create(self._port, "ones", device, shape=shape_arg(shape), dtype=np.dtype(dtype))

    def empty(self, shape: Any, dtype: Any = float, *, device: str | None = None) -> Tensor:
        """A Tensor with uninitialised contents, created by a task."""
        return create(self._port, "empty", device, shape=shape_arg(shape), dtype=np.dtype(dtype))

    def full(self, shape: Any, fill_value: Any, dtype: Any = None, *, device: str | None = None) -> Tensor:
        """A Tensor filled with ``fill_value`` (its dtype unless ``dtype`` is given)."""
        attrs = {"shape": shape_arg(shape), "fill_value": fill_value}
        attrs["dtype"] = np.dtype(dtype) if dtype is not None else np.asarray(fill_value).dtype
        return create(self._port, "full", device, **attrs)

    def arange(
        self, start: Any, stop: Any = None, step: Any = 1, dtype: Any = None, *, device: str | None = None
    ) -> Tensor:
        """``np.arange`` as a Tensor: ``arange(stop)`` or ``arange(start, stop, step)``."""
        if stop is None:
            start, stop = 0, start
        attrs = {"start": start, "stop": stop, "step": step}
        if dtype is not None:
            attrs["dtype"] = np.dtype(dtype)
        return create(self._port, "arange", device, **attrs)

    # what a call gives at run time: a Tensor for a Tensor (or NumPy array) returned, a tuple or list of
    # Tensors for a tuple or list; a batched call, a BatchCall of NumPy arrays the same way
    @overload
    def compile(
        self, fn: Callable[P, Tensor | Array], *, batch_axis: None = None, **options: Unpack[CompileOptions]
    ) -> Compiled[P, Tensor]: ...

    @overload
    def compile(
        self, fn: Callable[P, Tensors], *, batch_axis: None = None, **options: Unpack[CompileOptions]
    ) -> Compiled[P, Tensors]: ...

    @overload
    def compile(
        self,
        fn: Callable[P, tuple[Tensor | Array, ...]],
        *,
        batch_axis: None = None,
        **options: Unpack[CompileOptions],
    ) -> Compiled[P, tuple[Tensor, ...]]: ...

    @overload
    def compile(
        self, fn: Callable[P, list[Any]], *, batch_axis: None = None, **options: Unpack[CompileOptions]
    ) -> Compiled[P, list[Tensor]]: ...

    @overload
    def compile(
        self, fn: Callable[P, Tensor | Array], *, batch_axis: int, **options: Unpack[BatchOptions]
    ) -> Batched[P, Array]: ...

    @overload
    def compile(
        self, fn: Callable[P, tuple[Tensor | Array, ...]], *, batch_axis: int, **options: Unpack[BatchOptions]
    ) -> Batched[P, tuple[Array, ...]]: ...

    @overload
    def compile(
        self, fn: Callable[P, list[Any]], *, batch_axis: int, **options: Unpack[BatchOptions]
    ) -> Batched[P, list[Array]]: ...

    def compile(
        self,
        fn: Callable[..., Any],
        *,
        batch_axis: int | None = None,
        max_batch: int = 256,
        max_delay: float | None = None,
        batched: Sequence[int | str] | None = None,
        exact: bool = False,
        max_signatures: int = 64,
        name: str | None = None,
    ) -> Compiled[..., Any] | Batched[..., Any]:
        """Compile ``fn`` (array code on Tensors) the way ``hybridize`` does: trace once, replay fused.

        The first call with a signature (the shapes, dtypes and devices of the
        arguments, and the values of the other arguments) traces ``fn`` on
        symbolic tensors; later calls replay the optimised graph as one task.
        ``max_signatures`` signatures are kept, least recently used first out.

        With ``batch_axis``, calls are batched: each is a task of its own (a
        ``BatchCall``, an ``ss.Future`` of the caller's own rows), and the
        worker that takes one runs the other ready calls of it with it, up to
        ``max_batch`` rows, as one replay; a lone call runs at once, and a
        call of one row whose replay is faster than a hand-off to a worker
        runs inline, in the call (``stats()["inline_calls"]``).
        ``max_delay`` is deprecated and has no effect (a ``DeprecationWarning``
        says so): no call waits for others.  ``fn`` must keep rows apart (proved from its graph, else ``BatchError``);
        ``batched`` names the batched arguments (default: every array one).
        By default (``exact=False``) a batch runs one matrix product per layer
        for all its rows, so a caller's result may differ from its unbatched
        call's in the last bits (float32: about 1e-6 of the row's largest
        value; float64: about 1e-15); ``exact=True`` keeps each caller's result
        bit for bit the unbatched call's, at the cost of a product per caller.
        """
        from .compile import Compiled, check_exact

        self._port.local("eng.compile")
        check_exact(exact)  # (without batch_axis it has no effect, but a wrong one is still a mistake)
        if batch_axis is None:
            return Compiled(self._port, fn, max_signatures=max_signatures, name=name)
        from .compile import Batched

        return Batched(
            self._port,
            fn,
            batch_axis=batch_axis,
            max_batch=max_batch,
            max_delay=max_delay,
            batched=batched,
            exact=exact,
            max_signatures=max_signatures,
            name=name,
        )

    # -- internals -------------------------------------------------------------

    def __repr__(self) -> str:
        return self._port.describe()


async def _say_what_close_waits_for(port: Port) -> None:
    """After Ctrl-C, a close that waits for running tasks says so once, and how to stop waiting."""
    await anyio.sleep(_INTERRUPT_GRACE_S)  # tasks about to finish need no word
    if not port.started or port.state != "closing":
        return
    running = port.running_tasks()
    if running:
        tasks = "task" if running == 1 else "tasks"
        print(
            f"schedsvc: cancelled the queued tasks; waiting for {running} running {tasks} "
            "to finish (press Ctrl-C again to exit without waiting)",
            file=sys.stderr,
            flush=True,
        )
