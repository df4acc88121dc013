"""A compiled function's saved form: its signatures and graphs as JSON, no pickle, no Python source.

``encode_entry`` and ``write`` make the file ``Compiled.save`` writes;
``read`` and ``decode_entry`` take it back for ``load``.  Nothing in the file
is trusted: every shape and dtype is inferred again from the ops, and the
memory each node lives in, what it may write, which nodes run and the memory
plan are derived again as tracing derives them (``_rederive``); everything
that goes into generated replay code is a node index or a known name
(``_check_graph``).  A file that fails raises
ValueError, KeyError, TypeError, ... here; ``load`` turns that into a
``LoadError`` naming the file.
"""

from __future__ import annotations

import base64
import json
import keyword
import os
from typing import Any

import numpy as np

from .._errors import LoadError
from ..tensor import Op, check_out
from ._graph import Graph, Node, Ref, dead_code_dropped, memory_plan

__all__ = ["decode_entry", "encode_entry", "read", "write"]

_FORMAT = "schedsvc-compiled"
_VERSION = 1


def encode_entry(signature: Any, graph: Graph) -> dict[str, Any]:
    """One cached signature and its graph, as JSON values."""
    return {"signature": _enc(signature), "graph": _enc_graph(graph)}


def write(path: str | os.PathLike[str], name: str, entries: list[dict[str, Any]]) -> None:
    """Write the compiled function ``name``'s encoded entries to ``path``."""
    doc = {"format": _FORMAT, "version": _VERSION, "name": name, "entries": entries}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


def read(path: str | os.PathLike[str], where: str) -> Any:
    """The saved document in the file; LoadError naming it (``where``) when it is not one, or of
    another format version."""
    doc = _read(path, where)
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise LoadError(f"{where!r} is not a saved schedsvc compiled function (Compiled.save writes one)")
    if doc.get("version") != _VERSION:
        raise LoadError(f"{where!r} has format version {doc.get('version')}; this schedsvc reads {_VERSION}")
    return doc


def decode_entry(item: Any) -> tuple[Any, Graph]:
    """(signature, graph) of one saved entry, its graph checked against the signature."""
    signature = _dec(item["signature"])
    graph = _dec_graph(item["graph"])
    _rederive(graph, signature)
    return signature, graph


def _read(path: str | os.PathLike[str], where: str) -> Any:
    """The JSON document in the file; LoadError naming it when the file is not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise LoadError(
            f"{where!r} is not a saved schedsvc compiled function: it is not JSON ({exc}); a truncated "
            "file, or another kind. Save it again with Compiled.save"
        ) from exc
    except UnicodeDecodeError as exc:
        raise LoadError(
            f"{where!r} is not a saved schedsvc compiled function: not UTF-8 text ({exc})"
        ) from exc
    except RecursionError as exc:
        raise LoadError(
            f"{where!r} is not a saved schedsvc compiled function: its JSON nests too deeply to read"
        ) from exc


# -- JSON ---------------------------------------------------------------------------------


def _enc(value: Any) -> Any:
    if isinstance(value, Ref):
        return {"ref": int(value)}
    if isinstance(value, np.ndarray | np.generic):  # before float: np.float64 is a float, but strong
        array = np.asarray(value)
        if array.dtype.hasobject:
            raise TypeError("a compiled graph with object arrays cannot be saved")
        data = base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")
        kind = "array" if isinstance(value, np.ndarray) else "scalar"
        return {kind: {"dtype": array.dtype.str, "shape": list(array.shape), "data": data}}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if np.isfinite(value) else {"float": repr(value)}
    if isinstance(value, tuple | list):
        return {type(value).__name__: [_enc(v) for v in value]}
    if isinstance(value, complex):
        return {"complex": [_enc(value.real), _enc(value.imag)]}
    if isinstance(value, np.dtype):
        return {"dtype": value.str}
    if isinstance(value, slice):
        return {"slice": [_enc(value.start), _enc(value.stop), _enc(value.step)]}
    if value is Ellipsis:
        return {"ellipsis": None}
    raise TypeError(f"cannot save {type(value).__name__} {value!r} in a compiled graph")


def _dec(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    ((kind, body),) = value.items()
    if kind == "ref":
        return Ref(body)
    if kind in ("tuple", "list"):
        items = [_dec(v) for v in body]
        return tuple(items) if kind == "tuple" else items
    if kind == "float":
        return float(body)
    if kind == "complex":
        return complex(_dec(body[0]), _dec(body[1]))
    if kind == "dtype":
        return np.dtype(body)
    if kind in ("array", "scalar"):
        raw = base64.b64decode(body["data"])
        array = np.frombuffer(raw, dtype=np.dtype(body["dtype"])).reshape(body["shape"]).copy()
        if kind == "scalar":
            return array[()]
        array.flags.writeable = False
        return array
    if kind == "slice":
        return slice(*(_dec(v) for v in body))
    if kind == "ellipsis":
        return Ellipsis
    raise ValueError(f"unknown value {value!r} in a saved compiled graph")


def _enc_graph(graph: Graph) -> dict[str, Any]:
    nodes = []
    for node in graph.nodes:
        nodes.append(
            {
                "op": node.op,
                "args": [_enc(a) for a in node.args],
                "attrs": {k: _enc(v) for k, v in node.attrs.items()},
                "shape": list(node.shape),
                "dtype": node.dtype.str,
                "base": node.base,
                "out": node.out,
                "value": _enc(node.value),
            }
        )
    return {
        "name": graph.name,
        "nodes": nodes,
        "inputs": graph.inputs,
        "outputs": graph.outputs,
        "out_kind": graph.out_kind,
        "report": graph.report,
        "reuse": [[k, v] for k, v in graph.reuse.items()],
    }


def _dec_graph(doc: dict[str, Any]) -> Graph:
    from ..tensor import OPS

    nodes = []
    for item in doc["nodes"]:
        if item["op"] not in OPS and item["op"] not in ("input", "const", "dead"):
            raise ValueError(f"saved graph uses op {item['op']!r}, which this schedsvc does not have")
        nodes.append(
            Node(
                item["op"],
                tuple(_dec(a) for a in item["args"]),
                {k: _dec(v) for k, v in item["attrs"].items()},
                tuple(item["shape"]),
                np.dtype(item["dtype"]),
                item["base"],
                item["out"],
                _dec(item["value"]),
            )
        )
    graph = Graph(str(doc["name"]), nodes, list(doc["inputs"]), list(doc["outputs"]), doc["out_kind"])
    graph.report = dict(doc["report"])
    graph.reuse = {int(k): int(v) for k, v in doc["reuse"]}
    _check_graph(graph)
    return graph


def _rederive(graph: Graph, signature: Any) -> None:
    """Derive the graph's facts again from its ops, from the signature's inputs on, as tracing did.

    Every node's shape and dtype are inferred again, and the file's must
    agree: a replay's Tensors take their shapes and dtypes from the graph, so
    a file edited to claim others would give Tensors that disagree with their
    values.  The memory each node lives in (``base``) is derived, not read:
    a view's is its operand's, so a write can never reach an argument's or a
    constant's memory through a view the file claims owns its memory.  Nodes
    the outputs do not need are dropped, and the memory plan (which results
    reuse a dead intermediate) is made again; a reuse in the file that the
    plan would not make is refused.
    """
    from ..tensor import OPS

    nodes = graph.nodes
    arrays = _signature_arrays(signature)
    if [nodes[i].op for i in graph.inputs] != ["input"] * len(arrays):
        raise ValueError(f"the graph's inputs {graph.inputs} are not one input node per array argument")
    for i, node in enumerate(nodes):
        if node.op == "dead":  # (nothing of the file's: it neither runs nor writes)
            nodes[i] = Node("dead", (), {}, node.shape, node.dtype, i)
            continue
        base = i
        if node.op == "input":
            if not 0 <= node.value < len(arrays) or graph.inputs[node.value] != i:
                raise ValueError(f"input node {i} is not the graph's input {node.value}")
            shape, dtype = arrays[node.value]
        elif node.op == "const":
            value = np.asarray(node.value)
            shape, dtype = value.shape, value.dtype
        else:
            shape, dtype, base = _infer_node(nodes, i, OPS[node.op])
        if node.shape != shape or node.dtype != dtype:
            raise ValueError(
                f"node {i} ({node.op}) is {node.dtype}{list(node.shape)} in the file, but its operands give "
                f"{dtype}{list(shape)}"
            )
        node.shape, node.base = shape, base
    for i in graph.outputs:
        if nodes[i].op == "dead":
            raise ValueError(f"output node {i} is dead")
    claimed = graph.reuse
    dead_code_dropped(graph)
    graph.reuse = memory_plan(graph)
    for i, j in claimed.items():  # an elementwise result written into a dead intermediate of its type
        if graph.reuse.get(i) != j:
            raise ValueError(f"node {i} cannot reuse node {j}'s memory")


def _signature_arrays(signature: Any) -> list[tuple[tuple[int, ...], np.dtype[Any]]]:
    """(shape, dtype) of each array argument of a saved signature, in order."""
    arrays = []
    for part in signature:
        if part[1] != "array":
            continue
        _, _, shape, dtype, _ = part
        if not isinstance(dtype, np.dtype) or any(type(d) is not int or d < 0 for d in shape):
            raise ValueError(f"signature part {part!r} is not a shape and a dtype")
        arrays.append((tuple(shape), dtype))
    return arrays


def _infer_node(nodes: list[Node], i: int, op: Op) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """(shape, dtype, base) of node ``i`` from its operands', as tracing inferred them: a write lives in
    the memory it writes, which must be memory the graph computed; a view in its operand's memory."""
    node = nodes[i]
    metas: list[Any] = []
    for a in node.args:
        if not isinstance(a, Ref):
            metas.append(a)
        elif a < i and nodes[a].op != "dead":
            metas.append((nodes[a].shape, nodes[a].dtype))
        else:
            raise ValueError(f"node {i} reads node {a}, which is not computed before it")
    try:
        shape, dtype, view = op.infer(metas, node.attrs)
        if node.out is None:
            if not view:
                return tuple(shape), dtype, i
            if not node.args or not isinstance(node.args[0], Ref):
                raise ValueError("it is a view of no node")
            return tuple(shape), dtype, nodes[node.args[0]].base
        target = nodes[node.out]
        if not node.out < i or nodes[target.base].op in ("input", "const", "dead"):
            raise ValueError(f"it writes node {node.out}, which is not memory the graph computed before it")
        check_out(op, shape, dtype, target)
        return target.shape, target.dtype, target.base
    except Exception as exc:
        raise ValueError(f"node {i} ({node.op}) on its operands fails: {exc}") from exc


def _check_graph(graph: Graph) -> None:
    """Everything a loaded graph puts into generated code is a node index or a known name."""
    from ..tensor import OPS

    n = len(graph.nodes)

    def index(value: Any) -> None:
        if type(value) is not int or not 0 <= value < n:
            raise ValueError(f"node reference {value!r} is not a node index below {n}")

    if graph.out_kind not in ("single", "tuple", "list"):
        raise ValueError(f"unknown output kind {graph.out_kind!r}")
    for value in [*graph.inputs, *graph.outputs, *graph.reuse, *graph.reuse.values()]:
        index(value)
    for i, node in enumerate(graph.nodes):
        if node.op not in OPS and node.op not in ("input", "const", "dead"):
            raise ValueError(f"node {i} uses op {node.op!r}, which this schedsvc does not have")
        index(node.base)
        if node.out is not None:
            index(node.out)
        for arg in node.args:
            if isinstance(arg, Ref):
                index(int(arg))
        for key in node.attrs:
            if not (isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)):
                raise ValueError(f"node {i} has an attribute name {key!r} that is not an identifier")
            if key in ("out", "spans"):  # (a write's target is its node's ``out``; ``spans`` a batch's)
                raise ValueError(f"node {i} has an attribute named {key!r}, which no op takes")
        if node.op == "input" and type(node.value) is not int:
            raise ValueError(f"input node {i} has no argument position")
