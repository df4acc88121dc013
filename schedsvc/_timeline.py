"""Timeline traces: what ran where and when, written as Chrome trace-event JSON.

``with eng.trace("run.json"):`` (or ``Config(trace_path=...)`` for an engine's
whole life) records every task that finishes meanwhile: a span on the track of
the thread that ran it (one track per CPU worker, plus any thread that ran a
task inline; on a Dask cluster, one per Dask worker, see ``remote_span``), with its name, the shapes of its array arguments and of the
values it took from futures, and its error; a flow arrow from the parent's
span to the child's for every value a task took from another (finished
before it was submitted or not) and every buffer hazard the scheduler
ordered; and counter tracks of pending tasks and pending bytes, sampled at
every scheduling event.  The file is in the trace-event format that
https://ui.perfetto.dev and ``chrome://tracing`` read; each flow end sits at
its span's start with the span's category, which is what the strictest reader,
Chrome's DevTools Performance panel, binds.

Recording appends raw values to flat lists, one per thread (about 10,000
instructions a task, 1 to 2 us here) and formats them only when the trace is
written; with no trace active the hot path pays one attribute check per task
and per scheduling event.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from operator import itemgetter
from threading import get_ident
from typing import TYPE_CHECKING, Any

import numpy as np

from ._core import Task, name_of

if TYPE_CHECKING:
    from ._core import Scheduler
    from ._port import Port

__all__ = ["Recording", "Timeline", "describe"]

_PID = 1  # track n is tid _PID + n: Perfetto labels the thread whose tid equals the pid "main thread"
_ndarray = np.ndarray
_ufunc = np.ufunc
_MAX_SHAPES = 8  # argument shapes listed per span
_SPAN = 6  # values recorded per span
_SAMPLE = 3  # values per counter sample
_CAP_CHECK = _SPAN * 1024  # a thread checks the span cap when its list reaches a multiple of this
_MAX_INTERNED = 4096  # distinct shape lists (and names) shared between spans
_CHUNK = 8192  # events per json.dumps call when writing


class Timeline:
    """Records spans, dependency edges and counters while it is attached to a runtime."""

    def __init__(self, path: str | os.PathLike[str], max_spans: int = 2_000_000) -> None:
        self.path = os.fspath(path)
        if isinstance(max_spans, bool) or not isinstance(max_spans, int):
            raise TypeError(f"max_spans must be an int >= 1 (spans kept in the file), got {max_spans!r}")
        if max_spans < 1:
            raise ValueError(f"max_spans must be >= 1 (spans kept in the file), got {max_spans}")
        if not self.path:
            raise ValueError("the trace path is empty: name a .json file, e.g. 'run.json'")
        if "\0" in os.fsdecode(self.path):  # no file is named so: say it now, not when the trace is written
            raise ValueError(
                f"cannot write a trace to {self.path!r}: a path cannot contain a NUL character ('\\x00'); "
                "name a .json file, e.g. 'run.json'"
            )
        if os.path.isdir(self.path):
            raise IsADirectoryError(
                f"cannot write a trace to {self.path!r}: it is a directory; name a .json file in it"
            )
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):  # say so now, not after a long recording
            raise FileNotFoundError(
                f"cannot write a trace to {self.path!r}: there is no directory {folder!r}"
            )
        if not os.access(folder, os.W_OK):
            raise PermissionError(
                f"cannot write a trace to {self.path!r}: directory {folder!r} is not writable"
            )
        self.t0 = time.perf_counter()
        self.wall0 = time.time()  # the same instant on the wall clock: remote spans are timed with it
        self.max_spans = max_spans  # a whole-life trace of a long-running service stays bounded
        self._dropped = 0  # spans not kept because the cap was reached
        self._full = False  # the cap is reached: count spans, do not keep them
        # Per thread, six values per span, flat (seq, name, start, end, shapes, error): references to
        # objects that exist anyway, so recording allocates nearly nothing for the garbage collector
        # to scan (a tuple per span does; array('d') converts each value slowly), and no two workers
        # write to the same list
        self._local = threading.local()  # .records: this thread's spans
        self._remote: dict[str, list[Any]] = {}  # track name -> its spans, for tasks run elsewhere
        self._tracks: list[tuple[str, list[Any]]] = []  # (track name, its spans), track number - 1
        self.loop_thread: int | None = None  # the event loop's thread: its track is the inline runs
        self.edges: list[tuple[int, int]] = []  # (parent seq, child seq), appended by the scheduler
        #: time, pending tasks, pending bytes, ...: three values per scheduling event, flat; the
        #: runtime extends it; once the span cap is reached it becomes a sink that keeps nothing
        self.counters: list[float | int] | deque[Any] = []
        self._samples = self.counters  # what was sampled, for the file
        #: called once the cap is reached (the engine stops the scheduler's edge list there)
        self.on_full: Callable[[], None] | None = None
        self._shapes: dict[Any, Any] = {}  # one tuple per distinct shape list, shared by spans
        self._names: dict[str, str] = {}  # one string per name (a builtin makes a new one per call)

    # -- recording (hot path while tracing) -----------------------------------------

    def span(self, task: Task, start: float, end: float, error: BaseException | None) -> None:
        """``task`` ran on this thread from ``start`` to ``end`` (perf_counter seconds)."""
        if self._full:
            self._dropped += 1
            return
        try:
            records = self._local.records
        except AttributeError:  # this thread's first span
            records = self._new_track()
        shapes: Any = None  # (a dict: what a task says of itself, span_args)
        for arg in task.args:  # hot path: one exact type check per argument
            if type(arg) is _ndarray:
                if shapes is None:
                    shapes = (arg.shape,)
                elif len(shapes) < _MAX_SHAPES:
                    shapes += (arg.shape,)
        for dep in task.deps:  # the futures and Tensors it took: the shapes of their values
            shape = getattr(dep.value, "shape", None)
            if type(shape) is tuple:
                if shapes is None:
                    shapes = (shape,)
                elif len(shapes) < _MAX_SHAPES:
                    shapes += (shape,)
        if shapes is not None:
            shapes = self._shapes.setdefault(shapes, shapes)  # the new tuples die young
        described = getattr(type(task.fn), "span_args", None)
        if described is not None:  # a task that says what it is (a batch: its callers)
            shapes = described(task.fn)
        name: Any = task.name
        if name is None:
            name = task.fn
            if type(name) is not _ufunc:  # a ufunc is kept and named when written: it lives on anyway
                try:  # name_of, inlined
                    name = name.__name__
                except Exception:  # user objects run code here
                    name = None
                name = self._names.setdefault(name, name) if type(name) is str else None
        # the error as a string: a kept exception would keep its traceback's frames alive
        records.extend((task.seq, name, start, end, shapes, None if error is None else describe(error)))
        if len(records) % _CAP_CHECK == 0:  # every 1,024 spans of a thread: the cap, all threads
            self._check_cap()

    def fused_span(self, task: Task, start: float, end: float, described: dict[str, Any]) -> None:
        """Tasks that ran as one (``task`` first) ran on this thread from ``start`` to ``end``: one span,
        named by ``described["name"]``, whose arguments are the rest of ``described``."""
        if self._full:
            self._dropped += 1
            return
        try:
            records = self._local.records
        except AttributeError:
            records = self._new_track()
        described = dict(described)
        name = described.pop("name", None)
        name = self._names.setdefault(name, name) if type(name) is str else task.name
        records.extend((task.seq, name, start, end, described, None))
        if len(records) % _CAP_CHECK == 0:
            self._check_cap()

    def remote_span(
        self,
        task: Task,
        track: str,
        start: float,
        end: float,
        shapes: tuple[tuple[int, ...], ...] | None,
        error: str | None,
    ) -> None:
        """(On the loop thread) ``task`` ran on another machine's ``track`` from ``start`` to ``end``.

        The times are that machine's wall clock (``time.time()``); they are placed on this
        trace's clock through the instant the trace started, so the machines' clocks must agree
        (NTP) for spans from several machines to line up.
        """
        if self._full:
            self._dropped += 1
            return
        records = self._remote.get(track)
        if records is None:
            records = self._remote[track] = []
            self._tracks.append((track, records))
        shift = self.t0 - self.wall0
        name = task.name or name_of(task.fn)
        records.extend((task.seq, name, start + shift, end + shift, shapes, error))
        if len(records) % _CAP_CHECK == 0:
            self._check_cap()

    def _check_cap(self) -> None:
        """Past ``max_spans`` spans (or 4 counter samples a span), stop keeping spans, samples and edges."""
        if len(self._shapes) > _MAX_INTERNED:  # many distinct shapes: start afresh, stay bounded
            self._shapes = {}
        if len(self._names) > _MAX_INTERNED:
            self._names = {}
        if self._kept() < self.max_spans and len(self._samples) < _SAMPLE * 4 * self.max_spans:
            return
        self._full = True
        self.counters = deque(maxlen=0)  # extend() keeps nothing, at C speed
        if self.on_full is not None:
            self.on_full()

    def _new_track(self) -> list[Any]:
        """The calling thread's first span: a track of its own, named after the thread."""
        records: list[Any] = []
        self._tracks.append((_track_name(get_ident() == self.loop_thread), records))
        self._local.records = records
        return records

    def _kept(self) -> int:
        return sum(len(records) for _, records in self._tracks) // _SPAN

    def sample(self, core: Scheduler) -> None:
        """With the runtime lock held: the pending counters now (the runtime inlines this)."""
        self.counters.extend((time.perf_counter(), core.pending, core.pending_bytes))

    @property
    def recorded(self) -> int:
        """How many spans are kept (at most ``max_spans``)."""
        return min(self._kept(), self.max_spans)

    @property
    def dropped(self) -> int:
        """How many spans were counted but not kept, past ``max_spans``."""
        return self._dropped + max(self._kept() - self.max_spans, 0)

    @property
    def track_names(self) -> list[str]:
        """The tracks' names, in the order of their first span (track number = index + 1)."""
        return [name for name, _ in self._tracks]

    @property
    def spans(self) -> list[tuple[Any, ...]]:
        """The spans kept, by start time: ``(seq, name, track, start, end, shapes, error)`` tuples.

        Threads check the cap every 1,024 spans, so a few more may be recorded; the first
        ``max_spans`` by start time are kept.
        """
        spans = [
            (r[i], _named(r[i + 1]), track, r[i + 2], r[i + 3], r[i + 4], r[i + 5])
            for track, (_, r) in enumerate(self._tracks, 1)
            for i in range(0, len(r), _SPAN)
        ]
        spans.sort(key=itemgetter(3))
        del spans[self.max_spans :]
        return spans

    # -- output -----------------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        """The Chrome trace events: thread names, spans, flows, counters."""
        us = self._us
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": _PID, "tid": 0, "args": {"name": "schedsvc"}}
        ]
        spans = self.spans
        used = {span[2] for span in spans}
        for track, track_name in enumerate(self.track_names, 1):
            if track not in used:  # its spans were past the cap
                continue
            tid = _PID + track
            events.append(
                {"ph": "M", "name": "thread_name", "pid": _PID, "tid": tid, "args": {"name": track_name}}
            )
            events.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": _PID,
                    "tid": tid,
                    "args": {"sort_index": track},
                }
            )
        starts: dict[int, tuple[int, float]] = {}  # seq -> (tid, span start in us)
        for seq, name, track, start, end, shapes, error in spans:
            tid = _PID + track
            ts, dur = us(start), max(round(us(end) - us(start), 3), 0.001)
            args: dict[str, Any] = {"task": seq}
            if type(shapes) is dict:
                args.update(shapes)
            elif shapes:
                args["shapes"] = [list(s) for s in shapes]
            if error is not None:
                args["error"] = error
            events.append(
                {
                    "ph": "X",
                    "name": name or "task",
                    "cat": "task",
                    "pid": _PID,
                    "tid": tid,
                    "ts": ts,
                    "dur": dur,
                    "args": args,
                }
            )
            starts[seq] = (tid, ts)
        for i, (parent, child) in enumerate(dict.fromkeys(self.edges)):  # an input passed twice: one arrow
            a, b = starts.get(parent), starts.get(child)
            if a is None or b is None:  # one side did not run while tracing (cancelled, failed input)
                continue
            # each end sits at its span's start with the span's cat: DevTools binds a flow only to a
            # span with equal pid, tid, cat and ts; Perfetto and chrome://tracing take the enclosing one
            events.append(
                {
                    "ph": "s",
                    "name": "dep",
                    "cat": "task",
                    "id": i,
                    "pid": _PID,
                    "tid": a[0],
                    "ts": a[1],
                }
            )
            events.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "name": "dep",
                    "cat": "task",
                    "id": i,
                    "pid": _PID,
                    "tid": b[0],
                    "ts": b[1],
                }
            )
        last: tuple[float | int, float | int] | None = None
        c = self._samples
        for t, pending, nbytes in zip(c[::3], c[1::3], c[2::3], strict=True):
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
        other = {"producer": "schedsvc", "spans": self.recorded, "spans_dropped": self.dropped}
        events = self.events()
        with open(self.path, "w", encoding="utf-8") as fh:
            # json.dumps in chunks: the C encoder, ten times json.dump's, without one huge string
            fh.write('{"traceEvents": [')
            for i in range(0, len(events), _CHUNK):
                if i:
                    fh.write(", ")
                fh.write(json.dumps(events[i : i + _CHUNK], default=_jsonable)[1:-1])
            fh.write(f'], "displayTimeUnit": "ms", "otherData": {json.dumps(other)}}}')

    def _us(self, t: float) -> float:
        return round((t - self.t0) * 1e6, 3)


def describe(error: BaseException) -> str:
    """``Type: message``, at most 300 characters; never raises (a user's ``__str__`` runs here)."""
    try:
        return f"{type(error).__name__}: {error}"[:300]
    except Exception:
        return type(error).__name__


def _named(name: Any) -> str | None:
    """A recorded name: a string, None, or a ufunc (named only now)."""
    return name.__name__ if type(name) is _ufunc else name


def _track_name(on_loop: bool) -> str:
    """This thread's track: a worker's name (``cpu-0``); the loop thread runs cheap awaited tasks inline."""
    if on_loop:
        return "event loop (inline runs)"
    return threading.current_thread().name.removeprefix("schedsvc-")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


class Recording:
    """The block of ``eng.trace(path)``, ``with`` or ``async with``: records a timeline, written at its end."""

    def __init__(self, port: Port, path: str | os.PathLike[str], max_spans: int) -> None:
        self._port = port
        self._args = (path, max_spans)

    def __enter__(self) -> Timeline:
        port = self._port
        port.running()
        timeline = self._timeline = Timeline(*self._args)
        port.attach(timeline)
        return timeline

    def __exit__(self, *exc_info: object) -> None:
        self._port.detach()
        self._timeline.write()

    async def __aenter__(self) -> Timeline:
        return self.__enter__()

    async def __aexit__(self, *exc_info: object) -> None:
        self.__exit__()
