"""Timeline traces (``eng.trace`` and ``Config(trace_path=...)``): the Chrome trace JSON is well formed,
records what ran and where, and its flow arrows follow dependency edges that never overlap in time."""

from __future__ import annotations

import asyncio
import json
import operator
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import schedsvc as ss

from .helpers import Gate, occupied, state, within


def load(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    # traceEvents first: Perfetto's JSON reader stops at the first top-level key it does not know
    assert list(doc) == ["traceEvents", "displayTimeUnit", "otherData"]
    assert doc["displayTimeUnit"] == "ms"
    events: list[dict[str, Any]] = doc["traceEvents"]
    return events


def spans(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "X"]


def bound_span(events: list[dict[str, Any]], flow: dict[str, Any]) -> dict[str, Any]:
    """The span a flow end binds to.  Chrome's DevTools binds only a span with the same pid, tid, cat and
    exactly the same ts; Perfetto and chrome://tracing bind the span enclosing ts, which that one is."""
    (span,) = [
        s
        for s in spans(events)
        if (s["pid"], s["tid"], s["cat"], s["ts"]) == (flow["pid"], flow["tid"], flow["cat"], flow["ts"])
    ]
    return span


def arrows(events: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """The flow arrows as (parent task, child task), each end bound to its span."""
    return {
        (bound_span(events, s)["args"]["task"], bound_span(events, f)["args"]["task"])
        for s in events
        if s["ph"] == "s"
        for f in events
        if f["ph"] == "f" and f["id"] == s["id"]
    }


def check_well_formed(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Every span closed, every flow matched and bound to spans, every track named; spans by task number."""
    named = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    # Perfetto labels the thread whose tid equals its pid "main thread": no worker may look like one
    assert not {e["tid"] for e in events if e["tid"] == e["pid"]}, "a track's tid equals the pid"
    by_task: dict[int, dict[str, Any]] = {}
    for span in spans(events):
        assert span["dur"] > 0 and span["ts"] >= 0, span  # a complete event: opened and closed
        assert span["tid"] in named, f"span on an unnamed track: {span}"
        assert span["args"]["task"] not in by_task, "a task recorded twice"
        by_task[span["args"]["task"]] = span
    # a flow end binds to the span open on its track when the reader reaches it; at equal times
    # Perfetto takes complete events first (older versions: file order), so spans come first here
    phases = [e["ph"] for e in events]
    if "s" in phases:
        assert max(i for i, ph in enumerate(phases) if ph == "X") < phases.index("s")
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == finishes.keys(), "every flow arrow has both ends"
    ids = [e["id"] for e in events if e["ph"] == "s"]
    assert len(ids) == len(set(ids)), "a flow id used twice"
    for i, start in starts.items():
        finish = finishes[i]
        assert finish["bp"] == "e"
        parent, child = bound_span(events, start), bound_span(events, finish)
        # a dependent starts only after its parent ended: their spans never overlap
        assert parent["ts"] + parent["dur"] <= child["ts"], (parent, child)
    return by_task


async def test_a_traced_run_is_well_formed_and_dependents_never_overlap(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    async with ss.Engine(cpu_workers=2) as eng:
        with eng.trace(path) as timeline:
            # both workers held until all is submitted: no parent finishes before its child's edge is made
            async with occupied(eng, 2) as (_, held):
                a = await eng.submit(np.ones, (64, 64))
                b = await eng.submit(np.dot, a, a)  # data edge a -> b (passed twice: one arrow)
                c = await eng.submit(operator.add, b, 1.0)
                d = await eng.submit(operator.mul, a, 2.0)  # fan-out from a
                buf = np.zeros(8)
                w1 = await eng.submit(np.add, buf, 1.0, out=buf)  # write
                r1 = await eng.submit(np.sum, buf)  # read after write: a buffer hazard, not data
                w2 = await eng.submit(np.multiply, buf, 2.0, out=buf)  # write after read
            await within(eng.waitall())
        assert timeline.path == str(path)
    events = load(path)
    by_task = check_well_formed(events)
    tasks = [a, b, c, d, w1, r1, w2]
    assert sorted(by_task) == sorted(t.seq for t in tasks + held)
    assert by_task[a.seq]["name"] == "ones" and by_task[b.seq]["name"] == "dot"
    assert by_task[b.seq]["args"]["shapes"] == [[64, 64], [64, 64]]  # the shapes of its inputs' values
    flows = {
        (s["ts"], f["ts"])
        for s in events
        if s["ph"] == "s"
        for f in events
        if f["ph"] == "f" and f["id"] == s["id"]
    }
    assert len(flows) == sum(e["ph"] == "s" for e in events)
    # every edge the scheduler made: a->b, b->c, a->d, w1->r1 (hazard), r1->w2 and w1->w2 (hazards)
    edges = arrows(events)
    assert {(a.seq, b.seq), (b.seq, c.seq), (w1.seq, r1.seq), (r1.seq, w2.seq)} <= edges
    # the counter tracks go up with submissions and end at zero
    pending = [e["args"]["tasks"] for e in events if e["ph"] == "C" and e["name"] == "pending tasks"]
    assert max(pending) >= 2 and pending[-1] == 0
    assert [e for e in events if e["ph"] == "C" and e["name"] == "pending bytes"]


async def test_a_parent_finished_before_its_child_was_submitted_still_has_its_arrow(tmp_path: Path) -> None:
    """The scheduler needs no edge for a value already there, but the value still flows: the trace shows it."""
    path = tmp_path / "run.json"
    async with ss.Engine(cpu_workers=2) as eng:
        before = await eng.submit(np.ones, 4)
        await within(before)
        with eng.trace(path):
            a = await eng.submit(np.ones, 4)
            await within(a)
            b = await eng.submit(np.add, a, 1.0)  # a is done: no scheduling edge
            await within(b)
            c = await eng.submit(np.add, before, b)  # before ran outside the trace: no span, no arrow
            await within(c)
    events = load(path)
    by_task = check_well_formed(events)
    assert arrows(events) == {(a.seq, b.seq), (b.seq, c.seq)}
    assert before.seq not in by_task


async def test_the_trace_block_is_async_with_as_well(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    async with ss.Engine(cpu_workers=1) as eng:
        async with eng.trace(path) as timeline:
            a = await eng.submit(np.ones, 4)
            await within(a)
        assert timeline.path == str(path)
    assert [s["args"]["task"] for s in spans(load(path))] == [a.seq]


async def test_tracks_are_the_threads_that_ran_tasks(tmp_path: Path) -> None:
    """Two tasks held at once run on two workers: two tracks, named after the workers."""
    path = tmp_path / "run.json"
    gate = Gate()
    async with ss.Engine(cpu_workers=2) as eng:
        with eng.trace(path):
            held = [await eng.submit(gate.hold()) for _ in range(2)]
            await gate.wait_started(2)
            gate.opened.set()
            await within(eng.waitall())
    events = load(path)
    check_well_formed(events)
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(tracks.values()) == ["cpu-0", "cpu-1"]
    assert len({s["tid"] for s in spans(events)}) == 2
    assert sorted(s["args"]["task"] for s in spans(events)) == sorted(t.seq for t in held)


async def test_failures_and_cancelled_tasks(tmp_path: Path) -> None:
    """A failed task's span says why; a task that never ran has no span and no dangling arrow."""
    path = tmp_path / "run.json"

    def boom() -> None:
        raise ValueError("bad input")

    async with ss.Engine(cpu_workers=1) as eng:
        with eng.trace(path):
            bad = await eng.submit(boom)
            after = await eng.submit(operator.neg, bad)  # fails from its input: never runs
            await within(eng.waitall())
    assert after.exception() is not None
    events = load(path)
    by_task = check_well_formed(events)
    assert by_task[bad.seq]["args"]["error"] == "ValueError: bad input"
    assert after.seq not in by_task
    assert not [e for e in events if e["ph"] in ("s", "f")]


async def test_only_the_block_is_recorded_and_one_trace_at_a_time(tmp_path: Path) -> None:
    async with ss.Engine(cpu_workers=2) as eng:
        before = await eng.submit(operator.add, 1, 1)
        await within(before)
        with eng.trace(tmp_path / "a.json"):
            inside = await eng.submit(operator.add, 2, 2)
            with (
                pytest.raises(ss.SchedsvcError, match="already being recorded"),
                eng.trace(tmp_path / "b.json"),
            ):
                pass
            await within(inside)
        after = await eng.submit(operator.add, 3, 3)
        await within(after)
        assert eng._rt is not None and eng._rt.timeline is None and eng._rt.core.edges is None  # off again
        with eng.trace(tmp_path / "c.json"):  # a new trace may start once the first ended
            await within(eng.run(operator.add, 4, 4))
    recorded = {s["args"]["task"] for s in spans(load(tmp_path / "a.json"))}
    assert recorded == {inside.seq}
    assert not (tmp_path / "b.json").exists()
    assert len(spans(load(tmp_path / "c.json"))) == 1


async def test_config_trace_path_records_the_whole_life(tmp_path: Path) -> None:
    path = tmp_path / "life.json"
    async with ss.Engine(cpu_workers=2, trace_path=str(path)) as eng:
        x = eng.asarray(np.arange(6.0))
        y = (x + 1) * 2  # Tensor ops: one task each, ordered by data edges
        mlp = eng.compile(lambda t: np.maximum(t @ np.ones((6, 3)), 0))
        z = mlp(y)
        futs = [await eng.submit(operator.mul, i, i) for i in range(20)]
        await within(z)
        with pytest.raises(ss.SchedsvcError, match="already being recorded"), eng.trace(tmp_path / "x.json"):
            pass
    events = load(path)
    by_task = check_well_formed(events)
    names = Counter(s["name"] for s in spans(events))
    assert names["add"] == 1 and names["multiply"] == 1 and names["mul"] == 20
    assert any(n.startswith("compiled:") for n in names)
    assert by_task[y.seq]["args"]["shapes"] == [[6]]
    assert all(f.seq in by_task for f in futs)


async def test_a_cancelled_close_still_writes_the_whole_life_trace(tmp_path: Path) -> None:
    """The first aclose() cancelled while a task runs: the trace is written then, with what had finished."""
    path = tmp_path / "life.json"
    gate = Gate()
    eng = ss.Engine(cpu_workers=1, trace_path=str(path))
    await eng.start()
    try:
        done = [await eng.submit(operator.mul, i, i) for i in range(3)]
        await within(eng.waitall())
        held = await eng.submit(gate.hold())
        await gate.wait_started(1)
        closing = asyncio.create_task(eng.aclose())
        await state(eng, lambda: eng.closed)
        await asyncio.sleep(0)  # the close is waiting for the held task
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(closing)
        by_task = check_well_formed(load(path))
        assert sorted(by_task) == [f.seq for f in done]
        assert held.seq not in by_task  # still running when the close was cancelled
    finally:
        gate.open()
        await within(eng.aclose())  # waits for the threads; the trace stays as written
    assert sorted(check_well_formed(load(path))) == sorted(by_task)


async def test_no_recording_without_a_trace(engine: ss.Engine) -> None:
    await within(engine.run(operator.add, 1, 1))
    assert engine._rt is not None and engine._rt.timeline is None and engine._rt.core.edges is None


async def test_a_task_run_inline_has_the_event_loop_track(tmp_path: Path) -> None:
    """A cheap awaited task that the awaiting coroutine runs itself is drawn on the loop's own track."""
    path = tmp_path / "run.json"
    async with ss.Engine(cpu_workers=1, inline_threshold_us=1e6) as eng:
        await within(eng.run(operator.add, 1, 1))  # learns that add is cheap
        with eng.trace(path):
            async with occupied(eng, 1):  # the only worker is held: the loop runs the next add itself
                fut = eng.submit_nowait(operator.add, 2, 3)
                assert await within(fut) == 5
            await within(eng.waitall())
    events = load(path)
    by_task = check_well_formed(events)
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tracks[by_task[fut.seq]["tid"]] == "event loop (inline runs)"
    assert sorted(tracks.values()) == ["cpu-0", "event loop (inline runs)"]


async def test_spans_past_max_spans_are_counted_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    async with ss.Engine(cpu_workers=2) as eng:
        with eng.trace(path, max_spans=3):
            for i in range(5):
                eng.submit_nowait(operator.add, i, 1)
            await within(eng.waitall())
    doc = json.loads(path.read_text())
    check_well_formed(doc["traceEvents"])
    assert len(spans(doc["traceEvents"])) == 3
    assert doc["otherData"]["spans"] == 3 and doc["otherData"]["spans_dropped"] == 2


@pytest.mark.parametrize("chunk", [1, 2, 7, 10_000])
async def test_the_file_holds_every_event_whatever_the_write_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """The writer joins json.dumps chunks by hand: each chunking gives the same document."""
    from schedsvc import _timeline

    monkeypatch.setattr(_timeline, "_CHUNK", chunk)
    path = tmp_path / "run.json"
    async with ss.Engine(cpu_workers=2) as eng:
        with eng.trace(path) as timeline:
            x = eng.submit_nowait(np.ones, (3, 4))
            await within(eng.submit(np.add, x, 1.0))  # a ufunc: named when written
            await within(eng.waitall())
    doc = json.loads(path.read_text())
    assert doc["traceEvents"] == json.loads(json.dumps(timeline.events()))
    assert doc["otherData"] == {"producer": "schedsvc", "spans": 2, "spans_dropped": 0}
    assert [(s[1], s[5]) for s in timeline.spans] == [("ones", None), ("add", ((3, 4),))]
    assert [e["name"] for e in spans(doc["traceEvents"])] == ["ones", "add"]


async def test_a_path_that_cannot_be_written_fails_before_recording(tmp_path: Path) -> None:
    missing = tmp_path / "no such dir" / "run.json"
    async with ss.Engine(cpu_workers=1) as eng:
        with pytest.raises(FileNotFoundError, match="no such dir"), eng.trace(missing):
            pytest.fail("the block must not run")
        assert await within(eng.run(operator.add, 1, 2)) == 3  # and the engine keeps serving
        with eng.trace(tmp_path / "run.json"):  # no trace was left attached
            pass
    engine = ss.Engine(cpu_workers=1, trace_path=str(missing))
    with pytest.raises(FileNotFoundError, match="no such dir"):
        await within(engine.start())
    with pytest.raises(ss.EngineClosed):  # nothing started, nothing to close
        engine.submit_nowait(operator.add, 1, 2)


@pytest.mark.parametrize(
    ("max_spans", "error", "match"),
    [
        (0, ValueError, ">= 1"),
        (-5, ValueError, ">= 1"),
        (1.5, TypeError, "an int"),
        (True, TypeError, "an int"),
    ],
)
async def test_max_spans_below_one_or_not_an_int_is_refused(
    tmp_path: Path, max_spans: Any, error: type[Exception], match: str
) -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        with pytest.raises(error, match=match), eng.trace(tmp_path / "run.json", max_spans=max_spans):
            pytest.fail("the block must not run")
    assert not (tmp_path / "run.json").exists()


async def test_an_empty_path_or_a_directory_fails_before_recording(tmp_path: Path) -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        with pytest.raises(ValueError, match="empty"), eng.trace(""):
            pytest.fail("the block must not run")
        with pytest.raises(ValueError, match="NUL character"), eng.trace(str(tmp_path / "run\0.json")):
            pytest.fail("the block must not run")
        with pytest.raises(IsADirectoryError, match="directory"), eng.trace(tmp_path):
            pytest.fail("the block must not run")
        with eng.trace(tmp_path / "run.json"):  # no trace was left attached
            pass


async def test_recording_stops_soon_after_the_cap_and_keeps_the_earliest(tmp_path: Path) -> None:
    """Threads look at the cap every 1,024 spans: past it they only count, and the file keeps the first."""
    path = tmp_path / "run.json"
    async with ss.Engine(cpu_workers=1, max_pending=4000) as eng:
        with eng.trace(path, max_spans=1500) as timeline:
            futures = [eng.submit_nowait(operator.add, i, 1) for i in range(3000)]
            await within(eng.waitall())
        held = sum(len(spans) for _, spans in timeline._tracks) // 6
    assert held == 2048  # stopped at the first check past the cap: memory stays bounded
    # counter samples stop there too: 3,000 submissions and 2,048 finishes sampled, not 6,000 events (and a
    # few other scheduling events, as many as the timing makes: flushes, a parked worker looking for work)
    assert 3000 + 2048 <= len(timeline._samples) // 3 < 3000 + 2048 + 500
    assert (timeline.recorded, timeline.dropped) == (1500, 1500)
    doc = json.loads(path.read_text())
    assert doc["otherData"] == {"producer": "schedsvc", "spans": 1500, "spans_dropped": 1500}
    kept = sorted(s["args"]["task"] for s in spans(doc["traceEvents"]))
    assert kept == sorted(f.seq for f in futures)[:1500]  # one worker runs them in order: the first 1,500


async def test_past_the_cap_the_scheduler_stops_listing_edges(tmp_path: Path) -> None:
    async with ss.Engine(cpu_workers=1, inline_threshold_us=0) as eng:  # every span on cpu-0
        with eng.trace(tmp_path / "run.json", max_spans=1000) as timeline:
            # each parent is held until its child is submitted: the edge is made, whatever the timing
            gate = Gate()
            first = eng.submit_nowait(gate.hold(lambda: 2))
            child = eng.submit_nowait(operator.add, first, 1)
            gate.open()
            assert await within(child) == 3
            assert len(timeline.edges) == 1  # an edge, listed
            for i in range(1100):  # each awaited: past 1,024 spans the cap (1,000) is found reached
                await within(eng.run(operator.add, i, 1))
            assert eng._rt is not None and eng._rt.core.edges is None
            gate = Gate()
            link = eng.submit_nowait(gate.hold(lambda: 2))
            child = eng.submit_nowait(operator.add, link, 1)  # an edge the trace no longer lists
            gate.open()
            assert await within(child) == 3
        assert len(timeline.edges) == 1


def test_shared_shape_lists_stay_bounded(tmp_path: Path) -> None:
    """Spans share one tuple per distinct shape list, and that table is emptied when it grows large."""
    from schedsvc._core import Task
    from schedsvc._timeline import _MAX_INTERNED, Timeline

    timeline = Timeline(tmp_path / "run.json")
    a, b = np.empty((2, 3)), np.empty((2, 3))
    for seq, arg in enumerate([a, b]):
        task = Task(np.negative, (arg,))
        task.seq = seq
        timeline.span(task, 1.0, 2.0, None)
    first, second = (span[5] for span in timeline.spans)
    assert first == ((2, 3),) and first is second  # one tuple for both spans
    for seq in range(2, 3 * _MAX_INTERNED):  # all distinct
        task = Task(np.negative, (np.empty((seq, 1)),))
        task.seq = seq
        timeline.span(task, 1.0, 2.0, None)
    assert len(timeline._shapes) <= _MAX_INTERNED + 1024
    assert [span[5] for span in timeline.spans][-1] == ((3 * _MAX_INTERNED - 1, 1),)


async def test_a_recorded_error_keeps_nothing_of_the_failed_task_alive(tmp_path: Path) -> None:
    """The span keeps the error as text: its traceback's frames (and their arrays) can be freed."""
    import gc
    import weakref

    class Marker:
        pass

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no message")

    refs: list[weakref.ref[Marker]] = []

    def fails(kind: type[Exception]) -> None:
        marker = Marker()  # a local of the failing frame
        refs.append(weakref.ref(marker))
        raise kind("bad")

    path = tmp_path / "run.json"
    async with ss.Engine(cpu_workers=1) as eng:
        with eng.trace(path):
            for kind in (ValueError, Unprintable):
                fut = eng.submit_nowait(fails, kind)
                await within(fut.wait())
                del fut
            gc.collect()
            assert [ref() for ref in refs] == [None, None]  # while the trace is still being recorded
    errors = sorted(s["args"]["error"] for s in spans(load(path)))
    assert errors == ["Unprintable", "ValueError: bad"]
