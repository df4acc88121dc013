"""CPU worker threads.

Each worker parks on its own lock when no task is ready; whoever makes work
ready wakes exactly as many parked workers as there are ready tasks.  A worker
runs the dependent its task just made ready at once (``Runtime.execute``
returns it), so a chain never goes back through the queue.  While a worker is
blocked in ``Future.result()`` the pool starts a stand-in thread, and retires
the surplus once the worker is back, so blocking never starves the pool.

From its start to its close the pool holds BLAS at ``Config.blas_threads`` per
worker (``_blas.py``: the CPU budget), so that workers x BLAS threads fit the cores.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._runtime import Device, Runtime, Task, set_worker
from ._blas import BlasHold, BlasPlan, hold_blas, plan_blas

if TYPE_CHECKING:
    from .._config import Config

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
        set_worker(self)
        pool = self.pool
        next_task = pool.rt.next_task
        pool.rt.worker_started()
        while True:
            found = next_task(pool, self)
            if isinstance(found, Task):
                # hand the task over without keeping a reference here: a finished task's
                # value (a Tensor's array) must be freed when its last user lets go of it
                self.first = found
                del found
                self.run_chain(None)
            elif found is None:
                self.park.acquire()
            elif found is False:  # retired: a stand-in no longer needed, or the engine is closing
                return
            elif not self.park.acquire(timeout=found) and not pool.rt.unpark(pool, self):
                self.park.acquire()  # notified as the time ran out: take that wake-up

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

    def blocking(self, delta: int) -> None:
        """This worker starts (+1) or stops (-1) blocking on another task's result."""
        self.pool.blocking(delta)


class CpuPool(Device):
    """``size`` worker threads, plus stand-ins while workers block.

    Its bookkeeping (parked and live workers) is read by ``dispatch`` and
    ``leaving`` with the runtime's lock held, so it changes only under that
    lock too: in those calls, or through ``rt.under_lock``.
    """

    kind = "cpu"
    runs_anywhere = True
    parks_timed = True

    def __init__(self, rt: Runtime, size: int, name: str = "cpu", blas: BlasPlan | None = None) -> None:
        super().__init__(rt, name)
        self.blas_plan = blas  # what it does to BLAS's threads while it runs (None: nothing)
        self.blas: BlasHold | None = None  # its hold on them, from start() to aclose()
        self.eager = size  # the first tasks of a burst start at once, one per worker
        self.hungry = False  # no worker is parked until the threads have started
        self.size = size
        self.workers: list[CpuWorker] = []  # live ones
        self.retired: list[threading.Thread] = []  # ended or ending; joined by join()
        self.retired_busy: dict[str, float] = {}  # busy seconds of workers that ended, by name
        self.spawned = 0
        self.live = 0
        self.blocked = 0
        self.stopping = False

    @classmethod
    async def open(cls, rt: Runtime, name: str, config: Config) -> CpuPool:
        return cls(rt, config.cpu_workers, name, plan_blas(config))

    @property
    def concurrency(self) -> int:  # type: ignore[override]
        """Tasks it runs at once: its worker threads."""
        return self.size

    def start(self) -> None:
        if self.blas_plan is not None:
            self.blas = hold_blas(self.blas_plan)
        try:
            for _ in range(self.size):
                self._launch(self.rt.under_lock(self._reserve))
        except BaseException:  # no thread could start: the engine does not start, nor close
            if self.blas is not None:
                self.blas.release()
            raise

    def leaving(self, worker: CpuWorker, ready: int) -> bool:
        """A stand-in no longer needed leaves, and every worker once the engine is closing and idle."""
        if self.live - self.blocked > self.size or (self.stopping and not ready):
            self.retire(worker)
            return True
        return False

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
            self.rt.under_lock(self._unreserve, worker)
            if not self.workers:
                raise

    def _unreserve(self, worker: CpuWorker) -> None:
        self.live -= 1
        self.workers.remove(worker)

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

    def dispatch(self, ready: int) -> Callable[[], None] | None:
        """With the lock held: take parked workers for ``ready`` tasks; return their wake-up."""
        idle = self.idle
        if not idle:  # (the runtime asks only while hungry, which is kept equal to bool(idle))
            return None
        if ready == 1 or len(idle) == 1:
            woken: CpuWorker = idle.pop()
            self.hungry = bool(idle)
            return woken.park.release
        woken_all = idle[-ready:]  # (no comprehension or lambda: no cells made at every call)
        del idle[-ready:]
        self.hungry = bool(idle)
        return functools.partial(_release_all, woken_all)

    def blocking(self, delta: int) -> None:
        """A worker starts (+1) or stops (-1) blocking on another task's result."""
        stand_in, release = self.rt.under_lock(self._count_blocked, delta)
        if stand_in is not None:
            with contextlib.suppress(RuntimeError):  # the blocked worker is not lost, only helped
                self._launch(stand_in)
        if release is not None:
            release()

    def _count_blocked(self, delta: int) -> tuple[CpuWorker | None, Callable[[], None] | None]:
        """With the lock held: count a blocked worker; a stand-in to launch, or a parked one to let go."""
        self.blocked += delta
        if delta > 0 and not self.stopping and self.live - self.blocked < self.size:
            return self._reserve(), None
        if delta < 0 and self.live - self.blocked > self.size and self.idle:
            woken = self.idle.pop()  # let a parked stand-in retire
            self.hungry = bool(self.idle)
            return None, woken.park.release
        return None, None

    def stop(self) -> None:
        _release_all(self.rt.under_lock(self._stopping))

    def _stopping(self) -> list[CpuWorker]:
        self.stopping = True
        self.hungry = False
        parked, self.idle[:] = self.idle[:], []
        return parked

    async def aclose(self) -> None:
        """Give BLAS's threads back as they were (once the last open engine lets go)."""
        if self.blas is not None:
            self.blas.release()

    def join(self, timeout: float | None) -> list[threading.Thread]:
        deadline = None if timeout is None else time.monotonic() + timeout
        threads = self.rt.under_lock(self._threads)
        for thread in threads:
            if thread.is_alive():  # (a stand-in being launched right now is not started yet)
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(left)
        return [t for t in threads if t.is_alive()]

    def _threads(self) -> list[threading.Thread]:
        return [w.thread for w in self.workers] + self.retired

    def busy_seconds(self) -> dict[str, float]:
        busy = dict(self.retired_busy)
        for worker in self.workers:  # names are never reused: a live worker has no retired namesake
            busy[worker.name] = worker.busy
        return busy


def _release_all(workers: list[CpuWorker]) -> None:
    for worker in workers:
        worker.park.release()
