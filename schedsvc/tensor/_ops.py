"""The registry of array operations a Tensor (or a traced function) can queue.

An ``Op`` is a name, the NumPy call that runs it -- ``fn(*operands, **attrs)``
-- and the rule that gives its result's shape and dtype.  Eager Tensors and
compiled graphs both go through this table, so a replay calls exactly what
eager execution calls (bit-identical results), and a saved graph names its
operations by registry name instead of pickling code.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ._meta import (
    Shape,
    _shape,
    concat_meta,
    dot_meta,
    elementwise_meta,
    matmul_meta,
    reduce_meta,
    stack_meta,
    ufunc_meta,
    view_meta,
)

__all__ = ["OPS", "REDUCTIONS", "Op", "op_for_ufunc"]

#: infer(operand metas, attrs) -> (shape, dtype, view): ``view`` is True when
#: the result is a view of operand 0's memory (indexing, reshape, transpose).
Infer = Callable[[Sequence[Any], dict[str, Any]], tuple[Shape, np.dtype[Any], bool]]


class Op(NamedTuple):
    name: str
    fn: Callable[..., Any]
    infer: Infer
    #: a creation op (no operands; its attrs give the shape)
    creates: bool = False


OPS: dict[str, Op] = {}


def _register(name: str, fn: Callable[..., Any], infer: Infer, creates: bool = False) -> None:
    OPS[name] = Op(name, fn, infer, creates)


# -- elementwise ufuncs ---------------------------------------------------------


def _ufunc_infer(ufunc: np.ufunc) -> Infer:
    def infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
        if len(metas) != ufunc.nin:
            raise TypeError(f"{ufunc.__name__}() takes {ufunc.nin} operands but {len(metas)} were given")
        shape, dtype = ufunc_meta(ufunc, metas, attrs.get("dtype"))
        return shape, dtype, False

    return infer


def _matmul_infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
    shape, dtype = matmul_meta(*metas)
    return shape, dtype, False


_UFUNC_NAMES: dict[np.ufunc, str] = {}
for _value in vars(np).values():
    if not isinstance(_value, np.ufunc) or _value.nout != 1:
        continue
    if _value.signature and _value is not np.matmul:  # other gufuncs (vecdot, ...): not supported
        continue
    _register(_value.__name__, _value, _matmul_infer if _value.signature else _ufunc_infer(_value))
    _UFUNC_NAMES[_value] = _value.__name__


def op_for_ufunc(ufunc: np.ufunc) -> Op | None:
    """The registered op of a NumPy ufunc (one output), or None."""
    name = _UFUNC_NAMES.get(ufunc)
    return None if name is None else OPS[name]


# -- reductions -----------------------------------------------------------------


def _reduction(fn: Callable[..., Any]) -> Infer:
    def infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
        options = {k: v for k, v in attrs.items() if k not in ("axis", "keepdims")}
        shape, dtype = reduce_meta(fn, metas[0], attrs.get("axis"), attrs.get("keepdims", False), **options)
        return shape, dtype, False

    return infer


REDUCTIONS: dict[str, Callable[..., Any]] = {
    "sum": np.sum,
    "mean": np.mean,
    "prod": np.prod,
    "max": np.max,
    "min": np.min,
    "argmax": np.argmax,
    "argmin": np.argmin,
    "any": np.any,
    "all": np.all,
}
for _name, _fn in REDUCTIONS.items():
    _register(_name, _fn, _reduction(_fn))


# -- other computing functions ----------------------------------------------------


def _dot_infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
    shape, dtype = dot_meta(*metas)
    return shape, dtype, False


def _concatenate(*arrays: Any, axis: int | None = 0) -> Any:
    return np.concatenate(arrays, axis=axis)


def _stack(*arrays: Any, axis: int = 0) -> Any:
    return np.stack(arrays, axis=axis)


def _concat_infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
    shape, dtype = concat_meta(metas, attrs.get("axis", 0))
    return shape, dtype, False


def _stack_infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
    shape, dtype = stack_meta(metas, attrs.get("axis", 0))
    return shape, dtype, False


def _broadcasting(fn: Callable[..., Any], nin: int) -> Infer:
    def infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
        if len(metas) != nin:
            raise TypeError(f"{fn.__name__}() takes {nin} operands but {len(metas)} were given")
        shape, dtype = elementwise_meta(fn, metas)
        return shape, dtype, False

    return infer


def _astype(x: Any, dtype: Any) -> Any:
    return x.astype(dtype)


def _astype_infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
    return metas[0][0], np.dtype(attrs["dtype"]), False


def _ipow(x: Any, y: Any, out: Any) -> Any:
    """``x **= y``: ``x`` is ``out`` (the write's target), so the result is written in place."""
    x **= y
    return x


def _copy_infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
    return metas[0][0], metas[0][1], False


_register("dot", np.dot, _dot_infer)
# `a ** b` is ndarray.__pow__, which has shortcuts for scalar exponents (square, sqrt, ...) np.power lacks
_register("pow", operator.pow, _broadcasting(operator.pow, 2))
# `a **= b` is ndarray.__ipow__, with the same shortcuts, in place
_register("ipow", _ipow, OPS["power"].infer)
_register("concatenate", _concatenate, _concat_infer)
_register("stack", _stack, _stack_infer)
_register("where", np.where, _broadcasting(np.where, 3))
_register("clip", np.clip, _broadcasting(np.clip, 3))
_register("astype", _astype, _astype_infer)
_register("copy", np.copy, _copy_infer)


# -- views ----------------------------------------------------------------------


def _getitem(x: Any, index: Any) -> Any:
    return x[index]


def _reshape(x: Any, shape: Shape) -> Any:
    return np.reshape(x, shape)


def _transpose(x: Any, axes: Shape | None = None) -> Any:
    return np.transpose(x, axes)


def _view(fn: Callable[..., Any], attr: str) -> Infer:
    def infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
        return view_meta(metas[0], fn, attrs.get(attr))

    return infer


_register("getitem", _getitem, _view(_getitem, "index"))
_register("reshape", _reshape, _view(_reshape, "shape"))
_register("transpose", _transpose, _view(_transpose, "axes"))


# -- writes -----------------------------------------------------------------------


def _setitem(x: Any, value: Any, index: Any) -> Any:
    x[index] = value
    return x


def _setitem_infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
    target, value = metas
    selected, _, is_view = view_meta(target, _getitem, attrs["index"])
    shape = _shape(value)
    if type(value) is not tuple:  # a scalar: NumPy converts it at the call ("abc" into floats raises)
        np.empty((), target[1])[()] = value
    elif value[1].kind in "USO":  # text or objects: NumPy parses them at the call
        np.empty((), target[1])[()] = np.zeros((), value[1])
    if type(value) is tuple and not is_view and shape:  # an array with dimensions into one element:
        ndim = len(target[0])  # NumPy converts it as a scalar, by dtype (a bool takes its truth value)
        probe = np.zeros(tuple(min(d, 2) for d in shape), value[1])  # size 0, 1 or more, as the value's
        np.empty((1,) * ndim, target[1])[(0,) * ndim] = probe
    trimmed = shape[len(shape) - len(selected) :] if len(shape) > len(selected) else shape
    if (
        any(d != 1 for d in shape[: len(shape) - len(trimmed)])
        or _try_broadcast(trimmed, selected) != selected
    ):
        raise ValueError(f"could not broadcast input array from shape {shape} into shape {selected}")
    return target[0], target[1], True


def _try_broadcast(a: Shape, b: Shape) -> Shape | None:
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        return None


_register("setitem", _setitem, _setitem_infer)


# -- creation -----------------------------------------------------------------------


def _creation(fn: Callable[..., Any]) -> Infer:
    def infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
        shape = tuple(operator.index(d) for d in attrs["shape"])
        if any(d < 0 for d in shape):
            raise ValueError("negative dimensions are not allowed")
        if "fill_value" in attrs:  # np.full broadcasts its fill value into the shape
            fill = np.asarray(attrs["fill_value"])
            if _try_broadcast(fill.shape, shape) != shape:
                raise ValueError(
                    f"could not broadcast input array from shape {fill.shape} into shape {shape}"
                )
            np.full(fill.shape, attrs["fill_value"], attrs["dtype"])  # its conversion errors (300 in int8)
            return shape, np.dtype(attrs["dtype"]), False
        probe = fn(**{**attrs, "shape": tuple(0 for _ in shape)})
        return shape, probe.dtype, False

    return infer


def _arange_infer(metas: Sequence[Any], attrs: dict[str, Any]) -> tuple[Shape, np.dtype[Any], bool]:
    start, stop, step = attrs["start"], attrs["stop"], attrs["step"]
    try:  # an empty range of the same argument types: NumPy's dtype, and its argument errors
        empty_stop = type(stop)(start)
    except (TypeError, ValueError, OverflowError):
        empty_stop = stop
    dtype = np.arange(start, empty_stop, step, dtype=attrs.get("dtype")).dtype
    if all(isinstance(v, int | np.integer) for v in (start, stop, step)):
        return (len(range(int(start), int(stop), int(step))),), np.dtype(dtype), False
    delta = float(stop) - float(start)
    ratio = delta / float(step)
    if not np.isfinite(ratio):
        raise ValueError("arange: cannot compute length (the range is infinite or NaN)")
    if ratio == 0.0 and delta != 0.0:  # NumPy: an underflowed positive length is 1
        return (0 if np.signbit(ratio) else 1,), np.dtype(dtype), False
    return (max(0, int(np.ceil(ratio))),), np.dtype(dtype), False


_register("zeros", np.zeros, _creation(np.zeros), creates=True)
_register("ones", np.ones, _creation(np.ones), creates=True)
_register("empty", np.empty, _creation(np.empty), creates=True)
_register("full", np.full, _creation(np.full), creates=True)
_register("arange", np.arange, _arange_infer, creates=True)
