"""CPU worker threads.

Each worker parks on its own lock when no task is ready; whoever makes work
ready wakes exactly as many parked workers as there are ready tasks.  A worker
runs the dependent its task just made ready at once (``Runtime.execute``
returns it), so a chain never goes back through the queue.  While a worker is
blocked in ``Future.result()`` the pool starts a stand-in thread, and retires
the surplus once the worker is back, so blocking never starves the pool.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from .._runtime import Runtime, Task
from .._runtime._runtime import _local

__all__ = ["CpuPool", "CpuWorker"]


class CpuWorker:
    """One thread taking CPU tasks from the scheduler."""

    def __init__(self, pool: CpuPool, index: int) -> None:
        self.pool = pool
        self.name = f"cpu-{index}"
        self.busy = 0.0
        self.park = threading.Lock()
        self.first: Task | None = None  # a task handed from the take loop to run_chain
        self.park.acquire()
        self.thread = threading.Thread(target=self._main, name=f"schedsvc-{self.name}", daemon=True)

    def _main(self) -> None:
        _local.worker = self
        pool = self.pool
        lock = pool.rt.lock
        core = pool.rt.core
        idle = pool.idle
        ident = threading.get_ident()
        with lock:
            pool.rt.worker_threads.add(ident)
        while True:
            with lock:
                if pool.live - pool.blocked > pool.size or (pool.stopping and not core.queues["cpu"].count):
                    pool.retire(self)  # a stand-in no longer needed, or the engine is closing
                    pool.rt.worker_threads.discard(ident)
                    return
                task = core.take("cpu")
                if task is None:
                    idle.append(self)
            if task is None:
                self.park.acquire()
            else:
                # hand the task over without keeping a reference here: a finished task's
                # value (a Tensor's array) must be freed when its last user lets go of it
                self.first, task = task, None
                self.run_chain(None)

    def run_chain(self, task: Task | None) -> None:
        """Run ``task`` (or the one handed over in ``first``), then what each finish hands on."""
        execute = self.pool.rt.execute
        if task is None:
            task, self.first = self.first, None
        t0 = time.perf_counter()
        try:
            while task is not None:
                task = execute(task)
        finally:
            self.busy += time.perf_counter() - t0


class CpuPool:
    """``size`` worker threads, plus stand-ins while workers block."""

    name = "cpu"

    def __init__(self, rt: Runtime, size: int) -> None:
        self.rt = rt
        self.size = size
        self.idle: list[CpuWorker] = []
        self.workers: list[CpuWorker] = []  # live ones
        self.retired: list[threading.Thread] = []  # ended or ending; joined by join()
        self.retired_busy: dict[str, float] = {}  # busy seconds of workers that ended, by name
        self.spawned = 0
        self.live = 0
        self.blocked = 0
        self.stopping = False

    @property
    def concurrency(self) -> int:
        """Tasks it runs at once: its worker threads."""
        return self.size

    def start(self) -> None:
        for _ in range(self.size):
            with self.rt.lock:
                worker = self._reserve()
            self._launch(worker)

    def _reserve(self) -> CpuWorker:
        """With the lock held: count a new worker in; ``_launch`` it after releasing the lock."""
        worker = CpuWorker(self, self.spawned)
        self.spawned += 1
        self.workers.append(worker)
        self.live += 1
        return worker

    def _launch(self, worker: CpuWorker) -> None:
        """Start a reserved worker's thread (without the lock: starting a thread is slow)."""
        try:
            worker.thread.start()
        except RuntimeError:  # cannot start a thread: carry on with fewer
            with self.rt.lock:
                self.live -= 1
                self.workers.remove(worker)
            if not self.workers:
                raise

    def retire(self, worker: CpuWorker) -> None:
        """With the lock held: ``worker`` is leaving; keep its busy time, forget the worker.

        A surplus worker leaving while the engine runs (a stand-in's work is done) adds its time
        to one ``retired`` entry, so the names stay bounded however many stand-ins come and go;
        at close each keeps its name, so a closed engine reports what it did while open.
        """
        self.live -= 1
        self.workers.remove(worker)
        name = worker.name if self.stopping else "retired"
        self.retired_busy[name] = self.retired_busy.get(name, 0.0) + worker.busy
        self.retired = [t for t in self.retired if t.is_alive()]
        self.retired.append(worker.thread)

    def wake(self, ready: int) -> Callable[[], None] | None:
        """With the lock held: take parked workers for ``ready`` tasks; return their wake-up."""
        idle = self.idle
        if not idle:
            return None
        if ready == 1 or len(idle) == 1:
            return idle.pop().park.release
        woken = [idle.pop() for _ in range(min(ready, len(idle)))]
        return lambda: _release_all(woken)

    def blocking(self, delta: int) -> None:
        """A worker starts (+1) or stops (-1) blocking on another task's result."""
        release = None
        stand_in = None
        with self.rt.lock:
            self.blocked += delta
            if delta > 0 and not self.stopping and self.live - self.blocked < self.size:
                stand_in = self._reserve()
            elif delta < 0 and self.live - self.blocked > self.size and self.idle:
                release = self.idle.pop().park.release  # let a parked stand-in retire
        if stand_in is not None:
            with contextlib.suppress(RuntimeError):  # the blocked worker is not lost, only helped
                self._launch(stand_in)
        if release is not None:
            release()

    def stop(self) -> None:
        with self.rt.lock:
            self.stopping = True
            parked, self.idle[:] = self.idle[:], []
        _release_all(parked)

    def join(self, timeout: float | None) -> list[threading.Thread]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.rt.lock:
            threads = [w.thread for w in self.workers] + self.retired
        for thread in threads:
            if thread.is_alive():  # (a stand-in being launched right now is not started yet)
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(left)
        return [t for t in threads if t.is_alive()]

    def busy_seconds(self) -> dict[str, float]:
        busy = dict(self.retired_busy)
        for worker in self.workers:  # names are never reused: a live worker has no retired namesake
            busy[worker.name] = worker.busy
        return busy


def _release_all(workers: list[CpuWorker]) -> None:
    for worker in workers:
        worker.park.release()
