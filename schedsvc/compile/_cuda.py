"""A compiled function's replay on a cuda device: CUDA graphs where CuPy can capture, else one stream replay.

The replay task of a cuda signature runs on the device's launching thread with its stream current
(``devices.cuda``), like any cuda task, and must never wait for the device.  Per stream:

1. the first replay runs the traced ops eagerly (``emit``'s function, the *stream replay*): CuPy compiles
   its kernels and cuBLAS makes its workspace before anything is captured;
2. the second one captures them.  Every value the ops compute is allocated from the device's graph pool
   (``CudaApi.graph_pool``, a pool of its own) and held by the capture for its life, so a replay writes
   the same addresses and nobody else is ever handed them.  CuPy refuses its own cuBLAS calls
   (``matmul``/``dot``: ``CudaApi.refused_in_capture``) during a capture; a product of two 2-D float
   operands is captured through cuBLAS's C API instead (``CudaApi.capture_gemm``: a handle and a
   workspace of its own per stream, set before the capture; its bits are CuPy matmul's), so a model of
   such products and elementwise ops is one CUDA graph.  Where that is not possible (another product, an
   old CUDA: the reason is in ``capture_off``) the refused op splits the ops: each run of the others is
   one CUDA graph, and the refused op runs between two launches, eagerly, into the memory its result
   got at capture (``out=``).  An argument at the same address at both replays is read where it is (weights:
   no copy); one that moved is *staged*: copied into memory of the capture before each replay;
3. later replays copy the staged arguments in, launch the graphs (and the refused ops), and copy the
   outputs out into new arrays (the next replay overwrites the capture's): the array each output lives
   in is copied once with its layout and the output is the same view of it, so outputs are laid out and
   share memory as the stream replay's are.  If an argument read in place
   moves, the capture is retired and done again with it staged.

Replays on one stream run in order, each enqueued whole by the one launching thread, so a capture is
never used by two replays at once; the graph pool keeps one arena per stream (as CuPy's pools do), so
its blocks are reused only behind earlier work on the same stream.  A retired capture is dropped once an
event after its last replay passed.

The stream replay stays for good -- counted, and its reason kept -- when the function returns memory of
an argument or a constant, or when a capture fails (a host sync during it: CUDA's 900, then 901 at its
end; any other error).  A call with an argument that is not C-contiguous runs as a stream replay (a
staged copy would change the layout cuBLAS sees).  Results equal the stream replay's bit for bit: the
same CuPy calls on the same values.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import BatchError
from .._logging import COMPILE
from ..devices import CudaApi, binding_of
from ..tensor import OPS
from ._graph import Graph, Node, Ref, emit

__all__ = ["CudaReplay", "GraphCounts", "batch_replay"]

#: ops that only make a view (no kernel): a run of nothing else is not captured
_VIEWS = frozenset({"transpose", "getitem"})
_BASIC = (int, slice, type(None), type(Ellipsis))
_log = logging.getLogger(COMPILE)


class GraphCounts:
    """A compiled function's replays on cuda devices: graphs captured, replays as graphs and as stream
    replays, and why capture is off (``Compiled.stats()``)."""

    __slots__ = ("graph_replays", "graphs", "lock", "stream_replays", "told", "why_not")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.graphs = 0
        self.graph_replays = 0
        self.stream_replays = 0
        self.why_not: str | None = None
        self.told: set[str] = set()  # the reasons logged (once each)

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {
                "cuda_graphs": self.graphs,
                "graph_replays": self.graph_replays,
                "stream_replays": self.stream_replays,
            }


class CudaReplay:
    """The replay task's function for one cuda signature: ``replay(*arguments, *device constants)``."""

    def __init__(self, graph: Graph, eager: Callable[..., Any], params: Sequence[int], counts: GraphCounts):
        self.graph = graph
        self.eager = eager  # the stream replay: emit's function, with these params
        self.params = list(params)  # the nodes the arguments become: inputs, then device constants
        self.counts = counts
        self.why_not: str | None = None
        why = _uncapturable(graph)
        if why is not None:
            self.give_up(why)
        #: the ops in order, by whether a matrix product can be in a graph: (plan, why not) per answer
        self.plans: dict[bool, tuple[list[tuple[str, list[int]]], str | None]] = {}
        self._streams: dict[Any, _OnStream] = {}
        self._lock = threading.Lock()

    def __call__(self, *arrays: Any) -> Any:
        api = next((b for b in map(binding_of, arrays) if b is not None), None)
        if api is None or self.why_not is not None or not all(a.flags.c_contiguous for a in arrays):
            return self.stream_replay(arrays)
        stream = api.current_stream()
        with self._lock:
            state = self._streams.get(stream)
            if state is None:
                state = self._streams[stream] = _OnStream(self, api, stream, api.device_of(arrays[0]))
        return state.replay(arrays)

    def stream_replay(self, arrays: Sequence[Any]) -> Any:
        with self.counts.lock:
            self.counts.stream_replays += 1
        return self.eager(*arrays)

    def give_up(self, why: str) -> None:
        """Capture is off for this signature from now on."""
        self.why_not = why
        self.note(why, "replays without CUDA graphs, as CuPy calls on its stream")

    def note(self, why: str, what: str = "runs some of its ops between its CUDA graphs") -> None:
        """Say why (some of) its ops are not in its graphs (``Compiled.capture_off``), if nothing was said;
        log it once (a fallback that costs launches)."""
        with self.counts.lock:
            if self.counts.why_not is None:
                self.counts.why_not = why
            new = why not in self.counts.told
            self.counts.told.add(why)
        if new:
            _log.warning("compiled function %s %s: %s", self.graph.name, what, why)

    def plan_with(self, gemm: Any) -> list[tuple[str, list[int]]]:
        """The plan of the ops when a capture can hold matrix products (``gemm``, a function) or not (its
        reason); a split for want of one is noted."""
        can = not isinstance(gemm, str)
        found = self.plans.get(can)
        if found is None:
            found = self.plans[can] = _plan(self.graph, can)
        plan, split = found
        if split is not None:
            self.note(f"{split}: {gemm}" if isinstance(gemm, str) else split)
        return plan


def _uncapturable(graph: Graph) -> str | None:
    """Why this graph is not replayed as CUDA graphs, or None."""
    nodes = graph.nodes
    for o in graph.outputs:
        owner = nodes[nodes[o].base]
        if owner.op in ("input", "const"):
            what = "an argument" if owner.op == "input" else "a constant"
            return f"it returns {what} (or a view of one), which a capture cannot copy out"
    return None


def _plan(graph: Graph, gemm: bool) -> tuple[list[tuple[str, list[int]]], str | None]:
    """The ops in order, as ("graph", run of capturable ops), ("views", run of view ops) and ("eager",
    [one op CuPy refuses to capture]); and why matrix products were split off, if they were.  With a
    ``gemm`` a capture can hold, the products it can compute are in the graphs."""
    refused = CudaApi.refused_in_capture
    plan: list[tuple[str, list[int]]] = []
    split = None
    for i, node in enumerate(graph.nodes):
        if node.op in ("input", "const", "dead"):
            continue
        if OPS[node.op].fn in refused and not (gemm and _gemm_node(graph, node)):
            split = "matrix products run between the graphs (CuPy refuses its cuBLAS calls in a capture)"
            plan.append(("eager", [i]))
        elif plan and plan[-1][0] in ("graph", "views"):
            plan[-1][1].append(i)
            if not _is_view(node):
                plan[-1] = ("graph", plan[-1][1])
        else:
            plan.append(("views" if _is_view(node) else "graph", [i]))
    return plan, split


def _gemm_node(graph: Graph, node: Node) -> bool:
    """Can a captured GEMM (``CudaApi.capture_gemm``) compute ``node``: a product of two 2-D operands of one
    float dtype it takes, into a new array?"""
    if node.out is not None or len(node.args) != 2 or node.attrs:
        return False
    a, b = (graph.nodes[r] if isinstance(r, Ref) else None for r in node.args)
    return (
        a is not None
        and b is not None
        and len(a.shape) == 2
        and len(b.shape) == 2
        and a.dtype == b.dtype
        and a.dtype in CudaApi.gemm_dtypes
    )


def _is_view(node: Node) -> bool:
    if node.op == "transpose":
        return True
    if node.op != "getitem":
        return False
    index = node.attrs.get("index")
    parts = index if isinstance(index, tuple) else (index,)
    return all(isinstance(p, _BASIC) and not isinstance(p, bool) for p in parts)


def _address(array: Any) -> tuple[int, tuple[int, ...]]:
    return array.data.ptr, array.strides


class _Capture:
    """One stream's captured replay: the graphs and refused ops in order, its memory, what it stages."""

    __slots__ = ("addresses", "graph", "staged", "steps", "values")

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.steps: list[Callable[[], Any]] = []
        self.staged: dict[int, Any] = {}  # argument position -> the capture's copy of it
        self.addresses: list[tuple[int, tuple[int, ...]]] = []  # of every argument, at capture
        self.values: dict[int, Any] = {}  # node -> its array (the capture's memory: alive as long as it)

    def run(self, arrays: Sequence[Any]) -> list[Any]:
        for position, copy in self.staged.items():
            copy[...] = arrays[position]
        for step in self.steps:
            step()
        return self.copied_out()

    def copied_out(self) -> list[Any]:
        """The outputs in new memory (the next replay overwrites the capture's), as the stream replay
        returns them: each array they live in copied once with its own layout, and each output the same
        view of that copy -- a transposed output stays transposed, and outputs that share memory still
        share it."""
        graph, values = self.graph, self.values
        copies: dict[int, Any] = {}

        def out(i: int) -> Any:
            node = graph.nodes[i]
            if node.out is not None:  # a write: its value is its target's array
                return out(node.out)
            if node.base == i or i in graph.reuse:  # an array of its own (captured ops reuse none)
                if i not in copies:
                    copies[i] = _copy_like(values[i])
                return copies[i]
            source = node.args[0]  # a view of its first operand (getitem, reshape, transpose)
            return _call(node, {source: out(source)})

        return [out(o) for o in self.graph.outputs]


def _copy_like(array: Any) -> Any:
    """A copy of ``array`` (an op's result: dense) with its strides, as NumPy's order 'K' copies it."""
    if array.flags.c_contiguous:
        return array.copy()
    if array.flags.f_contiguous:
        return array.copy(order="F")
    outer_first = sorted(range(array.ndim), key=lambda d: -array.strides[d])
    binding = binding_of(array)
    assert binding is not None  # (a capture's memory is device memory)
    copy = binding.xp.empty(tuple(array.shape[d] for d in outer_first), array.dtype)
    copy = copy.transpose(tuple(outer_first.index(d) for d in range(array.ndim)))
    copy[...] = array
    return copy


class _OnStream:
    """A compiled replay's state on one stream: warmed up, captured, retired captures."""

    def __init__(self, owner: CudaReplay, api: CudaApi, stream: Any, device: int) -> None:
        self.owner = owner
        self.api = api
        self.stream = stream
        #: the matrix product a capture on this device can hold, or why there is none
        self.gemm = api.capture_gemm(device)
        self.plan = owner.plan_with(self.gemm)
        self.warm: list[tuple[int, tuple[int, ...]]] | None = None  # argument addresses at warm-up
        self.capture: _Capture | None = None
        self.retired: list[tuple[_Capture, Any]] = []  # with an event after its last replay

    def replay(self, arrays: Sequence[Any]) -> Any:
        owner = self.owner
        if self.retired:
            self.retired = [(c, e) for c, e in self.retired if not e.done]
        addresses = [_address(a) for a in arrays]
        capture = self.capture
        if capture is None:
            if self.warm is None:
                self.warm = addresses
                return owner.stream_replay(arrays)
            moved = {i for i, (a, b) in enumerate(zip(addresses, self.warm, strict=True)) if a != b}
            return self._capture(arrays, addresses, moved)
        moved = {
            i
            for i, (a, b) in enumerate(zip(addresses, capture.addresses, strict=True))
            if a != b and i not in capture.staged
        }
        if moved:
            self._retire(capture)
            return self._capture(arrays, addresses, moved | set(capture.staged))
        outputs = capture.run(arrays)
        with owner.counts.lock:
            owner.counts.graph_replays += 1
        return self._result(outputs)

    def _retire(self, capture: _Capture) -> None:
        event = self.api.event()
        event.record(self.stream)
        self.retired.append((capture, event))
        self.capture = None

    def _result(self, outputs: list[Any]) -> Any:
        return outputs[0] if self.owner.graph.out_kind == "single" else tuple(outputs)

    def _capture(self, arrays: Sequence[Any], addresses: list[Any], staged: set[int]) -> Any:
        """Capture the ops (running this call through the graphs as they are made); the stream replay
        instead, for good, if the capture fails."""
        owner, api = self.owner, self.api
        capture = _Capture(owner.graph)
        capture.addresses = addresses
        try:
            with api.allocating_from(_graph_pool(api, api.device_of(arrays[0]))):
                graphs = self._record(capture, arrays, staged)
        except api.OutOfMemoryError:
            raise  # the executor waits for the work in flight and retries the task
        except Exception as exc:
            owner.give_up(f"capturing failed: {type(exc).__name__}: {exc}")
            return owner.stream_replay(arrays)
        self.capture = capture
        with owner.counts.lock:
            owner.counts.graphs += graphs
            owner.counts.graph_replays += 1
        return self._result(capture.copied_out())

    def _record(self, capture: _Capture, arrays: Sequence[Any], staged: set[int]) -> int:
        """Run this call as the capture will replay it, recording its steps; the graphs made."""
        graph, stream, xp = self.owner.graph, self.stream, self.api.xp
        values: dict[int, Any] = {}
        for position, (param, array) in enumerate(zip(self.owner.params, arrays, strict=True)):
            if position in staged:
                copy = xp.empty(array.shape, array.dtype)
                copy[...] = array
                capture.staged[position] = array = copy
            values[param] = array
        made = 0
        gemm = None if isinstance(self.gemm, str) else self.gemm
        if gemm is not None:  # (its handle is made and set to the stream now: never during the capture)
            one = xp.ones((1, 1), np.float32)
            gemm(one, one, stream)
        for kind, ops in self.plan:
            if kind == "views":
                for i in ops:
                    values[i] = _call(graph.nodes[i], values)
            elif kind == "eager":
                (i,) = ops
                node = graph.nodes[i]
                values[i] = _call(node, values)
                target = values[i] if node.out is None else values[node.out]
                capture.steps.append(_eager_step(node, values, target))
            else:
                launch = _captured(self.api, stream, graph, ops, values, gemm)
                launch()
                capture.steps.append(launch)
                made += 1
        capture.values = values
        return made


def _captured(
    api: CudaApi,
    stream: Any,
    graph: Graph,
    ops: list[int],
    values: dict[int, Any],
    gemm: Callable[[Any, Any, Any], Any] | None,
) -> Callable[[], Any]:
    """Capture ``ops`` on ``stream`` (their values go into ``values``), the matrix products through ``gemm``;
    the graph's launch."""
    nodes = graph.nodes
    refused = CudaApi.refused_in_capture
    with api.capturing(stream) as captured:
        for i in ops:
            node = nodes[i]
            if gemm is not None and OPS[node.op].fn in refused:
                a, b = _operands(node, values)
                values[i] = gemm(a, b, stream)
            else:
                values[i] = _call(node, values)
    cuda_graph = captured[0]
    return lambda: cuda_graph.launch(stream)


def _operands(node: Node, values: dict[int, Any]) -> list[Any]:
    return [values[a] if isinstance(a, Ref) else a for a in node.args]


def _call(node: Node, values: dict[int, Any]) -> Any:
    """Run one node as the stream replay does (``emit``): its registry function on its operands."""
    fn = OPS[node.op].fn
    if node.out is not None and node.op != "setitem":  # setitem writes its first operand
        return fn(*_operands(node, values), **node.attrs, out=values[node.out])
    return fn(*_operands(node, values), **node.attrs)


def _eager_step(node: Node, values: dict[int, Any], target: Any) -> Callable[[], Any]:
    """A refused op at each replay: its function on the capture's operands, into ``target``."""
    fn = OPS[node.op].fn
    operands = _operands(node, values)
    attrs = node.attrs
    return lambda: fn(*operands, **attrs, out=target)


_pools: dict[tuple[int, int], Any] = {}  # (binding id, device) -> the device's graph pool
_pools_lock = threading.Lock()


def _graph_pool(api: CudaApi, device: int) -> Any:
    """The graph pool of ``device``: one per binding and device, shared by every capture."""
    key = (id(api), device)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = api.graph_pool(device)
        return pool


def batch_replay(who: str, exact: bool, graph: Graph, device: str, counts: Any) -> CudaReplay:
    """The replay of a batched function's ``graph`` (``who``) on ``device`` (a CUDA graph where it can
    capture): only arrays the calls pass, no captured ones, and not in exact mode (BatchError)."""
    if exact:
        raise BatchError(
            f"{who}: exact=True computes each caller's rows as NumPy would on the CPU, and this call runs "
            f"on {device}; call it with host arrays, or compile it with exact=False"
        )
    if any(node.op == "const" and type(node.value) is np.ndarray for node in graph.nodes):
        raise BatchError(
            f"{who} captures arrays, and its calls run on {device}: a batched function takes the "
            "arrays it uses there as arguments; pass the weights as Tensors on that device "
            "(eng.asarray(w, device=...)), as unbatched arguments"
        )
    return CudaReplay(graph, emit(graph), graph.inputs, counts)
