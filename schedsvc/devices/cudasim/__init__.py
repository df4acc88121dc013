"""The CUDA simulator: a strict, asynchronous stand-in for the subset of CuPy schedsvc uses.

``api()`` is the process-wide ``CudaApi`` binding (``SimApi``) and
``simulator()`` the simulator behind it, with the knobs tests use.  Unlike
Numba's simulator it runs nothing on the caller and lets the host see nothing
it did not wait for:

- each stream is a FIFO run by its own daemon thread; enqueueing never blocks;
- events have generations; ``wait_event`` snapshots the current record;
  ``synchronize`` blocks without spinning (a counted host sync);
- device arrays (``ndarray``) hold a NumPy view of a pool block and have no
  host view (``numpy.asarray`` raises ``TypeError``); ``get``/``item``/
  ``float``/``repr`` are counted host syncs on the current stream; a kernel's
  output exists at once and is filled when its stream runs it;
- a race detector checks every operation at enqueue time with vector clocks
  (``record`` copies a stream's clock into the event, ``wait_event`` and host
  syncs join it); each pool block remembers its last write and the reads
  since, and reusing a freed block counts as a write on its arena's stream
  (cupy#8068): an unordered access raises ``RaceError`` naming both sites;
- D2H targets hold a sentinel (NaN) until the copy runs; H2D sources are
  checksummed at enqueue and checked when the copy runs (a mismatch is a
  fault);
- a memory pool per device with CuPy's arenas, limit and ``OutOfMemoryError``;
- host callbacks on one "cuda-driver" thread (ended, when idle, by an engine
  closing its streams), where any simulated CUDA call raises
  ``CUDARuntimeError(800)``; their exceptions are lost;
- a fault at run time puts the device in CUDA's sticky 719 state;
- graph capture records work; a sync during it gives 900, then 901; a graph
  launched after an array its capture allocated from the shared pool died
  raises ``RaceError`` (a private pool, ``allocating_from(graph_pool(d))``,
  is how captures keep their memory).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np

from .._cudaapi import CudaApi
from . import _xp
from ._array import Device, ndarray
from ._errors import CUDARuntimeError, HostSyncError, OutOfMemoryError, RaceError
from ._memory import Pool, pinned_empty
from ._sim import Simulator, simulator
from ._stream import Event, Graph, Stream, current_stream

__all__ = [
    "CUDARuntimeError",
    "Device",
    "Event",
    "Graph",
    "HostSyncError",
    "OutOfMemoryError",
    "RaceError",
    "SimApi",
    "Simulator",
    "Stream",
    "api",
    "ndarray",
    "simulator",
]


class SimApi(CudaApi):
    """``CudaApi`` bound to the simulator."""

    name: ClassVar[str] = "simulator"

    def __init__(self) -> None:
        self.xp = _xp
        self.ndarray = ndarray
        self.CUDARuntimeError = CUDARuntimeError
        self.OutOfMemoryError = OutOfMemoryError

    def __repr__(self) -> str:
        return f"<cudasim.SimApi {simulator()!r}>"

    def version(self) -> str:
        return f"cudasim (NumPy {np.__version__}), {len(simulator().devices)} simulated devices"

    def device_count(self) -> int:
        return len(simulator().devices)

    def device_name(self, device: int) -> str:
        simulator().device(device)
        return f"simulated device {device}"

    def device_memory(self, device: int) -> int:
        return simulator().device(device).pool.capacity

    def use_device(self, device: int) -> None:
        simulator().use_device(device)

    def launching_thread(self) -> None:
        simulator().mark_launcher()

    def begin_launches(self, device: int) -> Any:
        sim = simulator()
        previous = sim.local.device
        sim.use_device(device)
        return previous, sim.mark_launcher()

    def end_launches(self, device: int, began: Any) -> None:
        previous, marked = began
        sim = simulator()
        sim.local.device = previous
        if marked:
            sim.unmark_launcher()

    def host_syncs(self) -> int:
        return simulator().syncs_here()

    def stream(self, device: int) -> Stream:
        return Stream(non_blocking=True, device=device)

    def event(self) -> Event:
        return Event(block=True, disable_timing=True)

    def close_streams(self, streams: list[Any], timeout: float | None) -> list[threading.Thread]:
        deadline = None if timeout is None else time.monotonic() + timeout
        threads = [stream.close() for stream in streams]
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        alive = [thread for thread in threads if thread.is_alive()]
        if not alive:  # their host callbacks ran: the driver thread ends too, unless others use it
            alive = simulator().driver.stop_idle(
                None if deadline is None else max(0.0, deadline - time.monotonic())
            )
        return alive

    def current_stream(self) -> Stream:
        return current_stream()

    def empty_pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
        return pinned_empty(shape, dtype)

    def set_pool_limit(self, device: int, nbytes: int | None) -> None:
        simulator().device(device).pool.limit = nbytes

    def pool_used(self, device: int) -> int:
        pool = simulator().device(device).pool
        pool.drain()
        return pool.used

    def free_cached(self, device: int) -> None:
        sim = simulator()
        sim.count_sync()
        sim.device(device).pool.free_cached()

    def capture_gemm(self, device: int) -> Callable[[Any, Any, Any], Any] | str:
        return _xp.gemm

    def graph_pool(self, device: int) -> Pool:
        return Pool(device, simulator().device(device).pool.capacity, private=True)

    @contextlib.contextmanager
    def allocating_from(self, pool: Any) -> Iterator[None]:
        pools = simulator().local.pools
        previous = pools.get(pool.device)
        pools[pool.device] = pool
        try:
            yield
        finally:
            if previous is None:
                del pools[pool.device]
            else:
                pools[pool.device] = previous


_API = SimApi()


def api() -> SimApi:
    """The process-wide simulator binding."""
    return _API
