"""Stats snapshots of an engine."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["Stats", "percentile"]


@dataclass(frozen=True, slots=True)
class Stats:
    """An immutable snapshot of an engine's counters (``eng.stats()``)."""

    submitted: int
    """Tasks admitted so far."""
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
    """Median seconds from ready to started, over recent tasks."""
    queue_wait_p99_s: float
    worker_busy_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Seconds each worker spent running tasks."""
    compile_traces: int = 0
    """Traces of compiled functions (one per new signature, and after an eviction)."""
    compile_replays: int = 0
    """Calls of compiled functions (each one replay task)."""


def percentile(samples: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples`` by nearest rank; 0.0 when empty."""
    ordered = sorted(samples)
    if not ordered:
        return 0.0
    rank = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[rank]
