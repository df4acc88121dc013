"""The array surface of a lazy tensor: operators, methods and NumPy's protocols, each an ``apply``.

``ArrayOps`` is what ``Tensor`` (queued on the engine) and the traced tensors of
``compile`` (recorded into a graph) share: every operator, method, NumPy ufunc
(``__array_ufunc__``) and supported NumPy function (``__array_function__``)
becomes ``apply(op, operands, attrs)``, which hands it to the operand class
with the highest ``_op_priority``.  The state of a tensor and how an op is
run are its class's own (``_tensor.Tensor._run_op``).

Typing: the operators are installed from one table at import; their
signatures are declared for type checkers below, each returning the class it
is called on (``x @ w`` on a ``Tensor`` is a ``Tensor``).  NumPy functions and
ufuncs on a Tensor (``np.maximum(x, 0)``) are typed by NumPy's own stubs
(``ndarray`` or ``Any``), as is an operator whose left operand is an
``ndarray``; ``typing.cast`` them, or put the Tensor first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Self, TypeAlias, TypeVar

import numpy as np

from .._future import Future
from .._tracing import ACTIVE, tracing
from ._meta import Shape
from ._ops import OPS, Op, op_for_ufunc

__all__ = ["SCALARS", "ArrayOps", "Operand", "apply"]

SCALARS = (int, float, complex, bool, np.generic)
_OPERANDS: tuple[type, ...] = ()  # set below, once ArrayOps exists
#: what an operator takes besides a tensor (anything else gives NotImplemented: Python's TypeError)
Operand: TypeAlias = (
    "ArrayOps | np.ndarray[Any, Any] | np.generic | complex | list[Any] | tuple[Any, ...] | Future[Any]"
)
_A = TypeVar("_A", bound="ArrayOps")


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
    def T(self) -> Self:
        return self.transpose()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator[Self]:
        for i in range(len(self)):
            yield self[i]

    # -- methods ---------------------------------------------------------------

    def sum(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Self:
        return _reduce("sum", self, axis, keepdims, dtype)

    def mean(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Self:
        return _reduce("mean", self, axis, keepdims, dtype)

    def prod(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Self:
        return _reduce("prod", self, axis, keepdims, dtype)

    def max(self, axis: Any = None, keepdims: bool = False) -> Self:
        return _reduce("max", self, axis, keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Self:
        return _reduce("min", self, axis, keepdims)

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> Self:
        return _reduce("argmax", self, axis, keepdims)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> Self:
        return _reduce("argmin", self, axis, keepdims)

    def any(self, axis: Any = None, keepdims: bool = False) -> Self:
        return _reduce("any", self, axis, keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> Self:
        return _reduce("all", self, axis, keepdims)

    def reshape(self, *shape: Any) -> Self:
        if len(shape) == 1 and not isinstance(shape[0], int | np.integer):
            shape = tuple(shape[0])
        return _on(self, OPS["reshape"], {"shape": tuple(int(d) for d in shape)})

    def transpose(self, *axes: Any) -> Self:
        given: Any = axes or None
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], int | np.integer)):
            given = axes[0]
        attrs = {"axes": None if given is None else tuple(int(a) for a in given)}
        return _on(self, OPS["transpose"], attrs)

    def astype(self, dtype: Any) -> Self:
        return _on(self, OPS["astype"], {"dtype": np.dtype(dtype)})

    def copy(self) -> Self:
        return _on(self, OPS["copy"], {})

    def __getitem__(self, index: Any) -> Self:
        return _on(self, OPS["getitem"], {"index": _basic_index(index)})

    def __setitem__(self, index: Any, value: Any) -> None:
        apply(OPS["setitem"], (self, value), {"index": _basic_index(index)}, self)

    # -- NumPy protocols -------------------------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        op = op_for_ufunc(ufunc)
        name = getattr(ufunc, "__name__", repr(ufunc))
        if op is None or method != "__call__":
            call = name if method == "__call__" else f"{name}.{method}"
            raise TypeError(
                f"np.{call} is not queued on Tensors (only ufunc calls with one output are); {instead(call)}"
            )
        out = kwargs.pop("out", None)
        attrs: dict[str, Any] = {}
        if "dtype" in kwargs and kwargs["dtype"] is not None:
            attrs["dtype"] = np.dtype(kwargs.pop("dtype"))
        kwargs.pop("dtype", None)
        if kwargs:
            raise TypeError(
                f"np.{name}(..., {', '.join(kwargs)}=...) is not supported on Tensors "
                f"(out= and dtype= are); {instead(name)}"
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
                f"and every one-output ufunc; {instead(name)}"
            )
        return handler(*args, **kwargs)

    # -- operators: installed from the tables below at import; their types, for type checkers ----------

    if TYPE_CHECKING:

        def __add__(self, other: Operand) -> Self: ...
        def __radd__(self, other: Operand) -> Self: ...
        def __iadd__(self, other: Operand) -> Self: ...
        def __sub__(self, other: Operand) -> Self: ...
        def __rsub__(self, other: Operand) -> Self: ...
        def __isub__(self, other: Operand) -> Self: ...
        def __mul__(self, other: Operand) -> Self: ...
        def __rmul__(self, other: Operand) -> Self: ...
        def __imul__(self, other: Operand) -> Self: ...
        def __truediv__(self, other: Operand) -> Self: ...
        def __rtruediv__(self, other: Operand) -> Self: ...
        def __itruediv__(self, other: Operand) -> Self: ...
        def __floordiv__(self, other: Operand) -> Self: ...
        def __rfloordiv__(self, other: Operand) -> Self: ...
        def __ifloordiv__(self, other: Operand) -> Self: ...
        def __mod__(self, other: Operand) -> Self: ...
        def __rmod__(self, other: Operand) -> Self: ...
        def __imod__(self, other: Operand) -> Self: ...
        def __pow__(self, other: Operand) -> Self: ...
        def __rpow__(self, other: Operand) -> Self: ...
        def __ipow__(self, other: Operand) -> Self: ...
        def __matmul__(self, other: Operand) -> Self: ...
        def __rmatmul__(self, other: Operand) -> Self: ...
        def __imatmul__(self, other: Operand) -> Self: ...
        def __and__(self, other: Operand) -> Self: ...
        def __rand__(self, other: Operand) -> Self: ...
        def __iand__(self, other: Operand) -> Self: ...
        def __or__(self, other: Operand) -> Self: ...
        def __ror__(self, other: Operand) -> Self: ...
        def __ior__(self, other: Operand) -> Self: ...
        def __xor__(self, other: Operand) -> Self: ...
        def __rxor__(self, other: Operand) -> Self: ...
        def __ixor__(self, other: Operand) -> Self: ...
        def __lshift__(self, other: Operand) -> Self: ...
        def __rlshift__(self, other: Operand) -> Self: ...
        def __ilshift__(self, other: Operand) -> Self: ...
        def __rshift__(self, other: Operand) -> Self: ...
        def __rrshift__(self, other: Operand) -> Self: ...
        def __irshift__(self, other: Operand) -> Self: ...
        def __lt__(self, other: Operand) -> Self: ...
        def __le__(self, other: Operand) -> Self: ...
        def __gt__(self, other: Operand) -> Self: ...
        def __ge__(self, other: Operand) -> Self: ...
        def __neg__(self) -> Self: ...
        def __pos__(self) -> Self: ...
        def __abs__(self) -> Self: ...
        def __invert__(self) -> Self: ...
        def __eq__(self, other: object) -> Self: ...  # type: ignore[override]
        def __ne__(self, other: object) -> Self: ...  # type: ignore[override]


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


_OPERANDS = (ArrayOps, np.ndarray, list, tuple, Future, *SCALARS)


def _is_operand(obj: Any) -> bool:
    return isinstance(obj, _OPERANDS)


def _reduce(name: str, x: _A, axis: Any, keepdims: bool, dtype: Any = None) -> _A:
    if isinstance(axis, list):
        axis = tuple(axis)
    attrs: dict[str, Any] = {"axis": axis, "keepdims": bool(keepdims)}
    if dtype is not None:
        attrs["dtype"] = np.dtype(dtype)
    return _on(x, OPS[name], attrs)


def _on(x: _A, op: Op, attrs: dict[str, Any]) -> _A:
    """``op`` applied to ``x`` alone: a tensor of x's kind (for type checkers; ``apply`` says which)."""
    return apply(op, (x,), attrs)  # type: ignore[no-any-return]


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
            f"Advanced (array or boolean) indexing depends on data: {instead('take', 't, idx')}"
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
        if isinstance(operand, ArrayOps):
            kind = type(operand)
            if runner is None or kind._op_priority > runner._op_priority:
                runner = kind
    if runner is None:
        raise TypeError(f"{op.name}() needs at least one Tensor operand")
    return runner._run_op(op, tuple(operands), attrs, target)


# -- NumPy functions ---------------------------------------------------------------------


def instead(name: str, args: str = "...") -> str:
    """What to do instead of ``np.<name>``, which Tensors do not queue: where it was called from decides."""
    if ACTIVE[0] and tracing.depth:  # inside a compiled function, which cannot submit
        return (
            "inside a compiled function, compose it of operations Tensors queue, or call it outside: "
            f"await the compiled call, then eng.submit(np.{name}, {args}) on its result"
        )
    return f"use eng.submit(np.{name}, {args}) and await the result"


def _no(name: str, **given: Any) -> None:
    bad = [k for k, v in given.items() if v is not None and v is not np._NoValue]
    if bad == ["out"]:
        raise TypeError(
            f"np.{name}(..., out=...) is not supported on Tensors; assign its result: y = np.{name}(...)"
        )
    if bad:
        raise TypeError(f"np.{name}(..., {', '.join(bad)}=...) is not supported on Tensors; {instead(name)}")


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
            f"np.where(condition) (one argument) depends on data; use np.where(c, x, y), or {instead('where')}"
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


def _np_norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:
    """np.linalg.norm of vectors, composed of queued ops: along ``axis`` (an int), or of all the values
    (``axis=None``, ``ord=None``: the Frobenius norm of a matrix); matrix norms are refused."""
    if isinstance(axis, tuple) and len(axis) == 1:
        axis = axis[0]
    of_vectors = isinstance(axis, int | np.integer) or (axis is None and len(x.shape) == 1)
    if isinstance(ord, str) and of_vectors:
        raise ValueError(f"Invalid norm order '{ord}' for vectors")  # (NumPy's words)
    if ord == "fro" and axis is None and len(x.shape) == 2:
        ord = None  # a matrix's Frobenius norm: the 2-norm of all its values
    vector = of_vectors or (axis is None and ord is None)
    if not vector:
        raise TypeError(
            f"np.linalg.norm(..., ord={ord!r}, axis={axis!r}) of a matrix is not queued on Tensors (norms of "
            f"vectors are: an int axis, or ord=None); {instead('linalg.norm')}"
        )
    if not np.issubdtype(x.dtype, np.inexact):
        x = x.astype(np.float64)  # as NumPy does
    size = abs(x) if np.issubdtype(x.dtype, np.complexfloating) else x
    if ord is None or ord == 2:
        return np.sqrt((size * size).sum(axis=axis, keepdims=keepdims))
    size = abs(size)
    if ord == 1:
        return size.sum(axis=axis, keepdims=keepdims)
    if ord == np.inf:
        return size.max(axis=axis, keepdims=keepdims)
    if ord == -np.inf:
        return size.min(axis=axis, keepdims=keepdims)
    if ord == 0:
        return (size != 0).astype(size.dtype).sum(axis=axis, keepdims=keepdims)
    return ((size**ord).sum(axis=axis, keepdims=keepdims)) ** (1.0 / ord)


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
    np.linalg.norm: _np_norm,
}
_FUNCTION_NAMES = frozenset(f"linalg.{f.__name__}" if f is np.linalg.norm else f.__name__ for f in _FUNCTIONS)
