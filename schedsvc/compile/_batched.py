"""Dynamic batching: many small awaited calls of a compiled function run as one replay.

``eng.compile(fn, batch_axis=0)`` returns a ``Batched``.  Each call joins the
batch forming for its key -- the arguments' shapes but the batch axis, their
dtypes, the unbatched arrays (by identity) and the other values -- and gets a
``BatchCall`` to await.  A batch is sent as one engine task when it holds
``max_batch`` rows, when ``max_delay`` has passed since its first call, or at
once when the engine has nothing pending (a lone call waits for nothing).
The task concatenates the callers' rows (padded to a power of two, so that a
few sizes are traced), runs the replay, and splits the result back: each
caller gets exactly its own rows.

Before the first call of a key runs, ``_rows.plan_rows`` proves from the
traced graph that rows stay apart; a function that mixes them raises
``BatchError`` there.  With ``exact`` (the default), the ops NumPy may round
by memory layout (matmuls, sums, transcendental ufuncs) compute each caller's
rows as its own call would (``_rows.exact_fn``), so the result is bit for bit
the unbatched call's.

Calls are made on the engine's event loop (from coroutines); the batches'
state lives there, so it needs no lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core import FINAL_STATES
from .._errors import BatchError, DependencyError, QueueFull, SchedsvcError
from .._future import Future, blocks_the_loop
from .._runtime import QUEUE, buffer_of, scan
from .._runtime._bridge import cancelled_error, is_cancellation, new_token, settle
from ..tensor import Tensor
from ._compiled import MAX_SIGNATURES, Compiled, _static
from ._graph import emit
from ._rows import RowPlan, exact_fn, plan_rows
from ._state import ACTIVE, tracing

if TYPE_CHECKING:
    from .._port import Port
    from ._compiled import _Entry

__all__ = ["MAX_BATCH", "MAX_DELAY", "BatchCall", "Batched"]

#: rows per batch by default: past it a batch's replay gains little per row (``schedsvc bench batch``)
MAX_BATCH = 256
#: seconds a forming batch waits for more calls by default, while the engine is busy
MAX_DELAY = 0.002
_FINAL = ("done", "failed", "cancelled")
#: the most rows a key's first call is also traced with, to prove its rows apart where there are many
_PROBE = 256
_gate_lock = threading.Lock()  # threads waiting on one call (rare) add their gates one at a time


class BatchCall:
    """One call of a batched compiled function: ``await call`` returns the caller's own rows.

    ``cancel()`` removes it from its batch unless the batch has started;
    cancelling the coroutine that awaits it does the same.
    """

    __slots__ = (
        "_batch",
        "_gates",
        "_owner",
        "_waiters",
        "args",
        "error",
        "number",
        "rows",
        "state",
        "statics",
        "value",
    )

    #: the batched values, then the unbatched ones, in the key's order
    args: list[Any]
    rows: int
    _batch: _Batch | None
    value: Any
    error: BaseException | None

    def __init__(self, owner: Batched, number: int) -> None:
        # (args, rows, _batch, value and error are set when it joins a batch and when it ends)
        self._owner = owner
        self.number = number  # the how-manieth call of its function (the trace lists a batch's callers)
        self.statics: dict[Any, Any] | None = None  # the other arguments, by position or keyword
        self._waiters: list[Any] | None = None  # tokens of awaiting coroutines (the loop's alone)
        self._gates: list[threading.Event] | None = None  # of threads blocked in result(), under _gate_lock
        self.state = "new"  # new (inputs pending) -> forming -> sent -> done | failed | cancelled

    def done(self) -> bool:
        return self.state in _FINAL

    def cancelled(self) -> bool:
        return self.state == "cancelled"

    def cancel(self) -> bool:
        """Take the call out of its batch if the batch has not started; True if it was taken out."""
        if self.state in _FINAL:
            return self.state == "cancelled"
        batch = self._batch if self.state != "new" else None
        if batch is not None and batch.task is not None and batch.task.state not in _UNSTARTED:
            return False
        self._owner._remove(self)
        self._finish("cancelled", None, None)
        return True

    def __await__(self) -> Generator[Any, None, Any]:
        if self.state not in _FINAL:
            token = new_token()
            if self._waiters is None:
                self._waiters = [token]
            else:
                self._waiters.append(token)
            try:
                yield from token.__await__()
            except BaseException as exc:
                if is_cancellation(exc):
                    self.cancel()  # the caller gave up: its rows are not wanted
                raise
        return self._outcome(None)

    def result(self, timeout: float | None = None) -> Any:
        """Block (in a thread other than the event loop's) until the rows are there; raise its error."""
        if self.state not in _FINAL:
            if self._owner._rt().on_loop_thread():
                raise blocks_the_loop(self, "result()", "call")
            gate = threading.Event()
            with _gate_lock:  # (against other threads, and the loop taking the gates)
                if self._gates is None:
                    self._gates = [gate]
                else:
                    self._gates.append(gate)
            if self.state in _FINAL:  # finished before it could see the gate
                gate.set()
            if not gate.wait(timeout):
                raise TimeoutError(f"{self!r} did not finish within {timeout} s")
        return self._outcome(None)

    def exception(self) -> BaseException | None:
        """The call's exception, or None if it succeeded; it must be done."""
        if self.state not in _FINAL:
            raise SchedsvcError(f"{self!r} is not done; await it first")
        if self.state == "cancelled":
            raise cancelled_error()(f"{self!r} was cancelled")
        return self.error

    def _outcome(self, cancelled: type[BaseException] | None) -> Any:
        if self.state == "done":
            return self.value
        if self.state == "cancelled":
            raise (cancelled or cancelled_error())(f"{self!r} was cancelled")
        assert self.error is not None
        raise self.error

    def _finish(self, state: str, value: Any, error: BaseException | None) -> None:
        """Final now (on the loop's thread): wake whoever waits."""
        if self.state in _FINAL:
            return
        self.value, self.error, self.state = value, error, state
        waiters, self._waiters = self._waiters, None
        self.args = []  # the inputs are not needed any more
        for waiter in waiters or ():
            settle(waiter)
        if self._gates is not None:  # (a gate added after this sees the state, and sets itself)
            with _gate_lock:
                gates, self._gates = self._gates, None
            for gate in gates or ():
                gate.set()

    def __repr__(self) -> str:
        rows = f" rows={self.rows}" if self.state != "new" else ""
        return f"<BatchCall {self._owner.name} #{self.number}{rows} {self.state}>"


_UNSTARTED = frozenset({"new", "admitting", "waiting", "ready"})


class _Batch:
    """The calls of one key gathered for one replay."""

    __slots__ = ("calls", "key", "rows", "stop_timer", "task")

    def __init__(self, key: Any) -> None:
        self.key = key
        self.calls: list[BatchCall] = []
        self.rows = 0
        self.stop_timer: Callable[[], Any] | None = None
        self.task: Future[Any] | None = None


class _Plan:
    """One traced size of one key: the entry, the row plan, and the replay that runs it."""

    __slots__ = ("entry", "plan", "replay", "spans")

    def __init__(self, entry: _Entry, plan: RowPlan, exact: bool) -> None:
        self.entry = entry
        self.plan = plan
        graph = entry.graph
        rows = {}
        if exact:
            for i, (operands, out_axis) in plan.exact.items():
                rows[i] = exact_fn(graph.nodes[i], operands, out_axis)
        self.spans = bool(rows)
        self.replay = emit(graph, rows) if rows else entry.replay


class Batched:
    """A compiled function whose concurrent calls run together: ``await fn(x)`` gives the caller's rows.

    Made by ``eng.compile(fn, batch_axis=..., max_batch=..., max_delay=...)``.
    """

    def __init__(
        self,
        port: Port,
        fn: Callable[..., Any],
        *,
        batch_axis: int,
        max_batch: int = MAX_BATCH,
        max_delay: float = MAX_DELAY,
        batched: Sequence[int | str] | None = None,
        exact: bool = True,
        max_signatures: int = MAX_SIGNATURES,
        name: str | None = None,
    ) -> None:
        if type(batch_axis) is not int:
            raise TypeError(f"batch_axis must be an int, got {batch_axis!r}")
        if type(max_batch) is not int or max_batch < 1:
            raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
        if not isinstance(max_delay, int | float) or not 0 <= max_delay < float("inf"):
            raise ValueError(f"max_delay must be a non-negative number of seconds, got {max_delay!r}")
        if batched is not None and any(type(s) not in (int, str) for s in batched):
            raise TypeError(f"batched must name argument positions (int) or keywords (str), got {batched!r}")
        self._plain = Compiled(port, fn, max_signatures=max_signatures, name=name)
        self._port = port
        self._fn = fn
        self.name = self._plain.name
        self.batch_axis = batch_axis
        self.max_batch = max_batch
        self.max_delay = float(max_delay)
        self.exact = exact
        self._batched = None if batched is None else frozenset(batched)
        self._forming: dict[Any, _Batch] = {}
        self._plans: dict[Any, _Plan] = {}  # (key, rows) -> plan
        self._checked: set[Any] = set()  # keys proved at max_batch rows too
        self._admitting = 0  # batches sent and waiting for room
        self._idle_hooked = False  # in the runtime's idle_hooks: a batch forms on a busy engine
        self._room: list[Any] = []  # tokens of `await submit` callers waiting for those
        self.calls = 0
        self.batches = 0
        self.rows = 0
        self.batch_sizes: dict[int, int] = {}
        self._simple = batch_axis == 0 and batched is None  # calls of one array take the hot path
        port.batchers.add(self)

    def _rt(self) -> Any:
        return self._port.running()

    # -- calls -------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Join the batch forming for these arguments; the ``BatchCall`` to await.

        Raises QueueFull while a batch of this function waits for room in the
        engine (``await fn.submit(...)`` waits instead).
        """
        if ACTIVE[0] and tracing.depth:  # inside another compiled function: trace straight through
            return self._fn(*args, **kwargs)
        port = self._port
        rt = port.rt  # Port.running() and the loop's thread, inlined: this runs at every call
        if rt is None or port.state != "running" or rt.bridge.closed():
            raise port.refusal()
        if get_ident() != rt.loop_thread:
            raise SchedsvcError(
                f"{self!r} is called from outside the engine's event loop: batched calls are gathered on "
                "the loop, from coroutines ('await fn(x)'); in a task or a thread, call the function "
                "compiled without batch_axis"
            )
        if self._admitting:
            raise QueueFull(
                f"{self!r}: a batch of it waits for room in the engine ({rt.limits_text()}); "
                "'await fn.submit(...)' waits for room instead"
            )
        self.calls += 1
        call = BatchCall(self, self.calls)
        if len(args) == 1 and not kwargs and self._simple:  # one array, the batch on axis 0 (hot path)
            x = args[0]
            if type(x) is np.ndarray and x.ndim and x.shape[0]:
                self._join(call, ((0, "rows", x.shape[1:], x.dtype),), [x], x.shape[0])
                return call
        pending = [
            v for v in (*args, *kwargs.values()) if isinstance(v, Future) and v.state not in FINAL_STATES
        ]
        if not pending:
            self._join(call, *self._parse(args, kwargs, call))
            return call
        left = [len(pending)]

        def arrived(_: Any) -> None:  # on the loop, once each pending future is final
            left[0] -= 1
            if left[0] or call.state != "new":
                return
            try:
                self._join(call, *self._parse(args, kwargs, call))
            except BaseException as exc:  # (its inputs failed, or they make a call that does not fit)
                call._finish("failed", None, exc)

        for fut in pending:
            fut.add_done_callback(arrived)
        return call

    async def submit(self, *args: Any, **kwargs: Any) -> BatchCall:
        """Join a batch, waiting first (in turn) while a batch of this function waits for room."""
        rt = self._rt()
        while self._admitting:
            token = new_token()
            self._room.append(token)
            try:
                await token
            except BaseException:
                if token in self._room:
                    self._room.remove(token)
                raise
            if rt is not self._rt():  # pragma: no cover - the engine cannot restart
                raise self._port.refusal()
        result: BatchCall = self(*args, **kwargs)
        return result

    def _join(self, call: BatchCall, key: Any, values: list[Any], rows: int) -> None:
        """Add the call to the batch forming for ``key``; send it when full, or when the engine is idle."""
        call.args, call.rows = values, rows
        if key not in self._checked:  # the key's first call: prove its rows apart (at its own size first)
            self._plan(key, rows, call)
        batch = self._forming.get(key)
        if batch is not None and batch.rows + rows > self.max_batch:
            self._send(batch)
            batch = None
        fresh = batch is None
        if batch is None:
            batch = self._forming[key] = _Batch(key)
        batch.calls.append(call)
        batch.rows += rows
        call._batch, call.state = batch, "forming"
        rt = self._port.rt
        assert rt is not None
        if batch.rows >= self.max_batch or rt.core.pending == 0 or self._port.state != "running":
            self._send(batch)  # (a closing engine flushed its batches already: nobody would send this one)
        elif fresh:
            batch.stop_timer = rt.bridge.call_later(self.max_delay, lambda: self._due(batch))
            self._watch_idle(rt)

    def _parse(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], call: BatchCall
    ) -> tuple[Any, list[Any], int]:
        """(key, batched values then unbatched arrays, rows along the batch axis) of one call; its other
        arguments go into ``call.statics``."""
        key: list[Any] = []
        batched: list[Any] = []
        shared: list[Any] = []
        rows = -1
        for slot, value in (*enumerate(args), *sorted(kwargs.items())):
            if isinstance(value, Tensor) and value.device != "cpu":
                raise BatchError(
                    f"{self!r}: batched calls run on the CPU; argument {slot!r} is on {value.device}. Move it "
                    "with t.to('cpu'), or call the function compiled without batch_axis"
                )
            if isinstance(value, Future):
                if value.state != "done":
                    raise DependencyError(f"{value!r}, an argument of {self!r}, did not finish") from (
                        value.error
                    )
                value = value.value
            if isinstance(value, list | tuple) and self._batched is not None and slot in self._batched:
                value = np.asarray(value)
            array = isinstance(value, np.ndarray | Tensor)
            if array and (self._batched is None or slot in self._batched):
                shape, axis = value.shape, self.batch_axis
                ndim = len(shape)
                if not -ndim <= axis < ndim:
                    raise BatchError(
                        f"{self!r}: argument {slot!r} has shape {shape}, which has no batch axis {axis}"
                    )
                axis %= ndim
                n = shape[axis]
                if rows not in (-1, n):
                    raise BatchError(
                        f"{self!r}: the batched arguments of one call disagree on their rows along axis "
                        f"{axis} ({rows} and {n})"
                    )
                rows = n
                key.append((slot, "rows", shape[:axis] + shape[axis + 1 :], value.dtype))
                batched.append(value)
            elif array:
                key.append((slot, "shared", id(value), value.shape, value.dtype))  # (an id is reused)
                shared.append(value)
            else:
                key.append((slot, "static", _static(value)))
                if call.statics is None:
                    call.statics = {}
                call.statics[slot] = value
        if rows < 0:
            raise BatchError(
                f"{self!r} was called without a batched array argument (batch_axis={self.batch_axis}); pass "
                "the rows as an array, or name the batched arguments with batched="
            )
        if rows == 0:
            raise BatchError(f"{self!r}: a call with no rows along batch axis {self.batch_axis}")
        return tuple(key), [*batched, *shared], rows

    # -- sending -------------------------------------------------------------------------

    def _due(self, batch: _Batch) -> None:
        """``max_delay`` has passed since the batch's first call (on the loop)."""
        batch.stop_timer = None
        if self._forming.get(batch.key) is batch:
            self._send(batch)

    def _watch_idle(self, rt: Any) -> None:
        """Send the forming batches once nothing is pending, however the engine gets there."""
        if not self._idle_hooked:
            self._idle_hooked = True
            rt.idle_hooks.append(self._on_idle)
        if rt.core.pending == 0:  # it went idle before the hook was in: nobody will call it for that
            self.flush()

    def _on_idle(self) -> None:
        """The runtime's idle hook (on the loop)."""
        self._idle_hooked = False
        rt = self._port.rt
        if self._forming and rt is not None and self._port.state == "running":
            if rt.core.pending == 0:
                self.flush()
            else:  # busy again since: wait for the next time
                self._watch_idle(rt)

    def flush(self) -> None:
        """Send every forming batch now (the engine is idle, or closing)."""
        for batch in list(self._forming.values()):
            self._send(batch)

    def _send(self, batch: _Batch) -> None:
        if self._forming.get(batch.key) is batch:
            del self._forming[batch.key]
        if batch.stop_timer is not None:
            batch.stop_timer()
            batch.stop_timer = None
        calls = [c for c in batch.calls if c.state == "forming"]
        if calls:
            self._launch(batch, calls)

    def _launch(self, batch: _Batch, calls: list[BatchCall]) -> None:
        """Submit ``calls`` as one task; as two halves (and so on) while they exceed the byte budget."""
        sync = self._port.config.sync_mode  # (debugging: each batch runs in the caller, at once)
        try:
            task = self._task(batch, calls)
            rt = self._rt()
            if len(calls) > 1 and not rt.core.fits_alone(task):  # calls that fit alone must not fail together
                half = len(calls) // 2
                for part in (calls[:half], calls[half:]):
                    smaller = _Batch(batch.key)
                    smaller.calls, smaller.rows = part, sum(c.rows for c in part)
                    for call in part:
                        call._batch = smaller
                    self._launch(smaller, part)
                return
            admitted = rt.admit(task, get_ident(), QUEUE)  # (sync_mode: run there, at once)
            token = None if admitted is True else admitted
        except BaseException as exc:  # the engine closed, or the batch can never fit
            for call in calls:
                call._finish("failed", None, exc)
            return
        batch.task = task
        for call in calls:
            call.state = "sent"
        rows = sum(c.rows for c in calls)
        self.batches += 1
        self.rows += rows
        self.batch_sizes[rows] = self.batch_sizes.get(rows, 0) + 1
        counts = self._port.compile_counts
        counts.batches += 1
        counts.batch_rows += rows
        counts.batch_sizes[rows] = counts.batch_sizes.get(rows, 0) + 1
        if sync:
            self._finished(batch, calls)
            return
        if token is not None:  # at the engine's limits: the batch waits for room, and new calls with it
            self._admitting += 1
            rt.bridge.spawn(lambda: self._until_admitted(token), f"schedsvc: {self.name} batch admission")
        rt.add_done_callback(task, lambda _: self._finished(batch, calls))

    async def _until_admitted(self, token: Any) -> None:
        try:
            await token
        finally:
            self._admitting -= 1
            if not self._admitting:
                room, self._room = self._room, []
                for waiter in room:
                    settle(waiter)

    def _task(self, batch: _Batch, calls: list[BatchCall]) -> Future[Any]:
        first = calls[0]
        rows = sum(c.rows for c in calls)
        k = first.rows
        uniform = all(c.rows == k for c in calls)
        size = k * _pow2(len(calls)) if uniform else _pow2(rows)
        plan = self._plan(batch.key, size, first)
        nbatched = sum(1 for part in batch.key if part[1] == "rows")
        values: list[Any] = [a for c in calls for a in c.args[:nbatched]]
        values += first.args[nbatched:]  # the unbatched arrays, once
        out_bytes = plan.entry.out_bytes * rows // size
        run = _Run(plan, self._positions(batch.key), calls, size, nbatched)
        return _batch_task(self._port, run, values, out_bytes, f"batch:{self.name}")

    def _positions(self, key: Any) -> list[tuple[str, int]]:
        """For each graph input in order: ("rows", i) the i-th batched value, or ("shared", j)."""
        batched = shared = 0
        arrays: list[tuple[str, int]] = []
        for part in key:
            if part[1] == "rows":
                arrays.append(("rows", batched))
                batched += 1
            elif part[1] == "shared":
                arrays.append(("shared", shared))
                shared += 1
        return arrays

    def _finished(self, batch: _Batch, calls: list[BatchCall]) -> None:
        """The batch's task is final (on the loop): hand each caller its rows, or the error."""
        task = batch.task
        assert task is not None
        if task.state == "done":
            for call, value in zip(calls, task.value, strict=True):
                call._finish("done", value, None)
        elif task.state == "failed":
            for call in calls:
                call._finish("failed", None, task.error)
        else:
            for call in calls:
                call._finish("cancelled", None, None)
        task.value = None  # the callers hold their rows; the task keeps none

    def _remove(self, call: BatchCall) -> None:
        """A call cancelled before its batch started."""
        batch = call._batch if call.state != "new" else None
        if batch is None:
            return
        if call in batch.calls and batch.task is None:
            batch.calls.remove(call)
            batch.rows -= call.rows
            if not batch.calls and self._forming.get(batch.key) is batch:
                del self._forming[batch.key]
                if batch.stop_timer is not None:
                    batch.stop_timer()
        elif batch.task is not None and all(c is call or c.state in _FINAL for c in batch.calls):
            batch.task.cancel()  # nobody wants the batch any more

    # -- tracing ------------------------------------------------------------------------

    def _plan(self, key: Any, rows: int, call: BatchCall) -> _Plan:
        """The plan of ``key`` at ``rows`` rows, traced and proved now if new; a key's first call also
        proves it at ``max_batch`` rows, so that a function that mixes rows is refused there."""
        plan = self._plans.get((key, rows))
        if plan is None or plan.entry not in self._plain._cache.values():
            plan = self._plans[(key, rows)] = self._trace(key, rows, call)
            if len(self._plans) > 2 * self._plain.max_signatures:
                live = set(map(id, self._plain._cache.values()))
                self._plans = {k: p for k, p in self._plans.items() if id(p.entry) in live}
        if key not in self._checked:
            probe = max(2, _pow2(min(self.max_batch, _PROBE)))  # proved with many rows too
            if probe != rows and (key, probe) not in self._plans:
                self._plans[(key, probe)] = self._trace(key, probe, call)
            self._checked.add(key)
        return plan

    def _trace(self, key: Any, rows: int, call: BatchCall) -> _Plan:
        """Trace ``fn`` with the batched arguments ``rows`` long, and prove its rows apart."""
        args: dict[Any, Any] = {}
        batched: dict[int, int] = {}
        position = shared = 0
        nbatched = sum(1 for part in key if part[1] == "rows")
        for part in key:
            slot, kind = part[0], part[1]
            if kind == "rows":
                rest, dtype = part[2], part[3]
                axis = self.batch_axis % (len(rest) + 1)
                args[slot] = np.broadcast_to(np.empty((), dtype), (*rest[:axis], rows, *rest[axis:]))
                batched[position] = axis
                position += 1
            elif kind == "shared":
                args[slot] = call.args[nbatched + shared]
                shared += 1
                position += 1
            else:
                assert call.statics is not None
                args[slot] = call.statics[slot]
        positional = tuple(v for s, v in args.items() if isinstance(s, int))
        named = {s: v for s, v in args.items() if isinstance(s, str)}
        try:
            entry, _ = self._plain._lookup(positional, named)
        except SchedsvcError:
            raise
        except Exception as exc:
            if rows == call.rows:
                raise  # the call's own shapes fail: its own error
            raise BatchError(
                f"{self!r} works with {call.rows} rows along batch axis {self.batch_axis} but not with {rows} "
                f"({type(exc).__name__}: {exc}): its shapes depend on the number of rows, so calls cannot "
                "run as one batch. Pass such arguments as unbatched (batched=...), or compile without "
                "batch_axis"
            ) from exc
        plan = plan_rows(entry.graph, batched, repr(self))
        return _Plan(entry, plan, self.exact)

    # -- reading ------------------------------------------------------------------------

    @property
    def graph(self) -> Any:
        """The optimised graph of the most recent trace."""
        return self._plain.graph

    def stats(self) -> dict[str, Any]:
        """The compiled function's counts, and batches, rows, and ``batch_sizes`` (rows -> batches)."""
        return {
            **self._plain.stats(),
            "batches": self.batches,
            "rows": self.rows,
            "batch_sizes": dict(sorted(self.batch_sizes.items())),
        }

    def __repr__(self) -> str:
        return f"<Batched {self.name} batch_axis={self.batch_axis} max_batch={self.max_batch} batches={self.batches}>"


class _Run:
    """The batch task's function (on a worker): join the callers' rows, replay, split the result."""

    __slots__ = ("calls", "nbatched", "plan", "positions", "size")

    def __init__(
        self, plan: _Plan, positions: list[tuple[str, int]], calls: list[BatchCall], size: int, nbatched: int
    ) -> None:
        self.plan = plan
        self.positions = positions
        self.calls = calls
        self.size = size
        self.nbatched = nbatched

    @property
    def __name__(self) -> str:
        return f"batch:{self.plan.entry.graph.name}"

    def span_args(self) -> dict[str, Any]:
        """What the trace shows of the batch: its callers (their numbers, in order), rows, padding."""
        live = [c for c in self.calls if c.state != "cancelled"]
        return {
            "calls": len(live),
            "rows": sum(c.rows for c in live),
            "padded_to": self.size,
            "callers": [c.number for c in live],
        }

    def __call__(self, *values: Any) -> list[Any]:
        calls, nb, size = self.calls, self.nbatched, self.size
        plan = self.plan
        graph = plan.entry.graph
        live = [i for i, c in enumerate(calls) if c.state != "cancelled"]
        rows = sum(calls[i].rows for i in live)
        spans = []
        start = 0
        for i in live:
            spans.append((start, start + calls[i].rows))
            start += calls[i].rows
        pad = size - rows
        if pad:
            k = calls[live[0]].rows
            uniform = all(calls[i].rows == k for i in live) and pad % k == 0
            spans += [(start + j, start + j + k) for j in range(0, pad, k)] if uniform else [(start, size)]
        inputs: list[Any] = []
        shared = values[len(calls) * nb :]
        for kind, j in self.positions:
            if kind == "shared":
                inputs.append(shared[j])
                continue
            axis = plan.plan.axes[graph.inputs[len(inputs)]]
            assert axis is not None
            parts = [values[i * nb + j] for i in live]
            if pad:
                first = np.take(parts[0], [0], axis=axis)
                parts.append(np.repeat(first, pad, axis=axis))
            inputs.append(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis))
        out = plan.replay(*inputs, spans) if plan.spans else plan.replay(*inputs)
        outs = out if graph.out_kind != "single" else (out,)
        results: list[Any] = [None] * len(calls)
        k = spans[0][1] - spans[0][0]
        one_length = all(calls[i].rows == k for i in live)
        if graph.out_kind == "single" and plan.plan.outputs[0] == 0 and one_length:
            # callers of one length: their rows split off in one NumPy step
            for i, piece in zip(live, out[:rows].reshape(len(live), k, *out.shape[1:]), strict=True):
                results[i] = piece
            return results
        for n, i in enumerate(live):
            s, e = spans[n]
            pieces = [_rows_of(o, a, s, e) for o, a in zip(outs, plan.plan.outputs, strict=True)]
            kind = graph.out_kind
            results[i] = pieces[0] if kind == "single" else tuple(pieces) if kind == "tuple" else pieces
        return results


def _batch_task(port: Port, run: _Run, values: list[Any], out_bytes: int, name: str) -> Future[Any]:
    """The batch's task: it reads every caller's arrays (rows cut from one array key to it once) and
    depends on their Tensors, and on the writes queued to them."""
    memory: dict[int, int] = {}
    others = []
    base = None
    for value in values:  # hot path: one pass, a view of the last base seen costs one check
        if type(value) is np.ndarray:
            if value.base is None:
                memory[id(value)] = value.nbytes
            elif value.base is not base:
                base = value.base
                key, nbytes = buffer_of(value)
                memory[key] = nbytes
        else:
            others.append(value)
    deps, found = scan(tuple(others), {}, (), ()) if others else ((), ())
    buffers = (
        *((key, nbytes, False) for key, nbytes in memory.items() if key not in {b[0] for b in found}),
        *found,
    )
    after: tuple[Any, ...] = ()
    if any(type(dep) is Tensor for dep in deps):  # it runs after their pending writes
        after, _ = port.tensors.ordered(deps, buffers, {}, ())
    task: Future[Any] = Future(
        port, run, tuple(values), None, "cpu", 0, out_bytes, buffers, deps, name, False
    )
    task.after = after
    return task


def _rows_of(array: Any, axis: int, start: int, stop: int) -> Any:
    if axis == 0:
        return array[start:stop]
    return np.ascontiguousarray(array[(slice(None),) * axis + (slice(start, stop),)])


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()
