"""The streams of a CUDA device: each a ``Track`` of the tasks launched on it, in launch order, and the
watcher thread that reports them complete.

A watcher sleeps in ``Event(block=True).synchronize()`` (the GIL released) on the event of the oldest
task somebody waits for (an await, a thread's ``result()``, a task on another device), or else on the
newest event of its stream; the events of one stream pass in order, so when it wakes every task up to
that one is complete, and those after it whose events passed too.  It hands them all to its device
(``CudaDevice.completed``), which reports them to the runtime in one call: a burst of launches that
nobody awaited in between costs one wake-up, not one per task.  Each ``Flight`` keeps what its task
touched alive (its arguments, result and staging buffers) until its event passed, so the pool never
hands a block to new work while a stream still uses it (cupy#8068).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from .._runtime import Task

if TYPE_CHECKING:
    from .cuda import CudaDevice

__all__ = ["Flight", "Track"]


class Flight:
    """A task launched on a stream, until its event passed: what it holds alive meanwhile."""

    __slots__ = ("error", "event", "held", "shared", "t0", "task", "track", "value")

    def __init__(self, task: Task | None, track: Track, event: Any, value: Any, held: Any, t0: float) -> None:
        self.task = task
        self.track = track
        self.event = event
        self.value = value
        self.held = held  # arguments, staging buffers: alive until the event passed
        self.t0 = t0
        self.error: BaseException | None = None  # it failed while launching
        self.shared = False  # its event stands for other flights too (a batch's): never recycled


class Track:
    """One stream and the watcher thread that reports its tasks complete, in launch order.

    ``lock`` guards the flights; a watcher with none sleeps on ``_wake``, a lock held while it is not
    signalled, which ``push`` (or ``stop``) releases once for it (what ``threading.Condition`` does per
    waiter, without its Python frames on the launching thread's path)."""

    def __init__(self, owner: CudaDevice, stream: Any, name: str) -> None:
        self.owner = owner
        self.stream = stream
        self.name = name  # "cuda:0/s0", "cuda:0/h2d", "cuda:0/d2h"
        self.flights: deque[Flight] = deque()
        self.lock = threading.Lock()
        self._wake = threading.Lock()
        self._wake.acquire()  # (not signalled)
        self._asleep = False  # the watcher waits on _wake (with the lock held to change it)
        self.stopping = False
        self.launches = 0
        self.sweeps = 0  # completion reports: each covers every flight whose event had passed
        self.busy = 0.0
        self.last_end = 0.0
        self.thread = threading.Thread(target=self._watch, name=f"schedsvc-{name}", daemon=True)

    def push(self, flight: Flight) -> None:
        with self.lock:
            self.flights.append(flight)
            self.launches += 1
            if not self._asleep:
                return
            self._asleep = False
        self._wake.release()

    def stop(self) -> None:
        """The watcher returns once no flight is left."""
        with self.lock:
            self.stopping = True
            if not self._asleep:
                return
            self._asleep = False
        self._wake.release()

    def _watch(self) -> None:
        owner = self.owner
        owner.api.use_device(owner.index)
        flights = self.flights
        lock = self.lock
        while True:
            with lock:
                if not flights:
                    if self.stopping:
                        return
                    self._asleep = True
                    target = None
                else:
                    target = _target(flights)
            if target is None:
                self._wake.acquire()  # until push or stop release it
                continue
            error: BaseException | None = None
            try:
                target.event.synchronize()  # sleeps (block=True), the GIL released
            except Exception as exc:  # the device failed (a sticky error): every task in flight fails
                error = exc
            done = []
            with lock:
                if error is None:
                    while flights:  # events of one stream pass in order: up to the target, all passed
                        flight = flights.popleft()
                        done.append(flight)
                        if flight is target:
                            break
                    while flights and flights[0].event.done:  # and what passed since
                        done.append(flights.popleft())
                else:
                    done.extend(flights)
                    flights.clear()
            self.sweeps += 1
            owner.completed(self, done, error)
            del target, done  # holds nothing while it sleeps: a result lives as long as its users keep it


def _target(flights: deque[Flight]) -> Flight:
    """The flight a watcher waits for: the oldest one whose task somebody waits for (read without the
    runtime's lock: one read of a field), else the newest."""
    for flight in flights:
        task = flight.task
        if task is not None and (task.watchers is not None or task.dependents is not None):
            return flight
    return flights[-1]
