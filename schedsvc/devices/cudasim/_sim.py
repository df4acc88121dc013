"""The process-wide simulator: devices, per-thread state, knobs, counters and the driver thread.

Everything the streams, events and arrays share lives here: the devices (each
with its pool and sticky failed state), the per-thread current device and
stream stack, the race detector's "observed" clock (what the host has seen
complete), the host-sync counters and guard, the injected failures, and the
one "cuda-driver" thread that runs host callbacks.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ._errors import CUDARuntimeError, HostSyncError, OutOfMemoryError, RaceError
from ._memory import Pool

__all__ = ["DeviceState", "Simulator", "caller_site", "simulator"]

DEFAULT_DEVICES = 2
DEFAULT_MEMORY = 16 << 30
_HOST_FUNC_LOST = "Exception ignored in: 'cupy_backends.cuda.api.runtime._HostFnFunc'"

_HERE = os.path.dirname(os.path.abspath(__file__))
_SKIP = (_HERE, os.path.dirname(os.path.abspath(np.__file__)), os.path.dirname(threading.__file__))


def caller_site() -> str:
    """The first frame outside the simulator, threading and NumPy, as ``file.py:123 in fn``."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        raw = frame.f_code.co_filename
        filename = os.path.abspath(raw)
        inside = raw.startswith("<") or filename.startswith(_SKIP[0]) or filename.startswith(_SKIP[1])
        stdlib = filename.startswith(_SKIP[2]) and os.path.basename(filename) in (
            "threading.py",
            "contextlib.py",
        )
        if not inside and not stdlib:
            return f"{os.path.basename(filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "<unknown>"


class DeviceState:
    """One simulated device: its memory pool and its sticky failed state."""

    def __init__(self, device: int, memory_bytes: int) -> None:
        self.id = device
        self.pool = Pool(device, memory_bytes)
        self.failed = False

    def check(self) -> None:
        """Raise the sticky 719 if the device failed."""
        if self.failed:
            raise CUDARuntimeError(719)


class _Local(threading.local):
    """Per-thread state: current device, pushed streams, null streams."""

    def __init__(self) -> None:
        self.device = 0
        self.stack: list[Any] = []
        self.null: dict[int, Any] = {}
        self.pools: dict[int, Any] = {}  # device -> the private pool this thread allocates from


class _Driver:
    """The one process-wide thread that runs host callbacks, like CUDA's driver thread.

    Started by the first call; ``stop_idle`` ends it when no callback is queued
    or running (an engine closing its streams), and the next call starts it again.
    """

    def __init__(self) -> None:
        self._calls: deque[tuple[Callable[[Any], object], Any, threading.Event]] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._ended: threading.Thread | None = None  # the last one told to stop (it may be returning)
        self._running = False  # a callback is running
        self._stopping = False
        self.ident: int | None = None  # the running thread's (a CUDA call there fails with 800)

    def call(self, fn: Callable[[Any], object], arg: Any) -> None:
        """Run ``fn(arg)`` on the driver thread and wait until it returns."""
        done = threading.Event()
        with self._cond:
            self._calls.append((fn, arg, done))
            self._stopping = False
            if self._thread is None:  # (it takes the lock first: it sees its ident set)
                self._thread = threading.Thread(target=self._loop, name="cuda-driver", daemon=True)
                self._thread.start()
                self.ident = self._thread.ident
            self._cond.notify()
        done.wait()

    def stop_idle(self, timeout: float | None) -> list[threading.Thread]:
        """End the thread unless a callback is queued or running; wait up to ``timeout`` for it to end.
        Returns it if it is still alive then."""
        with self._cond:
            thread = self._thread
            if thread is None:
                thread = self._ended  # (it left the loop: it may not have returned yet)
            elif self._calls or self._running:
                return []
            else:
                self._stopping = True
                self._cond.notify()
        if thread is None:
            return []
        thread.join(timeout)
        return [thread] if thread.is_alive() else []

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._calls and not self._stopping:
                    self._cond.wait()
                if not self._calls:  # told to stop, and idle
                    self._thread, self.ident, self._stopping = None, None, False  # (idents are reused)
                    self._ended = threading.current_thread()
                    return
                fn, arg, done = self._calls.popleft()
                self._running = True
            try:
                fn(arg)
            except BaseException:
                print(_HOST_FUNC_LOST, file=sys.stderr)
            finally:
                del fn, arg
                with self._cond:
                    self._running = False
                done.set()


class Simulator:
    """The simulator's shared state and its knobs (see ``cudasim/__init__.py``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cv = threading.Condition()
        self.local = _Local()
        self.driver = _Driver()
        self.devices: list[DeviceState] = []
        self.races: list[RaceError] = []
        self.faults: list[str] = []
        self.observed: dict[int, int] = {}
        self.streams: weakref.WeakSet[Any] = weakref.WeakSet()
        self.seed: int | None = None
        self.epoch = 0
        self.max_delay_s: float | None = None
        self._syncs: Counter[str] = Counter()
        self._launcher_syncs = 0
        self._launchers: set[int] = set()
        self._forbid_depth = 0
        self._forbid_threads: Counter[int] = Counter()
        self._fail_launches = 0
        self._fail_status = 719
        self._fail_allocs = 0
        self._fail_allocs_after = 0
        self.configure(devices=DEFAULT_DEVICES, memory_bytes=DEFAULT_MEMORY)

    def __repr__(self) -> str:
        failed = [d.id for d in self.devices if d.failed]
        return (
            f"<cudasim.Simulator devices={len(self.devices)} failed={failed} races={len(self.races)} "
            f"faults={len(self.faults)} syncs={sum(self._syncs.values())}>"
        )

    # -- knobs ---------------------------------------------------------------------

    def configure(
        self,
        *,
        devices: int | None = None,
        memory_bytes: int | None = None,
        seed: int | None = None,
        max_delay_s: float | None = None,
    ) -> None:
        """Set the number of devices, their memory, and seeded random delays per stream operation."""
        with self.lock:
            if memory_bytes is not None:
                for state in self.devices:
                    state.pool.capacity = memory_bytes
            count = len(self.devices) if devices is None else devices
            memory = memory_bytes if memory_bytes is not None else self._memory()
            del self.devices[count:]
            self.devices.extend(DeviceState(i, memory) for i in range(len(self.devices), count))
            if seed is not None:
                self.seed = seed
            if max_delay_s is not None:
                self.max_delay_s = max_delay_s or None
            for stream in list(self.streams):
                stream._reseed()

    def _memory(self) -> int:
        return self.devices[0].pool.capacity if self.devices else DEFAULT_MEMORY

    def fail_launches(self, n: int, status: int = 719) -> None:
        """The next ``n`` kernel launches raise ``CUDARuntimeError(status)`` at enqueue."""
        with self.lock:
            self._fail_launches, self._fail_status = n, status

    def fail_allocations(self, n: int, after: int = 0) -> None:
        """After ``after`` more successful allocations, the next ``n`` raise ``OutOfMemoryError``."""
        with self.lock:
            self._fail_allocs, self._fail_allocs_after = n, after

    def reset(self) -> None:
        """Knobs off, counters, races and faults cleared, pools emptied, queued work dropped."""
        with self.lock:
            self._syncs.clear()
            self._launcher_syncs = 0
            self._launchers.clear()
            self._forbid_depth = 0
            self._forbid_threads.clear()
            self._fail_launches = self._fail_allocs = self._fail_allocs_after = 0
            self.races.clear()
            self.epoch += 1
            self.faults.clear()
            self.seed = self.max_delay_s = None
            del self.devices[DEFAULT_DEVICES:]
            self.devices.extend(DeviceState(i, DEFAULT_MEMORY) for i in range(len(self.devices), 2))
            for state in self.devices:
                state.pool.clear()
                state.pool.capacity = DEFAULT_MEMORY
                state.failed = False
            for stream in list(self.streams):
                stream._reset()
        with self.cv:
            self.cv.notify_all()

    # -- injected failures (called by the streams and the allocator) -----------------------

    def take_launch_failure(self) -> None:
        """Raise the injected launch failure, if one is due."""
        with self.lock:
            if self._fail_launches <= 0:
                return
            self._fail_launches -= 1
            status = self._fail_status
        raise CUDARuntimeError(status)

    def take_allocation_failure(self, size: int, device: int) -> None:
        """Raise the injected out-of-memory error, if one is due."""
        with self.lock:
            if self._fail_allocs <= 0:
                return
            if self._fail_allocs_after > 0:
                self._fail_allocs_after -= 1
                return
            self._fail_allocs -= 1
        pool = self.device(device).pool
        raise OutOfMemoryError(size, pool.total(), pool.limit)

    # -- devices and threads -----------------------------------------------------------------

    def device(self, device: int) -> DeviceState:
        """Device ``device``'s state (``CUDARuntimeError(101)`` if there is none)."""
        if not 0 <= device < len(self.devices):
            raise CUDARuntimeError(101)
        return self.devices[device]

    def check_thread(self) -> None:
        """Any simulated CUDA call on the driver thread fails with 800."""
        if threading.get_ident() == self.driver.ident:
            raise CUDARuntimeError(800)

    def use_device(self, device: int) -> None:
        """Make ``device`` current on this thread."""
        self.check_thread()
        self.device(device)
        self.local.device = device

    def mark_launcher(self) -> bool:
        """This thread launches work: its host syncs are counted apart and may be forbidden.  False if it
        was marked already."""
        ident = threading.get_ident()
        with self.lock:
            if ident in self._launchers:
                return False
            self._launchers.add(ident)
            return True

    def unmark_launcher(self) -> None:
        """This thread no longer launches work."""
        with self.lock:
            self._launchers.discard(threading.get_ident())

    def fault(self, device: int, message: str) -> None:
        """A kernel failed at run time: record it and put the device in the sticky failed state."""
        with self.lock:
            self.faults.append(message)
            if device < len(self.devices):
                self.devices[device].failed = True
        with self.cv:
            self.cv.notify_all()

    def record_race(self, error: RaceError) -> RaceError:
        """Remember a race found (also when it is raised)."""
        self.races.append(error)
        return error

    # -- host syncs ------------------------------------------------------------------------

    def count_sync(self) -> None:
        """Count a host sync on this thread; raise ``HostSyncError`` where one is forbidden."""
        self.check_thread()
        ident = threading.get_ident()
        with self.lock:
            self._syncs[threading.current_thread().name] += 1
            launcher = ident in self._launchers
            self._launcher_syncs += launcher
            forbidden = self._forbid_depth > 0 and (launcher or self._forbid_threads[ident] > 0)
        if forbidden:
            what = "a launching thread" if launcher else "a thread inside forbid_host_sync()"
            raise HostSyncError(
                f"host sync on {what} ({threading.current_thread().name}) at {caller_site()}: "
                "wait for an event on a watcher thread instead"
            )

    def observe(self, clock: dict[int, int]) -> None:
        """The host saw the work up to ``clock`` complete: later work is ordered after it."""
        with self.lock:
            join(self.observed, clock)

    def host_syncs(self) -> dict[str, int]:
        """Host syncs counted since the last reset, by thread name."""
        with self.lock:
            return dict(self._syncs)

    def syncs_here(self) -> int:
        """Host syncs this thread made since the last reset (counted by its name)."""
        with self.lock:
            return self._syncs[threading.current_thread().name]

    def launcher_syncs(self) -> int:
        """Host syncs made on launching threads since the last reset."""
        return self._launcher_syncs

    def reset_counters(self) -> None:
        """Zero the host-sync counters."""
        with self.lock:
            self._syncs.clear()
            self._launcher_syncs = 0

    @contextlib.contextmanager
    def forbid_host_sync(self) -> Iterator[None]:
        """Inside: a host sync on a launching thread, or on this thread, raises ``HostSyncError``."""
        ident = threading.get_ident()
        with self.lock:
            self._forbid_depth += 1
            self._forbid_threads[ident] += 1
        try:
            yield
        finally:
            with self.lock:
                self._forbid_depth = max(0, self._forbid_depth - 1)
                self._forbid_threads[ident] -= 1
                if self._forbid_threads[ident] <= 0:
                    del self._forbid_threads[ident]


def join(into: dict[int, int], clock: dict[int, int]) -> None:
    """Join vector clock ``clock`` into ``into``."""
    for stream, tick in clock.items():
        if into.get(stream, 0) < tick:
            into[stream] = tick


_SIMULATOR = Simulator()


def simulator() -> Simulator:
    """The process-wide simulator."""
    return _SIMULATOR
