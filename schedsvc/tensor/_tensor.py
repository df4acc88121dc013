"""``Tensor``: an array whose every operation is queued as an engine task at once.

A Tensor is the Future of the task that computes it, plus what is known
before that task runs: ``shape``, ``dtype``, ``nbytes`` and ``device``.
Operators, NumPy ufuncs (``__array_ufunc__``) and a documented set of NumPy
functions (``__array_function__``) build new Tensors without waiting.

Memory and ordering: every Tensor lives in some memory -- its own, or, for a
view (indexing, reshape, transpose), its base's.  Operations read that
memory; in-place operators, ``out=`` and item assignment write it.  The
engine orders these accesses like any other buffer hazard, and ``await t``
also waits for the last write to ``t``'s memory, so what it returns is what
sequential NumPy would hold at that point of the program.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Generator, Iterator, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core import FINAL_STATES, Buffer, Task
from .._errors import InvalidTask
from .._future import Future, blocks_the_loop, stop_through_await
from .._runtime import buffer_of
from .._tracing import ACTIVE, tracing
from ._meta import Shape, broadcast
from ._ops import OPS, Op, op_for_ufunc

if TYPE_CHECKING:
    from .._port import Port

__all__ = ["ArrayOps", "Tensor", "apply", "check_out", "concrete"]

_SCALARS = (int, float, complex, bool, np.generic)
_OPERANDS: tuple[type, ...] = ()  # set below, once ArrayOps exists


class ArrayOps:
    """The array surface (operators, methods, NumPy protocols) shared by Tensor and traced tensors.

    Every operation becomes ``apply(op, operands, attrs)``; the operand class
    with the highest ``_op_priority`` runs it (a traced tensor records it, a
    Tensor queues it).
    """

    __slots__ = ()
    _op_priority = 0
    shape: Shape
    dtype: np.dtype[Any]

    # -- what is known without running ------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def T(self) -> Any:
        return self.transpose()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    # -- methods ---------------------------------------------------------------

    def sum(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Any:
        return _reduce("sum", self, axis, keepdims, dtype)

    def mean(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Any:
        return _reduce("mean", self, axis, keepdims, dtype)

    def prod(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Any:
        return _reduce("prod", self, axis, keepdims, dtype)

    def max(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _reduce("max", self, axis, keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _reduce("min", self, axis, keepdims)

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> Any:
        return _reduce("argmax", self, axis, keepdims)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> Any:
        return _reduce("argmin", self, axis, keepdims)

    def any(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _reduce("any", self, axis, keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _reduce("all", self, axis, keepdims)

    def reshape(self, *shape: Any) -> Any:
        if len(shape) == 1 and not isinstance(shape[0], int | np.integer):
            shape = tuple(shape[0])
        return apply(OPS["reshape"], (self,), {"shape": tuple(int(d) for d in shape)})

    def transpose(self, *axes: Any) -> Any:
        given: Any = axes or None
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], int | np.integer)):
            given = axes[0]
        attrs = {"axes": None if given is None else tuple(int(a) for a in given)}
        return apply(OPS["transpose"], (self,), attrs)

    def astype(self, dtype: Any) -> Any:
        return apply(OPS["astype"], (self,), {"dtype": np.dtype(dtype)})

    def copy(self) -> Any:
        return apply(OPS["copy"], (self,), {})

    def __getitem__(self, index: Any) -> Any:
        return apply(OPS["getitem"], (self,), {"index": _basic_index(index)})

    def __setitem__(self, index: Any, value: Any) -> None:
        apply(OPS["setitem"], (self, value), {"index": _basic_index(index)}, self)

    # -- NumPy protocols -------------------------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        op = op_for_ufunc(ufunc)
        name = getattr(ufunc, "__name__", repr(ufunc))
        if op is None or method != "__call__":
            call = name if method == "__call__" else f"{name}.{method}"
            raise TypeError(
                f"np.{call} is not queued on Tensors (only ufunc calls with one output are); "
                f"use eng.submit(np.{call}, ...) and await the result"
            )
        out = kwargs.pop("out", None)
        attrs: dict[str, Any] = {}
        if "dtype" in kwargs and kwargs["dtype"] is not None:
            attrs["dtype"] = np.dtype(kwargs.pop("dtype"))
        kwargs.pop("dtype", None)
        if kwargs:
            raise TypeError(
                f"np.{name}(..., {', '.join(kwargs)}=...) is not supported on Tensors "
                "(out= and dtype= are); use eng.submit"
            )
        if out is None:
            return apply(op, inputs, attrs)
        target = out[0] if isinstance(out, tuple) else out
        return apply(op, inputs, attrs, target)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        handler = _FUNCTIONS.get(func)
        if handler is None:
            module = str(getattr(func, "__module__", "numpy")).replace("numpy", "np", 1)
            module = "np" if module.startswith("np._") else module  # np.sum lives in np._core...
            name = f"{module}.{getattr(func, '__name__', repr(func))}".removeprefix("np.")
            raise TypeError(
                f"np.{name} is not queued on Tensors; supported: {', '.join(sorted(_FUNCTION_NAMES))} "
                f"and every one-output ufunc. Use eng.submit(np.{name}, ...) instead."
            )
        return handler(*args, **kwargs)


def _binary(name: str) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    op = OPS[name]
    op_inplace = OPS["ipow"] if name == "pow" else op  # `**=` is ndarray.__ipow__

    def forward(self: ArrayOps, other: Any) -> Any:
        return apply(op, (self, other), {}) if _is_operand(other) else NotImplemented

    def reflected(self: ArrayOps, other: Any) -> Any:
        return apply(op, (other, self), {}) if _is_operand(other) else NotImplemented

    def inplace(self: ArrayOps, other: Any) -> Any:
        if not _is_operand(other):
            return NotImplemented
        if not self.shape:  # a 0-d result is a NumPy scalar: immutable, so `+=` rebinds
            return apply(op, (self, other), {})
        return apply(op_inplace, (self, other), {}, self)

    return forward, reflected, inplace


def _unary(name: str) -> Callable[..., Any]:
    op = OPS[name]

    def method(self: ArrayOps) -> Any:
        return apply(op, (self,), {})

    return method


_BINARY = {
    "add": "add",
    "sub": "subtract",
    "mul": "multiply",
    "truediv": "divide",
    "floordiv": "floor_divide",
    "mod": "remainder",
    "pow": "pow",
    "matmul": "matmul",
    "and": "bitwise_and",
    "or": "bitwise_or",
    "xor": "bitwise_xor",
    "lshift": "left_shift",
    "rshift": "right_shift",
}
for _dunder, _name in _BINARY.items():
    _f, _r, _i = _binary(_name)
    setattr(ArrayOps, f"__{_dunder}__", _f)
    setattr(ArrayOps, f"__r{_dunder}__", _r)
    setattr(ArrayOps, f"__i{_dunder}__", _i)
for _dunder, _name in {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal"}.items():
    setattr(ArrayOps, f"__{_dunder}__", _binary(_name)[0])
for _dunder, _name in {"neg": "negative", "pos": "positive", "abs": "absolute", "invert": "invert"}.items():
    setattr(ArrayOps, f"__{_dunder}__", _unary(_name))
ArrayOps.__eq__ = _binary("equal")[0]  # type: ignore[method-assign]
ArrayOps.__ne__ = _binary("not_equal")[0]  # type: ignore[method-assign]


_OPERANDS = (ArrayOps, np.ndarray, list, tuple, Future, *_SCALARS)


def _is_operand(obj: Any) -> bool:
    return isinstance(obj, _OPERANDS)


def _reduce(name: str, x: Any, axis: Any, keepdims: bool, dtype: Any = None) -> Any:
    if isinstance(axis, list):
        axis = tuple(axis)
    attrs: dict[str, Any] = {"axis": axis, "keepdims": bool(keepdims)}
    if dtype is not None:
        attrs["dtype"] = np.dtype(dtype)
    return apply(OPS[name], (x,), attrs)


def _basic_index(index: Any) -> Any:
    """The index if it is basic (ints, slices, None, ...), else a TypeError that says what to do."""
    items = index if isinstance(index, tuple) else (index,)
    for item in items:
        if item is None or item is Ellipsis or isinstance(item, slice):
            continue
        if isinstance(item, int | np.integer) and not isinstance(item, bool | np.bool_):
            continue
        if isinstance(item, float | np.floating):
            raise IndexError(
                "only integers, slices (`:`), ellipsis (`...`), numpy.newaxis (`None`) and integer or "
                "boolean arrays are valid indices"
            )
        raise TypeError(
            f"Tensor indexing takes ints, slices, None and '...'; got {type(item).__name__}. "
            "Advanced (array or boolean) indexing depends on data: use eng.submit(np.take, t, idx) "
            "or await the array"
        )
    if isinstance(index, tuple):
        return tuple(int(i) if isinstance(i, np.integer) else i for i in index)
    return int(index) if isinstance(index, np.integer) else index


# -- dispatch ---------------------------------------------------------------------


def apply(op: Op, operands: Sequence[Any], attrs: dict[str, Any], target: Any = None) -> Any:
    """Queue (or, while tracing, record) ``op`` on ``operands``; returns the new tensor.

    With ``target``, the result is written into that tensor's memory and the
    target is returned (``t += 1``, ``out=t``, ``t[i] = v``).
    """
    if ACTIVE[0] and tracing.depth:
        return tracing.trace.record(op, operands, attrs, target)
    runner: Any = type(target) if isinstance(target, ArrayOps) else None
    for operand in operands:
        kind = type(operand)
        if kind is Tensor and runner is None:
            runner = Tensor
        elif isinstance(operand, ArrayOps) and (runner is None or kind._op_priority > runner._op_priority):
            runner = kind
    if runner is None:
        raise TypeError(f"{op.name}() needs at least one Tensor operand")
    return runner._run_op(op, tuple(operands), attrs, target)


def check_out(op: Op, shape: Shape, dtype: np.dtype[Any], target: Any) -> None:
    """NumPy's checks on an ``out=`` operand, in NumPy's order: cast by 'same_kind', then broadcast."""
    if op.name == "setitem":
        return
    if not np.can_cast(dtype, target.dtype, "same_kind"):
        ufunc = "power" if op.name == "ipow" else op.name
        raise TypeError(  # NumPy raises UFuncTypeError, a TypeError, with this message
            f"Cannot cast ufunc '{ufunc}' output from {dtype!r} to {target.dtype!r} "
            "with casting rule 'same_kind'"
        )
    if broadcast(shape, target.shape) != target.shape:
        raise ValueError(
            f"non-broadcastable output operand with shape {target.shape} doesn't match "
            f"the broadcast shape {broadcast(shape, target.shape)}"
        )


class Tensor(ArrayOps, Future[Any]):
    """A lazily computed array on an engine device; ``await t`` gives the array.

    ``shape``, ``dtype``, ``nbytes`` and ``device`` are known at once.
    ``t.wait_to_read()`` blocks a thread that is not the event loop's;
    ``repr(t)`` never waits.
    """

    __slots__ = ("__weakref__", "_last_write", "_root", "_unseen", "dtype", "memory", "shape")
    _op_priority = 1
    __hash__ = Task.__hash__  # elementwise __eq__ must not make tasks unhashable

    shape: Shape
    dtype: np.dtype[Any]
    memory: Buffer  # (buffer key, bytes, False): a read of the memory the value lives in
    _root: Tensor | None  # the tensor that owns that memory; None: itself (no reference cycle)
    _last_write: Future[Any] | None  # on the root: the last queued write to its memory
    #: on the root: the writes to its memory an await has not seen yet (those not final, and the first
    #: that failed: the next await raises its error), kept by ``TensorMemory``
    _unseen: list[Task] | None

    @property
    def owner(self) -> Tensor:
        """The Tensor whose memory this one lives in: itself, or the base of a view."""
        root = self._root
        return self if root is None else root

    # -- running an op -----------------------------------------------------------

    @classmethod
    def _run_op(cls, op: Op, operands: tuple[Any, ...], attrs: dict[str, Any], target: Any) -> Any:
        engine: Port | None = None
        metas: list[Any] = []
        args: list[Any] = []
        for operand in operands:
            value, meta, owner = _operand(operand, op)
            if owner is not None:
                if engine is None:
                    engine = owner
                elif owner is not engine:
                    raise InvalidTask(
                        f"{op.name}(): operands belong to different engines; await one and pass its value"
                    )
            args.append(value)
            metas.append(meta)
        if target is not None and not isinstance(target, Tensor):
            raise TypeError(f"out= must be a Tensor of the same engine, got {type(target).__name__}")
        if target is not None and engine is None:  # np.add(2, 1, out=t): t is the only Tensor
            engine = target._port
        if target is not None and target._port is not engine:
            raise InvalidTask(f"{op.name}(): out= belongs to another engine")
        assert engine is not None
        shape, dtype, view = op.infer(metas, attrs)
        if target is not None:
            check_out(op, shape, dtype, target)
            kwargs = attrs if op.name == "setitem" else {**attrs, "out": target}
            queue_op(engine, op, args, kwargs, target.shape, target.dtype, target.owner, target)
            return target
        base = args[0].owner if view and isinstance(args[0], Tensor) else None
        if view and base is None:  # a view of a plain ndarray operand: that array's memory
            return queue_op(engine, op, args, attrs, shape, dtype, None, None, memory=buffer_of(args[0]))
        return queue_op(engine, op, args, attrs, shape, dtype, base, None)

    # -- sync points -------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Any]:
        owner = self.owner
        last = owner._last_write
        if last is None:
            return (yield from Future.__await__(self))
        if last.state not in FINAL_STATES:
            yield from last.wait().__await__()
        try:
            value = yield from Future.__await__(self)
        finally:  # its writes are seen now, whatever this await raises (its own error first)
            error = self._port.tensors.seen(owner) if self.state in FINAL_STATES else None
        if error is not None:  # a write to its memory failed since the last await: raised once
            if isinstance(error, StopIteration):  # PEP 479 would make it a bare RuntimeError
                raise stop_through_await(last, error) from error
            raise error
        return value

    def to(self, device: str) -> Tensor:
        """This Tensor on ``device`` (``"cpu"``, ``"cuda:0"``): copied there by a task of its own, on the
        device's copy streams; itself if it is there already.  ``await t.to("cpu")`` gives NumPy."""
        from ._tracking import to

        return to(self._port, self, device)

    def wait_to_read(self, timeout: float | None = None) -> Any:
        """Block this thread until the value (and every queued write to it) is there; return it."""
        owner = self.owner
        last = owner._last_write
        pending = self.state not in FINAL_STATES or (last is not None and last.state not in FINAL_STATES)
        if pending and self._rt.on_loop_thread():
            raise blocks_the_loop(self, "wait_to_read()", "t")
        if last is not None:
            if last.state not in FINAL_STATES and not self._rt.wait_blocking(last, timeout):
                raise TimeoutError(f"the last write to {self!r} did not finish within {timeout} s")
            try:
                value = self.result(timeout)  # its own error first, as await does
            finally:  # its writes are seen now, whatever this raises
                error = self._port.tensors.seen(owner) if self.state in FINAL_STATES else None
            if error is not None:  # a write to its memory failed since the last await: raised once
                raise error
            return value
        return self.result(timeout)

    def asnumpy(self, timeout: float | None = None) -> Any:
        """Same as ``wait_to_read()`` (MXNet's name)."""
        return self.wait_to_read(timeout)

    def _value_now(self, what: str) -> Any:
        if get_ident() == self._rt.loop_thread:
            raise TypeError(
                f"{what} of a Tensor needs its value, and waiting here would block the event loop; "
                f"use 'await t' (then {what} of the array)"
            )
        return self.wait_to_read()

    def __bool__(self) -> bool:
        return bool(self._value_now("bool()"))

    def __float__(self) -> float:
        return float(self._value_now("float()"))

    def __int__(self) -> int:
        return int(self._value_now("int()"))

    def __index__(self) -> int:
        return operator.index(self._value_now("index()"))

    def __complex__(self) -> complex:
        return complex(self._value_now("complex()"))

    def item(self) -> Any:
        return np.asarray(self._value_now("item()")).item()

    def tolist(self) -> Any:
        return np.asarray(self._value_now("tolist()")).tolist()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        value = np.asarray(self._value_now("np.asarray()"), dtype=dtype)
        return value.copy() if copy else value

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        head = f"Tensor(shape=({dims}{',' if len(self.shape) == 1 else ''}), dtype={self.dtype}, device={self.device!r}"
        last = self.owner._last_write
        settled = last is None or last.state in FINAL_STATES
        if self.state == "done" and settled:
            if not isinstance(self.value, np.ndarray):  # a device array: showing it would wait for the device
                return f"{head}, done)"
            return f"{head},\n       {np.asarray(self.value)!r})"
        if self.state == "failed" and self.error is not None:
            return f"{head}, failed: {type(self.error).__name__})"
        return f"{head}, {self.state if settled else 'writing'})"

    __str__ = __repr__


def _operand(obj: Any, op: Op) -> tuple[Any, Any, Port | None]:
    """(argument, meta, engine's port) of one operand of a Tensor operation."""
    if isinstance(obj, Tensor):
        return obj, (obj.shape, obj.dtype), obj._port
    if isinstance(obj, np.ndarray):
        return obj, (obj.shape, obj.dtype), None
    if obj is None or isinstance(obj, _SCALARS):
        return obj, obj, None
    if isinstance(obj, Future):
        if obj.state == "done" and isinstance(obj.value, np.ndarray):
            return obj.value, (obj.value.shape, obj.value.dtype), obj._port
        raise TypeError(
            f"{op.name}(): {obj!r} is a Future whose shape is not known yet; "
            "await it first, or wrap it with eng.asarray(fut, shape=..., dtype=...)"
        )
    if isinstance(obj, ArrayOps):
        raise TypeError(f"{op.name}(): cannot mix {type(obj).__name__} with engine Tensors")
    array = np.asarray(obj)
    return array, (array.shape, array.dtype), None


def concrete(port: Port, array: Any, device: str, memory: tuple[int, int] | None = None) -> Tensor:
    """A Tensor that is already computed: ``array`` itself (no copy); ``memory``: its (key, nbytes)
    when it is not a NumPy array."""
    t = Tensor(port, None, (), None, device)
    t.out_bytes, t.name = array.nbytes, "asarray"
    t.state, t.value = "done", array
    t.shape, t.dtype = array.shape, array.dtype
    key, nbytes = buffer_of(array) if memory is None else memory
    t.memory = (key, nbytes, False)
    t._root = None
    t._last_write = t._unseen = None
    return t


# -- NumPy functions ---------------------------------------------------------------------


def _no(name: str, **given: Any) -> None:
    bad = [k for k, v in given.items() if v is not None and v is not np._NoValue]
    if bad:
        raise TypeError(f"np.{name}(..., {', '.join(bad)}=...) is not supported on Tensors; use eng.submit")


def _np_extremum(name: str) -> Callable[..., Any]:
    """np.max / np.min / np.any / np.all: (a, axis, out, keepdims), no dtype."""

    def handler(a: Any, axis: Any = None, out: Any = None, keepdims: Any = False, **rest: Any) -> Any:
        _no(name, out=out, **rest)
        return _reduce(name, a, axis, bool(keepdims))

    return handler


def _np_reduction(name: str) -> Callable[..., Any]:
    """np.sum / np.mean / np.prod: (a, axis, dtype, out, keepdims)."""

    def handler(
        a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: Any = False, **rest: Any
    ) -> Any:
        _no(name, out=out, **rest)
        return _reduce(name, a, axis, bool(keepdims), dtype)

    return handler


def _np_argreduction(name: str) -> Callable[..., Any]:
    def handler(a: Any, axis: Any = None, out: Any = None, *, keepdims: Any = False) -> Any:
        _no(name, out=out)
        return _reduce(name, a, axis, bool(keepdims))

    return handler


def _np_dot(a: Any, b: Any, out: Any = None) -> Any:
    _no("dot", out=out)
    return apply(OPS["dot"], (a, b), {})


def _np_concatenate(arrays: Sequence[Any], axis: int | None = 0, out: Any = None, **rest: Any) -> Any:
    _no("concatenate", out=out, **rest)
    return apply(OPS["concatenate"], tuple(arrays), {"axis": axis})


def _np_stack(arrays: Sequence[Any], axis: int = 0, out: Any = None, **rest: Any) -> Any:
    _no("stack", out=out, **rest)
    return apply(OPS["stack"], tuple(arrays), {"axis": int(axis)})


def _np_where(condition: Any, *xy: Any) -> Any:
    if len(xy) != 2:
        raise TypeError(
            "np.where(condition) (one argument) depends on data; use np.where(c, x, y) or eng.submit"
        )
    return apply(OPS["where"], (condition, *xy), {})


def _np_clip(a: Any, a_min: Any = None, a_max: Any = None, out: Any = None, **rest: Any) -> Any:
    _no("clip", out=out, **{k: v for k, v in rest.items() if k not in ("min", "max")})
    a_min = rest.get("min", a_min)
    a_max = rest.get("max", a_max)
    return apply(OPS["clip"], (a, a_min, a_max), {})


def _np_reshape(a: Any, shape: Any = None, order: str = "C", **rest: Any) -> Any:
    if order != "C":
        raise TypeError("Tensor.reshape supports order='C' only")
    shape = rest.pop("newshape", shape)
    return (
        a.reshape(shape) if isinstance(a, ArrayOps) else apply(OPS["reshape"], (a,), {"shape": tuple(shape)})
    )


def _np_transpose(a: Any, axes: Any = None) -> Any:
    return apply(OPS["transpose"], (a,), {"axes": None if axes is None else tuple(axes)})


_FUNCTIONS: dict[Any, Callable[..., Any]] = {
    np.sum: _np_reduction("sum"),
    np.mean: _np_reduction("mean"),
    np.prod: _np_reduction("prod"),
    np.max: _np_extremum("max"),
    np.min: _np_extremum("min"),
    np.amax: _np_extremum("max"),
    np.amin: _np_extremum("min"),
    np.any: _np_extremum("any"),
    np.all: _np_extremum("all"),
    np.argmax: _np_argreduction("argmax"),
    np.argmin: _np_argreduction("argmin"),
    np.dot: _np_dot,
    np.concatenate: _np_concatenate,
    np.stack: _np_stack,
    np.where: _np_where,
    np.clip: _np_clip,
    np.reshape: _np_reshape,
    np.transpose: _np_transpose,
    np.shape: lambda a: a.shape,
    np.ndim: lambda a: len(a.shape),
    np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis],
    np.copy: lambda a, order="K", subok=False: apply(OPS["copy"], (a,), {}),
}
_FUNCTION_NAMES = frozenset(f.__name__ for f in _FUNCTIONS)


# queue_op builds a Tensor's task; it needs the Tensor class above, so it is imported last
from ._tracking import queue_op  # noqa: E402
