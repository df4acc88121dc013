"""Shape and dtype of an operation's result, known before it runs, by NumPy's own rules.

Each rule computes the result shape from the operand shapes and asks NumPy
itself for the dtype by running the same call on tiny *probe* arrays (same
dtypes, same number of dimensions, at most one element per axis).  A probe
costs a microsecond, needs no result memory, and raises what NumPy would
raise for these dtypes and axes (casting errors, ``AxisError``, reductions of
empty axes), so those errors reach the caller at the call, not later.
Shape mismatches are checked here with NumPy's messages.

View operations (indexing, reshape, transpose) run the real NumPy call on a
zero-stride view of the operand's shape: exact, and free of any data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

__all__ = [
    "Meta",
    "broadcast",
    "concat_meta",
    "dot_meta",
    "elementwise_meta",
    "matmul_meta",
    "reduce_meta",
    "stack_meta",
    "ufunc_meta",
    "view_meta",
]

Shape = tuple[int, ...]
#: What is known about an operand before it runs: ``(shape, dtype)`` for an
#: array-like, the value itself for a Python or NumPy scalar.
Meta = tuple[Shape, np.dtype[Any]]

_empty_probes: dict[np.dtype[Any], np.ndarray] = {}


def _probe(meta: Any) -> Any:
    """A stand-in for an operand of an elementwise call: a scalar as it is, an array as an empty one."""
    if type(meta) is not tuple:
        return meta
    dtype = meta[1]
    probe = _empty_probes.get(dtype)
    if probe is None:
        probe = _empty_probes[dtype] = np.empty(0, dtype)
    return probe


def _small(meta: Any, keep_empty: bool = False) -> Any:
    """A stand-in with the operand's number of axes, one element each (``keep_empty``: 0 stays 0)."""
    if type(meta) is not tuple:
        return meta
    shape, dtype = meta
    return np.ones(tuple(min(d, 1) for d in shape) if keep_empty else (1,) * len(shape), dtype)


def _shape(meta: Any) -> Shape:
    return meta[0] if type(meta) is tuple else ()


def _dtype_of(result: Any) -> np.dtype[Any]:
    """The dtype of what a NumPy call on probes gave, as the same call on the data gives it: an array's or
    NumPy scalar's own (``np.result_type`` would make a big-endian dtype native), and for a Python object --
    what a reduction of an object array gives -- object (``np.result_type(1)`` would say int64)."""
    if isinstance(result, np.ndarray | np.generic):
        return result.dtype
    return np.dtype(object)


def broadcast(*shapes: Shape) -> Shape:
    """The broadcast shape, or NumPy's ValueError naming every shape."""
    common: Shape = ()
    for shape in shapes:  # hot path: operands of one shape, and scalars (shape ()), need no rules
        if not shape or shape == common:
            continue
        if common:
            break  # two shapes: NumPy's rules
        common = shape
    else:
        return tuple(common)
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        listed = " ".join(str(s) for s in shapes)
        raise ValueError(f"operands could not be broadcast together with shapes {listed}") from None


def ufunc_meta(ufunc: np.ufunc, metas: Sequence[Any], dtype: Any = None) -> Meta:
    """An elementwise ufunc call: broadcast shape, NumPy's resolved output dtype."""
    probes = []  # hot path: one pass for the probes and the common shape, no helper calls
    common: Shape = ()
    mixed = False
    for meta in metas:
        if type(meta) is not tuple:  # a scalar: itself, shape ()
            probes.append(meta)
            continue
        shape, kind = meta
        probe = _empty_probes.get(kind)
        if probe is None:
            probe = _empty_probes[kind] = np.empty(0, kind)
        probes.append(probe)
        if shape and shape != common:
            if common:
                mixed = True
            else:
                common = shape
    # dtype first: NumPy reports a type error before a shape one
    result = ufunc(*probes) if dtype is None else ufunc(*probes, dtype=dtype)
    shape = broadcast(*(_shape(m) for m in metas)) if mixed else tuple(common)
    return shape, np.result_type(result)


def matmul_meta(a: Any, b: Any) -> Meta:
    """``a @ b`` (``np.matmul``): 1-D operands promoted and the added axis removed again."""
    sa, sb = _shape(a), _shape(b)
    for i, s in enumerate((sa, sb)):
        if not s:
            raise ValueError(
                f"matmul: Input operand {i} does not have enough dimensions "
                "(has 0, gufunc core with signature (n?,k),(k,m?)->(n?,m?) requires 1)"
            )
    a2 = sa if len(sa) > 1 else (1, *sa)
    b2 = sb if len(sb) > 1 else (*sb, 1)
    if a2[-1] != b2[-2]:
        raise ValueError(
            "matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
            f"(n?,k),(k,m?)->(n?,m?) (size {b2[-2]} is different from {a2[-1]})"
        )
    rows = a2[-2:-1] if len(sa) > 1 else ()
    cols = b2[-1:] if len(sb) > 1 else ()
    shape = (*broadcast(a2[:-2], b2[:-2]), *rows, *cols)
    dtype = np.matmul(np.empty((0, 0), a[1]), np.empty((0, 0), b[1])).dtype
    return shape, dtype


def dot_meta(a: Any, b: Any) -> Meta:
    """``np.dot``: a product with a scalar, an inner product, or sum over a's last and b's second-to-last axis."""
    sa, sb = _shape(a), _shape(b)
    dtype = _dtype_of(np.dot(_small(a), _small(b)))
    if not sa or not sb:
        return (sa or sb), dtype
    k_b = sb[-2] if len(sb) > 1 else sb[0]
    if sa[-1] != k_b:
        dim_b = len(sb) - 2 if len(sb) > 1 else 0
        raise ValueError(
            f"shapes {sa} and {sb} not aligned: {sa[-1]} (dim {len(sa) - 1}) != {k_b} (dim {dim_b})"
        )
    return (*sa[:-1], *sb[:-2], *sb[-1:]) if len(sb) > 1 else sa[:-1], dtype


def reduce_meta(fn: Callable[..., Any], meta: Any, axis: Any, keepdims: bool, **options: Any) -> Meta:
    """A reduction (sum, mean, max, argmax, ...) over ``axis`` (None: all axes)."""
    shape = _shape(meta)
    # max/argmax of an empty axis raise in NumPy: their probe keeps empty axes empty
    result = fn(_small(meta, fn in _NEEDS_IDENTITY), axis=axis, keepdims=keepdims, **options)
    if axis is None or not shape:  # NumPy takes axis 0 / -1 of a 0-d array (the probe checked it)
        axes: tuple[int, ...] = tuple(range(len(shape)))
    else:
        axes = (
            normalize_axis_tuple(axis, len(shape))
            if isinstance(axis, tuple)
            else (normalize_axis_index(axis, len(shape)),)
        )
    if keepdims:
        out = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out = tuple(d for i, d in enumerate(shape) if i not in axes)
    return out, _dtype_of(result)


_NEEDS_IDENTITY = frozenset({np.max, np.min, np.argmax, np.argmin, np.amax, np.amin})


def concat_meta(metas: Sequence[Any], axis: int | None) -> Meta:
    """``np.concatenate``: every axis but ``axis`` must match exactly."""
    if not metas:
        raise ValueError("need at least one array to concatenate")
    dtype = np.concatenate([_small(m) for m in metas], axis=axis).dtype
    shapes = [_shape(m) for m in metas]
    if axis is None:
        return (sum(int(np.prod(s)) for s in shapes),), dtype
    ax = normalize_axis_index(axis, len(shapes[0]))
    first = shapes[0]
    for i, s in enumerate(shapes[1:], 1):
        for d in range(len(first)):
            if d != ax and s[d] != first[d]:
                raise ValueError(
                    "all the input array dimensions except for the concatenation axis must match exactly, "
                    f"but along dimension {d}, the array at index 0 has size {first[d]} "
                    f"and the array at index {i} has size {s[d]}"
                )
    return (*first[:ax], sum(s[ax] for s in shapes), *first[ax + 1 :]), dtype


def stack_meta(metas: Sequence[Any], axis: int) -> Meta:
    """``np.stack``: equal shapes, a new axis at ``axis``."""
    if not metas:
        raise ValueError("need at least one array to stack")
    shapes = [_shape(m) for m in metas]
    if any(s != shapes[0] for s in shapes):
        raise ValueError("all input arrays must have the same shape")
    dtype = np.stack([_small(m) for m in metas]).dtype
    ax = normalize_axis_index(axis, len(shapes[0]) + 1)
    return (*shapes[0][:ax], len(shapes), *shapes[0][ax:]), dtype


def elementwise_meta(fn: Callable[..., Any], metas: Sequence[Any]) -> Meta:
    """A broadcasting function that is not a ufunc object (``np.where``, ``np.clip``, ``**``)."""
    dtype = np.result_type(fn(*(_probe(m) for m in metas)))
    return broadcast(*(_shape(m) for m in metas if m is not None)), dtype


def view_meta(meta: Meta, fn: Callable[..., Any], *args: Any) -> tuple[Shape, np.dtype[Any], bool]:
    """Run a view operation on a data-free stand-in: (shape, dtype, is it a view of the operand)."""
    stand_in = np.broadcast_to(np.empty((), meta[1]), meta[0])
    result = fn(stand_in, *args)
    is_view = isinstance(result, np.ndarray)
    return np.shape(result), _dtype_of(result), is_view
