"""The narrow CUDA API the CUDA device (``CudaDevice``) is written against, bound to CuPy or to the simulator.

Everything the device needs from CUDA goes through one ``CudaApi`` object:
devices, streams, events, host callbacks, pinned and device memory, copies,
graph capture, the error classes, and the array module kernels run with.
Two bindings implement it:

- ``_cupy.CupyApi`` -- CuPy itself (the only module that imports CuPy);
- ``cudasim.SimApi`` -- the CUDA simulator (``Config(cuda_simulator=True)``):
  strict and asynchronous, a thread per stream, no host view of device
  memory, an enqueue-time race detector (``cudasim/__init__.py``).

Streams, events and graphs are the binding's own objects, used with CuPy's
names and meaning, and nothing more:

``Stream`` (``api.stream(device)``, made non-blocking on that device)
    ``with stream:`` makes it this thread's current stream (kernels and
    allocations go to it); ``stream.wait_event(event)`` orders the stream's
    later work after the event's *current* record (a never-recorded event: no
    wait); ``stream.launch_host_func(fn, arg)`` runs ``fn(arg)`` on a driver
    thread when the stream gets there (no CUDA call may be made in it; it
    blocks the stream until it returns; its exceptions are lost);
    ``stream.synchronize()`` (a host sync); ``stream.begin_capture()`` and
    ``stream.end_capture() -> Graph``.

``Event`` (``api.event()``: ``Event(block=True, disable_timing=True)``)
    ``event.record(stream)``; ``event.synchronize()`` blocks the calling
    thread without spinning until the last record passed (a host sync: not on
    a launching thread); ``event.done`` (True for a never-recorded event).

``Graph`` (from ``end_capture``)
    ``graph.launch(stream)`` replays the captured work on ``stream``.

Device arrays are the binding's ``ndarray`` (``cupy.ndarray`` or the
simulator's).  They have ``shape``, ``dtype``, ``nbytes``, ``base`` (the array
a view was made from), ``device.id``, ``data.ptr`` (device address: views of
one allocation share its memory, keyed by ``api.buffer_key``), and
``get``/``set`` as CuPy has them.  ``numpy.asarray`` of one raises
``TypeError``; ``item()``, ``get()``, ``float()``, ``bool()``, ``repr()`` are
host syncs.  The array module ``xp`` has CuPy's names for what it covers
(ufuncs, ``matmul``/``dot``, reductions, ``reshape``/``transpose``,
``concatenate``/``stack``, ``where``/``clip``, creation functions,
``asarray``, ``asnumpy``); its functions enqueue on the current stream of the
current device.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np

from .._errors import DeviceError

__all__ = ["CudaApi", "api_for", "binding_of", "check", "load"]


class CudaApi:
    """What the CUDA device may use; one instance per process and binding."""

    #: "cupy" or "simulator"
    name: ClassVar[str] = ""
    #: the array module kernels run with (``cupy``, or the simulator's)
    xp: Any
    #: the device array type (a buffer type of the device)
    ndarray: type
    #: errors: a CUDA call failed (``.status``); the device memory pool could not allocate
    #: (a ``MemoryError``); the driver failed
    CUDARuntimeError: type[Exception]
    OutOfMemoryError: type[MemoryError]

    # -- devices -----------------------------------------------------------------

    def version(self) -> str:
        """What runs the devices, for ``schedsvc info`` ("CuPy 14.2.0, CUDA runtime 13020")."""
        raise NotImplementedError

    def device_count(self) -> int:
        """How many devices there are (raises ``CUDARuntimeError`` without a driver)."""
        raise NotImplementedError

    def device_name(self, device: int) -> str:
        """The device's name ("NVIDIA H100 80GB HBM3", "simulated device 0")."""
        raise NotImplementedError

    def device_memory(self, device: int) -> int:
        """Total bytes of device memory."""
        raise NotImplementedError

    def use_device(self, device: int) -> None:
        """Make ``device`` current on this thread (every launching and watching thread calls it)."""
        raise NotImplementedError

    def launching_thread(self) -> None:
        """This thread launches work: it must never wait for the device (the simulator can forbid and
        counts its host syncs; CuPy: nothing)."""

    def begin_launches(self, device: int) -> Any:
        """This thread launches work on ``device`` until ``end_launches``: make it current (what to restore
        is returned).  The simulator counts this thread's host syncs as a launching thread's meanwhile, and
        may forbid them."""
        raise NotImplementedError

    def end_launches(self, device: int, began: Any) -> None:
        """This thread's launches on ``device`` are over: its current device is again the one it had at
        ``begin_launches`` (which returned ``began``)."""
        raise NotImplementedError

    def host_syncs(self) -> int:
        """Host syncs this thread has made (the simulator counts them; on CuPy nothing can: 0)."""
        return 0

    def device_of(self, array: Any) -> int:
        """The device a device array lives on."""
        return int(array.device.id)

    # -- streams and events ------------------------------------------------------

    def stream(self, device: int) -> Any:
        """A new non-blocking stream on ``device``."""
        raise NotImplementedError

    def event(self) -> Any:
        """A new ``Event(block=True, disable_timing=True)``: a waiter sleeps, it does not spin."""
        raise NotImplementedError

    def close_streams(self, streams: list[Any], timeout: float | None) -> list[threading.Thread]:
        """No work will be enqueued on ``streams`` again: let go of what runs them, waiting up to
        ``timeout``; the threads still running them (CuPy's streams are the driver's: none)."""
        return []

    def current_stream(self) -> Any:
        """This thread's current stream."""
        raise NotImplementedError

    # -- memory and copies -------------------------------------------------------

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A device array on the current device, allocated from the pool on the current stream."""
        return self.xp.empty(shape, dtype)

    def empty_pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
        """A NumPy array in pinned (page-locked) host memory: copies from or to it are asynchronous."""
        raise NotImplementedError

    def h2d(self, dst: Any, src: np.ndarray[Any, Any], stream: Any) -> None:
        """Enqueue the copy of pinned ``src`` into device array ``dst`` on ``stream``; it reads ``src``
        when it runs (keep ``src`` alive and unwritten until an event after it passed)."""
        dst.set(src, stream=stream)

    def d2h(self, src: Any, dst: np.ndarray[Any, Any], stream: Any) -> None:
        """Enqueue the copy of device array ``src`` into pinned ``dst`` on ``stream`` (asynchronous:
        ``dst`` holds it once an event after it passed)."""
        src.get(out=dst, blocking=False, stream=stream)

    def copy(self, src: Any) -> Any:
        """A copy of ``src`` on the current device and stream (across devices: a peer copy; the
        source must be complete)."""
        return self.xp.array(src, copy=True)

    def buffer_key(self, array: Any) -> tuple[int, int]:
        """(key, nbytes) of the allocation ``array`` lives in: the same for every view of it."""
        owner = array
        while owner.base is not None:
            owner = owner.base
        return owner.data.ptr, owner.nbytes

    def set_pool_limit(self, device: int, nbytes: int | None) -> None:
        """Cap ``device``'s memory pool (``None``: no cap beyond the device)."""
        raise NotImplementedError

    def pool_used(self, device: int) -> int:
        """Bytes of ``device``'s pool in use by live arrays."""
        raise NotImplementedError

    def free_cached(self, device: int) -> None:
        """Give ``device``'s cached free blocks back (a host sync: never on a launching thread)."""
        raise NotImplementedError

    # -- capture -------------------------------------------------------------

    #: NumPy functions whose array-module versions call a library CuPy 14.2 refuses to call while the
    #: stream captures (cuBLAS: ``NotImplementedError``, even warmed up; docs/cuda-facts.md)
    refused_in_capture: ClassVar[frozenset[Any]] = frozenset({np.matmul, np.dot})
    #: the dtypes ``capture_gemm`` multiplies
    gemm_dtypes: ClassVar[frozenset[np.dtype[Any]]] = frozenset({np.dtype(np.float32), np.dtype(np.float64)})

    def capture_gemm(self, device: int) -> Callable[[Any, Any, Any], Any] | str:
        """A matrix product that a stream capture can hold, or why there is none (a sentence).

        ``gemm(a, b, stream)``: ``a @ b`` of two 2-D device arrays of one dtype of ``gemm_dtypes``, each
        C- or F-contiguous, enqueued on ``stream`` -- during its capture too -- into a new C-contiguous
        array (allocated as ``empty`` allocates).  cuBLAS through its C API, with a handle and a workspace
        of its own per stream, set to the stream before any capture: CuPy's own cuBLAS calls set their
        stream at each call, which a capture refuses.  Its results are CuPy ``matmul``'s bit for bit
        (checked once, with a host sync, the first time it is asked for: where they are not, there is
        none)."""
        return f"{self.name} has no matrix product a capture can hold"

    def graph_pool(self, device: int) -> Any:
        """A memory pool of its own for ``device`` (``cupy.cuda.MemoryPool()``): what a capture allocates
        from it is never handed to anyone but later allocations from the same pool."""
        raise NotImplementedError

    def allocating_from(self, pool: Any) -> contextlib.AbstractContextManager[None]:
        """In the block, this thread's allocations on ``pool``'s device come from ``pool``."""
        raise NotImplementedError

    @contextlib.contextmanager
    def capturing(self, stream: Any) -> Iterator[list[Any]]:
        """Capture the work enqueued on ``stream`` in the block; the list then holds the ``Graph``.  If the
        block raises, the capture is ended (its own error, 901 for an invalidated capture, dropped: the
        block's error says why) and the block's error propagates."""
        out: list[Any] = []
        stream.begin_capture()
        try:
            yield out
        except BaseException:
            with contextlib.suppress(Exception):
                stream.end_capture()
            raise
        out.append(stream.end_capture())


_loaded: dict[type, CudaApi] = {}  # device array type -> its binding, for each binding loaded


def load(simulated: bool) -> CudaApi:
    """The process's binding: the simulator's, or CuPy's (raises ImportError without CuPy)."""
    if simulated:
        from .cudasim import api as sim_api

        api: CudaApi = sim_api()
    else:
        from ._cupy import api as cupy_api

        api = cupy_api()
    _loaded.setdefault(api.ndarray, api)
    return api


def binding_of(array: Any) -> CudaApi | None:
    """The loaded binding whose device array ``array`` is (None: not a device array)."""
    return _loaded.get(type(array))


def api_for(simulated: bool) -> CudaApi:
    """The binding for ``cuda_simulator``; DeviceError (saying how to get CuPy) without it."""
    try:
        return load(simulated)
    except ImportError as exc:
        raise DeviceError(
            "CUDA devices are unavailable: CuPy is not installed; pip install 'schedsvc[cuda12]' "
            "(or [cuda13]) on a machine with an NVIDIA GPU, or run them on the CUDA simulator "
            "(Config(cuda_simulator=True) or SCHEDSVC_CUDA_SIMULATOR=1)"
        ) from exc


def check(index: int, simulated: bool = False) -> None:
    """Raise DeviceError unless device ``index`` exists (on CuPy, or on the simulator)."""
    if simulated:  # the simulator has the devices the engine names
        from .cudasim import simulator

        sim = simulator()
        if index >= api_for(True).device_count():
            sim.configure(devices=index + 1)
        return
    try:
        from ._cupy import device_count  # the binding: the one module that imports CuPy

        count = device_count()
    except ImportError as exc:
        raise DeviceError(
            f"cuda:{index} is unavailable: CuPy is not installed; pip install 'schedsvc[cuda12]' "
            "(or [cuda13]) on a machine with an NVIDIA GPU, or run cuda devices on the CUDA simulator "
            "(Config(cuda_simulator=True) or SCHEDSVC_CUDA_SIMULATOR=1)"
        ) from exc
    except Exception as exc:  # CUDA driver missing or broken
        raise DeviceError(f"cuda:{index} is unavailable: CUDA reports {exc}") from exc
    if index >= count:
        raise DeviceError(f"cuda:{index} does not exist: this machine has {count} CUDA device(s)")
