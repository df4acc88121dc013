"""Stats snapshots of an engine."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

__all__ = ["Stats", "percentile", "percentiles"]


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

    def __str__(self) -> str:
        """One figure a line, aligned, sizes and durations in units (``repr`` is the one-line form)."""
        names = [f.name for f in fields(self)]
        width = max(map(len, names))
        return "\n".join(["Stats:", *(f"  {n:<{width}}  {_shown(n, getattr(self, n))}" for n in names)])

    def as_dict(self) -> dict[str, Any]:
        """The figures as a plain dict (``worker_busy_s`` a dict too), ready for ``json.dumps``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["worker_busy_s"] = dict(self.worker_busy_s)
        out["stream_launches"] = dict(self.stream_launches)
        out["batch_sizes"] = dict(self.batch_sizes)  # (JSON makes its keys strings: from_dict reads them)
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
        values["batch_sizes"] = MappingProxyType(
            {int(k): v for k, v in values.get("batch_sizes", {}).items()}
        )
        return cls(**values)


def _shown(name: str, value: Any) -> str:
    """A figure for people: bytes with a binary unit, seconds in s/ms/µs, a mapping one pair after another."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_shown(name, v)}" for k, v in value.items()) or "none"
    if name.endswith("_bytes") and isinstance(value, int) and value >= 1024:
        return f"{value:,} ({_binary(value)})"
    if name.endswith("_s") and isinstance(value, float):
        return _seconds(value)
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _binary(n: int) -> str:
    """``6319125504`` -> ``'5.9 GiB'``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    power = min(len(units) - 1, (n.bit_length() - 1) // 10)
    return f"{n / 1024**power:.1f} {units[power]}"


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
