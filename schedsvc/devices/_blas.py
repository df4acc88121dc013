"""The CPU budget: how many threads BLAS starts per CPU worker while engines run.

NumPy's BLAS (OpenBLAS in NumPy's wheels, MKL or BLIS elsewhere) runs a matrix
product on as many threads as there are cores, and each of the engine's CPU
workers calling it at once multiplies that: ``cpu_workers`` x cores threads on
the cores.  So while an engine with a CPU pool is open it holds BLAS at
``Config.blas_threads`` per worker: by default at most ``cores // cpu_workers``
(at least 1), where the cores are those this process may run on.

The BLAS thread count is one per process for the BLAS libraries NumPy ships
with: OpenBLAS's ``openblas_set_num_threads`` (its pthreads build) and
``mkl_set_num_threads`` set it for every thread, so it cannot be set for the
workers alone, and threadpoolctl (which sets it here) says as much.  Hence:

* It is set when an engine starts and restored when it closes, and it applies to
  the whole process meanwhile: to code on the event loop's thread too.
* Engines open at the same time share one setting: each library runs on the
  smallest count any open engine wants, the values from before the first one
  started are restored when the last one closes, in whatever order they close.
* ``"auto"`` only lowers a count: it never raises one that code or the
  environment lowered (``threadpool_limits(1)`` around the engine keeps 1), and
  it leaves BLAS alone where the user chose its threads with an environment
  variable (``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``, ...).  A number sets
  exactly that; ``"leave"`` (0) touches nothing.

threadpoolctl is imported when the first engine starts, not with ``schedsvc``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._config import Config

__all__ = [
    "BLAS_VARIABLES",
    "BlasHold",
    "BlasPlan",
    "blas_libraries",
    "engine_cores",
    "hold_blas",
    "plan_blas",
]

#: environment variables by which a user chooses BLAS's threads (OpenBLAS, MKL, BLIS and OpenMP builds
#: read them when they load): where one is set, ``blas_threads="auto"`` leaves BLAS as they say
BLAS_VARIABLES = (
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "OMP_NUM_THREADS",
)


def engine_cores() -> int:
    """The cores this process may run on (its CPU affinity): the cores the engine is given."""
    count = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if count is not None:
        return int(count() or 1)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        return os.cpu_count() or 1


@dataclass(frozen=True)
class BlasPlan:
    """What an engine's CPU workers do to BLAS: hold it at ``threads`` (None: leave it alone), and why."""

    cores: int
    workers: int
    #: BLAS threads per worker the engine sets; None: it leaves BLAS alone
    threads: int | None
    #: set exactly ``threads`` (an explicit ``blas_threads``), or at most that (``"auto"``)
    exact: bool
    reason: str

    def wanted(self, current: int) -> int:
        """The count this plan wants for a library that runs on ``current`` threads."""
        assert self.threads is not None
        return self.threads if self.exact else min(self.threads, current)


def plan_blas(config: Config) -> BlasPlan:
    """What an engine with ``config`` does to BLAS on this machine, with this environment."""
    cores, workers, setting = engine_cores(), config.cpu_workers, config.blas_threads

    def left(reason: str) -> BlasPlan:
        return BlasPlan(cores, workers, None, False, reason)

    if config.backend != "threads" or "cpu" not in config.devices:
        return left(f"left alone: no CPU worker threads here (backend {config.backend!r})")
    if setting == 0:
        return left("left alone: blas_threads='leave'")
    if setting is not None:
        return BlasPlan(cores, workers, setting, True, f"blas_threads={setting}")
    chosen = next((name for name in BLAS_VARIABLES if os.environ.get(name, "").strip()), None)
    if chosen is not None:
        return left(f"left alone: {chosen}={os.environ[chosen].strip()} is set")
    budget = max(1, cores // workers)
    return BlasPlan(cores, workers, budget, False, f"auto: at most {cores} cores // {workers} workers")


def blas_libraries() -> list[dict[str, Any]]:
    """The BLAS libraries loaded in this process (NumPy's at least) and their threads now, as threadpoolctl
    describes them."""
    from threadpoolctl import threadpool_info

    return [lib for lib in threadpool_info() if lib["user_api"] == "blas"]


class BlasHold:
    """An engine's hold on BLAS threads, from its start to its close (``release``)."""

    def __init__(self, plan: BlasPlan) -> None:
        self.plan = plan
        #: each BLAS library's path -> the threads it runs on since this hold (read back from the library)
        self.threads: dict[str, int] = {}

    def release(self) -> None:
        """Give the hold up; the last one restores what BLAS ran on before the first (at most once)."""
        _BUDGET.release(self)

    def __repr__(self) -> str:
        return f"<BlasHold {self.plan.reason}: {sorted(set(self.threads.values()))} threads>"


def hold_blas(plan: BlasPlan) -> BlasHold | None:
    """Hold BLAS at ``plan``'s threads until the hold is released; None if the plan leaves BLAS alone."""
    return None if plan.threads is None else _BUDGET.hold(BlasHold(plan))


class _Budget:
    """The process's one BLAS setting, shared by the engines that hold it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # engines start and close on their own loops' threads
        self.holds: list[BlasHold] = []
        self.original: dict[str, int] = {}  # library path -> threads before the first hold
        self.controller: Any = None  # threadpoolctl's, of the BLAS libraries loaded at the latest hold

    def hold(self, hold: BlasHold) -> BlasHold:
        from threadpoolctl import ThreadpoolController

        with self.lock:
            # found again at each hold: a library loaded since (SciPy's own OpenBLAS) is held too
            self.controller = ThreadpoolController().select(user_api="blas")
            for lib in self.controller.lib_controllers:
                if lib.num_threads is not None:
                    self.original.setdefault(lib.filepath, lib.num_threads)
            self.holds.append(hold)
            hold.threads = self._apply()
        return hold

    def release(self, hold: BlasHold) -> None:
        with self.lock:
            if hold not in self.holds:
                return
            self.holds.remove(hold)
            self._apply()
            if not self.holds:
                self.original.clear()
                self.controller = None

    def _apply(self) -> dict[str, int]:
        """Set each library to the smallest count a hold wants (none left: its original); what is in force."""
        targets = {
            path: min((hold.plan.wanted(threads) for hold in self.holds), default=threads)
            for path, threads in self.original.items()
        }
        _set(self.controller, targets)
        return {lib.filepath: lib.num_threads for lib in self.controller.lib_controllers}


def _set(controller: Any, limits: dict[str, int]) -> None:
    """Set each library (by path) to its number of threads, and leave none of threadpoolctl's state behind.

    threadpoolctl 3.8 lets one thread at a time set OpenBLAS's process-wide count: the first to set
    it, until that thread leaves a ``limit`` block.  The second call is such a block, entered and left
    at once (it restores the values the first call set), so that the thread that started or closed an
    engine does not keep that control: code on other threads can set BLAS's threads afterwards.
    """
    controller.limit(limits=limits)
    with controller.limit(limits=limits):
        pass


_BUDGET = _Budget()
