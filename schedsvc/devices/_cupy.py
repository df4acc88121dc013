"""CuPy's binding of the narrow CUDA API (``_cudaapi.CudaApi``): CuPy itself, nothing added.

Imported only by ``_cudaapi.load(False)``, so CuPy is imported when an engine
uses a real GPU and never by ``import schedsvc``.  CuPy has no type stubs: its
objects are ``Any`` here (pyproject's mypy overrides ignore the missing imports).

What CuPy does that matters to the CUDA device (checked on an H100 with CuPy
14.2, ``docs/cuda-facts.md``): the current stream and device are per host
thread; the memory pool is per device, picked by the current device, so the
pool methods enter ``Device(device)`` first.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, ClassVar

import cupy
import numpy as np

from ._cudaapi import CudaApi

__all__ = ["CupyApi", "api", "device_count"]


def device_count() -> int:
    """CUDA devices CuPy finds (raises CuPy's error without a driver): the availability check, which
    touches nothing else of CuPy's.  ImportError without CuPy (asked anew at each call)."""
    import cupy as found

    return int(found.cuda.runtime.getDeviceCount())


class CupyApi(CudaApi):
    """The CUDA API bound to CuPy: CuPy's streams, events, graphs, arrays and errors."""

    name: ClassVar[str] = "cupy"

    def __init__(self) -> None:
        self.xp = cupy
        self.ndarray = cupy.ndarray
        self.CUDARuntimeError = cupy.cuda.runtime.CUDARuntimeError
        self.OutOfMemoryError = cupy.cuda.memory.OutOfMemoryError

    def __repr__(self) -> str:
        return f"<CupyApi {cupy.__version__}>"

    # -- devices -----------------------------------------------------------------

    def version(self) -> str:
        """What runs the devices: "CuPy 14.2.0, CUDA runtime 13020"."""
        return f"CuPy {cupy.__version__}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}"

    def device_count(self) -> int:
        """How many devices there are (``CUDARuntimeError`` without a driver)."""
        return int(cupy.cuda.runtime.getDeviceCount())

    def device_name(self, device: int) -> str:
        """The device's name as the driver gives it ("NVIDIA H100 80GB HBM3")."""
        name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)

    def device_memory(self, device: int) -> int:
        """Total bytes of device memory."""
        return int(cupy.cuda.Device(device).mem_info[1])

    def use_device(self, device: int) -> None:
        """Make ``device`` current on this thread."""
        cupy.cuda.Device(device).use()

    def begin_launches(self, device: int) -> int:
        """Make ``device`` current on this thread (only if it is not: a call into the runtime either way);
        the device that was current."""
        previous = int(cupy.cuda.runtime.getDevice())
        if previous != device:
            cupy.cuda.runtime.setDevice(device)
        return previous

    def end_launches(self, device: int, began: Any) -> None:
        """Make current again the device that was at ``begin_launches``."""
        if began != device:
            cupy.cuda.runtime.setDevice(began)

    # -- streams and events ------------------------------------------------------

    def stream(self, device: int) -> Any:
        """A new non-blocking stream on ``device`` (one on the legacy null stream would serialise)."""
        with cupy.cuda.Device(device):
            return cupy.cuda.Stream(non_blocking=True)

    def event(self) -> Any:
        """An event whose ``synchronize`` sleeps instead of spinning, without timing."""
        return cupy.cuda.Event(block=True, disable_timing=True)

    def current_stream(self) -> Any:
        """This thread's current stream."""
        return cupy.cuda.get_current_stream()

    # -- memory ------------------------------------------------------------------

    def empty_pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
        """A NumPy array over pinned host memory (from CuPy's pinned pool)."""
        import cupyx  # (CuPy's extras: imported with the first staging buffer)

        array: np.ndarray[Any, Any] = cupyx.empty_pinned(shape, dtype=dtype)
        return array

    def set_pool_limit(self, device: int, nbytes: int | None) -> None:
        """Cap ``device``'s pool (CuPy's size 0 is no cap)."""
        with cupy.cuda.Device(device):
            cupy.get_default_memory_pool().set_limit(size=nbytes or 0)

    def pool_used(self, device: int) -> int:
        """Bytes of ``device``'s pool held by live arrays."""
        with cupy.cuda.Device(device):
            return int(cupy.get_default_memory_pool().used_bytes())

    def free_cached(self, device: int) -> None:
        """Give ``device``'s cached blocks back to the driver (a host sync)."""
        with cupy.cuda.Device(device):
            cupy.get_default_memory_pool().free_all_blocks()

    def graph_pool(self, device: int) -> Any:
        """A ``MemoryPool`` of its own for ``device`` (its arenas per stream, as the default pool's)."""
        with cupy.cuda.Device(device):
            return cupy.cuda.MemoryPool()

    def allocating_from(self, pool: Any) -> contextlib.AbstractContextManager[None]:
        """``cupy.cuda.using_allocator(pool.malloc)``: thread-local, as the current stream is."""
        manager: contextlib.AbstractContextManager[None] = cupy.cuda.using_allocator(pool.malloc)
        return manager


_api: CupyApi | None = None
_api_lock = threading.Lock()


def api() -> CupyApi:
    """The process's CuPy binding, made on first call."""
    global _api
    with _api_lock:
        if _api is None:
            _api = CupyApi()
        return _api
