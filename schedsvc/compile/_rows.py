"""Proving that a traced graph keeps the rows of a batch apart, and the replay that keeps them exact.

``eng.compile(fn, batch_axis=...)`` runs many callers' rows as one replay, so
it must know that every output row along the batch axis depends only on the
input row of the same index.  ``plan_rows`` walks the graph in program order
and gives each node the axis its rows lie along (None: the node is the same
for every row -- a weight, a constant, something made of them).  An op keeps
rows apart when the rule for its kind holds: elementwise ops and ``where``,
``clip``, ``astype`` line the batch up (an unbatched operand must not have
more than one row there); a matmul takes the batch on its left, on rows or a
stacked axis; reductions, transposes, slices and reshapes must leave the
axis whole; concatenate and stack join batched operands along other axes.
Anything else that touches the batch -- a reduction over it, a matmul with the
batch on the right, ``x[0]``, a reshape that merges rows -- raises
``BatchError`` naming the op and the axis.

Exactness: NumPy's result can depend on more than the values.  BLAS computes
one row of a many-row product with other rounding than a one-row product; a
reduction sums in another order, and a transcendental ufunc may take another
loop, when its operand is laid out otherwise (a caller's rows inside a batch
along axis 1 are strided, its own array is not).  So the plan marks every
node that may round by layout -- every op but the ``_SAME_BITS`` ufuncs (each
result correctly rounded or exact), the reductions that do not round, and
the ops that only move or cast values -- and ``exact_fn`` gives it a
replacement that computes each caller's rows as the caller's own call would:
matmuls as one product per caller (one stacked matmul when every caller has
the same number of rows); other ops on the whole batch when the batch is
along axis 0 and every operand C-contiguous (a caller's rows are then laid out
as in its own call: measured bit-equal), else on each caller's own rows.
"""

from __future__ import annotations

import linecache
import math
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import BatchError
from ..tensor import OPS
from ._graph import Graph, Node, Ref

__all__ = ["RowPlan", "exact_fn", "plan_rows", "same_program"]

#: ops that combine operands element by element, broadcasting (besides the ufuncs)
_ELEMENTWISE = frozenset({"pow", "ipow", "where", "clip", "astype", "copy"})
_REDUCTIONS = frozenset({"sum", "mean", "prod", "max", "min", "argmax", "argmin", "any", "all"})
#: ufuncs whose every result (on real numbers) is exact or correctly rounded: the same bits in any loop
_SAME_BITS = frozenset(
    {
        "absolute", "add", "bitwise_and", "bitwise_or", "bitwise_xor", "ceil", "conjugate", "copysign",
        "divide", "equal", "fabs", "floor", "fmax", "fmin", "greater", "greater_equal", "invert",
        "isfinite", "isinf", "isnan", "left_shift", "less", "less_equal", "logical_and", "logical_not",
        "logical_or", "logical_xor", "maximum", "minimum", "multiply", "negative", "not_equal", "positive",
        "reciprocal", "right_shift", "rint", "sign", "signbit", "sqrt", "square", "subtract",
        "true_divide", "trunc",
    }
)  # fmt: skip
#: ops that move, pick or cast values without arithmetic, and reductions that do not round
_NO_ROUNDING = frozenset({"where", "clip", "astype", "copy", "max", "min", "argmax", "argmin", "any", "all"})


#: per node computed as each caller's own call would: the batch axis of each operand (None: unbatched), of
#: its result
Exact = dict[int, tuple[tuple[int | None, ...], int]]


class RowPlan:
    """Per node, the axis its rows lie along (None: the same for every row); the output axes; the nodes
    that may round a batch differently from one caller's own call (``exact``: node -> the batch axis of
    each operand, None where unbatched, and of the result)."""

    __slots__ = ("axes", "exact", "outputs")

    def __init__(self, axes: list[int | None], exact: Exact, outputs: list[int]) -> None:
        self.axes = axes
        self.exact = exact
        self.outputs = outputs


def plan_rows(graph: Graph, batched: dict[int, int], name: str) -> RowPlan:
    """Prove ``graph`` keeps rows apart, with input ``position`` batched along ``batched[position]``."""
    nodes = graph.nodes
    axes: list[int | None] = [None] * len(nodes)
    exact: Exact = {}
    for i, node in enumerate(nodes):
        if node.op == "input":
            axes[i] = batched.get(node.value)
            continue
        if node.op in ("const", "dead"):
            continue
        if node.out is not None:
            axes[i] = _write(graph, axes, i, node)
        elif any(isinstance(a, Ref) and axes[a] is not None for a in node.args):
            axes[i] = _rule(graph, axes, i, node, exact)
        else:
            continue
        if i not in exact and axes[i] is not None and node.op != "setitem" and _rounds_by_layout(node):
            operands = tuple(axes[a] if isinstance(a, Ref) else None for a in node.args)
            exact[i] = (operands, _axis(axes, i))
    outputs = []
    for k, o in enumerate(graph.outputs):
        axis = axes[o]
        if axis is None:
            what = "it" if graph.out_kind == "single" else f"output {k}"
            raise BatchError(
                f"{name}: {what} ({_type(nodes[o])}) does not depend on the batched arguments, so it has no "
                "rows to give each caller; return only what is computed from the batched arguments"
            )
        outputs.append(axis)
    return RowPlan(axes, exact, outputs)


def same_program(one: Graph, rows: int, other: Graph, other_rows: int, name: str) -> None:
    """Raise BatchError unless ``one`` (traced with ``rows`` rows) and ``other`` (``other_rows``) are the
    same program: the same ops on the same operands, where only shapes may follow the number of rows.

    A function that reads the number of rows as a value -- ``x / x.shape[0]``, ``len(x)``, ``x.size``, a
    branch on it, a reshape that moves rows across the batch axis -- would give a caller values that depend
    on how many rows its batch holds; tracing it at two row counts shows that, and it is refused.
    """
    if len(one.nodes) != len(other.nodes) or one.out_kind != other.out_kind or one.outputs != other.outputs:
        raise BatchError(
            f"{name} traces to other operations with {_count(rows)} than with {other_rows} (a branch on the number "
            "of rows, x.shape[0] or len(x)?): what it computes depends on how many rows are batched, so its "
            "calls cannot run as one batch. Compute without the number of rows, or compile without batch_axis"
        )
    counts = (rows, other_rows)
    for a, b in zip(one.nodes, other.nodes, strict=True):
        what = _differs(a, b, counts)
        if what is not None:
            raise BatchError(
                f"{name}: {a.op}() {what[0]} with {_count(rows)} and {what[1]} with {other_rows}: the "
                "function reads the number of rows as a value (x.shape[0], len(x), x.size?), so a caller's "
                "result would depend on how many rows its batch holds. Compute without the number of rows, "
                "or compile without batch_axis"
            )


def _differs(a: Node, b: Node, counts: tuple[int, int]) -> tuple[str, str] | None:
    """What differs between two nodes of programs traced at ``counts`` rows, as each has it; None if only
    their shapes follow the number of rows."""
    if a.op != b.op or a.dtype != b.dtype or a.base != b.base or a.out != b.out:
        return f"gives {_type(a)}", f"is {b.op}() giving {_type(b)}"
    if not _same_shape(a.shape, b.shape, counts):
        return f"gives shape {a.shape}", f"{b.shape}"
    if a.op == "const":
        if a.value.shape == b.value.shape and np.array_equal(a.value, b.value, equal_nan=True):
            return None
        return f"is a constant {_type(a)}", f"another, {_type(b)}"
    if a.op == "input":
        return None if a.value == b.value else ("is an input", "another")
    if len(a.args) != len(b.args) or a.attrs.keys() != b.attrs.keys():
        return "takes some operands", "others"
    for x, y in zip((*a.args, *a.attrs.values()), (*b.args, *b.attrs.values()), strict=True):
        if not _same_operand(x, y, counts):
            return f"takes {_literal(x)}", _literal(y)
    return None


def _same_shape(a: tuple[int, ...], b: tuple[int, ...], counts: tuple[int, int]) -> bool:
    """Equal, but where the one holds the first row count and the other the second."""
    return len(a) == len(b) and all(x == y or (x, y) == counts for x, y in zip(a, b, strict=True))


def _same_operand(x: Any, y: Any, counts: tuple[int, int]) -> bool:
    """A literal operand: equal, or a shape (a tuple) whose sizes follow the number of rows."""
    if type(x) is not type(y):
        return False
    if isinstance(x, tuple):
        return len(x) == len(y) and all(
            (u, v) == counts if type(u) is int and type(v) is int and u != v else _same_operand(u, v, counts)
            for u, v in zip(x, y, strict=True)
        )
    if isinstance(x, np.ndarray):
        return x.shape == y.shape and bool(np.array_equal(x, y))
    try:
        return bool(x == y) or (x != x and y != y)  # (NaN is NaN here)
    except Exception:  # an operand whose comparison is not a bool
        return x is y


def _count(rows: int) -> str:
    return "1 row" if rows == 1 else f"{rows} rows"


def _literal(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _rule(
    graph: Graph,
    axes: list[int | None],
    i: int,
    node: Node,
    exact: Exact,
) -> int:
    op = node.op
    fn = OPS[op].fn
    if op in ("matmul", "dot"):
        return _matmul(graph, axes, i, node, exact)
    if op in _ELEMENTWISE or (isinstance(fn, np.ufunc) and not fn.signature):
        return _broadcast(graph, axes, node, node.args, node.shape)
    if op in _REDUCTIONS:
        return _reduce(graph, axes, node)
    if op == "transpose":
        (a,) = _refs(node)
        axis = _axis(axes, a)
        order = node.attrs.get("axes")
        ndim = len(graph.nodes[a].shape)
        order = tuple(range(ndim))[::-1] if order is None else tuple(_norm(x, ndim) for x in order)
        return order.index(axis)
    if op == "getitem":
        return _getitem(graph, axes, node)
    if op == "reshape":
        return _reshape(graph, axes, node)
    if op in ("concatenate", "stack"):
        return _join(graph, axes, node)
    raise _refuse(node, f"schedsvc cannot prove {op}() keeps the rows of its batched operand apart")


def _rounds_by_layout(node: Node) -> bool:
    """Whether NumPy may compute ``node`` with other rounding on other memory layouts."""
    if node.op in _NO_ROUNDING or node.dtype.kind in "biu":
        return False
    fn = OPS[node.op].fn
    if isinstance(fn, np.ufunc) and not fn.signature:
        return fn.__name__ not in _SAME_BITS or node.dtype.kind == "c"
    return node.op in _REDUCTIONS or node.op in _ELEMENTWISE


def _refs(node: Node) -> list[int]:
    return [int(a) for a in node.args if isinstance(a, Ref)]


def _axis(axes: list[int | None], ref: int) -> int:
    axis = axes[ref]
    assert axis is not None
    return axis


def _norm(axis: Any, ndim: int) -> int:
    index: int = operator.index(axis)
    return index + ndim if index < 0 else index


def _type(node: Node) -> str:
    return f"{node.dtype}[{', '.join(map(str, node.shape))}]"


def _refuse(node: Node, why: str, axis: int | None = None, fix: str = "") -> BatchError:
    where = "" if axis is None else f" (batch axis {axis})"
    made = "" if node.site is None else f". The {node.op}() is made at {_line(node.site)}"
    fix = (
        fix
        or "leave this op out of the batched function (compiled without batch_axis, it runs each call alone)"
    )
    return BatchError(
        f"{node.op}(){where}: {why}, so a batched call would mix the rows of different callers (a "
        f"caller's values would depend on other callers' rows). To batch, {fix}{made}"
    )


def _line(site: tuple[str, int]) -> str:
    """``file:line (code)`` of a call site; the file relative to the working directory if it is in it."""
    path, number = site
    code = linecache.getline(path, number).strip()
    shown = os.path.relpath(path)
    if shown.startswith(os.pardir):
        shown = path
    return f"{shown}:{number}" + (f" ({code!r})" if code else "")


def _broadcast(
    graph: Graph, axes: list[int | None], node: Node, args: Sequence[Any], shape: tuple[int, ...]
) -> int:
    """Elementwise: batched operands line their axis up in the result; an unbatched one has one row there."""
    ndim = len(shape)
    out: int | None = None
    for a in args:
        if not isinstance(a, Ref) or axes[a] is None:
            continue
        src = graph.nodes[a]
        where = _axis(axes, a) + ndim - len(src.shape)
        if out is not None and where != out:
            raise _refuse(node, f"it pairs rows along axis {out} with rows along axis {where}", out)
        if src.shape[_axis(axes, a)] != shape[where]:
            raise _refuse(
                node, f"it broadcasts the batch ({src.shape[_axis(axes, a)]} rows) to {shape[where]}", where
            )
        out = where
    assert out is not None
    for a in args:
        if not isinstance(a, Ref) or axes[a] is not None:
            continue
        src = graph.nodes[a]
        at = out - (ndim - len(src.shape))
        if at >= 0 and src.shape[at] != 1:
            raise _refuse(
                node,
                f"it pairs the batch's rows with the {src.shape[at]} rows of an unbatched operand "
                f"({_type(src)})",
                out,
            )
    return out


def _reduce(graph: Graph, axes: list[int | None], node: Node) -> int:
    (a,) = _refs(node)[:1]
    axis = _axis(axes, a)
    ndim = len(graph.nodes[a].shape)
    over = node.attrs.get("axis")
    if over is None:
        raise _refuse(node, "it reduces every axis, the batch axis too", axis, _own_axes(set(), axis, ndim))
    reduced = {_norm(x, ndim) for x in (over if isinstance(over, tuple) else (over,))}
    if axis in reduced:
        raise _refuse(node, f"it reduces the batch axis {axis}", axis, _own_axes(reduced, axis, ndim))
    if node.attrs.get("keepdims", False):
        return axis
    return axis - sum(1 for x in reduced if x < axis)


def _own_axes(reduced: set[int], axis: int, ndim: int) -> str:
    """What to reduce instead of a reduction over batch axis ``axis``: the other axes it reduced, or else
    every axis of a row's own; a row of one value has none."""
    own = sorted(reduced - {axis}) or [x for x in range(ndim) if x != axis]
    if not own:
        return "leave this op out of the batched function: each row is one value, with no axis of its own"
    shown = own[0] if len(own) == 1 else tuple(own)
    return f"reduce only each row's own axes (axis={shown}; keepdims=True keeps it broadcastable against the rows)"


def _matmul(
    graph: Graph,
    axes: list[int | None],
    i: int,
    node: Node,
    exact: Exact,
) -> int:
    a, b = node.args[:2]
    left = graph.nodes[a] if isinstance(a, Ref) else None
    right = graph.nodes[b] if isinstance(b, Ref) else None
    la: int | None = None if left is None else axes[a]
    ra: int | None = None if right is None else axes[b]
    lnd = 0 if left is None else len(left.shape)
    rnd = 0 if right is None else len(right.shape)
    ndim = len(node.shape)
    # matmul's result: the broadcast stack axes, then the rows (a 2-d left's) and columns (a 2-d right's);
    # a 1-d operand has no stack axes and adds no axis of its own
    stack = ndim - (lnd >= 2) - (rnd >= 2)
    if ra is not None:
        assert right is not None
        stacked = node.op == "matmul" and rnd > 2 and ra < rnd - 2
        if not stacked:
            raise _refuse(node, f"the batch is on its right operand (axis {ra}), whose rows it sums over", ra)
        where = ra + stack - (rnd - 2)
        if la is not None and (la >= lnd - 2 or la + stack - (lnd - 2) != where):
            raise _refuse(node, "its operands are batched along different axes", where)
        at = where - stack + (lnd - 2)
        if la is None and left is not None and lnd > 2 and at >= 0 and left.shape[at] != 1:
            raise _refuse(node, f"it pairs the batch with the {left.shape[at]} matrices of its left", where)
        return where
    assert la is not None and left is not None
    if la == lnd - 1:
        raise _refuse(node, f"it sums over the batch axis {la} of its left operand", la)
    if node.op == "dot":  # dot(a, b): a's axes but the last, then b's
        exact[i] = ((la, None), la)
        return la
    if la == lnd - 2:  # the rows of a matrix product (of a matrix-vector product, its only axis)
        where = ndim - 1 if rnd == 1 else ndim - 2
        exact[i] = ((la, None), where)
        return where
    where = la + stack - (lnd - 2)  # a stacked axis: each caller's matrices are products of their own
    if right is not None and rnd > 2 and (at := where - stack + (rnd - 2)) >= 0 and right.shape[at] != 1:
        raise _refuse(node, f"it pairs the batch with the {right.shape[at]} matrices of its right", where)
    return where


def _getitem(graph: Graph, axes: list[int | None], node: Node) -> int:
    (a,) = _refs(node)
    src = graph.nodes[a]
    axis = _axis(axes, a)
    index = node.attrs["index"]
    items = index if isinstance(index, tuple) else (index,)
    if any(not (x is None or x is Ellipsis or isinstance(x, slice | int | np.integer)) for x in items):
        raise _refuse(node, "an array index may pick or repeat rows of the batch", axis)
    used = sum(1 for x in items if x is not None and x is not Ellipsis)
    expanded: list[Any] = []
    for x in items:
        expanded += [slice(None)] * (len(src.shape) - used) if x is Ellipsis else [x]
    expanded += [slice(None)] * (len(src.shape) - sum(1 for x in expanded if x is not None))
    dim = out = 0
    for x in expanded:
        if x is None:
            out += 1
            continue
        if dim == axis:
            if not isinstance(x, slice):
                raise _refuse(node, f"x[{x}] picks one row of the batch", axis)
            if x.indices(src.shape[dim]) != (0, src.shape[dim], 1):
                raise _refuse(node, f"the slice {x.start}:{x.stop}:{x.step} does not keep every row", axis)
            return out
        dim += 1
        out += isinstance(x, slice)
    raise AssertionError("the batch axis is always indexed")


def _reshape(graph: Graph, axes: list[int | None], node: Node) -> int:
    (a,) = _refs(node)
    src = graph.nodes[a]
    axis = _axis(axes, a)
    before = math.prod(src.shape[:axis])
    rows = src.shape[axis]
    found = [
        o for o in range(len(node.shape)) if node.shape[o] == rows and math.prod(node.shape[:o]) == before
    ]
    if not found:
        raise _refuse(
            node, f"it reshapes {list(src.shape)} to {list(node.shape)}, which merges or splits rows", axis
        )
    return axis if axis in found else found[0]


def _join(graph: Graph, axes: list[int | None], node: Node) -> int:
    refs = _refs(node)
    batched = {axes[r] for r in refs}
    if None in batched:
        raise _refuse(
            node, "it joins the batch with an unbatched operand, whose rows would pair with callers'"
        )
    if len(batched) != 1:
        raise _refuse(node, "its operands are batched along different axes")
    axis = _axis(axes, refs[0])
    ndim = len(graph.nodes[refs[0]].shape)
    along = node.attrs.get("axis", 0)
    if node.op == "concatenate":
        if along is None or _norm(along, ndim) == axis:
            raise _refuse(node, "it joins along the batch axis, adding rows", axis)
        return axis
    new = _norm(along, ndim + 1)
    return axis if axis < new else axis + 1


def _write(graph: Graph, axes: list[int | None], i: int, node: Node) -> int | None:
    """A write into earlier memory: the batch must line up with the rows already there."""
    assert node.out is not None
    target = axes[node.out]
    if node.op == "setitem":
        value = node.args[1]
        batched_value = isinstance(value, Ref) and axes[value] is not None
        if target is None:
            if batched_value:
                raise _refuse(node, "it writes the batch's rows into memory that has no rows of the batch")
            return None
        tnode = graph.nodes[node.out]
        probe = Node("getitem", (Ref(node.out),), {"index": node.attrs["index"]}, (), tnode.dtype, 0)
        probe.shape = np.empty(tnode.shape, np.bool_)[node.attrs["index"]].shape
        where = _getitem(graph, axes, probe)
        if batched_value:
            _broadcast(graph, axes, node, [value], probe.shape)  # lines up with the selected rows
            if _axis(axes, value) + len(probe.shape) - len(graph.nodes[value].shape) != where:
                raise _refuse(node, "it writes rows of the batch into other rows", where)
        return target
    refs = [a for a in node.args if isinstance(a, Ref)]
    if not any(axes[a] is not None for a in refs):
        return target
    fn = OPS[node.op].fn
    if node.op not in _ELEMENTWISE and not (isinstance(fn, np.ufunc) and not fn.signature):
        raise _refuse(node, f"schedsvc cannot prove {node.op}(..., out=...) keeps the rows apart")
    if target is None:
        raise _refuse(node, "it writes the batch's rows into memory that has no rows of the batch")
    where = _broadcast(graph, axes, node, node.args, node.shape)
    if where != target:
        raise _refuse(node, "it writes rows of the batch into other rows", target)
    return target


# -- exact replay ------------------------------------------------------------------------


def exact_fn(node: Node, operands: tuple[int | None, ...], out_axis: int) -> Callable[..., Any]:
    """``node`` computing each caller's rows as the caller's own call would, bit for bit.

    The replacement takes the node's operands, then ``spans`` (each caller's (start, stop) along the
    batch axis, in order from 0), then the node's attributes (and ``out=`` for a write).  The rows past
    the callers' (the padding) are not computed one by one: they are copies of the first row's result,
    dropped at the end, there only so that later ops see values like the callers'.
    """
    fn = OPS[node.op].fn
    n = len(node.args)
    if node.op in ("matmul", "dot") and node.out is None:
        axis = operands[0]
        assert axis is not None
        stackable = node.op == "matmul" and axis == 0 and len(node.args) == 2

        def product(a: Any, b: Any, spans: Sequence[tuple[int, int]], **attrs: Any) -> Any:
            first, stop = spans[0]
            k = stop - first
            n = len(spans)
            if stackable and a.ndim == 2 and all(e - s == k for s, e in spans):  # one stacked product
                out = fn(a[: n * k].reshape(n, k, a.shape[1]), b, **attrs)
                out = out.reshape(n * k, *out.shape[2:])
            else:
                out = np.concatenate([fn(_own(a, axis, s, e), b, **attrs) for s, e in spans], axis=out_axis)
            return _padded(out, out_axis, a.shape[axis])

        return product
    whole = out_axis == 0 and all(a in (None, 0) for a in operands)
    batched = next((i for i, a in enumerate(operands) if a is not None), None)

    def rows(*args: Any, **attrs: Any) -> Any:
        values, spans = args[:n], args[n]
        out = attrs.pop("out", None)
        arrays = [v for v in (*values, out) if type(v) is np.ndarray]
        if whole and all(v.flags.c_contiguous for v in arrays):  # each caller's rows as in its own call
            return fn(*values, **attrs) if out is None else fn(*values, out=out, **attrs)
        parts = []
        for s, e in spans:
            mine = [v if a is None else _own(v, a, s, e) for v, a in zip(values, operands, strict=True)]
            if out is None:
                parts.append(fn(*mine, **attrs))
                continue
            target = out[(slice(None),) * out_axis + (slice(s, e),)]
            if target.flags.c_contiguous or not out.flags.c_contiguous:
                fn(*mine, out=target, **attrs)
            else:  # the caller's own call writes a C-contiguous array
                target[...] = fn(*mine, out=np.empty(target.shape, out.dtype), **attrs)
        if out is not None:
            lead = (slice(None),) * out_axis
            stop = spans[-1][1]
            if stop < out.shape[out_axis]:  # the padding: copies of the first row, as _padded makes
                out[(*lead, slice(stop, None))] = out[(*lead, slice(0, 1))]
            return out
        joined = np.concatenate(parts, axis=out_axis)
        if batched is None:
            return joined
        return _padded(joined, out_axis, values[batched].shape[operands[batched]])

    return rows


def _padded(out: Any, axis: int, size: int) -> Any:
    """``out`` (the callers' rows) made ``size`` rows long along ``axis`` with copies of its first row."""
    have = out.shape[axis]
    if have == size:
        return out
    first = np.take(out, [0], axis=axis)
    return np.concatenate([out, np.repeat(first, size - have, axis=axis)], axis=axis)


def _own(value: Any, axis: int, start: int, stop: int) -> Any:
    """A caller's rows of ``value`` laid out as in its own call: a fresh (C-contiguous) batch array's rows
    copied to a fresh array; a view's rows as a view (its strides are the caller's own)."""
    if type(value) is not np.ndarray:
        return value
    rows = value[(slice(None),) * axis + (slice(start, stop),)]
    if value.flags.c_contiguous and not rows.flags.c_contiguous:
        return np.ascontiguousarray(rows)
    return rows
