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

Exactness: BLAS computes one row of a many-row product with other rounding
than a one-row product, so ``exact_fn`` gives matmul/dot nodes whose rows are
the batch a replacement that computes each caller's rows as its own product
(one stacked matmul when every caller has the same number of rows).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import BatchError
from ..tensor import OPS
from ._graph import Graph, Node, Ref

__all__ = ["RowPlan", "exact_fn", "plan_rows"]

#: ops that combine operands element by element, broadcasting (besides the ufuncs)
_ELEMENTWISE = frozenset({"pow", "ipow", "where", "clip", "astype", "copy"})
_REDUCTIONS = frozenset({"sum", "mean", "prod", "max", "min", "argmax", "argmin", "any", "all"})


class RowPlan:
    """Per node, the axis its rows lie along (None: the same for every row); the output axes; the
    matmul/dot nodes a many-row BLAS product would round differently from one caller's own."""

    __slots__ = ("axes", "exact", "outputs")

    def __init__(self, axes: list[int | None], exact: dict[int, tuple[int, int]], outputs: list[int]) -> None:
        self.axes = axes
        self.exact = exact  # node -> (the batch axis of its left operand, of its result)
        self.outputs = outputs


def plan_rows(graph: Graph, batched: dict[int, int], name: str) -> RowPlan:
    """Prove ``graph`` keeps rows apart, with input ``position`` batched along ``batched[position]``."""
    nodes = graph.nodes
    axes: list[int | None] = [None] * len(nodes)
    exact: dict[int, tuple[int, int]] = {}
    for i, node in enumerate(nodes):
        if node.op == "input":
            axes[i] = batched.get(node.value)
        elif node.op in ("const", "dead"):
            continue
        elif node.out is not None:
            axes[i] = _write(graph, axes, i, node)
        elif any(isinstance(a, Ref) and axes[a] is not None for a in node.args):
            axes[i] = _rule(graph, axes, i, node, exact)
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


def _rule(graph: Graph, axes: list[int | None], i: int, node: Node, exact: dict[int, tuple[int, int]]) -> int:
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


def _refuse(node: Node, why: str, axis: int | None = None) -> BatchError:
    where = "" if axis is None else f" (batch axis {axis})"
    return BatchError(
        f"{node.op}(){where}: {why}, so a batched call would give a caller values that depend on other "
        "callers' rows. Leave this op out of the batched function, or compile it without batch_axis"
    )


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
        raise _refuse(node, "it reduces every axis, the batch axis too", axis)
    reduced = {_norm(x, ndim) for x in (over if isinstance(over, tuple) else (over,))}
    if axis in reduced:
        raise _refuse(node, f"it reduces the batch axis {axis}", axis)
    if node.attrs.get("keepdims", False):
        return axis
    return axis - sum(1 for x in reduced if x < axis)


def _matmul(
    graph: Graph, axes: list[int | None], i: int, node: Node, exact: dict[int, tuple[int, int]]
) -> int:
    a, b = node.args[:2]
    left = graph.nodes[a] if isinstance(a, Ref) else None
    right = graph.nodes[b] if isinstance(b, Ref) else None
    la: int | None = None if left is None else axes[a]
    ra: int | None = None if right is None else axes[b]
    lnd = 0 if left is None else len(left.shape)
    rnd = 0 if right is None else len(right.shape)
    ndim = len(node.shape)
    if ra is not None:
        assert right is not None
        stacked = node.op == "matmul" and rnd > 2 and ra < rnd - 2
        if not stacked:
            raise _refuse(node, f"the batch is on its right operand (axis {ra}), whose rows it sums over", ra)
        where = ra + ndim - rnd
        if la is not None and la + ndim - lnd != where:
            raise _refuse(node, "its operands are batched along different axes", where)
        at = where - (ndim - lnd)
        if la is None and left is not None and lnd > 2 and at >= 0 and left.shape[at] != 1:
            raise _refuse(node, f"it pairs the batch with the {left.shape[at]} matrices of its left", where)
        return where
    assert la is not None and left is not None
    if la == lnd - 1:
        raise _refuse(node, f"it sums over the batch axis {la} of its left operand", la)
    if node.op == "dot":  # dot(a, b): a's axes but the last, then b's
        exact[i] = (la, la)
        return la
    if la == lnd - 2:  # the rows of a matrix product (of a matrix-vector product, its only axis)
        where = ndim - 1 if rnd == 1 else ndim - 2
        exact[i] = (la, where)
        return where
    where = la + ndim - lnd  # a stacked axis: each caller's matrices are products of their own
    if right is not None and rnd > 2 and (at := where - (ndim - rnd)) >= 0 and right.shape[at] != 1:
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


def exact_fn(op: str, axis: int, ndim: int, out_axis: int) -> Callable[..., Any]:
    """``op`` (matmul/dot) computing each caller's rows (``spans``: (start, stop) along ``axis`` of the
    left operand, of ``ndim`` axes; ``out_axis`` of the result) as its own product: bit for bit the
    unbatched call's."""
    fn = OPS[op].fn

    def rows(a: Any, b: Any, spans: Sequence[tuple[int, int]], **attrs: Any) -> Any:
        first, stop = spans[0]
        k = stop - first
        one_length = all(e - s == k for s, e in spans)
        if op == "matmul" and ndim == 2 and axis == 0 and one_length:  # one stacked product
            product = fn(a.reshape(len(spans), k, a.shape[1]), b, **attrs)
            return product.reshape(len(spans) * k, *product.shape[2:])
        lead = (slice(None),) * axis
        parts = [fn(a[(*lead, slice(s, e))], b, **attrs) for s, e in spans]
        return np.concatenate(parts, axis=out_axis)

    return rows
