"""The Engine's public contract on CPU workers: submission, ordering, futures, failures, lifecycle, stats."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import operator
import subprocess
import sys
import threading
import weakref
from collections import OrderedDict, defaultdict, namedtuple
from typing import Any

import numpy as np
import pytest

import schedsvc as ss

from .helpers import TIMEOUT, Gate, occupied, probe, state, until, wait_thread_event, within


def boom(*_: Any) -> None:
    raise ValueError("boom")


# -- submitting ------------------------------------------------------------------


async def test_submit_returns_a_future_of_the_value(engine: ss.Engine) -> None:
    fut = await engine.submit(operator.add, 2, 3)
    assert isinstance(fut, ss.Future)
    assert await within(fut) == 5
    assert fut.done()


async def test_submit_nowait(engine: ss.Engine) -> None:
    fut = engine.submit_nowait(np.add, np.arange(3), 1)
    np.testing.assert_array_equal(await within(fut), [1, 2, 3])


async def test_run(engine: ss.Engine) -> None:
    assert await within(engine.run(operator.mul, 6, 7, priority=2, name="mul")) == 42


async def test_keyword_arguments_reach_the_function(engine: ss.Engine) -> None:
    def f(a: int, *, b: int, c: int = 0) -> int:
        return a * 100 + b * 10 + c

    assert await within(engine.run(f, 1, b=2, c=3)) == 123


async def test_future_as_argument_is_a_dependency(engine: ss.Engine) -> None:
    f = engine.submit_nowait(np.dot, np.eye(3), np.arange(3.0))
    g = engine.submit_nowait(np.add, f, 1.0)
    np.testing.assert_array_equal(await within(g), [1.0, 2.0, 3.0])


async def test_futures_nested_in_containers_are_replaced_by_values(engine: ss.Engine) -> None:
    one = engine.submit_nowait(operator.add, 0, 1)
    two = engine.submit_nowait(operator.add, 1, 1)
    three = engine.submit_nowait(operator.add, 1, 2)

    def describe(items: list[Any], mapping: dict[str, Any], pair: tuple[Any, ...], *, kw: Any) -> Any:
        return items, mapping, pair, kw

    fut = engine.submit_nowait(
        describe, [one, [two, 5]], {"a": three, "b": {"c": [one]}}, (two, (three,)), kw={"x": (one, two)}
    )
    assert await within(fut) == ([1, [2, 5]], {"a": 3, "b": {"c": [1]}}, (2, (3,)), {"x": (1, 2)})


Pair = namedtuple("Pair", "first second")


async def test_futures_in_tuple_and_dict_subclasses_are_replaced(engine: ss.Engine) -> None:
    """A namedtuple is a tuple and an OrderedDict or defaultdict is a dict: futures inside are dependencies too."""
    one = engine.submit_nowait(operator.add, 0, 1)
    two = engine.submit_nowait(operator.add, 1, 1)
    ordered = OrderedDict(a=one)
    counts: defaultdict[str, Any] = defaultdict(int, b=two)
    fut = engine.submit_nowait(lambda p, o, d: (p, o, d), Pair(one, two), ordered, counts)
    pair, got_ordered, got_counts = await within(fut)
    assert pair == Pair(1, 2)
    assert type(pair) is Pair
    assert got_ordered == {"a": 1}
    assert got_counts == {"b": 2}


async def test_arrays_in_a_namedtuple_are_tracked(engine: ss.Engine) -> None:
    a = np.zeros(10)
    gate = Gate()
    writer = engine.submit_nowait(gate.hold(lambda: a.fill(1)), writes=[a])
    await gate.wait_started(1)
    reader = engine.submit_nowait(lambda p: float(p.first.sum()), Pair(a, None))
    await probe(engine)
    gate.open()
    await within(writer)
    assert await within(reader) == 10.0


async def test_future_as_keyword_argument(engine: ss.Engine) -> None:
    base = engine.submit_nowait(operator.add, 20, 1)
    assert await within(engine.run(lambda *, x: x * 2, x=base)) == 42


async def test_chain_of_dependent_tasks(engine: ss.Engine) -> None:
    fut = engine.submit_nowait(operator.add, 0, 1)
    for _ in range(500):
        fut = engine.submit_nowait(operator.add, fut, 1)
    assert await within(fut) == 501


async def test_long_chain_through_the_engine() -> None:
    async with ss.Engine(cpu_workers=2, max_pending=30_000) as eng:
        first = eng.submit_nowait(boom)
        fut = first
        for _ in range(10_000):
            fut = eng.submit_nowait(operator.neg, fut)
        with pytest.raises(ss.DependencyError) as info:
            await within(fut)
        assert info.value.__cause__ is first.exception()
        good = eng.submit_nowait(operator.add, 0, 0)
        for _ in range(10_000):
            good = eng.submit_nowait(operator.add, good, 1)
        assert await within(good) == 10_000


async def test_waitall_waits_for_everything_submitted(engine: ss.Engine) -> None:
    seen: list[int] = []
    futures = [engine.submit_nowait(seen.append, i) for i in range(200)]
    await within(engine.waitall())
    assert all(f.done() for f in futures)
    assert sorted(seen) == list(range(200))


async def test_waitall_with_nothing_pending_returns(engine: ss.Engine) -> None:
    await within(engine.waitall())


async def test_waitall_counts_failures_as_finished(engine: ss.Engine) -> None:
    bad = engine.submit_nowait(boom)
    child = engine.submit_nowait(operator.neg, bad)
    await within(engine.waitall())
    assert bad.done() and child.done()


async def test_throttle_waits_until_there_is_room() -> None:
    async with ss.Engine(cpu_workers=2, max_pending=2) as eng:
        await within(eng.throttle())  # room: returns at once
        async with occupied(eng, 2) as (gate, held):
            waiter = asyncio.create_task(eng.throttle())
            await state(eng, lambda: eng.stats().waiting_admission == 1)
            assert not waiter.done()
            gate.open()
            await within(waiter)
        await within(asyncio.gather(*held))


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_queued_work_runs_while_the_loop_is_blocked(workers: int, backend: str) -> None:
    """A notebook cell that submits without awaiting, or a long synchronous handler, blocks the loop:
    the tasks submitted before still run, every one, while it is blocked (a worker that finishes
    takes the next itself).  (Regression: the tasks past the first of each worker were staged for the
    loop to hand over, and waited until a later cell awaited.)"""
    import anyio

    n = 5
    ran: list[int] = []
    all_ran = threading.Event()

    def tiny(i: int) -> int:
        ran.append(i)
        if len(ran) == n:
            all_ran.set()
        return i

    async def main() -> None:
        async with ss.Engine(cpu_workers=workers) as eng:
            futures = [eng.submit_nowait(tiny, i) for i in range(n)]
            blocked = all_ran.wait(5.0)  # the loop's thread blocks here: nothing on the loop runs
            assert blocked, f"{len(ran)} of {n} tasks ran while the loop was blocked"
            assert [await within(f) for f in futures] == list(range(n))

    anyio.run(main, backend=backend)


async def test_submit_from_another_thread(engine: ss.Engine) -> None:
    fut = await within(asyncio.to_thread(engine.submit_nowait, operator.mul, 6, 7))
    assert await within(fut) == 42


async def test_many_threads_submit_chains_at_once(engine: ss.Engine) -> None:
    def producer(start: int) -> ss.Future[int]:
        fut = engine.submit_nowait(operator.add, start, 0)
        for _ in range(100):
            fut = engine.submit_nowait(operator.add, fut, 1)
        return fut

    lasts = await within(asyncio.gather(*(asyncio.to_thread(producer, 1000 * i) for i in range(4))))
    assert await within(asyncio.gather(*lasts)) == [1000 * i + 100 for i in range(4)]


async def test_priority_orders_tasks_queued_from_another_thread() -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        order: list[str] = []

        def submit_all() -> list[ss.Future[Any]]:
            return [
                eng.submit_nowait(order.append, label, priority=p)
                for label, p in [("low", 0), ("high", 10), ("mid", 5), ("high2", 10), ("low2", 0)]
            ]

        async with occupied(eng, 1):
            futures = await within(asyncio.to_thread(submit_all))
        await within(asyncio.gather(*futures))
        assert order == ["high", "high2", "mid", "low", "low2"]


async def test_priority_orders_tasks_queued_from_the_loop_while_the_worker_is_busy() -> None:
    """All three tasks are submitted while the only worker is busy; when it frees up it must pick the
    highest priority, whether or not the event loop has run in between."""
    async with ss.Engine(cpu_workers=1) as eng:
        order: list[str] = []
        first = threading.Event()

        def record(label: str) -> None:
            order.append(label)
            first.set()

        async with occupied(eng, 1) as (gate, _):
            futures = [
                eng.submit_nowait(record, label, priority=p)
                for label, p in [("low", 0), ("high", 10), ("mid", 5)]
            ]
            gate.open()
            # Deliberately without yielding to the loop: the worker needs nothing from it to pick its next task.
            assert first.wait(TIMEOUT), "the free worker started none of the queued tasks"
        await within(asyncio.gather(*futures))
        assert order == ["high", "mid", "low"]


# -- buffers and ordering -----------------------------------------------------------


async def test_in_place_writes_through_out_are_sequential() -> None:
    async with ss.Engine(cpu_workers=4) as eng:
        a = np.zeros(100_000)
        for _ in range(60):
            eng.submit_nowait(np.add, a, 1, out=a)
        total = await within(eng.run(np.sum, a))
        assert total == 60 * 100_000


async def test_reads_see_the_writes_before_them_and_not_after() -> None:
    async with ss.Engine(cpu_workers=4) as eng:
        a = np.zeros(50_000)
        snapshots = []
        for _ in range(40):
            eng.submit_nowait(np.add, a, 1, out=a)
            snapshots.append(eng.submit_nowait(np.copy, a))
        values = await within(asyncio.gather(*snapshots))
        for i, snap in enumerate(values):
            assert np.all(snap == i + 1), i


async def test_declared_writes_and_reads_order_closures() -> None:
    async with ss.Engine(cpu_workers=4) as eng:
        a = np.zeros(50_000)

        def increment() -> None:
            np.add(a, 1, out=a)

        def snapshot() -> float:
            return float(a.sum())

        snaps = []
        for _ in range(40):
            eng.submit_nowait(increment, writes=[a])
            snaps.append(eng.submit_nowait(snapshot, reads=[a]))
        assert await within(asyncio.gather(*snaps)) == [50_000.0 * (i + 1) for i in range(40)]


async def test_single_arrays_as_reads_and_writes() -> None:
    async with ss.Engine(cpu_workers=4) as eng:
        a = np.zeros(1000)

        def increment() -> None:
            np.add(a, 1, out=a)

        snaps = []
        for _ in range(20):
            eng.submit_nowait(increment, writes=a)
            snaps.append(eng.submit_nowait(lambda: float(a.sum()), reads=a))
        assert await within(asyncio.gather(*snaps)) == [1000.0 * (i + 1) for i in range(20)]


async def test_write_then_read_waits_for_the_writer(engine: ss.Engine) -> None:
    a = np.zeros(10)
    gate = Gate()
    writer = engine.submit_nowait(gate.hold(lambda: a.fill(7)), writes=[a])
    await gate.wait_started(1)
    reader = engine.submit_nowait(np.sum, a)
    await probe(engine)  # the other worker is free: a wrongly ready reader would have run
    gate.open()
    await within(writer)
    assert await within(reader) == 70


async def test_write_after_read_waits_for_the_reader(engine: ss.Engine) -> None:
    a = np.ones(10)
    gate = Gate()
    reader = engine.submit_nowait(gate.hold(lambda: float(a.sum())), reads=[a])
    await gate.wait_started(1)
    writer = engine.submit_nowait(np.multiply, a, 0, out=a)
    await probe(engine)
    gate.open()
    assert await within(reader) == 10.0
    await within(writer)
    assert a.sum() == 0


async def test_write_after_write_keeps_submission_order(engine: ss.Engine) -> None:
    a = np.zeros(10)
    gate = Gate()
    first = engine.submit_nowait(gate.hold(lambda: a.fill(1)), writes=[a])
    await gate.wait_started(1)
    second = engine.submit_nowait(lambda: float(np.multiply(a, 2, out=a).sum()), writes=[a])
    third = engine.submit_nowait(lambda: a.fill(3), writes=[a])
    await probe(engine)
    gate.open()
    await within(asyncio.gather(first, third))
    assert await within(second) == 20.0
    assert np.all(a == 3)


async def test_out_as_a_tuple_is_a_write(engine: ss.Engine) -> None:
    a = np.zeros(10)
    for _ in range(20):
        engine.submit_nowait(np.add, a, 1, out=(a,))
    assert await within(engine.run(np.sum, a)) == 200


async def test_a_finished_task_lets_go_of_its_arguments(engine: ss.Engine) -> None:
    a = np.ones(1000)
    ref = weakref.ref(a)
    fut = engine.submit_nowait(np.sum, a)
    assert await within(fut) == 1000
    await within(engine.waitall())
    del a
    assert ref() is None, "the engine still holds the array of a finished task"


async def test_a_view_counts_as_its_base(engine: ss.Engine) -> None:
    a = np.zeros(100)
    view = a[10:20]
    grid_row = a.reshape(10, 10)[5]  # a view of a view
    gate = Gate()
    writer = engine.submit_nowait(gate.hold(lambda: view.fill(1)), writes=[view])
    await gate.wait_started(1)
    whole = engine.submit_nowait(np.sum, a)
    engine.submit_nowait(np.add, grid_row, 2, out=grid_row)
    row = engine.submit_nowait(np.sum, grid_row)
    await probe(engine)
    gate.open()
    await within(writer)
    assert await within(whole) == 10
    assert await within(row) == 20
    assert a.sum() == 30


async def test_writes_through_a_view_order_reads_through_another_view(engine: ss.Engine) -> None:
    a = np.zeros(100)
    left, right = a[:50], a[50:]
    results = []
    for _ in range(30):
        engine.submit_nowait(np.add, left, 1, out=left)
        results.append(engine.submit_nowait(lambda x: float(x.base.sum()), right))  # reads all of a
    values = await within(asyncio.gather(*results))
    assert values == [50.0 * (i + 1) for i in range(30)]


async def test_reads_of_one_buffer_run_concurrently(engine: ss.Engine) -> None:
    a = np.ones(1000)
    meet = threading.Barrier(2, timeout=5)

    def reader(x: np.ndarray) -> float:
        meet.wait()  # both readers must be inside at once, or this breaks
        return float(x.sum())

    first = engine.submit_nowait(reader, a)
    second = engine.submit_nowait(reader, a[::2])
    assert await within(asyncio.gather(first, second)) == [1000.0, 500.0]


async def test_declared_reads_run_concurrently(engine: ss.Engine) -> None:
    a = np.ones(1000)
    meet = threading.Barrier(2, timeout=5)

    def reader() -> float:
        meet.wait()
        return float(a.sum())

    fut = [engine.submit_nowait(reader, reads=[a]) for _ in range(2)]
    assert await within(asyncio.gather(*fut)) == [1000.0, 1000.0]


async def test_writer_does_not_overlap_earlier_readers() -> None:
    async with ss.Engine(cpu_workers=3) as eng:
        a = np.ones(10)
        meet = threading.Barrier(2, timeout=5)
        release = threading.Event()

        def reader() -> float:
            meet.wait()
            assert release.wait(TIMEOUT)
            return float(a.sum())

        readers = [eng.submit_nowait(reader, reads=[a]) for _ in range(2)]
        writer = eng.submit_nowait(np.multiply, a, 3, out=a)
        await probe(eng)  # the third worker is free: a wrongly ready writer would run now
        release.set()
        assert await within(asyncio.gather(*readers)) == [10.0, 10.0]
        await within(writer)
        assert a.sum() == 30


async def test_unrelated_buffers_run_concurrently(engine: ss.Engine) -> None:
    a, b = np.zeros(10), np.zeros(10)
    meet = threading.Barrier(2, timeout=5)

    def write(x: np.ndarray) -> None:
        meet.wait()
        x.fill(1)

    fut = [engine.submit_nowait(write, a, writes=[a]), engine.submit_nowait(write, b, writes=[b])]
    await within(asyncio.gather(*fut))
    assert a.sum() == b.sum() == 10


# -- failures -------------------------------------------------------------------------


async def test_failure_is_stored_and_dependents_fail_without_running(engine: ss.Engine) -> None:
    ran: list[Any] = []
    bad = engine.submit_nowait(boom, name="loader")
    child = engine.submit_nowait(ran.append, bad)
    grandchild = engine.submit_nowait(ran.append, [child])
    with pytest.raises(ValueError, match="boom"):
        await within(bad)
    original = bad.exception()
    assert isinstance(original, ValueError)
    for dependent in (child, grandchild):
        with pytest.raises(ss.DependencyError) as info:
            await within(dependent)
        assert info.value.__cause__ is original
    assert "loader" in str(child.exception())
    assert ran == []


async def test_dependency_error_messages_stay_short_down_a_chain(engine: ss.Engine) -> None:
    first = engine.submit_nowait(boom, name="source")
    fut = first
    for _ in range(100):
        fut = engine.submit_nowait(operator.neg, fut)
    await within(fut.wait())
    error = fut.exception()
    assert isinstance(error, ss.DependencyError)
    assert error.__cause__ is first.exception()
    assert len(str(error)) < 500, f"{len(str(error))} characters"


async def test_engine_keeps_serving_after_failures(engine: ss.Engine) -> None:
    for _ in range(5):
        with pytest.raises(ValueError):
            await within(engine.run(boom))
    assert await within(engine.run(operator.add, 1, 2)) == 3


async def test_depending_on_an_already_failed_future(engine: ss.Engine) -> None:
    bad = engine.submit_nowait(boom)
    await within(bad.wait())
    child = engine.submit_nowait(operator.neg, bad)
    with pytest.raises(ss.DependencyError) as info:
        await within(child)
    assert info.value.__cause__ is bad.exception()


async def test_failed_writer_still_orders_later_readers(engine: ss.Engine) -> None:
    a = np.zeros(4)

    def half_write() -> None:
        a[:2] = 5
        raise RuntimeError("after writing half")

    bad = engine.submit_nowait(half_write, writes=[a])
    reader = engine.submit_nowait(np.sum, a)  # a hazard dependent: runs, sees the partial write
    with pytest.raises(RuntimeError):
        await within(bad)
    assert await within(reader) == 10


async def test_base_exceptions_in_tasks_are_stored(engine: ss.Engine) -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt

    fut = engine.submit_nowait(interrupt)
    await within(fut.wait())
    assert isinstance(fut.exception(), KeyboardInterrupt)
    assert await within(engine.run(operator.add, 2, 2)) == 4


# -- futures ------------------------------------------------------------------------------


async def test_exception_and_wait(engine: ss.Engine) -> None:
    ok = engine.submit_nowait(operator.add, 1, 1)
    bad = engine.submit_nowait(boom)
    assert await within(ok.wait()) is ok
    assert await within(bad.wait()) is bad  # wait() does not raise
    assert ok.exception() is None
    assert isinstance(bad.exception(), ValueError)


async def test_exception_of_an_unfinished_future_raises(engine: ss.Engine) -> None:
    async with occupied(engine, 1) as (_, held):
        with pytest.raises(asyncio.InvalidStateError):
            held[0].exception()
        assert not held[0].done()


async def test_result_from_a_plain_thread(engine: ss.Engine) -> None:
    async with occupied(engine, 1) as (gate, _):
        fut = engine.submit_nowait(operator.add, 40, 2)
        out: list[Any] = []
        thread = threading.Thread(target=lambda: out.append(fut.result(TIMEOUT)))
        thread.start()
        gate.open()
        await within(asyncio.to_thread(thread.join, TIMEOUT))
        assert not thread.is_alive()
    assert out == [42]


async def test_result_timeout(engine: ss.Engine) -> None:
    async with occupied(engine, 2) as (_, held):
        with pytest.raises(TimeoutError):
            await within(asyncio.to_thread(held[0].result, 0.01))


async def test_result_raises_the_task_error(engine: ss.Engine) -> None:
    bad = engine.submit_nowait(boom)
    child = engine.submit_nowait(operator.neg, bad)
    with pytest.raises(ValueError):
        await within(asyncio.to_thread(bad.result, TIMEOUT))
    with pytest.raises(ss.DependencyError):
        await within(asyncio.to_thread(child.result, TIMEOUT))


@pytest.mark.parametrize("workers", [1, 2])
async def test_result_inside_a_task_does_not_deadlock(workers: int) -> None:
    async with ss.Engine(cpu_workers=workers) as eng:

        def outer() -> int:
            inner = eng.submit_nowait(operator.add, 1, 2)
            return inner.result(TIMEOUT) * 10

        assert await within(eng.run(outer)) == 30
        futs = [eng.submit_nowait(outer) for _ in range(8)]  # more blocked tasks than workers
        assert await within(asyncio.gather(*futs)) == [30] * 8


async def test_result_inside_a_task_on_a_task_queued_behind_it() -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        later: list[ss.Future[int]] = []
        submitted = threading.Event()

        def outer() -> int:
            assert submitted.wait(TIMEOUT)
            return later[0].result(TIMEOUT) + 1

        first = eng.submit_nowait(outer)
        later.append(eng.submit_nowait(operator.add, 1, 1))  # queued: the only worker runs outer
        submitted.set()
        assert await within(first) == 3


async def test_result_inside_a_task_on_a_task_that_is_not_ready_yet() -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        later: list[ss.Future[int]] = []
        submitted = threading.Event()

        def outer() -> int:
            assert submitted.wait(TIMEOUT)
            return later[0].result(TIMEOUT) + 1

        first = eng.submit_nowait(outer)
        parent = eng.submit_nowait(operator.add, 1, 1)
        later.append(eng.submit_nowait(operator.mul, parent, 10))  # waits on parent, itself queued
        submitted.set()
        assert await within(first) == 21


async def test_add_done_callback_runs_on_the_loop(engine: ss.Engine) -> None:
    loop_thread = threading.get_ident()
    calls: list[tuple[ss.Future[Any], int]] = []
    called = asyncio.Event()

    def callback(fut: ss.Future[Any]) -> None:
        calls.append((fut, threading.get_ident()))
        called.set()

    async with occupied(engine, 1) as (gate, _):
        fut = engine.submit_nowait(operator.add, 1, 1)
        fut.add_done_callback(callback)
        gate.open()
        await within(called.wait())
    assert calls == [(fut, loop_thread)]
    assert fut.result() == 2


async def test_add_done_callback_on_a_finished_future(engine: ss.Engine) -> None:
    fut = engine.submit_nowait(boom)
    await within(fut.wait())
    called = asyncio.Event()
    seen: list[Any] = []

    def callback(f: ss.Future[Any]) -> None:
        seen.append((f, threading.get_ident()))
        called.set()

    fut.add_done_callback(callback)
    await within(called.wait())
    assert seen == [(fut, threading.get_ident())]


async def test_a_raising_done_callback_does_not_stop_the_others(engine: ss.Engine) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        called = asyncio.Event()

        def bad(_: ss.Future[Any]) -> None:
            raise RuntimeError("callback failed")

        async with occupied(engine, 1) as (gate, _):
            fut = engine.submit_nowait(operator.add, 1, 1)
            fut.add_done_callback(bad)
            fut.add_done_callback(lambda _: called.set())
            gate.open()
            await within(called.wait())
    finally:
        loop.set_exception_handler(None)
    assert len(reported) == 1
    assert isinstance(reported[0].get("exception"), RuntimeError)


async def test_future_repr_names_the_task(engine: ss.Engine) -> None:
    fut = engine.submit_nowait(operator.add, 1, 1, name="adder")
    await within(fut)
    assert "adder" in repr(fut)
    assert "done" in repr(fut)


# -- cancellation -----------------------------------------------------------------------


async def test_cancel_an_unstarted_task_cancels_its_dependents(engine: ss.Engine) -> None:
    ran: list[str] = []
    async with occupied(engine, 2):
        queued = engine.submit_nowait(ran.append, "queued")
        child = engine.submit_nowait(ran.append, queued)
        grandchild = engine.submit_nowait(ran.append, {"x": child})
        assert queued.cancel() is True
        assert queued.cancelled() and child.cancelled() and grandchild.cancelled()
        assert queued.done()
    for fut in (queued, child, grandchild):
        with pytest.raises(asyncio.CancelledError):
            await within(fut)
        with pytest.raises(concurrent.futures.CancelledError):
            fut.result()
    await within(engine.waitall())
    assert ran == []


async def test_cancel_a_running_or_finished_task_returns_false(engine: ss.Engine) -> None:
    async with occupied(engine, 1) as (_, held):
        assert held[0].cancel() is False
        assert held[0].running()
    await within(held[0])
    assert held[0].cancel() is False
    assert not held[0].cancelled()


async def test_cancel_keeps_hazard_order_of_the_tasks_after_it(engine: ss.Engine) -> None:
    """w1 writes a (held), w2 writes a, r reads a; cancelling w2 must not let r read before w1 wrote."""
    a = np.zeros(4)
    gate = Gate()
    w1 = engine.submit_nowait(gate.hold(lambda: a.fill(1)), writes=[a])
    await gate.wait_started(1)
    w2 = engine.submit_nowait(lambda: a.fill(2), writes=[a])
    r = engine.submit_nowait(np.sum, a)
    assert w2.cancel()
    await probe(engine)  # one worker is free: a wrongly ready r runs before the probe
    gate.open()
    await within(w1)
    assert await within(r) == 4  # sequentially: w1 wrote 1s, w2 never ran


async def test_cancel_races_with_the_workers_but_stays_consistent(engine: ss.Engine) -> None:
    """Cancelling while workers run: a task is cancelled exactly when it did not run, and so are its dependents."""
    ran: set[int] = set()

    def work(i: int, *_: Any) -> int:
        ran.add(i)
        return i

    roots = [engine.submit_nowait(work, i) for i in range(200)]
    children = [engine.submit_nowait(work, 1000 + i, root) for i, root in enumerate(roots)]

    def cancel_all() -> list[bool]:
        return [fut.cancel() for fut in reversed(roots)][::-1]

    answers = await within(asyncio.to_thread(cancel_all))
    await within(engine.waitall())
    for i, (root, child, answer) in enumerate(zip(roots, children, answers, strict=True)):
        assert root.done() and child.done()
        assert root.cancelled() == answer == (i not in ran)
        if answer:
            assert child.cancelled() and 1000 + i not in ran
        else:
            assert root.result() == i
            assert child.result() == 1000 + i
    stats = engine.stats()
    assert stats.completed + stats.cancelled + stats.failed == stats.submitted == 400
    assert stats.pending == 0


async def test_cancelling_the_awaiting_coroutine_cancels_an_unstarted_task(engine: ss.Engine) -> None:
    ran: list[int] = []
    async with occupied(engine, 2):
        fut = engine.submit_nowait(ran.append, 1)
        awaiting = asyncio.Event()

        async def consumer() -> None:
            awaiting.set()
            await fut

        task = asyncio.create_task(consumer())
        await within(awaiting.wait())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(task)
        assert fut.cancelled()
    await within(engine.waitall())
    assert ran == []


async def test_awaiting_with_shield_keeps_the_task(engine: ss.Engine) -> None:
    async with occupied(engine, 2) as (gate, _):
        fut = engine.submit_nowait(operator.add, 1, 1)
        awaiting = asyncio.Event()

        async def consumer() -> int:
            awaiting.set()
            return await asyncio.shield(fut)

        waiter = asyncio.create_task(consumer())
        await within(awaiting.wait())
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not fut.cancelled()
        gate.open()
        assert await within(fut) == 2


# -- lifecycle ------------------------------------------------------------------------------


async def test_submit_before_start_raises_engine_closed() -> None:
    eng = ss.Engine(cpu_workers=1)
    with pytest.raises(ss.EngineClosed):
        await eng.submit(operator.add, 1, 1)
    with pytest.raises(ss.EngineClosed):
        eng.submit_nowait(operator.add, 1, 1)
    with pytest.raises(ss.EngineClosed):
        eng.stats()


async def test_submit_after_close_raises_engine_closed() -> None:
    async with ss.Engine(cpu_workers=1) as eng:
        assert await within(eng.run(operator.add, 1, 1)) == 2
    assert eng.closed
    with pytest.raises(ss.EngineClosed):
        await eng.submit(operator.add, 1, 1)
    with pytest.raises(ss.EngineClosed):
        eng.submit_nowait(operator.add, 1, 1)
    with pytest.raises(ss.SchedsvcError):
        await eng.run(operator.add, 1, 1)


async def test_start_aclose_and_restart() -> None:
    eng = ss.Engine(cpu_workers=2)
    assert await eng.start() is eng
    assert not eng.closed
    assert await within(eng.run(operator.add, 2, 2)) == 4
    await within(eng.aclose())
    await within(eng.aclose())  # closing twice is harmless
    with pytest.raises(ss.EngineClosed, match="started and closed; an engine starts once"):
        await eng.start()


async def test_a_second_start_of_a_running_engine_says_it_runs() -> None:
    """It used to raise EngineClosed, though the engine was running and took work."""
    async with ss.Engine(cpu_workers=1) as eng:
        with pytest.raises(RuntimeError, match="is running already: start\\(\\) it once") as raised:
            await eng.start()
        assert not isinstance(raised.value, ss.EngineClosed)
        assert await within(eng.run(operator.add, 2, 2)) == 4


async def test_aclose_waits_for_pending_work() -> None:
    eng = await ss.Engine(cpu_workers=2).start()
    gate = Gate()
    held = [eng.submit_nowait(gate.hold(lambda: "held")) for _ in range(2)]
    queued = [eng.submit_nowait(operator.add, i, 1) for i in range(20)]
    await gate.wait_started(2)
    closing = asyncio.create_task(eng.aclose())
    await state(eng, lambda: eng.closed)
    with pytest.raises(ss.EngineClosed):
        eng.submit_nowait(operator.add, 1, 1)
    assert not closing.done()
    gate.open()
    await within(closing)
    assert [f.result() for f in held] == ["held", "held"]
    assert [f.result() for f in queued] == [i + 1 for i in range(20)]
    assert not [t for t in threading.enumerate() if t.name.startswith("schedsvc-")]


async def test_aclose_cancel_pending_cancels_unstarted_tasks() -> None:
    eng = await ss.Engine(cpu_workers=2).start()
    gate = Gate()
    held = [eng.submit_nowait(gate.hold(lambda: "held")) for _ in range(2)]
    await gate.wait_started(2)
    ran: list[int] = []
    queued = [eng.submit_nowait(ran.append, i) for i in range(20)]
    dependent = eng.submit_nowait(ran.append, held[0])  # not started: cancelled as well
    closing = asyncio.create_task(eng.aclose(cancel_pending=True))
    await state(eng, lambda: all(f.cancelled() for f in queued))
    gate.open()
    await within(closing)
    assert [f.result() for f in held] == ["held", "held"]
    assert dependent.cancelled()
    assert ran == []


async def test_aclose_cancel_pending_refuses_waiting_submitters() -> None:
    eng = await ss.Engine(cpu_workers=2, max_pending=2).start()
    gate = Gate()
    held = [eng.submit_nowait(gate.hold()) for _ in range(2)]
    await gate.wait_started(2)
    ran: list[int] = []
    waiting = asyncio.create_task(eng.submit(ran.append, 1))
    await state(eng, lambda: eng.stats().waiting_admission == 1)
    closing = asyncio.create_task(eng.aclose(cancel_pending=True))
    with pytest.raises(ss.EngineClosed):
        await within(waiting)
    gate.open()
    await within(closing)
    await within(asyncio.gather(*held))
    assert ran == []


async def test_leaving_the_block_with_an_error_cancels_unstarted_tasks() -> None:
    ran: list[int] = []
    queued: list[ss.Future[Any]] = []
    with pytest.raises(RuntimeError, match="leave"):
        async with ss.Engine(cpu_workers=1) as eng:
            gate = Gate()
            eng.submit_nowait(gate.hold())
            await gate.wait_started(1)
            queued.extend(eng.submit_nowait(ran.append, i) for i in range(5))
            asyncio.get_running_loop().call_soon(gate.open)  # runs once __aexit__ has cancelled the queue
            raise RuntimeError("leave")
    assert all(f.cancelled() for f in queued)
    assert ran == []


async def test_no_thread_is_left_after_close() -> None:
    async with ss.Engine(cpu_workers=4) as eng:

        def outer() -> int:  # blocks a worker in result(): the pool may start a stand-in thread
            return eng.submit_nowait(operator.add, 1, 1).result(TIMEOUT)

        assert await within(asyncio.gather(*(eng.submit_nowait(outer) for _ in range(8)))) == [2] * 8
    assert not [t for t in threading.enumerate() if t.name.startswith("schedsvc-")]


async def test_repr_shows_the_state() -> None:
    eng = ss.Engine(cpu_workers=1)
    assert "new" in repr(eng)
    async with eng:
        assert "running" in repr(eng)
    assert "closed" in repr(eng)


# -- sync mode -------------------------------------------------------------------------------


async def test_sync_mode_runs_in_the_caller() -> None:
    async with ss.Engine(cpu_workers=1, sync_mode=True) as eng:
        caller = threading.get_ident()
        fut = await eng.submit(threading.get_ident)
        assert fut.done()
        assert fut.result() == caller
        nowait = eng.submit_nowait(threading.get_ident)
        assert nowait.done() and nowait.result() == caller
        dependent = eng.submit_nowait(operator.add, fut, 0)
        assert dependent.result() == caller
        assert await within(eng.run(operator.add, 1, 2)) == 3


async def test_sync_mode_raises_at_the_call_site() -> None:
    async with ss.Engine(cpu_workers=1, sync_mode=True) as eng:
        with pytest.raises(ValueError, match="boom"):
            await eng.submit(boom)
        with pytest.raises(ValueError, match="boom"):
            eng.submit_nowait(boom)
        assert await within(eng.run(operator.add, 1, 2)) == 3


async def test_sync_mode_keeps_buffer_semantics() -> None:
    async with ss.Engine(cpu_workers=1, sync_mode=True) as eng:
        a = np.zeros(3)
        eng.submit_nowait(np.add, a, 1, out=a)
        assert a.sum() == 3  # already ran
        assert await within(eng.run(np.sum, a)) == 3


# -- bad input ----------------------------------------------------------------------------------


async def test_non_callable_is_invalid(engine: ss.Engine) -> None:
    with pytest.raises(ss.InvalidTask) as info:
        engine.submit_nowait(42)  # type: ignore[arg-type]
    assert isinstance(info.value, ss.SchedsvcError)
    assert isinstance(info.value, TypeError)
    with pytest.raises(ss.InvalidTask):
        await engine.submit("np.add", 1, 2)  # type: ignore[arg-type]
    assert engine.stats().submitted == 0


@pytest.mark.parametrize("nbytes", [-1, "big", 1.5])
async def test_bad_nbytes_is_invalid(engine: ss.Engine, nbytes: Any) -> None:
    with pytest.raises(ss.InvalidTask, match="nbytes"):
        engine.submit_nowait(operator.add, 1, 1, nbytes=nbytes)


async def test_bad_priority_is_invalid(engine: ss.Engine) -> None:
    with pytest.raises(ss.InvalidTask, match="priority"):
        engine.submit_nowait(operator.add, 1, 1, priority="high")


async def test_unknown_device(engine: ss.Engine) -> None:
    with pytest.raises(ss.DeviceError, match="tpu"):
        engine.submit_nowait(operator.add, 1, 1, device="tpu")
    with pytest.raises(ss.DeviceError, match="tpu"):
        await engine.submit(operator.add, 1, 1, device="tpu")


async def test_device_not_in_the_engine(engine: ss.Engine) -> None:
    with pytest.raises(ss.DeviceError, match="cuda:0"):
        engine.submit_nowait(operator.add, 1, 1, device="cuda:0")


@pytest.mark.parametrize("device", ["cuda:0", "cuda:7"])
async def test_engine_on_an_unavailable_cuda_device(device: str) -> None:
    """Without CuPy (or without CUDA stream workers, or that many GPUs) a cuda device is a DeviceError."""
    eng = ss.Engine(cpu_workers=1, devices=("cpu", device))
    with pytest.raises(ss.DeviceError, match=device):
        await eng.start()
    await eng.aclose()


async def test_future_of_another_engine_is_invalid(engine: ss.Engine) -> None:
    async with ss.Engine(cpu_workers=1) as other:
        foreign = other.submit_nowait(operator.add, 1, 1)
        await within(foreign)
        with pytest.raises(ss.InvalidTask):
            engine.submit_nowait(operator.neg, foreign)


def test_importing_schedsvc_does_not_import_dask() -> None:
    code = "import sys, schedsvc; print(sorted(m for m in ('dask', 'distributed') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


async def test_dask_backend_without_dask_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if it were not installed
    eng = ss.Engine(cpu_workers=1, backend="dask")
    try:
        with pytest.raises(ss.SchedsvcError, match=r"pip install 'schedsvc\[dask\]'"):
            await eng.start()
    finally:
        await eng.aclose()


# -- stats ---------------------------------------------------------------------------------------


async def test_stats(engine: ss.Engine) -> None:
    a = np.ones(1000)  # 8000 bytes
    async with occupied(engine, 2):
        cancelled = engine.submit_nowait(operator.add, 1, 1)
        assert cancelled.cancel()
        running = engine.stats()
        assert running.running == 2
        assert running.pending == 2
    ok = [engine.submit_nowait(np.sum, a) for _ in range(10)]
    bad = engine.submit_nowait(boom)
    child = engine.submit_nowait(operator.neg, bad)
    await within(engine.waitall())
    await until(lambda: sum(engine.stats().worker_busy_s.values()) > 0)  # added as a run of tasks ends
    stats = engine.stats()
    assert isinstance(stats, ss.Stats)
    assert stats.submitted == 2 + 1 + 10 + 2
    assert stats.completed == 2 + 10
    assert stats.failed == 2
    assert stats.cancelled == 1
    assert stats.pending == 0
    assert stats.running == 0
    assert stats.waiting_admission == 0
    assert stats.pending_bytes == 0
    assert stats.peak_pending_bytes >= a.nbytes
    assert stats.max_pending == engine.config.max_pending
    assert stats.max_pending_bytes == engine.config.max_pending_bytes
    assert len(stats.worker_busy_s) == 2
    assert all(v >= 0 for v in stats.worker_busy_s.values())
    assert sum(stats.worker_busy_s.values()) > 0
    assert 0 <= stats.queue_wait_p50_s <= stats.queue_wait_p99_s
    assert all(f.done() for f in [*ok, bad, child])


async def test_stats_is_an_immutable_snapshot(engine: ss.Engine) -> None:
    before = engine.stats()
    await within(engine.run(operator.add, 1, 1))
    after = engine.stats()
    assert before.submitted == 0 and after.submitted == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.submitted = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        after.worker_busy_s["cpu-0"] = 1.0  # type: ignore[index]


async def test_stats_from_a_worker_thread(engine: ss.Engine) -> None:
    seen = await within(engine.run(lambda: engine.stats().running))
    assert seen >= 1


async def test_awaiting_from_another_loop_thread_via_result(engine: ss.Engine) -> None:
    """A thread with its own event loop can still block on result()."""
    fut = engine.submit_nowait(operator.add, 2, 2)
    done = threading.Event()
    out: list[int] = []

    def other() -> None:
        out.append(asyncio.run(_blocking_result(fut)))
        done.set()

    threading.Thread(target=other).start()
    await wait_thread_event(done)
    assert out == [4]


async def test_awaiting_from_another_event_loop(engine: ss.Engine) -> None:
    async with occupied(engine, 1) as (gate, _):
        fut = engine.submit_nowait(operator.add, 3, 4)
        out: list[int] = []
        awaiting = threading.Event()

        async def other_loop() -> int:
            awaiting.set()
            return await asyncio.wait_for(fut, TIMEOUT)

        thread = threading.Thread(target=lambda: out.append(asyncio.run(other_loop())))
        thread.start()
        await wait_thread_event(awaiting)
        gate.open()
        await within(asyncio.to_thread(thread.join, TIMEOUT))
    assert out == [7]


async def _blocking_result(fut: ss.Future[int]) -> int:
    return fut.result(TIMEOUT)
