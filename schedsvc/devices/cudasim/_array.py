"""The simulated device array: a NumPy view into a pool block, with no host view.

Every operation that touches data is a stream operation (``launch``): the
output array is allocated at once (its shape and dtype come from explicit
rules or from tiny dummy arrays, never from the real data) and filled when
the stream runs the kernel.  Reading data on the host (``get``, ``item``,
``float``, ``repr``, ...) is a counted host sync on the current stream.
"""

from __future__ import annotations

import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ._memory import Block, is_pinned, rounded
from ._sim import caller_site, simulator
from ._stream import Op, Stream, current_stream, null_stream, order

__all__ = ["Device", "MemoryPointer", "allocate", "launch", "ndarray", "sentinel_fill", "to_numpy_args"]

NDArray = np.ndarray[Any, Any]
_NO_HOST_VIEW = "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array explicitly."
_CAPTURE_D2H = "the current stream is capturing, so D2H transfers are disallowed"
_SCALAR_ONLY = "only 0-dimensional arrays can be converted to Python scalars"


class Device:
    """A simulated device, as ``cupy.cuda.Device``: ``id``, ``use()``, a context manager."""

    def __init__(self, device: int | None = None) -> None:
        self.id = simulator().local.device if device is None else int(device)
        self._previous: list[int] = []

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("cudasim.Device", self.id))

    def __int__(self) -> int:
        return self.id

    def use(self) -> None:
        """Make this device current on this thread."""
        simulator().use_device(self.id)

    def __enter__(self) -> Device:
        self._previous.append(simulator().local.device)
        self.use()
        return self

    def __exit__(self, *exc: object) -> None:
        simulator().use_device(self._previous.pop())

    def synchronize(self) -> None:
        """Wait for every stream of this device (a host sync; during a capture: 900, invalidating it)."""
        sim = simulator()
        streams = [s for s in list(sim.streams) if s.device_id == self.id]
        capturing = [s for s in streams if s._capture is not None]
        if capturing:
            sim.count_sync()
            for stream in capturing:
                assert stream._capture is not None
                stream._capture.invalid = True
            raise _cuda_error(900)
        sim.count_sync()
        for stream in streams:
            stream.wait_all()


def _current_on(device: int) -> Stream:
    """This thread's current stream on ``device``, as CuPy's ``get``/``set`` take it inside ``with
    array.device``: the current stream if it is on that device, else that device's null stream."""
    stream = current_stream()
    return stream if stream.device_id == device else null_stream(device)


def _cuda_error(status: int) -> Exception:
    from ._errors import CUDARuntimeError

    return CUDARuntimeError(status)


class MemoryPointer:
    """``array.data``: the device address of the array's first element."""

    __slots__ = ("device_id", "ptr")

    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr = ptr
        self.device_id = device_id

    def __repr__(self) -> str:
        return f"<MemoryPointer {self.ptr:#x} device={self.device_id}>"


def allocate(nbytes: int, stream: Stream) -> Block:
    """A block for ``nbytes`` on ``stream``'s device, from its arena (a reuse is a write on it)."""
    sim = simulator()
    sim.check_thread()
    state = sim.device(stream.device_id)
    state.check()
    if nbytes == 0:  # as CuPy: no memory, address 0, never pooled
        return Block(state.id, 0, 0, stream.id, generation=-1)
    size = rounded(nbytes)
    sim.take_allocation_failure(size, state.id)
    pool = sim.local.pools.get(state.id) or state.pool  # a private pool this thread allocates from
    block = pool.take(stream.id, size)
    if block is not None:
        try:
            with sim.lock:
                order(stream, (), (block,), caller_site(), "pool reuse (allocation)")
        except BaseException:
            pool.give_back(block)
            raise
        return block
    if not pool.room(size):
        sim.count_sync()  # CuPy frees its cached blocks (and synchronises) before it gives up
        pool.free_cached()
        if not pool.room(size):
            from ._errors import OutOfMemoryError

            raise OutOfMemoryError(size, pool.total(), pool.limit)
    return pool.new_block(stream.id, size)


class ndarray:
    """A simulated device array (see the module docstring)."""

    __array_priority__ = 100.0
    __hash__ = None  # type: ignore[assignment]

    _block: Block
    _np: NDArray
    base: ndarray | None

    def __init__(
        self, shape: Any, dtype: Any = float, memptr: Any = None, strides: Any = None, order: str = "C"
    ) -> None:
        stream = current_stream()
        shape = _shape(shape)
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        block = allocate(nbytes, stream)
        view = block.buffer[:nbytes].view(dt).reshape(shape, order="F" if order == "F" else "C")
        self._setup(block, view, None)
        if block.pool is not None:
            weakref.finalize(self, block.pool.release, block)
            stream.allocated_in_capture(block)

    def _setup(self, block: Block, view: NDArray, base: ndarray | None) -> None:
        self._block = block
        self._np = view
        self.base = base

    def _view(self, view: NDArray) -> ndarray:
        """A device array over ``view`` (a NumPy view of this array's block)."""
        out = ndarray.__new__(ndarray)
        out._setup(self._block, view, self if self.base is None else self.base)
        return out

    # -- attributes -------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return tuple(self._np.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The element type."""
        return np.dtype(self._np.dtype)

    @property
    def strides(self) -> tuple[int, ...]:
        """Bytes to step in each dimension."""
        return tuple(self._np.strides)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return int(self._np.ndim)

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(self._np.size)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return int(self._np.itemsize)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements."""
        return int(self._np.nbytes)

    @property
    def device(self) -> Device:
        """The device the array lives on."""
        return Device(self._block.device)

    @property
    def data(self) -> MemoryPointer:
        """The (fake) device address of the first element."""
        offset = int(self._np.__array_interface__["data"][0]) - int(self._block.buffer.ctypes.data)
        return MemoryPointer(self._block.ptr + offset, self._block.device)

    @property
    def T(self) -> ndarray:
        """The transposed view."""
        return self.transpose()

    @property
    def flags(self) -> Any:
        """NumPy's flags of the view (contiguity)."""
        return self._np.flags

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator[ndarray]:
        for i in range(len(self)):
            yield self[i]

    # -- no host view -----------------------------------------------------------------------

    def __array__(self, dtype: Any = None, copy: Any = None) -> NDArray:
        raise TypeError(_NO_HOST_VIEW)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        from . import _xp

        if method != "__call__":
            return NotImplemented
        _reject_host(inputs)
        fn = getattr(_xp, ufunc.__name__, None)
        if fn is None:
            return NotImplemented
        out = kwargs.get("out")
        if isinstance(out, tuple):
            kwargs["out"] = out[0] if len(out) == 1 else out
        return fn(*inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        from . import _xp

        if any(not issubclass(t, ndarray) for t in types):
            return NotImplemented
        fn = getattr(_xp, func.__name__, None)
        if fn is None:
            return NotImplemented
        return fn(*args, **kwargs)

    # -- host syncs ---------------------------------------------------------------------------

    def get(
        self,
        stream: Stream | None = None,
        order: str = "C",
        out: NDArray | None = None,
        blocking: bool = True,
    ) -> NDArray:
        """Copy to the host: a host sync, unless ``out`` is pinned and ``blocking`` is False."""
        stream = _current_on(self._block.device) if stream is None else stream
        if stream.capturing:
            raise RuntimeError(_CAPTURE_D2H)
        if out is None:
            target = np.empty(self.shape, self.dtype)
        else:
            _check_host_target(self, out)
            target = out
        asynchronous = out is not None and not blocking and is_pinned(out)
        source = self._np
        op = Op("device-to-host copy", lambda: np.copyto(target, source), reads=(self._block,))
        if asynchronous:
            op.on_enqueue = lambda: sentinel_fill(target)
        stream.submit(op)
        if not asynchronous:
            stream.host_sync()
        return target

    def set(self, arr: NDArray, stream: Stream | None = None) -> None:
        """Copy host ``arr`` in: asynchronous from pinned memory (checksummed), else a host sync."""
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, not {type(arr)}")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if arr.dtype != self.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        stream = _current_on(self._block.device) if stream is None else stream
        target = self._np
        if is_pinned(arr):
            stream.submit(_h2d_op(target, arr, self._block))
            return
        data = arr.copy()
        stream.submit(Op("host-to-device copy", lambda: np.copyto(target, data), writes=(self._block,)))
        stream.host_sync()

    def item(self) -> Any:
        """The one element, as a Python scalar (a host sync)."""
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.get().item()

    def tolist(self) -> Any:
        """The data as nested lists (a host sync)."""
        return self.get().tolist()

    def _scalar(self) -> NDArray:
        if self.ndim != 0:
            raise TypeError(_SCALAR_ONLY)
        return self.get()

    def __float__(self) -> float:
        return float(self._scalar())

    def __int__(self) -> int:
        return int(self._scalar())

    def __complex__(self) -> complex:
        return complex(self._scalar())

    def __index__(self) -> int:
        if self.dtype.kind not in "iub":
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return int(self._scalar())

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(
                "The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()"
            )
        return bool(self.get().reshape(()))

    def __repr__(self) -> str:
        return repr(self.get())

    def __str__(self) -> str:
        return str(self.get())

    def __format__(self, spec: str) -> str:
        return format(self.get() if self.ndim else self.get()[()], spec)

    # -- views ----------------------------------------------------------------------------------

    def reshape(self, *shape: Any, order: str = "C") -> ndarray:
        """A view with a new shape if possible, else a copy."""
        new = _shape(shape[0] if len(shape) == 1 else shape)
        try:
            return self._view(np.reshape(self._np, new, order=order, copy=False))  # type: ignore[call-overload]
        except ValueError:
            if int(np.prod(new, dtype=np.int64)) != self.size and -1 not in new:
                raise
        return self.copy(order=order).reshape(new, order=order)

    def transpose(self, *axes: Any) -> ndarray:
        """A transposed view."""
        spec = None if not axes else axes[0] if len(axes) == 1 else axes
        return self._view(self._np.transpose(spec))

    def swapaxes(self, a: int, b: int) -> ndarray:
        """A view with two axes swapped."""
        return self._view(self._np.swapaxes(a, b))

    def squeeze(self, axis: Any = None) -> ndarray:
        """A view without length-1 axes."""
        return self._view(self._np.squeeze(axis))

    def view(self, dtype: Any = None) -> ndarray:
        """A view, reinterpreted as ``dtype`` if given."""
        return self._view(self._np.view() if dtype is None else self._np.view(dtype))

    def ravel(self, order: str = "C") -> ndarray:
        """A 1-d view if possible, else a copy."""
        return self.reshape(-1, order=order)

    def flatten(self, order: str = "C") -> ndarray:
        """A 1-d copy."""
        return self.copy(order=order).reshape(-1)

    def __getitem__(self, key: Any) -> ndarray:
        if _is_basic(key):
            return self._view(self._np[_with_ellipsis(key)])
        return _gather(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        _scatter(self, key, value)

    # -- kernels ----------------------------------------------------------------------------------

    def copy(self, order: str = "C") -> ndarray:
        """A copy (a kernel on the current stream)."""
        out = empty(self.shape, self.dtype, order="F" if order == "F" else "C")
        launch("copy", lambda x: x, (self,), {}, out)
        return out

    def astype(
        self, dtype: Any, order: str = "K", casting: Any = None, subok: Any = None, copy: bool = True
    ) -> ndarray:
        """A copy cast to ``dtype`` (``self`` if ``copy`` is False and nothing changes)."""
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        out = empty(self.shape, dtype)
        launch("astype", lambda x: x, (self,), {}, out)
        return out

    def fill(self, value: Any) -> None:
        """Set every element to ``value`` (a kernel)."""
        launch("fill", lambda: value, (), {}, self, reads=())

    def get_device(self) -> Device:
        """The device the array lives on."""
        return self.device

    def _method(name: str) -> Callable[..., Any]:  # type: ignore[misc]
        def method(self: ndarray, *args: Any, **kwargs: Any) -> Any:
            from . import _xp

            return getattr(_xp, name)(self, *args, **kwargs)

        method.__name__ = name
        return method

    sum = _method("sum")
    mean = _method("mean")
    prod = _method("prod")
    max = _method("max")
    min = _method("min")
    argmax = _method("argmax")
    argmin = _method("argmin")
    any = _method("any")
    all = _method("all")
    std = _method("std")
    var = _method("var")
    clip = _method("clip")
    dot = _method("dot")
    conj = _method("conj")
    round = _method("round")

    def _binary(name: str, reflected: bool = False) -> Callable[..., Any]:  # type: ignore[misc]
        def op(self: ndarray, other: Any) -> Any:
            from . import _xp

            if isinstance(other, np.ndarray):
                raise TypeError(f"Unsupported type {type(other)}")
            if not isinstance(other, ndarray | int | float | complex | bool | np.generic):
                return NotImplemented
            fn = getattr(_xp, name)
            return fn(other, self) if reflected else fn(self, other)

        return op

    def _inplace(name: str) -> Callable[..., Any]:  # type: ignore[misc]
        def op(self: ndarray, other: Any) -> Any:
            from . import _xp

            _reject_host((other,))
            getattr(_xp, name)(self, other, out=self)
            return self

        return op

    def _unary(name: str) -> Callable[..., Any]:  # type: ignore[misc]
        def op(self: ndarray) -> Any:
            from . import _xp

            return getattr(_xp, name)(self)

        return op

    __add__, __radd__, __iadd__ = _binary("add"), _binary("add", True), _inplace("add")
    __sub__, __rsub__, __isub__ = _binary("subtract"), _binary("subtract", True), _inplace("subtract")
    __mul__, __rmul__, __imul__ = _binary("multiply"), _binary("multiply", True), _inplace("multiply")
    __truediv__, __rtruediv__, __itruediv__ = (
        _binary("true_divide"),
        _binary("true_divide", True),
        _inplace("true_divide"),
    )
    __floordiv__, __rfloordiv__, __ifloordiv__ = (
        _binary("floor_divide"),
        _binary("floor_divide", True),
        _inplace("floor_divide"),
    )
    __mod__, __rmod__, __imod__ = _binary("remainder"), _binary("remainder", True), _inplace("remainder")
    __pow__, __rpow__, __ipow__ = _binary("power"), _binary("power", True), _inplace("power")
    __matmul__, __rmatmul__ = _binary("matmul"), _binary("matmul", True)
    __and__, __rand__, __iand__ = (
        _binary("bitwise_and"),
        _binary("bitwise_and", True),
        _inplace("bitwise_and"),
    )
    __or__, __ror__, __ior__ = _binary("bitwise_or"), _binary("bitwise_or", True), _inplace("bitwise_or")
    __xor__, __rxor__, __ixor__ = (
        _binary("bitwise_xor"),
        _binary("bitwise_xor", True),
        _inplace("bitwise_xor"),
    )
    __lshift__, __rlshift__ = _binary("left_shift"), _binary("left_shift", True)
    __rshift__, __rrshift__ = _binary("right_shift"), _binary("right_shift", True)
    __lt__, __le__, __gt__, __ge__ = (
        _binary("less"),
        _binary("less_equal"),
        _binary("greater"),
        _binary("greater_equal"),
    )
    __eq__, __ne__ = _binary("equal"), _binary("not_equal")
    __neg__, __pos__, __abs__, __invert__ = (
        _unary("negative"),
        _unary("positive"),
        _unary("absolute"),
        _unary("invert"),
    )

    def __imatmul__(self, other: Any) -> Any:  # type: ignore[misc]
        from . import _xp

        result: ndarray = _xp.matmul(self, other)
        self[...] = result
        return self

    del _method, _binary, _inplace, _unary


# -- helpers used by the array module ------------------------------------------------------------


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        return (int(shape),)
    return tuple(int(n) for n in shape)


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    """A new device array on the current stream's device (no kernel)."""
    return ndarray(shape, dtype, order=order)


def _reject_host(values: Sequence[Any]) -> None:
    for value in values:
        if isinstance(value, np.ndarray):
            raise TypeError(f"Unsupported type {type(value)}")
        if isinstance(value, list | tuple):
            _reject_host(value)


def _arrays_in(values: Any) -> list[ndarray]:
    found: list[ndarray] = []
    for value in values:
        if isinstance(value, ndarray):
            found.append(value)
        elif isinstance(value, list | tuple):
            found.extend(_arrays_in(value))
    return found


def to_numpy_args(value: Any) -> Any:
    """``value`` with every device array replaced by its NumPy view (for the stream thread)."""
    if isinstance(value, ndarray):
        return value._np
    if isinstance(value, tuple):
        return tuple(to_numpy_args(v) for v in value)
    if isinstance(value, list):
        return [to_numpy_args(v) for v in value]
    return value


def check_devices(arrays: Sequence[ndarray], device: int) -> None:
    """Arrays of another device than the launching stream's raise ValueError, as in CuPy."""
    for array in arrays:
        if array._block.device != device:
            raise ValueError(
                f"The device where the array resides ({array._block.device}) is different from the "
                f"current device ({device})."
            )


def launch(
    kind: str,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    out: ndarray,
    reads: Sequence[ndarray] | None = None,
    stream: Stream | None = None,
) -> None:
    """Enqueue ``out[...] = fn(*args, **kwargs)`` on the current stream, run with NumPy on its thread."""
    stream = current_stream() if stream is None else stream
    inputs = _arrays_in(list(args) + list(kwargs.values())) if reads is None else list(reads)
    check_devices([*inputs, out], stream.device_id)
    np_args, np_kwargs = to_numpy_args(tuple(args)), {k: to_numpy_args(v) for k, v in kwargs.items()}
    target = out._np

    def run() -> None:
        np.copyto(target, fn(*np_args, **np_kwargs), casting="unsafe")

    stream.submit(Op(f"kernel {kind}", run, tuple(a._block for a in inputs), (out._block,), caller_site()))


def sentinel_fill(array: NDArray) -> None:
    """Poison a D2H target until its copy runs: NaN, the integer maximum, True, or 0xFF bytes."""
    kind = array.dtype.kind
    if kind in "fc":
        array.fill(np.nan)
    elif kind in "iu":
        array.fill(np.iinfo(array.dtype).max)
    elif kind == "b":
        array.fill(True)
    else:
        array.view(np.uint8).fill(0xFF)


def _checksum(array: NDArray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).view(np.uint8).reshape(-1).data)


def _h2d_op(target: NDArray, source: NDArray, block: Block) -> Op:
    """The asynchronous copy from pinned ``source``: checksummed now, checked when it runs."""
    expected = [0]
    site = caller_site()

    def checksum() -> None:
        expected[0] = _checksum(source)

    def run() -> None:
        if _checksum(source) != expected[0]:
            raise RuntimeError(
                f"the pinned source of the host-to-device copy enqueued at {site} changed before the copy ran "
                "(keep it unwritten until an event after the copy passed)"
            )
        np.copyto(target, source)

    return Op("host-to-device copy", run, (), (block,), site, on_enqueue=checksum)


def _check_host_target(array: ndarray, out: Any) -> None:
    if not isinstance(out, np.ndarray):
        raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
    if out.shape != array.shape:
        raise ValueError(f"Shape mismatch. Old shape: {out.shape}, new shape: {array.shape}")
    if out.dtype != array.dtype:
        raise TypeError(f"{array.dtype} array cannot be obtained from {out.dtype} array")


def _as_tuple(key: Any) -> tuple[Any, ...]:
    return key if isinstance(key, tuple) else (key,)


def _is_basic(key: Any) -> bool:
    for part in _as_tuple(key):
        if isinstance(part, bool | np.bool_):
            return False
        if not (isinstance(part, int | np.integer | slice) or part is None or part is Ellipsis):
            return False
    return True


def _with_ellipsis(key: Any) -> tuple[Any, ...]:
    parts = _as_tuple(key)
    return parts if any(p is Ellipsis for p in parts) else (*parts, Ellipsis)


def _index_parts(key: Any) -> tuple[tuple[Any, ...], tuple[Any, ...], list[ndarray]]:
    """(key for shape inference, key for the kernel, device arrays read) of an advanced index."""
    dummy: list[Any] = []
    real: list[Any] = []
    arrays: list[ndarray] = []
    for part in _as_tuple(key):
        if isinstance(part, ndarray) and part.dtype.kind == "b":
            host = part.get()  # a boolean mask's result shape depends on its data (CuPy syncs too)
            dummy.append(host)
            real.append(host)
        elif isinstance(part, ndarray):
            dummy.append(np.zeros(part.shape, part.dtype))
            real.append(part)
            arrays.append(part)
        else:
            dummy.append(part)
            real.append(part)
    return tuple(dummy), tuple(real), arrays


def _dummy(array: ndarray) -> NDArray:
    return np.broadcast_to(np.zeros((), array.dtype), array.shape)


def _gather(array: ndarray, key: Any) -> ndarray:
    dummy_key, real_key, indices = _index_parts(key)
    probe = _dummy(array)[dummy_key]
    out = empty(probe.shape, probe.dtype)
    launch("gather", lambda a, k: a[k], (array, real_key), {}, out, reads=[array, *indices])
    return out


def _scatter(array: ndarray, key: Any, value: Any) -> None:
    from . import _xp

    if isinstance(value, np.ndarray):
        value = _xp.asarray(value)
    if _is_basic(key):
        target_shape = array._np[_with_ellipsis(key)].shape
        real_key: Any = _with_ellipsis(key)
        indices: list[ndarray] = []
    else:
        dummy_key, real_key, indices = _index_parts(key)
        target_shape = _dummy(array)[dummy_key].shape
    value_shape = value.shape if isinstance(value, ndarray) else np.shape(value)
    try:
        fits = np.broadcast_shapes(value_shape, target_shape) == tuple(target_shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"could not broadcast input array from shape {value_shape} into shape {target_shape}"
        )
    stream = current_stream()
    inputs = [*indices, *([value] if isinstance(value, ndarray) else [])]
    check_devices([*inputs, array], stream.device_id)
    target, np_key, np_value = array._np, to_numpy_args(real_key), to_numpy_args(value)

    def run() -> None:
        target[np_key] = np_value

    stream.submit(Op("kernel setitem", run, tuple(a._block for a in inputs), (array._block,), caller_site()))
