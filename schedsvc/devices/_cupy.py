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
from collections.abc import Callable
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

    def capture_gemm(self, device: int) -> Callable[[Any, Any, Any], Any] | str:
        """cuBLAS's GEMM through its C API (``_Blas``), once it gave CuPy's matmul's bits on ``device``."""
        with _blas_lock:
            found = _blas.get(device)
            if found is None:
                found = _blas[device] = _Blas.checked(device)
        return found if isinstance(found, str) else found.gemm

    def graph_pool(self, device: int) -> Any:
        """A ``MemoryPool`` of its own for ``device`` (its arenas per stream, as the default pool's)."""
        with cupy.cuda.Device(device):
            return cupy.cuda.MemoryPool()

    def allocating_from(self, pool: Any) -> contextlib.AbstractContextManager[None]:
        """``cupy.cuda.using_allocator(pool.malloc)``: thread-local, as the current stream is."""
        manager: contextlib.AbstractContextManager[None] = cupy.cuda.using_allocator(pool.malloc)
        return manager


_WORKSPACE = 32 << 20  # bytes of cuBLAS workspace per handle (what NVIDIA advises on Hopper)
_N, _T = 0, 1  # cublasOperation_t


def _libcublas() -> Any:
    """The cuBLAS library CuPy loaded (ctypes), found among the process's mapped files."""
    import ctypes

    import cupy_backends.cuda.libs.cublas  # noqa: F401  (loads libcublas)

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcublas.so" in line and "Lt" not in line}
    if not paths:
        raise OSError("libcublas is not mapped into this process")
    lib = ctypes.CDLL(sorted(paths)[0])
    handle, stream, ptr, size, i = (
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
    )
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(handle)]
    lib.cublasSetStream_v2.argtypes = [handle, stream]
    lib.cublasSetWorkspace_v2.argtypes = [handle, ptr, size]
    for name in ("cublasSgemm_v2", "cublasDgemm_v2"):
        getattr(lib, name).argtypes = [handle, i, i, i, i, i, ptr, ptr, i, ptr, i, ptr, ptr, i]
    for name in (
        "cublasCreate_v2",
        "cublasSetStream_v2",
        "cublasSetWorkspace_v2",
        "cublasSgemm_v2",
        "cublasDgemm_v2",
    ):
        getattr(lib, name).restype = ctypes.c_int
    return lib


class _Blas:
    """cuBLAS's GEMM on one device, a handle and a workspace of its own per stream (set before any capture,
    so nothing is set during one).  alpha and beta are host scalars, read at a capture: constants."""

    def __init__(self, device: int) -> None:
        import ctypes

        self.ctypes = ctypes
        self.device = device
        self.lib = _libcublas()
        self.handles: dict[int, tuple[Any, Any]] = {}  # stream pointer -> (handle, workspace)
        self.lock = threading.Lock()
        self.scalars: dict[np.dtype[Any], tuple[Any, Any, Any]] = {
            np.dtype(np.float32): (ctypes.c_float(1.0), ctypes.c_float(0.0), self.lib.cublasSgemm_v2),
            np.dtype(np.float64): (ctypes.c_double(1.0), ctypes.c_double(0.0), self.lib.cublasDgemm_v2),
        }

    @classmethod
    def checked(cls, device: int) -> _Blas | str:
        """The GEMM of ``device``, once it gave CuPy's matmul's bits on a few shapes and layouts (a host
        sync); else why not."""
        try:
            blas = cls(device)
            return blas if (why := blas.differs()) is None else why
        except Exception as exc:  # no cuBLAS of its own here: CuPy's matmul splits the captures
            return f"cuBLAS's C API is not usable here ({type(exc).__name__}: {exc})"

    def differs(self) -> str | None:
        """Why its products are not CuPy's matmul's bits, or None."""
        rng = np.random.default_rng(0)
        with cupy.cuda.Device(self.device):
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                for dtype in self.scalars:
                    for m, k, n in ((1, 512, 256), (64, 128, 2), (7, 33, 5)):
                        a = cupy.asarray(rng.standard_normal((m, k)).astype(dtype))
                        b = cupy.asarray(rng.standard_normal((k, n)).astype(dtype))
                        for x, y in ((a, b), (a, cupy.asfortranarray(b)), (cupy.asfortranarray(a), b)):
                            ours, theirs = self.gemm(x, y, stream), cupy.matmul(x, y)
                            stream.synchronize()
                            if ours.tobytes() != theirs.tobytes():
                                return (
                                    f"cuBLAS through its C API gives other bits than CuPy's matmul here "
                                    f"({dtype} {m}x{k}x{n})"
                                )
        return None

    def handle(self, stream: Any) -> Any:
        """The handle of ``stream`` (made, with its workspace, the first time: not during a capture)."""
        found = self.handles.get(stream.ptr)
        if found is not None:
            return found[0]
        ctypes = self.ctypes
        with self.lock, cupy.cuda.Device(self.device):
            handle = ctypes.c_void_p()
            _ok(self.lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
            _ok(self.lib.cublasSetStream_v2(handle, ctypes.c_void_p(stream.ptr)), "cublasSetStream")
            workspace = cupy.empty(_WORKSPACE, dtype=np.uint8)
            _ok(
                self.lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(workspace.data.ptr), _WORKSPACE),
                "cublasSetWorkspace",
            )
            self.handles[stream.ptr] = (handle, workspace)
        return handle

    def gemm(self, a: Any, b: Any, stream: Any) -> Any:
        """``a @ b`` (2-D, one float dtype, each C- or F-contiguous) enqueued on ``stream``.

        cuBLAS is column-major: a C-contiguous m x k array is, to it, its k x m transpose.  So the row-major
        ``c = a @ b`` is the column-major ``c.T = b.T @ a.T``, with each operand passed as stored (N) when
        it is C-contiguous, or transposed (T) when it is F-contiguous."""
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2 or a.dtype != b.dtype or a.dtype not in self.scalars:
            raise ValueError(f"gemm: {a.dtype}{a.shape} @ {b.dtype}{b.shape}")
        opa, lda = (_N, k) if a.flags.c_contiguous else (_T, m) if a.flags.f_contiguous else (-1, 0)
        opb, ldb = (_N, n) if b.flags.c_contiguous else (_T, k) if b.flags.f_contiguous else (-1, 0)
        if opa < 0 or opb < 0:
            raise ValueError("gemm: each operand C- or F-contiguous")
        one, zero, fn = self.scalars[a.dtype]
        handle = self.handle(stream)
        c = cupy.empty((m, n), dtype=a.dtype)
        byref, ptr = self.ctypes.byref, self.ctypes.c_void_p
        status = fn(
            handle, opb, opa, n, m, k, byref(one), ptr(b.data.ptr), ldb, ptr(a.data.ptr), lda, byref(zero),
            ptr(c.data.ptr), n,
        )  # fmt: skip
        _ok(status, "cublas gemm")
        return c


def _ok(status: int, what: str) -> None:
    """Raise unless cuBLAS said CUBLAS_STATUS_SUCCESS."""
    if status != 0:
        raise RuntimeError(f"{what} failed: cuBLAS status {status}")


_blas: dict[int, _Blas | str] = {}  # device -> its GEMM, or why it has none
_blas_lock = threading.Lock()

_api: CupyApi | None = None
_api_lock = threading.Lock()


def api() -> CupyApi:
    """The process's CuPy binding, made on first call."""
    global _api
    with _api_lock:
        if _api is None:
            _api = CupyApi()
        return _api
