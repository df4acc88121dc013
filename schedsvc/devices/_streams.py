"""The streams of a CUDA device: each a ``Track`` of the tasks launched on it, in launch order, and the
watcher thread that reports them complete.

A watcher sleeps in ``Event(block=True).synchronize()`` on the oldest event of its stream (the GIL
released), then sweeps the later ones with ``.done`` -- the events of one stream pass in order -- and hands
what passed to its device (``CudaDevice.completed``), which reports them complete to the runtime.  Each
``Flight`` keeps what its task touched alive (its arguments, result and staging buffers) until its event
passed, so the pool never hands a block to new work while a stream still uses it (cupy#8068).
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

    __slots__ = ("error", "event", "held", "t0", "task", "track", "value")

    def __init__(self, task: Task | None, track: Track, event: Any, value: Any, held: Any, t0: float) -> None:
        self.task = task
        self.track = track
        self.event = event
        self.value = value
        self.held = held  # arguments, staging buffers: alive until the event passed
        self.t0 = t0
        self.error: BaseException | None = None  # it failed while launching


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
                    head = None
                else:
                    head = flights[0]
            if head is None:
                self._wake.acquire()  # until push or stop release it
                continue
            error: BaseException | None = None
            try:
                head.event.synchronize()  # sleeps (block=True), the GIL released
            except Exception as exc:  # the device failed (a sticky error): every task in flight fails
                error = exc
            done = [head]
            with lock:
                flights.popleft()
                if error is None:
                    while flights and flights[0].event.done:  # events of one stream pass in order
                        done.append(flights.popleft())
                else:
                    done.extend(flights)
                    flights.clear()
            owner.completed(self, done, error)
            del head, done  # holds nothing while it sleeps: a result lives as long as its users keep it
