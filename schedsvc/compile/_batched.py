"""Dynamic batching: the calls of a compiled function that are ready together run as one replay.

``eng.compile(fn, batch_axis=0)`` returns a ``Batched``.  Each call is a task
of its own from the moment it is made -- a ``BatchCall``, which is an
``ss.Future`` -- admitted like any task (``fn(x)`` now or ``QueueFull``, as
``eng.submit_nowait``; ``await fn.submit(x)`` waits for room, as ``await
eng.submit``).  Its reads are registered at the call, so a write made after
the call waits for it, and ordering, cancellation, failure and admission are
those of ordinary tasks.

Fusion happens at dispatch (``_fused.py``): every call carries the ``Group``
of its batch key -- the arguments' shapes but the batch axis, their dtypes,
the unbatched arrays (by identity) and the other values -- as its
``fusion``.  The worker that takes one ready call also takes the other ready
calls of its group, in the same hold of the lock, oldest first, up to
``max_batch`` rows (``Scheduler.take_like``), concatenates their rows
(padded to a power of two, so that a few sizes are traced), replays once, and
splits the result back: each call is finished with its own rows.  Calls made
on the event loop's thread reach the workers at the end of the loop's turn
(the runtime stages them), so the requests a server parses in one turn are
one batch; calls that queue while the workers are busy join the next.  So the
backlog is the batch: a lone call on an idle engine runs as soon as its
coroutine yields, and nothing waits for a timer.  If a fused run
raises, it is split in halves, down to single calls, so each caller gets the
outcome it would have had alone.

Before a key's first call is admitted, ``_rows.plan_rows`` proves from the
traced graph that rows stay apart; a function that mixes them raises
``BatchError`` there; so does one that reads the number of rows as a value
(``x / x.shape[0]``, ``len(x)``, a branch on it), found as its two traces
(the call's rows, many rows) differing beyond their shapes (``same_program``).
By default each op runs once on the whole batch (one matrix product per layer),
so a caller's rows equal the unbatched call's to within rounding (BLAS rounds a
row of a many-row product otherwise than a one-row one: float32 about 1e-6 of
the row's largest value, float64 about 1e-15).  With ``exact=True`` the ops NumPy
may round by memory layout (matmuls, sums, transcendental ufuncs) compute each
caller's rows as its own call would (``_rows.exact_fn``), so the result is bit
for bit the unbatched call's, and a batch gains only the per-call overhead.  Traced plans are kept per key as the signature cache
keys them (shapes, not array addresses), at most ``max_signatures`` of them.
"""

from __future__ import annotations

import itertools
import logging
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

import numpy as np

from .._core import FINAL_STATES
from .._errors import BatchError, QueueFull, SchedsvcError
from .._future import Future
from .._logging import COMPILE, Throttled
from .._runtime import BUFFER_TYPES, NOW, QUEUE, buffer_of, scan
from .._tracing import ACTIVE, tracing
from ..tensor import Tensor, order_after
from ._batchcall import BatchCall, Deferred, check_exact
from ._callkey import parse_call
from ._compiled import MAX_SIGNATURES, Compiled
from ._cuda import batch_replay
from ._fused import Group, Plan, Proved, SizePlan, pow2, signature_key, without_own_frames
from ._params import check_batched
from ._rows import plan_rows, same_program

if TYPE_CHECKING:
    from .._port import Port

__all__ = ["HANDOFF_US", "INLINE_US", "MAX_BATCH", "Batched"]

#: rows per batch by default: past it a batch's replay gains little per row (``schedsvc bench batch``)
MAX_BATCH = 256
#: the most rows a key's first call is also traced with, to prove its rows apart where there are many
_PROBE = 256
#: about what handing a call to a worker and back costs, µs (``scripts/batch_loop_cost.py``): a function whose
#: one-row replay is faster gains little from batching, and the engine says so (in the log, and ``stats()``)
HANDOFF_US = 10.0
#: a call of one row whose replay is faster than this, µs, runs inline in the call: cheaper than the hand-off
#: even with the call's own bookkeeping (at most ``Config.inline_threshold_us``, whose 0 turns this off)
INLINE_US = 3.0
_log = logging.getLogger(COMPILE)
#: the engine's batch counts are added to from every worker
_counts_lock = threading.Lock()


P = ParamSpec("P")
R = TypeVar("R")


class Batched(Generic[P, R]):
    """A compiled function whose calls that are ready together run as one: ``await fn(x)`` gives the
    caller's rows.

    Made by ``eng.compile(fn, batch_axis=..., max_batch=..., exact=False)``.
    ``max_delay`` is deprecated and has no effect: a batch is the calls ready
    when a worker takes one of them, so no call waits for more to come.  By
    default a batch runs one matrix product per layer, and a caller's rows may
    differ from its lone call's in the last bits (float32: about 1e-6 of the
    row's largest value; float64: about 1e-15); ``exact=True`` gives the lone
    call's bits, computing matmuls (and other ops NumPy rounds by layout) per
    caller.

    For type checkers, ``Batched[P, R]`` takes the function's parameters ``P``
    and its calls are ``BatchCall[R]``: ``await`` gives ``R``, an ``np.ndarray``
    (or a tuple or list of them, as the function returns).
    """

    def __init__(
        self,
        port: Port,
        fn: Callable[P, Any],
        *,
        batch_axis: int,
        max_batch: int = MAX_BATCH,
        max_delay: float | None = None,
        batched: Sequence[int | str] | None = None,
        exact: bool = False,
        max_signatures: int = MAX_SIGNATURES,
        name: str | None = None,
    ) -> None:
        if type(batch_axis) is not int:
            raise TypeError(f"batch_axis must be an int, got {batch_axis!r}")
        if type(max_batch) is not int or max_batch < 1:
            raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
        if max_delay is not None:
            if not isinstance(max_delay, int | float) or not 0 <= max_delay < float("inf"):
                raise ValueError(f"max_delay must be a non-negative number of seconds, got {max_delay!r}")
            warnings.warn(
                "eng.compile(max_delay=...) has no effect and is deprecated: no call waits for others; "
                "the calls made in one turn of the event loop, and those that queue while the workers are "
                "busy, run as one batch. Leave max_delay out",
                DeprecationWarning,
                stacklevel=3,
            )
        check_exact(exact)
        if batched is not None and any(type(s) not in (int, str) for s in batched):
            raise TypeError(f"batched must name argument positions (int) or keywords (str), got {batched!r}")
        if batched is not None:
            check_batched(fn, batched)
        self._plain = Compiled(port, fn, max_signatures=max_signatures, name=name)
        self._port = port
        self._fn = fn
        self.name = self._plain.name  # (also each call's name: ``_label``)
        self.batch_axis = batch_axis
        self.max_batch = max_batch
        self.exact = exact
        self._batched = None if batched is None else frozenset(batched)
        self._lock = threading.Lock()  # the plans and groups: calls come from any thread, runs from workers
        #: (key as the signature cache keys it, rows) -> plan, the most recently used last
        self._plans: OrderedDict[Any, SizePlan] = OrderedDict()
        #: keys proved at many rows too (as the signature cache keys them) -> their output bytes per row
        self._proved: OrderedDict[Any, Proved] = OrderedDict()
        self._groups: weakref.WeakValueDictionary[Any, Group] = weakref.WeakValueDictionary()
        #: (shape but the rows, dtype, group) of the latest call of one array: a server's calls have one key
        #: (``_rows_call``)
        self._last: tuple[tuple[int, ...], np.dtype[Any], Group] | None = None
        self._deferred = Deferred(self)
        self._numbers = itertools.count(1)
        self.calls = 0
        self.inline_calls = 0
        #: a padded size whose replay takes less than this runs its calls inline, on the calling thread
        self.inline_s = min(port.config.inline_threshold_us, INLINE_US) / 1e6
        self._told_inline = False
        self.row_s = 0.0  # the fastest of the first replays of one row on the host, seconds (0: none yet)
        self._told_cheap = False
        self._splits = Throttled(_log)
        self.batches = 0
        self.rows = 0
        self.batch_sizes: dict[int, int] = {}
        self._simple = batch_axis == 0 and batched is None  # calls of one array take the hot path

    @property
    def name(self) -> str:
        """The name its calls, batches and traces show (``batch:<name>``)."""
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value
        self._label = f"batch:{value}"  # each call's name, made once

    # -- calls -------------------------------------------------------------------------

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> BatchCall[R]:
        """Admit the call now as a task of its own; the ``BatchCall`` to await.

        At the engine's limits it raises ``QueueFull`` (``await fn.submit(...)``
        waits for room instead); inside a running task it is admitted over the
        limits.  Callable from any thread.
        """
        if ACTIVE[0] and tracing.depth:  # inside another compiled function: trace straight through
            return self._fn(*args, **kwargs)  # type: ignore[no-any-return]
        tid = get_ident()
        port = self._port
        x = args[0] if len(args) == 1 and not kwargs and self._simple else None
        # one array, batched on axis 0 (the hot path)
        if type(x) is np.ndarray and (shape := x.shape) and shape[0]:
            call = self._rows_call(x, shape, tid, True)
            if call.state != "new" or port.hold(call, tid):  # ran inline, or held for a worker
                return call
        else:
            call = self._call(args, kwargs, tid)
        if not port.admit(call, tid, NOW):
            raise QueueFull(port.full_message(call, "await fn.submit(...)"))
        return call

    async def submit(self, *args: P.args, **kwargs: P.kwargs) -> BatchCall[R]:
        """Admit the call, waiting (first come first served) while the engine is at its limits."""
        tid = get_ident()
        port = self._port
        call = self._call(args, kwargs, tid)
        token = port.admit(call, tid, QUEUE)
        if token is not True:  # (cancelled while it waits, or Ctrl-C: nobody holds the call, it is cancelled)
            await port.admission(call, token)
        return call

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any], tid: int) -> BatchCall[Any]:
        """The call's task (not admitted yet); a key's first call proves the function's rows apart."""
        if len(args) == 1 and not kwargs and self._simple:  # one array, the batch on axis 0 (hot path)
            x = args[0]
            if type(x) is np.ndarray and (shape := x.shape) and shape[0]:
                return self._rows_call(x, shape, tid, False)
        device = None  # the device with memory of its own its arrays are on, if any
        pending = None  # a Future argument not final yet: the call runs alone once it is (on the host)
        port = self._port
        for slot, value in (*enumerate(args), *kwargs.items()):
            if isinstance(value, Tensor):  # its shape is known: it may be pending
                if value.device in port.memory_devices:
                    device = self._one_device(device, value.device, slot)
            elif type(value) in BUFFER_TYPES:  # a device array
                device = self._one_device(device, port.holder(value), slot)
            elif isinstance(value, Future) and value.state not in FINAL_STATES:
                pending = slot
        if pending is not None:
            if device is not None:
                raise BatchError(
                    f"{self!r}: argument {pending!r} is a pending Future and the call runs on {device}; "
                    "pass its value as a Tensor (eng.asarray(future, shape=..., dtype=...))"
                )
            return self._deferred_task(args, kwargs, tid)
        if device is None and port.host_device in port.memory_devices:
            device = port.host_device
        statics: dict[Any, Any] = {}
        key, values, rows = self.parse(args, kwargs, statics)
        group = self.group(key, values, rows, statics or None, device)
        return self._task(group, values, rows, tid)

    def _one_device(self, found: str | None, device: str | None, slot: Any) -> str:
        """The device of a call's arrays: ``device`` (of argument ``slot``), which must be ``found`` if set."""
        if device is None:
            raise BatchError(
                f"{self!r}: argument {slot!r} is a device array of a device this engine does not have "
                f"(its devices: {self._port.config.devices})"
            )
        if found is not None and found != device:
            raise BatchError(
                f"{self!r}: the arguments of one call are on {found} and {device}; move them to one "
                "device with t.to(device)"
            )
        return device

    def _rows_call(self, x: np.ndarray, shape: tuple[int, ...], tid: int, inline: bool) -> BatchCall[Any]:
        """``_task`` for a call of one ndarray batched on axis 0, the common case of serving: one buffer
        read and no dependencies, for which ``order_after`` adds nothing (the core's hazard on the buffer
        still orders it after the writes queued to that memory, a Tensor's included).  With ``inline``
        (a call that is not to wait for room: ``fn(x)``), one cheap enough runs here (``_inline``): the
        call comes back final, not to be admitted."""
        rest, dtype, rows = shape[1:], x.dtype, shape[0]
        last = self._last
        if last is not None and last[1] is dtype and last[0] == rest:  # (NumPy's dtypes are shared objects)
            group = last[2]
        else:
            host = self._port.host_device
            key = ((0, "rows", rest, dtype),)
            group = self.group(key, [x], rows, None, host if host in self._port.memory_devices else None)
            self._last = (rest, dtype, group)
        port = self._port
        call = BatchCall.__new__(BatchCall)
        call.rows_call(port, group, x, rows, group.device or port.host_device)
        call.number = self.calls = next(self._numbers)
        call.name = self._label
        if inline and group.lone is not None and rows == 1:
            self._inline(call, group.lone, x)
        return call

    def _inline(self, call: BatchCall[Any], plan: Plan, x: np.ndarray) -> None:
        """Run ``call``, of one row, here and now: its replay (``plan``) is faster than handing it to a
        worker would be.  Unless the engine is at its limits (then the door says what happens) or a write
        is queued to its row (then it runs after it, on a worker)."""
        port = self._port
        port.running()  # (EngineClosed, as the door would raise)
        if not port.may_run_now(call.buffers[0][0], call.out_bytes + x.nbytes):
            return
        try:
            call.value = plan.replay(x, [(0, 1)]) if plan.spans else plan.replay(x)
            call.state = "done"
        except Exception as exc:
            call.error, call.state = without_own_frames(exc), "failed"
        with _counts_lock:
            self.inline_calls += 1
        if not self._told_inline:
            self._told_inline = True
            _log.info(
                "%r runs its calls of one row inline, on the calling thread: their replay takes %.1f µs, "
                "less than handing them to a worker costs (%.0f µs); stats()['inline_calls'] counts them",
                self,
                plan.seconds * 1e6,
                self.inline_s * 1e6,
            )

    def _task(self, group: Group, values: list[Any], rows: int, tid: int) -> BatchCall[Any]:
        """A call's task: it reads its arrays, and depends on its Tensors and the writes queued to them."""
        memory: dict[int, int] = {}
        others = []
        for value in values:
            if type(value) is np.ndarray:
                key, nbytes = buffer_of(value)
                memory[key] = nbytes
            else:
                others.append(value)
        deps, found = scan(tuple(others), {}, (), ()) if others else ((), ())
        seen = {b[0] for b in found}
        buffers = (*((key, nbytes, False) for key, nbytes in memory.items() if key not in seen), *found)
        deps, after = self._own(deps, buffers, {})
        call = self._new_call(
            group, tuple(values), None, group.row_bytes * rows, buffers, deps, tid, group.device
        )
        call.fusion, call.rows, call.after = group, rows, after
        return call

    def _deferred_task(self, args: tuple[Any, ...], kwargs: dict[str, Any], tid: int) -> BatchCall[Any]:
        """A call with pending Future arguments: it runs alone once they are there."""
        deps, buffers = scan(args, kwargs, (), ())
        deps, after = self._own(deps, buffers, kwargs)
        call = self._new_call(self._deferred, args, kwargs or None, 0, buffers, deps, tid)
        call.fusion, call.rows, call.after = None, 0, after
        return call

    def _own(
        self, deps: tuple[Any, ...], buffers: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """The call's dependencies, checked to be this engine's; and the writes queued to its Tensors
        (it runs after them)."""
        after, _ = order_after(self._port, deps, buffers, kwargs, ())
        return deps, after

    def _new_call(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        nbytes: int,
        buffers: tuple[Any, ...],
        deps: tuple[Any, ...],
        tid: int,
        device: str | None = None,
    ) -> BatchCall[Any]:
        """A call's task: on ``device`` (one with memory of its own), else on the engine's host device."""
        port = self._port
        call: BatchCall[Any] = BatchCall(port, fn, args, kwargs, device or port.host_device, buffers, deps)
        call.out_bytes, call.name = nbytes, self._label
        call.number = self.calls = next(self._numbers)
        return call

    def parse(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], statics: dict[Any, Any]
    ) -> tuple[Any, list[Any], int]:
        """(key, batched values then unbatched arrays, rows along the batch axis) of one call; its other
        arguments go into ``statics`` (``_callkey.parse_call``)."""
        return parse_call(
            self, args, kwargs, statics, self._batched, self.batch_axis, self._port.memory_devices
        )

    def group(
        self, key: Any, values: list[Any], rows: int, statics: dict[Any, Any] | None, device: str | None
    ) -> Group:
        """The group of ``key`` on ``device`` (None: the host); made now if it has none, after its rows are
        proved apart (BatchError)."""
        group = self._groups.get((key, device))
        if group is not None:
            return group
        sigkey = signature_key(key)
        with self._lock:
            proved = self._proved.get((sigkey, device))
            if proved is not None:
                self._proved.move_to_end((sigkey, device))
        shared = values[len(values) - _count_shared(key) :]
        if proved is None:
            proved = self._prove(sigkey, rows, shared, statics, device)
        group = Group(self, key, statics, proved, device, shared)
        with self._lock:
            return self._groups.setdefault((key, device), group)

    def _prove(
        self,
        sigkey: Any,
        rows: int,
        shared: Sequence[Any],
        statics: dict[Any, Any] | None,
        device: str | None,
    ) -> Proved:
        """Trace ``sigkey`` at the call's rows and at many rows, proving its rows apart and its program the
        same at both row counts (BatchError otherwise)."""
        plan = self.plan(sigkey, rows, shared, statics, rows, device)
        probe = max(2, pow2(min(self.max_batch, _PROBE)))  # proved with many rows too
        if probe == rows:
            probe *= 2
        other = self.plan(sigkey, probe, shared, statics, rows, device)
        same_program(plan.entry.graph, rows, other.entry.graph, probe, repr(self))
        plan.same = other.same = True
        proved = Proved(plan.entry.out_bytes // rows, plan.entry.graph, rows)
        with self._lock:
            self._proved[(sigkey, device)] = proved
            while len(self._proved) > self._plain.max_signatures:
                self._proved.popitem(last=False)
        return proved

    def row_timed(self, seconds: float) -> None:
        """A replay of one row on the host took ``seconds``: say once if that is about what a hand-off
        costs, so batching the function may serve slower than calling it (a call that fast runs inline)."""
        if self.row_s and self.row_s <= seconds:
            return
        self.row_s = seconds
        if self.inline_s <= seconds < HANDOFF_US / 1e6 and not self._told_cheap:
            self._told_cheap = True
            _log.warning(
                "%r: one row's replay takes %.1f µs, about what handing a call to a worker and back costs "
                "(%g µs): batching it gains little, and may serve slower than calling the function "
                "directly; stats()['row_replay_us'] has the figure",
                self,
                seconds * 1e6,
                HANDOFF_US,
            )

    def split(self, calls: int, errors: list[BaseException]) -> None:
        """A batch of ``calls`` calls raised and was split: ``errors``, those of the calls that failed alone."""
        if not errors:  # (the batch's size could not be run: every call ran in a smaller part)
            self._splits.warning("%r: a batch of %d calls raised, and its calls ran in parts", self, calls)
            return
        first = errors[0]
        self._splits.warning(
            "%r: a batch of %d calls raised, and was split to give each caller its own outcome: %d of the "
            "calls failed alone (the first: %s: %s), the others ran",
            self,
            calls,
            len(errors),
            type(first).__name__,
            first,
        )

    def count(self, rows: int) -> None:
        """One replay of ``rows`` callers' rows gave its callers their outcomes."""
        counts = self._port.compile_counts
        with _counts_lock:
            self.batches += 1
            self.rows += rows
            self.batch_sizes[rows] = self.batch_sizes.get(rows, 0) + 1
            counts.batches += 1
            counts.batch_rows += rows
            counts.batch_sizes[rows] = counts.batch_sizes.get(rows, 0) + 1

    # -- tracing ------------------------------------------------------------------------

    def plan(
        self,
        sigkey: Any,
        rows: int,
        shared: Sequence[Any],
        statics: dict[Any, Any] | None,
        own: int,
        device: str | None = None,
    ) -> SizePlan:
        """The plan of ``sigkey`` at ``rows`` rows on ``device`` (None: the host), traced and proved now if
        it is not kept (the most recent ``max_signatures`` are); ``own``: the rows of the calls it is for,
        for messages."""
        with self._lock:
            plan = self._plans.get((sigkey, rows, device))
            if plan is not None:
                self._plans.move_to_end((sigkey, rows, device))
                return plan
        plan = self._trace(sigkey, rows, shared, statics, own, device)
        with self._lock:
            self._plans[(sigkey, rows, device)] = plan
            while len(self._plans) > self._plain.max_signatures:
                self._plans.popitem(last=False)
        return plan

    def _trace(
        self,
        sigkey: Any,
        rows: int,
        shared: Sequence[Any],
        statics: dict[Any, Any] | None,
        own: int,
        device: str | None,
    ) -> SizePlan:
        """Trace ``fn`` with the batched arguments ``rows`` long, and prove its rows apart."""
        args: dict[Any, Any] = {}
        batched: dict[int, int] = {}
        position = nshared = 0
        for part in sigkey:
            slot, kind = part[0], part[1]
            if kind == "rows":
                rest, dtype = part[2], part[3]
                axis = self.batch_axis % (len(rest) + 1)
                args[slot] = np.broadcast_to(np.empty((), dtype), (*rest[:axis], rows, *rest[axis:]))
                batched[position] = axis
                position += 1
            elif kind == "shared":
                args[slot] = shared[nshared]
                nshared += 1
                position += 1
            else:
                assert statics is not None
                args[slot] = statics[slot]
        positional = tuple(v for s, v in args.items() if isinstance(s, int))
        named = {s: v for s, v in args.items() if isinstance(s, str)}
        try:
            entry, _ = self._plain._lookup(positional, named)
        except SchedsvcError:
            raise
        except Exception as exc:
            if rows == own:
                raise  # the call's own shapes fail: its own error
            raise BatchError(
                f"{self!r} works with {own} rows along batch axis {self.batch_axis} but not with {rows} "
                f"({type(exc).__name__}: {exc}): its shapes depend on the number of rows, so calls cannot "
                "run as one batch. Pass such arguments as unbatched (batched=...), or compile without "
                "batch_axis"
            ) from exc
        plan = plan_rows(entry.graph, batched, repr(self))
        if device is None:
            return SizePlan(entry, plan, self.exact)
        return SizePlan(
            entry,
            plan,
            False,
            batch_replay(repr(self), self.exact, entry.graph, device, self._plain.graph_counts),
        )

    # -- reading ------------------------------------------------------------------------

    @property
    def graph(self) -> Any:
        """The optimised graph of the most recent trace."""
        return self._plain.graph

    def stats(self) -> dict[str, Any]:
        """The compiled function's counts, and its replays of calls (``batches``, a lone call's too),
        their ``rows``, ``batch_sizes`` (rows -> replays), the traced batch sizes kept (``plans``), and the
        calls of one row run inline, on the calling thread, because their replay was cheaper than a
        hand-off (``inline_calls``; not counted as batches), and the fastest of the first replays of one
        row on the host, µs (``row_replay_us``; None before one)."""
        with _counts_lock:
            return {
                **self._plain.stats(),
                "inline_calls": self.inline_calls,
                "row_replay_us": self.row_s * 1e6 if self.row_s else None,
                "batches": self.batches,
                "rows": self.rows,
                "batch_sizes": dict(sorted(self.batch_sizes.items())),
                "plans": len(self._plans),
            }

    def __repr__(self) -> str:
        return f"<Batched {self.name} batch_axis={self.batch_axis} max_batch={self.max_batch} batches={self.batches}>"


def _count_shared(key: Any) -> int:
    return sum(1 for part in key if part[1] == "shared")
