"""``Compiled``: the lifecycle of a compiled function (its saved form: ``_saved.py``).

The first call with a signature -- shapes, dtypes and devices of the array
arguments, values of the others -- traces; later calls with it replay, as
one engine task.  Signatures are kept in a bounded LRU cache; each trace is
counted in ``Compiled.stats()`` and ``eng.stats()``.  A function called with
more signatures than the cache keeps traces the evicted ones again and again:
the first few such retraces give one ``RuntimeWarning`` that names
``max_signatures`` and what keeps changing between the calls; a float argument
traced with many values gives one too, saying to pass it as an array.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, NoReturn, ParamSpec, TypeVar

import numpy as np

from .._asyncdef import refused_while_tracing
from .._core import name_of
from .._errors import LoadError, SchedsvcError, TraceError
from .._port import port_of
from .._runtime import buffer_of
from .._tracing import ACTIVE, tracing
from ..tensor import Op, Tensor, asarray, queue_op, rider
from ._cuda import CudaReplay, GraphCounts
from ._graph import Constants, Graph, emit, work_bytes
from ._params import argument_name
from ._saved import decode_entry, encode_entry, read, write
from ._trace import trace

if TYPE_CHECKING:
    from .._engine import Engine
    from .._port import Port

__all__ = ["Compiled", "load", "static_part"]

_STATIC = (int, float, complex, bool, str, bytes, type(None), np.generic)
#: the default ``max_signatures``: more than the batch sizes of a typical loader (32)
MAX_SIGNATURES = 64
#: traces of signatures the cache had evicted before one RuntimeWarning says it thrashes
_THRASH = 4
#: evicted signatures remembered, to tell a retrace from a new signature
_EVICTED_KEPT = 1024
#: values of one float argument traced before a RuntimeWarning says to pass it as an array
_FLOAT_VALUES = 8


class Entry:
    """One signature's optimised graph and its replay function.

    A signature whose calls run on a device with memory of its own (a cuda device, ``_device_of``) replays there (``_cuda.CudaReplay``:
    CUDA graphs where CuPy can capture); its constant arrays are copied to that device once, by tasks of
    their own, and passed to every replay after the arguments.
    """

    __slots__ = (
        "call_bytes",
        "consts",
        "device",
        "device_consts",
        "graph",
        "op",
        "out_bytes",
        "outputs",
        "replay",
        "signature",
        "tensors",
    )

    def __init__(
        self, signature: Any, graph: Graph, counts: GraphCounts, port: Port, loaded: bool = False
    ) -> None:
        self.signature = signature
        self.graph = graph
        self.device = _device_of(signature, port)
        self.consts: list[int] = []
        self.device_consts: list[Tensor] | None = None
        if self.device is None:
            self.replay: Callable[..., Any] = emit(graph)
        else:
            nodes = graph.nodes
            self.consts = [i for i, n in enumerate(nodes) if n.op == "const" and type(n.value) is np.ndarray]
            eager = emit(graph, const_params=self.consts)
            self.replay = CudaReplay(graph, eager, [*graph.inputs, *self.consts], counts)
        self.op = Op(f"compiled:{graph.name}", self.replay, _no_infer)
        self.outputs = [
            (graph.nodes[o].shape, graph.nodes[o].dtype, _input_of(graph, o)) for o in graph.outputs
        ]
        self.out_bytes = sum(math.prod(s) * d.itemsize for s, d, src in self.outputs if src is None)
        #: a replay's bytes within the engine's limits: its outputs' -- and for a loaded graph (its file
        #: untrusted), what its arrays hold at once, intermediates too: a file never allocates past the limits
        self.call_bytes = max(self.out_bytes, work_bytes(graph)) if loaded else self.out_bytes
        # (shape, dtype, device) per argument when the signature is Tensors/arrays in positional order:
        # ``Compiled.__call__`` then matches a call without building its signature
        parts = signature if isinstance(signature, tuple) else ()
        positional = all(
            isinstance(p, tuple) and len(p) == 5 and p[0] == i and p[1] == "array"
            for i, p in enumerate(parts)
        )
        self.tensors = tuple(p[2:] for p in parts) if positional and parts else None

    def launch(self, engine: Port, arrays: Sequence[Any], compiled: Compiled[..., Any]) -> Any:
        """Queue one replay of ``compiled`` on ``arrays`` now, or raise QueueFull; its Tensor (or tuple/list)."""
        parts: list[Tensor] = []
        whole = self._replay(engine, arrays, compiled, None, parts)
        return self._result(whole, parts)

    async def launch_waiting(self, engine: Port, arrays: Sequence[Any], compiled: Compiled[..., Any]) -> Any:
        """Queue one replay, waiting for room (FIFO) while the engine is at its limits."""
        waiting: list[Any] = []
        parts: list[Tensor] = []
        whole = self._replay(engine, arrays, compiled, waiting, parts)
        if waiting:  # (cancelled while it waits, or Ctrl-C: nobody holds the call, it is cancelled)
            await engine.admission(whole, waiting[0], tuple(parts))
        return self._result(whole, parts)

    def _result(self, whole: Tensor, parts: list[Tensor]) -> Any:
        kind = self.graph.out_kind
        return whole if kind == "single" else tuple(parts) if kind == "tuple" else parts

    def _replay(
        self,
        engine: Port,
        arrays: Sequence[Any],
        compiled: Compiled[..., Any],
        waiting: list[Any] | None,
        parts: list[Tensor],
    ) -> Tensor:
        """The replay task, admitted within the engine's limits (or queued for admission, given
        ``waiting``); with several outputs, a Tensor per output picked from it, appended to ``parts``: they
        ride on its slot (a call is one task within the limits), their bytes are the replay's."""
        riders = None
        if self.graph.out_kind == "single":
            shape, dtype, source = self.outputs[0]
            root, memory = (None, None) if source is None else _alias(arrays, source)
        else:
            shape, dtype, root, memory = (), _OBJECT, None, None

            def riders(whole: Tensor) -> list[Any]:
                parts.extend(self._outputs(arrays, whole))
                return parts

        if self.consts:
            arrays = [*arrays, *self._device_consts(engine)]
        return queue_op(
            engine,
            self.op,
            arrays,
            None,
            shape,
            dtype,
            root,
            None,
            memory=memory,
            device=self.device,  # a cuda signature's (a cpu Tensor before its first cuda one is moved there)
            out_bytes=self.call_bytes,
            replay=compiled,
            limits=True,
            waiting=waiting,
            riders=riders,
        )

    def _device_consts(self, engine: Port) -> list[Tensor]:
        """The constant arrays on the signature's device: copied there by the first call's tasks."""
        consts = self.device_consts
        if consts is None:
            values = [self.graph.nodes[i].value for i in self.consts]
            consts = [asarray(engine, v, None, self.device, None) for v in values]
            self.device_consts = consts
        return consts

    def _outputs(self, arrays: Sequence[Any], whole: Tensor) -> list[Tensor]:
        """A Tensor per output, picked from the replay's result (not admitted yet)."""
        parts = []
        owners: dict[int, Tensor] = {}  # memory (graph base) -> the first output living in it
        for i, (shape, dtype, source) in enumerate(self.outputs):
            root, memory = _alias(arrays, source)
            base = self.graph.nodes[self.graph.outputs[i]].base
            if root is None and memory is None and base in owners:
                root = owners[base]  # outputs sharing memory order their writes together
            part = rider(_PICK, whole, {"index": i}, shape, dtype, root, memory)
            owners.setdefault(base, part.owner)
            parts.append(part)
        return parts


def _no_infer(metas: Any, attrs: Any) -> Any:
    raise AssertionError("a compiled replay's result is known from its graph")


def _pick(results: tuple[Any, ...], index: int) -> Any:
    return results[index]


_PICK = Op("output", _pick, _no_infer)
_OBJECT = np.dtype(object)


def _device_of(signature: Any, port: Port) -> str | None:
    """The device with memory of its own (a cuda device) the calls of this signature run on, or None.

    A call runs on its first Tensor's device, else on the engine's default device (``queue_op``).  A
    signature names the host for a NumPy array and for a host Tensor alike, so: its first device with
    memory of its own, else the default device (the host whenever the engine has one, the only case a
    host Tensor exists).  The replay is queued on this device, so a host Tensor before the first device
    one is copied to it.
    """
    parts = signature if isinstance(signature, tuple) else ()
    devices = [str(p[4]) for p in parts if isinstance(p, tuple) and len(p) == 5 and p[1] == "array"]
    device = next((d for d in devices if port.own_memory(d)), port.default_device)
    return device if port.own_memory(device) else None


def _input_of(graph: Graph, node: int) -> int | None:
    """The argument position whose memory output ``node`` lives in, if any (returned input, or a view)."""
    owner = graph.nodes[graph.nodes[node].base]
    return owner.value if owner.op == "input" else None


def _alias(arrays: Sequence[Any], source: int | None) -> tuple[Tensor | None, tuple[int, int] | None]:
    if source is None:
        return None, None
    arg = arrays[source]
    if isinstance(arg, Tensor):
        return arg.owner, None
    return None, buffer_of(arg)


P = ParamSpec("P")
R = TypeVar("R", covariant=True)  # (a Compiled of a tuple of Tensors is one of a tuple[Tensor, ...])


def _refuse_submit_while_tracing(compiled: Compiled[..., Any], *args: Any, **kwargs: Any) -> NoReturn:
    raise TraceError(
        f"{compiled!r}.submit() inside a compiled function: call it ({compiled.name}(...)) to trace it in"
    )


class Compiled(Generic[P, R]):
    """A function compiled by ``eng.compile``: call it like the function; it returns Tensors.

    ``graph`` is the optimised graph of the latest signature; ``save(path)``
    writes every traced signature to JSON; ``ss.load(path, eng)`` gives a
    runnable Compiled back without the Python source.

    For type checkers, ``Compiled[P, R]`` takes the function's parameters ``P``
    and gives what a call gives, ``R``: a ``Tensor`` for a function that returns
    a Tensor or an ``np.ndarray`` (``await mlp(x)`` is then an ``np.ndarray``),
    a tuple or list of Tensors for one that returns a tuple or list; a loaded
    one is ``Compiled[..., Any]``.
    """

    def __init__(
        self,
        port: Port,
        fn: Callable[P, R] | None,
        *,
        max_signatures: int = MAX_SIGNATURES,
        name: str | None = None,
    ) -> None:
        if fn is not None and not callable(fn):
            raise TypeError(f"eng.compile() needs a function, got {type(fn).__name__}")
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"eng.compile({name_of(fn)}): an async function cannot be compiled; compiled functions "
                "are synchronous array code (await their result outside)"
            )
        if type(max_signatures) is not int or max_signatures < 1:
            raise ValueError(f"max_signatures must be a positive int, got {max_signatures!r}")
        if name is not None and not isinstance(name, str):
            raise TypeError(
                f"eng.compile(name=...) must be a str (the name its tasks and traces show) or None for the "
                f"function's own name, got {type(name).__name__} {name!r}"
            )
        self._port = port  # the engine, as its frontend parts see it
        self._fn = fn
        self.name = re.sub(r"\W", "_", name or name_of(fn) or "compiled").strip("_") or "compiled"
        self.max_signatures = max_signatures
        self._cache: OrderedDict[Any, Entry] = OrderedDict()
        self._constants = Constants()  # captured and folded arrays, once for every signature
        self._lock = threading.Lock()
        self._last: Entry | None = None
        self.traces = 0
        self.replays = 0
        self.evictions = 0
        self._evicted: OrderedDict[Any, None] = OrderedDict()  # recently evicted signatures
        self._retraces = 0  # traces of signatures evicted before
        self._warned = False
        self._floats: dict[Any, set[str]] | None = {}  # float argument -> the values traced (None: warned)
        self._graph_counts = GraphCounts()  # replays on cuda devices (CUDA graphs)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Queue one call now; its Tensor (or tuple/list of them, as ``fn`` returns).

        Admitted like ``eng.submit_nowait``: at the engine's limits it raises
        ``ss.QueueFull`` (``await compiled.submit(...)`` waits instead); inside a
        running task it is admitted over the limits.  The first call with a
        signature traces ``fn`` first.
        """
        if ACTIVE[0] and tracing.depth:  # inside another compiled function: trace straight through
            if self._fn is None:
                raise TraceError(f"{self!r} was loaded without its source and cannot be traced into another")
            return self._fn(*args, **kwargs)
        entry, arrays = self._lookup(args, kwargs)
        return entry.launch(self._port, arrays, self)  # type: ignore[no-any-return]  # (counts the replay)

    @refused_while_tracing(_refuse_submit_while_tracing)
    async def submit(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Queue one call, waiting (first come first served) while the engine is at its limits.

        ``out = await compiled.submit(x)``: the call's Tensor (or tuple/list of
        them), admitted.  Cancelling the wait cancels the call.
        """
        entry, arrays = self._lookup(args, kwargs)
        return await entry.launch_waiting(self._port, arrays, self)  # type: ignore[no-any-return]

    def _lookup(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Entry, Sequence[Any]]:
        """The entry for this call's signature (traced now if new) and its array arguments."""
        entry = self._last
        if entry is not None and not kwargs and entry.tensors is not None and _same(entry.tensors, args):
            return entry, args  # the latest signature again, Tensors only
        signature, arrays, slots = _signature(args, kwargs)
        with self._lock:
            entry = self._cache.get(signature)
            if entry is not None and self._last is not entry:
                self._cache.move_to_end(signature)
                self._last = entry
        if entry is None:
            entry = self._entry(signature, args, kwargs, slots)
        return entry, arrays

    def _entry(
        self, signature: Any, args: tuple[Any, ...], kwargs: dict[str, Any], slots: list[Any]
    ) -> Entry:
        with self._lock:
            entry = self._cache.get(signature)
            if entry is not None:
                self._cache.move_to_end(signature)
                self._last = entry
                return entry
        if self._fn is None:
            known = "\n  ".join(str(s) for s in self._cache) or "(none)"
            raise TraceError(
                f"{self!r} was loaded without its Python source, so it replays only the signatures it was "
                f"saved with:\n  {known}\nThis call's signature is:\n  {signature}"
            )
        graph = trace(self._fn, self.name, list(args), kwargs, slots, self._constants)
        entry = Entry(signature, graph, self._graph_counts, self._port)
        with self._lock:
            self.traces += 1
            thrashing = self._retraced(signature)
            changing = self._float_traced(args, kwargs)
            self._store(signature, entry)
        self._port.compile_counts.traces += 1
        if thrashing:
            warnings.warn(self._thrash_message(), RuntimeWarning, stacklevel=4)  # user -> call -> _lookup
        if changing is not None:
            warnings.warn(self._float_message(*changing), RuntimeWarning, stacklevel=4)
        return entry

    def _float_traced(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, int] | None:
        """Note the float arguments of a call that traced; (the argument, its values) once, when one has
        been traced with enough values to warn."""
        floats = self._floats
        if floats is None:
            return None
        for slot, value in (*enumerate(args), *kwargs.items()):
            if isinstance(value, float | np.floating):
                values = floats.setdefault(slot, set())
                values.add(repr(value))
                if len(values) >= _FLOAT_VALUES:
                    self._floats = None
                    return slot, len(values)
        return None

    def _float_message(self, slot: Any, values: int) -> str:
        return (
            f"{self!r} traced once for each of {values} values of {argument_name(self._fn, slot)}, a float: a "
            "number is a constant of the traced function, so each new value traces again (on the calling "
            "thread, far slower than a replay). Pass it as an array or Tensor (np.asarray(value), "
            "eng.asarray(...)): an array is an input, whose value changes without a trace"
        )

    def _retraced(self, signature: Any) -> bool:
        """Count a trace of an evicted signature; True once, when there have been enough to warn."""
        if signature not in self._evicted:
            return False
        del self._evicted[signature]
        self._retraces += 1
        if self._warned or self._retraces < _THRASH:
            return False
        self._warned = True
        return True

    def _thrash_message(self) -> str:
        with self._lock:
            seen = [*self._evicted, *self._cache]
        return (
            f"{self!r} traced {self._retraces} signatures again after evicting them: it is called with "
            f"more signatures than max_signatures={self.max_signatures} keeps, so calls keep tracing "
            f"(on the calling thread, far slower than a replay). Changing between calls: {_changing(seen)}. "
            "Raise max_signatures (eng.compile(fn, max_signatures=...)), or give what changes a few "
            "fixed values (pad batches to a few sizes)"
        )

    def _store(self, signature: Any, entry: Entry) -> None:
        self._cache[signature] = entry
        self._cache.move_to_end(signature)
        self._last = entry
        while len(self._cache) > self.max_signatures:
            evicted, _ = self._cache.popitem(last=False)
            self.evictions += 1
            self._evicted[evicted] = None
            if len(self._evicted) > _EVICTED_KEPT:
                self._evicted.popitem(last=False)

    @property
    def graph(self) -> Graph:
        """The optimised graph of the most recent call (print it to read it)."""
        if self._last is None:
            raise SchedsvcError(f"{self!r} has not been traced yet: call it once first")
        return self._last.graph

    @property
    def graphs(self) -> list[Graph]:
        """The graph of every cached signature, oldest first."""
        with self._lock:
            return [entry.graph for entry in self._cache.values()]

    @property
    def graph_counts(self) -> GraphCounts:
        """Its replays on cuda devices: graphs captured, replays as graphs and as stream replays."""
        return self._graph_counts

    def stats(self) -> dict[str, int]:
        """Traces (one per new signature), replays, cached signatures, evictions; once it replayed on a
        cuda device, also the CUDA graphs captured (``cuda_graphs``) and its replays there as graphs
        (``graph_replays``) and as plain stream replays (``stream_replays``: warm-ups, and every replay of
        a signature that cannot be captured, ``capture_off`` says why)."""
        with self._lock:
            stats = {
                "traces": self.traces,
                "replays": self.replays,
                "signatures": len(self._cache),
                "evictions": self.evictions,
            }
        graphs = self._graph_counts.stats()
        if any(graphs.values()):
            stats.update(graphs)
        return stats

    @property
    def capture_off(self) -> str | None:
        """Why a cuda signature of this function replays without CUDA graphs (the first reason met), or
        None."""
        return self._graph_counts.why_not

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write every cached signature's graph to ``path`` as JSON (no pickle, no Python source)."""
        with self._lock:
            entries = [encode_entry(e.signature, e.graph) for e in self._cache.values()]
        if not entries:
            raise SchedsvcError(f"{self!r} has no traced signature to save: call it once first")
        write(path, self.name, entries)

    def count_replay(self) -> None:
        """One replay admitted (called under the runtime's lock, so the counts stay exact)."""
        self.replays += 1
        self._port.compile_counts.replays += 1

    def __repr__(self) -> str:
        source = "" if self._fn is not None else " (loaded)"
        return f"<Compiled {self.name}{source} signatures={len(self._cache)} traces={self.traces} replays={self.replays}>"


def load(path: str | os.PathLike[str], engine: Engine) -> Compiled[..., Any]:
    """A compiled function saved with ``Compiled.save``, runnable on ``engine`` without its source.

    Every shape and dtype in the file is inferred again from the ops, as
    tracing did; a file that is not such JSON, or disagrees, raises
    ``ss.LoadError`` naming the file.
    """
    where = os.fspath(path)
    doc = read(path, where)
    try:
        compiled: Compiled[..., Any] = Compiled(
            port_of(engine), None, name=str(doc["name"]), max_signatures=max(1, len(doc["entries"]))
        )
        for item in doc["entries"]:
            signature, graph = decode_entry(item)
            compiled._constants.share(graph)
            entry = Entry(signature, graph, compiled._graph_counts, compiled._port, loaded=True)
            compiled._store(signature, entry)
    except RecursionError as exc:
        raise LoadError(f"{where!r} nests its values too deeply to be a saved compiled function") from exc
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise LoadError(
            f"{where!r} is not a valid saved compiled function: {exc!r}. Save it again with Compiled.save"
        ) from exc
    return compiled


# -- signatures --------------------------------------------------------------------------


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any], list[Any]]:
    """(hashable signature, array arguments in order, their (slot, shape, dtype))."""
    parts: list[Any] = []
    arrays: list[Any] = []
    slots: list[Any] = []
    if not kwargs and all(type(a) is Tensor for a in args):  # the common call: Tensors only
        for slot, t in enumerate(args):
            parts.append((slot, "array", t.shape, t.dtype, t.device))
            slots.append((slot, t.shape, t.dtype))
        return tuple(parts), list(args), slots
    named: list[tuple[Any, Any]] = [*enumerate(args), *sorted(kwargs.items())]
    for slot, value in named:
        if isinstance(value, Tensor | np.ndarray):
            device = value.device if isinstance(value, Tensor) else "cpu"
            parts.append((slot, "array", value.shape, value.dtype, device))
            arrays.append(value)
            slots.append((slot, value.shape, value.dtype))
        else:
            parts.append((slot, "static", static_part(value)))
    return tuple(parts), arrays, slots


def _changing(signatures: list[Any]) -> str:
    """What differs between these signatures, argument by argument: the axes whose sizes vary, or the values."""
    by_slot: dict[Any, set[Any]] = {}
    for signature in signatures:
        for slot, *kind in signature:
            by_slot.setdefault(slot, set()).add(tuple(kind))
    said = [_describe_change(slot, kinds) for slot, kinds in by_slot.items() if len(kinds) > 1]
    return "; ".join(said) or "nothing (the same signatures)"


def _describe_change(slot: Any, kinds: set[Any]) -> str:
    name = f"argument {slot}" if isinstance(slot, int) else f"argument {slot!r}"
    shapes = {kind[1] for kind in kinds if kind[0] == "array"}
    fixed = {(kind[0], len(kind[1]), *kind[2:]) for kind in kinds if kind[0] == "array"}
    if len(shapes) == len(kinds) and len(fixed) == 1:  # arrays of one ndim, dtype and device
        ndim = len(next(iter(shapes)))
        axes = []
        for axis in range(ndim):
            sizes = sorted({shape[axis] for shape in shapes})
            if len(sizes) > 1:
                listed = ", ".join(map(str, sizes[:8])) + (", ..." if len(sizes) > 8 else "")
                axes.append(f"axis {axis} takes {len(sizes)} sizes ({listed})")
        return f"{name} {', '.join(axes)}"
    listed = ", ".join(sorted(map(str, kinds))[:4]) + (", ..." if len(kinds) > 4 else "")
    return f"{name} takes {len(kinds)} kinds: {listed}"


def _same(tensors: tuple[Any, ...], args: tuple[Any, ...]) -> bool:
    """Are ``args`` Tensors with these (shape, dtype, device)?  (Per call: no signature is built.)"""
    if len(args) != len(tensors):
        return False
    for i, arg in enumerate(args):
        if type(arg) is not Tensor or (arg.shape, arg.dtype, arg.device) != tensors[i]:
            return False
    return True


def static_part(value: Any) -> Any:
    """A static argument as a signature holds it: by type and value (a float by its repr, so that -0.0 and
    0.0 differ and nan equals nan), nested sequences part by part."""
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(static_part(v) for v in value))
    if isinstance(value, float | complex | np.inexact):  # by repr: -0.0 is not 0.0, nan is nan
        return (type(value).__name__, repr(value))
    if isinstance(value, _STATIC):
        return (type(value).__name__, value)
    raise TypeError(
        f"a compiled function's arguments must be Tensors, arrays, or constants (numbers, strings, "
        f"tuples of them); got {type(value).__name__}"
    )
