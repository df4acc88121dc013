"""Timeline traces: what ran where and when, written as Chrome trace-event JSON.

``with eng.trace("run.json"):`` (or ``Config(trace_path=...)`` for an engine's
whole life) records every task that finishes meanwhile: a span on the track of
the thread that ran it (one track per CPU worker, plus any thread that ran a
task inline), with its name, argument shapes and outcome; a flow arrow for
every dependency edge the scheduler made (data and buffer hazards), from the
end of the parent's span to the start of the child's; and counter tracks of
pending tasks and pending bytes, sampled at every scheduling event.  The file
opens in https://ui.perfetto.dev and ``chrome://tracing``.

Recording keeps raw tuples (a few references per task) and formats them only
when the trace is written; with no trace active the hot path pays one
attribute check per task and per scheduling event.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ._core import Task, name_of

if TYPE_CHECKING:
    from ._core import Scheduler

__all__ = ["Timeline"]

_PID = 1
_MAX_SHAPES = 8  # argument shapes listed per span


class Timeline:
    """Records spans, dependency edges and counters while it is attached to a runtime."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.t0 = time.perf_counter()
        # (seq, label, fn, thread ident, thread name, start, end, shapes, error)
        self.spans: list[tuple[Any, ...]] = []
        self.edges: list[tuple[int, int]] = []  # (parent seq, child seq), appended by the scheduler
        self.counters: list[tuple[float, int, int]] = []  # (time, pending tasks, pending bytes)

    # -- recording (hot path while tracing) -----------------------------------------

    def span(self, task: Task, start: float, end: float, error: BaseException | None) -> None:
        """``task`` ran on this thread from ``start`` to ``end`` (perf_counter seconds)."""
        shapes = []
        for arg in task.args:
            shape = getattr(arg, "shape", None)  # ndarrays and Tensors
            if shape is None and isinstance(arg, Task):  # a future: the shape of its value
                shape = getattr(arg.value, "shape", None)
            if type(shape) is tuple:
                shapes.append(shape)
                if len(shapes) == _MAX_SHAPES:
                    break
        thread = threading.current_thread()
        self.spans.append(
            (task.seq, task.name, task.fn, thread.ident, thread.name, start, end, shapes, error)
        )

    def sample(self, core: Scheduler) -> None:
        """With the runtime lock held: the pending counters now."""
        self.counters.append((time.perf_counter(), core.pending, core.pending_bytes))

    # -- output -----------------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        """The Chrome trace events: thread names, spans, flows, counters."""
        us = self._us
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": _PID, "tid": 0, "args": {"name": "schedsvc"}}
        ]
        tids: dict[Any, int] = {}
        ends: dict[int, tuple[int, float, float]] = {}  # seq -> (tid, start, end) in us
        for seq, label, fn, ident, thread, start, end, shapes, error in self.spans:
            tid = tids.get(ident)
            if tid is None:
                tid = tids[ident] = len(tids) + 1
                track = thread.removeprefix("schedsvc-")
                events.append(
                    {"ph": "M", "name": "thread_name", "pid": _PID, "tid": tid, "args": {"name": track}}
                )
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_sort_index",
                        "pid": _PID,
                        "tid": tid,
                        "args": {"sort_index": tid},
                    }
                )
            ts, dur = us(start), max(round(us(end) - us(start), 3), 0.001)
            args: dict[str, Any] = {"task": seq}
            if shapes:
                args["shapes"] = [list(s) for s in shapes]
            if error is not None:
                args["error"] = f"{type(error).__name__}: {error}"[:300]
            name = label or name_of(fn) or "task"
            events.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": "task",
                    "pid": _PID,
                    "tid": tid,
                    "ts": ts,
                    "dur": dur,
                    "args": args,
                }
            )
            ends[seq] = (tid, ts, ts + dur)
        for i, (parent, child) in enumerate(dict.fromkeys(self.edges)):  # an input passed twice: one arrow
            a, b = ends.get(parent), ends.get(child)
            if a is None or b is None:  # one side did not run while tracing (cancelled, failed input)
                continue
            # the start binds to the parent's slice just before its end, the finish to the child's start
            events.append(
                {
                    "ph": "s",
                    "name": "dep",
                    "cat": "dep",
                    "id": i,
                    "pid": _PID,
                    "tid": a[0],
                    "ts": max(a[1], a[2] - 0.001),
                }
            )
            events.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "name": "dep",
                    "cat": "dep",
                    "id": i,
                    "pid": _PID,
                    "tid": b[0],
                    "ts": b[1],
                }
            )
        last: tuple[int, int] | None = None
        for t, pending, nbytes in self.counters:
            if (pending, nbytes) == last:
                continue
            last = (pending, nbytes)
            ts = us(t)
            events.append(
                {
                    "ph": "C",
                    "name": "pending tasks",
                    "pid": _PID,
                    "tid": 0,
                    "ts": ts,
                    "args": {"tasks": pending},
                }
            )
            events.append(
                {
                    "ph": "C",
                    "name": "pending bytes",
                    "pid": _PID,
                    "tid": 0,
                    "ts": ts,
                    "args": {"bytes": nbytes},
                }
            )
        return events

    def write(self) -> None:
        doc = {"traceEvents": self.events(), "displayTimeUnit": "ms", "otherData": {"producer": "schedsvc"}}
        with open(self.path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, default=_jsonable)

    def _us(self, t: float) -> float:
        return round((t - self.t0) * 1e6, 3)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
