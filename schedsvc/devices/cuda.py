"""CUDA devices: tasks launched on CUDA streams, through the narrow API of ``_cudaapi``.

One ``CudaDevice`` per device (``cuda:N``), bound to CuPy or, with
``Config(cuda_simulator=True)``, to the CUDA simulator.  Per device:

- **launched where they are made ready**, as CuPy and PyTorch launch on the
  caller's thread: the runtime's ``dispatch`` of a ready task runs on the
  thread that made it ready (the event loop for a submission or a Tensor op, a
  worker for a CPU task's dependents, a watcher for what a completion freed),
  and that thread launches it once the runtime's lock is released, with the
  device current (the caller's current device is given back afterwards).  For
  each task it picks a stream (a same-device parent's, so FIFO orders them for
  free; else the compute stream with the least work in flight), makes it wait
  on the events of parents launched on other streams (``wait_event``: the host
  never waits), enqueues the task's kernels with that stream current (the
  caller's current stream is given back), records an event after them, and
  reports ``rt.launched``, which hands back what to launch next: the first
  dependent that launch made ready, else the next ready task.  One thread
  launches at a time on a device; the others only queue.
- **one thread of its own** for launches that may block: a kind of launch (the
  function, its arguments' dtypes and ranks) not launched before here -- CuPy
  compiles a kernel at its first use --, one whose last launch took
  ``Config.cuda_launch_inline_us`` or more (1 ms by default) or waited for the
  device, and the wait for memory and retry of an allocation that failed.  The
  launch goes there with the turn to launch, and that thread launches what is
  ready after it.  So the event loop is held by a launch for about that bound
  at most, except when a launch of a kind that was quick blocks this time.
- ``streams_per_device`` **compute streams**, an **H2D** and a **D2H** copy
  stream, each with **one watcher thread** (``_streams``) that sleeps in
  ``Event(block=True).synchronize()`` on the newest event of its stream (or the
  oldest one somebody waits for), then reports every task of the stream up to
  the last event that passed in one call (``rt.complete_all``: the runtime
  wakes the event loop once per burst, only for futures somebody awaits).  The
  watcher also lets go of what the tasks touched -- their arguments, results
  and staging buffers -- only once their events passed, so the pool never
  hands a block to new work while a stream still uses it (cupy#8068).

Transfers: a host array handed to a cuda task is copied to the device on the
H2D stream through pinned staging; ``prepare`` makes that copy a task of its
own, shared by the tasks in flight that read the same buffer version.  A
device value taken by a CPU task is copied back on the D2H stream (``to_host``).
An allocation that fails waits for the device's work in flight to complete,
retries once, then fails the task with ``MemoryLimitError``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from math import inf
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import DeviceError, InvalidTask, MemoryLimitError
from .._logging import DEVICES_CUDA, Throttled
from .._runtime import (
    SCALAR_TYPES,
    Copies,
    CopyTask,
    Device,
    Runtime,
    Task,
    replace_leaves,
    substitute,
    tasks_and_scalars,
)
from ._cudaapi import CudaApi, api_for, check
from ._fusion import launch_batch
from ._streams import Flight, Track
from ._transfer import to_device
from ._turn import Next, Turn

if TYPE_CHECKING:
    from .._config import Config

__all__ = ["CudaDevice", "api_for", "check"]

_ndarray = np.ndarray


_OOM_WAIT_S = 30.0  # the longest an allocation that failed waits for the device's work in flight
_log = logging.getLogger(DEVICES_CUDA)


class _NotLaunched(Exception):
    """Making a task's arguments raised ``error`` before anything was queued."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _LaunchFailed(Exception):
    """A launch raised ``error`` on ``track``; ``event`` passes after whatever it queued."""

    def __init__(self, error: BaseException, track: Track, event: Any, held: Any, t0: float) -> None:
        super().__init__(str(error))
        self.error = error
        self.track = track
        self.event = event
        self.held = held
        self.t0 = t0


class CudaDevice(Device):
    """The streams of one CUDA device: launched on by the thread that makes work ready, and by a thread of
    its own for what may block."""

    kind = "cuda"
    asynchronous = True
    own_memory = True
    prepares = True
    staged = False  # launched by the submitting thread: never held for a flush

    def __init__(self, rt: Runtime, name: str, api: CudaApi, streams: int, inline_s: float = 0.001) -> None:
        super().__init__(rt, name)
        self.api = api
        self.index = int(name.partition(":")[2])
        self.buffer_types = {api.ndarray: api.buffer_key}
        self.concurrency = streams
        self.eager = 0  # (its tasks are never staged: none counts against a burst's hand-over)
        self.stopping = False
        self.events: list[Any] = []  # recycled events, their last record passed
        self.flying: dict[Task, Flight] = {}  # launched, not complete (read by the launching thread)
        self.completions = threading.Condition(threading.Lock())  # an OOM retry waits on it
        self.oom_waiting = 0  # launches waiting on it (under its lock): only then is it notified
        self.oom_retries, self.oom_failures = Throttled(_log), Throttled(_log)  # (warnings)
        self.translate = _translation(api.xp)
        # (streams are made on their device without making it current: the opening thread -- the
        # user's event loop -- keeps its own current device)
        self.compute = [Track(self, api.stream(self.index), f"{name}/s{i}") for i in range(streams)]
        self.h2d = Track(self, api.stream(self.index), f"{name}/h2d")
        self.d2h = Track(self, api.stream(self.index), f"{name}/d2h")
        self.tracks = [*self.compute, self.h2d, self.d2h]
        self.next_stream = 0
        #: who launches: the thread that made tasks ready, or the device's own thread (``_turn``)
        self.turn = Turn(self, inline_s)
        self._launch_here = self.turn.launch_here  # (bound once: dispatch returns it at every ready task)

    # -- the plugin interface -------------------------------------------------------

    @classmethod
    def check_device(cls, name: str, config: Config | None = None) -> None:
        """CuPy installed and device N of ``cuda:N`` present (any N on the simulator)."""
        check(int(name.partition(":")[2]), bool(config is not None and config.cuda_simulator))

    @classmethod
    def check_config(cls, config: Config) -> None:
        if config.sync_mode:
            raise DeviceError(
                "sync_mode runs every task in the caller, but cuda tasks run on CUDA streams: "
                "use sync_mode with CPU devices only, or the CUDA simulator's strict checks to debug "
                "GPU pipelines"
            )

    @classmethod
    async def open(cls, rt: Runtime, name: str, config: Config) -> CudaDevice:
        api = api_for(config.cuda_simulator)
        device = cls(rt, name, api, config.streams_per_device, config.cuda_launch_inline_us / 1e6)
        if config.max_device_bytes is not None:
            api.set_pool_limit(device.index, config.max_device_bytes)
        return device

    def start(self) -> None:
        for track in self.tracks:
            track.thread.start()
        self.turn.thread.start()

    def dispatch(self, ready: int) -> Callable[[], None] | None:
        """With the lock held: tasks are ready and no thread launches on this device: this one will, starting
        with the first of them, taken now."""
        self.hungry = False
        self.turn.first = self.rt.take_ready(self)
        return self._launch_here

    def stop(self) -> None:
        self.stopping = True
        self.turn.wake.release()
        for track in self.tracks:
            track.stop()

    def join(self, timeout: float | None) -> list[threading.Thread]:
        threads = [self.turn.thread, *(t.thread for t in self.tracks)]
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            if thread.is_alive():
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(left)
        alive = [t for t in threads if t.is_alive()]
        if alive:
            return alive
        # nothing launches or watches any more: the streams go too (the simulator's threads with them)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self.api.close_streams([track.stream for track in self.tracks], left)

    def busy_seconds(self) -> dict[str, float]:
        return {track.name: track.busy for track in self.tracks}

    def used_bytes(self) -> int:
        """Bytes of this device's memory pool held by live arrays (host bookkeeping: no sync)."""
        return self.api.pool_used(self.index)

    def launches(self) -> dict[str, int]:
        return {track.name: track.launches for track in self.tracks}

    def sweeps(self) -> dict[str, int]:
        return {track.name: track.sweeps for track in self.tracks}

    # -- launching -----------------------------------------------------------------

    def launch_one(self, task: Task, ahead: list[Task] | None, kind: Any, here: bool) -> Next | None:
        """Launch ``task`` (behind ``ahead``, its launched parents, if known); what to launch next (None: the
        device is hungry again, or the device's thread took over).  ``here``: on the thread that made it ready,
        which must not wait: if the device is out of memory, the wait for the work in flight to complete
        (freeing what it held) and the retry go to the device's thread.  There, the retry is made once, on the
        same stream -- unless the task writes memory in place (its first try may have): then it fails.  A
        launch that fails may have queued work already: its failure is reported once an event after that
        work passed."""
        if task.fusion is not None:  # a batched call: launched with the other ready calls of its batch
            return launch_batch(self, task, ahead, kind)
        syncs = -1 if here else self.api.host_syncs()
        try:
            return self._launch(task, None, ahead, kind, syncs)
        except _LaunchFailed as failed:
            first = failed
        except BaseException as exc:  # before anything was queued (finding its parents, its stream)
            self._failed(task, exc)
            if here and not isinstance(exc, Exception):  # an interrupt of this thread: it is raised here
                raise
            return self.rt.launch_first(self)
        if here and not isinstance(first.error, Exception):
            self._fail_after(task, first, first.error, None)
            raise first.error
        oom = isinstance(first.error, self.api.OutOfMemoryError)
        if not oom or any(b[2] for b in task.buffers):  # a retry could apply in-place writes twice
            error = self._memory_error(task, first.error, retried=False) if oom else first.error
            return self._fail_after(task, first, error, self)
        if here:
            self.turn.hand_over(functools.partial(self._retry, task, first))
            return None
        return self._retry(task, first)

    def _retry(self, task: Task, first: _LaunchFailed) -> Next | None:
        """On the device's thread: ``task`` ran out of device memory; wait for the work in flight on the
        device to complete, then launch it again, once."""
        self.oom_retries.warning(
            "%s ran out of device memory launching %s (%s): it waits for the work in flight on it to "
            "complete, then retries once",
            self.name,
            task.label,
            first.error,
        )
        first.track.push(Flight(None, first.track, first.event, None, first.held, first.t0))
        with self.completions:
            self.oom_waiting += 1
            try:
                self.completions.wait_for(lambda: not self.flying, _OOM_WAIT_S)
            finally:
                self.oom_waiting -= 1
        try:
            return self._launch(task, first.track)
        except BaseException as exc:
            if not isinstance(exc, _LaunchFailed):
                self._failed(task, exc)
                return self.rt.launch_first(self)
            error = exc.error
            if isinstance(error, self.api.OutOfMemoryError):
                error = self._memory_error(task, error, retried=True)
            return self._fail_after(task, exc, error, self)

    def _fail_after(
        self, task: Task, failed: _LaunchFailed, error: BaseException, device: CudaDevice | None
    ) -> Next | None:
        """``task`` failed while launching: it fails once what it may have queued has run.  What to launch
        next (as ``rt.launched`` hands it on, given ``device``)."""
        if error.__traceback__ is not None:
            error.__traceback__ = error.__traceback__.tb_next
        flight = Flight(task, failed.track, failed.event, None, failed.held, failed.t0)
        flight.error = error
        self.flying[task] = flight
        nxt = self.rt.launched(task, None, device)
        failed.track.push(flight)
        return nxt

    def _failed(self, task: Task, exc: BaseException) -> None:
        if exc.__traceback__ is not None:
            exc.__traceback__ = exc.__traceback__.tb_next
        self.rt.finish(task, None, exc)

    def _memory_error(self, task: Task, exc: BaseException, retried: bool) -> MemoryLimitError:
        used = self.api.pool_used(self.index)
        when = (
            "even after the work in flight on it completed"
            if retried
            else "(not retried: it writes memory in place, and its first try may have)"
        )
        error = MemoryLimitError(
            f"{task.label} on {self.name} could not allocate device memory {when}: {exc} ({used:,} "
            "bytes in use by live arrays). Lower max_pending or the batch size, free device arrays "
            "you keep, or raise max_device_bytes"
        )
        error.__cause__ = exc
        self.oom_failures.warning("%s", error)
        return error

    def pick(self, task: Task, parents: list[Flight]) -> Track:
        """The stream ``task`` is launched on: its H2D copy's, a parent's (FIFO orders it behind), or the
        compute stream with the least in flight."""
        fn = task.fn
        if fn is to_device:
            return self.h2d
        for flight in parents:  # a parent's compute stream: FIFO orders the task behind it
            if flight.track is not self.h2d and flight.track is not self.d2h:
                return flight.track
        best = self.compute[self.next_stream]
        self.next_stream = (self.next_stream + 1) % len(self.compute)
        for track in self.compute:
            if len(track.flights) < len(best.flights):
                best = track
        return best

    def _launch(
        self,
        task: Task,
        track: Track | None,
        ahead: list[Task] | None = None,
        kind: Any = None,
        syncs: int = -1,
    ) -> Next | None:
        """Enqueue ``task`` (on ``track``, or the stream ``_pick`` chooses; behind ``ahead``, or what
        the runtime says it launches behind) and report it launched; what to launch next (``rt.launched``).
        Its ``kind``'s launch time is learned; ``syncs``, if not -1, is this thread's count of host syncs
        before it: a launch that made one is never made where work is made ready."""
        api = self.api
        t0 = time.perf_counter()
        flying = self.flying
        if ahead is None:
            ahead = self.rt.ahead(task)
        parents = [f for d in ahead if (f := flying.get(d)) is not None]
        if track is None:
            track = self.pick(task, parents)
        stream = track.stream
        for flight in parents:
            if flight.track is not track:
                stream.wait_event(flight.event)
        args: list[Any] = []
        kwargs = substitute(task.kwargs) if task.kwargs else {}
        staged: list[Any] = []
        fn = task.fn
        try:
            self._arguments(task.args, stream, staged, args)
            if kwargs:
                kwargs = replace_leaves(kwargs, functools.partial(self._onto_device, stream, staged))
            with stream:
                if fn is to_device:
                    value = args[0]  # (copied in by _onto_device)
                else:
                    try:  # noqa: SIM105 - hot path: a try costs nothing, a suppress() an object
                        fn = self.translate.get(fn, fn)
                    except TypeError:  # an unhashable callable is not NumPy's
                        pass
                    value = fn(*args, **kwargs)
                try:
                    event = self.events.pop()
                except IndexError:  # (none to recycle)
                    event = api.event()
                event.record(stream)
        except _NotLaunched as exc:
            raise exc.error from None
        except BaseException as exc:  # what it queued may still run: keep what that reads alive
            keep = api.event()
            keep.record(stream)
            raise _LaunchFailed(exc, track, keep, (args, kwargs, staged), t0) from exc
        flight = Flight(task, track, event, value, (args, kwargs, staged), t0)
        flying[task] = flight
        if kind is not None:
            took = time.perf_counter() - t0
            if syncs != -1 and api.host_syncs() != syncs:
                took = inf  # it waited for the device: always on the device's thread
            self.turn.learn(kind, took)
        nxt = self.rt.launched(task, value, self)
        track.push(flight)  # (after: its watcher may report it complete at once)
        return nxt

    def _arguments(self, given: tuple[Any, ...], stream: Any, staged: list[Any], args: list[Any]) -> None:
        """The positional arguments ``given`` as the kernels take them, appended to ``args``: Tasks'
        values, and every array on this device (``_onto_device``); in one pass (hot path)."""
        api = self.api
        onto = None
        for arg in given:
            kind = type(arg)
            if kind in SCALAR_TYPES:
                args.append(arg)
                continue
            if isinstance(arg, Task):
                arg = arg.value
            elif kind is not _ndarray:
                try:
                    arg = substitute(arg)
                except (
                    BaseException
                ) as exc:  # before anything was queued: the task fails, as at finding its parents
                    raise _NotLaunched(exc) from exc
            if isinstance(arg, api.ndarray) and api.device_of(arg) == self.index:  # already here
                args.append(arg)
                continue
            if onto is None:
                onto = functools.partial(self._onto_device, stream, staged)
            args.append(replace_leaves(arg, onto))

    def _onto_device(self, stream: Any, staged: list[Any], obj: Any) -> Any:
        """``obj`` (an argument) on this device: a host array copied in on the H2D stream (through
        pinned staging, kept in ``staged``), another device's array copied here; ``stream`` waits
        for the copies."""
        api = self.api
        if type(obj) is _ndarray:
            pinned = api.empty_pinned(obj.shape, obj.dtype)
            pinned[...] = obj
            h2d = self.h2d.stream
            with h2d:
                dst = api.empty(obj.shape, obj.dtype)
                api.h2d(dst, pinned, h2d)
                if h2d is not stream:
                    event = api.event()
                    event.record(h2d)
                    stream.wait_event(event)
                    staged.append(event)
            staged.append(pinned)
            return dst
        if isinstance(obj, api.ndarray) and api.device_of(obj) != self.index:
            with stream:
                return api.copy(obj)
        return obj

    # -- completing ----------------------------------------------------------------

    def completed(self, track: Track, done: list[Flight], error: BaseException | None) -> None:
        """On ``track``'s watcher: ``done`` passed their events (or the device failed with ``error``)."""
        now = time.perf_counter()
        rt = self.rt
        timeline = rt.timeline
        outcomes: list[tuple[Task, Any, BaseException | None]] = []
        for flight in done:
            start = max(flight.t0, track.last_end)
            track.busy += now - start
            track.last_end = now
            task = flight.task
            if timeline is not None and task is not None:
                timeline.span(task, start, now, error or flight.error)
            if task is None:  # a failed launch's staging, kept until its copies passed
                continue
            self.flying.pop(task, None)
            if error is None and flight.error is None:
                if not flight.shared:
                    self.events.append(flight.event)
                outcomes.append((task, flight.value, None))
            else:
                outcomes.append((task, None, error or flight.error))
        for flight in done:  # let go of what they touched (their events passed), before the memory is metered
            flight.held = flight.value = flight.task = None
        rt.complete_all(outcomes)  # one hold of the runtime's lock for the sweep
        del outcomes
        if self.oom_waiting:  # (read without the lock: it is raised before the flights it waits on drop)
            with self.completions:
                self.completions.notify_all()

    # -- transfers -----------------------------------------------------------------

    def to_host(self, value: Any) -> Any:
        """On a CPU thread: ``value`` (a completed device array, or a structure of them) as NumPy,
        copied on the D2H stream into pinned memory."""
        return replace_leaves(value, self._array_to_host)

    def _array_to_host(self, value: Any) -> Any:
        api = self.api
        if not isinstance(value, api.ndarray):
            return value
        array: Any = value
        api.use_device(self.index)
        pinned = api.empty_pinned(array.shape, array.dtype)
        track = self.d2h
        stream = track.stream
        t0 = time.perf_counter()
        with stream:
            api.d2h(array, pinned, stream)
            event = api.event()
            event.record(stream)
        event.synchronize()  # (a CPU thread: it may wait; launching threads never do)
        with track.lock:
            track.launches += 1
            track.busy += time.perf_counter() - t0
        return pinned

    def prepare(self, task: Task, submit: Callable[[Task], None], copies: Copies) -> None:
        """With the runtime's lock held, before ``task`` (of this device) is admitted: each host array
        among its arguments becomes an H2D copy task of its own (``submit``ted first), found again
        for the same buffer version while one is in flight."""
        if task.fn is to_device or (not task.kwargs and tasks_and_scalars(task.args)):
            return  # nothing to move in (hot path: an op on this device's results and scalars)
        if task.fusion is not None:  # a batched call: its batch copies the host rows of its calls in at once
            return
        moved: dict[int, Task] = {}  # host array's id -> its copy
        copy_in = functools.partial(self._copy_in, task, submit, copies, moved)
        args = replace_leaves(task.args, copy_in)
        kwargs = replace_leaves(task.kwargs, copy_in) if task.kwargs else task.kwargs
        if not moved:
            return
        task.args, task.kwargs = args, kwargs
        task.deps = (*task.deps, *moved.values())
        # the host memory is read by the copies now, not by the task: a later host write waits for them
        task.buffers = tuple(b for b in task.buffers if b[0] not in moved or b[2])

    def _copy_in(
        self, task: Task, submit: Callable[[Task], None], copies: Copies, moved: dict[int, Task], obj: Any
    ) -> Any:
        """``obj`` (an argument of ``task``) as launched here: a host array owning its memory becomes
        its H2D copy task; a device array of another device is refused."""
        if type(obj) is _ndarray:
            if obj.base is not None:
                return obj  # a view: copied at launch, with the task
            copy = copies.find(obj, self.name)
            if copy is None:
                copy = self.copy_task(obj, task)
                submit(copy)
                copies.add(obj, self.name, copy)
            moved[id(obj)] = copy
            return copy
        if isinstance(obj, self.api.ndarray):
            where = self.api.device_of(obj)
            if where != self.index:
                raise InvalidTask(
                    f"an argument lives on cuda:{where}, but the task runs on {self.name}: device "
                    f"arrays are not moved between devices implicitly; pass a Tensor moved with "
                    f"t.to({self.name!r}) or the result of a task on {self.name}"
                )
        return obj

    def host_copy(self, value: Any, task: Task) -> CopyTask:
        """A CPU task (on ``task``'s device) copying ``value`` -- a task of this device, or one of its
        arrays -- back to the host; it reads that memory, so it is ordered after writes to it."""
        if isinstance(value, Task):
            memory = value.memory
            buffers = () if memory is None else (memory,)
            deps: tuple[Task, ...] = (value,)
        else:
            key, nbytes = self.api.buffer_key(value)
            buffers, deps = ((key, nbytes, False),), ()
        copy = CopyTask(self.to_host, (value,), None, task.device, buffers, deps)
        copy.priority, copy.name, copy.nested = task.priority, "d2h", task.nested
        return copy

    def holds(self, obj: Any) -> bool:
        return isinstance(obj, self.api.ndarray) and self.api.device_of(obj) == self.index

    def copy_task(self, array: np.ndarray[Any, Any], task: Task) -> CopyTask:
        """A new H2D copy task of ``array`` for ``task``."""
        nbytes = array.nbytes
        copy = CopyTask(to_device, (array,), None, self.name, ((id(array), nbytes, False),), ())
        copy.priority, copy.out_bytes, copy.name, copy.nested = task.priority, nbytes, "h2d", task.nested
        return copy

    def check_task(self, fn: Any, kwargs: dict[str, Any], writes: Any) -> None:
        out = kwargs.get("out")
        if type(out) is _ndarray or any(type(w) is _ndarray for w in _flat(writes)):
            raise InvalidTask(
                f"a task on {self.name} writes device memory, not a NumPy array: pass a device array "
                "(or a Tensor on the device) as out=, and copy results back with Tensor.to('cpu') "
                "or by awaiting a CPU task that takes them"
            )

    vets_tasks = True


def _flat(obj: Any) -> list[Any]:
    if isinstance(obj, list | tuple):
        return [x for item in obj for x in _flat(item)]
    return [obj]


@functools.cache
def _translation(xp: Any) -> dict[Any, Any]:
    """NumPy's functions and ufuncs -> the array module's of the same name (``np.zeros`` ->
    ``cupy.zeros``): a Tensor op or a NumPy callable submitted to a cuda device runs on it."""
    table: dict[Any, Any] = {}
    for name in dir(np):
        if name.startswith("_"):
            continue
        ours = getattr(np, name, None)
        theirs = getattr(xp, name, None)
        if ours is None or theirs is None or not callable(ours) or isinstance(ours, type):
            continue
        with contextlib.suppress(TypeError):
            table[ours] = theirs
    return table
