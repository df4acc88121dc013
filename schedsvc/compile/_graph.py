"""The traced graph: nodes in program order, the optimisation passes, and the replay code.

A node is one registry op (``schedsvc.tensor.OPS``) on operands that are
references to earlier nodes (``Ref``) or literals (scalars, None), or an
``input`` / ``const``.  A *write* node (``out`` set) stores its result into
an earlier node's memory, as ``t += 1``, ``out=`` and ``t[i] = v`` do; each
node records the node whose memory its value lives in (``base``), so views
and writes alias exactly as in NumPy.

Optimisation, in order: constant folding (a node whose operands are all
constants is computed once, at compile time), common-subexpression
elimination, dead-code elimination (writes stay while their memory is read
later), then a memory plan: an elementwise ufunc writes into an operand whose
last use it is (same shape and dtype, memory nobody else aliases), and every
intermediate is dropped after its last use.  The plan is emitted as one
straight-line Python function of NumPy calls: a replay is one task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..tensor import OPS

__all__ = ["Constants", "Graph", "Node", "Ref", "dead_code_dropped", "memory_plan", "optimize", "work_bytes"]


class Ref(int):
    """An operand that refers to the node with this index."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"%{int(self)}"

    def __str__(self) -> str:  # the index alone, as for an int ("v{ref}" names its variable)
        return int.__repr__(self)

    def __format__(self, spec: str) -> str:
        return format(int(self), spec)


@dataclasses.dataclass(slots=True)
class Node:
    op: str  # a registry op, or "input" / "const"
    args: tuple[Any, ...]  # Ref | literal
    attrs: dict[str, Any]
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    base: int  # the node whose memory holds this value
    out: int | None = None  # write node: the node whose memory it writes
    value: Any = None  # const: the array (read-only); input: its position
    # where the traced function made it (file, line), for messages; not part of what the node computes
    site: tuple[str, int] | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass
class Graph:
    """A traced function: nodes in program order, inputs, outputs and what optimising did."""

    name: str
    nodes: list[Node]
    inputs: list[int]
    outputs: list[int]
    out_kind: str = "single"  # "single", "tuple" or "list"
    report: dict[str, int] = dataclasses.field(default_factory=dict)
    reuse: dict[int, int] = dataclasses.field(default_factory=dict)  # node -> operand whose memory it reuses

    def __str__(self) -> str:
        ins = ", ".join(f"%{i}: {_type(self.nodes[i])}" for i in self.inputs)
        outs = ", ".join(f"%{i}" for i in self.outputs)
        lines = [f"graph {self.name}({ins}) -> {outs}"]
        for i, node in enumerate(self.nodes):
            if node.op in ("input", "dead"):
                continue
            lines.append(f"  %{i:<3} = {_describe(self, i, node):<48} {_type(node)}")
        lines.append(f"  return {outs}")
        if self.report:
            lines.append("  # " + ", ".join(f"{k}: {v}" for k, v in self.report.items()))
        return "\n".join(lines)

    __repr__ = __str__


def _type(node: Node) -> str:
    return f"{node.dtype}[{', '.join(str(d) for d in node.shape)}]"


def _describe(graph: Graph, i: int, node: Node) -> str:
    if node.op == "const":
        return "const"
    parts = [repr(a) if isinstance(a, Ref) else _literal(a) for a in node.args]
    parts += [f"{k}={_literal(v)}" for k, v in node.attrs.items()]
    if node.out is not None:
        parts.append(f"out=%{node.out}")
    elif i in graph.reuse:
        parts.append(f"out=%{graph.reuse[i]} (reused)")
    return f"{node.op}({', '.join(parts)})"


def _literal(value: Any) -> str:
    if isinstance(value, np.dtype):
        return str(value)
    if isinstance(value, tuple):
        return f"({', '.join(_literal(v) for v in value)}{',' if len(value) == 1 else ''})"
    if value is Ellipsis:
        return "..."
    if isinstance(value, slice):
        text = f"{'' if value.start is None else value.start}:{'' if value.stop is None else value.stop}"
        return text if value.step is None else f"{text}:{value.step}"
    return repr(value)


# -- constants ---------------------------------------------------------------------


class Constants:
    """The constant arrays of one compiled function, each held once and shared by all its signatures' graphs.

    An array is keyed by dtype, shape, memory order and a digest of its bytes
    (bytes, not values: -0.0 and 0.0 stay apart), so a captured array traced
    again for a new signature, an equal capture, or a constant folded to the
    same value, reuses the read-only array already held instead of a copy.
    Held weakly: an array no cached graph uses any more is freed.
    """

    def __init__(self) -> None:
        self._arrays: weakref.WeakValueDictionary[Any, np.ndarray] = weakref.WeakValueDictionary()

    def snapshot(self, array: np.ndarray) -> np.ndarray:
        """A read-only copy of ``array`` as it is now: the one held already when it has these bytes."""
        key = _key_of(array)
        held = None if key is None else self._arrays.get(key)
        if held is not None:
            return held
        value = np.array(array, copy=True)  # later changes to the original do not leak in
        value.flags.writeable = False
        return self._hold(value, _key_of(value) if key is None else key)

    def share(self, graph: Graph) -> None:
        """Point every constant node of ``graph`` at the held array with its bytes (holding it if new)."""
        for node in graph.nodes:
            if node.op == "const" and type(node.value) is np.ndarray and not node.value.flags.writeable:
                node.value = self._hold(node.value, _key_of(node.value))

    def arrays(self) -> list[np.ndarray]:
        """The arrays held now."""
        return list(self._arrays.values())

    def _hold(self, value: np.ndarray, key: Any) -> np.ndarray:
        if key is None:
            return value
        held = self._arrays.get(key)
        if held is None:
            self._arrays[key] = held = value
        return held


def _key_of(array: np.ndarray) -> Any:
    """(dtype, shape, order, digest of the bytes), or None for an array that is not shared."""
    if array.dtype.hasobject:  # its bytes are pointers
        return None
    if array.flags.c_contiguous:
        flat, order = array, "C"
    elif array.flags.f_contiguous:  # kept apart from a C copy: NumPy's results follow the layout
        flat, order = array.T, "F"
    else:
        return None
    try:
        data = flat.reshape(-1).view(np.uint8)
    except (TypeError, ValueError):  # a dtype of size 0
        return None
    digest = hashlib.blake2b(data.data, digest_size=32).digest()
    return array.dtype, array.dtype.char, array.shape, order, digest


# -- optimisation ------------------------------------------------------------------


def optimize(graph: Graph) -> Graph:
    """Fold constants, merge common subexpressions, drop dead code, plan memory reuse."""
    report = {"traced": sum(1 for n in graph.nodes if n.op not in ("input", "const"))}
    folded = _fold(graph)
    merged = _cse(graph)
    graph = dead_code_dropped(graph)
    graph.reuse = memory_plan(graph)
    report.update(folded=folded, merged=merged)
    report["kept"] = sum(1 for n in graph.nodes if n.op not in ("input", "const", "dead"))
    report["reused"] = len(graph.reuse)
    graph.report = report
    return graph


def _written(graph: Graph) -> set[int]:
    """Bases of memory some node writes."""
    return {node.base for node in graph.nodes if node.out is not None}


def _fold(graph: Graph) -> int:
    """Compute, at compile time, every node whose operands are all constants."""
    written = _written(graph)
    count = 0
    for i, node in enumerate(graph.nodes):
        if node.op in ("input", "const") or node.out is not None or node.base in written:
            continue
        refs = [a for a in node.args if isinstance(a, Ref)]
        if any(graph.nodes[r].op != "const" for r in refs):
            continue
        values = [graph.nodes[a].value if isinstance(a, Ref) else a for a in node.args]
        try:
            with np.errstate(all="ignore"):
                value = OPS[node.op].fn(*values, **node.attrs)
        except Exception:  # leave it to run (and fail) at replay, as it would eagerly
            continue
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
        graph.nodes[i] = Node("const", (), {}, node.shape, node.dtype, i, value=value)
        count += 1
    return count


def _cse(graph: Graph) -> int:
    """Point uses of a repeated computation at its first occurrence (memory that is written excepted)."""
    written = _written(graph)
    outputs = set(graph.outputs)  # two equal outputs are still two arrays, as eagerly
    seen: dict[Any, int] = {}
    alias: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        if alias:
            node.args = tuple(Ref(alias.get(a, a)) if isinstance(a, Ref) else a for a in node.args)
            node.base = alias.get(node.base, node.base)  # a view of a merged node views the kept one
            if node.out is not None:
                node.out = alias.get(node.out, node.out)
        if node.op in ("input", "const") or node.out is not None or node.base in written:
            continue
        if any(isinstance(a, Ref) and graph.nodes[a].base in written for a in node.args):
            continue
        key = _key(node)
        if key is None:
            continue
        first = seen.setdefault(key, i)
        if first != i and i not in outputs:
            alias[i] = first
    graph.outputs = [alias.get(o, o) for o in graph.outputs]
    return len(alias)


def _key(node: Node) -> Any:
    """What makes two nodes the same computation; literals by repr, which tells -0.0 from 0.0."""
    args = tuple(int(a) if isinstance(a, Ref) else (type(a), repr(a)) for a in node.args)
    return node.op, args, repr(sorted(node.attrs.items()))


def dead_code_dropped(graph: Graph) -> Graph:
    """Keep what the outputs need: their nodes, and every write to memory read after it."""
    nodes = graph.nodes
    live = set(graph.outputs)
    read_later = {nodes[o].base for o in graph.outputs}
    for i in range(len(nodes) - 1, -1, -1):
        node = nodes[i]
        if node.out is not None and node.base in read_later:
            live.add(i)
        if i not in live:
            continue
        for a in node.args:
            if isinstance(a, Ref):
                live.add(a)
                read_later.add(nodes[a].base)
        if node.out is not None:
            live.add(node.out)
    live.update(graph.inputs)  # inputs keep their positions even when unused
    graph.nodes = [
        n if i in live else Node("dead", (), {}, n.shape, n.dtype, n.base) for i, n in enumerate(nodes)
    ]
    return graph


#: ufuncs whose results are the same bits written in place as into a new array.  Transcendental ones
#: (sin, exp, arctan2, power, ...) are not: NumPy runs their SIMD loops only when the output does not
#: overlap an input, and its scalar loop rounds differently.
_EXACT_IN_PLACE = frozenset(
    getattr(np, name)
    for name in [
        "add",
        "subtract",
        "multiply",
        "true_divide",
        "floor_divide",
        "remainder",
        "fmod",
        "negative",
        "positive",
        "absolute",
        "fabs",
        "maximum",
        "minimum",
        "fmax",
        "fmin",
        "sqrt",
        "square",
        "reciprocal",
        "sign",
        "copysign",
        "floor",
        "ceil",
        "trunc",
        "rint",
        "less",
        "less_equal",
        "greater",
        "greater_equal",
        "equal",
        "not_equal",
        "logical_and",
        "logical_or",
        "logical_xor",
        "logical_not",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "invert",
        "left_shift",
        "right_shift",
    ]
)


def memory_plan(graph: Graph) -> dict[int, int]:
    """Elementwise ufunc nodes that write into an operand's memory, where that use is the memory's last.

    The memory must be computed inside the graph (not an input or a
    constant), never written by a write node, and whole: the operand is the
    array that owns it or an earlier reuse of it, never a view.
    """
    nodes = graph.nodes
    last_use = _last_uses(graph)
    end = len(nodes)
    memory_last: dict[int, int] = {}  # memory (base) -> last use of anything living in it
    for ref, i in last_use.items():
        base = nodes[ref].base
        memory_last[base] = max(memory_last.get(base, -1), i)
    written = _written(graph)
    whole = {i for i, n in enumerate(nodes) if n.base == i and n.op not in ("input", "const", "dead")}
    reuse: dict[int, int] = {}
    for i, node in enumerate(nodes):
        fn = OPS[node.op].fn if node.op in OPS else None
        if node.out is not None or not node.shape or fn not in _EXACT_IN_PLACE:
            continue
        if i in written:  # its memory is written through later: it keeps its own
            continue
        for a in node.args:
            if not isinstance(a, Ref) or a not in whole:
                continue
            src = nodes[a]
            base = src.base
            if (
                base in written
                or memory_last.get(base) != i
                or (src.shape, src.dtype) != (node.shape, node.dtype)
            ):
                continue
            reuse[i] = a
            node.base = base
            whole.add(i)
            # node i and its views now live in that memory: their uses are its uses
            memory_last[base] = memory_last.get(i, last_use.get(i, end))
            for other in nodes[i + 1 :]:
                if other.base == i:
                    other.base = base
            break
    return reuse


def work_bytes(graph: Graph) -> int:
    """The most bytes a replay's arrays hold at once, at most: each array an op makes (a reuse counted as a
    new one, as it is when its operand is not C-contiguous) held until the last use of its memory, the
    outputs to the end, and the copy of a constant output."""
    nodes = graph.nodes
    memory_last: dict[int, int] = {}
    for ref, i in _last_uses(graph).items():
        base = nodes[ref].base
        memory_last[base] = max(memory_last.get(base, -1), i)
    freed: dict[int, int] = {}  # node -> bytes freed once it has run
    held = peak = 0
    for i, node in enumerate(nodes):
        makes = node.base == i or i in graph.reuse
        if makes and node.out is None and node.op not in ("input", "const", "dead"):
            nbytes = _nbytes(node)
            held += nbytes
            peak = max(peak, held)
            last = memory_last.get(node.base, i)
            freed[last] = freed.get(last, 0) + nbytes
        held -= freed.pop(i, 0)
    return peak + sum(_nbytes(nodes[o]) for o in graph.outputs if nodes[o].op == "const")


def _nbytes(node: Node) -> int:
    return math.prod(node.shape) * node.dtype.itemsize


def _last_uses(graph: Graph) -> dict[int, int]:
    last: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for a in node.args:
            if isinstance(a, Ref):
                last[a] = i
        if node.out is not None:
            last[node.out] = i
    for o in graph.outputs:
        last[o] = len(graph.nodes)
    return last


# -- replay code -----------------------------------------------------------------------


def emit(
    graph: Graph, rows: dict[int, Callable[..., Any]] | None = None, const_params: Sequence[int] = ()
) -> Callable[..., Any]:
    """One Python function of NumPy calls that computes the graph's outputs from its inputs.

    ``rows``: nodes computed by another function, called with the node's operands, the replay's last
    argument ``spans``, its attributes and, for a write, ``out`` (a batched replay's nodes that compute each
    caller's rows as its own call would, ``_rows.exact_fn``).  ``const_params``: constant nodes whose
    values are parameters after the inputs instead of the graph's arrays (a cuda replay takes them on
    its device).
    """
    rows = rows or {}
    namespace: dict[str, Any] = {}
    lines: list[str] = []
    last = _last_uses(graph)
    drop_after: dict[int, list[int]] = {}
    for ref, i in last.items():
        if i < len(graph.nodes) and graph.nodes[ref].op != "const":
            drop_after.setdefault(i, []).append(ref)
    for i, node in enumerate(graph.nodes):
        if node.op in ("input", "dead"):
            continue
        if node.op == "const":
            if i not in const_params:
                namespace[f"c{i}"] = node.value
            continue
        namespace[f"f_{node.op}"] = OPS[node.op].fn
        parts = [_operand(graph, a, namespace, f"k{i}_{j}") for j, a in enumerate(node.args)]
        for key, value in node.attrs.items():
            namespace[f"a{i}_{key}"] = value
            parts.append(f"{key}=a{i}_{key}")
        call = f"f_{node.op}({', '.join(parts)})"
        if i in rows:
            namespace[f"r{i}"] = rows[i]
            out = [f"out={_name(graph, node.out)}"] if node.out is not None else []
            call = f"r{i}({', '.join([*parts[: len(node.args)], 'spans', *parts[len(node.args) :], *out])})"
        elif node.out is not None and node.op != "setitem":  # setitem writes its first operand
            call = f"f_{node.op}({', '.join([*parts, f'out={_name(graph, node.out)}'])})"
        elif i in graph.reuse:
            call = _reusing(graph, i, parts, call)
        lines.append(f"    v{i} = {call}")
        dead = [
            f"v{r}" for r in drop_after.get(i, ()) if graph.nodes[r].op != "input" and r not in graph.outputs
        ]
        if dead:
            lines.append(f"    del {', '.join(dead)}")
    # a constant output is copied: the caller may write it, the graph's stays read-only
    outs = [f"c{o}.copy()" if graph.nodes[o].op == "const" else _name(graph, o) for o in graph.outputs]
    result = outs[0] if graph.out_kind == "single" else f"({', '.join(outs)}{',' if len(outs) == 1 else ''})"
    params = ", ".join(
        [
            *(f"v{int(i)}" for i in graph.inputs),
            *(f"c{i}" for i in const_params),
            *(["spans"] if rows else []),
        ]
    )
    source = f"def replay({params}):\n" + "\n".join(lines) + f"\n    return {result}\n"
    code = compile(source, f"<schedsvc compiled {graph.name}>", "exec")
    exec(code, namespace)  # our own generated source: registry calls on named values
    replay: Callable[..., Any] = namespace["replay"]
    replay.__qualname__ = replay.__name__ = f"replay_{graph.name}"
    replay.source = source  # type: ignore[attr-defined]
    return replay


def _reusing(graph: Graph, i: int, parts: list[str], call: str) -> str:
    """Write into the dead operand's array -- when that gives the layout NumPy would choose.

    NumPy lays a new result out like its operands (order 'K'); an operand's
    array written in place keeps its own layout, so the two agree (and so do
    later reductions, bit for bit) when every array operand is C-contiguous.
    """
    node = graph.nodes[i]
    checks = []
    for a in node.args:
        if not isinstance(a, Ref):
            continue
        if graph.nodes[a].op == "const":
            if not graph.nodes[a].value.flags.c_contiguous:
                return call
        else:
            checks.append(f"v{int(a)}.flags.c_contiguous")
    reused = f"f_{node.op}({', '.join([*parts, f'out=v{graph.reuse[i]}'])})"
    return f"{reused} if {' and '.join(checks)} else {call}" if checks else reused


def _name(graph: Graph, ref: int) -> str:
    return f"c{ref}" if graph.nodes[ref].op == "const" else f"v{ref}"


def _operand(graph: Graph, arg: Any, namespace: dict[str, Any], slot: str) -> str:
    if isinstance(arg, Ref):
        return _name(graph, arg)
    namespace[slot] = arg
    return slot
