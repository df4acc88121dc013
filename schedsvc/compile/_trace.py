"""Tracing: run a function once on symbolic tensors and record every array operation.

While a trace runs on a thread, every Tensor operation there is recorded
instead of queued (``schedsvc._tracing.tracing``).  Arrays the function
captures become constants (copied -- a constant cannot change under a compiled
graph -- once per compiled function, see ``Constants``), and so do computed Tensors; anything a replay could not repeat --
needing a value (``if t > 0``), printing, submitting tasks, writing an
argument or a captured array in place, storing a traced tensor outside the
function -- raises ``ss.TraceError`` that says what happened.
"""

from __future__ import annotations

import gc
import inspect
import os
import sys
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from .._core import FINAL_STATES
from .._errors import TraceError
from .._future import Future
from .._runtime import Found
from .._tracing import ACTIVE, tracing
from ..devices import binding_of
from ..tensor import ArrayOps, Op, Tensor, check_out
from ._graph import Constants, Graph, Node, Ref, optimize

__all__ = ["Symbol", "trace"]

_SCALARS = (int, float, complex, bool, np.generic)


class Symbol(ArrayOps):
    """A tensor inside a function being traced: its shape and dtype, and the node that computes it."""

    __slots__ = ("__weakref__", "_trace", "dtype", "node", "shape")
    _op_priority = 2
    __hash__ = object.__hash__

    def __init__(self, trace: _Trace, node: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self._trace = trace
        self.node = node
        self.shape = shape
        self.dtype = dtype

    @classmethod
    def _run_op(cls, op: Op, operands: tuple[Any, ...], attrs: dict[str, Any], target: Any) -> Any:
        current = tracing.trace if tracing.depth else None
        if current is None:
            raise TraceError(
                f"{op.name}() on a traced tensor after its trace ended: the compiled function stored a "
                "traced tensor somewhere (a global, a list, an attribute); return it instead"
            )
        return current.record(op, operands, attrs, target)

    def _needs_value(self, what: str) -> NoReturn:
        raise TraceError(
            f"{what} of a traced tensor ({self!r}) needs its value, which does not exist while tracing: "
            "data-dependent Python control flow cannot be compiled. Use np.where / np.maximum "
            "instead of if/else, or leave this part outside the compiled function"
        )

    def __bool__(self) -> bool:
        self._needs_value("bool()")

    def __float__(self) -> float:
        self._needs_value("float()")

    def __int__(self) -> int:
        self._needs_value("int()")

    def __index__(self) -> int:
        self._needs_value("index()")

    def __complex__(self) -> complex:
        self._needs_value("complex()")

    def item(self) -> Any:
        self._needs_value("item()")

    def tolist(self) -> Any:
        self._needs_value("tolist()")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        self._needs_value("np.asarray()")

    def __str__(self) -> str:
        raise TraceError(
            f"print()/str() of a traced tensor ({self!r}): a Python side effect that would happen "
            "once, while tracing, and never on replay. Return the tensor and print it after awaiting"
        )

    def __format__(self, spec: str) -> str:
        return self.__str__()

    def __await__(self) -> Any:
        raise TraceError("'await' inside a compiled function: compiled functions are synchronous array code")

    def __schedsvc_visit__(self, found: Found, write: bool) -> None:
        raise TraceError(
            "eng.submit(...) with a traced tensor inside a compiled function: submitting a task is a "
            "side effect a replay would not repeat; call the function on Tensors outside the compiled code"
        )

    def __repr__(self) -> str:
        return f"<traced %{self.node}: {self.dtype}[{', '.join(map(str, self.shape))}]>"


class _Trace:
    """The graph being recorded."""

    def __init__(self, name: str, constants: Constants) -> None:
        self.name = name
        self.constants = constants
        self.nodes: list[Node] = []
        self.consts: dict[int, tuple[Any, int]] = {}  # id(array) -> (array, node): one node per capture
        self.symbols: list[weakref.ref[Symbol]] = []

    def symbol(self, node: int) -> Symbol:
        n = self.nodes[node]
        sym = Symbol(self, node, n.shape, n.dtype)
        self.symbols.append(weakref.ref(sym))
        return sym

    def input(self, position: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Symbol:
        index = len(self.nodes)
        self.nodes.append(Node("input", (), {}, shape, dtype, index, value=position))
        return self.symbol(index)

    def const(self, array: Any) -> Ref:
        seen = self.consts.get(id(array))
        if seen is not None:
            return Ref(seen[1])
        value = self.constants.snapshot(array)
        index = len(self.nodes)
        self.nodes.append(Node("const", (), {}, value.shape, value.dtype, index, value=value))
        self.consts[id(array)] = (array, index)
        return Ref(index)

    def operand(self, obj: Any, op: Op) -> tuple[Any, Any]:
        """(graph operand, meta) of one operand."""
        if isinstance(obj, Symbol):
            if obj._trace is not self:
                raise TraceError(f"{op.name}(): a traced tensor from another trace; pass it as an argument")
            return Ref(obj.node), (obj.shape, obj.dtype)
        if obj is None or isinstance(obj, _SCALARS):
            return obj, obj
        if isinstance(obj, Tensor):
            last = obj.owner._last_write
            if obj.state != "done" or (last is not None and last.state not in FINAL_STATES):
                raise TraceError(
                    f"{op.name}(): {obj!r} is an engine Tensor that is still being computed, used inside a "
                    "compiled function; pass it as an argument instead of capturing it"
                )
            obj = obj.value
        elif isinstance(obj, Future):
            raise TraceError(
                f"{op.name}(): a Future inside a compiled function; pass its value as an argument"
            )
        array = obj if isinstance(obj, np.ndarray) else _host_array(obj)
        ref = self.const(array)
        return ref, (array.shape, array.dtype)

    def record(self, op: Op, operands: Sequence[Any], attrs: dict[str, Any], target: Any) -> Any:
        args, metas = [], []
        for obj in operands:
            arg, meta = self.operand(obj, op)
            args.append(arg)
            metas.append(meta)
        shape, dtype, view = op.infer(metas, attrs)
        index = len(self.nodes)
        if target is not None:
            return self.write(op, tuple(args), attrs, shape, dtype, target)
        base = self.nodes[args[0]].base if view else index
        self.nodes.append(Node(op.name, tuple(args), dict(attrs), shape, dtype, base, site=_site()))
        return self.symbol(index)

    def write(
        self, op: Op, args: tuple[Any, ...], attrs: dict[str, Any], shape: Any, dtype: Any, target: Any
    ) -> Symbol:
        if not isinstance(target, Symbol):
            raise TraceError(
                f"{op.name}(..., out=...) writes {type(target).__name__} memory from outside the compiled "
                "function: a side effect a replay would not repeat"
            )
        check_out(op, shape, dtype, target)
        base = self.nodes[target.node].base
        owner = self.nodes[base]
        if owner.op in ("input", "const"):
            what = "an argument" if owner.op == "input" else "a captured array"
            raise TraceError(
                f"in-place {op.name} on {what} ({target!r}) inside a compiled function: it would change "
                f"the caller's data. Write 'y = x + ...' instead of 'x += ...'"
            )
        index = len(self.nodes)
        node = Node(
            op.name, args, dict(attrs), target.shape, target.dtype, base, out=target.node, site=_site()
        )
        self.nodes.append(node)
        target.node = index  # the Python name now means the written value
        return target


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_NUMPY = os.path.dirname(os.path.abspath(np.__file__)) + os.sep


def _site() -> tuple[str, int] | None:
    """The (file, line) of the user's code that made the op being recorded: the first caller outside
    schedsvc and NumPy, inside the traced function (None for a function of schedsvc's own).  (Tracing
    only: a replay never records.)"""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code is not _TRACE_CODE:  # (not past the traced function's caller)
        path = frame.f_code.co_filename
        if not (path.startswith(_PACKAGE) or path.startswith(_NUMPY)):
            return path, frame.f_lineno
        frame = frame.f_back
    return None


def trace(
    fn: Callable[..., Any],
    name: str,
    args: list[Any],
    kwargs: dict[str, Any],
    inputs: list[Any],
    constants: Constants | None = None,
) -> Graph:
    """Trace ``fn(*args, **kwargs)``; ``inputs`` are (slot, shape, dtype) of the array arguments.

    Captured arrays and folded constants come from (and go into) ``constants``,
    shared with the other signatures of the same compiled function.
    """
    constants = Constants() if constants is None else constants
    record = _Trace(name, constants)
    args = list(args)
    kwargs = dict(kwargs)
    input_nodes = []
    for position, (slot, shape, dtype) in enumerate(inputs):
        sym = record.input(position, shape, dtype)
        input_nodes.append(sym.node)
        if isinstance(slot, int):
            args[slot] = sym
        else:
            kwargs[slot] = sym
        del sym
    previous = tracing.trace if tracing.depth else None
    tracing.trace = record
    tracing.depth += 1
    ACTIVE[0] += 1
    try:
        result = fn(*args, **kwargs)
    finally:
        ACTIVE[0] -= 1
        tracing.depth -= 1
        tracing.trace = previous
    del args, kwargs
    if inspect.iscoroutine(result):
        result.close()
        raise TraceError(
            "the compiled function returned a coroutine: compile synchronous array code, not async def"
        )
    kind = "tuple" if type(result) is tuple else "list" if type(result) is list else "single"
    values = result if kind != "single" else (result,)
    outputs = [
        _output(record, r, "" if kind == "single" else f" as item {i} of the returned {kind}")
        for i, r in enumerate(values)
    ]
    del result, values  # (the leak check below must see no reference to a traced tensor here)
    _check_leaks(record, set(outputs))
    graph = optimize(Graph(name, record.nodes, input_nodes, outputs, kind))
    constants.share(graph)
    return graph


_TRACE_CODE = trace.__code__  # where _site stops


def _host_array(obj: Any) -> np.ndarray[Any, Any]:
    """A captured value as NumPy; a device array (a finished cuda Tensor's, say) is copied to the host,
    as every capture is snapshotted: a replay on its device gets it copied back there once."""
    if binding_of(obj) is not None:  # its values are complete: the copy waits for nothing else
        return np.asarray(obj.get())
    return np.asarray(obj)


def _output(record: _Trace, value: Any, where: str) -> int:
    """The node of one returned value; ``where`` says where it was found (as an item of the result)."""
    if isinstance(value, Symbol) and value._trace is record:
        return value.node
    if isinstance(value, np.ndarray | Tensor):  # a constant result
        ref, _ = record.operand(value, _RETURN)
        return int(ref)
    message = (
        "a compiled function must return a tensor or a flat tuple or list of tensors (a NumPy array or a "
        f"finished Tensor is returned as a constant); got {type(value).__name__}{where}"
    )
    if where and isinstance(value, tuple | list | dict):
        message += ": nested containers are not supported; return one flat tuple or list (return a, b rather than [[a], b])"
    raise TraceError(message)


def _alive(record: _Trace) -> list[Symbol]:
    """The traced tensors of ``record`` still referenced.  (No walrus in a comprehension here: its name
    would be bound in the caller's scope and keep the last symbol alive through the ``gc.collect``.)"""
    return [s for s in (ref() for ref in record.symbols) if s is not None]


_RETURN = Op("return", lambda: None, lambda metas, attrs: ((), np.dtype(float), False))


def _check_leaks(record: _Trace, outputs: set[int]) -> None:
    alive = _alive(record)
    if alive:
        del alive
        gc.collect()  # cycles (a closure referring to itself, a caught exception's frames) are not leaks
        alive = _alive(record)
    if alive:
        raise TraceError(
            f"traced tensor {alive[0]!r} outlived the trace: the compiled function stored it outside "
            "itself (a global, a list, an attribute). A replay would not repeat that side effect; "
            "return the tensor instead"
        )
