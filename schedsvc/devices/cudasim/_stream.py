"""Streams, events and graphs: FIFOs run by their own threads, and the enqueue-time race detector.

Every operation goes through ``Stream.submit``: refused on the driver thread
(800) and on a failed device (719), recorded instead of run while the stream
captures, otherwise ordered by the race detector (vector clocks, see
``order``) and appended to the stream's queue, which its daemon thread runs
in order.  A stream's thread holds only its ``_Worker``, so it ends once the
stream is closed (``Stream.close``, as ``cudaStreamDestroy``) or garbage
collected, and its queue is empty.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import CUDARuntimeError, RaceError
from ._memory import Access, Block
from ._sim import DeviceState, caller_site, join, simulator

__all__ = ["Event", "Graph", "Op", "Stream", "current_stream", "order"]

_ids = itertools.count(1)
_WAIT_SLICE_S = 0.5


@dataclass(eq=False)
class Op:
    """One stream operation: what it runs, the blocks it reads and writes, where it was enqueued."""

    kind: str
    run: Callable[[], object]
    reads: tuple[Block, ...] = ()
    writes: tuple[Block, ...] = ()
    site: str = field(default_factory=caller_site)
    device: int = -1
    #: run on the host when the operation is really enqueued (not when captured): a copy's checksum
    #: or sentinel, taken again at each graph launch
    on_enqueue: Callable[[], object] | None = None


class _Worker:
    """A stream's queue and thread (the thread holds only this, never the stream)."""

    def __init__(self, name: str, state: DeviceState, rng: random.Random) -> None:
        self.state = state
        self.rng = rng
        self.cond = threading.Condition()
        self.queue: deque[Op] = deque()
        self.enqueued = 0
        self.completed = 0
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def push(self, op: Op) -> None:
        with self.cond:
            self.queue.append(op)
            self.enqueued += 1
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()

    def check_open(self) -> None:
        """Raise 400 (an invalid handle, as a destroyed stream's) once the stream was closed."""
        if self.stopping:
            raise CUDARuntimeError(400)

    def drop(self) -> None:
        """Forget the queued work (``Simulator.reset``)."""
        with self.cond:
            dropped = len(self.queue)
            self.queue.clear()
        sim = simulator()
        with sim.cv:
            self.completed += dropped
            sim.cv.notify_all()

    def _loop(self) -> None:
        sim = simulator()
        while True:
            with self.cond:
                while not self.queue and not self.stopping:
                    self.cond.wait()
                if not self.queue:
                    return
                op = self.queue.popleft()
            self._run(op)
            del op
            with sim.cv:
                self.completed += 1
                sim.cv.notify_all()

    def _run(self, op: Op) -> None:
        if self.state.failed:
            return
        delay = simulator().max_delay_s
        if delay:
            time.sleep(self.rng.uniform(0.0, delay))
        try:
            with np.errstate(all="ignore"):
                op.run()
        except BaseException as exc:
            simulator().fault(
                self.state.id, f"{op.kind} enqueued at {op.site} failed on device {self.state.id}: {exc!r}"
            )


@dataclass(eq=False)
class _Capture:
    """A capture in progress: the recorded nodes, the shared pool's blocks allocated during it (with
    how often each had been freed then), whether a sync invalidated it."""

    nodes: list[Callable[[Stream], None]] = field(default_factory=list)
    blocks: list[tuple[Block, int]] = field(default_factory=list)
    invalid: bool = False


class Stream:
    """A simulated non-blocking stream on one device, run by its own thread."""

    def __init__(
        self, null: bool = False, non_blocking: bool = False, ptr: int = 0, device: int | None = None
    ) -> None:
        sim = simulator()
        sim.check_thread()
        self.device_id = sim.local.device if device is None else device
        state = sim.device(self.device_id)
        self.id = next(_ids)
        self.null = null
        self.non_blocking = non_blocking
        self.ptr = 0 if null else 0x5000_0000 + self.id * 0x100
        self.name = f"{'null ' if null else ''}stream {self.id} (device {self.device_id})"
        self._clock: dict[int, int] = {}
        self._capture: _Capture | None = None
        self._worker = _Worker(f"cudasim-stream-{self.id}", state, random.Random())
        self._reseed()
        weakref.finalize(self, self._worker.stop)
        sim.streams.add(self)

    def __repr__(self) -> str:
        return f"<cudasim.Stream {self.id} device={self.device_id} pending={self.pending}>"

    @property
    def pending(self) -> int:
        """Operations enqueued and not yet run."""
        return self._worker.enqueued - self._worker.completed

    @property
    def done(self) -> bool:
        """Whether everything enqueued so far has run."""
        return self.pending == 0 and not self._worker.state.failed

    def close(self) -> threading.Thread:
        """Destroy the stream: enqueueing on it raises 400 from now on, and its thread ends once the
        work queued ran; that thread is returned (to join)."""
        self._worker.stop()
        return self._worker.thread

    def _reseed(self) -> None:
        seed = simulator().seed
        self._worker.rng.seed((0 if seed is None else seed) + self.id)

    def _reset(self) -> None:
        """``Simulator.reset``: forget the capture and the queued work; follow a re-made device."""
        self._capture = None
        devices = simulator().devices
        if self.device_id < len(devices):
            self._worker.state = devices[self.device_id]
        self._worker.drop()

    # -- current stream ----------------------------------------------------------------

    def __enter__(self) -> Stream:
        simulator().local.stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        stack = simulator().local.stack
        if stack and stack[-1] is self:
            stack.pop()

    def use(self) -> Stream:
        """Make this stream current on this thread (replacing the innermost ``with``)."""
        stack = simulator().local.stack
        if stack:
            stack[-1] = self
        else:
            stack.append(self)
        return self

    # -- work ------------------------------------------------------------------------------

    @property
    def capturing(self) -> bool:
        """Whether a capture is in progress on this stream."""
        return self._capture is not None

    def submit(self, op: Op) -> None:
        """Enqueue ``op`` (race-checked), or record it while capturing."""
        sim = simulator()
        sim.check_thread()
        self._worker.check_open()
        self._worker.state.check()
        if op.kind.startswith("kernel"):
            sim.take_launch_failure()
        if self._capture is not None:
            self._capture.nodes.append(lambda stream: stream.submit(_again(op)))
            return
        with sim.lock:
            order(self, op.reads, op.writes, op.site, op.kind)
            if op.on_enqueue is not None:
                op.on_enqueue()
            self._worker.push(op)

    def launch_host_func(self, fn: Callable[[Any], object], arg: Any) -> None:
        """Run ``fn(arg)`` on the driver thread when the stream gets there; the stream waits for it."""
        driver = simulator().driver
        self.submit(Op("host callback", lambda: driver.call(fn, arg)))

    def record(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) on this stream."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        """Order this stream's later work after ``event``'s current record."""
        sim = simulator()
        sim.check_thread()
        self._worker.check_open()
        self._worker.state.check()
        if self._capture is not None:
            self._capture.nodes.append(lambda stream: stream.wait_event(event))
            return
        last = event._last
        if last is None:
            return
        marker, clock = last
        with sim.lock:
            join(self._clock, clock)
            order(self, (), (), caller_site(), "wait")
            self._worker.push(Op("wait_event", lambda: marker.wait(self._worker.state.id)))

    def synchronize(self) -> None:
        """Wait until everything enqueued so far has run (a host sync)."""
        self.host_sync()

    def host_sync(self) -> None:
        """Block until the work enqueued so far ran, count the sync, and join what it saw."""
        sim = simulator()
        sim.count_sync()
        if self._capture is not None:
            self._capture.invalid = True
            raise CUDARuntimeError(900)
        self.wait_all()

    def wait_all(self) -> None:
        """Block until the work enqueued so far ran (not counted: the caller counts), and join it."""
        sim = simulator()
        state = self._worker.state
        state.check()
        with sim.lock:
            target = self._worker.enqueued
            clock = dict(self._clock)
        with sim.cv:
            sim.cv.wait_for(lambda: self._worker.completed >= target or state.failed)
        state.check()
        sim.observe(clock)

    # -- capture -----------------------------------------------------------------------------

    def begin_capture(self, mode: Any = None) -> None:
        """Record the work enqueued from now on instead of running it."""
        simulator().check_thread()
        self._worker.state.check()
        if self.null or self._capture is not None:
            raise CUDARuntimeError(900)
        self._capture = _Capture()

    def end_capture(self) -> Graph:
        """Stop capturing: the graph of the recorded work (901 if a sync invalidated the capture)."""
        simulator().check_thread()
        capture, self._capture = self._capture, None
        if capture is None:
            raise CUDARuntimeError(400)
        if capture.invalid:
            raise CUDARuntimeError(901)
        return Graph(capture.nodes, capture.blocks)

    def is_capturing(self) -> bool:
        """Whether this stream is capturing (CuPy's name)."""
        return self.capturing

    def allocated_in_capture(self, block: Block) -> None:
        """A block allocated now: during a capture, from the device's shared pool, the graph checks at
        each launch that its array is still alive (CuPy would hand the block to a new owner, whose data
        every replay then overwrites).  A private pool's blocks belong to the captures that use it."""
        capture = self._capture
        if capture is not None and block.pool is not None and not block.pool.private:
            capture.blocks.append((block, block.releases))


def _again(op: Op) -> Op:
    """A fresh copy of a captured operation, enqueued at the launch's site."""
    site = f"{caller_site()} (graph node captured at {op.site})"
    return Op(op.kind, op.run, op.reads, op.writes, site, op.device, op.on_enqueue)


def order(stream: Stream, reads: Iterable[Block], writes: Iterable[Block], site: str, kind: str) -> None:
    """Race-check an operation on ``stream`` and tick its clock (call with ``simulator().lock`` held)."""
    sim = simulator()
    clock = stream._clock
    join(clock, sim.observed)
    tick = clock.get(stream.id, 0) + 1
    clock[stream.id] = tick
    reads, writes = tuple(reads), tuple(writes)
    access = Access(stream.id, tick, site, stream.name, kind)
    for block in reads + writes:
        _check(block, access, clock, block in writes)
    for block in reads:
        block.reads[stream.id] = access
    for block in writes:
        block.last_write = access
        block.reads.clear()


def _check(block: Block, access: Access, clock: dict[int, int], writing: bool) -> None:
    earlier = [block.last_write] if block.last_write is not None else []
    if writing:
        earlier.extend(block.reads.values())
    for prior in earlier:
        if clock.get(prior.stream, 0) < prior.tick:
            clock[access.stream] = access.tick - 1
            raise _race(block, access, prior, writing)


def _race(block: Block, access: Access, prior: Access, writing: bool) -> RaceError:
    what = "write" if writing else "read"
    error = RaceError(
        f"race on device {block.device} memory {block.ptr:#x}: the {access.kind} ({what}) on {access.name} "
        f"enqueued at {access.site} is not ordered after the {prior.kind} on {prior.name} enqueued at "
        f"{prior.site}; make {access.name} wait for an event recorded after it (wait_event) or synchronise"
    )
    return simulator().record_race(error)


class _Marker:
    """One record of an event: passed when its stream gets there."""

    __slots__ = ("device", "epoch", "passed")

    def __init__(self, device: int) -> None:
        self.device = device
        self.passed = False
        self.epoch = simulator().epoch

    def stale(self) -> bool:
        """Whether ``Simulator.reset`` dropped the work this record waited behind."""
        return self.epoch != simulator().epoch

    def pass_(self) -> None:
        sim = simulator()
        with sim.cv:
            self.passed = True
            sim.cv.notify_all()

    def failed(self) -> bool:
        devices = simulator().devices
        return self.device < len(devices) and devices[self.device].failed

    def wait(self, waiter: int) -> None:
        """Block a stream thread until the record passed (a fault on its device fails the waiter too)."""
        sim = simulator()
        with sim.cv:
            while not sim.cv.wait_for(lambda: self.passed or self.failed() or self.stale(), _WAIT_SLICE_S):
                pass
        if not self.passed and not self.stale():
            raise CUDARuntimeError(719)


class Event:
    """A simulated CUDA event with generations (one marker per record)."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        sim = simulator()
        sim.check_thread()
        self.device_id = sim.local.device
        sim.device(self.device_id).check()
        self.block = block
        self.disable_timing = disable_timing
        self.generation = 0
        self._last: tuple[_Marker, dict[int, int]] | None = None

    def __repr__(self) -> str:
        return f"<cudasim.Event generation={self.generation} done={self.done}>"

    def record(self, stream: Stream | None = None) -> None:
        """Enqueue a marker on ``stream`` (default: the current stream); a new generation."""
        sim = simulator()
        sim.check_thread()
        stream = current_stream() if stream is None else stream
        stream._worker.check_open()
        stream._worker.state.check()
        if stream._capture is not None:
            stream._capture.nodes.append(lambda s: self.record(s))
            return
        marker = _Marker(stream.device_id)
        with sim.lock:
            order(stream, (), (), caller_site(), "record")
            self.generation += 1
            self._last = (marker, dict(stream._clock))
            stream._worker.push(Op("record", marker.pass_, device=stream.device_id))

    def _dead(self) -> bool:
        devices = simulator().devices
        return self.device_id < len(devices) and devices[self.device_id].failed

    @property
    def done(self) -> bool:
        """Whether the last record passed (True if never recorded; False for ever after a fault)."""
        if simulator().device(self.device_id).failed:
            return False
        last = self._last
        if last is None:
            return True
        if last[0].passed and not last[0].failed():
            simulator().observe(last[1])  # the host saw it complete: later work is ordered after it
            return True
        return False

    def synchronize(self) -> None:
        """Block (without spinning) until the record current at call time passed (a host sync)."""
        sim = simulator()
        sim.count_sync()
        sim.device(self.device_id).check()
        last = self._last
        if last is None:
            return
        marker, clock = last
        with sim.cv:
            sim.cv.wait_for(lambda: marker.passed or marker.failed() or marker.stale() or self._dead())
        if not marker.passed and not marker.stale():
            raise CUDARuntimeError(719)
        sim.observe(clock)


class Graph:
    """Captured work: ``launch(stream)`` enqueues the recorded nodes in order.

    A graph writes the memory its capture allocated at every launch, by address: launching it after an
    array allocated from the shared pool during the capture died raises ``RaceError`` (on CuPy the
    block may belong to a new array by then, which the replay silently overwrites).
    """

    def __init__(self, nodes: list[Callable[[Stream], None]], blocks: list[tuple[Block, int]]) -> None:
        self._nodes = nodes
        self._blocks = blocks
        self._site = caller_site()

    def __repr__(self) -> str:
        return f"<cudasim.Graph nodes={len(self._nodes)}>"

    def launch(self, stream: Stream | None = None) -> None:
        """Replay the captured work on ``stream`` (default: the current stream), race-checked."""
        stream = current_stream() if stream is None else stream
        for block, releases in self._blocks:
            if block.releases != releases:
                sim = simulator()
                raise sim.record_race(
                    RaceError(
                        f"graph captured at {self._site} launched at {caller_site()} after an array "
                        f"allocated during its capture ({block!r}) was freed: the pool may hand that memory "
                        "to a new array, which every replay overwrites. Keep every array allocated during "
                        "a capture alive as long as the graph, or capture with a private pool"
                    )
                )
        for node in self._nodes:
            node(stream)

    def upload(self, stream: Stream | None = None) -> None:
        """Nothing to upload in the simulator."""


def current_stream() -> Stream:
    """This thread's current stream: the innermost ``with stream``, else the current device's null stream."""
    local = simulator().local
    if local.stack:
        stream: Stream = local.stack[-1]
        return stream
    return null_stream(local.device)


def null_stream(device: int) -> Stream:
    """This thread's null stream of ``device`` (made on first use)."""
    local = simulator().local
    null: Stream | None = local.null.get(device)
    if null is None:
        null = local.null[device] = Stream(null=True, device=device)
    return null
