"""Prometheus exposition of ``eng.stats()``: a collector that reads the figures at scrape time.

No background thread and no cost per task beyond what the engine counts
anyway: each scrape takes one ``stats()`` snapshot per engine.  How long tasks
waited from ready to started, and ran, are histograms (buckets cumulative
since the engine started, as ``histogram_quantile`` wants them), recorded when
the engine's ``Config.latency_histograms`` is on (they are empty otherwise).
prometheus-client is imported only when a collector is made, so ``import
schedsvc`` works without the ``prometheus`` extra.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

from ._errors import EngineClosed

if TYPE_CHECKING:
    from ._engine import Engine
    from ._telemetry import Stats

__all__ = ["METRICS", "PrometheusCollector"]

_INSTALL = "pip install 'schedsvc[prometheus]'"
PREFIX = "schedsvc_"

Kind = Literal["counter", "gauge"]

#: Stats field -> (metric name after the prefix, kind, help).  Counters get ``_total`` in the exposition.
METRICS: dict[str, tuple[str, Kind, str]] = {
    "submitted": ("tasks_submitted", "counter", "Tasks admitted."),
    "completed": ("tasks_completed", "counter", "Tasks that finished with a value."),
    "failed": (
        "tasks_failed",
        "counter",
        "Tasks that raised, plus tasks that failed because an input failed.",
    ),
    "cancelled": ("tasks_cancelled", "counter", "Tasks cancelled before they ran."),
    "pending": ("tasks_pending", "gauge", "Tasks admitted and not yet final (waiting, ready or running)."),
    "running": ("tasks_running", "gauge", "Tasks running now."),
    "waiting_admission": ("submits_waiting", "gauge", "await submit calls waiting for room."),
    "pending_bytes": ("pending_bytes", "gauge", "Bytes that unfinished tasks hold."),
    "peak_pending_bytes": ("peak_pending_bytes", "gauge", "The most bytes unfinished tasks held at once."),
    "max_pending": ("max_pending_tasks", "gauge", "The max_pending limit (tasks)."),
    "max_pending_bytes": ("max_pending_bytes", "gauge", "The max_pending_bytes limit."),
    "compile_traces": ("compile_traces", "counter", "Traces of compiled functions."),
    "compile_replays": ("compile_replays", "counter", "Calls of compiled functions (replays)."),
    "batches": ("batches", "counter", "Batches of batched compiled functions sent, each one task."),
    "batch_rows": ("batch_rows", "counter", "Callers' rows in those batches."),
    "copies": ("copies", "counter", "Copies of task arguments between host and device memory made."),
}
#: Stats histograms -> (metric name after the prefix, help, the Stats field of their sum).
HISTOGRAMS = {
    "queue_wait_histogram": (
        "queue_wait_seconds",
        "Seconds tasks waited from ready (inputs done, admitted) to started on a worker.",
        "queue_wait_sum_s",
    ),
    "run_time_histogram": ("task_run_seconds", "Seconds tasks ran on a worker.", "run_time_sum_s"),
}
#: Stats fields not exported: Prometheus computes them, and any other quantile, from the histograms
#: (``histogram_quantile(0.99, rate(schedsvc_queue_wait_seconds_bucket[5m]))``)
FROM_HISTOGRAMS = ("queue_wait_p50_s", "queue_wait_p99_s")
#: Stats fields exported with a label: busy seconds by worker, launches and sweeps by stream, batches by rows.
WORKER_BUSY = ("worker_busy_seconds", "Seconds each worker spent running tasks.")
STREAM_LAUNCHES = ("stream_launches", "Tasks launched on each CUDA stream.")
STREAM_SWEEPS = (
    "stream_sweeps",
    "Completion reports of each CUDA stream (each covers every task that passed).",
)
BATCH_SIZES = ("batches_by_rows", "Batches sent, by how many rows they held.")


class PrometheusCollector:
    """A prometheus-client collector of ``eng.stats()``, read at each scrape.

    ``PrometheusCollector(eng)`` exports one engine without an engine label;
    ``PrometheusCollector({"ingest": eng1, "train": eng2})`` exports several,
    each sample labelled ``engine="<name>"``.  Register it once per registry::

        prometheus_client.REGISTRY.register(ss.PrometheusCollector(eng))
        prometheus_client.start_http_server(9100)
    """

    def __init__(self, engines: Engine | Mapping[str, Engine]) -> None:
        _require_prometheus_client()
        self._labelled = isinstance(engines, Mapping)
        self._engines: dict[str, Engine] = dict(engines) if isinstance(engines, Mapping) else {"": engines}

    def describe(self) -> Iterator[Any]:
        """The metric families, without samples (what registering checks for clashes)."""
        return iter(_families(self._labelled).values())

    def collect(self) -> Iterator[Any]:
        """One ``stats()`` per engine, as metric families; an engine not started yet has no samples."""
        families = _families(self._labelled)
        for name, engine in self._engines.items():
            stats = _snapshot(engine)
            if stats is not None:
                _add(families, stats, [name] if self._labelled else [])
        return iter(families.values())

    def __repr__(self) -> str:
        names = ",".join(self._engines) if self._labelled else repr(self._engines[""])
        return f"<PrometheusCollector {names}>"


def _require_prometheus_client() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"ss.PrometheusCollector needs prometheus-client: {_INSTALL}") from exc


def _snapshot(engine: Engine) -> Stats | None:
    try:
        return engine.stats()
    except EngineClosed:  # not started: nothing to report yet (a closed engine keeps its final figures)
        return None


def _families(labelled: bool) -> dict[str, Any]:
    """Empty metric families, keyed by Stats field (the labelled ones by their family name)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    engine = ["engine"] if labelled else []
    kinds = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily}
    families: dict[str, Any] = {
        field: kinds[kind](PREFIX + name, doc, labels=engine) for field, (name, kind, doc) in METRICS.items()
    }
    for field, (name, doc, _) in HISTOGRAMS.items():
        families[field] = HistogramMetricFamily(PREFIX + name, doc, labels=engine)
    families[WORKER_BUSY[0]] = CounterMetricFamily(
        PREFIX + WORKER_BUSY[0], WORKER_BUSY[1], labels=[*engine, "worker"]
    )
    families[STREAM_LAUNCHES[0]] = CounterMetricFamily(
        PREFIX + STREAM_LAUNCHES[0], STREAM_LAUNCHES[1], labels=[*engine, "stream"]
    )
    families[STREAM_SWEEPS[0]] = CounterMetricFamily(
        PREFIX + STREAM_SWEEPS[0], STREAM_SWEEPS[1], labels=[*engine, "stream"]
    )
    families[BATCH_SIZES[0]] = CounterMetricFamily(
        PREFIX + BATCH_SIZES[0], BATCH_SIZES[1], labels=[*engine, "rows"]
    )
    return families


def _add(families: dict[str, Any], stats: Stats, engine: list[str]) -> None:
    for field in METRICS:
        families[field].add_metric(engine, getattr(stats, field))
    for field, (_, _, sum_field) in HISTOGRAMS.items():
        buckets = [(_bound(le), count) for le, count in getattr(stats, field).items()]
        families[field].add_metric(engine, buckets, getattr(stats, sum_field))
    for worker, seconds in stats.worker_busy_s.items():
        families[WORKER_BUSY[0]].add_metric([*engine, worker], seconds)
    for stream, launches in stats.stream_launches.items():
        families[STREAM_LAUNCHES[0]].add_metric([*engine, stream], launches)
    for stream, sweeps in stats.stream_sweeps.items():
        families[STREAM_SWEEPS[0]].add_metric([*engine, stream], sweeps)
    for rows, batches in stats.batch_sizes.items():
        families[BATCH_SIZES[0]].add_metric([*engine, str(rows)], batches)


def _bound(le: float) -> str:
    """A bucket's ``le`` label as Prometheus writes it: ``0.0025``, ``1.0``, ``+Inf``."""
    return "+Inf" if le == math.inf else repr(le)
