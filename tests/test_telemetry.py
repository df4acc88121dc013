"""Stats export (dict, JSON) and the Prometheus exposition of the same figures."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

import schedsvc as ss
from schedsvc import _prometheus

from .helpers import occupied, within

STATS_FIELDS = [f.name for f in dataclasses.fields(ss.Stats)]


def boom() -> None:
    raise ZeroDivisionError("boom")


async def run_workload(eng: ss.Engine) -> None:
    """Five tasks that succeed, one that fails and one that fails because its input did."""
    for i in range(5):
        assert await within(eng.run(np.add, np.arange(4), i)) is not None
    bad = eng.submit_nowait(boom, name="boom")
    dependent = eng.submit_nowait(np.negative, bad)
    with pytest.raises(ZeroDivisionError):
        await within(bad)
    with pytest.raises(ss.DependencyError):
        await within(dependent)


async def final_stats() -> ss.Stats:
    """Stats of a closed engine that ran ``run_workload``: final, so a later read gives the same figures."""
    eng = ss.Engine(cpu_workers=2, max_pending=64)
    async with eng:
        await run_workload(eng)
    return eng.stats()


# -- dict and JSON ------------------------------------------------------------------------------------------


async def test_as_dict_has_every_field_as_plain_values() -> None:
    stats = await final_stats()
    figures = stats.as_dict()
    assert list(figures) == STATS_FIELDS
    assert type(figures["worker_busy_s"]) is dict
    assert figures["worker_busy_s"] == dict(stats.worker_busy_s)
    assert (figures["submitted"], figures["completed"], figures["failed"]) == (7, 5, 2)
    assert figures["max_pending"] == 64


async def test_json_round_trip() -> None:
    stats = await final_stats()
    text = stats.to_json()
    assert json.loads(text) == stats.as_dict()
    again = ss.Stats.from_dict(json.loads(text))
    assert again == stats
    assert isinstance(again.worker_busy_s, MappingProxyType)
    assert json.loads(stats.to_json(indent=2)) == stats.as_dict()


async def test_stats_read_as_a_mapping_names_the_attribute_to_read() -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        stats = eng.stats()
    with pytest.raises(
        TypeError, match=r"Stats is not a mapping: read stats\.completed \(stats\.as_dict\(\)"
    ):
        stats["completed"]  # type: ignore[index]
    with pytest.raises(TypeError, match="not subscriptable"):
        stats[0]  # type: ignore[index]


async def test_as_dict_is_a_copy() -> None:
    stats = await final_stats()
    figures = stats.as_dict()
    figures["worker_busy_s"]["cpu-0"] = -1.0
    figures["completed"] = -1
    assert stats.worker_busy_s.get("cpu-0") != -1.0
    assert stats.completed == 5


def test_from_dict_without_worker_times() -> None:
    mappings = (
        "worker_busy_s",
        "stream_launches",
        "stream_sweeps",
        "batch_sizes",
        "queue_wait_histogram",
        "run_time_histogram",
    )
    figures = {name: 0 for name in STATS_FIELDS if name not in mappings}
    stats = ss.Stats.from_dict(figures)
    assert dict(stats.worker_busy_s) == {}
    assert json.loads(stats.to_json()) == {**figures, **{name: {} for name in mappings}}


def test_str_is_one_figure_a_line_with_units() -> None:
    """print(eng.stats()) used to be one line of 400 characters of raw numbers."""
    figures = dict.fromkeys(STATS_FIELDS, 0) | {
        "submitted": 12345,
        "max_pending_bytes": 3 * 2**30,
        "queue_wait_p50_s": 2.5e-5,
        "queue_wait_p99_s": 0.0042,
        "worker_busy_s": {"cpu-0": 1.5, "cpu-1": 0.0},
        "stream_launches": {},
        "stream_sweeps": {},
        "batch_sizes": {},
        "queue_wait_histogram": {"1e-05": 0, "2.5e-05": 3, "0.0025": 3, "inf": 4},
        "run_time_histogram": {},
    }
    stats = ss.Stats.from_dict(figures)
    lines = str(stats).splitlines()
    assert lines[0] == "Stats:"
    assert [line.split()[0] for line in lines[1:]] == STATS_FIELDS  # every field, new ones too
    shown = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in lines[1:]}
    assert shown["submitted"] == "12,345"
    assert shown["max_pending_bytes"] == "3,221,225,472 (3.0 GiB)"
    assert (shown["queue_wait_p50_s"], shown["queue_wait_p99_s"]) == ("25.0 µs", "4.200 ms")
    assert shown["worker_busy_s"] == "cpu-0 1.500 s, cpu-1 0 s"
    assert shown["queue_wait_histogram"] == "<= 25.0 µs 3, <= inf 1"  # the buckets that hold tasks
    assert shown["run_time_histogram"] == "none"
    assert repr(stats).startswith("Stats(submitted=12345, ") and "\n" not in repr(stats)


def test_from_dict_rejects_unknown_figures() -> None:
    figures = {name: 0 for name in STATS_FIELDS} | {
        "worker_busy_s": {},
        "stream_launches": {},
        "stream_sweeps": {},
        "batch_sizes": {},
        "queue_wait_histogram": {},
        "run_time_histogram": {},
        "bogus": 1,
    }
    with pytest.raises(TypeError, match="bogus"):
        ss.Stats.from_dict(figures)


# -- Prometheus ---------------------------------------------------------------------------------------------


def exposition(collector: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Scrape ``collector`` through a private registry: (sample name, sorted labels) -> value."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    registry = prometheus_client.CollectorRegistry()
    registry.register(collector)
    text = prometheus_client.generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def expected_samples(stats: ss.Stats, engine: str | None = None) -> dict[Any, float]:
    """What the exposition must hold for ``stats``, written out by hand."""
    label = (("engine", engine),) if engine is not None else ()

    def key(name: str, *extra: tuple[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (name, tuple(sorted((*label, *extra))))

    samples = {
        key("schedsvc_tasks_submitted_total"): stats.submitted,
        key("schedsvc_tasks_completed_total"): stats.completed,
        key("schedsvc_tasks_failed_total"): stats.failed,
        key("schedsvc_tasks_cancelled_total"): stats.cancelled,
        key("schedsvc_tasks_pending"): stats.pending,
        key("schedsvc_tasks_running"): stats.running,
        key("schedsvc_submits_waiting"): stats.waiting_admission,
        key("schedsvc_pending_bytes"): stats.pending_bytes,
        key("schedsvc_peak_pending_bytes"): stats.peak_pending_bytes,
        key("schedsvc_max_pending_tasks"): stats.max_pending,
        key("schedsvc_max_pending_bytes"): stats.max_pending_bytes,
        key("schedsvc_compile_traces_total"): stats.compile_traces,
        key("schedsvc_compile_replays_total"): stats.compile_replays,
        key("schedsvc_batches_total"): stats.batches,
        key("schedsvc_batch_rows_total"): stats.batch_rows,
        key("schedsvc_copies_total"): stats.copies,
    }
    for name, histogram, total in (
        ("schedsvc_queue_wait_seconds", stats.queue_wait_histogram, stats.queue_wait_sum_s),
        ("schedsvc_task_run_seconds", stats.run_time_histogram, stats.run_time_sum_s),
    ):
        for bound, count in histogram.items():
            samples[key(f"{name}_bucket", ("le", "+Inf" if bound == math.inf else str(bound)))] = count
        samples[key(f"{name}_count")] = histogram[math.inf]
        samples[key(f"{name}_sum")] = total
    for worker, seconds in stats.worker_busy_s.items():
        samples[key("schedsvc_worker_busy_seconds_total", ("worker", worker))] = seconds
    for rows, batches in stats.batch_sizes.items():
        samples[key("schedsvc_batches_by_rows_total", ("rows", str(rows)))] = batches
    return samples


async def test_exposition_matches_stats() -> None:
    pytest.importorskip("prometheus_client")
    eng = ss.Engine(cpu_workers=2, max_pending=64)
    async with eng:
        await run_workload(eng)
    stats = eng.stats()  # closed: final figures, equal to what a scrape reads now
    samples = exposition(ss.PrometheusCollector(eng))
    assert samples == pytest.approx(expected_samples(stats))
    assert samples[("schedsvc_tasks_failed_total", ())] == 2
    assert samples[("schedsvc_tasks_completed_total", ())] == 5
    assert {name for name, labels in samples if labels and labels[0][0] == "worker"} == {
        "schedsvc_worker_busy_seconds_total"
    }
    assert sum(stats.worker_busy_s.values()) > 0


def test_every_stats_field_is_exported() -> None:
    """A field added to Stats must be added to the exposition too."""
    exported = (
        set(_prometheus.METRICS)
        | set(_prometheus.HISTOGRAMS)
        | {sum_field for _, _, sum_field in _prometheus.HISTOGRAMS.values()}
        | set(_prometheus.FROM_HISTOGRAMS)
        | {
            "worker_busy_s",
            "stream_launches",
            "stream_sweeps",
            "batch_sizes",
        }
    )
    assert exported == set(STATS_FIELDS)


async def test_latencies_are_histograms_of_every_task_run() -> None:
    """Cumulative buckets of every task that ran (the failed one too; its dependent never ran), not p50/p99
    gauges over a window: Prometheus computes any quantile from them (histogram_quantile)."""
    pytest.importorskip("prometheus_client")

    def busy(seconds: float) -> float:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:  # runs at least this long: a task of known length, not a wait
            pass
        return seconds

    eng = ss.Engine(cpu_workers=2, max_pending=64, latency_histograms=True)
    async with eng:
        await run_workload(eng)
        await within(eng.run(busy, 0.03))
    stats = eng.stats()
    samples = exposition(ss.PrometheusCollector(eng))
    for name, histogram in (
        ("queue_wait_seconds", stats.queue_wait_histogram),
        ("task_run_seconds", stats.run_time_histogram),
    ):
        counts = list(histogram.values())
        assert counts == sorted(counts)  # cumulative
        assert list(histogram) == sorted(histogram) and histogram[math.inf] == counts[-1]
        assert samples[(f"schedsvc_{name}_count", ())] == 5 + 1 + 1  # run_workload's that ran, and busy
    runs = stats.run_time_histogram
    assert runs[0.025] == 6 and runs[math.inf] == 7  # busy ran 30 ms, longer than any other
    assert stats.run_time_sum_s >= 0.03


async def test_latencies_are_recorded_only_when_asked_for() -> None:
    """Off by default (two appends a task are a few percent of the hot path): the histograms stay empty."""
    async with ss.Engine(cpu_workers=2) as eng:
        await run_workload(eng)
        stats = eng.stats()
    assert stats.completed >= 5
    assert stats.queue_wait_histogram[math.inf] == stats.run_time_histogram[math.inf] == 0
    assert stats.queue_wait_sum_s == stats.run_time_sum_s == 0.0


async def test_each_scrape_reads_the_stats_then() -> None:
    pytest.importorskip("prometheus_client")
    async with ss.Engine(cpu_workers=2) as eng:
        collector = ss.PrometheusCollector(eng)
        async with occupied(eng, 2):
            during = exposition(collector)
        await within(eng.waitall())
        await within(eng.run(abs, -1))
        after = exposition(collector)
    assert during[("schedsvc_tasks_running", ())] == 2
    assert during[("schedsvc_tasks_pending", ())] == 2
    assert during[("schedsvc_tasks_submitted_total", ())] == 2
    assert after[("schedsvc_tasks_running", ())] == 0
    assert after[("schedsvc_tasks_submitted_total", ())] == 3
    assert after[("schedsvc_tasks_completed_total", ())] == 3


async def test_several_engines_share_one_collector_with_an_engine_label() -> None:
    pytest.importorskip("prometheus_client")
    ingest, train = ss.Engine(cpu_workers=1, max_pending=8), ss.Engine(cpu_workers=2, max_pending=16)
    async with ingest, train:
        await run_workload(train)
        await within(ingest.run(abs, -1))
    samples = exposition(ss.PrometheusCollector({"ingest": ingest, "train": train}))
    expected = expected_samples(ingest.stats(), "ingest") | expected_samples(train.stats(), "train")
    assert samples == pytest.approx(expected)
    assert samples[("schedsvc_max_pending_tasks", (("engine", "ingest"),))] == 8
    assert samples[("schedsvc_tasks_failed_total", (("engine", "train"),))] == 2


def test_two_collectors_in_one_registry_clash() -> None:
    """Two families of one name would be an invalid exposition; the registry refuses the second."""
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    registry.register(ss.PrometheusCollector(ss.Engine(cpu_workers=1)))
    with pytest.raises(ValueError, match="Duplicated"):
        registry.register(ss.PrometheusCollector(ss.Engine(cpu_workers=1)))


def test_an_engine_not_started_has_families_and_no_samples() -> None:
    pytest.importorskip("prometheus_client")
    collector = ss.PrometheusCollector(ss.Engine(cpu_workers=1))
    assert exposition(collector) == {}
    names = {family.name for family in collector.collect()}
    assert "schedsvc_tasks_submitted" in names  # counter families are named without _total
    assert names == {family.name for family in collector.describe()}


def test_without_prometheus_client_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install 'schedsvc\[prometheus\]'"):
        ss.PrometheusCollector(ss.Engine(cpu_workers=1))


def test_repr_names_the_engines() -> None:
    pytest.importorskip("prometheus_client")
    eng = ss.Engine(cpu_workers=1)
    assert "a,b" in repr(ss.PrometheusCollector({"a": eng, "b": eng}))
    assert repr(eng) in repr(ss.PrometheusCollector(eng))
