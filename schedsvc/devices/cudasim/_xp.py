"""The simulated array module (``api().xp``): CuPy's names, each operation a kernel on the current stream.

Ufuncs with one output are looked up by name (module ``__getattr__``).  A
result's shape and dtype come from explicit rules (broadcasting, reductions,
matmul) with the dtype read off size-1 dummies, or, for the rest, from
zero-strided dummies of the inputs' shapes; the real data is only read by the
kernel, on the stream's thread.
"""

from __future__ import annotations

import builtins
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from ._array import Device, _reject_host, empty, launch, ndarray
from ._errors import CUDARuntimeError, OutOfMemoryError
from ._sim import simulator
from ._stream import Event, Graph, Stream, current_stream

NDArray = np.ndarray[Any, Any]

bool_ = np.bool_
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float16, float32, float64 = np.float16, np.float32, np.float64
complex64, complex128 = np.complex64, np.complex128
intp, dtype, newaxis = np.intp, np.dtype, None
pi, e, inf, nan = np.pi, np.e, np.inf, np.nan


class ufunc:
    """A NumPy ufunc with one output, run as a kernel on the current stream."""

    def __init__(self, np_ufunc: np.ufunc) -> None:
        self._ufunc = np_ufunc
        self.__name__ = np_ufunc.__name__
        self.nin = np_ufunc.nin
        self.nout = 1

    def __repr__(self) -> str:
        return f"<cudasim ufunc '{self.__name__}'>"

    def __call__(self, *args: Any, out: ndarray | None = None, dtype: Any = None, **kwargs: Any) -> ndarray:
        if len(args) != self.nin:
            raise TypeError(
                f"{self.__name__}() takes {self.nin} positional arguments but {len(args)} were given"
            )
        _reject_host(args)
        shape = np.broadcast_shapes(*(_shape_of(a) for a in args))
        dummies = [_tiny(a) for a in args]
        out_dummy = None if out is None else np.ones((1,) * builtins.max(out.ndim, len(shape)), out.dtype)
        if kwargs.pop("where", True) is not True:
            raise NotImplementedError("cudasim ufuncs do not take where=")
        with np.errstate(all="ignore"):
            probe = self._ufunc(*dummies, out=out_dummy, dtype=dtype, **kwargs)
        if out is None:
            out = empty(shape, probe.dtype)
        elif not isinstance(out, ndarray):
            raise TypeError(f"out must be a cupy ndarray, not {type(out)}")
        elif np.broadcast_shapes(shape, out.shape) != out.shape:
            raise ValueError(f"non-broadcastable output operand with shape {out.shape} doesn't match {shape}")
        fn, kw = self._ufunc, dict(kwargs, dtype=dtype)
        launch(self.__name__, lambda *xs: fn(*xs, **kw), args, {}, out)
        return out


def _shape_of(value: Any) -> tuple[int, ...]:
    return value.shape if isinstance(value, ndarray) else np.shape(value)


def _tiny(value: Any) -> Any:
    """A size-1 stand-in of a device array with its dtype and ndim (Python scalars stay weak)."""
    if isinstance(value, ndarray):
        return np.ones((1,) * value.ndim, value.dtype)
    return value


_ufuncs: dict[str, ufunc] = {}


def __getattr__(name: str) -> Any:
    """NumPy's one-output ufuncs, by name."""
    found = _ufuncs.get(name)
    if found is not None:
        return found
    candidate = getattr(np, name, None)
    if isinstance(candidate, np.ufunc) and candidate.nout == 1:
        found = _ufuncs[name] = ufunc(candidate)
        return found
    raise AttributeError(f"module 'cudasim.xp' has no attribute {name!r}")


def _require(a: Any) -> ndarray:
    if isinstance(a, ndarray):
        return a
    _reject_host([a])
    return asarray(a)


# -- reductions ----------------------------------------------------------------------------


def _reduction(
    np_fn: Callable[..., Any], takes_dtype: bool, single_axis: bool = False
) -> Callable[..., ndarray]:
    def reduce(
        a: Any,
        axis: Any = None,
        dtype: Any = None,
        out: ndarray | None = None,
        keepdims: bool = False,
        **kw: Any,
    ) -> ndarray:
        a = _require(a)
        kwargs: dict[str, Any] = dict(kw, axis=axis, keepdims=keepdims)
        if takes_dtype:
            kwargs["dtype"] = dtype
        if a.size == 0:
            with np.errstate(all="ignore"):
                probe = np.asarray(np_fn(np.empty(a.shape, a.dtype), **kwargs))
            shape = probe.shape
        else:
            axes = tuple(range(a.ndim)) if axis is None else normalize_axis_tuple(axis, a.ndim)
            if single_axis and axis is not None and not isinstance(axis, int | np.integer):
                raise TypeError("'tuple' object cannot be interpreted as an integer")
            shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape) if keepdims or i not in axes)
            with np.errstate(all="ignore"):
                probe = np.asarray(np_fn(np.ones((1,) * a.ndim, a.dtype), **kwargs))
        if out is None:
            out = empty(shape, probe.dtype)
        launch(np_fn.__name__, lambda x: np_fn(x, **kwargs), (a,), {}, out)
        return out

    reduce.__name__ = np_fn.__name__
    return reduce


sum = _reduction(np.sum, True)
mean = _reduction(np.mean, True)
prod = _reduction(np.prod, True)
std = _reduction(np.std, True)
var = _reduction(np.var, True)
max = _reduction(np.max, False)
min = _reduction(np.min, False)
amax, amin = max, min
any = _reduction(np.any, False)
all = _reduction(np.all, False)
argmax = _reduction(np.argmax, False, single_axis=True)
argmin = _reduction(np.argmin, False, single_axis=True)


# -- linear algebra -----------------------------------------------------------------------


def _no_cublas_in_capture() -> None:
    if current_stream().capturing:
        raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")


def _matmul_shape(sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[int, ...]:
    if not sa or not sb:
        raise ValueError("matmul: Input operand does not have enough dimensions")
    a2 = (1, *sa) if len(sa) == 1 else sa
    b2 = (*sb, 1) if len(sb) == 1 else sb
    if a2[-1] != b2[-2]:
        raise ValueError(
            "matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
            f"(n?,k),(k,m?)->(n?,m?) (size {b2[-2]} is different from {a2[-1]})"
        )
    shape = (*np.broadcast_shapes(a2[:-2], b2[:-2]), a2[-2], b2[-1])
    if len(sb) == 1:
        shape = shape[:-1]
    if len(sa) == 1:
        shape = (*shape[:-2], shape[-1]) if len(sb) > 1 else shape[:-1]
    return shape


def _product_dtype(a: ndarray, b: ndarray) -> np.dtype[Any]:
    result: np.dtype[Any] = np.matmul(np.ones((1, 1), a.dtype), np.ones((1, 1), b.dtype)).dtype
    return result


def matmul(a: Any, b: Any, out: ndarray | None = None, **kwargs: Any) -> ndarray:
    """Matrix product (cuBLAS: refused during capture, as CuPy 14.2 does)."""
    a, b = _require(a), _require(b)
    _no_cublas_in_capture()
    shape = _matmul_shape(a.shape, b.shape)
    out = empty(shape, _product_dtype(a, b)) if out is None else out
    launch("matmul", np.matmul, (a, b), {}, out)
    return out


def gemm(a: Any, b: Any, stream: Stream) -> ndarray:
    """``a @ b`` through cuBLAS's C API on a handle of one's own set to ``stream`` (``CudaApi.capture_gemm``):
    2-D operands of one float dtype, each C- or F-contiguous; enqueued on ``stream``, while it captures too."""
    a, b = _require(a), _require(b)
    if a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype or a.dtype.kind != "f" or a.dtype.itemsize < 4:
        raise ValueError(
            f"gemm: 2-D float32 or float64 operands of one dtype, got {a.dtype}{a.shape} @ {b.dtype}{b.shape}"
        )
    for x in (a, b):
        if not (x.flags.c_contiguous or x.flags.f_contiguous):
            raise ValueError("gemm: each operand C- or F-contiguous")
    out = empty(_matmul_shape(a.shape, b.shape), a.dtype)
    launch("gemm", np.matmul, (a, b), {}, out, stream=stream)
    return out


def dot(a: Any, b: Any, out: ndarray | None = None) -> ndarray:
    """Dot product with NumPy's rules."""
    a, b = _require(a), _require(b)
    if a.ndim == 0 or b.ndim == 0:
        result: ndarray = __getattr__("multiply")(a, b, out=out)
        return result
    _no_cublas_in_capture()
    if a.ndim <= 2 and b.ndim <= 2:
        shape = _matmul_shape(a.shape, b.shape)
    else:
        inner = b.shape[-2] if b.ndim >= 2 else b.shape[-1]
        if a.shape[-1] != inner:
            raise ValueError(
                f"shapes {a.shape} and {b.shape} not aligned: {a.shape[-1]} (dim {a.ndim - 1}) != {inner}"
            )
        shape = a.shape[:-1] + b.shape[:-2] + b.shape[-1:] if b.ndim >= 2 else a.shape[:-1]
    out = empty(shape, _product_dtype(a, b)) if out is None else out
    launch("dot", np.dot, (a, b), {}, out)
    return out


def tensordot(a: Any, b: Any, axes: Any = 2) -> ndarray:
    a, b = _require(a), _require(b)
    _no_cublas_in_capture()
    return _generic(np.tensordot, (a, b), {"axes": axes})


def outer(a: Any, b: Any) -> ndarray:
    return _generic(np.outer, (_require(a), _require(b)), {})


# -- shape functions and the rest -------------------------------------------------------------


def _zero_strided(value: Any) -> Any:
    if isinstance(value, ndarray):
        return np.broadcast_to(np.zeros((), value.dtype), value.shape)
    if isinstance(value, list | tuple):
        return type(value)(_zero_strided(v) for v in value)
    return value


def _generic(np_fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> ndarray:
    """A kernel whose output shape and dtype come from running ``np_fn`` on zero-strided dummies."""
    _reject_host(list(args) + list(kwargs.values()))
    with np.errstate(all="ignore"):
        probe = np.asarray(
            np_fn(*_zero_strided(tuple(args)), **{k: _zero_strided(v) for k, v in kwargs.items()})
        )
    out = empty(probe.shape, probe.dtype)
    launch(np_fn.__name__, np_fn, args, kwargs, out)
    return out


def concatenate(
    arrays: Sequence[Any], axis: int | None = 0, out: ndarray | None = None, dtype: Any = None
) -> ndarray:
    return _generic(np.concatenate, (list(arrays),), {"axis": axis, "dtype": dtype})


def stack(arrays: Sequence[Any], axis: int = 0, out: ndarray | None = None, dtype: Any = None) -> ndarray:
    return _generic(np.stack, (list(arrays),), {"axis": axis, "dtype": dtype})


def where(condition: Any, x: Any = None, y: Any = None) -> ndarray:
    if x is None or y is None:
        raise NotImplementedError("cudasim.where needs x and y (the one-argument form depends on the data)")
    return _generic(np.where, (condition, x, y), {})


def clip(a: Any, a_min: Any = None, a_max: Any = None, out: ndarray | None = None, **kwargs: Any) -> ndarray:
    return _generic(np.clip, (_require(a), a_min, a_max), {})


def reshape(a: Any, shape: Any = None, order: str = "C", *, newshape: Any = None) -> ndarray:
    result: ndarray = _require(a).reshape(shape if newshape is None else newshape, order=order)
    return result


def transpose(a: Any, axes: Any = None) -> ndarray:
    return _require(a).transpose(axes) if axes is not None else _require(a).transpose()


def ravel(a: Any, order: str = "C") -> ndarray:
    return _require(a).ravel(order)


def squeeze(a: Any, axis: Any = None) -> ndarray:
    return _require(a).squeeze(axis)


def swapaxes(a: Any, axis1: int, axis2: int) -> ndarray:
    return _require(a).swapaxes(axis1, axis2)


def expand_dims(a: Any, axis: int) -> ndarray:
    x = _require(a)
    return x._view(np.expand_dims(x._np, axis))


def broadcast_to(a: Any, shape: Any) -> ndarray:
    x = _require(a)
    return x._view(np.broadcast_to(x._np, shape))


def copy(a: Any, order: str = "C") -> ndarray:
    return _require(a).copy(order=order)


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    x = _require(a)
    if x._np.flags.c_contiguous and (dtype is None or np.dtype(dtype) == x.dtype):
        return x
    return x.astype(x.dtype if dtype is None else dtype)


def round(a: Any, decimals: int = 0, out: ndarray | None = None) -> ndarray:
    return _generic(np.round, (_require(a),), {"decimals": decimals})


around = round


# -- creation and transfers ------------------------------------------------------------------


def _filled(shape: Any, dtype: Any, value: Any) -> ndarray:
    out = empty(shape, dtype)
    launch("fill", lambda: value, (), {}, out, reads=())
    return out


def zeros(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _filled(shape, dtype, 0)


def ones(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _filled(shape, dtype, 1)


def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C") -> ndarray:
    if isinstance(fill_value, ndarray):
        out = empty(shape, fill_value.dtype if dtype is None else dtype)
        launch("fill", lambda v: v, (fill_value,), {}, out)
        return out
    return _filled(shape, np.asarray(fill_value).dtype if dtype is None else dtype, fill_value)


def _like(a: Any, dtype: Any, shape: Any) -> tuple[Any, Any]:
    return (a.shape if shape is None else shape), (a.dtype if dtype is None else dtype)


def empty_like(a: Any, dtype: Any = None, order: str = "K", subok: Any = None, shape: Any = None) -> ndarray:
    return empty(*_like(a, dtype, shape))


def zeros_like(a: Any, dtype: Any = None, order: str = "K", subok: Any = None, shape: Any = None) -> ndarray:
    return zeros(*_like(a, dtype, shape))


def ones_like(a: Any, dtype: Any = None, order: str = "K", subok: Any = None, shape: Any = None) -> ndarray:
    return ones(*_like(a, dtype, shape))


def full_like(
    a: Any, fill_value: Any, dtype: Any = None, order: str = "K", subok: Any = None, shape: Any = None
) -> ndarray:
    shape, dtype = _like(a, dtype, shape)
    return full(shape, fill_value, dtype)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> ndarray:
    values = (
        np.arange(start, stop, step, dtype=dtype)
        if stop is not None
        else np.arange(start, step=step, dtype=dtype)
    )
    out = empty(values.shape, values.dtype)
    launch("arange", lambda: values, (), {}, out, reads=())
    return out


def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, dtype: Any = None) -> ndarray:
    values = np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype)
    out = empty(values.shape, values.dtype)
    launch("linspace", lambda: values, (), {}, out, reads=())
    return out


def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    """A device array of ``a``: itself if it is one, else a synchronous host-to-device copy (a host sync)."""
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    host = np.array(a, dtype=dtype)
    out = empty(host.shape, host.dtype)
    out.set(host)
    return out


def array(
    obj: Any, dtype: Any = None, copy: bool = True, order: str = "K", subok: bool = False, ndmin: int = 0
) -> ndarray:
    """A device array of ``obj``: a copy of a device array (a peer copy across devices), or an upload."""
    if not isinstance(obj, ndarray):
        return asarray(obj, dtype)
    if (
        not copy
        and (dtype is None or np.dtype(dtype) == obj.dtype)
        and obj.device.id == current_stream().device_id
    ):
        return obj
    out = empty(obj.shape, obj.dtype if dtype is None else dtype)
    _peer_copy(obj, out)
    return out


def _peer_copy(src: ndarray, out: ndarray) -> None:
    """Copy ``src`` (any device) into ``out`` on the current stream; it reads ``src``'s block."""
    from ._stream import Op

    source, target = src._np, out._np
    kind = "kernel copy" if src._block.device == out._block.device else "peer copy"
    current_stream().submit(
        Op(kind, lambda: np.copyto(target, source, casting="unsafe"), (src._block,), (out._block,))
    )


def asnumpy(
    a: Any, stream: Stream | None = None, order: str = "C", out: NDArray | None = None, blocking: bool = True
) -> NDArray:
    """``a`` on the host (a host sync)."""
    if isinstance(a, ndarray):
        return a.get(stream=stream, out=out, blocking=blocking)
    return np.asarray(a)


def get_array_module(*args: Any) -> types.ModuleType:
    import sys

    return sys.modules[__name__] if builtins.any(isinstance(a, ndarray) for a in args) else np


# -- the ``cuda`` namespace ----------------------------------------------------------------------


def _get_current_stream() -> Stream:
    return current_stream()


def _device_synchronize() -> None:
    Device().synchronize()


def _device_count() -> int:
    return len(simulator().devices)


cuda = types.SimpleNamespace(
    Stream=Stream,
    Event=Event,
    Device=Device,
    Graph=Graph,
    get_current_stream=_get_current_stream,
    runtime=types.SimpleNamespace(
        CUDARuntimeError=CUDARuntimeError,
        getDeviceCount=_device_count,
        deviceSynchronize=_device_synchronize,
    ),
    memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
    is_available=lambda: True,
)
