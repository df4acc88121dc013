"""A batch key's group of calls, and their fused run: the ready calls of one key replayed as one.

Every call of a ``Batched`` carries the ``Group`` of its key as its
``fusion``.  The worker that takes one ready call takes the other ready calls
of the group too (``Scheduler.take_like``) and hands them to ``Group.run``,
which concatenates their rows (padded to a power of two, so that a few sizes
are traced, however many rows each call has), replays once, and splits the result back, one outcome per call.
If the fused run raises, it is split in halves, down to single calls, so each
caller gets the outcome it would have had alone.  A call that runs alone (a
thread running the call it waits for, sync mode) calls the group itself.

A group on a device with memory of its own (cuda) is launched there instead (``Group.launch``, by the
device that took one of its calls, its stream current): host rows are joined on the host and copied in
once, device rows joined on the device; the replay is the plan's CUDA graph (one per padded size); a
caller of host rows gets its rows of the output on the host (the output copied back once), a caller of
device rows a view of the device output.  A launch that raises is split as a run is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from operator import attrgetter
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ._graph import emit
from ._rows import RowPlan, exact_fn, same_program

if TYPE_CHECKING:
    from .._core import Task
    from .._runtime import Staging
    from ._compiled import Entry
    from ._graph import Graph

__all__ = ["Group", "Plan", "Planner", "Proved", "SizePlan", "pow2", "signature_key", "without_own_frames"]


class Plan(Protocol):
    """One traced size of a key, as a fused run uses it: the replay of its graph, its row plan, whether the
    replay takes each caller's row spans, and whether its program was found the same as the key's."""

    replay: Callable[..., Any]
    plan: RowPlan
    spans: bool
    same: bool
    seconds: float  # its fastest replay on the host, seconds (0: not timed yet); one row's only
    samples: int  # its replays timed (at most ``_ROW_TIMINGS``)

    @property
    def graph(self) -> Graph: ...


class Planner(Protocol):
    """What a group asks of the batched function it belongs to (``Batched``)."""

    name: str
    batch_axis: int
    max_batch: int
    #: a padded size whose replay is known to take less than this runs its calls inline (0: never)
    inline_s: float

    def plan(
        self,
        sigkey: Any,
        rows: int,
        shared: Sequence[Any],
        statics: dict[Any, Any] | None,
        own: int,
        device: str | None = None,
    ) -> Plan:
        """The plan of ``sigkey`` at ``rows`` rows (traced and proved now if it is not kept), replayed on
        ``device`` (one with memory of its own) or the host (None)."""
        ...

    def count(self, rows: int) -> None:
        """One replay of ``rows`` callers' rows gave its callers their outcomes."""
        ...

    def row_timed(self, seconds: float) -> None:
        """A replay of one row on the host took ``seconds``."""
        ...

    def split(self, calls: int, errors: list[BaseException]) -> None:
        """A batch of ``calls`` calls raised and was split: ``errors``, those of the calls that failed alone."""
        ...


#: replays of one row timed, the first of them twice (``Group._timed``): the fastest is the row's cost
_ROW_TIMINGS = 3
#: the modules whose frames an error of a fused run is stripped of (``without_own_frames``)
_OWN_MODULES = frozenset({__name__, f"{__package__}._batched"})


class Proved:
    """A key proved to batch: its output bytes per row, and its graph at the rows it was proved with."""

    __slots__ = ("graph", "row_bytes", "rows")

    def __init__(self, row_bytes: int, graph: Graph, rows: int) -> None:
        self.row_bytes = row_bytes
        self.graph = graph
        self.rows = rows


class SizePlan:
    """One traced size of one key: the entry, the row plan, and the replay that runs it; ``same``: its
    program was found the same as at the key's other sizes (``same_program``)."""

    __slots__ = ("entry", "plan", "replay", "same", "samples", "seconds", "spans")

    def __init__(
        self, entry: Entry, plan: RowPlan, exact: bool, on_device: Callable[..., Any] | None = None
    ) -> None:
        self.entry = entry
        self.plan = plan
        self.same = False
        self.seconds = 0.0  # its fastest replay on the host, seconds (0: not timed yet); one row's only
        self.samples = 0  # its replays timed
        graph = entry.graph
        rows = {}
        if exact:
            for i, (operands, out_axis) in plan.exact.items():
                rows[i] = exact_fn(graph.nodes[i], operands, out_axis)
        self.spans = bool(rows)
        #: a replay on a device with memory of its own (``on_device``), of the graph's inputs alone
        self.replay = on_device or (emit(graph, rows) if rows else entry.replay)

    @property
    def graph(self) -> Graph:
        return self.entry.graph


class Group:
    """The calls of one batch key: what runs the ready ones as one (``runtime.Fusion``), and one alone
    (as the task's function, where a thread runs the call it waits for, or in sync mode)."""

    __slots__ = (
        "__weakref__",
        "batched",
        "device",
        "host_rows",
        "key",
        "limit",
        "lone",
        "nbatched",
        "positions",
        "reference",
        "row_bytes",
        "shared",
        "sigkey",
        "statics",
    )

    def __init__(
        self,
        batched: Planner,
        key: Any,
        statics: dict[Any, Any] | None,
        proved: Proved,
        device: str | None = None,
        shared: Sequence[Any] = (),
    ) -> None:
        self.batched = batched
        self.key = key
        #: its unbatched arrays as the first call passed them (Tensors: what a trace of a new size takes)
        self.shared = tuple(shared)
        #: the device with memory of its own its calls run on (None: the host); are its rows host arrays?
        self.device = device
        self.host_rows = all(len(part) == 4 for part in key if part[1] == "rows")
        self.sigkey = signature_key(key)
        self.statics = statics  # the other arguments, by position or keyword (equal for the whole key)
        self.limit = batched.max_batch
        self.nbatched = sum(1 for part in key if part[1] == "rows")
        self.positions = _positions(key)
        self.row_bytes = proved.row_bytes  # the bytes of its outputs per row
        self.reference = proved.graph, proved.rows  # what a batch of any size must trace to (same_program)
        #: the plan of one row on the host, once its replay is known to take less than ``batched.inline_s``
        #: and it gives one array with the rows on axis 0: a call of one row then runs it inline, on the
        #: calling thread (``Batched._inline``)
        self.lone: Plan | None = None

    #: a call's weight within ``limit``: its rows (``Scheduler.take_like`` asks it of each call it takes)
    weight: Callable[[Task], int] = attrgetter("rows")

    def run(
        self, tasks: list[Task], args: list[Any]
    ) -> tuple[list[tuple[Any, BaseException | None]], dict[str, Any]]:
        """The ready calls of this key, as one replay (split where it raises)."""
        return self._fused(tasks, args, None)

    def launch(
        self, tasks: list[Task], args: list[Any], staging: Staging
    ) -> tuple[list[tuple[Any, BaseException | None]], dict[str, Any]]:
        """The ready calls of this key, launched as one on ``staging``'s device (split where it raises)."""
        return self._fused(tasks, args, staging)

    def _fused(
        self, tasks: list[Task], args: list[Any], staging: Staging | None
    ) -> tuple[list[tuple[Any, BaseException | None]], dict[str, Any]]:
        rows = list(map(self.weight, tasks))
        runs: list[int] = []
        split: list[bool] = []
        outcomes = self.outcomes(args, rows, runs, staging, split)
        if split:  # it raised, and was split: said (how many failed alone, the first error)
            errors = [error for _, error in outcomes if error is not None]
            self.batched.split(len(outcomes), errors)
        return outcomes, self._described(tasks, rows, runs)

    def _described(self, tasks: list[Task], rows: list[int], runs: list[int]) -> dict[str, Any]:
        return {
            "name": f"batch:{self.batched.name}",
            "calls": len(tasks),
            "rows": sum(rows),
            "padded_to": runs[0] if len(runs) == 1 else runs,
            "callers": [t.number for t in tasks],  # type: ignore[attr-defined]
        }

    def __call__(self, *values: Any) -> Any:
        """One call alone."""
        axis = self.batched.batch_axis
        rows = values[0].shape[axis]
        ((value, error),) = self.outcomes([values], [rows], [])
        if error is not None:
            raise error
        return value

    @property
    def __name__(self) -> str:
        return f"batch:{self.batched.name}"

    def outcomes(
        self,
        args: list[Any],
        rows: list[int],
        runs: list[int],
        staging: Staging | None = None,
        split: list[bool] | None = None,
    ) -> list[tuple[Any, BaseException | None]]:
        """Each call's (value, error): the calls run (or, given ``staging``, are launched) as one replay;
        where it raises, as two halves, down to single calls, so each caller gets the outcome it would
        have had alone (and ``split`` gets an entry)."""
        nb = self.nbatched
        shared = args[0][nb:]
        if shared and any(a[i] is not s for a in args[1:] for i, s in enumerate(shared, nb)):
            # another unbatched array under the key (its id was reused since): never in one replay
            return [
                o
                for a, r in zip(args, rows, strict=True)
                for o in self.outcomes([a], [r], runs, staging, split)
            ]
        try:
            values, size = self._replay(args, rows, staging)
        except BaseException as exc:  # a caller's rows raise (its data), or a size that cannot be traced
            if len(args) == 1:
                self.batched.count(rows[0])
                runs.append(rows[0])
                return [(None, without_own_frames(exc))]
            if split is not None:
                split.append(True)
            half = len(args) // 2
            first = self.outcomes(args[:half], rows[:half], runs, staging, split)
            return first + self.outcomes(args[half:], rows[half:], runs, staging, split)
        self.batched.count(sum(rows))
        runs.append(size)
        return [(value, None) for value in values]

    def _replay(self, args: list[Any], rows: list[int], staging: Staging | None) -> tuple[list[Any], int]:
        """Join the calls' rows (padded), replay, split the result: each call's result, and the size.

        The rows are padded to a power of two, a lone call's too, so that calls of any number of rows
        trace a few sizes (1, 2, 4, ... rows), not one per size.  Given ``staging``, on its device."""
        nb = self.nbatched
        k = rows[0]
        total = sum(rows)
        uniform = rows.count(k) == len(rows)
        size = pow2(total)
        shared = args[0][nb:]
        plan = self.batched.plan(self.sigkey, size, self.shared or shared, self.statics, k, self.device)
        graph = plan.graph
        if not plan.same and size != k:  # (a call alone at its own rows is the function itself)
            same_program(*self.reference, graph, size, repr(self.batched))
            plan.same = True
        spans = []  # each caller's (start, stop); the padding's rows follow the last
        start = 0
        for r in rows:
            spans.append((start, start + r))
            start += r
        pad = size - total
        inputs: list[Any] = []
        for kind, j in self.positions:
            if kind == "shared":
                value = shared[j]
                if staging is not None and not staging.holds(value):
                    value = staging.to_device(value)
                inputs.append(value)
                continue
            axis = plan.plan.axes[graph.inputs[len(inputs)]]
            assert axis is not None
            parts = [a[j] for a in args]
            if staging is None:
                if pad:
                    first = np.take(parts[0], [0], axis=axis)
                    parts.append(np.repeat(first, pad, axis=axis))
                inputs.append(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis))
            else:
                inputs.append(_joined_on(staging, parts, axis, pad))
        n = len(rows)
        timed = staging is None and size == 1 and plan.samples < _ROW_TIMINGS  # what one row costs
        # (a first replay is slow: cold caches, first allocations; a second one is timed too)
        for _ in range(2 if timed and not plan.samples else 1):
            began = time.perf_counter() if timed else 0.0
            out = plan.replay(*inputs, spans) if plan.spans else plan.replay(*inputs)
            if timed:
                self._timed(plan, time.perf_counter() - began)
        if staging is not None and self.host_rows:  # the host's callers: their rows back on the host, at once
            out = staging.to_host(out) if graph.out_kind == "single" else [staging.to_host(o) for o in out]
        if graph.out_kind == "single" and plan.plan.outputs[0] == 0 and uniform:
            # callers of one length: their rows split off in one NumPy step
            return list(out[:total].reshape(n, k, *out.shape[1:])), size
        outs = out if graph.out_kind != "single" else (out,)
        results: list[Any] = []
        kind = graph.out_kind
        for s, e in spans:
            pieces = [_rows_of(o, a, s, e) for o, a in zip(outs, plan.plan.outputs, strict=True)]
            results.append(pieces[0] if kind == "single" else tuple(pieces) if kind == "tuple" else pieces)
        return results, size

    def _timed(self, plan: Plan, seconds: float) -> None:
        """A replay of one row on the host took ``seconds``: is a call of one row cheaper to run inline?  The
        fastest of the first few replays is its cost (a slower one waited for the GIL or the caches: the same
        program on the same shapes does the same work), and the answer is kept after them."""
        plan.samples += 1
        if plan.seconds and plan.seconds <= seconds:
            return
        plan.seconds = seconds
        self.batched.row_timed(seconds)
        if plan.graph.out_kind == "single" and plan.plan.outputs[0] == 0 and seconds < self.batched.inline_s:
            self.lone = plan


def signature_key(key: Any) -> Any:
    """A batch key as the signature cache keys it: an unbatched array by its shape and dtype, not its id."""
    return tuple((p[0], "shared", p[3], p[4]) if p[1] == "shared" else p for p in key)


def _positions(key: Any) -> list[tuple[str, int]]:
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


def without_own_frames(exc: BaseException) -> BaseException:
    """``exc`` without the frames of batching on its traceback (this module's and the ``Batched``
    front's, which traces a size the run needs): they hold every caller's arrays."""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in _OWN_MODULES:
        tb = tb.tb_next
    exc.__traceback__ = tb
    return exc


def _rows_of(array: Any, axis: int, start: int, stop: int) -> Any:
    if axis == 0:
        return array[start:stop]
    part = array[(slice(None),) * axis + (slice(start, stop),)]
    return np.ascontiguousarray(part) if type(array) is np.ndarray else part.copy()


def _joined_on(staging: Staging, parts: list[Any], axis: int, pad: int) -> Any:
    """The calls' rows joined along ``axis`` (padded with copies of the first row) on ``staging``'s device:
    host rows joined on the host and copied in once, device rows joined there."""
    host = type(parts[0]) is np.ndarray
    xp = np if host else staging.xp
    if pad:
        first = parts[0][(slice(None),) * axis + (slice(0, 1),)]
        parts = [*parts, xp.concatenate([first] * pad, axis=axis)]
    joined = parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=axis)
    return staging.to_device(np.ascontiguousarray(joined)) if host else joined


def pow2(n: int) -> int:
    """The least power of two not below ``n`` (at least 1)."""
    return 1 << (n - 1).bit_length()
