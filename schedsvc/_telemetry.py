"""Stats snapshots of an engine, and the latency histograms its workers fill."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

__all__ = ["LATENCY_BOUNDS_S", "Latencies", "Stats", "percentile", "percentiles"]

#: upper bounds, in seconds, of the latency histograms' buckets: 10 µs to 10 s, then +Inf
LATENCY_BOUNDS_S = (
    *(m * 10.0**e for e in range(-5, 1) for m in (1.0, 2.5, 5.0)),
    10.0,
    math.inf,
)


class Latencies:
    """How long tasks waited from ready to started, and ran, since the engine started: a count per bucket
    of ``LATENCY_BOUNDS_S`` and the sum of each.

    A worker only appends a task's two figures (``waits``, ``runs``), under the runtime's lock; they are
    sorted into the buckets ``FOLD`` at a time, and when the histograms are read, so that a task costs
    two list appends rather than two searches of the bounds.
    """

    FOLD = 1024

    __slots__ = ("run_counts", "run_sum", "runs", "wait_counts", "wait_sum", "waits")

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.runs: list[float] = []
        self.wait_counts = [0] * len(LATENCY_BOUNDS_S)
        self.run_counts = [0] * len(LATENCY_BOUNDS_S)
        self.wait_sum = self.run_sum = 0.0

    def fold(self) -> None:
        """Sort the figures appended so far into the buckets (with the runtime's lock held)."""
        self.wait_sum += _fold(self.waits, self.wait_counts)
        self.run_sum += _fold(self.runs, self.run_counts)

    def histograms(self) -> tuple[Mapping[float, int], float, Mapping[float, int], float]:
        """(queue wait histogram, its sum, run time histogram, its sum): each histogram cumulative, as
        Prometheus has them, upper bound -> tasks at or under it (with the runtime's lock held)."""
        self.fold()
        return _cumulative(self.wait_counts), self.wait_sum, _cumulative(self.run_counts), self.run_sum


def _fold(values: list[float], counts: list[int]) -> float:
    """Add ``values`` to the bucket ``counts`` and empty it; their sum."""
    if not values:
        return 0.0
    import numpy as np

    array = np.array(values)
    values.clear()  # in place: the workers hold its bound append
    # side="left": a value equal to a bound is in that bound's bucket ("less than or equal")
    found = np.bincount(np.searchsorted(LATENCY_BOUNDS_S, array, side="left"), minlength=len(counts))
    for i, n in enumerate(found.tolist()):
        counts[i] += n
    return float(array.sum())


def _cumulative(counts: list[int]) -> Mapping[float, int]:
    total = 0
    out = {}
    for bound, count in zip(LATENCY_BOUNDS_S, counts, strict=True):
        total += count
        out[bound] = total
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class Stats:
    """An immutable snapshot of an engine's counters (``eng.stats()``)."""

    submitted: int
    """Tasks admitted so far (the copies of arguments the engine makes for them are not counted: they
    ride on their task's slot of ``max_pending``; their bytes count against the byte limits)."""
    completed: int
    failed: int
    """Tasks that raised, plus tasks that failed because an input failed."""
    cancelled: int
    pending: int
    """Admitted and not yet final (waiting, ready or running)."""
    running: int
    waiting_admission: int
    """``await submit`` calls waiting for room."""
    pending_bytes: int
    peak_pending_bytes: int
    max_pending: int
    max_pending_bytes: int
    queue_wait_p50_s: float
    """Median seconds from ready to started, over the last 8,192 tasks that started (recomputed once an
    eighth of those are new, so that reading stats() often stays cheap)."""
    queue_wait_p99_s: float
    worker_busy_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Seconds each worker spent running tasks.  A worker adds its time when it ends a run of
    tasks (it takes the next one without stopping), so the figure trails a just-resolved future by
    microseconds; surplus stand-in threads that ended share the entry ``retired``."""
    stream_launches: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Tasks launched on each CUDA stream (``cuda:0/s0``, ``cuda:0/h2d``...); their busy seconds, from
    launch (or the stream's previous completion) to completion as the host saw it, are in
    ``worker_busy_s``."""
    stream_sweeps: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Completion reports of each CUDA stream: each reports at once every task of the stream whose work had
    passed, so a burst of launches that nobody awaited in between takes one or a few."""
    compile_traces: int = 0
    """Traces of compiled functions (one per new signature, and after an eviction)."""
    compile_replays: int = 0
    """Calls of compiled functions (each one replay task)."""
    batches: int = 0
    """Replays of batched compiled functions' calls (``eng.compile(fn, batch_axis=...)``): each runs the calls
    a worker found ready together, or one call alone."""
    batch_rows: int = 0
    """Rows of their callers in those batches."""
    batch_sizes: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    """The batch-size histogram: rows -> batches of that many rows."""
    copies: int = 0
    """Copies of task arguments between host and device memory the engine made (one per buffer version
    and device, shared by the tasks that read it)."""
    queue_wait_histogram: Mapping[float, int] = field(default_factory=lambda: MappingProxyType({}))
    """Tasks run on the engine's workers since it started, by seconds from ready to started: upper bound
    -> tasks that waited at most that long (cumulative, ``inf`` last: Prometheus's buckets)."""
    queue_wait_sum_s: float = 0.0
    """The seconds those tasks waited, in all."""
    run_time_histogram: Mapping[float, int] = field(default_factory=lambda: MappingProxyType({}))
    """The same tasks by seconds from started to finished (a batch's or fused run's time for each of its
    tasks)."""
    run_time_sum_s: float = 0.0

    def __str__(self) -> str:
        """One figure a line, aligned, sizes and durations in units (``repr`` is the one-line form)."""
        names = [f.name for f in fields(self)]
        width = max(map(len, names))
        return "\n".join(["Stats:", *(f"  {n:<{width}}  {_shown(n, getattr(self, n))}" for n in names)])

    def __getitem__(self, name: object) -> Any:
        """Not a mapping (``Batched.stats()`` is one): the refusal names the attribute to read."""
        if isinstance(name, str) and name in self.__dataclass_fields__:
            raise TypeError(f"Stats is not a mapping: read stats.{name} (stats.as_dict() gives a dict)")
        raise TypeError("'Stats' object is not subscriptable")

    def as_dict(self) -> dict[str, Any]:
        """The figures as a plain dict (``worker_busy_s`` a dict too), ready for ``json.dumps``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["worker_busy_s"] = dict(self.worker_busy_s)
        out["stream_launches"] = dict(self.stream_launches)
        out["stream_sweeps"] = dict(self.stream_sweeps)
        out["batch_sizes"] = dict(self.batch_sizes)  # (JSON makes its keys strings: from_dict reads them)
        for name in ("queue_wait_histogram", "run_time_histogram"):  # bounds as JSON keys: "0.0025", "inf"
            out[name] = {str(bound): count for bound, count in getattr(self, name).items()}
        return out

    def to_json(self, **dumps_options: Any) -> str:
        """The figures as a JSON object; ``dumps_options`` go to ``json.dumps`` (e.g. ``indent=2``)."""
        return json.dumps(self.as_dict(), **dumps_options)

    @classmethod
    def from_dict(cls, figures: Mapping[str, Any]) -> Stats:
        """A Stats from ``as_dict()`` output, or from ``json.loads(stats.to_json())``."""
        values = dict(figures)
        values["worker_busy_s"] = MappingProxyType(dict(values.get("worker_busy_s", {})))
        values["stream_launches"] = MappingProxyType(dict(values.get("stream_launches", {})))
        values["stream_sweeps"] = MappingProxyType(dict(values.get("stream_sweeps", {})))
        values["batch_sizes"] = MappingProxyType(
            {int(k): v for k, v in values.get("batch_sizes", {}).items()}
        )
        for name in ("queue_wait_histogram", "run_time_histogram"):
            values[name] = MappingProxyType({float(k): v for k, v in values.get(name, {}).items()})
        return cls(**values)


def _shown(name: str, value: Any) -> str:
    """A figure for people: bytes with a binary unit, seconds in s/ms/µs, a mapping one pair after another."""
    if name.endswith("_histogram") and isinstance(value, Mapping):  # buckets with tasks in them
        below = dict(zip(value, [0, *value.values()], strict=False))
        shown = [
            f"<= {_seconds(b) if b < math.inf else 'inf'} {n - below[b]:,}"
            for b, n in value.items()
            if n > below[b]
        ]
        return ", ".join(shown) or "none"
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_shown(name, v)}" for k, v in value.items()) or "none"
    if name.endswith("_bytes") and isinstance(value, int) and value >= 1024:
        from pydantic import ByteSize  # (imported with Config already, unless the Stats came from a dict)

        return f"{value:,} ({ByteSize(value).human_readable(separator=' ')})"
    if name.endswith("_s") and isinstance(value, float):
        return _seconds(value)
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _seconds(s: float) -> str:
    if s == 0:
        return "0 s"
    if s >= 1:
        return f"{s:.3f} s"
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"


def percentile(samples: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples`` by nearest rank; 0.0 when empty."""
    return percentiles(samples, (q,))[0]


def percentiles(samples: Iterable[float], qs: Iterable[float]) -> tuple[float, ...]:
    """The ``qs`` quantiles (0..1) of ``samples`` by nearest rank, from one sort; 0.0 each when empty."""
    ordered = sorted(samples)
    if not ordered:
        return tuple(0.0 for _ in qs)
    last = len(ordered) - 1
    return tuple(ordered[min(last, max(0, round(q * last)))] for q in qs)
